/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for the content scanner (scan.h): a true positive for every
 * rule, the false positives that must not match (source code, lockfiles,
 * base64 images, UUIDs, git hashes), line numbers, the doc table.
 *
 * The samples are assembled at run time from pieces ("gh" "p_"): this
 * file must not itself look like it holds tokens (secret scanners, ours
 * included, would flag it).
 */
#include <setjmp.h>
#include <stdbool.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "airlock/policy/scan.h"

#ifndef SECRETS_DOC
#error "SECRETS_DOC must name doc/SECRETS.md"
#endif

/* 64 characters of a random-looking alphabet, for bodies. */
#define RND "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi5lQe8MvXn2BtKz0PwUhYsC7Dfa1G"

struct sample {
	const char *rule;      /* expected rule id */
	const char *a, *b, *c; /* concatenated */
};

static const struct sample positives[] = {
    {"private-key", "-----BEGIN RSA PRIV", "ATE KEY-----\nMIIEowIBAAKCAQEA" RND "\n",
     "-----END RSA PRIVATE KEY-----\n"},
    {"private-key", "x = \"-----BEGIN OPENSSH PRIV", "ATE KEY-----\\nb3BlbnNzaC1rZXktdjEAAAAA" RND, "\"\n"},
    {"private-key", "-----BEGIN PRIV", "ATE KEY-----\r\n", "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC" RND "\r\n"},
    {"pgp-private-key", "-----BEGIN PGP PRIV", "ATE KEY BLOCK-----\n\n", "lQOYBF" RND "\n"},
    {"aws-access-key-id", "aws_access_key_id = AK", "IAQ3EGRSLPZVN2MXT6", "\n"},
    {"aws-temporary-key-id", "{\"AccessKeyId\": \"AS", "IAQ3EGRSLPZVN2MXT6", "\"}"},
    {"aws-secret-access-key", "aws_secret_access_key = ", "wJalrXUtnFEMI/K7MDENG/bPxRfiCY", "Q8Zr2LmV0x\n"},
    {"gcp-service-account-key", "{\"type\": \"service_account\", \"private_key\": \"-----BEGIN PRIV",
     "ATE KEY-----\\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC" RND, "\\n\"}"},
    {"azure-storage-key", "DefaultEndpointsProtocol=https;AccountName=x;Account", "Key=" RND "Zr2LmV0xKp4Tb==", ";"},
    {"azure-shared-access-key", "Endpoint=sb://x.servicebus.windows.net/;SharedAccess", "Key=" RND, ";"},
    {"github-pat", "token: gh",
     "p_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi",
     "\n"},
    {"github-oauth", "gh",
     "o_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi",
     ""},
    {"github-user-token", "gh",
     "u_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi",
     ""},
    {"github-server-token", "gh",
     "s_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi",
     ""},
    {"github-refresh-token", "gh",
     "r_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi",
     ""},
    {"github-fine-grained-pat", "github",
     "_pat_11ABCDEFG0"
     "q8Zr2LmV0xKp4TbN7yWc1sHd_9gFj3uEa6oRi5lQe8MvXn2BtKz0PwUhYsC",
     "\n"},
    {"gitlab-pat", "gl",
     "pat-"
     "q8Zr2LmV0xKp4TbN7yWc",
     "\n"},
    {"slack-token", "slack: xo", "xb-123456789012-1234567890123-q8Zr2LmV0xKp4TbN7yWc", "\n"},
    {"slack-webhook", "url: https://hooks.sl", "ack.com/services/T01ABCDEF/B01ABCDEF/q8Zr2LmV0xKp4TbN7yWc", "\n"},
    {"discord-bot-token", "bot.run('MTk4NjIyNDgzNDcxOTI1MjQ4", ".Cl2FMQ.ZnCjm1XVW7vRze4b7Cq4se7kKWs", "')"},
    {"stripe-secret-key", "sk",
     "_live_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd",
     "\n"},
    {"stripe-restricted-key", "rk",
     "_live_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd",
     "\n"},
    {"npm-token", "//registry.npmjs.org/:_authToken=np",
     "m_"
     "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi",
     "\n"},
    {"pypi-token", "password = py",
     "pi-AgEIcHlwaS5vcmc"
     "q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi5lQe8MvXn2BtKz",
     "\n"},
    {"rubygems-key", "GEM_HOST_API_KEY: ruby",
     "gems_"
     "0123456789abcdef0123456789abcdef0123456789abcdef",
     "\n"},
    {"jwt", "Authorization: Bearer ey", "JhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0",
     ".SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c\n"},
    {"url-credentials", "DATABASE_URL=postgres://app:Zr2Lm", "V0xKp4T@db.internal:5432/app", "\n"},
    {"dotenv-secret", "# app\nexport DB_PASS", "WORD=s3cr3tPass99", "\n"},
    {"dotenv-secret", "API_KEY = \"", "f00Bar2Baz7Qux", "\"\n"},
    {"dotenv-high-entropy", "SOME_VALUE=", "q8Zr2LmV0xKp4TbN7yWc1sHd", "\n"},
};

