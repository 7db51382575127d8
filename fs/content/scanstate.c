/* SPDX-License-Identifier: Apache-2.0 */
/* scanstate: the persisted result of a full scan and its parallel stat
 * verification (scanstate.h, doc/SYNC.md "Unchanged trees"). */
#include "airlock/content/scanstate.h"

#include <assert.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/content/hcache.h"
#include "airlock/core/buf.h"
#include "airlock/core/io.h"
#include "airlock/core/mem.h"

/* CHANGE SCANSTATE_VERSION IF THE FILE FORMAT CHANGES (scanstate.h). */
static const uint8_t scanstate_magic[4] = {'A', 'L', 'S', 'S'};
#define SCANSTATE_VERSION 1
#define MAC_LEN		  32u
#define HDR_LEN		  (4 + 4 + SCANSTATE_FP_LEN + CHUNK_HASH_LEN + 4 + 8)
#define ENT_MIN		  (2 + 1 + 2 + SCANSTATE_ID_LEN)
#define WALKERS_MAX	  8u

enum {
	F_WALKED = 0x01, /* a directory the scan read: its names are compared */
	F_RACY = 0x02,	 /* changed in the scan's timestamp granule: never matches */
	F_ALL = 0x03,
};

/* One per name of a loaded state: 16 bytes (it was 64 with the identity
 * decoded in it; that stays encoded beside the path: ent_id), held from
 * the load to the verification's end. A state being built keeps no
 * entries: only its records (see struct scanstate). Offsets fit: the
 * loaded file is at most SCANSTATE_FILE_MAX bytes, a path
 * MANIFEST_PATH_MAX. */
struct ent {
	uint32_t path;	    /* offset of the NUL-terminated path in the file */
	uint32_t kids;	    /* walked directories: first child in kids[] */
	uint32_t nkids;	    /* and how many */
	uint16_t name;	    /* offset of its last component within the path */
	unsigned plen : 13; /* <= MANIFEST_PATH_MAX */
	unsigned flags : 3; /* F_* */
};
_Static_assert(SCANSTATE_FILE_MAX <= UINT32_MAX && MANIFEST_PATH_MAX < (1u << 13) && F_ALL < (1u << 3),
	       "struct ent's fields hold their values");
_Static_assert(sizeof(struct ent) == 16, "struct ent stays 16 bytes");

struct scanstate {
	/* loaded: entries in tree order, their NUL-terminated paths at
	 * file + e->path */
	struct ent *e;
	size_t n; /* names: built or loaded */
	/* built: each name's record as the file has it (be16 path length,
	 * path, NUL, flags byte, encoded identity), in the order seen; grown
	 * by mem_realloc (a large block is mremapped, not copied beside
	 * itself) and trimmed to fit at the scan's end. With a spill file
	 * (scanstate_spill), the records before the last one go to it once
	 * SCANSTATE_SPILL_AT bytes are held: a whole tree's records (67 bytes
	 * a name, 64 MB at 1M files) were held from the scan to the save,
	 * which on the host is the end of the initial sync. */
	uint8_t *rec;
	size_t rused, rcap;
	size_t last;	    /* the last record's offset in rec (n > 0) */
	int spill_fd;	    /* -1: none */
	uint64_t spilled;   /* bytes of records in it, before rec's */
	const uint8_t *recs; /* loaded: the file's records, and their length */
	size_t recs_len;
	uint32_t *kids;		   /* children of each walked directory, in name order */
	uint32_t root_kids, nroot; /* the root's range in kids */
	int64_t stamp;
	bool distrusted;
	/* loaded */
	uint8_t *file;
	size_t file_len;
	const uint8_t *mbytes; /* manifest encoding, into file */
	size_t mlen;
	const uint8_t *extra; /* into file */
	size_t extra_len;
	uint8_t root[CHUNK_HASH_LEN];
	uint32_t mcount; /* the manifest's entries */
	/* the MAC (and, when asked, the manifest's decoding) run on a thread
	 * of their own while the walkers verify: joined by scanstate_check */
	uint8_t key[SCANSTATE_KEY_LEN];
	bool decode;
	pthread_t checker;
	bool checking;	    /* the thread runs (not joined yet) */
	int check_r;	    /* 0 authentic, -EBADMSG, -ENOMEM; set by the thread */
	struct manifest *m; /* decoded by the thread (decode) */
};

