/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock try [-C DIR] --patch A.diff --patch B.diff ... [--pick NAME]
 *             [--keep] [--timeout S] [--json] -- CMD [ARG...]
 *
 * One fork of the warm sandbox per candidate (doc/SANDBOX.md "Forks"):
 * the patch applied there (patch -p1 in the fork), CMD run in every fork
 * at once with each line of output tagged by its variant ("[A] ..."),
 * then per variant the exit status, the duration and the files it
 * changed (the fork's overlay upper, read by the daemon's fork_changes op
 * once the fork is stopped). The winner (the first to exit 0, or --pick)
 * has its changes replayed in the sandbox itself by two ordinary commands
 * (xargs rm -rf for what it deleted, tar -x for the rest), so they become
 * the sandbox's guest changes like any other: `airlock changes` lists
 * them, `airlock accept` writes them to the host. The forks are removed
 * unless --keep.
 *
 * Everything goes through the relay (the ops an extension would send) and
 * `airlock exec` child processes of our own binary.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/policy/policy.h"
#include "airlock/server/relay.h"
#include "cmd_i.h"

#define TRY_MAX	     RELAY_FORKS_MAX
#define PATCH_MAX    (16u << 20) /* bytes of one patch file */
#define TRY_LINE_MAX 4096	 /* output is tagged per line; longer lines are cut into pieces */
#define TRY_ARGV_MAX 256

struct variant {
	char label[4]; /* "A" */
	char fork[16]; /* "try-a" */
	const char *patch;
	bool patched;
	pid_t pid;
	int out[2]; /* stdout, stderr read ends; -1 when closed */
	char line[2][TRY_LINE_MAX];
	size_t nline[2];
	int status; /* wait status */
	bool done;
	double t0, ms;
	unsigned order; /* finishing order, from 1 */
	json_t *changes;
	char upper[PATH_MAX]; /* its stopped fork's upper (the daemon's answer) */
};

struct try_args {
	const char *dir, *pick;
	const char *patches[TRY_MAX];
	int npatches;
	bool keep, json;
	const char *timeout;
	char **argv;
	int argc;
};

static double now_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* ---- patches: only paths inside the workspace that are not withheld ---- */

/* A path as a patch names it ("a/src/x.c", "/dev/null"), -p1. NULL when
 * fine, else what is wrong. */
static const char *patch_path_bad(const char *p, size_t n, char *rel, size_t relsz)
{
	const char *s = p;

	while (n && (p[n - 1] == '\r' || p[n - 1] == ' ' || p[n - 1] == '\t'))
		n--;
	for (size_t i = 0; i < n; i++)
		if (p[i] == '\t') /* "--- a/x\t2024-..." */
			n = i;
	if (n == 9 && !memcmp(p, "/dev/null", 9))
		return NULL;
	if (n && p[0] == '/')
		return "an absolute path";
	if (n >= 2 && (p[0] == 'a' || p[0] == 'b') && p[1] == '/') { /* -p1 */
		s = p + 2;
		n -= 2;
	}
	if (!n || n >= relsz)
		return "an empty or over-long path";
	memcpy(rel, s, n);
	rel[n] = '\0';
	for (size_t i = 0; i < n; i++)
		if ((unsigned char)rel[i] < 0x20 || rel[i] == '"' || rel[i] == '\\')
			return "a quoted path or a control character";
	for (char *c = rel; *c;) {
		char *slash = strchr(c, '/');
		size_t k = slash ? (size_t)(slash - c) : strlen(c);
		if ((k == 2 && !memcmp(c, "..", 2)) || (k == 1 && c[0] == '.'))
			return "a '..' or '.' component (outside the workspace)";
		c += k + (slash ? 1 : 0);
	}
	if (policy_secret_match(rel, 0))
		return "a path withheld from the sandbox (a secret's shape)";
	return NULL;
}

