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
	pid_t pid;  /* what the host waits for; 0 when none */
	void *impl; /* backend state */
	/* sandbox.c's own */
	double start_ms;
	struct sandbox_common *common; /* the state dir lock */
};

/* Whether the sandbox's user is nobody (65534) outside: we are root and
 * 65534 exists in our user namespace (a root inside a user namespace that
 * maps only itself runs the sandbox as itself). */
bool sandbox_as_nobody(void);

/* Backends: fill sb->addr, sb->describe, sb->pid, sb->impl; the common
 * code has created sb->dir, the keys and sb->agent_path, and measures
 * start_ms around the call. */
int sandbox_local_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen);
void sandbox_local_stop(struct sandbox *sb);
int sandbox_vm_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen);
void sandbox_vm_stop(struct sandbox *sb);

#endif