/* Loaded states only (a built one has no entries). */
static const char *ent_path(const struct scanstate *st, size_t i)
{
	return (const char *)st->file + st->e[i].path;
}

/* The name's encoded identity (SCANSTATE_ID_LEN bytes) is where the file
 * has it, after the path's NUL and the flags byte. It is decoded when
 * compared, not held decoded (48 bytes a name). */
static const uint8_t *ent_id(const struct scanstate *st, size_t i)
{
	return (const uint8_t *)ent_path(st, i) + st->e[i].plen + 2;
}

static uint32_t ent_mode(const struct scanstate *st, size_t i)
{
	return buf_load_be32(ent_id(st, i) + 16);
}

void scanstate_id_encode(const struct stat *sb, uint8_t out[SCANSTATE_ID_LEN])
{
	struct hcache_key k;

	hcache_key_of(sb, &k);
	buf_store_be64(out, k.dev);
	buf_store_be64(out + 8, k.ino);
	buf_store_be32(out + 16, k.mode);
	buf_store_be64(out + 20, k.size);
	buf_store_be64(out + 28, (uint64_t)k.mtime);
	buf_store_be64(out + 36, (uint64_t)k.ctime);
}

static void id_decode(const uint8_t *p, struct hcache_key *k)
{
	k->dev = buf_load_be64(p);
	k->ino = buf_load_be64(p + 8);
	k->mode = buf_load_be32(p + 16);
	k->size = buf_load_be64(p + 20);
	k->mtime = (int64_t)buf_load_be64(p + 28);
	k->ctime = (int64_t)buf_load_be64(p + 36);
}

int scanstate_new(struct scanstate **out)
{
	struct scanstate *st = mem_calloc(1, sizeof(*st));

	*out = st;
	if (!st)
		return -ENOMEM;
	st->stamp = INT64_MIN;
	st->spill_fd = -1;
	return 0;
}

static int check_join(struct scanstate *st);

static void spill_stop(struct scanstate *st)
{
	if (st->spill_fd >= 0)
		close(st->spill_fd);
	st->spill_fd = -1;
	st->spilled = 0;
}

void scanstate_free(struct scanstate *st)
{
	if (!st)
		return;
	check_join(st);
	manifest_free(st->m);
	sodium_memzero(st->key, sizeof(st->key));
	mem_free(st->e);
	mem_free(st->kids);
	mem_free(st->rec);
	spill_stop(st);
	mem_free(st->file);
	mem_free(st);
}

void scanstate_begin(struct scanstate *st, int dirfd)
{
	st->n = 0;
	st->rused = 0;
	spill_stop(st);
	st->distrusted = false;
	st->stamp = hcache_stamp(dirfd);
}

int scanstate_spill(struct scanstate *st, int dirfd)
{
	if (st->file)
		return -EINVAL;
	spill_stop(st);
	int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	st->spill_fd = fd;
	return 0;
}

int64_t scanstate_stamp(const struct scanstate *st)
{
	return st->stamp;
}

void scanstate_distrust(struct scanstate *st)
{
	if (st)
		st->distrusted = true;
}

/* Room for n more bytes of records; -E2BIG when the file would pass
 * SCANSTATE_FILE_MAX (its offsets are u32), -ENOMEM. */
static int rec_reserve(struct scanstate *st, size_t n)
{
	if (n > SCANSTATE_FILE_MAX - st->spilled - st->rused)
		return -E2BIG;
	if (st->rcap - st->rused >= n)
		return 0;
	size_t nc = st->rcap ? st->rcap : 64u << 10;
	while (nc - st->rused < n)
		nc *= 2;
	uint8_t *np = mem_realloc(st->rec, nc);
	if (!np)
		return -ENOMEM;
	st->rec = np;
	st->rcap = nc;
	return 0;
}

/* The records held, all final (called before the next one is added), to
 * the spill file. */
static int spill(struct scanstate *st)
{
	int r = io_write_all(st->spill_fd, st->rec, st->rused);
	if (r < 0)
		return r;
	st->spilled += st->rused;
	st->rused = 0;
	return 0;
}

/* The scan is over: give back what the doubling left unused of the
 * records held until the save. A failed shrink keeps the block. */
static void trim(struct scanstate *st)
{
	if (st->rused && st->rcap > st->rused) {
		uint8_t *np = mem_realloc(st->rec, st->rused);
		if (np) {
			st->rec = np;
			st->rcap = st->rused;
		}
	}
}

