/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cred: the user's credentials.json (every error names the file and key),
 * resolution through real source processes (a shell script that counts its
 * runs), the ttl cache under a fake clock and failing/oversized/slow
 * sources.
 */
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/host/cred.h"
#include "airlock/policy/policy.h"

static char g_dir[256];	  /* private temp dir */
static char g_cfg[300];	  /* g_dir/airlock/credentials.json */
static char g_src[300];	  /* g_dir/src.sh */
static char g_count[300]; /* g_dir/count */

static void write_file(const char *path, mode_t mode, const char *fmt, ...)
{
	va_list ap;
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	va_start(ap, fmt);
	vfprintf(f, fmt, ap);
	va_end(ap);
	assert_int_equal(fclose(f), 0);
	assert_int_equal(chmod(path, mode), 0);
}

static int setup(void **state)
{
	char d[320];
	(void)state;
	tu_tmpdir(g_dir, sizeof(g_dir), "cred");
	snprintf(d, sizeof(d), "%s/airlock", g_dir);
	assert_int_equal(mkdir(d, 0700), 0);
	snprintf(g_cfg, sizeof(g_cfg), "%s/airlock/credentials.json", g_dir);
	snprintf(g_src, sizeof(g_src), "%s/src.sh", g_dir);
	snprintf(g_count, sizeof(g_count), "%s/count", g_dir);
	/* $1 = mode: ok | fail | big | slow | nl2 */
	write_file(
	    g_src, 0700,
	    "#!/bin/sh\n"
	    "echo run >>%s\n"
	    "n=$(wc -l <%s)\n"
	    "case \"$1\" in\n"
	    "ok) printf 'v%%s-%%s-%%s-%%s\\n' \"$n\" \"$AIRLOCK_CRED_NAME\" \"$AIRLOCK_CRED_SCOPE\" "
	    "\"$AIRLOCK_CRED_TTL\" ;;\n"
	    "fail) echo 'stdout-secret-must-not-show'; echo 'first line' >&2; echo 'access denied' >&2; exit 3 ;;\n"
	    "big) head -c 20000 /dev/zero | tr '\\0' x ;;\n"
	    "slow) sleep 5; echo late ;;\n"
	    "nl2) printf 'two\\n\\n' ;;\n"
	    "env) env | sort | tr '\\n' ' ' ;;\n"
	    "esac\n",
	    g_count, g_count);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	tu_rm_rf(g_dir);
	return 0;
}

