/* SPDX-License-Identifier: Apache-2.0 */
#include <pthread.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

#include "airlock/core/mem.h"
#include "airlock/mount/journal.h"

static atomic_int notified;

static void count_notify(void *ud)
{
	(void)ud;
	atomic_fetch_add(&notified, 1);
}

static struct journal *mk(size_t max)
{
	struct journal_opts o = {.max_records = max, .notify = count_notify};
	struct journal *j = journal_new(&o);

	assert_non_null(j);
	atomic_store(&notified, 0);
	return j;
}

static size_t drain(struct journal *j, struct journal_rec *out, size_t max, uint64_t *upto)
{
	return journal_drain(j, out, max, upto);
}

static void clear_all(struct journal_rec *r, size_t n)
{
	for (size_t i = 0; i < n; i++)
		journal_rec_clear(&r[i]);
}

/* ---- ordering, table-driven ---- */

struct op {
	enum journal_op op;
	const char *path, *path2;
	uint64_t off, len;
};

static void test_order(void **state)
{
	static const struct op ops[] = {
	    {JOURNAL_MKDIR, "d", NULL, 0, 0},	{JOURNAL_CREATE, "d/f", NULL, 0, 0},
	    {JOURNAL_SYMLINK, "s", NULL, 0, 0}, {JOURNAL_LINK, "d/f", "h", 0, 0},
	    {JOURNAL_RENAME, "d", "e", 0, 0},	{JOURNAL_EXCHANGE, "e/f", "h", 0, 0},
	    {JOURNAL_UNLINK, "h", NULL, 0, 0},	{JOURNAL_RMDIR, "x", NULL, 0, 0},
	    {JOURNAL_XATTR, "s", NULL, 0, 0},	{JOURNAL_MKNOD, "fifo", NULL, 0, 0},
	};
	struct journal *j = mk(0);
	struct journal_rec out[16];
	uint64_t upto = 0;
	size_t n, i;

	(void)state;
	assert_int_equal(journal_barrier_seq(j), 0);
	for (i = 0; i < sizeof(ops) / sizeof(ops[0]); i++)
		assert_int_equal(journal_append(j, ops[i].op, ops[i].path, ops[i].path2, 0, 0, 0), i + 1);
	assert_int_equal(atomic_load(&notified), 1); /* only on empty -> non-empty */
	assert_int_equal(journal_pending(j), 10);
	assert_int_equal(journal_barrier_seq(j), 10);
	n = drain(j, out, 16, &upto);
	assert_int_equal(n, 10);
	assert_int_equal(upto, 10);
	for (i = 0; i < n; i++) {
		assert_int_equal(out[i].first_seq, i + 1);
		assert_int_equal(out[i].last_seq, i + 1);
		assert_int_equal(out[i].op, ops[i].op);
		assert_string_equal(out[i].path, ops[i].path);
		if (ops[i].path2)
			assert_string_equal(out[i].path2, ops[i].path2);
		else
			assert_null(out[i].path2);
	}
	clear_all(out, n);
	assert_int_equal(drain(j, out, 16, &upto), 0);
	assert_int_equal(upto, 10);
	journal_free(j);
}

/* partial drains report upto = just before the first record left */
static void test_partial_drain(void **state)
{
	struct journal *j = mk(0);
	struct journal_rec out[4];
	uint64_t upto;
	char p[16];

	(void)state;
	for (int i = 0; i < 10; i++) {
		snprintf(p, sizeof(p), "f%d", i);
		journal_append(j, JOURNAL_CREATE, p, NULL, 0, 0, 0);
	}
	assert_int_equal(drain(j, out, 4, &upto), 4);
	assert_int_equal(upto, 4);
	clear_all(out, 4);
	assert_int_equal(drain(j, out, 4, &upto), 4);
	assert_int_equal(upto, 8);
	clear_all(out, 4);
	assert_int_equal(drain(j, out, 4, &upto), 2);
	assert_int_equal(upto, 10);
	clear_all(out, 2);
	journal_free(j);
}

/* ---- coalescing ---- */

static void test_coalesce_sequential_writes(void **state)
{
	struct journal *j = mk(0);
	struct journal_rec out[4];
	uint64_t upto;
	struct journal_stats st;

	(void)state;
	for (int i = 0; i < 10000; i++)
		journal_write(j, "big", (uint64_t)i * 4096, 4096);
	assert_int_equal(journal_pending(j), 1);
	assert_int_equal(drain(j, out, 4, &upto), 1);
	assert_int_equal(upto, 10000);
	assert_int_equal(out[0].op, JOURNAL_WRITE);
	assert_int_equal(out[0].first_seq, 1);
	assert_int_equal(out[0].last_seq, 10000);
	assert_int_equal(out[0].nranges, 1);
	assert_int_equal(out[0].ranges[0].off, 0);
	assert_int_equal(out[0].ranges[0].len, 10000ull * 4096);
	journal_get_stats(j, &st);
	assert_int_equal(st.appended, 10000);
	assert_int_equal(st.coalesced, 9999);
	clear_all(out, 1);
	journal_free(j);
}

