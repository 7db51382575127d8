/* SPDX-License-Identifier: Apache-2.0 */
/* delta: the batch codec (build, sign, verify, caps, crafted refusals,
 * zstd bombs, allocation failures). The manifest it carries is tested in
 * test_manifest.c. */
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

#include <cmocka.h>
#include <sodium.h>
#include <zstd.h>

#include "testutil.h"

#include "airlock/content/chunk.h"
#include "airlock/content/delta.h"
#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

static const struct chunk_params small = {.min = 256, .avg = 1024, .max = 4096, .whole_max = 2048};
static uint8_t pk[32], sk[64], scope[32];

/* ---- batch codec ---- */

static void build_sample(uint64_t seq, uint8_t **out, size_t *n)
{
	struct delta_builder *b;
	uint8_t text[6000], noise[3000];
	memset(text, 'a', sizeof(text));
	tu_fill(noise, sizeof(noise), 4);
	uint8_t h[CHUNK_HASH_LEN], th[CHUNK_HASH_LEN];
	struct chunk tc[2] = {{.off = 0, .len = 3000}, {.off = 3000, .len = 3000}};
	chunk_hash(text, 3000, tc[0].hash);
	chunk_hash(text + 3000, 3000, tc[1].hash);
	chunk_list_hash(tc, 2, th); /* the file hash of a two-chunk PUT */
	assert_int_equal(delta_builder_new(seq, scope, &small, NULL, &b), 0);
	assert_int_equal(delta_add_mkdir(b, "dir", 0755), 0);
	assert_int_equal(delta_put_begin(b, "dir/text", 0644, NULL), 0);
	assert_int_equal(delta_put_inline(b, text, 3000), 0);
	assert_int_equal(delta_put_inline(b, text + 3000, 3000), 0);
	assert_int_equal(delta_put_end(b, th), 0);
	chunk_hash(noise, sizeof(noise), h);
	assert_int_equal(delta_put_begin(b, "noise", 0600, NULL), 0);
	assert_int_equal(delta_put_inline(b, noise, sizeof(noise)), 0);
	assert_int_equal(delta_put_end(b, h), 0);
	assert_int_equal(delta_put_begin(b, "refd", 0644, "dir/old"), 0);
	chunk_hash(text, 100, h);
	assert_int_equal(delta_put_ref(b, 4096, 100, h), 0);
	chunk_hash(text, 100, h);
	assert_int_equal(delta_put_end(b, h), 0);
	chunk_hash("", 0, h);
	assert_int_equal(delta_put_begin(b, "empty", 0644, NULL), 0);
	assert_int_equal(delta_put_end(b, h), 0);
	assert_int_equal(delta_add_symlink(b, "ln", "../x"), 0);
	assert_int_equal(delta_add_chmod(b, "existing", 0700), 0);
	assert_int_equal(delta_add_delete(b, "old", DELTA_DELETE_TREE), 0);
	assert_int_equal(delta_builder_ops(b), 8);
	size_t size = delta_builder_size(b);
	assert_int_equal(delta_builder_finish(b, sk, out, n), 0);
	assert_int_equal(size, *n);
	/* the bytes were handed over: the builder is empty, and builds the
	 * next batch from nothing */
	assert_int_equal(delta_builder_size(b), DELTA_HDR_LEN + DELTA_SIG_LEN);
	delta_builder_reset(b, 8);
	assert_int_equal(delta_add_mkdir(b, "next", 0755), 0);
	uint8_t *x2;
	size_t n2;
	assert_int_equal(delta_builder_finish(b, sk, &x2, &n2), 0);
	struct delta_batch *b2 = NULL;
	assert_int_equal(delta_batch_verify(x2, n2, pk, scope, 7, NULL, &b2, NULL, 0), 0);
	assert_int_equal(delta_batch_count(b2), 1);
	delta_batch_free(b2);
	mem_free(x2);
	delta_builder_free(b);
}

