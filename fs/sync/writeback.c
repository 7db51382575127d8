/* SPDX-License-Identifier: Apache-2.0 */
/* writeback: the host's store of guest changes, and the confined write of
 * pulled guest bytes (writeback.h; doc/SYNC.md "Guest changes and write-back"). */
#include "airlock/sync/writeback.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/content/apply.h"
#include "airlock/content/delta.h"
#include "airlock/core/buf.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/io.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/policy/policy.h"

const char *wb_kind_str(enum wb_kind k)
{
	static const char *const names[] = {"create", "modify", "delete", "rename", "mode", "symlink"};
	return (unsigned)k < sizeof(names) / sizeof(names[0]) ? names[k] : "modify";
}

/* ---- the store ---- */

struct wb_store {
	int dirfd;
	struct wb_change *v;
	size_t n, cap;
	size_t *idx; /* open addressing: index + 1 into v, 0 = empty */
	size_t capidx;
	bool sorted;
	uint64_t next_seq;
};

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	while (*s)
		h = (h ^ (uint8_t)*s++) * 1099511628211ull;
	return h;
}

static void change_clear(struct wb_change *c)
{
	mem_free(c->stash);
	mem_free(c->path);
	mem_free(c->target);
	mem_free(c->by_id);
	mem_free(c->by_argv);
	memset(c, 0, sizeof(*c));
}

static int reindex(struct wb_store *s)
{
	size_t nc = 64;
	while (nc < s->n * 2 + 2)
		nc *= 2;
	size_t *ni = mem_calloc(nc, sizeof(*ni));
	if (!ni)
		return -ENOMEM;
	for (size_t i = 0; i < s->n; i++) {
		size_t j = hash_str(s->v[i].path) & (nc - 1);
		while (ni[j])
			j = (j + 1) & (nc - 1);
		ni[j] = i + 1;
	}
	mem_free(s->idx);
	s->idx = ni;
	s->capidx = nc;
	return 0;
}

static long find_idx(const struct wb_store *s, const char *path)
{
	if (!s->capidx)
		return -1;
	for (size_t j = hash_str(path) & (s->capidx - 1); s->idx[j]; j = (j + 1) & (s->capidx - 1))
		if (!strcmp(s->v[s->idx[j] - 1].path, path))
			return (long)(s->idx[j] - 1);
	return -1;
}

static int change_cmp(const void *a, const void *b)
{
	return manifest_path_cmp(((const struct wb_change *)a)->path, ((const struct wb_change *)b)->path);
}

static void sort_store(struct wb_store *s)
{
	if (s->sorted)
		return;
	qsort(s->v, s->n, sizeof(*s->v), change_cmp);
	if (reindex(s) == 0)
		s->sorted = true;
}

size_t wb_store_count(const struct wb_store *s)
{
	return s->n;
}

const struct wb_change *wb_store_at(const struct wb_store *s, size_t i)
{
	sort_store((struct wb_store *)s);
	return i < s->n ? &s->v[i] : NULL;
}

const struct wb_change *wb_store_find(const struct wb_store *s, const char *path)
{
	long i = find_idx(s, path);
	return i < 0 ? NULL : &s->v[i];
}

/* Take c (moved in) as the change for its path, replacing an older one. */
static int store_put(struct wb_store *s, struct wb_change *c)
{
	long i = find_idx(s, c->path);

	if (i >= 0) {
		/* keep what the host had when the path was first changed */
		struct wb_change *o = &s->v[i];
		c->had = o->had;
		c->base_type = o->base_type;
		c->base_mode = o->base_mode;
		c->base_size = o->base_size;
		memcpy(c->base_hash, o->base_hash, CHUNK_HASH_LEN);
		c->conflict = o->conflict;
		if (!c->stash && o->stash && o->seq == c->seq) /* a reload of the same entry */
			c->stash = o->stash, o->stash = NULL;
		change_clear(o);
		*o = *c;
		return 0;
	}
	if (s->n >= WB_STORE_MAX)
		return -E2BIG;
	if (s->n == s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 64;
		void *nv = mem_realloc(s->v, nc * sizeof(*s->v));
		if (!nv)
			return -ENOMEM;
		s->v = nv;
		s->cap = nc;
	}
	s->v[s->n++] = *c;
	s->sorted = false;
	if ((s->n + 1) * 2 > s->capidx)
		return reindex(s);
	size_t j = hash_str(c->path) & (s->capidx - 1);
	while (s->idx[j])
		j = (j + 1) & (s->capidx - 1);
	s->idx[j] = s->n;
	return 0;
}

/* Empty slot j of the index, moving later entries of its cluster back
 * (open addressing without tombstones). */
static void unindex_slot(struct wb_store *s, size_t j)
{
	size_t mask = s->capidx - 1;

	s->idx[j] = 0;
	for (size_t k = (j + 1) & mask; s->idx[k]; k = (k + 1) & mask) {
		size_t home = hash_str(s->v[s->idx[k] - 1].path) & mask;
		/* k's entry may move to j when j lies cyclically in [home, k) */
		if ((k > j && (home <= j || home > k)) || (k < j && home <= j && home > k)) {
			s->idx[j] = s->idx[k];
			s->idx[k] = 0;
			j = k;
		}
	}
}

static size_t slot_of(const struct wb_store *s, size_t i)
{
	size_t j = hash_str(s->v[i].path) & (s->capidx - 1);
	while (s->idx[j] != i + 1)
		j = (j + 1) & (s->capidx - 1);
	return j;
}

int wb_store_remove(struct wb_store *s, const char *path)
{
	long i = find_idx(s, path);

	if (i < 0)
		return -ENOENT;
	unindex_slot(s, slot_of(s, (size_t)i));
	change_clear(&s->v[i]);
	if ((size_t)i != s->n - 1) {
		/* the last entry moves into i: its slot now says i */
		s->idx[slot_of(s, s->n - 1)] = (size_t)i + 1;
		s->v[i] = s->v[s->n - 1];
	}
	s->n--;
	s->sorted = false;
	return 0;
}

