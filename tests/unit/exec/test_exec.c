/* SPDX-License-Identifier: Apache-2.0 */
/*
 * exec: real processes in a private temp workspace. Checks that need a
 * capability the host lacks (cgroup tracking, a pids limit, root) print why
 * and skip; as root on a cgroup v2 (or hybrid) host they all run.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/netlink.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/exec/exec.h"

#define CANARY "AIRLOCK_EXEC_CANARY"

static struct exec_sys *g_sys;
static int g_root = -1;
static char g_rootpath[256];
static char **g_env;

/* ---- harness ---- */

struct run {
	struct loop *l;
	struct exec *e;
	struct exec_result r;
	bool done;
	char *out[3];
	size_t len[3];
	size_t keep; /* bytes kept per stream; 0 = 1 MiB */
	size_t max_chunk;
	int *pending;
	/* hooks */
	void (*on_out)(struct run *, int, const void *, size_t);
	void *ctx;
};

static void h_output(struct exec *e, int stream, const void *data, size_t n, void *ud)
{
	struct run *run = ud;
	size_t keep = run->keep ? run->keep : (1u << 20);

	(void)e;
	assert_true(stream == 1 || stream == 2);
	assert_true(n > 0 && n <= EXEC_CHUNK);
	if (n > run->max_chunk)
		run->max_chunk = n;
	if (run->len[stream] + n <= keep) {
		char *p = mem_realloc(run->out[stream], run->len[stream] + n + 1);
		assert_non_null(p);
		memcpy(p + run->len[stream], data, n);
		run->len[stream] += n;
		p[run->len[stream]] = '\0';
		run->out[stream] = p;
	}
	if (run->on_out)
		run->on_out(run, stream, data, n);
}

static void h_exit(struct exec *e, const struct exec_result *r, void *ud)
{
	struct run *run = ud;

	(void)e;
	assert_false(run->done);
	run->r = *r;
	run->done = true;
	if (run->pending && --*run->pending == 0)
		loop_stop(run->l);
}

static const struct exec_ops h_ops = {.on_output = h_output, .on_exit = h_exit};

static bool g_watchdog_fired;
static void watchdog(struct loop *l, void *ud)
{
	(void)ud;
	g_watchdog_fired = true;
	loop_stop(l);
}

static void run_loop(struct loop *l, uint64_t limit_ms)
{
	g_watchdog_fired = false;
	uint64_t id = loop_add_timer(l, limit_ms, watchdog, NULL);
	assert_int_equal(loop_run(l), 0);
	loop_del_timer(l, id);
	assert_false(g_watchdog_fired);
}

static void req_init(struct exec_req *q)
{
	memset(q, 0, sizeof(*q));
	q->root_fd = g_root;
	q->envp = (const char *const *)g_env;
	q->uid = q->gid = EXEC_ID_KEEP;
}

static void run_free(struct run *run)
{
	exec_free(run->e);
	for (int i = 0; i < 3; i++)
		mem_free(run->out[i]);
	memset(run, 0, sizeof(*run));
}

/* Start req, run the loop until it exits (run->done), leave run->e alive. */
static void run_req(struct loop *l, struct exec_sys *sys, const struct exec_req *q, struct run *run)
{
	static int one;

	run->l = l;
	one = 1;
	run->pending = &one;
	assert_int_equal(exec_start(l, sys, q, &h_ops, run, &run->e), 0);
	run_loop(l, 20000);
	assert_true(run->done);
}

static void run_sh(struct loop *l, const char *sh, struct run *run)
{
	struct exec_req q;

	req_init(&q);
	q.shell = sh;
	run_req(l, g_sys, &q, run);
}

static bool pid_gone(pid_t pid)
{
	char path[64], buf[512];

	for (int i = 0; i < 100; i++) {
		if (kill(pid, 0) < 0 && errno == ESRCH)
			return true;
		/* An orphan reparented to init may linger as a zombie briefly. */
		snprintf(path, sizeof(path), "/proc/%ld/stat", (long)pid);
		FILE *f = fopen(path, "re");
		if (f) {
			size_t n = fread(buf, 1, sizeof(buf) - 1, f);
			fclose(f);
			buf[n] = '\0';
			char *rp = strrchr(buf, ')');
			if (rp && rp[1] == ' ' && rp[2] == 'Z')
				return true;
		}
		usleep(10000);
	}
	return false;
}

static bool tracks_tree(void)
{
	return exec_sys_caps(g_sys) & (EXEC_CAP_CG2 | EXEC_CAP_CG1_PIDS);
}

/* ---- exit status ---- */

static void test_exit_codes(void **state)
{
	(void)state;
	static const int codes[] = {0, 1, 2, 3, 42, 100, 125, 126, 127, 128, 200, 254, 255};
	struct loop *l = loop_new();
	char sh[64];

	for (size_t i = 0; i < sizeof(codes) / sizeof(codes[0]); i++) {
		struct run run = {0};
		snprintf(sh, sizeof(sh), "exit %d", codes[i]);
		run_sh(l, sh, &run);
		assert_int_equal(run.r.exit_code, codes[i]);
		assert_int_equal(run.r.signal, 0);
		assert_int_equal(run.r.exec_errno, 0);
		assert_false(run.r.timed_out);
		assert_true(run.r.pid > 0);
		run_free(&run);
	}

	/* Not found, through PATH and by path; not executable. */
	const char *nf1[] = {"airlock-no-such-command", NULL};
	const char *nf2[] = {"/nonexistent/airlock-cmd", NULL};
	const char *nx[] = {"./noexec.sh", NULL};
	int fd = openat(g_root, "noexec.sh", O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "#!/bin/sh\nexit 0\n", 17), 17);
	close(fd);
	struct {
		const char *const *argv;
		int code, err;
	} t[] = {{nf1, 127, ENOENT}, {nf2, 127, ENOENT}, {nx, 126, EACCES}};
	for (size_t i = 0; i < 3; i++) {
		struct run run = {0};
		struct exec_req q;
		req_init(&q);
		q.argv = t[i].argv;
		run_req(l, g_sys, &q, &run);
		assert_int_equal(run.r.exit_code, t[i].code);
		assert_int_equal(run.r.exec_errno, t[i].err);
		run_free(&run);
	}
	/* The shell's own "not found" is the command's exit, not ours. */
	struct run run = {0};
	run_sh(l, "airlock-no-such-command", &run);
	assert_int_equal(run.r.exit_code, 127);
	assert_int_equal(run.r.exec_errno, 0);
	run_free(&run);
	loop_free(l);
}

static void test_signal_death(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct run run = {0};

	run_sh(l, "kill -9 $$", &run);
	assert_int_equal(run.r.signal, 9);
	assert_int_equal(run.r.exit_code, 128 + 9);
	run_free(&run);
	loop_free(l);
}

