/* SPDX-License-Identifier: Apache-2.0 */
/* gitargs: the positive model of a host-side git command (gitargs.h, doc/EXEC.md). */
#include "airlock/host/gitargs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "airlock/core/errmsg.h"

/* ---- the model ---- */

#define F(l, s)                                                                                                        \
	{                                                                                                              \
		l, s, GA_FLAG, GA_NONE                                                                                 \
	}
#define R(l, s, k)                                                                                                     \
	{                                                                                                              \
		l, s, GA_REQ, k                                                                                        \
	}
#define S(l, s, k)                                                                                                     \
	{                                                                                                              \
		l, s, GA_STUCK, k                                                                                      \
	}
#define O(l, s, k)                                                                                                     \
	{                                                                                                              \
		l, s, GA_OPT, k                                                                                        \
	}
#define END                                                                                                            \
	{                                                                                                              \
		NULL, 0, GA_FLAG, GA_NONE                                                                              \
	}

/* Every subcommand's "-h" (usage). "--help" is not here: it starts man or,
 * with help.format=web from the repository's config, a browser command. */
static const struct gitargs_opt usage_opts[] = {F(NULL, 'h'), END};

/* git's diff options (diff.c), shared by diff, log and show. Left out:
 * --output (writes a file), --output-indicator-* (crafted lines with
 * --output), --no-index (reads any two files), --ext-diff and --textconv
 * (run programs; both are replaced anyway), --default-prefix (newer git). */
static const struct gitargs_opt diff_opts[] = {
    F("patch", 'p'),
    F("no-patch", 's'),
    F(NULL, 'u'),
    O("unified", 'U', GA_NUM),
    F("function-context", 'W'),
    F("no-function-context", 0),
    F("raw", 0),
    F("patch-with-raw", 0),
    F("patch-with-stat", 0),
    F("numstat", 0),
    F("shortstat", 0),
    O("dirstat", 'X', GA_TEXT),
    F("cumulative", 0),
    O("dirstat-by-file", 0, GA_TEXT),
    F("check", 0),
    F("summary", 0),
    F("name-only", 0),
    F("name-status", 0),
    O("stat", 0, GA_TEXT),
    R("stat-width", 0, GA_NUM),
    R("stat-name-width", 0, GA_NUM),
    R("stat-graph-width", 0, GA_NUM),
    R("stat-count", 0, GA_NUM),
    F("compact-summary", 0),
    F("binary", 0),
    F("full-index", 0),
    O("color", 0, GA_TEXT),
    F("no-color", 0),
    R("ws-error-highlight", 0, GA_TEXT),
    F(NULL, 'z'),
    O("abbrev", 0, GA_NUM),
    F("no-abbrev", 0),
    R("src-prefix", 0, GA_TEXT),
    R("dst-prefix", 0, GA_TEXT),
    R("line-prefix", 0, GA_TEXT),
    F("no-prefix", 0),
    R("inter-hunk-context", 0, GA_NUM),
    O("break-rewrites", 'B', GA_TEXT),
    O("find-renames", 'M', GA_TEXT),
    F("irreversible-delete", 'D'),
    O("find-copies", 'C', GA_TEXT),
    F("find-copies-harder", 0),
    F("no-renames", 0),
    F("rename-empty", 0),
    F("no-rename-empty", 0),
    F("follow", 0),
    R(NULL, 'l', GA_NUM),
    F("minimal", 0),
    F("ignore-all-space", 'w'),
    F("ignore-space-change", 'b'),
    F("ignore-space-at-eol", 0),
    F("ignore-cr-at-eol", 0),
    F("ignore-blank-lines", 0),
    R("ignore-matching-lines", 'I', GA_TEXT),
    F("indent-heuristic", 0),
    F("no-indent-heuristic", 0),
    F("patience", 0),
    F("histogram", 0),
    R("diff-algorithm", 0, GA_TEXT),
    R("anchored", 0, GA_TEXT),
    O("word-diff", 0, GA_TEXT),
    R("word-diff-regex", 0, GA_TEXT),
    O("color-words", 0, GA_TEXT),
    O("color-moved", 0, GA_TEXT),
    F("no-color-moved", 0),
    R("color-moved-ws", 0, GA_TEXT),
    F("no-color-moved-ws", 0),
    O("relative", 0, GA_PATHSPEC),
    F("no-relative", 0),
    F("text", 'a'),
    F(NULL, 'R'),
    F("exit-code", 0),
    F("quiet", 0),
    F("no-ext-diff", 0),
    F("no-textconv", 0),
    O("ignore-submodules", 0, GA_TEXT),
    O("submodule", 0, GA_TEXT),
    F("ita-invisible-in-index", 0),
    F("ita-visible-in-index", 0),
    R(NULL, 'S', GA_TEXT),
    R(NULL, 'G', GA_TEXT),
    F("pickaxe-all", 0),
    F("pickaxe-regex", 0),
    R(NULL, 'O', GA_PATH), /* the order file, read from disk */
    R("rotate-to", 0, GA_PATHSPEC),
    R("skip-to", 0, GA_PATHSPEC),
    R("find-object", 0, GA_REV),
    R("diff-filter", 0, GA_TEXT),
    END,
};

