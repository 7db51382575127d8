/* SPDX-License-Identifier: Apache-2.0 */
/*
 * noise: the public Noise test vectors for Noise_IKpsk2_25519_ChaChaPoly_SHA256
 * (tests/data/noise-ikpsk2-vectors.txt, from flynn/noise; path in
 * $NOISE_VECTORS or argv[1]), then the failure cases: wrong keys, wrong psk,
 * wrong prologue, low-order points, bit flips, sizes, call order.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cmocka.h>
#include <sodium.h>

#include "airlock/core/noise.h"
#include "airlock/core/wire.h"

#define PROTO	    "Noise_IKpsk2_25519_ChaChaPoly_SHA256"
#define FIELD_MAX   512
#define MAX_VECTORS 16
#define MAX_MSGS    4

static const char *vectors_path;

/* ---- cacophony text format ---- */

struct field {
	uint8_t b[FIELD_MAX];
	size_t n;
	int set;
};

struct vector {
	int line; /* where the block starts, for messages */
	char handshake[128];
	struct field init_static, resp_static, init_eph, resp_eph, prologue, psk;
	struct field payload[MAX_MSGS], cipher[MAX_MSGS];
};

static struct vector vectors[MAX_VECTORS];
static size_t n_vectors;

static int unhex(struct field *f, const char *hex)
{
	size_t len = strlen(hex), binlen = 0;

	if (len / 2 > sizeof(f->b) || sodium_hex2bin(f->b, sizeof(f->b), hex, len, NULL, &binlen, NULL) != 0 ||
	    binlen * 2 != len)
		return -1;
	f->n = binlen;
	f->set = 1;
	return 0;
}

static struct field *field_for(struct vector *v, const char *key)
{
	static const struct {
		const char *name;
		size_t off;
	} fixed[] = {
	    {"init_static", offsetof(struct vector, init_static)},
	    {"resp_static", offsetof(struct vector, resp_static)},
	    {"gen_init_ephemeral", offsetof(struct vector, init_eph)},
	    {"gen_resp_ephemeral", offsetof(struct vector, resp_eph)},
	    {"prologue", offsetof(struct vector, prologue)},
	    {"preshared_key", offsetof(struct vector, psk)},
	};
	unsigned i;
	char kind[16];

	for (i = 0; i < sizeof(fixed) / sizeof(fixed[0]); i++)
		if (!strcmp(key, fixed[i].name))
			return (struct field *)((char *)v + fixed[i].off);
	if (sscanf(key, "msg_%u_%15s", &i, kind) == 2 && i < MAX_MSGS) {
		if (!strcmp(kind, "payload"))
			return &v->payload[i];
		if (!strcmp(kind, "ciphertext"))
			return &v->cipher[i];
	}
	return NULL;
}

/* Read every block of the file; each must be our protocol and complete. */
static void load_vectors(void)
{
	FILE *f = fopen(vectors_path, "r");
	char line[2 * FIELD_MAX + 64];
	struct vector *v = NULL;
	int lineno = 0;

	if (!f)
		fail_msg("cannot open test vectors %s (set NOISE_VECTORS)", vectors_path);
	while (fgets(line, sizeof(line), f)) {
		lineno++;
		size_t len = strlen(line);
		if (len && line[len - 1] != '\n' && !feof(f))
			fail_msg("%s:%d: line too long", vectors_path, lineno);
		while (len && (line[len - 1] == '\n' || line[len - 1] == '\r'))
			line[--len] = '\0';
		if (line[0] == '#')
			continue;
		if (!len) {
			v = NULL; /* blank line ends a block */
			continue;
		}
		char *eq = strchr(line, '=');
		if (!eq)
			fail_msg("%s:%d: no '=' in line", vectors_path, lineno);
		*eq = '\0';
		if (!strcmp(line, "handshake")) {
			if (n_vectors == MAX_VECTORS)
				fail_msg("%s: too many blocks", vectors_path);
			v = &vectors[n_vectors++];
			memset(v, 0, sizeof(*v));
			v->line = lineno;
			snprintf(v->handshake, sizeof(v->handshake), "%s", eq + 1);
			continue;
		}
		if (!v)
			fail_msg("%s:%d: field outside a handshake block", vectors_path, lineno);
		struct field *fl = field_for(v, line);
		if (!fl)
			fail_msg("%s:%d: unexpected field '%s'", vectors_path, lineno, line);
		if (unhex(fl, eq + 1) < 0)
			fail_msg("%s:%d: bad hex in '%s'", vectors_path, lineno, line);
	}
	fclose(f);
}

