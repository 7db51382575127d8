/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_PROTECT_H
#define AIRLOCK_PROTECT_H

/*
 * protect: the guest changes that are never written back to the host
 * automatically, whatever workspace.writeback says, and why. Review still
 * shows them (marked with protect_why_str) and the user may accept them
 * by hand. doc/WRITEBACK.md "Protected paths" is the list and the reason
 * for each entry; the table lives in fs/policy/protect.c and the test
 * checks that every pattern of it appears in that document.
 *
 * A change is protected when any of these holds, checked in this order
 * (the first one found is the answer):
 *   - its type is not a regular file, directory or symlink (PROTECT_SPECIAL);
 *   - it carries a setuid or setgid bit (PROTECT_MODE);
 *   - the path, or any directory above it, matches a pattern of the table
 *     (policy file and sync rules, git metadata, editor/agent settings, CI
 *     definitions, what runs on the host unasked);
 *   - the path or a directory above it is on the built-in secret list (even
 *     when workspace.sync.allow_secrets lets it into the guest), or the
 *     policy withholds it from the guest (secret, exclude, not included):
 *     the guest's version must never land on the host's (PROTECT_SECRET);
 *   - it is a symlink whose target leaves the workspace, computed lexically
 *     from the link's own directory: absolute, empty, or ".." climbing past
 *     the root (PROTECT_SYMLINK_OUT); or whose target, resolved the same
 *     way, is itself a protected path (that path's reason: a planted link
 *     must not make a host tool write into .git/hooks or .env).
 *
 * Matching is ASCII case-insensitive and ignores trailing dots and spaces
 * of each path component (".GIT", ".git." and ".vscode " are what a
 * case-insensitive or Windows-backed host file system makes of the real
 * names); "git~1" (the 8.3 name of .git) counts as .git, as git itself
 * refuses it. Near misses are not protected: "src/.github.txt",
 * "docs/git/x", "my.envrc.md", ".github/ISSUE_TEMPLATE/bug.md".
 *
 * Thread-safety: the table is immutable; every function may be called
 * from any thread (a policy_ctx, when given, by one thread at a time).
 */

#include <stddef.h>
#include <stdint.h>

struct policy;
struct policy_ctx;

/* Why a guest change may never be written back automatically.
 * PROTECT_NONE: it may. */
enum protect_why {
	PROTECT_NONE = 0,
	PROTECT_POLICY_FILE,   /* airlock.json (any depth, and the loaded policy's own path), .gitignore */
	PROTECT_GIT,	       /* .git and all beneath it, at any depth (hooks, config, refs); .gitmodules */
	PROTECT_TOOL_SETTINGS, /* .vscode/ .idea/ .claude/ .cursor/ CLAUDE.md AGENTS.md .mcp.json ... */
	PROTECT_CI,	       /* .github/workflows/ .gitlab-ci.yml .circleci/ Jenkinsfile CODEOWNERS ... */
	PROTECT_ENVRC,	       /* runs on the host unasked: .envrc, mise.toml, .husky/, .npmrc ... */
	PROTECT_SECRET,	       /* secret-shaped path, or withheld from the guest by the policy */
	PROTECT_MODE,	       /* setuid/setgid bits */
	PROTECT_SPECIAL,       /* device, FIFO, socket, or any other non-file type */
	PROTECT_SYMLINK_OUT,   /* symlink whose target leaves the workspace */
	PROTECT_UNCHECKED,     /* could not be checked (malformed path, out of memory): refused */
};

/* Is the guest change at path protected, and why?
 *
 * path: workspace-relative ("a/b": no leading, trailing or doubled "/", no
 * "." or ".." components, at most POLICY_PATH_MAX bytes); anything else
 * is PROTECT_UNCHECKED, never PROTECT_NONE.
 * mode: the guest's st_mode (type and permission bits). 0 for a delete
 * (no guest object): then only the path rules apply, and a withheld check
 * answers for both a file and a directory of that name.
 * link: the symlink target when S_ISLNK(mode), else ignored (NULL). A
 * symlink without a target is PROTECT_SYMLINK_OUT.
 * pol: the workspace policy, or NULL for the built-in rules only (the
 * secret list still applies). Gitignore files are not read here: ignored
 * paths are guest-owned and never reach write-back.
 *
 * Fails closed: PROTECT_UNCHECKED when it cannot answer. */
enum protect_why protect_check(const struct policy *pol, const char *path, uint32_t mode, const char *link);

/* The same, with a policy_ctx made for pol (policy_ctx_new) reused across
 * many calls, so that checking 10k changes does not build 10k contexts.
 * A ctx made with the workspace's rootfd also reads .gitignore files; an
 * ignored path is then not "withheld" (it is guest-owned). ctx NULL: as
 * protect_check. */
enum protect_why protect_check_ctx(const struct policy *pol, struct policy_ctx *ctx, const char *path, uint32_t mode,
				   const char *link);

/* Short, user-facing, static: "editor/agent settings", "CI definition". */
const char *protect_why_str(enum protect_why w);

/* ---- the table (for docs, review output and tests) ---- */

struct protect_rule {
	const char *pattern; /* gitignore-style, matched against the path and each directory above it */
	enum protect_why why;
	const char *what; /* what the file is, e.g. "VS Code settings, tasks (runOn folderOpen)" */
};

/* The whole table; *n its length. */
const struct protect_rule *protect_table(size_t *n);

/* The table entry that protects path (or a directory above it), or NULL.
 * Only the table: no type, mode, secret or symlink rule. path as for
 * protect_check (a malformed path gives NULL). */
const struct protect_rule *protect_rule_match(const char *path, int is_dir);

#endif
