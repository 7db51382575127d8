/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_MANIFEST_H
#define AIRLOCK_MANIFEST_H

/*
 * manifest: what a workspace tree holds, per path: type, permission bits,
 * size, content hash and (for large files) the chunk list. Used by both
 * sides: the host scans its directory, the guest scans its copy, and the
 * difference becomes a delta batch (delta.h). doc/SYNC.md explains the
 * encoding and the reconcile exchange.
 *
 * Paths are relative, '/'-separated, and valid by manifest_path_check().
 * Entries are kept in *tree order*: paths compared byte by byte, with '/'
 * sorting before every other byte. That puts every directory immediately
 * before its whole subtree (pre-order), so subtrees are contiguous ranges.
 *
 * Every entry's parent directory is itself an entry (the root, "", is
 * implicit). A directory's hash is the digest of its children (see
 * MANIFEST_TREE_DIGEST in doc/SYNC.md): two directories with equal hashes
 * have equal subtrees, which is what lets two sides compare a large tree by
 * exchanging directory digests top-down (manifest_level_encode and
 * manifest_recon_*).
 *
 * Errors are -errno: -EINVAL bad argument or entry, -ENAMETOOLONG path or
 * component too long, -EEXIST duplicate path, -ENOENT parent missing,
 * -EBADMSG malformed encoding, -E2BIG over a count limit, -ENOMEM.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"
#include "airlock/core/buf.h"

struct stat;

#define MANIFEST_PATH_MAX    4096u	/* bytes in a relative path, without NUL */
#define MANIFEST_NAME_MAX    255u	/* bytes in one component */
#define MANIFEST_TARGET_MAX  4096u	/* bytes in a symlink target */
#define MANIFEST_MODE_MASK   0777u	/* the only mode bits represented */
#define MANIFEST_ENTRIES_MAX (1u << 22) /* default cap for decode and scan */
/* Names starting with this are airlock's own temporary files in the
 * guest: never scanned, never accepted in a manifest or a batch. */
#define MANIFEST_RESERVED_PREFIX ".airlock-tmp-"

enum manifest_type {
	MANIFEST_FILE = 1,
	MANIFEST_DIR = 2,
	MANIFEST_SYMLINK = 3,
};

/* 56 bytes: one per file of the tree in every manifest held (doc/SYNC.md
 * §12). mode and nchunks are as narrow as what they hold: a mode read
 * from bytes is range-checked before it is stored here, and a chunk
 * count is a u32 in every encoding (manifest, hash cache, batch). */
struct manifest_entry {
	char *path;    /* owned */
	uint64_t size; /* file: bytes; symlink: target length; dir: 0 */
	/* file: XXH3-128 of the content; symlink: of the target bytes;
	 * dir: digest of the children (computed by the manifest). */
	uint8_t hash[CHUNK_HASH_LEN];
	char *target;	      /* symlink target as stored, or NULL when only its size/hash are known */
	struct chunk *chunks; /* file: chunk list when known and size > whole_max, else NULL */
	uint32_t nchunks;
	uint16_t mode; /* permission bits (<= 0777); 0 for symlinks */
	uint8_t type;  /* enum manifest_type */
};

/* Free what an entry owns and zero it. */
void manifest_entry_clear(struct manifest_entry *e);

struct manifest {
	struct manifest_entry *e; /* entries, in tree order once sealed */
	size_t n;
	struct chunk_params params;   /* how the chunk lists were cut */
	uint8_t root[CHUNK_HASH_LEN]; /* digest of the top level, once sealed */
	/* private */
	size_t cap;
	/* dirs: index one past the subtree; others: i + 1 (n <= UINT32_MAX) */
	uint32_t *end;
	size_t endcap;
	bool sealed;
};

/* 0 when `path` (len bytes, no NUL needed) is a valid relative path: not
 * empty, no leading or trailing '/', no empty, "." or ".." component, no
 * NUL, no component of more than MANIFEST_NAME_MAX bytes, at most
 * MANIFEST_PATH_MAX bytes, no component starting with
 * MANIFEST_RESERVED_PREFIX. -EINVAL or -ENAMETOOLONG otherwise. */
int manifest_path_check(const char *path, size_t len);

/* Tree order (see above): <0, 0, >0 like strcmp. */
int manifest_path_cmp(const char *a, const char *b);

/* New empty manifest for chunk lists cut with `params` (NULL: default).
 * -EINVAL for bad params. Free with manifest_free (NULL is a no-op). */
int manifest_new(const struct chunk_params *params, struct manifest **out);
void manifest_free(struct manifest *m);

