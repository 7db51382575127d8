/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock up DIR: mount the passthrough filesystem over DIR, reconcile with
 * the guest, then push every journaled change live; reconnect with backoff
 * when the guest goes away. Also `down`, `status` and `sync-wait`, which
 * find the daemon through its state directory (audit_dir): see doc/UP.md.
 *
 * Threads: the loop thread owns everything below except first_notify_ns and
 * mount_gone, which FUSE threads set (atomics). FUSE threads only append to
 * the journal and loop_wake(); the loop never waits for FUSE except inside
 * mount_stop() at shutdown.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <limits.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/keys.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/transport.h"
#include "airlock/core/wire.h"
#include "airlock/egress/egress_link.h"
#include "airlock/host/route.h"
#include "airlock/mount/journal.h"
#include "airlock/mount/mount.h"
#include "airlock/policy/policy.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/server/relay.h"
#include "airlock/sync/audit.h"
#include "airlock/sync/sync.h"
#include "cmd_i.h"

#define UP_PID_FILE    "up.pid"	     /* pid, flock'ed by the daemon while it runs */
#define UP_STATUS_FILE "status.json" /* written by the daemon, read by status/sync-wait */
#define UP_LOG_FILE    "up.log"	     /* the daemon's stderr after -d */
#define STATUS_MIN_MS  100u	     /* status file rewritten at most this often */
#define BACKOFF_MIN_MS 100u
#define BACKOFF_MAX_MS 5000u
#define CONNECT_MS     2000    /* one connect attempt (blocks the loop: see doc/UP.md) */
#define LAT_WINDOW     1000u   /* pushes kept for the latency percentiles */
#define PENDING_MAX    100000u /* more distinct dirty paths than this: full reconcile */
#define DRAIN_BATCH    256u
#define DOWN_WAIT_MS   10000u
#define POLICY_NOTE    "policy is read once at start: edits to it apply after restart"

/* ---- a set of dirty paths (open addressing, owned strings) ---- */

struct pathset {
	char **slot;		/* cap entries, NULL = empty */
	struct sync_hint *hint; /* what the journal said about slot[i]'s content */
	size_t cap, n;
};

static uint64_t path_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

static int pathset_grow(struct pathset *ps)
{
	size_t ncap = ps->cap ? ps->cap * 2 : 256;
	char **ns = mem_calloc(ncap, sizeof(*ns));
	struct sync_hint *nh = mem_calloc(ncap, sizeof(*nh));

	if (!ns || !nh) {
		mem_free(ns);
		mem_free(nh);
		return -ENOMEM;
	}
	for (size_t i = 0; i < ps->cap; i++) {
		if (!ps->slot[i])
			continue;
		size_t j = path_hash(ps->slot[i]) & (ncap - 1);
		while (ns[j])
			j = (j + 1) & (ncap - 1);
		ns[j] = ps->slot[i];
		nh[j] = ps->hint[i];
	}
	mem_free(ps->slot);
	mem_free(ps->hint);
	ps->slot = ns;
	ps->hint = nh;
	ps->cap = ncap;
	return 0;
}

/* The path's hint (added with an empty valid one when new), or NULL
 * without memory. */
static struct sync_hint *pathset_add(struct pathset *ps, const char *path)
{
	if ((ps->n + 1) * 2 > ps->cap && pathset_grow(ps) < 0)
		return NULL;
	size_t j = path_hash(path) & (ps->cap - 1);
	for (; ps->slot[j]; j = (j + 1) & (ps->cap - 1))
		if (!strcmp(ps->slot[j], path))
			return &ps->hint[j];
	if (!(ps->slot[j] = mem_strdup(path)))
		return NULL;
	ps->hint[j] = (struct sync_hint){.lo = UINT64_MAX, .hi = 0, .valid = true};
	ps->n++;
	return &ps->hint[j];
}

/* Fold one journal record into the hint of its path: writes and truncates
 * narrow what changed; anything that can change what the path names
 * (create, rename, link, unlink, rescan) makes the hint useless. */
static void hint_note(struct sync_hint *h, const struct journal_rec *r)
{
	switch (r->op) {
	case JOURNAL_WRITE:
		if (r->flags & JOURNAL_F_WHOLE) {
			h->valid = false;
			break;
		}
		for (uint32_t i = 0; i < r->nranges; i++) {
			uint64_t end = r->ranges[i].off + r->ranges[i].len;
			if (r->ranges[i].off < h->lo)
				h->lo = r->ranges[i].off;
			if (end > h->hi)
				h->hi = end;
		}
		break;
	case JOURNAL_TRUNCATE:
		if (r->size < h->lo)
			h->lo = r->size;
		h->resized = true;
		break;
	case JOURNAL_SETATTR:
	case JOURNAL_XATTR:
		break;
	default:
		h->valid = false;
	}
}

static void pathset_clear(struct pathset *ps)
{
	for (size_t i = 0; i < ps->cap; i++)
		mem_free(ps->slot[i]);
	mem_free(ps->slot);
	mem_free(ps->hint);
	*ps = (struct pathset){0};
}

/* ---- the daemon ---- */

/* One command forwarded to the guest on its own stream (doc/UP.md "Exec"). */
struct xcmd {
	struct up *u;
	struct relay_cmd *cmd;
	struct xcmd *next;
	struct buf start; /* EXEC_START payload, until sent */
	uint64_t barrier; /* journal seq the guest must have applied first */
	uint32_t stream;  /* 0 until EXEC_START went out */
	bool paused;	  /* the relay holds output back: credit is owed, not returned */
	size_t owed;
	size_t stdin_inflight;		 /* stdin bytes sent, not yet acknowledged
					    (WIRE_EXEC_STDIN_WINDOW) */
	char desc[EGRESS_LINK_DESC_MAX]; /* "id argv..." for egress denial records */
};

/* A sync_wait waiting for its barrier. */
struct syncw {
	uint64_t token, barrier;
	struct syncw *next;
};

enum up_state { UP_DOWN, UP_HANDSHAKE, UP_RECONCILING, UP_LIVE };
static const char *const state_names[] = {"disconnected", "connecting", "reconciling", "live"};

struct up {
	struct loop *loop;
	struct journal *journal;
	struct mount *mount;
	struct chan *chan;
	struct sync *sync, *dead_sync; /* dead_sync: freed in before_sleep, off the engine's stack */
	struct policy *policy;
	struct noise_keypair key;
	uint8_t sync_sk[64], sync_pk[32], guest_pub[32], psk[32];
	bool have_psk;
	struct transport_addr addr;
	const char *guest;
	char dir[PATH_MAX];	  /* realpath of DIR */
	char state_dir[PATH_MAX]; /* audit_dir(DIR) */
	int dirfd, sigfd, lockfd, ready_fd;

	enum up_state state;
	bool busy, op_full;	    /* a sync operation runs; it is a reconcile */
	uint64_t op_upto, op_t0_ns; /* journal seq it covers; first notify of its changes */
	size_t op_npaths;
	bool announced; /* the "in sync" line was printed */
	uint64_t backoff_ms, retry_timer, stop_timer;
	uint64_t reconnects;
	char last_error[1024];

	struct pathset pending; /* dirty paths not yet handed to the engine */
	bool pending_full;	/* a root rescan: the next operation is a reconcile */
	uint64_t pending_upto, pending_t0_ns;
	uint64_t applied_seq; /* every journaled op <= this is on the guest */

	uint64_t lat_ns[LAT_WINDOW];
	size_t nlat, lat_next;
	uint64_t bytes_closed; /* bytes_out of chans already gone */
	uint64_t withheld, withheld_saved;

	uint64_t status_last_ms, status_timer;
	bool status_dirty;
	char policy_rel[PATH_MAX]; /* policy file relative to dir ("" = outside:
				      policy_abs) */
	char policy_abs[PATH_MAX]; /* "" = built-in default */
	struct timespec policy_mtime;

	struct relay *relay;
	struct egress_link *egress; /* the sandbox's only way out: proxy streams -> egress proxy */
	struct route *route;	    /* relay backend: local vs guest, credentials (route.h) */
	char sock[PATH_MAX];	    /* relay socket path */
	struct xcmd *xcmds;	    /* commands not yet ended */
	struct syncw *syncws;	    /* sync_waits not yet satisfied */

	_Atomic uint64_t first_notify_ns; /* set by FUSE threads, taken by the loop */
	atomic_bool mount_gone;
	bool stopping;

	/* the embedded sandbox (no --guest): doc/SANDBOX.md */
	struct sandbox_cfg sb_cfg;
	struct sandbox *sb; /* NULL when none runs (idle-stopped, or --guest) */
	bool use_sandbox;
	bool idle_stopped;	 /* stopped by the idle TTL; the next activity starts it */
	int64_t ttl_s;		 /* workspace.ttl_seconds; <= 0: no idle stop */
	uint64_t last_active_ms; /* last relay request or sync activity */
	uint64_t idle_timer;
	char sb_describe[256];		/* kept while idle-stopped, for status */
	char sb_dir[PATH_MAX];		/* its state directory, likewise */
	char guest_name[PATH_MAX + 32]; /* what u->guest shows for a sandbox */
};

static void up_status_write(struct up *u);
static void up_connect(struct up *u);
static void exec_kick(struct up *u);
static void up_touch(struct up *u);

static void mark_dirty(struct up *u)
{
	u->status_dirty = true;
}

