/* SPDX-License-Identifier: Apache-2.0 */
/*
 * route: execution.local's prefix matching, the vetting of a local
 * request's env and git options, and git's hardening environment
 * (route.h), table-driven; every allocation failure of route_git_env.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include <cmocka.h>

#include "airlock/core/mem.h"
#include "airlock/host/gitargs.h"
#include "airlock/host/route.h"

static void test_match_local(void **state)
{
	static const char *const pre[] = {"git status", "  make   test ", ""};
	static const struct {
		const char *argv[4];
		size_t argc;
		bool want;
	} t[] = {
	    {{"git", "status"}, 2, true}, {{"git", "status", "--short"}, 3, true}, {{"git", "statusx"}, 2, false},
	    {{"git"}, 1, false},	  {{"/usr/bin/git", "status"}, 2, false},  {{"make", "test", "-j4"}, 3, true},
	    {{"make"}, 1, false},	  {{"sh", "-c", "git status"}, 3, false},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (route_match_local(pre, 3, t[i].argv, t[i].argc) != t[i].want)
			fail_msg("case %zu: want %d", i, t[i].want);
	assert_false(route_match_local(pre, 0, t[0].argv, 2));
}

static void test_local_check(void **state)
{
	static const char *const pre[] = {"git status", "git diff", "git", "make test", "printenv"};
	static const struct {
		const char *argv[6];
		size_t argc;
		const char *env[2];
		size_t nenv;
		const char *why; /* NULL = allowed */
	} t[] = {
	    {{"git", "status"}, 2, {"LANG=C", "LC_ALL=C"}, 2, NULL},
	    {{"git", "commit", "-m", "x"}, 4, {"GIT_AUTHOR_NAME=a", "TERM=dumb"}, 2, NULL},
	    {{"git", "--no-pager", "log"}, 3, {0}, 0, NULL},
	    {{"git", "--version"}, 2, {0}, 0, NULL},
	    {{"git", "status"}, 2, {"TZ=Europe/Paris", "LC_TIME=de_DE.UTF-8"}, 2, NULL},
	    {{"git", "status"}, 2, {"TZ=UTC+3", "COLUMNS=120"}, 2, NULL},
	    {{"git", "status"}, 2, {"TZ=EST5EDT,M3.2.0,M11.1.0", "TZ=:Asia/Tokyo"}, 2, NULL},
	    {{"git", "status"}, 2, {"LD_PRELOAD=/w/evil.so"}, 1, "env LD_PRELOAD is not allowed"},
	    {{"git", "status"}, 2, {"PATH=/w/bin"}, 1, "env PATH is not allowed"},
	    {{"git", "status"}, 2, {"GIT_EXEC_PATH=/w"}, 1, "env GIT_EXEC_PATH is not allowed"},
	    {{"git", "status"}, 2, {"HOME=/w"}, 1, "env HOME is not allowed"},
	    {{"git", "status"}, 2, {"LC_=x"}, 1, "env LC_ is not allowed"},
	    /* values that are paths */
	    {{"git", "status"}, 2, {"TZ=/etc/shadow"}, 1, "env TZ: the value is a path"},
	    {{"git", "status"}, 2, {"TZ=:/etc/shadow"}, 1, "env TZ: the value is a path"},
	    {{"git", "status"}, 2, {"TZ=../../../etc/shadow"}, 1, "env TZ: the value climbs"},
	    {{"git", "status"}, 2, {"TZ=Europe/$(x)"}, 1, "env TZ: the value has characters"},
	    {{"git", "status"}, 2, {"LC_ALL=/tmp/evil"}, 1, "env LC_ALL: the value names a file"},
	    {{"git", "status"}, 2, {"LANG=../../tmp/x"}, 1, "env LANG: the value names a file"},
	    {{"git", "status"}, 2, {"LC_MESSAGES=C/x"}, 1, "env LC_MESSAGES: the value names a file"},
	    {{"git", "status"}, 2, {"TERM=/tmp/terminfo"}, 1, "env TERM: the value names a file"},
	    {{"git", "status"}, 2, {"COLUMNS=1e9"}, 1, "env COLUMNS: the value is not a number"},
	    /* git: the positive model (gitargs.h, tests/unit/host/test_gitargs.c) */
	    {{"git", "-c", "core.hooksPath=h", "commit"}, 4, {0}, 0, "option '-c' is not allowed"},
	    {{"/usr/bin/git", "--exec-path=/w", "status"}, 3, {0}, 0, "option '--exec-path' is not allowed"},
	    {{"git", "-C", "/", "status"}, 4, {0}, 0, "option '-C' is not allowed"},
	    {{"git", "--config-env=core.pager=X", "log"}, 3, {0}, 0, "option '--config-env' is not allowed"},
	    {{"git", "diff", "--no-index", "/etc/shadow", "/dev/null"},
	     5,
	     {0},
	     0,
	     "option '--no-index' is not allowed"},
	    {{"git", "diff", "--output=/tmp/x"}, 3, {0}, 0, "option '--output' is not allowed"},
	    /* other programs: exactly as listed */
	    {{"make", "test"}, 2, {0}, 0, NULL},
	    {{"printenv"}, 1, {0}, 0, NULL},
	    {{"make", "test", "-C", "/"},
	     4,
	     {0},
	     0,
	     "'make' runs on the host only exactly as execution.local lists it"},
	    {{"printenv", "HOME"}, 2, {0}, 0, "'printenv' runs on the host only exactly"},
	};
	char why[512], dir[] = "/tmp/test_route.XXXXXX";
	(void)state;
	assert_non_null(mkdtemp(dir));
	struct gitargs_ws ws = {.root_fd = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC), .root = dir, .cwd = ""};
	assert_true(ws.root_fd >= 0);
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct route_local_req q = {
		    .prefixes = pre,
		    .nprefixes = sizeof(pre) / sizeof(pre[0]),
		    .argv = t[i].argv,
		    .argc = t[i].argc,
		    .env = t[i].env,
		    .nenv = t[i].nenv,
		    .ws = &ws,
		};
		why[0] = '\0';
		int r = route_local_check(&q, why, sizeof(why));
		if (t[i].why ? (r != -EPERM || !strstr(why, t[i].why)) : r != 0)
			fail_msg("case %zu: got %d '%s'", i, r, why);
	}
	close(ws.root_fd);
	rmdir(dir);
}