static const char *const negatives[] = {
    /* source code */
    "const apiKey = process.env.API_KEY;\nif (token == null) return;\n",
    "#define KEY_LEN 32\nstatic const char *password = getpass(\"Password: \");\n",
    "PASSWORD=$(cat /run/secrets/db)\nTOKEN=\"${GITHUB_TOKEN}\"\nAPI_KEY=changeme\nSECRET_KEY=your-secret-key-here\n",
    "static const char pem[] = \"-----BEGIN RSA PRIVATE KEY-----\";\nparse(pem);\n",
    "SORT_KEY=created_at_desc\nAUTHOR=\"Jane Developer\"\nDEBUG=true\nPORT=8080\n",
    "x.y.z = a.b.c; obj.method(arg).other();\n",
    "git clone https://github.com/org/repo.git\nhttps://user:password@example.com/\n",
    /* lockfiles with integrity hashes */
    "\"integrity\": \"sha512-Q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi5lQe8MvXn2BtKz0PwUhYsC7Dfa1GeyJabc+/xyz==\"\n",
    "  integrity sha512-eyJq8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi5lQe8MvXn2BtKz0PwUhYsC7Dfa1G==\n",
    "resolution: {integrity: sha512-q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi5lQe8MvXn2BtKz0PwUhYsC7D==}\n",
    /* base64 images */
    "background: "
    "url(data:image/"
    "png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg==);\n",
    "<img src=\"data:image/gif;base64,R0lGODlhAQABAIAAAAAAAP///yH5BAEAAAAALAAAAAABAAEAAAIBRAA7\">\n",
    /* UUIDs and git object hashes, also as assignments */
    "id: 123e4567-e89b-12d3-a456-426614174000\nREQUEST_ID=123e4567-e89b-12d3-a456-426614174000\n",
    "commit 3f786850e387550fdab836ed7e6dc881de23001b\nGIT_SHA=3f786850e387550fdab836ed7e6dc881de23001b\n",
    "SHA256=9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08\n",
    /* the AWS documentation's example key id, a header with no body */
    "aws_access_key_id = AKIAIOSFODNN7EXAMPLE\n",
    "-----BEGIN PUBLIC KEY-----\nMIIBIjANBgkqhkiG9w0BAQEFAAOCAQ8AMIIBCgKCAQEA\n-----END PUBLIC KEY-----\n",
    "CFLAGS=-O2 -Wall\nPATH=/usr/local/bin:/usr/bin\nLANG=en_US.UTF-8\n",
    /* found scanning /usr/include, /usr/lib/python3 and /usr/share/doc */
    "PRIVATE_PPA_URI_FORMAT = 'https://private-ppa.launchpadcontent.net/{team}/{ppa}/ubuntu/'\n",
    "OID_AUTHORITY_KEY_IDENTIFIER = ExtensionOID.AUTHORITY_KEY_IDENTIFIER\nHEX_PAT = \"[0-9A-Fa-f]{1,4}\"\n",
    "SECRET=s3cr3t-$$-$RANDOM$RANDOM\nconst myURL = new URL('https://abc:xyz@example.com');\n",
    "\"-----BEGIN RSA PRIVATE KEY-----\";\nparse(pem);\n\"integrity\": "
    "\"sha512-q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi5lQe8M==\"\n",
    "u = 'https://user:s3cr3tpw@api.example.com/v1'\n",
    "OID_DSA_WITH_SHA1 = SignatureAlgorithmOID.DSA_WITH_SHA1\nUNRESERVED_PAT = "
    "r\"ABCDEFGHIJabcdefghij0123456789._!-~\"\n",
    /* C enums and initializers in headers */
    "enum {\n\tNL80211_KEY_MAX = __NL80211_KEY_AFTER_LAST - 1\n    UBLOCK_PRIVATE_USE = UBLOCK_PRIVATE_USE_AREA,\n",
    "\tTCA_ID_TUNNEL_KEY = TCA_ACT_TUNNEL_KEY,\n    SEC_ERROR_FILING_KEY = (SEC_ERROR_BASE + 25),\n",
    "    SSL_ERROR_RX_MALFORMED_SERVER_KEY_EXCH  = (SSL_ERROR_BASE + 31),\n#define AUTH_TOKEN_LEN 32\n",
};

