/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proxy: the guest agent's per-command listeners (proxy.h) over two real
 * chans on one loop; the test plays the host (a tunnel per PROXY_OPEN,
 * whose far end it reads and writes, or a refusal) and the command (TCP
 * clients of the listener). Bytes both ways, half-close each way and CLOSE
 * DONE, the listener only on 127.0.0.1, host refusals, the per-command and
 * per-session limits, a command's end (no new connections, open ones
 * linger PROXY_LINGER_MS and are then reset), protocol errors, proxy_free
 * with tunnels open, and the environment proxy_env makes.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/tunnel.h"
#include "airlock/core/wire.h"
#include "airlock/guest/proxy.h"

#define RUN_MS	 5000
#define CMD_A	 5u
#define CMD_B	 7u
#define MAX_TUNS (WIRE_PROXY_PER_SESSION + 8)

/* The host's side of one guest-opened stream. */
struct htun {
	struct tu_tunnel tun;
	uint32_t stream, exec_stream;
	struct tu_end app;
};

struct t {
	struct tu_chans c;
	struct proxy *p;
	uint8_t refuse;	 /* 0xff: the host accepts every PROXY_OPEN */
	bool host_holds; /* the host's ends do not answer EOF by themselves */
	int proto_err;	 /* the host's tunnel_frame < 0 */
	struct htun h[MAX_TUNS];
	size_t nh;
};

/* ---- the host ---- */

static void host_open(struct t *t, uint32_t stream, const uint8_t *p, size_t n)
{
	struct htun *h;
	int sv[2];

	assert_int_equal(n, 4);
	assert_int_equal(stream % 2, 0);
	assert_true(t->nh < MAX_TUNS);
	h = &t->h[t->nh++];
	h->stream = stream;
	h->exec_stream = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
	chan_consume(t->c.h, stream, n);
	if (t->refuse != 0xff) {
		assert_int_equal(tunnel_new(t->c.l, t->c.h, stream, -1, NULL, 0, &tu_tunnel_ops, &h->tun, &h->tun.t),
				 0);
		tunnel_abort(h->tun.t, t->refuse);
		return;
	}
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	tu_end_watch(t->c.l, &h->app, sv[0]);
	h->app.shut_on_eof = !t->host_holds;
	assert_int_equal(tunnel_new(t->c.l, t->c.h, stream, sv[1], NULL, 0, &tu_tunnel_ops, &h->tun, &h->tun.t), 0);
}

static struct htun *htun_find(struct t *t, uint32_t stream)
{
	for (size_t i = 0; i < t->nh; i++)
		if (t->h[i].stream == stream && t->h[i].tun.t)
			return &t->h[i];
	return NULL;
}

static void h_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct t *t = ud;
	struct htun *h;
	(void)c;

	if (type == WIRE_PROXY_OPEN) {
		host_open(t, stream, p, n);
		return;
	}
	if (!(h = htun_find(t, stream))) {
		fail_msg("frame %u on stream %u the host does not know", type, stream);
		return;
	}
	if (tunnel_frame(h->tun.t, type, p, n) < 0)
		t->proto_err++;
}

static void h_writable(struct chan *c, void *ud)
{
	struct t *t = ud;
	(void)c;

	for (size_t i = 0; i < t->nh; i++)
		if (t->h[i].tun.t)
			tunnel_writable(t->h[i].tun.t);
}

/* ---- the guest ---- */

static void g_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct t *t = ud;
	(void)c;

	if (proxy_frame(t->p, type, stream, p, n) < 0)
		fail_msg("proxy_frame %u on stream %u: protocol error", type, stream);
}

static void g_writable(struct chan *c, void *ud)
{
	(void)c;
	proxy_writable(((struct t *)ud)->p);
}

static const struct chan_ops hops = {.on_frame = h_frame, .on_writable = h_writable, .on_close = tu_chan_close_fails};
static const struct chan_ops gops = {.on_frame = g_frame, .on_writable = g_writable, .on_close = tu_chan_close_fails};

