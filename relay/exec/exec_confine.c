/* SPDX-License-Identifier: Apache-2.0 */
/*
 * exec_confine: Landlock and seccomp for commands (exec.h, doc/SANDBOX.md).
 *
 * Built once in the agent (a Landlock ruleset fd and a BPF program in
 * memory), applied in each command's child right before execve with
 * nothing but syscalls: the child may not allocate.
 *
 * Landlock is an allow-list that can only add, so "read everything but
 * the agent's own directories" is spelled as: READ_DIR on / (names are not
 * secret), READ_FILE|EXECUTE on every entry of / that is not hidden,
 * recursing into the entries that contain a hidden path; all rights on
 * the writable paths. Hidden paths must therefore not lie beneath a
 * writable one, which the sandbox's layout guarantees (/airlock/...).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/landlock.h>
#include <linux/netlink.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/mem.h"
#include "airlock/exec/exec.h"

#ifndef LANDLOCK_ACCESS_FS_REFER
#define LANDLOCK_ACCESS_FS_REFER (1ULL << 13)
#endif
#ifndef LANDLOCK_ACCESS_FS_TRUNCATE
#define LANDLOCK_ACCESS_FS_TRUNCATE (1ULL << 14)
#endif
#define LL_SCOPE_ABSTRACT_UNIX_SOCKET (1ULL << 0)
#define LL_SCOPE_SIGNAL		      (1ULL << 1)

#define LL_READ (LANDLOCK_ACCESS_FS_READ_FILE | LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_READ_DIR)
#define LL_FILE_RIGHTS                                                                                                 \
	(LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |                   \
	 LANDLOCK_ACCESS_FS_TRUNCATE)
#define CONFINE_DEPTH 8 /* how deep hidden paths may be */

/* The kernel's struct grows by ABI: v1-3 handled_access_fs, v4-5 +net,
 * v6 +scoped. We pass the size of what this ABI knows. */
struct ll_ruleset_attr {
	uint64_t handled_access_fs;
	uint64_t handled_access_net;
	uint64_t scoped;
};

struct ll_path_beneath {
	uint64_t allowed_access;
	int32_t parent_fd;
} __attribute__((packed));

struct exec_confine {
	int ruleset_fd; /* -1: no Landlock */
	int abi;
	uint64_t handled;
	struct sock_fprog prog;
	uint64_t file_max; /* RLIMIT_FSIZE of commands; 0: none */
	char describe[160];
};

/* ---- seccomp ---- */

#if defined(__x86_64__)
#define CONFINE_ARCH AUDIT_ARCH_X86_64
#elif defined(__aarch64__)
#define CONFINE_ARCH AUDIT_ARCH_AARCH64
#else
#error "exec_confine: add this architecture's AUDIT_ARCH"
#endif

#define NR_OFF	     offsetof(struct seccomp_data, nr)
#define ARCH_OFF     offsetof(struct seccomp_data, arch)
#define ARG0_LO	     offsetof(struct seccomp_data, args[0]) /* little endian: low half first */
#define ARG2_LO	     offsetof(struct seccomp_data, args[2])
#define ERRNO(nr, e) BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (nr), 0, 1), BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | (e))
#define DENY(nr)     ERRNO(nr, EPERM)
#define ALLOW	     BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)

