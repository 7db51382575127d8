/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chan tests: two chans on one loop over socketpairs, optionally through a
 * test-side man in the middle that splits the byte stream into records
 * and can drop, duplicate, swap, flip, reflect, inject or truncate them.
 */
#include <errno.h>
#include <fcntl.h>
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
#include "airlock/core/wire.h"

#define RUN_MS 5000
#define T_TYPE 100 /* an unassigned frame type: delivered like any other */
#define NSEND  5

struct test;

struct frame_rec {
	uint8_t type;
	uint32_t stream;
	size_t n;
	char text[32];
};

struct side {
	struct test *t;
	struct chan *c;
	int ready;
	int closed;
	int err;
	char why[256];
	struct chan_stats st; /* taken in on_close */
	unsigned long mem_at_close;
	int nframes;
	struct frame_rec frames[64];
	int writable;
	/* per-test behaviour */
	void (*ready_fn)(struct side *s);
	void (*frame_fn)(struct side *s, uint8_t type, uint32_t stream, const uint8_t *p, size_t n);
	void (*writable_fn)(struct side *s);
	bool free_in_frame;
};

struct mitm;

struct test {
	struct loop *l;
	struct noise_keypair host, guest;
	struct chan_peers *peers;
	struct side a, b; /* a: initiator (host), b: responder (guest) */
	struct mitm *m;
	bool (*pred)(struct test *t);
	/* flow control / bulk */
	uint32_t sa, sb;
	uint64_t sent, nsent, total, recv, recv_a, recv_b;
	bool bad;
	uint8_t *chunk;
};

/* ---- chan callbacks ---- */

static void t_on_ready(struct chan *c, void *ud)
{
	struct side *s = ud;
	(void)c;
	s->ready++;
	if (s->ready_fn)
		s->ready_fn(s);
}

static void t_on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct side *s = ud;
	(void)c;
	assert_int_equal(s->closed, 0);
	if (s->nframes < 64) {
		struct frame_rec *f = &s->frames[s->nframes];
		f->type = type;
		f->stream = stream;
		f->n = n;
		size_t k = n < sizeof(f->text) - 1 ? n : sizeof(f->text) - 1;
		memcpy(f->text, p, k);
		f->text[k] = '\0';
	}
	s->nframes++;
	if (s->free_in_frame) {
		chan_free(s->c);
		s->c = NULL;
		return;
	}
	if (s->frame_fn)
		s->frame_fn(s, type, stream, p, n);
}

static void t_on_writable(struct chan *c, void *ud)
{
	struct side *s = ud;
	(void)c;
	s->writable++;
	if (s->writable_fn)
		s->writable_fn(s);
}

static void t_on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct side *s = ud;

	assert_int_equal(s->closed, 0);
	s->mem_at_close = mem_count();
	s->closed++;
	s->err = err;
	snprintf(s->why, sizeof(s->why), "%s", why ? why : "");
	chan_get_stats(c, &s->st);
	chan_free(c); /* allowed inside on_close */
	s->c = NULL;
}

static const struct chan_ops t_ops = {
    .on_ready = t_on_ready,
    .on_frame = t_on_frame,
    .on_writable = t_on_writable,
    .on_close = t_on_close,
};

/* ---- harness ---- */

static void keypair(struct noise_keypair *kp)
{
	randombytes_buf(kp->priv, sizeof(kp->priv));
	assert_int_equal(noise_pubkey(kp->pub, kp->priv), 0);
}

static struct test *t_new(void)
{
	struct test *t = calloc(1, sizeof(*t));

	assert_non_null(t);
	t->l = loop_new();
	assert_non_null(t->l);
	keypair(&t->host);
	keypair(&t->guest);
	t->peers = chan_peers_new();
	assert_non_null(t->peers);
	assert_int_equal(chan_peers_allow(t->peers, t->host.pub), 0);
	assert_int_equal(chan_peers_allow(t->peers, t->host.pub), 0);
	assert_int_equal(chan_peers_count(t->peers), 1);
	t->a.t = t;
	t->b.t = t;
	return t;
}

static void t_reset_sides(struct test *t)
{
	assert_null(t->a.c);
	assert_null(t->b.c);
	memset(&t->a, 0, sizeof(t->a));
	memset(&t->b, 0, sizeof(t->b));
	t->a.t = t;
	t->b.t = t;
}

static struct chan_cfg cfg_host(struct test *t)
{
	return (struct chan_cfg){.role = NOISE_INITIATOR, .self = &t->host, .peer = t->guest.pub};
}

static struct chan_cfg cfg_guest(struct test *t)
{
	return (struct chan_cfg){.role = NOISE_RESPONDER, .self = &t->guest, .peers = t->peers};
}

static void t_connect(struct test *t, const struct chan_cfg *ca, const struct chan_cfg *cb)
{
	int sv[2];

	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	t->a.c = chan_new(t->l, sv[0], ca, &t_ops, &t->a);
	t->b.c = chan_new(t->l, sv[1], cb, &t_ops, &t->b);
	assert_non_null(t->a.c);
	assert_non_null(t->b.c);
}

static bool pred_holds(void *ud)
{
	struct test *t = ud;
	return t->pred(t);
}

/* Run the loop until pred holds (checked before each sleep) or ms pass. */
static bool run_until(struct test *t, bool (*pred)(struct test *t), unsigned ms)
{
	bool r;

	t->pred = pred;
	r = tu_run_until(t->l, pred ? pred_holds : NULL, t, ms);
	t->pred = NULL;
	return r;
}

static bool both_ready(struct test *t)
{
	return t->a.ready && t->b.ready;
}

static bool both_closed(struct test *t)
{
	return t->a.closed && t->b.closed;
}

static bool a_closed(struct test *t)
{
	return t->a.closed;
}

static bool b_closed(struct test *t)
{
	return t->b.closed;
}

static void t_free(struct test *t)
{
	chan_free(t->a.c);
	chan_free(t->b.c);
	chan_peers_free(t->peers);
	loop_free(t->l);
	free(t->chunk);
	free(t);
}

