/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Policy file loading and the per-path sync decision (see policy.h).
 */
#include "airlock/policy/policy.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/mem.h"
#include "airlock/policy/ignore.h"
#include "airlock/policy/trust.h"

struct policy {
	char *source;
	enum policy_trust trust;
	char *workspace;	    /* realpath of the workspace, for an untrusted policy's note */
	struct policy_list ignored; /* loosening keys left out of an untrusted policy */
	bool other_file;	    /* a --policy file in the workspace other than its airlock.json */
	struct policy_workspace ws;
	struct policy_execution ex;
	struct policy_credentials cr;
	struct policy_egress eg;
	struct policy_sandbox_limits sb; /* sandbox.limits, 0 = default */
	struct ignore_list include;	 /* compiled ws.include */
	struct ignore_list exclude;	 /* compiled ws.exclude */
	struct ignore_list wb_auto;	 /* compiled ws.writeback_auto */
	struct ignore_list owned;	 /* compiled ws.guest_owned */
};

/* ------------------------------------------------------------------ */
/* small helpers */

static void list_free(struct policy_list *l)
{
	for (size_t i = 0; i < l->n; i++)
		mem_free((void *)l->v[i]);
	mem_free((void *)l->v);
	l->v = NULL;
	l->n = 0;
}

void policy_free(struct policy *p)
{
	if (!p)
		return;
	mem_free(p->source);
	mem_free(p->workspace);
	list_free(&p->ignored);
	mem_free((void *)p->ws.template_name);
	list_free(&p->ws.include);
	list_free(&p->ws.exclude);
	list_free(&p->ws.allow_secrets);
	list_free(&p->ex.local);
	list_free(&p->ex.remote);
	list_free(&p->cr.forward_env);
	for (size_t i = 0; i < p->cr.n_inject; i++) {
		const struct policy_inject *in = &p->cr.inject[i];
		mem_free((void *)in->name);
		mem_free((void *)in->scope);
		mem_free((void *)in->value_from);
	}
	mem_free((void *)p->cr.inject);
	for (size_t i = 0; i < p->eg.n_allow; i++) {
		mem_free((void *)p->eg.allow[i].text);
		mem_free((void *)p->eg.allow[i].name);
	}
	mem_free((void *)p->eg.allow);
	ignore_list_clear(&p->include);
	ignore_list_clear(&p->exclude);
	ignore_list_clear(&p->wb_auto);
	ignore_list_clear(&p->owned);
	list_free(&p->ws.writeback_auto);
	list_free(&p->ws.guest_owned);
	mem_free(p);
}

static struct policy *policy_alloc(const char *source)
{
	struct policy *p = mem_calloc(1, sizeof(*p));

	if (!p)
		return NULL;
	p->source = mem_strdup(source);
	if (!p->source) {
		mem_free(p);
		return NULL;
	}
	p->ws.ttl_seconds = -1;
	p->ws.gitignore = true;
	p->ws.writeback_max_mib = POLICY_WRITEBACK_MAX_MIB;
	p->eg.deny_by_default = true;
	return p;
}

/* Build the compiled include/exclude lists from the validated strings. */
static int policy_compile(struct policy *p)
{
	int r;

	if ((r = ignore_list_from_strings(&p->include, "workspace.sync.include", p->ws.include.v, p->ws.include.n)) <
		0 ||
	    (r = ignore_list_from_strings(&p->exclude, "workspace.sync.exclude", p->ws.exclude.v, p->ws.exclude.n)) <
		0 ||
	    (r = ignore_list_from_strings(&p->wb_auto, "workspace.writeback.auto", p->ws.writeback_auto.v,
					  p->ws.writeback_auto.n)) < 0 ||
	    (r = ignore_list_from_strings(&p->owned, "workspace.guest_owned", p->ws.guest_owned.v,
					  p->ws.guest_owned.n)) < 0)
		return r;
	return 0;
}

/* ---- write-back keys (doc/SYNC.md "Guest changes and write-back") ---- */

bool policy_writeback_auto(const struct policy *p, const char *relpath, int is_dir)
{
	const struct ignore_pattern *m = ignore_list_match(&p->wb_auto, relpath, strlen(relpath), is_dir);
	return m && !(m->flags & IGNORE_NEGATIVE);
}

/* The guest_owned pattern that owns path or a directory above it; *above
 * says it was a directory above. */
static const struct ignore_pattern *owned_match(const struct policy *p, const char *relpath, int is_dir, bool *above)
{
	char buf[POLICY_PATH_MAX + 1];
	size_t len = strlen(relpath);

	*above = false;
	if (!p->owned.n || len > POLICY_PATH_MAX)
		return NULL;
	memcpy(buf, relpath, len + 1);
	/* the path itself, then each directory above it */
	for (;;) {
		const struct ignore_pattern *m = ignore_list_match(&p->owned, buf, len, is_dir);
		if (m && !(m->flags & IGNORE_NEGATIVE))
			return m;
		char *slash = strrchr(buf, '/');
		if (!slash)
			return NULL;
		*slash = '\0';
		len = (size_t)(slash - buf);
		is_dir = 1;
		*above = true;
	}
}

bool policy_guest_owned(const struct policy *p, const char *relpath, int is_dir)
{
	bool above;
	return owned_match(p, relpath, is_dir, &above) != NULL;
}

/* workspace.guest_owned decides like an ignored path: never synced,
 * compared or deleted; the guest's. */
static bool owned_verdict(const struct policy *p, const char *relpath, int is_dir, struct policy_verdict *v)
{
	char pat[300];
	bool above;
	const struct ignore_pattern *m = owned_match(p, relpath, is_dir, &above);

	if (!m)
		return false;
	v->reason = POLICY_IGNORED;
	v->prune = is_dir || above;
	v->inherited = above;
	v->ignore = m;
	v->ignore_src = "workspace.guest_owned";
	ignore_pattern_format(m, pat, sizeof(pat));
	snprintf(v->rule, sizeof(v->rule), "guest_owned: %.300s", pat);
	return true;
}

int policy_default(struct policy **out)
{
	struct policy *p = policy_alloc("(built-in default)");
	int r;

	*out = NULL;
	if (!p)
		return -ENOMEM;
	if ((r = policy_compile(p)) < 0) {
		policy_free(p);
		return r;
	}
	*out = p;
	return 0;
}

const char *policy_source(const struct policy *p)
{
	return p->source;
}

const struct policy_workspace *policy_workspace(const struct policy *p)
{
	return &p->ws;
}

const struct policy_execution *policy_execution(const struct policy *p)
{
	return &p->ex;
}

const struct policy_credentials *policy_credentials(const struct policy *p)
{
	return &p->cr;
}

const struct policy_egress *policy_egress(const struct policy *p)
{
	return &p->eg;
}

const struct policy_sandbox_limits *policy_sandbox_limits(const struct policy *p)
{
	return &p->sb;
}

/* ------------------------------------------------------------------ */
/* loading: errors name the file, the key path and the reason */

struct loader {
	const char *file;
	char *err;
	size_t errlen;
	char kp[256]; /* key path, e.g. "workspace.sync.exclude[2]" */
	size_t kplen;
	struct policy *p;
};

