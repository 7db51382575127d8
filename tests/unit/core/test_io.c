/* SPDX-License-Identifier: Apache-2.0 */
/* io: io_write_all writes everything through short writes and signals,
 * and names the error of a write that cannot go on. */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>

#include "airlock/core/io.h"

#define BIG (1u << 20)

struct reader {
	int fd;
	size_t chunk;	 /* bytes per read: small, so the writer's writes come up short */
	long pause_ns;	 /* between reads: the writer blocks, and a signal interrupts it */
	uint8_t *got;
	size_t n;
};

static void *read_all(void *arg)
{
	struct reader *r = arg;
	struct timespec ts = { 0, r->pause_ns };

	for (;;) {
		ssize_t k = read(r->fd, r->got + r->n, r->chunk);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			break;
		r->n += (size_t)k;
		if (r->pause_ns)
			nanosleep(&ts, NULL);
	}
	return NULL;
}

static uint8_t *pattern(size_t n)
{
	uint8_t *p = malloc(n);
	assert_non_null(p);
	for (size_t i = 0; i < n; i++)
		p[i] = (uint8_t)(i * 131u + (i >> 11));
	return p;
}

/* Write BIG bytes into a pipe of one page read 1000 bytes at a time; with
 * an interval timer firing every 200 µs while it writes when `signals`
 * (the caller installs the handler). */
static void through_pipe(bool signals)
{
	int p[2];
	pthread_t t;
	uint8_t *src = pattern(BIG);
	struct reader r = { .chunk = 1000, .pause_ns = signals ? 20000 : 0, .got = calloc(1, BIG + 1) };
	struct itimerval it = { { 0, 200 }, { 0, 200 } }, off = { { 0, 0 }, { 0, 0 } };
	sigset_t set;

	assert_non_null(r.got);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	fcntl(p[1], F_SETPIPE_SZ, 4096);
	r.fd = p[0];
	/* the reader starts with SIGALRM blocked and never takes it: every
	 * alarm lands in this, the writing thread */
	sigemptyset(&set);
	sigaddset(&set, SIGALRM);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	assert_int_equal(pthread_create(&t, NULL, read_all, &r), 0);
	pthread_sigmask(SIG_UNBLOCK, &set, NULL);
	if (signals)
		assert_int_equal(setitimer(ITIMER_REAL, &it, NULL), 0);
	assert_int_equal(io_write_all(p[1], src, BIG), 0);
	if (signals)
		setitimer(ITIMER_REAL, &off, NULL);
	close(p[1]);
	pthread_join(t, NULL);
	close(p[0]);
	assert_int_equal(r.n, BIG);
	assert_memory_equal(r.got, src, BIG);
	free(r.got);
	free(src);
}

static void test_short_writes(void **state)
{
	(void)state;
	through_pipe(false);
}

static volatile sig_atomic_t alarms;
static void on_alarm(int sig)
{
	(void)sig;
	alarms++;
}

static void test_signals(void **state)
{
	struct sigaction sa = { .sa_handler = on_alarm }; /* no SA_RESTART: writes fail with EINTR */
	(void)state;

	assert_int_equal(sigaction(SIGALRM, &sa, NULL), 0);
	alarms = 0;
	through_pipe(true);
	signal(SIGALRM, SIG_IGN);
	assert_true(alarms > 0); /* the writes were interrupted, or this proved nothing */
}

static void test_errors(void **state)
{
	uint8_t b[8192] = { 1 };
	int p[2], fd;
	(void)state;

	/* a full disk */
	fd = open("/dev/full", O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		assert_int_equal(io_write_all(fd, b, sizeof(b)), -ENOSPC);
		close(fd);
	}
	/* a full non-blocking pipe: what fits goes, then -EAGAIN */
	assert_int_equal(pipe2(p, O_CLOEXEC | O_NONBLOCK), 0);
	fcntl(p[1], F_SETPIPE_SZ, 4096);
	assert_int_equal(io_write_all(p[1], b, sizeof(b)), -EAGAIN);
	close(p[1]);
	/* a reader gone */
	signal(SIGPIPE, SIG_IGN);
	assert_int_equal(io_write_all(p[0], b, 1), -EBADF); /* the read end */
	close(p[0]);
	assert_int_equal(pipe2(p, O_CLOEXEC), 0);
	close(p[0]);
	assert_int_equal(io_write_all(p[1], b, 1), -EPIPE);
	close(p[1]);
	assert_int_equal(io_write_all(-1, b, 1), -EBADF);
	/* nothing to write: no write at all, even on a bad descriptor */
	assert_int_equal(io_write_all(-1, b, 0), 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_short_writes),
		cmocka_unit_test(test_signals),
		cmocka_unit_test(test_errors),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