/* Send NSEND small frames "<tag>-frame-N" on the control stream. */
static void send_five(struct side *s)
{
	char msg[32];

	for (int i = 0; i < NSEND; i++) {
		int n = snprintf(msg, sizeof(msg), "%s-frame-%d", s == &s->t->a ? "a" : "b", i);
		assert_int_equal(chan_send(s->c, T_TYPE, WIRE_STREAM_CONTROL, msg, (size_t)n), 0);
	}
}

static void check_frames(const struct side *s, int n, const char *tag)
{
	char want[32];

	if (n < 64)
		assert_int_equal(s->nframes, n);
	for (int i = 0; i < n && i < 64; i++) {
		snprintf(want, sizeof(want), "%s-frame-%d", tag, i);
		assert_string_equal(s->frames[i].text, want);
		assert_int_equal(s->frames[i].type, T_TYPE);
		assert_int_equal(s->frames[i].stream, 0);
	}
}

/* ---- man in the middle ---- */

enum mitm_kind {
	M_NONE,
	M_FLIP,
	M_DROP,
	M_DUP,
	M_SWAP,
	M_REFLECT,
	M_TRUNC,
	M_TRUNC_MID,
	M_OVERSIZE,
	M_REPLACE, /* replace the record with m->replace */
	M_AFTER_FINAL,
};

struct mitm {
	struct test *t;
	int fd[2]; /* fd[0] faces A (initiator), fd[1] faces B; dir d reads fd[d] */
	uint8_t acc[2][1u << 18];
	size_t acc_len[2];
	unsigned idx[2];
	bool cut[2];
	int dir;
	unsigned at;
	enum mitm_kind kind;
	uint8_t held[600];
	size_t held_len;
	uint8_t replace[600];
	size_t replace_len;
	unsigned long mem_mark;
	/* the first records of each direction, length prefix included */
	uint8_t cap[2][8][600];
	size_t cap_len[2][8];
};

static void mitm_write(struct mitm *m, int dir, const void *p, size_t n)
{
	const uint8_t *b = p;

	while (n > 0) {
		ssize_t w = write(m->fd[1 - dir], b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w < 0)
			return; /* the far side is gone */
		b += w;
		n -= (size_t)w;
	}
}

static void mitm_cut(struct mitm *m, int dir)
{
	if (!m->cut[dir])
		shutdown(m->fd[1 - dir], SHUT_WR);
	m->cut[dir] = true;
}

/* The fault, applied to record `idx` of direction `dir`. Returns true when
 * the record is to be forwarded as it is. */
static bool mitm_fault(struct mitm *m, int dir, unsigned idx, const uint8_t *rec, size_t n)
{
	uint8_t copy[600];
	/* a well-formed header (check byte right) with the largest length */
	static const uint8_t huge[4] = {0x58, 0xff, 0xff, 0xff};

	if (dir != m->dir)
		return true;
	if (m->kind == M_SWAP && idx == m->at + 1 && m->held_len) {
		mitm_write(m, dir, rec, n);
		mitm_write(m, dir, m->held, m->held_len);
		return false;
	}
	if (m->kind == M_AFTER_FINAL && idx == m->at) {
		mitm_write(m, dir, rec, n);
		mitm_write(m, dir, m->cap[dir][2], m->cap_len[dir][2]);
		return false;
	}
	if (idx != m->at)
		return true;
	assert_true(n <= sizeof(copy));
	switch (m->kind) {
	case M_NONE:
	case M_AFTER_FINAL:
		return true;
	case M_FLIP:
		memcpy(copy, rec, n);
		copy[n / 2] ^= 0x04;
		mitm_write(m, dir, copy, n);
		return false;
	case M_DROP:
		return false;
	case M_DUP:
		mitm_write(m, dir, rec, n);
		mitm_write(m, dir, rec, n);
		return false;
	case M_SWAP:
		memcpy(m->held, rec, n);
		m->held_len = n;
		return false;
	case M_REFLECT:
		/* A record the victim itself sent, back at it. */
		mitm_write(m, dir, m->cap[1 - dir][2], m->cap_len[1 - dir][2]);
		return false;
	case M_TRUNC:
		mitm_cut(m, dir);
		return false;
	case M_TRUNC_MID:
		mitm_write(m, dir, rec, n / 2);
		mitm_cut(m, dir);
		return false;
	case M_OVERSIZE:
		m->mem_mark = mem_count();
		mitm_write(m, dir, huge, sizeof(huge));
		return false;
	case M_REPLACE:
		mitm_write(m, dir, m->replace, m->replace_len);
		return false;
	}
	return true;
}

static void mitm_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct mitm *m = ud;
	int dir = fd == m->fd[0] ? 0 : 1;
	(void)events;

	ssize_t n = read(fd, m->acc[dir] + m->acc_len[dir], sizeof(m->acc[dir]) - m->acc_len[dir]);
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	if (n <= 0) {
		loop_del_fd(l, fd);
		mitm_cut(m, dir);
		return;
	}
	m->acc_len[dir] += (size_t)n;
	for (;;) {
		uint8_t *a = m->acc[dir];
		if (m->acc_len[dir] < 4)
			break;
		size_t len =
		    ((size_t)a[1] << 16) | ((size_t)a[2] << 8) | a[3]; /* 24-bit length; a[0] is the check byte */
		assert_true(len <= WIRE_RECORD_MAX);
		if (m->acc_len[dir] < 4 + len)
			break;
		size_t total = 4 + len;
		unsigned idx = m->idx[dir]++;
		if (idx < 8 && total <= sizeof(m->cap[0][0])) {
			memcpy(m->cap[dir][idx], a, total);
			m->cap_len[dir][idx] = total;
		}
		if (!m->cut[dir] && mitm_fault(m, dir, idx, a, total))
			mitm_write(m, dir, a, total);
		memmove(a, a + total, m->acc_len[dir] - total);
		m->acc_len[dir] -= total;
	}
}

