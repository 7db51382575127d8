/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The user's approvals of repository policy files (see trust.h).
 *
 * Record file (text, at most TRUST_RECORD_MAX bytes):
 *
 *   airlock-trust 1
 *   <64 hex digits: trust_digest of the approved content>
 *   <the workspace's realpath>
 *
 * The path is the rest of the file after the second line, without its
 * final newline, so any byte but NUL may appear in it.
 */
#include "airlock/policy/trust.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/io.h"

#define MAGIC	    "airlock-trust 1\n"
#define DOMAIN	    "airlock trust v1" /* hashed with its NUL */
#define NAME_BYTES  16		       /* record name: BLAKE2b-128 of the path, in hex */
#define PATH_BUF    4096
#define RECORD_NAME (NAME_BYTES * 2)

void trust_digest(const char *ws, const void *content, size_t len, uint8_t out[TRUST_DIGEST_LEN])
{
	crypto_generichash_state st;

	crypto_generichash_init(&st, NULL, 0, TRUST_DIGEST_LEN);
	crypto_generichash_update(&st, (const unsigned char *)DOMAIN, sizeof(DOMAIN));
	crypto_generichash_update(&st, (const unsigned char *)ws, strlen(ws) + 1);
	crypto_generichash_update(&st, content, len);
	crypto_generichash_final(&st, out, TRUST_DIGEST_LEN);
}

int trust_store_dir(char *out, size_t n, char *err, size_t errlen)
{
	const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
	int k;

	/* the XDG spec: a relative XDG_CONFIG_HOME is invalid and ignored */
	if (xdg && xdg[0] == '/')
		k = snprintf(out, n, "%s/airlock/trust", xdg);
	else if (home && home[0] == '/')
		k = snprintf(out, n, "%s/.config/airlock/trust", home);
	else {
		errmsg_set(err, errlen, "no trust store: set HOME or XDG_CONFIG_HOME to an absolute path");
		return -ENOENT;
	}
	if (k < 0 || (size_t)k >= n) {
		errmsg_set(err, errlen, "trust store path too long");
		return -ENAMETOOLONG;
	}
	return 0;
}

/* store dir + "/" + record name of ws */
static int record_path(const char *ws, char *out, size_t n, char *err, size_t errlen)
{
	uint8_t h[NAME_BYTES];
	char hex[RECORD_NAME + 1];
	size_t dl;
	int r;

	if ((r = trust_store_dir(out, n, err, errlen)) < 0)
		return r;
	crypto_generichash(h, sizeof(h), (const unsigned char *)ws, strlen(ws), NULL, 0);
	sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
	dl = strlen(out);
	if (dl + 1 + RECORD_NAME >= n) {
		errmsg_set(err, errlen, "trust store path too long");
		return -ENAMETOOLONG;
	}
	out[dl] = '/';
	memcpy(out + dl + 1, hex, RECORD_NAME + 1);
	return 0;
}

/* Read a record; 0 with the digest and path filled, or -errno / -EINVAL
 * (not ours, or malformed). */
static int record_read(int dfd, const char *name, uint8_t digest[TRUST_DIGEST_LEN], char *ws, size_t wslen)
{
	char buf[TRUST_RECORD_MAX + 1];
	struct stat st;
	size_t got = 0;
	int fd, r = 0;

	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 022)) {
		close(fd);
		return -EINVAL;
	}
	for (;;) {
		ssize_t k = read(fd, buf + got, sizeof(buf) - got);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			r = -errno;
			break;
		}
		if (k == 0)
			break;
		got += (size_t)k;
		if (got == sizeof(buf)) {
			r = -EINVAL;
			break;
		}
	}
	close(fd);
	if (r < 0)
		return r;
	const size_t ml = strlen(MAGIC), hl = TRUST_DIGEST_LEN * 2;
	if (got < ml + hl + 3 || memcmp(buf, MAGIC, ml) != 0 || buf[ml + hl] != '\n' || buf[got - 1] != '\n' ||
	    memchr(buf, '\0', got))
		return -EINVAL;
	size_t bin = 0;
	if (sodium_hex2bin(digest, TRUST_DIGEST_LEN, buf + ml, hl, NULL, &bin, NULL) != 0 || bin != TRUST_DIGEST_LEN)
		return -EINVAL;
	size_t pl = got - 1 - (ml + hl + 1);
	if (pl + 1 > wslen || buf[ml + hl + 1] != '/')
		return -EINVAL;
	memcpy(ws, buf + ml + hl + 1, pl);
	ws[pl] = '\0';
	return 0;
}

int trust_is_approved(const char *ws, const uint8_t digest[TRUST_DIGEST_LEN])
{
	char path[PATH_BUF], rws[PATH_BUF], e[256];
	uint8_t have[TRUST_DIGEST_LEN];

	if (record_path(ws, path, sizeof(path), e, sizeof(e)) < 0)
		return 0;
	char *slash = strrchr(path, '/');
	*slash = '\0';
	int dfd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return 0;
	int r = record_read(dfd, slash + 1, have, rws, sizeof(rws));
	close(dfd);
	return r == 0 && strcmp(rws, ws) == 0 && sodium_memcmp(have, digest, TRUST_DIGEST_LEN) == 0;
}

