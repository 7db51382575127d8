/* SPDX-License-Identifier: Apache-2.0 */
/* vmstart: the vm template's start line (vmstart.h), table driven. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "airlock/guest/vmstart.h"

#define SEED "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f"

static void test_good(void **state)
{
	static const struct {
		const char *line, *kind;
		uint64_t gen;
		int64_t ns;
	} cases[] = {
	    {"start cold 1 1764633600000000000 " SEED, "cold", 1, 1764633600000000000},
	    {"start restored 42 0 " SEED, "restored", 42, 0},
	    {"start fork 9223372036854775807 7 " SEED, "fork", 9223372036854775807ull, 7},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		struct vmstart s;
		assert_int_equal(vmstart_parse(cases[i].line, strlen(cases[i].line), &s), 0);
		assert_string_equal(s.kind, cases[i].kind);
		assert_true(s.gen == cases[i].gen);
		assert_true(s.unix_ns == cases[i].ns);
		for (int k = 0; k < VMSTART_SEED_LEN; k++)
			assert_int_equal(s.seed[k], k);
	}
}

static void test_bad(void **state)
{
	static const char *const lines[] = {
	    "",
	    "start",
	    "start cold",
	    "start cold 1 2",
	    "start cold 1 2 " SEED " ",		       /* trailing byte */
	    "start warm 1 2 " SEED,		       /* unknown kind */
	    "start coldx 1 2 " SEED,		       /* a kind's prefix is not the kind */
	    "start cold -1 2 " SEED,		       /* not a number */
	    "start cold 1 99999999999999999999 " SEED, /* over 19 digits */
	    "start cold 1  2 " SEED,		       /* two spaces */
	    "start cold 1 2 " SEED "00",	       /* seed too long */
	    "start cold 1 2 000102",		       /* seed too short */
	    "start cold 1 2 zz0102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f", /* not hex */
	    "poweroff",
	    "START cold 1 2 " SEED,
	};
	(void)state;
	for (size_t i = 0; i < sizeof(lines) / sizeof(lines[0]); i++) {
		struct vmstart s;
		if (vmstart_parse(lines[i], strlen(lines[i]), &s) != -EINVAL)
			fail_msg("accepted: \"%s\"", lines[i]);
	}
}

/* A NUL inside the given length is not the end of the line. */
static void test_embedded_nul(void **state)
{
	char line[] = "start cold 1 2 " SEED;
	struct vmstart s;

	(void)state;
	line[7] = '\0';
	assert_int_equal(vmstart_parse(line, sizeof(line) - 1, &s), -EINVAL);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_good),
	    cmocka_unit_test(test_bad),
	    cmocka_unit_test(test_embedded_nul),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
