/* SPDX-License-Identifier: Apache-2.0 */
/* manifest: paths (checks, order), the encoding (round trip, refusals),
 * the scanner on a real tree, diff and the level-by-level reconcile. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/content/chunk.h"
#include "airlock/content/manifest.h"
#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

static const struct chunk_params small = {.min = 256, .avg = 1024, .max = 4096, .whole_max = 2048};

/* ---- helpers ---- */

static struct manifest_entry ent(const char *path, uint8_t type, uint32_t mode, uint64_t size, uint8_t hbyte,
				 const char *target)
{
	struct manifest_entry e = {.path = (char *)path, .type = type, .mode = mode, .size = size};
	memset(e.hash, hbyte, sizeof(e.hash));
	e.target = (char *)target;
	return e;
}

static struct manifest *sample_manifest(void)
{
	struct manifest *m;
	assert_int_equal(manifest_new(&small, &m), 0);
	struct manifest_entry es[] = {
	    ent("src/main.c", MANIFEST_FILE, 0644, 120, 1, NULL),
	    ent("src", MANIFEST_DIR, 0755, 0, 0, NULL),
	    ent("a!", MANIFEST_FILE, 0600, 0, 2, NULL),
	    ent("a", MANIFEST_DIR, 0700, 0, 0, NULL),
	    ent("a/b", MANIFEST_FILE, 0755, 9, 3, NULL),
	    ent("link", MANIFEST_SYMLINK, 0, 0, 0, "../outside/x"),
	    ent("src/sub", MANIFEST_DIR, 0750, 0, 0, NULL),
	    ent("src/sub/deep.txt", MANIFEST_FILE, 0444, 5, 4, NULL),
	};
	for (size_t i = 0; i < sizeof(es) / sizeof(es[0]); i++)
		assert_int_equal(manifest_add(m, &es[i]), 0);
	/* a chunked file */
	struct chunk ch[3] = {{0, 1000, {7}}, {1000, 2000, {8}}, {3000, 5, {9}}};
	struct manifest_entry big = ent("src/big.bin", MANIFEST_FILE, 0644, 3005, 5, NULL);
	big.chunks = ch;
	big.nchunks = 3;
	assert_int_equal(manifest_add(m, &big), 0);
	assert_int_equal(manifest_seal(m), 0);
	return m;
}

static void encode(const struct manifest *m, struct buf *b)
{
	buf_init(b, 64u << 20);
	assert_int_equal(manifest_encode(m, b), 0);
}

/* ---- paths ---- */

