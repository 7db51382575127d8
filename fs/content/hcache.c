/* SPDX-License-Identifier: Apache-2.0 */
/* hcache: stat-keyed content-hash cache (hcache.h, doc/SYNC.md §3). */
#include "airlock/content/hcache.h"

#include <assert.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/buf.h"
#include "airlock/core/io.h"
#include "airlock/core/mem.h"

/* CHANGE HCACHE_VERSION IF THE FILE FORMAT CHANGES (doc/SYNC.md §3). */
static const uint8_t hcache_magic[4] = {'A', 'L', 'H', 'C'};
#define HCACHE_VERSION 2 /* 2: file hash of multi-chunk files is the list hash */
#define HDR_LEN	       (4 + 4 + 4 * 4 + 8)
#define ENT_MIN	       (2 + 1 + 5 * 8 + 4 + CHUNK_HASH_LEN + 4)
#define REC_LEN	       (4 + CHUNK_HASH_LEN)

/* One loaded entry, read from its record in c->file when looked up (the
 * table holds only the record's offset: 4 bytes a slot instead of a
 * parsed copy of every entry). */
struct ent {
	const char *path; /* into c->file */
	size_t plen;
	struct hcache_key k;
	const uint8_t *hash;
	const uint8_t *recs; /* nchunks chunk records, into c->file */
	uint32_t nchunks;
};

struct hcache {
	struct chunk_params p;
	uint8_t *file; /* loaded bytes (< 4 GiB: HCACHE_FILE_MAX) */
	size_t nfile;  /* their length without the checksum */
	size_t nents;
	uint32_t *slots; /* open addressing: offset of a record in file, 0 = empty */
	size_t nslots;	 /* power of two */
	struct buf next; /* entries put during this scan, encoded (not spilled yet) */
	uint64_t nnext;
	/* The entries put are written out as the scan goes, once HCACHE_SPILL_AT
	 * bytes are held (they were all held until the save: at the end of a
	 * rescan, beside the loaded cache they mostly repeat). Into `name`.tmp
	 * in the directory hcache_load was given, after a header left blank;
	 * hcache_save finishes that file. */
	int spill_dirfd; /* hcache_load's (not owned); -1: none given */
	char spill_name[201];
	int spill_fd;	/* -1: nothing spilled */
	size_t spilled; /* entry bytes in it */
	int spill_err;	/* a failed spill: the save fails (the entries are lost) */
	int64_t stamp;	/* ns: entries with mtime or ctime >= stamp are racy */
	uint64_t hits, misses, racy;
};

