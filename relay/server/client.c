/* SPDX-License-Identifier: Apache-2.0 */
/*
 * client: one connection to the relay. Reads request lines (at most
 * line_max bytes each; longer ones are answered with line_too_long and
 * discarded), hands them to ops.c, queues events in its output queue and
 * writes them out without blocking.
 *
 * Back-pressure: events are produced from the rings (ring.c) only while
 * the output queue is below client_queue bytes, and request lines wait
 * while it is full; EPOLLIN is dropped while the queue is full or a line
 * is being collected past line_max. A client that never reads costs one
 * queue (plus OUT_HARD_EXTRA of direct replies before we give up on it).
 */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "server_i.h"

#define READ_CHUNK     ((size_t)64 << 10)
#define OUT_HARD_EXTRA ((size_t)4 << 20) /* replies beyond client_queue before we give up on a client */
#define SERVICE_ROUNDS 64

/* ------------------------------------------------------------------ */
/* sending */

void relay_client_fail(struct client *c)
{
	if (!c->dead) {
		c->dead = true;
		relay_kick(c->r);
	}
}

void relay_client_send(struct client *c, json_t *ev)
{
	char *s;

	if (!ev)
		return;
	if (c->dead) {
		json_decref(ev);
		return;
	}
	s = json_dumps(ev, JSON_COMPACT);
	json_decref(ev);
	if (!s) {
		relay_client_fail(c);
		return;
	}
	size_t n = strlen(s);
	if (buf_put(&c->out, s, n) < 0 || buf_put_u8(&c->out, '\n') < 0)
		relay_client_fail(c); /* a client that never reads but keeps asking */
	else
		c->produced += n + 1;
	mem_free(s);
}

/* The fixed shape {"event":S,"id":ID,"offset":N,"data_b64":"..."} (ID
 * encoded by jansson; base64 needs no escaping), without a JSON tree.
 * Same queueing as relay_client_send. */
void relay_client_send_b64(struct client *c, const char *stream, json_t *id, uint64_t off, const uint8_t *p, size_t n)
{
	char head[96];
	char *ids = NULL, *b = NULL;
	size_t blen = sodium_base64_ENCODED_LEN(n, sodium_base64_VARIANT_ORIGINAL);

	if (c->dead)
		return;
	if (!(ids = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY)) || !(b = mem_alloc(blen))) {
		mem_free(ids);
		relay_client_fail(c);
		return;
	}
	sodium_bin2base64(b, blen, p, n, sodium_base64_VARIANT_ORIGINAL);
	int hn = snprintf(head, sizeof(head), "{\"event\":\"%s\",\"id\":", stream);
	char mid[64];
	int mn = snprintf(mid, sizeof(mid), ",\"offset\":%llu,\"data_b64\":\"", (unsigned long long)off);
	size_t idn = strlen(ids), bn = strlen(b);
	if (buf_put(&c->out, head, (size_t)hn) < 0 || buf_put(&c->out, ids, idn) < 0 ||
	    buf_put(&c->out, mid, (size_t)mn) < 0 || buf_put(&c->out, b, bn) < 0 || buf_put(&c->out, "\"}\n", 3) < 0)
		relay_client_fail(c);
	else
		c->produced += (size_t)hn + idn + (size_t)mn + bn + 3;
	mem_free(ids);
	mem_free(b);
}

/* Produce events from c's subscriptions while its queue has room. */
static void client_pump(struct client *c)
{
	bool progress = true;

	while (progress && !c->dead && buf_len(&c->out) < c->r->queue) {
		progress = false;
		for (struct sub *s = c->subs, *next; s && !c->dead; s = next) {
			next = s->cnext;
			if (relay_sub_step(s))
				progress = true;
			if (buf_len(&c->out) >= c->r->queue)
				break;
		}
	}
}

/* ------------------------------------------------------------------ */
/* I/O */

static void client_update_events(struct client *c)
{
	uint32_t ev = 0;

	if (c->dead)
		return;
	if (!c->rd_eof && buf_len(&c->out) < c->r->queue && buf_len(&c->in) <= c->r->line_max)
		ev |= EPOLLIN;
	if (buf_len(&c->out) || (c->in_pending && buf_len(&c->out) < c->r->queue))
		ev |= EPOLLOUT; /* a writable socket calls us back to go on */
	if (ev != c->events && loop_mod_fd(c->r->l, c->fd, ev) == 0)
		c->events = ev;
}