static struct sock_filter confine_filter[] = {
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARCH_OFF),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, CONFINE_ARCH, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_KILL_PROCESS), /* another ABI: no way around the table */
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, NR_OFF),
#if defined(__x86_64__)
    BPF_JUMP(BPF_JMP | BPF_JGE | BPF_K, 0x40000000u, 0, 1), /* x32 numbers alias the table */
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
#endif
    DENY(SYS_ptrace),
    DENY(SYS_process_vm_readv),
    DENY(SYS_process_vm_writev),
    DENY(SYS_bpf),
    DENY(SYS_perf_event_open),
    DENY(SYS_keyctl),
    DENY(SYS_add_key),
    DENY(SYS_request_key),
    DENY(SYS_kexec_load),
    DENY(SYS_kexec_file_load),
    DENY(SYS_init_module),
    DENY(SYS_finit_module),
    DENY(SYS_delete_module),
    DENY(SYS_mount),
    DENY(SYS_umount2),
    DENY(SYS_pivot_root),
    DENY(SYS_open_tree),
    DENY(SYS_move_mount),
    DENY(SYS_fsopen),
    DENY(SYS_fsmount),
    DENY(SYS_fspick),
    DENY(SYS_mount_setattr),
    DENY(SYS_setns),
    /* clone3 passes its flags in memory BPF cannot read: ENOSYS makes
     * glibc and musl fall back to clone, which is checked below. io_uring
     * runs system calls from kernel workers this filter never sees (and
     * has been the kernel's richest source of exploits): ENOSYS, so
     * libuv, tokio and liburing users fall back to epoll and threads. */
    ERRNO(SYS_clone3, ENOSYS),
    ERRNO(SYS_io_uring_setup, ENOSYS),
    ERRNO(SYS_io_uring_enter, ENOSYS),
    ERRNO(SYS_io_uring_register, ENOSYS),
    /* userfaultfd stalls the kernel on a page fault for as long as the
     * caller likes (the classic way to widen a kernel race): EPERM, what
     * vm.unprivileged_userfaultfd=0 answers, which callers expect. */
    DENY(SYS_userfaultfd),
    /* unshare(flags) and clone(flags, ...) take the flags first on
     * x86_64 and arm64: EPERM with CLONE_NEWUSER */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_unshare, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone, 0, 4),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG0_LO),
    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, CLONE_NEWUSER, 0, 1),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
    ALLOW,
    /* socket(family, type, protocol) and socketpair(family, ...): the
     * families commands need, nothing else. vsock ignores network
     * namespaces (it reaches the hypervisor and other VMs on a VM host),
     * AF_PACKET and the rest widen the kernel surface for nothing. The
     * family is an int: the kernel reads the low half only, so do we. */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socket, 1, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_socketpair, 0, 8),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG0_LO),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_UNIX, 6, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET, 5, 0),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_INET6, 4, 0),
    /* netlink: NETLINK_ROUTE only, read-only without CAP_NET_ADMIN in
     * the sandbox's own network namespace; getifaddrs() (node's
     * os.networkInterfaces, glibc's AI_ADDRCONFIG) needs it */
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AF_NETLINK, 0, 2),
    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, ARG2_LO),
    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, NETLINK_ROUTE, 1, 0),
    BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EAFNOSUPPORT),
    ALLOW,
};
#define CONFINE_DENIED 27 /* syscalls refused outright, besides CLONE_NEWUSER and socket families (for describe) */

/* ---- Landlock ---- */

static int ll_abi(void)
{
	long v = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
	return v < 0 ? 0 : (int)v;
}

/* Allow access (masked to what applies to the object) beneath path. */
static int ll_allow(struct exec_confine *c, const char *path, uint64_t access, bool must_exist)
{
	struct ll_path_beneath pb;
	struct stat st;
	int fd = open(path, O_PATH | O_CLOEXEC), r = 0;

	if (fd < 0)
		return must_exist ? -errno : 0;
	if (fstat(fd, &st) == 0 && !S_ISDIR(st.st_mode))
		access &= LL_FILE_RIGHTS;
	pb.allowed_access = access & c->handled;
	pb.parent_fd = fd;
	if (pb.allowed_access && syscall(SYS_landlock_add_rule, c->ruleset_fd, LANDLOCK_RULE_PATH_BENEATH, &pb, 0) < 0)
		r = -errno;
	close(fd);
	return r;
}

/* 1: p is hidden; 2: p is a proper ancestor of a hidden path; 0: neither. */
static int hidden_rel(const char *p, const char *const *hidden)
{
	size_t lp = strlen(p);

	for (; hidden && *hidden; hidden++) {
		const char *h = *hidden;
		if (!strcmp(h, p))
			return 1;
		if (!strncmp(h, p, lp) && (h[lp] == '/' || (lp == 1 && p[0] == '/')))
			return 2;
	}
	return 0;
}

/* READ on every entry of dir that is neither hidden nor holds a hidden
 * path; recurse into those that hold one. */
static int ll_read_except(struct exec_confine *c, const char *dir, const char *const *hidden, int depth)
{
	char path[4096];
	struct dirent *de;
	DIR *d;
	int r = 0;

	if (depth > CONFINE_DEPTH)
		return -ELOOP;
	if (!(d = opendir(dir)))
		return errno == ENOENT ? 0 : -errno;
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if ((size_t)snprintf(path, sizeof(path), "%s/%s", strcmp(dir, "/") ? dir : "", de->d_name) >=
		    sizeof(path))
			continue;
		int rel = hidden_rel(path, hidden);
		if (rel == 1)
			continue;
		r = rel == 2 ? ll_read_except(c, path, hidden, depth + 1) : ll_allow(c, path, LL_READ, false);
		if (r < 0)
			break;
	}
	closedir(d);
	return r;
}

