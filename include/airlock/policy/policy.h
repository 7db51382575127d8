/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_POLICY_H
#define AIRLOCK_POLICY_H

/*
 * policy: the per-repository policy file (its sync keys: doc/SECRETS.md; the
 * others: doc/RELAY.md, doc/CREDENTIALS.md, doc/EGRESS.md) and the
 * decision, for each workspace-relative path, whether host-side sync sends
 * it to the guest or withholds it, and which rule withheld it.
 *
 * File format (JSON, every key optional, unknown keys are errors):
 *
 *   { "workspace":   { "template": str, "ttl_seconds": int >= 0,
 *                      "sync": { "include": [glob], "exclude": [glob],
 *                                "allow_secrets": [exact relative path],
 *                                "gitignore": bool (default true) } },
 *     "execution":   { "local": [command prefix], "remote": [str], "barrier": "run"|"fail",
 *                      "timeout_seconds": int > 0 },
 *     "credentials": { "forward_env": [env var name],
 *                      "inject": [ { "name": env var name (required),
 *                                    "scope": str, "ttl_seconds": int > 0,
 *                                    "value_from": str } ] },
 *     "egress":      { "default": "deny", "allow": [host pattern] },
 *     "sandbox":     { "limits": { "pids": int, "memory": size, "tmp": size,
 *                                  "workspace": size } } }
 *
 * A size is bytes (an integer) or a string with a binary suffix: "512M",
 * "4G" (K, M, G, T = powers of 1024).
 *
 * Globs are gitignore patterns (ignore.h) anchored at the workspace root.
 *
 * A path is synced when all of these hold:
 *   1. it is not on the built-in secret list (policy_secret_match; also a
 *      secret *directory* such as .ssh/ withholds everything beneath it),
 *      unless its exact path is listed in workspace.sync.allow_secrets;
 *   2. it matches no workspace.sync.exclude pattern (gitignore semantics:
 *      last match wins, "!" re-includes, and an excluded directory takes
 *      its whole subtree with it);
 *   3. the repository's own ignore rules (.gitignore at every level and
 *      .git/info/exclude; not the user's global excludes file) do not
 *      ignore it, when workspace.sync.gitignore is true. Same answer as
 *      `git check-ignore --no-index`: a file under an ignored directory is
 *      ignored even if a negation matches it;
 *   4. it is included: there is no include list (an empty list includes
 *      nothing), or the nearest of the path and its parent directories
 *      that an include pattern matches was matched by a positive pattern
 *      (so "/src/" includes src/ and all of it, ["/src/", "!/src/gen/"]
 *      then leaves src/gen/ out; "src/" and "!src/gen/" each followed by
 *      "**" do the same file by file).
 * Rules are checked and reported in that order.
 *
 * The repository's .git directory (top level) is synced so git works in
 * the guest: the include list does not apply to it and ignore rules never
 * apply inside any directory named .git (git never ignores those), but
 * exclude patterns and the secret list do (.git/config is a secret).
 *
 * Thread-safety: a loaded policy is immutable and may be shared; a
 * policy_ctx is used by one thread at a time.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define POLICY_FILE_NAME  "airlock.json" /* looked for at the workspace root */
#define POLICY_FILE_MAX	  (1u << 20)	 /* larger policy files are refused */
#define POLICY_IGNORE_MAX (1u << 20)	 /* larger .gitignore files are skipped, with a warning */
#define POLICY_PATH_MAX	  4096		 /* longest relative path policy_check accepts */
#define POLICY_RULE_MAX	  512		 /* size of policy_verdict.rule */

struct policy;
struct policy_ctx;
struct ignore_pattern; /* ignore.h */

/* A list of strings owned by the policy. */
struct policy_list {
	const char *const *v;
	size_t n;
};

struct policy_workspace {
	const char *template_name;  /* workspace.template, NULL when unset */
	int64_t ttl_seconds;	    /* workspace.ttl_seconds, -1 when unset */
	bool has_include;	    /* include list given (else: everything) */
	struct policy_list include; /* as written */
	struct policy_list exclude; /* as written */
	struct policy_list allow_secrets;
	bool gitignore; /* default true */
	/* workspace.writeback: "review" (default: every guest change waits)
	 * or {"auto": [globs]}: matching changes are written back at once */
	struct policy_list writeback_auto;
	int64_t writeback_max_mib;	/* workspace.writeback_max_mib, default POLICY_WRITEBACK_MAX_MIB */
	struct policy_list guest_owned; /* workspace.guest_owned globs: stay in the guest */
};
#define POLICY_WRITEBACK_MAX_MIB 1024 /* default cap on the bytes one write-back brings to the host */

