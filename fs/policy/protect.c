/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Protected paths: the guest changes write-back never applies on its own
 * (protect.h). The line drawn: a file is protected when the host runs or
 * obeys it without the user asking (on cd, on folder open, on agent start,
 * on git commit, in CI, on every start of a package manager), when it
 * decides what the host withholds from the guest, or when it is a secret.
 * The project's own code and build files (Makefile, package.json,
 * scripts/) are not: the user runs them by asking, reviews them as code,
 * and changing them is what the agent is for.
 *
 * doc/WRITEBACK.md "Protected paths" documents every entry and why it is
 * here; the test checks that each pattern appears there. Change both.
 */
#include "airlock/policy/protect.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>

#include "airlock/policy/ignore.h"
#include "airlock/policy/policy.h"

/* One entry per line reads best as a table. */
/* clang-format off */
#define R(pat, why, what) { pat, PROTECT_##why, what }

static const struct protect_rule table[] = {
	/* what airlock itself obeys */
	R("airlock.json", POLICY_FILE, "airlock policy (here, or of a nested workspace)"),
	R(".gitignore", POLICY_FILE, "sync rules: un-ignoring a path makes the host send it to the guest"),

	/* git metadata */
	R(".git", GIT, "git directory or gitfile: hooks, config, refs, objects, info/exclude"),
	R("git~1", GIT, "8.3 short name of .git (refused by git itself)"),
	R(".gitmodules", GIT, "submodule URLs and paths (where git fetches code from)"),

	/* editors: settings, tasks and launch files the editor runs or obeys */
	R(".vscode", TOOL_SETTINGS, "VS Code settings, tasks (runOn folderOpen), launch, mcp.json"),
	R("*.code-workspace", TOOL_SETTINGS, "VS Code workspace file (settings, tasks)"),
	R(".devcontainer", TOOL_SETTINGS, "Dev Containers (initializeCommand runs on the host)"),
	R(".devcontainer.json", TOOL_SETTINGS, "Dev Containers (initializeCommand runs on the host)"),
	R(".idea", TOOL_SETTINGS, "JetBrains project settings, run configurations, external tools"),
	R(".run", TOOL_SETTINGS, "JetBrains shared run configurations"),
	R(".fleet", TOOL_SETTINGS, "JetBrains Fleet settings and run configurations"),
	R(".zed", TOOL_SETTINGS, "Zed settings and tasks (language server commands)"),
	R(".rules", TOOL_SETTINGS, "Zed agent instructions"),
	R(".helix", TOOL_SETTINGS, "Helix languages.toml (language server commands)"),
	R(".nvim.lua", TOOL_SETTINGS, "Neovim exrc (executed on start with 'exrc')"),
	R(".nvimrc", TOOL_SETTINGS, "Neovim exrc (executed on start with 'exrc')"),
	R(".exrc", TOOL_SETTINGS, "Vim/Neovim exrc (executed on start with 'exrc')"),
	R(".dir-locals.el", TOOL_SETTINGS, "Emacs directory variables (eval forms)"),
	R(".dir-locals-2.el", TOOL_SETTINGS, "Emacs directory variables (eval forms)"),
	R("*.sublime-project", TOOL_SETTINGS, "Sublime Text project (build systems)"),
	R(".externalToolBuilders", TOOL_SETTINGS, "Eclipse builders run on every automatic build"),

	/* coding agents: settings, hooks, MCP servers, permissions, instructions */
	R(".claude", TOOL_SETTINGS, "Claude Code settings (hooks, permissions, MCP), commands, agents"),
	R("CLAUDE.md", TOOL_SETTINGS, "Claude Code instructions"),
	R("CLAUDE.local.md", TOOL_SETTINGS, "Claude Code instructions"),
	R(".mcp.json", TOOL_SETTINGS, "project MCP servers (commands an agent starts)"),
	R(".cursor", TOOL_SETTINGS, "Cursor rules, mcp.json, environment"),
	R(".cursorrules", TOOL_SETTINGS, "Cursor instructions"),
	R(".cursorignore", TOOL_SETTINGS, "Cursor: what the agent may read"),
	R(".cursorindexingignore", TOOL_SETTINGS, "Cursor indexing rules"),
	R(".continue", TOOL_SETTINGS, "Continue config, rules, MCP servers"),
	R(".continuerc.json", TOOL_SETTINGS, "Continue workspace config"),
	R(".continueignore", TOOL_SETTINGS, "Continue: what the agent may read"),
	R(".roo", TOOL_SETTINGS, "Roo Code rules and mcp.json"),
	R(".roomodes", TOOL_SETTINGS, "Roo Code custom modes (tool permissions)"),
	R(".rooignore", TOOL_SETTINGS, "Roo Code: what the agent may read"),
	R(".roorules*", TOOL_SETTINGS, "Roo Code instructions"),
	R(".clinerules", TOOL_SETTINGS, "Cline rules and workflows (file or directory)"),
	R(".clineignore", TOOL_SETTINGS, "Cline: what the agent may read"),
	R(".kilocode", TOOL_SETTINGS, "Kilo Code rules and mcp.json"),
	R(".kilocodemodes", TOOL_SETTINGS, "Kilo Code custom modes"),
	R(".windsurf", TOOL_SETTINGS, "Windsurf rules and workflows"),
	R(".windsurfrules", TOOL_SETTINGS, "Windsurf instructions"),
	R(".codeiumignore", TOOL_SETTINGS, "Windsurf/Codeium: what the agent may read"),
	R(".gemini", TOOL_SETTINGS, "Gemini CLI settings (MCP servers, tool discovery commands)"),
	R("GEMINI.md", TOOL_SETTINGS, "Gemini CLI instructions"),
	R(".geminiignore", TOOL_SETTINGS, "Gemini CLI: what the agent may read"),
	R(".codex", TOOL_SETTINGS, "Codex project config.toml"),
	R("AGENTS.md", TOOL_SETTINGS, "Codex, Amp, Cursor, Jules... instructions"),
	R("AGENTS.override.md", TOOL_SETTINGS, "Codex instructions"),
	R("AGENT.md", TOOL_SETTINGS, "Amp instructions"),
	R(".agents", TOOL_SETTINGS, "Codex skills (.agents/skills: instructions and their scripts)"),
	R(".agent", TOOL_SETTINGS, "Antigravity rules and workflows"),
	R(".aider*", TOOL_SETTINGS, "Aider config (.aider.conf.yml: lint/test commands), model settings, ignore"),
	R("**/.github/copilot-instructions.md", TOOL_SETTINGS, "GitHub Copilot instructions"),
	R("**/.github/instructions", TOOL_SETTINGS, "GitHub Copilot instructions"),
	R("**/.github/prompts", TOOL_SETTINGS, "GitHub Copilot prompt files"),
	R("**/.github/chatmodes", TOOL_SETTINGS, "GitHub Copilot chat modes (tool sets)"),
	R("**/.github/agents", TOOL_SETTINGS, "GitHub Copilot custom agents"),
	R("**/.github/hooks", TOOL_SETTINGS, "GitHub Copilot hooks (commands run on session start, tool use)"),
	R("**/.github/skills", TOOL_SETTINGS, "GitHub Copilot skills (instructions and their scripts)"),
	R(".amazonq", TOOL_SETTINGS, "Amazon Q Developer rules and MCP"),
	R(".kiro", TOOL_SETTINGS, "Kiro steering, specs and hooks (commands run on file events)"),
	R(".junie", TOOL_SETTINGS, "JetBrains Junie guidelines"),
	R(".augment", TOOL_SETTINGS, "Augment rules"),
	R(".augment-guidelines", TOOL_SETTINGS, "Augment instructions"),
	R(".trae", TOOL_SETTINGS, "Trae rules"),
	R(".opencode", TOOL_SETTINGS, "opencode agents, commands, plugins"),
	R("opencode.json", TOOL_SETTINGS, "opencode config (MCP servers, permissions)"),
	R("opencode.jsonc", TOOL_SETTINGS, "opencode config (MCP servers, permissions)"),
	R(".crush.json", TOOL_SETTINGS, "Crush config (MCP servers, permissions)"),
	R("crush.json", TOOL_SETTINGS, "Crush config (MCP servers, permissions)"),
	R("CRUSH.md", TOOL_SETTINGS, "Crush instructions"),
	R(".qwen", TOOL_SETTINGS, "Qwen Code settings"),
	R("QWEN.md", TOOL_SETTINGS, "Qwen Code instructions"),
	R(".goosehints", TOOL_SETTINGS, "Goose instructions"),
	R(".openhands", TOOL_SETTINGS, "OpenHands microagents and setup script"),
	R(".tabnine", TOOL_SETTINGS, "Tabnine guidelines"),

	/* CI: runs with the repository's deploy secrets once pushed */
	R("**/.github/workflows", CI, "GitHub Actions workflows"),
	R("**/.github/actions", CI, "GitHub Actions local actions (run by workflows)"),
	R("**/.gitea/workflows", CI, "Gitea Actions workflows"),
	R("**/.forgejo/workflows", CI, "Forgejo Actions workflows"),
	R(".gitlab-ci.yml", CI, "GitLab CI"),
	R(".gitlab-ci.yaml", CI, "GitLab CI"),
	R(".circleci", CI, "CircleCI"),
	R("Jenkinsfile", CI, "Jenkins pipeline"),
	R("Jenkinsfile.*", CI, "Jenkins pipeline"),
	R("*.jenkinsfile", CI, "Jenkins pipeline"),
	R(".travis.yml", CI, "Travis CI"),
	R("azure-pipelines.yml", CI, "Azure Pipelines"),
	R("azure-pipelines.yaml", CI, "Azure Pipelines"),
	R(".azure-pipelines", CI, "Azure Pipelines"),
	R("bitbucket-pipelines.yml", CI, "Bitbucket Pipelines"),
	R(".buildkite", CI, "Buildkite"),
	R(".drone.yml", CI, "Drone CI"),
	R(".drone.yaml", CI, "Drone CI"),
	R(".woodpecker", CI, "Woodpecker CI"),
	R(".woodpecker.yml", CI, "Woodpecker CI"),
	R(".woodpecker.yaml", CI, "Woodpecker CI"),
	R("appveyor.yml", CI, "AppVeyor"),
	R(".appveyor.yml", CI, "AppVeyor"),
	R(".cirrus.yml", CI, "Cirrus CI"),
	R(".cirrus.star", CI, "Cirrus CI"),
	R(".semaphore", CI, "Semaphore"),
	R("codemagic.yaml", CI, "Codemagic"),
	R("cloudbuild.yaml", CI, "Google Cloud Build"),
	R("cloudbuild.yml", CI, "Google Cloud Build"),
	R("buildspec.yml", CI, "AWS CodeBuild"),
	R(".teamcity", CI, "TeamCity Kotlin DSL"),
	R("bamboo-specs", CI, "Bamboo specs"),
	R(".tekton", CI, "Tekton pipelines"),
	R("CODEOWNERS", CI, "who must approve a merge"),

	/* runs on the host without the user asking: on cd, on git commit, on tool start */
	R(".envrc", ENVRC, "direnv: sourced by the shell on cd"),
	R("mise.toml", ENVRC, "mise: env scripts and hooks run on cd"),
	R("mise.*.toml", ENVRC, "mise: env scripts and hooks run on cd"),
	R(".mise.toml", ENVRC, "mise: env scripts and hooks run on cd"),
	R(".mise.*.toml", ENVRC, "mise: env scripts and hooks run on cd"),
	R(".mise", ENVRC, "mise: config and tasks"),
	R("**/mise/config.toml", ENVRC, "mise: env scripts and hooks run on cd"),
	R("**/.config/mise", ENVRC, "mise: env scripts and hooks run on cd"),
	R("**/.config/mise.toml", ENVRC, "mise: env scripts and hooks run on cd"),
	R(".husky", ENVRC, "husky git hooks (core.hooksPath): run on commit"),
	R(".githooks", ENVRC, "conventional core.hooksPath: run on commit"),
	R(".pre-commit-config.yaml", ENVRC, "pre-commit hooks: run on commit"),
	R(".pre-commit-config.yml", ENVRC, "pre-commit hooks: run on commit"),
	R("lefthook.*", ENVRC, "lefthook git hooks: run on commit"),
	R(".lefthook.*", ENVRC, "lefthook git hooks: run on commit"),
	R("lefthook-local.*", ENVRC, "lefthook git hooks: run on commit"),
	R(".lefthook-local.*", ENVRC, "lefthook git hooks: run on commit"),
	R(".lefthook", ENVRC, "lefthook hook scripts: run on commit"),
	R(".overcommit.yml", ENVRC, "overcommit git hooks: run on commit"),
	R(".simple-git-hooks.*", ENVRC, "simple-git-hooks: run on commit"),
	R("simple-git-hooks.*", ENVRC, "simple-git-hooks: run on commit"),
	R(".npmrc", ENVRC, "npm config read on every npm start (node-options, script-shell, registry)"),
	R(".yarnrc", ENVRC, "yarn classic config (yarn-path: the yarn that runs)"),
	R(".yarnrc.yml", ENVRC, "yarn config (yarnPath: the yarn that runs, plugins)"),
	R("**/.yarn/releases", ENVRC, "yarn binary that yarnPath runs"),
	R("**/.yarn/plugins", ENVRC, "yarn plugins loaded on every start"),
	R(".pnpmfile.cjs", ENVRC, "pnpm hooks run on install"),
	R(".pnpmfile.mjs", ENVRC, "pnpm hooks run on install"),
	R("bunfig.toml", ENVRC, "bun config (preload scripts)"),
	R("**/.cargo/config", ENVRC, "cargo config (runner, rustc-wrapper, registries)"),
	R("**/.cargo/config.toml", ENVRC, "cargo config (runner, rustc-wrapper, registries)"),
	R(".mvn", ENVRC, "Maven wrapper, extensions and JVM options"),
	R("**/gradle/wrapper", ENVRC, "Gradle wrapper jar and distribution URL"),
};
/* clang-format on */

