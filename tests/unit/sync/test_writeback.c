/* SPDX-License-Identifier: Apache-2.0 */
/* writeback (writeback.h): the store of guest changes, what counts as one,
 * and the host's decoder and confined write of pulled guest bytes: a
 * well-formed pull lands beneath the workspace; a crafted corpus of guest
 * messages is refused with nothing written. */
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
#include <sodium.h>

#include "airlock/content/apply.h"
#include "airlock/content/manifest.h"
#include "airlock/core/buf.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/policy/policy.h"
#include "airlock/sync/writeback.h"
#include "testutil.h"

static uint8_t sk[64], pk[32], scope[32];

static void item(struct buf *b, const char *path, uint32_t mode, const void *data, size_t n, const char *target)
{
	struct wire_chg_item it = {.path = (char *)path, .st_mode = mode, .target = (char *)target};

	if (S_ISREG(mode)) {
		it.size = n;
		it.flags = WIRE_CHG_F_HASHED;
		chunk_hash(data, n, it.hash);
	} else if (S_ISLNK(mode)) {
		it.size = strlen(target);
		it.flags = WIRE_CHG_F_HASHED;
		chunk_hash(target, it.size, it.hash);
	}
	buf_reset(b);
	assert_int_equal(wire_chg_item_encode(b, &it), 0);
}

struct frames {
	uint8_t type[16];
	struct buf b[16];
	size_t n;
};

static struct buf *frame(struct frames *f, uint8_t type)
{
	f->type[f->n] = type;
	buf_init(&f->b[f->n], 1 << 20);
	return &f->b[f->n++];
}

static void frames_clear(struct frames *f)
{
	for (size_t i = 0; i < f->n; i++)
		buf_clear(&f->b[i]);
	f->n = 0;
}

static void end(struct frames *f)
{
	struct wire_error m = {.code = 0, .msg = ""};
	assert_int_equal(wire_error_encode(frame(f, WIRE_CHG_END), &m), 0);
}

/* The well-formed answer to a pull of "a.txt", "d", "d/link". */
static void good(struct frames *f)
{
	item(frame(f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
	buf_put(frame(f, WIRE_CHG_DATA), "hello", 5);
	item(frame(f, WIRE_CHG_FILE), "d", S_IFDIR | 0750, NULL, 0, NULL);
	item(frame(f, WIRE_CHG_FILE), "d/link", S_IFLNK | 0777, NULL, 0, "../a.txt");
	end(f);
}

static const char *const asked[] = {"a.txt", "d", "d/link"};

/* Feed the frames; on a complete pull write it beneath root. Returns the
 * first error, 0 when written. */
static int run(const struct frames *f, const char *root, uint64_t cap, char *err, size_t errlen)
{
	struct wb_pull_cfg cfg = {.paths = asked,
				  .n = 3,
				  .max_bytes = cap,
				  .cap_name = "workspace.writeback_max_mib",
				  .chunking = &chunk_params_default};
	struct wb_pull *p;
	struct apply *a;
	bool done[3];
	int r = 0;

	cfg.tmp_dirfd = open("/tmp", O_RDONLY | O_DIRECTORY);
	assert_int_equal(wb_pull_new(&cfg, &p), 0);
	for (size_t i = 0; i < f->n && r == 0; i++)
		r = wb_pull_frame(p, f->type[i], buf_ptr(&f->b[i]), buf_len(&f->b[i]));
	if (r == 1) {
		assert_int_equal(apply_open(root, NULL, &a), 0);
		r = wb_pull_write(p, a, sk, pk, scope, done, err, errlen);
		apply_free(a);
	} else if (r == 0) {
		r = -EPROTO; /* incomplete */
		snprintf(err, errlen, "incomplete");
	} else {
		snprintf(err, errlen, "%s", wb_pull_error(p));
	}
	wb_pull_free(p);
	close(cfg.tmp_dirfd);
	return r;
}

static bool empty_dir(const char *root)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "test -z \"$(ls -A %s)\"", root);
	return system(cmd) == 0;
}