static int setup(void **state)
{
	struct t *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	t->refuse = 0xff;
	tu_chans_new(&t->c, 0, &hops, t, &gops, t);
	assert_int_equal(proxy_new(t->c.l, t->c.g, &t->p), 0);
	*state = t;
	return 0;
}

static int teardown(void **state)
{
	struct t *t = *state;

	proxy_free(t->p);
	for (size_t i = 0; i < t->nh; i++) {
		if (t->h[i].tun.t) {
			tunnel_detach(t->h[i].tun.t);
			tunnel_free(t->h[i].tun.t);
		}
		tu_end_close(&t->h[i].app);
	}
	assert_int_equal(t->proto_err, 0);
	tu_chans_free(&t->c);
	free(t);
	return 0;
}

/* ---- the command's side ---- */

/* A blocking TCP connection to addr:port: -errno when refused. */
static int connect_to(const char *addr, uint16_t port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_port = htons(port)};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), r;

	assert_true(fd >= 0);
	assert_int_equal(inet_pton(AF_INET, addr, &sin.sin_addr), 1);
	if (connect(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return fd;
}

/* ---- predicates ---- */

static size_t g_n; /* what the predicates below wait for */
static struct tu_end *g_end;

static bool nh_reached(void *ud)
{
	return ((struct t *)ud)->nh >= g_n;
}

static bool tunnels_are(void *ud)
{
	return proxy_tunnels(((struct t *)ud)->p) == g_n;
}

static bool end_has(void *ud)
{
	(void)ud;
	return g_end->nin >= g_n;
}

static bool end_eof(void *ud)
{
	(void)ud;
	return g_end->eof;
}

static void wait_opens(struct t *t, size_t n)
{
	g_n = n;
	if (!tu_run_until(t->c.l, nh_reached, t, RUN_MS))
		fail_msg("the host got %zu PROXY_OPENs, want %zu", t->nh, n);
}

static void wait_tunnels(struct t *t, size_t n)
{
	g_n = n;
	if (!tu_run_until(t->c.l, tunnels_are, t, RUN_MS))
		fail_msg("%zu tunnels open, want %zu", proxy_tunnels(t->p), n);
}

static void wait_bytes(struct t *t, struct tu_end *e, size_t n)
{
	g_n = n;
	g_end = e;
	if (!tu_run_until(t->c.l, end_has, t, RUN_MS))
		fail_msg("%zu bytes arrived, want %zu", e->nin, n);
}

static void wait_eof(struct t *t, struct tu_end *e)
{
	g_end = e;
	assert_true(tu_run_until(t->c.l, end_eof, t, RUN_MS));
}

/* ---- tests ---- */

/* Bytes both ways, each side's half-close reaching the other, both
 * CLOSEs DONE and the tunnel gone. The PROXY_OPEN names the command. */
static void test_roundtrip_half_close(void **state)
{
	struct t *t = *state;
	struct tu_end cl;
	uint16_t port = 0;
	int fd;

	t->host_holds = true;
	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &port), 0);
	assert_true(port != 0);
	assert_true((fd = connect_to("127.0.0.1", port)) >= 0);
	tu_end_watch(t->c.l, &cl, fd);
	wait_opens(t, 1);
	assert_int_equal(t->h[0].exec_stream, CMD_A);
	assert_int_equal(proxy_tunnels(t->p), 1);

	assert_int_equal(send(fd, "GET / HTTP/1.1\r\n\r\n", 18, MSG_NOSIGNAL), 18);
	wait_bytes(t, &t->h[0].app, 18);
	assert_string_equal(t->h[0].app.in, "GET / HTTP/1.1\r\n\r\n");
	/* the command half-closes: the host's end reads EOF, and can still answer */
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	wait_eof(t, &t->h[0].app);
	assert_false(t->h[0].app.reset);
	assert_int_equal(send(t->h[0].app.fd, "HTTP/1.1 200 OK\r\n\r\nhi", 21, MSG_NOSIGNAL), 21);
	wait_bytes(t, &cl, 21);
	assert_string_equal(cl.in, "HTTP/1.1 200 OK\r\n\r\nhi");
	assert_false(cl.eof);
	assert_int_equal(shutdown(t->h[0].app.fd, SHUT_WR), 0);
	wait_eof(t, &cl);
	assert_false(cl.reset);
	wait_tunnels(t, 0);
	assert_true(t->h[0].tun.done);
	assert_int_equal(t->h[0].tun.close_rcvd, WIRE_PROXY_C_DONE);
	assert_int_equal(t->h[0].tun.close_sent, WIRE_PROXY_C_DONE);
	tu_end_close(&cl);
}