/* Remove, in place, the entries i with drop[i] set (drop has m->n
 * flags); the others keep their order. The removed entries are moved to
 * out[0..] in order (the caller owns them then: manifest_entry_clear each),
 * or freed when out is NULL. The manifest is unsealed after: seal it
 * again before use. Pointers into m->e do not survive it. No allocation. */
void manifest_remove_marked(struct manifest *m, const bool *drop, struct manifest_entry *out);
/* Append *e like manifest_add, taking what it owns instead of a copy
 * (freed on failure too; *e is zeroed). */
int manifest_add_moved(struct manifest *m, struct manifest_entry *e);

/*
 * Add a deep copy of *e (any order; unseals the manifest). Checks the
 * path and the fields for the type: mode <= 0777 (0 for symlinks); dir:
 * size 0; file: chunk list valid for m->params if given; symlink: target of
 * 1..MANIFEST_TARGET_MAX bytes (size and hash are then computed from it),
 * or target NULL with size and hash as a peer reported them.
 */
int manifest_add(struct manifest *m, const struct manifest_entry *e);

/* Sort into tree order (entries added in tree order are only checked: one
 * pass), check there are no duplicates and that every parent is a
 * directory entry, and compute directory digests and m->root. Idempotent. Must be called after manifest_add and before
 * the functions below (scan and decode return sealed manifests). */
int manifest_seal(struct manifest *m);

/*
 * Edit a sealed manifest in place: exchange its subtree at `anchor` (the
 * entry `anchor` and, for a directory, everything beneath it; possibly
 * nothing) with the entries of `sub` (built with manifest_add, same chunk
 * params, any order). Afterwards m holds sub's entries in that place,
 * still sealed, and sub holds what m had there, in tree order (unsealed:
 * their parents are in m), so a second call with the same sub undoes the
 * first. sub must be empty or hold `anchor` itself plus entries beneath it
 * whose parents are directories of sub; anchor's parent must be a
 * directory of m (or the root): -EINVAL, -EEXIST or -ENOENT otherwise, and
 * m is unchanged on any error. Work: sorting sub, the digests of the new
 * directories and of anchor's ancestors (one record per child of each),
 * the root's, and when the entry count changes a move of the entries after
 * the anchor (memmove) -- no sort, check or digest of the rest of m.
 */
int manifest_swap_subtree(struct manifest *m, const char *anchor, struct manifest *sub);

/* Index of `path` in a sealed manifest, or -1. */
long manifest_find(const struct manifest *m, const char *path);

/*
 * Deterministic binary encoding of a sealed manifest (doc/SYNC.md):
 * equal manifests encode to identical bytes. Appends to out.
 */
int manifest_encode(const struct manifest *m, struct buf *out);
/* The same bytes, handed out in pieces: once out holds MANIFEST_FLUSH_AT
 * bytes or more (after an entry), flush(ud, out) is called and must empty
 * it (write it somewhere, buf_reset); what is left at the end stays in
 * out. So a writer of a whole-tree manifest holds one piece, never the
 * whole encoding. An error of flush is returned as it is. */
#define MANIFEST_FLUSH_AT (64u << 10)
typedef int manifest_flush_fn(void *ud, struct buf *out);
int manifest_encode_to(const struct manifest *m, struct buf *out, manifest_flush_fn *flush, void *ud);
/* The length of manifest_encode's bytes for m (sealed), without encoding. */
size_t manifest_encoded_size(const struct manifest *m);
/* Parse and fully check an encoding; the result is sealed. max_entries
 * (0 = MANIFEST_ENTRIES_MAX) is checked before allocating. */
int manifest_decode(const uint8_t *p, size_t n, size_t max_entries, struct manifest **out);

/* One entry with its chunk list, for answering "what exactly is at this
 * path" (e.g. the chunk list the host wants for sending references). The
 * decoder checks the path and fields like manifest_add; it fills *e with
 * owned copies (free with manifest_entry_clear). */
int manifest_entry_encode(const struct manifest_entry *e, struct buf *out);
int manifest_entry_decode(struct buf *in, const struct chunk_params *params, struct manifest_entry *e);

