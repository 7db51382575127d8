/* SPDX-License-Identifier: Apache-2.0 */
#include "airlock/core/buf.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "airlock/core/mem.h"

void buf_init(struct buf *b, size_t max)
{
	memset(b, 0, sizeof(*b));
	b->max = max < BUF_HARD_MAX ? max : BUF_HARD_MAX;
}

void buf_view(struct buf *b, const void *p, size_t n)
{
	memset(b, 0, sizeof(*b));
	b->data = (uint8_t *)p; /* never written through: view is read-only */
	b->len = n;
	b->max = n;
	b->view = true;
}

void buf_clear(struct buf *b)
{
	if (!b->view && b->data) {
		sodium_memzero(b->data, b->cap);
		mem_free(b->data);
	}
	size_t max = b->max;
	memset(b, 0, sizeof(*b));
	b->max = max;
}

void buf_reset(struct buf *b)
{
	if (b->view) {
		b->off = b->len;
		return;
	}
	b->off = b->len = 0;
}

int buf_reserve(struct buf *b, size_t n, uint8_t **out)
{
	size_t used = b->len - b->off;

	if (b->view)
		return -EROFS;
	if (n > b->max || used > b->max - n)
		return -ENOBUFS;
	if (b->cap - b->len >= n) {
		*out = b->data + b->len;
		return 0;
	}
	/* Compact first: consumed space at the front is free room. */
	if (b->off > 0) {
		memmove(b->data, b->data + b->off, used);
		b->off = 0;
		b->len = used;
		if (b->cap - b->len >= n) {
			*out = b->data + b->len;
			return 0;
		}
	}
	size_t want = used + n;
	size_t ncap = b->cap ? b->cap : 256;
	while (ncap < want)
		ncap = ncap > SIZE_MAX / 2 ? want : ncap * 2;
	if (ncap > b->max)
		ncap = b->max;
	uint8_t *nd = mem_alloc(ncap);
	if (!nd)
		return -ENOMEM;
	if (b->data) {
		memcpy(nd, b->data, b->len);
		sodium_memzero(b->data, b->cap);
		mem_free(b->data);
	}
	b->data = nd;
	b->cap = ncap;
	*out = b->data + b->len;
	return 0;
}

void buf_commit(struct buf *b, size_t n)
{
	/* Our own bug if this fires: commit more than reserved. */
	if (n > b->cap - b->len)
		abort();
	b->len += n;
}

int buf_put(struct buf *b, const void *p, size_t n)
{
	uint8_t *d;
	int r;

	if (n == 0)
		return b->view ? -EROFS : 0;
	if ((r = buf_reserve(b, n, &d)) < 0)
		return r;
	memcpy(d, p, n);
	b->len += n;
	return 0;
}

int buf_put_u8(struct buf *b, uint8_t v)
{
	return buf_put(b, &v, 1);
}

int buf_put_u16(struct buf *b, uint16_t v)
{
	uint8_t d[2] = {(uint8_t)(v >> 8), (uint8_t)v};
	return buf_put(b, d, 2);
}

int buf_put_u32(struct buf *b, uint32_t v)
{
	uint8_t d[4] = {(uint8_t)(v >> 24), (uint8_t)(v >> 16), (uint8_t)(v >> 8), (uint8_t)v};
	return buf_put(b, d, 4);
}

int buf_put_u64(struct buf *b, uint64_t v)
{
	uint8_t d[8];
	for (int i = 0; i < 8; i++)
		d[i] = (uint8_t)(v >> (56 - 8 * i));
	return buf_put(b, d, 8);
}

int buf_put_bytes(struct buf *b, const void *p, size_t n)
{
	uint8_t *d;
	int r;

	if (n > UINT32_MAX || n > SIZE_MAX - 4)
		return -ENOBUFS;
	if ((r = buf_reserve(b, n + 4, &d)) < 0)
		return r;
	d[0] = (uint8_t)(n >> 24);
	d[1] = (uint8_t)(n >> 16);
	d[2] = (uint8_t)(n >> 8);
	d[3] = (uint8_t)n;
	if (n)
		memcpy(d + 4, p, n);
	b->len += n + 4;
	return 0;
}

