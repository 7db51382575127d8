/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_UP_I_H
#define AIRLOCK_UP_I_H

/*
 * Private to `airlock up` and its companions down, status and sync-wait
 * (doc/UP.md). The daemon is one struct up, one sub-struct per concern,
 * and one file per concern:
 *
 *   up.c         cmd_up: parse, set up each service, run, tear down
 *   up_daemon.c  the loop's hooks, signals, the guest connection and its
 *                reconnect backoff, the embedded sandbox and its idle TTL
 *   up_sync.c    journal -> pending set -> sync engine operations, the
 *                applied barrier, the latency window, the audit record
 *   up_exec.c    the relay backend: commands to the guest on exec streams
 *                (struct xcmd), sync_wait waiters, egress lookups
 *   up_paths.c   paths the guest could not apply: their retry, status
 *                and audit record, each command's line (or refusal)
 *   up_status.c  the status file; `airlock status` and `sync-wait`
 *   up_state.c   the state directory, pid file and lock; `airlock down`
 *
 * Threads: the loop thread owns everything below except first_notify_ns
 * and mount_gone, which FUSE threads set (atomics). FUSE threads only
 * append to the journal and loop_wake(); the loop never waits for FUSE
 * except inside mount_stop() at shutdown.
 */

#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/types.h>
#include <time.h>

#include "airlock/core/buf.h"
#include "airlock/core/loop.h"
#include "airlock/egress/egress_link.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/server/relay.h"
#include "airlock/sync/sync.h"
#include "guestopt_i.h"

#define UP_PID_FILE	"up.pid"      /* pid, flock'ed by the daemon while it runs */
#define UP_SUPER_FILE	"super.pid"   /* pid, flock'ed by the supervisor while it runs */
#define UP_STATUS_FILE	"status.json" /* written by the daemon, read by status/sync-wait */
#define UP_LOG_FILE	"up.log"      /* the daemon's stderr, timestamped (up_log.c) */
#define UP_LOG_MAX	(1 << 20)     /* up.log is rotated to up.log.1 past this */
#define STATUS_MIN_MS	100u	      /* status file rewritten at most this often */
#define BACKOFF_MIN_MS	100u
#define BACKOFF_MAX_MS	5000u
#define CONNECT_MS	2000	/* one connect attempt (blocks the loop: see doc/UP.md) */
#define LAT_WINDOW	1000u	/* pushes kept for the latency percentiles */
#define PENDING_MAX	100000u /* more distinct dirty paths than this: full reconcile */
#define DRAIN_BATCH	256u
#define DOWN_WAIT_MS	10000u
#define RESTART_WAIT_MS 3000u /* status/sync-wait wait this long for a restarted daemon */
#define POLICY_NOTE	"policy is read once at start: edits to it apply after restart"

/* state files of up_changes.c that up_status.c names in state_error */
#define UP_CONFIRMED_FILE "confirmed.manifest" /* the confirmed state, for the next reconcile */
#define UP_STASH_FILES	  "conflict-*"	       /* the guest's versions of conflicts */

struct loop;
struct journal;
struct mount;
struct mount_keep;
struct chan;
struct wb_forkset;
struct wb_pull;
struct relay;
struct relay_cmd;
struct relay_exit;
struct relay_changes_ops;
struct manifest_change;
struct manifest;
struct route;
struct relay_backend_ops;
struct egress_link_ops;

/* A set of dirty paths (open addressing, owned strings), up_sync.c. */
struct pathset {
	char **slot;		/* cap entries, NULL = empty */
	struct sync_hint *hint; /* what the journal said about slot[i]'s content */
	size_t cap, n;
};

struct up_fork;

