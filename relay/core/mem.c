/* SPDX-License-Identifier: Apache-2.0 */
#include "airlock/core/mem.h"

#include <jansson.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static atomic_ulong alloc_count;
static atomic_size_t largest; /* mem_largest */
static unsigned long fail_at; /* absolute count at which to fail; 0 = off */
static int fail_sticky;

static void note_size(size_t n)
{
	size_t l = atomic_load_explicit(&largest, memory_order_relaxed);

	while (n > l &&
	       !atomic_compare_exchange_weak_explicit(&largest, &l, n, memory_order_relaxed, memory_order_relaxed))
		;
}

static int should_fail(void)
{
	unsigned long n = atomic_fetch_add(&alloc_count, 1) + 1;

	if (fail_at == 0)
		return 0;
	if (n == fail_at)
		return 1;
	return fail_sticky && n > fail_at;
}

void *mem_alloc(size_t n)
{
	note_size(n);
	if (should_fail())
		return NULL;
	return malloc(n ? n : 1);
}

void *mem_calloc(size_t nmemb, size_t size)
{
	if (size && nmemb > SIZE_MAX / size)
		return NULL;
	note_size(nmemb * size);
	if (should_fail())
		return NULL;
	return calloc(nmemb ? nmemb : 1, size ? size : 1);
}

void *mem_realloc(void *p, size_t n)
{
	note_size(n);
	if (should_fail())
		return NULL;
	return realloc(p, n ? n : 1);
}

void mem_free(void *p)
{
	free(p);
}

char *mem_strndup(const char *s, size_t n)
{
	size_t len = strnlen(s, n);
	char *d = mem_alloc(len + 1);

	if (!d)
		return NULL;
	memcpy(d, s, len);
	d[len] = '\0';
	return d;
}

char *mem_strdup(const char *s)
{
	return mem_strndup(s, SIZE_MAX);
}

void mem_fail_at(unsigned long n, int sticky)
{
	fail_at = n ? atomic_load(&alloc_count) + n : 0;
	fail_sticky = sticky;
}

size_t mem_largest(void)
{
	return atomic_load_explicit(&largest, memory_order_relaxed);
}

void mem_largest_reset(void)
{
	atomic_store_explicit(&largest, 0, memory_order_relaxed);
}

unsigned long mem_count(void)
{
	return atomic_load(&alloc_count);
}

void mem_init_json(void)
{
	json_set_alloc_funcs(mem_alloc, mem_free);
}

/* glibc raises its mmap threshold to the size of every mmapped block freed
 * (up to 32 MiB), after which batch buffers, manifest arrays and the hash
 * cache come from the heap, whose freed middle is never given back: the
 * process keeps its high-water mark. A fixed threshold keeps large blocks
 * in their own mappings, returned on free; a fixed trim threshold gives
 * the top of the heap back past 1 MiB. */
void mem_tune(void)
{
#ifdef __GLIBC__
	mallopt(M_MMAP_THRESHOLD, MEM_MMAP_THRESHOLD);
	mallopt(M_TRIM_THRESHOLD, 1 << 20);
#endif
}

void mem_release(void)
{
#ifdef __GLIBC__
	malloc_trim(0);
#endif
}
