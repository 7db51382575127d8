/* SPDX-License-Identifier: Apache-2.0 */
/*
 * qmp: the few QEMU Machine Protocol exchanges the vm sandbox needs to save
 * and restore snapshots (sandbox_i.h): one JSON object per line both ways;
 * asynchronous events interleave with replies and are skipped.
 */
#include <errno.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/core/errmsg.h"
#include "sandbox_i.h"

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* One line from qemu (without its newline) into *out (caller frees), by
 * deadline. Lines longer than the buffer are an error: qemu's replies to
 * the commands used here are short. */
static int qmp_line(struct qmp *q, int64_t deadline, json_t **out, char *err, size_t errlen)
{
	for (;;) {
		char *nl = memchr(q->buf, '\n', q->len);
		if (nl) {
			json_error_t je;
			size_t n = (size_t)(nl - q->buf) + 1;
			*out = json_loadb(q->buf, n - 1, 0, &je);
			memmove(q->buf, q->buf + n, q->len - n);
			q->len -= n;
			if (!*out || !json_is_object(*out)) {
				json_decref(*out);
				errmsg_set(err, errlen, "qemu's monitor sent a line that is not a JSON object");
				return -EPROTO;
			}
			return 0;
		}
		if (q->len == sizeof(q->buf)) {
			errmsg_set(err, errlen, "qemu's monitor sent a line over %zu bytes", sizeof(q->buf));
			return -EPROTO;
		}
		int64_t left = deadline - mono_ms();
		struct pollfd p = {.fd = q->fd, .events = POLLIN};
		if (left <= 0) {
			errmsg_set(err, errlen, "qemu's monitor did not answer in time");
			return -ETIMEDOUT;
		}
		int r = poll(&p, 1, (int)left);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			continue;
		ssize_t k = read(q->fd, q->buf + q->len, sizeof(q->buf) - q->len);
		if (k < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (k <= 0) {
			errmsg_set(err, errlen, "qemu's monitor closed the connection");
			return -EPIPE;
		}
		q->len += (size_t)k;
	}
}

int qmp_call(struct qmp *q, const char *cmd, json_t *args, json_t **ret, unsigned timeout_ms, char *err, size_t errlen)
{
	int64_t deadline = mono_ms() + timeout_ms;
	json_t *req = json_pack("{s:s}", "execute", cmd);
	char *line;
	size_t len, off = 0;
	int r = 0;

	if (ret)
		*ret = NULL;
	if (!req || (args && json_object_set(req, "arguments", args) < 0) || !(line = json_dumps(req, JSON_COMPACT))) {
		json_decref(req);
		errmsg_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	json_decref(req);
	len = strlen(line);
	line[len++] = '\n'; /* json_dumps's NUL becomes the newline */
	while (off < len) {
		ssize_t k = send(q->fd, line + off, len - off, MSG_NOSIGNAL); /* qemu may be gone */
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			r = -errno;
			errmsg_set(err, errlen, "qemu's monitor: %s", strerror(errno));
			break;
		}
		off += (size_t)k;
	}
	free(line);
	while (r == 0) {
		json_t *m, *e;
		if ((r = qmp_line(q, deadline, &m, err, errlen)) < 0)
			break;
		if ((e = json_object_get(m, "error"))) {
			const char *desc = json_string_value(json_object_get(e, "desc"));
			errmsg_set(err, errlen, "qemu refused %s: %s", cmd, desc ? desc : "no reason given");
			json_decref(m);
			return -EIO;
		}
		if (json_object_get(m, "return")) {
			if (ret)
				*ret = json_incref(json_object_get(m, "return"));
			json_decref(m);
			return 0;
		}
		json_decref(m); /* an event */
	}
	return r;
}

int qmp_open(struct qmp *q, const char *path, unsigned timeout_ms, char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int64_t deadline = mono_ms() + timeout_ms;
	json_t *greeting = NULL;
	int r;

	q->fd = -1;
	q->len = 0;
	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path) >= sizeof(sa.sun_path)) {
		errmsg_set(err, errlen, "%s: path too long for a socket", path);
		return -ENAMETOOLONG;
	}
	/* qemu makes the socket early in its start; until then, retry */
	for (;;) {
		if ((q->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) < 0) {
			r = -errno;
			errmsg_set(err, errlen, "socket: %s", strerror(errno));
			return r;
		}
		if (connect(q->fd, (struct sockaddr *)&sa, sizeof(sa)) == 0)
			break;
		r = -errno;
		close(q->fd);
		q->fd = -1;
		if ((r != -ENOENT && r != -ECONNREFUSED) || mono_ms() > deadline) {
			errmsg_set(err, errlen, "qemu's monitor %s: %s", path, strerror(-r));
			return r;
		}
		usleep(2000);
	}
	if ((r = qmp_line(q, deadline, &greeting, err, errlen)) < 0 ||
	    (r = json_object_get(greeting, "QMP") ? 0 : -EPROTO) < 0 ||
	    (r = qmp_call(q, "qmp_capabilities", NULL, NULL, timeout_ms, err, errlen)) < 0) {
		if (r == -EPROTO && greeting)
			errmsg_set(err, errlen, "%s: not a QMP greeting", path);
		json_decref(greeting);
		qmp_close(q);
		return r;
	}
	json_decref(greeting);
	return 0;
}

void qmp_close(struct qmp *q)
{
	if (q->fd >= 0)
		close(q->fd);
	q->fd = -1;
	q->len = 0;
}