/* `git diff`'s own. */
static const struct gitargs_opt diff_cmd_opts[] = {
    F("cached", 0),
    F("staged", 0),
    F("merge-base", 0),
    END,
};

/* The revision walk (revision.c, builtin/log.c) for log and show. git's
 * own parser takes a separate value for only some of these, so values go
 * stuck ("--author=x"), except -n and -L. Left out: --stdin (revisions
 * and paths from stdin), --show-signature (runs gpg). */
static const struct gitargs_opt rev_opts[] = {
    R(NULL, 'n', GA_NUM),
    S("max-count", 0, GA_NUM),
    S("skip", 0, GA_NUM),
    S("since", 0, GA_TEXT),
    S("after", 0, GA_TEXT),
    S("until", 0, GA_TEXT),
    S("before", 0, GA_TEXT),
    S("since-as-filter", 0, GA_TEXT),
    S("author", 0, GA_TEXT),
    S("committer", 0, GA_TEXT),
    S("grep", 0, GA_TEXT),
    S("grep-reflog", 0, GA_TEXT),
    F("all-match", 0),
    F("invert-grep", 0),
    F("regexp-ignore-case", 'i'),
    F("basic-regexp", 0),
    F("extended-regexp", 'E'),
    F("fixed-strings", 'F'),
    F("perl-regexp", 'P'),
    F("merges", 0),
    F("no-merges", 0),
    S("min-parents", 0, GA_NUM),
    S("max-parents", 0, GA_NUM),
    F("no-min-parents", 0),
    F("no-max-parents", 0),
    F("first-parent", 0),
    F("exclude-first-parent-only", 0),
    F("not", 0),
    F("all", 0),
    O("branches", 0, GA_TEXT),
    O("tags", 0, GA_TEXT),
    O("remotes", 0, GA_TEXT),
    S("glob", 0, GA_TEXT),
    S("exclude", 0, GA_TEXT),
    F("reflog", 0),
    F("walk-reflogs", 'g'),
    O("ancestry-path", 0, GA_REV),
    F("full-history", 0),
    F("dense", 0),
    F("sparse", 0),
    F("simplify-merges", 0),
    F("simplify-by-decoration", 0),
    F("topo-order", 0),
    F("date-order", 0),
    F("author-date-order", 0),
    F("reverse", 0),
    F("boundary", 0),
    F("left-right", 0),
    F("left-only", 0),
    F("right-only", 0),
    F("cherry-pick", 0),
    F("cherry-mark", 0),
    F("cherry", 0),
    F("parents", 0),
    F("children", 0),
    O("no-walk", 0, GA_TEXT),
    F("do-walk", 0),
    F("graph", 0),
    F("no-graph", 0),
    F("oneline", 0),
    O("pretty", 0, GA_TEXT),
    S("format", 0, GA_TEXT),
    F("abbrev-commit", 0),
    F("no-abbrev-commit", 0),
    S("encoding", 0, GA_TEXT),
    O("expand-tabs", 0, GA_NUM),
    F("no-expand-tabs", 0),
    O("notes", 0, GA_REV),
    F("no-notes", 0),
    S("date", 0, GA_TEXT),
    F("relative-date", 0),
    O("decorate", 0, GA_TEXT),
    F("no-decorate", 0),
    S("decorate-refs", 0, GA_TEXT),
    S("decorate-refs-exclude", 0, GA_TEXT),
    F("clear-decorations", 0),
    F("source", 0),
    F("use-mailmap", 0),
    F("no-use-mailmap", 0),
    F("mailmap", 0),
    F("no-mailmap", 0),
    F("log-size", 0),
    R(NULL, 'L', GA_TEXT), /* "<start>,<end>:<file>": a path in the commits, not on disk */
    F(NULL, 'c'),
    F("cc", 0),
    F(NULL, 'm'),
    S("diff-merges", 0, GA_TEXT),
    F("no-diff-merges", 0),
    F("remerge-diff", 0),
    F("combined-all-paths", 0),
    F("full-diff", 0),
    O("show-linear-break", 0, GA_TEXT),
    END,
};

static const struct gitargs_opt status_opts[] = {
    F("verbose", 'v'),
    F("short", 's'),
    F("branch", 'b'),
    F("show-stash", 0),
    F("ahead-behind", 0),
    F("no-ahead-behind", 0),
    O("porcelain", 0, GA_TEXT),
    F("long", 0),
    F("null", 'z'),
    O("untracked-files", 'u', GA_TEXT),
    O("ignored", 0, GA_TEXT),
    O("ignore-submodules", 0, GA_TEXT),
    O("column", 0, GA_TEXT),
    F("no-column", 0),
    F("renames", 0),
    F("no-renames", 0),
    O("find-renames", 'M', GA_TEXT),
    END,
};

