/* SPDX-License-Identifier: Apache-2.0 */
/*
 * refusefs: a FUSE passthrough over a backing directory that refuses names
 * the way a strict casefold ext4 does, for the tests on kernels without
 * casefold support (CONFIG_UNICODE off).
 *
 *   refusefs BACKING MOUNTPOINT [-f] [-s] [-o allow_other] [-o refuse_lookups]
 *
 * A name that is not valid UTF-8 (a malformed or truncated sequence, an
 * overlong form, a surrogate, beyond U+10FFFF) cannot be made: creat,
 * mknod, mkdir, symlink, a link's new name and a rename's target get
 * EINVAL, as ext4_add_entry gives them in a strict casefold directory.
 * Looking such a name up is ENOENT there (nothing can have it), and here
 * the same through BACKING, unless -o refuse_lookups makes every path
 * that is not UTF-8 EINVAL, lookups and stat included. Unlike ext4, code
 * points newer than its Unicode tables are accepted, and the whole tree
 * refuses (no per-directory +F). Everything else passes through to BACKING
 * with this process's credentials (the kernel checks modes first:
 * default_permissions): attributes, directories, links, renameat2 flags
 * (RENAME_NOREPLACE, RENAME_EXCHANGE), data, fsync, fallocate, statfs,
 * xattrs. O_TMPFILE is not offered (libfuse 3.14 has no tmpfile), so its
 * users see EOPNOTSUPP and take their fallback, and copy_file_range falls
 * back to the kernel's own copy.
 *
 * The high-level API names nodes by path, so two hard links are two kernel
 * inodes: attribute and entry caching are off (timeouts 0) and page caches
 * are dropped on open, so a write through one name is seen through the
 * other. An unlinked file that is still open stays readable and writable
 * through its descriptor (hard_remove, nullpath_ok): no .fuse_hidden files
 * appear; but what the kernel asks of it by node alone (fstat, xattrs) is
 * ESTALE then, its path being gone. airlock's apply does neither.
 */
#define FUSE_USE_VERSION 31

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <limits.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/xattr.h>
#include <unistd.h>

/* set once in main, before any request */
static int backing_fd = -1;
static char backing_path[PATH_MAX];
static int refuse_lookups; /* -o refuse_lookups */

/* Strict UTF-8: the shortest form, no surrogates, at most U+10FFFF. */
static bool utf8_valid(const char *str)
{
	const unsigned char *s = (const unsigned char *)str;

	while (*s) {
		uint32_t cp, min;
		size_t n;
		if (*s < 0x80) {
			s++;
			continue;
		}
		if ((*s & 0xe0) == 0xc0) {
			n = 1, cp = *s & 0x1fu, min = 0x80;
		} else if ((*s & 0xf0) == 0xe0) {
			n = 2, cp = *s & 0x0fu, min = 0x800;
		} else if ((*s & 0xf8) == 0xf0) {
			n = 3, cp = *s & 0x07u, min = 0x10000;
		} else {
			return false;
		}
		/* a NUL fails the continuation test: never read past the end */
		for (size_t i = 1; i <= n; i++) {
			if ((s[i] & 0xc0) != 0x80)
				return false;
			cp = cp << 6 | (s[i] & 0x3fu);
		}
		if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff))
			return false;
		s += n + 1;
	}
	return true;
}

/* The path FUSE gives ("/a/b") relative to the backing directory ("a/b",
 * "." for the root); -EINVAL if it is not UTF-8 and lookups refuse. */
static int rel(const char *path, const char **out)
{
	if (refuse_lookups && !utf8_valid(path))
		return -EINVAL;
	*out = path[1] ? path + 1 : ".";
	return 0;
}

/* The same for a name about to be made: -EINVAL if it is not UTF-8. */
static int rel_new(const char *path, const char **out)
{
	return utf8_valid(path) ? rel(path, out) : -EINVAL;
}

/* The backing path of path, for the calls that have no *at form. */
static int full(const char *path, char buf[PATH_MAX])
{
	const char *r;
	int e = rel(path, &r);
	if (e < 0)
		return e;
	int n = snprintf(buf, PATH_MAX, "%s/%s", backing_path, r);
	return n < 0 || n >= PATH_MAX ? -ENAMETOOLONG : 0;
}

static int neg(int r)
{
	return r < 0 ? -errno : r;
}

/* ---- attributes ---- */

static int op_getattr(const char *path, struct stat *st, struct fuse_file_info *fi)
{
	const char *r;
	int e;

	if (fi)
		return neg(fstat((int)fi->fh, st));
	if ((e = rel(path, &r)) < 0)
		return e;
	return neg(fstatat(backing_fd, r, st, AT_SYMLINK_NOFOLLOW));
}

/* glibc emulates AT_SYMLINK_NOFOLLOW with an O_PATH descriptor, and a
 * symlink's mode is EOPNOTSUPP, as the kernel's fchmodat2 says. */
