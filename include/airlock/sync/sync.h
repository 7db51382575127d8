/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SYNC_H
#define AIRLOCK_SYNC_H

/*
 * sync: the host-side sync engine. It turns a workspace directory plus a
 * policy into signed delta batches for one guest, over a sync stream of an
 * already-ready chan (wire.h "sync" group, doc/PROTOCOL.md "Sync").
 *
 * Two entry points, both asynchronous on the chan's loop:
 *
 *   sync_reconcile()  on every (re)connect: scan the host tree through
 *                     the policy, learn what the guest holds by a top-down
 *                     digest exchange in which the host drops every guest
 *                     entry its policy does not manage (so those are never
 *                     listed further, compared or touched: a guest-side
 *                     node_modules survives), diff, send batches, wait for
 *                     every acknowledgement.
 *   sync_push_paths() after a reconcile: the paths a change journal saw
 *                     change (the live FUSE mount's dirty set). Sends what
 *                     changed relative to the state the guest last
 *                     confirmed, without asking the guest anything.
 *
 * Each finishes with ops->on_done(err, why) exactly once; one operation
 * runs at a time (-EBUSY otherwise). Progress is reported through
 * ops->on_progress as batches are built and acknowledged.
 *
 * The application owns the chan and routes to the engine every frame whose
 * type is in the sync group (sync_on_frame), every on_writable
 * (sync_on_writable), and WIRE_ERROR frames on the sync stream
 * (sync_on_error). The engine never frees the chan.
 *
 * Secrets: a path the policy withholds is never opened. The one exception
 * is .git/config, which is always withheld and replaced by a *generated*
 * file holding only whitelisted keys of the host's (sync_git_config); its
 * bytes are made in memory, the real file is only parsed.
 *
 * Errors are -errno; the `why` text names the path, batch or peer.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"
#include "airlock/content/delta.h"
#include "airlock/core/buf.h"

struct chan;
struct policy;
struct sync;

/* Most withheld / skipped paths kept for the audit record; the rest are
 * only counted. */
#define SYNC_RECORDS_MAX 10000u
/* A batch is finished once it holds this many bytes (a single larger
 * file still goes in one batch, up to WIRE_SYNC_MSG_MAX). */
#define SYNC_BATCH_TARGET (4u << 20)
/* Default sync_cfg.batch_budget_ns: 20 ms of batch building per turn of the loop. */
#define SYNC_PUMP_BUDGET_NS (20ull * 1000 * 1000)
/* Batches sent and not yet acknowledged. */
#define SYNC_BATCHES_IN_FLIGHT 2u
/* An operation with at least this many whole small files to send reads,
 * checks, judges and compresses them on worker threads (prep.h; default
 * sync_cfg.prep_min), ahead of the batches, holding at most
 * SYNC_PREP_BYTES of them. */
#define SYNC_PREP_MIN	    64u
#define SYNC_PREP_BYTES	    (8u << 20)
#define SYNC_GIT_CONFIG	    ".git/config"
#define SYNC_GIT_CONFIG_MAX (1u << 20) /* larger host .git/config files are not parsed */

/* The generated .git/config for the guest, from the host's one at
 * `path`: only [core] repositoryformatversion, filemode, logallrefupdates,
 * ignorecase, precomposeunicode, symlinks, autocrlf, eol, safecrlf,
 * checkstat, trustctime and [extensions] objectformat, refstorage are
 * copied, and only with plain values ([A-Za-z0-9._-]); bare is always
 * false. No remotes, URLs, includes, credentials, hooksPath, fsmonitor,
 * sshCommand or anything else. A missing or unreadable file gives the
 * minimal config. Appends to out. 0, -EFBIG (over SYNC_GIT_CONFIG_MAX) or
 * -ENOMEM. */
int sync_git_config(int dirfd, const char *path, struct buf *out);

/* ---- host engine ---- */

struct sync_progress {
	const char *phase;    /* "scan", "reconcile", "send", "done" */
	uint64_t files_total; /* files and links the diff will send */
	uint64_t bytes_total; /* their content bytes */
	uint64_t files_done;  /* acknowledged by the guest */
	uint64_t bytes_done;
};

