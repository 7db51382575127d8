/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ops: the requests (doc/RELAY.md "Requests"). A line is parsed, its "id"
 * and "op" checked, and the op looked up in ops_table, which also says
 * which fields the op takes; each op validates its fields, sends any error
 * itself and calls the backend. An op never frees a client or a command
 * other than through the deferred paths (relay.c "Re-entrancy").
 */
#include <errno.h>
#include <stdint.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "server_i.h"

#define ID_MAX		256
#define ARGV_MAX	4096
#define ENV_MAX		1024
#define ENV_NAME_MAX	255
#define CWD_MAX		4096
#define SYNC_PER_CLIENT 64
#define TIMEOUT_MAX_S	(30.0 * 24 * 3600)

/* ------------------------------------------------------------------ */
/* request validation */

struct op;
typedef void op_fn(struct client *c, json_t *rq, json_t *id);

struct op {
	const char *name;
	op_fn *fn;
	bool id_required;
	const char *const *fields; /* allowed besides "op" and "id" */
};

static bool check_fields(struct client *c, json_t *rq, json_t *id, const struct op *op)
{
	const char *k;
	json_t *v;

	json_object_foreach(rq, k, v)
	{
		bool ok = !strcmp(k, "op") || !strcmp(k, "id");
		for (const char *const *f = op->fields; !ok && *f; f++)
			ok = !strcmp(k, *f);
		if (!ok) {
			relay_send_error(c, id, "bad_field", "unknown field '%.64s' for op '%s'", k, op->name);
			return false;
		}
	}
	return true;
}

static bool get_bool(struct client *c, json_t *rq, json_t *id, const char *field, bool dflt, bool *out)
{
	json_t *v = json_object_get(rq, field);

	if (!v || json_is_null(v)) {
		*out = dflt;
		return true;
	}
	if (!json_is_boolean(v)) {
		relay_send_error(c, id, "bad_field", "field '%s' must be true or false", field);
		return false;
	}
	*out = json_is_true(v);
	return true;
}

/* Integer in [lo, hi]; present is set when the field was given. */
static bool get_int(struct client *c, json_t *obj, json_t *id, const char *field, const char *label, json_int_t lo,
		    json_int_t hi, bool required, json_int_t *out, bool *present)
{
	json_t *v = json_object_get(obj, field);

	if (present)
		*present = v != NULL;
	if (!v) {
		if (required) {
			relay_send_error(c, id, "missing_field", "field '%s' is required", label);
			return false;
		}
		return true;
	}
	if (!json_is_integer(v) || json_integer_value(v) < lo || json_integer_value(v) > hi) {
		relay_send_error(c, id, "bad_field", "field '%s' must be an integer from %lld to %lld", label,
				 (long long)lo, (long long)hi);
		return false;
	}
	*out = json_integer_value(v);
	return true;
}

static bool plain_string(json_t *v)
{
	return json_is_string(v) && strlen(json_string_value(v)) == json_string_length(v);
}

static bool valid_cwd(const char *s)
{
	if (s[0] == '/' || strlen(s) > CWD_MAX)
		return false;
	for (const char *p = s; *p;) {
		const char *e = strchr(p, '/');
		size_t n = e ? (size_t)(e - p) : strlen(p);
		if (n == 2 && p[0] == '.' && p[1] == '.')
			return false;
		p += n;
		if (*p == '/')
			p++;
	}
	return true;
}

static bool valid_env_name(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > ENV_NAME_MAX || (s[0] >= '0' && s[0] <= '9'))
		return false;
	for (size_t i = 0; i < n; i++) {
		char ch = s[i];
		if (!((ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') || ch == '_'))
			return false;
	}
	return true;
}

/* The command a request names, or NULL after sending the error. */
static struct relay_cmd *want_cmd(struct client *c, json_t *id, bool running)
{
	char *key = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
	struct relay_cmd *m = key ? relay_cmd_find(c->r, key) : NULL;

	mem_free(key);
	if (!m) {
		relay_send_error(c, id, "unknown_id", "no command with this id (see op 'status')");
		return NULL;
	}
	if (running && (relay_cmd_ended(m) || !m->live)) {
		relay_send_error(c, id, "not_running", "the command has already ended (%s)",
				 relay_state_names[m->state]);
		return NULL;
	}
	return m;
}

static void backend_failed(struct client *c, json_t *id, const char *what, int rc)
{
	if (rc == -EAGAIN)
		relay_send_error(c, id, "busy", "%s: the sandbox cannot take this now, retry", what);
	else
		relay_send_error(c, id, "backend_error", "%s failed: %s", what, strerror(-rc));
}

/* ------------------------------------------------------------------ */
/* ops */

static const char *const exec_fields[] = {"argv",  "shell", "cwd",	"env",	"timeout_seconds", "tty",
					  "stdin", "tail",  "encoding", "fork", "cancel_on_close", NULL};

/* "encoding": "text" (default: data when valid UTF-8, else data_b64) or
 * "base64" (always data_b64). 1 for base64, 0 for text, -1 after an error
 * was sent. */
static int want_b64(struct client *c, json_t *rq, json_t *id)
{
	json_t *e = json_object_get(rq, "encoding");
	const char *v = json_string_value(e);

	if (!e || (v && !strcmp(v, "text")))
		return 0;
	if (v && !strcmp(v, "base64"))
		return 1;
	relay_send_error(c, id, "bad_field", "field 'encoding' must be \"text\" or \"base64\"");
	return -1;
}

/* An exec request while it is parsed: req as the backend gets it, and what
 * its pointers point to. The strings are the request's (valid while it
 * is); exec_args_clear frees the arrays and the "NAME=value" copies. */
struct exec_args {
	struct relay_exec_req req;
	const char **argv; /* "argv" strings; NULL for "shell" (then sh) */
	const char *sh[3];
	const char **env;
	char **envbuf; /* the nenv "NAME=value" strings env points to */
	size_t nenv;
	bool tail_mode;
	size_t tail[2];
	int b64;	      /* want_b64 */
	bool cancel_on_close; /* the command ends when this connection does */
};

static void exec_args_clear(struct exec_args *a)
{
	for (size_t i = 0; a->envbuf && i < a->nenv; i++)
		mem_free(a->envbuf[i]);
	mem_free(a->envbuf);
	mem_free(a->env);
	mem_free(a->argv);
}

/* The key for id in *key (the caller frees it), after making sure no
 * running command has the id. A finished command with the id is
 * forgotten. false after sending the error. */
static bool exec_claim_id(struct client *c, json_t *id, char **key)
{
	struct relay_cmd *m;

	*key = json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT);
	if (!*key) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return false;
	}
	if ((m = relay_cmd_find(c->r, *key))) {
		if (!relay_cmd_ended(m)) {
			relay_send_error(c, id, "duplicate_id", "a command with this id is still running");
			return false;
		}
		relay_cmd_free(m); /* reusing the id of a finished command forgets it */
	}
	return true;
}