/* execution.barrier: what a command does when paths edited before it
 * could not be applied in the guest (doc/POLICY.md). Neither value is
 * looser than the default: "fail" only refuses more. */
enum policy_barrier {
	POLICY_BARRIER_RUN = 0, /* default: run, with one stderr line naming them */
	POLICY_BARRIER_FAIL,	/* fail at once, naming them; nothing runs */
};

struct policy_execution {
	struct policy_list local;    /* command prefixes run on the host, as written */
	struct policy_list remote;   /* as written */
	int64_t timeout_seconds;     /* 0 when unset */
	enum policy_barrier barrier; /* execution.barrier */
};

struct policy_inject {
	const char *name;	/* environment variable name (required) */
	const char *scope;	/* NULL when unset */
	const char *value_from; /* NULL when unset */
	int64_t ttl_seconds;	/* 0 when unset */
};

struct policy_credentials {
	struct policy_list forward_env; /* variable names, validated */
	const struct policy_inject *inject;
	size_t n_inject;
};

/* One egress.allow entry: "host", "*.host" (subdomains only, not host
 * itself), either with an optional ":port". */
struct policy_host {
	const char *text; /* as written */
	const char *name; /* lower-cased host name without "*." and port */
	bool subdomains;  /* written as "*.name" */
	uint16_t port;	  /* 0 = any port */
};

struct policy_egress {
	bool deny_by_default; /* always true: "allow" is refused at load */
	const struct policy_host *allow;
	size_t n_allow;
};

/* sandbox.limits (doc/SANDBOX.md, "Limits"): 0 where unset, meaning the
 * built-in default. */
struct policy_sandbox_limits {
	uint64_t pids;	    /* processes and threads of the whole sandbox */
	uint64_t memory;    /* bytes of memory (with /tmp, which is memory) */
	uint64_t tmp;	    /* bytes of the /tmp tmpfs */
	uint64_t workspace; /* bytes of the largest file a command writes (copy, home, /tmp) */
};
#define POLICY_PIDS_MIN	     32u
#define POLICY_PIDS_MAX	     4194304u
#define POLICY_MEMORY_MIN    (64ull << 20)
#define POLICY_TMP_MIN	     (1ull << 20)
#define POLICY_WORKSPACE_MIN (1ull << 20)
/* The built-in limits (doc/SANDBOX.md "Limits" says why these numbers);
 * the memory default is half the host's RAM (policy_memory_default). An
 * untrusted policy may only lower them. */
#define POLICY_PIDS_DEFAULT	 4096u
#define POLICY_TMP_DEFAULT	 (1ull << 30)
#define POLICY_WORKSPACE_DEFAULT (32ull << 30)
uint64_t policy_memory_default(void);
#define POLICY_SIZE_MAX (1ull << 50)

/* Load and validate a policy file. On success *out is a new policy (free
 * with policy_free). On failure returns -EINVAL (bad content: not JSON,
 * duplicate key, unknown key, wrong type, bad value, bad glob), -ENOMEM,
 * -EFBIG (over POLICY_FILE_MAX) or the -errno of opening/reading the file,
 * and writes one line into err naming the file, the key path (e.g.
 * "workspace.sync.exclude[2]") and the reason. Callers exit 2. */
int policy_load(const char *path, struct policy **out, char *err, size_t errlen);

/* The built-in policy: include everything, gitignore on, no exclusions
 * beyond the secret list, egress deny with an empty allow list. */
int policy_default(struct policy **out);

/*
 * The policy for a workspace: explicit_path when not NULL, else
 * <dir>/airlock.json when it exists, else policy_default(). Errors as for
 * policy_load (also the -errno of resolving dir).
 *
 * Trust (doc/UP.md): a file outside the workspace (explicit_path that does
 * not resolve beneath dir) is the user's own and applies as written. The
 * workspace's own file (or an explicit_path beneath dir) applies as
 * written only when the user approved its exact bytes for this workspace
 * (trust.h); otherwise it is validated as a whole, then every key that
 * would loosen the built-in default (the table loosening_keys in policy.c:
 * execution.local, credentials.forward_env/inject, allow_secrets, egress
 * hosts, write-back globs, gitignore off, a timeout over
 * POLICY_TIMEOUT_DEFAULT_S) is left out and named by policy_ignored. The
 * bytes hashed for the approval are the bytes parsed (one read).
 */