/* ---- timeout / cancel ---- */

static void test_timeout_kills_setsid_grandchild(void **state)
{
	(void)state;
	if (!tracks_tree()) {
		print_message("SKIP timeout tree: no writable cgroup (%s)\n", exec_sys_describe(g_sys));
		skip();
	}
	struct loop *l = loop_new();
	struct run run = {0};
	struct exec_req q;

	req_init(&q);
	/* The grandchild leaves the session, ignores SIGTERM and keeps stdout. */
	q.shell = "setsid sh -c 'trap \"\" TERM; echo $$; exec sleep 100' & wait";
	q.timeout_ms = 300;
	q.grace_ms = 300;
	uint64_t t0 = loop_now_ms();
	run_req(l, g_sys, &q, &run);
	assert_true(run.r.timed_out);
	assert_int_equal(run.r.signal, SIGTERM);
	assert_true(loop_now_ms() - t0 < 5000);
	assert_non_null(run.out[1]);
	pid_t gpid = (pid_t)atol(run.out[1]);
	assert_true(gpid > 1);
	assert_true(pid_gone(run.r.pid) || kill(run.r.pid, 0) == 0); /* main: our zombie until reaped */
	assert_true(pid_gone(gpid));
	const char *cg = exec_cgroup_path(run.e);
	if (cg) {
		char p[512], buf[64] = "";
		snprintf(p, sizeof(p), "%s/cgroup.procs", cg);
		FILE *f = fopen(p, "re");
		assert_non_null(f);
		size_t n = fread(buf, 1, sizeof(buf) - 1, f);
		fclose(f);
		assert_int_equal(n, 0);
	}
	run_free(&run);
	loop_free(l);
}

static void test_timeout_no_cgroup(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct run run = {0};
	struct exec_req q;

	req_init(&q);
	q.shell = "sleep 100; echo never";
	q.timeout_ms = 200;
	run_req(l, NULL, &q, &run);
	assert_true(run.r.timed_out);
	assert_int_equal(run.r.signal, SIGTERM);
	assert_int_equal(run.r.stdout_bytes, 0);
	run_free(&run);
	loop_free(l);
}

static void do_cancel(struct loop *l, void *ud)
{
	(void)l;
	struct run *run = ud;
	assert_int_equal(exec_cancel(run->e), 0);
	assert_int_equal(exec_cancel(run->e), 0); /* idempotent */
}

static void test_cancel(void **state)
{
	(void)state;
	struct loop *l = loop_new();

	/* Plain: dies of SIGTERM. Ignoring TERM: SIGKILL after the grace. */
	const char *sh[] = {"sleep 100", "trap '' TERM; sleep 100"};
	int sig[] = {SIGTERM, SIGKILL};
	for (int i = 0; i < 2; i++) {
		struct run run = {0};
		struct exec_req q;
		static int one;
		req_init(&q);
		q.shell = sh[i];
		q.grace_ms = 200;
		run.l = l;
		one = 1;
		run.pending = &one;
		assert_int_equal(exec_start(l, g_sys, &q, &h_ops, &run, &run.e), 0);
		loop_add_timer(l, 100, do_cancel, &run);
		run_loop(l, 10000);
		assert_true(run.done);
		assert_true(run.r.canceled);
		assert_false(run.r.timed_out);
		assert_int_equal(run.r.signal, sig[i]);
		assert_int_equal(exec_cancel(run.e), -ESRCH);
		assert_int_equal(exec_signal(run.e, SIGTERM), -ESRCH);
		run_free(&run);
	}
	loop_free(l);
}

/* ---- stdin ---- */

struct feeder {
	struct run *run;
	const uint8_t *data;
	size_t n, off;
	int eagain;
};

static void feed(struct exec *e, void *ud)
{
	struct feeder *f = ud;

	while (f->off < f->n) {
		ssize_t w = exec_write_stdin(e, f->data + f->off, f->n - f->off);
		if (w == -EAGAIN) {
			f->eagain++;
			return;
		}
		assert_true(w > 0);
		f->off += (size_t)w;
		if (f->off < f->n)
			return; /* short: wait for on_stdin_writable */
	}
	assert_int_equal(exec_close_stdin(e), 0);
	assert_int_equal(exec_write_stdin(e, "x", 1), -EBADF);
}

static void feed_output(struct exec *e, int stream, const void *data, size_t n, void *ud)
{
	struct feeder *f = ud;
	h_output(e, stream, data, n, f->run);
}

static void feed_exit(struct exec *e, const struct exec_result *r, void *ud)
{
	struct feeder *f = ud;
	h_exit(e, r, f->run);
}

static void test_stdin_round_trip(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct run run = {.keep = 4u << 20};
	struct feeder f = {.run = &run, .n = 3u << 20};
	uint8_t *data = mem_alloc(f.n);
	static int one;

	for (size_t i = 0; i < f.n; i++)
		data[i] = (uint8_t)(i * 7 + (i >> 12));
	f.data = data;
	const char *argv[] = {"cat", NULL};
	struct exec_req q;
	req_init(&q);
	q.argv = argv;
	q.stdin_open = true;
	q.stdin_buf = 16 * 1024;
	struct exec_ops ops = {.on_output = feed_output, .on_exit = feed_exit, .on_stdin_writable = feed};
	run.l = l;
	one = 1;
	run.pending = &one;
	assert_int_equal(exec_start(l, g_sys, &q, &ops, &f, &run.e), 0);
	feed(run.e, &f);
	run_loop(l, 20000);
	assert_int_equal(run.r.exit_code, 0);
	assert_int_equal(run.len[1], f.n);
	assert_memory_equal(run.out[1], data, f.n);
	assert_true(f.eagain + 1 > 0);
	run_free(&run);

	/* stdin off: /dev/null, and writes are refused. */
	struct run r2 = {0};
	req_init(&q);
	q.argv = argv;
	run_req(l, g_sys, &q, &r2);
	assert_int_equal(r2.r.exit_code, 0);
	assert_int_equal(r2.len[1], 0);
	assert_int_equal(exec_write_stdin(r2.e, "x", 1), -EPIPE);
	run_free(&r2);
	mem_free(data);
	loop_free(l);
}

/* ---- output ---- */

static void check_sequence(const char *buf, const char *prefix, int count)
{
	const char *p = buf;
	char want[32];

	assert_non_null(p);
	for (int i = 0; i < count; i++) {
		int n = snprintf(want, sizeof(want), "%s%d\n", prefix, i);
		assert_memory_equal(p, want, (size_t)n);
		p += n;
	}
	assert_int_equal(*p, '\0');
}

