/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The try op in airlock up (doc/RELAY.md "try", doc/SANDBOX.md "Forks"):
 * one fork per variant, its patch put into the fork's home before it
 * starts and applied there (patch -p1), its command run in every fork at
 * once; each one's output streamed as try_output events tagged by variant,
 * its exit status, duration and changed files as a try_variant event once
 * it ended; the winner (the request's pick, else the first to exit 0) has
 * its changes staged in the parent's home (hard links, sandbox_fork_stage)
 * and replayed in the parent by one ordinary command, so they become the
 * parent's guest changes like any other (changes, accept). A vm fork has
 * no upper and the parent's home is in its own disk: the patch comes on
 * the patch command's stdin, and the winner's reported changes are pulled
 * from its agent into an archive (up_forkpull.c) that is the replay's
 * stdin. The other forks are removed unless kept by name.
 *
 * Every command is the relay's (relay_cmd_spawn: status lists them as
 * "try<token>-<variant>-patch" / "-run" / "try<token>-apply"); their ends
 * come back through a watch and are acted on from a 0 ms timer, never from
 * inside the relay's call. A try goes on when its client leaves; its
 * answer is then dropped.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/io.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/policy/policy.h"
#include "airlock/sandbox/sandbox_fork.h"
#include "airlock/server/relay.h"
#include "cmd_i.h"
#include "up_i.h"

#define TRY_PATCH_FILE ".airlock-try.patch"
#define TRY_OUT_EVENT  8192 /* bytes of output per try_output event */

enum phase { PH_PATCH, PH_RUN, PH_DONE };

struct try_variant {
	struct up_try *t;
	char name[RELAY_TRY_NAME_MAX + 1];
	char fork[RELAY_FORK_NAME_MAX + 1];
	char *patch;
	size_t patch_len;
	char **argv; /* its own, or NULL: the try's */
	size_t argc;
	enum phase phase;
	struct relay_cmd *cmd; /* the command of the phase, until it ended */
	bool ended;	       /* its command ended, not yet acted on */
	struct relay_exit ex;
	bool failed, patched, ran, kept;
	char why[600];
	uint64_t t0_ms, ms, dropped;
	unsigned order;
	json_t *changes;
};

struct up_try {
	struct up *u;
	struct up_try *next;
	uint64_t token, timer, timeout_ms;
	char **argv;
	size_t argc;
	size_t nv;
	struct try_variant v[RELAY_TRY_VARIANTS_MAX];
	char pick[RELAY_TRY_NAME_MAX + 1];
	bool keep_all;
	unsigned finished;
	int winner;
	/* the replay in the parent */
	struct try_variant apply; /* its command, its exit */
	bool applying, applied;
	/* a vm winner: its changes pulled into an archive (up_forkpull.c),
	 * the replay's stdin */
	bool pulling, pulled;
	int archive_fd;
	uint64_t archive_size;
	size_t nfiles, ndeleted;
	char apply_why[768];
};

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

/* The patch text of variant name: every file it names checked. 0, or
 * -EINVAL with err naming the line and what is wrong. */
static int patch_check(const char *name, const char *p, size_t n, char *err, size_t errlen)
{
	static const char *const heads[] = {"--- ", "+++ ", "rename from ", "rename to ", "copy from ", "copy to "};
	char rel[PATH_MAX];
	size_t nfiles = 0;
	long lineno = 0;

	for (size_t off = 0; off < n;) {
		const char *line = p + off, *nl = memchr(line, '\n', n - off);
		size_t len = nl ? (size_t)(nl - line) : n - off;
		off += len + 1;
		lineno++;
		if (len >= 16 && !memcmp(line, "GIT binary patch", 16)) {
			errmsg_set(err, errlen, "variant %s: patch line %ld: a git binary patch is not supported", name,
				   lineno);
			return -EINVAL;
		}
		for (size_t h = 0; h < sizeof(heads) / sizeof(heads[0]); h++) {
			size_t hl = strlen(heads[h]);
			const char *why;
			if (len < hl || memcmp(line, heads[h], hl))
				continue;
			if ((why = patch_path_bad(line + hl, len - hl, rel, sizeof(rel)))) {
				errmsg_set(err, errlen, "variant %s: patch line %ld: refused: '%.*s' is %s", name,
					   lineno, (int)(len - hl > 200 ? 200 : len - hl), line + hl, why);
				return -EINVAL;
			}
			nfiles += h == 1;
			break;
		}
	}
	if (nfiles == 0) {
		errmsg_set(err, errlen,
			   "variant %s: no file in its patch (a unified diff: '--- a/PATH' and '+++ b/PATH' lines)",
			   name);
		return -EINVAL;
	}
	return 0;
}

