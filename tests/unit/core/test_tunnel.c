/* SPDX-License-Identifier: Apache-2.0 */
/*
 * tunnel tests: two real chans (host and guest) on one loop over a
 * socketpair; on each side a tunnel between a guest-opened stream and a
 * socketpair whose far end the test plays (the command's connection on the
 * guest, the proxy's adopted end on the host). Bytes both ways, half-close,
 * backpressure with a reader that stops, resets, refusals and protocol
 * violations.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "testutil.h"

#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/noise.h"
#include "airlock/core/tunnel.h"
#include "airlock/core/wire.h"

#define RUN_MS	 5000
#define WINDOW	 65536u
#define EXEC_ID	 5u
#define BIG	 (4u << 20)
#define READ_BUF 65536

struct side {
	struct chan *c;
	struct tunnel *tun;
	int app;  /* the test's end of the tunnel's socketpair */
	int done; /* on_done calls */
	uint8_t close_sent, close_rcvd;
	int ready, closed, err;
	uint64_t app_in; /* bytes the test read from app */
	bool app_eof;
	bool reading;	    /* read app from the loop */
	bool reg;	    /* app registered with the loop */
	uint32_t pos_check; /* next expected pattern index */
	bool bad_pattern;
};

struct t {
	struct loop *l;
	struct noise_keypair hk, gk;
	struct chan_peers *peers;
	struct side h, g;
	/* host behaviour on PROXY_OPEN */
	uint8_t refuse; /* 0xff = accept */
	uint32_t open_exec;
	int nopen;
	int proto_err; /* -EPROTO seen from tunnel_frame */
	/* the writer on the guest app end */
	uint64_t to_write, written;
	bool (*pred)(struct t *t);
};

static struct t *T;

static uint8_t pattern(uint64_t i)
{
	return (uint8_t)(i * 7 + (i >> 13));
}

static void on_done(struct tunnel *tun, void *ud)
{
	struct side *s = ud;
	struct tunnel_stats st;

	tunnel_get_stats(tun, &st);
	s->close_sent = st.close_sent;
	s->close_rcvd = st.close_rcvd;
	s->done++;
	tunnel_free(tun);
	s->tun = NULL;
}

static const struct tunnel_ops tops = {.on_done = on_done};

static void on_app(struct loop *l, int fd, uint32_t events, void *ud);
static void app_update(struct side *s);

static void host_open(struct t *t, uint32_t stream, const uint8_t *p, size_t n)
{
	int sv[2];

	assert_int_equal(n, 4);
	t->open_exec = (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
	t->nopen++;
	assert_int_equal(stream % 2, 0);
	chan_consume(t->h.c, stream, n);
	if (t->refuse != 0xff) {
		assert_int_equal(tunnel_new(t->l, t->h.c, stream, -1, NULL, 0, &tops, &t->h, &t->h.tun), 0);
		tunnel_abort(t->h.tun, t->refuse);
		return;
	}
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	t->h.app = sv[0];
	app_update(&t->h);
	assert_int_equal(tunnel_new(t->l, t->h.c, stream, sv[1], NULL, 0, &tops, &t->h, &t->h.tun), 0);
}

static void on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct side *s = ud;
	struct t *t = T;
	(void)c;

	if (type == WIRE_PROXY_OPEN && s == &t->h) {
		host_open(t, stream, p, n);
		return;
	}
	if (!s->tun || tunnel_stream(s->tun) != stream)
		return; /* after on_done nothing comes; probes use other streams */
	if (tunnel_frame(s->tun, type, p, n) < 0)
		t->proto_err++;
}

static void on_writable(struct chan *c, void *ud)
{
	struct side *s = ud;
	(void)c;
	if (s->tun)
		tunnel_writable(s->tun);
}

static void on_ready(struct chan *c, void *ud)
{
	(void)c;
	((struct side *)ud)->ready++;
}

static void on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct side *s = ud;
	(void)why;
	s->closed++;
	s->err = err;
	if (s->tun) {
		tunnel_detach(s->tun);
		tunnel_free(s->tun);
		s->tun = NULL;
	}
	chan_free(c);
	s->c = NULL;
}

static const struct chan_ops cops = {
    .on_ready = on_ready, .on_frame = on_frame, .on_writable = on_writable, .on_close = on_close};

