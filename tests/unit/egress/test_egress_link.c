/* SPDX-License-Identifier: Apache-2.0 */
/*
 * egress_link: the host's end of the guest's proxy streams (egress_link.h)
 * over two real chans on one loop, with the host's egress proxy behind it
 * and the built-in policy (nothing allowed, so nothing leaves the
 * machine). A guest tunnel's request reaches the proxy and its 403 comes
 * back, then CLOSE DONE; the denial lands in the workspace's egress.json
 * (kept with earlier runs' records, capped at EGRESS_LINK_KEEP, written by
 * the timer and at free) and as one line on the daemon's stderr once the
 * command is gone. Refusals: a command not running (NO_CMD), the per
 * command and per session limits (LIMIT, released by a CLOSE); protocol
 * errors; detach; the command description's quoting.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>

#include "testutil.h"

#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/tunnel.h"
#include "airlock/core/wire.h"
#include "airlock/egress/egress_link.h"
#include "airlock/policy/policy.h"
#include "airlock/sync/audit.h"

#define RUN_MS	 5000
#define CMD_A	 5u /* exec streams of the commands the fake relay runs */
#define CMD_B	 9u
#define NSTREAMS (WIRE_PROXY_PER_SESSION + 8)
#define DESC	 "7 curl 'https://evil.test/a b'"

/* A stream the guest opened with raw frames (no tunnel behind it). */
struct gstream {
	uint32_t stream;
	int close_code; /* -1: no PROXY_CLOSE yet */
	bool eof;
	size_t data;
};

struct t {
	struct tu_chans c;
	struct policy *pol;
	struct egress_link *k;
	char base[64], ws[96], state[96];

	/* the fake relay: which exec streams run a command */
	uint32_t running[16];
	size_t nrunning;
	unsigned changes; /* on_change calls */
	int proto_err;	  /* egress_link_frame < 0 on a frame from the chan */

	struct gstream gs[NSTREAMS];
	size_t ngs;

	/* one guest tunnel, and the command's end of its connection */
	struct tu_tunnel gt;
	struct tu_end app;
};

static int token; /* what find_cmd returns: only egress_link's relay_cmd_output would look inside */

static struct relay_cmd *find_cmd(void *ud, uint32_t exec_stream, const char **desc)
{
	struct t *t = ud;

	for (size_t i = 0; i < t->nrunning; i++) {
		if (t->running[i] == exec_stream) {
			*desc = DESC;
			return (struct relay_cmd *)(void *)&token;
		}
	}
	return NULL;
}

static void on_change(void *ud)
{
	((struct t *)ud)->changes++;
}

static const struct egress_link_ops lops = {.find_cmd = find_cmd, .on_change = on_change};

/* ---- the chans ---- */

static void h_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct t *t = ud;
	(void)c;

	if (type >= WIRE_PROXY_OPEN && type <= WIRE_PROXY_CLOSE && egress_link_frame(t->k, type, stream, p, n) < 0)
		t->proto_err++;
}

static void h_writable(struct chan *c, void *ud)
{
	(void)c;
	egress_link_writable(((struct t *)ud)->k);
}

static struct gstream *gs_find(struct t *t, uint32_t stream)
{
	for (size_t i = 0; i < t->ngs; i++)
		if (t->gs[i].stream == stream)
			return &t->gs[i];
	return NULL;
}

static void g_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct t *t = ud;
	struct gstream *g;

	if (t->gt.t && tunnel_stream(t->gt.t) == stream) {
		assert_int_equal(tunnel_frame(t->gt.t, type, p, n), 0);
		return;
	}
	if (!(g = gs_find(t, stream)))
		fail_msg("frame %u for unknown stream %u", type, stream);
	if (type == WIRE_PROXY_DATA) {
		g->data += n;
		chan_consume(c, stream, n);
	} else if (type == WIRE_PROXY_EOF) {
		g->eof = true;
	} else if (type == WIRE_PROXY_CLOSE) {
		assert_int_equal(n, 1);
		g->close_code = p[0];
	}
}

