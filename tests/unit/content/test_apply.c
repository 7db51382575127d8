/* SPDX-License-Identifier: Apache-2.0 */
/* apply: sync round trips through verify + apply, and crafted batches that
 * must be refused with nothing written outside the root and nothing half
 * applied. Every test runs with openat2/O_TMPFILE and again with the
 * fallbacks (component walk, named temporaries). */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "testutil.h"

#include "airlock/content/apply.h"
#include "airlock/content/chunk.h"
#include "airlock/content/delta.h"
#include "airlock/content/manifest.h"
#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

static const struct chunk_params small = {.min = 256, .avg = 1024, .max = 4096, .whole_max = 2048};
static uint8_t pk[32], sk[64], scope[32];

static const struct apply_opts mode_default = {.fsync = APPLY_FSYNC_BATCH};
static const struct apply_opts mode_fallback = {.fsync = APPLY_FSYNC_FILE,
						.flags = APPLY_NO_OPENAT2 | APPLY_NO_TMPFILE | APPLY_NO_EXCHANGE};
/* an agent that is root and gives what it makes to the command user */
#define OWNER 4242u
static const struct apply_opts mode_default_own = {.fsync = APPLY_FSYNC_BATCH, .own = true, .uid = OWNER, .gid = OWNER};
static const struct apply_opts mode_fallback_own = {.fsync = APPLY_FSYNC_FILE,
						    .flags = APPLY_NO_OPENAT2 | APPLY_NO_TMPFILE | APPLY_NO_EXCHANGE,
						    .own = true,
						    .uid = OWNER,
						    .gid = OWNER};

struct env {
	char base[64], host[96], guest[96], outside[96];
	int hfd, gfd, ofd;
	struct apply *a;
	const struct apply_opts *opts;
	uint64_t seq;
};

/* ---- helpers ---- */

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));
	e->opts = *state ? *state : &mode_default;
	tu_tmpdir(e->base, sizeof(e->base), "apply");
	snprintf(e->host, sizeof(e->host), "%s/host", e->base);
	snprintf(e->guest, sizeof(e->guest), "%s/guest", e->base);
	snprintf(e->outside, sizeof(e->outside), "%s/outside", e->base);
	assert_int_equal(mkdir(e->host, 0755), 0);
	assert_int_equal(mkdir(e->guest, 0755), 0);
	assert_int_equal(mkdir(e->outside, 0755), 0);
	e->hfd = open(e->host, O_RDONLY | O_DIRECTORY);
	e->gfd = open(e->guest, O_RDONLY | O_DIRECTORY);
	e->ofd = open(e->outside, O_RDONLY | O_DIRECTORY);
	tu_put_file(e->ofd, "x", "outside", 7, 0644);
	assert_int_equal(apply_open(e->guest, e->opts, &e->a), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;
	apply_free(e->a);
	close(e->hfd);
	close(e->gfd);
	close(e->ofd);
	tu_rm_rf(e->base);
	free(e);
	return 0;
}

static int keep_all_but_node_modules(const char *p, bool is_dir, void *ud)
{
	(void)ud;
	(void)is_dir;
	const char *s = strrchr(p, '/');
	return strcmp(s ? s + 1 : p, "node_modules") == 0 ? MANIFEST_SKIP : MANIFEST_KEEP;
}

static struct manifest_scan_opts scan_opts = {.filter = keep_all_but_node_modules, .chunking = &small};

struct counted {
	size_t reserved;
};

static void count_reserved(const char *p, enum manifest_skip why, int err, void *ud)
{
	(void)p;
	(void)err;
	if (why == MANIFEST_SKIP_RESERVED)
		((struct counted *)ud)->reserved++;
}

/* Everything under dfd, encoded; fails if a temporary is lying around. */
static void snapshot(int dfd, struct buf *out)
{
	struct counted c = {0};
	struct manifest_scan_opts o = {.chunking = &small, .skipped = count_reserved, .skipped_ud = &c};
	struct manifest *m;
	assert_int_equal(manifest_scan(dfd, &o, &m), 0);
	assert_int_equal(c.reserved, 0);
	buf_init(out, 64u << 20);
	assert_int_equal(manifest_encode(m, out), 0);
	manifest_free(m);
}

static void assert_same(const struct buf *a, const struct buf *b)
{
	assert_int_equal(buf_len(a), buf_len(b));
	assert_memory_equal(buf_ptr(a), buf_ptr(b), buf_len(a));
}

/* Bytes of a batch that brings the guest (as its manifest says) to the
 * host tree. */
static void make_sync_batch(struct env *e, uint8_t **bytes, size_t *n)
{
	struct manifest *hm, *gm;
	struct manifest_change *c;
	size_t nc;
	struct delta_builder *b;
	assert_int_equal(manifest_scan(e->hfd, &scan_opts, &hm), 0);
	assert_int_equal(apply_manifest(e->a, &scan_opts, &gm), 0);
	assert_int_equal(manifest_diff(gm, hm, &c, &nc), 0);
	assert_int_equal(delta_builder_new(++e->seq, scope, &small, NULL, &b), 0);
	for (size_t i = 0; i < nc; i++)
		assert_int_equal(delta_add_change(b, e->hfd, &c[i]), 0);
	assert_int_equal(delta_builder_finish(b, sk, bytes, n), 0);
	delta_builder_free(b);
	mem_free(c);
	manifest_free(hm);
	manifest_free(gm);
}

/* verify + apply; returns the first error. */
static int deliver(struct env *e, const uint8_t *bytes, size_t n, struct apply_stats *st)
{
	struct delta_batch *b;
	char err[256];
	if (st)
		memset(st, 0, sizeof(*st));
	int r = delta_batch_verify(bytes, n, pk, scope, apply_last_seq(e->a), NULL, &b, err, sizeof(err));
	if (r < 0)
		return r;
	r = apply_batch(e->a, b, st);
	delta_batch_free(b);
	return r;
}

static size_t sync_only(struct env *e, struct apply_stats *st)
{
	uint8_t *bytes;
	size_t n;
	make_sync_batch(e, &bytes, &n);
	int r = deliver(e, bytes, n, st);
	if (r < 0)
		fail_msg("sync failed: %s (%s)", strerror(-r), apply_error(e->a));
	mem_free(bytes);
	return n;
}

/* Sync and check the guest now equals the host (managed paths). */
static size_t sync_and_check(struct env *e, struct apply_stats *st)
{
	size_t n = sync_only(e, st);
	struct manifest *hm, *gm;
	struct buf hb, gb;
	assert_int_equal(manifest_scan(e->hfd, &scan_opts, &hm), 0);
	assert_int_equal(manifest_scan(e->gfd, &scan_opts, &gm), 0);
	buf_init(&hb, 64u << 20);
	buf_init(&gb, 64u << 20);
	assert_int_equal(manifest_encode(hm, &hb), 0);
	assert_int_equal(manifest_encode(gm, &gb), 0);
	assert_same(&hb, &gb);
	buf_clear(&hb);
	buf_clear(&gb);
	manifest_free(hm);
	manifest_free(gm);
	return n;
}

static void build_host_tree(int h)
{
	uint8_t big[50000], mid[3000];
	tu_fill(big, sizeof(big), 1);
	tu_fill(mid, sizeof(mid), 2);
	assert_int_equal(mkdirat(h, "src", 0755), 0);
	assert_int_equal(mkdirat(h, "src/lib", 0750), 0);
	assert_int_equal(mkdirat(h, "empty", 0700), 0);
	assert_int_equal(mkdirat(h, "ro", 0755), 0);
	tu_put_file(h, "src/main.c", "int main(void) { return 0; }\n", 29, 0644);
	tu_put_file(h, "src/lib/big.bin", big, sizeof(big), 0644);
	tu_put_file(h, "src/lib/mid.bin", mid, sizeof(mid), 0600);
	tu_put_file(h, "run.sh", "#!/bin/sh\necho hi\n", 18, 0755);
	tu_put_file(h, "zero", "", 0, 0444);
	tu_put_file(h, "ro/inside", "x", 1, 0644);
	assert_int_equal(fchmodat(h, "ro", 0555, 0), 0); /* filled, then made read-only */
	assert_int_equal(symlinkat("src/main.c", h, "rel-link"), 0);
	assert_int_equal(symlinkat("/etc/hostname", h, "abs-link"), 0);
	assert_int_equal(symlinkat("does/not/exist", h, "dangling"), 0);
	assert_int_equal(symlinkat("..", h, "src/up"), 0);
}

/* ---- round trips ---- */