/* ---- lifetime ---- */

static char **argv_dup(const char *const *argv, size_t argc)
{
	char **v = mem_calloc(argc + 1, sizeof(*v));

	for (size_t i = 0; v && i < argc; i++)
		if (!(v[i] = mem_strdup(argv[i]))) {
			for (size_t k = 0; k < i; k++)
				mem_free(v[k]);
			mem_free(v);
			return NULL;
		}
	return v;
}

static void argv_free(char **v)
{
	for (size_t i = 0; v && v[i]; i++)
		mem_free(v[i]);
	mem_free(v);
}

static void try_free(struct up_try *t)
{
	if (!t)
		return;
	for (size_t i = 0; i < t->nv; i++) {
		if (t->v[i].cmd)
			relay_cmd_unwatch(t->v[i].cmd);
		mem_free(t->v[i].patch);
		argv_free(t->v[i].argv);
		json_decref(t->v[i].changes);
	}
	if (t->apply.cmd)
		relay_cmd_unwatch(t->apply.cmd);
	if (t->pulling) { /* its done is called now, into t */
		struct up_fork *f = up_fork_find(t->u, t->v[t->winner].fork);
		if (f)
			up_forkpull_cancel(f, "the try ended");
	}
	if (t->archive_fd >= 0)
		close(t->archive_fd);
	if (t->timer && t->u->loop)
		loop_del_timer(t->u->loop, t->timer);
	argv_free(t->argv);
	mem_free(t);
}

static void try_unlink(struct up_try *t)
{
	for (struct up_try **pp = &t->u->forks.tries; *pp; pp = &(*pp)->next)
		if (*pp == t) {
			*pp = t->next;
			return;
		}
}

void up_try_clear(struct up *u)
{
	while (u->forks.tries) {
		struct up_try *t = u->forks.tries;
		u->forks.tries = t->next;
		try_free(t);
	}
}

/* ---- events ---- */

static void event_send(struct up_try *t, const char *name, json_t *o)
{
	char *body = o ? json_dumps(o, JSON_COMPACT) : NULL;

	if (body)
		(void)relay_request_event(t->u->exec.relay, t->token, name, body);
	mem_free(body);
	json_decref(o);
}

static const char *const phase_names[] = {"patch", "run", "apply"};

static void on_output(void *ud, enum relay_stream s, const void *data, size_t n)
{
	struct try_variant *v = ud;
	struct up_try *t = v->t;
	const char *name = v == &t->apply ? "apply" : v->name;

	for (size_t off = 0; off < n; off += TRY_OUT_EVENT) {
		size_t k = n - off > TRY_OUT_EVENT ? TRY_OUT_EVENT : n - off;
		json_t *o =
		    json_pack("{s:s, s:s, s:s}", "variant", name, "phase", phase_names[v == &t->apply ? 2 : v->phase],
			      "stream", s == RELAY_STDOUT ? "stdout" : "stderr");
		json_t *d = json_stringn((const char *)data + off, k);
		char *body;
		if (!o)
			return;
		if (d) /* valid UTF-8: text; else base64 would need the relay's encoder: said as dropped */
			json_object_set_new(o, "data", d);
		body = d ? json_dumps(o, JSON_COMPACT) : NULL;
		json_decref(o);
		if (!body || relay_request_event(t->u->exec.relay, t->token, "try_output", body) < 0)
			v->dropped += k;
		mem_free(body);
	}
}

