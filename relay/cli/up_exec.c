/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The relay backend of airlock up (relay_backend_ops over the channel):
 * commands to the guest on exec streams, sync_wait waiters, and which
 * command an egress connection belongs to (doc/UP.md "Exec").
 *
 * Each command gets its own host-opened stream. EXEC_START goes out only
 * once every batch covering the journal's barrier seq taken when the
 * request arrived is in the channel (up_sync_sent_seq; doc/UP.md "Exec"):
 * the guest applies them before it reads the command, so a command never
 * sees a file older than the request. sync_wait waits for applied_seq. Output credit is returned as the relay takes the
 * bytes, and held back while the relay pauses the command, so a slow
 * client stalls that command in the guest and nothing else. Nothing ever
 * runs on the host: without a guest the request fails.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/egress/egress_link.h"
#include "airlock/host/route.h"
#include "airlock/mount/journal.h"
#include "airlock/policy/policy.h"
#include "airlock/server/relay.h"
#include "airlock/sync/sync.h"
#include "cmd_i.h"
#include "up_i.h"

/* The channel x runs on: its fork's, or the sandbox's. */
static struct chan *xchan(const struct up *u, const struct xcmd *x)
{
	return x->fork ? x->fork->chan : u->conn.chan;
}

static void xcmd_free(struct up *u, struct xcmd *x)
{
	for (struct xcmd **pp = &u->exec.xcmds; *pp; pp = &(*pp)->next) {
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	}
	if (x->stream && xchan(u, x))
		chan_stream_close(xchan(u, x), x->stream);
	if (x->feeding)
		close(x->feed_fd);
	buf_clear(&x->start);
	for (size_t i = 0; i < x->nrep; i++)
		mem_free(x->rep[i]);
	mem_free(x->rep);
	free(x->by_argv);
	mem_free(x);
}

/* The scan restarts after each one: the relay's callbacks may change the
 * list. */
void up_exec_fail_some(struct up *u, int which, const char *code, const char *msg)
{
	struct xcmd *x = u->exec.xcmds;

	while (x) {
		struct relay_cmd *cmd = x->cmd;
		if (x->fork || (which == 1 && !x->stream) || (which == 2 && x->stream)) { /* forks: up_fork.c */
			x = x->next;
			continue;
		}
		x->stream = 0; /* the chan is gone or going */
		xcmd_free(u, x);
		if (cmd)
			relay_cmd_error(cmd, code, msg);
		x = u->exec.xcmds;
	}
}

static bool guest_usable(const struct up *u)
{
	return u->conn.chan && !u->stopping && (u->conn.state == UP_LIVE || u->conn.state == UP_RECONCILING);
}

/* The next pieces of x's stdin file, as far as its stdin window (the
 * guest's STDIN_ACKs) and the channel take them; EOF with the last. A
 * file that cannot be read ends the stdin early: the command sees its
 * input cut short and fails on its own. */
static void feed_pump(struct up *u, struct xcmd *x)
{
	struct chan *c = xchan(u, x);
	uint8_t data[WIRE_PAYLOAD_MAX - 1];
	struct buf b;

	buf_init(&b, WIRE_PAYLOAD_MAX);
	while (x->feeding && x->stream && c) {
		uint64_t left = x->feed_size - x->feed_off;
		size_t room = WIRE_EXEC_STDIN_WINDOW - x->stdin_inflight;
		size_t k = left < room ? (size_t)left : room;
		if (k > sizeof(data))
			k = sizeof(data);
		if (!k && left)
			break; /* the next STDIN_ACK */
		ssize_t got = k ? pread(x->feed_fd, data, k, (off_t)x->feed_off) : 0;
		if (got < 0 || (size_t)got < k) {
			k = 0;
			left = 0;
		}
		struct wire_exec_stdin m = {.eof = k == left, .data = data, .len = k};
		buf_reset(&b);
		int r = wire_exec_stdin_encode(&b, &m);
		if (r == 0 && (r = chan_send(c, WIRE_EXEC_STDIN, x->stream, buf_ptr(&b), buf_len(&b))) == -EAGAIN)
			break; /* on_writable: up_exec_writable */
		if (r == 0) {
			x->stdin_inflight += k;
			x->feed_off += k;
		}
		if (r < 0 || m.eof) {
			close(x->feed_fd);
			x->feeding = false;
		}
	}
	buf_clear(&b);
}