static int setup_vectors(void **state)
{
	(void)state;
	load_vectors();
	return 0;
}

/* ---- helpers ---- */

static void kp_from_priv(struct noise_keypair *kp, const uint8_t *priv)
{
	memcpy(kp->priv, priv, NOISE_KEY_LEN);
	assert_int_equal(noise_pubkey(kp->pub, kp->priv), 0);
}

static void kp_random(struct noise_keypair *kp)
{
	randombytes_buf(kp->priv, sizeof(kp->priv));
	assert_int_equal(noise_pubkey(kp->pub, kp->priv), 0);
}

static void unhex32(uint8_t out[32], const char *hex)
{
	size_t n = 0;
	assert_int_equal(sodium_hex2bin(out, 32, hex, strlen(hex), NULL, &n, NULL), 0);
	assert_int_equal(n, 32);
}

/* A pair of handshake states ready for msg1. */
struct pair {
	struct noise_keypair is, rs;
	uint8_t psk[NOISE_KEY_LEN];
	struct noise_hs ini, res;
};

static void pair_init(struct pair *p, const char *iprologue, const char *rprologue)
{
	kp_random(&p->is);
	kp_random(&p->rs);
	randombytes_buf(p->psk, sizeof(p->psk));
	assert_int_equal(
	    noise_hs_init(&p->ini, NOISE_INITIATOR, iprologue, strlen(iprologue), &p->is, p->rs.pub, p->psk), 0);
	assert_int_equal(noise_hs_init(&p->res, NOISE_RESPONDER, rprologue, strlen(rprologue), &p->rs, NULL, p->psk),
			 0);
}

/* Full handshake with random ephemerals; returns the initiator's keys. */
static void handshake(struct pair *p, uint8_t i2r[32], uint8_t r2i[32])
{
	uint8_t m1[NOISE_MSG1_LEN(12)], m2[NOISE_MSG2_LEN(0)], ts[12], got[32];
	uint8_t ri2r[32], rr2i[32], ih[32], rh[32];
	size_t n, pn;
	int stage;

	noise_tai64n(ts);
	assert_int_equal(noise_write_msg1(&p->ini, ts, sizeof(ts), m1, sizeof(m1), &n), 0);
	assert_int_equal(n, sizeof(m1));
	assert_int_equal(noise_read_msg1(&p->res, m1, n, got, sizeof(got), &pn, &stage), 0);
	assert_int_equal(pn, sizeof(ts));
	assert_memory_equal(got, ts, sizeof(ts));
	assert_memory_equal(p->res.rs, p->is.pub, 32);
	assert_int_equal(noise_write_msg2(&p->res, NULL, 0, m2, sizeof(m2), &n), 0);
	assert_int_equal(n, sizeof(m2));
	assert_int_equal(noise_read_msg2(&p->ini, m2, n, NULL, 0, &pn), 0);
	assert_int_equal(pn, 0);
	assert_int_equal(noise_split(&p->ini, i2r, r2i, ih), 0);
	assert_int_equal(noise_split(&p->res, ri2r, rr2i, rh), 0);
	assert_memory_equal(i2r, ri2r, 32);
	assert_memory_equal(r2i, rr2i, 32);
	assert_memory_equal(ih, rh, 32);
	assert_memory_not_equal(i2r, r2i, 32);
}

/* ---- the public vectors ---- */