int wb_store_set_stash(struct wb_store *s, const char *path, const char *name)
{
	long i = find_idx(s, path);
	char *n;

	if (i < 0)
		return -ENOENT;
	if (!(n = mem_strdup(name)))
		return -ENOMEM;
	mem_free(s->v[i].stash);
	s->v[i].stash = n;
	return 0;
}

void wb_store_set_conflict(struct wb_store *s, const char *path)
{
	long i = find_idx(s, path);
	if (i >= 0)
		s->v[i].conflict = true;
}

void wb_store_free(struct wb_store *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		change_clear(&s->v[i]);
	mem_free(s->v);
	mem_free(s->idx);
	mem_free(s);
}

static void hex(const uint8_t *h, char out[2 * CHUNK_HASH_LEN + 1])
{
	sodium_bin2hex(out, 2 * CHUNK_HASH_LEN + 1, h, CHUNK_HASH_LEN);
}

static json_t *change_json(const struct wb_change *c)
{
	char hx[2 * CHUNK_HASH_LEN + 1], bx[2 * CHUNK_HASH_LEN + 1];
	json_t *o, *by = json_null();

	hex(c->hash, hx);
	hex(c->base_hash, bx);
	if (c->by_id) {
		json_t *id = json_loads(c->by_id, JSON_DECODE_ANY, NULL);
		json_t *argv = c->by_argv ? json_loads(c->by_argv, 0, NULL) : NULL;
		json_decref(by);
		by = json_pack("{s:o, s:o}", "id", id ? id : json_null(), "argv", argv ? argv : json_null());
	}
	o = json_pack("{s:s, s:I, s:I, s:s, s:b, s:s?, s:b, s:{s:i, s:I, s:I, s:s}, s:o, s:b, s:I}", "path", c->path,
		      "st_mode", (json_int_t)c->st_mode, "size", (json_int_t)c->size, "hash", hx, "hashed", c->hashed,
		      "target", c->target, "had", c->had, "base", "type", (int)c->base_type, "mode",
		      (json_int_t)c->base_mode, "size", (json_int_t)c->base_size, "hash", bx, "by",
		      by ? by : json_null(), "conflict", c->conflict, "seq", (json_int_t)c->seq);
	if (o && c->stash)
		json_object_set_new(o, "stash", json_string(c->stash));
	return o;
}

