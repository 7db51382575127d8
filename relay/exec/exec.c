/* SPDX-License-Identifier: Apache-2.0 */
/*
 * exec: run one command on the loop. See include/airlock/exec/exec.h for the
 * contract and doc/EXEC.md for the lifecycle.
 *
 * Lifecycle of a struct exec:
 *   start   fork; the child joins its cgroup, makes its own process group
 *           (or session + controlling tty), resets signals, applies limits,
 *           drops to the run uid, fchdir()s to the confined cwd, marks every
 *           other fd close-on-exec and execs. Failures before execve come
 *           back on a CLOEXEC pipe that exec_start reads synchronously.
 *   run     output fds and a pidfd on the loop; stdin through a bounded buf.
 *   exited  pidfd readable: status read with WNOWAIT, so the main process
 *           stays a zombie and its pid (= the process group id) cannot be
 *           reused while we may still signal the group.
 *   drained both streams at EOF, or cut off after drain_ms while a
 *           descendant held them open (the tree is killed first).
 *   swept   whatever is left in the cgroup is killed and we wait (5 ms
 *           ticks, at most EXEC_SWEEP_TICKS) until it is empty.
 *   done    main process reaped, on_exit called.
 *
 * Callbacks never run from inside a public call; they run from loop events
 * (fd, timer), so a callback can only be "running" for the exec whose event
 * is being handled. exec_free() from inside that callback is deferred until
 * the callback returns (in_cb / free_pending).
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <linux/openat2.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "airlock/core/buf.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "exec_i.h"

#ifndef P_PIDFD
#define P_PIDFD 3
#endif
#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

#ifndef SYS_clone3
#define SYS_clone3 435 /* the same number on every architecture */
#endif
#define EXEC_CLONE_INTO_CGROUP 0x200000000ULL /* Linux 5.7 */

/* clone3's arguments up to .cgroup (CLONE_ARGS_SIZE_VER2), as
 * <linux/sched.h> has them; spelled here so that header and glibc's
 * <sched.h> need not meet. */
struct exec_clone_args {
	uint64_t flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size,
	    cgroup;
};

#define EXEC_SWEEP_TICK_MS 5
#define EXEC_SWEEP_TICKS   400 /* 2 s */
#define EXEC_WAIT_POLL_MS  20  /* only without pidfd_open */
#define EXEC_DEFAULT_PATH  "/usr/local/bin:/usr/bin:/bin"

enum { SLOT_OUT1, SLOT_OUT2, SLOT_IN, NSLOT };

/* Child setup steps, reported with errno on the error pipe. */
enum stage {
	ST_CGROUP = 1,
	ST_SESSION,
	ST_STDIO,
	ST_SIGNALS,
	ST_RLIMIT,
	ST_IDS,
	ST_CWD,
	ST_PDEATH,
	ST_FDS,
	ST_CONFINE,
	ST_EXEC,
};

struct child_err {
	int stage;
	int err;
};

struct exec {
	struct loop *loop;
	struct exec_ops ops;
	void *ud;

	pid_t pid;
	int pidfd; /* -1 when pidfd_open is unavailable (then a poll timer) */
	bool tty;
	int fd[NSLOT];	     /* out1 (pipe or pty master), out2, stdin pipe; -1 = closed */
	uint32_t reg[NSLOT]; /* events registered on the loop; 0 = not registered */
	bool paused;
	bool held[NSLOT]; /* not read until t_hold fires: coalescing a trickle of output */
	uint32_t hold_ms; /* 0: never held */

	struct buf in;	/* accepted stdin bytes not yet written */
	bool in_eof;	/* close requested, pending until in drains */
	bool in_done;	/* closed or broken: no more writes */
	bool in_broken; /* the command closed its end */
	bool in_wanted; /* a writer was refused: notify when room */

	uint8_t *rbuf;
	struct exec_cg cg;

	uint64_t t_timeout, t_grace, t_drain, t_sweep, t_wait, t_notify, t_hold;
	int drain_stage;
	int sweep_ticks;
	uint32_t grace_ms, drain_ms;

	bool exited; /* status known (zombie) */
	bool reaped;
	bool finished; /* on_exit delivered */
	bool killing;  /* TERM sent, grace running */
	int in_cb;
	bool free_pending;

	uint64_t start_ms;
	struct exec_result res;
};

static void update_fd(struct exec *e, int slot);
static void hold_end(struct exec *e);
static void destroy(struct exec *e);
static void maybe_finish(struct exec *e);

/* ---- small helpers ---- */

static void close_fd(int *fd)
{
	if (*fd >= 0) {
		close(*fd);
		*fd = -1;
	}
}

/* Move fd to >= 3 so dup2 onto 0..2 in the child can never clobber another
 * of the child's fds (the agent may run with 0..2 closed). */
