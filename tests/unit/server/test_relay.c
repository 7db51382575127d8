/* SPDX-License-Identifier: Apache-2.0 */
/*
 * relay tests: a real Unix socket, real client connections from this
 * process, and a simulated backend (tb_*) that plays commands
 * deterministically from timers on the same loop. Everything runs on one
 * thread: a test client never blocks, it spins the loop until what it
 * waits for arrives (or a deadline passes).
 *
 * Simulated commands, by argv[0]:
 *   echo A B..     stdout "A B..\n", exit 0
 *   env            stdout: cwd, env entries, timeout and tty as lines
 *   gen N SEED     N bytes of a pattern on stdout (4 KiB per tick), exit 0
 *   tailgen N M    N bytes on stdout, M on stderr, exit 7
 *   flood          64 KiB per tick on stdout until cancelled (honours pause)
 *   bin            bytes 0..255 on stdout;  utf8: "h\xc3\xa9llo \xe2\x82\xac\n"
 *   cat            stdin back on stdout, exit 0 at eof
 *   sleep          until signal (exit by it) or cancel (TERM)
 *   fail           relay_cmd_error("spawn_failed")
 *   refuse         exec_start returns -ENOENT
 *   timeout        exits as timed out (KILL)
 *   sh -c S        stdout "sh:" S "\n"
 */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
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
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <jansson.h>
#include <sodium.h>

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/server/relay.h"

/* ------------------------------------------------------------------ */
/* simulated backend */

struct tcmd {
	struct tb *tb;
	struct relay_cmd *cmd;
	struct tcmd *next;
	char kind[16];
	char text[256];
	uint64_t timer;
	size_t left[2], done[2];
	unsigned seed;
	bool paused, started, ended;
	uint64_t flood_bytes;
};

struct tb {
	struct loop *l;
	struct relay *r;
	struct tcmd *cmds;
	int next_pid;
	unsigned pauses, resumes;
	int last_signal;
	uint16_t rows, cols;
	bool sync_fail;
	uint64_t flood_total;
	size_t last_argv_bytes;
	char last_fork[40];   /* the exec request's "fork" ("" for none) */
	unsigned cancels;     /* cancel calls */
	unsigned cancel_busy; /* answer this many cancel calls with -EAGAIN */
};

static uint8_t pattern(unsigned seed, size_t i)
{
	return (uint8_t)('a' + (seed + i) % 26);
}

static void tc_end(struct tcmd *t, int code, int sig, bool timed_out)
{
	struct relay_exit ex = {.code = code, .signal = sig, .timed_out = timed_out, .duration_ms = 5};

	if (t->ended)
		return;
	t->ended = true;
	if (t->timer)
		loop_del_timer(t->tb->l, t->timer);
	t->timer = 0;
	relay_cmd_exit(t->cmd, &ex);
}

static void tc_tick(struct loop *l, void *ud);

static void tc_arm(struct tcmd *t)
{
	if (!t->timer && !t->ended)
		t->timer = loop_add_timer(t->tb->l, 0, tc_tick, t);
}

static void tc_tick(struct loop *l, void *ud)
{
	struct tcmd *t = ud;
	uint8_t chunk[65536];

	(void)l;
	t->timer = 0;
	if (t->ended)
		return;
	if (!t->started) {
		t->started = true;
		relay_cmd_started(t->cmd, t->tb->next_pid++);
		if (!strcmp(t->kind, "fail")) {
			t->ended = true;
			relay_cmd_error(t->cmd, "spawn_failed", "fail: no such file or directory");
			return;
		}
		tc_arm(t);
		return;
	}
	if (t->paused)
		return;
	if (!strcmp(t->kind, "text")) {
		relay_cmd_output(t->cmd, RELAY_STDOUT, t->text, strlen(t->text));
		tc_end(t, 0, 0, false);
	} else if (!strcmp(t->kind, "bin")) {
		for (int i = 0; i < 256; i++)
			chunk[i] = (uint8_t)i;
		relay_cmd_output(t->cmd, RELAY_STDOUT, chunk, 256);
		tc_end(t, 0, 0, false);
	} else if (!strcmp(t->kind, "gen") || !strcmp(t->kind, "tailgen")) {
		for (int s = 0; s < 2; s++) {
			size_t n = t->left[s] < 4096 ? t->left[s] : 4096;
			for (size_t i = 0; i < n; i++)
				chunk[i] =
				    s ? (uint8_t)('A' + (t->done[s] + i) % 26) : pattern(t->seed, t->done[s] + i);
			if (n)
				relay_cmd_output(t->cmd, s ? RELAY_STDERR : RELAY_STDOUT, chunk, n);
			t->left[s] -= n;
			t->done[s] += n;
		}
		if (!t->left[0] && !t->left[1])
			tc_end(t, t->kind[0] == 't' ? 7 : 0, 0, false);
		else
			tc_arm(t);
	} else if (!strcmp(t->kind, "flood")) {
		memset(chunk, 'y', sizeof(chunk));
		relay_cmd_output(t->cmd, RELAY_STDOUT, chunk, sizeof(chunk));
		t->tb->flood_total += sizeof(chunk);
		tc_arm(t);
	} else if (!strcmp(t->kind, "timeout")) {
		tc_end(t, -1, 9, true);
	}
	/* cat, sleep: driven by stdin / signal / cancel */
}

static int tb_exec(void *ud, struct relay_cmd *cmd, const struct relay_exec_req *req)
{
	struct tb *tb = ud;
	struct tcmd *t;

	if (!strcmp(req->argv[0], "refuse"))
		return -ENOENT;
	tb->last_argv_bytes = 0;
	snprintf(tb->last_fork, sizeof(tb->last_fork), "%s", req->fork ? req->fork : "");
	for (size_t i = 0; i < req->argc; i++)
		tb->last_argv_bytes += strlen(req->argv[i]);
	t = calloc(1, sizeof(*t));
	if (!t)
		return -ENOMEM;
	t->tb = tb;
	t->cmd = cmd;
	relay_cmd_set_data(cmd, t);
	t->next = tb->cmds;
	tb->cmds = t;
	snprintf(t->kind, sizeof(t->kind), "%s", req->argv[0]);
	if (!strcmp(req->argv[0], "echo")) {
		strcpy(t->kind, "text");
		for (size_t i = 1; i < req->argc; i++) {
			strncat(t->text, req->argv[i], sizeof(t->text) - strlen(t->text) - 2);
			if (i + 1 < req->argc)
				strcat(t->text, " ");
		}
		strcat(t->text, "\n");
	} else if (!strcmp(req->argv[0], "sh")) {
		strcpy(t->kind, "text");
		assert_true(req->shell);
		assert_int_equal(req->argc, 3);
		snprintf(t->text, sizeof(t->text), "sh:%s\n", req->argv[2]);
	} else if (!strcmp(req->argv[0], "utf8")) {
		strcpy(t->kind, "text");
		strcpy(t->text, "h\xc3\xa9llo \xe2\x82\xac\n");
	} else if (!strcmp(req->argv[0], "env")) {
		int k = snprintf(t->text, sizeof(t->text), "cwd=%s\n", req->cwd);
		for (size_t i = 0; i < req->nenv; i++)
			k += snprintf(t->text + k, sizeof(t->text) - (size_t)k, "%s\n", req->env[i]);
		k += snprintf(t->text + k, sizeof(t->text) - (size_t)k, "timeout=%llu\n",
			      (unsigned long long)req->timeout_ms);
		if (req->tty)
			snprintf(t->text + k, sizeof(t->text) - (size_t)k, "tty=%ux%u\n", req->rows, req->cols);
		strcpy(t->kind, "text");
	} else if (!strcmp(req->argv[0], "gen")) {
		t->left[0] = req->argc > 1 ? strtoul(req->argv[1], NULL, 10) : 0;
		t->seed = req->argc > 2 ? (unsigned)strtoul(req->argv[2], NULL, 10) : 0;
	} else if (!strcmp(req->argv[0], "tailgen")) {
		t->left[0] = strtoul(req->argv[1], NULL, 10);
		t->left[1] = strtoul(req->argv[2], NULL, 10);
	}
	tc_arm(t);
	return 0;
}

static int tb_stdin(void *ud, struct relay_cmd *cmd, const void *data, size_t n, bool eof)
{
	struct tcmd *t = relay_cmd_data(cmd);

	(void)ud;
	if (n)
		relay_cmd_output(cmd, RELAY_STDOUT, data, n);
	if (eof)
		tc_end(t, 0, 0, false);
	return 0;
}

static int tb_signal(void *ud, struct relay_cmd *cmd, int signo)
{
	struct tb *tb = ud;

	tb->last_signal = signo;
	tc_end(relay_cmd_data(cmd), -1, signo, false);
	return 0;
}

static int tb_resize(void *ud, struct relay_cmd *cmd, uint16_t rows, uint16_t cols)
{
	struct tb *tb = ud;

	(void)cmd;
	tb->rows = rows;
	tb->cols = cols;
	return 0;
}

static int tb_cancel(void *ud, struct relay_cmd *cmd)
{
	struct tb *tb = ud;

	tb->cancels++;
	if (tb->cancel_busy) {
		tb->cancel_busy--;
		return -EAGAIN;
	}
	tc_end(relay_cmd_data(cmd), -1, 15, false);
	return 0;
}

static void tb_pause(void *ud, struct relay_cmd *cmd, bool paused)
{
	struct tb *tb = ud;
	struct tcmd *t = relay_cmd_data(cmd);

	if (paused)
		tb->pauses++;
	else
		tb->resumes++;
	t->paused = paused;
	if (!paused)
		tc_arm(t);
}

static uint64_t sync_token;

static void sync_fire(struct loop *l, void *ud)
{
	struct tb *tb = ud;

	(void)l;
	relay_sync_done(tb->r, sync_token);
}

static int tb_sync(void *ud, uint64_t token)
{
	struct tb *tb = ud;

	if (tb->sync_fail)
		return -EIO;
	sync_token = token;
	loop_add_timer(tb->l, 5, sync_fire, tb);
	return 0;
}

static void tb_release(void *ud, struct relay_cmd *cmd)
{
	struct tcmd *t = relay_cmd_data(cmd);

	(void)ud;
	t->ended = true;
	if (t->timer)
		loop_del_timer(t->tb->l, t->timer);
	t->timer = 0;
}