int up_exec_stdin_feed(struct up *u, struct relay_cmd *cmd, int fd, uint64_t size)
{
	struct xcmd *x = cmd ? relay_cmd_data(cmd) : NULL;

	if (!x)
		return -ENOENT;
	if (x->fed)
		return -EBUSY;
	if ((x->feed_fd = fcntl(fd, F_DUPFD_CLOEXEC, 0)) < 0)
		return -errno;
	x->fed = x->feeding = true;
	x->feed_off = 0;
	x->feed_size = size;
	feed_pump(u, x);
	return 0;
}

void up_exec_writable(struct up *u, const struct up_fork *f)
{
	for (struct xcmd *x = u->exec.xcmds; x; x = x->next)
		if (x->feeding && x->fork == f)
			feed_pump(u, x);
}

void up_exec_kick(struct up *u)
{
	struct xcmd *x, *next;

	/* live: a reconnect's (or a restarted daemon's) reconcile is done,
	 * which the barrier alone does not say */
	for (struct syncw **pp = &u->exec.syncws; *pp;) {
		struct syncw *w = *pp;
		if (u->conn.state == UP_LIVE && u->sync.applied_seq >= w->barrier) {
			*pp = w->next;
			relay_sync_done(u->exec.relay, w->token);
			mem_free(w);
		} else {
			pp = &w->next;
		}
	}
	/* a command goes once the batches before it are in the channel (the
	 * guest applies them before it reads the command), or, with
	 * execution.barrier "fail", once the guest acknowledged them: only
	 * the acknowledgement says which paths failed */
	uint64_t sent =
	    policy_execution(u->pol.policy)->barrier == POLICY_BARRIER_FAIL ? u->sync.applied_seq : up_sync_sent_seq(u);
	for (x = u->exec.xcmds; x; x = next) {
		struct chan *c = xchan(u, x);
		int r;
		next = x->next;
		/* a fork has no sync: its commands wait only for its handshake */
		if (x->stream || (x->fork ? !x->fork->ready : u->conn.state != UP_LIVE || sent < x->barrier) || !c)
			continue;
		/* a fork has no sync, so no paths it could be missing */
		char refusal[1200];
		if (!x->fork && !x->gated && !(x->gated = true, up_paths_gate(u, x->cmd, refusal, sizeof(refusal)))) {
			struct relay_cmd *cmd = x->cmd;
			xcmd_free(u, x);
			relay_cmd_error(cmd, "not_in_guest", refusal);
			continue;
		}
		if (!(x->stream = chan_stream_open(c, 0))) {
			struct relay_cmd *cmd = x->cmd;
			xcmd_free(u, x);
			relay_cmd_error(cmd, "busy", "too many streams to the guest");
			continue;
		}
		r = chan_send(c, WIRE_EXEC_START, x->stream, buf_ptr(&x->start), buf_len(&x->start));
		if (r == -EAGAIN) { /* no room now: before_sleep tries again */
			chan_stream_close(c, x->stream);
			x->stream = 0;
			continue;
		}
		if (r < 0) {
			struct relay_cmd *cmd = x->cmd;
			char msg[128];
			snprintf(msg, sizeof(msg), "sending the command to the guest failed: %s", strerror(-r));
			xcmd_free(u, x);
			relay_cmd_error(cmd, "backend_error", msg);
			continue;
		}
		buf_clear(&x->start);
		feed_pump(u, x);
		if (u->sync.trace)
			fprintf(stderr, "airlock: trace: exec barrier_us=%.1f\n",
				(double)(loop_now_ns() - x->t_req_ns) / 1e3);
	}
}

