/* SPDX-License-Identifier: Apache-2.0 */
/* track (track.h): inotify over a real directory tree. Every kind of change
 * lands in the dirty set with the command it is attributed to; the agent's
 * own applies do not; a directory moved in is walked; the hashes a report
 * carries are the ones the host's manifests hold. */
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
#include <unistd.h>

#include <cmocka.h>

#include "airlock/content/manifest.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/guest/track.h"
#include "testutil.h"

struct set {
	struct track_dirty *v;
	size_t n;
};

static void take(struct track *t, struct set *s)
{
	assert_int_equal(track_take(t, &s->v, &s->n), 0);
}

static void set_clear(struct set *s)
{
	for (size_t i = 0; i < s->n; i++)
		mem_free(s->v[i].path);
	mem_free(s->v);
	memset(s, 0, sizeof(*s));
}

static const struct track_dirty *has(const struct set *s, const char *path)
{
	for (size_t i = 0; i < s->n; i++)
		if (!strcmp(s->v[i].path, path))
			return &s->v[i];
	return NULL;
}

/* The entry for path, which must be there. */
static struct track_dirty must(const struct set *s, const char *path)
{
	const struct track_dirty *d = has(s, path);
	if (!d)
		fail_msg("%s is not in the dirty set", path);
	return d ? *d : (struct track_dirty){0};
}

static void test_changes(void **state)
{
	char root[256], p[600], q[600];
	struct track *t;
	struct set s = {0};
	char err[256] = "";
	(void)state;

	tu_tmpdir(root, sizeof(root), "track");
	int rfd = open(root, O_RDONLY | O_DIRECTORY);
	tu_put_file(rfd, "a.txt", "a", 1, 0644);
	assert_int_equal(mkdirat(rfd, "old", 0755), 0);
	tu_put_file(rfd, "old/x", "x", 1, 0644);
	tu_put_file(rfd, "gone", "g", 1, 0644);
	assert_int_equal(track_new(rfd, root, &t, err, sizeof(err)), 0);

	/* a command (exec stream 5): modify, create, delete, chmod, rename a dir */
	tu_put_file(rfd, "a.txt", "changed", 7, 0644);
	tu_put_file(rfd, "new.txt", "n", 1, 0644);
	assert_int_equal(unlinkat(rfd, "gone", 0), 0);
	assert_int_equal(fchmodat(rfd, "a.txt", 0755, 0), 0);
	assert_int_equal(renameat(rfd, "old", rfd, "moved"), 0);
	track_read(t, 5);
	take(t, &s);
	assert_non_null(has(&s, "a.txt"));
	assert_int_equal(must(&s, "a.txt").by, 5);
	assert_non_null(has(&s, "new.txt"));
	assert_non_null(has(&s, "gone"));
	assert_non_null(has(&s, "old"));
	assert_non_null(has(&s, "moved"));
	assert_true(must(&s, "moved").tree); /* moved in: walked by the report */
	set_clear(&s);

	/* the watch follows the moved directory: a change inside it is named by its new path */
	tu_put_file(rfd, "moved/y", "y", 1, 0644);
	track_read(t, 7);
	take(t, &s);
	assert_non_null(has(&s, "moved/y"));
	assert_int_equal(must(&s, "moved/y").by, 7);
	set_clear(&s);

	/* mkdir -p with files made before any watch could be added: the tree entry covers them */
	snprintf(p, sizeof(p), "mkdir -p %s/deep/er/est && echo z >%s/deep/er/est/z", root, root);
	assert_int_equal(system(p), 0);
	track_read(t, 9);
	take(t, &s);
	assert_non_null(has(&s, "deep"));
	assert_true(must(&s, "deep").tree);
	assert_null(has(&s, "deep/er/est/z")); /* covered by the tree entry */
	set_clear(&s);

	/* what an apply wrote is not a change */
	tu_put_file(rfd, "from-host", "h", 1, 0644);
	track_read(t, TRACK_BY_APPLY);
	take(t, &s);
	assert_null(has(&s, "from-host"));
	set_clear(&s);

	/* apply temporaries are never reported */
	snprintf(q, sizeof(q), "%s%s", MANIFEST_RESERVED_PREFIX, "0123456789abcdef");
	tu_put_file(rfd, q, "t", 1, 0600);
	track_read(t, 3);
	take(t, &s);
	assert_int_equal(s.n, 0);
	set_clear(&s);

	struct track_stats st;
	track_get_stats(t, &st);
	assert_true(st.watches >= 4 && st.saturated == 0);
	track_free(t);
	close(rfd);
	tu_rm_rf(root);
}

