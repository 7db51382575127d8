/* SPDX-License-Identifier: Apache-2.0 */
/*
 * journal: see include/airlock/mount/journal.h for the contract.
 *
 * Pending records live in a FIFO (oldest first) of heap nodes. A hash index
 * keyed by (class, path) finds, for coalescing, the newest pending precise
 * record of a path (class PRECISE) or the pending RESCAN of a path (class
 * RESCAN). Both only ever point at nodes still in the FIFO: drain unhooks
 * what it takes.
 *
 * Ordering argument for the bounds: once the precise cap is hit, the journal
 * is "degraded" until it has been drained empty, so every RESCAN in the FIFO
 * comes after every precise record. RESCANs read current state when applied,
 * so their relative order and merging later operations into an earlier
 * RESCAN do not matter.
 */
#include "airlock/mount/journal.h"

#include <errno.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>

#include "airlock/core/mem.h"

enum { CLS_PRECISE = 0, CLS_RESCAN = 1 };

struct jnode {
	struct journal_rec rec;
	struct jnode *next;  /* FIFO */
	struct jnode *hnext; /* hash chain, when indexed */
	uint64_t hash;
	uint64_t gen; /* rename generation when indexed (PRECISE) */
	unsigned cls : 1;
	unsigned indexed : 1;
	unsigned top : 1; /* RESCAN of a top-level entry (counted in ntop) */
};

struct journal {
	pthread_mutex_t lock;
	/* everything below is protected by lock */
	struct jnode *head, *tail;
	size_t npending;  /* nodes in the FIFO */
	size_t nprecise;  /* ... of which precise */
	size_t nrescan;	  /* ... of which RESCAN of a full path */
	size_t ntop;	  /* ... of which RESCAN of a top-level entry */
	bool degraded;	  /* precise cap hit; cleared when drained empty */
	bool root_rescan; /* everything collapsed into one root RESCAN */
	uint64_t root_first, root_last;
	uint64_t seq; /* last assigned */
	uint64_t gen; /* bumped by every rename/exchange */
	struct jnode **buckets;
	size_t nbuckets; /* power of two */
	size_t max_records;
	struct journal_stats stats;
	/* immutable after journal_new */
	void (*notify)(void *ud);
	void *notify_ud;
};

#define DEFAULT_MAX_RECORDS 16384
#define MAX_TOP_RECORDS	    1024

static const char *const op_names[JOURNAL_OP_MAX] = {
    [JOURNAL_CREATE] = "create", [JOURNAL_MKDIR] = "mkdir",	  [JOURNAL_SYMLINK] = "symlink",
    [JOURNAL_MKNOD] = "mknod",	 [JOURNAL_LINK] = "link",	  [JOURNAL_UNLINK] = "unlink",
    [JOURNAL_RMDIR] = "rmdir",	 [JOURNAL_RENAME] = "rename",	  [JOURNAL_EXCHANGE] = "exchange",
    [JOURNAL_WRITE] = "write",	 [JOURNAL_TRUNCATE] = "truncate", [JOURNAL_SETATTR] = "setattr",
    [JOURNAL_XATTR] = "xattr",	 [JOURNAL_RESCAN] = "rescan",
};

const char *journal_op_name(enum journal_op op)
{
	if ((int)op <= 0 || op >= JOURNAL_OP_MAX || !op_names[op])
		return "?";
	return op_names[op];
}

struct journal *journal_new(const struct journal_opts *opts)
{
	struct journal *j = mem_calloc(1, sizeof(*j));

	if (!j)
		return NULL;
	j->max_records = opts && opts->max_records ? opts->max_records : DEFAULT_MAX_RECORDS;
	if (opts) {
		j->notify = opts->notify;
		j->notify_ud = opts->notify_ud;
	}
	j->nbuckets = 64;
	while (j->nbuckets < j->max_records && j->nbuckets < (1u << 20))
		j->nbuckets <<= 1;
	j->buckets = mem_calloc(j->nbuckets, sizeof(*j->buckets));
	if (!j->buckets || pthread_mutex_init(&j->lock, NULL) != 0) {
		mem_free(j->buckets);
		mem_free(j);
		return NULL;
	}
	return j;
}

