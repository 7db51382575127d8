/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_DELTA_H
#define AIRLOCK_DELTA_H

/*
 * delta: signed batches of workspace operations, host -> guest.
 *
 * The host builds a batch (delta_builder_*): MKDIR, PUT (file content as
 * chunks, each inline (zstd when it shrinks, else raw) or a reference to
 * bytes the guest already has in a file), SYMLINK, CHMOD, DELETE; then
 * signs it with its Ed25519 sync-signing key (keys_signing_key()).
 *
 * The guest checks it (delta_batch_verify) in this order before touching
 * anything: size caps; the signature over every byte; scope and sequence;
 * the structure of every op (paths, modes, lengths, counts, each checked
 * against a cap before anything is allocated); every inline chunk
 * decompressed under a cap and hashed; the file hash of every PUT made only
 * of inline chunks. PUTs with references are hashed when apply.h reads the
 * referenced bytes, still before any change becomes visible.
 *
 * Encoding (doc/SYNC.md, "Batch"): CHANGE DELTA_VERSION IF THE BYTES
 * CHANGE.
 *
 * Errors (-errno): -EPERM bad signature or wrong scope, -ESTALE sequence
 * not newer than the last applied, -EBADMSG malformed or a hash mismatch,
 * -EMSGSIZE over a size cap, -E2BIG over a count cap, -ENOMEM; the builder
 * also -ENOBUFS when an op would take the batch over caps->max_batch (the
 * batch is unchanged: finish it and start the next).
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"
#include "airlock/content/manifest.h"

/* 2: the signature is over DELTA_SIG_LABEL || BLAKE2b-256(batch), not the raw batch. */
#define DELTA_VERSION	 2
#define DELTA_SIG_LABEL	 "airlock delta batch v2 blake2b-256\0"
#define DELTA_SIGMSG_LEN (sizeof(DELTA_SIG_LABEL) - 1 + 32)
#define DELTA_SIG_LEN	 64 /* Ed25519 detached signature */
#define DELTA_PK_LEN	 32
#define DELTA_SK_LEN	 64
#define DELTA_SCOPE_LEN	 32 /* what the batch is for; see delta_builder_new */
#define DELTA_HDR_LEN	 (4 + 1 + 1 + 2 + DELTA_SCOPE_LEN + 8 + 4)

enum delta_op_type {
	DELTA_MKDIR = 1,   /* create a directory (or set the mode of an existing one) */
	DELTA_PUT = 2,	   /* replace/create a regular file atomically */
	DELTA_SYMLINK = 3, /* replace/create a symlink (target as given, never followed) */
	DELTA_CHMOD = 4,   /* set the permission bits of a file or directory */
	DELTA_DELETE = 5,  /* remove a file, symlink or (empty, or with TREE any) directory */
};

#define DELTA_DELETE_TREE 0x01 /* DELETE: remove a directory with everything in it */

enum delta_chunk_kind {
	DELTA_CHUNK_RAW = 1,  /* raw_len bytes follow */
	DELTA_CHUNK_ZSTD = 2, /* one zstd frame declaring raw_len, shorter than raw_len */
	DELTA_CHUNK_REF = 3,  /* raw_len bytes at ref_off in the PUT's base file, as it was before the batch */
};

struct delta_caps {
	size_t max_batch;    /* bytes of a whole encoded batch */
	uint32_t max_ops;    /* ops per batch */
	uint32_t max_chunks; /* chunks per batch, all PUTs together */
	uint32_t max_chunk;  /* raw bytes of one chunk (<= CHUNK_SIZE_LIMIT) */
	uint64_t max_file;   /* bytes of one file */
};

/* 64 MiB, 65536 ops, 262144 chunks, CHUNK_SIZE_LIMIT, 1 TiB. */
extern const struct delta_caps delta_caps_default;

/* ---- building (host) ---- */

struct delta_builder;