struct sync_stats {
	uint64_t host_entries;	/* managed paths on the host */
	uint64_t guest_entries; /* managed paths the guest had (reconstructed) */
	uint64_t levels;	/* directory levels the guest listed */
	uint64_t changes;	/* ops the diff produced */
	uint64_t files, symlinks, dirs, chmods, deleted;
	uint64_t content_bytes; /* bytes of the files sent (before delta) */
	uint64_t batch_bytes;	/* encoded, signed batch bytes */
	uint64_t batches;
	uint64_t withheld; /* paths the policy withheld (files and pruned dirs) */
	/* changes to the withheld list: a rename from one withheld name to
	 * another leaves the count alone, not this */
	uint64_t withheld_changes;
	uint64_t skipped;   /* special files and unreadable entries left out */
	uint64_t vanished;  /* files that changed or vanished while being sent (left for next sync) */
	uint64_t kept_dirs; /* directory deletes the guest skipped: they hold its own files */
	uint64_t guest_seq; /* last sequence the guest confirmed */
	uint64_t guest_gen; /* the generation of the guest's copy (SYNC_STATE) */
	/* the last full host scan (doc/SYNC.md "Unchanged trees") */
	uint64_t scan_ns;	/* its wall time */
	uint64_t scan_hashed;	/* files it read (0 when the persisted scan was proven unchanged) */
	uint64_t scan_verified; /* 1: the persisted scan state was proven unchanged by a stat walk */
	uint64_t scan_names;	/* names that walk compared */
	/* why the persisted state was not used ("" when it was): "none",
	 * "refused" (corrupt, forged, other version or rules), or the first
	 * path found changed */
	char scan_note[160];
	/* where a proof of an unchanged tree spent its time (AIRLOCK_TRACE;
	 * doc/UP.md "Tracing the start"): loading the state file (read and
	 * parse; its MAC and manifest are checked and decoded on a thread
	 * meanwhile), the stat walk, then taking its records and waiting for
	 * that thread; scan_early_ns: 0, or how long before the reconcile's
	 * scan took it a prescan (sync_prescan_start) had begun */
	uint64_t scan_load_ns, scan_walk_ns, scan_check_ns, scan_early_ns;
	uint64_t scan_end_ns; /* CLOCK_MONOTONIC when the last host scan ended */
	uint64_t state_ns;    /* CLOCK_MONOTONIC when the guest's SYNC_STATE of the last reconcile came */
};

/* A path the guest could not apply (doc/SYNC.md "Per-path failures"):
 * the op failed in the guest on its own (a directory it may not write, a
 * full disk or quota, a file too large, a name its filesystem refuses),
 * the rest of the batch applied. The guest keeps what it had at the path;
 * the confirmed state says so, so pushing the path again (a retry, or
 * the next edit of it) sends the op again. */
struct sync_failure {
	char *path;	   /* owned */
	int err;	   /* errno, as the guest reported it */
	char *msg;	   /* owned: the guest's words, e.g. "DELETE: unlink: Permission denied" */
	uint32_t attempts; /* operations in a row that reported it */
	uint64_t since_ms; /* CLOCK_REALTIME ms of the first of them */
	uint64_t last_ms;  /* and of the last */
	bool reconcile;	   /* the guest's copy is not what the host thinks (EBADMSG, EEXIST,
			    * EISDIR, ENOTDIR, ELOOP...): a reconcile retries it, not a push */
};
/* Most per-path failures listed; the rest are only counted. */
#define SYNC_FAILURES_MAX 10000u

/* A withheld or skipped path, for the audit record. */
struct sync_record {
	char *path; /* owned */
	char *rule; /* owned: policy verdict rule, or why it was skipped */
};

struct sync_ops {
	void (*on_progress)(const struct sync_progress *p, void *ud); /* may be NULL */
	void (*on_done)(int err, const char *why, void *ud);
};