static const struct gitargs_opt ls_files_opts[] = {
    F(NULL, 'z'),
    F(NULL, 't'),
    F(NULL, 'v'),
    F(NULL, 'f'),
    F("cached", 'c'),
    F("deleted", 'd'),
    F("modified", 'm'),
    F("others", 'o'),
    F("ignored", 'i'),
    F("stage", 's'),
    F("killed", 'k'),
    F("directory", 0),
    F("empty-directory", 0),
    F("no-empty-directory", 0),
    F("eol", 0),
    F("unmerged", 'u'),
    F("resolve-undo", 0),
    R("exclude", 'x', GA_TEXT),
    R("exclude-from", 'X', GA_PATH),
    R("exclude-per-directory", 0, GA_NAME),
    F("exclude-standard", 0),
    F("full-name", 0),
    F("recurse-submodules", 0),
    F("error-unmatch", 0),
    R("with-tree", 0, GA_REV),
    O("abbrev", 0, GA_NUM),
    F("debug", 0),
    F("deduplicate", 0),
    F("sparse", 0),
    R("format", 0, GA_TEXT),
    END,
};

/* Left out: --contents (any file as the final image). */
static const struct gitargs_opt blame_opts[] = {
    F("incremental", 0),
    F(NULL, 'b'),
    F("root", 0),
    F("show-stats", 0),
    F("progress", 0),
    F("no-progress", 0),
    F("score-debug", 0),
    F("show-name", 'f'),
    F("show-number", 'n'),
    F("porcelain", 'p'),
    F("line-porcelain", 0),
    F(NULL, 'c'),
    F(NULL, 't'),
    F(NULL, 'l'),
    F(NULL, 's'),
    F("show-email", 'e'),
    F(NULL, 'w'),
    R("ignore-rev", 0, GA_REV),
    R("ignore-revs-file", 0, GA_PATH),
    F("color-lines", 0),
    F("color-by-age", 0),
    F("minimal", 0),
    R(NULL, 'S', GA_PATH), /* a file of revisions */
    O(NULL, 'C', GA_NUM),
    O(NULL, 'M', GA_NUM),
    R(NULL, 'L', GA_TEXT),
    O("abbrev", 0, GA_NUM),
    F("reverse", 0),
    F("first-parent", 0),
    S("date", 0, GA_TEXT),
    S("encoding", 0, GA_TEXT),
    END,
};

/* Left out: --no-index (any directory), -O/--open-files-in-pager (runs
 * a program), --textconv, --ext-grep. */
static const struct gitargs_opt grep_opts[] = {
    F("cached", 0),
    F("untracked", 0),
    F("exclude-standard", 0),
    F("no-exclude-standard", 0),
    F("recurse-submodules", 0),
    F("invert-match", 'v'),
    F("ignore-case", 'i'),
    F("word-regexp", 'w'),
    F("text", 'a'),
    F(NULL, 'I'),
    F("no-textconv", 0),
    F("recursive", 'r'),
    F("no-recursive", 0),
    R("max-depth", 0, GA_NUM),
    F("extended-regexp", 'E'),
    F("basic-regexp", 'G'),
    F("fixed-strings", 'F'),
    F("perl-regexp", 'P'),
    F("line-number", 'n'),
    F("column", 0),
    F(NULL, 'H'),
    F("full-name", 0),
    F("files-with-matches", 'l'),
    F("name-only", 0),
    F("files-without-match", 'L'),
    F("null", 'z'),
    F("only-matching", 'o'),
    F("count", 'c'),
    O("color", 0, GA_TEXT),
    F("no-color", 0),
    F("break", 0),
    F("heading", 0),
    R("context", 'C', GA_NUM),
    R("before-context", 'B', GA_NUM),
    R("after-context", 'A', GA_NUM),
    R("threads", 0, GA_NUM),
    F("show-function", 'p'),
    F("function-context", 'W'),
    R(NULL, 'f', GA_PATH), /* patterns from a file */
    R(NULL, 'e', GA_TEXT),
    F("and", 0),
    F("or", 0),
    F("not", 0),
    F("quiet", 'q'),
    F("all-match", 0),
    R("max-count", 'm', GA_NUM),
    END,
};

/* Listing, and creating a branch in the repository (inside the
 * workspace). Left out: -d/-D/-m/-M/-c/-C/-f, -u, --edit-description. */
