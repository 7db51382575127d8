/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prep: the worker threads that prepare small files' PUTs (prep.h). Each
 * test checks what the engine relies on: results come back in submission
 * order whatever order the workers finish in, each one the record
 * delta_put_inline would have made for that file (byte-identical batches);
 * a file that changed since the scan (content, size, type, gone) is never
 * encoded; content a rule matches is judged and never encoded; the bounds
 * hold; cancel and free leave no job running (ASan: nothing leaks).
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/content/chunk.h"
#include "airlock/content/delta.h"
#include "airlock/core/mem.h"
#include "airlock/sync/prep.h"
#include "testutil.h"

static char dir[128];
static int dfd = -1;
static const uint8_t scope[DELTA_SCOPE_LEN] = {7};
static uint8_t pk[DELTA_PK_LEN], sk[DELTA_SK_LEN];

static int setup(void **state)
{
	(void)state;
	tu_tmpdir(dir, sizeof(dir), "prep");
	dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	crypto_sign_keypair(pk, sk);
	return dfd >= 0 ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	close(dfd);
	tu_rm_rf(dir);
	return 0;
}

/* File `name` of n bytes from seed, half compressible; its hash in h. */
static void make(const char *name, size_t n, uint32_t seed, uint8_t h[CHUNK_HASH_LEN])
{
	uint8_t *d = malloc(n ? n : 1);
	assert_non_null(d);
	tu_fill(d, n, seed);
	for (size_t i = 0; i < n / 2; i++)
		d[i] = (uint8_t)('a' + i % 7);
	tu_put_file(dfd, name, d, n, 0644);
	chunk_hash(n ? d : (const uint8_t *)"", n, h);
	free(d);
}

/* The signed batch of one PUT of `name`: from delta_put_inline over the
 * file's bytes (rec NULL) or from a prepared record. */
static uint8_t *batch_of(const char *name, const uint8_t *rec, size_t nrec, size_t *n)
{
	struct delta_builder *b;
	uint8_t h[CHUNK_HASH_LEN], *out;
	size_t len;
	char *d = tu_read_file(dfd, name, &len);

	assert_non_null(d);
	chunk_hash(len ? (const uint8_t *)d : (const uint8_t *)"", len, h);
	assert_int_equal(delta_builder_new(1, scope, NULL, NULL, &b), 0);
	assert_int_equal(delta_put_begin(b, name, 0644, NULL), 0);
	if (rec && nrec)
		assert_int_equal(delta_put_encoded(b, rec, nrec), 0);
	else if (!rec && len)
		assert_int_equal(delta_put_inline(b, d, len), 0);
	assert_int_equal(delta_put_end(b, h), 0);
	assert_int_equal(delta_builder_finish(b, sk, &out, n), 0);
	delta_builder_free(b);
	free(d);
	return out;
}

static struct prep_job job(uint64_t tag, const char *path, uint64_t size, const uint8_t h[CHUNK_HASH_LEN], bool scan)
{
	struct prep_job j = {.tag = tag, .path = path, .size = size, .scan = scan};
	memcpy(j.hash, h, CHUNK_HASH_LEN);
	return j;
}

/* The head, waiting on the pool's descriptor when it is not done (the
 * poll's bound only keeps a broken pool from hanging the suite). */
static void head_by_fd(struct prep *p, struct prep_out *o)
{
	int r;
	while ((r = prep_head(p, false, o)) == 0) {
		struct pollfd pf = {.fd = prep_fd(p), .events = POLLIN};
		assert_int_equal(poll(&pf, 1, 30000), 1);
	}
	assert_int_equal(r, 1);
}

/* 400 files of 0..128 KiB after one of 4 MiB (its worker is still at it
 * when the others are done: they finish out of order), submitted as the bounds allow and taken at the head: tags in
 * submission order, each the record of its own file, the batch made from
 * it byte-identical to one made by delta_put_inline and verifying. */