static void try_kick(struct up_try *t);

static void on_ended(void *ud, const struct relay_exit *ex, const char *code, const char *message)
{
	struct try_variant *v = ud;

	v->cmd = NULL;
	v->ended = true;
	v->failed = ex == NULL;
	if (ex)
		v->ex = *ex;
	else
		snprintf(v->why, sizeof(v->why), "%s: %s", code ? code : "failed", message ? message : "");
	try_kick(v->t);
}

static const struct relay_cmd_watch try_watch = {.output = on_output, .ended = on_ended};

/* ---- the steps ---- */

/* The command of v's phase (or the replay, for &t->apply); its stdin the
 * first stdin_size bytes of stdin_fd (-1: none). */
static int spawn(struct up_try *t, struct try_variant *v, const char *id_tail, const char *const *argv, size_t argc,
		 const char *fork, int stdin_fd, uint64_t stdin_size)
{
	char id[96];
	struct relay_exec_req req = {.argv = argv,
				     .argc = argc,
				     .cwd = "",
				     .timeout_ms = t->timeout_ms,
				     .fork = fork,
				     .stdin_open = stdin_fd >= 0};
	int r;

	snprintf(id, sizeof(id), "try%llu-%s", (unsigned long long)t->token, id_tail);
	v->ended = false;
	v->t0_ms = loop_now_ms();
	if ((r = relay_cmd_spawn(t->u->exec.relay, id, &req, &try_watch, v, &v->cmd)) < 0) {
		v->cmd = NULL;
		v->ended = true;
		v->failed = true;
		snprintf(v->why, sizeof(v->why), "starting %s: %s", id, strerror(-r));
	} else if (stdin_fd >= 0 && v->cmd) {
		(void)up_exec_stdin_feed(t->u, v->cmd, stdin_fd, stdin_size); /* ended already: nothing to feed */
	}
	return r;
}

static void variant_start(struct up_try *t, struct try_variant *v)
{
	static const char *const patch_argv[] = {"sh", "-c",
						 "patch -p1 --batch --forward --silent -i \"$HOME/" TRY_PATCH_FILE
						 "\"; r=$?; rm -f \"$HOME/" TRY_PATCH_FILE "\"; exit $r"};
	/* a vm fork's patch comes on stdin (its home is in its own disk), to
	 * the template's busybox patch */
	static const char *const patch_stdin_argv[] = {"patch", "-p1", "-N"};
	char tail[64];

	if (v->phase == PH_PATCH && v->patch) {
		snprintf(tail, sizeof(tail), "%s-patch", v->name);
		if (up_fork_upper(t->u)) {
			(void)spawn(t, v, tail, patch_argv, 3, v->fork, -1, 0);
			return;
		}
		int fd = memfd_create("airlock-try-patch", MFD_CLOEXEC);
		if (fd < 0 || io_write_all(fd, v->patch, v->patch_len) < 0) {
			v->ended = v->failed = true;
			snprintf(v->why, sizeof(v->why), "a memory file for the patch: %s", strerror(errno));
		} else {
			(void)spawn(t, v, tail, patch_stdin_argv, 3, v->fork, fd, v->patch_len);
		}
		if (fd >= 0)
			close(fd);
		return;
	}
	v->phase = PH_RUN;
	v->patched = v->patch != NULL;
	snprintf(tail, sizeof(tail), "%s-run", v->name);
	v->ran = true;
	(void)spawn(t, v, tail, (const char *const *)(v->argv ? v->argv : t->argv), v->argv ? v->argc : t->argc,
		    v->fork, -1, 0);
}

