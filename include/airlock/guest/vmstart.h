/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_VMSTART_H
#define AIRLOCK_VMSTART_H

/*
 * vmstart: the vm template's start line (doc/VM.md, "Snapshots"). The init
 * of the base template stops at its snapshot point, before it reads anything
 * of a sandbox (keys, workspace disk), and runs
 *
 *   airlock-agent --await-start PORT DISK...
 *
 * on the control port (virtio-serial "airlock.ctl"). The host writes one
 * line there once the VM runs, after a cold boot or after restoring the
 * template's snapshot:
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
 * to /run/airlock-start (0644) for commands to read; and prints "KIND GEN"
 * on stdout for the init. Nothing of the agent runs before this: it is
 * started after, with fresh ephemeral keys for every handshake.
 */

#include <stddef.h>
#include <stdint.h>

#define VMSTART_LINE_MAX 256
#define VMSTART_SEED_LEN 32

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

/* airlock-agent --await-start PORT DISK...: read the start line from PORT
 * (waiting while the host is not connected, up to 120 s), apply it, drop
 * what the kernel cached of each DISK (BLKFLSBUF: before a snapshot other
 * images were attached), print "KIND GEN". Exit status 0, or 1 with the
 * reason on stderr. */
int vmstart_main(const char *port, const char *const *disks, int ndisks);

#endif
