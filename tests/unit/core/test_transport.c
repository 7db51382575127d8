/* SPDX-License-Identifier: Apache-2.0 */
/*
 * transport: address parsing and formatting, and every backend against real
 * sockets on loopback, a fake Firecracker vsock socket (a thread, and the
 * fc_standin helper when FC_STANDIN names it), and a pty for serial.
 * Everything lives in a private temp dir removed at the end.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <termios.h>
#include <time.h>
#include <unistd.h>

#include <linux/filter.h>
#include <linux/seccomp.h>
#include <linux/vm_sockets.h>

#include <cmocka.h>

#include "airlock/core/transport.h"

#define ERRLEN 512
#define IO_MS  5000

static char tmpdir[64];

/* ---------------------------------------------------------------- helpers */

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static void tmp_path(char *out, size_t n, const char *name)
{
	int w = snprintf(out, n, "%s/%s", tmpdir, name);

	assert_true(w > 0 && (size_t)w < n);
}

static void assert_fd_flags(int fd)
{
	assert_true(fd >= 0);
	assert_true(fcntl(fd, F_GETFL) & O_NONBLOCK);
	assert_true(fcntl(fd, F_GETFD) & FD_CLOEXEC);
}

static int set_nonblock(int fd)
{
	int fl = fcntl(fd, F_GETFL);

	return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

static void assert_nodelay(int fd)
{
	int v = 0;
	socklen_t sl = sizeof(v);

	assert_int_equal(getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &sl), 0);
	assert_true(v != 0);
}

static void assert_has(const char *err, const char *want)
{
	if (!strstr(err, want))
		fail_msg("error '%s' does not contain '%s'", err, want);
}

static void parse_ok(const char *text, struct transport_addr *a)
{
	char err[ERRLEN] = "";

	if (transport_parse(text, a, err, sizeof(err)) != 0)
		fail_msg("parse '%s': %s", text, err);
}

/* Accept on a listener, polling for up to IO_MS. */
static int accept_wait(const struct transport_addr *a, int lfd)
{
	int64_t end = now_ms() + IO_MS;

	for (;;) {
		struct pollfd pfd = {.fd = lfd, .events = POLLIN};
		int fd = transport_accept(a, lfd);

		if (fd != -EAGAIN)
			return fd;
		assert_true(now_ms() < end);
		(void)poll(&pfd, 1, 100);
	}
}

static void write_all(int fd, const void *p, size_t n)
{
	const char *c = p;
	int64_t end = now_ms() + IO_MS;

	while (n > 0) {
		ssize_t w = send(fd, c, n, MSG_NOSIGNAL);

		if (w < 0 && errno != EAGAIN && errno != EINTR)
			w = write(fd, c, n); /* not a socket (pty) */
		if (w > 0) {
			c += w;
			n -= (size_t)w;
			continue;
		}
		assert_true(w < 0 && (errno == EAGAIN || errno == EINTR));
		assert_true(now_ms() < end);
		struct pollfd pfd = {.fd = fd, .events = POLLOUT};
		(void)poll(&pfd, 1, 100);
	}
}

/* Read exactly n bytes within IO_MS; returns the count read (short on EOF). */
static size_t read_exact(int fd, void *p, size_t n)
{
	char *c = p;
	size_t got = 0;
	int64_t end = now_ms() + IO_MS;

	while (got < n) {
		ssize_t r = read(fd, c + got, n - got);

		if (r > 0) {
			got += (size_t)r;
			continue;
		}
		if (r == 0)
			break;
		assert_true(errno == EAGAIN || errno == EINTR);
		assert_true(now_ms() < end);
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		(void)poll(&pfd, 1, 100);
	}
	return got;
}

static void assert_eof(int fd)
{
	char c;

	assert_int_equal(read_exact(fd, &c, 1), 0);
}

/* Bytes both ways, then EOF from the client's close. Closes both. */
static void exchange(int cfd, int sfd)
{
	char buf[16];

	write_all(cfd, "ping", 4);
	assert_int_equal(read_exact(sfd, buf, 4), 4);
	assert_memory_equal(buf, "ping", 4);
	write_all(sfd, "pong!", 5);
	assert_int_equal(read_exact(cfd, buf, 5), 5);
	assert_memory_equal(buf, "pong!", 5);
	close(cfd);
	assert_eof(sfd);
	close(sfd);
}