static int fd_high(int fd)
{
	if (fd < 0 || fd > 2)
		return fd;
	int n = fcntl(fd, F_DUPFD_CLOEXEC, 3);
	int err = errno;
	close(fd);
	errno = err;
	return n;
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

static void del_timer(struct exec *e, uint64_t *id)
{
	if (*id) {
		loop_del_timer(e->loop, *id);
		*id = 0;
	}
}

static void arm(struct exec *e, uint64_t *id, uint64_t ms, loop_fn *fn)
{
	del_timer(e, id);
	*id = loop_add_timer(e->loop, ms, fn, e);
}

/* Bracket a user callback; cb_leave is false when the exec was freed from
 * inside it (then e must not be touched). */
static void cb_enter(struct exec *e)
{
	e->in_cb++;
}

static bool cb_leave(struct exec *e)
{
	if (--e->in_cb == 0 && e->free_pending) {
		destroy(e);
		return false;
	}
	return true;
}

/* sig to the whole tree: the cgroup when there is one, and the process
 * group (pgid == pid, kept valid by the unreaped main process). */
static void signal_tree(struct exec *e, int sig)
{
	if (exec_cg_tracks(&e->cg))
		(void)exec_cg_signal(&e->cg, sig);
	if (!e->reaped)
		(void)kill(-e->pid, sig);
}

/* ---- exit, drain, sweep, finish ---- */

static void finish(struct exec *e)
{
	siginfo_t si;

	del_timer(e, &e->t_timeout);
	del_timer(e, &e->t_grace);
	del_timer(e, &e->t_drain);
	del_timer(e, &e->t_sweep);
	del_timer(e, &e->t_wait);
	del_timer(e, &e->t_notify);
	del_timer(e, &e->t_hold);
	if (!e->reaped) {
		memset(&si, 0, sizeof(si));
		if (e->pidfd >= 0)
			(void)waitid((idtype_t)P_PIDFD, (id_t)e->pidfd, &si, WEXITED | WNOHANG);
		else
			(void)waitid(P_PID, (id_t)e->pid, &si, WEXITED | WNOHANG);
		e->reaped = true;
	}
	close_fd(&e->pidfd);
	for (int s = 0; s < NSLOT; s++) {
		if (e->reg[s])
			loop_del_fd(e->loop, e->fd[s]);
		e->reg[s] = 0;
		close_fd(&e->fd[s]);
	}
	e->in_done = true;
	buf_clear(&e->in);
	e->finished = true;
	cb_enter(e);
	e->ops.on_exit(e, &e->res, e->ud);
	cb_leave(e);
}

static void sweep_tick(struct loop *l, void *ud)
{
	struct exec *e = ud;

	(void)l;
	e->t_sweep = 0;
	if (exec_cg_populated(&e->cg) == 1 && ++e->sweep_ticks < EXEC_SWEEP_TICKS) {
		(void)exec_cg_signal(&e->cg, SIGKILL);
		arm(e, &e->t_sweep, EXEC_SWEEP_TICK_MS, sweep_tick);
		if (e->t_sweep)
			return;
	}
	finish(e);
}

/* The main process exited and output is done: kill what is left of the
 * tree (background jobs die with their command) and finish once empty. */
static void sweep(struct exec *e)
{
	del_timer(e, &e->t_timeout);
	del_timer(e, &e->t_grace);
	del_timer(e, &e->t_drain);
	if (exec_cg_tracks(&e->cg)) {
		if (exec_cg_populated(&e->cg) == 1) {
			(void)exec_cg_signal(&e->cg, SIGKILL);
			e->sweep_ticks = 0;
			arm(e, &e->t_sweep, EXEC_SWEEP_TICK_MS, sweep_tick);
			if (e->t_sweep)
				return;
		}
	} else {
		/* No cgroup: only the process group can be reached; processes
		 * that called setsid survive (doc/EXEC.md). */
		(void)kill(-e->pid, SIGKILL);
	}
	finish(e);
}

static void drain_fire(struct loop *l, void *ud)
{
	struct exec *e = ud;

	(void)l;
	e->t_drain = 0;
	if (e->paused) {
		/* The consumer holds the output back; nothing is lost by waiting. */
		arm(e, &e->t_drain, e->drain_ms, drain_fire);
		return;
	}
	if (e->drain_stage == 0) {
		/* A descendant keeps the output open after the main process exited. */
		e->res.lingering_killed = true;
		signal_tree(e, SIGKILL);
		e->drain_stage = 1;
		arm(e, &e->t_drain, e->drain_ms, drain_fire);
		return;
	}
	/* Still open after the kill: an escapee we cannot reach (no cgroup). */
	for (int s = SLOT_OUT1; s <= SLOT_OUT2; s++) {
		if (e->reg[s])
			loop_del_fd(e->loop, e->fd[s]);
		e->reg[s] = 0;
		close_fd(&e->fd[s]);
	}
	maybe_finish(e);
}

static void maybe_finish(struct exec *e)
{
	if (!e->exited || e->finished)
		return;
	if (e->fd[SLOT_OUT1] >= 0 || e->fd[SLOT_OUT2] >= 0) {
		if (!e->t_drain)
			arm(e, &e->t_drain, e->drain_ms, drain_fire);
		return;
	}
	sweep(e);
}

static void check_exit(struct exec *e)
{
	siginfo_t si;
	int r;

	memset(&si, 0, sizeof(si));
	if (e->pidfd >= 0)
		r = waitid((idtype_t)P_PIDFD, (id_t)e->pidfd, &si, WEXITED | WNOHANG | WNOWAIT);
	else
		r = waitid(P_PID, (id_t)e->pid, &si, WEXITED | WNOHANG | WNOWAIT);
	if (r < 0 && errno == EINTR)
		return;
	if (r == 0 && si.si_pid == 0)
		return; /* not yet */
	e->exited = true;
	e->res.duration_ms = loop_now_ms() - e->start_ms;
	if (r < 0) {
		/* Reaped behind our back (someone called wait(-1)): unknown status. */
		e->reaped = true;
		e->res.exit_code = 255;
	} else if (si.si_code == CLD_EXITED) {
		e->res.exit_code = si.si_status & 0xff;
	} else {
		e->res.signal = si.si_status;
		e->res.core_dumped = si.si_code == CLD_DUMPED;
		e->res.exit_code = 128 + si.si_status;
	}
	if (e->pidfd >= 0)
		loop_del_fd(e->loop, e->pidfd);
	del_timer(e, &e->t_wait);
	del_timer(e, &e->t_timeout);
	hold_end(e); /* what is left, and the EOF, at once */
	maybe_finish(e);
}

static void pidfd_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	(void)l;
	(void)fd;
	(void)events;
	check_exit(ud);
}

static void wait_poll(struct loop *l, void *ud)
{
	struct exec *e = ud;

	(void)l;
	/* Re-arm first: check_exit may finish and free e. */
	e->t_wait = loop_add_timer(e->loop, EXEC_WAIT_POLL_MS, wait_poll, e);
	check_exit(e);
}

/* ---- timeout / cancel ---- */

