/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mount: passthrough FUSE filesystem over a directory, journaling every
 * mutating operation. Contract in include/airlock/mount/mount.h, notes in
 * doc/MOUNT.md.
 *
 * Inodes: one struct inode per backing (st_dev, st_ino) the kernel knows,
 * holding an O_PATH descriptor; the kernel's nodeid is the struct's address
 * (the root is FUSE_ROOT_ID), and the inode number userspace sees is the
 * backing st_ino, so it is stable across lookups, renames and remounts.
 * nlookup counts the kernel's references (lookup/create/mknod/... +1,
 * forget -n); the struct is freed when it drops to zero.
 *
 * Every handler answers its request exactly once: either a fuse_reply_*()
 * with data, or reply_err() with a -errno from the library-style helpers.
 * Mutations are journaled after the backing syscall succeeded and before
 * the reply, so a system call through the mount never returns before its
 * change is in the journal.
 */
#define FUSE_USE_VERSION 312

#include "airlock/mount/mount.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse_lowlevel.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/fsuid.h>
#include <sys/mount.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/statvfs.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/mem.h"
#include "airlock/mount/journal.h"
#include "airlock/mount/keep.h"

#define AIRLOCK_FSTYPE "fuse.airlock"

struct inode {
	int fd; /* O_PATH|O_NOFOLLOW, owned */
	dev_t dev;
	ino_t ino;
	mode_t type;	     /* S_IFMT bits; a backing inode never changes type */
	_Atomic int rfd;     /* O_RDONLY for reads, opened on first use, or -1 */
	_Atomic int wfd;     /* O_WRONLY for writes, opened on first use, or -1 */
	uint64_t nlookup;    /* protected by mount->lock */
	struct inode *hnext; /* protected by mount->lock */
	/* the name it was last looked up by, for the reaper (may be stale
	 * after a rename: then that eviction just misses); protected by lock */
	fuse_ino_t parent;
	char *name;
	/* not 0: an earlier server's node id this inode answers for (kept by
	 * the supervisor, mount_opts.kept); such an inode is in the alias
	 * table, not the (dev, ino) one, and lives until the kernel forgets
	 * that id */
	fuse_ino_t alias;
	struct inode *anext; /* alias table chain; protected by mount->lock */
};

/* A node id change queued for the supervisor (keep.h). */
struct keep_item {
	uint64_t nodeid;
	uint32_t op;
	int fd; /* KEEP_ADD: a duplicate, closed once sent */
};

struct mount {
	char *path; /* canonical absolute path of DIR */
	size_t pathlen;
	struct inode root; /* FUSE_ROOT_ID; never in the table, never freed early */
	struct journal *j;
	struct fuse_session *se;
	pthread_t thread;
	bool thread_started;
	bool am_root;
	unsigned max_threads;
	double timeout;
	dev_t mnt_dev;	   /* st_dev of the mounted root (FUSE connection id) */
	bool no_open;	   /* the kernel does zero-message open/opendir */
	atomic_int io_fds; /* per-inode I/O descriptors open */
	int fd_limit;	   /* RLIMIT_NOFILE in force */
	atomic_bool stopping;
	void (*on_exit)(void *ud);
	void *ud;
	pthread_mutex_t lock;
	/* inode table: protected by lock */
	struct inode **buckets;
	size_t nbuckets;       /* power of two */
	atomic_size_t ninodes; /* written under lock, read anywhere */
	size_t reap_cursor;    /* protected by lock: next bucket to look at */
	/* reaper: asks the kernel to drop cached entries when inode
	 * descriptors near the fd limit */
	pthread_t reaper;
	bool reaper_started;
	bool reaper_stop; /* protected by lock */
	pthread_cond_t reap_cond;
	size_t reap_high, reap_low; /* inodes: start above high, evict down to
				       low (I/O descriptors stay under half of
				       the limit by themselves: io_cache_full) */
	bool reap_now;		    /* protected by lock: a request hit EMFILE */
	/* resuming a live mount (mount_opts.adopt_fd) */
	unsigned short epoch; /* tags node ids (node_id); 0 for the server that mounted */
	bool adopted;	      /* the reaper first drops the kernel's old entries */
	void *init;	      /* the kernel's FUSE_INIT request, as it came */
	size_t init_len;
	struct inode **abuckets; /* aliases by node id (power of two); protected by lock */
	size_t nabuckets;
	/* the node stream to a supervisor (keep.h): queued under keep_lock,
	 * sent in queue order under keep_send_lock, by the keeper thread and
	 * by keep_sync before a reply gives the kernel a new id */
	int keeper_fd; /* -1: none */
	pthread_t keeper;
	bool keeper_started;
	pthread_mutex_t keep_lock;
	pthread_cond_t keep_cond;
	struct keep_item *kq; /* protected by keep_lock */
	size_t kq_n, kq_cap;  /* protected by keep_lock */
	bool keep_stop;	      /* protected by keep_lock */
	pthread_mutex_t keep_send_lock;
	bool keep_conn_sent; /* protected by keep_send_lock */
	bool keep_ok;	     /* protected by keep_send_lock: no send failed */
};

/* ---- helpers ---- */

static struct mount *req_mount(fuse_req_t req)
{
	return fuse_req_userdata(req);
}

/*
 * Node ids: the struct's address tagged with the server's epoch in the
 * bits above the address (user-space addresses fit in 48 bits). A server
 * that resumes a live mount (mount_opts.adopt_fd) gets requests for ids an
 * earlier server handed out: their epoch differs, so they are answered
 * ESTALE instead of being dereferenced.
 */
#define NODE_EPOCH_SHIFT 48
#define NODE_ADDR_MASK	 ((((fuse_ino_t)1) << NODE_EPOCH_SHIFT) - 1)

static fuse_ino_t node_id(const struct mount *m, const struct inode *in)
{
	if (in == &m->root)
		return FUSE_ROOT_ID;
	if (in->alias)
		return in->alias;
	return (fuse_ino_t)(uintptr_t)in | ((fuse_ino_t)m->epoch << NODE_EPOCH_SHIFT);
}

static size_t alias_bucket(const struct mount *m, fuse_ino_t id)
{
	uint64_t h = (uint64_t)id * 0x9e3779b97f4a7c15ull;

	return (size_t)(h ^ (h >> 31)) & (m->nabuckets - 1);
}

/* The inode of a node id: ours, or an earlier server's the supervisor
 * kept; NULL for one it did not keep. */
static struct inode *node_of(struct mount *m, fuse_ino_t ino)
{
	struct inode *in = NULL;

	if (ino == FUSE_ROOT_ID)
		return &m->root;
	if ((ino >> NODE_EPOCH_SHIFT) == m->epoch)
		return (struct inode *)(uintptr_t)(ino & NODE_ADDR_MASK);
	if (!m->nabuckets)
		return NULL;
	pthread_mutex_lock(&m->lock);
	for (in = m->abuckets[alias_bucket(m, ino)]; in && in->alias != ino; in = in->anext)
		;
	pthread_mutex_unlock(&m->lock);
	return in;
}

/* Queue a node id change for the supervisor; fd (KEEP_ADD) is duplicated.
 * A KEEP_ADD is sent before its id reaches the kernel (keep_sync); only
 * when the queue cannot grow or the stream failed does an id answer ESTALE
 * after a crash. Called with m->lock held (lock order: lock, then
 * keep_send_lock, then keep_lock). */
static void keep_push(struct mount *m, uint32_t op, fuse_ino_t id, int fd)
{
	int dup = -1;

	if (m->keeper_fd < 0)
		return;
	if (op == KEEP_ADD && (dup = fcntl(fd, F_DUPFD_CLOEXEC, 3)) < 0)
		return;
	pthread_mutex_lock(&m->keep_lock);
	if (m->kq_n == m->kq_cap && m->kq_cap < (1u << 20)) {
		size_t cap = m->kq_cap ? m->kq_cap * 2 : 256;
		struct keep_item *q = mem_realloc(m->kq, cap * sizeof(*q));
		if (q) {
			m->kq = q;
			m->kq_cap = cap;
		}
	}
	if (m->kq_n < m->kq_cap && !m->keep_stop) {
		m->kq[m->kq_n++] = (struct keep_item){.nodeid = id, .op = op, .fd = dup};
		if (m->kq_n == 1)
			pthread_cond_signal(&m->keep_cond);
		dup = -1;
	}
	pthread_mutex_unlock(&m->keep_lock);
	if (dup >= 0)
		close(dup);
}

static void keep_sync(struct mount *m);

/* node_of for a request: NULL after answering ESTALE. */
static struct inode *req_node(fuse_req_t req, fuse_ino_t ino)
{
	struct inode *in = node_of(req_mount(req), ino);

	if (!in)
		fuse_reply_err(req, ESTALE);
	return in;
}

/* The one place where an error becomes a reply. r is 0 or -errno. */
static void reply_err(fuse_req_t req, int r)
{
	fuse_reply_err(req, -r);
}

static void proc_path(char buf[64], int fd)
{
	snprintf(buf, 64, "/proc/self/fd/%d", fd);
}

static int neg_errno(void)
{
	return errno ? -errno : -EIO;
}

static bool is_dot(const char *name)
{
	return strcmp(name, ".") == 0 || strcmp(name, "..") == 0;
}

/*
 * Creating requests run with the caller's fsuid/fsgid when we are root, so
 * new files belong to the caller (and setgid directories keep working), and
 * with umask 0 because the kernel already applied the caller's umask to the
 * mode it sends. Both are per-thread: fsuid by nature, umask after
 * unshare(CLONE_FS), done once per worker thread.
 */
static _Thread_local bool thread_fs_private;

static void creds_push(fuse_req_t req, struct mount *m)
{
	const struct fuse_ctx *ctx = fuse_req_ctx(req);

	if (!thread_fs_private) {
		if (unshare(CLONE_FS) == 0)
			umask(0);
		thread_fs_private = true;
	}
	if (m->am_root && ctx) {
		setfsgid(ctx->gid);
		setfsuid(ctx->uid);
	}
}

