/* SPDX-License-Identifier: Apache-2.0 */
/* keys: key files (save, load, permission and content checks), public key
 * text, allow files, the derived signing key. Works in a private temp dir. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "airlock/core/keys.h"
#include "airlock/core/mem.h"

static char dir[PATH_MAX];

/* dir/name, in one of four rotating static buffers. */
static const char *tpath(const char *name)
{
	static char p[4][PATH_MAX];
	static unsigned i;
	char *s = p[i++ % 4];

	if ((size_t)snprintf(s, PATH_MAX, "%s/%s", dir, name) >= PATH_MAX)
		fail_msg("path too long");
	return s;
}

/* Copy template into out with every '@' replaced by key. */
static size_t expand(char *out, size_t cap, const char *template, const char *key)
{
	size_t n = 0, klen = strlen(key);

	for (const char *t = template; *t; t++) {
		if (*t == '@') {
			assert_true(n + klen < cap);
			memcpy(out + n, key, klen);
			n += klen;
		} else {
			assert_true(n + 1 < cap);
			out[n++] = *t;
		}
	}
	out[n] = '\0';
	return n;
}

static void write_file(const char *path, const void *data, size_t n, mode_t mode)
{
	(void)unlink(path);
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, mode);
	assert_true(fd >= 0);
	assert_int_equal(fchmod(fd, mode), 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	assert_int_equal(close(fd), 0);
}

static size_t dir_entries(void)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	size_t n = 0;

	assert_non_null(d);
	while ((e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			n++;
	closedir(d);
	return n;
}

/* Each test starts with an empty temp dir. */
static int setup(void **state)
{
	(void)state;
	const char *tmp = getenv("TMPDIR");
	snprintf(dir, sizeof(dir), "%s/airlock-test-keys.XXXXXX", tmp && *tmp ? tmp : "/tmp");
	return mkdtemp(dir) ? 0 : -1;
}

static int teardown(void **state)
{
	(void)state;
	DIR *d = opendir(dir);
	struct dirent *e;

	if (d) {
		while ((e = readdir(d))) {
			if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
				continue;
			const char *p = tpath(e->d_name);
			if (unlink(p) != 0)
				(void)rmdir(p);
		}
		closedir(d);
	}
	return rmdir(dir);
}

static void test_roundtrip(void **state)
{
	(void)state;
	struct noise_keypair kp, got;
	char err[256], text[KEYS_B64_LEN], file[64];
	const char *path = tpath("host.key");
	struct stat st;

	assert_int_equal(keys_generate(&kp), 0);
	assert_int_equal(keys_save(path, &kp, err, sizeof(err)), 0);
	assert_int_equal(stat(path, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	/* exactly the base64 private key and a newline; no temp file left */
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, file, sizeof(file)), 45);
	close(fd);
	sodium_bin2base64(text, sizeof(text), kp.priv, 32, sodium_base64_VARIANT_ORIGINAL);
	assert_memory_equal(file, text, 44);
	assert_int_equal(file[44], '\n');
	assert_int_equal(dir_entries(), 1);

	assert_int_equal(keys_load(path, &got, err, sizeof(err)), 0);
	assert_memory_equal(got.priv, kp.priv, 32);
	assert_memory_equal(got.pub, kp.pub, 32);

	/* a stricter mode is fine */
	assert_int_equal(chmod(path, 0400), 0);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), 0);
	assert_memory_equal(got.pub, kp.pub, 32);

	/* exactly 0600 whatever the umask */
	mode_t old = umask(0277);
	assert_int_equal(keys_save(tpath("strict.key"), &kp, err, sizeof(err)), 0);
	umask(old);
	assert_int_equal(stat(tpath("strict.key"), &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);

	/* works with a relative path, and a NULL err buffer */
	char cwd[PATH_MAX];
	assert_non_null(getcwd(cwd, sizeof(cwd)));
	assert_int_equal(chdir(dir), 0);
	assert_int_equal(keys_save("rel.key", &kp, NULL, 0), 0);
	assert_int_equal(keys_load("rel.key", &got, NULL, 0), 0);
	assert_int_equal(chdir(cwd), 0);
	assert_memory_equal(got.priv, kp.priv, 32);
}

