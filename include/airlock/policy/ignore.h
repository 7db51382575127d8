/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_IGNORE_H
#define AIRLOCK_IGNORE_H

/*
 * ignore: gitignore-style patterns, matched the way git matches them.
 *
 * Used for the repository's own ignore files (.gitignore at every level,
 * .git/info/exclude), for the policy's workspace.sync.include/exclude lists
 * and for the built-in secret list. The policy module (policy.h) is the
 * only intended caller outside tests; it adds the per-directory stacking,
 * caching and file reading on top.
 *
 * Semantics (gitignore(5), checked against `git check-ignore` by
 * tests/unit/policy/test_policy_oracle.c):
 *   - A pattern is one line: leading "!" negates; a trailing "/" matches
 *     directories only; trailing unescaped spaces are dropped; "\" escapes
 *     the next character; lines starting with "#" are comments (in files).
 *   - A pattern without a "/" (other than a trailing one) matches the
 *     basename at any depth; otherwise it is anchored to the directory of
 *     the file that holds it (a leading "/" only makes that explicit).
 *   - "*" and "?" and "[...]" (ranges, "!"/"^" negation, [:alpha:] and the
 *     other POSIX classes) never match "/"; "**" between slashes or at the
 *     ends matches any number of directories: "**" then "/x" matches x at
 *     any depth, "x/" then "**" everything inside x, and "x/", "**", "/y"
 *     (written together) x/y, x/a/y, x/a/b/y.
 *   - The last matching pattern of a list decides.
 *
 * Work is bounded (doc/SYNC.md, "Bounds on ignore rules"): star
 * backtracking keeps one resume point per star kind (the last "*" and the
 * last "**"), so a pattern of length m against a name of length n costs at
 * most O(m * n) steps per "**" restart, and "**" restarts only at each "/"
 * of the name: never exponential, whatever the pattern. The per-thread
 * step counter ignore_steps() lets tests assert that, and a per-thread
 * budget (ignore_budget_start) caps the work of one decision: over it,
 * every match fails and the caller, told by ignore_budget_end, withholds
 * the path (policy.c). A rule file holds at most IGNORE_PATTERNS_MAX
 * patterns.
 *
 * Pattern text is never copied per pattern: a list owns one buffer and its
 * patterns point into it.
 */

#include <stdbool.h>
#include <stddef.h>

#define IGNORE_PATTERNS_MAX 10000u /* patterns per rule file (ignore_list_parse) */

/* ignore_pattern.flags */
#define IGNORE_NEGATIVE	 0x01u /* leading "!" */
#define IGNORE_MUSTBEDIR 0x02u /* trailing "/": matches directories only */
#define IGNORE_NODIR	 0x04u /* no "/" in the pattern: matches the basename */
#define IGNORE_ENDSWITH	 0x08u /* "*literal": fast suffix compare */
#define IGNORE_CASEFOLD	 0x10u /* ASCII case-insensitive (secret list) */

/* ignore_wildmatch() flags */
#define IGNORE_WM_PATHNAME 0x1u /* wildcards do not match "/"; "**" does */
#define IGNORE_WM_CASEFOLD 0x2u

struct ignore_pattern {
	const char *text;     /* body without "!" and trailing "/"; not NUL-terminated */
	size_t len;	      /* bytes of text */
	size_t nowildcardlen; /* length of the literal prefix (no * ? [ \) */
	unsigned flags;	      /* IGNORE_* */
	unsigned line;	      /* 1-based line in the source file, or index in a list */
};

struct ignore_list {
	char *src;	/* owned: where the patterns came from, e.g. "a/b/.gitignore" */
	size_t baselen; /* the first baselen bytes of src are the directory the
			 * patterns are relative to ("a/b/"), 0 for the root */
	struct ignore_pattern *v;
	size_t n;
	char *buf;    /* owned: text the patterns point into */
	size_t bytes; /* memory held by this list (for cache accounting) */
};

