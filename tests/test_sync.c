/* SPDX-License-Identifier: Apache-2.0 */
/* sync / syncg unit tests: the sequence survives an agent restart (an old
 * batch replayed is refused), scope binding, state dir placement, the
 * generated .git/config, message reassembly limits. */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "airlock/delta.h"
#include "airlock/mem.h"
#include "airlock/sync.h"
#include "airlock/syncg.h"
#include "airlock/wire.h"

static char dir[64];
static uint8_t hpk[32], hsk[64], gpub[32];

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)flag;
	(void)f;
	return remove(p);
}

static int setup(void **state)
{
	(void)state;
	strcpy(dir, "/tmp/airlock-test-sync.XXXXXX");
	assert_non_null(mkdtemp(dir));
	crypto_sign_keypair(hpk, hsk);
	randombytes_buf(gpub, sizeof(gpub));
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	nftw(dir, rm_cb, 16, FTW_DEPTH | FTW_PHYS);
	return 0;
}

static void batch(uint64_t seq, const uint8_t *guest, const char *name, uint8_t **out, size_t *n)
{
	uint8_t scope[DELTA_SCOPE_LEN];
	struct delta_builder *b;
	sync_scope(guest, hpk, scope);
	assert_int_equal(delta_builder_new(seq, scope, NULL, &sync_delta_caps, &b), 0);
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

static void test_git_config(void **state)
{
	(void)state;
	char p[160];
	struct buf out;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	static const char cfg[] =
	    "[core]\n\trepositoryformatversion = 1\n\tfilemode = true\n\tbare = true\n"
	    "\thooksPath = /tmp/evil\n\tfsmonitor = /tmp/evil\n\tsshCommand = ssh -i key\n"
	    "[remote \"origin\"]\n\turl = https://u:TOKEN@example.com/r.git\n"
	    "[credential]\n\thelper = store\n[include]\n\tpath = /etc/x\n"
	    "[extensions]\n\tobjectFormat = sha256\n[url \"https://TOKEN@x/\"]\n\tinsteadOf = https://x/\n"
	    "[core]\n\teditor = \"vim\"\n\tlogAllRefUpdates = true # comment\n";
	assert_true(dfd >= 0);
	snprintf(p, sizeof(p), "%s/.git", dir);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/.git/config", dir);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(cfg, f);
	fclose(f);
	buf_init(&out, 1 << 20);
	assert_int_equal(sync_git_config(dfd, ".git/config", &out), 0);
	assert_int_equal(buf_put_u8(&out, 0), 0);
	const char *g = (const char *)buf_ptr(&out);
	assert_non_null(strstr(g, "repositoryformatversion = 1"));
	assert_non_null(strstr(g, "bare = false"));
	assert_non_null(strstr(g, "objectformat = sha256"));
	assert_non_null(strstr(g, "logallrefupdates = true"));
	assert_null(strstr(g, "TOKEN"));
	assert_null(strstr(g, "url"));
	assert_null(strstr(g, "evil"));
	assert_null(strstr(g, "ssh"));
	assert_null(strstr(g, "helper"));
	assert_null(strstr(g, "vim"));
	assert_null(strstr(g, "bare = true"));
	buf_clear(&out);
	close(dfd);
}

static void test_inbox_limits(void **state)
{
	(void)state;
	struct sync_inbox in;
	uint8_t frag[100] = { WIRE_SYNC_MORE };

	sync_inbox_init(&in);
	assert_int_equal(sync_inbox_add(&in, WIRE_SYNC_BATCH, frag, 0), -EBADMSG);
	assert_int_equal(sync_inbox_add(&in, WIRE_SYNC_BATCH, frag, sizeof(frag)), 0);
	/* another type inside a message */
	assert_int_equal(sync_inbox_add(&in, WIRE_SYNC_BEGIN, frag, sizeof(frag)), -EBADMSG);
	frag[0] = 0x80; /* unknown flag bits */
	assert_int_equal(sync_inbox_add(&in, WIRE_SYNC_BATCH, frag, sizeof(frag)), -EBADMSG);
	frag[0] = 0;
	assert_int_equal(sync_inbox_add(&in, WIRE_SYNC_BATCH, frag, sizeof(frag)), 1);
	assert_int_equal(buf_len(&in.b), 198);
	sync_inbox_done(&in);
	/* the size cap is checked before growing */
	in.b.len = WIRE_SYNC_MSG_MAX - 10; /* pretend, without allocating */
	in.b.off = 0;
	in.type = WIRE_SYNC_BATCH;
	assert_int_equal(sync_inbox_add(&in, WIRE_SYNC_BATCH, frag, 50), -EMSGSIZE);
	in.b.len = 0;
	sync_inbox_clear(&in);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_seq_persisted),
		cmocka_unit_test(test_state_inside_root_refused),
		cmocka_unit_test(test_git_config),
		cmocka_unit_test(test_inbox_limits),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, setup, teardown);
}