/* FUSE thread: the journal went from empty to non-empty. */
static void on_journal_notify(void *ud)
{
	struct up *u = ud;
	uint64_t zero = 0;

	atomic_compare_exchange_strong(&u->first_notify_ns, &zero, loop_now_ns());
	loop_wake(u->loop);
}

/* FUSE thread: the session ended by itself (someone unmounted DIR). */
static void on_mount_exit(void *ud)
{
	struct up *u = ud;

	atomic_store(&u->mount_gone, true);
	loop_wake(u->loop);
}

static void on_stop_timer(struct loop *l, void *ud)
{
	struct up *u = ud;

	u->stop_timer = 0;
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
	if (u->retry_timer) {
		loop_del_timer(u->loop, u->retry_timer);
		u->retry_timer = 0;
	}
	if (u->chan && chan_is_ready(u->chan)) {
		chan_close(u->chan); /* FINAL, then on_close stops the loop */
		u->stop_timer = loop_add_timer(u->loop, CHAN_CLOSE_MS + 500, on_stop_timer, u);
	} else {
		loop_stop(u->loop);
	}
}

/* Drop the connection after an engine or protocol failure; on_close
 * schedules the reconnect. */
static void drop_conn(struct up *u, int err, const char *why)
{
	snprintf(u->last_error, sizeof(u->last_error), "%s", why ? why : strerror(-err));
	fprintf(stderr, "airlock: guest %s: %s\n", u->guest, u->last_error);
	mark_dirty(u);
	if (u->chan)
		chan_close(u->chan);
}

static void lat_add(struct up *u, uint64_t ns)
{
	u->lat_ns[u->lat_next] = ns;
	u->lat_next = (u->lat_next + 1) % LAT_WINDOW;
	if (u->nlat < LAT_WINDOW)
		u->nlat++;
}

static void save_withheld(struct up *u)
{
	size_t nw, ns;
	uint64_t tw, ts;
	char err[512];
	const struct sync_record *w = sync_withheld(u->sync, &nw, &tw), *s = sync_skipped(u->sync, &ns, &ts);

	if (audit_save_withheld(u->dir, policy_source(u->policy), w, nw, tw, s, ns, ts, err, sizeof(err)) < 0)
		fprintf(stderr, "airlock: audit record: %s\n", err);
	u->withheld_saved = tw;
}

static void on_sync_done(int err, const char *why, void *ud)
{
	struct up *u = ud;
	uint64_t now = loop_now_ns();

	u->busy = false;
	mark_dirty(u);
	if (err < 0) {
		drop_conn(u, err, why);
		return;
	}
	if (u->op_upto > u->applied_seq)
		u->applied_seq = u->op_upto;

	if (u->op_t0_ns && now > u->op_t0_ns)
		lat_add(u, now - u->op_t0_ns);
	u->withheld = sync_get_stats(u->sync)->withheld;
	/* the audit record follows the host tree: after a reconcile, and
	 * when a push changed what is withheld */
	if (u->op_full || u->withheld != u->withheld_saved)
		save_withheld(u);
	if (u->state == UP_RECONCILING) {
		u->state = UP_LIVE;
		u->backoff_ms = BACKOFF_MIN_MS;
		u->last_error[0] = '\0';
		/* Going live is news for `airlock status` now, not after the
		 * throttle: a status read right after "in sync" must say so. */
		up_status_write(u);
		if (!u->announced) {
			u->announced = true;
			if (u->ready_fd < 0) {
				printf("airlock: relay socket %s\n", u->sock);
				printf("airlock: %s in sync with %s\n", u->dir, u->guest);
				fflush(stdout);
			} else { /* -d: tell the parent, then log to the state dir */
				char log[PATH_MAX + 32];
				int fd;
				dprintf(u->ready_fd, "airlock: relay socket %s\n", u->sock);
				dprintf(u->ready_fd, "airlock: %s in sync with %s\n", u->dir, u->guest);
				close(u->ready_fd);
				u->ready_fd = -1;
				snprintf(log, sizeof(log), "%s/%s", u->state_dir, UP_LOG_FILE);
				if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) >= 0) {
					dup2(fd, STDOUT_FILENO);
					dup2(fd, STDERR_FILENO);
					close(fd);
				}
				if ((fd = open("/dev/null", O_RDONLY | O_CLOEXEC)) >= 0) {
					dup2(fd, STDIN_FILENO);
					close(fd);
				}
			}
		} else {
			fprintf(stderr, "airlock: reconnected to %s, guest in sync\n", u->guest);
		}
	}
}

static void on_sync_progress(const struct sync_progress *p, void *ud)
{
	(void)p;
	(void)ud;
}

static const struct sync_ops engine_ops = {
    .on_progress = on_sync_progress,
    .on_done = on_sync_done,
};

/* Take the time of the first notify since the last take. */
static uint64_t take_notify_time(struct up *u)
{
	return atomic_exchange(&u->first_notify_ns, 0);
}

/* Move everything journaled into the pending set. */
static void drain_journal(struct up *u)
{
	struct journal_rec recs[DRAIN_BATCH];
	uint64_t t = take_notify_time(u), upto = 0;
	size_t n, total = 0;

	do {
		n = journal_drain(u->journal, recs, DRAIN_BATCH, &upto);
		for (size_t i = 0; i < n; i++) {
			struct journal_rec *r = &recs[i];
			if (!u->pending_full) {
				struct sync_hint *h1, *h2 = NULL;
				if (r->op == JOURNAL_RESCAN && !r->path[0])
					u->pending_full = true;
				else if (!(h1 = pathset_add(&u->pending, r->path)) ||
					 (r->path2 && !(h2 = pathset_add(&u->pending, r->path2))))
					u->pending_full = true;
				else if (u->pending.n > PENDING_MAX)
					u->pending_full = true;
				else {
					hint_note(h1, r);
					if (h2)
						hint_note(h2, r);
				}
				if (u->pending_full)
					pathset_clear(&u->pending);
			}
			journal_rec_clear(r);
		}
		total += n;
	} while (n == DRAIN_BATCH);
	if (!total)
		return;
	up_touch(u);
	if (upto > u->pending_upto)
		u->pending_upto = upto;
	if (!u->pending_t0_ns)
		u->pending_t0_ns = t ? t : loop_now_ns();
	mark_dirty(u);
}

static void start_reconcile(struct up *u)
{
	int r;

	/* a reconcile covers everything journaled so far */
	drain_journal(u);
	pathset_clear(&u->pending);
	u->pending_full = false;
	u->op_upto =
	    u->pending_upto > journal_barrier_seq(u->journal) ? u->pending_upto : journal_barrier_seq(u->journal);
	u->op_t0_ns = u->state == UP_LIVE ? u->pending_t0_ns : 0; /* only live rescans count as latency */
	u->pending_t0_ns = 0;
	u->op_full = true;
	u->op_npaths = 1;
	u->busy = true;
	mark_dirty(u);
	if ((r = sync_reconcile(u->sync)) < 0) {
		u->busy = false;
		drop_conn(u, r, "starting the reconcile failed");
	}
}

static void start_push(struct up *u)
{
	const char **paths;
	struct sync_hint *hints;
	size_t n = 0;
	int r;

	if (u->pending_full) {
		start_reconcile(u);
		return;
	}
	paths = mem_calloc(u->pending.n ? u->pending.n : 1, sizeof(*paths));
	hints = mem_calloc(u->pending.n ? u->pending.n : 1, sizeof(*hints));
	if (!paths || !hints) {
		mem_free(paths);
		mem_free(hints);
		u->pending_full = true;
		pathset_clear(&u->pending);
		return;
	}
	for (size_t i = 0; i < u->pending.cap; i++)
		if (u->pending.slot[i]) {
			hints[n] = u->pending.hint[i];
			paths[n++] = u->pending.slot[i];
		}
	u->op_upto = u->pending_upto;
	u->op_t0_ns = u->pending_t0_ns;
	u->op_full = false;
	u->op_npaths = n;
	u->pending_t0_ns = 0;
	u->busy = true;
	mark_dirty(u);
	r = sync_push_hinted(u->sync, paths, hints, n); /* may finish (on_done) before it returns */
	mem_free(paths);
	mem_free(hints);
	pathset_clear(&u->pending);
	if (r < 0) {
		u->busy = false;
		drop_conn(u, r, "starting a push failed");
	}
}

static void on_status_timer(struct loop *l, void *ud)
{
	struct up *u = ud;
	(void)l;

	u->status_timer = 0;
	up_status_write(u);
}

static void before_sleep(struct loop *l, void *ud)
{
	struct up *u = ud;
	(void)l;

	if (u->dead_sync) {
		sync_free(u->dead_sync);
		u->dead_sync = NULL;
	}
	if (atomic_load(&u->mount_gone) && !u->stopping)
		begin_shutdown(u, "the mount went away");
	if (u->stopping)
		return;
	/* a change while idle-stopped starts the sandbox again */
	if (u->idle_stopped && journal_pending(u->journal) > 0)
		up_touch(u);
	/* a push that finishes at once leaves room for the next */
	for (int i = 0; i < 4 && u->state == UP_LIVE && !u->busy; i++) {
		drain_journal(u);
		if (!u->pending_full && !u->pending.n)
			break;
		start_push(u);
	}
	if (u->state == UP_LIVE && u->busy)
		drain_journal(u); /* coalesce into the next push */
	exec_kick(u);		  /* commands and sync_waits whose barrier is now applied */
	/* Reaching "everything applied" is written at once (sync-wait and
	 * status wait for it); other changes at most every STATUS_MIN_MS. */
	bool settled =
	    u->state == UP_LIVE && !u->busy && !u->pending_full && !u->pending.n && journal_pending(u->journal) == 0;
	if (u->status_dirty && settled) {
		if (u->status_timer)
			loop_del_timer(u->loop, u->status_timer);
		u->status_timer = 0;
		up_status_write(u);
	} else if (u->status_dirty && !u->status_timer) {
		uint64_t now = loop_now_ms(), due = u->status_last_ms + STATUS_MIN_MS;
		if (now >= due)
			up_status_write(u);
		else
			u->status_timer = loop_add_timer(u->loop, due - now, on_status_timer, u);
	}
}

