/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cmd: the relay's commands. Global to the relay (keyed by the compact
 * JSON of their request id), not to the client that started them, so they
 * outlive it; kept in creation order, the finished ones bounded by
 * keep_finished (housekeeping in relay.c). The backend -> relay calls of
 * relay.h land here.
 */
#include <errno.h>
#include <string.h>
#include <time.h>

#include "airlock/core/mem.h"
#include "server_i.h"

#define STATUS_ARGV_BYTES 1024 /* argv kept for `status` */

static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

bool relay_cmd_ended(const struct relay_cmd *m)
{
	return m->state == CMD_EXITED || m->state == CMD_FAILED;
}

struct relay_cmd *relay_cmd_find(struct relay *r, const char *key)
{
	for (struct relay_cmd *m = r->cmds; m; m = m->next)
		if (!strcmp(m->key, key))
			return m;
	return NULL;
}

/* Trimmed argv for status: at most STATUS_ARGV_BYTES of text. */
static json_t *argv_for_status(const char *const *argv, size_t argc)
{
	json_t *a = json_array();
	size_t used = 0;

	for (size_t i = 0; a && i < argc && used < STATUS_ARGV_BYTES; i++) {
		size_t n = strlen(argv[i]);
		if (n > STATUS_ARGV_BYTES - used)
			n = relay_utf8_cut((const uint8_t *)argv[i], STATUS_ARGV_BYTES - used);
		json_array_append_new(a, json_stringn(argv[i], n));
		used += n;
	}
	return a;
}

struct relay_cmd *relay_cmd_new(struct relay *r, char *key, json_t *id, const struct relay_exec_req *req)
{
	struct relay_cmd *m = mem_calloc(1, sizeof(*m));

	if (!m)
		return NULL;
	m->r = r;
	m->key = key;
	m->id = json_incref(id);
	m->argv = argv_for_status(req->argv, req->argc);
	m->shell = req->shell;
	m->tty = req->tty;
	m->stdin_open = req->stdin_open;
	m->state = CMD_STARTING;
	m->started_wall_ms = wall_ms();
	m->start_ms = loop_now_ms();
	relay_ring_init(&m->ring[0], r->ring_bytes);
	relay_ring_init(&m->ring[1], r->ring_bytes);
	m->prev = r->cmds_tail;
	if (r->cmds_tail)
		r->cmds_tail->next = m;
	else
		r->cmds = m;
	r->cmds_tail = m;
	r->nrunning++;
	return m;
}

void relay_cmd_free(struct relay_cmd *m)
{
	struct relay *r = m->r;

	while (m->subs)
		relay_sub_free(m->subs);
	if (m->prev)
		m->prev->next = m->next;
	else if (r->cmds == m)
		r->cmds = m->next;
	if (m->next)
		m->next->prev = m->prev;
	else if (r->cmds_tail == m)
		r->cmds_tail = m->prev;
	if (relay_cmd_ended(m))
		r->nfinished--;
	else
		r->nrunning--;
	relay_ring_clear(&m->ring[0]);
	relay_ring_clear(&m->ring[1]);
	json_decref(m->id);
	json_decref(m->argv);
	mem_free(m->key);
	mem_free(m->err_code);
	mem_free(m->err_msg);
	mem_free(m);
}

void relay_cmd_orphan(struct relay *r, struct client *c)
{
	for (struct relay_cmd *m = r->cmds; m; m = m->next) {
		if (m->owner != c)
			continue;
		m->owner = NULL;
		m->cancel_due = m->live;
	}
}

bool relay_cmd_cancel_due(struct relay *r)
{
	bool left = false;

	/* ops->cancel may end the command (relay_cmd_error from inside), never
	 * free it: frees are housekeeping's, which calls us */
	for (struct relay_cmd *m = r->cmds; m; m = m->next) {
		if (!m->cancel_due)
			continue;
		m->cancel_due = false;
		if (m->live && r->ops->cancel(r->ud, m) == -EAGAIN)
			left = m->cancel_due = true;
	}
	return left;
}

/* ------------------------------------------------------------------ */
/* backend -> relay */

