/* SPDX-License-Identifier: Apache-2.0 */
#include "airlock/core/mem.h"

#include <jansson.h>
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
