/* SPDX-License-Identifier: Apache-2.0 */
/*
 * git as the oracle for ignore rules.
 *
 * Builds real repositories in a private temp dir (`git init`, nested
 * .gitignore files with negations, anchored/unanchored/dir-only/"**"
 * patterns, escapes, CRLF and a BOM, .git/info/exclude, symlinks, and
 * trees and rule files generated from a seeded PRNG), then asks both
 * `git check-ignore --no-index -v -n -z --stdin` and policy_check about
 * every path and requires the same answer: ignored or not, and the same
 * deciding rule (file, line, pattern; negations included). Then it edits
 * rule files and checks again through the same ctx (invalidation), and
 * once more in shuffled order with a tiny cache (eviction).
 *
 * Exit 0 on zero mismatches, 1 otherwise (77 = skipped: no git). Set
 * AIRLOCK_ORACLE_KEEP=1 to keep the temp dir; it is kept on failure.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "airlock/core/mem.h"
#include "airlock/policy/ignore.h"
#include "airlock/policy/policy.h"

static char tmp[PATH_MAX / 4]; /* short, so tmp + a name fits in PATH_MAX */
static uint64_t rng_state;
static unsigned long total_checks, total_mismatches, total_ignored, total_negated;

__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "ignore_oracle: ");
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, " (temp dir kept: %s)\n", tmp);
	va_end(ap);
	exit(1);
}

static uint32_t rnd(uint32_t n)
{
	rng_state ^= rng_state << 13;
	rng_state ^= rng_state >> 7;
	rng_state ^= rng_state << 17;
	return (uint32_t)(rng_state % n);
}

static void *xmalloc(size_t n)
{
	void *p = malloc(n ? n : 1);
	if (!p)
		die("out of memory");
	return p;
}

static char *xstrdup(const char *s)
{
	char *d = strdup(s);
	if (!d)
		die("out of memory");
	return d;
}

static void write_file(const char *repo, const char *rel, const char *data, size_t len)
{
	char path[PATH_MAX];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", repo, rel);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	if (fd < 0 || write(fd, data, len) != (ssize_t)len || close(fd) != 0)
		die("write %s: %s", path, strerror(errno));
}

static void write_str(const char *repo, const char *rel, const char *s)
{
	write_file(repo, rel, s, strlen(s));
}

static void make_dir(const char *repo, const char *rel)
{
	char path[PATH_MAX];

	snprintf(path, sizeof(path), "%s/%s", repo, rel);
	if (mkdir(path, 0755) != 0 && errno != EEXIST)
		die("mkdir %s: %s", path, strerror(errno));
}

