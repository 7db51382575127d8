/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SANDBOX_I_H
#define AIRLOCK_SANDBOX_I_H

/*
 * Internals shared by relay/sandbox/sandbox.c (common: state directory, keys,
 * dispatch, destroy) and its two backends, relay/sandbox/sandbox_local.c and
 * relay/sandbox/sandbox_vm.c. Nothing outside these three files includes this.
 */

#include <limits.h>
#include <sys/resource.h>

#include "airlock/exec/exec.h"
#include "airlock/sandbox/sandbox.h"

struct sandbox_common;

/* Field names are also used by tests/harness/vm_harness.c, which fills one
 * by hand to start the vm backend alone. */
struct sandbox {
	enum sandbox_kind kind;
	char dir[PATH_MAX]; /* …/sandboxes/<id>, mode 0700 */
	char agent_path[PATH_MAX];
	/* the keys (doc/SANDBOX.md, "State directory"), pinned both ways */
	struct noise_keypair host; /* keys/host.key */
	uint8_t guest_pub[32];	   /* public half of keys/guest.key */
	char guest_key_file[PATH_MAX];
	/* filled by the backend */
	char addr[PATH_MAX + 16]; /* transport address the host connects to */
	char describe[512];	  /* < 256 in practice: relay/cli keeps a copy of 256 */
	uint32_t host_uid;	  /* local, as root: the sandbox's own uid outside (= gid); 0: the invoking user's */
	pid_t pid;		  /* what the host waits for; 0 when none */
	void *impl;		  /* backend state */
	const char *boot;	  /* how it started: "cold", "restored" (a vm snapshot); static string */
	/* sandbox.c's own */
	double start_ms;
	struct sandbox_common *common; /* the state dir lock */
	char run_dir[PATH_MAX];	       /* where agent.sock is: <dir>/run, a fork's <parent>/run.<slot> */
};

/* The local sandbox's own host uids (doc/SANDBOX.md, "State directory"):
 * as root each sandbox gets one of these, gid = uid, kept in <dir>/uid.
 * The first range is used when our user namespace maps it, else the
 * second (a container that maps 65536 ids), else nobody (65534). */
struct sandbox_uid_range {
	uint32_t first, count;
};
#define SANDBOX_UID_FIRST	0x60000000u /* 1610612736 */
#define SANDBOX_UID_COUNT	65536u
#define SANDBOX_UID_SMALL_FIRST 40000u
#define SANDBOX_UID_SMALL_COUNT 20000u
#define SANDBOX_NOBODY		65534u

/* Where the local sandbox's host uid comes from: NULL when it runs as the
 * invoking user (we are not root, or root of a user namespace that maps
 * none of the ranges nor nobody); the range {65534, 1} when only nobody is
 * mapped. */
const struct sandbox_uid_range *sandbox_uid_range(void);
/* <dir>/uid: the sandbox's own host uid, kept there as root. 0 or -errno. */
int sandbox_uid_file_read(const char *dir, uint32_t *out);

/* ---- limits of the local sandbox (sandbox_limits.c; doc/SANDBOX.md, "Limits") ---- */

struct policy_sandbox_limits;

struct sandbox_limits {
	uint64_t pids;		 /* processes and threads */
	uint64_t memory;	 /* bytes */
	uint64_t tmp;		 /* bytes of /tmp */
	uint64_t file;		 /* bytes of the largest file (RLIMIT_FSIZE) */
	bool memory_given;	 /* sandbox.limits.memory was set (else the default) */
	bool pids_cg, memory_cg; /* enforced by the cgroup (else rlimits only) */
	struct exec_sys *sys;	 /* the cgroup's parent; NULL when none */
	struct exec_cgroup *cg;	 /* the sandbox's cgroup; NULL when none */
};

/* The rlimits the sandbox's PID 1 starts with (set by its child side). */
struct sandbox_rlimits {
	struct rlimit nproc, data, core;
	bool nproc_set, data_set;
};

/* in (NULL: none) with the defaults filled in; no cgroup yet. */
void sandbox_limits_resolve(const struct policy_sandbox_limits *in, struct sandbox_limits *out);
/* A cgroup with lim's pids and memory limits where one can be had
 * (airlock-sandbox.<pid>, or airlock-sandbox.<pid>.<fork> for a fork: each
 * sandbox's own, as releasing it kills what is below): under
 * our own cgroup, else (root) at the top of the hierarchy; sets
 * lim->sys/cg and what they enforce. Nothing when none can be had. */
