/* SPDX-License-Identifier: Apache-2.0 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

static void test_roundtrip_identical(void **state)
{
	(void)state;
	struct buf a, b;
	buf_init(&a, 1024);
	buf_init(&b, 1024);
	for (int pass = 0; pass < 2; pass++) {
		struct buf *x = pass ? &b : &a;
		assert_int_equal(buf_put_u8(x, 0xab), 0);
		assert_int_equal(buf_put_u16(x, 0x1234), 0);
		assert_int_equal(buf_put_u32(x, 0xdeadbeef), 0);
		assert_int_equal(buf_put_u64(x, 0x0102030405060708ull), 0);
		assert_int_equal(buf_put_str(x, "hello"), 0);
		assert_int_equal(buf_put_bytes(x, "", 0), 0);
	}
	assert_int_equal(buf_len(&a), buf_len(&b));
	assert_memory_equal(buf_ptr(&a), buf_ptr(&b), buf_len(&a));
	static const uint8_t want[] = {0xab, 0x12, 0x34, 0xde, 0xad, 0xbe, 0xef, 1,   2,   3,	4, 5, 6, 7,
				       8,    0,	   0,	 0,    5,    'h',  'e',	 'l', 'l', 'o', 0, 0, 0, 0};
	assert_int_equal(buf_len(&a), sizeof(want));
	assert_memory_equal(buf_ptr(&a), want, sizeof(want));

	uint8_t u8;
	uint16_t u16;
	uint32_t u32;
	uint64_t u64;
	char *s;
	const uint8_t *p;
	size_t n;
	assert_int_equal(buf_get_u8(&a, &u8), 0);
	assert_int_equal(u8, 0xab);
	assert_int_equal(buf_get_u16(&a, &u16), 0);
	assert_int_equal(u16, 0x1234);
	assert_int_equal(buf_get_u32(&a, &u32), 0);
	assert_int_equal(u32, 0xdeadbeef);
	assert_int_equal(buf_get_u64(&a, &u64), 0);
	assert_true(u64 == 0x0102030405060708ull);
	assert_int_equal(buf_get_str(&a, &s, 16), 0);
	assert_string_equal(s, "hello");
	mem_free(s);
	assert_int_equal(buf_get_bytes(&a, &p, &n, 16), 0);
	assert_int_equal(n, 0);
	assert_int_equal(buf_len(&a), 0);
	assert_int_equal(buf_get_u8(&a, &u8), -EBADMSG);
	buf_clear(&a);
	buf_clear(&b);
}

/* The fixed-array helpers agree with buf_put/buf_get, and buf_poke_u32
 * overwrites in place within bounds only. */
static void test_store_load_poke(void **state)
{
	(void)state;
	static const uint64_t v64[] = {0, 1, 0x0102030405060708ull, UINT64_MAX, 0x8000000000000000ull};
	struct buf b;
	uint8_t d[8];

	for (size_t i = 0; i < sizeof(v64) / sizeof(v64[0]); i++) {
		buf_init(&b, 64);
		assert_int_equal(buf_put_u16(&b, (uint16_t)v64[i]), 0);
		assert_int_equal(buf_put_u32(&b, (uint32_t)v64[i]), 0);
		assert_int_equal(buf_put_u64(&b, v64[i]), 0);
		buf_store_be16(d, (uint16_t)v64[i]);
		assert_memory_equal(buf_ptr(&b), d, 2);
		assert_int_equal(buf_load_be16(buf_ptr(&b)), (uint16_t)v64[i]);
		buf_store_be32(d, (uint32_t)v64[i]);
		assert_memory_equal(buf_ptr(&b) + 2, d, 4);
		assert_int_equal(buf_load_be32(buf_ptr(&b) + 2), (uint32_t)v64[i]);
		buf_store_be64(d, v64[i]);
		assert_memory_equal(buf_ptr(&b) + 6, d, 8);
		assert_true(buf_load_be64(buf_ptr(&b) + 6) == v64[i]);
		buf_clear(&b);
	}

	uint32_t v;
	buf_init(&b, 64);
	assert_int_equal(buf_put_u32(&b, 0), 0);
	assert_int_equal(buf_put_u8(&b, 9), 0);
	assert_int_equal(buf_poke_u32(&b, 0, 0xdeadbeef), 0);
	assert_int_equal(buf_peek_u32(&b, 0, &v), 0);
	assert_int_equal(v, 0xdeadbeef);
	assert_int_equal(buf_poke_u32(&b, 1, 7), 0); /* bytes 1..4: in bounds */
	assert_int_equal(buf_poke_u32(&b, 2, 7), -EBADMSG);
	assert_int_equal(buf_len(&b), 5);
	buf_clear(&b);

	/* the other widths, n bytes, and truncation of a partly written record */
	uint64_t v64b;
	uint8_t u8;
	buf_init(&b, 64);
	assert_int_equal(buf_put_u8(&b, 0), 0);
	assert_int_equal(buf_put_u64(&b, 0), 0);
	assert_int_equal(buf_put(&b, "abc", 3), 0);
	assert_int_equal(buf_poke_u8(&b, 0, 0x5a), 0);
	assert_int_equal(buf_poke_u64(&b, 1, 0x0102030405060708ull), 0);
	assert_int_equal(buf_poke(&b, 9, "xyz", 3), 0);
	assert_int_equal(buf_poke(&b, 10, "xyz", 3), -EBADMSG);
	assert_int_equal(buf_poke_u64(&b, 5, 1), -EBADMSG);
	assert_int_equal(buf_poke_u8(&b, 12, 1), -EBADMSG);
	assert_int_equal(buf_get_u8(&b, &u8), 0);
	assert_int_equal(u8, 0x5a);
	assert_int_equal(buf_get_u64(&b, &v64b), 0);
	assert_true(v64b == 0x0102030405060708ull);
	assert_memory_equal(buf_ptr(&b), "xyz", 3);
	buf_truncate(&b, 5); /* more than is there: nothing changes */
	assert_int_equal(buf_len(&b), 3);
	buf_truncate(&b, 1);
	assert_int_equal(buf_len(&b), 1);
	assert_memory_equal(buf_ptr(&b), "x", 1);
	assert_int_equal(buf_put(&b, "q", 1), 0); /* writes go on after the kept bytes */
	assert_memory_equal(buf_ptr(&b), "xq", 2);
	buf_clear(&b);

	uint8_t raw[4] = {0};
	buf_view(&b, raw, sizeof(raw));
	assert_int_equal(buf_poke_u32(&b, 0, 1), -EROFS);
	assert_int_equal(buf_poke_u8(&b, 0, 1), -EROFS);
	assert_int_equal(buf_poke(&b, 0, "a", 1), -EROFS);
}

