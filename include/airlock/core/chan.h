/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_CHAN_H
#define AIRLOCK_CHAN_H

/*
 * chan: one authenticated, encrypted, ordered, multiplexed connection
 * between host and guest over any transport fd, driven by a struct loop.
 *
 * Lifecycle: chan_new() starts the Noise handshake (wire.h, noise.h) on a
 * connected non-blocking fd. When it completes, on_ready fires; from then on
 * frames flow. Any fault (handshake refused, a record that fails to decrypt,
 * a length over the cap, a window violation, EOF without FINAL, a timeout)
 * ends the connection: on_close fires exactly once with a negative errno and
 * a sentence saying what happened, and nothing after the fault is
 * delivered. chan_close() is the orderly end: queued frames are flushed,
 * then a BYE frame tagged FINAL, then shutdown(SHUT_WR); the peer's
 * on_close gets err == 0.
 *
 * Records: after the handshake each direction is one
 * crypto_secretstream_xchacha20poly1305 stream keyed from Noise Split()
 * (i2r for initiator->responder). The stream gives integrity, ordering and
 * replay protection; the two directions use different keys, so reflected
 * records fail. A REKEY tag is sent at least every CHAN_REKEY_BYTES or
 * CHAN_REKEY_MS.
 *
 * Flow control: see wire.h "streams". The receiver delivers each frame to
 * on_frame at once; the application returns credit with chan_consume() when
 * it has finished with those bytes (or sets CHAN_STREAM_AUTO so chan does it
 * after on_frame returns). A sender whose window is exhausted gets -EAGAIN
 * from chan_send() and an on_writable callback when credit or socket space
 * returns. Memory per connection is bounded by the record cap (input:
 * 4 + WIRE_RECORD_MAX), CHAN_OUT_HIWAT plus a control allowance of two
 * records (output: data streams stop at HIWAT, the control stream and
 * chan's own WINDOW/BYE frames may use the allowance), two frame-sized
 * scratch buffers and at most WIRE_STREAMS_MAX small stream entries.
 *
 * Threading: everything runs on the loop's thread.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/core/noise.h"

struct loop;
struct chan;

#define CHAN_REKEY_BYTES  (1ull << 30)	      /* 1 GiB */
#define CHAN_REKEY_MS	  (10u * 60u * 1000u) /* 10 minutes */
#define CHAN_OUT_HIWAT	  (256u * 1024u)      /* encrypted bytes queued for the socket */
#define CHAN_HANDSHAKE_MS 10000u
#define CHAN_CLOSE_MS	  3000u /* chan_close waits this long for the peer's BYE or EOF */

/* The responder's table of allowed initiator keys and, per key, the newest
 * TAI64N timestamp accepted (WireGuard's replay rule: a msg1 whose
 * timestamp is not strictly newer is refused). Shared by all sessions of an
 * agent; kept in memory only. Must outlive every chan that uses it. */
struct chan_peers;

struct chan_peers *chan_peers_new(void);
void chan_peers_free(struct chan_peers *p);
/* -ENOMEM, or 0 (adding a key twice is fine). */
int chan_peers_allow(struct chan_peers *p, const uint8_t pub[NOISE_KEY_LEN]);
size_t chan_peers_count(const struct chan_peers *p);

struct chan_cfg {
	enum noise_role role;
	const struct noise_keypair *self;
	const uint8_t *peer;	  /* initiator: the pinned responder key */
	struct chan_peers *peers; /* responder: allow-list + replay table */
	const uint8_t *psk;	  /* NULL = 32 zero bytes */
	uint32_t window;	  /* initial per-stream window; 0 = WIRE_WINDOW_DEFAULT */
	uint64_t rekey_bytes;	  /* 0 = CHAN_REKEY_BYTES */
	uint32_t rekey_ms;	  /* 0 = CHAN_REKEY_MS */
	uint32_t handshake_ms;	  /* 0 = CHAN_HANDSHAKE_MS */
};