void scanstate_seen(const char *relpath, const struct stat *sb, enum manifest_seen kind, void *ud)
{
	struct scanstate *st = ud;
	size_t pl = strlen(relpath);

	if (st->distrusted)
		return;
	if (kind == MANIFEST_SEEN_DONE) {
		trim(st);
		return;
	}
	if (kind == MANIFEST_SEEN_WALK) {
		/* right after the directory's own STAT: its record is the last
		 * one, still held (spilling happens before a record is added) */
		uint8_t *d = st->n ? st->rec + st->last : NULL;
		if (!d || buf_load_be16(d) != pl || memcmp(d + 2, relpath, pl) != 0)
			st->distrusted = true;
		else
			d[3 + pl] |= F_WALKED;
		return;
	}
	if (st->n >= MANIFEST_ENTRIES_MAX || pl == 0 || pl > MANIFEST_PATH_MAX) {
		st->distrusted = true;
		return;
	}
	size_t need = 2 + pl + 2 + SCANSTATE_ID_LEN;
	if ((st->spill_fd >= 0 && st->rused >= SCANSTATE_SPILL_AT && spill(st) < 0) || rec_reserve(st, need) < 0) {
		st->distrusted = true; /* no state saved: the next up scans */
		return;
	}
	struct hcache_key k;
	hcache_key_of(sb, &k);
	uint8_t *d = st->rec + st->rused;
	buf_store_be16(d, (uint16_t)pl);
	memcpy(d + 2, relpath, pl);
	d[2 + pl] = 0; /* so that a loaded state uses its paths where they are */
	d[3 + pl] = k.mtime >= st->stamp || k.ctime >= st->stamp ? F_RACY : 0;
	scanstate_id_encode(sb, d + 4 + pl);
	st->last = st->rused;
	st->rused += need;
	st->n++;
}

/* ---- the file ---- */

static void mac_of(const uint8_t key[SCANSTATE_KEY_LEN], const uint8_t *p, size_t n, uint8_t out[MAC_LEN])
{
	crypto_generichash(out, MAC_LEN, p, n, key, SCANSTATE_KEY_LEN);
}

/* The file is written as it is encoded, through one piece of at most
 * about MANIFEST_FLUSH_AT bytes (a whole-tree state is tens of MB at 100k
 * files: it was built whole in memory, the daemon's largest allocation at
 * the end of an initial sync); the MAC is computed over the same pieces. */
struct sink {
	int fd;
	size_t written;
	crypto_generichash_state mac;
};

static int sink_flush(void *ud, struct buf *b)
{
	struct sink *k = ud;
	int r;

	if (buf_len(b) > SCANSTATE_FILE_MAX - MAC_LEN - k->written)
		return -E2BIG; /* the loader would refuse it */
	k->written += buf_len(b);
	crypto_generichash_update(&k->mac, buf_ptr(b), buf_len(b));
	r = io_write_all(k->fd, buf_ptr(b), buf_len(b));
	buf_reset(b);
	return r;
}

/* p[0..n) through the sink, a piece at a time. */
static int put_pieces(struct buf *out, struct sink *k, const uint8_t *p, size_t n)
{
	int r;

	do {
		size_t m = n < MANIFEST_FLUSH_AT ? n : MANIFEST_FLUSH_AT;
		if ((r = buf_put(out, p, m)) < 0 || (r = sink_flush(k, out)) < 0)
			return r;
		p += m;
		n -= m;
	} while (n > 0);
	return 0;
}

