/* SPDX-License-Identifier: Apache-2.0 */
/*
 * loop: epoll (level-triggered) + a binary min-heap of one-shot timers + an
 * eventfd for loop_wake(). Redis ae.c trimmed to what airlock needs.
 *
 * Stale events. epoll_wait returns a batch; a callback early in the batch
 * may delete (and close) an fd whose event comes later in the same batch,
 * and may even register a new fd that got the same number. Every
 * registration therefore gets a fresh 32-bit generation, stored next to the
 * fd in the epoll data word; an event whose generation no longer matches
 * the table entry is dropped. This makes loop_del_fd() safe from any
 * callback, including the one running for that fd.
 *
 * Timers. Ordered by (deadline, id), so timers with the same deadline fire
 * in the order they were added. A pass fires only timers that existed when
 * it started (id <= the largest id at that moment), so a callback that adds
 * a 0 ms timer cannot keep the loop from polling.
 */
#include "airlock/core/loop.h"

#include <errno.h>
#include <stdbool.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/mem.h"

#define LOOP_MAX_EVENTS 128
/* epoll data word for the wake eventfd: a generation no fd entry ever gets. */
#define WAKE_TAG UINT64_MAX

struct fd_entry {
	loop_fd_fn *fn;
	void *ud;
	uint32_t events;
	uint32_t gen; /* 0 = not registered */
};

struct timer {
	uint64_t when_ns;
	uint64_t id;
	loop_fn *fn;
	void *ud;
};

struct loop {
	int epfd;
	int wakefd;
	bool stop;

	struct fd_entry *fds; /* indexed by fd */
	size_t nfds;
	uint32_t next_gen;

	struct timer *heap;
	size_t nheap, capheap;
	uint64_t next_timer_id;

	loop_fn *before_sleep;
	void *before_sleep_ud;
	loop_fn *wake_fn;
	void *wake_ud;

	struct epoll_event events[LOOP_MAX_EVENTS];
};

uint64_t loop_now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

uint64_t loop_now_ms(void)
{
	return loop_now_ns() / 1000000ull;
}

struct loop *loop_new(void)
{
	struct loop *l = mem_calloc(1, sizeof(*l));

	if (!l)
		return NULL;
	l->epfd = epoll_create1(EPOLL_CLOEXEC);
	l->wakefd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (l->epfd < 0 || l->wakefd < 0)
		goto fail;
	struct epoll_event ev = {.events = EPOLLIN, .data.u64 = WAKE_TAG};
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, l->wakefd, &ev) < 0)
		goto fail;
	l->next_gen = 1;
	l->next_timer_id = 1;
	return l;
fail:
	if (l->epfd >= 0)
		close(l->epfd);
	if (l->wakefd >= 0)
		close(l->wakefd);
	mem_free(l);
	return NULL;
}

void loop_free(struct loop *l)
{
	if (!l)
		return;
	close(l->epfd);
	close(l->wakefd);
	mem_free(l->fds);
	mem_free(l->heap);
	mem_free(l);
}

/* ---- fds ---- */

static struct fd_entry *fd_lookup(struct loop *l, int fd)
{
	if (fd < 0 || (size_t)fd >= l->nfds || l->fds[fd].gen == 0)
		return NULL;
	return &l->fds[fd];
}

static uint64_t ev_data(int fd, uint32_t gen)
{
	return ((uint64_t)gen << 32) | (uint32_t)fd;
}

int loop_add_fd(struct loop *l, int fd, uint32_t events, loop_fd_fn *fn, void *ud)
{
	if (fd < 0 || !fn)
		return -EINVAL;
	if (fd_lookup(l, fd))
		return -EEXIST;
	if ((size_t)fd >= l->nfds) {
		size_t n = l->nfds ? l->nfds : 16;
		while (n <= (size_t)fd)
			n *= 2;
		struct fd_entry *nf = mem_realloc(l->fds, n * sizeof(*nf));
		if (!nf)
			return -ENOMEM;
		memset(nf + l->nfds, 0, (n - l->nfds) * sizeof(*nf));
		l->fds = nf;
		l->nfds = n;
	}
	uint32_t gen = l->next_gen++;
	if (l->next_gen == 0) /* 0 marks a free entry */
		l->next_gen = 1;
	struct epoll_event ev = {.events = events, .data.u64 = ev_data(fd, gen)};
	if (epoll_ctl(l->epfd, EPOLL_CTL_ADD, fd, &ev) < 0)
		return -errno;
	l->fds[fd] = (struct fd_entry){.fn = fn, .ud = ud, .events = events, .gen = gen};
	return 0;
}

int loop_mod_fd(struct loop *l, int fd, uint32_t events)
{
	struct fd_entry *e = fd_lookup(l, fd);

	if (!e)
		return -ENOENT;
	if (e->events == events)
		return 0;
	struct epoll_event ev = {.events = events, .data.u64 = ev_data(fd, e->gen)};
	if (epoll_ctl(l->epfd, EPOLL_CTL_MOD, fd, &ev) < 0)
		return -errno;
	e->events = events;
	return 0;
}

int loop_del_fd(struct loop *l, int fd)
{
	struct fd_entry *e = fd_lookup(l, fd);

	if (!e)
		return -ENOENT;
	/* An fd the caller already closed has left the epoll set by itself
	 * (unless dup'ed); either way the entry goes, so a pending event for
	 * it in the current batch is dropped. */
	(void)epoll_ctl(l->epfd, EPOLL_CTL_DEL, fd, NULL);
	memset(e, 0, sizeof(*e));
	return 0;
}

