/* SPDX-License-Identifier: Apache-2.0 */
/*
 * relay: the per-workspace Unix socket server (protocol: doc/RELAY.md).
 *
 * Shape. Clients send request lines; each request is validated here and
 * handed to the backend. Commands are global to the relay (keyed by the
 * compact JSON of their request id), not to the client that started them,
 * so they outlive it. Output from the backend goes into a per-command,
 * per-stream ring holding the last ring_bytes bytes; offsets are absolute
 * byte counts since the command started.
 *
 * Pull, not push. A client is joined to a command by a subscription (sub)
 * that holds a read cursor per stream. Events are produced from the rings
 * into the client's output queue only while that queue is below
 * client_queue bytes, so a client that stops reading costs at most one
 * queue and its cursors fall behind inside the ring. When any streaming
 * subscriber of a command lags more than half a ring, the relay asks the
 * backend to pause that command (ops->pause), and resumes it below a
 * quarter: a slow client stalls its own command, never the loop or the
 * other commands. A command with no subscriber runs freely; whatever falls
 * out of its ring is reported as `dropped` to whoever attaches later.
 *
 * Re-entrancy. Backend calls may arrive from inside ops calls (a backend
 * may answer exec_start synchronously). Everything that could free a
 * client or a command, and every ops->pause call, is therefore deferred to
 * a 0 ms housekeeping timer, which runs with nothing of ours on the stack.
 */
#include "airlock/server/relay.h"

#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

#define READ_CHUNK	  ((size_t)64 << 10)
#define OUT_CHUNK	  ((size_t)16 << 10) /* raw bytes per stdout/stderr event */
#define OUT_HARD_EXTRA	  ((size_t)4 << 20)  /* replies beyond client_queue before we give up on a client */
#define ID_MAX		  256
#define ARGV_MAX	  4096
#define ENV_MAX		  1024
#define ENV_NAME_MAX	  255
#define CWD_MAX		  4096
#define STATUS_ARGV_BYTES 1024 /* argv kept for `status` */
#define SYNC_PER_CLIENT	  64
#define TIMEOUT_MAX_S	  (30.0 * 24 * 3600)
#define SERVICE_ROUNDS	  64

enum cmd_state { CMD_STARTING, CMD_RUNNING, CMD_EXITED, CMD_FAILED };
static const char *const state_names[] = {"starting", "running", "exited", "failed"};
static const char *const stream_names[] = {"stdout", "stderr"};

/* The last `max` bytes of a stream: byte at absolute offset o lives at
 * p[o % cap] while end - len <= o < end. Grows by doubling up to max. */
struct ring {
	uint8_t *p;
	size_t cap, max, len;
	uint64_t end;
};

enum sub_mode { SUB_STREAM, SUB_TAIL };

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
	uint64_t next_token;
	uint64_t hk_timer;
	uint8_t scratch[OUT_CHUNK];
};

/* ------------------------------------------------------------------ */
/* small helpers */

static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

static void housekeeping(struct loop *l, void *ud);

static void kick(struct relay *r)
{
	if (!r->hk_timer)
		r->hk_timer = loop_add_timer(r->l, 0, housekeeping, r);
}

/* ------------------------------------------------------------------ */
/* ring */

static void ring_init(struct ring *g, size_t max)
{
	memset(g, 0, sizeof(*g));
	g->max = max;
}

static void ring_clear(struct ring *g)
{
	mem_free(g->p);
	g->p = NULL;
	g->cap = g->len = 0;
}

static uint64_t ring_start(const struct ring *g)
{
	return g->end - g->len;
}

static void ring_put_at(uint8_t *p, size_t cap, uint64_t off, const uint8_t *src, size_t n)
{
	size_t at = (size_t)(off % cap);
	size_t first = cap - at < n ? cap - at : n;

	memcpy(p + at, src, first);
	memcpy(p, src + first, n - first);
}

/* Copy [off, off+n) out; the caller checked it is inside the ring. */
static void ring_read(const struct ring *g, uint64_t off, uint8_t *dst, size_t n)
{
	size_t at = (size_t)(off % g->cap);
	size_t first = g->cap - at < n ? g->cap - at : n;

	memcpy(dst, g->p + at, first);
	memcpy(dst + first, g->p, n - first);
}

static void ring_append(struct ring *g, const uint8_t *src, size_t n)
{
	if (n == 0 || g->max == 0)
		return;
	if (g->len + n > g->cap && g->cap < g->max) {
		size_t want = g->cap ? g->cap : 4096;

		while (want < g->len + n && want < g->max)
			want *= 2;
		if (want > g->max)
			want = g->max;
		uint8_t *np = mem_alloc(want);
		if (np) {
			/* Re-place the kept bytes at their new positions. */
			uint64_t s = ring_start(g);
			size_t done = 0;
			while (done < g->len) {
				size_t k = g->len - done < OUT_CHUNK ? g->len - done : OUT_CHUNK;
				uint8_t tmp[256];
				for (size_t i = 0; i < k; i += sizeof(tmp)) {
					size_t m = k - i < sizeof(tmp) ? k - i : sizeof(tmp);
					ring_read(g, s + done + i, tmp, m);
					ring_put_at(np, want, s + done + i, tmp, m);
				}
				done += k;
			}
			mem_free(g->p);
			g->p = np;
			g->cap = want;
		}
		/* On failure keep the old size: older bytes get overwritten sooner. */
	}
	if (g->cap == 0) {
		g->end += n; /* nothing kept */
		return;
	}
	if (n >= g->cap) {
		src += n - g->cap;
		g->end += n - g->cap;
		n = g->cap;
	}
	ring_put_at(g->p, g->cap, g->end, src, n);
	g->end += n;
	g->len = g->len + n > g->cap ? g->cap : g->len + n;
}

/* ------------------------------------------------------------------ */
/* UTF-8 */

/* Length of a chunk of p[0..n) that does not end inside a multi-byte
 * sequence (n itself when it ends cleanly or no cut point is near). */
static size_t utf8_cut(const uint8_t *p, size_t n)
{
	for (size_t back = 1; back <= 4 && back <= n; back++) {
		uint8_t b = p[n - back];
		if ((b & 0xc0) == 0x80)
			continue;
		size_t need = b < 0x80		   ? 1
			      : (b & 0xe0) == 0xc0 ? 2
			      : (b & 0xf0) == 0xe0 ? 3
			      : (b & 0xf8) == 0xf0 ? 4
						   : 1;
		if (need > back && n - back > 0)
			return n - back;
		return n;
	}
	return n;
}

/* Put p[0..n) into o as `field` (text, when valid UTF-8) or `field`_b64. */
static void put_data(json_t *o, const char *field, const uint8_t *p, size_t n)
{
	json_t *s = json_stringn((const char *)p, n);
	char name[32];

	if (s) {
		json_object_set_new(o, field, s);
		return;
	}
	size_t blen = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
	char *b = mem_alloc(blen);
	if (!b)
		return;
	sodium_bin2base64(b, blen, p, n, sodium_base64_VARIANT_ORIGINAL);
	snprintf(name, sizeof(name), "%s_b64", field);
	json_object_set_new(o, name, json_string(b));
	mem_free(b);
}

/* ------------------------------------------------------------------ */
/* sending */

static void client_fail(struct client *c)
{
	if (!c->dead) {
		c->dead = true;
		kick(c->r);
	}
}

/* Queue one event line; steals ev. */
static void client_send(struct client *c, json_t *ev)
{
	char *s;

	if (!ev)
		return;
	if (c->dead) {
		json_decref(ev);
		return;
	}
	s = json_dumps(ev, JSON_COMPACT);
	json_decref(ev);
	if (!s) {
		client_fail(c);
		return;
	}
	size_t n = strlen(s);
	if (buf_put(&c->out, s, n) < 0 || buf_put_u8(&c->out, '\n') < 0)
		client_fail(c); /* a client that never reads but keeps asking */
	else
		c->produced += n + 1;
	mem_free(s);
}

/* An output event with base64 data, made without a JSON tree: the fixed
 * shape {"event":S,"id":ID,"offset":N,"data_b64":"..."} (ID encoded by
 * jansson; base64 needs no escaping). Same queueing as client_send. */
