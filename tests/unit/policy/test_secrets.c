/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for the secret list's names (fs/policy/secrets.c): the
 * names that used to get through, the backup and temporary names editors
 * derive from a secret's name, and allow_secrets releasing only the exact
 * path it names. The table itself (documented, well formed, prefilter) is
 * tested in test_policy.c.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "airlock/policy/policy.h"

/* names that must be withheld (files) */
static const char *const secret_files[] = {
    /* dotenv variants and directories' files */
    ".env_prod",
    ".env-staging",
    ".env.d/db",
    ".env.d/sub/x.conf",
    ".envs/.production/.django",
    ".envs/.local/.postgres",
    ".flaskenv",
    /* git credentials and configs */
    ".config/git/credentials",
    "home/.config/git/credentials",
    "vendor/mirror.git/config",
    "mirror.git/config",
    "vendor/mirror.git/config.worktree",
    ".git-credentials.bak",
    ".netrc.bak",
    /* keys, key stores, wallets */
    ".config/sops/age/keys.txt",
    "deploy_key",
    "ci/deploy_key",
    "private_key",
    "identity",
    "key.json",
    "sa-key.json",
    "keystore.json",
    "wallet.dat",
    "server.pem.bak",
    "terraform.tfvars.bak",
    "secrets.yaml.bak",
    ".config/rclone/rclone.conf",
    "pip.conf",
    ".secrets",
    "token.txt",
    ".Xauthority",
    /* names derived from a secret's name */
    ".env~",
    "sub/.env~",
    ".env.bak",
    ".env.orig",
    "..env.swp",
    ".env.swo",
    ".token.txt.swp",
    "#.env#",
    ".#.env",
    ".env___jb_tmp___",
    ".env___jb_old___",
    "config/.npmrc___jb_tmp___",
    "id_rsa~",
    "server.key.orig",
    ".env.~1~",
    ".env.bak~",
    ".netrc.old",
    "credentials.json.save",
    ".ENV~",
};

/* names that must still sync */
static const char *const plain_files[] = {
    "notes.txt",
    "main.c~",
    "package.json.orig",
    "README.md.bak",
    "src/app.py.swp",
    "#main.c#",
    ".#main.c",
    "index.ts___jb_tmp___",
    "config",
    "vendor/lib/config",
    "identity.go",
    "keys.txt",
    "key.json.md",
    "tokens.txt.md",
    "env.txt",
    ".envoy.yaml",
    "environment.yml",
    "x.git.md",
    "mirror.git/HEAD",
    "mirror.git/description",
    ".~lock.doc#",
    "~",
    ".bak",
    "#",
    "##",
};

static void test_new_and_derived_names(void **state)
{
	(void)state;
	struct policy *p;
	struct policy_ctx *ctx;

	assert_int_equal(policy_default(&p), 0);
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	for (size_t i = 0; i < sizeof(secret_files) / sizeof(secret_files[0]); i++) {
		struct policy_verdict v;
		assert_int_equal(policy_check(p, ctx, secret_files[i], 0, &v), 0);
		if (v.reason != POLICY_SECRET)
			fail_msg("%s should be withheld as a secret (reason %d, %s)", secret_files[i], v.reason,
				 v.rule);
	}
	for (size_t i = 0; i < sizeof(plain_files) / sizeof(plain_files[0]); i++) {
		struct policy_verdict v;
		assert_int_equal(policy_check(p, ctx, plain_files[i], 0, &v), 0);
		if (v.reason != POLICY_SYNCED)
			fail_msg("%s should sync (%s)", plain_files[i], v.rule);
	}
	/* directories: a backup of a secret directory holds the same keys */
	assert_non_null(policy_secret_match(".ssh.bak", 1));
	assert_non_null(policy_secret_match(".env.d", 1));
	assert_null(policy_secret_match("src.bak", 1));
	policy_ctx_free(ctx);
	policy_free(p);
}

static struct policy *policy_text(const char *json)
{
	char path[] = "/tmp/airlock-test-secrets-XXXXXX", err[512];
	struct policy *p = NULL;
	int fd = mkstemp(path);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, json, strlen(json)), (ssize_t)strlen(json));
	close(fd);
	if (policy_load(path, &p, err, sizeof(err)) != 0)
		fail_msg("%s", err);
	unlink(path);
	return p;
}

/* An allow_secrets entry naming a directory releases that directory, not
 * what is beneath it. */
static void test_allow_exact_directory(void **state)
{
	(void)state;
	static const struct {
		const char *path;
		int is_dir;
		enum policy_reason reason;
	} d[] = {
	    {".aws", 1, POLICY_SECRET},
	    {".aws/sso", 1, POLICY_SYNCED},
	    {".aws/sso/cache.json", 0, POLICY_SECRET},
	    {".aws/sso/cache", 1, POLICY_SECRET},
	    {".aws/sso/cache/token.json", 0, POLICY_SECRET},
	    {".aws/sso/ok.txt", 0, POLICY_SYNCED},
	    {".aws/config", 0, POLICY_SECRET},
	    {".terraform", 1, POLICY_SYNCED},
	    {".terraform/providers/registry/aws", 0, POLICY_SECRET},
	    {".terraform/modules/modules.json", 0, POLICY_SECRET},
	    {".env.d", 1, POLICY_SYNCED},
	    {".env.d/defaults", 0, POLICY_SYNCED},
	    {".env.d/prod", 0, POLICY_SECRET},
	};
	struct policy *p =
	    policy_text("{\"workspace\":{\"sync\":{\"allow_secrets\":[\".aws/sso\", \".aws/sso/ok.txt\", "
			"\".terraform\", \".env.d\", \".env.d/defaults\"]}}}");
	struct policy_ctx *ctx;

	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	for (size_t i = 0; i < sizeof(d) / sizeof(d[0]); i++) {
		struct policy_verdict v;
		assert_int_equal(policy_check(p, ctx, d[i].path, d[i].is_dir, &v), 0);
		if (v.reason != d[i].reason)
			fail_msg("%s: reason %d, expected %d (%s)", d[i].path, v.reason, d[i].reason, v.rule);
		if (v.reason == POLICY_SECRET && !strstr(v.rule, "secret: "))
			fail_msg("%s: rule %s", d[i].path, v.rule);
	}
	policy_ctx_free(ctx);
	policy_free(p);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_new_and_derived_names),
	    cmocka_unit_test(test_allow_exact_directory),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
