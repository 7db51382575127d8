/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock try [-C DIR] --patch A.diff --patch B.diff ... [--pick NAME]
 *             [--keep] [--timeout S] [--json] -- CMD [ARG...]
 *
 * A client of the relay's try op (doc/RELAY.md "try"; the work is the
 * daemon's, relay/cli/up_try.c): the patch files read and sent as the
 * variants A, B, ... with CMD, each line of their output printed tagged
 * ("[A] ...": stdout to stdout, stderr to stderr; with --json both to
 * stderr), then per variant its exit status, duration and changed files,
 * and whether the winner's changes are the sandbox's guest changes now
 * (`airlock changes`, `airlock accept`).
 */
#include <ctype.h>
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/server/relay.h"
#include "airlock/core/io.h"
#include "cmd_i.h"

#define TRY_MAX	     RELAY_TRY_VARIANTS_MAX
#define PATCH_MAX    (768u << 10) /* bytes of all patches: the request is one relay line (1 MiB) */
#define TRY_LINE_MAX 4096	  /* output is tagged per line; longer lines are cut into pieces */
#define TRY_ARGV_MAX 256
#define TRY_BUSY_MS  10000 /* a busy sandbox (a command ends, a sync settles) is waited for this long */

struct variant {
	char label[4]; /* "A"; its name in the op is "a" */
	const char *patch;
	char line[2][TRY_LINE_MAX];
	size_t nline[2];
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

/* ---- output, tagged ---- */

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

static void tag_put(struct variant *v, int s, const char *p, size_t n)
{
	while (n > 0) {
		size_t k = sizeof(v->line[s]) - v->nline[s];
		if (k > n)
			k = n;
		memcpy(v->line[s] + v->nline[s], p, k);
		v->nline[s] += k;
		p += k;
		n -= k;
		tag_flush(v, s, false);
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
		memset(&vs[i], 0, sizeof(vs[i]));
		snprintf(vs[i].label, sizeof(vs[i].label), "%c", 'A' + i);
		vs[i].patch = a->patches[i];
	}
}

/* A patch file's text (a regular file; the total of all at most
 * PATCH_MAX). NULL after saying why. */
static json_t *patch_read(const char *file, size_t *total)
{
	FILE *f = fopen(file, "re");
	struct stat st;
	json_t *text = NULL;
	char *b;

	if (!f || fstat(fileno(f), &st) < 0 || !S_ISREG(st.st_mode) || (size_t)st.st_size > PATCH_MAX - *total) {
		cmd_err("try: --patch %s: %s", file,
			!f ? strerror(errno) : "not a regular file, or the patches pass 768 KiB");
		if (f)
			fclose(f);
		return NULL;
	}
	if ((b = malloc((size_t)st.st_size + 1)) && fread(b, 1, (size_t)st.st_size, f) == (size_t)st.st_size) {
		if (memchr(b, '\0', (size_t)st.st_size) || !(text = json_stringn(b, (size_t)st.st_size)))
			cmd_err(
			    "try: --patch %s: not text (a NUL byte or invalid UTF-8: a binary patch is not supported)",
			    file);
	} else
		cmd_err("try: --patch %s: %s", file, strerror(errno ? errno : EIO));
	*total += (size_t)st.st_size;
	free(b);
	fclose(f);
	return text;
}

static json_t *request_build(const struct try_args *a)
{
	json_t *vars = json_array(), *rq, *argv = json_array();
	size_t total = 0;

	for (int i = 0; i < a->npatches; i++) {
		char name[2] = {(char)('a' + i), '\0'};
		json_t *text = patch_read(a->patches[i], &total);
		if (!text) {
			json_decref(vars);
			json_decref(argv);
			return NULL;
		}
		json_array_append_new(vars, json_pack("{s:s, s:o}", "name", name, "patch", text));
	}
	for (int i = 0; i < a->argc; i++)
		json_array_append_new(argv, json_string(a->argv[i]));
	rq = json_pack("{s:i, s:s, s:o, s:o}", "id", 2, "op", "try", "variants", vars, "argv", argv);
	if (a->timeout)
		json_object_set_new(rq, "timeout_seconds", json_real(atof(a->timeout)));
	if (a->pick) {
		char name[2] = {(char)tolower((unsigned char)a->pick[0]), '\0'};
		json_object_set_new(rq, "pick", json_string(name));
	}
	if (a->keep)
		json_object_set_new(rq, "keep", json_true());
	return rq;
}

static struct variant *variant_of(struct variant *vs, int nv, json_t *ev)
{
	const char *n = json_string_value(json_object_get(ev, "variant"));

