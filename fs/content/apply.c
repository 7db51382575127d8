/* SPDX-License-Identifier: Apache-2.0 */
/*
 * apply: confined, crash-safe application of verified delta batches
 * beneath the guest's workspace root. Contract and guarantees in
 * include/airlock/content/apply.h; reasoning in doc/SYNC.md ("Apply").
 */
#include "airlock/content/apply.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/fs.h>

#include <sodium.h>

#include "airlock/core/mem.h"

#ifndef SYS_fchmodat2
#define SYS_fchmodat2 452 /* Linux 6.6; the same number on every architecture */
#endif

#define RESERVED     MANIFEST_RESERVED_PREFIX
#define RESERVED_LEN (sizeof(RESERVED) - 1)
#define TMPNAME_LEN  (RESERVED_LEN + 16 + 1)
/* How deep a DELETE_TREE may go: one fd per level. */
#define RMTREE_DEPTH_MAX 256
#define ERR_LEN		 512
/* Parallel staging (stage_pending): most threads, fewest PUTs worth a
 * thread, PUTs of one directory per work item, and when the check pass
 * stops to stage what it has (PUTs waiting, parent fds held open). */
#define STAGE_THREADS_MAX 4u
#define STAGE_PAR_MIN	  32u
#define STAGE_GROUP_MAX	  32u
#define PEND_MAX	  4096u
#define DIRFDS_MAX	  64u
/* Most unnamed temporaries a batch holds open for the commit. */
#define HOLD_MAX 16384u

struct apply {
	int rootfd;
	struct apply_opts o;
	bool tmpfile_ok;    /* O_TMPFILE + linkat works here */
	bool exchange_ok;   /* renameat2(RENAME_EXCHANGE) works here (replace_entry) */
	bool fchmodat2_ok;  /* relaxed atomic: stagers read it, chmod_nofollow may clear it */
	bool noreplace_ok;  /* renameat2(RENAME_NOREPLACE) works here (commit of a new name) */
	unsigned threads;   /* stagers per batch (apply_opts.threads, or the CPUs online up to 4) */
	unsigned par_min;   /* fewest PUTs staged on more than one thread */
	size_t hold_max;    /* O_TMPFILEs a batch may hold open for the commit (RLIMIT_NOFILE) */
	bool empty_path_ok; /* linkat(AT_EMPTY_PATH) works for us (else /proc/self/fd); relaxed atomic */
	uint64_t last_seq;
	char err[ERR_LEN];
	char why[APPLY_FAIL_MSG_MAX + 1]; /* the last op failure, without its path */
	/* ops of the last batch that failed on their own (apply_failures) */
	struct apply_failure *fails;
	size_t nfails, capfails;
	uint64_t fails_total;
};

enum where {
	STAGE_NONE = 0,
	STAGE_TARGET = 1, /* temp is in the target's own directory */
	STAGE_DIR = 2,	  /* temp is in the batch's staging directory */
	STAGE_HELD = 3,	  /* an unnamed O_TMPFILE held open (hfd), linked at its name by the commit */
};

struct step {
	uint8_t where;
	uint8_t target; /* enum state of the path at the check (ST_ABSENT: a new name) */
	bool failed;	/* failed on its own (apply_failures); not committed */
	int hfd;	/* STAGE_HELD: the file */
	char tmp[TMPNAME_LEN];
};

/* A PUT checked in order and waiting to be staged (stage_pending). */
struct pend {
	uint32_t op;
	int dirfd;  /* where its temporary goes: its parent, or the staging directory */
	bool apart; /* dirfd is the staging directory */
};

struct stager;

/* One path an op touches, for "does an earlier op delete/make this?" */
struct pref {
	const char *path;
	uint32_t op;
	uint8_t type;
};

struct run {
	struct apply *a;
	struct delta_batch *b;
	struct apply_stats *st;
	struct step *steps;
	struct pref *index;
	size_t nops;
	int stagefd; /* staging directory, or -1 */
	char stagename[TMPNAME_LEN];
	uint8_t *scratch;
	size_t scratch_len;
	struct dirmode {
		const char *path;
		uint32_t mode;
		uint32_t op; /* the MKDIR or CHMOD it is for */
	} * dirmodes;
	size_t ndirmodes;
	char path[MANIFEST_PATH_MAX + 1]; /* working copy for prefixes */
	bool whole;			  /* apply_batch_whole: any failure is the batch's */
	/* A stager's copy of the run has its own of these: */
	struct run *main;	 /* the batch's run (itself in the main one) */
	char *err, *why;	 /* where op_fail writes: a->err and a->why, or a stager's own */
	struct delta_dctx *dctx; /* a stager's decompression context, made at its first zstd chunk */
	uint8_t rnd[64];	 /* random bytes for temporary names, */
	size_t rnd_used;	 /* one getrandom per 8 names */
	/* One-entry parent cache (parent_get): ops come sorted, runs share a parent. */
	char pc_path[MANIFEST_PATH_MAX + 1];
	int pc_fd;    /* -1: empty */
	bool pc_used; /* a pending PUT stages in pc_fd: keep it open until stage_pending */
	/* Phase 1's PUTs, checked and waiting to be staged (main run only). */
	struct pend *pend;
	size_t npend;
	int *dirfds; /* parents they stage in, closed by stage_pending */
	size_t ndirfds;
	size_t *groups; /* stage_pending: work items, as start indices into pend */
	size_t ngroups, next_group;
	bool stop;	      /* a stager failed for the batch (not on its own): stop early */
	size_t nheld;	      /* steps STAGE_HELD (atomic while stagers run) */
	pthread_mutex_t lock; /* the staging directory while stagers run */
	struct stager *stagers;
	size_t nstagers;
};

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
static void
fail_msg(struct apply *a, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(a->err, sizeof(a->err), fmt, ap);
	va_end(ap);
}

static const char *op_word(uint8_t t)
{
	switch (t) {
	case DELTA_MKDIR:
		return "MKDIR";
	case DELTA_PUT:
		return "PUT";
	case DELTA_SYMLINK:
		return "SYMLINK";
	case DELTA_CHMOD:
		return "CHMOD";
	case DELTA_DELETE:
		return "DELETE";
	}
	return "?";
}

/* Name an op and its path in the error message; returns r. */
static int op_fail(struct run *rn, size_t i, int r, const char *what)
{
	const struct delta_op *op = delta_batch_op(rn->b, i);
	snprintf(rn->err, ERR_LEN, "op %zu (%s %s): %s: %s", i, op_word(op->type), op->path, what, strerror(-r));
	snprintf(rn->why, APPLY_FAIL_MSG_MAX + 1, "%s: %s: %s", op_word(op->type), what, strerror(-r));
	return r;
}

/* A fresh random temporary name; rn NULL: straight from the kernel, else
 * from rn's pool (one getrandom per 8 names, not one per file). */
static void tmp_name(struct run *rn, char out[TMPNAME_LEN])
{
	static const char hex[] = "0123456789abcdef";
	uint8_t own[8], *rnd = own;

	if (!rn) {
		randombytes_buf(own, sizeof(own));
	} else {
		if (rn->rnd_used + 8 > sizeof(rn->rnd)) {
			randombytes_buf(rn->rnd, sizeof(rn->rnd));
			rn->rnd_used = 0;
		}
		rnd = rn->rnd + rn->rnd_used;
		rn->rnd_used += 8;
	}
	memcpy(out, RESERVED, RESERVED_LEN);
	for (size_t i = 0; i < 8; i++) {
		out[RESERVED_LEN + 2 * i] = hex[rnd[i] >> 4];
		out[RESERVED_LEN + 2 * i + 1] = hex[rnd[i] & 15];
	}
	out[TMPNAME_LEN - 1] = '\0';
}

/* ---- resolution ---- */

static bool walk_only(const struct apply *a)
{
	return a->o.flags & APPLY_NO_OPENAT2;
}

/* After a failed resolution of dir (a relative path in scratch): was it
 * refused because a component is a symlink (-ELOOP), or is something just
 * not a directory (-ENOTDIR)? openat2 reports a trailing symlink opened
 * with O_DIRECTORY as ENOTDIR; say which it was. Diagnosis only. */