static void g_writable(struct chan *c, void *ud)
{
	struct t *t = ud;
	(void)c;
	if (t->gt.t)
		tunnel_writable(t->gt.t);
}

static const struct chan_ops hops = {.on_frame = h_frame, .on_writable = h_writable, .on_close = tu_chan_close_fails};
static const struct chan_ops gops = {.on_frame = g_frame, .on_writable = g_writable, .on_close = tu_chan_close_fails};

/* ---- the guest's tunnel ---- */

/* A guest tunnel for the command on exec_stream; t->app is the command's
 * end of its connection. */
static void gt_open(struct t *t, uint32_t exec_stream)
{
	uint8_t open[4] = {(uint8_t)(exec_stream >> 24), (uint8_t)(exec_stream >> 16), (uint8_t)(exec_stream >> 8),
			   (uint8_t)exec_stream};
	uint32_t stream = chan_stream_open(t->c.g, 0);
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	tu_end_watch(t->c.l, &t->app, sv[0]);
	t->app.shut_on_eof = true; /* the command got the whole reply and closes its side too */
	memset(&t->gt, 0, sizeof(t->gt));
	assert_int_equal(
	    tunnel_new(t->c.l, t->c.g, stream, sv[1], open, sizeof(open), &tu_tunnel_ops, &t->gt, &t->gt.t), 0);
}

/* ---- raw guest streams ---- */

static struct gstream *gs_open(struct t *t, uint32_t exec_stream)
{
	uint8_t open[4] = {(uint8_t)(exec_stream >> 24), (uint8_t)(exec_stream >> 16), (uint8_t)(exec_stream >> 8),
			   (uint8_t)exec_stream};
	struct gstream *g;

	assert_true(t->ngs < NSTREAMS);
	g = &t->gs[t->ngs++];
	g->stream = chan_stream_open(t->c.g, 0);
	g->close_code = -1;
	assert_int_equal(chan_send(t->c.g, WIRE_PROXY_OPEN, g->stream, open, sizeof(open)), 0);
	return g;
}

static void gs_close(struct t *t, struct gstream *g, uint8_t code)
{
	assert_int_equal(chan_send(t->c.g, WIRE_PROXY_CLOSE, g->stream, &code, 1), 0);
}

/* ---- setup ---- */

static void start(struct t *t)
{
	char err[256];
	struct egress_link_cfg cfg;

	assert_int_equal(policy_default(&t->pol), 0);
	cfg = (struct egress_link_cfg){.policy = t->pol, .workspace = t->ws};
	tu_chans_new(&t->c, 0, &hops, t, &gops, t);
	assert_int_equal(egress_link_new(t->c.l, &cfg, &lops, t, &t->k, err, sizeof(err)), 0);
	egress_link_attach(t->k, t->c.h);
}

static int setup(void **state)
{
	struct t *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	tu_tmpdir(t->base, sizeof(t->base), "egress-link");
	snprintf(t->ws, sizeof(t->ws), "%s/ws", t->base);
	snprintf(t->state, sizeof(t->state), "%s/state", t->base);
	assert_int_equal(mkdir(t->ws, 0755), 0);
	assert_int_equal(mkdir(t->state, 0700), 0);
	assert_int_equal(setenv("XDG_STATE_HOME", t->state, 1), 0);
	t->running[t->nrunning++] = CMD_A;
	t->running[t->nrunning++] = CMD_B;
	start(t);
	*state = t;
	return 0;
}

static void stop_link(struct t *t)
{
	if (t->gt.t) {
		tunnel_detach(t->gt.t);
		tunnel_free(t->gt.t);
		t->gt.t = NULL;
	}
	egress_link_detach(t->k);
	egress_link_free(t->k);
	t->k = NULL;
}