/* One command forwarded to the guest on its own stream (doc/UP.md "Exec"). */
struct xcmd {
	struct up *u;
	struct up_fork *fork; /* the fork it runs in (up_fork.c); NULL: the sandbox */
	struct relay_cmd *cmd;
	struct xcmd *next;
	struct buf start;  /* EXEC_START payload, until sent */
	uint64_t barrier;  /* journal seq whose batches must be sent first */
	uint64_t t_req_ns; /* when the request came (AIRLOCK_TRACE) */
	uint32_t stream;   /* 0 until EXEC_START went out */
	bool paused;	   /* the relay holds output back: credit is owed, not returned */
	bool gated;	   /* up_paths_gate was asked (once per command) */
	size_t owed;
	size_t stdin_inflight; /* stdin bytes sent, not yet acknowledged
				  (WIRE_EXEC_STDIN_WINDOW) */
	/* stdin from a file of the daemon's (up_exec_stdin_feed: try's patch
	 * and replay); fed: no client's stdin is taken */
	int feed_fd;
	uint64_t feed_off, feed_size;
	bool feeding, fed;
	char desc[EGRESS_LINK_DESC_MAX]; /* "id argv..." for egress denial records */
	char *by_argv;			 /* its argv as a JSON array, for guest changes */
	char **rep;			 /* paths of the changes it reported (CHG_ITEM), up_changes.c */
	size_t nrep, caprep;
};

/* A sync_wait waiting for its barrier. */
struct syncw {
	uint64_t token, barrier;
	struct syncw *next;
};

enum up_state { UP_DOWN, UP_HANDSHAKE, UP_RECONCILING, UP_LIVE };

/* The guest connection and its lifecycle (up_daemon.c): who the guest is,
 * the channel, the reconnect backoff. */
struct up_conn {
	struct guest_opts g; /* --guest and its keys, or the sandbox's */
	const char *guest;   /* what the guest is called in messages and status */
	struct chan *chan;
	enum up_state state;
	uint64_t backoff_ms, retry_timer, stop_timer;
	uint64_t reconnects;
	uint64_t bytes_closed; /* bytes_out of chans already gone */
	bool announced;	       /* the "in sync" line was printed */
	char last_error[1024];
};

/* The sync engine, the operation it runs, and the dirty paths waiting for
 * the next one (up_sync.c). */
struct up_sync {
	struct sync *engine, *dead; /* dead: freed in before_sleep, off the engine's stack */
	bool busy, op_full;	    /* an operation runs; it is a reconcile */
	uint64_t op_upto, op_t0_ns; /* journal seq it covers; first notify of its changes */
	size_t op_npaths;
	struct pathset pending; /* dirty paths not yet handed to the engine */
	bool pending_full;	/* a root rescan: the next operation is a reconcile */
	uint64_t pending_upto, pending_t0_ns;
	uint64_t applied_seq; /* every journaled op <= this is on the guest */
	uint64_t withheld, withheld_saved;
	/* AIRLOCK_TRACE=1: one log line per push and per command with where
	 * its time went (doc/UP.md "Tracing a push"); op_start_ns: when the
	 * operation was handed to the engine */
	bool trace;
	uint64_t op_start_ns;
	uint64_t hold_timer; /* a pending set of truncations waits for its write (up_sync.c) */
	/* the host's proof of an unchanged tree, begun right after the mount
	 * (up_sync_prescan); handed to the first reconcile when nothing was
	 * journaled since prescan_seq, else dropped */
	struct sync_prescan *prescan;
	uint64_t prescan_seq;
};

/* When each step of the start happened (CLOCK_MONOTONIC ns; 0: not yet),
 * for AIRLOCK_TRACE's start line (doc/UP.md "Tracing the start"). */
enum up_mark {
	UP_T_START,   /* cmd_up began (in the command, before -d's fork) */
	UP_T_POLICY,  /* the workspace checked, the policy loaded */
	UP_T_DAEMON,  /* the daemon holds the pid file */
	UP_T_SANDBOX, /* the sandbox started (none with --guest) */
	UP_T_MOUNT,   /* the mount is in place */
	UP_T_SETUP,   /* egress, relay: everything set up */
	UP_T_CONNECT, /* connect() called */
	UP_T_READY,   /* handshake done: HELLO, the engine, SYNC_BEGIN */
	UP_T_LIVE,    /* the first reconcile is done: "in sync" */
	UP_T_COUNT,
};

/* Edit-to-apply latency of the last LAT_WINDOW pushes (up_sync.c). */
struct up_latency {
	uint64_t ns[LAT_WINDOW];
	size_t n, next;
};

/* Progress of the first sync and reconciles, on stderr (up_sync.c):
 * a line redrawn on a terminal, periodic lines otherwise. */
