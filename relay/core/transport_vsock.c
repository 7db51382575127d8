/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport backend for vsock:CID:PORT (AF_VSOCK stream sockets).
 */
#include "transport_i.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include <linux/vm_sockets.h>

static int vsock_parse(const char *rest, struct transport_addr *a, const char *shown, char *err, size_t errlen)
{
	const char *colon = strchr(rest, ':');
	char q[32];
	size_t clen;
	int r;

	if (!colon) {
		transport_errf(err, errlen, "%s: expected vsock:CID:PORT", shown);
		return -EINVAL;
	}
	clen = (size_t)(colon - rest);
	if (clen == 0) {
		transport_errf(err, errlen, "%s: missing CID", shown);
		return -EINVAL;
	}
	if (clen == 3 && memcmp(rest, "any", 3) == 0) {
		a->cid = VMADDR_CID_ANY;
	} else if ((r = transport_parse_u32(rest, clen, UINT32_MAX, &a->cid)) < 0) {
		transport_quote(rest, clen, q, sizeof(q));
		if (r == -ERANGE)
			transport_errf(err, errlen, "%s: CID %s out of range (0-4294967295)", shown, q);
		else
			transport_errf(err, errlen, "%s: CID '%s' is not a number or 'any'", shown, q);
		return -EINVAL;
	}
	return transport_parse_port32(colon + 1, shown, &a->port, err, errlen);
}

static void vsock_format(const struct transport_addr *a, char *out, size_t n)
{
	if (a->cid == VMADDR_CID_ANY)
		snprintf(out, n, "vsock:any:%u", (unsigned)a->port);
	else
		snprintf(out, n, "vsock:%u:%u", (unsigned)a->cid, (unsigned)a->port);
}

/* Errors that mean "this kernel has no usable vsock", from socket(), bind()
 * or connect(). */
static int vsock_missing(int e)
{
	return e == EAFNOSUPPORT || e == EPROTONOSUPPORT || e == ESOCKTNOSUPPORT || e == ENODEV;
}

static void vsock_err(const struct transport_addr *a, char *err, size_t errlen, const char *what, int e)
{
	char why[128];

	if (vsock_missing(e)) {
		const char *s = strerror_r(e, why, sizeof(why)); /* GNU strerror_r */

		transport_addr_err(a, err, errlen, "vsock is not available on this host (AF_VSOCK: %s)", s);
	} else {
		transport_addr_err(a, err, errlen, "%s: %s", what, transport_reason(e, why, sizeof(why)));
	}
}

static int vsock_socket(const struct transport_addr *a, char *err, size_t errlen)
{
	int fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

	if (fd < 0) {
		fd = -errno;
		vsock_err(a, err, errlen, "cannot create a vsock socket", -fd);
	}
	return fd;
}

static void vsock_fill(const struct transport_addr *a, struct sockaddr_vm *svm)
{
	memset(svm, 0, sizeof(*svm));
	svm->svm_family = AF_VSOCK;
	svm->svm_cid = a->cid;
	svm->svm_port = a->port;
}

static int vsock_connect(const struct transport_addr *a, int64_t deadline, int timeout_ms, char *err, size_t errlen)
{
	struct sockaddr_vm svm;
	int fd, r;

	if (a->cid == VMADDR_CID_ANY) {
		transport_addr_err(a, err, errlen, "CID 'any' can only be listened on; name the peer's CID");
		return -EINVAL;
	}
	if ((fd = vsock_socket(a, err, errlen)) < 0)
		return fd;
	if (timeout_ms >= 0) {
		/* The kernel gives up on its own after a default of 2 s; let our
		 * deadline decide instead. */
		struct timeval tv = {.tv_sec = timeout_ms / 1000 + 1, .tv_usec = 0};

		(void)setsockopt(fd, AF_VSOCK, SO_VM_SOCKETS_CONNECT_TIMEOUT, &tv, sizeof(tv));
	}
	vsock_fill(a, &svm);
	r = transport_sock_connect(fd, (struct sockaddr *)&svm, sizeof(svm), deadline);
	if (r == 0)
		return fd;
	close(fd);
	if (r == -ETIMEDOUT)
		transport_addr_err(a, err, errlen, "connection timed out after %d ms", timeout_ms);
	else
		vsock_err(a, err, errlen, "cannot connect", -r);
	return r;
}

static int vsock_listen(const struct transport_addr *a, char *err, size_t errlen)
{
	struct sockaddr_vm svm;
	int fd, r;

	if ((fd = vsock_socket(a, err, errlen)) < 0)
		return fd;
	vsock_fill(a, &svm);
	if (bind(fd, (struct sockaddr *)&svm, sizeof(svm)) < 0) {
		r = -errno;
		vsock_err(a, err, errlen, "cannot bind", -r);
		goto fail;
	}
	if (listen(fd, SOMAXCONN) < 0) {
		r = -errno;
		vsock_err(a, err, errlen, "cannot listen", -r);
		goto fail;
	}
	return fd;
fail:
	close(fd);
	return r;
}

static int vsock_accept(const struct transport_addr *a, int lfd)
{
	(void)a;
	return transport_sock_accept(lfd);
}

const struct transport_ops transport_vsock_ops = {
    .scheme = "vsock",
    .stream_listener = 1,
    .parse = vsock_parse,
    .format = vsock_format,
    .connect = vsock_connect,
    .listen = vsock_listen,
    .accept = vsock_accept,
};
