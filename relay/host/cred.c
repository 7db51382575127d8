/* SPDX-License-Identifier: Apache-2.0 */
/* cred: forward_env and credentials.inject on the host (cred.h, doc/CREDENTIALS.md). */
#include "airlock/host/cred.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/host/hostrun.h"
#include "airlock/policy/policy.h"

/* ---- configuration file ---- */

struct cred_source {
	char *name;
	char **argv; /* NULL-terminated */
	unsigned timeout_s;
};

struct cred_config {
	struct cred_source *v;
	size_t n;
};

int cred_config_path(char *out, size_t n)
{
	const char *x = getenv("XDG_CONFIG_HOME"), *h = getenv("HOME");
	int k;

	if (x && x[0] == '/')
		k = snprintf(out, n, "%s/airlock/credentials.json", x);
	else if (h && h[0] == '/')
		k = snprintf(out, n, "%s/.config/airlock/credentials.json", h);
	else
		return -ENOENT;
	return k < 0 || (size_t)k >= n ? -ENAMETOOLONG : 0;
}

void cred_config_free(struct cred_config *cfg)
{
	if (!cfg)
		return;
	for (size_t i = 0; i < cfg->n; i++) {
		mem_free(cfg->v[i].name);
		for (size_t j = 0; cfg->v[i].argv && cfg->v[i].argv[j]; j++)
			mem_free(cfg->v[i].argv[j]);
		mem_free(cfg->v[i].argv);
	}
	mem_free(cfg->v);
	mem_free(cfg);
}

/* The file and its directory: ours, not writable by anyone else. */
static int check_owner(const char *path, const struct stat *st, const char *what, char *err, size_t errlen)
{
	if (st->st_uid != geteuid() && st->st_uid != 0) {
		errmsg_set(err, errlen, "%s: %s is owned by uid %u, not by you (uid %u): refused", path, what,
			   (unsigned)st->st_uid, (unsigned)geteuid());
		return -EPERM;
	}
	if (st->st_mode & (S_IWGRP | S_IWOTH)) {
		errmsg_set(err, errlen, "%s: %s is writable by group or others (mode %04o): refused; chmod go-w it",
			   path, what, (unsigned)(st->st_mode & 07777));
		return -EPERM;
	}
	return 0;
}

static int parse_source(const char *path, const char *name, json_t *o, struct cred_source *s, char *err, size_t errlen)
{
	const char *k;
	json_t *v, *cmd = NULL;
	size_t i;

	s->timeout_s = CRED_TIMEOUT_S_DEFAULT;
	if (!json_is_object(o)) {
		errmsg_set(err, errlen, "%s: sources.%s: expected an object {\"command\": [argv...]}", path, name);
		return -EINVAL;
	}
	json_object_foreach(o, k, v)
	{
		if (!strcmp(k, "command")) {
			cmd = v;
		} else if (!strcmp(k, "timeout_seconds")) {
			if (!json_is_integer(v) || json_integer_value(v) < 1 ||
			    json_integer_value(v) > CRED_TIMEOUT_S_MAX) {
				errmsg_set(err, errlen, "%s: sources.%s.timeout_seconds: expected an integer 1..%d",
					   path, name, CRED_TIMEOUT_S_MAX);
				return -EINVAL;
			}
			s->timeout_s = (unsigned)json_integer_value(v);
		} else {
			errmsg_set(err, errlen, "%s: sources.%s.%s: unknown key (known: command, timeout_seconds)",
				   path, name, k);
			return -EINVAL;
		}
	}
	if (!json_is_array(cmd) || json_array_size(cmd) == 0 || json_array_size(cmd) > CRED_SOURCE_ARGS_MAX) {
		errmsg_set(err, errlen,
			   "%s: sources.%s.command: expected a non-empty array of strings (argv, no shell)", path,
			   name);
		return -EINVAL;
	}
	if (!(s->argv = mem_calloc(json_array_size(cmd) + 1, sizeof(char *))))
		return -ENOMEM;
	json_array_foreach(cmd, i, v)
	{
		if (!json_is_string(v) || strlen(json_string_value(v)) != json_string_length(v) ||
		    (i == 0 && !json_string_length(v))) {
			errmsg_set(err, errlen, "%s: sources.%s.command[%zu]: expected a string without NUL bytes%s",
				   path, name, i, i == 0 ? ", not empty" : "");
			return -EINVAL;
		}
		if (!(s->argv[i] = mem_strdup(json_string_value(v))))
			return -ENOMEM;
	}
	return 0;
}

