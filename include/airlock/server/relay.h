/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_RELAY_H
#define AIRLOCK_RELAY_H

/*
 * relay: the per-workspace Unix socket that editor extensions (and people)
 * talk to. Newline-delimited JSON, one object per line; the protocol is
 * specified in doc/RELAY.md (the two change together: change
 * RELAY_PROTOCOL_VERSION when you change what goes over the socket).
 *
 * The relay owns the socket, the client connections, request validation,
 * and per-command output rings; it does not run anything. Execution is a
 * *backend* (struct relay_backend_ops): the host daemon implements it by
 * talking to the guest agent over the channel, tests implement it with a
 * deterministic simulator.
 *
 * Threading: everything runs on the loop's thread. Every relay_* function,
 * including the backend -> relay calls (relay_cmd_*, relay_sync_done), must
 * be called from that thread; no call blocks.
 *
 * Errors: functions return 0 or -errno.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "airlock/core/loop.h"

/* Change this if you change the protocol (doc/RELAY.md). Sent in `hello`.
 * 3: exec's "cancel_on_close". */
#define RELAY_PROTOCOL_VERSION 3

/* Defaults for struct relay_cfg fields left 0. */
#define RELAY_LINE_MAX		((size_t)1 << 20)   /* request line, without '\n' */
#define RELAY_RING_BYTES	((size_t)1 << 20)   /* kept output per stream per command */
#define RELAY_CLIENT_QUEUE	((size_t)256 << 10) /* per client: stop producing above this */
#define RELAY_MAX_CLIENTS	64
#define RELAY_MAX_RUNNING	128 /* commands not yet finished */
#define RELAY_KEEP_FINISHED	64  /* finished commands kept for status/attach */
#define RELAY_DEFAULT_TIMEOUT_S 300

struct relay;
struct relay_cmd;

struct relay_cfg {
	const char *path;	/* socket path (relay_default_path); required */
	unsigned timeout_s;	/* exec default when the request gives none */
	size_t line_max;	/* 0 = RELAY_LINE_MAX */
	size_t ring_bytes;	/* 0 = RELAY_RING_BYTES */
	size_t client_queue;	/* 0 = RELAY_CLIENT_QUEUE */
	unsigned max_clients;	/* 0 = RELAY_MAX_CLIENTS */
	unsigned max_running;	/* 0 = RELAY_MAX_RUNNING */
	unsigned keep_finished; /* 0 = RELAY_KEEP_FINISHED */
};

enum relay_stream {
	RELAY_STDOUT = 0,
	RELAY_STDERR = 1,
};

/* One validated exec request, as the backend gets it. Every pointer is the
 * relay's and valid only during exec_start: copy what you keep. */
struct relay_exec_req {
	const char *const *argv; /* argc strings; for "shell" this is {"sh","-c",S} */
	size_t argc;
	bool shell;		/* the request used "shell" */
	const char *cwd;	/* relative to the workspace root, no "..", "" = root;
				 * checked syntactically only: the guest confines */
	const char *const *env; /* nenv "NAME=value" strings, names validated */
	size_t nenv;
	uint64_t timeout_ms; /* > 0 */
	bool tty;
	uint16_t rows, cols; /* when tty */
	bool stdin_open;     /* stdin comes through ops->stdin_write; else /dev/null */
	/* The forwarded environment layer (policy forward_env and
	 * credentials.inject values, "NAME=value"), below env. The relay
	 * leaves it empty; the daemon's router (route.h) fills it. Secret:
	 * never log it, wipe copies. */
	const char *const *forwarded;
	size_t nforwarded;
	/* "fork": run in the sandbox's fork of this name (1..RELAY_FORK_NAME_MAX
	 * of a-z, 0-9, '-', '_'; checked syntactically only); NULL: the sandbox */
	const char *fork;
};