static const struct relay_backend_ops tb_ops = {
    .exec_start = tb_exec,
    .stdin_write = tb_stdin,
    .signal = tb_signal,
    .resize = tb_resize,
    .cancel = tb_cancel,
    .pause = tb_pause,
    .sync_wait = tb_sync,
    .release = tb_release,
};

/* ------------------------------------------------------------------ */
/* fixture */

struct fx {
	char dir[64];
	char path[128];
	struct loop *l;
	struct relay *r;
	struct tb tb;
};

static struct fx *F;

static int fx_setup_cfg(void **state, const struct relay_cfg *base)
{
	struct fx *f = calloc(1, sizeof(*f));
	struct relay_cfg cfg = {0};

	if (base)
		cfg = *base;
	strcpy(f->dir, "/tmp/relay-test-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->path, sizeof(f->path), "%s/r.sock", f->dir);
	cfg.path = f->path;
	assert_non_null(f->l = loop_new());
	f->tb.l = f->l;
	f->tb.next_pid = 1000;
	assert_int_equal(relay_new(f->l, &cfg, &tb_ops, &f->tb, &f->r), 0);
	f->tb.r = f->r;
	F = f;
	*state = f;
	return 0;
}

static int fx_setup(void **state)
{
	return fx_setup_cfg(state, NULL);
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;

	relay_free(f->r);
	while (f->tb.cmds) {
		struct tcmd *t = f->tb.cmds;
		f->tb.cmds = t->next;
		if (t->timer)
			loop_del_timer(f->l, t->timer);
		free(t);
	}
	loop_free(f->l);
	unlink(f->path);
	rmdir(f->dir);
	free(f);
	F = NULL;
	return 0;
}

static void stop_cb(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

/* Run the loop for about ms milliseconds (0: one pass). */
static void spin(unsigned ms)
{
	loop_add_timer(F->l, ms, stop_cb, NULL);
	loop_run(F->l);
}

/* ------------------------------------------------------------------ */
/* test client */

struct tc {
	int fd;
	char *buf;
	size_t len, cap;
	bool eof;
};

static struct tc *tc_raw(void)
{
	struct tc *c = calloc(1, sizeof(*c));
	struct sockaddr_un sa = {.sun_family = AF_UNIX};

	strcpy(sa.sun_path, F->path);
	c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(c->fd >= 0);
	assert_int_equal(connect(c->fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	c->cap = 1 << 16;
	c->buf = malloc(c->cap);
	return c;
}

static void tc_close(struct tc *c)
{
	close(c->fd);
	free(c->buf);
	free(c);
}

/* Read what is there without blocking; true if something came. */
static bool tc_fill(struct tc *c)
{
	if (c->cap - c->len < 65536) {
		c->cap *= 2;
		c->buf = realloc(c->buf, c->cap);
	}
	ssize_t n = recv(c->fd, c->buf + c->len, c->cap - c->len, MSG_DONTWAIT);
	if (n > 0) {
		c->len += (size_t)n;
		return true;
	}
	if (n == 0)
		c->eof = true;
	return false;
}

/* Next complete line as JSON, spinning the loop up to timeout_ms. */
static json_t *tc_next(struct tc *c, unsigned timeout_ms)
{
	uint64_t until = loop_now_ms() + timeout_ms;

	for (;;) {
		char *nl = c->len ? memchr(c->buf, '\n', c->len) : NULL;
		if (nl) {
			json_error_t err;
			size_t n = (size_t)(nl - c->buf);
			json_t *j = json_loadb(c->buf, n, 0, &err);
			if (!j)
				fail_msg("relay sent bad JSON: %.*s (%s)", (int)(n > 200 ? 200 : n), c->buf, err.text);
			memmove(c->buf, nl + 1, c->len - n - 1);
			c->len -= n + 1;
			return j;
		}
		if (c->eof || loop_now_ms() > until)
			return NULL;
		if (!tc_fill(c))
			spin(1);
	}
}

static void tc_send(struct tc *c, const char *line)
{
	size_t n = strlen(line), off = 0;
	uint64_t until = loop_now_ms() + 5000;

	while (off < n + 1) {
		const char *p = off < n ? line + off : "\n";
		size_t k = off < n ? n - off : 1;
		ssize_t w = send(c->fd, p, k, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (w > 0) {
			off += (size_t)w;
			continue;
		}
		assert_true(w < 0 && errno == EAGAIN);
		assert_true(loop_now_ms() < until);
		spin(1);
	}
}

static const char *ev_name(json_t *j)
{
	return json_string_value(json_object_get(j, "event"));
}

/* Next event, which must be `name`. */
static json_t *tc_expect(struct tc *c, const char *name)
{
	json_t *j = tc_next(c, 3000);

	if (!j)
		fail_msg("expected event '%s', got nothing", name);
	if (strcmp(ev_name(j), name)) {
		char *s = json_dumps(j, JSON_COMPACT);
		fail_msg("expected event '%s', got %.300s", name, s);
	}
	return j;
}

static struct tc *tc_connect(void)
{
	struct tc *c = tc_raw();
	json_t *h = tc_expect(c, "hello");

	assert_int_equal(json_integer_value(json_object_get(h, "protocol")), RELAY_PROTOCOL_VERSION);
	json_decref(h);
	return c;
}

/* Assert an error event with code whose message contains `needle`. */
static void tc_expect_error(struct tc *c, const char *code, const char *needle)
{
	json_t *j = tc_expect(c, "error");
	const char *got = json_string_value(json_object_get(j, "code"));
	const char *msg = json_string_value(json_object_get(j, "message"));

	if (strcmp(got, code) || (needle && !strstr(msg, needle)))
		fail_msg("expected error %s mentioning '%s', got %s: %s", code, needle ? needle : "", got, msg);
	json_decref(j);
}

/* The relay still answers this client. */
static void tc_alive(struct tc *c)
{
	tc_send(c, "{\"op\":\"status\",\"id\":\"ping\"}");
	json_t *j = tc_expect(c, "status");
	assert_string_equal(json_string_value(json_object_get(j, "id")), "ping");
	json_decref(j);
}

/* Decoded data of a stdout/stderr event, appended to *acc. */
static void data_append(json_t *ev, uint8_t **acc, size_t *n)
{
	json_t *d = json_object_get(ev, "data"), *b = json_object_get(ev, "data_b64");
	size_t k;

	if (d) {
		k = json_string_length(d);
		*acc = realloc(*acc, *n + k + 1);
		memcpy(*acc + *n, json_string_value(d), k);
	} else {
		assert_non_null(b);
		size_t bl = json_string_length(b);
		*acc = realloc(*acc, *n + bl + 1);
		assert_int_equal(sodium_base642bin(*acc + *n, bl + 1, json_string_value(b), bl, NULL, &k, NULL,
						   sodium_base64_VARIANT_ORIGINAL),
				 0);
	}
	*n += k;
}

struct run {
	uint8_t *out[2];
	size_t n[2];
	uint64_t first[2]; /* offset of the first byte received */
	bool have_first[2];
	size_t dropped[2];
	json_t *exit;
	bool saw_started;
};

static void run_clear(struct run *r)
{
	free(r->out[0]);
	free(r->out[1]);
	json_decref(r->exit);
	memset(r, 0, sizeof(*r));
}

/* Feed one event into the run for its id; true once it ended. Offsets must
 * be contiguous (gaps only after a `dropped`). */
static bool run_feed(struct run *r, json_t *ev)
{
	const char *name = ev_name(ev);

	if (!strcmp(name, "started")) {
		r->saw_started = true;
	} else if (!strcmp(name, "stdout") || !strcmp(name, "stderr")) {
		int s = name[3] == 'e';
		uint64_t off = (uint64_t)json_integer_value(json_object_get(ev, "offset"));
		if (!r->have_first[s]) {
			r->have_first[s] = true;
			r->first[s] = off;
		}
		assert_int_equal(off, r->first[s] + r->n[s] + r->dropped[s]);
		data_append(ev, &r->out[s], &r->n[s]);
	} else if (!strcmp(name, "dropped")) {
		int s = !strcmp(json_string_value(json_object_get(ev, "stream")), "stderr");
		size_t b = (size_t)json_integer_value(json_object_get(ev, "bytes"));
		if (!r->have_first[s]) {
			r->have_first[s] = true;
			r->first[s] = (uint64_t)json_integer_value(json_object_get(ev, "offset"));
		}
		r->dropped[s] += b;
	} else if (!strcmp(name, "exit") || !strcmp(name, "result") || !strcmp(name, "error")) {
		r->exit = json_incref(ev);
		return true;
	}
	return false;
}

static void tc_run(struct tc *c, struct run *r)
{
	for (;;) {
		json_t *ev = tc_next(c, 5000);
		if (!ev)
			fail_msg("no exit event");
		bool end = run_feed(r, ev);
		json_decref(ev);
		if (end)
			return;
	}
}

/* ------------------------------------------------------------------ */
/* tests */

static void test_exec_basic(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	struct run r = {0};
	json_t *j;

	tc_send(c, "{\"op\":\"exec\",\"id\":\"e1\",\"argv\":[\"echo\",\"hello\",\"world\"]}");
	j = tc_expect(c, "started");
	assert_string_equal(json_string_value(json_object_get(j, "id")), "e1");
	assert_true(json_integer_value(json_object_get(j, "pid")) >= 1000);
	json_decref(j);
	j = tc_expect(c, "stdout");
	assert_string_equal(json_string_value(json_object_get(j, "data")), "hello world\n");
	assert_int_equal(json_integer_value(json_object_get(j, "offset")), 0);
	json_decref(j);
	j = tc_expect(c, "exit");
	assert_int_equal(json_integer_value(json_object_get(j, "code")), 0);
	assert_true(json_is_null(json_object_get(j, "signal")));
	assert_true(json_is_false(json_object_get(j, "timed_out")));
	assert_true(json_is_false(json_object_get(j, "truncated")));
	assert_int_equal(json_integer_value(json_object_get(j, "stdout_bytes")), 12);
	assert_int_equal(json_integer_value(json_object_get(j, "stderr_bytes")), 0);
	assert_non_null(json_object_get(j, "duration_ms"));
	json_decref(j);

	/* integer ids are echoed as integers; shell strings become sh -c */
	tc_send(c, "{\"op\":\"exec\",\"id\":42,\"shell\":\"ls | wc -l\"}");
	tc_run(c, &r);
	assert_int_equal(json_integer_value(json_object_get(r.exit, "id")), 42);
	assert_int_equal(r.n[0], strlen("sh:ls | wc -l\n"));
	assert_memory_equal(r.out[0], "sh:ls | wc -l\n", r.n[0]);
	run_clear(&r);

	/* cwd, env, timeout and tty reach the backend as given */
	tc_send(c, "{\"op\":\"exec\",\"id\":\"e3\",\"argv\":[\"env\"],\"cwd\":\"src/lib\",\"env\":{\"A_1\":\"x y\"},"
		   "\"timeout_seconds\":1.5,\"tty\":{\"rows\":40,\"cols\":100}}");
	tc_run(c, &r);
	const char *want = "cwd=src/lib\nA_1=x y\ntimeout=1500\ntty=40x100\n";
	assert_int_equal(r.n[0], strlen(want));
	assert_memory_equal(r.out[0], want, r.n[0]);
	run_clear(&r);
	tc_send(c, "{\"op\":\"exec\",\"id\":\"e4\",\"argv\":[\"env\"]}");
	tc_run(c, &r);
	want = "cwd=\ntimeout=300000\n";
	assert_int_equal(r.n[0], strlen(want));
	assert_memory_equal(r.out[0], want, r.n[0]);
	run_clear(&r);

	/* timed out, failed to spawn, refused by the backend */
	tc_send(c, "{\"op\":\"exec\",\"id\":\"t\",\"argv\":[\"timeout\"]}");
	tc_run(c, &r);
	assert_true(json_is_true(json_object_get(r.exit, "timed_out")));
	assert_int_equal(json_integer_value(json_object_get(r.exit, "signal")), 9);
	assert_true(json_is_null(json_object_get(r.exit, "code")));
	run_clear(&r);
	tc_send(c, "{\"op\":\"exec\",\"id\":\"f\",\"argv\":[\"fail\"]}");
	tc_run(c, &r);
	assert_string_equal(ev_name(r.exit), "error");
	assert_string_equal(json_string_value(json_object_get(r.exit, "code")), "spawn_failed");
	assert_string_equal(json_string_value(json_object_get(r.exit, "id")), "f");
	run_clear(&r);
	tc_send(c, "{\"op\":\"exec\",\"id\":\"g\",\"argv\":[\"refuse\"]}");
	tc_expect_error(c, "backend_error", "exec");
	tc_alive(c);
	tc_close(c);
}

struct bad {
	const char *line;
	const char *code;
	const char *needle; /* the message names this */
};

static const struct bad bad_requests[] = {
    {"{\"op\":\"exec\",", "bad_json", "JSON"},
    {"[1,2]", "bad_json", "object"},
    {"\"just a string\"", "bad_json", "object"},
    {"{\"id\":1}", "missing_field", "'op'"},
    {"{\"op\":7,\"id\":1}", "bad_field", "'op'"},
    {"{\"op\":\"frobnicate\",\"id\":1}", "unknown_op", "frobnicate"},
    {"{\"op\":\"exec\",\"argv\":[\"echo\"]}", "missing_field", "'id'"},
    {"{\"op\":\"exec\",\"id\":[1],\"argv\":[\"echo\"]}", "bad_field", "'id'"},
    {"{\"op\":\"exec\",\"id\":1.5,\"argv\":[\"echo\"]}", "bad_field", "'id'"},
    {"{\"op\":\"exec\",\"id\":\"\",\"argv\":[\"echo\"]}", "bad_field", "'id'"},
    {"{\"op\":\"exec\",\"id\":1}", "missing_field", "'argv'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[]}", "bad_field", "'argv'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":\"echo\"}", "bad_field", "'argv'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\",3]}", "bad_field", "'argv[1]'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"ec\\u0000ho\"]}", "bad_field", "'argv[0]'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"shell\":\"x\"}", "bad_field", "'shell'"},
    {"{\"op\":\"exec\",\"id\":1,\"shell\":\"\"}", "bad_field", "'shell'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"cwd\":\"/etc\"}", "bad_field", "'cwd'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"cwd\":\"a/../../b\"}", "bad_field", "'cwd'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"cwd\":\"..\"}", "bad_field", "'cwd'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"env\":[\"A=1\"]}", "bad_field", "'env'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"env\":{\"1A\":\"x\"}}", "bad_field", "'1A'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"env\":{\"A=B\":\"x\"}}", "bad_field", "'A=B'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"env\":{\"A\":1}}", "bad_field", "'env.A'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"timeout_seconds\":0}", "bad_field", "'timeout_seconds'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"timeout_seconds\":\"5\"}", "bad_field", "'timeout_seconds'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"tty\":{\"rows\":0,\"cols\":80}}", "bad_field", "'tty.rows'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"tty\":{\"rows\":24}}", "missing_field", "'tty.cols'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"tty\":\"yes\"}", "bad_field", "'tty'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"stdin\":1}", "bad_field", "'stdin'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"tail\":{\"stdout_bytes\":-1}}", "bad_field",
     "'tail.stdout_bytes'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"tail\":{\"lines\":5}}", "bad_field", "'tail.lines'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"timeout\":5}", "bad_field", "'timeout'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"encoding\":\"hex\"}", "bad_field", "'encoding'"},
    {"{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"],\"encoding\":1}", "bad_field", "'encoding'"},
    {"{\"op\":\"stdin\",\"id\":1}", "missing_field", "'data'"},
    {"{\"op\":\"stdin\",\"id\":1,\"data_b64\":\"!!!\"}", "bad_field", "'data_b64'"},
    {"{\"op\":\"stdin\",\"id\":1,\"data\":\"x\",\"data_b64\":\"eA==\"}", "bad_field", "'data_b64'"},
    {"{\"op\":\"stdin\",\"id\":1,\"data\":\"x\",\"eof\":\"yes\"}", "bad_field", "'eof'"},
    {"{\"op\":\"signal\",\"id\":1}", "missing_field", "'signal'"},
    {"{\"op\":\"signal\",\"id\":1,\"signal\":\"BOGUS\"}", "bad_field", "'signal'"},
    {"{\"op\":\"signal\",\"id\":1,\"signal\":0}", "bad_field", "'signal'"},
    {"{\"op\":\"resize\",\"id\":1,\"rows\":10}", "missing_field", "'cols'"},
    {"{\"op\":\"resize\",\"id\":1,\"rows\":10,\"cols\":70000}", "bad_field", "'cols'"},
    {"{\"op\":\"attach\",\"id\":\"nope\"}", "unknown_id", "status"},
    {"{\"op\":\"cancel\",\"id\":\"nope\"}", "unknown_id", NULL},
    {"{\"op\":\"stdin\",\"id\":\"nope\",\"data\":\"x\"}", "unknown_id", NULL},
    {"{\"op\":\"signal\",\"id\":\"nope\",\"signal\":\"INT\"}", "unknown_id", NULL},
    {"{\"op\":\"resize\",\"id\":\"nope\",\"rows\":1,\"cols\":1}", "unknown_id", NULL},
    {"{\"op\":\"cancel\"}", "missing_field", "'id'"},
    {"{\"op\":\"status\",\"verbose\":true}", "bad_field", "'verbose'"},
    {"{\"op\":\"exec\",\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\"]}", "bad_json", "duplicate"},
};

static void test_bad_requests(void **state)
{
	(void)state;
	struct tc *a = tc_connect(), *b = tc_connect();

	for (size_t i = 0; i < sizeof(bad_requests) / sizeof(bad_requests[0]); i++) {
		const struct bad *t = &bad_requests[i];
		tc_send(a, t->line);
		json_t *j = tc_next(a, 3000);
		if (!j)
			fail_msg("no answer to %s", t->line);
		const char *code = json_string_value(json_object_get(j, "code"));
		const char *msg = json_string_value(json_object_get(j, "message"));
		if (strcmp(ev_name(j), "error") || strcmp(code, t->code) || (t->needle && !strstr(msg, t->needle)))
			fail_msg("%s: expected %s naming %s, got %s %s: %s", t->line, t->code, t->needle, ev_name(j),
				 code, msg);
		json_decref(j);
		tc_alive(a); /* the connection carries on */
	}
	/* blank lines are ignored, CRLF is fine */
	tc_send(a, "");
	tc_send(a, "   ");
	tc_send(a, "{\"op\":\"status\",\"id\":\"crlf\"}\r");
	json_t *j = tc_expect(a, "status");
	assert_string_equal(json_string_value(json_object_get(j, "id")), "crlf");
	json_decref(j);
	tc_alive(b); /* and the other client never noticed */
	tc_close(a);
	tc_close(b);
}

static void test_line_too_long(void **state)
{
	(void)state;
	struct tc *a = tc_connect(), *b = tc_connect();
	size_t n = RELAY_LINE_MAX + RELAY_LINE_MAX / 2;
	char *big = malloc(n + 1);

	/* a line over the cap, sent in pieces: one error, the rest discarded */
	memset(big, 'x', n);
	big[n] = '\0';
	big[0] = '{';
	tc_send(a, big);
	tc_expect_error(a, "line_too_long", "1048576");
	tc_alive(a);
	tc_alive(b);
	/* a line exactly at the cap is parsed (and is bad JSON, not too long) */
	big[RELAY_LINE_MAX] = '\0';
	tc_send(a, big);
	tc_expect_error(a, "bad_json", NULL);
	/* a long valid request: 900 KiB of argv */
	memset(big, 'a', n);
	int k = snprintf(big, 64, "{\"op\":\"exec\",\"id\":\"long\",\"argv\":[\"gen\",\"5\",\"0\",\"");
	big[k] = 'a';
	strcpy(big + 900 * 1024, "\"]}");
	tc_send(a, big);
	struct run r = {0};
	tc_run(a, &r);
	assert_int_equal(r.n[0], 5);
	assert_int_equal(F->tb.last_argv_bytes, 3 + 1 + 1 + 900 * 1024 - (size_t)k);
	run_clear(&r);
	free(big);
	tc_alive(a);
	tc_close(a);
	tc_close(b);
}

static void test_ids(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;

	tc_send(c, "{\"op\":\"exec\",\"id\":\"s\",\"argv\":[\"sleep\"]}");
	json_decref(tc_expect(c, "started"));
	tc_send(c, "{\"op\":\"exec\",\"id\":\"s\",\"argv\":[\"echo\"]}");
	tc_expect_error(c, "duplicate_id", "running");
	/* "1" and 1 are different ids */
	tc_send(c, "{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\",\"one\"]}");
	struct run r = {0};
	tc_run(c, &r);
	run_clear(&r);
	tc_send(c, "{\"op\":\"cancel\",\"id\":\"1\"}");
	tc_expect_error(c, "unknown_id", NULL);
	/* ended commands: not_running for control ops; the id can be reused */
	tc_send(c, "{\"op\":\"signal\",\"id\":1,\"signal\":\"INT\"}");
	tc_expect_error(c, "not_running", "exited");
	tc_send(c, "{\"op\":\"exec\",\"id\":1,\"argv\":[\"echo\",\"again\"]}");
	tc_run(c, &r);
	assert_memory_equal(r.out[0], "again\n", 6);
	run_clear(&r);
	tc_send(c, "{\"op\":\"cancel\",\"id\":\"s\"}");
	j = tc_expect(c, "ok");
	assert_string_equal(json_string_value(json_object_get(j, "op")), "cancel");
	json_decref(j);
	tc_run(c, &r);
	assert_int_equal(json_integer_value(json_object_get(r.exit, "signal")), 15);
	run_clear(&r);
	tc_close(c);
}

static void test_stdin(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	struct run r = {0};

	tc_send(c, "{\"op\":\"exec\",\"id\":\"cat\",\"argv\":[\"cat\"],\"stdin\":true}");
	json_decref(tc_expect(c, "started"));
	tc_send(c, "{\"op\":\"stdin\",\"id\":\"cat\",\"data\":\"line\\u0000one\\n\"}");
	tc_send(c, "{\"op\":\"stdin\",\"id\":\"cat\",\"data_b64\":\"AAEC/w==\"}");
	tc_send(c, "{\"op\":\"stdin\",\"id\":\"cat\",\"data\":\"last\",\"eof\":true}");
	tc_run(c, &r);
	const uint8_t want[] = "line\x00one\n\x00\x01\x02\xfflast";
	assert_int_equal(r.n[0], sizeof(want) - 1);
	assert_memory_equal(r.out[0], want, sizeof(want) - 1);
	run_clear(&r);

	tc_send(c, "{\"op\":\"exec\",\"id\":\"nostdin\",\"argv\":[\"sleep\"]}");
	json_decref(tc_expect(c, "started"));
	tc_send(c, "{\"op\":\"stdin\",\"id\":\"nostdin\",\"data\":\"x\"}");
	tc_expect_error(c, "stdin_closed", "stdin");
	tc_send(c, "{\"op\":\"cancel\",\"id\":\"nostdin\"}");
	json_decref(tc_expect(c, "ok"));
	tc_run(c, &r);
	run_clear(&r);
	tc_close(c);
}

static void test_signal_resize(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	struct run r = {0};
	json_t *j;

	tc_send(c, "{\"op\":\"exec\",\"id\":\"t\",\"argv\":[\"sleep\"],\"tty\":true}");
	json_decref(tc_expect(c, "started"));
	tc_send(c, "{\"op\":\"resize\",\"id\":\"t\",\"rows\":50,\"cols\":132}");
	j = tc_expect(c, "ok");
	assert_string_equal(json_string_value(json_object_get(j, "op")), "resize");
	json_decref(j);
	assert_int_equal(F->tb.rows, 50);
	assert_int_equal(F->tb.cols, 132);
	tc_send(c, "{\"op\":\"signal\",\"id\":\"t\",\"signal\":\"SIGINT\"}");
	json_decref(tc_expect(c, "ok"));
	assert_int_equal(F->tb.last_signal, 2);
	tc_run(c, &r);
	assert_int_equal(json_integer_value(json_object_get(r.exit, "signal")), 2);
	run_clear(&r);

	tc_send(c, "{\"op\":\"exec\",\"id\":\"n\",\"argv\":[\"sleep\"]}");
	json_decref(tc_expect(c, "started"));
	tc_send(c, "{\"op\":\"resize\",\"id\":\"n\",\"rows\":5,\"cols\":5}");
	tc_expect_error(c, "no_tty", "tty");
	tc_send(c, "{\"op\":\"signal\",\"id\":\"n\",\"signal\":9}");
	json_decref(tc_expect(c, "ok"));
	tc_run(c, &r);
	assert_int_equal(json_integer_value(json_object_get(r.exit, "signal")), 9);
	run_clear(&r);
	tc_close(c);
}

/* State of command id as `status` gives it, from connection c. */
static char *cmd_state(struct tc *c, const char *id)
{
	json_t *j, *m;
	size_t i;
	char *st = NULL;

	tc_send(c, "{\"op\":\"status\"}");
	j = tc_expect(c, "status");
	json_array_foreach(json_object_get(j, "commands"), i, m)
	{
		if (!strcmp(json_string_value(json_object_get(m, "id")), id))
			st = strdup(json_string_value(json_object_get(m, "state")));
	}
	json_decref(j);
	assert_non_null(st);
	return st;
}

/* "cancel_on_close": the command ends when the connection that started it
 * closes (an `airlock exec` killed with SIGKILL), also when another one is
 * attached; without it, the command outlives its connection; a cancel the
 * backend cannot take yet is sent again; one that ended first is left
 * alone. */
static void test_cancel_on_close(void **state)
{
	(void)state;
	struct tc *a = tc_connect(), *b = tc_connect(), *w = tc_connect();
	struct run r = {0};
	char *st;

	tc_send(a, "{\"op\":\"exec\",\"id\":\"k\",\"argv\":[\"sleep\"],\"cancel_on_close\":true}");
	json_decref(tc_expect(a, "started"));
	tc_send(w, "{\"op\":\"attach\",\"id\":\"k\"}");
	json_decref(tc_expect(w, "attached"));
	tc_send(b, "{\"op\":\"exec\",\"id\":\"n\",\"argv\":[\"sleep\"],\"cancel_on_close\":false}");
	json_decref(tc_expect(b, "started"));
	tc_send(b, "{\"op\":\"exec\",\"id\":\"e\",\"argv\":[\"echo\",\"hi\"],\"cancel_on_close\":true}");
	tc_run(b, &r); /* n's events are not b's run: it reads e's to its exit */
	run_clear(&r);
	F->tb.cancel_busy = 2;
	tc_close(a);
	tc_close(b);
	tc_run(w, &r); /* k's exit, by the cancel's TERM, after two busy answers */
	assert_int_equal(json_integer_value(json_object_get(r.exit, "signal")), 15);
	run_clear(&r);
	assert_int_equal(F->tb.cancels, 3); /* k's three tries; none for e (ended) nor n */
	st = cmd_state(w, "n");
	assert_string_equal(st, "running");
	free(st);
	st = cmd_state(w, "e");
	assert_string_equal(st, "exited");
	free(st);
	tc_send(w, "{\"op\":\"cancel\",\"id\":\"n\"}");
	json_decref(tc_expect(w, "ok"));
	tc_send(w, "{\"op\":\"exec\",\"id\":\"t\",\"argv\":[\"sleep\"],\"cancel_on_close\":1}");
	tc_expect_error(w, "bad_field", "'cancel_on_close'");
	tc_close(w);
}

static void test_binary_utf8(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;

	tc_send(c, "{\"op\":\"exec\",\"id\":\"b\",\"argv\":[\"bin\"]}");
	json_decref(tc_expect(c, "started"));
	j = tc_expect(c, "stdout");
	assert_null(json_object_get(j, "data"));
	struct run r = {0};
	run_feed(&r, j);
	json_decref(j);
	assert_int_equal(r.n[0], 256);
	for (int i = 0; i < 256; i++)
		assert_int_equal(r.out[0][i], i);
	run_clear(&r);
	json_decref(tc_expect(c, "exit"));

	tc_send(c, "{\"op\":\"exec\",\"id\":\"u\",\"argv\":[\"utf8\"]}");
	json_decref(tc_expect(c, "started"));
	j = tc_expect(c, "stdout");
	assert_string_equal(json_string_value(json_object_get(j, "data")), "h\xc3\xa9llo \xe2\x82\xac\n");
	json_decref(j);
	json_decref(tc_expect(c, "exit"));
	tc_close(c);
}

/* "encoding":"base64": every output event carries data_b64 (even valid
 * UTF-8), in the fixed shape airlock exec decodes without a JSON parser,
 * for string and number ids; attach can ask for it too. */
static void test_encoding_base64(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;
	uint8_t bin[64];
	size_t n;

	tc_send(c, "{\"op\":\"exec\",\"id\":\"u\",\"argv\":[\"utf8\"],\"encoding\":\"base64\"}");
	json_decref(tc_expect(c, "started"));
	j = tc_expect(c, "stdout");
	assert_int_equal(json_object_size(j), 4);
	assert_null(json_object_get(j, "data"));
	assert_int_equal(json_integer_value(json_object_get(j, "offset")), 0);
	const char *b = json_string_value(json_object_get(j, "data_b64"));
	assert_non_null(b);
	assert_int_equal(
	    sodium_base642bin(bin, sizeof(bin), b, strlen(b), NULL, &n, NULL, sodium_base64_VARIANT_ORIGINAL), 0);
	assert_int_equal(n, strlen("h\xc3\xa9llo \xe2\x82\xac\n"));
	assert_memory_equal(bin, "h\xc3\xa9llo \xe2\x82\xac\n", n);
	json_decref(j);
	json_decref(tc_expect(c, "exit"));

	tc_send(c, "{\"op\":\"exec\",\"id\":7,\"argv\":[\"bin\"],\"encoding\":\"base64\"}");
	json_decref(tc_expect(c, "started"));
	j = tc_expect(c, "stdout");
	assert_int_equal(json_integer_value(json_object_get(j, "id")), 7);
	struct run r = {0};
	run_feed(&r, j);
	json_decref(j);
	assert_int_equal(r.n[0], 256);
	for (int i = 0; i < 256; i++)
		assert_int_equal(r.out[0][i], i);
	run_clear(&r);
	json_decref(tc_expect(c, "exit"));

	/* attach replays in the encoding it asks for */
	tc_send(c, "{\"op\":\"attach\",\"id\":\"u\",\"encoding\":\"text\"}");
	json_decref(tc_expect(c, "attached"));
	j = tc_expect(c, "stdout");
	assert_string_equal(json_string_value(json_object_get(j, "data")), "h\xc3\xa9llo \xe2\x82\xac\n");
	json_decref(j);
	json_decref(tc_expect(c, "exit"));
	tc_close(c);
}

static void test_tail(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;

	tc_send(c, "{\"op\":\"exec\",\"id\":\"t\",\"argv\":[\"tailgen\",\"20000\",\"100\"],"
		   "\"tail\":{\"stdout_bytes\":8000,\"stderr_bytes\":4000}}");
	json_decref(tc_expect(c, "started"));
	j = tc_expect(c, "result"); /* no stdout/stderr events in between */
	assert_int_equal(json_integer_value(json_object_get(j, "code")), 7);
	assert_int_equal(json_integer_value(json_object_get(j, "stdout_bytes")), 20000);
	assert_int_equal(json_integer_value(json_object_get(j, "stderr_bytes")), 100);
	assert_true(json_is_true(json_object_get(j, "stdout_truncated")));
	assert_true(json_is_false(json_object_get(j, "stderr_truncated")));
	const char *o = json_string_value(json_object_get(j, "stdout"));
	const char *e = json_string_value(json_object_get(j, "stderr"));
	assert_int_equal(strlen(o), 8000);
	assert_int_equal(strlen(e), 100);
	for (size_t i = 0; i < 8000; i++)
		assert_int_equal((uint8_t)o[i], pattern(0, 12000 + i));
	for (size_t i = 0; i < 100; i++)
		assert_int_equal(e[i], 'A' + i % 26);
	json_decref(j);

	/* tail: true uses the defaults of doc/RELAY.md, 8000 / 4000 */
	tc_send(c, "{\"op\":\"exec\",\"id\":\"t2\",\"argv\":[\"tailgen\",\"5\",\"5000\"],\"tail\":true}");
	json_decref(tc_expect(c, "started"));
	j = tc_expect(c, "result");
	assert_true(json_is_false(json_object_get(j, "stdout_truncated")));
	assert_true(json_is_true(json_object_get(j, "stderr_truncated")));
	assert_int_equal(json_string_length(json_object_get(j, "stderr")), 4000);
	json_decref(j);
	tc_send(c, "{\"op\":\"exec\",\"id\":\"t3\",\"argv\":[\"echo\"],\"tail\":{\"stdout_bytes\":2000000}}");
	tc_expect_error(c, "bad_field", "'tail.stdout_bytes'");
	tc_close(c);
}

/* Wait until the command with this id has ended, asking from client c. */
static void wait_ended(struct tc *c, const char *id)
{
	for (int k = 0; k < 2000; k++) {
		tc_send(c, "{\"op\":\"status\"}");
		json_t *j = tc_expect(c, "status"), *m;
		size_t i;
		bool done = false;
		json_array_foreach(json_object_get(j, "commands"), i, m)
		{
			if (!strcmp(json_string_value(json_object_get(m, "id")), id))
				done = strcmp(json_string_value(json_object_get(m, "state")), "running") &&
				       strcmp(json_string_value(json_object_get(m, "state")), "starting");
		}
		json_decref(j);
		if (done)
			return;
		spin(2);
	}
	fail_msg("command %s never ended", id);
}

static void check_pattern(const uint8_t *p, size_t n, uint64_t from, unsigned seed)
{
	for (size_t i = 0; i < n; i++)
		if (p[i] != pattern(seed, from + i))
			fail_msg("byte %llu differs", (unsigned long long)(from + i));
}

static void test_attach_replay(void **state)
{
	(void)state;
	struct tc *a = tc_connect(), *b = tc_connect();
	struct run r = {0};
	size_t got = 0;
	const size_t total = 300000;

	tc_send(a, "{\"op\":\"exec\",\"id\":\"g\",\"argv\":[\"gen\",\"300000\",\"3\"]}");
	/* read a little, then vanish */
	while (got < 20000) {
		json_t *j = tc_next(a, 3000);
		assert_non_null(j);
		run_feed(&r, j);
		json_decref(j);
		got = r.n[0];
	}
	tc_close(a);
	wait_ended(b, "g");

	/* attach from where a stopped: exactly the missed bytes, then exit */
	char line[160];
	snprintf(line, sizeof(line), "{\"op\":\"attach\",\"id\":\"g\",\"from\":%zu}", got);
	tc_send(b, line);
	json_t *j = tc_expect(b, "attached");
	assert_string_equal(json_string_value(json_object_get(j, "state")), "exited");
	assert_int_equal(json_integer_value(json_object_get(j, "stdout_offset")), got);
	json_decref(j);
	struct run r2 = {0};
	tc_run(b, &r2);
	assert_string_equal(ev_name(r2.exit), "exit");
	assert_int_equal(r2.first[0], got);
	assert_int_equal(r2.n[0], total - got);
	check_pattern(r2.out[0], r2.n[0], got, 3);
	assert_true(json_is_false(json_object_get(r2.exit, "truncated")));
	assert_int_equal(json_integer_value(json_object_get(r2.exit, "stdout_bytes")), total);
	/* and what a saw plus what b got is the whole output */
	check_pattern(r.out[0], r.n[0], 0, 3);
	run_clear(&r);
	run_clear(&r2);

	/* attach without from replays everything still buffered */
	tc_send(b, "{\"op\":\"attach\",\"id\":\"g\",\"from\":{\"stdout\":0}}");
	json_decref(tc_expect(b, "attached"));
	tc_run(b, &r2);
	assert_int_equal(r2.n[0], total);
	check_pattern(r2.out[0], r2.n[0], 0, 3);
	run_clear(&r2);
	tc_send(b, "{\"op\":\"attach\",\"id\":\"g\",\"from\":400000}");
	tc_expect_error(b, "bad_field", "'from'");
	tc_close(b);
}

static void test_ring_overflow(void **state)
{
	(void)state;
	struct tc *a = tc_connect(), *b = tc_connect();
	const size_t total = 3u << 20;
	char line[160];
	struct run r = {0};

	snprintf(line, sizeof(line), "{\"op\":\"exec\",\"id\":\"big\",\"argv\":[\"gen\",\"%zu\",\"5\"]}", total);
	tc_send(a, line);
	json_decref(tc_expect(a, "started"));
	tc_close(a); /* nobody reads: the command runs free, the ring keeps the last MiB */
	wait_ended(b, "big");
	tc_send(b, "{\"op\":\"attach\",\"id\":\"big\"}");
	json_t *j = tc_expect(b, "attached");
	assert_int_equal(json_integer_value(json_object_get(j, "stdout_offset")), total - RELAY_RING_BYTES);
	json_decref(j);
	tc_run(b, &r);
	assert_int_equal(r.n[0], RELAY_RING_BYTES);
	check_pattern(r.out[0], r.n[0], total - RELAY_RING_BYTES, 5);
	run_clear(&r);

	/* asking for offset 0 reports what is gone */
	tc_send(b, "{\"op\":\"attach\",\"id\":\"big\",\"from\":0}");
	json_decref(tc_expect(b, "attached"));
	j = tc_expect(b, "dropped");
	assert_string_equal(json_string_value(json_object_get(j, "stream")), "stdout");
	assert_int_equal(json_integer_value(json_object_get(j, "offset")), 0);
	assert_int_equal(json_integer_value(json_object_get(j, "bytes")), total - RELAY_RING_BYTES);
	run_feed(&r, j);
	json_decref(j);
	tc_run(b, &r);
	assert_int_equal(r.dropped[0], total - RELAY_RING_BYTES);
	assert_int_equal(r.n[0], RELAY_RING_BYTES);
	check_pattern(r.out[0], r.n[0], total - RELAY_RING_BYTES, 5);
	assert_true(json_is_true(json_object_get(r.exit, "truncated")));
	run_clear(&r);
	tc_close(b);
}

static void test_status_history(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	struct run r = {0};
	char line[128];
	json_t *j, *m;
	size_t i;

	tc_send(c, "{\"op\":\"exec\",\"id\":\"live\",\"argv\":[\"sleep\",\"forever\"]}");
	json_decref(tc_expect(c, "started"));
	for (int k = 0; k < 6; k++) {
		snprintf(line, sizeof(line), "{\"op\":\"exec\",\"id\":\"h%d\",\"argv\":[\"echo\",\"%d\"]}", k, k);
		tc_send(c, line);
		tc_run(c, &r);
		run_clear(&r);
	}
	spin(5);
	tc_send(c, "{\"op\":\"status\",\"id\":\"st\"}");
	j = tc_expect(c, "status");
	json_t *list = json_object_get(j, "commands");
	assert_int_equal(json_array_size(list), 1 + 4); /* keep_finished = 4 in this fixture */
	m = json_array_get(list, 0);
	assert_string_equal(json_string_value(json_object_get(m, "id")), "live");
	assert_string_equal(json_string_value(json_object_get(m, "state")), "running");
	assert_string_equal(json_string_value(json_array_get(json_object_get(m, "argv"), 1)), "forever");
	assert_true(json_integer_value(json_object_get(m, "pid")) >= 1000);
	assert_true(json_integer_value(json_object_get(m, "started_ms")) > 1600000000000LL);
	json_array_foreach(list, i, m)
	{
		if (i == 0)
			continue;
		snprintf(line, sizeof(line), "h%zu", i + 1); /* h0 and h1 were dropped */
		assert_string_equal(json_string_value(json_object_get(m, "id")), line);
		assert_string_equal(json_string_value(json_object_get(m, "state")), "exited");
		assert_int_equal(json_integer_value(json_object_get(m, "code")), 0);
		assert_int_equal(json_integer_value(json_object_get(m, "stdout_bytes")), 2);
	}
	json_decref(j);
	struct relay_stats st;
	relay_get_stats(F->r, &st);
	assert_int_equal(st.running, 1);
	assert_int_equal(st.finished, 4);
	assert_int_equal(st.clients, 1);
	tc_close(c);
}

static int fx_setup_small_history(void **state)
{
	struct relay_cfg cfg = {.keep_finished = 4, .max_clients = 3};

	return fx_setup_cfg(state, &cfg);
}

static void test_sync_wait(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;

	tc_send(c, "{\"op\":\"sync_wait\",\"id\":\"s1\"}");
	j = tc_expect(c, "synced");
	assert_string_equal(json_string_value(json_object_get(j, "id")), "s1");
	json_decref(j);
	F->tb.sync_fail = true;
	tc_send(c, "{\"op\":\"sync_wait\",\"id\":\"s2\"}");
	tc_expect_error(c, "backend_error", "sync_wait");
	F->tb.sync_fail = false;
	/* a client that leaves before the answer does not break anything */
	struct tc *d = tc_connect();
	tc_send(d, "{\"op\":\"sync_wait\",\"id\":\"gone\"}");
	spin(1);
	tc_close(d);
	spin(20);
	tc_alive(c);
	tc_close(c);
}

/* A changes backend that answers at once, echoing what it was asked. */
static struct relay *chg_relay;
static int chg_request(void *ud, uint64_t token, const struct relay_changes_req *q)
{
	char body[256];
	(void)ud;
	snprintf(body, sizeof(body), "{\"op\":\"%s\",\"n\":%zu,\"first\":\"%s\",\"all\":%s,\"diff\":%s}", q->op,
		 q->npaths, q->npaths ? q->paths[0] : "", q->all ? "true" : "false", q->diff ? "true" : "false");
	relay_changes_done(chg_relay, token, !strcmp(q->op, "changes") ? "changes" : "accepted", body, NULL, NULL);
	return 0;
}
static const struct relay_changes_ops chg_ops = {.request = chg_request};

static void test_changes_ops(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;

	tc_send(c, "{\"op\":\"changes\",\"id\":1}");
	tc_expect_error(c, "unavailable", "guest changes");
	chg_relay = F->r;
	relay_set_changes(F->r, &chg_ops, NULL);
	tc_send(c, "{\"op\":\"changes\",\"id\":\"c1\",\"paths\":[\"src/a.c\"],\"diff\":true}");
	j = tc_expect(c, "changes");
	assert_string_equal(json_string_value(json_object_get(j, "id")), "c1");
	assert_string_equal(json_string_value(json_object_get(j, "first")), "src/a.c");
	assert_true(json_is_true(json_object_get(j, "diff")));
	json_decref(j);
	tc_send(c, "{\"op\":\"accept\",\"all\":true}");
	j = tc_expect(c, "accepted");
	assert_true(json_is_true(json_object_get(j, "all")));
	json_decref(j);
	tc_send(c, "{\"op\":\"accept\",\"id\":2}");
	tc_expect_error(c, "missing_field", "'paths'");
	tc_send(c, "{\"op\":\"reject\",\"id\":3,\"all\":true,\"paths\":[\"a\"]}");
	tc_expect_error(c, "bad_field", "not both");
	tc_send(c, "{\"op\":\"accept\",\"id\":4,\"paths\":[\"../etc/passwd\"]}");
	tc_expect_error(c, "bad_field", "paths[0]");
	tc_send(c, "{\"op\":\"changes\",\"id\":5,\"paths\":\"src\"}");
	tc_expect_error(c, "bad_field", "'paths'");
	tc_send(c, "{\"op\":\"changes\",\"id\":6,\"frob\":1}");
	tc_expect_error(c, "bad_field", "frob");
	relay_set_changes(F->r, NULL, NULL);
	tc_alive(c);
	tc_close(c);
}

/* A fork backend that answers at once, echoing what it was asked. */
static int fork_request(void *ud, uint64_t token, const struct relay_fork_req *q)
{
	char body[256];
	(void)ud;
	snprintf(body, sizeof(body), "{\"n\":%zu,\"count\":%u,\"first\":\"%s\",\"all\":%s,\"ttl\":%lld}", q->nnames,
		 q->count, q->nnames ? q->names[0] : "", q->all ? "true" : "false", (long long)q->ttl_s);
	relay_changes_done(chg_relay, token, q->op, body, NULL, NULL);
	return 0;
}
static const struct relay_fork_ops fork_ops = {.request = fork_request};

static void test_fork_ops(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;

	tc_send(c, "{\"op\":\"fork\",\"id\":1}");
	tc_expect_error(c, "unavailable", "no sandbox to fork");
	chg_relay = F->r;
	relay_set_forks(F->r, &fork_ops, NULL);
	tc_send(c, "{\"op\":\"fork\",\"id\":2,\"count\":3,\"ttl_seconds\":60}");
	j = tc_expect(c, "fork");
	assert_int_equal(json_integer_value(json_object_get(j, "count")), 3);
	assert_int_equal(json_integer_value(json_object_get(j, "ttl")), 60);
	json_decref(j);
	tc_send(c, "{\"op\":\"fork\",\"id\":3,\"names\":[\"try-a\",\"b_2\"]}");
	j = tc_expect(c, "fork");
	assert_int_equal(json_integer_value(json_object_get(j, "count")), 2);
	assert_string_equal(json_string_value(json_object_get(j, "first")), "try-a");
	json_decref(j);
	tc_send(c, "{\"op\":\"fork_rm\",\"all\":true}");
	j = tc_expect(c, "fork_rm");
	assert_true(json_is_true(json_object_get(j, "all")));
	json_decref(j);
	static const char *const bad[][3] = {
	    {"{\"op\":\"fork\",\"id\":4,\"count\":1000}", "bad_field", "'count' must be an integer from 1 to 16"},
	    {"{\"op\":\"fork\",\"id\":5,\"count\":0}", "bad_field", "'count'"},
	    {"{\"op\":\"fork\",\"id\":6,\"names\":[\"../x\"]}", "bad_field", "names[0]"},
	    {"{\"op\":\"fork\",\"id\":7,\"names\":[\"A\"]}", "bad_field", "names[0]"},
	    {"{\"op\":\"fork\",\"id\":8,\"names\":[\"a\",\"a\"]}", "bad_field", "twice"},
	    {"{\"op\":\"fork\",\"id\":9,\"names\":[\"a\"],\"count\":2}", "bad_field", "'count' is 2"},
	    {"{\"op\":\"fork\",\"id\":10,\"names\":\"a\"}", "bad_field", "'names'"},
	    {"{\"op\":\"fork\",\"id\":11,\"ttl_seconds\":-1}", "bad_field", "ttl_seconds"},
	    {"{\"op\":\"fork_rm\",\"id\":12}", "missing_field", "fork_rm needs"},
	    {"{\"op\":\"fork_rm\",\"id\":13,\"all\":true,\"names\":[\"a\"]}", "missing_field", "one of them"},
	    {"{\"op\":\"fork_changes\",\"id\":14,\"names\":[\"a\",\"b\"]}", "missing_field", "exactly one"},
	    {"{\"op\":\"forks\",\"id\":15,\"frob\":1}", "bad_field", "frob"},
	    {"{\"op\":\"exec\",\"id\":16,\"argv\":[\"true\"],\"fork\":\"a/b\"}", "bad_field", "'fork'"},
	    {"{\"op\":\"exec\",\"id\":17,\"argv\":[\"true\"],\"fork\":7}", "bad_field", "'fork'"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		tc_send(c, bad[i][0]);
		tc_expect_error(c, bad[i][1], bad[i][2]);
	}
	/* a valid "fork" reaches the backend's exec request */
	tc_send(c, "{\"op\":\"exec\",\"id\":18,\"argv\":[\"echo\",\"x\"],\"fork\":\"try-a\"}");
	json_decref(tc_expect(c, "started"));
	json_decref(tc_expect(c, "stdout"));
	json_decref(tc_expect(c, "exit"));
	assert_string_equal(F->tb.last_fork, "try-a");
	tc_send(c, "{\"op\":\"exec\",\"id\":19,\"argv\":[\"echo\",\"x\"]}");
	json_decref(tc_expect(c, "started"));
	json_decref(tc_expect(c, "stdout"));
	json_decref(tc_expect(c, "exit"));
	assert_string_equal(F->tb.last_fork, "");
	relay_set_forks(F->r, NULL, NULL);
	tc_alive(c);
	tc_close(c);
}

/* A try backend: each variant's command through relay_cmd_spawn (the
 * simulator runs it), its output and end as events of the pending try. */
struct try_tb {
	uint64_t token;
	size_t n, ended;
	struct relay_cmd *cmd[RELAY_TRY_VARIANTS_MAX];
	char name[RELAY_TRY_VARIANTS_MAX][RELAY_TRY_NAME_MAX + 1];
	size_t idx[RELAY_TRY_VARIANTS_MAX];
	bool had_patch[RELAY_TRY_VARIANTS_MAX];
	char pick[32];
	size_t nkeep;
} try_tb;

static void try_out(void *ud, enum relay_stream st, const void *data, size_t n)
{
	size_t i = *(size_t *)ud;
	char body[512];
	snprintf(body, sizeof(body), "{\"variant\":\"%s\",\"stream\":\"%s\",\"data\":\"%.*s\"}", try_tb.name[i],
		 st == RELAY_STDOUT ? "stdout" : "stderr", (int)(n && ((const char *)data)[n - 1] == '\n' ? n - 1 : n),
		 (const char *)data);
	assert_int_equal(relay_request_event(chg_relay, try_tb.token, "try_output", body), 0);
}

static void try_end(void *ud, const struct relay_exit *ex, const char *code, const char *message)
{
	(void)code;
	(void)message;
	try_tb.cmd[*(size_t *)ud] = NULL;
	assert_non_null(ex);
	if (++try_tb.ended == try_tb.n) {
		char body[256];
		snprintf(body, sizeof(body), "{\"n\":%zu,\"patch0\":%s,\"pick\":\"%s\",\"nkeep\":%zu}", try_tb.n,
			 try_tb.had_patch[0] ? "true" : "false", try_tb.pick, try_tb.nkeep);
		relay_changes_done(chg_relay, try_tb.token, "try", body, NULL, NULL);
	}
}

static const struct relay_cmd_watch try_w = {.output = try_out, .ended = try_end};

static int try_start(void *ud, uint64_t token, const struct relay_try_req *q)
{
	(void)ud;
	memset(&try_tb, 0, sizeof(try_tb));
	try_tb.token = token;
	try_tb.n = q->nvariants;
	try_tb.nkeep = q->nkeep;
	snprintf(try_tb.pick, sizeof(try_tb.pick), "%s", q->pick ? q->pick : "");
	for (size_t i = 0; i < q->nvariants; i++) {
		const struct relay_try_variant *v = &q->variants[i];
		struct relay_exec_req req = {.argv = v->argv ? v->argv : q->argv,
					     .argc = v->argv ? v->argc : q->argc,
					     .cwd = "",
					     .timeout_ms = q->timeout_ms};
		char id[64];
		snprintf(try_tb.name[i], sizeof(try_tb.name[i]), "%s", v->name);
		try_tb.idx[i] = i;
		try_tb.had_patch[i] = v->patch != NULL;
		snprintf(id, sizeof(id), "try-%s", v->name);
		assert_int_equal(relay_cmd_spawn(chg_relay, id, &req, &try_w, &try_tb.idx[i], &try_tb.cmd[i]), 0);
		assert_int_equal(relay_cmd_spawn(chg_relay, id, &req, &try_w, &try_tb.idx[i], &(struct relay_cmd *){0}),
				 -EEXIST); /* the id is taken while it runs */
	}
	return 0;
}

static const struct relay_fork_ops try_ops = {.request = fork_request, .try_start = try_start};

static void test_try_op(void **state)
{
	(void)state;
	struct tc *c = tc_connect();
	json_t *j;

	tc_send(c, "{\"op\":\"try\",\"id\":1,\"variants\":[{\"name\":\"a\"}],\"argv\":[\"true\"]}");
	tc_expect_error(c, "unavailable", "no sandbox to fork");
	chg_relay = F->r;
	relay_set_forks(F->r, &try_ops, NULL);
	tc_send(
	    c,
	    "{\"op\":\"try\",\"id\":2,\"argv\":[\"echo\",\"common\"],\"pick\":\"b\",\"keep\":[\"a\"],"
	    "\"variants\":[{\"name\":\"a\",\"patch\":\"--- a/x\\n\"},{\"name\":\"b\",\"argv\":[\"echo\",\"own\"]}]}");
	bool seen_a = false, seen_b = false;
	for (;;) {
		j = tc_next(c, 3000);
		assert_non_null(j);
		const char *ev = json_string_value(json_object_get(j, "event"));
		assert_int_equal(json_integer_value(json_object_get(j, "id")), 2);
		if (!strcmp(ev, "try")) {
			assert_int_equal(json_integer_value(json_object_get(j, "n")), 2);
			assert_true(json_is_true(json_object_get(j, "patch0")));
			assert_string_equal(json_string_value(json_object_get(j, "pick")), "b");
			assert_int_equal(json_integer_value(json_object_get(j, "nkeep")), 1);
			json_decref(j);
			break;
		}
		assert_string_equal(ev, "try_output");
		const char *v = json_string_value(json_object_get(j, "variant")),
			   *d = json_string_value(json_object_get(j, "data"));
		if (!strcmp(v, "a"))
			seen_a = !strcmp(d, "common");
		else
			seen_b = !strcmp(d, "own");
		json_decref(j);
	}
	assert_true(seen_a && seen_b);
	static const char *const bad[][3] = {
	    {"{\"op\":\"try\",\"argv\":[\"x\"],\"variants\":[{\"name\":\"a\"}]}", "missing_field", "'id' is required"},
	    {"{\"op\":\"try\",\"id\":3}", "missing_field", "'variants'"},
	    {"{\"op\":\"try\",\"id\":4,\"variants\":[{\"name\":\"a\"}]}", "missing_field", "no 'argv'"},
	    {"{\"op\":\"try\",\"id\":5,\"argv\":[\"x\"],\"variants\":[{\"name\":\"A\"}]}", "bad_field", "name"},
	    {"{\"op\":\"try\",\"id\":6,\"argv\":[\"x\"],\"variants\":[{\"name\":\"a\"},{\"name\":\"a\"}]}", "bad_field",
	     "twice"},
	    {"{\"op\":\"try\",\"id\":7,\"argv\":[\"x\"],\"variants\":[{\"name\":\"a\",\"frob\":1}]}", "bad_field",
	     "frob"},
	    {"{\"op\":\"try\",\"id\":8,\"argv\":[\"x\"],\"variants\":[{\"name\":\"a\"}],\"pick\":\"z\"}", "bad_field",
	     "'pick'"},
	    {"{\"op\":\"try\",\"id\":9,\"argv\":[\"x\"],\"variants\":[{\"name\":\"a\"}],\"keep\":[\"z\"]}", "bad_field",
	     "keep[0]"},
	    {"{\"op\":\"try\",\"id\":10,\"argv\":[],\"variants\":[{\"name\":\"a\"}]}", "bad_field", "'argv'"},
	    {"{\"op\":\"try\",\"id\":11,\"argv\":[\"x\"],\"variants\":[{\"name\":\"a\",\"patch\":\"\"}]}", "bad_field",
	     "patch"},
	    {"{\"op\":\"try\",\"id\":12,\"argv\":[\"x\"],\"variants\":[]}", "bad_field", "'variants'"},
	    {"{\"op\":\"try\",\"id\":13,\"argv\":[\"x\"],\"variants\":[{\"name\":\"a\"}],\"timeout_seconds\":0}",
	     "bad_field", "timeout_seconds"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		tc_send(c, bad[i][0]);
		tc_expect_error(c, bad[i][1], bad[i][2]);
	}
	relay_set_forks(F->r, NULL, NULL);
	tc_alive(c);
	tc_close(c);
}

static void test_client_cap(void **state)
{
	(void)state;
	struct tc *c[3];

	for (int i = 0; i < 3; i++)
		c[i] = tc_connect();
	struct tc *x = tc_raw();
	json_t *j = tc_expect(x, "error");
	assert_string_equal(json_string_value(json_object_get(j, "code")), "busy");
	json_decref(j);
	assert_null(tc_next(x, 1000));
	assert_true(x->eof);
	tc_close(x);
	tc_alive(c[2]);
	for (int i = 0; i < 3; i++)
		tc_close(c[i]);
}

static void test_peer_uid(void **state)
{
	(void)state;
	int p[2];

	if (geteuid() != 0) {
		print_message("peer uid test skipped: needs root to connect as another uid\n");
		skip();
	}
	/* let uid 65534 reach the socket so that only SO_PEERCRED stands in the way */
	assert_int_equal(chmod(F->dir, 0711), 0);
	assert_int_equal(chmod(F->path, 0666), 0);
	assert_int_equal(pipe(p), 0);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		char buf[512] = {0};
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		struct timeval tv = {.tv_sec = 5};
		close(p[0]);
		if (setgroups(0, NULL) < 0 || setresgid(65534, 65534, 65534) < 0 || setresuid(65534, 65534, 65534) < 0)
			_exit(2);
		strcpy(sa.sun_path, F->path);
		int fd = socket(AF_UNIX, SOCK_STREAM, 0);
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			_exit(3);
		setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		ssize_t n = read(fd, buf, sizeof(buf) - 1);
		char extra;
		ssize_t m = n > 0 ? read(fd, &extra, 1) : -1; /* then closed */
		if (n > 0 && write(p[1], buf, (size_t)n) != n)
			_exit(4);
		_exit(m == 0 ? 0 : 5);
	}
	close(p[1]);
	char got[512] = {0};
	size_t have = 0;
	int status = 0;
	for (int k = 0; k < 3000; k++) {
		spin(1);
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
	}
	ssize_t n;
	while ((n = read(p[0], got + have, sizeof(got) - 1 - have)) > 0)
		have += (size_t)n;
	close(p[0]);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
	assert_non_null(strstr(got, "\"forbidden_peer\""));
	assert_non_null(strstr(got, "uid 65534"));
	struct relay_stats st;
	relay_get_stats(F->r, &st);
	assert_int_equal(st.clients, 0);
	/* our own uid still gets in */
	struct tc *c = tc_connect();
	tc_alive(c);
	tc_close(c);
}

static void test_paths_and_modes(void **state)
{
	(void)state;
	struct stat st;
	char dir[64], xdg[128], path[256], want[256];
	struct relay *r2 = NULL;
	struct relay_cfg cfg = {0};

	assert_int_equal(stat(F->path, &st), 0);
	assert_true(S_ISSOCK(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);

	/* a live relay is never replaced; a file that is not a socket neither */
	cfg.path = F->path;
	assert_int_equal(relay_new(F->l, &cfg, &tb_ops, &F->tb, &r2), -EADDRINUSE);
	strcpy(dir, "/tmp/relay-path-XXXXXX");
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/file", dir);
	close(open(path, O_CREAT | O_WRONLY, 0600));
	cfg.path = path;
	assert_int_equal(relay_new(F->l, &cfg, &tb_ops, &F->tb, &r2), -EEXIST);
	unlink(path);
	/* a stale socket (nothing listening) is replaced */
	snprintf(path, sizeof(path), "%s/stale.sock", dir);
	{
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		strcpy(sa.sun_path, path);
		int fd = socket(AF_UNIX, SOCK_STREAM, 0);
		assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
		close(fd);
	}
	assert_int_equal(relay_new(F->l, &cfg, &tb_ops, &F->tb, &r2), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	relay_free(r2);
	assert_int_equal(stat(path, &st), -1); /* unlinked on free */

	/* default path: XDG_RUNTIME_DIR/airlock/<name>-<hash>.sock, dir 0700 */
	char *old_sock = getenv("AIRLOCK_SOCKET") ? strdup(getenv("AIRLOCK_SOCKET")) : NULL;
	char *old_xdg = getenv("XDG_RUNTIME_DIR") ? strdup(getenv("XDG_RUNTIME_DIR")) : NULL;
	unsetenv("AIRLOCK_SOCKET");
	snprintf(xdg, sizeof(xdg), "%s/xdg", dir);
	assert_int_equal(mkdir(xdg, 0700), 0);
	setenv("XDG_RUNTIME_DIR", xdg, 1);
	assert_int_equal(relay_default_path("/home/dev/my project", path, sizeof(path)), 0);
	unsigned char h[32];
	crypto_hash_sha256(h, (const unsigned char *)"/home/dev/my project", strlen("/home/dev/my project"));
	snprintf(want, sizeof(want), "%s/airlock/my_project-%02x%02x%02x%02x%02x%02x%02x%02x.sock", xdg, h[0], h[1],
		 h[2], h[3], h[4], h[5], h[6], h[7]);
	assert_string_equal(path, want);
	snprintf(want, sizeof(want), "%s/airlock", xdg);
	assert_int_equal(lstat(want, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 0777, 0700);
	/* a group/world writable directory is refused */
	assert_int_equal(chmod(want, 0777), 0);
	assert_int_equal(relay_default_path("/home/dev/p", path, sizeof(path)), -EPERM);
	assert_int_equal(chmod(want, 0700), 0);
	/* a symlink in its place is refused */
	rmdir(want);
	assert_int_equal(symlink(dir, want), 0);
	assert_int_equal(relay_default_path("/home/dev/p", path, sizeof(path)), -EPERM);
	unlink(want);
	/* too small a buffer */
	assert_int_equal(relay_default_path("/home/dev/p", path, 10), -ENAMETOOLONG);
	/* AIRLOCK_SOCKET wins */
	setenv("AIRLOCK_SOCKET", "/some/where.sock", 1);
	assert_int_equal(relay_default_path("/home/dev/p", path, sizeof(path)), 0);
	assert_string_equal(path, "/some/where.sock");
	unsetenv("AIRLOCK_SOCKET");
	if (old_sock)
		setenv("AIRLOCK_SOCKET", old_sock, 1);
	if (old_xdg)
		setenv("XDG_RUNTIME_DIR", old_xdg, 1);
	else
		unsetenv("XDG_RUNTIME_DIR");
	free(old_sock);
	free(old_xdg);
	rmdir(want);
	rmdir(xdg);
	rmdir(dir);
}

static void test_slow_client(void **state)
{
	(void)state;
	struct tc *slow = tc_connect(), *fast = tc_connect();
	struct relay_stats st;
	uint64_t worst = 0;

	tc_send(slow, "{\"op\":\"exec\",\"id\":\"flood\",\"argv\":[\"flood\"]}");
	/* slow never reads again. fast keeps working meanwhile. */
	uint64_t t_end = loop_now_ms() + 1500;
	int rounds = 0;
	while (loop_now_ms() < t_end) {
		char line[128];
		struct run r = {0};
		uint64_t t0 = loop_now_ns();
		snprintf(line, sizeof(line), "{\"op\":\"exec\",\"id\":\"q%d\",\"argv\":[\"echo\",\"%d\"]}", rounds,
			 rounds);
		tc_send(fast, line);
		tc_run(fast, &r);
		uint64_t dt = loop_now_ns() - t0;
		if (dt > worst)
			worst = dt;
		assert_int_equal(json_integer_value(json_object_get(r.exit, "code")), 0);
		run_clear(&r);
		rounds++;
		relay_get_stats(F->r, &st);
		/* two rings, three clients' queues, input buffers: a few MiB at most */
		assert_true(st.bytes_buffered < (size_t)8 << 20);
	}
	relay_get_stats(F->r, &st);
	print_message("slow client: %d round trips, worst %.2f ms; flood produced %llu KiB before pausing; "
		      "relay holds %zu KiB\n",
		      rounds, (double)worst / 1e6, (unsigned long long)(F->tb.flood_total >> 10),
		      st.bytes_buffered >> 10);
	/* fast was never held behind slow (each of its commands ran to its
	 * exit while slow read nothing); how fast is bench/relay.sh's, not a
	 * unit test's: the worst round trip is printed, not asserted */
	assert_true(rounds > 20);
	assert_int_equal(st.paused, 1);
	assert_true(F->tb.pauses >= 1);
	/* the flood stopped: it produced about a ring's worth plus what the socket took */
	uint64_t before = F->tb.flood_total;
	spin(100);
	assert_int_equal(F->tb.flood_total, before);
	assert_true(before < (uint64_t)8 << 20);

	/* the slow client goes away: the command runs free (ring overwrites) */
	tc_close(slow);
	spin(50);
	relay_get_stats(F->r, &st);
	assert_int_equal(st.paused, 0);
	assert_true(F->tb.flood_total > before);
	assert_true(st.bytes_buffered < (size_t)8 << 20);
	tc_send(fast, "{\"op\":\"cancel\",\"id\":\"flood\"}");
	json_decref(tc_expect(fast, "ok"));
	tc_close(fast);
}

/* The stall a slow reader used to hit: its command is paused, its queue
 * full and its socket full; then it drains the socket in one go, so the
 * relay's next write takes the whole queue at once. The relay must go on
 * producing (and resume the command) by itself: with nothing new from the
 * paused command there is nothing else to wake it. Small queue and ring so
 * that the socket can swallow a whole queue. */
static int fx_setup_small_queue(void **state)
{
	struct relay_cfg cfg = {.client_queue = 8 << 10, .ring_bytes = 64 << 10};

	return fx_setup_cfg(state, &cfg);
}

static void test_slow_reader_resumes(void **state)
{
	(void)state;
	const size_t total = (size_t)2 << 20;
	struct tc *c = tc_connect();
	struct relay_stats st;
	struct run r = {0};
	char line[128];

	snprintf(line, sizeof(line), "{\"op\":\"exec\",\"id\":\"g\",\"argv\":[\"gen\",\"%zu\",\"3\"]}", total);
	tc_send(c, line);
	for (int round = 0; round < 3; round++) {
		/* do not read until the relay has paused the command */
		uint64_t until = loop_now_ms() + 3000;
		do {
			spin(2);
			relay_get_stats(F->r, &st);
		} while (!st.paused && loop_now_ms() < until);
		assert_int_equal(st.paused, 1);
		spin(20);
		/* then read as fast as possible: whole socket buffers at a time */
		size_t target = r.n[0] + 256 * 1024;
		while (r.n[0] < target && !r.exit) {
			json_t *ev = tc_next(c, 2000);
			if (!ev) {
				relay_get_stats(F->r, &st);
				fail_msg("stalled after %zu of %zu bytes (paused: %zu)", r.n[0], total, st.paused);
			}
			run_feed(&r, ev);
			json_decref(ev);
		}
	}
	tc_run(c, &r);
	assert_int_equal(r.n[0], total);
	assert_int_equal(r.dropped[0], 0);
	for (size_t i = 0; i < total; i++)
		if (r.out[0][i] != pattern(3, i))
			fail_msg("byte %zu differs", i);
	assert_int_equal(json_integer_value(json_object_get(r.exit, "code")), 0);
	assert_false(json_is_true(json_object_get(r.exit, "truncated")));
	assert_true(F->tb.pauses >= 3);
	assert_int_equal(F->tb.pauses, F->tb.resumes);
	relay_get_stats(F->r, &st);
	assert_int_equal(st.paused, 0);
	run_clear(&r);
	tc_close(c);
}

static void test_concurrent(void **state)
{
	(void)state;
	enum { NC = 8, PER = 8 };
	struct tc *c[NC];
	struct run r[NC * PER];
	int ended = 0;

	memset(r, 0, sizeof(r));
	for (int i = 0; i < NC; i++)
		c[i] = tc_connect();
	for (int i = 0; i < NC; i++) {
		for (int k = 0; k < PER; k++) {
			char line[160];
			int n = i * PER + k;
			snprintf(line, sizeof(line), "{\"op\":\"exec\",\"id\":%d,\"argv\":[\"gen\",\"%d\",\"%d\"]}", n,
				 20000 + n * 997, n);
			tc_send(c[i], line);
		}
	}
	uint64_t until = loop_now_ms() + 15000;
	while (ended < NC * PER && loop_now_ms() < until) {
		bool any = false;
		for (int i = 0; i < NC; i++) {
			json_t *j;
			while ((j = tc_next(c[i], 0))) {
				any = true;
				json_int_t id = json_integer_value(json_object_get(j, "id"));
				assert_true(id >= i * PER && id < (i + 1) * PER); /* never another client's events */
				if (run_feed(&r[id], j))
					ended++;
				json_decref(j);
			}
		}
		if (!any)
			spin(1);
	}
	assert_int_equal(ended, NC * PER);
	for (int n = 0; n < NC * PER; n++) {
		assert_true(r[n].saw_started);
		assert_string_equal(ev_name(r[n].exit), "exit");
		assert_int_equal(r[n].n[0], 20000 + n * 997);
		check_pattern(r[n].out[0], r[n].n[0], 0, (unsigned)n);
		run_clear(&r[n]);
	}
	for (int i = 0; i < NC; i++)
		tc_close(c[i]);
}

static void test_free_while_running(void **state)
{
	(void)state;
	struct tc *c = tc_connect();

	tc_send(c, "{\"op\":\"exec\",\"id\":\"s\",\"argv\":[\"sleep\"]}");
	json_decref(tc_expect(c, "started"));
	tc_send(c, "{\"op\":\"sync_wait\"}");
	spin(0);
	tc_close(c);
	/* teardown frees the relay with the command running: release() is called */
}

/* relay_sweep_stale: only sockets of ours nothing accepts on, older than
 * 2 s, in a private directory; never a live socket, a file, a symlink. */
static int bind_at(const char *path, bool do_listen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	strcpy(sa.sun_path, path);
	int fd = socket(AF_UNIX, SOCK_STREAM, 0);
	assert_int_equal(bind(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	if (do_listen)
		assert_int_equal(listen(fd, 4), 0);
	return fd;
}
static void test_sweep_stale(void **state)
{
	(void)state;
	char dir[64], p[256], q[256];
	struct stat st;
	unsigned n = 99;

	strcpy(dir, "/tmp/relay-sweep-XXXXXX");
	assert_non_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/gone.sock", dir);
	close(bind_at(p, false));
	snprintf(p, sizeof(p), "%s/live.sock", dir);
	int live = bind_at(p, true);
	snprintf(p, sizeof(p), "%s/file.sock", dir);
	close(open(p, O_CREAT | O_WRONLY, 0600));
	snprintf(q, sizeof(q), "%s/gone.sock", dir);
	snprintf(p, sizeof(p), "%s/link.sock", dir);
	assert_int_equal(symlink(q, p), 0);
	snprintf(p, sizeof(p), "%s/self.sock", dir);
	/* too young: a socket bound but maybe not yet listening */
	assert_int_equal(relay_sweep_stale(p, &n), 0);
	assert_int_equal(n, 0);
	sleep(3);
	snprintf(p, sizeof(p), "%s/new.sock", dir);
	close(bind_at(p, false)); /* young again */
	assert_int_equal(relay_sweep_stale(p, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(lstat(q, &st), -1);
	static const char *const kept[] = {"live.sock", "file.sock", "link.sock", "new.sock"};
	for (size_t i = 0; i < 4; i++) {
		snprintf(p, sizeof(p), "%s/%s", dir, kept[i]);
		assert_int_equal(lstat(p, &st), 0);
		unlink(p);
	}
	close(live);
	/* a directory others may write is never swept */
	assert_int_equal(chmod(dir, 0777), 0);
	snprintf(p, sizeof(p), "%s/x.sock", dir);
	assert_int_equal(relay_sweep_stale(p, &n), -EPERM);
	assert_int_equal(rmdir(dir), 0);
}

int main(void)
{
	if (sodium_init() < 0)
		return 1;
	mem_init_json();
	signal(SIGPIPE, SIG_IGN);
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_exec_basic, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_bad_requests, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_line_too_long, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_ids, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_stdin, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_signal_resize, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_cancel_on_close, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_binary_utf8, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_encoding_base64, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_tail, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_attach_replay, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_ring_overflow, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_status_history, fx_setup_small_history, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_sync_wait, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_changes_ops, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_fork_ops, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_try_op, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_client_cap, fx_setup_small_history, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_peer_uid, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_paths_and_modes, fx_setup, fx_teardown),
	    cmocka_unit_test(test_sweep_stale),
	    cmocka_unit_test_setup_teardown(test_slow_client, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_slow_reader_resumes, fx_setup_small_queue, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_concurrent, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_free_while_running, fx_setup, fx_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