struct range_case {
	const char *name;
	struct journal_range in[8];
	int nin;
	struct journal_range want[8];
	int nwant;
};

static void test_ranges_table(void **state)
{
	static const struct range_case cases[] = {
	    {"disjoint sorted", {{0, 10}, {20, 10}}, 2, {{0, 10}, {20, 10}}, 2},
	    {"reverse", {{20, 10}, {0, 10}}, 2, {{0, 10}, {20, 10}}, 2},
	    {"adjacent", {{0, 10}, {10, 10}}, 2, {{0, 20}}, 1},
	    {"overlap", {{0, 10}, {5, 10}}, 2, {{0, 15}}, 1},
	    {"contained", {{0, 100}, {5, 10}}, 2, {{0, 100}}, 1},
	    {"bridge", {{0, 10}, {20, 10}, {40, 10}, {5, 40}}, 4, {{0, 50}}, 1},
	    {"middle", {{0, 10}, {40, 10}, {20, 5}}, 3, {{0, 10}, {20, 5}, {40, 10}}, 3},
	    {"zero len", {{0, 10}, {50, 0}}, 2, {{0, 10}}, 1},
	};
	struct journal_rec out[2];

	(void)state;
	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		struct journal *j = mk(0);

		for (int i = 0; i < cases[c].nin; i++)
			journal_write(j, "f", cases[c].in[i].off, cases[c].in[i].len);
		assert_int_equal(drain(j, out, 2, NULL), 1);
		if ((int)out[0].nranges != cases[c].nwant)
			fail_msg("%s: %u ranges, want %d", cases[c].name, out[0].nranges, cases[c].nwant);
		for (int i = 0; i < cases[c].nwant; i++) {
			assert_int_equal(out[0].ranges[i].off, cases[c].want[i].off);
			assert_int_equal(out[0].ranges[i].len, cases[c].want[i].len);
		}
		clear_all(out, 1);
		journal_free(j);
	}
}

static void test_too_many_ranges_whole(void **state)
{
	struct journal *j = mk(0);
	struct journal_rec out[2];

	(void)state;
	for (int i = 0; i < JOURNAL_MAX_RANGES + 1; i++)
		journal_write(j, "f", (uint64_t)i * 100, 10);
	journal_write(j, "f", 1, 1); /* whole stays whole */
	assert_int_equal(drain(j, out, 2, NULL), 1);
	assert_true(out[0].flags & JOURNAL_F_WHOLE);
	assert_int_equal(out[0].nranges, 0);
	clear_all(out, 1);
	journal_free(j);
}

/* create absorbs writes/truncate/setattr; setattrs merge; rename stops it */
static void test_coalesce_rules(void **state)
{
	struct journal *j = mk(0);
	struct journal_rec out[16];
	size_t n;

	(void)state;
	journal_append(j, JOURNAL_CREATE, "a", NULL, 0, 0, 0);		      /* 1 */
	journal_write(j, "a", 0, 100);					      /* 2 */
	journal_append(j, JOURNAL_SETATTR, "a", NULL, 0, 0, JOURNAL_F_MODE);  /* 3 */
	journal_write(j, "b", 0, 10);					      /* 4 */
	journal_append(j, JOURNAL_SETATTR, "b", NULL, 0, 0, JOURNAL_F_MODE);  /* 5 */
	journal_append(j, JOURNAL_SETATTR, "b", NULL, 0, 0, JOURNAL_F_TIMES); /* 6 */
	journal_write(j, "b", 10, 10);					      /* 7: after setattr: new */
	journal_append(j, JOURNAL_RENAME, "x", "y", 0, 0, 0);		      /* 8 */
	journal_write(j, "b", 20, 10);					      /* 9: after rename: new */
	journal_append(j, JOURNAL_UNLINK, "b", NULL, 0, 0, 0);		      /* 10 */
	journal_write(j, "b", 30, 10);					      /* 11: new b */
	n = drain(j, out, 16, NULL);
	assert_int_equal(n, 8);
	assert_int_equal(out[0].op, JOURNAL_CREATE);
	assert_int_equal(out[0].last_seq, 3);
	assert_int_equal(out[1].op, JOURNAL_WRITE);
	assert_int_equal(out[1].first_seq, 4);
	assert_int_equal(out[2].op, JOURNAL_SETATTR);
	assert_int_equal(out[2].flags, JOURNAL_F_MODE | JOURNAL_F_TIMES);
	assert_int_equal(out[2].last_seq, 6);
	assert_int_equal(out[3].first_seq, 7);
	assert_int_equal(out[4].op, JOURNAL_RENAME);
	assert_string_equal(out[4].path2, "y");
	assert_int_equal(out[5].first_seq, 9);
	assert_int_equal(out[5].ranges[0].off, 20);
	assert_int_equal(out[6].op, JOURNAL_UNLINK);
	/* seq 11 went to a new record after the unlink */
	assert_int_equal(out[7].first_seq, 11);
	clear_all(out, n);
	journal_free(j);
}