/* "argv" (array of strings) or "shell" (string, run as sh -c). */
static bool exec_parse_argv(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	json_t *jargv = json_object_get(rq, "argv"), *jshell = json_object_get(rq, "shell");

	if (jargv && jshell) {
		relay_send_error(c, id, "bad_field", "give 'argv' or 'shell', not both");
		return false;
	}
	if (!jargv && !jshell) {
		relay_send_error(c, id, "missing_field",
				 "field 'argv' (array of strings) or 'shell' (string) is required");
		return false;
	}
	if (jshell) {
		if (!plain_string(jshell) || json_string_length(jshell) == 0) {
			relay_send_error(c, id, "bad_field",
					 "field 'shell' must be a non-empty string without NUL bytes");
			return false;
		}
		a->sh[0] = "sh";
		a->sh[1] = "-c";
		a->sh[2] = json_string_value(jshell);
		a->req.argc = 3;
		a->req.shell = true;
		a->req.argv = a->sh;
		return true;
	}
	size_t n = json_is_array(jargv) ? json_array_size(jargv) : 0;
	if (!json_is_array(jargv) || n == 0 || n > ARGV_MAX) {
		relay_send_error(c, id, "bad_field", "field 'argv' must be an array of 1 to %d strings", ARGV_MAX);
		return false;
	}
	a->argv = mem_calloc(n + 1, sizeof(*a->argv));
	if (!a->argv) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return false;
	}
	for (size_t i = 0; i < n; i++) {
		json_t *s = json_array_get(jargv, i);
		if (!plain_string(s) || (i == 0 && json_string_length(s) == 0)) {
			relay_send_error(c, id, "bad_field", "field 'argv[%zu]' must be a %sstring without NUL bytes",
					 i, i == 0 ? "non-empty " : "");
			return false;
		}
		a->argv[i] = json_string_value(s);
	}
	a->req.argc = n;
	a->req.argv = a->argv;
	return true;
}

/* "cwd": relative to the workspace root, no ".."; default the root. */
static bool exec_parse_cwd(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	json_t *v = json_object_get(rq, "cwd");

	a->req.cwd = "";
	if (!v || json_is_null(v))
		return true;
	if (!plain_string(v) || !valid_cwd(json_string_value(v))) {
		relay_send_error(c, id, "bad_field",
				 "field 'cwd' must be a path relative to the workspace root, without '..' components");
		return false;
	}
	a->req.cwd = json_string_value(v);
	return true;
}

/* "env": {NAME: value}, into "NAME=value" strings. */
static bool exec_parse_env(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	json_t *v = json_object_get(rq, "env"), *ev;
	const char *k;

	if (!v || json_is_null(v))
		return true;
	if (!json_is_object(v) || json_object_size(v) > ENV_MAX) {
		relay_send_error(c, id, "bad_field", "field 'env' must be an object of at most %d names", ENV_MAX);
		return false;
	}
	a->envbuf = mem_calloc(json_object_size(v) + 1, sizeof(*a->envbuf));
	a->env = mem_calloc(json_object_size(v) + 1, sizeof(*a->env));
	if (!a->envbuf || !a->env) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return false;
	}
	json_object_foreach(v, k, ev)
	{
		if (!valid_env_name(k)) {
			relay_send_error(c, id, "bad_field", "field 'env': name '%.64s' is not [A-Za-z_][A-Za-z0-9_]*",
					 k);
			return false;
		}
		if (!plain_string(ev)) {
			relay_send_error(c, id, "bad_field", "field 'env.%.64s' must be a string without NUL bytes", k);
			return false;
		}
		size_t kl = strlen(k), vl = json_string_length(ev);
		char *pair = mem_alloc(kl + vl + 2);
		if (!pair) {
			relay_send_error(c, id, "busy", "relay out of memory");
			return false;
		}
		memcpy(pair, k, kl);
		pair[kl] = '=';
		memcpy(pair + kl + 1, json_string_value(ev), vl + 1);
		a->envbuf[a->nenv] = pair;
		a->env[a->nenv] = pair;
		a->nenv++;
	}
	a->req.env = a->env;
	a->req.nenv = a->nenv;
	return true;
}

/* "timeout_seconds": (0, TIMEOUT_MAX_S], rounded up to a millisecond;
 * default the relay's timeout_s. */
static bool exec_parse_timeout(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	json_t *v = json_object_get(rq, "timeout_seconds");

	a->req.timeout_ms = (uint64_t)c->r->timeout_s * 1000;
	if (!v || json_is_null(v))
		return true;
	double t = json_is_number(v) ? json_number_value(v) : -1;
	if (!(t > 0 && t <= TIMEOUT_MAX_S)) {
		relay_send_error(c, id, "bad_field",
				 "field 'timeout_seconds' must be a number above 0 and at most %.0f", TIMEOUT_MAX_S);
		return false;
	}
	a->req.timeout_ms = (uint64_t)(t * 1000.0 + 0.999);
	return true;
}

