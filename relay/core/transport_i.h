/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_TRANSPORT_I_H
#define AIRLOCK_TRANSPORT_I_H

/*
 * Private to the transport module: the backend interface and the helpers
 * the backends share. transport.c picks one struct transport_ops per address
 * from its scheme and forwards every call to it (Redis ae.c over ae_epoll.c).
 *
 * Deadlines are absolute CLOCK_MONOTONIC milliseconds; TRANSPORT_NO_DEADLINE
 * means wait forever. Backends return 0 / an fd or -errno and write a message
 * into err (which may be NULL / errlen 0) through transport_addr_err().
 */

#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "airlock/core/transport.h"

#define TRANSPORT_NO_DEADLINE INT64_C(-1)

struct transport_ops {
	const char *scheme;
	int stream_listener; /* accept() takes connections off a socket */
	/* rest: the text after "scheme:". a is zeroed with kind set. shown: the
	 * whole address, escaped and shortened, for messages. -EINVAL on error. */
	int (*parse)(const char *rest, struct transport_addr *a, const char *shown, char *err, size_t errlen);
	/* Canonical text, "scheme:..." (always NUL-terminated when n > 0). */
	void (*format)(const struct transport_addr *a, char *out, size_t n);
	/* NULL means "not supported by this kind" (-ENOTSUP). timeout_ms is
	 * passed along only for messages; deadline is what counts. */
	int (*connect)(const struct transport_addr *a, int64_t deadline, int timeout_ms, char *err, size_t errlen);
	int (*listen)(const struct transport_addr *a, char *err, size_t errlen);
	int (*accept)(const struct transport_addr *a, int lfd);
	void (*release)(const struct transport_addr *a, int lfd); /* may be NULL */
};

extern const struct transport_ops transport_tcp_ops;
extern const struct transport_ops transport_unix_ops;
extern const struct transport_ops transport_vsock_ops;
extern const struct transport_ops transport_fc_ops;
extern const struct transport_ops transport_serial_ops;

/* ---- messages ---- */

/* printf into err; no-op when err is NULL or errlen is 0. */
void transport_errf(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* Same, prefixed with the canonical address and ": ". */
void transport_addr_err(const struct transport_addr *a, char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* strerror(e) with its first letter in lower case ("connection refused"),
 * written into buf; returns buf. */
const char *transport_reason(int e, char *buf, size_t n);

/* Printable rendering of n untrusted bytes: \\, \', \n, \r, \t and \xNN for
 * anything else outside 0x20..0x7e. Truncated (with "...") to fit out. */
void transport_quote(const char *in, size_t n, char *out, size_t outn);

/* ---- parsing ---- */

/* Decimal digits only (no sign, no spaces), value <= max. 0 or -EINVAL. */
int transport_parse_u32(const char *s, size_t len, uint32_t max, uint32_t *out);

/* The 32-bit port at the end of a vsock or fc address (after the last
 * colon): -EINVAL with a message naming the address when it is missing,
 * not a number, or out of range. */
int transport_parse_port32(const char *rest, const char *shown, uint32_t *port, char *err, size_t errlen);

/* Copy a socket or device path into a->path: non-empty, at most
 * sizeof(a->path) - 1 bytes. what names it in messages ("path", "device"). */
int transport_set_path(struct transport_addr *a, const char *s, size_t len, const char *what, const char *shown,
		       char *err, size_t errlen);

/* ---- time ---- */

int64_t transport_now_ms(void);
int64_t transport_deadline(int timeout_ms);
/* Milliseconds left (0 when passed), -1 without a deadline: a poll() timeout. */
int transport_remaining(int64_t deadline);

/* poll() one fd for events until the deadline, retrying on EINTR.
 * 0 when ready, -ETIMEDOUT, or -errno. */
int transport_wait(int fd, short events, int64_t deadline);

/* ---- sockets ---- */

/* Non-blocking connect of fd (already O_NONBLOCK) to sa, waiting for the
 * result until the deadline. 0, -ETIMEDOUT, or the connect error. */
int transport_sock_connect(int fd, const struct sockaddr *sa, socklen_t salen, int64_t deadline);

/* accept4(NONBLOCK|CLOEXEC), retrying EINTR and ECONNABORTED. An fd or -errno
 * (-EAGAIN when nothing is pending). */
int transport_sock_accept(int lfd);

/* Connect a stream Unix socket to path (strlen < sizeof sun_path), waiting
 * at most until the deadline when the listener's backlog is full. Returns a
 * non-blocking, close-on-exec fd or -errno (-ETIMEDOUT). Used by unix and fc. */
int transport_unix_connect_path(const char *path, int64_t deadline);

/* Set O_NONBLOCK on fd. 0 or -errno. */
int transport_set_nonblock(int fd);

#endif
