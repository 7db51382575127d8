/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_CHUNK_H
#define AIRLOCK_CHUNK_H

/*
 * chunk: content hashes and content-defined chunking (doc/SYNC.md).
 *
 * Content hash: XXH3-128 of the bytes, stored as its 16-byte canonical
 * (big-endian) form. It identifies content; it is not a MAC and not
 * collision-resistant against an adversary (the batch signature carries
 * authenticity; see doc/SYNC.md "Hashes").
 *
 * File hash (chunk_list_hash): a function of the file's chunk list only —
 * the content hash of the bytes for an empty or one-chunk file (every file
 * up to whole_max), and a seeded XXH3-128 of the chunk hashes in order for
 * a file of two or more chunks. So an edit of a large file needs only the
 * chunks it touched re-read and re-hashed (chunk_update), never the whole
 * file (doc/SYNC.md §2).
 *
 * Chunking: FastCDC (Xia et al., USENIX ATC 2016) with a 64-bit gear hash,
 * cut-point skipping below `min` and normalized chunking level 2 (a harder
 * mask before `avg`, an easier one after), hard cut at `max`. A cut
 * decision looks only at the bytes of the chunk being cut, so chunking
 * from any earlier boundary gives the same later boundaries: that is what
 * lets chunk_update() re-hash only around an edit.
 *
 * Files of at most `whole_max` bytes are one chunk (the whole file); an
 * empty file has no chunks. Every chunk is 1..max bytes.
 *
 * Errors are -errno: -EINVAL for bad parameters or a chunk list that does
 * not describe the stated file, -ENOMEM, and whatever the read callback
 * returns.
 */

#include <stddef.h>
#include <stdint.h>

#define CHUNK_HASH_LEN 16
/* Hard limits for chunk_params, so a peer-declared chunk never needs more
 * than CHUNK_SIZE_LIMIT bytes of memory. */
#define CHUNK_SIZE_LIMIT (4u * 1024u * 1024u)
#define CHUNK_MIN_LIMIT	 64u

struct chunk_params {
	uint32_t min;	    /* no cut before this many bytes (>= CHUNK_MIN_LIMIT) */
	uint32_t avg;	    /* normalization point, a power of two, min < avg < max */
	uint32_t max;	    /* hard cut (<= CHUNK_SIZE_LIMIT) */
	uint32_t whole_max; /* files up to this size are one chunk (min <= whole_max <= max) */
};

/* 16 KiB / 64 KiB / 256 KiB, files up to 128 KiB whole. */
extern const struct chunk_params chunk_params_default;

/* 0, or -EINVAL when p breaks a rule above. */
int chunk_params_check(const struct chunk_params *p);

/* One chunk of a file: bytes [off, off + len). In a chunk list the offsets
 * are consecutive from 0 and the lengths sum to the file size. */
struct chunk {
	uint64_t off;
	uint32_t len;
	uint8_t hash[CHUNK_HASH_LEN];
};

/* The file hash of a file whose chunk list is list[0..n) (see above). */
void chunk_list_hash(const struct chunk *list, size_t n, uint8_t out[CHUNK_HASH_LEN]);

/* XXH3-128 of p[0..n), canonical form. */
void chunk_hash(const void *p, size_t n, uint8_t out[CHUNK_HASH_LEN]);

/* Streaming form of chunk_hash (no allocation; caller-owned memory). */
struct chunk_hasher {
	_Alignas(64) unsigned char state[640];
};
void chunk_hasher_init(struct chunk_hasher *h);
void chunk_hasher_update(struct chunk_hasher *h, const void *p, size_t n);
void chunk_hasher_final(struct chunk_hasher *h, uint8_t out[CHUNK_HASH_LEN]);
/* Start a list hash instead: feed it the chunk hashes of a file of two or
 * more chunks, in order (what chunk_list_hash does for such a list). */
void chunk_hasher_init_list(struct chunk_hasher *h);