static void test_streams_in_order(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct run run = {0};

	run_sh(l, "i=0; while [ $i -lt 3000 ]; do echo out$i; echo err$i >&2; i=$((i+1)); done", &run);
	assert_int_equal(run.r.exit_code, 0);
	check_sequence(run.out[1], "out", 3000);
	check_sequence(run.out[2], "err", 3000);
	assert_int_equal(run.r.stdout_bytes, run.len[1]);
	assert_int_equal(run.r.stderr_bytes, run.len[2]);
	run_free(&run);
	loop_free(l);
}

static void test_binary_output(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct run run = {0};
	uint8_t all[256 * 4];

	for (size_t i = 0; i < sizeof(all); i++)
		all[i] = (uint8_t)i;
	int fd = openat(g_root, "bin.dat", O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, all, sizeof(all)), (ssize_t)sizeof(all));
	close(fd);
	run_sh(l, "cat bin.dat; cat bin.dat >&2", &run);
	assert_int_equal(run.r.exit_code, 0);
	assert_int_equal(run.len[1], sizeof(all));
	assert_int_equal(run.len[2], sizeof(all));
	assert_memory_equal(run.out[1], all, sizeof(all));
	assert_memory_equal(run.out[2], all, sizeof(all));
	run_free(&run);
	loop_free(l);
}

/* ---- the hold: a trickle of output comes in chunks of many writes ---- */

struct chunks {
	int n;
	char first[16];
};

static void count_out(struct run *run, int stream, const void *data, size_t n)
{
	struct chunks *c = run->ctx;

	(void)stream;
	if (c->n++ == 0)
		memcpy(c->first, data, n < sizeof(c->first) - 1 ? n : sizeof(c->first) - 1);
}

/* Three writes 150 ms apart: with a hold longer than the command, the first
 * comes at once and alone, the other two in one chunk at the exit, and the
 * exit is not made to wait for the hold; without a hold, one chunk each. */
static void test_output_hold(void **state)
{
	(void)state;
	const char *sh = "printf a; sleep 0.15; printf b; sleep 0.15; printf c";
	struct loop *l = loop_new();
	struct exec_req q;

	for (int held = 1; held >= 0; held--) {
		struct chunks c = {0};
		struct run run = {.on_out = count_out, .ctx = &c};
		req_init(&q);
		q.shell = sh;
		q.hold_ms = held ? 60000 : EXEC_HOLD_NONE;
		uint64_t t0 = loop_now_ms();
		run_req(l, g_sys, &q, &run); /* its watchdog fails at 20 s: the hold outlasted the exit */
		print_message("hold %s: %d chunks in %llu ms\n", held ? "60 s" : "none", c.n,
			      (unsigned long long)(loop_now_ms() - t0));
		assert_int_equal(run.r.exit_code, 0);
		assert_string_equal(run.out[1], "abc");
		assert_string_equal(c.first, "a");
		assert_int_equal(c.n, held ? 2 : 3);
		run_free(&run);
	}
	loop_free(l);
}

struct flood {
	uint64_t total, next_pause;
	int pauses;
	bool paused;
};

static void resume_cb(struct loop *l, void *ud)
{
	(void)l;
	struct run *run = ud;
	struct flood *f = run->ctx;
	f->paused = false;
	exec_pause_output(run->e, false);
}

static void flood_out(struct run *run, int stream, const void *data, size_t n)
{
	struct flood *f = run->ctx;

	(void)data;
	assert_int_equal(stream, 1);
	assert_false(f->paused); /* nothing is delivered while paused */
	f->total += n;
	if (f->total >= f->next_pause) {
		f->next_pause += 8u << 20;
		f->paused = true;
		f->pauses++;
		exec_pause_output(run->e, true);
		loop_add_timer(run->l, 15, resume_cb, run);
	}
}

static void test_large_output_pause(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct flood f = {.next_pause = 8u << 20};
	struct run run = {.keep = 1, .on_out = flood_out, .ctx = &f};
	struct exec_req q;

	req_init(&q);
	q.shell = "head -c 104857600 /dev/zero";
	unsigned long a0 = mem_count();
	run_req(l, g_sys, &q, &run);
	unsigned long allocs = mem_count() - a0;
	assert_int_equal(run.r.exit_code, 0);
	assert_int_equal(f.total, 100u << 20);
	assert_int_equal(run.r.stdout_bytes, 100u << 20);
	assert_true(run.max_chunk <= EXEC_CHUNK);
	assert_true(f.pauses >= 10);
	/* Bounded memory: no allocation per chunk (a handful for the exec,
	 * cgroup paths and loop timers, independent of the volume). */
	print_message("100 MiB: %lu allocations, %d pauses\n", allocs, f.pauses);
	assert_true(allocs < 100);
	run_free(&run);
	loop_free(l);
}

/* ---- tty ---- */

struct ttyctx {
	int stage;
};

static void tty_out(struct run *run, int stream, const void *data, size_t n)
{
	struct ttyctx *t = run->ctx;

	(void)data;
	(void)n;
	assert_int_equal(stream, 1);
	if (t->stage == 0 && run->out[1] && strstr(run->out[1], "33 101")) {
		t->stage = 1;
		assert_int_equal(exec_resize(run->e, 50, 132), 0);
		assert_int_equal(exec_write_stdin(run->e, "go\n", 3), 3);
	}
}

static void test_tty(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct ttyctx t = {0};
	struct run run = {.on_out = tty_out, .ctx = &t};
	struct exec_req q;
	struct exec_env_in ein = {.tty = true};
	char **env;

	assert_int_equal(exec_env_build(&ein, &env, NULL), 0);
	req_init(&q);
	q.envp = (const char *const *)env;
	q.tty = true;
	q.rows = 33;
	q.cols = 101;
	q.shell = "test -t 0 && test -t 1 && test -t 2 && stty size; read x; stty size; echo \"[$TERM]\"";
	run_req(l, g_sys, &q, &run);
	assert_int_equal(run.r.exit_code, 0);
	assert_int_equal(t.stage, 1);
	assert_non_null(strstr(run.out[1], "33 101"));
	assert_non_null(strstr(run.out[1], "50 132"));
	assert_non_null(strstr(run.out[1], "[xterm-256color]"));
	assert_int_equal(run.len[2], 0);
	assert_int_equal(exec_resize(run.e, 1, 1), -ESRCH);
	run_free(&run);

	/* Pipes are not a terminal. */
	struct run r2 = {0};
	run_sh(l, "test -t 0 || test -t 1 || echo notty", &r2);
	assert_string_equal(r2.out[1], "notty\n");
	assert_int_equal(exec_resize(r2.e, 10, 10), -ENOTTY);
	run_free(&r2);
	exec_env_free(env);
	loop_free(l);
}

/* ---- env ---- */

static bool env_has(char **env, const char *entry)
{
	for (; *env; env++)
		if (strcmp(*env, entry) == 0)
			return true;
	return false;
}