/* "tty": false, true (24x80) or {"rows": N, "cols": N}. */
static bool exec_parse_tty(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	json_t *v = json_object_get(rq, "tty"), *tv;
	json_int_t rows = 0, cols = 0;
	const char *k;

	if (v && json_is_true(v)) {
		a->req.tty = true;
		a->req.rows = 24;
		a->req.cols = 80;
		return true;
	}
	if (!v || json_is_false(v) || json_is_null(v))
		return true;
	if (!json_is_object(v)) {
		relay_send_error(c, id, "bad_field", "field 'tty' must be false, true or {\"rows\": N, \"cols\": N}");
		return false;
	}
	json_object_foreach(v, k, tv)
	{
		if (strcmp(k, "rows") && strcmp(k, "cols")) {
			relay_send_error(c, id, "bad_field", "unknown field 'tty.%.64s'", k);
			return false;
		}
	}
	if (!get_int(c, v, id, "rows", "tty.rows", 1, 65535, true, &rows, NULL) ||
	    !get_int(c, v, id, "cols", "tty.cols", 1, 65535, true, &cols, NULL))
		return false;
	a->req.tty = true;
	a->req.rows = (uint16_t)rows;
	a->req.cols = (uint16_t)cols;
	return true;
}

/* "tail": true or {"stdout_bytes": N, "stderr_bytes": N}: answer with one
 * `result` instead of streaming. */
static bool exec_parse_tail(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	/* The defaults doc/RELAY.md "Requests" gives for `tail`. */
	static const size_t dflt[2] = {8000, 4000};
	static const char *const fields[2] = {"stdout_bytes", "stderr_bytes"};
	static const char *const labels[2] = {"tail.stdout_bytes", "tail.stderr_bytes"};
	json_t *tail = json_object_get(rq, "tail"), *tv;
	const char *k;

	if (!tail || json_is_null(tail) || json_is_false(tail))
		return true;
	a->tail_mode = true;
	a->tail[0] = dflt[0];
	a->tail[1] = dflt[1];
	if (json_is_true(tail))
		return true;
	if (!json_is_object(tail)) {
		relay_send_error(c, id, "bad_field",
				 "field 'tail' must be true or {\"stdout_bytes\": N, \"stderr_bytes\": N}");
		return false;
	}
	json_object_foreach(tail, k, tv)
	{
		if (strcmp(k, "stdout_bytes") && strcmp(k, "stderr_bytes")) {
			relay_send_error(c, id, "bad_field", "unknown field 'tail.%.64s'", k);
			return false;
		}
	}
	for (int i = 0; i < 2; i++) {
		json_int_t x;
		bool present;
		if (!get_int(c, tail, id, fields[i], labels[i], 0, (json_int_t)c->r->ring_bytes, false, &x, &present))
			return false;
		if (present)
			a->tail[i] = (size_t)x;
	}
	return true;
}

/* Every field of an exec request, in the order their errors are
 * reported. */
bool relay_fork_name_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n > RELAY_FORK_NAME_MAX || s[0] == '-' || s[0] == '_')
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') || s[i] == '-' || s[i] == '_'))
			return false;
	return true;
}

/* "fork": the name of a fork of the sandbox to run in. */
static bool exec_parse_fork(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	json_t *v = json_object_get(rq, "fork");

	a->req.fork = NULL;
	if (!v || json_is_null(v))
		return true;
	if (!plain_string(v) || !relay_fork_name_ok(json_string_value(v))) {
		relay_send_error(
		    c, id, "bad_field",
		    "field 'fork' must be a fork's name: 1 to %d of a-z, 0-9, '-' and '_', starting with a "
		    "letter or digit",
		    RELAY_FORK_NAME_MAX);
		return false;
	}
	a->req.fork = json_string_value(v);
	return true;
}

static bool exec_parse(struct client *c, json_t *rq, json_t *id, struct exec_args *a)
{
	return exec_parse_argv(c, rq, id, a) && exec_parse_cwd(c, rq, id, a) && exec_parse_env(c, rq, id, a) &&
	       exec_parse_timeout(c, rq, id, a) && exec_parse_tty(c, rq, id, a) &&
	       get_bool(c, rq, id, "stdin", false, &a->req.stdin_open) && exec_parse_tail(c, rq, id, a) &&
	       exec_parse_fork(c, rq, id, a) && get_bool(c, rq, id, "cancel_on_close", false, &a->cancel_on_close);
}

/* The command and its requester's subscription; takes *key on success.
 * NULL after sending the error. */
static struct relay_cmd *exec_register(struct client *c, json_t *id, char **key, const struct exec_args *a)
{
	struct relay *r = c->r;
	struct relay_cmd *m;
	struct sub *s;

	if (r->nrunning >= r->max_running) {
		relay_send_error(c, id, "busy", "%u commands are already running; wait for one to end", r->max_running);
		return NULL;
	}
	if (!(m = relay_cmd_new(r, *key, id, &a->req))) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return NULL;
	}
	*key = NULL;
	if (!(s = relay_sub_new(c, m, a->tail_mode ? SUB_TAIL : SUB_STREAM))) {
		relay_send_error(c, id, "busy", "relay out of memory");
		relay_cmd_free(m);
		return NULL;
	}
	s->b64 = a->b64 == 1;
	s->tail[0] = a->tail[0];
	s->tail[1] = a->tail[1];
	if (a->cancel_on_close)
		m->owner = c;
	return m;
}

/* exec: validate, register the command, hand it to the backend. The
 * replies are the command's events (the backend may send the first ones
 * from inside exec_start); a backend refusal is answered here. */
static void op_exec(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	struct exec_args a = {0};
	struct relay_cmd *m = NULL;
	char *key = NULL;
	int rc;

	if ((a.b64 = want_b64(c, rq, id)) < 0 || !exec_claim_id(c, id, &key) || !exec_parse(c, rq, id, &a) ||
	    !(m = exec_register(c, id, &key, &a)))
		goto out;
	m->live = true;
	rc = r->ops->exec_start(r->ud, m, &a.req);
	if (rc < 0) {
		m->live = false;
		backend_failed(c, id, "exec", rc);
		relay_cmd_free(m);
	}
out:
	exec_args_clear(&a);
	mem_free(key);
}

static const char *const stdin_fields[] = {"data", "data_b64", "eof", NULL};

