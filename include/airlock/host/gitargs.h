/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_GITARGS_H
#define AIRLOCK_GITARGS_H

/*
 * gitargs: the positive model of what a git command run on the host
 * (execution.local) may be given (doc/EXEC.md "Host-side commands").
 *
 * The model is data: one table of options per git subcommand (shared
 * tables for the diff and revision-walk options git itself shares), each
 * option with its long and short name, whether it takes a value and what
 * kind of value (free text, a number, a revision, a path that must stay
 * inside the workspace, a pathspec...), and per subcommand what its
 * arguments are. An option, a subcommand or a git option before the
 * subcommand that is not in the model is refused, and so is any value or
 * argument of a path kind that leaves the workspace: an absolute path
 * outside it, ".." that climbs above its root, a symlink that leads out
 * (resolved with openat2 RESOLVE_BENEATH from the workspace root), a
 * leading "~", pathspec magic that is relative to the repository top
 * (":/", ":(top)") or unknown. Options must be spelled in full (git
 * would accept abbreviations such as --out for --output); negations are
 * allowed only where listed.
 *
 * Pure apart from the path checks, which only open O_PATH descriptors
 * beneath ws->root_fd. Thread-safe.
 */

#include <stdbool.h>
#include <stddef.h>

/* What an option's value or a positional argument is. */
enum gitargs_kind {
	GA_NONE,     /* the option takes no value */
	GA_TEXT,     /* free text git never opens: a message, a format, a pattern */
	GA_NUM,	     /* decimal digits */
	GA_REV,	     /* a revision or object name: must not start with '-' */
	GA_PATH,     /* a file git opens on disk: must resolve inside the workspace */
	GA_PATHSPEC, /* a pathspec: magic checked, its path inside the workspace */
	GA_REVPATH,  /* before "--": a revision or a pathspec, checked as a pathspec */
	GA_NAME,     /* a file name looked up in each directory: no '/', not ".." */
	GA_REMOTE,   /* a remote name, an http(s)/ssh URL, or a path inside the workspace */
	GA_WORD,     /* one of the subcommand's words (gitargs_cmd.words) */
};

/* How an option takes its value. */
enum gitargs_arity {
	GA_FLAG,  /* no value; "--opt=x" is refused */
	GA_REQ,	  /* "--opt=V", "--opt V", "-oV" or "-o V" (parse-options) */
	GA_STUCK, /* "--opt=V" or "-oV" only (git's own parsers that take no separate value) */
	GA_OPT,	  /* optional, stuck only: "--opt", "--opt=V", "-o", "-oV" */
};

struct gitargs_opt {
	const char *lng; /* without "--"; NULL: short only */
	char shrt;	 /* 0: long only */
	enum gitargs_arity arity;
	enum gitargs_kind kind;
};

/* gitargs_cmd.flags */
#define GITARGS_DIGITS	      0x1u /* "-<n>" is a count (log -3, grep -2) */
#define GITARGS_FIRST_PATTERN 0x2u /* grep: the first argument is the pattern unless -e or -f gave one */
#define GITARGS_FIRST_REMOTE  0x4u /* ls-remote: the first argument is GA_REMOTE, the rest GA_TEXT */

struct gitargs_cmd {
	const char *name;			 /* the subcommand ("diff") */
	const struct gitargs_opt *const *tables; /* NULL-terminated; each table ends with {0} */
	enum gitargs_kind args;			 /* arguments before "--" */
	enum gitargs_kind after_dashdash;	 /* arguments after "--" (GA_NONE: "--" refused) */
	unsigned flags;				 /* GITARGS_* */
	const char *const *words;		 /* GA_WORD arguments; NULL-terminated */
	size_t max_args;			 /* 0 = any number */
};

/* The subcommands of the model, in a fixed order (n set to the count). */
const struct gitargs_cmd *gitargs_commands(size_t *n);
/* The model of one subcommand, or NULL when it has none. */
const struct gitargs_cmd *gitargs_find(const char *name);

/* Where the command runs. */
struct gitargs_ws {
	int root_fd;	  /* the workspace root, a directory fd (O_PATH is enough) */
	const char *root; /* its absolute path as the command sees it, no trailing '/' */
	const char *cwd;  /* the command's directory relative to root ("" = root), no ".." */
};

/* Whether argv[0..argc) (argv[0] a program named git) is inside the
 * model: 0, or -EPERM with one line in why (n bytes) naming the option or
 * argument and what is wrong with it. Bounded: at most GITARGS_ARGS_MAX
 * arguments and GITARGS_ARG_MAX bytes per argument are examined, more is
 * refused. */
#define GITARGS_ARGS_MAX 4096u
#define GITARGS_ARG_MAX	 4096u
int gitargs_check(const struct gitargs_ws *ws, const char *const *argv, size_t argc, char *why, size_t n);

/* Whether path p (relative to ws->cwd, or absolute) stays inside the
 * workspace, lexically and through the symlinks that exist: 0, or -EPERM
 * with *what (static text) saying why. Exposed for tests. */
int gitargs_path_inside(const struct gitargs_ws *ws, const char *p, const char **what);

#endif