static void test_batch_roundtrip(void **state)
{
	(void)state;
	uint8_t *x, *y;
	size_t nx, ny;
	char err[256];
	build_sample(5, &x, &nx);
	build_sample(5, &y, &ny);
	assert_int_equal(nx, ny);
	assert_memory_equal(x, y, nx); /* deterministic, signature included */
	struct delta_batch *b;
	assert_int_equal(delta_batch_verify(x, nx, pk, scope, 4, NULL, &b, err, sizeof(err)), 0);
	assert_int_equal(delta_batch_seq(b), 5);
	assert_int_equal(delta_batch_count(b), 8);
	const struct delta_op *op = delta_batch_op(b, 1);
	assert_int_equal(op->type, DELTA_PUT);
	assert_string_equal(op->path, "dir/text");
	assert_string_equal(op->base, "dir/text");
	assert_int_equal(op->size, 6000);
	assert_int_equal(op->nchunks, 2);
	assert_int_equal(op->chunks[0].kind, DELTA_CHUNK_ZSTD); /* 'aaa...' shrinks */
	assert_false(op->has_refs);
	uint8_t *scratch = malloc(delta_batch_chunk_max(b));
	const uint8_t *data;
	assert_int_equal(delta_chunk_data(b, &op->chunks[0], scratch, &data), 0);
	assert_int_equal(data[2999], 'a');
	op = delta_batch_op(b, 2);
	assert_int_equal(op->chunks[0].kind, DELTA_CHUNK_RAW); /* noise does not */
	op = delta_batch_op(b, 3);
	assert_string_equal(op->base, "dir/old");
	assert_true(op->has_refs);
	assert_int_equal(op->chunks[0].kind, DELTA_CHUNK_REF);
	assert_int_equal(op->chunks[0].ref_off, 4096);
	assert_int_equal(delta_chunk_data(b, &op->chunks[0], scratch, &data), -EINVAL);
	assert_int_equal(delta_batch_op(b, 4)->nchunks, 0);
	assert_string_equal(delta_batch_op(b, 5)->target, "../x");
	assert_int_equal(delta_batch_op(b, 6)->mode, 0700);
	assert_int_equal(delta_batch_op(b, 7)->flags, DELTA_DELETE_TREE);
	assert_null(delta_batch_op(b, 8));
	free(scratch);
	delta_batch_free(b);

	/* sequence: repeated and old are refused, newer is fine */
	assert_int_equal(delta_batch_verify(x, nx, pk, scope, 5, NULL, &b, err, sizeof(err)), -ESTALE);
	assert_non_null(strstr(err, "sequence"));
	assert_int_equal(delta_batch_verify(x, nx, pk, scope, 9, NULL, &b, err, sizeof(err)), -ESTALE);
	/* another guest's scope, another key */
	uint8_t other[32];
	memcpy(other, scope, 32);
	other[31] ^= 1;
	assert_int_equal(delta_batch_verify(x, nx, pk, other, 0, NULL, &b, err, sizeof(err)), -EPERM);
	assert_int_equal(delta_batch_verify(x, nx, other, scope, 0, NULL, &b, err, sizeof(err)), -EPERM);
	mem_free(x);
	mem_free(y);
}

