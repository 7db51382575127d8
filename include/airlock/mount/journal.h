/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_JOURNAL_H
#define AIRLOCK_JOURNAL_H

/*
 * journal: the ordered record of every mutating operation made through the
 * FUSE mount, consumed by the sync engine.
 *
 * Producers (FUSE worker threads) call journal_append*() before they reply to
 * the kernel, so a change is journaled before the system call that made it
 * returns. Appending never waits for the consumer: it takes only the
 * journal's mutex, and memory stays bounded by degrading precision instead of
 * blocking (see "Bounds" below).
 *
 * One consumer (the sync engine, on its event loop) is woken through the
 * notify callback given to journal_new() and takes batches with
 * journal_drain().
 *
 * Paths are workspace-relative ("" is the workspace root, "a/b" a file in
 * directory a), never start or end with '/', never contain "." or ".."
 * components.
 *
 * Sequence numbers start at 1 and increase by one per journaled operation.
 * A drained record covers the operations first_seq..last_seq that were
 * coalesced into it; journal_drain() also reports `upto`, the highest seq
 * assigned so far: once the consumer has applied every record it drained, the
 * guest reflects every operation with seq <= upto.
 *
 * Coalescing (what a record means): a record says what changed at a path,
 * not how; the consumer reads current content and metadata from the backing
 * directory when it applies the record. So
 *   - WRITE records to the same path merge their byte ranges (sorted,
 *     overlapping and adjacent ranges joined; more than JOURNAL_MAX_RANGES
 *     distinct ranges become JOURNAL_F_WHOLE),
 *   - a WRITE, TRUNCATE or SETATTR right after a CREATE of the same path is
 *     absorbed by it (a created file is sent whole anyway),
 *   - SETATTRs to the same path merge,
 * as long as no rename happened in between (a rename may change what any
 * path names, so it stops all coalescing across it).
 *
 * Bounds: at most `max_records` precise records are pending. Beyond that,
 * each new operation becomes a RESCAN of its path(s) (dirty path: whole
 * file, or whole subtree for a directory), one per distinct path; beyond
 * `max_records` RESCAN paths as well, new ones become a RESCAN of their
 * top-level directory, and beyond that everything pending collapses into one
 * RESCAN of the root. An allocation failure also collapses into a RESCAN of
 * the root, so no operation is ever lost, only its precision.
 */

#include <stddef.h>
#include <stdint.h>

enum journal_op {
	JOURNAL_CREATE = 1, /* regular file created (open O_CREAT / mknod S_IFREG) */
	JOURNAL_MKDIR,
	JOURNAL_SYMLINK,
	JOURNAL_MKNOD, /* FIFO, socket or (root only) device node */
	JOURNAL_LINK,  /* hard link: path = existing, path2 = new name */
	JOURNAL_UNLINK,
	JOURNAL_RMDIR,
	JOURNAL_RENAME,	  /* path = old, path2 = new (replaces path2 if it existed) */
	JOURNAL_EXCHANGE, /* RENAME_EXCHANGE: path and path2 swapped */
	JOURNAL_WRITE,	  /* content changed in ranges (or whole) */
	JOURNAL_TRUNCATE, /* size set to `size` (content past it gone) */
	JOURNAL_SETATTR,  /* mode, owner or times changed (flags say which) */
	JOURNAL_XATTR,	  /* an extended attribute was set or removed */
	JOURNAL_RESCAN,	  /* anything at or below path may have changed,
			     including path no longer existing */
	JOURNAL_OP_MAX
};

/* Record flags. */
#define JOURNAL_F_WHOLE 0x1u /* WRITE: treat the whole file as dirty */
#define JOURNAL_F_MODE	0x2u /* SETATTR: mode changed */
#define JOURNAL_F_OWNER 0x4u /* SETATTR: uid or gid changed */
#define JOURNAL_F_TIMES 0x8u /* SETATTR: atime or mtime changed */

/* Ranges kept per WRITE record before it becomes JOURNAL_F_WHOLE. */
#define JOURNAL_MAX_RANGES 16

struct journal_range {
	uint64_t off;
	uint64_t len;
};

struct journal_rec {
	uint64_t first_seq; /* seq of the first operation merged here */
	uint64_t last_seq;  /* seq of the last one */
	enum journal_op op;
	uint32_t flags;
	char *path;	  /* owned by the record */
	char *path2;	  /* LINK/RENAME/EXCHANGE, else NULL; owned */
	uint64_t size;	  /* TRUNCATE: new size */
	uint32_t nranges; /* WRITE without F_WHOLE: ranges[0..nranges) */
	struct journal_range ranges[JOURNAL_MAX_RANGES];
};

struct journal_opts {
	size_t max_records;	  /* 0 = 65536 */
	void (*notify)(void *ud); /* called (from the appending thread, without
				     the lock held) when the journal goes from
				     empty to non-empty; may be NULL */
	void *notify_ud;
};

struct journal;

/* NULL when out of memory. opts may be NULL for defaults. */
struct journal *journal_new(const struct journal_opts *opts);
/* Frees the journal and every pending record. NULL is a no-op. No producer or
 * consumer may be using it. */
void journal_free(struct journal *j);

/* Journal one operation on path (and path2 for LINK/RENAME/EXCHANGE).
 * For WRITE, [off, off+len) is the byte range; for TRUNCATE, off is the new
 * size; flags as above. Thread-safe. Returns the operation's seq (> 0).
 * Never fails: on allocation failure it degrades to a root RESCAN. */
uint64_t journal_append(struct journal *j, enum journal_op op, const char *path, const char *path2, uint64_t off,
			uint64_t len, uint32_t flags);

static inline uint64_t journal_write(struct journal *j, const char *path, uint64_t off, uint64_t len)
{
	return journal_append(j, JOURNAL_WRITE, path, NULL, off, len, 0);
}

/* Move up to max pending records, oldest first, into out[] (the caller owns
 * them afterwards: journal_rec_clear() each). *upto (may be NULL) receives
 * the highest seq such that every operation <= it is covered by records
 * drained so far (the highest seq assigned when nothing is left pending):
 * after applying them, the consumer has applied up to *upto. Consumer
 * thread only (one consumer). Returns the number of records. */
size_t journal_drain(struct journal *j, struct journal_rec *out, size_t max, uint64_t *upto);

/* Free what a drained record owns. NULL is a no-op. */
void journal_rec_clear(struct journal_rec *r);

/* Highest seq assigned so far (0 when nothing was journaled): an exec
 * requested now must wait until sync has applied up to it. Thread-safe. */
uint64_t journal_barrier_seq(struct journal *j);

/* Number of records pending (not yet drained). Thread-safe. */
size_t journal_pending(struct journal *j);

struct journal_stats {
	uint64_t appended;  /* operations journaled */
	uint64_t coalesced; /* ... of which merged into an earlier record */
	uint64_t degraded;  /* ... of which turned into a RESCAN by the bounds */
	uint64_t collapsed; /* times everything collapsed into a root RESCAN */
};
void journal_get_stats(struct journal *j, struct journal_stats *st);

/* "create", "write", ...: for logs. */
const char *journal_op_name(enum journal_op op);

#endif
