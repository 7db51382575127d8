/* SPDX-License-Identifier: Apache-2.0 */
/*
 * events: how each event the relay sends is encoded (doc/RELAY.md
 * "Events"). Builders return a new JSON object, or NULL when out of
 * memory; relay_client_send queues it. The field order of each event is
 * its order on the wire. The output event with base64 data is the one
 * made without a JSON tree (relay_client_send_b64 in client.c).
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "server_i.h"

const char *const relay_state_names[] = {"starting", "running", "exited", "failed"};
const char *const relay_stream_names[] = {"stdout", "stderr"};

/* ------------------------------------------------------------------ */
/* encoding helpers */

size_t relay_utf8_cut(const uint8_t *p, size_t n)
{
	for (size_t back = 1; back <= 4 && back <= n; back++) {
		uint8_t b = p[n - back];
		if ((b & 0xc0) == 0x80)
			continue;
		size_t need = b < 0x80		   ? 1
			      : (b & 0xe0) == 0xc0 ? 2
			      : (b & 0xf0) == 0xe0 ? 3
			      : (b & 0xf8) == 0xf0 ? 4
						   : 1;
		if (need > back && n - back > 0)
			return n - back;
		return n;
	}
	return n;
}

void relay_put_data(json_t *o, const char *field, const uint8_t *p, size_t n)
{
	json_t *s = json_stringn((const char *)p, n);
	char name[32];

	if (s) {
		json_object_set_new(o, field, s);
		return;
	}
	size_t blen = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);
	char *b = mem_alloc(blen);
	if (!b)
		return;
	sodium_bin2base64(b, blen, p, n, sodium_base64_VARIANT_ORIGINAL);
	snprintf(name, sizeof(name), "%s_b64", field);
	json_object_set_new(o, name, json_string(b));
	mem_free(b);
}

json_t *relay_ev_new(const char *name, json_t *id)
{
	json_t *o = json_object();

	if (!o)
		return NULL;
	json_object_set_new(o, "event", json_string(name));
	if (id)
		json_object_set(o, "id", id);
	return o;
}

/* ------------------------------------------------------------------ */
/* replies to requests */

void relay_send_error(struct client *c, json_t *id, const char *code, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *ev = relay_ev_new("error", id);

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	if (ev) {
		json_object_set_new(ev, "code", json_string(code));
		json_object_set_new(ev, "message", json_string(msg));
	}
	relay_client_send(c, ev);
}

void relay_send_ok(struct client *c, json_t *id, const char *op)
{
	json_t *ev = relay_ev_new("ok", id);

	if (ev)
		json_object_set_new(ev, "op", json_string(op));
	relay_client_send(c, ev);
}

json_t *relay_ev_hello(const struct relay *r)
{
	json_t *hello = relay_ev_new("hello", NULL);

	if (hello) {
		json_object_set_new(hello, "protocol", json_integer(RELAY_PROTOCOL_VERSION));
		json_object_set_new(hello, "server", json_string("airlock-relay/" AIRLOCK_VERSION));
		json_object_set_new(hello, "line_max", json_integer((json_int_t)r->line_max));
		json_object_set_new(hello, "ring_bytes", json_integer((json_int_t)r->ring_bytes));
	}
	return hello;
}

json_t *relay_ev_attached(const struct relay_cmd *m, json_t *id, const uint64_t at[2])
{
	json_t *ev = relay_ev_new("attached", id);

	if (ev) {
		json_object_set_new(ev, "state", json_string(relay_state_names[m->state]));
		json_object_set_new(ev, "pid", m->has_pid ? json_integer((json_int_t)m->pid) : json_null());
		json_object_set_new(ev, "stdout_offset", json_integer((json_int_t)at[0]));
		json_object_set_new(ev, "stderr_offset", json_integer((json_int_t)at[1]));
	}
	return ev;
}

/* One command's entry in `status`. */
static json_t *status_entry(const struct relay_cmd *m)
{
	json_t *o = json_object();
	size_t nsubs = 0;

	if (!o)
		return NULL;
	for (struct sub *s = m->subs; s; s = s->mnext)
		nsubs++;
	json_object_set(o, "id", m->id);
	json_object_set(o, "argv", m->argv);
	json_object_set_new(o, "shell", json_boolean(m->shell));
	json_object_set_new(o, "state", json_string(relay_state_names[m->state]));
	json_object_set_new(o, "pid", m->has_pid ? json_integer((json_int_t)m->pid) : json_null());
	json_object_set_new(o, "where", json_string(m->on_host ? "host" : "guest"));
	json_object_set_new(o, "started_ms", json_integer((json_int_t)m->started_wall_ms));
	json_object_set_new(o, "stdout_bytes", json_integer((json_int_t)m->ring[0].end));
	json_object_set_new(o, "stderr_bytes", json_integer((json_int_t)m->ring[1].end));
	json_object_set_new(o, "attached", json_integer((json_int_t)nsubs));
	json_object_set_new(o, "paused", json_boolean(m->pause_told));
	if (m->state == CMD_EXITED) {
		json_object_set_new(o, "code", m->ex.code >= 0 ? json_integer(m->ex.code) : json_null());
		json_object_set_new(o, "signal", m->ex.signal ? json_integer(m->ex.signal) : json_null());
		json_object_set_new(o, "timed_out", json_boolean(m->ex.timed_out));
		json_object_set_new(o, "duration_ms", json_integer((json_int_t)m->ex.duration_ms));
	} else if (m->state == CMD_FAILED) {
		json_object_set_new(o, "error", json_string(m->err_code ? m->err_code : "backend_error"));
	}
	return o;
}