int policy_load_for_workspace(const char *dir, const char *explicit_path, struct policy **out, char *err,
			      size_t errlen);

/* The exec timeout when the policy sets none (the relay's default); a
 * longer execution.timeout_seconds loosens it. */
#define POLICY_TIMEOUT_DEFAULT_S 300

enum policy_trust {
	POLICY_TRUST_BUILTIN = 0, /* policy_default */
	POLICY_TRUST_USER,	  /* policy_load, or a file from outside the workspace */
	POLICY_TRUST_APPROVED,	  /* the workspace's file, approved by the user */
	POLICY_TRUST_UNTRUSTED,	  /* the workspace's file, not approved: tightening keys only */
};

enum policy_trust policy_trust(const struct policy *p);

/* The loosening keys left out of an untrusted policy (n == 0 otherwise),
 * as dotted key paths. */
const struct policy_list *policy_ignored(const struct policy *p);

/* The one-line note `up`, `status` and `audit` print for an untrusted
 * policy with ignored keys ("ignored from the untrusted DIR/airlock.json:
 * execution.local, egress.allow; review it, then run: airlock trust DIR"),
 * into buf (NUL-terminated, truncated to n). Returns the number of ignored
 * keys; 0 leaves buf empty. */
size_t policy_ignored_note(const struct policy *p, char *buf, size_t n);

/* `airlock trust DIR`: approve the exact bytes of DIR/airlock.json for
 * DIR's realpath (the file must load), or with approve false remove DIR's
 * approval. 0 (approve), 1/0 (revoke: removed / there was none), or
 * -errno with a message naming the file in err. */
int policy_trust_set(const char *dir, bool approve, char *err, size_t errlen);

/* The approval digest the current bytes of ws/airlock.json would need (ws
 * a realpath), for listing approvals. 0, or -errno (no such file...). */
int policy_file_state(const char *ws, uint8_t digest[32]);

/* NULL is a no-op. */
void policy_free(struct policy *p);

/* Accessors; the results live as long as the policy. */
const char *policy_source(const struct policy *p); /* file path, or "(built-in default)" */
const struct policy_workspace *policy_workspace(const struct policy *p);
const struct policy_execution *policy_execution(const struct policy *p);
const struct policy_credentials *policy_credentials(const struct policy *p);
const struct policy_egress *policy_egress(const struct policy *p);
const struct policy_sandbox_limits *policy_sandbox_limits(const struct policy *p);

/* ---- path decisions ---- */

enum policy_reason {
	POLICY_SYNCED = 0,
	POLICY_SECRET,	     /* built-in secret list */
	POLICY_EXCLUDED,     /* workspace.sync.exclude */
	POLICY_IGNORED,	     /* .gitignore / .git/info/exclude */
	POLICY_NOT_INCLUDED, /* workspace.sync.include */
	POLICY_OVER_BUDGET,  /* deciding took over POLICY_MATCH_BUDGET matcher steps: withheld to be safe */
};

/* Matcher steps one decision may take (ignore.h ignore_budget_start): a
 * path whose rules cost more is withheld, its rule naming the pattern. A
 * real .gitignore of a few thousand rules takes a few thousand. */
#define POLICY_MATCH_BUDGET 200000ul

struct policy_verdict {
	enum policy_reason reason; /* POLICY_SYNCED, or why it is withheld */
	/* Directories: nothing beneath can be synced, do not descend. A
	 * withheld directory that is not pruned (e.g. "not included" while an
	 * include pattern may match deeper, or a secret directory with an
	 * allow_secrets entry beneath) is not synced itself, but its synced
	 * descendants need it created. */
	bool prune;
	bool inherited; /* withheld because a parent directory was pruned */
	/* For `airlock audit`, e.g. "secret: PEM key or certificate (*.pem)",
	 * "exclude: .env*", "gitignore: .gitignore:3: build/", "not included".
	 * Empty when synced. */
	char rule[POLICY_RULE_MAX];
	/* The ignore rule that decided the gitignore question: the last
	 * matching pattern (possibly a negation that kept the path), or that
	 * of the ignored parent directory. NULL when none matched or ignore
	 * rules were not consulted. Points into ctx: valid until the next
	 * call that takes the ctx. */
	const struct ignore_pattern *ignore;
	const char *ignore_src; /* "sub/.gitignore" or ".git/info/exclude" */
};