struct sync_cfg {
	int dirfd;			     /* the workspace (kept by the caller) */
	const struct policy *policy;	     /* must outlive the engine */
	const uint8_t *sign_sk;		     /* 64 bytes: keys_signing_key() */
	const uint8_t *sign_pk;		     /* 32 bytes */
	const uint8_t *guest_pub;	     /* 32 bytes: the pinned guest static key */
	const struct chunk_params *chunking; /* NULL: chunk_params_default */
	size_t batch_target;		     /* 0: SYNC_BATCH_TARGET */
	size_t max_batch;		     /* 0: WIRE_SYNC_MSG_MAX; a file whose PUT alone is larger
					      * is not sent but listed as skipped ("too large to sync") */
	/* Directory for the host's hash cache (hcache.h, file HCACHE_FILE)
	 * and its persisted last scan (scanstate.h, file SCANSTATE_FILE), e.g.
	 * audit_dir(); NULL: every scan reads and hashes every file. */
	const char *state_dir;
	const struct sync_ops *ops;
	void *ud;
	/* The loop the engine runs on: full host scans then run on a worker
	 * thread and the loop keeps serving meanwhile (doc/SYNC.md, "Bounds on
	 * ignore rules"). NULL: they run inline, on the caller's thread. With
	 * a loop, building batches also yields to it: see batch_budget_ns. */
	struct loop *loop;
	/* Time one pump may spend building batches on the loop (0:
	 * SYNC_PUMP_BUDGET_NS): a batch is finished early once it is spent,
	 * and with a loop the next one is built from a zero-delay timer, so
	 * a tree of many small files never holds the loop for long. */
	uint64_t batch_budget_ns;
	/* Guest changes waiting for the user (doc/SYNC.md "Guest changes and
	 * write-back"): asked about every op a reconcile or push would send;
	 * true drops the op, so the guest keeps its version. NULL: none. */
	bool (*keep)(void *ud, const struct manifest_change *c);
	/* Worker threads preparing small files (doc/SYNC.md §8 "Preparing
	 * files on worker threads"): how many (0: one per CPU), and from how
	 * many such files in one operation they are used (0: SYNC_PREP_MIN;
	 * UINT32_MAX: never, everything on the engine's thread). */
	uint32_t prep_threads;
	uint32_t prep_min;
};

/* New engine on a ready chan; opens its sync stream. cfg is copied (the
 * pointers in it must outlive the engine). -ENOMEM, -EINVAL. */
int sync_new(struct chan *c, const struct sync_cfg *cfg, struct sync **out);
void sync_free(struct sync *s); /* NULL is a no-op */

int sync_reconcile(struct sync *s);

/* Begin proving the host tree unchanged before the engine exists (doc/SYNC.md
 * "Unchanged trees", "Early start"): loads cfg->state_dir's SCANSTATE_FILE
 * and walks the tree at cfg->dirfd against it on a thread of its own (its
 * own copies of both descriptors). Uses cfg's policy, sign_sk, chunking and
 * state_dir, like sync_new. The caller must start it only once nothing can
 * change the tree unseen any more (after the mount is in place: later
 * changes through it are journaled) and hand it to the engine only when
 * nothing was journaled since it started: a change it may have walked past
 * is then not covered. 0, -EINVAL, -ENOMEM, -errno. */
struct sync_prescan;
int sync_prescan_start(const struct sync_cfg *cfg, struct sync_prescan **out);
/* Never waits: a walk still running finishes on its thread and frees
 * itself. NULL is a no-op. */
void sync_prescan_free(struct sync_prescan *p);
/* The next reconcile's host scan takes p's proof (waiting for it, on the
 * scan's thread) instead of loading and walking then, when p was made with
 * the engine's key and rules; the engine owns p from here. */
void sync_set_prescan(struct sync *s, struct sync_prescan *p);
/*
 * paths: workspace-relative paths that changed (files or directories,
 * either end of a rename). -EINVAL before a successful reconcile.
 *
 * Path-targeted: only the dirty paths are looked at (lstat through their
 * parent, opened beneath the workspace without following links); a
 * directory among them, or a path under a directory the confirmed state
 * does not hold (new, renamed, removed), is walked as a subtree; a
 * .gitignore re-decides its directory's subtree. Everything else is taken
 * from the state the guest last confirmed. Falls back to a full host scan
 * (still no guest round trip) for the root, .git/info/exclude, a dirty
 * file with more than one link (its other names are not in the set), more
 * than 4096 paths or a quarter of the tree, or any inconsistency between
 * that state and the disk. Hashes only the files it looks at; the hash
 * cache is used by full scans only. Renames are a delete plus a put (a
 * large file's put takes REF chunks from the deleted old path). A
 * file that changes or vanishes while a batch is built is left for the
 * next push, and the confirmed state keeps the guest's old version of it.
 * doc/SYNC.md §9.
 */
int sync_push_paths(struct sync *s, const char *const *paths, size_t n);