static int raw_unix_listener(const char *path, int backlog)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_true(strlen(path) < sizeof(sun.sun_path));
	strcpy(sun.sun_path, path);
	assert_int_equal(bind(fd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	assert_int_equal(listen(fd, backlog), 0);
	return fd;
}

/* ------------------------------------------------------------------ parse */

struct parse_ok_case {
	const char *text;
	enum transport_kind kind;
	const char *host, *path;
	uint32_t cid, port;
	const char *canon;
};

static const struct parse_ok_case parse_ok_cases[] = {
    {"tcp:127.0.0.1:9", TRANSPORT_TCP, "127.0.0.1", "", 0, 9, "tcp:127.0.0.1:9"},
    {"tcp:localhost:80", TRANSPORT_TCP, "localhost", "", 0, 80, "tcp:localhost:80"},
    {"tcp:[::1]:8080", TRANSPORT_TCP, "::1", "", 0, 8080, "tcp:[::1]:8080"},
    {"tcp:[fe80::1%lo]:1", TRANSPORT_TCP, "fe80::1%lo", "", 0, 1, "tcp:[fe80::1%lo]:1"},
    {"tcp:0.0.0.0:0", TRANSPORT_TCP, "0.0.0.0", "", 0, 0, "tcp:0.0.0.0:0"},
    {"tcp:example.org:065535", TRANSPORT_TCP, "example.org", "", 0, 65535, "tcp:example.org:65535"},
    {"tcp:[10.0.0.1]:5", TRANSPORT_TCP, "10.0.0.1", "", 0, 5, "tcp:10.0.0.1:5"},
    {"unix:/run/airlock/x.sock", TRANSPORT_UNIX, "", "/run/airlock/x.sock", 0, 0, "unix:/run/airlock/x.sock"},
    {"unix:relative/s:ock", TRANSPORT_UNIX, "", "relative/s:ock", 0, 0, "unix:relative/s:ock"},
    {"vsock:3:1024", TRANSPORT_VSOCK, "", "", 3, 1024, "vsock:3:1024"},
    {"vsock:any:52", TRANSPORT_VSOCK, "", "", VMADDR_CID_ANY, 52, "vsock:any:52"},
    {"vsock:4294967295:7", TRANSPORT_VSOCK, "", "", VMADDR_CID_ANY, 7, "vsock:any:7"},
    {"vsock:2:4294967295", TRANSPORT_VSOCK, "", "", 2, 4294967295u, "vsock:2:4294967295"},
    {"fc:/run/fc.sock:52", TRANSPORT_FC, "", "/run/fc.sock", 0, 52, "fc:/run/fc.sock:52"},
    {"fc:/a:b/v.sock:7", TRANSPORT_FC, "", "/a:b/v.sock", 0, 7, "fc:/a:b/v.sock:7"},
    {"serial:/dev/vport0p1", TRANSPORT_SERIAL, "", "/dev/vport0p1", 0, 0, "serial:/dev/vport0p1"},
    {"serial:/dev/pts/3", TRANSPORT_SERIAL, "", "/dev/pts/3", 0, 0, "serial:/dev/pts/3"},
};

static void test_parse_valid(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(parse_ok_cases) / sizeof(parse_ok_cases[0]); i++) {
		const struct parse_ok_case *c = &parse_ok_cases[i];
		struct transport_addr a, b;
		char f1[400], f2[400];

		parse_ok(c->text, &a);
		assert_int_equal(a.kind, c->kind);
		assert_string_equal(a.host, c->host);
		assert_string_equal(a.path, c->path);
		assert_int_equal(a.cid, c->cid);
		assert_int_equal(a.port, c->port);
		/* canonical text, which parses to the same address and formats
		 * byte-identically again */
		transport_format(&a, f1, sizeof(f1));
		assert_string_equal(f1, c->canon);
		parse_ok(f1, &b);
		assert_memory_equal(&a, &b, sizeof(a));
		transport_format(&b, f2, sizeof(f2));
		assert_string_equal(f1, f2);
	}
}

static void test_parse_limits(void **state)
{
	char text[600], err[ERRLEN];
	struct transport_addr a;

	(void)state;
	/* 107-byte paths fit sun_path, 108 do not */
	for (int k = 0; k < 3; k++) {
		static const char *const pre[] = {"unix:/", "serial:/", "fc:/"};
		int n = snprintf(text, sizeof(text), "%s", pre[k]);

		memset(text + n, 'p', 106);
		text[n + 106] = '\0';
		if (k == 2)
			strcat(text, ":5");
		parse_ok(text, &a);
		assert_int_equal(strlen(a.path), 107);
		text[n + 106] = '\0';
		strcat(text, k == 2 ? "q:5" : "q");
		assert_int_equal(transport_parse(text, &a, err, sizeof(err)), -EINVAL);
		assert_has(err, k == 1 ? "device longer than 107 bytes" : "path longer than 107 bytes");
		/* a long address is shortened in the message, the reason kept */
		assert_true(strlen(err) < 200);
	}
	/* 255-byte host names fit, 256 do not */
	strcpy(text, "tcp:");
	memset(text + 4, 'h', 255);
	strcpy(text + 4 + 255, ":1");
	parse_ok(text, &a);
	assert_int_equal(strlen(a.host), 255);
	strcpy(text, "tcp:");
	memset(text + 4, 'h', 256);
	strcpy(text + 4 + 256, ":1");
	assert_int_equal(transport_parse(text, &a, err, sizeof(err)), -EINVAL);
	assert_has(err, "host longer than 255 bytes");

	/* no err buffer, tiny err buffer */
	assert_int_equal(transport_parse("nope:1", &a, NULL, 0), -EINVAL);
	assert_int_equal(transport_parse("nope:1", &a, err, 8), -EINVAL);
	assert_int_equal(strlen(err), 7);
	/* format truncates and terminates */
	parse_ok("unix:/tmp/some.sock", &a);
	transport_format(&a, text, 6);
	assert_string_equal(text, "unix:");
}

struct parse_bad_case {
	const char *text;
	const char *want; /* substring of the message */
};