static const struct gitargs_opt branch_opts[] = {
    F("verbose", 'v'),
    F("quiet", 'q'),
    F("remotes", 'r'),
    F("all", 'a'),
    F("list", 'l'),
    F("show-current", 0),
    R("contains", 0, GA_REV),
    R("no-contains", 0, GA_REV),
    R("merged", 0, GA_REV),
    R("no-merged", 0, GA_REV),
    R("points-at", 0, GA_REV),
    O("column", 0, GA_TEXT),
    F("no-column", 0),
    O("color", 0, GA_TEXT),
    F("no-color", 0),
    R("sort", 0, GA_TEXT),
    F("ignore-case", 'i'),
    R("format", 0, GA_TEXT),
    O("abbrev", 0, GA_NUM),
    F("no-abbrev", 0),
    END,
};

/* Left out: -i/-p/-e (interactive.diffFilter runs a program; an editor),
 * --pathspec-from-file. */
static const struct gitargs_opt add_opts[] = {
    F("dry-run", 'n'),	    F("verbose", 'v'),
    F("force", 'f'),	    F("update", 'u'),
    F("renormalize", 0),    F("intent-to-add", 'N'),
    F("all", 'A'),	    F("no-all", 0),
    F("ignore-removal", 0), F("no-ignore-removal", 0),
    F("refresh", 0),	    F("ignore-errors", 0),
    F("ignore-missing", 0), F("sparse", 0),
    R("chmod", 0, GA_TEXT), END,
};

/* Left out: -S/--gpg-sign (signs with the user's key), --interactive,
 * -p/--patch, --pathspec-from-file. */
static const struct gitargs_opt commit_opts[] = {
    F("quiet", 'q'),
    F("verbose", 'v'),
    R("file", 'F', GA_PATH),
    R("author", 0, GA_TEXT),
    R("date", 0, GA_TEXT),
    R("message", 'm', GA_TEXT),
    R("reedit-message", 'c', GA_REV),
    R("reuse-message", 'C', GA_REV),
    R("fixup", 0, GA_REV),
    R("squash", 0, GA_REV),
    F("reset-author", 0),
    R("trailer", 0, GA_TEXT),
    F("signoff", 's'),
    F("no-signoff", 0),
    R("template", 't', GA_PATH),
    F("edit", 'e'),
    F("no-edit", 0),
    R("cleanup", 0, GA_TEXT),
    F("status", 0),
    F("no-status", 0),
    F("no-gpg-sign", 0),
    F("all", 'a'),
    F("include", 'i'),
    F("only", 'o'),
    F("no-verify", 'n'),
    F("verify", 0),
    F("dry-run", 0),
    F("short", 0),
    F("branch", 0),
    F("ahead-behind", 0),
    F("no-ahead-behind", 0),
    F("porcelain", 0),
    F("long", 0),
    F("null", 'z'),
    F("amend", 0),
    F("no-post-rewrite", 0),
    F("allow-empty", 0),
    F("allow-empty-message", 0),
    O("untracked-files", 'u', GA_TEXT),
    END,
};

/* Left out: --stdin-paths (file names from stdin, unchecked). */
static const struct gitargs_opt hash_object_opts[] = {
    R(NULL, 't', GA_TEXT),     F(NULL, 'w'), F("stdin", 0), F("no-filters", 0), F("literally", 0),
    R("path", 0, GA_PATHSPEC), END,
};

/* Left out: --upload-pack/--exec (a program to run). */
static const struct gitargs_opt ls_remote_opts[] = {
    F("quiet", 'q'),
    F("tags", 't'),
    F("heads", 0), /* -h is usage here too when alone; git takes it as --heads otherwise */
    F("refs", 0),
    F("get-url", 0),
    F("exit-code", 0),
    F("symref", 0),
    R("sort", 0, GA_TEXT),
    R("server-option", 'o', GA_TEXT),
    END,
};

/* rev-parse's own parser. Left out: --prefix (moves where paths are
 * taken from), --resolve-git-dir (probes any path), --parseopt,
 * --sq-quote, --local-env-vars, --show-ref-format (newer git). */
static const struct gitargs_opt rev_parse_opts[] = {
    F("verify", 0),
    F("quiet", 'q'),
    F("sq", 0),
    F("not", 0),
    F("all", 0),
    O("branches", 0, GA_TEXT),
    O("tags", 0, GA_TEXT),
    O("remotes", 0, GA_TEXT),
    S("glob", 0, GA_TEXT),
    S("exclude", 0, GA_TEXT),
    F("symbolic", 0),
    F("symbolic-full-name", 0),
    O("abbrev-ref", 0, GA_TEXT),
    O("short", 0, GA_NUM),
    F("revs-only", 0),
    F("no-revs", 0),
    F("flags", 0),
    F("no-flags", 0),
    R("default", 0, GA_REV),
    F("show-toplevel", 0),
    F("show-cdup", 0),
    F("show-prefix", 0),
    F("git-dir", 0),
    F("git-common-dir", 0),
    F("absolute-git-dir", 0),
    F("is-inside-git-dir", 0),
    F("is-inside-work-tree", 0),
    F("is-bare-repository", 0),
    F("is-shallow-repository", 0),
    F("show-superproject-working-tree", 0),
    F("shared-index-path", 0),
    O("show-object-format", 0, GA_TEXT),
    S("path-format", 0, GA_TEXT),
    S("since", 0, GA_TEXT),
    S("after", 0, GA_TEXT),
    S("until", 0, GA_TEXT),
    S("before", 0, GA_TEXT),
    S("disambiguate", 0, GA_TEXT),
    R("git-path", 0, GA_TEXT), /* prints a path, opens nothing */
    END,
};