/* ---- timers: binary min-heap on (when_ns, id) ---- */

static bool timer_before(const struct timer *a, const struct timer *b)
{
	return a->when_ns < b->when_ns || (a->when_ns == b->when_ns && a->id < b->id);
}

static void heap_swap(struct loop *l, size_t i, size_t j)
{
	struct timer t = l->heap[i];
	l->heap[i] = l->heap[j];
	l->heap[j] = t;
}

static void heap_up(struct loop *l, size_t i)
{
	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (!timer_before(&l->heap[i], &l->heap[p]))
			break;
		heap_swap(l, i, p);
		i = p;
	}
}

static void heap_down(struct loop *l, size_t i)
{
	for (;;) {
		size_t a = 2 * i + 1, b = a + 1, m = i;
		if (a < l->nheap && timer_before(&l->heap[a], &l->heap[m]))
			m = a;
		if (b < l->nheap && timer_before(&l->heap[b], &l->heap[m]))
			m = b;
		if (m == i)
			return;
		heap_swap(l, i, m);
		i = m;
	}
}

static void heap_remove(struct loop *l, size_t i)
{
	l->nheap--;
	if (i == l->nheap)
		return;
	l->heap[i] = l->heap[l->nheap];
	heap_up(l, i);
	heap_down(l, i);
}

uint64_t loop_add_timer(struct loop *l, uint64_t ms, loop_fn *fn, void *ud)
{
	if (!fn)
		return 0;
	if (l->nheap == l->capheap) {
		size_t n = l->capheap ? l->capheap * 2 : 16;
		struct timer *nh = mem_realloc(l->heap, n * sizeof(*nh));
		if (!nh)
			return 0;
		l->heap = nh;
		l->capheap = n;
	}
	if (ms > UINT64_MAX / 2000000ull) /* far future; avoid overflow */
		ms = UINT64_MAX / 2000000ull;
	uint64_t id = l->next_timer_id++;
	l->heap[l->nheap] = (struct timer){.when_ns = loop_now_ns() + ms * 1000000ull, .id = id, .fn = fn, .ud = ud};
	heap_up(l, l->nheap++);
	return id;
}

void loop_del_timer(struct loop *l, uint64_t id)
{
	if (!l || id == 0)
		return;
	/* Linear: a loop has a handful of timers (a few per connection). */
	for (size_t i = 0; i < l->nheap; i++) {
		if (l->heap[i].id == id) {
			heap_remove(l, i);
			return;
		}
	}
}

/* Fire due timers that existed when the pass started. */
static void run_timers(struct loop *l)
{
	uint64_t last = l->next_timer_id - 1;
	uint64_t now = loop_now_ns();

	while (l->nheap > 0 && !l->stop) {
		struct timer t = l->heap[0];
		/* Not due, or added during this pass (older due timers below
		 * it fire on the next pass, which polls with timeout 0). */
		if (t.when_ns > now || t.id > last)
			return;
		heap_remove(l, 0);
		t.fn(l, t.ud);
	}
}

/* epoll_wait timeout: until the earliest timer, rounded up to whole ms. */
static int next_timeout(struct loop *l)
{
	if (l->nheap == 0)
		return -1;
	uint64_t now = loop_now_ns();
	uint64_t when = l->heap[0].when_ns;
	if (when <= now)
		return 0;
	uint64_t ms = (when - now + 999999ull) / 1000000ull;
	return ms > INT32_MAX ? INT32_MAX : (int)ms;
}

void loop_set_before_sleep(struct loop *l, loop_fn *fn, void *ud)
{
	l->before_sleep = fn;
	l->before_sleep_ud = ud;
}

void loop_set_wake(struct loop *l, loop_fn *fn, void *ud)
{
	l->wake_fn = fn;
	l->wake_ud = ud;
}

void loop_wake(struct loop *l)
{
	uint64_t one = 1;

	/* Only EAGAIN can fail here (counter at its maximum), and then a wake
	 * is already pending. */
	ssize_t n = write(l->wakefd, &one, sizeof(one));
	(void)n;
}

static void drain_wake(struct loop *l)
{
	uint64_t v;
	ssize_t n = read(l->wakefd, &v, sizeof(v));

	(void)n;
	if (l->wake_fn)
		l->wake_fn(l, l->wake_ud);
}

void loop_stop(struct loop *l)
{
	l->stop = true;
}

int loop_run(struct loop *l)
{
	l->stop = false;
	while (!l->stop) {
		if (l->before_sleep)
			l->before_sleep(l, l->before_sleep_ud);
		if (l->stop)
			break;
		int n = epoll_wait(l->epfd, l->events, LOOP_MAX_EVENTS, next_timeout(l));
		if (n < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		for (int i = 0; i < n && !l->stop; i++) {
			uint64_t d = l->events[i].data.u64;
			if (d == WAKE_TAG) {
				drain_wake(l);
				continue;
			}
			int fd = (int)(uint32_t)d;
			uint32_t gen = (uint32_t)(d >> 32);
			struct fd_entry *e = fd_lookup(l, fd);
			if (!e || e->gen != gen)
				continue; /* deleted (maybe re-added) earlier in this batch */
			e->fn(l, fd, l->events[i].events, e->ud);
		}
		if (!l->stop)
			run_timers(l);
	}
	return 0;
}
