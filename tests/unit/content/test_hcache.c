/* SPDX-License-Identifier: Apache-2.0 */
/* hcache: the stat-keyed hash cache never hides a change (hcache.h). */
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

#include "testutil.h"

#include "airlock/content/hcache.h"
#include "airlock/content/manifest.h"

struct env {
	char dir[64];	/* the scanned tree */
	char state[64]; /* where the cache lives */
	int dfd, sfd;
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	if (!e)
		abort();
	tu_tmpdir(e->dir, sizeof(e->dir), "hcache-tree");
	tu_tmpdir(e->state, sizeof(e->state), "hcache-state");
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

static void put_file(struct env *e, const char *name, const char *text, size_t n)
{
	int fd = openat(e->dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, n), (ssize_t)n);
	close(fd);
}

/* Set mtime and atime of name to t (seconds ago from now). */
static void age(struct env *e, const char *name, time_t ago, struct timespec *was)
{
	struct timespec ts[2];
	struct stat st;
	if (was) {
		assert_int_equal(fstatat(e->dfd, name, &st, 0), 0);
		ts[0] = ts[1] = st.st_mtim;
		*was = st.st_mtim;
	} else {
		clock_gettime(CLOCK_REALTIME, &ts[0]);
		ts[0].tv_sec -= ago;
		ts[1] = ts[0];
	}
	assert_int_equal(utimensat(e->dfd, name, ts, 0), 0);
}

/* Scan with a cache loaded from the state dir, save it back; return the
 * hash of `name` and the cache counters. */
static void scan(struct env *e, const char *name, uint8_t hash[CHUNK_HASH_LEN], uint64_t *hits)
{
	struct hcache *c;
	struct manifest *m;
	uint64_t miss, racy;
	assert_int_equal(hcache_new(NULL, &c), 0);
	int r = hcache_load(c, e->sfd, HCACHE_FILE);
	assert_true(r == 0 || r == -ENOENT || r == -EBADMSG);
	struct manifest_scan_opts o = {.chunking = &chunk_params_default, .cache = c};
	assert_int_equal(manifest_scan(e->dfd, &o, &m), 0);
	assert_int_equal(hcache_save(c, e->sfd, HCACHE_FILE), 0);
	hcache_counts(c, hits, &miss, &racy);
	long i = manifest_find(m, name);
	assert_true(i >= 0);
	memcpy(hash, m->e[i].hash, CHUNK_HASH_LEN);
	manifest_free(m);
	hcache_free(c);
}

static void content_hash(const char *text, size_t n, uint8_t h[CHUNK_HASH_LEN])
{
	chunk_hash(text, n, h);
}

/* ctime: same size, mtime put back with touch -d: still a new hash. */
static void test_restored_mtime(void **state)
{
	struct env *e = *state;
	uint8_t h[CHUNK_HASH_LEN], want[CHUNK_HASH_LEN];
	uint64_t hits;
	struct timespec was, ts[2];

	put_file(e, "a.txt", "hello world\n", 12);
	age(e, "a.txt", 10, NULL);
	/* ctime is now: racy; wait past it so the second scan stores it */
	sleep(1);
	scan(e, "a.txt", h, &hits);
	scan(e, "a.txt", h, &hits);
	assert_int_equal(hits, 1); /* cached */
	age(e, "a.txt", 0, &was);
	put_file(e, "a.txt", "HELLO WORLD\n", 12);
	ts[0] = ts[1] = was;
	assert_int_equal(utimensat(e->dfd, "a.txt", ts, 0), 0); /* touch -d back */
	scan(e, "a.txt", h, &hits);
	content_hash("HELLO WORLD\n", 12, want);
	assert_memory_equal(h, want, CHUNK_HASH_LEN);
	assert_int_equal(hits, 0);
}

/* A corrupt or truncated cache is ignored, never trusted. */
static void test_corrupt(void **state)
{
	struct env *e = *state;
	uint8_t h[CHUNK_HASH_LEN], want[CHUNK_HASH_LEN];
	uint64_t hits;
	struct stat st;

	put_file(e, "b.txt", "original", 8);
	age(e, "b.txt", 10, NULL);
	sleep(1);
	scan(e, "b.txt", h, &hits);
	scan(e, "b.txt", h, &hits);
	assert_int_equal(hits, 1);
	/* flip one byte of the stored hash in the file: checksum fails */
	assert_int_equal(fstatat(e->sfd, HCACHE_FILE, &st, 0), 0);
	int fd = openat(e->sfd, HCACHE_FILE, O_RDWR);
	assert_true(fd >= 0);
	uint8_t byte;
	off_t at = st.st_size - 16 - 4 - 5; /* inside the last entry's hash */
	assert_int_equal(pread(fd, &byte, 1, at), 1);
	byte ^= 0x40;
	assert_int_equal(pwrite(fd, &byte, 1, at), 1);
	close(fd);
	struct hcache *c;
	assert_int_equal(hcache_new(NULL, &c), 0);
	assert_int_equal(hcache_load(c, e->sfd, HCACHE_FILE), -EBADMSG);
	hcache_free(c);
	scan(e, "b.txt", h, &hits);
	assert_int_equal(hits, 0);
	content_hash("original", 8, want);
	assert_memory_equal(h, want, CHUNK_HASH_LEN);
	/* truncated */
	fd = openat(e->sfd, HCACHE_FILE, O_RDWR);
	assert_int_equal(ftruncate(fd, 30), 0);
	close(fd);
	scan(e, "b.txt", h, &hits);
	assert_int_equal(hits, 0);
	assert_memory_equal(h, want, CHUNK_HASH_LEN);
}