/* The listener is on 127.0.0.1 only, one per command: -EEXIST for the
 * same command, another port for another. */
static void test_listeners(void **state)
{
	struct t *t = *state;
	uint16_t a = 0, b = 0, again = 0;
	int fd;

	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &a), 0);
	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &again), -EEXIST);
	assert_int_equal(again, 0);
	assert_int_equal(proxy_cmd_start(t->p, CMD_B, &b), 0);
	assert_true(a != b);
	/* another loopback address is not listened on */
	assert_int_equal(connect_to("127.0.0.2", a), -ECONNREFUSED);
	/* a connection to B's port is B's */
	assert_true((fd = connect_to("127.0.0.1", b)) >= 0);
	wait_opens(t, 1);
	assert_int_equal(t->h[0].exec_stream, CMD_B);
	close(fd);
	wait_tunnels(t, 0);
	/* the command ends with nothing open: the port closes at once and the
	 * command may start again */
	proxy_cmd_end(t->p, CMD_A);
	assert_int_equal(connect_to("127.0.0.1", a), -ECONNREFUSED);
	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &again), 0);
	proxy_cmd_end(t->p, 12345); /* unknown: ignored */
	proxy_cmd_end(NULL, CMD_A);
}

/* A host refusal (the command is gone on the host, or a limit) closes
 * the command's connection and frees the tunnel. */
static void test_host_refuses(void **state)
{
	struct t *t = *state;
	struct tu_end cl;
	uint16_t port;
	int fd;

	t->refuse = WIRE_PROXY_C_NO_CMD;
	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &port), 0);
	assert_true((fd = connect_to("127.0.0.1", port)) >= 0);
	tu_end_watch(t->c.l, &cl, fd);
	wait_opens(t, 1);
	wait_eof(t, &cl);
	assert_int_equal(cl.nin, 0);
	wait_tunnels(t, 0);
	assert_true(t->h[0].tun.done);
	assert_int_equal(t->h[0].tun.close_sent, WIRE_PROXY_C_NO_CMD);
	assert_int_equal(t->h[0].tun.close_rcvd, WIRE_PROXY_C_RESET);
	tu_end_close(&cl);
}

/* The connection over a limit is reset by the guest itself: no
 * PROXY_OPEN reaches the host for it. */
static void expect_reset_locally(struct t *t, uint16_t port, size_t opens)
{
	struct tu_end cl;
	int fd;

	assert_true((fd = connect_to("127.0.0.1", port)) >= 0);
	tu_end_watch(t->c.l, &cl, fd);
	wait_eof(t, &cl);
	assert_true(cl.reset);
	tu_run_until(t->c.l, NULL, NULL, 20);
	assert_int_equal(t->nh, opens);
	tu_end_close(&cl);
}

static void test_limit_per_cmd(void **state)
{
	struct t *t = *state;
	int fds[WIRE_PROXY_PER_CMD + 1];
	uint16_t a, b;

	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &a), 0);
	assert_int_equal(proxy_cmd_start(t->p, CMD_B, &b), 0);
	for (unsigned i = 0; i < WIRE_PROXY_PER_CMD; i++)
		assert_true((fds[i] = connect_to("127.0.0.1", a)) >= 0);
	wait_opens(t, WIRE_PROXY_PER_CMD);
	assert_int_equal(proxy_tunnels(t->p), WIRE_PROXY_PER_CMD);
	expect_reset_locally(t, a, WIRE_PROXY_PER_CMD);
	/* another command is not held back by A's */
	assert_true((fds[WIRE_PROXY_PER_CMD] = connect_to("127.0.0.1", b)) >= 0);
	wait_opens(t, WIRE_PROXY_PER_CMD + 1);
	/* one of A's ends: A may connect again */
	close(fds[0]);
	wait_tunnels(t, WIRE_PROXY_PER_CMD);
	assert_true((fds[0] = connect_to("127.0.0.1", a)) >= 0);
	wait_opens(t, WIRE_PROXY_PER_CMD + 2);
	assert_int_equal(t->h[WIRE_PROXY_PER_CMD + 1].exec_stream, CMD_A);
	for (unsigned i = 0; i <= WIRE_PROXY_PER_CMD; i++)
		close(fds[i]);
}