int cred_config_load(const char *path, struct cred_config **out, char *err, size_t errlen)
{
	struct cred_config *cfg = NULL;
	json_t *root = NULL, *sources = NULL, *v;
	json_error_t je;
	char dir[PATH_MAX], *buf = NULL;
	struct stat st;
	const char *k;
	ssize_t got;
	int fd = -1, r;

	*out = NULL;
	snprintf(dir, sizeof(dir), "%s", path);
	if (strrchr(dir, '/'))
		*strrchr(dir, '/') = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s%s", path, strerror(errno),
			   errno == ENOENT ? " (create it: see doc/CREDENTIALS.md)" : "");
		goto out;
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = -EINVAL;
		errmsg_set(err, errlen, "%s: not a regular file", path);
		goto out;
	}
	if ((r = check_owner(path, &st, "the file", err, errlen)) < 0)
		goto out;
	if (stat(dir, &st) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: directory %s: %s", path, dir, strerror(errno));
		goto out;
	}
	if ((r = check_owner(path, &st, "its directory", err, errlen)) < 0)
		goto out;
	if (st.st_size > (off_t)CRED_CONFIG_MAX) {
		r = -EFBIG;
		errmsg_set(err, errlen, "%s: larger than %u bytes", path, CRED_CONFIG_MAX);
		goto out;
	}
	if (!(buf = mem_alloc(CRED_CONFIG_MAX + 1))) {
		r = -ENOMEM;
		goto out;
	}
	size_t len = 0;
	while ((got = read(fd, buf + len, CRED_CONFIG_MAX + 1 - len)) > 0)
		len += (size_t)got;
	if (got < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", path, strerror(errno));
		goto out;
	}
	if (len > CRED_CONFIG_MAX) {
		r = -EFBIG;
		errmsg_set(err, errlen, "%s: larger than %u bytes", path, CRED_CONFIG_MAX);
		goto out;
	}
	if (!(root = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je))) {
		r = -EINVAL;
		errmsg_set(err, errlen, "%s:%d:%d: not valid JSON: %s", path, je.line, je.column, je.text);
		goto out;
	}
	if (!json_is_object(root)) {
		r = -EINVAL;
		errmsg_set(err, errlen, "%s: expected an object {\"sources\": {...}}", path);
		goto out;
	}
	json_object_foreach(root, k, v)
	{
		if (strcmp(k, "sources")) {
			r = -EINVAL;
			errmsg_set(err, errlen, "%s: %s: unknown key (known: sources)", path, k);
			goto out;
		}
		sources = v;
	}
	if (sources && !json_is_object(sources)) {
		r = -EINVAL;
		errmsg_set(err, errlen, "%s: sources: expected an object mapping credential names to sources", path);
		goto out;
	}
	if (!(cfg = mem_calloc(1, sizeof(*cfg))) ||
	    (sources && json_object_size(sources) &&
	     !(cfg->v = mem_calloc(json_object_size(sources), sizeof(*cfg->v))))) {
		r = -ENOMEM;
		goto out;
	}
	if (sources) {
		json_object_foreach(sources, k, v)
		{
			struct cred_source *s = &cfg->v[cfg->n++];
			if (!(s->name = mem_strdup(k))) {
				r = -ENOMEM;
				goto out;
			}
			if ((r = parse_source(path, k, v, s, err, errlen)) < 0)
				goto out;
		}
	}
	*out = cfg;
	cfg = NULL;
	r = 0;
