/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The local sandbox (doc/SANDBOX.md): airlock-agent as PID 1 of new user,
 * mount, pid, ipc, uts and network namespaces, on a private root.
 *
 *   parent                          child (clone, new namespaces)
 *   ------                          -----------------------------
 *   clone ------------------------> waits on go
 *   uid_map/gid_map: 1000 -> us     .
 *   (root: 1000 -> nobody)          .
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

#include "airlock/core/keys.h"
#include "airlock/core/mem.h"
#include "sandbox_i.h"

#define SB_UID	      1000u /* the one uid inside */
#define SB_NOBODY     65534u
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
};

struct mnt {
	enum mkind kind;
	char src[PATH_MAX];
	char dst[PATH_MAX]; /* SB_NEWROOT + path inside */
	int fd;		    /* bind source, opened by the child */
};

/* Everything the child needs, prepared by the parent. */
struct lctx {
	int go_fd, err_fd, out_fd, log_fd, null_fd, agent_fd;
	struct mnt m[SB_MAX_MOUNTS];
	int nm;
	char key_text[KEYS_B64_LEN + 1];
	char key_path[64];
	/* /etc/passwd and /etc/group as the sandbox sees them: the host's,
	 * with uid/gid 1000 renamed to airlock (home /home/airlock) */
	char *etc_text[2];
	size_t etc_len[2];
	char *argv[SB_MAX_ARGS];
	char argbuf[SB_MAX_ARGS][PATH_MAX + 32];
	char *envp[4];
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
    [STAGE_EXEC] = "executing the agent",
};

struct local {
	int out_fd; /* agent stdout (read end), closed after ready */
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
	(void)!write(c->err_fd, &e, sizeof(e));
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

static int c_mount_one(struct mnt *m)
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