static void test_limit_per_session(void **state)
{
	struct t *t = *state;
	enum { NCMD = WIRE_PROXY_PER_SESSION / WIRE_PROXY_PER_CMD };
	static int fds[WIRE_PROXY_PER_SESSION];
	uint16_t ports[NCMD + 1];
	size_t k = 0;

	for (uint32_t c = 0; c <= NCMD; c++)
		assert_int_equal(proxy_cmd_start(t->p, 100 + c, &ports[c]), 0);
	for (uint32_t c = 0; c < NCMD; c++) {
		for (unsigned i = 0; i < WIRE_PROXY_PER_CMD; i++)
			assert_true((fds[k++] = connect_to("127.0.0.1", ports[c])) >= 0);
		wait_opens(t, k); /* the backlog stays short */
	}
	assert_int_equal(proxy_tunnels(t->p), WIRE_PROXY_PER_SESSION);
	/* a command with none of its own yet: over the session's limit */
	expect_reset_locally(t, ports[NCMD], WIRE_PROXY_PER_SESSION);
	for (size_t i = 0; i < k; i++)
		close(fds[i]);
}

/* The command ends with a connection open: no new connections, the open
 * one still carries bytes for PROXY_LINGER_MS, then it is reset (the host
 * gets CLOSE RESET) and the command's state goes. */
static void test_cmd_end_linger(void **state)
{
	struct t *t = *state;
	struct tu_end cl;
	uint16_t port, again;
	int fd;

	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &port), 0);
	assert_true((fd = connect_to("127.0.0.1", port)) >= 0);
	tu_end_watch(t->c.l, &cl, fd);
	wait_opens(t, 1);
	uint64_t t0 = loop_now_ms();
	proxy_cmd_end(t->p, CMD_A);
	assert_int_equal(connect_to("127.0.0.1", port), -ECONNREFUSED);
	/* a new command on the same exec stream number is a new listener */
	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &again), 0);
	proxy_cmd_end(t->p, CMD_A);
	assert_int_equal(send(t->h[0].app.fd, "late", 4, MSG_NOSIGNAL), 4);
	wait_bytes(t, &cl, 4);
	assert_string_equal(cl.in, "late");
	assert_int_equal(proxy_tunnels(t->p), 1);
	/* after the linger: reset */
	g_end = &cl;
	assert_true(tu_run_until(t->c.l, end_eof, t, PROXY_LINGER_MS + RUN_MS));
	assert_true(loop_now_ms() - t0 >= PROXY_LINGER_MS - 50);
	assert_true(cl.reset);
	wait_tunnels(t, 0);
	assert_true(t->h[0].tun.done);
	assert_int_equal(t->h[0].tun.close_rcvd, WIRE_PROXY_C_RESET);
	tu_end_close(&cl);
}

/* proxy_free with a tunnel open sends nothing and closes the command's
 * connection. */
static void test_free_open(void **state)
{
	struct t *t = *state;
	struct tu_end cl;
	uint16_t port;
	int fd;

	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &port), 0);
	assert_true((fd = connect_to("127.0.0.1", port)) >= 0);
	tu_end_watch(t->c.l, &cl, fd);
	wait_opens(t, 1);
	proxy_free(t->p);
	t->p = NULL;
	wait_eof(t, &cl);
	tu_run_until(t->c.l, NULL, NULL, 20);
	assert_false(t->h[0].tun.done); /* no CLOSE came */
	assert_int_equal(connect_to("127.0.0.1", port), -ECONNREFUSED);
	tu_end_close(&cl);
	proxy_free(NULL);
}

