/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's loop: its hooks (before_sleep, wake, signals), the guest
 * connection and its reconnect backoff, frames from the guest, and the
 * embedded sandbox with its idle TTL (doc/UP.md, doc/SANDBOX.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/keys.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/transport.h"
#include "airlock/core/wire.h"
#include "airlock/egress/egress_link.h"
#include "airlock/mount/journal.h"
#include "airlock/mount/mount.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/sync/sync.h"
#include "cmd_i.h"
#include "up_i.h"

/* ---- the loop: its hooks, signals, shutdown ---- */

void up_on_journal_notify(void *ud)
{
	struct up *u = ud;
	uint64_t zero = 0;

	atomic_compare_exchange_strong(&u->first_notify_ns, &zero, loop_now_ns());
	loop_wake(u->loop);
}

void up_on_mount_exit(void *ud)
{
	struct up *u = ud;

	atomic_store(&u->mount_gone, true);
	loop_wake(u->loop);
}

static void on_stop_timer(struct loop *l, void *ud)
{
	struct up *u = ud;

	u->conn.stop_timer = 0;
	loop_stop(l);
}

static void begin_shutdown(struct up *u, const char *why)
{
	if (u->stopping)
		return;
	u->stopping = true;
	fprintf(stderr, "airlock: stopping (%s)\n", why);
	/* unmount first: DIR shows the backing directory again, nothing more
	 * is journaled. What was journaled and not yet pushed is found by the
	 * next up's reconcile. */
	mount_stop(u->mount);
	u->mount = NULL;
	if (u->conn.retry_timer) {
		loop_del_timer(u->loop, u->conn.retry_timer);
		u->conn.retry_timer = 0;
	}
	if (u->conn.chan && chan_is_ready(u->conn.chan)) {
		chan_close(u->conn.chan); /* FINAL, then on_close stops the loop */
		u->conn.stop_timer = loop_add_timer(u->loop, CHAN_CLOSE_MS + 500, on_stop_timer, u);
	} else {
		loop_stop(u->loop);
	}
}

void up_drop_conn(struct up *u, int err, const char *why)
{
	snprintf(u->conn.last_error, sizeof(u->conn.last_error), "%s", why ? why : strerror(-err));
	cmd_err("guest %s: %s", u->conn.guest, u->conn.last_error);
	up_mark_dirty(u);
	if (u->conn.chan)
		chan_close(u->conn.chan);
}

static void before_sleep(struct loop *l, void *ud)
{
	struct up *u = ud;
	(void)l;

	if (u->sync.dead) {
		sync_free(u->sync.dead);
		u->sync.dead = NULL;
	}
	if (atomic_load(&u->mount_gone) && !u->stopping)
		begin_shutdown(u, "the mount went away");
	if (u->stopping)
		return;
	/* a change while idle-stopped starts the sandbox again */
	if (u->sandbox.idle_stopped && journal_pending(u->journal) > 0)
		up_touch(u);
	up_sync_pump(u);
	up_exec_kick(u); /* commands and sync_waits whose barrier is now applied */
	up_status_flush(u, up_sync_settled(u));
}

static void on_wake(struct loop *l, void *ud)
{
	(void)l;
	(void)ud; /* the work happens in before_sleep */
}

static void on_signal(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct up *u = ud;
	struct signalfd_siginfo si;
	(void)l;
	(void)events;

	while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGUSR1) { /* sync-wait asks for a fresh status */
			up_status_write(u);
			continue;
		}
		if (!u->stopping)
			u->stop_signal = (int)si.ssi_signo;
		begin_shutdown(u, si.ssi_signo == SIGINT ? "SIGINT" : si.ssi_signo == SIGHUP ? "SIGHUP" : "SIGTERM");
	}
}

int up_loop_init(struct up *u)
{
	struct journal_opts jo = {.notify = up_on_journal_notify, .notify_ud = u};
	sigset_t set;

	/* every thread started from here on (FUSE workers) inherits the
	 * blocked set: the signals arrive only through the signalfd */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if ((u->sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)) < 0 || !(u->loop = loop_new()) ||
	    !(u->journal = journal_new(&jo)) || loop_add_fd(u->loop, u->sigfd, EPOLLIN, on_signal, u) < 0) {
		cmd_err("up: out of memory or descriptors");
		return -1;
	}
	loop_set_before_sleep(u->loop, before_sleep, u);
	loop_set_wake(u->loop, on_wake, u);
	return 0;
}

/* ---- frames from the guest ---- */

typedef void frame_fn(struct up *u, uint32_t stream, struct buf *in);

