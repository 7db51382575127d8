/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for the policy module: the policy file, decisions, the
 * secret list and the per-directory rule files. The ignore matcher is
 * tested in test_ignore.c, its agreement with git in test_ignore_oracle.c.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/core/mem.h"
#include "airlock/policy/ignore.h"
#include "airlock/policy/policy.h"
#include "airlock/policy/trust.h"

#ifndef POLICY_DATA_DIR
#error "POLICY_DATA_DIR must name tests/data/policies"
#endif
#ifndef SECRETS_DOC
#error "SECRETS_DOC must name doc/SECRETS.md"
#endif

static const char *data(const char *name)
{
	static char buf[4][PATH_MAX];
	static int k;
	char *b = buf[k++ & 3];

	snprintf(b, PATH_MAX, "%s/%s", POLICY_DATA_DIR, name);
	return b;
}

static struct policy *load_ok(const char *name)
{
	struct policy *p = NULL;
	char err[512];
	int r = policy_load(data(name), &p, err, sizeof(err));

	if (r != 0)
		fail_msg("%s: %d %s", name, r, err);
	return p;
}

/* ------------------------------------------------------------------ */
/* loading */

static void test_seed_example_loads(void **state)
{
	(void)state;
	struct policy *p = load_ok("seed-example.json");
	const struct policy_workspace *ws = policy_workspace(p);
	const struct policy_execution *ex = policy_execution(p);
	const struct policy_credentials *cr = policy_credentials(p);
	const struct policy_egress *eg = policy_egress(p);

	assert_string_equal(ws->template_name, "base");
	assert_int_equal(ws->ttl_seconds, 3600);
	assert_true(ws->has_include);
	assert_int_equal(ws->include.n, 4);
	assert_string_equal(ws->include.v[3], "pyproject.toml");
	assert_int_equal(ws->exclude.n, 5);
	assert_string_equal(ws->exclude.v[0], ".env*");
	assert_true(ws->gitignore);
	assert_int_equal(ex->local.n, 5);
	assert_string_equal(ex->local.v[4], "git commit");
	assert_int_equal(ex->remote.n, 1);
	assert_string_equal(ex->remote.v[0], "*");
	assert_int_equal(ex->timeout_seconds, 300);
	assert_int_equal(ex->barrier, POLICY_BARRIER_FAIL);
	assert_int_equal(cr->forward_env.n, 0);
	assert_int_equal(cr->n_inject, 2);
	assert_string_equal(cr->inject[0].name, "GIT_CLONE_TOKEN");
	assert_string_equal(cr->inject[0].scope, "read:repo");
	assert_int_equal(cr->inject[0].ttl_seconds, 3600);
	assert_null(cr->inject[0].value_from);
	assert_string_equal(cr->inject[1].name, "DATABASE_URL");
	assert_string_equal(cr->inject[1].value_from, "ephemeral-test-db");
	assert_int_equal(cr->inject[1].ttl_seconds, 0);
	assert_true(eg->deny_by_default);
	assert_int_equal(eg->n_allow, 5);
	assert_string_equal(eg->allow[4].name, "github.com");
	assert_false(eg->allow[4].subdomains);
	assert_int_equal(eg->allow[4].port, 0);
	assert_string_equal(policy_source(p), data("seed-example.json"));
	policy_free(p);
}

static void test_full_policy(void **state)
{
	(void)state;
	struct policy *p = load_ok("full.json");
	const struct policy_egress *eg = policy_egress(p);

	assert_int_equal(policy_workspace(p)->ttl_seconds, 0);
	assert_true(policy_workspace(p)->has_include);
	assert_int_equal(policy_workspace(p)->include.n, 0);
	assert_int_equal(eg->n_allow, 3);
	assert_string_equal(eg->allow[0].text, "*.Example.ORG:8443");
	assert_string_equal(eg->allow[0].name, "example.org");
	assert_true(eg->allow[0].subdomains);
	assert_int_equal(eg->allow[0].port, 8443);
	assert_string_equal(eg->allow[2].name, "10.0.0.1");
	assert_int_equal(eg->allow[2].port, 80);
	assert_string_equal(policy_credentials(p)->forward_env.v[1], "_X1");
	policy_free(p);
}

#define NO_STORE "/nonexistent/airlock-test-config"