static void test_order_and_records(void **state)
{
	(void)state;
	enum { N = 400 };
	static char names[N][32];
	static uint64_t sizes[N];
	static uint8_t hashes[N][CHUNK_HASH_LEN];
	uint64_t rs = 0x9e3779b97f4a7c15ull;
	struct prep *p;

	for (int i = 0; i < N; i++) {
		snprintf(names[i], sizeof(names[i]), "o%03d", i);
		sizes[i] = i == 0 ? CHUNK_SIZE_LIMIT : i % 50 == 0 ? 0 : tu_rand(&rs, 128 * 1024);
		make(names[i], sizes[i], (uint32_t)i + 1, hashes[i]);
	}
	assert_int_equal(prep_new(dfd, 4, 8u << 20, 1, &p), 0);
	assert_true(prep_threads(p) >= 1);
	int sub = 0, taken = 0;
	while (taken < N) {
		while (sub < N) {
			struct prep_job j = job((uint64_t)sub * 3 + 1, names[sub], sizes[sub], hashes[sub], false);
			int r = prep_submit(p, &j);
			if (r == -EAGAIN)
				break;
			assert_int_equal(r, 0);
			sub++;
		}
		assert_true(sub > taken); /* the bound never refuses an empty pool */
		struct prep_out o;
		if (taken % 2)
			assert_int_equal(prep_head(p, true, &o), 1);
		else
			head_by_fd(p, &o);
		assert_int_equal(o.tag, (uint64_t)taken * 3 + 1);
		assert_int_equal(o.r, 0);
		assert_false(o.judged);
		assert_int_equal(o.nrec == 0, sizes[taken] == 0);
		size_t na, nb;
		uint8_t *a = batch_of(names[taken], NULL, 0, &na);
		uint8_t *b = batch_of(names[taken], o.rec, o.nrec, &nb);
		assert_int_equal(na, nb);
		assert_memory_equal(a, b, na);
		struct delta_batch *db;
		char err[256];
		assert_int_equal(delta_batch_verify(b, nb, pk, scope, 0, NULL, &db, err, sizeof(err)), 0);
		delta_batch_free(db);
		mem_free(a);
		mem_free(b);
		prep_pop(p);
		taken++;
		assert_int_equal(prep_pending(p), (size_t)(sub - taken));
	}
	assert_int_equal(prep_head(p, false, &(struct prep_out){0}), -ENOENT);
	prep_free(p);
}

/* A file that is not what the scan saw is never encoded: other content of
 * the same size, another size, a symlink or a directory in its place,
 * gone. The engine skips these (-ESTALE, -ENOENT) like put_checked does. */
static void test_stale(void **state)
{
	(void)state;
	uint8_t h[CHUNK_HASH_LEN], h2[CHUNK_HASH_LEN], hs[CHUNK_HASH_LEN], hl[CHUNK_HASH_LEN], hk[CHUNK_HASH_LEN];
	struct prep *p;
	struct prep_out o;

	make("s_same", 5000, 11, h);
	make("s_same", 5000, 12, h2); /* rewritten after the scan: same size */
	make("s_size", 5000, 13, hs);
	make("s_size", 5001, 13, h2);
	make("s_link_t", 100, 14, hl);
	make("s_link", 100, 14, hl);
	assert_int_equal(unlinkat(dfd, "s_link", 0), 0);
	assert_int_equal(symlinkat("s_link_t", dfd, "s_link"), 0);
	assert_int_equal(mkdirat(dfd, "s_dir", 0755), 0);
	make("s_ok", 100, 15, hk);

	struct prep_job jobs[] = {
	    job(0, "s_same", 5000, h, false),  job(1, "s_size", 5000, hs, false), job(2, "s_link", 100, hl, false),
	    job(3, "s_dir", 0, h, false),      job(4, "s_gone", 10, h, false),	  job(5, "s_ok", 100, hk, false),
	    job(6, "../s_ok", 100, hk, false),
	};
	const int want[] = {-ESTALE, -ESTALE, -ESTALE, -ESTALE, -ENOENT, 0};
	assert_int_equal(prep_new(dfd, 2, 1 << 20, 1, &p), 0);
	for (size_t i = 0; i < 6; i++)
		assert_int_equal(prep_submit(p, &jobs[i]), 0);
	for (size_t i = 0; i < 6; i++) {
		assert_int_equal(prep_head(p, true, &o), 1);
		assert_int_equal(o.tag, i);
		assert_int_equal(o.r, want[i]);
		assert_int_equal(o.nrec == 0, want[i] != 0);
		prep_pop(p);
	}
	/* a path that is not beneath the workspace as given is refused by
	 * the confined open, never followed */
	assert_int_equal(prep_submit(p, &jobs[6]), 0);
	assert_int_equal(prep_head(p, true, &o), 1);
	assert_true(o.r < 0);
	prep_pop(p);
	prep_free(p);
}

/* Content a rule matches is judged on the worker and not encoded (and
 * not judged when the engine did not ask: a file allowed by name). */
static void test_withhold(void **state)
{
	(void)state;
	char tok[64], text[256];
	uint8_t h[CHUNK_HASH_LEN], hc[CHUNK_HASH_LEN];
	struct prep *p;
	struct prep_out o;

	/* assembled here so this file holds no token */
	snprintf(tok, sizeof(tok), "%s%s", "gh", "p_q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi");
	int n = snprintf(text, sizeof(text), "// config\nconst t = '%s';\n", tok);
	tu_put_file(dfd, "w_tok.ts", text, (size_t)n, 0644);
	chunk_hash((const uint8_t *)text, (size_t)n, h);
	tu_put_file(dfd, "w_clean.ts", "int x;\n", 7, 0644);
	chunk_hash((const uint8_t *)"int x;\n", 7, hc);

	assert_int_equal(prep_new(dfd, 2, 1 << 20, 1, &p), 0);
	struct prep_job a = job(0, "w_tok.ts", (uint64_t)n, h, true), b = job(1, "w_clean.ts", 7, hc, true),
			c = job(2, "w_tok.ts", (uint64_t)n, h, false);
	assert_int_equal(prep_submit(p, &a), 0);
	assert_int_equal(prep_submit(p, &b), 0);
	assert_int_equal(prep_submit(p, &c), 0);
	assert_int_equal(prep_head(p, true, &o), 1);
	assert_int_equal(o.r, 0);
	assert_true(o.judged && o.j.hit);
	assert_int_equal(o.nrec, 0);
	prep_pop(p);
	assert_int_equal(prep_head(p, true, &o), 1);
	assert_true(o.judged && !o.j.hit);
	assert_true(o.nrec > 0);
	prep_pop(p);
	assert_int_equal(prep_head(p, true, &o), 1);
	assert_false(o.judged);
	assert_true(o.nrec > 0);
	prep_pop(p);
	prep_free(p);
}

