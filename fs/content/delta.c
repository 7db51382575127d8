/* SPDX-License-Identifier: Apache-2.0 */
/*
 * delta: building, signing, verifying and parsing delta batches.
 * Contract in include/airlock/content/delta.h; byte layout in doc/SYNC.md.
 */
#include "airlock/content/delta.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>
#include <zstd.h>

#include "airlock/core/buf.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/mem.h"

/* CHANGE DELTA_VERSION (delta.h) IF ANY OF THIS CHANGES. */
static const uint8_t delta_magic[4] = {'A', 'L', 'D', 'B'};
#define CHUNK_HDR (1 + 4 + CHUNK_HASH_LEN) /* kind, raw_len, hash */
/* Smallest possible op (DELETE of a 1-byte path) and chunk (a REF):
 * counts are checked against what the bytes could hold before parsing. */
#define OP_MIN	  (1 + 4 + 1 + 1)
#define CHUNK_MIN (CHUNK_HDR + 1)
/* zstd frames we accept never need a larger window than a chunk. */
#define ZSTD_WINDOW_LOG_MAX 23

_Static_assert(CHUNK_SIZE_LIMIT <= (1u << ZSTD_WINDOW_LOG_MAX), "window cap below chunk cap");
_Static_assert(DELTA_HDR_LEN == 52, "header layout");

const struct delta_caps delta_caps_default = {
    .max_batch = 64u * 1024u * 1024u,
    .max_ops = 65536,
    .max_chunks = 262144,
    .max_chunk = CHUNK_SIZE_LIMIT,
    .max_file = 1ull << 40,
};

static const char *op_name(uint8_t t)
{
	static const char *const names[] = {
	    [DELTA_MKDIR] = "MKDIR", [DELTA_PUT] = "PUT",	[DELTA_SYMLINK] = "SYMLINK",
	    [DELTA_CHMOD] = "CHMOD", [DELTA_DELETE] = "DELETE",
	};
	return t < sizeof(names) / sizeof(names[0]) && names[t] ? names[t] : "?";
}

static int caps_check(const struct delta_caps *c)
{
	if (c->max_batch < DELTA_HDR_LEN + DELTA_SIG_LEN || c->max_chunk == 0 || c->max_chunk > CHUNK_SIZE_LIMIT ||
	    c->max_ops == 0)
		return -EINVAL;
	return 0;
}

/* ---- builder ---- */

struct delta_builder {
	uint64_t seq;
	uint8_t scope[DELTA_SCOPE_LEN];
	struct chunk_params cp;
	struct delta_caps caps;
	int level;
	ZSTD_CCtx *cctx;
	/* the batch as built: empty, or DELTA_HDR_LEN bytes for the header
	 * (filled by finish) and the ops; never consumed, so offsets are
	 * stable. finish hands this storage over (no copy of the batch). */
	struct buf body;
	uint32_t nops, nchunks;
	/* the PUT being built */
	bool in_put;
	size_t put_mark;    /* body length before the op (to drop it) */
	size_t put_fix;	    /* offset of u64 size, hash */
	size_t put_nch_off; /* offset of u32 nchunks */
	uint32_t put_nchunks, put_chunks_before;
	uint64_t put_size;
};

int delta_builder_new(uint64_t seq, const uint8_t scope[DELTA_SCOPE_LEN], const struct chunk_params *chunking,
		      const struct delta_caps *caps, struct delta_builder **out)
{
	struct delta_builder *b;

	if (!caps)
		caps = &delta_caps_default;
	if (!chunking)
		chunking = &chunk_params_default;
	if (caps_check(caps) < 0 || chunk_params_check(chunking) < 0 || chunking->max > caps->max_chunk)
		return -EINVAL;
	if (sodium_init() < 0)
		return -EIO;
	if (!(b = mem_calloc(1, sizeof(*b))))
		return -ENOMEM;
	b->seq = seq;
	memcpy(b->scope, scope, DELTA_SCOPE_LEN);
	b->cp = *chunking;
	b->caps = *caps;
	b->level = 1;
	buf_init(&b->body, caps->max_batch - DELTA_SIG_LEN);
	*out = b;
	return 0;
}

void delta_builder_free(struct delta_builder *b)
{
	if (!b)
		return;
	buf_clear(&b->body);
	ZSTD_freeCCtx(b->cctx);
	mem_free(b);
}

void delta_builder_set_level(struct delta_builder *b, int level)
{
	b->level = level;
}

int delta_builder_level(const struct delta_builder *b)
{
	return b->level;
}

void delta_builder_reset(struct delta_builder *b, uint64_t seq)
{
	buf_reset(&b->body);
	b->seq = seq;
	b->nops = b->nchunks = 0;
	b->in_put = false;
}

size_t delta_builder_ops(const struct delta_builder *b)
{
	return b->nops;
}

size_t delta_builder_size(const struct delta_builder *b)
{
	return (buf_len(&b->body) ? buf_len(&b->body) : DELTA_HDR_LEN) + DELTA_SIG_LEN;
}

/* Drop everything written since `mark` (an op that did not fit). The body
 * is never consumed from, so shortening its end is safe. */
static void body_truncate(struct delta_builder *b, size_t mark)
{
	b->body.len = mark;
}

/* Room for the header before the first op. */
static int body_header(struct delta_builder *b)
{
	static const uint8_t room[DELTA_HDR_LEN];

	return buf_len(&b->body) ? 0 : buf_put(&b->body, room, sizeof(room));
}

static int check_path(const char *p)
{
	return p ? manifest_path_check(p, strlen(p)) : -EINVAL;
}

static int op_start(struct delta_builder *b, uint8_t type, const char *path)
{
	int r;

	if (b->in_put)
		return -EINVAL;
	if ((r = check_path(path)) < 0)
		return r;
	if (b->nops >= b->caps.max_ops)
		return -ENOBUFS; /* full: finish this batch, start the next */
	if ((r = body_header(b)) < 0)
		return r;
	if ((r = buf_put_u8(&b->body, type)) < 0)
		return r;
	return buf_put_str(&b->body, path);
}

