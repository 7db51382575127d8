/* SPDX-License-Identifier: Apache-2.0 */
/*
 * manifest: per-path type/mode/size/hash of a tree, its deterministic
 * encoding, the directory scanner, directory digests, diff and the
 * top-down reconcile. Contract in include/airlock/content/manifest.h; encoding in
 * doc/SYNC.md.
 */
#include "airlock/content/manifest.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "airlock/content/hcache.h"
#include "airlock/core/mem.h"

/* Encoding: CHANGE MANIFEST_VERSION IF THE BYTES CHANGE (doc/SYNC.md). */
static const uint8_t manifest_magic[4] = {'A', 'L', 'M', 'F'};
#define MANIFEST_VERSION 1
#define MANIFEST_HDR_LEN (4 + 1 + 1 + 2 + 4 * 4 + 4)
/* Smallest encoded entry: empty-ish path (4 + 1), type, mode, size, hash. */
#define MANIFEST_ENTRY_MIN (4 + 1 + 1 + 4 + 8 + CHUNK_HASH_LEN)
#define CHUNK_REC_LEN	   (4 + CHUNK_HASH_LEN)
/* A level/digest record: u32 name length, name, type, mode, size, hash. */
#define RECORD_MAX (4 + MANIFEST_NAME_MAX + 1 + 4 + 8 + CHUNK_HASH_LEN)
#define RECORD_MIN (4 + 1 + 1 + 4 + 8 + CHUNK_HASH_LEN)

#define RESERVED_LEN (sizeof(MANIFEST_RESERVED_PREFIX) - 1)

/* ---- paths ---- */

static int component_check(const char *c, size_t n)
{
	if (n == 0)
		return -EINVAL;
	if (n > MANIFEST_NAME_MAX)
		return -ENAMETOOLONG;
	if ((n == 1 && c[0] == '.') || (n == 2 && c[0] == '.' && c[1] == '.'))
		return -EINVAL;
	if (n >= RESERVED_LEN && memcmp(c, MANIFEST_RESERVED_PREFIX, RESERVED_LEN) == 0)
		return -EINVAL;
	return 0;
}

int manifest_path_check(const char *path, size_t len)
{
	size_t start = 0;
	int r;

	if (!path || len == 0)
		return -EINVAL;
	if (len > MANIFEST_PATH_MAX)
		return -ENAMETOOLONG;
	if (memchr(path, '\0', len))
		return -EINVAL;
	for (size_t i = 0; i <= len; i++) {
		if (i < len && path[i] != '/')
			continue;
		if ((r = component_check(path + start, i - start)) < 0)
			return r;
		start = i + 1;
	}
	return 0;
}

/* A single name (no '/'). */
static int name_check(const uint8_t *s, size_t n)
{
	if (memchr(s, '/', n) || memchr(s, '\0', n))
		return -EINVAL;
	return component_check((const char *)s, n);
}

/* End of string sorts first, then '/', then every other byte. */
static int order_key(unsigned char c)
{
	return c == '\0' ? 0 : c == '/' ? 1 : (int)c + 1;
}

int manifest_path_cmp(const char *a, const char *b)
{
	const unsigned char *x = (const unsigned char *)a, *y = (const unsigned char *)b;

	while (*x && *x == *y) {
		x++;
		y++;
	}
	return order_key(*x) - order_key(*y);
}

static const char *base_name(const char *path)
{
	const char *s = strrchr(path, '/');
	return s ? s + 1 : path;
}

/* ---- entries ---- */

void manifest_entry_clear(struct manifest_entry *e)
{
	if (!e)
		return;
	mem_free(e->path);
	mem_free(e->target);
	mem_free(e->chunks);
	memset(e, 0, sizeof(*e));
}

int manifest_new(const struct chunk_params *params, struct manifest **out)
{
	if (!params)
		params = &chunk_params_default;
	if (chunk_params_check(params) < 0)
		return -EINVAL;
	struct manifest *m = mem_calloc(1, sizeof(*m));
	if (!m)
		return -ENOMEM;
	m->params = *params;
	*out = m;
	return 0;
}

void manifest_free(struct manifest *m)
{
	if (!m)
		return;
	for (size_t i = 0; i < m->n; i++)
		manifest_entry_clear(&m->e[i]);
	mem_free(m->e);
	mem_free(m->end);
	mem_free(m);
}

/* Field rules shared by add and decode; `e` is not modified. */
static int entry_check(const struct chunk_params *p, const struct manifest_entry *e)
{
	int r;

	if (!e->path)
		return -EINVAL;
	if ((r = manifest_path_check(e->path, strlen(e->path))) < 0)
		return r;
	switch (e->type) {
	case MANIFEST_FILE:
		if (e->mode & ~MANIFEST_MODE_MASK || e->target)
			return -EINVAL;
		if (e->nchunks == 0)
			return e->chunks ? -EINVAL : 0;
		if (e->size <= p->whole_max)
			return -EINVAL; /* small files have no chunk list */
		return chunk_list_check(p, e->chunks, e->nchunks, e->size);
	case MANIFEST_DIR:
		if (e->mode & ~MANIFEST_MODE_MASK || e->size != 0 || e->target || e->nchunks || e->chunks)
			return -EINVAL;
		return 0;
	case MANIFEST_SYMLINK:
		if (e->mode != 0 || e->nchunks || e->chunks)
			return -EINVAL;
		if (e->target) {
			size_t tl = strlen(e->target);
			if (tl == 0 || tl > MANIFEST_TARGET_MAX)
				return -EINVAL;
		} else if (e->size == 0 || e->size > MANIFEST_TARGET_MAX) {
			return -EINVAL;
		}
		return 0;
	default:
		return -EINVAL;
	}
}

static int reserve_entries(struct manifest *m, size_t more)
{
	if (m->cap - m->n >= more)
		return 0;
	if (more > UINT32_MAX - m->n)
		return -E2BIG; /* end[] holds indexes as u32 */
	size_t ncap = m->cap ? m->cap : 64;
	while (ncap - m->n < more) {
		if (ncap > SIZE_MAX / 2 / sizeof(struct manifest_entry))
			return -ENOMEM;
		ncap *= 2;
	}
	struct manifest_entry *ne = mem_realloc(m->e, ncap * sizeof(*ne));
	if (!ne)
		return -ENOMEM;
	m->e = ne;
	m->cap = ncap;
	return 0;
}

/* Append *e, taking ownership of its pointers (also on failure: they are
 * freed). Symlink size/hash are computed from a known target. */
static int add_owned(struct manifest *m, struct manifest_entry *e)
{
	int r;

	if (e->type == MANIFEST_SYMLINK && e->target) {
		e->size = strlen(e->target);
		chunk_hash(e->target, (size_t)e->size, e->hash);
	}
	if (e->type == MANIFEST_DIR)
		memset(e->hash, 0, sizeof(e->hash));
	if ((r = reserve_entries(m, 1)) < 0) {
		manifest_entry_clear(e);
		return r;
	}
	m->e[m->n++] = *e;
	memset(e, 0, sizeof(*e));
	m->sealed = false;
	return 0;
}