static void op_stdin(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	struct relay_cmd *m;
	json_t *d = json_object_get(rq, "data"), *b = json_object_get(rq, "data_b64");
	uint8_t *bin = NULL;
	const void *p = NULL;
	size_t n = 0;
	bool eof;
	int rc;

	if (!get_bool(c, rq, id, "eof", false, &eof))
		return;
	if (d && b) {
		relay_send_error(c, id, "bad_field", "give 'data' or 'data_b64', not both");
		return;
	}
	if (!d && !b && !eof) {
		relay_send_error(c, id, "missing_field", "field 'data', 'data_b64' or 'eof' is required");
		return;
	}
	if (d) {
		if (!json_is_string(d)) {
			relay_send_error(c, id, "bad_field", "field 'data' must be a string");
			return;
		}
		p = json_string_value(d);
		n = json_string_length(d);
	}
	if (b) {
		if (!json_is_string(b)) {
			relay_send_error(c, id, "bad_field", "field 'data_b64' must be a base64 string");
			return;
		}
		size_t bl = json_string_length(b);
		bin = mem_alloc(bl / 4 * 3 + 3);
		if (!bin) {
			relay_send_error(c, id, "busy", "relay out of memory");
			return;
		}
		if (sodium_base642bin(bin, bl / 4 * 3 + 3, json_string_value(b), bl, NULL, &n, NULL,
				      sodium_base64_VARIANT_ORIGINAL) != 0) {
			relay_send_error(c, id, "bad_field", "field 'data_b64' is not valid base64");
			goto out;
		}
		p = bin;
	}
	if (!(m = want_cmd(c, id, true)))
		goto out;
	if (!m->stdin_open || m->stdin_eof) {
		relay_send_error(c, id, "stdin_closed",
				 m->stdin_open ? "stdin was already closed with eof"
					       : "the command was started without \"stdin\": true");
		goto out;
	}
	rc = r->ops->stdin_write(r->ud, m, p, n, eof);
	if (rc < 0)
		backend_failed(c, id, "stdin", rc);
	else if (eof)
		m->stdin_eof = true;
out:
	mem_free(bin);
}

static const char *const signal_fields[] = {"signal", NULL};

static const struct {
	const char *name;
	int signo;
} signals[] = {
    {"HUP", 1},	  {"INT", 2},	{"QUIT", 3},  {"KILL", 9},  {"USR1", 10},  {"USR2", 12},
    {"TERM", 15}, {"CONT", 18}, {"STOP", 19}, {"TSTP", 20}, {"WINCH", 28},
};

static void op_signal(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	json_t *v = json_object_get(rq, "signal");
	int signo = 0;
	int rc;

	if (!v) {
		relay_send_error(c, id, "missing_field", "field 'signal' is required");
		return;
	}
	if (json_is_integer(v) && json_integer_value(v) >= 1 && json_integer_value(v) <= 64) {
		signo = (int)json_integer_value(v);
	} else if (json_is_string(v)) {
		const char *s = json_string_value(v);
		if (!strncmp(s, "SIG", 3))
			s += 3;
		for (size_t i = 0; i < sizeof(signals) / sizeof(signals[0]); i++)
			if (!strcmp(s, signals[i].name))
				signo = signals[i].signo;
	}
	if (!signo) {
		relay_send_error(
		    c, id, "bad_field",
		    "field 'signal' must be INT, TERM, KILL, HUP, QUIT, USR1, USR2, CONT, STOP, TSTP, WINCH or 1..64");
		return;
	}
	if (!(m = want_cmd(c, id, true)))
		return;
	if ((rc = c->r->ops->signal(c->r->ud, m, signo)) < 0)
		backend_failed(c, id, "signal", rc);
	else
		relay_send_ok(c, id, "signal");
}

static const char *const resize_fields[] = {"rows", "cols", NULL};

static void op_resize(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	json_int_t rows = 0, cols = 0;
	int rc;

	if (!get_int(c, rq, id, "rows", "rows", 1, 65535, true, &rows, NULL) ||
	    !get_int(c, rq, id, "cols", "cols", 1, 65535, true, &cols, NULL))
		return;
	if (!(m = want_cmd(c, id, true)))
		return;
	if (!m->tty) {
		relay_send_error(c, id, "no_tty", "the command was started without a tty; nothing to resize");
		return;
	}
	if ((rc = c->r->ops->resize(c->r->ud, m, (uint16_t)rows, (uint16_t)cols)) < 0)
		backend_failed(c, id, "resize", rc);
	else
		relay_send_ok(c, id, "resize");
}

static const char *const no_fields[] = {NULL};

static void op_cancel(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	int rc;

	(void)rq;
	if (!(m = want_cmd(c, id, true)))
		return;
	if ((rc = c->r->ops->cancel(c->r->ud, m)) < 0)
		backend_failed(c, id, "cancel", rc);
	else
		relay_send_ok(c, id, "cancel");
}

static const char *const attach_fields[] = {"from", "encoding", NULL};

/* "from": one byte offset for both streams or {"stdout": N, "stderr": N};
 * default the oldest byte each ring keeps. false after sending the error. */
static bool attach_parse_from(struct client *c, json_t *rq, json_t *id, const struct relay_cmd *m, uint64_t at[2])
{
	json_t *from = json_object_get(rq, "from");
	json_int_t x;

	at[0] = relay_ring_start(&m->ring[0]);
	at[1] = relay_ring_start(&m->ring[1]);
	if (!from || json_is_null(from))
		return true;
	if (json_is_integer(from)) {
		/* One number for both streams (a tty's output is all on
		 * stdout): clamped to each stream's end. */
		if (json_integer_value(from) < 0)
			goto bad;
		for (int i = 0; i < 2; i++) {
			at[i] = (uint64_t)json_integer_value(from);
			if (at[i] > m->ring[i].end)
				at[i] = m->ring[i].end;
		}
		if ((uint64_t)json_integer_value(from) > m->ring[0].end &&
		    (uint64_t)json_integer_value(from) > m->ring[1].end) {
			relay_send_error(c, id, "bad_field",
					 "field 'from': offset %lld is past the end of both streams",
					 (long long)json_integer_value(from));
			return false;
		}
	} else if (json_is_object(from)) {
		const char *k;
		json_t *fv;
		bool present;
		json_object_foreach(from, k, fv)
		{
			if (strcmp(k, "stdout") && strcmp(k, "stderr"))
				goto bad;
		}
		if (!get_int(c, from, id, "stdout", "from.stdout", 0, INT64_MAX, false, &x, &present))
			return false;
		if (present)
			at[0] = (uint64_t)x;
		if (!get_int(c, from, id, "stderr", "from.stderr", 0, INT64_MAX, false, &x, &present))
			return false;
		if (present)
			at[1] = (uint64_t)x;
	} else {
		goto bad;
	}
	for (int i = 0; i < 2; i++) {
		if (at[i] > m->ring[i].end) {
			relay_send_error(
			    c, id, "bad_field", "field 'from': %s offset %llu is past its end (%llu bytes so far)",
			    relay_stream_names[i], (unsigned long long)at[i], (unsigned long long)m->ring[i].end);
			return false;
		}
	}
	return true;
bad:
	relay_send_error(c, id, "bad_field", "field 'from' must be a byte offset or {\"stdout\": N, \"stderr\": N}");
	return false;
}