static int op_simple(struct delta_builder *b, uint8_t type, const char *path, int (*tail)(struct buf *, const void *),
		     const void *arg)
{
	size_t mark = buf_len(&b->body);
	int r;

	if ((r = op_start(b, type, path)) < 0 || (r = tail(&b->body, arg)) < 0) {
		if (r != -EINVAL)
			body_truncate(b, mark);
		return r;
	}
	b->nops++;
	return 0;
}

static int tail_mode(struct buf *o, const void *arg)
{
	return buf_put_u32(o, *(const uint32_t *)arg);
}

static int tail_str(struct buf *o, const void *arg)
{
	return buf_put_str(o, arg);
}

static int tail_flags(struct buf *o, const void *arg)
{
	return buf_put_u8(o, *(const uint8_t *)arg);
}

int delta_add_mkdir(struct delta_builder *b, const char *path, uint32_t mode)
{
	if (mode & ~MANIFEST_MODE_MASK)
		return -EINVAL;
	return op_simple(b, DELTA_MKDIR, path, tail_mode, &mode);
}

int delta_add_chmod(struct delta_builder *b, const char *path, uint32_t mode)
{
	if (mode & ~MANIFEST_MODE_MASK)
		return -EINVAL;
	return op_simple(b, DELTA_CHMOD, path, tail_mode, &mode);
}

int delta_add_symlink(struct delta_builder *b, const char *path, const char *target)
{
	size_t tl = target ? strlen(target) : 0;
	if (tl == 0 || tl > MANIFEST_TARGET_MAX)
		return -EINVAL;
	return op_simple(b, DELTA_SYMLINK, path, tail_str, target);
}

int delta_add_delete(struct delta_builder *b, const char *path, uint8_t flags)
{
	if (flags & ~DELTA_DELETE_TREE)
		return -EINVAL;
	return op_simple(b, DELTA_DELETE, path, tail_flags, &flags);
}

static void put_drop(struct delta_builder *b)
{
	if (!b->in_put)
		return;
	body_truncate(b, b->put_mark);
	b->nchunks = b->put_chunks_before;
	b->in_put = false;
}

int delta_put_begin(struct delta_builder *b, const char *path, uint32_t mode, const char *base)
{
	static const uint8_t zero[8 + CHUNK_HASH_LEN];
	size_t mark = buf_len(&b->body);
	int r;

	if (mode & ~MANIFEST_MODE_MASK || (base && check_path(base) < 0))
		return -EINVAL;
	if (base && strcmp(base, path) == 0)
		base = NULL;
	if ((r = op_start(b, DELTA_PUT, path)) < 0)
		goto fail;
	if ((r = buf_put_u32(&b->body, mode)) < 0)
		goto fail;
	b->put_fix = buf_len(&b->body);
	if ((r = buf_put(&b->body, zero, sizeof(zero))) < 0 || (r = buf_put_str(&b->body, base ? base : "")) < 0)
		goto fail;
	b->put_nch_off = buf_len(&b->body);
	if ((r = buf_put_u32(&b->body, 0)) < 0)
		goto fail;
	b->in_put = true;
	b->put_mark = mark;
	b->put_nchunks = 0;
	b->put_chunks_before = b->nchunks;
	b->put_size = 0;
	return 0;
fail:
	if (r != -EINVAL)
		body_truncate(b, mark);
	return r;
}

static int put_chunk_room(struct delta_builder *b, size_t len)
{
	if (!b->in_put)
		return -EINVAL;
	if (len == 0 || len > b->caps.max_chunk) {
		put_drop(b);
		return -EINVAL;
	}
	if (b->nchunks >= b->caps.max_chunks || len > b->caps.max_file - b->put_size) {
		put_drop(b);
		return -ENOBUFS;
	}
	return 0;
}

static void put_chunk_hdr(uint8_t *d, uint8_t kind, uint32_t len, const uint8_t hash[CHUNK_HASH_LEN])
{
	d[0] = kind;
	buf_store_be32(d + 1, len);
	memcpy(d + 5, hash, CHUNK_HASH_LEN);
}

/* The record of one inline chunk of data[0..len) (hash given) written at
 * d, which has room for DELTA_CHUNK_REC_MAX(len) bytes: zstd at `level`
 * when that makes it shorter (a frame that does not fit in len bytes does
 * not), raw otherwise; its length. The one encoder of inline chunks, for
 * the builder's body and for records made off it (delta_chunk_encode). */
static size_t chunk_encode(ZSTD_CCtx *cctx, int level, const void *data, size_t len, const uint8_t hash[CHUNK_HASH_LEN],
			   uint8_t *d)
{
	size_t cs = ZSTD_compressCCtx(cctx, d + CHUNK_HDR + 4, len, data, len, level);

	if (!ZSTD_isError(cs) && cs < len) {
		put_chunk_hdr(d, DELTA_CHUNK_ZSTD, (uint32_t)len, hash);
		buf_store_be32(d + CHUNK_HDR, (uint32_t)cs);
		return CHUNK_HDR + 4 + cs;
	}
	put_chunk_hdr(d, DELTA_CHUNK_RAW, (uint32_t)len, hash);
	memcpy(d + CHUNK_HDR, data, len);
	return CHUNK_HDR + len;
}

static void put_chunk_added(struct delta_builder *b, size_t len)
{
	b->put_nchunks++;
	b->nchunks++;
	b->put_size += len;
}

int delta_put_inline(struct delta_builder *b, const void *data, size_t len)
{
	uint8_t hash[CHUNK_HASH_LEN], *d;
	int r;

	if ((r = put_chunk_room(b, len)) < 0)
		return r;
	chunk_hash(data, len, hash);
	if (!b->cctx && !(b->cctx = ZSTD_createCCtx())) {
		put_drop(b);
		return -ENOMEM;
	}
	/* straight into the batch */
	if ((r = buf_reserve(&b->body, DELTA_CHUNK_REC_MAX(len), &d)) < 0) {
		put_drop(b);
		return r;
	}
	buf_commit(&b->body, chunk_encode(b->cctx, b->level, data, len, hash, d));
	put_chunk_added(b, len);
	return 0;
}