static const struct parse_bad_case parse_bad_cases[] = {
    {"", "empty address"},
    {"127.0.0.1", "missing scheme"},
    {"nope:1", "unknown transport 'nope'"},
    {"TCP:127.0.0.1:1", "unknown transport 'TCP'"},
    {":x", "unknown transport ''"},
    {"tcp:", "expected tcp:HOST:PORT"},
    {"tcp:127.0.0.1", "expected tcp:HOST:PORT"},
    {"tcp:127.0.0.1:", "missing port"},
    {"tcp::80", "missing host"},
    {"tcp:[]:80", "missing host"},
    {"tcp:127.0.0.1:65536", "port 65536 out of range (0-65535)"},
    {"tcp:127.0.0.1:99999999999999999999", "out of range (0-65535)"},
    {"tcp:127.0.0.1:-1", "port '-1' is not a number"},
    {"tcp:127.0.0.1:+1", "port '+1' is not a number"},
    {"tcp:127.0.0.1: 1", "port ' 1' is not a number"},
    {"tcp:127.0.0.1:1x", "port '1x' is not a number"},
    {"tcp:h:0x10", "port '0x10' is not a number"},
    {"tcp:::1:80", "an IPv6 address needs brackets"},
    {"tcp:[::1:80", "missing ']'"},
    {"tcp:[::1]80", "expected ':PORT' after ']'"},
    {"tcp:[::1]", "expected ':PORT' after ']'"},
    {"tcp:a b:80", "host contains a space"},
    {"unix:", "missing path"},
    {"unix:@abstract", "abstract socket names are not supported"},
    {"vsock:3", "expected vsock:CID:PORT"},
    {"vsock::5", "missing CID"},
    {"vsock:3:", "missing port"},
    {"vsock:x:5", "CID 'x' is not a number or 'any'"},
    {"vsock:ANY:5", "CID 'ANY' is not a number or 'any'"},
    {"vsock:4294967296:5", "CID 4294967296 out of range"},
    {"vsock:3:4294967296", "port 4294967296 out of range"},
    {"vsock:3:-5", "port '-5' is not a number"},
    {"fc:/run/fc.sock", "expected fc:UDS_PATH:PORT"},
    {"fc::52", "missing path"},
    {"fc:/run/fc.sock:", "missing port"},
    {"fc:/run/fc.sock:abc", "port 'abc' is not a number"},
    {"fc:/run/fc.sock:4294967296", "out of range"},
    {"fc:@fc:52", "abstract socket names are not supported"},
    {"serial:", "missing device"},
    {"tcp:h:1\n", "port '1\\n' is not a number"}, /* control bytes are escaped */
};

static void test_parse_invalid(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(parse_bad_cases) / sizeof(parse_bad_cases[0]); i++) {
		const struct parse_bad_case *c = &parse_bad_cases[i];
		struct transport_addr a;
		char err[ERRLEN] = "";
		int r = transport_parse(c->text, &a, err, sizeof(err));

		if (r != -EINVAL)
			fail_msg("'%s' parsed (r=%d)", c->text, r);
		assert_has(err, c->want);
		/* the message starts with the address as given */
		if (c->text[0] && !strchr(c->text, '\n')) {
			size_t n = strlen(c->text);

			if (strncmp(err, c->text, n) != 0 || err[n] != ':')
				fail_msg("'%s' does not start with '%s:'", err, c->text);
		}
	}
}

static void test_misuse(void **state)
{
	struct transport_addr a;
	char err[ERRLEN] = "";
	int lfd;

	(void)state;
	memset(&a, 0, sizeof(a));
	a.kind = (enum transport_kind)99;
	assert_int_equal(transport_connect(&a, 10, err, sizeof(err)), -EINVAL);
	assert_int_equal(transport_listen(&a, err, sizeof(err)), -EINVAL);
	assert_int_equal(transport_accept(&a, 0), -EINVAL);
	assert_false(transport_is_stream_listener(&a));
	transport_release(&a, 0);

	parse_ok("tcp:127.0.0.1:1", &a);
	assert_true(transport_is_stream_listener(&a));
	assert_int_equal(transport_accept(&a, -1), -EBADF);
	parse_ok("tcp:127.0.0.1:0", &a);
	assert_int_equal(transport_connect(&a, 100, err, sizeof(err)), -EINVAL);
	assert_string_equal(err, "tcp:127.0.0.1:0: port 0 can only be listened on");

	parse_ok("tcp:nonexistent.invalid:80", &a);
	assert_true(transport_connect(&a, 1000, err, sizeof(err)) < 0);
	assert_has(err, "tcp:nonexistent.invalid:80: cannot resolve the host");

	/* bound_port wants an inet or vsock socket */
	lfd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(transport_bound_port(lfd), -EAFNOSUPPORT);
	close(lfd);
	assert_int_equal(transport_bound_port(-1), -EBADF);
}

/* -------------------------------------------------------------------- tcp */

static void tcp_roundtrip(const char *listen_text, const char *connect_host)
{
	struct transport_addr la, ca;
	char err[ERRLEN] = "", text[300];
	int lfd, cfd, sfd, port;

	parse_ok(listen_text, &la);
	lfd = transport_listen(&la, err, sizeof(err));
	if (lfd < 0)
		fail_msg("listen %s: %s", listen_text, err);
	assert_fd_flags(lfd);
	port = transport_bound_port(lfd);
	assert_true(port > 0 && port <= 65535);
	assert_int_equal(transport_accept(&la, lfd), -EAGAIN);

	snprintf(text, sizeof(text), "tcp:%s:%d", connect_host, port);
	parse_ok(text, &ca);
	cfd = transport_connect(&ca, IO_MS, err, sizeof(err));
	if (cfd < 0)
		fail_msg("connect %s: %s", text, err);
	assert_fd_flags(cfd);
	assert_nodelay(cfd);
	sfd = accept_wait(&la, lfd);
	assert_fd_flags(sfd);
	assert_nodelay(sfd);
	assert_int_equal(transport_accept(&la, lfd), -EAGAIN);
	exchange(cfd, sfd);
	close(lfd);
}