static void test_full_and_incremental_sync(void **state)
{
	struct env *e = *state;
	struct apply_stats st;
	build_host_tree(e->hfd);
	sync_and_check(e, &st);
	assert_false(st.partial);
	assert_true(st.files >= 6);
	assert_int_equal(st.symlinks, 4);

	/* content check beyond the hashes: a file and a link target */
	char buf[64];
	int fd = openat(e->gfd, "src/main.c", O_RDONLY);
	assert_int_equal(read(fd, buf, sizeof(buf)), 29);
	close(fd);
	assert_memory_equal(buf, "int main(void) { return 0; }\n", 29);
	assert_int_equal(readlinkat(e->gfd, "src/up", buf, sizeof(buf)), 2);
	struct stat s;
	assert_int_equal(fstatat(e->gfd, "ro", &s, 0), 0);
	assert_int_equal(s.st_mode & 07777, 0555);

	/* nothing changed: an empty batch */
	size_t n = sync_and_check(e, &st);
	assert_int_equal(n, DELTA_HDR_LEN + DELTA_SIG_LEN);
	assert_int_equal(st.ops, 0);

	/* one byte in the big file: only about one chunk travels */
	fd = openat(e->hfd, "src/lib/big.bin", O_WRONLY);
	assert_int_equal(pwrite(fd, "Z", 1, 25000), 1);
	close(fd);
	n = sync_and_check(e, &st);
	assert_true(n < 3 * small.max);
	assert_true(st.ref_bytes > 40000);
	assert_int_equal(st.files, 1);

	/* type changes both ways, a retargeted link, a mode change, removals */
	assert_int_equal(unlinkat(e->hfd, "run.sh", 0), 0);
	assert_int_equal(mkdirat(e->hfd, "run.sh", 0755), 0); /* file -> dir */
	tu_put_file(e->hfd, "run.sh/now-a-dir", "d", 1, 0644);
	assert_int_equal(unlinkat(e->hfd, "src/lib/mid.bin", 0), 0);
	assert_int_equal(unlinkat(e->hfd, "src/lib/big.bin", 0), 0);
	assert_int_equal(unlinkat(e->hfd, "src/lib", AT_REMOVEDIR), 0);
	tu_put_file(e->hfd, "src/lib", "now a file", 10, 0644); /* dir -> file */
	assert_int_equal(unlinkat(e->hfd, "rel-link", 0), 0);
	assert_int_equal(symlinkat("zero", e->hfd, "rel-link"), 0);
	assert_int_equal(fchmodat(e->hfd, "src/main.c", 0600, 0), 0);
	assert_int_equal(fchmodat(e->hfd, "empty", 0711, 0), 0);
	assert_int_equal(unlinkat(e->hfd, "dangling", 0), 0);
	sync_and_check(e, &st);
	assert_int_equal(st.kept_dirs, 0);
}