static void creds_pop(struct mount *m)
{
	if (m->am_root) {
		setfsuid(0);
		setfsgid(0);
	}
}

/* ---- inode table ---- */

static void inode_free(struct mount *m, struct inode *in)
{
	int fd;

	if ((fd = atomic_load(&in->rfd)) >= 0) {
		close(fd);
		atomic_fetch_sub(&m->io_fds, 1);
	}
	if ((fd = atomic_load(&in->wfd)) >= 0) {
		close(fd);
		atomic_fetch_sub(&m->io_fds, 1);
	}
	close(in->fd);
	mem_free(in->name);
	mem_free(in);
}

/* Out of descriptors (EMFILE/ENFILE): wake the reaper and give it a moment;
 * true while the caller should retry (about 100 ms in all). */
static bool fd_pressure_retry(struct mount *m, int err, int *tries)
{
	if ((err != EMFILE && err != ENFILE) || !m->reaper_started || ++*tries > 100)
		return false;
	pthread_mutex_lock(&m->lock);
	m->reap_now = true;
	pthread_cond_signal(&m->reap_cond);
	pthread_mutex_unlock(&m->lock);
	usleep(1000);
	return true;
}

/*
 * File I/O goes through per-inode descriptors, not per-open ones: the
 * kernel does zero-message opens (FUSE_CAP_NO_OPEN_SUPPORT), so open(2) and
 * close(2) of a file cost no round trip, and reads of cached pages none at
 * all. One O_RDONLY and one O_WRONLY descriptor per inode, opened on first
 * use (racing threads: the loser closes its own) and closed when the kernel
 * forgets the inode. When inode and I/O descriptors together would pass
 * half of RLIMIT_NOFILE, a descriptor is opened for the one
 * request and closed after it instead, so a huge tree degrades to slower
 * I/O rather than EMFILE. Permission was
 * checked by the kernel (default_permissions) against the caller; these
 * opens run as the daemon.
 */
struct iofd {
	int fd;
	bool temp; /* close after this request */
};

/* Descriptors the inode table holds. */
static size_t fds_held(struct mount *m)
{
	return atomic_load(&m->ninodes) + (size_t)atomic_load(&m->io_fds);
}

static bool io_cache_full(struct mount *m)
{
	return fds_held(m) >= (size_t)m->fd_limit / 2;
}

/* An I/O descriptor for in (NULL: an earlier server's node id, -ESTALE). */
static int io_get(struct mount *m, struct inode *in, bool write, struct iofd *io)
{
	_Atomic int *slot;
	int fd, expected = -1, tries = 0;
	char pp[64];

	io->fd = -1;
	io->temp = false;
	if (!in)
		return -ESTALE;
	slot = write ? &in->wfd : &in->rfd;
	if ((fd = atomic_load(slot)) >= 0) {
		io->fd = fd;
		return 0;
	}
	if (S_ISDIR(in->type))
		return -EISDIR;
	proc_path(pp, in->fd);
	while ((fd = open(pp, (write ? O_WRONLY : O_RDONLY) | O_CLOEXEC)) < 0 && fd_pressure_retry(m, errno, &tries))
		;
	if (fd < 0)
		return neg_errno();
	io->fd = fd;
	if (io_cache_full(m)) {
		io->temp = true;
	} else if (atomic_compare_exchange_strong(slot, &expected, fd)) {
		atomic_fetch_add(&m->io_fds, 1);
	} else {
		close(fd);
		io->fd = expected;
	}
	return 0;
}

static void io_put(struct iofd *io)
{
	if (io->temp && io->fd >= 0)
		close(io->fd);
}

/* Give a descriptor we already have to the inode's slot (or close it). */
static void node_adopt_fd(struct mount *m, struct inode *in, int fd, bool write)
{
	int expected = -1;

	if (!io_cache_full(m) && atomic_compare_exchange_strong(write ? &in->wfd : &in->rfd, &expected, fd))
		atomic_fetch_add(&m->io_fds, 1);
	else
		close(fd);
}

static size_t bucket_of(struct mount *m, dev_t dev, ino_t ino)
{
	uint64_t h = ((uint64_t)ino * 0x9e3779b97f4a7c15ull) ^ (uint64_t)dev;

	return (size_t)(h ^ (h >> 29)) & (m->nbuckets - 1);
}

/* must hold m->lock; best effort (a failed grow keeps the old table) */
static void table_grow(struct mount *m)
{
	size_t i, n = m->nbuckets * 2;
	struct inode **nb = mem_calloc(n, sizeof(*nb)), **old = m->buckets;
	size_t oldn = m->nbuckets;

	if (!nb)
		return;
	m->buckets = nb;
	m->nbuckets = n;
	for (i = 0; i < oldn; i++) {
		struct inode *in, *next;

		for (in = old[i]; in; in = next) {
			size_t b = bucket_of(m, in->dev, in->ino);

			next = in->hnext;
			in->hnext = nb[b];
			nb[b] = in;
		}
	}
	mem_free(old);
}

/* Put in into the (dev, ino) table; must hold m->lock. */
static void table_insert(struct mount *m, struct inode *in)
{
	size_t b;

	if (m->ninodes >= m->nbuckets * 2)
		table_grow(m);
	b = bucket_of(m, in->dev, in->ino);
	in->hnext = m->buckets[b];
	m->buckets[b] = in;
	m->ninodes++;
}

/* Take a reference on the inode for (st_dev, st_ino) found as name in
 * parent, creating it with fd (which it then owns). *fd is set to -1 when
 * consumed. */
static struct inode *table_ref(struct mount *m, const struct stat *st, int *fd, fuse_ino_t parent, const char *name)
{
	struct inode *in;
	char *oldname = NULL;

	if (st->st_dev == m->root.dev && st->st_ino == m->root.ino)
		return &m->root;
	pthread_mutex_lock(&m->lock);
	for (in = m->buckets[bucket_of(m, st->st_dev, st->st_ino)]; in; in = in->hnext)
		if (in->dev == st->st_dev && in->ino == st->st_ino)
			break;
	if (in) {
		in->nlookup++;
		if (in->parent != parent || !in->name || strcmp(in->name, name) != 0) {
			char *n = mem_strdup(name);

			if (n) {
				oldname = in->name;
				in->name = n;
				in->parent = parent;
			}
		}
	} else if ((in = mem_calloc(1, sizeof(*in)))) {
		in->fd = *fd;
		*fd = -1;
		in->dev = st->st_dev;
		in->ino = st->st_ino;
		in->type = st->st_mode & S_IFMT;
		in->nlookup = 1;
		in->parent = parent;
		in->name = mem_strdup(name); /* NULL only costs reapability */
		atomic_init(&in->rfd, -1);
		atomic_init(&in->wfd, -1);
		table_insert(m, in);
		keep_push(m, KEEP_ADD, node_id(m, in), in->fd);
		if (m->ninodes >= m->reap_high)
			pthread_cond_signal(&m->reap_cond); /* cheap without a waiter */
	}
	pthread_mutex_unlock(&m->lock);
	mem_free(oldname);
	return in;
}

/* The kernel forgot an earlier server's id: it forgets one only whole
 * (at eviction), whatever count it sends. */
static void alias_forget(struct mount *m, struct inode *in)
{
	struct inode **pp;

	pthread_mutex_lock(&m->lock);
	for (pp = &m->abuckets[alias_bucket(m, in->alias)]; *pp; pp = &(*pp)->anext) {
		if (*pp == in) {
			*pp = in->anext;
			break;
		}
	}
	for (pp = &m->buckets[bucket_of(m, in->dev, in->ino)]; *pp; pp = &(*pp)->hnext) {
		if (*pp == in) {
			*pp = in->hnext;
			break;
		}
	}
	m->ninodes--;
	keep_push(m, KEEP_DROP, in->alias, -1);
	pthread_mutex_unlock(&m->lock);
	inode_free(m, in);
}

static void table_unref(struct mount *m, struct inode *in, uint64_t n)
{
	struct inode **pp;
	bool dead = false;

	if (in == &m->root)
		return;
	pthread_mutex_lock(&m->lock);
	if (in->alias) {
		/* the kernel's count for an earlier server's id is unknown:
		 * only its FORGET ends it (alias_forget) */
		pthread_mutex_unlock(&m->lock);
		return;
	}
	in->nlookup = in->nlookup > n ? in->nlookup - n : 0;
	if (in->nlookup == 0) {
		for (pp = &m->buckets[bucket_of(m, in->dev, in->ino)]; *pp; pp = &(*pp)->hnext) {
			if (*pp == in) {
				*pp = in->hnext;
				break;
			}
		}
		m->ninodes--;
		dead = true;
		keep_push(m, KEEP_DROP, node_id(m, in), -1);
	}
	pthread_mutex_unlock(&m->lock);
	if (dead)
		inode_free(m, in);
}

/* The kernel's entries below the root name an earlier server's node ids:
 * drop them (and their subtrees) so paths are looked up again. Run on the
 * reaper thread: a notification may wait for a directory lock. */