out:
	if (r == -ENOMEM)
		errmsg_set(err, errlen, "%s: out of memory", path);
	if (fd >= 0)
		close(fd);
	if (buf) {
		sodium_memzero(buf, CRED_CONFIG_MAX + 1);
		mem_free(buf);
	}
	json_decref(root);
	cred_config_free(cfg);
	return r;
}

const char *const *cred_config_source(const struct cred_config *cfg, const char *name, unsigned *timeout_s)
{
	for (size_t i = 0; cfg && i < cfg->n; i++)
		if (!strcmp(cfg->v[i].name, name)) {
			if (timeout_s)
				*timeout_s = cfg->v[i].timeout_s;
			return (const char *const *)cfg->v[i].argv;
		}
	return NULL;
}

/* ---- values ---- */

struct entry {
	struct cred *c;
	const char *name, *scope, *key; /* the policy's */
	uint64_t ttl_s;
	char *value; /* sodium_malloc: "NAME=value\0" */
	size_t value_size;
	uint64_t expires_ms;
	uint64_t expire_timer;
	struct hostrun *run;
	char last_err[768];
};

struct cred_wait {
	struct cred *c;
	cred_done_fn *done;
	void *ud;
	struct cred_wait *next;
	bool cancelled;
};

struct cred {
	struct loop *loop;
	char config_path[PATH_MAX];
	int config_err; /* cred_config_path failed */
	uint64_t (*now_ms)(void *);
	void *clock_ud;
	char home[PATH_MAX];
	char workspace[PATH_MAX]; /* realpath, "" = none */
	char **fwd;		  /* sodium_malloc'd "NAME=value" */
	size_t nfwd;
	struct entry *inj;
	size_t ninj;
	struct cred_wait *waits;
	uint64_t notify_timer;
	uint64_t resolutions;
};

static uint64_t now_of(const struct cred *c)
{
	return c->now_ms ? c->now_ms(c->clock_ud) : loop_now_ms();
}

static char *secret_dup(const char *name, const char *value, size_t vlen, size_t *size)
{
	size_t nl = strlen(name), n = nl + 1 + vlen + 1;
	char *s = sodium_malloc(n);

	if (!s)
		return NULL;
	memcpy(s, name, nl);
	s[nl] = '=';
	memcpy(s + nl + 1, value, vlen);
	s[n - 1] = '\0';
	if (size)
		*size = n;
	return s;
}

static void entry_wipe(struct entry *e)
{
	if (e->value)
		sodium_free(e->value); /* wipes */
	e->value = NULL;
	e->value_size = 0;
	if (e->expire_timer)
		loop_del_timer(e->c->loop, e->expire_timer);
	e->expire_timer = 0;
}

__attribute__((format(printf, 2, 3))) static void set_err(struct entry *e, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(e->last_err, sizeof(e->last_err), fmt, ap);
	va_end(ap);
}

static void on_expire(struct loop *l, void *ud)
{
	struct entry *e = ud;
	(void)l;
	e->expire_timer = 0;
	entry_wipe(e); /* expired values do not linger in memory */
}