static void test_tcp_v4(void **state)
{
	(void)state;
	tcp_roundtrip("tcp:127.0.0.1:0", "127.0.0.1");
}

static void test_tcp_v6(void **state)
{
	struct transport_addr a;
	char err[ERRLEN];
	int fd;

	(void)state;
	parse_ok("tcp:[::1]:0", &a);
	fd = transport_listen(&a, err, sizeof(err));
	if (fd < 0) {
		print_message("skipping: no IPv6 loopback here (%s)\n", err);
		skip();
	}
	close(fd);
	tcp_roundtrip("tcp:[::1]:0", "[::1]");
}

/* "localhost" may resolve to ::1 before 127.0.0.1: the connect must go on to
 * the next address after a refusal. */
static void test_tcp_name(void **state)
{
	(void)state;
	tcp_roundtrip("tcp:127.0.0.1:0", "localhost");
}

static void test_tcp_refused(void **state)
{
	struct transport_addr a;
	char err[ERRLEN], text[64], want[128];
	int lfd, port;

	(void)state;
	parse_ok("tcp:127.0.0.1:0", &a);
	lfd = transport_listen(&a, err, sizeof(err));
	assert_true(lfd >= 0);
	port = transport_bound_port(lfd);
	close(lfd);
	snprintf(text, sizeof(text), "tcp:127.0.0.1:%d", port);
	parse_ok(text, &a);
	assert_int_equal(transport_connect(&a, 2000, err, sizeof(err)), -ECONNREFUSED);
	snprintf(want, sizeof(want), "%s: connection refused", text);
	assert_string_equal(err, want);
}

/* A listener whose accept queue is full drops SYNs: connect must give up
 * at the deadline. */
static void test_tcp_timeout(void **state)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sin);
	struct transport_addr a;
	char err[ERRLEN] = "", text[64];
	int fds[16], nfds = 0, r = 0, lfd;
	int64_t t0 = 0;

	(void)state;
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(listen(lfd, 0), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sin, &sl), 0);
	snprintf(text, sizeof(text), "tcp:127.0.0.1:%d", ntohs(sin.sin_port));
	parse_ok(text, &a);
	while (nfds < 16) {
		t0 = now_ms();
		r = transport_connect(&a, 200, err, sizeof(err));
		if (r < 0)
			break;
		fds[nfds++] = r;
	}
	assert_int_equal(r, -ETIMEDOUT);
	assert_true(now_ms() - t0 >= 150);
	assert_true(now_ms() - t0 < 2000);
	assert_has(err, text);
	assert_has(err, ": connection timed out after 200 ms");
	while (nfds > 0)
		close(fds[--nfds]);
	close(lfd);
}

/* ------------------------------------------------------------------- unix */

static void test_unix(void **state)
{
	struct transport_addr a;
	char path[128], text[160], err[ERRLEN] = "";
	struct stat st;
	int lfd, lfd2, cfd, sfd;

	(void)state;
	tmp_path(path, sizeof(path), "u.sock");
	snprintf(text, sizeof(text), "unix:%s", path);
	parse_ok(text, &a);
	assert_true(transport_is_stream_listener(&a));
	lfd = transport_listen(&a, err, sizeof(err));
	if (lfd < 0)
		fail_msg("%s", err);
	assert_fd_flags(lfd);
	assert_int_equal(lstat(path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(transport_accept(&a, lfd), -EAGAIN);

	cfd = transport_connect(&a, IO_MS, err, sizeof(err));
	if (cfd < 0)
		fail_msg("%s", err);
	assert_fd_flags(cfd);
	sfd = accept_wait(&a, lfd);
	assert_fd_flags(sfd);
	exchange(cfd, sfd);

	/* a live listener is not replaced */
	assert_int_equal(transport_listen(&a, err, sizeof(err)), -EADDRINUSE);
	assert_has(err, "another process is listening on this socket");

	/* the file of a closed listener is stale: replaced */
	close(lfd);
	assert_int_equal(lstat(path, &st), 0);
	assert_int_equal(transport_connect(&a, 1000, err, sizeof(err)), -ECONNREFUSED);
	assert_has(err, ": connection refused (nothing is listening on this socket)");
	lfd2 = transport_listen(&a, err, sizeof(err));
	if (lfd2 < 0)
		fail_msg("%s", err);
	cfd = transport_connect(&a, IO_MS, err, sizeof(err));
	assert_true(cfd >= 0);
	sfd = accept_wait(&a, lfd2);
	exchange(cfd, sfd);
	close(lfd2);
	unlink(path);
}

static void test_unix_regular_file(void **state)
{
	struct transport_addr a;
	char path[128], text[160], err[ERRLEN] = "", buf[8] = "";
	int fd;

	(void)state;
	tmp_path(path, sizeof(path), "regular");
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "keep", 4), 4);
	close(fd);
	snprintf(text, sizeof(text), "unix:%s", path);
	parse_ok(text, &a);
	assert_int_equal(transport_listen(&a, err, sizeof(err)), -EEXIST);
	assert_has(err, text);
	assert_has(err, "exists and is not a socket; not replacing it");
	fd = open(path, O_RDONLY | O_CLOEXEC);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, buf, sizeof(buf)), 4);
	assert_memory_equal(buf, "keep", 4);
	close(fd);
	unlink(path);

	/* a directory is not replaced either */
	tmp_path(path, sizeof(path), "dir");
	assert_int_equal(mkdir(path, 0700), 0);
	snprintf(text, sizeof(text), "unix:%s", path);
	parse_ok(text, &a);
	assert_int_equal(transport_listen(&a, err, sizeof(err)), -EEXIST);
	assert_int_equal(rmdir(path), 0);
}

