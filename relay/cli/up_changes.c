/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Guest changes in airlock up (doc/SYNC.md "Guest changes and write-back"):
 * the CHG_ITEMs a command's stream carries before its EXIT go into the
 * store (writeback.h); in auto mode the matching, unprotected ones are
 * pulled and written through the mount before the exit reaches the
 * client; the relay's changes / accept / reject ops list, write and
 * revert them. Written paths are remembered ("adopted") until the push of
 * the journal's record of that write, whose op sync_cfg.keep drops: the
 * guest already holds those bytes, nothing loops back.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fnmatch.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/content/apply.h"
#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/io.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/policy/policy.h"
#include "airlock/policy/protect.h"
#include "airlock/server/relay.h"
#include "airlock/sync/audit.h"
#include "airlock/sync/sync.h"
#include "airlock/sync/writeback.h"
#include "cmd_i.h"
#include "up_i.h"

#define CAP_NAME       "workspace.writeback_max_mib"
#define SHOW_FILE_MAX  (1u << 20)  /* changes --diff: guest bytes per file */
#define SHOW_MAX       (32u << 20) /* ... and in all */
#define ADOPTED_MAX    (1u << 20)
#define CONFIRMED_FILE UP_CONFIRMED_FILE
#define SENDING_FILE   "sending.manifest" /* what was in flight when the connection dropped */
#define PULL_GROUP     512u		  /* paths per CHG_PULL: each staged file holds an fd until written */

enum pull_kind { PULL_AUTO, PULL_ACCEPT, PULL_SHOW, PULL_STASH };

/* One pull from the guest: paths asked in groups that fit one CHG_PULL. */
struct upull {
	struct up *u;
	struct upull *next;
	enum pull_kind kind;
	uint32_t stream;
	char **paths;
	size_t n, gstart, gend;
	struct wb_pull *wp;
	uint64_t cap_left;
	bool *done;
	char **why;    /* per path: refused, why (owned), NULL */
	json_t *shown; /* PULL_SHOW: path -> content */
	/* who waits */
	struct relay_cmd *cmd;
	struct relay_exit ex;
	uint64_t token;
	json_t *answer; /* accept/show: the answer built so far */
	char err[512];
};

static const struct policy_workspace *ws(const struct up *u)
{
	return policy_workspace(u->pol.policy);
}

static uint64_t cap_bytes(const struct up *u)
{
	int64_t mib = ws(u) ? ws(u)->writeback_max_mib : POLICY_WRITEBACK_MAX_MIB;
	return (uint64_t)(mib > 0 ? mib : POLICY_WRITEBACK_MAX_MIB) << 20;
}