static void test_unmanaged_paths_survive(void **state)
{
	struct env *e = *state;
	struct apply_stats st;
	assert_int_equal(mkdirat(e->hfd, "pkg", 0755), 0);
	tu_put_file(e->hfd, "pkg/index.js", "x", 1, 0644);
	tu_put_file(e->hfd, "top.txt", "t", 1, 0644);
	sync_and_check(e, &st);
	/* the guest installs things the host does not manage */
	assert_int_equal(mkdirat(e->gfd, "node_modules", 0755), 0);
	tu_put_file(e->gfd, "node_modules/dep.js", "dep", 3, 0644);
	assert_int_equal(mkdirat(e->gfd, "pkg/node_modules", 0755), 0);
	tu_put_file(e->gfd, "pkg/node_modules/inner.js", "in", 2, 0644);
	/* the host removes pkg and changes top.txt */
	assert_int_equal(unlinkat(e->hfd, "pkg/index.js", 0), 0);
	assert_int_equal(unlinkat(e->hfd, "pkg", AT_REMOVEDIR), 0);
	tu_put_file(e->hfd, "top.txt", "t2", 2, 0644);
	sync_only(e, &st);
	assert_int_equal(st.kept_dirs, 1); /* pkg stays for its node_modules */
	struct stat s;
	assert_int_equal(fstatat(e->gfd, "node_modules/dep.js", &s, 0), 0);
	assert_int_equal(fstatat(e->gfd, "pkg/node_modules/inner.js", &s, 0), 0);
	assert_int_equal(fstatat(e->gfd, "pkg/index.js", &s, 0), -1);
	/* ... but a managed directory replaced by a file takes them along */
	tu_put_file(e->hfd, "pkg", "file now", 8, 0644);
	sync_and_check(e, &st);
	assert_int_equal(fstatat(e->gfd, "pkg", &s, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISREG(s.st_mode));
	assert_int_equal(fstatat(e->gfd, "node_modules/dep.js", &s, 0), 0);
}

static void test_move_by_reference_and_seq(void **state)
{
	struct env *e = *state;
	struct apply_stats st;
	uint8_t data[20000];
	tu_fill(data, sizeof(data), 5);
	tu_put_file(e->hfd, "orig", data, sizeof(data), 0644);
	sync_and_check(e, &st);

	/* a move: every chunk referenced from the old name, then deleted */
	struct manifest *gm;
	assert_int_equal(apply_manifest(e->a, &scan_opts, &gm), 0);
	const struct manifest_entry *old = &gm->e[manifest_find(gm, "orig")];
	assert_true(old->nchunks > 1);
	struct delta_builder *b;
	assert_int_equal(delta_builder_new(++e->seq, scope, &small, NULL, &b), 0);
	assert_int_equal(delta_put_begin(b, "moved", 0640, "orig"), 0);
	for (size_t i = 0; i < old->nchunks; i++)
		assert_int_equal(delta_put_ref(b, old->chunks[i].off, old->chunks[i].len, old->chunks[i].hash), 0);
	assert_int_equal(delta_put_end(b, old->hash), 0);
	assert_int_equal(delta_add_delete(b, "orig", 0), 0);
	uint8_t *bytes;
	size_t n;
	assert_int_equal(delta_builder_finish(b, sk, &bytes, &n), 0);
	delta_builder_free(b);
	manifest_free(gm);
	assert_true(n < 1000);
	assert_int_equal(deliver(e, bytes, n, &st), 0);
	assert_int_equal(st.ref_bytes, sizeof(data));
	uint8_t back[sizeof(data)];
	int fd = openat(e->gfd, "moved", O_RDONLY);
	assert_int_equal(read(fd, back, sizeof(back)), (ssize_t)sizeof(back));
	close(fd);
	assert_memory_equal(back, data, sizeof(data));
	assert_int_equal(faccessat(e->gfd, "orig", F_OK, AT_SYMLINK_NOFOLLOW), -1);

	/* the same batch again: refused by sequence, by verify and by apply */
	assert_int_equal(deliver(e, bytes, n, &st), -ESTALE);
	struct delta_batch *vb;
	assert_int_equal(delta_batch_verify(bytes, n, pk, scope, 0, NULL, &vb, NULL, 0), 0);
	assert_int_equal(apply_batch(e->a, vb, &st), -ESTALE);
	delta_batch_free(vb);
	mem_free(bytes);
}

/* An edit in place of a large file: the new file is a clone of the old one
 * with only the new chunk written; a guest copy changed behind the host's
 * back is refused (the REF ranges are verified in the clone) and stays as
 * it was. */
static void test_inplace_edit_cloned(void **state)
{
	struct env *e = *state;
	struct apply_stats st;
	const size_t size = 600000;
	uint8_t *data = malloc(size);
	assert_non_null(data);
	tu_fill(data, size, 9);
	tu_put_file(e->hfd, "db.bin", data, size, 0644);
	sync_and_check(e, &st);

	/* the host rewrites 100 bytes in the middle: REFs at their own offsets */
	struct manifest *gm;
	assert_int_equal(apply_manifest(e->a, &scan_opts, &gm), 0);
	const struct manifest_entry *old = &gm->e[manifest_find(gm, "db.bin")];
	assert_true(old->nchunks > 10);
	memset(data + 300000, 'x', 100);
	struct chunk *nl;
	size_t nn;
	assert_int_equal(chunk_split(&small, data, size, &nl, &nn), 0);
	uint8_t *bytes;
	size_t n;
	for (int round = 0; round < 2; round++) {
		struct delta_builder *b;
		assert_int_equal(delta_builder_new(++e->seq, scope, &small, NULL, &b), 0);
		assert_int_equal(delta_put_begin(b, "db.bin", 0644, NULL), 0);
		for (size_t i = 0, j = 0; i < nn; i++) {
			while (j < old->nchunks && old->chunks[j].off < nl[i].off)
				j++;
			if (j < old->nchunks && old->chunks[j].off == nl[i].off && old->chunks[j].len == nl[i].len &&
			    !memcmp(old->chunks[j].hash, nl[i].hash, CHUNK_HASH_LEN))
				assert_int_equal(delta_put_ref(b, nl[i].off, nl[i].len, nl[i].hash), 0);
			else
				assert_int_equal(delta_put_inline(b, data + nl[i].off, nl[i].len), 0);
		}
		uint8_t fh[CHUNK_HASH_LEN];
		chunk_list_hash(nl, nn, fh);
		assert_int_equal(delta_put_end(b, fh), 0);
		assert_int_equal(delta_builder_finish(b, sk, &bytes, &n), 0);
		delta_builder_free(b);
		assert_true(n < 20000);
		if (round == 0) {
			/* a command in the guest changed the file: refused, untouched */
			int fd = openat(e->gfd, "db.bin", O_WRONLY);
			assert_true(fd >= 0);
			assert_int_equal(pwrite(fd, "guest", 5, 100000), 5);
			close(fd);
			uint64_t seq0 = apply_last_seq(e->a);
			assert_int_equal(deliver(e, bytes, n, &st), 0);
			size_t nf;
			const struct apply_failure *f = apply_failures(e->a, &nf, NULL);
			assert_int_equal(nf, 1);
			assert_int_equal(f[0].op, 0);
			assert_int_equal(f[0].err, EBADMSG);
			assert_non_null(strstr(f[0].msg, "referenced chunk differs"));
			assert_non_null(strstr(apply_error(e->a), "referenced chunk differs"));
			apply_set_last_seq(e->a, seq0); /* the round below resends it */
			uint8_t back[5];
			fd = openat(e->gfd, "db.bin", O_RDONLY);
			assert_int_equal(pread(fd, back, 5, 100000), 5);
			close(fd);
			assert_memory_equal(back, "guest", 5);
			/* put the guest's copy back as the host knows it */
			fd = openat(e->gfd, "db.bin", O_WRONLY);
			assert_int_equal(pwrite(fd, data + 100000, 5, 100000), 5);
			close(fd);
			e->seq--; /* the refused batch did not count */
		} else {
			assert_int_equal(deliver(e, bytes, n, &st), 0);
			assert_int_equal(st.cloned, 1);
			assert_true(st.ref_bytes >= size - 3 * 4096);
			assert_int_equal(st.bytes, size);
		}
		mem_free(bytes);
	}
	uint8_t *back = malloc(size);
	int fd = openat(e->gfd, "db.bin", O_RDONLY);
	assert_int_equal(read(fd, back, size), (ssize_t)size);
	close(fd);
	assert_memory_equal(back, data, size);
	struct stat gs;
	assert_int_equal(fstatat(e->gfd, "db.bin", &gs, 0), 0);
	assert_int_equal(gs.st_size, (off_t)size);
	free(back);
	mem_free(nl);
	manifest_free(gm);
	free(data);
}

/* Allocated bytes of a file in the guest copy. */
static uint64_t guest_allocated(struct env *e, const char *name)
{
	struct stat st;
	assert_int_equal(fstatat(e->gfd, name, &st, AT_SYMLINK_NOFOLLOW), 0);
	return (uint64_t)st.st_blocks * 512u;
}

/* A sparse file stays sparse in the copy: all-zero blocks are holes, also
 * at the end (the size is set, not written), and an in-place edit that
 * zeroes a range of a cloned file punches it out. */
static void test_sparse_stays_sparse(void **state)
{
	struct env *e = *state;
	struct apply_stats st;
	const off_t size = 16 << 20;
	int fd = openat(e->hfd, "sparse.img", O_WRONLY | O_CREAT | O_TRUNC, 0644);

	assert_true(fd >= 0);
	assert_int_equal(pwrite(fd, "head", 4, 0), 4);
	assert_int_equal(pwrite(fd, "middle", 6, 5 << 20), 6);
	assert_int_equal(ftruncate(fd, size), 0); /* ends in a hole */
	close(fd);
	sync_and_check(e, &st);
	struct stat gs;
	assert_int_equal(fstatat(e->gfd, "sparse.img", &gs, 0), 0);
	assert_int_equal(gs.st_size, size);
	print_message("sparse: %lld bytes, %llu allocated in the copy\n", (long long)size,
		      (unsigned long long)guest_allocated(e, "sparse.img"));
	assert_true(guest_allocated(e, "sparse.img") <= 64 * 1024);

	/* dense, then 1 MiB in its middle zeroed on the host */
	const size_t dsz = 4 << 20;
	uint8_t *data = malloc(dsz);
	assert_non_null(data);
	tu_fill(data, dsz, 5);
	tu_put_file(e->hfd, "dense.bin", data, dsz, 0644);
	sync_and_check(e, &st);
	uint64_t before = guest_allocated(e, "dense.bin");
	assert_true(before >= dsz);
	memset(data + (1 << 20), 0, 1 << 20);
	tu_put_file(e->hfd, "dense.bin", data, dsz, 0644);
	sync_and_check(e, &st);
	uint64_t after = guest_allocated(e, "dense.bin");
	print_message("dense: %llu allocated, %llu after zeroing 1 MiB\n", (unsigned long long)before,
		      (unsigned long long)after);
	assert_true(after <= before - (1 << 20) + 2 * 64 * 1024);
	free(data);
}

static void test_crash_leftovers_cleaned(void **state)
{
	struct env *e = *state;
	assert_int_equal(mkdirat(e->gfd, ".airlock-tmp-0123456789abcdef", 0700), 0);
	tu_put_file(e->gfd, ".airlock-tmp-0123456789abcdef/half", "x", 1, 0600);
	assert_int_equal(mkdirat(e->gfd, "d", 0755), 0);
	tu_put_file(e->gfd, "d/.airlock-tmp-fedcba9876543210", "y", 1, 0600);
	apply_free(e->a);
	assert_int_equal(apply_open(e->guest, e->opts, &e->a), 0);
	assert_int_equal(faccessat(e->gfd, ".airlock-tmp-0123456789abcdef", F_OK, 0), -1);
	struct manifest *m;
	assert_int_equal(apply_manifest(e->a, NULL, &m), 0);
	assert_int_equal(m->n, 1);
	manifest_free(m);
	assert_int_equal(faccessat(e->gfd, "d/.airlock-tmp-fedcba9876543210", F_OK, 0), -1);
}

/* A directory replaced by a file goes as a whole tree, and the tree walk
 * never follows the links inside it. */
static void test_tree_delete_never_follows(void **state)
{
	struct env *e = *state;
	struct apply_stats st;
	assert_int_equal(mkdirat(e->hfd, "t", 0755), 0);
	tu_put_file(e->hfd, "t/managed", "m", 1, 0644);
	sync_and_check(e, &st);
	/* the guest adds unmanaged things, including links out of the root */
	assert_int_equal(mkdirat(e->gfd, "t/node_modules", 0755), 0);
	assert_int_equal(symlinkat(e->outside, e->gfd, "t/node_modules/out"), 0);
	assert_int_equal(symlinkat(e->outside, e->gfd, "t/out2"), 0);
	assert_int_equal(mkdirat(e->gfd, "t/node_modules/deep", 0755), 0);
	tu_put_file(e->gfd, "t/node_modules/deep/f", "f", 1, 0644);
	struct buf o0, o1;
	snapshot(e->ofd, &o0);
	assert_int_equal(unlinkat(e->hfd, "t/managed", 0), 0);
	assert_int_equal(unlinkat(e->hfd, "t", AT_REMOVEDIR), 0);
	tu_put_file(e->hfd, "t", "file", 4, 0644);
	sync_and_check(e, &st);
	snapshot(e->ofd, &o1);
	assert_same(&o0, &o1);
	assert_int_equal(faccessat(e->ofd, "x", F_OK, 0), 0);
	buf_clear(&o0);
	buf_clear(&o1);
}

/* ---- crafted batches ---- */

struct raw {
	struct buf b;
	uint32_t nops;
	uint64_t seq;
};

static void raw_begin(struct raw *r, uint64_t seq)
{
	buf_init(&r->b, 64u << 20);
	r->nops = 0;
	assert_int_equal(buf_put(&r->b, "ALDB", 4), 0);
	assert_int_equal(buf_put_u8(&r->b, DELTA_VERSION), 0);
	assert_int_equal(buf_put_u8(&r->b, 0), 0);
	assert_int_equal(buf_put_u16(&r->b, 0), 0);
	assert_int_equal(buf_put(&r->b, scope, 32), 0);
	assert_int_equal(buf_put_u64(&r->b, seq), 0);
	assert_int_equal(buf_put_u32(&r->b, 0), 0);
}

static void raw_path(struct raw *r, uint8_t type, const void *p, size_t n)
{
	assert_int_equal(buf_put_u8(&r->b, type), 0);
	assert_int_equal(buf_put_bytes(&r->b, p, n), 0);
	r->nops++;
}

/* A PUT of `text` in one RAW chunk, with the right hashes unless told. */
static void raw_put(struct raw *r, const char *path, size_t pl, uint32_t mode, const char *text, int corrupt)
{
	uint8_t h[CHUNK_HASH_LEN], fh[CHUNK_HASH_LEN];
	size_t n = strlen(text);
	chunk_hash(text, n, h);
	memcpy(fh, h, sizeof(fh));
	if (corrupt == 1)
		fh[3] ^= 1; /* file hash */
	if (corrupt == 2)
		h[9] ^= 1; /* chunk hash */
	raw_path(r, DELTA_PUT, path, pl);
	assert_int_equal(buf_put_u32(&r->b, mode), 0);
	assert_int_equal(buf_put_u64(&r->b, n), 0);
	assert_int_equal(buf_put(&r->b, fh, sizeof(fh)), 0);
	assert_int_equal(buf_put_str(&r->b, ""), 0);
	assert_int_equal(buf_put_u32(&r->b, 1), 0);
	assert_int_equal(buf_put_u8(&r->b, DELTA_CHUNK_RAW), 0);
	assert_int_equal(buf_put_u32(&r->b, (uint32_t)n), 0);
	assert_int_equal(buf_put(&r->b, h, sizeof(h)), 0);
	assert_int_equal(buf_put(&r->b, text, n), 0);
	if (corrupt == 3) /* the bytes, not the hashes: found only when staged (verify_deferred) */
		((uint8_t *)buf_ptr(&r->b))[buf_len(&r->b) - 1] ^= 1;
}

static void raw_put_ref(struct raw *r, const char *path, uint64_t off, const char *claimed)
{
	uint8_t h[CHUNK_HASH_LEN];
	size_t n = strlen(claimed);
	chunk_hash(claimed, n, h);
	raw_path(r, DELTA_PUT, path, strlen(path));
	assert_int_equal(buf_put_u32(&r->b, 0644), 0);
	assert_int_equal(buf_put_u64(&r->b, n), 0);
	assert_int_equal(buf_put(&r->b, h, sizeof(h)), 0);
	assert_int_equal(buf_put_str(&r->b, ""), 0);
	assert_int_equal(buf_put_u32(&r->b, 1), 0);
	assert_int_equal(buf_put_u8(&r->b, DELTA_CHUNK_REF), 0);
	assert_int_equal(buf_put_u32(&r->b, (uint32_t)n), 0);
	assert_int_equal(buf_put(&r->b, h, sizeof(h)), 0);
	assert_int_equal(buf_put_u64(&r->b, off), 0);
}

static void raw_u32(struct raw *r, uint32_t v)
{
	assert_int_equal(buf_put_u32(&r->b, v), 0);
}

static void raw_u8(struct raw *r, uint8_t v)
{
	assert_int_equal(buf_put_u8(&r->b, v), 0);
}

static void raw_str(struct raw *r, const char *s)
{
	assert_int_equal(buf_put_str(&r->b, s), 0);
}

static void raw_finish(struct raw *r, int flip_bit)
{
	uint8_t *d = (uint8_t *)buf_ptr(&r->b), *sig;
	size_t n = buf_len(&r->b);
	d[48] = (uint8_t)(r->nops >> 24);
	d[49] = (uint8_t)(r->nops >> 16);
	d[50] = (uint8_t)(r->nops >> 8);
	d[51] = (uint8_t)r->nops;
	assert_int_equal(buf_reserve(&r->b, DELTA_SIG_LEN, &sig), 0);
	delta_sign(buf_ptr(&r->b), n, sk, sig);
	buf_commit(&r->b, DELTA_SIG_LEN);
	if (flip_bit >= 0)
		((uint8_t *)buf_ptr(&r->b))[flip_bit / 8] ^= (uint8_t)(1u << (flip_bit % 8));
}

static char longname[300], longpath[4200];

static void c_dotdot(struct raw *r)
{
	raw_put(r, "../x", 4, 0644, "evil", 0);
}
static void c_dotdot_mid(struct raw *r)
{
	raw_put(r, "dir/../../x", 11, 0644, "evil", 0);
}
static void c_absolute(struct raw *r)
{
	raw_put(r, "/tmp/x", 6, 0644, "evil", 0);
}
static void c_nul(struct raw *r)
{
	raw_put(r, "ok\0/../../x", 11, 0644, "evil", 0);
}
static void c_long_component(struct raw *r)
{
	raw_put(r, longname, strlen(longname), 0644, "evil", 0);
}
static void c_long_path(struct raw *r)
{
	raw_put(r, longpath, strlen(longpath), 0644, "evil", 0);
}
static void c_reserved(struct raw *r)
{
	raw_put(r, ".airlock-tmp-x", 14, 0644, "evil", 0);
}
static void c_via_link(struct raw *r)
{
	raw_put(r, "link/evil", 9, 0644, "evil", 0);
}
static void c_via_deep_link(struct raw *r)
{
	raw_put(r, "dir/link2/evil", 14, 0644, "evil", 0);
}
static void c_mkdir_via_link(struct raw *r)
{
	raw_path(r, DELTA_MKDIR, "link/d", 6);
	raw_u32(r, 0755);
}
static void c_symlink_via_link(struct raw *r)
{
	raw_path(r, DELTA_SYMLINK, "link/s", 6);
	raw_str(r, "/etc/passwd");
}
static void c_delete_via_link(struct raw *r)
{
	raw_path(r, DELTA_DELETE, "link/x", 6);
	raw_u8(r, 0);
}
static void c_delete_tree_via_link(struct raw *r)
{
	raw_path(r, DELTA_DELETE, "dir/link2/x", 11);
	raw_u8(r, DELTA_DELETE_TREE);
}
static void c_chmod_link(struct raw *r)
{
	raw_path(r, DELTA_CHMOD, "link", 4);
	raw_u32(r, 0777);
}
static void c_chmod_via_link(struct raw *r)
{
	raw_path(r, DELTA_CHMOD, "link/x", 6);
	raw_u32(r, 0777);
}
static void c_bad_file_hash(struct raw *r)
{
	raw_put(r, "new", 3, 0644, "content", 1);
}
static void c_bad_chunk_hash(struct raw *r)
{
	raw_put(r, "new", 3, 0644, "content", 2);
}
static void c_setuid(struct raw *r)
{
	raw_put(r, "new", 3, 04755, "content", 0);
}
static void c_sticky_dir(struct raw *r)
{
	raw_path(r, DELTA_MKDIR, "newdir", 6);
	raw_u32(r, 01777);
}
static void c_fifo_mode(struct raw *r)
{
	raw_put(r, "fifo", 4, 010644, "", 0);
}
static void c_fifo_op(struct raw *r)
{
	raw_path(r, 6, "fifo", 4);
	raw_u32(r, 0644);
}
static void c_good_then_escape(struct raw *r)
{
	raw_put(r, "good.txt", 8, 0644, "fine", 0);
	c_mkdir_via_link(r);
}
static void c_good_then_missing(struct raw *r)
{
	raw_put(r, "good.txt", 8, 0644, "fine", 0);
	raw_path(r, DELTA_DELETE, "keep.txt", 8);
	raw_u8(r, 0);
	raw_path(r, DELTA_CHMOD, "missing", 7);
	raw_u32(r, 0600);
}
static void c_ref_differs(struct raw *r)
{
	raw_put(r, "good.txt", 8, 0644, "fine", 0);
	raw_put_ref(r, "keep.txt", 0, "KEEP"); /* the guest has "keep" */
}
static void c_ref_past_eof(struct raw *r)
{
	raw_put_ref(r, "keep.txt", 2, "ep and more");
}
static void c_put_over_dir(struct raw *r)
{
	raw_put(r, "dir", 3, 0644, "not a dir", 0);
}
static void c_mkdir_over_file(struct raw *r)
{
	raw_path(r, DELTA_MKDIR, "keep.txt", 8);
	raw_u32(r, 0755);
}
static void c_missing_parent(struct raw *r)
{
	raw_put(r, "good.txt", 8, 0644, "fine", 0);
	raw_put(r, "nodir/f", 7, 0644, "x", 0);
}
static void c_put_into_deleted(struct raw *r)
{
	raw_path(r, DELTA_DELETE, "dir", 3);
	raw_u8(r, DELTA_DELETE_TREE);
	raw_put(r, "dir/f2", 6, 0644, "x", 0);
}
static void c_chmod_special(struct raw *r)
{
	raw_path(r, DELTA_CHMOD, "fifo", 4);
	raw_u32(r, 0666);
}
static void c_ok(struct raw *r)
{
	raw_put(r, "new", 3, 0644, "content", 0);
}

static const struct crafted {
	const char *name;
	void (*make)(struct raw *);
	int seq_delta; /* 1 = newer; 0 = repeated; -1 = older */
	int flip_bit;  /* -1: none */
	int want;
} crafted[] = {
    {"traversal ../x", c_dotdot, 1, -1, -EBADMSG},
    {"traversal a/../../x", c_dotdot_mid, 1, -1, -EBADMSG},
    {"absolute path", c_absolute, 1, -1, -EBADMSG},
    {"NUL in path", c_nul, 1, -1, -EBADMSG},
    {"over-long component", c_long_component, 1, -1, -EBADMSG},
    {"over-long path", c_long_path, 1, -1, -EBADMSG},
    {"reserved name", c_reserved, 1, -1, -EBADMSG},
    {"PUT through symlinked dir", c_via_link, 1, -1, -ELOOP},
    {"PUT through nested symlinked dir", c_via_deep_link, 1, -1, -ELOOP},
    {"MKDIR through symlinked dir", c_mkdir_via_link, 1, -1, -ELOOP},
    {"SYMLINK through symlinked dir", c_symlink_via_link, 1, -1, -ELOOP},
    {"DELETE through symlinked dir", c_delete_via_link, 1, -1, -ELOOP},
    {"DELETE tree through symlinked dir", c_delete_tree_via_link, 1, -1, -ELOOP},
    {"CHMOD of a symlink", c_chmod_link, 1, -1, -EPERM},
    {"CHMOD through symlinked dir", c_chmod_via_link, 1, -1, -ELOOP},
    {"bad signature (header bit)", c_ok, 1, 8 * 20 + 3, -EPERM},
    {"bad signature (payload bit)", c_ok, 1, 8 * 60 + 1, -EPERM},
    {"bad signature (signature bit)", c_ok, 1, -2, -EPERM},
    {"wrong file hash", c_bad_file_hash, 1, -1, -EBADMSG},
    {"wrong chunk hash", c_bad_chunk_hash, 1, -1, -EBADMSG},
    {"repeated sequence", c_ok, 0, -1, -ESTALE},
    {"old sequence", c_ok, -1, -1, -ESTALE},
    {"setuid mode", c_setuid, 1, -1, -EBADMSG},
    {"sticky dir mode", c_sticky_dir, 1, -1, -EBADMSG},
    {"fifo type bits in mode", c_fifo_mode, 1, -1, -EBADMSG},
    {"unknown (mknod-like) op", c_fifo_op, 1, -1, -EBADMSG},
    {"good op, then escape", c_good_then_escape, 1, -1, -ELOOP},
    {"good ops, then missing path", c_good_then_missing, 1, -1, -ENOENT},
    {"reference to bytes the guest lacks", c_ref_differs, 1, -1, -EBADMSG},
    {"reference past end of file", c_ref_past_eof, 1, -1, -EBADMSG},
    {"PUT over a directory", c_put_over_dir, 1, -1, -EISDIR},
    {"MKDIR over a file", c_mkdir_over_file, 1, -1, -EEXIST},
    {"PUT with missing parent", c_missing_parent, 1, -1, -ENOENT},
    {"PUT into a deleted directory", c_put_into_deleted, 1, -1, -ENOENT},
    {"CHMOD of a fifo", c_chmod_special, 1, -1, -EPERM},
};

/* the guest of the crafted batches: a few files, a directory, links
 * pointing outside */
static void crafted_fixture(struct env *e)
{
	tu_put_file(e->gfd, "keep.txt", "keep", 4, 0644);
	assert_int_equal(mkdirat(e->gfd, "dir", 0755), 0);
	tu_put_file(e->gfd, "dir/f", "f", 1, 0644);
	char target[200];
	snprintf(target, sizeof(target), "%s", e->outside);
	assert_int_equal(symlinkat(target, e->gfd, "link"), 0);
	assert_int_equal(symlinkat("../../outside", e->gfd, "dir/link2"), 0);
	assert_int_equal(mkfifoat(e->gfd, "fifo", 0644), 0);
}

static void test_crafted_refused(void **state)
{
	struct env *e = *state;
	memset(longname, 'n', 256);
	longname[256] = '\0';
	for (size_t i = 0; i < 4097; i++)
		longpath[i] = i % 64 == 63 ? '/' : 'p';
	longpath[4097] = '\0';

	crafted_fixture(e);
	apply_set_last_seq(e->a, 100);

	struct buf g0, o0;
	snapshot(e->gfd, &g0);
	snapshot(e->ofd, &o0);
	for (size_t i = 0; i < sizeof(crafted) / sizeof(crafted[0]); i++) {
		const struct crafted *c = &crafted[i];
		struct raw r;
		raw_begin(&r, (uint64_t)(100 + c->seq_delta));
		c->make(&r);
		raw_finish(&r, c->flip_bit == -2 ? (int)(buf_len(&r.b) - 30) * 8 : c->flip_bit);
		struct apply_stats st;
		int got = deliver(e, buf_ptr(&r.b), buf_len(&r.b), &st);
		if (got == 0) {
			/* refused as an op of its own: listed with its errno, the
			 * rest of the batch applied (undone below) */
			size_t nf;
			const struct apply_failure *f = apply_failures(e->a, &nf, NULL);
			if (!nf || f[nf - 1].err != -c->want || st.failed != nf)
				fail_msg("%s: want op failure %d, got %zu failures (%s)", c->name, c->want, nf,
					 nf ? strerror(f[nf - 1].err) : "-");
			char cmd[256];
			snprintf(cmd, sizeof(cmd), "rm -rf '%s'/* '%s'/.[!.]*", e->guest, e->guest);
			assert_int_equal(system(cmd), 0);
			crafted_fixture(e);
			apply_set_last_seq(e->a, 100);
		} else if (got != c->want) {
			fail_msg("%s: want %d got %d (%s)", c->name, c->want, got, apply_error(e->a));
		}
		assert_false(st.partial);
		buf_clear(&r.b);
		/* nothing changed, inside or outside, and no temporaries */
		struct buf g1, o1;
		snapshot(e->gfd, &g1);
		snapshot(e->ofd, &o1);
		assert_same(&g0, &g1);
		assert_same(&o0, &o1);
		buf_clear(&g1);
		buf_clear(&o1);
		assert_int_equal(apply_last_seq(e->a), 100);
	}
	/* and the control: the same machinery accepts a good batch */
	struct raw r;
	raw_begin(&r, 101);
	c_ok(&r);
	raw_finish(&r, -1);
	assert_int_equal(deliver(e, buf_ptr(&r.b), buf_len(&r.b), NULL), 0);
	assert_int_equal(apply_last_seq(e->a), 101);
	buf_clear(&r.b);
	/* replacing the symlink itself with a file is fine, and leaves its
	 * old target alone */
	raw_begin(&r, 102);
	raw_put(&r, "link", 4, 0644, "now a file", 0);
	raw_finish(&r, -1);
	assert_int_equal(deliver(e, buf_ptr(&r.b), buf_len(&r.b), NULL), 0);
	buf_clear(&r.b);
	struct stat s;
	assert_int_equal(fstatat(e->gfd, "link", &s, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISREG(s.st_mode));
	struct buf o1;
	snapshot(e->ofd, &o1);
	assert_same(&o0, &o1);
	buf_clear(&o1);
	buf_clear(&g0);
	buf_clear(&o0);
}

/* A batch that makes and replaces directories stages through the root's
 * staging directory, and leaves it behind neither on success nor on a
 * failure before commit. */
static void test_staging_dir(void **state)
{
	struct env *e = *state;
	struct apply_stats st;
	tu_put_file(e->gfd, "a", "was a file", 10, 0644);
	struct raw r;
	raw_begin(&r, 1);
	raw_path(&r, DELTA_DELETE, "a", 1);
	raw_u8(&r, 0);
	raw_path(&r, DELTA_MKDIR, "a", 1);
	raw_u32(&r, 0750);
	raw_path(&r, DELTA_MKDIR, "a/b", 3);
	raw_u32(&r, 0700);
	raw_put(&r, "a/b/f", 5, 0600, "deep", 0);
	raw_path(&r, DELTA_SYMLINK, "a/ln", 4);
	raw_str(&r, "b/f");
	raw_finish(&r, -1);
	assert_int_equal(deliver(e, buf_ptr(&r.b), buf_len(&r.b), &st), 0);
	buf_clear(&r.b);
	assert_int_equal(st.dirs, 2);
	char buf[8];
	int fd = openat(e->gfd, "a/ln", O_RDONLY); /* our test follows it; apply never does */
	assert_int_equal(read(fd, buf, sizeof(buf)), 4);
	close(fd);
	struct stat s;
	assert_int_equal(fstatat(e->gfd, "a", &s, 0), 0);
	assert_int_equal(s.st_mode & 0777, 0750);
	struct buf g0;
	snapshot(e->gfd, &g0); /* also checks no temporaries are left */

	/* same shape, failing at the last staged op: nothing visible */
	raw_begin(&r, 2);
	raw_path(&r, DELTA_DELETE, "a", 1);
	raw_u8(&r, DELTA_DELETE_TREE);
	raw_path(&r, DELTA_MKDIR, "a", 1);
	raw_u32(&r, 0755);
	raw_put(&r, "a/g", 3, 0600, "x", 0);
	raw_put(&r, "a/h", 3, 0600, "y", 1); /* wrong file hash */
	raw_finish(&r, -1);
	assert_int_equal(deliver(e, buf_ptr(&r.b), buf_len(&r.b), &st), -EBADMSG);
	buf_clear(&r.b);
	struct buf g1;
	snapshot(e->gfd, &g1);
	assert_same(&g0, &g1);
	buf_clear(&g0);
	buf_clear(&g1);
}

/* Allocation failures inside apply: an error and an unchanged tree, never
 * a crash or a leak. */
static void test_apply_alloc_failures(void **state)
{
	struct env *e = *state;
	build_host_tree(e->hfd);
	uint8_t *bytes;
	size_t n;
	make_sync_batch(e, &bytes, &n);
	struct delta_batch *b;
	assert_int_equal(delta_batch_verify(bytes, n, pk, scope, 0, NULL, &b, NULL, 0), 0);
	struct buf g0;
	snapshot(e->gfd, &g0);
	int r = -ENOMEM;
	for (unsigned long k = 1; r == -ENOMEM && k < 1000; k++) {
		struct apply_stats st;
		mem_fail_at(k, 0);
		r = apply_batch(e->a, b, &st);
		mem_fail_at(0, 0);
		if (r == -ENOMEM) {
			assert_false(st.partial);
			struct buf g1;
			snapshot(e->gfd, &g1);
			assert_same(&g0, &g1);
			buf_clear(&g1);
		}
	}
	assert_int_equal(r, 0);
	delta_batch_free(b);
	mem_free(bytes);
	buf_clear(&g0);
}

/* ---- modes the way rsync applies them, as an ordinary uid ----
 * Run in a child that is not root (the agent is not root in the guest):
 * root's CAP_DAC_OVERRIDE would hide every EACCES. */
#define MODES_UID 65533u
#define CK(c)                                                                                                          \
	do {                                                                                                           \
		if (!(c)) {                                                                                            \
			fprintf(stderr, "rsync modes, line %d: %s\n", __LINE__, #c);                                   \
			_exit(1);                                                                                      \
		}                                                                                                      \
	} while (0)

static unsigned mode_at(int dfd, const char *p)
{
	struct stat st;
	return fstatat(dfd, p, &st, AT_SYMLINK_NOFOLLOW) == 0 ? st.st_mode & 07777 : 010000;
}

static bool text_at(int dfd, const char *p, const char *want)
{
	char b[64] = "";
	int fd = openat(dfd, p, O_RDONLY);
	ssize_t n = fd >= 0 ? read(fd, b, sizeof(b) - 1) : -1;
	if (fd >= 0)
		close(fd);
	return n >= 0 && (size_t)n == strlen(want) && !memcmp(b, want, (size_t)n);
}

static void modes_child(const char *root, const struct apply_opts *opts)
{
	struct env ce = {0};
	struct apply_stats st;
	struct raw r;
	size_t nf;
	int g = open(root, O_RDONLY | O_DIRECTORY);

	CK(setresgid(MODES_UID, MODES_UID, MODES_UID) == 0 && setresuid(MODES_UID, MODES_UID, MODES_UID) == 0);
	CK(g >= 0 && mkdirat(g, "ro", 0755) == 0);
	tu_put_file(g, "ro/f", "in ro", 5, 0644);
	CK(fchmodat(g, "ro", 0555, 0) == 0);
	tu_put_file(g, "keep.txt", "keep", 4, 0000);
	CK(apply_open(root, opts, &ce.a) == 0);

	/* chmod 555 ro; mv ro ro2 (a rename is a delete and a put) */
	raw_begin(&r, 1);
	raw_path(&r, DELTA_MKDIR, "ro2", 3);
	raw_u32(&r, 0555);
	raw_put(&r, "ro2/f", 5, 0644, "in ro", 0);
	raw_path(&r, DELTA_DELETE, "ro/f", 4);
	raw_u8(&r, 0);
	raw_path(&r, DELTA_DELETE, "ro", 2);
	raw_u8(&r, 0);
	raw_finish(&r, -1);
	CK(deliver(&ce, buf_ptr(&r.b), buf_len(&r.b), &st) == 0 && st.failed == 0);
	buf_clear(&r.b);
	CK(mode_at(g, "ro") == 010000 && mode_at(g, "ro2") == 0555 && text_at(g, "ro2/f", "in ro"));
	/* a file created inside the 0555 directory: staged apart, renamed in, mode kept */
	raw_begin(&r, 2);
	raw_put(&r, "ro2/new", 7, 0644, "new", 0);
	raw_path(&r, DELTA_SYMLINK, "ro2/ln", 6);
	raw_str(&r, "new");
	raw_finish(&r, -1);
	CK(deliver(&ce, buf_ptr(&r.b), buf_len(&r.b), &st) == 0 && st.failed == 0);
	buf_clear(&r.b);
	CK(text_at(g, "ro2/new", "new") && mode_at(g, "ro2") == 0555);
	/* an in-place edit of a mode 000 file reads its old content */
	raw_begin(&r, 3);
	raw_put_ref(&r, "keep.txt", 0, "keep");
	raw_finish(&r, -1);
	CK(deliver(&ce, buf_ptr(&r.b), buf_len(&r.b), &st) == 0 && st.failed == 0);
	buf_clear(&r.b);
	CK(mode_at(g, "keep.txt") == 0644 && text_at(g, "keep.txt", "keep"));
	/* a 0200 file whose reference does not match: that op fails, its mode is restored */
	CK(fchmodat(g, "keep.txt", 0200, 0) == 0);
	raw_begin(&r, 4);
	raw_put_ref(&r, "keep.txt", 0, "KEEP");
	raw_finish(&r, -1);
	CK(deliver(&ce, buf_ptr(&r.b), buf_len(&r.b), &st) == 0 && st.failed == 1);
	buf_clear(&r.b);
	const struct apply_failure *f = apply_failures(ce.a, &nf, NULL);
	CK(nf == 1 && f[0].op == 0 && f[0].err == EBADMSG && mode_at(g, "keep.txt") == 0200);
	/* a directory the agent does not own: those ops fail on their own, in op order */
	raw_begin(&r, 5);
	raw_put(&r, "rootdir/x", 9, 0644, "x", 0);
	raw_put(&r, "ok.txt", 6, 0644, "ok", 0);
	raw_path(&r, DELTA_MKDIR, "rootdir/d", 9);
	raw_u32(&r, 0755);
	raw_path(&r, DELTA_DELETE, "rootdir/f", 9);
	raw_u8(&r, 0);
	raw_finish(&r, -1);
	CK(deliver(&ce, buf_ptr(&r.b), buf_len(&r.b), &st) == 0);
	buf_clear(&r.b);
	f = apply_failures(ce.a, &nf, NULL);
	CK(st.failed == 3 && nf == 3 && f[0].op == 0 && f[1].op == 2 && f[2].op == 3);
	CK(f[0].err == EACCES && f[1].err == EACCES && f[2].err == EACCES && strstr(f[0].msg, "Permission denied"));
	CK(text_at(g, "ok.txt", "ok") && text_at(g, "rootdir/f", "root's") && apply_last_seq(ce.a) == 5);
	/* rm -rf of the read-only directory */
	raw_begin(&r, 6);
	raw_path(&r, DELTA_DELETE, "ro2", 3);
	raw_u8(&r, DELTA_DELETE_TREE);
	raw_finish(&r, -1);
	CK(deliver(&ce, buf_ptr(&r.b), buf_len(&r.b), &st) == 0 && st.failed == 0);
	buf_clear(&r.b);
	CK(mode_at(g, "ro2") == 010000);
	/* a file too large for the guest (EFBIG: its file size limit) fails alone */
	static char large[8193];
	memset(large, 'L', sizeof(large) - 1);
	struct rlimit fs = {.rlim_cur = 4096, .rlim_max = 4096};
	CK(signal(SIGXFSZ, SIG_IGN) != SIG_ERR && setrlimit(RLIMIT_FSIZE, &fs) == 0);
	raw_begin(&r, 7);
	raw_put(&r, "large", 5, 0644, large, 0);
	raw_put(&r, "fits", 4, 0644, "fits", 0);
	raw_finish(&r, -1);
	CK(deliver(&ce, buf_ptr(&r.b), buf_len(&r.b), &st) == 0 && st.failed == 1);
	buf_clear(&r.b);
	f = apply_failures(ce.a, &nf, NULL);
	CK(nf == 1 && f[0].op == 0 && f[0].err == EFBIG && mode_at(g, "large") == 010000 && text_at(g, "fits", "fits"));
	apply_free(ce.a);
	_exit(0);
}

static void test_rsync_modes(void **state)
{
	struct env *e = *state;
	char root[128];
	int status;

	if (geteuid() != 0) {
		print_message("skipped: needs root to run the apply as another uid\n");
		skip();
	}
	snprintf(root, sizeof(root), "%s/nr", e->base);
	assert_int_equal(mkdir(root, 0755), 0);
	assert_int_equal(chown(e->base, MODES_UID, MODES_UID), 0);
	assert_int_equal(chown(root, MODES_UID, MODES_UID), 0);
	int rfd = open(root, O_RDONLY | O_DIRECTORY);
	assert_int_equal(mkdirat(rfd, "rootdir", 0755), 0); /* root's: the agent cannot change it */
	tu_put_file(rfd, "rootdir/f", "root's", 6, 0644);
	close(rfd);
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0)
		modes_child(root, e->opts);
	assert_int_equal(waitpid(pid, &status, 0), pid);
	assert_true(WIFEXITED(status));
	assert_int_equal(WEXITSTATUS(status), 0);
}

/* ---- parallel staging ----
 * The same batch applied with one stager and with four (forced for any
 * batch, apply_opts.threads) must give the same tree, the same stats and
 * the same per-op failures in op order, with failures in the middle of
 * the batch (in the check and in the staging), a read-only directory,
 * hard links, symlinks and NAME_MAX names; and apply_batch_whole the same
 * error for the first failing op with the tree untouched. As root and, in
 * a child, as an unprivileged owner (where the read-only directory really
 * refuses and its files are staged apart). */

static const struct apply_opts par_one = {.fsync = APPLY_FSYNC_NONE, .threads = 1};
static const struct apply_opts par_four = {.fsync = APPLY_FSYNC_NONE, .threads = 4};

struct par_result {
	int r;
	struct apply_stats st;
	size_t nf;
	uint64_t total;
	struct apply_failure f[32];
	char err[512];
	struct buf tree;
};

static void par_prestate(int g)
{
	CK(mkdirat(g, "ro", 0755) == 0);
	tu_put_file(g, "ro/old", "old", 3, 0644);
	CK(fchmodat(g, "ro", 0555, 0) == 0);
	CK(mkdirat(g, "isdir", 0755) == 0);
	CK(mkdirat(g, "gone", 0755) == 0);
	tu_put_file(g, "gone/x", "x", 1, 0644);
	tu_put_file(g, "edit.txt", "old content", 11, 0644);
	tu_put_file(g, "bad.txt", "aaa", 3, 0644);
	CK(mkdirat(g, "p", 0755) == 0);
	tu_put_file(g, "p/x", "unmanaged", 9, 0644);
}

/* The tree under dfd, encoded, or NULL with a temporary lying around. */
static bool par_tree(int dfd, struct buf *out)
{
	struct counted c = {0};
	struct manifest_scan_opts o = {.chunking = &small, .skipped = count_reserved, .skipped_ud = &c};
	struct manifest *m;
	buf_init(out, 64u << 20);
	if (manifest_scan(dfd, &o, &m) < 0)
		return false;
	bool ok = manifest_encode(m, out) == 0 && c.reserved == 0;
	manifest_free(m);
	return ok;
}

/* Apply the batches in order to a fresh root (prestate or empty) with
 * opts; the result of the last one. */
static bool par_apply(const char *root, const struct apply_opts *opts, bool prestate, struct buf *batches, size_t nb,
		      bool whole, struct par_result *res)
{
	struct apply *a;
	int g;

	if (mkdir(root, 0755) < 0 || (g = open(root, O_RDONLY | O_DIRECTORY)) < 0)
		return false;
	if (prestate)
		par_prestate(g);
	if (apply_open(root, opts, &a) < 0)
		return false;
	memset(res, 0, sizeof(*res));
	for (size_t k = 0; k < nb; k++) {
		struct delta_batch *b;
		char err[256];
		/* content checked while staged, as the agent does */
		if (delta_batch_verify_deferred(buf_ptr(&batches[k]), buf_len(&batches[k]), pk, scope,
						apply_last_seq(a), NULL, &b, err, sizeof(err)) < 0) {
			fprintf(stderr, "batch refused: %s\n", err);
			return false;
		}
		res->r = whole ? apply_batch_whole(a, b, &res->st) : apply_batch(a, b, &res->st);
		delta_batch_free(b);
	}
	const struct apply_failure *f = apply_failures(a, &res->nf, &res->total);
	if (res->nf > 32)
		return false;
	if (res->nf)
		memcpy(res->f, f, res->nf * sizeof(*f));
	snprintf(res->err, sizeof(res->err), "%s", apply_error(a));
	apply_free(a);
	bool ok = par_tree(g, &res->tree);
	close(g);
	return ok;
}

static bool par_same(const struct par_result *x, const struct par_result *y, bool same_err)
{
	/* a failed batch's byte counts say how far its staging got: not compared */
	if (x->r != y->r || (x->r == 0 && memcmp(&x->st, &y->st, sizeof(x->st)) != 0) || x->st.ops != y->st.ops ||
	    x->st.partial != y->st.partial || x->nf != y->nf || x->total != y->total ||
	    buf_len(&x->tree) != buf_len(&y->tree) || memcmp(buf_ptr(&x->tree), buf_ptr(&y->tree), buf_len(&x->tree)))
		return false;
	for (size_t k = 0; k < x->nf; k++)
		if (x->f[k].op != y->f[k].op || x->f[k].err != y->f[k].err || strcmp(x->f[k].msg, y->f[k].msg) != 0)
			return false;
	return !same_err || strcmp(x->err, y->err) == 0;
}

/* The crafted batch: failures in the check and in the staging, spread
 * over the batch. */
static void par_crafted(struct buf *out, uint64_t seq)
{
	static char maxname[256];
	struct raw r;
	char p[64], text[128];

	memset(maxname, 'n', 255);
	raw_begin(&r, seq);
	raw_path(&r, DELTA_MKDIR, "d", 1); /* 0 */
	raw_u32(&r, 0755);
	for (int k = 0; k < 60; k++) { /* 1..60; 8, 24, 42 have bytes that do not match */
		snprintf(p, sizeof(p), "d/f%02d", k);
		snprintf(text, sizeof(text), "file %d of the batch, with some text to write %0*d", k, k % 50 + 1, k);
		raw_put(&r, p, strlen(p), k % 3 ? 0644 : 0755, text, k == 7 || k == 23 || k == 41 ? 3 : 0);
	}
	raw_put(&r, "isdir", 5, 0644, "over a directory", 0);  /* 61: EISDIR in the check */
	raw_put(&r, maxname, 255, 0600, "a NAME_MAX name", 0); /* 62 */
	raw_path(&r, DELTA_SYMLINK, "d/ln", 4);		       /* 63 */
	raw_str(&r, "f01");
	raw_put(&r, "ro/new", 6, 0644, "into the read-only directory", 0); /* 64 */
	raw_put_ref(&r, "edit.txt", 0, "old content");			   /* 65: references, right */
	raw_put_ref(&r, "bad.txt", 0, "bbb");				   /* 66: references, wrong */
	raw_path(&r, DELTA_DELETE, "gone", 4);				   /* 67 */
	raw_u8(&r, DELTA_DELETE_TREE);
	raw_put(&r, "gone/y", 6, 0644, "its directory is gone", 0); /* 68: ENOENT in the check */
	raw_path(&r, DELTA_MKDIR, "e", 1);			    /* 69 */
	raw_u32(&r, 0700);
	for (int k = 0; k < 40; k++) { /* 70..109: staged apart (e is made in the batch); 90 bad */
		snprintf(p, sizeof(p), "e/g%02d", k);
		snprintf(text, sizeof(text), "in e: %d", k);
		raw_put(&r, p, strlen(p), 0644, text, k == 20 ? 3 : 0);
	}
	raw_put(&r, "ro/old", 6, 0444, "replaced in the read-only directory", 0); /* 110 */
	/* a name not looked at by the check (its directory is deleted and
	 * made again first) that is taken at the commit (the delete kept the
	 * directory for a file the host does not manage): the new-name link
	 * finds it taken and the file is replaced as any other */
	raw_path(&r, DELTA_DELETE, "p", 1); /* 111 */
	raw_u8(&r, 0);
	raw_path(&r, DELTA_MKDIR, "p", 1); /* 112 */
	raw_u32(&r, 0755);
	raw_put(&r, "p/x", 3, 0600, "new x", 0); /* 113 */
	raw_finish(&r, -1);
	*out = r.b;
}

/* A host tree synced whole: many directories, hard links, a sparse file,
 * empty files, NAME_MAX names, symlinks. */
static void par_host_batch(struct env *e, struct buf *out)
{
	static uint8_t data[9000];
	char p[300];

	memset(p, 'h', 255);
	p[255] = '\0';
	tu_put_file(e->hfd, p, "long", 4, 0644);
	for (int d = 0; d < 6; d++) {
		snprintf(p, sizeof(p), "dir%d", d);
		assert_int_equal(mkdirat(e->hfd, p, d == 5 ? 0555 : 0755), 0);
		for (int k = 0; k < 30; k++) {
			snprintf(p, sizeof(p), "dir%d/file%02d.c", d, k);
			tu_fill(data, sizeof(data), (uint32_t)(d * 100 + k));
			size_t n = (size_t)(k * 277 % 9000);
			if (k % 7 == 0)
				memset(data + n / 2, 0, n - n / 2); /* ends in zeros */
			tu_put_file(e->hfd, p, data, n, k % 4 ? 0644 : 0600);
		}
		if (d == 5)
			assert_int_equal(fchmodat(e->hfd, "dir5", 0755, 0), 0);
	}
	assert_int_equal(linkat(e->hfd, "dir0/file01.c", e->hfd, "dir1/hardlink.c", 0), 0);
	assert_int_equal(linkat(e->hfd, "dir0/file01.c", e->hfd, "hardlink-top", 0), 0);
	assert_int_equal(symlinkat("dir0/file02.c", e->hfd, "dir2/ln"), 0);
	int fd = openat(e->hfd, "sparse.img", O_WRONLY | O_CREAT, 0644);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, 1 << 20), 0);
	assert_int_equal(pwrite(fd, "x", 1, 4096), 1);
	close(fd);
	assert_int_equal(fchmodat(e->hfd, "dir5", 0555, 0), 0);
	uint8_t *bytes;
	size_t n;
	make_sync_batch(e, &bytes, &n);
	buf_init(out, 64u << 20);
	assert_int_equal(buf_put(out, bytes, n), 0);
	mem_free(bytes);
}