static void test_cap_and_short_reads(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 8);
	assert_int_equal(buf_put_u64(&b, 1), 0);
	assert_int_equal(buf_put_u8(&b, 1), -ENOBUFS);
	assert_int_equal(buf_len(&b), 8);
	/* consuming frees room for more (compaction) */
	assert_int_equal(buf_consume(&b, 4), 0);
	assert_int_equal(buf_put_u32(&b, 7), 0);
	assert_int_equal(buf_put_u8(&b, 1), -ENOBUFS);
	buf_clear(&b);

	/* a length prefix larger than the data or the limit is refused and
	 * leaves the buffer unchanged */
	static const uint8_t bad[] = {0xff, 0xff, 0xff, 0xff, 'x'};
	struct buf v;
	const uint8_t *p;
	size_t n;
	buf_view(&v, bad, sizeof(bad));
	assert_int_equal(buf_get_bytes(&v, &p, &n, SIZE_MAX), -EBADMSG);
	assert_int_equal(buf_len(&v), sizeof(bad));
	static const uint8_t ok[] = {0, 0, 0, 1, 'x'};
	buf_view(&v, ok, sizeof(ok));
	assert_int_equal(buf_get_bytes(&v, &p, &n, 0), -EBADMSG);
	assert_int_equal(buf_get_bytes(&v, &p, &n, 1), 0);
	assert_int_equal(*p, 'x');
	/* views are read-only */
	assert_int_equal(buf_put_u8(&v, 1), -EROFS);
	/* embedded NUL in a string */
	static const uint8_t nul[] = {0, 0, 0, 2, 'a', 0};
	char *s;
	buf_view(&v, nul, sizeof(nul));
	assert_int_equal(buf_get_str(&v, &s, 10), -EBADMSG);
	assert_int_equal(buf_len(&v), sizeof(nul));
}

static void test_alloc_failure(void **state)
{
	(void)state;
	struct buf b;
	buf_init(&b, 1 << 20);
	mem_fail_at(1, 0);
	assert_int_equal(buf_put_u32(&b, 1), -ENOMEM);
	assert_int_equal(buf_len(&b), 0);
	assert_int_equal(buf_put_u32(&b, 1), 0);
	/* growth failure keeps the old contents */
	uint8_t big[4096] = {0};
	mem_fail_at(1, 0);
	assert_int_equal(buf_put(&b, big, sizeof(big)), -ENOMEM);
	assert_int_equal(buf_len(&b), 4);
	mem_fail_at(0, 0);
	buf_clear(&b);
}

static void test_overflow_safe_reserve(void **state)
{
	(void)state;
	struct buf b;
	uint8_t *p;
	buf_init(&b, SIZE_MAX);
	assert_int_equal(buf_put_u8(&b, 1), 0);
	assert_int_equal(buf_reserve(&b, SIZE_MAX, &p), -ENOBUFS);
	assert_int_equal(buf_reserve(&b, SIZE_MAX - 1, &p), -ENOBUFS);
	buf_clear(&b);
	/* n + used past the cap, without wrapping */
	buf_init(&b, 1u << 20);
	assert_int_equal(buf_put_u8(&b, 1), 0);
	assert_int_equal(buf_reserve(&b, 1u << 20, &p), -ENOBUFS);
	assert_int_equal(buf_reserve(&b, (1u << 20) - 1, &p), 0);
	buf_clear(&b);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_roundtrip_identical),	  cmocka_unit_test(test_store_load_poke),
	    cmocka_unit_test(test_cap_and_short_reads),	  cmocka_unit_test(test_alloc_failure),
	    cmocka_unit_test(test_overflow_safe_reserve),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
