/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tunnel: a stream socket over one channel stream (tunnel.h). Everything
 * that can make progress is done by step(), called after every event; it
 * is the only place that calls on_done, and always as its last action.
 */
#include "airlock/core/tunnel.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"

#define NONE	   0xffu /* no CLOSE sent / received yet */
#define OPEN_MAX   16u	 /* PROXY_OPEN payload */
#define TOSOCK_MAX (WIRE_WINDOW_DEFAULT + WIRE_PAYLOAD_MAX)

struct tunnel {
	struct loop *loop;
	struct chan *chan; /* NULL once detached */
	uint32_t stream;
	int fd;	     /* -1 once closed */
	uint32_t ev; /* events registered, 0 = not registered */
	const struct tunnel_ops *ops;
	void *ud;

	struct buf tochan; /* read from the socket, not yet taken by chan_send */
	struct buf tosock; /* received, not yet written to the socket */
	uint8_t open[OPEN_MAX];
	size_t open_n;
	bool open_pending;

	bool rd_eof;	    /* the socket said EOF */
	bool eof_sent;	    /* our PROXY_EOF is queued */
	bool eof_rcvd;	    /* the peer's PROXY_EOF arrived */
	bool wr_shut;	    /* shutdown(SHUT_WR) done */
	uint8_t want_close; /* CLOSE code to send, NONE = not yet */
	uint8_t close_sent, close_rcvd;
	bool finished; /* on_done called */
	struct tunnel_stats st;
};

static void on_sock(struct loop *l, int fd, uint32_t events, void *ud);

static void set_events(struct tunnel *t, uint32_t ev)
{
	if (t->fd < 0 || ev == t->ev)
		return;
	if (t->ev == 0) {
		if (loop_add_fd(t->loop, t->fd, ev, on_sock, t) == 0)
			t->ev = ev;
	} else if (ev == 0) {
		loop_del_fd(t->loop, t->fd);
		t->ev = 0;
	} else if (loop_mod_fd(t->loop, t->fd, ev) == 0) {
		t->ev = ev;
	}
}

