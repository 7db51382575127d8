/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport backend for fc:UDS_PATH:PORT, the host side of a Firecracker
 * vsock device. Firecracker exposes the guest's vsock ports through one Unix
 * socket: a client connects, sends "CONNECT <port>\n" and gets "OK <n>\n"
 * (n: the host-side port Firecracker assigned) once the guest accepted;
 * from then on the socket is the stream. When nothing listens on the port in
 * the guest, Firecracker closes the socket without a word.
 */
#include "transport_i.h"

#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The longest reply we read; "OK 4294967295\n" is 14 bytes. */
#define FC_REPLY_MAX 64

static int fc_parse(const char *rest, struct transport_addr *a, const char *shown, char *err, size_t errlen)
{
	const char *colon = strrchr(rest, ':');
	int r;

	if (!colon) {
		transport_errf(err, errlen, "%s: expected fc:UDS_PATH:PORT", shown);
		return -EINVAL;
	}
	if (rest[0] == '@') {
		transport_errf(err, errlen, "%s: abstract socket names are not supported (use a path)", shown);
		return -EINVAL;
	}
	if ((r = transport_set_path(a, rest, (size_t)(colon - rest), "path", shown, err, errlen)) < 0)
		return r;
	return transport_parse_port32(colon + 1, shown, &a->port, err, errlen);
}

static void fc_format(const struct transport_addr *a, char *out, size_t n)
{
	snprintf(out, n, "fc:%s:%u", a->path, (unsigned)a->port);
}

/* Exactly "OK <1 to 10 digits>\n". */
static int fc_reply_ok(const char *r, size_t n)
{
	size_t digits = n >= 4 ? n - 4 : 0;

	if (n < 5 || memcmp(r, "OK ", 3) != 0 || r[n - 1] != '\n' || digits > 10)
		return 0;
	for (size_t i = 3; i < n - 1; i++)
		if (r[i] < '0' || r[i] > '9')
			return 0;
	return 1;
}

static int fc_send_all(int fd, const char *p, size_t n, int64_t deadline)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);
		int r;

		if (w > 0) {
			p += w;
			n -= (size_t)w;
			continue;
		}
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0 && errno != EAGAIN)
			return -errno;
		if ((r = transport_wait(fd, POLLOUT, deadline)) < 0)
			return r;
	}
	return 0;
}

/* Read the reply one byte at a time so that not one byte of the stream
 * after the '\n' is consumed. *len gets the bytes read. 0 when a '\n' ended
 * it, 1 on EOF (or reset), 2 when FC_REPLY_MAX bytes had no '\n', or -errno. */
static int fc_read_reply(int fd, char *reply, size_t *len, int64_t deadline)
{
	*len = 0;
	while (*len < FC_REPLY_MAX) {
		ssize_t n = recv(fd, reply + *len, 1, 0);
		int r;

		if (n == 1) {
			if (reply[(*len)++] == '\n')
				return 0;
			continue;
		}
		if (n == 0 || errno == ECONNRESET)
			return 1;
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN)
			return -errno;
		if ((r = transport_wait(fd, POLLIN, deadline)) < 0)
			return r;
	}
	return 2;
}

static int fc_connect(const struct transport_addr *a, int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	char line[32], reply[FC_REPLY_MAX], q[4 * FC_REPLY_MAX + 1], why[128];
	size_t rlen = 0;
	int fd, n, r;

	fd = transport_unix_connect_path(a->path, deadline);
	if (fd < 0) {
		if (fd == -ETIMEDOUT)
			transport_addr_err(a, err, errlen, "connecting to the vsock socket timed out after %d ms",
					   timeout_ms);
		else if (fd == -ECONNREFUSED)
			transport_addr_err(a, err, errlen,
					   "connection refused (is Firecracker running with this vsock socket?)");
		else
			transport_addr_err(a, err, errlen, "cannot connect to the vsock socket: %s",
					   transport_reason(-fd, why, sizeof(why)));
		return fd;
	}
	n = snprintf(line, sizeof(line), "CONNECT %u\n", (unsigned)a->port);
	if ((r = fc_send_all(fd, line, (size_t)n, deadline)) < 0) {
		if (r == -ETIMEDOUT)
			transport_addr_err(a, err, errlen, "sending CONNECT timed out after %d ms", timeout_ms);
		else
			transport_addr_err(a, err, errlen, "cannot send CONNECT: %s",
					   transport_reason(-r, why, sizeof(why)));
		goto fail;
	}
	r = fc_read_reply(fd, reply, &rlen, deadline);
	if (r == 0 && fc_reply_ok(reply, rlen))
		return fd;
	if (r < 0) {
		if (r == -ETIMEDOUT)
			transport_addr_err(a, err, errlen, "no answer from the vsock proxy within %d ms", timeout_ms);
		else
			transport_addr_err(a, err, errlen, "cannot read the vsock proxy's answer: %s",
					   transport_reason(-r, why, sizeof(why)));
		goto fail;
	}
	/* Everything else is a refusal, quoted (without its '\n') for the log. */
	transport_quote(reply, r == 0 ? rlen - 1 : rlen, q, sizeof(q));
	if (r == 1 && rlen == 0)
		transport_addr_err(a, err, errlen,
				   "the vsock proxy closed the connection without answering "
				   "(is anything listening on vsock port %u in the guest?)",
				   (unsigned)a->port);
	else if (r == 1)
		transport_addr_err(a, err, errlen,
				   "the vsock proxy answered '%s' and closed the connection instead of 'OK <port>'", q);
	else if (r == 2)
		transport_addr_err(a, err, errlen,
				   "the vsock proxy answered '%s' (no newline in %d bytes) instead of 'OK <port>'", q,
				   FC_REPLY_MAX);
	else
		transport_addr_err(a, err, errlen, "the vsock proxy answered '%s' instead of 'OK <port>'", q);
	r = -ECONNREFUSED;
fail:
	close(fd);
	return r;
}

static int fc_listen(const struct transport_addr *a, char *err, size_t errlen)
{
	transport_addr_err(a, err, errlen,
			   "Firecracker's vsock socket can only be connected to (in the guest, listen on vsock:any:%u)",
			   (unsigned)a->port);
	return -ENOTSUP;
}

const struct transport_ops transport_fc_ops = {
    .scheme = "fc",
    .stream_listener = 0,
    .parse = fc_parse,
    .format = fc_format,
    .connect = fc_connect,
    .listen = fc_listen,
    .accept = NULL,
};