static void run_vector(const struct vector *v)
{
	struct noise_keypair is, rs;
	struct noise_hs ini, res;
	uint8_t out[FIELD_MAX + 128], got[FIELD_MAX], ik1[32], ik2[32], rk1[32], rk2[32], ih[32], rh[32];
	size_t n, pn;
	int stage;

	print_message("vector at line %d: prologue %zu bytes, payloads %zu/%zu bytes\n", v->line, v->prologue.n,
		      v->payload[0].n, v->payload[1].n);
	assert_string_equal(v->handshake, PROTO);
	assert_true(v->init_static.set && v->init_static.n == 32);
	assert_true(v->resp_static.set && v->resp_static.n == 32);
	assert_true(v->init_eph.set && v->init_eph.n == 32);
	assert_true(v->resp_eph.set && v->resp_eph.n == 32);
	assert_true(v->psk.set && v->psk.n == 32);
	for (int i = 0; i < MAX_MSGS; i++)
		assert_true(v->payload[i].set && v->cipher[i].set);

	kp_from_priv(&is, v->init_static.b);
	kp_from_priv(&rs, v->resp_static.b);
	assert_int_equal(noise_hs_init(&ini, NOISE_INITIATOR, v->prologue.b, v->prologue.n, &is, rs.pub, v->psk.b), 0);
	noise_hs_set_ephemeral(&ini, v->init_eph.b);
	assert_int_equal(noise_hs_init(&res, NOISE_RESPONDER, v->prologue.b, v->prologue.n, &rs, NULL, v->psk.b), 0);
	noise_hs_set_ephemeral(&res, v->resp_eph.b);

	/* msg_0: -> e, es, s, ss */
	assert_int_equal(noise_write_msg1(&ini, v->payload[0].b, v->payload[0].n, out, sizeof(out), &n), 0);
	assert_int_equal(n, v->cipher[0].n);
	assert_memory_equal(out, v->cipher[0].b, n);
	assert_int_equal(noise_read_msg1(&res, v->cipher[0].b, v->cipher[0].n, got, sizeof(got), &pn, &stage), 0);
	assert_int_equal(pn, v->payload[0].n);
	assert_memory_equal(got, v->payload[0].b, pn);
	assert_memory_equal(res.rs, is.pub, 32);

	/* msg_1: <- e, ee, se, psk */
	assert_int_equal(noise_write_msg2(&res, v->payload[1].b, v->payload[1].n, out, sizeof(out), &n), 0);
	assert_int_equal(n, v->cipher[1].n);
	assert_memory_equal(out, v->cipher[1].b, n);
	assert_int_equal(noise_read_msg2(&ini, v->cipher[1].b, v->cipher[1].n, got, sizeof(got), &pn), 0);
	assert_int_equal(pn, v->payload[1].n);
	assert_memory_equal(got, v->payload[1].b, pn);

	assert_int_equal(noise_split(&ini, ik1, ik2, ih), 0);
	assert_int_equal(noise_split(&res, rk1, rk2, rh), 0);
	assert_memory_equal(ik1, rk1, 32);
	assert_memory_equal(ik2, rk2, 32);
	assert_memory_equal(ih, rh, 32);

	/* msg_2: initiator -> responder transport message, n = 0, empty ad */
	assert_int_equal(noise_encrypt(ik1, 0, NULL, 0, v->payload[2].b, v->payload[2].n, out), 0);
	assert_int_equal(v->payload[2].n + NOISE_TAG_LEN, v->cipher[2].n);
	assert_memory_equal(out, v->cipher[2].b, v->cipher[2].n);
	assert_int_equal(noise_decrypt(rk1, 0, NULL, 0, v->cipher[2].b, v->cipher[2].n, got), 0);
	assert_memory_equal(got, v->payload[2].b, v->payload[2].n);

	/* msg_3: responder -> initiator, its own first message: n = 0 */
	assert_int_equal(noise_encrypt(rk2, 0, NULL, 0, v->payload[3].b, v->payload[3].n, out), 0);
	assert_int_equal(v->payload[3].n + NOISE_TAG_LEN, v->cipher[3].n);
	assert_memory_equal(out, v->cipher[3].b, v->cipher[3].n);
	assert_int_equal(noise_decrypt(ik2, 0, NULL, 0, v->cipher[3].b, v->cipher[3].n, got), 0);
	assert_memory_equal(got, v->payload[3].b, v->payload[3].n);

	/* Split wiped both states. */
	assert_true(sodium_is_zero((const uint8_t *)&ini, sizeof(ini)));
	assert_true(sodium_is_zero((const uint8_t *)&res, sizeof(res)));
}

