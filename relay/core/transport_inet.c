/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport backends for tcp:HOST:PORT and unix:PATH.
 */
#include "transport_i.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

_Static_assert(sizeof(((struct transport_addr *)0)->path) == sizeof(((struct sockaddr_un *)0)->sun_path),
	       "transport_addr.path must hold exactly what sun_path holds");

/* ================================ tcp ================================ */

static int tcp_parse(const char *rest, struct transport_addr *a, const char *shown, char *err, size_t errlen)
{
	const char *host, *port;
	size_t hlen;
	char qport[32];
	int r;

	if (rest[0] == '[') {
		const char *end = strchr(rest, ']');

		if (!end) {
			transport_errf(err, errlen, "%s: missing ']' after the IPv6 address", shown);
			return -EINVAL;
		}
		host = rest + 1;
		hlen = (size_t)(end - host);
		if (end[1] != ':') {
			transport_errf(err, errlen, "%s: expected ':PORT' after ']'", shown);
			return -EINVAL;
		}
		port = end + 2;
	} else {
		const char *colon = strrchr(rest, ':');

		if (!colon) {
			transport_errf(err, errlen, "%s: expected tcp:HOST:PORT", shown);
			return -EINVAL;
		}
		host = rest;
		hlen = (size_t)(colon - rest);
		if (memchr(host, ':', hlen)) {
			transport_errf(err, errlen, "%s: an IPv6 address needs brackets: tcp:[ADDRESS]:PORT", shown);
			return -EINVAL;
		}
		port = colon + 1;
	}
	if (hlen == 0) {
		transport_errf(err, errlen, "%s: missing host", shown);
		return -EINVAL;
	}
	if (hlen >= sizeof(a->host)) {
		transport_errf(err, errlen, "%s: host longer than %zu bytes", shown, sizeof(a->host) - 1);
		return -EINVAL;
	}
	for (size_t i = 0; i < hlen; i++) {
		unsigned char c = (unsigned char)host[i];

		if (c <= 0x20 || c == 0x7f || c == '[' || c == ']') {
			transport_errf(err, errlen, "%s: host contains a space, bracket or control character", shown);
			return -EINVAL;
		}
	}
	if (!*port) {
		transport_errf(err, errlen, "%s: missing port", shown);
		return -EINVAL;
	}
	transport_quote(port, strlen(port), qport, sizeof(qport));
	r = transport_parse_u32(port, strlen(port), 65535, &a->port);
	if (r == -ERANGE) {
		transport_errf(err, errlen, "%s: port %s out of range (0-65535)", shown, qport);
		return -EINVAL;
	}
	if (r < 0) {
		transport_errf(err, errlen, "%s: port '%s' is not a number", shown, qport);
		return -EINVAL;
	}
	memcpy(a->host, host, hlen);
	a->host[hlen] = '\0';
	return 0;
}

static void tcp_format(const struct transport_addr *a, char *out, size_t n)
{
	if (strchr(a->host, ':'))
		snprintf(out, n, "tcp:[%s]:%u", a->host, (unsigned)a->port);
	else
		snprintf(out, n, "tcp:%s:%u", a->host, (unsigned)a->port);
}

static int tcp_resolve(const struct transport_addr *a, int passive, struct addrinfo **res, char *err, size_t errlen)
{
	struct addrinfo hints;
	char port[16];
	int r, e;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_protocol = IPPROTO_TCP;
	hints.ai_flags = AI_NUMERICSERV | (passive ? AI_PASSIVE : 0);
	snprintf(port, sizeof(port), "%u", (unsigned)a->port);
	*res = NULL;
	r = getaddrinfo(a->host, port, &hints, res);
	if (r == 0)
		return 0;
	*res = NULL;
	switch (r) {
	case EAI_SYSTEM:
		e = errno ? errno : EIO;
		break;
	case EAI_MEMORY:
		e = ENOMEM;
		break;
	case EAI_NONAME:
	case EAI_NODATA:
	case EAI_ADDRFAMILY:
	case EAI_AGAIN:
	case EAI_FAIL:
		e = EHOSTUNREACH;
		break;
	default:
		e = EINVAL;
		break;
	}
	if (r == EAI_SYSTEM) {
		char why[128];

		transport_addr_err(a, err, errlen, "cannot resolve the host: %s",
				   transport_reason(e, why, sizeof(why)));
	} else {
		transport_addr_err(a, err, errlen, "cannot resolve the host: %s", gai_strerror(r));
	}
	return -e;
}

static int set_nodelay(int fd)
{
	int one = 1;

	return setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) < 0 ? -errno : 0;
}