static int encode(struct scanstate *st, const struct manifest *m, const uint8_t fp[SCANSTATE_FP_LEN], const void *extra,
		  size_t extra_len, struct buf *out, struct sink *k)
{
	size_t mlen = manifest_encoded_size(m);
	int r;

	if (mlen > UINT32_MAX)
		return -E2BIG;
	if ((r = buf_put(out, scanstate_magic, 4)) < 0 || (r = buf_put_u8(out, SCANSTATE_VERSION)) < 0 ||
	    (r = buf_put_u8(out, 0)) < 0 || (r = buf_put_u16(out, 0)) < 0 ||
	    (r = buf_put(out, fp, SCANSTATE_FP_LEN)) < 0 || (r = buf_put(out, m->root, CHUNK_HASH_LEN)) < 0 ||
	    (r = buf_put_u32(out, (uint32_t)m->n)) < 0 || (r = buf_put_u64(out, (uint64_t)st->stamp)) < 0 ||
	    (r = buf_put_u32(out, (uint32_t)mlen)) < 0)
		return r;
	size_t at = k->written + buf_len(out);
	if ((r = manifest_encode_to(m, out, sink_flush, k)) < 0)
		return r;
	assert(k->written + buf_len(out) - at == mlen);
	if ((r = buf_put_bytes(out, extra, extra_len)) < 0 || (r = buf_put_u32(out, (uint32_t)st->n)) < 0)
		return r;
	/* the records as they are: the loaded file's, or the spilled ones
	 * then those held */
	if (st->file)
		return put_pieces(out, k, st->recs, st->recs_len);
	for (uint64_t got_at = 0; got_at < st->spilled;) {
		size_t want = st->spilled - got_at < MANIFEST_FLUSH_AT ? (size_t)(st->spilled - got_at) : MANIFEST_FLUSH_AT;
		uint8_t *d;
		if ((r = buf_reserve(out, want, &d)) < 0)
			return r;
		ssize_t got = pread(st->spill_fd, d, want, (off_t)got_at);
		if (got < 0 && errno == EINTR)
			continue;
		if (got <= 0)
			return got < 0 ? -errno : -EIO;
		buf_commit(out, (size_t)got);
		got_at += (uint64_t)got;
		if ((r = sink_flush(k, out)) < 0)
			return r;
	}
	return put_pieces(out, k, st->rec, st->rused);
}