/*
 * New empty batch with sequence number `seq` (must be larger than every
 * batch the guest applied before) and `scope`, 32 bytes the guest compares
 * with its own idea (e.g. a hash of its static public key and workspace
 * id), so a batch made for one guest is refused by another. Chunks from
 * delta_put_file are cut with `chunking` (NULL: default); caps NULL:
 * default. Free with delta_builder_free (NULL is a no-op).
 */
int delta_builder_new(uint64_t seq, const uint8_t scope[DELTA_SCOPE_LEN], const struct chunk_params *chunking,
		      const struct delta_caps *caps, struct delta_builder **out);
void delta_builder_free(struct delta_builder *b);
/* zstd level for inline chunks (default 1). */
void delta_builder_set_level(struct delta_builder *b, int level);
int delta_builder_level(const struct delta_builder *b);
/* Start over empty with a new sequence number (keeps scope and settings). */
void delta_builder_reset(struct delta_builder *b, uint64_t seq);
/* Ops so far, and the size the batch would have if finished now. */
size_t delta_builder_ops(const struct delta_builder *b);
size_t delta_builder_size(const struct delta_builder *b);

/* Simple ops. Paths are checked with manifest_path_check, modes must be
 * <= 0777 (-EINVAL otherwise). */
int delta_add_mkdir(struct delta_builder *b, const char *path, uint32_t mode);
int delta_add_symlink(struct delta_builder *b, const char *path, const char *target);
int delta_add_chmod(struct delta_builder *b, const char *path, uint32_t mode);
int delta_add_delete(struct delta_builder *b, const char *path, uint8_t flags);

/*
 * A PUT, chunk by chunk: put_begin, then put_inline / put_ref in file
 * order, then put_end with the content hash of the whole file (its size is
 * the sum of the chunks). `base` names the file REF chunks read from (NULL:
 * `path` itself), as it is before the batch. On any error the partial PUT
 * is dropped and the batch is as it was before put_begin.
 */
int delta_put_begin(struct delta_builder *b, const char *path, uint32_t mode, const char *base);
/* Inline chunk of len bytes (1..max_chunk): zstd-compressed when that
 * makes it shorter, raw otherwise. */
int delta_put_inline(struct delta_builder *b, const void *data, size_t len);
/* Reference: len bytes at off in the base file, with content hash `hash`. */
int delta_put_ref(struct delta_builder *b, uint64_t off, uint32_t len, const uint8_t hash[CHUNK_HASH_LEN]);
int delta_put_end(struct delta_builder *b, const uint8_t file_hash[CHUNK_HASH_LEN]);

/*
 * Inline chunks made off the builder, e.g. on worker threads while the
 * builder's thread assembles the batch (doc/SYNC.md §8 "Preparing files
 * on worker threads"): delta_chunk_encode writes at out (room for
 * DELTA_CHUNK_REC_MAX(len) bytes) the record delta_put_inline would have
 * written for data[0..len) (1..CHUNK_SIZE_LIMIT bytes) whose content hash
 * is `hash` (the caller computed it, e.g. to check the bytes are the
 * scanned ones), its length in *n: zstd at `level` when that shrinks it,
 * raw otherwise. -EINVAL for a bad len. One delta_cctx per thread (NULL
 * from new: out of memory; free is NULL-safe). delta_put_encoded appends
 * such a record, unchanged, to the PUT being built, as delta_put_inline
 * would (same caps; -ENOBUFS and -EINVAL drop the PUT); a record that is
 * not one delta_chunk_encode made is our own bug (asserted).
 */
#define DELTA_CHUNK_REC_MAX(len) (1 + 4 + CHUNK_HASH_LEN + 4 + (size_t)(len)) /* kind, raw_len, hash, zlen */
struct delta_cctx;
struct delta_cctx *delta_cctx_new(void);
void delta_cctx_free(struct delta_cctx *c);
int delta_chunk_encode(struct delta_cctx *c, int level, const void *data, size_t len,
		       const uint8_t hash[CHUNK_HASH_LEN], uint8_t *out, size_t *n);