static size_t build(const struct sample *s, char *out, size_t cap)
{
	return (size_t)snprintf(out, cap, "%s%s%s", s->a, s->b, s->c);
}

static void test_true_positives(void **state)
{
	(void)state;
	char buf[1024];
	size_t nr;
	const struct scan_rule *rules = scan_rules(&nr);

	for (size_t i = 0; i < sizeof(positives) / sizeof(positives[0]); i++) {
		struct scan_hit h;
		size_t n = build(&positives[i], buf, sizeof(buf));
		if (!scan_bytes(buf, n, &h))
			fail_msg("sample %zu (%s): no match", i, positives[i].rule);
		if (strcmp(h.rule->id, positives[i].rule) != 0)
			fail_msg("sample %zu: matched %s, expected %s", i, h.rule->id, positives[i].rule);
	}
	/* every rule has a sample */
	for (size_t r = 0; r < nr; r++) {
		bool seen = false;
		for (size_t i = 0; i < sizeof(positives) / sizeof(positives[0]); i++)
			seen |= strcmp(positives[i].rule, rules[r].id) == 0;
		if (!seen)
			fail_msg("rule %s has no true-positive sample", rules[r].id);
	}
}

static void test_false_positives(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(negatives) / sizeof(negatives[0]); i++) {
		struct scan_hit h;
		if (scan_bytes(negatives[i], strlen(negatives[i]), &h))
			fail_msg("negative %zu matched %s at line %lu", i, h.rule->id, h.line);
	}
}

/* Every sample, embedded at a random place in a large clean text, is
 * found with the right line; cut at any point before the token ends, it
 * is never read past the end (ASan checks that). */
static void test_lines_and_bounds(void **state)
{
	(void)state;
	size_t cap = 256 * 1024;
	char *big = malloc(cap), tok[1024];
	assert_non_null(big);
	for (size_t i = 0; i < sizeof(positives) / sizeof(positives[0]); i++) {
		size_t tn = build(&positives[i], tok, sizeof(tok)), n = 0;
		unsigned long lines = 1;
		for (unsigned k = 0; k < 37 + i * 11; k++) {
			n += (size_t)snprintf(big + n, cap - n, "static int f%u(int x) { return x * %u; }\n", k, k);
			lines++;
		}
		memcpy(big + n, tok, tn);
		struct scan_hit h;
		assert_int_equal(scan_bytes(big, n + tn, &h), 1);
		assert_string_equal(h.rule->id, positives[i].rule);
		/* the hit is on the sample's line or below it (a few rules
		 * anchor after a newline inside the sample) */
		assert_true(h.line >= lines && h.line <= lines + 2);
		assert_true(h.off >= n);
		for (size_t cut = 0; cut < tn; cut++) {
			char *t = malloc(cut ? cut : 1);
			assert_non_null(t);
			memcpy(t, tok, cut);
			(void)scan_bytes(t, cut, &h);
			free(t);
		}
	}
	free(big);
}

