/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_MEM_H
#define AIRLOCK_MEM_H

/*
 * mem: every heap allocation in airlock goes through these functions, so a
 * test can make the Nth one fail (SQLite's test_malloc idea) and check that
 * each caller turns the failure into an error instead of a crash or a leak.
 *
 * The hook is process-global and not thread-safe to *configure*; allocation
 * itself is thread-safe (it is plain malloc when no failure is armed).
 */

#include <stddef.h>

/* malloc/calloc/realloc/free/strdup equivalents. They return NULL when the
 * system is out of memory or an armed test failure fires. mem_free(NULL) is a
 * no-op. mem_calloc checks nmemb * size for overflow. */
void *mem_alloc(size_t n);
void *mem_calloc(size_t nmemb, size_t size);
void *mem_realloc(void *p, size_t n);
void mem_free(void *p);
char *mem_strdup(const char *s);
char *mem_strndup(const char *s, size_t n);

/* Test hook: make the nth allocation from now fail (1 = the next one), and
 * every allocation after it too when `sticky` is set. n = 0 disarms. */
void mem_fail_at(unsigned long n, int sticky);

/* Number of allocations made since start (for tests that loop over N). */
unsigned long mem_count(void);

/* The largest single request (bytes asked of mem_alloc, mem_calloc or
 * mem_realloc) since start or since mem_largest_reset: lets a test check
 * that an operation on a whole tree never holds a buffer of the tree's
 * size (a streamed save, a batch handed over instead of copied). */
size_t mem_largest(void);
void mem_largest_reset(void);

/* Install mem_* as jansson's allocator. Call once at start of any program
 * that uses jansson. */
void mem_init_json(void);

/* Tune the allocator for a long-running process that holds large, short-
 * lived buffers (delta batches, the hash cache, manifest arrays): blocks
 * of MEM_MMAP_THRESHOLD bytes or more get their own mapping, so freeing
 * one gives its memory back. Call once at the start of main, before any
 * thread. No-op where the C library has no such knobs. */
#define MEM_MMAP_THRESHOLD (256u << 10)
void mem_tune(void);

/* Give freed heap memory back to the system (after a large transient
 * peak, e.g. the first sync). No-op where unsupported. */
void mem_release(void);

#endif