static void test_unix_connect_errors(void **state)
{
	struct transport_addr a;
	char path[128], text[160], err[ERRLEN] = "", want[256];
	int fds[8], nfds = 0, r = 0, lfd;
	int64_t t0 = 0;

	(void)state;
	tmp_path(path, sizeof(path), "absent.sock");
	snprintf(text, sizeof(text), "unix:%s", path);
	parse_ok(text, &a);
	assert_int_equal(transport_connect(&a, 500, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "%s: no such file or directory", text);
	assert_string_equal(err, want);

	/* a full backlog makes connect wait, until the deadline */
	tmp_path(path, sizeof(path), "full.sock");
	lfd = raw_unix_listener(path, 0);
	snprintf(text, sizeof(text), "unix:%s", path);
	parse_ok(text, &a);
	while (nfds < 8) {
		t0 = now_ms();
		r = transport_connect(&a, 200, err, sizeof(err));
		if (r < 0)
			break;
		assert_fd_flags(r);
		fds[nfds++] = r;
	}
	assert_int_equal(r, -ETIMEDOUT);
	assert_true(now_ms() - t0 >= 150);
	assert_true(now_ms() - t0 < 2000);
	assert_has(err, "connection timed out after 200 ms");
	/* and a zero timeout is one non-blocking try */
	assert_int_equal(transport_connect(&a, 0, err, sizeof(err)), -ETIMEDOUT);
	while (nfds > 0)
		close(fds[--nfds]);
	close(lfd);
	unlink(path);
}

/* --------------------------------------------------------------------- fc */

enum fake_mode {
	FAKE_REPLY,  /* write reply, then echo 4 bytes when echo, then wait for EOF */
	FAKE_CLOSE,  /* close right after the CONNECT line (and the reply, if any) */
	FAKE_SILENT, /* say nothing, wait for the client to go away */
};

struct fake_fc {
	int lfd;
	enum fake_mode mode;
	const char *reply;
	size_t reply_len;
	int echo;
	char got[80];
	size_t got_len;
};

static void *fake_fc_main(void *arg)
{
	struct fake_fc *f = arg;
	int cfd = accept4(f->lfd, NULL, NULL, SOCK_CLOEXEC);
	char c, buf[4];

	if (cfd < 0)
		return NULL;
	/* the CONNECT line, read as Firecracker does: up to '\n' */
	while (f->got_len < sizeof(f->got) - 1 && read(cfd, &c, 1) == 1) {
		f->got[f->got_len++] = c;
		if (c == '\n')
			break;
	}
	if (f->reply) {
		if (send(cfd, f->reply, f->reply_len, MSG_NOSIGNAL) < 0)
			goto out;
		if (f->echo) {
			size_t n = 0;
			ssize_t r;

			while (n < sizeof(buf) && (r = read(cfd, buf + n, sizeof(buf) - n)) > 0)
				n += (size_t)r;
			if (send(cfd, buf, n, MSG_NOSIGNAL) < 0)
				goto out;
		}
	}
	if (f->mode != FAKE_CLOSE)
		while (read(cfd, &c, 1) > 0)
			;
out:
	close(cfd);
	return NULL;
}

struct fc_case {
	enum fake_mode mode;
	const char *reply;
	int timeout_ms;
	int want_r;
	const char *want;
};

static const struct fc_case fc_cases[] = {
    {FAKE_REPLY, "NOPE\n", IO_MS, -ECONNREFUSED, ": the vsock proxy answered 'NOPE' instead of 'OK <port>'"},
    {FAKE_REPLY, "FAILURE 2\n", IO_MS, -ECONNREFUSED, "the vsock proxy answered 'FAILURE 2' instead of 'OK <port>'"},
    {FAKE_REPLY, "OK 1\r\n", IO_MS, -ECONNREFUSED, "answered 'OK 1\\r' instead"},
    {FAKE_REPLY, "OK \n", IO_MS, -ECONNREFUSED, "answered 'OK ' instead"},
    {FAKE_REPLY, "OK 12a\n", IO_MS, -ECONNREFUSED, "answered 'OK 12a' instead"},
    {FAKE_REPLY, "ok 1\n", IO_MS, -ECONNREFUSED, "answered 'ok 1' instead"},
    {FAKE_REPLY, " OK 1\n", IO_MS, -ECONNREFUSED, "answered ' OK 1' instead"},
    {FAKE_REPLY, "OK 12345678901\n", IO_MS, -ECONNREFUSED, "answered 'OK 12345678901' instead"},
    {FAKE_REPLY, "\x01\xff'\n", IO_MS, -ECONNREFUSED, "answered '\\x01\\xff\\'' instead"},
    {FAKE_REPLY, "\n", IO_MS, -ECONNREFUSED, "answered '' instead"},
    {FAKE_REPLY, "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA", IO_MS, -ECONNREFUSED,
     "(no newline in 64 bytes) instead of 'OK <port>'"},
    {FAKE_CLOSE, "OK 1", IO_MS, -ECONNREFUSED, "answered 'OK 1' and closed the connection"},
    {FAKE_CLOSE, NULL, IO_MS, -ECONNREFUSED,
     "the vsock proxy closed the connection without answering (is anything listening on vsock port 52"},
    {FAKE_SILENT, NULL, 200, -ETIMEDOUT, ": no answer from the vsock proxy within 200 ms"},
};

static void fake_fc_start(struct fake_fc *f, pthread_t *th, const char *path, enum fake_mode mode, const char *reply)
{
	memset(f, 0, sizeof(*f));
	f->lfd = raw_unix_listener(path, 4);
	f->mode = mode;
	f->reply = reply;
	f->reply_len = reply ? strlen(reply) : 0;
	assert_int_equal(pthread_create(th, NULL, fake_fc_main, f), 0);
}

static void fake_fc_stop(struct fake_fc *f, pthread_t th, const char *path)
{
	assert_int_equal(pthread_join(th, NULL), 0);
	close(f->lfd);
	unlink(path);
}

static void test_fc_ok(void **state)
{
	struct transport_addr a;
	char path[128], text[160], err[ERRLEN] = "", buf[8];
	struct fake_fc f;
	pthread_t th;
	int fd;

	(void)state;
	tmp_path(path, sizeof(path), "fc.sock");
	snprintf(text, sizeof(text), "fc:%s:52", path);
	parse_ok(text, &a);
	assert_false(transport_is_stream_listener(&a));
	/* stream bytes right behind the OK line must not be eaten */
	fake_fc_start(&f, &th, path, FAKE_REPLY, "OK 123\nEARLY");
	f.echo = 1;
	fd = transport_connect(&a, IO_MS, err, sizeof(err));
	if (fd < 0)
		fail_msg("%s", err);
	assert_fd_flags(fd);
	assert_int_equal(read_exact(fd, buf, 5), 5);
	assert_memory_equal(buf, "EARLY", 5);
	write_all(fd, "ping", 4);
	assert_int_equal(read_exact(fd, buf, 4), 4);
	assert_memory_equal(buf, "ping", 4);
	close(fd);
	fake_fc_stop(&f, th, path);
	assert_int_equal(f.got_len, strlen("CONNECT 52\n"));
	assert_memory_equal(f.got, "CONNECT 52\n", f.got_len);
}

static void test_fc_refusals(void **state)
{
	char path[128], text[160], err[ERRLEN];

	(void)state;
	tmp_path(path, sizeof(path), "fc.sock");
	snprintf(text, sizeof(text), "fc:%s:52", path);
	for (size_t i = 0; i < sizeof(fc_cases) / sizeof(fc_cases[0]); i++) {
		const struct fc_case *c = &fc_cases[i];
		struct transport_addr a;
		struct fake_fc f;
		pthread_t th;
		int r;

		parse_ok(text, &a);
		fake_fc_start(&f, &th, path, c->mode, c->reply);
		err[0] = '\0';
		r = transport_connect(&a, c->timeout_ms, err, sizeof(err));
		if (r >= 0)
			close(r);
		fake_fc_stop(&f, th, path);
		if (r != c->want_r)
			fail_msg("case %zu: r=%d, want %d (%s)", i, r, c->want_r, err);
		assert_has(err, c->want);
		if (strncmp(err, text, strlen(text)) != 0)
			fail_msg("'%s' does not name '%s'", err, text);
		assert_memory_equal(f.got, "CONNECT 52\n", 11);
	}
}

static void test_fc_errors(void **state)
{
	struct transport_addr a;
	char path[128], text[160], err[ERRLEN] = "", want[300];

	(void)state;
	tmp_path(path, sizeof(path), "no-fc.sock");
	snprintf(text, sizeof(text), "fc:%s:52", path);
	parse_ok(text, &a);
	assert_int_equal(transport_connect(&a, 500, err, sizeof(err)), -ENOENT);
	snprintf(want, sizeof(want), "%s: cannot connect to the vsock socket: no such file or directory", text);
	assert_string_equal(err, want);
	assert_int_equal(transport_listen(&a, err, sizeof(err)), -ENOTSUP);
	assert_has(err, "can only be connected to");
	assert_int_equal(transport_accept(&a, 0), -ENOTSUP);
}

/* fc_standin (built next to this test, named by FC_STANDIN) in front of a
 * unix listener that plays the agent. */
static pid_t standin_start(const char *uds, const char *port, const char *target, const char *reply)
{
	const char *prog = getenv("FC_STANDIN");
	int pfd[2];
	char line[16] = "";
	pid_t pid;

	assert_int_equal(pipe2(pfd, O_CLOEXEC), 0);
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		dup2(pfd[1], 1);
		if (reply)
			execl(prog, "fc_standin", uds, port, target, "--reply", reply, (char *)NULL);
		else
			execl(prog, "fc_standin", uds, port, target, (char *)NULL);
		_exit(127);
	}
	close(pfd[1]);
	assert_true(set_nonblock(pfd[0]) == 0);
	assert_int_equal(read_exact(pfd[0], line, 6), 6);
	assert_memory_equal(line, "ready\n", 6);
	close(pfd[0]);
	return pid;
}