static void grace_fire(struct loop *l, void *ud)
{
	struct exec *e = ud;

	(void)l;
	e->t_grace = 0;
	signal_tree(e, SIGKILL);
}

static void start_kill(struct exec *e)
{
	if (e->killing)
		return;
	e->killing = true;
	signal_tree(e, SIGTERM);
	/* A stopped process would never act on SIGTERM. */
	signal_tree(e, SIGCONT);
	arm(e, &e->t_grace, e->grace_ms, grace_fire);
	if (!e->t_grace)
		signal_tree(e, SIGKILL);
}

static void timeout_fire(struct loop *l, void *ud)
{
	struct exec *e = ud;

	(void)l;
	e->t_timeout = 0;
	if (e->exited)
		return;
	e->res.timed_out = true;
	start_kill(e);
}

/* ---- output ---- */

/* Output is read as soon as it comes, then, after a read that emptied the
 * pipe, not again for hold_ms: a command that prints line by line (a test
 * runner's warnings: 180 000 lines in two seconds) otherwise costs a read,
 * an on_output and everything the consumer does per chunk (a frame, its
 * encryption, the host's event, the client's write) for every line or two,
 * which on a busy machine takes CPU from the commands themselves. The first
 * bytes after a quiet spell are not delayed; a flood is not held (its reads
 * fill whole chunks); at the main process's exit the holds end, so its
 * exit is not delayed either. */
static void unhold(struct exec *e)
{
	e->held[SLOT_OUT1] = e->held[SLOT_OUT2] = false;
	update_fd(e, SLOT_OUT1);
	update_fd(e, SLOT_OUT2);
}

static void hold_fire(struct loop *l, void *ud)
{
	struct exec *e = ud;

	(void)l;
	e->t_hold = 0;
	unhold(e);
}

static void hold_end(struct exec *e)
{
	if (e->t_hold) {
		del_timer(e, &e->t_hold);
		unhold(e);
	}
}

static void hold(struct exec *e, int slot)
{
	if (!e->hold_ms || e->exited || e->fd[slot] < 0)
		return;
	if (!e->t_hold && !(e->t_hold = loop_add_timer(e->loop, e->hold_ms, hold_fire, e)))
		return; /* ENOMEM: read at once, as without a hold */
	e->held[slot] = true;
	update_fd(e, slot);
}

static void read_out(struct exec *e, int slot)
{
	ssize_t n = read(e->fd[slot], e->rbuf, EXEC_CHUNK);

	if (n > 0) {
		int stream = slot == SLOT_OUT1 ? 1 : 2;
		if (stream == 1)
			e->res.stdout_bytes += (uint64_t)n;
		else
			e->res.stderr_bytes += (uint64_t)n;
		cb_enter(e);
		e->ops.on_output(e, stream, e->rbuf, (size_t)n, e->ud);
		if (cb_leave(e) && n < EXEC_CHUNK) /* else e may be gone; a full chunk: more waits */
			hold(e, slot);
		return;
	}
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	/* EOF; a pty master reads EIO once every slave fd is closed. */
	if (e->reg[slot])
		loop_del_fd(e->loop, e->fd[slot]);
	e->reg[slot] = 0;
	close_fd(&e->fd[slot]);
	if (e->tty && slot == SLOT_OUT1) {
		e->in_done = e->in_broken = true;
		buf_reset(&e->in);
	}
	maybe_finish(e);
}

/* ---- stdin ---- */

static int stdin_fd(const struct exec *e)
{
	return e->tty ? e->fd[SLOT_OUT1] : e->fd[SLOT_IN];
}

static void notify_fire(struct loop *l, void *ud)
{
	struct exec *e = ud;

	(void)l;
	e->t_notify = 0;
	if (!e->in_wanted || !e->ops.on_stdin_writable || e->finished)
		return;
	e->in_wanted = false;
	cb_enter(e);
	e->ops.on_stdin_writable(e, e->ud);
	cb_leave(e);
}

static void stdin_broken(struct exec *e)
{
	e->in_broken = e->in_done = true;
	e->in_eof = false;
	buf_reset(&e->in);
	if (!e->tty) {
		if (e->reg[SLOT_IN])
			loop_del_fd(e->loop, e->fd[SLOT_IN]);
		e->reg[SLOT_IN] = 0;
		close_fd(&e->fd[SLOT_IN]);
	}
}

/* Write what we can; never calls a user callback. */
static void flush_stdin(struct exec *e)
{
	int fd = stdin_fd(e);

	if (fd < 0 || e->in_done)
		return;
	while (buf_len(&e->in) > 0) {
		ssize_t n = write(fd, buf_ptr(&e->in), buf_len(&e->in));
		if (n > 0) {
			(void)buf_consume(&e->in, (size_t)n);
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno == EAGAIN)
			break;
		stdin_broken(e);
		return;
	}
	if (buf_len(&e->in) == 0) {
		buf_reset(&e->in);
		if (e->in_eof) {
			e->in_eof = false;
			e->in_done = true;
			if (e->tty) {
				struct termios t;
				char eof = 4; /* ^D */
				if (tcgetattr(fd, &t) == 0 && t.c_cc[VEOF])
					eof = (char)t.c_cc[VEOF];
				(void)!write(fd, &eof, 1);
			} else {
				if (e->reg[SLOT_IN])
					loop_del_fd(e->loop, e->fd[SLOT_IN]);
				e->reg[SLOT_IN] = 0;
				close_fd(&e->fd[SLOT_IN]);
			}
		}
	}
	if (e->in_wanted && e->ops.on_stdin_writable && !e->t_notify && e->in.max - buf_len(&e->in) >= e->in.max / 2)
		e->t_notify = loop_add_timer(e->loop, 0, notify_fire, e);
	update_fd(e, e->tty ? SLOT_OUT1 : SLOT_IN);
}

/* ---- loop registration ---- */