int wb_store_save(struct wb_store *s)
{
	json_t *arr = json_array(), *root;
	char tmp[64];
	int r = 0;

	sort_store(s);
	for (size_t i = 0; arr && i < s->n; i++) {
		json_t *o = change_json(&s->v[i]);
		if (!o || json_array_append_new(arr, o) < 0) {
			json_decref(arr);
			return -ENOMEM;
		}
	}
	if (!arr || !(root = json_pack("{s:i, s:o}", "version", 1, "changes", arr)))
		return -ENOMEM;
	char *text = json_dumps(root, JSON_COMPACT);
	json_decref(root);
	if (!text)
		return -ENOMEM;
	snprintf(tmp, sizeof(tmp), "%s.tmp", WB_STORE_FILE);
	int fd = openat(s->dirfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	size_t len = strlen(text);
	if (fd < 0)
		r = -errno;
	else if ((errno = 0, write(fd, text, len) != (ssize_t)len || fsync(fd) < 0))
		r = errno ? -errno : -ENOSPC; /* a short write: the disk is full */
	if (fd >= 0 && close(fd) < 0 && r == 0)
		r = -errno;
	free(text);
	if (r == 0 && renameat(s->dirfd, tmp, s->dirfd, WB_STORE_FILE) < 0)
		r = -errno;
	if (r < 0)
		unlinkat(s->dirfd, tmp, 0);
	return r;
}

static int get_hash(json_t *v, uint8_t out[CHUNK_HASH_LEN])
{
	size_t got = 0;
	if (!json_is_string(v) || json_string_length(v) != 2 * CHUNK_HASH_LEN ||
	    sodium_hex2bin(out, CHUNK_HASH_LEN, json_string_value(v), json_string_length(v), NULL, &got, NULL) < 0 ||
	    got != CHUNK_HASH_LEN)
		return -EINVAL;
	return 0;
}

static int load_change(json_t *o, struct wb_change *c)
{
	json_t *path = json_object_get(o, "path"), *base = json_object_get(o, "base"), *by = json_object_get(o, "by");
	json_t *tgt = json_object_get(o, "target"), *stash = json_object_get(o, "stash");
	json_int_t st_mode, size, bt, bm, bs, seq;
	int hashed, had, conflict;

	memset(c, 0, sizeof(*c));
	if (!json_is_string(path) || manifest_path_check(json_string_value(path), json_string_length(path)) < 0 ||
	    !json_is_object(base) ||
	    json_unpack(o, "{s:I, s:I, s:b, s:b, s:b, s:I}", "st_mode", &st_mode, "size", &size, "hashed", &hashed,
			"had", &had, "conflict", &conflict, "seq", &seq) < 0 ||
	    json_unpack(base, "{s:I, s:I, s:I}", "type", &bt, "mode", &bm, "size", &bs) < 0 || st_mode < 0 ||
	    st_mode > 0xffffffffll || size < 0 || bt < 0 || bt > 3 || bm < 0 || bm > 0777 || bs < 0 || seq < 0 ||
	    get_hash(json_object_get(o, "hash"), c->hash) < 0 ||
	    get_hash(json_object_get(base, "hash"), c->base_hash) < 0 ||
	    (tgt && !json_is_string(tgt) && !json_is_null(tgt)) ||
	    (stash && (!json_is_string(stash) || strchr(json_string_value(stash), '/'))))
		return -EINVAL;
	c->st_mode = (uint32_t)st_mode;
	c->size = (uint64_t)size;
	c->hashed = hashed;
	c->had = had;
	c->conflict = conflict;
	c->seq = (uint64_t)seq;
	c->base_type = (uint8_t)bt;
	c->base_mode = (uint32_t)bm;
	c->base_size = (uint64_t)bs;
	if (!(c->path = mem_strdup(json_string_value(path))) ||
	    (json_is_string(tgt) && !(c->target = mem_strdup(json_string_value(tgt)))) ||
	    (stash && !(c->stash = mem_strdup(json_string_value(stash))))) {
		change_clear(c);
		return -ENOMEM;
	}
	if (json_is_object(by)) {
		json_t *id = json_object_get(by, "id"), *argv = json_object_get(by, "argv");
		if (id && !json_is_null(id))
			c->by_id = json_dumps(id, JSON_COMPACT | JSON_ENCODE_ANY);
		if (json_is_array(argv))
			c->by_argv = json_dumps(argv, JSON_COMPACT);
	}
	return 0;
}

int wb_store_open(int dirfd, struct wb_store **out, char *err, size_t errlen)
{
	struct wb_store *s = mem_calloc(1, sizeof(*s));
	json_error_t jerr;
	json_t *root = NULL, *arr;
	int r = 0, fd;

	*out = NULL;
	if (!s)
		return -ENOMEM;
	s->dirfd = dirfd;
	if ((fd = openat(dirfd, WB_STORE_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) < 0) {
		if (errno != ENOENT) {
			r = -errno;
			errmsg_set(err, errlen, "%s: %s", WB_STORE_FILE, strerror(-r));
			goto fail;
		}
		r = reindex(s);
		goto done;
	}
	FILE *f = fdopen(fd, "r");
	if (!f) {
		close(fd);
		r = -ENOMEM;
		goto fail;
	}
	root = json_loadf(f, JSON_REJECT_DUPLICATES, &jerr);
	fclose(f);
	arr = root ? json_object_get(root, "changes") : NULL;
	if (!root || !json_is_array(arr) || json_integer_value(json_object_get(root, "version")) != 1) {
		errmsg_set(err, errlen,
			   "%s is damaged (%s): it lists the guest changes waiting for review; fix or move it away "
			   "(the guest still holds the changes)",
			   WB_STORE_FILE, root ? "not version 1" : jerr.text);
		r = -EINVAL;
		goto fail;
	}
	size_t i;
	json_t *o;
	json_array_foreach(arr, i, o)
	{
		struct wb_change c;
		if ((r = load_change(o, &c)) < 0 || (r = store_put(s, &c)) < 0) {
			errmsg_set(err, errlen, "%s: entry %zu: %s", WB_STORE_FILE, i,
				   r == -EINVAL ? "malformed" : strerror(-r));
			goto fail;
		}
		if (c.seq >= s->next_seq)
			s->next_seq = c.seq + 1;
	}
	if (!s->capidx)
		r = reindex(s);
done:
	json_decref(root);
	if (r < 0)
		goto fail;
	*out = s;
	return 0;
fail:
	json_decref(root);
	wb_store_free(s);
	return r;
}

/* ---- what is a change ---- */

static uint8_t mode_type(uint32_t m)
{
	if (S_ISREG(m))
		return MANIFEST_FILE;
	if (S_ISDIR(m))
		return MANIFEST_DIR;
	if (S_ISLNK(m))
		return MANIFEST_SYMLINK;
	return 0;
}

bool wb_same(const struct wb_change *c, const struct manifest_entry *e)
{
	uint8_t t = mode_type(c->st_mode);

	if (!e)
		return !c->st_mode;
	if (!c->st_mode || t != e->type || (c->st_mode & 07000))
		return false;
	if (t == MANIFEST_DIR)
		return (c->st_mode & 0777) == e->mode;
	if (t == MANIFEST_FILE && (c->st_mode & 0777) != e->mode)
		return false;
	return c->hashed && c->size == e->size && !memcmp(c->hash, e->hash, CHUNK_HASH_LEN);
}

static const struct manifest_entry *known_entry(const struct manifest *known, const char *path)
{
	long i = known ? manifest_find(known, path) : -1;
	return i < 0 ? NULL : &known->e[i];
}

/* Not a change: guest-owned (gitignored, workspace.guest_owned). */
static bool guest_owned(const struct policy *pol, struct policy_ctx *ctx, const char *path, bool is_dir)
{
	struct policy_verdict v;

	if (!pol)
		return false;
	if (policy_guest_owned(pol, path, is_dir))
		return true;
	return ctx && policy_check(pol, ctx, path, is_dir, &v) == 0 && v.reason == POLICY_IGNORED;
}

static int note_one(struct wb_store *s, const struct manifest_entry *base, const struct wire_chg_item *it,
		    const char *path, const char *by_id, const char *by_argv)
{
	struct wb_change c = {0};
	const struct wb_change *old = wb_store_find(s, path);
	int r;

	c.st_mode = it->st_mode;
	c.size = it->size;
	c.hashed = it->flags & WIRE_CHG_F_HASHED;
	memcpy(c.hash, it->hash, CHUNK_HASH_LEN);
	if (wb_same(&c, base)) {
		if (old)
			wb_store_remove(s, path); /* undone: the guest holds the host's version again */
		return 0;
	}
	if (base) {
		c.had = true;
		c.base_type = base->type;
		c.base_mode = base->mode;
		c.base_size = base->size;
		memcpy(c.base_hash, base->hash, CHUNK_HASH_LEN);
	} else if (!it->st_mode && !old) {
		return 0; /* a path the host never had, gone again */
	}
	c.seq = s->next_seq++;
	if (!(c.path = mem_strdup(path)) || (it->target && it->target[0] && !(c.target = mem_strdup(it->target))) ||
	    (by_id && !(c.by_id = mem_strdup(by_id))) || (by_argv && !(c.by_argv = mem_strdup(by_argv)))) {
		change_clear(&c);
		return -ENOMEM;
	}
	if ((r = store_put(s, &c)) < 0) {
		change_clear(&c);
		return r;
	}
	return 1;
}

static bool path_under(const char *p, const char *dir)
{
	size_t k = strlen(dir);
	return !strncmp(p, dir, k) && p[k] == '/';
}

int wb_note(struct wb_store *s, const struct policy *pol, struct policy_ctx *ctx, const struct manifest *known,
	    const struct wire_chg_item *it, const char *by_id, const char *by_argv)
{
	const struct manifest_entry *base = known_entry(known, it->path);
	bool is_dir = it->st_mode ? S_ISDIR(it->st_mode) : (base && base->type == MANIFEST_DIR);
	int r;

	if (manifest_path_check(it->path, strlen(it->path)) < 0)
		return -EINVAL;
	if (guest_owned(pol, ctx, it->path, is_dir))
		return 0;
	r = note_one(s, base, it, it->path, by_id, by_argv);
	if (r < 0 || it->st_mode || !base || base->type != MANIFEST_DIR)
		return r;
	/* a directory deleted (or moved away) in the guest: everything the
	 * host has beneath it is deleted too (tree order: the subtree follows) */
	struct wire_chg_item gone = {0};
	for (long i = manifest_find(known, it->path) + 1; i >= 0 && (size_t)i < known->n; i++) {
		const struct manifest_entry *e = &known->e[i];
		if (!path_under(e->path, it->path))
			break;
		if (guest_owned(pol, ctx, e->path, e->type == MANIFEST_DIR))
			continue;
		gone.path = e->path;
		if ((r = note_one(s, e, &gone, e->path, by_id, by_argv)) < 0)
			return r;
	}
	return 1;
}

size_t wb_store_prune(struct wb_store *s, const struct manifest *known)
{
	size_t dropped = 0;

	for (size_t i = 0; i < s->n;) {
		const struct wb_change *c = &s->v[i];
		if (!c->conflict && wb_same(c, known_entry(known, c->path))) {
			wb_store_remove(s, c->path);
			dropped++;
			continue;
		}
		i++;
	}
	return dropped;
}

enum wb_kind wb_store_kind(const struct wb_store *s, const struct wb_change *c, const char **from, bool *hidden)
{
	uint8_t t = mode_type(c->st_mode);

	*from = NULL;
	*hidden = false;
	if (!c->st_mode) {
		/* the delete half of a rename is listed with its create */
		if (c->had && c->base_type == MANIFEST_FILE) {
			for (size_t i = 0; i < s->n; i++) {
				const struct wb_change *o = &s->v[i];
				if (S_ISREG(o->st_mode) && !o->had && o->hashed &&
				    !memcmp(o->hash, c->base_hash, CHUNK_HASH_LEN)) {
					*hidden = true;
					break;
				}
			}
		}
		return WB_DELETE;
	}
	if (t == MANIFEST_SYMLINK)
		return WB_SYMLINK;
	if (!c->had) {
		if (t == MANIFEST_FILE && c->hashed) {
			for (size_t i = 0; i < s->n; i++) {
				const struct wb_change *o = &s->v[i];
				if (!o->st_mode && o->had && o->base_type == MANIFEST_FILE &&
				    !memcmp(o->base_hash, c->hash, CHUNK_HASH_LEN)) {
					*from = o->path;
					return WB_RENAME;
				}
			}
		}
		return WB_CREATE;
	}
	if (t == c->base_type && t != MANIFEST_DIR && c->hashed && c->size == c->base_size &&
	    !memcmp(c->hash, c->base_hash, CHUNK_HASH_LEN))
		return WB_MODE;
	if (t == MANIFEST_DIR && c->base_type == MANIFEST_DIR)
		return WB_MODE;
	return WB_MODIFY;
}

/* ---- the pull: the host's decoder of the guest's bytes ---- */

struct got {
	struct wb_change c; /* path NULL: not received (yet) */
	int fd;		    /* staged bytes of a file, or -1 */
	const char *why;    /* refused: why (static text) */
};

struct wb_pull {
	struct wb_pull_cfg cfg;
	char **paths;
	struct got *got;
	size_t next;	/* next CHG_FILE expected for paths[next] */
	size_t cur;	/* the file receiving CHG_DATA (valid while left > 0) */
	uint64_t left;	/* its bytes still to come */
	uint64_t total; /* file bytes announced so far */
	bool ended, failed;
	char err[512];
};

static int pull_fail(struct wb_pull *p, int r, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int pull_fail(struct wb_pull *p, int r, const char *fmt, ...)
{
	va_list ap;

	if (!p->failed) {
		va_start(ap, fmt);
		vsnprintf(p->err, sizeof(p->err), fmt, ap);
		va_end(ap);
	}
	p->failed = true;
	return r;
}

int wb_pull_new(const struct wb_pull_cfg *cfg, struct wb_pull **out)
{
	struct wb_pull *p = mem_calloc(1, sizeof(*p));

	*out = NULL;
	if (!p)
		return -ENOMEM;
	p->cfg = *cfg;
	p->paths = mem_calloc(cfg->n ? cfg->n : 1, sizeof(*p->paths));
	p->got = mem_calloc(cfg->n ? cfg->n : 1, sizeof(*p->got));
	if (!p->paths || !p->got) {
		wb_pull_free(p);
		return -ENOMEM;
	}
	for (size_t i = 0; i < cfg->n; i++) {
		p->got[i].fd = -1;
		if (!(p->paths[i] = mem_strdup(cfg->paths[i]))) {
			p->cfg.n = i;
			wb_pull_free(p);
			return -ENOMEM;
		}
	}
	p->cfg.paths = (const char *const *)p->paths;
	*out = p;
	return 0;
}

void wb_pull_free(struct wb_pull *p)
{
	if (!p)
		return;
	for (size_t i = 0; p->got && i < p->cfg.n; i++) {
		change_clear(&p->got[i].c);
		if (p->got[i].fd >= 0)
			close(p->got[i].fd);
	}
	for (size_t i = 0; p->paths && i < p->cfg.n; i++)
		mem_free(p->paths[i]);
	mem_free(p->paths);
	mem_free(p->got);
	mem_free(p);
}

const char *wb_pull_error(const struct wb_pull *p)
{
	return p->err[0] ? p->err : "incomplete";
}

const struct wb_change *wb_pull_got(const struct wb_pull *p, size_t i, const char **why)
{
	*why = NULL;
	if (i >= p->cfg.n || !p->got[i].c.path) {
		*why = "not received";
		return NULL;
	}
	if (p->got[i].why) {
		*why = p->got[i].why;
		return NULL;
	}
	return &p->got[i].c;
}

int wb_pull_fd(const struct wb_pull *p, size_t i)
{
	return i < p->cfg.n ? p->got[i].fd : -1;
}

/* An unnamed temporary for a file's bytes. */
static int stage_fd(int dirfd)
{
	int fd = openat(dirfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (fd >= 0 || (errno != EOPNOTSUPP && errno != EISDIR && errno != ENOENT && errno != EINVAL))
		return fd < 0 ? -errno : fd;
	char name[64];
	uint8_t rnd[8];
	randombytes_buf(rnd, sizeof(rnd));
	snprintf(name, sizeof(name), ".wb-%02x%02x%02x%02x%02x%02x%02x%02x", rnd[0], rnd[1], rnd[2], rnd[3], rnd[4],
		 rnd[5], rnd[6], rnd[7]);
	if ((fd = openat(dirfd, name, O_CREAT | O_EXCL | O_RDWR | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return -errno;
	unlinkat(dirfd, name, 0);
	return fd;
}

static int on_file(struct wb_pull *p, const uint8_t *data, size_t n)
{
	struct wire_chg_item it;
	struct buf in;
	int r;

	if (p->left || p->next >= p->cfg.n)
		return pull_fail(p, -EPROTO, "CHG_FILE %s", p->left ? "before the last file's bytes" : "not asked for");
	buf_view(&in, data, n);
	if (wire_chg_item_decode(&in, &it) < 0)
		return pull_fail(p, -EBADMSG, "malformed CHG_FILE for %.200s", p->paths[p->next]);
	size_t i = p->next++;
	struct got *g = &p->got[i];
	if (strcmp(it.path, p->paths[i]) || it.by) {
		wire_chg_item_clear(&it);
		return pull_fail(p, -EPROTO, "CHG_FILE for another path than %.200s, the one asked", p->paths[i]);
	}
	g->c.path = it.path;
	g->c.target = it.target && it.target[0] ? it.target : NULL;
	if (!g->c.target)
		mem_free(it.target);
	g->c.st_mode = it.st_mode;
	g->c.size = it.size;
	g->c.hashed = it.flags & WIRE_CHG_F_HASHED;
	memcpy(g->c.hash, it.hash, CHUNK_HASH_LEN);
	if (it.st_mode && !S_ISREG(it.st_mode) && !S_ISDIR(it.st_mode) && !S_ISLNK(it.st_mode)) {
		g->why = "a special file (device, fifo or socket) is never written back";
		return 0;
	}
	if (S_ISLNK(it.st_mode)) {
		uint8_t h[CHUNK_HASH_LEN];
		chunk_hash(g->c.target, strlen(g->c.target), h);
		if (memcmp(h, g->c.hash, CHUNK_HASH_LEN) || g->c.size != strlen(g->c.target))
			return pull_fail(p, -EBADMSG, "%.200s: symlink target does not match its hash", g->c.path);
		return 0;
	}
	if (!S_ISREG(it.st_mode))
		return 0;
	if (!g->c.hashed) {
		g->why = "too large for the guest to hash (over 1 GiB)";
		if (g->c.size > p->cfg.max_bytes - (p->total < p->cfg.max_bytes ? p->total : p->cfg.max_bytes))
			return pull_fail(p, -EFBIG,
					 "%.200s: %" PRIu64 " bytes is over the write-back cap of %" PRIu64
					 " MiB (%s); nothing was written",
					 g->c.path, g->c.size, p->cfg.max_bytes >> 20, p->cfg.cap_name);
		return 0;
	}
	/* the cap, before a byte of it is taken */
	if (g->c.size > p->cfg.max_bytes || p->total + g->c.size > p->cfg.max_bytes)
		return pull_fail(p, -EFBIG,
				 "%.200s: %" PRIu64 " bytes would bring this write-back over its cap of %" PRIu64
				 " MiB (%s); nothing was written",
				 g->c.path, g->c.size, p->cfg.max_bytes >> 20, p->cfg.cap_name);
	p->total += g->c.size;
	if ((r = stage_fd(p->cfg.tmp_dirfd)) < 0)
		return pull_fail(p, r, "staging %.200s: %s", g->c.path, strerror(-r));
	g->fd = r;
	p->cur = i;
	p->left = g->c.size;
	if (!p->left) {
		uint8_t h[CHUNK_HASH_LEN];
		chunk_hash("", 0, h);
		if (memcmp(h, g->c.hash, CHUNK_HASH_LEN))
			return pull_fail(p, -EBADMSG, "%.200s: empty file whose hash is not the empty hash", g->c.path);
	}
	return 0;
}

static int on_data(struct wb_pull *p, const uint8_t *data, size_t n)
{
	struct got *g = &p->got[p->cur];
	uint8_t h[CHUNK_HASH_LEN];

	if (!p->left || n == 0 || n > p->left)
		return pull_fail(p, -EPROTO, "CHG_DATA %s", p->left ? "longer than the file's size" : "not expected");
	uint64_t off = g->c.size - p->left;
	for (size_t done = 0; done < n;) {
		ssize_t w = pwrite(g->fd, data + done, n - done, (off_t)(off + done));
		if (w <= 0)
			return pull_fail(p, -EIO, "staging %.200s: %s", g->c.path, strerror(errno ? errno : EIO));
		done += (size_t)w;
	}
	p->left -= n;
	if (p->left)
		return 0;
	int r = chunk_fd_hash(p->cfg.chunking, g->fd, g->c.size, h);
	if (r < 0)
		return pull_fail(p, r, "hashing %.200s: %s", g->c.path, strerror(-r));
	if (memcmp(h, g->c.hash, CHUNK_HASH_LEN))
		g->why = "its bytes do not match its hash (changed in the guest while pulled: try again)";
	return 0;
}

int wb_pull_local(struct wb_pull *p, size_t i, const struct wb_change *c, int fd)
{
	struct got *g;
	uint8_t h[CHUNK_HASH_LEN];
	int r;

	if (i >= p->cfg.n || p->got[i].c.path || strcmp(c->path, p->paths[i]))
		return -EINVAL;
	g = &p->got[i];
	g->c = *c;
	g->c.by_id = g->c.by_argv = g->c.stash = NULL;
	g->c.path = mem_strdup(c->path);
	g->c.target = c->target ? mem_strdup(c->target) : NULL;
	if (!g->c.path || (c->target && !g->c.target))
		return -ENOMEM;
	if (S_ISREG(c->st_mode)) {
		if (fd < 0 || (g->fd = dup(fd)) < 0)
			return -EBADF;
		if ((r = chunk_fd_hash(p->cfg.chunking, g->fd, c->size, h)) < 0)
			return r;
		if (memcmp(h, c->hash, CHUNK_HASH_LEN))
			g->why = "its kept copy does not match its hash";
	}
	bool all = true;
	for (size_t k = 0; k < p->cfg.n; k++)
		all &= p->got[k].c.path != NULL;
	p->ended = all;
	return 0;
}

int wb_pull_frame(struct wb_pull *p, uint8_t type, const uint8_t *data, size_t n)
{
	int r;

	if (p->failed || p->ended)
		return pull_fail(p, -EPROTO, "%s after the end of the pull", wire_type_name(type));
	switch (type) {
	case WIRE_CHG_FILE:
		return on_file(p, data, n);
	case WIRE_CHG_DATA:
		return on_data(p, data, n);
	case WIRE_CHG_END: {
		struct wire_error m;
		struct buf in;
		buf_view(&in, data, n);
		if (wire_error_decode(&in, &m) < 0)
			return pull_fail(p, -EBADMSG, "malformed CHG_END");
		if (p->left || p->next < p->cfg.n) {
			r = pull_fail(p, -EPROTO, "the guest ended the pull early%s%.200s",
				      m.msg && m.msg[0] ? ": " : "", m.msg ? m.msg : "");
			wire_error_clear(&m);
			return r;
		}
		wire_error_clear(&m);
		p->ended = true;
		return 1;
	}
	default:
		return pull_fail(p, -EPROTO, "%s on a pull stream", wire_type_name(type));
	}
}

/* ---- the write ---- */

struct order {
	size_t i;
	const char *path;
	bool del;
};

static int order_cmp(const void *a, const void *b)
{
	const struct order *x = a, *y = b;
	if (x->del != y->del)
		return x->del ? -1 : 1; /* removals first */
	int c = manifest_path_cmp(x->path, y->path);
	return x->del ? -c : c; /* removals children first, the rest parents first */
}

static int add_op(struct delta_builder *b, const struct got *g)
{
	const struct wb_change *c = &g->c;
	uint32_t mode = c->st_mode & 0777;

	if (!c->st_mode)
		return delta_add_delete(b, c->path, 0);
	if (S_ISDIR(c->st_mode))
		return delta_add_mkdir(b, c->path, mode);
	if (S_ISLNK(c->st_mode))
		return delta_add_symlink(b, c->path, c->target);
	struct manifest_entry made = {0};
	int r = delta_put_file(b, c->path, mode, g->fd, NULL, NULL, &made);
	if (r == 0 && (made.size != c->size || memcmp(made.hash, c->hash, CHUNK_HASH_LEN)))
		r = -ESTALE; /* cannot happen: the staged file is ours */
	manifest_entry_clear(&made);
	return r;
}

static int flush_batch(struct delta_builder *b, struct apply *a, const uint8_t sk[64], const uint8_t pk[32],
		       const uint8_t scope[32], char *err, size_t errlen)
{
	struct delta_batch *batch = NULL;
	struct apply_stats st;
	uint8_t *bytes = NULL;
	size_t n = 0;
	char verr[512] = "";
	int r;

	if (!delta_builder_ops(b))
		return 0;
	if ((r = delta_builder_finish(b, sk, &bytes, &n)) < 0) {
		errmsg_set(err, errlen, "building the write-back: %s", strerror(-r));
		return r;
	}
	if ((r = delta_batch_verify(bytes, n, pk, scope, apply_last_seq(a), &delta_caps_default, &batch, verr,
				    sizeof(verr))) < 0)
		errmsg_set(err, errlen, "write-back refused: %s", verr[0] ? verr : strerror(-r));
	else if ((r = apply_batch_whole(a, batch, &st)) < 0)
		errmsg_set(err, errlen, "writing to the workspace: %s%s", apply_error(a),
			   st.partial ? " (some paths were written)" : " (nothing was written)");
	delta_batch_free(batch);
	mem_free(bytes);
	return r;
}

int wb_pull_write(struct wb_pull *p, struct apply *a, const uint8_t sk[64], const uint8_t pk[32],
		  const uint8_t scope[32], bool *done, char *err, size_t errlen)
{
	struct delta_builder *b = NULL;
	struct order *ord;
	size_t no = 0, first = 0, k = 0;
	int r;

	if (!p->ended) {
		errmsg_set(err, errlen, "the pull is not complete: %s", wb_pull_error(p));
		return -EPROTO;
	}
	if (!(ord = mem_calloc(p->cfg.n ? p->cfg.n : 1, sizeof(*ord))))
		return -ENOMEM;
	for (size_t i = 0; i < p->cfg.n; i++) {
		done[i] = false;
		if (p->got[i].c.path && !p->got[i].why)
			ord[no++] = (struct order){.i = i, .path = p->got[i].c.path, .del = !p->got[i].c.st_mode};
	}
	qsort(ord, no, sizeof(*ord), order_cmp);
	if ((r = delta_builder_new(apply_last_seq(a) + 1, scope, p->cfg.chunking, NULL, &b)) < 0)
		goto out;
	for (k = 0; k < no; k++) {
		r = add_op(b, &p->got[ord[k].i]);
		if (r == -ENOBUFS || (r == 0 && delta_builder_size(b) >= WB_BATCH_MAX)) {
			bool again = r == -ENOBUFS;
			if (again && !delta_builder_ops(b)) {
				errmsg_set(err, errlen, "%s: larger than one write-back batch", ord[k].path);
				r = -EFBIG;
				goto out;
			}
			if ((r = flush_batch(b, a, sk, pk, scope, err, errlen)) < 0)
				goto out;
			for (size_t j = first; j < (again ? k : k + 1); j++)
				done[ord[j].i] = true;
			first = again ? k : k + 1;
			delta_builder_reset(b, apply_last_seq(a) + 1);
			if (again && (r = add_op(b, &p->got[ord[k].i])) < 0)
				goto fail_op;
			continue;
		}
		if (r < 0)
			goto fail_op;
	}
	if ((r = flush_batch(b, a, sk, pk, scope, err, errlen)) < 0)
		goto out;
	for (size_t j = first; j < no; j++)
		done[ord[j].i] = true;
	r = 0;
	goto out;
fail_op:
	errmsg_set(err, errlen, "%.200s: cannot be written back: %s", ord[k].path, strerror(-r));
out:
	delta_builder_free(b);
	mem_free(ord);
	return r;
}

/* ---- a vm fork's changes, as its agent reported them ---- */

struct forkset_entry {
	char *path;
	uint32_t st_mode;
	uint64_t seq; /* report order: the last report of a path wins */
};

struct wb_forkset {
	struct forkset_entry *v;
	size_t n, cap;
	uint64_t bytes, next_seq;
	int lost; /* -E2BIG or -ENOMEM: a report was not kept */
};

int wb_forkset_new(struct wb_forkset **out)
{
	return (*out = mem_calloc(1, sizeof(**out))) ? 0 : -ENOMEM;
}

void wb_forkset_free(struct wb_forkset *s)
{
	if (!s)
		return;
	for (size_t i = 0; i < s->n; i++)
		mem_free(s->v[i].path);
	mem_free(s->v);
	mem_free(s);
}

static int forkset_cmp(const void *a, const void *b)
{
	const struct forkset_entry *x = a, *y = b;
	int c = manifest_path_cmp(x->path, y->path);
	return c ? c : x->seq < y->seq ? -1 : x->seq > y->seq;
}

/* Sorted, each path once (its last report). */
static void forkset_compact(struct wb_forkset *s)
{
	size_t m = 0;

	if (s->n)
		qsort(s->v, s->n, sizeof(*s->v), forkset_cmp);
	for (size_t i = 0; i < s->n; i++) {
		if (i + 1 < s->n && !strcmp(s->v[i].path, s->v[i + 1].path)) {
			s->bytes -= strlen(s->v[i].path);
			mem_free(s->v[i].path);
			continue;
		}
		s->v[m++] = s->v[i];
	}
	s->n = m;
}

int wb_forkset_note(struct wb_forkset *s, const char *path, uint32_t st_mode)
{
	size_t len = strlen(path);

	if (manifest_path_check(path, len) < 0)
		return -EBADMSG;
	if (s->lost)
		return s->lost;
	if (s->n == s->cap) {
		if (s->n >= WB_FORKSET_MAX)
			forkset_compact(s); /* the same paths reported again and again */
		size_t nc = s->cap ? s->cap * 2 : 256;
		if (nc > WB_FORKSET_MAX)
			nc = WB_FORKSET_MAX;
		if (s->n == nc)
			return s->lost = -E2BIG;
		if (nc > s->cap) {
			void *nv = mem_realloc(s->v, nc * sizeof(*s->v));
			if (!nv)
				return s->lost = -ENOMEM;
			s->v = nv;
			s->cap = nc;
		}
	}
	if (s->bytes + len > WB_FORKSET_BYTES_MAX)
		return s->lost = -E2BIG;
	if (!(s->v[s->n].path = mem_strdup(path)))
		return s->lost = -ENOMEM;
	s->v[s->n].st_mode = st_mode;
	s->v[s->n].seq = s->next_seq++;
	s->n++;
	s->bytes += len;
	return 0;
}

int wb_forkset_list(struct wb_forkset *s, int (*fn)(const char *path, bool deleted, void *ud), void *ud, char *err,
		    size_t errlen)
{
	int r = 0;

	if (s->lost) {
		if (s->lost == -E2BIG)
			errmsg_set(err, errlen,
				   "its agent reported more changed paths than the host keeps for a fork (%u paths, "
				   "%u MiB)",
				   WB_FORKSET_MAX, WB_FORKSET_BYTES_MAX >> 20);
		else
			errmsg_set(err, errlen, "the host ran out of memory keeping its agent's reports");
		return s->lost;
	}
	forkset_compact(s);
	for (size_t i = 0; r == 0 && i < s->n; i++) {
		uint32_t m = s->v[i].st_mode;
		if (!m || S_ISREG(m) || S_ISLNK(m))
			r = fn(s->v[i].path, !m, ud);
	}
	return r;
}

/* ---- a replay: pulled changes as a tar stream ---- */

#define TAR_BLOCK    512u
#define TAR_NAME_MAX 100u	     /* ustar name and linkname fields */
#define TAR_SIZE_MAX 077777777777ull /* 11 octal digits */

struct wb_replay {
	int fd;
	struct buf files, deleted; /* NUL-separated paths */
	size_t nfiles, ndeleted;
};

int wb_replay_new(int fd, struct wb_replay **out)
{
	struct wb_replay *r = mem_calloc(1, sizeof(*r));

	*out = NULL;
	if (!r)
		return -ENOMEM;
	r->fd = fd;
	buf_init(&r->files, (size_t)WB_FORKSET_BYTES_MAX + WB_FORKSET_MAX);
	buf_init(&r->deleted, (size_t)WB_FORKSET_BYTES_MAX + WB_FORKSET_MAX);
	*out = r;
	return 0;
}

void wb_replay_free(struct wb_replay *r)
{
	if (!r)
		return;
	buf_clear(&r->files);
	buf_clear(&r->deleted);
	mem_free(r);
}

static void tar_octal(uint8_t *field, size_t width, uint64_t v)
{
	/* width - 1 digits and a NUL */
	for (size_t i = width - 1; i-- > 0; v >>= 3)
		field[i] = (uint8_t)('0' + (v & 7));
	field[width - 1] = '\0';
}

/* One ustar header: name and linkname must fit their fields. */
static int tar_header(int fd, const char *name, char type, unsigned mode, uint64_t size, const char *link)
{
	uint8_t h[TAR_BLOCK] = {0};
	unsigned sum = 0;

	memcpy(h, name, strlen(name));
	tar_octal(h + 100, 8, mode);
	tar_octal(h + 108, 8, 0);
	tar_octal(h + 116, 8, 0);
	tar_octal(h + 124, 12, size);
	tar_octal(h + 136, 12, 0);
	h[156] = (uint8_t)type;
	if (link)
		memcpy(h + 157, link, strlen(link));
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	memset(h + 148, ' ', 8);
	for (size_t i = 0; i < TAR_BLOCK; i++)
		sum += h[i];
	tar_octal(h + 148, 7, sum);
	h[155] = ' ';
	return io_write_all(fd, h, sizeof(h));
}

static int tar_pad(int fd, uint64_t size)
{
	static const uint8_t zero[TAR_BLOCK];
	size_t k = (size_t)((TAR_BLOCK - size % TAR_BLOCK) % TAR_BLOCK);
	return k ? io_write_all(fd, zero, k) : 0;
}

/* "LEN key=value\n", LEN counting itself. */
static int pax_record(struct buf *b, const char *key, const char *value)
{
	size_t body = 1 + strlen(key) + 1 + strlen(value) + 1, len = body + 1;
	char num[24];

	while ((size_t)snprintf(num, sizeof(num), "%zu", len) + body != len)
		len = body + (size_t)snprintf(num, sizeof(num), "%zu", len);
	int r;
	if ((r = buf_put(b, num, strlen(num))) < 0 || (r = buf_put(b, " ", 1)) < 0 ||
	    (r = buf_put(b, key, strlen(key))) < 0 || (r = buf_put(b, "=", 1)) < 0 ||
	    (r = buf_put(b, value, strlen(value))) < 0 || (r = buf_put(b, "\n", 1)) < 0)
		return r;
	return 0;
}

/* A member's header, preceded by a pax header when its name or link does
 * not fit ustar's fields. */
static int tar_member_head(int fd, const char *name, char type, unsigned mode, uint64_t size, const char *link)
{
	bool long_name = strlen(name) >= TAR_NAME_MAX, long_link = link && strlen(link) >= TAR_NAME_MAX;
	struct buf pax;
	int r = 0;

	if (size > TAR_SIZE_MAX)
		return -EFBIG;
	if (long_name || long_link) {
		buf_init(&pax, 3 * WIRE_PATH_MAX);
		if ((long_name && (r = pax_record(&pax, "path", name)) < 0) ||
		    (long_link && (r = pax_record(&pax, "linkpath", link)) < 0) ||
		    (r = tar_header(fd, "PaxHeader", 'x', 0644, buf_len(&pax), NULL)) < 0 ||
		    (r = io_write_all(fd, buf_ptr(&pax), buf_len(&pax))) < 0 || (r = tar_pad(fd, buf_len(&pax))) < 0) {
			buf_clear(&pax);
			return r;
		}
		buf_clear(&pax);
	}
	return tar_header(fd, long_name ? "PaxHeader/name" : name, type, mode, size, long_link ? "" : link);
}

/* Its bytes from the pull's staged copy. */
static int tar_copy(int fd, int in, uint64_t size)
{
	uint8_t chunk[64 * 1024];
	int r;

	for (uint64_t off = 0; off < size;) {
		size_t want = size - off < sizeof(chunk) ? (size_t)(size - off) : sizeof(chunk);
		ssize_t k = pread(in, chunk, want, (off_t)off);
		if (k <= 0)
			return k < 0 ? -errno : -EIO; /* the staged copy is ours: it does not shrink */
		if ((r = io_write_all(fd, chunk, (size_t)k)) < 0)
			return r;
		off += (uint64_t)k;
	}
	return tar_pad(fd, size);
}

int wb_replay_add(struct wb_replay *r, const struct wb_pull *p, char *err, size_t errlen)
{
	char name[WIRE_PATH_MAX + 16];
	int rc;

	if (!p->ended) {
		errmsg_set(err, errlen, "the pull is not complete: %s", wb_pull_error(p));
		return -EINVAL;
	}
	for (size_t i = 0; i < p->cfg.n; i++) {
		const char *why;
		const struct wb_change *c = wb_pull_got(p, i, &why);
		if (!c) {
			errmsg_set(err, errlen, "%.300s: %s", p->paths[i], why);
			return -EINVAL;
		}
		if (!c->st_mode) {
			if ((rc = buf_put(&r->deleted, c->path, strlen(c->path) + 1)) < 0)
				return rc;
			r->ndeleted++;
			continue;
		}
		if (!S_ISREG(c->st_mode) && !S_ISLNK(c->st_mode))
			continue; /* as the local fork's replay: files and symlinks */
		snprintf(name, sizeof(name), "files/%s", c->path);
		if (S_ISLNK(c->st_mode))
			rc = tar_member_head(r->fd, name, '2', 0777, 0, c->target);
		else if ((rc = tar_member_head(r->fd, name, '0', c->st_mode & 0777, c->size, NULL)) == 0)
			rc = tar_copy(r->fd, wb_pull_fd(p, i), c->size);
		if (rc == 0)
			rc = buf_put(&r->files, c->path, strlen(c->path) + 1);
		if (rc < 0) {
			errmsg_set(err, errlen, "%.300s: %s", c->path, strerror(-rc));
			return rc;
		}
		r->nfiles++;
	}
	return 0;
}

static int tar_list(int fd, const char *name, const struct buf *b)
{
	int r;

	if ((r = tar_member_head(fd, name, '0', 0600, buf_len(b), NULL)) < 0 ||
	    (r = io_write_all(fd, buf_ptr(b), buf_len(b))) < 0)
		return r;
	return tar_pad(fd, buf_len(b));
}

int wb_replay_finish(struct wb_replay *r, size_t *nfiles, size_t *ndeleted)
{
	static const uint8_t end[2 * TAR_BLOCK];
	int rc;

	if ((rc = tar_list(r->fd, "files.list", &r->files)) < 0 || (rc = tar_list(r->fd, "deleted", &r->deleted)) < 0 ||
	    (rc = io_write_all(r->fd, end, sizeof(end))) < 0)
		return rc;
	*nfiles = r->nfiles;
	*ndeleted = r->ndeleted;
	return 0;
}