struct up_progress {
	bool quiet; /* --quiet */
	bool drawn; /* a terminal line is showing */
	uint64_t t0_ms, last_ms;
};

/* A file of the state directory whose last write failed (up_state_wrote). */
struct up_werr {
	char file[32];
	int err; /* -errno */
};
#define UP_WERR_MAX 8

/* The status file's throttle, and the state directory's failed writes
 * (up_status.c): the status's state_error until each is written again. */
struct up_status {
	uint64_t last_ms, timer;
	bool dirty;
	struct up_werr werr[UP_WERR_MAX];
	size_t nwerr;
	uint64_t retry_ms; /* when the failed files were last written again */
};

/* The policy, read once at start, and where its file is to notice edits. */
struct up_policy {
	struct policy *policy;
	char rel[PATH_MAX]; /* policy file relative to dir ("" = outside: abs) */
	char abs[PATH_MAX]; /* "" = built-in default */
	struct timespec mtime;
};

/* The relay socket and what it runs through (up_exec.c). */
struct up_exec {
	struct relay *relay;
	struct egress_link *egress; /* the sandbox's only way out: proxy streams -> egress proxy */
	struct route *route;	    /* relay backend: local vs guest, credentials (route.h) */
	char sock[PATH_MAX];	    /* relay socket path */
	struct xcmd *xcmds;	    /* commands not yet ended */
	struct syncw *syncws;	    /* sync_waits not yet satisfied */
};

struct upull;
struct wb_store;
struct wb_change;
struct apply;
struct policy_ctx;

/* Guest changes and write-back (up_changes.c; doc/SYNC.md "Guest changes
 * and write-back"). */
struct up_changes {
	struct wb_store *store; /* NULL: the store could not be opened (nothing is tracked) */
	struct policy_ctx *pctx;
	int state_fd;
	uint8_t sk[64], pk[32], scope[32]; /* the write-back's own batch key and scope */
	struct apply *apply;		   /* the workspace through the mount, opened at the first write */
	struct upull *pulls;
	struct wb_change *adopted; /* written back, not yet seen by a push */
	size_t nadopted, capadopted;
	uint64_t *rejects; /* reject requests answered after the next reconcile */
	char **reject_bodies;
	size_t nrejects;
	bool reject_pending; /* the reconcile running at the reject does not count */
	/* the confirmed state as last saved (CONFIRMED_FILE), for the
	 * reconcile's three-way check; loaded when the reconcile first asks
	 * for it (a reconcile that finds no difference never does) */
	struct manifest *base;
	struct manifest *sending; /* what was being sent when the connection dropped (SENDING_FILE) */
	uint8_t base_root[16];	  /* the saved confirmed state's root digest (from the .meta) */
	bool base_root_known;
	bool base_pending;	/* base and sending are on disk, not loaded yet (up_changes.c base_wait) */
	bool exact_on_disk;	/* the saved confirmed state is marked exact: re-mark it at the next push */
	uint64_t base_seq;	/* the guest's sequence when it was saved (0: unusable) */
	char **rejected;	/* rejected paths (sorted) until their reconcile is done: the */
	size_t nrejected;	/* three-way check must not take them as guest changes again */
	uint8_t base_guest[32]; /* ... and whose it was */
	uint64_t base_gen;	/* ... of which generation of its copy (SYNC_STATE gen) */
};

/* The embedded sandbox (no --guest): doc/SANDBOX.md (up_daemon.c). */
struct up_sandbox {
	struct sandbox_cfg cfg;
	struct sandbox *sb; /* NULL when none runs (idle-stopped, or --guest) */
	bool use;
	bool idle_stopped;	 /* stopped by the idle TTL; the next activity starts it */
	int64_t ttl_s;		 /* workspace.ttl_seconds; <= 0: no idle stop */
	uint64_t last_active_ms; /* last relay request or sync activity */
	uint64_t idle_timer;
	char describe[256];		/* kept while idle-stopped, for status */
	char boot[16];			/* sandbox_boot of the last start, for status */
	char dir[PATH_MAX];		/* its state directory, likewise */
	char guest_name[PATH_MAX + 32]; /* what conn.guest shows for a sandbox */
};