static const char *env_get(char **v, size_t n, const char *name)
{
	size_t l = strlen(name);
	for (size_t i = 0; i < n; i++)
		if (!strncmp(v[i], name, l) && v[i][l] == '=')
			return v[i] + l + 1;
	return NULL;
}

/* The value git would see for a config key: the last GIT_CONFIG_KEY_i. */
static const char *cfg_get(char **v, size_t n, const char *key)
{
	const char *cnt = env_get(v, n, "GIT_CONFIG_COUNT"), *val = NULL;
	char k[64];
	assert_non_null(cnt);
	for (long i = 0; i < atol(cnt); i++) {
		snprintf(k, sizeof(k), "GIT_CONFIG_KEY_%ld", i);
		const char *ki = env_get(v, n, k);
		assert_non_null(ki);
		if (!strcmp(ki, key)) {
			snprintf(k, sizeof(k), "GIT_CONFIG_VALUE_%ld", i);
			val = env_get(v, n, k);
			assert_non_null(val);
		}
	}
	return val;
}

static void test_git_env(void **state)
{
	static const char probe[] = "core.hookspath\nhooks2\0"
				    "filter.Lfs.clean\ngit-lfs clean\0"
				    "filter.Lfs.required\ntrue\0"
				    "diff.tc.textconv\nx\0"
				    "diff.cmd.command\ny\0"
				    "merge.m.driver\nz\0"
				    "credential.https://h.helper\n!x\0"
				    "alias.st\nstatus\0"
				    "alias.evil\n!touch x\0"
				    "pager.log\ntouch x\0"
				    "remote.origin.uploadpack\nx\0"
				    "submodule.s.update\n!x\0"
				    "user.name\n\0"
				    "core.bare\0"
				    "truncated.entry\nno-nul";
	char **v = NULL;
	size_t n = 0;
	(void)state;
	assert_int_equal(route_git_env(probe, sizeof(probe) - 1, &v, &n), 0);
	assert_string_equal(env_get(v, n, "GIT_CONFIG_GLOBAL"), "/dev/null");
	assert_string_equal(env_get(v, n, "GIT_CONFIG_NOSYSTEM"), "1");
	assert_string_equal(env_get(v, n, "GIT_PAGER"), "cat");
	assert_string_equal(cfg_get(v, n, "core.hooksPath"), "/dev/null");
	assert_string_equal(cfg_get(v, n, "core.fsmonitor"), "false");
	assert_string_equal(cfg_get(v, n, "credential.helper"), "");
	assert_string_equal(cfg_get(v, n, "filter.Lfs.clean"), "");
	assert_null(cfg_get(v, n, "filter.Lfs.required")); /* a required filter then fails loudly */
	assert_string_equal(cfg_get(v, n, "diff.tc.textconv"), "cat");
	assert_non_null(strstr(cfg_get(v, n, "diff.cmd.command"), "diff -u"));
	assert_non_null(strstr(cfg_get(v, n, "merge.m.driver"), "git merge-file"));
	assert_string_equal(cfg_get(v, n, "credential.https://h.helper"), "");
	assert_null(cfg_get(v, n, "alias.st"));
	assert_string_equal(cfg_get(v, n, "alias.evil"), "");
	assert_string_equal(cfg_get(v, n, "pager.log"), "false");
	assert_string_equal(cfg_get(v, n, "remote.origin.uploadpack"), "git-upload-pack");
	assert_string_equal(cfg_get(v, n, "submodule.s.update"), "checkout");
	assert_null(cfg_get(v, n, "user.name"));
	assert_null(cfg_get(v, n, "truncated.entry"));
	assert_string_equal(cfg_get(v, n, "safe.bareRepository"), "explicit");
	route_git_env_free(v, n);
	/* a work tree elsewhere: refused, not overridden */
	static const char wt[] = "core.bare\nfalse\0core.worktree\n/\0";
	v = NULL;
	assert_int_equal(route_git_env(wt, sizeof(wt) - 1, &v, &n), -EPERM);
	assert_null(v);
	/* without a probe: the fixed part only */
	assert_int_equal(route_git_env(NULL, 0, &v, &n), 0);
	assert_string_equal(cfg_get(v, n, "core.hooksPath"), "/dev/null");
	route_git_env_free(v, n);
}

/* Every allocation failure becomes -ENOMEM, never a crash or a leak (the
 * sanitizer build checks the leaks). */
static void test_alloc_failures(void **state)
{
	static const char probe[] = "filter.f.clean\nx\0diff.d.textconv\ny\0alias.a\n!z\0";
	char **v = NULL;
	size_t n = 0;
	unsigned long used, c0;
	int r;
	(void)state;

	c0 = mem_count();
	assert_int_equal(route_git_env(probe, sizeof(probe) - 1, &v, &n), 0);
	used = mem_count() - c0;
	route_git_env_free(v, n);
	for (unsigned long k = 1; k <= used; k++) {
		mem_fail_at(k, 0);
		r = route_git_env(probe, sizeof(probe) - 1, &v, &n);
		mem_fail_at(0, 0);
		assert_true(r == 0 || r == -ENOMEM);
		if (r == 0)
			route_git_env_free(v, n);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_match_local),
	    cmocka_unit_test(test_local_check),
	    cmocka_unit_test(test_alloc_failures),
	    cmocka_unit_test(test_git_env),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