static int entry_copy(struct manifest_entry *dst, const struct manifest_entry *src)
{
	*dst = *src;
	dst->path = dst->target = NULL;
	dst->chunks = NULL;
	if (!(dst->path = mem_strdup(src->path)))
		goto nomem;
	if (src->target && !(dst->target = mem_strdup(src->target)))
		goto nomem;
	if (src->nchunks) {
		if (!(dst->chunks = mem_calloc(src->nchunks, sizeof(struct chunk))))
			goto nomem;
		memcpy(dst->chunks, src->chunks, src->nchunks * sizeof(struct chunk));
	}
	return 0;
nomem:
	manifest_entry_clear(dst);
	return -ENOMEM;
}

int manifest_add(struct manifest *m, const struct manifest_entry *e)
{
	struct manifest_entry c;
	int r;

	if ((r = entry_check(&m->params, e)) < 0)
		return r;
	if ((r = entry_copy(&c, e)) < 0)
		return r;
	return add_owned(m, &c);
}

void manifest_remove_marked(struct manifest *m, const bool *drop, struct manifest_entry *out)
{
	size_t k = 0, o = 0;

	for (size_t i = 0; i < m->n; i++) {
		if (!drop[i])
			m->e[k++] = m->e[i];
		else if (out)
			out[o++] = m->e[i];
		else
			manifest_entry_clear(&m->e[i]);
	}
	m->n = k;
	m->sealed = false;
}

int manifest_add_moved(struct manifest *m, struct manifest_entry *e)
{
	int r;

	if ((r = entry_check(&m->params, e)) < 0) {
		manifest_entry_clear(e);
		return r;
	}
	return add_owned(m, e);
}

/* ---- sealing: order, parents, digests ---- */

static int entry_cmp(const void *a, const void *b)
{
	return manifest_path_cmp(((const struct manifest_entry *)a)->path, ((const struct manifest_entry *)b)->path);
}

/* The record a directory digest (and a level) is made of. */
static size_t record_put(uint8_t *d, const struct manifest_entry *e)
{
	const char *name = base_name(e->path);
	size_t nl = strlen(name), o = 0;

	buf_store_be32(d + o, (uint32_t)nl);
	o += 4;
	memcpy(d + o, name, nl);
	o += nl;
	d[o++] = e->type;
	buf_store_be32(d + o, e->mode);
	o += 4;
	buf_store_be64(d + o, e->size);
	o += 8;
	memcpy(d + o, e->hash, CHUNK_HASH_LEN);
	return o + CHUNK_HASH_LEN;
}

/* Digest of the children in [first, last): MANIFEST_TREE_DIGEST = XXH3-128
 * over their records in order. */
static void digest_range(const struct manifest *m, size_t first, size_t last, uint8_t out[CHUNK_HASH_LEN])
{
	struct chunk_hasher h;
	uint8_t rec[RECORD_MAX];

	chunk_hasher_init(&h);
	for (size_t j = first; j < last; j = m->end[j])
		chunk_hasher_update(&h, rec, record_put(rec, &m->e[j]));
	chunk_hasher_final(&h, out);
}

#define SEAL_TRIM_MIN (256u << 10) /* bytes of unused entries worth giving back */

/* manifest_seal; with `want_root`, every directory's hash as it was
 * given and the root must equal the digests computed: -EBADMSG if not
 * (checked in place: a decoder keeps no copy of the hashes sent). */
static int seal(struct manifest *m, const uint8_t *want_root)
{
	size_t *stack = NULL, sp = 0;
	int r = 0;

	if (m->sealed && !want_root)
		return 0;
	/* The scanner adds in tree order already: one pass tells, and a
	 * strictly increasing list has no duplicates either. */
	size_t in_order = 1;
	while (in_order < m->n && manifest_path_cmp(m->e[in_order - 1].path, m->e[in_order].path) < 0)
		in_order++;
	if (in_order < m->n && m->n - in_order <= m->n / 8) {
		/* a few entries added to a sealed manifest: sort them alone and
		 * merge them in from the back (qsort of the whole array takes a
		 * copy of it: tens of MB for a large tree) */
		size_t nt = m->n - in_order, i = in_order, j = nt, o = m->n;
		struct manifest_entry *t = mem_alloc(nt * sizeof(*t));
		if (!t)
			return -ENOMEM;
		memcpy(t, m->e + in_order, nt * sizeof(*t));
		qsort(t, nt, sizeof(*t), entry_cmp);
		while (j > 0) {
			if (i > 0 && entry_cmp(&m->e[i - 1], &t[j - 1]) > 0)
				m->e[--o] = m->e[--i];
			else
				m->e[--o] = t[--j];
		}
		mem_free(t);
		for (size_t k = 1; k < m->n; k++)
			if (manifest_path_cmp(m->e[k - 1].path, m->e[k].path) == 0)
				return -EEXIST;
	} else if (in_order < m->n) {
		qsort(m->e, m->n, sizeof(*m->e), entry_cmp);
		for (size_t i = 1; i < m->n; i++)
			if (manifest_path_cmp(m->e[i - 1].path, m->e[i].path) == 0)
				return -EEXIST;
	}
	/* A grown array is up to half empty (capacity doubles): give the
	 * rest back once the manifest is whole (a large block is mremapped,
	 * not copied). Adding to it later doubles it again. Small slack is
	 * kept: the small manifests of a push are sealed and grown often. */
	if (m->n > 0 && m->cap - m->n > m->n / 8 && (m->cap - m->n) * sizeof(*m->e) >= SEAL_TRIM_MIN) {
		struct manifest_entry *ne = mem_realloc(m->e, m->n * sizeof(*ne));
		if (ne) {
			m->e = ne;
			m->cap = m->n;
		}
	}
	uint32_t *end = mem_realloc(m->end, (m->n ? m->n : 1) * sizeof(*end));
	if (!end)
		return -ENOMEM;
	m->end = end;
	m->endcap = m->n ? m->n : 1;
	/* Ancestor chain; a path of MANIFEST_PATH_MAX bytes has at most
	 * MANIFEST_PATH_MAX / 2 + 1 components. */
	size_t depth_max = MANIFEST_PATH_MAX / 2 + 1;
	if (!(stack = mem_alloc((m->n < depth_max ? m->n + 1 : depth_max) * sizeof(size_t))))
		return -ENOMEM;
	for (size_t i = 0; i < m->n; i++) {
		const char *p = m->e[i].path;
		const char *slash = strrchr(p, '/');
		size_t pl = slash ? (size_t)(slash - p) : 0;
		while (sp > 0) {
			const char *t = m->e[stack[sp - 1]].path;
			size_t tl = strlen(t);
			if (tl < strlen(p) && memcmp(t, p, tl) == 0 && p[tl] == '/')
				break;
			end[stack[--sp]] = (uint32_t)i;
		}
		if (pl > 0 && (sp == 0 || strlen(m->e[stack[sp - 1]].path) != pl)) {
			r = -ENOENT;
			goto out;
		}
		if (m->e[i].type == MANIFEST_DIR)
			stack[sp++] = i;
		else
			end[i] = (uint32_t)(i + 1);
	}
	while (sp > 0)
		end[stack[--sp]] = (uint32_t)m->n;
	/* bottom up: a directory's digest reads its children's hashes, which
	 * are final by then */
	for (size_t i = m->n; i-- > 0;) {
		if (m->e[i].type != MANIFEST_DIR)
			continue;
		uint8_t h[CHUNK_HASH_LEN];
		digest_range(m, i + 1, end[i], h);
		if (want_root && memcmp(h, m->e[i].hash, CHUNK_HASH_LEN) != 0)
			r = -EBADMSG;
		memcpy(m->e[i].hash, h, CHUNK_HASH_LEN);
	}
	digest_range(m, 0, m->n, m->root);
	if (want_root && memcmp(want_root, m->root, CHUNK_HASH_LEN) != 0)
		r = -EBADMSG;
	m->sealed = r == 0;
out:
	mem_free(stack);
	return r;
}