static int op_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	const char *r;
	int e;

	if (fi)
		return neg(fchmod((int)fi->fh, mode));
	if ((e = rel(path, &r)) < 0)
		return e;
	return neg(fchmodat(backing_fd, r, mode, AT_SYMLINK_NOFOLLOW));
}

static int op_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	const char *r;
	int e;

	if (fi)
		return neg(fchown((int)fi->fh, uid, gid));
	if ((e = rel(path, &r)) < 0)
		return e;
	return neg(fchownat(backing_fd, r, uid, gid, AT_SYMLINK_NOFOLLOW));
}

static int op_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	char p[PATH_MAX];
	int e;

	if (fi)
		return neg(ftruncate((int)fi->fh, size));
	if ((e = full(path, p)) < 0)
		return e;
	return neg(truncate(p, size));
}

static int op_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	const char *r;
	int e;

	if (fi)
		return neg(futimens((int)fi->fh, tv));
	if ((e = rel(path, &r)) < 0)
		return e;
	return neg(utimensat(backing_fd, r, tv, AT_SYMLINK_NOFOLLOW));
}

static int op_access(const char *path, int mask)
{
	const char *r;
	int e = rel(path, &r);

	return e < 0 ? e : neg(faccessat(backing_fd, r, mask, 0));
}

static int op_statfs(const char *path, struct statvfs *sv)
{
	(void)path;
	return neg(fstatvfs(backing_fd, sv));
}

/* ---- names ---- */

static int op_readlink(const char *path, char *buf, size_t size)
{
	const char *r;
	int e;

	if ((e = rel(path, &r)) < 0)
		return e;
	if (size == 0)
		return -EINVAL;
	ssize_t n = readlinkat(backing_fd, r, buf, size - 1);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

static int op_mknod(const char *path, mode_t mode, dev_t rdev)
{
	const char *r;
	int e = rel_new(path, &r);

	return e < 0 ? e : neg(mknodat(backing_fd, r, mode, rdev));
}

static int op_mkdir(const char *path, mode_t mode)
{
	const char *r;
	int e = rel_new(path, &r);

	return e < 0 ? e : neg(mkdirat(backing_fd, r, mode));
}

static int op_unlink(const char *path)
{
	const char *r;
	int e = rel(path, &r);

	return e < 0 ? e : neg(unlinkat(backing_fd, r, 0));
}

static int op_rmdir(const char *path)
{
	const char *r;
	int e = rel(path, &r);

	return e < 0 ? e : neg(unlinkat(backing_fd, r, AT_REMOVEDIR));
}

/* The target is the link's content, not a name: never refused. */
static int op_symlink(const char *target, const char *path)
{
	const char *r;
	int e = rel_new(path, &r);

	return e < 0 ? e : neg(symlinkat(target, backing_fd, r));
}

static int op_rename(const char *from, const char *to, unsigned int flags)
{
	const char *rf, *rt;
	int e;

	if ((e = rel(from, &rf)) < 0 || (e = rel_new(to, &rt)) < 0)
		return e;
	return neg(renameat2(backing_fd, rf, backing_fd, rt, flags));
}

static int op_link(const char *from, const char *to)
{
	const char *rf, *rt;
	int e;

	if ((e = rel(from, &rf)) < 0 || (e = rel_new(to, &rt)) < 0)
		return e;
	return neg(linkat(backing_fd, rf, backing_fd, rt, 0));
}

/* ---- files ---- */

static int op_open(const char *path, struct fuse_file_info *fi)
{
	const char *r;
	int e, fd;

	if ((e = rel(path, &r)) < 0)
		return e;
	if ((fd = openat(backing_fd, r, fi->flags | O_CLOEXEC)) < 0)
		return -errno;
	fi->fh = (uint64_t)fd;
	return 0;
}

static int op_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	const char *r;
	int e, fd;

	if ((e = rel_new(path, &r)) < 0)
		return e;
	if ((fd = openat(backing_fd, r, fi->flags | O_CREAT | O_CLOEXEC, mode)) < 0)
		return -errno;
	fi->fh = (uint64_t)fd;
	return 0;
}

static int op_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	ssize_t n = pread((int)fi->fh, buf, size, off);
	return n < 0 ? -errno : (int)n;
}

static int op_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	ssize_t n = pwrite((int)fi->fh, buf, size, off);
	return n < 0 ? -errno : (int)n;
}

static int op_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	close((int)fi->fh);
	return 0;
}

static int op_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	return neg(datasync ? fdatasync((int)fi->fh) : fsync((int)fi->fh));
}

static int op_fallocate(const char *path, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
	(void)path;
	return neg(fallocate((int)fi->fh, mode, off, len));
}

/* ---- directories ---- */