static int classify(struct apply *a, char *dir, int r)
{
	if (r != -ENOTDIR)
		return r;
	int cur = a->rootfd;
	for (char *p = dir;;) {
		char *slash = strchr(p, '/');
		if (slash)
			*slash = '\0';
		struct stat st;
		int bad = fstatat(cur, p, &st, AT_SYMLINK_NOFOLLOW) < 0 ? r : S_ISLNK(st.st_mode) ? -ELOOP : 0;
		int next = bad || !slash ? -1 : openat(cur, p, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (slash)
			*slash = '/';
		if (cur != a->rootfd)
			close(cur);
		if (bad)
			return bad;
		if (next < 0)
			return r;
		cur = next;
		p = slash + 1;
	}
}

/* Open the parent directory of `path` beneath the root (O_PATH) and point
 * *name at the last component. */
static int open_parent(struct apply *a, const char *path, char *scratch, const char **name)
{
	const char *slash = strrchr(path, '/');
	int fd;

	if (!slash) {
		*name = path;
		fd = openat(a->rootfd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	size_t pl = (size_t)(slash - path);
	memcpy(scratch, path, pl);
	scratch[pl] = '\0';
	*name = slash + 1;
	fd = manifest_open_beneath(a->rootfd, scratch, O_PATH | O_DIRECTORY, walk_only(a));
	return fd < 0 ? classify(a, scratch, fd) : fd;
}

/*
 * The parent of `path` through rn's one-entry cache, *name its last
 * component; the fd stays rn's (parent_drop). The ops of a batch come
 * sorted, so a directory's files are one run: one lookup per run instead
 * of one per op. Only where nothing since the lookup can have moved that
 * parent: in phase 1 nothing but temporaries changes, and in phase 2 an
 * op changes entries of its own parent only (an op that changes the
 * resolution of P is on P or above it, so its parent is not P, and it
 * evicts P from the cache first).
 */
static int parent_get(struct run *rn, const char *path, const char **name)
{
	const char *slash = strrchr(path, '/');
	size_t pl = slash ? (size_t)(slash - path) : 0;

	*name = slash ? slash + 1 : path;
	if (rn->pc_fd >= 0 && strlen(rn->pc_path) == pl && memcmp(rn->pc_path, path, pl) == 0)
		return rn->pc_fd;
	const char *nm;
	int fd = open_parent(rn->a, path, rn->path, &nm);
	if (fd < 0)
		return fd;
	if (rn->pc_fd >= 0) {
		if (rn->pc_used) /* a pending PUT stages there: closed by stage_pending */
			rn->dirfds[rn->ndirfds++] = rn->pc_fd;
		else
			close(rn->pc_fd);
	}
	memcpy(rn->pc_path, path, pl);
	rn->pc_path[pl] = '\0';
	rn->pc_fd = fd;
	rn->pc_used = false;
	return fd;
}

static void parent_drop(struct run *rn)
{
	if (rn->pc_fd >= 0 && !rn->pc_used)
		close(rn->pc_fd);
	else if (rn->pc_fd >= 0)
		rn->dirfds[rn->ndirfds++] = rn->pc_fd;
	rn->pc_fd = -1;
	rn->pc_used = false;
}

/* ---- the op index ---- */

static int pref_cmp(const void *x, const void *y)
{
	const struct pref *p = x, *q = y;
	int c = strcmp(p->path, q->path);
	if (c)
		return c;
	return p->op < q->op ? -1 : p->op > q->op;
}

/* Is there an op of `type` on exactly `path` before op `before`? */
static bool op_before(const struct run *rn, const char *path, uint8_t type, size_t before)
{
	struct pref key = {.path = path, .op = 0};
	size_t lo = 0, hi = rn->nops;

	/* lower bound of (path, 0) */
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (pref_cmp(&rn->index[mid], &key) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	for (; lo < rn->nops && strcmp(rn->index[lo].path, path) == 0; lo++)
		if (rn->index[lo].type == type && rn->index[lo].op < before)
			return true;
	return false;
}

/* Does an op before `before` delete `path` or one of its ancestors? */
static bool deleted_before(struct run *rn, const char *path, size_t before)
{
	size_t n = strlen(path);

	memcpy(rn->path, path, n + 1);
	for (size_t i = n;; i--) {
		if (i == n || rn->path[i] == '/') {
			rn->path[i] = '\0';
			if (op_before(rn, rn->path, DELTA_DELETE, before))
				return true;
		}
		if (i == 0)
			break;
	}
	return false;
}

static void parent_of(const char *path, char *out)
{
	const char *slash = strrchr(path, '/');
	size_t pl = slash ? (size_t)(slash - path) : 0;
	memcpy(out, path, pl);
	out[pl] = '\0';
}

/* ---- small file helpers ---- */

/* Zero detection works on pieces of this size at this alignment (the page
 * size and the block size of the filesystems a copy lives on). */
#define HOLE_BLOCK 4096u

static bool all_zero(const uint8_t *p, size_t n)
{
	return n == 0 || (p[0] == 0 && memcmp(p, p + 1, n - 1) == 0);
}

static int pwrite_all(int fd, const uint8_t *p, size_t n, uint64_t off)
{
	while (n > 0) {
		ssize_t k = pwrite(fd, p, n, (off_t)off);
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0)
			return k < 0 ? -errno : -EIO;
		p += k;
		n -= (size_t)k;
		off += (uint64_t)k;
	}
	return 0;
}

/*
 * Writes one file's content so that a sparse file stays sparse in the
 * copy: zero runs are not written. fresh: the file holds nothing there yet
 * (a new temporary), so skipping them is enough; else (a clone of the old
 * file) the whole blocks of a zero run are punched out and its partial
 * edges written, or all of it written where the filesystem cannot punch.
 * Zero runs are followed across calls (chunk edges fall anywhere), so the
 * caller calls sparse_flush at the end, then sets the size (a file may end
 * in a hole).
 */
struct sparse_out {
	int fd;
	bool fresh;
	uint64_t zs, ze; /* pending zero run [zs, ze); empty when equal */
	uint64_t end;	 /* end of the last data written: a fresh file's size */
};

static int sparse_data(struct sparse_out *so, const uint8_t *p, size_t n, uint64_t off)
{
	if (off + n > so->end)
		so->end = off + n;
	return pwrite_all(so->fd, p, n, off);
}

static int sparse_zero_write(int fd, uint64_t off, uint64_t n)
{
	static const uint8_t zeros[HOLE_BLOCK];
	int r = 0;

	while (n > 0 && r == 0) {
		size_t k = n < sizeof(zeros) ? (size_t)n : sizeof(zeros);
		r = pwrite_all(fd, zeros, k, off);
		off += k;
		n -= k;
	}
	return r;
}

static int sparse_flush(struct sparse_out *so)
{
	uint64_t zs = so->zs, ze = so->ze;
	uint64_t hs = (zs + HOLE_BLOCK - 1) / HOLE_BLOCK * HOLE_BLOCK, he = ze / HOLE_BLOCK * HOLE_BLOCK;
	int r = 0;

	so->zs = so->ze = 0;
	if (so->fresh || zs == ze)
		return 0;
	if (hs >= he || fallocate(so->fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)hs, (off_t)(he - hs)) < 0)
		return sparse_zero_write(so->fd, zs, ze - zs);
	if (hs > zs)
		r = sparse_zero_write(so->fd, zs, hs - zs);
	if (r == 0 && ze > he)
		r = sparse_zero_write(so->fd, he, ze - he);
	return r;
}

/* p[0, n) at off. 0 or -errno. */
static int sparse_write(struct sparse_out *so, const uint8_t *p, size_t n, uint64_t off)
{
	size_t done = 0, ds = 0; /* [ds, done): data not written yet */
	int r;

	while (done < n) {
		uint64_t at = off + done;
		size_t k = HOLE_BLOCK - (size_t)(at % HOLE_BLOCK);
		if (k > n - done)
			k = n - done;
		if (all_zero(p + done, k)) {
			if ((ds < done && (r = sparse_data(so, p + ds, done - ds, off + ds)) < 0) ||
			    (so->ze != at && (r = sparse_flush(so)) < 0))
				return r;
			if (so->zs == so->ze)
				so->zs = at;
			so->ze = at + k;
			ds = done + k;
		} else if (so->zs != so->ze && (r = sparse_flush(so)) < 0) {
			return r;
		}
		done += k;
	}
	return ds < n ? sparse_data(so, p + ds, n - ds, off + ds) : 0;
}

static int dir_fsync(int pathfd)
{
	int fd = openat(pathfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int r = fsync(fd) < 0 ? -errno : 0;
	close(fd);
	return r;
}

/* ---- modes the way rsync applies them ----
 * The agent is not root in the guest, but it owns what it applied. A
 * directory without u+w or u+x (a read-only directory of the host's) is
 * made u+wx for the one change in it that needs it, and its mode is
 * restored right after; a file without u+r (mode 000 or 0200) is made
 * readable for the open of its old content (an edit in place reads the
 * unchanged chunks from it), and restored. Only after EACCES, only for an
 * inode we own; anything else stays the op's failure. */

/* chmod of the inode open at fd (an O_PATH fd too) through procfs; for a
 * directory without procfs, through a fresh fd of it. */
static int fd_chmod(int fd, mode_t mode)
{
	char proc[64];

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	if (fchmodat(AT_FDCWD, proc, mode, 0) == 0)
		return 0;
	if (errno != ENOENT)
		return -errno;
	int dfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	int r = fchmod(dfd, mode) < 0 ? -errno : 0;
	close(dfd);
	return r;
}

/* Directory dfd made u+wx: 1 (its old mode in *saved), 0 when that cannot
 * be why a change in it was refused (not ours, already u+wx), -errno. */
static int dir_unlock(int dfd, mode_t *saved)
{
	struct stat st;

	if (fstat(dfd, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 0300) == 0300)
		return 0;
	*saved = st.st_mode & 07777;
	int r = fd_chmod(dfd, *saved | 0300);
	return r < 0 ? r : 1;
}

enum dirop { DIROP_MKDIR, DIROP_UNLINK, DIROP_RMDIR, DIROP_RENAME, DIROP_EXCHANGE, DIROP_NOREPLACE };

/* linkat of the unnamed file open at fd as name in dfd: AT_EMPTY_PATH
 * (CAP_DAC_READ_SEARCH before Linux 6.10), else through procfs. */
static int link_fd(int fd, int dfd, const char *name, bool *empty_path_ok)
{
	char proc[64];

	if (__atomic_load_n(empty_path_ok, __ATOMIC_RELAXED)) {
		if (linkat(fd, "", dfd, name, AT_EMPTY_PATH) == 0)
			return 0;
		if (errno != ENOENT)
			return -1;
		struct stat st; /* ENOENT: no right to AT_EMPTY_PATH, unless dfd itself is gone */
		if (fstat(dfd, &st) < 0 || st.st_nlink == 0)
			return -1;
		__atomic_store_n(empty_path_ok, false, __ATOMIC_RELAXED);
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	return linkat(AT_FDCWD, proc, dfd, name, AT_SYMLINK_FOLLOW);
}

static int dirop_do(enum dirop k, int dfd, const char *name, int from, const char *fromname)
{
	int r = 0;

	switch (k) {
	case DIROP_MKDIR:
		r = mkdirat(dfd, name, 0700);
		break;
	case DIROP_UNLINK:
		r = unlinkat(dfd, name, 0);
		break;
	case DIROP_RMDIR:
		r = unlinkat(dfd, name, AT_REMOVEDIR);
		break;
	case DIROP_RENAME:
		r = renameat(from, fromname, dfd, name);
		break;
	case DIROP_EXCHANGE:
		r = renameat2(from, fromname, dfd, name, RENAME_EXCHANGE);
		break;
	case DIROP_NOREPLACE:
		r = renameat2(from, fromname, dfd, name, RENAME_NOREPLACE);
		break;
	}
	return r < 0 ? -errno : 0;
}

/* One change of directory dfd's entries (mkdir, unlink, rmdir, a rename
 * into it), with dfd made writable for it when that is what refused it. */
static int in_dir(enum dirop k, int dfd, const char *name, int from, const char *fromname)
{
	mode_t saved = 0;
	int r = dirop_do(k, dfd, name, from, fromname);

	if (r != -EACCES || dir_unlock(dfd, &saved) != 1)
		return r;
	r = dirop_do(k, dfd, name, from, fromname);
	int rr = fd_chmod(dfd, saved);
	return r < 0 ? r : rr;
}

/* The held unnamed file fd becomes `name` in dfd, which must be free
 * (-EEXIST), with dfd made writable for it when that is what refused it. */
static int link_held(struct apply *a, int dfd, const char *name, int fd)
{
	mode_t saved = 0;
	int r = link_fd(fd, dfd, name, &a->empty_path_ok) < 0 ? -errno : 0;

	if (r != -EACCES || dir_unlock(dfd, &saved) != 1)
		return r;
	r = link_fd(fd, dfd, name, &a->empty_path_ok) < 0 ? -errno : 0;
	int rr = fd_chmod(dfd, saved);
	return r < 0 ? r : rr;
}

/*
 * The staged temporary `tmp` (in directory from) becomes `name` in dfd.
 * Over an existing entry: an exchange, then the old entry (now under the
 * temporary's name) unlinked. ext4 (auto_da_alloc) and btrfs start the
 * writeback of a file's data when a rename replaces another file, so that
 * a crash after it does not leave an empty file: measured, that made the
 * rename 0.7 ms p50 and 15 ms p99 of a 12-byte edit on a busy disk, most
 * of a small edit's apply; an exchange does not do it (77 us p50 / 0.25 ms
 * p99 with its unlink). Either way the name is at every moment wholly old
 * or wholly new, and our own durability is the fsync policy's. Where the
 * filesystem has no exchange: a plain rename.
 */
static int replace_entry(struct apply *a, int dfd, const char *name, int from, const char *tmp, bool absent)
{
	int r;

	/* A name that was free at the check: one rename that must not replace
	 * anything; something that appeared there since takes the path below. */
	if (absent && a->noreplace_ok) {
		if ((r = in_dir(DIROP_NOREPLACE, dfd, name, from, tmp)) != -EEXIST && r != -EINVAL &&
		    r != -EOPNOTSUPP && r != -ENOSYS)
			return r;
		if (r != -EEXIST)
			a->noreplace_ok = false;
	}
	if (a->exchange_ok) {
		if ((r = in_dir(DIROP_EXCHANGE, dfd, name, from, tmp)) == 0) {
			if ((r = in_dir(DIROP_UNLINK, from, tmp, -1, NULL)) != -EISDIR)
				return 0; /* else a leftover temporary, removed by the next open or scan */
			/* a directory appeared there since the check: put it back */
			if (in_dir(DIROP_EXCHANGE, dfd, name, from, tmp) < 0)
				return -EIO;
			return -EISDIR;
		}
		if (r == -EINVAL || r == -EOPNOTSUPP || r == -ENOSYS)
			a->exchange_ok = false; /* this filesystem cannot: rename from now on */
		else if (r != -ENOENT && r != -EXDEV)
			return r;
	}
	return in_dir(DIROP_RENAME, dfd, name, from, tmp);
}

/* Remove `name` in dfd and everything beneath it, never following a
 * symlink; one fd per level. */
static int rmtree(int dfd, const char *name, unsigned depth)
{
	struct stat st;
	int r = 0;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISDIR(st.st_mode))
		return (r = in_dir(DIROP_UNLINK, dfd, name, -1, NULL)) == -ENOENT ? 0 : r;
	if (depth >= RMTREE_DEPTH_MAX)
		return -ELOOP;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	/* Read the names first so the DIR stream is closed while recursing. */
	for (;;) {
		int rfd = openat(fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
		if (rfd < 0) {
			r = -errno;
			break;
		}
		DIR *d = fdopendir(rfd);
		if (!d) {
			r = -errno;
			close(rfd);
			break;
		}
		char **names = NULL;
		size_t n = 0, cap = 0;
		struct dirent *de;
		while ((de = readdir(d)) && n < 4096) {
			if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
				continue;
			if (n == cap) {
				size_t nc = cap ? cap * 2 : 32;
				char **nv = mem_realloc(names, nc * sizeof(char *));
				if (!nv) {
					r = -ENOMEM;
					break;
				}
				names = nv;
				cap = nc;
			}
			if (!(names[n] = mem_strdup(de->d_name))) {
				r = -ENOMEM;
				break;
			}
			n++;
		}
		closedir(d);
		for (size_t i = 0; i < n; i++) {
			if (r == 0)
				r = rmtree(fd, names[i], depth + 1);
			mem_free(names[i]);
		}
		mem_free(names);
		if (r < 0 || n == 0)
			break; /* empty now (or failed); big dirs take several rounds */
	}
	close(fd);
	if (r == 0 && (r = in_dir(DIROP_RMDIR, dfd, name, -1, NULL)) == -ENOENT)
		r = 0;
	return r;
}

/* chmod name in pfd without ever following a symlink; only regular files
 * and directories. */
static int chmod_nofollow(struct apply *a, int pfd, const char *name, uint32_t mode)
{
	struct stat st, st2;
	char proc[64];
	int fd, r;

	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))
		return -EPERM;
	if (__atomic_load_n(&a->fchmodat2_ok, __ATOMIC_RELAXED) && !walk_only(a)) {
		if (syscall(SYS_fchmodat2, pfd, name, (mode_t)mode, AT_SYMLINK_NOFOLLOW) == 0)
			return 0;
		if (errno != ENOSYS)
			return -errno;
		__atomic_store_n(&a->fchmodat2_ok, false, __ATOMIC_RELAXED);
	}
	/* Pin the inode with O_PATH, check it, chmod through procfs; without
	 * procfs reopen it and check it is still the same inode. */
	if ((fd = openat(pfd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)) < 0)
		return -errno;
	if (fstat(fd, &st) < 0 || (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode))) {
		close(fd);
		return -EPERM;
	}
	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	r = fchmodat(AT_FDCWD, proc, (mode_t)mode, 0) < 0 ? -errno : 0;
	close(fd);
	if (r != -ENOENT)
		return r;
	int rfd = openat(pfd, name,
			 (S_ISDIR(st.st_mode) ? O_RDONLY | O_DIRECTORY : O_RDONLY | O_NONBLOCK | O_NOCTTY) |
			     O_NOFOLLOW | O_CLOEXEC);
	if (rfd < 0)
		return -errno;
	if (fstat(rfd, &st2) < 0 || st2.st_dev != st.st_dev || st2.st_ino != st.st_ino)
		r = -ESTALE;
	else
		r = fchmod(rfd, (mode_t)mode) < 0 ? -errno : 0;
	close(rfd);
	return r;
}

/* ---- temporaries ---- */

/* A file the apply just made (fd; named `tmp` in dirfd, or unnamed) to
 * its owner (apply_opts.own): fd, or -errno with the file closed and gone. */
static int give_fd(const struct apply *a, int fd, int dirfd, const char *tmp)
{
	if (!a->o.own || fchown(fd, a->o.uid, a->o.gid) == 0)
		return fd;
	int r = -errno;
	close(fd);
	if (tmp)
		unlinkat(dirfd, tmp, 0);
	return r;
}

/* An entry the apply just made at name in dirfd (a directory, a link) to
 * its owner (apply_opts.own). 0 or -errno. */
static int give_at(const struct apply *a, int dirfd, const char *name)
{
	if (!a->o.own || fchownat(dirfd, name, a->o.uid, a->o.gid, AT_SYMLINK_NOFOLLOW) == 0)
		return 0;
	return -errno;
}

/* A new file for content in dirfd: an unnamed O_TMPFILE (*named false)
 * or a fresh ".airlock-tmp-*" name (*named true, name in tmp). */
static int temp_open(struct run *rn, int dirfd, char tmp[TMPNAME_LEN], bool *named)
{
	const struct apply *a = rn->a;

	if (a->tmpfile_ok) {
		int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
		if (fd >= 0) {
			*named = false;
			return give_fd(a, fd, dirfd, NULL);
		}
		if (errno != EOPNOTSUPP && errno != EISDIR && errno != EINVAL)
			return -errno;
		/* this filesystem has no O_TMPFILE: named it is */
	}
	for (int tries = 0; tries < 16; tries++) {
		tmp_name(rn, tmp);
		int fd = openat(dirfd, tmp, O_RDWR | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd >= 0) {
			*named = true;
			return give_fd(a, fd, dirfd, tmp);
		}
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

/* Give an O_TMPFILE file a temporary name in dirfd (rn: tmp_name). */
static int temp_link(struct run *rn, int fd, int dirfd, char tmp[TMPNAME_LEN])
{
	char proc[64];

	snprintf(proc, sizeof(proc), "/proc/self/fd/%d", fd);
	for (int tries = 0; tries < 16; tries++) {
		tmp_name(rn, tmp);
		if (linkat(fd, "", dirfd, tmp, AT_EMPTY_PATH) == 0)
			return 0;
		if (errno == EEXIST)
			continue;
		/* AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; procfs does not */
		if (linkat(AT_FDCWD, proc, dirfd, tmp, AT_SYMLINK_FOLLOW) == 0)
			return 0;
		if (errno != EEXIST)
			return -errno;
	}
	return -EEXIST;
}

/* The batch's staging directory, made on first use; from any stager. */
static int stage_dir_locked(struct run *m)
{
	if (m->stagefd >= 0)
		return m->stagefd;
	for (int tries = 0; tries < 16; tries++) {
		tmp_name(m, m->stagename);
		if (mkdirat(m->a->rootfd, m->stagename, 0700) == 0)
			break;
		if (errno != EEXIST)
			return -errno;
		m->stagename[0] = '\0';
	}
	if (m->stagename[0] == '\0')
		return -EEXIST;
	m->stagefd = openat(m->a->rootfd, m->stagename, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (m->stagefd < 0) {
		int r = -errno;
		unlinkat(m->a->rootfd, m->stagename, AT_REMOVEDIR);
		m->stagename[0] = '\0';
		return r;
	}
	return m->stagefd;
}

static int stage_dir(struct run *rn)
{
	struct run *m = rn->main;

	pthread_mutex_lock(&m->lock);
	int r = stage_dir_locked(m);
	pthread_mutex_unlock(&m->lock);
	return r;
}

/* ---- phase 1: check and stage ---- */

enum state { ST_ABSENT, ST_DIR, ST_FILE, ST_LINK, ST_OTHER };

static enum state state_of(const struct stat *st)
{
	if (S_ISDIR(st->st_mode))
		return ST_DIR;
	if (S_ISREG(st->st_mode))
		return ST_FILE;
	if (S_ISLNK(st->st_mode))
		return ST_LINK;
	return ST_OTHER;
}

/* An inline chunk's bytes; a stager's through its own decompression
 * context, made when it first needs one (a context is tens of KiB to
 * allocate and clear, and most small batches have nothing compressed:
 * making one per stager per batch was 4-5 % of the agent's CPU on
 * one-file edits, doc/BENCH.md "Latency, fourth pass"). */
static int chunk_data(struct run *rn, const struct delta_chunk *ch, const uint8_t **data)
{
	if (rn->main == rn)
		return delta_chunk_data(rn->b, ch, rn->scratch, data);
	if (ch->kind == DELTA_CHUNK_ZSTD && !rn->dctx && !(rn->dctx = delta_dctx_new()))
		return -ENOMEM;
	return delta_chunk_data_dctx(rn->b, rn->dctx, ch, rn->scratch, data);
}

/* Mode and durability of a filled file. */
static int finish_file(struct run *rn, size_t i, const struct delta_op *op, int fd)
{
	if (fchmod(fd, (mode_t)op->mode) < 0)
		return op_fail(rn, i, -errno, "setting the mode");
	if (rn->a->o.fsync == APPLY_FSYNC_FILE && fsync(fd) < 0)
		return op_fail(rn, i, -errno, "fsync");
	return 0;
}

/* Bytes of the base a clone must hold before it pays (below this, plain
 * copying is as fast and simpler). */
#define CLONE_MIN (256u * 1024u)

/* Is op an edit in place of base: every REF chunk at its own offset (the
 * unchanged parts did not move), with enough of them to be worth cloning? */
static bool clone_fits(const struct delta_op *op, uint64_t base_size)
{
	uint64_t out = 0, refd = 0;

	for (size_t c = 0; c < op->nchunks; c++) {
		const struct delta_chunk *ch = &op->chunks[c];
		if (ch->kind == DELTA_CHUNK_REF) {
			if (ch->ref_off != out || ch->ref_off + ch->raw_len > base_size)
				return false;
			refd += ch->raw_len;
		}
		out += ch->raw_len;
	}
	return refd >= CLONE_MIN;
}

/* Copy base[off, off + len) to fd at the same offset in the kernel. */
static int copy_range(int base, int fd, uint64_t off, uint64_t len)
{
	loff_t in = (loff_t)off, out = (loff_t)off;

	while (len > 0) {
		ssize_t k = copy_file_range(base, &in, fd, &out, len, 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -ESTALE; /* the base got shorter */
		len -= (uint64_t)k;
	}
	return 0;
}

/*
 * The in-place edit of a large file: the new file starts as a clone of the
 * base (FICLONE: shared blocks on reflink filesystems; else the unchanged
 * ranges copied in the kernel with copy_file_range), then only the inline
 * chunks are written. The REF ranges are verified afterwards by reading
 * them back from the new file, which only we can reach, so what was
 * checked is what gets renamed into place. 1 when the kernel cannot copy
 * between these files (use the plain path), 0, or -errno (op failed).
 */
static int fill_clone(struct run *rn, size_t i, const struct delta_op *op, int fd, int base)
{
	uint8_t h[CHUNK_HASH_LEN];
	struct sparse_out so = {.fd = fd, .fresh = false};
	uint64_t out = 0;
	int r;

	if (ioctl(fd, FICLONE, base) < 0) {
		for (size_t c = 0; c < op->nchunks; c++) {
			const struct delta_chunk *ch = &op->chunks[c];
			uint64_t run = 0;
			if (ch->kind != DELTA_CHUNK_REF) {
				out += ch->raw_len;
				continue;
			}
			size_t e = c;
			while (e < op->nchunks && op->chunks[e].kind == DELTA_CHUNK_REF)
				run += op->chunks[e++].raw_len;
			if ((r = copy_range(base, fd, out, run)) < 0) {
				if (r == -EXDEV || r == -EOPNOTSUPP || r == -ENOSYS || r == -EINVAL)
					return 1;
				return op_fail(rn, i, r == -ESTALE ? -EBADMSG : r, "copying the unchanged part");
			}
			out += run;
			c = e - 1;
		}
	}
	out = 0;
	for (size_t c = 0; c < op->nchunks; c++) {
		const struct delta_chunk *ch = &op->chunks[c];
		const uint8_t *data;
		if (ch->kind == DELTA_CHUNK_REF) {
			ssize_t k = pread(fd, rn->scratch, ch->raw_len, (off_t)out);
			if (k != (ssize_t)ch->raw_len)
				return op_fail(rn, i, k < 0 ? -errno : -EBADMSG, "referenced bytes are not there");
			chunk_hash(rn->scratch, ch->raw_len, h);
			if (memcmp(h, ch->hash, CHUNK_HASH_LEN) != 0)
				return op_fail(rn, i, -EBADMSG, "referenced chunk differs from what the host expects");
			rn->st->ref_bytes += ch->raw_len;
			rn->st->bytes += ch->raw_len;
		} else {
			if ((r = chunk_data(rn, ch, &data)) < 0)
				return op_fail(rn, i, r, "inline chunk");
			if ((r = sparse_write(&so, data, ch->raw_len, out)) < 0)
				return op_fail(rn, i, r, "writing the new content");
			rn->st->bytes += ch->raw_len;
		}
		out += ch->raw_len;
	}
	if ((r = sparse_flush(&so)) < 0)
		return op_fail(rn, i, r, "writing the new content");
	if (ftruncate(fd, (off_t)op->size) < 0) /* a clone of a longer base */
		return op_fail(rn, i, -errno, "setting the size");
	rn->st->cloned++;
	return 0;
}

/* Open the file a PUT's references read from; a file of ours without
 * u+r (mode 000, 0200) is made readable for the open and restored. */
static int open_base(struct apply *a, const char *path)
{
	char parent[MANIFEST_PATH_MAX + 1];
	const char *name;
	struct stat st;
	int fd = manifest_open_beneath(a->rootfd, path, O_RDONLY | O_NONBLOCK | O_NOCTTY, walk_only(a));

	if (fd != -EACCES)
		return fd;
	int pfd = open_parent(a, path, parent, &name);
	if (pfd < 0)
		return -EACCES;
	if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode) || st.st_uid != geteuid() ||
	    (st.st_mode & 0400)) {
		close(pfd);
		return -EACCES;
	}
	int r = chmod_nofollow(a, pfd, name, (st.st_mode & 07777) | 0400);
	if (r == 0) {
		fd = openat(pfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
		r = fd < 0 ? -errno : 0;
		int rr = chmod_nofollow(a, pfd, name, st.st_mode & 07777);
		if (r == 0 && rr < 0) {
			close(fd);
			r = rr;
		}
	}
	close(pfd);
	return r < 0 ? r : fd;
}

/* Write one PUT's content into fd, verifying every chunk against its hash
 * (the file hash is a function of those hashes, checked by delta_parse). */
static int fill_file(struct run *rn, size_t i, const struct delta_op *op, int fd)
{
	uint8_t h[CHUNK_HASH_LEN];
	struct sparse_out so = {.fd = fd, .fresh = true};
	uint64_t out = 0;
	int base = -1, r = 0;

	if (op->has_refs) {
		base = open_base(rn->a, op->base);
		if (base < 0)
			return op_fail(rn, i, base, "cannot open the file its references read from");
		struct stat st;
		if (fstat(base, &st) < 0 || !S_ISREG(st.st_mode)) {
			close(base);
			return op_fail(rn, i, -EINVAL, "references read from something that is not a regular file");
		}
		if (clone_fits(op, (uint64_t)st.st_size)) {
			if ((r = fill_clone(rn, i, op, fd, base)) <= 0) {
				close(base);
				return r < 0 ? r : finish_file(rn, i, op, fd);
			}
			if (ftruncate(fd, 0) < 0 || lseek(fd, 0, SEEK_SET) < 0) {
				r = op_fail(rn, i, -errno, "starting over");
				close(base);
				return r;
			}
			r = 0;
		}
	}
	for (size_t c = 0; c < op->nchunks && r == 0; c++) {
		const struct delta_chunk *ch = &op->chunks[c];
		const uint8_t *data;
		if (ch->kind == DELTA_CHUNK_REF) {
			if ((r = chunk_read_fd(&base, ch->ref_off, rn->scratch, ch->raw_len)) < 0) {
				/* a file shorter than the reference: not what the host thinks */
				r = op_fail(rn, i, r == -ESTALE ? -EBADMSG : r, "referenced bytes are not there");
				break;
			}
			chunk_hash(rn->scratch, ch->raw_len, h);
			if (memcmp(h, ch->hash, CHUNK_HASH_LEN) != 0) {
				r = op_fail(rn, i, -EBADMSG, "referenced chunk differs from what the host expects");
				break;
			}
			data = rn->scratch;
			rn->st->ref_bytes += ch->raw_len;
		} else if ((r = chunk_data(rn, ch, &data)) < 0) {
			op_fail(rn, i, r, "inline chunk");
			break;
		}
		if ((r = sparse_write(&so, data, ch->raw_len, out)) < 0)
			op_fail(rn, i, r, "writing the new content");
		else
			rn->st->bytes += ch->raw_len;
		out += ch->raw_len;
	}
	if (base >= 0)
		close(base);
	if (r < 0)
		return r;
	if ((r = sparse_flush(&so)) < 0)
		return op_fail(rn, i, r, "writing the new content");
	/* a fresh file is as long as its last data; one that ends in a hole is set */
	if (so.end != op->size && ftruncate(fd, (off_t)op->size) < 0)
		return op_fail(rn, i, -errno, "setting the size");
	return finish_file(rn, i, op, fd);
}

/* May one more unnamed temporary stay open until the commit? */
static bool hold(struct run *m)
{
	if (__atomic_fetch_add(&m->nheld, 1, __ATOMIC_RELAXED) < m->a->hold_max)
		return true;
	__atomic_fetch_sub(&m->nheld, 1, __ATOMIC_RELAXED);
	return false;
}

/* Stage PUT i in dirfd (apart: the staging directory). Touches only its
 * own step, its own temporary and rn's stager state: runs on any stager. */
static int stage_put(struct run *rn, size_t i, const struct delta_op *op, int dirfd, bool apart)
{
	struct step *s = &rn->steps[i];
	bool named;
	int fd, r;

	if ((fd = temp_open(rn, dirfd, s->tmp, &named)) == -EACCES && !apart) {
		/* a directory we may not write now (read-only on the host):
		 * stage apart, the commit opens it for the rename */
		if ((dirfd = stage_dir(rn)) < 0)
			return op_fail(rn, i, dirfd, "creating the staging directory");
		apart = true;
		fd = temp_open(rn, dirfd, s->tmp, &named);
	}
	if (fd < 0)
		return op_fail(rn, i, fd, "creating a temporary file");
	if (named)
		s->where = apart ? STAGE_DIR : STAGE_TARGET;
	r = fill_file(rn, i, op, fd);
	if (r == 0 && !named && s->target == ST_ABSENT && hold(rn->main)) {
		/* a new name: no temporary name, the commit links it there (one
		 * directory change instead of a link and a rename) */
		s->hfd = fd;
		s->where = STAGE_HELD;
		return 0;
	}
	if (r == 0 && !named) {
		if ((r = temp_link(rn, fd, dirfd, s->tmp)) < 0)
			op_fail(rn, i, r, "linking the temporary file");
		else
			s->where = apart ? STAGE_DIR : STAGE_TARGET;
	}
	close(fd);
	return r;
}

static int stage_symlink(struct run *rn, size_t i, const struct delta_op *op, int dirfd, bool apart)
{
	struct step *s = &rn->steps[i];

	for (int tries = 0; tries < 16; tries++) {
		tmp_name(rn, s->tmp);
		if (symlinkat(op->target, dirfd, s->tmp) == 0) {
			s->where = apart ? STAGE_DIR : STAGE_TARGET;
			int r = give_at(rn->a, dirfd, s->tmp);
			return r < 0 ? op_fail(rn, i, r, "giving the link to its owner") : 0;
		}
		if (errno == EACCES && !apart) { /* as stage_put */
			if ((dirfd = stage_dir(rn)) < 0)
				return op_fail(rn, i, dirfd, "creating the staging directory");
			apart = true;
			continue;
		}
		if (errno != EEXIST)
			return op_fail(rn, i, -errno, "creating the link");
	}
	return op_fail(rn, i, -EEXIST, "creating the link");
}

static int prepare_op(struct run *rn, size_t i)
{
	const struct delta_op *op = delta_batch_op(rn->b, i);
	char parent[MANIFEST_PATH_MAX + 1];
	const char *name = NULL;
	struct stat st;
	enum state target = ST_ABSENT;
	int pfd = -1, r = 0;

	parent_of(op->path, parent);
	if (op->type == DELTA_DELETE) {
		/* Anything (or nothing) may be deleted, but never through a
		 * symlink: refuse that now rather than halfway through. */
		if (deleted_before(rn, op->path, i) || (parent[0] && op_before(rn, parent, DELTA_MKDIR, i)))
			return 0;
		pfd = parent_get(rn, op->path, &name);
		if (pfd == -ELOOP || pfd == -EXDEV)
			return op_fail(rn, i, pfd, "refused: a directory on its path is a symlink");
		return 0;
	}
	/* Where does the parent stand at this point of the batch? */
	bool parent_reborn = parent[0] && (op_before(rn, parent, DELTA_MKDIR, i) || deleted_before(rn, parent, i));
	bool parent_gone = parent[0] && deleted_before(rn, parent, i);
	if (parent_gone && !op_before(rn, parent, DELTA_MKDIR, i))
		return op_fail(rn, i, -ENOENT, "its directory is deleted earlier in the batch");
	if (!parent_gone) {
		pfd = parent_get(rn, op->path, &name);
		if (pfd == -ELOOP || pfd == -EXDEV)
			return op_fail(rn, i, pfd, "refused: a directory on its path is a symlink");
		if (pfd < 0 && !(pfd == -ENOENT && op_before(rn, parent, DELTA_MKDIR, i)))
			return op_fail(rn, i, pfd, "its directory");
	}
	/* What is at the path itself when this op runs? */
	if (pfd >= 0 && !deleted_before(rn, op->path, i)) {
		if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0)
			target = state_of(&st);
		else if (errno != ENOENT)
			r = op_fail(rn, i, -errno, "looking at the current entry");
	}
	rn->steps[i].target = (uint8_t)target; /* absent: a name free at the check, or not made yet */
	if (r == 0) {
		switch (op->type) {
		case DELTA_MKDIR:
			if (target != ST_ABSENT && target != ST_DIR)
				r = op_fail(rn, i, -EEXIST, "something other than a directory is there");
			break;
		case DELTA_CHMOD:
			if (target != ST_FILE && target != ST_DIR)
				r = op_fail(rn, i, target == ST_ABSENT ? -ENOENT : -EPERM,
					    "only an existing file or directory can change mode");
			break;
		case DELTA_PUT:
		case DELTA_SYMLINK: {
			if (target == ST_DIR) {
				r = op_fail(rn, i, -EISDIR, "a directory is there");
				break;
			}
			/* Stage beside the target when its directory exists now and
			 * nothing earlier in the batch replaces it; else in the
			 * staging directory. */
			int dirfd = pfd;
			bool apart = pfd < 0 || parent_reborn;
			if (apart && (dirfd = stage_dir(rn)) < 0) {
				r = op_fail(rn, i, dirfd, "creating the staging directory");
				break;
			}
			if (op->type == DELTA_SYMLINK) {
				r = stage_symlink(rn, i, op, dirfd, apart);
				break;
			}
			/* the content is written later, on the stagers (stage_pending) */
			rn->pend[rn->npend++] = (struct pend){.op = (uint32_t)i, .dirfd = dirfd, .apart = apart};
			if (!apart)
				rn->pc_used = true;
			break;
		}
		}
	}
	return r;
}

/* Undo phase 1: remove every temporary still staged. */
static void unstage(struct run *rn)
{
	for (size_t i = 0; i < rn->nops; i++) {
		struct step *s = &rn->steps[i];
		const struct delta_op *op = delta_batch_op(rn->b, i);
		const char *name;
		if (s->where == STAGE_HELD) {
			close(s->hfd); /* never named: gone with it */
		} else if (s->where == STAGE_DIR) {
			unlinkat(rn->stagefd, s->tmp, 0);
		} else if (s->where == STAGE_TARGET) {
			int pfd = open_parent(rn->a, op->path, rn->path, &name);
			if (pfd >= 0) {
				unlinkat(pfd, s->tmp, 0);
				close(pfd);
			}
		}
		s->where = STAGE_NONE;
	}
}

/* ---- phase 2: commit ---- */

static int commit_op(struct run *rn, size_t i)
{
	const struct delta_op *op = delta_batch_op(rn->b, i);
	struct step *s = &rn->steps[i];
	const char *name = NULL;
	struct stat st;
	int r = 0;

	int pfd = parent_get(rn, op->path, &name);
	if (pfd < 0) {
		if (op->type == DELTA_DELETE && (pfd == -ENOENT || pfd == -ENOTDIR))
			return 0; /* nothing there to delete */
		return op_fail(rn, i, pfd,
			       pfd == -ELOOP || pfd == -EXDEV ? "refused: symlink on its path" : "its directory");
	}
	switch (op->type) {
	case DELTA_MKDIR:
		if ((r = in_dir(DIROP_MKDIR, pfd, name, -1, NULL)) == 0) {
			rn->st->dirs++;
			if ((r = give_at(rn->a, pfd, name)) < 0) {
				op_fail(rn, i, r, "giving the directory to its owner");
				break;
			}
		} else if (r != -EEXIST) {
			op_fail(rn, i, r, "mkdir");
			break;
		} else if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISDIR(st.st_mode)) {
			r = op_fail(rn, i, -EEXIST, "something other than a directory appeared there");
			break;
		}
		r = 0;
		rn->dirmodes[rn->ndirmodes++] = (struct dirmode){op->path, op->mode, (uint32_t)i};
		break;
	case DELTA_PUT:
	case DELTA_SYMLINK: {
		if (s->where == STAGE_HELD) {
			/* a new name: linked there, unless something appeared
			 * since the check; then as any other, through a temporary */
			if ((r = link_held(rn->a, pfd, name, s->hfd)) == -EEXIST) {
				if ((r = temp_link(rn, s->hfd, pfd, s->tmp)) == 0) {
					close(s->hfd);
					s->where = STAGE_TARGET;
					s->target = ST_OTHER;
				}
			}
			if (r < 0) {
				op_fail(
				    rn, i, r,
				    "renaming into place"); /* the same words as a rename: what users and tests match */
				break;
			}
		}
		if (s->where != STAGE_HELD) {
			int from = s->where == STAGE_DIR ? rn->stagefd : pfd;
			if ((r = replace_entry(rn->a, pfd, name, from, s->tmp, s->target == ST_ABSENT)) < 0) {
				op_fail(rn, i, r, "renaming into place");
				break;
			}
		} else {
			close(s->hfd);
		}
		s->where = STAGE_NONE;
		if (op->type == DELTA_PUT)
			rn->st->files++;
		else
			rn->st->symlinks++;
		if (rn->a->o.fsync == APPLY_FSYNC_FILE && (r = dir_fsync(pfd)) < 0)
			op_fail(rn, i, r, "fsync of its directory");
		break;
	}
	case DELTA_CHMOD:
		if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode)) {
			rn->dirmodes[rn->ndirmodes++] = (struct dirmode){op->path, op->mode, (uint32_t)i};
		} else if ((r = chmod_nofollow(rn->a, pfd, name, op->mode)) < 0) {
			op_fail(rn, i, r, "chmod");
			break;
		}
		rn->st->chmods++;
		break;
	case DELTA_DELETE:
		if (fstatat(pfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
			if (errno != ENOENT)
				r = op_fail(rn, i, -errno, "looking at it");
			break;
		}
		if (!S_ISDIR(st.st_mode)) {
			if ((r = in_dir(DIROP_UNLINK, pfd, name, -1, NULL)) < 0 && r != -ENOENT)
				op_fail(rn, i, r, "unlink");
			else
				r = 0, rn->st->deleted++;
		} else if (op->flags & DELTA_DELETE_TREE) {
			if ((r = rmtree(pfd, name, 0)) < 0)
				op_fail(rn, i, r, "removing the tree");
			else
				rn->st->deleted++;
		} else if ((r = in_dir(DIROP_RMDIR, pfd, name, -1, NULL)) == 0) {
			rn->st->deleted++;
		} else if (r == -ENOTEMPTY || r == -EEXIST) {
			r = 0;
			rn->st->kept_dirs++; /* holds files the host does not manage */
		} else if (r == -ENOENT) {
			r = 0;
		} else {
			op_fail(rn, i, r, "rmdir");
		}
		break;
	}
	return r;
}

/* ---- per-op failures ---- */

/* Only running out of memory stops a batch; every other failure is the
 * op's own (a directory we may not write, a full disk, a name the
 * filesystem refuses, a guest process in the way) and the rest goes on. */
static bool op_isolated(const struct run *rn, int r)
{
	return !rn->whole && r != -ENOMEM;
}

static int fail_cmp(const void *x, const void *y)
{
	const struct apply_failure *p = x, *q = y;
	return p->op < q->op ? -1 : p->op > q->op;
}

/* Record op i's failure r (its message is in a->why); without memory for
 * the record it is only counted (apply_failures: total > n). */
static void note_failed(struct run *rn, size_t i, int r)
{
	struct apply *a = rn->a;

	rn->steps[i].failed = true;
	rn->st->failed++;
	a->fails_total++;
	if (a->nfails == a->capfails) {
		size_t nc = a->capfails ? a->capfails * 2 : 16;
		struct apply_failure *nv = nc <= APPLY_FAIL_MAX ? mem_realloc(a->fails, nc * sizeof(*nv)) : NULL;
		if (!nv)
			return;
		a->fails = nv;
		a->capfails = nc;
	}
	struct apply_failure *f = &a->fails[a->nfails++];
	f->op = (uint32_t)i;
	f->err = -r;
	snprintf(f->msg, sizeof(f->msg), "%s", a->why[0] ? a->why : strerror(-r));
}

/* ---- phase 1, staging: the PUTs' content on several threads ----
 * The check pass runs in op order on one thread and only notes each PUT
 * (its op, the directory its temporary goes in); stage_pending then writes
 * them, on up to a->threads stagers, each taking the next run of PUTs of
 * one directory. A PUT's staging touches only its own step, its own
 * temporary and its stager's copy of the run (scratch, decompression
 * context, stats, messages, random pool); the staging directory is made
 * under the run's lock. Failures are collected per stager and noted in op
 * order afterwards, so the failure list is the one a single thread gives;
 * a failure that stops the batch (out of memory, any in apply_batch_whole)
 * stops the stagers at their next run, and the first such in op order is
 * the batch's error. */

struct sfail {
	uint32_t op;
	int r;
	char why[APPLY_FAIL_MSG_MAX + 1];
	char err[ERR_LEN];
};

struct stager {
	struct run rn; /* a copy of the batch's run, with its own stager state */
	struct apply_stats st;
	char err[ERR_LEN];
	char why[APPLY_FAIL_MSG_MAX + 1];
	struct sfail *fails; /* in op order */
	size_t nfails, capfails;
	bool oom; /* a failure could not be recorded */
};

static void stager_failed(struct stager *sg, uint32_t i, int r)
{
	struct run *m = sg->rn.main;

	if (!op_isolated(m, r))
		__atomic_store_n(&m->stop, true, __ATOMIC_RELAXED);
	if (sg->nfails == sg->capfails) {
		size_t nc = sg->capfails ? sg->capfails * 2 : 8;
		struct sfail *nv = mem_realloc(sg->fails, nc * sizeof(*nv));
		if (!nv) {
			sg->oom = true;
			__atomic_store_n(&m->stop, true, __ATOMIC_RELAXED);
			return;
		}
		sg->fails = nv;
		sg->capfails = nc;
	}
	struct sfail *f = &sg->fails[sg->nfails++];
	f->op = i;
	f->r = r;
	snprintf(f->why, sizeof(f->why), "%s", sg->why);
	snprintf(f->err, sizeof(f->err), "%s", sg->err);
}

static void *stager_main(void *arg)
{
	struct stager *sg = arg;
	struct run *m = sg->rn.main;

	while (!__atomic_load_n(&m->stop, __ATOMIC_RELAXED)) {
		size_t g = __atomic_fetch_add(&m->next_group, 1, __ATOMIC_RELAXED);
		if (g >= m->ngroups)
			break;
		for (size_t k = m->groups[g]; k < m->groups[g + 1]; k++) {
			const struct pend *p = &m->pend[k];
			sg->why[0] = '\0';
			int r = stage_put(&sg->rn, p->op, delta_batch_op(m->b, p->op), p->dirfd, p->apart);
			if (r < 0)
				stager_failed(sg, p->op, r);
		}
	}
	return NULL;
}

static void stagers_free(struct run *m)
{
	for (size_t t = 0; t < m->nstagers; t++) {
		struct stager *sg = &m->stagers[t];
		mem_free(sg->rn.scratch);
		delta_dctx_free(sg->rn.dctx);
		mem_free(sg->fails);
	}
	mem_free(m->stagers);
	m->stagers = NULL;
	m->nstagers = 0;
}

/* The batch's stagers, made on first use (one per thread, the calling
 * thread's too). */
static int stagers_setup(struct run *m)
{
	size_t n = m->a->threads ? m->a->threads : 1;

	if (m->stagers)
		return 0;
	if (!(m->stagers = mem_calloc(n, sizeof(*m->stagers))))
		return -ENOMEM;
	for (size_t t = 0; t < n; t++) {
		struct stager *sg = &m->stagers[t];
		sg->rn = *m;
		sg->rn.main = m;
		sg->rn.st = &sg->st;
		sg->rn.err = sg->err;
		sg->rn.why = sg->why;
		sg->rn.rnd_used = sizeof(sg->rn.rnd); /* its own random bytes, not a copy */
		sg->rn.pc_fd = -1;
		sg->rn.stagers = NULL;
		m->nstagers = t + 1;
		sg->rn.dctx = NULL; /* made on first use (chunk_data) */
		if (!(sg->rn.scratch = mem_alloc(m->scratch_len ? m->scratch_len : 1))) {
			stagers_free(m);
			return -ENOMEM;
		}
	}
	return 0;
}

/* Note the stagers' failures in op order (a k-way merge of their sorted
 * lists); the first that stops the batch is its error. */
static int stagers_merge(struct run *m)
{
	size_t at[STAGE_THREADS_MAX] = {0};
	int r = 0;

	for (;;) {
		struct stager *best = NULL;
		size_t bt = 0;
		for (size_t t = 0; t < m->nstagers; t++) {
			struct stager *sg = &m->stagers[t];
			if (at[t] < sg->nfails && (!best || sg->fails[at[t]].op < best->fails[at[bt]].op))
				best = sg, bt = t;
		}
		if (!best)
			break;
		const struct sfail *f = &best->fails[at[bt]++];
		snprintf(m->why, APPLY_FAIL_MSG_MAX + 1, "%s", f->why);
		snprintf(m->err, ERR_LEN, "%s", f->err); /* apply_error: the last failure, as on one thread */
		if (!op_isolated(m, f->r)) {
			r = f->r;
			break;
		}
		note_failed(m, f->op, f->r);
	}
	for (size_t t = 0; t < m->nstagers; t++) {
		struct stager *sg = &m->stagers[t];
		if (sg->oom && r == 0) {
			fail_msg(m->a, "out of memory staging a batch of %zu ops", m->nops);
			r = -ENOMEM;
		}
		m->st->bytes += sg->st.bytes;
		m->st->ref_bytes += sg->st.ref_bytes;
		m->st->cloned += sg->st.cloned;
		memset(&sg->st, 0, sizeof(sg->st));
		sg->nfails = 0;
		sg->oom = false;
	}
	return r;
}

/* Stage the PUTs the check pass noted, then close the parents it held
 * open for them. */
static int stage_pending(struct run *m)
{
	size_t n = m->npend, nt = 1, started = 0;
	pthread_t th[STAGE_THREADS_MAX];
	int r = 0;

	if (n == 0)
		goto out;
	m->ngroups = 0;
	for (size_t k = 0; k < n; k++)
		if (k == 0 || m->pend[k].dirfd != m->pend[k - 1].dirfd ||
		    k - m->groups[m->ngroups - 1] >= STAGE_GROUP_MAX)
			m->groups[m->ngroups++] = k;
	m->groups[m->ngroups] = n;
	m->next_group = 0;
	m->stop = false;
	if ((r = stagers_setup(m)) < 0) {
		fail_msg(m->a, "out of memory for the stagers of a batch of %zu ops", m->nops);
		goto out;
	}
	if (n >= m->a->par_min)
		nt = m->nstagers < m->ngroups ? m->nstagers : m->ngroups;
	for (size_t t = 1; t < nt; t++) {
		if (pthread_create(&th[t], NULL, stager_main, &m->stagers[t]) != 0)
			break; /* fewer threads it is */
		started = t;
	}
	stager_main(&m->stagers[0]);
	for (size_t t = 1; t <= started; t++)
		pthread_join(th[t], NULL);
	r = stagers_merge(m);
out:
	for (size_t k = 0; k < m->ndirfds; k++)
		close(m->dirfds[k]);
	m->ndirfds = 0;
	m->npend = 0;
	m->pc_used = false;
	return r;
}

/* ---- phase 3 ---- */

static int finish_dirs(struct run *rn)
{
	/* deepest first, so a parent's mode never blocks reaching a child */
	for (size_t k = rn->ndirmodes; k-- > 0;) {
		const char *name;
		int pfd = open_parent(rn->a, rn->dirmodes[k].path, rn->path, &name);
		int r = pfd < 0 ? pfd : chmod_nofollow(rn->a, pfd, name, rn->dirmodes[k].mode);
		if (pfd >= 0)
			close(pfd);
		if (r < 0) {
			op_fail(rn, rn->dirmodes[k].op, r, "setting the mode of the directory");
			if (!op_isolated(rn, r))
				return r;
			note_failed(rn, rn->dirmodes[k].op, r);
		}
	}
	return 0;
}

static int sync_root(struct run *rn)
{
	if (rn->a->o.fsync != APPLY_FSYNC_BATCH)
		return 0;
	if (syncfs(rn->a->rootfd) < 0) {
		int r = -errno;
		fail_msg(rn->a, "syncfs of the workspace: %s", strerror(errno));
		return r;
	}
	return 0;
}

static void drop_stage_dir(struct run *rn)
{
	if (rn->stagefd < 0)
		return;
	close(rn->stagefd);
	rn->stagefd = -1;
	rmtree(rn->a->rootfd, rn->stagename, 0);
}

/* Phase 1: check everything and stage all new content; an op that fails
 * here is left out of the commit. */
static int stage_all(struct run *rn)
{
	int r = 0;

	for (size_t i = 0; i < rn->nops; i++) {
		if ((r = prepare_op(rn, i)) == 0) {
			if ((rn->npend >= PEND_MAX || rn->ndirfds >= DIRFDS_MAX) && (r = stage_pending(rn)) < 0)
				return r;
			continue;
		}
		if (!op_isolated(rn, r)) {
			/* the batch's error is its first in op order: stage the
			 * PUTs before this one, which may fail first */
			char err[ERR_LEN];
			memcpy(err, rn->err, ERR_LEN);
			int rr = stage_pending(rn);
			if (rr < 0)
				return rr;
			memcpy(rn->err, err, ERR_LEN);
			return r;
		}
		note_failed(rn, i, r);
	}
	if ((r = stage_pending(rn)) < 0)
		return r;
	parent_drop(rn);
	return sync_root(rn);
}

/* Phase 2: make it visible, in batch order. A failed op changed nothing
 * of its own (a rename, mkdir or chmod either happens or not), except a
 * tree removal that got halfway; its temporary goes in unstage. */
static int commit_all(struct run *rn, size_t *done)
{
	int r;

	for (*done = 0; *done < rn->nops; (*done)++) {
		size_t i = *done;
		if (rn->steps[i].failed)
			continue;
		if ((r = commit_op(rn, i)) < 0) {
			if (!op_isolated(rn, r))
				return r;
			note_failed(rn, i, r);
			continue;
		}
		rn->st->ops++;
	}
	parent_drop(rn);
	return 0;
}

static int batch_run(struct apply *a, struct delta_batch *b, struct apply_stats *st, bool whole)
{
	struct apply_stats dummy;
	struct run rn = {.a = a, .b = b, .stagefd = -1, .whole = whole, .pc_fd = -1};
	size_t i;
	int r = 0;

	if (!st)
		st = &dummy;
	memset(st, 0, sizeof(*st));
	rn.st = st;
	rn.main = &rn;
	rn.err = a->err;
	rn.why = a->why;
	rn.rnd_used = sizeof(rn.rnd);
	pthread_mutex_init(&rn.lock, NULL);
	a->err[0] = a->why[0] = '\0';
	a->nfails = 0;
	a->fails_total = 0;
	if (delta_batch_seq(b) <= a->last_seq) {
		fail_msg(a, "batch %llu is not newer than the last applied %llu",
			 (unsigned long long)delta_batch_seq(b), (unsigned long long)a->last_seq);
		r = -ESTALE;
		goto out;
	}
	rn.nops = delta_batch_count(b);
	rn.scratch_len = delta_batch_chunk_max(b);
	if (!(rn.steps = mem_calloc(rn.nops ? rn.nops : 1, sizeof(*rn.steps))) ||
	    !(rn.index = mem_calloc(rn.nops ? rn.nops : 1, sizeof(*rn.index))) ||
	    !(rn.dirmodes = mem_calloc(rn.nops ? rn.nops : 1, sizeof(*rn.dirmodes))) ||
	    !(rn.pend = mem_calloc(rn.nops < PEND_MAX ? rn.nops + 1 : PEND_MAX, sizeof(*rn.pend))) ||
	    !(rn.groups = mem_calloc(rn.nops < PEND_MAX ? rn.nops + 2 : PEND_MAX + 1, sizeof(*rn.groups))) ||
	    !(rn.dirfds = mem_calloc(DIRFDS_MAX + 2, sizeof(*rn.dirfds))) ||
	    !(rn.scratch = mem_alloc(rn.scratch_len ? rn.scratch_len : 1))) {
		fail_msg(a, "out of memory for a batch of %zu ops", rn.nops);
		r = -ENOMEM;
		goto out;
	}
	for (i = 0; i < rn.nops; i++) {
		const struct delta_op *op = delta_batch_op(b, i);
		rn.index[i] = (struct pref){.path = op->path, .op = (uint32_t)i, .type = op->type};
	}
	qsort(rn.index, rn.nops, sizeof(*rn.index), pref_cmp);

	if ((r = stage_all(&rn)) < 0) {
		unstage(&rn);
		drop_stage_dir(&rn);
		a->nfails = 0;
		a->fails_total = 0;
		st->failed = 0;
		goto out;
	}
	r = commit_all(&rn, &i);
	unstage(&rn); /* temporaries of failed ops (or of the ops not reached) */
	if (r < 0) {
		/* nothing is rolled back after the first visible change */
		st->partial = i > 0 || delta_batch_op(b, i)->type == DELTA_DELETE;
		drop_stage_dir(&rn);
		size_t len = strlen(a->err);
		snprintf(a->err + len, sizeof(a->err) - len, " (after %zu of %zu ops were applied: reconcile)", i,
			 rn.nops);
		goto out;
	}
	/* Phase 3. */
	r = finish_dirs(&rn);
	drop_stage_dir(&rn);
	if (r == 0)
		r = sync_root(&rn);
	if (r < 0) {
		st->partial = true;
		goto out;
	}
	if (a->nfails > 1)
		qsort(a->fails, a->nfails, sizeof(*a->fails), fail_cmp);
	a->last_seq = delta_batch_seq(b);
out:
	for (size_t k = 0; k < rn.ndirfds; k++)
		close(rn.dirfds[k]);
	if (rn.pc_fd >= 0)
		close(rn.pc_fd);
	stagers_free(&rn);
	pthread_mutex_destroy(&rn.lock);
	mem_free(rn.steps);
	mem_free(rn.index);
	mem_free(rn.dirmodes);
	mem_free(rn.scratch);
	mem_free(rn.pend);
	mem_free(rn.groups);
	mem_free(rn.dirfds);
	return r;
}

int apply_batch(struct apply *a, struct delta_batch *b, struct apply_stats *st)
{
	return batch_run(a, b, st, false);
}

int apply_batch_whole(struct apply *a, struct delta_batch *b, struct apply_stats *st)
{
	return batch_run(a, b, st, true);
}

const struct apply_failure *apply_failures(const struct apply *a, size_t *n, uint64_t *total)
{
	*n = a->nfails;
	if (total)
		*total = a->fails_total;
	return a->fails;
}

/* ---- handle ---- */

/* Remove what a crash left at the top of the root: staging directories and
 * named temporaries (deeper ones go in apply_manifest). */
static void clean_root(struct apply *a)
{
	int fd = openat(a->rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0)
		return;
	DIR *d = fdopendir(fd);
	if (!d) {
		close(fd);
		return;
	}
	struct dirent *de;
	char names[16][256];
	size_t n;
	do {
		n = 0;
		rewinddir(d);
		while ((de = readdir(d)) && n < 16)
			if (strncmp(de->d_name, RESERVED, RESERVED_LEN) == 0 && strlen(de->d_name) < 256)
				strcpy(names[n++], de->d_name);
		for (size_t i = 0; i < n; i++)
			if (rmtree(a->rootfd, names[i], 0) < 0)
				n = 0; /* cannot remove: stop trying */
	} while (n == 16);
	closedir(d);
}

/* Can this filesystem give an O_TMPFILE file a name? */
static bool probe_tmpfile(struct apply *a)
{
	char tmp[TMPNAME_LEN];
	int fd = openat(a->rootfd, ".", O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0)
		return false;
	bool ok = temp_link(NULL, fd, a->rootfd, tmp) == 0;
	close(fd);
	if (ok)
		unlinkat(a->rootfd, tmp, 0);
	return ok;
}

int apply_open(const char *root, const struct apply_opts *opts, struct apply **out)
{
	static const struct apply_opts defaults = {.fsync = APPLY_FSYNC_BATCH};
	struct apply *a;

	if (sodium_init() < 0)
		return -EIO;
	if (!(a = mem_calloc(1, sizeof(*a))))
		return -ENOMEM;
	a->o = opts ? *opts : defaults;
	a->fchmodat2_ok = true;
	if ((a->rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		int r = -errno;
		mem_free(a);
		return r;
	}
	clean_root(a);
	a->tmpfile_ok = !(a->o.flags & APPLY_NO_TMPFILE) && probe_tmpfile(a);
	a->exchange_ok = !(a->o.flags & APPLY_NO_EXCHANGE);
	a->noreplace_ok = !(a->o.flags & APPLY_NO_EXCHANGE);
	long cpus = sysconf(_SC_NPROCESSORS_ONLN);
	a->threads = a->o.threads ? a->o.threads : cpus > 1 ? (unsigned)cpus : 1;
	if (a->threads > STAGE_THREADS_MAX)
		a->threads = STAGE_THREADS_MAX;
	a->par_min = a->o.threads ? 2 : STAGE_PAR_MIN;
	/* half of what is left of the fd limit, for files held open between
	 * staging and commit; the rest of a larger batch gets temporary names */
	struct rlimit nf;
	a->hold_max = getrlimit(RLIMIT_NOFILE, &nf) == 0 && nf.rlim_cur > 512 ? (size_t)(nf.rlim_cur - 256) / 2 : 0;
	if (a->hold_max > HOLD_MAX)
		a->hold_max = HOLD_MAX;
	a->empty_path_ok = true;
	*out = a;
	return 0;
}

void apply_free(struct apply *a)
{
	if (!a)
		return;
	close(a->rootfd);
	mem_free(a->fails);
	mem_free(a);
}

const char *apply_error(const struct apply *a)
{
	return a->err;
}

uint64_t apply_last_seq(const struct apply *a)
{
	return a->last_seq;
}

void apply_set_last_seq(struct apply *a, uint64_t seq)
{
	a->last_seq = seq;
}

int apply_rootfd(const struct apply *a)
{
	return a->rootfd;
}

struct scan_wrap {
	struct apply *a;
	const struct manifest_scan_opts *user;
	char buf[MANIFEST_PATH_MAX + 1];
};

static void scan_skipped(const char *relpath, enum manifest_skip why, int err, void *ud)
{
	struct scan_wrap *w = ud;

	if (why == MANIFEST_SKIP_RESERVED && strlen(relpath) <= MANIFEST_PATH_MAX) {
		const char *name;
		int pfd = open_parent(w->a, relpath, w->buf, &name);
		if (pfd >= 0) {
			rmtree(pfd, name, 0);
			close(pfd);
		}
	}
	if (w->user->skipped)
		w->user->skipped(relpath, why, err, w->user->skipped_ud);
}

int apply_manifest(struct apply *a, const struct manifest_scan_opts *opts, struct manifest **out)
{
	static const struct manifest_scan_opts none = {0};
	struct manifest_scan_opts o;
	struct scan_wrap *w;
	int r;

	if (!opts)
		opts = &none;
	if (!(w = mem_calloc(1, sizeof(*w))))
		return -ENOMEM;
	w->a = a;
	w->user = opts;
	o = *opts;
	o.skipped = scan_skipped;
	o.skipped_ud = w;
	r = manifest_scan(a->rootfd, &o, out);
	mem_free(w);
	return r;
}
