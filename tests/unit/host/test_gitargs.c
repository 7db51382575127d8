/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gitargs: the positive model of a host-side git command (gitargs.h).
 * Runs against a real workspace in a temp dir (a subdirectory, a symlink
 * inside, one leading out, one to /etc/shadow) so the path checks resolve
 * real symlinks. Table-driven:
 *  - every path-taking option that `git <cmd> -h` (git 2.39) lists for the
 *    subcommands of the model, each either refused outright or of a path
 *    kind, refused outside the workspace and accepted inside;
 *  - the attack lines (--no-index, --output, --contents, -c, --exec-path,
 *    --git-dir, pathspec magic, "..", symlinks);
 *  - ordinary commands people and tests run (they must still pass).
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "airlock/host/gitargs.h"

static char root[PATH_MAX];
static struct gitargs_ws ws;

static int setup(void **state)
{
	char p[PATH_MAX + 32];
	(void)state;
	snprintf(root, sizeof(root), "/tmp/test_gitargs.XXXXXX");
	if (!mkdtemp(root))
		return -1;
	snprintf(p, sizeof(p), "%s/sub", root);
	if (mkdir(p, 0700) < 0)
		return -1;
	snprintf(p, sizeof(p), "%s/a.txt", root);
	close(open(p, O_CREAT | O_WRONLY, 0600));
	snprintf(p, sizeof(p), "%s/in-link", root);
	if (symlink("sub", p) < 0)
		return -1;
	snprintf(p, sizeof(p), "%s/out-link", root);
	if (symlink("/etc", p) < 0)
		return -1;
	snprintf(p, sizeof(p), "%s/shadow-link", root);
	if (symlink("../../../../../../../etc/shadow", p) < 0)
		return -1;
	ws.root_fd = open(root, O_PATH | O_DIRECTORY | O_CLOEXEC);
	ws.root = root;
	ws.cwd = "";
	return ws.root_fd < 0 ? -1 : 0;
}

static int teardown(void **state)
{
	char cmd[PATH_MAX + 16];
	(void)state;
	close(ws.root_fd);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	return system(cmd) == 0 ? 0 : -1;
}

/* argv from a space-separated line; "@" stands for the workspace root. */
static int check_line(const char *line, const char *cwd, char *why, size_t n)
{
	static char buf[8192];
	const char *argv[64];
	size_t argc = 0;
	char *save = NULL;
	size_t o = 0;

	for (const char *p = line; *p && o + PATH_MAX < sizeof(buf); p++)
		o += (size_t)(*p == '@' ? snprintf(buf + o, sizeof(buf) - o, "%s", root)
					: snprintf(buf + o, sizeof(buf) - o, "%c", *p));
	for (char *t = strtok_r(buf, " ", &save); t && argc < 64; t = strtok_r(NULL, " ", &save))
		argv[argc++] = t;
	ws.cwd = cwd;
	why[0] = '\0';
	int r = gitargs_check(&ws, argv, argc, why, n);
	ws.cwd = "";
	return r;
}

static void want(const char *line, const char *cwd, const char *refusal)
{
	char why[512];
	int r = check_line(line, cwd, why, sizeof(why));
	if (refusal ? (r != -EPERM || !strstr(why, refusal)) : r != 0)
		fail_msg("'%s' (cwd '%s'): got %d '%s', want %s", line, cwd, r, why, refusal ? refusal : "allowed");
}