struct relay_exit {
	int code;	/* exit status 0..255, or -1 when killed by a signal */
	int signal;	/* signal number, 0 when it exited */
	bool timed_out; /* the timeout fired (and killed it) */
	uint64_t duration_ms;
	/* guest changes it made (doc/RELAY.md "Changes"): when `changes`, the
	 * exit event carries {"written_back": N, "waiting": M} */
	bool changes;
	uint64_t written_back, waiting;
};

/*
 * The backend: how commands really run. Every function returns 0 or
 * -errno; a negative return becomes a `backend_error` event for the client
 * that asked (-EAGAIN becomes `busy`). None may block.
 *
 * Lifetime of a struct relay_cmd: the relay creates it and calls
 * exec_start. If exec_start fails, the backend must not keep or use cmd.
 * Otherwise the backend reports progress with relay_cmd_started/_output
 * and ends it with exactly one relay_cmd_exit or relay_cmd_error; after
 * that call it must not use cmd again. Should the relay be freed first, it
 * calls release(cmd) for each command not yet ended, after which the same
 * holds.
 */
struct relay_backend_ops {
	/* Start a command. Must be ordered after every change journaled before
	 * this call (the barrier, doc/RELAY.md "Requests"): the daemon sends it on
	 * the same ordered channel as the deltas. */
	int (*exec_start)(void *ud, struct relay_cmd *cmd, const struct relay_exec_req *req);
	/* Bytes for the command's stdin (n may be 0), then EOF if eof. -EAGAIN
	 * when the backend cannot take them now (the client gets `busy`). */
	int (*stdin_write)(void *ud, struct relay_cmd *cmd, const void *data, size_t n, bool eof);
	/* Deliver signal signo (Linux numbering) to the command's process group. */
	int (*signal)(void *ud, struct relay_cmd *cmd, int signo);
	/* New tty window size. */
	int (*resize)(void *ud, struct relay_cmd *cmd, uint16_t rows, uint16_t cols);
	/* Stop the command (TERM, grace, KILL on the whole tree); it still ends
	 * with relay_cmd_exit. */
	int (*cancel)(void *ud, struct relay_cmd *cmd);
	/* Flow control: paused = true asks the backend to stop reading the
	 * command's output (stop granting channel credit) until called again
	 * with false. Bytes already in flight are still accepted. */
	void (*pause)(void *ud, struct relay_cmd *cmd, bool paused);
	/* Call relay_sync_done(relay, token) once every change journaled before
	 * this call is applied in the guest. */
	int (*sync_wait)(void *ud, uint64_t token);
	/* relay_free is dropping cmd while it still runs: forget it (and
	 * cancel it if you like). */
	void (*release)(void *ud, struct relay_cmd *cmd);
};

/* Create the relay: bind and listen on cfg->path (mode 0600; a stale socket
 * there is replaced only when nothing accepts on it), register with the
 * loop. ops and ud must outlive the relay. Returns -EADDRINUSE when a live
 * relay already listens there, -EEXIST when the path is not a socket,
 * -ENAMETOOLONG, -ENOMEM, or the errno of the socket calls. */
int relay_new(struct loop *l, const struct relay_cfg *cfg, const struct relay_backend_ops *ops, void *ud,
	      struct relay **out);

/* Close every client and the socket, unlink it, free every command
 * (release() for those still running). NULL is a no-op. */
void relay_free(struct relay *r);

/* The socket path (owned by the relay). */
const char *relay_path(const struct relay *r);

/*
 * Socket path for a workspace: $AIRLOCK_SOCKET when set and non-empty;
 * else DIR/<name>-<hash>.sock where <name> is the workspace's base name
 * (sanitised, at most 32 bytes), <hash> 16 hex digits of SHA-256 of
 * workspace_realpath, and DIR the first of $XDG_RUNTIME_DIR/airlock,
 * /run/user/<uid>/airlock (if /run/user/<uid> exists), /tmp/airlock-<uid>.
 * DIR is created with mode 0700 if missing and must be a real directory
 * (not a symlink) owned by us and not group or world writable (-EPERM
 * otherwise). -ENAMETOOLONG when the result does not fit n bytes or a
 * socket address.
 */
