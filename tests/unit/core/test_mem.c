/* SPDX-License-Identifier: Apache-2.0 */
/* mem: the allocator knobs of a long-running process (mem_tune,
 * mem_release) give memory back; the failure hook fails the Nth call. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "airlock/core/mem.h"

#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
#define SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define SANITIZED 1
#endif
#endif

#if defined(__GLIBC__) && !defined(SANITIZED)
/* Resident pages of this process. */
static long resident_pages(void)
{
	long size = 0, res = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	assert_non_null(f);
	assert_int_equal(fscanf(f, "%ld %ld", &size, &res), 2);
	fclose(f);
	return res;
}
#endif

/* After a large block was freed, a smaller large one still gets its own
 * mapping (glibc alone would have raised its threshold past it and taken
 * it from the heap, whose freed middle stays resident). */
static void test_tune_threshold(void **state)
{
	(void)state;
#if defined(__GLIBC__) && !defined(SANITIZED)
	mem_tune();
	void *a = mem_alloc(8u << 20);
	assert_non_null(a);
	memset(a, 1, 8u << 20);
	mem_free(a);
	struct mallinfo2 m0 = mallinfo2();
	void *b = mem_alloc(MEM_MMAP_THRESHOLD * 4);
	assert_non_null(b);
	struct mallinfo2 m1 = mallinfo2();
	assert_int_equal(m1.hblks, m0.hblks + 1);
	mem_free(b);
	assert_int_equal(mallinfo2().hblks, m0.hblks);
#else
	skip();
#endif
}

/* Freed small blocks below one still in use: mem_release gives their
 * pages back. */
static void test_release(void **state)
{
	(void)state;
#if defined(__GLIBC__) && !defined(SANITIZED)
	enum { N = 1 << 16, SZ = 512 }; /* 32 MiB of small blocks */
	void **v = calloc(N, sizeof(*v));
	assert_non_null(v);
	mem_tune();
	for (size_t i = 0; i < N; i++) {
		assert_non_null(v[i] = mem_alloc(SZ));
		memset(v[i], 0x5a, SZ);
	}
	void *pin = mem_alloc(SZ); /* keeps the top of the heap in use */
	assert_non_null(pin);
	for (size_t i = 0; i < N; i++)
		mem_free(v[i]);
	long before = resident_pages();
	mem_release();
	long after = resident_pages();
	long page = sysconf(_SC_PAGESIZE);
	/* most of the 32 MiB is back (the allocator keeps some bookkeeping) */
	assert_true((before - after) * page > (long)(N * (size_t)SZ / 2));
	mem_free(pin);
	free(v);
#else
	skip();
#endif
}

static void test_fail_at(void **state)
{
	(void)state;
	mem_fail_at(2, 0);
	void *a = mem_alloc(16), *b = mem_alloc(16), *c = mem_alloc(16);
	assert_non_null(a);
	assert_null(b);
	assert_non_null(c);
	mem_fail_at(0, 0);
	mem_free(a);
	mem_free(c);
	mem_release(); /* harmless at any time */
}

/* mem_largest: the largest single request, through every entry point,
 * until reset. */
static void test_largest(void **state)
{
	(void)state;
	static const size_t sizes[] = {100, 3u << 20, 17, 5u << 20, 64};
	mem_largest_reset();
	assert_int_equal(mem_largest(), 0);
	size_t want = 0;
	void *p = NULL;
	for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
		void *q;
		switch (i % 3) {
		case 0:
			q = mem_alloc(sizes[i]);
			break;
		case 1:
			q = mem_calloc(sizes[i] / 8, 8);
			break;
		default:
			q = mem_realloc(p, sizes[i]);
			p = NULL;
			break;
		}
		assert_non_null(q);
		mem_free(p);
		p = q;
		if (sizes[i] > want)
			want = sizes[i];
		assert_int_equal(mem_largest(), want);
	}
	mem_free(p);
	mem_largest_reset();
	mem_free(mem_alloc(10));
	assert_int_equal(mem_largest(), 10);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_tune_threshold),
	    cmocka_unit_test(test_release),
	    cmocka_unit_test(test_fail_at),
	    cmocka_unit_test(test_largest),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