static json_t *variant_json(const struct try_variant *v)
{
	return json_pack("{s:s, s:s, s:b, s:b, s:b, s:i, s:i, s:b, s:I, s:O?, s:I, s:s}", "name", v->name, "fork",
			 v->fork, "patch_applied", v->patched, "ran", v->ran && !v->failed, "passed",
			 v->ran && !v->failed && v->ex.code == 0, "exit_code", v->ran && !v->failed ? v->ex.code : -1,
			 "signal", v->ex.signal, "timed_out", v->ex.timed_out, "duration_ms", (json_int_t)v->ms,
			 "changes", v->changes, "dropped_bytes", (json_int_t)v->dropped, "why", v->why);
}

/* v's command ended: the next phase, or done (its fork stopped, its
 * changes read, its try_variant event sent). */
static void variant_step(struct up_try *t, struct try_variant *v)
{
	char err[512];
	json_t *o;

	v->ended = false;
	if (v->phase == PH_PATCH && !v->failed && v->ex.code == 0) {
		v->phase = PH_RUN;
		variant_start(t, v);
		if (!v->ended)
			return;
		v->ended = false;
	}
	if (v->phase == PH_PATCH && !v->why[0])
		snprintf(v->why, sizeof(v->why), "the patch did not apply (patch exit %d); not run", v->ex.code);
	v->ms = v->phase == PH_RUN ? loop_now_ms() - v->t0_ms : 0;
	v->phase = PH_DONE;
	v->order = ++t->finished;
	if (!(o = json_object()) || up_fork_changes(t->u, v->fork, o, err, sizeof(err)) < 0) {
		snprintf(v->why, sizeof(v->why), "%.500s", o ? err : "out of memory");
	} else {
		v->changes = json_incref(json_object_get(o, "changes"));
	}
	json_decref(o);
	event_send(t, "try_variant", variant_json(v));
}

static void try_finish(struct up_try *t)
{
	json_t *arr = json_array(), *kept = json_array(), *o;
	char err[512], *body;

	for (size_t i = 0; i < t->nv; i++) {
		struct try_variant *v = &t->v[i];
		json_array_append_new(arr, variant_json(v));
		if (v->kept) {
			json_array_append_new(kept, json_string(v->fork));
			continue;
		}
		if (up_fork_rm(t->u, v->fork, err, sizeof(err)) < 0 && !strstr(err, "no fork named"))
			cmd_err("try: %s", err);
	}
	o = json_pack("{s:o, s:s?, s:s?, s:b, s:I, s:I, s:I, s:I, s:o, s:s}", "variants", arr, "winner",
		      t->winner >= 0 ? t->v[t->winner].name : NULL, "winner_fork",
		      t->winner >= 0 ? t->v[t->winner].fork : NULL, "applied", t->applied, "files",
		      (json_int_t)t->nfiles, "deleted", (json_int_t)t->ndeleted, "written_back",
		      (json_int_t)t->apply.ex.written_back, "waiting", (json_int_t)t->apply.ex.waiting, "kept", kept,
		      "why", t->apply_why);
	body = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	relay_changes_done(t->u->exec.relay, t->token, "try", body, "backend_error", "out of memory");
	mem_free(body);
	try_unlink(t);
	try_free(t);
}

/* The replay: sh -c script sh t<N> in the sandbox, its stdin the first
 * size bytes of fd (-1: none). false when there is nothing to replay, or
 * (said in apply_why, the winner's fork kept) when it could not start. */
static bool replay_spawn(struct up_try *t, const char *script, int fd, uint64_t size)
{
	struct try_variant *w = &t->v[t->winner];
	char stage[48];
	const char *argv[5] = {"sh", "-c", script, "sh", stage};

	if (t->nfiles + t->ndeleted == 0) {
		t->applied = true;
		return false;
	}
	snprintf(stage, sizeof(stage), "t%llu", (unsigned long long)t->token);
	t->apply.t = t;
	t->applying = true;
	if (spawn(t, &t->apply, "apply", argv, 5, NULL, fd, size) == 0)
		return true;
	t->applying = false;
	snprintf(t->apply_why, sizeof(t->apply_why), "%.600s; the winner's fork %s is kept", t->apply.why, w->fork);
	w->kept = true;
	return false;
}