struct delta_cctx {
	ZSTD_CCtx *z;
};

struct delta_cctx *delta_cctx_new(void)
{
	struct delta_cctx *c = mem_calloc(1, sizeof(*c));

	if (c && !(c->z = ZSTD_createCCtx())) {
		mem_free(c);
		return NULL;
	}
	return c;
}

void delta_cctx_free(struct delta_cctx *c)
{
	if (!c)
		return;
	ZSTD_freeCCtx(c->z);
	mem_free(c);
}

int delta_chunk_encode(struct delta_cctx *c, int level, const void *data, size_t len,
		       const uint8_t hash[CHUNK_HASH_LEN], uint8_t *out, size_t *n)
{
	_Static_assert(DELTA_CHUNK_REC_MAX(0) == CHUNK_HDR + 4, "record bound");
	if (len == 0 || len > CHUNK_SIZE_LIMIT)
		return -EINVAL;
	*n = chunk_encode(c->z, level, data, len, hash, out);
	return 0;
}

int delta_put_encoded(struct delta_builder *b, const uint8_t *rec, size_t n)
{
	uint8_t *d;
	int r;

	/* our own record (delta_chunk_encode): its shape is asserted, not parsed */
	assert(n > CHUNK_HDR && (rec[0] == DELTA_CHUNK_RAW || rec[0] == DELTA_CHUNK_ZSTD));
	uint32_t len = buf_load_be32(rec + 1);
	assert(rec[0] == DELTA_CHUNK_RAW
		   ? n == CHUNK_HDR + (size_t)len
		   : n > CHUNK_HDR + 4 && n == CHUNK_HDR + 4 + (size_t)buf_load_be32(rec + CHUNK_HDR));
	if ((r = put_chunk_room(b, len)) < 0)
		return r;
	if ((r = buf_reserve(&b->body, n, &d)) < 0) {
		put_drop(b);
		return r;
	}
	memcpy(d, rec, n);
	buf_commit(&b->body, n);
	put_chunk_added(b, len);
	return 0;
}

int delta_put_ref(struct delta_builder *b, uint64_t off, uint32_t len, const uint8_t hash[CHUNK_HASH_LEN])
{
	uint8_t *d;
	int r;

	if ((r = put_chunk_room(b, len)) < 0)
		return r;
	if (off > UINT64_MAX - len) {
		put_drop(b);
		return -EINVAL;
	}
	if ((r = buf_reserve(&b->body, CHUNK_HDR + 8, &d)) < 0) {
		put_drop(b);
		return r;
	}
	put_chunk_hdr(d, DELTA_CHUNK_REF, len, hash);
	buf_store_be64(d + CHUNK_HDR, off);
	buf_commit(&b->body, CHUNK_HDR + 8);
	put_chunk_added(b, len);
	return 0;
}

int delta_put_end(struct delta_builder *b, const uint8_t file_hash[CHUNK_HASH_LEN])
{
	if (!b->in_put)
		return -EINVAL;
	/* the size, hash and chunk count delta_put_begin left room for */
	if (buf_poke_u64(&b->body, b->put_fix, b->put_size) < 0 ||
	    buf_poke(&b->body, b->put_fix + 8, file_hash, CHUNK_HASH_LEN) < 0 ||
	    buf_poke_u32(&b->body, b->put_nch_off, (uint32_t)b->put_nchunks) < 0)
		return -EINVAL; /* our own bug: the room is always there */
	b->in_put = false;
	b->nops++;
	return 0;
}

/* What the guest has, looked up by (hash, length). */
struct have {
	struct chunk *v;
	size_t n;
};

static int chunk_cmp(const void *a, const void *b)
{
	const struct chunk *x = a, *y = b;
	int c = memcmp(x->hash, y->hash, CHUNK_HASH_LEN);
	if (c)
		return c;
	return x->len < y->len ? -1 : x->len > y->len;
}

static int have_init(struct have *h, const struct manifest_entry *e, uint32_t max_chunk)
{
	h->v = NULL;
	h->n = 0;
	if (!e || e->type != MANIFEST_FILE || e->size == 0)
		return 0;
	size_t n = e->nchunks ? e->nchunks : 1;
	if (!e->nchunks && e->size > max_chunk)
		return 0; /* only its whole hash is known: nothing to refer to */
	if (!(h->v = mem_calloc(n, sizeof(struct chunk))))
		return -ENOMEM;
	if (e->nchunks) {
		memcpy(h->v, e->chunks, n * sizeof(struct chunk));
	} else {
		h->v[0].off = 0;
		h->v[0].len = (uint32_t)e->size;
		memcpy(h->v[0].hash, e->hash, CHUNK_HASH_LEN);
	}
	h->n = n;
	qsort(h->v, n, sizeof(struct chunk), chunk_cmp);
	return 0;
}

struct put_ctx {
	struct delta_builder *b;
	struct have have;
};

static int put_each(void *ud, const struct chunk *c, const uint8_t *data)
{
	struct put_ctx *p = ud;
	const struct chunk *hit = p->have.n ? bsearch(c, p->have.v, p->have.n, sizeof(struct chunk), chunk_cmp) : NULL;

	if (hit)
		return delta_put_ref(p->b, hit->off, hit->len, hit->hash);
	return delta_put_inline(p->b, data, c->len);
}