static void drop_old_entries(struct mount *m)
{
	int fd = openat(m->root.fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	DIR *dp = fd >= 0 ? fdopendir(fd) : NULL;
	struct dirent *de;

	if (!dp) {
		if (fd >= 0)
			close(fd);
		return;
	}
	while ((de = readdir(dp)) && !atomic_load(&m->stopping))
		if (!is_dot(de->d_name))
			fuse_lowlevel_notify_inval_entry(m->se, FUSE_ROOT_ID, de->d_name, strlen(de->d_name));
	closedir(dp);
	fuse_lowlevel_notify_inval_inode(m->se, FUSE_ROOT_ID, 0, 0);
}

/*
 * Reaper: each inode the kernel knows costs us an O_PATH descriptor, and
 * the kernel keeps inodes cached until memory pressure, so a large tree
 * could exhaust RLIMIT_NOFILE. Above reap_high inodes, this thread asks
 * the kernel to drop the cached entries of non-directories
 * (notify_inval_entry); those not in use are evicted, the kernel sends
 * FORGET and table_unref closes their descriptors. It runs on its own thread
 * because a notification may wait for the directory's lock, which a request
 * in flight may hold.
 */
struct reap_item {
	fuse_ino_t parent;
	char *name;
};

#define REAP_BATCH 1024

static void *reaper_main(void *arg)
{
	struct mount *m = arg;
	struct reap_item *items = mem_calloc(REAP_BATCH, sizeof(*items));
	size_t n, i, scanned;

	if (m->adopted)
		drop_old_entries(m);
	if (!items)
		return NULL;
	pthread_mutex_lock(&m->lock);
	while (!m->reaper_stop) {
		if (atomic_load(&m->ninodes) < m->reap_high && !m->reap_now) {
			pthread_cond_wait(&m->reap_cond, &m->lock);
			continue;
		}
		m->reap_now = false;
		n = 0;
		for (scanned = 0; scanned < m->nbuckets && n < REAP_BATCH && atomic_load(&m->ninodes) > m->reap_low + n;
		     scanned++) {
			struct inode *in;

			m->reap_cursor = (m->reap_cursor + 1) & (m->nbuckets - 1);
			for (in = m->buckets[m->reap_cursor]; in && n < REAP_BATCH; in = in->hnext) {
				if (S_ISDIR(in->type) || !in->name || !(items[n].name = mem_strdup(in->name)))
					continue;
				items[n++].parent = in->parent;
			}
		}
		pthread_mutex_unlock(&m->lock);
		for (i = 0; i < n; i++) {
			fuse_lowlevel_notify_inval_entry(m->se, items[i].parent, items[i].name, strlen(items[i].name));
			mem_free(items[i].name);
		}
		/* let the FORGETs arrive before looking again */
		usleep(n ? 1000 : 200000);
		pthread_mutex_lock(&m->lock);
	}
	pthread_mutex_unlock(&m->lock);
	mem_free(items);
	return NULL;
}

/* Look name up in parent, taking a kernel reference on the result. */
static int do_lookup(struct mount *m, struct inode *parent, const char *name, struct fuse_entry_param *e)
{
	struct inode *in;
	int fd, r = 0, tries = 0;

	memset(e, 0, sizeof(*e));
	e->attr_timeout = m->timeout;
	e->entry_timeout = m->timeout;
	if (is_dot(name) || strchr(name, '/'))
		return -EINVAL;
	while ((fd = openat(parent->fd, name, O_PATH | O_NOFOLLOW | O_CLOEXEC)) < 0 &&
	       fd_pressure_retry(m, errno, &tries))
		;
	if (fd < 0)
		return neg_errno();
	if (fstatat(fd, "", &e->attr, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
		r = neg_errno();
		goto out;
	}
	in = table_ref(m, &e->attr, &fd, node_id(m, parent), name);
	if (!in) {
		r = -ENOMEM;
		goto out;
	}
	e->ino = node_id(m, in);
out:
	if (fd >= 0)
		close(fd);
	return r;
}

/* ---- paths for the journal ---- */

/* Workspace-relative path of in (mem_alloc'd into *out). The kernel keeps
 * the backing dentry's name current across renames, so the O_PATH fd's
 * /proc link is the inode's path now. -ENOENT when the inode has no name
 * left (unlinked: not part of the tree); -ESTALE when the name we hold was
 * removed but the inode still has another (hard link). */
static int node_path(struct mount *m, struct inode *in, char **out)
{
	static const char deleted[] = " (deleted)";
	char pp[64], buf[PATH_MAX + 1];
	const char *rel;
	ssize_t n;
	struct stat st;

	*out = NULL;
	if (in == &m->root) {
		*out = mem_strdup("");
		return *out ? 0 : -ENOMEM;
	}
	proc_path(pp, in->fd);
	n = readlink(pp, buf, sizeof(buf));
	if (n < 0)
		return neg_errno();
	if ((size_t)n >= sizeof(buf))
		return -ENAMETOOLONG;
	buf[n] = '\0';
	if ((size_t)n > sizeof(deleted) - 1 && strcmp(buf + n - (sizeof(deleted) - 1), deleted) == 0) {
		if (fstatat(in->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0 && st.st_nlink > 0)
			return -ESTALE;
		return -ENOENT;
	}
	if (m->pathlen == 1 && buf[0] == '/')
		rel = buf + 1;
	else if (strncmp(buf, m->path, m->pathlen) == 0 && buf[m->pathlen] == '/')
		rel = buf + m->pathlen + 1;
	else
		return -EXDEV;
	*out = mem_strdup(rel);
	return *out ? 0 : -ENOMEM;
}

static int child_path(struct mount *m, struct inode *parent, const char *name, char **out)
{
	char *p;
	int r = node_path(m, parent, &p);
	size_t a, b;

	*out = NULL;
	if (r < 0)
		return r;
	a = strlen(p);
	b = strlen(name);
	*out = mem_alloc(a + b + 2);
	if (*out) {
		memcpy(*out, p, a);
		if (a)
			(*out)[a++] = '/';
		memcpy(*out + a, name, b + 1);
	}
	mem_free(p);
	return *out ? 0 : -ENOMEM;
}

/* When a change cannot be named precisely, say "anything may have changed":
 * losing precision is acceptable, losing the change is not. */
static void journal_unnamed(struct mount *m)
{
	journal_append(m->j, JOURNAL_RESCAN, "", NULL, 0, 0, 0);
}

static void journal_child(struct mount *m, enum journal_op op, struct inode *p, const char *name, struct inode *p2,
			  const char *name2)
{
	char *a = NULL, *b = NULL;

	if (child_path(m, p, name, &a) < 0 || (p2 && child_path(m, p2, name2, &b) < 0))
		journal_unnamed(m);
	else
		journal_append(m->j, op, a, b, 0, 0, 0);
	mem_free(a);
	mem_free(b);
}

/* A regular file with a name the journal would not give: another hard
 * link (a write or chmod through one name changes them all, and the
 * journal names one), or none we know while the inode still has a link.
 * One fstat of the node's O_PATH descriptor. */
static bool node_unnamed_links(const struct inode *in, bool named)
{
	struct stat st;

	return in->type == S_IFREG && fstat(in->fd, &st) == 0 && st.st_nlink > (named ? 1u : 0u);
}

static void journal_node(struct mount *m, enum journal_op op, struct inode *in, uint64_t off, uint64_t len,
			 uint32_t flags)
{
	char *a;
	int r = node_path(m, in, &a);

	/* the push of one name cannot see the others (a name unlinked or
	 * renamed away before it ran left another stale in the guest): "anything
	 * may have changed" (faults_e2e; mount_e2e "hard link written through") */
	if (node_unnamed_links(in, r != -ENOENT)) {
		if (r == 0)
			mem_free(a);
		journal_unnamed(m);
		return;
	}
	if (r == -ENOENT)
		return; /* no name: an unlinked file is not part of the tree */
	if (r < 0)
		journal_unnamed(m);
	else
		journal_append(m->j, op, a, NULL, off, len, flags);
	mem_free(a);
}

/* ---- lifecycle ops ---- */

static void op_init(void *ud, struct fuse_conn_info *conn)
{
	struct mount *m = ud;

	/* zero-message open/opendir: see io_get and do_readdir */
	m->no_open = (conn->capable & FUSE_CAP_NO_OPEN_SUPPORT) && (conn->capable & FUSE_CAP_NO_OPENDIR_SUPPORT);
	/* O_TRUNC arrives as a setattr (journaled there), never inside an
	 * open the kernel may not send */
	conn->want &= ~FUSE_CAP_ATOMIC_O_TRUNC;
	/* write-through: each write reaches us (and the journal) before
	 * write(2) returns; see doc/MOUNT.md "When a write is journaled" */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	/* let the kernel drop suid/sgid itself (it sends a setattr) */
	conn->want &= ~FUSE_CAP_HANDLE_KILLPRIV;
	if (conn->capable & FUSE_CAP_SPLICE_WRITE)
		conn->want |= FUSE_CAP_SPLICE_WRITE | FUSE_CAP_SPLICE_MOVE;
}

static void op_lookup(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mount *m = req_mount(req);
	struct inode *p = req_node(req, parent);
	struct fuse_entry_param e;
	int r;

	if (!p)
		return;
	if ((r = do_lookup(m, p, name, &e)) == -ENOENT) {
		/* negative entry, cached: every create comes through the mount */
		memset(&e, 0, sizeof(e));
		e.entry_timeout = m->timeout;
		fuse_reply_entry(req, &e);
		return;
	}
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	keep_sync(m); /* the kernel gets no id the supervisor lacks */
	fuse_reply_entry(req, &e);
}

static void op_forget(fuse_req_t req, fuse_ino_t ino, uint64_t nlookup)
{
	struct mount *m = req_mount(req);

	struct inode *in = node_of(m, ino);

	if (in && in->alias)
		alias_forget(m, in);
	else if (in) /* NULL: an earlier server's id not kept, nothing to drop */
		table_unref(m, in, nlookup);
	fuse_reply_none(req);
}

static void op_forget_multi(fuse_req_t req, size_t count, struct fuse_forget_data *forgets)
{
	struct mount *m = req_mount(req);
	size_t i;

	for (i = 0; i < count; i++) {
		struct inode *in = node_of(m, forgets[i].ino);

		if (in && in->alias)
			alias_forget(m, in);
		else if (in)
			table_unref(m, in, forgets[i].nlookup);
	}
	fuse_reply_none(req);
}

static void op_getattr(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);
	struct inode *in = req_node(req, ino);
	struct stat st;

	(void)fi;
	if (!in)
		return;
	if (fstatat(in->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	fuse_reply_attr(req, &st, m->timeout);
}

static int set_times(struct inode *in, int fd, const struct stat *attr, int valid)
{
	struct timespec tv[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_nsec = UTIME_OMIT}};
	char pp[64];

	if (valid & FUSE_SET_ATTR_ATIME_NOW)
		tv[0].tv_nsec = UTIME_NOW;
	else if (valid & FUSE_SET_ATTR_ATIME)
		tv[0] = attr->st_atim;
	if (valid & FUSE_SET_ATTR_MTIME_NOW)
		tv[1].tv_nsec = UTIME_NOW;
	else if (valid & FUSE_SET_ATTR_MTIME)
		tv[1] = attr->st_mtim;
	if (fd >= 0)
		return futimens(fd, tv) < 0 ? neg_errno() : 0;
	if (utimensat(in->fd, "", tv, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) == 0)
		return 0;
	if (errno != EINVAL || S_ISLNK(in->type))
		return neg_errno();
	proc_path(pp, in->fd);
	return utimensat(AT_FDCWD, pp, tv, 0) < 0 ? neg_errno() : 0;
}

static void op_setattr(fuse_req_t req, fuse_ino_t ino, struct stat *attr, int valid, struct fuse_file_info *fi)
{
	(void)fi;
	struct mount *m = req_mount(req);
	struct inode *in = req_node(req, ino);
	int fd, r = 0; /* fi->fh carries nothing */
	uint32_t done = 0;
	char pp[64];
	struct stat st;

	if (!in)
		return;
	fd = atomic_load(&in->wfd);
	proc_path(pp, in->fd);
	if (valid & FUSE_SET_ATTR_MODE) {
		if (S_ISLNK(in->type))
			r = -EOPNOTSUPP;
		else if (chmod(pp, attr->st_mode) < 0)
			r = neg_errno();
		if (r < 0)
			goto out;
		done |= JOURNAL_F_MODE;
	}
	if (valid & (FUSE_SET_ATTR_UID | FUSE_SET_ATTR_GID)) {
		uid_t uid = valid & FUSE_SET_ATTR_UID ? attr->st_uid : (uid_t)-1;
		gid_t gid = valid & FUSE_SET_ATTR_GID ? attr->st_gid : (gid_t)-1;

		if (fchownat(in->fd, "", uid, gid, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0) {
			r = neg_errno();
			goto out;
		}
		done |= JOURNAL_F_OWNER;
	}
	if (valid & FUSE_SET_ATTR_SIZE) {
		if (S_ISDIR(in->type))
			r = -EISDIR;
		else if ((fd >= 0 ? ftruncate(fd, attr->st_size) : truncate(pp, attr->st_size)) < 0)
			r = neg_errno();
		if (r < 0)
			goto out;
		journal_node(m, JOURNAL_TRUNCATE, in, (uint64_t)attr->st_size, 0, 0);
	}
	if (valid & (FUSE_SET_ATTR_ATIME | FUSE_SET_ATTR_MTIME)) {
		if ((r = set_times(in, -1, attr, valid)) < 0)
			goto out;
		done |= JOURNAL_F_TIMES;
	}
	if (fstatat(in->fd, "", &st, AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW) < 0)
		r = neg_errno();
out:
	/* journal what was applied, even when a later step failed */
	if (done)
		journal_node(m, JOURNAL_SETATTR, in, 0, 0, done);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	fuse_reply_attr(req, &st, m->timeout);
}

static void op_readlink(fuse_req_t req, fuse_ino_t ino)
{
	struct inode *in = req_node(req, ino);
	char buf[PATH_MAX + 1];
	ssize_t n;

	if (!in)
		return;
	if ((n = readlinkat(in->fd, "", buf, sizeof(buf))) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	if ((size_t)n >= sizeof(buf)) {
		reply_err(req, -ENAMETOOLONG);
		return;
	}
	buf[n] = '\0';
	fuse_reply_readlink(req, buf);
}

/* Shared tail of mknod/mkdir/symlink: look the new entry up, journal it,
 * reply. r is the result of the creating syscall. */
static void finish_new(fuse_req_t req, struct mount *m, struct inode *parent, const char *name, int r,
		       enum journal_op op)
{
	struct fuse_entry_param e;

	if (r == 0)
		r = do_lookup(m, parent, name, &e);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	journal_child(m, op, parent, name, NULL, NULL);
	keep_sync(m);
	fuse_reply_entry(req, &e);
}

static void op_mknod(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, dev_t rdev)
{
	struct mount *m = req_mount(req);
	struct inode *p = req_node(req, parent);
	int r = 0;

	if (!p)
		return;
	/* Device nodes are inert on the mount (FUSE mounts are nodev) but
	 * not in the backing directory: only a root caller may make one, or
	 * an allow_other user could make a device node it can open there.
	 * The sync engine never sends them (doc/MOUNT.md). */
	if ((S_ISCHR(mode) || S_ISBLK(mode)) && (!fuse_req_ctx(req) || fuse_req_ctx(req)->uid != 0)) {
		reply_err(req, -EPERM);
		return;
	}
	creds_push(req, m);
	if (mknodat(p->fd, name, mode, rdev) < 0)
		r = neg_errno();
	creds_pop(m);
	finish_new(req, m, p, name, r, S_ISREG(mode) ? JOURNAL_CREATE : JOURNAL_MKNOD);
}

static void op_mkdir(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode)
{
	struct mount *m = req_mount(req);
	struct inode *p = req_node(req, parent);
	int r = 0;

	if (!p)
		return;
	creds_push(req, m);
	if (mkdirat(p->fd, name, mode) < 0)
		r = neg_errno();
	creds_pop(m);
	finish_new(req, m, p, name, r, JOURNAL_MKDIR);
}

static void op_symlink(fuse_req_t req, const char *link, fuse_ino_t parent, const char *name)
{
	struct mount *m = req_mount(req);
	struct inode *p = req_node(req, parent);
	int r = 0;

	if (!p)
		return;
	creds_push(req, m);
	if (symlinkat(link, p->fd, name) < 0)
		r = neg_errno();
	creds_pop(m);
	finish_new(req, m, p, name, r, JOURNAL_SYMLINK);
}

static void op_link(fuse_req_t req, fuse_ino_t ino, fuse_ino_t newparent, const char *newname)
{
	struct mount *m = req_mount(req);
	struct inode *in = node_of(m, ino), *np = node_of(m, newparent);
	struct fuse_entry_param e;
	char pp[64], *src = NULL, *dst = NULL;
	int r = 0;

	if (!in || !np) {
		reply_err(req, -ESTALE);
		return;
	}
	proc_path(pp, in->fd);
	/* AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; the /proc link does not */
	if (linkat(in->fd, "", np->fd, newname, AT_EMPTY_PATH) < 0 &&
	    linkat(AT_FDCWD, pp, np->fd, newname, AT_SYMLINK_FOLLOW) < 0)
		r = neg_errno();
	if (r == 0)
		r = do_lookup(m, np, newname, &e);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	if (child_path(m, np, newname, &dst) < 0)
		journal_unnamed(m);
	else if (node_path(m, in, &src) == 0)
		journal_append(m->j, JOURNAL_LINK, src, dst, 0, 0, 0);
	else /* linked from a name we cannot tell: the new name is new content */
		journal_append(m->j, JOURNAL_CREATE, dst, NULL, 0, 0, 0);
	mem_free(src);
	mem_free(dst);
	keep_sync(m);
	fuse_reply_entry(req, &e);
}

static void op_unlink(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mount *m = req_mount(req);
	struct inode *p = req_node(req, parent);

	if (!p)
		return;
	if (unlinkat(p->fd, name, 0) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	journal_child(m, JOURNAL_UNLINK, p, name, NULL, NULL);
	reply_err(req, 0);
}

static void op_rmdir(fuse_req_t req, fuse_ino_t parent, const char *name)
{
	struct mount *m = req_mount(req);
	struct inode *p = req_node(req, parent);

	if (!p)
		return;
	if (unlinkat(p->fd, name, AT_REMOVEDIR) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	journal_child(m, JOURNAL_RMDIR, p, name, NULL, NULL);
	reply_err(req, 0);
}

static void op_rename(fuse_req_t req, fuse_ino_t parent, const char *name, fuse_ino_t newparent, const char *newname,
		      unsigned int flags)
{
	struct mount *m = req_mount(req);
	struct inode *p = node_of(m, parent), *np = node_of(m, newparent);

	if (!p || !np) {
		reply_err(req, -ESTALE);
		return;
	}
	if (flags & ~(unsigned)(RENAME_NOREPLACE | RENAME_EXCHANGE)) {
		reply_err(req, -EINVAL);
		return;
	}
	if (renameat2(p->fd, name, np->fd, newname, flags) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	journal_child(m, flags & RENAME_EXCHANGE ? JOURNAL_EXCHANGE : JOURNAL_RENAME, p, name, np, newname);
	reply_err(req, 0);
}

/* ---- files ---- */

static void op_open(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);

	(void)ino;
	if (m->no_open) {
		/* "not implemented" switches the kernel to zero-message opens */
		reply_err(req, -ENOSYS);
		return;
	}
	fi->fh = 0;	    /* I/O uses the inode's descriptors */
	fi->keep_cache = 1; /* the page cache is coherent: all writes come through us */
	fi->noflush = 1;
	fuse_reply_open(req, fi);
}

static void op_create(fuse_req_t req, fuse_ino_t parent, const char *name, mode_t mode, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);
	struct inode *p = req_node(req, parent);
	struct fuse_entry_param e;
	int fd, r = 0, acc = fi->flags & O_ACCMODE, tries = 0;

	if (!p)
		return;
	if (is_dot(name) || strchr(name, '/')) {
		reply_err(req, -EINVAL);
		return;
	}
	creds_push(req, m);
	while ((fd = openat(p->fd, name,
			    (acc == O_RDONLY ? O_RDONLY : O_WRONLY) | O_CREAT | O_NOFOLLOW | O_CLOEXEC |
				(fi->flags & (O_EXCL | O_TRUNC)),
			    mode)) < 0 &&
	       fd_pressure_retry(m, errno, &tries))
		;
	if (fd < 0)
		r = neg_errno();
	creds_pop(m);
	if (r == 0 && (r = do_lookup(m, p, name, &e)) < 0)
		close(fd);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	node_adopt_fd(m, node_of(m, e.ino), fd, acc != O_RDONLY);
	journal_child(m, JOURNAL_CREATE, p, name, NULL, NULL);
	fi->fh = 0;
	fi->keep_cache = 1;
	fi->noflush = 1;
	keep_sync(m);
	if (fuse_reply_create(req, &e, fi) == -ENOENT)
		table_unref(m, node_of(m, e.ino), 1); /* interrupted: no reference taken */
}

static void op_read(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);
	struct fuse_bufvec buf = FUSE_BUFVEC_INIT(size);
	struct iofd io;
	int r = io_get(m, node_of(m, ino), false, &io);

	(void)fi;
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	buf.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	buf.buf[0].fd = io.fd;
	buf.buf[0].pos = off;
	/* answers the request itself, with the data or the read's error */
	fuse_reply_data(req, &buf, FUSE_BUF_SPLICE_MOVE);
	io_put(&io);
}

/* Writes carry the kernel's offset, also for O_APPEND (computed under the
 * inode lock from i_size, exact because every change comes through the
 * mount), and the per-inode descriptor has no O_APPEND: the journaled range
 * is the one written. */
static void op_write_buf(fuse_req_t req, fuse_ino_t ino, struct fuse_bufvec *in_buf, off_t off,
			 struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);
	struct inode *in = node_of(m, ino);
	struct fuse_bufvec out = FUSE_BUFVEC_INIT(fuse_buf_size(in_buf));
	struct iofd io;
	int r = io_get(m, in, true, &io);
	ssize_t n;

	(void)fi;
	if (r < 0) { /* -ESTALE for an earlier server's id */
		reply_err(req, r);
		return;
	}
	out.buf[0].flags = FUSE_BUF_IS_FD | FUSE_BUF_FD_SEEK;
	out.buf[0].fd = io.fd;
	out.buf[0].pos = off;
	n = fuse_buf_copy(&out, in_buf, 0);
	io_put(&io);
	if (n < 0) {
		reply_err(req, (int)n);
		return;
	}
	if (n > 0)
		journal_node(m, JOURNAL_WRITE, in, (uint64_t)off, (uint64_t)n, 0);
	fuse_reply_write(req, (size_t)n);
}

static void op_release(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	/* only without zero-message opens; nothing is per open */
	(void)ino;
	(void)fi;
	reply_err(req, 0);
}

static void op_fsync(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);
	struct inode *in = node_of(m, ino);
	struct iofd io = {.fd = in ? atomic_load(&in->wfd) : -1};
	int r = io.fd >= 0 ? 0 : io_get(m, in, false, &io);

	(void)fi;
	if (r == 0 && (datasync ? fdatasync(io.fd) : fsync(io.fd)) < 0)
		r = neg_errno();
	io_put(&io);
	reply_err(req, r);
}

static void op_fallocate(fuse_req_t req, fuse_ino_t ino, int mode, off_t off, off_t len, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);
	struct iofd io;
	int r = io_get(m, node_of(m, ino), true, &io);

	(void)fi;
	if (r == 0 && fallocate(io.fd, mode, off, len) < 0)
		r = neg_errno();
	io_put(&io);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	/* size and/or content (punch hole, zero range) may have changed */
	journal_node(m, JOURNAL_WRITE, node_of(m, ino), /* not NULL: io_get took it */ (uint64_t)off, (uint64_t)len, 0);
	reply_err(req, 0);
}

static void op_lseek(fuse_req_t req, fuse_ino_t ino, off_t off, int whence, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);
	struct iofd io;
	int r = io_get(m, node_of(m, ino), false, &io);
	off_t pos = -1;

	(void)fi;
	if (r == 0 && (pos = lseek(io.fd, off, whence)) < 0)
		r = neg_errno();
	io_put(&io);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	fuse_reply_lseek(req, pos);
}

static void op_copy_file_range(fuse_req_t req, fuse_ino_t ino_in, off_t off_in, struct fuse_file_info *fi_in,
			       fuse_ino_t ino_out, off_t off_out, struct fuse_file_info *fi_out, size_t len, int flags)
{
	struct mount *m = req_mount(req);
	struct iofd in = {.fd = -1}, out = {.fd = -1};
	off_t start = off_out;
	ssize_t n = -1;
	int r;

	(void)fi_in;
	(void)fi_out;
	if ((r = io_get(m, node_of(m, ino_in), false, &in)) == 0 &&
	    (r = io_get(m, node_of(m, ino_out), true, &out)) == 0 &&
	    (n = copy_file_range(in.fd, &off_in, out.fd, &off_out, len, (unsigned)flags)) < 0)
		r = neg_errno();
	io_put(&in);
	io_put(&out);
	if (r < 0) {
		reply_err(req, r);
		return;
	}
	if (n > 0)
		journal_node(m, JOURNAL_WRITE, node_of(m, ino_out), (uint64_t)start, (uint64_t)n, 0);
	fuse_reply_write(req, (size_t)n);
}

/* ---- directories ---- */

/*
 * Directories are opened per readdir call, not per opendir: the kernel does
 * zero-message opendir and caches listings (FOPEN_CACHE_DIR), invalidating
 * them whenever the directory changes through the mount. The offset of an
 * entry is the backing filesystem's d_off cookie, which seekdir on a fresh
 * stream accepts (the same guarantee NFS export relies on).
 */
static void op_opendir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	struct mount *m = req_mount(req);

	(void)ino;
	if (m->no_open) {
		reply_err(req, -ENOSYS);
		return;
	}
	fi->fh = 0;
	fi->keep_cache = 1;
	fi->cache_readdir = 1;
	fuse_reply_open(req, fi);
}

