/* SPDX-License-Identifier: Apache-2.0 */
/* scanstate: a persisted scan is taken only for an unchanged tree, and a
 * damaged or forged file is refused (scanstate.h). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "testutil.h"

#include "airlock/content/scanstate.h"
#include "airlock/core/mem.h"

struct env {
	char dir[64];	/* the scanned tree */
	char state[64]; /* where the state lives */
	int dfd, sfd;
};

static const uint8_t key[SCANSTATE_KEY_LEN] = {1, 2, 3};
static const uint8_t fp[SCANSTATE_FP_LEN] = {9, 8, 7};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	if (!e)
		abort();
	tu_tmpdir(e->dir, sizeof(e->dir), "sstate-tree");
	tu_tmpdir(e->state, sizeof(e->state), "sstate-state");
	e->dfd = open(e->dir, O_RDONLY | O_DIRECTORY);
	e->sfd = open(e->state, O_RDONLY | O_DIRECTORY);
	assert_true(e->dfd >= 0 && e->sfd >= 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	close(e->dfd);
	close(e->sfd);
	tu_rm_rf(e->dir);
	tu_rm_rf(e->state);
	free(e);
	return 0;
}

static void put(struct env *e, const char *name, const char *text)
{
	int fd = openat(e->dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/* "skipped/" is left out by the filter, like a pruned directory. */
static int filter(const char *rel, bool is_dir, void *ud)
{
	(void)ud;
	return is_dir && !strcmp(rel, "skipped") ? MANIFEST_SKIP : MANIFEST_KEEP;
}

/* A tree with files, directories, a link, a skipped directory. */
static void make_tree(struct env *e)
{
	assert_int_equal(mkdirat(e->dfd, "d", 0755), 0);
	assert_int_equal(mkdirat(e->dfd, "d/e", 0755), 0);
	assert_int_equal(mkdirat(e->dfd, "gone", 0755), 0);
	assert_int_equal(mkdirat(e->dfd, "skipped", 0755), 0);
	put(e, "a.txt", "aaaa\n");
	put(e, "b.txt", "bbbb\n");
	put(e, "d/x", "x\n");
	put(e, "d/e/y", "y\n");
	put(e, "gone/z", "z\n");
	put(e, "skipped/noise", "n\n");
	assert_int_equal(symlinkat("a.txt", e->dfd, "link"), 0);
}

/* Longer than a coarse timestamp granule (a jiffy) */
static void granule(void)
{
	struct timespec ts = {0, 50 * 1000 * 1000};
	nanosleep(&ts, NULL);
}

/* Scan the tree (taking the stamp first) and save its state; let the
 * stamp's granule pass first so nothing is racy. The largest single
 * allocation the save made. */
static size_t scan_save(struct env *e, const char *extra)
{
	struct scanstate *st;
	struct manifest *m;

	granule();
	assert_int_equal(scanstate_new(&st), 0);
	scanstate_begin(st, e->dfd);
	struct manifest_scan_opts o = {.filter = filter, .seen = scanstate_seen, .seen_ud = st};
	assert_int_equal(manifest_scan(e->dfd, &o, &m), 0);
	mem_largest_reset();
	assert_int_equal(scanstate_save(st, e->sfd, SCANSTATE_FILE, m, key, fp, extra, strlen(extra)), 0);
	size_t largest = mem_largest();
	manifest_free(m);
	scanstate_free(st);
	return largest;
}

/* Load and verify: 1 unchanged, 0 changed, <0 refused. */
static int check(struct env *e, char *first, size_t firstlen)
{
	struct scanstate *st;
	struct scanstate_verify_stats vs;
	int r = scanstate_load(e->sfd, SCANSTATE_FILE, key, fp, SCANSTATE_LOAD_DECODE, &st);

	if (r < 0)
		return r;
	r = scanstate_verify(st, e->dfd, 2, &vs);
	if (first)
		snprintf(first, firstlen, "%s", vs.first);
	scanstate_free(st);
	return r;
}

/* 12000 empty files with long names: a state of more than 2 MB. */
static void make_many(struct env *e)
{
	char name[128];

	assert_int_equal(mkdirat(e->dfd, "many", 0755), 0);
	for (int i = 0; i < 12000; i++) {
		snprintf(name, sizeof(name), "many/a-rather-long-file-name-so-that-the-state-grows-%05d.txt", i);
		int fd = openat(e->dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
		assert_true(fd >= 0);
		close(fd);
	}
}

/* The save is streamed: a state of several MB is written without any
 * allocation near its size (it was built whole in one buffer), and loads
 * and verifies as before. */
static void test_save_streamed(void **state)
{
	struct env *e = *state;
	struct stat sb;

	make_many(e);
	size_t largest = scan_save(e, "x");
	assert_int_equal(fstatat(e->sfd, SCANSTATE_FILE, &sb, 0), 0);
	assert_true(sb.st_size > 2 * 1024 * 1024);
	assert_true(largest <= 2 * MANIFEST_FLUSH_AT); /* a piece, grown once past the mark */
	assert_int_equal(check(e, NULL, 0), 1);
}

/* Two states fed by one scan. */
static void seen_both(const char *relpath, const struct stat *sb, enum manifest_seen kind, void *ud)
{
	struct scanstate **two = ud;
	scanstate_seen(relpath, sb, kind, two[0]);
	scanstate_seen(relpath, sb, kind, two[1]);
}

/* With a spill file, a state being built holds about SCANSTATE_SPILL_AT
 * bytes of names, not all of them (the largest allocation while 20000
 * names are recorded), and the save writes the same bytes as a state that
 * held them all, fed by the same scan (but for the stamp each begin took,
 * and so the MAC); that file loads and verifies. */
static void test_spilled(void **state)
{
	struct env *e = *state;
	struct scanstate *two[2];
	struct manifest *m;
	struct stat sb;
	char name[128];

	assert_int_equal(fstatat(e->dfd, ".", &sb, 0), 0);
	for (int k = 0; k < 2; k++) {
		assert_int_equal(scanstate_new(&two[k]), 0);
		scanstate_begin(two[k], e->dfd);
		if (k == 1)
			assert_int_equal(scanstate_spill(two[k], e->sfd), 0);
		mem_largest_reset();
		for (int i = 0; i < 20000; i++) {
			snprintf(name, sizeof(name), "d/a-rather-long-file-name-so-that-the-state-grows-%05d", i);
			scanstate_seen(name, &sb, MANIFEST_SEEN_STAT, two[k]);
		}
		if (k == 0)
			assert_true(mem_largest() > 2 * SCANSTATE_SPILL_AT);
		else
			assert_true(mem_largest() <= 2 * SCANSTATE_SPILL_AT);
		assert_int_equal(scanstate_count(two[k]), 20000);
		scanstate_free(two[k]);
	}

	make_many(e);
	granule();
	for (int k = 0; k < 2; k++) {
		assert_int_equal(scanstate_new(&two[k]), 0);
		scanstate_begin(two[k], e->dfd);
	}
	assert_int_equal(scanstate_spill(two[1], e->sfd), 0);
	struct manifest_scan_opts o = {.filter = filter, .seen = seen_both, .seen_ud = two};
	assert_int_equal(manifest_scan(e->dfd, &o, &m), 0);
	assert_int_equal(scanstate_save(two[0], e->sfd, "held", m, key, fp, NULL, 0), 0);
	assert_int_equal(scanstate_save(two[1], e->sfd, SCANSTATE_FILE, m, key, fp, NULL, 0), 0);
	/* saved twice: the spilled names are read again */
	assert_int_equal(scanstate_save(two[1], e->sfd, "again", m, key, fp, NULL, 0), 0);
	size_t la, lb, lc;
	uint8_t *a = (uint8_t *)tu_read_file(e->sfd, "held", &la), *b = (uint8_t *)tu_read_file(e->sfd, SCANSTATE_FILE, &lb),
		*c = (uint8_t *)tu_read_file(e->sfd, "again", &lc);
	assert_true(la > 2 * 1024 * 1024);
	assert_int_equal(la, lb);
	assert_int_equal(lb, lc);
	assert_memory_equal(b, c, lb);
	size_t stamp_at = 4 + 1 + 1 + 2 + SCANSTATE_FP_LEN + CHUNK_HASH_LEN + 4;
	assert_memory_equal(a, b, stamp_at);
	assert_memory_equal(a + stamp_at + 8, b + stamp_at + 8, la - stamp_at - 8 - 32);
	free(a);
	free(b);
	free(c);
	manifest_free(m);
	scanstate_free(two[0]);
	scanstate_free(two[1]);
	assert_int_equal(check(e, NULL, 0), 1);
}

static void test_round_trip(void **state)
{
	struct env *e = *state;
	struct scanstate *st;
	struct manifest *m, *again;

	make_tree(e);
	scan_save(e, "extra bytes");
	assert_int_equal(scanstate_load(e->sfd, SCANSTATE_FILE, key, fp, 0, &st), 0);
	assert_int_equal(scanstate_check(st), 0);
	size_t n;
	const uint8_t *x = scanstate_extra(st, &n);
	assert_int_equal(n, 11);
	assert_memory_equal(x, "extra bytes", 11);
	/* every name of every read directory, the skipped one's only by name */
	assert_int_equal(scanstate_count(st), 10);
	assert_int_equal(scanstate_verify(st, e->dfd, 1, NULL), 1);
	assert_int_equal(scanstate_manifest(st, &m), 0);
	assert_memory_equal(m->root, scanstate_root(st), CHUNK_HASH_LEN);
	assert_int_equal(scanstate_manifest_count(st), m->n);
	struct manifest_scan_opts o = {.filter = filter};
	assert_int_equal(manifest_scan(e->dfd, &o, &again), 0);
	assert_memory_equal(m->root, again->root, CHUNK_HASH_LEN);
	manifest_free(m);
	manifest_free(again);
	scanstate_free(st);
	/* re-saved from a loaded state: the same bytes */
	struct stat sb;
	assert_int_equal(fstatat(e->sfd, SCANSTATE_FILE, &sb, 0), 0);
	assert_int_equal(scanstate_load(e->sfd, SCANSTATE_FILE, key, fp, 0, &st), 0);
	assert_int_equal(scanstate_manifest(st, &m), 0);
	assert_int_equal(scanstate_save(st, e->sfd, "copy", m, key, fp, "extra bytes", 11), 0);
	size_t la, lb;
	uint8_t *a = (uint8_t *)tu_read_file(e->sfd, SCANSTATE_FILE, &la),
		*b = (uint8_t *)tu_read_file(e->sfd, "copy", &lb);
	assert_int_equal(la, lb);
	assert_memory_equal(a, b, la);
	free(a);
	free(b);
	manifest_free(m);
	scanstate_free(st);
	/* the walk is the same with 1, 2 and 8 walkers */
	for (unsigned t = 1; t <= 8; t *= 2) {
		assert_int_equal(scanstate_load(e->sfd, SCANSTATE_FILE, key, fp, 0, &st), 0);
		assert_int_equal(scanstate_verify(st, e->dfd, t, NULL), 1);
		scanstate_free(st);
	}
	/* what the skipped directory holds does not count; its type does */
	put(e, "skipped/more", "m\n");
	assert_int_equal(check(e, NULL, 0), 1);
}

/* One change of each kind while nothing ran: every one is found. */
static void test_changes_found(void **state)
{
	struct env *e = *state;
	char first[MANIFEST_PATH_MAX + 1], p[256], q[256];
	struct stat sb;

	make_tree(e);
	static const char *const kinds[] = {
	    "same size and mtime",
	    "rename",
	    "deleted directory",
	    "hard link",
	    "chmod",
	    "symlink retargeted",
	    "new file",
	    "removed file",
	    "type of skipped",
	    "dir chmod",
	    "touch back",
	    "new in subdir",
	    /* names changed in a directory whose mtime is then set back: its
	     * ctime moved (below the root, a directory whose identity matched
	     * is not listed again: doc/SYNC.md "Unchanged trees") */
	    "new in subdir, dir touched back",
	    "removed in subdir, dir touched back",
	    "renamed in subdir, dir touched back",
	};
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++) {
		tu_rm_rf(e->dir);
		assert_int_equal(mkdir(e->dir, 0700), 0);
		close(e->dfd);
		e->dfd = open(e->dir, O_RDONLY | O_DIRECTORY);
		make_tree(e);
		scan_save(e, "");
		assert_int_equal(check(e, NULL, 0), 1);
		switch (k) {
		case 0: { /* same size, mtime put back to the nanosecond: ctime moved */
			assert_int_equal(fstatat(e->dfd, "a.txt", &sb, 0), 0);
			put(e, "a.txt", "AAAA\n");
			struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
			assert_int_equal(utimensat(e->dfd, "a.txt", ts, 0), 0);
			break;
		}
		case 1:
			assert_int_equal(renameat(e->dfd, "d/x", e->dfd, "d/x2"), 0);
			break;
		case 2:
			snprintf(p, sizeof(p), "%s/gone", e->dir);
			tu_rm_rf(p);
			break;
		case 3: /* b.txt replaced by a hard link to a.txt */
			snprintf(p, sizeof(p), "%s/a.txt", e->dir);
			snprintf(q, sizeof(q), "%s/b.tmp", e->dir);
			assert_int_equal(link(p, q), 0);
			assert_int_equal(renameat(e->dfd, "b.tmp", e->dfd, "b.txt"), 0);
			break;
		case 4:
			assert_int_equal(fchmodat(e->dfd, "d/e/y", 0600, 0), 0);
			break;
		case 5:
			assert_int_equal(unlinkat(e->dfd, "link", 0), 0);
			assert_int_equal(symlinkat("b.txt", e->dfd, "link"), 0);
			break;
		case 6:
			put(e, "new", "n\n");
			break;
		case 7:
			assert_int_equal(unlinkat(e->dfd, "d/x", 0), 0);
			break;
		case 8: /* the skipped directory becomes a file */
			snprintf(p, sizeof(p), "%s/skipped", e->dir);
			tu_rm_rf(p);
			put(e, "skipped", "now a file\n");
			break;
		case 9:
			assert_int_equal(fchmodat(e->dfd, "d", 0700, 0), 0);
			break;
		case 10: { /* rewritten and touched back: size equal, mtime equal to the second */
			assert_int_equal(fstatat(e->dfd, "d/e/y", &sb, 0), 0);
			put(e, "d/e/y", "Y\n");
			struct timespec ts[2] = {sb.st_atim, {sb.st_mtim.tv_sec, 0}};
			assert_int_equal(utimensat(e->dfd, "d/e/y", ts, 0), 0);
			break;
		}
		case 11:
			put(e, "d/e/new", "n\n");
			break;
		case 12:
		case 13:
		case 14: {
			assert_int_equal(fstatat(e->dfd, "d/e", &sb, 0), 0);
			if (k == 12)
				put(e, "d/e/new", "n\n");
			else if (k == 13)
				assert_int_equal(unlinkat(e->dfd, "d/e/y", 0), 0);
			else
				assert_int_equal(renameat(e->dfd, "d/e/y", e->dfd, "d/e/z"), 0);
			struct timespec ts[2] = {sb.st_atim, sb.st_mtim};
			assert_int_equal(utimensat(e->dfd, "d/e", ts, 0), 0);
			break;
		}
		}
		first[0] = '\0';
		int r = check(e, first, sizeof(first));
		if (r != 0)
			fail_msg("%s: not found (verify %d)", kinds[k], r);
		assert_true(first[0] != '\0');
	}
}

/* A file changed in the stamp's granule is racy: never taken as unchanged. */
static void test_racy(void **state)
{
	struct env *e = *state;
	struct scanstate *st;
	struct manifest *m;

	make_tree(e);
	granule();
	assert_int_equal(scanstate_new(&st), 0);
	scanstate_begin(st, e->dfd);
	put(e, "a.txt", "AAAA\n"); /* same size, ctime >= stamp */
	struct manifest_scan_opts o = {.filter = filter, .seen = scanstate_seen, .seen_ud = st};
	assert_int_equal(manifest_scan(e->dfd, &o, &m), 0);
	assert_int_equal(scanstate_save(st, e->sfd, SCANSTATE_FILE, m, key, fp, NULL, 0), 0);
	manifest_free(m);
	scanstate_free(st);
	char first[MANIFEST_PATH_MAX + 1];
	assert_int_equal(check(e, first, sizeof(first)), 0);
	assert_string_equal(first, "a.txt");
	/* distrusted (a change seen while scanning): nothing saved, the old file gone */
	assert_int_equal(scanstate_new(&st), 0);
	scanstate_begin(st, e->dfd);
	o.seen_ud = st;
	assert_int_equal(manifest_scan(e->dfd, &o, &m), 0);
	scanstate_distrust(st);
	assert_int_equal(scanstate_save(st, e->sfd, SCANSTATE_FILE, m, key, fp, NULL, 0), -ESTALE);
	assert_int_equal(faccessat(e->sfd, SCANSTATE_FILE, F_OK, 0), -1);
	manifest_free(m);
	scanstate_free(st);
}

/* Every truncation, every flipped byte, another key, another fingerprint,
 * another version: refused, never taken, never a crash. */
static void test_damaged(void **state)
{
	struct env *e = *state;
	struct scanstate *st;
	size_t n;

	make_tree(e);
	scan_save(e, "x");
	uint8_t *good = (uint8_t *)tu_read_file(e->sfd, SCANSTATE_FILE, &n);
	uint8_t other[SCANSTATE_KEY_LEN] = {1, 2, 4};
	assert_int_equal(scanstate_load(e->sfd, SCANSTATE_FILE, other, fp, 0, &st), 0);
	assert_int_equal(scanstate_verify(st, e->dfd, 2, NULL), -EBADMSG); /* forged: another key */
	scanstate_free(st);
	assert_int_equal(scanstate_load(e->sfd, SCANSTATE_FILE, key, other, 0, &st), -EBADMSG);
	assert_int_equal(scanstate_load(e->sfd, "missing", key, fp, 0, &st), -ENOENT);
	for (size_t len = 0; len < n; len++) {
		tu_put_file(e->sfd, "cut", good, len, 0600);
		int r = scanstate_load(e->sfd, "cut", key, fp, SCANSTATE_LOAD_DECODE, &st);
		if (r == 0) {
			r = scanstate_check(st);
			scanstate_free(st);
		}
		if (r != -EBADMSG)
			fail_msg("truncated to %zu of %zu bytes: %d", len, n, r);
	}
	uint8_t *bad = malloc(n);
	assert_non_null(bad);
	for (size_t i = 0; i < n; i++) {
		memcpy(bad, good, n);
		bad[i] ^= (uint8_t)(1u << (i % 8));
		tu_put_file(e->sfd, "flip", bad, n, 0600);
		int r = scanstate_load(e->sfd, "flip", key, fp, 0, &st);
		if (r == 0) {
			r = scanstate_verify(st, e->dfd, 2, NULL);
			scanstate_free(st);
		}
		if (r != -EBADMSG)
			fail_msg("byte %zu of %zu flipped: %d", i, n, r);
	}
	free(bad);
	free(good);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_round_trip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_changes_found, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_racy, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_damaged, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_spilled, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_save_streamed, setup, teardown),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