int delta_put_file(struct delta_builder *b, const char *path, uint32_t mode, int fd, const char *base,
		   const struct manifest_entry *have, struct manifest_entry *made)
{
	struct put_ctx p = {.b = b};
	struct chunk *chunks = NULL;
	size_t nch = 0;
	uint8_t fh[CHUNK_HASH_LEN];
	struct stat st;
	int r;

	if (fstat(fd, &st) < 0)
		return -errno;
	if (!S_ISREG(st.st_mode))
		return -ESTALE;
	if ((uint64_t)st.st_size > b->caps.max_file)
		return -EMSGSIZE;
	if (made) {
		memset(made, 0, sizeof(*made));
		if (!(made->path = mem_strdup(path)))
			return -ENOMEM;
	}
	if ((r = have_init(&p.have, have, b->caps.max_chunk)) < 0)
		goto out;
	if ((r = delta_put_begin(b, path, mode, base)) < 0)
		goto out;
	r = chunk_file(&b->cp, chunk_read_fd, &fd, (uint64_t)st.st_size, put_each, &p, &chunks, &nch, fh);
	if (r < 0) {
		put_drop(b);
		goto out;
	}
	if ((r = delta_put_end(b, fh)) < 0)
		goto out;
	if (made) {
		made->type = MANIFEST_FILE;
		made->mode = mode;
		made->size = (uint64_t)st.st_size;
		memcpy(made->hash, fh, CHUNK_HASH_LEN);
		if (made->size > b->cp.whole_max) {
			made->chunks = chunks;
			made->nchunks = nch;
			chunks = NULL;
		}
	}
out:
	if (r < 0 && made)
		manifest_entry_clear(made);
	mem_free(chunks);
	mem_free(p.have.v);
	return r;
}

int delta_put_chunks(struct delta_builder *b, const char *path, uint32_t mode, int fd, const char *base,
		     const struct manifest_entry *have, const struct chunk *list, size_t n, uint64_t size,
		     uint64_t *read_bytes)
{
	struct have h = {0};
	uint8_t fh[CHUNK_HASH_LEN], ch[CHUNK_HASH_LEN];
	uint8_t *scratch = NULL;
	uint64_t sum = 0;
	int r;

	if (size > b->caps.max_file)
		return -EMSGSIZE;
	if (chunk_list_check(&b->cp, list, n, size) < 0)
		return -EINVAL;
	for (size_t i = 0; i < n; i++)
		sum += list[i].len;
	if (sum != size)
		return -EINVAL;
	if ((r = have_init(&h, have, b->caps.max_chunk)) < 0)
		return r;
	if ((r = delta_put_begin(b, path, mode, base)) < 0)
		goto out;
	for (size_t i = 0; i < n && r == 0; i++) {
		const struct chunk *c = &list[i];
		const struct chunk *hit = h.n ? bsearch(c, h.v, h.n, sizeof(struct chunk), chunk_cmp) : NULL;
		if (hit) {
			r = delta_put_ref(b, hit->off, hit->len, hit->hash);
			continue;
		}
		if (!scratch && !(scratch = mem_alloc(b->cp.max))) {
			r = -ENOMEM;
			break;
		}
		if ((r = chunk_read_fd(&fd, c->off, scratch, c->len)) < 0)
			break;
		if (read_bytes)
			*read_bytes += c->len;
		chunk_hash(scratch, c->len, ch);
		if (memcmp(ch, c->hash, CHUNK_HASH_LEN) != 0) {
			r = -ESTALE; /* the file changed after its list was made */
			break;
		}
		r = delta_put_inline(b, scratch, c->len);
	}
	if (r < 0) {
		put_drop(b);
		goto out;
	}
	chunk_list_hash(list, n, fh);
	r = delta_put_end(b, fh);
out:
	mem_free(scratch);
	mem_free(h.v);
	return r;
}

int delta_add_change(struct delta_builder *b, int host_dirfd, const struct manifest_change *c)
{
	const struct manifest_entry *o = c->old, *n = c->new;
	int r;

	switch (c->kind) {
	case MANIFEST_REMOVE:
		if (!o)
			return -EINVAL;
		/* A directory replaced by something else must go with whatever
		 * the guest keeps in it; otherwise unmanaged files keep it. */
		return delta_add_delete(
		    b, o->path, o->type == MANIFEST_DIR && n && n->type != MANIFEST_DIR ? DELTA_DELETE_TREE : 0);
	case MANIFEST_MODE:
		if (!n || n->type == MANIFEST_SYMLINK)
			return -EINVAL;
		return delta_add_chmod(b, n->path, n->mode);
	case MANIFEST_ADD:
	case MANIFEST_MODIFY:
		if (!n)
			return -EINVAL;
		break;
	default:
		return -EINVAL;
	}
	switch (n->type) {
	case MANIFEST_DIR:
		return delta_add_mkdir(b, n->path, n->mode);
	case MANIFEST_SYMLINK:
		if (!n->target)
			return -EINVAL;
		return delta_add_symlink(b, n->path, n->target);
	case MANIFEST_FILE: {
		int fd = manifest_open_beneath(host_dirfd, n->path, O_RDONLY | O_NONBLOCK | O_NOCTTY, false);
		if (fd < 0)
			return fd == -ELOOP ? -ESTALE : fd;
		r = delta_put_file(b, n->path, n->mode, fd, NULL, o && o->type == MANIFEST_FILE ? o : NULL, NULL);
		close(fd);
		return r;
	}
	default:
		return -EINVAL;
	}
}

/* The signed message: a label and BLAKE2b-256 of the batch (doc/SYNC.md
 * §4 "Signature"). Ed25519 hashes its message twice with SHA-512 when
 * signing and once when verifying; over a digest that is 80 bytes instead
 * of megabytes, and one BLAKE2b pass replaces them. */
static void sign_msg(const uint8_t *p, size_t n, uint8_t m[DELTA_SIGMSG_LEN])
{
	static const char label[] = DELTA_SIG_LABEL;

	_Static_assert(sizeof(label) - 1 + crypto_generichash_BYTES == DELTA_SIGMSG_LEN, "signed message layout");
	memcpy(m, label, sizeof(label) - 1);
	crypto_generichash(m + sizeof(label) - 1, crypto_generichash_BYTES, p, n, NULL, 0);
}

void delta_sign(const uint8_t *p, size_t n, const uint8_t sk[DELTA_SK_LEN], uint8_t sig[DELTA_SIG_LEN])
{
	uint8_t m[DELTA_SIGMSG_LEN];

	sign_msg(p, n, m);
	crypto_sign_detached(sig, NULL, m, sizeof(m), sk);
}