static void on_wake(struct loop *l, void *ud)
{
	(void)l;
	(void)ud; /* the work happens in before_sleep */
}

/* ---- exec backend: relay_backend_ops over the channel ----
 *
 * Each command gets its own host-opened stream. EXEC_START goes out only
 * once applied_seq has reached the journal's barrier seq taken when the
 * request arrived (design.md section 3): a command never sees a file older
 * than the request. Output credit is returned as the relay takes the bytes,
 * and held back while the relay pauses the command, so a slow client
 * stalls that command in the guest and nothing else. Nothing ever runs on
 * the host: without a guest the request fails. */

static void xcmd_free(struct up *u, struct xcmd *x)
{
	for (struct xcmd **pp = &u->xcmds; *pp; pp = &(*pp)->next) {
		if (*pp == x) {
			*pp = x->next;
			break;
		}
	}
	if (x->stream && u->chan)
		chan_stream_close(u->chan, x->stream);
	buf_clear(&x->start);
	mem_free(x);
}

/* End commands with an error (the connection is gone): all of them
 * (which = 0), only those sent to the guest (1), or only those still
 * waiting to be sent (2). The scan restarts after each one: the relay's
 * callbacks may change the list. */
static void exec_fail_some(struct up *u, int which, const char *code, const char *msg)
{
	struct xcmd *x = u->xcmds;

	while (x) {
		struct relay_cmd *cmd = x->cmd;
		if ((which == 1 && !x->stream) || (which == 2 && x->stream)) {
			x = x->next;
			continue;
		}
		x->stream = 0; /* the chan is gone or going */
		xcmd_free(u, x);
		if (cmd)
			relay_cmd_error(cmd, code, msg);
		x = u->xcmds;
	}
}

static bool guest_usable(const struct up *u)
{
	return u->chan && !u->stopping && (u->state == UP_LIVE || u->state == UP_RECONCILING);
}