#define TABLES(...) ((const struct gitargs_opt *const[]){__VA_ARGS__, usage_opts, NULL})

static const char *const credential_words[] = {"fill", "approve", "reject", NULL};

/* Sorted by name. */
static const struct gitargs_cmd commands[] = {
    {"add", TABLES(add_opts), GA_PATHSPEC, GA_PATHSPEC, 0, NULL, 0},
    {"blame", TABLES(blame_opts), GA_REVPATH, GA_PATHSPEC, 0, NULL, 0},
    {"branch", TABLES(branch_opts), GA_TEXT, GA_NONE, 0, NULL, 0},
    {"commit", TABLES(commit_opts), GA_PATHSPEC, GA_PATHSPEC, 0, NULL, 0},
    {"credential", TABLES(usage_opts), GA_WORD, GA_NONE, 0, credential_words, 1},
    {"diff", TABLES(diff_cmd_opts, diff_opts), GA_REVPATH, GA_PATHSPEC, 0, NULL, 0},
    {"grep", TABLES(grep_opts), GA_REVPATH, GA_PATHSPEC, GITARGS_DIGITS | GITARGS_FIRST_PATTERN, NULL, 0},
    {"hash-object", TABLES(hash_object_opts), GA_PATH, GA_PATH, 0, NULL, 0},
    {"log", TABLES(rev_opts, diff_opts), GA_REVPATH, GA_PATHSPEC, GITARGS_DIGITS, NULL, 0},
    {"ls-files", TABLES(ls_files_opts), GA_PATHSPEC, GA_PATHSPEC, 0, NULL, 0},
    {"ls-remote", TABLES(ls_remote_opts), GA_TEXT, GA_NONE, GITARGS_FIRST_REMOTE, NULL, 0},
    {"rev-parse", TABLES(rev_parse_opts), GA_REVPATH, GA_PATHSPEC, 0, NULL, 0},
    {"show", TABLES(rev_opts, diff_opts), GA_REVPATH, GA_PATHSPEC, GITARGS_DIGITS, NULL, 0},
    {"status", TABLES(status_opts), GA_PATHSPEC, GA_PATHSPEC, 0, NULL, 0},
};

/* git options before the subcommand. -c/--config-env set any
 * configuration, --exec-path/-C/--git-dir/--work-tree/--namespace point
 * git elsewhere; --help starts man or a browser. --version stands alone
 * (with --build-options). */
static const struct gitargs_opt global_opts[] = {
    F("no-pager", 'P'), F("no-optional-locks", 0), F("literal-pathspecs", 0), F("no-replace-objects", 0), END,
};

const struct gitargs_cmd *gitargs_commands(size_t *n)
{
	*n = sizeof(commands) / sizeof(commands[0]);
	return commands;
}

const struct gitargs_cmd *gitargs_find(const char *name)
{
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(commands[i].name, name))
			return &commands[i];
	return NULL;
}

/* ---- paths ---- */

/* Lexically: does rel (relative to the root) climb above it? */
static bool climbs(const char *rel)
{
	long depth = 0;

	for (const char *p = rel; *p;) {
		size_t n = strcspn(p, "/");
		if (n == 2 && p[0] == '.' && p[1] == '.') {
			if (--depth < 0)
				return true;
		} else if (n && !(n == 1 && p[0] == '.')) {
			depth++;
		}
		p += n;
		while (*p == '/')
			p++;
	}
	return false;
}

/* The longest existing prefix of rel must resolve beneath the root
 * (symlinks followed, the kernel refusing any escape). A missing tail
 * cannot lead anywhere yet. */
static int resolves_beneath(int root_fd, char *rel, const char **what)
{
	struct open_how how;

	memset(&how, 0, sizeof(how));
	how.flags = O_PATH | O_CLOEXEC;
	how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
	for (unsigned again = 0;;) {
		long fd = syscall(SYS_openat2, root_fd, *rel ? rel : ".", &how, sizeof(how));
		/* ".." under RESOLVE_BENEATH: the kernel says EAGAIN when a rename
		 * or mount anywhere raced with the walk; try again, boundedly */
		if (fd < 0 && errno == EAGAIN && ++again < 64)
			continue;
		if (fd >= 0) {
			close((int)fd);
			return 0;
		}
		if (errno == EXDEV || errno == ELOOP) {
			*what = "leaves the workspace (through a symlink or '..')";
			return -EPERM;
		}
		if (errno != ENOENT && errno != ENOTDIR) {
			*what = "cannot be checked inside the workspace";
			return -EPERM;
		}
		char *slash = strrchr(rel, '/');
		if (!slash)
			return 0; /* nothing of it exists below the root */
		*slash = '\0';
	}
}