static void do_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, bool plus)
{
	struct mount *m = req_mount(req);
	struct inode *dir = req_node(req, ino);
	char *buf, *p;
	size_t rem = size;
	struct dirent *de = NULL;
	DIR *dp = NULL;
	int fd, r = 0;

	if (!dir)
		return;
	if (!(p = buf = mem_alloc(size))) {
		reply_err(req, -ENOMEM);
		return;
	}
	fd = openat(dir->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(dp = fdopendir(fd))) {
		r = neg_errno();
		if (fd >= 0)
			close(fd);
		goto out;
	}
	if (off)
		seekdir(dp, off);
	for (;;) {
		struct fuse_entry_param e;
		size_t n;

		errno = 0;
		if (!(de = readdir(dp))) {
			if (errno && rem == size)
				r = -errno;
			break;
		}
		memset(&e, 0, sizeof(e));
		if (!plus || is_dot(de->d_name)) {
			e.attr.st_ino = de->d_ino;
			e.attr.st_mode = (mode_t)de->d_type << 12;
		} else if ((r = do_lookup(m, dir, de->d_name, &e)) < 0) {
			if (r == -ENOENT) { /* gone meanwhile: skip it */
				r = 0;
				continue;
			}
			if (rem < size)
				r = 0; /* return what we have; the error comes next call */
			break;
		}
		if (plus)
			n = fuse_add_direntry_plus(req, p, rem, de->d_name, &e, de->d_off);
		else
			n = fuse_add_direntry(req, p, rem, de->d_name, &e.attr, de->d_off);
		if (n > rem) {
			if (plus && e.ino)
				table_unref(m, node_of(m, e.ino), 1);
			break;
		}
		p += n;
		rem -= n;
	}
out:
	if (dp)
		closedir(dp);
	if (r < 0) {
		reply_err(req, r);
	} else {
		if (plus)
			keep_sync(m);
		fuse_reply_buf(req, buf, size - rem);
	}
	mem_free(buf);
}