static void test_batch_bitflips(void **state)
{
	(void)state;
	uint8_t *x;
	size_t n;
	build_sample(1, &x, &n);
	for (size_t bit = 0; bit < n * 8; bit++) {
		struct delta_batch *b = NULL;
		x[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_int_equal(delta_batch_verify(x, n, pk, scope, 0, NULL, &b, NULL, 0), -EPERM);
		x[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		assert_null(b);
	}
	mem_free(x);
}

/* Every truncation of the signed part, re-signed so that the parser (not
 * the signature) has to deal with it. */
static void test_batch_truncations(void **state)
{
	(void)state;
	uint8_t *x;
	size_t n;
	build_sample(1, &x, &n);
	size_t body = n - DELTA_SIG_LEN;
	uint8_t *t = malloc(n);
	assert_non_null(t);
	for (size_t len = 0; len < body; len++) {
		memcpy(t, x, len);
		delta_sign(t, len, sk, t + len);
		struct delta_batch *b = NULL;
		int r = delta_batch_verify(t, len + DELTA_SIG_LEN, pk, scope, 0, NULL, &b, NULL, 0);
		assert_int_equal(r, -EBADMSG);
		assert_null(b);
	}
	free(t);
	mem_free(x);
}

static void test_batch_caps(void **state)
{
	(void)state;
	uint8_t *x;
	size_t n;
	struct delta_batch *b;
	build_sample(1, &x, &n);
	struct delta_caps c = delta_caps_default;
	c.max_batch = n - 1;
	assert_int_equal(delta_batch_verify(x, n, pk, scope, 0, &c, &b, NULL, 0), -EMSGSIZE);
	c = delta_caps_default;
	c.max_ops = 7;
	assert_int_equal(delta_batch_verify(x, n, pk, scope, 0, &c, &b, NULL, 0), -E2BIG);
	c = delta_caps_default;
	c.max_chunks = 3;
	assert_int_equal(delta_batch_verify(x, n, pk, scope, 0, &c, &b, NULL, 0), -E2BIG);
	c = delta_caps_default;
	c.max_chunk = 2999;
	assert_int_equal(delta_batch_verify(x, n, pk, scope, 0, &c, &b, NULL, 0), -EMSGSIZE);
	c = delta_caps_default;
	c.max_file = 5999;
	assert_int_equal(delta_batch_verify(x, n, pk, scope, 0, &c, &b, NULL, 0), -EMSGSIZE);
	mem_free(x);

	/* the builder says when a batch is full, and stays usable */
	struct delta_builder *bl;
	c = delta_caps_default;
	c.max_batch = 300;
	c.max_ops = 3;
	assert_int_equal(delta_builder_new(1, scope, &small, &c, &bl), 0);
	uint8_t big[250];
	tu_fill(big, sizeof(big), 1);
	uint8_t h[CHUNK_HASH_LEN];
	chunk_hash(big, sizeof(big), h);
	assert_int_equal(delta_add_mkdir(bl, "a", 0755), 0);
	size_t before = delta_builder_size(bl);
	assert_int_equal(delta_put_begin(bl, "f", 0644, NULL), 0);
	assert_int_equal(delta_put_inline(bl, big, sizeof(big)), -ENOBUFS);
	assert_int_equal(delta_builder_size(bl), before); /* dropped whole */
	assert_int_equal(delta_put_end(bl, h), -EINVAL);  /* no PUT open any more */
	assert_int_equal(delta_add_mkdir(bl, "b", 0755), 0);
	assert_int_equal(delta_add_mkdir(bl, "c", 0755), 0);
	assert_int_equal(delta_add_mkdir(bl, "d", 0755), -ENOBUFS); /* op cap */
	assert_int_equal(delta_add_mkdir(bl, "../e", 0755), -EINVAL);
	assert_int_equal(delta_add_mkdir(bl, "e", 04755), -EINVAL);
	assert_int_equal(delta_builder_finish(bl, sk, &x, &n), 0);
	assert_int_equal(delta_batch_verify(x, n, pk, scope, 0, &c, &b, NULL, 0), 0);
	assert_int_equal(delta_batch_count(b), 3);
	delta_batch_free(b);
	mem_free(x);
	delta_builder_free(bl);
}

/* ---- crafted batches (raw encoder, independent of the builder) ---- */

struct raw {
	struct buf b;
	uint32_t nops;
};

static void raw_begin(struct raw *r, uint64_t seq)
{
	buf_init(&r->b, 64u << 20);
	r->nops = 0;
	assert_int_equal(buf_put(&r->b, "ALDB", 4), 0);
	assert_int_equal(buf_put_u8(&r->b, DELTA_VERSION), 0);
	assert_int_equal(buf_put_u8(&r->b, 0), 0);
	assert_int_equal(buf_put_u16(&r->b, 0), 0);
	assert_int_equal(buf_put(&r->b, scope, 32), 0);
	assert_int_equal(buf_put_u64(&r->b, seq), 0);
	assert_int_equal(buf_put_u32(&r->b, 0), 0); /* patched */
}

static void raw_op(struct raw *r, uint8_t type, const void *path, size_t pl)
{
	assert_int_equal(buf_put_u8(&r->b, type), 0);
	assert_int_equal(buf_put_bytes(&r->b, path, pl), 0);
	r->nops++;
}

static void raw_put_hdr(struct raw *r, const char *path, uint32_t mode, uint64_t size, const uint8_t *hash,
			uint32_t nchunks)
{
	raw_op(r, DELTA_PUT, path, strlen(path));
	assert_int_equal(buf_put_u32(&r->b, mode), 0);
	assert_int_equal(buf_put_u64(&r->b, size), 0);
	assert_int_equal(buf_put(&r->b, hash, CHUNK_HASH_LEN), 0);
	assert_int_equal(buf_put_str(&r->b, ""), 0);
	assert_int_equal(buf_put_u32(&r->b, nchunks), 0);
}

static void raw_chunk_zstd(struct raw *r, uint32_t raw_len, const uint8_t *hash, const void *frame, size_t fl)
{
	assert_int_equal(buf_put_u8(&r->b, DELTA_CHUNK_ZSTD), 0);
	assert_int_equal(buf_put_u32(&r->b, raw_len), 0);
	assert_int_equal(buf_put(&r->b, hash, CHUNK_HASH_LEN), 0);
	assert_int_equal(buf_put_bytes(&r->b, frame, fl), 0);
}

static int raw_verify(struct raw *r)
{
	uint8_t *d = (uint8_t *)buf_ptr(&r->b);
	size_t n = buf_len(&r->b);
	uint8_t *sig;
	d[48] = (uint8_t)(r->nops >> 24);
	d[49] = (uint8_t)(r->nops >> 16);
	d[50] = (uint8_t)(r->nops >> 8);
	d[51] = (uint8_t)r->nops;
	assert_int_equal(buf_reserve(&r->b, DELTA_SIG_LEN, &sig), 0);
	delta_sign(buf_ptr(&r->b), n, sk, sig);
	buf_commit(&r->b, DELTA_SIG_LEN);
	struct delta_batch *b = NULL;
	char err[256];
	int rc = delta_batch_verify(buf_ptr(&r->b), buf_len(&r->b), pk, scope, 0, NULL, &b, err, sizeof(err));
	if (rc == 0)
		delta_batch_free(b);
	else
		assert_null(b);
	buf_clear(&r->b);
	return rc;
}

static void test_zstd_bombs(void **state)
{
	(void)state;
	size_t big = 8u << 20; /* twice the chunk cap */
	uint8_t *zeros = calloc(1, big);
	size_t cap = ZSTD_compressBound(big);
	uint8_t *frame = malloc(cap);
	uint8_t h[CHUNK_HASH_LEN];
	struct raw r;
	assert_non_null(zeros);
	assert_non_null(frame);

	/* 1. a small frame honestly declaring 8 MiB: over the chunk cap */
	size_t fl = ZSTD_compress(frame, cap, zeros, big, 1);
	assert_false(ZSTD_isError(fl));
	chunk_hash(zeros, big, h);
	raw_begin(&r, 1);
	raw_put_hdr(&r, "bomb", 0644, big, h, 1);
	raw_chunk_zstd(&r, (uint32_t)big, h, frame, fl);
	assert_int_equal(raw_verify(&r), -EMSGSIZE);

	/* 2. the same frame under a chunk that claims 1000 raw bytes */
	chunk_hash(zeros, 1000, h);
	raw_begin(&r, 1);
	raw_put_hdr(&r, "bomb", 0644, 1000, h, 1);
	raw_chunk_zstd(&r, 1000, h, frame, fl);
	assert_int_equal(raw_verify(&r), -EBADMSG);

	/* 3. a frame without a content size (streamed) */
	ZSTD_CCtx *cc = ZSTD_createCCtx();
	ZSTD_CCtx_setParameter(cc, ZSTD_c_contentSizeFlag, 0);
	fl = ZSTD_compress2(cc, frame, cap, zeros, 100000);
	assert_false(ZSTD_isError(fl));
	assert_int_equal(ZSTD_getFrameContentSize(frame, fl), ZSTD_CONTENTSIZE_UNKNOWN);
	chunk_hash(zeros, 100000, h);
	raw_begin(&r, 1);
	raw_put_hdr(&r, "bomb", 0644, 100000, h, 1);
	raw_chunk_zstd(&r, 100000, h, frame, fl);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	ZSTD_freeCCtx(cc);

	/* 4. two frames back to back (the second would overflow the buffer) */
	fl = ZSTD_compress(frame, cap, zeros, 1000, 1);
	memcpy(frame + fl, frame, fl);
	chunk_hash(zeros, 1000, h);
	raw_begin(&r, 1);
	raw_put_hdr(&r, "bomb", 0644, 1000, h, 1);
	raw_chunk_zstd(&r, 1000, h, frame, 2 * fl);
	assert_int_equal(raw_verify(&r), -EBADMSG);

	/* 5. a valid frame, but the payload hash is wrong */
	uint8_t wrong[CHUNK_HASH_LEN];
	memcpy(wrong, h, sizeof(wrong));
	wrong[0] ^= 1;
	raw_begin(&r, 1);
	raw_put_hdr(&r, "z", 0644, 1000, h, 1);
	raw_chunk_zstd(&r, 1000, wrong, frame, fl);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* ... and right: accepted */
	raw_begin(&r, 1);
	raw_put_hdr(&r, "z", 0644, 1000, h, 1);
	raw_chunk_zstd(&r, 1000, h, frame, fl);
	assert_int_equal(raw_verify(&r), 0);
	/* 6. corrupt frame data with the right header */
	frame[fl - 1] ^= 0xff;
	raw_begin(&r, 1);
	raw_put_hdr(&r, "z", 0644, 1000, h, 1);
	raw_chunk_zstd(&r, 1000, h, frame, fl);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* 7. "compressed" but not shorter than raw */
	raw_begin(&r, 1);
	raw_put_hdr(&r, "z", 0644, 10, h, 1);
	raw_chunk_zstd(&r, 10, h, frame, 10);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	free(zeros);
	free(frame);
}

static void test_crafted_structure(void **state)
{
	(void)state;
	struct raw r;
	uint8_t h[CHUNK_HASH_LEN];
	chunk_hash("hi", 2, h);
	/* unknown op type (there is no op for special files) */
	raw_begin(&r, 1);
	raw_op(&r, 6, "fifo", 4);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* op count larger than what follows */
	raw_begin(&r, 1);
	raw_op(&r, DELTA_DELETE, "x", 1);
	assert_int_equal(buf_put_u8(&r.b, 0), 0);
	r.nops = 2;
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* trailing bytes */
	raw_begin(&r, 1);
	raw_op(&r, DELTA_DELETE, "x", 1);
	assert_int_equal(buf_put_u16(&r.b, 0), 0);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* unknown delete flag */
	raw_begin(&r, 1);
	raw_op(&r, DELTA_DELETE, "x", 1);
	assert_int_equal(buf_put_u8(&r.b, 0x80), 0);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* chunks that do not add up to the size, raw chunk hash wrong, file hash wrong */
	raw_begin(&r, 1);
	raw_put_hdr(&r, "f", 0644, 3, h, 1);
	assert_int_equal(buf_put_u8(&r.b, DELTA_CHUNK_RAW), 0);
	assert_int_equal(buf_put_u32(&r.b, 2), 0);
	assert_int_equal(buf_put(&r.b, h, sizeof(h)), 0);
	assert_int_equal(buf_put(&r.b, "hi", 2), 0);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	raw_begin(&r, 1);
	raw_put_hdr(&r, "f", 0644, 2, h, 1);
	assert_int_equal(buf_put_u8(&r.b, DELTA_CHUNK_RAW), 0);
	assert_int_equal(buf_put_u32(&r.b, 2), 0);
	assert_int_equal(buf_put(&r.b, h, sizeof(h)), 0);
	assert_int_equal(buf_put(&r.b, "ho", 2), 0);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	uint8_t hh[CHUNK_HASH_LEN];
	memcpy(hh, h, sizeof(hh));
	hh[15] ^= 1;
	raw_begin(&r, 1);
	raw_put_hdr(&r, "f", 0644, 2, hh, 1);
	assert_int_equal(buf_put_u8(&r.b, DELTA_CHUNK_RAW), 0);
	assert_int_equal(buf_put_u32(&r.b, 2), 0);
	assert_int_equal(buf_put(&r.b, h, sizeof(h)), 0);
	assert_int_equal(buf_put(&r.b, "hi", 2), 0);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* unknown chunk kind; zero-length chunk */
	static const uint8_t kinds[] = {0, 4, 0xff};
	for (size_t i = 0; i < sizeof(kinds); i++) {
		raw_begin(&r, 1);
		raw_put_hdr(&r, "f", 0644, 2, h, 1);
		assert_int_equal(buf_put_u8(&r.b, kinds[i]), 0);
		assert_int_equal(buf_put_u32(&r.b, 2), 0);
		assert_int_equal(buf_put(&r.b, h, sizeof(h)), 0);
		assert_int_equal(buf_put(&r.b, "hi", 2), 0);
		assert_int_equal(raw_verify(&r), -EBADMSG);
	}
	/* a path in two ops, or deleted after being made */
	raw_begin(&r, 1);
	raw_op(&r, DELTA_MKDIR, "d", 1);
	assert_int_equal(buf_put_u32(&r.b, 0755), 0);
	raw_op(&r, DELTA_CHMOD, "d", 1);
	assert_int_equal(buf_put_u32(&r.b, 0700), 0);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	raw_begin(&r, 1);
	raw_op(&r, DELTA_MKDIR, "d", 1);
	assert_int_equal(buf_put_u32(&r.b, 0755), 0);
	raw_op(&r, DELTA_DELETE, "d", 1);
	assert_int_equal(buf_put_u8(&r.b, 0), 0);
	assert_int_equal(raw_verify(&r), -EBADMSG);
	/* delete then make: fine */
	raw_begin(&r, 1);
	raw_op(&r, DELTA_DELETE, "d", 1);
	assert_int_equal(buf_put_u8(&r.b, 0), 0);
	raw_op(&r, DELTA_MKDIR, "d", 1);
	assert_int_equal(buf_put_u32(&r.b, 0755), 0);
	assert_int_equal(raw_verify(&r), 0);
	/* a symlink target with NUL, an empty one, an over-long one */
	static const size_t tl[] = {0, 3, 4097};
	char target[4100];
	memset(target, 't', sizeof(target));
	target[1] = '\0';
	for (size_t i = 0; i < 3; i++) {
		raw_begin(&r, 1);
		raw_op(&r, DELTA_SYMLINK, "s", 1);
		assert_int_equal(buf_put_bytes(&r.b, tl[i] == 3 ? target : target + 2, tl[i]), 0);
		assert_int_equal(raw_verify(&r), -EBADMSG);
	}
}

/* ---- allocation failures ---- */

static void test_alloc_failures(void **state)
{
	(void)state;
	uint8_t *x;
	size_t n;
	build_sample(3, &x, &n);
	int r = -ENOMEM;
	unsigned long k;
	for (k = 1; r == -ENOMEM && k < 10000; k++) {
		struct delta_batch *b = NULL;
		mem_fail_at(k, 0);
		r = delta_batch_verify(x, n, pk, scope, 0, NULL, &b, NULL, 0);
		mem_fail_at(0, 0);
		if (r == 0)
			delta_batch_free(b);
		else
			assert_null(b);
	}
	assert_int_equal(r, 0);
	for (r = -ENOMEM, k = 1; r == -ENOMEM && k < 10000; k++) {
		uint8_t *y = NULL;
		size_t ny;
		struct delta_builder *bl = NULL;
		mem_fail_at(k, 0);
		r = delta_builder_new(3, scope, &small, NULL, &bl);
		if (r == 0) {
			uint8_t h[CHUNK_HASH_LEN];
			chunk_hash("abc", 3, h);
			if ((r = delta_add_mkdir(bl, "d", 0755)) == 0 &&
			    (r = delta_put_begin(bl, "d/f", 0644, NULL)) == 0 &&
			    (r = delta_put_inline(bl, "abc", 3)) == 0 && (r = delta_put_end(bl, h)) == 0)
				r = delta_builder_finish(bl, sk, &y, &ny);
		}
		mem_fail_at(0, 0);
		mem_free(y);
		delta_builder_free(bl);
	}
	assert_int_equal(r, 0);
	mem_free(x);
}

int main(void)
{
	assert_int_equal(sodium_init() >= 0, 1);
	crypto_sign_keypair(pk, sk);
	randombytes_buf(scope, sizeof(scope));
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_batch_roundtrip),   cmocka_unit_test(test_batch_bitflips),
	    cmocka_unit_test(test_batch_truncations), cmocka_unit_test(test_batch_caps),
	    cmocka_unit_test(test_zstd_bombs),	      cmocka_unit_test(test_crafted_structure),
	    cmocka_unit_test(test_alloc_failures),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