/* The sandbox's forks (up_fork.c; doc/SANDBOX.md "Forks"). */
struct up_forks {
	struct up_fork *list;
	uint64_t timer; /* the TTL sweep */
	unsigned next;	/* for generated names: f<next> */
	/* the parent's sandbox halted for a freeze (sandbox_halt), its
	 * teardown still under way; reaped by reap_timer, or before the
	 * parent starts again (up_fork_reap) */
	struct sandbox *halted;
	uint64_t reap_timer, halted_ms;
	struct up_try *tries; /* try ops under way (up_try.c) */
};

/* The supervisor (up_super.c): in the supervisor, the mount it keeps; in
 * a daemon it restarted, what it inherited and why it was restarted. */
struct up_super {
	int sock;		 /* daemon: the mount's node stream to the supervisor (keep.h) */
	struct mount_keep *keep; /* what the supervisor holds: the connection, node ids */
	unsigned short epoch;	 /* node id epoch; > 0: a restarted daemon */
	unsigned restarts;
	uint64_t crash_ms; /* CLOCK_REALTIME of the last crash, ms */
	char last_crash[128];
	pid_t daemon_pid;
};

/* Paths the guest could not apply: their retry (up_paths.c). */
struct up_paths {
	uint64_t timer;	      /* the next retry, 0: none */
	uint64_t retry_at_ms; /* loop_now_ms of it */
	uint64_t retries;     /* retries started */
	uint64_t sig;	      /* of the set last recorded (audit, the daemon's log) */
};
struct up {
	struct loop *loop;
	struct journal *journal;
	struct mount *mount;
	char dir[PATH_MAX];	  /* realpath of DIR */
	char state_dir[PATH_MAX]; /* audit_dir(DIR) */
	int dirfd, sigfd, lockfd, ready_fd;
	bool stopping;
	int stop_signal; /* the signal that stopped it (SIGINT: exit 130) */

	struct up_conn conn;
	struct up_sync sync;
	struct up_latency lat;
	struct up_status status;
	struct up_policy pol;
	struct up_exec exec;
	struct up_changes chg;
	struct up_sandbox sandbox;
	struct up_forks forks;
	struct up_super super;
	struct up_progress progress;
	struct up_paths paths;

	_Atomic uint64_t first_notify_ns; /* set by FUSE threads, taken by the loop */
	atomic_bool mount_gone;
	uint64_t mark_ns[UP_T_COUNT];
};

static inline void up_mark(struct up *u, enum up_mark m)
{
	if (!u->mark_ns[m])
		u->mark_ns[m] = loop_now_ns();
}

/* A change for the status file (written at most every STATUS_MIN_MS). */
static inline void up_mark_dirty(struct up *u)
{
	u->status.dirty = true;
}

/* ---- up_super.c ---- */

/* Fork the daemon and supervise it: returns 0 in the daemon, 1 when
 * another up holds the supervisor lock (said why) (also in each
 * restarted one, with u->super.epoch > 0); the supervisor never returns:
 * it exits with the daemon's status once the daemon stops cleanly, and
 * restarts it on the same mount when it dies after having handed the mount
 * over (up_super_hand_mount). Call before any thread exists. */
int up_supervise(struct up *u);

/* ---- up_daemon.c ---- */

/* The loop, the journal and the signalfd (SIGTERM, SIGINT, SIGHUP stop;
 * SIGUSR1 asks for a fresh status), with the loop's hooks. Blocks those
 * signals first: every thread started later (FUSE workers) inherits that.
 * 0, or -1 after saying why. */
int up_loop_init(struct up *u);
/* FUSE thread: the journal went from empty to non-empty. */
void up_on_journal_notify(void *ud);
/* FUSE thread: the session ended by itself (someone unmounted DIR). */
void up_on_mount_exit(void *ud);
/* Connect to the guest (starting the sandbox first if it is not running);
 * on failure the retry is scheduled. */
void up_connect(struct up *u);
/* Drop the connection after an engine or protocol failure; on_close
 * schedules the reconnect. why NULL: strerror(-err). */
void up_drop_conn(struct up *u, int err, const char *why);
/* The first reconcile of a connection finished: the guest is live. */
void up_conn_live(struct up *u);
/* Start the sandbox; its keys and address become the guest's (u->conn.g).
 * Blocks the loop for the start (bounded by SANDBOX_START_MS; ~10 ms for
 * local). */