/* The test's app ends: read (checking the pattern) when reading is on,
 * write the pattern on the guest end while there is some to write. */
static void on_app(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct side *s = ud;
	struct t *t = T;
	static uint8_t buf[READ_BUF];
	(void)l;

	if ((events & (EPOLLIN | EPOLLHUP | EPOLLERR)) && s->reading && !s->app_eof) {
		ssize_t n = read(fd, buf, sizeof(buf));
		if (n == 0)
			s->app_eof = true;
		for (ssize_t i = 0; i < n; i++)
			if (buf[i] != pattern(s->app_in + (uint64_t)i))
				s->bad_pattern = true;
		if (n > 0)
			s->app_in += (uint64_t)n;
	}
	if ((events & EPOLLOUT) && s == &t->g && t->written < t->to_write) {
		size_t k = t->to_write - t->written > sizeof(buf) ? sizeof(buf) : (size_t)(t->to_write - t->written);
		for (size_t i = 0; i < k; i++)
			buf[i] = pattern(t->written + i);
		ssize_t n = write(fd, buf, k);
		if (n > 0)
			t->written += (uint64_t)n;
	}
	app_update(s);
}

/* Registered only while there is something to do (a hung-up fd would
 * otherwise report EPOLLHUP forever). */
static void app_update(struct side *s)
{
	struct t *t = T;
	uint32_t ev =
	    (s->reading && !s->app_eof ? EPOLLIN : 0) | (s == &t->g && t->written < t->to_write ? EPOLLOUT : 0);

	if (ev && !s->reg) {
		assert_int_equal(loop_add_fd(t->l, s->app, ev, on_app, s), 0);
		s->reg = true;
	} else if (ev) {
		loop_mod_fd(t->l, s->app, ev);
	} else if (s->reg) {
		loop_del_fd(t->l, s->app);
		s->reg = false;
	}
}

static bool pred_holds(void *ud)
{
	struct t *t = ud;
	return t->pred(t);
}

/* Run the loop until pred holds (checked before each sleep) or ms pass. */
static bool run_until(struct t *t, bool (*pred)(struct t *t), unsigned ms)
{
	bool r;

	t->pred = pred;
	r = tu_run_until(t->l, pred ? pred_holds : NULL, t, ms);
	t->pred = NULL;
	return r;
}

static bool both_ready(struct t *t)
{
	return t->h.ready && t->g.ready;
}

/* Two chans, ready, and a guest tunnel whose app end is t->g.app. */
static struct t *setup(uint8_t refuse)
{
	struct t *t = calloc(1, sizeof(*t));
	int sv[2], gv[2];

	assert_non_null(t);
	T = t;
	t->refuse = refuse;
	t->h.app = t->g.app = -1;
	assert_non_null(t->l = loop_new());
	randombytes_buf(t->hk.priv, 32);
	randombytes_buf(t->gk.priv, 32);
	assert_int_equal(noise_pubkey(t->hk.pub, t->hk.priv), 0);
	assert_int_equal(noise_pubkey(t->gk.pub, t->gk.priv), 0);
	assert_non_null(t->peers = chan_peers_new());
	assert_int_equal(chan_peers_allow(t->peers, t->hk.pub), 0);
	struct chan_cfg ch = {.role = NOISE_INITIATOR, .self = &t->hk, .peer = t->gk.pub, .window = WINDOW};
	struct chan_cfg cg = {.role = NOISE_RESPONDER, .self = &t->gk, .peers = t->peers, .window = WINDOW};
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	assert_non_null(t->h.c = chan_new(t->l, sv[0], &ch, &cops, &t->h));
	assert_non_null(t->g.c = chan_new(t->l, sv[1], &cg, &cops, &t->g));
	assert_true(run_until(t, both_ready, RUN_MS));

	uint8_t open[4] = {0, 0, 0, EXEC_ID};
	uint32_t stream = chan_stream_open(t->g.c, 0);
	assert_int_equal(stream % 2, 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, gv), 0);
	t->g.app = gv[0];
	app_update(&t->g);
	assert_int_equal(tunnel_new(t->l, t->g.c, stream, gv[1], open, sizeof(open), &tops, &t->g, &t->g.tun), 0);
	return t;
}