static void test_pull_good(void **state)
{
	char root[256], err[512] = "", link[64] = "";
	struct frames f = {0};
	(void)state;

	tu_tmpdir(root, sizeof(root), "wb-good");
	good(&f);
	assert_int_equal(run(&f, root, 1 << 20, err, sizeof(err)), 0);
	int dfd = open(root, O_RDONLY | O_DIRECTORY);
	size_t n;
	char *got = tu_read_file(dfd, "a.txt", &n);
	assert_int_equal(n, 5);
	assert_memory_equal(got, "hello", 5);
	mem_free(got);
	struct stat st;
	assert_int_equal(fstatat(dfd, "d", &st, 0), 0);
	assert_int_equal(st.st_mode & 0777, 0750);
	assert_true(readlinkat(dfd, "d/link", link, sizeof(link)) > 0);
	assert_string_equal(link, "../a.txt");
	close(dfd);
	frames_clear(&f);
	tu_rm_rf(root);
}

/* A crafted corpus: each one refused, the workspace untouched. */
static void test_pull_crafted(void **state)
{
	static const char *const names[] = {
	    "bad hash",	    "path out of order", "absolute path", "dot-dot",	     "data too long",
	    "data unasked", "over the cap",	 "short data",	  "ends early",	     "truncated item",
	    "flags",	    "gone with a hash",	 "link bad hash", "fifo with bytes", "trailing bytes",
	};
	(void)state;
	for (size_t k = 0; k < sizeof(names) / sizeof(names[0]); k++) {
		char root[256], err[512] = "";
		struct frames f = {0};
		struct buf *b;
		tu_tmpdir(root, sizeof(root), "wb-crafted");
		switch (k) {
		case 0: /* bytes that do not match the announced hash */
			item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
			buf_put(frame(&f, WIRE_CHG_DATA), "HELLO", 5);
			item(frame(&f, WIRE_CHG_FILE), "d", S_IFDIR | 0755, NULL, 0, NULL);
			item(frame(&f, WIRE_CHG_FILE), "d/link", S_IFLNK | 0777, NULL, 0, "x");
			end(&f);
			break;
		case 1:
			item(frame(&f, WIRE_CHG_FILE), "d", S_IFDIR | 0755, NULL, 0, NULL);
			break;
		case 2:
			item(frame(&f, WIRE_CHG_FILE), "/etc/passwd", S_IFREG | 0644, "x", 1, NULL);
			break;
		case 3:
			item(frame(&f, WIRE_CHG_FILE), "../a.txt", S_IFREG | 0644, "x", 1, NULL);
			break;
		case 4:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
			buf_put(frame(&f, WIRE_CHG_DATA), "hello!", 6);
			break;
		case 5:
			buf_put(frame(&f, WIRE_CHG_DATA), "x", 1);
			break;
		case 6: /* declares more than the cap: refused before a byte */
			b = frame(&f, WIRE_CHG_FILE);
			{
				struct wire_chg_item it = {.path = "a.txt",
							   .st_mode = S_IFREG | 0644,
							   .size = 10ull << 30,
							   .flags = WIRE_CHG_F_HASHED,
							   .target = NULL};
				memset(it.hash, 1, sizeof(it.hash));
				assert_int_equal(wire_chg_item_encode(b, &it), 0);
			}
			break;
		case 7:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
			buf_put(frame(&f, WIRE_CHG_DATA), "hel", 3);
			end(&f);
			break;
		case 8:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
			buf_put(frame(&f, WIRE_CHG_DATA), "hello", 5);
			end(&f);
			break;
		case 9:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
			buf_truncate(&f.b[0], buf_len(&f.b[0]) - 3);
			break;
		case 10:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
			buf_poke_u8(&f.b[0], 4 + 5 + 4 + 4, 0x80); /* unknown flag */
			break;
		case 11:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", 0, NULL, 0, NULL);
			buf_poke_u8(&f.b[0], 4 + 5 + 4 + 4 + 1 + 8, 0x42); /* a hash on a gone path */
			break;
		case 12:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", 0, NULL, 0, NULL);
			item(frame(&f, WIRE_CHG_FILE), "d", 0, NULL, 0, NULL);
			item(frame(&f, WIRE_CHG_FILE), "d/link", S_IFLNK | 0777, NULL, 0, "../x");
			buf_poke_u8(&f.b[2], buf_len(&f.b[2]) - 1, 'y'); /* target no longer matches its hash */
			end(&f);
			break;
		case 13: /* a fifo with bytes */
			item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFIFO | 0644, NULL, 0, NULL);
			buf_put(frame(&f, WIRE_CHG_DATA), "x", 1);
			break;
		case 14:
			item(frame(&f, WIRE_CHG_FILE), "a.txt", 0, NULL, 0, NULL);
			buf_put_u8(&f.b[0], 0);
			break;
		}
		int r = run(&f, root, 1 << 20, err, sizeof(err));
		if (r == 0) /* case 0 writes the others but never the forged file */
			assert_int_equal(k, 0);
		if (k == 0) {
			int dfd = open(root, O_RDONLY | O_DIRECTORY);
			assert_int_equal(faccessat(dfd, "a.txt", F_OK, AT_SYMLINK_NOFOLLOW), -1);
			close(dfd);
		} else {
			if (r >= 0)
				fail_msg("crafted case '%s' was accepted", names[k]);
			assert_true(empty_dir(root));
		}
		if (k == 6)
			assert_non_null(strstr(err, "over its cap of 1 MiB (workspace.writeback_max_mib)"));
		frames_clear(&f);
		tu_rm_rf(root);
	}
}

