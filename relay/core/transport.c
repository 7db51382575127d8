/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport: the front end. Picks a backend (struct transport_ops, see
 * transport_i.h) from the address scheme and forwards to it; holds the
 * helpers every backend shares (messages, number parsing, deadlines,
 * non-blocking connect and accept).
 */
#include "transport_i.h"

#include "airlock/core/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <linux/vm_sockets.h>

static const struct transport_ops *const transport_backends[] = {
    [TRANSPORT_TCP] = &transport_tcp_ops,	[TRANSPORT_UNIX] = &transport_unix_ops,
    [TRANSPORT_VSOCK] = &transport_vsock_ops,	[TRANSPORT_FC] = &transport_fc_ops,
    [TRANSPORT_SERIAL] = &transport_serial_ops,
};

#define N_BACKENDS (sizeof(transport_backends) / sizeof(transport_backends[0]))

static const struct transport_ops *backend_of(const struct transport_addr *a)
{
	if (!a || (unsigned)a->kind >= N_BACKENDS)
		return NULL;
	return transport_backends[a->kind];
}

/* ---- messages ---- */

void transport_errf(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	errmsg_vset(err, errlen, NULL, fmt, ap);
	va_end(ap);
}

void transport_addr_err(const struct transport_addr *a, char *err, size_t errlen, const char *fmt, ...)
{
	char text[300], shown[400];
	va_list ap;

	if (!err || errlen == 0)
		return;
	transport_format(a, text, sizeof(text));
	transport_quote(text, strlen(text), shown, sizeof(shown));
	va_start(ap, fmt);
	errmsg_vset(err, errlen, shown, fmt, ap);
	va_end(ap);
}

const char *transport_reason(int e, char *buf, size_t n)
{
	char tmp[128];
	const char *s = strerror_r(e, tmp, sizeof(tmp)); /* GNU: may return a static string */

	if (n == 0)
		return buf;
	snprintf(buf, n, "%s", s);
	/* "Connection refused" -> "connection refused", but keep "I/O error". */
	if (buf[0] >= 'A' && buf[0] <= 'Z' && buf[1] >= 'a' && buf[1] <= 'z')
		buf[0] = (char)(buf[0] - 'A' + 'a');
	return buf;
}

/* The escaped form of one byte into piece (at most 4 chars + NUL). */
static size_t quote_byte(unsigned char c, char piece[5])
{
	static const char hex[] = "0123456789abcdef";

	switch (c) {
	case '\\':
		memcpy(piece, "\\\\", 3);
		return 2;
	case '\'':
		memcpy(piece, "\\'", 3);
		return 2;
	case '\n':
		memcpy(piece, "\\n", 3);
		return 2;
	case '\r':
		memcpy(piece, "\\r", 3);
		return 2;
	case '\t':
		memcpy(piece, "\\t", 3);
		return 2;
	default:
		break;
	}
	if (c >= 0x20 && c <= 0x7e) {
		piece[0] = (char)c;
		piece[1] = '\0';
		return 1;
	}
	piece[0] = '\\';
	piece[1] = 'x';
	piece[2] = hex[c >> 4];
	piece[3] = hex[c & 15];
	piece[4] = '\0';
	return 4;
}

void transport_quote(const char *in, size_t n, char *out, size_t outn)
{
	char piece[5];
	size_t total = 0, o = 0, i;

	if (outn == 0)
		return;
	for (i = 0; i < n; i++)
		total += quote_byte((unsigned char)in[i], piece);
	for (i = 0; i < n; i++) {
		size_t pl = quote_byte((unsigned char)in[i], piece);
		size_t room = outn - 1 - o;

		/* Everything fits, or this piece still leaves room for "...". */
		if (total <= outn - 1 || pl + 3 <= room) {
			memcpy(out + o, piece, pl);
			o += pl;
			continue;
		}
		room = room < 3 ? room : 3;
		memcpy(out + o, "...", room);
		o += room;
		break;
	}
	out[o] = '\0';
}

/* ---- parsing ---- */