int up_sandbox_begin(struct up *u, char *err, size_t errlen);
/* Start the idle TTL's timer (a sandbox with workspace.ttl_seconds). */
void up_sandbox_arm_idle(struct up *u);
/* Activity (a relay request, a journaled change): refresh the idle TTL and
 * start an idle-stopped sandbox again. */
void up_touch(struct up *u);

/* ---- up_sync.c ---- */

/* A sync engine on chan c for this connection. 0 or -errno. */
int up_sync_attach(struct up *u, struct chan *c);
/* A reconcile covering everything journaled so far. */
void up_sync_reconcile(struct up *u);
/* Begin the host's proof of an unchanged tree on a thread (sync_prescan_start),
 * once the mount is in place; without it the first reconcile proves it. */
void up_sync_prescan(struct up *u);
/* Live: move the journal into the pending set and push it (a push that
 * finishes at once leaves room for the next); coalesce while busy. */
void up_sync_pump(struct up *u);
/* Live, nothing running, nothing pending or journaled. */
bool up_sync_settled(struct up *u);
/* Journaled changes not yet on the guest (approximate: what status shows). */
size_t up_sync_pending(struct up *u);
/* Write the audit record (withheld.json) again: a retry after a failed write. */
void up_sync_save_audit(struct up *u);
/* The journal seq a command sent now comes after: applied_seq, or the
 * running operation's when all of its batches are in the channel
 * (sync_all_sent: the guest applies them before it reads the command). */
uint64_t up_sync_sent_seq(struct up *u);
/* Free the engines and the pending set. */
void up_sync_clear(struct up *u);
/* Push these paths again (with no content hint), or reconcile (full),
 * now or after the operation running. */
void up_sync_retry(struct up *u, const char *const *paths, size_t n, bool full);
/* ---- up_paths.c: paths the guest could not apply ---- */
/* An operation finished: record the set (audit, log) and arm the retry
 * (1 s doubling to 60 s after the freshest failure), or stop it. */
void up_paths_synced(struct up *u);
/* A command ended: retry now (it may have freed space in the guest). */
void up_paths_kick(struct up *u);
/* The connection is gone: no retry until the next one. */
void up_paths_clear(struct up *u);
/* A command passed its barrier: with paths missing in the guest, one
 * line on its stderr (true: send it), or with execution.barrier "fail"
 * false and that line in refusal (the caller ends the command with it). */
bool up_paths_gate(struct up *u, struct relay_cmd *cmd, char *refusal, size_t len);
/* The status file's "not_in_guest" object (a json_t *; NULL without
 * memory), and its lines in `airlock status` from a status document. */
void *up_paths_json(struct up *u);
void up_paths_print(void *status);

/* ---- up_exec.c ---- */

extern const struct relay_backend_ops up_backend_ops;
extern const struct egress_link_ops up_link_ops;
/* route.h: no credential is resolved for a command that cannot start. */
bool up_guest_ready(void *ud);
/* Send what has passed its barrier; answer satisfied sync_waits. */
void up_exec_kick(struct up *u);
/* Does a command or a sync_wait of the sandbox wait for its barrier? */
bool up_exec_barrier_waiting(const struct up *u);
/* End commands with an error (the connection is gone): all of them
 * (which = 0), only those sent to the guest (1), or only those still
 * waiting to be sent (2). */
void up_exec_fail_some(struct up *u, int which, const char *code, const char *msg);
/* A command of the daemon's own (relay_cmd_spawn with stdin_open) gets
 * its stdin from fd's first size bytes (dup'ed), sent as the stream's
 * windows allow, then EOF. 0, or -ENOENT when cmd has ended already. */
int up_exec_stdin_feed(struct up *u, struct relay_cmd *cmd, int fd, uint64_t size);
/* Room on the channel of fork f (NULL: the sandbox's): feeds go on. */
void up_exec_writable(struct up *u, const struct up_fork *f);
/* CHG_ITEM on a command's stream (up_changes_item for its command). */
void up_exec_chg_item(struct up *u, struct up_fork *f, uint32_t stream, const uint8_t *data, size_t n);
/* Frames 80..111 from the guest. */
void up_exec_frame(struct up *u, struct up_fork *f, uint8_t type, uint32_t stream, const uint8_t *data, size_t n);
/* An ERROR from the guest on a command's stream (e.g. an agent without
 * exec): ends that command. false when stream is no command's. */