/* A vm winner: the changes its agent reported pulled from it into an
 * archive (up_forkpull.c), its fork running meanwhile. */
static void on_pulled(void *ud, int err, const char *why, int fd, uint64_t size, size_t nfiles, size_t ndeleted)
{
	struct up_try *t = ud;
	struct try_variant *w = &t->v[t->winner];

	t->pulling = false;
	t->pulled = true;
	if (err < 0) {
		snprintf(t->apply_why, sizeof(t->apply_why), "%.600s; the winner's fork %s is kept", why, w->fork);
		w->kept = true;
	} else {
		t->archive_fd = fd;
		t->archive_size = size;
		t->nfiles = nfiles;
		t->ndeleted = ndeleted;
	}
	try_kick(t);
}

static bool pull_start(struct up_try *t)
{
	struct try_variant *w = &t->v[t->winner];
	struct up_fork *f = up_fork_find(t->u, w->fork);
	char err[512] = "";
	int r;

	if (!w->changes || json_array_size(w->changes) == 0) {
		t->applied = w->changes != NULL; /* nothing to replay */
		if (!w->changes) {
			snprintf(t->apply_why, sizeof(t->apply_why),
				 "its changes could not be read; the winner's fork %s is kept", w->fork);
			w->kept = true;
		}
		return false;
	}
	if (!f || (r = up_forkpull_start(f, on_pulled, t, err, sizeof(err))) < 0) {
		snprintf(t->apply_why, sizeof(t->apply_why), "%.600s; the winner's fork %s is kept",
			 f ? err : "its fork is gone", w->fork);
		w->kept = true;
		return false;
	}
	t->pulling = true;
	return true;
}

/* The pull ended: the replay, its stdin the archive (unpacked in the
 * sandbox's home, then deletions, then each file alone: busybox's tools,
 * as the local replay does with coreutils). false when there is nothing
 * to replay (said in apply_why). */
static bool replay_start(struct up_try *t)
{
	static const char script[] =
	    "S=\"$HOME/.airlock-try/$1\"; W=\"$PWD\"; rm -rf \"$S\" && mkdir -p \"$S\" && "
	    "tar -x -m -o -f - -C \"$S\" || exit 1; "
	    "if [ -s \"$S/deleted\" ]; then xargs -0 -r rm -rf -- <\"$S/deleted\" || exit 1; fi; "
	    "if [ -s \"$S/files.list\" ]; then cd \"$S/files\" && xargs -0 -r sh -c 'W=$1; shift; for f; do "
	    "case $f in */*) mkdir -p -- \"$W/${f%/*}\" || exit 1;; esac; "
	    "rm -rf -- \"$W/$f\" && cp -p -P -- \"$f\" \"$W/$f\" || exit 1; done' sh \"$W\" <\"$S/files.list\" || exit "
	    "1; fi; "
	    "cd \"$W\" && rm -rf \"$S\"";

	if (t->archive_fd < 0)
		return false; /* apply_why says why */
	return replay_spawn(t, script, t->archive_fd, t->archive_size);
}

/* The winner's changes staged in the parent's home, then one command of
 * the parent's replays them (deletions, then the files, cp -a: links stay
 * links) and removes the stage. false when there is nothing to replay
 * (said in apply_why, or nothing changed). */