static void client_send_b64(struct client *c, const char *stream, json_t *id, uint64_t off, const uint8_t *p, size_t n)
{
	char head[96];
	char *ids = NULL, *b = NULL;
	size_t blen = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);

	if (c->dead)
		return;
	if (!(ids = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY)) || !(b = mem_alloc(blen))) {
		mem_free(ids);
		client_fail(c);
		return;
	}
	sodium_bin2base64(b, blen, p, n, sodium_base64_VARIANT_ORIGINAL);
	int hn = snprintf(head, sizeof(head), "{\"event\":\"%s\",\"id\":", stream);
	char mid[64];
	int mn = snprintf(mid, sizeof(mid), ",\"offset\":%llu,\"data_b64\":\"", (unsigned long long)off);
	size_t idn = strlen(ids), bn = strlen(b);
	if (buf_put(&c->out, head, (size_t)hn) < 0 || buf_put(&c->out, ids, idn) < 0 ||
	    buf_put(&c->out, mid, (size_t)mn) < 0 || buf_put(&c->out, b, bn) < 0 || buf_put(&c->out, "\"}\n", 3) < 0)
		client_fail(c);
	else
		c->produced += (size_t)hn + idn + (size_t)mn + bn + 3;
	mem_free(ids);
	mem_free(b);
}

static json_t *ev_new(const char *name, json_t *id)
{
	json_t *o = json_object();

	if (!o)
		return NULL;
	json_object_set_new(o, "event", json_string(name));
	if (id)
		json_object_set(o, "id", id);
	return o;
}

