/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The local sandbox (doc/SANDBOX.md): airlock-agent as PID 1 of new user,
 * mount, pid, ipc, uts and network namespaces, on a private root.
 *
 *   parent                          child (clone, new namespaces)
 *   ------                          -----------------------------
 *   clone ------------------------> waits on go
 *   uid_map/gid_map: 1000 -> us     .
 *   (root: 1000 -> its own uid)     .
 *   go ---------------------------> opens its bind sources (still the
 *                                   invoking user's file access), becomes
 *                                   uid 1000 (caps kept in its namespace),
 *                                   builds the root on a tmpfs, lo up,
 *                                   pivot_root, root read-only,
 *                                   no_new_privs, execs the agent
 *   errors <----------------------- (stage, errno, path) on a CLOEXEC pipe
 *   "ready" <---------------------- agent's stdout
 *
 * The child runs in a copy of a possibly multi-threaded process: it uses
 * only system calls on data the parent prepared (no allocation, no stdio).
 *
 * Inside:
 *   /usr /etc /opt and /bin /sbin /lib* (or their merged-/usr symlinks)
 *                       read-only binds of the host's
 *   /dev                null zero full random urandom tty (binds), pts
 *                       (new devpts), ptmx, shm (tmpfs), fd/std* links
 *   /proc               the sandbox's pid namespace
 *   /tmp                tmpfs
 *   /home/airlock       <state>/home (HOME)
 *   <workspace path>    <state>/workspace, at the host's absolute path
 *   /airlock/keys       tmpfs holding a copy of guest.key (0600)
 *   /airlock/state      <state>/agent (the agent's sync state)
 *   /airlock/run        <state>/run (agent.sock: the host connects there)
 *   everything else     the root tmpfs, read-only: empty
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <net/if.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/mount.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/securebits.h>
#include <sodium.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/keys.h"
#include "airlock/core/mem.h"
#include "sandbox_i.h"

#define SB_UID	      1000u  /* the one uid inside */
#define SB_NEWROOT    "/tmp" /* where the child builds the root (a private tmpfs over its /tmp) */
#define SB_HOME	      "/home/airlock"
#define SB_KEYS	      "/airlock/keys"
#define SB_STATE      "/airlock/state"
#define SB_RUN	      "/airlock/run"
#define SB_STACK      (256 * 1024)
#define SB_MAX_MOUNTS 40
#define SB_MAX_ARGS   24

#ifndef CLOSE_RANGE_CLOEXEC
#define CLOSE_RANGE_CLOEXEC (1U << 2)
#endif
#ifndef AT_RECURSIVE
#define AT_RECURSIVE 0x8000
#endif

enum mkind {
	M_BIND_RO,  /* directory, read-only */
	M_BIND_RW,  /* directory, read-write */
	M_BIND_DEV, /* a device file */
	M_SYMLINK,  /* src is the link's target */
	M_TMPFS,    /* src is the option string */
	M_DEVPTS,
	M_PROC,
	M_WORKSPACE, /* M_BIND_RW, named for messages */
	M_OVERLAY,   /* an overlay of the layers in lmounts.ovl[ovl] (sandbox_fork.h) */
};

struct mnt {
	enum mkind kind;
	char src[PATH_MAX];
	char dst[PATH_MAX]; /* SB_NEWROOT + path inside */
	int fd;		    /* bind source, opened by the child */
	int ovl;	    /* M_OVERLAY: its layers in lmounts.ovl */
};

/* An overlay's directories: the lowers (top first), then upper, then
 * work; the child opens each (O_PATH) before it becomes uid 1000 and names
 * them to the overlay as /proc/self/fd/N, so the layers' parents (as root,
 * the 0700 state directory) need not be searchable by the sandbox's uid. */
#define SB_MAX_OVL  2
#define SB_OVL_DIRS (SANDBOX_FORK_LAYERS_MAX + 3)
#define SB_OVL_OPTS (SB_OVL_DIRS * 24 + 64)
struct lovl {
	int n, nlower;
	char dir[SB_OVL_DIRS][PATH_MAX];
	int fd[SB_OVL_DIRS];
	char opts[SB_OVL_OPTS];
};

/* The child's file descriptors, opened by the parent (all CLOEXEC). */
struct lfds {
	int go;	   /* read end: one byte once the id maps are written */
	int err;   /* write end: a struct lerr when setup fails, EOF at exec */
	int out;   /* write end: the agent's stdout (its "ready" line) */
	int log;   /* <state>/agent.log: the agent's stderr */
	int null;  /* /dev/null: the agent's stdin */
	int agent; /* O_PATH of airlock-agent, for execveat */
};

/* The mount table, in the order the child mounts it. */
struct lmounts {
	struct mnt m[SB_MAX_MOUNTS];
	int n;
	struct lovl ovl[SB_MAX_OVL];
	int novl;
};

/* The guest key as its file's text, and where the child writes it. */
struct lkey {
	char text[KEYS_B64_LEN + 1];
	char path[64];
};

/* /etc/passwd and /etc/group as the sandbox sees them: the host's, with
 * uid/gid 1000 renamed to airlock (home /home/airlock); NULL: the host's. */
struct letc {
	char *text[2];
	size_t len[2];
};

/* The agent's command line and environment. */
struct lexec {
	char *argv[SB_MAX_ARGS];
	char argbuf[SB_MAX_ARGS][PATH_MAX + 32];
	char *envp[4];
};

/* Everything the child needs, prepared by the parent. */
struct lctx {
	struct lfds fd;
	struct lmounts mnt;
	struct lkey key;
	struct letc etc;
	struct lexec exec;
	struct sandbox_rlimits rl;
};

/* What failed in the child: reported on err_fd. */
struct lerr {
	int stage;
	int err;
	char what[PATH_MAX];
};

enum {
	STAGE_GO = 1,
	STAGE_OPEN,
	STAGE_IDS,
	STAGE_PRIVATE,
	STAGE_ROOTFS,
	STAGE_MOUNT,
	STAGE_ETC,
	STAGE_HOSTNAME,
	STAGE_LOOPBACK,
	STAGE_PIVOT,
	STAGE_KEY,
	STAGE_READONLY,
	STAGE_LIMITS,
	STAGE_EXEC,
};

static const char *const stage_names[] = {
    [STAGE_GO] = "waiting for the id maps",
    [STAGE_OPEN] = "opening",
    [STAGE_IDS] = "becoming uid 1000",
    [STAGE_PRIVATE] = "making mounts private",
    [STAGE_ROOTFS] = "mounting the root tmpfs",
    [STAGE_MOUNT] = "mounting",
    [STAGE_ETC] = "writing /etc/passwd and /etc/group",
    [STAGE_HOSTNAME] = "setting the hostname",
    [STAGE_LOOPBACK] = "bringing up lo",
    [STAGE_PIVOT] = "pivot_root",
    [STAGE_KEY] = "writing the agent's key",
    [STAGE_READONLY] = "making the root read-only",
    [STAGE_LIMITS] = "setting the rlimits",
    [STAGE_EXEC] = "executing the agent",
};

struct local {
	int out_fd;		   /* agent stdout (read end), closed after ready */
	struct sandbox_limits lim; /* and the sandbox's cgroup */
};

/* ---- child ---- */

static size_t c_strlen(const char *s)
{
	size_t n = 0;
	while (s[n])
		n++;
	return n;
}

static __attribute__((noreturn)) void c_fail(const struct lctx *c, int stage, int err, const char *what)
{
	static struct lerr e; /* the child's own copy of memory: not shared */
	size_t n = what ? c_strlen(what) : 0;

	e.stage = stage;
	e.err = err;
	if (n >= sizeof(e.what))
		n = sizeof(e.what) - 1;
	if (n)
		memcpy(e.what, what, n);
	e.what[n] = '\0';
	(void)!write(c->fd.err, &e, sizeof(e));
	_exit(127);
}

/* mkdir -p of path (absolute) on the new root; existing parts are fine. */
static int c_mkdir_p(char *path)
{
	for (char *p = path + 1;; p++) {
		if (*p == '/' || !*p) {
			char save = *p;
			*p = '\0';
			int r = mkdir(path, 0755);
			int e = errno;
			*p = save;
			if (r < 0 && e != EEXIST)
				return -e;
			if (!save)
				return 0;
		}
	}
}

/* Bind the tree at fd onto dst with attrs: open_tree + mount_setattr +
 * move_mount, so flags locked by the host mount (nosuid, nodev...) need
 * not be repeated. A source with locked submounts can only be cloned
 * recursively: try that second. */
static int c_bind(int fd, const char *dst, uint64_t attrs)
{
	struct mount_attr ma = {.attr_set = attrs};
	int t = (int)syscall(SYS_open_tree, fd, "", OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH);

	if (t < 0 && errno == EINVAL)
		t = (int)syscall(SYS_open_tree, fd, "",
				 OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC | AT_EMPTY_PATH | AT_RECURSIVE);
	if (t < 0)
		return -errno;
	if (attrs && syscall(SYS_mount_setattr, t, "", AT_EMPTY_PATH | AT_RECURSIVE, &ma, sizeof(ma)) < 0) {
		int e = errno;
		close(t);
		return -e;
	}
	if (syscall(SYS_move_mount, t, "", AT_FDCWD, dst, MOVE_MOUNT_F_EMPTY_PATH) < 0) {
		int e = errno;
		close(t);
		return -e;
	}
	close(t);
	return 0;
}

/* "lowerdir=/proc/self/fd/A:/proc/self/fd/B,upperdir=…,workdir=…,userxattr",
 * written without stdio (the child only makes system calls). */
static char *c_put(char *p, const char *s)
{
	while (*s)
		*p++ = *s++;
	return p;
}

static char *c_put_fd(char *p, int fd)
{
	char digits[12];
	int n = 0;

	p = c_put(p, "/proc/self/fd/");
	do
		digits[n++] = (char)('0' + fd % 10);
	while ((fd /= 10) > 0);
	while (n > 0)
		*p++ = digits[--n];
	return p;
}

static int c_overlay(struct lovl *o, const char *dst)
{
	char *p = o->opts;
	int r = c_mkdir_p((char *)dst);

	if (r < 0)
		return r;
	p = c_put(p, "lowerdir=");
	for (int i = 0; i < o->nlower; i++) {
		if (i)
			*p++ = ':';
		p = c_put_fd(p, o->fd[i]);
	}
	p = c_put_fd(c_put(p, ",upperdir="), o->fd[o->nlower]);
	p = c_put_fd(c_put(p, ",workdir="), o->fd[o->nlower + 1]);
	/* volatile: no sync of the upper's whole filesystem at every umount
	 * (ovl_sync_fs: seconds on a busy disk, and new mounts stalled behind
	 * it); the work directory is made afresh before each mount */
	p = c_put(p, ",userxattr,volatile");
	*p = '\0';
	return mount("overlay", dst, "overlay", MS_NOSUID | MS_NODEV, o->opts) < 0 ? -errno : 0;
}

static int c_mount_one(struct lmounts *t, struct mnt *m)
{
	int fd;

	switch (m->kind) {
	case M_SYMLINK:
		return symlink(m->src, m->dst) < 0 ? -errno : 0;
	case M_BIND_RO:
		if (mkdir(m->dst, 0755) < 0 && errno != EEXIST)
			return -errno;
		return c_bind(m->fd, m->dst, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
	case M_BIND_RW:
	case M_WORKSPACE: {
		int r = c_mkdir_p(m->dst);
		if (r < 0)
			return r;
		return c_bind(m->fd, m->dst, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV);
	}
	case M_BIND_DEV:
		if ((fd = open(m->dst, O_CREAT | O_WRONLY | O_CLOEXEC, 0644)) < 0)
			return -errno;
		close(fd);
		return c_bind(m->fd, m->dst, MOUNT_ATTR_NOSUID | MOUNT_ATTR_NOEXEC);
	case M_TMPFS: {
		int r = c_mkdir_p(m->dst);
		if (r < 0)
			return r;
		return mount("tmpfs", m->dst, "tmpfs", MS_NOSUID | MS_NODEV, m->src) < 0 ? -errno : 0;
	}
	case M_DEVPTS:
		if (mkdir(m->dst, 0755) < 0 && errno != EEXIST)
			return -errno;
		return mount("devpts", m->dst, "devpts", MS_NOSUID | MS_NOEXEC, "newinstance,ptmxmode=0666,mode=0620") <
			       0
			   ? -errno
			   : 0;
	case M_PROC:
		if (mkdir(m->dst, 0555) < 0 && errno != EEXIST)
			return -errno;
		return mount("proc", m->dst, "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, NULL) < 0 ? -errno : 0;
	case M_OVERLAY:
		return c_overlay(&t->ovl[m->ovl], m->dst);
	}
	return -EINVAL;
}

/* Over the read-only /etc: passwd and group made by the parent, written to
 * a scratch tmpfs, bound file by file (read-only), the scratch detached. */
static int c_etc(const struct lctx *c)
{
	static const char *const name[2] = {"passwd", "group"};
	static char src[64], dst[64];
	struct mount_attr ma = {.attr_set = MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV};
	const char *scratch = SB_NEWROOT "/.etc";
	int r = 0;

	if (!c->etc.text[0] && !c->etc.text[1])
		return 0;
	if (mkdir(scratch, 0755) < 0 || mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m") < 0)
		return -errno;
	for (int i = 0; i < 2 && r == 0; i++) {
		int fd;
		if (!c->etc.text[i])
			continue;
		memcpy(src, scratch, c_strlen(scratch));
		src[c_strlen(scratch)] = '/';
		memcpy(src + c_strlen(scratch) + 1, name[i], c_strlen(name[i]) + 1);
		memcpy(dst, SB_NEWROOT "/etc/", sizeof(SB_NEWROOT "/etc/") - 1);
		memcpy(dst + sizeof(SB_NEWROOT "/etc/") - 1, name[i], c_strlen(name[i]) + 1);
		if ((fd = open(src, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644)) < 0) {
			r = -errno;
			break;
		}
		if (write(fd, c->etc.text[i], c->etc.len[i]) != (ssize_t)c->etc.len[i])
			r = errno ? -errno : -EIO;
		close(fd);
		if (r == 0 && mount(src, dst, NULL, MS_BIND, NULL) < 0)
			r = -errno;
		if (r == 0 && syscall(SYS_mount_setattr, AT_FDCWD, dst, 0, &ma, sizeof(ma)) < 0)
			r = -errno;
	}
	if (umount2(scratch, MNT_DETACH) < 0 && r == 0)
		r = -errno;
	if (rmdir(scratch) < 0 && r == 0)
		r = -errno;
	return r;
}

static int c_loopback_up(void)
{
	struct ifreq ifr;
	int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0), r = 0;

	if (s < 0)
		return -errno;
	memset(&ifr, 0, sizeof(ifr));
	memcpy(ifr.ifr_name, "lo", 3);
	if (ioctl(s, SIOCGIFFLAGS, &ifr) < 0) {
		r = -errno;
	} else {
		ifr.ifr_flags |= IFF_UP | IFF_RUNNING;
		if (ioctl(s, SIOCSIFFLAGS, &ifr) < 0)
			r = -errno;
	}
	close(s);
	return r;
}

/* The steps below follow doc/SANDBOX.md, "Start". Each reports its
 * failure through c_fail and does not return then. */

/* Step 2 (the parent's): it writes our id maps, then says go. */
static void c_wait_go(const struct lctx *c)
{
	char go;

	if (read(c->fd.go, &go, 1) != 1)
		_exit(127);
	close(c->fd.go);
}

/* Step 3: bind sources, opened with the invoking user's file access (as
 * root: owner of the 0700 state dir), before we become uid 1000. */
static void c_open_sources(struct lctx *c)
{
	for (int i = 0; i < c->mnt.n; i++) {
		struct mnt *m = &c->mnt.m[i];
		if (m->kind == M_OVERLAY) {
			struct lovl *o = &c->mnt.ovl[m->ovl];
			for (int k = 0; k < o->n; k++)
				if ((o->fd[k] = open(o->dir[k], O_PATH | O_CLOEXEC | O_DIRECTORY | O_NOFOLLOW)) < 0)
					c_fail(c, STAGE_OPEN, errno, o->dir[k]);
			continue;
		}
		if (m->kind != M_BIND_RO && m->kind != M_BIND_RW && m->kind != M_BIND_DEV && m->kind != M_WORKSPACE)
			continue;
		if ((m->fd = open(m->src, O_PATH | O_CLOEXEC | (m->kind == M_BIND_DEV ? 0 : O_DIRECTORY))) < 0)
			c_fail(c, STAGE_OPEN, errno, m->src);
	}
}

/* Step 3: uid/gid 1000 (mapped to the invoking user, or the sandbox's own uid for root),
 * keeping the capabilities this namespace gave us until execve. */
static void c_become_uid(const struct lctx *c)
{
	if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED, 0, 0, 0) < 0)
		c_fail(c, STAGE_IDS, errno, "securebits");
	if (setresgid(SB_UID, SB_UID, SB_UID) < 0 || setresuid(SB_UID, SB_UID, SB_UID) < 0)
		c_fail(c, STAGE_IDS, errno, NULL);
}

/* Step 4: the new root on a tmpfs over our /tmp; nothing we mount
 * propagates back to the host. */
static void c_build_root(struct lctx *c)
{
	int r;

	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		c_fail(c, STAGE_PRIVATE, errno, "/");
	if (mount("tmpfs", SB_NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m") < 0)
		c_fail(c, STAGE_ROOTFS, errno, SB_NEWROOT);
	for (int i = 0; i < c->mnt.n; i++)
		if ((r = c_mount_one(&c->mnt, &c->mnt.m[i])) < 0)
			c_fail(c, STAGE_MOUNT, -r, c->mnt.m[i].dst);
	for (int i = 0; i < c->mnt.n; i++)
		if (c->mnt.m[i].fd >= 0)
			close(c->mnt.m[i].fd);
	for (int i = 0; i < c->mnt.novl; i++)
		for (int k = 0; k < c->mnt.ovl[i].n; k++)
			close(c->mnt.ovl[i].fd[k]);
	if ((r = c_etc(c)) < 0)
		c_fail(c, STAGE_ETC, -r, NULL);
}

/* Step 5: our own hostname, and lo, the only interface of the network
 * namespace. */
static void c_name_and_loopback(const struct lctx *c)
{
	int r;

	if (sethostname("airlock", 7) < 0)
		c_fail(c, STAGE_HOSTNAME, errno, NULL);
	if ((r = c_loopback_up()) < 0)
		c_fail(c, STAGE_LOOPBACK, -r, "lo");
}

/* Step 6: the new root; the old one (the host's) is detached: nothing of
 * it stays reachable. */
static void c_pivot_root(const struct lctx *c)
{
	if (chdir(SB_NEWROOT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
	    chdir("/") < 0)
		c_fail(c, STAGE_PIVOT, errno, NULL);
}

/* Step 6: the agent's key on its own tmpfs, readable by nobody else. */
static void c_write_key(struct lctx *c)
{
	int fd = open(c->key.path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	size_t n = c_strlen(c->key.text);

	if (fd < 0)
		c_fail(c, STAGE_KEY, errno, c->key.path);
	if (write(fd, c->key.text, n) != (ssize_t)n)
		c_fail(c, STAGE_KEY, errno ? errno : EIO, c->key.path);
	close(fd);
	sodium_memzero(c->key.text, sizeof(c->key.text));
}

/* Step 6: the root tmpfs read-only: writes outside the workspace, /tmp
 * and the home fail. */
static void c_root_readonly(const struct lctx *c)
{
	struct mount_attr ma = {.attr_set = MOUNT_ATTR_RDONLY};

	if (syscall(SYS_mount_setattr, AT_FDCWD, "/", 0, &ma, sizeof(ma)) < 0)
		c_fail(c, STAGE_READONLY, errno, "/");
}

/* Step 7: the rlimits PID 1 and everything it starts inherit
 * (doc/SANDBOX.md, "Limits"). */
static void c_rlimits(const struct lctx *c)
{
	if ((c->rl.nproc_set && setrlimit(RLIMIT_NPROC, &c->rl.nproc) < 0) || setrlimit(RLIMIT_CORE, &c->rl.core) < 0 ||
	    (c->rl.data_set && setrlimit(RLIMIT_DATA, &c->rl.data) < 0))
		c_fail(c, STAGE_LIMITS, errno, NULL);
}

/* Step 7: stdio, no inherited fds, no privilege gained by exec, die with
 * the host daemon, and exec the agent (PID 1 of the namespace). Its uid
 * is not 0 in this namespace: execve leaves it no capability. */
static __attribute__((noreturn)) void c_exec_agent(const struct lctx *c)
{
	if (dup2(c->fd.null, 0) < 0 || dup2(c->fd.out, 1) < 0 || dup2(c->fd.log, 2) < 0)
		c_fail(c, STAGE_EXEC, errno, "stdio");
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		c_fail(c, STAGE_EXEC, errno, "close_range");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
	    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 ||
	    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
		c_fail(c, STAGE_EXEC, errno, "prctl");
	syscall(SYS_execveat, c->fd.agent, "", c->exec.argv, c->exec.envp, AT_EMPTY_PATH);
	c_fail(c, STAGE_EXEC, errno, c->exec.argv[0]);
}

static int child_main(void *arg)
{
	struct lctx *c = arg;

	c_wait_go(c);
	c_open_sources(c);
	c_become_uid(c);
	c_build_root(c);
	c_name_and_loopback(c);
	c_pivot_root(c);
	c_write_key(c);
	c_root_readonly(c);
	c_rlimits(c);
	c_exec_agent(c);
}

/* ---- parent ---- */

static int add_mnt(struct lmounts *t, enum mkind kind, const char *src, const char *inside)
{
	struct mnt *m;

	if (t->n >= SB_MAX_MOUNTS)
		return -E2BIG;
	m = &t->m[t->n++];
	m->kind = kind;
	m->fd = -1;
	if ((size_t)snprintf(m->src, sizeof(m->src), "%s", src ? src : "") >= sizeof(m->src) ||
	    (size_t)snprintf(m->dst, sizeof(m->dst), "%s%s", SB_NEWROOT, inside) >= sizeof(m->dst))
		return -ENAMETOOLONG;
	return 0;
}

/* /bin, /sbin, /lib*: the host's symlink (merged /usr) or a read-only bind. */
static int add_sysdir(struct lmounts *t, const char *dir)
{
	char target[PATH_MAX];
	struct stat st;
	ssize_t n;

	if (lstat(dir, &st) < 0)
		return 0; /* absent on this host */
	if (S_ISLNK(st.st_mode)) {
		if ((n = readlink(dir, target, sizeof(target) - 1)) < 0)
			return -errno;
		target[n] = '\0';
		return add_mnt(t, M_SYMLINK, target, dir);
	}
	return S_ISDIR(st.st_mode) ? add_mnt(t, M_BIND_RO, dir, dir) : 0;
}

/* The host's passwd/group without the entries of uid/gid 1000 (third
 * field), plus ours. Best effort: on any failure the host's file shows. */
static void etc_prepare(struct letc *etc, int i, const char *path, const char *ours)
{
	enum { ETC_MAX = 1 << 20 };
	char line[4096];
	size_t n = 0, lo = strlen(ours);
	char *out;
	FILE *f;

	if (!(f = fopen(path, "re")))
		return;
	if (!(out = mem_alloc(ETC_MAX))) {
		fclose(f);
		return;
	}
	while (fgets(line, sizeof(line), f)) {
		size_t ll = strlen(line);
		const char *p = strchr(line, ':');
		if (p)
			p = strchr(p + 1, ':');
		if (p && !strncmp(p + 1, "1000:", 5))
			continue;
		if (n + ll + lo + 1 >= ETC_MAX) {
			mem_free(out);
			fclose(f);
			return;
		}
		memcpy(out + n, line, ll);
		n += ll;
	}
	fclose(f);
	if (n && out[n - 1] != '\n')
		out[n++] = '\n';
	memcpy(out + n, ours, lo);
	etc->text[i] = out;
	etc->len[i] = n + lo;
}

static const char *userns_hint(int err)
{
	FILE *f;
	int v = -1;

	if ((f = fopen("/proc/sys/kernel/unprivileged_userns_clone", "re"))) {
		if (fscanf(f, "%d", &v) != 1)
			v = -1;
		fclose(f);
		if (v == 0)
			return "unprivileged user namespaces are disabled (kernel.unprivileged_userns_clone=0; enable "
			       "with: sysctl -w kernel.unprivileged_userns_clone=1)";
	}
	if ((f = fopen("/proc/sys/user/max_user_namespaces", "re"))) {
		if (fscanf(f, "%d", &v) != 1)
			v = -1;
		fclose(f);
		if (v == 0)
			return "user namespaces are disabled (user.max_user_namespaces=0; enable with: sysctl -w "
			       "user.max_user_namespaces=15000)";
	}
	if ((f = fopen("/proc/sys/kernel/apparmor_restrict_unprivileged_userns", "re"))) {
		if (fscanf(f, "%d", &v) != 1)
			v = -1;
		fclose(f);
		if (v == 1)
			return "AppArmor restricts unprivileged user namespaces "
			       "(kernel.apparmor_restrict_unprivileged_userns=1; allow airlock with an AppArmor "
			       "profile "
			       "granting 'userns', or: sysctl -w kernel.apparmor_restrict_unprivileged_userns=0)";
	}
	if (err == ENOSPC)
		return "the user namespace limit is reached (user.max_user_namespaces)";
	return NULL;
}

static int write_file(pid_t pid, const char *name, const char *text)
{
	char path[64];
	int fd, r = 0;
	size_t n = strlen(text);

	snprintf(path, sizeof(path), "/proc/%d/%s", (int)pid, name);
	if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0)
		return -errno;
	if (write(fd, text, n) != (ssize_t)n)
		r = errno ? -errno : -EIO;
	close(fd);
	return r;
}

static double mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* The last line of the agent's log, for an error message. */
static void log_tail(const char *dir, char *out, size_t n)
{
	char path[PATH_MAX + 16], buf[2048];
	ssize_t got;
	int fd;

	out[0] = '\0';
	snprintf(path, sizeof(path), "%s/agent.log", dir);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return;
	off_t end = lseek(fd, 0, SEEK_END);
	off_t from = end > (off_t)sizeof(buf) - 1 ? end - (off_t)sizeof(buf) + 1 : 0;
	got = pread(fd, buf, sizeof(buf) - 1, from);
	close(fd);
	if (got <= 0)
		return;
	buf[got] = '\0';
	while (got > 0 && buf[got - 1] == '\n')
		buf[--got] = '\0';
	char *nl = strrchr(buf, '\n');
	if ((size_t)snprintf(out, n, "%s", nl ? nl + 1 : buf) >= n && n > 4)
		memcpy(out + n - 4, "...", 4);
}

static void kill_wait(pid_t pid)
{
	kill(pid, SIGKILL);
	while (waitpid(pid, NULL, 0) < 0 && errno == EINTR)
		;
}

/* The parent's side of one start: what it prepared for the child (its
 * ends of the pipes are in c->fd), its own ends, the child's stack. */
struct lstart {
	struct lctx *c;
	struct local *l; /* becomes sb->impl once the agent is ready */
	int go[2];	 /* the parent says go (doc/SANDBOX.md, "Start", step 2) */
	int ep[2];	 /* the child's error record */
	int op[2];	 /* the agent's stdout */
	void *stack;	 /* MAP_FAILED when none */
	pid_t pid;	 /* the child; -1 before clone */
};

static int lstart_alloc(struct lstart *s)
{
	if (!(s->c = mem_calloc(1, sizeof(*s->c))))
		return -ENOMEM;
	s->c->fd = (struct lfds){.go = -1, .err = -1, .out = -1, .log = -1, .null = -1, .agent = -1};
	if (!(s->l = mem_calloc(1, sizeof(*s->l))))
		return -ENOMEM;
	s->l->out_fd = -1;
	return 0;
}

static void lstart_clear(struct lstart *s)
{
	if (s->stack != MAP_FAILED)
		munmap(s->stack, SB_STACK);
	if (s->c) {
		struct lctx *c = s->c;
		int fds[] = {c->fd.agent, c->fd.log, c->fd.null};
		for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
			if (fds[i] >= 0)
				close(fds[i]);
		sodium_memzero(c->key.text, sizeof(c->key.text));
		mem_free(c->etc.text[0]);
		mem_free(c->etc.text[1]);
		mem_free(c);
	}
	if (s->l)
		sandbox_limits_release(&s->l->lim);
	mem_free(s->l);
	int pfds[] = {s->go[0], s->go[1], s->ep[0], s->ep[1], s->op[0], s->op[1]};
	for (size_t i = 0; i < sizeof(pfds) / sizeof(pfds[0]); i++)
		if (pfds[i] >= 0)
			close(pfds[i]);
}

/* The workspace is mounted at its host path: it must be one, below /. */
static int workspace_check(const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	if (cfg->workspace[0] != '/' || !strcmp(cfg->workspace, "/")) {
		errmsg_set(err, errlen, "workspace %s must be an absolute path below /", cfg->workspace);
		return -EINVAL;
	}
	return 0;
}

/* The host's system directories, read-only. */
static int table_add_system(struct lmounts *t)
{
	int r;

	if ((r = add_mnt(t, M_BIND_RO, "/usr", "/usr")) < 0 || (r = add_mnt(t, M_BIND_RO, "/etc", "/etc")) < 0 ||
	    (r = add_sysdir(t, "/bin")) < 0 || (r = add_sysdir(t, "/sbin")) < 0 || (r = add_sysdir(t, "/lib")) < 0 ||
	    (r = add_sysdir(t, "/lib64")) < 0 || (r = add_sysdir(t, "/lib32")) < 0 ||
	    (access("/opt", F_OK) == 0 && (r = add_mnt(t, M_BIND_RO, "/opt", "/opt")) < 0))
		return r;
	return 0;
}

/* /dev (a few devices, a new devpts, shm, the fd links), /proc, /tmp. */
static int table_add_dev_proc_tmp(struct lmounts *t, uint64_t tmp_size)
{
	static const char *const devs[] = {"null", "zero", "full", "random", "urandom", "tty"};
	char tmp_opts[64];
	int r;

	snprintf(tmp_opts, sizeof(tmp_opts), "mode=1777,size=%llu", (unsigned long long)tmp_size);
	if ((r = add_mnt(t, M_TMPFS, "mode=0755,size=1m", "/dev")) < 0)
		return r;
	for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++) {
		char src[32], in[32];
		snprintf(src, sizeof(src), "/dev/%s", devs[i]);
		snprintf(in, sizeof(in), "/dev/%s", devs[i]);
		if (access(src, F_OK) == 0 && (r = add_mnt(t, M_BIND_DEV, src, in)) < 0)
			return r;
	}
	if ((r = add_mnt(t, M_DEVPTS, NULL, "/dev/pts")) < 0 ||
	    (r = add_mnt(t, M_SYMLINK, "pts/ptmx", "/dev/ptmx")) < 0 ||
	    (r = add_mnt(t, M_TMPFS, "mode=1777,size=64m", "/dev/shm")) < 0 ||
	    (r = add_mnt(t, M_SYMLINK, "/proc/self/fd", "/dev/fd")) < 0 ||
	    (r = add_mnt(t, M_SYMLINK, "/proc/self/fd/0", "/dev/stdin")) < 0 ||
	    (r = add_mnt(t, M_SYMLINK, "/proc/self/fd/1", "/dev/stdout")) < 0 ||
	    (r = add_mnt(t, M_SYMLINK, "/proc/self/fd/2", "/dev/stderr")) < 0 ||
	    (r = add_mnt(t, M_PROC, NULL, "/proc")) < 0 || (r = add_mnt(t, M_TMPFS, tmp_opts, "/tmp")) < 0)
		return r;
	return 0;
}

/* part of the state ("workspace", "home") at inside: a bind of the
 * directory, or the overlay of its layer stack (a fork, or a parent that
 * has forks: sandbox_fork.h). */
static int add_part(struct lmounts *t, const struct sandbox_cfg *cfg, enum mkind plain, const char *part,
		    const char *inside)
{
	char dir[PATH_MAX];
	struct sandbox_stack *st;
	struct lovl *o;
	uint32_t uid = 0;
	int r;

	if ((r = sandbox_dir_of(cfg->workspace, dir, sizeof(dir))) < 0)
		return r;
	if (!(st = mem_calloc(1, sizeof(*st))))
		return -ENOMEM;
	if ((r = sandbox_stack_of(dir, cfg->fork, part, st)) < 0 || !st->overlay) {
		if (r == 0)
			r = add_mnt(t, plain, st->upper, inside);
		mem_free(st);
		return r;
	}
	if ((r = sandbox_stack_work_reset(st, sandbox_uid_file_read(dir, &uid) == 0 ? uid : 0)) < 0) {
		mem_free(st);
		return r;
	}
	if (t->novl >= SB_MAX_OVL || (r = add_mnt(t, M_OVERLAY, NULL, inside)) < 0) {
		mem_free(st);
		return r < 0 ? r : -E2BIG;
	}
	t->m[t->n - 1].ovl = t->novl;
	o = &t->ovl[t->novl++];
	o->nlower = (int)st->nlower;
	for (unsigned i = 0; i < st->nlower; i++)
		snprintf(o->dir[o->n++], PATH_MAX, "%s", st->lower[i]);
	snprintf(o->dir[o->n++], PATH_MAX, "%s", st->upper);
	snprintf(o->dir[o->n++], PATH_MAX, "%s", st->work);
	for (int i = 0; i < o->n; i++)
		o->fd[i] = -1;
	mem_free(st);
	return 0;
}

/* The state directory's parts, and the workspace last: its mount point
 * may be below /tmp or /home, made just before. */
static int table_add_state(struct lmounts *t, const struct sandbox *sb, const struct sandbox_cfg *cfg)
{
	char path[PATH_MAX + 64];
	int r;

	if ((r = add_part(t, cfg, M_BIND_RW, "home", SB_HOME)) < 0 ||
	    (r = add_mnt(t, M_TMPFS, "mode=0700,size=64k", SB_KEYS)) < 0)
		return r;
	snprintf(path, sizeof(path), "%s/agent", sb->dir);
	if ((r = add_mnt(t, M_BIND_RW, path, SB_STATE)) < 0)
		return r;
	snprintf(path, sizeof(path), "%s", sb->run_dir);
	if ((r = add_mnt(t, M_BIND_RW, path, SB_RUN)) < 0)
		return r;
	return add_part(t, cfg, M_WORKSPACE, "workspace", cfg->workspace);
}

/* The mount table, in order (doc/SANDBOX.md, "Start", step 4). */
static int mount_table_build(struct lmounts *t, const struct sandbox *sb, const struct sandbox_cfg *cfg,
			     const struct sandbox_limits *lim, char *err, size_t errlen)
{
	int r;

	if ((r = table_add_system(t)) < 0 || (r = table_add_dev_proc_tmp(t, lim->tmp)) < 0 ||
	    (r = table_add_state(t, sb, cfg)) < 0) {
		errmsg_set(err, errlen, "sandbox mount table: %s", strerror(-r));
		return r;
	}
	return 0;
}

/* The guest key, as its file's text, for the child to write inside. */
static int agent_key_prepare(struct lkey *k, const struct sandbox *sb, char *err, size_t errlen)
{
	struct noise_keypair guest;
	int r;

	if ((r = keys_load(sb->guest_key_file, &guest, err, errlen)) < 0)
		return r;
	sodium_bin2base64(k->text, KEYS_B64_LEN, guest.priv, sizeof(guest.priv), sodium_base64_VARIANT_ORIGINAL);
	strcat(k->text, "\n");
	sodium_memzero(&guest, sizeof(guest));
	snprintf(k->path, sizeof(k->path), "%s/guest.key", SB_KEYS);
	return 0;
}

/* The agent's command line (doc/SANDBOX.md, "Start", step 7) and
 * environment. */
static void agent_cmdline_build(struct lexec *x, const struct lkey *k, const struct sandbox *sb,
				const struct sandbox_cfg *cfg, const struct sandbox_limits *lim)
{
	char hostpub[KEYS_B64_LEN];
	int na = 0;

	keys_pub_format(sb->host.pub, hostpub);
#define ARG(...) (snprintf(x->argbuf[na], sizeof(x->argbuf[na]), __VA_ARGS__), x->argv[na] = x->argbuf[na], na++)
	ARG("airlock-agent");
	ARG("--listen");
	ARG("unix:%s/agent.sock", SB_RUN);
	ARG("--root");
	ARG("%s", cfg->workspace);
	ARG("--key");
	ARG("%s", k->path);
	ARG("--allow");
	ARG("%s", hostpub);
	ARG("--state");
	ARG("%s", SB_STATE);
	ARG("--home");
	ARG("%s", SB_HOME);
	ARG("--confine");
	ARG("--file-max");
	ARG("%llu", (unsigned long long)lim->file);
	if (cfg->fork) /* its changes are read from its upper: no watch on every directory, a start in O(1) */
		ARG("--no-track");
	if (cfg->verbose)
		ARG("-v");
#undef ARG
	x->argv[na] = NULL;
	x->envp[0] = "PATH=/usr/local/bin:/usr/bin:/bin";
	x->envp[1] = "HOME=" SB_HOME;
	x->envp[2] = "LANG=C.UTF-8";
	x->envp[3] = NULL;
}

/* The child's fds: the agent binary, its log, stdin, the pipes. */
static int child_fds_open(struct lstart *s, const struct sandbox *sb, char *err, size_t errlen)
{
	struct lfds *fd = &s->c->fd;
	char path[PATH_MAX + 64];
	int r;

	if ((fd->agent = open(sb->agent_path, O_PATH | O_CLOEXEC)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "agent %s: %s", sb->agent_path, strerror(errno));
		return r;
	}
	snprintf(path, sizeof(path), "%s/agent.log", sb->dir);
	if ((fd->log = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0 ||
	    (fd->null = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0 || pipe2(s->go, O_CLOEXEC) < 0 ||
	    pipe2(s->ep, O_CLOEXEC) < 0 || pipe2(s->op, O_CLOEXEC) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", fd->log < 0 ? path : "pipes", strerror(errno));
		return r;
	}
	fd->go = s->go[0];
	fd->err = s->ep[1];
	fd->out = s->op[1];
	return 0;
}

/* The channel: <state>/run/agent.sock, where the agent listens and the
 * host connects (sb->addr). */
static int channel_socket_prepare(struct sandbox *sb, char *err, size_t errlen)
{
	char path[PATH_MAX + 64];

	/* a socket left by an agent that was killed would make bind fail */
	snprintf(path, sizeof(path), "%s/agent.sock", sb->run_dir);
	if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		errmsg_set(err, errlen,
			   "the sandbox's socket path %s is longer than a Unix socket path may be (%zu bytes): set "
			   "XDG_DATA_HOME to a shorter directory",
			   path, sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		return -ENAMETOOLONG;
	}
	(void)unlink(path);
	if ((size_t)snprintf(sb->addr, sizeof(sb->addr), "unix:%s", path) >= sizeof(sb->addr)) {
		errmsg_set(err, errlen, "state directory %s: path too long for a socket", sb->dir);
		return -ENAMETOOLONG;
	}
	return 0;
}

/* doc/SANDBOX.md, "Start", step 1: the child in its new namespaces. Then
 * the parent closes the child's ends and forgets the key: the child has
 * its own copy of both. */
static int namespaces_clone(struct lstart *s, char *err, size_t errlen)
{
	int r;

	if ((s->stack = mmap(NULL, SB_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0)) ==
	    MAP_FAILED) {
		r = -errno;
		errmsg_set(err, errlen, "out of memory");
		return r;
	}
	s->pid = clone(
	    child_main, (char *)s->stack + SB_STACK,
	    CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | SIGCHLD, s->c);
	if (s->pid < 0) {
		int e = errno; /* userns_hint reads files */
		const char *hint = userns_hint(e);
		errmsg_set(err, errlen, "cannot create the sandbox's namespaces: %s%s%s", strerror(e), hint ? ": " : "",
			   hint ? hint : "");
		return -e;
	}
	sodium_memzero(s->c->key.text, sizeof(s->c->key.text));
	close(s->go[0]);
	s->go[0] = -1;
	close(s->ep[1]);
	s->ep[1] = -1;
	close(s->op[1]);
	s->op[1] = -1;
	return 0;
}

/* doc/SANDBOX.md, "Start", step 2: one uid, 1000 inside (the invoking
 * user outside, or as root the sandbox's own uid), then go. */
static int id_maps_write(const struct lstart *s, uint32_t host_uid, char *err, size_t errlen)
{
	uid_t ouid = host_uid ? host_uid : geteuid();
	gid_t ogid = host_uid ? host_uid : getegid();
	char line[64];
	int r;

	snprintf(line, sizeof(line), "%u %u 1\n", SB_UID, (unsigned)ouid);
	if ((r = write_file(s->pid, "setgroups", "deny")) < 0 || (r = write_file(s->pid, "uid_map", line)) < 0 ||
	    (snprintf(line, sizeof(line), "%u %u 1\n", SB_UID, (unsigned)ogid),
	     (r = write_file(s->pid, "gid_map", line)) < 0)) {
		const char *hint = userns_hint(-r);
		errmsg_set(err, errlen, "cannot map uid/gid %u into the sandbox: %s%s%s", SB_UID, strerror(-r),
			   hint ? ": " : "", hint ? hint : "");
		return r;
	}
	if (write(s->go[1], "g", 1) != 1) {
		r = -errno;
		errmsg_set(err, errlen, "starting the sandbox: %s", strerror(errno));
		return r;
	}
	return 0;
}

/* The child's error record, if it sent one (-errno, message in err); 1 at
 * EOF: the agent was exec'd. */
static int child_error_read(int fd, char *err, size_t errlen)
{
	struct lerr e;
	ssize_t n = read(fd, &e, sizeof(e));

	if (n != (ssize_t)sizeof(e))
		return 1;
	const char *hint = e.err == EPERM || e.err == EACCES ? userns_hint(e.err) : NULL;
	errmsg_set(err, errlen, "sandbox setup failed %s%s%s: %s%s%s",
		   e.stage > 0 && e.stage <= STAGE_EXEC ? stage_names[e.stage] : "?", e.what[0] ? " " : "", e.what,
		   strerror(e.err), hint ? ": " : "", hint ? hint : "");
	return e.err > 0 ? -e.err : -EIO; /* a record is a failure, whatever its errno */
}

/* The agent's first line, as it arrives. */
struct ready_line {
	char text[512];
	size_t got;
};

/* Read more of the agent's stdout: 0 when it said "ready", -EAGAIN when
 * its line is not complete yet, else -errno with the message in err. */
static int ready_line_read(int fd, struct ready_line *rl, const char *dir, char *err, size_t errlen)
{
	ssize_t n = read(fd, rl->text + rl->got, sizeof(rl->text) - 1 - rl->got);

	if (n <= 0) {
		char tail[512];
		log_tail(dir, tail, sizeof(tail));
		errmsg_set(err, errlen, "the sandbox's agent exited during start: %s", tail[0] ? tail : "(no log)");
		return -ECHILD;
	}
	rl->got += (size_t)n;
	rl->text[rl->got] = '\0';
	if (strstr(rl->text, "\n") && !strncmp(rl->text, "ready ", 6))
		return 0;
	if (rl->got == sizeof(rl->text) - 1 || (strchr(rl->text, '\n') && strncmp(rl->text, "ready ", 6))) {
		errmsg_set(err, errlen, "the sandbox's agent said '%.100s' instead of ready", rl->text);
		return -EPROTO;
	}
	return -EAGAIN;
}

/* doc/SANDBOX.md, "Start", step 8: the child's failure or the agent's
 * "ready" line, within SANDBOX_START_MS. */
static int agent_wait_ready(const struct lstart *s, const struct sandbox *sb, char *err, size_t errlen)
{
	double deadline = mono_ms() + SANDBOX_START_MS;
	struct ready_line rl = {.got = 0};
	bool err_open = true;
	int r;

	for (;;) {
		struct pollfd pf[2] = {{.fd = err_open ? s->ep[0] : -1, .events = POLLIN},
				       {.fd = s->op[0], .events = POLLIN}};
		double left = deadline - mono_ms();
		if (left <= 0) {
			errmsg_set(err, errlen,
				   "the sandbox's agent did not get ready within %u ms (log: %s/agent.log)",
				   SANDBOX_START_MS, sb->dir);
			return -ETIMEDOUT;
		}
		if (poll(pf, 2, (int)left + 1) < 0) {
			if (errno == EINTR)
				continue;
			r = -errno;
			errmsg_set(err, errlen, "waiting for the sandbox: %s", strerror(errno));
			return r;
		}
		if (err_open && (pf[0].revents & (POLLIN | POLLHUP))) {
			if ((r = child_error_read(s->ep[0], err, errlen)) <= 0)
				return r;
			err_open = false;
		}
		if ((pf[1].revents & (POLLIN | POLLHUP)) &&
		    (r = ready_line_read(s->op[0], &rl, sb->dir, err, errlen)) != -EAGAIN)
			return r;
	}
}

/* sb->describe: what isolates this sandbox, and its limits. */
static void local_describe(struct sandbox *sb, const struct sandbox_limits *lim)
{
	/* one kernel: the agent's Landlock is the one we can ask about */
	long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1U /* LANDLOCK_CREATE_RULESET_VERSION */);
	char ll[48];

	if (abi > 0)
		snprintf(ll, sizeof(ll), "landlock ABI %ld", abi);
	else
		snprintf(ll, sizeof(ll), "no landlock");
	char outside[32];
	if (sb->host_uid)
		snprintf(outside, sizeof(outside), "uid %u", (unsigned)sb->host_uid);
	else
		snprintf(outside, sizeof(outside), "you");
	char limits[128];
	sandbox_limits_describe(lim, limits, sizeof(limits));
	snprintf(sb->describe, sizeof(sb->describe),
		 "local: user+mount+pid+ipc+uts+net namespaces (uid %u inside = %s outside), private root, %s, "
		 "seccomp; %s; a shared kernel (weaker than a VM)",
		 SB_UID, outside, ll, limits);
}

int sandbox_local_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	struct lstart s = {.go = {-1, -1}, .ep = {-1, -1}, .op = {-1, -1}, .stack = MAP_FAILED, .pid = -1};
	int r;

	if ((r = workspace_check(cfg, err, errlen)) < 0)
		return r;
	if ((r = lstart_alloc(&s)) < 0) {
		errmsg_set(err, errlen, "out of memory");
		goto out;
	}
	/* the limits first: the child's rlimits depend on what the cgroup
	 * enforces, and the child gets a copy of our memory at clone */
	sandbox_limits_resolve(cfg->limits, &s.l->lim);
	sandbox_limits_cgroup(&s.l->lim, cfg->fork);
	sandbox_limits_rlimits(&s.l->lim, sb->host_uid != 0, &s.c->rl);
	if ((r = mount_table_build(&s.c->mnt, sb, cfg, &s.l->lim, err, errlen)) < 0 ||
	    (r = agent_key_prepare(&s.c->key, sb, err, errlen)) < 0)
		goto out;
	agent_cmdline_build(&s.c->exec, &s.c->key, sb, cfg, &s.l->lim);
	etc_prepare(&s.c->etc, 0, "/etc/passwd", "airlock:x:1000:1000:airlock sandbox:" SB_HOME ":/bin/sh\n");
	etc_prepare(&s.c->etc, 1, "/etc/group", "airlock:x:1000:\n");
	if ((r = child_fds_open(&s, sb, err, errlen)) < 0 || (r = channel_socket_prepare(sb, err, errlen)) < 0 ||
	    (r = namespaces_clone(&s, err, errlen)) < 0)
		goto out;
	/* into the cgroup before go: everything it ever forks is counted */
	if ((r = sandbox_limits_attach(&s.l->lim, s.pid)) < 0)
		errmsg_set(err, errlen, "moving the sandbox into its cgroup %s: %s", exec_cgroup_dir(s.l->lim.cg),
			   strerror(-r));
	if (r < 0 || (r = id_maps_write(&s, sb->host_uid, err, errlen)) < 0 ||
	    (r = agent_wait_ready(&s, sb, err, errlen)) < 0) {
		kill_wait(s.pid);
		goto out;
	}
	sb->pid = s.pid;
	s.l->out_fd = s.op[0];
	s.op[0] = -1;
	local_describe(sb, &s.l->lim);
	sb->impl = s.l;
	s.l = NULL;
out:
	lstart_clear(&s);
	return r;
}

#define HALT_FREEZE_MS 2000u /* a cgroup freezes in < 1 ms idle; bounded for a busy one */

/* "frozen 1" in dir's cgroup.events. */
static bool cg_frozen(const char *dir)
{
	char path[PATH_MAX + 32], text[512];
	ssize_t n;
	int fd;

	snprintf(path, sizeof(path), "%s/cgroup.events", dir);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
		return false;
	n = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (n <= 0)
		return false;
	text[n] = '\0';
	return strstr(text, "frozen 1") != NULL;
}

/* Freeze the sandbox's cgroup (v2's cgroup.freeze: each task stops at its
 * next return to user space or interruptible sleep, so no syscall of the
 * sandbox's is under way once "frozen 1" is read), then kill PID 1: the
 * kernel kills the rest of the namespace, and a frozen task meets the
 * SIGKILL without running again. Its exit (and the namespace's teardown:
 * with an overlay, the eviction of every inode it cached, seconds for a
 * large tree) is the caller's to reap later (sandbox_alive, sandbox_stop). */
int sandbox_local_halt(struct sandbox *sb)
{
	struct local *l = sb->impl;
	const char *dir = l ? exec_cgroup_dir(l->lim.cg) : NULL;
	char path[PATH_MAX + 32];
	int fd, r = 0;

	if (!dir)
		return -ENOTSUP;
	snprintf(path, sizeof(path), "%s/cgroup.freeze", dir);
	if ((fd = open(path, O_WRONLY | O_CLOEXEC)) < 0)
		return -ENOTSUP; /* a v1 pids cgroup only: no freezer of ours */
	if (write(fd, "1", 1) != 1)
		r = -errno;
	close(fd);
	if (r < 0)
		return r;
	for (double t0 = mono_ms(); !cg_frozen(dir); usleep(200))
		if (mono_ms() - t0 > HALT_FREEZE_MS) {
			/* not quiet in time: thaw it, the caller stops it the slow way */
			if ((fd = open(path, O_WRONLY | O_CLOEXEC)) >= 0) {
				(void)!write(fd, "0", 1);
				close(fd);
			}
			return -ETIMEDOUT;
		}
	return kill(sb->pid, SIGKILL) < 0 ? -errno : 0;
}

void sandbox_local_stop(struct sandbox *sb)
{
	struct local *l = sb->impl;

	if (sb->pid > 0) {
		/* from outside the namespace: the agent's signalfd sees pid 0 and
		 * stops; the kernel kills the rest of the namespace with it */
		kill(sb->pid, SIGTERM);
		for (double t0 = mono_ms(); mono_ms() - t0 < SANDBOX_STOP_MS;) {
			pid_t w = waitpid(sb->pid, NULL, WNOHANG);
			if (w == sb->pid || (w < 0 && errno == ECHILD)) {
				sb->pid = 0;
				break;
			}
			usleep(2000);
		}
		if (sb->pid > 0)
			kill_wait(sb->pid);
		sb->pid = 0;
	}
	if (l) {
		if (l->out_fd >= 0)
			close(l->out_fd);
		sandbox_limits_release(&l->lim);
		mem_free(l);
		sb->impl = NULL;
	}
}
