/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chan: the record, handshake and frame layers of wire.h over one
 * non-blocking fd, driven by a struct loop.
 *
 * Shape of a connection:
 *
 *   HS_MSG1 / HS_MSG2   Noise IKpsk2 (noise.h) in two handshake records;
 *                       the responder may answer with a REFUSE record.
 *   HS_HEADER           each side sends its secretstream header record and
 *                       waits for the peer's; records are still capped at
 *                       WIRE_HS_MSG_MAX.
 *   HS_DONE (ready)     every record is one secretstream message holding
 *                       one frame; records are capped at WIRE_RECORD_MAX.
 *
 * Callback discipline. Callbacks (on_ready, on_frame, on_writable,
 * on_close) are only ever invoked from the loop's callbacks into chan
 * (fd readiness and chan's own timers), never from inside chan_send(),
 * chan_consume() or chan_close(); those record what must happen and let
 * the loop do it (a 0 ms "kick" timer, or EPOLLOUT). Every entry from the
 * loop holds c->busy, so chan_free() from inside any callback only marks
 * the chan and the memory goes when the outermost entry returns; after
 * each callback the caller checks stopped() before touching anything.
 */
#include "airlock/core/chan.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"

_Static_assert(WIRE_SS_ABYTES == crypto_secretstream_xchacha20poly1305_ABYTES, "wire.h ABYTES");
_Static_assert(WIRE_SS_HEADER == crypto_secretstream_xchacha20poly1305_HEADERBYTES, "wire.h HEADER");
_Static_assert(NOISE_KEY_LEN == crypto_secretstream_xchacha20poly1305_KEYBYTES, "split keys key the stream");
_Static_assert(WIRE_RECORD_MAX <= UINT32_MAX, "record length fits the u32 prefix");
_Static_assert(2 + NOISE_MSG1_LEN(12) <= WIRE_HS_MSG_MAX, "msg1 fits a handshake record");
_Static_assert(1 + NOISE_MSG2_LEN(0) <= WIRE_HS_MSG_MAX, "msg2 fits a handshake record");

#define TAI64N_LEN 12u
#define MSG1_BODY  (2u + NOISE_MSG1_LEN(TAI64N_LEN)) /* kind, version, Noise msg1 */
#define MSG2_BODY  (1u + NOISE_MSG2_LEN(0))	     /* kind, Noise msg2 */
#define PLAIN_MAX  (WIRE_FRAME_HDR + WIRE_PAYLOAD_MAX)
/* Wire bytes of a record carrying a frame with n payload bytes. */
#define RECORD_BYTES(n) (WIRE_LEN_BYTES + WIRE_FRAME_HDR + (n) + WIRE_SS_ABYTES)
#define IN_MAX		(WIRE_LEN_BYTES + WIRE_RECORD_MAX)
/* Data streams may queue up to HIWAT (+ the record that crossed it);
 * control frames and chan's own WINDOW/BYE get this much more, so the
 * control stream never deadlocks behind data. */
#define OUT_CONTROL_CAP (2u * (WIRE_LEN_BYTES + WIRE_RECORD_MAX))
#define OUT_MAX		(CHAN_OUT_HIWAT + OUT_CONTROL_CAP)
/* Write at once when this much is queued; smaller bursts wait for
 * EPOLLOUT so one wakeup's frames leave in one write(). */
#define FLUSH_AT (64u * 1024u)
/* Records handled per wakeup before yielding to the loop. */
#define RECORDS_PER_WAKEUP 64u
#define WHY_LEN		   256u

struct peer_entry {
	uint8_t pub[NOISE_KEY_LEN];
	uint8_t ts[TAI64N_LEN]; /* newest accepted TAI64N, valid when seen */
	bool seen;
};

struct chan_peers {
	struct peer_entry *v;
	size_t n, cap;
};

enum hs_state {
	HS_MSG1,   /* responder: waiting for msg1 */
	HS_MSG2,   /* initiator: waiting for msg2 or a refusal */
	HS_HEADER, /* both: our header is queued, waiting for the peer's */
	HS_DONE,   /* ready: transport records */
};

struct stream {
	uint32_t id;
	unsigned flags;
	uint32_t send_avail; /* payload bytes we may still send */
	uint32_t recv_avail; /* payload bytes the peer may still send */
	uint32_t consumed;   /* consumed by the application, credit not yet sent */
	bool blocked;	     /* chan_send said -EAGAIN for lack of window */
};

struct chan {
	struct loop *loop;
	int fd;
	bool is_sock;
	bool registered;
	uint32_t mask; /* events registered with the loop */
	const struct chan_ops *ops;
	void *ud;

	/* configuration */
	enum noise_role role;
	struct noise_keypair self;
	uint8_t peer[NOISE_KEY_LEN]; /* initiator: pinned; responder: learned from msg1 */
	uint8_t psk[NOISE_KEY_LEN];
	struct chan_peers *peers;
	uint32_t window;
	uint64_t rekey_bytes;
	uint32_t rekey_ms;
	uint32_t handshake_ms;

	/* handshake and keys */
	enum hs_state hs;
	struct noise_hs nhs;
	uint8_t rx_key[NOISE_KEY_LEN]; /* held from Split() until the peer's header */
	crypto_secretstream_xchacha20poly1305_state tx, rx;
	bool ready;

	/* records */
	struct buf in, out;
	uint8_t *rx_plain, *tx_plain; /* PLAIN_MAX each */
	uint32_t cur_len;	      /* body length of the record being handled */
	uint64_t rec_in;	      /* transport records received */
	uint64_t since_rekey;	      /* plaintext bytes sent since the last REKEY */
	uint64_t last_rekey_ms;

	/* streams: sorted by id */
	struct stream *streams;
	size_t nstreams, capstreams;
	uint32_t next_stream;
	unsigned default_flags;

	/* closing */
	bool close_req;	 /* chan_close() called, or the peer said BYE */
	bool bye_queued; /* our FINAL record is in out */
	bool shut_wr;
	bool final_in; /* the peer's FINAL record arrived */
	bool eof_in;
	bool want_writable;  /* chan_send said -EAGAIN for a full queue */
	bool credit_pending; /* a WINDOW frame did not fit; retry on drain */
	int werr;	     /* deferred write error */

	uint64_t hs_timer, close_timer, kick_timer;
	unsigned busy;
	bool freed;  /* chan_free() ran inside a callback */
	bool closed; /* on_close fired (or is firing) */

	uint64_t t_start_ns;
	struct chan_stats st;
	char why[WHY_LEN];
};

static void on_io(struct loop *l, int fd, uint32_t events, void *ud);
static void after_io(struct chan *c);

/* ---- small helpers ---- */

static bool stopped(const struct chan *c)
{
	return c->closed || c->freed;
}

static void enter(struct chan *c)
{
	c->busy++;
}

static void destroy(struct chan *c);

static void leave(struct chan *c)
{
	if (--c->busy == 0 && c->freed)
		destroy(c);
}

static void wipe_secrets(struct chan *c)
{
	noise_hs_clear(&c->nhs);
	sodium_memzero(c->rx_key, sizeof(c->rx_key));
	sodium_memzero(&c->tx, sizeof(c->tx));
	sodium_memzero(&c->rx, sizeof(c->rx));
	sodium_memzero(&c->self, sizeof(c->self));
	sodium_memzero(c->psk, sizeof(c->psk));
}

static void cancel_timers(struct chan *c)
{
	loop_del_timer(c->loop, c->hs_timer);
	loop_del_timer(c->loop, c->close_timer);
	loop_del_timer(c->loop, c->kick_timer);
	c->hs_timer = c->close_timer = c->kick_timer = 0;
}

static void unregister(struct chan *c)
{
	if (c->registered) {
		loop_del_fd(c->loop, c->fd);
		c->registered = false;
	}
}

static void update_mask(struct chan *c)
{
	uint32_t m = 0;

	if (!c->registered)
		return;
	if (!c->eof_in)
		m |= EPOLLIN;
	if (buf_len(&c->out) > 0 && !c->werr)
		m |= EPOLLOUT;
	if (m != c->mask && loop_mod_fd(c->loop, c->fd, m) == 0)
		c->mask = m;
}

static void on_kick(struct loop *l, void *ud);

/* Have the loop call back into chan soon (from inside an API call, where
 * no callback may fire). */
static void schedule_kick(struct chan *c)
{
	if (c->kick_timer || stopped(c))
		return;
	c->kick_timer = loop_add_timer(c->loop, 0, on_kick, c);
	/* Out of memory for a timer: EPOLLOUT on a socket with room fires at
	 * once and after_io() does the same work. */
	if (!c->kick_timer && c->registered && loop_mod_fd(c->loop, c->fd, c->mask | EPOLLOUT) == 0)
		c->mask |= EPOLLOUT;
}

/* The connection is over: stop I/O, wipe keys, tell the application once. */
__attribute__((format(printf, 3, 0))) static void vend(struct chan *c, int err, const char *fmt, va_list ap)
{
	if (stopped(c))
		return;
	c->closed = true;
	vsnprintf(c->why, sizeof(c->why), fmt, ap);
	cancel_timers(c);
	unregister(c);
	/* On a fault the peer learns at once that the connection is gone,
	 * even if the application keeps the chan around. */
	if (err != 0 && c->is_sock)
		shutdown(c->fd, SHUT_RDWR);
	wipe_secrets(c);
	if (c->ops->on_close)
		c->ops->on_close(c, err, c->why, c->ud);
}

__attribute__((format(printf, 3, 4))) static void end(struct chan *c, int err, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vend(c, err, fmt, ap);
	va_end(ap);
}

/* ---- output ---- */

/* Write queued bytes until the socket is full. 0 or -errno. */
static int flush(struct chan *c)
{
	while (buf_len(&c->out) > 0) {
		ssize_t n = c->is_sock ? send(c->fd, buf_ptr(&c->out), buf_len(&c->out), MSG_NOSIGNAL | MSG_DONTWAIT)
				       : write(c->fd, buf_ptr(&c->out), buf_len(&c->out));
		if (n > 0) {
			buf_consume(&c->out, (size_t)n);
			c->st.bytes_out += (uint64_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return 0;
		return n < 0 ? -errno : -EIO;
	}
	return 0;
}

/* Flush from an API call: an error is kept for the loop to report. */
static void try_flush(struct chan *c)
{
	int r;

	if (c->werr || !c->registered)
		return;
	if ((r = flush(c)) < 0) {
		c->werr = r;
		schedule_kick(c);
	}
	/* The queue may have drained here rather than on EPOLLOUT: the
	 * on_writable owed for an earlier -EAGAIN comes from the loop. */
	else if (c->want_writable && buf_len(&c->out) < CHAN_OUT_HIWAT / 2)
		schedule_kick(c);
}

/* After queueing: write now if a lot is queued, else let EPOLLOUT batch. */
static void output_kick(struct chan *c)
{
	if (buf_len(&c->out) >= FLUSH_AT)
		try_flush(c);
	update_mask(c);
}

/* A plaintext handshake record. */
static int queue_record(struct chan *c, const void *body, size_t n)
{
	uint8_t *d;
	int r;

	if ((r = buf_reserve(&c->out, WIRE_LEN_BYTES + n, &d)) < 0)
		return r;
	buf_store_be32(d, wire_record_hdr((uint32_t)n));
	memcpy(d + WIRE_LEN_BYTES, body, n);
	buf_commit(&c->out, WIRE_LEN_BYTES + n);
	return 0;
}

static bool rekey_due(const struct chan *c)
{
	return c->since_rekey >= c->rekey_bytes || loop_now_ms() - c->last_rekey_ms >= c->rekey_ms;
}

/* Encrypt one frame into one record at the end of the output queue.
 * -ENOBUFS when the queue's hard cap would be passed, -ENOMEM. */
static int queue_frame(struct chan *c, uint8_t type, uint32_t stream, const void *p, size_t n, uint8_t tag)
{
	size_t mlen = WIRE_FRAME_HDR + n;
	size_t total = RECORD_BYTES(n);
	unsigned long long clen;
	uint8_t *d;
	int r;

	if ((r = buf_reserve(&c->out, total, &d)) < 0)
		return r;
	c->tx_plain[0] = type;
	buf_store_be32(c->tx_plain + 1, stream);
	if (n)
		memcpy(c->tx_plain + WIRE_FRAME_HDR, p, n);
	if (tag == crypto_secretstream_xchacha20poly1305_TAG_MESSAGE && rekey_due(c))
		tag = crypto_secretstream_xchacha20poly1305_TAG_REKEY;
	crypto_secretstream_xchacha20poly1305_push(&c->tx, d + WIRE_LEN_BYTES, &clen, c->tx_plain, mlen, NULL, 0, tag);
	buf_store_be32(d, wire_record_hdr((uint32_t)clen));
	buf_commit(&c->out, total);
	c->st.frames_out++;
	c->since_rekey += mlen;
	if (tag == crypto_secretstream_xchacha20poly1305_TAG_REKEY) {
		/* libsodium rekeys the push state after this message; the
		 * peer's pull does the same when it sees the tag. */
		c->st.rekeys_sent++;
		c->since_rekey = 0;
		c->last_rekey_ms = loop_now_ms();
	}
	return 0;
}

static void on_close_timeout(struct loop *l, void *ud);

/* Queue our BYE tagged FINAL: the last record we send. */
static int queue_bye(struct chan *c)
{
	int r;

	if (c->bye_queued)
		return 0;
	if ((r = queue_frame(c, WIRE_BYE, WIRE_STREAM_CONTROL, NULL, 0,
			     crypto_secretstream_xchacha20poly1305_TAG_FINAL)) < 0)
		return r;
	c->bye_queued = true;
	return 0;
}

/* ---- streams ---- */

static size_t stream_pos(const struct chan *c, uint32_t id)
{
	size_t lo = 0, hi = c->nstreams;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (c->streams[mid].id < id)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

static struct stream *stream_find(const struct chan *c, uint32_t id)
{
	size_t i = stream_pos(c, id);

	return i < c->nstreams && c->streams[i].id == id ? &c->streams[i] : NULL;
}

/* -ENOSPC at WIRE_STREAMS_MAX, -ENOMEM. */
static int stream_add(struct chan *c, uint32_t id, unsigned flags, struct stream **out)
{
	if (c->nstreams >= WIRE_STREAMS_MAX)
		return -ENOSPC;
	if (c->nstreams == c->capstreams) {
		size_t n = c->capstreams ? c->capstreams * 2 : 8;
		struct stream *ns = mem_realloc(c->streams, n * sizeof(*ns));
		if (!ns)
			return -ENOMEM;
		c->streams = ns;
		c->capstreams = n;
	}
	size_t i = stream_pos(c, id);
	memmove(&c->streams[i + 1], &c->streams[i], (c->nstreams - i) * sizeof(*c->streams));
	c->streams[i] = (struct stream){.id = id, .flags = flags, .send_avail = c->window, .recv_avail = c->window};
	c->nstreams++;
	*out = &c->streams[i];
	return 0;
}

static uint32_t credit_threshold(const struct chan *c)
{
	return c->window >= 4 ? c->window / 4 : 1;
}

/* Send the stream's consumed bytes back as credit. False when the WINDOW
 * frame did not fit (kept for later). */
static bool send_credit(struct chan *c, struct stream *s)
{
	struct buf pl;
	int r;

	buf_init(&pl, 16);
	if ((r = wire_window_encode(&pl, &(struct wire_window){.stream = s->id, .credit = s->consumed})) == 0)
		r = queue_frame(c, WIRE_WINDOW, WIRE_STREAM_CONTROL, buf_ptr(&pl), buf_len(&pl),
				crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
	buf_clear(&pl);
	if (r < 0) {
		c->credit_pending = true;
		return false;
	}
	s->recv_avail += s->consumed;
	s->consumed = 0;
	return true;
}

static void credit_add(struct chan *c, struct stream *s, size_t n)
{
	/* Never grant more than the window: an application that consumes
	 * more than it was given must not let the peer queue unbounded
	 * bytes at us. */
	uint64_t room = (uint64_t)c->window - s->recv_avail - s->consumed;
	if (s->recv_avail + (uint64_t)s->consumed > c->window)
		room = 0;
	if (n > room)
		n = (size_t)room;
	s->consumed += (uint32_t)n;
	if (s->consumed >= credit_threshold(c) && !c->bye_queued)
		send_credit(c, s);
}

static void retry_credit(struct chan *c)
{
	c->credit_pending = false;
	for (size_t i = 0; i < c->nstreams; i++)
		if (c->streams[i].consumed >= credit_threshold(c) && !send_credit(c, &c->streams[i]))
			return;
}

/* ---- handshake ---- */

static void on_hs_timeout(struct loop *l, void *ud);

/* Best effort: the refusal is a hint for the human on the other side and
 * 6 bytes on a fresh connection; if the socket cannot take it now, it is
 * dropped. */
static void send_refusal(struct chan *c, uint8_t reason)
{
	uint8_t body[2] = {WIRE_HS_REFUSE, reason};

	if (queue_record(c, body, sizeof(body)) == 0)
		(void)flush(c);
	if (c->is_sock)
		shutdown(c->fd, SHUT_WR);
}

__attribute__((format(printf, 3, 4))) static void refuse(struct chan *c, uint8_t reason, const char *fmt, ...)
{
	va_list ap;

	send_refusal(c, reason);
	va_start(ap, fmt);
	vend(c, -EACCES, fmt, ap);
	va_end(ap);
}

/* After Split(): start our secretstream, queue its header record, keep
 * the receive key until the peer's header arrives. */
static int start_stream(struct chan *c, const uint8_t tx_key[NOISE_KEY_LEN], const uint8_t rx_key[NOISE_KEY_LEN])
{
	uint8_t header[WIRE_SS_HEADER];

	crypto_secretstream_xchacha20poly1305_init_push(&c->tx, header, tx_key);
	memcpy(c->rx_key, rx_key, NOISE_KEY_LEN);
	c->hs = HS_HEADER;
	c->last_rekey_ms = loop_now_ms();
	c->since_rekey = 0;
	return queue_record(c, header, sizeof(header));
}

static int start_initiator(struct chan *c)
{
	uint8_t ts[TAI64N_LEN];
	uint8_t body[MSG1_BODY];
	size_t n;
	int r;

	/* The prologue binds WIRE_VERSION into the handshake hash (without
	 * its NUL). */
	if ((r = noise_hs_init(&c->nhs, NOISE_INITIATOR, WIRE_PROLOGUE, sizeof(WIRE_PROLOGUE) - 1, &c->self, c->peer,
			       c->psk)) < 0)
		return r;
	noise_tai64n(ts);
	body[0] = WIRE_HS_INIT;
	body[1] = WIRE_VERSION;
	/* Noise: -> e, es, s, ss with payload = TAI64N (WireGuard's replay
	 * guard) */
	if ((r = noise_write_msg1(&c->nhs, ts, sizeof(ts), body + 2, sizeof(body) - 2, &n)) < 0)
		return r;
	c->hs = HS_MSG2;
	return queue_record(c, body, 2 + n);
}

static struct peer_entry *peers_find(struct chan_peers *p, const uint8_t pub[NOISE_KEY_LEN])
{
	for (size_t i = 0; i < p->n; i++)
		if (memcmp(p->v[i].pub, pub, NOISE_KEY_LEN) == 0)
			return &p->v[i];
	return NULL;
}

/* Responder: msg1 = [INIT][version][Noise msg1 (e, es, s, ss, TAI64N)]. */
static void rx_msg1(struct chan *c, const uint8_t *p, size_t n)
{
	uint8_t kind = 0, version = 0;
	uint8_t ts[TAI64N_LEN];
	uint8_t reply[MSG2_BODY];
	uint8_t i2r[NOISE_KEY_LEN], r2i[NOISE_KEY_LEN];
	size_t plen = 0, rn;
	int stage = 0, r;
	struct buf b;

	buf_view(&b, p, n);
	(void)buf_get_u8(&b, &kind);
	(void)buf_get_u8(&b, &version);
	/* The version byte is checked before the size: another version may
	 * have another msg1 size, and "version" is the useful answer then. */
	if (n >= 2 && kind == WIRE_HS_INIT && version != WIRE_VERSION) {
		refuse(c, WIRE_REFUSE_VERSION, "host handshake refused: the host speaks wire version %u, we speak %u",
		       version, WIRE_VERSION);
		return;
	}
	if (n != MSG1_BODY || kind != WIRE_HS_INIT) {
		refuse(
		    c, WIRE_REFUSE_MALFORMED,
		    "host handshake refused: malformed first message (%zu bytes, kind %u; expected %u bytes, kind %u)",
		    n, kind, MSG1_BODY, WIRE_HS_INIT);
		return;
	}
	if ((r = noise_hs_init(&c->nhs, NOISE_RESPONDER, WIRE_PROLOGUE, sizeof(WIRE_PROLOGUE) - 1, &c->self, NULL,
			       c->psk)) < 0) {
		end(c, r, "handshake setup failed: %s", strerror(-r));
		return;
	}
	r = noise_read_msg1(&c->nhs, buf_ptr(&b), buf_len(&b), ts, sizeof(ts), &plen, &stage);
	if (r == -EBADMSG && stage == 1) {
		refuse(c, WIRE_REFUSE_GUEST_KEY,
		       "host handshake failed: the host does not have this guest's public key (or speaks another "
		       "version)");
		return;
	}
	if (r < 0 || plen != TAI64N_LEN) {
		refuse(c, WIRE_REFUSE_MALFORMED, "host handshake failed: the first message did not verify (%s)",
		       r < 0 ? strerror(-r) : "wrong payload size");
		goto out;
	}
	struct peer_entry *pe = peers_find(c->peers, c->nhs.rs);
	if (!pe) {
		char b64[sodium_base64_ENCODED_LEN(NOISE_KEY_LEN, sodium_base64_VARIANT_ORIGINAL)];
		sodium_bin2base64(b64, sizeof(b64), c->nhs.rs, NOISE_KEY_LEN, sodium_base64_VARIANT_ORIGINAL);
		refuse(c, WIRE_REFUSE_HOST_KEY, "host handshake refused: host key %s is not on this guest's allow-list",
		       b64);
		goto out;
	}
	/* WireGuard 5.1: a msg1 whose timestamp is not strictly newer than
	 * the newest accepted for this key is a replay (or a clock that went
	 * back). TAI64N is big-endian, so memcmp orders it. */
	if (pe->seen && memcmp(ts, pe->ts, TAI64N_LEN) <= 0) {
		char b64[sodium_base64_ENCODED_LEN(NOISE_KEY_LEN, sodium_base64_VARIANT_ORIGINAL)];
		sodium_bin2base64(b64, sizeof(b64), c->nhs.rs, NOISE_KEY_LEN, sodium_base64_VARIANT_ORIGINAL);
		refuse(c, WIRE_REFUSE_REPLAY,
		       "host handshake refused: replayed first message from host key %s (timestamp not newer than the "
		       "last one accepted)",
		       b64);
		goto out;
	}
	/* The whole msg1 verified: only now does its timestamp count. */
	memcpy(pe->ts, ts, TAI64N_LEN);
	pe->seen = true;
	memcpy(c->peer, c->nhs.rs, NOISE_KEY_LEN);

	reply[0] = WIRE_HS_RESP;
	/* Noise: <- e, ee, se, psk with an empty payload */
	if ((r = noise_write_msg2(&c->nhs, NULL, 0, reply + 1, sizeof(reply) - 1, &rn)) < 0 ||
	    (r = noise_split(&c->nhs, i2r, r2i, NULL)) < 0) {
		end(c, r, "handshake failed writing our reply: %s", strerror(-r));
		goto out;
	}
	if ((r = queue_record(c, reply, 1 + rn)) < 0 || (r = start_stream(c, r2i, i2r)) < 0)
		end(c, r, "handshake: %s", strerror(-r));
out:
	sodium_memzero(ts, sizeof(ts));
	sodium_memzero(i2r, sizeof(i2r));
	sodium_memzero(r2i, sizeof(r2i));
	noise_hs_clear(&c->nhs);
}

/* Initiator: msg2 = [RESP][Noise msg2], or [REFUSE][reason]. */
static void rx_msg2(struct chan *c, const uint8_t *p, size_t n)
{
	uint8_t kind = 0, reason = 0;
	uint8_t i2r[NOISE_KEY_LEN], r2i[NOISE_KEY_LEN];
	size_t plen = 0;
	int r;
	struct buf b;

	buf_view(&b, p, n);
	(void)buf_get_u8(&b, &kind);
	if (kind == WIRE_HS_REFUSE) {
		(void)buf_get_u8(&b, &reason);
		end(c, -EACCES, "guest refused the handshake: %s", wire_refusal_str(reason));
		return;
	}
	if (kind != WIRE_HS_RESP || n != MSG2_BODY) {
		end(c, -EPROTO,
		    "guest sent an invalid handshake reply (%zu bytes, kind %u; expected %u bytes, kind %u)", n, kind,
		    MSG2_BODY, WIRE_HS_RESP);
		return;
	}
	if (noise_read_msg2(&c->nhs, buf_ptr(&b), buf_len(&b), NULL, 0, &plen) < 0 || plen != 0) {
		end(c, -EACCES,
		    "guest's handshake reply did not authenticate: the pre-shared key differs (or the reply was "
		    "tampered with)");
		return;
	}
	if ((r = noise_split(&c->nhs, i2r, r2i, NULL)) < 0 || (r = start_stream(c, i2r, r2i)) < 0)
		end(c, r, "handshake: %s", strerror(-r));
	sodium_memzero(i2r, sizeof(i2r));
	sodium_memzero(r2i, sizeof(r2i));
}

/* Both: the peer's secretstream header. Ready after it. */
static void rx_header(struct chan *c, const uint8_t *p, size_t n)
{
	if (n != WIRE_SS_HEADER) {
		end(c, -EPROTO, "handshake: the peer's stream header record is %zu bytes, expected %u", n,
		    WIRE_SS_HEADER);
		return;
	}
	int r = crypto_secretstream_xchacha20poly1305_init_pull(&c->rx, p, c->rx_key);
	sodium_memzero(c->rx_key, sizeof(c->rx_key));
	if (r != 0) {
		end(c, -EBADMSG, "handshake: the peer's stream header was refused");
		return;
	}
	c->hs = HS_DONE;
	c->ready = true;
	c->st.handshake_ns = loop_now_ns() - c->t_start_ns;
	loop_del_timer(c->loop, c->hs_timer);
	c->hs_timer = 0;
	/* chan_close() during the handshake: after_io() closes in order. */
	if (!c->close_req && c->ops->on_ready)
		c->ops->on_ready(c, c->ud);
}

/* ---- transport frames ---- */

typedef void frame_fn(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n);

/* WINDOW: stream 0, u32 stream, u32 credit increment. */
static void rx_window(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	struct wire_window m;
	struct buf b;
	(void)type;

	buf_view(&b, p, n);
	if (stream != WIRE_STREAM_CONTROL || wire_window_decode(&b, &m) < 0) {
		end(c, -EPROTO, "malformed WINDOW frame (stream %u, %zu bytes)", stream, n);
		return;
	}
	uint32_t sid = m.stream, inc = m.credit;
	struct stream *s = stream_find(c, sid);
	if (!s)
		return; /* we closed that stream; late credit is harmless */
	if ((uint64_t)s->send_avail + inc > UINT32_MAX) {
		end(c, -EPROTO, "WINDOW on stream %u overflows its credit", sid);
		return;
	}
	s->send_avail += inc;
	if (s->blocked && inc > 0) {
		s->blocked = false;
		if (c->ops->on_writable && !c->close_req)
			c->ops->on_writable(c, c->ud);
	}
}

/* BYE: the peer's last record (tagged FINAL). Answer with ours. */
static void rx_bye(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	(void)type;
	(void)p;
	(void)n;
	if (stream != WIRE_STREAM_CONTROL) {
		end(c, -EPROTO, "BYE on stream %u (must be 0)", stream);
		return;
	}
	if (buf_len(&c->in) > WIRE_LEN_BYTES + (size_t)c->cur_len) {
		end(c, -EPROTO, "the peer sent data after its FINAL record");
		return;
	}
	c->final_in = true;
	c->close_req = true;
	(void)queue_bye(c); /* a full queue: after_io() retries */
	if (!c->close_timer)
		c->close_timer = loop_add_timer(c->loop, CHAN_CLOSE_MS, on_close_timeout, c);
}

static void rx_app(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	unsigned flags = 0;
	int r;

	if (stream != WIRE_STREAM_CONTROL) {
		struct stream *s = stream_find(c, stream);
		if (!s && (r = stream_add(c, stream, c->default_flags, &s)) < 0) {
			if (r == -ENOSPC)
				end(c, -EPROTO, "the peer opened more than %u streams", WIRE_STREAMS_MAX);
			else
				end(c, r, "stream %u: %s", stream, strerror(-r));
			return;
		}
		if (n > s->recv_avail) {
			end(c, -EPROTO, "stream %u: the peer sent %zu bytes with only %u bytes of window left", stream,
			    n, s->recv_avail);
			return;
		}
		s->recv_avail -= (uint32_t)n;
		flags = s->flags;
	}
	if (c->ops->on_frame)
		c->ops->on_frame(c, type, stream, p, n, c->ud);
	if (stopped(c))
		return;
	/* Look the stream up again: on_frame may have opened or closed
	 * streams, which moves the array. */
	struct stream *s;
	if ((flags & CHAN_STREAM_AUTO) && n > 0 && (s = stream_find(c, stream)))
		credit_add(c, s, n);
}

/* Frame types chan handles itself; everything else goes to on_frame. */
static const struct {
	frame_fn *fn;
} chan_frames[WIRE_TYPE_MAX + 1] = {
    [WIRE_WINDOW] = {rx_window},
    [WIRE_BYE] = {rx_bye},
};

static void rx_transport(struct chan *c, const uint8_t *p, size_t n)
{
	unsigned long long mlen = 0;
	unsigned char tag = 0;
	uint8_t type;
	uint32_t stream;
	struct buf f;

	c->rec_in++;
	/* The first failure ends the connection: secretstream state is not
	 * advanced by a failed pull, but nothing after a fault is trusted. */
	if (n < WIRE_SS_ABYTES ||
	    crypto_secretstream_xchacha20poly1305_pull(&c->rx, c->rx_plain, &mlen, &tag, p, n, NULL, 0) != 0) {
		end(c, -EBADMSG, "record %llu failed authentication: tampered, reordered, replayed or reflected",
		    (unsigned long long)c->rec_in);
		return;
	}
	if (tag == crypto_secretstream_xchacha20poly1305_TAG_REKEY) {
		c->st.rekeys_seen++;
	} else if (tag != crypto_secretstream_xchacha20poly1305_TAG_MESSAGE &&
		   tag != crypto_secretstream_xchacha20poly1305_TAG_FINAL) {
		end(c, -EPROTO, "record %llu carries secretstream tag %u, which airlock does not use",
		    (unsigned long long)c->rec_in, tag);
		return;
	}
	buf_view(&f, c->rx_plain, (size_t)mlen);
	if (buf_get_u8(&f, &type) < 0 || buf_get_u32(&f, &stream) < 0) {
		end(c, -EPROTO, "record %llu holds a %llu-byte frame, shorter than the %u-byte frame header",
		    (unsigned long long)c->rec_in, mlen, WIRE_FRAME_HDR);
		return;
	}
	if ((tag == crypto_secretstream_xchacha20poly1305_TAG_FINAL) != (type == WIRE_BYE)) {
		end(c, -EPROTO, "record %llu: %s", (unsigned long long)c->rec_in,
		    type == WIRE_BYE ? "BYE without the FINAL tag" : "FINAL tag on a frame that is not BYE");
		return;
	}
	c->st.frames_in++;
	frame_fn *fn = chan_frames[type].fn ? chan_frames[type].fn : rx_app;
	fn(c, type, stream, buf_ptr(&f), buf_len(&f));
}

typedef void record_fn(struct chan *c, const uint8_t *p, size_t n);

static record_fn *const record_handlers[] = {
    [HS_MSG1] = rx_msg1,
    [HS_MSG2] = rx_msg2,
    [HS_HEADER] = rx_header,
    [HS_DONE] = rx_transport,
};

/* ---- input ---- */

/* Handle buffered complete records. -1 when the chan stopped, 1 when the
 * budget ran out with complete records left, 0 when more bytes are needed. */
static int pump(struct chan *c, unsigned *budget)
{
	uint32_t hdr, len;

	while (buf_peek_u32(&c->in, 0, &hdr) == 0) {
		size_t limit = c->ready ? WIRE_RECORD_MAX : WIRE_HS_MSG_MAX;
		if (wire_record_len(hdr, &len) < 0) {
			if (c->hs == HS_MSG1)
				send_refusal(c, WIRE_REFUSE_MALFORMED);
			end(c, -EBADMSG, "record header %08x is damaged (its check byte does not match)", hdr);
			return -1;
		}
		/* The length is checked before the body is read or anything
		 * is allocated for it. */
		if (len > limit) {
			if (c->hs == HS_MSG1)
				send_refusal(c, WIRE_REFUSE_MALFORMED);
			end(c, -EMSGSIZE, "record length %u exceeds the limit %zu", len, limit);
			return -1;
		}
		if (buf_len(&c->in) - WIRE_LEN_BYTES < len)
			return 0;
		if (*budget == 0)
			return 1;
		(*budget)--;
		c->cur_len = len;
		record_handlers[c->hs](c, buf_ptr(&c->in) + WIRE_LEN_BYTES, len);
		if (stopped(c))
			return -1;
		buf_consume(&c->in, WIRE_LEN_BYTES + (size_t)len);
	}
	return 0;
}

static const char *const hs_eof_why[2][4] = {
    /* initiator */
    {
	[HS_MSG2] = "guest closed the connection during the handshake, before replying",
	[HS_HEADER] = "guest closed the connection during the handshake",
    },
    /* responder */
    {
	[HS_MSG1] = "host closed the connection before sending its handshake",
	[HS_HEADER] = "host closed the connection during the handshake, after our reply "
		      "(it may have rejected it: do the pre-shared keys match?)",
    },
};

static void on_eof(struct chan *c)
{
	bool partial = buf_len(&c->in) > 0;

	c->eof_in = true;
	if (c->final_in)
		return; /* expected after the peer's BYE; after_io() finishes */
	if (!c->ready) {
		const char *why = hs_eof_why[c->role == NOISE_RESPONDER][c->hs];
		end(c, -EPIPE, "%s", why ? why : "connection closed during the handshake");
		return;
	}
	/* Even after our own BYE the peer must answer with its FINAL: an
	 * orderly close is a two-way exchange, so a peer that lost records
	 * (and closed on the error) is told apart from one that got them all. */
	end(c, -EPIPE,
	    partial ? "connection truncated inside a record: peer closed without FINAL"
		    : "connection truncated: peer closed without FINAL");
}

static void do_input(struct chan *c)
{
	unsigned budget = RECORDS_PER_WAKEUP;
	uint8_t *d;
	int r;

	for (;;) {
		if ((r = pump(c, &budget)) < 0)
			return;
		if (r > 0) {
			schedule_kick(c); /* let other fds and timers run first */
			return;
		}
		if (c->eof_in)
			return;
		/* What is buffered is less than one record, so there is room. */
		size_t room = IN_MAX - buf_len(&c->in);
		if ((r = buf_reserve(&c->in, room, &d)) < 0) {
			end(c, r, "no memory for the input buffer: %s", strerror(-r));
			return;
		}
		ssize_t n = read(c->fd, d, room);
		if (n > 0) {
			if (c->final_in) {
				end(c, -EPROTO, "the peer sent data after its FINAL record");
				return;
			}
			buf_commit(&c->in, (size_t)n);
			c->st.bytes_in += (uint64_t)n;
			continue;
		}
		if (n == 0) {
			on_eof(c);
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return;
		end(c, -errno, "read from the peer failed: %s", strerror(errno));
		return;
	}
}

/* ---- loop callbacks ---- */

/* After input (or a kick): deferred errors, retries, flushing, wakeups,
 * and the end of an orderly close. */
static void after_io(struct chan *c)
{
	int r;

	if (stopped(c))
		return;
	if (!c->ready && c->close_req) {
		end(c, -ECANCELED, "closed by the application before the handshake completed");
		return;
	}
	if (c->ready && !c->bye_queued) {
		if (c->credit_pending)
			retry_credit(c);
		if (c->close_req)
			(void)queue_bye(c);
	}
	r = c->werr ? c->werr : flush(c);
	if (r < 0) {
		/* A peer that said BYE may close without reading our answer. */
		if (c->final_in)
			end(c, 0, "peer closed the connection");
		else
			end(c, r, "write to the peer failed: %s", strerror(-r));
		return;
	}
	if (c->ready && !c->close_req) {
		if (c->want_writable && buf_len(&c->out) < CHAN_OUT_HIWAT / 2) {
			c->want_writable = false;
			if (c->ops->on_writable)
				c->ops->on_writable(c, c->ud);
			if (stopped(c))
				return;
		}
	}
	if (c->bye_queued && buf_len(&c->out) == 0) {
		/* No half-close (shutdown SHUT_WR) here: the FINAL record
		 * says it in band, and some stream ends do not survive one.
		 * qemu's socket chardev (the vm sandbox's channel) drops the
		 * whole connection on the host's EOF, so the guest's answering
		 * FINAL was lost and stayed queued in the VM for the next
		 * connection, whose handshake then failed. We wait for the
		 * peer's FINAL (or EOF) with the stream open both ways. */
		c->shut_wr = true;
		if (c->final_in || c->eof_in) {
			end(c, 0, c->final_in ? "peer closed the connection" : "closed");
			return;
		}
	}
	update_mask(c);
}

static void on_io(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct chan *c = ud;
	(void)l;
	(void)fd;

	enter(c);
	/* Input first: if the peer said BYE and closed, its BYE explains a
	 * failing write. */
	if (events & (EPOLLIN | EPOLLHUP | EPOLLERR))
		do_input(c);
	after_io(c);
	leave(c);
}

static void on_kick(struct loop *l, void *ud)
{
	struct chan *c = ud;
	(void)l;

	enter(c);
	c->kick_timer = 0;
	if (c->registered)
		do_input(c);
	after_io(c);
	leave(c);
}

static void on_hs_timeout(struct loop *l, void *ud)
{
	struct chan *c = ud;
	(void)l;

	enter(c);
	c->hs_timer = 0;
	if (!c->ready)
		end(c, -ETIMEDOUT, "handshake did not complete within %u ms", c->handshake_ms);
	leave(c);
}

static void on_close_timeout(struct loop *l, void *ud)
{
	struct chan *c = ud;
	(void)l;

	enter(c);
	c->close_timer = 0;
	if (c->final_in)
		end(c, -ETIMEDOUT, "could not send our BYE to the peer within %u ms", CHAN_CLOSE_MS);
	else
		end(c, -ETIMEDOUT, "peer did not answer our BYE within %u ms", CHAN_CLOSE_MS);
	leave(c);
}

/* ---- public API ---- */

struct chan_peers *chan_peers_new(void)
{
	return mem_calloc(1, sizeof(struct chan_peers));
}

void chan_peers_free(struct chan_peers *p)
{
	if (!p)
		return;
	if (p->v) {
		sodium_memzero(p->v, p->cap * sizeof(*p->v));
		mem_free(p->v);
	}
	mem_free(p);
}

int chan_peers_allow(struct chan_peers *p, const uint8_t pub[NOISE_KEY_LEN])
{
	if (peers_find(p, pub))
		return 0;
	if (p->n == p->cap) {
		size_t n = p->cap ? p->cap * 2 : 4;
		struct peer_entry *nv = mem_realloc(p->v, n * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		p->v = nv;
		p->cap = n;
	}
	p->v[p->n] = (struct peer_entry){.seen = false};
	memcpy(p->v[p->n].pub, pub, NOISE_KEY_LEN);
	p->n++;
	return 0;
}

size_t chan_peers_count(const struct chan_peers *p)
{
	return p ? p->n : 0;
}

static void destroy(struct chan *c)
{
	cancel_timers(c);
	unregister(c);
	if (c->fd >= 0)
		close(c->fd);
	wipe_secrets(c);
	buf_clear(&c->in);
	buf_clear(&c->out);
	if (c->rx_plain) {
		sodium_memzero(c->rx_plain, PLAIN_MAX);
		mem_free(c->rx_plain);
	}
	if (c->tx_plain) {
		sodium_memzero(c->tx_plain, PLAIN_MAX);
		mem_free(c->tx_plain);
	}
	mem_free(c->streams);
	sodium_memzero(c, sizeof(*c));
	mem_free(c);
}

struct chan *chan_new(struct loop *l, int fd, const struct chan_cfg *cfg, const struct chan_ops *ops, void *ud)
{
	struct chan *c = NULL;
	int r = -EINVAL;

	if (!l || fd < 0 || !cfg || !ops || !cfg->self)
		goto fail;
	if (cfg->role == NOISE_INITIATOR ? !cfg->peer : cfg->role != NOISE_RESPONDER || !cfg->peers)
		goto fail;
	r = -ENOMEM;
	if (!(c = mem_calloc(1, sizeof(*c))))
		goto fail;
	c->fd = fd;
	c->loop = l;
	c->ops = ops;
	c->ud = ud;
	c->role = cfg->role;
	c->self = *cfg->self;
	if (cfg->role == NOISE_INITIATOR)
		memcpy(c->peer, cfg->peer, NOISE_KEY_LEN);
	if (cfg->psk)
		memcpy(c->psk, cfg->psk, NOISE_KEY_LEN); /* else 32 zero bytes */
	c->peers = cfg->peers;
	c->window = cfg->window ? cfg->window : WIRE_WINDOW_DEFAULT;
	c->rekey_bytes = cfg->rekey_bytes ? cfg->rekey_bytes : CHAN_REKEY_BYTES;
	c->rekey_ms = cfg->rekey_ms ? cfg->rekey_ms : CHAN_REKEY_MS;
	c->handshake_ms = cfg->handshake_ms ? cfg->handshake_ms : CHAN_HANDSHAKE_MS;
	c->next_stream = cfg->role == NOISE_INITIATOR ? 1 : 2;
	c->t_start_ns = loop_now_ns();
	buf_init(&c->in, IN_MAX);
	buf_init(&c->out, OUT_MAX);
	int type;
	socklen_t tl = sizeof(type);
	c->is_sock = getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tl) == 0;

	if (!(c->rx_plain = mem_alloc(PLAIN_MAX)) || !(c->tx_plain = mem_alloc(PLAIN_MAX)))
		goto fail;
	c->hs = HS_MSG1;
	if (c->role == NOISE_INITIATOR && (r = start_initiator(c)) < 0)
		goto fail;
	c->mask = EPOLLIN | (buf_len(&c->out) ? EPOLLOUT : 0);
	if ((r = loop_add_fd(l, fd, c->mask, on_io, c)) < 0)
		goto fail;
	c->registered = true;
	r = -ENOMEM;
	if (!(c->hs_timer = loop_add_timer(l, c->handshake_ms, on_hs_timeout, c)))
		goto fail;
	return c;
fail:
	if (c)
		destroy(c);
	else if (fd >= 0)
		close(fd);
	errno = -r;
	return NULL;
}

void chan_free(struct chan *c)
{
	if (!c)
		return;
	if (c->busy) {
		/* Inside one of our callbacks: stop everything now, free when
		 * the callback chain unwinds. */
		c->freed = true;
		cancel_timers(c);
		unregister(c);
		if (c->fd >= 0)
			close(c->fd);
		c->fd = -1;
		wipe_secrets(c);
		return;
	}
	destroy(c);
}

int chan_send(struct chan *c, uint8_t type, uint32_t stream, const void *p, size_t n)
{
	struct stream *s = NULL;
	int r;

	if (!c || (n && !p))
		return -EINVAL;
	if (!c->ready || stopped(c) || c->close_req)
		return -EPIPE;
	if (n > WIRE_PAYLOAD_MAX)
		return -EMSGSIZE;
	if (chan_frames[type].fn)
		return -EINVAL; /* WINDOW and BYE are chan's own */
	if (stream == WIRE_STREAM_CONTROL) {
		if (buf_len(&c->out) + RECORD_BYTES(n) > OUT_MAX) {
			try_flush(c);
			if (buf_len(&c->out) + RECORD_BYTES(n) > OUT_MAX) {
				c->want_writable = true;
				return -EAGAIN;
			}
		}
	} else {
		if (!(s = stream_find(c, stream)) && (r = stream_add(c, stream, c->default_flags, &s)) < 0)
			return r;
		if (n > s->send_avail) {
			s->blocked = true;
			return -EAGAIN;
		}
		if (buf_len(&c->out) > CHAN_OUT_HIWAT) {
			try_flush(c);
			if (buf_len(&c->out) > CHAN_OUT_HIWAT) {
				c->want_writable = true;
				return -EAGAIN;
			}
		}
	}
	r = queue_frame(c, type, stream, p, n, crypto_secretstream_xchacha20poly1305_TAG_MESSAGE);
	if (r == -ENOBUFS) {
		c->want_writable = true;
		return -EAGAIN;
	}
	if (r < 0)
		return r;
	if (s)
		s->send_avail -= (uint32_t)n;
	output_kick(c);
	return 0;
}

size_t chan_send_space(const struct chan *c, uint32_t stream)
{
	size_t q, room;

	if (!c || !c->ready || stopped(c) || c->close_req)
		return 0;
	q = buf_len(&c->out);
	if (stream == WIRE_STREAM_CONTROL) {
		if (q + RECORD_BYTES(0) > OUT_MAX)
			return 0;
		room = OUT_MAX - q - RECORD_BYTES(0);
	} else {
		if (q > CHAN_OUT_HIWAT)
			return 0;
		const struct stream *s = stream_find(c, stream);
		room = s ? s->send_avail : c->window;
	}
	return room < WIRE_PAYLOAD_MAX ? room : WIRE_PAYLOAD_MAX;
}

uint32_t chan_stream_open(struct chan *c, unsigned flags)
{
	struct stream *s;

	if (!c || stopped(c))
		return 0;
	/* Skip ids already in use (a peer may have used one of ours). */
	for (unsigned tries = 0; tries <= WIRE_STREAMS_MAX; tries++) {
		uint32_t id = c->next_stream;
		c->next_stream += 2;
		if (c->next_stream < 2) /* wrapped: keep the parity, skip 0 */
			c->next_stream = c->role == NOISE_INITIATOR ? 1 : 2;
		if (stream_find(c, id))
			continue;
		return stream_add(c, id, flags, &s) == 0 ? id : 0;
	}
	return 0;
}

void chan_set_default_stream_flags(struct chan *c, unsigned flags)
{
	if (c)
		c->default_flags = flags;
}

void chan_stream_close(struct chan *c, uint32_t stream)
{
	if (!c)
		return;
	size_t i = stream_pos(c, stream);
	if (i < c->nstreams && c->streams[i].id == stream) {
		memmove(&c->streams[i], &c->streams[i + 1], (c->nstreams - i - 1) * sizeof(*c->streams));
		c->nstreams--;
	}
}

void chan_consume(struct chan *c, uint32_t stream, size_t n)
{
	struct stream *s;

	if (!c || !c->ready || stopped(c) || stream == WIRE_STREAM_CONTROL || !(s = stream_find(c, stream)))
		return;
	credit_add(c, s, n);
	if (c->credit_pending)
		schedule_kick(c);
	output_kick(c);
}

void chan_close(struct chan *c)
{
	if (!c || stopped(c) || c->close_req)
		return;
	c->close_req = true;
	if (c->ready) {
		(void)queue_bye(c); /* a full queue: after_io() retries */
		if (!c->close_timer)
			c->close_timer = loop_add_timer(c->loop, CHAN_CLOSE_MS, on_close_timeout, c);
		try_flush(c);
	}
	schedule_kick(c);
}

const uint8_t *chan_peer_key(const struct chan *c)
{
	return c && c->ready ? c->peer : NULL;
}

bool chan_is_ready(const struct chan *c)
{
	return c && c->ready && !stopped(c);
}

int chan_fd(const struct chan *c)
{
	return c ? c->fd : -1;
}

void chan_get_stats(const struct chan *c, struct chan_stats *st)
{
	if (!c) {
		memset(st, 0, sizeof(*st));
		return;
	}
	*st = c->st;
	st->out_queued = buf_len(&c->out);
}