/* Send what has passed its barrier; answer satisfied sync_waits. */
static void exec_kick(struct up *u)
{
	struct xcmd *x, *next;

	for (struct syncw **pp = &u->syncws; *pp;) {
		struct syncw *w = *pp;
		if (u->applied_seq >= w->barrier) {
			*pp = w->next;
			relay_sync_done(u->relay, w->token);
			mem_free(w);
		} else {
			pp = &w->next;
		}
	}
	if (u->state != UP_LIVE || !u->chan)
		return;
	for (x = u->xcmds; x; x = next) {
		int r;
		next = x->next;
		if (x->stream || u->applied_seq < x->barrier)
			continue;
		if (!(x->stream = chan_stream_open(u->chan, 0))) {
			struct relay_cmd *cmd = x->cmd;
			xcmd_free(u, x);
			relay_cmd_error(cmd, "busy", "too many streams to the guest");
			continue;
		}
		r = chan_send(u->chan, WIRE_EXEC_START, x->stream, buf_ptr(&x->start), buf_len(&x->start));
		if (r == -EAGAIN) { /* no room now: before_sleep tries again */
			chan_stream_close(u->chan, x->stream);
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
	}
}

static int be_exec_start(void *ud, struct relay_cmd *cmd, const struct relay_exec_req *req)
{
	struct up *u = ud;
	struct xcmd *x;
	uint8_t flags = (uint8_t)((req->tty ? WIRE_EXEC_F_TTY : 0) | (req->stdin_open ? WIRE_EXEC_F_STDIN : 0) |
				  (u->egress ? WIRE_EXEC_F_PROXY : 0) | (req->nforwarded ? WIRE_EXEC_F_FWD : 0));
	int r;

	up_touch(u);
	/* with the embedded sandbox a command waits for a (re)connection in
	 * progress or scheduled, e.g. after an idle stop; it fails if that
	 * connection attempt does */
	if (!guest_usable(u) && !(u->use_sandbox && (u->chan || u->retry_timer) && !u->stopping)) {
		relay_cmd_error(cmd, "guest_disconnected",
				"the guest is not connected (see airlock status); nothing was run");
		return 0;
	}
	if (!(x = mem_calloc(1, sizeof(*x))))
		return -ENOMEM;
	x->u = u;
	x->cmd = cmd;
	egress_link_describe(relay_cmd_name(cmd), req->argv, req->argc, x->desc, sizeof(x->desc));
	buf_init(&x->start, WIRE_PAYLOAD_MAX);
	if ((r = buf_put_u8(&x->start, flags)) < 0 || (r = buf_put_u64(&x->start, req->timeout_ms)) < 0 ||
	    (r = buf_put_u16(&x->start, req->rows)) < 0 || (r = buf_put_u16(&x->start, req->cols)) < 0 ||
	    (r = buf_put_str(&x->start, req->cwd ? req->cwd : "")) < 0 ||
	    (r = buf_put_u32(&x->start, (uint32_t)req->argc)) < 0)
		goto fail;
	for (size_t i = 0; i < req->argc; i++)
		if ((r = buf_put_str(&x->start, req->argv[i])) < 0)
			goto fail;
	if ((r = buf_put_u32(&x->start, (uint32_t)req->nenv)) < 0)
		goto fail;
	for (size_t i = 0; i < req->nenv; i++)
		if ((r = buf_put_str(&x->start, req->env[i])) < 0)
			goto fail;
	if (req->nforwarded && (r = route_put_forwarded(&x->start, req)) < 0) /* credentials: wiped with x->start */
		goto fail;
	if (req->argc == 0 || req->argc > WIRE_EXEC_ARGS_MAX || req->nenv > WIRE_EXEC_ARGS_MAX) {
		r = -E2BIG;
		goto fail;
	}
	x->barrier = journal_barrier_seq(u->journal);
	x->next = u->xcmds;
	u->xcmds = x;
	relay_cmd_set_data(cmd, x);
	exec_kick(u);
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
	uint8_t frame[WIRE_PAYLOAD_MAX];
	size_t nframes = n / (WIRE_PAYLOAD_MAX - 1) + 1;
	int r;

	if (!x || !u->chan)
		return -ENOTCONN;
	if (!x->stream || x->stdin_inflight + n > WIRE_EXEC_STDIN_WINDOW ||
	    chan_send_space(u->chan, x->stream) < n + nframes)
		return -EAGAIN;
	do {
		size_t k = n > WIRE_PAYLOAD_MAX - 1 ? WIRE_PAYLOAD_MAX - 1 : n;
		frame[0] = eof && k == n;
		memcpy(frame + 1, p, k);
		if ((r = chan_send(u->chan, WIRE_EXEC_STDIN, x->stream, frame, k + 1)) < 0)
			return r;
		x->stdin_inflight += k;
		p += k;
		n -= k;
	} while (n > 0);
	return 0;
}

static int be_send_small(struct up *u, struct relay_cmd *cmd, uint8_t type, const void *p, size_t n)
{
	struct xcmd *x = relay_cmd_data(cmd);

	if (!x || !u->chan)
		return -ENOTCONN;
	if (!x->stream)
		return -EAGAIN; /* still waiting for its barrier */
	return chan_send(u->chan, type, x->stream, p, n);
}

static int be_signal(void *ud, struct relay_cmd *cmd, int signo)
{
	uint8_t p[4] = {0, 0, 0, (uint8_t)signo};

	if (signo < 1 || signo > 64)
		return -EINVAL;
	return be_send_small(ud, cmd, WIRE_EXEC_SIGNAL, p, sizeof(p));
}

static int be_resize(void *ud, struct relay_cmd *cmd, uint16_t rows, uint16_t cols)
{
	uint8_t p[4] = {(uint8_t)(rows >> 8), (uint8_t)rows, (uint8_t)(cols >> 8), (uint8_t)cols};

	return be_send_small(ud, cmd, WIRE_EXEC_RESIZE, p, sizeof(p));
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
	if (!paused && x->owed && x->stream && u->chan) {
		chan_consume(u->chan, x->stream, x->owed);
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
	w->next = u->syncws;
	u->syncws = w;
	exec_kick(u);
	return 0;
}

static void be_release(void *ud, struct relay_cmd *cmd)
{
	struct up *u = ud;
	struct xcmd *x = relay_cmd_data(cmd);

	if (!x)
		return;
	if (x->stream && u->chan)
		chan_send(u->chan, WIRE_EXEC_CANCEL, x->stream, NULL,
			  0); /* the guest also kills it when the session ends */
	xcmd_free(u, x);
}

static bool be_guest_ready(void *ud) /* route.h: no credential is resolved for a command that cannot start */
{
	return guest_usable(ud);
}

static const struct relay_backend_ops backend_ops = {
    .exec_start = be_exec_start,
    .stdin_write = be_stdin_write,
    .signal = be_signal,
    .resize = be_resize,
    .cancel = be_cancel,
    .pause = be_pause,
    .sync_wait = be_sync_wait,
    .release = be_release,
};

static struct xcmd *xcmd_by_stream(struct up *u, uint32_t stream)
{
	for (struct xcmd *x = u->xcmds; x; x = x->next)
		if (x->stream && x->stream == stream)
			return x;
	return NULL;
}

/* egress_link: which command a proxy connection belongs to */
static struct relay_cmd *link_find_cmd(void *ud, uint32_t exec_stream, const char **desc)
{
	struct xcmd *x = xcmd_by_stream(ud, exec_stream);

	if (!x)
		return NULL;
	*desc = x->desc;
	return x->cmd;
}

static void link_changed(void *ud)
{
	mark_dirty(ud); /* egress figures in the status file */
}

static const struct egress_link_ops link_ops = {
    .find_cmd = link_find_cmd,
    .on_change = link_changed,
};

/* Frames 80..111 from the guest. */
static void handle_exec_frame(struct up *u, uint8_t type, uint32_t stream, const uint8_t *data, size_t n)
{
	struct xcmd *x = xcmd_by_stream(u, stream);
	struct relay_cmd *cmd;
	struct buf in;
	char why[160];

	if (!x) { /* released meanwhile: return the credit, forget the stream at its
		     end */
		if (u->chan && (type == WIRE_EXEC_STDOUT || type == WIRE_EXEC_STDERR))
			chan_consume(u->chan, stream, n);
		if (u->chan && (type == WIRE_EXEC_EXIT || type == WIRE_EXEC_ERROR))
			chan_stream_close(u->chan, stream);
		return;
	}
	cmd = x->cmd;
	buf_view(&in, data, n);
	switch (type) {
	case WIRE_EXEC_STARTED: {
		uint64_t pid;
		if (buf_get_u64(&in, &pid) < 0 || pid > INT32_MAX)
			goto bad;
		relay_cmd_started(cmd, (int64_t)pid);
		chan_consume(u->chan, stream, n); /* every frame on the stream counts against its window */
		return;
	}
	case WIRE_EXEC_STDOUT:
	case WIRE_EXEC_STDERR:
		relay_cmd_output(cmd, type == WIRE_EXEC_STDOUT ? RELAY_STDOUT : RELAY_STDERR, data, n);
		if (x->paused)
			x->owed += n;
		else
			chan_consume(u->chan, stream, n);
		return;
	case WIRE_EXEC_STDIN_ACK: {
		uint32_t k;
		if (buf_get_u32(&in, &k) < 0 || k > x->stdin_inflight)
			goto bad;
		x->stdin_inflight -= k;
		chan_consume(u->chan, stream, n);
		return;
	}
	case WIRE_EXEC_EXIT: {
		uint32_t code, sig;
		uint8_t fl;
		uint64_t dur, nout, nerr;
		if (buf_get_u32(&in, &code) < 0 || buf_get_u32(&in, &sig) < 0 || buf_get_u8(&in, &fl) < 0 ||
		    buf_get_u64(&in, &dur) < 0 || buf_get_u64(&in, &nout) < 0 || buf_get_u64(&in, &nerr) < 0 ||
		    code > 255 || sig > 64)
			goto bad;
		struct relay_exit ex = {
		    .code = sig ? -1 : (int)code,
		    .signal = (int)sig,
		    .timed_out = fl & WIRE_EXEC_X_TIMED_OUT,
		    .duration_ms = dur,
		};
		xcmd_free(u, x);
		relay_cmd_exit(cmd, &ex);
		return;
	}
	case WIRE_EXEC_ERROR: {
		uint32_t err;
		char *msg = NULL;
		if (buf_get_u32(&in, &err) < 0 || buf_get_str(&in, &msg, 1024) < 0) {
			mem_free(msg);
			goto bad;
		}
		xcmd_free(u, x);
		relay_cmd_error(
		    cmd, err == EXDEV || err == ENOENT || err == ENOTDIR || err == EACCES ? "bad_cwd" : "spawn_failed",
		    msg);
		mem_free(msg);
		return;
	}
	default:
		break;
	}
bad:
	snprintf(why, sizeof(why), "malformed %s (%u) from the guest on stream %u", wire_type_name(type), type, stream);
	drop_conn(u, -EPROTO, why);
}

/* ---- frames ---- */

typedef void frame_fn(struct up *u, uint32_t stream, struct buf *in);

static void handle_hello_ok(struct up *u, uint32_t stream, struct buf *in)
{
	(void)stream;

	if (wire_hello_ok_check(in) < 0)
		drop_conn(u, -EPROTO, "guest answered HELLO with an unexpected version");
}

static void handle_error(struct up *u, uint32_t stream, struct buf *in)
{
	uint32_t code = 0;
	char *msg = NULL;
	char why[400];
	struct xcmd *x;

	if (buf_get_u32(in, &code) < 0 || buf_get_str(in, &msg, 1024) < 0) {
		drop_conn(u, -EPROTO, "guest reported a malformed error");
	} else if (u->sync && stream == sync_stream(u->sync)) {
		sync_on_error(u->sync, code, msg);
	} else if (stream && (x = xcmd_by_stream(u, stream))) { /* e.g. an agent without exec */
		struct relay_cmd *cmd = x->cmd;
		snprintf(why, sizeof(why), "the guest refused the command: %.200s", msg);
		xcmd_free(u, x);
		relay_cmd_error(cmd, "backend_error", why);
	} else {
		snprintf(why, sizeof(why), "guest reported an error: %.200s (%s)", msg, strerror((int)code));
		drop_conn(u, -EPROTO, why);
	}
	mem_free(msg);
}

static const struct {
	frame_fn *fn;
	const char *name;
} handlers[WIRE_TYPE_MAX + 1] = {
    [WIRE_HELLO_OK] = {handle_hello_ok, "HELLO_OK"},
    [WIRE_ERROR] = {handle_error, "ERROR"},
};

static void on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *data, size_t n, void *ud)
{
	struct up *u = ud;
	struct buf in;
	char why[128];
	(void)c;

	if (type >= WIRE_SYNC_BEGIN && type <= 79) {
		if (u->sync)
			sync_on_frame(u->sync, type, stream, data, n);
		return;
	}
	if (type >= WIRE_EXEC_START && type <= 111) {
		handle_exec_frame(u, type, stream, data, n);
		return;
	}
	if (type >= WIRE_PROXY_OPEN && type <= 127) {
		if (egress_link_frame(u->egress, type, stream, data, n) < 0) {
			snprintf(why, sizeof(why), "malformed or unexpected %s (%u) from the guest on stream %u",
				 wire_type_name(type), type, stream);
			drop_conn(u, -EPROTO, why);
		}
		return;
	}
	if (!handlers[type].fn) {
		snprintf(why, sizeof(why), "unexpected frame %s (%u) from the guest", wire_type_name(type), type);
		drop_conn(u, -EPROTO, why);
		return;
	}
	buf_view(&in, data, n);
	handlers[type].fn(u, stream, &in);
}

static void on_ready(struct chan *c, void *ud)
{
	struct up *u = ud;
	struct buf b;
	int r;

	buf_init(&b, 1024);
	if ((r = wire_hello_put(&b, u->sync_pk, "airlock up")) < 0 ||
	    (r = chan_send(c, WIRE_HELLO, WIRE_STREAM_CONTROL, buf_ptr(&b), buf_len(&b))) < 0) {
		buf_clear(&b);
		drop_conn(u, r, "sending HELLO failed");
		return;
	}
	buf_clear(&b);
	struct sync_cfg cfg = {
	    .dirfd = u->dirfd,
	    .policy = u->policy,
	    .sign_sk = u->sync_sk,
	    .sign_pk = u->sync_pk,
	    .guest_pub = u->guest_pub,
	    .ops = &engine_ops,
	    .ud = u,
	    .state_dir = u->state_dir,
	};
	if ((r = sync_new(c, &cfg, &u->sync)) < 0) {
		drop_conn(u, r, "starting the sync engine failed");
		return;
	}
	egress_link_attach(u->egress, c);
	u->state = UP_RECONCILING;
	start_reconcile(u);
}

static void on_writable(struct chan *c, void *ud)
{
	struct up *u = ud;
	(void)c;

	if (u->sync)
		sync_on_writable(u->sync);
	egress_link_writable(u->egress);
}

static void on_retry(struct loop *l, void *ud)
{
	struct up *u = ud;
	(void)l;

	u->retry_timer = 0;
	up_connect(u);
}

static void schedule_retry(struct up *u)
{
	if (u->stopping || u->retry_timer)
		return;
	u->retry_timer = loop_add_timer(u->loop, u->backoff_ms, on_retry, u);
	u->backoff_ms = u->backoff_ms * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : u->backoff_ms * 2;
}

static void on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct up *u = ud;
	struct chan_stats st;

	chan_get_stats(c, &st);
	u->bytes_closed += st.bytes_out;
	if (err < 0 && !u->stopping) {
		snprintf(u->last_error, sizeof(u->last_error), "%s", why ? why : strerror(-err));
		fprintf(stderr, "airlock: connection to %s lost: %s\n", u->guest, u->last_error);
	} else if (!u->stopping && !u->idle_stopped) {
		fprintf(stderr, "airlock: guest %s closed the session\n", u->guest);
	}
	u->dead_sync = u->sync; /* the engine may be on the stack: free it later */
	u->sync = NULL;
	u->chan = NULL;
	egress_link_detach(u->egress); /* its tunnels use the chan */
	chan_free(c);
	/* with the sandbox, commands not yet sent wait for the reconnect */
	exec_fail_some(u, u->use_sandbox && !u->stopping && !u->idle_stopped ? 1 : 0, "guest_disconnected",
		       "the connection to the guest was lost (the guest ends the "
		       "commands of a lost session)");
	u->busy = false;
	u->state = UP_DOWN;
	u->reconnects++;
	mark_dirty(u);
	up_status_write(u);
	if (u->stopping) {
		loop_stop(u->loop);
		return;
	}
	if (u->idle_stopped) { /* the idle TTL closed it: stop the sandbox, no retry
				*/
		sandbox_stop(u->sb);
		u->sb = NULL;
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

/* ---- the embedded sandbox: start, idle stop, wake (doc/SANDBOX.md) ---- */

/* Start the sandbox; its keys and address become the guest's. Blocks the
 * loop for the start (bounded by SANDBOX_START_MS; ~10 ms for local). */
static int sandbox_begin(struct up *u, char *err, size_t errlen)
{
	int r;

	if ((r = sandbox_start(&u->sb_cfg, &u->sb, err, errlen)) < 0)
		return r;
	if ((r = transport_parse(sandbox_address(u->sb), &u->addr, err, errlen)) < 0) {
		sandbox_stop(u->sb);
		u->sb = NULL;
		return r;
	}
	u->key = *sandbox_host_key(u->sb);
	memcpy(u->guest_pub, sandbox_guest_pub(u->sb), sizeof(u->guest_pub));
	if ((r = keys_signing_key(&u->key, u->sync_sk, u->sync_pk)) < 0) {
		snprintf(err, errlen, "deriving the sync key failed");
		sandbox_stop(u->sb);
		u->sb = NULL;
		return r;
	}
	snprintf(u->sb_describe, sizeof(u->sb_describe), "%s", sandbox_describe(u->sb));
	snprintf(u->sb_dir, sizeof(u->sb_dir), "%s", sandbox_dir(u->sb));
	fprintf(stderr, "airlock: sandbox started in %.1f ms (%s); state in %s\n", sandbox_start_ms(u->sb),
		sandbox_describe(u->sb), sandbox_dir(u->sb));
	return 0;
}

/* Activity (a relay request, a journaled change): refresh the idle TTL and
 * start an idle-stopped sandbox again. */
static void up_touch(struct up *u)
{
	u->last_active_ms = loop_now_ms();
	if (!u->idle_stopped || u->stopping)
		return;
	u->idle_stopped = false;
	u->backoff_ms = BACKOFF_MIN_MS;
	fprintf(stderr, "airlock: activity: starting the sandbox again\n");
	if (u->chan) /* the idle close is still under way: its on_close reconnects */
		return;
	if (u->retry_timer) {
		loop_del_timer(u->loop, u->retry_timer);
		u->retry_timer = 0;
	}
	up_connect(u); /* starts the sandbox, connects; reconcile follows */
	mark_dirty(u);
}

static bool up_idle(const struct up *u)
{
	return u->state == UP_LIVE && !u->busy && !u->xcmds && !u->syncws && !u->pending.n && !u->pending_full &&
	       journal_pending(u->journal) == 0;
}

static void on_idle_timer(struct loop *l, void *ud)
{
	struct up *u = ud;
	uint64_t ttl_ms = (uint64_t)u->ttl_s * 1000u, tick = ttl_ms / 4 < 1000 ? ttl_ms / 4 : 1000;

	u->idle_timer = loop_add_timer(l, tick ? tick : 1, on_idle_timer, u);
	if (u->stopping || u->idle_stopped || !u->sb)
		return;
	if (!up_idle(u)) {
		if (u->xcmds || u->busy) /* a running command or sync is activity */
			u->last_active_ms = loop_now_ms();
		return;
	}
	if (loop_now_ms() - u->last_active_ms < ttl_ms)
		return;
	fprintf(stderr,
		"airlock: idle for %lld s (workspace.ttl_seconds): stopping the "
		"sandbox\n",
		(long long)u->ttl_s);
	u->idle_stopped = true;
	mark_dirty(u);
	if (u->chan) {
		chan_close(u->chan); /* on_close stops the sandbox */
	} else {
		sandbox_stop(u->sb);
		u->sb = NULL;
	}
}

static void up_connect(struct up *u)
{
	char err[512];
	int fd;

	if (u->stopping || u->idle_stopped)
		return;
	if (u->use_sandbox && (!u->sb || !sandbox_alive(u->sb))) {
		if (u->sb)
			fprintf(stderr, "airlock: the sandbox's agent is gone; starting it again\n");
		sandbox_stop(u->sb);
		u->sb = NULL;
		if (sandbox_begin(u, err, sizeof(err)) < 0) {
			if (strcmp(u->last_error, err)) {
				snprintf(u->last_error, sizeof(u->last_error), "%s", err);
				fprintf(stderr, "airlock: %s (retrying)\n", err);
			}
			exec_fail_some(u, 2, "guest_disconnected", u->last_error);
			mark_dirty(u);
			schedule_retry(u);
			return;
		}
	}
	if ((fd = transport_connect(&u->addr, CONNECT_MS, err, sizeof(err))) < 0) {
		if (strcmp(u->last_error, err)) {
			snprintf(u->last_error, sizeof(u->last_error), "%s", err);
			fprintf(stderr, "airlock: %s (retrying)\n", err);
		}
		exec_fail_some(u, 2, "guest_disconnected", u->last_error); /* queued for this attempt */
		mark_dirty(u);
		schedule_retry(u);
		return;
	}
	struct chan_cfg cfg = {
	    .role = NOISE_INITIATOR, .self = &u->key, .peer = u->guest_pub, .psk = u->have_psk ? u->psk : NULL};
	if (!(u->chan = chan_new(u->loop, fd, &cfg, &up_chan_ops, u))) {
		snprintf(u->last_error, sizeof(u->last_error), "out of memory");
		schedule_retry(u);
		return;
	}
	u->state = UP_HANDSHAKE;
	mark_dirty(u);
}

static void on_signal(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct up *u = ud;
	struct signalfd_siginfo si;
	(void)l;
	(void)events;

	while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGUSR1) /* sync-wait asks for a fresh status */
			up_status_write(u);
		else
			begin_shutdown(u, si.ssi_signo == SIGINT   ? "SIGINT"
					  : si.ssi_signo == SIGHUP ? "SIGHUP"
								   : "SIGTERM");
	}
}

