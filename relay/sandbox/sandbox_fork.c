/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sandbox_fork: the layer stack under a local sandbox's workspace copy and
 * home, and the state of its forks (sandbox_fork.h; doc/SANDBOX.md
 * "Forks"). The overlays themselves are mounted by sandbox_local.c inside
 * each sandbox's own user and mount namespace: nothing here mounts.
 *
 * The layers are directories the sandbox's uid owns; what the overlay
 * leaves in them (whiteouts: character devices 0/0; opaque directories:
 * the user.overlay.opaque xattr, "userxattr" mounts) is interpreted by the
 * merge and the change listing below, never by the host's tools.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/io.h"
#include "airlock/core/mem.h"
#include "airlock/sandbox/sandbox_fork.h"
#include "sandbox_i.h"

#include <stdarg.h>

#define TREE_DEPTH_MAX 256 /* directory nesting the merge and the listing follow */
#define OVL_XATTR      "user.overlay."

/* Paths in the state directory. That directory is short (its run/agent.sock
 * must fit a Unix socket address, sandbox_local.c), so these never come
 * near PATH_MAX; a path from a tree walk is checked where it is built. */
static void pathf(char *out, size_t n, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void pathf(char *out, size_t n, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	if ((size_t)vsnprintf(out, n, fmt, ap) >= n)
		out[0] = '\0'; /* an empty path fails every call it is given to */
	va_end(ap);
}

static int read_uint(const char *path, unsigned max, unsigned *out)
{
	char text[32], *end;
	FILE *f = fopen(path, "re");
	unsigned long v;

	if (!f)
		return -errno;
	if (!fgets(text, sizeof(text), f)) {
		fclose(f);
		return -EINVAL;
	}
	fclose(f);
	v = strtoul(text, &end, 10);
	if (end == text || v > max)
		return -EINVAL;
	*out = (unsigned)v;
	return 0;
}

static const char *const parts[] = {"workspace", "home"};
#define NPARTS (sizeof(parts) / sizeof(parts[0]))

bool sandbox_fork_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > SANDBOX_FORK_NAME_MAX ||
	    !((name[0] >= 'a' && name[0] <= 'z') || (name[0] >= '0' && name[0] <= '9')))
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = name[i];
		if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-' || c == '_'))
			return false;
	}
	return true;
}

static bool exists(const char *path)
{
	struct stat st;
	return lstat(path, &st) == 0;
}

static bool is_whiteout(const struct stat *st)
{
	return S_ISCHR(st->st_mode) && st->st_rdev == makedev(0, 0);
}

/* The frozen layers present, in increasing order (a merge interrupted by a
 * crash may leave a gap below). */
static unsigned layers_list(const char *dir, unsigned idx[SANDBOX_FORK_LAYERS_MAX + 1])
{
	char path[PATH_MAX];
	unsigned n = 0;

	for (unsigned i = 1; i <= SANDBOX_FORK_LAYERS_MAX + 1; i++) {
		pathf(path, sizeof(path), "%s/layers/%u", dir, i);
		if (exists(path))
			idx[n++] = i;
	}
	return n;
}

static int mkdir_owned(const char *path, uint32_t uid)
{
	if (mkdir(path, 0700) < 0 && errno != EEXIST)
		return -errno;
	if (uid && lchown(path, uid, uid) < 0)
		return -errno;
	return 0;
}

/* <base>/upper/<part> and <base>/work/<part> for every part. */
static int uppers_make(const char *base, uint32_t uid)
{
	static const char *const kinds[] = {"upper", "work"};
	char path[PATH_MAX];
	int r;

	for (size_t k = 0; k < 2; k++) {
		pathf(path, sizeof(path), "%s/%s", base, kinds[k]);
		if ((r = mkdir_owned(path, 0)) < 0)
			return r;
		for (size_t i = 0; i < NPARTS; i++) {
			pathf(path, sizeof(path), "%s/%s/%s", base, kinds[k], parts[i]);
			if ((r = mkdir_owned(path, uid)) < 0)
				return r;
		}
	}
	return 0;
}