bool up_exec_barrier_waiting(const struct up *u)
{
	if (u->exec.syncws)
		return true;
	for (const struct xcmd *x = u->exec.xcmds; x; x = x->next)
		if (!x->stream && !x->fork)
			return true;
	return false;
}

/* argv as a JSON array (malloc'd by jansson), for who made a guest change. */
static char *argv_json(const char *const *argv, size_t argc)
{
	json_t *a = json_array();
	char *s;

	for (size_t i = 0; a && i < argc; i++)
		json_array_append_new(a, json_string(argv[i]));
	s = a ? json_dumps(a, JSON_COMPACT) : NULL;
	json_decref(a);
	return s;
}

static int be_exec_start(void *ud, struct relay_cmd *cmd, const struct relay_exec_req *req)
{
	struct up *u = ud;
	struct xcmd *x;
	struct up_fork *f = NULL;
	uint8_t flags = (uint8_t)((req->tty ? WIRE_EXEC_F_TTY : 0) | (req->stdin_open ? WIRE_EXEC_F_STDIN : 0) |
				  (u->exec.egress ? WIRE_EXEC_F_PROXY : 0) | (req->nforwarded ? WIRE_EXEC_F_FWD : 0));
	int r;

	if (req->fork && !(f = up_fork_for_exec(u, req->fork, cmd)))
		return 0; /* the error was sent */
	if (f)
		goto queue;
	up_touch(u);
	/* with the embedded sandbox a command waits for a (re)connection in
	 * progress or scheduled, e.g. after an idle stop; it fails if that
	 * connection attempt does */
	if (!guest_usable(u) && !(u->sandbox.use && (u->conn.chan || u->conn.retry_timer) && !u->stopping)) {
		relay_cmd_error(cmd, "guest_disconnected",
				"the guest is not connected (see airlock status); nothing was run");
		return 0;
	}
queue:
	if (!(x = mem_calloc(1, sizeof(*x))))
		return -ENOMEM;
	x->u = u;
	x->fork = f;
	x->cmd = cmd;
	egress_link_describe(relay_cmd_name(cmd), req->argv, req->argc, x->desc, sizeof(x->desc));
	x->by_argv = argv_json(req->argv, req->argc);
	buf_init(&x->start, WIRE_PAYLOAD_MAX);
	if (req->argc > WIRE_EXEC_ARGS_MAX || req->nenv > WIRE_EXEC_ARGS_MAX || req->nforwarded > WIRE_EXEC_ARGS_MAX) {
		r = -E2BIG;
		goto fail;
	}
	/* the encoder only reads the strings (the struct's char ** is the
	 * decoder's, which owns what it returns) */
	struct wire_exec_start m = {
	    .flags = flags,
	    .timeout_ms = req->timeout_ms,
	    .rows = req->rows,
	    .cols = req->cols,
	    .cwd = (char *)req->cwd,
	    .argc = (uint32_t)req->argc,
	    .argv = (char **)req->argv,
	    .nenv = (uint32_t)req->nenv,
	    .env = (char **)req->env,
	    .nfwd = (uint32_t)req->nforwarded,
	    .fwd = (char **)req->forwarded,
	};
	if ((r = wire_exec_start_encode(&x->start, &m)) < 0) /* credentials: wiped with x->start */
		goto fail;
	x->barrier = f ? 0 : journal_barrier_seq(u->journal);
	x->t_req_ns = loop_now_ns();
	x->next = u->exec.xcmds;
	u->exec.xcmds = x;
	relay_cmd_set_data(cmd, x);
	up_exec_kick(u);
	return 0;
fail:
	buf_clear(&x->start);
	mem_free(x);
	return r == -ENOBUFS ? -E2BIG : r; /* argv + env must fit one frame (64 KiB) */
}