/* ---- status file ---- */

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static bool policy_changed(struct up *u)
{
	struct stat st;
	int r;

	if (!u->policy_abs[0])
		return false;
	/* through the backing directory: never stat through our own mount
	 * from the loop thread */
	r = u->policy_rel[0] ? fstatat(u->dirfd, u->policy_rel, &st, 0) : stat(u->policy_abs, &st);
	if (r < 0)
		return true; /* deleted or renamed away since start */
	return st.st_mtim.tv_sec != u->policy_mtime.tv_sec || st.st_mtim.tv_nsec != u->policy_mtime.tv_nsec;
}

static void up_status_write(struct up *u)
{
	char path[PATH_MAX + 32], tmp[PATH_MAX + 48];
	uint64_t sorted[LAT_WINDOW];
	struct timespec now;
	struct chan_stats cs = {0};
	double p50 = 0, p99 = 0;
	size_t pending;
	json_t *o;
	FILE *f;
	int fd;

	u->status_dirty = false;
	u->status_last_ms = loop_now_ms();
	if (u->status_timer) {
		loop_del_timer(u->loop, u->status_timer);
		u->status_timer = 0;
	}
	if (u->nlat) {
		memcpy(sorted, u->lat_ns, u->nlat * sizeof(sorted[0]));
		qsort(sorted, u->nlat, sizeof(sorted[0]), cmp_u64);
		p50 = (double)sorted[(u->nlat - 1) * 50 / 100] / 1e6;
		p99 = (double)sorted[(u->nlat - 1) * 99 / 100] / 1e6;
	}
	if (u->chan)
		chan_get_stats(u->chan, &cs);
	pending =
	    journal_pending(u->journal) + u->pending.n + (u->pending_full ? 1 : 0) + (u->busy ? u->op_npaths + 1 : 0);
	clock_gettime(CLOCK_REALTIME, &now);
	bool changed = policy_changed(u);
	o = json_pack("{s:i, s:I, s:s, s:s, s:b, s:s, s:I, s:I, s:I, s:{s:f, s:f, s:I}, s:I, "
		      "s:I, s:I, s:s, s:s, s:s, "
		      "s:I, s:s}",
		      "version", 1, "pid", (json_int_t)getpid(), "dir", u->dir, "guest", u->guest, "connected",
		      u->state == UP_LIVE || u->state == UP_RECONCILING, "state", state_names[u->state], "journal_seq",
		      (json_int_t)journal_barrier_seq(u->journal), "applied_seq", (json_int_t)u->applied_seq, "pending",
		      (json_int_t)pending, "latency_ms", "p50", p50, "p99", p99, "samples", (json_int_t)u->nlat,
		      "bytes_sent", (json_int_t)(u->bytes_closed + cs.bytes_out), "withheld", (json_int_t)u->withheld,
		      "reconnects", (json_int_t)u->reconnects, "policy", policy_source(u->policy), "policy_note",
		      changed ? POLICY_NOTE : "", "last_error", u->last_error, "updated_ns",
		      (json_int_t)((uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec), "socket", u->sock);
	if (o && u->use_sandbox)
		json_object_update_new(o, json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:f}", "sandbox",
						    sandbox_kind_name(u->sb_cfg.kind), "sandbox_describe",
						    u->sb_describe, "sandbox_dir", u->sb_dir, "sandbox_state",
						    u->sb	      ? "running"
						    : u->idle_stopped ? "idle-stopped"
								      : "stopped",
						    "ttl_seconds", (json_int_t)u->ttl_s, "idle_ms",
						    (json_int_t)(loop_now_ms() - u->last_active_ms), "sandbox_start_ms",
						    u->sb ? sandbox_start_ms(u->sb) : 0.0));
	if (!o)
		return;
	if (u->egress) {
		struct egress_link_stats es;
		egress_link_get_stats(u->egress, &es);
		json_object_set_new(o, "egress",
				    json_pack("{s:I, s:I, s:I, s:I}", "streams", (json_int_t)es.tunnels, "opened",
					      (json_int_t)es.opened, "refused", (json_int_t)es.refused, "denials",
					      (json_int_t)es.denials));
	}
	snprintf(path, sizeof(path), "%s/%s", u->state_dir, UP_STATUS_FILE);
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", u->state_dir, UP_STATUS_FILE);
	/* no fsync: the file describes a live process and means nothing
	 * after a crash */
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) >= 0) {
		if ((f = fdopen(fd, "w"))) {
			int bad = json_dumpf(o, f, JSON_COMPACT) < 0 || fputc('\n', f) == EOF;
			if (fclose(f) == 0 && !bad)
				rename(tmp, path);
		} else {
			close(fd);
		}
	}
	json_decref(o);
}

