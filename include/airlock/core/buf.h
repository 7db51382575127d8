/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_BUF_H
#define AIRLOCK_BUF_H

/*
 * buf: the one buffer type for bytes that cross a boundary (network, guest,
 * client, file). Modelled on OpenSSH's sshbuf: every read checks bounds,
 * every write checks a hard size cap chosen by the owner, reserve is
 * overflow-safe, and integers are big-endian on the wire.
 *
 * A buf is either *owned* (storage from mem_alloc, grows up to `max`) or a
 * read-only *view* of someone else's bytes (buf_view). The readable region
 * is [off, len). Getters consume from the front; putters append at the end.
 *
 * Errors: -ENOBUFS  a write would exceed the cap,
 *         -ENOMEM   allocation failed,
 *         -EBADMSG  a read wanted more bytes than are there, or a length
 *                   field is larger than its limit,
 *         -EROFS    a write to a view.
 * A failed call leaves the buffer unchanged.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct buf {
	uint8_t *data;
	size_t off; /* first unread byte */
	size_t len; /* end of written bytes */
	size_t cap; /* allocated size; 0 for a view */
	size_t max; /* hard cap on len - off + growth */
	bool view;
};

/* No buffer ever holds more than this, whatever max its owner asks for. */
#define BUF_HARD_MAX ((size_t)1 << 32)

/* Set up an empty owned buffer that may hold at most `max` bytes (clamped
 * to BUF_HARD_MAX). Allocates nothing until the first write. */
void buf_init(struct buf *b, size_t max);

/* Set up a read-only view over p[0..n). The caller keeps ownership of p and
 * must keep it alive while the view is used. */
void buf_view(struct buf *b, const void *p, size_t n);

/* Free owned storage (wiping it) and reset to empty; keeps `max`. */
void buf_clear(struct buf *b);

/* Drop the contents but keep the storage for reuse. */
void buf_reset(struct buf *b);

/* Readable bytes. */
static inline size_t buf_len(const struct buf *b)
{
	return b->len - b->off;
}
static inline const uint8_t *buf_ptr(const struct buf *b)
{
	return b->data + b->off;
}

/* Make room for n more bytes and return a pointer to them in *out; the
 * caller writes there and then calls buf_commit(b, n) (or fewer). Compacts
 * consumed space before growing. */
int buf_reserve(struct buf *b, size_t n, uint8_t **out);
void buf_commit(struct buf *b, size_t n);

int buf_put(struct buf *b, const void *p, size_t n);
int buf_put_u8(struct buf *b, uint8_t v);
int buf_put_u16(struct buf *b, uint16_t v);
int buf_put_u32(struct buf *b, uint32_t v);
int buf_put_u64(struct buf *b, uint64_t v);
/* u32 length then the bytes. */
int buf_put_bytes(struct buf *b, const void *p, size_t n);
/* u32 length then the string without its NUL. */
int buf_put_str(struct buf *b, const char *s);

int buf_get(struct buf *b, void *p, size_t n);
int buf_get_u8(struct buf *b, uint8_t *v);
int buf_get_u16(struct buf *b, uint16_t *v);
int buf_get_u32(struct buf *b, uint32_t *v);
int buf_get_u64(struct buf *b, uint64_t *v);
/* Read a u32 length and return a pointer into the buffer (no copy), valid
 * until the buffer is next written. Fails with -EBADMSG when the length
 * exceeds `limit` or the bytes are not all there. */
int buf_get_bytes(struct buf *b, const uint8_t **p, size_t *n, size_t limit);
/* Like buf_get_bytes but copies into a new NUL-terminated string (caller
 * frees with mem_free); rejects embedded NUL bytes with -EBADMSG. */
int buf_get_str(struct buf *b, char **s, size_t limit);

/* Read a u32 at `at` bytes past the readable start without consuming it;
 * -EBADMSG when those 4 bytes are not there. */
int buf_peek_u32(const struct buf *b, size_t at, uint32_t *v);
/* Overwrite a u32 at `at` bytes past the readable start (a length or count
 * written once the rest is known); -EBADMSG when those 4 bytes are not
 * there, -EROFS for a view. */
int buf_poke_u32(struct buf *b, size_t at, uint32_t v);
/* The same for one byte, a u64, and n bytes from p; errors as buf_poke_u32
 * (-EBADMSG when [at, at + n) is not all readable). */
int buf_poke_u8(struct buf *b, size_t at, uint8_t v);
int buf_poke_u64(struct buf *b, size_t at, uint64_t v);
int buf_poke(struct buf *b, size_t at, const void *p, size_t n);
/* Keep only the first n readable bytes (drop a partly written record);
 * n >= buf_len(b) changes nothing. */
void buf_truncate(struct buf *b, size_t n);
/* Drop n bytes from the front. */
int buf_consume(struct buf *b, size_t n);

/* Big-endian integers in a fixed-size array the caller has checked the
 * size of (a frame header, a record prefix): the only place outside the
 * wire module that spells out byte order. Prefer the buf_put / buf_get
 * calls above for anything variable. */
static inline void buf_store_be16(uint8_t d[2], uint16_t v)
{
	d[0] = (uint8_t)(v >> 8);
	d[1] = (uint8_t)v;
}
static inline void buf_store_be32(uint8_t d[4], uint32_t v)
{
	d[0] = (uint8_t)(v >> 24);
	d[1] = (uint8_t)(v >> 16);
	d[2] = (uint8_t)(v >> 8);
	d[3] = (uint8_t)v;
}
static inline void buf_store_be64(uint8_t d[8], uint64_t v)
{
	buf_store_be32(d, (uint32_t)(v >> 32));
	buf_store_be32(d + 4, (uint32_t)v);
}
static inline uint16_t buf_load_be16(const uint8_t p[2])
{
	return (uint16_t)((uint16_t)p[0] << 8 | p[1]);
}
static inline uint32_t buf_load_be32(const uint8_t p[4])
{
	return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}
static inline uint64_t buf_load_be64(const uint8_t p[8])
{
	return (uint64_t)buf_load_be32(p) << 32 | buf_load_be32(p + 4);
}

#endif