/* A symlink in the workspace never leads the write outside it. */
static void test_pull_no_follow(void **state)
{
	char root[256], out[256], err[512] = "", path[600];
	struct frames f = {0};
	(void)state;

	tu_tmpdir(root, sizeof(root), "wb-root");
	tu_tmpdir(out, sizeof(out), "wb-outside");
	snprintf(path, sizeof(path), "%s/d", root);
	assert_int_equal(symlink(out, path), 0);
	item(frame(&f, WIRE_CHG_FILE), "a.txt", 0, NULL, 0, NULL);
	item(frame(&f, WIRE_CHG_FILE), "d", S_IFLNK | 0777, NULL, 0, out);
	item(frame(&f, WIRE_CHG_FILE), "d/link", S_IFREG | 0644, "x", 1, NULL);
	buf_put(frame(&f, WIRE_CHG_DATA), "x", 1);
	end(&f);
	assert_true(run(&f, root, 1 << 20, err, sizeof(err)) < 0);
	assert_true(empty_dir(out));
	frames_clear(&f);
	tu_rm_rf(root);
	tu_rm_rf(out);
}

static void test_store(void **state)
{
	char dir[256], err[256];
	struct wb_store *s;
	struct manifest *known;
	struct manifest_entry e = {.path = "a", .type = MANIFEST_FILE, .mode = 0644, .size = 3};
	struct manifest_entry dd = {.path = "dir", .type = MANIFEST_DIR, .mode = 0755};
	struct manifest_entry df = {.path = "dir/f", .type = MANIFEST_FILE, .mode = 0644, .size = 1};
	struct policy *pol;
	(void)state;

	chunk_hash("abc", 3, e.hash);
	chunk_hash("x", 1, df.hash);
	assert_int_equal(manifest_new(NULL, &known), 0);
	assert_int_equal(manifest_add(known, &e), 0);
	assert_int_equal(manifest_add(known, &dd), 0);
	assert_int_equal(manifest_add(known, &df), 0);
	assert_int_equal(manifest_seal(known), 0);
	assert_int_equal(policy_default(&pol), 0);
	tu_tmpdir(dir, sizeof(dir), "wb-store");
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_int_equal(wb_store_open(dfd, &s, err, sizeof(err)), 0);

	/* the same state as the host's: not a change */
	struct wire_chg_item it = {.path = "a", .st_mode = S_IFREG | 0644, .size = 3, .flags = WIRE_CHG_F_HASHED};
	chunk_hash("abc", 3, it.hash);
	assert_int_equal(wb_note(s, pol, NULL, known, &it, NULL, NULL), 0);
	/* a mode change */
	it.st_mode = S_IFREG | 0755;
	assert_int_equal(wb_note(s, pol, NULL, known, &it, "7", "[\"chmod\"]"), 1);
	const char *from;
	bool hidden;
	assert_int_equal(wb_store_kind(s, wb_store_find(s, "a"), &from, &hidden), WB_MODE);
	/* a deleted directory deletes what the host has beneath it */
	struct wire_chg_item gone = {.path = "dir"};
	assert_int_equal(wb_note(s, pol, NULL, known, &gone, NULL, NULL), 1);
	assert_non_null(wb_store_find(s, "dir/f"));
	/* a rename: the file reappears elsewhere with the same content */
	struct wire_chg_item moved = {.path = "g", .st_mode = S_IFREG | 0644, .size = 1, .flags = WIRE_CHG_F_HASHED};
	chunk_hash("x", 1, moved.hash);
	assert_int_equal(wb_note(s, pol, NULL, known, &moved, NULL, NULL), 1);
	assert_int_equal(wb_store_kind(s, wb_store_find(s, "g"), &from, &hidden), WB_RENAME);
	assert_string_equal(from, "dir/f");
	/* persisted, and loaded again the same */
	assert_int_equal(wb_store_save(s), 0);
	wb_store_free(s);
	assert_int_equal(wb_store_open(dfd, &s, err, sizeof(err)), 0);
	assert_int_equal(wb_store_count(s), 4);
	const struct wb_change *c = wb_store_find(s, "a");
	assert_non_null(c);
	assert_string_equal(c->by_id, "7");
	assert_string_equal(c->by_argv, "[\"chmod\"]");
	/* undone in the guest: no longer waits */
	it.st_mode = S_IFREG | 0644;
	assert_int_equal(wb_note(s, pol, NULL, known, &it, NULL, NULL), 0);
	assert_null(wb_store_find(s, "a"));
	/* many changes in and out: every lookup still finds exactly what is left */
	char name[32];
	for (int k = 0; k < 3000; k++) {
		snprintf(name, sizeof(name), "many/f%d", k);
		struct wire_chg_item m = {.path = name, .st_mode = S_IFREG | 0644, .flags = WIRE_CHG_F_HASHED};
		assert_int_equal(wb_note(s, pol, NULL, known, &m, NULL, NULL), 1);
	}
	for (int k = 0; k < 3000; k += 2) {
		snprintf(name, sizeof(name), "many/f%d", k);
		assert_int_equal(wb_store_remove(s, name), 0);
	}
	for (int k = 0; k < 3000; k++) {
		snprintf(name, sizeof(name), "many/f%d", k);
		assert_true((wb_store_find(s, name) != NULL) == (k % 2 == 1));
	}
	assert_int_equal(wb_store_remove(s, "many/f0"), -ENOENT);
	/* a damaged store is refused, never emptied */
	wb_store_free(s);
	tu_put_file(dfd, WB_STORE_FILE, "{\"version\":1,\"changes\":[{\"path\":\"../x\"}]}", 41, 0600);
	assert_true(wb_store_open(dfd, &s, err, sizeof(err)) < 0);
	assert_non_null(strstr(err, WB_STORE_FILE));
	close(dfd);
	manifest_free(known);
	policy_free(pol);
	tu_rm_rf(dir);
}