/* The length of the chunk that starts at d, given n bytes from d to the end
 * of the file (only the first p->max are looked at). Returns n when n <=
 * p->min. Never 0 unless n is 0. Ignores whole_max. */
size_t chunk_cut(const struct chunk_params *p, const uint8_t *d, size_t n);

/* Chunk a buffer holding a whole file. *out is a mem_alloc'd array of *n
 * chunks (NULL and 0 for an empty buffer); caller frees with mem_free. */
int chunk_split(const struct chunk_params *p, const void *data, size_t len, struct chunk **out, size_t *n);

/* Reads exactly len bytes of the (new) file at off into buf. Returns 0 or
 * -errno; a file that is shorter than promised is -ESTALE (it changed while
 * being read). */
typedef int (*chunk_read_fn)(void *ud, uint64_t off, void *buf, size_t len);

/* A chunk_read_fn for a file descriptor: ud points to the int fd. Uses
 * pread, retries EINTR, turns a short file into -ESTALE. */
int chunk_read_fd(void *ud, uint64_t off, void *buf, size_t len);

/* Called for each chunk as it is cut, with its bytes (valid only during the
 * call). A negative return stops chunking and is returned. */
typedef int (*chunk_fn)(void *ud, const struct chunk *c, const uint8_t *data);

/* The file hash of the first `size` bytes of fd, as manifests hold it:
 * XXH3-128 of the bytes up to p->whole_max, chunk_list_hash of its chunks
 * above. Reads with pread (chunk_read_fd: a shorter file is -ESTALE). */
int chunk_fd_hash(const struct chunk_params *p, int fd, uint64_t size, uint8_t out[CHUNK_HASH_LEN]);

/* Chunk a file of `size` bytes read through rd, sequentially, with one
 * buffer of 2 * p->max bytes. `each` (may be NULL) sees every chunk with
 * its bytes, in order. When file_hash is not NULL it receives the file
 * hash (chunk_list_hash of the result). */
int chunk_file(const struct chunk_params *p, chunk_read_fn rd, void *ud, uint64_t size, chunk_fn each, void *each_ud,
	       struct chunk **out, size_t *n, uint8_t file_hash[CHUNK_HASH_LEN]);

/*
 * Incremental re-chunking after an edit. `old` (nold chunks) is the chunk
 * list of the old content; the new content is new_size bytes read through
 * rd, and differs from the old one only inside [dirty_off, dirty_end) (new
 * coordinates):
 *     new[0, dirty_off)        == old[0, dirty_off)
 *     new[dirty_end, new_size) == old[dirty_end - new_size + old_size, old_size)
 * An in-place overwrite is [first written byte, last written byte + 1); an
 * insertion of k bytes at x is [x, x + k); a deletion of k bytes at x is
 * [x, x); a size change by truncate or append makes everything from the
 * first changed byte to new_size dirty.
 *
 * Only the chunk containing dirty_off onwards is re-read, and only until a
 * new boundary falls on an old boundary (shifted by the size change) past
 * the dirty range; from there the old chunks are reused as they are. The
 * result equals chunk_file() of the new content. -EINVAL when the range is
 * impossible (dirty_end > new_size, or the unchanged tail would start
 * before dirty_off in the old content) or `old` is not a valid list for
 * these params. *reread, when not NULL, gets the number of bytes read.
 */
int chunk_update(const struct chunk_params *p, const struct chunk *old, size_t nold, uint64_t dirty_off,
		 uint64_t dirty_end, uint64_t new_size, chunk_read_fn rd, void *ud, struct chunk **out, size_t *n,
		 uint64_t *reread);

/* Check that list[0..n) is a chunk list of a file of `size` bytes for
 * params p: consecutive offsets from 0, lengths 1..p->max, summing to size;
 * a single chunk when size <= whole_max. 0 or -EINVAL. */
int chunk_list_check(const struct chunk_params *p, const struct chunk *list, size_t n, uint64_t size);

#endif