static void put_file(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static struct policy *ws_load(const char *dir, const char *explicit_path)
{
	struct policy *p = NULL;
	char err[512];

	if (policy_load_for_workspace(dir, explicit_path, &p, err, sizeof(err)) != 0)
		fail_msg("%s: %s", dir, err);
	return p;
}

static int count_record(const char *ws, const uint8_t *digest, void *ud)
{
	(void)ws;
	(void)digest;
	++*(int *)ud;
	return 0;
}

/* sandbox.limits and write-back in an untrusted file: a value above the
 * built-in default loosens it and is left out, one below applies. */
static void test_trust_limits(void **state)
{
	(void)state;
	char cfg[] = "/tmp/airlock-trust-cfg-XXXXXX", dir[] = "/tmp/airlock-trust-ws-XXXXXX";
	char path[PATH_MAX];
	struct policy *p;

	assert_non_null(mkdtemp(cfg));
	assert_non_null(mkdtemp(dir));
	setenv("XDG_CONFIG_HOME", cfg, 1);
	snprintf(path, sizeof(path), "%s/airlock.json", dir);
	put_file(path, "{ \"sandbox\": { \"limits\": { \"pids\": 100000, \"memory\": \"1T\", \"tmp\": \"512M\", "
		       "\"workspace\": \"64G\" } } }");
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	assert_int_equal(policy_sandbox_limits(p)->pids, 0);
	assert_int_equal(policy_sandbox_limits(p)->memory, 0);
	assert_int_equal(policy_sandbox_limits(p)->workspace, 0);
	assert_int_equal(policy_sandbox_limits(p)->tmp, 512ull << 20);
	assert_int_equal(policy_ignored(p)->n, 3);
	assert_string_equal(policy_ignored(p)->v[0], "sandbox.limits.pids");
	assert_string_equal(policy_ignored(p)->v[1], "sandbox.limits.memory");
	assert_string_equal(policy_ignored(p)->v[2], "sandbox.limits.workspace");
	policy_free(p);

	put_file(path, "{ \"sandbox\": { \"limits\": { \"pids\": 64, \"workspace\": 1048576 } } }");
	p = ws_load(dir, NULL);
	assert_int_equal(policy_sandbox_limits(p)->pids, 64);
	assert_int_equal(policy_sandbox_limits(p)->workspace, 1048576);
	assert_int_equal(policy_ignored(p)->n, 0);
	policy_free(p);

	/* write-back: review (the default) and a smaller cap apply; auto
	 * globs and a larger cap are left out */
	put_file(path, "{ \"workspace\": { \"writeback\": \"review\", \"writeback_max_mib\": 8 } }");
	p = ws_load(dir, NULL);
	assert_int_equal(policy_ignored(p)->n, 0);
	assert_int_equal(policy_workspace(p)->writeback_max_mib, 8);
	policy_free(p);
	put_file(path, "{ \"workspace\": { \"writeback\": { \"auto\": [\"src/**\"] }, \"writeback_max_mib\": 4096 } }");
	p = ws_load(dir, NULL);
	assert_int_equal(policy_ignored(p)->n, 2);
	assert_string_equal(policy_ignored(p)->v[0], "workspace.writeback");
	assert_string_equal(policy_ignored(p)->v[1], "workspace.writeback_max_mib");
	assert_int_equal(policy_workspace(p)->writeback_auto.n, 0);
	assert_int_equal(policy_workspace(p)->writeback_max_mib, POLICY_WRITEBACK_MAX_MIB);
	assert_false(policy_writeback_auto(p, "src/a.c", 0));
	policy_free(p);
	tu_rm_rf(dir);
	tu_rm_rf(cfg);
	unsetenv("XDG_CONFIG_HOME");
}

/* An unapproved workspace policy keeps only what tightens the default;
 * approved, all of it applies; a changed byte needs a new approval. */
static void test_trust(void **state)
{
	(void)state;
	char cfg[] = "/tmp/airlock-trust-cfg-XXXXXX", dir[] = "/tmp/airlock-trust-ws-XXXXXX";
	char path[PATH_MAX], other[PATH_MAX], outside[PATH_MAX], note[1024], err[512];
	static const char full[] =
	    "{ \"execution\": { \"local\": [\"sh\"], \"timeout_seconds\": 600 },\n"
	    "  \"credentials\": { \"forward_env\": [\"AWS_SECRET_ACCESS_KEY\"],\n"
	    "                   \"inject\": [ { \"name\": \"TOKEN\", \"value_from\": \"gh\" } ] },\n"
	    "  \"workspace\": { \"ttl_seconds\": 60, \"sync\": { \"allow_secrets\": [\".env\"], "
	    "\"gitignore\": false,\n"
	    "                 \"include\": [\"src/**\"], \"exclude\": [\"build/\"] } },\n"
	    "  \"egress\": { \"default\": \"deny\", \"allow\": [\"evil.example\"] } }\n";
	struct policy *p;

	assert_non_null(mkdtemp(cfg));
	assert_non_null(mkdtemp(dir));
	setenv("XDG_CONFIG_HOME", cfg, 1);
	snprintf(path, sizeof(path), "%s/airlock.json", dir);
	put_file(path, full);

	/* untrusted: each loosening key left out and named, in table order */
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	assert_int_equal(policy_execution(p)->local.n, 0);
	assert_int_equal(policy_execution(p)->timeout_seconds, 0);
	assert_int_equal(policy_credentials(p)->forward_env.n, 0);
	assert_int_equal(policy_credentials(p)->n_inject, 0);
	assert_int_equal(policy_workspace(p)->allow_secrets.n, 0);
	assert_true(policy_workspace(p)->gitignore);
	assert_int_equal(policy_egress(p)->n_allow, 0);
	/* what tightens still applies */
	assert_true(policy_workspace(p)->has_include);
	assert_int_equal(policy_workspace(p)->exclude.n, 1);
	assert_int_equal(policy_workspace(p)->ttl_seconds, 60);
	static const char *const want[] = {
	    "execution.local",	  "execution.timeout_seconds",	  "credentials.forward_env",
	    "credentials.inject", "workspace.sync.allow_secrets", "workspace.sync.gitignore",
	    "egress.allow"};
	assert_int_equal(policy_ignored(p)->n, 7);
	for (size_t i = 0; i < 7; i++)
		assert_string_equal(policy_ignored(p)->v[i], want[i]);
	assert_int_equal(policy_ignored_note(p, note, sizeof(note)), 7);
	char expect[PATH_MAX * 3];
	snprintf(expect, sizeof(expect),
		 "ignored from the untrusted %s: execution.local, execution.timeout_seconds, "
		 "credentials.forward_env, credentials.inject, workspace.sync.allow_secrets, "
		 "workspace.sync.gitignore, egress.allow; review it, then run: airlock trust %s",
		 path, dir);
	assert_string_equal(note, expect);
	/* the secret stays withheld: allow_secrets did not apply */
	struct policy_ctx *ctx;
	struct policy_verdict v;
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	assert_int_equal(policy_check(p, ctx, ".env", 0, &v), 0);
	assert_int_equal(v.reason, POLICY_SECRET);
	policy_ctx_free(ctx);
	policy_free(p);

	/* every allocation of the untrusted load failing in turn: -ENOMEM, no leak */
	for (unsigned long k = 1;; k++) {
		struct policy *q = NULL;
		mem_fail_at(k, 0);
		int r = policy_load_for_workspace(dir, NULL, &q, err, sizeof(err));
		mem_fail_at(0, 0);
		if (r == 0) {
			assert_int_equal(policy_ignored(q)->n, 7);
			policy_free(q);
			assert_true(k > 20);
			break;
		}
		if (r != -ENOMEM)
			fail_msg("allocation %lu failed: got %d (%s), want -ENOMEM", k, r, err);
		assert_null(q);
	}

	/* a shorter timeout, an empty allow list, gitignore on: nothing to ignore */
	put_file(path, "{ \"execution\": { \"timeout_seconds\": 60, \"local\": [] },"
		       "  \"workspace\": { \"sync\": { \"gitignore\": true } }, \"egress\": { \"allow\": [] } }");
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	assert_int_equal(policy_ignored(p)->n, 0);
	assert_int_equal(policy_ignored_note(p, note, sizeof(note)), 0);
	assert_string_equal(note, "");
	assert_int_equal(policy_execution(p)->timeout_seconds, 60);
	policy_free(p);

	/* an ignored key is still validated: errors name it */
	put_file(path, "{ \"execution\": { \"local\": [1] } }");
	p = NULL;
	assert_int_equal(policy_load_for_workspace(dir, NULL, &p, err, sizeof(err)), -EINVAL);
	assert_null(p);
	assert_non_null(strstr(err, "execution.local[0]"));

	/* approved: all of it, exactly as written */
	put_file(path, full);
	assert_int_equal(policy_trust_set(dir, true, err, sizeof(err)), 0);
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_APPROVED);
	assert_int_equal(policy_ignored(p)->n, 0);
	assert_int_equal(policy_execution(p)->local.n, 1);
	assert_int_equal(policy_execution(p)->timeout_seconds, 600);
	assert_int_equal(policy_credentials(p)->forward_env.n, 1);
	assert_int_equal(policy_credentials(p)->n_inject, 1);
	assert_int_equal(policy_workspace(p)->allow_secrets.n, 1);
	assert_false(policy_workspace(p)->gitignore);
	assert_int_equal(policy_egress(p)->n_allow, 1);
	policy_free(p);
	int n = 0;
	assert_int_equal(trust_list(count_record, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 1);

	/* the same bytes under another name in the workspace: untrusted, and the
	 * note says airlock trust would not cover it */
	snprintf(other, sizeof(other), "%s/other.json", dir);
	put_file(other, "{ \"execution\": { \"local\": [\"sh\"] } }");
	p = ws_load(dir, other);
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	assert_int_equal(policy_execution(p)->local.n, 0);
	policy_ignored_note(p, note, sizeof(note));
	assert_non_null(strstr(note, "pass it with --policy from outside the workspace"));
	policy_free(p);
	/* from outside the workspace: the user's own */
	snprintf(outside, sizeof(outside), "%s/mine.json", cfg);
	put_file(outside, full);
	p = ws_load(dir, outside);
	assert_int_equal(policy_trust(p), POLICY_TRUST_USER);
	assert_int_equal(policy_execution(p)->local.n, 1);
	policy_free(p);

	/* one byte more: untrusted again */
	FILE *f = fopen(path, "a");
	fputc(' ', f);
	fclose(f);
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	assert_int_equal(policy_execution(p)->local.n, 0);
	policy_free(p);

	/* a record others may write is no approval */
	assert_int_equal(policy_trust_set(dir, true, err, sizeof(err)), 0);
	char tdir[PATH_MAX], rec[PATH_MAX * 2];
	assert_int_equal(trust_store_dir(tdir, sizeof(tdir), err, sizeof(err)), 0);
	struct stat st;
	assert_int_equal(stat(tdir, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0700);
	DIR *d = opendir(tdir);
	struct dirent *de;
	rec[0] = '\0';
	while ((de = readdir(d)))
		if (de->d_name[0] != '.')
			snprintf(rec, sizeof(rec), "%s/%s", tdir, de->d_name);
	closedir(d);
	assert_int_equal(stat(rec, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_APPROVED);
	policy_free(p);
	chmod(rec, 0622);
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	policy_free(p);
	chmod(rec, 0600);

	/* revoke */
	assert_int_equal(policy_trust_set(dir, false, err, sizeof(err)), 1);
	assert_int_equal(policy_trust_set(dir, false, err, sizeof(err)), 0);
	p = ws_load(dir, NULL);
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	policy_free(p);
	/* a file that does not load is not approved */
	put_file(path, "{ \"nope\": 1 }");
	assert_int_equal(policy_trust_set(dir, true, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "unknown key"));

	unlink(path);
	unlink(other);
	unlink(outside);
	tu_rm_rf(cfg);
	tu_rm_rf(dir);
	setenv("XDG_CONFIG_HOME", NO_STORE, 1);
}

/* workspace.writeback, writeback_max_mib, guest_owned (doc/SYNC.md §10) */
static void test_writeback_keys(void **state)
{
	(void)state;
	struct policy *p = load_ok("writeback.json"), *d = NULL;
	struct policy_ctx *ctx;
	struct policy_verdict v;

	assert_int_equal(policy_workspace(p)->writeback_auto.n, 3);
	assert_int_equal(policy_workspace(p)->writeback_max_mib, 16);
	assert_true(policy_writeback_auto(p, "src/a/b.c", 0));
	assert_true(policy_writeback_auto(p, "package.json", 0));
	assert_false(policy_writeback_auto(p, "src/gen/x.c", 0)); /* the "!" pattern */
	assert_false(policy_writeback_auto(p, "README.md", 0));
	assert_true(policy_guest_owned(p, "build/out/x", 0));
	assert_true(policy_guest_owned(p, "src/a.o", 0));
	assert_false(policy_guest_owned(p, "src/a.c", 0));
	/* guest-owned paths are decided like ignored ones: never synced */
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	assert_int_equal(policy_check(p, ctx, "build", 1, &v), 0);
	assert_int_equal(v.reason, POLICY_IGNORED);
	assert_true(v.prune);
	assert_non_null(strstr(v.rule, "guest_owned: build/"));
	assert_int_equal(policy_check(p, ctx, "src/a.c", 0, &v), 0);
	assert_int_equal(v.reason, POLICY_SYNCED);
	policy_ctx_free(ctx);
	policy_free(p);
	/* the default: review, 1024 MiB, nothing guest-owned */
	assert_int_equal(policy_default(&d), 0);
	assert_int_equal(policy_workspace(d)->writeback_auto.n, 0);
	assert_int_equal(policy_workspace(d)->writeback_max_mib, POLICY_WRITEBACK_MAX_MIB);
	assert_false(policy_writeback_auto(d, "src/a.c", 0));
	policy_free(d);
}

static void test_default_and_workspace_lookup(void **state)
{
	(void)state;
	struct policy *p = NULL;
	char err[512], dir[] = "/tmp/airlock-policy-ws-XXXXXX", path[PATH_MAX];

	assert_int_equal(policy_default(&p), 0);
	assert_false(policy_workspace(p)->has_include);
	assert_true(policy_workspace(p)->gitignore);
	assert_true(policy_egress(p)->deny_by_default);
	assert_int_equal(policy_workspace(p)->ttl_seconds, -1);
	policy_free(p);
	policy_free(NULL);

	assert_non_null(mkdtemp(dir));
	/* nothing there: the default */
	assert_int_equal(policy_load_for_workspace(dir, NULL, &p, err, sizeof(err)), 0);
	assert_string_equal(policy_source(p), "(built-in default)");
	policy_free(p);
	/* <dir>/airlock.json */
	snprintf(path, sizeof(path), "%s/airlock.json", dir);
	FILE *f = fopen(path, "w");
	assert_non_null(f);
	fputs("{ \"workspace\": { \"sync\": { \"gitignore\": false } } }\n", f);
	fclose(f);
	assert_int_equal(policy_load_for_workspace(dir, NULL, &p, err, sizeof(err)), 0);
	assert_string_equal(policy_source(p), path);
	/* not approved (the trust store is empty): turning gitignore off loosens */
	assert_int_equal(policy_trust(p), POLICY_TRUST_UNTRUSTED);
	assert_true(policy_workspace(p)->gitignore);
	assert_int_equal(policy_ignored(p)->n, 1);
	assert_string_equal(policy_ignored(p)->v[0], "workspace.sync.gitignore");
	policy_free(p);
	/* an explicit path wins */
	assert_int_equal(policy_load_for_workspace(dir, data("seed-example.json"), &p, err, sizeof(err)), 0);
	assert_true(policy_workspace(p)->has_include);
	policy_free(p);
	/* a broken one in the workspace is an error, not the default */
	f = fopen(path, "w");
	fputs("{ \"workspace\": 1 }", f);
	fclose(f);
	assert_int_equal(policy_load_for_workspace(dir, NULL, &p, err, sizeof(err)), -EINVAL);
	assert_null(p);
	assert_non_null(strstr(err, "airlock.json: workspace: expected an object, got an integer"));
	unlink(path);
	/* missing explicit file */
	assert_int_equal(policy_load(path, &p, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "airlock.json"));
	/* not a regular file */
	assert_int_equal(policy_load(dir, &p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not a regular file"));
	rmdir(dir);
}

struct bad_case {
	const char *file;
	int err;
	const char *want[3]; /* substrings of the message */
};

static const struct bad_case bad_cases[] = {
    {"bad-writeback-mode.json", -EINVAL, {": workspace.writeback: expected \"review\" or {\"auto\": [globs]}"}},
    {"bad-writeback-max.json", -EINVAL, {": workspace.writeback_max_mib: must be greater than 0, got 0"}},
    {"bad-writeback-key.json", -EINVAL, {": workspace.writeback.manual: unknown key", "auto"}},
    {"bad-unknown-top.json", -EINVAL, {": worksapce: unknown key", "workspace, execution, credentials, egress"}},
    {"bad-unknown-sync.json", -EINVAL, {": workspace.sync.exlude: unknown key", "include, exclude"}},
    {"bad-unknown-inject.json", -EINVAL, {": credentials.inject[1].scop: unknown key", "name, scope"}},
    {"bad-type-include.json", -EINVAL, {": workspace.sync.include: expected an array of strings, got a string"}},
    {"bad-type-timeout.json", -EINVAL, {": execution.timeout_seconds: expected an integer", "got a string"}},
    {"bad-type-gitignore.json", -EINVAL, {": workspace.sync.gitignore: expected true or false, got a string"}},
    {"bad-type-element.json", -EINVAL, {": egress.allow[1]: expected a string, got an integer"}},
    {"bad-real-ttl.json", -EINVAL, {": workspace.ttl_seconds: expected an integer", "got a real number"}},
    {"bad-glob.json", -EINVAL, {": workspace.sync.exclude[2]: bad glob \"[a-\"", "unterminated character class"}},
    {"bad-glob-class.json", -EINVAL, {": workspace.sync.include[0]: bad glob", "unknown character class"}},
    {"bad-glob-dotdot.json", -EINVAL, {": workspace.sync.include[0]: bad glob", "'..' component"}},
    {"bad-ttl-negative.json", -EINVAL, {": workspace.ttl_seconds: must be 0 or more, got -5"}},
    {"bad-timeout-zero.json", -EINVAL, {": execution.timeout_seconds: must be greater than 0, got 0"}},
    {"bad-barrier.json", -EINVAL, {": execution.barrier: expected \"run\" or \"fail\", got later"}},
    {"bad-inject-ttl.json", -EINVAL, {": credentials.inject[0].ttl_seconds: must be greater than 0, got -1"}},
    {"bad-duplicate.json", -EINVAL, {":5:", ": workspace.sync.include: key appears twice"}},
    {"bad-egress-default-allow.json", -EINVAL, {": egress.default: \"allow\" is not supported", "egress.allow"}},
    {"bad-egress-default-other.json", -EINVAL, {": egress.default: must be \"deny\", got \"block\""}},
    {"bad-inject-noname.json", -EINVAL, {": credentials.inject[0]: missing required key \"name\""}},
    {"bad-not-json.json", -EINVAL, {":1:", "not valid JSON"}},
    {"bad-empty.json", -EINVAL, {": top level: file is empty"}},
    {"bad-trailing-comma.json", -EINVAL, {"workspace.sync.include[1]: not valid JSON"}},
    {"bad-env-name.json", -EINVAL, {": credentials.forward_env[1]: \"BAD-NAME\" is not an environment variable"}},
    {"bad-host.json", -EINVAL, {": egress.allow[1]: bad host pattern \"files .pythonhosted.org\""}},
    {"bad-host-port.json", -EINVAL, {": egress.allow[0]: bad host pattern", "1-65535"}},
    {"bad-allow-secret-glob.json", -EINVAL, {": workspace.sync.allow_secrets[0]:", "exact paths, not globs"}},
    {"bad-allow-secret-path.json", -EINVAL, {": workspace.sync.allow_secrets[0]:", "workspace-relative"}},
    {"bad-toplevel-array.json", -EINVAL, {": top level: expected an object, got an array"}},
    {"bad-section-type.json", -EINVAL, {": egress: expected an object, got an array"}},
};

static void test_bad_policies(void **state)
{
	(void)state;
	size_t n = sizeof(bad_cases) / sizeof(bad_cases[0]);
	char msgs[sizeof(bad_cases) / sizeof(bad_cases[0])][512];

	for (size_t i = 0; i < n; i++) {
		struct policy *p = (struct policy *)1;
		const struct bad_case *c = &bad_cases[i];
		int r = policy_load(data(c->file), &p, msgs[i], sizeof(msgs[i]));

		if (r != c->err)
			fail_msg("%s: got %d (%s), want %d", c->file, r, msgs[i], c->err);
		assert_null(p);
		/* the message names the file ... */
		if (strncmp(msgs[i], data(c->file), strlen(data(c->file))) != 0)
			fail_msg("%s: message does not start with the file name: %s", c->file, msgs[i]);
		/* ... the key and the reason */
		for (int k = 0; k < 3 && c->want[k]; k++)
			if (!strstr(msgs[i], c->want[k]))
				fail_msg("%s: message \"%s\" lacks \"%s\"", c->file, msgs[i], c->want[k]);
		/* one line, and its own */
		assert_null(strchr(msgs[i], '\n'));
		for (size_t j = 0; j < i; j++)
			if (strcmp(msgs[i] + strlen(data(c->file)), msgs[j] + strlen(data(bad_cases[j].file))) == 0)
				fail_msg("%s and %s give the same message", c->file, bad_cases[j].file);
	}
}

static void test_alloc_failures(void **state)
{
	(void)state;
	unsigned long n;
	char err[512];

	for (n = 1;; n++) {
		struct policy *p = NULL;
		mem_fail_at(n, 0);
		int r = policy_load(data("seed-example.json"), &p, err, sizeof(err));
		mem_fail_at(0, 0);
		if (r == 0) {
			policy_free(p);
			break;
		}
		if (r != -ENOMEM)
			fail_msg("allocation %lu failed: got %d (%s), want -ENOMEM", n, r, err);
		assert_null(p);
		assert_non_null(strstr(err, "out of memory"));
	}
	assert_true(n > 20); /* it did allocate: the loop covered something */

	/* the same for a ctx walking a tree with rule files */
	char dir[] = "/tmp/airlock-policy-oom-XXXXXX", path[PATH_MAX];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/a", dir);
	mkdir(path, 0700);
	snprintf(path, sizeof(path), "%s/.gitignore", dir);
	FILE *f = fopen(path, "w");
	fputs("*.o\n!keep.o\n", f);
	fclose(f);
	snprintf(path, sizeof(path), "%s/a/.gitignore", dir);
	f = fopen(path, "w");
	fputs("x/\n", f);
	fclose(f);
	int rootfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_true(rootfd >= 0);
	struct policy *p = load_ok("allow-secrets.json");
	for (n = 1;; n++) {
		struct policy_ctx *ctx = NULL;
		struct policy_verdict v;
		int r;
		mem_fail_at(n, 0);
		if ((r = policy_ctx_new(p, rootfd, &ctx)) == 0 && (r = policy_check(p, ctx, "a/x/y.c", 0, &v)) == 0 &&
		    (r = policy_check(p, ctx, "a/b/keep.o", 0, &v)) == 0)
			r = policy_check(p, ctx, "b/c/d", 1, &v);
		mem_fail_at(0, 0);
		policy_ctx_free(ctx);
		if (r == 0)
			break;
		assert_int_equal(r, -ENOMEM);
	}
	assert_true(n > 5);
	policy_free(p);
	close(rootfd);
	unlink(path);
	snprintf(path, sizeof(path), "%s/.gitignore", dir);
	unlink(path);
	snprintf(path, sizeof(path), "%s/a", dir);
	rmdir(path);
	rmdir(dir);
}

/* ------------------------------------------------------------------ */
/* decisions */

struct decision {
	const char *path;
	int is_dir;
	enum policy_reason reason;
	const char *rule; /* substring of v.rule ("" = must be empty) */
	bool prune;
};

static void run_decisions(const struct policy *p, struct policy_ctx *ctx, const struct decision *d, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		struct policy_verdict v;
		int r = policy_check(p, ctx, d[i].path, d[i].is_dir, &v);
		if (r != 0)
			fail_msg("%s: policy_check %d", d[i].path, r);
		if (v.reason != d[i].reason || v.prune != d[i].prune || (!*d[i].rule && v.rule[0]) ||
		    !strstr(v.rule, d[i].rule))
			fail_msg("%s%s: reason %d prune %d rule \"%s\"; want reason %d prune %d rule \"%s\"", d[i].path,
				 d[i].is_dir ? "/" : "", v.reason, v.prune, v.rule, d[i].reason, d[i].prune, d[i].rule);
	}
}

static void test_include_exclude(void **state)
{
	(void)state;
	static const struct decision d[] = {
	    {"src/main.c", 0, POLICY_SYNCED, "", false},
	    {"src", 1, POLICY_NOT_INCLUDED, "not included", false},
	    {"src/a/b/c.py", 0, POLICY_SYNCED, "", false},
	    {"src/generated/x.c", 0, POLICY_NOT_INCLUDED, "not included: !src/generated/**", false},
	    {"src/generated", 1, POLICY_SYNCED, "", false},
	    {"tests", 1, POLICY_SYNCED, "", false},
	    {"tests/a/b.py", 0, POLICY_SYNCED, "", false},
	    {"package.json", 0, POLICY_SYNCED, "", false},
	    {"lib/deep/package.json", 0, POLICY_SYNCED, "", false},
	    {"lib", 1, POLICY_NOT_INCLUDED, "not included", false},
	    {"docs/a.md", 0, POLICY_SYNCED, "", false},
	    {"docs/sub/a.md", 0, POLICY_NOT_INCLUDED, "not included", false},
	    {"README.md", 0, POLICY_NOT_INCLUDED, "not included", false},
	    {"src/app.log", 0, POLICY_EXCLUDED, "exclude: *.log", false},
	    {"build", 1, POLICY_EXCLUDED, "exclude: build/", true},
	    {"build/keep.txt", 0, POLICY_EXCLUDED, "exclude: build/", false},
	    {"src/build", 1, POLICY_EXCLUDED, "exclude: build/", true},
	    {"src/build/keep.txt", 0, POLICY_EXCLUDED, "exclude: build/", false},
	    {"src/build/a/b", 1, POLICY_EXCLUDED, "exclude: build/", true},
	    {"src/.envrc", 0, POLICY_SECRET, "secret: direnv", false},
	    {"src/.env.local", 0, POLICY_SECRET, "secret: dotenv file variant", false},
	    {"src/.environment", 0, POLICY_EXCLUDED, "exclude: .env*", false},
	    {"src/dev.pem", 0, POLICY_SYNCED, "", false},
	    {"src/prod.pem", 0, POLICY_SECRET, "secret: PEM key or certificate (*.pem)", false},
	    {"src/x.pem", 1, POLICY_SYNCED, "", false},
	    {".git", 1, POLICY_SYNCED, "", false},
	    {".git/HEAD", 0, POLICY_SYNCED, "", false},
	    {".git/objects/ab/cdef", 0, POLICY_SYNCED, "", false},
	    {".git/config", 0, POLICY_SECRET, "secret: git config", false},
	    {"", 1, POLICY_NOT_INCLUDED, "not included", false},
	};
	struct policy *p = load_ok("decisions.json");
	struct policy_ctx *ctx;

	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	run_decisions(p, ctx, d, sizeof(d) / sizeof(d[0]));
	/* the same answers in reverse order from a fresh ctx */
	policy_ctx_free(ctx);
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	for (size_t i = sizeof(d) / sizeof(d[0]); i-- > 0;)
		run_decisions(p, ctx, &d[i], 1);
	policy_ctx_free(ctx);
	policy_free(p);

	/* include pruning: a directory no include pattern can reach */
	static const struct decision d2[] = {
	    {"node_modules", 1, POLICY_NOT_INCLUDED, "not included", true},
	    {"node_modules/x/package.json", 0, POLICY_NOT_INCLUDED, "not included", false},
	    {"app", 1, POLICY_NOT_INCLUDED, "not included", false},
	    {"app/src", 1, POLICY_NOT_INCLUDED, "not included", false},
	    {"app/src/x", 1, POLICY_SYNCED, "", false},
	    {"app/srcx", 1, POLICY_NOT_INCLUDED, "not included", true},
	    {"app/lib", 1, POLICY_NOT_INCLUDED, "not included", true},
	    {"cfg", 1, POLICY_NOT_INCLUDED, "not included", false},
	    {"cfg/a.toml", 0, POLICY_SYNCED, "", false},
	    {"cfg/a.json", 0, POLICY_NOT_INCLUDED, "not included", false},
	    {"cfg/sub", 1, POLICY_NOT_INCLUDED, "not included", true},
	    {"data", 1, POLICY_NOT_INCLUDED, "not included", false},
	    {"data/x", 1, POLICY_SYNCED, "", false},
	    {"data/y", 1, POLICY_NOT_INCLUDED, "not included", true},
	    {"lib/x.c", 0, POLICY_SYNCED, "", false},
	    {"lib/gen", 1, POLICY_NOT_INCLUDED, "not included: !/lib/gen/", true},
	    {"lib/gen/y.c", 0, POLICY_NOT_INCLUDED, "not included: !/lib/gen/", false},
	    {"lib/gen2/y.c", 0, POLICY_SYNCED, "", false},
	};
	char dir[] = "/tmp/airlock-policy-inc-XXXXXX", path[PATH_MAX];
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/p.json", dir);
	FILE *f = fopen(path, "w");
	fputs("{\"workspace\":{\"sync\":{\"include\":[\"app/src/*/\", \"/cfg/*.toml\", \"/data/[xz]\", "
	      "\"/lib/\", "
	      "\"!/lib/gen/\"]}}}",
	      f);
	fclose(f);
	char err[512];
	assert_int_equal(policy_load(path, &p, err, sizeof(err)), 0);
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	run_decisions(p, ctx, d2, sizeof(d2) / sizeof(d2[0]));
	policy_ctx_free(ctx);
	policy_free(p);
	unlink(path);
	rmdir(dir);
}

static const char *const secret_files[] = {
    ".env",
    ".env.local",
    "src/.env.local",
    ".env.example",
    ".env.sample",
    ".env.template",
    "prod.env",
    "config.pem",
    "CONFIG.PEM",
    "server.key",
    "cert.p12",
    "a/b/c.pfx",
    "release.keystore",
    "app.jks",
    "putty.ppk",
    "vpn.ovpn",
    "id_rsa",
    "home/.ssh/id_ed25519",
    "id_ed25519_sk",
    "id_rsa_github",
    "ID_DSA",
    "deploy_rsa",
    "ssh_host_ecdsa_key",
    ".git/config",
    "sub/.git/config",
    ".git/modules/x/config",
    ".git/config.worktree",
    ".git/config.lock",
    ".git-credentials",
    ".netrc",
    "_netrc",
    ".npmrc",
    ".pypirc",
    ".dockercfg",
    ".docker/config.json",
    "x/.docker/config.json",
    "terraform.tfstate",
    "terraform.tfstate.backup",
    "prod.tfvars",
    "prod.tfvars.json",
    "credentials.json",
    "client_secret_1234.apps.googleusercontent.com.json",
    "my-service-account.json",
    "serviceAccountKey.json",
    "svc_service_account_key.json",
    "secrets.yml",
    "config/secrets.yaml",
    "secrets.json",
    "htpasswd",
    ".htpasswd",
    "login.keychain",
    "login.keychain-db",
    ".pgpass",
    ".my.cnf",
    ".s3cfg",
    ".boto",
    "wp-config.php",
    "kubeconfig",
    "dev.kubeconfig",
    ".bash_history",
    ".zsh_history",
    "release.gpg",
    "my-private-key.asc",
    ".vault-token",
    "application_default_credentials.json",
    "credentials.db",
    "access_tokens.db",
    "db.kdbx",
    ".envrc",
    ".gem/credentials",
    ".cargo/credentials.toml",
    ".config/gh/hosts.yml",
    "auth.json",
    "server.crt",
    "ca.cer",
    "key.der",
    "AuthKey_ABC.p8",
    ".terraformrc",
    "sftp-config.json",
    ".vscode/sftp.json",
    "secret.key",
};

static const char *const plain_files[] = {
    "pemfile.txt",
    "environment.ts",
    "env.py",
    ".envoy.yaml",
    ".environment",
    "env",
    "id_rsa.pub",
    "id_ed25519.pub",
    "id_rsa_github.pub",
    "known_hosts",
    "key.txt",
    "keys.go",
    "monkey",
    "src/secrets.go",
    "secretary.yml",
    "README.md",
    "package.json",
    ".gitignore",
    ".yarnrc.yml",
    ".yarnrc",
    "config.json",
    "credentials.py",
    ".git/HEAD",
    ".git/objects/ab/cdef",
    ".git/info/exclude",
    "public.asc",
    "foo.pub",
    "certificate.md",
    "token.json",
    "docker-compose.yml",
    ".dockerignore",
    "Dockerfile",
    "main.tf",
    "variables.tf",
    "terraform.lock.hcl",
    "pem",
    "key",
    "service.json",
    "client.json",
    ".ssh_config",
    "ssh/config",
    "google-services.json",
    "settings.py",
    "database.yml",
    "history.md",
    "keychain.swift",
    "x.pem.md",
};

static const char *const secret_dirs[] = {".ssh",   "home/.ssh",      ".aws",		".AWS",
					  ".azure", ".config/gcloud", ".kube",		".terraform",
					  ".gnupg", "x/.terraform.d", ".password-store"};

static const char *const plain_dirs[] = {".env",    "certs.pem", "ssh",	 ".github", "gcloud",
					 ".config", "aws",	 "kube", ".git",    "secrets"};

static void test_secret_list(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(secret_files) / sizeof(secret_files[0]); i++)
		if (!policy_secret_match(secret_files[i], 0))
			fail_msg("%s should be a secret", secret_files[i]);
	for (size_t i = 0; i < sizeof(plain_files) / sizeof(plain_files[0]); i++) {
		const struct policy_secret *s = policy_secret_match(plain_files[i], 0);
		if (s)
			fail_msg("%s should not be a secret (matched %s)", plain_files[i], s->pattern);
	}
	for (size_t i = 0; i < sizeof(secret_dirs) / sizeof(secret_dirs[0]); i++)
		if (!policy_secret_match(secret_dirs[i], 1))
			fail_msg("%s/ should be a secret directory", secret_dirs[i]);
	for (size_t i = 0; i < sizeof(plain_dirs) / sizeof(plain_dirs[0]); i++) {
		const struct policy_secret *s = policy_secret_match(plain_dirs[i], 1);
		if (s)
			fail_msg("%s/ should not be a secret directory (matched %s)", plain_dirs[i], s->pattern);
	}

	/* every table entry is well formed and documented */
	size_t n;
	const struct policy_secret *t = policy_secret_table(&n);
	FILE *f = fopen(SECRETS_DOC, "r");
	assert_non_null(f);
	static char doc[1 << 16];
	size_t dl = fread(doc, 1, sizeof(doc) - 1, f);
	fclose(f);
	doc[dl] = '\0';
	assert_true(n > 80);
	for (size_t i = 0; i < n; i++) {
		const char *why;
		char q[128];
		if (ignore_glob_check(t[i].pattern, &why) != 0)
			fail_msg("%s: %s", t[i].pattern, why);
		if (t[i].unless && ignore_glob_check(t[i].unless, &why) != 0)
			fail_msg("%s: %s", t[i].unless, why);
		assert_non_null(t[i].reason);
		snprintf(q, sizeof(q), "`%s%s`", t[i].pattern, t[i].dir ? "/" : "");
		if (!strstr(doc, q))
			fail_msg("doc/SECRETS.md does not list %s", q);
	}
}

/* policy_secret_match's literal head/tail prefilter never changes an
 * answer: compare with matching every entry the slow way. */
static uint64_t rng_state;

static const struct policy_secret *slow_secret_match(const char *path, int is_dir)
{
	size_t n, len = strlen(path);
	const struct policy_secret *t = policy_secret_table(&n);

	for (size_t i = 0; i < n; i++) {
		struct ignore_pattern ip, un;
		if (t[i].dir != !!is_dir)
			continue;
		assert_int_equal(ignore_pattern_init(&ip, t[i].pattern, strlen(t[i].pattern), IGNORE_CASEFOLD, 0), 0);
		if (!ignore_pattern_match(&ip, "", 0, path, len, is_dir))
			continue;
		if (t[i].unless) {
			assert_int_equal(ignore_pattern_init(&un, t[i].unless, strlen(t[i].unless), IGNORE_CASEFOLD, 0),
					 0);
			if (ignore_pattern_match(&un, "", 0, path, len, is_dir))
				continue;
		}
		return &t[i];
	}
	return NULL;
}

static void test_secret_prefilter(void **state)
{
	(void)state;
	const char *const *lists[] = {secret_files, plain_files, secret_dirs, plain_dirs};
	size_t sizes[] = {sizeof(secret_files) / sizeof(secret_files[0]), sizeof(plain_files) / sizeof(plain_files[0]),
			  sizeof(secret_dirs) / sizeof(secret_dirs[0]), sizeof(plain_dirs) / sizeof(plain_dirs[0])};
	size_t n, checked = 0;
	const struct policy_secret *t = policy_secret_table(&n);
	char v[6][256];

	for (size_t l = 0; l < 4; l++) {
		for (size_t i = 0; i < sizes[l]; i++) {
			const char *b = lists[l][i];
			snprintf(v[0], sizeof(v[0]), "%s", b);
			snprintf(v[1], sizeof(v[1]), "deep/er/%s", b);
			snprintf(v[2], sizeof(v[2]), "%s.bak", b);
			snprintf(v[3], sizeof(v[3]), "x%s", b);
			snprintf(v[4], sizeof(v[4]), "%.*s", (int)strlen(b) - 1, b);
			snprintf(v[5], sizeof(v[5]), "%s", b);
			for (char *c = v[5]; *c; c++)
				*c = (char)(*c >= 'a' && *c <= 'z' ? *c - 32 : *c);
			for (int k = 0; k < 6; k++) {
				if (!v[k][0])
					continue;
				for (int d = 0; d < 2; d++, checked++)
					if (policy_secret_match_name(v[k], d) != slow_secret_match(v[k], d))
						fail_msg("%s (dir %d): prefilter disagrees", v[k], d);
			}
		}
	}
	/* and the table's own patterns taken as names */
	for (size_t i = 0; i < n; i++)
		for (int d = 0; d < 2; d++, checked++)
			if (policy_secret_match_name(t[i].pattern, d) != slow_secret_match(t[i].pattern, d))
				fail_msg("%s (dir %d): prefilter disagrees", t[i].pattern, d);
	assert_true(checked > 1000);
}

static void test_secrets_through_policy(void **state)
{
	(void)state;
	static const struct decision d[] = {
	    {".ssh", 1, POLICY_SECRET, "secret: SSH directory", true},
	    {".ssh/known_hosts", 0, POLICY_SECRET, "secret: SSH directory", false},
	    {"known_hosts", 0, POLICY_SYNCED, "", false},
	    {"a/.aws/sso/cache/x.json", 0, POLICY_SECRET, "secret: AWS", false},
	    {".config/gcloud/configurations/config_default", 0, POLICY_SECRET, "Google Cloud SDK", false},
	    {".config", 1, POLICY_SYNCED, "", false},
	    {"src/.env.production", 0, POLICY_SECRET, "dotenv", false},
	    {".env", 1, POLICY_SYNCED, "", false}, /* a virtualenv, not a dotenv file */
	    {".env/bin/activate", 0, POLICY_SYNCED, "", false},
	    {"id_rsa.pub", 0, POLICY_SYNCED, "", false},
	    {"keys/id_rsa", 0, POLICY_SECRET, "SSH private key (id_rsa*)", false},
	};
	struct policy *p;
	struct policy_ctx *ctx;

	assert_int_equal(policy_default(&p), 0);
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	run_decisions(p, ctx, d, sizeof(d) / sizeof(d[0]));
	/* every listed secret is withheld by the default policy too */
	for (size_t i = 0; i < sizeof(secret_files) / sizeof(secret_files[0]); i++) {
		struct policy_verdict v;
		assert_int_equal(policy_check(p, ctx, secret_files[i], 0, &v), 0);
		if (v.reason != POLICY_SECRET)
			fail_msg("%s: reason %d rule %s", secret_files[i], v.reason, v.rule);
	}
	policy_ctx_free(ctx);
	policy_free(p);
}

static void test_allow_secrets(void **state)
{
	(void)state;
	static const struct decision d[] = {
	    {".env.example", 0, POLICY_SYNCED, "", false},
	    {"sub/.env.example", 0, POLICY_SECRET, "dotenv", false},
	    {".env", 0, POLICY_SECRET, "dotenv", false},
	    {".ENV.example", 0, POLICY_SECRET, "dotenv", false}, /* exact means exact */
	    {"certs/test.pem", 0, POLICY_SYNCED, "", false},
	    {"certs/other.pem", 0, POLICY_SECRET, "*.pem", false},
	    {"certs/test.pem/x", 0, POLICY_SYNCED, "", false},
	    {".aws", 1, POLICY_SECRET, "AWS", false}, /* not pruned: .aws/config is allowed */
	    {".aws/config", 0, POLICY_SYNCED, "", false},
	    {".aws/credentials", 0, POLICY_SECRET, "AWS", false},
	    {".aws/sso", 1, POLICY_SECRET, "AWS", true},
	    {".aws/sso/cache.json", 0, POLICY_SECRET, "AWS", false},
	    {"x/.aws", 1, POLICY_SECRET, "AWS", true},
	    {"x/.aws/config", 0, POLICY_SECRET, "AWS", false},
	    {".git/config", 0, POLICY_SYNCED, "", false},
	    {"sub/.git/config", 0, POLICY_SECRET, "git config", false},
	};
	struct policy *p = load_ok("allow-secrets.json");
	struct policy_ctx *ctx;

	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	run_decisions(p, ctx, d, sizeof(d) / sizeof(d[0]));
	policy_ctx_free(ctx);
	policy_free(p);
}

static void test_bad_relpaths(void **state)
{
	(void)state;
	static const char *const bad[] = {"/abs", "a/", "a//b", "./a", "a/./b", "a/..", "../a", ".", ".."};
	struct policy *p;
	struct policy_ctx *ctx;
	struct policy_verdict v;
	static char longp[POLICY_PATH_MAX + 2];

	assert_int_equal(policy_default(&p), 0);
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (policy_check(p, ctx, bad[i], 0, &v) != -EINVAL)
			fail_msg("\"%s\" accepted", bad[i]);
	memset(longp, 'a', sizeof(longp) - 1);
	assert_int_equal(policy_check(p, ctx, longp, 0, &v), -ENAMETOOLONG);
	longp[POLICY_PATH_MAX] = '\0';
	assert_int_equal(policy_check(p, ctx, longp, 0, &v), 0);
	assert_int_equal(policy_check(p, ctx, "..a/.b./...", 0, &v), 0);
	policy_ctx_free(ctx);
	policy_free(p);
}

/* ------------------------------------------------------------------ */
/* rule files through the ctx */

static void put(const char *dir, const char *rel, const char *text)
{
	char path[PATH_MAX];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, rel);
	f = fopen(path, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}

static void sub(const char *dir, const char *rel, char *out)
{
	snprintf(out, PATH_MAX, "%s/%s", dir, rel);
}

static enum policy_reason why(const struct policy *p, struct policy_ctx *ctx, const char *path, int is_dir, char *rule)
{
	struct policy_verdict v;
	int r = policy_check(p, ctx, path, is_dir, &v);

	if (r != 0)
		fail_msg("%s: %d", path, r);
	if (rule)
		strcpy(rule, v.rule);
	return v.reason;
}

static void test_ctx_rule_files(void **state)
{
	(void)state;
	char dir[] = "/tmp/airlock-policy-ctx-XXXXXX", path[PATH_MAX], rule[POLICY_RULE_MAX];
	struct policy *p;
	struct policy_ctx *ctx;
	const char *last;

	assert_non_null(mkdtemp(dir));
	sub(dir, "a", path);
	mkdir(path, 0700);
	sub(dir, "a/b", path);
	mkdir(path, 0700);
	sub(dir, ".git", path);
	mkdir(path, 0700);
	sub(dir, ".git/info", path);
	mkdir(path, 0700);
	put(dir, ".gitignore", "*.o\nbuild/\n");
	put(dir, "a/.gitignore", "!keep.o\n/local\n");
	put(dir, ".git/info/exclude", "*.tmp\n");
	int rootfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_true(rootfd >= 0);
	assert_int_equal(policy_default(&p), 0);
	assert_int_equal(policy_ctx_new(p, rootfd, &ctx), 0);

	assert_int_equal(why(p, ctx, "x.o", 0, rule), POLICY_IGNORED);
	assert_string_equal(rule, "gitignore: .gitignore:1: *.o");
	assert_int_equal(why(p, ctx, "a/keep.o", 0, NULL), POLICY_SYNCED);
	assert_int_equal(why(p, ctx, "a/b/keep.o", 0, NULL), POLICY_SYNCED);
	assert_int_equal(why(p, ctx, "a/b/other.o", 0, NULL), POLICY_IGNORED);
	assert_int_equal(why(p, ctx, "a/local", 0, rule), POLICY_IGNORED);
	assert_string_equal(rule, "gitignore: a/.gitignore:2: /local");
	assert_int_equal(why(p, ctx, "a/b/local", 0, NULL), POLICY_SYNCED);
	assert_int_equal(why(p, ctx, "a/b/x.tmp", 0, rule), POLICY_IGNORED);
	assert_string_equal(rule, "gitignore: .git/info/exclude:1: *.tmp");
	assert_int_equal(why(p, ctx, "build/keep.o", 0, rule), POLICY_IGNORED);
	assert_string_equal(rule, "gitignore: .gitignore:2: build/");
	/* ignore rules never apply inside .git */
	assert_int_equal(why(p, ctx, ".git/objects/pack/x.o", 0, NULL), POLICY_SYNCED);
	assert_int_equal(why(p, ctx, ".git/build", 1, NULL), POLICY_SYNCED);
	assert_int_equal(policy_ctx_warnings(ctx, &last), 0);
	assert_null(last);

	/* edits take effect after invalidation, not before */
	put(dir, "a/.gitignore", "/keep.o\n");
	assert_int_equal(why(p, ctx, "a/keep.o", 0, NULL), POLICY_SYNCED);
	assert_true(policy_ctx_note_change(ctx, "a/.gitignore"));
	assert_int_equal(why(p, ctx, "a/keep.o", 0, NULL), POLICY_IGNORED);
	assert_int_equal(why(p, ctx, "a/b/keep.o", 0, NULL), POLICY_IGNORED);
	put(dir, ".git/info/exclude", "");
	assert_true(policy_ctx_note_change(ctx, ".git/info/exclude"));
	assert_int_equal(why(p, ctx, "a/b/x.tmp", 0, NULL), POLICY_SYNCED);
	assert_false(policy_ctx_note_change(ctx, "a/keep.o"));
	put(dir, ".gitignore", "*.o\n");
	policy_ctx_invalidate(ctx, "");
	assert_int_equal(why(p, ctx, "build/keep.o", 0, NULL), POLICY_IGNORED);
	assert_int_equal(why(p, ctx, "build/keep.c", 0, NULL), POLICY_SYNCED);

	/* a symlinked .gitignore is not followed; a FIFO is not read; an
	 * oversized one is skipped; each with a warning */
	put(dir, "outside-rules", "*\n");
	sub(dir, "a/b/.gitignore", path);
	assert_int_equal(symlink("../../outside-rules", path), 0);
	policy_ctx_invalidate(ctx, "a/b");
	assert_int_equal(why(p, ctx, "a/b/anything", 0, NULL), POLICY_SYNCED);
	assert_int_equal(policy_ctx_warnings(ctx, &last), 1);
	assert_non_null(strstr(last, "a/b/.gitignore: a symlink (not followed)"));
	unlink(path);
	assert_int_equal(mkfifo(path, 0600), 0);
	policy_ctx_invalidate(ctx, "a/b");
	assert_int_equal(why(p, ctx, "a/b/anything", 0, NULL), POLICY_SYNCED);
	assert_int_equal(policy_ctx_warnings(ctx, &last), 2);
	assert_non_null(strstr(last, "not a regular file"));
	unlink(path);
	FILE *f = fopen(path, "w");
	for (unsigned i = 0; i <= POLICY_IGNORE_MAX / 8; i++)
		fputs("anythin\n", f);
	fclose(f);
	policy_ctx_invalidate(ctx, "a/b");
	assert_int_equal(why(p, ctx, "a/b/anything", 0, NULL), POLICY_SYNCED);
	assert_int_equal(policy_ctx_warnings(ctx, &last), 3);
	assert_non_null(strstr(last, "larger than"));
	unlink(path);
	/* a symlinked directory on the way is not followed either */
	sub(dir, "linkdir", path);
	assert_int_equal(symlink("a", path), 0);
	assert_int_equal(why(p, ctx, "linkdir/keep.o", 0, NULL), POLICY_IGNORED); /* root *.o still applies */
	unlink(path);

	/* a rule-memory cap smaller than the rules on one path: the root's
	 * rules still apply, the deeper file is skipped with a warning */
	policy_ctx_free(ctx);
	put(dir, "a/.gitignore", "/keep.o\n");
	assert_int_equal(policy_ctx_new(p, rootfd, &ctx), 0);
	policy_ctx_set_limits(ctx, 100, 1);
	assert_int_equal(why(p, ctx, "a/keep.o", 0, rule), POLICY_IGNORED);
	assert_string_equal(rule, "gitignore: .gitignore:1: *.o");
	assert_int_equal(why(p, ctx, "a/keep.c", 0, NULL), POLICY_SYNCED);
	assert_true(policy_ctx_warnings(ctx, &last) >= 1);
	assert_non_null(strstr(last, "a/.gitignore: rule memory cap"));

	/* gitignore off: none of it applies */
	policy_ctx_free(ctx);
	policy_free(p);
	put(dir, "p.json", "{\"workspace\":{\"sync\":{\"gitignore\":false}}}");
	sub(dir, "p.json", path);
	assert_int_equal(policy_load(path, &p, rule, sizeof(rule)), 0);
	assert_int_equal(policy_ctx_new(p, rootfd, &ctx), 0);
	assert_int_equal(why(p, ctx, "x.o", 0, NULL), POLICY_SYNCED);
	assert_int_equal(why(p, ctx, ".env", 0, NULL), POLICY_SECRET);
	policy_ctx_free(ctx);
	policy_free(p);

	close(rootfd);
	static const char *const files[] = {"p.json", "outside-rules", ".gitignore", "a/.gitignore",
					    ".git/info/exclude"};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++) {
		sub(dir, files[i], path);
		unlink(path);
	}
	static const char *const dirs[] = {".git/info", ".git", "a/b", "a"};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		sub(dir, dirs[i], path);
		rmdir(path);
	}
	assert_int_equal(rmdir(dir), 0);
}

/* The pathological rule file of doc/SYNC.md "Bounds on ignore rules":
 * thousands of "** / *a*a...*bN" patterns (no spaces) against long names
 * of a's. Each
 * decision stays within the budget (counted in matcher steps, not timed),
 * and a decision that needs more is withheld, naming the rule. */
static void write_budget_rules(const char *path, unsigned n)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	/* a star, then a long literal run that almost matches a's: the
	 * classic matcher's worst case, O(name * run) per pattern; no literal
	 * tail for the suffix check to turn it away */
	for (unsigned i = 0; i < n; i++)
		fprintf(f, "**/*aaaaaaaaaaaaaaaaaaaab%u?\n", i);
	fclose(f);
}