/* ---- finding a running daemon ---- */

/* pid of the daemon holding dir's pid file, 0 when none runs. */
static pid_t daemon_pid(const char *state_dir)
{
	char path[PATH_MAX + 32], text[32] = {0};
	pid_t pid = 0;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", state_dir, UP_PID_FILE);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
		return 0;
	if (flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK) {
		ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
		if (n > 0)
			pid = (pid_t)strtol(text, NULL, 10);
		if (pid <= 0)
			pid = 0;
	}
	close(fd);
	return pid;
}

/* Take dir's pid file for this process. 0, or -EBUSY (*other = its pid). */
static int take_pid_file(struct up *u, pid_t *other)
{
	char path[PATH_MAX + 32];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", u->state_dir, UP_PID_FILE);
	if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(fd);
		if (e == EWOULDBLOCK) {
			*other = daemon_pid(u->state_dir);
			return -EBUSY;
		}
		return -e;
	}
	if (ftruncate(fd, 0) < 0 || dprintf(fd, "%d\n", (int)getpid()) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	u->lockfd = fd;
	return 0;
}

static void remove_state_files(struct up *u)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/%s", u->state_dir, UP_STATUS_FILE);
	unlink(path);
	snprintf(path, sizeof(path), "%s/%s", u->state_dir, UP_PID_FILE);
	unlink(path); /* while still holding the lock */
}

static void up_usage(void)
{
	fputs("usage: airlock up DIR [--policy FILE] [-d]\n"
	      "           [--sandbox local|vm | --guest ADDR --key FILE --guest-key "
	      "PUBKEY [--psk-file FILE]]\n"
	      "  without --guest: the embedded sandbox (--sandbox local, the "
	      "default; doc/SANDBOX.md)\n",
	      stderr);
}

/* -d: fork before anything starts threads; the parent waits for the "in
 * sync" line (or the child's exit) and exits with the outcome. Returns in
 * the child with *ready_fd set; exits in the parent. */
static int daemonize(int *ready_fd)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	if ((pid = fork()) < 0)
		return -errno;
	if (pid > 0) {
		char line[PATH_MAX + 512];
		ssize_t n, got = 0;
		close(p[1]);
		while ((n = read(p[0], line + got, sizeof(line) - 1 - (size_t)got)) > 0)
			got += n;
		line[got] = '\0';
		if (got > 0) {
			fputs(line, stdout);
			fprintf(stderr, "airlock: running in the background as pid %d\n", (int)pid);
			exit(0);
		}
		exit(1);
	}
	close(p[0]);
	setsid();
	*ready_fd = p[1];
	return 0;
}