int cred_new(struct loop *l, const struct policy_credentials *pc, const struct cred_opts *opts, struct cred **out)
{
	struct cred *c;
	const char *h = getenv("HOME");

	*out = NULL;
	if (sodium_init() < 0) /* sodium_malloc needs it; idempotent */
		return -ENOMEM;
	if (!(c = mem_calloc(1, sizeof(*c))))
		return -ENOMEM;
	c->loop = l;
	if (opts) {
		c->now_ms = opts->now_ms;
		c->clock_ud = opts->clock_ud;
	}
	if (opts && opts->config_path)
		snprintf(c->config_path, sizeof(c->config_path), "%s", opts->config_path);
	else
		c->config_err = cred_config_path(c->config_path, sizeof(c->config_path));
	snprintf(c->home, sizeof(c->home), "%s", h && h[0] == '/' ? h : "/");
	if (opts && opts->workspace && !realpath(opts->workspace, c->workspace))
		snprintf(c->workspace, sizeof(c->workspace), "%s", opts->workspace);
	if (pc && pc->forward_env.n) {
		if (!(c->fwd = mem_calloc(pc->forward_env.n, sizeof(char *))))
			goto nomem;
		for (size_t i = 0; i < pc->forward_env.n; i++) {
			const char *v = getenv(pc->forward_env.v[i]);
			if (!v)
				continue; /* unset on the host: not sent */
			if (!(c->fwd[c->nfwd] = secret_dup(pc->forward_env.v[i], v, strlen(v), NULL)))
				goto nomem;
			c->nfwd++;
		}
	}
	if (pc && pc->n_inject) {
		if (!(c->inj = mem_calloc(pc->n_inject, sizeof(*c->inj))))
			goto nomem;
		c->ninj = pc->n_inject;
		for (size_t i = 0; i < pc->n_inject; i++) {
			struct entry *e = &c->inj[i];
			e->c = c;
			e->name = pc->inject[i].name;
			e->scope = pc->inject[i].scope ? pc->inject[i].scope : "";
			e->key = pc->inject[i].value_from ? pc->inject[i].value_from : pc->inject[i].name;
			e->ttl_s =
			    pc->inject[i].ttl_seconds > 0 ? (uint64_t)pc->inject[i].ttl_seconds : CRED_TTL_S_DEFAULT;
			if (e->ttl_s > CRED_TTL_S_MAX)
				e->ttl_s = CRED_TTL_S_MAX;
		}
	}
	*out = c;
	return 0;
nomem:
	cred_free(c);
	return -ENOMEM;
}

void cred_free(struct cred *c)
{
	if (!c)
		return;
	for (size_t i = 0; i < c->nfwd; i++)
		sodium_free(c->fwd[i]);
	mem_free(c->fwd);
	for (size_t i = 0; i < c->ninj; i++) {
		hostrun_free(c->inj[i].run);
		entry_wipe(&c->inj[i]);
	}
	mem_free(c->inj);
	while (c->waits) {
		struct cred_wait *w = c->waits;
		c->waits = w->next;
		mem_free(w);
	}
	if (c->notify_timer)
		loop_del_timer(c->loop, c->notify_timer);
	mem_free(c);
}

bool cred_has_inject(const struct cred *c)
{
	return c && c->ninj > 0;
}

uint64_t cred_resolutions(const struct cred *c)
{
	return c ? c->resolutions : 0;
}

static bool entry_fresh(const struct cred *c, const struct entry *e)
{
	return e->value && now_of(c) < e->expires_ms;
}

void cred_env_free(struct cred_env *e)
{
	if (!e)
		return;
	for (size_t i = 0; i < e->n; i++)
		sodium_free(e->v[i]);
	mem_free(e->v);
	mem_free(e);
}

int cred_env(struct cred *c, bool with_inject, struct cred_env **out)
{
	struct cred_env *e;
	size_t ninj = with_inject ? c->ninj : 0;

	*out = NULL;
	for (size_t i = 0; i < ninj; i++)
		if (!entry_fresh(c, &c->inj[i]))
			return -EAGAIN;
	if (!(e = mem_calloc(1, sizeof(*e))) || !(e->v = mem_calloc(c->nfwd + ninj + 1, sizeof(char *)))) {
		mem_free(e);
		return -ENOMEM;
	}
	for (size_t i = 0; i < c->nfwd + ninj; i++) {
		const char *s = i < c->nfwd ? c->fwd[i] : c->inj[i - c->nfwd].value;
		size_t n = strlen(s) + 1;
		if (!(e->v[i] = sodium_malloc(n))) {
			cred_env_free(e);
			return -ENOMEM;
		}
		memcpy(e->v[i], s, n);
		e->n++;
	}
	*out = e;
	return 0;
}

/* ---- resolution ---- */