static int op_opendir(const char *path, struct fuse_file_info *fi)
{
	const char *r;
	DIR *d;
	int e, fd;

	if ((e = rel(path, &r)) < 0)
		return e;
	if ((fd = openat(backing_fd, r, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0)
		return -errno;
	if (!(d = fdopendir(fd))) {
		e = -errno;
		close(fd);
		return e;
	}
	fi->fh = (uint64_t)(uintptr_t)d;
	return 0;
}

/* The whole directory at once (offsets 0): libfuse keeps it for the
 * handle and calls again from the start after a rewinddir. */
static int op_readdir(const char *path, void *buf, fuse_fill_dir_t fill, off_t off, struct fuse_file_info *fi,
		      enum fuse_readdir_flags flags)
{
	DIR *d = (DIR *)(uintptr_t)fi->fh;
	struct dirent *de;

	(void)path, (void)off, (void)flags;
	rewinddir(d);
	for (;;) {
		errno = 0;
		if (!(de = readdir(d)))
			return -errno;
		struct stat st = {.st_ino = de->d_ino, .st_mode = (mode_t)DTTOIF(de->d_type)};
		if (fill(buf, de->d_name, &st, 0, 0))
			return -ENOMEM; /* never with offsets 0: libfuse grows its buffer */
	}
}

static int op_releasedir(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	closedir((DIR *)(uintptr_t)fi->fh);
	return 0;
}

static int op_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
	int fd = dirfd((DIR *)(uintptr_t)fi->fh);

	(void)path;
	return neg(datasync ? fdatasync(fd) : fsync(fd));
}

/* ---- extended attributes (by path: there is no l*xattrat) ---- */

static int op_setxattr(const char *path, const char *name, const char *value, size_t size, int flags)
{
	char p[PATH_MAX];
	int e = full(path, p);

	return e < 0 ? e : neg(lsetxattr(p, name, value, size, flags));
}

static int op_getxattr(const char *path, const char *name, char *value, size_t size)
{
	char p[PATH_MAX];
	int e = full(path, p);

	return e < 0 ? e : neg((int)lgetxattr(p, name, value, size));
}

static int op_listxattr(const char *path, char *list, size_t size)
{
	char p[PATH_MAX];
	int e = full(path, p);

	return e < 0 ? e : neg((int)llistxattr(p, list, size));
}

static int op_removexattr(const char *path, const char *name)
{
	char p[PATH_MAX];
	int e = full(path, p);

	return e < 0 ? e : neg(lremovexattr(p, name));
}

static void *op_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	(void)conn;
	cfg->use_ino = 1;
	cfg->hard_remove = 1;
	cfg->nullpath_ok = 1;
	cfg->entry_timeout = 0;
	cfg->attr_timeout = 0;
	cfg->negative_timeout = 0;
	return NULL;
}

static const struct fuse_operations refusefs_ops = {
    .init = op_init,
    .getattr = op_getattr,
    .chmod = op_chmod,
    .chown = op_chown,
    .truncate = op_truncate,
    .utimens = op_utimens,
    .access = op_access,
    .statfs = op_statfs,
    .readlink = op_readlink,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .symlink = op_symlink,
    .rename = op_rename,
    .link = op_link,
    .open = op_open,
    .create = op_create,
    .read = op_read,
    .write = op_write,
    .release = op_release,
    .fsync = op_fsync,
    .fallocate = op_fallocate,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .releasedir = op_releasedir,
    .fsyncdir = op_fsyncdir,
    .setxattr = op_setxattr,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .removexattr = op_removexattr,
};

static const struct fuse_opt refusefs_opts[] = {
    {"refuse_lookups", 0, 1},
    FUSE_OPT_END,
};

int main(int argc, char **argv)
{
	struct fuse_args args = FUSE_ARGS_INIT(0, NULL);
	int rc = 1;

	if (argc < 3 || argv[1][0] == '-') {
		fprintf(stderr, "usage: refusefs BACKING MOUNTPOINT [-f] [-s] [-o allow_other,refuse_lookups,...]\n");
		return 2;
	}
	if (!realpath(argv[1], backing_path) ||
	    (backing_fd = open(backing_path, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		fprintf(stderr, "refusefs: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	/* modes arrive with the caller's umask applied: create them as given */
	umask(0);
	if (fuse_opt_add_arg(&args, argv[0]) < 0)
		goto out;
	for (int i = 2; i < argc; i++)
		if (fuse_opt_add_arg(&args, argv[i]) < 0)
			goto out;
	if (fuse_opt_parse(&args, &refuse_lookups, refusefs_opts, NULL) < 0)
		goto out;
	if (fuse_opt_add_arg(&args, "-odefault_permissions,fsname=refusefs") < 0)
		goto out;
	/* libfuse 3.14 says "Ignoring invalid max threads value" multithreaded:
	 * its own unset value, harmless (its default applies) */
	rc = fuse_main(args.argc, args.argv, &refusefs_ops, NULL);
out:
	fuse_opt_free_args(&args);
	close(backing_fd);
	return rc;
}