/* ---- a vm fork's reported changes ---- */

static int list_into(const char *path, bool deleted, void *ud)
{
	struct buf *b = ud;
	assert_int_equal(buf_put(b, deleted ? "-" : "+", 1), 0);
	assert_int_equal(buf_put(b, path, strlen(path)), 0);
	return buf_put(b, ";", 1);
}

static void test_forkset(void **state)
{
	struct wb_forkset *s;
	struct buf out;
	char err[256] = "", *longp;
	(void)state;

	assert_int_equal(wb_forkset_new(&s), 0);
	/* the guest's word: paths that are not workspace paths are refused, nothing kept */
	static const char *const hostile[] = {
	    "../x", "/etc/passwd", "", "a//b", "a/./b", "x/..", "a/", "..", "a/../../.git/hooks/pre-commit"};
	for (size_t i = 0; i < sizeof(hostile) / sizeof(hostile[0]); i++)
		assert_int_equal(wb_forkset_note(s, hostile[i], S_IFREG | 0644), -EBADMSG);
	longp = mem_alloc(MANIFEST_PATH_MAX + 2);
	memset(longp, 'a', MANIFEST_PATH_MAX + 1);
	for (size_t i = 100; i < MANIFEST_PATH_MAX; i += 100)
		longp[i] = '/';
	longp[MANIFEST_PATH_MAX + 1] = '\0';
	assert_int_equal(wb_forkset_note(s, longp, S_IFREG | 0644), -EBADMSG);
	mem_free(longp);
	/* the last state reported wins; directories and special files are left out */
	assert_int_equal(wb_forkset_note(s, "src/b.c", S_IFREG | 0644), 0);
	assert_int_equal(wb_forkset_note(s, "src", S_IFDIR | 0755), 0);
	assert_int_equal(wb_forkset_note(s, "old.txt", 0), 0);
	assert_int_equal(wb_forkset_note(s, "src/a.c", 0), 0);
	assert_int_equal(wb_forkset_note(s, "src/a.c", S_IFREG | 0644), 0);
	assert_int_equal(wb_forkset_note(s, "src/b.c", 0), 0);
	assert_int_equal(wb_forkset_note(s, "fifo", S_IFIFO | 0644), 0);
	assert_int_equal(wb_forkset_note(s, "ln", S_IFLNK | 0777), 0);
	assert_int_equal(wb_forkset_note(s, ".git/hooks/pre-commit", S_IFREG | 0755), 0); /* review's business */
	buf_init(&out, 4096);
	assert_int_equal(wb_forkset_list(s, list_into, &out, err, sizeof(err)), 0);
	assert_int_equal(buf_put(&out, "", 1), 0);
	assert_string_equal((const char *)buf_ptr(&out), "+.git/hooks/pre-commit;+ln;-old.txt;+src/a.c;-src/b.c;");
	/* listed twice: the same */
	buf_reset(&out);
	assert_int_equal(wb_forkset_list(s, list_into, &out, err, sizeof(err)), 0);
	assert_int_equal(buf_put(&out, "", 1), 0);
	assert_string_equal((const char *)buf_ptr(&out), "+.git/hooks/pre-commit;+ln;-old.txt;+src/a.c;-src/b.c;");
	buf_clear(&out);
	wb_forkset_free(s);

	/* bounded: one path reported again and again is kept once ... */
	assert_int_equal(wb_forkset_new(&s), 0);
	for (unsigned i = 0; i < WB_FORKSET_MAX + 10; i++)
		assert_int_equal(wb_forkset_note(s, "again", S_IFREG | 0644), 0);
	/* ... but more distinct paths than the bound make the set incomplete, and it says so */
	char name[32];
	int r = 0;
	for (unsigned i = 0; i < WB_FORKSET_MAX && r == 0; i++) {
		snprintf(name, sizeof(name), "f%u", i);
		r = wb_forkset_note(s, name, S_IFREG | 0644);
	}
	assert_int_equal(r, -E2BIG);
	assert_int_equal(wb_forkset_note(s, "late", S_IFREG | 0644), -E2BIG);
	buf_init(&out, 64);
	assert_int_equal(wb_forkset_list(s, list_into, &out, err, sizeof(err)), -E2BIG);
	assert_non_null(strstr(err, "more changed paths"));
	buf_clear(&out);
	wb_forkset_free(s);
	wb_forkset_free(NULL);
}

