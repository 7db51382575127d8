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
	char root[128], seqf[192], text[32] = {0}, err[512];
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
	assert_int_equal(fread(text, 1, sizeof(text) - 1, f), 3);
	fclose(f);
	assert_string_equal(text, "10\n");
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
	    cmocka_unit_test(test_state_inside_root_refused),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, setup, teardown);
}