bool up_exec_refused(struct up *u, struct up_fork *f, uint32_t stream, const char *msg);
/* The command on stream of fork f's channel (NULL: the sandbox's). */
struct xcmd *up_exec_find(struct up *u, const struct up_fork *f, uint32_t stream);
/* End fork f's commands with an error (its channel is gone). */
void up_exec_fail_fork(struct up *u, const struct up_fork *f, const char *code, const char *msg);
/* A command or sync_wait of the sandbox itself (not of a fork) is pending. */
bool up_exec_parent_busy(const struct up *u);
/* Free what is left of the commands and waiters (after relay_free). */
void up_exec_clear(struct up *u);

/* ---- up_fork.c ---- */

/* One fork of the sandbox: its own sandbox (namespaces, cgroup, agent,
 * keys) and channel, no sync (it never sees the host's later edits). */
struct up_fork {
	struct up *u;
	struct up_fork *next;
	char name[RELAY_FORK_NAME_MAX + 1];
	struct sandbox *sb;	    /* NULL once stopped (fork_changes, its agent died) */
	struct chan *chan;	    /* NULL: not connected */
	struct guest_opts g;	    /* its keys and address */
	struct egress_link *egress; /* the sandbox's policy, this fork's streams */
	bool ready;		    /* HELLO sent: commands may go */
	int64_t ttl_s;
	uint64_t created_ms, last_active_ms;
	double start_ms; /* its sandbox's start */
	char why[256];	 /* why it stopped, for status */
	/* a fork without an overlay upper (vm): what its agent reported its
	 * commands changed since the fork (NULL: nothing yet), and the pull
	 * of those paths under way (up_forkpull.c) */
	struct wb_forkset *reported;
	struct up_forkpull *pull;
};

extern const struct relay_fork_ops up_fork_ops;
/* Leftover forks of an earlier daemon (their agents died with it): removed
 * before the sandbox starts. */
void up_fork_init(struct up *u);
/* The fork an exec asks for, started again if it was stopped; NULL after
 * ending cmd with an error. */
struct up_fork *up_fork_for_exec(struct up *u, const char *name, struct relay_cmd *cmd);
/* Close f's channel after a protocol error from its agent. */
void up_fork_drop(struct up_fork *f, const char *why);
/* The forks for the status file (a JSON array, new reference). */
struct json_t *up_fork_status(struct up *u);
/* Put what a fork needs into its state (forks/<name>/) before its sandbox
 * starts: i is its index in the request. 0 or -errno with err set. */
typedef int up_fork_seed_fn(void *ud, unsigned i, const char *dir, const char *name, char *err, size_t errlen);
/* The fork op: the parent stopped for the freeze (vm: paused by each
 * make), q->count forks made and started; their figures into out. -EAGAIN when the sandbox is busy. */
int up_fork_make(struct up *u, const struct relay_fork_req *q, up_fork_seed_fn *seed, void *seed_ud, struct json_t *out,
		 char *err, size_t errlen);
/* Whether kind's forks' changes are an overlay upper the host reads
 * (local), else what each fork's agent reported (vm). */
bool up_fork_upper(const struct up *u);
/* The changes of the fork named name into out ("name", "changes"): with
 * an upper, the fork stopped first and "upper" its path; without, what its
 * agent reported (the fork goes on running). -ENOENT, -E2BIG (its reports
 * overflowed), -ENOMEM, with err. */
int up_fork_changes(struct up *u, const char *name, struct json_t *out, char *err, size_t errlen);
/* A CHG_ITEM of fork f's agent (on a command's stream): kept in
 * f->reported when f has no upper; a path that is not a workspace path
 * drops f's channel. */
void up_fork_chg_item(struct up_fork *f, const uint8_t *data, size_t n);
/* The fork named name, or NULL. */
struct up_fork *up_fork_find(struct up *u, const char *name);

/* ---- up_forkpull.c: a vm fork's reported changes pulled for a replay ---- */