/* ---- a replay archive ---- */

/* One ustar header at h: its name, type, size; the checksum checked. */
static void tar_hdr(const uint8_t *h, const char *name, char type, uint64_t size)
{
	unsigned sum = 0, want = 0;
	for (size_t i = 0; i < 512; i++)
		sum += i >= 148 && i < 156 ? ' ' : h[i];
	sscanf((const char *)h + 148, "%o", &want);
	assert_int_equal(sum, want);
	assert_string_equal((const char *)h, name);
	assert_int_equal(h[156], type);
	assert_int_equal(strtoull((const char *)h + 124, NULL, 8), size);
	assert_memory_equal(h + 257, "ustar", 6);
}

static void test_replay(void **state)
{
	char dir[256], longp[400], path[600], cmd[1200], err[512] = "";
	const char *paths[5] = {"a.txt", "d", "d/link", "gone", longp};
	struct frames f = {0};
	(void)state;

	tu_tmpdir(dir, sizeof(dir), "wb-replay");
	/* a path longer than ustar's name field */
	snprintf(longp, sizeof(longp), "deep/%0150d/%0150d/x.sh", 0, 1);
	item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 04755, "hello", 5, NULL); /* no set-id bit comes out */
	buf_put(frame(&f, WIRE_CHG_DATA), "hello", 5);
	item(frame(&f, WIRE_CHG_FILE), "d", S_IFDIR | 0750, NULL, 0, NULL);
	item(frame(&f, WIRE_CHG_FILE), "d/link", S_IFLNK | 0777, NULL, 0, "../a.txt");
	item(frame(&f, WIRE_CHG_FILE), "gone", 0, NULL, 0, NULL);
	item(frame(&f, WIRE_CHG_FILE), longp, S_IFREG | 0700, "#!/bin/sh\n", 10, NULL);
	buf_put(frame(&f, WIRE_CHG_DATA), "#!/bin/sh\n", 10);
	end(&f);
	struct wb_pull_cfg cfg = {.paths = paths,
				  .n = 5,
				  .max_bytes = 1 << 20,
				  .cap_name = "workspace.writeback_max_mib",
				  .chunking = &chunk_params_default};
	struct wb_pull *p;
	struct wb_replay *r;
	size_t nf = 0, nd = 0;
	int rc = 0;
	cfg.tmp_dirfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_int_equal(wb_pull_new(&cfg, &p), 0);
	for (size_t i = 0; i < f.n && rc == 0; i++)
		rc = wb_pull_frame(p, f.type[i], buf_ptr(&f.b[i]), buf_len(&f.b[i]));
	assert_int_equal(rc, 1);
	snprintf(path, sizeof(path), "%s/a.tar", dir);
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(wb_replay_new(fd, &r), 0);
	assert_int_equal(wb_replay_add(r, p, err, sizeof(err)), 0);
	assert_int_equal(wb_replay_finish(r, &nf, &nd), 0);
	assert_int_equal(nf, 3);
	assert_int_equal(nd, 1);
	wb_replay_free(r);
	wb_pull_free(p);

	/* its layout, block by block */
	off_t size = lseek(fd, 0, SEEK_END);
	assert_int_equal(size % 512, 0);
	uint8_t *t = mem_alloc((size_t)size);
	assert_int_equal(pread(fd, t, (size_t)size, 0), size);
	size_t o = 0;
	tar_hdr(t + o, "files/a.txt", '0', 5);
	assert_int_equal(strtoul((const char *)t + o + 100, NULL, 8), 0755);
	assert_memory_equal(t + o + 512, "hello", 5);
	o += 1024;
	tar_hdr(t + o, "files/d/link", '2', 0);
	assert_string_equal((const char *)t + o + 157, "../a.txt");
	o += 512;
	char rec[400];
	int reclen = snprintf(rec, sizeof(rec), "path=files/%s\n", longp);
	int total = reclen + 1 + (int)snprintf(NULL, 0, "%d", reclen + 4); /* "NNN " */
	tar_hdr(t + o, "PaxHeader", 'x', (uint64_t)total);
	assert_int_equal(strtol((const char *)t + o + 512, NULL, 10), total);
	assert_non_null(memmem(t + o + 512, (size_t)total, rec, (size_t)reclen));
	o += 512 + ((size_t)total + 511) / 512 * 512;
	tar_hdr(t + o, "PaxHeader/name", '0', 10);
	o += 1024;
	size_t listlen = strlen("a.txt") + strlen("d/link") + strlen(longp) + 3;
	tar_hdr(t + o, "files.list", '0', listlen);
	assert_memory_equal(t + o + 512, "a.txt\0d/link\0", 13);
	o += 512 + (listlen + 511) / 512 * 512;
	tar_hdr(t + o, "deleted", '0', 5);
	assert_memory_equal(t + o + 512, "gone", 5);
	o += 1024;
	assert_int_equal((size_t)size, o + 1024);
	for (size_t i = o; i < (size_t)size; i++)
		assert_int_equal(t[i], 0);
	mem_free(t);
	close(fd);

	/* and a tar program reads it as meant */
	snprintf(cmd, sizeof(cmd), "mkdir %s/x && tar -x -m -o -f %s -C %s/x", dir, path, dir);
	assert_int_equal(system(cmd), 0);
	char got[64] = "";
	struct stat st;
	snprintf(path, sizeof(path), "%s/x/files/a.txt", dir);
	assert_int_equal(lstat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0755);
	snprintf(path, sizeof(path), "%s/x/files/d/link", dir);
	assert_int_equal(readlink(path, got, sizeof(got) - 1), 8);
	assert_string_equal(got, "../a.txt");
	snprintf(path, sizeof(path), "%s/x/files/%s", dir, longp);
	assert_int_equal(lstat(path, &st), 0);
	assert_int_equal(st.st_size, 10);

	/* a path the pull refused (bytes that do not match their hash) is not archived: the replay fails, naming it */
	frames_clear(&f);
	item(frame(&f, WIRE_CHG_FILE), "a.txt", S_IFREG | 0644, "hello", 5, NULL);
	buf_put(frame(&f, WIRE_CHG_DATA), "HELLO", 5);
	item(frame(&f, WIRE_CHG_FILE), "d", S_IFDIR | 0750, NULL, 0, NULL);
	item(frame(&f, WIRE_CHG_FILE), "d/link", S_IFLNK | 0777, NULL, 0, "../a.txt");
	item(frame(&f, WIRE_CHG_FILE), "gone", 0, NULL, 0, NULL);
	item(frame(&f, WIRE_CHG_FILE), longp, 0, NULL, 0, NULL);
	end(&f);
	assert_int_equal(wb_pull_new(&cfg, &p), 0);
	rc = 0;
	for (size_t i = 0; i < f.n && rc == 0; i++)
		rc = wb_pull_frame(p, f.type[i], buf_ptr(&f.b[i]), buf_len(&f.b[i]));
	assert_int_equal(rc, 1);
	fd = open(dir, O_TMPFILE | O_RDWR, 0600);
	assert_true(fd >= 0);
	assert_int_equal(wb_replay_new(fd, &r), 0);
	assert_int_equal(wb_replay_add(r, p, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "a.txt: its bytes do not match"));
	wb_replay_free(r);
	wb_pull_free(p);
	close(fd);
	frames_clear(&f);
	close(cfg.tmp_dirfd);
	tu_rm_rf(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_store),	 cmocka_unit_test(test_pull_good),
	    cmocka_unit_test(test_pull_crafted), cmocka_unit_test(test_pull_no_follow),
	    cmocka_unit_test(test_forkset),	 cmocka_unit_test(test_replay),
	};
	if (sodium_init() < 0)
		return 1;
	crypto_sign_keypair(pk, sk);
	randombytes_buf(scope, sizeof(scope));
	return cmocka_run_group_tests(tests, NULL, NULL);
}