static int be_stdin_write(void *ud, struct relay_cmd *cmd, const void *data, size_t n, bool eof)
{
	struct up *u = ud;
	struct xcmd *x = relay_cmd_data(cmd);
	const uint8_t *p = data;
	size_t nframes = n / (WIRE_PAYLOAD_MAX - 1) + 1;
	struct buf b;
	int r = 0;

	if (!x || !xchan(u, x))
		return -ENOTCONN;
	if (x->fed)
		return -EAGAIN; /* its stdin is the daemon's file */
	if (!x->stream || x->stdin_inflight + n > WIRE_EXEC_STDIN_WINDOW ||
	    chan_send_space(xchan(u, x), x->stream) < n + nframes)
		return -EAGAIN;
	buf_init(&b, WIRE_PAYLOAD_MAX);
	do {
		size_t k = n > WIRE_PAYLOAD_MAX - 1 ? WIRE_PAYLOAD_MAX - 1 : n;
		struct wire_exec_stdin m = {.eof = eof && k == n, .data = p, .len = k};

		buf_reset(&b);
		if ((r = wire_exec_stdin_encode(&b, &m)) < 0 ||
		    (r = chan_send(xchan(u, x), WIRE_EXEC_STDIN, x->stream, buf_ptr(&b), buf_len(&b))) < 0)
			break;
		x->stdin_inflight += k;
		p += k;
		n -= k;
	} while (n > 0);
	buf_clear(&b);
	return r;
}

static int be_send_small(struct up *u, struct relay_cmd *cmd, uint8_t type, const void *p, size_t n)
{
	struct xcmd *x = relay_cmd_data(cmd);

	if (!x || !xchan(u, x))
		return -ENOTCONN;
	if (!x->stream)
		return -EAGAIN; /* still waiting for its barrier */
	return chan_send(xchan(u, x), type, x->stream, p, n);
}

/* Encode a small fixed-size payload with its wire_* encoder, then send it. */
static int be_send_encoded(struct up *u, struct relay_cmd *cmd, uint8_t type, int r, struct buf *b)
{
	if (r == 0)
		r = be_send_small(u, cmd, type, buf_ptr(b), buf_len(b));
	buf_clear(b);
	return r;
}

static int be_signal(void *ud, struct relay_cmd *cmd, int signo)
{
	struct wire_exec_signal m = {.signo = (uint32_t)signo};
	struct buf b;

	if (signo < 1 || signo > 64)
		return -EINVAL;
	buf_init(&b, 16);
	return be_send_encoded(ud, cmd, WIRE_EXEC_SIGNAL, wire_exec_signal_encode(&b, &m), &b);
}

static int be_resize(void *ud, struct relay_cmd *cmd, uint16_t rows, uint16_t cols)
{
	struct wire_exec_resize m = {.rows = rows, .cols = cols};
	struct buf b;

	buf_init(&b, 16);
	return be_send_encoded(ud, cmd, WIRE_EXEC_RESIZE, wire_exec_resize_encode(&b, &m), &b);
}

static int be_cancel(void *ud, struct relay_cmd *cmd)
{
	struct up *u = ud;
	struct xcmd *x = relay_cmd_data(cmd);

	if (x && !x->stream) { /* never reached the guest */
		xcmd_free(u, x);
		relay_cmd_error(cmd, "canceled", "canceled before it started in the guest");
		return 0;
	}
	return be_send_small(u, cmd, WIRE_EXEC_CANCEL, NULL, 0);
}

static void be_pause(void *ud, struct relay_cmd *cmd, bool paused)
{
	struct up *u = ud;
	struct xcmd *x = relay_cmd_data(cmd);

	if (!x)
		return;
	x->paused = paused;
	if (!paused && x->owed && x->stream && xchan(u, x)) {
		chan_consume(xchan(u, x), x->stream, x->owed);
		x->owed = 0;
	}
}