int delta_sign_verify(const uint8_t *p, size_t n, const uint8_t pk[DELTA_PK_LEN], const uint8_t sig[DELTA_SIG_LEN])
{
	uint8_t m[DELTA_SIGMSG_LEN];

	sign_msg(p, n, m);
	return crypto_sign_verify_detached(sig, m, sizeof(m), pk) == 0 ? 0 : -EPERM;
}

int delta_builder_finish(struct delta_builder *b, const uint8_t sk[DELTA_SK_LEN], uint8_t **out, size_t *n)
{
	uint8_t *d;
	int r;

	if (b->in_put)
		return -EINVAL;
	if ((r = body_header(b)) < 0 || (r = buf_reserve(&b->body, DELTA_SIG_LEN, &d)) < 0)
		return r;
	size_t body = buf_len(&b->body) - DELTA_HDR_LEN;
	d = b->body.data; /* owned, never consumed: off is 0 */
	/* header: magic, version, flags, reserved, scope, seq, op count */
	memcpy(d, delta_magic, 4);
	d[4] = DELTA_VERSION;
	d[5] = 0;
	d[6] = d[7] = 0;
	memcpy(d + 8, b->scope, DELTA_SCOPE_LEN);
	buf_store_be64(d + 8 + DELTA_SCOPE_LEN, b->seq);
	buf_store_be32(d + 16 + DELTA_SCOPE_LEN, (uint32_t)b->nops);
	delta_sign(d, DELTA_HDR_LEN + body, sk, d + DELTA_HDR_LEN + body);
	/* the storage is the caller's now; the next batch grows its own */
	size_t max = b->body.max;
	memset(&b->body, 0, sizeof(b->body));
	buf_init(&b->body, max);
	*out = d;
	*n = DELTA_HDR_LEN + body + DELTA_SIG_LEN;
	return 0;
}

/* ---- verifying ---- */

struct delta_batch {
	uint64_t seq;
	struct delta_op *ops;
	size_t nops;
	struct delta_chunk *chunks;
	size_t nchunks;
	char *strings;
	uint32_t chunk_max; /* largest raw_len */
	ZSTD_DCtx *dctx;
};

void delta_batch_free(struct delta_batch *b)
{
	if (!b)
		return;
	mem_free(b->ops);
	mem_free(b->chunks);
	mem_free(b->strings);
	ZSTD_freeDCtx(b->dctx);
	mem_free(b);
}

uint64_t delta_batch_seq(const struct delta_batch *b)
{
	return b->seq;
}

size_t delta_batch_count(const struct delta_batch *b)
{
	return b->nops;
}

const struct delta_op *delta_batch_op(const struct delta_batch *b, size_t i)
{
	return i < b->nops ? &b->ops[i] : NULL;
}

uint32_t delta_batch_chunk_max(const struct delta_batch *b)
{
	return b->chunk_max;
}

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static void
say(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;
	va_start(ap, fmt);
	errmsg_vset(err, errlen, NULL, fmt, ap);
	va_end(ap);
}

/* Parser state shared by both passes. In pass 1 (`fill` false) nothing is
 * allocated or stored: it checks structure and sizes what pass 2 needs. */
struct parse {
	struct buf in;
	const struct delta_caps *caps;
	bool fill;
	bool defer; /* pass 2 leaves inline content to delta_chunk_data */
	struct delta_batch *b;
	size_t nchunks;	    /* pass 1: total; pass 2: next free */
	size_t strbytes;    /* pass 1: total; pass 2: next free */
	uint32_t zstd_max;  /* largest raw_len of a ZSTD chunk */
	uint32_t chunk_max; /* largest raw_len of any chunk */
	uint8_t *scratch;
	char *err;
	size_t errlen;
	uint32_t opi;
	const char *what; /* op name for messages */
	char pathbuf[96]; /* start of the current op's path, for messages */
};

#define FAIL(ps, code, ...)                                                                                            \
	do {                                                                                                           \
		char m_[160];                                                                                          \
		snprintf(m_, sizeof(m_), __VA_ARGS__);                                                                 \
		say((ps)->err, (ps)->errlen, "op %u (%s %s): %s", (ps)->opi, (ps)->what, (ps)->pathbuf, m_);           \
		return (code);                                                                                         \
	} while (0)

static int get_string(struct parse *ps, size_t limit, bool path, bool may_be_empty, const char **out)
{
	const uint8_t *s;
	size_t n;

	*out = NULL;
	if (buf_get_bytes(&ps->in, &s, &n, limit) < 0) {
		uint32_t want;
		if (buf_peek_u32(&ps->in, 0, &want) == 0 && want > limit)
			FAIL(ps, -EBADMSG, "%s of %u bytes is over the limit of %zu", path ? "path" : "target", want,
			     limit);
		FAIL(ps, -EBADMSG, "truncated");
	}
	if (n == 0 && may_be_empty)
		return 0;
	if (path) {
		int r = manifest_path_check((const char *)s, n);
		if (r < 0)
			FAIL(ps, -EBADMSG,
			     "%s path (absolute, empty or '.'/'..' component, NUL, reserved name or too long)",
			     r == -ENAMETOOLONG ? "over-long" : "invalid");
	} else if (n == 0 || memchr(s, '\0', n)) {
		FAIL(ps, -EBADMSG, "empty target or NUL in target");
	}
	if (!ps->fill) {
		ps->strbytes += n + 1;
		return 0;
	}
	char *d = ps->b->strings + ps->strbytes;
	memcpy(d, s, n);
	d[n] = '\0';
	ps->strbytes += n + 1;
	*out = d;
	return 0;
}

static int get_mode(struct parse *ps, uint32_t *mode)
{
	if (buf_get_u32(&ps->in, mode) < 0)
		FAIL(ps, -EBADMSG, "truncated");
	if (*mode & ~MANIFEST_MODE_MASK)
		FAIL(ps, -EBADMSG, "mode %#o has bits outside 0777 (setuid/setgid/sticky/type are never sent)", *mode);
	return 0;
}