static void send_error(struct client *c, json_t *id, const char *code, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void send_error(struct client *c, json_t *id, const char *code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *ev = ev_new("error", id);

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (ev) {
		json_object_set_new(ev, "code", json_string(code));
		json_object_set_new(ev, "message", json_string(msg));
	}
	client_send(c, ev);
}

/* ------------------------------------------------------------------ */
/* subscriptions and commands */

static bool cmd_ended(const struct relay_cmd *m)
{
	return m->state == CMD_EXITED || m->state == CMD_FAILED;
}

static void cmd_update_pause(struct relay_cmd *m)
{
	uint64_t lag = 0;
	size_t hi = m->r->ring_bytes / 2, lo = m->r->ring_bytes / 4;

	for (struct sub *s = m->subs; s; s = s->mnext) {
		if (s->mode != SUB_STREAM)
			continue;
		for (int i = 0; i < 2; i++) {
			uint64_t d = m->ring[i].end > s->cur[i] ? m->ring[i].end - s->cur[i] : 0;
			if (d > lag)
				lag = d;
		}
	}
	bool want = m->pause_want ? lag > lo : lag > hi;
	if (cmd_ended(m))
		want = false;
	if (want != m->pause_want) {
		m->pause_want = want;
		kick(m->r);
	}
}

static struct sub *sub_find(struct client *c, struct relay_cmd *m)
{
	for (struct sub *s = c->subs; s; s = s->cnext)
		if (s->cmd == m)
			return s;
	return NULL;
}

static struct sub *sub_new(struct client *c, struct relay_cmd *m, enum sub_mode mode)
{
	struct sub *s = mem_calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->c = c;
	s->cmd = m;
	s->mode = mode;
	s->cnext = c->subs;
	if (c->subs)
		c->subs->cprev = s;
	c->subs = s;
	s->mnext = m->subs;
	if (m->subs)
		m->subs->mprev = s;
	m->subs = s;
	return s;
}

static void sub_free(struct sub *s)
{
	if (!s)
		return;
	if (s->cprev)
		s->cprev->cnext = s->cnext;
	else
		s->c->subs = s->cnext;
	if (s->cnext)
		s->cnext->cprev = s->cprev;
	if (s->mprev)
		s->mprev->mnext = s->mnext;
	else
		s->cmd->subs = s->mnext;
	if (s->mnext)
		s->mnext->mprev = s->mprev;
	struct relay_cmd *m = s->cmd;
	mem_free(s);
	cmd_update_pause(m);
}

static struct relay_cmd *cmd_find(struct relay *r, const char *key)
{
	for (struct relay_cmd *m = r->cmds; m; m = m->next)
		if (!strcmp(m->key, key))
			return m;
	return NULL;
}

/* Unlink and free; the backend no longer holds m (or never did). */
static void cmd_free(struct relay_cmd *m)
{
	struct relay *r = m->r;

	while (m->subs)
		sub_free(m->subs);
	if (m->prev)
		m->prev->next = m->next;
	else if (r->cmds == m)
		r->cmds = m->next;
	if (m->next)
		m->next->prev = m->prev;
	else if (r->cmds_tail == m)
		r->cmds_tail = m->prev;
	if (cmd_ended(m))
		r->nfinished--;
	else
		r->nrunning--;
	ring_clear(&m->ring[0]);
	ring_clear(&m->ring[1]);
	json_decref(m->id);
	json_decref(m->argv);
	mem_free(m->key);
	mem_free(m->err_code);
	mem_free(m->err_msg);
	mem_free(m);
}

/* ------------------------------------------------------------------ */
/* producing events for one subscription */

static void emit_exit(struct sub *s)
{
	struct relay_cmd *m = s->cmd;
	json_t *ev;

	if (m->state == CMD_FAILED) {
		ev = ev_new("error", m->id);
		if (ev) {
			json_object_set_new(ev, "code", json_string(m->err_code ? m->err_code : "backend_error"));
			json_object_set_new(ev, "message", json_string(m->err_msg ? m->err_msg : "command failed"));
		}
		client_send(s->c, ev);
		return;
	}
	ev = ev_new(s->mode == SUB_TAIL ? "result" : "exit", m->id);
	if (!ev) {
		client_fail(s->c);
		return;
	}
	json_object_set_new(ev, "code", m->ex.code >= 0 ? json_integer(m->ex.code) : json_null());
	json_object_set_new(ev, "signal", m->ex.signal ? json_integer(m->ex.signal) : json_null());
	json_object_set_new(ev, "timed_out", json_boolean(m->ex.timed_out));
	json_object_set_new(ev, "duration_ms", json_integer((json_int_t)m->ex.duration_ms));
	json_object_set_new(ev, "stdout_bytes", json_integer((json_int_t)m->ring[0].end));
	json_object_set_new(ev, "stderr_bytes", json_integer((json_int_t)m->ring[1].end));
	if (s->mode == SUB_STREAM) {
		json_object_set_new(ev, "truncated", json_boolean(s->truncated));
	} else {
		for (int i = 0; i < 2; i++) {
			struct ring *g = &m->ring[i];
			size_t take = s->tail[i] < g->len ? s->tail[i] : g->len;
			uint8_t *tmp = mem_alloc(take + 1);
			char name[32];
			if (!tmp) {
				json_decref(ev);
				client_fail(s->c);
				return;
			}
			if (take)
				ring_read(g, g->end - take, tmp, take);
			bool trunc = take < g->end;
			size_t skip = 0;
			/* A cut through a multi-byte character would force base64
			 * for otherwise text output: start at the next character. */
			while (trunc && skip < 3 && skip < take && (tmp[skip] & 0xc0) == 0x80)
				skip++;
			json_t *probe = json_stringn((const char *)tmp + skip, take - skip);
			if (probe)
				json_object_set_new(ev, stream_names[i], probe);
			else
				put_data(ev, stream_names[i], tmp, take);
			snprintf(name, sizeof(name), "%s_truncated", stream_names[i]);
			json_object_set_new(ev, name, json_boolean(trunc));
			mem_free(tmp);
		}
	}
	client_send(s->c, ev);
}

/* Produce at most one event for s. Returns true if it did (s may be gone). */
static bool sub_step(struct sub *s)
{
	struct relay_cmd *m = s->cmd;
	struct relay *r = m->r;

	if (!s->started_sent && m->has_pid) {
		json_t *ev = ev_new("started", m->id);
		if (ev) {
			json_object_set_new(ev, "pid", json_integer((json_int_t)m->pid));
			json_object_set_new(ev, "where", json_string(m->on_host ? "host" : "guest"));
		}
		client_send(s->c, ev);
		s->started_sent = true;
		return true;
	}
	if (s->mode == SUB_STREAM) {
		for (unsigned k = 0; k < 2; k++) {
			unsigned i = (s->turn + k) & 1;
			struct ring *g = &m->ring[i];
			if (s->cur[i] < ring_start(g)) {
				json_t *ev = ev_new("dropped", m->id);
				if (ev) {
					json_object_set_new(ev, "stream", json_string(stream_names[i]));
					json_object_set_new(ev, "offset", json_integer((json_int_t)s->cur[i]));
					json_object_set_new(ev, "bytes",
							    json_integer((json_int_t)(ring_start(g) - s->cur[i])));
				}
				client_send(s->c, ev);
				s->truncated = true;
				s->cur[i] = ring_start(g);
				cmd_update_pause(m);
				return true;
			}
			if (s->cur[i] < g->end) {
				uint64_t avail = g->end - s->cur[i];
				size_t n = avail < OUT_CHUNK ? (size_t)avail : OUT_CHUNK;
				ring_read(g, s->cur[i], r->scratch, n);
				if (s->b64) {
					client_send_b64(s->c, stream_names[i], m->id, s->cur[i], r->scratch, n);
				} else {
					if (n < avail)
						n = utf8_cut(r->scratch, n);
					json_t *ev = ev_new(stream_names[i], m->id);
					if (ev) {
						json_object_set_new(ev, "offset", json_integer((json_int_t)s->cur[i]));
						put_data(ev, "data", r->scratch, n);
					}
					client_send(s->c, ev);
				}
				s->cur[i] += n;
				s->turn = i ^ 1;
				cmd_update_pause(m);
				return true;
			}
		}
	}
	if (cmd_ended(m)) {
		emit_exit(s);
		sub_free(s);
		return true;
	}
	return false;
}

static void client_pump(struct client *c)
{
	bool progress = true;

	while (progress && !c->dead && buf_len(&c->out) < c->r->queue) {
		progress = false;
		for (struct sub *s = c->subs, *next; s && !c->dead; s = next) {
			next = s->cnext;
			if (sub_step(s))
				progress = true;
			if (buf_len(&c->out) >= c->r->queue)
				break;
		}
	}
}

/* ------------------------------------------------------------------ */
/* client I/O */

static void client_update_events(struct client *c)
{
	uint32_t ev = 0;

	if (c->dead)
		return;
	if (!c->rd_eof && buf_len(&c->out) < c->r->queue && buf_len(&c->in) <= c->r->line_max)
		ev |= EPOLLIN;
	if (buf_len(&c->out) || (c->in_pending && buf_len(&c->out) < c->r->queue))
		ev |= EPOLLOUT; /* a writable socket calls us back to go on */
	if (ev != c->events && loop_mod_fd(c->r->l, c->fd, ev) == 0)
		c->events = ev;
}

static void client_flush(struct client *c)
{
	while (!c->dead && buf_len(&c->out)) {
		ssize_t n = send(c->fd, buf_ptr(&c->out), buf_len(&c->out), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			buf_consume(&c->out, (size_t)n);
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		client_fail(c);
	}
	if (!buf_len(&c->out))
		buf_reset(&c->out);
}

static void handle_line(struct client *c, const char *p, size_t n);

static void client_process_input(struct client *c)
{
	struct relay *r = c->r;

	if (c->in_busy)
		return; /* re-entered from a backend call made by a handler */
	c->in_busy = true;
	while (!c->dead && buf_len(&c->out) < r->queue && buf_len(&c->in)) {
		const char *p = (const char *)buf_ptr(&c->in);
		size_t n = buf_len(&c->in);
		const char *nl = memchr(p, '\n', n);

		if (!nl) {
			if (c->discarding) {
				buf_consume(&c->in, n);
			} else if (n > r->line_max) {
				send_error(c, NULL, "line_too_long",
					   "request line longer than %zu bytes; the rest of it is discarded",
					   r->line_max);
				c->discarding = true;
				buf_consume(&c->in, n);
			}
			break;
		}
		size_t len = (size_t)(nl - p);
		if (c->discarding)
			c->discarding = false;
		else if (len > r->line_max)
			send_error(c, NULL, "line_too_long", "request line of %zu bytes is longer than %zu bytes", len,
				   r->line_max);
		else
			handle_line(c, p, len);
		buf_consume(&c->in, len + 1);
	}
	c->in_pending = buf_len(&c->in) && memchr(buf_ptr(&c->in), '\n', buf_len(&c->in));
	if (!buf_len(&c->in))
		buf_reset(&c->in);
	c->in_busy = false;
}

/* Do everything this client can do now without blocking. Requests are
 * only handled from the client's own fd callback (input = true), never
 * from inside a backend call.
 *
 * What must hold when this returns: either the output queue is not empty
 * (and EPOLLOUT will call us back), or the pump ran with room in the queue
 * and found nothing to send. Hence the flush *before* the pump: a round
 * that starts with a full queue, which the pump leaves alone, and whose
 * flush then empties it completely would otherwise end with output still
 * waiting in the rings and nothing to wake us. With a paused command that
 * wait is for ever (nothing new arrives to kick the pump): the stall after
 * a slow reader drained its socket in one go. */
static void client_service(struct client *c, bool input)
{
	int i;

	if (c->in_busy)
		return; /* inside one of c's requests: its own service loop goes on after it */
	for (i = 0; i < SERVICE_ROUNDS && !c->dead; i++) {
		uint64_t before = c->produced;
		client_flush(c);
		if (input)
			client_process_input(c);
		client_pump(c);
		client_flush(c);
		if (buf_len(&c->out) || c->produced == before)
			break;
	}
	client_update_events(c);
	if (i == SERVICE_ROUNDS && !c->dead && !(c->events & EPOLLOUT)) {
		/* More may be pending: let the (writable) socket call us back. */
		if (loop_mod_fd(c->r->l, c->fd, c->events | EPOLLOUT) == 0)
			c->events |= EPOLLOUT;
	}
}

static void client_read(struct client *c)
{
	uint8_t *p;
	ssize_t n;

	if (buf_reserve(&c->in, READ_CHUNK, &p) < 0)
		return; /* full: input is processed first */
	n = recv(c->fd, p, READ_CHUNK, MSG_DONTWAIT);
	if (n > 0) {
		buf_commit(&c->in, (size_t)n);
	} else if (n == 0) {
		c->rd_eof = true;
		/* A last line without '\n' still counts. */
		if (buf_len(&c->in) && !c->discarding)
			buf_put_u8(&c->in, '\n');
	} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
		client_fail(c);
	}
}

static void client_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct client *c = ud;

	(void)l;
	(void)fd;
	if (c->dead)
		return;
	if (events & EPOLLIN)
		client_read(c);
	client_service(c, true);
	if ((events & EPOLLERR) || ((events & EPOLLHUP) && !(events & EPOLLIN)) || ((events & EPOLLHUP) && c->rd_eof))
		client_fail(c);
}