void journal_rec_clear(struct journal_rec *r)
{
	if (!r)
		return;
	mem_free(r->path);
	mem_free(r->path2);
	r->path = r->path2 = NULL;
}

static void node_free(struct jnode *n)
{
	journal_rec_clear(&n->rec);
	mem_free(n);
}

static void drop_all(struct journal *j)
{
	struct jnode *n, *next;

	for (n = j->head; n; n = next) {
		next = n->next;
		node_free(n);
	}
	j->head = j->tail = NULL;
	j->npending = j->nprecise = j->nrescan = j->ntop = 0;
	memset(j->buckets, 0, j->nbuckets * sizeof(*j->buckets));
}

void journal_free(struct journal *j)
{
	if (!j)
		return;
	drop_all(j);
	mem_free(j->buckets);
	pthread_mutex_destroy(&j->lock);
	mem_free(j);
}

/* ---- index ---- */

static uint64_t key_hash(unsigned cls, const char *path)
{
	uint64_t h = 1469598103934665603ull ^ cls;

	for (; *path; path++)
		h = (h ^ (unsigned char)*path) * 1099511628211ull;
	return h;
}

/* must hold j->lock */
static struct jnode *index_find(struct journal *j, unsigned cls, const char *path, uint64_t h)
{
	struct jnode *n;

	for (n = j->buckets[h & (j->nbuckets - 1)]; n; n = n->hnext)
		if (n->hash == h && n->cls == cls && strcmp(n->rec.path, path) == 0)
			return n;
	return NULL;
}

/* must hold j->lock */
static void index_del(struct journal *j, struct jnode *n)
{
	struct jnode **pp;

	if (!n->indexed)
		return;
	for (pp = &j->buckets[n->hash & (j->nbuckets - 1)]; *pp; pp = &(*pp)->hnext) {
		if (*pp == n) {
			*pp = n->hnext;
			break;
		}
	}
	n->indexed = 0;
	n->hnext = NULL;
}

/* must hold j->lock; n->hash and n->cls set */
static void index_add(struct journal *j, struct jnode *n)
{
	size_t b = n->hash & (j->nbuckets - 1);

	n->hnext = j->buckets[b];
	j->buckets[b] = n;
	n->indexed = 1;
}

static void fifo_push(struct journal *j, struct jnode *n)
{
	n->next = NULL;
	if (j->tail)
		j->tail->next = n;
	else
		j->head = n;
	j->tail = n;
	j->npending++;
}

/* ---- ranges ---- */

/* Add [off, off+len) to a WRITE record's sorted, disjoint, non-adjacent
 * range list; beyond JOURNAL_MAX_RANGES the record becomes whole-file. */
static void ranges_add(struct journal_rec *r, uint64_t off, uint64_t len)
{
	uint64_t end = off + len < off ? UINT64_MAX : off + len;
	uint32_t i, k;

	if (r->flags & JOURNAL_F_WHOLE || len == 0)
		return;
	/* first range that ends at or after off (touching counts) */
	for (i = 0; i < r->nranges && r->ranges[i].off + r->ranges[i].len < off; i++)
		;
	/* absorb every range that starts at or before end */
	for (k = i; k < r->nranges && r->ranges[k].off <= end; k++) {
		uint64_t e = r->ranges[k].off + r->ranges[k].len;

		if (r->ranges[k].off < off)
			off = r->ranges[k].off;
		if (e > end)
			end = e;
	}
	if (k == i) {
		if (r->nranges == JOURNAL_MAX_RANGES) {
			r->flags |= JOURNAL_F_WHOLE;
			r->nranges = 0;
			return;
		}
		memmove(&r->ranges[i + 1], &r->ranges[i], (r->nranges - i) * sizeof(r->ranges[0]));
		r->nranges++;
	} else if (k > i + 1) {
		memmove(&r->ranges[i + 1], &r->ranges[k], (r->nranges - k) * sizeof(r->ranges[0]));
		r->nranges -= k - i - 1;
	}
	r->ranges[i].off = off;
	r->ranges[i].len = end - off;
}

/* ---- append ---- */