static void standin_stop(pid_t pid, const char *uds)
{
	int st;
	struct stat sb;

	assert_int_equal(kill(pid, SIGTERM), 0);
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	assert_int_equal(WEXITSTATUS(st), 0);
	assert_int_equal(lstat(uds, &sb), -1); /* removed on the way out */
}

static void test_fc_standin(void **state)
{
	struct transport_addr ta, fa;
	char uds[128], target[128], text[160], err[ERRLEN] = "";
	static char big[300000], back[300000];
	int tlfd, cfd, sfd;
	pid_t pid;

	(void)state;
	if (!getenv("FC_STANDIN")) {
		print_message("skipping: FC_STANDIN is not set\n");
		skip();
	}
	tmp_path(uds, sizeof(uds), "fcs.sock");
	tmp_path(target, sizeof(target), "agent.sock");
	snprintf(text, sizeof(text), "unix:%s", target);
	parse_ok(text, &ta);
	tlfd = transport_listen(&ta, err, sizeof(err));
	assert_true(tlfd >= 0);

	pid = standin_start(uds, "52", target, NULL);
	snprintf(text, sizeof(text), "fc:%s:52", uds);
	parse_ok(text, &fa);
	cfd = transport_connect(&fa, IO_MS, err, sizeof(err));
	if (cfd < 0)
		fail_msg("%s", err);
	sfd = accept_wait(&ta, tlfd);
	assert_true(sfd >= 0);
	/* more than the splice buffer, agent to host, while the host writes too */
	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 7 + (i >> 9));
	{
		size_t sent = 0, got = 0;
		int64_t end = now_ms() + IO_MS;

		while (got < sizeof(big)) {
			struct pollfd p[2] = {{.fd = sfd, .events = sent < sizeof(big) ? POLLOUT : 0},
					      {.fd = cfd, .events = POLLIN}};
			ssize_t n;

			assert_true(now_ms() < end);
			(void)poll(p, 2, 100);
			if (sent < sizeof(big)) {
				n = send(sfd, big + sent, sizeof(big) - sent, MSG_NOSIGNAL);
				if (n > 0)
					sent += (size_t)n;
			}
			n = read(cfd, back + got, sizeof(back) - got);
			if (n > 0)
				got += (size_t)n;
			assert_true(n != 0);
		}
		assert_memory_equal(big, back, sizeof(big));
	}
	exchange(cfd, sfd); /* includes EOF passing through the standin */

	/* another port: closed without a word, like Firecracker */
	snprintf(text, sizeof(text), "fc:%s:53", uds);
	parse_ok(text, &fa);
	assert_int_equal(transport_connect(&fa, IO_MS, err, sizeof(err)), -ECONNREFUSED);
	assert_has(err, "closed the connection without answering");
	standin_stop(pid, uds);

	pid = standin_start(uds, "52", target, "FAILURE 2\n");
	snprintf(text, sizeof(text), "fc:%s:52", uds);
	parse_ok(text, &fa);
	assert_int_equal(transport_connect(&fa, IO_MS, err, sizeof(err)), -ECONNREFUSED);
	assert_has(err, "the vsock proxy answered 'FAILURE 2' instead of 'OK <port>'");
	sfd = accept_wait(&ta, tlfd); /* the standin did connect to the target */
	assert_true(sfd >= 0);
	close(sfd);
	standin_stop(pid, uds);
	close(tlfd);
	unlink(target);
}

