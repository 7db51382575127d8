/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SERVER_I_H
#define AIRLOCK_SERVER_I_H

/*
 * Private to the files of relay/server: the relay's objects and what the
 * files call across each other. The public contract is
 * include/airlock/server/relay.h; the protocol is doc/RELAY.md.
 *
 *   relay.c   the server object: listening socket, accept and the peer
 *             check, housekeeping, lifecycle, stats, the default path
 *   client.c  one connection: reading lines, queueing events, writing,
 *             back-pressure on the connection
 *   cmd.c     the commands: registry, and the backend -> relay calls
 *   ring.c    per-command output rings and the subscriptions that read
 *             them (streaming, tails, replay for attach, pausing)
 *   events.c  how each event is encoded
 *   ops.c     request parsing, validation and the ops (dispatch table)
 *
 * Everything runs on the loop's thread (relay.h).
 */

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/core/buf.h"
#include "airlock/server/relay.h"

#define OUT_CHUNK ((size_t)16 << 10) /* raw bytes per stdout/stderr event */

enum cmd_state { CMD_STARTING, CMD_RUNNING, CMD_EXITED, CMD_FAILED };
/* Indexed by enum cmd_state and enum relay_stream: the protocol's names. */
extern const char *const relay_state_names[];
extern const char *const relay_stream_names[];

/* The last `max` bytes of a stream: byte at absolute offset o lives at
 * p[o % cap] while end - len <= o < end. Grows by doubling up to max. */
struct ring {
	uint8_t *p;
	size_t cap, max, len;
	uint64_t end;
};

enum sub_mode { SUB_STREAM, SUB_TAIL };

/* A client joined to a command: it is on both lists and freed with
 * either. */
struct sub {
	struct client *c;
	struct relay_cmd *cmd;
	struct sub *cnext, *cprev; /* client's list */
	struct sub *mnext, *mprev; /* command's list */
	enum sub_mode mode;
	uint64_t cur[2]; /* next offset to send, per stream */
	size_t tail[2];	 /* SUB_TAIL: bytes wanted */
	bool started_sent;
	bool truncated; /* this subscriber missed bytes */
	bool b64;	/* "encoding":"base64": output events always carry data_b64 */
	unsigned turn;
};

struct relay_cmd {
	struct relay *r;
	struct relay_cmd *next, *prev; /* r->cmds, creation order */
	char *key;		       /* compact JSON of id */
	json_t *id;
	json_t *argv; /* trimmed copy for status */
	bool shell, tty, stdin_open, stdin_eof;
	enum cmd_state state;
	int64_t pid;
	bool has_pid;
	bool on_host; /* execution.local: runs on the host, not in the guest */
	uint64_t started_wall_ms, start_ms, end_ms;
	struct ring ring[2];
	struct relay_exit ex;
	char *err_code, *err_msg;
	struct sub *subs;
	bool pause_want, pause_told;
	bool live; /* the backend holds it: exec_start succeeded, not yet ended */
	void *data;
	const struct relay_cmd_watch *watch; /* relay_cmd_spawn's, or NULL */
	void *watch_ud;
	/* "cancel_on_close": the connection that started it, whose end cancels
	 * it (relay_cmd_orphan); NULL once that is done or when not asked */
	struct client *owner;
	bool cancel_due; /* its owner is gone and the cancel is still to be sent */
};

struct client {
	struct relay *r;
	int fd;
	struct client *next, *prev;
	struct buf in, out;
	uint32_t events;
	bool discarding, rd_eof, dead, in_busy;
	bool in_pending;   /* complete lines wait until the output queue drains */
	uint64_t produced; /* bytes ever queued, to see progress */
	struct sub *subs;
	unsigned nsync;
};

struct pending_sync {
	uint64_t token;
	struct client *c; /* NULL once the client is gone */
	json_t *id;
	bool changes; /* a changes/accept/reject op, not a sync_wait */
	struct pending_sync *next;
};

struct relay {
	struct loop *l;
	char *path;
	int fd;
	const struct relay_backend_ops *ops;
	void *ud;
	unsigned timeout_s;
	size_t line_max, ring_bytes, queue;
	unsigned max_clients, max_running, keep_finished;
	struct client *clients;
	size_t nclients;
	struct relay_cmd *cmds, *cmds_tail;
	size_t nrunning, nfinished;
	struct pending_sync *syncs;
	const struct relay_changes_ops *chg_ops;
	void *chg_ud;
	const struct relay_fork_ops *fork_ops;
	void *fork_ud;
	uint64_t next_token;
	uint64_t hk_timer;
	uint64_t cancel_timer; /* retries relay_cmd_cancel_due */
	uint8_t scratch[OUT_CHUNK];
};

/* ---- relay.c ---- */

/* Run housekeeping (frees, pause changes) from a 0 ms timer, with nothing
 * of ours on the stack: see the re-entrancy note in relay.c. */