int transport_parse_u32(const char *s, size_t len, uint32_t max, uint32_t *out)
{
	uint64_t v = 0;

	if (len == 0)
		return -EINVAL;
	for (size_t i = 0; i < len; i++) {
		if (s[i] < '0' || s[i] > '9')
			return -EINVAL;
		v = v * 10 + (uint64_t)(s[i] - '0');
		if (v > max)
			return -ERANGE;
	}
	*out = (uint32_t)v;
	return 0;
}

int transport_parse_port32(const char *rest, const char *shown, uint32_t *port, char *err, size_t errlen)
{
	char q[64];
	int r;

	if (!*rest) {
		transport_errf(err, errlen, "%s: missing port", shown);
		return -EINVAL;
	}
	if ((r = transport_parse_u32(rest, strlen(rest), UINT32_MAX, port)) < 0) {
		transport_quote(rest, strlen(rest), q, sizeof(q));
		if (r == -ERANGE)
			transport_errf(err, errlen, "%s: port %s out of range (0-4294967295)", shown, q);
		else
			transport_errf(err, errlen, "%s: port '%s' is not a number", shown, q);
		return -EINVAL;
	}
	return 0;
}

int transport_set_path(struct transport_addr *a, const char *s, size_t len, const char *what, const char *shown,
		       char *err, size_t errlen)
{
	if (len == 0) {
		transport_errf(err, errlen, "%s: missing %s", shown, what);
		return -EINVAL;
	}
	if (len >= sizeof(a->path)) {
		transport_errf(err, errlen, "%s: %s longer than %zu bytes", shown, what, sizeof(a->path) - 1);
		return -EINVAL;
	}
	memcpy(a->path, s, len);
	a->path[len] = '\0';
	return 0;
}

int transport_parse(const char *text, struct transport_addr *a, char *err, size_t errlen)
{
	char shown[96];
	const char *colon;
	size_t slen;

	memset(a, 0, sizeof(*a));
	if (!text || !*text) {
		transport_errf(err, errlen,
			       "empty address (expected tcp:HOST:PORT, unix:PATH, vsock:CID:PORT, "
			       "fc:UDS_PATH:PORT or serial:DEVICE)");
		return -EINVAL;
	}
	transport_quote(text, strlen(text), shown, sizeof(shown));
	colon = strchr(text, ':');
	if (!colon) {
		transport_errf(err, errlen, "%s: missing scheme (expected tcp:, unix:, vsock:, fc: or serial:)", shown);
		return -EINVAL;
	}
	slen = (size_t)(colon - text);
	for (size_t k = 0; k < N_BACKENDS; k++) {
		const struct transport_ops *ops = transport_backends[k];

		if (strlen(ops->scheme) == slen && memcmp(ops->scheme, text, slen) == 0) {
			int r;

			a->kind = (enum transport_kind)k;
			r = ops->parse(colon + 1, a, shown, err, errlen);
			if (r < 0) {
				memset(a, 0, sizeof(*a));
				return r;
			}
			return 0;
		}
	}
	{
		char scheme[40];

		transport_quote(text, slen, scheme, sizeof(scheme));
		transport_errf(err, errlen, "%s: unknown transport '%s' (expected tcp, unix, vsock, fc or serial)",
			       shown, scheme);
	}
	return -EINVAL;
}

void transport_format(const struct transport_addr *a, char *out, size_t n)
{
	const struct transport_ops *ops = backend_of(a);

	if (n == 0)
		return;
	if (!ops) {
		snprintf(out, n, "invalid-transport-address");
		return;
	}
	ops->format(a, out, n);
}

/* ---- time ---- */

int64_t transport_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t transport_deadline(int timeout_ms)
{
	if (timeout_ms < 0)
		return TRANSPORT_NO_DEADLINE;
	return transport_now_ms() + timeout_ms;
}

int transport_remaining(int64_t deadline)
{
	int64_t left;

	if (deadline == TRANSPORT_NO_DEADLINE)
		return -1;
	left = deadline - transport_now_ms();
	if (left <= 0)
		return 0;
	return left > INT_MAX ? INT_MAX : (int)left;
}

