/* SPDX-License-Identifier: Apache-2.0 */
/* route: local or guest, and the environment a command gets (route.h). */
#include "airlock/host/route.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/mem.h"
#include "airlock/exec/exec.h"
#include "airlock/host/cred.h"
#include "airlock/host/gitargs.h"
#include "airlock/host/hostrun.h"
#include "airlock/policy/policy.h"

#define GIT_PROBE_MAX	     (1u << 20) /* `git config --list -z` output we accept */
#define GIT_PROBE_TIMEOUT_MS 10000
#define GIT_OVERRIDES_MAX    4096
#define LOCAL_STDIN_Q_MAX    (1u << 20) /* stdin the engine did not take yet */

/* What git runs instead of an external diff program: a unified diff of the
 * two files (git passes path old-file old-hex old-mode new-file new-hex
 * new-mode and appends "$@", which the trailing '#' swallows). */
#define GIT_DIFF_EMULATION "diff -u --label \"a/$1\" --label \"b/$1\" -- \"$2\" \"$5\"; test $? -le 1 #"

enum rc_state {
	RC_CRED,  /* guest-bound, waiting for credentials */
	RC_PROBE, /* local, reading the repository's git config */
	RC_LOCAL, /* local, running */
};

struct rcmd {
	struct route *r;
	struct relay_cmd *cmd;
	struct rcmd *next;
	enum rc_state state;
	/* the request, copied */
	char **argv, **env, *cwd;
	char *fork; /* the fork it runs in (relay_exec_req.fork), NULL: the sandbox */
	size_t argc, nenv;
	bool shell, tty, stdin_open, paused;
	uint16_t rows, cols;
	uint64_t timeout_ms;
	struct cred_wait *wait;
	struct hostrun *probe;
	struct exec *e;
	struct buf stdin_q;
	bool stdin_eof, stdin_closed;
};

struct route {
	struct loop *loop;
	const struct policy *policy;
	const struct relay_backend_ops *guest;
	void *guest_ud;
	bool (*guest_ready)(void *guest_ud);
	struct cred *cred;
	char *workspace;     /* opened per command: an fd held open would keep the mount busy at shutdown */
	char home[PATH_MAX]; /* the daemon's HOME: local commands' HOME (not a world-writable /tmp) */
	char *ceiling;	     /* GIT_CEILING_DIRECTORIES=<the workspace's parent>: git finds no repository above it */
	char **prefixes;     /* execution.local, as written */
	size_t nprefixes;
	struct rcmd *cmds; /* commands the route holds (not yet or never handed to the guest) */
};

/* ---- matching ---- */

/* How many words of prefix p match the start of argv: the count, or 0
 * when it does not match (or has no words). */
static size_t prefix_match(const char *p, const char *const *argv, size_t argc)
{
	size_t k = 0;

	while (*p) {
		size_t n;
		while (*p == ' ')
			p++;
		if (!*p)
			break;
		n = strcspn(p, " ");
		if (k >= argc || strlen(argv[k]) != n || memcmp(argv[k], p, n))
			return 0;
		k++;
		p += n;
	}
	return k;
}

bool route_match_local(const char *const *prefixes, size_t nprefixes, const char *const *argv, size_t argc)
{
	for (size_t i = 0; i < nprefixes; i++)
		if (prefix_match(prefixes[i], argv, argc))
			return true;
	return false;
}

/* ---- what a host command may be given ---- */

/* What a request env value may be. */
enum env_value {
	ENV_TEXT,   /* read as text only */
	ENV_LOCALE, /* a locale name: glibc takes one with a '/' as a path */
	ENV_TZ,	    /* a zone name under the zoneinfo directory, or a POSIX TZ rule */
	ENV_TERM,   /* a terminfo name: no '/' */
	ENV_NUM,    /* digits */
};

/* Request env names a local command accepts: none of them makes a program
 * load or run other code (PATH, LD_*, HOME, GIT_* would), and the values
 * of those that name files cannot be paths. */
static const struct {
	const char *name;
	enum env_value value;
} local_env[] = {
    {"LANG", ENV_LOCALE},
    {"TZ", ENV_TZ},
    {"TERM", ENV_TERM},
    {"COLUMNS", ENV_NUM},
    {"LINES", ENV_NUM},
    {"NO_COLOR", ENV_TEXT},
    {"CLICOLOR", ENV_TEXT},
    {"CLICOLOR_FORCE", ENV_TEXT},
    {"FORCE_COLOR", ENV_TEXT},
    {"GIT_AUTHOR_NAME", ENV_TEXT},
    {"GIT_AUTHOR_EMAIL", ENV_TEXT},
    {"GIT_AUTHOR_DATE", ENV_TEXT},
    {"GIT_COMMITTER_NAME", ENV_TEXT},
    {"GIT_COMMITTER_EMAIL", ENV_TEXT},
    {"GIT_COMMITTER_DATE", ENV_TEXT},
};