int up_changes_init(struct up *u)
{
	char err[512] = "";
	int r;

	u->chg.state_fd = open(u->state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (u->chg.state_fd < 0) {
		cmd_err("up: state directory %s: %s", u->state_dir, strerror(errno));
		return -1;
	}
	if ((r = wb_store_open(u->chg.state_fd, &u->chg.store, err, sizeof(err))) < 0) {
		cmd_err("up: guest changes: %s/%s", u->state_dir, err[0] ? err : strerror(-r));
		return -1;
	}
	if (policy_ctx_new(u->pol.policy, u->dirfd, &u->chg.pctx) < 0) {
		cmd_err("up: out of memory");
		return -1;
	}
	crypto_sign_keypair(u->chg.pk, u->chg.sk);
	randombytes_buf(u->chg.scope, sizeof(u->chg.scope));
	u->chg.exact_on_disk = true; /* a past session's may be: marked lagging once this one confirms */
	return 0;
}

static void pull_free(struct upull *p);
static void base_wait(struct up *u);
static int pull_start(struct up *u, struct upull *p);
static void rejected_clear(struct up *u);
static void save_confirmed(struct up *u, struct sync *engine, bool exact);
static struct manifest *chg_base(struct up *u);
static const struct manifest *base_known(struct up *u);

void up_changes_clear(struct up *u)
{
	if (u->chg.store && u->sync.engine)
		save_confirmed(u, u->sync.engine, true); /* down: exact for the next up's reconcile */
	while (u->chg.pulls) {
		struct upull *p = u->chg.pulls;
		u->chg.pulls = p->next;
		if (p->cmd) /* relay_free released it already: nothing to tell */
			p->cmd = NULL;
		pull_free(p);
	}
	for (size_t i = 0; i < u->chg.nadopted; i++) {
		mem_free(u->chg.adopted[i].path);
		mem_free(u->chg.adopted[i].target);
	}
	mem_free(u->chg.adopted);
	for (size_t i = 0; i < u->chg.nrejects; i++)
		free(u->chg.reject_bodies[i]);
	mem_free(u->chg.rejects);
	mem_free(u->chg.reject_bodies);
	apply_free(u->chg.apply);
	u->chg.base_pending = false; /* not loaded: nothing to free */
	manifest_free(u->chg.base);
	manifest_free(u->chg.sending);
	rejected_clear(u);
	policy_ctx_free(u->chg.pctx);
	wb_store_free(u->chg.store);
	if (u->chg.state_fd > 0)
		close(u->chg.state_fd);
	sodium_memzero(u->chg.sk, sizeof(u->chg.sk));
	memset(&u->chg, 0, sizeof(u->chg));
}

static void save_store(struct up *u)
{
	up_state_wrote(u, WB_STORE_FILE, wb_store_save(u->chg.store));
}

/* ---- CHG_ITEM: a command's changes ---- */

static struct xcmd *xcmd_of_stream(struct up *u, uint32_t stream)
{
	for (struct xcmd *x = u->exec.xcmds; x; x = x->next)
		if (x->stream && x->stream == stream)
			return x;
	return NULL;
}

static void rep_add(struct xcmd *x, const char *path)
{
	if (x->nrep == x->caprep) {
		size_t nc = x->caprep ? x->caprep * 2 : 16;
		void *nv = mem_realloc(x->rep, nc * sizeof(*x->rep));
		if (!nv)
			return; /* it still waits in the store; only auto mode misses it */
		x->rep = nv;
		x->caprep = nc;
	}
	if ((x->rep[x->nrep] = mem_strdup(path)))
		x->nrep++;
}

void up_changes_item(struct up *u, struct xcmd *x, const uint8_t *data, size_t n)
{
	struct wire_chg_item it;
	struct buf in;
	char why[160];
	int r;

	buf_view(&in, data, n);
	if (wire_chg_item_decode(&in, &it) < 0 || manifest_path_check(it.path, strlen(it.path)) < 0) {
		wire_chg_item_clear(&it);
		snprintf(why, sizeof(why), "malformed CHG_ITEM from the guest on stream %u", x->stream);
		up_drop_conn(u, -EPROTO, why);
		return;
	}
	if (u->chg.store) {
		struct xcmd *by = it.by ? xcmd_of_stream(u, it.by) : NULL;
		const char *id = by && by->cmd ? relay_cmd_name(by->cmd) : NULL;
		r = wb_note(u->chg.store, u->pol.policy, u->chg.pctx,
			    u->sync.engine ? sync_known(u->sync.engine) : NULL, &it, id, by ? by->by_argv : NULL);
		if (r > 0)
			rep_add(x, it.path);
		else if (r < 0)
			cmd_err("up: guest change %s: %s (it stays in the guest)", it.path, strerror(-r));
	}
	wire_chg_item_clear(&it);
}

/* ---- pulls ---- */

static void pull_free(struct upull *p)
{
	if (!p)
		return;
	if (p->stream && p->u->conn.chan)
		chan_stream_close(p->u->conn.chan, p->stream);
	wb_pull_free(p->wp);
	for (size_t i = 0; i < p->n; i++) {
		mem_free(p->paths[i]);
		if (p->why)
			mem_free(p->why[i]);
	}
	mem_free(p->paths);
	mem_free(p->why);
	mem_free(p->done);
	json_decref(p->shown);
	json_decref(p->answer);
	mem_free(p);
}

static void pull_unlink(struct up *u, struct upull *p)
{
	for (struct upull **pp = &u->chg.pulls; *pp; pp = &(*pp)->next) {
		if (*pp == p) {
			*pp = p->next;
			break;
		}
	}
}

static void pull_finish(struct upull *p, int err);

int up_changes_ask(struct up *u, struct chan *c, char **paths, size_t from, size_t n, uint64_t max_bytes,
		   const char *cap_name, size_t *end, struct wb_pull **wp, uint32_t *stream)
{
	size_t bytes = 4, k = from;
	struct buf b;
	int r;

	while (k < n && k - from < PULL_GROUP && bytes + 4 + strlen(paths[k]) <= WIRE_PAYLOAD_MAX)
		bytes += 4 + strlen(paths[k++]);
	*end = k;
	struct wb_pull_cfg cfg = {.paths = (const char *const *)paths + from,
				  .n = k - from,
				  .max_bytes = max_bytes,
				  .cap_name = cap_name,
				  .tmp_dirfd = u->chg.state_fd,
				  .chunking = &chunk_params_default};
	if ((r = wb_pull_new(&cfg, wp)) < 0)
		return r;
	if (!c || !(*stream = chan_stream_open(c, 0)))
		return -ENOTCONN;
	struct wire_sync_req q = {.n = (uint32_t)(k - from), .names = paths + from};
	buf_init(&b, WIRE_PAYLOAD_MAX);
	if ((r = wire_sync_req_encode(&b, &q)) == 0)
		r = chan_send(c, WIRE_CHG_PULL, *stream, buf_ptr(&b), buf_len(&b));
	buf_clear(&b);
	return r == -EAGAIN ? -EBUSY : r;
}

uint64_t up_changes_cap(const struct up *u)
{
	return cap_bytes(u);
}

/* The next group of paths that fits one CHG_PULL frame, asked. */
static int pull_next_group(struct upull *p)
{
	p->gstart = p->gend;
	wb_pull_free(p->wp);
	p->wp = NULL;
	return up_changes_ask(
	    p->u, p->u->conn.chan, p->paths, p->gstart, p->n, p->kind == PULL_SHOW ? SHOW_MAX : p->cap_left,
	    p->kind == PULL_SHOW ? "the review's size limit (32 MiB)" : CAP_NAME, &p->gend, &p->wp, &p->stream);
}

static int pull_start(struct up *u, struct upull *p)
{
	int r;

	p->u = u;
	if (!(p->done = mem_calloc(p->n ? p->n : 1, sizeof(*p->done))) ||
	    !(p->why = mem_calloc(p->n ? p->n : 1, sizeof(*p->why))))
		return -ENOMEM;
	p->cap_left = cap_bytes(u);
	p->next = u->chg.pulls;
	u->chg.pulls = p;
	if ((r = pull_next_group(p)) < 0) {
		pull_unlink(u, p);
		return r;
	}
	return 0;
}

/* Remember a written path so that the push of its journal record is
 * dropped (the guest holds it already). */
static void adopt(struct up *u, const struct wb_change *c)
{
	if (u->chg.nadopted >= ADOPTED_MAX)
		return; /* then that push resends the same bytes: harmless */
	if (u->chg.nadopted == u->chg.capadopted) {
		size_t nc = u->chg.capadopted ? u->chg.capadopted * 2 : 64;
		void *nv = mem_realloc(u->chg.adopted, nc * sizeof(*u->chg.adopted));
		if (!nv)
			return;
		u->chg.adopted = nv;
		u->chg.capadopted = nc;
	}
	struct wb_change *a = &u->chg.adopted[u->chg.nadopted];
	*a = *c;
	a->by_id = a->by_argv = NULL;
	if (!(a->path = mem_strdup(c->path)))
		return;
	a->target = c->target ? mem_strdup(c->target) : NULL;
	u->chg.nadopted++;
}

/* The file a conflict's guest version is kept in (in the state dir). */
static void stash_name(const char *path, char out[64])
{
	uint8_t h[16];
	char hex[33];

	crypto_generichash(h, sizeof(h), (const uint8_t *)path, strlen(path), NULL, 0);
	sodium_bin2hex(hex, sizeof(hex), h, sizeof(h));
	snprintf(out, 64, "conflict-%s", hex);
}

/* The guest's versions of conflicts are on the host: keep them, then a
 * reconcile sends the host's versions to the guest (keep() lets them by). */
static void stash_group_done(struct upull *p, size_t n)
{
	struct up *u = p->u;
	const char *why;
	uint8_t buf[64 * 1024];

	for (size_t i = 0; i < n; i++) {
		const struct wb_change *c = wb_pull_got(p->wp, i, &why);
		int in = wb_pull_fd(p->wp, i);
		char name[64], tmp[80];
		bool ok = c && S_ISREG(c->st_mode) && in >= 0;
		if (!ok)
			continue; /* changed meanwhile: its next report says what the guest holds */
		stash_name(c->path, name);
		snprintf(tmp, sizeof(tmp), "%s.tmp", name);
		int out = openat(u->chg.state_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
		for (uint64_t off = 0; ok && out >= 0 && off < c->size;) {
			ssize_t k = pread(in, buf, sizeof(buf), (off_t)off);
			ok = k > 0 && write(out, buf, (size_t)k) == k;
			off += k > 0 ? (uint64_t)k : 0;
		}
		ok = ok && out >= 0 && fsync(out) == 0;
		if (out >= 0)
			close(out);
		if (!ok || renameat(u->chg.state_fd, tmp, u->chg.state_fd, name) < 0) {
			int e = errno ? errno : EIO;
			unlinkat(u->chg.state_fd, tmp, 0);
			cmd_err("up: conflict on %s: could not keep the guest's version (%s); the guest keeps it",
				c->path, strerror(e));
			up_state_wrote(u, UP_STASH_FILES, -e);
			continue;
		}
		up_state_wrote(u, UP_STASH_FILES, 0);
		const struct wb_change *w = wb_store_find(u->chg.store, c->path);
		if (w && (w->size != c->size || memcmp(w->hash, c->hash, CHUNK_HASH_LEN))) {
			/* the guest changed it again: what was kept is what it holds */
			struct wire_chg_item it = {
			    .path = c->path, .st_mode = c->st_mode, .size = c->size, .flags = WIRE_CHG_F_HASHED};
			memcpy(it.hash, c->hash, CHUNK_HASH_LEN);
			wb_note(u->chg.store, u->pol.policy, u->chg.pctx, base_known(u), &it, w->by_id, w->by_argv);
			wb_store_set_conflict(u->chg.store, c->path);
		}
		wb_store_set_stash(u->chg.store, c->path, name);
	}
	save_store(u);
	u->sync.pending_full = true;
}

/* A host edit of a waiting change: keep the guest's version on the host,
 * then the host's goes to the guest. */
static void stash_start(struct up *u, const struct wb_change *w)
{
	struct upull *p;

	for (p = u->chg.pulls; p; p = p->next)
		for (size_t i = 0; p->kind == PULL_STASH && i < p->n; i++)
			if (!strcmp(p->paths[i], w->path))
				return; /* already on its way */
	if (!S_ISREG(w->st_mode)) {
		/* nothing to keep but what the store says (a delete, a directory, a link) */
		wb_store_set_stash(u->chg.store, w->path, "");
		u->sync.pending_full = true;
		return;
	}
	if (!(p = mem_calloc(1, sizeof(*p))) || !(p->paths = mem_calloc(1, sizeof(char *))) ||
	    !(p->paths[0] = mem_strdup(w->path))) {
		if (p)
			mem_free(p->paths);
		mem_free(p);
		return; /* both versions stay where they are */
	}
	p->n = 1;
	p->kind = PULL_STASH;
	if (pull_start(u, p) < 0)
		pull_free(p);
}

/* A group is complete: write it (or keep its bytes for the review). */
static int pull_group_done(struct upull *p)
{
	struct up *u = p->u;
	size_t n = p->gend - p->gstart;
	const char *why;
	char err[512] = "";
	int r;

	if (p->kind == PULL_STASH) {
		stash_group_done(p, n);
		return 0;
	}
	if (p->kind == PULL_SHOW) {
		for (size_t i = 0; i < n; i++) {
			const struct wb_change *c = wb_pull_got(p->wp, i, &why);
			int fd = wb_pull_fd(p->wp, i);
			json_t *o = NULL;
			if (c && S_ISREG(c->st_mode) && fd >= 0 && c->size <= SHOW_FILE_MAX) {
				char *data = mem_alloc(c->size ? c->size : 1);
				if (data && pread(fd, data, c->size, 0) == (ssize_t)c->size) {
					bool binary = memchr(data, 0, c->size) != NULL;
					o = binary ? json_pack("{s:b}", "binary", 1)
						   : json_pack("{s:s%}", "text", data, (size_t)c->size);
					if (!o) /* not UTF-8: a binary file for the review */
						o = json_pack("{s:b}", "binary", 1);
				}
				mem_free(data);
			} else if (c && S_ISREG(c->st_mode)) {
				o = json_pack("{s:b, s:b}", "binary", 1, "too_large", c->size > SHOW_FILE_MAX);
			}
			if (o)
				json_object_set_new(p->shown, p->paths[p->gstart + i], o);
		}
		return 0;
	}
	if (!u->chg.apply) {
		/* durable by one syncfs of the backing file system per batch
		 * (below), not an fsync per file through the mount */
		struct apply_opts ao = {.fsync = APPLY_FSYNC_NONE};
		if ((r = apply_open(u->dir, &ao, &u->chg.apply)) < 0) {
			snprintf(p->err, sizeof(p->err), "opening %.300s for the write-back: %s", u->dir, strerror(-r));
			return r;
		}
	}
	r = wb_pull_write(p->wp, u->chg.apply, u->chg.sk, u->chg.pk, u->chg.scope, p->done + p->gstart, err,
			  sizeof(err));
	/* on the host's disk before the store forgets them */
	if (syncfs(u->dirfd) < 0)
		cmd_err("up: write-back: syncfs of %s: %s", u->dir, strerror(errno));
	for (size_t i = 0; i < n; i++) {
		const struct wb_change *c = wb_pull_got(p->wp, i, &why);
		size_t k = p->gstart + i;
		if (p->done[k] && c) {
			adopt(u, c);
			wb_store_remove(u->chg.store, p->paths[k]);
			if (S_ISREG(c->st_mode))
				p->cap_left -= c->size < p->cap_left ? c->size : p->cap_left;
		} else if (!p->why[k]) {
			p->why[k] = mem_strdup(why ? why : err[0] ? err : "not written");
		}
	}
	save_store(u);
	if (r < 0)
		snprintf(p->err, sizeof(p->err), "%s", err);
	return r;
}

void up_changes_frame(struct up *u, uint8_t type, uint32_t stream, const uint8_t *data, size_t n)
{
	struct upull *p;
	int r;

	for (p = u->chg.pulls; p && p->stream != stream; p = p->next)
		;
	if (u->conn.chan)
		chan_consume(u->conn.chan, stream, n);
	if (!p) {
		/* a pull we gave up: forget the stream at its end */
		if (type == WIRE_CHG_END && u->conn.chan)
			chan_stream_close(u->conn.chan, stream);
		else if (type == WIRE_CHG_ITEM || type == WIRE_CHG_PULL)
			up_drop_conn(u, -EPROTO, "changes frame on a stream that is no pull");
		return;
	}
	if ((r = wb_pull_frame(p->wp, type, data, n)) == 0)
		return;
	if (r < 0) {
		snprintf(p->err, sizeof(p->err), "%s", wb_pull_error(p->wp));
		if (type != WIRE_CHG_END) { /* the rest of the stream is ignored */
			p->stream = 0;
		}
		pull_finish(p, r);
		return;
	}
	if (u->conn.chan)
		chan_stream_close(u->conn.chan, p->stream);
	p->stream = 0;
	if ((r = pull_group_done(p)) < 0 || p->gend >= p->n || (r = pull_next_group(p)) < 0) {
		if (r < 0 && !p->err[0])
			snprintf(p->err, sizeof(p->err), "%s", strerror(-r));
		pull_finish(p, r);
	}
}

bool up_changes_refused(struct up *u, uint32_t stream, const char *msg)
{
	struct upull *p;

	for (p = u->chg.pulls; p && p->stream != stream; p = p->next)
		;
	if (!p)
		return false;
	if (u->conn.chan)
		chan_stream_close(u->conn.chan, stream);
	p->stream = 0;
	snprintf(p->err, sizeof(p->err), "the guest refused the pull: %.200s", msg);
	pull_finish(p, -EBUSY);
	return true;
}

void up_changes_conn_lost(struct up *u)
{
	/* what the guest confirmed last, exactly, for the next reconcile */
	if (u->chg.store)
		save_confirmed(u, u->sync.dead, true);
	while (u->chg.pulls) {
		struct upull *p = u->chg.pulls;
		p->stream = 0;
		snprintf(p->err, sizeof(p->err), "the guest went away during the pull");
		pull_finish(p, -ENOTCONN);
	}
}

/* ---- what waits, as JSON ---- */

static bool selected(const char *path, const char *const *paths, size_t n)
{
	if (!n)
		return true;
	for (size_t i = 0; i < n; i++) {
		size_t k = strlen(paths[i]);
		if (!strcmp(path, paths[i]) || (!strncmp(path, paths[i], k) && path[k] == '/'))
			return true;
	}
	return false;
}

static enum protect_why protected_why(struct up *u, const struct wb_change *c)
{
	return protect_check_ctx(u->pol.policy, u->chg.pctx, c->path, c->st_mode, c->target);
}

static json_t *change_json(struct up *u, const struct wb_change *c, bool *hidden)
{
	const char *from;
	enum wb_kind k = wb_store_kind(u->chg.store, c, &from, hidden);
	enum protect_why pw = protected_why(u, c);
	char mode[8];
	json_t *o, *by = json_null();

	snprintf(mode, sizeof(mode), "%04o", c->st_mode ? c->st_mode & 07777 : c->base_mode);
	if (c->by_id) {
		json_t *id = json_loads(c->by_id, JSON_DECODE_ANY, NULL);
		json_t *argv = c->by_argv ? json_loads(c->by_argv, 0, NULL) : NULL;
		json_decref(by);
		by = json_pack("{s:o, s:o}", "id", id ? id : json_null(), "argv", argv ? argv : json_null());
	}
	o = json_pack("{s:s, s:s, s:I, s:s, s:o, s:b, s:o}", "path", c->path, "kind", wb_kind_str(k), "size",
		      (json_int_t)(c->st_mode ? c->size : c->base_size), "mode", mode, "protected",
		      pw == PROTECT_NONE ? json_null() : json_string(protect_why_str(pw)), "conflict", c->conflict,
		      "by", by ? by : json_null());
	if (o && from)
		json_object_set_new(o, "from", json_string(from));
	if (o && c->target)
		json_object_set_new(o, "target", json_string(c->target));
	if (o && c->had)
		json_object_set_new(o, "host_size", json_integer((json_int_t)c->base_size));
	return o;
}

static json_t *list_json(struct up *u, const char *const *paths, size_t n)
{
	json_t *arr = json_array();

	for (size_t i = 0; arr && u->chg.store && i < wb_store_count(u->chg.store); i++) {
		const struct wb_change *c = wb_store_at(u->chg.store, i);
		bool hidden;
		if (!selected(c->path, paths, n))
			continue;
		json_t *o = change_json(u, c, &hidden);
		if (!hidden && o)
			json_array_append_new(arr, o);
		else
			json_decref(o);
	}
	return arr ? json_pack("{s:i, s:o}", "version", 1, "changes", arr) : NULL;
}

static void answer(struct up *u, uint64_t token, const char *event, json_t *body)
{
	char *text = body ? json_dumps(body, JSON_COMPACT) : NULL;

	if (text)
		relay_changes_done(u->exec.relay, token, event, text, NULL, NULL);
	else
		relay_changes_done(u->exec.relay, token, NULL, NULL, "busy", "out of memory");
	free(text);
	json_decref(body);
}

/* ---- finishing a pull: who waited ---- */

static void pull_finish(struct upull *p, int err)
{
	struct up *u = p->u;
	uint64_t written = 0;

	pull_unlink(u, p);
	for (size_t i = 0; i < p->n; i++)
		written += p->done[i];
	switch (p->kind) {
	case PULL_AUTO: {
		if (err < 0)
			cmd_err("up: write-back after %s: %s (the changes wait for review: airlock changes)",
				p->cmd ? relay_cmd_name(p->cmd) : "a command", p->err);
		struct relay_exit ex = p->ex;
		ex.written_back = written;
		ex.waiting = ex.waiting >= written ? ex.waiting - written : 0;
		if (p->cmd)
			relay_cmd_exit(p->cmd, &ex);
		break;
	}
	case PULL_ACCEPT: {
		json_t *acc = json_incref(json_object_get(p->answer, "accepted")),
		       *ref = json_object_get(p->answer, "refused");
		if (!acc)
			acc = json_array();
		for (size_t i = 0; i < p->n; i++) {
			if (p->done[i])
				json_array_append_new(acc, json_string(p->paths[i]));
			else
				json_array_append_new(ref, json_pack("{s:s, s:s}", "path", p->paths[i], "why",
								     p->why[i]	 ? p->why[i]
								     : p->err[0] ? p->err
										 : "not written"));
		}
		json_object_set_new(p->answer, "accepted", acc);
		if (err < 0)
			json_object_set_new(p->answer, "error", json_string(p->err));
		answer(u, p->token, "accepted", json_incref(p->answer));
		break;
	}
	case PULL_STASH:
		if (err < 0)
			cmd_err("up: conflict: keeping the guest's version failed (%s); the guest keeps it", p->err);
		break;
	case PULL_SHOW:
		if (err < 0)
			json_object_set_new(p->answer, "error", json_string(p->err));
		json_object_set(p->answer, "guest", p->shown);
		answer(u, p->token, "changes", json_incref(p->answer));
		break;
	}
	pull_free(p);
}

/* ---- a command's exit ---- */

static bool auto_ok(struct up *u, const struct wb_change *c)
{
	const struct policy_workspace *w = ws(u);
	bool is_dir = c->st_mode ? S_ISDIR(c->st_mode) : c->base_type == MANIFEST_DIR;

	return w && w->writeback_auto.n && !c->conflict && policy_writeback_auto(u->pol.policy, c->path, is_dir) &&
	       protected_why(u, c) == PROTECT_NONE;
}

void up_changes_exit(struct up *u, struct xcmd *x, struct relay_cmd *cmd, const struct relay_exit *ex0)
{
	struct relay_exit ex = *ex0;
	struct upull *p = NULL;
	uint64_t bytes = 0;
	size_t n = 0;

	/* what it reported that still waits */
	for (size_t i = 0; i < x->nrep; i++) {
		if (u->chg.store && wb_store_find(u->chg.store, x->rep[i]))
			x->rep[n++] = x->rep[i];
		else
			mem_free(x->rep[i]);
	}
	x->nrep = 0;
	if (!n) {
		relay_cmd_exit(cmd, &ex);
		return;
	}
	save_store(u);
	ex.changes = true;
	ex.waiting = n;
	/* auto mode: the matching, unprotected ones now, before the exit,
	 * as far as the cap allows (a file over what is left waits) */
	size_t na = 0;
	uint64_t cap = cap_bytes(u);
	for (size_t i = 0; i < n; i++) {
		const struct wb_change *c = wb_store_find(u->chg.store, x->rep[i]);
		uint64_t sz = c && S_ISREG(c->st_mode) ? c->size : 0;
		if (c && auto_ok(u, c) && sz > cap - bytes) {
			cmd_err("up: write-back of %s after %s refused: %" PRIu64
				" bytes would go over the cap of %" PRIu64 " MiB (%s); it waits for review",
				c->path, relay_cmd_name(cmd), sz, cap >> 20, CAP_NAME);
		} else if (c && auto_ok(u, c)) {
			bytes += sz;
			x->rep[na++] = x->rep[i];
			continue;
		}
		mem_free(x->rep[i]);
	}
	if (!na) {
		relay_cmd_exit(cmd, &ex);
		return;
	}
	if (!(p = mem_calloc(1, sizeof(*p)))) {
		for (size_t i = 0; i < na; i++)
			mem_free(x->rep[i]);
		relay_cmd_exit(cmd, &ex);
		return;
	}
	p->kind = PULL_AUTO;
	p->paths = x->rep;
	p->n = na;
	x->rep = NULL;
	x->caprep = 0;
	p->cmd = cmd;
	p->ex = ex;
	if (pull_start(u, p) < 0) {
		cmd_err("up: write-back after %s: could not ask the guest; the changes wait for review",
			relay_cmd_name(cmd));
		p->cmd = NULL;
		pull_free(p);
		relay_cmd_exit(cmd, &ex);
	}
}

/* ---- the sync engine's side ---- */

static long adopted_find(struct up *u, const char *path)
{
	for (size_t i = 0; i < u->chg.nadopted; i++)
		if (!strcmp(u->chg.adopted[i].path, path))
			return (long)i;
	return -1;
}

static void adopted_drop(struct up *u, size_t i)
{
	mem_free(u->chg.adopted[i].path);
	mem_free(u->chg.adopted[i].target);
	u->chg.adopted[i] = u->chg.adopted[--u->chg.nadopted];
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

static bool was_rejected(struct up *u, const char *path)
{
	return u->chg.nrejected && bsearch(&path, u->chg.rejected, u->chg.nrejected, sizeof(char *), str_cmp);
}

static void rejected_clear(struct up *u)
{
	for (size_t i = 0; i < u->chg.nrejected; i++)
		mem_free(u->chg.rejected[i]);
	mem_free(u->chg.rejected);
	u->chg.rejected = NULL;
	u->chg.nrejected = 0;
}

/* The saved state describes this guest's copy: the same guest key, the
 * same generation of its copy (a fresh or replaced copy has a new one:
 * everything would look deleted), and the guest has applied at least the
 * batch it was saved at. */
static const struct manifest *base_usable(struct up *u)
{
	/* a reconcile on a live connection (the journal overflowed): what
	 * this engine knows the guest confirmed, exactly */
	if (u->sync.engine && sync_known(u->sync.engine))
		return sync_known(u->sync.engine);
	if (chg_base(u) && u->sync.engine && u->chg.base_seq &&
	    sync_get_stats(u->sync.engine)->guest_seq >= u->chg.base_seq &&
	    sync_get_stats(u->sync.engine)->guest_gen == u->chg.base_gen &&
	    !sodium_memcmp(u->chg.base_guest, u->conn.g.guest_pub, sizeof(u->chg.base_guest)))
		return u->chg.base;
	return NULL;
}

static bool entry_same(const struct manifest_entry *a, const struct manifest_entry *b)
{
	if (!a || !b)
		return !a && !b;
	if (a->type != b->type || a->mode != b->mode)
		return false;
	return a->type == MANIFEST_DIR || (a->size == b->size && !memcmp(a->hash, b->hash, CHUNK_HASH_LEN));
}

/* A reconcile found the guest different from the host at a path no
 * report named (the agent died before it reported, a background process
 * wrote after the last report): three ways against the confirmed state
 * saved before. The guest changed it (its entry differs from the saved
 * one) and the host did not (its entry is the saved one): a guest change,
 * kept. Otherwise the host's version goes to the guest, as before. */
static bool unreported_change(struct up *u, const struct manifest *base, const struct manifest_change *c,
			      const char *path)
{
	long i = manifest_find(base, path);
	const struct manifest_entry *b = i >= 0 ? &base->e[i] : NULL, *g = c->old, *h = c->new;
	struct wb_change gc = {0};

	if (g) {
		gc.st_mode = (g->type == MANIFEST_DIR	    ? S_IFDIR
			      : g->type == MANIFEST_SYMLINK ? S_IFLNK
							    : S_IFREG) |
			     (g->type == MANIFEST_SYMLINK ? 0777 : g->mode);
		gc.size = g->size;
		gc.hashed = true;
		memcpy(gc.hash, g->hash, CHUNK_HASH_LEN);
	}
	if (wb_same(&gc, b) || (g && b && g->type == MANIFEST_DIR && b->type == MANIFEST_DIR))
		return false; /* the guest still holds the confirmed state: the host changed it */
	/* Only where the host has not changed it since: a guest that got a
	 * later push of a path the host changed again (a batch applied but
	 * not acknowledged when the connection dropped) differs from the
	 * saved state too, and that is the host's to send. */
	if (!entry_same(h, b))
		return false;
	/* a batch the guest applied but whose acknowledgement the dropped
	 * connection lost: that state is the host's. So is any state of a
	 * path that batch changed: the agent may have died between two of its
	 * ops (a symlink retargeted is a remove and an add), leaving the path
	 * in neither the confirmed nor the sent state (up_e2e: a link missing
	 * in the guest after a kill -9 mid-burst, kept as a guest delete). */
	if (base == u->chg.base && u->chg.sending) {
		long si = manifest_find(u->chg.sending, path);
		const struct manifest_entry *sent = si >= 0 ? &u->chg.sending->e[si] : NULL;
		if (entry_same(g, sent) || !entry_same(sent, b))
			return false;
	}
	struct wire_chg_item it = {
	    .path = (char *)path, .st_mode = gc.st_mode, .size = gc.size, .flags = g ? WIRE_CHG_F_HASHED : 0};
	if (g)
		memcpy(it.hash, g->hash, CHUNK_HASH_LEN);
	/* symlink targets are not in a reconstructed entry: protect_check
	 * treats such a link as leaving the workspace */
	if (wb_note(u->chg.store, u->pol.policy, u->chg.pctx, base, &it, NULL, NULL) <= 0)
		return false;
	save_store(u);
	return true;
}

bool up_changes_keep(void *ud, const struct manifest_change *c)
{
	struct up *u = ud;
	const char *path = c->new ? c->new->path : c->old->path;
	long a = u->chg.nadopted ? adopted_find(u, path) : -1;

	if (a >= 0) {
		/* the journal's record of our own write-back: the guest has it */
		bool same = wb_same(&u->chg.adopted[a], c->new);
		adopted_drop(u, (size_t)a);
		if (same)
			return true;
	}
	const struct manifest *base = u->chg.store && u->sync.op_full ? base_usable(u) : NULL;
	if (base && !wb_store_find(u->chg.store, path) && !was_rejected(u, path))
		return unreported_change(u, base, c, path);
	const struct wb_change *w = u->chg.store ? wb_store_find(u->chg.store, path) : NULL;
	if (!w)
		return false;
	if (w->conflict && w->stash)
		return false; /* the guest's version is kept on the host: the host's goes to the guest */
	if (!u->sync.op_full) {
		/* a host edit of a path the guest changed: a conflict. The
		 * guest's version is fetched and kept on the host first, then
		 * a reconcile sends the host's (stash_start). */
		wb_store_set_conflict(u->chg.store, path);
		stash_start(u, w);
		save_store(u);
	}
	return true;
}

/* fill(fd, ud) writes the file's bytes. */
typedef int save_fill_fn(int fd, const void *ud);

/* The confirmed state to CONFIRMED_FILE (temporary name, rename; no
 * fsync: a stale or lost one only turns an unreported guest change into
 * a conflict, or leaves it to the old behaviour, never loses a reported one). */
static int save_with(struct up *u, const char *name, save_fill_fn *fill, const void *ud)
{
	char tmp[64];
	int fd, r;

	snprintf(tmp, sizeof(tmp), "%s.tmp", name);
	if ((fd = openat(u->chg.state_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return -errno;
	r = fill(fd, ud);
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r == 0 && renameat(u->chg.state_fd, tmp, u->chg.state_fd, name) < 0)
		r = -errno;
	if (r < 0)
		unlinkat(u->chg.state_fd, tmp, 0);
	return r;
}

struct bytes {
	const void *p;
	size_t n;
};

static int fill_bytes(int fd, const void *ud)
{
	const struct bytes *b = ud;
	return io_write_all(fd, b->p, b->n);
}

static int save_bytes(struct up *u, const char *name, const void *p, size_t n)
{
	struct bytes b = {p, n};
	return save_with(u, name, fill_bytes, &b);
}

static int write_piece(void *ud, struct buf *b)
{
	int r = io_write_all(*(const int *)ud, buf_ptr(b), buf_len(b));
	buf_reset(b);
	return r;
}

/* Written as it is encoded, a piece at a time (a whole-tree encoding is
 * tens of MB at 100k files; it was built whole before the write). */
static int fill_manifest(int fd, const void *ud)
{
	struct buf b;
	int r;

	buf_init(&b, (size_t)1 << 31);
	if ((r = manifest_encode_to(ud, &b, write_piece, &fd)) == 0)
		r = write_piece(&fd, &b);
	buf_clear(&b);
	return r;
}

/* 0 or -errno (m NULL: the file is removed). */
static int save_manifest(struct up *u, const struct manifest *m, const char *name)
{
	if (!m)
		return unlinkat(u->chg.state_fd, name, 0) < 0 && errno != ENOENT ? -errno : 0;
	return save_with(u, name, fill_manifest, m);
}

/* CONFIRMED_FILE.meta: whose and when (the guest's key, its sequence and
 * the generation of its copy),
 * whether the manifests beside it are exact, and the root digest of the
 * confirmed one (root NULL: a lagging mark, whose root no one reads).
 * 0 or -errno (also said by up_state_wrote). */
static int save_meta(struct up *u, const struct sync_stats *gs, bool exact, const uint8_t *root)
{
	char meta[200], hex[65], rhex[2 * CHUNK_HASH_LEN + 1] = "-";
	sodium_bin2hex(hex, sizeof(hex), u->conn.g.guest_pub, 32);
	if (root)
		sodium_bin2hex(rhex, sizeof(rhex), root, CHUNK_HASH_LEN);
	int n = snprintf(meta, sizeof(meta), "%s %llu %s %s %016llx\n", hex, (unsigned long long)gs->guest_seq,
			 exact ? "exact" : "lagging", rhex, (unsigned long long)gs->guest_gen);
	int r = save_bytes(u, CONFIRMED_FILE ".meta", meta, (size_t)n);
	u->chg.exact_on_disk = exact && r == 0;
	up_state_wrote(u, CONFIRMED_FILE, r);
	return r;
}

/* Saved when the session ends (down, a lost connection): exact, for the
 * next reconcile. While pushes go on, a saved copy lags behind the guest
 * as soon as the next one is confirmed, and after a crash of the daemon
 * such a copy made host edits look like guest changes (faults_e2e): the
 * next reconcile uses only an exact one, so a live session never writes
 * the manifests (their size is the tree's: about 8 MB at 100k files, once
 * per edit burst before); the first confirmed operation only marks what
 * is on disk as lagging (up_changes_synced). */
static void save_confirmed(struct up *u, struct sync *engine, bool exact)
{
	const struct manifest *k = engine ? sync_known(engine) : NULL;

	if (!k) {
		/* An engine that never confirmed anything (the connection died
		 * in its first reconcile): the guest may now hold part of that
		 * reconcile beyond the saved state, which no longer describes
		 * it. Its keep() has already taken what the saved state showed
		 * as guest changes into the store. Without an engine (the
		 * connection died in its handshake) nothing was sent: the disk
		 * still says what it said, exact or not, and exact_on_disk
		 * keeps saying so, for the first confirmed push to re-mark
		 * (faults_e2e "a reconnect refused in its handshake"). */
		if (engine) { /* also a restarted daemon's: the disk may say exact */
			int r =
			    unlinkat(u->chg.state_fd, CONFIRMED_FILE ".meta", 0) < 0 && errno != ENOENT ? -errno : 0;
			up_state_wrote(u, CONFIRMED_FILE, r);
			if (r == 0)
				u->chg.exact_on_disk = false;
		}
		return;
	}
	/* the meta goes first and last: a copy whose manifests could not be
	 * written must never be taken for an exact one */
	int r = unlinkat(u->chg.state_fd, CONFIRMED_FILE ".meta", 0) < 0 && errno != ENOENT ? -errno : 0;
	if (r == 0) {
		u->chg.exact_on_disk = false;
		if ((r = save_manifest(u, k, CONFIRMED_FILE)) == 0)
			r = save_manifest(u, sync_sending(engine), SENDING_FILE);
	}
	if (r == 0)
		r = save_meta(u, sync_get_stats(engine), exact, k->root);
	else
		up_state_wrote(u, CONFIRMED_FILE, r);
}

/* A saved manifest, or NULL (missing or damaged: the reconcile goes without). */
static struct manifest *load_manifest(struct up *u, const char *name)
{
	struct manifest *m = NULL;
	struct stat st;
	int fd = openat(u->chg.state_fd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	if (fd < 0)
		return NULL;
	if (fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0 && st.st_size < ((off_t)1 << 31)) {
		uint8_t *p = mem_alloc((size_t)st.st_size);
		if (p && pread(fd, p, (size_t)st.st_size, 0) == st.st_size &&
		    manifest_decode(p, (size_t)st.st_size, MANIFEST_ENTRIES_MAX, &m) < 0)
			m = NULL;
		mem_free(p);
	}
	close(fd);
	return m;
}

/* The saved states are loaded when a reconcile first asks for them (the
 * three-way check of a difference no report named): a reconcile that
 * finds none, an unchanged up among them, never reads them. They were
 * decoded on a thread at every reconcile's start, beside the engine's own
 * state: two whole-tree manifests more at the scan's peak. The question
 * comes from the reconcile's diff, on the engine's job thread; the lock
 * keeps a question from the loop at the same time from loading twice. */
static pthread_mutex_t base_lock = PTHREAD_MUTEX_INITIALIZER;

static void base_wait(struct up *u)
{
	pthread_mutex_lock(&base_lock);
	if (u->chg.base_pending) {
		u->chg.base_pending = false;
		u->chg.base = load_manifest(u, CONFIRMED_FILE);
		u->chg.sending = load_manifest(u, SENDING_FILE);
	}
	pthread_mutex_unlock(&base_lock);
}

void up_changes_reconcile_begin(struct up *u)
{
	int fd;

	u->chg.base_pending = false; /* the last reconcile's, if never asked for */
	manifest_free(u->chg.base);
	manifest_free(u->chg.sending);
	u->chg.base = u->chg.sending = NULL;
	u->chg.base_seq = 0;
	char meta[200] = "", hex[65], how[16] = "";
	unsigned long long seq = 0, gen = 0;
	if ((fd = openat(u->chg.state_fd, CONFIRMED_FILE ".meta", O_RDONLY | O_NOFOLLOW | O_CLOEXEC)) >= 0) {
		ssize_t k = read(fd, meta, sizeof(meta) - 1);
		close(fd);
		meta[k > 0 ? k : 0] = '\0';
	}
	size_t got = 0;
	/* no generation (written before there were any): not this copy's */
	if (sscanf(meta, "%64s %llu %15s %*s %llx", hex, &seq, how, &gen) != 4 || strcmp(how, "exact") != 0 || !gen ||
	    sodium_hex2bin(u->chg.base_guest, sizeof(u->chg.base_guest), hex, strlen(hex), NULL, &got, NULL) < 0 ||
	    got != sizeof(u->chg.base_guest))
		return;
	u->chg.base_seq = seq;
	u->chg.base_gen = gen;
	char root[40] = "";
	got = 0;
	u->chg.base_root_known =
	    sscanf(meta, "%*s %*s %*s %39s", root) == 1 &&
	    sodium_hex2bin(u->chg.base_root, sizeof(u->chg.base_root), root, strlen(root), NULL, &got, NULL) == 0 &&
	    got == sizeof(u->chg.base_root);
	u->chg.base_pending = true;
}

/* The saved confirmed state (and the sending one), once loaded. */
static struct manifest *chg_base(struct up *u)
{
	base_wait(u);
	return u->chg.base;
}

/* What the host knows the guest confirmed: the engine's, else the saved one. */
static const struct manifest *base_known(struct up *u)
{
	if (u->sync.engine && sync_known(u->sync.engine))
		return sync_known(u->sync.engine);
	return chg_base(u);
}

/* After a whole-tree reconcile the engine's confirmed state is the one
 * every later question goes to (base_usable, base_known): the copies
 * loaded from disk for that reconcile are dropped, not kept for the
 * session (two more whole-tree manifests). */
static void base_drop(struct up *u)
{
	if (!u->sync.engine || !sync_known(u->sync.engine))
		return;
	u->chg.base_pending = false; /* not asked for: not loaded at all */
	manifest_free(u->chg.base);
	manifest_free(u->chg.sending);
	u->chg.base = u->chg.sending = NULL;
}

/* The saved confirmed state is already exactly the engine's: an exact
 * one for this guest at its sequence, of the same root (an unchanged up:
 * nothing to write). */
static bool confirmed_on_disk(struct up *u, struct sync *engine)
{
	const struct manifest *k = sync_known(engine);

	return k && u->chg.base_seq && u->chg.base_root_known && sync_get_stats(engine)->changes == 0 &&
	       sync_get_stats(engine)->guest_seq == u->chg.base_seq &&
	       sync_get_stats(engine)->guest_gen == u->chg.base_gen &&
	       !memcmp(u->chg.base_root, k->root, sizeof(u->chg.base_root)) &&
	       !sodium_memcmp(u->chg.base_guest, u->conn.g.guest_pub, sizeof(u->chg.base_guest));
}

void up_changes_save_state(struct up *u)
{
	if (!u->chg.store)
		return;
	save_store(u);
	if (u->sync.engine)
		save_confirmed(u, u->sync.engine, false);
}

void up_changes_synced(struct up *u, bool full)
{
	if (!u->chg.store || !u->sync.engine)
		return;
	/* an exact copy stops being one with this confirmed operation,
	 * unless it found the guest where the copy says (an unchanged up) */
	if (u->chg.exact_on_disk && !(full && confirmed_on_disk(u, u->sync.engine)))
		(void)save_meta(u, sync_get_stats(u->sync.engine), false, NULL);
	if (wb_store_prune(u->chg.store, sync_known(u->sync.engine)))
		save_store(u);
	if (full)
		base_drop(u);
	if (!full || !u->chg.nrejects)
		return;
	if (u->chg.reject_pending) { /* that reconcile started before the reject */
		u->chg.reject_pending = false;
		u->sync.pending_full = true;
		return;
	}
	rejected_clear(u); /* their reconcile is done: the host's versions are in the guest */
	for (size_t i = 0; i < u->chg.nrejects; i++) {
		relay_changes_done(u->exec.relay, u->chg.rejects[i], "rejected",
				   u->chg.reject_bodies[i] ? u->chg.reject_bodies[i] : "{}", NULL, NULL);
		free(u->chg.reject_bodies[i]);
	}
	u->chg.nrejects = 0;
}

/* ---- the relay's changes, accept and reject ---- */

static int op_list(struct up *u, uint64_t token, const struct relay_changes_req *q)
{
	json_t *body = list_json(u, q->paths, q->npaths);
	struct upull *p;
	json_t *arr;
	size_t n = 0;

	if (!body)
		return -ENOMEM;
	if (!q->diff) {
		answer(u, token, "changes", body);
		return 0;
	}
	/* the guest's bytes of the text files, for a diff */
	arr = json_object_get(body, "changes");
	if (!(p = mem_calloc(1, sizeof(*p))) || !(p->paths = mem_calloc(json_array_size(arr) + 1, sizeof(char *)))) {
		mem_free(p);
		json_decref(body);
		return -ENOMEM;
	}
	json_t *kept = json_object();
	for (size_t i = 0; i < json_array_size(arr); i++) {
		const char *path = json_string_value(json_object_get(json_array_get(arr, i), "path"));
		const struct wb_change *c = wb_store_find(u->chg.store, path);
		if (c && c->stash && c->stash[0] && S_ISREG(c->st_mode) && c->size <= SHOW_FILE_MAX) {
			/* the guest holds the host's version now: its own is kept here */
			int fd = openat(u->chg.state_fd, c->stash, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
			char *data = fd >= 0 ? mem_alloc(c->size + 1) : NULL;
			if (data && pread(fd, data, c->size, 0) == (ssize_t)c->size) {
				json_t *o = memchr(data, 0, c->size)
						? NULL
						: json_pack("{s:s%}", "text", data, (size_t)c->size);
				json_object_set_new(kept, path, o ? o : json_pack("{s:b}", "binary", 1));
			}
			mem_free(data);
			if (fd >= 0)
				close(fd);
		} else if (c && S_ISREG(c->st_mode) && c->hashed && (p->paths[n] = mem_strdup(path))) {
			n++;
		}
	}
	json_object_set_new(body, "guest", kept);
	if (!n || !u->conn.chan) {
		mem_free(p->paths);
		mem_free(p);
		answer(u, token, "changes", body);
		return 0;
	}
	p->n = n;
	p->kind = PULL_SHOW;
	p->token = token;
	p->answer = body;
	p->shown = json_incref(json_object_get(body, "guest"));
	int r = pull_start(u, p);
	if (r < 0) {
		p->answer = NULL;
		pull_free(p);
		answer(u, token, "changes", body);
	}
	return 0;
}

/* The changes an accept or reject takes: the named ones (and directories
 * created above them), or all but the protected ones. */
static int pick(struct up *u, const struct relay_changes_req *q, char ***out, size_t *nout, json_t *refused,
		uint64_t *bytes)
{
	size_t cnt = wb_store_count(u->chg.store), n = 0;
	char **v = mem_calloc(cnt + 1, sizeof(*v));

	*out = NULL;
	*nout = 0;
	*bytes = 0;
	if (!v)
		return -ENOMEM;
	for (size_t i = 0; i < cnt; i++) {
		const struct wb_change *c = wb_store_at(u->chg.store, i);
		bool named = !q->all && selected(c->path, q->paths, q->npaths);
		bool parent = false;
		if (!q->all && !named && S_ISDIR(c->st_mode) && !c->had) {
			size_t k = strlen(c->path);
			for (size_t j = 0; j < q->npaths && !parent; j++)
				parent = !strncmp(q->paths[j], c->path, k) && q->paths[j][k] == '/';
		}
		if (!q->all && !named && !parent)
			continue;
		enum protect_why pw = protected_why(u, c);
		if (!strcmp(q->op, "accept") && pw != PROTECT_NONE && (q->all || pw == PROTECT_SPECIAL)) {
			json_array_append_new(
			    refused, json_pack("{s:s, s:s}", "path", c->path, "why",
					       q->all ? "protected: name it to accept it" : protect_why_str(pw)));
			if (q->all || pw == PROTECT_SPECIAL) {
				json_object_set_new(json_array_get(refused, json_array_size(refused) - 1), "protected",
						    json_string(protect_why_str(pw)));
				continue;
			}
		}
		if (!(v[n] = mem_strdup(c->path))) {
			for (size_t j = 0; j < n; j++)
				mem_free(v[j]);
			mem_free(v);
			return -ENOMEM;
		}
		if (S_ISREG(c->st_mode))
			*bytes += c->size;
		n++;
	}
	*out = v;
	*nout = n;
	return 0;
}

/* Accept the conflicts whose guest version is kept on the host: written
 * from those copies, through the same checked write. Not adopted: the
 * guest holds the host's version, so the journal's push then sends it
 * the accepted one. Removes them from paths (*n shrinks). */
static void accept_stashed(struct up *u, char **paths, size_t *n, json_t *body)
{
	struct wb_pull_cfg cfg = {.max_bytes = cap_bytes(u),
				  .cap_name = CAP_NAME,
				  .tmp_dirfd = u->chg.state_fd,
				  .chunking = &chunk_params_default};
	const char **local = mem_calloc(*n + 1, sizeof(char *));
	struct wb_pull *wp = NULL;
	size_t nl = 0, k = 0;
	char err[512] = "";

	if (!local)
		return;
	for (size_t i = 0; i < *n; i++) {
		const struct wb_change *w = wb_store_find(u->chg.store, paths[i]);
		if (w && w->conflict && w->stash)
			local[nl++] = paths[i];
	}
	cfg.paths = local;
	cfg.n = nl;
	bool *done = nl ? mem_calloc(nl, sizeof(bool)) : NULL;
	int r = nl && done ? wb_pull_new(&cfg, &wp) : -ENOMEM;
	for (size_t i = 0; r == 0 && i < nl; i++) {
		const struct wb_change *w = wb_store_find(u->chg.store, local[i]);
		int fd = w->stash[0] ? openat(u->chg.state_fd, w->stash, O_RDONLY | O_NOFOLLOW | O_CLOEXEC) : -1;
		r = wb_pull_local(wp, i, w, fd);
		if (fd >= 0)
			close(fd);
	}
	if (r == 0 && !u->chg.apply) {
		struct apply_opts ao = {.fsync = APPLY_FSYNC_NONE};
		r = apply_open(u->dir, &ao, &u->chg.apply);
	}
	if (r == 0)
		r = wb_pull_write(wp, u->chg.apply, u->chg.sk, u->chg.pk, u->chg.scope, done, err, sizeof(err));
	if (nl)
		(void)syncfs(u->dirfd);
	for (size_t i = 0; i < nl; i++) {
		const char *why = NULL;
		if (done && done[i]) {
			const struct wb_change *w = wb_store_find(u->chg.store, local[i]);
			if (w && w->stash && w->stash[0])
				unlinkat(u->chg.state_fd, w->stash, 0);
			wb_store_remove(u->chg.store, local[i]);
			json_array_append_new(json_object_get(body, "accepted"), json_string(local[i]));
		} else {
			if (wp)
				wb_pull_got(wp, i, &why);
			json_array_append_new(json_object_get(body, "refused"),
					      json_pack("{s:s, s:s}", "path", local[i], "why",
							why	 ? why
							: err[0] ? err
								 : strerror(r < 0 ? -r : EIO)));
		}
	}
	if (nl)
		save_store(u);
	/* the rest goes through the guest */
	for (size_t i = 0; i < *n; i++) {
		bool was_local = false;
		for (size_t j = 0; j < nl && !was_local; j++)
			was_local = local[j] == paths[i];
		if (was_local)
			mem_free(paths[i]);
		else
			paths[k++] = paths[i];
	}
	*n = k;
	wb_pull_free(wp);
	mem_free(done);
	mem_free(local);
}

static int op_accept(struct up *u, uint64_t token, const struct relay_changes_req *q)
{
	json_t *body = json_pack("{s:[]}", "refused");
	struct upull *p;
	char **paths;
	size_t n;
	uint64_t bytes;
	int r;

	if (!body)
		return -ENOMEM;
	if ((r = pick(u, q, &paths, &n, json_object_get(body, "refused"), &bytes)) < 0) {
		json_decref(body);
		return r;
	}
	if (n && bytes > cap_bytes(u)) {
		char msg[300];
		snprintf(msg, sizeof(msg),
			 "%" PRIu64 " bytes of changes is over the write-back cap of %" PRIu64
			 " MiB (%s); nothing was written. Raise the setting or accept fewer paths",
			 bytes, cap_bytes(u) >> 20, CAP_NAME);
		for (size_t i = 0; i < n; i++)
			mem_free(paths[i]);
		mem_free(paths);
		json_decref(body);
		relay_changes_done(u->exec.relay, token, NULL, NULL, "over_cap", msg);
		return 0;
	}
	json_object_set_new(body, "accepted", json_array());
	accept_stashed(u, paths, &n, body);
	if (!n) {
		mem_free(paths);
		answer(u, token, "accepted", body);
		return 0;
	}
	if (!u->conn.chan || u->conn.state != UP_LIVE) {
		for (size_t i = 0; i < n; i++)
			mem_free(paths[i]);
		mem_free(paths);
		json_decref(body);
		relay_changes_done(u->exec.relay, token, NULL, NULL, "guest_disconnected",
				   "the guest is not connected; nothing was written");
		return 0;
	}
	if (!(p = mem_calloc(1, sizeof(*p)))) {
		for (size_t i = 0; i < n; i++)
			mem_free(paths[i]);
		mem_free(paths);
		json_decref(body);
		return -ENOMEM;
	}
	p->kind = PULL_ACCEPT;
	p->paths = paths;
	p->n = n;
	p->token = token;
	p->answer = body;
	if ((r = pull_start(u, p)) < 0) {
		p->answer = NULL;
		pull_free(p);
		json_decref(body);
		return r;
	}
	return 0;
}

static int op_reject(struct up *u, uint64_t token, const struct relay_changes_req *q)
{
	json_t *body = json_pack("{s:[]}", "refused"), *rej = json_array();
	char **paths;
	size_t n;
	uint64_t bytes;
	int r;

	if (!body || !rej || (r = pick(u, q, &paths, &n, json_object_get(body, "refused"), &bytes)) < 0) {
		json_decref(body);
		json_decref(rej);
		return -ENOMEM;
	}
	void *nr = n ? mem_realloc(u->chg.rejected, (u->chg.nrejected + n) * sizeof(char *)) : NULL;
	if (nr)
		u->chg.rejected = nr;
	for (size_t i = 0; i < n; i++) {
		const struct wb_change *w = wb_store_find(u->chg.store, paths[i]);
		if (w && w->stash && w->stash[0])
			unlinkat(u->chg.state_fd, w->stash, 0);
		wb_store_remove(u->chg.store, paths[i]);
		json_array_append_new(rej, json_string(paths[i]));
		if (nr)
			u->chg.rejected[u->chg.nrejected++] = paths[i];
		else
			mem_free(paths[i]);
	}
	mem_free(paths);
	qsort(u->chg.rejected, u->chg.nrejected, sizeof(char *), str_cmp);
	json_object_set_new(body, "rejected", rej);
	save_store(u);
	if (!n || !u->conn.chan) {
		answer(u, token, "rejected", body);
		return 0;
	}
	/* the host's versions go back to the guest with the next reconcile;
	 * answered when it is done */
	void *nv = mem_realloc(u->chg.rejects, (u->chg.nrejects + 1) * sizeof(*u->chg.rejects));
	void *nb = nv ? mem_realloc(u->chg.reject_bodies, (u->chg.nrejects + 1) * sizeof(char *)) : NULL;
	if (nv)
		u->chg.rejects = nv;
	if (!nb) {
		json_decref(body);
		return -ENOMEM;
	}
	u->chg.reject_bodies = nb;
	u->chg.reject_bodies[u->chg.nrejects] = json_dumps(body, JSON_COMPACT);
	u->chg.rejects[u->chg.nrejects++] = token;
	json_decref(body);
	u->chg.reject_pending = u->sync.busy && u->sync.op_full;
	u->sync.pending_full = true;
	up_sync_pump(u);
	return 0;
}

static int chg_request(void *ud, uint64_t token, const struct relay_changes_req *q)
{
	struct up *u = ud;

	up_touch(u);
	if (!u->chg.store)
		return -ENOTSUP;
	if (!strcmp(q->op, "accept"))
		return op_accept(u, token, q);
	if (!strcmp(q->op, "reject"))
		return op_reject(u, token, q);
	return op_list(u, token, q);
}

const struct relay_changes_ops up_changes_ops = {.request = chg_request};

/* down --destroy: what this state directory says about the guest's copy
 * goes with it (the confirmed and sending manifests, the changes waiting
 * with their stashes, the failed paths): a waiting change would keep its
 * path from the next copy, a confirmed manifest would describe a copy no
 * one has. What describes the host's tree (scan state, hash cache) stays.
 * 0, or -errno with err set. */
static int forget_one(int dfd, const char *dir, const char *name, char *err, size_t errlen)
{
	if (unlinkat(dfd, name, 0) == 0 || errno == ENOENT)
		return 0;
	int r = -errno;
	errmsg_set(err, errlen, "%s/%s: %s", dir, name, strerror(-r));
	return r;
}

int up_changes_forget(const char *state_dir, char *err, size_t errlen)
{
	static const char *const names[] = {CONFIRMED_FILE ".meta", CONFIRMED_FILE, SENDING_FILE, WB_STORE_FILE,
					    AUDIT_FAILED_FILE};
	int dfd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW), r = 0;
	DIR *d;
	struct dirent *e;

	if (dfd < 0) {
		r = errno == ENOENT ? 0 : -errno;
		if (r)
			errmsg_set(err, errlen, "%s: %s", state_dir, strerror(-r));
		return r;
	}
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]) && !r; i++)
		r = forget_one(dfd, state_dir, names[i], err, errlen);
	if (!r && (d = fdopendir(dup(dfd)))) {
		while (!r && (e = readdir(d)))
			if (!fnmatch(UP_STASH_FILES, e->d_name, 0))
				r = forget_one(dfd, state_dir, e->d_name, err, errlen);
		closedir(d);
	}
	close(dfd);
	return r;
}