/*
 * Open `path` (valid by manifest_path_check, or "" for dirfd itself)
 * beneath dirfd, never following a symlink and never leaving the tree:
 * openat2() with RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS |
 * RESOLVE_NO_MAGICLINKS, or, where openat2 is missing (ENOSYS) or `walk` is
 * set, one openat(O_PATH | O_DIRECTORY | O_NOFOLLOW) per directory
 * component. `flags` apply to the last component; O_NOFOLLOW and O_CLOEXEC
 * are always added. Returns the new fd or -errno: -ELOOP a symlink on the
 * way or at the end (openat2 reports a trailing symlink opened with
 * O_DIRECTORY as -ENOTDIR), -ENOTDIR, -ENOENT, -EXDEV an escape, -EINVAL a
 * bad path, -EAGAIN when concurrent renames keep openat2 from finishing.
 */
int manifest_open_beneath(int dirfd, const char *path, int flags, bool walk);

/* ---- scanning a directory ---- */

enum manifest_verdict {
	MANIFEST_SKIP = 0,    /* leave it (and a directory's subtree) out */
	MANIFEST_KEEP = 1,    /* keep it (and look inside a directory) */
	MANIFEST_DESCEND = 2, /* directory: look inside; keep it only if something beneath is kept */
};

enum manifest_skip {
	MANIFEST_SKIP_SPECIAL = 1,  /* fifo, socket or device: not representable */
	MANIFEST_SKIP_DEPTH = 2,    /* deeper than max_depth */
	MANIFEST_SKIP_NAME = 3,	    /* path too long for the manifest */
	MANIFEST_SKIP_TARGET = 4,   /* symlink target too long */
	MANIFEST_SKIP_ERROR = 5,    /* could not be read (errno given) */
	MANIFEST_SKIP_CHANGED = 6,  /* vanished or changed type/size while scanned */
	MANIFEST_SKIP_RESERVED = 7, /* an airlock temporary name */
};

/* Returns enum manifest_verdict for relpath. */
typedef int (*manifest_filter_fn)(const char *relpath, bool is_dir, void *ud);
/* Told about every path the scanner left out for a reason other than the
 * filter; err is a positive errno for MANIFEST_SKIP_ERROR, else 0. */
typedef void (*manifest_skipped_fn)(const char *relpath, enum manifest_skip why, int err, void *ud);

struct hcache;

/* What manifest_scan_opts.seen is told about a name (scanstate.h keeps it). */
enum manifest_seen {
	MANIFEST_SEEN_STAT = 1, /* st: the name's lstat, taken before any verdict or read */
	MANIFEST_SEEN_WALK = 2, /* a directory whose names are read next (its children follow) */
	MANIFEST_SEEN_DONE = 3, /* the scan read everything (relpath "", st NULL): the last call */
};
typedef void (*manifest_seen_fn)(const char *relpath, const struct stat *st, enum manifest_seen kind, void *ud);

struct manifest_scan_opts {
	manifest_filter_fn filter; /* NULL: keep everything */
	void *filter_ud;
	manifest_skipped_fn skipped; /* NULL: not told */
	void *skipped_ud;
	/* Cut chunk lists for files over params.whole_max with these params;
	 * NULL: hash only (entries get no chunk list; m->params = default). */
	const struct chunk_params *chunking;
	/* Stat-keyed hash cache (hcache.h), or NULL: files whose key matches a
	 * non-racy entry are not read; every file hashed is put back. The scan
	 * calls hcache_begin; loading and saving are the caller's. */
	struct hcache *cache;
	unsigned max_depth; /* 0: 128. Directories nest at most this deep. */
	size_t max_entries; /* 0: MANIFEST_ENTRIES_MAX; more is -E2BIG */
	/* Told, in tree order, the lstat of every name of every directory the
	 * scan reads (kept, filtered out or skipped alike; not reserved names)
	 * and which directories it reads: what a later scanstate_verify
	 * compares the disk with. NULL: not told. */
	manifest_seen_fn seen;
	void *seen_ud;
};

/*
 * Scan the tree beneath dirfd (which stays the caller's) into a sealed
 * manifest. Never follows a symlink (fstatat AT_SYMLINK_NOFOLLOW, openat
 * O_NOFOLLOW, symlinks recorded as links); special files, over-long paths,
 * unreadable entries and entries changing under the scan are left out and
 * reported through opts->skipped. Setuid/setgid/sticky bits are dropped.
 * Fails only for the root itself, -ENOMEM, or -E2BIG.
 */
int manifest_scan(int dirfd, const struct manifest_scan_opts *opts, struct manifest **out);

/* ---- differences ---- */

enum manifest_change_kind {
	MANIFEST_REMOVE = 1, /* old path goes (new is set too when another type replaces it) */
	MANIFEST_ADD = 2,    /* new path (old is set too when it replaces another type) */
	MANIFEST_MODIFY = 3, /* same type, content differs (size or hash; mode may differ too) */
	MANIFEST_MODE = 4,   /* same type and content, only the mode differs */
};