int delta_put_encoded(struct delta_builder *b, const uint8_t *rec, size_t n);

/*
 * A whole PUT from an open regular file: reads fd from offset 0 to its
 * current size, cuts chunks, and sends each one the guest already has as a
 * REF and the rest inline. `have` (may be NULL) is what the guest has at
 * `base` (NULL: at `path`): its chunk list, or for a file without one its
 * whole content as a single chunk when it fits in one. When `made` is not
 * NULL it receives the manifest entry of what was sent (path, mode, size,
 * hash, chunk list), owned by the caller (manifest_entry_clear). -ESTALE
 * when fd is not a regular file or the file shrank while read (the PUT is
 * then dropped and *made left empty).
 */
int delta_put_file(struct delta_builder *b, const char *path, uint32_t mode, int fd, const char *base,
		   const struct manifest_entry *have, struct manifest_entry *made);

/*
 * A whole PUT of a file whose chunk list list[0..n) (of a file of `size`
 * bytes, for this builder's chunk params) is already known, e.g. from
 * chunk_update after an edit: chunks the guest has (`have`, as for
 * delta_put_file) become REFs without reading anything; only the others are
 * read from fd, and each must still hash to its list entry, else -ESTALE
 * (the file changed since the list was made; the PUT is dropped). The file
 * hash is chunk_list_hash(list). *read_bytes (may be NULL) is increased by
 * the bytes read. -EINVAL when the list does not describe `size` bytes.
 */
int delta_put_chunks(struct delta_builder *b, const char *path, uint32_t mode, int fd, const char *base,
		     const struct manifest_entry *have, const struct chunk *list, size_t n, uint64_t size,
		     uint64_t *read_bytes);

/*
 * The op(s) for one manifest_change from manifest_diff(guest, host):
 * REMOVE -> DELETE (TREE when a directory is replaced by another type),
 * ADD/MODIFY -> MKDIR, SYMLINK or PUT (content read from host_dirfd, with
 * references to the guest's old version of the same path), MODE -> CHMOD.
 * Returns what delta_put_file returns for files (-ENOENT/-ESTALE when the
 * host file changed since the scan: rescan).
 */
int delta_add_change(struct delta_builder *b, int host_dirfd, const struct manifest_change *c);

/* Sign with sk (Ed25519, 64 bytes) and hand out the encoded batch as a
 * mem_alloc'd array (caller frees with mem_free): the builder's own
 * storage, no copy (a batch is up to SYNC_BATCH_TARGET, and a copy of it
 * was alive beside the next batch being built). The builder's bytes are
 * empty after it (its op count and sequence are kept: reset it before the
 * next batch). -EINVAL inside a PUT. */
int delta_builder_finish(struct delta_builder *b, const uint8_t sk[DELTA_SK_LEN], uint8_t **out, size_t *n);

/* ---- verifying (guest) ---- */

struct delta_chunk {
	uint8_t kind;	  /* enum delta_chunk_kind */
	uint32_t raw_len; /* bytes this chunk contributes to the file */
	uint8_t hash[CHUNK_HASH_LEN];
	const uint8_t *data; /* RAW/ZSTD: payload inside the batch bytes */
	size_t data_len;
	uint64_t ref_off; /* REF: offset in the base file */
};

struct delta_op {
	uint8_t type;  /* enum delta_op_type */
	uint8_t flags; /* DELETE: DELTA_DELETE_TREE */
	uint32_t mode; /* MKDIR, PUT, CHMOD: <= 0777 */
	const char *path;
	const char *target;	      /* SYMLINK */
	const char *base;	      /* PUT: file REF chunks read from (== path unless the op named another) */
	uint64_t size;		      /* PUT */
	uint8_t hash[CHUNK_HASH_LEN]; /* PUT: of the whole content */
	bool has_refs;		      /* PUT: some chunk is a REF (file hash checked at apply time) */
	const struct delta_chunk *chunks;
	size_t nchunks;
};

struct delta_batch;