static unsigned runs(void)
{
	FILE *f = fopen(g_count, "r");
	unsigned n = 0;
	int ch;
	if (!f)
		return 0;
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

/* ---- configuration errors ---- */

static void expect_config_error(const char *json, mode_t mode, int want, const char *needle)
{
	struct cred_config *cfg = (struct cred_config *)1;
	char err[1024] = "";
	write_file(g_cfg, mode, "%s", json);
	int r = cred_config_load(g_cfg, &cfg, err, sizeof(err));
	if (r != want || !strstr(err, needle) || !strstr(err, g_cfg))
		fail_msg("config %s (mode %o): got %d '%s', want %d with '%s'", json, (unsigned)mode, r, err, want,
			 needle);
	assert_null(cfg);
}

static void test_config_errors(void **state)
{
	static const struct {
		const char *json;
		const char *needle;
	} bad[] = {
	    {"not json", "not valid JSON"},
	    {"[]", "expected an object"},
	    {"{\"sauces\": {}}", "sauces: unknown key"},
	    {"{\"sources\": []}", "sources: expected an object"},
	    {"{\"sources\": {\"a\": \"gh auth token\"}}", "sources.a: expected an object"},
	    {"{\"sources\": {\"a\": {\"command\": \"gh auth token\"}}}",
	     "sources.a.command: expected a non-empty array"},
	    {"{\"sources\": {\"a\": {\"command\": []}}}", "sources.a.command: expected a non-empty array"},
	    {"{\"sources\": {\"a\": {\"command\": [\"gh\", 3]}}}", "sources.a.command[1]"},
	    {"{\"sources\": {\"a\": {\"command\": [\"\"]}}}", "sources.a.command[0]"},
	    {"{\"sources\": {\"a\": {\"command\": [\"x\"], \"timeout_seconds\": 0}}}", "sources.a.timeout_seconds"},
	    {"{\"sources\": {\"a\": {\"command\": [\"x\"], \"timeout_seconds\": 301}}}", "sources.a.timeout_seconds"},
	    {"{\"sources\": {\"a\": {\"command\": [\"x\"], \"shell\": true}}}", "sources.a.shell: unknown key"},
	    {"{\"sources\": {\"a\": {\"command\": [\"x\"]}, \"a\": {\"command\": [\"y\"]}}}", "not valid JSON"},
	};
	char big[CRED_CONFIG_MAX + 16];
	(void)state;

	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_config_error(bad[i].json, 0600, -EINVAL, bad[i].needle);
	/* permissions: group/world writable file, someone else's file, a writable directory */
	expect_config_error("{}", 0620, -EPERM, "writable by group or others");
	expect_config_error("{}", 0602, -EPERM, "writable by group or others");
	memset(big, ' ', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	big[0] = '{';
	big[sizeof(big) - 2] = '}';
	expect_config_error(big, 0600, -EFBIG, "larger than");
	if (geteuid() == 0) {
		write_file(g_cfg, 0600, "{}");
		assert_int_equal(chown(g_cfg, 4242, 4242), 0);
		struct cred_config *cfg = NULL;
		char err[512];
		assert_int_equal(cred_config_load(g_cfg, &cfg, err, sizeof(err)), -EPERM);
		assert_non_null(strstr(err, "owned by uid 4242"));
		assert_int_equal(chown(g_cfg, 0, 0), 0);
	} else {
		print_message("skip: owner check needs root to chown\n");
	}
	{
		char d[320], err[512];
		struct cred_config *cfg = NULL;
		snprintf(d, sizeof(d), "%s/airlock", g_dir);
		write_file(g_cfg, 0600, "{}");
		assert_int_equal(chmod(d, 0777), 0);
		assert_int_equal(cred_config_load(g_cfg, &cfg, err, sizeof(err)), -EPERM);
		assert_non_null(strstr(err, "its directory"));
		assert_int_equal(chmod(d, 0700), 0);
		unlink(g_cfg);
		assert_int_equal(cred_config_load(g_cfg, &cfg, err, sizeof(err)), -ENOENT);
		assert_non_null(strstr(err, "doc/CREDENTIALS.md"));
	}
}

static void test_config_ok(void **state)
{
	struct cred_config *cfg = NULL;
	char err[512];
	unsigned t = 0;
	const char *const *argv;
	(void)state;

	write_file(g_cfg, 0600,
		   "{\"sources\": {\"tok\": {\"command\": [\"gh\", \"auth\", \"token\"], \"timeout_seconds\": 7},"
		   " \"db\": {\"command\": [\"/bin/echo\"]}}}");
	assert_int_equal(cred_config_load(g_cfg, &cfg, err, sizeof(err)), 0);
	argv = cred_config_source(cfg, "tok", &t);
	assert_non_null(argv);
	assert_string_equal(argv[0], "gh");
	assert_string_equal(argv[2], "token");
	assert_null(argv[3]);
	assert_int_equal(t, 7);
	assert_non_null(cred_config_source(cfg, "db", &t));
	assert_int_equal(t, CRED_TIMEOUT_S_DEFAULT);
	assert_null(cred_config_source(cfg, "nope", &t));
	cred_config_free(cfg);
	cred_config_free(NULL);
}

static void test_config_path(void **state)
{
	char p[512];
	(void)state;
	setenv("XDG_CONFIG_HOME", "/x/cfg", 1);
	assert_int_equal(cred_config_path(p, sizeof(p)), 0);
	assert_string_equal(p, "/x/cfg/airlock/credentials.json");
	setenv("XDG_CONFIG_HOME", "relative", 1); /* not absolute: ignored, like the XDG spec says */
	setenv("HOME", "/home/u", 1);
	assert_int_equal(cred_config_path(p, sizeof(p)), 0);
	assert_string_equal(p, "/home/u/.config/airlock/credentials.json");
	assert_int_equal(cred_config_path(p, 10), -ENAMETOOLONG);
	unsetenv("XDG_CONFIG_HOME");
}

/* ---- resolution ---- */

static uint64_t g_now;
static uint64_t fake_now(void *ud)
{
	(void)ud;
	return g_now;
}

struct waiter {
	struct loop *l;
	bool done;
	int err;
	char msg[1024];
};

static void on_done(int err, const char *msg, void *ud)
{
	struct waiter *w = ud;
	w->done = true;
	w->err = err;
	snprintf(w->msg, sizeof(w->msg), "%s", msg ? msg : "");
	loop_stop(w->l);
}

static void stop_timer(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
	fail_msg("resolution did not finish in time");
}

/* cred_refresh and run the loop until it reports. */
static int refresh(struct cred *c, struct loop *l, char *msg, size_t n)
{
	struct waiter w = {.l = l};
	struct cred_wait *cw = NULL;
	uint64_t t;
	assert_int_equal(cred_refresh(c, on_done, &w, &cw), 0);
	assert_false(w.done); /* never inside the call */
	t = loop_add_timer(l, 15000, stop_timer, NULL);
	assert_int_equal(loop_run(l), 0);
	loop_del_timer(l, t);
	assert_true(w.done);
	if (msg)
		snprintf(msg, n, "%s", w.msg);
	return w.err;
}

struct fixture {
	struct loop *l;
	struct cred *c;
	struct policy_inject inj;
	struct policy_credentials pc;
	const char *fwd[3];
};

static void fixture_new(struct fixture *f, const char *mode, int64_t ttl, unsigned timeout_s)
{
	char err[512];
	struct cred_opts o = {.config_path = g_cfg, .now_ms = fake_now};
	memset(f, 0, sizeof(*f));
	unlink(g_count);
	write_file(g_cfg, 0600, "{\"sources\": {\"src\": {\"command\": [\"%s\", \"%s\"], \"timeout_seconds\": %u}}}",
		   g_src, mode, timeout_s);
	{ /* the file is valid */
		struct cred_config *cfg = NULL;
		assert_int_equal(cred_config_load(g_cfg, &cfg, err, sizeof(err)), 0);
		cred_config_free(cfg);
	}
	f->inj = (struct policy_inject){.name = "TOKEN", .scope = "read:repo", .value_from = "src", .ttl_seconds = ttl};
	f->fwd[0] = "CRED_TEST_FWD";
	f->fwd[1] = "CRED_TEST_UNSET";
	f->pc = (struct policy_credentials){.forward_env = {f->fwd, 2}, .inject = &f->inj, .n_inject = 1};
	setenv("CRED_TEST_FWD", "forwarded", 1);
	unsetenv("CRED_TEST_UNSET");
	assert_non_null(f->l = loop_new());
	g_now = 1000000;
	assert_int_equal(cred_new(f->l, &f->pc, &o, &f->c), 0);
}

static void fixture_free(struct fixture *f)
{
	cred_free(f->c);
	loop_free(f->l);
}

static void test_forward_only(void **state)
{
	struct fixture f;
	struct cred_env *e = NULL;
	(void)state;
	fixture_new(&f, "ok", 60, 5);
	setenv("CRED_TEST_FWD", "changed later", 1); /* read once, at cred_new */
	assert_int_equal(cred_env(f.c, false, &e), 0);
	assert_int_equal(e->n, 1);
	assert_string_equal(e->v[0], "CRED_TEST_FWD=forwarded");
	cred_env_free(e);
	assert_true(cred_has_inject(f.c));
	assert_int_equal(cred_env(f.c, true, &e), -EAGAIN);
	assert_null(e);
	assert_int_equal(runs(), 0); /* nothing ran yet */
	fixture_free(&f);
}

static void test_ttl(void **state)
{
	struct fixture f;
	struct cred_env *e = NULL;
	char msg[1024];
	(void)state;
	fixture_new(&f, "ok", 60, 5);
	assert_int_equal(refresh(f.c, f.l, msg, sizeof(msg)), 0);
	assert_int_equal(cred_env(f.c, true, &e), 0);
	assert_int_equal(e->n, 2);
	assert_string_equal(e->v[0], "CRED_TEST_FWD=forwarded");
	assert_string_equal(e->v[1], "TOKEN=v1-TOKEN-read:repo-60"); /* newline stripped, scope and ttl passed */
	cred_env_free(e);
	g_now += 59999; /* still fresh: reused, no new run */
	assert_int_equal(cred_env(f.c, true, &e), 0);
	assert_string_equal(e->v[1], "TOKEN=v1-TOKEN-read:repo-60");
	cred_env_free(e);
	assert_int_equal(runs(), 1);
	g_now += 1; /* expired */
	assert_int_equal(cred_env(f.c, true, &e), -EAGAIN);
	assert_int_equal(refresh(f.c, f.l, msg, sizeof(msg)), 0);
	assert_int_equal(cred_env(f.c, true, &e), 0);
	assert_string_equal(e->v[1], "TOKEN=v2-TOKEN-read:repo-60");
	cred_env_free(e);
	assert_int_equal(runs(), 2);
	assert_int_equal(cred_resolutions(f.c), 2);
	/* a refresh with everything fresh starts nothing and still reports */
	assert_int_equal(refresh(f.c, f.l, msg, sizeof(msg)), 0);
	assert_int_equal(runs(), 2);
	fixture_free(&f);
}

static void test_concurrent_waits(void **state)
{
	struct fixture f;
	struct waiter a = {0}, b = {0};
	struct cred_wait *wa, *wb;
	(void)state;
	fixture_new(&f, "ok", 60, 5);
	a.l = b.l = f.l;
	assert_int_equal(cred_refresh(f.c, on_done, &a, &wa), 0);
	assert_int_equal(cred_refresh(f.c, on_done, &b, &wb), 0);
	while (!a.done || !b.done)
		assert_int_equal(loop_run(f.l), 0);
	assert_int_equal(a.err, 0);
	assert_int_equal(b.err, 0);
	assert_int_equal(runs(), 1); /* one source run serves both */
	fixture_free(&f);
}

static void expect_failure(const char *mode, unsigned timeout_s, const char *needle)
{
	struct fixture f;
	struct cred_env *e = NULL;
	char msg[1024];
	fixture_new(&f, mode, 60, timeout_s);
	assert_int_equal(refresh(f.c, f.l, msg, sizeof(msg)), -EIO);
	if (!strstr(msg, needle) || !strstr(msg, "credential TOKEN: source 'src'"))
		fail_msg("mode %s: message '%s' lacks '%s'", mode, msg, needle);
	assert_null(strstr(msg, "stdout-secret"));	    /* stdout never reaches a message */
	assert_int_equal(cred_env(f.c, true, &e), -EAGAIN); /* nothing cached */
	fixture_free(&f);
}

static void test_source_failures(void **state)
{
	(void)state;
	expect_failure("fail", 5, "failed with status 3: access denied");
	expect_failure("big", 5, "printed more than 16384 bytes");
	expect_failure("none", 5, "printed nothing");
	uint64_t t0 = loop_now_ms();
	expect_failure("slow", 1, "timed out");
	assert_true(loop_now_ms() - t0 < 4000); /* killed, not waited for */
}

static void test_source_env_and_newline(void **state)
{
	struct fixture f;
	struct cred_env *e = NULL;
	(void)state;
	setenv("CRED_TEST_CANARY", "daemon-only", 1);
	fixture_new(&f, "nl2", 60, 5);
	assert_int_equal(refresh(f.c, f.l, NULL, 0), 0);
	assert_int_equal(cred_env(f.c, true, &e), 0);
	assert_string_equal(e->v[1], "TOKEN=two\n"); /* one trailing newline stripped, no more */
	cred_env_free(e);
	fixture_free(&f);
	fixture_new(&f, "env", 60, 5);
	assert_int_equal(refresh(f.c, f.l, NULL, 0), 0);
	assert_int_equal(cred_env(f.c, true, &e), 0);
	assert_non_null(strstr(e->v[1], "AIRLOCK_CRED_NAME=TOKEN "));
	assert_non_null(strstr(e->v[1], "AIRLOCK_CRED_TTL=60 "));
	assert_non_null(strstr(e->v[1], "PATH="));
	assert_null(strstr(e->v[1], "CRED_TEST_CANARY")); /* the daemon's environment stays out */
	assert_null(strstr(e->v[1], "CRED_TEST_FWD"));
	cred_env_free(e);
	fixture_free(&f);
	unsetenv("CRED_TEST_CANARY");
}

static void test_missing_source(void **state)
{
	struct fixture f;
	char msg[1024];
	(void)state;
	fixture_new(&f, "ok", 60, 5);
	f.inj.value_from = NULL; /* looks for "TOKEN", which the file lacks */
	cred_free(f.c);
	struct cred_opts o = {.config_path = g_cfg, .now_ms = fake_now};
	assert_int_equal(cred_new(f.l, &f.pc, &o, &f.c), 0);
	assert_int_equal(refresh(f.c, f.l, msg, sizeof(msg)), -EIO);
	assert_non_null(strstr(msg, "has no source \"TOKEN\""));
	/* a config inside the workspace is refused: the repository must not choose sources */
	{
		struct cred *inside = NULL;
		struct cred_opts wo = {.config_path = g_cfg, .now_ms = fake_now, .workspace = g_dir};
		f.inj.value_from = "src";
		assert_int_equal(cred_new(f.l, &f.pc, &wo, &inside), 0);
		assert_int_equal(refresh(inside, f.l, msg, sizeof(msg)), -EIO);
		assert_non_null(strstr(msg, "is inside the workspace"));
		cred_free(inside);
		f.inj.value_from = NULL;
	}
	/* a config that became group-writable is refused at the next resolution */
	assert_int_equal(chmod(g_cfg, 0660), 0);
	assert_int_equal(refresh(f.c, f.l, msg, sizeof(msg)), -EIO);
	assert_non_null(strstr(msg, "writable by group or others"));
	assert_int_equal(runs(), 0);
	fixture_free(&f);
}

/* Every allocation failure becomes -ENOMEM, never a crash or a leak (the
 * sanitizer build checks the leaks). */
static void test_alloc_failures(void **state)
{
	struct cred_config *cfg = NULL;
	struct fixture f;
	struct cred_env *e = NULL;
	char err[512];
	unsigned long used, c0;
	int r;
	(void)state;

	write_file(g_cfg, 0600, "{\"sources\": {\"a\": {\"command\": [\"x\", \"y\"]}, \"b\": {\"command\": [\"z\"]}}}");
	c0 = mem_count();
	assert_int_equal(cred_config_load(g_cfg, &cfg, err, sizeof(err)), 0);
	used = mem_count() - c0;
	cred_config_free(cfg);
	for (unsigned long k = 1; k <= used; k++) {
		cfg = NULL;
		mem_fail_at(k, 0);
		r = cred_config_load(g_cfg, &cfg, err, sizeof(err));
		mem_fail_at(0, 0);
		if (r == 0)
			cred_config_free(cfg);
		else if (r != -ENOMEM)
			fail_msg("allocation %lu: %d %s", k, r, err);
	}
	/* cred_new and cred_env (the values themselves are sodium_malloc'd) */
	fixture_new(&f, "ok", 60, 5);
	assert_int_equal(refresh(f.c, f.l, NULL, 0), 0);
	for (unsigned long k = 1; k <= 4; k++) {
		mem_fail_at(k, 0);
		r = cred_env(f.c, true, &e);
		mem_fail_at(0, 0);
		assert_true(r == 0 || r == -ENOMEM);
		cred_env_free(e);
		e = NULL;
	}
	fixture_free(&f);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_config_errors),
	    cmocka_unit_test(test_config_ok),
	    cmocka_unit_test(test_config_path),
	    cmocka_unit_test(test_forward_only),
	    cmocka_unit_test(test_ttl),
	    cmocka_unit_test(test_concurrent_waits),
	    cmocka_unit_test(test_source_failures),
	    cmocka_unit_test(test_source_env_and_newline),
	    cmocka_unit_test(test_missing_source),
	    cmocka_unit_test(test_alloc_failures),
	};
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, setup, teardown);
}