static int be_sync_wait(void *ud, uint64_t token)
{
	struct up *u = ud;
	struct syncw *w;

	up_touch(u);
	if (!(w = mem_calloc(1, sizeof(*w))))
		return -ENOMEM;
	w->token = token;
	w->barrier = journal_barrier_seq(u->journal);
	w->next = u->exec.syncws;
	u->exec.syncws = w;
	up_exec_kick(u);
	return 0;
}

static void be_release(void *ud, struct relay_cmd *cmd)
{
	struct up *u = ud;
	struct xcmd *x = relay_cmd_data(cmd);

	if (!x)
		return;
	if (x->stream && xchan(u, x))
		chan_send(xchan(u, x), WIRE_EXEC_CANCEL, x->stream, NULL,
			  0); /* the guest also kills it when the session ends */
	xcmd_free(u, x);
}

bool up_guest_ready(void *ud)
{
	return guest_usable(ud);
}

const struct relay_backend_ops up_backend_ops = {
    .exec_start = be_exec_start,
    .stdin_write = be_stdin_write,
    .signal = be_signal,
    .resize = be_resize,
    .cancel = be_cancel,
    .pause = be_pause,
    .sync_wait = be_sync_wait,
    .release = be_release,
};

struct xcmd *up_exec_find(struct up *u, const struct up_fork *f, uint32_t stream)
{
	for (struct xcmd *x = u->exec.xcmds; x; x = x->next)
		if (x->stream && x->stream == stream && x->fork == f)
			return x;
	return NULL;
}

/* egress_link: which command a proxy connection belongs to */
static struct relay_cmd *link_find_cmd(void *ud, uint32_t exec_stream, const char **desc)
{
	struct xcmd *x = up_exec_find(ud, NULL, exec_stream);

	if (!x)
		return NULL;
	*desc = x->desc;
	return x->cmd;
}

static void link_changed(void *ud)
{
	up_mark_dirty(ud); /* egress figures in the status file */
}

const struct egress_link_ops up_link_ops = {
    .find_cmd = link_find_cmd,
    .on_change = link_changed,
};

void up_exec_chg_item(struct up *u, struct up_fork *f, uint32_t stream, const uint8_t *data, size_t n)
{
	struct xcmd *x = up_exec_find(u, f, stream);
	struct chan *c = f ? f->chan : u->conn.chan;

	if (c)
		chan_consume(c, stream, n); /* every frame on the stream counts against its window */
	if (x && !f)
		up_changes_item(u, x, data, n);
	else if (x) /* a fork's changes stay in the fork: kept for try (a vm fork's, up_fork.c) */
		up_fork_chg_item(f, data, n);
}