	if (!c->etc_text[0] && !c->etc_text[1])
		return 0;
	if (mkdir(scratch, 0755) < 0 || mount("tmpfs", scratch, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=4m") < 0)
		return -errno;
	for (int i = 0; i < 2 && r == 0; i++) {
		int fd;
		if (!c->etc_text[i])
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
		if (write(fd, c->etc_text[i], c->etc_len[i]) != (ssize_t)c->etc_len[i])
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

static int child_main(void *arg)
{
	struct lctx *c = arg;
	char go;
	int r;

	/* 1. The parent writes our id maps, then says go. */
	if (read(c->go_fd, &go, 1) != 1)
		_exit(127);
	close(c->go_fd);

	/* 2. Bind sources, opened with the invoking user's file access (as
	 * root: owner of the 0700 state dir), before we become uid 1000. */
	for (int i = 0; i < c->nm; i++) {
		struct mnt *m = &c->m[i];
		if (m->kind != M_BIND_RO && m->kind != M_BIND_RW && m->kind != M_BIND_DEV && m->kind != M_WORKSPACE)
			continue;
		if ((m->fd = open(m->src, O_PATH | O_CLOEXEC | (m->kind == M_BIND_DEV ? 0 : O_DIRECTORY))) < 0)
			c_fail(c, STAGE_OPEN, errno, m->src);
	}

	/* 3. uid/gid 1000 (mapped to the invoking user, or nobody for root),
	 * keeping the capabilities this namespace gave us until execve. */
	if (prctl(PR_SET_SECUREBITS, SECBIT_NO_SETUID_FIXUP | SECBIT_NO_SETUID_FIXUP_LOCKED, 0, 0, 0) < 0)
		c_fail(c, STAGE_IDS, errno, "securebits");
	if (setresgid(SB_UID, SB_UID, SB_UID) < 0 || setresuid(SB_UID, SB_UID, SB_UID) < 0)
		c_fail(c, STAGE_IDS, errno, NULL);

	/* 4. Nothing we mount propagates back to the host. */
	if (mount(NULL, "/", NULL, MS_REC | MS_PRIVATE, NULL) < 0)
		c_fail(c, STAGE_PRIVATE, errno, "/");
	if (mount("tmpfs", SB_NEWROOT, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=16m") < 0)
		c_fail(c, STAGE_ROOTFS, errno, SB_NEWROOT);
	for (int i = 0; i < c->nm; i++)
		if ((r = c_mount_one(&c->m[i])) < 0)
			c_fail(c, STAGE_MOUNT, -r, c->m[i].dst);
	for (int i = 0; i < c->nm; i++)
		if (c->m[i].fd >= 0)
			close(c->m[i].fd);

	if ((r = c_etc(c)) < 0)
		c_fail(c, STAGE_ETC, -r, NULL);
	if (sethostname("airlock", 7) < 0)
		c_fail(c, STAGE_HOSTNAME, errno, NULL);
	if ((r = c_loopback_up()) < 0)
		c_fail(c, STAGE_LOOPBACK, -r, "lo");

	/* 5. The new root; the old one (the host's) is detached: nothing of
	 * it stays reachable. */
	if (chdir(SB_NEWROOT) < 0 || syscall(SYS_pivot_root, ".", ".") < 0 || umount2(".", MNT_DETACH) < 0 ||
	    chdir("/") < 0)
		c_fail(c, STAGE_PIVOT, errno, NULL);

	/* 6. The agent's key on its own tmpfs, readable by nobody else. */
	{
		int fd = open(c->key_path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		size_t n = c_strlen(c->key_text);
		if (fd < 0)
			c_fail(c, STAGE_KEY, errno, c->key_path);
		if (write(fd, c->key_text, n) != (ssize_t)n)
			c_fail(c, STAGE_KEY, errno ? errno : EIO, c->key_path);
		close(fd);
		sodium_memzero(c->key_text, sizeof(c->key_text));
	}

	/* 7. The root tmpfs read-only: writes outside the workspace, /tmp and
	 * the home fail. */
	{
		struct mount_attr ma = {.attr_set = MOUNT_ATTR_RDONLY};
		if (syscall(SYS_mount_setattr, AT_FDCWD, "/", 0, &ma, sizeof(ma)) < 0)
			c_fail(c, STAGE_READONLY, errno, "/");
	}

	/* 8. stdio, no inherited fds, no privilege gained by exec, die with
	 * the host daemon, and exec the agent (PID 1 of the namespace). Its
	 * uid is not 0 in this namespace: execve leaves it no capability. */
	if (dup2(c->null_fd, 0) < 0 || dup2(c->out_fd, 1) < 0 || dup2(c->log_fd, 2) < 0)
		c_fail(c, STAGE_EXEC, errno, "stdio");
	if (syscall(SYS_close_range, 3U, ~0U, CLOSE_RANGE_CLOEXEC) < 0)
		c_fail(c, STAGE_EXEC, errno, "close_range");
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0 ||
	    prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) < 0 ||
	    prctl(PR_SET_PDEATHSIG, SIGKILL, 0, 0, 0) < 0)
		c_fail(c, STAGE_EXEC, errno, "prctl");
	syscall(SYS_execveat, c->agent_fd, "", c->argv, c->envp, AT_EMPTY_PATH);
	c_fail(c, STAGE_EXEC, errno, c->argv[0]);
}

/* ---- parent ---- */

static int add_mnt(struct lctx *c, enum mkind kind, const char *src, const char *inside)
{
	struct mnt *m;

	if (c->nm >= SB_MAX_MOUNTS)
		return -E2BIG;
	m = &c->m[c->nm++];
	m->kind = kind;
	m->fd = -1;
	if ((size_t)snprintf(m->src, sizeof(m->src), "%s", src ? src : "") >= sizeof(m->src) ||
	    (size_t)snprintf(m->dst, sizeof(m->dst), "%s%s", SB_NEWROOT, inside) >= sizeof(m->dst))
		return -ENAMETOOLONG;
	return 0;
}

/* /bin, /sbin, /lib*: the host's symlink (merged /usr) or a read-only bind. */
static int add_sysdir(struct lctx *c, const char *dir)
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
		return add_mnt(c, M_SYMLINK, target, dir);
	}
	return S_ISDIR(st.st_mode) ? add_mnt(c, M_BIND_RO, dir, dir) : 0;
}

/* The host's passwd/group without the entries of uid/gid 1000 (third
 * field), plus ours. Best effort: on any failure the host's file shows. */
static void etc_prepare(struct lctx *c, int i, const char *path, const char *ours)
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
	c->etc_text[i] = out;
	c->etc_len[i] = n + lo;
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

int sandbox_local_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	struct lctx *c = NULL;
	struct local *l = NULL;
	struct noise_keypair guest;
	char path[PATH_MAX + 64], hostpub[KEYS_B64_LEN], line[PATH_MAX + 64];
	int go[2] = {-1, -1}, ep[2] = {-1, -1}, op[2] = {-1, -1};
	void *stack = MAP_FAILED;
	pid_t pid = -1;
	int r, na = 0;
	bool nobody = sandbox_as_nobody();
	uid_t ouid = nobody ? SB_NOBODY : geteuid();
	gid_t ogid = nobody ? SB_NOBODY : getegid();

	if (cfg->workspace[0] != '/' || !strcmp(cfg->workspace, "/")) {
		snprintf(err, errlen, "workspace %s must be an absolute path below /", cfg->workspace);
		return -EINVAL;
	}
	if (!(c = mem_calloc(1, sizeof(*c))) || !(l = mem_calloc(1, sizeof(*l)))) {
		r = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	c->go_fd = c->err_fd = c->out_fd = c->log_fd = c->null_fd = c->agent_fd = -1;
	l->out_fd = -1;

	/* the mount table, in order (the workspace last: its mount point may
	 * be below /tmp or /home, made just before) */
	if ((r = add_mnt(c, M_BIND_RO, "/usr", "/usr")) < 0 || (r = add_mnt(c, M_BIND_RO, "/etc", "/etc")) < 0 ||
	    (r = add_sysdir(c, "/bin")) < 0 || (r = add_sysdir(c, "/sbin")) < 0 || (r = add_sysdir(c, "/lib")) < 0 ||
	    (r = add_sysdir(c, "/lib64")) < 0 || (r = add_sysdir(c, "/lib32")) < 0 ||
	    (access("/opt", F_OK) == 0 && (r = add_mnt(c, M_BIND_RO, "/opt", "/opt")) < 0) ||
	    (r = add_mnt(c, M_TMPFS, "mode=0755,size=1m", "/dev")) < 0)
		goto fail_table;
	static const char *const devs[] = {"null", "zero", "full", "random", "urandom", "tty"};
	for (size_t i = 0; i < sizeof(devs) / sizeof(devs[0]); i++) {
		char src[32], in[32];
		snprintf(src, sizeof(src), "/dev/%s", devs[i]);
		snprintf(in, sizeof(in), "/dev/%s", devs[i]);
		if (access(src, F_OK) == 0 && (r = add_mnt(c, M_BIND_DEV, src, in)) < 0)
			goto fail_table;
	}
	if ((r = add_mnt(c, M_DEVPTS, NULL, "/dev/pts")) < 0 ||
	    (r = add_mnt(c, M_SYMLINK, "pts/ptmx", "/dev/ptmx")) < 0 ||
	    (r = add_mnt(c, M_TMPFS, "mode=1777,size=64m", "/dev/shm")) < 0 ||
	    (r = add_mnt(c, M_SYMLINK, "/proc/self/fd", "/dev/fd")) < 0 ||
	    (r = add_mnt(c, M_SYMLINK, "/proc/self/fd/0", "/dev/stdin")) < 0 ||
	    (r = add_mnt(c, M_SYMLINK, "/proc/self/fd/1", "/dev/stdout")) < 0 ||
	    (r = add_mnt(c, M_SYMLINK, "/proc/self/fd/2", "/dev/stderr")) < 0 ||
	    (r = add_mnt(c, M_PROC, NULL, "/proc")) < 0 || (r = add_mnt(c, M_TMPFS, "mode=1777", "/tmp")) < 0)
		goto fail_table;
	snprintf(path, sizeof(path), "%s/home", sb->dir);
	if ((r = add_mnt(c, M_BIND_RW, path, SB_HOME)) < 0 ||
	    (r = add_mnt(c, M_TMPFS, "mode=0700,size=64k", SB_KEYS)) < 0)
		goto fail_table;
	snprintf(path, sizeof(path), "%s/agent", sb->dir);
	if ((r = add_mnt(c, M_BIND_RW, path, SB_STATE)) < 0)
		goto fail_table;
	snprintf(path, sizeof(path), "%s/run", sb->dir);
	if ((r = add_mnt(c, M_BIND_RW, path, SB_RUN)) < 0)
		goto fail_table;
	snprintf(path, sizeof(path), "%s/workspace", sb->dir);
	if ((r = add_mnt(c, M_WORKSPACE, path, cfg->workspace)) < 0)
		goto fail_table;

	/* the guest key, as its file's text; the host's public key */
	if ((r = keys_load(sb->guest_key_file, &guest, err, errlen)) < 0)
		goto fail;
	sodium_bin2base64(c->key_text, KEYS_B64_LEN, guest.priv, sizeof(guest.priv), sodium_base64_VARIANT_ORIGINAL);
	strcat(c->key_text, "\n");
	sodium_memzero(&guest, sizeof(guest));
	snprintf(c->key_path, sizeof(c->key_path), "%s/guest.key", SB_KEYS);
	keys_pub_format(sb->host.pub, hostpub);

	/* the agent's command line */
#define ARG(...) (snprintf(c->argbuf[na], sizeof(c->argbuf[na]), __VA_ARGS__), c->argv[na] = c->argbuf[na], na++)
	ARG("airlock-agent");
	ARG("--listen");
	ARG("unix:%s/agent.sock", SB_RUN);
	ARG("--root");
	ARG("%s", cfg->workspace);
	ARG("--key");
	ARG("%s", c->key_path);
	ARG("--allow");
	ARG("%s", hostpub);
	ARG("--state");
	ARG("%s", SB_STATE);
	ARG("--home");
	ARG("%s", SB_HOME);
	ARG("--confine");
	if (cfg->verbose)
		ARG("-v");
#undef ARG
	c->argv[na] = NULL;
	c->envp[0] = "PATH=/usr/local/bin:/usr/bin:/bin";
	c->envp[1] = "HOME=" SB_HOME;
	c->envp[2] = "LANG=C.UTF-8";
	c->envp[3] = NULL;
	etc_prepare(c, 0, "/etc/passwd", "airlock:x:1000:1000:airlock sandbox:" SB_HOME ":/bin/sh\n");
	etc_prepare(c, 1, "/etc/group", "airlock:x:1000:\n");

	/* fds: the agent binary, its log, stdin, the pipes */
	if ((c->agent_fd = open(sb->agent_path, O_PATH | O_CLOEXEC)) < 0) {
		r = -errno;
		snprintf(err, errlen, "agent %s: %s", sb->agent_path, strerror(errno));
		goto fail;
	}
	snprintf(path, sizeof(path), "%s/agent.log", sb->dir);
	if ((c->log_fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) < 0 ||
	    (c->null_fd = open("/dev/null", O_RDWR | O_CLOEXEC)) < 0 || pipe2(go, O_CLOEXEC) < 0 ||
	    pipe2(ep, O_CLOEXEC) < 0 || pipe2(op, O_CLOEXEC) < 0) {
		r = -errno;
		snprintf(err, errlen, "%s: %s", c->log_fd < 0 ? path : "pipes", strerror(errno));
		goto fail;
	}
	c->go_fd = go[0];
	c->err_fd = ep[1];
	c->out_fd = op[1];
	/* a socket left by an agent that was killed would make bind fail */
	snprintf(path, sizeof(path), "%s/run/agent.sock", sb->dir);
	if (strlen(path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
		r = -ENAMETOOLONG;
		snprintf(err, errlen,
			 "the sandbox's socket path %s is longer than a Unix socket path may be (%zu bytes): set "
			 "XDG_DATA_HOME to a shorter directory",
			 path, sizeof(((struct sockaddr_un *)0)->sun_path) - 1);
		goto fail;
	}
	(void)unlink(path);
	if ((size_t)snprintf(sb->addr, sizeof(sb->addr), "unix:%s", path) >= sizeof(sb->addr)) {
		r = -ENAMETOOLONG;
		snprintf(err, errlen, "state directory %s: path too long for a socket", sb->dir);
		goto fail;
	}

	if ((stack = mmap(NULL, SB_STACK, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_STACK, -1, 0)) ==
	    MAP_FAILED) {
		r = -errno;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	pid =
	    clone(child_main, (char *)stack + SB_STACK,
		  CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWIPC | CLONE_NEWUTS | CLONE_NEWNET | SIGCHLD, c);
	if (pid < 0) {
		int e = errno; /* userns_hint reads files */
		const char *hint = userns_hint(e);
		r = -e;
		snprintf(err, errlen, "cannot create the sandbox's namespaces: %s%s%s", strerror(e), hint ? ": " : "",
			 hint ? hint : "");
		goto fail;
	}
	/* the child has its own copy of everything below */
	sodium_memzero(c->key_text, sizeof(c->key_text));
	close(go[0]);
	go[0] = -1;
	close(ep[1]);
	ep[1] = -1;
	close(op[1]);
	op[1] = -1;

	/* id maps: one uid, 1000 inside */
	snprintf(line, sizeof(line), "%u %u 1\n", SB_UID, (unsigned)ouid);
	if ((r = write_file(pid, "setgroups", "deny")) < 0 || (r = write_file(pid, "uid_map", line)) < 0 ||
	    (snprintf(line, sizeof(line), "%u %u 1\n", SB_UID, (unsigned)ogid),
	     (r = write_file(pid, "gid_map", line)) < 0)) {
		const char *hint = userns_hint(-r);
		snprintf(err, errlen, "cannot map uid/gid %u into the sandbox: %s%s%s", SB_UID, strerror(-r),
			 hint ? ": " : "", hint ? hint : "");
		goto fail_child;
	}
	if (write(go[1], "g", 1) != 1) {
		r = -errno;
		snprintf(err, errlen, "starting the sandbox: %s", strerror(errno));
		goto fail_child;
	}

	/* wait for the child's failure or the agent's "ready" line */
	{
		double deadline = mono_ms() + SANDBOX_START_MS;
		char out[512];
		size_t got = 0;
		bool err_open = true;
		for (;;) {
			struct pollfd pf[2] = {{.fd = err_open ? ep[0] : -1, .events = POLLIN},
					       {.fd = op[0], .events = POLLIN}};
			double left = deadline - mono_ms();
			if (left <= 0) {
				r = -ETIMEDOUT;
				snprintf(err, errlen,
					 "the sandbox's agent did not get ready within %u ms (log: %s/agent.log)",
					 SANDBOX_START_MS, sb->dir);
				goto fail_child;
			}
			if (poll(pf, 2, (int)left + 1) < 0) {
				if (errno == EINTR)
					continue;
				r = -errno;
				snprintf(err, errlen, "waiting for the sandbox: %s", strerror(errno));
				goto fail_child;
			}
			if (err_open && (pf[0].revents & (POLLIN | POLLHUP))) {
				struct lerr e;
				ssize_t n = read(ep[0], &e, sizeof(e));
				if (n == (ssize_t)sizeof(e)) {
					const char *hint =
					    e.err == EPERM || e.err == EACCES ? userns_hint(e.err) : NULL;
					r = -e.err;
					snprintf(err, errlen, "sandbox setup failed %s%s%s: %s%s%s",
						 e.stage > 0 && e.stage <= STAGE_EXEC ? stage_names[e.stage] : "?",
						 e.what[0] ? " " : "", e.what, strerror(e.err), hint ? ": " : "",
						 hint ? hint : "");
					goto fail_child;
				}
				err_open = false; /* EOF: the agent was exec'd */
			}
			if (pf[1].revents & (POLLIN | POLLHUP)) {
				ssize_t n = read(op[0], out + got, sizeof(out) - 1 - got);
				if (n <= 0) {
					char tail[512];
					log_tail(sb->dir, tail, sizeof(tail));
					r = -ECHILD;
					snprintf(err, errlen, "the sandbox's agent exited during start: %s",
						 tail[0] ? tail : "(no log)");
					goto fail_child;
				}
				got += (size_t)n;
				out[got] = '\0';
				if (strstr(out, "\n") && !strncmp(out, "ready ", 6))
					break;
				if (got == sizeof(out) - 1 || (strchr(out, '\n') && strncmp(out, "ready ", 6))) {
					r = -EPROTO;
					snprintf(err, errlen, "the sandbox's agent said '%.100s' instead of ready",
						 out);
					goto fail_child;
				}
			}
		}
	}
	sb->pid = pid;
	l->out_fd = op[0];
	op[0] = -1;
	sb->impl = l;
	l = NULL;
	{
		/* one kernel: the agent's Landlock is the one we can ask about */
		long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, 1U /* LANDLOCK_CREATE_RULESET_VERSION */);
		char ll[48];
		if (abi > 0)
			snprintf(ll, sizeof(ll), "landlock ABI %ld", abi);
		else
			snprintf(ll, sizeof(ll), "no landlock");
		snprintf(sb->describe, sizeof(sb->describe),
			 "local: user+mount+pid+ipc+uts+net namespaces (uid %u inside = %s outside), private root, %s, "
			 "seccomp; a shared kernel (weaker than a VM)",
			 SB_UID, nobody ? "nobody" : "you", ll);
	}
	r = 0;
	goto out;

fail_table:
	snprintf(err, errlen, "sandbox mount table: %s", strerror(-r));
	goto fail;
fail_child:
	kill_wait(pid);
fail:
	mem_free(l);
out:
	if (stack != MAP_FAILED)
		munmap(stack, SB_STACK);
	if (c) {
		int fds[] = {c->agent_fd, c->log_fd, c->null_fd};
		for (size_t i = 0; i < sizeof(fds) / sizeof(fds[0]); i++)
			if (fds[i] >= 0)
				close(fds[i]);
		sodium_memzero(c->key_text, sizeof(c->key_text));
		mem_free(c->etc_text[0]);
		mem_free(c->etc_text[1]);
		mem_free(c);
	}
	int pfds[] = {go[0], go[1], ep[0], ep[1], op[0], op[1]};
	for (size_t i = 0; i < sizeof(pfds) / sizeof(pfds[0]); i++)
		if (pfds[i] >= 0)
			close(pfds[i]);
	return r;
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
		mem_free(l);
		sb->impl = NULL;
	}
}
