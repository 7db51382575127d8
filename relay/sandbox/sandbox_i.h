/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SANDBOX_I_H
#define AIRLOCK_SANDBOX_I_H

/*
 * Internals shared by relay/sandbox/sandbox.c (common: state directory, keys,
 * dispatch, destroy) and its two backends, relay/sandbox/sandbox_local.c and
 * relay/sandbox/sandbox_vm.c. Nothing outside these three files includes this.
 */

#include <limits.h>

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
	char describe[256];
	uint32_t host_uid; /* local, as root: the sandbox's own uid outside (= gid); 0: the invoking user's */
	pid_t pid;	   /* what the host waits for; 0 when none */
	void *impl;	   /* backend state */
	/* sandbox.c's own */
	double start_ms;
	struct sandbox_common *common; /* the state dir lock */
};

/* The local sandbox's own host uids (doc/SANDBOX.md, "State directory"):
 * as root each sandbox gets one of these, gid = uid, kept in <dir>/uid. */
#define SANDBOX_UID_FIRST 0x60000000u /* 1610612736 */
#define SANDBOX_UID_COUNT 65536u

/* Whether the local sandbox gets a host uid of its own: we are root and
 * the range is mapped in our user namespace (a root inside a user
 * namespace that maps only itself runs the sandbox as itself). */
bool sandbox_own_uid(void);

/* Backends: fill sb->addr, sb->describe, sb->pid, sb->impl; the common
 * code has created sb->dir, the keys and sb->agent_path, and measures
 * start_ms around the call. */
int sandbox_local_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen);
void sandbox_local_stop(struct sandbox *sb);
int sandbox_vm_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen);
void sandbox_vm_stop(struct sandbox *sb);

#endif