static int scan_all(const char *rel, bool is_dir, void *ud)
{
	(void)rel;
	(void)is_dir;
	(void)ud;
	return MANIFEST_KEEP;
}

/* track_describe gives the host's manifest hashes (small and chunked files, links). */
/* How many events the kernel queues per inotify instance (0: unknown). */
static long max_queued(void)
{
	FILE *f = fopen("/proc/sys/fs/inotify/max_queued_events", "r");
	long v = 0;
	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = 0;
		fclose(f);
	}
	return v;
}

/* An apply of more files than the kernel's queue holds overflows it (the
 * real one: nothing is shrunk). What the apply wrote is not a change; a
 * command's write after it is reported at once, exactly, without a walk of
 * the tree; a write lost in the overflow is found by the stat-only
 * recovery; nothing else is reported. The old tracker turned the overflow
 * into "the whole root, walked and hashed" at the next report. */
static void test_overflow(void **state)
{
	char root[256], p[64];
	struct track *t;
	struct set s = {0};
	char err[256] = "";
	struct track_stats st;
	long q = max_queued();
	(void)state;

	if (q <= 0 || q > 200000) {
		print_message("skipped: fs.inotify.max_queued_events is %ld\n", q);
		skip();
	}
	size_t nfiles = (size_t)q / 3 + 1000; /* create, modify, close_write each */
	tu_tmpdir(root, sizeof(root), "track-ovf");
	int rfd = open(root, O_RDONLY | O_DIRECTORY);
	tu_put_file(rfd, "a.txt", "a", 1, 0644);
	assert_int_equal(mkdirat(rfd, "d", 0755), 0);
	assert_int_equal(track_new(rfd, root, &t, err, sizeof(err)), 0);

	/* the apply: more files than the queue holds, and amid them a write of
	 * some other process, whose event is lost with the rest */
	for (size_t i = 0; i < nfiles; i++) {
		snprintf(p, sizeof(p), "d/f%zu", i);
		tu_put_file(rfd, p, "x", 1, 0644);
		if (i == nfiles / 2)
			tu_put_file(rfd, "background.txt", "b", 1, 0644);
	}
	assert_true(track_applied_read(t));
	for (size_t i = 0; i < nfiles; i++) {
		snprintf(p, sizeof(p), "d/f%zu", i);
		track_applied_path(t, rfd, p);
	}
	/* a command's write after the overflow: in the very next report, by it */
	tu_put_file(rfd, "a.txt", "changed", 7, 0644);
	track_read(t, 5);
	take(t, &s);
	assert_non_null(has(&s, "a.txt"));
	assert_int_equal(must(&s, "a.txt").by, 5);
	for (size_t i = 0; i < s.n; i++) {
		assert_true(s.v[i].path[0]); /* never the root: no walk of the tree */
		assert_true(strncmp(s.v[i].path, "d/f", 3));
	}
	set_clear(&s);
	track_get_stats(t, &st);
	assert_true(st.lost >= 1 && st.lost_now); /* the recovery waits for a pause of the applies */

	/* the recovery: the lost write, the directory the apply filled (an
	 * item, no walk), and not one of the apply's files */
	track_settle(t);
	take(t, &s);
	assert_non_null(has(&s, "background.txt"));
	assert_int_equal(must(&s, "background.txt").by, 0);
	for (size_t i = 0; i < s.n; i++) {
		assert_true(s.v[i].path[0]);
		assert_true(strncmp(s.v[i].path, "d/f", 3));
		assert_false(s.v[i].tree); /* d was watched all along */
	}
	assert_true(s.n <= 3); /* background.txt, d, a.txt (its ctime is new too) */
	set_clear(&s);
	track_get_stats(t, &st);
	assert_false(st.lost_now);
	assert_false(st.saturated_now);
	assert_int_equal(st.saturated, 0);
	assert_int_equal(st.recoveries, 1);
	assert_true(st.recovery_visited >= nfiles);

	/* tracking goes on as before */
	tu_put_file(rfd, "d/f0", "cmd", 3, 0644);
	track_read(t, 9);
	take(t, &s);
	assert_int_equal(s.n, 1);
	assert_int_equal(must(&s, "d/f0").by, 9);
	set_clear(&s);
	track_free(t);
	close(rfd);
	tu_rm_rf(root);
}