static void test_match_budget(void **state)
{
	(void)state;
	char dir[] = "/tmp/airlock-policy-budget-XXXXXX", path[PATH_MAX], name[256];
	struct policy *p;
	struct policy_ctx *ctx;
	struct policy_verdict v;

	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/.gitignore", dir);
	write_budget_rules(path, 9000);
	int fd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	assert_int_equal(policy_default(&p), 0);
	assert_int_equal(policy_ctx_new(p, fd, &ctx), 0);
	memset(name, 'a', 200);
	name[200] = '\0';
	for (int k = 0; k < 3; k++) {
		char rel[512];
		snprintf(rel, sizeof(rel), k == 0 ? "%s" : k == 1 ? "src/%s" : "src/%s/x", name);
		unsigned long before = ignore_steps();
		assert_int_equal(policy_check(p, ctx, rel, 0, &v), 0);
		unsigned long steps = ignore_steps() - before;
		/* each decision on the path (a directory once, then the file)
		 * within the budget: k=1 decides src and the file, k=2 also src/aaa.. */
		if (steps > (unsigned long)(k + 1) * (POLICY_MATCH_BUDGET + 1))
			fail_msg("%s: %lu matcher steps, over %d budgets of %lu", rel, steps, k + 1,
				 POLICY_MATCH_BUDGET);
		if (v.reason != POLICY_OVER_BUDGET)
			fail_msg("%s: reason %d (%s), want over budget", rel, v.reason, v.rule);
		assert_non_null(strstr(v.rule, "over budget: .gitignore:"));
		assert_non_null(strstr(v.rule, ": **/*aaaaaaaaaaaaaaaaaaaab"));
	}
	/* a directory over budget is pruned: nothing beneath is sent */
	assert_int_equal(policy_check(p, ctx, name, 1, &v), 0);
	assert_int_equal(v.reason, POLICY_OVER_BUDGET);
	assert_true(v.prune);
	/* the budget ends with the decision: a match afterwards runs whole */
	const char *pat = "*aaaaaaaaaaaaaaaaaaaa?";
	assert_true(ignore_wildmatch(pat, strlen(pat), name, 200, 0));
	policy_ctx_free(ctx);

	/* fewer of the same rules: decided in full, and right */
	write_budget_rules(path, 300);
	assert_int_equal(policy_ctx_new(p, fd, &ctx), 0);
	assert_int_equal(policy_check(p, ctx, "aaaaaaaaaaaaaaaaaaaab17x", 0, &v), 0);
	if (v.reason != POLICY_IGNORED || !strstr(v.rule, ".gitignore:18: **/*aaaaaaaaaaaaaaaaaaaab17?"))
		fail_msg("short name: %d %s", v.reason, v.rule);
	assert_int_equal(policy_check(p, ctx, "README.md", 0, &v), 0);
	assert_int_equal(v.reason, POLICY_SYNCED);
	policy_ctx_free(ctx);

	/* more patterns than a rule file may hold: its rules are not used, and
	 * the warning names the file and the cap */
	FILE *f = fopen(path, "w");
	for (unsigned i = 0; i < IGNORE_PATTERNS_MAX + 1; i++)
		fprintf(f, "x%u\n", i);
	fclose(f);
	assert_int_equal(policy_ctx_new(p, fd, &ctx), 0);
	assert_int_equal(policy_check(p, ctx, "x1", 0, &v), 0);
	assert_int_equal(v.reason, POLICY_SYNCED);
	const char *last = NULL;
	assert_int_equal(policy_ctx_warnings(ctx, &last), 1);
	char want[128];
	snprintf(want, sizeof(want), ".gitignore: more than %u patterns; its rules are not used", IGNORE_PATTERNS_MAX);
	assert_string_equal(last, want);
	policy_ctx_free(ctx);
	/* at the cap they are */
	f = fopen(path, "w");
	for (unsigned i = 0; i < IGNORE_PATTERNS_MAX; i++)
		fprintf(f, "x%u\n", i);
	fclose(f);
	assert_int_equal(policy_ctx_new(p, fd, &ctx), 0);
	assert_int_equal(policy_check(p, ctx, "x1", 0, &v), 0);
	assert_int_equal(v.reason, POLICY_IGNORED);
	policy_ctx_free(ctx);
	policy_free(p);
	close(fd);
	unlink(path);
	rmdir(dir);
}