static void test_binary_and_empty(void **state)
{
	(void)state;
	struct scan_hit h;
	uint8_t b[4096];
	uint64_t x = 88172645463325252ull;
	assert_int_equal(scan_bytes("", 0, &h), 0);
	for (size_t i = 0; i < sizeof(b); i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		b[i] = (uint8_t)x;
	}
	assert_int_equal(scan_bytes(b, sizeof(b), &h), 0);
	assert_true(scan_entropy((const uint8_t *)"aaaa", 4) == 0);
	assert_true(scan_entropy((const uint8_t *)"abcd", 4) > 1.99 && scan_entropy((const uint8_t *)"abcd", 4) < 2.01);
}

/* The SIMD prefilter and the portable loop find the same first hit, on
 * random text salted with anchors and samples at every alignment. */
static void test_simd_agrees(void **state)
{
	(void)state;
	static const char alpha[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-.=:/\"\n \t";
	static const char *const salt[] = {"ghp",	  "gh",	  "AKIA", "ASI", "xox", "eyJ", "://",
					   "-----BEGIN ", "sk_",  "npm",  "Acc", "sha", "SHA", "aws",
					   "AWS",	  "\"pr", "hoo",  "pyp", "rub", "rk_"};
	char tok[1024];
	uint64_t x = 0x243f6a8885a308d3ull;
	char *b = malloc(4096);
	assert_non_null(b);
	for (unsigned round = 0; round < 3000; round++) {
		size_t n = 0, len = 1 + (size_t)(x % 4000);
		while (n < len) {
			x ^= x << 13, x ^= x >> 7, x ^= x << 17;
			if (x % 23 == 0) {
				const char *sp = salt[(x >> 8) % (sizeof(salt) / sizeof(salt[0]))];
				size_t k = strlen(sp);
				if (n + k > len)
					break;
				memcpy(b + n, sp, k);
				n += k;
			} else if (x % 997 == 0) {
				size_t k = build(&positives[(x >> 8) % (sizeof(positives) / sizeof(positives[0]))], tok,
						 sizeof(tok));
				if (n + k > len)
					break;
				memcpy(b + n, tok, k);
				n += k;
			} else {
				b[n++] = alpha[(x >> 16) % (sizeof(alpha) - 1)];
			}
		}
		struct scan_hit h1 = {0}, h2 = {0};
		int r1 = scan_bytes(b, n, &h1);
		scan_set_portable(1);
		int r2 = scan_bytes(b, n, &h2);
		scan_set_portable(0);
		assert_int_equal(r1, r2);
		if (r1 && (h1.off != h2.off || h1.rule != h2.rule || h1.line != h2.line))
			fail_msg("round %u: simd %s at %zu, portable %s at %zu", round, h1.rule->id, h1.off,
				 h2.rule->id, h2.off);
	}
	free(b);
}

static void test_rules_documented(void **state)
{
	(void)state;
	size_t nr;
	const struct scan_rule *rules = scan_rules(&nr);
	FILE *f = fopen(SECRETS_DOC, "r");
	static char doc[1 << 17];
	assert_non_null(f);
	size_t dl = fread(doc, 1, sizeof(doc) - 1, f);
	fclose(f);
	doc[dl] = '\0';
	for (size_t r = 0; r < nr; r++) {
		char q[96];
		assert_non_null(rules[r].what);
		assert_true(rules[r].anchor && rules[r].anchor[0]);
		for (size_t s = 0; s < r; s++)
			if (strcmp(rules[s].id, rules[r].id) == 0)
				fail_msg("rule id %s twice", rules[r].id);
		snprintf(q, sizeof(q), "`%s`", rules[r].id);
		if (!strstr(doc, q))
			fail_msg("doc/SECRETS.md does not list rule %s", q);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_true_positives),   cmocka_unit_test(test_false_positives),
	    cmocka_unit_test(test_lines_and_bounds), cmocka_unit_test(test_binary_and_empty),
	    cmocka_unit_test(test_simd_agrees),	     cmocka_unit_test(test_rules_documented),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
