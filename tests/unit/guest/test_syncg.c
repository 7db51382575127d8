/* SPDX-License-Identifier: Apache-2.0 */
/* syncg: the guest's sync state. The sequence survives an agent restart
 * (an old batch replayed is refused), a batch is bound to its scope and
 * its signer, the state directory must not be inside the root. The guest
 * against the host's engine over a real session is tested in
 * sync/test_sync.c. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "testutil.h"

#include "airlock/content/delta.h"
#include "airlock/content/syncmsg.h"
#include "airlock/core/mem.h"
#include "airlock/guest/syncg.h"

static char dir[64];
static uint8_t hpk[32], hsk[64], gpub[32];

static int setup(void **state)
{
	(void)state;
	tu_tmpdir(dir, sizeof(dir), "test-syncg");
	crypto_sign_keypair(hpk, hsk);
	randombytes_buf(gpub, sizeof(gpub));
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	tu_rm_rf(dir);
	return 0;
}

static void batch(uint64_t seq, const uint8_t *guest, const char *name, uint8_t **out, size_t *n)
{
	uint8_t scope[DELTA_SCOPE_LEN];
	struct delta_builder *b;
	syncmsg_scope(guest, hpk, scope);
	assert_int_equal(delta_builder_new(seq, scope, NULL, &syncmsg_delta_caps, &b), 0);
	assert_int_equal(delta_add_mkdir(b, name, 0755), 0);
	assert_int_equal(delta_builder_finish(b, hsk, out, n), 0);
	delta_builder_free(b);
}

static void test_seq_persisted(void **state)
{
	(void)state;
	char root[128], err[512];
	struct syncg *g;
	uint8_t *b1, *b2, *bx;
	size_t n1, n2, nx;

	snprintf(root, sizeof(root), "%s/root", dir);
	assert_int_equal(mkdir(root, 0755), 0);
	assert_int_equal(syncg_open(root, NULL, NULL, gpub, &g, err, sizeof(err)), 0);
	assert_int_equal(syncg_last_seq(g), 0);
	batch(1, gpub, "a", &b1, &n1);
	batch(2, gpub, "b", &b2, &n2);
	assert_int_equal(syncg_apply_batch(g, b1, n1, hpk, NULL, err, sizeof(err)), 0);
	assert_int_equal(syncg_apply_batch(g, b2, n2, hpk, NULL, err, sizeof(err)), 0);
	assert_int_equal(syncg_last_seq(g), 2);
	syncg_free(g);

	/* "restart": a new handle reads the persisted sequence */
	assert_int_equal(syncg_open(root, NULL, NULL, gpub, &g, err, sizeof(err)), 0);
	assert_int_equal(syncg_last_seq(g), 2);
	assert_int_equal(syncg_apply_batch(g, b1, n1, hpk, NULL, err, sizeof(err)), -ESTALE);
	assert_int_equal(syncg_apply_batch(g, b2, n2, hpk, NULL, err, sizeof(err)), -ESTALE);
	assert_non_null(strstr(err, "refused"));

	/* a batch scoped for another guest is refused, and writes nothing */
	uint8_t other[32];
	randombytes_buf(other, sizeof(other));
	batch(3, other, "c", &bx, &nx);
	assert_int_equal(syncg_apply_batch(g, bx, nx, hpk, NULL, err, sizeof(err)), -EPERM);
	char p[160];
	snprintf(p, sizeof(p), "%s/c", root);
	assert_int_equal(access(p, F_OK), -1);
	/* a signature by another key is refused */
	uint8_t opk[32], osk[64];
	crypto_sign_keypair(opk, osk);
	assert_int_equal(syncg_apply_batch(g, b2, n2, opk, NULL, err, sizeof(err)), -EPERM);
	syncg_free(g);
	mem_free(b1);
	mem_free(b2);
	mem_free(bx);
}

static void apply_seq(struct syncg *g, uint64_t seq, const char *name)
{
	char err[512];
	uint8_t *b;
	size_t n;
	batch(seq, gpub, name, &b, &n);
	assert_int_equal(syncg_apply_batch(g, b, n, hpk, NULL, err, sizeof(err)), 0);
	mem_free(b);
}

/* --fsync none: the sequence file is rewritten in place; it reads back
 * exactly after it grows a digit, and after a durable handle wrote it. */