/*
 * What a change journal knows about how a dirty path's content changed
 * since it was last handed to a push. With `valid`, the path was only
 * written, truncated or had its attributes changed (no create, rename,
 * link or unlink), and its content can differ from what was last pushed
 * only in bytes [lo, hi) and, when `resized` or the size differs, from lo
 * (or the smaller size) to the end. lo > hi means no byte was written.
 */
struct sync_hint {
	uint64_t lo, hi;
	bool valid;
	bool resized;
};

/*
 * sync_push_paths with a hint per path (hints may be NULL). A large file
 * (over whole_max, already in the confirmed state as a chunk list) with a
 * valid hint is re-chunked with chunk_update from that list: only the
 * chunks around the written bytes are read, cut and hashed, and its PUT
 * reads only the chunks the guest lacks. A hint that understates a change
 * costs no correctness: every chunk the PUT reuses is one the guest holds
 * (a REF, verified there), every other chunk is read and checked, and the
 * bytes the hint missed are journaled, so a later push covers them. A
 * file left for a later push (changed while sent) is hashed in full next
 * time, whatever its hint says.
 */
int sync_push_hinted(struct sync *s, const char *const *paths, const struct sync_hint *hints, size_t n);

/* What the last sync_push_paths looked at (for tests and the bench). */
struct sync_push_stats {
	uint64_t paths;	       /* dirty paths given */
	uint64_t anchors;      /* subtrees decided again (after nesting and escalation) */
	uint64_t lstats;       /* entries stat'ed */
	uint64_t walked;       /* directories walked as subtrees */
	uint64_t hashed;       /* files read */
	uint64_t hashed_bytes; /* their bytes (for ranged files: the bytes re-read) */
	uint64_t ranged;       /* large files re-chunked from a hint (chunk_update) */
	uint64_t put_read;     /* bytes read to build PUTs of files with a chunk list */
	bool full;	       /* fell back to a full host scan */
	/* loop_now_ns() when the new state was decided (the changes known),
	 * when the last batch went into the channel, when the last
	 * acknowledgement came (0: not yet; for AIRLOCK_TRACE and the bench) */
	uint64_t t_decided_ns, t_sent_ns, t_acked_ns;
};
const struct sync_push_stats *sync_get_push_stats(const struct sync *s);

/* The operation in progress has handed every batch to the channel (its
 * acknowledgements may still be on the way). A frame sent on the channel
 * after this reaches the guest after those batches: the guest applies
 * each batch before it reads the next frame, so a command started then
 * sees them (the exec barrier). false when idle or still deciding. */
bool sync_all_sent(const struct sync *s);

void sync_on_frame(struct sync *s, uint8_t type, uint32_t stream, const uint8_t *p, size_t n);
void sync_on_writable(struct sync *s);
void sync_on_error(struct sync *s, uint32_t code, const char *msg);
uint32_t sync_stream(const struct sync *s);

const struct sync_stats *sync_get_stats(const struct sync *s);
/* The host-side state the guest last confirmed (NULL before the first
 * reconcile finished): what a guest change is compared against. Valid
 * until the next operation finishes. */
const struct manifest *sync_known(const struct sync *s);
/* The host state the operation in progress is sending (NULL when none is,
 * or without memory): what the guest may already hold beyond sync_known
 * when the connection drops before the acknowledgements arrive; also
 * after the operation failed while sending (a write to a dead guest, its
 * ERROR: batches before may be applied). The whole tree: for a targeted
 * push (which holds only the changed part) it is built when asked,
 * O(entries). Valid until the next operation starts. */
const struct manifest *sync_sending(struct sync *s);
/* The paths the guest could not apply (struct sync_failure), *total
 * counts all. A failure stays until an operation covering its path
 * (a reconcile, a full scan, a push of it or of a directory above it)
 * no longer gets it reported. Valid until the next operation finishes. */
const struct sync_failure *sync_failures(const struct sync *s, size_t *n, uint64_t *total);
/* Withheld paths (policy) and skipped entries (special files, errors) of
 * the last scan, each capped at SYNC_RECORDS_MAX; *total counts all. */
const struct sync_record *sync_withheld(const struct sync *s, size_t *n, uint64_t *total);
const struct sync_record *sync_skipped(const struct sync *s, size_t *n, uint64_t *total);

#endif