void hcache_key_of(const struct stat *st, struct hcache_key *k)
{
	k->dev = (uint64_t)st->st_dev;
	k->ino = (uint64_t)st->st_ino;
	k->size = (uint64_t)st->st_size;
	k->mtime = (int64_t)st->st_mtim.tv_sec * 1000000000 + st->st_mtim.tv_nsec;
	k->ctime = (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
	k->mode = (uint32_t)st->st_mode;
}

bool hcache_key_eq(const struct hcache_key *a, const struct hcache_key *b)
{
	return a->ino == b->ino && a->size == b->size && a->mtime == b->mtime && a->ctime == b->ctime &&
	       a->mode == b->mode;
}

static uint64_t path_hash(const char *p, size_t n)
{
	uint8_t h[CHUNK_HASH_LEN];

	chunk_hash(p, n, h);
	return buf_load_be64(h);
}

static void drop_loaded(struct hcache *c)
{
	mem_free(c->file);
	mem_free(c->slots);
	c->file = NULL;
	c->slots = NULL;
	c->nents = c->nslots = c->nfile = 0;
}

int hcache_new(const struct chunk_params *p, struct hcache **out)
{
	struct hcache *c = mem_calloc(1, sizeof(*c));

	*out = NULL;
	if (!c)
		return -ENOMEM;
	c->p = p ? *p : chunk_params_default;
	buf_init(&c->next, HCACHE_FILE_MAX);
	c->stamp = INT64_MIN; /* nothing is kept before hcache_begin */
	c->spill_dirfd = c->spill_fd = -1;
	*out = c;
	return 0;
}

/* Forget what was spilled (its file too). */
static void spill_drop(struct hcache *c)
{
	if (c->spill_fd >= 0) {
		char tmp[300];
		close(c->spill_fd);
		snprintf(tmp, sizeof(tmp), "%s.tmp", c->spill_name);
		unlinkat(c->spill_dirfd, tmp, 0);
	}
	c->spill_fd = -1;
	c->spilled = 0;
	c->spill_err = 0;
}

void hcache_free(struct hcache *c)
{
	if (!c)
		return;
	spill_drop(c);
	drop_loaded(c);
	buf_clear(&c->next);
	mem_free(c);
}

static int get_key(struct buf *in, struct hcache_key *k)
{
	uint64_t m, t;
	int r;

	if ((r = buf_get_u64(in, &k->dev)) < 0 || (r = buf_get_u64(in, &k->ino)) < 0 ||
	    (r = buf_get_u64(in, &k->size)) < 0 || (r = buf_get_u64(in, &m)) < 0 || (r = buf_get_u64(in, &t)) < 0 ||
	    (r = buf_get_u32(in, &k->mode)) < 0)
		return r;
	k->mtime = (int64_t)m;
	k->ctime = (int64_t)t;
	return 0;
}

_Static_assert(HCACHE_FILE_MAX < UINT32_MAX, "record offsets are u32");

/* The entry whose record starts at `in` (its remaining bytes): the layout
 * of one record, checked. */
static int ent_read(struct buf *in, struct ent *e)
{
	uint16_t l16;
	size_t pl;

	if (buf_get_u16(in, &l16) < 0 || (pl = l16) == 0 || pl > MANIFEST_PATH_MAX || buf_len(in) < pl)
		return -EBADMSG;
	e->path = (const char *)buf_ptr(in);
	e->plen = pl;
	buf_consume(in, pl);
	if (get_key(in, &e->k) < 0 || buf_len(in) < CHUNK_HASH_LEN + 4)
		return -EBADMSG;
	e->hash = buf_ptr(in);
	buf_consume(in, CHUNK_HASH_LEN);
	if (buf_get_u32(in, &e->nchunks) < 0 || e->nchunks > buf_len(in) / REC_LEN)
		return -EBADMSG;
	e->recs = buf_ptr(in);
	buf_consume(in, (size_t)e->nchunks * REC_LEN);
	return 0;
}

/* The entry at offset off of the loaded file (checked by parse). */
static void ent_at(const struct hcache *c, uint32_t off, struct ent *e)
{
	struct buf in;

	buf_view(&in, c->file + off, c->nfile - off);
	int r = ent_read(&in, e);
	assert(r == 0);
	(void)r;
}

/* Parse c->file (n bytes, checksum already checked): every record checked,
 * its offset put in c->slots. */
static int parse(struct hcache *c, size_t n)
{
	struct buf in;
	uint8_t magic[4], ver, flags;
	uint16_t resv;
	struct chunk_params p;
	uint64_t count;

	c->nfile = n - CHUNK_HASH_LEN;
	buf_view(&in, c->file, c->nfile);
	if (buf_get(&in, magic, 4) < 0 || buf_get_u8(&in, &ver) < 0 || buf_get_u8(&in, &flags) < 0 ||
	    buf_get_u16(&in, &resv) < 0 || buf_get_u32(&in, &p.min) < 0 || buf_get_u32(&in, &p.avg) < 0 ||
	    buf_get_u32(&in, &p.max) < 0 || buf_get_u32(&in, &p.whole_max) < 0 || buf_get_u64(&in, &count) < 0)
		return -EBADMSG;
	if (memcmp(magic, hcache_magic, 4) != 0 || ver != HCACHE_VERSION || flags || resv ||
	    memcmp(&p, &c->p, sizeof(p)) != 0 || count > MANIFEST_ENTRIES_MAX || count > buf_len(&in) / ENT_MIN)
		return -EBADMSG;
	size_t ns = 16;
	while (ns < 2 * count)
		ns <<= 1;
	if (!(c->slots = mem_calloc(ns, sizeof(*c->slots))))
		return -ENOMEM;
	c->nslots = ns;
	for (uint64_t i = 0; i < count; i++) {
		struct ent e;
		uint32_t off = (uint32_t)(c->nfile - buf_len(&in));
		if (ent_read(&in, &e) < 0)
			return -EBADMSG;
		size_t s = (size_t)path_hash(e.path, e.plen) & (ns - 1);
		while (c->slots[s])
			s = (s + 1) & (ns - 1);
		c->slots[s] = off; /* >= HDR_LEN, never 0 */
		c->nents++;
	}
	return buf_len(&in) == 0 ? 0 : -EBADMSG;
}

int hcache_load(struct hcache *c, int dirfd, const char *name)
{
	struct stat st;
	int fd, r = 0;

	drop_loaded(c);
	spill_drop(c);
	size_t nl = strlen(name);
	c->spill_dirfd = -1; /* a name too long to keep: nothing spilled */
	if (nl < sizeof(c->spill_name)) {
		memcpy(c->spill_name, name, nl + 1);
		c->spill_dirfd = dirfd;
	}
	if ((fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)) < 0)
		return errno == ENOENT ? -ENOENT : -EBADMSG;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < HDR_LEN + CHUNK_HASH_LEN ||
	    (uint64_t)st.st_size > HCACHE_FILE_MAX) {
		close(fd);
		return -EBADMSG;
	}
	size_t n = (size_t)st.st_size;
	if (!(c->file = mem_alloc(n))) {
		close(fd);
		return -ENOMEM;
	}
	r = chunk_read_fd(&fd, 0, c->file, n);
	close(fd);
	uint8_t sum[CHUNK_HASH_LEN];
	if (r == 0) {
		chunk_hash(c->file, n - CHUNK_HASH_LEN, sum);
		r = memcmp(sum, c->file + n - CHUNK_HASH_LEN, CHUNK_HASH_LEN) ? -EBADMSG : parse(c, n);
	}
	if (r < 0) {
		drop_loaded(c);
		return r == -ENOMEM ? r : -EBADMSG;
	}
	return 0;
}