int relay_default_path(const char *workspace_realpath, char *out, size_t n);

/* Remove the relay sockets of daemons that died without removing theirs
 * (kill -9, a crash) from sock_path's directory: every "*.sock" socket we
 * own there on which nothing accepts (connect refused), never a symlink or
 * another file, none made in the last 2 s (bound, not yet listening),
 * only in a private directory as relay_default_path makes it. *removed
 * counts them. 0 or -errno. */
int relay_sweep_stale(const char *sock_path, unsigned *removed);

/* Memory and state figures, for tests and `airlock status`. */
struct relay_stats {
	size_t clients;
	size_t running;	       /* commands not yet ended */
	size_t finished;       /* ended commands kept */
	size_t paused;	       /* commands whose output the relay has paused */
	size_t bytes_buffered; /* allocated output rings + client queues + input buffers */
};
void relay_get_stats(const struct relay *r, struct relay_stats *st);

/* ---- backend -> relay ---- */

/* The command is running in the guest as pid. */
void relay_cmd_started(struct relay_cmd *cmd, int64_t pid);
/* The command is running on the host as pid (execution.local): the
 * started event and status say "where":"host" instead of "guest". */
void relay_cmd_started_host(struct relay_cmd *cmd, int64_t pid);
/* Output bytes (copied). Always accepted: the relay keeps the last
 * ring_bytes of each stream and uses ops->pause to hold the rest back. */
void relay_cmd_output(struct relay_cmd *cmd, enum relay_stream s, const void *data, size_t n);
/* The command ended. Ends the backend's use of cmd. */
void relay_cmd_exit(struct relay_cmd *cmd, const struct relay_exit *ex);
/* The command failed (could not start, or the guest session went away).
 * code is a protocol error code (snake_case, e.g. "backend_error",
 * "spawn_failed"), message says what happened. Ends the backend's use of cmd. */
void relay_cmd_error(struct relay_cmd *cmd, const char *code, const char *message);
/* The sync_wait with this token is satisfied. Unknown tokens are ignored. */
void relay_sync_done(struct relay *r, uint64_t token);

/* ---- guest changes: the changes, accept and reject ops (doc/RELAY.md "Changes") ---- */

struct relay_changes_req {
	const char *op;		  /* "changes", "accept" or "reject" */
	const char *const *paths; /* npaths workspace-relative paths; none: every change */
	size_t npaths;
	bool all;  /* accept / reject: "all": true */
	bool diff; /* changes: the guest's content of text files too (for a diff) */
};

struct relay_changes_ops {
	/* Answer later, exactly once, with relay_changes_done(token). 0 or
	 * -errno (the client gets backend_error). */
	int (*request)(void *ud, uint64_t token, const struct relay_changes_req *req);
};

/* Serve the changes ops through ops (without: they answer unavailable). */
void relay_set_changes(struct relay *r, const struct relay_changes_ops *ops, void *ud);
/* The answer to a changes request: body a JSON object as text, to which the
 * relay adds "event" and "id"; or, with body NULL, an error event
 * with code and message. Unknown tokens (the client left) are ignored. */
void relay_changes_done(struct relay *r, uint64_t token, const char *event, const char *body, const char *code,
			const char *message);

/* ---- forks of the sandbox: the fork, fork_rm, forks and fork_changes ops (doc/RELAY.md "Forks") ---- */

#define RELAY_FORK_NAME_MAX 32
#define RELAY_FORKS_MAX	    16 /* names in one request, forks made by one request */

struct relay_fork_req {
	const char *op;		  /* "fork", "fork_rm", "forks" or "fork_changes" */
	const char *const *names; /* nnames valid fork names (fork: optional; fork_changes: one) */
	size_t nnames;
	unsigned count; /* fork: how many (1..RELAY_FORKS_MAX; with names, their number) */
	int64_t ttl_s;	/* fork: idle seconds before a fork is removed; 0: the default */
	bool all;	/* fork_rm: every fork */
};