void relay_kick(struct relay *r);
/* Best effort single error line to a connection we are about to close;
 * closes fd. */
void relay_refuse(int fd, const char *code, const char *msg);

/* ---- client.c ---- */

/* A new connection on fd, admitted by relay.c (taken: refused and closed
 * on failure): registered with the loop, greeted with `hello`. */
void relay_client_new(struct relay *r, int fd);
/* Unlink and free (only from housekeeping or relay_free). */
void relay_client_free(struct client *c);
/* Mark the client dead; housekeeping frees it. */
void relay_client_fail(struct client *c);
/* Queue one event line; steals ev (NULL: nothing is sent). */
void relay_client_send(struct client *c, json_t *ev);
/* Queue an output event with base64 data, encoded by hand (events.c has
 * the shape). */
void relay_client_send_b64(struct client *c, const char *stream, json_t *id, uint64_t off, const uint8_t *p, size_t n);
/* Do everything c can do now without blocking; input = true only from c's
 * own fd callback. */
void relay_client_service(struct client *c, bool input);

/* ---- cmd.c ---- */

bool relay_cmd_ended(const struct relay_cmd *m);
/* The command whose key (compact JSON of its id) is key, or NULL. */
struct relay_cmd *relay_cmd_find(struct relay *r, const char *key);
/* A new STARTING command at the end of r->cmds, counted as running; takes
 * key. NULL when out of memory (key is then still the caller's). */
struct relay_cmd *relay_cmd_new(struct relay *r, char *key, json_t *id, const struct relay_exec_req *req);
/* Unlink and free; the backend no longer holds m (or never did). */
void relay_cmd_free(struct relay_cmd *m);
/* c is going away: the commands it started with "cancel_on_close" lose
 * their owner and, when still running, are canceled (from housekeeping:
 * ops->cancel may end a command from inside). */
void relay_cmd_orphan(struct relay *r, struct client *c);
/* Send the cancels relay_cmd_orphan made due (from housekeeping); those
 * the backend answers busy stay due: true when some do. */
bool relay_cmd_cancel_due(struct relay *r);

/* ---- ring.c ---- */

void relay_ring_init(struct ring *g, size_t max);
void relay_ring_clear(struct ring *g);
/* Offset of the oldest byte kept. */
uint64_t relay_ring_start(const struct ring *g);
/* Copy [off, off+n) out; the caller checked it is inside the ring. */
void relay_ring_read(const struct ring *g, uint64_t off, uint8_t *dst, size_t n);
/* Keep src[0..n), dropping the oldest bytes beyond max. */
void relay_ring_append(struct ring *g, const uint8_t *src, size_t n);

struct sub *relay_sub_find(struct client *c, struct relay_cmd *m);
struct sub *relay_sub_new(struct client *c, struct relay_cmd *m, enum sub_mode mode);
void relay_sub_free(struct sub *s);
/* Produce at most one event for s. Returns true if it did (s may be gone). */
bool relay_sub_step(struct sub *s);
/* Recompute whether m's output should be paused (hysteresis on the lag of
 * its streaming subscribers); a change is told to the backend from
 * housekeeping. */
void relay_cmd_update_pause(struct relay_cmd *m);

/* ---- events.c ---- */

/* {"event":name,"id":id} (no "id" when id is NULL), or NULL. */
json_t *relay_ev_new(const char *name, json_t *id);
/* Length of a chunk of p[0..n) that does not end inside a multi-byte
 * sequence (n itself when it ends cleanly or no cut point is near). */
size_t relay_utf8_cut(const uint8_t *p, size_t n);
/* Put p[0..n) into o as `field` (text, when valid UTF-8) or `field`_b64. */
void relay_put_data(json_t *o, const char *field, const uint8_t *p, size_t n);

void relay_send_error(struct client *c, json_t *id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void relay_send_ok(struct client *c, json_t *id, const char *op);

json_t *relay_ev_hello(const struct relay *r);
json_t *relay_ev_started(const struct relay_cmd *m);
json_t *relay_ev_dropped(const struct relay_cmd *m, int stream, uint64_t off, uint64_t bytes);
/* A text output event; the data is text when valid UTF-8, else data_b64. */
json_t *relay_ev_output(const struct relay_cmd *m, int stream, uint64_t off, const uint8_t *p, size_t n);
/* The error event of a failed command. */
json_t *relay_ev_failed(const struct relay_cmd *m);
/* `exit` (streaming) or `result` (tail, with the tails of both streams) for
 * an exited command; NULL when out of memory. */
json_t *relay_ev_exit(const struct sub *s);
json_t *relay_ev_attached(const struct relay_cmd *m, json_t *id, const uint64_t at[2]);
/* `status`: every command of the relay; NULL when out of memory. */
json_t *relay_ev_status(const struct relay *r, json_t *id);

/* ---- ops.c ---- */

/* One request line (without its '\n'): parse, validate, dispatch. */
void relay_handle_line(struct client *c, const char *p, size_t n);

#endif