static bool both_chans_closed(struct t *t)
{
	return t->h.closed && t->g.closed;
}

static void teardown(struct t *t)
{
	if (t->h.c)
		chan_close(t->h.c);
	run_until(t, both_chans_closed, RUN_MS);
	assert_int_equal(t->h.err, 0);
	assert_int_equal(t->g.err, 0);
	for (struct side *s = &t->h; s; s = s == &t->h ? &t->g : NULL) {
		if (s->app >= 0) {
			if (s->reg)
				loop_del_fd(t->l, s->app);
			close(s->app);
		}
	}
	assert_int_equal(t->proto_err, 0);
	loop_free(t->l);
	chan_peers_free(t->peers);
	free(t);
	T = NULL;
}

static bool opened(struct t *t)
{
	return t->nopen == 1 && t->h.app >= 0;
}

static bool both_done(struct t *t)
{
	return t->h.done == 1 && t->g.done == 1;
}

static bool host_got_5(struct t *t)
{
	return t->h.app_in == 5;
}

static bool guest_got_5_eof(struct t *t)
{
	return t->g.app_in == 5 && t->g.app_eof;
}

static bool host_eof(struct t *t)
{
	return t->h.app_eof;
}

static void put_pattern(int fd, uint64_t from, size_t n)
{
	uint8_t b[16];
	for (size_t i = 0; i < n; i++)
		b[i] = pattern(from + i);
	assert_int_equal(write(fd, b, n), (ssize_t)n);
}

/* Bytes both ways, then EOF each way: CLOSE(DONE) both ways, both
 * tunnels done, the stream forgotten. */
static void test_roundtrip_half_close(void **state)
{
	(void)state;
	struct t *t = setup(0xff);

	assert_true(run_until(t, opened, RUN_MS));
	assert_int_equal(t->open_exec, EXEC_ID);
	t->h.reading = t->g.reading = true;
	app_update(&t->h);
	app_update(&t->g);
	put_pattern(t->g.app, 0, 5);
	assert_true(run_until(t, host_got_5, RUN_MS));
	/* the guest half-closes; the host's reader sees EOF, and can still answer */
	shutdown(t->g.app, SHUT_WR);
	assert_true(run_until(t, host_eof, RUN_MS));
	assert_int_equal(t->g.done + t->h.done, 0);
	put_pattern(t->h.app, 0, 5);
	shutdown(t->h.app, SHUT_WR);
	assert_true(run_until(t, guest_got_5_eof, RUN_MS));
	assert_true(run_until(t, both_done, RUN_MS));
	assert_int_equal(t->g.close_sent, WIRE_PROXY_C_DONE);
	assert_int_equal(t->g.close_rcvd, WIRE_PROXY_C_DONE);
	assert_int_equal(t->h.close_sent, WIRE_PROXY_C_DONE);
	assert_false(t->g.bad_pattern || t->h.bad_pattern);
	teardown(t);
}

static bool stalled(struct t *t)
{
	(void)t;
	return false; /* run for the whole time given */
}

static bool all_in(struct t *t)
{
	return t->h.app_in == BIG && t->written == BIG;
}

/* A reader that stops: the writer blocks, and what the tunnels hold stays
 * within one window plus one frame on each side; once it reads again
 * everything arrives in order. */
static void test_backpressure(void **state)
{
	(void)state;
	struct t *t = setup(0xff);
	struct tunnel_stats hs, gs;

	assert_true(run_until(t, opened, RUN_MS));
	t->to_write = BIG;
	app_update(&t->g);
	run_until(t, stalled, 300);
	assert_true(t->written < BIG / 2); /* socket buffers + window, not 4 MiB */
	tunnel_get_stats(t->h.tun, &hs);
	tunnel_get_stats(t->g.tun, &gs);
	assert_true(hs.buffered <= WINDOW + WIRE_PAYLOAD_MAX);
	assert_true(gs.buffered <= WIRE_PAYLOAD_MAX);
	assert_true(hs.to_chan == 0 && gs.to_sock == 0);
	uint64_t before = t->written;
	run_until(t, stalled, 100);
	assert_int_equal(t->written, before); /* really stuck */

	t->h.reading = true;
	app_update(&t->h);
	assert_true(run_until(t, all_in, 20000));
	assert_false(t->h.bad_pattern);
	/* orderly end */
	t->g.reading = true;
	app_update(&t->g);
	shutdown(t->g.app, SHUT_WR);
	assert_true(run_until(t, host_eof, RUN_MS));
	shutdown(t->h.app, SHUT_WR);
	assert_true(run_until(t, both_done, RUN_MS));
	teardown(t);
}