static int zstd_frame_check(struct parse *ps, const uint8_t *p, size_t n, uint32_t raw_len, uint32_t ci)
{
	unsigned long long fcs = ZSTD_getFrameContentSize(p, n);
	if (fcs == ZSTD_CONTENTSIZE_UNKNOWN || fcs == ZSTD_CONTENTSIZE_ERROR)
		FAIL(ps, -EBADMSG, "chunk %u: zstd frame without a content size", ci);
	if (fcs != raw_len)
		FAIL(ps, -EBADMSG, "chunk %u: zstd frame claims %llu bytes, chunk %u", ci, fcs, raw_len);
	size_t fs = ZSTD_findFrameCompressedSize(p, n);
	if (ZSTD_isError(fs) || fs != n)
		FAIL(ps, -EBADMSG, "chunk %u: not exactly one zstd frame", ci);
	return 0;
}

static int chunk_bytes(ZSTD_DCtx *dctx, const struct delta_chunk *c, uint8_t *scratch, const uint8_t **out)
{
	if (c->kind == DELTA_CHUNK_RAW) {
		*out = c->data;
	} else if (c->kind == DELTA_CHUNK_ZSTD) {
		size_t k = ZSTD_decompressDCtx(dctx, scratch, c->raw_len, c->data, c->data_len);
		if (ZSTD_isError(k) || k != c->raw_len)
			return -EBADMSG;
		*out = scratch;
	} else {
		return -EINVAL;
	}
	uint8_t h[CHUNK_HASH_LEN];
	chunk_hash(*out, c->raw_len, h);
	return memcmp(h, c->hash, CHUNK_HASH_LEN) == 0 ? 0 : -EBADMSG;
}

int delta_chunk_data(struct delta_batch *b, const struct delta_chunk *c, uint8_t *scratch, const uint8_t **out)
{
	return chunk_bytes(b->dctx, c, scratch, out);
}

struct delta_dctx *delta_dctx_new(void)
{
	return (struct delta_dctx *)ZSTD_createDCtx();
}

void delta_dctx_free(struct delta_dctx *d)
{
	ZSTD_freeDCtx((ZSTD_DCtx *)d);
}

int delta_chunk_data_dctx(const struct delta_batch *b, struct delta_dctx *d, const struct delta_chunk *c,
			  uint8_t *scratch, const uint8_t **out)
{
	(void)b; /* the chunk's bytes live in b; kept for symmetry with delta_chunk_data */
	return chunk_bytes((ZSTD_DCtx *)d, c, scratch, out);
}

static int parse_put(struct parse *ps, struct delta_op *op)
{
	uint32_t nch;
	uint64_t sum = 0;
	struct chunk_hasher fh;
	uint8_t first[CHUNK_HASH_LEN] = {0};
	int r;

	if ((r = get_mode(ps, &op->mode)) < 0)
		return r;
	if (buf_get_u64(&ps->in, &op->size) < 0 || buf_get(&ps->in, op->hash, CHUNK_HASH_LEN) < 0)
		FAIL(ps, -EBADMSG, "truncated");
	if (op->size > ps->caps->max_file)
		FAIL(ps, -EMSGSIZE, "file of %llu bytes is over the limit", (unsigned long long)op->size);
	if ((r = get_string(ps, MANIFEST_PATH_MAX, true, true, &op->base)) < 0)
		return r;
	if (!op->base)
		op->base = op->path;
	if (buf_get_u32(&ps->in, &nch) < 0)
		FAIL(ps, -EBADMSG, "truncated");
	if (nch > ps->caps->max_chunks - (ps->fill ? 0 : ps->nchunks) || nch > buf_len(&ps->in) / CHUNK_MIN)
		FAIL(ps, nch > buf_len(&ps->in) / CHUNK_MIN ? -EBADMSG : -E2BIG, "%u chunks is too many", nch);
	if (ps->fill) {
		op->chunks = ps->b->chunks + ps->nchunks;
		op->nchunks = nch;
	}
	/* the file hash is a function of the chunk list (chunk.h): checked
	 * here from the hashes alone; each chunk's bytes are checked against
	 * its own hash (inline: below or at apply; REF: at apply) */
	chunk_hasher_init_list(&fh);
	for (uint32_t i = 0; i < nch; i++) {
		struct delta_chunk c = {0};
		if (buf_get_u8(&ps->in, &c.kind) < 0 || buf_get_u32(&ps->in, &c.raw_len) < 0 ||
		    buf_get(&ps->in, c.hash, CHUNK_HASH_LEN) < 0)
			FAIL(ps, -EBADMSG, "truncated");
		if (c.raw_len == 0 || c.raw_len > ps->caps->max_chunk)
			FAIL(ps, c.raw_len ? -EMSGSIZE : -EBADMSG, "chunk %u of %u bytes (limit %u)", i, c.raw_len,
			     ps->caps->max_chunk);
		if (c.raw_len > op->size - sum)
			FAIL(ps, -EBADMSG, "chunks add up to more than the file size");
		sum += c.raw_len;
		switch (c.kind) {
		case DELTA_CHUNK_RAW:
			c.data = buf_ptr(&ps->in);
			c.data_len = c.raw_len;
			if (buf_consume(&ps->in, c.raw_len) < 0)
				FAIL(ps, -EBADMSG, "truncated");
			break;
		case DELTA_CHUNK_ZSTD:
			if (buf_get_bytes(&ps->in, &c.data, &c.data_len, c.raw_len - 1) < 0)
				FAIL(ps, -EBADMSG, "chunk %u: zstd payload truncated or not shorter than its raw size",
				     i);
			if (c.data_len == 0)
				FAIL(ps, -EBADMSG, "chunk %u: empty zstd payload", i);
			if ((r = zstd_frame_check(ps, c.data, c.data_len, c.raw_len, i)) < 0)
				return r;
			if (c.raw_len > ps->zstd_max)
				ps->zstd_max = c.raw_len;
			break;
		case DELTA_CHUNK_REF:
			if (buf_get_u64(&ps->in, &c.ref_off) < 0)
				FAIL(ps, -EBADMSG, "truncated");
			if (c.ref_off > UINT64_MAX - c.raw_len)
				FAIL(ps, -EBADMSG, "chunk %u: reference past the end of any file", i);
			op->has_refs = true;
			break;
		default:
			FAIL(ps, -EBADMSG, "chunk %u: unknown kind %u", i, c.kind);
		}
		if (c.raw_len > ps->chunk_max)
			ps->chunk_max = c.raw_len;
		if (i == 0)
			memcpy(first, c.hash, CHUNK_HASH_LEN);
		chunk_hasher_update(&fh, c.hash, CHUNK_HASH_LEN);
		if (!ps->fill)
			continue;
		if (c.kind != DELTA_CHUNK_REF && !ps->defer) {
			const uint8_t *raw;
			if ((r = chunk_bytes(ps->b->dctx, &c, ps->scratch, &raw)) < 0)
				FAIL(ps, -EBADMSG, "chunk %u: %s", i,
				     r == -EBADMSG && c.kind == DELTA_CHUNK_ZSTD
					 ? "bad zstd data or content hash mismatch"
					 : "content hash mismatch");
			(void)raw;
		}
		ps->b->chunks[ps->nchunks + i] = c;
	}
	if (sum != op->size)
		FAIL(ps, -EBADMSG, "chunks add up to %llu bytes, file has %llu", (unsigned long long)sum,
		     (unsigned long long)op->size);
	ps->nchunks += nch;
	{
		uint8_t h[CHUNK_HASH_LEN];
		if (nch == 0)
			chunk_hash("", 0, h);
		else if (nch == 1)
			memcpy(h, first, CHUNK_HASH_LEN);
		else
			chunk_hasher_final(&fh, h);
		if (memcmp(h, op->hash, CHUNK_HASH_LEN) != 0)
			FAIL(ps, -EBADMSG, "file content hash mismatch");
	}
	return 0;
}