static void client_free(struct client *c)
{
	struct relay *r = c->r;

	while (c->subs)
		sub_free(c->subs);
	for (struct pending_sync *ps = r->syncs; ps; ps = ps->next)
		if (ps->c == c)
			ps->c = NULL;
	if (c->fd >= 0) {
		loop_del_fd(r->l, c->fd);
		close(c->fd);
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		r->clients = c->next;
	if (c->next)
		c->next->prev = c->prev;
	r->nclients--;
	buf_clear(&c->in);
	buf_clear(&c->out);
	mem_free(c);
}

/* Best effort single line to a connection we are about to close. */
static void refuse(int fd, const char *code, const char *msg)
{
	json_t *ev = json_pack("{s:s, s:s, s:s}", "event", "error", "code", code, "message", msg);
	char *s = ev ? json_dumps(ev, JSON_COMPACT) : NULL;

	if (s) {
		size_t n = strlen(s);
		s[n] = '\n'; /* replaces the NUL; we send n + 1 bytes, never read it as a string again */
		ssize_t w = send(fd, s, n + 1, MSG_NOSIGNAL | MSG_DONTWAIT);
		(void)w;
	}
	mem_free(s);
	json_decref(ev);
	close(fd);
}

static void accept_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct relay *r = ud;

	(void)events;
	for (int k = 0; k < 16; k++) {
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
		struct ucred cr;
		socklen_t crl = sizeof(cr);

		if (cfd < 0)
			return;
		if (getsockopt(cfd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) < 0 || cr.uid != geteuid()) {
			char msg[160];
			snprintf(msg, sizeof(msg), "this relay serves uid %u only; connection from uid %d refused",
				 (unsigned)geteuid(), crl == sizeof(cr) ? (int)cr.uid : -1);
			refuse(cfd, "forbidden_peer", msg);
			continue;
		}
		if (r->nclients >= r->max_clients) {
			refuse(cfd, "busy", "too many clients connected to this relay; close one and retry");
			continue;
		}
		struct client *c = mem_calloc(1, sizeof(*c));
		if (!c) {
			refuse(cfd, "busy", "relay out of memory");
			continue;
		}
		c->r = r;
		c->fd = cfd;
		buf_init(&c->in, r->line_max + READ_CHUNK + 1);
		buf_init(&c->out, r->queue + OUT_HARD_EXTRA);
		if (loop_add_fd(l, cfd, EPOLLIN, client_cb, c) < 0) {
			mem_free(c);
			refuse(cfd, "busy", "relay cannot watch more connections");
			continue;
		}
		c->events = EPOLLIN;
		c->next = r->clients;
		if (r->clients)
			r->clients->prev = c;
		r->clients = c;
		r->nclients++;
		json_t *hello = ev_new("hello", NULL);
		if (hello) {
			json_object_set_new(hello, "protocol", json_integer(RELAY_PROTOCOL_VERSION));
			json_object_set_new(hello, "server", json_string("airlock-relay/" AIRLOCK_VERSION));
			json_object_set_new(hello, "line_max", json_integer((json_int_t)r->line_max));
			json_object_set_new(hello, "ring_bytes", json_integer((json_int_t)r->ring_bytes));
		}
		client_send(c, hello);
		client_service(c, false);
	}
}

/* ------------------------------------------------------------------ */
/* housekeeping: frees and pause changes, with nothing on the stack */

static void housekeeping(struct loop *l, void *ud)
{
	struct relay *r = ud;

	(void)l;
	r->hk_timer = 0;
	for (struct client *c = r->clients, *next; c; c = next) {
		next = c->next;
		if (c->dead)
			client_free(c);
	}
	/* Bounded history: drop the oldest finished commands, preferring
	 * those nobody is reading. */
	while (r->nfinished > r->keep_finished) {
		struct relay_cmd *victim = NULL;
		for (struct relay_cmd *m = r->cmds; m; m = m->next) {
			if (!cmd_ended(m))
				continue;
			if (!victim)
				victim = m;
			if (!m->subs) {
				victim = m;
				break;
			}
		}
		if (!victim)
			break;
		cmd_free(victim);
	}
	for (struct relay_cmd *m = r->cmds; m; m = m->next) {
		if (m->live && m->pause_want != m->pause_told) {
			m->pause_told = m->pause_want;
			if (r->ops->pause)
				r->ops->pause(r->ud, m, m->pause_told);
			if (r->hk_timer)
				break; /* the backend re-entered; finish next round */
		}
	}
}

/* ------------------------------------------------------------------ */
/* request validation */

struct op;
typedef void op_fn(struct client *c, json_t *rq, json_t *id);

struct op {
	const char *name;
	op_fn *fn;
	bool id_required;
	const char *const *fields; /* allowed besides "op" and "id" */
};

static bool check_fields(struct client *c, json_t *rq, json_t *id, const struct op *op)
{
	const char *k;
	json_t *v;

	json_object_foreach(rq, k, v)
	{
		bool ok = !strcmp(k, "op") || !strcmp(k, "id");
		for (const char *const *f = op->fields; !ok && *f; f++)
			ok = !strcmp(k, *f);
		if (!ok) {
			send_error(c, id, "bad_field", "unknown field '%.64s' for op '%s'", k, op->name);
			return false;
		}
	}
	return true;
}

static bool get_bool(struct client *c, json_t *rq, json_t *id, const char *field, bool dflt, bool *out)
{
	json_t *v = json_object_get(rq, field);

	if (!v || json_is_null(v)) {
		*out = dflt;
		return true;
	}
	if (!json_is_boolean(v)) {
		send_error(c, id, "bad_field", "field '%s' must be true or false", field);
		return false;
	}
	*out = json_is_true(v);
	return true;
}

/* Integer in [lo, hi]; present is set when the field was given. */
static bool get_int(struct client *c, json_t *obj, json_t *id, const char *field, const char *label, json_int_t lo,
		    json_int_t hi, bool required, json_int_t *out, bool *present)
{
	json_t *v = json_object_get(obj, field);

	if (present)
		*present = v != NULL;
	if (!v) {
		if (required) {
			send_error(c, id, "missing_field", "field '%s' is required", label);
			return false;
		}
		return true;
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
		send_error(c, id, "bad_field", "field '%s' must be an integer from %lld to %lld", label, (long long)lo,
			   (long long)hi);
		return false;
	}
	*out = json_integer_value(v);
	return true;
}

static bool plain_string(json_t *v)
{
	return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

static bool valid_cwd(const char *s)
{
	if (s[0] == '/' || strlen(s) > CWD_MAX)
		return false;
	for (const char *p = s; *p;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 2 && p[0] == '.' && p[1] == '.')
			return false;
		p += n;
		if (*p == '/')
			p++;
	}
	return true;
}

static bool valid_env_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > ENV_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_'))
			return false;
	}
	return true;
}

/* The command a request names, or NULL after sending the error. */
static struct relay_cmd *want_cmd(struct client *c, json_t *id, bool running)
{
	char *key = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
	struct relay_cmd *m = key ? cmd_find(c->r, key) : NULL;

	mem_free(key);
	if (!m) {
		send_error(c, id, "unknown_id", "no command with this id (see op 'status')");
		return NULL;
	}
	if (running && (cmd_ended(m) || !m->live)) {
		send_error(c, id, "not_running", "the command has already ended (%s)", state_names[m->state]);
		return NULL;
	}
	return m;
}

static void backend_failed(struct client *c, json_t *id, const char *what, int rc)
{
	if (rc == -EAGAIN)
		send_error(c, id, "busy", "%s: the sandbox cannot take this now, retry", what);
	else
		send_error(c, id, "backend_error", "%s failed: %s", what, strerror(-rc));
}

/* Trimmed argv for status: at most STATUS_ARGV_BYTES of text. */
static json_t *argv_for_status(const char *const *argv, size_t argc)
{
	json_t *a = json_array();
	size_t used = 0;

	for (size_t i = 0; a && i < argc && used < STATUS_ARGV_BYTES; i++) {
		size_t n = strlen(argv[i]);
		if (n > STATUS_ARGV_BYTES - used)
			n = utf8_cut((const uint8_t *)argv[i], STATUS_ARGV_BYTES - used);
		json_array_append_new(a, json_stringn(argv[i], n));
		used += n;
	}
	return a;
}

/* ------------------------------------------------------------------ */
/* ops */

static const char *const exec_fields[] = {"argv", "shell", "cwd",  "env",      "timeout_seconds",
					  "tty",  "stdin", "tail", "encoding", NULL};

/* "encoding": "text" (default: data when valid UTF-8, else data_b64) or
 * "base64" (always data_b64). 1 for base64, 0 for text, -1 after an error
 * was sent. */
static int want_b64(struct client *c, json_t *rq, json_t *id)
{
	json_t *e = json_object_get(rq, "encoding");
	const char *v = json_string_value(e);

	if (!e || (v && !strcmp(v, "text")))
		return 0;
	if (v && !strcmp(v, "base64"))
		return 1;
	send_error(c, id, "bad_field", "field 'encoding' must be \"text\" or \"base64\"");
	return -1;
}