static void test_vectors(void **state)
{
	(void)state;
	/* flynn/noise has 4 IKpsk2 blocks: with and without a prologue, with
	 * and without payloads. */
	assert_int_equal(n_vectors, 4);
	for (size_t i = 0; i < n_vectors; i++)
		run_vector(&vectors[i]);
}

/* ---- properties ---- */

static void test_random_ephemerals_differ(void **state)
{
	(void)state;
	struct pair a, b;
	uint8_t a1[32], a2[32], b1[32], b2[32];

	pair_init(&a, "p", "p");
	b = a; /* same statics and psk */
	handshake(&a, a1, a2);
	handshake(&b, b1, b2);
	assert_memory_not_equal(a1, b1, 32);
	assert_memory_not_equal(a2, b2, 32);
}

static void test_zero_psk_default(void **state)
{
	(void)state;
	struct pair p;
	uint8_t zero[32] = {0}, k1[32], k2[32];

	/* psk NULL on one side and 32 zero bytes on the other agree. */
	pair_init(&p, "", "");
	assert_int_equal(noise_hs_init(&p.ini, NOISE_INITIATOR, NULL, 0, &p.is, p.rs.pub, NULL), 0);
	assert_int_equal(noise_hs_init(&p.res, NOISE_RESPONDER, NULL, 0, &p.rs, NULL, zero), 0);
	handshake(&p, k1, k2);
}

static void test_wrong_responder_key(void **state)
{
	(void)state;
	struct pair p;
	struct noise_keypair other;
	uint8_t m1[NOISE_MSG1_LEN(12)], ts[12] = {0}, got[12];
	size_t n, pn;
	int stage = -1;

	pair_init(&p, "", "");
	kp_random(&other);
	assert_int_equal(noise_hs_init(&p.ini, NOISE_INITIATOR, NULL, 0, &p.is, other.pub, p.psk), 0);
	assert_int_equal(noise_write_msg1(&p.ini, ts, sizeof(ts), m1, sizeof(m1), &n), 0);
	assert_int_equal(noise_read_msg1(&p.res, m1, n, got, sizeof(got), &pn, &stage), -EBADMSG);
	assert_int_equal(stage, 1);
	/* The failed state is wiped and refuses further use. */
	assert_true(sodium_is_zero((const uint8_t *)&p.res, sizeof(p.res)));
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m1, sizeof(m1), &n), -EPROTO);
	noise_hs_clear(&p.ini);
}

static void test_wrong_psk(void **state)
{
	(void)state;
	struct pair p;
	uint8_t m1[NOISE_MSG1_LEN(0)], m2[NOISE_MSG2_LEN(0)], other[32];
	size_t n, pn;
	int stage;

	pair_init(&p, "", "");
	randombytes_buf(other, sizeof(other));
	assert_int_equal(noise_hs_init(&p.res, NOISE_RESPONDER, NULL, 0, &p.rs, NULL, other), 0);
	assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), 0);
	/* psk2: msg1 does not depend on the psk, so the responder accepts it */
	assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), 0);
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), 0);
	assert_int_equal(noise_read_msg2(&p.ini, m2, n, NULL, 0, &pn), -EBADMSG);
	noise_hs_clear(&p.res);

	/* A psk on one side only is a mismatch too. */
	pair_init(&p, "", "");
	assert_int_equal(noise_hs_init(&p.res, NOISE_RESPONDER, NULL, 0, &p.rs, NULL, NULL), 0);
	assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), 0);
	assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), 0);
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), 0);
	assert_int_equal(noise_read_msg2(&p.ini, m2, n, NULL, 0, &pn), -EBADMSG);
	noise_hs_clear(&p.res);
}

static void test_prologue_mismatch(void **state)
{
	(void)state;
	struct pair p;
	uint8_t m1[NOISE_MSG1_LEN(0)];
	size_t n, pn;
	int stage;

	pair_init(&p, "airlock wire v1", "airlock wire v2");
	assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), 0);
	assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), -EBADMSG);
	assert_int_equal(stage, 1);

	pair_init(&p, "", "x");
	assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), 0);
	assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), -EBADMSG);
	noise_hs_clear(&p.ini);
}

/* Points of small order on Curve25519 (and on its twist), as listed by
 * libsodium and by Bernstein's "Curve25519 small-order points": X25519 with
 * any of them gives the all-zero output. The high bit is ignored by X25519,
 * so the same points with bit 255 set are included too. */