/* try (doc/RELAY.md "try"): one fork per variant, its patch applied there,
 * its command run in all of them at once, the winner's changes replayed in
 * the sandbox as its guest changes. Everything is the relay's, valid only
 * during try_start: copy what you keep. */
#define RELAY_TRY_VARIANTS_MAX 8
#define RELAY_TRY_NAME_MAX     16 /* a variant's name: [a-z0-9][a-z0-9_-]* */
struct relay_try_variant {
	const char *name;
	const char *patch; /* a unified diff (text, -p1), or NULL */
	size_t patch_len;
	const char *const *argv; /* its own command, or NULL: the request's */
	size_t argc;
};
struct relay_try_req {
	const struct relay_try_variant *variants;
	size_t nvariants;	 /* 1..RELAY_TRY_VARIANTS_MAX, names distinct */
	const char *const *argv; /* the command of every variant without its own (argc may be 0
				    when each has one) */
	size_t argc;
	uint64_t timeout_ms;	 /* per command, > 0 */
	const char *pick;	 /* the winner by name, or NULL: the first to exit 0 */
	const char *const *keep; /* variants whose forks are kept (names checked by the relay) */
	size_t nkeep;
	bool keep_all;
};

struct relay_fork_ops {
	/* Answer later, exactly once, with relay_changes_done(token) (the same
	 * one-answer mechanism as the changes ops). 0 or -errno. */
	int (*request)(void *ud, uint64_t token, const struct relay_fork_req *req);
	/* try: events on the way with relay_request_event, then exactly one
	 * relay_changes_done(token). 0 or -errno. */
	int (*try_start)(void *ud, uint64_t token, const struct relay_try_req *req);
};

/* An event for a pending request (try's try_output, try_variant) without
 * ending it: body a JSON object as text, to which the relay adds "event"
 * and the request's "id". Unknown tokens (the client left) are ignored.
 * -EAGAIN (the event dropped) while the client's queue is above its
 * bound (client_queue): a client that does not read is not queued for
 * without limit. */
int relay_request_event(struct relay *r, uint64_t token, const char *event, const char *body);

/* A command of the backend's own (try's patches and runs): no client
 * asked for it, w is told its output and its end. It is the relay's like
 * any other (status lists it under id, a JSON string; attach and cancel
 * work). w->ended may be called before this returns (the backend refused
 * it at once); after ended, w is never called again for it. 0, or -errno
 * (-EEXIST: a command of that id exists; -EAGAIN: too many running;
 * nothing started, w never called). *out: the command, valid until ended
 * (NULL once ended is called, or on failure: the caller clears it). */
struct relay_cmd_watch {
	void (*output)(void *ud, enum relay_stream s, const void *data, size_t n);
	/* ex: its exit; NULL when it failed (code, message: why) */
	void (*ended)(void *ud, const struct relay_exit *ex, const char *code, const char *message);
};
int relay_cmd_spawn(struct relay *r, const char *id, const struct relay_exec_req *req, const struct relay_cmd_watch *w,
		    void *ud, struct relay_cmd **out);
/* *out of relay_cmd_spawn, valid until its ended: w is not called any more
 * (the backend's watcher goes away first, e.g. at shutdown). */
void relay_cmd_unwatch(struct relay_cmd *cmd);

/* Serve the fork ops through ops (without: they answer unavailable). */
void relay_set_forks(struct relay *r, const struct relay_fork_ops *ops, void *ud);
/* [a-z0-9][a-z0-9_-]{0,RELAY_FORK_NAME_MAX-1} */
bool relay_fork_name_ok(const char *s);

/* A slot for the backend's own per-command state. */
void relay_cmd_set_data(struct relay_cmd *cmd, void *data);
void *relay_cmd_data(const struct relay_cmd *cmd);
/* The request id as compact JSON (e.g. "\"build-1\"" or "7"), for logs. */
const char *relay_cmd_name(const struct relay_cmd *cmd);

#endif
