/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ring: each command's output, per stream, and the subscriptions that read
 * it (relay.c has the shape: pull, not push).
 *
 * A ring keeps the last ring_bytes bytes of a stream; offsets are absolute
 * byte counts since the command started. A subscription holds a read
 * cursor per stream: streaming subscribers (exec, attach) get the bytes
 * from their cursor on, in OUT_CHUNK events, and a `dropped` event for
 * whatever fell out of the ring before they read it (replay for attach);
 * tail subscribers get one `result` with the last bytes when the command
 * ends. The lag of the streaming subscribers decides whether the command
 * is paused.
 */
#include <string.h>

#include "airlock/core/mem.h"
#include "server_i.h"

/* ------------------------------------------------------------------ */
/* ring */

void relay_ring_init(struct ring *g, size_t max)
{
	memset(g, 0, sizeof(*g));
	g->max = max;
}

void relay_ring_clear(struct ring *g)
{
	mem_free(g->p);
	g->p = NULL;
	g->cap = g->len = 0;
}

uint64_t relay_ring_start(const struct ring *g)
{
	return g->end - g->len;
}

static void ring_put_at(uint8_t *p, size_t cap, uint64_t off, const uint8_t *src, size_t n)
{
	size_t at = (size_t)(off % cap);
	size_t first = cap - at < n ? cap - at : n;

	memcpy(p + at, src, first);
	memcpy(p, src + first, n - first);
}

void relay_ring_read(const struct ring *g, uint64_t off, uint8_t *dst, size_t n)
{
	size_t at = (size_t)(off % g->cap);
	size_t first = g->cap - at < n ? g->cap - at : n;

	memcpy(dst, g->p + at, first);
	memcpy(dst + first, g->p, n - first);
}

/* Grow g towards room for n more bytes (doubling, at most max). On failure
 * keep the old size: older bytes get overwritten sooner. */
static void ring_grow(struct ring *g, size_t n)
{
	size_t want = g->cap ? g->cap : 4096;

	while (want < g->len + n && want < g->max)
		want *= 2;
	if (want > g->max)
		want = g->max;
	uint8_t *np = mem_alloc(want);
	if (!np)
		return;
	/* Re-place the kept bytes at their new positions. */
	uint64_t s = relay_ring_start(g);
	size_t done = 0;
	while (done < g->len) {
		size_t k = g->len - done < OUT_CHUNK ? g->len - done : OUT_CHUNK;
		uint8_t tmp[256];
		for (size_t i = 0; i < k; i += sizeof(tmp)) {
			size_t m = k - i < sizeof(tmp) ? k - i : sizeof(tmp);
			relay_ring_read(g, s + done + i, tmp, m);
			ring_put_at(np, want, s + done + i, tmp, m);
		}
		done += k;
	}
	mem_free(g->p);
	g->p = np;
	g->cap = want;
}

void relay_ring_append(struct ring *g, const uint8_t *src, size_t n)
{
	if (n == 0 || g->max == 0)
		return;
	if (g->len + n > g->cap && g->cap < g->max)
		ring_grow(g, n);
	if (g->cap == 0) {
		g->end += n; /* nothing kept */
		return;
	}
	if (n >= g->cap) {
		src += n - g->cap;
		g->end += n - g->cap;
		n = g->cap;
	}
	ring_put_at(g->p, g->cap, g->end, src, n);
	g->end += n;
	g->len = g->len + n > g->cap ? g->cap : g->len + n;
}

/* ------------------------------------------------------------------ */
/* subscriptions */

void relay_cmd_update_pause(struct relay_cmd *m)
{
	uint64_t lag = 0;
	size_t hi = m->r->ring_bytes / 2, lo = m->r->ring_bytes / 4;

	for (struct sub *s = m->subs; s; s = s->mnext) {
		if (s->mode != SUB_STREAM)
			continue;
		for (int i = 0; i < 2; i++) {
			uint64_t d = m->ring[i].end > s->cur[i] ? m->ring[i].end - s->cur[i] : 0;
			if (d > lag)
				lag = d;
		}
	}
	bool want = m->pause_want ? lag > lo : lag > hi;
	if (relay_cmd_ended(m))
		want = false;
	if (want != m->pause_want) {
		m->pause_want = want;
		relay_kick(m->r);
	}
}