/* The pull ended: err 0 and the archive (wb_replay: fd, size bytes, the
 * caller's to close) with its counts, or -errno with why. Called exactly
 * once, from the loop, never from inside up_forkpull_start. */
typedef void up_forkpull_done_fn(void *ud, int err, const char *why, int fd, uint64_t size, size_t nfiles,
				 size_t ndeleted);
/* Pull the paths fork f's agent reported (f->reported) over its channel,
 * every guest byte through the pull decoder (wb_pull: paths as asked,
 * sizes under workspace.writeback_max_mib, hashes), into a replay archive
 * (wb_replay) in an unnamed temporary of the state directory. 0 or -errno
 * with err (nothing started, done never called). */
int up_forkpull_start(struct up_fork *f, up_forkpull_done_fn *done, void *ud, char *err, size_t errlen);
/* A changes frame on f's channel: its pull's (true), or not (false). */
bool up_forkpull_frame(struct up_fork *f, uint8_t type, uint32_t stream, const uint8_t *data, size_t n);
/* End f's pull, if any, with why (its channel closed, it is removed):
 * done is told (err -ENOTCONN) from the loop. */
void up_forkpull_cancel(struct up_fork *f, const char *why);
/* Remove one fork (-ENOENT: none of that name). */
int up_fork_rm(struct up *u, const char *name, char *err, size_t errlen);
/* The parent's sandbox stopped and reaped (its state is nobody's mount
 * now; its next activity starts it again). -EAGAIN when busy. */
int up_fork_parent_quiesce(struct up *u, char *err, size_t errlen);

/* ---- up_try.c: the try op (doc/RELAY.md "try") ---- */

struct relay_try_req;
int up_try_start(void *ud, uint64_t token, const struct relay_try_req *q);
/* Forget every try (shutdown, before relay_free): their commands are
 * unwatched, nothing is answered. */
void up_try_clear(struct up *u);

/* The parent's halted sandbox (a fork's freeze) reaped: waited for (at
 * most SANDBOX_STOP_MS) when wait, else only if it is gone. Before the
 * parent's sandbox starts again: its cgroup and lock are the new one's. */
void up_fork_reap(struct up *u, bool wait);
/* Stop and remove every fork (shutdown). */
void up_fork_clear(struct up *u);

/* ---- up_changes.c ---- */

/* The store (state_dir/changes.json), the write-back key. 0, or -1 after
 * saying why. */
int up_changes_init(struct up *u);
void up_changes_clear(struct up *u);
/* CHG_ITEM on command x's stream. */
void up_changes_item(struct up *u, struct xcmd *x, const uint8_t *data, size_t n);
/* Ask the agent on c for paths[from..]: as many as one CHG_PULL carries
 * (*end: one past the last), their pull decoder (*wp, capped at max_bytes,
 * refusals naming cap_name, staged in the state directory) and the new
 * stream (*stream; 0 when none was opened). 0 or -errno (-EBUSY: no room
 * on c now); *wp and *stream are the caller's to free and close either way. */
int up_changes_ask(struct up *u, struct chan *c, char **paths, size_t from, size_t n, uint64_t max_bytes,
		   const char *cap_name, size_t *end, struct wb_pull **wp, uint32_t *stream);
/* workspace.writeback_max_mib in bytes: the cap on guest bytes pulled at once. */
uint64_t up_changes_cap(const struct up *u);
/* Frames of the changes group on a pull stream. */
void up_changes_frame(struct up *u, uint8_t type, uint32_t stream, const uint8_t *data, size_t n);
/* x exited: write back what auto mode takes, then relay_cmd_exit(cmd, ex)
 * with the counts. Takes x's reported paths; x may be freed afterwards. */
void up_changes_exit(struct up *u, struct xcmd *x, struct relay_cmd *cmd, const struct relay_exit *ex);
/* sync_cfg.keep: a guest change waits, the op is dropped. */
bool up_changes_keep(void *ud, const struct manifest_change *c);
/* A reconcile starts: load the last saved confirmed state. */
void up_changes_reconcile_begin(struct up *u);
/* A sync operation finished (full: a reconcile). */
void up_changes_synced(struct up *u, bool full);
/* Write the store and the confirmed state again: a retry after a failed write. */
void up_changes_save_state(struct up *u);
/* An ERROR from the guest on a pull's stream (too many pulls, an agent
 * without them): that pull fails. false when stream is no pull's. */
