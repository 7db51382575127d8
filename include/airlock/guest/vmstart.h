/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_VMSTART_H
#define AIRLOCK_VMSTART_H

/*
 * vmstart: the vm template's start line (doc/VM.md, "Snapshots"). The init
 * of the base template finds its disks and ports and starts
 *
 *   airlock-agent --vm-init CTL CFG WS PORT
 *
 * which says "airlock-init: snapshot point" on the console and waits on the
 * control port CTL (virtio-serial "airlock.ctl"), before it reads anything
 * of a sandbox (keys, workspace disk): the host may save the VM there. The
 * host writes one line on CTL once the VM runs, after a cold boot or after
 * restoring the template's snapshot:
 *
 *   start KIND GEN UNIX_NS SEED
 *
 *   KIND     cold | restored | fork: how this VM came to be
 *   GEN      the host's start counter for this sandbox (decimal)
 *   UNIX_NS  the host's CLOCK_REALTIME when it wrote the line (decimal ns)
 *   SEED     64 hex digits: 32 fresh random bytes from the host
 *
 * The guest then sets its clock (clock_settime), adds the seed to the
 * kernel's pool with RNDADDENTROPY and forces a reseed of the kernel's
 * generator (RNDRESEEDCRNG), so two restores of one snapshot never share
 * random state (libsodium reads getrandom, i.e. that pool); writes "KIND GEN"
 * to /run/airlock-start (0644) for commands to read. Then, in the same
 * process and with no program run (under software emulation every fork and
 * exec costs tens of ms): it reads the config drive CFG (a ustar image the
 * host writes: guest.key, allow, agent.conf) into /run/airlock (0700),
 * mounts the workspace disk WS (ext4) on /persist, bind-mounts
 * /persist/workspace on /workspace and /persist/home on /home/airlock, forks
 * the control port's reader ("poweroff" -> SIGUSR1 to the init; a start
 * line of kind fork, in a VM restored from a running parent's memory, sets
 * the clock, reseeds, reads the fork's config drive and kills the parent's
 * agent, which the init restarts with the fork's key: doc/VM.md "Forks") and becomes
 * the agent listening on serial:PORT. libsodium is initialised only then:
 * nothing of the channel's crypto exists before the start line, and every
 * handshake makes fresh ephemeral keys.
 */

#include <stddef.h>
#include <stdint.h>

#define VMSTART_LINE_MAX 256
#define VMSTART_SEED_LEN 32
#define VMSTART_EXIT	 70 /* --vm-init failed: the init powers off */

struct vmstart {
	char kind[16]; /* "cold", "restored" or "fork" */
	uint64_t gen;
	int64_t unix_ns;
	uint8_t seed[VMSTART_SEED_LEN];
};

/* Parse one start line (without its newline). 0, or -EINVAL for anything
 * that is not exactly the format above (unknown kind, a number out of
 * range, a seed of the wrong length or not hex, trailing bytes). */
int vmstart_parse(const char *line, size_t len, struct vmstart *out);

/* One regular file of a ustar image, pointing into the image. */
struct vmstart_file {
	char name[101];
	const uint8_t *data;
	size_t len;
};
#define VMSTART_FILES_MAX 8

/* The regular files of the ustar image buf (up to the end-of-archive
 * block or len): 0 and *n, or -EINVAL for a header whose checksum, name,
 * size or type is wrong, a member that runs past len, or more than max
 * members. */
int vmstart_tar_parse(const uint8_t *buf, size_t len, struct vmstart_file *out, size_t max, size_t *n);

/* airlock-agent --vm-init CTL CFG WS PORT (argv[0] is the program, argv[1]
 * "--vm-init"): wait for the start line on CTL (up to 120 s while the host
 * is not connected), apply it, drop what the kernel cached of CFG and WS
 * (BLKFLSBUF: before a snapshot other images were attached), set up the
 * sandbox as above. 0 and the agent's own argument vector in *argv_out
 * (static storage, NULL-terminated, its count in *argc_out); -1 after an
 * "airlock-init: FATAL: ..." line on stdout (the console). */
int vmstart_init(int argc, char **argv, int *argc_out, char ***argv_out);

#endif