	if (!n)
		n = json_string_value(json_object_get(ev, "name"));
	for (int i = 0; n && i < nv; i++)
		if (n[0] == vs[i].label[0] + ('a' - 'A') && !n[1])
			return &vs[i];
	return NULL;
}

/* One event of the try: output printed; the answer (try, error) returned. */
static json_t *event_take(struct variant *vs, int nv, json_t *ev)
{
	const char *name = json_string_value(json_object_get(ev, "event"));
	struct variant *v = variant_of(vs, nv, ev);

	if (!name || json_integer_value(json_object_get(ev, "id")) != 2)
		return NULL;
	if (!strcmp(name, "try_output") && v) {
		const char *d = json_string_value(json_object_get(ev, "data"));
		const char *st = json_string_value(json_object_get(ev, "stream"));
		if (d)
			tag_put(v, st && !strcmp(st, "stderr"), d, json_string_length(json_object_get(ev, "data")));
		return NULL;
	}
	if (!strcmp(name, "try_variant") && v) {
		tag_flush(v, 0, true);
		tag_flush(v, 1, true);
		return NULL;
	}
	return strcmp(name, "try") && strcmp(name, "error") ? NULL : json_incref(ev);
}

/* Send rq and read its events until its answer. NULL: the relay went away. */
static json_t *try_run(int fd, json_t *rq, struct variant *vs, int nv)
{
	char *line = json_dumps(rq, JSON_COMPACT), *in = NULL;
	size_t cap = 0;
	FILE *f;
	json_t *ans = NULL;
	int dfd;

	if (!line || io_write_all(fd, line, strlen(line)) < 0 || io_write_all(fd, "\n", 1) < 0 ||
	    (dfd = dup(fd)) < 0 || !(f = fdopen(dfd, "r"))) {
		free(line);
		return NULL;
	}
	free(line);
	while (!ans && getline(&in, &cap, f) > 0) {
		json_t *ev = json_loads(in, 0, NULL);
		ans = ev ? event_take(vs, nv, ev) : NULL;
		json_decref(ev);
	}
	free(in);
	fclose(f);
	return ans;
}

static void report_text(struct variant *vs, int nv, json_t *ans)
{
	json_t *arr = json_object_get(ans, "variants"), *x;
	const char *winner = json_string_value(json_object_get(ans, "winner"));
	const char *why = json_string_value(json_object_get(ans, "why"));
	size_t i;

	json_array_foreach(arr, i, x)
	{
		struct variant *v = variant_of(vs, nv, x);
		const char *vwhy = json_string_value(json_object_get(x, "why"));
		if (!v)
			continue;
		fprintf(stderr, "airlock try: [%s] %s: %s, %lld ms, %zu changed file(s)%s\n", v->label, v->patch,
			!json_is_true(json_object_get(x, "patch_applied")) ? "patch did not apply"
			: json_is_true(json_object_get(x, "passed"))	   ? "exit 0"
									   : "failed",
			(long long)json_integer_value(json_object_get(x, "duration_ms")),
			json_array_size(json_object_get(x, "changes")),
			winner && !strcmp(winner, json_string_value(json_object_get(x, "name"))) ? "  <- winner" : "");
		if (json_is_true(json_object_get(x, "patch_applied")) && !json_is_true(json_object_get(x, "passed")))
			fprintf(stderr, "                 exit status %lld%s%s\n",
				(long long)json_integer_value(json_object_get(x, "exit_code")),
				vwhy && *vwhy ? ": " : "", vwhy ? vwhy : "");
	}
	if (!winner)
		fprintf(stderr, "airlock try: no variant passed; nothing was applied\n");
	else if (json_is_true(json_object_get(ans, "applied")))
		fprintf(stderr,
			"airlock try: the changes of [%c] are the sandbox's guest changes now: airlock changes, "
			"then airlock accept\n",
			toupper((unsigned char)winner[0]));
	else
		fprintf(stderr, "airlock try: the winner's changes were not applied: %s\n", why ? why : "");
}

/* The CLI's --json (doc/JSON.md "try"): variants named by label, with
 * their patch file. */
static json_t *json_out(struct variant *vs, int nv, json_t *ans, bool keep)
{
	json_t *arr = json_array(), *x;
	const char *w = json_string_value(json_object_get(ans, "winner"));
	char label[2] = {w ? (char)toupper((unsigned char)w[0]) : 0, '\0'};
	size_t i;

	json_array_foreach(json_object_get(ans, "variants"), i, x)
	{
		struct variant *v = variant_of(vs, nv, x);
		json_t *o = json_deep_copy(x);
		if (!v || !o) {
			json_decref(o);
			continue;
		}
		json_object_set_new(o, "name", json_string(v->label));
		json_object_set_new(o, "patch", json_string(v->patch));
		json_array_append_new(arr, o);
	}
	return json_pack("{s:i, s:o, s:s?, s:O, s:b, s:O}", "version", 1, "variants", arr, "winner", w ? label : NULL,
			 "applied", json_object_get(ans, "applied"), "kept", keep, "why", json_object_get(ans, "why"));
}

int cmd_try(int argc, char **argv)
{
	struct try_args a = {.dir = "."};
	struct variant vs[TRY_MAX];
	json_t *rq = NULL, *ans = NULL, *sw;
	char root[PATH_MAX];
	int fd = -1, st;

	if ((st = parse_try_args(argc, argv, &a)) != 0)
		return st == 1 ? 0 : st;
	variants_init(vs, &a);
	tags_to_stderr = a.json;
	if (a.pick && (strlen(a.pick) != 1 || toupper((unsigned char)a.pick[0]) < 'A' ||
		       toupper((unsigned char)a.pick[0]) >= 'A' + a.npatches)) {
		cmd_err("try: --pick %s: no such variant (A..%c)", a.pick, 'A' + a.npatches - 1);
		return 2;
	}
	if (!(rq = request_build(&a)))
		return 2;
	if ((fd = cmd_relay_open("try", a.dir, root)) < 0) {
		json_decref(rq);
		return 1;
	}
	/* the parent's copy holds every edit made so far */
	sw = cmd_relay_ask_take(fd, json_pack("{s:i, s:s}", "id", 1, "op", "sync_wait"));
	json_decref(sw);
	for (long waited = 0;; waited += 50) {
		const char *code;
		ans = try_run(fd, rq, vs, a.npatches);
		code = json_string_value(json_object_get(ans, "code"));
		if (!ans || !code || strcmp(code, "busy") || waited >= TRY_BUSY_MS)
			break;
		json_decref(ans);
		nanosleep(&(struct timespec){0, 50000000L}, NULL);
	}
	json_decref(rq);
	close(fd);
	if (!ans || json_object_get(ans, "code")) {
		const char *code = json_string_value(json_object_get(ans, "code"));
		cmd_err("try: %s", ans ? json_string_value(json_object_get(ans, "message")) : "the relay went away");
		st = code && !strcmp(code, "bad_patch") ? 2 : 1;
		json_decref(ans);
		return st;
	}
	if (a.json)
		cmd_print_json(json_out(vs, a.npatches, ans, a.keep));
	else
		report_text(vs, a.npatches, ans);
	st = json_string_value(json_object_get(ans, "winner")) && json_is_true(json_object_get(ans, "applied")) ? 0 : 1;
	json_decref(ans);
	return st;
}