/* The cache stays bounded and gives the same answers when it is dropped. */
static void test_ctx_limits(void **state)
{
	(void)state;
	struct policy *p = load_ok("decisions.json");
	struct policy_ctx *a, *b;
	char path[64];

	assert_int_equal(policy_ctx_new(p, -1, &a), 0);
	assert_int_equal(policy_ctx_new(p, -1, &b), 0);
	policy_ctx_set_limits(b, 3, 1);
	rng_state = 42;
	for (int i = 0; i < 20000; i++) {
		static const char *const comp[] = {"src",  "tests", "build",	    "x",    "generated",
						   "docs", "a.md",  "package.json", ".env", "k.pem"};
		size_t o = 0;
		unsigned depth = 1 + tu_rand(&rng_state, 5);
		for (unsigned k = 0; k < depth; k++)
			o += (size_t)snprintf(path + o, sizeof(path) - o, "%s%s", k ? "/" : "",
					      comp[tu_rand(&rng_state, 10)]);
		int is_dir = (int)tu_rand(&rng_state, 2);
		struct policy_verdict va, vb;
		assert_int_equal(policy_check(p, a, path, is_dir, &va), 0);
		assert_int_equal(policy_check(p, b, path, is_dir, &vb), 0);
		if (va.reason != vb.reason || va.prune != vb.prune || strcmp(va.rule, vb.rule) != 0)
			fail_msg("%s: %d/%s vs %d/%s", path, va.reason, va.rule, vb.reason, vb.rule);
	}
	policy_ctx_free(a);
	policy_ctx_free(b);
	policy_ctx_free(NULL);
	policy_free(p);
}