static int patch_check(const char *file)
{
	static const char *const heads[] = {"--- ", "+++ ", "rename from ", "rename to ", "copy from ", "copy to "};
	FILE *f = fopen(file, "re");
	char *line = NULL, rel[PATH_MAX];
	size_t cap = 0, nfiles = 0;
	ssize_t n;
	long lineno = 0;
	int r = 0;
	struct stat st;

	if (!f || fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (off_t)PATCH_MAX) {
		cmd_err("try: --patch %s: %s", file, !f ? strerror(errno) : "not a regular file of at most 16 MiB");
		if (f)
			fclose(f);
		return -1;
	}
	while (r == 0 && (n = getline(&line, &cap, f)) >= 0) {
		lineno++;
		if (memchr(line, '\0', (size_t)n)) {
			cmd_err("try: --patch %s:%ld: a NUL byte (a binary patch is not supported)", file, lineno);
			r = -1;
			break;
		}
		if (!strncmp(line, "diff --git ", 11) || !strncmp(line, "GIT binary patch", 16)) {
			if (line[0] == 'G') {
				cmd_err("try: --patch %s:%ld: a git binary patch is not supported", file, lineno);
				r = -1;
			}
			continue;
		}
		for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
			size_t hl = strlen(heads[h]);
			const char *why;
			if (strncmp(line, heads[h], hl))
				continue;
			size_t len = (size_t)n - hl;
			while (len && line[hl + len - 1] == '\n')
				len--;
			if ((why = patch_path_bad(line + hl, len, rel, sizeof(rel)))) {
				cmd_err("try: --patch %s:%ld: refused: '%.*s' is %s", file, lineno,
					(int)(len > 200 ? 200 : len), line + hl, why);
				r = -1;
			}
			nfiles += h == 1;
			break;
		}
	}
	free(line);
	fclose(f);
	if (r == 0 && nfiles == 0) {
		cmd_err("try: --patch %s: no file in it (a unified diff: '--- a/PATH' and '+++ b/PATH' lines)", file);
		r = -1;
	}
	return r;
}

/* ---- child processes: airlock exec, tagged output ---- */

static const char *self_exe(void)
{
	static char path[PATH_MAX];
	ssize_t n = readlink("/proc/self/exe", path, sizeof(path) - 1);

	if (n <= 0)
		return "airlock";
	path[n] = '\0';
	return path;
}

/* Run `airlock exec -C root [--fork F] ARGS...` with stdin from in_fd (-1:
 * /dev/null); its stdout and stderr go to out[0], out[1] (pipes made here
 * when out is given, else ours). The pid, or -1. */
static pid_t spawn_exec(const char *root, const char *fork_name, const char *timeout, char *const *args, int nargs,
			int in_fd, int out[2])
{
	const char *argv[TRY_ARGV_MAX + 16];
	int n = 0, po[2] = {-1, -1}, pe[2] = {-1, -1};
	pid_t pid;

	if (nargs > TRY_ARGV_MAX)
		return -1;
	argv[n++] = "airlock";
	argv[n++] = "exec";
	argv[n++] = "-C";
	argv[n++] = root;
	argv[n++] = in_fd >= 0 ? "--stdin" : "--no-stdin";
	if (fork_name) {
		argv[n++] = "--fork";
		argv[n++] = fork_name;
	}
	if (timeout) {
		argv[n++] = "--timeout";
		argv[n++] = timeout;
	}
	argv[n++] = "--";
	for (int i = 0; i < nargs; i++)
		argv[n++] = args[i];
	argv[n] = NULL;
	if (out && (pipe2(po, O_CLOEXEC) < 0 || pipe2(pe, O_CLOEXEC) < 0))
		return -1;
	fflush(stdout);
	fflush(stderr);
	if ((pid = fork()) < 0)
		return -1;
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		dup2(in_fd >= 0 ? in_fd : null, 0);
		if (out) {
			dup2(po[1], 1);
			dup2(pe[1], 2);
		}
		execv(self_exe(), (char *const *)argv);
		_exit(125);
	}
	if (out) {
		close(po[1]);
		close(pe[1]);
		out[0] = po[0];
		out[1] = pe[0];
	}
	return pid;
}

static int wait_exit(pid_t pid)
{
	int st;
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return 125;
	return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
}

static bool tags_to_stderr; /* --json: stdout is the JSON object's */

/* Print what is complete in v's buffer for stream s, tagged. */
static void tag_flush(struct variant *v, int s, bool all)
{
	FILE *to = s || tags_to_stderr ? stderr : stdout;
	size_t start = 0;

	for (size_t i = 0; i < v->nline[s]; i++)
		if (v->line[s][i] == '\n') {
			fprintf(to, "[%s] %.*s\n", v->label, (int)(i - start), v->line[s] + start);
			start = i + 1;
		}
	if (all || (start == 0 && v->nline[s] == sizeof(v->line[s]))) { /* the rest, or a line too long */
		if (v->nline[s] > start)
			fprintf(to, "[%s] %.*s\n", v->label, (int)(v->nline[s] - start), v->line[s] + start);
		start = v->nline[s];
	}
	memmove(v->line[s], v->line[s] + start, v->nline[s] - start);
	v->nline[s] -= start;
	fflush(to);
}