static void handle_hello_ok(struct up *u, uint32_t stream, struct buf *in)
{
	const char *why = guest_hello_ok_why(in);
	(void)stream;

	if (why)
		up_drop_conn(u, -EPROTO, why);
}

static void handle_error(struct up *u, uint32_t stream, struct buf *in)
{
	struct wire_error m;
	char why[400];

	if (wire_error_decode(in, &m) < 0) {
		up_drop_conn(u, -EPROTO, "guest reported a malformed error");
	} else if (u->sync.engine && stream == sync_stream(u->sync.engine)) {
		sync_on_error(u->sync.engine, m.code, m.msg);
	} else if (stream && up_exec_refused(u, NULL, stream, m.msg)) { /* e.g. an agent without exec */
	} else if (stream && up_changes_refused(u, stream, m.msg)) {	/* a pull: busy, or an agent without it */
	} else {
		snprintf(why, sizeof(why), "guest reported an error: %.200s (%s)", m.msg, strerror((int)m.code));
		up_drop_conn(u, -EPROTO, why);
	}
	wire_error_clear(&m);
}

/* the session's frames; logs name them with wire_type_name */
static frame_fn *const handlers[WIRE_TYPE_MAX + 1] = {
    [WIRE_HELLO_OK] = handle_hello_ok,
    [WIRE_ERROR] = handle_error,
};

static void on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *data, size_t n, void *ud)
{
	struct up *u = ud;
	struct buf in;
	char why[128];
	(void)c;

	switch (wire_group_of(type)) {
	case WIRE_GROUP_SYNC:
		if (u->sync.engine)
			sync_on_frame(u->sync.engine, type, stream, data, n);
		return;
	case WIRE_GROUP_EXEC:
		up_exec_frame(u, NULL, type, stream, data, n);
		return;
	case WIRE_GROUP_CHANGES:
		if (type == WIRE_CHG_ITEM && up_exec_find(u, NULL, stream))
			up_exec_chg_item(u, NULL, stream, data, n);
		else
			up_changes_frame(u, type, stream, data, n);
		return;
	case WIRE_GROUP_PROXY:
		if (egress_link_frame(u->exec.egress, type, stream, data, n) < 0) {
			snprintf(why, sizeof(why), "malformed or unexpected %s (%u) from the guest on stream %u",
				 wire_type_name(type), type, stream);
			up_drop_conn(u, -EPROTO, why);
		}
		return;
	default:
		break;
	}
	if (!handlers[type]) {
		snprintf(why, sizeof(why), "unexpected frame %s (%u) from the guest", wire_type_name(type), type);
		up_drop_conn(u, -EPROTO, why);
		return;
	}
	buf_view(&in, data, n);
	handlers[type](u, stream, &in);
}

static void on_ready(struct chan *c, void *ud)
{
	struct up *u = ud;
	int r;

	up_mark(u, UP_T_READY);

	if ((r = guest_hello_send(c, u->conn.g.sync_pk, "airlock up")) < 0) {
		up_drop_conn(u, r, "sending HELLO failed");
		return;
	}
	if ((r = up_sync_attach(u, c)) < 0) {
		up_drop_conn(u, r, "starting the sync engine failed");
		return;
	}
	egress_link_attach(u->exec.egress, c);
	u->conn.state = UP_RECONCILING;
	up_sync_reconcile(u);
}

static void on_writable(struct chan *c, void *ud)
{
	struct up *u = ud;
	(void)c;

	if (u->sync.engine)
		sync_on_writable(u->sync.engine);
	egress_link_writable(u->exec.egress);
	up_exec_writable(u, NULL);
}

/* ---- the connection: reconnect with backoff ---- */

/* The first reconcile of a connection is done. Going live is news for
 * `airlock status` now, not after the throttle: a status read right after
 * "in sync" must say so. */
void up_conn_live(struct up *u)
{
	u->conn.state = UP_LIVE;
	u->conn.backoff_ms = BACKOFF_MIN_MS;
	u->conn.last_error[0] = '\0';
	up_status_write(u);
	if (u->conn.announced) {
		fprintf(stderr, "airlock: reconnected to %s, guest in sync\n", u->conn.guest);
		return;
	}
	u->conn.announced = true;
	if (u->ready_fd < 0) {
		printf("airlock: relay socket %s\n", u->exec.sock);
		printf("airlock: %s in sync with %s\n", u->dir, u->conn.guest);
		fflush(stdout);
		return;
	}
	/* -d: tell the parent, then only the log (up_log.c) hears from us */
	dprintf(u->ready_fd, "airlock: relay socket %s\n", u->exec.sock);
	dprintf(u->ready_fd, "airlock: %s in sync with %s\n", u->dir, u->conn.guest);
	close(u->ready_fd);
	u->ready_fd = -1;
	up_log_detach();
	fprintf(stderr, "airlock: %s in sync with %s (in the background)\n", u->dir, u->conn.guest);
}

