/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SCANSTATE_H
#define AIRLOCK_SCANSTATE_H

/*
 * scanstate: what the last full scan of a tree found, persisted so that the
 * next one can prove the tree unchanged with a stat walk instead of a scan
 * (doc/SYNC.md "Unchanged trees"). Both sides keep one: the host in its
 * state directory ($XDG_STATE_HOME/airlock/<id>/scan-state), the guest in
 * its --state directory.
 *
 * It holds the scan's manifest, the caller's own bytes (`extra`: the host
 * keeps its withheld/skipped records there) and, for every name of every
 * directory the scan read, in tree order, its lstat identity: st_dev,
 * st_ino, st_mode (type and permission bits), st_size, st_mtim and st_ctim
 * in nanoseconds. manifest_scan_opts.seen feeds it (scanstate_seen).
 *
 * scanstate_verify walks the tree again, in parallel over directories:
 * every saved name of every directory the scan read is lstat'ed again
 * (fstatat AT_SYMLINK_NOFOLLOW, relative to the directory's fd) and must
 * equal the saved identity; the names must be exactly the saved ones: the
 * root is listed again (getdents64), a directory below it is not (its own
 * identity matched first, and its mtime and ctime move with every name
 * added, removed or renamed in it). Any difference (a file edited, even one that
 * keeps its size and mtime: its ctime moved; a rename; a directory gone; a
 * file replaced by a hard link to another: another inode; a chmod; a
 * symlink retargeted: another inode) means "changed" and the caller scans
 * fully. A directory the scan did not read (its filter skipped it) is
 * compared by file type only: what is in it did not count.
 *
 * Racy identities (git's "racily clean" problem): scanstate_begin takes a
 * stamp from the scanned filesystem's own clock (the ctime of a fresh
 * unnamed O_TMPFILE in the tree; without one, the wall clock minus 2 s), as
 * hcache does. An identity whose mtime or ctime is not older than the stamp
 * is saved as racy and never matches: a file changed in the same timestamp
 * granule as the scan (coarse clocks) is scanned again next time.
 *
 * File format (CHANGE SCANSTATE_VERSION IF THIS CHANGES; doc/SYNC.md):
 *   "ALSS" u8 version u8 0 u16 0, 32 fingerprint (the caller's: what else
 *   the scan's result depended on), 16 root digest, u32 manifest entries, u64 stamp,
 *   u32 manifest length + manifest_encode bytes, u32 extra length + bytes,
 *   u32 count, count x (u16 path length, path, u8 0, u8 flags, u64 dev, u64 ino,
 *   u32 mode, u64 size, u64 mtime, u64 ctime) in strictly increasing tree
 *   order, each one's parent a read directory listed before it,
 *   32 BLAKE2b-256 keyed with the caller's key over everything before.
 * A missing, truncated, corrupt, forged (without the key), other-version or
 * other-fingerprint file is refused on load: the caller then scans fully.
 * Every count is checked against the bytes present before allocating.
 *
 * Errors are -errno. A loaded state may be verified from one thread at a
 * time (it starts its own workers); building is single-threaded.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "airlock/content/manifest.h"

#define SCANSTATE_FILE	    "scan-state"
#define SCANSTATE_FILE_MAX  (1024u << 20)
#define SCANSTATE_KEY_LEN   32u
#define SCANSTATE_FP_LEN    32u
#define SCANSTATE_EXTRA_MAX (64u << 20)

struct scanstate;

/* An empty state to build during a scan: scanstate_begin, then a scan
 * with opts.seen = scanstate_seen and opts.seen_ud = the state, then
 * scanstate_save. NULL-safe free. */
int scanstate_new(struct scanstate **out);
void scanstate_free(struct scanstate *st);

/* Take the racy stamp for a scan of the tree at dirfd; forgets what an
 * earlier scan fed (and stops a spill: scanstate_spill comes after). */
void scanstate_begin(struct scanstate *st, int dirfd);