static int teardown(void **state)
{
	struct t *t = *state;

	if (t->k)
		stop_link(t);
	tu_end_close(&t->app);
	assert_int_equal(t->proto_err, 0);
	tu_chans_free(&t->c);
	policy_free(t->pol);
	tu_rm_rf(t->base);
	free(t);
	return 0;
}

static json_t *read_egress_json(struct t *t)
{
	char err[512];
	void *v = NULL;

	assert_int_equal(audit_read_json(t->ws, AUDIT_EGRESS_FILE, &v, err, sizeof(err)), 0);
	return v;
}

static json_int_t int_at(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v))
		fail_msg("%s: not an integer", key);
	return json_integer_value(v);
}

static const char *str_at(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v))
		fail_msg("%s: not a string", key);
	return json_string_value(v);
}

/* ---- predicates ---- */

static bool app_done(void *ud)
{
	struct t *t = ud;
	return t->app.eof && t->gt.done;
}

static bool first_closed(void *ud)
{
	struct t *t = ud;
	return t->ngs && t->gs[0].close_code >= 0;
}

static bool last_closed(void *ud)
{
	struct t *t = ud;
	return t->ngs && t->gs[t->ngs - 1].close_code >= 0;
}

static struct egress_link_stats g_want; /* what stats_are waits for */

static bool stats_are(void *ud)
{
	struct t *t = ud;
	struct egress_link_stats st;

	egress_link_get_stats(t->k, &st);
	return st.tunnels == g_want.tunnels && st.opened == g_want.opened && st.refused == g_want.refused;
}

static void wait_stats(struct t *t, size_t tunnels, uint64_t opened, uint64_t refused)
{
	struct egress_link_stats st;

	g_want = (struct egress_link_stats){.tunnels = tunnels, .opened = opened, .refused = refused};
	if (!tu_run_until(t->c.l, stats_are, t, RUN_MS)) {
		egress_link_get_stats(t->k, &st);
		fail_msg("stats: tunnels %zu opened %llu refused %llu, want %zu %llu %llu", st.tunnels,
			 (unsigned long long)st.opened, (unsigned long long)st.refused, tunnels,
			 (unsigned long long)opened, (unsigned long long)refused);
	}
}

/* ---- tests ---- */

static bool opened_reached(void *ud)
{
	struct t *t = ud;
	struct egress_link_stats st;

	egress_link_get_stats(t->k, &st);
	return st.opened >= g_want.opened;
}

/* A guest tunnel for exec_stream, once the host has accepted it (the
 * opened count reached `opened`). */
static void gt_open_accepted(struct t *t, uint32_t exec_stream, uint64_t opened)
{
	gt_open(t, exec_stream);
	g_want.opened = opened;
	assert_true(tu_run_until(t->c.l, opened_reached, t, RUN_MS));
}

/* stderr into a file while f runs; its contents (malloc'd) returned. */
static char *capture_stderr_begin(struct t *t, int *saved)
{
	char *path = malloc(PATH_MAX);
	int fd;

	assert_non_null(path);
	snprintf(path, PATH_MAX, "%s/stderr", t->base);
	fflush(stderr);
	assert_true((*saved = dup(2)) >= 0);
	assert_true((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) >= 0);
	assert_int_equal(dup2(fd, 2), 2);
	close(fd);
	return path;
}

static char *capture_stderr_end(char *path, int saved)
{
	char *text;

	fflush(stderr);
	assert_int_equal(dup2(saved, 2), 2);
	close(saved);
	text = tu_read_file(AT_FDCWD, path, NULL);
	assert_non_null(text);
	free(path);
	return text;
}

/* A request from the guest reaches the proxy, its 403 comes back to the
 * command, both sides close DONE; the denial is recorded in egress.json
 * with the command's description, and (the command has ended by then) on
 * the daemon's stderr in the form egress_link.h gives. */