static const char *const low_order[] = {
    "0000000000000000000000000000000000000000000000000000000000000000",
    "0100000000000000000000000000000000000000000000000000000000000000",
    "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b800",
    "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f1157",
    "ecffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "edffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "eeffffffffffffffffffffffffffffffffffffffffffffffffffffffffffff7f",
    "0000000000000000000000000000000000000000000000000000000000000080",
    "0100000000000000000000000000000000000000000000000000000000000080",
    "e0eb7a7c3b41b8ae1656e3faf19fc46ada098deb9c32b1fd866205165f49b880",
    "5f9c95bca3508c24b1d0b1559c83ef5b04445cc4581c8e86d8224eddd09f11d7",
};

static void test_low_order_ephemeral(void **state)
{
	(void)state;
	uint8_t m1[NOISE_MSG1_LEN(0)], m2[NOISE_MSG2_LEN(0)], bad[32];
	struct pair p;
	size_t n, pn;
	int stage;

	for (size_t i = 0; i < sizeof(low_order) / sizeof(low_order[0]); i++) {
		unhex32(bad, low_order[i]);

		/* in msg1: the responder's es = DH(s, re) */
		pair_init(&p, "", "");
		assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), 0);
		memcpy(m1, bad, 32);
		assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), -EKEYREJECTED);
		assert_true(sodium_is_zero((const uint8_t *)&p.res, sizeof(p.res)));

		/* in msg2: the initiator's ee = DH(e, re) */
		pair_init(&p, "", "");
		assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), 0);
		assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), 0);
		assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), 0);
		memcpy(m2, bad, 32);
		assert_int_equal(noise_read_msg2(&p.ini, m2, n, NULL, 0, &pn), -EKEYREJECTED);
		noise_hs_clear(&p.res);

		/* as the pinned responder key: es at the initiator */
		assert_int_equal(noise_hs_init(&p.ini, NOISE_INITIATOR, NULL, 0, &p.is, bad, NULL), 0);
		assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), -EKEYREJECTED);
		assert_true(sodium_is_zero(m1, sizeof(m1)));
	}
}