static struct mitm *t_connect_mitm(struct test *t, const struct chan_cfg *ca, const struct chan_cfg *cb)
{
	struct mitm *m = calloc(1, sizeof(*m));
	int x[2], y[2];

	assert_non_null(m);
	m->t = t;
	m->dir = -1;
	/* The MITM's own ends block on write (small test traffic), the
	 * chans' ends are non-blocking. */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, x), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, y), 0);
	assert_int_equal(fcntl(x[0], F_SETFL, O_NONBLOCK), 0);
	assert_int_equal(fcntl(y[1], F_SETFL, O_NONBLOCK), 0);
	m->fd[0] = x[1];
	m->fd[1] = y[0];
	assert_int_equal(loop_add_fd(t->l, m->fd[0], EPOLLIN, mitm_cb, m), 0);
	assert_int_equal(loop_add_fd(t->l, m->fd[1], EPOLLIN, mitm_cb, m), 0);
	t->m = m;
	t->a.c = chan_new(t->l, x[0], ca, &t_ops, &t->a);
	t->b.c = chan_new(t->l, y[1], cb, &t_ops, &t->b);
	assert_non_null(t->a.c);
	assert_non_null(t->b.c);
	return m;
}

static void mitm_free(struct test *t)
{
	struct mitm *m = t->m;

	if (!m)
		return;
	for (int i = 0; i < 2; i++) {
		loop_del_fd(t->l, m->fd[i]);
		close(m->fd[i]);
	}
	free(m);
	t->m = NULL;
}

/* ---- handshake ---- */

static void api_checks_ready(struct side *s)
{
	uint8_t big[WIRE_PAYLOAD_MAX + 1] = {0};

	assert_int_equal(chan_send(s->c, T_TYPE, 0, big, sizeof(big)), -EMSGSIZE);
	assert_int_equal(chan_send(s->c, WIRE_WINDOW, 0, big, 8), -EINVAL);
	assert_int_equal(chan_send(s->c, WIRE_BYE, 0, NULL, 0), -EINVAL);
	assert_true(chan_is_ready(s->c));
	assert_true(chan_send_space(s->c, 0) > 0);
	send_five(s);
}

static void test_handshake_ok(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	t->a.ready_fn = api_checks_ready;
	t->b.ready_fn = api_checks_ready;
	t_connect(t, &ca, &cb);
	assert_false(chan_is_ready(t->a.c));
	assert_null(chan_peer_key(t->a.c));
	assert_int_equal(chan_send(t->a.c, T_TYPE, 0, "x", 1), -EPIPE);
	assert_true(chan_fd(t->a.c) >= 0);

	assert_true(run_until(t, both_ready, RUN_MS));
	assert_int_equal(t->a.ready, 1);
	assert_int_equal(t->b.ready, 1);
	assert_memory_equal(chan_peer_key(t->a.c), t->guest.pub, NOISE_KEY_LEN);
	assert_memory_equal(chan_peer_key(t->b.c), t->host.pub, NOISE_KEY_LEN);
	struct chan_stats st;
	chan_get_stats(t->a.c, &st);
	assert_true(st.handshake_ns > 0);

	/* frames both ways, in order */
	chan_close(t->a.c);
	assert_int_equal(chan_send(t->a.c, T_TYPE, 0, "x", 1), -EPIPE);
	chan_close(t->a.c); /* idempotent */
	assert_true(run_until(t, both_closed, RUN_MS));
	check_frames(&t->a, NSEND, "b");
	check_frames(&t->b, NSEND, "a");
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	assert_true(t->a.st.frames_out >= NSEND + 1);
	assert_true(t->a.st.bytes_in > 0 && t->a.st.bytes_out > 0);
	t_free(t);
}

/* The responder closes, from inside on_frame. */
static void b_close_after_five(struct side *s, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	(void)type;
	(void)stream;
	(void)p;
	(void)n;
	if (s->nframes == NSEND)
		chan_close(s->c);
}

static void test_close_by_responder(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	t->a.ready_fn = send_five;
	t->b.frame_fn = b_close_after_five;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	check_frames(&t->b, NSEND, "a");
	t_free(t);
}

static void test_handshake_fresh_keys(void **state)
{
	(void)state;
	uint8_t rec[2][600], hdr[2][600];
	size_t rec_len[2];

	for (int i = 0; i < 2; i++) {
		struct test *t = t_new();
		/* the same static keys both times */
		memset(t->host.priv, 0x11, sizeof(t->host.priv));
		memset(t->guest.priv, 0x22, sizeof(t->guest.priv));
		assert_int_equal(noise_pubkey(t->host.pub, t->host.priv), 0);
		assert_int_equal(noise_pubkey(t->guest.pub, t->guest.priv), 0);
		chan_peers_free(t->peers);
		t->peers = chan_peers_new();
		assert_int_equal(chan_peers_allow(t->peers, t->host.pub), 0);
		struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);
		t->a.ready_fn = send_five;
		struct mitm *m = t_connect_mitm(t, &ca, &cb);
		assert_true(run_until(t, both_ready, RUN_MS));
		chan_close(t->a.c);
		assert_true(run_until(t, both_closed, RUN_MS));
		assert_int_equal(t->a.err, 0);
		assert_int_equal(t->b.err, 0);
		check_frames(&t->b, NSEND, "a");
		rec_len[i] = m->cap_len[0][2];
		memcpy(rec[i], m->cap[0][2], rec_len[i]);
		memcpy(hdr[i], m->cap[0][1], m->cap_len[0][1]);
		assert_int_equal(m->cap_len[0][1], 4 + WIRE_SS_HEADER);
		mitm_free(t);
		t_free(t);
	}
	/* Same keys, same plaintext: the records still differ. */
	assert_int_equal(rec_len[0], rec_len[1]);
	assert_true(memcmp(rec[0] + 4, rec[1] + 4, rec_len[0] - 4) != 0);
	assert_true(memcmp(hdr[0] + 4, hdr[1] + 4, WIRE_SS_HEADER) != 0);
}

