/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_TUNNEL_H
#define AIRLOCK_TUNNEL_H

/*
 * tunnel: one connected stream socket carried over one channel stream with
 * the PROXY_DATA / PROXY_EOF / PROXY_CLOSE frames of wire.h. Both sides use
 * it: the guest for a connection a command made to its proxy listener, the
 * host for the socketpair whose other end the egress proxy adopted.
 *
 * Backpressure, both ways, bounded:
 *   socket -> channel: at most one frame (WIRE_PAYLOAD_MAX bytes) is read
 *     ahead; the socket is not read again until chan_send took it, so a
 *     stream without window (a slow reader on the far side) stops reading
 *     the socket and the writer there blocks.
 *   channel -> socket: bytes the socket cannot take at once are kept (at
 *     most the stream's window, which the peer cannot exceed) and credit is
 *     returned (chan_consume) only as they are written, so a slow socket
 *     stalls the peer's sender on this stream and nothing else.
 * The stream must be opened without CHAN_STREAM_AUTO.
 *
 * Close: EOF from the socket becomes PROXY_EOF once everything read before
 * it was sent; PROXY_EOF from the peer becomes shutdown(SHUT_WR) once
 * everything received before it was written. When EOF went both ways and
 * all is delivered, the tunnel sends PROXY_CLOSE(DONE). A socket error
 * sends PROXY_CLOSE(RESET) at once; a CLOSE from the peer before that
 * point resets the socket (SO_LINGER 0 on TCP). Each side sends exactly
 * one CLOSE as its last frame; once CLOSE went both ways the tunnel forgets
 * the stream (chan_stream_close), closes the socket and calls on_done.
 *
 * Threading: the loop's thread. The owner routes the stream's frames to
 * tunnel_frame() and calls tunnel_writable() from chan's on_writable.
 */

#include <stddef.h>
#include <stdint.h>

struct chan;
struct loop;
struct tunnel;

struct tunnel_ops {
	/* CLOSE went both ways: the owner frees the tunnel now or later
	 * (tunnel_free); no callback follows. May be called from inside
	 * tunnel_frame, tunnel_writable, tunnel_abort or the socket's loop
	 * callback; those do not touch the tunnel after it. Required. */
	void (*on_done)(struct tunnel *t, void *ud);
};

/* A tunnel between fd (connected, stream; made non-blocking here; owned by
 * the tunnel from the call on, whatever the result) and stream of c.
 * open/open_n: when open_n > 0, a PROXY_OPEN frame with this payload is sent
 * first (the guest's side; copied). fd < 0 makes a tunnel with no socket
 * (the host refusing a stream: call tunnel_abort at once). 0 or -ENOMEM,
 * -errno from the loop. */
int tunnel_new(struct loop *l, struct chan *c, uint32_t stream, int fd, const void *open, size_t open_n,
	       const struct tunnel_ops *ops, void *ud, struct tunnel **out);

/* A PROXY_DATA, PROXY_EOF or PROXY_CLOSE frame for this tunnel's stream.
 * 0, or -EPROTO when the peer broke the protocol (DATA after its EOF or
 * CLOSE, EOF twice, a bad CLOSE code, more bytes than the window): the
 * owner drops the session. May call on_done. */
int tunnel_frame(struct tunnel *t, uint8_t type, const uint8_t *p, size_t n);

/* chan's on_writable fired: retry what waited for window or queue room.
 * May call on_done. */
void tunnel_writable(struct tunnel *t);

/* Give up: reset the socket, send PROXY_CLOSE(code) unless a CLOSE was
 * already sent, drop what is buffered. on_done follows once the peer's
 * CLOSE is in (at once when it already came). */
void tunnel_abort(struct tunnel *t, uint8_t code);

/* Free without sending anything (the session is gone, or after on_done).
 * Forgets the stream in the chan if c is still given. NULL is a no-op. */
void tunnel_free(struct tunnel *t);

/* Forget the chan (it is being freed): later calls send nothing. */
void tunnel_detach(struct tunnel *t);

uint32_t tunnel_stream(const struct tunnel *t);

struct tunnel_stats {
	uint64_t to_chan, to_sock;	/* payload bytes each way */
	size_t buffered;		/* bytes held (read ahead + not yet written) */
	uint8_t close_sent, close_rcvd; /* codes, 0xff = none yet */
};
void tunnel_get_stats(const struct tunnel *t, struct tunnel_stats *st);

#endif