static void on_retry(struct loop *l, void *ud)
{
	struct up *u = ud;
	(void)l;

	u->conn.retry_timer = 0;
	up_connect(u);
}

static void schedule_retry(struct up *u)
{
	if (u->stopping || u->conn.retry_timer)
		return;
	u->conn.retry_timer = loop_add_timer(u->loop, u->conn.backoff_ms, on_retry, u);
	u->conn.backoff_ms = u->conn.backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : u->conn.backoff_ms * 2;
}

static void on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct up *u = ud;
	struct chan_stats st;

	chan_get_stats(c, &st);
	u->conn.bytes_closed += st.bytes_out;
	/* a terminal's ^C reaches the sandbox or agent of a foreground up too,
	 * and its end of the connection may be seen first: take the signal
	 * before calling the connection lost */
	if (!u->stopping && u->sigfd >= 0)
		on_signal(u->loop, u->sigfd, EPOLLIN, u);
	if (err < 0 && !u->stopping && !u->sandbox.idle_stopped) { /* idle-stopped: we ended it */
		snprintf(u->conn.last_error, sizeof(u->conn.last_error), "%s", why ? why : strerror(-err));
		cmd_err("connection to %s lost: %s", u->conn.guest, u->conn.last_error);
	} else if (!u->stopping && !u->sandbox.idle_stopped) {
		fprintf(stderr, "airlock: guest %s closed the session\n", u->conn.guest);
	}
	u->sync.dead = u->sync.engine; /* the engine may be on the stack: free it later */
	u->sync.engine = NULL;
	u->conn.chan = NULL;
	egress_link_detach(u->exec.egress); /* its tunnels use the chan */
	chan_free(c);
	up_changes_conn_lost(u); /* pulls in flight: their commands exit, their requests fail */
	/* with the sandbox, commands not yet sent wait for the reconnect */
	up_exec_fail_some(u, u->sandbox.use && !u->stopping && !u->sandbox.idle_stopped ? 1 : 0, "guest_disconnected",
			  "the connection to the guest was lost (the guest ends the "
			  "commands of a lost session)");
	u->sync.busy = false;
	u->conn.state = UP_DOWN;
	u->conn.reconnects++;
	up_mark_dirty(u);
	up_status_write(u);
	if (u->stopping) {
		loop_stop(u->loop);
		return;
	}
	if (u->sandbox.idle_stopped) { /* the idle TTL closed it: stop the sandbox, no retry */
		sandbox_stop(u->sandbox.sb);
		u->sandbox.sb = NULL;
		up_status_write(u);
		return;
	}
	schedule_retry(u);
}

static const struct chan_ops up_chan_ops = {
    .on_ready = on_ready,
    .on_frame = on_frame,
    .on_writable = on_writable,
    .on_close = on_close,
};

void up_connect(struct up *u)
{
	char err[512];
	int fd;

	if (u->stopping || u->sandbox.idle_stopped)
		return;
	if (u->sandbox.use && (!u->sandbox.sb || !sandbox_alive(u->sandbox.sb))) {
		if (u->sandbox.sb)
			fprintf(stderr, "airlock: the sandbox's agent is gone; starting it again\n");
		sandbox_stop(u->sandbox.sb);
		u->sandbox.sb = NULL;
		if (up_sandbox_begin(u, err, sizeof(err)) < 0) {
			if (strcmp(u->conn.last_error, err)) {
				snprintf(u->conn.last_error, sizeof(u->conn.last_error), "%s", err);
				cmd_err("%s (retrying)", err);
			}
			up_exec_fail_some(u, 2, "guest_disconnected", u->conn.last_error);
			up_mark_dirty(u);
			schedule_retry(u);
			return;
		}
	}
	up_mark(u, UP_T_CONNECT);
	if ((fd = transport_connect(&u->conn.g.addr, CONNECT_MS, err, sizeof(err))) < 0) {
		if (strcmp(u->conn.last_error, err)) {
			snprintf(u->conn.last_error, sizeof(u->conn.last_error), "%s", err);
			cmd_err("%s (retrying)", err);
		}
		up_exec_fail_some(u, 2, "guest_disconnected", u->conn.last_error); /* queued for this attempt */
		up_mark_dirty(u);
		schedule_retry(u);
		return;
	}
	struct chan_cfg cfg = guest_opts_chan_cfg(&u->conn.g);
	if (!(u->conn.chan = chan_new(u->loop, fd, &cfg, &up_chan_ops, u))) {
		snprintf(u->conn.last_error, sizeof(u->conn.last_error), "out of memory");
		schedule_retry(u);
		return;
	}
	u->conn.state = UP_HANDSHAKE;
	up_mark_dirty(u);
}