int exec_confine_new(const struct exec_confine_cfg *cfg, struct exec_confine **out, char *err, size_t errlen)
{
	struct exec_confine *c;
	struct ll_ruleset_attr attr = {0};
	size_t attr_size = sizeof(attr.handled_access_fs);
	int r = 0;

	*out = NULL;
	if (!(c = mem_calloc(1, sizeof(*c))))
		return -ENOMEM;
	c->ruleset_fd = -1;
	c->file_max = cfg->file_max;
	c->prog.filter = confine_filter;
	c->prog.len = (unsigned short)(sizeof(confine_filter) / sizeof(confine_filter[0]));
	c->abi = ll_abi();
	if (c->abi >= 1) {
		c->handled = LANDLOCK_ACCESS_FS_EXECUTE | LANDLOCK_ACCESS_FS_WRITE_FILE | LANDLOCK_ACCESS_FS_READ_FILE |
			     LANDLOCK_ACCESS_FS_READ_DIR | LANDLOCK_ACCESS_FS_REMOVE_DIR |
			     LANDLOCK_ACCESS_FS_REMOVE_FILE | LANDLOCK_ACCESS_FS_MAKE_CHAR |
			     LANDLOCK_ACCESS_FS_MAKE_DIR | LANDLOCK_ACCESS_FS_MAKE_REG | LANDLOCK_ACCESS_FS_MAKE_SOCK |
			     LANDLOCK_ACCESS_FS_MAKE_FIFO | LANDLOCK_ACCESS_FS_MAKE_BLOCK | LANDLOCK_ACCESS_FS_MAKE_SYM;
		if (c->abi >= 2)
			c->handled |= LANDLOCK_ACCESS_FS_REFER;
		if (c->abi >= 3)
			c->handled |= LANDLOCK_ACCESS_FS_TRUNCATE;
		/* IOCTL_DEV (v5) is left unhandled: terminals need their ioctls.
		 * Network (v4) too: the sandbox has no network but loopback,
		 * where the agent's egress listener is. */
		attr.handled_access_fs = c->handled;
		if (c->abi >= 6) {
			/* commands cannot signal the agent, nor reach abstract
			 * sockets made outside their domain */
			attr.scoped = LL_SCOPE_SIGNAL | LL_SCOPE_ABSTRACT_UNIX_SOCKET;
			attr_size = sizeof(attr);
		}
		long fd = syscall(SYS_landlock_create_ruleset, &attr, attr_size, 0);
		if (fd < 0) {
			r = -errno;
			errmsg_set(err, errlen, "landlock: creating the ruleset: %s", strerror(errno));
			goto fail;
		}
		c->ruleset_fd = (int)fd;
		/* listing names anywhere; reading contents except hidden */
		if ((r = ll_allow(c, "/", LANDLOCK_ACCESS_FS_READ_DIR, true)) < 0 ||
		    (r = ll_read_except(c, "/", cfg->hidden, 0)) < 0) {
			errmsg_set(err, errlen, "landlock: read rules: %s", strerror(-r));
			goto fail;
		}
		for (const char *const *w = cfg->writable; w && *w; w++) {
			/* device entries are optional (a host without /dev/tty) */
			if ((r = ll_allow(c, *w, c->handled, strncmp(*w, "/dev/", 5) != 0)) < 0) {
				errmsg_set(err, errlen, "landlock: writable path %s: %s", *w, strerror(-r));
				goto fail;
			}
		}
		snprintf(c->describe, sizeof(c->describe),
			 "landlock ABI %d (fs%s), seccomp (%d syscalls, new user namespaces and socket families but "
			 "unix/inet/inet6/netlink-route denied)",
			 c->abi, c->abi >= 6 ? ", signal and abstract-socket scope" : "", CONFINE_DENIED);
	} else if (cfg->require_landlock) {
		r = -ENOTSUP;
		errmsg_set(err, errlen,
			   "landlock is not available in this kernel (needs Linux >= 5.13 with lsm=landlock enabled)");
		goto fail;
	} else {
		snprintf(c->describe, sizeof(c->describe),
			 "no landlock (kernel lacks it), seccomp (%d syscalls, new user namespaces and socket families "
			 "but unix/inet/inet6/netlink-route denied)",
			 CONFINE_DENIED);
	}
	*out = c;
	return 0;
fail:
	exec_confine_free(c);
	return r;
}

void exec_confine_free(struct exec_confine *c)
{
	if (!c)
		return;
	if (c->ruleset_fd >= 0)
		close(c->ruleset_fd);
	mem_free(c);
}

const char *exec_confine_describe(const struct exec_confine *c)
{
	return c ? c->describe : "none";
}

int exec_confine_apply(const struct exec_confine *c)
{
	struct rlimit fsize = {.rlim_cur = (rlim_t)c->file_max, .rlim_max = (rlim_t)c->file_max};

	if (c->file_max && setrlimit(RLIMIT_FSIZE, &fsize) < 0)
		return -errno;
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) < 0)
		return -errno;
	if (c->ruleset_fd >= 0 && syscall(SYS_landlock_restrict_self, c->ruleset_fd, 0) < 0)
		return -errno;
	if (prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &c->prog, 0, 0) < 0)
		return -errno;
	return 0;
}