/* Racy: a file changed in the same second (same size, same mtime second)
 * right after it was hashed is hashed again, not taken from the cache. */
static void test_racy(void **state)
{
	struct env *e = *state;
	uint8_t h[CHUNK_HASH_LEN], want[CHUNK_HASH_LEN];
	uint64_t hits;

	for (int i = 0; i < 20; i++) {
		char t[16];
		snprintf(t, sizeof(t), "v%02d-content", i);
		put_file(e, "c.txt", t, strlen(t));
		scan(e, "c.txt", h, &hits);
		content_hash(t, strlen(t), want);
		assert_memory_equal(h, want, CHUNK_HASH_LEN);
	}
}

/* The identity: a new device number alone (a fresh overlay mount of the
 * same layers, an NFS or FUSE remount) is the same file; any other field
 * changed is another. */
static void test_key_identity(void **state)
{
	struct env *e = *state;
	struct hcache_key a, b;
	struct stat sb;

	put_file(e, "k.txt", "k\n", 2);
	assert_int_equal(fstatat(e->dfd, "k.txt", &sb, AT_SYMLINK_NOFOLLOW), 0);
	hcache_key_of(&sb, &a);
	assert_int_equal(a.dev, (uint64_t)sb.st_dev); /* kept (persisted), not compared */
	static const struct {
		const char *what;
		uint64_t dev, ino, size;
		int64_t mtime, ctime;
		uint32_t mode;
		bool same;
	} rows[] = {
	    {"nothing", 0, 0, 0, 0, 0, 0, true},
	    {"the device", 7, 0, 0, 0, 0, 0, true},
	    {"the inode", 0, 1, 0, 0, 0, 0, false},
	    {"the size", 0, 0, 1, 0, 0, 0, false},
	    {"the mtime by 1 ns", 0, 0, 0, 1, 0, 0, false},
	    {"the ctime by 1 ns", 0, 0, 0, 0, 1, 0, false},
	    {"the mode", 7, 0, 0, 0, 0, 0100, false},
	};
	for (size_t i = 0; i < sizeof(rows) / sizeof(rows[0]); i++) {
		b = a;
		b.dev += rows[i].dev;
		b.ino += rows[i].ino;
		b.size += rows[i].size;
		b.mtime += rows[i].mtime;
		b.ctime += rows[i].ctime;
		b.mode ^= rows[i].mode;
		print_message("changed %s: %s\n", rows[i].what, rows[i].same ? "same" : "another");
		assert_int_equal(hcache_key_eq(&a, &b), rows[i].same);
	}
}

/* What a command does to the (guest's) copy is seen: append, rewrite in
 * place with the same size, replace by rename, chmod. */
static void test_guest_edit(void **state)
{
	struct env *e = *state;
	uint8_t h[CHUNK_HASH_LEN], want[CHUNK_HASH_LEN];
	uint64_t hits;

	put_file(e, "d.c", "int x;\n", 7);
	put_file(e, "e.c", "int y;\n", 7);
	age(e, "d.c", 10, NULL);
	age(e, "e.c", 10, NULL);
	sleep(1);
	scan(e, "d.c", h, &hits);
	scan(e, "d.c", h, &hits);
	assert_int_equal(hits, 2);
	/* in-place same-size rewrite, then a rename over e.c */
	int fd = openat(e->dfd, "d.c", O_WRONLY);
	assert_int_equal(pwrite(fd, "long", 4, 0), 4);
	close(fd);
	put_file(e, "e.new", "int z;\n", 7);
	assert_int_equal(renameat(e->dfd, "e.new", e->dfd, "e.c"), 0);
	scan(e, "d.c", h, &hits);
	content_hash("longx;\n", 7, want);
	assert_memory_equal(h, want, CHUNK_HASH_LEN);
	scan(e, "e.c", h, &hits);
	content_hash("int z;\n", 7, want);
	assert_memory_equal(h, want, CHUNK_HASH_LEN);
}

/* A saved cache loads back whole (every entry, large files' chunk lists
 * too) after hcache_trim dropped it from memory; a trimmed cache itself
 * answers nothing (its memory is gone), and saving it again writes an
 * empty but valid file. */