static int parse_op(struct parse *ps, struct delta_op *op)
{
	int r;

	memset(op, 0, sizeof(*op));
	ps->what = "?";
	ps->pathbuf[0] = '\0';
	if (buf_get_u8(&ps->in, &op->type) < 0)
		FAIL(ps, -EBADMSG, "truncated");
	ps->what = op_name(op->type);
	if (op->type < DELTA_MKDIR || op->type > DELTA_DELETE)
		FAIL(ps, -EBADMSG, "unknown op type %u (no op creates fifos, sockets or devices)", op->type);
	/* name the path in messages even before it is checked */
	uint32_t pl;
	if (buf_peek_u32(&ps->in, 0, &pl) == 0 && pl <= buf_len(&ps->in) - 4) {
		size_t k = pl < sizeof(ps->pathbuf) - 1 ? pl : sizeof(ps->pathbuf) - 1;
		for (size_t i = 0; i < k; i++) {
			uint8_t ch = buf_ptr(&ps->in)[4 + i];
			ps->pathbuf[i] = ch >= 0x20 && ch < 0x7f ? (char)ch : '?';
		}
		ps->pathbuf[k] = '\0';
	}
	if ((r = get_string(ps, MANIFEST_PATH_MAX, true, false, &op->path)) < 0)
		return r;
	switch (op->type) {
	case DELTA_MKDIR:
	case DELTA_CHMOD:
		return get_mode(ps, &op->mode);
	case DELTA_PUT:
		return parse_put(ps, op);
	case DELTA_SYMLINK:
		return get_string(ps, MANIFEST_TARGET_MAX, false, false, &op->target);
	case DELTA_DELETE:
		if (buf_get_u8(&ps->in, &op->flags) < 0)
			FAIL(ps, -EBADMSG, "truncated");
		if (op->flags & ~DELTA_DELETE_TREE)
			FAIL(ps, -EBADMSG, "unknown flags %#x", op->flags);
		return 0;
	}
	return -EBADMSG;
}

static int parse_ops(struct parse *ps, const uint8_t *body, size_t len, uint32_t nops)
{
	struct delta_op tmp;
	int r;

	buf_view(&ps->in, body, len);
	ps->nchunks = 0;
	ps->strbytes = 0;
	for (ps->opi = 0; ps->opi < nops; ps->opi++) {
		struct delta_op *op = ps->fill ? &ps->b->ops[ps->opi] : &tmp;
		if ((r = parse_op(ps, op)) < 0)
			return r;
	}
	if (buf_len(&ps->in) != 0) {
		say(ps->err, ps->errlen, "%zu bytes after the last op", buf_len(&ps->in));
		return -EBADMSG;
	}
	return 0;
}

struct path_ref {
	const char *path;
	uint32_t op;
	uint8_t type;
};

static int path_ref_cmp(const void *a, const void *b)
{
	const struct path_ref *x = a, *y = b;
	int c = strcmp(x->path, y->path);
	if (c)
		return c;
	return x->op < y->op ? -1 : x->op > y->op;
}

/* Each path: at most one DELETE and at most one other op, the DELETE
 * first. Keeps apply's meaning simple: a batch never does and undoes. */
static int check_paths(const struct delta_batch *b, char *err, size_t errlen)
{
	struct path_ref *v;
	int r = 0;

	if (b->nops < 2)
		return 0;
	if (!(v = mem_calloc(b->nops, sizeof(*v))))
		return -ENOMEM;
	for (size_t i = 0; i < b->nops; i++)
		v[i] = (struct path_ref){.path = b->ops[i].path, .op = (uint32_t)i, .type = b->ops[i].type};
	qsort(v, b->nops, sizeof(*v), path_ref_cmp);
	for (size_t i = 0; i < b->nops && r == 0;) {
		size_t j = i;
		int dels = 0, others = 0;
		bool del_after = false;
		while (j < b->nops && strcmp(v[j].path, v[i].path) == 0) {
			if (v[j].type == DELTA_DELETE) {
				dels++;
				del_after = del_after || others > 0;
			} else {
				others++;
			}
			j++;
		}
		if (dels > 1 || others > 1 || del_after) {
			say(err, errlen, "path %s is the target of conflicting ops", v[i].path);
			r = -EBADMSG;
		}
		i = j;
	}
	mem_free(v);
	return r;
}