static void test_path_check(void **state)
{
	(void)state;
	char longc[300], longp[5000];
	memset(longc, 'x', sizeof(longc));
	longc[256] = '\0'; /* 256-byte component */
	for (size_t i = 0; i < sizeof(longp) - 1; i++)
		longp[i] = i % 100 == 99 ? '/' : 'y';
	longp[4097] = '\0'; /* 4097 bytes, components of 99 */
	static const struct {
		const char *p;
		int want;
	} cases[] = {
	    {"a", 0},
	    {"a/b/c.txt", 0},
	    {".hidden/..dots/...", 0},
	    {"a b/ü/\x01", 0},
	    {"", -EINVAL},
	    {"/abs", -EINVAL},
	    {"a/", -EINVAL},
	    {"a//b", -EINVAL},
	    {".", -EINVAL},
	    {"..", -EINVAL},
	    {"../x", -EINVAL},
	    {"a/../../x", -EINVAL},
	    {"a/./b", -EINVAL},
	    {"x/..", -EINVAL},
	    {".airlock-tmp-1234", -EINVAL},
	    {"d/.airlock-tmp-x/y", -EINVAL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_int_equal(manifest_path_check(cases[i].p, strlen(cases[i].p)), cases[i].want);
	assert_int_equal(manifest_path_check("a\0b", 3), -EINVAL);
	assert_int_equal(manifest_path_check(longc, strlen(longc)), -ENAMETOOLONG);
	longc[255] = '\0';
	assert_int_equal(manifest_path_check(longc, strlen(longc)), 0);
	assert_int_equal(manifest_path_check(longp, strlen(longp)), -ENAMETOOLONG);
	longp[4096] = '\0';
	if (longp[4095] == '/')
		longp[4095] = 'z';
	assert_int_equal(manifest_path_check(longp, strlen(longp)), 0);
}

static void test_path_order(void **state)
{
	(void)state;
	/* tree order: each directory right before its subtree */
	static const char *const sorted[] = {"a", "a/b", "a/b/c", "a/b.txt", "a!", "a0", "b"};
	for (size_t i = 0; i + 1 < sizeof(sorted) / sizeof(sorted[0]); i++) {
		assert_true(manifest_path_cmp(sorted[i], sorted[i + 1]) < 0);
		assert_true(manifest_path_cmp(sorted[i + 1], sorted[i]) > 0);
	}
	assert_int_equal(manifest_path_cmp("a/b", "a/b"), 0);
	assert_true(manifest_path_cmp("a/\x01", "a!") < 0);
}

/* ---- manifest encoding ---- */

static void test_manifest_roundtrip(void **state)
{
	(void)state;
	struct manifest *m = sample_manifest(), *d;
	struct buf a, b, c;

	/* sorted in tree order, parents first */
	assert_string_equal(m->e[0].path, "a");
	assert_string_equal(m->e[1].path, "a/b");
	assert_string_equal(m->e[2].path, "a!");
	assert_int_equal(m->e[manifest_find(m, "link")].size, strlen("../outside/x"));
	encode(m, &a);
	encode(m, &b);
	assert_int_equal(buf_len(&a), buf_len(&b));
	assert_memory_equal(buf_ptr(&a), buf_ptr(&b), buf_len(&a));
	assert_int_equal(manifest_decode(buf_ptr(&a), buf_len(&a), 0, &d), 0);
	encode(d, &c);
	assert_int_equal(buf_len(&a), buf_len(&c));
	assert_memory_equal(buf_ptr(&a), buf_ptr(&c), buf_len(&a));
	assert_memory_equal(m->root, d->root, CHUNK_HASH_LEN);
	long i = manifest_find(d, "src/big.bin");
	assert_true(i >= 0);
	assert_int_equal(d->e[i].nchunks, 3);
	assert_int_equal(d->e[i].chunks[2].off, 3000);
	assert_int_equal(manifest_find(d, "nope"), -1);

	/* every truncation and every single-bit flip is refused or decodes to
	 * something that encodes back to exactly those bytes */
	for (size_t n = 0; n < buf_len(&a); n++) {
		struct manifest *x = NULL;
		assert_int_not_equal(manifest_decode(buf_ptr(&a), n, 0, &x), 0);
	}
	uint8_t *flip = malloc(buf_len(&a));
	assert_non_null(flip);
	for (size_t bit = 0; bit < buf_len(&a) * 8; bit++) {
		memcpy(flip, buf_ptr(&a), buf_len(&a));
		flip[bit / 8] ^= (uint8_t)(1u << (bit % 8));
		struct manifest *x = NULL;
		if (manifest_decode(flip, buf_len(&a), 0, &x) == 0) {
			struct buf y;
			encode(x, &y);
			assert_int_equal(buf_len(&y), buf_len(&a));
			assert_memory_equal(buf_ptr(&y), flip, buf_len(&a));
			buf_clear(&y);
			manifest_free(x);
		}
	}
	free(flip);
	/* a smaller entry cap is checked before allocating */
	struct manifest *capped = NULL;
	assert_int_equal(manifest_decode(buf_ptr(&a), buf_len(&a), 3, &capped), -E2BIG);
	assert_null(capped);
	buf_clear(&a);
	buf_clear(&b);
	buf_clear(&c);
	manifest_free(m);
	manifest_free(d);
}

/* Encode entries in the order given, with a zero root digest. */
static void raw_manifest(struct buf *b, const struct manifest_entry *es, size_t n)
{
	static const uint8_t zero[CHUNK_HASH_LEN];
	buf_init(b, 1 << 20);
	assert_int_equal(buf_put(b, "ALMF", 4), 0);
	assert_int_equal(buf_put_u8(b, 1), 0);
	assert_int_equal(buf_put_u8(b, 0), 0);
	assert_int_equal(buf_put_u16(b, 0), 0);
	assert_int_equal(buf_put_u32(b, small.min), 0);
	assert_int_equal(buf_put_u32(b, small.avg), 0);
	assert_int_equal(buf_put_u32(b, small.max), 0);
	assert_int_equal(buf_put_u32(b, small.whole_max), 0);
	assert_int_equal(buf_put_u32(b, (uint32_t)n), 0);
	for (size_t i = 0; i < n; i++)
		assert_int_equal(manifest_entry_encode(&es[i], b), 0);
	assert_int_equal(buf_put(b, zero, sizeof(zero)), 0);
}

static void test_manifest_decode_rejects(void **state)
{
	(void)state;
	struct manifest_entry f = ent("f", MANIFEST_FILE, 0644, 1, 1, NULL);
	struct manifest_entry g = ent("g", MANIFEST_FILE, 0644, 1, 1, NULL);
	struct manifest_entry orphan = ent("d/x", MANIFEST_FILE, 0644, 1, 1, NULL);
	struct manifest_entry suid = ent("s", MANIFEST_FILE, 04755, 1, 1, NULL);
	struct manifest_entry fifo = ent("p", MANIFEST_FILE, 010644, 1, 1, NULL);
	struct manifest_entry weird = ent("w", 9, 0644, 1, 1, NULL);
	struct manifest_entry dot = ent("a/../b", MANIFEST_FILE, 0644, 1, 1, NULL);
	struct {
		struct manifest_entry es[2];
		size_t n;
	} cases[] = {
	    {{g, f}, 2},   /* not sorted */
	    {{f, f}, 2},   /* duplicate */
	    {{orphan}, 1}, /* parent missing */
	    {{suid}, 1},   /* setuid bit */
	    {{fifo}, 1},   /* file type bits */
	    {{weird}, 1},  /* unknown type */
	    {{dot}, 1},	   /* traversal */
	    {{f}, 1},	   /* fine, except the root digest is wrong */
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct buf b;
		struct manifest *m = NULL;
		raw_manifest(&b, cases[i].es, cases[i].n);
		assert_int_equal(manifest_decode(buf_ptr(&b), buf_len(&b), 0, &m), -EBADMSG);
		assert_null(m);
		buf_clear(&b);
	}
}

/* A mode is 16 bits in an entry: a wider one from bytes must stay
 * refused, never be cut down to a valid one (0x101a4 -> 0644). */
static void test_wide_mode(void **state)
{
	(void)state;
	struct manifest_entry f = ent("f", MANIFEST_FILE, 0644, 1, 1, NULL), d;
	struct buf b, in;
	_Static_assert(sizeof(struct manifest_entry) == 56, "an entry is 56 bytes");

	buf_init(&b, 1024);
	assert_int_equal(manifest_entry_encode(&f, &b), 0);
	buf_view(&in, buf_ptr(&b), buf_len(&b));
	assert_int_equal(manifest_entry_decode(&in, &small, &d), 0);
	assert_int_equal(d.mode, 0644);
	manifest_entry_clear(&d);
	/* u32 path length, "f", u8 type, then the u32 mode */
	uint8_t *p = (uint8_t *)buf_ptr(&b);
	assert_int_equal(p[4 + 1 + 1 + 2], 0x01);
	p[4 + 1 + 1 + 1] = 0x01;
	buf_view(&in, buf_ptr(&b), buf_len(&b));
	assert_int_equal(manifest_entry_decode(&in, &small, &d), -EBADMSG);
	assert_null(d.path);
	buf_clear(&b);

	/* a level's record: read, with a mode no check accepts */
	struct manifest_level_reader lr;
	uint8_t hash[CHUNK_HASH_LEN] = {0};
	buf_init(&b, 1024);
	assert_int_equal(buf_put_u32(&b, 1), 0);
	assert_int_equal(buf_put_str(&b, "x"), 0);
	assert_int_equal(buf_put_u8(&b, MANIFEST_FILE), 0);
	assert_int_equal(buf_put_u32(&b, 0x101a4), 0);
	assert_int_equal(buf_put_u64(&b, 0), 0);
	assert_int_equal(buf_put(&b, hash, sizeof(hash)), 0);
	assert_int_equal(manifest_level_open(&lr, "", buf_ptr(&b), buf_len(&b)), 0);
	assert_int_equal(manifest_level_next(&lr, &d), 1);
	assert_true(d.mode & ~MANIFEST_MODE_MASK);
	buf_clear(&b);
}

/* Sealing gives back what the doubling left unused, and the manifest
 * grows again after it (checked against one built whole). */
static void test_seal_trims(void **state)
{
	(void)state;
	struct manifest *m, *whole;
	char path[32];

	assert_int_equal(manifest_new(NULL, &m), 0);
	assert_int_equal(manifest_new(NULL, &whole), 0);
	/* a small one keeps its slack */
	for (int i = 0; i < 100; i++) {
		snprintf(path, sizeof(path), "f%05d", i);
		struct manifest_entry e = ent(path, MANIFEST_FILE, 0644, 1, (uint8_t)i, NULL);
		assert_int_equal(manifest_add(m, &e), 0);
		assert_int_equal(manifest_add(whole, &e), 0);
	}
	assert_int_equal(manifest_seal(m), 0);
	assert_int_equal(m->cap, 128);
	for (int i = 100; i < 10000; i++) {
		snprintf(path, sizeof(path), "f%05d", i);
		struct manifest_entry e = ent(path, MANIFEST_FILE, 0644, 1, (uint8_t)i, NULL);
		assert_int_equal(manifest_add(m, &e), 0);
		assert_int_equal(manifest_add(whole, &e), 0);
	}
	assert_int_equal(m->cap, 16384);
	assert_int_equal(manifest_seal(m), 0);
	assert_int_equal(m->cap, m->n);
	for (int i = 10000; i < 10100; i++) {
		snprintf(path, sizeof(path), "f%05d", i);
		struct manifest_entry e = ent(path, MANIFEST_FILE, 0600, 2, (uint8_t)i, NULL);
		assert_int_equal(manifest_add(m, &e), 0);
		assert_int_equal(manifest_add(whole, &e), 0);
	}
	assert_int_equal(manifest_seal(m), 0);
	assert_int_equal(manifest_seal(whole), 0);
	assert_int_equal(m->n, 10100);
	assert_memory_equal(m->root, whole->root, CHUNK_HASH_LEN);
	manifest_free(m);
	manifest_free(whole);
}

static void test_manifest_add_rejects(void **state)
{
	(void)state;
	struct manifest *m;
	assert_int_equal(manifest_new(&small, &m), 0);
	struct chunk bad[2] = {{0, 100, {0}}, {100, 5000, {0}}};
	struct manifest_entry cases[] = {
	    ent("/abs", MANIFEST_FILE, 0644, 1, 1, NULL), ent("x", MANIFEST_FILE, 02644, 1, 1, NULL),
	    ent("x", MANIFEST_DIR, 0755, 10, 0, NULL),	  ent("x", MANIFEST_SYMLINK, 0777, 0, 0, "t"),
	    ent("x", MANIFEST_SYMLINK, 0, 0, 0, ""),	  ent("x", MANIFEST_FILE, 0644, 5100, 1, NULL),
	};
	cases[5].chunks = bad;
	cases[5].nchunks = 2;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++)
		assert_int_not_equal(manifest_add(m, &cases[i]), 0);
	assert_int_equal(m->n, 0);
	/* duplicate and orphan are found when sealing */
	struct manifest_entry f = ent("f", MANIFEST_FILE, 0644, 1, 1, NULL);
	assert_int_equal(manifest_add(m, &f), 0);
	assert_int_equal(manifest_add(m, &f), 0);
	assert_int_equal(manifest_seal(m), -EEXIST);
	manifest_free(m);
	assert_int_equal(manifest_new(&small, &m), 0);
	struct manifest_entry o = ent("f/g", MANIFEST_FILE, 0644, 1, 1, NULL);
	assert_int_equal(manifest_add(m, &f), 0);
	assert_int_equal(manifest_add(m, &o), 0);
	assert_int_equal(manifest_seal(m), -ENOENT); /* parent is a file */
	manifest_free(m);
}

/* ---- scanner ---- */

struct skips {
	char paths[16][256];
	int why[16];
	size_t n;
};

static void on_skip(const char *p, enum manifest_skip why, int err, void *ud)
{
	(void)err;
	struct skips *s = ud;
	if (s->n < 16) {
		snprintf(s->paths[s->n], sizeof(s->paths[0]), "%s", p);
		s->why[s->n++] = why;
	}
}

static int skip_why(const struct skips *s, const char *p)
{
	for (size_t i = 0; i < s->n; i++)
		if (strcmp(s->paths[i], p) == 0)
			return s->why[i];
	return 0;
}

static char tmp_root[64];

static int make_tree(void)
{
	tu_tmpdir(tmp_root, sizeof(tmp_root), "manifest");
	int d = open(tmp_root, O_RDONLY | O_DIRECTORY);
	assert_true(d >= 0);
	return d;
}

struct seen {
	size_t stats, done;
	bool after_done;
};

static void on_seen(const char *relpath, const struct stat *st, enum manifest_seen kind, void *ud)
{
	struct seen *sn = ud;
	if (sn->done)
		sn->after_done = true;
	if (kind == MANIFEST_SEEN_DONE) {
		assert_string_equal(relpath, "");
		assert_null(st);
		sn->done++;
	} else if (kind == MANIFEST_SEEN_STAT) {
		assert_non_null(st);
		sn->stats++;
	}
}

static void test_scan(void **state)
{
	(void)state;
	int d = make_tree();
	uint8_t big[10000];
	tu_fill(big, sizeof(big), 9);
	assert_int_equal(mkdirat(d, "src", 0755), 0);
	assert_int_equal(mkdirat(d, "src/empty", 0700), 0);
	tu_put_file(d, "src/a.c", "int x;\n", 7, 0644);
	tu_put_file(d, "src/big.bin", big, sizeof(big), 0600);
	tu_put_file(d, "run.sh", "#!/bin/sh\n", 10, 04755); /* setuid dropped */
	tu_put_file(d, "empty", "", 0, 0644);
	assert_int_equal(symlinkat("src", d, "srclink"), 0);	 /* to a dir: not followed */
	assert_int_equal(symlinkat("/etc/passwd", d, "abs"), 0); /* absolute target, kept as given */
	assert_int_equal(symlinkat("nowhere", d, "dangling"), 0);
	assert_int_equal(mkfifoat(d, "fifo", 0644), 0);
	bool have_dev = mknodat(d, "dev", S_IFCHR | 0600, makedev(1, 3)) == 0;
	tu_put_file(d, ".airlock-tmp-leftover", "x", 1, 0600);
	int sock = socket(AF_UNIX, SOCK_STREAM, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/sock", tmp_root);
	assert_int_equal(bind(sock, (struct sockaddr *)&sa, sizeof(sa)), 0);

	struct skips sk_ = {0};
	struct seen sn = {0};
	struct manifest_scan_opts o = {
	    .skipped = on_skip, .skipped_ud = &sk_, .chunking = &small, .seen = on_seen, .seen_ud = &sn};
	struct manifest *m;
	assert_int_equal(manifest_scan(d, &o, &m), 0);
	/* told every name, then once that the scan is over, last */
	assert_true(sn.stats >= 10);
	assert_int_equal(sn.done, 1);
	assert_false(sn.after_done);
	static const struct {
		const char *path;
		uint8_t type;
		uint32_t mode;
		uint64_t size;
	} want[] = {
	    {"abs", MANIFEST_SYMLINK, 0, 11},
	    {"dangling", MANIFEST_SYMLINK, 0, 7},
	    {"empty", MANIFEST_FILE, 0644, 0},
	    {"run.sh", MANIFEST_FILE, 0755, 10},
	    {"src", MANIFEST_DIR, 0755, 0},
	    {"src/a.c", MANIFEST_FILE, 0644, 7},
	    {"src/big.bin", MANIFEST_FILE, 0600, 10000},
	    {"src/empty", MANIFEST_DIR, 0700, 0},
	    {"srclink", MANIFEST_SYMLINK, 0, 3},
	};
	assert_int_equal(m->n, sizeof(want) / sizeof(want[0]));
	for (size_t i = 0; i < m->n; i++) {
		assert_string_equal(m->e[i].path, want[i].path);
		assert_int_equal(m->e[i].type, want[i].type);
		assert_int_equal(m->e[i].mode, want[i].mode);
		assert_int_equal(m->e[i].size, want[i].size);
	}
	uint8_t h[CHUNK_HASH_LEN];
	long bi = manifest_find(m, "src/big.bin");
	assert_true(m->e[bi].nchunks > 1);
	chunk_list_hash(m->e[bi].chunks, m->e[bi].nchunks, h);
	assert_memory_equal(m->e[bi].hash, h, CHUNK_HASH_LEN);
	assert_int_equal(chunk_list_check(&small, m->e[bi].chunks, m->e[bi].nchunks, 10000), 0);
	assert_string_equal(m->e[manifest_find(m, "abs")].target, "/etc/passwd");
	assert_int_equal(skip_why(&sk_, "fifo"), MANIFEST_SKIP_SPECIAL);
	assert_int_equal(skip_why(&sk_, "sock"), MANIFEST_SKIP_SPECIAL);
	if (have_dev)
		assert_int_equal(skip_why(&sk_, "dev"), MANIFEST_SKIP_SPECIAL);
	assert_int_equal(skip_why(&sk_, ".airlock-tmp-leftover"), MANIFEST_SKIP_RESERVED);
	assert_int_equal(sk_.n, 3 + have_dev);

	/* scanning twice gives the same bytes */
	struct manifest *m2;
	struct buf a, b;
	assert_int_equal(manifest_scan(d, &o, &m2), 0);
	encode(m, &a);
	encode(m2, &b);
	assert_int_equal(buf_len(&a), buf_len(&b));
	assert_memory_equal(buf_ptr(&a), buf_ptr(&b), buf_len(&a));
	buf_clear(&a);
	buf_clear(&b);
	manifest_free(m2);
	manifest_free(m);

	/* depth limit */
	assert_int_equal(mkdirat(d, "src/empty/l2", 0755), 0);
	sk_.n = 0;
	o.max_depth = 2;
	assert_int_equal(manifest_scan(d, &o, &m), 0);
	assert_int_equal(skip_why(&sk_, "src/empty/l2"), MANIFEST_SKIP_DEPTH);
	assert_true(manifest_find(m, "src/empty") >= 0);
	manifest_free(m);
	/* entry cap */
	o.max_depth = 0;
	o.max_entries = 3;
	assert_int_equal(manifest_scan(d, &o, &m), -E2BIG);
	close(sock);
	close(d);
	tu_rm_rf(tmp_root);
}

static int filter_c_only(const char *p, bool is_dir, void *ud)
{
	(void)ud;
	if (strcmp(p, "node_modules") == 0)
		return MANIFEST_SKIP;
	if (is_dir)
		return MANIFEST_DESCEND;
	size_t n = strlen(p);
	return n > 2 && strcmp(p + n - 2, ".c") == 0 ? MANIFEST_KEEP : MANIFEST_SKIP;
}

static void test_scan_filter(void **state)
{
	(void)state;
	int d = make_tree();
	assert_int_equal(mkdirat(d, "node_modules", 0755), 0);
	tu_put_file(d, "node_modules/x.c", "x", 1, 0644);
	assert_int_equal(mkdirat(d, "docs", 0755), 0);
	tu_put_file(d, "docs/readme.md", "r", 1, 0644);
	assert_int_equal(mkdirat(d, "lib", 0755), 0);
	assert_int_equal(mkdirat(d, "lib/deep", 0755), 0);
	tu_put_file(d, "lib/deep/y.c", "y", 1, 0644);
	tu_put_file(d, "top.c", "t", 1, 0644);
	struct manifest_scan_opts o = {.filter = filter_c_only};
	struct manifest *m;
	assert_int_equal(manifest_scan(d, &o, &m), 0);
	static const char *const want[] = {"lib", "lib/deep", "lib/deep/y.c", "top.c"};
	assert_int_equal(m->n, 4);
	for (size_t i = 0; i < 4; i++)
		assert_string_equal(m->e[i].path, want[i]);
	manifest_free(m);
	close(d);
	tu_rm_rf(tmp_root);
}

/* ---- diff and reconcile ---- */

static void test_diff(void **state)
{
	(void)state;
	struct manifest *a, *b;
	assert_int_equal(manifest_new(&small, &a), 0);
	assert_int_equal(manifest_new(&small, &b), 0);
	struct manifest_entry common[] = {
	    ent("keep", MANIFEST_DIR, 0755, 0, 0, NULL),
	    ent("keep/same.txt", MANIFEST_FILE, 0644, 3, 1, NULL),
	};
	struct manifest_entry only_a[] = {
	    ent("gone", MANIFEST_DIR, 0755, 0, 0, NULL),     ent("gone/f", MANIFEST_FILE, 0644, 1, 2, NULL),
	    ent("gone/sub", MANIFEST_DIR, 0755, 0, 0, NULL), ent("gone/sub/g", MANIFEST_FILE, 0644, 1, 3, NULL),
	    ent("chg", MANIFEST_FILE, 0644, 5, 4, NULL),     ent("mode", MANIFEST_FILE, 0644, 5, 5, NULL),
	    ent("d2f", MANIFEST_DIR, 0755, 0, 0, NULL),	     ent("d2f/inner", MANIFEST_FILE, 0644, 1, 6, NULL),
	    ent("f2d", MANIFEST_FILE, 0644, 1, 7, NULL),     ent("ln", MANIFEST_SYMLINK, 0, 0, 0, "old"),
	    ent("dmode", MANIFEST_DIR, 0755, 0, 0, NULL),
	};
	struct manifest_entry only_b[] = {
	    ent("new", MANIFEST_DIR, 0750, 0, 0, NULL),	    ent("new/n", MANIFEST_FILE, 0600, 2, 8, NULL),
	    ent("chg", MANIFEST_FILE, 0644, 6, 9, NULL),    ent("mode", MANIFEST_FILE, 0755, 5, 5, NULL),
	    ent("d2f", MANIFEST_FILE, 0644, 1, 10, NULL),   ent("f2d", MANIFEST_DIR, 0755, 0, 0, NULL),
	    ent("f2d/x", MANIFEST_FILE, 0644, 1, 11, NULL), ent("ln", MANIFEST_SYMLINK, 0, 0, 0, "new"),
	    ent("dmode", MANIFEST_DIR, 0700, 0, 0, NULL),
	};
	for (size_t i = 0; i < 2; i++) {
		assert_int_equal(manifest_add(a, &common[i]), 0);
		assert_int_equal(manifest_add(b, &common[i]), 0);
	}
	for (size_t i = 0; i < sizeof(only_a) / sizeof(only_a[0]); i++)
		assert_int_equal(manifest_add(a, &only_a[i]), 0);
	for (size_t i = 0; i < sizeof(only_b) / sizeof(only_b[0]); i++)
		assert_int_equal(manifest_add(b, &only_b[i]), 0);
	assert_int_equal(manifest_seal(a), 0);
	assert_int_equal(manifest_seal(b), 0);

	struct manifest_change *c;
	size_t n;
	assert_int_equal(manifest_diff(a, b, &c, &n), 0);
	static const struct {
		uint8_t kind;
		const char *path;
	} want[] = {
	    /* removals, children before parents */
	    {MANIFEST_REMOVE, "gone/sub/g"},
	    {MANIFEST_REMOVE, "gone/sub"},
	    {MANIFEST_REMOVE, "gone/f"},
	    {MANIFEST_REMOVE, "gone"},
	    {MANIFEST_REMOVE, "f2d"},
	    {MANIFEST_REMOVE, "d2f/inner"},
	    {MANIFEST_REMOVE, "d2f"},
	    /* then additions and changes, parents before children */
	    {MANIFEST_MODIFY, "chg"},
	    {MANIFEST_ADD, "d2f"},
	    {MANIFEST_MODE, "dmode"},
	    {MANIFEST_ADD, "f2d"},
	    {MANIFEST_ADD, "f2d/x"},
	    {MANIFEST_MODIFY, "ln"},
	    {MANIFEST_MODE, "mode"},
	    {MANIFEST_ADD, "new"},
	    {MANIFEST_ADD, "new/n"},
	};
	assert_int_equal(n, sizeof(want) / sizeof(want[0]));
	for (size_t i = 0; i < n; i++) {
		const struct manifest_entry *e = c[i].new ? c[i].new : c[i].old;
		if (c[i].kind == MANIFEST_REMOVE)
			e = c[i].old;
		assert_int_equal(c[i].kind, want[i].kind);
		assert_string_equal(e->path, want[i].path);
	}
	/* a type change names both sides */
	assert_non_null(c[6].new);
	assert_non_null(c[8].old);
	mem_free(c);
	/* identical manifests: nothing */
	assert_int_equal(manifest_diff(a, a, &c, &n), 0);
	assert_int_equal(n, 0);
	mem_free(c);
	manifest_free(a);
	manifest_free(b);
}

/* A synthetic tree: 40 top dirs x 25 subdirs x 20 files = 20000 files. */
static struct manifest *big_tree(void)
{
	struct manifest *m;
	char p[64];
	assert_int_equal(manifest_new(&small, &m), 0);
	for (int i = 0; i < 40; i++) {
		snprintf(p, sizeof(p), "d%02d", i);
		struct manifest_entry e = ent(p, MANIFEST_DIR, 0755, 0, 0, NULL);
		assert_int_equal(manifest_add(m, &e), 0);
		for (int j = 0; j < 25; j++) {
			snprintf(p, sizeof(p), "d%02d/s%02d", i, j);
			e = ent(p, MANIFEST_DIR, 0755, 0, 0, NULL);
			assert_int_equal(manifest_add(m, &e), 0);
			for (int k = 0; k < 20; k++) {
				snprintf(p, sizeof(p), "d%02d/s%02d/f%02d.c", i, j, k);
				e = ent(p, MANIFEST_FILE, 0644, (uint64_t)(i * 1000 + j * 20 + k), (uint8_t)k, NULL);
				assert_int_equal(manifest_add(m, &e), 0);
			}
		}
	}
	assert_int_equal(manifest_seal(m), 0);
	return m;
}

/* Drive the exchange between `asker` and `answerer`; return the levels
 * asked for and the reconstruction. */
static size_t reconcile(const struct manifest *asker, const struct manifest *answerer, struct manifest **peer)
{
	struct manifest_recon *r;
	const char *const *dirs;
	size_t k, levels = 0;
	assert_int_equal(manifest_recon_new(asker, answerer->root, 0, &r), 0);
	while ((k = manifest_recon_next(r, &dirs)) > 0) {
		for (size_t i = 0; i < k; i++) {
			struct buf lv;
			buf_init(&lv, 1 << 20);
			assert_int_equal(manifest_level_encode(answerer, dirs[i], &lv), 0);
			assert_int_equal(manifest_recon_feed(r, dirs[i], buf_ptr(&lv), buf_len(&lv)), 0);
			buf_clear(&lv);
			levels++;
		}
	}
	assert_int_equal(manifest_recon_finish(r, peer), 0);
	manifest_recon_free(r);
	return levels;
}

/* manifest_level_open/_next: what manifest_level_encode wrote reads back
 * child by child, joined to the directory; a malformed level is refused. */
static void test_level_reader(void **state)
{
	(void)state;
	static const struct {
		const char *path;
		uint8_t type;
	} ents[] = {{"d", MANIFEST_DIR},     {"d/a", MANIFEST_FILE},	 {"d/a-b", MANIFEST_FILE},
		    {"d/sub", MANIFEST_DIR}, {"d/sub/x", MANIFEST_FILE}, {"top", MANIFEST_FILE}};
	struct manifest *m;
	struct manifest_level_reader lr;
	struct manifest_entry e;
	struct buf lv;

	assert_int_equal(manifest_new(NULL, &m), 0);
	for (size_t i = 0; i < sizeof(ents) / sizeof(ents[0]); i++) {
		struct manifest_entry a = {.path = (char *)ents[i].path, .type = ents[i].type, .mode = 0644};
		if (a.type == MANIFEST_FILE)
			chunk_hash(NULL, 0, a.hash);
		else
			a.mode = 0755;
		assert_int_equal(manifest_add(m, &a), 0);
	}
	assert_int_equal(manifest_seal(m), 0);
	buf_init(&lv, 1 << 16);
	assert_int_equal(manifest_level_encode(m, "d", &lv), 0);

	static const char *const want[] = {"d/a", "d/a-b", "d/sub"};
	assert_int_equal(manifest_level_open(&lr, "d", buf_ptr(&lv), buf_len(&lv)), 0);
	assert_int_equal(lr.count, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(manifest_level_next(&lr, &e), 1);
		assert_string_equal(e.path, want[i]);
		assert_int_equal(e.type, i == 2 ? MANIFEST_DIR : MANIFEST_FILE);
	}
	assert_int_equal(manifest_level_next(&lr, &e), 0);

	/* the root's level joins without a slash */
	buf_reset(&lv);
	assert_int_equal(manifest_level_encode(m, "", &lv), 0);
	assert_int_equal(manifest_level_open(&lr, "", buf_ptr(&lv), buf_len(&lv)), 0);
	assert_int_equal(manifest_level_next(&lr, &e), 1);
	assert_string_equal(e.path, "d");

	/* one trailing byte; a count the bytes cannot hold; a cut record */
	buf_reset(&lv);
	assert_int_equal(manifest_level_encode(m, "d", &lv), 0);
	assert_int_equal(buf_put_u8(&lv, 0), 0);
	assert_int_equal(manifest_level_open(&lr, "d", buf_ptr(&lv), buf_len(&lv)), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(manifest_level_next(&lr, &e), 1);
	assert_int_equal(manifest_level_next(&lr, &e), -EBADMSG);
	assert_int_equal(manifest_level_open(&lr, "d", (const uint8_t *)"\0\0\0\x09", 4), -EBADMSG);
	assert_int_equal(manifest_level_open(&lr, "d", buf_ptr(&lv), buf_len(&lv) - 5), 0); /* the last record cut */
	int r;
	while ((r = manifest_level_next(&lr, &e)) == 1)
		;
	assert_int_equal(r, -EBADMSG);

	/* the same name twice, or out of order: refused */
	struct buf bad;
	uint8_t hash[CHUNK_HASH_LEN] = {0};
	for (int order = 0; order < 2; order++) {
		buf_init(&bad, 1024);
		assert_int_equal(buf_put_u32(&bad, 2), 0);
		for (int k = 0; k < 2; k++) {
			assert_int_equal(buf_put_str(&bad, order == 0 ? "same" : k == 0 ? "zz" : "aa"), 0);
			assert_int_equal(buf_put_u8(&bad, MANIFEST_FILE), 0);
			assert_int_equal(buf_put_u32(&bad, 0644), 0);
			assert_int_equal(buf_put_u64(&bad, 0), 0);
			assert_int_equal(buf_put(&bad, hash, sizeof(hash)), 0);
		}
		assert_int_equal(manifest_level_open(&lr, "", buf_ptr(&bad), buf_len(&bad)), 0);
		assert_int_equal(manifest_level_next(&lr, &e), 1);
		assert_int_equal(manifest_level_next(&lr, &e), -EBADMSG);
		buf_clear(&bad);
	}
	/* a name with a slash or "..": refused */
	static const char *const names[] = {"a/b", "..", ""};
	for (size_t k = 0; k < 3; k++) {
		buf_init(&bad, 1024);
		assert_int_equal(buf_put_u32(&bad, 1), 0);
		assert_int_equal(buf_put_str(&bad, names[k]), 0);
		assert_int_equal(buf_put_u8(&bad, MANIFEST_FILE), 0);
		assert_int_equal(buf_put_u32(&bad, 0644), 0);
		assert_int_equal(buf_put_u64(&bad, 0), 0);
		assert_int_equal(buf_put(&bad, hash, sizeof(hash)), 0);
		assert_int_equal(buf_put(&bad, hash, 34 - 4 - 1 - 4 - 8 - sizeof(hash) + 1),
				 0); /* room for the count check */
		assert_int_equal(manifest_level_open(&lr, "", buf_ptr(&bad), buf_len(&bad)), 0);
		assert_int_equal(manifest_level_next(&lr, &e), -EBADMSG);
		buf_clear(&bad);
	}
	buf_clear(&lv);
	manifest_free(m);
}

static void test_tree_reconcile(void **state)
{
	(void)state;
	struct manifest *host = big_tree(), *guest = big_tree(), *peer;
	struct buf a, b;

	/* equal trees: no level at all */
	assert_memory_equal(host->root, guest->root, CHUNK_HASH_LEN);
	assert_int_equal(reconcile(host, guest, &peer), 0);
	assert_int_equal(peer->n, guest->n);
	manifest_free(peer);

	/* change three files in the guest copy, in two directories */
	static const char *const changed[] = {"d03/s07/f05.c", "d03/s07/f06.c", "d31/s00/f19.c"};
	for (size_t i = 0; i < 3; i++)
		guest->e[manifest_find(guest, changed[i])].hash[0] ^= 0xff;
	guest->sealed = false;
	assert_int_equal(manifest_seal(guest), 0);
	size_t levels = reconcile(host, guest, &peer);
	/* root, d03, d03/s07, d31, d31/s00: five of 1041 directories */
	assert_int_equal(levels, 5);
	encode(peer, &a);
	encode(guest, &b);
	assert_int_equal(buf_len(&a), buf_len(&b));
	assert_memory_equal(buf_ptr(&a), buf_ptr(&b), buf_len(&a));
	buf_clear(&a);
	buf_clear(&b);
	/* and the diff of the reconstruction is exactly the changed paths */
	struct manifest_change *c;
	size_t n;
	assert_int_equal(manifest_diff(peer, host, &c, &n), 0);
	assert_int_equal(n, 3);
	for (size_t i = 0; i < 3; i++) {
		assert_int_equal(c[i].kind, MANIFEST_MODIFY);
		assert_string_equal(c[i].new->path, changed[i]);
	}
	mem_free(c);
	manifest_free(peer);

	/* a removed and an added directory */
	struct manifest *g2;
	assert_int_equal(manifest_new(&small, &g2), 0);
	for (size_t i = 0; i < guest->n; i++)
		if (strncmp(guest->e[i].path, "d10", 3) != 0)
			assert_int_equal(manifest_add(g2, &guest->e[i]), 0);
	struct manifest_entry nd = ent("zz", MANIFEST_DIR, 0700, 0, 0, NULL);
	assert_int_equal(manifest_add(g2, &nd), 0);
	assert_int_equal(manifest_seal(g2), 0);
	levels = reconcile(host, g2, &peer);
	/* root, the two changed paths' dirs (d03, d03/s07, d31, d31/s00), zz */
	assert_int_equal(levels, 6);
	assert_memory_equal(peer->root, g2->root, CHUNK_HASH_LEN);
	manifest_free(peer);
	manifest_free(g2);
	manifest_free(host);
	manifest_free(guest);
}

static void test_recon_rejects(void **state)
{
	(void)state;
	struct manifest *m = sample_manifest();
	struct manifest_recon *r;
	const char *const *dirs;
	uint8_t other[CHUNK_HASH_LEN] = {1};
	struct buf lv;

	/* not asked for */
	assert_int_equal(manifest_recon_new(m, other, 0, &r), 0);
	assert_int_equal(manifest_recon_feed(r, "src", (const uint8_t *)"\0\0\0\0", 4), -EPROTO);
	size_t k_asked = manifest_recon_next(r, &dirs);
	assert_int_equal(k_asked, 1);
	assert_string_equal(dirs[0], "");
	struct manifest *p;
	assert_int_equal(manifest_recon_finish(r, &p), -EAGAIN);
	/* names out of order, "..", '/', trailing garbage */
	static const char *const bad_names[][2] = {{"b", "a"}, {"..", NULL}, {"x/y", NULL}, {"a", "a"}};
	for (size_t i = 0; i < sizeof(bad_names) / sizeof(bad_names[0]); i++) {
		struct manifest_recon *q;
		const char *const *qd;
		assert_int_equal(manifest_recon_new(m, other, 0, &q), 0);
		assert_int_equal(manifest_recon_next(q, &qd), 1);
		buf_init(&lv, 4096);
		size_t cnt = bad_names[i][1] ? 2 : 1;
		assert_int_equal(buf_put_u32(&lv, (uint32_t)cnt), 0);
		for (size_t k = 0; k < cnt; k++) {
			uint8_t h[CHUNK_HASH_LEN] = {0};
			assert_int_equal(buf_put_str(&lv, bad_names[i][k]), 0);
			assert_int_equal(buf_put_u8(&lv, MANIFEST_FILE), 0);
			assert_int_equal(buf_put_u32(&lv, 0644), 0);
			assert_int_equal(buf_put_u64(&lv, 1), 0);
			assert_int_equal(buf_put(&lv, h, sizeof(h)), 0);
		}
		assert_int_equal(manifest_recon_feed(q, "", buf_ptr(&lv), buf_len(&lv)), -EBADMSG);
		/* sticky */
		assert_int_equal(manifest_recon_finish(q, &p), -EBADMSG);
		buf_clear(&lv);
		manifest_recon_free(q);
	}
	/* a peer whose levels do not add up to the root it announced (it
	 * changed during the exchange): -ESTALE */
	for (size_t k = k_asked; k > 0; k = manifest_recon_next(r, &dirs)) {
		for (size_t i = 0; i < k; i++) {
			buf_init(&lv, 4096);
			assert_int_equal(manifest_level_encode(m, dirs[i], &lv), 0);
			assert_int_equal(manifest_recon_feed(r, dirs[i], buf_ptr(&lv), buf_len(&lv)), 0);
			buf_clear(&lv);
		}
	}
	assert_int_equal(manifest_recon_finish(r, &p), -ESTALE);
	manifest_recon_free(r);
	manifest_free(m);
}

/* ---- allocation failures ---- */

static void test_alloc_failures(void **state)
{
	int r;
	unsigned long k;
	(void)state;

	struct manifest *m = sample_manifest(), *d;
	struct buf a;
	encode(m, &a);
	for (r = -ENOMEM, k = 1; r == -ENOMEM && k < 10000; k++) {
		d = NULL;
		mem_fail_at(k, 0);
		r = manifest_decode(buf_ptr(&a), buf_len(&a), 0, &d);
		mem_fail_at(0, 0);
		manifest_free(d);
	}
	assert_int_equal(r, 0);
	for (r = -ENOMEM, k = 1; r == -ENOMEM && k < 10000; k++) {
		struct buf e;
		buf_init(&e, 1 << 20);
		mem_fail_at(k, 0);
		r = manifest_encode(m, &e);
		mem_fail_at(0, 0);
		buf_clear(&e);
	}
	assert_int_equal(r, 0);
	/* reconcile against a different tree */
	struct manifest *other;
	assert_int_equal(manifest_new(&small, &other), 0);
	assert_int_equal(manifest_seal(other), 0);
	for (r = -ENOMEM, k = 1; r == -ENOMEM && k < 10000; k++) {
		struct manifest_recon *rc = NULL;
		struct manifest *p = NULL;
		const char *const *dirs;
		mem_fail_at(k, 0);
		r = manifest_recon_new(other, m->root, 0, &rc);
		while (r == 0) {
			size_t cnt = manifest_recon_next(rc, &dirs);
			if (cnt == 0)
				break;
			for (size_t i = 0; i < cnt && r == 0; i++) {
				struct buf lv;
				buf_init(&lv, 1 << 20);
				mem_fail_at(0, 0); /* the answering side is not under test */
				assert_int_equal(manifest_level_encode(m, dirs[i], &lv), 0);
				mem_fail_at(k, 0);
				r = manifest_recon_feed(rc, dirs[i], buf_ptr(&lv), buf_len(&lv));
				buf_clear(&lv);
			}
		}
		if (r == 0)
			r = manifest_recon_finish(rc, &p);
		mem_fail_at(0, 0);
		if (r == 0) {
			assert_memory_equal(p->root, m->root, CHUNK_HASH_LEN);
			manifest_free(p);
		}
		manifest_recon_free(rc);
	}
	assert_int_equal(r, 0);
	manifest_free(other);
	buf_clear(&a);
	manifest_free(m);

	/* the scanner */
	int dfd = make_tree();
	assert_int_equal(mkdirat(dfd, "a", 0755), 0);
	uint8_t big[9000];
	tu_fill(big, sizeof(big), 2);
	tu_put_file(dfd, "a/big", big, sizeof(big), 0644);
	tu_put_file(dfd, "f", "x", 1, 0644);
	assert_int_equal(symlinkat("t", dfd, "l"), 0);
	struct manifest_scan_opts o = {.chunking = &small};
	for (r = -ENOMEM, k = 1; r == -ENOMEM && k < 10000; k++) {
		d = NULL;
		mem_fail_at(k, 0);
		r = manifest_scan(dfd, &o, &d);
		mem_fail_at(0, 0);
		manifest_free(d);
	}
	assert_int_equal(r, 0);
	close(dfd);
	tu_rm_rf(tmp_root);
}

/* ---- in-place edits (manifest_swap_subtree) against a full rebuild ---- */

/* m must equal what sealing a fresh copy of its entries gives: same order,
 * same digests, same subtree ends, same bytes. */
static void check_rebuild(const struct manifest *m)
{
	struct manifest *f;
	struct buf a, b;

	assert_int_equal(manifest_new(&m->params, &f), 0);
	for (size_t i = m->n; i-- > 0;) /* reversed: the seal must sort */
		assert_int_equal(manifest_add(f, &m->e[i]), 0);
	assert_int_equal(manifest_seal(f), 0);
	assert_int_equal(f->n, m->n);
	for (size_t i = 0; i < m->n; i++)
		assert_int_equal(f->end[i], m->end[i]);
	assert_memory_equal(f->root, m->root, CHUNK_HASH_LEN);
	buf_init(&a, 64u << 20);
	buf_init(&b, 64u << 20);
	assert_int_equal(manifest_encode(m, &a), 0);
	assert_int_equal(manifest_encode(f, &b), 0);
	assert_int_equal(buf_len(&a), buf_len(&b));
	assert_memory_equal(buf_ptr(&a), buf_ptr(&b), buf_len(&a));
	struct manifest *d;
	assert_int_equal(manifest_decode(buf_ptr(&a), buf_len(&a), 0, &d), 0);
	manifest_free(d);
	buf_clear(&a);
	buf_clear(&b);
	manifest_free(f);
}

static void encode_to(const struct manifest *m, struct buf *out)
{
	buf_reset(out);
	assert_int_equal(manifest_encode(m, out), 0);
}

/* A random subtree at `anchor` into sub: a file, a symlink, or a
 * directory with a few children (some directories themselves). */
static void random_sub(uint64_t *rs, const char *anchor, int depth, struct manifest *sub)
{
	uint32_t t = tu_rand(rs, depth > 2 ? 2 : 4);
	struct manifest_entry e = ent(anchor, MANIFEST_FILE, 0644, tu_rand(rs, 2000), (uint8_t)tu_rand(rs, 256), NULL);
	if (t == 1)
		e = ent(anchor, MANIFEST_SYMLINK, 0, 0, 0, tu_rand(rs, 2) ? "a" : "../b/c");
	else if (t >= 2)
		e = ent(anchor, MANIFEST_DIR, tu_rand(rs, 2) ? 0755 : 0700, 0, 0, NULL);
	assert_int_equal(manifest_add(sub, &e), 0);
	if (t < 2 || strlen(anchor) > 200)
		return;
	static const char *names[] = {"x", "x.c", "y", "a b", "z!", "x-"};
	uint32_t first = tu_rand(rs, 6), nk = tu_rand(rs, 4);
	for (uint32_t i = 0; i < nk; i++) { /* distinct names */
		char p[MANIFEST_PATH_MAX + 1];
		snprintf(p, sizeof(p), "%s/%s", anchor, names[(first + i) % 6]);
		random_sub(rs, p, depth + 1, sub);
	}
}

static void random_path(uint64_t *rs, const struct manifest *m, char *p)
{
	static const char *names[] = {"a", "b", "a.b", "a!", "c", "dir", "f.txt"};
	const char *parent = "";
	if (m->n && tu_rand(rs, 4)) {
		const struct manifest_entry *e = &m->e[tu_rand(rs, (uint32_t)m->n)];
		if (e->type == MANIFEST_DIR)
			parent = e->path;
	}
	snprintf(p, MANIFEST_PATH_MAX + 1, "%s%s%s", parent, parent[0] ? "/" : "", names[tu_rand(rs, 7)]);
}

static void test_swap_subtree_random(void **state)
{
	(void)state;
	uint64_t rs = 0x5ca1e0013ULL;
	struct manifest *m, *sub;
	struct buf before, after;
	char p[MANIFEST_PATH_MAX + 1], q[MANIFEST_PATH_MAX + 1];

	buf_init(&before, 64u << 20);
	buf_init(&after, 64u << 20);
	assert_int_equal(manifest_new(&small, &m), 0);
	assert_int_equal(manifest_seal(m), 0);
	for (int step = 0; step < 3000; step++) {
		uint32_t op = tu_rand(&rs, 10);
		assert_int_equal(manifest_new(&small, &sub), 0);
		encode_to(m, &before);
		if (op < 5) { /* insert or replace at a random path */
			random_path(&rs, m, p);
			random_sub(&rs, p, 0, sub);
			assert_int_equal(manifest_swap_subtree(m, p, sub), 0);
			if (tu_rand(&rs, 8) == 0) { /* undo: the old subtree back */
				assert_int_equal(manifest_swap_subtree(m, p, sub), 0);
				encode_to(m, &after);
				assert_int_equal(buf_len(&before), buf_len(&after));
				assert_memory_equal(buf_ptr(&before), buf_ptr(&after), buf_len(&after));
			}
		} else if (op < 7 && m->n) { /* delete */
			strcpy(p, m->e[tu_rand(&rs, (uint32_t)m->n)].path);
			assert_int_equal(manifest_swap_subtree(m, p, sub), 0);
			assert_true(sub->n >= 1);
			assert_int_equal(manifest_find(m, p), -1);
		} else if (m->n) { /* rename: take the subtree out, put it back elsewhere */
			strcpy(p, m->e[tu_rand(&rs, (uint32_t)m->n)].path);
			random_path(&rs, m, q);
			size_t pl = strlen(p);
			if (!strncmp(q, p, pl) && (q[pl] == '/' || !q[pl])) {
				manifest_free(sub);
				continue; /* into itself */
			}
			assert_int_equal(manifest_swap_subtree(m, p, sub), 0);
			struct manifest *moved;
			assert_int_equal(manifest_new(&small, &moved), 0);
			for (size_t i = 0; i < sub->n; i++) {
				struct manifest_entry e = sub->e[i];
				char np[MANIFEST_PATH_MAX + 1];
				snprintf(np, sizeof(np), "%s%s", q, sub->e[i].path + pl);
				e.path = np;
				if (strlen(np) > 250)
					break;
				assert_int_equal(manifest_add(moved, &e), 0);
			}
			if (moved->n == sub->n) {
				/* where q's parent went away with p: refused, m unchanged */
				encode_to(m, &before);
				int r = manifest_swap_subtree(m, q, moved);
				if (r == -ENOENT) {
					encode_to(m, &after);
					assert_memory_equal(buf_ptr(&before), buf_ptr(&after), buf_len(&after));
				} else {
					assert_int_equal(r, 0);
				}
			}
			manifest_free(moved);
		}
		manifest_free(sub);
		check_rebuild(m);
	}
	/* refusals leave m as it was */
	encode_to(m, &before);
	assert_int_equal(manifest_new(&small, &sub), 0);
	struct manifest_entry e = ent("nowhere/x", MANIFEST_FILE, 0644, 1, 1, NULL);
	assert_int_equal(manifest_add(sub, &e), 0);
	assert_int_equal(manifest_swap_subtree(m, "nowhere/x", sub), -ENOENT);
	assert_int_equal(manifest_swap_subtree(m, "other", sub), -EINVAL);
	e = ent("nowhere/x/y", MANIFEST_FILE, 0644, 1, 1, NULL);
	assert_int_equal(manifest_add(sub, &e), 0);
	assert_int_equal(manifest_swap_subtree(m, "nowhere", sub), -ENOENT);
	manifest_free(sub);
	assert_int_equal(manifest_new(&small, &sub), 0);
	e = ent("n", MANIFEST_FILE, 0644, 1, 1, NULL);
	assert_int_equal(manifest_add(sub, &e), 0);
	assert_int_equal(manifest_add(sub, &e), 0);
	assert_int_equal(manifest_swap_subtree(m, "n", sub), -EEXIST);
	manifest_free(sub);
	encode_to(m, &after);
	assert_int_equal(buf_len(&before), buf_len(&after));
	assert_memory_equal(buf_ptr(&before), buf_ptr(&after), buf_len(&after));
	/* and under allocation failures */
	for (unsigned k = 1; k < 8; k++) {
		assert_int_equal(manifest_new(&small, &sub), 0);
		e = ent("new-one", MANIFEST_DIR, 0755, 0, 0, NULL);
		assert_int_equal(manifest_add(sub, &e), 0);
		mem_fail_at(k, 0);
		int r = manifest_swap_subtree(m, "new-one", sub);
		mem_fail_at(0, 0);
		if (r == 0)
			assert_int_equal(manifest_swap_subtree(m, "new-one", sub), 0);
		else
			assert_int_equal(r, -ENOMEM);
		encode_to(m, &after);
		assert_memory_equal(buf_ptr(&before), buf_ptr(&after), buf_len(&after));
		manifest_free(sub);
	}
	check_rebuild(m);
	buf_clear(&before);
	buf_clear(&after);
	manifest_free(m);
}

/* An empty manifest (a new, empty workspace) with nothing to swap in: the
 * swap is a no-op that keeps the root, and copies nothing from a NULL entry
 * array (UBSan: "null pointer passed as argument 2" in the relay_e2e
 * daemon's first targeted push). */
static void test_swap_subtree_empty(void **state)
{
	(void)state;
	struct manifest *m, *sub;
	uint8_t root[CHUNK_HASH_LEN];

	assert_int_equal(manifest_new(&small, &m), 0);
	assert_int_equal(manifest_seal(m), 0);
	memcpy(root, m->root, sizeof(root));
	assert_int_equal(manifest_new(&small, &sub), 0);
	assert_int_equal(manifest_swap_subtree(m, "f", sub), 0);
	assert_int_equal(m->n, 0);
	assert_int_equal(sub->n, 0);
	assert_memory_equal(m->root, root, sizeof(root));
	manifest_free(sub);
	manifest_free(m);
}

/* ---- in-place removal and re-adding (manifest_remove_marked,
 * manifest_add_moved, a small unsorted tail merged by the seal) against a
 * full rebuild ---- */

static void test_remove_readd_random(void **state)
{
	(void)state;
	uint64_t rs = 0x3e3e0104ULL;
	struct manifest *m = big_tree();

	for (int round = 0; round < 40; round++) {
		bool *drop = calloc(m->n, sizeof(*drop));
		assert_non_null(drop);
		/* whole subtrees (a file, or a directory with everything under
		 * it), so that every kept entry keeps its parent */
		size_t nd = 0, picks = 1 + tu_rand(&rs, 8);
		for (size_t k = 0; k < picks; k++) {
			size_t i = tu_rand(&rs, (uint32_t)m->n);
			if (m->e[i].type == MANIFEST_DIR && tu_rand(&rs, 4))
				continue; /* mostly files */
			for (size_t j = i; j < m->end[i]; j++)
				nd += !drop[j], drop[j] = true;
		}
		struct manifest_entry *out = calloc(nd ? nd : 1, sizeof(*out));
		assert_non_null(out);
		size_t before = m->n;
		manifest_remove_marked(m, drop, out);
		assert_int_equal(m->n, before - nd);
		assert_int_equal(manifest_seal(m), 0);
		check_rebuild(m);
		for (size_t k = 0; k < nd; k++)
			assert_int_equal(manifest_find(m, out[k].path), -1);
		/* put back a prefix of them (parents come first in tree order),
		 * free the rest; sometimes a new file too */
		size_t back = tu_rand(&rs, 2) ? nd : tu_rand(&rs, (uint32_t)nd + 1);
		for (size_t k = 0; k < nd; k++) {
			if (k < back)
				assert_int_equal(manifest_add_moved(m, &out[k]), 0);
			else
				manifest_entry_clear(&out[k]);
		}
		if (tu_rand(&rs, 2)) { /* a name no round used, in the first directory */
			char p[64];
			snprintf(p, sizeof(p), "%s/new%02d", m->e[0].path, round);
			struct manifest_entry e = ent(p, MANIFEST_FILE, 0644, 7, 1, NULL);
			assert_int_equal(manifest_add(m, &e), 0);
		}
		assert_int_equal(manifest_seal(m), 0);
		check_rebuild(m);
		free(out);
		free(drop);
	}
	/* a moved entry the manifest refuses is freed, not kept */
	struct manifest_entry bad = ent("ok", MANIFEST_DIR, 0755, 5, 0, NULL);
	bad.path = strdup("ok");
	assert_non_null(bad.path);
	assert_int_equal(manifest_add_moved(m, &bad), -EINVAL);
	assert_null(bad.path);
	manifest_free(m);
}

/* ---- the streamed encoding: the same bytes, in pieces ---- */

struct pieces {
	struct buf all;
	size_t calls, largest;
};

static int collect(void *ud, struct buf *b)
{
	struct pieces *p = ud;
	p->calls++;
	if (buf_len(b) > p->largest)
		p->largest = buf_len(b);
	assert_int_equal(buf_put(&p->all, buf_ptr(b), buf_len(b)), 0);
	buf_reset(b);
	return 0;
}

static int refuse(void *ud, struct buf *b)
{
	(void)ud;
	(void)b;
	return -ENOSPC;
}

static void test_encode_stream(void **state)
{
	(void)state;
	struct manifest *ms[2] = {sample_manifest(), big_tree()};

	for (size_t t = 0; t < 2; t++) {
		struct buf whole, piece;
		struct pieces p = {0};
		buf_init(&whole, 64u << 20);
		buf_init(&piece, 64u << 20);
		buf_init(&p.all, 64u << 20);
		assert_int_equal(manifest_encode(ms[t], &whole), 0);
		assert_int_equal(manifest_encoded_size(ms[t]), buf_len(&whole));
		assert_int_equal(manifest_encode_to(ms[t], &piece, collect, &p), 0);
		assert_int_equal(collect(&p, &piece), 0);
		assert_int_equal(buf_len(&p.all), buf_len(&whole));
		assert_memory_equal(buf_ptr(&p.all), buf_ptr(&whole), buf_len(&whole));
		/* pieces stay near MANIFEST_FLUSH_AT: never the whole encoding */
		assert_true(p.largest < MANIFEST_FLUSH_AT + 8192);
		if (t == 1) {
			assert_true(p.calls > buf_len(&whole) / MANIFEST_FLUSH_AT);
			buf_reset(&piece);
			assert_int_equal(manifest_encode_to(ms[t], &piece, refuse, NULL), -ENOSPC);
		}
		buf_clear(&whole);
		buf_clear(&piece);
		buf_clear(&p.all);
		manifest_free(ms[t]);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_path_check),		 cmocka_unit_test(test_path_order),
	    cmocka_unit_test(test_manifest_roundtrip),	 cmocka_unit_test(test_manifest_decode_rejects),
	    cmocka_unit_test(test_manifest_add_rejects), cmocka_unit_test(test_scan),
	    cmocka_unit_test(test_scan_filter),		 cmocka_unit_test(test_diff),
	    cmocka_unit_test(test_level_reader),	 cmocka_unit_test(test_tree_reconcile),
	    cmocka_unit_test(test_recon_rejects),	 cmocka_unit_test(test_alloc_failures),
	    cmocka_unit_test(test_swap_subtree_random),	 cmocka_unit_test(test_swap_subtree_empty),
	    cmocka_unit_test(test_remove_readd_random),	 cmocka_unit_test(test_encode_stream),
	    cmocka_unit_test(test_wide_mode),		 cmocka_unit_test(test_seal_trims),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