json_t *relay_ev_status(const struct relay *r, json_t *id)
{
	json_t *ev = relay_ev_new("status", id), *list = json_array();

	if (!ev || !list) {
		json_decref(ev);
		json_decref(list);
		return NULL;
	}
	for (const struct relay_cmd *m = r->cmds; m; m = m->next) {
		json_t *o = status_entry(m);
		if (o)
			json_array_append_new(list, o);
	}
	json_object_set_new(ev, "commands", list);
	return ev;
}

/* ------------------------------------------------------------------ */
/* a command's events */

json_t *relay_ev_started(const struct relay_cmd *m)
{
	json_t *ev = relay_ev_new("started", m->id);

	if (ev) {
		json_object_set_new(ev, "pid", json_integer((json_int_t)m->pid));
		json_object_set_new(ev, "where", json_string(m->on_host ? "host" : "guest"));
	}
	return ev;
}

json_t *relay_ev_dropped(const struct relay_cmd *m, int stream, uint64_t off, uint64_t bytes)
{
	json_t *ev = relay_ev_new("dropped", m->id);

	if (ev) {
		json_object_set_new(ev, "stream", json_string(relay_stream_names[stream]));
		json_object_set_new(ev, "offset", json_integer((json_int_t)off));
		json_object_set_new(ev, "bytes", json_integer((json_int_t)bytes));
	}
	return ev;
}

json_t *relay_ev_output(const struct relay_cmd *m, int stream, uint64_t off, const uint8_t *p, size_t n)
{
	json_t *ev = relay_ev_new(relay_stream_names[stream], m->id);

	if (ev) {
		json_object_set_new(ev, "offset", json_integer((json_int_t)off));
		relay_put_data(ev, "data", p, n);
	}
	return ev;
}

json_t *relay_ev_failed(const struct relay_cmd *m)
{
	json_t *ev = relay_ev_new("error", m->id);

	if (ev) {
		json_object_set_new(ev, "code", json_string(m->err_code ? m->err_code : "backend_error"));
		json_object_set_new(ev, "message", json_string(m->err_msg ? m->err_msg : "command failed"));
	}
	return ev;
}

/* The last `want` bytes of ring g into ev as `name` (text when valid
 * UTF-8, else name_b64) and name_truncated. false when out of memory. */
static bool put_tail(json_t *ev, const char *name, const struct ring *g, size_t want)
{
	size_t take = want < g->len ? want : g->len;
	uint8_t *tmp = mem_alloc(take + 1);
	char tname[32];

	if (!tmp)
		return false;
	if (take)
		relay_ring_read(g, g->end - take, tmp, take);
	bool trunc = take < g->end;
	size_t skip = 0;
	/* A cut through a multi-byte character would force base64
	 * for otherwise text output: start at the next character. */
	while (trunc && skip < 3 && skip < take && (tmp[skip] & 0xc0) == 0x80)
		skip++;
	json_t *probe = json_stringn((const char *)tmp + skip, take - skip);
	if (probe)
		json_object_set_new(ev, name, probe);
	else
		relay_put_data(ev, name, tmp, take);
	snprintf(tname, sizeof(tname), "%s_truncated", name);
	json_object_set_new(ev, tname, json_boolean(trunc));
	mem_free(tmp);
	return true;
}

json_t *relay_ev_exit(const struct sub *s)
{
	const struct relay_cmd *m = s->cmd;
	json_t *ev = relay_ev_new(s->mode == SUB_TAIL ? "result" : "exit", m->id);

	if (!ev)
		return NULL;
	json_object_set_new(ev, "code", m->ex.code >= 0 ? json_integer(m->ex.code) : json_null());
	json_object_set_new(ev, "signal", m->ex.signal ? json_integer(m->ex.signal) : json_null());
	json_object_set_new(ev, "timed_out", json_boolean(m->ex.timed_out));
	json_object_set_new(ev, "duration_ms", json_integer((json_int_t)m->ex.duration_ms));
	json_object_set_new(ev, "stdout_bytes", json_integer((json_int_t)m->ring[0].end));
	json_object_set_new(ev, "stderr_bytes", json_integer((json_int_t)m->ring[1].end));
	if (m->ex.changes)
		json_object_set_new(ev, "changes",
				    json_pack("{s:I, s:I}", "written_back", (json_int_t)m->ex.written_back, "waiting",
					      (json_int_t)m->ex.waiting));
	if (s->mode == SUB_STREAM) {
		json_object_set_new(ev, "truncated", json_boolean(s->truncated));
		return ev;
	}
	for (int i = 0; i < 2; i++) {
		if (!put_tail(ev, relay_stream_names[i], &m->ring[i], s->tail[i])) {
			json_decref(ev);
			return NULL;
		}
	}
	return ev;
}
