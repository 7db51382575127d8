/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_WRITEBACK_H
#define AIRLOCK_WRITEBACK_H

/*
 * writeback: guest changes on the host side (doc/SYNC.md "Guest changes
 * and write-back"). Three parts:
 *
 *   the store    the changes commands made in the guest that the user has
 *                not decided on, one per path, with the command that made
 *                each; persisted in the host's state directory
 *                (WB_STORE_FILE), so they survive down/up and restarts.
 *   wb_note      whether a reported guest path state is a change at all:
 *                guest-owned paths (gitignored, workspace.guest_owned) are
 *                not, and neither is a state equal to what the host last
 *                sent (the agent's own applies, a change undone).
 *   the pull     the host's decoder of CHG_FILE / CHG_DATA / CHG_END (every
 *                guest byte untrusted: bounded before allocation, paths
 *                checked and in the order asked, sizes against the cap,
 *                hashes checked), staging file bytes in unnamed temporary
 *                files, and the write: one delta batch signed with a key
 *                of the daemon's own, verified and applied beneath the
 *                workspace with the confined apply the guest uses
 *                (apply.h: no symlink followed, no "..", no absolute path,
 *                everything staged before anything is renamed into place).
 *
 * Errors are -errno with a message naming the path, the cap or the field.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"
#include "airlock/content/manifest.h"

struct apply;
struct policy;
struct policy_ctx;
struct wire_chg_item;

#define WB_STORE_FILE "changes.json"
#define WB_STORE_MAX  (1u << 20)  /* changes kept; more are refused (the command's exit says so) */
#define WB_BATCH_MAX  (64u << 20) /* bytes of one write-back batch; larger writes take several */

enum wb_kind {
	WB_CREATE,
	WB_MODIFY,
	WB_DELETE,
	WB_RENAME,
	WB_MODE,
	WB_SYMLINK,
};
const char *wb_kind_str(enum wb_kind k); /* "create", "modify", ... (the --json names) */

/* One waiting change. */
struct wb_change {
	char *path;
	uint32_t st_mode; /* the guest's lstat mode; 0 = deleted in the guest */
	uint64_t size;
	uint8_t hash[CHUNK_HASH_LEN];
	bool hashed;
	char *target; /* symlink target, else NULL */
	/* the host's version when the change was reported (what accept replaces,
	 * reject restores) */
	bool had;
	uint8_t base_type; /* enum manifest_type */
	uint32_t base_mode;
	uint64_t base_size;
	uint8_t base_hash[CHUNK_HASH_LEN];
	char *by_id;   /* the request id as JSON text, NULL when not known */
	char *by_argv; /* its argv as a JSON array, NULL when not known */
	bool conflict; /* the host changed the path too since: both versions kept */
	/* a conflict whose host version went to the guest: the guest's version
	 * is kept on the host, in the state dir's file of this name ("" when
	 * there are no bytes to keep: a delete, a directory, a link); NULL
	 * while the guest still holds its version */
	char *stash;
	uint64_t seq; /* report order */
};

struct wb_store;

/* Load the store from dirfd/WB_STORE_FILE (missing: empty). A damaged file
 * is refused with err set (never silently emptied: it holds the only record
 * of what waits). */
int wb_store_open(int dirfd, struct wb_store **out, char *err, size_t errlen);
void wb_store_free(struct wb_store *s); /* NULL is a no-op */
/* Write it back (temporary name, fsync, rename). 0 or -errno: ENOSPC, EROFS,
 * EDQUOT... (the caller reports it; the store in memory stays as it is). */
int wb_store_save(struct wb_store *s);
size_t wb_store_count(const struct wb_store *s);
/* Entries in tree order; valid until the next change to the store. */
const struct wb_change *wb_store_at(const struct wb_store *s, size_t i);
const struct wb_change *wb_store_find(const struct wb_store *s, const char *path);
int wb_store_remove(struct wb_store *s, const char *path); /* 0, or -ENOENT */
void wb_store_set_conflict(struct wb_store *s, const char *path);
/* Record where the guest's version of a conflict is kept (copied). */
int wb_store_set_stash(struct wb_store *s, const char *path, const char *name);
/* The kind of a change, and for a rename the deleted path it came from
 * (a delete of a file with the same content: the pair is listed once, as
 * the rename). *from is NULL otherwise; *hidden is set for the delete half
 * of a rename. */
enum wb_kind wb_store_kind(const struct wb_store *s, const struct wb_change *c, const char **from, bool *hidden);

/*
 * A reported guest path state. `known` is the host's confirmed state
 * (sync_known; NULL: nothing confirmed yet). A delete of a directory the
 * host knows expands to every known path beneath it. Returns 1 when the
 * store holds a change for the path afterwards, 0 when it is not (or no
 * longer) a change, -errno. by_id / by_argv: the command (may be NULL).
 */
int wb_note(struct wb_store *s, const struct policy *pol, struct policy_ctx *ctx, const struct manifest *known,
	    const struct wire_chg_item *it, const char *by_id, const char *by_argv);
/* Drop every change whose guest state now equals `known` (a push that was
 * in flight when the change was reported). Returns how many were dropped. */
size_t wb_store_prune(struct wb_store *s, const struct manifest *known);

/* Does a guest state equal a manifest entry (type, permission bits, size,
 * content hash; directories by type and mode)? */
bool wb_same(const struct wb_change *c, const struct manifest_entry *e);

/* ---- pulling and writing ---- */

struct wb_pull;