int gitargs_path_inside(const struct gitargs_ws *ws, const char *p, const char **what)
{
	char rel[PATH_MAX];
	int k;

	if (p[0] == '~') {
		*what = "starts with '~'";
		return -EPERM;
	}
	if (p[0] == '/') {
		size_t rl = strcmp(ws->root, "/") ? strlen(ws->root) : 0;
		if (strncmp(p, ws->root, rl) || (p[rl] && p[rl] != '/')) {
			*what = "is an absolute path outside the workspace";
			return -EPERM;
		}
		k = snprintf(rel, sizeof(rel), "%s", p + rl + (p[rl] == '/'));
	} else {
		k = snprintf(rel, sizeof(rel), "%s%s%s", ws->cwd, ws->cwd[0] ? "/" : "", p);
	}
	if (k < 0 || (size_t)k >= sizeof(rel)) {
		*what = "is too long";
		return -EPERM;
	}
	if (climbs(rel)) {
		*what = "climbs above the workspace with '..'";
		return -EPERM;
	}
	return resolves_beneath(ws->root_fd, rel, what);
}

/* A pathspec: its magic (":(...)" or the short ":!", ":^", ":/") and then
 * the path. "top" is relative to the repository's top, which this check
 * cannot place, and an unknown magic word is refused rather than guessed. */
static int pathspec_inside(const struct gitargs_ws *ws, const char *p, const char **what)
{
	static const char *const magic_ok[] = {"literal", "glob", "icase", "exclude"};

	if (p[0] != ':')
		return gitargs_path_inside(ws, p, what);
	p++;
	if (*p == '(') {
		const char *close = strchr(p, ')');
		if (!close) {
			*what = "has an unterminated pathspec magic '(...)'";
			return -EPERM;
		}
		for (const char *w = p + 1; w < close;) {
			size_t n = strcspn(w, ",)");
			bool ok = n >= 5 && !strncmp(w, "attr:", 5);
			for (size_t i = 0; !ok && i < sizeof(magic_ok) / sizeof(magic_ok[0]); i++)
				ok = strlen(magic_ok[i]) == n && !strncmp(w, magic_ok[i], n);
			if (!ok) {
				*what = n == 3 && !strncmp(w, "top", 3) ? "uses pathspec magic 'top' (relative to the "
									  "repository's top, not the workspace)"
									: "uses pathspec magic not known to be safe";
				return -EPERM;
			}
			w += n;
			if (*w == ',')
				w++;
		}
		p = close + 1;
	} else {
		for (; *p && strchr("!^/", *p); p++)
			if (*p == '/') {
				*what =
				    "uses pathspec magic ':/' (relative to the repository's top, not the workspace)";
				return -EPERM;
			}
		if (*p == ':')
			p++;
	}
	return gitargs_path_inside(ws, p, what);
}

/* A remote: a name or http(s)/ssh URL git connects to, or a repository
 * path (file:// or plain) that must be inside the workspace. */
static int remote_ok(const struct gitargs_ws *ws, const char *v, const char **what)
{
	static const char *const schemes[] = {"https://", "http://", "ssh://", "git+ssh://", "ssh+git://"};
	size_t sl = strspn(v, "abcdefghijklmnopqrstuvwxyz0123456789+.-");
	const char *colon = strchr(v, ':'), *slash = strchr(v, '/');

	if (strstr(v, "::")) {
		*what = "names a remote helper ('TRANSPORT::ADDRESS' runs git-remote-TRANSPORT)";
		return -EPERM;
	}
	for (size_t i = 0; i < sizeof(schemes) / sizeof(schemes[0]); i++)
		if (!strncmp(v, schemes[i], strlen(schemes[i])))
			return 0;
	if (sl && !strncmp(v + sl, "://", 3)) {
		*what = "is a URL with a scheme other than http, https or ssh";
		return -EPERM;
	}
	if (colon && (!slash || colon < slash) && colon != v)
		return 0; /* scp-like user@host:path: ssh */
	return gitargs_path_inside(ws, v, what);
}

/* ---- checking argv ---- */

struct check {
	const struct gitargs_ws *ws;
	const struct gitargs_cmd *cmd;
	char *why;
	size_t n;
	bool pattern_given; /* grep: -e or -f */
};