static void client_flush(struct client *c)
{
	while (!c->dead && buf_len(&c->out)) {
		ssize_t n = send(c->fd, buf_ptr(&c->out), buf_len(&c->out), MSG_NOSIGNAL | MSG_DONTWAIT);
		if (n > 0) {
			buf_consume(&c->out, (size_t)n);
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		relay_client_fail(c);
	}
	if (!buf_len(&c->out))
		buf_reset(&c->out);
}

static void client_process_input(struct client *c)
{
	struct relay *r = c->r;

	if (c->in_busy)
		return; /* re-entered from a backend call made by a handler */
	c->in_busy = true;
	while (!c->dead && buf_len(&c->out) < r->queue && buf_len(&c->in)) {
		const char *p = (const char *)buf_ptr(&c->in);
		size_t n = buf_len(&c->in);
		const char *nl = memchr(p, '\n', n);

		if (!nl) {
			if (c->discarding) {
				buf_consume(&c->in, n);
			} else if (n > r->line_max) {
				relay_send_error(c, NULL, "line_too_long",
						 "request line longer than %zu bytes; the rest of it is discarded",
						 r->line_max);
				c->discarding = true;
				buf_consume(&c->in, n);
			}
			break;
		}
		size_t len = (size_t)(nl - p);
		if (c->discarding)
			c->discarding = false;
		else if (len > r->line_max)
			relay_send_error(c, NULL, "line_too_long", "request line of %zu bytes is longer than %zu bytes",
					 len, r->line_max);
		else
			relay_handle_line(c, p, len);
		buf_consume(&c->in, len + 1);
	}
	c->in_pending = buf_len(&c->in) && memchr(buf_ptr(&c->in), '\n', buf_len(&c->in));
	if (!buf_len(&c->in))
		buf_reset(&c->in);
	c->in_busy = false;
}

/* Requests are only handled from the client's own fd callback (input =
 * true), never from inside a backend call.
 *
 * What must hold when this returns: either the output queue is not empty
 * (and EPOLLOUT will call us back), or the pump ran with room in the queue
 * and found nothing to send. Hence the flush *before* the pump: a round
 * that starts with a full queue, which the pump leaves alone, and whose
 * flush then empties it completely would otherwise end with output still
 * waiting in the rings and nothing to wake us. With a paused command that
 * wait is for ever (nothing new arrives to kick the pump): the stall after
 * a slow reader drained its socket in one go. */
void relay_client_service(struct client *c, bool input)
{
	int i;

	if (c->in_busy)
		return; /* inside one of c's requests: its own service loop goes on after it */
	for (i = 0; i < SERVICE_ROUNDS && !c->dead; i++) {
		uint64_t before = c->produced;
		client_flush(c);
		if (input)
			client_process_input(c);
		client_pump(c);
		client_flush(c);
		if (buf_len(&c->out) || c->produced == before)
			break;
	}
	client_update_events(c);
	if (i == SERVICE_ROUNDS && !c->dead && !(c->events & EPOLLOUT)) {
		/* More may be pending: let the (writable) socket call us back. */
		if (loop_mod_fd(c->r->l, c->fd, c->events | EPOLLOUT) == 0)
			c->events |= EPOLLOUT;
	}
}

static void client_read(struct client *c)
{
	uint8_t *p;
	ssize_t n;

	if (buf_reserve(&c->in, READ_CHUNK, &p) < 0)
		return; /* full: input is processed first */
	n = recv(c->fd, p, READ_CHUNK, MSG_DONTWAIT);
	if (n > 0) {
		buf_commit(&c->in, (size_t)n);
	} else if (n == 0) {
		c->rd_eof = true;
		/* A last line without '\n' still counts. */
		if (buf_len(&c->in) && !c->discarding)
			buf_put_u8(&c->in, '\n');
	} else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
		relay_client_fail(c);
	}
}

static void client_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct client *c = ud;

	(void)l;
	(void)fd;
	if (c->dead)
		return;
	if (events & EPOLLIN)
		client_read(c);
	relay_client_service(c, true);
	if ((events & EPOLLERR) || ((events & EPOLLHUP) && !(events & EPOLLIN)) || ((events & EPOLLHUP) && c->rd_eof))
		relay_client_fail(c);
}

/* ------------------------------------------------------------------ */
/* lifecycle */

void relay_client_new(struct relay *r, int fd)
{
	struct client *c;

	if (!(c = mem_calloc(1, sizeof(*c)))) {
		relay_refuse(fd, "busy", "relay out of memory");
		return;
	}
	c->r = r;
	c->fd = fd;
	buf_init(&c->in, r->line_max + READ_CHUNK + 1);
	buf_init(&c->out, r->queue + OUT_HARD_EXTRA);
	if (loop_add_fd(r->l, fd, EPOLLIN, client_cb, c) < 0) {
		mem_free(c);
		relay_refuse(fd, "busy", "relay cannot watch more connections");
		return;
	}
	c->events = EPOLLIN;
	c->next = r->clients;
	if (r->clients)
		r->clients->prev = c;
	r->clients = c;
	r->nclients++;
	relay_client_send(c, relay_ev_hello(r));
	relay_client_service(c, false);
}

void relay_client_free(struct client *c)
{
	struct relay *r = c->r;

	while (c->subs)
		relay_sub_free(c->subs);
	relay_cmd_orphan(r, c);
	for (struct pending_sync *ps = r->syncs; ps; ps = ps->next)
		if (ps->c == c)
			ps->c = NULL;
	if (c->fd >= 0) {
		loop_del_fd(r->l, c->fd);
		close(c->fd);
	}
	if (c->prev)
		c->prev->next = c->next;
	else
		r->clients = c->next;
	if (c->next)
		c->next->prev = c->prev;
	r->nclients--;
	buf_clear(&c->in);
	buf_clear(&c->out);
	mem_free(c);
}