/* Hold at most about SCANSTATE_SPILL_AT bytes of the names recorded: the
 * rest go to an unnamed temporary file (O_TMPFILE) in dirfd (the state's
 * directory) as the scan records them, and scanstate_save reads them back.
 * Without it a state holds all of them (67 bytes a name and its path)
 * until the save. 0 or -errno (the state then holds them all); a failed
 * write later distrusts the state (nothing saved: the next up scans). For
 * a state being built, after scanstate_begin. */
#define SCANSTATE_SPILL_AT (256u << 10)
int scanstate_spill(struct scanstate *st, int dirfd);

/* The stamp scanstate_begin took (ns on the filesystem's clock): an
 * identity with an mtime or ctime not older than it is racy. */
int64_t scanstate_stamp(const struct scanstate *st);

/* manifest_seen_fn: record one name (ud is the state). */
void scanstate_seen(const char *relpath, const struct stat *sb, enum manifest_seen kind, void *ud);

/* The scan's result cannot be trusted to repeat (an entry vanished or
 * changed while scanned, an unreadable directory, a decision that failed):
 * scanstate_save then writes nothing and removes an earlier file. */
void scanstate_distrust(struct scanstate *st);

/* Write the state (temporary file in dirfd, every write checked, renamed
 * over `name`; no fsync: a torn file fails its MAC and means one full
 * scan) with the scanned manifest m (sealed), the caller's fingerprint and
 * extra bytes, authenticated with key. A distrusted state removes `name`
 * instead and returns -ESTALE. 0 or -errno. */
int scanstate_save(struct scanstate *st, int dirfd, const char *name, const struct manifest *m,
		   const uint8_t key[SCANSTATE_KEY_LEN], const uint8_t fp[SCANSTATE_FP_LEN], const void *extra,
		   size_t extra_len);

/* Load `name` from dirfd. 0; -ENOENT when there is none; -EBADMSG when it
 * is malformed, another version or for another fingerprint; -ENOMEM. Its
 * MAC is checked on a thread of its own meanwhile (and, with
 * SCANSTATE_LOAD_DECODE, its manifest decoded there too): scanstate_check,
 * scanstate_verify and scanstate_manifest wait for it and refuse a forged
 * or corrupt file with -EBADMSG. */
#define SCANSTATE_LOAD_DECODE 1u
int scanstate_load(int dirfd, const char *name, const uint8_t key[SCANSTATE_KEY_LEN],
		   const uint8_t fp[SCANSTATE_FP_LEN], unsigned flags, struct scanstate **out);
/* 0 when the loaded file is authentic (its MAC), -EBADMSG, -ENOMEM. */
int scanstate_check(struct scanstate *st);

/* What scanstate_verify looked at. */
struct scanstate_verify_stats {
	uint64_t dirs, names;		   /* directories read, names compared */
	unsigned threads;		   /* walkers used */
	char first[MANIFEST_PATH_MAX + 1]; /* the first difference found ("" when none) */
};

/* Walk the tree at rootfd against a loaded state with `threads` walkers
 * (0: one per online CPU, at most 8). 1 when every name and identity is
 * the same, 0 when something differs (st->first names it), -EBADMSG when
 * the file was not authentic after all, -ENOMEM. */
int scanstate_verify(struct scanstate *st, int rootfd, unsigned threads, struct scanstate_verify_stats *vs);

/* The saved manifest's root digest. */
const uint8_t *scanstate_root(const struct scanstate *st);
/* The saved manifest's entry count (as its header says; decoding checks it). */
size_t scanstate_manifest_count(const struct scanstate *st);
/* The saved manifest (caller frees; decoded once). 0, -EBADMSG, -ENOMEM. */
int scanstate_manifest(struct scanstate *st, struct manifest **out);
/* The caller's extra bytes (valid while st lives). */
const uint8_t *scanstate_extra(const struct scanstate *st, size_t *n);
/* Names recorded (built or loaded). */
size_t scanstate_count(const struct scanstate *st);

/* The identity fields of sb as saved (for callers keeping their own, like
 * the host's rule files outside the walk): 44 bytes into out. */
#define SCANSTATE_ID_LEN 44u
void scanstate_id_encode(const struct stat *sb, uint8_t out[SCANSTATE_ID_LEN]);

#endif