static int refuse(struct check *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int refuse(struct check *c, const char *fmt, ...)
{
	char head[64];
	va_list ap;

	snprintf(head, sizeof(head), "execution.local: git%s%s", c->cmd ? " " : "", c->cmd ? c->cmd->name : "");
	va_start(ap, fmt);
	errmsg_vset(c->why, c->n, head, fmt, ap);
	va_end(ap);
	return -EPERM;
}

static int value_ok(struct check *c, enum gitargs_kind kind, const char *v, const char **what)
{
	switch (kind) {
	case GA_NONE:
	case GA_TEXT:
		return 0;
	case GA_NUM:
		if (*v && strspn(v, "0123456789") == strlen(v) && strlen(v) <= 9)
			return 0;
		*what = "is not a number";
		return -EPERM;
	case GA_REV:
		if (*v && *v != '-')
			return 0;
		*what = "is not a revision";
		return -EPERM;
	case GA_PATH:
		return gitargs_path_inside(c->ws, v, what);
	case GA_PATHSPEC:
	case GA_REVPATH:
		return pathspec_inside(c->ws, v, what);
	case GA_NAME:
		if (*v && !strchr(v, '/') && strcmp(v, "..") && strcmp(v, "."))
			return 0;
		*what = "is not a plain file name";
		return -EPERM;
	case GA_REMOTE:
		return remote_ok(c->ws, v, what);
	case GA_WORD:
		for (const char *const *w = c->cmd->words; w && *w; w++)
			if (!strcmp(*w, v))
				return 0;
		*what = "is not one of the subcommand's words";
		return -EPERM;
	}
	*what = "is of an unknown kind";
	return -EPERM;
}

static const struct gitargs_opt *find_long(const struct gitargs_opt *const *tables, const char *name, size_t len)
{
	for (const struct gitargs_opt *const *t = tables; *t; t++)
		for (const struct gitargs_opt *o = *t; o->lng || o->shrt; o++)
			if (o->lng && strlen(o->lng) == len && !memcmp(o->lng, name, len))
				return o;
	return NULL;
}

static const struct gitargs_opt *find_short(const struct gitargs_opt *const *tables, char ch)
{
	for (const struct gitargs_opt *const *t = tables; *t; t++)
		for (const struct gitargs_opt *o = *t; o->lng || o->shrt; o++)
			if (o->shrt == ch)
				return o;
	return NULL;
}

static int opt_value(struct check *c, const struct gitargs_opt *o, const char *shown, const char *v)
{
	const char *what = "";

	if (c->cmd && (c->cmd->flags & GITARGS_FIRST_PATTERN) && (o->shrt == 'e' || o->shrt == 'f'))
		c->pattern_given = true;
	if (value_ok(c, o->kind, v, &what) < 0) {
		char m[160];
		snprintf(m, sizeof(m), "'%.100s' %s", v, what);
		return refuse(c, "option '%s': value %s", shown, m);
	}
	return 0;
}

/* "--name[=value]" at argv[*i]; a separate value moves *i on. */
static int long_opt(struct check *c, const struct gitargs_opt *const *tables, const char *const *argv, size_t argc,
		    size_t *i)
{
	const char *a = argv[*i] + 2, *eq = strchr(a, '=');
	size_t len = eq ? (size_t)(eq - a) : strlen(a);
	const struct gitargs_opt *o = find_long(tables, a, len);
	char shown[80];

	snprintf(shown, sizeof(shown), "--%.*s", (int)(len < 70 ? len : 70), a);
	if (!o)
		return refuse(c,
			      "option '%s' is not allowed on the host (only options known not to read, write or run "
			      "anything outside the workspace are; doc/EXEC.md)",
			      shown);
	if (o->arity == GA_FLAG && eq)
		return refuse(c, "option '%s' takes no value", shown);
	if (eq)
		return opt_value(c, o, shown, eq + 1);
	if (o->arity == GA_STUCK)
		return refuse(c, "option '%s' needs its value as '%s=VALUE'", shown, shown);
	if (o->arity != GA_REQ)
		return 0;
	if (*i + 1 >= argc)
		return refuse(c, "option '%s' needs a value", shown);
	return opt_value(c, o, shown, argv[++*i]);
}

/* "-abc", "-n5", "-n 5" at argv[*i]. */
static int short_opts(struct check *c, const struct gitargs_opt *const *tables, const char *const *argv, size_t argc,
		      size_t *i)
{
	const char *a = argv[*i];

	if (c->cmd && (c->cmd->flags & GITARGS_DIGITS) && strspn(a + 1, "0123456789") == strlen(a + 1) &&
	    strlen(a + 1) <= 9)
		return 0; /* -<n> */
	for (size_t k = 1; a[k]; k++) {
		const struct gitargs_opt *o = find_short(tables, a[k]);
		char shown[8] = {'-', a[k], '\0'};
		if (!o)
			return refuse(c,
				      "option '%s' is not allowed on the host (only options known not to read, write "
				      "or run anything outside the workspace are; doc/EXEC.md)",
				      shown);
		if (o->arity == GA_FLAG)
			continue;
		if (a[k + 1])
			return opt_value(c, o, shown, a + k + 1);
		if (o->arity == GA_STUCK)
			return refuse(c, "option '%s' needs its value stuck to it ('%sVALUE')", shown, shown);
		if (o->arity == GA_OPT)
			return 0;
		if (*i + 1 >= argc)
			return refuse(c, "option '%s' needs a value", shown);
		return opt_value(c, o, shown, argv[++*i]);
	}
	return 0;
}

static int arg_ok(struct check *c, enum gitargs_kind kind, const char *v)
{
	const char *what = "";

	if (kind == GA_NONE)
		return refuse(c, "argument '%.100s' is not allowed", v);
	if (value_ok(c, kind, v, &what) < 0)
		return refuse(c, "argument '%.100s' %s", v, what);
	return 0;
}

/* The arguments, once every option was seen (git's parsers take options
 * anywhere before "--", so grep's -e may follow the pattern). */
static int args_ok(struct check *c, const char *const *args, size_t nargs, size_t dashdash)
{
	const struct gitargs_cmd *cmd = c->cmd;

	if (cmd->max_args && nargs > cmd->max_args)
		return refuse(c, "too many arguments (at most %zu)", cmd->max_args);
	for (size_t k = 0; k < nargs; k++) {
		enum gitargs_kind kind = k >= dashdash ? cmd->after_dashdash : cmd->args;
		if (k == 0 && k < dashdash && (cmd->flags & GITARGS_FIRST_PATTERN) && !c->pattern_given)
			kind = GA_TEXT;
		if (k == 0 && k < dashdash && (cmd->flags & GITARGS_FIRST_REMOTE))
			kind = GA_REMOTE;
		int r = arg_ok(c, kind, args[k]);
		if (r < 0)
			return r;
	}
	return 0;
}

/* Options before the subcommand; *i ends on the subcommand (or argc). */
static int global_ok(struct check *c, const char *const *argv, size_t argc, size_t *i)
{
	static const struct gitargs_opt *const tables[] = {global_opts, NULL};

	for (*i = 1; *i < argc && argv[*i][0] == '-'; (*i)++) {
		const char *a = argv[*i];
		if (!strcmp(a, "--version")) {
			if (*i + 1 == argc || (*i + 2 == argc && !strcmp(argv[*i + 1], "--build-options"))) {
				*i = argc;
				return 0;
			}
			return refuse(c, "option '--version' takes nothing after it but '--build-options'");
		}
		if (!strcmp(a, "-h") && *i + 1 == argc) {
			*i = argc;
			return 0;
		}
		int r = a[1] == '-' ? long_opt(c, tables, argv, argc, i) : short_opts(c, tables, argv, argc, i);
		if (r < 0) {
			size_t l = strlen(c->why);
			if (l + 1 < c->n)
				snprintf(c->why + l, c->n - l, " (before the subcommand)");
			return r;
		}
	}
	return 0;
}

int gitargs_check(const struct gitargs_ws *ws, const char *const *argv, size_t argc, char *why, size_t n)
{
	struct check c = {.ws = ws, .why = why, .n = n};
	const char *args[GITARGS_ARGS_MAX];
	size_t i, nargs = 0, dashdash = SIZE_MAX;
	int r;

	if (argc > GITARGS_ARGS_MAX)
		return refuse(&c, "more than %u arguments", GITARGS_ARGS_MAX);
	for (i = 0; i < argc; i++)
		if (strlen(argv[i]) > GITARGS_ARG_MAX)
			return refuse(&c, "an argument longer than %u bytes", GITARGS_ARG_MAX);
	if ((r = global_ok(&c, argv, argc, &i)) < 0)
		return r;
	if (i >= argc) {
		if (i == 1)
			return refuse(&c, "no subcommand");
		return 0; /* --version, -h */
	}
	if (!(c.cmd = gitargs_find(argv[i]))) {
		return refuse(&c,
			      "subcommand '%.100s' has no model of safe options, so it does not run on the host "
			      "(doc/EXEC.md)",
			      argv[i]);
	}
	for (i++; i < argc; i++) {
		const char *a = argv[i];
		if (dashdash == SIZE_MAX && !strcmp(a, "--")) {
			if (c.cmd->after_dashdash == GA_NONE)
				return refuse(&c, "'--' is not allowed");
			dashdash = nargs;
			continue;
		}
		if (dashdash == SIZE_MAX && a[0] == '-' && a[1]) {
			r = a[1] == '-' ? long_opt(&c, c.cmd->tables, argv, argc, &i)
					: short_opts(&c, c.cmd->tables, argv, argc, &i);
			if (r < 0)
				return r;
			continue;
		}
		args[nargs++] = a;
	}
	return args_ok(&c, args, nargs, dashdash);
}