struct wb_pull_cfg {
	const char *const *paths; /* asked, in this order (copied) */
	size_t n;
	uint64_t max_bytes;		     /* cap on the file bytes of this pull */
	const char *cap_name;		     /* the setting, for the refusal ("workspace.writeback_max_mib") */
	int tmp_dirfd;			     /* where unnamed temporaries go (the host's state dir) */
	const struct chunk_params *chunking; /* how the guest hashed large files */
};

int wb_pull_new(const struct wb_pull_cfg *cfg, struct wb_pull **out);
void wb_pull_free(struct wb_pull *p); /* NULL is a no-op */

/* One frame of the pull stream from the guest: CHG_FILE, CHG_DATA or
 * CHG_END. 0 (more to come), 1 (CHG_END: complete), or -errno when the
 * stream is malformed or over a cap: nothing of it may be written
 * (wb_pull_error says why). */
int wb_pull_frame(struct wb_pull *p, uint8_t type, const uint8_t *data, size_t n);
const char *wb_pull_error(const struct wb_pull *p);

/* What the pull received for path i: NULL when that path was refused
 * (why in *why) or not received. */
const struct wb_change *wb_pull_got(const struct wb_pull *p, size_t i, const char **why);
/* The staged bytes of a received regular file (an fd to read from offset
 * 0, owned by the pull), or -1. */
int wb_pull_fd(const struct wb_pull *p, size_t i);

/* Take path i as received from a local copy instead of the guest: c
 * describes it (copied), fd holds a regular file's bytes (dup'ed; -1
 * otherwise); they are checked against c's hash as a pull's would be.
 * Once every path is received the pull is complete. 0 or -errno. */
int wb_pull_local(struct wb_pull *p, size_t i, const struct wb_change *c, int fd);

/* Write every received path beneath the workspace through `a` (apply_open
 * on the workspace), in batches of at most WB_BATCH_MAX bytes, each signed
 * with sk and verified with pk and scope before apply_batch. Setuid,
 * setgid and sticky bits are never written; special files never (their
 * paths are refused). done[i] is set for each path written. 0, or -errno
 * with err: the batch that failed wrote nothing (apply stages all first);
 * earlier batches stay written and are marked in done. */
int wb_pull_write(struct wb_pull *p, struct apply *a, const uint8_t sk[64], const uint8_t pk[32],
		  const uint8_t scope[32], bool *done, char *err, size_t errlen);

/* ---- a vm fork's changes, as its agent reported them ----
 *
 * A vm fork's changes are blocks in its own disk, which the host cannot
 * read (doc/VM.md "Forks"); its agent tracks what its commands change and
 * reports it on each command's stream (CHG_ITEM) as the sandbox's agent
 * does. Its agent started at the fork with an empty dirty set, so what it
 * reported since is what the fork changed. The set keeps each reported
 * path once, with the last state reported for it. Every path is the
 * guest's word: checked (manifest_path_check) before it is kept, and the
 * set is bounded. */
#define WB_FORKSET_MAX	     (1u << 18)	 /* paths kept for one fork */
#define WB_FORKSET_BYTES_MAX (64u << 20) /* and their bytes */

struct wb_forkset;

int wb_forkset_new(struct wb_forkset **out); /* 0 or -ENOMEM */
void wb_forkset_free(struct wb_forkset *s);  /* NULL is a no-op */
/* One reported path state (st_mode 0: the path is gone). -EBADMSG for a
 * path manifest_path_check refuses (nothing kept: the caller drops the
 * reporter); -E2BIG once a bound is passed, -ENOMEM: the set is incomplete
 * from then on and wb_forkset_list refuses it, saying why. */
int wb_forkset_note(struct wb_forkset *s, const char *path, uint32_t st_mode);
/* Every kept path once, in tree order, as the local fork's upper lists
 * them (sandbox_fork_changes): fn(path, deleted, ud) for a file, a symlink
 * or a path gone (deleted: it may also be one the fork made and removed
 * again: removing it changes nothing); directories and special files are
 * left out. Stops at fn's first non-zero return and returns it; -E2BIG
 * (with err) when the set overflowed, -ENOMEM. */
int wb_forkset_list(struct wb_forkset *s, int (*fn)(const char *path, bool deleted, void *ud), void *ud, char *err,
		    size_t errlen);

/* ---- a replay: pulled changes as a tar stream for a sandbox ----
 *
 * The try op replays a vm fork's changes in the sandbox by one command of
 * the sandbox's own (doc/RELAY.md "try"); its stdin is this archive
 * (POSIX ustar, pax headers for long names: busybox and GNU tar read it):
 * "files/<path>" for each file (its permission bits, never a set-id or
 * sticky bit; owner 0, time 0) and symlink, then "files.list" and
 * "deleted", each the NUL-separated workspace paths. Written to a file of
 * the caller's (fd, at its current offset). Nothing of it is ever
 * extracted on the host. */
struct wb_replay;

int wb_replay_new(int fd, struct wb_replay **out); /* 0 or -ENOMEM */
void wb_replay_free(struct wb_replay *r);	   /* NULL is a no-op */
/* Every path of a complete pull: a file or symlink archived, a gone path
 * listed for deletion, a directory or special file left out. -EINVAL with
 * err naming the path when the pull refused one (a hash mismatch, a cap)
 * or is not complete; -EFBIG for a file over ustar's 8 GiB; -errno of the
 * write. */
int wb_replay_add(struct wb_replay *r, const struct wb_pull *p, char *err, size_t errlen);
/* The two lists and the end of the archive; the counts. 0 or -errno. */
int wb_replay_finish(struct wb_replay *r, size_t *nfiles, size_t *ndeleted);

#endif