static void test_bit_flips(void **state)
{
	(void)state;
	uint8_t m1[NOISE_MSG1_LEN(12)], m2[NOISE_MSG2_LEN(4)], ts[12], got[16];
	struct noise_hs res0, ini1, hs;
	struct pair p;
	size_t n1, n2, pn;
	int r, stage;

	pair_init(&p, WIRE_PROLOGUE, WIRE_PROLOGUE);
	res0 = p.res; /* responder before msg1 */
	noise_tai64n(ts);
	assert_int_equal(noise_write_msg1(&p.ini, ts, sizeof(ts), m1, sizeof(m1), &n1), 0);
	ini1 = p.ini; /* initiator waiting for msg2 */
	assert_int_equal(noise_read_msg1(&p.res, m1, n1, got, sizeof(got), &pn, &stage), 0);
	assert_int_equal(noise_write_msg2(&p.res, "ok!!", 4, m2, sizeof(m2), &n2), 0);
	noise_hs_clear(&p.res);

	for (size_t bit = 0; bit < n1 * 8; bit++) {
		hs = res0;
		m1[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		r = noise_read_msg1(&hs, m1, n1, got, sizeof(got), &pn, &stage);
		m1[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		if (r != -EBADMSG && r != -EKEYREJECTED)
			fail_msg("msg1 with bit %zu flipped: got %d", bit, r);
		assert_true(sodium_is_zero((const uint8_t *)&hs, sizeof(hs)));
	}
	for (size_t bit = 0; bit < n2 * 8; bit++) {
		hs = ini1;
		m2[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		r = noise_read_msg2(&hs, m2, n2, got, sizeof(got), &pn);
		m2[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		if (r != -EBADMSG && r != -EKEYREJECTED)
			fail_msg("msg2 with bit %zu flipped: got %d", bit, r);
	}
	/* and the untouched messages still work from the saved states */
	hs = res0;
	assert_int_equal(noise_read_msg1(&hs, m1, n1, got, sizeof(got), &pn, &stage), 0);
	noise_hs_clear(&hs);
	hs = ini1;
	assert_int_equal(noise_read_msg2(&hs, m2, n2, got, sizeof(got), &pn), 0);
	assert_int_equal(pn, 4);
	assert_memory_equal(got, "ok!!", 4);
	noise_hs_clear(&hs);
	noise_hs_clear(&res0);
	noise_hs_clear(&ini1);
	noise_hs_clear(&p.ini);
}

static void test_sizes(void **state)
{
	(void)state;
	uint8_t m1[NOISE_MSG1_LEN(12) + 1], m2[NOISE_MSG2_LEN(0) + 1], ts[12] = {1}, got[12];
	struct pair p;
	size_t n, pn;
	int stage;

	pair_init(&p, "", "");
	/* output buffer one byte short: refused, state untouched, retry works */
	assert_int_equal(noise_write_msg1(&p.ini, ts, sizeof(ts), m1, NOISE_MSG1_LEN(12) - 1, &n), -EMSGSIZE);
	assert_int_equal(noise_write_msg1(&p.ini, ts, sizeof(ts), m1, sizeof(m1), &n), 0);
	assert_int_equal(n, NOISE_MSG1_LEN(12));

	/* shorter than e + enc(s) + tag */
	assert_int_equal(noise_read_msg1(&p.res, m1, NOISE_MSG1_LEN(0) - 1, got, sizeof(got), &pn, &stage), -EMSGSIZE);
	assert_int_equal(noise_read_msg1(&p.res, m1, 0, got, sizeof(got), &pn, &stage), -EMSGSIZE);
	/* payload larger than the caller's buffer */
	assert_int_equal(noise_read_msg1(&p.res, m1, n, got, sizeof(got) - 1, &pn, &stage), -EMSGSIZE);
	/* longer than the Noise maximum of 65535 bytes */
	assert_int_equal(noise_read_msg1(&p.res, m1, 65536, got, SIZE_MAX, &pn, &stage), -EMSGSIZE);
	/* one extra byte: parsed as a longer payload, which fails its tag */
	m1[n] = 0;
	{
		struct noise_hs copy = p.res;
		uint8_t big[13];
		assert_int_equal(noise_read_msg1(&copy, m1, n + 1, big, sizeof(big), &pn, &stage), -EBADMSG);
		assert_int_equal(stage, 2);
	}
	/* none of the size errors changed the state */
	assert_int_equal(noise_read_msg1(&p.res, m1, n, got, sizeof(got), &pn, &stage), 0);

	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, NOISE_MSG2_LEN(0) - 1, &n), -EMSGSIZE);
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), 0);
	assert_int_equal(n, NOISE_MSG2_LEN(0));
	assert_int_equal(noise_read_msg2(&p.ini, m2, NOISE_MSG2_LEN(0) - 1, NULL, 0, &pn), -EMSGSIZE);
	assert_int_equal(noise_read_msg2(&p.ini, m2, NOISE_MSG2_LEN(0) + 1, NULL, 0, &pn), -EMSGSIZE);
	assert_int_equal(noise_read_msg2(&p.ini, m2, 70000, NULL, SIZE_MAX, &pn), -EMSGSIZE);
	assert_int_equal(noise_read_msg2(&p.ini, m2, n, NULL, 0, &pn), 0);

	/* payloads that would make a message over 65535 bytes */
	noise_hs_clear(&p.ini);
	noise_hs_clear(&p.res);
	pair_init(&p, "", "");
	assert_int_equal(noise_write_msg1(&p.ini, ts, 65535, m1, SIZE_MAX, &n), -EMSGSIZE);
	assert_int_equal(noise_write_msg1(&p.ini, ts, SIZE_MAX, m1, SIZE_MAX, &n), -EMSGSIZE);
	noise_hs_clear(&p.ini);
	noise_hs_clear(&p.res);
}

