/* SPDX-License-Identifier: Apache-2.0 */
/* chunk: content hashes, FastCDC chunking and incremental re-chunking. */
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
#include <unistd.h>

#include <cmocka.h>

#include "airlock/content/chunk.h"
#include "airlock/core/mem.h"

/* Small parameters: many chunks from little data, for fast property tests. */
static const struct chunk_params small = {.min = 256, .avg = 1024, .max = 4096, .whole_max = 2048};

static uint64_t rng_state;

static uint64_t rng(void)
{
	/* xorshift64*: deterministic test data */
	rng_state ^= rng_state >> 12;
	rng_state ^= rng_state << 25;
	rng_state ^= rng_state >> 27;
	return rng_state * 0x2545f4914f6cdd1dull;
}

static void fill_random(uint8_t *p, size_t n, uint64_t seed)
{
	rng_state = seed | 1;
	size_t i = 0;
	for (; i + 8 <= n; i += 8) {
		uint64_t v = rng();
		memcpy(p + i, &v, 8);
	}
	for (; i < n; i++)
		p[i] = (uint8_t)rng();
}

struct mem_reader {
	const uint8_t *p;
	size_t n;
};

static int mem_read(void *ud, uint64_t off, void *buf, size_t len)
{
	struct mem_reader *m = ud;
	if (off > m->n || len > m->n - off)
		return -ESTALE;
	memcpy(buf, m->p + off, len);
	return 0;
}

static bool same_list(const struct chunk *a, size_t na, const struct chunk *b, size_t nb)
{
	if (na != nb)
		return false;
	for (size_t i = 0; i < na; i++)
		if (a[i].off != b[i].off || a[i].len != b[i].len || memcmp(a[i].hash, b[i].hash, CHUNK_HASH_LEN))
			return false;
	return true;
}

/* Chunks of b whose (hash, len) do not occur in a. */
static size_t new_chunks(const struct chunk *a, size_t na, const struct chunk *b, size_t nb)
{
	size_t k = 0;
	for (size_t j = 0; j < nb; j++) {
		bool found = false;
		for (size_t i = 0; i < na && !found; i++)
			found = a[i].len == b[j].len && memcmp(a[i].hash, b[j].hash, CHUNK_HASH_LEN) == 0;
		k += !found;
	}
	return k;
}

/* ---- the gear table is what its comment says ---- */

static uint64_t ref_gear[256];

static void ref_gear_init(void)
{
	uint64_t s = 0x6169726c6f636b31ull;
	for (int i = 0; i < 256; i++) {
		uint64_t z = (s += 0x9e3779b97f4a7c15ull);
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		ref_gear[i] = z ^ (z >> 31);
	}
}

/* FastCDC NC-2 with the top bits as mask, written out plainly. */
static size_t ref_cut(const struct chunk_params *p, const uint8_t *d, size_t n)
{
	if (n <= p->min)
		return n;
	if (n > p->max)
		n = p->max;
	unsigned bits = 0;
	for (uint32_t v = p->avg; v > 1; v >>= 1)
		bits++;
	uint64_t ms = ~(~0ull >> (bits + 2)), ml = ~(~0ull >> (bits - 2));
	uint64_t fp = 0;
	for (size_t i = p->min; i < n; i++) {
		fp = (fp << 1) + ref_gear[d[i]];
		if (!(fp & (i < p->avg ? ms : ml)))
			return i + 1;
	}
	return n;
}

static void test_gear_table_matches_generator(void **state)
{
	(void)state;
	size_t n = 1u << 20;
	uint8_t *d = malloc(n);
	assert_non_null(d);
	fill_random(d, n, 42);
	ref_gear_init();
	const struct chunk_params *ps[] = {&small, &chunk_params_default};
	for (size_t k = 0; k < 2; k++) {
		size_t cuts = 0;
		for (size_t pos = 0; pos < n; cuts++) {
			size_t a = chunk_cut(ps[k], d + pos, n - pos);
			assert_int_equal(a, ref_cut(ps[k], d + pos, n - pos));
			pos += a;
		}
		assert_true(cuts > 1);
	}
	free(d);
}