/* sandbox.limits: counts, sizes as bytes or "512M"/"4G", bounds, unknown
 * keys and wrong types named. */
static void test_sandbox_limits(void **state)
{
	static const struct {
		const char *json;
		int err;
		uint64_t pids, memory, tmp, workspace; /* when err == 0 */
		const char *want;		       /* in the message when err != 0 */
	} cases[] = {
	    {"{}", 0, 0, 0, 0, 0, NULL},
	    {"{\"sandbox\":{\"limits\":{\"pids\":512,\"memory\":\"2G\",\"tmp\":\"256M\",\"workspace\":"
	     "1073741824}}}",
	     0, 512, 2ull << 30, 256ull << 20, 1ull << 30, NULL},
	    {"{\"sandbox\":{\"limits\":{\"memory\":\"1T\"}}}", 0, 0, 1ull << 40, 0, 0, NULL},
	    {"{\"sandbox\":{\"limits\":{\"pids\":8}}}", -EINVAL, 0, 0, 0, 0, "sandbox.limits.pids"},
	    {"{\"sandbox\":{\"limits\":{\"pids\":\"64\"}}}", -EINVAL, 0, 0, 0, 0, "expected a positive integer"},
	    {"{\"sandbox\":{\"limits\":{\"memory\":\"2X\"}}}", -EINVAL, 0, 0, 0, 0, "sandbox.limits.memory"},
	    {"{\"sandbox\":{\"limits\":{\"memory\":\"1M\"}}}", -EINVAL, 0, 0, 0, 0, "must be between"},
	    {"{\"sandbox\":{\"limits\":{\"tmp\":-1}}}", -EINVAL, 0, 0, 0, 0, "sandbox.limits.tmp"},
	    {"{\"sandbox\":{\"limits\":{\"workspace\":\"99999999999T\"}}}", -EINVAL, 0, 0, 0, 0, "too large"},
	    {"{\"sandbox\":{\"limits\":{\"cpu\":2}}}", -EINVAL, 0, 0, 0, 0, "sandbox.limits.cpu"},
	    {"{\"sandbox\":{\"limit\":{}}}", -EINVAL, 0, 0, 0, 0, "sandbox.limit"},
	};
	char dir[64], path[128], err[512];

	(void)state;
	tu_tmpdir(dir, sizeof(dir), "limits");
	snprintf(path, sizeof(path), "%s/airlock.json", dir);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct policy *p = NULL;
		FILE *f = fopen(path, "w");
		assert_non_null(f);
		fputs(cases[i].json, f);
		fclose(f);
		int r = policy_load(path, &p, err, sizeof(err));
		if (r != cases[i].err)
			fail_msg("%s: got %d (%s), want %d", cases[i].json, r, r ? err : "", cases[i].err);
		if (r == 0) {
			const struct policy_sandbox_limits *l = policy_sandbox_limits(p);
			assert_int_equal(l->pids, cases[i].pids);
			assert_int_equal(l->memory, cases[i].memory);
			assert_int_equal(l->tmp, cases[i].tmp);
			assert_int_equal(l->workspace, cases[i].workspace);
			policy_free(p);
		} else if (!strstr(err, cases[i].want)) {
			fail_msg("%s: message \"%s\" lacks \"%s\"", cases[i].json, err, cases[i].want);
		}
	}
	tu_rm_rf(dir);
}

int main(void)
{
	mem_init_json();
	setenv("XDG_CONFIG_HOME", NO_STORE, 1); /* never the user's own approvals */
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_seed_example_loads),
	    cmocka_unit_test(test_full_policy),
	    cmocka_unit_test(test_writeback_keys),
	    cmocka_unit_test(test_default_and_workspace_lookup),
	    cmocka_unit_test(test_trust),
	    cmocka_unit_test(test_bad_policies),
	    cmocka_unit_test(test_alloc_failures),
	    cmocka_unit_test(test_include_exclude),
	    cmocka_unit_test(test_secret_list),
	    cmocka_unit_test(test_secret_prefilter),
	    cmocka_unit_test(test_secrets_through_policy),
	    cmocka_unit_test(test_allow_secrets),
	    cmocka_unit_test(test_bad_relpaths),
	    cmocka_unit_test(test_ctx_rule_files),
	    cmocka_unit_test(test_ctx_limits),
	    cmocka_unit_test(test_match_budget),
	    cmocka_unit_test(test_sandbox_limits),
	    cmocka_unit_test(test_trust_limits),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