/* Per-walk state for one workspace: caches each directory's .gitignore
 * rules and decisions as lookups descend, and answers lookups for
 * arbitrary paths in any order. Rule files are read lazily through
 * rootfd, never following symlinks, regular files only, at most
 * POLICY_IGNORE_MAX bytes (like git, an unreadable or oversized file is
 * skipped with a warning, see policy_ctx_warnings). Memory is bounded by
 * a cap on cached directories and rule bytes: past either, the cache is
 * dropped and rebuilt on demand.
 *
 * p must outlive the ctx. rootfd is the workspace directory (the ctx keeps
 * its own duplicate), or -1 to consult no files at all. */
int policy_ctx_new(const struct policy *p, int rootfd, struct policy_ctx **out);
void policy_ctx_free(struct policy_ctx *ctx); /* NULL is a no-op */

/* Override the cache caps (defaults: 16384 directories, 32 MiB of parsed
 * rules). The rules of the directories on one path are always kept while
 * that path is looked up; should they alone exceed the cap, the deepest
 * rule files are skipped with a warning. */
void policy_ctx_set_limits(struct policy_ctx *ctx, size_t max_dirs, size_t max_rule_bytes);

/* Forget what is cached for directory dir ("" = the root) and everything
 * beneath it, so its rule file is read again on the next lookup. Call it
 * when a .gitignore in dir is created, written, renamed or removed, and
 * for both ends of a directory rename. Passing "" also re-reads
 * .git/info/exclude. */
void policy_ctx_invalidate(struct policy_ctx *ctx, const char *dir);

/* Convenience for change journals, to call with every changed path (and
 * both ends of a rename): if relpath names a rule file (".../.gitignore",
 * ".git/info/exclude") or a directory the ctx has cached, invalidate what
 * it affects and return true; otherwise do nothing and return false. */
bool policy_ctx_note_change(struct policy_ctx *ctx, const char *relpath);

/* Number of warnings so far (rule files skipped: symlink, not a regular
 * file, too large, unreadable) and the last one's text (NULL if none). */
unsigned policy_ctx_warnings(const struct policy_ctx *ctx, const char **last);

/* Decide one path. relpath is workspace-relative ("" is the root, "a/b"
 * otherwise: no leading, trailing or doubled "/", no "." or ".."
 * components); is_dir says whether it is a directory (lstat: a symlink is
 * not). Fills *v and returns 0, or -EINVAL (malformed relpath),
 * -ENAMETOOLONG (over POLICY_PATH_MAX) or -ENOMEM. ctx must have been
 * made for p. */
int policy_check(const struct policy *p, struct policy_ctx *ctx, const char *relpath, int is_dir,
		 struct policy_verdict *v);

/* workspace.writeback auto globs: does a guest change at path match one?
 * (gitignore-style, the last matching pattern decides, "!" excludes) */
bool policy_writeback_auto(const struct policy *p, const char *relpath, int is_dir);
/* workspace.guest_owned: does path (or a directory above it) stay in the
 * guest, never a guest change? */
bool policy_guest_owned(const struct policy *p, const char *relpath, int is_dir);

/* ---- built-in secret list (fs/policy/secrets.c, doc/SECRETS.md) ---- */

struct policy_secret {
	const char *pattern; /* gitignore-style, matched case-insensitively */
	const char *unless;  /* exception (also case-insensitive), or NULL */
	const char *reason;  /* human description */
	bool dir;	     /* matches directories (and so their subtree), not files */
};

/* The entry that withholds relpath itself (files: non-directories incl.
 * symlinks; directories: the dir entries), or NULL. Parent directories are
 * not looked at: policy_check does that. Names derived from a secret's
 * name by editors and tools are the secret's too: backups and temporaries
 * ("x~", "x.bak", "x.orig", "x.old", "x.backup", "x.save", "x.tmp",
 * "x.~N~", ".x.swp"/".swo"/".swx", "#x#", ".#x", "x___jb_tmp___",
 * "x___jb_old___", also stacked, as in "x.bak~") get the entry of x. */
const struct policy_secret *policy_secret_match(const char *relpath, int is_dir);

/* The table alone: relpath's own name, no derived names. */
const struct policy_secret *policy_secret_match_name(const char *relpath, int is_dir);

/* The whole table, for docs and `airlock audit`. */
const struct policy_secret *policy_secret_table(size_t *n);

#endif