/* The bounds: PREP_JOBS_MAX jobs; records in an arena of max_bytes, used
 * first in, first out (room comes back only as the head is popped, also
 * across its end); a record that could never fit is refused. */
static void test_bounds(void **state)
{
	(void)state;
	uint8_t h[CHUNK_HASH_LEN], hb[CHUNK_HASH_LEN];
	struct prep *p;
	struct prep_out o;
	const size_t rec = DELTA_CHUNK_REC_MAX(10000);

	make("b_small", 10000, 21, h);
	make("b_big", 100000, 22, hb);
	assert_int_equal(prep_new(dfd, 1, 5 * rec + rec / 2, 1, &p), 0);
	struct prep_job big = job(0, "b_big", 100000, hb, false), small = job(1, "b_small", 10000, h, false);
	assert_int_equal(prep_submit(p, &big), -EFBIG);
	for (int round = 0; round < 40; round++) {
		/* as many as fit, then one popped makes room for one again:
		 * the arena wraps around its end every few rounds */
		size_t k = 0;
		while (prep_submit(p, &small) == 0)
			k++;
		assert_int_equal(k, round == 0 ? 5 : 1); /* the room of the one popped, at the end or the start */
		assert_int_equal(prep_pending(p), 5);
		assert_int_equal(prep_head(p, true, &o), 1);
		assert_int_equal(o.r, 0);
		/* the record in the arena is intact whatever was written after it */
		size_t na, nb;
		uint8_t *a = batch_of("b_small", NULL, 0, &na), *b = batch_of("b_small", o.rec, o.nrec, &nb);
		assert_int_equal(na, nb);
		assert_memory_equal(a, b, na);
		mem_free(a);
		mem_free(b);
		prep_pop(p);
	}
	prep_cancel(p);
	assert_int_equal(prep_pending(p), 0);
	for (int k = 0; k < 5; k++) /* all the room again */
		assert_int_equal(prep_submit(p, &small), 0);
	prep_free(p);

	make("b_tiny", 10, 23, h);
	struct prep_job tiny = job(2, "b_tiny", 10, h, false);
	assert_int_equal(prep_new(dfd, 1, 16u << 20, 1, &p), 0);
	for (size_t k = 0; k < PREP_JOBS_MAX; k++)
		assert_int_equal(prep_submit(p, &tiny), 0);
	assert_int_equal(prep_submit(p, &tiny), -EAGAIN);
	prep_free(p); /* with every job pending */
}

/* Cancel while the workers are busy: nothing is pending after it, the
 * pool takes new jobs, and free with jobs pending joins the workers
 * (ASan: no leak, no use after free of the copied paths). */
static void test_cancel(void **state)
{
	(void)state;
	uint8_t h[CHUNK_HASH_LEN];
	struct prep *p;
	struct prep_out o;

	make("c_file", 120000, 31, h);
	struct prep_job j = job(0, "c_file", 120000, h, true);
	assert_int_equal(prep_new(dfd, 2, 64u << 20, 1, &p), 0);
	for (int round = 0; round < 20; round++) {
		for (int i = 0; i < 200; i++) {
			j.tag = (uint64_t)i;
			assert_int_equal(prep_submit(p, &j), 0);
		}
		if (round % 2) {
			assert_int_equal(prep_head(p, true, &o), 1);
			assert_int_equal(o.tag, 0);
			prep_pop(p);
			prep_pop(p); /* not done, or not started: dropped either way */
		}
		prep_cancel(p);
		assert_int_equal(prep_pending(p), 0);
		assert_int_equal(prep_head(p, false, &o), -ENOENT);
	}
	j.tag = 77;
	assert_int_equal(prep_submit(p, &j), 0);
	assert_int_equal(prep_head(p, true, &o), 1);
	assert_int_equal(o.tag, 77);
	assert_int_equal(o.r, 0);
	for (int i = 0; i < 100; i++)
		assert_int_equal(prep_submit(p, &j), 0);
	prep_free(p);
	prep_free(NULL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_order_and_records),
	    cmocka_unit_test(test_stale),
	    cmocka_unit_test(test_withhold),
	    cmocka_unit_test(test_bounds),
	    cmocka_unit_test(test_cancel),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, setup, teardown);
}