/* Everything collapses into one RESCAN of the root. must hold j->lock */
static void collapse(struct journal *j, uint64_t seq)
{
	if (!j->root_rescan) {
		j->root_first = j->head ? j->head->rec.first_seq : seq;
		if (j->root_first > seq)
			j->root_first = seq;
		drop_all(j);
		j->root_rescan = true;
		j->stats.collapsed++;
	}
	j->root_last = seq;
}

/* The top-level entry of path: "a" for "a/b/c". Writes into buf. */
static const char *top_of(const char *path, char *buf, size_t size)
{
	size_t n = strcspn(path, "/");

	if (n >= size)
		n = size - 1;
	memcpy(buf, path, n);
	buf[n] = '\0';
	return buf;
}

/* Degraded path: record "anything at path may have changed". must hold lock */
static void append_rescan(struct journal *j, const char *path, uint64_t seq)
{
	char top[256];
	struct jnode *n;
	uint64_t h;

	if (j->root_rescan) {
		j->root_last = seq;
		return;
	}
	if (j->nrescan >= j->max_records)
		path = top_of(path, top, sizeof(top));
	h = key_hash(CLS_RESCAN, path);
	n = index_find(j, CLS_RESCAN, path, h);
	if (n) {
		n->rec.last_seq = seq;
		j->stats.coalesced++;
		return;
	}
	if (j->nrescan >= j->max_records && j->ntop >= MAX_TOP_RECORDS) {
		collapse(j, seq);
		return;
	}
	n = mem_calloc(1, sizeof(*n));
	if (!n || !(n->rec.path = mem_strdup(path))) {
		mem_free(n);
		collapse(j, seq);
		return;
	}
	n->rec.op = JOURNAL_RESCAN;
	n->rec.first_seq = n->rec.last_seq = seq;
	n->cls = CLS_RESCAN;
	n->hash = h;
	index_add(j, n);
	fifo_push(j, n);
	if (j->nrescan >= j->max_records) {
		n->top = 1;
		j->ntop++;
	} else {
		j->nrescan++;
	}
}

/* Try to merge op into the newest pending precise record of path. */
static bool try_coalesce(struct journal *j, struct jnode *n, enum journal_op op, uint64_t off, uint64_t len,
			 uint32_t flags, uint64_t seq)
{
	struct journal_rec *r = &n->rec;

	if (n->gen != j->gen)
		return false;
	switch (op) {
	case JOURNAL_WRITE:
		if (r->op == JOURNAL_CREATE)
			break;
		if (r->op != JOURNAL_WRITE)
			return false;
		ranges_add(r, off, len);
		break;
	case JOURNAL_TRUNCATE:
	case JOURNAL_SETATTR:
		if (r->op == JOURNAL_CREATE)
			break;
		if (op == JOURNAL_SETATTR && r->op == JOURNAL_SETATTR) {
			r->flags |= flags;
			break;
		}
		return false;
	default:
		return false;
	}
	r->last_seq = seq;
	return true;
}

static bool has_path2(enum journal_op op)
{
	return op == JOURNAL_LINK || op == JOURNAL_RENAME || op == JOURNAL_EXCHANGE;
}

