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
 *  - Per-op failures: an op that fails in (1), (2) or (3) for a reason of
 *    its own (a directory it may not write, a full disk or quota, a file
 *    too large, a name the filesystem refuses, a guest process in the
 *    way) is left out: its temporary is removed, its path keeps what it
 *    had (a file is wholly old or wholly new; only a tree removal can get
 *    halfway), and every other op goes on. The batch succeeds with those
 *    ops listed by apply_failures(). Only running out of memory stops a
 *    batch: in (1) nothing is applied; in (2) earlier ops are applied and
 *    later ones are not (st->partial; the host must reconcile).
 *  - Modes the way rsync applies them: the agent is not root in the
 *    guest but owns what it applied, so a directory without u+w or u+x
 *    (read-only on the host) is made u+wx for the one change in it that
 *    needed it and restored right after, content for it is staged in the
 *    staging directory, and a file without u+r (mode 000, 0200) is made
 *    readable for the open of its old content and restored. Only after
 *    EACCES, only for inodes the agent owns.
 *  - Nothing creates special files; mode bits are <= 0777 (delta.h).
 *
 * An apply handle is used from one thread at a time (apply_batch may
 * start threads of its own for staging and joins them before it returns).
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
/* Replace an existing entry by rename, not by exchange + unlink (tests;
 * filesystems without RENAME_EXCHANGE are detected on their own). */
#define APPLY_NO_EXCHANGE 0x4u

struct apply_opts {
	enum apply_fsync fsync;
	unsigned flags;
	/* Threads that write a batch's files (phase 1): 0 = the CPUs online,
	 * at most 4, and only for batches of 32 files or more; n (tests) = n
	 * threads for any batch of 2 files or more; 1 = the calling thread
	 * alone. The check before and the commit after are in op order on the
	 * calling thread either way. */
	unsigned threads;
	/* With `own`: the files, directories and links the apply makes are
	 * given to uid:gid (an agent running as root whose commands run as
	 * another user, as in the vm sandbox: the host's files are theirs to
	 * change). Without: they are the caller's, as created. */
	bool own;
	uint32_t uid, gid;
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
	uint64_t failed;    /* ops that failed on their own (apply_failures) */
	bool partial;	    /* failed during commit: some ops applied (see above) */
};

/* Failure records kept per batch (more are counted only). */
#define APPLY_FAIL_MAX	   1024u
#define APPLY_FAIL_MSG_MAX 255u

/* One op of the last batch that failed on its own. */
struct apply_failure {
	uint32_t op;			  /* index in the batch */
	int err;			  /* errno */
	char msg[APPLY_FAIL_MSG_MAX + 1]; /* what failed, e.g. "DELETE: unlink: Permission denied" */
};

struct apply;

/* Open the root directory (following symlinks only in `root` itself) and
 * remove temporaries a crash left at its top level. opts NULL: fsync per
 * batch. Free with apply_free (NULL is a no-op). */
int apply_open(const char *root, const struct apply_opts *opts, struct apply **out);
void apply_free(struct apply *a);

/* Apply a batch that delta_batch_verify accepted. Refuses (-ESTALE) a
 * sequence number not above apply_last_seq(); on success (which may
 * leave ops failed on their own: st->failed, apply_failures) the last
 * sequence becomes the batch's. st (may be NULL) is filled either way. */
int apply_batch(struct apply *a, struct delta_batch *b, struct apply_stats *st);

/* apply_batch where any op's failure is the batch's, as before per-op
 * failures: one in (1) leaves the tree exactly as it was, one in (2) or
 * (3) stops there (st->partial). For the write-back to the host, which
 * writes a guest change whole or not at all (doc/WRITEBACK.md). */
int apply_batch_whole(struct apply *a, struct delta_batch *b, struct apply_stats *st);

/* The ops of the last apply_batch that failed on their own, in op order:
 * *n records (at most APPLY_FAIL_MAX), *total (may be NULL) all of them.
 * Owned by a, valid until the next apply_batch. */
const struct apply_failure *apply_failures(const struct apply *a, size_t *n, uint64_t *total);

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