/* attach: (re)join a command as a streaming subscriber from `from` on. */
static void op_attach(struct client *c, json_t *rq, json_t *id)
{
	struct relay_cmd *m;
	uint64_t at[2];
	struct sub *s;
	int b64;

	if (!(m = want_cmd(c, id, false)) || (b64 = want_b64(c, rq, id)) < 0 || !attach_parse_from(c, rq, id, m, at))
		return;
	s = relay_sub_find(c, m);
	if (!s && !(s = relay_sub_new(c, m, SUB_STREAM))) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return;
	}
	s->mode = SUB_STREAM;
	s->b64 = b64 == 1;
	s->cur[0] = at[0];
	s->cur[1] = at[1];
	s->started_sent = m->has_pid;
	relay_client_send(c, relay_ev_attached(m, id, at));
	relay_cmd_update_pause(m);
}

static void op_status(struct client *c, json_t *rq, json_t *id)
{
	json_t *ev = relay_ev_status(c->r, id);

	(void)rq;
	if (!ev) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return;
	}
	relay_client_send(c, ev);
}

static void op_sync_wait(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	struct pending_sync *ps;
	int rc;

	(void)rq;
	if (c->nsync >= SYNC_PER_CLIENT) {
		relay_send_error(c, id, "busy", "%d sync_wait requests already pending on this connection",
				 SYNC_PER_CLIENT);
		return;
	}
	if (!(ps = mem_calloc(1, sizeof(*ps)))) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return;
	}
	ps->token = ++r->next_token;
	ps->c = c;
	ps->id = id ? json_incref(id) : NULL;
	ps->next = r->syncs;
	r->syncs = ps;
	c->nsync++;
	if ((rc = r->ops->sync_wait(r->ud, ps->token)) < 0) {
		/* relay_sync_done may have run already; find it again */
		for (struct pending_sync **pp = &r->syncs; *pp; pp = &(*pp)->next) {
			if (*pp == ps) {
				*pp = ps->next;
				c->nsync--;
				json_decref(ps->id);
				mem_free(ps);
				break;
			}
		}
		backend_failed(c, id, "sync_wait", rc);
	}
}

/* A request answered later through relay_changes_done; NULL after the
 * error was sent. */
static struct pending_sync *pending_new(struct client *c, json_t *id)
{
	struct relay *r = c->r;
	struct pending_sync *ps;

	if (c->nsync >= SYNC_PER_CLIENT) {
		relay_send_error(c, id, "busy", "%d requests already pending on this connection", SYNC_PER_CLIENT);
		return NULL;
	}
	if (!(ps = mem_calloc(1, sizeof(*ps)))) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return NULL;
	}
	ps->token = ++r->next_token;
	ps->c = c;
	ps->id = id ? json_incref(id) : NULL;
	ps->changes = true;
	ps->next = r->syncs;
	r->syncs = ps;
	c->nsync++;
	return ps;
}

/* "changes", "accept", "reject": {"paths": [...]} (none: every change),
 * "all": true (accept/reject), "diff": true (changes). */
static const char *const changes_fields[] = {"paths", "all", "diff", NULL};
#define CHANGES_PATHS_MAX 65536

static void op_changes(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	const char *op = json_string_value(json_object_get(rq, "op"));
	json_t *paths = json_object_get(rq, "paths");
	const char **pv = NULL;
	struct relay_changes_req q = {.op = op};
	struct pending_sync *ps = NULL;
	size_t i;
	json_t *e;
	int rc;

	if (!r->chg_ops) {
		relay_send_error(c, id, "unavailable", "this relay has no guest changes (not an airlock up daemon)");
		return;
	}
	if (!get_bool(c, rq, id, "all", false, &q.all) || !get_bool(c, rq, id, "diff", false, &q.diff))
		return;
	if (paths && (!json_is_array(paths) || json_array_size(paths) > CHANGES_PATHS_MAX)) {
		relay_send_error(c, id, "bad_field", "field 'paths' must be an array of at most %d paths",
				 CHANGES_PATHS_MAX);
		return;
	}
	if (strcmp(op, "changes") && !q.all && !json_array_size(paths)) {
		relay_send_error(c, id, "missing_field", "%s needs 'paths' or \"all\": true", op);
		return;
	}
	if (q.all && json_array_size(paths)) {
		relay_send_error(c, id, "bad_field", "give 'paths' or \"all\": true, not both");
		return;
	}
	if (c->nsync >= SYNC_PER_CLIENT) { /* before the paths are copied; pending_new checks again */
		relay_send_error(c, id, "busy", "%d requests already pending on this connection", SYNC_PER_CLIENT);
		return;
	}
	if (paths && !(pv = mem_calloc(json_array_size(paths) + 1, sizeof(*pv)))) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return;
	}
	json_array_foreach(paths, i, e)
	{
		if (!plain_string(e) || !valid_cwd(json_string_value(e)) || !json_string_length(e)) {
			relay_send_error(c, id, "bad_field",
					 "paths[%zu] must be a workspace-relative path (no leading '/', no '..')", i);
			mem_free(pv);
			return;
		}
		pv[i] = json_string_value(e);
	}
	q.paths = pv;
	q.npaths = paths ? json_array_size(paths) : 0;
	if (!(ps = pending_new(c, id))) {
		mem_free(pv);
		return;
	}
	rc = r->chg_ops->request(r->chg_ud, ps->token, &q);
	mem_free(pv);
	if (rc < 0)
		relay_changes_done(r, ps->token, NULL, NULL, rc == -EAGAIN ? "busy" : "backend_error", strerror(-rc));
}