int64_t hcache_stamp(int dirfd)
{
	struct timespec now;
	struct stat st;
	int fd;

	/* The filesystem's own clock: what it will stamp on the next change. */
	fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd >= 0 && fstat(fd, &st) == 0) {
		close(fd);
		return (int64_t)st.st_ctim.tv_sec * 1000000000 + st.st_ctim.tv_nsec;
	}
	if (fd >= 0)
		close(fd);
	clock_gettime(CLOCK_REALTIME, &now);
	return ((int64_t)now.tv_sec - 2) * 1000000000 + now.tv_nsec;
}

void hcache_begin(struct hcache *c, int scan_dirfd)
{
	spill_drop(c);
	buf_reset(&c->next);
	c->nnext = c->hits = c->misses = c->racy = 0;
	c->stamp = hcache_stamp(scan_dirfd);
}

int hcache_get(struct hcache *c, const char *path, const struct stat *st, struct manifest_entry *e)
{
	struct hcache_key k;
	size_t pl = strlen(path);

	if (!c->nslots || !S_ISREG(st->st_mode)) {
		c->misses++;
		return 0;
	}
	hcache_key_of(st, &k);
	for (size_t s = (size_t)path_hash(path, pl) & (c->nslots - 1); c->slots[s]; s = (s + 1) & (c->nslots - 1)) {
		struct ent xe;
		const struct ent *x = &xe;
		ent_at(c, c->slots[s], &xe);
		if (x->plen != pl || memcmp(x->path, path, pl) != 0)
			continue;
		/* Racy on this scan's clock too (a clock set back): not trusted. */
		if (!hcache_key_eq(&x->k, &k) || k.mtime >= c->stamp || k.ctime >= c->stamp)
			break;
		struct chunk *v = NULL;
		bool big = k.size > c->p.whole_max;
		if (big != (x->nchunks > 0))
			break;
		if (big) {
			if (!(v = mem_calloc(x->nchunks, sizeof(*v))))
				return -ENOMEM;
			uint64_t off = 0;
			for (uint32_t i = 0; i < x->nchunks; i++) {
				const uint8_t *q = x->recs + (size_t)i * REC_LEN;
				v[i].off = off;
				v[i].len = buf_load_be32(q);
				memcpy(v[i].hash, q + 4, CHUNK_HASH_LEN);
				off += v[i].len;
			}
			if (chunk_list_check(&c->p, v, x->nchunks, k.size) < 0) {
				mem_free(v);
				break;
			}
		}
		e->mode = (uint32_t)st->st_mode & MANIFEST_MODE_MASK;
		e->size = k.size;
		memcpy(e->hash, x->hash, CHUNK_HASH_LEN);
		e->chunks = v;
		e->nchunks = big ? x->nchunks : 0;
		c->hits++;
		return 1;
	}
	c->misses++;
	return 0;
}