/* ---- the embedded sandbox: start, idle stop, wake (doc/SANDBOX.md) ---- */

int up_sandbox_begin(struct up *u, char *err, size_t errlen)
{
	int r;

	up_fork_reap(u, true); /* a fork's halt of the last one: its cgroup and lock */
	if ((r = sandbox_start(&u->sandbox.cfg, &u->sandbox.sb, err, errlen)) < 0)
		return r;
	if ((r = transport_parse(sandbox_address(u->sandbox.sb), &u->conn.g.addr, err, errlen)) < 0) {
		sandbox_stop(u->sandbox.sb);
		u->sandbox.sb = NULL;
		return r;
	}
	u->conn.g.key = *sandbox_host_key(u->sandbox.sb);
	memcpy(u->conn.g.guest_pub, sandbox_guest_pub(u->sandbox.sb), sizeof(u->conn.g.guest_pub));
	if ((r = keys_signing_key(&u->conn.g.key, u->conn.g.sync_sk, u->conn.g.sync_pk)) < 0) {
		errmsg_set(err, errlen, "deriving the sync key failed");
		sandbox_stop(u->sandbox.sb);
		u->sandbox.sb = NULL;
		return r;
	}
	snprintf(u->sandbox.describe, sizeof(u->sandbox.describe), "%s", sandbox_describe(u->sandbox.sb));
	snprintf(u->sandbox.dir, sizeof(u->sandbox.dir), "%s", sandbox_dir(u->sandbox.sb));
	snprintf(u->sandbox.boot, sizeof(u->sandbox.boot), "%s", sandbox_boot(u->sandbox.sb));
	fprintf(stderr, "airlock: sandbox started in %.1f ms, %s (%s); state in %s\n", sandbox_start_ms(u->sandbox.sb),
		u->sandbox.boot, sandbox_describe(u->sandbox.sb), sandbox_dir(u->sandbox.sb));
	return 0;
}

void up_touch(struct up *u)
{
	u->sandbox.last_active_ms = loop_now_ms();
	if (!u->sandbox.idle_stopped || u->stopping)
		return;
	u->sandbox.idle_stopped = false;
	u->conn.backoff_ms = BACKOFF_MIN_MS;
	fprintf(stderr, "airlock: activity: starting the sandbox again\n");
	if (u->conn.chan) /* the idle close is still under way: its on_close reconnects */
		return;
	if (u->conn.retry_timer) {
		loop_del_timer(u->loop, u->conn.retry_timer);
		u->conn.retry_timer = 0;
	}
	up_connect(u); /* starts the sandbox, connects; reconcile follows */
	up_mark_dirty(u);
}

static bool up_idle(const struct up *u)
{
	return u->conn.state == UP_LIVE && !u->sync.busy && !u->exec.xcmds && !u->exec.syncws && !u->sync.pending.n &&
	       !u->sync.pending_full && journal_pending(u->journal) == 0;
}

static void on_idle_timer(struct loop *l, void *ud)
{
	struct up *u = ud;
	uint64_t ttl_ms = (uint64_t)u->sandbox.ttl_s * 1000u, tick = ttl_ms / 4 < 1000 ? ttl_ms / 4 : 1000;

	u->sandbox.idle_timer = loop_add_timer(l, tick ? tick : 1, on_idle_timer, u);
	if (u->stopping || u->sandbox.idle_stopped || !u->sandbox.sb)
		return;
	if (!up_idle(u)) {
		if (u->exec.xcmds || u->sync.busy) /* a running command or sync is activity */
			u->sandbox.last_active_ms = loop_now_ms();
		return;
	}
	if (loop_now_ms() - u->sandbox.last_active_ms < ttl_ms)
		return;
	fprintf(stderr,
		"airlock: idle for %lld s (workspace.ttl_seconds): stopping the "
		"sandbox\n",
		(long long)u->sandbox.ttl_s);
	u->sandbox.idle_stopped = true;
	up_mark_dirty(u);
	if (u->conn.chan) {
		chan_close(u->conn.chan); /* on_close stops the sandbox */
	} else {
		sandbox_stop(u->sandbox.sb);
		u->sandbox.sb = NULL;
	}
}

void up_sandbox_arm_idle(struct up *u)
{
	if (u->sandbox.use && u->sandbox.ttl_s > 0)
		u->sandbox.idle_timer = loop_add_timer(u->loop, 1000, on_idle_timer, u);
}
