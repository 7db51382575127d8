/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_TRANSPORT_H
#define AIRLOCK_TRANSPORT_H

/*
 * transport: byte streams between host and guest, behind one tiny
 * interface chosen when an address is parsed. The channel on top provides
 * all security; a transport only moves bytes.
 *
 * Addresses (README.md "Commands"):
 *   tcp:HOST:PORT     HOST may be a name, an IPv4 address or [IPv6]
 *   unix:PATH         a stream Unix socket
 *   vsock:CID:PORT    AF_VSOCK (CID may be "any" when listening)
 *   fc:UDS_PATH:PORT  Firecracker's host-side vsock: connect to UDS_PATH,
 *                     send "CONNECT PORT\n", expect "OK <n>\n"; connect only
 *   serial:DEVICE     guest side of a virtio-serial port (or any tty/char
 *                     device); listen only: the device is one stream, so
 *                     "accept" hands out the opened device once per session
 *
 * Every fd returned is non-blocking and close-on-exec.
 * Errors are -errno, with a message naming the address in err.
 */

#include <stddef.h>
#include <stdint.h>

enum transport_kind {
	TRANSPORT_TCP,
	TRANSPORT_UNIX,
	TRANSPORT_VSOCK,
	TRANSPORT_FC,
	TRANSPORT_SERIAL,
};

struct transport_addr {
	enum transport_kind kind;
	char host[256]; /* tcp */
	char path[108]; /* unix, fc (the UDS), serial (the device) */
	uint32_t cid;	/* vsock */
	uint32_t port;	/* tcp, vsock, fc */
};

/* Parse "scheme:rest". -EINVAL with a message for anything malformed
 * (unknown scheme, port out of range, path too long for sun_path, ...). */
int transport_parse(const char *text, struct transport_addr *a, char *err, size_t errlen);

/* Canonical text of an address. */
void transport_format(const struct transport_addr *a, char *out, size_t n);

/* Connect, waiting at most timeout_ms (the fc line exchange included; a
 * negative timeout_ms waits without limit). Returns a connected fd (tcp:
 * with TCP_NODELAY), -ETIMEDOUT when the time ran out. -ENOTSUP for serial
 * (guest-side only). */
int transport_connect(const struct transport_addr *a, int timeout_ms, char *err, size_t errlen);

/* Listen. Returns a listening fd (for serial: the opened device, in raw
 * mode when it is a tty). A stale unix socket file is replaced; anything
 * else at the path is an error (-EEXIST for a non-socket, -EADDRINUSE when
 * something still listens there). A unix listener is created mode 0600.
 * -ENOTSUP for fc. */
int transport_listen(const struct transport_addr *a, char *err, size_t errlen);

/* Accept one connection on a listening fd from transport_listen. Returns the
 * connected fd, -EAGAIN when none is pending. For serial it returns a dup of
 * the device fd the first time and -EAGAIN until transport_release() says
 * that session ended, and -EAGAIN while the device reports a hangup (no
 * host on the other end: a virtio-serial port whose host side is not
 * connected, a pty whose master is closed); wait for the listening fd to
 * change state (epoll with EPOLLET on it) and accept again. */
int transport_accept(const struct transport_addr *a, int lfd);

/* Serial only: the session on the device ended; the next accept may hand it
 * out again. No-op for other kinds. */
void transport_release(const struct transport_addr *a, int lfd);

/* The local port a listening (or connected) tcp or vsock socket is bound
 * to, e.g. after listening on port 0 (transport_format still shows 0 then).
 * Returns the port, or -errno: -EAFNOSUPPORT for other socket families,
 * -ERANGE for a vsock port above INT_MAX. */
int transport_bound_port(int lfd);

/* True when the kind accepts connections on a listening socket (tcp, unix,
 * vsock), false for serial. */
int transport_is_stream_listener(const struct transport_addr *a);

#endif