/* Every comparison under `base`; "" or what differed. */
static const char *par_compare(const char *base, struct buf *cb, struct buf *host)
{
	struct par_result x, y;
	char r1[160], r2[160];
	static const char *why[] = {"the crafted batch", "apply_batch_whole", "the host tree"};

	for (int c = 0; c < 3; c++) {
		snprintf(r1, sizeof(r1), "%s/one%d", base, c);
		snprintf(r2, sizeof(r2), "%s/four%d", base, c);
		struct buf *bt = c < 2 ? cb : host;
		if (!par_apply(r1, &par_one, c < 2, bt, 1, c == 1, &x) ||
		    !par_apply(r2, &par_four, c < 2, bt, 1, c == 1, &y))
			return why[c];
		bool ok = par_same(&x, &y, c == 1);
		int g1 = open(r1, O_RDONLY | O_DIRECTORY);
		if (c == 0) /* the failures it was built with, all of them; p/x replaced */
			ok = ok && x.r == 0 && x.nf == 7 && x.st.files == 101 && x.st.kept_dirs == 1 &&
			     text_at(g1, "p/x", "new x") && mode_at(g1, "p/x") == 0600 && x.f[0].op == 8 &&
			     x.f[1].op == 24 && x.f[2].op == 42 && x.f[3].op == 61 && x.f[4].op == 66 &&
			     x.f[5].op == 68 && x.f[6].op == 90;
		if (c == 1) /* the first failure is the batch's, nothing applied */
			ok = ok && x.r == -EBADMSG && strstr(x.err, "op 8 ") != NULL && x.st.ops == 0;
		if (c == 2)
			ok = ok && x.r == 0 && x.nf == 0;
		close(g1);
		buf_clear(&x.tree);
		buf_clear(&y.tree);
		if (!ok)
			return why[c];
	}
	return "";
}

