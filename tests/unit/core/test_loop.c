/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"

static void stop_cb(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

static int make_pipe(int p[2])
{
	return pipe2(p, O_NONBLOCK | O_CLOEXEC);
}

/* ---- fd callbacks ---- */

struct fdlog {
	int calls;
	int fd;
	uint32_t events;
	char got[16];
};

static void read_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct fdlog *f = ud;
	ssize_t n = read(fd, f->got, sizeof(f->got) - 1);

	f->calls++;
	f->fd = fd;
	f->events = events;
	if (n > 0)
		f->got[n] = '\0';
	loop_stop(l);
}

static void test_fd_callback(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct fdlog f = {0};
	int p[2];

	assert_non_null(l);
	assert_int_equal(make_pipe(p), 0);
	assert_int_equal(loop_add_fd(l, p[0], EPOLLIN, read_cb, &f), 0);
	assert_int_equal(loop_add_fd(l, p[0], EPOLLIN, read_cb, &f), -EEXIST);
	assert_int_equal(loop_mod_fd(l, p[1], EPOLLOUT), -ENOENT);
	assert_int_equal(loop_del_fd(l, p[1]), -ENOENT);
	assert_int_equal(write(p[1], "hi", 2), 2);
	assert_int_equal(loop_run(l), 0);
	assert_int_equal(f.calls, 1);
	assert_int_equal(f.fd, p[0]);
	assert_true(f.events & EPOLLIN);
	assert_string_equal(f.got, "hi");

	/* EPOLLOUT through loop_mod_fd on the write end. */
	struct fdlog w = {0};
	assert_int_equal(loop_add_fd(l, p[1], 0, read_cb, &w), 0);
	assert_int_equal(loop_mod_fd(l, p[1], EPOLLOUT), 0);
	assert_int_equal(loop_run(l), 0);
	assert_int_equal(w.calls, 1);
	assert_true(w.events & EPOLLOUT);

	assert_int_equal(loop_del_fd(l, p[0]), 0);
	assert_int_equal(loop_del_fd(l, p[1]), 0);
	close(p[0]);
	close(p[1]);
	loop_free(l);
	loop_free(NULL);
}

/* ---- timers ---- */

struct tlog {
	int order[16];
	int n;
	struct loop *l;
	uint64_t cancel_id;
};

struct tev {
	struct tlog *log;
	int tag;
};

static void timer_cb(struct loop *l, void *ud)
{
	struct tev *e = ud;
	(void)l;
	e->log->order[e->log->n++] = e->tag;
}

static void test_timer_order_cancel(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct tlog log = {.l = l};
	struct tev ev[6];

	for (int i = 0; i < 6; i++)
		ev[i] = (struct tev){&log, i};
	uint64_t t0 = loop_now_ms();
	uint64_t id30 = loop_add_timer(l, 30, timer_cb, &ev[0]);
	uint64_t id10a = loop_add_timer(l, 10, timer_cb, &ev[1]);
	uint64_t id20 = loop_add_timer(l, 20, timer_cb, &ev[2]);
	uint64_t id10b = loop_add_timer(l, 10, timer_cb, &ev[3]);
	uint64_t idx = loop_add_timer(l, 15, timer_cb, &ev[4]);
	assert_true(id30 > 0 && id10a > id30 && id20 > id10a && id10b > id20 && idx > id10b);
	loop_del_timer(l, idx);
	loop_del_timer(l, idx);	   /* twice: no-op */
	loop_del_timer(l, 999999); /* unknown: no-op */
	loop_add_timer(l, 40, stop_cb, NULL);
	assert_int_equal(loop_run(l), 0);
	assert_true(loop_now_ms() - t0 >= 40);
	/* deadline order; equal deadlines in the order they were added */
	assert_int_equal(log.n, 4);
	assert_int_equal(log.order[0], 1);
	assert_int_equal(log.order[1], 3);
	assert_int_equal(log.order[2], 2);
	assert_int_equal(log.order[3], 0);
	loop_del_timer(l, id30); /* fired: no-op */
	loop_free(l);
}

/* A timer that re-arms itself with 0 ms must not starve fds. */
struct starve {
	int ticks;
	int fd_calls;
	struct loop *l;
};

static void rearm_cb(struct loop *l, void *ud)
{
	struct starve *s = ud;
	s->ticks++;
	if (s->ticks < 1000)
		loop_add_timer(l, 0, rearm_cb, s);
}

static void starve_fd_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct starve *s = ud;
	char c;
	(void)events;
	if (read(fd, &c, 1) == 1)
		s->fd_calls++;
	loop_stop(l);
}

static void test_timer_no_starve(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct starve s = {.l = l};
	int p[2];

	assert_int_equal(make_pipe(p), 0);
	assert_int_equal(loop_add_fd(l, p[0], EPOLLIN, starve_fd_cb, &s), 0);
	loop_add_timer(l, 0, rearm_cb, &s);
	assert_int_equal(write(p[1], "x", 1), 1);
	assert_int_equal(loop_run(l), 0);
	assert_int_equal(s.fd_calls, 1);
	assert_true(s.ticks < 10);
	loop_del_fd(l, p[0]);
	close(p[0]);
	close(p[1]);
	loop_free(l); /* pending timers are freed with the loop */
}

/* ---- deleting fds from inside callbacks ---- */

