/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SANDBOX_H
#define AIRLOCK_SANDBOX_H

/*
 * sandbox: start the guest that `airlock up DIR` talks to when no --guest
 * is given, and say how to reach it (doc/SANDBOX.md).
 *
 * Two kinds behind one contract:
 *   SANDBOX_LOCAL  airlock-agent in new user, mount, pid, ipc, uts and
 *                  network namespaces with a private root (relay/sandbox/sandbox_local.c);
 *   SANDBOX_VM     a qemu microVM booted from the base template, the agent
 *                  as its init's child, the channel over virtio-serial
 *                  (relay/sandbox/sandbox_vm.c).
 *
 * State of one workspace's sandbox lives in
 *   $XDG_DATA_HOME/airlock/sandboxes/<workspace-id>/   (default ~/.local/share)
 * and is kept across stop/start (the workspace copy, the sandbox's home,
 * dependencies installed there); sandbox_destroy() removes it.
 * Keys are generated on first start (keys/host.key, keys/guest.key, 0600)
 * and pinned both ways: the agent accepts only the host key, the host
 * accepts only the guest key.
 *
 * Neither kind has a network route out. The only way out is the egress
 * proxy of the host daemon, reached over the channel (doc/EGRESS.md).
 *
 * Not thread-safe; call from the host daemon's loop thread. sandbox_start
 * blocks until the agent printed "ready" (or failed), bounded by
 * SANDBOX_START_MS (local) / SANDBOX_VM_START_MS (vm).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "airlock/core/noise.h"

#define SANDBOX_START_MS    10000u
#define SANDBOX_VM_START_MS 120000u
#define SANDBOX_STOP_MS	    5000u /* TERM, then KILL after this */

enum sandbox_kind {
	SANDBOX_LOCAL = 1,
	SANDBOX_VM = 2,
};

/* "local" / "vm" -> kind; -EINVAL otherwise. */
int sandbox_kind_parse(const char *s, enum sandbox_kind *out);
const char *sandbox_kind_name(enum sandbox_kind k);

struct policy_sandbox_limits; /* policy.h */

struct sandbox_cfg {
	enum sandbox_kind kind;
	const char *workspace;	  /* realpath of DIR (for the id and messages) */
	const char *agent_path;	  /* airlock-agent to run (local) or to put in the template (vm);
				   * NULL: the one next to /proc/self/exe */
	const char *template_dir; /* vm only: directory with the built template; NULL: default */
	bool verbose;		  /* agent -v; its log goes to <data>/agent.log either way */
	/* local only: the policy's sandbox.limits (borrowed for the call);
	 * NULL or 0 fields: the defaults (doc/SANDBOX.md, "Limits") */
	const struct policy_sandbox_limits *limits;
	/* local only: start the fork of this name (sandbox_fork.h) instead of
	 * the workspace's sandbox: state in <dir>/forks/<fork>, the workspace
	 * copy and home an overlay over the frozen layers, the parent's uid */
	const char *fork;
};

struct sandbox;

/* Create (first time) or reuse the state directory, generate keys if
 * missing, start the guest and wait until its agent listens. On failure
 * returns -errno and writes one line for the user into err (naming what
 * is missing, e.g. "unprivileged user namespaces are disabled
 * (kernel.unprivileged_userns_clone=0)"). */
int sandbox_start(const struct sandbox_cfg *cfg, struct sandbox **out, char *err, size_t errlen);

/* Transport address for transport_parse(), e.g. "unix:/…/run/agent.sock". */
const char *sandbox_address(const struct sandbox *sb);
/* The pinned keys: the host's static key pair and the guest's public key. */
const struct noise_keypair *sandbox_host_key(const struct sandbox *sb);
const uint8_t *sandbox_guest_pub(const struct sandbox *sb);
/* The state directory (…/sandboxes/<id>). */
const char *sandbox_dir(const struct sandbox *sb);
/* One line for logs and `airlock status`: kind and what isolates it,
 * e.g. "local: user+mount+pid+ipc+uts+net namespaces, landlock, seccomp". */