static uint32_t want_events(const struct exec *e, int slot)
{
	uint32_t ev = 0;

	if (e->fd[slot] < 0 || e->finished)
		return 0;
	if (slot != SLOT_IN && !e->paused && !e->held[slot])
		ev |= EPOLLIN;
	bool in_pending = !e->in_done && (buf_len(&e->in) > 0 || e->in_eof);
	if (in_pending && ((e->tty && slot == SLOT_OUT1) || (!e->tty && slot == SLOT_IN)))
		ev |= EPOLLOUT;
	return ev;
}

static void fd_cb(struct loop *l, int fd, uint32_t events, void *ud);

static void update_fd(struct exec *e, int slot)
{
	uint32_t ev = want_events(e, slot);

	if (ev == e->reg[slot])
		return;
	if (!ev) {
		/* Unregister rather than mask: epoll reports HUP/ERR even for an
		 * empty mask, which would spin while paused. */
		loop_del_fd(e->loop, e->fd[slot]);
	} else if (!e->reg[slot]) {
		if (loop_add_fd(e->loop, e->fd[slot], ev, fd_cb, e) < 0)
			return; /* ENOMEM: retried on the next update */
	} else if (loop_mod_fd(e->loop, e->fd[slot], ev) < 0) {
		return;
	}
	e->reg[slot] = ev;
}

static void fd_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct exec *e = ud;
	int slot = fd == e->fd[SLOT_OUT1] ? SLOT_OUT1 : fd == e->fd[SLOT_OUT2] ? SLOT_OUT2 : SLOT_IN;

	(void)l;
	if ((events & (EPOLLOUT | EPOLLERR)) && (slot == SLOT_IN || (e->tty && (e->reg[slot] & EPOLLOUT)))) {
		flush_stdin(e);
		if (slot == SLOT_IN)
			return;
		if (e->fd[slot] < 0)
			return;
	}
	if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && slot != SLOT_IN && (e->reg[slot] & EPOLLIN))
		read_out(e, slot);
}

/* ---- environment ---- */

static size_t env_name_len(const char *s)
{
	const char *eq = strchr(s, '=');
	return eq ? (size_t)(eq - s) : 0;
}