int buf_put_str(struct buf *b, const char *s)
{
	return buf_put_bytes(b, s, strlen(s));
}

int buf_get(struct buf *b, void *p, size_t n)
{
	if (buf_len(b) < n)
		return -EBADMSG;
	if (n)
		memcpy(p, b->data + b->off, n);
	b->off += n;
	return 0;
}

int buf_get_u8(struct buf *b, uint8_t *v)
{
	return buf_get(b, v, 1);
}

int buf_get_u16(struct buf *b, uint16_t *v)
{
	uint8_t d[2];
	int r = buf_get(b, d, 2);
	if (r == 0)
		*v = (uint16_t)((d[0] << 8) | d[1]);
	return r;
}

int buf_peek_u32(const struct buf *b, size_t at, uint32_t *v)
{
	if (buf_len(b) < 4 || at > buf_len(b) - 4)
		return -EBADMSG;
	*v = buf_load_be32(b->data + b->off + at);
	return 0;
}

int buf_poke_u32(struct buf *b, size_t at, uint32_t v)
{
	if (b->view)
		return -EROFS;
	if (buf_len(b) < 4 || at > buf_len(b) - 4)
		return -EBADMSG;
	buf_store_be32(b->data + b->off + at, v);
	return 0;
}

int buf_poke(struct buf *b, size_t at, const void *p, size_t n)
{
	if (b->view)
		return -EROFS;
	if (buf_len(b) < n || at > buf_len(b) - n)
		return -EBADMSG;
	if (n)
		memcpy(b->data + b->off + at, p, n);
	return 0;
}

int buf_poke_u64(struct buf *b, size_t at, uint64_t v)
{
	uint8_t d[8];

	buf_store_be64(d, v);
	return buf_poke(b, at, d, sizeof(d));
}

void buf_truncate(struct buf *b, size_t n)
{
	if (n < buf_len(b))
		b->len = b->off + n;
}

int buf_poke_u8(struct buf *b, size_t at, uint8_t v)
{
	if (b->view)
		return -EROFS;
	if (at >= buf_len(b))
		return -EBADMSG;
	b->data[b->off + at] = v;
	return 0;
}

int buf_get_u32(struct buf *b, uint32_t *v)
{
	int r = buf_peek_u32(b, 0, v);
	if (r == 0)
		b->off += 4;
	return r;
}

int buf_get_u64(struct buf *b, uint64_t *v)
{
	uint8_t d[8];
	int r = buf_get(b, d, 8);
	if (r == 0) {
		uint64_t x = 0;
		for (int i = 0; i < 8; i++)
			x = (x << 8) | d[i];
		*v = x;
	}
	return r;
}

int buf_get_bytes(struct buf *b, const uint8_t **p, size_t *n, size_t limit)
{
	uint32_t len;
	int r;

	if ((r = buf_peek_u32(b, 0, &len)) < 0)
		return r;
	if (len > limit || len > buf_len(b) - 4)
		return -EBADMSG;
	*p = b->data + b->off + 4;
	*n = len;
	b->off += 4 + (size_t)len;
	return 0;
}

int buf_get_str(struct buf *b, char **s, size_t limit)
{
	const uint8_t *p;
	size_t n;
	size_t save = b->off;
	int r;

	if ((r = buf_get_bytes(b, &p, &n, limit)) < 0)
		return r;
	if (memchr(p, 0, n)) {
		b->off = save;
		return -EBADMSG;
	}
	char *d = mem_alloc(n + 1);
	if (!d) {
		b->off = save;
		return -ENOMEM;
	}
	memcpy(d, p, n);
	d[n] = '\0';
	*s = d;
	return 0;
}

int buf_consume(struct buf *b, size_t n)
{
	if (buf_len(b) < n)
		return -EBADMSG;
	b->off += n;
	if (!b->view && b->off == b->len)
		b->off = b->len = 0;
	return 0;
}