/* must hold j->lock */
static void append_locked(struct journal *j, enum journal_op op, const char *path, const char *path2, uint64_t off,
			  uint64_t len, uint32_t flags, uint64_t seq)
{
	struct jnode *n, *old;
	uint64_t h;

	if (j->root_rescan) {
		j->root_last = seq;
		return;
	}
	if (op == JOURNAL_RENAME || op == JOURNAL_EXCHANGE)
		j->gen++;
	h = key_hash(CLS_PRECISE, path);
	old = j->degraded ? NULL : index_find(j, CLS_PRECISE, path, h);
	if (old && try_coalesce(j, old, op, off, len, flags, seq)) {
		j->stats.coalesced++;
		return;
	}
	if (!j->degraded && j->nprecise >= j->max_records)
		j->degraded = true;
	if (j->degraded || op == JOURNAL_RESCAN) {
		j->stats.degraded += op != JOURNAL_RESCAN;
		append_rescan(j, path, seq);
		if (path2)
			append_rescan(j, path2, seq);
		return;
	}
	n = mem_calloc(1, sizeof(*n));
	if (!n || !(n->rec.path = mem_strdup(path)) || (path2 && !(n->rec.path2 = mem_strdup(path2)))) {
		if (n)
			node_free(n);
		collapse(j, seq);
		return;
	}
	n->rec.op = op;
	n->rec.first_seq = n->rec.last_seq = seq;
	n->rec.flags = flags & ~JOURNAL_F_WHOLE;
	if (op == JOURNAL_TRUNCATE)
		n->rec.size = off;
	if (op == JOURNAL_WRITE) {
		if (flags & JOURNAL_F_WHOLE)
			n->rec.flags |= JOURNAL_F_WHOLE;
		else
			ranges_add(&n->rec, off, len);
	}
	fifo_push(j, n);
	j->nprecise++;
	/* the index names the newest precise record per path: unhook older */
	if (old)
		index_del(j, old);
	if (op == JOURNAL_UNLINK || op == JOURNAL_RMDIR)
		return; /* nothing merges into a removal */
	n->cls = CLS_PRECISE;
	n->hash = h;
	n->gen = j->gen;
	index_add(j, n);
	if (path2) {
		/* a write to the new name must not merge into an older record */
		old = index_find(j, CLS_PRECISE, path2, key_hash(CLS_PRECISE, path2));
		if (old)
			index_del(j, old);
	}
}

uint64_t journal_append(struct journal *j, enum journal_op op, const char *path, const char *path2, uint64_t off,
			uint64_t len, uint32_t flags)
{
	uint64_t seq;
	bool was_empty;

	if (!path)
		path = "";
	if (!has_path2(op))
		path2 = NULL;
	else if (!path2)
		path2 = "";
	pthread_mutex_lock(&j->lock);
	was_empty = j->npending == 0 && !j->root_rescan;
	seq = ++j->seq;
	j->stats.appended++;
	append_locked(j, op, path, path2, off, len, flags, seq);
	pthread_mutex_unlock(&j->lock);
	if (was_empty && j->notify)
		j->notify(j->notify_ud);
	return seq;
}

size_t journal_drain(struct journal *j, struct journal_rec *out, size_t max, uint64_t *upto)
{
	size_t k = 0;
	struct jnode *n;

	pthread_mutex_lock(&j->lock);
	if (j->root_rescan && max > 0) {
		/* the only pending record (collapse dropped the others) */
		char *p = mem_strdup("");

		if (p) {
			memset(&out[0], 0, sizeof(out[0]));
			out[0].op = JOURNAL_RESCAN;
			out[0].path = p;
			out[0].first_seq = j->root_first;
			out[0].last_seq = j->root_last;
			j->root_rescan = false;
			k = 1;
		}
	}
	while (k < max && (n = j->head)) {
		j->head = n->next;
		if (!j->head)
			j->tail = NULL;
		j->npending--;
		if (n->top)
			j->ntop--;
		else if (n->rec.op == JOURNAL_RESCAN)
			j->nrescan--;
		else
			j->nprecise--;
		index_del(j, n);
		out[k++] = n->rec;
		mem_free(n);
	}
	if (j->npending == 0) {
		j->degraded = false;
		j->nrescan = j->ntop = 0;
	}
	/* the FIFO is ordered by first_seq and nothing merges backwards past a
	 * record, so everything before the new head has been handed out */
	if (upto)
		*upto = j->root_rescan ? j->root_first - 1 : j->head ? j->head->rec.first_seq - 1 : j->seq;
	pthread_mutex_unlock(&j->lock);
	return k;
}

uint64_t journal_barrier_seq(struct journal *j)
{
	uint64_t s;

	pthread_mutex_lock(&j->lock);
	s = j->seq;
	pthread_mutex_unlock(&j->lock);
	return s;
}

size_t journal_pending(struct journal *j)
{
	size_t n;

	pthread_mutex_lock(&j->lock);
	n = j->npending + (j->root_rescan ? 1 : 0);
	pthread_mutex_unlock(&j->lock);
	return n;
}

void journal_get_stats(struct journal *j, struct journal_stats *st)
{
	pthread_mutex_lock(&j->lock);
	*st = j->stats;
	pthread_mutex_unlock(&j->lock);
}