static void op_exec(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	struct relay_exec_req req = {0};
	const char **argv = NULL, **env = NULL;
	char **envbuf = NULL;
	size_t nenv = 0;
	const char *sh[3];
	char *key = NULL;
	struct relay_cmd *m = NULL;
	struct sub *s = NULL;
	json_t *v, *tail;
	size_t tailn[2] = {0, 0};
	bool tail_mode = false;
	int rc, b64;

	if ((b64 = want_b64(c, rq, id)) < 0)
		goto out;
	key = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
	if (!key) {
		send_error(c, id, "busy", "relay out of memory");
		goto out;
	}
	if ((m = cmd_find(r, key))) {
		if (!cmd_ended(m)) {
			send_error(c, id, "duplicate_id", "a command with this id is still running");
			m = NULL;
			goto out;
		}
		cmd_free(m); /* reusing the id of a finished command forgets it */
		m = NULL;
	}

	/* argv or shell */
	json_t *jargv = json_object_get(rq, "argv"), *jshell = json_object_get(rq, "shell");
	if (jargv && jshell) {
		send_error(c, id, "bad_field", "give 'argv' or 'shell', not both");
		goto out;
	}
	if (!jargv && !jshell) {
		send_error(c, id, "missing_field", "field 'argv' (array of strings) or 'shell' (string) is required");
		goto out;
	}
	if (jargv) {
		size_t n = json_is_array(jargv) ? json_array_size(jargv) : 0;
		if (!json_is_array(jargv) || n == 0 || n > ARGV_MAX) {
			send_error(c, id, "bad_field", "field 'argv' must be an array of 1 to %d strings", ARGV_MAX);
			goto out;
		}
		argv = mem_calloc(n + 1, sizeof(*argv));
		if (!argv) {
			send_error(c, id, "busy", "relay out of memory");
			goto out;
		}
		for (size_t i = 0; i < n; i++) {
			json_t *a = json_array_get(jargv, i);
			if (!plain_string(a) || (i == 0 && json_string_length(a) == 0)) {
				send_error(c, id, "bad_field", "field 'argv[%zu]' must be a %sstring without NUL bytes",
					   i, i == 0 ? "non-empty " : "");
				goto out;
			}
			argv[i] = json_string_value(a);
		}
		req.argc = n;
	} else {
		if (!plain_string(jshell) || json_string_length(jshell) == 0) {
			send_error(c, id, "bad_field", "field 'shell' must be a non-empty string without NUL bytes");
			goto out;
		}
		sh[0] = "sh";
		sh[1] = "-c";
		sh[2] = json_string_value(jshell);
		req.argc = 3;
		req.shell = true;
	}
	req.argv = argv ? argv : sh;

	v = json_object_get(rq, "cwd");
	req.cwd = "";
	if (v && !json_is_null(v)) {
		if (!plain_string(v) || !valid_cwd(json_string_value(v))) {
			send_error(
			    c, id, "bad_field",
			    "field 'cwd' must be a path relative to the workspace root, without '..' components");
			goto out;
		}
		req.cwd = json_string_value(v);
	}

	v = json_object_get(rq, "env");
	if (v && !json_is_null(v)) {
		const char *k;
		json_t *ev;
		if (!json_is_object(v) || json_object_size(v) > ENV_MAX) {
			send_error(c, id, "bad_field", "field 'env' must be an object of at most %d names", ENV_MAX);
			goto out;
		}
		envbuf = mem_calloc(json_object_size(v) + 1, sizeof(*envbuf));
		env = mem_calloc(json_object_size(v) + 1, sizeof(*env));
		if (!envbuf || !env) {
			send_error(c, id, "busy", "relay out of memory");
			goto out;
		}
		json_object_foreach(v, k, ev)
		{
			if (!valid_env_name(k)) {
				send_error(c, id, "bad_field",
					   "field 'env': name '%.64s' is not [A-Za-z_][A-Za-z0-9_]*", k);
				goto out;
			}
			if (!plain_string(ev)) {
				send_error(c, id, "bad_field", "field 'env.%.64s' must be a string without NUL bytes",
					   k);
				goto out;
			}
			size_t kl = strlen(k), vl = json_string_length(ev);
			envbuf[nenv] = mem_alloc(kl + vl + 2);
			if (!envbuf[nenv]) {
				send_error(c, id, "busy", "relay out of memory");
				goto out;
			}
			memcpy(envbuf[nenv], k, kl);
			envbuf[nenv][kl] = '=';
			memcpy(envbuf[nenv] + kl + 1, json_string_value(ev), vl + 1);
			env[nenv] = envbuf[nenv];
			nenv++;
		}
	}
	req.env = env;
	req.nenv = nenv;

	v = json_object_get(rq, "timeout_seconds");
	req.timeout_ms = (uint64_t)r->timeout_s * 1000;
	if (v && !json_is_null(v)) {
		double t = json_is_number(v) ? json_number_value(v) : -1;
		if (!(t > 0 && t <= TIMEOUT_MAX_S)) {
			send_error(c, id, "bad_field",
				   "field 'timeout_seconds' must be a number above 0 and at most %.0f", TIMEOUT_MAX_S);
			goto out;
		}
		req.timeout_ms = (uint64_t)(t * 1000.0 + 0.999);
	}

	v = json_object_get(rq, "tty");
	if (v && json_is_true(v)) {
		req.tty = true;
		req.rows = 24;
		req.cols = 80;
	} else if (v && json_is_object(v)) {
		json_int_t rows = 0, cols = 0;
		const char *k;
		json_t *tv;
		json_object_foreach(v, k, tv)
		{
			if (strcmp(k, "rows") && strcmp(k, "cols")) {
				send_error(c, id, "bad_field", "unknown field 'tty.%.64s'", k);
				goto out;
			}
		}
		if (!get_int(c, v, id, "rows", "tty.rows", 1, 65535, true, &rows, NULL) ||
		    !get_int(c, v, id, "cols", "tty.cols", 1, 65535, true, &cols, NULL))
			goto out;
		req.tty = true;
		req.rows = (uint16_t)rows;
		req.cols = (uint16_t)cols;
	} else if (v && !json_is_false(v) && !json_is_null(v)) {
		send_error(c, id, "bad_field", "field 'tty' must be false, true or {\"rows\": N, \"cols\": N}");
		goto out;
	}

	if (!get_bool(c, rq, id, "stdin", false, &req.stdin_open))
		goto out;

	tail = json_object_get(rq, "tail");
	if (tail && !json_is_null(tail) && !json_is_false(tail)) {
		static const size_t dflt[2] = {8000, 4000}; /* the seeds' run() */
		tail_mode = true;
		tailn[0] = dflt[0];
		tailn[1] = dflt[1];
		if (json_is_object(tail)) {
			const char *k;
			json_t *tv;
			json_object_foreach(tail, k, tv)
			{
				if (strcmp(k, "stdout_bytes") && strcmp(k, "stderr_bytes")) {
					send_error(c, id, "bad_field", "unknown field 'tail.%.64s'", k);
					goto out;
				}
			}
			json_int_t x;
			bool present;
			if (!get_int(c, tail, id, "stdout_bytes", "tail.stdout_bytes", 0, (json_int_t)r->ring_bytes,
				     false, &x, &present))
				goto out;
			if (present)
				tailn[0] = (size_t)x;
			if (!get_int(c, tail, id, "stderr_bytes", "tail.stderr_bytes", 0, (json_int_t)r->ring_bytes,
				     false, &x, &present))
				goto out;
			if (present)
				tailn[1] = (size_t)x;
		} else if (!json_is_true(tail)) {
			send_error(c, id, "bad_field",
				   "field 'tail' must be true or {\"stdout_bytes\": N, \"stderr_bytes\": N}");
			goto out;
		}
	}

	if (r->nrunning >= r->max_running) {
		send_error(c, id, "busy", "%u commands are already running; wait for one to end", r->max_running);
		goto out;
	}

	m = mem_calloc(1, sizeof(*m));
	if (!m) {
		send_error(c, id, "busy", "relay out of memory");
		goto out;
	}
	m->r = r;
	m->key = key;
	key = NULL;
	m->id = json_incref(id);
	m->argv = argv_for_status(req.argv, req.argc);
	m->shell = req.shell;
	m->tty = req.tty;
	m->stdin_open = req.stdin_open;
	m->state = CMD_STARTING;
	m->started_wall_ms = wall_ms();
	m->start_ms = loop_now_ms();
	ring_init(&m->ring[0], r->ring_bytes);
	ring_init(&m->ring[1], r->ring_bytes);
	m->prev = r->cmds_tail;
	if (r->cmds_tail)
		r->cmds_tail->next = m;
	else
		r->cmds = m;
	r->cmds_tail = m;
	r->nrunning++;
	s = sub_new(c, m, tail_mode ? SUB_TAIL : SUB_STREAM);
	if (!s) {
		send_error(c, id, "busy", "relay out of memory");
		cmd_free(m);
		m = NULL;
		goto out;
	}
	s->b64 = b64 == 1;
	s->tail[0] = tailn[0];
	s->tail[1] = tailn[1];
	m->live = true;
	rc = r->ops->exec_start(r->ud, m, &req);
	if (rc < 0) {
		m->live = false;
		backend_failed(c, id, "exec", rc);
		cmd_free(m);
	}
	m = NULL;
out:
	for (size_t i = 0; envbuf && i < nenv; i++)
		mem_free(envbuf[i]);
	mem_free(envbuf);
	mem_free(env);
	mem_free(argv);
	mem_free(key);
}