/* mkdir -p for the store: every missing level 0700. */
static int make_store(char *dir, char *err, size_t errlen)
{
	for (char *p = dir + 1;; p++) {
		if (*p != '/' && *p != '\0')
			continue;
		char c = *p;
		*p = '\0';
		int r = mkdir(dir, 0700) < 0 && errno != EEXIST ? -errno : 0;
		*p = c;
		if (r < 0) {
			errmsg_set(err, errlen, "trust store %s: %s", dir, strerror(-r));
			return r;
		}
		if (!c)
			break;
	}
	struct stat st;
	if (lstat(dir, &st) < 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid()) {
		errmsg_set(err, errlen, "trust store %s: not a directory of this user", dir);
		return -ENOTDIR;
	}
	if ((st.st_mode & 077) && chmod(dir, 0700) < 0) {
		int r = -errno;
		errmsg_set(err, errlen, "trust store %s: %s", dir, strerror(-r));
		return r;
	}
	return 0;
}

int trust_approve(const char *ws, const uint8_t digest[TRUST_DIGEST_LEN], char *err, size_t errlen)
{
	char path[PATH_BUF], tmp[PATH_BUF + 32], hex[TRUST_DIGEST_LEN * 2 + 1];
	int r, fd;

	if (ws[0] != '/' || strlen(ws) + strlen(MAGIC) + sizeof(hex) + 2 > TRUST_RECORD_MAX) {
		errmsg_set(err, errlen, "%s: not an absolute path of at most %u bytes", ws, TRUST_RECORD_MAX / 2);
		return -EINVAL;
	}
	if ((r = record_path(ws, path, sizeof(path), err, errlen)) < 0)
		return r;
	char *slash = strrchr(path, '/');
	*slash = '\0';
	r = make_store(path, err, errlen);
	*slash = '/';
	if (r < 0)
		return r;
	unsigned char rnd[8];
	char rhex[sizeof(rnd) * 2 + 1];
	randombytes_buf(rnd, sizeof(rnd));
	sodium_bin2hex(rhex, sizeof(rhex), rnd, sizeof(rnd));
	snprintf(tmp, sizeof(tmp), "%s.%s.tmp", path, rhex);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", tmp, strerror(-r));
		return r;
	}
	sodium_bin2hex(hex, sizeof(hex), digest, TRUST_DIGEST_LEN);
	if ((r = io_write_all(fd, MAGIC, strlen(MAGIC))) < 0 || (r = io_write_all(fd, hex, strlen(hex))) < 0 ||
	    (r = io_write_all(fd, "\n", 1)) < 0 || (r = io_write_all(fd, ws, strlen(ws))) < 0 ||
	    (r = io_write_all(fd, "\n", 1)) < 0 || (fsync(fd) < 0 && (r = -errno) < 0)) {
		close(fd);
		unlink(tmp);
		errmsg_set(err, errlen, "%s: %s", tmp, strerror(-r));
		return r;
	}
	close(fd);
	if (rename(tmp, path) < 0) {
		r = -errno;
		unlink(tmp);
		errmsg_set(err, errlen, "%s: %s", path, strerror(-r));
		return r;
	}
	return 0;
}

int trust_revoke(const char *ws, char *err, size_t errlen)
{
	char path[PATH_BUF];
	int r;

	if ((r = record_path(ws, path, sizeof(path), err, errlen)) < 0)
		return r;
	if (unlink(path) == 0)
		return 1;
	if (errno == ENOENT || errno == ENOTDIR)
		return 0;
	r = -errno;
	errmsg_set(err, errlen, "%s: %s", path, strerror(-r));
	return r;
}

int trust_list(trust_each_fn fn, void *ud, char *err, size_t errlen)
{
	char dir[PATH_BUF], ws[PATH_BUF];
	uint8_t digest[TRUST_DIGEST_LEN];
	struct dirent *de;
	DIR *d;
	int r = 0;

	if ((r = trust_store_dir(dir, sizeof(dir), err, errlen)) < 0)
		return r;
	if (!(d = opendir(dir))) {
		if (errno == ENOENT)
			return 0;
		r = -errno;
		errmsg_set(err, errlen, "trust store %s: %s", dir, strerror(-r));
		return r;
	}
	while ((de = readdir(d))) {
		if (strlen(de->d_name) != RECORD_NAME || strspn(de->d_name, "0123456789abcdef") != RECORD_NAME)
			continue; /* ".", "..", temporaries */
		if (record_read(dirfd(d), de->d_name, digest, ws, sizeof(ws)) < 0)
			continue;
		if ((r = fn(ws, digest, ud)) != 0)
			break;
	}
	closedir(d);
	return r;
}