/* keys_load_psk: the secret bytes of a key file; errors say --psk-file and
 * leave nothing behind in the output. */
static void test_load_psk(void **state)
{
	(void)state;
	struct noise_keypair kp;
	uint8_t psk[32], zero[32] = {0};
	char err[600];
	const char *path = tpath("psk");

	assert_int_equal(keys_generate(&kp), 0);
	assert_int_equal(keys_save(path, &kp, err, sizeof(err)), 0);
	assert_int_equal(keys_load_psk(path, psk, err, sizeof(err)), 0);
	assert_memory_equal(psk, kp.priv, 32);

	memset(psk, 0xa5, sizeof(psk));
	assert_int_equal(keys_load_psk(tpath("missing"), psk, err, sizeof(err)), -ENOENT);
	assert_memory_equal(psk, zero, 32);
	assert_non_null(strstr(err, "--psk-file: "));
	assert_non_null(strstr(err, "missing"));

	assert_int_equal(chmod(path, 0644), 0);
	memset(psk, 0xa5, sizeof(psk));
	assert_true(keys_load_psk(path, psk, err, sizeof(err)) < 0);
	assert_memory_equal(psk, zero, 32);
	assert_non_null(strstr(err, "--psk-file: "));
}

static void test_mode_refused(void **state)
{
	(void)state;
	static const mode_t modes[] = {0644, 0640, 0604, 0660, 0606, 0620, 0602, 0610, 0601, 0777};
	struct noise_keypair kp, got;
	char err[512], want[64];
	const char *path = tpath("k");

	assert_int_equal(keys_generate(&kp), 0);
	assert_int_equal(keys_save(path, &kp, err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(modes) / sizeof(modes[0]); i++) {
		assert_int_equal(chmod(path, modes[i]), 0);
		memset(&got, 0xaa, sizeof(got));
		assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EPERM);
		snprintf(want, sizeof(want), "(mode %04o)", (unsigned)modes[i]);
		assert_non_null(strstr(err, want));
		assert_non_null(strstr(err, path));
		assert_non_null(strstr(err, "chmod 600"));
		assert_non_null(strstr(err, "group or others"));
		/* nothing of the key is handed out on failure */
		assert_true(sodium_is_zero((const uint8_t *)&got, sizeof(got)));
	}
	assert_int_equal(chmod(path, 0644), 0);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EPERM);
	assert_non_null(strstr(err, "readable by group or others (mode 0644); run: chmod 600 "));
}

static void test_not_regular(void **state)
{
	(void)state;
	struct noise_keypair kp, got;
	char err[512];
	const char *real = tpath("real.key"), *link = tpath("link.key"), *fifo = tpath("fifo"), *sub = tpath("sub");

	assert_int_equal(keys_generate(&kp), 0);
	assert_int_equal(keys_save(real, &kp, err, sizeof(err)), 0);

	/* a symlink, even to a good key file */
	assert_int_equal(symlink(real, link), 0);
	assert_int_equal(keys_load(link, &got, err, sizeof(err)), -ELOOP);
	assert_non_null(strstr(err, link));
	assert_non_null(strstr(err, "symbolic link"));

	/* a FIFO (must not block) and a directory */
	assert_int_equal(mkfifo(fifo, 0600), 0);
	assert_int_equal(keys_load(fifo, &got, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "not a regular file"));
	assert_int_equal(mkdir(sub, 0700), 0);
	assert_int_equal(keys_load(sub, &got, err, sizeof(err)), -EISDIR);
	assert_non_null(strstr(err, sub));

	/* missing */
	assert_int_equal(keys_load(tpath("nope"), &got, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "nope"));
}