/* Copy s into the key path, replacing bytes that would garble a terminal. */
static void kp_append(struct loader *L, const char *s, size_t n)
{
	for (size_t i = 0; i < n && L->kplen + 1 < sizeof(L->kp); i++) {
		unsigned char c = (unsigned char)s[i];
		L->kp[L->kplen++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
	}
	L->kp[L->kplen] = '\0';
}

static size_t kp_key(struct loader *L, const char *key)
{
	size_t save = L->kplen;

	if (L->kplen)
		kp_append(L, ".", 1);
	kp_append(L, key, strlen(key));
	return save;
}

static size_t kp_index(struct loader *L, size_t i)
{
	size_t save = L->kplen;
	char b[32];
	int n = snprintf(b, sizeof(b), "[%zu]", i);

	kp_append(L, b, (size_t)n);
	return save;
}

static void kp_restore(struct loader *L, size_t save)
{
	L->kplen = save;
	L->kp[save] = '\0';
}

__attribute__((format(printf, 3, 4))) static int fail(struct loader *L, int r, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (!L->errlen)
		return r;
	/* "FILE: KEY.PATH: " then the message, through the one helper */
	errmsg_set(L->err, L->errlen, "%s: %s: ", L->file, L->kplen ? L->kp : "top level");
	n = (int)strlen(L->err);
	va_start(ap, fmt);
	errmsg_vset(L->err + n, L->errlen - (size_t)n, NULL, fmt, ap);
	va_end(ap);
	return r;
}

static int oom(struct loader *L)
{
	errmsg_set(L->err, L->errlen, "%s: out of memory", L->file);
	return -ENOMEM;
}

static const char *type_name(const json_t *v)
{
	switch (json_typeof(v)) {
	case JSON_OBJECT:
		return "an object";
	case JSON_ARRAY:
		return "an array";
	case JSON_STRING:
		return "a string";
	case JSON_INTEGER:
		return "an integer";
	case JSON_REAL:
		return "a real number";
	case JSON_TRUE:
		return "true";
	case JSON_FALSE:
		return "false";
	case JSON_NULL:
		return "null";
	}
	return "something else";
}

/* Quote a user string for a message: printable ASCII kept, the rest as \xNN,
 * cut at 64 characters. */
static const char *quote(const char *s, char *buf, size_t len)
{
	size_t o = 0;

	buf[o++] = '"';
	for (; *s && o + 8 < len; s++) {
		unsigned char c = (unsigned char)*s;
		if (o > 64) {
			memcpy(buf + o, "...", 3);
			o += 3;
			break;
		}
		if (c < 0x20 || c >= 0x7f || c == '"' || c == '\\')
			o += (size_t)snprintf(buf + o, len - o, "\\x%02x", c);
		else
			buf[o++] = (char)c;
	}
	buf[o++] = '"';
	buf[o] = '\0';
	return buf;
}

typedef int (*parse_fn)(struct loader *L, json_t *v);

struct field {
	const char *key;
	parse_fn parse;
};

static int parse_fields(struct loader *L, json_t *obj, const struct field *f, size_t n)
{
	const char *key;
	json_t *val;

	if (!json_is_object(obj))
		return fail(L, -EINVAL, "expected an object, got %s", type_name(obj));
	json_object_foreach(obj, key, val)
	{
		size_t i, save = kp_key(L, key);
		int r;

		for (i = 0; i < n && strcmp(f[i].key, key) != 0; i++)
			;
		if (i == n) {
			char known[256];
			size_t o = 0;
			for (size_t k = 0; k < n; k++)
				o += (size_t)snprintf(known + o, sizeof(known) - o, "%s%s", k ? ", " : "", f[k].key);
			return fail(L, -EINVAL, "unknown key (expected one of: %s)", known);
		}
		if ((r = f[i].parse(L, val)) < 0)
			return r;
		kp_restore(L, save);
	}
	return 0;
}

static int check_text(struct loader *L, const char *s, bool allow_empty)
{
	if (!allow_empty && !*s)
		return fail(L, -EINVAL, "must not be empty");
	for (const unsigned char *c = (const unsigned char *)s; *c; c++)
		if (*c < 0x20 || *c == 0x7f)
			return fail(L, -EINVAL, "contains a control character");
	return 0;
}

static int get_string(struct loader *L, json_t *v, const char **out, bool allow_empty)
{
	int r;

	if (!json_is_string(v))
		return fail(L, -EINVAL, "expected a string, got %s", type_name(v));
	if ((r = check_text(L, json_string_value(v), allow_empty)) < 0)
		return r;
	*out = mem_strdup(json_string_value(v));
	return *out ? 0 : oom(L);
}

static int get_int(struct loader *L, json_t *v, json_int_t min, int64_t *out)
{
	if (!json_is_integer(v))
		return fail(L, -EINVAL, "expected an integer number of seconds, got %s", type_name(v));
	json_int_t x = json_integer_value(v);
	if (x < min)
		return fail(L, -EINVAL, "must be %s, got %lld", min ? "greater than 0" : "0 or more", (long long)x);
	if (x > INT32_MAX)
		return fail(L, -EINVAL, "must be at most %d, got %lld", INT32_MAX, (long long)x);
	*out = x;
	return 0;
}

typedef int (*check_fn)(struct loader *L, const char *s);

/* An array of strings, each validated by check (with the key path at [i]). */
static int get_strings(struct loader *L, json_t *v, struct policy_list *out, check_fn check)
{
	size_t n, i;
	json_t *e;
	char **arr;

	if (!json_is_array(v))
		return fail(L, -EINVAL, "expected an array of strings, got %s", type_name(v));
	n = json_array_size(v);
	list_free(out); /* cannot hold anything: keys are unique */
	arr = mem_calloc(n ? n : 1, sizeof(*arr));
	if (!arr)
		return oom(L);
	out->v = (const char *const *)arr;
	json_array_foreach(v, i, e)
	{
		size_t save = kp_index(L, i);
		int r;

		if (!json_is_string(e))
			return fail(L, -EINVAL, "expected a string, got %s", type_name(e));
		if ((r = check_text(L, json_string_value(e), false)) < 0 ||
		    (check && (r = check(L, json_string_value(e))) < 0))
			return r;
		arr[i] = mem_strdup(json_string_value(e));
		if (!arr[i])
			return oom(L);
		out->n = i + 1;
		kp_restore(L, save);
	}
	return 0;
}

static int check_glob(struct loader *L, const char *s)
{
	const char *why;
	char q[96];

	if (ignore_glob_check(s, &why) < 0)
		return fail(L, -EINVAL, "bad glob %s: %s", quote(s, q, sizeof(q)), why);
	return 0;
}

/* Same rules as policy_check's relpath. */
static int relpath_ok(const char *s, size_t len)
{
	if (len > POLICY_PATH_MAX)
		return -ENAMETOOLONG;
	if (len == 0)
		return 0;
	if (s[0] == '/' || s[len - 1] == '/')
		return -EINVAL;
	for (size_t c = 0; c <= len;) {
		const char *e = memchr(s + c, '/', len - c);
		size_t ce = e ? (size_t)(e - s) : len;
		size_t n = ce - c;
		if (n == 0 || (n == 1 && s[c] == '.') || (n == 2 && s[c] == '.' && s[c + 1] == '.'))
			return -EINVAL;
		c = ce + 1;
	}
	return 0;
}

static int check_allow_secret(struct loader *L, const char *s)
{
	char q[96];

	if (relpath_ok(s, strlen(s)) < 0)
		return fail(L, -EINVAL,
			    "%s is not a workspace-relative path (no leading or trailing '/', no '.' or '..' "
			    "components, at most %d bytes)",
			    quote(s, q, sizeof(q)), POLICY_PATH_MAX);
	if (strpbrk(s, "*?[\\"))
		return fail(L, -EINVAL, "%s: allow_secrets takes exact paths, not globs", quote(s, q, sizeof(q)));
	return 0;
}

static int check_env_name(struct loader *L, const char *s)
{
	char q[96];
	bool ok = (*s >= 'A' && *s <= 'Z') || (*s >= 'a' && *s <= 'z') || *s == '_';

	for (const char *c = s + 1; ok && *c; c++)
		ok = (*c >= 'A' && *c <= 'Z') || (*c >= 'a' && *c <= 'z') || (*c >= '0' && *c <= '9') || *c == '_';
	if (!ok)
		return fail(L, -EINVAL, "%s is not an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
			    quote(s, q, sizeof(q)));
	return 0;
}

static int check_command(struct loader *L, const char *s)
{
	char q[96];

	if (*s == ' ' || *s == '\t' || s[strlen(s) - 1] == ' ' || s[strlen(s) - 1] == '\t')
		return fail(L, -EINVAL, "%s has leading or trailing white space", quote(s, q, sizeof(q)));
	return 0;
}

/* "host", "*.host", optional ":port"; labels of letters, digits, '-', '_'. */
static int parse_host(const char *s, struct policy_host *h, const char **why)
{
	const char *colon = strrchr(s, ':');
	size_t hl = colon ? (size_t)(colon - s) : strlen(s);
	const char *name = s;

	h->subdomains = false;
	h->port = 0;
	if (strstr(s, "://") || strchr(s, '/')) {
		*why = "give the host name (\"example.com\", \"*.example.com\" or \"example.com:8443\"), not a URL "
		       "or a path";
		return -EINVAL;
	}
	if (colon) {
		char *end;
		if (!colon[1] || strspn(colon + 1, "0123456789") != strlen(colon + 1)) {
			*why = "the port must be a number";
			return -EINVAL;
		}
		unsigned long port = strtoul(colon + 1, &end, 10);
		if (port == 0 || port > 65535) {
			*why = "the port must be 1-65535";
			return -EINVAL;
		}
		h->port = (uint16_t)port;
	}
	if (hl >= 2 && name[0] == '*' && name[1] == '.') {
		h->subdomains = true;
		name += 2;
		hl -= 2;
	}
	if (hl == 0 || hl > 253) {
		*why = "the host name must be 1-253 characters";
		return -EINVAL;
	}
	for (size_t i = 0, lab = 0; i <= hl; i++) {
		char c = i < hl ? name[i] : '.';
		if (c == '.') {
			if (lab == 0 || lab > 63 || name[i - 1] == '-' || name[i - lab] == '-') {
				*why = "each label must be 1-63 characters and not start or end with '-'";
				return -EINVAL;
			}
			lab = 0;
		} else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' ||
			   c == '_') {
			lab++;
		} else {
			*why = c == '*' ? "'*' is only allowed as a whole first label (\"*.example.org\")"
					: "host names contain only letters, digits, '-', '_' and '.'";
			return -EINVAL;
		}
	}
	char *low = mem_strndup(name, hl);
	if (!low)
		return -ENOMEM;
	for (char *c = low; *c; c++)
		if (*c >= 'A' && *c <= 'Z')
			*c = (char)(*c - 'A' + 'a');
	h->name = low;
	return 0;
}

/* workspace.sync */
static int p_sync_include(struct loader *L, json_t *v)
{
	L->p->ws.has_include = true;
	return get_strings(L, v, &L->p->ws.include, check_glob);
}

static int p_sync_exclude(struct loader *L, json_t *v)
{
	return get_strings(L, v, &L->p->ws.exclude, check_glob);
}

static int p_sync_allow(struct loader *L, json_t *v)
{
	return get_strings(L, v, &L->p->ws.allow_secrets, check_allow_secret);
}

static int p_sync_gitignore(struct loader *L, json_t *v)
{
	if (!json_is_boolean(v))
		return fail(L, -EINVAL, "expected true or false, got %s", type_name(v));
	L->p->ws.gitignore = json_is_true(v);
	return 0;
}