struct delctx {
	int p[2][2]; /* two pipes, both readable */
	int calls[2];
	int stale_calls;
	int reused_fd;
};

static void stale_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct delctx *d = ud;
	char c;
	(void)l;
	(void)events;
	if (read(fd, &c, 1) == 1)
		d->stale_calls++;
}

/* Whichever pipe fires first deletes itself and the other one, closes the
 * other and puts a fresh, unreadable fd with the same number under a new
 * callback: the other's pending event in this batch must be dropped. */
static void del_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct delctx *d = ud;
	int me = fd == d->p[0][0] ? 0 : 1;
	int other = 1 - me;
	(void)events;

	d->calls[me]++;
	assert_int_equal(loop_del_fd(l, fd), 0); /* the fd being dispatched */
	assert_int_equal(loop_del_fd(l, d->p[other][0]), 0);
	int ofd = d->p[other][0];
	int q[2];
	/* dup2 closes the old fd and reuses its number in one step */
	assert_int_equal(make_pipe(q), 0);
	assert_int_equal(dup2(q[0], ofd), ofd);
	close(q[0]);
	d->p[other][0] = ofd;
	close(d->p[other][1]);
	d->p[other][1] = q[1];
	assert_int_equal(loop_add_fd(l, ofd, EPOLLIN, stale_cb, d), 0);
	d->reused_fd = ofd;
	loop_add_timer(l, 20, stop_cb, NULL);
}

static void test_del_inside_callback(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct delctx d = {0};

	for (int i = 0; i < 2; i++) {
		assert_int_equal(make_pipe(d.p[i]), 0);
		assert_int_equal(write(d.p[i][1], "x", 1), 1);
		assert_int_equal(loop_add_fd(l, d.p[i][0], EPOLLIN, del_cb, &d), 0);
	}
	assert_int_equal(loop_run(l), 0);
	assert_int_equal(d.calls[0] + d.calls[1], 1);
	assert_int_equal(d.stale_calls, 0);
	/* The new registration works. */
	assert_int_equal(write(d.p[d.calls[0] ? 1 : 0][1], "y", 1), 1);
	loop_add_timer(l, 20, stop_cb, NULL);
	assert_int_equal(loop_run(l), 0);
	assert_true(d.stale_calls >= 1);
	loop_del_fd(l, d.reused_fd);
	for (int i = 0; i < 2; i++) {
		close(d.p[i][0]);
		close(d.p[i][1]);
	}
	loop_free(l);
}

/* ---- before-sleep and wake ---- */

struct wakectx {
	struct loop *l;
	int before_sleep;
	int woken;
	pthread_t th;
};

static void *waker(void *arg)
{
	struct wakectx *w = arg;
	struct timespec ts = {0, 20 * 1000 * 1000};

	nanosleep(&ts, NULL);
	loop_wake(w->l);
	return NULL;
}

static void wake_cb(struct loop *l, void *ud)
{
	struct wakectx *w = ud;
	w->woken++;
	loop_stop(l);
}

static void before_sleep_cb(struct loop *l, void *ud)
{
	struct wakectx *w = ud;
	(void)l;
	w->before_sleep++;
}

static void test_wake_from_thread(void **state)
{
	(void)state;
	struct wakectx w = {0};

	w.l = loop_new();
	loop_set_wake(w.l, wake_cb, &w);
	loop_set_before_sleep(w.l, before_sleep_cb, &w);
	uint64_t guard = loop_add_timer(w.l, 5000, stop_cb, NULL);
	uint64_t t0 = loop_now_ms();
	assert_int_equal(pthread_create(&w.th, NULL, waker, &w), 0);
	assert_int_equal(loop_run(w.l), 0);
	pthread_join(w.th, NULL);
	assert_int_equal(w.woken, 1);
	assert_true(w.before_sleep >= 1);
	assert_true(loop_now_ms() - t0 < 4000);
	loop_del_timer(w.l, guard);

	/* Wakes coalesce; a wake before run is delivered on the next run. */
	loop_wake(w.l);
	loop_wake(w.l);
	assert_int_equal(loop_run(w.l), 0);
	assert_int_equal(w.woken, 2);
	loop_free(w.l);
}

/* ---- allocation failure ---- */

static void test_alloc_failure(void **state)
{
	(void)state;
	struct loop *l;
	int p[2];

	mem_fail_at(1, 0);
	assert_null(loop_new());
	mem_fail_at(0, 0);
	l = loop_new();
	assert_non_null(l);
	assert_int_equal(make_pipe(p), 0);
	mem_fail_at(1, 1);
	assert_int_equal(loop_add_fd(l, p[0], EPOLLIN, stale_cb, NULL), -ENOMEM);
	assert_int_equal(loop_add_timer(l, 1, stop_cb, NULL), 0);
	mem_fail_at(0, 0);
	assert_int_equal(loop_add_fd(l, p[0], EPOLLIN, stale_cb, NULL), 0);
	assert_true(loop_add_timer(l, 1, stop_cb, NULL) > 0);
	assert_int_equal(loop_run(l), 0);
	loop_del_fd(l, p[0]);
	close(p[0]);
	close(p[1]);
	loop_free(l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_fd_callback),	     cmocka_unit_test(test_timer_order_cancel),
	    cmocka_unit_test(test_timer_no_starve),  cmocka_unit_test(test_del_inside_callback),
	    cmocka_unit_test(test_wake_from_thread), cmocka_unit_test(test_alloc_failure),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
