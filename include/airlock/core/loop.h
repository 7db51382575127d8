/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_LOOP_H
#define AIRLOCK_LOOP_H

/*
 * loop: a single-threaded epoll event loop (Redis ae, trimmed): fd
 * readiness callbacks, one-shot millisecond timers, and a before-sleep hook
 * that runs each time the loop is about to block (where batching happens).
 *
 * Not thread-safe: every call except loop_wake() must come from the loop's
 * own thread. loop_wake() may be called from any thread; it makes the loop
 * run its wake callback (set with loop_set_wake) on its own thread.
 */

#include <stdint.h>
#include <sys/epoll.h>

struct loop;

typedef void loop_fd_fn(struct loop *l, int fd, uint32_t events, void *ud);
typedef void loop_fn(struct loop *l, void *ud);

/* NULL when out of memory. */
struct loop *loop_new(void);
/* Frees the loop; does not close registered fds. NULL is a no-op. */
void loop_free(struct loop *l);

/* Register fd for EPOLLIN/EPOLLOUT (level-triggered). One callback per fd.
 * -EEXIST if already registered. */
int loop_add_fd(struct loop *l, int fd, uint32_t events, loop_fd_fn *fn, void *ud);
int loop_mod_fd(struct loop *l, int fd, uint32_t events);
/* Safe to call from inside any callback, including for the fd whose
 * callback is running. */
int loop_del_fd(struct loop *l, int fd);

/* One-shot timer after ms milliseconds. Returns an id > 0, or 0 when out of
 * memory. loop_del_timer of a fired or unknown id is a no-op. */
uint64_t loop_add_timer(struct loop *l, uint64_t ms, loop_fn *fn, void *ud);
void loop_del_timer(struct loop *l, uint64_t id);

void loop_set_before_sleep(struct loop *l, loop_fn *fn, void *ud);
void loop_set_wake(struct loop *l, loop_fn *fn, void *ud);
void loop_wake(struct loop *l);

/* Run until loop_stop(). Returns 0, or -errno if epoll fails. */
int loop_run(struct loop *l);
void loop_stop(struct loop *l);

/* Monotonic clock. */
uint64_t loop_now_ms(void);
uint64_t loop_now_ns(void);

#endif