static const struct field sync_fields[] = {
    {"include", p_sync_include},
    {"exclude", p_sync_exclude},
    {"allow_secrets", p_sync_allow},
    {"gitignore", p_sync_gitignore},
};

/* workspace */
static int p_wb_auto(struct loader *L, json_t *v)
{
	return get_strings(L, v, &L->p->ws.writeback_auto, check_glob);
}

static int p_ws_template(struct loader *L, json_t *v)
{
	return get_string(L, v, &L->p->ws.template_name, false);
}

static int p_ws_ttl(struct loader *L, json_t *v)
{
	return get_int(L, v, 0, &L->p->ws.ttl_seconds);
}

static int p_ws_sync(struct loader *L, json_t *v)
{
	return parse_fields(L, v, sync_fields, sizeof(sync_fields) / sizeof(sync_fields[0]));
}

/* "review", or {"auto": [globs]} */
static const struct field writeback_fields[] = {
    {"auto", p_wb_auto},
};

static int p_ws_writeback(struct loader *L, json_t *v)
{
	if (json_is_string(v)) {
		if (strcmp(json_string_value(v), "review"))
			return fail(L, -EINVAL, "expected \"review\" or {\"auto\": [globs]}");
		list_free(&L->p->ws.writeback_auto);
		return 0;
	}
	if (!json_is_object(v))
		return fail(L, -EINVAL, "expected \"review\" or {\"auto\": [globs]}, got %s", type_name(v));
	return parse_fields(L, v, writeback_fields, sizeof(writeback_fields) / sizeof(writeback_fields[0]));
}

static int p_ws_writeback_max(struct loader *L, json_t *v)
{
	return get_int(L, v, 1, &L->p->ws.writeback_max_mib);
}

static int p_ws_guest_owned(struct loader *L, json_t *v)
{
	return get_strings(L, v, &L->p->ws.guest_owned, check_glob);
}

static const struct field workspace_fields[] = {
    {"template", p_ws_template},
    {"ttl_seconds", p_ws_ttl},
    {"sync", p_ws_sync},
    {"writeback", p_ws_writeback},
    {"writeback_max_mib", p_ws_writeback_max},
    {"guest_owned", p_ws_guest_owned},
};

/* execution */
static int p_ex_local(struct loader *L, json_t *v)
{
	return get_strings(L, v, &L->p->ex.local, check_command);
}

static int p_ex_remote(struct loader *L, json_t *v)
{
	return get_strings(L, v, &L->p->ex.remote, check_command);
}

static int p_ex_timeout(struct loader *L, json_t *v)
{
	return get_int(L, v, 1, &L->p->ex.timeout_seconds);
}

static int p_ex_barrier(struct loader *L, json_t *v)
{
	const char *w = json_is_string(v) ? json_string_value(v) : NULL;

	if (w && !strcmp(w, "run"))
		L->p->ex.barrier = POLICY_BARRIER_RUN;
	else if (w && !strcmp(w, "fail"))
		L->p->ex.barrier = POLICY_BARRIER_FAIL;
	else
		return fail(L, -EINVAL, "expected \"run\" or \"fail\", got %s", w ? w : type_name(v));
	return 0;
}

static const struct field execution_fields[] = {
    {"local", p_ex_local},
    {"remote", p_ex_remote},
    {"timeout_seconds", p_ex_timeout},
    {"barrier", p_ex_barrier},
};

/* credentials.inject[i]: parsed into the slot L->p->cr.inject[n_inject - 1] */
static struct policy_inject *cur_inject(struct loader *L)
{
	return (struct policy_inject *)&L->p->cr.inject[L->p->cr.n_inject - 1];
}

static int p_inj_name(struct loader *L, json_t *v)
{
	int r;

	if (!json_is_string(v))
		return fail(L, -EINVAL, "expected a string, got %s", type_name(v));
	if ((r = check_env_name(L, json_string_value(v))) < 0)
		return r;
	return get_string(L, v, &cur_inject(L)->name, false);
}

static int p_inj_scope(struct loader *L, json_t *v)
{
	return get_string(L, v, &cur_inject(L)->scope, false);
}

static int p_inj_ttl(struct loader *L, json_t *v)
{
	return get_int(L, v, 1, &cur_inject(L)->ttl_seconds);
}

static int p_inj_value_from(struct loader *L, json_t *v)
{
	return get_string(L, v, &cur_inject(L)->value_from, false);
}

static const struct field inject_fields[] = {
    {"name", p_inj_name},
    {"scope", p_inj_scope},
    {"ttl_seconds", p_inj_ttl},
    {"value_from", p_inj_value_from},
};

static int p_cr_forward_env(struct loader *L, json_t *v)
{
	return get_strings(L, v, &L->p->cr.forward_env, check_env_name);
}

static int p_cr_inject(struct loader *L, json_t *v)
{
	size_t i, n;
	json_t *e;
	struct policy_inject *arr;

	if (!json_is_array(v))
		return fail(L, -EINVAL, "expected an array of objects, got %s", type_name(v));
	n = json_array_size(v);
	arr = mem_calloc(n ? n : 1, sizeof(*arr));
	if (!arr)
		return oom(L);
	L->p->cr.inject = arr;
	json_array_foreach(v, i, e)
	{
		size_t save = kp_index(L, i);
		int r;

		L->p->cr.n_inject = i + 1;
		if ((r = parse_fields(L, e, inject_fields, sizeof(inject_fields) / sizeof(inject_fields[0]))) < 0)
			return r;
		if (!arr[i].name)
			return fail(L, -EINVAL, "missing required key \"name\" (the environment variable to set)");
		for (size_t k = 0; k < i; k++)
			if (strcmp(arr[k].name, arr[i].name) == 0)
				return fail(L, -EINVAL, "\"%s\" is already injected by credentials.inject[%zu]",
					    arr[i].name, k);
		kp_restore(L, save);
	}
	return 0;
}

static const struct field credentials_fields[] = {
    {"forward_env", p_cr_forward_env},
    {"inject", p_cr_inject},
};

/* egress */
static int p_eg_default(struct loader *L, json_t *v)
{
	const char *s;

	if (!json_is_string(v))
		return fail(L, -EINVAL, "expected the string \"deny\", got %s", type_name(v));
	s = json_string_value(v);
	if (strcmp(s, "allow") == 0)
		return fail(L, -EINVAL,
			    "\"allow\" is not supported: egress is deny-by-default so that a command cannot reach "
			    "hosts nobody reviewed; list the hosts the sandbox needs in egress.allow");
	if (strcmp(s, "deny") != 0) {
		char q[96];
		return fail(L, -EINVAL, "must be \"deny\", got %s", quote(s, q, sizeof(q)));
	}
	return 0;
}

static int p_eg_allow(struct loader *L, json_t *v)
{
	size_t i, n;
	json_t *e;
	struct policy_host *arr;

	if (!json_is_array(v))
		return fail(L, -EINVAL, "expected an array of host names, got %s", type_name(v));
	n = json_array_size(v);
	arr = mem_calloc(n ? n : 1, sizeof(*arr));
	if (!arr)
		return oom(L);
	L->p->eg.allow = arr;
	json_array_foreach(v, i, e)
	{
		size_t save = kp_index(L, i);
		const char *why = NULL;
		char q[96];
		int r;

		if (!json_is_string(e))
			return fail(L, -EINVAL, "expected a string, got %s", type_name(e));
		if ((r = check_text(L, json_string_value(e), false)) < 0)
			return r;
		r = parse_host(json_string_value(e), &arr[i], &why);
		if (r == -ENOMEM)
			return oom(L);
		if (r < 0)
			return fail(L, r, "bad host pattern %s: %s", quote(json_string_value(e), q, sizeof(q)), why);
		L->p->eg.n_allow = i + 1;
		arr[i].text = mem_strdup(json_string_value(e));
		if (!arr[i].text)
			return oom(L);
		kp_restore(L, save);
	}
	return 0;
}

static const struct field egress_fields[] = {
    {"default", p_eg_default},
    {"allow", p_eg_allow},
};

#define FIELDS(f) (f), (sizeof(f) / sizeof((f)[0]))

static int p_workspace(struct loader *L, json_t *v)
{
	return parse_fields(L, v, FIELDS(workspace_fields));
}

static int p_execution(struct loader *L, json_t *v)
{
	return parse_fields(L, v, FIELDS(execution_fields));
}

static int p_credentials(struct loader *L, json_t *v)
{
	return parse_fields(L, v, FIELDS(credentials_fields));
}

static int p_egress(struct loader *L, json_t *v)
{
	return parse_fields(L, v, FIELDS(egress_fields));
}

/* A sandbox.limits value in units: a non-negative integer, or (size) a
 * string of digits with an optional binary suffix ("512M", "4G"). 0,
 * -EINVAL when it is neither, -ERANGE when it overflows. */
static int limit_value(const json_t *v, bool size, uint64_t *out)
{
	const char *t = json_string_value(v), *k;
	uint64_t x, mul = 1;
	char *end;

	if (json_is_integer(v) && json_integer_value(v) >= 0) {
		*out = (uint64_t)json_integer_value(v);
		return 0;
	}
	if (!size || !t)
		return -EINVAL;
	errno = 0;
	x = strtoull(t, &end, 10);
	if (end != t && end[0] && !end[1] && (k = strchr("KMGT", end[0])))
		mul = 1ull << (10 * (k - "KMGT" + 1));
	else if (end == t || *end || errno)
		return -EINVAL;
	if (x > UINT64_MAX / mul)
		return -ERANGE;
	*out = x * mul;
	return 0;
}