bool up_changes_refused(struct up *u, uint32_t stream, const char *msg);
/* The connection is gone: pulls in flight fail. */
void up_changes_conn_lost(struct up *u);
extern const struct relay_changes_ops up_changes_ops;

/* ---- up_status.c ---- */

/* Write the status file now. */
void up_status_write(struct up *u);
/* Write it if it changed: at once when settled (sync-wait and status wait
 * for that), else at most every STATUS_MIN_MS. */
void up_status_flush(struct up *u, bool settled);
/* The result of a write of file in the state directory: r < 0 (-errno:
 * ENOSPC, EROFS...) is said once on stderr and is the status's state_error
 * (airlock status fails with it) until a write of that file works again,
 * which is said too. */
void up_state_wrote(struct up *u, const char *file, int r);

/* ---- up_log.c: the daemon's log ---- */

/* From here on stderr also goes to state_dir's up.log, timestamped (and to
 * the terminal until up_log_detach). 0 or -errno (then nothing changed). */
int up_log_start(const char *state_dir);
/* The terminal's stderr while it is ours (-1 after up_log_detach): for
 * progress lines that are redrawn, not logged. */
int up_log_term_fd(void);
/* -d is in sync: stop echoing to the terminal; stdout goes to the log too. */
void up_log_detach(void);
/* Restore stdout and stderr, close the log. */
void up_log_stop(void);
/* 0, or the -errno of the last failed write to up.log (a full or
 * read-only state directory; the log cannot say it itself). */
int up_log_error(void);

/* ---- up_traps.c: refusals and warnings before anything starts ---- */

/* dir (a realpath) is a directory, not $HOME without allow_home, holds
 * none of airlock's own state, socket or sandbox directories, and is
 * neither inside nor around another live workspace. 0, or the exit status
 * after saying why and what to do. */
int up_check_workspace(const char *dir, bool allow_home);
/* /dev/fuse exists and is ours to open, and a user other than root has
 * fusermount3. 0, or the exit status after saying the cause and the fix. */
int up_check_fuse(void);
/* Name the processes whose cwd or open files are below dir: they keep
 * seeing the directory under the mount. */
void up_warn_processes(const char *dir);
/* fn for each process (but this one) whose cwd or an open file is below
 * dir: its pid, command and "cwd" or "open file PATH". How many. */
unsigned up_procs_below(const char *dir, void (*fn)(const char *pid, const char *comm, const char *what, void *ud),
			void *ud);

/* ---- up_state.c ---- */

/* pid of the daemon holding state_dir's pid file, 0 when none runs. */
pid_t up_daemon_pid(const char *state_dir);
/* The daemon's pid; while none runs but its supervisor does (a restart
 * after a crash), waiting up to ms for the new one. 0 when none. */
pid_t up_wait_daemon(const char *state_dir, unsigned ms);
/* The last status pid wrote says it was connected to the guest (so its
 * death was no crash loop at start). */
bool up_status_was_live(const char *state_dir, pid_t pid);
/* The supervisor's pid while it runs (super.pid locked), else 0. */
pid_t up_super_pid(const char *state_dir);
/* The supervisor's lock: its fd, or -errno (-EBUSY: *other holds it). */
int up_take_super_file(const char *state_dir, pid_t *other);
/* Take the pid file for this process. 0, or -EBUSY (*other = its pid). */
int up_take_pid_file(struct up *u, pid_t *other);
/* The status and pid files go (while still holding the lock). */
void up_remove_state_files(struct up *u);
/* State dir of dir; clears a stale mount that hides dir first if needed.
 * 0, or -1 after saying why. */
int up_state_dir_of(const char *dir, char *out, size_t n);
/* down --destroy: the files of state_dir that describe the guest's copy
 * go (up_changes.c). 0, or -errno with err set. */
int up_changes_forget(const char *state_dir, char *err, size_t errlen);
/* Usage of down, status or sync-wait (cmd), to stderr. */
void up_wait_usage(const char *cmd);

#endif