static size_t env_count(char **env)
{
	size_t n = 0;
	while (env[n])
		n++;
	return n;
}

static void test_env_build(void **state)
{
	(void)state;
	const char *fwd[] = {"TOKEN=abc", "HOME=/home/agent", "SHARED=fwd"};
	const char *reqv[] = {"SHARED=req", "EMPTY=", "X_1=a=b"};
	struct exec_env_in in = {.forwarded = fwd, .n_forwarded = 3, .request = reqv, .n_request = 3};
	char **env;
	const char *bad;

	assert_int_equal(exec_env_build(&in, &env, &bad), 0);
	assert_true(env_has(env, "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"));
	assert_true(env_has(env, "HOME=/home/agent")); /* forwarded overrides base */
	assert_true(env_has(env, "LANG=C.UTF-8"));
	assert_true(env_has(env, "TOKEN=abc"));
	assert_true(env_has(env, "SHARED=req")); /* request overrides forwarded */
	assert_true(env_has(env, "EMPTY="));
	assert_true(env_has(env, "X_1=a=b"));
	assert_int_equal(env_count(env), 7); /* no TERM without a tty */
	for (char **p = env; *p; p++)
		assert_null(strstr(*p, CANARY));
	exec_env_free(env);

	struct exec_env_in tin = {.tty = true, .term = "vt100", .path = "/bin"};
	assert_int_equal(exec_env_build(&tin, &env, NULL), 0);
	assert_true(env_has(env, "TERM=vt100"));
	assert_true(env_has(env, "PATH=/bin"));
	exec_env_free(env);

	static const char *const bads[] = {"1ABC=x", "A-B=x", "=x", "NOEQ", "A B=x", "\xc3\xa9=x", "A.B=1"};
	for (size_t i = 0; i < sizeof(bads) / sizeof(bads[0]); i++) {
		const char *one[] = {bads[i]};
		struct exec_env_in b = {.request = one, .n_request = 1};
		env = (char **)1;
		assert_int_equal(exec_env_build(&b, &env, &bad), -EINVAL);
		assert_null(env);
		assert_ptr_equal(bad, bads[i]);
	}
	char longname[EXEC_ENV_NAME_MAX + 8];
	memset(longname, 'A', EXEC_ENV_NAME_MAX + 1);
	strcpy(longname + EXEC_ENV_NAME_MAX + 1, "=x");
	const char *ln[] = {longname};
	struct exec_env_in lb = {.request = ln, .n_request = 1};
	assert_int_equal(exec_env_build(&lb, &env, &bad), -EINVAL);

	/* Size cap. */
	char *big = mem_alloc(2000);
	memset(big, 'v', 1999);
	big[1999] = '\0';
	memcpy(big, "BIG=", 4);
	const char *bv[] = {"SMALL=1", big};
	struct exec_env_in cb = {.forwarded = bv, .n_forwarded = 2, .max_bytes = 1500};
	assert_int_equal(exec_env_build(&cb, &env, &bad), -E2BIG);
	assert_ptr_equal(bad, big);
	cb.max_bytes = 4000;
	assert_int_equal(exec_env_build(&cb, &env, &bad), 0);
	exec_env_free(env);
	mem_free(big);
	exec_env_free(NULL);

	/* Allocation failures are errors, never crashes or leaks. */
	for (unsigned long n = 1; n < 20; n++) {
		mem_fail_at(n, 0);
		int r = exec_env_build(&in, &env, NULL);
		mem_fail_at(0, 0);
		if (r == 0) {
			exec_env_free(env);
			break;
		}
		assert_int_equal(r, -ENOMEM);
	}
}

static void test_env_canary_absent(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct run run = {0};
	const char *fwd[] = {"INJECTED=secret-value"};
	const char *reqv[] = {"FROM_REQUEST=1"};
	struct exec_env_in in = {.forwarded = fwd, .n_forwarded = 1, .request = reqv, .n_request = 1};
	char **env;
	struct exec_req q;
	const char *argv[] = {"env", NULL};

	assert_non_null(getenv(CANARY));
	assert_int_equal(exec_env_build(&in, &env, NULL), 0);
	req_init(&q);
	q.argv = argv;
	q.envp = (const char *const *)env;
	run_req(l, g_sys, &q, &run);
	assert_int_equal(run.r.exit_code, 0);
	assert_null(strstr(run.out[1], CANARY));
	assert_non_null(strstr(run.out[1], "INJECTED=secret-value\n"));
	assert_non_null(strstr(run.out[1], "FROM_REQUEST=1\n"));
	assert_non_null(strstr(run.out[1], "PATH="));
	run_free(&run);

	/* NULL envp: nothing at all (argv[0] needs a path then). */
	const char *argv2[] = {"/usr/bin/env", NULL};
	struct run r2 = {0};
	req_init(&q);
	q.argv = argv2;
	q.envp = NULL;
	run_req(l, g_sys, &q, &r2);
	assert_int_equal(r2.r.exit_code, 0);
	assert_int_equal(r2.len[1], 0);
	run_free(&r2);
	exec_env_free(env);
	loop_free(l);
}

/* ---- cwd ---- */

static void test_cwd_confinement(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	char want[512];

	mkdirat(g_root, "sub", 0755);
	mkdirat(g_root, "sub/deeper", 0755);
	(void)symlinkat("/tmp", g_root, "out");
	(void)symlinkat("../..", g_root, "sub/up2");
	(void)symlinkat("sub", g_root, "in");
	int fd = openat(g_root, "file", O_CREAT | O_WRONLY | O_CLOEXEC, 0644);
	assert_true(fd >= 0);
	close(fd);

	struct {
		const char *cwd;
		const char *pwd; /* NULL = refused */
		int err;
	} t[] = {
	    {NULL, "", 0},
	    {"", "", 0},
	    {"sub", "/sub", 0},
	    {"sub/deeper/..", "/sub", 0},
	    {"in", "/sub", 0},
	    {"..", NULL, -EXDEV},
	    {"../", NULL, -EXDEV},
	    {"sub/../..", NULL, -EXDEV},
	    {"/etc", NULL, -EXDEV},
	    {"/", NULL, -EXDEV},
	    {"out", NULL, -EXDEV},
	    {"sub/up2", NULL, -EXDEV},
	    {"missing", NULL, -ENOENT},
	    {"file", NULL, -ENOTDIR},
	};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct exec_req q;
		struct run run = {0};
		req_init(&q);
		q.shell = "pwd -P";
		q.cwd = t[i].cwd;
		if (!t[i].pwd) {
			struct exec *e = (struct exec *)1;
			assert_int_equal(exec_start(l, g_sys, &q, &h_ops, &run, &e), t[i].err);
			assert_null(e);
			continue;
		}
		run_req(l, g_sys, &q, &run);
		snprintf(want, sizeof(want), "%s%s\n", g_rootpath, t[i].pwd);
		assert_string_equal(run.out[1], want);
		run_free(&run);
	}
	loop_free(l);
}