/* sandbox.limits: limit_value, at least min and at most max. */
static int get_limit(struct loader *L, json_t *v, bool size, uint64_t min, uint64_t max, uint64_t *out)
{
	uint64_t x;
	char q[96];
	int r = limit_value(v, size, &x);

	if (r == -ERANGE)
		return fail(L, -EINVAL, "size %s is too large", quote(json_string_value(v), q, sizeof(q)));
	if (r < 0 && json_is_string(v) && size)
		return fail(L, -EINVAL, "expected a size like \"512M\" or \"4G\" (K, M, G, T: powers of 1024), got %s",
			    quote(json_string_value(v), q, sizeof(q)));
	if (r < 0)
		return fail(L, -EINVAL,
			    size ? "expected a size (bytes, or a string like \"4G\"), got %s"
				 : "expected a positive integer, got %s",
			    type_name(v));
	if (x < min || x > max)
		return fail(L, -EINVAL, "must be between %llu and %llu%s", (unsigned long long)min,
			    (unsigned long long)max, size ? " bytes" : "");
	*out = x;
	return 0;
}

static int p_lim_pids(struct loader *L, json_t *v)
{
	return get_limit(L, v, false, POLICY_PIDS_MIN, POLICY_PIDS_MAX, &L->p->sb.pids);
}

static int p_lim_memory(struct loader *L, json_t *v)
{
	return get_limit(L, v, true, POLICY_MEMORY_MIN, POLICY_SIZE_MAX, &L->p->sb.memory);
}

static int p_lim_tmp(struct loader *L, json_t *v)
{
	return get_limit(L, v, true, POLICY_TMP_MIN, POLICY_SIZE_MAX, &L->p->sb.tmp);
}

static int p_lim_workspace(struct loader *L, json_t *v)
{
	return get_limit(L, v, true, POLICY_WORKSPACE_MIN, POLICY_SIZE_MAX, &L->p->sb.workspace);
}

static const struct field limits_fields[] = {
    {"pids", p_lim_pids},
    {"memory", p_lim_memory},
    {"tmp", p_lim_tmp},
    {"workspace", p_lim_workspace},
};

static int p_sb_limits(struct loader *L, json_t *v)
{
	return parse_fields(L, v, FIELDS(limits_fields));
}

static const struct field sandbox_fields[] = {
    {"limits", p_sb_limits},
};

static int p_sandbox(struct loader *L, json_t *v)
{
	return parse_fields(L, v, FIELDS(sandbox_fields));
}

/* "$schema": where editors find the JSON Schema (doc/schema/airlock.schema.json);
 * any string, not read. */
static int p_schema(struct loader *L, json_t *v)
{
	if (!json_is_string(v))
		return fail(L, -EINVAL, "expected a string (the JSON Schema's URL or path), got %s", type_name(v));
	return 0;
}

/* clang-format off */
static const struct field top_fields[] = {
    {"workspace", p_workspace},
    {"execution", p_execution},
    {"credentials", p_credentials},
    {"egress", p_egress},
    {"sandbox", p_sandbox},
    {"$schema", p_schema},
};
/* clang-format on */

/* ------------------------------------------------------------------ */
/* trust: what an unapproved repository policy may not do (doc/UP.md) */

static bool nonempty(const json_t *v)
{
	return !((json_is_array(v) && json_array_size(v) == 0) || (json_is_object(v) && json_object_size(v) == 0));
}

/* workspace.writeback: "review" is the default; auto globs loosen it */
static bool writeback_loosens(const json_t *v)
{
	const json_t *a = json_is_object(v) ? json_object_get(v, "auto") : NULL;

	return json_is_array(a) && json_array_size(a) > 0;
}

static bool over_default_writeback_cap(const json_t *v)
{
	return json_integer_value(v) > POLICY_WRITEBACK_MAX_MIB;
}

static bool is_false(const json_t *v)
{
	return json_is_false(v);
}

static bool over_default_timeout(const json_t *v)
{
	return json_integer_value(v) > POLICY_TIMEOUT_DEFAULT_S;
}

uint64_t policy_memory_default(void)
{
	long pages = sysconf(_SC_PHYS_PAGES), size = sysconf(_SC_PAGESIZE);

	return pages > 0 && size > 0 ? (uint64_t)pages * (uint64_t)size / 2 : 2ull << 30;
}

/* A validated sandbox.limits value in units (limit_value). */
static uint64_t limit_units(const json_t *v)
{
	uint64_t x = 0;

	(void)limit_value(v, true, &x);
	return x;
}

static bool over_default_pids(const json_t *v)
{
	return limit_units(v) > POLICY_PIDS_DEFAULT;
}

static bool over_default_memory(const json_t *v)
{
	return limit_units(v) > policy_memory_default();
}

static bool over_default_tmp(const json_t *v)
{
	return limit_units(v) > POLICY_TMP_DEFAULT;
}

static bool over_default_workspace(const json_t *v)
{
	return limit_units(v) > POLICY_WORKSPACE_DEFAULT;
}

/*
 * Every key whose value can loosen the built-in default, with the test of
 * whether this value does. Everything else in the file can only tighten
 * it (more excludes, an include list, a shorter timeout, an idle ttl) and
 * applies without approval. A key listed here that the loader does not
 * know yet is still stripped from an unapproved file; a trusted one must
 * wait for its parser.
 */
static const struct loosening {
	const char *key; /* dotted path */
	bool (*loosens)(const json_t *v);
} loosening_keys[] = {
    {"execution.local", nonempty},				 /* commands on the host */
    {"execution.timeout_seconds", over_default_timeout},	 /* longer than the relay's default */
    {"credentials.forward_env", nonempty},			 /* the daemon's environment in the guest */
    {"credentials.inject", nonempty},				 /* the user's credential sources in the guest */
    {"workspace.sync.allow_secrets", nonempty},			 /* secrets in the guest */
    {"workspace.sync.gitignore", is_false},			 /* ignored files in the guest */
    {"workspace.writeback", writeback_loosens},			 /* guest changes landing on the host by themselves */
    {"workspace.writeback_max_mib", over_default_writeback_cap}, /* larger write-backs */
    {"egress.allow", nonempty},					 /* hosts the sandbox may reach */
    {"sandbox.limits.pids", over_default_pids},			 /* more processes than the default */
    {"sandbox.limits.memory", over_default_memory},		 /* more memory */
    {"sandbox.limits.tmp", over_default_tmp},			 /* a larger /tmp */
    {"sandbox.limits.workspace", over_default_workspace},	 /* larger files */
};

/* The object that holds the last component of key in root, and that
 * component; NULL when a level is missing. */
static json_t *key_parent(json_t *root, const char *key, char *last, size_t lastlen)
{
	json_t *o = root;
	const char *k = key;

	for (const char *dot; (dot = strchr(k, '.')); k = dot + 1) {
		char part[64];
		snprintf(part, sizeof(part), "%.*s", (int)(dot - k), k);
		o = json_object_get(o, part);
		if (!json_is_object(o)) /* a macro: evaluates its argument twice */
			return NULL;
	}
	snprintf(last, lastlen, "%s", k);
	return o;
}

/* Remove the loosening keys of a validated document; their names into
 * *ignored. 0 or -ENOMEM. */
static int strip_loosening(json_t *root, struct policy_list *ignored)
{
	const size_t n = sizeof(loosening_keys) / sizeof(loosening_keys[0]);
	const char **v = mem_calloc(n, sizeof(*v));

	if (!v)
		return -ENOMEM;
	ignored->v = v;
	for (size_t i = 0; i < n; i++) {
		char last[64];
		json_t *o = key_parent(root, loosening_keys[i].key, last, sizeof(last)), *val;
		if (!o || !(val = json_object_get(o, last)) || !loosening_keys[i].loosens(val))
			continue;
		if (!(v[ignored->n] = mem_strdup(loosening_keys[i].key)))
			return -ENOMEM;
		ignored->n++;
		json_object_del(o, last);
	}
	return 0;
}

/*
 * The key path at byte offset `off` of a JSON text, for parser errors that
 * only come with a position (duplicate keys, syntax errors). A light scan:
 * strings, nesting, keys and array indexes; anything deeper than the frame
 * stack is left out.
 */
