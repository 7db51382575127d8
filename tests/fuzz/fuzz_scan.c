/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the content scanner: every file the host sends is scanned, and the
 * workspace's bytes are the agent's to choose. Input = file content. */
#include <string.h>

#include "airlock/policy/scan.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct scan_hit h, h2;
	int r = scan_bytes(data, size, &h);

	FUZZ_ASSERT(r == 0 || r == 1);
	if (r == 1) {
		unsigned long lines = 1;
		size_t nr;
		const struct scan_rule *rules = scan_rules(&nr);
		FUZZ_ASSERT(h.off < size);
		FUZZ_ASSERT(h.rule >= rules && h.rule < rules + nr);
		for (size_t i = 0; i < h.off; i++)
			lines += data[i] == '\n';
		FUZZ_ASSERT(h.line == lines);
		/* the anchor is where the hit says */
		size_t al = strlen(h.rule->anchor);
		FUZZ_ASSERT(h.off + al <= size);
		/* the first hit: nothing before it matches */
		FUZZ_ASSERT(scan_bytes(data, h.off, &h2) == 0 || h2.off < h.off);
	}
	/* deterministic, and the portable loop agrees with the SIMD prefilter */
	FUZZ_ASSERT(scan_bytes(data, size, &h2) == r && (!r || (h2.off == h.off && h2.rule == h.rule)));
	scan_set_portable(1);
	int rp = scan_bytes(data, size, &h2);
	scan_set_portable(0);
	FUZZ_ASSERT(rp == r && (!r || (h2.off == h.off && h2.rule == h.rule)));
	return 0;
}

/* One sample per kind of rule, assembled so this file holds no token. */
size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static char buf[512];
	static const char *const parts[][2] = {
	    {"-----BEGIN RSA PRIV", "ATE KEY-----\nMIIEowIBAAKCAQEAq8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi\n"},
	    {"key = AK", "IAQ3EGRSLPZVN2MXT6\n"},
	    {"tok: gh", "p_q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi\n"},
	    {"Bearer ey", "JhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV\n"},
	    {"# x\nexport DB_PASS", "WORD=s3cr3tPass99\nSOME=q8Zr2LmV0xKp4TbN7yWc1sHd\n"},
	    {"postgres://app:Zr2Lm", "V0xKp4T@db:5432/x"},
	    {"bot('MTk4NjIyNDgzNDcxOTI1MjQ4", ".Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs')"},
	    {"\"integrity\": \"sha512-eyJq8Zr2L",
	     "mV0xKp4TbN7yWc1sHd==\" AKIAIOSFODNN7EXAMPLE 123e4567-e89b-12d3-a456-426614174000"},
	};
	if (i >= sizeof(parts) / sizeof(parts[0]))
		return 0;
	int n = snprintf(buf, sizeof(buf), "%s%s", parts[i][0], parts[i][1]);
	*out = (const uint8_t *)buf;
	return (size_t)n;
}