/* ---- identity ---- */

static void test_uid_drop(void **state)
{
	(void)state;
	if (geteuid() != 0) {
		/* Not root: commands run as the agent whatever uid is asked for. */
		print_message("SKIP uid drop: not root (commands run as uid %u)\n", (unsigned)geteuid());
		skip();
	}
	struct loop *l = loop_new();
	struct run run = {0};
	struct exec_req q;

	req_init(&q);
	q.shell = "id -u; id -g; id -G; touch /root/airlock-exec-probe 2>/dev/null && echo wrote || echo denied";
	q.uid = q.gid = 65534;
	run_req(l, g_sys, &q, &run);
	assert_int_equal(run.r.exit_code, 0);
	assert_string_equal(run.out[1], "65534\n65534\n65534\ndenied\n");
	run_free(&run);

	/* The run user needs search permission on cwd: refused up front. */
	mkdirat(g_root, "private", 0700);
	req_init(&q);
	q.shell = "true";
	q.cwd = "private";
	q.uid = q.gid = 65534;
	struct exec *e = NULL;
	assert_int_equal(exec_start(l, g_sys, &q, &h_ops, &run, &e), -EACCES);
	assert_null(e);
	loop_free(l);
}

/* ---- fork bomb ---- */

struct ticker {
	uint64_t last, max_gap;
	bool stop;
	struct loop *l;
};

static void tick(struct loop *l, void *ud)
{
	struct ticker *t = ud;
	uint64_t now = loop_now_ms();

	if (t->last && now - t->last > t->max_gap)
		t->max_gap = now - t->last;
	t->last = now;
	if (!t->stop)
		loop_add_timer(l, 10, tick, t);
}

static void test_fork_bomb(void **state)
{
	(void)state;
	if (!(exec_sys_caps(g_sys) & (EXEC_CAP_CG2_PIDS | EXEC_CAP_CG1_PIDS))) {
		print_message("SKIP fork bomb: no pids cgroup (%s)\n", exec_sys_describe(g_sys));
		skip();
	}
	struct loop *l = loop_new();
	struct run run = {0};
	struct exec_req q;
	struct ticker t = {.l = l};

	req_init(&q);
	/* First the limit as the command sees it (v1 pids hierarchy on hybrid
	 * hosts, else v2), then fork until refused. */
	q.shell = "p=$(sed -n 's/^[0-9]*:pids:\\(.*\\)/\\1/p' /proc/self/cgroup); "
		  "if [ -n \"$p\" ]; then cat /sys/fs/cgroup/pids$p/pids.max; "
		  "else cat /sys/fs/cgroup$(sed -n 's/^0:://p' /proc/self/cgroup)/pids.max; fi; "
		  "i=0; while [ $i -lt 400 ]; do sleep 60 & i=$((i+1)); done; echo spawned; "
		  "bomb() { bomb | bomb & }; bomb; wait";
	q.limits.pids_max = 64;
	q.timeout_ms = 2000;
	q.grace_ms = 100;
	loop_add_timer(l, 10, tick, &t);
	uint64_t t0 = loop_now_ms();
	run_req(l, g_sys, &q, &run);
	t.stop = true;
	print_message("fork bomb: %llu ms, longest loop gap %llu ms, stderr %llu bytes\n",
		      (unsigned long long)(loop_now_ms() - t0), (unsigned long long)t.max_gap,
		      (unsigned long long)run.r.stderr_bytes);
	/* dash gives up when fork fails (the lingering sleeps are then cut off
	 * after drain_ms); a shell that keeps trying meets the timeout. */
	assert_true(run.r.timed_out || run.r.lingering_killed);
	assert_true(t.max_gap < 500);
	assert_true(run.r.stderr_bytes > 0); /* forks were refused */
	assert_non_null(run.out[1]);
	assert_int_equal(strncmp(run.out[1], "64\n", 3), 0);
	assert_null(strstr(run.out[1], "spawned")); /* 400 never fit under 64 */
	assert_true(loop_now_ms() - t0 < 8000);
	const char *cg = exec_cgroup_path(run.e);
	if (cg) {
		char p[512], buf[64] = "";
		snprintf(p, sizeof(p), "%s/cgroup.procs", cg);
		FILE *f = fopen(p, "re");
		assert_non_null(f);
		assert_int_equal(fread(buf, 1, sizeof(buf) - 1, f), 0);
		fclose(f);
	}
	run_free(&run);
	/* The ticker's last timer dies with the loop. */
	loop_free(l);
}

static void test_memory_limit(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct run run = {0};
	struct exec_req q;

	/* Without a memory cgroup this is RLIMIT_AS, which the shell hits as a
	 * failed allocation instead of the OOM killer: either way the command
	 * cannot hold 200 MB under a 32 MiB limit. */
	req_init(&q);
	q.shell = "x=$(head -c 200000000 /dev/zero | tr '\\0' a); echo survived ${#x}";
	q.limits.memory_max = 32u << 20;
	q.timeout_ms = 15000;
	run_req(l, g_sys, &q, &run);
	print_message("memory limit: exit %d signal %d (%s)\n", run.r.exit_code, run.r.signal,
		      exec_sys_describe(g_sys));
	assert_false(run.r.timed_out);
	assert_true(run.r.exit_code != 0);
	assert_true(run.out[1] == NULL || !strstr(run.out[1], "survived"));
	run_free(&run);

	/* No cgroup at all: the RLIMIT_AS fallback. */
	struct run r2 = {0};
	run_req(l, NULL, &q, &r2);
	print_message("memory limit, RLIMIT_AS: exit %d signal %d\n", r2.r.exit_code, r2.r.signal);
	assert_true(r2.r.exit_code != 0);
	assert_true(r2.out[1] == NULL || !strstr(r2.out[1], "survived"));
	run_free(&r2);
	loop_free(l);
}

/* ---- lingering descendants ---- */

static void test_lingering(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct exec_req q;

	/* A background job keeps stdout open: cut off after drain_ms. */
	struct run run = {0};
	req_init(&q);
	q.shell = "sleep 100 & echo $!";
	q.drain_ms = 200;
	uint64_t t0 = loop_now_ms();
	run_req(l, g_sys, &q, &run);
	assert_int_equal(run.r.exit_code, 0);
	assert_true(run.r.lingering_killed);
	assert_true(loop_now_ms() - t0 < 3000);
	pid_t bg = (pid_t)atol(run.out[1]);
	assert_true(bg > 1);
	assert_true(pid_gone(bg));
	run_free(&run);

	/* A background job with its output elsewhere dies with the command. */
	struct run r2 = {0};
	req_init(&q);
	q.shell = "sleep 100 >/dev/null 2>&1 & echo $!";
	t0 = loop_now_ms();
	run_req(l, g_sys, &q, &r2);
	assert_false(r2.r.lingering_killed);
	assert_true(loop_now_ms() - t0 < 1000);
	bg = (pid_t)atol(r2.out[1]);
	assert_true(pid_gone(bg));
	run_free(&r2);
	loop_free(l);
}