static void expect_refusal(const struct side *s, uint8_t reason)
{
	char want[256];

	snprintf(want, sizeof(want), "guest refused the handshake: %s", wire_refusal_str(reason));
	assert_int_equal(s->err, -EACCES);
	assert_string_equal(s->why, want);
}

static void test_wrong_guest_key(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct noise_keypair other;
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	keypair(&other);
	ca.peer = other.pub; /* the host pinned some other guest */
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_closed, RUN_MS));
	expect_refusal(&t->a, WIRE_REFUSE_GUEST_KEY);
	assert_int_equal(t->b.err, -EACCES);
	assert_string_equal(t->b.why,
			    "host handshake failed: the host does not have this guest's public key (or speaks another "
			    "version)");
	assert_int_equal(t->a.ready + t->b.ready, 0);
	t_free(t);
}

static void test_unknown_host_key(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct noise_keypair other;
	char b64[64];
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	keypair(&other);
	ca.self = &other; /* a host the guest never allowed */
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_closed, RUN_MS));
	expect_refusal(&t->a, WIRE_REFUSE_HOST_KEY);
	assert_int_equal(t->b.err, -EACCES);
	sodium_bin2base64(b64, sizeof(b64), other.pub, 32, sodium_base64_VARIANT_ORIGINAL);
	assert_non_null(strstr(t->b.why, b64));
	assert_non_null(strstr(t->b.why, "allow-list"));
	t_free(t);
}

static void test_wrong_psk(void **state)
{
	(void)state;
	struct test *t = t_new();
	uint8_t psk_a[32], psk_b[32];
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	memset(psk_a, 1, sizeof(psk_a));
	memset(psk_b, 2, sizeof(psk_b));
	ca.psk = psk_a;
	cb.psk = psk_b;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, -EACCES);
	assert_string_equal(t->a.why,
			    "guest's handshake reply did not authenticate: the pre-shared key differs (or the "
			    "reply was tampered with)");
	assert_int_equal(t->b.err, -EPIPE);
	assert_non_null(strstr(t->b.why, "pre-shared"));
	assert_int_equal(t->a.ready + t->b.ready, 0);
	t_free(t);

	/* the same psk on both sides works */
	t = t_new();
	ca = cfg_host(t);
	cb = cfg_guest(t);
	ca.psk = psk_a;
	cb.psk = psk_a;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	chan_close(t->b.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	t_free(t);
}

static void test_replayed_msg1(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);
	uint8_t msg1[600];
	size_t msg1_len;

	/* session 1: capture msg1 */
	struct mitm *m = t_connect_mitm(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	msg1_len = m->cap_len[0][0];
	assert_int_equal(msg1_len, 4 + 2 + NOISE_MSG1_LEN(12));
	memcpy(msg1, m->cap[0][0], msg1_len);
	chan_close(t->a.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, 0);
	mitm_free(t);
	t_reset_sides(t);

	/* session 2: a fresh host connection whose msg1 is swapped for the
	 * captured one, to a guest sharing the replay table */
	m = t_connect_mitm(t, &ca, &cb);
	m->dir = 0;
	m->at = 0;
	m->kind = M_REPLACE;
	memcpy(m->replace, msg1, msg1_len);
	m->replace_len = msg1_len;
	assert_true(run_until(t, both_closed, RUN_MS));
	expect_refusal(&t->a, WIRE_REFUSE_REPLAY);
	assert_int_equal(t->b.err, -EACCES);
	assert_non_null(strstr(t->b.why, "replayed"));
	mitm_free(t);
	t_reset_sides(t);

	/* session 3: the real host, a new timestamp: accepted */
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	chan_close(t->a.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->b.err, 0);
	t_free(t);
}

/* A raw peer talks to a responder chan; returns what the chan wrote. */
static size_t raw_to_responder(struct test *t, const void *msg, size_t n, uint8_t *reply, size_t cap,
			       uint32_t handshake_ms)
{
	int sv[2];
	struct chan_cfg cb = cfg_guest(t);

	cb.handshake_ms = handshake_ms;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
	t->b.c = chan_new(t->l, sv[1], &cb, &t_ops, &t->b);
	assert_non_null(t->b.c);
	if (n)
		assert_int_equal(write(sv[0], msg, n), (ssize_t)n);
	assert_true(run_until(t, b_closed, RUN_MS));
	ssize_t r = recv(sv[0], reply, cap, MSG_DONTWAIT);
	close(sv[0]);
	return r > 0 ? (size_t)r : 0;
}