int scanstate_save(struct scanstate *st, int dirfd, const char *name, const struct manifest *m,
		   const uint8_t key[SCANSTATE_KEY_LEN], const uint8_t fp[SCANSTATE_FP_LEN], const void *extra,
		   size_t extra_len)
{
	struct sink k = {.fd = -1};
	struct buf out;
	uint8_t mac[MAC_LEN];
	char tmp[300];
	int r;

	if (strlen(name) > 200)
		return -ENAMETOOLONG;
	if (st->distrusted || extra_len > SCANSTATE_EXTRA_MAX) {
		unlinkat(dirfd, name, 0); /* the earlier one describes an older tree */
		return -ESTALE;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	if ((k.fd = openat(dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return -errno;
	buf_init(&out, SCANSTATE_FILE_MAX); /* one piece at a time (sink_flush) */
	crypto_generichash_init(&k.mac, key, SCANSTATE_KEY_LEN, MAC_LEN);
	if ((r = encode(st, m, fp, extra, extra_len, &out, &k)) == 0) {
		crypto_generichash_final(&k.mac, mac, MAC_LEN);
		r = io_write_all(k.fd, mac, MAC_LEN);
	}
	if (close(k.fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && renameat(dirfd, tmp, dirfd, name) < 0)
		r = -errno;
	if (r < 0) {
		unlinkat(dirfd, tmp, 0);
		unlinkat(dirfd, name, 0);
	}
	buf_clear(&out);
	sodium_memzero(&k.mac, sizeof(k.mac));
	return r;
}

/* Parent links and children ranges of the n entries read into st->e, all
 * checked: strictly increasing tree order, each parent a walked directory
 * listed before it. */
static int link_tree(struct scanstate *st)
{
	uint32_t *stack = NULL, *count = NULL, *parent = NULL;
	size_t depth = 0;
	int r = -EBADMSG;

	if (!(stack = mem_calloc(st->n + 1, sizeof(*stack))) || !(count = mem_calloc(st->n + 1, sizeof(*count))) ||
	    !(parent = mem_calloc(st->n + 1, sizeof(*parent))) ||
	    (st->n && !(st->kids = mem_calloc(st->n, sizeof(*st->kids))))) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < st->n; i++) {
		const char *p = ent_path(st, i);
		if (i && manifest_path_cmp(ent_path(st, i - 1), p) >= 0)
			goto out;
		/* pop to the directory holding p */
		size_t dl = st->e[i].name ? st->e[i].name - 1 : 0;
		while (depth > 0) {
			size_t d = stack[depth - 1];
			const char *dp = ent_path(st, d);
			if (st->e[d].plen == dl && !memcmp(dp, p, dl))
				break;
			depth--;
		}
		if (dl && depth == 0)
			goto out; /* its parent is not a directory the scan read */
		parent[i] = depth ? stack[depth - 1] : (uint32_t)st->n; /* n = the root */
		count[parent[i]]++;
		if (st->e[i].flags & F_WALKED) {
			if (!S_ISDIR(ent_mode(st, i)))
				goto out;
			stack[depth++] = (uint32_t)i;
		}
	}
	/* ranges: each parent's children are contiguous in kids, in order */
	uint32_t at = 0;
	for (size_t i = 0; i <= st->n; i++) {
		uint32_t c = count[i];
		if (i < st->n) {
			st->e[i].kids = at;
			st->e[i].nkids = 0;
		} else {
			st->root_kids = at;
			st->nroot = 0;
		}
		at += c;
	}
	for (size_t i = 0; i < st->n; i++) {
		uint32_t p = parent[i];
		if (p == st->n)
			st->kids[st->root_kids + st->nroot++] = (uint32_t)i;
		else
			st->kids[st->e[p].kids + st->e[p].nkids++] = (uint32_t)i;
	}
	r = 0;
out:
	mem_free(stack);
	mem_free(count);
	mem_free(parent);
	return r;
}

static int parse(struct scanstate *st, const uint8_t fp[SCANSTATE_FP_LEN])
{
	struct buf in;
	uint8_t magic[4], ver, flags, sfp[SCANSTATE_FP_LEN];
	uint16_t resv;
	uint64_t stamp;
	uint32_t count;

	buf_view(&in, st->file, st->file_len - MAC_LEN);
	if (buf_get(&in, magic, 4) < 0 || buf_get_u8(&in, &ver) < 0 || buf_get_u8(&in, &flags) < 0 ||
	    buf_get_u16(&in, &resv) < 0 || buf_get(&in, sfp, SCANSTATE_FP_LEN) < 0 ||
	    buf_get(&in, st->root, CHUNK_HASH_LEN) < 0 || buf_get_u32(&in, &st->mcount) < 0 ||
	    buf_get_u64(&in, &stamp) < 0)
		return -EBADMSG;
	if (memcmp(magic, scanstate_magic, 4) != 0 || ver != SCANSTATE_VERSION || flags || resv ||
	    sodium_memcmp(sfp, fp, SCANSTATE_FP_LEN) != 0)
		return -EBADMSG;
	st->stamp = (int64_t)stamp;
	if (buf_get_bytes(&in, &st->mbytes, &st->mlen, SCANSTATE_FILE_MAX) < 0 ||
	    buf_get_bytes(&in, &st->extra, &st->extra_len, SCANSTATE_EXTRA_MAX) < 0 || buf_get_u32(&in, &count) < 0)
		return -EBADMSG;
	if (count > MANIFEST_ENTRIES_MAX || count > buf_len(&in) / ENT_MIN)
		return -EBADMSG;
	if (count && !(st->e = mem_calloc(count, sizeof(*st->e))))
		return -ENOMEM;
	st->recs = buf_ptr(&in);
	st->recs_len = buf_len(&in);
	for (uint32_t i = 0; i < count; i++) {
		uint16_t pl;
		if (buf_get_u16(&in, &pl) < 0 || pl == 0 || pl > MANIFEST_PATH_MAX ||
		    buf_len(&in) < (size_t)pl + 2 + SCANSTATE_ID_LEN)
			return -EBADMSG;
		const char *p = (const char *)buf_ptr(&in);
		if (p[pl] != '\0' || manifest_path_check(p, pl) < 0)
			return -EBADMSG;
		struct ent *e = &st->e[i];
		e->path = (uint32_t)((const uint8_t *)p - st->file);
		e->plen = pl & 0x1fffu; /* <= MANIFEST_PATH_MAX: checked above */
		const char *slash = memrchr(p, '/', pl);
		e->name = slash ? (uint16_t)(slash - p + 1) : 0;
		buf_consume(&in, (size_t)pl + 1);
		uint8_t fl = *buf_ptr(&in);
		buf_consume(&in, 1);
		if (fl & ~F_ALL)
			return -EBADMSG;
		e->flags = fl & F_ALL;
		buf_consume(&in, SCANSTATE_ID_LEN);
		st->n++;
	}
	if (buf_len(&in) != 0)
		return -EBADMSG;
	return link_tree(st);
}

static int decode_manifest(const struct scanstate *st, struct manifest **out)
{
	*out = NULL;
	if (!st->mbytes)
		return -EINVAL;
	int r = manifest_decode(st->mbytes, st->mlen, 0, out);
	if (r == 0 && (memcmp((*out)->root, st->root, CHUNK_HASH_LEN) != 0 || (*out)->n != st->mcount)) {
		manifest_free(*out);
		*out = NULL;
		r = -EBADMSG;
	}
	return r;
}

/* The MAC over the file, then (decode) its manifest. */
static void *check_thread(void *arg)
{
	struct scanstate *st = arg;
	uint8_t mac[MAC_LEN];

	mac_of(st->key, st->file, st->file_len - MAC_LEN, mac);
	st->check_r = sodium_memcmp(mac, st->file + st->file_len - MAC_LEN, MAC_LEN) ? -EBADMSG : 0;
	if (st->check_r == 0 && st->decode && (st->check_r = decode_manifest(st, &st->m)) < 0)
		st->check_r = st->check_r == -ENOMEM ? -ENOMEM : -EBADMSG;
	return NULL;
}

static int check_join(struct scanstate *st)
{
	if (st->checking) {
		pthread_join(st->checker, NULL);
		st->checking = false;
	}
	return st->check_r;
}

int scanstate_check(struct scanstate *st)
{
	return check_join(st);
}

int scanstate_load(int dirfd, const char *name, const uint8_t key[SCANSTATE_KEY_LEN],
		   const uint8_t fp[SCANSTATE_FP_LEN], unsigned flags, struct scanstate **out)
{
	struct scanstate *st = NULL;
	struct stat sb;
	int fd, r;

	*out = NULL;
	if ((fd = openat(dirfd, name, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC)) < 0)
		return errno == ENOENT ? -ENOENT : -EBADMSG;
	if (fstat(fd, &sb) < 0 || !S_ISREG(sb.st_mode) || sb.st_size < HDR_LEN + MAC_LEN ||
	    (uint64_t)sb.st_size > SCANSTATE_FILE_MAX) {
		close(fd);
		return -EBADMSG;
	}
	if ((r = scanstate_new(&st)) < 0) {
		close(fd);
		return r;
	}
	memcpy(st->key, key, SCANSTATE_KEY_LEN);
	st->decode = flags & SCANSTATE_LOAD_DECODE;
	st->file_len = (size_t)sb.st_size;
	if (!(st->file = mem_alloc(st->file_len))) {
		close(fd);
		scanstate_free(st);
		return -ENOMEM;
	}
	r = chunk_read_fd(&fd, 0, st->file, st->file_len);
	close(fd);
	/* the MAC beside the walk; nothing of the state is trusted before
	 * scanstate_check says it is authentic (parsing and walking check
	 * every byte they use) */
	if (r == 0 && (r = parse(st, fp)) == 0) {
		/* parse set what the thread reads; nothing changes it after */
		st->check_r = -EBADMSG;
		if (pthread_create(&st->checker, NULL, check_thread, st) == 0)
			st->checking = true;
		else
			check_thread(st);
	}
	if (r < 0) {
		scanstate_free(st);
		return r == -ENOMEM ? r : -EBADMSG;
	}
	*out = st;
	return 0;
}

const uint8_t *scanstate_root(const struct scanstate *st)
{
	return st->root;
}

int scanstate_manifest(struct scanstate *st, struct manifest **out)
{
	int r = check_join(st);

	*out = NULL;
	if (r < 0)
		return r;
	if (st->m) {
		*out = st->m;
		st->m = NULL;
		return 0;
	}
	return decode_manifest(st, out);
}

size_t scanstate_manifest_count(const struct scanstate *st)
{
	return st->mcount;
}

const uint8_t *scanstate_extra(const struct scanstate *st, size_t *n)
{
	*n = st->extra_len;
	return st->extra;
}

size_t scanstate_count(const struct scanstate *st)
{
	return st->n;
}

/* ---- verification ----
 *
 * A shared stack of directories (entry index; st->n for the root) and a
 * few walkers. A walker opens its directory beneath the root (openat2
 * RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS through manifest_open_beneath, so
 * no descriptor is held per queued directory), fstatat's each saved child
 * relative to it and compares (the root alone is read with getdents64,
 * each name looked up among the saved children: verify_dir says why).
 * The first difference stops every walker. No allocation in the walkers
 * (mem's failure injection is not for threads). */

struct verify {
	struct scanstate *st;
	int rootfd;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	uint32_t *stack; /* protected by lock */
	size_t top;	 /* protected by lock */
	unsigned busy;	 /* walkers holding a directory; protected by lock */
	atomic_bool differs;
	atomic_uint_fast64_t dirs, names;
	char first[MANIFEST_PATH_MAX + 1]; /* protected by lock */
};

static void differ(struct verify *v, uint32_t dir, const char *name)
{
	pthread_mutex_lock(&v->lock);
	if (!atomic_load(&v->differs)) {
		const char *dp = dir == v->st->n ? "" : ent_path(v->st, dir);
		/* a name, or the directory whose names differ ("." the root) */
		snprintf(v->first, sizeof(v->first), "%s%s%s", dp, dp[0] && name[0] ? "/" : "",
			 name[0] || dp[0] ? name : ".");
		atomic_store(&v->differs, true);
	}
	pthread_cond_broadcast(&v->cond);
	pthread_mutex_unlock(&v->lock);
}

static long kid_find(const struct scanstate *st, uint32_t first, uint32_t n, const char *name)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		uint32_t k = st->kids[first + mid];
		int c = strcmp(ent_path(st, k) + st->e[k].name, name);
		if (c == 0)
			return k;
		if (c < 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return -1;
}

struct linux_dirent64 {
	uint64_t d_ino;
	int64_t d_off;
	unsigned short d_reclen;
	unsigned char d_type;
	char d_name[];
};

#define RESERVED_LEN (sizeof(MANIFEST_RESERVED_PREFIX) - 1)

/* Name k of directory d (open at fd) against its saved identity; a walked
 * directory that matches is queued. false when it differs (said). */
static bool check_name(struct verify *v, uint32_t d, int fd, uint32_t k, const char *name)
{
	struct scanstate *st = v->st;
	const struct ent *e = &st->e[k];
	struct stat sb;
	struct hcache_key now, was;

	if (fstatat(fd, name, &sb, AT_SYMLINK_NOFOLLOW) < 0) {
		differ(v, d, name);
		return false;
	}
	atomic_fetch_add_explicit(&v->names, 1, memory_order_relaxed);
	hcache_key_of(&sb, &now);
	id_decode(ent_id(st, k), &was);
	bool same = S_ISDIR(was.mode) && !(e->flags & F_WALKED)
			? (now.mode & S_IFMT) == (was.mode & S_IFMT) /* skipped: its type only */
			: !(e->flags & F_RACY) && hcache_key_eq(&now, &was);
	if (!same) {
		differ(v, d, name);
		return false;
	}
	if (e->flags & F_WALKED) {
		pthread_mutex_lock(&v->lock);
		v->stack[v->top++] = k; /* room: each directory is pushed once */
		pthread_cond_signal(&v->cond);
		pthread_mutex_unlock(&v->lock);
	}
	return true;
}

/* The root's names as the disk lists them (getdents64): each must be a
 * saved one, and all of them there. */
static void verify_listed(struct verify *v, uint32_t d, int fd, uint8_t *dents, size_t dents_len)
{
	struct scanstate *st = v->st;
	uint32_t first = st->root_kids, nk = st->nroot, matched = 0;

	for (;;) {
		long got = syscall(SYS_getdents64, fd, dents, dents_len);
		if (got < 0 && errno == EINTR)
			continue;
		if (got < 0) {
			differ(v, d, "");
			return;
		}
		if (got == 0)
			break;
		for (long off = 0; off < got && !atomic_load_explicit(&v->differs, memory_order_relaxed);) {
			struct linux_dirent64 *de = (struct linux_dirent64 *)(dents + off);
			const char *name = de->d_name;
			off += de->d_reclen;
			if (name[0] == '.' && (!name[1] || (name[1] == '.' && !name[2])))
				continue;
			if (!strncmp(name, MANIFEST_RESERVED_PREFIX, RESERVED_LEN))
				continue; /* never scanned (apply's temporaries) */
			size_t nl = strlen(name);
			if (nl > MANIFEST_NAME_MAX || nl > MANIFEST_PATH_MAX)
				continue; /* never scanned either: too long (the scan reported it) */
			long k = kid_find(st, first, nk, name);
			if (k < 0) {
				differ(v, d, name);
				return;
			}
			if (!check_name(v, d, fd, (uint32_t)k, name))
				return;
			matched++;
		}
		if (atomic_load_explicit(&v->differs, memory_order_relaxed))
			return;
	}
	if (matched != nk)
		differ(v, d, ""); /* a name is gone */
}

/* Compare directory d with the disk. Below the root, a directory is
 * walked only after its own identity matched in its parent: its mtime and
 * ctime (which every create, link, unlink and rename in it moves, and no
 * user can set back: utimensat moves the ctime) say its names are the
 * saved ones, so each saved name is looked at and nothing is listed. The
 * root, whose own identity is not saved, is listed. */
static void verify_dir(struct verify *v, uint32_t d, uint8_t *dents, size_t dents_len)
{
	struct scanstate *st = v->st;
	int fd;

	fd = d == st->n ? openat(v->rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC)
			: manifest_open_beneath(v->rootfd, ent_path(st, d), O_RDONLY | O_DIRECTORY, false);
	if (fd < 0) {
		differ(v, d, "");
		return;
	}
	atomic_fetch_add(&v->dirs, 1);
	if (d == st->n) {
		verify_listed(v, d, fd, dents, dents_len);
	} else {
		const struct ent *de = &st->e[d];
		for (uint32_t i = 0; i < de->nkids && !atomic_load_explicit(&v->differs, memory_order_relaxed); i++) {
			uint32_t k = st->kids[de->kids + i];
			if (!check_name(v, d, fd, k, ent_path(st, k) + st->e[k].name))
				break;
		}
	}
	close(fd);
}

static void *walker(void *arg)
{
	struct verify *v = arg;
	uint8_t dents[32768] __attribute__((aligned(8)));

	pthread_mutex_lock(&v->lock);
	for (;;) {
		while (!v->top && v->busy && !atomic_load(&v->differs))
			pthread_cond_wait(&v->cond, &v->lock);
		if (atomic_load(&v->differs) || (!v->top && !v->busy))
			break;
		uint32_t d = v->stack[--v->top];
		v->busy++;
		pthread_mutex_unlock(&v->lock);
		verify_dir(v, d, dents, sizeof(dents));
		pthread_mutex_lock(&v->lock);
		v->busy--;
		if (!v->top && !v->busy)
			pthread_cond_broadcast(&v->cond);
	}
	pthread_cond_broadcast(&v->cond);
	pthread_mutex_unlock(&v->lock);
	return NULL;
}

int scanstate_verify(struct scanstate *st, int rootfd, unsigned threads, struct scanstate_verify_stats *vs)
{
	struct verify v = {.st = st, .rootfd = rootfd};
	pthread_t tid[WALKERS_MAX];
	unsigned started = 0;

	if (!threads) {
		long c = sysconf(_SC_NPROCESSORS_ONLN);
		threads = c < 1 ? 1 : c > WALKERS_MAX ? WALKERS_MAX : (unsigned)c;
	}
	if (threads > WALKERS_MAX)
		threads = WALKERS_MAX;
	if (!(v.stack = mem_calloc(st->n + 1, sizeof(*v.stack))))
		return -ENOMEM;
	pthread_mutex_init(&v.lock, NULL);
	pthread_cond_init(&v.cond, NULL);
	atomic_init(&v.differs, false);
	atomic_init(&v.dirs, 0);
	atomic_init(&v.names, 0);
	v.stack[v.top++] = (uint32_t)st->n; /* the root */
	for (unsigned i = 1; i < threads; i++)
		if (pthread_create(&tid[started], NULL, walker, &v) == 0)
			started++;
	walker(&v);
	for (unsigned i = 0; i < started; i++)
		pthread_join(tid[i], NULL);
	pthread_cond_destroy(&v.cond);
	pthread_mutex_destroy(&v.lock);
	mem_free(v.stack);
	bool differs = atomic_load(&v.differs);
	int auth = check_join(st);
	if (auth < 0)
		return auth == -ENOMEM ? auth : -EBADMSG;
	if (vs) {
		vs->dirs = atomic_load(&v.dirs);
		vs->names = atomic_load(&v.names);
		vs->threads = started + 1;
		snprintf(vs->first, sizeof(vs->first), "%s", differs ? v.first : "");
	}
	return differs ? 0 : 1;
}