static bool any_running(const struct cred *c)
{
	for (size_t i = 0; i < c->ninj; i++)
		if (c->inj[i].run)
			return true;
	return false;
}

/* Every wait learns the outcome once nothing runs. */
static void notify(struct loop *l, void *ud)
{
	struct cred *c = ud;
	(void)l;
	c->notify_timer = 0;
	if (any_running(c))
		return;
	/* detach the list: a callback may start a new wait (and resolution),
	 * which must wait for its own outcome */
	struct cred_wait *list = c->waits;
	c->waits = NULL;
	while (list) {
		struct cred_wait *w = list;
		int err = 0;
		const char *msg = NULL;
		list = w->next;
		for (size_t i = 0; i < c->ninj && !err; i++)
			if (!entry_fresh(c, &c->inj[i])) {
				err = -EIO;
				msg = c->inj[i].last_err[0] ? c->inj[i].last_err : "credential expired while resolving";
			}
		if (!w->cancelled)
			w->done(err, msg, w->ud);
		mem_free(w);
	}
}

static void schedule_notify(struct cred *c)
{
	if (!c->notify_timer)
		c->notify_timer = loop_add_timer(c->loop, 0, notify, c);
}

static void source_done(struct hostrun *h, const struct hostrun_result *r, void *ud)
{
	struct entry *e = ud;
	struct cred *c = e->c;
	size_t n = r->out_len;
	const char *tail = r->err_tail;
	const char *nl;

	/* last non-empty line of stderr, for the message (never stdout) */
	while (tail[0] && (nl = strchr(tail, '\n')) && nl[1])
		tail = nl + 1;
	if (r->timed_out)
		set_err(e, "credential %s: source '%s' timed out and was killed", e->name, e->key);
	else if (r->too_big)
		set_err(e, "credential %s: source '%s' printed more than %u bytes", e->name, e->key, CRED_VALUE_MAX);
	else if (r->exec_errno)
		set_err(e, "credential %s: source '%s': cannot run its command: %s", e->name, e->key,
			strerror(r->exec_errno));
	else if (r->exit_code != 0)
		set_err(e, "credential %s: source '%s' failed with status %d%s%.300s", e->name, e->key, r->exit_code,
			tail[0] ? ": " : "", tail);
	else {
		if (n && r->out[n - 1] == '\n')
			n--;
		if (!n)
			set_err(e, "credential %s: source '%s' printed nothing", e->name, e->key);
		else if (n > CRED_VALUE_MAX)
			set_err(e, "credential %s: source '%s' printed more than %u bytes", e->name, e->key,
				CRED_VALUE_MAX);
		else if (memchr(r->out, '\0', n))
			set_err(e, "credential %s: source '%s' printed a NUL byte", e->name, e->key);
		else {
			entry_wipe(e);
			if (!(e->value = secret_dup(e->name, (const char *)r->out, n, &e->value_size))) {
				set_err(e, "credential %s: out of memory", e->name);
			} else {
				e->last_err[0] = '\0';
				e->expires_ms = now_of(c) + e->ttl_s * 1000;
				e->expire_timer = loop_add_timer(c->loop, e->ttl_s * 1000, on_expire, e);
			}
		}
	}
	hostrun_free(h); /* wipes the captured stdout */
	e->run = NULL;
	schedule_notify(c);
}

static char *env_entry(const char *name, const char *value)
{
	size_t nl = strlen(name), vl = strlen(value);
	char *s = mem_alloc(nl + vl + 2);
	if (s) {
		memcpy(s, name, nl);
		s[nl] = '=';
		memcpy(s + nl + 1, value, vl + 1);
	}
	return s;
}

static void tostr(char *b, size_t n, uint64_t v)
{
	snprintf(b, n, "%llu", (unsigned long long)v);
}