void up_exec_frame(struct up *u, struct up_fork *f, uint8_t type, uint32_t stream, const uint8_t *data, size_t n)
{
	struct xcmd *x = up_exec_find(u, f, stream);
	struct chan *c = f ? f->chan : u->conn.chan;
	struct relay_cmd *cmd;
	struct buf in;
	char why[160];

	if (!x) { /* released meanwhile: return the credit, forget the stream at its
		     end */
		if (c && (type == WIRE_EXEC_STDOUT || type == WIRE_EXEC_STDERR))
			chan_consume(c, stream, n);
		if (c && (type == WIRE_EXEC_EXIT || type == WIRE_EXEC_ERROR))
			chan_stream_close(c, stream);
		return;
	}
	cmd = x->cmd;
	buf_view(&in, data, n);
	switch (type) {
	case WIRE_EXEC_STARTED: {
		struct wire_exec_started m;
		if (wire_exec_started_decode(&in, &m) < 0)
			goto bad;
		relay_cmd_started(cmd, (int64_t)m.pid);
		chan_consume(c, stream, n); /* every frame on the stream counts against its window */
		return;
	}
	case WIRE_EXEC_STDOUT:
	case WIRE_EXEC_STDERR:
		relay_cmd_output(cmd, type == WIRE_EXEC_STDOUT ? RELAY_STDOUT : RELAY_STDERR, data, n);
		if (x->paused)
			x->owed += n;
		else
			chan_consume(c, stream, n);
		return;
	case WIRE_EXEC_STDIN_ACK: {
		struct wire_exec_stdin_ack m;
		if (wire_exec_stdin_ack_decode(&in, &m) < 0 || m.bytes > x->stdin_inflight)
			goto bad;
		x->stdin_inflight -= m.bytes;
		chan_consume(c, stream, n);
		feed_pump(u, x);
		return;
	}
	case WIRE_EXEC_EXIT: {
		struct wire_exec_exit m;
		if (wire_exec_exit_decode(&in, &m) < 0) /* code <= 255, signal <= 64 */
			goto bad;
		struct relay_exit ex = {
		    .code = m.signo ? -1 : (int)m.code,
		    .signal = (int)m.signo,
		    .timed_out = m.flags & WIRE_EXEC_X_TIMED_OUT,
		    .duration_ms = m.duration_ms,
		};
		/* its changes first: in auto mode on the host before the exit,
		 * which may then come later, when x is gone (the relay's calls
		 * for cmd meanwhile find no x: the command has ended) */
		relay_cmd_set_data(cmd, NULL);
		if (f)
			relay_cmd_exit(cmd, &ex);
		else
			up_changes_exit(u, x, cmd, &ex);
		xcmd_free(u, x);
		up_paths_kick(u);
		return;
	}
	case WIRE_EXEC_ERROR: {
		struct wire_error m;
		if (wire_error_decode(&in, &m) < 0)
			goto bad;
		uint32_t err = m.code;
		xcmd_free(u, x);
		relay_cmd_error(
		    cmd, err == EXDEV || err == ENOENT || err == ENOTDIR || err == EACCES ? "bad_cwd" : "spawn_failed",
		    m.msg);
		wire_error_clear(&m);
		return;
	}
	default:
		break;
	}
bad:
	snprintf(why, sizeof(why), "malformed %s (%u) from the guest on stream %u", wire_type_name(type), type, stream);
	if (f)
		up_fork_drop(f, why);
	else
		up_drop_conn(u, -EPROTO, why);
}

bool up_exec_refused(struct up *u, struct up_fork *f, uint32_t stream, const char *msg)
{
	struct xcmd *x = up_exec_find(u, f, stream);
	struct relay_cmd *cmd;
	char why[400];

	if (!x)
		return false;
	cmd = x->cmd;
	snprintf(why, sizeof(why), "the guest refused the command: %.200s", msg);
	xcmd_free(u, x);
	relay_cmd_error(cmd, "backend_error", why);
	return true;
}

void up_exec_fail_fork(struct up *u, const struct up_fork *f, const char *code, const char *msg)
{
	struct xcmd *x = u->exec.xcmds;

	while (x) {
		struct relay_cmd *cmd = x->cmd;
		if (x->fork != f) {
			x = x->next;
			continue;
		}
		xcmd_free(u, x);
		if (cmd)
			relay_cmd_error(cmd, code, msg);
		x = u->exec.xcmds;
	}
}

bool up_exec_parent_busy(const struct up *u)
{
	for (const struct xcmd *x = u->exec.xcmds; x; x = x->next)
		if (!x->fork)
			return true;
	return u->exec.syncws != NULL;
}

void up_exec_clear(struct up *u)
{
	while (u->exec.xcmds) /* relay_free released them all; nothing of the relay may be used now */
		xcmd_free(u, u->exec.xcmds);
	while (u->exec.syncws) {
		struct syncw *w = u->exec.syncws;
		u->exec.syncws = w->next;
		mem_free(w);
	}
}
