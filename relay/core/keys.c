/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keys: key files, public key text, the derived sync-signing key.
 *
 * Key files are secrets, so they are read only if they are regular files of
 * mode 0600 or stricter (no symlinks: a link could point anywhere, and its
 * mode says nothing about the target's), and written so that no other user
 * ever sees a partial or group-readable file: a fresh 0600 temp file in the
 * same directory, fsync, then a rename that refuses to replace an existing
 * file.
 */
#include "airlock/core/errmsg.h"
#include "airlock/core/io.h"
#include "airlock/core/keys.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/mem.h"

#define KEYS_B64_CHARS	   44u		   /* base64 of 32 bytes, with one '=' */
#define KEYS_FILE_MAX	   128u		   /* a key file is 45 bytes; allow some trailing space */
#define KEYS_ALLOW_MAX	   (1024u * 1024u) /* allow-list file size cap */
#define KEYS_SIGNING_LABEL "airlock sync signing key v1"

_Static_assert(KEYS_B64_LEN == KEYS_B64_CHARS + 1, "keys.h buffer holds the text and a NUL");
_Static_assert(crypto_auth_hmacsha256_KEYBYTES == NOISE_KEY_LEN, "HMAC keyed by the 32-byte private key");
_Static_assert(crypto_sign_SEEDBYTES == crypto_auth_hmacsha256_BYTES, "Ed25519 seed is one HMAC output");
_Static_assert(crypto_sign_SECRETKEYBYTES == 64 && crypto_sign_PUBLICKEYBYTES == 32, "keys.h sizes");

static bool is_space(char c)
{
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f';
}

/* Decode exactly KEYS_B64_CHARS of standard base64 into 32 bytes. libsodium
 * rejects bad characters, missing padding and non-zero padding bits, so
 * every key has exactly one accepted text form. */
static int b64_decode_key(const char *s, size_t n, uint8_t out[NOISE_KEY_LEN])
{
	uint8_t tmp[NOISE_KEY_LEN + 4]; /* room to notice a longer decode */
	size_t binlen = 0;
	const char *end = NULL;
	int r = -EINVAL;

	if (n != KEYS_B64_CHARS)
		goto out;
	if (sodium_base642bin(tmp, sizeof(tmp), s, n, NULL, &binlen, &end, sodium_base64_VARIANT_ORIGINAL) != 0 ||
	    binlen != NOISE_KEY_LEN || end != s + n)
		goto out;
	memcpy(out, tmp, NOISE_KEY_LEN);
	r = 0;
out:
	sodium_memzero(tmp, sizeof(tmp));
	return r;
}

int keys_generate(struct noise_keypair *kp)
{
	int r;

	randombytes_buf(kp->priv, sizeof(kp->priv));
	if ((r = noise_pubkey(kp->pub, kp->priv)) < 0)
		sodium_memzero(kp, sizeof(*kp));
	return r;
}

/* Give the new file mode 0600 exactly (the umask can only remove bits, and
 * the owner must be able to read the key back), write it, and sync it. */
static int write_key_fd(int fd, const char *text, size_t n)
{
	int r;

	if (fchmod(fd, 0600) != 0)
		return -errno;
	if ((r = io_write_all(fd, text, n)) < 0)
		return r;
	if (fsync(fd) != 0)
		return -errno;
	return 0;
}

/* Move tmp to path unless path exists: renameat2(RENAME_NOREPLACE) where the
 * file system supports it, else link() (which never replaces) and unlink. */
static int install_noreplace(const char *tmp, const char *path)
{
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_NOREPLACE) == 0)
		return 0;
	if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
		return -errno;
	if (link(tmp, path) != 0)
		return -errno;
	(void)unlink(tmp);
	return 0;
}

/* Best effort: make the new directory entry durable. The key is already in
 * place when this runs, so a failure is not reported. */