static void test_seq_in_place(void **state)
{
	(void)state;
	static const struct apply_opts none = {.fsync = APPLY_FSYNC_NONE};
	char root[128], seqf[192], text[160] = {0}, err[512];
	struct syncg *g;

	snprintf(root, sizeof(root), "%s/inplace", dir);
	assert_int_equal(mkdir(root, 0755), 0);
	snprintf(seqf, sizeof(seqf), "%s.airlock-state/%s", root, SYNCG_SEQ_FILE);
	assert_int_equal(syncg_open(root, NULL, NULL, gpub, &g, err, sizeof(err)), 0);
	apply_seq(g, 8, "durable");
	syncg_free(g);
	assert_int_equal(syncg_open(root, NULL, &none, gpub, &g, err, sizeof(err)), 0);
	assert_int_equal(syncg_last_seq(g), 8);
	apply_seq(g, 9, "a");
	apply_seq(g, 10, "b");
	assert_int_equal(syncg_last_seq(g), 10);
	FILE *f = fopen(seqf, "r");
	assert_non_null(f);
	size_t len = fread(text, 1, sizeof(text) - 1, f);
	fclose(f);
	/* "SEQ GEN ROOT-ID\n", nothing of the shorter "9 ..." line left */
	assert_true(len > 3 && !strncmp(text, "10 ", 3) && strchr(text, '\n') == text + len - 1);
	syncg_free(g);
	assert_int_equal(syncg_open(root, NULL, &none, gpub, &g, err, sizeof(err)), 0);
	assert_int_equal(syncg_last_seq(g), 10);
	uint8_t *b;
	size_t n;
	batch(10, gpub, "again", &b, &n);
	assert_int_equal(syncg_apply_batch(g, b, n, hpk, NULL, err, sizeof(err)), -ESTALE);
	mem_free(b);
	syncg_free(g);
}

/* The generation: kept across a restart, new for a fresh state and for a
 * root removed and made again beside the same state; a sequence file from
 * before generations is read (its sequence kept) and gets one. */
static void test_generation(void **state)
{
	(void)state;
	char root[128], st[160], err[512];
	struct syncg *g;
	uint64_t g1, g2;

	snprintf(root, sizeof(root), "%s/gen", dir);
	snprintf(st, sizeof(st), "%s/gen-state", dir);
	assert_int_equal(mkdir(root, 0755), 0);
	assert_int_equal(syncg_open(root, st, NULL, gpub, &g, err, sizeof(err)), 0);
	g1 = syncg_generation(g);
	assert_true(g1 != 0);
	syncg_free(g);
	assert_int_equal(syncg_open(root, st, NULL, gpub, &g, err, sizeof(err)), 0);
	assert_true(syncg_generation(g) == g1);
	syncg_free(g);

	/* the copy replaced, the state kept: a new generation (a file in
	 * the way keeps the old inode number from being reused at once) */
	char p[200];
	snprintf(p, sizeof(p), "%s/gen-keep", dir);
	assert_int_equal(rename(root, p), 0);
	assert_int_equal(mkdir(root, 0755), 0);
	tu_rm_rf(p);
	assert_int_equal(syncg_open(root, st, NULL, gpub, &g, err, sizeof(err)), 0);
	g2 = syncg_generation(g);
	assert_true(g2 != 0 && g2 != g1);
	syncg_free(g);

	/* a sequence file of only "SEQ" */
	snprintf(p, sizeof(p), "%s/%s", st, SYNCG_SEQ_FILE);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs("7\n", f);
	fclose(f);
	assert_int_equal(syncg_open(root, st, NULL, gpub, &g, err, sizeof(err)), 0);
	assert_int_equal(syncg_last_seq(g), 7);
	assert_true(syncg_generation(g) != 0 && syncg_generation(g) != g2);
	syncg_free(g);

	/* garbage after the identity is refused, naming the file */
	f = fopen(p, "w");
	assert_non_null(f);
	fputs("7 00000000000000aa 1:2:3:4.000000000 extra\n", f);
	fclose(f);
	assert_int_equal(syncg_open(root, st, NULL, gpub, &g, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, SYNCG_SEQ_FILE));
}

static void test_state_inside_root_refused(void **state)
{
	(void)state;
	char root[128], st[160], err[512];
	struct syncg *g = NULL;

	snprintf(root, sizeof(root), "%s/r2", dir);
	snprintf(st, sizeof(st), "%s/r2/state", dir);
	assert_int_equal(mkdir(root, 0755), 0);
	assert_int_equal(syncg_open(root, st, NULL, gpub, &g, err, sizeof(err)), -EINVAL);
	assert_null(g);
	assert_non_null(strstr(err, "inside --root"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_seq_persisted),
	    cmocka_unit_test(test_seq_in_place),
	    cmocka_unit_test(test_generation),
	    cmocka_unit_test(test_state_inside_root_refused),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, setup, teardown);
}