/* ------------------------------------------------------------------ vsock */

/* In a child: make socket(AF_VSOCK, ...) fail with EAFNOSUPPORT through
 * seccomp, as on a host without vsock, and check the message. */
static void test_vsock_unavailable(void **state)
{
	pid_t pid;
	int st;

	(void)state;
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		struct sock_filter filter[] = {
		    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
		    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 0, 3),
		    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
		    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_VSOCK, 0, 1),
		    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAFNOSUPPORT),
		    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
		};
		struct sock_fprog prog = {.len = sizeof(filter) / sizeof(filter[0]), .filter = filter};
		struct transport_addr a;
		char err[ERRLEN] = "";
		int r;

		if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
		    prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &prog, 0, 0) < 0)
			_exit(77);
		if (transport_parse("vsock:any:1234", &a, err, sizeof(err)) < 0)
			_exit(2);
		r = transport_listen(&a, err, sizeof(err));
		if (r != -EAFNOSUPPORT || strcmp(err, "vsock:any:1234: vsock is not available on this host (AF_VSOCK: "
						      "Address family not supported by protocol)") != 0) {
			fprintf(stderr, "listen: r=%d err='%s'\n", r, err);
			_exit(1);
		}
		if (transport_parse("vsock:3:1234", &a, err, sizeof(err)) < 0)
			_exit(2);
		r = transport_connect(&a, 100, err, sizeof(err));
		if (r != -EAFNOSUPPORT || !strstr(err, "vsock:3:1234: vsock is not available on this host")) {
			fprintf(stderr, "connect: r=%d err='%s'\n", r, err);
			_exit(1);
		}
		_exit(0);
	}
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	if (WEXITSTATUS(st) == 77) {
		print_message("skipping: seccomp filters are not allowed here\n");
		skip();
	}
	assert_int_equal(WEXITSTATUS(st), 0);
}

static void test_vsock(void **state)
{
	struct transport_addr a;
	char text[64], err[ERRLEN] = "";
	int fd, lfd = -1;
	uint32_t port = 0;

	(void)state;
	fd = socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		print_message("skipping: no vsock on this host (%s)\n", strerror(errno));
		skip();
	}
	close(fd);
	/* Listening needs no peer; connecting would, and without a loopback
	 * transport a connect leaves the machine, so it is not tried here. */
	for (int i = 0; i < 8 && lfd < 0; i++) {
		port = 0x40000000u + (uint32_t)((getpid() * 8 + i) & 0xffffff);
		snprintf(text, sizeof(text), "vsock:any:%u", (unsigned)port);
		parse_ok(text, &a);
		lfd = transport_listen(&a, err, sizeof(err));
		if (lfd < 0 && lfd != -EADDRINUSE) {
			print_message("skipping: cannot listen on vsock here (%s)\n", err);
			skip();
		}
	}
	assert_fd_flags(lfd);
	assert_true(transport_is_stream_listener(&a));
	assert_int_equal(transport_bound_port(lfd), (int)port);
	assert_int_equal(transport_accept(&a, lfd), -EAGAIN);
	close(lfd);

	assert_int_equal(transport_connect(&a, 100, err, sizeof(err)), -EINVAL);
	assert_has(err, "CID 'any' can only be listened on");
}

