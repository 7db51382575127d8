/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_TRACK_H
#define AIRLOCK_TRACK_H

/*
 * track: which paths of the guest's workspace copy changed, and which
 * command was running when they did (doc/SYNC.md "Guest changes and
 * write-back").
 *
 * An inotify watch on every directory of the root. The kernel queues an
 * event synchronously with the filesystem operation that causes it, so
 * once a command's process has exited, reading the inotify descriptor
 * (track_read) yields every change it made: the agent reads it from its
 * loop as events arrive (attributing them to the command running then)
 * and once more right before it sends a command's EXEC_EXIT. Nothing is
 * rescanned per command: a report costs one lstat (and a hash for files)
 * per changed path, plus a walk of each directory created or moved in
 * (its contents may predate its watch).
 *
 * The dirty set is only "may have changed": the agent's own batch applies
 * land in it too, and the host drops every reported path whose state
 * equals what it last sent (its confirmed manifest). Paths whose name
 * starts with MANIFEST_RESERVED_PREFIX (apply's temporaries) are ignored.
 *
 * What an apply wrote is not kept at all (track_read with TRACK_BY_APPLY
 * only re-attributes a path already dirty), so an initial sync of a
 * million files leaves the set empty.
 *
 * Lost events. When the kernel's queue overflows (IN_Q_OVERFLOW; an apply
 * of a few thousand files does it with the default
 * fs.inotify.max_queued_events of 16384), the events since the last read
 * that emptied the queue (the *clean point*) are unknown. Every change
 * since then has a ctime at or after the clean point (the kernel sets
 * ctime from the same coarse clock, and nobody can set it back), so the
 * tracker recovers with a stat-only walk of the copy on a thread: a path
 * whose ctime is older, or whose (inode, ctime) is one an apply of ours
 * left (track_applied_path records them while events may be lost), is
 * unchanged; the others are marked dirty, unattributed (by 0), and come
 * with the next report. The walk starts once applies have paused for
 * TRACK_RECOVER_QUIET_NS (batches arriving meanwhile would lose more) or
 * at the next track_take, never blocks a command (a report taken while it
 * runs goes without its findings), hashes nothing (track_describe hashes
 * only what it found) and costs one lstat per path. What it cannot see: a
 * path deleted or renamed away in the window (its directory's item is
 * reported; the next reconcile finds the path itself, as before).
 *
 * Bounds: at most TRACK_DIRTY_MAX dirty paths and TRACK_WATCHES_MAX
 * watches. Past either, or when a watch cannot be added
 * (fs.inotify.max_user_watches), or without memory, the tracker becomes
 * *saturated*: the next report walks the whole root once (track_take
 * returns the root as a tree) and tracking starts afresh.
 *
 * Tests: AIRLOCK_TRACK_QUEUE_TEST=N (read by track_new) makes a read that
 * meets more than N events drop the rest, as an overflowing kernel queue
 * would, without touching the machine-wide sysctl.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"
#include "airlock/core/buf.h"

#define TRACK_DIRTY_MAX	  (1u << 20)
#define TRACK_WATCHES_MAX (1u << 20)
/* Files larger than this are reported without a hash (the host refuses
 * to pull them long before: writeback caps). */
#define TRACK_HASH_MAX (1ull << 30)
/* `by` for the agent's own batch applies: such paths are not reported
 * (unless a command touches them again). */
#define TRACK_BY_APPLY UINT32_MAX
/* Inodes track_applied remembers while events may be lost (16 bytes each,
 * at most twice that in slots); past it a path is found by the recovery
 * and reported, and the host finds it unchanged. */
#define TRACK_APPLIED_MAX (1u << 21)
/* Lost events are recovered once no apply came for this long. */
#define TRACK_RECOVER_QUIET_NS (300ll * 1000 * 1000)

struct track;

/* One dirty path (owned by the tracker until track_take hands it over). */
struct track_dirty {
	char *path;  /* root-relative; "" = the root */
	uint32_t by; /* exec stream of the command running at the last event, 0 = none */
	bool tree;   /* a directory created or moved in: walk it */
};

/* Watch every directory beneath root (an open directory fd, kept by the
 * caller; root_path is its absolute path, for inotify_add_watch).
 * 0 or -errno with err set. */
int track_new(int rootfd, const char *root_path, struct track **out, char *err, size_t errlen);
void track_free(struct track *t); /* NULL is a no-op */
/* The inotify descriptor, for the loop (readable: call track_read). */
int track_fd(const struct track *t);

/* Read every queued event and mark its path dirty, attributed to `by`
 * (a later event overwrites an earlier attribution). Never blocks. */
void track_read(struct track *t, uint32_t by);

/* Take the dirty set, sorted in tree order, nested duplicates beneath a
 * tree entry dropped, paths last touched by an apply (TRACK_BY_APPLY) left out; the caller frees each path (mem_free)
 * and the array. A saturated tracker yields one entry: the root as a tree. */
int track_take(struct track *t, struct track_dirty **out, size_t *n);

/* Figures for tests and the bench. */
struct track_stats {
	uint64_t events, watches, saturated;
	uint64_t lost;		   /* overflows seen (IN_Q_OVERFLOW) */
	uint64_t recoveries;	   /* recovery walks started */
	uint64_t recovered;	   /* paths they marked dirty */
	uint64_t recovery_visited; /* paths they lstat'ed */
	bool saturated_now;	   /* some change may be unseen (saturated, or lost events not yet recovered) */
	bool lost_now;		   /* lost events not yet recovered */
};
void track_get_stats(const struct track *t, struct track_stats *st);

/* An apply of ours committed a batch: read the queue (as the apply's);
 * true when events may be lost, and then the caller hands every path the
 * batch wrote (not the deleted ones) to track_applied_path, which
 * remembers its lstat identity so that the recovery does not report it. */
bool track_applied_read(struct track *t);
void track_applied_path(struct track *t, int rootfd, const char *path);

/* Read the queue, and when events were lost, run the recovery to its end
 * now (tests, and an agent that wants an exact set at a quiet point: a vm
 * fork's, --settle-reports, before each command's report). */
void track_settle(struct track *t);

/* The state of one path beneath rootfd, as CHG_ITEM reports it: st_mode 0
 * when gone; files up to TRACK_HASH_MAX hashed as manifests hash them
 * (chunk list hash above params->whole_max); symlink targets read. Fills
 * the item's fields (path is not touched; target is mem_alloc'd).
 * 0 or -errno (a path that vanished is not an error: st_mode 0). */
struct wire_chg_item;
int track_describe(int rootfd, const char *path, const struct chunk_params *params, struct wire_chg_item *it);

/* Visit path and, when it is a directory, everything beneath it (parents
 * before children, no symlink followed, reserved names skipped). `each`
 * gets the relative path and its lstat; a negative return stops the walk
 * and is returned. A path that is gone is not visited. */
struct stat;
int track_walk(int rootfd, const char *path, int (*each)(const char *path, const struct stat *st, void *ud), void *ud);

#endif