static int tcp_connect(const struct transport_addr *a, int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	struct addrinfo *res = NULL, *ai;
	int r, last = -EHOSTUNREACH, tried = 0;
	char why[128];

	if (a->port == 0) {
		transport_addr_err(a, err, errlen, "port 0 can only be listened on");
		return -EINVAL;
	}
	if ((r = tcp_resolve(a, 0, &res, err, errlen)) < 0)
		return r;
	/* Addresses in getaddrinfo's order, all sharing one deadline. */
	for (ai = res; ai; ai = ai->ai_next) {
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);

		if (fd < 0) {
			last = -errno;
			continue;
		}
		tried++;
		r = transport_sock_connect(fd, ai->ai_addr, ai->ai_addrlen, deadline);
		if (r == 0 && (r = set_nodelay(fd)) == 0) {
			freeaddrinfo(res);
			return fd;
		}
		close(fd);
		last = r;
		if (r == -ETIMEDOUT)
			break;
	}
	freeaddrinfo(res);
	if (last == -ETIMEDOUT)
		transport_addr_err(a, err, errlen, "connection timed out after %d ms", timeout_ms);
	else if (tried > 1)
		transport_addr_err(a, err, errlen, "%s (tried %d addresses)", transport_reason(-last, why, sizeof(why)),
				   tried);
	else
		transport_addr_err(a, err, errlen, "%s", transport_reason(-last, why, sizeof(why)));
	return last;
}

static int tcp_listen(const struct transport_addr *a, char *err, size_t errlen)
{
	struct addrinfo *res = NULL, *ai;
	int r, last = -EADDRNOTAVAIL;
	char why[128];

	if ((r = tcp_resolve(a, 1, &res, err, errlen)) < 0)
		return r;
	/* The first address that binds wins (a name may resolve to several). */
	for (ai = res; ai; ai = ai->ai_next) {
		int one = 1;
		int fd = socket(ai->ai_family, ai->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai->ai_protocol);

		if (fd < 0) {
			last = -errno;
			continue;
		}
		if (setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one)) < 0 ||
		    bind(fd, ai->ai_addr, ai->ai_addrlen) < 0 || listen(fd, SOMAXCONN) < 0) {
			last = -errno;
			close(fd);
			continue;
		}
		freeaddrinfo(res);
		return fd;
	}
	freeaddrinfo(res);
	transport_addr_err(a, err, errlen, "cannot listen: %s", transport_reason(-last, why, sizeof(why)));
	return last;
}

static int tcp_accept(const struct transport_addr *a, int lfd)
{
	int fd = transport_sock_accept(lfd), r;

	(void)a;
	if (fd < 0)
		return fd;
	if ((r = set_nodelay(fd)) < 0) {
		close(fd);
		return r;
	}
	return fd;
}

const struct transport_ops transport_tcp_ops = {
    .scheme = "tcp",
    .stream_listener = 1,
    .parse = tcp_parse,
    .format = tcp_format,
    .connect = tcp_connect,
    .listen = tcp_listen,
    .accept = tcp_accept,
};

/* ================================ unix =============================== */

static int unix_parse(const char *rest, struct transport_addr *a, const char *shown, char *err, size_t errlen)
{
	if (rest[0] == '@') {
		transport_errf(err, errlen, "%s: abstract socket names are not supported (use a path)", shown);
		return -EINVAL;
	}
	return transport_set_path(a, rest, strlen(rest), "path", shown, err, errlen);
}

static void unix_format(const struct transport_addr *a, char *out, size_t n)
{
	snprintf(out, n, "unix:%s", a->path);
}

static int set_sndtimeo(int fd, int ms)
{
	struct timeval tv = {.tv_sec = ms / 1000, .tv_usec = (ms % 1000) * 1000};

	return setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv)) < 0 ? -errno : 0;
}

int transport_unix_connect_path(const char *path, int64_t deadline)
{
	struct sockaddr_un sun;
	size_t pl = strlen(path);
	socklen_t len;
	int fd, r;

	if (pl == 0 || pl >= sizeof(sun.sun_path))
		return -EINVAL;
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, path, pl + 1);
	len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + pl + 1);

	/* A Unix stream connect never returns EINPROGRESS: it succeeds, or
	 * fails with EAGAIN while the listener's backlog is full. A blocking
	 * connect waits for room for at most SO_SNDTIMEO, so use that as the
	 * timeout and switch to non-blocking afterwards. */
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	for (;;) {
		int rem = transport_remaining(deadline);

		if (rem == 0)
			r = transport_set_nonblock(fd); /* no time left: one try */
		else
			r = set_sndtimeo(fd, rem < 0 ? 0 : rem); /* 0 = no limit */
		if (r < 0)
			goto fail;
		if (connect(fd, (struct sockaddr *)&sun, len) == 0)
			break;
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN) {
			if (rem == 0 || transport_remaining(deadline) == 0) {
				r = -ETIMEDOUT;
				goto fail;
			}
			continue;
		}
		r = -errno;
		goto fail;
	}
	if ((r = set_sndtimeo(fd, 0)) < 0 || (r = transport_set_nonblock(fd)) < 0)
		goto fail;
	return fd;