static void sync_parent_dir(const char *path)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(path, '/');
	int fd;

	if (!slash)
		snprintf(dir, sizeof(dir), ".");
	else if (slash == path)
		snprintf(dir, sizeof(dir), "/");
	else
		snprintf(dir, sizeof(dir), "%.*s", (int)(slash - path), path);
	if ((fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return;
	(void)fsync(fd);
	close(fd);
}

int keys_save(const char *path, const struct noise_keypair *kp, char *err, size_t errlen)
{
	char text[KEYS_B64_LEN + 1];
	char tmp[PATH_MAX];
	struct stat st;
	bool created = false;
	int fd = -1, r;

	if (!path || !*path || !kp) {
		errmsg_set(err, errlen, "no key file name given");
		return -EINVAL;
	}
	/* Early, friendly refusal; install_noreplace() below is what makes it
	 * race-free. */
	if (lstat(path, &st) == 0) {
		errmsg_set(err, errlen, "key file %s already exists; refusing to overwrite it (move it away first)",
			   path);
		return -EEXIST;
	}
	sodium_bin2base64(text, KEYS_B64_LEN, kp->priv, NOISE_KEY_LEN, sodium_base64_VARIANT_ORIGINAL);
	text[KEYS_B64_CHARS] = '\n';
	text[KEYS_B64_CHARS + 1] = '\0';

	/* The temp file is next to the target so the rename stays inside one
	 * file system; O_EXCL with a random suffix, so an attacker-planted
	 * name (or symlink) is never opened. */
	for (int tries = 0;; tries++) {
		if ((size_t)snprintf(tmp, sizeof(tmp), "%s.tmp-%08x", path, randombytes_random()) >= sizeof(tmp)) {
			errmsg_set(err, errlen, "key file name %s is too long", path);
			r = -ENAMETOOLONG;
			goto out;
		}
		fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0)
			break;
		if (errno != EEXIST || tries >= 8) {
			r = -errno;
			errmsg_set(err, errlen, "cannot create key file %s: %s", path, strerror(-r));
			goto out;
		}
	}
	created = true;
	r = write_key_fd(fd, text, KEYS_B64_CHARS + 1);
	/* close() releases the descriptor even when it fails (Linux). */
	if (close(fd) != 0 && r == 0)
		r = -errno;
	fd = -1;
	if (r < 0) {
		errmsg_set(err, errlen, "cannot write key file %s: %s", path, strerror(-r));
		goto out;
	}
	if ((r = install_noreplace(tmp, path)) < 0) {
		if (r == -EEXIST)
			errmsg_set(err, errlen,
				   "key file %s already exists; refusing to overwrite it (move it away first)", path);
		else
			errmsg_set(err, errlen, "cannot create key file %s: %s", path, strerror(-r));
		goto out;
	}
	sync_parent_dir(path);
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	if (created)
		(void)unlink(tmp); /* after a successful rename: ENOENT, harmless */
	sodium_memzero(text, sizeof(text));
	return r;
}