/* Whether entry's name is allowed; *value gets what its value may be. */
static bool local_env_allowed(const char *entry, enum env_value *value)
{
	size_t n = strcspn(entry, "=");

	if (n > 3 && !strncmp(entry, "LC_", 3)) {
		*value = ENV_LOCALE;
		return true;
	}
	for (size_t i = 0; i < sizeof(local_env) / sizeof(local_env[0]); i++)
		if (strlen(local_env[i].name) == n && !memcmp(entry, local_env[i].name, n)) {
			*value = local_env[i].value;
			return true;
		}
	return false;
}

/* NULL when v is a fine value of its kind, else what is wrong. */
static const char *local_env_value_bad(enum env_value kind, const char *v)
{
	switch (kind) {
	case ENV_TEXT:
		return NULL;
	case ENV_NUM:
		return strspn(v, "0123456789") == strlen(v) && strlen(v) <= 9 ? NULL : "is not a number";
	case ENV_LOCALE:
	case ENV_TERM:
		return strchr(v, '/') || !strcmp(v, "..") ? "names a file (a '/' in it)" : NULL;
	case ENV_TZ: {
		const char *p = v[0] == ':' ? v + 1 : v;
		if (p[0] == '/' || p[0] == '~')
			return "is a path";
		if (strstr(p, ".."))
			return "climbs out of the zoneinfo directory with '..'";
		if (strspn(p, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_+-.,:<>/") != strlen(p))
			return "has characters no zone name or POSIX TZ rule has";
		return NULL;
	}
	}
	return "is of an unknown kind";
}

/* A program other than git runs only as exactly one of the prefixes. */
static bool exact_prefix(const char *const *prefixes, size_t nprefixes, const char *const *argv, size_t argc)
{
	for (size_t i = 0; i < nprefixes; i++)
		if (argc && prefix_match(prefixes[i], argv, argc) == argc)
			return true;
	return false;
}

int route_local_check(const struct route_local_req *q, char *why, size_t n)
{
	const char *base = q->argc ? strrchr(q->argv[0], '/') : NULL;

	base = base ? base + 1 : q->argc ? q->argv[0] : "";
	for (size_t i = 0; i < q->nenv; i++) {
		enum env_value kind = ENV_TEXT;
		const char *eq = strchr(q->env[i], '='), *bad;
		int nl = (int)(strcspn(q->env[i], "=") < 100 ? strcspn(q->env[i], "=") : 100);
		if (!local_env_allowed(q->env[i], &kind)) {
			snprintf(
			    why, n,
			    "execution.local: env %.*s is not allowed for a command run on the host (allowed: LANG, "
			    "LC_*, TZ, TERM, COLUMNS, LINES, NO_COLOR, CLICOLOR, CLICOLOR_FORCE, FORCE_COLOR, "
			    "GIT_AUTHOR_*, GIT_COMMITTER_* names/emails/dates)",
			    nl, q->env[i]);
			return -EPERM;
		}
		if ((bad = local_env_value_bad(kind, eq ? eq + 1 : ""))) {
			snprintf(why, n,
				 "execution.local: env %.*s: the value %s, not allowed for a command run on the host",
				 nl, q->env[i], bad);
			return -EPERM;
		}
	}
	if (!strcmp(base, "git"))
		return gitargs_check(q->ws, q->argv, q->argc, why, n);
	if (!exact_prefix(q->prefixes, q->nprefixes, q->argv, q->argc)) {
		snprintf(why, n,
			 "execution.local: '%.100s' runs on the host only exactly as execution.local lists it, without "
			 "further arguments (only git has a model of safe arguments; doc/EXEC.md)",
			 q->argv[0]);
		return -EPERM;
	}
	return 0;
}

/* ---- git hardening ---- */

struct kv {
	char **v;
	size_t n, cap;
};

static int kv_add(struct kv *o, const char *k, const char *v)
{
	size_t kl = strlen(k), vl = strlen(v);
	char *s;
	if (o->n + 1 >= o->cap) {
		size_t cap = o->cap ? o->cap * 2 : 64;
		char **nv = mem_realloc(o->v, cap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		o->v = nv;
		o->cap = cap;
	}
	if (!(s = mem_alloc(kl + vl + 2)))
		return -ENOMEM;
	memcpy(s, k, kl);
	s[kl] = '=';
	memcpy(s + kl + 1, v, vl + 1);
	o->v[o->n++] = s;
	o->v[o->n] = NULL;
	return 0;
}

static void kv_free(struct kv *o)
{
	route_git_env_free(o->v, o->n);
	memset(o, 0, sizeof(*o));
}

void route_git_env_free(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		mem_free(v[i]);
	mem_free(v);
}

/* Config keys git would run a program from, with a harmless value. */
static const struct {
	const char *key, *value;
} git_fixed[] = {
    {"core.hooksPath", "/dev/null"}, /* no hook can be found under it */
    {"core.fsmonitor", "false"},
    {"core.pager", "cat"},
    {"core.editor", ":"},
    {"core.askPass", ""},
    {"core.sshCommand", "ssh"},
    {"core.gitProxy", ""},
    {"core.alternateRefsCommand", ""},
    {"sequence.editor", ":"},
    {"diff.external", GIT_DIFF_EMULATION},
    {"credential.helper", ""}, /* the empty value resets the helper list */
    {"gpg.program", "gpg"},
    {"gpg.openpgp.program", "gpg"},
    {"gpg.x509.program", "gpgsm"},
    {"gpg.ssh.program", "ssh-keygen"},
    {"gpg.ssh.defaultKeyCommand", ""},
    {"commit.gpgSign", "false"},
    {"tag.gpgSign", "false"},
    {"push.gpgSign", "false"},
    {"log.showSignature", "false"},
    {"protocol.ext.allow", "never"},
    /* a bare repository found by discovery (one embedded in the project,
     * vendor/x.git) brings its own config: only one named with GIT_DIR,
     * which a request cannot set, is used */
    {"safe.bareRepository", "explicit"},
};

/* Environment that git reads before or instead of the config. */
static const struct {
	const char *name, *value;
} git_env_fixed[] = {
    {"GIT_CONFIG_NOSYSTEM", "1"},
    {"GIT_CONFIG_GLOBAL", "/dev/null"},
    {"GIT_CONFIG_PARAMETERS", ""}, /* a request's own -c list cannot undo ours */
    {"GIT_TERMINAL_PROMPT", "0"},
    {"GIT_ASKPASS", ""},
    {"SSH_ASKPASS", ""},
    {"GIT_PAGER", "cat"},
    {"PAGER", "cat"},
    {"GIT_EDITOR", ":"},
    {"GIT_SEQUENCE_EDITOR", ":"},
    {"GIT_SSH_COMMAND", "ssh"},
    {"GIT_EXTERNAL_DIFF", GIT_DIFF_EMULATION},
    {"GIT_ALLOW_PROTOCOL", "file:http:https:ssh"},
};

/* One "section.sub.key" name from the probe (section and key are lower
 * case in git's output) and its value: the override it needs, if any. */
static const char *git_override_for(const char *name, const char *value)
{
	const char *dot = strchr(name, '.'), *last = strrchr(name, '.');
	size_t sl;

	if (!dot)
		return NULL;
	sl = (size_t)(dot - name);
#define SECTION(s) (sl == strlen(s) && !memcmp(name, s, sl))
	if (dot == last) { /* no subsection */
		if (SECTION("pager"))
			return "false";
		if (SECTION("alias") && value && value[0] == '!')
			return ""; /* "empty alias": git refuses instead of running it */
		return NULL;
	}
	last++;
	if (SECTION("filter") && (!strcmp(last, "clean") || !strcmp(last, "smudge") || !strcmp(last, "process")))
		return ""; /* no filter: content as is, or an error for a required one */
	if (SECTION("diff") && !strcmp(last, "command"))
		return GIT_DIFF_EMULATION;
	if (SECTION("diff") && !strcmp(last, "textconv"))
		return "cat";
	if (SECTION("merge") && !strcmp(last, "driver"))
		return "git merge-file --marker-size=%L %A %O %B"; /* git's own 3-way text merge */
	if (SECTION("credential") && !strcmp(last, "helper"))
		return "";
	if (SECTION("remote") && !strcmp(last, "uploadpack"))
		return "git-upload-pack";
	if (SECTION("remote") && !strcmp(last, "receivepack"))
		return "git-receive-pack";
	if ((SECTION("difftool") || SECTION("mergetool")) && (!strcmp(last, "cmd") || !strcmp(last, "path")))
		return "false";
	if (SECTION("submodule") && !strcmp(last, "update") && value && value[0] == '!')
		return "checkout";
	if (SECTION("trailer") && (!strcmp(last, "command") || !strcmp(last, "cmd")))
		return "";
#undef SECTION
	return NULL;
}

int route_git_env(const char *config_z, size_t len, char ***out, size_t *nout)
{
	struct kv cfg = {0}, env = {0};
	char num[32], key[48];
	const char *p = config_z, *end = config_z ? config_z + len : NULL;
	int r = -ENOMEM;

	*out = NULL;
	*nout = 0;
	for (size_t i = 0; i < sizeof(git_fixed) / sizeof(git_fixed[0]); i++)
		if ((r = kv_add(&cfg, git_fixed[i].key, git_fixed[i].value)) < 0)
			goto out;
	/* entries: "name\nvalue\0", or "name\0" for a key without value */
	while (p && p < end) {
		const char *z = memchr(p, '\0', (size_t)(end - p));
		char *name;
		const char *value = NULL, *ov;
		if (!z)
			break; /* a truncated last entry: git always ends with NUL */
		if (!(name = mem_strndup(p, (size_t)(z - p)))) {
			r = -ENOMEM;
			goto out;
		}
		char *nl = strchr(name, '\n');
		if (nl) {
			*nl = '\0';
			value = nl + 1;
		}
		if (!strcmp(name, "core.worktree")) {
			/* the work tree git would use is wherever it says, the
			 * whole disk for "/": no override can put it back */
			mem_free(name);
			r = -EPERM;
			goto out;
		}
		ov = git_override_for(name, value);
		if (ov && cfg.n >= GIT_OVERRIDES_MAX) {
			mem_free(name);
			r = -E2BIG;
			goto out;
		}
		r = ov ? kv_add(&cfg, name, ov) : 0;
		mem_free(name);
		if (r < 0)
			goto out;
		p = z + 1;
	}
	for (size_t i = 0; i < sizeof(git_env_fixed) / sizeof(git_env_fixed[0]); i++)
		if ((r = kv_add(&env, git_env_fixed[i].name, git_env_fixed[i].value)) < 0)
			goto out;
	snprintf(num, sizeof(num), "%zu", cfg.n);
	if ((r = kv_add(&env, "GIT_CONFIG_COUNT", num)) < 0)
		goto out;
	for (size_t i = 0; i < cfg.n; i++) {
		char *eq = strchr(cfg.v[i], '=');
		*eq = '\0';
		snprintf(key, sizeof(key), "GIT_CONFIG_KEY_%zu", i);
		if ((r = kv_add(&env, key, cfg.v[i])) < 0)
			goto out;
		snprintf(key, sizeof(key), "GIT_CONFIG_VALUE_%zu", i);
		if ((r = kv_add(&env, key, eq + 1)) < 0)
			goto out;
	}
	*out = env.v;
	*nout = env.n;
	env.v = NULL;
	env.n = 0;
	r = 0;
out:
	kv_free(&cfg);
	kv_free(&env);
	return r;
}

/* ---- per-command state ---- */

static struct rcmd *rc_find(struct route *r, struct relay_cmd *cmd)
{
	for (struct rcmd *c = r->cmds; c; c = c->next)
		if (c->cmd == cmd)
			return c;
	return NULL;
}

static void strv_free(char **v, size_t n)
{
	for (size_t i = 0; v && i < n; i++)
		if (v[i]) {
			sodium_memzero(v[i], strlen(v[i])); /* request env may hold secrets too */
			mem_free(v[i]);
		}
	mem_free(v);
}

static void rc_free(struct rcmd *c)
{
	struct route *r = c->r;

	for (struct rcmd **pp = &r->cmds; *pp; pp = &(*pp)->next)
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	cred_wait_cancel(c->wait);
	hostrun_free(c->probe);
	exec_free(c->e);
	strv_free(c->argv, c->argc);
	strv_free(c->env, c->nenv);
	mem_free(c->cwd);
	mem_free(c->fork);
	buf_clear(&c->stdin_q);
	mem_free(c);
}

static int strv_dup(const char *const *src, size_t n, char ***out)
{
	char **v = mem_calloc(n + 1, sizeof(char *));
	if (!v)
		return -ENOMEM;
	*out = v;
	for (size_t i = 0; i < n; i++)
		if (!(v[i] = mem_strdup(src[i])))
			return -ENOMEM;
	return 0;
}

static int rc_new(struct route *r, struct relay_cmd *cmd, const struct relay_exec_req *req, enum rc_state st,
		  struct rcmd **out)
{
	struct rcmd *c = mem_calloc(1, sizeof(*c));
	int e;

	if (!c)
		return -ENOMEM;
	c->r = r;
	c->cmd = cmd;
	c->state = st;
	c->argc = req->argc;
	c->nenv = req->nenv;
	c->shell = req->shell;
	c->tty = req->tty;
	c->rows = req->rows;
	c->cols = req->cols;
	c->stdin_open = req->stdin_open;
	c->timeout_ms = req->timeout_ms;
	buf_init(&c->stdin_q, LOCAL_STDIN_Q_MAX);
	c->next = r->cmds;
	r->cmds = c;
	if ((e = strv_dup(req->argv, req->argc, &c->argv)) < 0 || (e = strv_dup(req->env, req->nenv, &c->env)) < 0 ||
	    !(c->cwd = mem_strdup(req->cwd ? req->cwd : "")) || (req->fork && !(c->fork = mem_strdup(req->fork)))) {
		rc_free(c);
		return e < 0 ? e : -ENOMEM;
	}
	*out = c;
	return 0;
}

static struct relay_exec_req rc_req(const struct rcmd *c)
{
	struct relay_exec_req q = {
	    .argv = (const char *const *)c->argv,
	    .argc = c->argc,
	    .shell = c->shell,
	    .cwd = c->cwd,
	    .env = (const char *const *)c->env,
	    .nenv = c->nenv,
	    .timeout_ms = c->timeout_ms,
	    .tty = c->tty,
	    .rows = c->rows,
	    .cols = c->cols,
	    .stdin_open = c->stdin_open,
	    .fork = c->fork,
	};
	return q;
}

/* ---- guest-bound ---- */

/* Hand to the guest backend with the forwarded layer. The relay still
 * owns cmd; errors are reported on it here. */
static int to_guest(struct route *r, struct relay_cmd *cmd, const struct relay_exec_req *req)
{
	struct relay_exec_req q = *req;
	struct cred_env *ce = NULL;
	int e;

	if ((e = cred_env(r->cred, true, &ce)) < 0)
		return e;
	q.forwarded = (const char *const *)ce->v;
	q.nforwarded = ce->n;
	e = r->guest->exec_start(r->guest_ud, cmd, &q);
	cred_env_free(ce); /* wipes; the guest backend's copy is wiped with its frame buffer */
	return e;
}

static void cred_ready(int err, const char *msg, void *ud)
{
	struct rcmd *c = ud;
	struct route *r = c->r;
	struct relay_cmd *cmd = c->cmd;
	struct relay_exec_req q = rc_req(c);
	int e;

	c->wait = NULL;
	if (err < 0) {
		rc_free(c);
		relay_cmd_error(cmd, "credential_failed", msg ? msg : "a credential could not be resolved");
		return;
	}
	/* the guest backend takes over; q points into c until then */
	e = to_guest(r, cmd, &q);
	rc_free(c);
	if (e == -EAGAIN) /* expired again meanwhile (a ttl shorter than the resolution) */
		e = -ETIMEDOUT;
	if (e < 0) {
		char m[200];
		snprintf(m, sizeof(m), "could not start the command in the guest: %s", strerror(-e));
		relay_cmd_error(cmd, "backend_error", m);
	}
}

/* ---- local ---- */

static void lx_output(struct exec *e, int stream, const void *data, size_t n, void *ud)
{
	struct rcmd *c = ud;
	(void)e;
	relay_cmd_output(c->cmd, stream == 2 ? RELAY_STDERR : RELAY_STDOUT, data, n);
}

static void lx_exit(struct exec *e, const struct exec_result *res, void *ud)
{
	struct rcmd *c = ud;
	struct relay_cmd *cmd = c->cmd;
	struct relay_exit ex = {
	    .code = res->signal ? -1 : res->exit_code,
	    .signal = res->signal,
	    .timed_out = res->timed_out,
	    .duration_ms = res->duration_ms,
	};
	(void)e;
	rc_free(c); /* exec_free from inside on_exit is allowed (deferred) */
	relay_cmd_exit(cmd, &ex);
}

static void lx_stdin_flush(struct rcmd *c)
{
	while (buf_len(&c->stdin_q)) {
		ssize_t w = exec_write_stdin(c->e, buf_ptr(&c->stdin_q), buf_len(&c->stdin_q));
		if (w <= 0) {
			if (w == -EPIPE || w == -EBADF) /* it closed its stdin: drop the rest */
				buf_reset(&c->stdin_q);
			break;
		}
		buf_consume(&c->stdin_q, (size_t)w);
	}
	if (c->stdin_eof && !c->stdin_closed && !buf_len(&c->stdin_q)) {
		c->stdin_closed = true;
		exec_close_stdin(c->e);
	}
}

static void lx_stdin_writable(struct exec *e, void *ud)
{
	(void)e;
	lx_stdin_flush(ud);
}

static const struct exec_ops lx_ops = {
    .on_output = lx_output,
    .on_exit = lx_exit,
    .on_stdin_writable = lx_stdin_writable,
};

/* The request layer of a local command's environment: the request's env,
 * then the git layer and the discovery ceiling last, so a request cannot
 * undo them. *n: its length. The strings stay the caller's; mem_free. */
static char **local_request_env(const struct rcmd *c, char **git, size_t ngit, size_t *n)
{
	char **rq = mem_calloc(c->nenv + ngit + 2, sizeof(char *));

	if (!rq)
		return NULL;
	memcpy(rq, c->env, c->nenv * sizeof(char *));
	memcpy(rq + c->nenv, git, ngit * sizeof(char *));
	rq[c->nenv + ngit] = c->r->ceiling;
	*n = c->nenv + ngit + 1;
	return rq;
}

static void probe_done(struct hostrun *h, const struct hostrun_result *res, void *ud)
{
	struct rcmd *c = ud;
	struct route *r = c->r;
	struct relay_cmd *cmd = c->cmd;
	struct cred_env *ce = NULL;
	char **git = NULL, **envp = NULL, msg[768];
	const char *bad = NULL;
	size_t ngit = 0;
	int e;

	msg[0] = '\0';
	if (res->timed_out || res->too_big)
		snprintf(msg, sizeof(msg), "execution.local: `git config --list` %s; not running '%.200s' on the host",
			 res->timed_out ? "timed out" : "printed too much", c->argv[0]);
	else if (res->exit_code != 0 && res->exec_errno != ENOENT)
		snprintf(msg, sizeof(msg),
			 "execution.local: could not read the repository's git configuration (status %d: %.300s); not "
			 "running '%.200s' on the host",
			 res->exit_code, res->err_tail, c->argv[0]);
	if (msg[0]) {
		c->probe = NULL;
		hostrun_free(h);
		rc_free(c);
		relay_cmd_error(cmd, "spawn_failed", msg);
		return;
	}
	/* exit 0, or git is not installed (then nothing can read git config) */
	e = route_git_env(res->exec_errno ? NULL : (const char *)res->out, res->exec_errno ? 0 : res->out_len, &git,
			  &ngit);
	c->probe = NULL;
	hostrun_free(h); /* wipes the config text */
	if (e < 0) {
		rc_free(c);
		if (e == -EPERM)
			relay_cmd_error(
			    cmd, "local_refused",
			    "execution.local: the repository's git configuration sets core.worktree (a work "
			    "tree that may be outside the workspace); not running on the host");
		else
			relay_cmd_error(cmd, "spawn_failed",
					e == -E2BIG ? "execution.local: the repository's git configuration defines too "
						      "many drivers to disable"
						    : "execution.local: out of memory");
		return;
	}
	size_t nrq = 0;
	char **rq = local_request_env(c, git, ngit, &nrq);
	if (!rq || (e = cred_env(r->cred, false, &ce)) < 0) {
		mem_free(rq);
		route_git_env_free(git, ngit);
		rc_free(c);
		relay_cmd_error(cmd, "backend_error", "out of memory");
		return;
	}
	struct exec_env_in ein = {
	    .home = r->home,
	    .tty = c->tty,
	    .forwarded = (const char *const *)ce->v,
	    .n_forwarded = ce->n,
	    .request = (const char *const *)rq,
	    .n_request = nrq,
	};
	e = exec_env_build(&ein, &envp, &bad);
	if (e < 0) {
		snprintf(msg, sizeof(msg), "environment entry '%.*s': %s",
			 bad ? (int)(strcspn(bad, "=") < 200 ? strcspn(bad, "=") : 200) : 1, bad ? bad : "?",
			 e == -E2BIG ? "environment too large" : "not NAME=value with a valid name");
	} else {
		int ws = open(r->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		struct exec_req q = {
		    .argv = (const char *const *)c->argv,
		    .root_fd = ws,
		    .cwd = c->cwd,
		    .envp = (const char *const *)envp,
		    .timeout_ms = c->timeout_ms,
		    .tty = c->tty,
		    .rows = c->rows,
		    .cols = c->cols,
		    .stdin_open = c->stdin_open,
		    .stdin_buf = EXEC_STDIN_BUF_MAX,
		    .uid = EXEC_ID_KEEP,
		    .gid = EXEC_ID_KEEP,
		};
		if (ws < 0)
			e = -errno;
		else
			e = exec_start(r->loop, NULL, &q, &lx_ops, c, &c->e);
		if (ws >= 0)
			close(ws);
		if (e < 0) {
			c->e = NULL;
			if (e == -EXDEV)
				snprintf(msg, sizeof(msg), "cwd '%.200s' leaves the workspace", c->cwd);
			else
				snprintf(msg, sizeof(msg), "could not start '%.200s' on the host: %s", c->argv[0],
					 strerror(-e));
		}
	}
	for (char **p = envp; p && *p; p++)
		sodium_memzero(*p, strlen(*p));
	exec_env_free(envp);
	cred_env_free(ce);
	mem_free(rq);
	route_git_env_free(git, ngit);
	if (e < 0) {
		bool cwd = e == -EXDEV || e == -ENOENT || e == -ENOTDIR || e == -EACCES;
		rc_free(c);
		relay_cmd_error(cmd, cwd ? "bad_cwd" : "spawn_failed", msg);
		return;
	}
	c->state = RC_LOCAL;
	if (c->paused)
		exec_pause_output(c->e, true);
	relay_cmd_started_host(cmd, exec_pid(c->e));
	lx_stdin_flush(c);
}

static int start_local(struct route *r, struct relay_cmd *cmd, const struct relay_exec_req *req)
{
	static const char *const probe_argv[] = {"git", "config", "--list", "-z", NULL};
	struct rcmd *c;
	struct cred_env *ce = NULL;
	char **git = NULL, **envp = NULL, **rq = NULL;
	const char *bad = NULL;
	size_t ngit = 0;
	int e;

	{
		char why[512];
		int root = open(r->workspace, O_PATH | O_DIRECTORY | O_CLOEXEC);
		struct gitargs_ws ws = {.root_fd = root, .root = r->workspace, .cwd = req->cwd ? req->cwd : ""};
		struct route_local_req lq = {
		    .prefixes = (const char *const *)r->prefixes,
		    .nprefixes = r->nprefixes,
		    .argv = req->argv,
		    .argc = req->argc,
		    .env = req->env,
		    .nenv = req->nenv,
		    .ws = &ws,
		};
		if (root < 0)
			return -errno;
		e = route_local_check(&lq, why, sizeof(why));
		close(root);
		if (e < 0) {
			relay_cmd_error(cmd, "local_refused", why);
			return 0;
		}
	}
	if ((e = rc_new(r, cmd, req, RC_PROBE, &c)) < 0)
		return e;
	/* the probe runs with the command's environment and the fixed git layer */
	if ((e = route_git_env(NULL, 0, &git, &ngit)) < 0 || (e = cred_env(r->cred, false, &ce)) < 0)
		goto out;
	size_t nrq = 0;
	if (!(rq = local_request_env(c, git, ngit, &nrq))) {
		e = -ENOMEM;
		goto out;
	}
	struct exec_env_in ein = {
	    .home = r->home,
	    .forwarded = (const char *const *)ce->v,
	    .n_forwarded = ce->n,
	    .request = (const char *const *)rq,
	    .n_request = nrq,
	};
	if ((e = exec_env_build(&ein, &envp, &bad)) < 0) {
		e = -EINVAL;
		goto out;
	}
	int ws = open(r->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (ws < 0) {
		e = -errno;
		goto out;
	}
	struct hostrun_req q = {
	    .argv = probe_argv,
	    .envp = (const char *const *)envp,
	    .dir_fd = ws,
	    .cwd = c->cwd,
	    .max_out = GIT_PROBE_MAX,
	    .timeout_ms = GIT_PROBE_TIMEOUT_MS,
	};
	if ((e = hostrun_start(r->loop, &q, probe_done, c, &c->probe)) < 0)
		c->probe = NULL;
	close(ws);
out:
	for (char **p = envp; p && *p; p++)
		sodium_memzero(*p, strlen(*p));
	exec_env_free(envp);
	cred_env_free(ce);
	mem_free(rq);
	route_git_env_free(git, ngit);
	if (e < 0) {
		char msg[300];
		if (e == -EXDEV || e == -ENOENT || e == -ENOTDIR || e == -EACCES) {
			snprintf(msg, sizeof(msg), "cwd '%.200s': %s", c->cwd,
				 e == -EXDEV ? "leaves the workspace" : strerror(-e));
			rc_free(c);
			relay_cmd_error(cmd, "bad_cwd", msg);
			return 0;
		}
		if (e == -EINVAL) {
			rc_free(c);
			relay_cmd_error(cmd, "spawn_failed", "bad environment for the local command");
			return 0;
		}
		rc_free(c);
		return e;
	}
	return 0;
}

/* ---- backend ops ---- */

static int ro_exec_start(void *ud, struct relay_cmd *cmd, const struct relay_exec_req *req)
{
	struct route *r = ud;
	struct rcmd *c;
	int e;

	/* a fork's commands run in the fork: execution.local would run them in
	 * the host's workspace, which the fork is not; and the sandbox being
	 * stopped (as it is after a fork) says nothing about its forks */
	if (!req->fork && !req->shell &&
	    route_match_local((const char *const *)r->prefixes, r->nprefixes, req->argv, req->argc))
		return start_local(r, cmd, req);
	if (!req->fork && r->guest_ready && !r->guest_ready(r->guest_ud))
		return r->guest->exec_start(r->guest_ud, cmd, req); /* it says why not; no credential is resolved */
	e = to_guest(r, cmd, req);
	if (e != -EAGAIN)
		return e;
	/* an inject value is missing or expired: resolve, then start */
	if ((e = rc_new(r, cmd, req, RC_CRED, &c)) < 0)
		return e;
	if ((e = cred_refresh(r->cred, cred_ready, c, &c->wait)) < 0) {
		c->wait = NULL;
		rc_free(c);
		return e;
	}
	return 0;
}

static int ro_stdin_write(void *ud, struct relay_cmd *cmd, const void *data, size_t n, bool eof)
{
	struct route *r = ud;
	struct rcmd *c = rc_find(r, cmd);

	if (!c)
		return r->guest->stdin_write(r->guest_ud, cmd, data, n, eof);
	if (c->state != RC_LOCAL || c->stdin_eof)
		return c->stdin_eof ? -EPIPE : -EAGAIN;
	if (!c->stdin_open)
		return -EBADF;
	if (n > LOCAL_STDIN_Q_MAX - buf_len(&c->stdin_q))
		return -EAGAIN;
	if (n && buf_put(&c->stdin_q, data, n) < 0)
		return -EAGAIN;
	c->stdin_eof = eof;
	lx_stdin_flush(c);
	return 0;
}

static int ro_signal(void *ud, struct relay_cmd *cmd, int signo)
{
	struct route *r = ud;
	struct rcmd *c = rc_find(r, cmd);

	if (!c)
		return r->guest->signal(r->guest_ud, cmd, signo);
	if (c->state != RC_LOCAL)
		return -EAGAIN;
	return exec_signal(c->e, signo);
}

static int ro_resize(void *ud, struct relay_cmd *cmd, uint16_t rows, uint16_t cols)
{
	struct route *r = ud;
	struct rcmd *c = rc_find(r, cmd);

	if (!c)
		return r->guest->resize(r->guest_ud, cmd, rows, cols);
	c->rows = rows;
	c->cols = cols;
	return c->state == RC_LOCAL && c->tty ? exec_resize(c->e, rows, cols) : 0;
}

static int ro_cancel(void *ud, struct relay_cmd *cmd)
{
	struct route *r = ud;
	struct rcmd *c = rc_find(r, cmd);

	if (!c)
		return r->guest->cancel(r->guest_ud, cmd);
	if (c->state == RC_LOCAL)
		return exec_cancel(c->e);
	rc_free(c);
	relay_cmd_error(cmd, "canceled", "canceled before it started");
	return 0;
}

static void ro_pause(void *ud, struct relay_cmd *cmd, bool paused)
{
	struct route *r = ud;
	struct rcmd *c = rc_find(r, cmd);

	if (!c) {
		r->guest->pause(r->guest_ud, cmd, paused);
		return;
	}
	c->paused = paused;
	if (c->state == RC_LOCAL)
		exec_pause_output(c->e, paused);
}

static int ro_sync_wait(void *ud, uint64_t token)
{
	struct route *r = ud;
	return r->guest->sync_wait(r->guest_ud, token);
}

static void ro_release(void *ud, struct relay_cmd *cmd)
{
	struct route *r = ud;
	struct rcmd *c = rc_find(r, cmd);

	if (!c)
		r->guest->release(r->guest_ud, cmd);
	else
		rc_free(c); /* a local command is killed with it */
}

const struct relay_backend_ops route_backend_ops = {
    .exec_start = ro_exec_start,
    .stdin_write = ro_stdin_write,
    .signal = ro_signal,
    .resize = ro_resize,
    .cancel = ro_cancel,
    .pause = ro_pause,
    .sync_wait = ro_sync_wait,
    .release = ro_release,
};

/* ---- lifetime ---- */

/* git looks for a repository from the command's directory upwards: it
 * must not find one above the workspace (a repository in the user's home
 * would give git show HEAD:.ssh/config). The parent is the ceiling: git
 * looks at the workspace itself, never at the parent or above. */
static int make_ceiling(struct route *r)
{
	const char *ws = r->workspace, *slash = strrchr(ws, '/');
	size_t pl = slash ? (size_t)(slash - ws) : 0;
	static const char name[] = "GIT_CEILING_DIRECTORIES=";

	if (ws[0] != '/')
		return -EINVAL; /* up passes an absolute path */
	if (!(r->ceiling = mem_alloc(sizeof(name) + pl + 1)))
		return -ENOMEM;
	snprintf(r->ceiling, sizeof(name) + pl + 1, "%s%.*s", name, (int)(pl ? pl : 1), pl ? ws : "/");
	return 0;
}

int route_new(const struct route_cfg *cfg, struct route **out)
{
	const struct policy_execution *pe = policy_execution(cfg->policy);
	struct cred_opts co = {.config_path = cfg->cred_config, .workspace = cfg->workspace};
	struct route *r;
	int e;

	*out = NULL;
	if (!(r = mem_calloc(1, sizeof(*r))))
		return -ENOMEM;
	r->loop = cfg->loop;
	r->policy = cfg->policy;
	r->guest = cfg->guest;
	r->guest_ud = cfg->guest_ud;
	r->guest_ready = cfg->guest_ready;
	{
		const char *h = getenv("HOME");
		snprintf(r->home, sizeof(r->home), "%s", h && h[0] == '/' ? h : "/");
	}
	if ((e = cred_new(cfg->loop, policy_credentials(cfg->policy), &co, &r->cred)) < 0)
		goto fail;
	if (pe && pe->local.n) {
		r->prefixes = (char **)pe->local.v; /* owned by the policy, which outlives us */
		r->nprefixes = pe->local.n;
		int fd = open(cfg->workspace, O_RDONLY | O_DIRECTORY | O_CLOEXEC); /* fail early */
		if (fd < 0) {
			e = -errno;
			goto fail;
		}
		close(fd);
		if (!(r->workspace = mem_strdup(cfg->workspace)) || (e = make_ceiling(r)) < 0) {
			e = e < 0 ? e : -ENOMEM;
			goto fail;
		}
	}
	*out = r;
	return 0;
fail:
	route_free(r);
	return e;
}

void route_free(struct route *r)
{
	if (!r)
		return;
	while (r->cmds)
		rc_free(r->cmds);
	cred_free(r->cred);
	mem_free(r->workspace);
	mem_free(r->ceiling);
	mem_free(r);
}