static void json_path_at(const char *s, size_t len, size_t off, char *out, size_t outlen)
{
	struct frame {
		char type; /* '{' or '[' */
		bool want_key;
		size_t index, key, keylen;
	} st[32];
	size_t depth = 0, o = 0, str_start = 0;
	bool in_str = false, str_is_key = false;

	if (off > len)
		off = len;
	for (size_t i = 0; i < off; i++) {
		char c = s[i];
		struct frame *top = depth && depth <= 32 ? &st[depth - 1] : NULL;

		if (in_str) {
			if (c == '\\')
				i++;
			else if (c == '"') {
				in_str = false;
				if (str_is_key && top) {
					top->key = str_start;
					top->keylen = i - str_start;
				}
			}
			continue;
		}
		switch (c) {
		case '"':
			in_str = true;
			str_start = i + 1;
			str_is_key = top && top->type == '{' && top->want_key;
			break;
		case '{':
		case '[':
			if (++depth <= 32)
				st[depth - 1] = (struct frame){c, c == '{', 0, 0, 0};
			break;
		case '}':
		case ']':
			if (depth)
				depth--;
			break;
		case ':':
			if (top && top->type == '{')
				top->want_key = false;
			break;
		case ',':
			if (top && top->type == '{') {
				top->want_key = true;
				top->keylen = 0;
			} else if (top) {
				top->index++;
			}
			break;
		default:
			break;
		}
	}
	if (in_str && str_is_key && depth && depth <= 32) {
		st[depth - 1].key = str_start;
		st[depth - 1].keylen = off - str_start;
	}
	out[0] = '\0';
	for (size_t d = 0; d < depth && d < 32 && o + 1 < outlen; d++) {
		if (st[d].type == '[') {
			o += (size_t)snprintf(out + o, outlen - o, "[%zu]", st[d].index);
		} else if (st[d].keylen) {
			if (o && o + 1 < outlen)
				out[o++] = '.';
			for (size_t k = 0; k < st[d].keylen && o + 1 < outlen; k++) {
				unsigned char c = (unsigned char)s[st[d].key + k];
				out[o++] = (c < 0x20 || c == 0x7f) ? '?' : (char)c;
			}
			out[o] = '\0';
		}
		if (o >= outlen)
			o = outlen - 1;
	}
}

static int read_policy_file(struct loader *L, const char *path, char **buf, size_t *len)
{
	struct stat st;
	int fd, r = 0;
	size_t got = 0;
	char *b = NULL;

	*buf = NULL;
	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		return fail(L, r, "cannot open: %s", strerror(-r));
	}
	if (fstat(fd, &st) < 0) {
		r = -errno;
		fail(L, r, "cannot stat: %s", strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = fail(L, -EINVAL, "not a regular file");
		goto out;
	}
	if (st.st_size > (off_t)POLICY_FILE_MAX) {
		r = fail(L, -EFBIG, "larger than %u bytes; a policy file is a short reviewable document",
			 POLICY_FILE_MAX);
		goto out;
	}
	b = mem_alloc((size_t)st.st_size + 1);
	if (!b) {
		r = oom(L);
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, b + got, (size_t)st.st_size + 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			r = -errno;
			fail(L, r, "cannot read: %s", strerror(-r));
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
		if (got > (size_t)st.st_size) {
			r = fail(L, -EAGAIN, "changed while being read; try again");
			goto out;
		}
	}
	b[got] = '\0';
	*buf = b;
	*len = got;
	b = NULL;
out:
	mem_free(b);
	close(fd);
	return r;
}

/*
 * jansson (2.14) cannot be trusted with a failed allocation in the middle
 * of a parse: its lexer ignores a failed buffer append (lex_save), drops
 * the byte, and then scans the token past the end of its buffer (a heap
 * overflow seen under valgrind); other failures come back as syntax
 * errors. So while we parse, jansson's allocator is a wrapper: when
 * mem_alloc fails (a real or a test-injected failure) it notes the failure
 * in a thread-local flag and hands jansson a block from plain malloc
 * instead, so the parse finishes safely and policy_load then reports
 * -ENOMEM. Only if malloc fails too does jansson see NULL. The swap is
 * process-global, but the wrapper behaves like mem_alloc for any other
 * thread that parses meanwhile, and mem_free frees both kinds of block.
 */
static _Thread_local bool json_alloc_failed;

static void *json_alloc_noted(size_t n)
{
	void *p = mem_alloc(n);

	if (!p) {
		json_alloc_failed = true;
		p = malloc(n ? n : 1);
	}
	return p;
}

static json_t *parse_json(const char *text, size_t len, json_error_t *jerr, bool *oom)
{
	json_malloc_t prev_malloc;
	json_free_t prev_free;
	json_t *root;

	json_get_alloc_funcs(&prev_malloc, &prev_free);
	json_set_alloc_funcs(json_alloc_noted, mem_free);
	json_alloc_failed = false;
	memset(jerr, 0, sizeof(*jerr));
	root = json_loadb(text, len, JSON_REJECT_DUPLICATES, jerr);
	*oom = json_alloc_failed || (!root && json_error_code(jerr) == json_error_out_of_memory);
	json_set_alloc_funcs(prev_malloc, prev_free);
	if (root && *oom) {
		/* parsed, but possibly from a buffer missing a byte */
		json_decref(root);
		root = NULL;
	}
	return root;
}

/* Parse text[0..len) (the bytes of the file path) into *out. With strip,
 * the loosening keys are left out after the whole file was validated, and
 * their names kept in the policy (policy_ignored). */
static int load_text(const char *path, const char *text, size_t len, bool strip, struct policy **out, char *err,
		     size_t errlen)
{
	struct loader L = {.file = path, .err = err, .errlen = errlen};
	json_error_t jerr;
	json_t *root = NULL;
	int r;

	*out = NULL;
	size_t ws = 0;
	while (ws < len && (text[ws] == ' ' || text[ws] == '\t' || text[ws] == '\r' || text[ws] == '\n'))
		ws++;
	if (ws == len) {
		r = fail(&L, -EINVAL, "file is empty (an empty policy is {})");
		goto out;
	}
	bool json_oom;
	root = parse_json(text, len, &jerr, &json_oom);
	if (!root) {
		enum json_error_code code = json_error_code(&jerr);
		char where[200];

		if (json_oom) {
			r = oom(&L);
			goto out;
		}
		/* jansson's position is just past the offending token: stop one
		 * byte short so a closing ']' or '}' does not end the frame */
		json_path_at(text, len, (size_t)(jerr.position > 1 ? jerr.position - 1 : 0), where, sizeof(where));
		if (code == json_error_duplicate_key)
			errmsg_set(err, errlen, "%s:%d:%d: %s: key appears twice in the same object", path, jerr.line,
				   jerr.column, where[0] ? where : "top level");
		else
			errmsg_set(err, errlen, "%s:%d:%d: %s%snot valid JSON: %s", path, jerr.line, jerr.column, where,
				   where[0] ? ": " : "", jerr.text);
		r = -EINVAL;
		goto out;
	}
	L.p = policy_alloc(path);
	if (!L.p) {
		r = oom(&L);
		goto out;
	}
	if ((r = parse_fields(&L, root, FIELDS(top_fields))) < 0)
		goto out;
	if (strip) {
		struct policy_list ignored = {0};
		if ((r = strip_loosening(root, &ignored)) < 0) {
			list_free(&ignored);
			oom(&L);
			goto out;
		}
		if (ignored.n) {
			/* again, without them: the result is what a policy of only
			 * the tightening keys would be */
			policy_free(L.p);
			if (!(L.p = policy_alloc(path))) {
				list_free(&ignored);
				r = oom(&L);
				goto out;
			}
			if ((r = parse_fields(&L, root, FIELDS(top_fields))) < 0) {
				list_free(&ignored);
				goto out;
			}
		}
		L.p->ignored = ignored;
	}
	if ((r = policy_compile(L.p)) < 0) {
		oom(&L);
		goto out;
	}
	*out = L.p;
	L.p = NULL;
out:
	policy_free(L.p);
	json_decref(root);
	return r;
}

int policy_load(const char *path, struct policy **out, char *err, size_t errlen)
{
	struct loader L = {.file = path, .err = err, .errlen = errlen};
	char *text = NULL;
	size_t len = 0;
	int r;

	*out = NULL;
	if (errlen)
		err[0] = '\0';
	if ((r = read_policy_file(&L, path, &text, &len)) < 0)
		return r;
	r = load_text(path, text, len, false, out, err, errlen);
	if (r == 0)
		(*out)->trust = POLICY_TRUST_USER;
	mem_free(text);
	return r;
}

/* Is path beneath (or at) the directory dir? Both are realpaths. */
static bool beneath(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	if (n == 1)
		return true; /* "/" */
	return strncmp(path, dir, n) == 0 && (path[n] == '/' || path[n] == '\0');
}

int policy_load_for_workspace(const char *dir, const char *explicit_path, struct policy **out, char *err, size_t errlen)
{
	char ws[PATH_MAX], path[PATH_MAX + sizeof(POLICY_FILE_NAME) + 1], real[PATH_MAX];
	uint8_t digest[TRUST_DIGEST_LEN];
	struct stat st;
	char *text = NULL;
	size_t len = 0;
	bool other_file = false;
	int n, r;

	*out = NULL;
	if (errlen)
		err[0] = '\0';
	if (!realpath(dir, ws)) {
		r = -errno;
		errmsg_set(err, errlen, "workspace %s: %s", dir, strerror(-r));
		return r;
	}
	if (explicit_path) {
		/* the user's own file, unless it sits in the workspace */
		if (!realpath(explicit_path, real) || !beneath(real, ws))
			return policy_load(explicit_path, out, err, errlen);
		n = snprintf(path, sizeof(path), "%s", explicit_path);
		char mine[sizeof(path)];
		snprintf(mine, sizeof(mine), "%s/%s", ws, POLICY_FILE_NAME);
		other_file = strcmp(real, mine) != 0;
	} else {
		n = snprintf(path, sizeof(path), "%s/%s", ws, POLICY_FILE_NAME);
	}
	if (n < 0 || (size_t)n >= sizeof(path)) {
		errmsg_set(err, errlen, "%s: workspace path too long", dir);
		return -ENAMETOOLONG;
	}
	if (!explicit_path && lstat(path, &st) < 0) {
		if (errno == ENOENT)
			return policy_default(out);
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", path, strerror(-r));
		return r;
	}
	struct loader L = {.file = path, .err = err, .errlen = errlen};
	if ((r = read_policy_file(&L, path, &text, &len)) < 0)
		return r;
	/* the bytes approved are the bytes parsed: one read for both */
	trust_digest(ws, text, len, digest);
	bool approved = trust_is_approved(ws, digest) == 1;
	if ((r = load_text(path, text, len, !approved, out, err, errlen)) == 0) {
		(*out)->trust = approved ? POLICY_TRUST_APPROVED : POLICY_TRUST_UNTRUSTED;
		(*out)->other_file = other_file;
		if (!((*out)->workspace = mem_strdup(ws))) {
			policy_free(*out);
			*out = NULL;
			errmsg_set(err, errlen, "%s: out of memory", path);
			r = -ENOMEM;
		}
	}
	mem_free(text);
	return r;
}