static int start_source(struct cred *c, struct entry *e)
{
	struct cred_config *cfg = NULL;
	const char *const *argv;
	char err[768], ttl[32], dir[PATH_MAX];
	char *env[8] = {0};
	unsigned timeout_s = CRED_TIMEOUT_S_DEFAULT;
	int r, dfd = -1;

	if (c->config_err) {
		snprintf(e->last_err, sizeof(e->last_err),
			 "credential %s: no configuration file (set XDG_CONFIG_HOME or HOME for airlock up)", e->name);
		return 0;
	}
	if (c->workspace[0]) {
		char real[PATH_MAX];
		size_t wl = strlen(c->workspace);
		if (realpath(c->config_path, real) && !strncmp(real, c->workspace, wl) &&
		    (real[wl] == '/' || real[wl] == '\0')) {
			set_err(e,
				"credential %s: %s is inside the workspace %s: refused (the repository must not choose "
				"credential sources; keep it in your own configuration directory)",
				e->name, c->config_path, c->workspace);
			return 0;
		}
	}
	if ((r = cred_config_load(c->config_path, &cfg, err, sizeof(err))) < 0) {
		if (r == -ENOMEM)
			return r;
		set_err(e, "credential %s: %s", e->name, err);
		return 0;
	}
	if (!(argv = cred_config_source(cfg, e->key, &timeout_s))) {
		set_err(e, "credential %s: %s has no source \"%s\" (add \"sources\": {\"%s\": {\"command\": [...]}})",
			e->name, c->config_path, e->key, e->key);
		cred_config_free(cfg);
		return 0;
	}
	snprintf(dir, sizeof(dir), "%s", c->config_path);
	if (strrchr(dir, '/'))
		*strrchr(dir, '/') = '\0';
	else
		snprintf(dir, sizeof(dir), ".");
	tostr(ttl, sizeof(ttl), e->ttl_s);
	r = -ENOMEM;
	if (!(env[0] = env_entry("PATH", "/usr/local/bin:/usr/bin:/bin")) || !(env[1] = env_entry("LANG", "C.UTF-8")) ||
	    !(env[2] = env_entry("HOME", c->home)) || !(env[3] = env_entry("AIRLOCK_CRED_NAME", e->name)) ||
	    !(env[4] = env_entry("AIRLOCK_CRED_SCOPE", e->scope)) || !(env[5] = env_entry("AIRLOCK_CRED_TTL", ttl)))
		goto out;
	if ((dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		set_err(e, "credential %s: %s: %s", e->name, dir, strerror(errno));
		r = 0;
		goto out;
	}
	struct hostrun_req q = {
	    .argv = argv,
	    .envp = (const char *const *)env,
	    .dir_fd = dfd,
	    .max_out = CRED_VALUE_MAX + 1,
	    .timeout_ms = (uint64_t)timeout_s * 1000,
	};
	c->resolutions++;
	if ((r = hostrun_start(c->loop, &q, source_done, e, &e->run)) < 0) {
		e->run = NULL;
		set_err(e, "credential %s: source '%s': cannot start %s: %s", e->name, e->key, argv[0], strerror(-r));
		r = r == -ENOMEM ? r : 0;
		goto out;
	}
	r = 0;
out:
	if (dfd >= 0)
		close(dfd);
	for (size_t i = 0; i < 8; i++)
		mem_free(env[i]);
	cred_config_free(cfg);
	return r;
}

int cred_refresh(struct cred *c, cred_done_fn *done, void *ud, struct cred_wait **out)
{
	struct cred_wait *w;
	int r;

	if (!(w = mem_calloc(1, sizeof(*w))))
		return -ENOMEM;
	w->c = c;
	w->done = done;
	w->ud = ud;
	for (size_t i = 0; i < c->ninj; i++) {
		struct entry *e = &c->inj[i];
		if (e->run || entry_fresh(c, e))
			continue;
		entry_wipe(e);
		if ((r = start_source(c, e)) < 0) {
			mem_free(w);
			return r;
		}
	}
	w->next = c->waits;
	c->waits = w;
	if (out)
		*out = w;
	schedule_notify(c);
	return 0;
}

void cred_wait_cancel(struct cred_wait *w)
{
	if (w)
		w->cancelled = true;
}