static void test_protocol_errors(void **state)
{
	struct t *t = *state;
	static const uint8_t open[4] = {0, 0, 0, CMD_A}, done = WIRE_PROXY_C_DONE;
	uint16_t port;
	int fd;

	assert_int_equal(proxy_cmd_start(t->p, CMD_A, &port), 0);
	assert_true((fd = connect_to("127.0.0.1", port)) >= 0);
	wait_opens(t, 1);
	/* the host never opens a proxy stream, not even on one of ours */
	assert_int_equal(proxy_frame(t->p, WIRE_PROXY_OPEN, t->h[0].stream, open, 4), -EPROTO);
	assert_int_equal(proxy_frame(t->p, WIRE_PROXY_DATA, t->h[0].stream + 1, (const uint8_t *)"x", 1), -EPROTO);
	assert_int_equal(proxy_frame(t->p, WIRE_PROXY_DATA, t->h[0].stream + 2000, (const uint8_t *)"x", 1), -EPROTO);
	assert_int_equal(proxy_frame(NULL, WIRE_PROXY_DATA, t->h[0].stream, (const uint8_t *)"x", 1), -EPROTO);
	/* CLOSE DONE before any EOF: the tunnel's protocol error */
	assert_int_equal(proxy_frame(t->p, WIRE_PROXY_CLOSE, t->h[0].stream, &done, 1), -EPROTO);
	close(fd);
}

static const char *env_get(char **v, const char *name)
{
	size_t l = strlen(name);

	for (; *v; v++)
		if (!strncmp(*v, name, l) && (*v)[l] == '=')
			return *v + l + 1;
	return NULL;
}

static void test_env(void **state)
{
	static const char *const urls[] = {"HTTP_PROXY",  "HTTPS_PROXY", "ALL_PROXY",	     "http_proxy",
					   "https_proxy", "all_proxy",	 "npm_config_proxy", "npm_config_https_proxy",
					   "PIP_PROXY"};
	char **v = NULL;
	size_t n = 0;
	unsigned long used, c0;
	(void)state;

	assert_int_equal(proxy_env(40123, &v), 0);
	while (v[n])
		n++;
	assert_int_equal(n, PROXY_ENV_COUNT);
	for (size_t i = 0; i < sizeof(urls) / sizeof(urls[0]); i++) {
		const char *u = env_get(v, urls[i]);
		if (!u || strcmp(u, "http://127.0.0.1:40123"))
			fail_msg("%s=%s", urls[i], u ? u : "(missing)");
	}
	assert_string_equal(env_get(v, "NO_PROXY"), "localhost,127.0.0.1,::1");
	assert_string_equal(env_get(v, "no_proxy"), "localhost,127.0.0.1,::1");
	assert_string_equal(env_get(v, "GIT_CONFIG_COUNT"), "1");
	assert_string_equal(env_get(v, "GIT_CONFIG_KEY_0"), "http.proxy");
	assert_string_equal(env_get(v, "GIT_CONFIG_VALUE_0"), "http://127.0.0.1:40123");
	proxy_env_free(v);
	proxy_env_free(NULL);
	/* every allocation failure: -ENOMEM and nothing to free */
	c0 = mem_count();
	assert_int_equal(proxy_env(1, &v), 0);
	used = mem_count() - c0;
	proxy_env_free(v);
	for (unsigned long k = 1; k <= used; k++) {
		v = (char **)1;
		mem_fail_at(k, 0);
		int r = proxy_env(1, &v);
		mem_fail_at(0, 0);
		assert_int_equal(r, -ENOMEM);
		assert_null(v);
	}
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
	    T(test_roundtrip_half_close), T(test_listeners),	  T(test_host_refuses), T(test_limit_per_cmd),
	    T(test_limit_per_session),	  T(test_cmd_end_linger), T(test_free_open),	T(test_protocol_errors),
	    cmocka_unit_test(test_env),
	};
#undef T
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