static bool guest_eof(struct t *t)
{
	return t->g.app_eof;
}

/* An abort on one side resets the other: CLOSE(RESET) both ways. */
static void test_abort(void **state)
{
	(void)state;
	struct t *t = setup(0xff);

	assert_true(run_until(t, opened, RUN_MS));
	t->h.reading = t->g.reading = true;
	app_update(&t->h);
	app_update(&t->g);
	put_pattern(t->g.app, 0, 5);
	assert_true(run_until(t, host_got_5, RUN_MS));
	tunnel_abort(t->h.tun, WIRE_PROXY_C_RESET);
	assert_true(run_until(t, both_done, RUN_MS));
	assert_true(run_until(t, guest_eof, RUN_MS)); /* the command's connection is gone */
	assert_int_equal(t->h.close_sent, WIRE_PROXY_C_RESET);
	assert_int_equal(t->g.close_rcvd, WIRE_PROXY_C_RESET);
	assert_int_equal(t->g.close_sent, WIRE_PROXY_C_RESET);
	teardown(t);
}

/* The host refuses the stream (too many): the guest's connection is
 * closed; data it sent meanwhile is dropped on the host. */
static void test_refused(void **state)
{
	(void)state;
	struct t *t = setup(WIRE_PROXY_C_LIMIT);

	t->g.reading = true;
	app_update(&t->g);
	put_pattern(t->g.app, 0, 5);
	assert_true(run_until(t, both_done, RUN_MS));
	assert_true(run_until(t, guest_eof, RUN_MS));
	assert_int_equal(t->nopen, 1);
	assert_int_equal(t->g.close_rcvd, WIRE_PROXY_C_LIMIT);
	assert_int_equal(t->h.close_sent, WIRE_PROXY_C_LIMIT);
	assert_int_equal(t->g.app_in, 0);
	teardown(t);
}

/* What a peer must not do is an error for the owner to act on. */
static void test_protocol_errors(void **state)
{
	(void)state;
	struct t *t = setup(0xff);
	uint8_t x = 0, bad = WIRE_PROXY_C_MAX + 1;

	assert_true(run_until(t, opened, RUN_MS));
	/* a probe tunnel on a stream of its own, fed frames by hand */
	int pv[2];
	struct side probe = {.app = -1};
	struct tunnel *h;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, pv), 0);
	assert_int_equal(tunnel_new(t->l, t->h.c, 100, pv[1], NULL, 0, &tops, &probe, &h), 0);
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_DATA, &x, 0), -EPROTO);    /* empty DATA */
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_CLOSE, &bad, 1), -EPROTO); /* unknown code */
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_CLOSE, &x, 1), -EPROTO);   /* DONE before EOF */
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_EOF, &x, 1), -EPROTO);     /* EOF with payload */
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_OPEN, &x, 1), -EPROTO);    /* not a tunnel frame */
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_EOF, NULL, 0), 0);
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_EOF, NULL, 0), -EPROTO); /* twice */
	assert_int_equal(tunnel_frame(h, WIRE_PROXY_DATA, &x, 1), -EPROTO);  /* after EOF */
	assert_int_equal(probe.done, 0);
	tunnel_free(h);
	close(pv[0]);
	/* and the tunnels still end in order */
	t->h.reading = t->g.reading = true;
	app_update(&t->h);
	app_update(&t->g);
	shutdown(t->g.app, SHUT_WR);
	shutdown(t->h.app, SHUT_WR);
	assert_true(run_until(t, both_done, RUN_MS));
	teardown(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_roundtrip_half_close),
	    cmocka_unit_test(test_backpressure),
	    cmocka_unit_test(test_abort),
	    cmocka_unit_test(test_refused),
	    cmocka_unit_test(test_protocol_errors),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