int keys_load(const char *path, struct noise_keypair *kp, char *err, size_t errlen)
{
	char text[KEYS_FILE_MAX + 1];
	size_t len = 0;
	struct stat st;
	int fd = -1, r;

	if (!path || !*path || !kp) {
		errmsg_set(err, errlen, "no key file name given");
		return -EINVAL;
	}
	/* O_NONBLOCK: a FIFO planted in place of the key must not hang us
	 * before fstat() can refuse it; no effect on regular files. */
	fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		if (r == -ELOOP)
			errmsg_set(err, errlen,
				   "key file %s is a symbolic link; refusing to follow it (use the real path)", path);
		else
			errmsg_set(err, errlen, "cannot open key file %s: %s", path, strerror(-r));
		goto out;
	}
	if (fstat(fd, &st) != 0) {
		r = -errno;
		errmsg_set(err, errlen, "cannot stat key file %s: %s", path, strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		errmsg_set(err, errlen, "key file %s is not a regular file", path);
		goto out;
	}
	if (st.st_mode & 077) {
		r = -EPERM;
		errmsg_set(err, errlen, "key file %s is %s by group or others (mode %04o); run: chmod 600 %s", path,
			   (st.st_mode & 044) ? "readable" : "accessible", (unsigned)(st.st_mode & 07777), path);
		goto out;
	}
	/* Read up to one byte more than we accept, to notice a long file. */
	for (;;) {
		ssize_t n = read(fd, text + len, sizeof(text) - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			errmsg_set(err, errlen, "cannot read key file %s: %s", path, strerror(-r));
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len == sizeof(text)) {
			r = -EINVAL;
			errmsg_set(err, errlen, "key file %s is too long to be a key file", path);
			goto out;
		}
	}
	/* Exactly the base64 key, then only white space. */
	while (len && is_space(text[len - 1]))
		len--;
	if ((r = b64_decode_key(text, len, kp->priv)) < 0) {
		errmsg_set(err, errlen,
			   "key file %s does not hold a private key (expected 44 characters of base64, as written by "
			   "'airlock keygen')",
			   path);
		goto out;
	}
	if ((r = noise_pubkey(kp->pub, kp->priv)) < 0) {
		errmsg_set(err, errlen, "key file %s: cannot derive the public key", path);
		goto out;
	}
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	if (r < 0 && kp)
		sodium_memzero(kp, sizeof(*kp));
	sodium_memzero(text, sizeof(text));
	return r;
}

int keys_load_psk(const char *path, uint8_t psk[NOISE_KEY_LEN], char *err, size_t errlen)
{
	struct noise_keypair kp;
	char why[512];
	int r = keys_load(path, &kp, why, sizeof(why));

	if (r < 0) {
		sodium_memzero(psk, NOISE_KEY_LEN);
		errmsg_set(err, errlen, "--psk-file: %s", why);
	} else {
		memcpy(psk, kp.priv, NOISE_KEY_LEN);
	}
	sodium_memzero(&kp, sizeof(kp));
	return r;
}

void keys_pub_format(const uint8_t pub[NOISE_KEY_LEN], char out[KEYS_B64_LEN])
{
	sodium_bin2base64(out, KEYS_B64_LEN, pub, NOISE_KEY_LEN, sodium_base64_VARIANT_ORIGINAL);
}

/* Parse the key in text[0..n) after trimming white space at both ends. */
static int pub_parse_n(const char *text, size_t n, uint8_t pub[NOISE_KEY_LEN])
{
	while (n && is_space(*text))
		text++, n--;
	while (n && is_space(text[n - 1]))
		n--;
	return b64_decode_key(text, n, pub);
}

int keys_pub_parse(const char *text, uint8_t pub[NOISE_KEY_LEN])
{
	if (!text)
		return -EINVAL;
	return pub_parse_n(text, strlen(text), pub);
}

/* Read a whole regular file of at most `max` bytes into a mem_alloc'd
 * buffer (caller frees). */
static int read_small_file(const char *path, size_t max, char **out, size_t *outlen, char *err, size_t errlen)
{
	struct stat st;
	char *buf = NULL;
	size_t len = 0;
	int fd, r;

	fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0) {
		r = -errno;
		errmsg_set(err, errlen, "cannot open %s: %s", path, strerror(-r));
		goto out;
	}
	if (fstat(fd, &st) != 0) {
		r = -errno;
		errmsg_set(err, errlen, "cannot stat %s: %s", path, strerror(-r));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = S_ISDIR(st.st_mode) ? -EISDIR : -EINVAL;
		errmsg_set(err, errlen, "%s is not a regular file", path);
		goto out;
	}
	if ((uint64_t)st.st_size > max) {
		r = -EFBIG;
		errmsg_set(err, errlen, "%s is larger than %zu bytes", path, max);
		goto out;
	}
	/* +1: the file may have grown since fstat; reading into the spare
	 * byte tells us so. */
	if (!(buf = mem_alloc(max + 1))) {
		r = -ENOMEM;
		errmsg_set(err, errlen, "out of memory reading %s", path);
		goto out;
	}
	for (;;) {
		ssize_t n = read(fd, buf + len, max + 1 - len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			errmsg_set(err, errlen, "cannot read %s: %s", path, strerror(-r));
			goto out;
		}
		if (n == 0)
			break;
		len += (size_t)n;
		if (len > max) {
			r = -EFBIG;
			errmsg_set(err, errlen, "%s is larger than %zu bytes", path, max);
			goto out;
		}
	}
	*out = buf;
	*outlen = len;
	buf = NULL;
	r = 0;