/* AIRLOCK_TRACK_QUEUE_TEST shrinks the queue as a test sees it: a command's
 * write lost that way is found by the recovery. */
static void test_overflow_knob(void **state)
{
	char root[256], p[64];
	struct track *t;
	struct set s = {0};
	char err[256] = "";
	(void)state;

	tu_tmpdir(root, sizeof(root), "track-knob");
	int rfd = open(root, O_RDONLY | O_DIRECTORY);
	setenv("AIRLOCK_TRACK_QUEUE_TEST", "8", 1);
	assert_int_equal(track_new(rfd, root, &t, err, sizeof(err)), 0);
	unsetenv("AIRLOCK_TRACK_QUEUE_TEST");
	for (int i = 0; i < 20; i++) {
		snprintf(p, sizeof(p), "c%d", i);
		tu_put_file(rfd, p, "c", 1, 0644);
	}
	track_read(t, 7);
	track_settle(t);
	take(t, &s);
	for (int i = 0; i < 20; i++) {
		snprintf(p, sizeof(p), "c%d", i);
		assert_non_null(has(&s, p));
	}
	assert_int_equal(s.n, 20);
	set_clear(&s);
	track_free(t);
	close(rfd);
	tu_rm_rf(root);
}

static void test_describe(void **state)
{
	char root[256];
	static uint8_t big[3 << 20];
	struct manifest *m;
	(void)state;

	tu_tmpdir(root, sizeof(root), "track-describe");
	int rfd = open(root, O_RDONLY | O_DIRECTORY);
	tu_fill(big, sizeof(big), 7);
	tu_put_file(rfd, "big.bin", big, sizeof(big), 0640);
	tu_put_file(rfd, "small", "abc", 3, 0644);
	assert_int_equal(symlinkat("small", rfd, "link"), 0);
	struct manifest_scan_opts o = {.chunking = &chunk_params_default, .filter = scan_all};
	assert_int_equal(manifest_scan(rfd, &o, &m), 0);
	const char *paths[] = {"big.bin", "small", "link"};
	for (size_t i = 0; i < 3; i++) {
		struct wire_chg_item it = {.path = (char *)paths[i]};
		assert_int_equal(track_describe(rfd, paths[i], &chunk_params_default, &it), 0);
		long k = manifest_find(m, paths[i]);
		assert_true(k >= 0);
		assert_true(it.flags & WIRE_CHG_F_HASHED);
		assert_memory_equal(it.hash, m->e[k].hash, CHUNK_HASH_LEN);
		assert_int_equal(it.size, m->e[k].size);
		mem_free(it.target);
	}
	struct wire_chg_item gone = {.path = "nothing"};
	assert_int_equal(track_describe(rfd, "nothing", &chunk_params_default, &gone), 0);
	assert_int_equal(gone.st_mode, 0);
	manifest_free(m);
	close(rfd);
	tu_rm_rf(root);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_changes),
	    cmocka_unit_test(test_describe),
	    cmocka_unit_test(test_overflow),
	    cmocka_unit_test(test_overflow_knob),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