/* ---- concurrency, reentrancy, bad input ---- */

static void test_concurrent_64(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	static struct run runs[64];
	int pending = 64;
	char sh[64][96];

	memset(runs, 0, sizeof(runs));
	for (int i = 0; i < 64; i++) {
		struct exec_req q;
		req_init(&q);
		snprintf(sh[i], sizeof(sh[i]), "i=0; while [ $i -lt 50 ]; do echo cmd%d-$i; i=$((i+1)); done; exit %d",
			 i, i % 8);
		q.shell = sh[i];
		runs[i].l = l;
		runs[i].pending = &pending;
		assert_int_equal(exec_start(l, g_sys, &q, &h_ops, &runs[i], &runs[i].e), 0);
	}
	run_loop(l, 30000);
	assert_int_equal(pending, 0);
	for (int i = 0; i < 64; i++) {
		char prefix[16];
		assert_true(runs[i].done);
		assert_int_equal(runs[i].r.exit_code, i % 8);
		snprintf(prefix, sizeof(prefix), "cmd%d-", i);
		check_sequence(runs[i].out[1], prefix, 50);
		run_free(&runs[i]);
	}
	loop_free(l);
}

static int g_freed_outputs;
static void free_on_output(struct exec *e, int stream, const void *data, size_t n, void *ud)
{
	(void)stream;
	(void)data;
	(void)n;
	struct loop *l = ud;
	exec_free(e); /* deferred until this callback returns */
	g_freed_outputs++;
	loop_stop(l);
}

static void never_exit(struct exec *e, const struct exec_result *r, void *ud)
{
	(void)e;
	(void)r;
	(void)ud;
	fail_msg("on_exit after exec_free");
}

static void test_free_inside_callback(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct exec_ops ops = {.on_output = free_on_output, .on_exit = never_exit};
	struct exec_req q;
	struct exec *e;

	req_init(&q);
	q.argv = (const char *const[]){"yes", NULL};
	assert_int_equal(exec_start(l, g_sys, &q, &ops, l, &e), 0);
	pid_t pid = exec_pid(e);
	run_loop(l, 5000);
	assert_int_equal(g_freed_outputs, 1);
	assert_int_equal(kill(pid, 0), -1); /* killed and reaped */

	/* exec_free of a running command from outside any callback. */
	req_init(&q);
	q.shell = "sleep 100";
	assert_int_equal(exec_start(l, g_sys, &q, &h_ops, NULL, &e), 0);
	pid = exec_pid(e);
	exec_free(e);
	assert_int_equal(kill(pid, 0), -1);
	loop_free(l);
}

static void test_bad_requests(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct exec_req q;
	struct exec *e;
	const char *argv[] = {"true", NULL};
	const char *empty[] = {NULL};

	req_init(&q);
	assert_int_equal(exec_start(l, g_sys, &q, &h_ops, NULL, &e), -EINVAL); /* neither */
	q.argv = argv;
	q.shell = "true";
	assert_int_equal(exec_start(l, g_sys, &q, &h_ops, NULL, &e), -EINVAL); /* both */
	q.shell = NULL;
	q.argv = empty;
	assert_int_equal(exec_start(l, g_sys, &q, &h_ops, NULL, &e), -EINVAL);
	q.argv = argv;
	q.root_fd = -1;
	assert_int_equal(exec_start(l, g_sys, &q, &h_ops, NULL, &e), -EINVAL);
	struct exec_ops noexit = {.on_output = h_output};
	q.root_fd = g_root;
	assert_int_equal(exec_start(l, g_sys, &q, &noexit, NULL, &e), -EINVAL);
	exec_free(NULL);
	exec_sys_free(NULL);

	/* Allocation failures during start: an error, no child left behind. */
	for (unsigned long n = 1; n < 40; n++) {
		mem_fail_at(n, 0);
		int r = exec_start(l, g_sys, &q, &h_ops, NULL, &e);
		mem_fail_at(0, 0);
		if (r == 0) {
			exec_free(e);
			break;
		}
		assert_int_equal(r, -ENOMEM);
		assert_null(e);
	}
	loop_free(l);
}

/* ---- setup ---- */

static int group_setup(void **state)
{
	(void)state;
	signal(SIGPIPE, SIG_IGN);
	setenv(CANARY, "leaked-from-agent", 1);
	snprintf(g_rootpath, sizeof(g_rootpath), "/tmp/airlock-exec-XXXXXX");
	if (!mkdtemp(g_rootpath) || chmod(g_rootpath, 0755) < 0)
		return -1;
	g_root = open(g_rootpath, O_DIRECTORY | O_RDONLY | O_CLOEXEC);
	if (g_root < 0)
		return -1;
	struct exec_env_in in = {0};
	if (exec_env_build(&in, &g_env, NULL) < 0)
		return -1;
	if (exec_sys_new(NULL, &g_sys) < 0)
		return -1;
	print_message("exec: %s\n", exec_sys_describe(g_sys));
	return 0;
}

static int group_teardown(void **state)
{
	(void)state;
	exec_sys_free(g_sys);
	exec_env_free(g_env);
	close(g_root);
	tu_rm_rf(g_rootpath);
	return 0;
}

static void test_sys_modes(void **state)
{
	(void)state;
	struct exec_sys *s;
	struct exec_sys_cfg off = {.cgroup = EXEC_CGROUP_OFF};
	struct exec_sys_cfg badname = {.cgroup_name = "../x"};

	assert_int_equal(exec_sys_new(&off, &s), 0);
	assert_int_equal(exec_sys_caps(s), 0);
	exec_sys_free(s);
	assert_int_equal(exec_sys_new(&badname, &s), -EINVAL);
	assert_null(s);
}

/* ---- confinement: Landlock + seccomp (exec_confine_*) ---- */