int transport_wait(int fd, short events, int64_t deadline)
{
	for (;;) {
		struct pollfd pfd = {.fd = fd, .events = events};
		int rem = transport_remaining(deadline);
		int r = poll(&pfd, 1, rem);

		if (r > 0) {
			if (pfd.revents & POLLNVAL)
				return -EBADF;
			return 0; /* ready, or POLLERR/POLLHUP: the next I/O call tells */
		}
		if (r == 0) {
			if (transport_remaining(deadline) == 0)
				return -ETIMEDOUT;
			continue; /* poll rounded down */
		}
		if (errno != EINTR)
			return -errno;
	}
}

/* ---- sockets ---- */

int transport_set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	if (fl < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

int transport_sock_connect(int fd, const struct sockaddr *sa, socklen_t salen, int64_t deadline)
{
	int soerr = 0, r;
	socklen_t sl = sizeof(soerr);

	if (connect(fd, sa, salen) == 0)
		return 0;
	/* EINTR: a non-blocking connect goes on in the background; wait for it
	 * like EINPROGRESS. */
	if (errno != EINPROGRESS && errno != EINTR)
		return -errno;
	if ((r = transport_wait(fd, POLLOUT, deadline)) < 0)
		return r;
	if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &sl) < 0)
		return -errno;
	return soerr ? -soerr : 0;
}

int transport_sock_accept(int lfd)
{
	for (;;) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd >= 0)
			return fd;
		if (errno == EINTR || errno == ECONNABORTED)
			continue;
		if (errno == EWOULDBLOCK)
			return -EAGAIN;
		return -errno;
	}
}

int transport_bound_port(int lfd)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);

	memset(&ss, 0, sizeof(ss));
	if (getsockname(lfd, (struct sockaddr *)&ss, &sl) < 0)
		return -errno;
	switch (ss.ss_family) {
	case AF_INET:
		return ntohs(((struct sockaddr_in *)&ss)->sin_port);
	case AF_INET6:
		return ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
	case AF_VSOCK: {
		unsigned int port = ((struct sockaddr_vm *)&ss)->svm_port;

		return port > INT_MAX ? -ERANGE : (int)port;
	}
	default:
		return -EAFNOSUPPORT;
	}
}

/* ---- the interface ---- */

int transport_connect(const struct transport_addr *a, int timeout_ms, char *err, size_t errlen)
{
	const struct transport_ops *ops = backend_of(a);

	if (!ops) {
		transport_errf(err, errlen, "invalid transport address (kind %d)", a ? (int)a->kind : -1);
		return -EINVAL;
	}
	if (!ops->connect) {
		transport_addr_err(a, err, errlen, "%s addresses cannot be connected to", ops->scheme);
		return -ENOTSUP;
	}
	return ops->connect(a, transport_deadline(timeout_ms), timeout_ms, err, errlen);
}

int transport_listen(const struct transport_addr *a, char *err, size_t errlen)
{
	const struct transport_ops *ops = backend_of(a);

	if (!ops) {
		transport_errf(err, errlen, "invalid transport address (kind %d)", a ? (int)a->kind : -1);
		return -EINVAL;
	}
	if (!ops->listen) {
		transport_addr_err(a, err, errlen, "%s addresses cannot be listened on", ops->scheme);
		return -ENOTSUP;
	}
	return ops->listen(a, err, errlen);
}

int transport_accept(const struct transport_addr *a, int lfd)
{
	const struct transport_ops *ops = backend_of(a);

	if (!ops)
		return -EINVAL;
	if (lfd < 0)
		return -EBADF;
	if (!ops->accept)
		return -ENOTSUP;
	return ops->accept(a, lfd);
}

void transport_release(const struct transport_addr *a, int lfd)
{
	const struct transport_ops *ops = backend_of(a);

	if (ops && ops->release && lfd >= 0)
		ops->release(a, lfd);
}

int transport_is_stream_listener(const struct transport_addr *a)
{
	const struct transport_ops *ops = backend_of(a);

	return ops ? ops->stream_listener : 0;
}