/*
 * Verify a batch (see the top of this file for the order of checks) and
 * parse it. `last_seq` is the sequence number of the last batch applied;
 * the batch must carry a larger one. `scope` must equal the batch's. On
 * success *out is the parsed batch; it points into `bytes`, which the
 * caller keeps alive and unchanged until delta_batch_free. err (may be
 * NULL) receives a message naming the op, path and problem.
 *
 * Also refused (-EBADMSG): a path in more than one of MKDIR/PUT/SYMLINK/
 * CHMOD, or in two DELETEs, or a DELETE after a create of the same path;
 * unknown op types (there is no op for fifos, sockets or devices); mode
 * bits outside 0777 (setuid, setgid, sticky, file type bits: a batch is
 * made by our own scanner, which never emits them, so one that has them is
 * refused rather than silently fixed).
 */
int delta_batch_verify(const uint8_t *bytes, size_t n, const uint8_t pk[DELTA_PK_LEN],
		       const uint8_t scope[DELTA_SCOPE_LEN], uint64_t last_seq, const struct delta_caps *caps,
		       struct delta_batch **out, char *err, size_t errlen);
/*
 * The same checks except the content of inline chunks: no zstd chunk is
 * decompressed and no inline chunk or inline-only file is hashed here
 * (frame headers and declared sizes still are checked). For a caller that
 * reads every inline chunk through delta_chunk_data (which decompresses
 * under the same cap and checks the chunk hash) and checks every PUT's file
 * hash before anything becomes visible: apply_batch does, so the guest
 * decompresses and hashes each chunk once instead of twice. A batch from
 * this function must not be trusted for content by anything else.
 */
int delta_batch_verify_deferred(const uint8_t *bytes, size_t n, const uint8_t pk[DELTA_PK_LEN],
				const uint8_t scope[DELTA_SCOPE_LEN], uint64_t last_seq, const struct delta_caps *caps,
				struct delta_batch **out, char *err, size_t errlen);
void delta_batch_free(struct delta_batch *b);

/* The batch signature over p[0..n) (header and ops): Ed25519 over
 * DELTA_SIG_LABEL || BLAKE2b-256(p) (doc/SYNC.md §4). delta_sign_verify
 * returns 0 or -EPERM. */
void delta_sign(const uint8_t *p, size_t n, const uint8_t sk[DELTA_SK_LEN], uint8_t sig[DELTA_SIG_LEN]);
int delta_sign_verify(const uint8_t *p, size_t n, const uint8_t pk[DELTA_PK_LEN], const uint8_t sig[DELTA_SIG_LEN]);

uint64_t delta_batch_seq(const struct delta_batch *b);
size_t delta_batch_count(const struct delta_batch *b);
const struct delta_op *delta_batch_op(const struct delta_batch *b, size_t i);
/* Largest raw_len of any chunk: the scratch size delta_chunk_data needs. */
uint32_t delta_batch_chunk_max(const struct delta_batch *b);

/* The raw bytes of an inline chunk: RAW points into the batch, ZSTD is
 * decompressed into scratch (at least c->raw_len bytes). Checks the hash
 * again. -EINVAL for a REF chunk. Not thread-safe per batch. */
int delta_chunk_data(struct delta_batch *b, const struct delta_chunk *c, uint8_t *scratch, const uint8_t **out);

/* A decompression context of one thread's own, for reading one batch's
 * chunks from several threads at once (apply's parallel staging). Free
 * with delta_dctx_free (NULL is a no-op); NULL from new: out of memory. */
struct delta_dctx;
struct delta_dctx *delta_dctx_new(void);
void delta_dctx_free(struct delta_dctx *d);
/* delta_chunk_data through d instead of the batch's own context: safe
 * from several threads at once on the same batch, each with its own d
 * and scratch. */
int delta_chunk_data_dctx(const struct delta_batch *b, struct delta_dctx *d, const struct delta_chunk *c,
			  uint8_t *scratch, const uint8_t **out);

#endif