int cmd_up(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"guest", required_argument, NULL, 'g'},	 {"key", required_argument, NULL, 'k'},
	    {"guest-key", required_argument, NULL, 'G'}, {"policy", required_argument, NULL, 'P'},
	    {"psk-file", required_argument, NULL, 'p'},	 {"daemon", no_argument, NULL, 'd'},
	    {"sandbox", required_argument, NULL, 's'},	 {NULL, 0, NULL, 0},
	};
	static struct up u; /* large (latency window); one per process */
	const char *keyfile = NULL, *guest_key = NULL, *psk_file = NULL, *policy_file = NULL, *sandbox = NULL, *dir;
	struct journal_opts jo = {.notify = on_journal_notify, .notify_ud = &u};
	struct mount_opts mo = {.on_exit = on_mount_exit, .ud = &u};
	char err[1024];
	bool daemon = false;
	sigset_t set;
	pid_t other = 0;
	int c, r, status = 1;

	memset(&u, 0, sizeof(u));
	u.dirfd = u.sigfd = u.lockfd = u.ready_fd = -1;
	u.backoff_ms = BACKOFF_MIN_MS;
	optind = 1;
	while ((c = getopt_long(argc, argv, "d", opts, NULL)) != -1) {
		switch (c) {
		case 'g':
			u.guest = optarg;
			break;
		case 'k':
			keyfile = optarg;
			break;
		case 'G':
			guest_key = optarg;
			break;
		case 'P':
			policy_file = optarg;
			break;
		case 'p':
			psk_file = optarg;
			break;
		case 'd':
			daemon = true;
			break;
		case 's':
			sandbox = optarg;
			break;
		default:
			up_usage();
			return 2;
		}
	}
	if (optind != argc - 1) {
		up_usage();
		return 2;
	}
	dir = argv[optind];
	u.use_sandbox = !u.guest;
	if (u.guest && sandbox) {
		cmd_err("up: --guest and --sandbox exclude each other (--guest names a "
			"running guest; --sandbox starts "
			"one)");
		return 2;
	}
	if (u.use_sandbox) {
		if (keyfile || guest_key || psk_file) {
			cmd_err("up: --key, --guest-key and --psk-file go with --guest; the "
				"sandbox makes and pins its "
				"own keys");
			return 2;
		}
		if (sandbox_kind_parse(sandbox ? sandbox : "local", &u.sb_cfg.kind) < 0) {
			cmd_err("up: --sandbox '%s': expected local or vm", sandbox);
			return 2;
		}
	} else if (!keyfile || !guest_key) {
		up_usage();
		return 2;
	} else if (transport_parse(u.guest, &u.addr, err, sizeof(err)) < 0) {
		cmd_err("--guest: %s", err);
		return 2;
	} else if (keys_pub_parse(guest_key, u.guest_pub) < 0) {
		cmd_err("--guest-key '%s' is not a public key (44 characters of base64)", guest_key);
		return 2;
	}
	/* a mount left by a crashed up would hide DIR: clear it first */
	if ((r = mount_clear_stale(dir)) == -EBUSY) {
		cmd_err("up: %s is already served by a running airlock (stop it with: "
			"airlock down %s)",
			dir, dir);
		return 1;
	} else if (r < 0 && r != -ENOENT && r != -ENOTDIR) {
		cmd_err("up: %s: %s", dir, strerror(-r));
		return 1;
	}
	if (!realpath(dir, u.dir)) {
		cmd_err("up: workspace %s: %s", dir, strerror(errno));
		return 2;
	}
	/* policy once, before the mount: it is read from the backing files */
	if (policy_load_for_workspace(u.dir, policy_file, &u.policy, err, sizeof(err)) < 0) {
		cmd_err("policy: %s", err);
		return 2;
	}
	{
		const char *src = policy_source(u.policy);
		struct stat st;
		size_t dl = strlen(u.dir);
		if (src[0] != '(' && realpath(src, u.policy_abs) && stat(u.policy_abs, &st) == 0) {
			u.policy_mtime = st.st_mtim;
			if (!strncmp(u.policy_abs, u.dir, dl) && u.policy_abs[dl] == '/')
				snprintf(u.policy_rel, sizeof(u.policy_rel), "%s", u.policy_abs + dl + 1);
		} else {
			u.policy_abs[0] = '\0';
		}
	}
	if (!u.use_sandbox && keys_load(keyfile, &u.key, err, sizeof(err)) < 0) {
		cmd_err("%s", err);
		status = 2;
		goto out;
	}
	if (psk_file) {
		if (keys_load_psk(psk_file, u.psk, err, sizeof(err)) < 0) {
			cmd_err("%s", err);
			status = 2;
			goto out;
		}
		u.have_psk = true;
	}
	if (!u.use_sandbox && keys_signing_key(&u.key, u.sync_sk, u.sync_pk) < 0) {
		cmd_err("out of memory");
		goto out;
	}
	if (audit_dir(u.dir, 1, u.state_dir, sizeof(u.state_dir), err, sizeof(err)) < 0) {
		cmd_err("up: state directory: %s", err);
		goto out;
	}
	if (daemon && (r = daemonize(&u.ready_fd)) < 0) {
		cmd_err("up: -d: %s", strerror(-r));
		goto out;
	}
	if ((r = take_pid_file(&u, &other)) < 0) {
		if (r == -EBUSY)
			cmd_err("up: airlock up is already running for %s (pid %d); stop it "
				"with: airlock down %s",
				u.dir, (int)other, u.dir);
		else
			cmd_err("up: pid file in %s: %s", u.state_dir, strerror(-r));
		goto out_nopid;
	}
	/* the sandbox before the mount: its namespaces never hold a copy of it */
	if (u.use_sandbox) {
		const struct policy_workspace *pw = policy_workspace(u.policy);
		u.sb_cfg.workspace = u.dir;
		u.ttl_s = pw ? pw->ttl_seconds : -1;
		snprintf(u.guest_name, sizeof(u.guest_name), "sandbox %s", sandbox_kind_name(u.sb_cfg.kind));
		u.guest = u.guest_name;
		u.last_active_ms = loop_now_ms();
		if (sandbox_begin(&u, err, sizeof(err)) < 0) {
			cmd_err("up: sandbox: %s", err);
			goto out;
		}
	}
	/* the real files, opened before the mount covers them */
	if ((u.dirfd = open(u.dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		cmd_err("up: workspace %s: %s", u.dir, strerror(errno));
		status = 2;
		goto out;
	}
	/* every thread started from here on (FUSE workers) inherits the
	 * blocked set: the signals arrive only through the signalfd */
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	sigaddset(&set, SIGUSR1);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	if ((u.sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK)) < 0 || !(u.loop = loop_new()) ||
	    !(u.journal = journal_new(&jo)) || loop_add_fd(u.loop, u.sigfd, EPOLLIN, on_signal, &u) < 0) {
		cmd_err("up: out of memory or descriptors");
		goto out;
	}
	loop_set_before_sleep(u.loop, before_sleep, &u);
	loop_set_wake(u.loop, on_wake, &u);
	{
		/* before the mount: it reads earlier denials from the audit dir */
		struct egress_link_cfg ec = {.policy = u.policy, .workspace = u.dir};
		if (egress_link_new(u.loop, &ec, &link_ops, &u, &u.egress, err, sizeof(err)) < 0) {
			cmd_err("up: egress proxy: %s", err);
			goto out;
		}
	}
	if ((r = mount_start(u.dir, u.journal, &mo, &u.mount)) < 0) {
		cmd_err("up: cannot mount over %s: %s%s", u.dir, strerror(-r),
			r == -ENODEV || r == -EPERM ? " (needs /dev/fuse and permission to mount)" : "");
		goto out;
	}
	{
		const struct policy_execution *pe = policy_execution(u.policy);
		struct relay_cfg rc = {.path = u.sock};
		if (pe && pe->timeout_seconds > 0 && pe->timeout_seconds < 30 * 86400)
			rc.timeout_s = (unsigned)pe->timeout_seconds;
		struct route_cfg ro = {.loop = u.loop,
				       .policy = u.policy,
				       .workspace = u.dir,
				       .guest = &backend_ops,
				       .guest_ud = &u,
				       .guest_ready = be_guest_ready};
		if ((r = route_new(&ro, &u.route)) < 0) {
			cmd_err("up: command routing (execution.local, credentials) for %s: %s", u.dir, strerror(-r));
			goto out;
		}
		if ((r = relay_default_path(u.dir, u.sock, sizeof(u.sock))) < 0 ||
		    (r = relay_new(u.loop, &rc, &route_backend_ops, u.route, &u.relay)) < 0) {
			cmd_err("up: relay socket %s: %s%s", u.sock[0] ? u.sock : "(for this workspace)", strerror(-r),
				r == -EADDRINUSE ? " (another airlock serves it; set "
						   "AIRLOCK_SOCKET to use another path)"
						 : "");
			goto out;
		}
	}
	fprintf(stderr, "airlock: %s mounted; relay socket %s; connecting to %s\n", u.dir, u.sock, u.guest);
	if (u.use_sandbox && u.ttl_s > 0)
		u.idle_timer = loop_add_timer(u.loop, 1000, on_idle_timer, &u);
	up_status_write(&u);
	up_connect(&u);
	if ((r = loop_run(u.loop)) < 0)
		cmd_err("up: event loop: %s", strerror(-r));
	else
		status = 0;
out:
	if (u.mount) {
		mount_stop(u.mount);
		u.mount = NULL;
	}
	relay_free(u.relay); /* releases running commands while the chan still exists */
	u.relay = NULL;
	route_free(u.route); /* after relay_free: kills local commands, wipes credentials */
	u.route = NULL;
	egress_link_free(u.egress); /* before the chan: its tunnels use it; writes
				       pending denials */
	u.egress = NULL;
	if (u.chan)
		chan_free(u.chan);
	u.chan = NULL;
	while (u.xcmds) /* relay_free released them all; nothing of the relay may be
			   used now */
		xcmd_free(&u, u.xcmds);
	while (u.syncws) {
		struct syncw *w = u.syncws;
		u.syncws = w->next;
		mem_free(w);
	}
	sync_free(u.sync);
	sync_free(u.dead_sync);
	if (u.loop) {
		if (u.retry_timer)
			loop_del_timer(u.loop, u.retry_timer);
		if (u.stop_timer)
			loop_del_timer(u.loop, u.stop_timer);
		if (u.status_timer)
			loop_del_timer(u.loop, u.status_timer);
		if (u.idle_timer)
			loop_del_timer(u.loop, u.idle_timer);
	}
	sandbox_stop(u.sb); /* state kept: the next up starts where this one left */
	u.sb = NULL;
	if (u.lockfd >= 0) {
		remove_state_files(&u);
		close(u.lockfd);
	}
out_nopid:
	loop_free(u.loop);
	journal_free(u.journal);
	pathset_clear(&u.pending);
	policy_free(u.policy);
	if (u.dirfd >= 0)
		close(u.dirfd);
	if (u.sigfd >= 0)
		close(u.sigfd);
	if (u.ready_fd >= 0)
		close(u.ready_fd);
	sodium_memzero(&u.key, sizeof(u.key));
	sodium_memzero(u.sync_sk, sizeof(u.sync_sk));
	sodium_memzero(u.psk, sizeof(u.psk));
	return status;
}

/* ---- down / status / sync-wait ---- */

/* State dir of dir; clears a stale mount that hides dir first if needed. */
static int state_dir_of(const char *dir, char *out, size_t n)
{
	char err[512];

	if (audit_dir(dir, 0, out, n, err, sizeof(err)) == 0)
		return 0;
	if (mount_clear_stale(dir) == 0 && audit_dir(dir, 0, out, n, err, sizeof(err)) == 0)
		return 0;
	cmd_err("%s", err);
	return -1;
}

static void wait_usage(const char *cmd)
{
	if (!strcmp(cmd, "down"))
		fputs("usage: airlock down DIR [--destroy]\n"
		      "  --destroy: also remove the sandbox's state (its workspace copy, "
		      "home, keys)\n",
		      stderr);
	else if (!strcmp(cmd, "status"))
		fputs("usage: airlock status [-C DIR] [--json]\n", stderr);
	else
		fputs("usage: airlock sync-wait [-C DIR] [--timeout S]\n", stderr);
}

/* down --destroy: the sandbox's state goes once nothing runs. */
static int down_destroy(const char *dir)
{
	char real[PATH_MAX], err[PATH_MAX + 128];
	int r;

	if (!realpath(dir, real)) {
		/* the workspace may be gone; its sandbox's state is still named by its path
		 */
		if (dir[0] != '/' || strlen(dir) >= sizeof(real)) {
			cmd_err("down: %s: %s (give the workspace's absolute path)", dir, strerror(errno));
			return 1;
		}
		snprintf(real, sizeof(real), "%s", dir);
	}
	if ((r = sandbox_destroy(real, err, sizeof(err))) < 0) {
		cmd_err("down: --destroy: %s", err);
		return 1;
	}
	fprintf(stderr, "airlock: the sandbox state of %s is removed\n", real);
	return 0;
}

static int down_stop(char **argv);

int cmd_down(int argc, char **argv)
{
	int r;

	if (argc == 3 && !strcmp(argv[1], "--destroy")) {
		argv[1] = argv[2];
		argv[2] = "--destroy";
	}
	if (argc == 3 && strcmp(argv[2], "--destroy")) {
		wait_usage("down");
		return 2;
	}
	if (argc != 2 && argc != 3) {
		wait_usage("down");
		return 2;
	}
	if (argc == 3) { /* works without a daemon, even one that never ran */
		char sdir[PATH_MAX], err[512];
		if (audit_dir(argv[1], 0, sdir, sizeof(sdir), err, sizeof(err)) == 0 && (r = down_stop(argv)) != 0)
			return r;
		return down_destroy(argv[1]);
	}
	return down_stop(argv);
}