static void test_call_order(void **state)
{
	(void)state;
	uint8_t m1[NOISE_MSG1_LEN(0)], m2[NOISE_MSG2_LEN(0)], k1[32], k2[32];
	struct noise_hs zero;
	struct pair p;
	size_t n, pn;
	int stage;

	pair_init(&p, "", "");
	/* wrong role */
	assert_int_equal(noise_read_msg1(&p.ini, m1, sizeof(m1), NULL, 0, &pn, &stage), -EPROTO);
	assert_int_equal(noise_write_msg2(&p.ini, NULL, 0, m2, sizeof(m2), &n), -EPROTO);
	assert_int_equal(noise_write_msg1(&p.res, NULL, 0, m1, sizeof(m1), &n), -EPROTO);
	assert_int_equal(noise_read_msg2(&p.res, m2, sizeof(m2), NULL, 0, &pn), -EPROTO);
	/* too early */
	assert_int_equal(noise_read_msg2(&p.ini, m2, sizeof(m2), NULL, 0, &pn), -EPROTO);
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), -EPROTO);
	assert_int_equal(noise_split(&p.ini, k1, k2, NULL), -EPROTO);
	assert_int_equal(noise_split(&p.res, k1, k2, NULL), -EPROTO);

	assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), 0);
	/* twice */
	assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), -EPROTO);
	assert_int_equal(noise_split(&p.ini, k1, k2, NULL), -EPROTO);
	assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), 0);
	assert_int_equal(noise_read_msg1(&p.res, m1, n, NULL, 0, &pn, &stage), -EPROTO);
	assert_int_equal(noise_split(&p.res, k1, k2, NULL), -EPROTO);
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), 0);
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), -EPROTO);
	assert_int_equal(noise_read_msg2(&p.ini, m2, n, NULL, 0, &pn), 0);
	assert_int_equal(noise_read_msg2(&p.ini, m2, n, NULL, 0, &pn), -EPROTO);
	assert_int_equal(noise_split(&p.ini, k1, k2, NULL), 0);
	/* split wipes: a second split, or anything else, is out of order */
	assert_int_equal(noise_split(&p.ini, k1, k2, NULL), -EPROTO);
	assert_int_equal(noise_write_msg1(&p.ini, NULL, 0, m1, sizeof(m1), &n), -EPROTO);
	noise_hs_clear(&p.res);
	noise_hs_clear(&p.res); /* twice is fine */
	noise_hs_clear(NULL);
	assert_int_equal(noise_write_msg2(&p.res, NULL, 0, m2, sizeof(m2), &n), -EPROTO);

	/* a zeroed struct was never initialised */
	memset(&zero, 0, sizeof(zero));
	assert_int_equal(noise_write_msg1(&zero, NULL, 0, m1, sizeof(m1), &n), -EPROTO);
	assert_int_equal(noise_read_msg1(&zero, m1, sizeof(m1), NULL, 0, &pn, &stage), -EPROTO);

	/* bad arguments to init */
	assert_int_equal(noise_hs_init(&zero, NOISE_INITIATOR, NULL, 0, &p.is, NULL, NULL), -EINVAL);
	assert_int_equal(noise_hs_init(&zero, (enum noise_role)3, NULL, 0, &p.is, p.rs.pub, NULL), -EINVAL);
	assert_int_equal(noise_hs_init(&zero, NOISE_RESPONDER, NULL, 1, &p.rs, NULL, NULL), -EINVAL);
	assert_int_equal(noise_hs_init(&zero, NOISE_RESPONDER, NULL, 0, NULL, NULL, NULL), -EINVAL);
}