/* after a drain, a write must not merge into a record the consumer has */
static void test_no_merge_across_drain(void **state)
{
	struct journal *j = mk(0);
	struct journal_rec out[4];

	(void)state;
	journal_write(j, "f", 0, 10);
	assert_int_equal(drain(j, out, 4, NULL), 1);
	clear_all(out, 1);
	journal_write(j, "f", 10, 10);
	assert_int_equal(drain(j, out, 4, NULL), 1);
	assert_int_equal(out[0].first_seq, 2);
	assert_int_equal(out[0].ranges[0].off, 10);
	clear_all(out, 1);
	journal_free(j);
}

/* ---- bounds ---- */

static void test_bounds_degrade(void **state)
{
	enum { CAP = 100 };
	struct journal *j = mk(CAP);
	static struct journal_rec out[4096];
	struct journal_stats st;
	uint64_t upto, base;
	char p[64];
	size_t n, i;

	(void)state;
	/* CAP precise creates, then 50 more: those become path RESCANs */
	for (i = 0; i < CAP + 50; i++) {
		snprintf(p, sizeof(p), "dir%zu/f%zu", i % 7, i);
		journal_append(j, JOURNAL_CREATE, p, NULL, 0, 0, 0);
	}
	/* once degraded, even a write to a precise path becomes a RESCAN */
	journal_write(j, "dir0/f0", 0, 1);
	assert_int_equal(journal_pending(j), CAP + 51);
	n = drain(j, out, 4096, &upto);
	assert_int_equal(n, CAP + 51);
	assert_int_equal(upto, CAP + 51);
	for (i = 0; i < n; i++) {
		assert_int_equal(out[i].first_seq, i + 1);
		assert_int_equal(out[i].op, i < CAP ? JOURNAL_CREATE : JOURNAL_RESCAN);
	}
	assert_string_equal(out[CAP].path, "dir2/f100");
	clear_all(out, n);

	/* precise again once drained empty */
	journal_write(j, "x", 0, 1);
	assert_int_equal(drain(j, out, 4, NULL), 1);
	assert_int_equal(out[0].op, JOURNAL_WRITE);
	clear_all(out, 1);

	/* CAP precise + CAP path rescans + beyond: top-level dir rescans */
	base = journal_barrier_seq(j);
	for (i = 0; i < 3 * CAP; i++) {
		snprintf(p, sizeof(p), "top%zu/sub/f%zu", i % 5, i);
		journal_append(j, JOURNAL_CREATE, p, NULL, 0, 0, 0);
	}
	assert_int_equal(journal_pending(j), 2 * CAP + 5);
	n = drain(j, out, 4096, &upto);
	assert_int_equal(upto, base + 3 * CAP);
	assert_string_equal(out[2 * CAP].path, "top0");
	assert_int_equal(out[2 * CAP].op, JOURNAL_RESCAN);
	/* top0 took every later op on top0 (the last is i = 3 CAP - 5) */
	assert_int_equal(out[2 * CAP].last_seq, base + 1 + 3 * CAP - 5);
	clear_all(out, n);
	base = journal_barrier_seq(j);

	/* beyond 1024 top-level entries: one root RESCAN */
	for (i = 0; i < 2 * CAP + 1100; i++) {
		snprintf(p, sizeof(p), "t%zu/f", i);
		journal_append(j, JOURNAL_CREATE, p, NULL, 0, 0, 0);
	}
	journal_append(j, JOURNAL_RENAME, "a", "b", 0, 0, 0);
	assert_int_equal(journal_pending(j), 1);
	n = drain(j, out, 4096, &upto);
	assert_int_equal(n, 1);
	assert_int_equal(out[0].op, JOURNAL_RESCAN);
	assert_string_equal(out[0].path, "");
	assert_int_equal(out[0].first_seq, base + 1);
	assert_int_equal(out[0].last_seq, journal_barrier_seq(j));
	assert_int_equal(upto, journal_barrier_seq(j));
	clear_all(out, n);
	journal_get_stats(j, &st);
	assert_int_equal(st.collapsed, 1);
	assert_true(st.degraded > 0);
	journal_free(j);
}