static void test_garbage_refused(void **state)
{
	(void)state;
	uint8_t b33[33] = {0};
	char good[KEYS_B64_LEN], long33[64], buf[256];
	struct noise_keypair kp, got;
	char err[512];
	const char *path = tpath("g.key");

	assert_int_equal(keys_generate(&kp), 0);
	keys_pub_format(kp.priv, good); /* same text form as a key file */
	sodium_bin2base64(long33, sizeof(long33), b33, sizeof(b33), sodium_base64_VARIANT_ORIGINAL);

	const struct {
		const char *template; /* @ = a good key */
		const char *what;
	} bad[] = {
	    {"", "empty"},
	    {"\n", "only a newline"},
	    {"hello\n", "not base64"},
	    {" @\n", "leading space"},
	    {"@\nxyz\n", "a second line"},
	    {"@ @\n", "two keys"},
	    {"@A\n", "45 characters"},
	    {"-----BEGIN PRIVATE KEY-----\n", "PEM"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		size_t n = expand(buf, sizeof(buf), bad[i].template, good);
		write_file(path, buf, n, 0600);
		if (keys_load(path, &got, err, sizeof(err)) != -EINVAL)
			fail_msg("key file with %s was accepted", bad[i].what);
		assert_non_null(strstr(err, path));
	}

	/* 43 characters, a changed character outside the alphabet, url-safe
	 * alphabet, 33 bytes of base64 (also 44 chars), an embedded NUL,
	 * non-zero padding bits */
	char t[KEYS_B64_LEN + 2];
	memcpy(t, good, 44);
	t[44] = '\n';
	write_file(path, t + 1, 44, 0600);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EINVAL);
	t[3] = '!';
	write_file(path, t, 45, 0600);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EINVAL);
	t[3] = '-';
	write_file(path, t, 45, 0600);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EINVAL);
	t[3] = '\0';
	write_file(path, t, 45, 0600);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EINVAL);
	write_file(path, long33, strlen(long33), 0600);
	assert_int_equal(strlen(long33), 44);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EINVAL);
	memcpy(t, good, 44);
	/* the 43rd character carries 4 bits of key and 2 padding bits: set one */
	const char *alpha = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t v = (size_t)(strchr(alpha, t[42]) - alpha);
	t[42] = alpha[v ^ 1];
	write_file(path, t, 45, 0600);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EINVAL);

	/* a big file */
	char big[4096];
	memset(big, 'A', sizeof(big));
	write_file(path, big, sizeof(big), 0600);
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, path));

	/* trailing white space of any kind is fine */
	static const char *const tails[] = {"", "\n", "\n\n", "  \n", "\r\n", "\t \n \n"};
	for (size_t i = 0; i < sizeof(tails) / sizeof(tails[0]); i++) {
		int n = snprintf(buf, sizeof(buf), "%s%s", good, tails[i]);
		write_file(path, buf, (size_t)n, 0600);
		assert_int_equal(keys_load(path, &got, err, sizeof(err)), 0);
		assert_memory_equal(got.priv, kp.priv, 32);
		assert_memory_equal(got.pub, kp.pub, 32);
	}
}

static void test_overwrite_refused(void **state)
{
	(void)state;
	struct noise_keypair a, b, got;
	char err[512];
	const char *path = tpath("k");

	assert_int_equal(keys_generate(&a), 0);
	assert_int_equal(keys_generate(&b), 0);
	assert_int_equal(keys_save(path, &a, err, sizeof(err)), 0);
	assert_int_equal(keys_save(path, &b, err, sizeof(err)), -EEXIST);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "already exists"));
	assert_int_equal(keys_load(path, &got, err, sizeof(err)), 0);
	assert_memory_equal(got.priv, a.priv, 32);
	assert_int_equal(dir_entries(), 1); /* no temp file left behind */

	/* nor over a dangling symlink, or any other existing name */
	const char *ln = tpath("dangling");
	assert_int_equal(symlink(tpath("target"), ln), 0);
	assert_int_equal(keys_save(ln, &b, err, sizeof(err)), -EEXIST);
	assert_int_equal(access(tpath("target"), F_OK), -1);

	/* a directory that does not exist */
	assert_true(keys_save(tpath("no/such/dir/k"), &b, err, sizeof(err)) == -ENOENT);
	assert_non_null(strstr(err, "no/such/dir/k"));
	assert_int_equal(dir_entries(), 2);
}