static int batch_verify(const uint8_t *bytes, size_t n, const uint8_t pk[DELTA_PK_LEN],
			const uint8_t scope[DELTA_SCOPE_LEN], uint64_t last_seq, const struct delta_caps *caps,
			bool defer, struct delta_batch **out, char *err, size_t errlen)
{
	struct parse ps;
	struct delta_batch *b = NULL;
	struct buf in;
	uint8_t magic[4], ver, flags, bscope[DELTA_SCOPE_LEN];
	uint16_t resv;
	uint64_t seq;
	uint32_t nops;
	int r;

	say(err, errlen, "ok");
	if (!caps)
		caps = &delta_caps_default;
	if (caps_check(caps) < 0)
		return -EINVAL;
	if (n > caps->max_batch) {
		say(err, errlen, "batch of %zu bytes is over the limit of %zu", n, caps->max_batch);
		return -EMSGSIZE;
	}
	if (n < DELTA_HDR_LEN + DELTA_SIG_LEN) {
		say(err, errlen, "batch of %zu bytes is too short", n);
		return -EBADMSG;
	}
	if (sodium_init() < 0)
		return -EIO;
	/* 1. Signature over everything before it, before looking inside. */
	size_t signed_len = n - DELTA_SIG_LEN;
	if (delta_sign_verify(bytes, signed_len, pk, bytes + signed_len) != 0) {
		say(err, errlen, "signature does not verify with the host's sync key");
		return -EPERM;
	}
	/* 2. Header: what, for whom, and whether it is new. */
	buf_view(&in, bytes, signed_len);
	if (buf_get(&in, magic, 4) < 0 || buf_get_u8(&in, &ver) < 0 || buf_get_u8(&in, &flags) < 0 ||
	    buf_get_u16(&in, &resv) < 0 || buf_get(&in, bscope, DELTA_SCOPE_LEN) < 0 || buf_get_u64(&in, &seq) < 0 ||
	    buf_get_u32(&in, &nops) < 0)
		return -EBADMSG;
	if (memcmp(magic, delta_magic, 4) != 0 || ver != DELTA_VERSION || flags != 0 || resv != 0) {
		say(err, errlen, "not a version %d delta batch", DELTA_VERSION);
		return -EBADMSG;
	}
	if (sodium_memcmp(bscope, scope, DELTA_SCOPE_LEN) != 0) {
		say(err, errlen, "batch is for another guest or workspace (scope differs)");
		return -EPERM;
	}
	if (seq <= last_seq) {
		say(err, errlen, "sequence %llu is not newer than the last applied %llu", (unsigned long long)seq,
		    (unsigned long long)last_seq);
		return -ESTALE;
	}
	if (nops > caps->max_ops) {
		say(err, errlen, "%u ops is over the limit of %u", nops, caps->max_ops);
		return -E2BIG;
	}
	if (nops > buf_len(&in) / OP_MIN) {
		say(err, errlen, "%u ops cannot fit in %zu bytes", nops, buf_len(&in));
		return -EBADMSG;
	}
	/* 3. Structure, without allocating. */
	memset(&ps, 0, sizeof(ps));
	ps.caps = caps;
	ps.err = err;
	ps.errlen = errlen;
	if ((r = parse_ops(&ps, buf_ptr(&in), buf_len(&in), nops)) < 0)
		return r;
	/* 4. Allocate exactly what pass 1 measured, then fill and hash. */
	size_t nchunks = ps.nchunks, strbytes = ps.strbytes;
	if (!(b = mem_calloc(1, sizeof(*b))) || !(b->ops = mem_calloc(nops ? nops : 1, sizeof(struct delta_op))) ||
	    !(b->chunks = mem_calloc(nchunks ? nchunks : 1, sizeof(struct delta_chunk))) ||
	    !(b->strings = mem_alloc(strbytes ? strbytes : 1))) {
		r = -ENOMEM;
		goto fail;
	}
	b->seq = seq;
	b->nops = nops;
	b->nchunks = nchunks;
	b->chunk_max = ps.chunk_max;
	if (ps.zstd_max) {
		if ((!defer && !(ps.scratch = mem_alloc(ps.zstd_max))) || !(b->dctx = ZSTD_createDCtx())) {
			r = -ENOMEM;
			goto fail;
		}
		ZSTD_DCtx_setParameter(b->dctx, ZSTD_d_windowLogMax, ZSTD_WINDOW_LOG_MAX);
	}
	ps.fill = true;
	ps.defer = defer;
	ps.b = b;
	if ((r = parse_ops(&ps, buf_ptr(&in), buf_len(&in), nops)) < 0)
		goto fail;
	if ((r = check_paths(b, err, errlen)) < 0)
		goto fail;
	mem_free(ps.scratch);
	say(err, errlen, "ok");
	*out = b;
	return 0;
fail:
	if (r == -ENOMEM)
		say(err, errlen, "out of memory");
	mem_free(ps.scratch);
	delta_batch_free(b);
	return r;
}

int delta_batch_verify(const uint8_t *bytes, size_t n, const uint8_t pk[DELTA_PK_LEN],
		       const uint8_t scope[DELTA_SCOPE_LEN], uint64_t last_seq, const struct delta_caps *caps,
		       struct delta_batch **out, char *err, size_t errlen)
{
	return batch_verify(bytes, n, pk, scope, last_seq, caps, false, out, err, errlen);
}

int delta_batch_verify_deferred(const uint8_t *bytes, size_t n, const uint8_t pk[DELTA_PK_LEN],
				const uint8_t scope[DELTA_SCOPE_LEN], uint64_t last_seq, const struct delta_caps *caps,
				struct delta_batch **out, char *err, size_t errlen)
{
	return batch_verify(bytes, n, pk, scope, last_seq, caps, true, out, err, errlen);
}