/* Read every variant's output until all have ended. */
static void pump(struct variant *vs, int nv)
{
	struct pollfd pf[2 * TRY_MAX];
	unsigned finished = 0;

	for (;;) {
		int np = 0, idx[2 * TRY_MAX];
		for (int i = 0; i < nv; i++)
			for (int s = 0; s < 2; s++)
				if (vs[i].out[s] >= 0) {
					pf[np] = (struct pollfd){.fd = vs[i].out[s], .events = POLLIN};
					idx[np++] = i * 2 + s;
				}
		if (np == 0)
			break;
		if (poll(pf, (nfds_t)np, -1) < 0 && errno != EINTR)
			break;
		for (int k = 0; k < np; k++) {
			struct variant *v = &vs[idx[k] / 2];
			int s = idx[k] % 2;
			ssize_t r;
			if (!(pf[k].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			r = read(v->out[s], v->line[s] + v->nline[s], sizeof(v->line[s]) - v->nline[s]);
			if (r > 0) {
				v->nline[s] += (size_t)r;
				tag_flush(v, s, false);
				continue;
			}
			tag_flush(v, s, true);
			close(v->out[s]);
			v->out[s] = -1;
			if (v->out[0] < 0 && v->out[1] < 0) { /* both closed: it is ending */
				v->status = wait_exit(v->pid);
				v->ms = now_ms() - v->t0;
				v->done = true;
				v->order = ++finished;
			}
		}
	}
}

/* ---- the parts ---- */

static int parse_try_args(int argc, char **argv, struct try_args *a)
{
	static const struct option opts[] = {
	    {"patch", required_argument, NULL, 'p'},
	    {"pick", required_argument, NULL, 'P'},
	    {"keep", no_argument, NULL, 'k'},
	    {"json", no_argument, NULL, 'j'},
	    {"timeout", required_argument, NULL, 't'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "+C:h", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			a->dir = optarg;
			break;
		case 'p':
			if (a->npatches >= TRY_MAX) {
				cmd_err("try: at most %d patches (one fork each)", TRY_MAX);
				return 2;
			}
			a->patches[a->npatches++] = optarg;
			break;
		case 'P':
			a->pick = optarg;
			break;
		case 'k':
			a->keep = true;
			break;
		case 'j':
			a->json = true;
			break;
		case 't':
			a->timeout = optarg;
			break;
		case 'h':
			cmd_usage("try");
			return 1;
		default:
			cmd_usage("try");
			return 2;
		}
	}
	if (a->npatches == 0 || optind >= argc) {
		cmd_err("try: needs --patch FILE (one or more) and -- CMD to run in each fork");
		return 2;
	}
	if (argc - optind > TRY_ARGV_MAX) {
		cmd_err("try: CMD has more than %d arguments", TRY_ARGV_MAX);
		return 2;
	}
	a->argv = argv + optind;
	a->argc = argc - optind;
	return 0;
}

static void variants_init(struct variant *vs, const struct try_args *a)
{
	for (int i = 0; i < a->npatches; i++) {
		struct variant *v = &vs[i];
		memset(v, 0, sizeof(*v));
		snprintf(v->label, sizeof(v->label), "%c", 'A' + i);
		snprintf(v->fork, sizeof(v->fork), "try-%c", 'a' + i);
		v->patch = a->patches[i];
		v->out[0] = v->out[1] = -1;
		v->pid = -1;
	}
}

/* The winner: --pick (a label or a fork name), else the first to exit 0. */
static int winner_of(const struct variant *vs, int nv, const char *pick)
{
	int w = -1;

	for (int i = 0; i < nv; i++) {
		if (pick) {
			if (!strcasecmp(pick, vs[i].label) || !strcmp(pick, vs[i].fork))
				return i;
			continue;
		}
		if (vs[i].patched && vs[i].done && vs[i].status == 0 && (w < 0 || vs[i].order < vs[w].order))
			w = i;
	}
	return w;
}

/* The patches, each in its fork (patch -p1 there). */
static void patches_apply(struct variant *vs, int nv, const char *root)
{
	static char *patch_argv[] = {"patch", "-p1", "--batch", "--forward", "--silent", NULL};

	for (int i = 0; i < nv; i++) {
		int in = open(vs[i].patch, O_RDONLY | O_CLOEXEC);
		pid_t pid = in < 0 ? -1 : spawn_exec(root, vs[i].fork, "60", patch_argv, 5, in, NULL);
		int st = pid > 0 ? wait_exit(pid) : 125;
		if (in >= 0)
			close(in);
		vs[i].patched = st == 0;
		if (!vs[i].patched)
			fprintf(stderr, "[%s] the patch %s did not apply in fork %s (exit %d): not run\n", vs[i].label,
				vs[i].patch, vs[i].fork, st);
	}
}

/* fork_changes for each variant (which stops its fork). */
static void changes_read(int fd, struct variant *vs, int nv)
{
	for (int i = 0; i < nv; i++) {
		json_t *ans = cmd_relay_ask_take(
		    fd, json_pack("{s:i, s:s, s:[s]}", "id", 1, "op", "fork_changes", "names", vs[i].fork));
		const char *ev = json_string_value(json_object_get(ans, "event"));
		const char *up = json_string_value(json_object_get(ans, "upper"));
		if (ans && ev && !strcmp(ev, "fork_changes") && up) {
			vs[i].changes = json_incref(json_object_get(ans, "changes"));
			snprintf(vs[i].upper, sizeof(vs[i].upper), "%s", up);
		} else
			cmd_err("try: the changes of fork %s: %s", vs[i].fork,
				ans ? json_string_value(json_object_get(ans, "message")) : "the relay went away");
		json_decref(ans);
	}
}

/* NUL-separated paths of changes (deleted or not) into a temp file; its
 * fd (at offset 0), or -1. *n: how many. */
static int list_file(json_t *changes, bool deleted, size_t *n)
{
	char tmpl[] = "/tmp/airlock-try-XXXXXX";
	int fd = mkstemp(tmpl);
	json_t *c;
	size_t i;

	*n = 0;
	if (fd < 0)
		return -1;
	unlink(tmpl);
	json_array_foreach(changes, i, c)
	{
		const char *p = json_string_value(json_object_get(c, "path"));
		if (json_is_true(json_object_get(c, "deleted")) != deleted || !p)
			continue;
		if (cmd_write_all(fd, p, strlen(p) + 1) < 0) {
			close(fd);
			return -1;
		}
		(*n)++;
	}
	lseek(fd, 0, SEEK_SET);
	return fd;
}

/* The winner's changes replayed in the sandbox: deletions first, then the
 * files (a tar of the stopped fork's upper, made on the host with the
 * system's tar: nothing runs in the fork any more, and tar archives
 * symlinks as links, never following them). 0, or -1 after saying why. */
static int winner_apply(const char *root, json_t *changes, const char *upper)
{
	static char *rm_argv[] = {"xargs", "-0", "-r", "rm", "-rf", "--", NULL};
	static char *tar_argv[] = {"tar", "-xf", "-", "--no-same-owner", NULL};
	size_t ndel, nput;
	int del = list_file(changes, true, &ndel), put = list_file(changes, false, &nput), st = 0;
	char tmpl[] = "/tmp/airlock-try-tar-XXXXXX";
	int tarfd = -1;

	if (del < 0 || put < 0) {
		cmd_err("try: temp files: %s", strerror(errno));
		st = -1;
		goto out;
	}
	if (ndel && wait_exit(spawn_exec(root, NULL, "120", rm_argv, 6, del, NULL)) != 0) {
		cmd_err("try: removing what the winner deleted failed in the sandbox");
		st = -1;
		goto out;
	}
	if (!nput)
		goto out;
	if ((tarfd = mkstemp(tmpl)) < 0) {
		st = -1;
		goto out;
	}
	unlink(tmpl);
	pid_t pid = fork();
	if (pid == 0) {
		dup2(put, 0);
		dup2(tarfd, 1);
		/* --verbatim-files-from: a name the fork made ("--to-command=...")
		 * is a name, never an option of ours */
		execlp("tar", "tar", "-C", upper, "--null", "--verbatim-files-from", "--no-recursion", "-T", "-", "-cf",
		       "-", (char *)NULL);
		_exit(127);
	}
	if (pid < 0 || wait_exit(pid) != 0) {
		cmd_err("try: archiving the winner's files (tar -C %s) failed", upper);
		st = -1;
		goto out;
	}
	lseek(tarfd, 0, SEEK_SET);
	if (wait_exit(spawn_exec(root, NULL, "300", tar_argv, 4, tarfd, NULL)) != 0) {
		cmd_err("try: unpacking the winner's files in the sandbox (tar -x) failed");
		st = -1;
	}
out:
	if (del >= 0)
		close(del);
	if (put >= 0)
		close(put);
	if (tarfd >= 0)
		close(tarfd);
	return st;
}

static json_t *variant_json(const struct variant *v)
{
	int code = v->done ? v->status : -1;
	return json_pack("{s:s, s:s, s:s, s:b, s:b, s:i, s:f, s:O?}", "name", v->label, "fork", v->fork, "patch",
			 v->patch, "patch_applied", v->patched, "ran", v->done, "exit_code", code, "duration_ms", v->ms,
			 "changes", v->changes);
}

static void report_text(const struct variant *vs, int nv, int w, bool applied)
{
	for (int i = 0; i < nv; i++) {
		const struct variant *v = &vs[i];
		size_t n = json_array_size(v->changes);
		fprintf(stderr, "airlock try: [%s] %s: %s, %.0f ms, %zu changed file(s)%s\n", v->label, v->patch,
			!v->patched	 ? "patch did not apply"
			: v->status == 0 ? "exit 0"
					 : "failed",
			v->ms, n, i == w ? "  <- winner" : "");
		if (!v->patched || v->status == 0)
			continue;
		fprintf(stderr, "                 exit status %d\n", v->status);
	}
	if (w < 0)
		fprintf(stderr, "airlock try: no variant passed; nothing was applied\n");
	else if (applied)
		fprintf(stderr,
			"airlock try: the changes of [%s] are the sandbox's guest changes now: airlock changes, "
			"then airlock accept\n",
			vs[w].label);
}

int cmd_try(int argc, char **argv)
{
	struct try_args a = {.dir = "."};
	struct variant vs[TRY_MAX];
	json_t *names = NULL, *made = NULL;
	char root[PATH_MAX];
	int fd = -1, st, w = -1;
	bool applied = false;

	if ((st = parse_try_args(argc, argv, &a)) != 0)
		return st == 1 ? 0 : st;
	for (int i = 0; i < a.npatches; i++)
		if (patch_check(a.patches[i]) < 0)
			return 2;
	variants_init(vs, &a);
	tags_to_stderr = a.json;
	if (a.pick && winner_of(vs, a.npatches, a.pick) < 0) {
		cmd_err("try: --pick %s: no such variant (A..%c)", a.pick, 'A' + a.npatches - 1);
		return 2;
	}
	if ((fd = cmd_relay_open("try", a.dir, root)) < 0)
		return 1;
	names = json_array();
	for (int i = 0; i < a.npatches; i++)
		json_array_append_new(names, json_string(vs[i].fork));
	if (!(made = cmd_fork_make("try", fd, names, a.npatches, 0))) {
		st = 1;
		goto out;
	}
	patches_apply(vs, a.npatches, root);
	for (int i = 0; i < a.npatches; i++) {
		if (!vs[i].patched)
			continue;
		vs[i].t0 = now_ms();
		if ((vs[i].pid = spawn_exec(root, vs[i].fork, a.timeout, a.argv, a.argc, -1, vs[i].out)) < 0)
			cmd_err("try: [%s] cannot start airlock exec: %s", vs[i].label, strerror(errno));
	}
	pump(vs, a.npatches);
	changes_read(fd, vs, a.npatches);
	w = winner_of(vs, a.npatches, a.pick);
	if (w >= 0)
		applied = vs[w].changes && winner_apply(root, vs[w].changes, vs[w].upper) == 0;
	if (!a.keep) {
		json_t *ans =
		    cmd_relay_ask_take(fd, json_pack("{s:i, s:s, s:O}", "id", 1, "op", "fork_rm", "names", names));
		json_decref(ans);
	}
	if (a.json) {
		json_t *arr = json_array();
		for (int i = 0; i < a.npatches; i++)
			json_array_append_new(arr, variant_json(&vs[i]));
		cmd_print_json(json_pack("{s:i, s:o, s:s?, s:b, s:b}", "version", 1, "variants", arr, "winner",
					 w >= 0 ? vs[w].label : NULL, "applied", applied, "kept", a.keep));
	} else {
		report_text(vs, a.npatches, w, applied);
	}
	st = w >= 0 && applied ? 0 : 1;
out:
	for (int i = 0; i < a.npatches; i++)
		json_decref(vs[i].changes);
	json_decref(names);
	json_decref(made);
	if (fd >= 0)
		close(fd);
	return st;
}