static void op_readdir(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, false);
}

static void op_readdirplus(fuse_req_t req, fuse_ino_t ino, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)fi;
	do_readdir(req, ino, size, off, true);
}

static void op_releasedir(fuse_req_t req, fuse_ino_t ino, struct fuse_file_info *fi)
{
	(void)ino;
	(void)fi;
	reply_err(req, 0);
}

static void op_fsyncdir(fuse_req_t req, fuse_ino_t ino, int datasync, struct fuse_file_info *fi)
{
	struct inode *in = req_node(req, ino);
	int fd, r = 0;

	(void)fi;
	if (!in)
		return;
	fd = openat(in->fd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || (datasync ? fdatasync(fd) : fsync(fd)) < 0)
		r = neg_errno();
	if (fd >= 0)
		close(fd);
	reply_err(req, r);
}

static void op_statfs(fuse_req_t req, fuse_ino_t ino)
{
	struct inode *in = req_node(req, ino);
	struct statvfs sv;

	if (!in)
		return;
	if (fstatvfs(in->fd, &sv) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	fuse_reply_statfs(req, &sv);
}

static void op_access(fuse_req_t req, fuse_ino_t ino, int mask)
{
	struct inode *in = req_node(req, ino);
	char pp[64];

	if (!in)
		return;
	if (S_ISLNK(in->type)) {
		reply_err(req, 0);
		return;
	}
	proc_path(pp, in->fd);
	reply_err(req, faccessat(AT_FDCWD, pp, mask, 0) < 0 ? neg_errno() : 0);
}

/* ---- xattrs (through the /proc link, so not on symlinks: see MOUNT.md) ---- */

static void op_setxattr(fuse_req_t req, fuse_ino_t ino, const char *name, const char *value, size_t size, int flags)
{
	struct mount *m = req_mount(req);
	struct inode *in = req_node(req, ino);
	char pp[64];

	if (!in)
		return;
	if (S_ISLNK(in->type)) {
		reply_err(req, -EOPNOTSUPP);
		return;
	}
	proc_path(pp, in->fd);
	if (setxattr(pp, name, value, size, flags) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	journal_node(m, JOURNAL_XATTR, in, 0, 0, 0);
	reply_err(req, 0);
}

static void op_removexattr(fuse_req_t req, fuse_ino_t ino, const char *name)
{
	struct mount *m = req_mount(req);
	struct inode *in = req_node(req, ino);
	char pp[64];

	if (!in)
		return;
	if (S_ISLNK(in->type)) {
		reply_err(req, -EOPNOTSUPP);
		return;
	}
	proc_path(pp, in->fd);
	if (removexattr(pp, name) < 0) {
		reply_err(req, neg_errno());
		return;
	}
	journal_node(m, JOURNAL_XATTR, in, 0, 0, 0);
	reply_err(req, 0);
}

/* getxattr and listxattr share the size-probe protocol: size 0 asks for
 * the length, otherwise the data. */
static void reply_xattr_result(fuse_req_t req, char *buf, size_t size, ssize_t n)
{
	if (n < 0)
		reply_err(req, neg_errno());
	else if (size == 0)
		fuse_reply_xattr(req, (size_t)n);
	else
		fuse_reply_buf(req, buf, (size_t)n);
	mem_free(buf);
}

static void op_getxattr(fuse_req_t req, fuse_ino_t ino, const char *name, size_t size)
{
	struct inode *in = req_node(req, ino);
	char pp[64], *buf = NULL;

	if (!in)
		return;
	if (S_ISLNK(in->type)) {
		reply_err(req, -ENODATA);
		return;
	}
	if (size && !(buf = mem_alloc(size))) {
		reply_err(req, -ENOMEM);
		return;
	}
	proc_path(pp, in->fd);
	reply_xattr_result(req, buf, size, getxattr(pp, name, buf, size));
}

static void op_listxattr(fuse_req_t req, fuse_ino_t ino, size_t size)
{
	struct inode *in = req_node(req, ino);
	char pp[64], *buf = NULL;

	if (!in)
		return;
	if (S_ISLNK(in->type)) {
		if (size == 0)
			fuse_reply_xattr(req, 0);
		else
			fuse_reply_buf(req, NULL, 0);
		return;
	}
	if (size && !(buf = mem_alloc(size))) {
		reply_err(req, -ENOMEM);
		return;
	}
	proc_path(pp, in->fd);
	reply_xattr_result(req, buf, size, listxattr(pp, buf, size));
}

/*
 * The dispatch table. Locks (flock, POSIX) are deliberately absent: without
 * getlk/setlk/flock the kernel keeps them itself, which is exact because
 * every process using the workspace goes through this one mount.
 */
static const struct fuse_lowlevel_ops mount_ops = {
    .init = op_init,
    .lookup = op_lookup,
    .forget = op_forget,
    .forget_multi = op_forget_multi,
    .getattr = op_getattr,
    .setattr = op_setattr,
    .readlink = op_readlink,
    .mknod = op_mknod,
    .mkdir = op_mkdir,
    .symlink = op_symlink,
    .link = op_link,
    .unlink = op_unlink,
    .rmdir = op_rmdir,
    .rename = op_rename,
    .open = op_open,
    .create = op_create,
    .read = op_read,
    .write_buf = op_write_buf,
    /* no flush: "not implemented" spares every close(2) a round trip;
     * nothing is buffered per open */
    .release = op_release,
    .fsync = op_fsync,
    .fallocate = op_fallocate,
    .lseek = op_lseek,
    .copy_file_range = op_copy_file_range,
    .opendir = op_opendir,
    .readdir = op_readdir,
    .readdirplus = op_readdirplus,
    .releasedir = op_releasedir,
    .fsyncdir = op_fsyncdir,
    .statfs = op_statfs,
    .access = op_access,
    .setxattr = op_setxattr,
    .getxattr = op_getxattr,
    .listxattr = op_listxattr,
    .removexattr = op_removexattr,
};

/* ---- mount table ---- */

/* Undo mountinfo's octal escapes (\040 for space, ...) in place. */
static void unescape(char *s)
{
	char *d = s;

	for (; *s; s++) {
		if (s[0] == '\\' && s[1] >= '0' && s[1] <= '3' && s[2] >= '0' && s[2] <= '7' && s[3] >= '0' &&
		    s[3] <= '7') {
			*d++ = (char)((s[1] - '0') * 64 + (s[2] - '0') * 8 + (s[3] - '0'));
			s += 3;
		} else {
			*d++ = *s;
		}
	}
	*d = '\0';
}

/* Filesystem type of the topmost mount at path (canonical), into type;
 * 0 found, -ENOENT when path is not a mount point. */
static int top_mount_type(const char *path, char *type, size_t size)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char *line = NULL;
	size_t cap = 0;
	int r = -ENOENT;

	if (!f)
		return neg_errno();
	while (getline(&line, &cap, f) > 0) {
		char *save = NULL, *tok, *mnt = NULL, *fstype = NULL;
		int field = 0;
		bool dash = false;

		for (tok = strtok_r(line, " \n", &save); tok; tok = strtok_r(NULL, " \n", &save)) {
			if (dash) {
				fstype = tok;
				break;
			}
			if (++field == 5)
				mnt = tok;
			else if (field > 6 && strcmp(tok, "-") == 0)
				dash = true;
		}
		if (!mnt || !fstype)
			continue;
		unescape(mnt);
		if (strcmp(mnt, path) == 0) {
			/* later lines are mounted on top of earlier ones */
			snprintf(type, size, "%s", fstype);
			r = 0;
		}
	}
	free(line); /* getline's buffer: libc-owned */
	fclose(f);
	return r;
}

/* Canonical absolute path of dir into a mem_alloc'd string, also when dir
 * is a dead FUSE mount (where realpath fails with ENOTCONN). */
static int canon_path(const char *dir, char **out)
{
	char buf[PATH_MAX], *slash, *copy;
	const char *base;
	size_t n;

	*out = NULL;
	if (realpath(dir, buf)) {
		*out = mem_strdup(buf);
		return *out ? 0 : -ENOMEM;
	}
	if (errno != ENOTCONN)
		return neg_errno();
	if (!(copy = mem_strdup(dir)))
		return -ENOMEM;
	n = strlen(copy);
	while (n > 1 && copy[n - 1] == '/')
		copy[--n] = '\0';
	slash = strrchr(copy, '/');
	base = slash ? slash + 1 : copy;
	if (slash == copy) {
		buf[0] = '/';
		buf[1] = '\0';
	} else if (slash) {
		*slash = '\0';
		if (!realpath(copy, buf))
			goto fail;
	} else if (!realpath(".", buf)) {
		goto fail;
	}
	n = strlen(buf);
	*out = mem_alloc(n + strlen(base) + 2);
	if (*out)
		snprintf(*out, n + strlen(base) + 2, "%s%s%s", buf, n > 1 ? "/" : "", base);
	mem_free(copy);
	return *out ? 0 : -ENOMEM;
fail:
	mem_free(copy);
	return neg_errno();
}

int mount_is_airlock(const char *dir)
{
	char type[64], *path;
	int r = canon_path(dir, &path);

	if (r < 0)
		return r;
	r = top_mount_type(path, type, sizeof(type));
	mem_free(path);
	if (r == -ENOENT)
		return 0;
	return r < 0 ? r : strcmp(type, AIRLOCK_FSTYPE) == 0;
}

static int detach(const char *path)
{
	pid_t pid;
	int status;

	if (geteuid() == 0)
		return umount2(path, MNT_DETACH) < 0 ? neg_errno() : 0;
	pid = fork();
	if (pid < 0)
		return neg_errno();
	if (pid == 0) {
		execlp("fusermount3", "fusermount3", "-u", "-q", "-z", "--", path, (char *)NULL);
		_exit(127);
	}
	if (waitpid(pid, &status, 0) < 0)
		return neg_errno();
	return WIFEXITED(status) && WEXITSTATUS(status) == 0 ? 0 : -EPERM;
}

int mount_detach(const char *dir)
{
	return detach(dir);
}

static int clear_stale_canon(const char *path)
{
	char type[64];
	struct statfs sf;
	int r, i;

	for (i = 0; i < 16; i++) {
		r = top_mount_type(path, type, sizeof(type));
		if (r == -ENOENT || (r == 0 && strcmp(type, AIRLOCK_FSTYPE) != 0))
			return 0;
		if (r < 0)
			return r;
		/* a dead server's connection answers ENOTCONN at once; statfs
		 * because it always asks the server (a stat may be cached) */
		if (statfs(path, &sf) == 0 || errno != ENOTCONN)
			return -EBUSY;
		if ((r = detach(path)) < 0)
			return r;
	}
	return -ELOOP;
}

int mount_clear_stale(const char *dir)
{
	char *path;
	int r = canon_path(dir, &path);

	if (r < 0)
		return r;
	r = clear_stale_canon(path);
	mem_free(path);
	return r;
}

/* ---- start / stop ---- */

static void *session_main(void *arg)
{
	struct mount *m = arg;
	struct fuse_loop_config *cfg = fuse_loop_cfg_create();

	if (cfg) {
		/* keep the pool: creating a thread per burst costs more than
		 * idle threads. No /dev/fuse clone per thread: a clone is the
		 * daemon's alone, and when the daemon dies the kernel ends the
		 * requests read through it with ECONNABORTED (an editor's
		 * write or create failed so: faults_e2e); on the one shared
		 * descriptor, which the supervisor holds too, they stay read
		 * but unanswered, and the next server has them resent */
		fuse_loop_cfg_set_max_threads(cfg, m->max_threads);
		fuse_loop_cfg_set_idle_threads(cfg, m->max_threads);
		fuse_loop_cfg_set_clone_fd(cfg, 0);
		fuse_session_loop_mt(m->se, cfg);
		fuse_loop_cfg_destroy(cfg);
	} else {
		fuse_session_loop(m->se);
	}
	if (!atomic_load(&m->stopping) && m->on_exit)
		m->on_exit(m->ud);
	return NULL;
}

/* An O_PATH descriptor per inode the kernel knows, plus cached I/O ones:
 * raise RLIMIT_NOFILE (process-wide) as far as allowed; returns the soft
 * limit now in force. */
static int raise_fd_limit(void)
{
	struct rlimit rl;
	rlim_t want = 1u << 20;

	if (getrlimit(RLIMIT_NOFILE, &rl) < 0)
		return 1024;
	if (rl.rlim_max < want) {
		struct rlimit up = {want, want};

		if (setrlimit(RLIMIT_NOFILE, &up) == 0) /* needs CAP_SYS_RESOURCE */
			return (int)want;
	}
	if (rl.rlim_cur < rl.rlim_max) {
		rl.rlim_cur = rl.rlim_max;
		setrlimit(RLIMIT_NOFILE, &rl);
	}
	return rl.rlim_cur > INT_MAX ? INT_MAX : (int)rl.rlim_cur;
}

static void keeper_stop(struct mount *m);

static void mount_free(struct mount *m)
{
	size_t i;

	if (!m)
		return;
	keeper_stop(m);
	if (m->se)
		fuse_session_destroy(m->se);
	for (i = 0; m->buckets && i < m->nbuckets; i++) {
		struct inode *in, *next;

		for (in = m->buckets[i]; in; in = next) {
			next = in->hnext;
			inode_free(m, in);
		}
	}
	mem_free(m->buckets);
	mem_free(m->abuckets); /* aliases are in the (dev, ino) table too: freed above */
	for (i = 0; i < m->kq_n; i++)
		if (m->kq[i].fd >= 0)
			close(m->kq[i].fd);
	mem_free(m->kq);
	pthread_cond_destroy(&m->keep_cond);
	pthread_mutex_destroy(&m->keep_lock);
	pthread_mutex_destroy(&m->keep_send_lock);
	if (m->root.fd >= 0)
		close(m->root.fd);
	pthread_cond_destroy(&m->reap_cond);
	pthread_mutex_destroy(&m->lock);
	mem_free(m->init);
	mem_free(m->path);
	mem_free(m);
}

/*
 * The FUSE_INIT request as the kernel sent it (wire ABI: struct
 * fuse_in_header, then struct fuse_init_in): kept so that a later server
 * can feed the same request to a fresh session when it resumes the mount.
 */
#define WIRE_IN_HEADER_LEN 40u
#define WIRE_OPCODE_OFF	   4u
#define WIRE_UNIQUE_OFF	   8u
#define WIRE_FUSE_INIT	   26u
#define WIRE_NOTIFY_RESEND 7 /* FUSE_NOTIFY_RESEND, kernel 6.9+ (protocol 7.40) */
#define INIT_MAX	   4096u
/* A unique id the kernel never assigns (its ids are even, interrupts odd
 * ids of pending requests): the reply to the replayed INIT is refused with
 * ENOENT, which libfuse ignores. */
#define REPLAY_UNIQUE 0x7fffffffffff0001ull

static int take_init(struct mount *m)
{
	struct fuse_buf buf = {0};
	uint32_t op;
	int n = fuse_session_receive_buf(m->se, &buf);

	if (n <= 0) {
		free(buf.mem); /* libfuse's malloc */
		return n < 0 ? n : -EIO;
	}
	memcpy(&op, (char *)buf.mem + WIRE_OPCODE_OFF, sizeof(op));
	if ((size_t)n >= WIRE_IN_HEADER_LEN && (size_t)n <= INIT_MAX && op == WIRE_FUSE_INIT &&
	    (m->init = mem_alloc((size_t)n))) {
		memcpy(m->init, buf.mem, (size_t)n);
		m->init_len = (size_t)n;
	}
	fuse_session_process_buf(m->se, &buf);
	free(buf.mem);
	return 0;
}

/* A fresh session on a live connection: libfuse answers every request with
 * EIO until it has seen FUSE_INIT, which the kernel sent only once, to the
 * first server. Replay that request with a unique id nobody waits for. */
static int replay_init(struct mount *m, const void *init, size_t len)
{
	uint64_t unique = REPLAY_UNIQUE;
	struct fuse_buf buf = {0};
	uint32_t op;

	if (!init || len < WIRE_IN_HEADER_LEN || len > INIT_MAX)
		return -EINVAL;
	memcpy(&op, (const char *)init + WIRE_OPCODE_OFF, sizeof(op));
	if (op != WIRE_FUSE_INIT || !(m->init = mem_alloc(len)))
		return op != WIRE_FUSE_INIT ? -EINVAL : -ENOMEM;
	memcpy(m->init, init, len);
	m->init_len = len;
	if (!(buf.mem = mem_alloc(len)))
		return -ENOMEM;
	memcpy(buf.mem, init, len);
	memcpy((char *)buf.mem + WIRE_UNIQUE_OFF, &unique, sizeof(unique));
	buf.size = len;
	fuse_session_process_buf(m->se, &buf);
	mem_free(buf.mem);
	return 0;
}

/* Requests the dead server had read but not answered would wait forever:
 * ask the kernel to queue them again (ignored by kernels before 6.9). */
static void resend_pending(struct mount *m)
{
	struct {
		uint32_t len;
		int32_t error;
		uint64_t unique;
	} oh = {.len = sizeof(oh), .error = WIRE_NOTIFY_RESEND, .unique = 0};

	if (write(fuse_session_fd(m->se), &oh, sizeof(oh)) < 0) {
		/* an older kernel: those requests stay stuck (doc/MOUNT.md) */
	}
}

/* One message of the node stream to the supervisor (keep.h). */
static int keep_send(int sock, const struct keep_msg *h, const void *data, size_t len, const int *fds, size_t nfd)
{
	char cbuf[CMSG_SPACE(KEEP_BATCH * sizeof(int))];
	struct iovec iov[2] = {{.iov_base = (void *)h, .iov_len = sizeof(*h)},
			       {.iov_base = (void *)data, .iov_len = len}};
	struct msghdr mh = {.msg_iov = iov, .msg_iovlen = 2};
	struct cmsghdr *c;

	if (nfd) {
		memset(cbuf, 0, sizeof(cbuf));
		mh.msg_control = cbuf;
		mh.msg_controllen = CMSG_SPACE(nfd * sizeof(int));
		if (!(c = CMSG_FIRSTHDR(&mh)))
			return -EINVAL;
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(nfd * sizeof(int));
		memcpy(CMSG_DATA(c), fds, nfd * sizeof(int));
	}
	return sendmsg(sock, &mh, MSG_NOSIGNAL) < 0 ? neg_errno() : 0;
}

/* Send the connection (first, once), then every queued node id change, in
 * queue order: a KEEP_DROP and a later KEEP_ADD of a reused id must reach
 * the supervisor in that order. Must hold keep_send_lock. */
static void keep_flush(struct mount *m)
{
	struct keep_rec rec[KEEP_BATCH];
	struct keep_item items[KEEP_BATCH];
	struct keep_msg h = {.type = KEEP_CONN, .n = (uint32_t)m->init_len};
	int fds[KEEP_BATCH];

	if (!m->keep_conn_sent) {
		int cfd = fuse_session_fd(m->se);

		m->keep_ok = m->init && keep_send(m->keeper_fd, &h, m->init, m->init_len, &cfd, 1) == 0;
		m->keep_conn_sent = true;
	}
	for (;;) {
		size_t n, i, nfd = 0;
		bool stop;

		pthread_mutex_lock(&m->keep_lock);
		if (!(n = m->kq_n < KEEP_BATCH ? m->kq_n : KEEP_BATCH)) { /* (kq may be NULL) */
			pthread_mutex_unlock(&m->keep_lock);
			return;
		}
		memcpy(items, m->kq, n * sizeof(*items));
		memmove(m->kq, m->kq + n, (m->kq_n - n) * sizeof(*m->kq));
		m->kq_n -= n;
		stop = m->keep_stop;
		pthread_mutex_unlock(&m->keep_lock);
		for (i = 0; i < n; i++) {
			rec[i] = (struct keep_rec){.nodeid = items[i].nodeid, .op = items[i].op};
			if (items[i].op == KEEP_ADD)
				fds[nfd++] = items[i].fd;
		}
		h = (struct keep_msg){.type = KEEP_NODES, .n = (uint32_t)n};
		if (m->keep_ok && !stop)
			m->keep_ok = keep_send(m->keeper_fd, &h, rec, n * sizeof(*rec), fds, nfd) == 0;
		for (i = 0; i < nfd; i++)
			close(fds[i]);
	}
}

/* Before a reply hands the kernel a node id: the supervisor holds it (and
 * every change queued before it) once this returns, so a crash right after
 * the reply leaves no id the next server would answer ESTALE (a write to a
 * file opened through a cached entry failed so: faults_e2e). Must not hold
 * m->lock or keep_lock. */
static void keep_sync(struct mount *m)
{
	if (m->keeper_fd < 0)
		return;
	pthread_mutex_lock(&m->keep_send_lock);
	keep_flush(m);
	pthread_mutex_unlock(&m->keep_send_lock);
}

/* Keeper thread: sends what keep_push queued when no reply did first (the
 * drops, mostly). A failed send ends the stream: the ids not sent answer
 * ESTALE after a crash, nothing else changes. */
static void *keeper_main(void *arg)
{
	struct mount *m = arg;

	keep_sync(m); /* the connection, at once */
	pthread_mutex_lock(&m->keep_lock);
	for (;;) {
		while (!m->kq_n && !m->keep_stop)
			pthread_cond_wait(&m->keep_cond, &m->keep_lock);
		if (m->keep_stop && !m->kq_n)
			break;
		pthread_mutex_unlock(&m->keep_lock);
		keep_sync(m);
		pthread_mutex_lock(&m->keep_lock);
	}
	pthread_mutex_unlock(&m->keep_lock);
	return NULL;
}

static void keeper_stop(struct mount *m)
{
	if (!m->keeper_started)
		return;
	pthread_mutex_lock(&m->keep_lock);
	m->keep_stop = true;
	pthread_cond_signal(&m->keep_cond);
	pthread_mutex_unlock(&m->keep_lock);
	pthread_join(m->keeper, NULL);
	m->keeper_started = false;
}

/* The earlier servers' node ids the supervisor kept become aliases of
 * their descriptors (which the mount then owns). */
static int take_kept(struct mount *m, const struct mount_kept *kept, size_t n)
{
	size_t i;

	m->nabuckets = 1024;
	while (m->nabuckets < n)
		m->nabuckets *= 2;
	if (!(m->abuckets = mem_calloc(m->nabuckets, sizeof(*m->abuckets))))
		return -ENOMEM;
	for (i = 0; i < n; i++) {
		struct inode *in;
		struct stat st;
		size_t b;

		if ((kept[i].nodeid >> NODE_EPOCH_SHIFT) == m->epoch || kept[i].nodeid == FUSE_ROOT_ID ||
		    fstat(kept[i].fd, &st) < 0 || !(in = mem_calloc(1, sizeof(*in)))) {
			close(kept[i].fd);
			continue;
		}
		in->fd = kept[i].fd;
		in->dev = st.st_dev;
		in->ino = st.st_ino;
		in->type = st.st_mode & S_IFMT;
		in->alias = kept[i].nodeid;
		atomic_init(&in->rfd, -1);
		atomic_init(&in->wfd, -1);
		b = alias_bucket(m, in->alias);
		in->anext = m->abuckets[b];
		m->abuckets[b] = in;
		/* and by (dev, ino): a new lookup of the same file answers the
		 * kernel's old id, so it keeps one inode (one page cache, one
		 * set of attributes) per file, also for hard links */
		table_insert(m, in);
	}
	return 0;
}

static struct mount *mount_alloc(struct journal *j, const struct mount_opts *opts)
{
	struct mount *m;

	if (!(m = mem_calloc(1, sizeof(*m))))
		return NULL;
	m->root.fd = -1;
	m->j = j;
	m->am_root = geteuid() == 0;
	m->max_threads = opts && opts->max_threads ? opts->max_threads : 8;
	m->timeout = opts && opts->timeout > 0 ? opts->timeout : 3600.0;
	m->keeper_fd = -1;
	if (opts) {
		m->on_exit = opts->on_exit;
		m->ud = opts->ud;
		m->epoch = opts->epoch;
		if (opts->keep)
			m->keeper_fd = opts->keeper_fd;
	}
	if (pthread_mutex_init(&m->lock, NULL) != 0) {
		mem_free(m);
		return NULL;
	}
	if (pthread_cond_init(&m->reap_cond, NULL) != 0) {
		pthread_mutex_destroy(&m->lock);
		mem_free(m);
		return NULL;
	}
	pthread_mutex_init(&m->keep_lock, NULL); /* cannot fail on Linux */
	pthread_cond_init(&m->keep_cond, NULL);
	pthread_mutex_init(&m->keep_send_lock, NULL);
	m->nbuckets = 1024;
	if (!(m->buckets = mem_calloc(m->nbuckets, sizeof(*m->buckets)))) {
		mount_free(m);
		return NULL;
	}
	m->fd_limit = raise_fd_limit();
	m->reap_high = (size_t)m->fd_limit / 10 * 6;
	m->reap_low = (size_t)m->fd_limit / 10 * 4;
	return m;
}

static int new_session(struct mount *m, const struct mount_opts *opts)
{
	char optstr[160];
	const char *argv[4];
	int argc = 0;
	struct fuse_args args;

	snprintf(optstr, sizeof(optstr), "fsname=airlock,subtype=airlock,default_permissions%s",
		 opts && opts->allow_other ? ",allow_other" : "");
	argv[argc++] = "airlock";
	argv[argc++] = "-o";
	argv[argc++] = optstr;
	if (opts && opts->debug)
		argv[argc++] = "-d";
	args = (struct fuse_args)FUSE_ARGS_INIT(argc, (char **)argv);
	m->se = fuse_session_new(&args, &mount_ops, sizeof(mount_ops), m);
	fuse_opt_free_args(&args); /* frees only what libfuse allocated into it */
	return m->se ? 0 : -EINVAL;
}

static int set_root(struct mount *m, int fd)
{
	struct stat st;

	m->root.fd = fd;
	if (fd < 0 || fstat(fd, &st) < 0)
		return neg_errno();
	m->root.dev = st.st_dev;
	m->root.ino = st.st_ino;
	m->root.type = S_IFDIR;
	return 0;
}

/* Mount over m->path and take the kernel's INIT. */
static int mount_fresh(struct mount *m, const struct mount_opts *opts)
{
	int r;

	if ((r = clear_stale_canon(m->path)) < 0)
		return r;
	/* the directory as it is before the mount covers it */
	if ((r = set_root(m, open(m->path, O_PATH | O_DIRECTORY | O_CLOEXEC))) < 0)
		return r;
	if (access("/dev/fuse", R_OK | W_OK) < 0)
		return errno == ENOENT ? -ENODEV : neg_errno();
	if ((r = new_session(m, opts)) < 0)
		return r;
	errno = 0;
	if (fuse_session_mount(m->se, m->path) != 0)
		return errno == EPERM || errno == EACCES || errno == 0 ? -EPERM : neg_errno();
	if ((r = take_init(m)) < 0)
		fuse_session_unmount(m->se);
	return r;
}

/* Serve the live mount of opts->adopt_fd whose server is gone. */
static int mount_adopt(struct mount *m, const struct mount_opts *opts)
{
	char dev[32];
	int fd, r;

	if (opts->epoch == 0)
		return -EINVAL; /* ids must differ from the first server's */
	if ((r = set_root(m, openat(opts->backing_fd, ".", O_PATH | O_DIRECTORY | O_CLOEXEC))) < 0)
		return r;
	if ((r = new_session(m, opts)) < 0)
		return r;
	if ((fd = fcntl(opts->adopt_fd, F_DUPFD_CLOEXEC, 3)) < 0)
		return neg_errno();
	snprintf(dev, sizeof(dev), "/dev/fd/%d", fd); /* libfuse takes a live fd so */
	if (fuse_session_mount(m->se, dev) != 0) {
		close(fd);
		return -EINVAL;
	}
	if ((r = replay_init(m, opts->adopt_init, opts->adopt_init_len)) < 0 ||
	    (r = take_kept(m, opts->kept, opts->nkept)) < 0)
		return r;
	/* without kept ids every cached entry is stale: drop them */
	m->adopted = opts->nkept == 0;
	return 0;
}

int mount_start(const char *dir, struct journal *j, const struct mount_opts *opts, struct mount **out)
{
	struct mount *m;
	struct stat st;
	bool adopt = opts && opts->adopt_init;
	int r;

	*out = NULL;
	if (!(m = mount_alloc(j, opts)))
		return -ENOMEM;
	/* resuming: dir is covered by a mount nobody serves yet, so nothing
	 * may look it up by path before the session runs */
	if (adopt && dir[0] == '/')
		r = (m->path = mem_strdup(dir)) ? 0 : -ENOMEM;
	else
		r = adopt ? -EINVAL : canon_path(dir, &m->path);
	if (r < 0)
		goto fail;
	m->pathlen = strlen(m->path);
	if ((r = adopt ? mount_adopt(m, opts) : mount_fresh(m, opts)) < 0)
		goto fail;
	if ((r = -pthread_create(&m->thread, NULL, session_main, m)) < 0) {
		if (!adopt)
			fuse_session_unmount(m->se);
		goto fail;
	}
	m->thread_started = true;
	if (adopt)
		resend_pending(m);
	if (m->keeper_fd >= 0)
		m->keeper_started = pthread_create(&m->keeper, NULL, keeper_main, m) == 0;
	/* best effort: without it only huge trees suffer (and, resuming, the
	 * kernel's old entries answer ESTALE until looked up again) */
	m->reaper_started = pthread_create(&m->reaper, NULL, reaper_main, m) == 0;
	/* the first request through the mount also proves it is served */
	if (stat(m->path, &st) == 0)
		m->mnt_dev = st.st_dev;
	*out = m;
	return 0;
fail:
	mount_free(m);
	return r;
}

/* Sever the FUSE connection (through fusectl, mounting it if needed), so a
 * session whose mount stays busy after the detach ends anyway. */
static void abort_connection(struct mount *m)
{
	char p[96];
	int fd;

	snprintf(p, sizeof(p), "/sys/fs/fuse/connections/%u/abort",
		 (unsigned)((major(m->mnt_dev) << 20) | minor(m->mnt_dev)));
	fd = open(p, O_WRONLY | O_CLOEXEC);
	if (fd < 0 && errno == ENOENT && m->am_root &&
	    mount("fusectl", "/sys/fs/fuse/connections", "fusectl", 0, NULL) == 0)
		fd = open(p, O_WRONLY | O_CLOEXEC);
	if (fd >= 0) {
		if (write(fd, "1", 1) < 0) {
			/* nothing more to try */
		}
		close(fd);
	}
}

void mount_stop(struct mount *m)
{
	struct timespec ts;

	if (!m)
		return;
	atomic_store(&m->stopping, true);
	if (m->reaper_started) {
		pthread_mutex_lock(&m->lock);
		m->reaper_stop = true;
		pthread_cond_signal(&m->reap_cond);
		pthread_mutex_unlock(&m->lock);
		pthread_join(m->reaper, NULL);
	}
	if (m->thread_started) {
		/* After the detach the kernel ends the connection as soon as no
		 * file on the mount is open any more; the workers then read
		 * ENODEV and the session loop returns. */
		detach(m->path);
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_sec += 2;
		if (pthread_timedjoin_np(m->thread, NULL, &ts) != 0) {
			abort_connection(m);
			pthread_join(m->thread, NULL);
		}
	}
	if (m->se)
		fuse_session_unmount(m->se); /* closes /dev/fuse; the mount is gone already */
	mount_free(m);
}

const char *mount_path(const struct mount *m)
{
	return m->path;
}
