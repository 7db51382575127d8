/* SPDX-License-Identifier: Apache-2.0 */
/* audit: per-workspace audit records (audit.h). */
#include "airlock/core/errmsg.h"
#include "airlock/sync/audit.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/core/mem.h"

int audit_workspace_id(const char *dir, char id[33])
{
	char real[PATH_MAX];
	uint8_t h[crypto_hash_sha256_BYTES];

	if (!realpath(dir, real))
		return -errno;
	crypto_hash_sha256(h, (const uint8_t *)real, strlen(real));
	sodium_bin2hex(id, 33, h, 16);
	return 0;
}

static int mkdir_p(char *path)
{
	for (char *p = path + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		int r = mkdir(path, 0700);
		*p = '/';
		if (r < 0 && errno != EEXIST)
			return -errno;
	}
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

int audit_dir(const char *dir, int create, char *out, size_t outlen, char *err, size_t errlen)
{
	char id[33];
	const char *base = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
	int r, n;

	if ((r = audit_workspace_id(dir, id)) < 0) {
		errmsg_set(err, errlen, "%s: %s", dir, strerror(-r));
		return r;
	}
	if (base && base[0] == '/')
		n = snprintf(out, outlen, "%s/airlock/%s", base, id);
	else if (home && home[0] == '/')
		n = snprintf(out, outlen, "%s/.local/state/airlock/%s", home, id);
	else {
		errmsg_set(err, errlen, "neither XDG_STATE_HOME nor HOME is set to an absolute path: set one");
		return -ENOENT;
	}
	if (n < 0 || (size_t)n >= outlen) {
		errmsg_set(err, errlen, "audit directory path too long");
		return -ENAMETOOLONG;
	}
	if (create && (r = mkdir_p(out)) < 0) {
		errmsg_set(err, errlen, "%s: %s", out, strerror(-r));
		return r;
	}
	return 0;
}

int audit_write_json(const char *dir, const char *name, void *json, char *err, size_t errlen)
{
	char adir[PATH_MAX], path[PATH_MAX + 64], tmp[PATH_MAX + 96];
	int r, fd;

	if ((r = audit_dir(dir, 1, adir, sizeof(adir), err, errlen)) < 0)
		return r;
	snprintf(path, sizeof(path), "%s/%s", adir, name);
	snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", adir, name, (int)getpid());
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", tmp, strerror(-r));
		return r;
	}
	FILE *f = fdopen(fd, "w");
	if (!f) {
		r = -errno;
		close(fd);
		unlink(tmp);
		errmsg_set(err, errlen, "%s: %s", tmp, strerror(-r));
		return r;
	}
	/* the stream's errno names the cause (ENOSPC, EROFS, EDQUOT) */
	errno = 0;
	r = json_dumpf((json_t *)json, f, JSON_INDENT(1)) < 0 || fputc('\n', f) == EOF || fflush(f) != 0 ||
		    fsync(fileno(f)) < 0
		? -(errno ? errno : EIO)
		: 0;
	if (fclose(f) != 0 && r == 0)
		r = -(errno ? errno : EIO);
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0) {
		unlink(tmp);
		errmsg_set(err, errlen, "%s: %s", path, strerror(-r));
	}
	return r;
}

static json_t *records_json(const struct sync_record *v, size_t n, const char *what)
{
	json_t *a = json_array();

	for (size_t i = 0; a && i < n; i++) {
		json_t *o = json_pack("{s:s, s:s}", "path", v[i].path, what, v[i].rule);
		if (!o || json_array_append_new(a, o) < 0) {
			json_decref(a);
			return NULL;
		}
	}
	return a;
}

int audit_save_withheld(const char *dir, const char *policy_source, const struct sync_record *withheld, size_t nw,
			uint64_t withheld_total, const struct sync_record *skipped, size_t ns, uint64_t skipped_total,
			char *err, size_t errlen)
{
	char real[PATH_MAX], when[32];
	time_t now = time(NULL);
	struct tm tm;
	int r;

	if (!realpath(dir, real)) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", dir, strerror(-r));
		return r;
	}
	gmtime_r(&now, &tm);
	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", &tm);
	json_t *w = records_json(withheld, nw, "rule"), *s = records_json(skipped, ns, "reason");
	json_t *o = w && s ? json_pack("{s:i, s:s, s:s, s:s, s:o, s:I, s:I, s:o, s:I, s:I}", "version", 1, "workspace",
				       real, "policy", policy_source, "time", when, "withheld", w, "withheld_total",
				       (json_int_t)withheld_total, "withheld_omitted",
				       (json_int_t)(withheld_total - nw), "skipped", s, "skipped_total",
				       (json_int_t)skipped_total, "skipped_omitted", (json_int_t)(skipped_total - ns))
			   : NULL;
	if (!o) {
		if (!(w && s)) {
			json_decref(w);
			json_decref(s);
		}
		errmsg_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	r = audit_write_json(dir, AUDIT_WITHHELD_FILE, o, err, errlen);
	json_decref(o);
	return r;
}

int audit_read_json(const char *dir, const char *name, void **json, char *err, size_t errlen)
{
	char adir[PATH_MAX], path[PATH_MAX + 64];
	struct stat st;
	json_error_t je;
	int r;

	*json = NULL;
	if ((r = audit_dir(dir, 0, adir, sizeof(adir), err, errlen)) < 0)
		return r;
	snprintf(path, sizeof(path), "%s/%s", adir, name);
	if (stat(path, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", path, strerror(-r));
		return r;
	}
	if (st.st_size > AUDIT_FILE_MAX) {
		errmsg_set(err, errlen, "%s: larger than %u MiB; remove it and sync again", path, AUDIT_FILE_MAX >> 20);
		return -EFBIG;
	}
	json_t *j = json_load_file(path, 0, &je);
	if (!j) {
		errmsg_set(err, errlen, "%s:%d: %s (remove it and sync again)", path, je.line, je.text);
		return -EINVAL;
	}
	*json = j;
	return 0;
}