static bool apply_start(struct up_try *t)
{
	/* each file copied alone (cp -a of the tree would give the
	 * sandbox's directories the stage's modes and times), by a name find
	 * prefixes with ./ (never an option), onto a removed destination (a
	 * symlink there is replaced, never written through) */
	static const char script[] =
	    "S=\"$HOME/.airlock-try/$1\"; W=\"$PWD\"; "
	    "if [ -s \"$S/deleted\" ]; then xargs -0 -r rm -rf -- <\"$S/deleted\" || exit 1; fi; "
	    "cd \"$S/files\" && find . ! -type d -exec sh -c 'W=$1; shift; for f; do "
	    "mkdir -p -- \"$W/${f%/*}\" && cp -P --preserve=mode,timestamps --remove-destination -- \"$f\" \"$W/$f\" "
	    "|| exit 1; done' sh \"$W\" {} + || exit 1; cd \"$W\" && rm -rf \"$S\"";
	struct try_variant *w = &t->v[t->winner];
	char stage[48], err[512];
	int r;

	snprintf(stage, sizeof(stage), "t%llu", (unsigned long long)t->token);
	if (!up_fork_upper(t->u))
		return pull_start(t);
	if (!w->changes || (r = up_fork_parent_quiesce(t->u, err, sizeof(err))) < 0 ||
	    (r = sandbox_fork_stage(t->u->sandbox.dir, w->fork, stage, &t->nfiles, &t->ndeleted, err, sizeof(err))) <
		0) {
		snprintf(t->apply_why, sizeof(t->apply_why), "%.600s; the winner's fork %s is kept",
			 w->changes ? err : "its changes could not be read", w->fork);
		w->kept = true;
		return false;
	}
	return replay_spawn(t, script, -1, 0);
}

static int winner_of(const struct up_try *t)
{
	int w = -1;

	for (size_t i = 0; i < t->nv; i++) {
		const struct try_variant *v = &t->v[i];
		bool passed = v->ran && !v->failed && v->ex.code == 0;
		if (t->pick[0] ? !strcmp(t->pick, v->name) && v->ran && !v->failed
			       : passed && (w < 0 || v->order < t->v[w].order))
			w = (int)i;
	}
	return w;
}

static void on_step(struct loop *l, void *ud)
{
	struct up_try *t = ud;
	bool all_done = true;
	(void)l;

	t->timer = 0;
	for (size_t i = 0; i < t->nv; i++) {
		if (t->v[i].ended && t->v[i].phase != PH_DONE)
			variant_step(t, &t->v[i]);
		all_done &= t->v[i].phase == PH_DONE;
	}
	if (!all_done)
		return;
	if (t->applying) {
		if (!t->apply.ended)
			return;
		t->applying = false;
		t->applied = !t->apply.failed && t->apply.ex.code == 0;
		if (!t->applied) {
			snprintf(t->apply_why, sizeof(t->apply_why),
				 "the replay in the sandbox failed (%.600s); the winner's fork %s is kept",
				 t->apply.failed ? t->apply.why : "exit status", t->v[t->winner].fork);
			t->v[t->winner].kept = true;
		}
		try_finish(t);
		return;
	}
	if (t->pulling)
		return;
	if (t->pulled) { /* a vm winner's archive: replayed now */
		t->pulled = false;
		if (!replay_start(t))
			try_finish(t);
		return;
	}
	if (t->apply.t) /* the replay ran already */
		return;
	t->apply.t = t;
	if ((t->winner = winner_of(t)) < 0 || !apply_start(t))
		try_finish(t);
}

static void try_kick(struct up_try *t)
{
	if (!t->timer)
		t->timer = loop_add_timer(t->u->loop, 0, on_step, t);
}

/* ---- the op ---- */

static int seed_patch(void *ud, unsigned i, const char *dir, const char *name, char *err, size_t errlen)
{
	struct up_try *t = ud;

	if (!t->v[i].patch || !up_fork_upper(t->u)) /* vm: the patch comes on stdin */
		return 0;
	return sandbox_fork_seed(dir, name, TRY_PATCH_FILE, t->v[i].patch, t->v[i].patch_len, err, errlen);
}

