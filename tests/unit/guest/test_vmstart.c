/* SPDX-License-Identifier: Apache-2.0 */
/* vmstart: the vm template's start line (vmstart.h), table driven. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
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

/* ---- the config drive's tar image ---- */

/* One ustar member into buf at *off (header + content padded to 512). */
static void tar_put(uint8_t *buf, size_t *off, const char *name, char type, const char *data)
{
	uint8_t *h = buf + *off;
	size_t len = strlen(data);
	unsigned sum = 0;

	memset(h, 0, 512);
	snprintf((char *)h, 100, "%s", name);
	snprintf((char *)h + 100, 8, "%07o", 0600);
	snprintf((char *)h + 124, 12, "%011o", (unsigned)(len & 07777777));
	h[156] = (uint8_t)type;
	memcpy(h + 257, "ustar", 6);
	memset(h + 148, ' ', 8);
	for (size_t i = 0; i < 512; i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	memcpy(h + 512, data, len);
	*off += 512 + (len + 511) / 512 * 512;
}

static size_t tar_sample(uint8_t *buf, size_t n)
{
	size_t off = 0;

	memset(buf, 0, n);
	tar_put(buf, &off, "guest.key", '0', "KEYKEYKEY\n");
	tar_put(buf, &off, "sub", '5', "");
	tar_put(buf, &off, "agent.conf", '0', "verbose=0\nfsync=batch\nrun_as=1000:1000\n");
	return off + 1024; /* the end-of-archive blocks */
}

static void test_tar_good(void **state)
{
	static uint8_t buf[10240];
	struct vmstart_file f[VMSTART_FILES_MAX];
	size_t n = 0;

	(void)state;
	tar_sample(buf, sizeof(buf));
	assert_int_equal(vmstart_tar_parse(buf, sizeof(buf), f, VMSTART_FILES_MAX, &n), 0);
	assert_int_equal(n, 2); /* the directory is not a file */
	assert_string_equal(f[0].name, "guest.key");
	assert_int_equal(f[0].len, 10);
	assert_memory_equal(f[0].data, "KEYKEYKEY\n", 10);
	assert_string_equal(f[1].name, "agent.conf");
	assert_int_equal(vmstart_tar_parse(buf, sizeof(buf), f, 1, &n), -EINVAL); /* more than max */
	memset(buf, 0, sizeof(buf));						  /* a blank drive: no files */
	assert_int_equal(vmstart_tar_parse(buf, sizeof(buf), f, VMSTART_FILES_MAX, &n), 0);
	assert_int_equal(n, 0);
}

/* Each damage to the sample image is refused, not read past. */
static void test_tar_bad(void **state)
{
	static const struct {
		size_t at;
		uint8_t byte;
		const char *what;
	} damage[] = {
	    {148, '7', "checksum"},
	    {0, 0, "empty name"},
	    {124, '9', "size not octal"},
	    {124 + 1, '7', "size past the image"}, /* the checksum is fixed below */
	};
	static uint8_t buf[4096];
	struct vmstart_file f[VMSTART_FILES_MAX];
	size_t n, len;

	(void)state;
	for (size_t i = 0; i < sizeof(damage) / sizeof(damage[0]); i++) {
		len = tar_sample(buf, sizeof(buf));
		buf[damage[i].at] = damage[i].byte;
		if (damage[i].at != 148) { /* a valid checksum over the damage */
			unsigned sum = 0;
			memset(buf + 148, ' ', 8);
			for (size_t k = 0; k < 512; k++)
				sum += buf[k];
			snprintf((char *)buf + 148, 8, "%06o", sum);
		}
		if (vmstart_tar_parse(buf, len, f, VMSTART_FILES_MAX, &n) != -EINVAL)
			fail_msg("accepted: %s", damage[i].what);
	}
	len = tar_sample(buf, sizeof(buf));
	memset(buf, 'a', 100); /* a name without its NUL */
	assert_int_equal(vmstart_tar_parse(buf, len, f, VMSTART_FILES_MAX, &n), -EINVAL);
	len = tar_sample(buf, sizeof(buf));
	assert_int_equal(vmstart_tar_parse(buf, 1024, f, VMSTART_FILES_MAX, &n), 0); /* cut after a member */
	assert_int_equal(n, 1);
	assert_int_equal(vmstart_tar_parse(buf, 600, f, VMSTART_FILES_MAX, &n), -EINVAL); /* inside one */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_good), cmocka_unit_test(test_tar_good),     cmocka_unit_test(test_tar_bad),
	    cmocka_unit_test(test_bad),	 cmocka_unit_test(test_embedded_nul),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