/* Run argv in cwd with stdin/stdout from/to files (NULL: inherit). */
static int run(const char *cwd, char *const argv[], const char *in, const char *out)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		die("fork: %s", strerror(errno));
	if (pid == 0) {
		if (chdir(cwd) != 0)
			_exit(126);
		if (in) {
			int fd = open(in, O_RDONLY);
			if (fd < 0 || dup2(fd, 0) < 0)
				_exit(126);
		}
		if (out) {
			int fd = open(out, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			if (fd < 0 || dup2(fd, 1) < 0)
				_exit(126);
		}
		execvp(argv[0], argv);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			die("waitpid: %s", strerror(errno));
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static void git(const char *repo, const char *a1, const char *a2, const char *a3)
{
	char *argv[] = {"git", (char *)a1, (char *)a2, (char *)a3, NULL};
	int r = run(repo, argv, NULL, NULL);

	if (r != 0)
		die("git %s %s %s in %s: exit %d", a1, a2 ? a2 : "", a3 ? a3 : "", repo, r);
}

static void git_init(const char *repo)
{
	char *argv[] = {"git", "-c", "init.defaultBranch=main", "init", "-q", (char *)repo, NULL};

	if (run(tmp, argv, NULL, NULL) != 0)
		die("git init %s failed", repo);
	git(repo, "config", "user.email", "oracle@example.invalid");
	git(repo, "config", "user.name", "policy oracle");
}

/* ------------------------------------------------------------------ */
/* the set of paths in a work tree */

struct entry {
	char *path;
	int is_dir;
};

struct tree {
	struct entry *v;
	size_t n, cap;
};

static void tree_add(struct tree *t, const char *path, int is_dir)
{
	if (t->n == t->cap) {
		t->cap = t->cap ? 2 * t->cap : 256;
		t->v = realloc(t->v, t->cap * sizeof(*t->v));
		if (!t->v)
			die("out of memory");
	}
	t->v[t->n].path = xstrdup(path);
	t->v[t->n++].is_dir = is_dir;
}

static void tree_free(struct tree *t)
{
	for (size_t i = 0; i < t->n; i++)
		free(t->v[i].path);
	free(t->v);
	memset(t, 0, sizeof(*t));
}

static void walk(const char *repo, const char *rel, struct tree *t)
{
	char path[PATH_MAX];
	DIR *d;
	struct dirent *de;

	snprintf(path, sizeof(path), "%s%s%s", repo, *rel ? "/" : "", rel);
	d = opendir(path);
	if (!d)
		die("opendir %s: %s", path, strerror(errno));
	while ((de = readdir(d))) {
		char child[PATH_MAX], full[2 * PATH_MAX];
		struct stat st;

		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (!*rel && !strcmp(de->d_name, ".git"))
			continue;
		snprintf(child, sizeof(child), "%s%s%s", rel, *rel ? "/" : "", de->d_name);
		snprintf(full, sizeof(full), "%s/%s", repo, child);
		if (lstat(full, &st) != 0)
			die("lstat %s: %s", full, strerror(errno));
		tree_add(t, child, S_ISDIR(st.st_mode));
		if (S_ISDIR(st.st_mode))
			walk(repo, child, t);
	}
	closedir(d);
}

/* ------------------------------------------------------------------ */
/* comparing with git */

struct expect {
	char *src, *line, *pat;
};

/* Ask git about every path of t; fills e[i] (pointers into *buf). */
static void ask_git(const char *repo, const struct tree *t, struct expect *e, char **buf)
{
	char in[PATH_MAX], out[PATH_MAX];
	FILE *f;
	long len;
	char *argv[] = {"git", "check-ignore", "--no-index", "-v", "-n", "-z", "--stdin", NULL};

	snprintf(in, sizeof(in), "%s/paths.in", tmp);
	snprintf(out, sizeof(out), "%s/paths.out", tmp);
	f = fopen(in, "w");
	for (size_t i = 0; i < t->n; i++)
		fwrite(t->v[i].path, 1, strlen(t->v[i].path) + 1, f);
	fclose(f);
	int r = run(repo, argv, in, out);
	if (r != 0 && r != 1)
		die("git check-ignore exited %d in %s", r, repo);
	f = fopen(out, "r");
	if (!f)
		die("no output from git check-ignore");
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	*buf = xmalloc((size_t)len + 1);
	if (fread(*buf, 1, (size_t)len, f) != (size_t)len)
		die("short read of git output");
	fclose(f);
	(*buf)[len] = '\0';

	char *p = *buf, *end = *buf + len;
	for (size_t i = 0; i < t->n; i++) {
		char *fld[4];
		for (int k = 0; k < 4; k++) {
			if (p >= end)
				die("git output ends early at path %zu (%s)", i, t->v[i].path);
			fld[k] = p;
			p += strlen(p) + 1;
		}
		if (strcmp(fld[3], t->v[i].path) != 0)
			die("git output out of step: \"%s\" for \"%s\"", fld[3], t->v[i].path);
		e[i] = (struct expect){fld[0], fld[1], fld[2]};
	}
}

/* Check every path (in the given order) against git's answers. Returns the
 * number of mismatches, printing the first few. */
static size_t compare(const char *label, const struct policy *p, struct policy_ctx *ctx, const struct tree *t,
		      const struct expect *e, const size_t *order)
{
	size_t bad = 0;

	for (size_t k = 0; k < t->n; k++) {
		size_t i = order ? order[k] : k;
		struct policy_verdict v;
		char pat[1024] = "", line[32] = "";
		const char *src = "";

		int r = policy_check(p, ctx, t->v[i].path, t->v[i].is_dir, &v);
		if (r != 0)
			die("%s: policy_check(%s) = %d", label, t->v[i].path, r);
		if (v.ignore) {
			ignore_pattern_format(v.ignore, pat, sizeof(pat));
			snprintf(line, sizeof(line), "%u", v.ignore->line);
			src = v.ignore_src;
		}
		bool git_ignored = e[i].pat[0] && e[i].pat[0] != '!';
		bool ours = v.reason == POLICY_IGNORED;
		total_checks++;
		total_ignored += git_ignored;
		total_negated += e[i].pat[0] == '!';
		if ((v.reason != POLICY_SYNCED && v.reason != POLICY_IGNORED) || git_ignored != ours ||
		    strcmp(src, e[i].src) || strcmp(line, e[i].line) || strcmp(pat, e[i].pat)) {
			if (bad++ < 15)
				fprintf(
				    stderr,
				    "MISMATCH %s: %s%s\n  git:  %s (%s:%s:%s)\n  ours: %s (%s:%s:%s) reason %d %s\n",
				    label, t->v[i].path, t->v[i].is_dir ? "/" : "",
				    git_ignored ? "ignored" : "not ignored", e[i].src, e[i].line, e[i].pat,
				    ours ? "ignored" : "not ignored", src, line, pat, v.reason, v.rule);
		}
	}
	total_mismatches += bad;
	return bad;
}

/* The three passes for one repository: walk order with a fresh ctx, then
 * shuffled with a tiny cache. Returns the tree (caller frees). */
static void check_repo(const char *label, const char *repo, const struct policy *p, struct policy_ctx *ctx,
		       struct tree *t)
{
	struct expect *e;
	char *buf;
	size_t *order;
	struct policy_ctx *small;
	int rootfd;
	char l2[128];

	memset(t, 0, sizeof(*t));
	walk(repo, "", t);
	e = xmalloc(t->n * sizeof(*e));
	ask_git(repo, t, e, &buf);
	compare(label, p, ctx, t, e, NULL);

	order = xmalloc(t->n * sizeof(*order));
	for (size_t i = 0; i < t->n; i++)
		order[i] = i;
	for (size_t i = t->n; i > 1; i--) {
		size_t j = rnd((uint32_t)i), x = order[i - 1];
		order[i - 1] = order[j];
		order[j] = x;
	}
	rootfd = open(repo, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (rootfd < 0 || policy_ctx_new(p, rootfd, &small) != 0)
		die("ctx for %s", repo);
	policy_ctx_set_limits(small, 5, 16384); /* evicts often, never below one path */
	snprintf(l2, sizeof(l2), "%s (shuffled, tiny cache)", label);
	compare(l2, p, small, t, e, order);
	const char *w;
	if (policy_ctx_warnings(ctx, &w) || policy_ctx_warnings(small, &w))
		die("%s: unexpected warning: %s", label, w);
	policy_ctx_free(small);
	close(rootfd);
	free(order);
	free(e);
	free(buf);
}

/* ------------------------------------------------------------------ */
/* repository 1: written by hand */

static const char root_rules[] = "# comment line\n"
				 "*.o\n"
				 "!keep.o\n"
				 "/rootonly\n"
				 "build/\n"
				 "!build/keep.txt\n"
				 "doc/*.txt\n"
				 "logs/**\n"
				 "**/cache\n"
				 "foo/**/bar\n"
				 "*.log\n"
				 "!important.log\n"
				 "\\#hash\n"
				 "\\!bang\n"
				 "trailing   \n"
				 "escaped\\ \n"
				 "[abc]x\n"
				 "[!a]y\n"
				 "?z\n"
				 "dir-only/\n"
				 "a/b/\n"
				 "src/gen/\n"
				 "!src/gen/\n"
				 "tmp*\n"
				 "!tmp-keep\n"
				 "*.[oa]\n"
				 "ign/\n"
				 "deep**/x\n"
				 "[[:digit:]]*.num\n"
				 "*.sw[p-q]\n"
				 "\\[lit]\n"
				 "/**/anyroot\n"
				 "nested/**/\n"
				 "!nested/**/keep/\n";

static void build_fixed(const char *repo)
{
	static const char *const dirs[] = {
	    "build",
	    "sub",
	    "sub/build",
	    "doc",
	    "doc/sub",
	    "logs",
	    "logs/b",
	    "cache",
	    "a",
	    "a/cache",
	    "src",
	    "foo",
	    "foo/x",
	    "foo/x/y",
	    "foobar",
	    "dir-only",
	    "sub/x",
	    "a/b",
	    "sub/a",
	    "sub/a/b",
	    "src/gen",
	    "tmpdir",
	    "win",
	    "vendor",
	    "vendor/keep",
	    "vendor/other",
	    "ign",
	    "ign/b",
	    "src/d",
	    "src/sub",
	    "src/d/sub",
	    "src/deep",
	    "src/deep/e",
	    "info-excluded",
	    "deep",
	    "deepa",
	    "deepa/b",
	    "deepx",
	    "nested",
	    "nested/n1",
	    "nested/n1/keep",
	    "nested/keep",
	    ".hidden",
	    "sp ace",
	    "odd",
	    "odd/a",
	    "odd/a/b",
	    "odd/ab",
	};
	static const char *const files[] = {
	    "a.o",
	    "keep.o",
	    "sub/keep.o",
	    "sub/a.o",
	    "important.log",
	    "x.log",
	    "sub/y.log",
	    "rootonly",
	    "sub/rootonly",
	    "build/keep.txt",
	    "build/x.c",
	    "sub/build/y.c",
	    "doc/a.txt",
	    "doc/sub/b.txt",
	    "doc/c.md",
	    "logs/a",
	    "logs/b/c",
	    "cache/f",
	    "a/cache/x",
	    "src/cache",
	    "foo/bar",
	    "foo/x/bar",
	    "foo/x/y/bar",
	    "foobar/bar",
	    "#hash",
	    "!bang",
	    "sub/#hash",
	    "trailing",
	    "escaped ",
	    "escaped",
	    "ax",
	    "bx",
	    "dx",
	    "ay",
	    "ky",
	    "az",
	    "zz",
	    "dir-only/f",
	    "sub/dir-only",
	    "sub/x/dir-only",
	    "a/b/f",
	    "sub/a/b/f",
	    "src/gen/g.c",
	    "tmp1",
	    "tmp-keep",
	    "sub/tmp-keep",
	    "tmpdir/t",
	    "x.a",
	    "y.b",
	    "win/a.bak",
	    "win/keep.bak",
	    "win/c.txt",
	    "vendor/a",
	    "vendor/keep/b",
	    "vendor/other/c",
	    "ign/a",
	    "ign/b/c",
	    "src/a.gen",
	    "src/x.gen",
	    "src/d/x.gen",
	    "src/local",
	    "src/d/local",
	    "src/sub/f",
	    "src/d/sub/f",
	    "src/deep/a.o",
	    "src/deep/e/b.o",
	    "src/deep/e/b.c",
	    "a.tmp",
	    "keep.tmp",
	    "sub/keep.tmp",
	    "info-excluded/x",
	    "deep/x",
	    "deepa/b/x",
	    "deepx/x",
	    "1.num",
	    "a.num",
	    "x.swp",
	    "x.swq",
	    "x.swo",
	    "[lit]",
	    "l",
	    "anyroot",
	    "sub/anyroot",
	    "nested/n1/f",
	    "nested/n1/keep/f",
	    "nested/keep/f",
	    "nested/f",
	    ".hidden/.o",
	    ".hidden/x.o",
	    "sp ace/f g",
	    "sp ace/x.o",
	    "README",
	    "e!x",
	    "q[1]",
	    "star*",
	    "odd/foo\\",
	    "odd/foo",
	    "odd/[a-",
	    "odd/a-",
	    "odd/x",
	    "odd/a/b/c",
	    "odd/ab/c",
	    "odd/a/bc",
	    "odd/ nul",
	    "odd/trunc",
	    "odd/ ",
	    "odd/sp",
	    "odd/t\tab",
	    "odd/cr\r",
	    "odd/-",
	};

	git_init(repo);
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		make_dir(repo, dirs[i]);
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		write_str(repo, files[i], "x\n");
	write_str(repo, ".gitignore", root_rules);
	/* CRLF line ends, a BOM, no final newline */
	write_str(repo, "win/.gitignore", "\xef\xbb\xbf*.bak\r\n!keep.bak\r\n\r\n#c\r\nc.txt");
	write_str(repo, "vendor/.gitignore", "*\n!.gitignore\n!keep/\n");
	write_str(repo, "ign/.gitignore", "!*\n!b/\n"); /* inside an ignored dir: no effect */
	write_str(repo, "src/.gitignore", "*.gen\n!/x.gen\n/local\nsub/\n");
	write_str(repo, "src/deep/.gitignore", "!*.o\n");
	write_str(repo, "sub/.gitignore", "!a.o\n/a/\n");
	write_str(repo, ".git/info/exclude", "*.tmp\n!keep.tmp\ninfo-excluded/\n");
	/* odd lines: lone trailing backslash, malformed classes, runs of
	 * stars, blank-after-trim, bare "!" and "/", an escaped space alone,
	 * a NUL byte (git stops the line there), tabs and a lone CR */
	static const char odd[] = "foo\\\n[a-\n[[:foo:]]\n***/c\na/**b\n   \n!\n/\n\\ \ntr\0unc\nt\tab\n"
				  "cr\r\r\n\\-\n";
	write_file(repo, "odd/.gitignore", odd, sizeof(odd) - 1);
	/* symlinks are not directories, even when they point at one */
	char path[PATH_MAX];
	snprintf(path, sizeof(path), "%s/link-to-dir-only", repo);
	if (symlink("dir-only", path) != 0)
		die("symlink: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/sub/dir-only-link", repo);
	if (symlink("../dir-only", path) != 0)
		die("symlink: %s", strerror(errno));
	snprintf(path, sizeof(path), "%s/sub/cache", repo);
	if (symlink("/nonexistent", path) != 0)
		die("symlink: %s", strerror(errno));
	git(repo, "add", ".gitignore", NULL);
	git(repo, "commit", "-qm", "ignore rules");
}

/* ------------------------------------------------------------------ */
/* repositories 2..: generated */

static const char *const names[] = {
    "a",   "b",	  "c",	   "ab",    "ba",     "x.o",  "y.log", "z.txt", "build", "lib",	     "src",    "A",
    "B.o", "foo", "bar",   "cache", "keep.o", "tmp1", "d.d",   "e e",	"h#",	 "x!y",	     "[ab]",   "q*",
    "out", "Ab",  "a.b.c", "-",	    "_x",     "aab",  "abab",  "aaaab", "b*",	 "aaaaaaaa", "ba.b.c",
};

static const char *const comps[] = {
    "a",
    "b",
    "ab",
    "build",
    "lib",
    "src",
    "foo",
    "bar",
    "cache",
    "x.o",
    "A",
    "*",
    "a*",
    "*.o",
    "?",
    "[ab]",
    "[!a]*",
    "[a-c]",
    "**",
    "*b",
    "b*",
    "?b",
    "*.log",
    "[[:upper:]]*",
    "\\[ab]",
    "\\*",
    "z.txt",
    "out",
    "e e",
    "d.d",
    "[ab]*",
    "*.*",
    /* star runs with literal tails and near-misses: the suffix check and
     * the budgeted backtracking (doc/SYNC.md "Bounds on ignore rules") */
    "*a*b",
    "a*a*b?",
    "*aab",
    "*a*a*a*",
    "*.b.c",
    "*b\\*",
    "*[ab]b",
    "a**b",
};

static void rand_pattern(char *out, size_t outlen)
{
	size_t o = 0;
	unsigned n = 1 + rnd(3);

	out[0] = '\0';
	if (rnd(5) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "!");
	if (rnd(10) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "\\");
	if (rnd(5) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "/");
	else if (rnd(7) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "**/");
	for (unsigned k = 0; k < n; k++)
		o += (size_t)snprintf(out + o, outlen - o, "%s%s", k ? "/" : "",
				      comps[rnd(sizeof(comps) / sizeof(comps[0]))]);
	if (rnd(10) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "/**");
	if (rnd(5) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "/");
	if (rnd(15) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "  ");
	if (rnd(30) == 0)
		o += (size_t)snprintf(out + o, outlen - o, "\\ ");
}

static void rand_rules(char *buf, size_t len)
{
	size_t o = 0;
	unsigned n = 1 + rnd(8);

	buf[0] = '\0';
	for (unsigned k = 0; k < n && o + 200 < len; k++) {
		char pat[160];
		if (rnd(12) == 0) {
			o += (size_t)snprintf(buf + o, len - o, rnd(2) ? "# comment\n" : "\n");
			continue;
		}
		rand_pattern(pat, sizeof(pat));
		o += (size_t)snprintf(buf + o, len - o, "%s%s", pat, rnd(10) ? "\n" : "\r\n");
	}
}

/* Grow a tree of `budget` entries: each new entry goes under a random
 * existing directory, so trees are both wide and deep. */
static void rand_tree(const char *repo, size_t budget, struct tree *dirs)
{
	tree_add(dirs, "", 1);
	while (budget) {
		const char *parent = dirs->v[rnd((uint32_t)dirs->n)].path;
		char child[PATH_MAX], full[2 * PATH_MAX];
		struct stat st;
		unsigned depth = 0;

		for (const char *c = parent; *c; c++)
			depth += *c == '/';
		snprintf(child, sizeof(child), "%s%s%s", parent, *parent ? "/" : "",
			 names[rnd(sizeof(names) / sizeof(names[0]))]);
		snprintf(full, sizeof(full), "%s/%s", repo, child);
		if (lstat(full, &st) == 0)
			continue;
		budget--;
		unsigned kind = rnd(100);
		if (kind < 30 && depth < 6) {
			make_dir(repo, child);
			tree_add(dirs, child, 1);
		} else if (kind < 33) {
			if (symlink(rnd(2) ? "." : "a", full) != 0)
				die("symlink %s: %s", full, strerror(errno));
		} else {
			write_str(repo, child, "x\n");
		}
	}
}

static void rand_rule_files(const char *repo, const struct tree *dirs, unsigned pct)
{
	char rules[4096], rel[PATH_MAX];

	for (size_t i = 0; i < dirs->n; i++) {
		if (*dirs->v[i].path && rnd(100) >= pct)
			continue;
		rand_rules(rules, sizeof(rules));
		snprintf(rel, sizeof(rel), "%s%s.gitignore", dirs->v[i].path, *dirs->v[i].path ? "/" : "");
		write_str(repo, rel, rules);
	}
}

int main(void)
{
	const char *base = getenv("TMPDIR");
	char repo[PATH_MAX / 2], path[PATH_MAX];
	struct policy *p;
	unsigned repos = 0;
	int rootfd;

	if (run("/", (char *[]){"git", "--version", NULL}, NULL, "/dev/null") != 0) {
		fprintf(stderr, "ignore_oracle: git not found, skipping\n");
		return 77;
	}
	snprintf(tmp, sizeof(tmp), "%s/airlock-oracle-XXXXXX", base && *base ? base : "/tmp");
	if (!mkdtemp(tmp))
		die("mkdtemp: %s", strerror(errno));
	/* nothing from the user's or the system's git config */
	snprintf(path, sizeof(path), "%s/home", tmp);
	mkdir(path, 0700);
	setenv("HOME", path, 1);
	snprintf(path, sizeof(path), "%s/xdg", tmp);
	mkdir(path, 0700);
	setenv("XDG_CONFIG_HOME", path, 1);
	snprintf(path, sizeof(path), "%s/home/gitconfig", tmp);
	write_str(tmp, "home/gitconfig", "");
	setenv("GIT_CONFIG_GLOBAL", path, 1);
	setenv("GIT_CONFIG_NOSYSTEM", "1", 1);
	setenv("LC_ALL", "C", 1);
	unsetenv("GIT_DIR");
	unsetenv("GIT_WORK_TREE");
	unsetenv("GIT_INDEX_FILE");
	unsetenv("GIT_CEILING_DIRECTORIES");

	if (policy_default(&p) != 0)
		die("policy_default");

	/* 1: the hand-written repository */
	{
		struct policy_ctx *ctx;
		struct tree t;
		snprintf(repo, sizeof(repo), "%s/fixed", tmp);
		build_fixed(repo);
		rootfd = open(repo, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (rootfd < 0 || policy_ctx_new(p, rootfd, &ctx) != 0)
			die("ctx");
		check_repo("fixed", repo, p, ctx, &t);
		fprintf(stderr, "ignore_oracle: fixed: %zu paths\n", t.n);
		tree_free(&t);
		policy_ctx_free(ctx);
		close(rootfd);
		repos++;
	}

	/* 2..: generated repositories, each checked, edited, checked again */
	const char *seeds_env = getenv("AIRLOCK_ORACLE_SEEDS"); /* for longer local runs */
	unsigned seeds = seeds_env ? (unsigned)atoi(seeds_env) : 6;
	for (unsigned seed = 1; seed <= seeds; seed++) {
		struct policy_ctx *ctx;
		struct tree t, dirs = {0};
		char label[64], rules[4096];

		rng_state = 0x9e3779b97f4a7c15ull * seed;
		snprintf(repo, sizeof(repo), "%s/rand%u", tmp, seed);
		git_init(repo);
		rand_tree(repo, 400 + rnd(600), &dirs);
		rand_rule_files(repo, &dirs, 45);
		rand_rules(rules, sizeof(rules));
		write_str(repo, ".git/info/exclude", rules);

		rootfd = open(repo, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (rootfd < 0 || policy_ctx_new(p, rootfd, &ctx) != 0)
			die("ctx");
		snprintf(label, sizeof(label), "rand%u", seed);
		check_repo(label, repo, p, ctx, &t);
		size_t first = t.n;
		tree_free(&t);

		/* edit, add and remove rule files; tell the ctx; compare again */
		for (size_t i = 0; i < dirs.n; i++) {
			char rel[PATH_MAX];
			snprintf(rel, sizeof(rel), "%s%s.gitignore", dirs.v[i].path, *dirs.v[i].path ? "/" : "");
			unsigned what = rnd(4);
			if (what == 0) {
				rand_rules(rules, sizeof(rules));
				write_str(repo, rel, rules);
			} else if (what == 1) {
				char full[2 * PATH_MAX];
				snprintf(full, sizeof(full), "%s/%s", repo, rel);
				unlink(full);
			} else {
				continue;
			}
			if (!policy_ctx_note_change(ctx, rel))
				die("note_change(%s) did not invalidate", rel);
		}
		rand_rules(rules, sizeof(rules));
		write_str(repo, ".git/info/exclude", rules);
		policy_ctx_note_change(ctx, ".git/info/exclude");
		snprintf(label, sizeof(label), "rand%u (after edits)", seed);
		check_repo(label, repo, p, ctx, &t);
		fprintf(stderr, "ignore_oracle: rand%u: %zu paths, %zu after edits\n", seed, first, t.n);
		tree_free(&t);
		tree_free(&dirs);
		policy_ctx_free(ctx);
		close(rootfd);
		repos++;
	}
	policy_free(p);

	printf("ignore_oracle: %u repositories, %lu path checks against git check-ignore (%lu ignored, %lu kept by a "
	       "negation), %lu mismatches\n",
	       repos, total_checks, total_ignored, total_negated, total_mismatches);
	if (total_mismatches)
		die("%lu mismatches", total_mismatches);
	if (!getenv("AIRLOCK_ORACLE_KEEP")) {
		char *argv[] = {"rm", "-rf", tmp, NULL};
		run("/", argv, NULL, NULL);
	}
	return 0;
}