void sandbox_limits_cgroup(struct sandbox_limits *lim, const char *fork);
/* Move pid into the cgroup (before it forks anything). 0 or -errno. */
int sandbox_limits_attach(const struct sandbox_limits *lim, pid_t pid);
/* own_uid: the sandbox has a host uid of its own (root). */
void sandbox_limits_rlimits(const struct sandbox_limits *lim, bool own_uid, struct sandbox_rlimits *r);
/* "limits: 4096 processes (cgroup), memory 12 GiB (cgroup), ..." */
void sandbox_limits_describe(const struct sandbox_limits *lim, char *out, size_t n);
/* Kill what is left in the cgroup and remove it. */
void sandbox_limits_release(struct sandbox_limits *lim);

/* ---- the layer stack under a local sandbox (sandbox_fork.c) ---- */

#include "airlock/sandbox/sandbox_fork.h"

/* What the sandbox mounts for one part ("workspace", "home") of its
 * state: the directory itself (overlay false: upper, read-write), or an
 * overlay of upper (with work) over lower[0..nlower) (top first). */
struct sandbox_stack {
	bool overlay;
	unsigned nlower;
	char lower[SANDBOX_FORK_LAYERS_MAX + 1][PATH_MAX];
	char upper[PATH_MAX], work[PATH_MAX];
};
/* part's stack of the sandbox in dir (the parent's state directory), or
 * of its fork named fork (NULL: the parent). -ENOENT when the fork or a
 * layer it needs is missing. */
int sandbox_stack_of(const char *dir, const char *fork, const char *part, struct sandbox_stack *st);
/* st's overlay work directory emptied (made again, owned by uid; 0: the
 * caller's), before a mount: a volatile overlay leaves work/incompat/volatile
 * there, and the next mount with it refuses. Nothing may have it mounted. */
int sandbox_stack_work_reset(const struct sandbox_stack *st, uint32_t uid);
/* The run directory of fork (its agent.sock): <dir>/run.<slot>, short, so
 * the socket's path is hardly longer than the parent's (107 bytes at most). */
int sandbox_fork_run_dir(const char *dir, const char *fork, char *out, size_t n);

/* ---- qmp.c: the QEMU Machine Protocol, for the vm sandbox's snapshots ---- */

struct json_t;
struct qmp {
	int fd;
	size_t len;
	char buf[16384];
};

/* Connect to qemu's QMP socket at path (retrying while qemu has not made
 * it yet), read the greeting, negotiate. 0, or -errno with err set. */
int qmp_open(struct qmp *q, const char *path, unsigned timeout_ms, char *err, size_t errlen);
/* Run cmd with args (borrowed; NULL: none); *ret (NULL: not wanted) gets
 * its "return" value, the caller's to json_decref. qemu's error is -EIO
 * with its description in err. */
int qmp_call(struct qmp *q, const char *cmd, struct json_t *args, struct json_t **ret, unsigned timeout_ms, char *err,
	     size_t errlen);
void qmp_close(struct qmp *q);

/* Backends: fill sb->addr, sb->describe, sb->pid, sb->impl; the common
 * code has created sb->dir, the keys and sb->agent_path, and measures
 * start_ms around the call. */
int sandbox_local_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen);
void sandbox_local_stop(struct sandbox *sb);
int sandbox_local_halt(struct sandbox *sb);
int sandbox_vm_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen);
/* The vm backend's fork hook (doc/VM.md, "Forks"): while the parent VM of
 * state directory parent runs (restored from a snapshot: it has a
 * monitor), stop it, move its workspace disk onto a new qcow2 overlay,
 * make fork_dir/ws.qcow2 over the frozen image and fork_dir/mem from its
 * memory (with shared memory: mem its device state, the memory copied to
 * the fork's file on tmpfs), and let it continue. fork_dir exists (0700). sandbox_vm_start
 * with cfg->fork then restores the fork from these, with its own keys.
 * 0 or -errno with err set. */
int sandbox_vm_fork_freeze(const char *parent, const char *fork_dir, char *err, size_t errlen);
/* The vm kind's columns of the backend table (sandbox.h "Forks"): freeze
 * only checks that the parent in dir runs with a monitor (*gen: 0, the
 * freeze is per fork); make is sandbox_fork_make (the fork's directory,
 * slot, TTL) and then sandbox_vm_fork_freeze into it, undone on failure.
 * Their removal is sandbox_vm_fork_remove: sandbox_fork_remove (the overlay
 * and the device state are in the fork's directory), and the fork's memory
 * file on tmpfs when it never started (a started fork's is unlinked as its
 * qemu opens it). */
int sandbox_vm_forks_freeze(const char *dir, unsigned *gen, char *err, size_t errlen);
int sandbox_vm_forks_make(const char *dir, const char *name, unsigned gen, int64_t ttl_s, char *err, size_t errlen);
int sandbox_vm_fork_remove(const char *dir, const char *name, char *err, size_t errlen);
void sandbox_vm_stop(struct sandbox *sb);

#endif