static void test_confine(void **state)
{
	char hidden[] = "/tmp/airlock-confine-hidden.XXXXXX", out[128], cmd[1024], err[512], secret[128];
	struct exec_confine *c = NULL;
	struct loop *l = loop_new();
	int fd;

	(void)state;
	assert_non_null(mkdtemp(hidden));
	snprintf(secret, sizeof(secret), "%s/secret", hidden);
	assert_true((fd = open(secret, O_WRONLY | O_CREAT | O_CLOEXEC, 0644)) >= 0);
	assert_int_equal(write(fd, "s3cret\n", 7), 7);
	close(fd);
	snprintf(out, sizeof(out), "/tmp/airlock-confine-out.%d", (int)getpid());
	const char *writable[] = {g_rootpath, NULL}, *hide[] = {hidden, NULL};
	struct exec_confine_cfg cfg = {.writable = writable, .hidden = hide};
	int r = exec_confine_new(&cfg, &c, err, sizeof(err));
	assert_int_equal(r, 0);
	print_message("confine: %s\n", exec_confine_describe(c));

	static const struct {
		const char *sh; /* $H = hidden dir, $O = a path outside the writable set */
		const char *confined, *free;
	} probes[] = {
	    {"cat $H/secret 2>/dev/null || echo denied", "denied\n", "s3cret\n"},
	    {"ls $H", "secret\n", "secret\n"},
	    {"echo x >inside && cat inside", "x\n", "x\n"},
	    {"echo x >$O 2>/dev/null && echo wrote || echo denied; rm -f $O", "denied\n", "wrote\n"},
	    {"head -c 4 /etc/passwd; echo", "root\n", "root\n"},
	    {"unshare -U true 2>/dev/null && echo unshared || echo denied", "denied\n", "unshared\n"},
	    {"grep NoNewPrivs /proc/self/status", "NoNewPrivs:\t1\n", "NoNewPrivs:\t0\n"},
	};
	for (size_t i = 0; i < sizeof(probes) / sizeof(probes[0]); i++) {
		for (int confined = 0; confined < 2; confined++) {
			struct run run = {0};
			struct exec_req q;
			req_init(&q);
			snprintf(cmd, sizeof(cmd), "H=%s; O=%s; %s", hidden, out, probes[i].sh);
			q.shell = cmd;
			q.confine = confined ? c : NULL;
			run_req(l, g_sys, &q, &run);
			const char *want = confined ? probes[i].confined : probes[i].free;
			if (!run.out[1] || strcmp(run.out[1], want))
				fail_msg("probe '%s' (%s): got '%s', want '%s'", cmd, confined ? "confined" : "free",
					 run.out[1] ? run.out[1] : "", want);
			run_free(&run);
		}
	}
	exec_confine_free(c);
	exec_confine_free(NULL);
	unlink(secret);
	rmdir(hidden);
	unlink(out);
	loop_free(l);
}

/* exec_cgroup_*: a tree the caller forks itself (the local sandbox) joins
 * a cgroup with a pids limit; forks past it fail; freeing kills what is
 * left and removes it. */
static void test_cgroup_for_tree(void **state)
{
	(void)state;
	if (!(exec_sys_caps(g_sys) & (EXEC_CAP_CG2_PIDS | EXEC_CAP_CG1_PIDS))) {
		print_message("SKIP cgroup for a tree: no pids cgroup (%s)\n", exec_sys_describe(g_sys));
		skip();
	}
	struct exec_limits lim = {.pids_max = 16, .memory_max = 64u << 20};
	struct exec_cgroup *cg = NULL;
	int go[2], res[2];
	pid_t pid;

	assert_int_equal(exec_cgroup_new(g_sys, &lim, &cg), 0);
	assert_true(exec_cgroup_limits(cg) & EXEC_CGROUP_PIDS);
	assert_non_null(exec_cgroup_dir(cg));
	assert_int_equal(pipe(go), 0);
	assert_int_equal(pipe(res), 0);
	assert_true((pid = fork()) >= 0);
	if (pid == 0) {
		char c;
		int n = 0;
		close(go[1]);
		close(res[0]);
		if (read(go[0], &c, 1) != 1)
			_exit(2);
		/* fork sleepers until refused: 16 with ourselves */
		for (int i = 0; i < 64; i++) {
			pid_t k = fork();
			if (k == 0) {
				pause();
				_exit(0);
			}
			if (k < 0)
				break;
			n++;
		}
		_exit(write(res[1], &n, sizeof(n)) == (ssize_t)sizeof(n) ? 0 : 3);
	}
	close(go[0]);
	close(res[1]);
	assert_int_equal(exec_cgroup_attach(cg, pid), 0);
	assert_int_equal(write(go[1], "g", 1), 1);
	int n = -1;
	assert_int_equal(read(res[0], &n, sizeof(n)), (ssize_t)sizeof(n));
	print_message("cgroup for a tree (%s): %d forks under pids 16\n", exec_cgroup_dir(cg), n);
	assert_int_equal(n, 15);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	char dir[4096];
	snprintf(dir, sizeof(dir), "%s", exec_cgroup_dir(cg));
	exec_cgroup_free(cg); /* the 15 sleepers die with it */
	assert_int_equal(access(dir, F_OK), -1);
	close(go[1]);
	close(res[0]);
	exec_cgroup_free(NULL);
}

/* The seccomp filter's answers, asked straight from a confined child (no
 * execve in between): socket families, io_uring, userfaultfd, x32. */

static long sc_socket(long family, long type, long proto)
{
	long fd = syscall(SYS_socket, family, type | SOCK_CLOEXEC, proto);
	if (fd >= 0)
		close((int)fd);
	return fd;
}

static long sc_socketpair(long family, long type)
{
	int sv[2];
	long r = syscall(SYS_socketpair, family, type | SOCK_CLOEXEC, 0, sv);
	if (r == 0) {
		close(sv[0]);
		close(sv[1]);
	}
	return r;
}

enum {
	P_INET,
	P_INET6,
	P_UNIX,
	P_PAIR_UNIX,
	P_NL_ROUTE,
	P_NL_UEVENT,
	P_VSOCK,
	P_VSOCK_HIGH,
	P_PAIR_VSOCK,
	P_PACKET,
	P_URING_SETUP,
	P_URING_ENTER,
	P_URING_REGISTER,
	P_UFFD,
	P_X32_SOCKET,
	P_FSIZE,
	P_N
};