/* an allocation failure loses precision, never the operation */
static void test_alloc_failure_collapses(void **state)
{
	struct journal *j = mk(0);
	struct journal_rec out[4];
	uint64_t upto;

	(void)state;
	journal_append(j, JOURNAL_CREATE, "a", NULL, 0, 0, 0);
	mem_fail_at(1, 0);
	journal_append(j, JOURNAL_CREATE, "b", NULL, 0, 0, 0);
	mem_fail_at(0, 0);
	journal_append(j, JOURNAL_CREATE, "c", NULL, 0, 0, 0);
	assert_int_equal(drain(j, out, 4, &upto), 1);
	assert_int_equal(out[0].op, JOURNAL_RESCAN);
	assert_string_equal(out[0].path, "");
	assert_int_equal(out[0].first_seq, 1);
	assert_int_equal(out[0].last_seq, 3);
	assert_int_equal(upto, 3);
	clear_all(out, 1);
	/* drain itself failing to allocate keeps the record for next time */
	journal_append(j, JOURNAL_CREATE, "d", NULL, 0, 0, 0);
	mem_fail_at(1, 1);
	journal_append(j, JOURNAL_CREATE, "e", NULL, 0, 0, 0);
	assert_int_equal(drain(j, out, 4, &upto), 0);
	mem_fail_at(0, 0);
	assert_int_equal(upto, 3);
	assert_int_equal(drain(j, out, 4, &upto), 1);
	assert_int_equal(upto, 5);
	clear_all(out, 1);
	journal_free(j);
}

/* ---- concurrency: producers append while one consumer drains ---- */

enum { NTHREADS = 4, NOPS = 20000, CHUNK = 10 };

static atomic_int producers_done;

struct prod {
	struct journal *j;
	int id;
};

static void *producer(void *arg)
{
	struct prod *p = arg;
	char path[32];

	snprintf(path, sizeof(path), "t%d", p->id);
	for (int i = 0; i < NOPS; i++) {
		journal_write(p->j, path, (uint64_t)i * CHUNK, CHUNK);
		if (i % 1000 == 999)
			journal_append(p->j, JOURNAL_SETATTR, path, NULL, 0, 0, JOURNAL_F_TIMES);
	}
	atomic_fetch_add(&producers_done, 1);
	return NULL;
}

static void test_concurrent(void **state)
{
	struct journal *j = mk(1000);
	pthread_t th[NTHREADS];
	struct prod pr[NTHREADS];
	static struct journal_rec out[512];
	uint64_t upto = 0, last_first = 0, covered[NTHREADS] = {0};
	bool whole[NTHREADS] = {false};
	const uint64_t total = NTHREADS * (NOPS + NOPS / 1000);
	bool running = true;

	(void)state;
	atomic_store(&producers_done, 0);
	for (int i = 0; i < NTHREADS; i++) {
		pr[i] = (struct prod){j, i};
		assert_int_equal(pthread_create(&th[i], NULL, producer, &pr[i]), 0);
	}
	while (running || upto < total) {
		size_t n = drain(j, out, 512, &upto);

		for (size_t i = 0; i < n; i++) {
			int t = out[i].path[0] ? out[i].path[1] - '0' : 0;

			if (out[i].op == JOURNAL_RESCAN)
				whole[t] = true; /* degraded: whole file */
			assert_true(out[i].first_seq > last_first);
			last_first = out[i].first_seq;
			if (out[i].op == JOURNAL_WRITE) {
				for (uint32_t k = 0; k < out[i].nranges; k++)
					covered[t] += out[i].ranges[k].len;
				whole[t] |= (out[i].flags & JOURNAL_F_WHOLE) != 0;
			}
			journal_rec_clear(&out[i]);
		}
		/* read "done" before draining again: the last drain then sees all */
		if (running && n == 0)
			running = atomic_load(&producers_done) < NTHREADS;
	}
	for (int i = 0; i < NTHREADS; i++)
		pthread_join(th[i], NULL);
	assert_int_equal(upto, total);
	assert_int_equal(journal_barrier_seq(j), total);
	/* every byte written is covered (ranges may be counted more than once
	 * when a range spans two drained records, never less) */
	for (int i = 0; i < NTHREADS; i++)
		assert_true(whole[i] || covered[i] >= (uint64_t)NOPS * CHUNK);
	assert_true(atomic_load(&notified) >= 1);
	journal_free(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_order),
	    cmocka_unit_test(test_partial_drain),
	    cmocka_unit_test(test_coalesce_sequential_writes),
	    cmocka_unit_test(test_ranges_table),
	    cmocka_unit_test(test_too_many_ranges_whole),
	    cmocka_unit_test(test_coalesce_rules),
	    cmocka_unit_test(test_no_merge_across_drain),
	    cmocka_unit_test(test_bounds_degrade),
	    cmocka_unit_test(test_alloc_failure_collapses),
	    cmocka_unit_test(test_concurrent),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