/* The attacks of the issue, and their relatives. */
static void test_refused(void **state)
{
	static const struct {
		const char *line, *cwd, *refusal;
	} t[] = {
	    {"git diff --no-index /etc/shadow /dev/null", "", "option '--no-index' is not allowed"},
	    {"git diff /etc/shadow /dev/null", "", "argument '/etc/shadow' is an absolute path outside"},
	    {"git diff --output=/tmp/x HEAD", "", "option '--output' is not allowed"},
	    {"git diff --output /tmp/x HEAD", "", "option '--output' is not allowed"},
	    {"git diff --output-indicator-new=x HEAD", "", "option '--output-indicator-new' is not allowed"},
	    {"git diff --outp=/tmp/x", "", "option '--outp' is not allowed"}, /* git's abbreviation of --output */
	    {"git log --output=/root/.bashrc -p", "", "option '--output' is not allowed"},
	    {"git show --output=x", "", "option '--output' is not allowed"},
	    {"git blame --contents /etc/shadow a.txt", "", "option '--contents' is not allowed"},
	    {"git grep --no-index root /etc", "", "option '--no-index' is not allowed"},
	    {"git grep -O foo", "", "option '-O' is not allowed"},
	    {"git grep --open-files-in-pager=sh foo", "", "option '--open-files-in-pager' is not allowed"},
	    {"git -c core.pager=sh log", "", "option '-c' is not allowed"},
	    {"git --exec-path=/w status", "", "option '--exec-path' is not allowed"},
	    {"git --git-dir=/other/.git log", "", "option '--git-dir' is not allowed"},
	    {"git --work-tree=/ status", "", "option '--work-tree' is not allowed"},
	    {"git -C / status", "", "option '-C' is not allowed"},
	    {"git --config-env=core.pager=X log", "", "option '--config-env' is not allowed"},
	    {"git --help status", "", "option '--help' is not allowed"},
	    {"git status --help", "", "option '--help' is not allowed"},
	    {"git --version status", "", "'--version' takes nothing after it"},
	    {"git", "", "no subcommand"},
	    {"git checkout main", "", "subcommand 'checkout' has no model"},
	    {"git st", "", "subcommand 'st' has no model"}, /* an alias */
	    {"git commit -F /etc/shadow", "", "option '-F': value '/etc/shadow' is an absolute path outside"},
	    {"git commit --file=../../etc/shadow", "", "climbs above the workspace"},
	    {"git commit -F ../a.txt", "", "climbs above the workspace"},
	    {"git commit -Fout-link/shadow", "", "option '-F': value 'out-link/shadow' leaves the workspace"},
	    {"git commit -F shadow-link", "", "leaves the workspace"},
	    {"git commit --template=~/.gitmessage", "", "starts with '~'"},
	    {"git commit -S -m x", "", "option '-S' is not allowed"},
	    {"git commit --gpg-sign -m x", "", "option '--gpg-sign' is not allowed"},
	    {"git commit --pathspec-from-file=/etc/x", "", "option '--pathspec-from-file' is not allowed"},
	    {"git add -p", "", "option '-p' is not allowed"},
	    {"git add --pathspec-from-file=x", "", "option '--pathspec-from-file' is not allowed"},
	    {"git status -- /etc", "", "argument '/etc' is an absolute path outside"},
	    {"git status -- :/", "", "pathspec magic ':/'"},
	    {"git status :(top)x", "", "pathspec magic 'top'"},
	    {"git status :(icase,top)x", "", "pathspec magic 'top'"},
	    {"git status :(evil)x", "", "pathspec magic not known to be safe"},
	    {"git status :!/etc", "", "pathspec magic ':/'"}, /* git reads "!/" as exclude + top */
	    {"git status :(exclude)/etc", "", "is an absolute path outside"},
	    {"git status :(exclude)../../x", "", "climbs above the workspace"},
	    {"git ls-files out-link", "", "leaves the workspace"},
	    {"git ls-files -- in-link/../..", "", "climbs above the workspace"},
	    {"git ls-files ../../x", "sub", "climbs above the workspace"},
	    {"git ls-files -X /etc/shadow", "", "is an absolute path outside"},
	    {"git ls-files --exclude-from=out-link/passwd", "", "leaves the workspace"},
	    {"git ls-files --exclude-per-directory=../../../etc/shadow", "", "is not a plain file name"},
	    {"git blame -S /etc/shadow a.txt", "", "is an absolute path outside"},
	    {"git blame --ignore-revs-file=/etc/shadow a.txt", "", "is an absolute path outside"},
	    {"git log -O/etc/shadow -p", "", "option '-O': value '/etc/shadow'"},
	    {"git log -pO/etc/shadow", "", "option '-O': value '/etc/shadow'"},
	    {"git diff --rotate-to=/etc/passwd", "", "is an absolute path outside"},
	    {"git diff --skip-to ../../x", "", "climbs above the workspace"},
	    {"git diff --relative=/etc", "", "is an absolute path outside"},
	    {"git grep -f /etc/shadow", "", "option '-f': value '/etc/shadow'"},
	    {"git grep -e root -- /etc", "", "is an absolute path outside"},
	    {"git hash-object /etc/shadow", "", "is an absolute path outside"},
	    {"git hash-object -w shadow-link", "", "leaves the workspace"},
	    {"git hash-object --stdin-paths", "", "option '--stdin-paths' is not allowed"},
	    {"git ls-remote /home/user/other.git", "", "is an absolute path outside"},
	    {"git ls-remote file:///etc", "", "scheme other than http"},
	    {"git ls-remote ext::sh", "", "names a remote helper"},
	    {"git ls-remote --upload-pack=touch origin", "", "option '--upload-pack' is not allowed"},
	    {"git rev-parse --resolve-git-dir /home/u/.git", "", "option '--resolve-git-dir' is not allowed"},
	    {"git rev-parse --prefix ../../ -- x", "", "option '--prefix' is not allowed"},
	    {"git credential store", "", "is not one of the subcommand's words"},
	    {"git credential fill x", "", "too many arguments"},
	    {"git log --author Bob", "", "needs its value as '--author=VALUE'"},
	    {"git log -n", "", "option '-n' needs a value"},
	    {"git log -n x", "", "value 'x' is not a number"},
	    {"git status --short=x", "", "option '--short' takes no value"},
	    {"git show :/fix", "", "pathspec magic ':/'"},
	    {"git log --contains=-x", "", "option '--contains' is not allowed"},
	    {"git branch --contains --list", "", "value '--list' is not a revision"},
	    {"git branch -D main", "", "option '-D' is not allowed"},
	    {"git log --stdin", "", "option '--stdin' is not allowed"},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		want(t[i].line, t[i].cwd, t[i].refusal);
}

/* What people and the tests run must still pass. */
static void test_allowed(void **state)
{
	static const struct {
		const char *line, *cwd;
	} t[] = {
	    {"git status", ""},
	    {"git status --short", ""},
	    {"git status -sb", ""},
	    {"git status --porcelain=v2 -z -uno", ""},
	    {"git --no-pager -P --no-optional-locks status", ""},
	    {"git --version", ""},
	    {"git --version --build-options", ""},
	    {"git -h", ""},
	    {"git status -h", ""},
	    {"git status -- a.txt sub", ""},
	    {"git status :(exclude)sub :!a.txt :(glob,icase)*.txt", ""},
	    {"git diff", ""},
	    {"git diff --no-ext-diff", ""},
	    {"git diff --stat HEAD~1..HEAD -- a.txt", ""},
	    {"git diff --cached -U5 --word-diff=color", ""},
	    {"git diff -M50% --color=always --diff-filter=AM HEAD", ""},
	    {"git diff -O orderfile", ""},
	    {"git diff -- ../a.txt", "sub"},
	    {"git diff @/a.txt", ""},
	    {"git log -p -1", ""},
	    {"git log -3 --oneline --graph --decorate --all", ""},
	    {"git log -n 5 --author=me --since=2.weeks --format=%H%x00%s -- in-link", ""},
	    {"git log -L 1,5:a.txt", ""},
	    {"git log --grep=fix -i -E main..HEAD", ""},
	    {"git show HEAD --stat", ""},
	    {"git show HEAD:a.txt", ""},
	    {"git show HEAD~2:sub/../a.txt", ""},
	    {"git rev-parse --show-prefix", ""},
	    {"git rev-parse --verify --quiet no-such-ref-xyz", ""},
	    {"git rev-parse --abbrev-ref HEAD", ""},
	    {"git rev-parse --short=8 HEAD", ""},
	    {"git rev-parse --git-path hooks", ""},
	    {"git ls-files -s --others --exclude-standard -- sub", ""},
	    {"git ls-files --exclude-per-directory=.gitignore -X sub/excl", ""},
	    {"git blame -L 1,3 -w -- a.txt", ""},
	    {"git blame HEAD a.txt", ""},
	    {"git grep -n foo", ""},
	    {"git grep /etc/shadow", ""}, /* a pattern, not a path */
	    {"git grep -e foo --and -e bar HEAD -- sub", ""},
	    {"git grep -2 -i foo", ""},
	    {"git branch", ""},
	    {"git branch --list -vv --contains HEAD feat*", ""},
	    {"git add -A", ""},
	    {"git add -- a.txt sub/", ""},
	    {"git commit -qm x", ""},
	    {"git commit -m /fix/in/message", ""},
	    {"git commit --allow-empty -m x --author=A <a@b> -F sub/msg", ""},
	    {"git hash-object --stdin", ""},
	    {"git hash-object -w a.txt in-link/new", ""},
	    {"git ls-remote origin", ""},
	    {"git ls-remote https://example.org/r.git refs/heads/*", ""},
	    {"git ls-remote git@example.org:r.git", ""},
	    {"git credential fill", ""},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		want(t[i].line, t[i].cwd, NULL);
}

/* Every path-taking option `git <cmd> -h` lists (git 2.39), by hand: the
 * model must either not have it or give it a path kind; a table that
 * took one of them for free text fails here. */
static void test_path_options(void **state)
{
	static const struct {
		const char *cmd, *opt; /* "--long" or "-s" */
	} t[] = {
	    {"diff", "--output"},
	    {"diff", "-O"},
	    {"diff", "--rotate-to"},
	    {"diff", "--skip-to"},
	    {"diff", "--relative"},
	    {"diff", "--no-index"},
	    {"log", "--output"},
	    {"log", "-O"},
	    {"log", "--rotate-to"},
	    {"log", "--skip-to"},
	    {"log", "--relative"},
	    {"show", "--output"},
	    {"show", "-O"},
	    {"show", "--skip-to"},
	    {"ls-files", "-X"},
	    {"ls-files", "--exclude-from"},
	    {"blame", "--contents"},
	    {"blame", "-S"},
	    {"blame", "--ignore-revs-file"},
	    {"grep", "-f"},
	    {"grep", "-O"},
	    {"grep", "--open-files-in-pager"},
	    {"grep", "--no-index"},
	    {"add", "--pathspec-from-file"},
	    {"commit", "-F"},
	    {"commit", "--file"},
	    {"commit", "-t"},
	    {"commit", "--template"},
	    {"commit", "--pathspec-from-file"},
	    {"hash-object", "--path"},
	    {"hash-object", "--stdin-paths"},
	    {"ls-remote", "--upload-pack"},
	    {"rev-parse", "--resolve-git-dir"},
	    {"rev-parse", "--prefix"},
	    {"status", "--pathspec-from-file"},
	};
	static const char *const outside[] = {"/etc/shadow", "../../../etc/shadow", "out-link/shadow", "shadow-link"};
	char line[256], why[512];
	(void)state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		bool lng = t[i].opt[1] == '-';
		for (size_t k = 0; k < sizeof(outside) / sizeof(outside[0]); k++) {
			/* stuck, and separate */
			snprintf(line, sizeof(line), "git %s %s%s%s", t[i].cmd, t[i].opt, lng ? "=" : "", outside[k]);
			if (check_line(line, "", why, sizeof(why)) != -EPERM || !strstr(why, t[i].opt))
				fail_msg("'%s' not refused naming %s: '%s'", line, t[i].opt, why);
			snprintf(line, sizeof(line), "git %s %s %s", t[i].cmd, t[i].opt, outside[k]);
			if (check_line(line, "", why, sizeof(why)) != -EPERM)
				fail_msg("'%s' not refused", line);
		}
	}
	/* and the model's own path options, every one of them, from its data */
	size_t nc;
	const struct gitargs_cmd *cmds = gitargs_commands(&nc);
	size_t tested = 0;
	for (size_t c = 0; c < nc; c++)
		for (const struct gitargs_opt *const *tb = cmds[c].tables; *tb; tb++)
			for (const struct gitargs_opt *o = *tb; o->lng || o->shrt; o++) {
				if (o->kind != GA_PATH && o->kind != GA_PATHSPEC)
					continue;
				if (o->lng)
					snprintf(line, sizeof(line), "git %s --%s=/etc/shadow", cmds[c].name, o->lng);
				else
					snprintf(line, sizeof(line), "git %s -%c/etc/shadow", cmds[c].name, o->shrt);
				if (check_line(line, "", why, sizeof(why)) != -EPERM || !strstr(why, "outside"))
					fail_msg("'%s': '%s'", line, why);
				if (o->lng)
					snprintf(line, sizeof(line), "git %s --%s=sub/x", cmds[c].name, o->lng);
				else
					snprintf(line, sizeof(line), "git %s -%csub/x", cmds[c].name, o->shrt);
				if (check_line(line, "", why, sizeof(why)) != 0)
					fail_msg("'%s' (inside) refused: '%s'", line, why);
				tested++;
			}
	assert_true(tested >= 10);
}

/* The model as data: every subcommand findable, sorted, with well-formed
 * tables (no option listed twice in one subcommand's tables). */
static void test_model(void **state)
{
	size_t n;
	const struct gitargs_cmd *cmds = gitargs_commands(&n);
	(void)state;
	assert_true(n >= 10);
	for (size_t i = 0; i < n; i++) {
		assert_ptr_equal(gitargs_find(cmds[i].name), &cmds[i]);
		if (i)
			assert_true(strcmp(cmds[i - 1].name, cmds[i].name) < 0);
		for (const struct gitargs_opt *const *a = cmds[i].tables; *a; a++)
			for (const struct gitargs_opt *o = *a; o->lng || o->shrt; o++) {
				assert_true(o->arity == GA_FLAG ? o->kind == GA_NONE : o->kind != GA_NONE);
				for (const struct gitargs_opt *const *b = cmds[i].tables; *b; b++)
					for (const struct gitargs_opt *p = *b; p->lng || p->shrt; p++)
						if (p != o && ((o->lng && p->lng && !strcmp(o->lng, p->lng)) ||
							       (o->shrt && o->shrt == p->shrt)))
							fail_msg("git %s: --%s/-%c twice", cmds[i].name,
								 o->lng ? o->lng : "", o->shrt ? o->shrt : ' ');
			}
	}
	assert_null(gitargs_find("checkout"));
	assert_null(gitargs_find(""));
}

static void test_path_inside(void **state)
{
	static const struct {
		const char *p, *cwd;
		bool ok;
	} t[] = {
	    {"a.txt", "", true},
	    {"sub/../a.txt", "", true},
	    {"../a.txt", "sub", true},
	    {"../../a.txt", "sub", false},
	    {"in-link/x/y", "", true},
	    {"out-link", "", false},
	    {"out-link/../sub", "", false},
	    {"new/../../x", "", false},
	    {"@", "", true},
	    {"@/sub/x", "", true},
	    {"@x", "", false},
	    {"/", "", false},
	    {"", "", true},
	    {".", "in-link", true},
	    {"..", "in-link", true},
	};
	char p[PATH_MAX + 16];
	const char *what;
	(void)state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		if (t[i].p[0] == '@')
			snprintf(p, sizeof(p), "%s%s", root, t[i].p + 1);
		else
			snprintf(p, sizeof(p), "%s", t[i].p);
		ws.cwd = t[i].cwd;
		what = "";
		int r = gitargs_path_inside(&ws, p, &what);
		ws.cwd = "";
		if ((r == 0) != t[i].ok)
			fail_msg("'%s' (cwd '%s'): %d %s", p, t[i].cwd, r, what);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_refused), cmocka_unit_test(test_allowed),	cmocka_unit_test(test_path_options),
	    cmocka_unit_test(test_model),   cmocka_unit_test(test_path_inside),
	};
	return cmocka_run_group_tests(tests, setup, teardown);
}