static void test_raw_msg1_faults(void **state)
{
	(void)state;
	struct test *t = t_new();
	uint8_t msg[4 + 2 + NOISE_MSG1_LEN(12)] = {0};
	uint8_t reply[64];
	size_t n;

	/* another version: refused VERSION even though the size is ours */
	uint32_t h = wire_record_hdr(2 + NOISE_MSG1_LEN(12));
	msg[0] = (uint8_t)(h >> 24);
	msg[1] = (uint8_t)(h >> 16);
	msg[2] = (uint8_t)(h >> 8);
	msg[3] = (uint8_t)h;
	msg[4] = WIRE_HS_INIT;
	msg[5] = WIRE_VERSION + 1;
	n = raw_to_responder(t, msg, sizeof(msg), reply, sizeof(reply), 0);
	assert_int_equal(t->b.err, -EACCES);
	assert_non_null(strstr(t->b.why, "version"));
	assert_int_equal(n, 6);
	assert_memory_equal(reply, ((uint8_t[]){WIRE_HDR_MAGIC ^ 2, 0, 0, 2, WIRE_HS_REFUSE, WIRE_REFUSE_VERSION}), 6);
	t_reset_sides(t);

	/* too short */
	static const uint8_t shortmsg[] = {WIRE_HDR_MAGIC ^ 3, 0, 0, 3, WIRE_HS_INIT, WIRE_VERSION, 0};
	n = raw_to_responder(t, shortmsg, sizeof(shortmsg), reply, sizeof(reply), 0);
	assert_int_equal(t->b.err, -EACCES);
	assert_int_equal(n, 6);
	assert_int_equal(reply[5], WIRE_REFUSE_MALFORMED);
	t_reset_sides(t);

	/* right size, garbage: the s decryption fails => GUEST_KEY */
	msg[5] = WIRE_VERSION;
	for (size_t i = 6; i < sizeof(msg); i++)
		msg[i] = (uint8_t)(i * 7 + 1);
	n = raw_to_responder(t, msg, sizeof(msg), reply, sizeof(reply), 0);
	assert_int_equal(t->b.err, -EACCES);
	assert_int_equal(n, 6);
	assert_int_equal(reply[5], WIRE_REFUSE_GUEST_KEY);
	t_reset_sides(t);

	/* an oversized length prefix during the handshake */
	static const uint8_t huge[] = {0x58, 0xff, 0xff, 0xff};
	unsigned long before = mem_count();
	n = raw_to_responder(t, huge, sizeof(huge), reply, sizeof(reply), 0);
	assert_int_equal(t->b.err, -EMSGSIZE);
	assert_string_equal(t->b.why, "record length 16777215 exceeds the limit 256");
	assert_true(t->b.mem_at_close - before < 16);
	assert_int_equal(n, 6);
	assert_int_equal(reply[5], WIRE_REFUSE_MALFORMED);
	t_reset_sides(t);

	/* a damaged record header (check byte wrong) is refused at once */
	static const uint8_t damaged[] = {0xff, 0xff, 0xff, 0xff};
	before = mem_count();
	n = raw_to_responder(t, damaged, sizeof(damaged), reply, sizeof(reply), 0);
	assert_int_equal(t->b.err, -EBADMSG);
	assert_string_equal(t->b.why, "record header ffffffff is damaged (its check byte does not match)");
	assert_true(t->b.mem_at_close - before < 16);
	assert_int_equal(n, 6);
	assert_int_equal(reply[5], WIRE_REFUSE_MALFORMED);
	t_reset_sides(t);

	/* a host that never speaks: handshake timeout */
	n = raw_to_responder(t, NULL, 0, reply, sizeof(reply), 100);
	assert_int_equal(t->b.err, -ETIMEDOUT);
	assert_non_null(strstr(t->b.why, "100 ms"));
	assert_int_equal(n, 0);
	t_reset_sides(t);

	/* a host that hangs up at once */
	int sv[2];
	struct chan_cfg cb = cfg_guest(t);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	t->b.c = chan_new(t->l, sv[1], &cb, &t_ops, &t->b);
	close(sv[0]);
	assert_true(run_until(t, b_closed, RUN_MS));
	assert_int_equal(t->b.err, -EPIPE);
	t_free(t);
}

static void test_initiator_timeout_and_cancel(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t);
	int sv[2];

	ca.handshake_ms = 100;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	t->a.c = chan_new(t->l, sv[0], &ca, &t_ops, &t->a);
	assert_non_null(t->a.c);
	assert_true(run_until(t, a_closed, RUN_MS));
	assert_int_equal(t->a.err, -ETIMEDOUT);
	close(sv[1]);
	t_reset_sides(t);

	/* chan_close during the handshake */
	struct chan_cfg cb = cfg_guest(t);
	t_connect(t, &ca, &cb);
	chan_close(t->a.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, -ECANCELED);
	assert_int_equal(t->b.err, -EPIPE);
	assert_int_equal(t->a.ready + t->b.ready, 0);

	/* bad configurations */
	t_reset_sides(t);
	struct chan_cfg bad = ca;
	bad.peer = NULL;
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	errno = 0;
	assert_null(chan_new(t->l, sv[0], &bad, &t_ops, &t->a));
	assert_int_equal(errno, EINVAL);
	assert_int_equal(fcntl(sv[0], F_GETFD), -1); /* closed */
	close(sv[1]);
	t_free(t);
}

/* ---- transport faults through the MITM ---- */

struct fault_case {
	const char *name;
	int dir;
	enum mitm_kind kind;
	int err;
	int frames;
	const char *why;
};

static const struct fault_case fault_cases[] = {
    {"bit flip", 0, M_FLIP, -EBADMSG, 2, "record 3 failed authentication: tampered, reordered, replayed or reflected"},
    {"bit flip r2i", 1, M_FLIP, -EBADMSG, 2, "record 3 failed authentication"},
    {"dropped", 0, M_DROP, -EBADMSG, 2, "record 3 failed authentication"},
    {"duplicated", 0, M_DUP, -EBADMSG, 3, "record 4 failed authentication"},
    {"swapped", 0, M_SWAP, -EBADMSG, 2, "record 3 failed authentication"},
    {"reflected", 1, M_REFLECT, -EBADMSG, 2, "record 3 failed authentication"},
    {"truncated at a record boundary", 0, M_TRUNC, -EPIPE, 2, "connection truncated: peer closed without FINAL"},
    {"truncated mid-record", 0, M_TRUNC_MID, -EPIPE, 2,
     "connection truncated inside a record: peer closed without FINAL"},
    {"truncated mid-record r2i", 1, M_TRUNC_MID, -EPIPE, 2, "connection truncated"},
    {"oversized length", 0, M_OVERSIZE, -EMSGSIZE, 2, "record length 16777215 exceeds the limit 65558"},
};