static bool dir_empty(const char *path)
{
	DIR *d = opendir(path);
	struct dirent *e;
	bool empty = true;

	if (!d)
		return errno == ENOENT;
	while (empty && (e = readdir(d)))
		empty = !strcmp(e->d_name, ".") || !strcmp(e->d_name, "..");
	closedir(d);
	return empty;
}

static bool upper_empty(const char *dir)
{
	char path[PATH_MAX];

	for (size_t i = 0; i < NPARTS; i++) {
		pathf(path, sizeof(path), "%s/upper/%s", dir, parts[i]);
		if (!dir_empty(path))
			return false;
	}
	return true;
}

/* ---- removing and merging trees, by directory fd (never following a link) ---- */

static int remove_at(int dfd, const char *name, int depth);

/* A DIR over its own copy of fd (fd stays the caller's), depth checked. */
static int dir_read(int fd, int depth, DIR **out)
{
	int dup_fd;

	if (depth > TREE_DEPTH_MAX)
		return -ELOOP;
	if ((dup_fd = dup(fd)) < 0)
		return -errno;
	if (!(*out = fdopendir(dup_fd))) {
		close(dup_fd);
		return -errno;
	}
	return 0;
}

static int remove_children(int fd, int depth)
{
	DIR *d;
	struct dirent *e;
	int r;

	if ((r = dir_read(fd, depth, &d)) < 0)
		return r;
	r = 0;
	while (r == 0 && (e = readdir(d)))
		if (strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			r = remove_at(fd, e->d_name, depth + 1);
	closedir(d);
	return r;
}

static int remove_at(int dfd, const char *name, int depth)
{
	struct stat st;
	int fd, r;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return unlinkat(dfd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
	(void)fchmodat(dfd, name, (st.st_mode & 07777) | 0700, 0); /* a read-only directory of the sandbox's */
	if ((fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return -errno;
	r = remove_children(fd, depth);
	close(fd);
	if (r == 0 && unlinkat(dfd, name, AT_REMOVEDIR) < 0 && errno != ENOENT)
		r = -errno;
	return r;
}

static int remove_path(const char *path)
{
	int r = remove_at(AT_FDCWD, path, 0);
	return r;
}

static bool opaque_at(int dfd, const char *name)
{
	char v[4];
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return false;
	n = fgetxattr(fd, OVL_XATTR "opaque", v, sizeof(v));
	close(fd);
	return n == 1 && v[0] == 'y';
}

/* The overlay's own xattrs on an entry moved into the base. */
static void strip_ovl_xattrs(int dfd, const char *name)
{
	char list[4096];
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | O_NONBLOCK);
	ssize_t n;

	if (fd < 0)
		return; /* a symlink or a special file: nothing the overlay marks */
	if ((n = flistxattr(fd, list, sizeof(list))) > 0)
		for (ssize_t i = 0; i < n; i += (ssize_t)strlen(list + i) + 1)
			if (!strncmp(list + i, OVL_XATTR, strlen(OVL_XATTR)))
				(void)fremovexattr(fd, list + i);
	close(fd);
}

/* Apply the layer directory sfd onto dfd, as the overlay shows them. */
static int merge_dir(int sfd, int dfd, int depth)
{
	DIR *d;
	struct dirent *e;
	int r;

	if ((r = dir_read(sfd, depth, &d)) < 0)
		return r;
	r = 0;
	while (r == 0 && (e = readdir(d))) {
		struct stat st, dt;
		const char *nm = e->d_name;
		bool have;

		if (!strcmp(nm, ".") || !strcmp(nm, ".."))
			continue;
		if (fstatat(sfd, nm, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		if (is_whiteout(&st)) {
			r = remove_at(dfd, nm, depth + 1);
			continue;
		}
		have = fstatat(dfd, nm, &dt, AT_SYMLINK_NOFOLLOW) == 0;
		if (S_ISDIR(st.st_mode)) {
			int s2, d2;
			if (have && (!S_ISDIR(dt.st_mode) || opaque_at(sfd, nm))) {
				if ((r = remove_at(dfd, nm, depth + 1)) < 0)
					break;
				have = false;
			}
			if (!have && (mkdirat(dfd, nm, 0700) < 0 ||
				      fchownat(dfd, nm, st.st_uid, st.st_gid, AT_SYMLINK_NOFOLLOW) < 0)) {
				r = -errno;
				break;
			}
			(void)fchmodat(dfd, nm, (st.st_mode & 07777) | 0700, 0);
			if ((s2 = openat(sfd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
			    (d2 = openat(dfd, nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
				r = -errno;
				if (s2 >= 0)
					close(s2);
				break;
			}
			r = merge_dir(s2, d2, depth + 1);
			close(s2);
			close(d2);
			(void)fchmodat(dfd, nm, st.st_mode & 07777, 0);
			continue;
		}
		if (have && S_ISDIR(dt.st_mode) && (r = remove_at(dfd, nm, depth + 1)) < 0)
			break;
		if (renameat(sfd, nm, dfd, nm) < 0) {
			r = -errno;
			break;
		}
		if (S_ISREG(st.st_mode))
			strip_ovl_xattrs(dfd, nm);
	}
	closedir(d);
	return r;
}

static int merge_path(const char *src, const char *dst)
{
	int s = open(src, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC), d, r;

	if (s < 0)
		return errno == ENOENT ? 0 : -errno;
	if ((d = open(dst, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		r = -errno;
		close(s);
		return r;
	}
	r = merge_dir(s, d, 0);
	close(s);
	close(d);
	return r;
}

/* ---- the stack ---- */

int sandbox_fork_compact(const char *dir, char *err, size_t errlen)
{
	unsigned idx[SANDBOX_FORK_LAYERS_MAX + 1], n = layers_list(dir, idx);
	char src[PATH_MAX], dst[PATH_MAX], path[PATH_MAX];
	char **names = NULL;
	size_t nforks = 0;
	int r;

	pathf(path, sizeof(path), "%s/upper", dir);
	if (n == 0 && !exists(path))
		return 0;
	if ((r = sandbox_fork_list(dir, &names, &nforks)) < 0)
		goto fail;
	for (size_t i = 0; i < nforks; i++)
		mem_free(names[i]);
	mem_free(names);
	if (nforks) {
		errmsg_set(err, errlen, "%zu fork(s) still use the layers of %s", nforks, dir);
		return -EBUSY;
	}
	/* oldest first, then the parent's upper; each layer is removed once
	 * merged, so an interrupted compaction resumes where it stopped */
	for (unsigned k = 0; k <= n; k++) {
		char layer[PATH_MAX];
		if (k < n)
			pathf(layer, sizeof(layer), "%s/layers/%u", dir, idx[k]);
		else
			pathf(layer, sizeof(layer), "%s/upper", dir);
		for (size_t i = 0; i < NPARTS; i++) {
			pathf(src, sizeof(src), "%s/%s", layer, parts[i]);
			pathf(dst, sizeof(dst), "%s/%s", dir, parts[i]);
			if ((r = merge_path(src, dst)) < 0) {
				pathf(path, sizeof(path), "%s", src);
				goto fail;
			}
		}
		pathf(path, sizeof(path), "%s", layer);
		if ((r = remove_path(layer)) < 0)
			goto fail;
	}
	pathf(path, sizeof(path), "%s/work", dir);
	if ((r = remove_path(path)) < 0)
		goto fail;
	pathf(path, sizeof(path), "%s/layers", dir);
	if ((r = remove_path(path)) < 0)
		goto fail;
	return 0;
fail:
	errmsg_set(err, errlen, "merging the fork layers of %s (%s): %s", dir, path, strerror(-r));
	return r;
}

int sandbox_fork_freeze(const char *dir, unsigned *depth, char *err, size_t errlen)
{
	uint32_t uid = 0;
	unsigned idx[SANDBOX_FORK_LAYERS_MAX + 1], n;
	char path[PATH_MAX], layer[PATH_MAX];
	char **names = NULL;
	size_t nforks = 0;
	int r;

	if ((r = sandbox_fork_list(dir, &names, &nforks)) < 0) {
		errmsg_set(err, errlen, "listing the forks of %s: %s", dir, strerror(-r));
		return r;
	}
	for (size_t i = 0; i < nforks; i++)
		mem_free(names[i]);
	mem_free(names);
	if (nforks == 0 && (r = sandbox_fork_compact(dir, err, errlen)) < 0)
		return r;
	(void)sandbox_uid_file_read(dir, &uid); /* none: the invoking user's sandbox */
	n = layers_list(dir, idx);
	pathf(path, sizeof(path), "%s/upper", dir);
	if (exists(path) && !upper_empty(dir)) {
		unsigned next = n ? idx[n - 1] + 1 : 1;
		if (next > SANDBOX_FORK_LAYERS_MAX) {
			errmsg_set(err, errlen,
				   "%u fork generations are stacked under this sandbox while forks still use them: "
				   "remove the forks (airlock fork --rm NAME) so the layers can be merged",
				   next - 1);
			return -ENOSPC;
		}
		pathf(layer, sizeof(layer), "%s/layers", dir);
		if ((r = mkdir_owned(layer, 0)) < 0)
			goto fail;
		pathf(layer, sizeof(layer), "%s/layers/%u", dir, next);
		if (rename(path, layer) < 0) {
			r = -errno;
			goto fail;
		}
		n++;
	}
	if ((r = uppers_make(dir, uid)) < 0)
		goto fail;
	*depth = n;
	return 0;
fail:
	errmsg_set(err, errlen, "freezing the sandbox's layers in %s: %s", dir, strerror(-r));
	return r;
}

static int write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "we");
	int r = 0;

	if (!f)
		return -errno;
	if (fputs(text, f) < 0)
		r = -EIO;
	if (fclose(f) != 0 && r == 0)
		r = -errno;
	return r;
}

/* The agent's sync state (small files: the last applied batch), so the
 * fork's agent starts where the parent's stood. */
static int agent_state_copy(const char *dir, const char *fdir, uint32_t uid)
{
	char src[PATH_MAX], dst[PATH_MAX];
	DIR *d;
	struct dirent *e;
	int r = 0;

	pathf(src, sizeof(src), "%s/agent", dir);
	pathf(dst, sizeof(dst), "%s/agent", fdir);
	if ((r = mkdir_owned(dst, uid)) < 0)
		return r;
	if (!(d = opendir(src)))
		return errno == ENOENT ? 0 : -errno;
	while (r == 0 && (e = readdir(d))) {
		char s[PATH_MAX + 256], t[PATH_MAX + 256], buf[65536];
		struct stat st;
		int in, out;
		ssize_t k;

		pathf(s, sizeof(s), "%s/%s", src, e->d_name);
		pathf(t, sizeof(t), "%s/%s", dst, e->d_name);
		if (lstat(s, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > (1 << 20))
			continue;
		if ((in = open(s, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0)
			continue;
		if ((out = open(t, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
			r = -errno;
			close(in);
			break;
		}
		while ((k = read(in, buf, sizeof(buf))) > 0)
			if (write(out, buf, (size_t)k) != k) {
				r = -EIO;
				break;
			}
		if (uid && fchown(out, uid, uid) < 0)
			r = -errno;
		close(in);
		close(out);
	}
	closedir(d);
	return r;
}

/* The lowest slot no fork holds: <dir>/run.<slot>, made. */
static int slot_take(const char *dir, uint32_t uid, unsigned *slot)
{
	char path[PATH_MAX];

	for (unsigned s = 1; s <= SANDBOX_FORK_MAX; s++) {
		pathf(path, sizeof(path), "%s/run.%u", dir, s);
		if (mkdir(path, 0700) == 0) {
			*slot = s;
			return uid && lchown(path, uid, uid) < 0 ? -errno : 0;
		}
		if (errno != EEXIST)
			return -errno;
	}
	return -ENOSPC;
}

int sandbox_fork_make(const char *dir, const char *name, unsigned depth, int64_t ttl_s, char *err, size_t errlen)
{
	uint32_t uid = 0;
	unsigned slot = 0;
	char fdir[PATH_MAX], path[PATH_MAX + 32], text[512];
	char **names = NULL;
	size_t nforks = 0;
	int r;

	if (!sandbox_fork_name_ok(name)) {
		errmsg_set(
		    err, errlen,
		    "bad fork name '%.40s': use 1 to %d of a-z, 0-9, '-' and '_', starting with a letter or digit",
		    name, SANDBOX_FORK_NAME_MAX);
		return -EINVAL;
	}
	if ((r = sandbox_fork_list(dir, &names, &nforks)) < 0)
		goto fail;
	for (size_t i = 0; i < nforks; i++)
		mem_free(names[i]);
	mem_free(names);
	(void)sandbox_uid_file_read(dir, &uid);
	if (nforks >= SANDBOX_FORK_MAX) {
		errmsg_set(err, errlen,
			   "this sandbox already has %zu forks (at most %d): remove some (airlock fork --rm)", nforks,
			   SANDBOX_FORK_MAX);
		return -ENOSPC;
	}
	pathf(path, sizeof(path), "%s/forks", dir);
	if ((r = mkdir_owned(path, 0)) < 0)
		goto fail;
	pathf(fdir, sizeof(fdir), "%s/forks/%s", dir, name);
	if (mkdir(fdir, 0700) < 0) {
		r = -errno;
		if (r == -EEXIST) {
			errmsg_set(err, errlen, "a fork named '%s' exists already", name);
			return r;
		}
		goto fail;
	}
	snprintf(text, sizeof(text), "{\"name\":\"%s\",\"created\":%lld,\"ttl_seconds\":%lld,\"depth\":%u}\n", name,
		 (long long)time(NULL), (long long)ttl_s, depth);
	pathf(path, sizeof(path), "%s/meta.json", fdir);
	if ((r = uppers_make(fdir, uid)) < 0 || (r = agent_state_copy(dir, fdir, uid)) < 0 ||
	    (r = write_text(path, text)) < 0)
		goto undo;
	if ((r = slot_take(dir, uid, &slot)) < 0)
		goto undo;
	pathf(path, sizeof(path), "%s/slot", fdir);
	snprintf(text, sizeof(text), "%u\n", slot);
	if ((r = write_text(path, text)) < 0) {
		pathf(path, sizeof(path), "%s/run.%u", dir, slot);
		(void)remove_path(path);
		goto undo;
	}
	pathf(path, sizeof(path), "%s/depth", fdir);
	snprintf(text, sizeof(text), "%u\n", depth);
	if ((r = write_text(path, text)) < 0) /* last: a fork without it is half made */
		goto undo;
	return 0;
undo:
	(void)remove_path(fdir);
fail:
	errmsg_set(err, errlen, "creating the fork '%s' in %s: %s", name, dir, strerror(-r));
	return r;
}

int sandbox_fork_run_dir(const char *dir, const char *fork, char *out, size_t n)
{
	char path[PATH_MAX];
	unsigned slot;
	int r;

	pathf(path, sizeof(path), "%s/forks/%s/slot", dir, fork);
	if ((r = read_uint(path, SANDBOX_FORK_MAX, &slot)) < 0)
		return r;
	pathf(out, n, "%s/run.%u", dir, slot);
	return 0;
}

int sandbox_fork_remove(const char *dir, const char *name, char *err, size_t errlen)
{
	char fdir[PATH_MAX], run[PATH_MAX];
	int r;

	if (!sandbox_fork_name_ok(name)) {
		errmsg_set(err, errlen, "bad fork name '%.40s'", name);
		return -EINVAL;
	}
	pathf(fdir, sizeof(fdir), "%s/forks/%s", dir, name);
	if (!exists(fdir)) {
		errmsg_set(err, errlen, "no fork named '%s'", name);
		return -ENOENT;
	}
	if (sandbox_fork_run_dir(dir, name, run, sizeof(run)) == 0)
		(void)remove_path(run);
	if ((r = remove_path(fdir)) < 0)
		errmsg_set(err, errlen, "removing %s: %s", fdir, strerror(-r));
	return r;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int sandbox_fork_list(const char *dir, char ***names, size_t *n)
{
	char path[PATH_MAX];
	DIR *d;
	struct dirent *e;
	char **v = NULL;
	size_t cap = 0;

	*names = NULL;
	*n = 0;
	pathf(path, sizeof(path), "%s/forks", dir);
	if (!(d = opendir(path)))
		return errno == ENOENT ? 0 : -errno;
	while ((e = readdir(d))) {
		char depth[PATH_MAX + 300];
		if (!sandbox_fork_name_ok(e->d_name))
			continue;
		pathf(depth, sizeof(depth), "%s/%s/depth", path, e->d_name);
		if (!exists(depth))
			continue; /* half made (a crash in sandbox_fork_make): not a fork */
		if (*n == cap) {
			char **nv = mem_realloc(v, (cap = cap ? cap * 2 : 8) * sizeof(*v));
			if (!nv)
				goto nomem;
			v = nv;
		}
		if (!(v[*n] = mem_strdup(e->d_name)))
			goto nomem;
		(*n)++;
	}
	closedir(d);
	if (*n)
		qsort(v, *n, sizeof(*v), str_cmp);
	*names = v;
	return 0;
nomem:
	closedir(d);
	for (size_t i = 0; i < *n; i++)
		mem_free(v[i]);
	mem_free(v);
	*n = 0;
	return -ENOMEM;
}

/* ---- stacks for sandbox_local.c ---- */

static int read_depth(const char *fdir, unsigned *depth)
{
	char path[PATH_MAX];

	pathf(path, sizeof(path), "%s/depth", fdir);
	return read_uint(path, SANDBOX_FORK_LAYERS_MAX, depth);
}

/* The lower stack of depth layers (top first), then the base. */
static int lowers_fill(const char *dir, unsigned depth, const char *part, struct sandbox_stack *st)
{
	unsigned idx[SANDBOX_FORK_LAYERS_MAX + 1], n = layers_list(dir, idx);

	if (depth > n)
		return -ENOENT; /* a layer of this fork is gone */
	st->nlower = 0;
	for (unsigned k = depth; k > 0; k--)
		pathf(st->lower[st->nlower++], PATH_MAX, "%s/layers/%u/%s", dir, idx[k - 1], part);
	pathf(st->lower[st->nlower++], PATH_MAX, "%s/%s", dir, part);
	return 0;
}

int sandbox_stack_of(const char *dir, const char *fork, const char *part, struct sandbox_stack *st)
{
	char base[PATH_MAX];
	unsigned depth = 0, idx[SANDBOX_FORK_LAYERS_MAX + 1];
	int r;

	memset(st, 0, sizeof(*st));
	if (fork) {
		pathf(base, sizeof(base), "%s/forks/%s", dir, fork);
		if ((r = read_depth(base, &depth)) < 0)
			return r;
	} else {
		pathf(base, sizeof(base), "%s/upper", dir);
		if (!exists(base)) { /* no stack: the base itself, read-write */
			pathf(st->upper, sizeof(st->upper), "%s/%s", dir, part);
			return 0;
		}
		pathf(base, sizeof(base), "%s", dir);
		depth = layers_list(dir, idx);
	}
	if ((r = lowers_fill(dir, depth, part, st)) < 0)
		return r;
	st->overlay = true;
	pathf(st->upper, sizeof(st->upper), "%s/upper/%s", base, part);
	pathf(st->work, sizeof(st->work), "%s/work/%s", base, part);
	return 0;
}

int sandbox_stack_work_reset(const struct sandbox_stack *st, uint32_t uid)
{
	int r;

	if (!st->overlay)
		return 0;
	if ((r = remove_path(st->work)) < 0)
		return r;
	return mkdir_owned(st->work, uid);
}

/* ---- what a fork changed ---- */

struct walk {
	const char *dir;
	struct sandbox_stack st; /* the fork's workspace stack */
	sandbox_fork_change_fn *fn;
	void *ud;
	char path[PATH_MAX]; /* relative to the workspace */
};

static bool same_file(int ufd, const char *name, const struct stat *us, const char *lower_path)
{
	struct stat ls;
	bool same = false;

	if (lstat(lower_path, &ls) < 0 || (ls.st_mode & S_IFMT) != (us->st_mode & S_IFMT) ||
	    (ls.st_mode & 07777) != (us->st_mode & 07777) || ls.st_size != us->st_size)
		return false;
	if (S_ISLNK(us->st_mode)) {
		char a[PATH_MAX], b[PATH_MAX];
		ssize_t na = readlinkat(ufd, name, a, sizeof(a)), nb = readlink(lower_path, b, sizeof(b));
		return na >= 0 && na == nb && !memcmp(a, b, (size_t)na);
	}
	if (S_ISREG(us->st_mode)) {
		int a = openat(ufd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC),
		    b = open(lower_path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
		char ba[65536], bb[65536];
		ssize_t ka, kb;
		same = a >= 0 && b >= 0;
		while (same) {
			ka = read(a, ba, sizeof(ba));
			kb = read(b, bb, sizeof(bb));
			if (ka != kb || ka < 0 || memcmp(ba, bb, (size_t)ka))
				same = false;
			if (ka <= 0)
				break;
		}
		if (a >= 0)
			close(a);
		if (b >= 0)
			close(b);
	}
	return same;
}

/* The lower's version of w->path: the first layer (top first) that has
 * it; "" when it is absent (a whiteout, or no layer has it). */
static void lower_of(const struct walk *w, char *out, size_t n)
{
	for (unsigned i = 0; i < w->st.nlower; i++) {
		struct stat st;
		pathf(out, n, "%s/%s", w->st.lower[i], w->path);
		if (lstat(out, &st) == 0) {
			if (is_whiteout(&st))
				break;
			return;
		}
	}
	out[0] = '\0';
}

static int walk_dir(struct walk *w, int fd, int depth)
{
	size_t len = strlen(w->path);
	DIR *d;
	struct dirent *e;
	int r;

	if ((r = dir_read(fd, depth, &d)) < 0)
		return r;
	r = 0;
	while (r == 0 && (e = readdir(d))) {
		struct stat st;
		char lower[PATH_MAX * 2];
		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		if ((size_t)snprintf(w->path + len, sizeof(w->path) - len, "%s%s", len ? "/" : "", e->d_name) >=
		    sizeof(w->path) - len) {
			r = -ENAMETOOLONG;
			break;
		}
		if (fstatat(fd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			r = -errno;
			break;
		}
		if (is_whiteout(&st)) {
			r = w->fn(w->path, true, w->ud);
		} else if (S_ISDIR(st.st_mode)) {
			int sub;
			lower_of(w, lower, sizeof(lower));
			/* an opaque directory replaced the lower's: its old content goes */
			if (opaque_at(fd, e->d_name) && lower[0] && (r = w->fn(w->path, true, w->ud)) != 0)
				break;
			if ((sub = openat(fd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
				r = -errno;
				break;
			}
			r = walk_dir(w, sub, depth + 1);
			close(sub);
		} else if (S_ISREG(st.st_mode) || S_ISLNK(st.st_mode)) {
			lower_of(w, lower, sizeof(lower));
			if (!lower[0] || !same_file(fd, e->d_name, &st, lower))
				r = w->fn(w->path, false, w->ud);
		}
		w->path[len] = '\0';
	}
	closedir(d);
	w->path[len] = '\0';
	return r;
}

int sandbox_fork_changes(const char *dir, const char *name, sandbox_fork_change_fn *fn, void *ud)
{
	struct walk *w;
	int fd, r;

	if (!sandbox_fork_name_ok(name))
		return -EINVAL;
	if (!(w = mem_calloc(1, sizeof(*w))))
		return -ENOMEM;
	w->dir = dir;
	w->fn = fn;
	w->ud = ud;
	if ((r = sandbox_stack_of(dir, name, "workspace", &w->st)) < 0)
		goto out;
	if ((fd = open(w->st.upper, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		r = -errno;
		goto out;
	}
	r = walk_dir(w, fd, 0);
	close(fd);
out:
	mem_free(w);
	return r;
}

/* ---- files for a fork before it starts, and a fork's changes staged for its parent ---- */

static bool component_ok(const char *s)
{
	return s[0] && s[0] != '.' && !strchr(s, '/') && strlen(s) < 128;
}

int sandbox_fork_seed(const char *dir, const char *name, const char *file, const void *data, size_t n, char *err,
		      size_t errlen)
{
	char path[PATH_MAX];
	uint32_t uid = 0;
	int fd, r = 0;

	if (!sandbox_fork_name_ok(name) || !component_ok(file + (file[0] == '.')) || strchr(file, '/')) {
		errmsg_set(err, errlen, "bad seed '%.40s' for fork '%.40s'", file, name);
		return -EINVAL;
	}
	(void)sandbox_uid_file_read(dir, &uid);
	pathf(path, sizeof(path), "%s/forks/%s/upper/home/%s", dir, name, file);
	if ((fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", path, strerror(errno));
		return r;
	}
	r = io_write_all(fd, data, n);
	if (r == 0 && uid && fchown(fd, uid, uid) < 0)
		r = -errno;
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r < 0) {
		errmsg_set(err, errlen, "writing %s: %s", path, strerror(-r));
		(void)unlink(path);
	}
	return r;
}

struct stage {
	const char *upper; /* the fork's workspace upper */
	char root[PATH_MAX], files[PATH_MAX + 8];
	int deleted_fd;
	uint32_t uid;
	size_t nfiles, ndeleted;
};

/* root/rel's parent directories, made (owned by uid) as needed. */
static int parents_make(const char *root, const char *rel, uint32_t uid)
{
	char path[PATH_MAX];
	int r;

	for (const char *s = strchr(rel, '/'); s; s = strchr(s + 1, '/')) {
		pathf(path, sizeof(path), "%s/%.*s", root, (int)(s - rel), rel);
		if (!path[0])
			return -ENAMETOOLONG;
		if ((r = mkdir_owned(path, uid)) < 0)
			return r;
	}
	return 0;
}

static int stage_one(const char *path, bool deleted, void *ud)
{
	struct stage *g = ud;
	char src[PATH_MAX], dst[PATH_MAX];
	int r;

	if (deleted) {
		size_t n = strlen(path) + 1;
		g->ndeleted++;
		return write(g->deleted_fd, path, n) == (ssize_t)n ? 0 : -EIO;
	}
	pathf(src, sizeof(src), "%s/%s", g->upper, path);
	pathf(dst, sizeof(dst), "%s/%s", g->files, path);
	if (!src[0] || !dst[0])
		return -ENAMETOOLONG;
	if ((r = parents_make(g->files, path, g->uid)) < 0)
		return r;
	g->nfiles++;
	return linkat(AT_FDCWD, src, AT_FDCWD, dst, 0) < 0 ? -errno : 0; /* a symlink is linked, never followed */
}

int sandbox_fork_stage(const char *dir, const char *name, const char *stage, size_t *nfiles, size_t *ndeleted,
		       char *err, size_t errlen)
{
	struct sandbox_stack *home = mem_calloc(1, sizeof(*home)), *ws = mem_calloc(1, sizeof(*ws));
	struct stage *g = mem_calloc(1, sizeof(*g));
	char path[PATH_MAX + 16];
	int r;

	if (!home || !ws || !g) {
		r = -ENOMEM;
		goto out;
	}
	g->deleted_fd = -1;
	if (!sandbox_fork_name_ok(name) || !component_ok(stage)) {
		r = -EINVAL;
		goto out;
	}
	(void)sandbox_uid_file_read(dir, &g->uid);
	if ((r = sandbox_stack_of(dir, NULL, "home", home)) < 0 ||
	    (r = sandbox_stack_of(dir, name, "workspace", ws)) < 0)
		goto out;
	g->upper = ws->upper;
	pathf(g->root, sizeof(g->root), "%s/.airlock-try", home->upper);
	if ((r = mkdir_owned(g->root, g->uid)) < 0)
		goto out;
	pathf(g->root, sizeof(g->root), "%s/.airlock-try/%s", home->upper, stage);
	(void)remove_path(g->root); /* a stage an interrupted replay left */
	pathf(g->files, sizeof(g->files), "%s/files", g->root);
	if ((r = mkdir_owned(g->root, g->uid)) < 0 || (r = mkdir_owned(g->files, g->uid)) < 0)
		goto out;
	pathf(path, sizeof(path), "%s/deleted", g->root);
	if ((g->deleted_fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0 ||
	    (g->uid && fchown(g->deleted_fd, g->uid, g->uid) < 0)) {
		r = -errno;
		goto out;
	}
	r = sandbox_fork_changes(dir, name, stage_one, g);
	*nfiles = g->nfiles;
	*ndeleted = g->ndeleted;
out:
	if (r < 0) {
		errmsg_set(err, errlen, "staging the changes of fork '%.40s' for the sandbox: %s", name, strerror(-r));
		if (g && g->root[0])
			(void)remove_path(g->root);
	}
	if (g && g->deleted_fd >= 0)
		close(g->deleted_fd);
	mem_free(home);
	mem_free(ws);
	mem_free(g);
	return r;
}