static void test_parallel_same_as_serial(void **state)
{
	struct env *e = *state;
	struct buf cbatch, host;
	char base[128];
	int status;

	par_crafted(&cbatch, 1);
	par_host_batch(e, &host);
	snprintf(base, sizeof(base), "%s/par", e->base);
	assert_int_equal(mkdir(base, 0755), 0);
	const char *d = par_compare(base, &cbatch, &host);
	if (*d)
		fail_msg("one stager and four differ on %s", d);
	if (geteuid() == 0) { /* again as an owner the read-only directory refuses */
		snprintf(base, sizeof(base), "%s/paru", e->base);
		assert_int_equal(mkdir(base, 0755), 0);
		assert_int_equal(chown(e->base, MODES_UID, MODES_UID), 0); /* to reach base */
		assert_int_equal(chown(base, MODES_UID, MODES_UID), 0);
		fflush(NULL);
		pid_t pid = fork();
		assert_true(pid >= 0);
		if (pid == 0) {
			CK(setresgid(MODES_UID, MODES_UID, MODES_UID) == 0 &&
			   setresuid(MODES_UID, MODES_UID, MODES_UID) == 0);
			d = par_compare(base, &cbatch, &host);
			if (*d)
				fprintf(stderr, "as uid %u: one stager and four differ on %s\n", MODES_UID, d);
			_exit(*d ? 1 : 0);
		}
		assert_int_equal(waitpid(pid, &status, 0), pid);
		assert_true(WIFEXITED(status));
		assert_int_equal(WEXITSTATUS(status), 0);
	}
	buf_clear(&cbatch);
	buf_clear(&host);
}