static void test_denied_roundtrip(void **state)
{
	struct t *t = *state;
	static const char req[] = "CONNECT evil.test:443 HTTP/1.1\r\nHost: evil.test:443\r\n\r\n";
	struct egress_link_stats st;
	int saved;
	char *path, *err;
	json_t *j, *d;

	gt_open(t, CMD_A);
	wait_stats(t, 1, 1, 0);
	egress_link_get_stats(t->k, &st);
	assert_int_equal(st.proxy_conns, 1);
	assert_true(t->changes >= 1);
	t->nrunning = 0; /* the command ends before the proxy decides: the line goes to the daemon's log */
	path = capture_stderr_begin(t, &saved);
	assert_int_equal(write(t->app.fd, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
	bool done = tu_run_until(t->c.l, app_done, t, RUN_MS);
	err = capture_stderr_end(path, saved);
	if (!done || !strstr(t->app.in, "HTTP/1.1 403"))
		fail_msg("done %d, reply: %s", done, t->app.in);
	assert_non_null(strstr(t->app.in, "airlock egress: denied CONNECT evil.test:443"));
	assert_int_equal(t->gt.close_rcvd, WIRE_PROXY_C_DONE);
	assert_int_equal(t->gt.close_sent, WIRE_PROXY_C_DONE);
	assert_string_equal(err, "airlock: egress denied CONNECT evil.test:443 (not-allowed: host not on "
				 "egress.allow in (built-in default))\n");
	free(err);
	wait_stats(t, 0, 1, 0);
	egress_link_get_stats(t->k, &st);
	assert_int_equal(st.denials, 1);

	/* the first denial is written at once */
	assert_non_null(j = read_egress_json(t));
	assert_int_equal(int_at(j, "version"), 1);
	assert_int_equal(int_at(j, "denials_total"), 1);
	assert_int_equal(int_at(j, "denials_omitted"), 0);
	assert_int_equal(json_array_size(json_object_get(j, "denials")), 1);
	d = json_array_get(json_object_get(j, "denials"), 0);
	assert_string_equal(str_at(d, "command"), DESC);
	assert_string_equal(str_at(d, "method"), "CONNECT");
	assert_string_equal(str_at(d, "host"), "evil.test");
	assert_int_equal(int_at(d, "port"), 443);
	assert_string_equal(str_at(d, "reason"), "not-allowed");
	assert_non_null(strstr(str_at(d, "message"), "airlock egress: denied CONNECT evil.test:443"));
	assert_true(int_at(d, "time_ms") > 0);
	const char *when = str_at(d, "time");
	assert_int_equal(strlen(when), 24); /* 2026-12-01T19:44:52.123Z */
	assert_int_equal(when[23], 'Z');
	json_decref(j);
	tu_end_close(&t->app);
}

/* Two denials in a row: the second waits for EGRESS_LINK_WRITE_MS and is
 * written by the timer, not only at free. */
static void test_denial_write_timer(void **state)
{
	struct t *t = *state;
	static const char req[] = "GET http://evil.test/x HTTP/1.1\r\nHost: evil.test\r\n\r\n";
	int saved;
	json_t *j;

	for (int i = 0; i < 2; i++) {
		gt_open_accepted(t, CMD_A, (uint64_t)i + 1);
		char *path = capture_stderr_begin(t, &saved);
		assert_int_equal(write(t->app.fd, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
		t->nrunning = 0;
		bool done = tu_run_until(t->c.l, app_done, t, RUN_MS);
		char *err = capture_stderr_end(path, saved);
		t->nrunning = 2;
		if (!done || !strstr(t->app.in, "HTTP/1.1 403"))
			fail_msg("done %d, reply: %s; stderr: %s", done, t->app.in, err);
		assert_non_null(strstr(err, "airlock: egress denied GET evil.test:80 (not-allowed: "));
		free(err);
		tu_end_close(&t->app);
	}
	tu_run_until(t->c.l, NULL, NULL, EGRESS_LINK_WRITE_MS * 3);
	assert_non_null(j = read_egress_json(t));
	assert_int_equal(int_at(j, "denials_total"), 2);
	assert_int_equal(json_array_size(json_object_get(j, "denials")), 2);
	json_decref(j);
}

/* Earlier runs' denials are kept, newest last, at most EGRESS_LINK_KEEP
 * of them; the total counts them all. */
static void test_denials_kept(void **state)
{
	struct t *t = *state;
	static const char req[] = "GET http://evil.test/new HTTP/1.1\r\nHost: evil.test\r\n\r\n";
	char err[512];
	json_t *old = json_array(), *j, *a;
	int saved;

	stop_link(t);
	for (unsigned i = 0; i < EGRESS_LINK_KEEP; i++)
		assert_int_equal(json_array_append_new(old, json_pack("{s:s, s:i}", "host", "old.test", "n", i)), 0);
	j = json_pack("{s:i, s:o, s:I, s:I}", "version", 1, "denials", old, "denials_total", (json_int_t)1500,
		      "denials_omitted", (json_int_t)500);
	assert_int_equal(audit_write_json(t->ws, AUDIT_EGRESS_FILE, j, err, sizeof(err)), 0);
	json_decref(j);
	struct egress_link_cfg cfg = {.policy = t->pol, .workspace = t->ws};
	assert_int_equal(egress_link_new(t->c.l, &cfg, &lops, t, &t->k, err, sizeof(err)), 0);
	egress_link_attach(t->k, t->c.h);

	gt_open_accepted(t, CMD_B, 1);
	char *path = capture_stderr_begin(t, &saved);
	assert_int_equal(write(t->app.fd, req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
	t->nrunning = 0;
	bool done = tu_run_until(t->c.l, app_done, t, RUN_MS);
	free(capture_stderr_end(path, saved));
	assert_true(done);
	tu_end_close(&t->app);
	stop_link(t); /* writes what is pending */

	assert_non_null(j = read_egress_json(t));
	assert_int_equal(int_at(j, "denials_total"), 1501);
	assert_int_equal(int_at(j, "denials_omitted"), 501);
	a = json_object_get(j, "denials");
	assert_int_equal(json_array_size(a), EGRESS_LINK_KEEP);
	assert_int_equal(int_at(json_array_get(a, 0), "n"), 1); /* the oldest went */
	assert_int_equal(int_at(json_array_get(a, EGRESS_LINK_KEEP - 2), "n"), EGRESS_LINK_KEEP - 1);
	assert_string_equal(str_at(json_array_get(a, EGRESS_LINK_KEEP - 1), "host"), "evil.test");
	json_decref(j);
}

/* A PROXY_OPEN for a command that is not running: CLOSE NO_CMD, counted
 * as refused; the stream is forgotten once the guest closes too. */
static void test_no_cmd(void **state)
{
	struct t *t = *state;
	struct gstream *g = gs_open(t, 77);

	assert_true(tu_run_until(t->c.l, last_closed, t, RUN_MS));
	assert_int_equal(g->close_code, WIRE_PROXY_C_NO_CMD);
	wait_stats(t, 1, 0, 1);
	gs_close(t, g, WIRE_PROXY_C_RESET);
	wait_stats(t, 0, 0, 1);
	/* the same for a tunnel: its command gets EOF at once */
	gt_open(t, 78);
	assert_true(tu_run_until(t->c.l, app_done, t, RUN_MS));
	assert_int_equal(t->gt.close_rcvd, WIRE_PROXY_C_NO_CMD);
	assert_int_equal(t->app.nin, 0);
	wait_stats(t, 0, 0, 2);
	tu_end_close(&t->app);
}

/* WIRE_PROXY_PER_CMD streams for one command, the next is refused with
 * LIMIT while another command still gets one; a CLOSE makes room. */
static void test_limit_per_cmd(void **state)
{
	struct t *t = *state;
	struct gstream *g;

	for (unsigned i = 0; i < WIRE_PROXY_PER_CMD; i++)
		gs_open(t, CMD_A);
	wait_stats(t, WIRE_PROXY_PER_CMD, WIRE_PROXY_PER_CMD, 0);
	g = gs_open(t, CMD_A);
	assert_true(tu_run_until(t->c.l, last_closed, t, RUN_MS));
	assert_int_equal(g->close_code, WIRE_PROXY_C_LIMIT);
	gs_close(t, g, WIRE_PROXY_C_RESET);
	wait_stats(t, WIRE_PROXY_PER_CMD, WIRE_PROXY_PER_CMD, 1);
	gs_open(t, CMD_B);
	wait_stats(t, WIRE_PROXY_PER_CMD + 1, WIRE_PROXY_PER_CMD + 1, 1);
	/* the guest resets one of A's: A may open one again */
	gs_close(t, &t->gs[0], WIRE_PROXY_C_RESET);
	assert_true(tu_run_until(t->c.l, first_closed, t, RUN_MS));
	wait_stats(t, WIRE_PROXY_PER_CMD, WIRE_PROXY_PER_CMD + 1, 1);
	g = gs_open(t, CMD_A);
	wait_stats(t, WIRE_PROXY_PER_CMD + 1, WIRE_PROXY_PER_CMD + 2, 1);
	assert_int_equal(g->close_code, -1);
	/* none of the accepted ones was closed by the host */
	for (size_t i = 1; i < t->ngs; i++)
		if (t->gs[i].close_code >= 0 && t->gs[i].close_code != WIRE_PROXY_C_LIMIT)
			fail_msg("stream %zu closed with %d", i, t->gs[i].close_code);
}

/* WIRE_PROXY_PER_SESSION streams over several commands, then LIMIT for
 * any command. */
static void test_limit_per_session(void **state)
{
	struct t *t = *state;
	struct gstream *g;
	uint32_t cmds = WIRE_PROXY_PER_SESSION / WIRE_PROXY_PER_CMD;

	assert_true(cmds <= sizeof(t->running) / sizeof(t->running[0]));
	t->nrunning = 0;
	for (uint32_t c = 0; c < cmds; c++)
		t->running[t->nrunning++] = 100 + c;
	for (uint32_t c = 0; c < cmds; c++)
		for (unsigned i = 0; i < WIRE_PROXY_PER_CMD; i++)
			gs_open(t, 100 + c);
	wait_stats(t, WIRE_PROXY_PER_SESSION, WIRE_PROXY_PER_SESSION, 0);
	t->running[0] = 999; /* a fresh command, with none of its own yet */
	g = gs_open(t, 999);
	assert_true(tu_run_until(t->c.l, last_closed, t, RUN_MS));
	assert_int_equal(g->close_code, WIRE_PROXY_C_LIMIT);
	wait_stats(t, WIRE_PROXY_PER_SESSION + 1, WIRE_PROXY_PER_SESSION, 1);
}

/* What breaks the protocol is -EPROTO (the daemon drops the session),
 * and nothing is opened for it. */
static void test_protocol_errors(void **state)
{
	struct t *t = *state;
	static const uint8_t open[4] = {0, 0, 0, CMD_A}, five[5] = {0, 0, 0, CMD_A, 0};
	struct gstream *g;

	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_OPEN, 3, open, 4), -EPROTO); /* odd: host-opened */
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_OPEN, WIRE_STREAM_CONTROL, open, 4), -EPROTO);
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_OPEN, 1000, open, 3), -EPROTO);
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_OPEN, 1002, five, 5), -EPROTO);
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_DATA, 1004, (const uint8_t *)"x", 1), -EPROTO);
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_CLOSE, 1006, (const uint8_t *)"", 1), -EPROTO);
	wait_stats(t, 0, 0, 0);
	/* an OPEN on a stream already open */
	g = gs_open(t, CMD_A);
	wait_stats(t, 1, 1, 0);
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_OPEN, g->stream, open, 4), -EPROTO);
	wait_stats(t, 1, 1, 0);
	/* a bad CLOSE code on it: the tunnel's protocol error */
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_CLOSE, g->stream, (const uint8_t *)"\x7f", 1), -EPROTO);
	/* not attached: everything is refused */
	egress_link_detach(t->k);
	assert_int_equal(egress_link_frame(t->k, WIRE_PROXY_OPEN, 1008, open, 4), -EPROTO);
	assert_int_equal(egress_link_frame(NULL, WIRE_PROXY_OPEN, 1008, open, 4), -EPROTO);
}