out:
	if (fd >= 0)
		close(fd);
	mem_free(buf);
	return r;
}

/* One pass over the allow file: count keys (keys == NULL) or store them. */
static int allow_parse(const char *path, const char *data, size_t len, uint8_t (*keys)[NOISE_KEY_LEN], size_t *count,
		       char *err, size_t errlen)
{
	size_t line = 0, k = 0;
	const char *p = data, *end = data + len;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *eol = nl ? nl : end;
		const char *q = p;
		line++;
		while (q < eol && is_space(*q))
			q++;
		if (q < eol && *q != '#') {
			uint8_t pub[NOISE_KEY_LEN];
			if (pub_parse_n(q, (size_t)(eol - q), pub) < 0) {
				errmsg_set(
				    err, errlen,
				    "allow file %s line %zu: not a public key (expected 44 characters of base64)", path,
				    line);
				return -EINVAL;
			}
			if (keys)
				memcpy(keys[k], pub, NOISE_KEY_LEN);
			k++;
		}
		p = nl ? nl + 1 : end;
	}
	*count = k;
	return 0;
}

int keys_load_allow_file(const char *path, uint8_t (**keys)[NOISE_KEY_LEN], size_t *n, char *err, size_t errlen)
{
	char *data = NULL;
	size_t len = 0, count = 0;
	uint8_t(*grown)[NOISE_KEY_LEN];
	int r;

	if (!path || !keys || !n) {
		errmsg_set(err, errlen, "no allow file name given");
		return -EINVAL;
	}
	if ((r = read_small_file(path, KEYS_ALLOW_MAX, &data, &len, err, errlen)) < 0)
		goto out;
	/* Validate everything before touching *keys, so a bad line leaves the
	 * caller's list as it was. */
	if ((r = allow_parse(path, data, len, NULL, &count, err, errlen)) < 0)
		goto out;
	if (count == 0)
		goto out;
	if (*n > SIZE_MAX / NOISE_KEY_LEN - count) {
		r = -ENOMEM;
		errmsg_set(err, errlen, "allow file %s: too many keys", path);
		goto out;
	}
	if (!(grown = mem_realloc(*keys, (*n + count) * NOISE_KEY_LEN))) {
		r = -ENOMEM;
		errmsg_set(err, errlen, "out of memory reading allow file %s", path);
		goto out;
	}
	*keys = grown;
	if ((r = allow_parse(path, data, len, grown + *n, &count, err, errlen)) < 0)
		goto out; /* cannot happen: same bytes as the first pass */
	*n += count;
out:
	mem_free(data);
	return r;
}

int keys_signing_key(const struct noise_keypair *kp, uint8_t sk[64], uint8_t pk[32])
{
	uint8_t seed[crypto_sign_SEEDBYTES];
	int r = 0;

	if (!kp || !sk || !pk)
		return -EINVAL;
	/* seed = HMAC-SHA256(key = static private key, "airlock sync signing
	 * key v1"): one-way, so the signing key reveals nothing about the
	 * static key, and the label separates it from any other use. */
	crypto_auth_hmacsha256(seed, (const uint8_t *)KEYS_SIGNING_LABEL, sizeof(KEYS_SIGNING_LABEL) - 1, kp->priv);
	if (crypto_sign_seed_keypair(pk, sk, seed) != 0)
		r = -EINVAL;
	sodium_memzero(seed, sizeof(seed));
	return r;
}