static void test_transport_faults(void **state)
{
	(void)state;

	for (size_t i = 0; i < sizeof(fault_cases) / sizeof(fault_cases[0]); i++) {
		const struct fault_case *fc = &fault_cases[i];
		struct test *t = t_new();
		struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

		print_message("fault: %s\n", fc->name);
		t->a.ready_fn = send_five;
		t->b.ready_fn = send_five;
		struct mitm *m = t_connect_mitm(t, &ca, &cb);
		m->dir = fc->dir;
		m->at = 4; /* records: 0 msg1/msg2, 1 header, 2.. frames */
		m->kind = fc->kind;
		assert_true(run_until(t, both_closed, RUN_MS));
		struct side *victim = fc->dir == 0 ? &t->b : &t->a;
		struct side *other = fc->dir == 0 ? &t->a : &t->b;
		assert_int_equal(victim->err, fc->err);
		assert_non_null(strstr(victim->why, fc->why));
		/* nothing after the fault was delivered */
		check_frames(victim, fc->frames, fc->dir == 0 ? "a" : "b");
		assert_true(other->err < 0);
		if (fc->kind == M_OVERSIZE)
			assert_true(victim->mem_at_close - m->mem_mark <= 2);
		mitm_free(t);
		t_free(t);
	}
}

static void send_five_then_close(struct side *s)
{
	send_five(s);
	chan_close(s->c);
}

static void test_data_after_final(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	t->a.ready_fn = send_five_then_close;
	struct mitm *m = t_connect_mitm(t, &ca, &cb);
	m->dir = 0;
	m->at = 2 + NSEND; /* the BYE record */
	m->kind = M_AFTER_FINAL;
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->b.err, -EPROTO);
	assert_non_null(strstr(t->b.why, "after its FINAL"));
	check_frames(&t->b, NSEND, "a");
	mitm_free(t);
	t_free(t);
}

static void test_free_inside_frame(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	t->a.ready_fn = send_five;
	t->b.free_in_frame = true;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, a_closed, RUN_MS));
	assert_int_equal(t->b.nframes, 1);
	assert_int_equal(t->b.closed, 0);
	assert_null(t->b.c);
	assert_int_equal(t->a.err, -EPIPE);
	t_free(t);
}

/* More records than chan handles per wakeup, all buffered at once: they
 * arrive complete and in order, interleaved with the other direction. */
#define NMANY 500

static void send_many(struct side *s)
{
	char msg[32];

	for (int i = 0; i < NMANY; i++) {
		int n = snprintf(msg, sizeof(msg), "%s-frame-%d", s == &s->t->a ? "a" : "b", i);
		assert_int_equal(chan_send(s->c, T_TYPE, WIRE_STREAM_CONTROL, msg, (size_t)n), 0);
	}
}

static bool got_many(struct test *t)
{
	return t->a.nframes == NMANY && t->b.nframes == NMANY;
}

static void test_many_small_frames(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	t->a.ready_fn = send_many;
	t->b.ready_fn = send_many;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, got_many, RUN_MS));
	check_frames(&t->a, 64, "b");
	check_frames(&t->b, 64, "a");
	chan_close(t->b.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	assert_int_equal(t->a.st.frames_in, NMANY + 1);
	t_free(t);
}

/* ---- rekey and bulk ---- */

static uint8_t pattern(uint64_t off)
{
	return (uint8_t)(off * 131u + (off >> 13) + 7u);
}

static void bulk_pump(struct side *s)
{
	struct test *t = s->t;

	while (t->sent < t->total) {
		/* 1..4000 bytes, varying */
		size_t n = 1 + (size_t)((t->nsent * 7919u) % 4000u);
		if (n > t->total - t->sent)
			n = (size_t)(t->total - t->sent);
		for (size_t i = 0; i < n; i++)
			t->chunk[i] = pattern(t->sent + i);
		int r = chan_send(s->c, WIRE_BULK_DATA, t->sa, t->chunk, n);
		if (r == -EAGAIN)
			return;
		assert_int_equal(r, 0);
		t->sent += n;
		t->nsent++;
	}
	chan_close(s->c);
}

static void bulk_start(struct side *s)
{
	struct test *t = s->t;

	t->sa = chan_stream_open(s->c, 0);
	assert_int_equal(t->sa, 1); /* initiator streams are odd */
	assert_int_equal(chan_stream_open(s->c, 0), 3);
	bulk_pump(s);
}

static void bulk_recv(struct side *s, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	struct test *t = s->t;

	assert_int_equal(type, WIRE_BULK_DATA);
	assert_int_equal(stream, t->sa);
	for (size_t i = 0; i < n; i++)
		if (p[i] != pattern(t->recv + i))
			t->bad = true;
	t->recv += n;
}

static void test_rekey_bulk(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);

	ca.rekey_bytes = 4096;
	cb.rekey_bytes = 4096;
	t->total = 1u << 20;
	t->chunk = malloc(8192);
	t->a.ready_fn = bulk_start;
	t->a.writable_fn = bulk_pump;
	t->b.frame_fn = bulk_recv;
	t_connect(t, &ca, &cb);
	chan_set_default_stream_flags(t->b.c, CHAN_STREAM_AUTO);
	assert_true(run_until(t, both_closed, RUN_MS * 2));
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	assert_true(t->recv == t->total);
	assert_false(t->bad);
	print_message("rekey: %llu rekeys, %llu records, %d writable\n", (unsigned long long)t->a.st.rekeys_sent,
		      (unsigned long long)t->a.st.frames_out, t->a.writable);
	/* a REKEY on the record after every 4 KiB sent: with frames of 2 KB
	 * on average, more than one per 12 KiB */
	assert_true(t->a.st.rekeys_sent >= t->total / (3 * 4096));
	assert_true(t->b.st.rekeys_seen == t->a.st.rekeys_sent);
	assert_true(t->a.writable > 0); /* the 256 KiB window ran out at least once */
	t_free(t);
}

/* ---- flow control ---- */

#define FC_WINDOW 65536u
#define FC_FRAME  4096u

static void fc_recv(struct side *s, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	struct test *t = s->t;
	(void)type;
	(void)p;

	if (stream == t->sa)
		t->recv_a += n; /* never consumed by the application */
	else if (stream == t->sb) {
		t->recv_b += n;
		chan_consume(s->c, stream, n);
	}
}

static void fc_writable(struct side *s)
{
	struct test *t = s->t;
	uint8_t buf[FC_FRAME] = {0};

	while (t->sent < t->total && chan_send(s->c, WIRE_BULK_DATA, t->sa, buf, sizeof(buf)) == 0)
		t->sent += sizeof(buf);
}