struct sub *relay_sub_find(struct client *c, struct relay_cmd *m)
{
	for (struct sub *s = c->subs; s; s = s->cnext)
		if (s->cmd == m)
			return s;
	return NULL;
}

struct sub *relay_sub_new(struct client *c, struct relay_cmd *m, enum sub_mode mode)
{
	struct sub *s = mem_calloc(1, sizeof(*s));

	if (!s)
		return NULL;
	s->c = c;
	s->cmd = m;
	s->mode = mode;
	s->cnext = c->subs;
	if (c->subs)
		c->subs->cprev = s;
	c->subs = s;
	s->mnext = m->subs;
	if (m->subs)
		m->subs->mprev = s;
	m->subs = s;
	return s;
}

void relay_sub_free(struct sub *s)
{
	if (!s)
		return;
	if (s->cprev)
		s->cprev->cnext = s->cnext;
	else
		s->c->subs = s->cnext;
	if (s->cnext)
		s->cnext->cprev = s->cprev;
	if (s->mprev)
		s->mprev->mnext = s->mnext;
	else
		s->cmd->subs = s->mnext;
	if (s->mnext)
		s->mnext->mprev = s->mprev;
	struct relay_cmd *m = s->cmd;
	mem_free(s);
	relay_cmd_update_pause(m);
}

/* ------------------------------------------------------------------ */
/* producing events for one subscription */

static void emit_exit(struct sub *s)
{
	json_t *ev;

	if (s->cmd->state == CMD_FAILED) {
		relay_client_send(s->c, relay_ev_failed(s->cmd));
		return;
	}
	if (!(ev = relay_ev_exit(s))) {
		relay_client_fail(s->c);
		return;
	}
	relay_client_send(s->c, ev);
}

/* The next event of stream i for a streaming subscriber: `dropped` when
 * its cursor fell out of the ring, else the next chunk. Returns false when
 * it has read everything there is. */
static bool stream_step(struct sub *s, unsigned i)
{
	struct relay_cmd *m = s->cmd;
	struct relay *r = m->r;
	struct ring *g = &m->ring[i];

	if (s->cur[i] < relay_ring_start(g)) {
		relay_client_send(s->c, relay_ev_dropped(m, (int)i, s->cur[i], relay_ring_start(g) - s->cur[i]));
		s->truncated = true;
		s->cur[i] = relay_ring_start(g);
		relay_cmd_update_pause(m);
		return true;
	}
	if (s->cur[i] >= g->end)
		return false;
	uint64_t avail = g->end - s->cur[i];
	size_t n = avail < OUT_CHUNK ? (size_t)avail : OUT_CHUNK;
	relay_ring_read(g, s->cur[i], r->scratch, n);
	if (s->b64) {
		relay_client_send_b64(s->c, relay_stream_names[i], m->id, s->cur[i], r->scratch, n);
	} else {
		if (n < avail)
			n = relay_utf8_cut(r->scratch, n);
		relay_client_send(s->c, relay_ev_output(m, (int)i, s->cur[i], r->scratch, n));
	}
	s->cur[i] += n;
	s->turn = i ^ 1;
	relay_cmd_update_pause(m);
	return true;
}

bool relay_sub_step(struct sub *s)
{
	struct relay_cmd *m = s->cmd;

	if (!s->started_sent && m->has_pid) {
		relay_client_send(s->c, relay_ev_started(m));
		s->started_sent = true;
		return true;
	}
	if (s->mode == SUB_STREAM) {
		/* Alternate the streams so neither starves the other. */
		for (unsigned k = 0; k < 2; k++)
			if (stream_step(s, (s->turn + k) & 1))
				return true;
	}
	if (relay_cmd_ended(m)) {
		emit_exit(s);
		relay_sub_free(s);
		return true;
	}
	return false;
}