const char *sandbox_describe(const struct sandbox *sb);
/* Time from sandbox_start's call to the agent listening, in ms. */
double sandbox_start_ms(const struct sandbox *sb);
/* How the last start went: "cold" (a local sandbox, a VM booted), or
 * "restored" (a VM restored from its template's snapshot: doc/VM.md,
 * "Snapshots"). A static string. */
const char *sandbox_boot(const struct sandbox *sb);
/* pid of the process the host waits for (the namespace init / qemu). */
pid_t sandbox_pid(const struct sandbox *sb);
/* true while that process runs (reaps it when it exited). */
bool sandbox_alive(struct sandbox *sb);

/* Stop the guest (TERM, then KILL after SANDBOX_STOP_MS), keep its
 * state, free sb. NULL is a no-op. */
void sandbox_stop(struct sandbox *sb);

/* Stop the guest without waiting for its teardown (a fork's freeze,
 * doc/SANDBOX.md "Forks"): once this returns 0 nothing in the guest runs
 * or writes any more (local: its cgroup frozen, then every process in it
 * killed), and what the kernel still has to undo (the sandbox's mounts,
 * the inodes they cached) goes on without us. sb stays allocated:
 * sandbox_alive() is false once the guest is gone, sandbox_stop() frees it
 * (waiting, at most SANDBOX_STOP_MS, for what is left). -ENOTSUP when this
 * sandbox cannot be halted so (no cgroup v2 freezer, or a kind without
 * it): call sandbox_stop. */
int sandbox_halt(struct sandbox *sb);

/* Forks of a sandbox (doc/SANDBOX.md "Forks"), by kind; a fork then
 * starts with sandbox_start and cfg.fork. The local kind's are its layer
 * stack (sandbox_fork.h); a kind without forks: false, -ENOTSUP.
 *   freeze: the stopped (or halted) sandbox in dir (its state directory)
 *           frozen as the base of new forks; *gen names that base (vm:
 *           the running parent checked, nothing frozen yet);
 *   make:   one fork's state over gen (-EEXIST: that name exists; vm: the
 *           running parent frozen for this fork, its slot taken);
 *   remove: one fork's state (its sandbox stopped; -ENOENT: none). */
bool sandbox_kind_forks(enum sandbox_kind kind);
/* How kind's forks are made and read (0 for a kind without forks):
 *   SANDBOX_FORKS_LIVE   freeze and make need the parent running (vm: make
 *                        pauses it over its monitor, moves its disk onto a
 *                        new overlay, saves its memory for the fork, lets it
 *                        go on); without it the parent is stopped (or
 *                        halted) before the freeze (local);
 *   SANDBOX_FORKS_UPPER  a fork's changes are files in its overlay upper
 *                        (sandbox_fork_changes, the try op); a vm fork's are
 *                        blocks in its qcow2 disk, which the host cannot list:
 *                        its agent reports them (doc/VM.md "Forks"). */
#define SANDBOX_FORKS_LIVE  1u
#define SANDBOX_FORKS_UPPER 2u
unsigned sandbox_kind_fork_flags(enum sandbox_kind kind);
int sandbox_forks_freeze(enum sandbox_kind kind, const char *dir, unsigned *gen, char *err, size_t errlen);
int sandbox_forks_make(enum sandbox_kind kind, const char *dir, const char *name, unsigned gen, int64_t ttl_s,
		       char *err, size_t errlen);
int sandbox_forks_remove(enum sandbox_kind kind, const char *dir, const char *name, char *err, size_t errlen);

/* State directory of the sandbox for workspace (realpath), without
 * creating anything. */
int sandbox_dir_of(const char *workspace, char *out, size_t outlen);
/* Remove a stopped sandbox's state (the workspace copy, home, keys,
 * disk image). -EBUSY when its guest still runs; 0 when there was none. */
int sandbox_destroy(const char *workspace, char *err, size_t errlen);

#endif