static void test_pub_parse(void **state)
{
	(void)state;
	uint8_t pub[32], got[32], b33[33], b31[31];
	char text[KEYS_B64_LEN], buf[128];

	randombytes_buf(pub, sizeof(pub));
	keys_pub_format(pub, text);
	assert_int_equal(strlen(text), 44);
	assert_int_equal(text[43], '=');
	assert_int_equal(keys_pub_parse(text, got), 0);
	assert_memory_equal(got, pub, 32);
	/* formatting is deterministic */
	char again[KEYS_B64_LEN];
	keys_pub_format(got, again);
	assert_string_equal(again, text);

	/* surrounding white space is accepted */
	snprintf(buf, sizeof(buf), " \t%s\r\n", text);
	assert_int_equal(keys_pub_parse(buf, got), 0);
	assert_memory_equal(got, pub, 32);

	/* known answer: 32 zero bytes */
	memset(b33, 0, sizeof(b33));
	assert_int_equal(keys_pub_parse("AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=", got), 0);
	assert_true(sodium_is_zero(got, 32));

	randombytes_buf(b33, sizeof(b33));
	randombytes_buf(b31, sizeof(b31));
	char s33[64], s31[64];
	sodium_bin2base64(s33, sizeof(s33), b33, sizeof(b33), sodium_base64_VARIANT_ORIGINAL);
	sodium_bin2base64(s31, sizeof(s31), b31, sizeof(b31), sodium_base64_VARIANT_ORIGINAL);
	char nopad[64], url[64], mid[64], longer[64], shorter[64], bad[64];
	snprintf(nopad, sizeof(nopad), "%.43s", text);
	snprintf(longer, sizeof(longer), "%sA", text);
	snprintf(shorter, sizeof(shorter), "%.40s", text);
	snprintf(mid, sizeof(mid), "%.20s %s", text, text + 20);
	snprintf(bad, sizeof(bad), "%s", text);
	bad[5] = '*';
	sodium_bin2base64(url, sizeof(url), pub, 32, sodium_base64_VARIANT_URLSAFE);
	for (char *c = url; *c; c++) /* force at least one url-only character */
		if (*c == 'A') {
			*c = '-';
			break;
		}
	const char *const rejects[] = {"",
				       " ",
				       "\n",
				       s33,
				       s31,
				       nopad,
				       longer,
				       shorter,
				       mid,
				       bad,
				       "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAB=", /* padding bits set */
				       "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA==",
				       "-AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="};
	assert_int_equal(strlen(s33), 44); /* the length alone does not tell */
	for (size_t i = 0; i < sizeof(rejects) / sizeof(rejects[0]); i++)
		if (keys_pub_parse(rejects[i], got) != -EINVAL)
			fail_msg("keys_pub_parse accepted '%s'", rejects[i]);
	assert_int_equal(keys_pub_parse(NULL, got), -EINVAL);
	(void)url;
}

static void test_signing_key(void **state)
{
	(void)state;
	struct noise_keypair kp, other;
	uint8_t sk1[64], pk1[32], sk2[64], pk2[32], sk3[64], pk3[32], pkx[32], sig[64];
	static const char msg[] = "delta 42";

	assert_int_equal(keys_generate(&kp), 0);
	assert_int_equal(keys_signing_key(&kp, sk1, pk1), 0);
	assert_int_equal(keys_signing_key(&kp, sk2, pk2), 0);
	/* deterministic */
	assert_memory_equal(sk1, sk2, 64);
	assert_memory_equal(pk1, pk2, 32);
	/* not the X25519 key in either half */
	assert_memory_not_equal(sk1, kp.priv, 32);
	assert_memory_not_equal(pk1, kp.pub, 32);
	/* a consistent Ed25519 keypair */
	assert_int_equal(crypto_sign_ed25519_sk_to_pk(pkx, sk1), 0);
	assert_memory_equal(pkx, pk1, 32);
	assert_int_equal(crypto_sign_detached(sig, NULL, (const uint8_t *)msg, sizeof(msg), sk1), 0);
	assert_int_equal(crypto_sign_verify_detached(sig, (const uint8_t *)msg, sizeof(msg), pk1), 0);
	/* another static key gives another signing key */
	assert_int_equal(keys_generate(&other), 0);
	assert_int_equal(keys_signing_key(&other, sk3, pk3), 0);
	assert_memory_not_equal(pk3, pk1, 32);

	/* Known answer, pinning the derivation (a change here breaks every
	 * guest's pinned signing key): for the private key 00 01 .. 1f, the
	 * seed is HMAC-SHA256(key = priv, "airlock sync signing key v1") and
	 * pk its Ed25519 public key, both computed independently with Python
	 * (hmac; cryptography's Ed25519). libsodium's sk is seed || pk. */
	static const char seed_hex[] = "a2f540d8fd9b4bd88e6b057bb6b222775c1afc14ec474bd6c5ff76172883a80e";
	static const char pk_hex[] = "47851f78e05659f8e7279e0132c9192a871678d1a769245b78024689ff983daa";
	uint8_t seed[32], pkw[32];
	size_t n = 0;
	for (int i = 0; i < 32; i++)
		kp.priv[i] = (uint8_t)i;
	assert_int_equal(noise_pubkey(kp.pub, kp.priv), 0);
	assert_int_equal(keys_signing_key(&kp, sk1, pk1), 0);
	assert_int_equal(sodium_hex2bin(seed, sizeof(seed), seed_hex, 64, NULL, &n, NULL), 0);
	assert_int_equal(sodium_hex2bin(pkw, sizeof(pkw), pk_hex, 64, NULL, &n, NULL), 0);
	assert_memory_equal(sk1, seed, 32);
	assert_memory_equal(sk1 + 32, pkw, 32);
	assert_memory_equal(pk1, pkw, 32);
}