void relay_set_changes(struct relay *r, const struct relay_changes_ops *ops, void *ud)
{
	r->chg_ops = ops;
	r->chg_ud = ud;
}

/* "fork": {"count": N} or {"names": [...]}, "ttl_seconds"; "fork_rm":
 * {"names": [...]} or {"all": true}; "forks"; "fork_changes": {"names": [one]}. */
static const char *const fork_fields[] = {"names", "count", "ttl_seconds", "all", NULL};

static bool fork_parse_names(struct client *c, json_t *rq, json_t *id, const char **pv, size_t *n)
{
	json_t *names = json_object_get(rq, "names"), *e;
	size_t i;

	*n = 0;
	if (!names)
		return true;
	if (!json_is_array(names) || json_array_size(names) > RELAY_FORKS_MAX) {
		relay_send_error(c, id, "bad_field", "field 'names' must be an array of at most %d fork names",
				 RELAY_FORKS_MAX);
		return false;
	}
	json_array_foreach(names, i, e)
	{
		if (!plain_string(e) || !relay_fork_name_ok(json_string_value(e))) {
			relay_send_error(c, id, "bad_field",
					 "names[%zu] must be a fork name: 1 to %d of a-z, 0-9, '-' and '_', starting "
					 "with a letter or digit",
					 i, RELAY_FORK_NAME_MAX);
			return false;
		}
		for (size_t k = 0; k < i; k++)
			if (!strcmp(pv[k], json_string_value(e))) {
				relay_send_error(c, id, "bad_field", "names[%zu]: '%s' is given twice", i, pv[k]);
				return false;
			}
		pv[i] = json_string_value(e);
	}
	*n = json_array_size(names);
	return true;
}

static void op_fork(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	const char *op = json_string_value(json_object_get(rq, "op"));
	const char *pv[RELAY_FORKS_MAX + 1] = {0};
	struct relay_fork_req q = {.op = op, .names = pv};
	json_int_t count = 0, ttl = 0;
	bool has_count = false;
	struct pending_sync *ps;
	int rc;

	if (!r->fork_ops) {
		relay_send_error(c, id, "unavailable", "this relay has no sandbox to fork (not an airlock up daemon)");
		return;
	}
	if (!fork_parse_names(c, rq, id, pv, &q.nnames) || !get_bool(c, rq, id, "all", false, &q.all) ||
	    !get_int(c, rq, id, "count", "count", 1, RELAY_FORKS_MAX, false, &count, &has_count) ||
	    !get_int(c, rq, id, "ttl_seconds", "ttl_seconds", 0, 7 * 86400, false, &ttl, NULL))
		return;
	if (!strcmp(op, "fork") && has_count && q.nnames && (size_t)count != q.nnames) {
		relay_send_error(c, id, "bad_field", "'count' is %lld but %zu names are given", (long long)count,
				 q.nnames);
		return;
	}
	if (!strcmp(op, "fork_rm") && q.all == (q.nnames > 0)) {
		relay_send_error(c, id, "missing_field", "fork_rm needs 'names' or \"all\": true (one of them)");
		return;
	}
	if (!strcmp(op, "fork_changes") && q.nnames != 1) {
		relay_send_error(c, id, "missing_field", "fork_changes needs 'names' with exactly one fork");
		return;
	}
	q.count = q.nnames ? (unsigned)q.nnames : has_count ? (unsigned)count : 1;
	q.ttl_s = ttl;
	if (!(ps = pending_new(c, id)))
		return;
	rc = r->fork_ops->request(r->fork_ud, ps->token, &q);
	if (rc < 0)
		relay_changes_done(r, ps->token, NULL, NULL, rc == -EAGAIN ? "busy" : "backend_error", strerror(-rc));
}

/* try: {"variants": [{"name", "patch"?, "argv"?}...], "argv"?, "timeout_seconds"?,
 * "pick"?, "keep"?: [names] | true} (doc/RELAY.md "try"). */
static const char *const try_fields[] = {"variants", "argv", "timeout_seconds", "pick", "keep", NULL};
static const char *const try_variant_fields[] = {"name", "patch", "argv", NULL};

static bool try_name_ok(json_t *v)
{
	const char *s = json_string_value(v);

	if (!plain_string(v) || json_string_length(v) == 0 || json_string_length(v) > RELAY_TRY_NAME_MAX)
		return false;
	for (size_t i = 0; s[i]; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= '0' && s[i] <= '9') ||
		      (i && (s[i] == '-' || s[i] == '_'))))
			return false;
	return true;
}

/* An argv array (1..ARGV_MAX strings, the first non-empty) into out. */
static bool try_argv(struct client *c, json_t *id, json_t *v, const char *label, const char **out, size_t *n)
{
	if (!json_is_array(v) || json_array_size(v) == 0 || json_array_size(v) > ARGV_MAX) {
		relay_send_error(c, id, "bad_field", "field '%s' must be an array of 1 to %d strings", label, ARGV_MAX);
		return false;
	}
	for (size_t i = 0; i < json_array_size(v); i++) {
		json_t *e = json_array_get(v, i);
		if (!plain_string(e) || (i == 0 && json_string_length(e) == 0)) {
			relay_send_error(c, id, "bad_field", "field '%s[%zu]' must be a %sstring without NUL bytes",
					 label, i, i == 0 ? "non-empty " : "");
			return false;
		}
		out[i] = json_string_value(e);
	}
	*n = json_array_size(v);
	return true;
}

struct try_args {
	struct relay_try_req q;
	struct relay_try_variant v[RELAY_TRY_VARIANTS_MAX];
	const char **argv[RELAY_TRY_VARIANTS_MAX + 1]; /* each variant's, then the request's */
	const char *keep[RELAY_TRY_VARIANTS_MAX];
};