/* ----------------------------------------------------------------- serial */

static void test_serial(void **state)
{
	struct transport_addr a;
	char text[160], err[ERRLEN] = "", buf[16];
	struct termios t;
	int m, lfd, fd, fd2;
	const char *name;

	(void)state;
	m = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
	assert_true(m >= 0);
	assert_int_equal(grantpt(m), 0);
	assert_int_equal(unlockpt(m), 0);
	name = ptsname(m);
	assert_non_null(name);
	snprintf(text, sizeof(text), "serial:%s", name);
	parse_ok(text, &a);
	assert_false(transport_is_stream_listener(&a));

	lfd = transport_listen(&a, err, sizeof(err));
	if (lfd < 0)
		fail_msg("%s", err);
	assert_fd_flags(lfd);
	assert_int_equal(tcgetattr(lfd, &t), 0);
	assert_int_equal(t.c_lflag & (ICANON | ECHO | ISIG), 0);
	assert_int_equal(t.c_oflag & OPOST, 0);

	fd = transport_accept(&a, lfd);
	assert_true(fd >= 0 && fd != lfd);
	assert_fd_flags(fd);
	/* raw: binary bytes, no line buffering, no CR/NL translation */
	write_all(m, "hi\0\x01\r\x7f\n", 7);
	assert_int_equal(read_exact(fd, buf, 7), 7);
	assert_memory_equal(buf, "hi\0\x01\r\x7f\n", 7);
	write_all(fd, "back\n", 5);
	assert_int_equal(set_nonblock(m), 0);
	assert_int_equal(read_exact(m, buf, 5), 5);
	assert_memory_equal(buf, "back\n", 5);

	/* one session at a time */
	assert_int_equal(transport_accept(&a, lfd), -EAGAIN);
	assert_int_equal(transport_accept(&a, lfd), -EAGAIN);
	close(fd);
	assert_int_equal(transport_accept(&a, lfd), -EAGAIN); /* closing is not releasing */
	transport_release(&a, lfd);
	fd2 = transport_accept(&a, lfd);
	assert_true(fd2 >= 0);
	assert_fd_flags(fd2);
	write_all(m, "again", 5);
	assert_int_equal(read_exact(fd2, buf, 5), 5);
	assert_memory_equal(buf, "again", 5);
	assert_int_equal(transport_accept(&a, lfd), -EAGAIN);
	close(fd2);

	/* a new listener (likely on the same fd number) starts fresh */
	close(lfd);
	lfd = transport_listen(&a, err, sizeof(err));
	assert_true(lfd >= 0);
	fd = transport_accept(&a, lfd);
	assert_true(fd >= 0);
	close(fd);
	transport_release(&a, lfd);

	/* nobody at the other end (the master closed: a hangup): no session */
	close(m);
	assert_int_equal(transport_accept(&a, lfd), -EAGAIN);
	close(lfd);

	assert_int_equal(transport_connect(&a, 100, err, sizeof(err)), -ENOTSUP);
	assert_has(err, "listen on it");

	parse_ok("serial:/nonexistent/airlock-tty", &a);
	assert_int_equal(transport_listen(&a, err, sizeof(err)), -ENOENT);
	assert_string_equal(err, "serial:/nonexistent/airlock-tty: cannot open the device: no such file or directory");
}

/* ------------------------------------------------------------------ setup */

static int group_setup(void **state)
{
	(void)state;
	snprintf(tmpdir, sizeof(tmpdir), "/tmp/airlock-transport-XXXXXX");
	if (!mkdtemp(tmpdir))
		return -1;
	signal(SIGPIPE, SIG_IGN);
	return 0;
}

static int group_teardown(void **state)
{
	DIR *d = opendir(tmpdir);
	struct dirent *e;

	(void)state;
	if (d) {
		while ((e = readdir(d))) {
			char p[512];

			if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0)
				continue;
			snprintf(p, sizeof(p), "%s/%s", tmpdir, e->d_name);
			if (unlink(p) < 0)
				rmdir(p);
		}
		closedir(d);
	}
	rmdir(tmpdir);
	return 0;
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_parse_valid),
	    cmocka_unit_test(test_parse_limits),
	    cmocka_unit_test(test_parse_invalid),
	    cmocka_unit_test(test_misuse),
	    cmocka_unit_test(test_tcp_v4),
	    cmocka_unit_test(test_tcp_v6),
	    cmocka_unit_test(test_tcp_name),
	    cmocka_unit_test(test_tcp_refused),
	    cmocka_unit_test(test_tcp_timeout),
	    cmocka_unit_test(test_unix),
	    cmocka_unit_test(test_unix_regular_file),
	    cmocka_unit_test(test_unix_connect_errors),
	    cmocka_unit_test(test_fc_ok),
	    cmocka_unit_test(test_fc_refusals),
	    cmocka_unit_test(test_fc_errors),
	    cmocka_unit_test(test_fc_standin),
	    cmocka_unit_test(test_vsock_unavailable),
	    cmocka_unit_test(test_vsock),
	    cmocka_unit_test(test_serial),
	};

	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