/* c->next to the spill file (opened, its header left blank, the first
 * time). */
static int spill(struct hcache *c)
{
	static const uint8_t blank[HDR_LEN];
	char tmp[300];
	int r;

	if (c->spill_fd < 0) {
		snprintf(tmp, sizeof(tmp), "%s.tmp", c->spill_name);
		c->spill_fd = openat(c->spill_dirfd, tmp, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (c->spill_fd < 0)
			return -errno;
		if ((r = io_write_all(c->spill_fd, blank, sizeof(blank))) < 0)
			return r;
	}
	if ((r = io_write_all(c->spill_fd, buf_ptr(&c->next), buf_len(&c->next))) < 0)
		return r;
	c->spilled += buf_len(&c->next);
	buf_reset(&c->next);
	return 0;
}

int hcache_put(struct hcache *c, const char *path, const struct stat *st, const struct manifest_entry *e)
{
	struct hcache_key k;
	size_t pl = strlen(path), mark = buf_len(&c->next);
	int r;

	hcache_key_of(st, &k);
	if (k.mtime >= c->stamp || k.ctime >= c->stamp || !S_ISREG(st->st_mode) || k.size != e->size) {
		c->racy++;
		return 0;
	}
	if (c->nnext >= MANIFEST_ENTRIES_MAX || pl == 0 || pl > MANIFEST_PATH_MAX)
		return -E2BIG;
	if ((r = buf_put_u16(&c->next, (uint16_t)pl)) < 0 || (r = buf_put(&c->next, path, pl)) < 0 ||
	    (r = buf_put_u64(&c->next, k.dev)) < 0 || (r = buf_put_u64(&c->next, k.ino)) < 0 ||
	    (r = buf_put_u64(&c->next, k.size)) < 0 || (r = buf_put_u64(&c->next, (uint64_t)k.mtime)) < 0 ||
	    (r = buf_put_u64(&c->next, (uint64_t)k.ctime)) < 0 || (r = buf_put_u32(&c->next, k.mode)) < 0 ||
	    (r = buf_put(&c->next, e->hash, CHUNK_HASH_LEN)) < 0 ||
	    (r = buf_put_u32(&c->next, (uint32_t)e->nchunks)) < 0)
		goto fail;
	for (size_t i = 0; i < e->nchunks; i++)
		if ((r = buf_put_u32(&c->next, e->chunks[i].len)) < 0 ||
		    (r = buf_put(&c->next, e->chunks[i].hash, CHUNK_HASH_LEN)) < 0)
			goto fail;
	c->nnext++;
	if (buf_len(&c->next) >= HCACHE_SPILL_AT && c->spill_dirfd >= 0 && !c->spill_err && (r = spill(c)) < 0)
		c->spill_err = r; /* this scan's cache is not saved; the scan goes on */
	return 0;
fail:
	buf_truncate(&c->next, mark); /* drop the partial entry */
	return r == -ENOBUFS ? -E2BIG : r;
}

static int put_header(const struct hcache *c, struct buf *hdr)
{
	int r;

	if ((r = buf_put(hdr, hcache_magic, 4)) < 0 || (r = buf_put_u8(hdr, HCACHE_VERSION)) < 0 ||
	    (r = buf_put_u8(hdr, 0)) < 0 || (r = buf_put_u16(hdr, 0)) < 0 || (r = buf_put_u32(hdr, c->p.min)) < 0 ||
	    (r = buf_put_u32(hdr, c->p.avg)) < 0 || (r = buf_put_u32(hdr, c->p.max)) < 0 ||
	    (r = buf_put_u32(hdr, c->p.whole_max)) < 0 || (r = buf_put_u64(hdr, c->nnext)) < 0)
		return r;
	return 0;
}

/* The spill file finished: the rest of the entries, the header in its
 * place, the checksum of both read back from the file (the page cache) a
 * piece at a time. */
static int spill_finish(struct hcache *c, const struct buf *hdr, int fd)
{
	struct chunk_hasher h;
	uint8_t sum[CHUNK_HASH_LEN];
	size_t n = HDR_LEN + c->spilled + buf_len(&c->next);
	uint8_t *piece = mem_alloc(HCACHE_SPILL_AT);
	int r;

	if (!piece)
		return -ENOMEM;
	if ((r = io_write_all(fd, buf_ptr(&c->next), buf_len(&c->next))) < 0)
		goto out;
	if (pwrite(fd, buf_ptr(hdr), buf_len(hdr), 0) != (ssize_t)buf_len(hdr)) {
		r = -EIO;
		goto out;
	}
	chunk_hasher_init(&h);
	for (size_t off = 0; off < n;) {
		size_t want = n - off < HCACHE_SPILL_AT ? n - off : HCACHE_SPILL_AT;
		ssize_t k = pread(fd, piece, want, (off_t)off);
		if (k <= 0) {
			r = k < 0 ? -errno : -EIO;
			goto out;
		}
		chunk_hasher_update(&h, piece, (size_t)k);
		off += (size_t)k;
	}
	chunk_hasher_final(&h, sum);
	r = io_write_all(fd, sum, CHUNK_HASH_LEN);
out:
	mem_free(piece);
	return r;
}

/* The header, then the entries straight from c->next (no copy of them:
 * at a million files that copy was the daemon's largest allocation),
 * then the checksum over both, hashed as they are written; or, when the
 * scan spilled them, its file finished (spill_finish). */
int hcache_save(struct hcache *c, int dirfd, const char *name)
{
	struct buf hdr;
	struct chunk_hasher h;
	uint8_t sum[CHUNK_HASH_LEN];
	char tmp[300];
	int fd, r;

	if (strlen(name) > 200)
		return -ENAMETOOLONG;
	if (HDR_LEN + c->spilled + buf_len(&c->next) + CHUNK_HASH_LEN > HCACHE_FILE_MAX)
		return -ENOBUFS;
	if (c->spill_err)
		return c->spill_err;
	if (c->spill_fd >= 0 && (dirfd != c->spill_dirfd || strcmp(name, c->spill_name) != 0))
		return -EINVAL; /* spilled beside another file */
	buf_init(&hdr, HDR_LEN);
	if ((r = put_header(c, &hdr)) < 0)
		goto out;
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	if (c->spill_fd >= 0) {
		r = spill_finish(c, &hdr, c->spill_fd);
		fd = c->spill_fd;
		c->spill_fd = -1;
	} else if ((fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		goto out;
	} else {
		chunk_hasher_init(&h);
		chunk_hasher_update(&h, buf_ptr(&hdr), buf_len(&hdr));
		chunk_hasher_update(&h, buf_ptr(&c->next), buf_len(&c->next));
		chunk_hasher_final(&h, sum);
		if ((r = io_write_all(fd, buf_ptr(&hdr), buf_len(&hdr))) == 0 &&
		    (r = io_write_all(fd, buf_ptr(&c->next), buf_len(&c->next))) == 0)
			r = io_write_all(fd, sum, CHUNK_HASH_LEN);
	}
	/* No fsync: a torn cache fails its checksum and is ignored. */
	close(fd);
	if (r == 0 && renameat(dirfd, tmp, dirfd, name) < 0)
		r = -errno;
	if (r < 0)
		unlinkat(dirfd, tmp, 0);
	c->spilled = 0;
out:
	buf_clear(&hdr);
	return r;
}

void hcache_trim(struct hcache *c)
{
	if (!c)
		return;
	spill_drop(c);
	drop_loaded(c);
	buf_clear(&c->next);
	buf_init(&c->next, HCACHE_FILE_MAX);
	c->nnext = 0;
}

void hcache_counts(const struct hcache *c, uint64_t *hits, uint64_t *misses, uint64_t *racy)
{
	*hits = c->hits;
	*misses = c->misses;
	*racy = c->racy;
}