int manifest_seal(struct manifest *m)
{
	return seal(m, NULL);
}

/* ---- editing a sealed manifest in place ---- */

/* p is `anchor` or beneath it. */
static bool at_or_under(const char *p, const char *anchor, size_t al)
{
	return strncmp(p, anchor, al) == 0 && (p[al] == '\0' || p[al] == '/');
}

/* First index whose path is >= path in tree order. */
static size_t lower_bound(const struct manifest *m, const char *path)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (manifest_path_cmp(m->e[mid].path, path) < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo;
}

/* Order sub (entries at or under anchor), check it is a parent-closed
 * subtree rooted at anchor, and fill lend[] with each entry's subtree end
 * relative to sub. */
static int sub_check(struct manifest *sub, const char *anchor, size_t al, size_t *lend)
{
	size_t *stack = NULL, sp = 0;
	int r = 0;

	if (sub->n == 0)
		return 0;
	if (sub->n > 1)
		qsort(sub->e, sub->n, sizeof(*sub->e), entry_cmp);
	if (strcmp(sub->e[0].path, anchor) != 0)
		return at_or_under(sub->e[0].path, anchor, al) ? -ENOENT : -EINVAL;
	if (!(stack = mem_alloc((sub->n < MANIFEST_PATH_MAX / 2 + 1 ? sub->n + 1 : MANIFEST_PATH_MAX / 2 + 1) *
				sizeof(size_t))))
		return -ENOMEM;
	for (size_t i = 0; i < sub->n; i++) {
		const char *p = sub->e[i].path;
		if (!at_or_under(p, anchor, al)) {
			r = -EINVAL;
			goto out;
		}
		if (i > 0 && manifest_path_cmp(sub->e[i - 1].path, p) == 0) {
			r = -EEXIST;
			goto out;
		}
		size_t pl = strlen(p);
		while (sp > 0) {
			const char *t = sub->e[stack[sp - 1]].path;
			size_t tl = strlen(t);
			if (tl < pl && memcmp(t, p, tl) == 0 && p[tl] == '/')
				break;
			lend[stack[--sp]] = i;
		}
		const char *slash = strrchr(p, '/');
		if (i > 0 && (sp == 0 || strlen(sub->e[stack[sp - 1]].path) != (size_t)(slash - p))) {
			r = -ENOENT;
			goto out;
		}
		if (sub->e[i].type == MANIFEST_DIR)
			stack[sp++] = i;
		else
			lend[i] = i + 1;
	}
	while (sp > 0)
		lend[stack[--sp]] = sub->n;
out:
	mem_free(stack);
	return r;
}

int manifest_swap_subtree(struct manifest *m, const char *anchor, struct manifest *sub)
{
	size_t al = strlen(anchor), na = 0, *lend = NULL, *anc = NULL;
	struct manifest_entry *old = NULL;
	int r;

	if (!m->sealed || sub == m || manifest_path_check(anchor, al) < 0)
		return -EINVAL;
	if (m->params.min != sub->params.min || m->params.avg != sub->params.avg || m->params.max != sub->params.max ||
	    m->params.whole_max != sub->params.whole_max)
		return -EINVAL;
	if (!(lend = mem_alloc((sub->n ? sub->n : 1) * sizeof(size_t))))
		return -ENOMEM;
	if ((r = sub_check(sub, anchor, al, lend)) < 0)
		goto out;
	/* The anchor's ancestors, shallowest first: each a directory of m. */
	for (size_t i = 0; i < al; i++)
		na += anchor[i] == '/';
	if (!(anc = mem_alloc((na ? na : 1) * sizeof(size_t)))) {
		r = -ENOMEM;
		goto out;
	}
	{
		char p[MANIFEST_PATH_MAX + 1];
		size_t k = 0;
		memcpy(p, anchor, al + 1);
		for (size_t i = 0; i < al; i++) {
			if (anchor[i] != '/')
				continue;
			p[i] = '\0';
			long idx = manifest_find(m, p);
			p[i] = '/';
			if (idx < 0 || m->e[idx].type != MANIFEST_DIR) {
				r = -ENOENT;
				goto out;
			}
			anc[k++] = (size_t)idx;
		}
	}
	long ai = manifest_find(m, anchor);
	size_t lo = ai >= 0 ? (size_t)ai : lower_bound(m, anchor);
	size_t hi = ai >= 0 ? m->end[ai] : lo;
	size_t k = sub->n, nold = hi - lo, newn = m->n - nold + k;
	/* Everything that can fail, before anything moves. */
	if (k > nold && (r = reserve_entries(m, k - nold)) < 0)
		goto out;
	if (newn > m->endcap) {
		uint32_t *ne = mem_realloc(m->end, newn * sizeof(*ne));
		if (!ne) {
			r = -ENOMEM;
			goto out;
		}
		m->end = ne;
		m->endcap = newn;
	}
	if (!(old = mem_alloc((nold ? nold : 1) * sizeof(*old)))) {
		r = -ENOMEM;
		goto out;
	}
	if (nold) /* m->e is NULL in an empty manifest */
		memcpy(old, m->e + lo, nold * sizeof(*old));
	if (k != nold) {
		memmove(m->e + lo + k, m->e + hi, (m->n - hi) * sizeof(*m->e));
		memmove(m->end + lo + k, m->end + hi, (m->n - hi) * sizeof(*m->end));
		for (size_t i = lo + k; i < newn; i++)
			m->end[i] = (uint32_t)(m->end[i] - nold + k);
		for (size_t i = 0; i < na; i++)
			m->end[anc[i]] = (uint32_t)(m->end[anc[i]] - nold + k);
	}
	if (k)
		memcpy(m->e + lo, sub->e, k * sizeof(*m->e));
	for (size_t j = 0; j < k; j++)
		m->end[lo + j] = (uint32_t)(lo + lend[j]);
	m->n = newn;
	mem_free(sub->e);
	sub->e = old;
	old = NULL;
	sub->n = sub->cap = nold;
	sub->sealed = false;
	/* Digests: the new entries' directories bottom up, then the ancestors. */
	for (size_t j = k; j-- > 0;)
		if (m->e[lo + j].type == MANIFEST_DIR)
			digest_range(m, lo + j + 1, m->end[lo + j], m->e[lo + j].hash);
	for (size_t i = na; i-- > 0;)
		digest_range(m, anc[i] + 1, m->end[anc[i]], m->e[anc[i]].hash);
	digest_range(m, 0, m->n, m->root);
	r = 0;
out:
	mem_free(old);
	mem_free(anc);
	mem_free(lend);
	return r;
}