#define N_RULES (sizeof(table) / sizeof(table[0]))

static struct compiled {
	struct ignore_pattern pat;
	const char *last; /* the pattern's final component */
	size_t lastlen;
	bool last_literal; /* the final component has no wildcard: compare it */
} compiled[N_RULES];
static pthread_once_t compiled_once = PTHREAD_ONCE_INIT;

static void compile(void)
{
	for (size_t i = 0; i < N_RULES; i++) {
		struct compiled *c = &compiled[i];
		const char *s = table[i].pattern;
		const char *sl;

		/* table patterns are static, non-empty and well formed (tested) */
		ignore_pattern_init(&c->pat, s, strlen(s), IGNORE_CASEFOLD, (unsigned)i);
		sl = memrchr(c->pat.text, '/', c->pat.len);
		c->last = sl ? sl + 1 : c->pat.text;
		c->lastlen = c->pat.len - (size_t)(c->last - c->pat.text);
		c->last_literal = true;
		for (size_t k = 0; k < c->lastlen; k++)
			if (strchr("*?[\\", c->last[k]))
				c->last_literal = false;
	}
}

const struct protect_rule *protect_table(size_t *n)
{
	*n = N_RULES;
	return table;
}

const char *protect_why_str(enum protect_why w)
{
	static const char *const names[] = {
	    [PROTECT_NONE] = "not protected",
	    [PROTECT_POLICY_FILE] = "airlock policy or sync rules",
	    [PROTECT_GIT] = "git metadata",
	    [PROTECT_TOOL_SETTINGS] = "editor/agent settings",
	    [PROTECT_CI] = "CI definition",
	    [PROTECT_ENVRC] = "runs on the host unasked",
	    [PROTECT_SECRET] = "secret or withheld on the host",
	    [PROTECT_MODE] = "setuid/setgid bit",
	    [PROTECT_SPECIAL] = "device, FIFO or socket",
	    [PROTECT_SYMLINK_OUT] = "symlink out of the workspace",
	    [PROTECT_UNCHECKED] = "could not be checked",
	};

	if ((unsigned)w >= sizeof(names) / sizeof(names[0]) || !names[w])
		return "unknown";
	return names[w];
}