static bool fc_phase1(struct test *t)
{
	return t->recv_a == FC_WINDOW && t->recv_b == 10 * 100;
}

static bool fc_two_windows(struct test *t)
{
	return t->recv_a == 2 * FC_WINDOW;
}

static bool fc_sb_more(struct test *t)
{
	return t->recv_b == 100;
}

static bool fc_phase2(struct test *t)
{
	return t->recv_a == t->total;
}

static void test_flow_control(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);
	uint8_t buf[FC_FRAME] = {0};

	ca.window = FC_WINDOW;
	cb.window = FC_WINDOW;
	t->b.frame_fn = fc_recv;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	t->sa = chan_stream_open(t->a.c, 0);
	t->sb = chan_stream_open(t->a.c, 0);
	assert_int_equal(chan_send_space(t->a.c, t->sa), FC_WINDOW);

	/* Stream A: exactly one window, then -EAGAIN. */
	int sent = 0;
	while (chan_send(t->a.c, WIRE_BULK_DATA, t->sa, buf, sizeof(buf)) == 0)
		sent++;
	assert_int_equal((size_t)sent * FC_FRAME, FC_WINDOW);
	assert_int_equal(chan_send(t->a.c, WIRE_BULK_DATA, t->sa, buf, 1), -EAGAIN);
	assert_int_equal(chan_send_space(t->a.c, t->sa), 0);
	/* An empty frame needs no window. */
	assert_int_equal(chan_send(t->a.c, WIRE_BULK_DATA, t->sa, NULL, 0), 0);

	/* Stream B is not held up by A. */
	for (int i = 0; i < 10; i++)
		assert_int_equal(chan_send(t->a.c, WIRE_BULK_DATA, t->sb, buf, 100), 0);
	assert_true(run_until(t, fc_phase1, RUN_MS));
	assert_int_equal(t->a.writable, 0);
	assert_int_equal(chan_send(t->a.c, WIRE_BULK_DATA, t->sa, buf, 1), -EAGAIN);
	/* more B while A stays blocked */
	for (int i = 0; i < 10; i++)
		assert_int_equal(chan_send(t->a.c, WIRE_BULK_DATA, t->sb, buf, 100), 0);
	t->total = 3 * FC_WINDOW;
	t->sent = FC_WINDOW;
	t->a.writable_fn = fc_writable;

	/* Consuming on A resumes it: credit -> on_writable -> exactly one
	 * more window. */
	chan_consume(t->b.c, t->sa, FC_WINDOW);
	assert_true(run_until(t, fc_two_windows, RUN_MS));
	assert_int_equal(t->a.writable, 1);
	assert_int_equal(t->sent, 2 * FC_WINDOW);
	assert_int_equal(t->recv_b, 20 * 100);
	/* Credit in small pieces is batched: nothing until a quarter window. */
	chan_consume(t->b.c, t->sa, FC_WINDOW / 4 - 1);
	assert_false(run_until(t, fc_phase2, 100));
	assert_int_equal(t->recv_a, 2 * FC_WINDOW);
	chan_consume(t->b.c, t->sa, 1 + 3 * FC_WINDOW / 4);
	assert_true(run_until(t, fc_phase2, RUN_MS));
	assert_int_equal(t->a.writable, 2);

	chan_close(t->a.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	t_free(t);
}

static void test_window_violation(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);
	uint8_t buf[FC_FRAME] = {0};

	ca.window = 2 * FC_WINDOW; /* the host believes it may send more */
	cb.window = FC_WINDOW;
	t->b.frame_fn = fc_recv;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	t->sa = chan_stream_open(t->a.c, 0);
	for (unsigned i = 0; i < 2 * FC_WINDOW / FC_FRAME; i++)
		assert_int_equal(chan_send(t->a.c, WIRE_BULK_DATA, t->sa, buf, sizeof(buf)), 0);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->b.err, -EPROTO);
	assert_non_null(strstr(t->b.why, "window"));
	assert_int_equal(t->recv_a, FC_WINDOW);
	assert_true(t->a.err < 0);
	t_free(t);
}

/* ---- guest-opened streams (the proxy streams of wire.h) ---- */

/* The responder opens even ids; the same windows hold in both directions
 * of such a stream, and the initiator's own ids stay odd. */
static void test_guest_opened_streams(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);
	uint8_t buf[FC_FRAME] = {0};
	int sent = 0;

	ca.window = FC_WINDOW;
	cb.window = FC_WINDOW;
	t->a.frame_fn = fc_recv; /* the host consumes sb at once, never sa */
	t->b.frame_fn = fc_recv;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	t->sa = chan_stream_open(t->b.c, 0);
	t->sb = chan_stream_open(t->b.c, 0);
	assert_int_equal(t->sa, 2);
	assert_int_equal(t->sb, 4);
	assert_int_equal(chan_stream_open(t->a.c, 0), 1);

	/* guest -> host: one window on sa, then -EAGAIN; sb is not held up */
	while (chan_send(t->b.c, WIRE_BULK_DATA, t->sa, buf, sizeof(buf)) == 0)
		sent++;
	assert_int_equal((size_t)sent * FC_FRAME, FC_WINDOW);
	assert_int_equal(chan_send_space(t->b.c, t->sa), 0);
	for (int i = 0; i < 10; i++)
		assert_int_equal(chan_send(t->b.c, WIRE_BULK_DATA, t->sb, buf, 100), 0);
	assert_true(run_until(t, fc_phase1, RUN_MS));
	assert_int_equal(t->b.writable, 0);

	/* the host's credit resumes the guest: exactly one more window */
	t->total = 2 * FC_WINDOW;
	t->sent = FC_WINDOW;
	t->b.writable_fn = fc_writable;
	chan_consume(t->a.c, t->sa, FC_WINDOW);
	assert_true(run_until(t, fc_two_windows, RUN_MS));
	assert_int_equal(t->b.writable, 1);
	assert_int_equal(t->sent, 2 * FC_WINDOW);

	/* host -> guest on the guest's stream: its own window */
	sent = 0;
	while (chan_send(t->a.c, WIRE_BULK_DATA, t->sa, buf, sizeof(buf)) == 0)
		sent++;
	assert_int_equal((size_t)sent * FC_FRAME, FC_WINDOW);
	t->total = 3 * FC_WINDOW;
	assert_true(run_until(t, fc_phase2, RUN_MS)); /* recv_a == total: both directions counted */

	/* once both forget a stream, late credit for it is ignored and new
	 * ids do not reuse it */
	chan_stream_close(t->a.c, t->sa);
	chan_consume(t->b.c, t->sa, FC_WINDOW);
	chan_stream_close(t->b.c, t->sa);
	assert_int_equal(chan_stream_open(t->b.c, 0), 6);
	assert_int_equal(chan_send(t->b.c, WIRE_BULK_DATA, t->sb, buf, 100), 0);
	t->recv_b = 0;
	assert_true(run_until(t, fc_sb_more, RUN_MS));

	chan_close(t->b.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	t_free(t);
}