long manifest_find(const struct manifest *m, const char *path)
{
	size_t lo = 0, hi = m->n;

	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		int c = manifest_path_cmp(m->e[mid].path, path);
		if (c == 0)
			return (long)mid;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

/* ---- encoding ---- */

int manifest_entry_encode(const struct manifest_entry *e, struct buf *out)
{
	int r;

	if ((r = buf_put_str(out, e->path)) < 0 || (r = buf_put_u8(out, e->type)) < 0 ||
	    (r = buf_put_u32(out, e->mode)) < 0 || (r = buf_put_u64(out, e->size)) < 0 ||
	    (r = buf_put(out, e->hash, CHUNK_HASH_LEN)) < 0)
		return r;
	if (e->type == MANIFEST_SYMLINK)
		return buf_put_str(out, e->target ? e->target : "");
	if (e->type == MANIFEST_FILE) {
		if (e->nchunks > UINT32_MAX)
			return -EINVAL;
		if ((r = buf_put_u32(out, (uint32_t)e->nchunks)) < 0)
			return r;
		for (size_t i = 0; i < e->nchunks; i++)
			if ((r = buf_put_u32(out, e->chunks[i].len)) < 0 ||
			    (r = buf_put(out, e->chunks[i].hash, CHUNK_HASH_LEN)) < 0)
				return r;
	}
	return 0;
}

int manifest_entry_decode(struct buf *src, const struct chunk_params *p, struct manifest_entry *e)
{
	/* parse a view: src is consumed only when the whole entry decodes */
	struct buf view, *in = &view;
	buf_view(in, buf_ptr(src), buf_len(src));
	const uint8_t *s;
	size_t sl;
	uint32_t nch, mode;
	int r;

	memset(e, 0, sizeof(*e));
	if ((r = buf_get_bytes(in, &s, &sl, MANIFEST_PATH_MAX)) < 0)
		goto bad;
	if ((r = manifest_path_check((const char *)s, sl)) < 0)
		goto bad;
	if (!(e->path = mem_strndup((const char *)s, sl))) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = buf_get_u8(in, &e->type)) < 0 || (r = buf_get_u32(in, &mode)) < 0 ||
	    (r = buf_get_u64(in, &e->size)) < 0 || (r = buf_get(in, e->hash, CHUNK_HASH_LEN)) < 0)
		goto bad;
	if (mode > MANIFEST_MODE_MASK)
		goto bad;
	e->mode = (uint16_t)mode;
	if (e->type == MANIFEST_SYMLINK) {
		if ((r = buf_get_bytes(in, &s, &sl, MANIFEST_TARGET_MAX)) < 0)
			goto bad;
		if (memchr(s, '\0', sl)) {
			r = -EBADMSG;
			goto bad;
		}
		if (sl > 0) {
			uint8_t h[CHUNK_HASH_LEN];
			chunk_hash(s, sl, h);
			if (e->size != sl || memcmp(h, e->hash, CHUNK_HASH_LEN) != 0) {
				r = -EBADMSG;
				goto bad;
			}
			if (!(e->target = mem_strndup((const char *)s, sl))) {
				r = -ENOMEM;
				goto fail;
			}
		}
	} else if (e->type == MANIFEST_FILE) {
		if ((r = buf_get_u32(in, &nch)) < 0)
			goto bad;
		/* bounded by the bytes present before allocating */
		if (nch > buf_len(in) / CHUNK_REC_LEN) {
			r = -EBADMSG;
			goto bad;
		}
		if (nch) {
			if (!(e->chunks = mem_calloc(nch, sizeof(struct chunk)))) {
				r = -ENOMEM;
				goto fail;
			}
			e->nchunks = nch;
			uint64_t off = 0;
			for (uint32_t i = 0; i < nch; i++) {
				e->chunks[i].off = off;
				if ((r = buf_get_u32(in, &e->chunks[i].len)) < 0 ||
				    (r = buf_get(in, e->chunks[i].hash, CHUNK_HASH_LEN)) < 0)
					goto bad;
				off += e->chunks[i].len;
			}
		}
	}
	if (entry_check(p, e) < 0) {
		r = -EBADMSG;
		goto bad;
	}
	buf_consume(src, buf_len(src) - buf_len(in));
	return 0;
bad:
	r = -EBADMSG;
fail:
	manifest_entry_clear(e);
	return r;
}

size_t manifest_encoded_size(const struct manifest *m)
{
	size_t n = 4 + 1 + 1 + 2 + 4 * 4 + 4 + CHUNK_HASH_LEN;

	for (size_t i = 0; i < m->n; i++) {
		const struct manifest_entry *e = &m->e[i];
		n += 4 + strlen(e->path) + 1 + 4 + 8 + CHUNK_HASH_LEN;
		if (e->type == MANIFEST_SYMLINK)
			n += 4 + (e->target ? strlen(e->target) : 0);
		else if (e->type == MANIFEST_FILE)
			n += 4 + e->nchunks * CHUNK_REC_LEN;
	}
	return n;
}

int manifest_encode_to(const struct manifest *m, struct buf *out, manifest_flush_fn *flush, void *ud)
{
	int r;

	if (!m->sealed || m->n > UINT32_MAX)
		return -EINVAL;
	if ((r = buf_put(out, manifest_magic, 4)) < 0 || (r = buf_put_u8(out, MANIFEST_VERSION)) < 0 ||
	    (r = buf_put_u8(out, 0)) < 0 || (r = buf_put_u16(out, 0)) < 0 ||
	    (r = buf_put_u32(out, m->params.min)) < 0 || (r = buf_put_u32(out, m->params.avg)) < 0 ||
	    (r = buf_put_u32(out, m->params.max)) < 0 || (r = buf_put_u32(out, m->params.whole_max)) < 0 ||
	    (r = buf_put_u32(out, (uint32_t)m->n)) < 0)
		return r;
	for (size_t i = 0; i < m->n; i++) {
		if ((r = manifest_entry_encode(&m->e[i], out)) < 0)
			return r;
		if (flush && buf_len(out) >= MANIFEST_FLUSH_AT && (r = flush(ud, out)) < 0)
			return r;
	}
	return buf_put(out, m->root, CHUNK_HASH_LEN);
}

int manifest_encode(const struct manifest *m, struct buf *out)
{
	return manifest_encode_to(m, out, NULL, NULL);
}

int manifest_decode(const uint8_t *p, size_t n, size_t max_entries, struct manifest **out)
{
	struct buf in;
	struct manifest *m = NULL;
	struct chunk_params cp;
	uint8_t magic[4], ver, flags;
	uint16_t resv;
	uint32_t count;
	uint8_t root[CHUNK_HASH_LEN];
	int r;

	if (max_entries == 0)
		max_entries = MANIFEST_ENTRIES_MAX;
	buf_view(&in, p, n);
	if (buf_get(&in, magic, 4) < 0 || memcmp(magic, manifest_magic, 4) != 0 || buf_get_u8(&in, &ver) < 0 ||
	    ver != MANIFEST_VERSION || buf_get_u8(&in, &flags) < 0 || flags != 0 || buf_get_u16(&in, &resv) < 0 ||
	    resv != 0 || buf_get_u32(&in, &cp.min) < 0 || buf_get_u32(&in, &cp.avg) < 0 ||
	    buf_get_u32(&in, &cp.max) < 0 || buf_get_u32(&in, &cp.whole_max) < 0 || buf_get_u32(&in, &count) < 0)
		return -EBADMSG;
	if (chunk_params_check(&cp) < 0)
		return -EBADMSG;
	if (count > max_entries)
		return -E2BIG;
	if (count > buf_len(&in) / MANIFEST_ENTRY_MIN)
		return -EBADMSG;
	if ((r = manifest_new(&cp, &m)) < 0)
		return r;
	if ((r = reserve_entries(m, count)) < 0)
		goto fail;
	for (uint32_t i = 0; i < count; i++) {
		struct manifest_entry e;
		if ((r = manifest_entry_decode(&in, &cp, &e)) < 0)
			goto fail;
		/* canonical: strictly increasing in tree order */
		if (m->n > 0 && manifest_path_cmp(m->e[m->n - 1].path, e.path) >= 0) {
			manifest_entry_clear(&e);
			r = -EBADMSG;
			goto fail;
		}
		uint8_t h[CHUNK_HASH_LEN];
		memcpy(h, e.hash, CHUNK_HASH_LEN);
		uint8_t type = e.type;
		if ((r = add_owned(m, &e)) < 0)
			goto fail;
		if (type == MANIFEST_DIR) /* remembered to compare after sealing */
			memcpy(m->e[m->n - 1].hash, h, CHUNK_HASH_LEN);
	}
	if (buf_get(&in, root, CHUNK_HASH_LEN) < 0 || buf_len(&in) != 0) {
		r = -EBADMSG;
		goto fail;
	}
	/* Directory hashes as sent are checked against the recomputed ones. */
	if ((r = seal(m, root)) < 0) {
		if (r != -ENOMEM)
			r = -EBADMSG;
		goto fail;
	}
	*out = m;
	return 0;
fail:
	manifest_free(m);
	return r;
}