fail:
	close(fd);
	return r;
}

static int unix_connect(const struct transport_addr *a, int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	char why[128];
	int fd = transport_unix_connect_path(a->path, deadline);

	if (fd >= 0)
		return fd;
	if (fd == -ETIMEDOUT)
		transport_addr_err(a, err, errlen, "connection timed out after %d ms (the listener's backlog is full)",
				   timeout_ms);
	else if (fd == -ECONNREFUSED)
		transport_addr_err(a, err, errlen, "connection refused (nothing is listening on this socket)");
	else
		transport_addr_err(a, err, errlen, "%s", transport_reason(-fd, why, sizeof(why)));
	return fd;
}

/* An existing file at the socket path: remove it only when it is a socket
 * nobody listens on any more. 0 when the path is free. */
static int unix_clear_stale(const struct transport_addr *a, char *err, size_t errlen)
{
	char why[128];
	struct stat st;
	int fd;

	if (lstat(a->path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		fd = -errno;
		transport_addr_err(a, err, errlen, "cannot check the path: %s",
				   transport_reason(-fd, why, sizeof(why)));
		return fd;
	}
	if (!S_ISSOCK(st.st_mode)) {
		transport_addr_err(a, err, errlen, "the path exists and is not a socket; not replacing it");
		return -EEXIST;
	}
	fd = transport_unix_connect_path(a->path, transport_deadline(0));
	if (fd >= 0 || fd == -ETIMEDOUT) { /* accepted, or a full backlog: alive */
		if (fd >= 0)
			close(fd);
		transport_addr_err(a, err, errlen, "another process is listening on this socket");
		return -EADDRINUSE;
	}
	if (fd == -ENOENT)
		return 0; /* gone meanwhile */
	if (fd != -ECONNREFUSED) {
		transport_addr_err(a, err, errlen, "cannot check the existing socket: %s",
				   transport_reason(-fd, why, sizeof(why)));
		return fd;
	}
	/* Stale. Between the check and the unlink another listener could
	 * appear; that race is accepted (the directory should be private). */
	if (unlink(a->path) < 0 && errno != ENOENT) {
		fd = -errno;
		transport_addr_err(a, err, errlen, "cannot remove the stale socket: %s",
				   transport_reason(-fd, why, sizeof(why)));
		return fd;
	}
	return 0;
}

static int unix_listen(const struct transport_addr *a, char *err, size_t errlen)
{
	struct sockaddr_un sun;
	size_t pl = strlen(a->path);
	char why[128];
	int fd, r;

	if (pl == 0 || pl >= sizeof(sun.sun_path)) {
		transport_addr_err(a, err, errlen, "invalid socket path");
		return -EINVAL;
	}
	if ((r = unix_clear_stale(a, err, errlen)) < 0)
		return r;
	memset(&sun, 0, sizeof(sun));
	sun.sun_family = AF_UNIX;
	memcpy(sun.sun_path, a->path, pl + 1);

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		r = -errno;
		transport_addr_err(a, err, errlen, "cannot create a socket: %s",
				   transport_reason(-r, why, sizeof(why)));
		return r;
	}
	/* Linux creates the socket file with the socket inode's mode (less the
	 * umask), so the file is 0600 from its first moment: no window in which
	 * another user could connect, and no process-wide umask change. */
	if (fchmod(fd, 0600) < 0) {
		r = -errno;
		transport_addr_err(a, err, errlen, "cannot set the socket mode: %s",
				   transport_reason(-r, why, sizeof(why)));
		goto fail;
	}
	if (bind(fd, (struct sockaddr *)&sun, (socklen_t)(offsetof(struct sockaddr_un, sun_path) + pl + 1)) < 0) {
		r = -errno;
		transport_addr_err(a, err, errlen, "cannot bind: %s", transport_reason(-r, why, sizeof(why)));
		goto fail;
	}
	if (listen(fd, SOMAXCONN) < 0) {
		r = -errno;
		transport_addr_err(a, err, errlen, "cannot listen: %s", transport_reason(-r, why, sizeof(why)));
		unlink(a->path);
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return r;
}

static int unix_accept(const struct transport_addr *a, int lfd)
{
	(void)a;
	return transport_sock_accept(lfd);
}

const struct transport_ops transport_unix_ops = {
    .scheme = "unix",
    .stream_listener = 1,
    .parse = unix_parse,
    .format = unix_format,
    .connect = unix_connect,
    .listen = unix_listen,
    .accept = unix_accept,
};