static void test_allow_file(void **state)
{
	(void)state;
	uint8_t(*keys)[NOISE_KEY_LEN] = NULL;
	uint8_t pub[3][32];
	char text[3][KEYS_B64_LEN], buf[512], err[512];
	const char *path = tpath("allow");
	size_t n = 0;

	for (int i = 0; i < 3; i++) {
		randombytes_buf(pub[i], 32);
		keys_pub_format(pub[i], text[i]);
	}
	int len = snprintf(buf, sizeof(buf), "# hosts allowed to connect\n\n%s\n   \n  # laptop\n  %s  \r\n", text[0],
			   text[1]);
	write_file(path, buf, (size_t)len, 0644);
	assert_int_equal(keys_load_allow_file(path, &keys, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	assert_memory_equal(keys[0], pub[0], 32);
	assert_memory_equal(keys[1], pub[1], 32);

	/* appends; no trailing newline needed */
	len = snprintf(buf, sizeof(buf), "%s", text[2]);
	write_file(path, buf, (size_t)len, 0644);
	assert_int_equal(keys_load_allow_file(path, &keys, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 3);
	assert_memory_equal(keys[2], pub[2], 32);

	/* a bad line: error names file and line, list unchanged */
	len = snprintf(buf, sizeof(buf), "%s\n# ok\nnot-a-key\n", text[0]);
	write_file(path, buf, (size_t)len, 0644);
	assert_int_equal(keys_load_allow_file(path, &keys, &n, err, sizeof(err)), -EINVAL);
	assert_int_equal(n, 3);
	assert_non_null(strstr(err, path));
	assert_non_null(strstr(err, "line 3"));

	/* empty file, comments only: nothing added */
	write_file(path, "# none\n", 7, 0644);
	assert_int_equal(keys_load_allow_file(path, &keys, &n, err, sizeof(err)), 0);
	assert_int_equal(n, 3);

	/* missing file */
	assert_int_equal(keys_load_allow_file(tpath("missing"), &keys, &n, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "missing"));
	assert_int_equal(n, 3);
	mem_free(keys);

	/* every allocation failing in turn: an error, no leak, list intact */
	len = snprintf(buf, sizeof(buf), "%s\n%s\n", text[0], text[1]);
	write_file(path, buf, (size_t)len, 0644);
	for (unsigned long fail = 1;; fail++) {
		keys = NULL;
		n = 0;
		mem_fail_at(fail, 0);
		int r = keys_load_allow_file(path, &keys, &n, err, sizeof(err));
		mem_fail_at(0, 0);
		if (r == 0) {
			assert_int_equal(n, 2);
			mem_free(keys);
			break;
		}
		assert_int_equal(r, -ENOMEM);
		assert_int_equal(n, 0);
		assert_null(keys);
		assert_true(fail < 10);
	}
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_roundtrip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_load_psk, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_mode_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_not_regular, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_garbage_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_overwrite_refused, setup, teardown),
	    cmocka_unit_test(test_pub_parse),
	    cmocka_unit_test(test_signing_key),
	    cmocka_unit_test_setup_teardown(test_allow_file, setup, teardown),
	};

	if (sodium_init() < 0)
		return 1;
	umask(022);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