static bool try_parse_variant(struct client *c, json_t *id, json_t *jv, size_t i, struct try_args *a)
{
	json_t *name = json_object_get(jv, "name"), *patch = json_object_get(jv, "patch"), *argv;
	const char *k;
	json_t *x;
	char label[48];

	if (!json_is_object(jv)) {
		relay_send_error(c, id, "bad_field", "variants[%zu] must be an object", i);
		return false;
	}
	json_object_foreach(jv, k, x)
	{
		bool ok = false;
		for (const char *const *f = try_variant_fields; *f; f++)
			ok |= !strcmp(k, *f);
		if (!ok) {
			relay_send_error(c, id, "bad_field", "unknown field '%.64s' in variants[%zu]", k, i);
			return false;
		}
	}
	if (!try_name_ok(name)) {
		relay_send_error(
		    c, id, "bad_field",
		    "variants[%zu].name must be 1 to %d of a-z, 0-9, '-' and '_', starting with a letter or digit", i,
		    RELAY_TRY_NAME_MAX);
		return false;
	}
	for (size_t j = 0; j < i; j++)
		if (!strcmp(a->v[j].name, json_string_value(name))) {
			relay_send_error(c, id, "bad_field", "variants[%zu]: the name '%s' is given twice", i,
					 a->v[j].name);
			return false;
		}
	a->v[i].name = json_string_value(name);
	if (patch && (!plain_string(patch) || json_string_length(patch) == 0)) {
		relay_send_error(c, id, "bad_field", "variants[%zu].patch must be a unified diff (text, no NUL bytes)",
				 i);
		return false;
	}
	a->v[i].patch = patch ? json_string_value(patch) : NULL;
	a->v[i].patch_len = patch ? json_string_length(patch) : 0;
	if ((argv = json_object_get(jv, "argv"))) {
		snprintf(label, sizeof(label), "variants[%zu].argv", i);
		if (!(a->argv[i] = mem_calloc(ARGV_MAX + 1, sizeof(char *)))) {
			relay_send_error(c, id, "busy", "relay out of memory");
			return false;
		}
		if (!try_argv(c, id, argv, label, a->argv[i], &a->v[i].argc))
			return false;
		a->v[i].argv = a->argv[i];
	} else if (!a->q.argc) {
		relay_send_error(c, id, "missing_field", "variants[%zu] has no 'argv' and the request none either", i);
		return false;
	}
	return true;
}

static bool try_parse_keep(struct client *c, json_t *id, json_t *keep, struct try_args *a)
{
	if (!keep || json_is_false(keep))
		return true;
	if (json_is_true(keep)) {
		a->q.keep_all = true;
		return true;
	}
	if (!json_is_array(keep) || json_array_size(keep) > a->q.nvariants) {
		relay_send_error(c, id, "bad_field", "field 'keep' must be true or an array of variant names");
		return false;
	}
	for (size_t i = 0; i < json_array_size(keep); i++) {
		json_t *e = json_array_get(keep, i);
		bool found = false;
		for (size_t j = 0; j < a->q.nvariants && plain_string(e); j++)
			found |= !strcmp(a->v[j].name, json_string_value(e));
		if (!found) {
			relay_send_error(c, id, "bad_field", "keep[%zu] is not the name of a variant", i);
			return false;
		}
		a->keep[a->q.nkeep++] = json_string_value(e);
	}
	return true;
}

static bool try_parse(struct client *c, json_t *rq, json_t *id, struct try_args *a)
{
	json_t *vs = json_object_get(rq, "variants"), *argv = json_object_get(rq, "argv"),
	       *pick = json_object_get(rq, "pick"), *t = json_object_get(rq, "timeout_seconds");

	a->q.variants = a->v;
	a->q.keep = a->keep;
	a->q.timeout_ms = (uint64_t)c->r->timeout_s * 1000;
	if (t) {
		double d = json_is_number(t) ? json_number_value(t) : -1;
		if (!(d > 0 && d <= TIMEOUT_MAX_S)) {
			relay_send_error(c, id, "bad_field",
					 "field 'timeout_seconds' must be a number above 0 and at most %.0f",
					 TIMEOUT_MAX_S);
			return false;
		}
		a->q.timeout_ms = (uint64_t)(d * 1000.0 + 0.999);
	}
	if (argv) {
		if (!(a->argv[RELAY_TRY_VARIANTS_MAX] = mem_calloc(ARGV_MAX + 1, sizeof(char *)))) {
			relay_send_error(c, id, "busy", "relay out of memory");
			return false;
		}
		if (!try_argv(c, id, argv, "argv", a->argv[RELAY_TRY_VARIANTS_MAX], &a->q.argc))
			return false;
		a->q.argv = a->argv[RELAY_TRY_VARIANTS_MAX];
	}
	if (!json_is_array(vs) || json_array_size(vs) == 0 || json_array_size(vs) > RELAY_TRY_VARIANTS_MAX) {
		relay_send_error(c, id, vs ? "bad_field" : "missing_field",
				 "field 'variants' must be an array of 1 to %d variants", RELAY_TRY_VARIANTS_MAX);
		return false;
	}
	a->q.nvariants = json_array_size(vs);
	for (size_t i = 0; i < a->q.nvariants; i++)
		if (!try_parse_variant(c, id, json_array_get(vs, i), i, a))
			return false;
	if (pick) {
		bool found = false;
		for (size_t j = 0; j < a->q.nvariants && plain_string(pick); j++)
			found |= !strcmp(a->v[j].name, json_string_value(pick));
		if (!found) {
			relay_send_error(c, id, "bad_field", "field 'pick' must be the name of a variant");
			return false;
		}
		a->q.pick = json_string_value(pick);
	}
	return try_parse_keep(c, id, json_object_get(rq, "keep"), a);
}

static void op_try(struct client *c, json_t *rq, json_t *id)
{
	struct relay *r = c->r;
	struct try_args *a = mem_calloc(1, sizeof(*a));
	struct pending_sync *ps;
	int rc;

	if (!a) {
		relay_send_error(c, id, "busy", "relay out of memory");
		return;
	}
	if (!r->fork_ops || !r->fork_ops->try_start)
		relay_send_error(c, id, "unavailable", "this relay has no sandbox to fork (not an airlock up daemon)");
	else if (try_parse(c, rq, id, a) && (ps = pending_new(c, id)) &&
		 (rc = r->fork_ops->try_start(r->fork_ud, ps->token, &a->q)) < 0)
		relay_changes_done(r, ps->token, NULL, NULL, rc == -EAGAIN ? "busy" : "backend_error", strerror(-rc));
	for (size_t i = 0; i <= RELAY_TRY_VARIANTS_MAX; i++)
		mem_free(a->argv[i]);
	mem_free(a);
}