int policy_trust_set(const char *dir, bool approve, char *err, size_t errlen)
{
	char ws[PATH_MAX], path[PATH_MAX + sizeof(POLICY_FILE_NAME) + 1];
	uint8_t digest[TRUST_DIGEST_LEN];
	struct policy *p = NULL;
	char *text = NULL;
	size_t len = 0;
	int r;

	if (errlen)
		err[0] = '\0';
	if (!realpath(dir, ws)) {
		r = -errno;
		errmsg_set(err, errlen, "workspace %s: %s", dir, strerror(-r));
		return r;
	}
	if (!approve)
		return trust_revoke(ws, err, errlen);
	snprintf(path, sizeof(path), "%s/%s", ws, POLICY_FILE_NAME);
	struct loader L = {.file = path, .err = err, .errlen = errlen};
	if ((r = read_policy_file(&L, path, &text, &len)) < 0)
		return r;
	/* approve only a file that loads: the approval is of what runs */
	if ((r = load_text(path, text, len, false, &p, err, errlen)) == 0) {
		trust_digest(ws, text, len, digest);
		r = trust_approve(ws, digest, err, errlen);
	}
	policy_free(p);
	mem_free(text);
	return r;
}

int policy_file_state(const char *ws, uint8_t digest[TRUST_DIGEST_LEN])
{
	char path[PATH_MAX + sizeof(POLICY_FILE_NAME) + 1], e[256];
	struct loader L = {.file = path, .err = e, .errlen = sizeof(e)};
	char *text = NULL;
	size_t len = 0;
	int r;

	snprintf(path, sizeof(path), "%s/%s", ws, POLICY_FILE_NAME);
	if ((r = read_policy_file(&L, path, &text, &len)) < 0)
		return r;
	trust_digest(ws, text, len, digest);
	mem_free(text);
	return 0;
}

enum policy_trust policy_trust(const struct policy *p)
{
	return p->trust;
}

const struct policy_list *policy_ignored(const struct policy *p)
{
	return &p->ignored;
}

size_t policy_ignored_note(const struct policy *p, char *buf, size_t n)
{
	size_t o;

	if (n)
		buf[0] = '\0';
	if (!p->ignored.n || !n)
		return 0;
	o = (size_t)snprintf(buf, n, "ignored from the untrusted %s: ", p->source);
	for (size_t i = 0; i < p->ignored.n && o < n; i++)
		o += (size_t)snprintf(buf + o, n - o, "%s%s", i ? ", " : "", p->ignored.v[i]);
	if (o < n && p->other_file)
		o += (size_t)snprintf(buf + o, n - o,
				      "; airlock trust approves %s/%s only: review this file, then pass it with "
				      "--policy from outside the workspace",
				      p->workspace, POLICY_FILE_NAME);
	else if (o < n)
		o += (size_t)snprintf(buf + o, n - o, "; review it, then run: airlock trust %s", p->workspace);
	return p->ignored.n;
}

/* ------------------------------------------------------------------ */
/* path decisions */

/* What is known about one path (a cached directory or the path being
 * checked). Pointers go into the policy, the secret table, the ctx's
 * info/exclude list or an ancestor directory's rules, all of which live at
 * least as long as the node. */
struct pstate {
	const struct policy_secret *secret; /* own entry or a secret parent directory */
	/* the secret directory holding everything beneath (this one or an
	 * ancestor), even when allow_secrets lets this path itself through:
	 * an allowed path releases that path, not its subtree */
	const struct policy_secret *held;
	const struct ignore_pattern *excl;  /* positive exclude match */
	const struct ignore_pattern *ign;   /* last ignore rule matched, maybe negative */
	const struct ignore_list *ign_list; /* the list ign came from */
	const struct ignore_pattern *inc;   /* include pattern that decided, or NULL */
	signed char inc_state;		    /* 1 included, -1 negated, 0 nothing matched */
	bool git_top;			    /* .git at the root or beneath it */
	bool git_exempt;		    /* a component is named .git */
	bool prune;			    /* directories: skip the subtree */
	enum policy_reason reason;	    /* for the path itself */
	enum policy_reason prune_reason;    /* for everything beneath, when pruned */
	const struct ignore_pattern *over;  /* POLICY_OVER_BUDGET: the pattern that ran out */
	const char *over_src;		    /* its list, NULL for the secret list */
};

struct dnode {
	struct dnode *hnext;
	struct dnode *parent;
	bool keep; /* transient mark for evict_except_chain */
	struct pstate st;
	struct ignore_list rules; /* <path>/.gitignore */
	uint64_t hash;
	size_t len;
	char path[]; /* NUL-terminated, "" for the root */
};

struct policy_ctx {
	const struct policy *p;
	int rootfd;
	struct dnode **buckets;
	size_t nbuckets; /* power of two */
	size_t ndirs, rule_bytes;
	size_t max_dirs, max_rule_bytes;
	struct dnode *root;
	struct ignore_list info_exclude;
	bool info_loaded;
	unsigned nwarn;
	char warn[300];
};

#define CTX_DEFAULT_DIRS  16384
#define CTX_DEFAULT_BYTES (32u << 20)

static uint64_t path_hash(const char *s, size_t n)
{
	uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a */

	for (size_t i = 0; i < n; i++) {
		h ^= (unsigned char)s[i];
		h *= 0x100000001b3ull;
	}
	return h;
}

static struct dnode *lookup(const struct policy_ctx *ctx, const char *path, size_t len)
{
	uint64_t h = path_hash(path, len);

	for (struct dnode *n = ctx->buckets[h & (ctx->nbuckets - 1)]; n; n = n->hnext)
		if (n->hash == h && n->len == len && memcmp(n->path, path, len) == 0)
			return n;
	return NULL;
}

static void node_free(struct policy_ctx *ctx, struct dnode *n)
{
	ctx->rule_bytes -= n->rules.bytes;
	ctx->ndirs--;
	ignore_list_clear(&n->rules);
	mem_free(n);
}

/* Drop cached nodes: all of them (dir == NULL), or dir and what is beneath. */
static void drop_nodes(struct policy_ctx *ctx, const char *dir, size_t dlen)
{
	for (size_t b = 0; b < ctx->nbuckets; b++) {
		struct dnode **pp = &ctx->buckets[b];
		while (*pp) {
			struct dnode *n = *pp;
			bool hit = !dir || (n->len >= dlen && memcmp(n->path, dir, dlen) == 0 &&
					    (n->len == dlen || dlen == 0 || n->path[dlen] == '/'));
			if (hit) {
				*pp = n->hnext;
				if (n == ctx->root)
					ctx->root = NULL;
				node_free(ctx, n);
			} else {
				pp = &n->hnext;
			}
		}
	}
}

__attribute__((format(printf, 2, 3))) static void warn(struct policy_ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	ctx->nwarn++;
	va_start(ap, fmt);
	vsnprintf(ctx->warn, sizeof(ctx->warn), fmt, ap);
	va_end(ap);
}

/* Open rel beneath rootfd without following any symlink. -errno on failure
 * (ELOOP/ENOTDIR/EXDEV when a symlink is in the way). */