/* A guest that sends past the window of its own stream is cut off by the
 * host, as in the other direction. */
static void test_guest_window_violation(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);
	uint8_t buf[FC_FRAME] = {0};

	ca.window = FC_WINDOW;
	cb.window = 2 * FC_WINDOW; /* the guest believes it may send more */
	t->a.frame_fn = fc_recv;
	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	t->sa = chan_stream_open(t->b.c, 0);
	assert_int_equal(t->sa % 2, 0);
	for (unsigned i = 0; i < 2 * FC_WINDOW / FC_FRAME; i++)
		assert_int_equal(chan_send(t->b.c, WIRE_BULK_DATA, t->sa, buf, sizeof(buf)), 0);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, -EPROTO);
	assert_non_null(strstr(t->a.why, "window"));
	assert_int_equal(t->recv_a, FC_WINDOW);
	assert_true(t->b.err < 0);
	t_free(t);
}

/* ---- allocation failure ---- */

static void test_alloc_failure_new(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg cfgs[2] = {cfg_host(t), cfg_guest(t)};

	for (int role = 0; role < 2; role++) {
		bool ok = false;
		for (unsigned long i = 1; i < 64 && !ok; i++) {
			int sv[2];
			assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
			mem_fail_at(i, 0);
			errno = 0;
			struct chan *c = chan_new(t->l, sv[0], &cfgs[role], &t_ops, &t->a);
			mem_fail_at(0, 0);
			if (!c) {
				assert_int_equal(errno, ENOMEM);
				assert_int_equal(fcntl(sv[0], F_GETFD), -1); /* closed */
			} else {
				ok = true;
				chan_free(c);
			}
			close(sv[1]);
		}
		assert_true(ok);
	}
	t_free(t);
}

static void test_alloc_failure_send(void **state)
{
	(void)state;
	struct test *t = t_new();
	struct chan_cfg ca = cfg_host(t), cb = cfg_guest(t);
	static uint8_t big[WIRE_PAYLOAD_MAX];

	t_connect(t, &ca, &cb);
	assert_true(run_until(t, both_ready, RUN_MS));
	mem_fail_at(1, 1);
	assert_int_equal(chan_send(t->a.c, T_TYPE, 7, "x", 1), -ENOMEM);	   /* new stream state */
	assert_int_equal(chan_send(t->a.c, T_TYPE, 0, big, sizeof(big)), -ENOMEM); /* queue growth */
	assert_int_equal(chan_stream_open(t->a.c, 0), 0);
	mem_fail_at(0, 0);
	assert_int_equal(chan_send(t->a.c, T_TYPE, 0, "a-frame-0", 9), 0);
	assert_int_equal(chan_send(t->a.c, T_TYPE, 0, big, sizeof(big)), 0);
	chan_close(t->a.c);
	assert_true(run_until(t, both_closed, RUN_MS));
	assert_int_equal(t->a.err, 0);
	assert_int_equal(t->b.err, 0);
	assert_int_equal(t->b.nframes, 2);
	assert_string_equal(t->b.frames[0].text, "a-frame-0");
	assert_int_equal(t->b.frames[1].n, sizeof(big));
	t_free(t);

	/* Allocation failing inside the loop (the responder's input buffer):
	 * the connection ends with an error, nothing crashes or leaks. */
	t = t_new();
	ca = cfg_host(t);
	cb = cfg_guest(t);
	t_connect(t, &ca, &cb);
	mem_fail_at(1, 1);
	bool ended = run_until(t, both_closed, RUN_MS);
	mem_fail_at(0, 0);
	assert_true(ended);
	assert_true(t->a.err < 0 && t->b.err < 0);
	assert_int_equal(t->a.ready + t->b.ready, 0);
	t_free(t);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_handshake_ok),
	    cmocka_unit_test(test_close_by_responder),
	    cmocka_unit_test(test_handshake_fresh_keys),
	    cmocka_unit_test(test_wrong_guest_key),
	    cmocka_unit_test(test_unknown_host_key),
	    cmocka_unit_test(test_wrong_psk),
	    cmocka_unit_test(test_replayed_msg1),
	    cmocka_unit_test(test_raw_msg1_faults),
	    cmocka_unit_test(test_initiator_timeout_and_cancel),
	    cmocka_unit_test(test_transport_faults),
	    cmocka_unit_test(test_data_after_final),
	    cmocka_unit_test(test_free_inside_frame),
	    cmocka_unit_test(test_many_small_frames),
	    cmocka_unit_test(test_rekey_bulk),
	    cmocka_unit_test(test_flow_control),
	    cmocka_unit_test(test_window_violation),
	    cmocka_unit_test(test_guest_opened_streams),
	    cmocka_unit_test(test_guest_window_violation),
	    cmocka_unit_test(test_alloc_failure_new),
	    cmocka_unit_test(test_alloc_failure_send),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