/* Every entry below dfd (not dfd itself) is uid:gid's; how many. */
static size_t owned_below(int dfd, uid_t uid, gid_t gid)
{
	int fd = dup(dfd);
	DIR *d = fdopendir(fd);
	struct dirent *de;
	size_t n = 0;

	assert_non_null(d);
	rewinddir(d);
	while ((de = readdir(d))) {
		struct stat st;
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		assert_int_equal(fstatat(dirfd(d), de->d_name, &st, AT_SYMLINK_NOFOLLOW), 0);
		if (st.st_uid != uid || st.st_gid != gid)
			fail_msg("%s: owned by %u:%u, not %u:%u", de->d_name, (unsigned)st.st_uid, (unsigned)st.st_gid,
				 (unsigned)uid, (unsigned)gid);
		n++;
		if (S_ISDIR(st.st_mode)) {
			int sub = openat(dirfd(d), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			assert_true(sub >= 0);
			n += owned_below(sub, uid, gid);
			close(sub);
		}
	}
	closedir(d);
	return n;
}

/* With apply_opts.own (a root agent, commands as another user): every
 * file, directory and link the apply makes, new or replaced, cloned or
 * written whole, is that user's. */
static void test_owner(void **state)
{
	struct env *e = *state;
	struct apply_stats st;

	if (geteuid() != 0) {
		skip(); /* chown to another user needs root */
		return;
	}
	build_host_tree(e->hfd);
	sync_and_check(e, &st);
	assert_true(owned_below(e->gfd, OWNER, OWNER) >= 10);
	/* an edit in place (a clone or a copy of the old file), a replaced
	 * small file, a new directory with a file and a link, a mode change */
	int fd = openat(e->hfd, "src/lib/big.bin", O_WRONLY);
	assert_int_equal(pwrite(fd, "Z", 1, 25000), 1);
	close(fd);
	tu_put_file(e->hfd, "src/main.c", "int main(void) { return 1; }\n", 29, 0644);
	assert_int_equal(mkdirat(e->hfd, "new", 0755), 0);
	tu_put_file(e->hfd, "new/file", "n", 1, 0600);
	assert_int_equal(symlinkat("file", e->hfd, "new/link"), 0);
	assert_int_equal(fchmodat(e->hfd, "empty", 0711, 0), 0);
	sync_and_check(e, &st);
	assert_int_equal(st.files, 3);
	assert_true(owned_below(e->gfd, OWNER, OWNER) >= 13);
}

#define BOTH(t)                                                                                                        \
	cmocka_unit_test_prestate_setup_teardown(t, setup, teardown, (void *)&mode_default),                           \
	    cmocka_unit_test_prestate_setup_teardown(t, setup, teardown, (void *)&mode_fallback)

int main(void)
{
	assert_true(sodium_init() >= 0);
	crypto_sign_keypair(pk, sk);
	randombytes_buf(scope, sizeof(scope));
	const struct CMUnitTest tests[] = {
	    BOTH(test_full_and_incremental_sync),
	    BOTH(test_unmanaged_paths_survive),
	    BOTH(test_move_by_reference_and_seq),
	    BOTH(test_inplace_edit_cloned),
	    BOTH(test_sparse_stays_sparse),
	    BOTH(test_crash_leftovers_cleaned),
	    BOTH(test_tree_delete_never_follows),
	    BOTH(test_crafted_refused),
	    BOTH(test_staging_dir),
	    BOTH(test_rsync_modes),
	    BOTH(test_apply_alloc_failures),
	    BOTH(test_parallel_same_as_serial),
	    cmocka_unit_test_prestate_setup_teardown(test_owner, setup, teardown, (void *)&mode_default_own),
	    cmocka_unit_test_prestate_setup_teardown(test_owner, setup, teardown, (void *)&mode_fallback_own),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