static bool env_name_ok(const char *s)
{
	const char *eq = strchr(s, '=');
	if (!eq || eq == s || (size_t)(eq - s) > EXEC_ENV_NAME_MAX)
		return false;
	if (!((*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_'))
		return false;
	for (const char *p = s + 1; p < eq; p++)
		if (!((*p >= 'A' && *p <= 'Z') || (*p >= 'a' && *p <= 'z') || (*p >= '0' && *p <= '9') || *p == '_'))
			return false;
	return true;
}

static char *env_pair(const char *name, const char *value)
{
	size_t ln = strlen(name), lv = strlen(value);
	char *s = mem_alloc(ln + lv + 2);
	if (!s)
		return NULL;
	memcpy(s, name, ln);
	s[ln] = '=';
	memcpy(s + ln + 1, value, lv + 1);
	return s;
}

/* Add or replace; takes ownership of s. */
static int env_set(char **v, size_t *n, size_t *total, char *s)
{
	size_t ln = env_name_len(s);
	for (size_t i = 0; i < *n; i++) {
		if (env_name_len(v[i]) == ln && memcmp(v[i], s, ln) == 0) {
			*total -= strlen(v[i]) + 1;
			mem_free(v[i]);
			v[i] = s;
			*total += strlen(s) + 1;
			return 0;
		}
	}
	v[(*n)++] = s;
	*total += strlen(s) + 1;
	return 0;
}

int exec_env_build(const struct exec_env_in *in, char ***out, const char **bad)
{
	size_t cap = 5 + in->n_forwarded + in->n_request, n = 0, total = 0;
	size_t max = in->max_bytes ? in->max_bytes : EXEC_ENV_MAX_BYTES;
	char **v;
	int r = 0;

	*out = NULL;
	if (bad)
		*bad = NULL;
	if ((in->n_forwarded && !in->forwarded) || (in->n_request && !in->request))
		return -EINVAL;
	if (!(v = mem_calloc(cap, sizeof(*v))))
		return -ENOMEM;
	const char *base[4][2] = {
	    {"PATH", in->path ? in->path : "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"},
	    {"HOME", in->home ? in->home : "/tmp"},
	    {"LANG", in->lang ? in->lang : "C.UTF-8"},
	    {"TERM", in->term ? in->term : "xterm-256color"},
	};
	for (int i = 0; i < (in->tty ? 4 : 3); i++) {
		char *s = env_pair(base[i][0], base[i][1]);
		if (!s) {
			r = -ENOMEM;
			goto out;
		}
		env_set(v, &n, &total, s);
	}
	for (int layer = 0; layer < 2; layer++) {
		const char *const *list = layer ? in->request : in->forwarded;
		size_t cnt = layer ? in->n_request : in->n_forwarded;
		for (size_t i = 0; i < cnt; i++) {
			if (!list[i] || !env_name_ok(list[i])) {
				if (bad)
					*bad = list[i];
				r = -EINVAL;
				goto out;
			}
			char *s = mem_strdup(list[i]);
			if (!s) {
				r = -ENOMEM;
				goto out;
			}
			env_set(v, &n, &total, s);
			if (total > max) {
				if (bad)
					*bad = list[i];
				r = -E2BIG;
				goto out;
			}
		}
	}
	if (total > max)
		r = -E2BIG;
out:
	if (r < 0) {
		exec_env_free(v);
		return r;
	}
	*out = v;
	return 0;
}

void exec_env_free(char **envp)
{
	if (!envp)
		return;
	for (char **p = envp; *p; p++)
		mem_free(*p);
	mem_free(envp);
}

/* ---- child ---- */

struct child {
	const char *const *argv;
	char *const *envp;
	const char *path; /* PATH value for the search */
	int stdio[3];
	int tty_slave; /* -1 for pipes */
	int cwd_fd;
	int err_fd;
	int procs_fd[3];
	bool set_ids;
	uid_t uid;
	gid_t gid;
	bool nproc_set, as_set;
	struct rlimit nproc, as;
	const struct exec_confine *confine;
	pid_t parent;
};

static __attribute__((noreturn)) void child_fail(const struct child *c, int stage, int err)
{
	struct child_err ce = {.stage = stage, .err = err};

	(void)!write(c->err_fd, &ce, sizeof(ce));
	_exit(stage == ST_EXEC ? (err == ENOENT ? 127 : 126) : 125);
}

/* execvpe with the PATH of the command's own environment (glibc's execvpe
 * would use the agent's). Async-signal-safe: no allocation. */
static int child_execvp(const struct child *c)
{
	const char *file = c->argv[0];
	char buf[4096];
	bool eacces = false;

	if (!*file)
		return ENOENT;
	if (strchr(file, '/')) {
		execve(file, (char *const *)c->argv, c->envp);
		return errno;
	}
	size_t lf = strlen(file);
	const char *p = c->path;
	for (;;) {
		const char *end = strchr(p, ':');
		size_t ld = end ? (size_t)(end - p) : strlen(p);
		if (ld + lf + 2 <= sizeof(buf)) {
			size_t o = 0;
			if (ld == 0) {
				buf[o++] = '.';
			} else {
				memcpy(buf, p, ld);
				o = ld;
			}
			buf[o++] = '/';
			memcpy(buf + o, file, lf + 1);
			execve(buf, (char *const *)c->argv, c->envp);
			switch (errno) {
			case EACCES:
				eacces = true;
				break;
			case ENOENT:
			case ENOTDIR:
			case ELOOP:
			case ENAMETOOLONG:
			case ENODEV:
			case ETIMEDOUT:
			case ESTALE:
				break;
			default:
				return errno;
			}
		}
		if (!end)
			break;
		p = end + 1;
	}
	return eacces ? EACCES : ENOENT;
}

static __attribute__((noreturn)) void child_main(const struct child *c)
{
	/* 1. Join the cgroups first, so everything this child forks is tracked. */
	for (int i = 0; i < 3; i++)
		if (c->procs_fd[i] >= 0 && write(c->procs_fd[i], "0", 1) != 1)
			child_fail(c, ST_CGROUP, errno);

	/* 2. Own process group, or a session with the pty as controlling tty. */
	if (c->tty_slave >= 0) {
		if (setsid() < 0)
			child_fail(c, ST_SESSION, errno);
		if (ioctl(c->tty_slave, TIOCSCTTY, 0) < 0)
			child_fail(c, ST_SESSION, errno);
	} else if (setpgid(0, 0) < 0) {
		child_fail(c, ST_SESSION, errno);
	}

	/* 3. stdio (sources are all >= 3). */
	for (int i = 0; i < 3; i++)
		if (dup2(c->stdio[i], i) < 0)
			child_fail(c, ST_STDIO, errno);

	/* 4. Signals: nothing blocked, nothing ignored (execve keeps both). */
	sigset_t all;
	sigemptyset(&all);
	if (sigprocmask(SIG_SETMASK, &all, NULL) < 0)
		child_fail(c, ST_SIGNALS, errno);
	struct sigaction dfl;
	memset(&dfl, 0, sizeof(dfl));
	dfl.sa_handler = SIG_DFL;
	for (int s = 1; s < NSIG; s++)
		(void)sigaction(s, &dfl, NULL);

	/* 5. Limits. */
	if (c->nproc_set && setrlimit(RLIMIT_NPROC, &c->nproc) < 0)
		child_fail(c, ST_RLIMIT, errno);
	if (c->as_set && setrlimit(RLIMIT_AS, &c->as) < 0)
		child_fail(c, ST_RLIMIT, errno);

	/* 6. Identity: groups, then gid, then uid (after which we cannot).
	 * Raw syscalls: the child has one thread, and after a raw clone3
	 * glibc's wrappers would try to change the agent's other threads
	 * too (its copy of the thread list is the agent's). */
	if (c->set_ids) {
		gid_t g[1] = {c->gid};
		if (syscall(SYS_setgroups, 1, g) < 0 || syscall(SYS_setresgid, c->gid, c->gid, c->gid) < 0)
			child_fail(c, ST_IDS, errno);
		if (syscall(SYS_setresuid, c->uid, c->uid, c->uid) < 0)
			child_fail(c, ST_IDS, errno);
	}

	/* 7. cwd, checked with the command's own permissions. */
	if (fchdir(c->cwd_fd) < 0)
		child_fail(c, ST_CWD, errno);

	/* 8. Die with the agent. Set after the uid change, which clears it. */
	if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0)
		child_fail(c, ST_PDEATH, errno);
	if (getppid() != c->parent)
		_exit(125);

	/* 9. Nothing else leaks into the command (the error pipe is CLOEXEC
	 * already and closes by itself at execve). */
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0) {
		struct rlimit nf;
		unsigned long max = 65536;
		if (getrlimit(RLIMIT_NOFILE, &nf) == 0 && nf.rlim_cur != RLIM_INFINITY && nf.rlim_cur < max)
			max = nf.rlim_cur;
		for (unsigned long fd = 3; fd < max; fd++)
			(void)fcntl((int)fd, F_SETFD, FD_CLOEXEC);
	}

	/* 10. Landlock and seccomp last: nothing above needs what they deny. */
	if (c->confine) {
		int r = exec_confine_apply(c->confine);
		if (r < 0)
			child_fail(c, ST_CONFINE, -r);
	}

	child_fail(c, ST_EXEC, child_execvp(c));
}

/* ---- start ---- */

static int open_cwd(int root_fd, const char *cwd, int *out)
{
	struct open_how how;

	memset(&how, 0, sizeof(how));
	how.flags = O_PATH | O_DIRECTORY | O_CLOEXEC;
	how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
	if (!cwd || !*cwd)
		cwd = ".";
	if (cwd[0] == '/')
		return -EXDEV; /* RESOLVE_BENEATH says so too; be explicit */
	long fd = syscall(SYS_openat2, root_fd, cwd, &how, sizeof(how));
	if (fd < 0)
		return -errno;
	*out = (int)fd;
	return 0;
}

static int open_pty(const struct exec_req *req, int *master, int *slave)
{
	struct winsize ws = {.ws_row = req->rows ? req->rows : 24, .ws_col = req->cols ? req->cols : 80};
	int r;

	*master = *slave = -1;
	*master = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (*master < 0)
		return -errno;
	if (grantpt(*master) < 0 || unlockpt(*master) < 0)
		goto fail;
	*slave = ioctl(*master, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
	if (*slave < 0) {
		char name[128];
		if (ptsname_r(*master, name, sizeof(name)) != 0)
			goto fail;
		if ((*slave = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC)) < 0)
			goto fail;
	}
	if (ioctl(*slave, TIOCSWINSZ, &ws) < 0 || (r = set_nonblock(*master)) < 0)
		goto fail;
	return 0;
fail:
	r = -errno;
	close_fd(master);
	close_fd(slave);
	return r ? r : -EIO;
}

static const char *env_path(const char *const *envp)
{
	for (; envp && *envp; envp++)
		if (strncmp(*envp, "PATH=", 5) == 0)
			return *envp + 5;
	return EXEC_DEFAULT_PATH;
}

/* What exec_start opens before fork: the child's ends and the error pipe.
 * All closed in the parent after fork (the child has its copies), or on
 * failure. */
struct start_fds {
	int child[3]; /* child's stdin, stdout, stderr (pipes) */
	int slave;    /* pty slave (tty) */
	int cwd;
	int err[2]; /* CLOEXEC error pipe: read end, write end */
};

static void start_fds_close(struct start_fds *f)
{
	close_fd(&f->err[0]);
	close_fd(&f->err[1]);
	close_fd(&f->slave);
	for (int i = 0; i < 3; i++)
		close_fd(&f->child[i]);
	close_fd(&f->cwd);
}

/* fd_high in place (no-op for -1): -errno when the move failed, fd then
 * closed and -1. */
static int move_high(int *fd)
{
	if (*fd < 0)
		return 0;
	if ((*fd = fd_high(*fd)) < 0)
		return -errno;
	return 0;
}

static bool start_req_valid(const struct loop *loop, const struct exec_req *req, const struct exec_ops *ops)
{
	return loop && req && ops && ops->on_output && ops->on_exit && (!req->argv != !req->shell) &&
	       (!req->argv || req->argv[0]) && req->root_fd >= 0;
}

/* A new exec with no process yet; NULL when out of memory. */
static struct exec *exec_alloc(struct loop *loop, const struct exec_req *req, const struct exec_ops *ops, void *ud)
{
	struct exec *e = mem_calloc(1, sizeof(*e));

	if (!e)
		return NULL;
	e->loop = loop;
	e->ops = *ops;
	e->ud = ud;
	e->pidfd = -1;
	e->fd[0] = e->fd[1] = e->fd[2] = -1;
	e->tty = req->tty;
	e->grace_ms = req->grace_ms ? req->grace_ms : EXEC_GRACE_MS_DEFAULT;
	e->drain_ms = req->drain_ms ? req->drain_ms : EXEC_DRAIN_MS_DEFAULT;
	e->hold_ms = req->hold_ms == EXEC_HOLD_NONE ? 0 : req->hold_ms ? req->hold_ms : EXEC_HOLD_MS_DEFAULT;
	size_t inmax = req->stdin_buf ? req->stdin_buf : EXEC_STDIN_BUF_DEFAULT;
	buf_init(&e->in, inmax > EXEC_STDIN_BUF_MAX ? EXEC_STDIN_BUF_MAX : inmax);
	e->cg.procs_fd[0] = e->cg.procs_fd[1] = e->cg.procs_fd[2] = -1;
	if (!(e->rbuf = mem_alloc(EXEC_CHUNK))) {
		destroy(e);
		return NULL;
	}
	return e;
}

/* The child's plan, as far as the request says it; the fds and ids are
 * filled in by the steps that open them. */
static void child_init(struct child *c, const struct exec_req *req, const char *const *sh_argv)
{
	static const char *const empty_env[] = {NULL};

	memset(c, 0, sizeof(*c));
	c->argv = req->argv ? req->argv : sh_argv;
	c->envp = (char *const *)(req->envp ? req->envp : empty_env);
	c->path = env_path(req->envp);
	c->tty_slave = -1;
	c->parent = getpid();
	c->confine = req->confine;
}

/* tty: one pty; the master is out1, the slave all three of the child's
 * stdio. */
static int setup_pty(struct exec *e, const struct exec_req *req, struct child *c, struct start_fds *f)
{
	int master, r;

	if ((r = open_pty(req, &master, &f->slave)) < 0)
		return r;
	e->fd[SLOT_OUT1] = master;
	if ((r = move_high(&f->slave)) < 0)
		return r;
	c->tty_slave = f->slave;
	c->stdio[0] = c->stdio[1] = c->stdio[2] = f->slave;
	return 0;
}

/* Pipes: stdin (or /dev/null), stdout, stderr; our ends non-blocking in
 * e->fd, the child's in f->child. */
static int setup_pipes(struct exec *e, const struct exec_req *req, struct child *c, struct start_fds *f)
{
	int r;

	for (int i = 0; i < 3; i++) {
		int p[2];
		if (i == 0 && !req->stdin_open) {
			if ((f->child[0] = open("/dev/null", O_RDONLY | O_CLOEXEC)) < 0)
				return -errno;
		} else {
			if (pipe2(p, O_CLOEXEC) < 0)
				return -errno;
			int mine = i == 0 ? p[1] : p[0];
			f->child[i] = i == 0 ? p[0] : p[1];
			e->fd[i == 0 ? SLOT_IN : i == 1 ? SLOT_OUT1 : SLOT_OUT2] = mine;
			if ((r = set_nonblock(mine)) < 0)
				return r;
		}
		if ((r = move_high(&f->child[i])) < 0)
			return r;
		c->stdio[i] = f->child[i];
	}
	return 0;
}

/* The command's cgroups; their procs fds go to the child (>= 3). */
static int setup_cgroup(struct exec *e, struct exec_sys *sys, const struct exec_req *req, struct child *c)
{
	int r;

	if ((r = exec_cg_create(sys, &req->limits, &e->cg)) < 0)
		return r;
	for (int i = 0; i < 3; i++) {
		if ((r = move_high(&e->cg.procs_fd[i])) < 0)
			return r;
		c->procs_fd[i] = e->cg.procs_fd[i];
	}
	return 0;
}

/* Identity and the limits that depend on it: rlimits stand in for the
 * cgroup limits the cgroup could not apply. */
static void child_identity(struct child *c, const struct exec_req *req, const struct exec_cg *cg)
{
	c->set_ids = geteuid() == 0 && req->uid != EXEC_ID_KEEP;
	c->uid = (uid_t)req->uid;
	c->gid = (gid_t)(req->gid != EXEC_ID_KEEP ? req->gid : req->uid);
	uint64_t nproc = req->limits.nproc;
	if (!nproc && req->limits.pids_max && !cg->pids_limited && c->set_ids && req->uid != 0)
		nproc = req->limits.pids_max;
	if (nproc) {
		c->nproc_set = true;
		c->nproc.rlim_cur = c->nproc.rlim_max = (rlim_t)nproc;
	}
	if (req->limits.memory_max && !cg->mem_limited) {
		c->as_set = true;
		c->as.rlim_cur = c->as.rlim_max = (rlim_t)req->limits.memory_max;
	}
}

static int open_err_pipe(struct start_fds *f, struct child *c)
{
	int r;

	if (pipe2(f->err, O_CLOEXEC) < 0)
		return -errno;
	if ((r = move_high(&f->err[1])) < 0)
		return r;
	c->err_fd = f->err[1];
	return 0;
}

/* Everything the child needs, opened before fork (all child fds >= 3). */
static int prepare_child(struct exec *e, struct exec_sys *sys, const struct exec_req *req, struct child *c,
			 struct start_fds *f)
{
	int r;

	if ((r = open_cwd(req->root_fd, req->cwd, &f->cwd)) < 0)
		return r;
	if ((r = req->tty ? setup_pty(e, req, c, f) : setup_pipes(e, req, c, f)) < 0)
		return r;
	if ((r = move_high(&f->cwd)) < 0)
		return r;
	c->cwd_fd = f->cwd;
	if ((r = setup_cgroup(e, sys, req, c)) < 0)
		return r;
	child_identity(c, req, &e->cg);
	return open_err_pipe(f, c);
}

/* Parent side right after fork: drop the child's ends, then wait for the
 * error pipe to close (execve) or report a setup failure. */
static int parent_after_fork(struct exec *e, const struct exec_req *req, pid_t pid, struct start_fds *f)
{
	struct child_err ce = {0};
	ssize_t n;

	e->pid = e->res.pid = pid;
	if (!req->tty)
		(void)setpgid(pid, pid); /* the child does it too; whoever is first */
	close_fd(&f->err[1]);
	close_fd(&f->slave);
	for (int i = 0; i < 3; i++)
		close_fd(&f->child[i]);
	close_fd(&f->cwd);
	exec_cg_close_fds(&e->cg);

	do
		n = read(f->err[0], &ce, sizeof(ce));
	while (n < 0 && errno == EINTR);
	close_fd(&f->err[0]);
	if (n == (ssize_t)sizeof(ce) && ce.stage != ST_EXEC)
		return ce.err ? -ce.err : -EIO;
	if (n == (ssize_t)sizeof(ce))
		e->res.exec_errno = ce.err;
	return 0;
}

/* The running child on the loop: its pidfd (or a poll timer), the
 * timeout, the output and stdin fds. */
static int watch_child(struct exec *e, const struct exec_req *req)
{
	long pfd = syscall(SYS_pidfd_open, e->pid, 0);
	int r;

	if (pfd >= 0) {
		e->pidfd = (int)pfd;
		if ((r = loop_add_fd(e->loop, e->pidfd, EPOLLIN, pidfd_cb, e)) < 0)
			return r;
	} else if (errno == ENOSYS) {
		if (!(e->t_wait = loop_add_timer(e->loop, EXEC_WAIT_POLL_MS, wait_poll, e)))
			return -ENOMEM;
	} else {
		return -errno;
	}
	if (req->timeout_ms && !(e->t_timeout = loop_add_timer(e->loop, req->timeout_ms, timeout_fire, e)))
		return -ENOMEM;
	for (int s = 0; s < NSLOT; s++) {
		update_fd(e, s);
		if (e->fd[s] >= 0 && want_events(e, s) != e->reg[s])
			return -ENOMEM;
	}
	return 0;
}

/*
 * fork, straight into the command's v2 cgroup where the kernel can (clone3
 * with CLONE_INTO_CGROUP): the child's own write into cgroup.procs is a
 * migration, which takes the cgroup threadgroup lock for writing and so
 * waits for an RCU grace period, 2-6 ms of every command's start on this
 * project's machine. *joined says whether the child is in it already; the
 * child then skips that write. Without clone3 (before Linux 5.7, or a
 * seccomp filter that refuses it), fork.
 */
static pid_t fork_into(const char *v2, bool *joined)
{
	int fd = v2 ? open(v2, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;

	*joined = false;
	if (fd >= 0) {
		struct exec_clone_args a = {
		    .flags = EXEC_CLONE_INTO_CGROUP, .exit_signal = SIGCHLD, .cgroup = (uint64_t)fd};
		long pid = syscall(SYS_clone3, &a, sizeof(a));
		int e = errno;
		if (pid == 0) {
			*joined = true; /* the child's copy */
			return 0;
		}
		close(fd);
		if (pid > 0) {
			*joined = true;
			return (pid_t)pid;
		}
		if (e != ENOSYS && e != EINVAL && e != E2BIG && e != EPERM && e != EOPNOTSUPP) {
			errno = e;
			return -1;
		}
	}
	return fork();
}

int exec_start(struct loop *loop, struct exec_sys *sys, const struct exec_req *req, const struct exec_ops *ops,
	       void *ud, struct exec **out)
{
	const char *sh_argv[] = {"/bin/sh", "-c", req ? req->shell : NULL, NULL};
	struct start_fds f = {.child = {-1, -1, -1}, .slave = -1, .cwd = -1, .err = {-1, -1}};
	struct exec *e;
	struct child c;
	pid_t pid;
	int r;

	*out = NULL;
	if (!start_req_valid(loop, req, ops))
		return -EINVAL;
	if (!(e = exec_alloc(loop, req, ops, ud)))
		return -ENOMEM;
	child_init(&c, req, sh_argv);
	if ((r = prepare_child(e, sys, req, &c, &f)) < 0)
		goto fail;

	e->start_ms = loop_now_ms();
	bool joined;
	pid = fork_into(e->cg.procs_fd[0] >= 0 ? e->cg.v2 : NULL, &joined);
	if (pid < 0) {
		r = -errno;
		goto fail;
	}
	/* The child: async-signal-safe from here to execve (child_main). */
	if (pid == 0) {
		if (joined)
			c.procs_fd[0] = -1;
		child_main(&c);
	}

	/* From here the child runs: failures kill and reap it (destroy). */
	if ((r = parent_after_fork(e, req, pid, &f)) < 0 || (r = watch_child(e, req)) < 0)
		goto fail;
	*out = e;
	return 0;

fail:
	start_fds_close(&f);
	destroy(e);
	return r;
}

/* ---- teardown ---- */

static void destroy(struct exec *e)
{
	for (int s = 0; s < NSLOT; s++) {
		if (e->reg[s])
			loop_del_fd(e->loop, e->fd[s]);
		e->reg[s] = 0;
		close_fd(&e->fd[s]);
	}
	del_timer(e, &e->t_timeout);
	del_timer(e, &e->t_grace);
	del_timer(e, &e->t_drain);
	del_timer(e, &e->t_sweep);
	del_timer(e, &e->t_wait);
	del_timer(e, &e->t_notify);
	del_timer(e, &e->t_hold);
	if (e->pid > 0 && !e->reaped) {
		signal_tree(e, SIGKILL);
		if (e->pidfd >= 0)
			loop_del_fd(e->loop, e->pidfd);
		while (waitpid(e->pid, NULL, 0) < 0 && errno == EINTR)
			;
		e->reaped = true;
	} else if (exec_cg_tracks(&e->cg) && exec_cg_populated(&e->cg) == 1) {
		(void)exec_cg_signal(&e->cg, SIGKILL);
	}
	close_fd(&e->pidfd);
	exec_cg_destroy(&e->cg);
	buf_clear(&e->in);
	mem_free(e->rbuf);
	mem_free(e);
}

void exec_free(struct exec *e)
{
	if (!e)
		return;
	if (e->in_cb) {
		e->free_pending = true;
		return;
	}
	destroy(e);
}

/* ---- control ---- */

int exec_signal(struct exec *e, int sig)
{
	if (e->finished || e->reaped)
		return -ESRCH;
	pid_t pg = e->pid;
	if (e->tty && e->fd[SLOT_OUT1] >= 0) {
		pid_t fg = tcgetpgrp(e->fd[SLOT_OUT1]);
		if (fg > 0)
			pg = fg;
	}
	return kill(-pg, sig) < 0 ? -errno : 0;
}

int exec_cancel(struct exec *e)
{
	if (e->finished)
		return -ESRCH;
	if (e->exited)
		return 0; /* already over; drain/sweep take care of the rest */
	e->res.canceled = true;
	start_kill(e);
	return 0;
}

void exec_pause_output(struct exec *e, bool pause)
{
	if (e->paused == pause)
		return;
	e->paused = pause;
	update_fd(e, SLOT_OUT1);
	update_fd(e, SLOT_OUT2);
}

ssize_t exec_write_stdin(struct exec *e, const void *data, size_t n)
{
	if (e->in_broken || e->finished)
		return -EPIPE;
	if (e->in_done || e->in_eof || stdin_fd(e) < 0)
		return -EBADF;
	size_t room = e->in.max - buf_len(&e->in);
	if (room == 0) {
		e->in_wanted = true;
		return -EAGAIN;
	}
	size_t take = n < room ? n : room;
	if (take < n)
		e->in_wanted = true;
	if (take && buf_put(&e->in, data, take) < 0) {
		e->in_wanted = true;
		return -EAGAIN; /* ENOMEM growing the buffer: try again later */
	}
	flush_stdin(e);
	return (ssize_t)take;
}

int exec_close_stdin(struct exec *e)
{
	if (e->in_broken)
		return -EPIPE;
	if (e->in_done || e->in_eof)
		return 0;
	if (!e->tty && e->fd[SLOT_IN] < 0)
		return -EBADF;
	e->in_eof = true;
	flush_stdin(e);
	return 0;
}

int exec_resize(struct exec *e, uint16_t rows, uint16_t cols)
{
	struct winsize ws = {.ws_row = rows, .ws_col = cols};

	if (!e->tty)
		return -ENOTTY;
	if (e->fd[SLOT_OUT1] < 0)
		return -ESRCH;
	return ioctl(e->fd[SLOT_OUT1], TIOCSWINSZ, &ws) < 0 ? -errno : 0;
}

pid_t exec_pid(const struct exec *e)
{
	return e->pid;
}

const char *exec_cgroup_path(const struct exec *e)
{
	return e->cg.v2;
}