/* errno of probe i (0 when it succeeded). */
static int sc_probe(int i)
{
	char params[120] = {0}; /* struct io_uring_params */
	long r;

	errno = 0;
	switch (i) {
	case P_INET:
		r = sc_socket(AF_INET, SOCK_STREAM, 0);
		break;
	case P_INET6:
		r = sc_socket(AF_INET6, SOCK_DGRAM, 0);
		break;
	case P_UNIX:
		r = sc_socket(AF_UNIX, SOCK_STREAM, 0);
		break;
	case P_PAIR_UNIX:
		r = sc_socketpair(AF_UNIX, SOCK_STREAM);
		break;
	case P_NL_ROUTE:
		r = sc_socket(AF_NETLINK, SOCK_RAW, NETLINK_ROUTE);
		break;
	case P_NL_UEVENT:
		r = sc_socket(AF_NETLINK, SOCK_RAW, NETLINK_KOBJECT_UEVENT);
		break;
	case P_VSOCK:
		r = sc_socket(AF_VSOCK, SOCK_STREAM, 0);
		break;
	/* the kernel reads the family as an int: high bits must not hide it */
	case P_VSOCK_HIGH:
		r = sc_socket((long)((1UL << 32) | AF_VSOCK), SOCK_STREAM, 0);
		break;
	case P_PAIR_VSOCK:
		r = sc_socketpair(AF_VSOCK, SOCK_STREAM);
		break;
	case P_PACKET:
		r = sc_socket(AF_PACKET, SOCK_RAW, 0);
		break;
	case P_URING_SETUP:
		r = syscall(SYS_io_uring_setup, 4, params);
		break;
	case P_URING_ENTER:
		r = syscall(SYS_io_uring_enter, -1, 0, 0, 0, NULL, 0);
		break;
	case P_URING_REGISTER:
		r = syscall(SYS_io_uring_register, -1, 0, NULL, 0);
		break;
	case P_UFFD:
		r = syscall(SYS_userfaultfd, O_CLOEXEC);
		break;
#if defined(__x86_64__)
	case P_X32_SOCKET:
		r = syscall(0x40000000L | SYS_socket, AF_INET, SOCK_STREAM, 0);
		break;
#else
	case P_X32_SOCKET:
		errno = EPERM;
		r = -1;
		break;
#endif
	case P_FSIZE: {
		/* file_max became RLIMIT_FSIZE (EFBIG when it did not) */
		struct rlimit rl;
		r = getrlimit(RLIMIT_FSIZE, &rl) == 0 && rl.rlim_cur == (1u << 20) ? 0 : -1;
		errno = EFBIG;
		break;
	}
	default:
		return -1;
	}
	if (r >= 0 && (i == P_URING_SETUP || i == P_UFFD))
		close((int)r);
	return r < 0 ? errno : 0;
}

/* Run every probe in a child, confined by c (or not), errnos into out. */
static void sc_run(const struct exec_confine *c, int out[P_N])
{
	int p[2];
	pid_t pid;

	assert_int_equal(pipe(p), 0);
	assert_true((pid = fork()) >= 0);
	if (pid == 0) {
		int res[P_N];
		close(p[0]);
		if (c && exec_confine_apply(c) < 0)
			_exit(3);
		for (int i = 0; i < P_N; i++)
			res[i] = sc_probe(i);
		_exit(write(p[1], res, sizeof(res)) == (ssize_t)sizeof(res) ? 0 : 4);
	}
	close(p[1]);
	assert_int_equal(read(p[0], out, sizeof(int) * P_N), (ssize_t)(sizeof(int) * P_N));
	close(p[0]);
	int st;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
}

static void test_confine_syscalls(void **state)
{
	static const struct {
		int probe;
		const char *name;
		int want; /* confined; -1: whatever the unconfined call answers */
	} cases[] = {
	    {P_INET, "socket(AF_INET)", -1},
	    {P_INET6, "socket(AF_INET6)", -1},
	    {P_UNIX, "socket(AF_UNIX)", 0},
	    {P_PAIR_UNIX, "socketpair(AF_UNIX)", 0},
	    {P_NL_ROUTE, "socket(AF_NETLINK, NETLINK_ROUTE)", -1},
	    {P_NL_UEVENT, "socket(AF_NETLINK, NETLINK_KOBJECT_UEVENT)", EAFNOSUPPORT},
	    {P_VSOCK, "socket(AF_VSOCK)", EAFNOSUPPORT},
	    {P_VSOCK_HIGH, "socket(1<<32 | AF_VSOCK)", EAFNOSUPPORT},
	    {P_PAIR_VSOCK, "socketpair(AF_VSOCK)", EAFNOSUPPORT},
	    {P_PACKET, "socket(AF_PACKET)", EAFNOSUPPORT},
	    {P_URING_SETUP, "io_uring_setup", ENOSYS},
	    {P_URING_ENTER, "io_uring_enter", ENOSYS},
	    {P_URING_REGISTER, "io_uring_register", ENOSYS},
	    {P_UFFD, "userfaultfd", EPERM},
	    {P_X32_SOCKET, "x32 socket", EPERM},
	    {P_FSIZE, "RLIMIT_FSIZE = file_max", 0},
	};
	const char *writable[] = {g_rootpath, NULL};
	struct exec_confine_cfg cfg = {.writable = writable, .file_max = 1u << 20};
	struct exec_confine *c = NULL;
	int freed[P_N], conf[P_N], bad = 0;
	char err[512];

	(void)state;
	assert_int_equal(exec_confine_new(&cfg, &c, err, sizeof(err)), 0);
	sc_run(NULL, freed);
	sc_run(c, conf);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		int p = cases[i].probe, want = cases[i].want < 0 ? freed[p] : cases[i].want;
		print_message("%-44s free: %-24s confined: %s\n", cases[i].name, freed[p] ? strerror(freed[p]) : "ok",
			      conf[p] ? strerror(conf[p]) : "ok");
		if (conf[p] != want) {
			print_error("%s confined: got %s, want %s\n", cases[i].name,
				    conf[p] ? strerror(conf[p]) : "success", want ? strerror(want) : "success");
			bad++;
		}
	}
	exec_confine_free(c);
	assert_int_equal(bad, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_sys_modes),
	    cmocka_unit_test(test_bad_requests),
	    cmocka_unit_test(test_exit_codes),
	    cmocka_unit_test(test_signal_death),
	    cmocka_unit_test(test_timeout_kills_setsid_grandchild),
	    cmocka_unit_test(test_timeout_no_cgroup),
	    cmocka_unit_test(test_cancel),
	    cmocka_unit_test(test_stdin_round_trip),
	    cmocka_unit_test(test_streams_in_order),
	    cmocka_unit_test(test_binary_output),
	    cmocka_unit_test(test_output_hold),
	    cmocka_unit_test(test_large_output_pause),
	    cmocka_unit_test(test_tty),
	    cmocka_unit_test(test_env_build),
	    cmocka_unit_test(test_env_canary_absent),
	    cmocka_unit_test(test_cwd_confinement),
	    cmocka_unit_test(test_uid_drop),
	    cmocka_unit_test(test_fork_bomb),
	    cmocka_unit_test(test_memory_limit),
	    cmocka_unit_test(test_lingering),
	    cmocka_unit_test(test_concurrent_64),
	    cmocka_unit_test(test_free_inside_callback),
	    cmocka_unit_test(test_confine),
	    cmocka_unit_test(test_confine_syscalls),
	    cmocka_unit_test(test_cgroup_for_tree),
	};
	return cmocka_run_group_tests(tests, group_setup, group_teardown);
}