static const char *const stdin_fields[] = {"data", "data_b64", "eof", NULL};

static void op_stdin(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	struct relay_cmd *m;
	json_t *d = json_object_get(rq, "data"), *b = json_object_get(rq, "data_b64");
	uint8_t *bin = NULL;
	const void *p = NULL;
	size_t n = 0;
	bool eof;
	int rc;

	if (!get_bool(c, rq, id, "eof", false, &eof))
		return;
	if (d && b) {
		send_error(c, id, "bad_field", "give 'data' or 'data_b64', not both");
		return;
	}
	if (!d && !b && !eof) {
		send_error(c, id, "missing_field", "field 'data', 'data_b64' or 'eof' is required");
		return;
	}
	if (d) {
		if (!json_is_string(d)) {
			send_error(c, id, "bad_field", "field 'data' must be a string");
			return;
		}
		p = json_string_value(d);
		n = json_string_length(d);
	}
	if (b) {
		if (!json_is_string(b)) {
			send_error(c, id, "bad_field", "field 'data_b64' must be a base64 string");
			return;
		}
		size_t bl = json_string_length(b);
		bin = mem_alloc(bl / 4 * 3 + 3);
		if (!bin) {
			send_error(c, id, "busy", "relay out of memory");
			return;
		}
		if (sodium_base642bin(bin, bl / 4 * 3 + 3, json_string_value(b), bl, NULL, &n, NULL,
				      sodium_base64_VARIANT_ORIGINAL) != 0) {
			send_error(c, id, "bad_field", "field 'data_b64' is not valid base64");
			goto out;
		}
		p = bin;
	}
	if (!(m = want_cmd(c, id, true)))
		goto out;
	if (!m->stdin_open || m->stdin_eof) {
		send_error(c, id, "stdin_closed",
			   m->stdin_open ? "stdin was already closed with eof"
					 : "the command was started without \"stdin\": true");
		goto out;
	}
	rc = r->ops->stdin_write(r->ud, m, p, n, eof);
	if (rc < 0)
		backend_failed(c, id, "stdin", rc);
	else if (eof)
		m->stdin_eof = true;
out:
	mem_free(bin);
}

static void send_ok(struct client *c, json_t *id, const char *op)
{
	json_t *ev = ev_new("ok", id);

	if (ev)
		json_object_set_new(ev, "op", json_string(op));
	client_send(c, ev);
}

static const char *const signal_fields[] = {"signal", NULL};

static const struct {
	const char *name;
	int signo;
} signals[] = {
    {"HUP", 1},	  {"INT", 2},	{"QUIT", 3},  {"KILL", 9},  {"USR1", 10},  {"USR2", 12},
    {"TERM", 15}, {"CONT", 18}, {"STOP", 19}, {"TSTP", 20}, {"WINCH", 28},
};

static void op_signal(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	json_t *v = json_object_get(rq, "signal");
	int signo = 0;
	int rc;

	if (!v) {
		send_error(c, id, "missing_field", "field 'signal' is required");
		return;
	}
	if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 64) {
		signo = (int)json_integer_value(v);
	} else if (json_is_string(v)) {
		const char *s = json_string_value(v);
		if (!strncmp(s, "SIG", 3))
			s += 3;
		for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
			if (!strcmp(s, signals[i].name))
				signo = signals[i].signo;
	}
	if (!signo) {
		send_error(
		    c, id, "bad_field",
		    "field 'signal' must be INT, TERM, KILL, HUP, QUIT, USR1, USR2, CONT, STOP, TSTP, WINCH or 1..64");
		return;
	}
	if (!(m = want_cmd(c, id, true)))
		return;
	if ((rc = c->r->ops->signal(c->r->ud, m, signo)) < 0)
		backend_failed(c, id, "signal", rc);
	else
		send_ok(c, id, "signal");
}

static const char *const resize_fields[] = {"rows", "cols", NULL};

static void op_resize(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	json_int_t rows = 0, cols = 0;
	int rc;

	if (!get_int(c, rq, id, "rows", "rows", 1, 65535, true, &rows, NULL) ||
	    !get_int(c, rq, id, "cols", "cols", 1, 65535, true, &cols, NULL))
		return;
	if (!(m = want_cmd(c, id, true)))
		return;
	if (!m->tty) {
		send_error(c, id, "no_tty", "the command was started without a tty; nothing to resize");
		return;
	}
	if ((rc = c->r->ops->resize(c->r->ud, m, (uint16_t)rows, (uint16_t)cols)) < 0)
		backend_failed(c, id, "resize", rc);
	else
		send_ok(c, id, "resize");
}

static const char *const no_fields[] = {NULL};

static void op_cancel(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	int rc;

	(void)rq;
	if (!(m = want_cmd(c, id, true)))
		return;
	if ((rc = c->r->ops->cancel(c->r->ud, m)) < 0)
		backend_failed(c, id, "cancel", rc);
	else
		send_ok(c, id, "cancel");
}

static const char *const attach_fields[] = {"from", "encoding", NULL};

static void op_attach(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	json_t *from = json_object_get(rq, "from");
	uint64_t at[2];
	struct sub *s;

	int b64;

	if (!(m = want_cmd(c, id, false)) || (b64 = want_b64(c, rq, id)) < 0)
		return;
	at[0] = ring_start(&m->ring[0]);
	at[1] = ring_start(&m->ring[1]);
	if (from && !json_is_null(from)) {
		json_int_t x;
		if (json_is_integer(from)) {
			/* One number for both streams (a tty's output is all on
			 * stdout): clamped to each stream's end. */
			if (json_integer_value(from) < 0)
				goto bad;
			for (int i = 0; i < 2; i++) {
				at[i] = (uint64_t)json_integer_value(from);
				if (at[i] > m->ring[i].end)
					at[i] = m->ring[i].end;
			}
			if ((uint64_t)json_integer_value(from) > m->ring[0].end &&
			    (uint64_t)json_integer_value(from) > m->ring[1].end) {
				send_error(c, id, "bad_field",
					   "field 'from': offset %lld is past the end of both streams",
					   (long long)json_integer_value(from));
				return;
			}
		} else if (json_is_object(from)) {
			const char *k;
			json_t *fv;
			bool present;
			json_object_foreach(from, k, fv)
			{
				if (strcmp(k, "stdout") && strcmp(k, "stderr"))
					goto bad;
			}
			if (!get_int(c, from, id, "stdout", "from.stdout", 0, INT64_MAX, false, &x, &present))
				return;
			if (present)
				at[0] = (uint64_t)x;
			if (!get_int(c, from, id, "stderr", "from.stderr", 0, INT64_MAX, false, &x, &present))
				return;
			if (present)
				at[1] = (uint64_t)x;
		} else {
			goto bad;
		}
		for (int i = 0; i < 2; i++) {
			if (at[i] > m->ring[i].end) {
				send_error(c, id, "bad_field",
					   "field 'from': %s offset %llu is past its end (%llu bytes so far)",
					   stream_names[i], (unsigned long long)at[i],
					   (unsigned long long)m->ring[i].end);
				return;
			}
		}
	}
	s = sub_find(c, m);
	if (!s && !(s = sub_new(c, m, SUB_STREAM))) {
		send_error(c, id, "busy", "relay out of memory");
		return;
	}
	s->mode = SUB_STREAM;
	s->b64 = b64 == 1;
	s->cur[0] = at[0];
	s->cur[1] = at[1];
	s->started_sent = m->has_pid;
	json_t *ev = ev_new("attached", id);
	if (ev) {
		json_object_set_new(ev, "state", json_string(state_names[m->state]));
		json_object_set_new(ev, "pid", m->has_pid ? json_integer((json_int_t)m->pid) : json_null());
		json_object_set_new(ev, "stdout_offset", json_integer((json_int_t)at[0]));
		json_object_set_new(ev, "stderr_offset", json_integer((json_int_t)at[1]));
	}
	client_send(c, ev);
	cmd_update_pause(m);
	return;
bad:
	send_error(c, id, "bad_field", "field 'from' must be a byte offset or {\"stdout\": N, \"stderr\": N}");
}