static bool no_proxy_conns(void *ud)
{
	struct t *t = ud;
	struct egress_link_stats st;

	egress_link_get_stats(t->k, &st);
	return st.proxy_conns == 0;
}

/* detach drops every tunnel without a frame; the proxy sees the sockets
 * close. A new session starts from nothing. */
static void test_detach(void **state)
{
	struct t *t = *state;
	struct egress_link_stats st;

	for (int i = 0; i < 3; i++)
		gs_open(t, CMD_A);
	wait_stats(t, 3, 3, 0);
	egress_link_get_stats(t->k, &st);
	assert_int_equal(st.proxy_conns, 3);
	egress_link_detach(t->k);
	egress_link_get_stats(t->k, &st);
	assert_int_equal(st.tunnels, 0);
	assert_true(tu_run_until(t->c.l, no_proxy_conns, t, RUN_MS));
	tu_run_until(t->c.l, NULL, NULL, 50);
	for (size_t i = 0; i < t->ngs; i++)
		assert_int_equal(t->gs[i].close_code, -1); /* nothing was sent */
	/* attached again (the same chan stands in for the next session) */
	egress_link_attach(t->k, t->c.h);
	gs_open(t, CMD_A);
	wait_stats(t, 1, 4, 0);
}

static void test_describe(void **state)
{
	static const char *const argv[] = {"curl", "-H", "X: it's", "", "a\tb", "https://x.test/p?q=1,2"};
	char out[EGRESS_LINK_DESC_MAX], tiny[16];
	(void)state;

	egress_link_describe("7", argv, 6, out, sizeof(out));
	assert_string_equal(out, "7 curl -H 'X: it'\\''s' '' 'a?b' 'https://x.test/p?q=1,2'");
	egress_link_describe(NULL, NULL, 0, out, sizeof(out));
	assert_string_equal(out, "?");
	/* cut to fit, and said so */
	egress_link_describe("7", argv, 6, tiny, sizeof(tiny));
	assert_int_equal(strlen(tiny), sizeof(tiny) - 1);
	assert_string_equal(tiny + sizeof(tiny) - 4, "...");
	assert_memory_equal(tiny, "7 curl -H '", 11);
	egress_link_describe("7", argv, 6, tiny, 0); /* no room: untouched, no crash */
}

static void test_new_errors(void **state)
{
	struct t *t = *state;
	struct egress_link *k = (struct egress_link *)1;
	struct egress_link_ops none = {0};
	struct egress_link_cfg cfg = {.policy = t->pol, .workspace = NULL};
	char err[256];

	assert_int_equal(egress_link_new(t->c.l, &cfg, &lops, t, &k, err, sizeof(err)), -EINVAL);
	assert_null(k);
	assert_non_null(strstr(err, "egress link"));
	cfg.workspace = t->ws;
	assert_int_equal(egress_link_new(t->c.l, &cfg, &none, t, &k, err, sizeof(err)), -EINVAL);
	assert_null(k);
	egress_link_free(NULL);
}

int main(void)
{
#define T(f) cmocka_unit_test_setup_teardown(f, setup, teardown)
	const struct CMUnitTest tests[] = {
	    T(test_denied_roundtrip), T(test_denial_write_timer), T(test_denials_kept),	   T(test_no_cmd),
	    T(test_limit_per_cmd),    T(test_limit_per_session),  T(test_protocol_errors), T(test_detach),
	    T(test_describe),	      T(test_new_errors),
	};
#undef T
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
