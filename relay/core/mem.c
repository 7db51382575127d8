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
static unsigned long fail_at; /* absolute count at which to fail; 0 = off */
static int fail_sticky;

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
	if (should_fail())
		return NULL;
	return malloc(n ? n : 1);
}

void *mem_calloc(size_t nmemb, size_t size)
{
	if (size && nmemb > SIZE_MAX / size)
		return NULL;
	if (should_fail())
		return NULL;
	return calloc(nmemb ? nmemb : 1, size ? size : 1);
}

void *mem_realloc(void *p, size_t n)
{
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