static void close_sock(struct tunnel *t, bool reset)
{
	if (t->fd < 0)
		return;
	if (t->ev)
		loop_del_fd(t->loop, t->fd);
	t->ev = 0;
	if (reset) {
		/* a TCP peer sees a reset, not a clean end; harmless elsewhere */
		struct linger lg = {.l_onoff = 1, .l_linger = 0};
		(void)setsockopt(t->fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	}
	close(t->fd);
	t->fd = -1;
}

static void drop_buffers(struct tunnel *t)
{
	buf_reset(&t->tochan);
	buf_reset(&t->tosock);
}

/* The socket failed or the peer reset the stream. */
static void go_abort(struct tunnel *t, uint8_t code)
{
	close_sock(t, true);
	drop_buffers(t);
	if (t->close_sent == NONE && t->want_close == NONE)
		t->want_close = code;
}

/* Queued received bytes to the socket; credit back for what it took. */
static void write_sock(struct tunnel *t)
{
	size_t done = 0;

	while (t->fd >= 0 && buf_len(&t->tosock) > 0) {
		ssize_t w = send(t->fd, buf_ptr(&t->tosock), buf_len(&t->tosock), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w > 0) {
			buf_consume(&t->tosock, (size_t)w);
			done += (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		go_abort(t, WIRE_PROXY_C_RESET);
		return;
	}
	t->st.to_sock += done;
	if (done && t->chan)
		chan_consume(t->chan, t->stream, done);
}

/* 0 sent, -EAGAIN wait for on_writable, other -errno: the chan is going. */
static int send_frame(struct tunnel *t, uint8_t type, const void *p, size_t n)
{
	return t->chan ? chan_send(t->chan, type, t->stream, p, n) : -EPIPE;
}

/* PROXY_CLOSE with code (wire_proxy_close). */
static int send_close(struct tunnel *t, uint8_t code)
{
	struct buf b;
	int r;

	buf_init(&b, 8);
	if ((r = wire_proxy_close_encode(&b, &(struct wire_proxy_close){.code = code})) == 0)
		r = send_frame(t, WIRE_PROXY_CLOSE, buf_ptr(&b), buf_len(&b));
	buf_clear(&b);
	return r;
}

/* Read-ahead to the channel, as much as the window takes. */
static int flush_tochan(struct tunnel *t)
{
	while (buf_len(&t->tochan) > 0) {
		size_t len = buf_len(&t->tochan), space = t->chan ? chan_send_space(t->chan, t->stream) : 0;
		size_t k = space < len ? space : len;
		/* With no room, a full-size attempt makes chan remember that we
		 * wait (window or queue) and call on_writable later. */
		int r = send_frame(t, WIRE_PROXY_DATA, buf_ptr(&t->tochan), k ? k : len);
		if (r < 0)
			return r;
		k = k ? k : len;
		buf_consume(&t->tochan, k);
		t->st.to_chan += k;
	}
	return 0;
}

/* Make every step that can be made; true when on_done was called (t may
 * be gone then). */
static bool step(struct tunnel *t)
{
	int r = 0;

	if (t->finished)
		return false;
	if (t->chan && t->open_pending) {
		if ((r = send_frame(t, WIRE_PROXY_OPEN, t->open, t->open_n)) < 0)
			goto wait;
		t->open_pending = false;
	}
	if (t->chan && t->close_sent == NONE && t->want_close == NONE) {
		if ((r = flush_tochan(t)) < 0)
			goto wait;
		if (t->rd_eof && !t->eof_sent) {
			if ((r = send_frame(t, WIRE_PROXY_EOF, NULL, 0)) < 0)
				goto wait;
			t->eof_sent = true;
		}
		write_sock(t);
		if (t->eof_rcvd && !t->wr_shut && buf_len(&t->tosock) == 0 && t->fd >= 0) {
			shutdown(t->fd, SHUT_WR);
			t->wr_shut = true;
		}
		if (t->eof_sent && t->wr_shut && t->want_close == NONE)
			t->want_close = WIRE_PROXY_C_DONE;
	}
	if (t->chan && t->close_sent == NONE && t->want_close != NONE) {
		uint8_t code = t->want_close;
		if ((r = send_close(t, code)) < 0)
			goto wait;
		t->close_sent = code;
		t->st.close_sent = code;
	}
wait:
	if (r < 0 && r != -EAGAIN) {
		/* the chan is closing: the owner hears it from on_close */
		close_sock(t, true);
		return false;
	}
	if (t->close_sent != NONE && t->close_rcvd != NONE) {
		close_sock(t, t->close_sent != WIRE_PROXY_C_DONE || t->close_rcvd != WIRE_PROXY_C_DONE);
		if (t->chan)
			chan_stream_close(t->chan, t->stream);
		t->finished = true;
		t->ops->on_done(t, t->ud);
		return true;
	}
	if (t->close_sent != NONE || t->want_close != NONE) {
		/* a DONE close keeps nothing open; a reset already closed */
		close_sock(t, t->close_sent != WIRE_PROXY_C_DONE);
		return false;
	}
	uint32_t ev = 0;
	if (!t->rd_eof && buf_len(&t->tochan) == 0)
		ev |= EPOLLIN;
	if (buf_len(&t->tosock) > 0)
		ev |= EPOLLOUT;
	set_events(t, ev);
	return false;
}

static void on_sock(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct tunnel *t = ud;
	uint8_t *d;
	(void)l;
	(void)fd;

	if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && !t->rd_eof && buf_len(&t->tochan) == 0 &&
	    buf_reserve(&t->tochan, WIRE_PAYLOAD_MAX, &d) == 0) {
		ssize_t n = recv(t->fd, d, WIRE_PAYLOAD_MAX, MSG_DONTWAIT);
		if (n > 0)
			buf_commit(&t->tochan, (size_t)n);
		else if (n == 0)
			t->rd_eof = true;
		else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
			go_abort(t, WIRE_PROXY_C_RESET);
	} else if ((events & EPOLLERR) && !(events & EPOLLOUT)) {
		go_abort(t, WIRE_PROXY_C_RESET);
	}
	step(t);
}

int tunnel_new(struct loop *l, struct chan *c, uint32_t stream, int fd, const void *open, size_t open_n,
	       const struct tunnel_ops *ops, void *ud, struct tunnel **out)
{
	struct tunnel *t;
	int fl;

	*out = NULL;
	if (open_n > OPEN_MAX || !ops || !ops->on_done) {
		if (fd >= 0)
			close(fd);
		return -EINVAL;
	}
	if (!(t = mem_calloc(1, sizeof(*t)))) {
		if (fd >= 0)
			close(fd);
		return -ENOMEM;
	}
	t->loop = l;
	t->chan = c;
	t->stream = stream;
	t->fd = fd;
	t->ops = ops;
	t->ud = ud;
	t->want_close = t->close_sent = t->close_rcvd = NONE;
	t->st.close_sent = t->st.close_rcvd = NONE;
	buf_init(&t->tochan, WIRE_PAYLOAD_MAX);
	buf_init(&t->tosock, TOSOCK_MAX);
	if (open_n) {
		memcpy(t->open, open, open_n);
		t->open_n = open_n;
		t->open_pending = true;
	}
	if (fd >= 0 && ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)) {
		int r = -errno;
		tunnel_free(t);
		return r;
	}
	*out = t;
	if (fd < 0) {
		t->rd_eof = true; /* no socket: the owner aborts it at once */
		return 0;
	}
	/* nothing can finish yet (no CLOSE received): step only sends and
	 * registers the socket */
	step(t);
	return 0;
}

typedef int rx_fn(struct tunnel *t, const uint8_t *p, size_t n);

static int rx_data(struct tunnel *t, const uint8_t *p, size_t n)
{
	if (t->eof_rcvd || t->close_rcvd != NONE || n == 0)
		return -EPROTO;
	if (t->close_sent != NONE || t->want_close != NONE || t->fd < 0)
		return 0; /* we gave up: dropped, the stream goes away with the CLOSEs */
	if (buf_len(&t->tosock) == 0) {
		/* the common case: straight to the socket */
		ssize_t w = send(t->fd, p, n, MSG_NOSIGNAL | MSG_DONTWAIT);
		if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
			go_abort(t, WIRE_PROXY_C_RESET);
			return 0;
		}
		if (w > 0) {
			t->st.to_sock += (size_t)w;
			if (t->chan)
				chan_consume(t->chan, t->stream, (size_t)w);
			p += w;
			n -= (size_t)w;
		}
	}
	/* chan holds the peer to the window, so this fits */
	if (n && buf_put(&t->tosock, p, n) < 0)
		return -EPROTO;
	return 0;
}