/* The component of s[0..len) that starts at offset at: its length in *n.
 * false past the end. */
static bool comp_at(const char *s, size_t len, size_t at, size_t *n)
{
	const char *e;

	if (at > len)
		return false;
	e = memchr(s + at, '/', len - at);
	*n = (e ? (size_t)(e - s) : len) - at;
	return true;
}

/* "." or ".." */
static bool is_dot(const char *c, size_t n)
{
	return (n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.');
}

/* A workspace-relative path as policy.h defines it, non-empty. */
static bool path_ok(const char *s, size_t len)
{
	if (len == 0 || len > POLICY_PATH_MAX)
		return false;
	for (size_t c = 0, n; comp_at(s, len, c, &n); c += n + 1)
		if (n == 0 || is_dot(s + c, n))
			return false;
	return true;
}

/* Copy path to out (POLICY_PATH_MAX + 1 bytes) with the trailing dots and
 * spaces of every component dropped, as Windows-backed file systems do
 * (".git." is .git there). A component made only of them is kept. */
static void normalize(const char *path, size_t len, char *out)
{
	size_t o = 0;

	for (size_t c = 0, n; comp_at(path, len, c, &n); c += n + 1) {
		size_t k = n;
		while (k > 0 && (path[c + k - 1] == '.' || path[c + k - 1] == ' '))
			k--;
		if (k == 0)
			k = n;
		if (o)
			out[o++] = '/';
		memcpy(out + o, path + c, k);
		o += k;
	}
	out[o] = '\0';
}

/* The rule matching the prefix path[0..len) itself (not its parents). */
static const struct protect_rule *match_one(const char *path, size_t len, int is_dir)
{
	const char *sl = memrchr(path, '/', len);
	const char *bn = sl ? sl + 1 : path;
	size_t bl = len - (size_t)(bn - path);

	for (size_t i = 0; i < N_RULES; i++) {
		const struct compiled *c = &compiled[i];
		if (c->last_literal && (c->lastlen != bl || strncasecmp(bn, c->last, bl) != 0))
			continue;
		if (ignore_pattern_match(&c->pat, "", 0, path, len, is_dir))
			return &table[i];
	}
	return NULL;
}

/* The rule matching norm (already normalized) or a directory above it. */
static const struct protect_rule *match_path(const char *norm, int is_dir)
{
	size_t len = strlen(norm);
	const struct protect_rule *r;

	pthread_once(&compiled_once, compile);
	for (size_t e = 0; e < len; e++)
		if (norm[e] == '/' && (r = match_one(norm, e, 1)))
			return r;
	return match_one(norm, len, is_dir);
}

const struct protect_rule *protect_rule_match(const char *path, int is_dir)
{
	char norm[POLICY_PATH_MAX + 1];
	size_t len = strnlen(path, POLICY_PATH_MAX + 1);

	if (!path_ok(path, len))
		return NULL;
	normalize(path, len, norm);
	return match_path(norm, is_dir);
}

/* On the built-in secret list, itself or through a directory above it
 * (allow_secrets is not consulted: letting a secret into the guest is not
 * letting the guest's version of it out). */
static bool secret_shaped(char *norm, int is_dir)
{
	size_t len = strlen(norm);
	bool hit = false;

	for (size_t e = 0; e < len && !hit; e++) {
		if (norm[e] != '/')
			continue;
		norm[e] = '\0';
		hit = policy_secret_match(norm, 1) != NULL;
		norm[e] = '/';
	}
	return hit || policy_secret_match(norm, is_dir) != NULL;
}

/* Does the policy withhold path from the guest? -errno when it cannot say.
 * Ignored paths are guest-owned, not withheld. */
static int withheld(const struct policy *pol, struct policy_ctx *ctx, const char *path, int is_dir)
{
	struct policy_verdict v;
	int r = policy_check(pol, ctx, path, is_dir, &v);

	if (r < 0)
		return r;
	return v.reason != POLICY_SYNCED && v.reason != POLICY_IGNORED;
}

/* The loaded policy's own file, when it lies in the workspace: its source
 * path ends in "/<path>" (the workspace root is not known here, so any
 * such suffix counts: a false positive only asks for a review). */
static bool is_policy_source(const struct policy *pol, const char *path)
{
	const char *src = pol ? policy_source(pol) : NULL;
	size_t sl = src ? strlen(src) : 0, pl = strlen(path);

	return src && src[0] == '/' && sl > pl && src[sl - pl - 1] == '/' && strcmp(src + sl - pl, path) == 0;
}

/* The path rules for one path: table, policy file, secret, withheld.
 * type: S_IFDIR, S_IFREG/S_IFLNK (a file), or 0 (unknown: both). */
static enum protect_why check_path(const struct policy *pol, struct policy_ctx *ctx, const char *path, uint32_t type)
{
	char norm[POLICY_PATH_MAX + 1];
	size_t len = strnlen(path, POLICY_PATH_MAX + 1);
	const struct protect_rule *rule;
	int is_dir = type == S_IFDIR, r;

	if (!path_ok(path, len))
		return PROTECT_UNCHECKED;
	normalize(path, len, norm);
	if ((rule = match_path(norm, is_dir)) || (type == 0 && (rule = match_path(norm, 1))))
		return rule->why;
	if (is_policy_source(pol, path))
		return PROTECT_POLICY_FILE;
	if (secret_shaped(norm, is_dir) || (type == 0 && secret_shaped(norm, 1)))
		return PROTECT_SECRET;
	if (!pol)
		return PROTECT_NONE;
	if ((r = withheld(pol, ctx, path, is_dir)) == 0 && type == 0)
		r = withheld(pol, ctx, path, 1);
	return r < 0 ? PROTECT_UNCHECKED : r ? PROTECT_SECRET : PROTECT_NONE;
}

/* Resolve link (the target of the symlink at path) lexically from the
 * link's directory into out (POLICY_PATH_MAX + 1 bytes, "" for the root).
 * false when it leaves the workspace or is too long to say. */
static bool resolve_link(const char *path, const char *link, char *out)
{
	size_t o, ll = strnlen(link, POLICY_PATH_MAX + 1);
	const char *sl = strrchr(path, '/');

	if (ll == 0 || ll > POLICY_PATH_MAX || link[0] == '/')
		return false;
	o = sl ? (size_t)(sl - path) : 0;
	memcpy(out, path, o);
	for (size_t c = 0, n; comp_at(link, ll, c, &n); c += n + 1) {
		if (n == 2 && is_dot(link + c, n)) {
			if (o == 0)
				return false; /* climbs past the root */
			const char *up = memrchr(out, '/', o);
			o = up ? (size_t)(up - out) : 0;
		} else if (n > 0 && !is_dot(link + c, n)) {
			if (o + (o > 0) + n > POLICY_PATH_MAX)
				return false;
			if (o)
				out[o++] = '/';
			memcpy(out + o, link + c, n);
			o += n;
		}
	}
	out[o] = '\0';
	return true;
}

enum protect_why protect_check_ctx(const struct policy *pol, struct policy_ctx *ctx, const char *path, uint32_t mode,
				   const char *link)
{
	struct policy_ctx *own = NULL;
	uint32_t type = mode & S_IFMT;
	enum protect_why w;
	char target[POLICY_PATH_MAX + 1];

	if (type != 0 && type != S_IFREG && type != S_IFDIR && type != S_IFLNK)
		return PROTECT_SPECIAL;
	if (mode & (S_ISUID | S_ISGID))
		return PROTECT_MODE;
	if (pol && !ctx) {
		if (policy_ctx_new(pol, -1, &own) < 0)
			return PROTECT_UNCHECKED;
		ctx = own;
	}
	w = check_path(pol, ctx, path, type);
	if (w == PROTECT_NONE && type == S_IFLNK) {
		if (!link || !resolve_link(path, link, target))
			w = PROTECT_SYMLINK_OUT;
		else if (target[0] != '\0')
			w = check_path(pol, ctx, target, 0);
	}
	policy_ctx_free(own);
	return w;
}

enum protect_why protect_check(const struct policy *pol, const char *path, uint32_t mode, const char *link)
{
	return protect_check_ctx(pol, NULL, path, mode, link);
}
