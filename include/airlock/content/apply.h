/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_APPLY_H
#define AIRLOCK_APPLY_H

/*
 * apply: the guest side of sync. Applies verified delta batches (delta.h)
 * beneath one root directory, confined and crash-safe (doc/SYNC.md,
 * "Apply"):
 *
 *  - Every path is resolved beneath the root with openat2(RESOLVE_BENEATH |
 *    RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS), or one O_NOFOLLOW openat
 *    per component where openat2 is missing; the last component is only
 *    ever used with *at() calls on its parent's fd, never followed.
 *  - A batch runs in three phases. (1) Check every op against the tree as
 *    it is (parents exist or are made earlier in the batch, no file where a
 *    directory must go, ...), and stage all new content: each file is
 *    written to a temporary file (O_TMPFILE, else a random
 *    ".airlock-tmp-*" name made O_EXCL) in its target directory, or in a
 *    staging directory at the root when the batch itself creates or
 *    replaces that directory; references are read from the existing files
 *    and every chunk and file hash is checked. A failure here removes the
 *    temporaries: the tree is exactly as before. (2) Commit: in batch
 *    order, mkdir, rename the staged files and links into place, chmod,
 *    delete. (3) Directory modes (deferred so a read-only directory can
 *    still be filled), fsync per policy, remove the staging directory.
 *  - A failure in (2) (ENOSPC creating a directory, a guest process
 *    racing us) stops at that op: earlier ops are applied, later ones are
 *    not, each file is either wholly old or wholly new, no temporary is
 *    left. The error says so; the host must reconcile. Deletions cannot be
 *    undone, so nothing is rolled back after the first visible change.
 *  - Nothing creates special files; mode bits are <= 0777 (delta.h).
 *
 * An apply handle is used from one thread at a time.
 * Errors are -errno; apply_error() has a message naming the op and path.
 */

#include <stdbool.h>
#include <stdint.h>

#include "airlock/content/delta.h"
#include "airlock/content/manifest.h"

enum apply_fsync {
	APPLY_FSYNC_NONE = 0,  /* leave it to the kernel (fastest; a crash may lose recent batches) */
	APPLY_FSYNC_BATCH = 1, /* syncfs after staging and after commit: each batch durable as a whole */
	APPLY_FSYNC_FILE = 2,  /* fsync each file before and its directory after its rename */
};

/* Resolve by component walk and chmod without fchmodat2 even where the
 * kernel has them (tests; old kernels are detected on their own). */
#define APPLY_NO_OPENAT2 0x1u
/* Named temporary files instead of O_TMPFILE. */
#define APPLY_NO_TMPFILE 0x2u

struct apply_opts {
	enum apply_fsync fsync;
	unsigned flags;
};

struct apply_stats {
	uint64_t ops;	    /* ops committed */
	uint64_t files;	    /* files written */
	uint64_t bytes;	    /* bytes written into them */
	uint64_t ref_bytes; /* of which copied from files already here */
	uint64_t cloned;    /* files made as a clone of their old version, only new chunks written */
	uint64_t dirs;	    /* directories made */
	uint64_t symlinks;
	uint64_t chmods;
	uint64_t deleted;   /* paths removed (a tree counts once) */
	uint64_t kept_dirs; /* directory DELETEs skipped: still hold files the host does not manage */
	bool partial;	    /* failed during commit: some ops applied (see above) */
};

struct apply;

/* Open the root directory (following symlinks only in `root` itself) and
 * remove temporaries a crash left at its top level. opts NULL: fsync per
 * batch. Free with apply_free (NULL is a no-op). */
int apply_open(const char *root, const struct apply_opts *opts, struct apply **out);
void apply_free(struct apply *a);

/* Apply a batch that delta_batch_verify accepted. Refuses (-ESTALE) a
 * sequence number not above apply_last_seq(); on success the last sequence
 * becomes the batch's. st (may be NULL) is filled either way. */
int apply_batch(struct apply *a, struct delta_batch *b, struct apply_stats *st);

/* Message about the last failure ("" if none). Owned by a. */
const char *apply_error(const struct apply *a);

/* The sequence number of the last batch applied (0 at first), e.g. to
 * pass to delta_batch_verify, and to restore it after a restart. */
uint64_t apply_last_seq(const struct apply *a);
void apply_set_last_seq(struct apply *a, uint64_t seq);

/* The root's fd (owned by a). */
int apply_rootfd(const struct apply *a);

/* Scan the root (manifest_scan) for reconcile. Temporaries left by a
 * crash are removed as they are found (and still reported as
 * MANIFEST_SKIP_RESERVED). Not to be called during apply_batch. */
int apply_manifest(struct apply *a, const struct manifest_scan_opts *opts, struct manifest **out);

#endif
