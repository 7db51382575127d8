/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_HCACHE_H
#define AIRLOCK_HCACHE_H

/*
 * hcache: a stat-keyed content-hash cache for manifest_scan, persisted in a
 * state directory (host: $XDG_STATE_HOME/airlock/<id>/hash-cache; guest:
 * its --state directory). doc/SYNC.md §3 "Hash cache".
 *
 * Key: path, st_dev, st_ino, st_size, st_mtim, st_ctim, st_mode. Value: the
 * XXH3-128 content hash and, for files over whole_max, the chunk list (only
 * used when the chunk parameters match). A scan asks hcache_get before
 * opening a file; on a hit the file is not read.
 *
 * Racy entries (git's "racy clean" problem): hcache_begin takes a stamp
 * from the scanned filesystem's own clock (the ctime of a fresh unnamed
 * O_TMPFILE in the scanned directory; without one, the wall clock minus
 * 2 s). hcache_put keeps an entry only when both its mtime and its ctime
 * are older than that stamp. A change after the stamp gives the file a
 * ctime >= stamp, so it can never match a kept key; a change before it is
 * seen by the stat that made the key. ctime cannot be set by users, so
 * restoring the mtime (touch -d) after an edit still changes the key.
 *
 * The cache is only an optimisation: a missing, truncated, corrupt
 * (checksum), other-version or oversized file loads as empty, and every
 * lookup still needs the whole key to match. Only the entries put during
 * the current scan are saved, so the file never holds more than the tree
 * (at most MANIFEST_ENTRIES_MAX entries, HCACHE_FILE_MAX bytes).
 *
 * Errors are -errno. Not thread-safe.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/stat.h>

#include "airlock/content/chunk.h"
#include "airlock/content/manifest.h"

#define HCACHE_FILE	"hash-cache"
#define HCACHE_FILE_MAX (512u << 20)

struct hcache;

/* A file's stat identity, the key of a cache entry (and of a scanstate
 * name): mtime and ctime in nanoseconds. */
struct hcache_key {
	uint64_t dev, ino, size;
	int64_t mtime, ctime;
	uint32_t mode;
};
void hcache_key_of(const struct stat *st, struct hcache_key *k);
/* Same identity: every field but dev (kept, not compared). A device
 * number is not a file's: every mount of an overlay gets a new one, so a
 * sandbox restarted on a fresh overlay (after a fork, doc/SANDBOX.md
 * "Forks") would find all its files changed and hash them again; NFS and
 * FUSE remounts do the same (git compares no st_dev either, USE_STDEV).
 * The inode, size, mode and both times to the nanosecond still have to
 * match, and no user can set a ctime. */
bool hcache_key_eq(const struct hcache_key *a, const struct hcache_key *b);

/* New empty cache for chunk lists cut with p (NULL: default). */
int hcache_new(const struct chunk_params *p, struct hcache **out);
void hcache_free(struct hcache *c); /* NULL is a no-op */

/* Replace the loaded entries with the file `name` in dirfd. 0 when loaded;
 * -ENOENT when there is none; -EBADMSG when it is corrupt, another
 * version or for other chunk parameters (ignored: the cache is then
 * empty); -ENOMEM. The cache is usable after any return. */
int hcache_load(struct hcache *c, int dirfd, const char *name);

/* The racy stamp for a scan of the tree at dirfd, in ns: the ctime of a
 * fresh unnamed O_TMPFILE there (the filesystem's own clock), else the
 * wall clock minus 2 s. A change after it stamps a ctime >= it. */
int64_t hcache_stamp(int dirfd);

/* Start a scan of the tree at scan_dirfd: takes the racy stamp and
 * forgets the entries put by an earlier scan. */
void hcache_begin(struct hcache *c, int scan_dirfd);

/* Look up path with its lstat/fstat result. 1 on a hit: e->mode, size,
 * hash and (when over whole_max) a mem_alloc'd chunk list are filled.
 * 0 on a miss, -ENOMEM. */
int hcache_get(struct hcache *c, const char *path, const struct stat *st, struct manifest_entry *e);

/* Remember e (a file hashed from content read after `st` was taken) for
 * the next scan, unless it is racy. 0 or -ENOMEM (-E2BIG past the entry
 * cap: the entry is simply not cached). */
int hcache_put(struct hcache *c, const char *path, const struct stat *st, const struct manifest_entry *e);

/* Write the entries put since hcache_begin to `name` in dirfd (temporary
 * file, rename). 0 or -errno. After an hcache_load, the entries put are
 * written out to that load's `name`.tmp as the scan goes (HCACHE_SPILL_AT
 * bytes at a time: a scan holds no more than that of them), and the save
 * must then name the same dirfd and name (-EINVAL otherwise); a failed
 * spill fails the save. */
#define HCACHE_SPILL_AT (256u << 10)
int hcache_save(struct hcache *c, int dirfd, const char *name);

/* Forget the loaded entries and the ones put since hcache_begin, giving
 * their memory back (after hcache_save: the next hcache_load reads them
 * from the file). A scan between this and the next load finds no hits.
 * NULL is a no-op. */
void hcache_trim(struct hcache *c);

/* Counters of the last scan: hits, misses, entries put (racy ones are not). */
void hcache_counts(const struct hcache *c, uint64_t *hits, uint64_t *misses, uint64_t *racy);

#endif