/* Match text[0..tlen) against the glob pat[0..plen) (no "!" or trailing "/"
 * processing: that is ignore_pattern_init's job). Returns true on a match.
 * A malformed pattern (unterminated "[", unknown [:class:], trailing lone
 * "\") never matches, as in git. */
bool ignore_wildmatch(const char *pat, size_t plen, const char *text, size_t tlen, unsigned flags);

/* Steps the calling thread's matcher has taken since it started (a test
 * hook for "no exponential backtracking"; it only ever increases). */
unsigned long ignore_steps(void);

/* Give the calling thread's matcher a budget of steps (0 counts as 1):
 * once they are spent, every ignore_wildmatch, ignore_pattern_match and
 * ignore_list_match on this thread returns "no match" at once. A match
 * outside a budget is never cut short. */
void ignore_budget_start(unsigned long steps);

/* End the budget. Returns true when it ran out, with *pat the pattern that
 * was being matched then and *src its list's src (NULL for a pattern
 * matched on its own, ignore_pattern_match); either may be NULL. */
bool ignore_budget_end(const struct ignore_pattern **pat, const char **src);

/* Parse one already-trimmed pattern line s[0..len) into *out, which will
 * point into s (keep s alive). extra_flags may add IGNORE_CASEFOLD.
 * Returns 0, or -EINVAL when nothing is left after "!" and "/" removal
 * (such a line never matches anything; callers skip it). */
int ignore_pattern_init(struct ignore_pattern *out, const char *s, size_t len, unsigned extra_flags, unsigned line);

/* Length of s[0..len) after gitignore's trailing-space rule (unescaped
 * trailing spaces are dropped; "\ " keeps one). */
size_t ignore_trim_trailing_spaces(const char *s, size_t len);

/* Strict check of a pattern written in a policy file, where a pattern that
 * can never match is a mistake rather than something to tolerate. Returns
 * 0, or -EINVAL with *why set to a static reason (unterminated class,
 * unknown [:class:], lone trailing backslash, empty pattern, leading "#",
 * control characters, "./" or ".." components). */
int ignore_glob_check(const char *pat, const char **why);

/* Is the path (workspace-relative, no leading or trailing "/") matched by
 * p, a pattern from a list whose directory is base[0..baselen) ("" or
 * "a/b/")? is_dir says whether the path is a directory. Negation is not
 * applied here: the caller looks at IGNORE_NEGATIVE. */
bool ignore_pattern_match(const struct ignore_pattern *p, const char *base, size_t baselen, const char *path,
			  size_t len, int is_dir);

/* Parse a gitignore-format buffer into an empty list. The list takes
 * ownership of src and buf (both from mem_alloc) in every case, including
 * failure. Handles a UTF-8 BOM, CRLF line ends, comments, blank lines and
 * trailing spaces exactly like git. Returns 0, -ENOMEM, or -E2BIG (more
 * than IGNORE_PATTERNS_MAX patterns: the list is left empty). */
int ignore_list_parse(struct ignore_list *l, char *src, size_t baselen, char *buf, size_t len, unsigned extra_flags);

/* Build a list from n policy patterns (each validated by the caller with
 * ignore_glob_check). Pattern i gets line i. src is copied. Returns 0 or
 * -ENOMEM. */
int ignore_list_from_strings(struct ignore_list *l, const char *src, const char *const *pats, size_t n);

/* The last pattern of l that matches the path (negative or not), or NULL. */
const struct ignore_pattern *ignore_list_match(const struct ignore_list *l, const char *path, size_t len, int is_dir);

/* Free what the list owns and leave it empty. Safe on a zeroed list. */
void ignore_list_clear(struct ignore_list *l);

/* Write the pattern as git prints it ("!" + body + "/" as applicable) into
 * buf (always NUL-terminated when buflen > 0, truncated if needed).
 * Returns the full length it would have needed, like snprintf. */
size_t ignore_pattern_format(const struct ignore_pattern *p, char *buf, size_t buflen);

#endif