static int down_stop(char **argv)
{
	char sdir[PATH_MAX];
	pid_t pid;
	int r;

	if (state_dir_of(argv[1], sdir, sizeof(sdir)) < 0)
		return 1;
	if (!(pid = daemon_pid(sdir))) {
		r = mount_clear_stale(argv[1]);
		if (r == -EBUSY) {
			cmd_err("down: %s is served by an airlock process this state directory "
				"does not know",
				argv[1]);
			return 1;
		}
		if (r < 0) {
			cmd_err("down: %s: %s", argv[1], strerror(-r));
			return 1;
		}
		fprintf(stderr, "airlock: no airlock up runs for %s (nothing to stop)\n", argv[1]);
		return 0;
	}
	if (kill(pid, SIGTERM) < 0) {
		cmd_err("down: cannot signal pid %d: %s", (int)pid, strerror(errno));
		return 1;
	}
	for (uint64_t t0 = loop_now_ms(); loop_now_ms() - t0 < DOWN_WAIT_MS;) {
		if (!daemon_pid(sdir) && mount_is_airlock(argv[1]) != 1)
			return 0;
		usleep(10000);
	}
	cmd_err("down: airlock up (pid %d) is still running %u s after SIGTERM; %s is %s", (int)pid,
		DOWN_WAIT_MS / 1000, argv[1], mount_is_airlock(argv[1]) == 1 ? "still mounted" : "unmounted");
	return 1;
}

/* Read the status file: *out (json_decref) or NULL when there is none. */
static int read_status(const char *sdir, json_t **out)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/%s", sdir, UP_STATUS_FILE);
	*out = json_load_file(path, 0, NULL);
	return *out ? 0 : -ENOENT;
}

static int parse_dir_opts(const char *cmd, int argc, char **argv, const char **dir, bool *json, double *timeout)
{
	static const struct option opts[] = {
	    {"json", no_argument, NULL, 'j'},
	    {"timeout", required_argument, NULL, 't'},
	    {NULL, 0, NULL, 0},
	};
	int c;

	*dir = ".";
	optind = 1;
	while ((c = getopt_long(argc, argv, "C:", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			*dir = optarg;
			break;
		case 'j':
			if (!json)
				goto bad;
			*json = true;
			break;
		case 't': {
			char *end;
			if (!timeout)
				goto bad;
			*timeout = strtod(optarg, &end);
			if (*end || !(*timeout > 0))
				goto bad;
			break;
		}
		default:
			goto bad;
		}
	}
	if (optind != argc)
		goto bad;
	return 0;
bad:
	wait_usage(cmd);
	return -1;
}

static uint64_t real_now_ns(void)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

/* The daemon's status as of now: ask for a fresh one (SIGUSR1) and wait
 * up to wait_ms for a status written after the request; else the last one
 * written (its updated_ns says how old it is). 0, or -1 without any. */
static int fresh_status(const char *sdir, pid_t pid, unsigned wait_ms, json_t **out)
{
	uint64_t t0 = real_now_ns(), start = loop_now_ms();

	*out = NULL;
	if (kill(pid, SIGUSR1) == 0) {
		while (loop_now_ms() - start < wait_ms) {
			json_t *st = NULL;
			if (read_status(sdir, &st) == 0 &&
			    (uint64_t)json_integer_value(json_object_get(st, "updated_ns")) >= t0) {
				*out = st;
				return 0;
			}
			json_decref(st);
			usleep(2000);
		}
	}
	return read_status(sdir, out) == 0 ? 0 : -1;
}

int cmd_status(int argc, char **argv)
{
	const char *dir;
	bool json = false;
	char sdir[PATH_MAX];
	json_t *st = NULL;
	pid_t pid;

	if (parse_dir_opts("status", argc, argv, &dir, &json, NULL) < 0)
		return 2;
	if (state_dir_of(dir, sdir, sizeof(sdir)) < 0)
		return 1;
	pid = daemon_pid(sdir);
	if (pid)
		fresh_status(sdir, pid, 1000, &st);
	if (!pid || !st || json_integer_value(json_object_get(st, "pid")) != pid) {
		if (json)
			printf("{\"running\":false,\"dir\":\"%s\"}\n", dir);
		else
			printf("airlock: no airlock up runs for %s\n", dir);
		json_decref(st);
		return 1;
	}
	json_object_set_new(st, "running", json_true());
	if (json) {
		json_dumpf(st, stdout, JSON_COMPACT);
		fputc('\n', stdout);
	} else {
		json_t *lat = json_object_get(st, "latency_ms");
		const char *note = json_string_value(json_object_get(st, "policy_note"));
		const char *lerr = json_string_value(json_object_get(st, "last_error"));
		printf("workspace   %s (airlock up, pid %d)\n", json_string_value(json_object_get(st, "dir")),
		       (int)pid);
		printf("guest       %s: %s\n", json_string_value(json_object_get(st, "guest")),
		       json_string_value(json_object_get(st, "state")));
		printf("journal     seq %" JSON_INTEGER_FORMAT ", applied %" JSON_INTEGER_FORMAT
		       ", %" JSON_INTEGER_FORMAT " pending\n",
		       json_integer_value(json_object_get(st, "journal_seq")),
		       json_integer_value(json_object_get(st, "applied_seq")),
		       json_integer_value(json_object_get(st, "pending")));
		printf("latency     edit to apply p50 %.2f ms, p99 %.2f ms (last "
		       "%" JSON_INTEGER_FORMAT " pushes)\n",
		       json_real_value(json_object_get(lat, "p50")), json_real_value(json_object_get(lat, "p99")),
		       json_integer_value(json_object_get(lat, "samples")));
		printf("sent        %.2f MiB, %" JSON_INTEGER_FORMAT " withheld, %" JSON_INTEGER_FORMAT " reconnects\n",
		       (double)json_integer_value(json_object_get(st, "bytes_sent")) / 1048576.0,
		       json_integer_value(json_object_get(st, "withheld")),
		       json_integer_value(json_object_get(st, "reconnects")));
		printf("policy      %s%s%s\n", json_string_value(json_object_get(st, "policy")),
		       note && *note ? ": " : "", note ? note : "");
		printf("relay       %s\n", json_string_value(json_object_get(st, "socket"))
					       ? json_string_value(json_object_get(st, "socket"))
					       : "-");
		if (json_object_get(st, "sandbox")) {
			long long ttl = (long long)json_integer_value(json_object_get(st, "ttl_seconds"));
			printf("sandbox     %s, %s (%s)\n", json_string_value(json_object_get(st, "sandbox")),
			       json_string_value(json_object_get(st, "sandbox_state")),
			       json_string_value(json_object_get(st, "sandbox_describe")));
			if (ttl > 0)
				printf("idle ttl    %lld s (idle for %.1f s)\n", ttl,
				       (double)json_integer_value(json_object_get(st, "idle_ms")) / 1000.0);
			else
				printf("idle ttl    none (workspace.ttl_seconds unset)\n");
		}
		json_t *eg = json_object_get(st, "egress");
		if (eg)
			printf("egress      %" JSON_INTEGER_FORMAT " proxy connections open, %" JSON_INTEGER_FORMAT
			       " made, %" JSON_INTEGER_FORMAT " denied (airlock audit)\n",
			       json_integer_value(json_object_get(eg, "streams")),
			       json_integer_value(json_object_get(eg, "opened")),
			       json_integer_value(json_object_get(eg, "denials")));
		if (lerr && *lerr)
			printf("last error  %s\n", lerr);
	}
	json_decref(st);
	return 0;
}

int cmd_sync_wait(int argc, char **argv)
{
	const char *dir;
	double timeout = 60;
	char sdir[PATH_MAX];
	struct timespec now;
	uint64_t t0_ms = loop_now_ms(), t0_real, barrier = 0, last_kick = 0;
	bool have_barrier = false;
	pid_t pid;

	if (parse_dir_opts("sync-wait", argc, argv, &dir, NULL, &timeout) < 0)
		return 2;
	if (state_dir_of(dir, sdir, sizeof(sdir)) < 0)
		return 1;
	if (!(pid = daemon_pid(sdir))) {
		cmd_err("sync-wait: no airlock up runs for %s", dir);
		return 1;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	t0_real = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
	for (;;) {
		uint64_t t = loop_now_ms();
		json_t *st = NULL;

		if ((double)(t - t0_ms) > timeout * 1000.0) {
			cmd_err("sync-wait: %s not in sync after %.1f s (airlock status -C %s)", dir, timeout, dir);
			return 1;
		}
		/* the barrier must come from a status written after we started,
		 * so it covers every change made before: ask for one */
		if (!have_barrier && t - last_kick >= 200) {
			if (kill(pid, SIGUSR1) < 0) {
				cmd_err("sync-wait: airlock up (pid %d) is gone", (int)pid);
				return 1;
			}
			last_kick = t;
		}
		if (read_status(sdir, &st) == 0) {
			uint64_t upd = (uint64_t)json_integer_value(json_object_get(st, "updated_ns"));
			uint64_t applied = (uint64_t)json_integer_value(json_object_get(st, "applied_seq"));
			uint64_t pending = (uint64_t)json_integer_value(json_object_get(st, "pending"));
			if (!have_barrier && upd >= t0_real && json_integer_value(json_object_get(st, "pid")) == pid) {
				barrier = (uint64_t)json_integer_value(json_object_get(st, "journal_seq"));
				have_barrier = true;
			}
			json_decref(st);
			if (have_barrier && applied >= barrier && pending == 0)
				return 0;
		}
		if (t - t0_ms > 0 && (t - t0_ms) % 1000 < 5 && !daemon_pid(sdir)) {
			cmd_err("sync-wait: airlock up for %s stopped", dir);
			return 1;
		}
		usleep(5000);
	}
}
