/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for protected paths (protect.h): every rule kind, the near
 * misses that must stay unprotected, case, depth and Windows-name
 * variants, symlinks in and out of the workspace, the policy's withheld
 * paths, and that every table entry is documented in doc/WRITEBACK.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/policy/ignore.h"
#include "airlock/policy/policy.h"
#include "airlock/policy/protect.h"

#ifndef WRITEBACK_DOC
#error "WRITEBACK_DOC must name doc/WRITEBACK.md"
#endif

#define REG (S_IFREG | 0644)
#define DIR (S_IFDIR | 0755)
#define LNK (S_IFLNK | 0777)

struct pcase {
	const char *path;
	uint32_t mode;
	const char *link;
	enum protect_why want;
};

static void run_cases(const struct policy *pol, const struct pcase *c, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		enum protect_why got = protect_check(pol, c[i].path, c[i].mode, c[i].link);
		if (got != c[i].want)
			fail_msg("%s (mode %o, link %s): got %s, want %s", c[i].path, c[i].mode,
				 c[i].link ? c[i].link : "-", protect_why_str(got), protect_why_str(c[i].want));
	}
}

#define RUN(pol, cases) run_cases(pol, cases, sizeof(cases) / sizeof(cases[0]))

/* One example of each kind the issue names, at the root. */
static void test_each_rule(void **state)
{
	(void)state;
	static const struct pcase cases[] = {
	    {"airlock.json", REG, NULL, PROTECT_POLICY_FILE},
	    {".gitignore", REG, NULL, PROTECT_POLICY_FILE},
	    {".git/hooks/pre-commit", REG | 0111, NULL, PROTECT_GIT},
	    {".git/config", REG, NULL, PROTECT_GIT},
	    {".git/refs/heads/main", REG, NULL, PROTECT_GIT},
	    {".git/HEAD", REG, NULL, PROTECT_GIT},
	    {".git", DIR, NULL, PROTECT_GIT},
	    {".git", REG, NULL, PROTECT_GIT}, /* a gitfile */
	    {".gitmodules", REG, NULL, PROTECT_GIT},
	    {".vscode/settings.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".vscode/tasks.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".vscode", DIR, NULL, PROTECT_TOOL_SETTINGS},
	    {".idea/workspace.xml", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".claude/settings.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".claude/settings.local.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {"CLAUDE.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {"AGENTS.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".mcp.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".cursor/rules/x.mdc", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".cursorrules", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".continue/config.yaml", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".roo/mcp.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".roorules-code", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".clinerules", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".clinerules/workflows/a.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".gemini/settings.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".windsurf/rules/a.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".aider.conf.yml", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".aiderignore", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".zed/settings.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".devcontainer/devcontainer.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {"proj.code-workspace", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".github/copilot-instructions.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".github/hooks/policy.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".agents/skills/deploy/SKILL.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".github/workflows/ci.yml", REG, NULL, PROTECT_CI},
	    {".github/actions/setup/action.yml", REG, NULL, PROTECT_CI},
	    {".gitlab-ci.yml", REG, NULL, PROTECT_CI},
	    {".circleci/config.yml", REG, NULL, PROTECT_CI},
	    {"Jenkinsfile", REG, NULL, PROTECT_CI},
	    {".travis.yml", REG, NULL, PROTECT_CI},
	    {"azure-pipelines.yml", REG, NULL, PROTECT_CI},
	    {"bitbucket-pipelines.yml", REG, NULL, PROTECT_CI},
	    {".buildkite/pipeline.yml", REG, NULL, PROTECT_CI},
	    {".drone.yml", REG, NULL, PROTECT_CI},
	    {"CODEOWNERS", REG, NULL, PROTECT_CI},
	    {".github/CODEOWNERS", REG, NULL, PROTECT_CI},
	    {".envrc", REG, NULL, PROTECT_ENVRC},
	    {"mise.toml", REG, NULL, PROTECT_ENVRC},
	    {"mise.local.toml", REG, NULL, PROTECT_ENVRC},
	    {".husky/pre-commit", REG, NULL, PROTECT_ENVRC},
	    {".pre-commit-config.yaml", REG, NULL, PROTECT_ENVRC},
	    {"lefthook.yml", REG, NULL, PROTECT_ENVRC},
	    {".npmrc", REG, NULL, PROTECT_ENVRC},
	    {".yarnrc.yml", REG, NULL, PROTECT_ENVRC},
	    {".yarn/releases/yarn-4.1.0.cjs", REG, NULL, PROTECT_ENVRC},
	    {".cargo/config.toml", REG, NULL, PROTECT_ENVRC},
	    {"gradle/wrapper/gradle-wrapper.jar", REG, NULL, PROTECT_ENVRC},
	    {".env", REG, NULL, PROTECT_SECRET},
	    {".env.local", REG, NULL, PROTECT_SECRET},
	    {"config/prod.env", REG, NULL, PROTECT_SECRET},
	    {"id_rsa", REG, NULL, PROTECT_SECRET},
	    {".ssh/known_hosts", REG, NULL, PROTECT_SECRET}, /* beneath a secret directory */
	    {"certs/server.pem", REG, NULL, PROTECT_SECRET},
	    {"bin/tool", S_IFREG | 04755, NULL, PROTECT_MODE},
	    {"bin/tool", S_IFREG | 02755, NULL, PROTECT_MODE},
	    {"shared", S_IFDIR | 02775, NULL, PROTECT_MODE},
	    {"dev/null", S_IFCHR | 0666, NULL, PROTECT_SPECIAL},
	    {"dev/sda", S_IFBLK | 0660, NULL, PROTECT_SPECIAL},
	    {"run/fifo", S_IFIFO | 0644, NULL, PROTECT_SPECIAL},
	    {"run/sock", S_IFSOCK | 0755, NULL, PROTECT_SPECIAL},
	    {"weird", 0170000 | 0644, NULL, PROTECT_SPECIAL}, /* no such type */
	};
	RUN(NULL, cases);
}

/* What looks close but is not one of them stays writable. */
static void test_near_misses(void **state)
{
	(void)state;
	static const struct pcase cases[] = {
	    {"src/.github.txt", REG, NULL, PROTECT_NONE},
	    {"docs/git/x", REG, NULL, PROTECT_NONE},
	    {"my.envrc.md", REG, NULL, PROTECT_NONE},
	    {"envrc", REG, NULL, PROTECT_NONE},
	    {".envrc.example.md", REG, NULL, PROTECT_NONE},
	    {"src/git.c", REG, NULL, PROTECT_NONE},
	    {".gitignore.txt", REG, NULL, PROTECT_NONE},
	    {".git-blame-ignore-revs", REG, NULL, PROTECT_NONE},
	    {".gitattributes", REG, NULL, PROTECT_NONE},
	    {".github/ISSUE_TEMPLATE/bug.md", REG, NULL, PROTECT_NONE},
	    {".github/dependabot.yml", REG, NULL, PROTECT_NONE},
	    {".github", DIR, NULL, PROTECT_NONE},
	    {"docs/workflows/ci.yml", REG, NULL, PROTECT_NONE},
	    {"github/workflows/ci.yml", REG, NULL, PROTECT_NONE},
	    {"vscode/settings.json", REG, NULL, PROTECT_NONE},
	    {"src/claude.py", REG, NULL, PROTECT_NONE},
	    {"CLAUDE.md.bak", REG, NULL, PROTECT_NONE},
	    {"docs/agents.mdx", REG, NULL, PROTECT_NONE},
	    {"my-airlock.json", REG, NULL, PROTECT_NONE},
	    {"Makefile", REG, NULL, PROTECT_NONE},
	    {"package.json", REG, NULL, PROTECT_NONE},
	    {"package-lock.json", REG, NULL, PROTECT_NONE},
	    {"scripts/build.sh", S_IFREG | 0755, NULL, PROTECT_NONE}, /* +x is fine */
	    {"tmp", S_IFDIR | 01777, NULL, PROTECT_NONE},	      /* sticky is fine */
	    {".tool-versions", REG, NULL, PROTECT_NONE},
	    {".nvmrc", REG, NULL, PROTECT_NONE},
	    {".editorconfig", REG, NULL, PROTECT_NONE},
	    {"src/mise.rs", REG, NULL, PROTECT_NONE},
	    {"Jenkinsfile-notes", REG, NULL, PROTECT_NONE},
	    {"app.py", REG, NULL, PROTECT_NONE},
	    {"new.txt", REG, NULL, PROTECT_NONE},
	    {"src", DIR, NULL, PROTECT_NONE},
	    {".env.example", REG, NULL, PROTECT_SECRET}, /* a secret-list variant: still one */
	};
	RUN(NULL, cases);
}

/* Case, depth, trailing dots/spaces and 8.3 names. */
static void test_variants(void **state)
{
	(void)state;
	static const struct pcase cases[] = {
	    {"sub/.git/config", REG, NULL, PROTECT_GIT},
	    {"vendor/lib/.git/hooks/post-checkout", REG, NULL, PROTECT_GIT},
	    {"a/b/.vscode/settings.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {"pkgs/web/.claude/settings.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {"pkgs/web/CLAUDE.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {"services/api/.github/workflows/x.yaml", REG, NULL, PROTECT_CI},
	    {"sub/.gitlab-ci.yml", REG, NULL, PROTECT_CI},
	    {"sub/dir/.envrc", REG, NULL, PROTECT_ENVRC},
	    {"sub/airlock.json", REG, NULL, PROTECT_POLICY_FILE},
	    {"src/gen/.gitignore", REG, NULL, PROTECT_POLICY_FILE},
	    {".GIT/config", REG, NULL, PROTECT_GIT},
	    {".Git/hooks/x", REG, NULL, PROTECT_GIT},
	    {".VSCode/Settings.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {"claude.md", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".GITHUB/WORKFLOWS/ci.yml", REG, NULL, PROTECT_CI},
	    {".ENVRC", REG, NULL, PROTECT_ENVRC},
	    {".git./config", REG, NULL, PROTECT_GIT},
	    {".git ./config", REG, NULL, PROTECT_GIT},
	    {".envrc.", REG, NULL, PROTECT_ENVRC},
	    {"GIT~1/config", REG, NULL, PROTECT_GIT},
	    {".vscode /tasks.json", REG, NULL, PROTECT_TOOL_SETTINGS},
	    {".ENV", REG, NULL, PROTECT_SECRET},
	    {".env.", REG, NULL, PROTECT_SECRET},
	    {"...", REG, NULL, PROTECT_NONE}, /* all dots: kept as it is */
	};
	RUN(NULL, cases);
}

static void test_symlinks(void **state)
{
	(void)state;
	static const struct pcase cases[] = {
	    /* in */
	    {"link", LNK, "target", PROTECT_NONE},
	    {"a/link", LNK, "../b/c", PROTECT_NONE},
	    {"a/b/link", LNK, "../../x", PROTECT_NONE},
	    {"a/b/link", LNK, "./../c/./d", PROTECT_NONE},
	    {"a/link", LNK, "..", PROTECT_NONE}, /* the root itself */
	    {"link", LNK, ".", PROTECT_NONE},
	    {"a/link", LNK, "b//c/", PROTECT_NONE},
	    {"a/link", LNK, "x/../../y", PROTECT_NONE},
	    /* out */
	    {"link", LNK, "/etc/passwd", PROTECT_SYMLINK_OUT},
	    {"a/link", LNK, "/", PROTECT_SYMLINK_OUT},
	    {"link", LNK, "..", PROTECT_SYMLINK_OUT},
	    {"link", LNK, "../x", PROTECT_SYMLINK_OUT},
	    {"a/link", LNK, "../../x", PROTECT_SYMLINK_OUT},
	    {"a/b/link", LNK, "../../../x", PROTECT_SYMLINK_OUT},
	    {"a/link", LNK, "x/../../../y", PROTECT_SYMLINK_OUT}, /* climbs back past the root */
	    {"a/link", LNK, "./../..", PROTECT_SYMLINK_OUT},
	    {"link", LNK, "", PROTECT_SYMLINK_OUT},
	    {"link", LNK, NULL, PROTECT_SYMLINK_OUT},
	    /* into a protected path: that path's reason */
	    {"hook", LNK, ".git/hooks/pre-commit", PROTECT_GIT},
	    {"src/x.py", LNK, "../.git/hooks/post-checkout", PROTECT_GIT},
	    {"leak", LNK, ".env", PROTECT_SECRET},
	    {"a/ci", LNK, "../.github/workflows/ci.yml", PROTECT_CI},
	    {"a/d", LNK, "../.vscode", PROTECT_TOOL_SETTINGS},
	    /* the link's own path is judged first */
	    {".vscode/l", LNK, "/etc", PROTECT_TOOL_SETTINGS},
	    /* a link in a near-miss place pointing at a near miss */
	    {"docs/git", LNK, "../src/.github.txt", PROTECT_NONE},
	};
	RUN(NULL, cases);
}

static void test_deletes(void **state)
{
	(void)state;
	/* a delete (mode 0): path rules only, files and directories alike */
	static const struct pcase cases[] = {
	    {".git/index", 0, NULL, PROTECT_GIT}, {".vscode", 0, NULL, PROTECT_TOOL_SETTINGS},
	    {".env", 0, NULL, PROTECT_SECRET},	  {".ssh", 0, NULL, PROTECT_SECRET}, /* a secret directory's name */
	    {"app.py", 0, NULL, PROTECT_NONE},	  {"src", 0, NULL, PROTECT_NONE},
	};
	RUN(NULL, cases);
}

static void test_malformed_paths_fail_closed(void **state)
{
	(void)state;
	static char longp[POLICY_PATH_MAX + 2];
	memset(longp, 'a', sizeof(longp) - 1);
	const struct pcase cases[] = {
	    {"", REG, NULL, PROTECT_UNCHECKED},
	    {"/etc/passwd", REG, NULL, PROTECT_UNCHECKED},
	    {"a/", REG, NULL, PROTECT_UNCHECKED},
	    {"a//b", REG, NULL, PROTECT_UNCHECKED},
	    {"./a", REG, NULL, PROTECT_UNCHECKED},
	    {"a/../b", REG, NULL, PROTECT_UNCHECKED},
	    {"..", REG, NULL, PROTECT_UNCHECKED},
	    {longp, REG, NULL, PROTECT_UNCHECKED},
	    /* a link whose target is too long to judge is not let through */
	    {"link", LNK, longp, PROTECT_SYMLINK_OUT},
	};
	RUN(NULL, cases);

	/* a target that only grows past the limit once joined to the link's directory */
	static char dirp[POLICY_PATH_MAX - 8], tgt[64];
	memset(dirp, 'd', sizeof(dirp) - 6);
	memcpy(dirp + sizeof(dirp) - 6, "/link", 6);
	memset(tgt, 't', sizeof(tgt) - 1);
	assert_int_equal(protect_check(NULL, dirp, LNK, tgt), PROTECT_SYMLINK_OUT);
	assert_int_equal(protect_check(NULL, dirp, LNK, "../x"), PROTECT_NONE);
	assert_null(protect_rule_match("a//.git", 0));
	assert_null(protect_rule_match("", 0));
}

static struct policy *policy_from(const char *json)
{
	char dir[256], path[300], err[512];
	struct policy *p = NULL;

	tu_tmpdir(dir, sizeof(dir), "protect");
	snprintf(path, sizeof(path), "%s/airlock.json", dir);
	tu_put_file(AT_FDCWD, path, json, strlen(json), 0644);
	if (policy_load(path, &p, err, sizeof(err)) != 0)
		fail_msg("policy: %s", err);
	tu_rm_rf(dir);
	return p;
}

/* What the policy withholds from the guest never comes back from it. */
static void test_withheld_by_policy(void **state)
{
	(void)state;
	struct policy *p = policy_from("{\"workspace\":{\"sync\":{"
				       "\"include\":[\"/src/\",\"/app.py\",\"/local/\"],"
				       "\"exclude\":[\"*.key.txt\",\"/private/\",\"local/cache/\"],"
				       "\"allow_secrets\":[\"src/.env.test\"]}}}");
	static const struct pcase cases[] = {
	    {"src/main.c", REG, NULL, PROTECT_NONE},
	    {"app.py", REG, NULL, PROTECT_NONE},
	    {"src/api.key.txt", REG, NULL, PROTECT_SECRET},    /* excluded */
	    {"private/notes.md", REG, NULL, PROTECT_SECRET},   /* excluded directory */
	    {"README.md", REG, NULL, PROTECT_SECRET},	       /* not included */
	    {"docs", DIR, NULL, PROTECT_SECRET},	       /* not included */
	    {"local/cache/x", 0, NULL, PROTECT_SECRET},	       /* delete beneath an excluded dir */
	    {"src/.env.test", REG, NULL, PROTECT_SECRET},      /* allowed into the guest, not out */
	    {"src/link", LNK, "../README.md", PROTECT_SECRET}, /* into a withheld path */
	    {"src/link", LNK, "../app.py", PROTECT_NONE},
	};
	RUN(p, cases);

	/* the ctx variant answers the same, with one ctx for every call */
	struct policy_ctx *ctx;
	assert_int_equal(policy_ctx_new(p, -1, &ctx), 0);
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_int_equal(protect_check_ctx(p, ctx, cases[i].path, cases[i].mode, cases[i].link), cases[i].want);
	policy_ctx_free(ctx);
	policy_free(p);
}

/* The loaded policy's own file, wherever the workspace names it. */
static void test_policy_source(void **state)
{
	(void)state;
	char dir[256], path[320], err[512];
	struct policy *p = NULL;

	tu_tmpdir(dir, sizeof(dir), "protect-src");
	snprintf(path, sizeof(path), "%s/conf", dir);
	assert_int_equal(mkdir(path, 0755), 0);
	snprintf(path, sizeof(path), "%s/conf/sandbox-policy.json", dir);
	tu_put_file(AT_FDCWD, path, "{}", 2, 0644);
	assert_int_equal(policy_load(path, &p, err, sizeof(err)), 0);
	assert_int_equal(protect_check(p, "conf/sandbox-policy.json", REG, NULL), PROTECT_POLICY_FILE);
	assert_int_equal(protect_check(p, "sandbox-policy.json", REG, NULL), PROTECT_POLICY_FILE);
	assert_int_equal(protect_check(p, "other/sandbox-policy.json", REG, NULL), PROTECT_NONE);
	assert_int_equal(protect_check(p, "x-policy.json", REG, NULL), PROTECT_NONE); /* suffix, not at a '/' */
	policy_free(p);
	tu_rm_rf(dir);

	/* the built-in default has no file */
	assert_int_equal(policy_default(&p), 0);
	assert_int_equal(protect_check(p, "app.py", REG, NULL), PROTECT_NONE);
	assert_int_equal(protect_check(p, "airlock.json", REG, NULL), PROTECT_POLICY_FILE);
	policy_free(p);
}

/* An example path a pattern must match: wildcards filled in, "**\/" dropped. */
static void example_of(const char *pat, char *out, size_t n)
{
	size_t o = 0;

	if (strncmp(pat, "**/", 3) == 0)
		pat += 3;
	for (; *pat && o + 2 < n; pat++)
		out[o++] = (*pat == '*' || *pat == '?') ? 'x' : *pat;
	out[o] = '\0';
}

/* Every entry is well formed, documented, and protects its own example
 * at the root, deeper, in upper case, and everything beneath it. */
static void test_table(void **state)
{
	(void)state;
	size_t n;
	const struct protect_rule *t = protect_table(&n);
	FILE *f = fopen(WRITEBACK_DOC, "r");
	static char doc[1 << 17];
	size_t dl;

	assert_non_null(f);
	dl = fread(doc, 1, sizeof(doc) - 1, f);
	fclose(f);
	doc[dl] = '\0';
	assert_true(n > 100);
	for (size_t i = 0; i < n; i++)
		for (size_t j = 0; j < i; j++)
			if (strcasecmp(t[i].pattern, t[j].pattern) == 0)
				fail_msg("%s is in the table twice", t[i].pattern);
	for (size_t i = 0; i < n; i++) {
		const char *why;
		char q[160], ex[160], deep[200], up[160];
		if (ignore_glob_check(t[i].pattern, &why) != 0)
			fail_msg("%s: %s", t[i].pattern, why);
		assert_true(t[i].why > PROTECT_NONE && t[i].why < PROTECT_SECRET);
		assert_non_null(t[i].what);
		snprintf(q, sizeof(q), "`%s`", t[i].pattern);
		if (!strstr(doc, q))
			fail_msg("doc/WRITEBACK.md does not list %s", q);

		example_of(t[i].pattern, ex, sizeof(ex));
		snprintf(deep, sizeof(deep), "a/b/%s/f", ex);
		size_t k = 0;
		for (; ex[k]; k++)
			up[k] = (char)(ex[k] >= 'a' && ex[k] <= 'z' ? ex[k] - 'a' + 'A' : ex[k]);
		up[k] = '\0';
		const char *paths[] = {ex, deep + 4, deep, up};
		for (k = 0; k < 4; k++) {
			const struct protect_rule *m = protect_rule_match(paths[k], 0);
			if (!m)
				fail_msg("%s does not protect %s", t[i].pattern, paths[k]);
			if (m->why != t[i].why)
				fail_msg("%s: %s is protected as %s by %s", t[i].pattern, paths[k],
					 protect_why_str(m->why), m->pattern);
			if (protect_check(NULL, paths[k], REG, NULL) != t[i].why)
				fail_msg("protect_check(%s) disagrees with the table", paths[k]);
		}
	}
}

static void test_why_str(void **state)
{
	(void)state;
	for (int w = PROTECT_NONE; w <= PROTECT_UNCHECKED; w++) {
		const char *s = protect_why_str((enum protect_why)w);
		assert_non_null(s);
		assert_string_not_equal(s, "unknown");
		for (int v = PROTECT_NONE; v < w; v++)
			assert_string_not_equal(s, protect_why_str((enum protect_why)v));
	}
	assert_string_equal(protect_why_str((enum protect_why)(PROTECT_UNCHECKED + 1)), "unknown");
	assert_string_equal(protect_why_str(PROTECT_TOOL_SETTINGS), "editor/agent settings");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_each_rule),
	    cmocka_unit_test(test_near_misses),
	    cmocka_unit_test(test_variants),
	    cmocka_unit_test(test_symlinks),
	    cmocka_unit_test(test_deletes),
	    cmocka_unit_test(test_malformed_paths_fail_closed),
	    cmocka_unit_test(test_withheld_by_policy),
	    cmocka_unit_test(test_policy_source),
	    cmocka_unit_test(test_table),
	    cmocka_unit_test(test_why_str),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