struct manifest_change {
	uint8_t kind;			  /* enum manifest_change_kind */
	const struct manifest_entry *old; /* entry in `old`, or NULL */
	const struct manifest_entry *new; /* entry in `new`, or NULL */
};

/*
 * What turns `old` (sealed) into `new` (sealed), as a mem_alloc'd array
 * (caller frees with mem_free; pointers point into the manifests). Order
 * is the order to apply it in: all removals first, children before their
 * directory, then additions and changes, directories before their
 * children. Subtrees with equal digests are skipped without being walked.
 */
int manifest_diff(const struct manifest *old, const struct manifest *new, struct manifest_change **out, size_t *n);

/* ---- top-down reconcile of large trees ----
 *
 * Side A (answering) has its manifest; side B (asking) has its own and
 * wants A's, without A sending the whole listing:
 *   B: manifest_recon_new(mine, A's root digest)
 *   loop while manifest_recon_next() gives directory paths:
 *       A: manifest_level_encode() for each asked path, B: manifest_recon_feed()
 *   B: manifest_recon_finish() -> A's manifest, reconstructed: the records A
 *      sent plus B's own entries for every subtree whose digest matched.
 * Cost: one level (one record per child) for each directory on a path to
 * a difference, instead of one record per path. Reconstructed entries carry
 * no symlink target and no chunk list (ask with manifest_entry_* for those).
 */

/* A's answer for directory `dirpath` ("" = root): u32 count, then per child
 * in name order: bytes name, u8 type, u32 mode, u64 size, 16-byte hash.
 * -ENOENT when dirpath is not a directory of m. */
int manifest_level_encode(const struct manifest *m, const char *dirpath, struct buf *out);

/* Reading a peer's level (the other side's manifest_level_encode of
 * dirpath), one child at a time: the one decoder of those bytes. It checks
 * the layout: a count no larger than the bytes can hold, each name
 * non-empty, without '/' or NUL and a valid path component, names in
 * strictly increasing byte order, the joined "dirpath/name" at most
 * MANIFEST_PATH_MAX, and no bytes after the last record. It does not check
 * type, mode or size: that is the caller's, who knows what it accepts. */
struct manifest_level_reader {
	struct buf in;	     /* view of the level's bytes */
	uint32_t count;	     /* records the level announces */
	uint32_t left;	     /* records not yet read */
	const char *dir;     /* dirpath, the caller's */
	size_t dl;	     /* strlen(dir) */
	const uint8_t *name; /* the last record's name (view), its length */
	size_t nl;
	char path[MANIFEST_PATH_MAX + 1]; /* the last record's joined path */
};
/* Start reading level[0..n) for dirpath. 0, or -EBADMSG for a count the
 * bytes cannot hold. level and dirpath must outlive the reader. */
int manifest_level_open(struct manifest_level_reader *lr, const char *dirpath, const uint8_t *level, size_t n);
/* 1 with the next child in *e (type, mode, size, hash; e->path points at
 * lr->path, valid until the next call; nothing allocated), 0 after the
 * last one, -EBADMSG for a malformed record or trailing bytes. */
int manifest_level_next(struct manifest_level_reader *lr, struct manifest_entry *e);

struct manifest_recon;

/* Start reconciling against a peer whose root digest is peer_root. `mine`
 * must stay alive and unchanged until manifest_recon_free. max_entries
 * (0 = MANIFEST_ENTRIES_MAX) caps the reconstructed manifest. */
int manifest_recon_new(const struct manifest *mine, const uint8_t peer_root[CHUNK_HASH_LEN], size_t max_entries,
		       struct manifest_recon **out);
void manifest_recon_free(struct manifest_recon *r);

/* Directory paths to ask about next (strings owned by r, valid until the
 * next feed): sets *dirs and returns how many; 0 means done. */
size_t manifest_recon_next(struct manifest_recon *r, const char *const **dirs);

/* Feed the peer's level for dirpath, which must be one that was asked for
 * and not yet answered (-EPROTO otherwise). Checks every record. */
int manifest_recon_feed(struct manifest_recon *r, const char *dirpath, const uint8_t *level, size_t n);

/* The reconstructed peer manifest (sealed; caller frees). -EAGAIN when
 * directories are still pending; -ESTALE when its root digest does not
 * match peer_root (the peer changed during the exchange: start again). */
int manifest_recon_finish(struct manifest_recon *r, struct manifest **peer);

#endif