struct chan_ops {
	/* Handshake done; frames may be sent. */
	void (*on_ready)(struct chan *c, void *ud);
	/* One frame, in order. p is valid only during the call. Types handled
	 * by chan itself (WIRE_WINDOW, WIRE_BYE) never arrive here. */
	void (*on_frame)(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud);
	/* Room to send again after chan_send returned -EAGAIN. */
	void (*on_writable)(struct chan *c, void *ud);
	/* The connection ended: err 0 for an orderly close by either side,
	 * else -errno with why. Called once; no callback follows. The
	 * application may chan_free(c) inside it. */
	void (*on_close)(struct chan *c, int err, const char *why, void *ud);
};

/* Take ownership of fd (closed by chan_free) and start the handshake.
 * cfg is copied (keys included); cfg->peers is shared and must outlive the
 * chan. Returns NULL when out of memory or cfg is unusable (fd is then
 * closed; errno says why: ENOMEM, EINVAL). */
struct chan *chan_new(struct loop *l, int fd, const struct chan_cfg *cfg, const struct chan_ops *ops, void *ud);

/* Close the fd, wipe keys, free. Fires no callback. NULL is a no-op. */
void chan_free(struct chan *c);

/* Queue one frame. n <= WIRE_PAYLOAD_MAX. On a data stream the payload
 * counts against the stream's send window.
 *   0        queued (sent as the socket allows)
 *   -EAGAIN  no window on this stream, or the output queue is over
 *            CHAN_OUT_HIWAT: wait for on_writable
 *   -EMSGSIZE n too large;  -EPIPE not ready or closing;  -ENOMEM
 *   -EINVAL   type is WIRE_WINDOW or WIRE_BYE (chan's own)
 *   -ENOSPC   a new stream id, but WIRE_STREAMS_MAX streams exist
 * Never calls back into the application (errors found while writing are
 * reported through on_close from the loop). */
int chan_send(struct chan *c, uint8_t type, uint32_t stream, const void *p, size_t n);

/* Bytes chan_send would accept on this stream now (0 if none). */
size_t chan_send_space(const struct chan *c, uint32_t stream);

/* Stream ids: a new locally-opened id (odd for the initiator, even for the
 * responder), or 0 when out of memory or at WIRE_STREAMS_MAX. Sending on
 * an id that was never opened creates its state too. flags:
 * CHAN_STREAM_AUTO = return receive credit automatically after each
 * on_frame. Streams the peer opens are created on their first frame with
 * flags from chan_set_default_stream_flags(). */
#define CHAN_STREAM_AUTO 1u
uint32_t chan_stream_open(struct chan *c, unsigned flags);
void chan_set_default_stream_flags(struct chan *c, unsigned flags);
/* Forget a stream's window state (both sides should stop using it). */
void chan_stream_close(struct chan *c, uint32_t stream);

/* Return n bytes of receive credit on stream to the peer. */
void chan_consume(struct chan *c, uint32_t stream, size_t n);

/* Orderly close (see above). Idempotent. Frames the peer sent before it
 * saw our BYE are still delivered; on_close(0) fires once the peer's BYE
 * (or EOF at a record boundary) arrives, or -ETIMEDOUT after
 * CHAN_CLOSE_MS. Before the handshake completed: on_close(-ECANCELED). */
void chan_close(struct chan *c);

/* Peer's static public key (valid once ready; NULL before). */
const uint8_t *chan_peer_key(const struct chan *c);
bool chan_is_ready(const struct chan *c);
int chan_fd(const struct chan *c);

struct chan_stats {
	uint64_t bytes_in, bytes_out; /* on the wire */
	uint64_t frames_in, frames_out;
	uint64_t rekeys_sent, rekeys_seen;
	uint64_t handshake_ns; /* connect-to-ready */
	size_t out_queued;     /* encrypted bytes waiting for the socket */
};
void chan_get_stats(const struct chan *c, struct chan_stats *st);

#endif