static void test_params(void **state)
{
	(void)state;
	static const struct {
		struct chunk_params p;
		int ok;
	} cases[] = {
	    {{16384, 65536, 262144, 131072}, 1},
	    {{256, 1024, 4096, 2048}, 1},
	    {{64, 128, 256, 64}, 1},
	    {{63, 128, 256, 64}, 0},	      /* min too small */
	    {{256, 1000, 4096, 2048}, 0},     /* avg not a power of two */
	    {{1024, 1024, 4096, 2048}, 0},    /* avg not above min */
	    {{256, 4096, 4096, 2048}, 0},     /* max not above avg */
	    {{256, 1024, 8u << 20, 2048}, 0}, /* max over the limit */
	    {{256, 1024, 4096, 100}, 0},      /* whole_max under min */
	    {{256, 1024, 4096, 8192}, 0},     /* whole_max over max */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_int_equal(chunk_params_check(&cases[i].p), cases[i].ok ? 0 : -EINVAL);
	assert_int_equal(chunk_params_check(&chunk_params_default), 0);
}

static void test_hash_canonical(void **state)
{
	(void)state;
	uint8_t a[CHUNK_HASH_LEN], b[CHUNK_HASH_LEN];
	struct chunk_hasher h;
	/* XXH3-128 of the empty input, canonical big-endian (xxhsum -H2). */
	static const uint8_t empty[CHUNK_HASH_LEN] = {0x99, 0xaa, 0x06, 0xd3, 0x01, 0x47, 0x98, 0xd8,
						      0x60, 0x01, 0xc3, 0x24, 0x46, 0x8d, 0x49, 0x7f};
	chunk_hash("", 0, a);
	assert_memory_equal(a, empty, CHUNK_HASH_LEN);
	/* streaming equals one-shot, whatever the split */
	uint8_t d[5000];
	fill_random(d, sizeof(d), 7);
	chunk_hash(d, sizeof(d), a);
	for (size_t split = 0; split <= sizeof(d); split += 977) {
		chunk_hasher_init(&h);
		chunk_hasher_update(&h, d, split);
		chunk_hasher_update(&h, d + split, sizeof(d) - split);
		chunk_hasher_final(&h, b);
		assert_memory_equal(a, b, CHUNK_HASH_LEN);
	}
}

static void test_small_files(void **state)
{
	(void)state;
	uint8_t d[3000];
	struct chunk *c;
	size_t n;
	fill_random(d, sizeof(d), 3);

	assert_int_equal(chunk_split(&small, d, 0, &c, &n), 0);
	assert_int_equal(n, 0);
	assert_null(c);
	/* up to whole_max: one chunk, hash = file hash */
	assert_int_equal(chunk_split(&small, d, small.whole_max, &c, &n), 0);
	assert_int_equal(n, 1);
	assert_int_equal(c[0].len, small.whole_max);
	uint8_t h[CHUNK_HASH_LEN];
	chunk_hash(d, small.whole_max, h);
	assert_memory_equal(c[0].hash, h, CHUNK_HASH_LEN);
	assert_int_equal(chunk_list_check(&small, c, n, small.whole_max), 0);
	mem_free(c);
	/* above: content-defined, still a valid list */
	assert_int_equal(chunk_split(&small, d, small.whole_max + 1, &c, &n), 0);
	assert_true(n >= 1);
	assert_int_equal(chunk_list_check(&small, c, n, small.whole_max + 1), 0);
	mem_free(c);
}

static void test_list_check(void **state)
{
	(void)state;
	struct chunk l[3] = {{0, 1000, {0}}, {1000, 1000, {0}}, {2000, 500, {0}}};
	assert_int_equal(chunk_list_check(&small, l, 3, 2500), 0);
	assert_int_equal(chunk_list_check(&small, l, 3, 2501), -EINVAL); /* sizes do not add up */
	l[1].off = 999;
	assert_int_equal(chunk_list_check(&small, l, 3, 2500), -EINVAL); /* offsets not consecutive */
	l[1].off = 1000;
	l[0].len = 100;
	l[1].off = 100;
	l[2].off = 1100;
	assert_int_equal(chunk_list_check(&small, l, 3, 1600), -EINVAL); /* non-last chunk under min */
	assert_int_equal(chunk_list_check(&small, l, 1, 100), 0);	 /* a small file is one whole chunk */
	assert_int_equal(chunk_list_check(&small, l, 2, 1100), -EINVAL); /* ... never more */
	assert_int_equal(chunk_list_check(&small, NULL, 0, 0), 0);
	assert_int_equal(chunk_list_check(&small, NULL, 0, 1), -EINVAL);
}

static void test_file_equals_split(void **state)
{
	(void)state;
	size_t n = 3u << 20;
	uint8_t *d = malloc(n);
	assert_non_null(d);
	fill_random(d, n, 11);
	struct chunk *a, *b;
	size_t na, nb;
	uint8_t fh[CHUNK_HASH_LEN], want[CHUNK_HASH_LEN];
	struct mem_reader m = {d, n};

	assert_int_equal(chunk_split(&chunk_params_default, d, n, &a, &na), 0);
	assert_int_equal(chunk_file(&chunk_params_default, mem_read, &m, n, NULL, NULL, &b, &nb, fh), 0);
	assert_true(same_list(a, na, b, nb));
	chunk_list_hash(a, na, want);
	assert_memory_equal(fh, want, CHUNK_HASH_LEN);
	/* a file of two or more chunks: not the hash of its bytes */
	assert_true(na > 1);
	uint8_t bytes_hash[CHUNK_HASH_LEN];
	chunk_hash(d, n, bytes_hash);
	assert_memory_not_equal(fh, bytes_hash, CHUNK_HASH_LEN);
	assert_int_equal(chunk_list_check(&chunk_params_default, a, na, n), 0);
	mem_free(a);
	mem_free(b);

	/* the same through a real file descriptor; a shrunk file is -ESTALE */
	char path[] = "/tmp/airlock-chunk-XXXXXX";
	int fd = mkstemp(path);
	assert_true(fd >= 0);
	unlink(path);
	assert_int_equal(write(fd, d, n), (ssize_t)n);
	assert_int_equal(chunk_file(&chunk_params_default, chunk_read_fd, &fd, n, NULL, NULL, &b, &nb, fh), 0);
	assert_memory_equal(fh, want, CHUNK_HASH_LEN);
	mem_free(b);
	assert_int_equal(chunk_file(&chunk_params_default, chunk_read_fd, &fd, n + 1, NULL, NULL, &b, &nb, fh),
			 -ESTALE);
	close(fd);
	free(d);
}

/* The scale test: 100 MiB in memory, a one-byte edit, an insertion and a
 * deletion in the middle. */
static void test_100mib_resync(void **state)
{
	(void)state;
	const struct chunk_params *p = &chunk_params_default;
	size_t n = 100u << 20, ins = 100, x = n / 2 + 12345;
	uint8_t *d = malloc(n + ins);
	assert_non_null(d);
	fill_random(d, n, 1234);
	struct chunk *a, *b, *u;
	size_t na, nb, nu;
	uint64_t reread;

	assert_int_equal(chunk_split(p, d, n, &a, &na), 0);
	/* sane distribution: mean near avg, none over max, none (but the
	 * last) at or under min */
	assert_true(na > n / (3 * (size_t)p->avg) && na < n / ((size_t)p->avg / 3));
	for (size_t i = 0; i < na; i++) {
		assert_true(a[i].len <= p->max);
		if (i + 1 < na)
			assert_true(a[i].len > p->min);
	}

	/* 1. one byte changed in place */
	d[x] ^= 0x5a;
	assert_int_equal(chunk_split(p, d, n, &b, &nb), 0);
	size_t changed = new_chunks(a, na, b, nb);
	assert_true(changed >= 1 && changed <= 2);
	struct mem_reader m = {d, n};
	assert_int_equal(chunk_update(p, a, na, x, x + 1, n, mem_read, &m, &u, &nu, &reread), 0);
	assert_true(same_list(b, nb, u, nu));
	assert_true(reread < 4 * (uint64_t)p->max); /* not the whole 100 MiB */
	mem_free(b);
	mem_free(u);
	d[x] ^= 0x5a;

	/* 2. 100 bytes inserted at x: boundaries shift, then resynchronise */
	memmove(d + x + ins, d + x, n - x);
	fill_random(d + x, ins, 99);
	assert_int_equal(chunk_split(p, d, n + ins, &b, &nb), 0);
	changed = new_chunks(a, na, b, nb);
	assert_true(changed >= 1 && changed <= 3);
	m = (struct mem_reader){d, n + ins};
	assert_int_equal(chunk_update(p, a, na, x, x + ins, n + ins, mem_read, &m, &u, &nu, &reread), 0);
	assert_true(same_list(b, nb, u, nu));
	assert_true(reread < 4 * (uint64_t)p->max);
	mem_free(u);

	/* 3. and deleted again: the old list comes back from the new one */
	memmove(d + x, d + x + ins, n - x);
	m = (struct mem_reader){d, n};
	assert_int_equal(chunk_update(p, b, nb, x, x, n, mem_read, &m, &u, &nu, &reread), 0);
	assert_true(same_list(a, na, u, nu));
	assert_true(reread < 4 * (uint64_t)p->max);
	mem_free(u);
	mem_free(b);
	mem_free(a);
	free(d);
}

/* Property: chunk_update after any single edit equals a full re-chunk. */
static void test_update_property(void **state)
{
	(void)state;
	size_t cap = 300000;
	uint8_t *old = malloc(cap), *nw = malloc(cap + 20000);
	assert_non_null(old);
	assert_non_null(nw);
	rng_state = 77;
	for (int iter = 0; iter < 300; iter++) {
		size_t on = (size_t)(rng() % cap);
		fill_random(old, on, (uint64_t)iter * 31 + 5);
		/* make some content repeat, to tempt false resyncs */
		if (on > 20000)
			memcpy(old + on / 2, old, 8000);
		uint64_t save = rng_state;
		struct chunk *a, *b, *u;
		size_t na, nb, nu;
		assert_int_equal(chunk_split(&small, old, on, &a, &na), 0);
		rng_state = save ^ 0xabcdef;
		size_t x = on ? (size_t)(rng() % (on + 1)) : 0, k = (size_t)(rng() % 10000), nn = 0, dend = 0;
		switch (rng() % 5) {
		case 0: /* overwrite in place */
			if (k > on - x)
				k = on - x;
			memcpy(nw, old, on);
			fill_random(nw + x, k, rng());
			nn = on;
			dend = x + k;
			break;
		case 1: /* insert */
			memcpy(nw, old, x);
			fill_random(nw + x, k, rng());
			memcpy(nw + x + k, old + x, on - x);
			nn = on + k;
			dend = x + k;
			break;
		case 2: /* delete */
			if (k > on - x)
				k = on - x;
			memcpy(nw, old, x);
			memcpy(nw + x, old + x + k, on - x - k);
			nn = on - k;
			dend = x;
			break;
		case 3: /* append */
			x = on;
			memcpy(nw, old, on);
			fill_random(nw + on, k, rng());
			nn = on + k;
			dend = nn;
			break;
		default: /* truncate */
			memcpy(nw, old, x);
			nn = x;
			dend = x;
			break;
		}
		struct mem_reader m = {nw, nn};
		assert_int_equal(chunk_split(&small, nw, nn, &b, &nb), 0);
		assert_int_equal(chunk_update(&small, a, na, x, dend, nn, mem_read, &m, &u, &nu, NULL), 0);
		assert_true(same_list(b, nb, u, nu));
		mem_free(a);
		mem_free(b);
		mem_free(u);
	}
	free(old);
	free(nw);
}

static void test_update_rejects(void **state)
{
	(void)state;
	uint8_t d[20000];
	fill_random(d, sizeof(d), 5);
	struct chunk *a, *u;
	size_t na, nu;
	struct mem_reader m = {d, sizeof(d)};
	assert_int_equal(chunk_split(&small, d, sizeof(d), &a, &na), 0);
	static const struct {
		uint64_t off, end, size;
	} bad[] = {
	    {10, 5, 20000},	   /* end before start */
	    {10, 20001, 20000},	   /* end past the new size */
	    {20001, 20001, 20002}, /* starts past the old content */
	    {100, 200, 40000},	   /* unchanged tail would be longer than the old file */
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		assert_int_equal(
		    chunk_update(&small, a, na, bad[i].off, bad[i].end, bad[i].size, mem_read, &m, &u, &nu, NULL),
		    -EINVAL);
	/* an old list that is not one */
	a[0].len++;
	assert_int_equal(chunk_update(&small, a, na, 0, 1, sizeof(d), mem_read, &m, &u, &nu, NULL), -EINVAL);
	mem_free(a);
}

static void test_alloc_failures(void **state)
{
	(void)state;
	size_t n = 200000;
	uint8_t *d = malloc(n);
	assert_non_null(d);
	fill_random(d, n, 8);
	struct mem_reader m = {d, n};
	struct chunk *a, *b;
	size_t na, nb;
	assert_int_equal(chunk_split(&small, d, n, &a, &na), 0);
	d[n / 2] ^= 1;
	int r = -ENOMEM, k;
	for (k = 1; r == -ENOMEM && k < 1000; k++) {
		mem_fail_at((unsigned long)k, 0);
		r = chunk_split(&small, d, n, &b, &nb);
		mem_fail_at(0, 0);
		if (r == 0)
			mem_free(b);
	}
	assert_int_equal(r, 0);
	for (r = -ENOMEM, k = 1; r == -ENOMEM && k < 1000; k++) {
		mem_fail_at((unsigned long)k, 0);
		r = chunk_file(&small, mem_read, &m, n, NULL, NULL, &b, &nb, NULL);
		mem_fail_at(0, 0);
		if (r == 0)
			mem_free(b);
	}
	assert_int_equal(r, 0);
	for (r = -ENOMEM, k = 1; r == -ENOMEM && k < 1000; k++) {
		mem_fail_at((unsigned long)k, 0);
		r = chunk_update(&small, a, na, n / 2, n / 2 + 1, n, mem_read, &m, &b, &nb, NULL);
		mem_fail_at(0, 0);
		if (r == 0)
			mem_free(b);
	}
	assert_int_equal(r, 0);
	mem_free(a);
	free(d);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_gear_table_matches_generator),
	    cmocka_unit_test(test_params),
	    cmocka_unit_test(test_hash_canonical),
	    cmocka_unit_test(test_small_files),
	    cmocka_unit_test(test_list_check),
	    cmocka_unit_test(test_file_equals_split),
	    cmocka_unit_test(test_100mib_resync),
	    cmocka_unit_test(test_update_property),
	    cmocka_unit_test(test_update_rejects),
	    cmocka_unit_test(test_alloc_failures),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