static void op_status(struct client *c, json_t *rq, json_t *id)
{
	json_t *ev = ev_new("status", id), *list = json_array();

	(void)rq;
	if (!ev || !list) {
		json_decref(ev);
		json_decref(list);
		send_error(c, id, "busy", "relay out of memory");
		return;
	}
	for (struct relay_cmd *m = c->r->cmds; m; m = m->next) {
		json_t *o = json_object();
		size_t nsubs = 0;
		if (!o)
			continue;
		for (struct sub *s = m->subs; s; s = s->mnext)
			nsubs++;
		json_object_set(o, "id", m->id);
		json_object_set(o, "argv", m->argv);
		json_object_set_new(o, "shell", json_boolean(m->shell));
		json_object_set_new(o, "state", json_string(state_names[m->state]));
		json_object_set_new(o, "pid", m->has_pid ? json_integer((json_int_t)m->pid) : json_null());
		json_object_set_new(o, "where", json_string(m->on_host ? "host" : "guest"));
		json_object_set_new(o, "started_ms", json_integer((json_int_t)m->started_wall_ms));
		json_object_set_new(o, "stdout_bytes", json_integer((json_int_t)m->ring[0].end));
		json_object_set_new(o, "stderr_bytes", json_integer((json_int_t)m->ring[1].end));
		json_object_set_new(o, "attached", json_integer((json_int_t)nsubs));
		json_object_set_new(o, "paused", json_boolean(m->pause_told));
		if (m->state == CMD_EXITED) {
			json_object_set_new(o, "code", m->ex.code >= 0 ? json_integer(m->ex.code) : json_null());
			json_object_set_new(o, "signal", m->ex.signal ? json_integer(m->ex.signal) : json_null());
			json_object_set_new(o, "timed_out", json_boolean(m->ex.timed_out));
			json_object_set_new(o, "duration_ms", json_integer((json_int_t)m->ex.duration_ms));
		} else if (m->state == CMD_FAILED) {
			json_object_set_new(o, "error", json_string(m->err_code ? m->err_code : "backend_error"));
		}
		json_array_append_new(list, o);
	}
	json_object_set_new(ev, "commands", list);
	client_send(c, ev);
}

static void op_sync_wait(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	struct pending_sync *ps;
	int rc;

	(void)rq;
	if (c->nsync >= SYNC_PER_CLIENT) {
		send_error(c, id, "busy", "%d sync_wait requests already pending on this connection", SYNC_PER_CLIENT);
		return;
	}
	if (!(ps = mem_calloc(1, sizeof(*ps)))) {
		send_error(c, id, "busy", "relay out of memory");
		return;
	}
	ps->token = ++r->next_token;
	ps->c = c;
	ps->id = id ? json_incref(id) : NULL;
	ps->next = r->syncs;
	r->syncs = ps;
	c->nsync++;
	if ((rc = r->ops->sync_wait(r->ud, ps->token)) < 0) {
		/* relay_sync_done may have run already; find it again */
		for (struct pending_sync **pp = &r->syncs; *pp; pp = &(*pp)->next) {
			if (*pp == ps) {
				*pp = ps->next;
				c->nsync--;
				json_decref(ps->id);
				mem_free(ps);
				break;
			}
		}
		backend_failed(c, id, "sync_wait", rc);
	}
}

/* The dispatch table: one row per op. */
static const struct op ops_table[] = {
    {"exec", op_exec, true, exec_fields},	{"stdin", op_stdin, true, stdin_fields},
    {"signal", op_signal, true, signal_fields}, {"resize", op_resize, true, resize_fields},
    {"cancel", op_cancel, true, no_fields},	{"attach", op_attach, true, attach_fields},
    {"status", op_status, false, no_fields},	{"sync_wait", op_sync_wait, false, no_fields},
};