static int rx_eof(struct tunnel *t, const uint8_t *p, size_t n)
{
	(void)p;
	if (t->eof_rcvd || t->close_rcvd != NONE || n != 0)
		return -EPROTO;
	t->eof_rcvd = true;
	return 0;
}

static int rx_close(struct tunnel *t, const uint8_t *p, size_t n)
{
	struct wire_proxy_close m;
	struct buf in;

	buf_view(&in, p, n);
	if (t->close_rcvd != NONE || wire_proxy_close_decode(&in, &m) < 0)
		return -EPROTO;
	/* DONE means the peer has our EOF and sent its own */
	if (m.code == WIRE_PROXY_C_DONE && (!t->eof_rcvd || !t->eof_sent))
		return -EPROTO;
	t->close_rcvd = m.code;
	t->st.close_rcvd = m.code;
	if (m.code != WIRE_PROXY_C_DONE)
		go_abort(t, WIRE_PROXY_C_RESET);
	return 0;
}

/* The frames a tunnel takes (PROXY_OPEN is its owner's). */
static rx_fn *const rx_frames[WIRE_TYPE_MAX + 1] = {
    [WIRE_PROXY_DATA] = rx_data,
    [WIRE_PROXY_EOF] = rx_eof,
    [WIRE_PROXY_CLOSE] = rx_close,
};

int tunnel_frame(struct tunnel *t, uint8_t type, const uint8_t *p, size_t n)
{
	int r;

	if (!rx_frames[type])
		return -EPROTO;
	if ((r = rx_frames[type](t, p, n)) < 0)
		return r;
	step(t);
	return 0;
}

void tunnel_writable(struct tunnel *t)
{
	if (t)
		step(t);
}

void tunnel_abort(struct tunnel *t, uint8_t code)
{
	if (!t || t->finished)
		return;
	go_abort(t, code);
	step(t);
}

void tunnel_detach(struct tunnel *t)
{
	if (t)
		t->chan = NULL;
}

void tunnel_free(struct tunnel *t)
{
	if (!t)
		return;
	close_sock(t, !t->finished);
	if (t->chan && !t->finished)
		chan_stream_close(t->chan, t->stream);
	buf_clear(&t->tochan);
	buf_clear(&t->tosock);
	mem_free(t);
}

uint32_t tunnel_stream(const struct tunnel *t)
{
	return t->stream;
}

void tunnel_get_stats(const struct tunnel *t, struct tunnel_stats *st)
{
	*st = t->st;
	st->buffered = buf_len(&t->tochan) + buf_len(&t->tosock);
}