static void test_trim_reload(void **state)
{
	struct env *e = *state;
	struct manifest *m, *m2;
	struct hcache *c;
	uint64_t hits, miss, racy;
	enum { NF = 300 };
	static char big[300 * 1024];

	for (size_t i = 0; i < sizeof(big); i++)
		big[i] = (char)(i * 2654435761u >> 13);
	for (int i = 0; i < NF; i++) {
		char name[32], text[48];
		snprintf(name, sizeof(name), "f%03d.txt", i);
		snprintf(text, sizeof(text), "content of file %d\n", i);
		put_file(e, name, text, strlen(text));
		age(e, name, 10, NULL);
	}
	put_file(e, "big.bin", big, sizeof(big));
	age(e, "big.bin", 10, NULL);
	sleep(1);
	struct manifest_scan_opts o = {.chunking = &chunk_params_default};
	assert_int_equal(hcache_new(&chunk_params_default, &c), 0);
	o.cache = c;
	assert_int_equal(manifest_scan(e->dfd, &o, &m), 0);
	hcache_counts(c, &hits, &miss, &racy);
	assert_int_equal(hits, 0);
	assert_int_equal(hcache_save(c, e->sfd, HCACHE_FILE), 0);
	hcache_trim(c);
	hcache_trim(NULL);
	/* trimmed: nothing loaded, so a scan hashes everything again */
	assert_int_equal(manifest_scan(e->dfd, &o, &m2), 0);
	hcache_counts(c, &hits, &miss, &racy);
	assert_int_equal(hits, 0);
	assert_int_equal(miss, NF + 1);
	manifest_free(m2);
	/* loaded again from the file saved before the trim: every file hits,
	 * with the same hashes and chunk lists */
	hcache_free(c);
	assert_int_equal(hcache_new(&chunk_params_default, &c), 0);
	o.cache = c;
	assert_int_equal(hcache_load(c, e->sfd, HCACHE_FILE), 0);
	assert_int_equal(manifest_scan(e->dfd, &o, &m2), 0);
	hcache_counts(c, &hits, &miss, &racy);
	assert_int_equal(hits, NF + 1);
	assert_int_equal(miss, 0);
	assert_int_equal(m2->n, m->n);
	for (size_t i = 0; i < m->n; i++) {
		assert_string_equal(m2->e[i].path, m->e[i].path);
		assert_memory_equal(m2->e[i].hash, m->e[i].hash, CHUNK_HASH_LEN);
		assert_int_equal(m2->e[i].nchunks, m->e[i].nchunks);
		for (size_t k = 0; k < m->e[i].nchunks; k++) {
			assert_int_equal(m2->e[i].chunks[k].off, m->e[i].chunks[k].off);
			assert_int_equal(m2->e[i].chunks[k].len, m->e[i].chunks[k].len);
			assert_memory_equal(m2->e[i].chunks[k].hash, m->e[i].chunks[k].hash, CHUNK_HASH_LEN);
		}
	}
	long bi = manifest_find(m, "big.bin");
	assert_true(bi >= 0 && m->e[bi].nchunks >= 2);
	/* an empty cache saves as a valid file of no entries */
	hcache_trim(c);
	assert_int_equal(hcache_save(c, e->sfd, HCACHE_FILE), 0);
	assert_int_equal(hcache_load(c, e->sfd, HCACHE_FILE), 0);
	manifest_free(m);
	manifest_free(m2);
	hcache_free(c);
}

/* A scan that puts more than HCACHE_SPILL_AT bytes of entries writes
 * them out as it goes (the temporary file holds them before the save);
 * the saved cache has them all: a second scan hits every file. */
static void test_spill(void **state)
{
	struct env *e = *state;
	char name[128], tmp[64];
	struct stat st;
	enum { N = 6000 };

	for (int i = 0; i < N; i++) {
		snprintf(name, sizeof(name), "a-rather-long-file-name-so-that-entries-add-up-%05d", i);
		put_file(e, name, name, strlen(name));
	}
	struct timespec g = {0, 50 * 1000 * 1000}; /* past the files' timestamp granule */
	nanosleep(&g, NULL);
	for (int round = 0; round < 2; round++) {
		struct hcache *c;
		struct manifest *m;
		uint64_t hits, miss, racy;
		assert_int_equal(hcache_new(NULL, &c), 0);
		int r = hcache_load(c, e->sfd, HCACHE_FILE);
		assert_int_equal(r, round ? 0 : -ENOENT);
		struct manifest_scan_opts o = {.chunking = &chunk_params_default, .cache = c};
		assert_int_equal(manifest_scan(e->dfd, &o, &m), 0);
		snprintf(tmp, sizeof(tmp), "%s.tmp", HCACHE_FILE);
		assert_int_equal(fstatat(e->sfd, tmp, &st, 0), 0); /* spilled before the save */
		assert_true(st.st_size > (off_t)HCACHE_SPILL_AT);
		assert_int_equal(hcache_save(c, e->sfd, "another"), -EINVAL);
		assert_int_equal(hcache_save(c, e->sfd, HCACHE_FILE), 0);
		assert_int_equal(fstatat(e->sfd, tmp, &st, 0), -1);
		hcache_counts(c, &hits, &miss, &racy);
		assert_int_equal(hits, round ? N : 0);
		assert_int_equal(miss, round ? 0 : N);
		manifest_free(m);
		hcache_free(c);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_restored_mtime, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_corrupt, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_racy, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_key_identity, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_guest_edit, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_trim_reload, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_spill, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