static void cmd_service_subs(struct relay_cmd *m, bool stream_only)
{
	/* Servicing a client only removes that client's subs, and a client has
	 * at most one sub per command, so `next` stays valid. */
	for (struct sub *s = m->subs, *next; s; s = next) {
		next = s->mnext;
		if (!stream_only || s->mode == SUB_STREAM)
			relay_client_service(s->c, false);
	}
}

void relay_cmd_started(struct relay_cmd *m, int64_t pid)
{
	if (!m->live || m->has_pid)
		return;
	m->pid = pid;
	m->has_pid = true;
	if (m->state == CMD_STARTING)
		m->state = CMD_RUNNING;
	cmd_service_subs(m, false);
}

void relay_cmd_started_host(struct relay_cmd *m, int64_t pid)
{
	if (!m->live || m->has_pid)
		return;
	m->on_host = true;
	relay_cmd_started(m, pid);
}

void relay_cmd_output(struct relay_cmd *m, enum relay_stream st, const void *data, size_t n)
{
	if (!m->live || (st != RELAY_STDOUT && st != RELAY_STDERR))
		return;
	relay_ring_append(&m->ring[st], data, n);
	if (m->watch)
		m->watch->output(m->watch_ud, st, data, n);
	relay_cmd_update_pause(m);
	cmd_service_subs(m, true);
}

static void cmd_end(struct relay_cmd *m)
{
	struct relay *r = m->r;
	const struct relay_cmd_watch *w = m->watch;

	m->watch = NULL;
	if (w)
		w->ended(m->watch_ud, m->state == CMD_EXITED ? &m->ex : NULL, m->err_code, m->err_msg);

	m->live = false;
	/* The backend is done with it: nothing is held back any more. */
	m->pause_told = false;
	m->end_ms = loop_now_ms();
	r->nrunning--;
	r->nfinished++;
	relay_cmd_update_pause(m);
	cmd_service_subs(m, false);
	relay_kick(r);
}

void relay_cmd_exit(struct relay_cmd *m, const struct relay_exit *ex)
{
	if (!m->live)
		return;
	m->ex = *ex;
	m->state = CMD_EXITED;
	cmd_end(m);
}

void relay_cmd_error(struct relay_cmd *m, const char *code, const char *message)
{
	if (!m->live)
		return;
	m->err_code = mem_strdup(code ? code : "backend_error");
	m->err_msg = mem_strdup(message ? message : "command failed");
	m->state = CMD_FAILED;
	cmd_end(m);
}

void relay_cmd_set_data(struct relay_cmd *m, void *data)
{
	m->data = data;
}

void *relay_cmd_data(const struct relay_cmd *m)
{
	return m->data;
}

const char *relay_cmd_name(const struct relay_cmd *m)
{
	return m->key;
}

int relay_cmd_spawn(struct relay *r, const char *id, const struct relay_exec_req *req, const struct relay_cmd_watch *w,
		    void *ud, struct relay_cmd **out)
{
	json_t *jid = json_string(id);
	char *key = jid ? json_dumps(jid, JSON_COMPACT | JSON_ENCODE_ANY) : NULL; /* mem_alloc'd (mem.c) */
	struct relay_cmd *m = NULL;
	int rc = 0;

	if (!key)
		rc = -ENOMEM;
	else if ((m = relay_cmd_find(r, key)) && !relay_cmd_ended(m))
		rc = -EEXIST;
	else if (r->nrunning >= r->max_running)
		rc = -EAGAIN;
	if (rc == 0 && m)
		relay_cmd_free(m); /* a finished command of that id is forgotten, as for exec */
	if (rc == 0 && !(m = relay_cmd_new(r, key, jid, req)))
		rc = -ENOMEM;
	json_decref(jid);
	if (rc < 0) {
		mem_free(key);
		return rc;
	}
	m->watch = w;
	m->watch_ud = ud;
	m->live = true;
	*out = m; /* before exec_start: ended may come from inside it */
	if ((rc = r->ops->exec_start(r->ud, m, req)) < 0) {
		*out = NULL;
		m->live = false;
		m->watch = NULL;
		relay_cmd_free(m);
	}
	return rc;
}

void relay_cmd_unwatch(struct relay_cmd *m)
{
	m->watch = NULL;
}
