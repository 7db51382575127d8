/* SPDX-License-Identifier: Apache-2.0 */
/* syncmsg: the batch scope (its derivation, and that it binds both keys)
 * and the reassembly of fragmented sync messages (syncmsg.h). */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>
#include <sodium.h>

#include "airlock/content/syncmsg.h"
#include "airlock/core/buf.h"
#include "airlock/core/wire.h"

/* The scope is SHA-256("airlock sync scope v1" || guest pub || host pk):
 * computed here independently, and different when either key changes. */
static void test_scope(void **state)
{
	static const char label[] = "airlock sync scope v1";
	uint8_t g[32], h[32], want[crypto_hash_sha256_BYTES], got[DELTA_SCOPE_LEN], other[DELTA_SCOPE_LEN];
	crypto_hash_sha256_state st;
	(void)state;

	randombytes_buf(g, sizeof(g));
	randombytes_buf(h, sizeof(h));
	crypto_hash_sha256_init(&st);
	crypto_hash_sha256_update(&st, (const uint8_t *)label, sizeof(label) - 1);
	crypto_hash_sha256_update(&st, g, sizeof(g));
	crypto_hash_sha256_update(&st, h, sizeof(h));
	crypto_hash_sha256_final(&st, want);
	syncmsg_scope(g, h, got);
	assert_memory_equal(got, want, DELTA_SCOPE_LEN);
	syncmsg_scope(g, h, other);
	assert_memory_equal(got, other, DELTA_SCOPE_LEN);
	g[0] ^= 1;
	syncmsg_scope(g, h, other);
	assert_memory_not_equal(got, other, DELTA_SCOPE_LEN);
	g[0] ^= 1;
	h[31] ^= 0x80;
	syncmsg_scope(g, h, other);
	assert_memory_not_equal(got, other, DELTA_SCOPE_LEN);
}

static void test_inbox_limits(void **state)
{
	(void)state;
	struct syncmsg_inbox in;
	uint8_t frag[100] = {WIRE_SYNC_MORE};

	syncmsg_inbox_init(&in);
	assert_int_equal(syncmsg_inbox_add(&in, WIRE_SYNC_BATCH, frag, 0), -EBADMSG);
	assert_int_equal(syncmsg_inbox_add(&in, WIRE_SYNC_BATCH, frag, sizeof(frag)), 0);
	/* another type inside a message */
	assert_int_equal(syncmsg_inbox_add(&in, WIRE_SYNC_BEGIN, frag, sizeof(frag)), -EBADMSG);
	frag[0] = 0x80; /* unknown flag bits */
	assert_int_equal(syncmsg_inbox_add(&in, WIRE_SYNC_BATCH, frag, sizeof(frag)), -EBADMSG);
	frag[0] = 0;
	assert_int_equal(syncmsg_inbox_add(&in, WIRE_SYNC_BATCH, frag, sizeof(frag)), 1);
	assert_int_equal(buf_len(&in.b), 198);
	syncmsg_inbox_done(&in);
	/* the size cap is checked before growing */
	in.b.len = WIRE_SYNC_MSG_MAX - 10; /* pretend, without allocating */
	in.b.off = 0;
	in.type = WIRE_SYNC_BATCH;
	assert_int_equal(syncmsg_inbox_add(&in, WIRE_SYNC_BATCH, frag, 50), -EMSGSIZE);
	in.b.len = 0;
	syncmsg_inbox_clear(&in);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_scope),
	    cmocka_unit_test(test_inbox_limits),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