static void test_cipher(void **state)
{
	(void)state;
	uint8_t k[32], c[64 + 16], pt[64], msg[64];

	randombytes_buf(k, sizeof(k));
	randombytes_buf(msg, sizeof(msg));
	assert_int_equal(noise_encrypt(k, 7, "ad", 2, msg, sizeof(msg), c), 0);
	assert_int_equal(noise_decrypt(k, 7, "ad", 2, c, sizeof(c), pt), 0);
	assert_memory_equal(pt, msg, sizeof(msg));
	/* nonce, ad and key are all bound */
	assert_int_equal(noise_decrypt(k, 8, "ad", 2, c, sizeof(c), pt), -EBADMSG);
	assert_int_equal(noise_decrypt(k, 7, "aD", 2, c, sizeof(c), pt), -EBADMSG);
	assert_int_equal(noise_decrypt(k, 7, NULL, 0, c, sizeof(c), pt), -EBADMSG);
	k[0] ^= 1;
	assert_int_equal(noise_decrypt(k, 7, "ad", 2, c, sizeof(c), pt), -EBADMSG);
	k[0] ^= 1;
	/* too short to hold a tag; the reserved nonce 2^64-1 */
	assert_int_equal(noise_decrypt(k, 7, "ad", 2, c, NOISE_TAG_LEN - 1, pt), -EMSGSIZE);
	assert_int_equal(noise_encrypt(k, UINT64_MAX, NULL, 0, msg, sizeof(msg), c), -EOVERFLOW);
	assert_int_equal(noise_decrypt(k, UINT64_MAX, NULL, 0, c, sizeof(c), pt), -EOVERFLOW);
	/* empty plaintext: just the tag */
	assert_int_equal(noise_encrypt(k, 0, NULL, 0, NULL, 0, c), 0);
	assert_int_equal(noise_decrypt(k, 0, NULL, 0, c, NOISE_TAG_LEN, pt), 0);

	/* The nonce is 4 zero bytes then the counter little-endian (Noise
	 * 12.3), which is exactly the IETF nonce built here by hand. */
	uint8_t nonce[12] = {0, 0, 0, 0, 0x08, 0x07, 0x06, 0x05, 0x04, 0x03, 0x02, 0x01}, ref[64 + 16];
	crypto_aead_chacha20poly1305_ietf_encrypt(ref, NULL, msg, sizeof(msg), NULL, 0, NULL, nonce, k);
	assert_int_equal(noise_encrypt(k, 0x0102030405060708ull, NULL, 0, msg, sizeof(msg), c), 0);
	assert_memory_equal(c, ref, sizeof(ref));
}

static uint64_t be64(const uint8_t *p)
{
	uint64_t v = 0;
	for (int i = 0; i < 8; i++)
		v = v << 8 | p[i];
	return v;
}

static void test_tai64n(void **state)
{
	(void)state;
	uint8_t a[12], b[12];
	time_t before = time(NULL);

	noise_tai64n(a);
	noise_tai64n(b);
	uint64_t sec = be64(a);
	uint32_t ns = (uint32_t)a[8] << 24 | (uint32_t)a[9] << 16 | (uint32_t)a[10] << 8 | a[11];
	assert_true(sec >= (UINT64_C(1) << 62) + (uint64_t)before);
	assert_true(sec <= (UINT64_C(1) << 62) + (uint64_t)before + 5);
	assert_true(ns < 1000000000u);
	/* big-endian, so later stamps compare greater with memcmp */
	assert_true(memcmp(a, b, 12) <= 0);
}

static void test_pubkey(void **state)
{
	(void)state;
	/* RFC 7748 6.1: Alice's private key and public key */
	uint8_t priv[32], want[32], pub[32];

	unhex32(priv, "77076d0a7318a57d3c16c17251b26645df4c2f87ebc0992ab177fba51db92c2a");
	unhex32(want, "8520f0098930a754748b7ddcb43ef75a0dbf3a0d26381af4eba4a98eaa9b4e6a");
	assert_int_equal(noise_pubkey(pub, priv), 0);
	assert_memory_equal(pub, want, 32);
}

int main(int argc, char **argv)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_vectors),
	    cmocka_unit_test(test_pubkey),
	    cmocka_unit_test(test_random_ephemerals_differ),
	    cmocka_unit_test(test_zero_psk_default),
	    cmocka_unit_test(test_wrong_responder_key),
	    cmocka_unit_test(test_wrong_psk),
	    cmocka_unit_test(test_prologue_mismatch),
	    cmocka_unit_test(test_low_order_ephemeral),
	    cmocka_unit_test(test_bit_flips),
	    cmocka_unit_test(test_sizes),
	    cmocka_unit_test(test_call_order),
	    cmocka_unit_test(test_cipher),
	    cmocka_unit_test(test_tai64n),
	};

	if (sodium_init() < 0)
		return 1;
	vectors_path = argc > 1 ? argv[1] : getenv("NOISE_VECTORS");
	if (!vectors_path) {
		fprintf(stderr, "test_noise: give the vectors file as argv[1] or in $NOISE_VECTORS\n");
		return 1;
	}
	return cmocka_run_group_tests(tests, setup_vectors, NULL);
}