void relay_set_forks(struct relay *r, const struct relay_fork_ops *ops, void *ud)
{
	r->fork_ops = ops;
	r->fork_ud = ud;
}

static struct pending_sync *take_pending(struct relay *r, uint64_t token, bool changes)
{
	for (struct pending_sync **pp = &r->syncs; *pp; pp = &(*pp)->next) {
		struct pending_sync *ps = *pp;
		if (ps->token != token || ps->changes != changes)
			continue;
		*pp = ps->next;
		if (ps->c)
			ps->c->nsync--;
		return ps;
	}
	return NULL;
}

void relay_changes_done(struct relay *r, uint64_t token, const char *event, const char *body, const char *code,
			const char *message)
{
	struct pending_sync *ps = take_pending(r, token, true);
	json_t *ev = NULL;

	if (!ps)
		return;
	if (ps->c && body) {
		json_t *o = json_loads(body, 0, NULL);
		if (o && json_is_object(o) && (ev = relay_ev_new(event, ps->id))) {
			json_object_update(ev, o);
			json_object_set_new(ev, "event", json_string(event)); /* never the backend's */
			if (ps->id)
				json_object_set(ev, "id", ps->id);
		}
		json_decref(o);
		if (ev)
			relay_client_send(ps->c, ev);
		else
			relay_send_error(ps->c, ps->id, "backend_error", "malformed answer from the backend");
	} else if (ps->c) {
		relay_send_error(ps->c, ps->id, code ? code : "backend_error", "%s", message ? message : "failed");
	}
	if (ps->c)
		relay_client_service(ps->c, false);
	json_decref(ps->id);
	mem_free(ps);
}

int relay_request_event(struct relay *r, uint64_t token, const char *event, const char *body)
{
	json_t *o, *ev;
	int rc = 0;

	for (struct pending_sync *ps = r->syncs; ps; ps = ps->next) {
		if (ps->token != token || !ps->changes)
			continue;
		if (!ps->c)
			return 0;
		if (buf_len(&ps->c->out) > r->queue)
			return -EAGAIN; /* a client that does not keep up: dropped, not queued without bound */
		if (!(o = json_loads(body, 0, NULL)))
			return -EINVAL;
		if (json_is_object(o) && (ev = relay_ev_new(event, ps->id))) {
			json_object_update(ev, o);
			json_object_set_new(ev, "event", json_string(event));
			if (ps->id)
				json_object_set(ev, "id", ps->id);
			relay_client_send(ps->c, ev);
			relay_client_service(ps->c, false);
		} else {
			rc = -ENOMEM;
		}
		json_decref(o);
		return rc;
	}
	return 0;
}

/* The backend -> relay end of sync_wait (relay.h). */
void relay_sync_done(struct relay *r, uint64_t token)
{
	for (struct pending_sync **pp = &r->syncs; *pp; pp = &(*pp)->next) {
		struct pending_sync *ps = *pp;
		if (ps->token != token || ps->changes)
			continue;
		*pp = ps->next;
		if (ps->c) {
			ps->c->nsync--;
			relay_client_send(ps->c, relay_ev_new("synced", ps->id));
			relay_client_service(ps->c, false);
		}
		json_decref(ps->id);
		mem_free(ps);
		return;
	}
}

/* The dispatch table: one row per op. */
static const struct op ops_table[] = {
    {"exec", op_exec, true, exec_fields},	    {"stdin", op_stdin, true, stdin_fields},
    {"signal", op_signal, true, signal_fields},	    {"resize", op_resize, true, resize_fields},
    {"cancel", op_cancel, true, no_fields},	    {"attach", op_attach, true, attach_fields},
    {"status", op_status, false, no_fields},	    {"sync_wait", op_sync_wait, false, no_fields},
    {"changes", op_changes, false, changes_fields}, {"accept", op_changes, false, changes_fields},
    {"reject", op_changes, false, changes_fields},  {"fork", op_fork, false, fork_fields},
    {"fork_rm", op_fork, false, fork_fields},	    {"forks", op_fork, false, fork_fields},
    {"fork_changes", op_fork, false, fork_fields},  {"try", op_try, true, try_fields},
};

void relay_handle_line(struct client *c, const char *p, size_t n)
{
	json_error_t jerr;
	json_t *rq, *id, *op;
	size_t i = 0;

	while (i < n && (p[i] == ' ' || p[i] == '\t' || p[i] == '\r'))
		i++;
	if (i == n)
		return; /* blank lines are allowed (keep-alives, hand typing) */
	rq = json_loadb(p, n, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY | JSON_ALLOW_NUL, &jerr);
	if (!rq) {
		relay_send_error(c, NULL, "bad_json", "not valid JSON at column %d: %s", jerr.column, jerr.text);
		return;
	}
	if (!json_is_object(rq)) {
		relay_send_error(c, NULL, "bad_json", "a request must be a JSON object");
		goto out;
	}
	id = json_object_get(rq, "id");
	if (id && !json_is_integer(id) &&
	    !(plain_string(id) && json_string_length(id) > 0 && json_string_length(id) <= ID_MAX)) {
		relay_send_error(c, NULL, "bad_field", "field 'id' must be an integer or a string of 1 to %d bytes",
				 ID_MAX);
		goto out;
	}
	op = json_object_get(rq, "op");
	if (!op) {
		relay_send_error(c, id, "missing_field", "field 'op' is required");
		goto out;
	}
	if (!json_is_string(op)) {
		relay_send_error(c, id, "bad_field", "field 'op' must be a string");
		goto out;
	}
	for (size_t k = 0; k < sizeof(ops_table) / sizeof(ops_table[0]); k++) {
		const struct op *o = &ops_table[k];
		if (strcmp(json_string_value(op), o->name))
			continue;
		if (o->id_required && !id) {
			relay_send_error(c, NULL, "missing_field", "field 'id' is required for op '%s'", o->name);
			goto out;
		}
		if (check_fields(c, rq, id, o))
			o->fn(c, rq, id);
		goto out;
	}
	relay_send_error(c, id, "unknown_op",
			 "unknown op '%.64s' (exec, stdin, signal, resize, cancel, attach, status, sync_wait, changes, "
			 "accept, reject, fork, fork_rm, forks, fork_changes, try)",
			 json_string_value(op));
out:
	json_decref(rq);
}