/* ---- confined open ---- */

static atomic_int have_openat2 = 1;

static int open_walk(int dirfd, const char *path, int flags)
{
	char comp[MANIFEST_NAME_MAX + 1];
	const char *p = path;
	int cur = dirfd;

	for (;;) {
		const char *slash = strchr(p, '/');
		size_t cl = slash ? (size_t)(slash - p) : strlen(p);
		memcpy(comp, p, cl);
		comp[cl] = '\0';
		int fd = slash ? openat(cur, comp, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
			       : openat(cur, comp, flags | O_NOFOLLOW | O_CLOEXEC);
		int err = errno;
		if (cur != dirfd)
			close(cur);
		if (fd < 0)
			return -err;
		if (!slash)
			return fd;
		cur = fd;
		p = slash + 1;
	}
}

int manifest_open_beneath(int dirfd, const char *path, int flags, bool walk)
{
	int fd;

	if (path[0] == '\0') {
		fd = openat(dirfd, ".", flags | O_CLOEXEC);
		return fd < 0 ? -errno : fd;
	}
	if (manifest_path_check(path, strlen(path)) < 0)
		return -EINVAL;
	if (!walk && atomic_load_explicit(&have_openat2, memory_order_relaxed)) {
		struct open_how how = {
		    .flags = (uint64_t)(flags | O_NOFOLLOW | O_CLOEXEC),
		    .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
		};
		for (int tries = 0; tries < 8; tries++) {
			fd = (int)syscall(SYS_openat2, dirfd, path, &how, sizeof(how));
			if (fd >= 0)
				return fd;
			if (errno == EAGAIN || errno == EINTR)
				continue; /* a concurrent rename or mount: retry */
			if (errno != ENOSYS)
				return -errno;
			atomic_store_explicit(&have_openat2, 0, memory_order_relaxed);
			break;
		}
		if (atomic_load_explicit(&have_openat2, memory_order_relaxed))
			return -EAGAIN;
	}
	return open_walk(dirfd, path, flags);
}

/* ---- scanning ---- */

struct scan {
	const struct manifest_scan_opts *o;
	struct manifest *m;
	const struct chunk_params *chunking;
	/* relative path of what is being looked at; room for one name past
	 * the limit so that over-long paths can still be reported */
	char path[MANIFEST_PATH_MAX + 1 + MANIFEST_NAME_MAX + 1];
	size_t plen;
	unsigned max_depth;
	size_t max_entries;
	uint8_t *io; /* read buffer for hashing small files */
	size_t io_len;
	char target[MANIFEST_TARGET_MAX + 1];
};

static void report(struct scan *s, enum manifest_skip why, int err)
{
	if (s->o->skipped)
		s->o->skipped(s->path, why, err, s->o->skipped_ud);
}

static int verdict(struct scan *s, bool is_dir)
{
	return s->o->filter ? s->o->filter(s->path, is_dir, s->o->filter_ud) : MANIFEST_KEEP;
}

static int scan_add(struct scan *s, struct manifest_entry *e)
{
	if (s->m->n >= s->max_entries) {
		manifest_entry_clear(e);
		return -E2BIG;
	}
	if (!(e->path = mem_strdup(s->path))) {
		manifest_entry_clear(e);
		return -ENOMEM;
	}
	return add_owned(s->m, e);
}

/* Hash (and chunk) a regular file. 1 = skipped and reported. */
static int scan_file(struct scan *s, int dfd, const char *name, const struct stat *lst)
{
	struct manifest_entry e = {.type = MANIFEST_FILE};
	struct stat st;
	int fd, r = 0;

	if (s->o->cache) {
		/* unchanged key since a non-racy hash: not read at all */
		if ((r = hcache_get(s->o->cache, s->path, lst, &e)) < 0)
			return r;
		if (r == 1) {
			if (s->chunking && e.size > s->chunking->whole_max && !e.chunks) {
				manifest_entry_clear(&e);
				e.type = MANIFEST_FILE;
			} else {
				/* carried over: the saved cache holds this scan's files */
				if ((r = hcache_put(s->o->cache, s->path, lst, &e)) == -ENOMEM) {
					manifest_entry_clear(&e);
					return r;
				}
				return scan_add(s, &e);
			}
		}
		r = 0;
	}

	fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
	if (fd < 0) {
		int err = errno;
		report(s, err == ENOENT || err == ELOOP ? MANIFEST_SKIP_CHANGED : MANIFEST_SKIP_ERROR,
		       err == ENOENT || err == ELOOP ? 0 : err);
		return 1;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		report(s, MANIFEST_SKIP_CHANGED, 0);
		close(fd);
		return 1;
	}
	e.mode = (uint16_t)(st.st_mode & MANIFEST_MODE_MASK);
	e.size = (uint64_t)st.st_size;
	if (s->chunking && e.size > s->chunking->whole_max) {
		size_t nch = 0;
		r = chunk_file(s->chunking, chunk_read_fd, &fd, e.size, NULL, NULL, &e.chunks, &nch, e.hash);
		if (r == 0 && nch > UINT32_MAX)
			r = -E2BIG;
		e.nchunks = (uint32_t)nch;
	} else {
		struct chunk_hasher h;
		uint64_t left = e.size, off = 0;
		chunk_hasher_init(&h);
		while (left > 0 && r == 0) {
			size_t k = left < s->io_len ? (size_t)left : s->io_len;
			if ((r = chunk_read_fd(&fd, off, s->io, k)) == 0) {
				chunk_hasher_update(&h, s->io, k);
				off += k;
				left -= k;
			}
		}
		chunk_hasher_final(&h, e.hash);
	}
	close(fd);
	if (r == -ENOMEM)
		return r;
	if (r < 0) {
		report(s, r == -ESTALE ? MANIFEST_SKIP_CHANGED : MANIFEST_SKIP_ERROR, r == -ESTALE ? 0 : -r);
		manifest_entry_clear(&e);
		return 1;
	}
	/* keyed by the fstat taken before the read: a change during the
	 * read moves ctime past it */
	if (s->o->cache && (r = hcache_put(s->o->cache, s->path, &st, &e)) == -ENOMEM) {
		manifest_entry_clear(&e);
		return r;
	}
	return scan_add(s, &e);
}

static int scan_dir(struct scan *s, int fd, unsigned depth);

static int scan_entry(struct scan *s, int dfd, const char *name, unsigned depth)
{
	struct stat st;
	int r, v;

	if (fstatat(dfd, name, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		int err = errno;
		report(s, err == ENOENT ? MANIFEST_SKIP_CHANGED : MANIFEST_SKIP_ERROR, err == ENOENT ? 0 : err);
		return 0;
	}
	if (s->o->seen)
		s->o->seen(s->path, &st, MANIFEST_SEEN_STAT, s->o->seen_ud);
	if (S_ISDIR(st.st_mode)) {
		if ((v = verdict(s, true)) == MANIFEST_SKIP)
			return 0;
		if (depth + 1 > s->max_depth) {
			report(s, MANIFEST_SKIP_DEPTH, 0);
			return 0;
		}
		int cfd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
		if (cfd < 0) {
			int err = errno;
			bool changed = err == ENOENT || err == ELOOP || err == ENOTDIR;
			report(s, changed ? MANIFEST_SKIP_CHANGED : MANIFEST_SKIP_ERROR, changed ? 0 : err);
			return 0;
		}
		if (fstat(cfd, &st) < 0) {
			report(s, MANIFEST_SKIP_ERROR, errno);
			close(cfd);
			return 0;
		}
		struct manifest_entry e = {.type = MANIFEST_DIR, .mode = st.st_mode & MANIFEST_MODE_MASK};
		if ((r = scan_add(s, &e)) < 0) {
			close(cfd);
			return r;
		}
		size_t idx = s->m->n - 1;
		size_t plen = s->plen;
		if (s->o->seen)
			s->o->seen(s->path, &st, MANIFEST_SEEN_WALK, s->o->seen_ud);
		r = scan_dir(s, cfd, depth + 1); /* takes cfd */
		s->plen = plen;
		s->path[plen] = '\0';
		if (r < 0)
			return r;
		/* an unreadable directory, or one kept only for what is beneath
		 * it with nothing beneath it kept, is left out */
		if (r > 0 || (v == MANIFEST_DESCEND && s->m->n == idx + 1)) {
			while (s->m->n > idx)
				manifest_entry_clear(&s->m->e[--s->m->n]);
		}
		return 0;
	}
	if ((v = verdict(s, false)) == MANIFEST_SKIP)
		return 0;
	if (S_ISREG(st.st_mode)) {
		r = scan_file(s, dfd, name, &st);
		return r < 0 ? r : 0;
	}
	if (S_ISLNK(st.st_mode)) {
		ssize_t k = readlinkat(dfd, name, s->target, sizeof(s->target));
		if (k < 0) {
			int err = errno;
			report(s, err == ENOENT || err == EINVAL ? MANIFEST_SKIP_CHANGED : MANIFEST_SKIP_ERROR,
			       err == ENOENT || err == EINVAL ? 0 : err);
			return 0;
		}
		if ((size_t)k > MANIFEST_TARGET_MAX || k == 0) {
			report(s, MANIFEST_SKIP_TARGET, 0);
			return 0;
		}
		s->target[k] = '\0';
		struct manifest_entry e = {.type = MANIFEST_SYMLINK};
		if (!(e.target = mem_strdup(s->target)))
			return -ENOMEM;
		return scan_add(s, &e);
	}
	report(s, MANIFEST_SKIP_SPECIAL, 0);
	return 0;
}

/* The names of a directory, packed (each NUL-terminated) in names, their
 * offsets in off. */
struct dir_names {
	char *names;
	size_t len, cap;
	size_t *off;
	size_t n, offcap;
};

static int dir_names_add(struct dir_names *dn, const char *name)
{
	size_t nl = strlen(name) + 1;
	if (dn->len + nl > dn->cap) {
		size_t nc = dn->cap ? dn->cap : 4096;
		while (dn->len + nl > nc)
			nc *= 2;
		char *nv = mem_realloc(dn->names, nc);
		if (!nv)
			return -ENOMEM;
		dn->names = nv;
		dn->cap = nc;
	}
	if (dn->n == dn->offcap) {
		size_t nc = dn->offcap ? dn->offcap * 2 : 64;
		size_t *nv = mem_realloc(dn->off, nc * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		dn->off = nv;
		dn->offcap = nc;
	}
	memcpy(dn->names + dn->len, name, nl);
	dn->off[dn->n++] = dn->len;
	dn->len += nl;
	return 0;
}

static int name_off_cmp(const void *a, const void *b, void *names)
{
	return strcmp((const char *)names + *(const size_t *)a, (const char *)names + *(const size_t *)b);
}

/* Scan the directory open at fd (taken over and closed), whose relative
 * path is s->path. Its names are read first and visited in byte order:
 * siblings in byte order, each directory's subtree right after it, is
 * tree order, so the manifest is built sorted and the seal does not sort.
 * Returns <0 fatal, 1 when the directory could not be read (reported), 0
 * otherwise. */
static int scan_dir(struct scan *s, int fd, unsigned depth)
{
	DIR *d = fdopendir(fd);
	struct dirent *de;
	struct dir_names dn = {0};
	size_t plen = s->plen;
	int r = 0, rerr = 0;

	if (!d) {
		int err = errno;
		close(fd);
		if (err == ENOMEM)
			return -ENOMEM;
		report(s, MANIFEST_SKIP_ERROR, err);
		return 1;
	}
	for (;;) {
		errno = 0;
		if (!(de = readdir(d))) {
			rerr = errno;
			break;
		}
		if (strcmp(de->d_name, ".") == 0 || strcmp(de->d_name, "..") == 0)
			continue;
		if ((r = dir_names_add(&dn, de->d_name)) < 0)
			goto out;
	}
	if (dn.n > 1)
		qsort_r(dn.off, dn.n, sizeof(*dn.off), name_off_cmp, dn.names);
	for (size_t k = 0; k < dn.n; k++) {
		const char *name = dn.names + dn.off[k];
		size_t nl = strlen(name);
		size_t o = plen;
		if (o)
			s->path[o++] = '/';
		memcpy(s->path + o, name, nl);
		s->path[o + nl] = '\0';
		s->plen = o + nl;
		if (nl >= RESERVED_LEN && memcmp(name, MANIFEST_RESERVED_PREFIX, RESERVED_LEN) == 0)
			report(s, MANIFEST_SKIP_RESERVED, 0);
		else if (s->plen > MANIFEST_PATH_MAX || nl > MANIFEST_NAME_MAX)
			report(s, MANIFEST_SKIP_NAME, 0);
		else
			r = scan_entry(s, dirfd(d), name, depth);
		s->plen = plen;
		s->path[plen] = '\0';
		if (r < 0)
			break;
	}
	if (r >= 0 && rerr) {
		s->path[plen] = '\0';
		report(s, MANIFEST_SKIP_ERROR, rerr);
		r = 1;
	}
out:
	mem_free(dn.names);
	mem_free(dn.off);
	closedir(d);
	return r;
}

int manifest_scan(int dirfd, const struct manifest_scan_opts *opts, struct manifest **out)
{
	static const struct manifest_scan_opts none = {0};
	struct scan *s;
	int fd, r;

	if (!opts)
		opts = &none;
	if (!(s = mem_calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->o = opts;
	s->chunking = opts->chunking;
	s->max_depth = opts->max_depth ? opts->max_depth : 128;
	s->max_entries = opts->max_entries ? opts->max_entries : MANIFEST_ENTRIES_MAX;
	s->io_len = 256 * 1024;
	if (!(s->io = mem_alloc(s->io_len))) {
		r = -ENOMEM;
		goto out;
	}
	if ((r = manifest_new(opts->chunking, &s->m)) < 0)
		goto out;
	/* A fresh open file description: readdir must not move the
	 * caller's offset. */
	if ((fd = openat(dirfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		goto out;
	}
	if (opts->cache)
		hcache_begin(opts->cache, fd);
	r = scan_dir(s, fd, 0);
	if (r == 1)
		r = -EIO; /* the root itself could not be read */
	if (r == 0 && opts->seen)
		opts->seen("", NULL, MANIFEST_SEEN_DONE, opts->seen_ud);
	if (r == 0)
		r = manifest_seal(s->m);
	if (r == 0) {
		*out = s->m;
		s->m = NULL;
	}
out:
	manifest_free(s->m);
	mem_free(s->io);
	mem_free(s);
	return r;
}

/* ---- diff ---- */

struct changes {
	struct manifest_change *v;
	size_t n, cap;
};

static int change_push(struct changes *c, uint8_t kind, const struct manifest_entry *o, const struct manifest_entry *n)
{
	if (c->n == c->cap) {
		size_t ncap = c->cap ? c->cap * 2 : 32;
		if (ncap > SIZE_MAX / sizeof(struct manifest_change))
			return -ENOMEM;
		struct manifest_change *nv = mem_realloc(c->v, ncap * sizeof(*nv));
		if (!nv)
			return -ENOMEM;
		c->v = nv;
		c->cap = ncap;
	}
	c->v[c->n++] = (struct manifest_change){.kind = kind, .old = o, .new = n};
	return 0;
}

int manifest_diff(const struct manifest *a, const struct manifest *b, struct manifest_change **out, size_t *nout)
{
	struct changes c = {0};
	size_t i, j;
	int r = 0;

	if (!a->sealed || !b->sealed)
		return -EINVAL;
	/* Pass 1: removals, collected in tree order, emitted reversed so a
	 * directory's children go before it. */
	for (i = 0, j = 0; i < a->n && r == 0;) {
		int k = j < b->n ? manifest_path_cmp(a->e[i].path, b->e[j].path) : -1;
		if (k < 0) {
			r = change_push(&c, MANIFEST_REMOVE, &a->e[i], NULL);
			i++;
		} else if (k > 0) {
			j = b->end[j]; /* a subtree only b has */
		} else if (a->e[i].type != b->e[j].type) {
			r = change_push(&c, MANIFEST_REMOVE, &a->e[i], &b->e[j]);
			i++;
			j++;
		} else if (a->e[i].type == MANIFEST_DIR && memcmp(a->e[i].hash, b->e[j].hash, CHUNK_HASH_LEN) == 0) {
			i = a->end[i];
			j = b->end[j];
		} else {
			i++;
			j++;
		}
	}
	for (size_t x = 0, y = c.n; x + 1 < y; x++, y--) {
		struct manifest_change t = c.v[x];
		c.v[x] = c.v[y - 1];
		c.v[y - 1] = t;
	}
	/* Pass 2: additions and changes in tree order. */
	for (i = 0, j = 0; j < b->n && r == 0;) {
		int k = i < a->n ? manifest_path_cmp(a->e[i].path, b->e[j].path) : 1;
		const struct manifest_entry *x = i < a->n ? &a->e[i] : NULL, *y = &b->e[j];
		if (k < 0) {
			i = a->end[i];
		} else if (k > 0) {
			r = change_push(&c, MANIFEST_ADD, NULL, y);
			j++;
		} else if (x->type != y->type) {
			r = change_push(&c, MANIFEST_ADD, x, y);
			i++;
			j++;
		} else if (x->type == MANIFEST_DIR) {
			if (x->mode != y->mode)
				r = change_push(&c, MANIFEST_MODE, x, y);
			if (memcmp(x->hash, y->hash, CHUNK_HASH_LEN) == 0) {
				i = a->end[i];
				j = b->end[j];
			} else {
				i++;
				j++;
			}
		} else {
			if (x->size != y->size || memcmp(x->hash, y->hash, CHUNK_HASH_LEN) != 0)
				r = change_push(&c, MANIFEST_MODIFY, x, y);
			else if (x->mode != y->mode)
				r = change_push(&c, MANIFEST_MODE, x, y);
			i++;
			j++;
		}
	}
	if (r < 0) {
		mem_free(c.v);
		return r;
	}
	*out = c.v;
	*nout = c.n;
	return 0;
}

/* ---- levels and reconcile ---- */

/* [first, last) of dirpath's subtree; -ENOENT when it is not a dir. */
static int dir_range(const struct manifest *m, const char *dirpath, size_t *first, size_t *last)
{
	if (dirpath[0] == '\0') {
		*first = 0;
		*last = m->n;
		return 0;
	}
	long idx = manifest_find(m, dirpath);
	if (idx < 0 || m->e[idx].type != MANIFEST_DIR)
		return -ENOENT;
	*first = (size_t)idx + 1;
	*last = m->end[idx];
	return 0;
}

int manifest_level_encode(const struct manifest *m, const char *dirpath, struct buf *out)
{
	size_t first, last, count = 0;
	uint8_t rec[RECORD_MAX];
	int r;

	if (!m->sealed)
		return -EINVAL;
	if ((r = dir_range(m, dirpath, &first, &last)) < 0)
		return r;
	for (size_t j = first; j < last; j = m->end[j])
		count++;
	if (count > UINT32_MAX)
		return -E2BIG;
	if ((r = buf_put_u32(out, (uint32_t)count)) < 0)
		return r;
	for (size_t j = first; j < last; j = m->end[j])
		if ((r = buf_put(out, rec, record_put(rec, &m->e[j]))) < 0)
			return r;
	return 0;
}

int manifest_level_open(struct manifest_level_reader *lr, const char *dirpath, const uint8_t *level, size_t n)
{
	memset(lr, 0, sizeof(*lr));
	buf_view(&lr->in, level, n);
	lr->dir = dirpath;
	lr->dl = strlen(dirpath);
	if (buf_get_u32(&lr->in, &lr->count) < 0 || lr->count > buf_len(&lr->in) / RECORD_MIN)
		return -EBADMSG;
	lr->left = lr->count;
	return 0;
}

int manifest_level_next(struct manifest_level_reader *lr, struct manifest_entry *e)
{
	const uint8_t *name;
	size_t nl, dl = lr->dl;

	if (lr->left == 0)
		return buf_len(&lr->in) == 0 ? 0 : -EBADMSG;
	memset(e, 0, sizeof(*e));
	if (buf_get_bytes(&lr->in, &name, &nl, MANIFEST_NAME_MAX) < 0 || name_check(name, nl) < 0)
		return -EBADMSG;
	/* names strictly increasing: the order the digest was made in */
	if (lr->name) {
		int c = memcmp(lr->name, name, lr->nl < nl ? lr->nl : nl);
		if (c > 0 || (c == 0 && lr->nl >= nl))
			return -EBADMSG;
	}
	size_t pl = dl ? dl + 1 + nl : nl;
	if (pl > MANIFEST_PATH_MAX)
		return -EBADMSG;
	uint32_t mode;
	if (buf_get_u8(&lr->in, &e->type) < 0 || buf_get_u32(&lr->in, &mode) < 0 ||
	    buf_get_u64(&lr->in, &e->size) < 0 || buf_get(&lr->in, e->hash, CHUNK_HASH_LEN) < 0)
		return -EBADMSG;
	/* the caller checks the mode: one that does not fit stays invalid */
	e->mode = mode > UINT16_MAX ? UINT16_MAX : (uint16_t)mode;
	if (dl) {
		memcpy(lr->path, lr->dir, dl);
		lr->path[dl] = '/';
	}
	memcpy(lr->path + (dl ? dl + 1 : 0), name, nl);
	lr->path[pl] = '\0';
	lr->name = name;
	lr->nl = nl;
	lr->left--;
	e->path = lr->path;
	return 1;
}

struct manifest_recon {
	const struct manifest *mine;
	uint8_t peer_root[CHUNK_HASH_LEN];
	struct manifest *peer;
	size_t max_entries;
	char **queued; /* discovered, not yet handed out */
	size_t nq, capq;
	char **asked; /* handed out by the last manifest_recon_next, sorted */
	bool *answered;
	size_t nasked, nanswered;
	int err; /* sticky: a failed feed leaves the reconstruction unusable */
};

static void free_strs(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		mem_free(v[i]);
	mem_free(v);
}

void manifest_recon_free(struct manifest_recon *r)
{
	if (!r)
		return;
	manifest_free(r->peer);
	free_strs(r->queued, r->nq);
	free_strs(r->asked, r->nasked);
	mem_free(r->answered);
	mem_free(r);
}

static int queue_dir(struct manifest_recon *r, const char *path)
{
	if (r->nq == r->capq) {
		size_t ncap = r->capq ? r->capq * 2 : 16;
		char **nv = mem_realloc(r->queued, ncap * sizeof(char *));
		if (!nv)
			return -ENOMEM;
		r->queued = nv;
		r->capq = ncap;
	}
	if (!(r->queued[r->nq] = mem_strdup(path)))
		return -ENOMEM;
	r->nq++;
	return 0;
}

/* Copy mine's entries in [first, last) into the reconstruction. */
static int copy_range(struct manifest_recon *r, size_t first, size_t last)
{
	int rc;

	if (last - first > r->max_entries - r->peer->n)
		return -E2BIG;
	if ((rc = reserve_entries(r->peer, last - first)) < 0)
		return rc;
	for (size_t i = first; i < last; i++) {
		struct manifest_entry c;
		if ((rc = entry_copy(&c, &r->mine->e[i])) < 0 || (rc = add_owned(r->peer, &c)) < 0)
			return rc;
	}
	return 0;
}

int manifest_recon_new(const struct manifest *mine, const uint8_t peer_root[CHUNK_HASH_LEN], size_t max_entries,
		       struct manifest_recon **out)
{
	struct manifest_recon *r;
	int rc;

	if (!mine->sealed)
		return -EINVAL;
	if (!(r = mem_calloc(1, sizeof(*r))))
		return -ENOMEM;
	r->mine = mine;
	memcpy(r->peer_root, peer_root, CHUNK_HASH_LEN);
	r->max_entries = max_entries ? max_entries : MANIFEST_ENTRIES_MAX;
	if ((rc = manifest_new(&mine->params, &r->peer)) < 0)
		goto fail;
	if (memcmp(mine->root, peer_root, CHUNK_HASH_LEN) == 0)
		rc = copy_range(r, 0, mine->n); /* nothing to ask */
	else
		rc = queue_dir(r, "");
	if (rc < 0)
		goto fail;
	*out = r;
	return 0;
fail:
	manifest_recon_free(r);
	return rc;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

size_t manifest_recon_next(struct manifest_recon *r, const char *const **dirs)
{
	*dirs = NULL;
	if (r->err || r->nanswered < r->nasked || r->nq == 0)
		return 0;
	free_strs(r->asked, r->nasked);
	mem_free(r->answered);
	r->asked = NULL;
	r->answered = NULL;
	r->nasked = r->nanswered = 0;
	if (!(r->answered = mem_calloc(r->nq, sizeof(bool)))) {
		r->err = -ENOMEM;
		return 0;
	}
	qsort(r->queued, r->nq, sizeof(char *), str_cmp);
	r->asked = r->queued;
	r->nasked = r->nq;
	r->queued = NULL;
	r->nq = r->capq = 0;
	*dirs = (const char *const *)r->asked;
	return r->nasked;
}

static int recon_feed(struct manifest_recon *r, const char *dirpath, const uint8_t *level, size_t n)
{
	struct manifest_level_reader lr;
	struct manifest_entry e;
	int rc;

	if ((rc = manifest_level_open(&lr, dirpath, level, n)) < 0)
		return rc;
	if (lr.count > r->max_entries - r->peer->n)
		return -E2BIG;
	while ((rc = manifest_level_next(&lr, &e)) == 1) {
		if (entry_check(&r->peer->params, &e) < 0)
			return -EBADMSG;
		struct manifest_entry c;
		if ((rc = entry_copy(&c, &e)) < 0)
			return rc;
		uint8_t h[CHUNK_HASH_LEN];
		memcpy(h, e.hash, CHUNK_HASH_LEN);
		if ((rc = add_owned(r->peer, &c)) < 0)
			return rc;
		if (e.type != MANIFEST_DIR)
			continue;
		/* add_owned zeroes a dir's hash; keep the peer's until seal */
		memcpy(r->peer->e[r->peer->n - 1].hash, h, CHUNK_HASH_LEN);
		long idx = manifest_find(r->mine, e.path);
		if (idx >= 0 && r->mine->e[idx].type == MANIFEST_DIR &&
		    memcmp(r->mine->e[idx].hash, h, CHUNK_HASH_LEN) == 0)
			rc = copy_range(r, (size_t)idx + 1, r->mine->end[idx]);
		else
			rc = queue_dir(r, e.path);
		if (rc < 0)
			return rc;
	}
	return rc;
}

int manifest_recon_feed(struct manifest_recon *r, const char *dirpath, const uint8_t *level, size_t n)
{
	if (r->err)
		return r->err;
	char *key = (char *)dirpath;
	char **hit = r->asked ? bsearch(&key, r->asked, r->nasked, sizeof(char *), str_cmp) : NULL;
	if (!hit || r->answered[hit - r->asked])
		return -EPROTO;
	int rc = recon_feed(r, dirpath, level, n);
	if (rc < 0) {
		r->err = rc;
		return rc;
	}
	r->answered[hit - r->asked] = true;
	r->nanswered++;
	return 0;
}

int manifest_recon_finish(struct manifest_recon *r, struct manifest **peer)
{
	int rc;

	if (r->err)
		return r->err;
	if (r->nq > 0 || r->nanswered < r->nasked)
		return -EAGAIN;
	if ((rc = manifest_seal(r->peer)) < 0)
		return rc == -ENOMEM ? rc : -EBADMSG;
	if (memcmp(r->peer->root, r->peer_root, CHUNK_HASH_LEN) != 0)
		return -ESTALE;
	*peer = r->peer;
	r->peer = NULL;
	return 0;
}