static void handle_line(struct client *c, const char *p, size_t n)
{
	json_error_t jerr;
	json_t *rq, *id, *op;
	size_t i = 0;

	while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r'))
		i++;
	if (i == n)
		return; /* blank lines are allowed (keep-alives, hand typing) */
	rq = json_loadb(p, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	if (!rq) {
		send_error(c, NULL, "bad_json", "not valid JSON at column %d: %s", jerr.column, jerr.text);
		return;
	}
	if (!json_is_object(rq)) {
		send_error(c, NULL, "bad_json", "a request must be a JSON object");
		goto out;
	}
	id = json_object_get(rq, "id");
	if (id && !json_is_integer(id) &&
	    !(plain_string(id) && json_string_length(id) > 0 && json_string_length(id) <= ID_MAX)) {
		send_error(c, NULL, "bad_field", "field 'id' must be an integer or a string of 1 to %d bytes", ID_MAX);
		goto out;
	}
	op = json_object_get(rq, "op");
	if (!op) {
		send_error(c, id, "missing_field", "field 'op' is required");
		goto out;
	}
	if (!json_is_string(op)) {
		send_error(c, id, "bad_field", "field 'op' must be a string");
		goto out;
	}
	for (size_t k = 0; k < sizeof(ops_table) / sizeof(ops_table[0]); k++) {
		const struct op *o = &ops_table[k];
		if (strcmp(json_string_value(op), o->name))
			continue;
		if (o->id_required && !id) {
			send_error(c, NULL, "missing_field", "field 'id' is required for op '%s'", o->name);
			goto out;
		}
		if (check_fields(c, rq, id, o))
			o->fn(c, rq, id);
		goto out;
	}
	send_error(c, id, "unknown_op",
		   "unknown op '%.64s' (exec, stdin, signal, resize, cancel, attach, status, sync_wait)",
		   json_string_value(op));
out:
	json_decref(rq);
}

/* ------------------------------------------------------------------ */
/* backend -> relay */

static void cmd_service_subs(struct relay_cmd *m, bool stream_only)
{
	/* Servicing a client only removes that client's subs, and a client has
	 * at most one sub per command, so `next` stays valid. */
	for (struct sub *s = m->subs, *next; s; s = next) {
		next = s->mnext;
		if (!stream_only || s->mode == SUB_STREAM)
			client_service(s->c, false);
	}
}

void relay_cmd_started(struct relay_cmd *m, int64_t pid)
{
	if (!m->live || m->has_pid)
		return;
	m->pid = pid;
	m->has_pid = true;
	if (m->state == CMD_STARTING)
		m->state = CMD_RUNNING;
	cmd_service_subs(m, false);
}

void relay_cmd_started_host(struct relay_cmd *m, int64_t pid)
{
	if (!m->live || m->has_pid)
		return;
	m->on_host = true;
	relay_cmd_started(m, pid);
}

void relay_cmd_output(struct relay_cmd *m, enum relay_stream st, const void *data, size_t n)
{
	if (!m->live || (st != RELAY_STDOUT && st != RELAY_STDERR))
		return;
	ring_append(&m->ring[st], data, n);
	cmd_update_pause(m);
	cmd_service_subs(m, true);
}

static void cmd_end(struct relay_cmd *m)
{
	struct relay *r = m->r;

	m->live = false;
	/* The backend is done with it: nothing is held back any more. */
	m->pause_told = false;
	m->end_ms = loop_now_ms();
	r->nrunning--;
	r->nfinished++;
	cmd_update_pause(m);
	cmd_service_subs(m, false);
	kick(r);
}

void relay_cmd_exit(struct relay_cmd *m, const struct relay_exit *ex)
{
	if (!m->live)
		return;
	m->ex = *ex;
	m->state = CMD_EXITED;
	cmd_end(m);
}

void relay_cmd_error(struct relay_cmd *m, const char *code, const char *message)
{
	if (!m->live)
		return;
	m->err_code = mem_strdup(code ? code : "backend_error");
	m->err_msg = mem_strdup(message ? message : "command failed");
	m->state = CMD_FAILED;
	cmd_end(m);
}

void relay_sync_done(struct relay *r, uint64_t token)
{
	for (struct pending_sync **pp = &r->syncs; *pp; pp = &(*pp)->next) {
		struct pending_sync *ps = *pp;
		if (ps->token != token)
			continue;
		*pp = ps->next;
		if (ps->c) {
			ps->c->nsync--;
			client_send(ps->c, ev_new("synced", ps->id));
			client_service(ps->c, false);
		}
		json_decref(ps->id);
		mem_free(ps);
		return;
	}
}

void relay_cmd_set_data(struct relay_cmd *m, void *data)
{
	m->data = data;
}

void *relay_cmd_data(const struct relay_cmd *m)
{
	return m->data;
}

const char *relay_cmd_name(const struct relay_cmd *m)
{
	return m->key;
}

/* ------------------------------------------------------------------ */
/* socket */

static int listen_socket(const char *path, int *out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int fd = -1, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return -EEXIST;
		/* Replace it only if nothing accepts on it. */
		int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (probe < 0)
			return -errno;
		r = connect(probe, (struct sockaddr *)&sa, sizeof(sa));
		int e = errno;
		close(probe);
		if (r == 0 || e == EAGAIN)
			return -EADDRINUSE;
		if (e != ECONNREFUSED && e != ENOENT)
			return -e;
		if (unlink(path) < 0 && errno != ENOENT)
			return -errno;
	} else if (errno != ENOENT) {
		return -errno;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* The socket appears with the umask's mode for an instant; in the
	 * default 0700 directory nobody else can reach it, and the peer uid
	 * check stands behind the mode anyway. */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	if (chmod(path, 0600) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		unlink(path);
		close(fd);
		return r;
	}
	*out = fd;
	return 0;
fail:
	r = -errno;
	close(fd);
	return r;
}

int relay_new(struct loop *l, const struct relay_cfg *cfg, const struct relay_backend_ops *ops, void *ud,
	      struct relay **out)
{
	struct relay *r;
	int rc;

	*out = NULL;
	if (!cfg || !cfg->path || !ops || !ops->exec_start || !ops->stdin_write || !ops->signal || !ops->resize ||
	    !ops->cancel || !ops->sync_wait)
		return -EINVAL;
	if (!(r = mem_calloc(1, sizeof(*r))))
		return -ENOMEM;
	r->l = l;
	r->fd = -1;
	r->ops = ops;
	r->ud = ud;
	r->timeout_s = cfg->timeout_s ? cfg->timeout_s : RELAY_DEFAULT_TIMEOUT_S;
	r->line_max = cfg->line_max ? cfg->line_max : RELAY_LINE_MAX;
	r->ring_bytes = cfg->ring_bytes ? cfg->ring_bytes : RELAY_RING_BYTES;
	r->queue = cfg->client_queue ? cfg->client_queue : RELAY_CLIENT_QUEUE;
	r->max_clients = cfg->max_clients ? cfg->max_clients : RELAY_MAX_CLIENTS;
	r->max_running = cfg->max_running ? cfg->max_running : RELAY_MAX_RUNNING;
	r->keep_finished = cfg->keep_finished ? cfg->keep_finished : RELAY_KEEP_FINISHED;
	if (!(r->path = mem_strdup(cfg->path))) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = listen_socket(r->path, &r->fd)) < 0)
		goto fail;
	if ((rc = loop_add_fd(l, r->fd, EPOLLIN, accept_cb, r)) < 0) {
		unlink(r->path);
		goto fail;
	}
	*out = r;
	return 0;
fail:
	if (r->fd >= 0)
		close(r->fd);
	mem_free(r->path);
	mem_free(r);
	return rc;
}

void relay_free(struct relay *r)
{
	if (!r)
		return;
	while (r->clients)
		client_free(r->clients);
	while (r->syncs) {
		struct pending_sync *ps = r->syncs;
		r->syncs = ps->next;
		json_decref(ps->id);
		mem_free(ps);
	}
	while (r->cmds) {
		struct relay_cmd *m = r->cmds;
		if (m->live && r->ops->release)
			r->ops->release(r->ud, m);
		m->live = false;
		cmd_free(m);
	}
	if (r->hk_timer)
		loop_del_timer(r->l, r->hk_timer);
	if (r->fd >= 0) {
		loop_del_fd(r->l, r->fd);
		close(r->fd);
		unlink(r->path);
	}
	mem_free(r->path);
	mem_free(r);
}

const char *relay_path(const struct relay *r)
{
	return r->path;
}

void relay_get_stats(const struct relay *r, struct relay_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->clients = r->nclients;
	st->running = r->nrunning;
	st->finished = r->nfinished;
	for (const struct relay_cmd *m = r->cmds; m; m = m->next) {
		st->bytes_buffered += m->ring[0].cap + m->ring[1].cap;
		if (m->pause_told)
			st->paused++;
	}
	for (const struct client *c = r->clients; c; c = c->next)
		st->bytes_buffered += c->in.cap + c->out.cap;
}

/* ------------------------------------------------------------------ */
/* default path */

static int private_dir(const char *dir)
{
	struct stat st;

	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	if (lstat(dir, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)))
		return -EPERM;
	return 0;
}

int relay_default_path(const char *workspace_realpath, char *out, size_t n)
{
	const char *env = getenv("AIRLOCK_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dir[PATH_MAX], run[64], name[33];
	unsigned char h[crypto_hash_sha256_BYTES];
	struct stat st;
	uid_t uid = geteuid();
	int rc, k;

	if (env && *env) {
		if (strlen(env) >= n || strlen(env) >= sizeof(((struct sockaddr_un *)0)->sun_path))
			return -ENAMETOOLONG;
		memcpy(out, env, strlen(env) + 1);
		return 0;
	}
	snprintf(run, sizeof(run), "/run/user/%u", (unsigned)uid);
	if (xdg && xdg[0] == '/')
		k = snprintf(dir, sizeof(dir), "%s/airlock", xdg);
	else if (stat(run, &st) == 0 && S_ISDIR(st.st_mode))
		k = snprintf(dir, sizeof(dir), "%s/airlock", run);
	else
		k = snprintf(dir, sizeof(dir), "/tmp/airlock-%u", (unsigned)uid);
	if (k < 0 || (size_t)k >= sizeof(dir))
		return -ENAMETOOLONG;

	/* <name>: the workspace's base name, made safe and short. */
	const char *base = strrchr(workspace_realpath, '/');
	base = base && base[1] ? base + 1 : workspace_realpath;
	size_t j = 0;
	for (size_t i = 0; base[i] && j < sizeof(name) - 1; i++) {
		char ch = base[i];
		bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
			  ch == '-' || ch == '_' || ch == '.';
		name[j++] = ok ? ch : '_';
	}
	name[j] = '\0';
	if (!j)
		memcpy(name, "w", 2);
	else if (name[0] == '.')
		name[0] = '_';
	crypto_hash_sha256(h, (const unsigned char *)workspace_realpath, strlen(workspace_realpath));

	k = snprintf(out, n, "%s/%s-%02x%02x%02x%02x%02x%02x%02x%02x.sock", dir, name, h[0], h[1], h[2], h[3], h[4],
		     h[5], h[6], h[7]);
	if (k < 0 || (size_t)k >= n || (size_t)k >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return -ENAMETOOLONG;
	if ((rc = private_dir(dir)) < 0)
		return rc;
	return 0;
}