static int open_beneath(int rootfd, const char *rel)
{
	const int flags = O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC | O_NOCTTY;
	struct open_how how = {.flags = (uint64_t)flags,
			       .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
	long fd = syscall(SYS_openat2, rootfd, rel, &how, sizeof(how));

	if (fd >= 0)
		return (int)fd;
	if (errno != ENOSYS && errno != EPERM)
		return -errno;

	/* openat2 missing (or filtered): walk one component at a time */
	int dfd = rootfd, r;
	const char *c = rel;
	for (;;) {
		const char *sl = strchr(c, '/');
		if (!sl)
			break;
		char name[256];
		size_t n = (size_t)(sl - c);
		if (n == 0 || n >= sizeof(name)) {
			r = -ENAMETOOLONG;
			goto fail;
		}
		memcpy(name, c, n);
		name[n] = '\0';
		int nfd = openat(dfd, name, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (nfd < 0) {
			r = -errno;
			goto fail;
		}
		if (dfd != rootfd)
			close(dfd);
		dfd = nfd;
		c = sl + 1;
	}
	fd = openat(dfd, c, flags);
	r = fd < 0 ? -errno : (int)fd;
fail:
	if (dfd != rootfd)
		close(dfd);
	return r;
}

/* Read a rule file. 0 with *buf NULL when it does not exist or cannot be
 * used (the latter with a warning, as git does), 0 with the contents, or
 * -ENOMEM. */
static int read_rules(struct policy_ctx *ctx, const char *rel, char **buf, size_t *len)
{
	struct stat st;
	int fd, r = 0;
	size_t got = 0, cap;
	char *b = NULL;

	*buf = NULL;
	*len = 0;
	fd = open_beneath(ctx->rootfd, rel);
	if (fd < 0) {
		if (fd != -ENOENT && fd != -ENOTDIR)
			warn(ctx, "%s: %s; its rules are not used", rel,
			     fd == -ELOOP || fd == -EXDEV ? "a symlink (not followed)" : strerror(-fd));
		return 0;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		warn(ctx, "%s: not a regular file; its rules are not used", rel);
		goto out;
	}
	if (st.st_size > (off_t)POLICY_IGNORE_MAX) {
		warn(ctx, "%s: larger than %u bytes; its rules are not used", rel, POLICY_IGNORE_MAX);
		goto out;
	}
	cap = (size_t)st.st_size + 1;
	b = mem_alloc(cap);
	if (!b) {
		r = -ENOMEM;
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, b + got, cap - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			warn(ctx, "%s: %s; its rules are not used", rel, strerror(errno));
			goto out;
		}
		if (n == 0)
			break;
		got += (size_t)n;
		if (got == cap) {
			/* grew while we read: take what it had when we looked */
			got = (size_t)st.st_size;
			break;
		}
	}
	*buf = b;
	*len = got;
	b = NULL;
out:
	mem_free(b);
	close(fd);
	return r;
}

static int load_list(struct policy_ctx *ctx, struct ignore_list *l, const char *rel, size_t baselen)
{
	char *buf, *src;
	size_t len;
	int r;

	memset(l, 0, sizeof(*l));
	if ((r = read_rules(ctx, rel, &buf, &len)) < 0 || !buf)
		return r;
	src = mem_strdup(rel);
	if (!src) {
		mem_free(buf);
		return -ENOMEM;
	}
	if ((r = ignore_list_parse(l, src, baselen, buf, len, 0)) == -E2BIG) {
		warn(ctx, "%s: more than %u patterns; its rules are not used", rel, IGNORE_PATTERNS_MAX);
		return 0;
	}
	return r;
}

static bool allow_exact(const struct policy *p, const char *path, size_t len)
{
	for (size_t i = 0; i < p->ws.allow_secrets.n; i++) {
		const char *a = p->ws.allow_secrets.v[i];
		if (strlen(a) == len && memcmp(a, path, len) == 0)
			return true;
	}
	return false;
}

static bool allow_beneath(const struct policy *p, const char *path, size_t len)
{
	for (size_t i = 0; i < p->ws.allow_secrets.n; i++) {
		const char *a = p->ws.allow_secrets.v[i];
		if (strlen(a) > len + 1 && a[len] == '/' && memcmp(a, path, len) == 0)
			return true;
	}
	return false;
}

/* Could the anchored include pattern match something strictly beneath the
 * directory path? Conservative: true when unsure (it only saves work). */
static bool may_match_beneath(const struct ignore_pattern *ip, const char *dir, size_t dlen)
{
	const char *pt = ip->text;
	size_t pl = ip->len, pi = 0, di = 0;

	if (ip->flags & IGNORE_NEGATIVE)
		return false;
	if (ip->flags & IGNORE_NODIR)
		return true;
	if (pl && pt[0] == '/') {
		pt++;
		pl--;
	}
	for (;;) {
		size_t pe = pi, de = di;
		while (pe < pl && pt[pe] != '/') {
			/* "\/" is a literal '/' inside a component, and "[!/]" a
			 * class spanning one: rather than parse, give up. */
			if (pt[pe] == '\\' || (pt[pe] == '[' && memchr(pt + pe, '/', pl - pe)))
				return true;
			if (pt[pe] == '*' && pe + 1 < pl && pt[pe + 1] == '*')
				return true;
			pe++;
		}
		while (de < dlen && dir[de] != '/')
			de++;
		if (!ignore_wildmatch(pt + pi, pe - pi, dir + di, de - di, IGNORE_WM_PATHNAME))
			return false;
		if (pe >= pl)
			return false; /* matches dir or a parent: inheritance covers it */
		if (de >= dlen)
			return true;
		pi = pe + 1;
		di = de + 1;
	}
}

static bool include_may_match_beneath(const struct policy *p, const char *dir, size_t dlen)
{
	for (size_t i = 0; i < p->include.n; i++)
		if (may_match_beneath(&p->include.v[i], dir, dlen))
			return true;
	return false;
}

/* The state of path (NUL-terminated, length len) whose parent directory is
 * P (NULL for the root itself). */
static void decide(const struct policy_ctx *ctx, const struct dnode *P, const char *path, size_t len, int is_dir,
		   struct pstate *st)
{
	const struct policy *p = ctx->p;
	const char *sl = memrchr(path, '/', len);
	const char *bn = sl ? sl + 1 : path;
	bool git_name = (size_t)(path + len - bn) == 4 && memcmp(bn, ".git", 4) == 0;
	const struct ignore_pattern *m;

	memset(st, 0, sizeof(*st));
	if (!P) {
		st->inc_state = p->ws.has_include ? 0 : 1;
		st->reason = st->inc_state == 1 ? POLICY_SYNCED : POLICY_NOT_INCLUDED;
		return;
	}
	st->git_top = P->st.git_top || (P->len == 0 && git_name);
	st->git_exempt = P->st.git_exempt || git_name;

	{
		const struct policy_secret *own = policy_secret_match(path, is_dir);
		if (is_dir)
			st->held = own ? own : P->st.held;
		if (!allow_exact(p, path, len))
			st->secret = own ? own : P->st.held;
	}

	m = ignore_list_match(&p->exclude, path, len, is_dir);
	if (m && !(m->flags & IGNORE_NEGATIVE))
		st->excl = m;

	if (p->ws.gitignore && !st->git_exempt) {
		for (const struct dnode *n = P; n && !st->ign; n = n->parent) {
			if ((m = ignore_list_match(&n->rules, path, len, is_dir))) {
				st->ign = m;
				st->ign_list = &n->rules;
			}
		}
		if (!st->ign && (m = ignore_list_match(&ctx->info_exclude, path, len, is_dir))) {
			st->ign = m;
			st->ign_list = &ctx->info_exclude;
		}
	}

	if (!p->ws.has_include || st->git_top) {
		st->inc_state = 1;
	} else if ((m = ignore_list_match(&p->include, path, len, is_dir))) {
		st->inc = m;
		st->inc_state = (m->flags & IGNORE_NEGATIVE) ? -1 : 1;
	} else {
		st->inc = P->st.inc;
		st->inc_state = P->st.inc_state;
	}

	bool ignored = st->ign && !(st->ign->flags & IGNORE_NEGATIVE);
	st->reason = st->secret		  ? POLICY_SECRET
		     : st->excl		  ? POLICY_EXCLUDED
		     : ignored		  ? POLICY_IGNORED
		     : st->inc_state != 1 ? POLICY_NOT_INCLUDED
					  : POLICY_SYNCED;
	if (is_dir) {
		bool by_secret = st->secret && !allow_beneath(p, path, len);
		bool by_include = st->inc_state != 1 && !include_may_match_beneath(p, path, len);
		st->prune = by_secret || st->excl || ignored || by_include;
		st->prune_reason = by_secret	? POLICY_SECRET
				   : st->excl	? POLICY_EXCLUDED
				   : ignored	? POLICY_IGNORED
				   : by_include ? POLICY_NOT_INCLUDED
						: POLICY_SYNCED;
	}
}

/* Create the node for path[0..len) under parent P (NULL: the root). */
/* Over the rule-memory cap in the middle of a lookup: drop every cached
 * node except n and its ancestors, which the lookup is still using. */
/* decide() within the matcher's budget; a decision over it withholds the
 * path (and, for a directory, everything beneath): the rules could not be
 * told in bounded time, and not sending is the safe answer. */
static void compute_state(const struct policy_ctx *ctx, const struct dnode *P, const char *path, size_t len, int is_dir,
			  struct pstate *st)
{
	const struct ignore_pattern *pat;
	const char *src;

	ignore_budget_start(POLICY_MATCH_BUDGET);
	decide(ctx, P, path, len, is_dir, st);
	if (!ignore_budget_end(&pat, &src))
		return;
	st->reason = POLICY_OVER_BUDGET;
	st->over = pat;
	st->over_src = src;
	if (is_dir) {
		st->prune = true;
		st->prune_reason = POLICY_OVER_BUDGET;
	}
}

static void evict_except_chain(struct policy_ctx *ctx, struct dnode *n)
{
	for (struct dnode *a = n; a; a = a->parent)
		a->keep = true;
	for (size_t b = 0; b < ctx->nbuckets; b++) {
		struct dnode **pp = &ctx->buckets[b];
		while (*pp) {
			struct dnode *x = *pp;
			if (x->keep) {
				pp = &x->hnext;
				continue;
			}
			*pp = x->hnext;
			node_free(ctx, x);
		}
	}
	for (struct dnode *a = n; a; a = a->parent)
		a->keep = false;
}

static int node_new(struct policy_ctx *ctx, struct dnode *P, const char *path, size_t len, struct dnode **out)
{
	struct dnode *n = mem_alloc(sizeof(*n) + len + 1);
	int r;

	if (!n)
		return -ENOMEM;
	memset(n, 0, sizeof(*n));
	memcpy(n->path, path, len);
	n->path[len] = '\0';
	n->len = len;
	n->parent = P;
	compute_state(ctx, P, n->path, len, 1, &n->st);
	if (!n->st.prune && ctx->p->ws.gitignore && !n->st.git_exempt && ctx->rootfd >= 0) {
		char rel[POLICY_PATH_MAX + sizeof("/.gitignore")];
		snprintf(rel, sizeof(rel), "%s%s.gitignore", n->path, len ? "/" : "");
		if (P && ctx->rule_bytes > ctx->max_rule_bytes)
			evict_except_chain(ctx, P);
		if (ctx->rule_bytes > ctx->max_rule_bytes) {
			/* the directories of this one path alone hold more rules
			 * than the cap (pathological): stay bounded, say so */
			warn(ctx, "%s: rule memory cap (%zu bytes) reached on this path; its rules are not used", rel,
			     ctx->max_rule_bytes);
		} else if ((r = load_list(ctx, &n->rules, rel, len ? len + 1 : 0)) < 0) {
			mem_free(n);
			return r;
		}
	}
	n->hash = path_hash(path, len);
	n->hnext = ctx->buckets[n->hash & (ctx->nbuckets - 1)];
	ctx->buckets[n->hash & (ctx->nbuckets - 1)] = n;
	ctx->ndirs++;
	ctx->rule_bytes += n->rules.bytes;
	*out = n;
	return 0;
}

/* The node for directory path[0..dlen), or the nearest pruned ancestor
 * (nothing beneath a pruned directory is cached). */
static int get_dir(struct policy_ctx *ctx, const char *path, size_t dlen, struct dnode **out)
{
	struct dnode *n;
	size_t k = dlen;
	int r;

	if (!ctx->root && (r = node_new(ctx, NULL, "", 0, &ctx->root)) < 0)
		return r;
	/* climb to the deepest cached ancestor */
	for (;;) {
		n = k ? lookup(ctx, path, k) : ctx->root;
		if (n)
			break;
		const char *sl = memrchr(path, '/', k);
		k = sl ? (size_t)(sl - path) : 0;
	}
	/* then create downwards */
	while (k < dlen && !n->st.prune) {
		const char *sl = memchr(path + k + (k ? 1 : 0), '/', dlen - k - (k ? 1 : 0));
		size_t next = sl ? (size_t)(sl - path) : dlen;
		if ((r = node_new(ctx, n, path, next, &n)) < 0)
			return r;
		k = next;
	}
	*out = n;
	return 0;
}

int policy_ctx_new(const struct policy *p, int rootfd, struct policy_ctx **out)
{
	struct policy_ctx *ctx = mem_calloc(1, sizeof(*ctx));

	*out = NULL;
	if (!ctx)
		return -ENOMEM;
	ctx->p = p;
	ctx->rootfd = -1;
	ctx->max_dirs = CTX_DEFAULT_DIRS;
	ctx->max_rule_bytes = CTX_DEFAULT_BYTES;
	ctx->nbuckets = 4096;
	ctx->buckets = mem_calloc(ctx->nbuckets, sizeof(*ctx->buckets));
	if (!ctx->buckets) {
		mem_free(ctx);
		return -ENOMEM;
	}
	if (rootfd >= 0) {
		ctx->rootfd = fcntl(rootfd, F_DUPFD_CLOEXEC, 3);
		if (ctx->rootfd < 0) {
			int r = -errno;
			mem_free(ctx->buckets);
			mem_free(ctx);
			return r;
		}
	}
	*out = ctx;
	return 0;
}

void policy_ctx_free(struct policy_ctx *ctx)
{
	if (!ctx)
		return;
	drop_nodes(ctx, NULL, 0);
	ignore_list_clear(&ctx->info_exclude);
	mem_free(ctx->buckets);
	if (ctx->rootfd >= 0)
		close(ctx->rootfd);
	mem_free(ctx);
}

void policy_ctx_set_limits(struct policy_ctx *ctx, size_t max_dirs, size_t max_rule_bytes)
{
	ctx->max_dirs = max_dirs ? max_dirs : 1;
	ctx->max_rule_bytes = max_rule_bytes;
}

static void invalidate(struct policy_ctx *ctx, const char *dir, size_t dlen)
{
	if (dlen == 0) {
		drop_nodes(ctx, NULL, 0);
		ignore_list_clear(&ctx->info_exclude);
		ctx->info_loaded = false;
		return;
	}
	drop_nodes(ctx, dir, dlen);
}

void policy_ctx_invalidate(struct policy_ctx *ctx, const char *dir)
{
	invalidate(ctx, dir, strlen(dir));
}

bool policy_ctx_note_change(struct policy_ctx *ctx, const char *relpath)
{
	size_t len = strlen(relpath);
	const char *sl = memrchr(relpath, '/', len);
	const char *bn = sl ? sl + 1 : relpath;

	if (strcmp(relpath, ".git/info/exclude") == 0 || strcmp(relpath, ".git/info") == 0 ||
	    strcmp(relpath, ".git") == 0) {
		invalidate(ctx, "", 0);
		return true;
	}
	if (strcmp(bn, ".gitignore") == 0) {
		invalidate(ctx, relpath, sl ? (size_t)(sl - relpath) : 0);
		return true;
	}
	if (len && lookup(ctx, relpath, len)) {
		/* a directory we know was renamed or removed */
		invalidate(ctx, relpath, len);
		return true;
	}
	return false;
}

unsigned policy_ctx_warnings(const struct policy_ctx *ctx, const char **last)
{
	if (last)
		*last = ctx->nwarn ? ctx->warn : NULL;
	return ctx->nwarn;
}

static void fill_verdict(const struct policy *p, const struct pstate *st, enum policy_reason reason,
			 struct policy_verdict *v)
{
	char pat[300];

	v->reason = reason;
	v->ignore = st->ign;
	v->ignore_src = st->ign_list ? st->ign_list->src : NULL;
	v->rule[0] = '\0';
	switch (reason) {
	case POLICY_SYNCED:
		break;
	case POLICY_SECRET:
		snprintf(v->rule, sizeof(v->rule), "secret: %s (%s)", st->secret->reason, st->secret->pattern);
		break;
	case POLICY_EXCLUDED:
		snprintf(v->rule, sizeof(v->rule), "exclude: %s", p->ws.exclude.v[st->excl->line]);
		break;
	case POLICY_IGNORED:
		ignore_pattern_format(st->ign, pat, sizeof(pat));
		snprintf(v->rule, sizeof(v->rule), "gitignore: %.200s:%u: %.280s", st->ign_list->src, st->ign->line,
			 pat);
		break;
	case POLICY_OVER_BUDGET:
		if (st->over)
			ignore_pattern_format(st->over, pat, sizeof(pat));
		snprintf(v->rule, sizeof(v->rule),
			 "over budget: %.200s:%u: %.200s: deciding this path took over %lu matcher steps; withheld "
			 "to be safe (simplify the rule)",
			 st->over_src ? st->over_src : "built-in secret list", st->over ? st->over->line : 0,
			 st->over ? pat : "?", POLICY_MATCH_BUDGET);
		break;
	case POLICY_NOT_INCLUDED:
		if (st->inc)
			snprintf(v->rule, sizeof(v->rule), "not included: %s", p->ws.include.v[st->inc->line]);
		else
			snprintf(v->rule, sizeof(v->rule), "not included");
		break;
	}
}

int policy_check(const struct policy *p, struct policy_ctx *ctx, const char *relpath, int is_dir,
		 struct policy_verdict *v)
{
	size_t len = strnlen(relpath, POLICY_PATH_MAX + 1);
	struct dnode *d;
	struct pstate st;
	int r;

	assert(ctx->p == p);
	if ((r = relpath_ok(relpath, len)) < 0)
		return r;
	if (ctx->ndirs > ctx->max_dirs || ctx->rule_bytes > ctx->max_rule_bytes)
		drop_nodes(ctx, NULL, 0);
	if (!ctx->info_loaded && p->ws.gitignore && ctx->rootfd >= 0) {
		if ((r = load_list(ctx, &ctx->info_exclude, ".git/info/exclude", 0)) < 0)
			return r;
		ctx->info_loaded = true;
	}

	v->prune = false;
	v->inherited = false;
	if (owned_verdict(p, relpath, is_dir, v))
		return 0;
	if (is_dir) {
		if ((r = get_dir(ctx, relpath, len, &d)) < 0)
			return r;
		if (d->len == len) {
			fill_verdict(p, &d->st, d->st.reason, v);
			v->prune = d->st.prune;
		} else {
			fill_verdict(p, &d->st, d->st.prune_reason, v);
			v->prune = true;
			v->inherited = true;
		}
		return 0;
	}
	const char *sl = memrchr(relpath, '/', len);
	if ((r = get_dir(ctx, relpath, sl ? (size_t)(sl - relpath) : 0, &d)) < 0)
		return r;
	if (d->st.prune) {
		fill_verdict(p, &d->st, d->st.prune_reason, v);
		v->inherited = true;
		return 0;
	}
	compute_state(ctx, d, relpath, len, 0, &st);
	fill_verdict(p, &st, st.reason, v);
	return 0;
}