/* Copy q into a new try; its patches checked. NULL with err set. */
static struct up_try *try_new(struct up *u, uint64_t token, const struct relay_try_req *q, char *err, size_t errlen,
			      int *r)
{
	struct up_try *t = mem_calloc(1, sizeof(*t));

	*r = -ENOMEM;
	if (!t)
		return NULL;
	t->u = u;
	t->token = token;
	t->timeout_ms = q->timeout_ms;
	t->keep_all = q->keep_all;
	t->winner = -1;
	t->archive_fd = -1;
	t->nv = q->nvariants;
	snprintf(t->pick, sizeof(t->pick), "%s", q->pick ? q->pick : "");
	if (q->argc && !(t->argv = argv_dup(q->argv, q->argc)))
		goto fail;
	t->argc = q->argc;
	for (size_t i = 0; i < q->nvariants; i++) {
		const struct relay_try_variant *qv = &q->variants[i];
		struct try_variant *v = &t->v[i];
		v->t = t;
		snprintf(v->name, sizeof(v->name), "%s", qv->name);
		if ((size_t)snprintf(v->fork, sizeof(v->fork), "try%llu-%s", (unsigned long long)token, qv->name) >=
		    sizeof(v->fork)) {
			errmsg_set(err, errlen, "variant %s: its fork's name would be too long", qv->name);
			*r = -EINVAL;
			goto fail;
		}
		if (qv->patch && (*r = patch_check(qv->name, qv->patch, qv->patch_len, err, errlen)) < 0)
			goto fail;
		*r = -ENOMEM;
		if ((qv->patch && !(v->patch = mem_alloc(qv->patch_len))) ||
		    (qv->argc && !(v->argv = argv_dup(qv->argv, qv->argc))))
			goto fail;
		if (qv->patch)
			memcpy(v->patch, qv->patch, qv->patch_len);
		v->patch_len = qv->patch_len;
		v->argc = qv->argc;
		v->kept = q->keep_all;
		for (size_t k = 0; k < q->nkeep; k++)
			v->kept |= !strcmp(q->keep[k], qv->name);
	}
	*r = 0;
	return t;
fail:
	try_free(t);
	return NULL;
}

int up_try_start(void *ud, uint64_t token, const struct relay_try_req *q)
{
	struct up *u = ud;
	const char *names[RELAY_TRY_VARIANTS_MAX];
	struct relay_fork_req fq = {
	    .op = "fork", .names = names, .nnames = q->nvariants, .count = (unsigned)q->nvariants};
	char err[1024] = "";
	json_t *made = json_object(), *arr;
	struct up_try *t;
	int r;

	if (!made)
		return -ENOMEM;
	if (!(t = try_new(u, token, q, err, sizeof(err), &r)))
		goto fail;
	for (size_t i = 0; i < t->nv; i++)
		names[i] = t->v[i].fork;
	if ((r = up_fork_make(u, &fq, seed_patch, t, made, err, sizeof(err))) < 0)
		goto fail;
	t->next = u->forks.tries;
	u->forks.tries = t;
	arr = json_array();
	for (size_t i = 0; i < t->nv; i++)
		json_array_append_new(arr, json_pack("{s:s, s:s, s:b}", "name", t->v[i].name, "fork", t->v[i].fork,
						     "patch", t->v[i].patch != NULL));
	json_object_set_new(made, "variants", arr);
	event_send(t, "try_started", made);
	for (size_t i = 0; i < t->nv; i++)
		variant_start(t, &t->v[i]);
	try_kick(t); /* a command refused at once */
	return 0;
fail:
	json_decref(made);
	try_free(t);
	relay_changes_done(u->exec.relay, token, NULL, NULL,
			   r == -EAGAIN	   ? "busy"
			   : r == -EINVAL  ? "bad_patch"
			   : r == -ENOTSUP ? "unsupported"
					   : "try_failed",
			   err[0] ? err : strerror(-r));
	return 0;
}
