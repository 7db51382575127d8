/* SPDX-License-Identifier: Apache-2.0 */
/* syncg: guest side of the sync protocol (syncg.h). */
#include "airlock/core/errmsg.h"
#include "airlock/guest/syncg.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/content/delta.h"
#include "airlock/content/hcache.h"
#include "airlock/content/manifest.h"
#include "airlock/content/scanstate.h"
#include "airlock/content/syncmsg.h"
#include "airlock/core/chan.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/guest/track.h"

_Static_assert(WIRE_PATH_MAX == MANIFEST_PATH_MAX, "wire.h path limit is the manifest's");
_Static_assert(WIRE_SYNC_HASH_LEN == CHUNK_HASH_LEN, "wire.h SYNC_STATE digest is a chunk hash");

/* where delta.h's header keeps the batch's u64 sequence number: after
 * magic, version, flags, reserved and the scope */
#define BATCH_SEQ_AT (4 + 1 + 1 + 2 + DELTA_SCOPE_LEN)

struct syncg {
	struct apply *apply;
	char *root;
	char *state_dir;
	int state_fd;
	int seq_fd;	      /* SYNCG_SEQ_FILE kept open for writes in place (not durable), or -1 */
	size_t seq_len;	      /* what it holds, in bytes */
	struct hcache *cache; /* hash cache in state_dir (HCACHE_FILE), per scan */
	uint8_t guest_pub[32];
	bool durable;		     /* fsync the sequence file (any --fsync but none) */
	struct syncg_session *owner; /* session holding the sync lock */
	struct chunk_params params;  /* of the last SYNC_BEGIN */
	/* the ops of the last batch that failed on their own, as the ACK's
	 * failure list (only fail_flags, nfail, fail are used) */
	struct wire_sync_ack fails;
	/* the last BEGIN's scan of this process, valid while the tracker has
	 * seen no event since that scan began (quiet_events) */
	struct track *track;
	bool quiet;
	uint64_t quiet_events, quiet_saturated;
	uint8_t quiet_root[CHUNK_HASH_LEN];
	uint64_t quiet_count;
	struct chunk_params quiet_params;
	uint64_t walks; /* syncg_walks */
	/* the generation of the copy this state describes (SYNC_STATE gen),
	 * kept in SYNCG_SEQ_FILE with the identity of the copy's root */
	uint64_t gen;
	char root_id[80];
};

struct syncg_session {
	struct syncg *g;
	struct chan *chan;
	uint32_t stream; /* the host's sync stream, fixed by the first frame */
	uint8_t host_pk[32];
	struct syncmsg_inbox in;
	struct syncmsg_outbox out;
	struct manifest *m; /* the guest tree as of SYNC_BEGIN */
	/* ... or, when the copy was proven unchanged, the state that holds
	 * it, decoded into m only when the host asks for levels or entries */
	struct scanstate *state;
	bool lazy; /* neither: answered from the quiet scan; made on demand */
	struct chunk_params params;
};

/* "SEQ GEN ROOT-ID": the last applied batch, the copy's generation and
 * its root's identity (device, inode, birth time) when the state was
 * written; a file of only "SEQ" (before generations) has no generation. */
static int load_seq(struct syncg *g, uint64_t *seq, char *err, size_t errlen)
{
	char text[160];
	int fd = openat(g->state_fd, SYNCG_SEQ_FILE, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);

	*seq = 0;
	if (fd < 0) {
		if (errno == ENOENT)
			return 0;
		int r = -errno;
		errmsg_set(err, errlen, "%s/%s: %s", g->state_dir, SYNCG_SEQ_FILE, strerror(-r));
		return r;
	}
	ssize_t n = read(fd, text, sizeof(text) - 1);
	close(fd);
	if (n <= 0) {
		errmsg_set(err, errlen,
			   "%s/%s: empty or unreadable; remove it only if the workspace copy is discarded too",
			   g->state_dir, SYNCG_SEQ_FILE);
		return -EINVAL;
	}
	text[n] = '\0';
	char *end;
	errno = 0;
	unsigned long long v = strtoull(text, &end, 10);
	int used = 0;
	bool bad = errno || end == text;
	if (!bad && *end == ' ' && sscanf(end, " %16" SCNx64 " %79s%n", &g->gen, g->root_id, &used) == 2 && g->gen)
		end += used;
	else
		g->gen = 0;
	if (bad || (*end && strcmp(end, "\n"))) {
		errmsg_set(err, errlen, "%s/%s: not a sequence number", g->state_dir, SYNCG_SEQ_FILE);
		return -EINVAL;
	}
	*seq = v;
	return 0;
}

/* Write the sequence to a temporary name, fsync, rename over the old one.
 * With --fsync none the user chose speed over durability for the whole
 * workspace copy, and the sequence follows it: after a crash it may lag
 * the files. The host reconciles by content from the STATE it reads, so it
 * never resends old batches; a stale sequence only narrows replay
 * protection against a party that would first have to break the
 * channel. The two fsyncs were most of a live push's latency; without
 * them the file is rewritten in place (one pwrite on a descriptor kept
 * open): a rename over it would make ext4 start its writeback
 * (auto_da_alloc), 0.3-0.7 ms of every batch's answer. The number only
 * grows, and a few bytes at offset 0 are never torn. */
static int save_seq_in_place(struct syncg *g, const char *text, size_t n)
{
	if (g->seq_fd < 0 &&
	    (g->seq_fd = openat(g->state_fd, SYNCG_SEQ_FILE, O_WRONLY | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return -errno;
	ssize_t k = pwrite(g->seq_fd, text, n, 0);
	if (k != (ssize_t)n)
		return k < 0 ? -errno : -EIO;
	if (n != g->seq_len && ftruncate(g->seq_fd, (off_t)n) < 0)
		return -errno;
	g->seq_len = n;
	return 0;
}

static int save_seq(struct syncg *g, uint64_t seq)
{
	char text[160], tmp[64];
	int n = snprintf(text, sizeof(text), "%" PRIu64 " %016" PRIx64 " %s\n", seq, g->gen, g->root_id), r = 0;

	if (!g->durable)
		return save_seq_in_place(g, text, (size_t)n);
	snprintf(tmp, sizeof(tmp), "%s.tmp", SYNCG_SEQ_FILE);
	int fd = openat(g->state_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, text, (size_t)n) != n || fsync(fd) < 0)
		r = -errno ? -errno : -EIO;
	close(fd);
	if (r == 0 && renameat(g->state_fd, tmp, g->state_fd, SYNCG_SEQ_FILE) < 0)
		r = -errno;
	if (r == 0)
		fsync(g->state_fd);
	else
		unlinkat(g->state_fd, tmp, 0);
	return r;
}

/* A state without a generation (fresh, or from before them), or one
 * written for another copy (the root was replaced: removed and made
 * again), describes no copy that is here: a new random generation, so
 * the host trusts nothing it saved about the old one (doc/SYNC.md
 * "Generations"). Persisted at once; if that fails the next start makes
 * yet another, which only costs the host's saved state again. */
static void new_generation(struct syncg *g, uint64_t seq)
{
	char id[sizeof(g->root_id)];
	struct statx sx;

	if (statx(apply_rootfd(g->apply), "", AT_EMPTY_PATH | AT_SYMLINK_NOFOLLOW, STATX_INO | STATX_BTIME, &sx) < 0)
		memset(&sx, 0, sizeof(sx)); /* unknown: a new generation at every start */
	snprintf(id, sizeof(id), "%x:%x:%" PRIx64 ":%" PRId64 ".%09u", sx.stx_dev_major, sx.stx_dev_minor,
		 (uint64_t)sx.stx_ino, (sx.stx_mask & STATX_BTIME) ? (int64_t)sx.stx_btime.tv_sec : 0,
		 (sx.stx_mask & STATX_BTIME) ? sx.stx_btime.tv_nsec : 0);
	if (g->gen && sx.stx_ino && !strcmp(id, g->root_id))
		return;
	snprintf(g->root_id, sizeof(g->root_id), "%s", id);
	do
		randombytes_buf(&g->gen, sizeof(g->gen));
	while (!g->gen);
	(void)save_seq(g, seq);
}

int syncg_open(const char *root, const char *state_dir, const struct apply_opts *opts, const uint8_t guest_pub[32],
	       struct syncg **out, char *err, size_t errlen)
{
	struct syncg *g;
	char rroot[PATH_MAX], rstate[PATH_MAX];
	uint64_t seq;
	int r;

	*out = NULL;
	if (!(g = mem_calloc(1, sizeof(*g))))
		return -ENOMEM;
	g->state_fd = g->seq_fd = -1;
	memcpy(g->guest_pub, guest_pub, 32);
	g->params = chunk_params_default;
	if (!realpath(root, rroot)) {
		r = -errno;
		errmsg_set(err, errlen, "--root %s: %s", root, strerror(-r));
		goto fail;
	}
	if (state_dir) {
		g->state_dir = mem_strdup(state_dir);
	} else if ((g->state_dir = mem_alloc(strlen(rroot) + sizeof(SYNCG_STATE_SUFFIX)))) {
		strcpy(g->state_dir, rroot);
		strcat(g->state_dir, SYNCG_STATE_SUFFIX);
	}
	if (!(g->root = mem_strdup(rroot)) || !g->state_dir) {
		r = -ENOMEM;
		goto fail;
	}
	if (mkdir(g->state_dir, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		errmsg_set(err, errlen, "--state %s: %s (give a writable directory outside the root)", g->state_dir,
			   strerror(-r));
		goto fail;
	}
	if (!realpath(g->state_dir, rstate)) {
		r = -errno;
		errmsg_set(err, errlen, "--state %s: %s", g->state_dir, strerror(-r));
		goto fail;
	}
	size_t rl = strlen(rroot);
	if (!strcmp(rstate, rroot) || (!strncmp(rstate, rroot, rl) && (rstate[rl] == '/' || rl == 1))) {
		errmsg_set(err, errlen,
			   "--state %s is inside --root %s: the host would see it as a guest file; put it outside",
			   g->state_dir, rroot);
		r = -EINVAL;
		goto fail;
	}
	if ((g->state_fd = open(rstate, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "--state %s: %s", g->state_dir, strerror(-r));
		goto fail;
	}
	if ((r = load_seq(g, &seq, err, errlen)) < 0)
		goto fail;
	g->durable = !opts || opts->fsync != APPLY_FSYNC_NONE;
	if ((r = apply_open(rroot, opts, &g->apply)) < 0) {
		errmsg_set(err, errlen, "--root %s: %s", rroot, strerror(-r));
		goto fail;
	}
	apply_set_last_seq(g->apply, seq);
	new_generation(g, seq);
	*out = g;
	return 0;
fail:
	syncg_free(g);
	return r;
}

void syncg_free(struct syncg *g)
{
	if (!g)
		return;
	apply_free(g->apply);
	wire_sync_ack_clear(&g->fails);
	hcache_free(g->cache);
	if (g->state_fd >= 0)
		close(g->state_fd);
	if (g->seq_fd >= 0)
		close(g->seq_fd);
	mem_free(g->root);
	mem_free(g->state_dir);
	mem_free(g);
}

uint64_t syncg_last_seq(const struct syncg *g)
{
	return apply_last_seq(g->apply);
}
uint64_t syncg_generation(const struct syncg *g)
{
	return g->gen;
}
const char *syncg_state_dir(const struct syncg *g)
{
	return g->state_dir;
}
uint64_t syncg_walks(const struct syncg *g)
{
	return g->walks;
}

void syncg_set_track(struct syncg *g, struct track *t)
{
	g->track = t;
	g->quiet = false;
}

const struct chunk_params *syncg_params(const struct syncg *g)
{
	return &g->params;
}

/* The batch's ops that failed on their own into g->fails, with their
 * paths (the batch is freed next). Without memory for a path the entry is
 * left out and MORE set: the host then reconciles. */
static void keep_failures(struct syncg *g, const struct delta_batch *b)
{
	uint64_t total;
	size_t n;
	const struct apply_failure *f = apply_failures(g->apply, &n, &total);

	if (total == 0)
		return;
	_Static_assert(APPLY_FAIL_MAX <= WIRE_SYNC_FAIL_MAX, "every kept failure fits the ACK");
	_Static_assert(APPLY_FAIL_MSG_MAX <= WIRE_SYNC_FAIL_MSG_MAX, "and its message");
	g->fails.fail_flags = total > n ? WIRE_SYNC_FAIL_F_MORE : 0;
	if (n && !(g->fails.fail = mem_calloc(n, sizeof(*g->fails.fail)))) {
		g->fails.fail_flags = WIRE_SYNC_FAIL_F_MORE;
		return;
	}
	for (size_t i = 0; i < n; i++) {
		struct wire_sync_fail *w = &g->fails.fail[g->fails.nfail];
		w->op = f[i].op;
		w->code = f[i].err > 0 && f[i].err < 4096 ? (uint32_t)f[i].err : EIO;
		w->path = mem_strdup(delta_batch_op(b, f[i].op)->path);
		w->msg = mem_strdup(f[i].msg);
		if (!w->path || !w->msg) {
			mem_free(w->path);
			mem_free(w->msg);
			w->path = w->msg = NULL;
			g->fails.fail_flags = WIRE_SYNC_FAIL_F_MORE;
			continue;
		}
		g->fails.nfail++;
	}
}

int syncg_apply_batch(struct syncg *g, const uint8_t *bytes, size_t n, const uint8_t host_sign_pk[32],
		      struct apply_stats *st, char *err, size_t errlen)
{
	uint8_t scope[DELTA_SCOPE_LEN];
	struct delta_batch *b = NULL;
	char verr[512];
	int r;

	if (st)
		memset(st, 0, sizeof(*st));
	syncmsg_scope(g->guest_pub, host_sign_pk, scope);
	/* Content is checked once, while apply_batch stages it (every chunk and
	 * file hash, before anything becomes visible): doc/SYNC.md §4. */
	r = delta_batch_verify_deferred(bytes, n, host_sign_pk, scope, apply_last_seq(g->apply), &syncmsg_delta_caps,
					&b, verr, sizeof(verr));
	if (r < 0) {
		errmsg_set(err, errlen, "batch refused: %s", verr[0] ? verr : strerror(-r));
		return r;
	}
	wire_sync_ack_clear(&g->fails);
	if ((r = apply_batch(g->apply, b, st)) < 0) {
		errmsg_set(err, errlen, "batch %" PRIu64 " failed to apply: %s", delta_batch_seq(b),
			   apply_error(g->apply));
		delta_batch_free(b);
		return r;
	}
	uint64_t seq = delta_batch_seq(b);
	if (g->track && track_applied_read(g->track)) /* ours, not a guest change */
		for (size_t i = 0; i < delta_batch_count(b); i++)
			if (delta_batch_op(b, i)->type != DELTA_DELETE)
				track_applied_path(g->track, apply_rootfd(g->apply), delta_batch_op(b, i)->path);
	keep_failures(g, b);
	delta_batch_free(b);
	if ((r = save_seq(g, seq)) < 0) {
		errmsg_set(err, errlen, "batch %" PRIu64 " applied, but %s/%s could not be written: %s", seq,
			   g->state_dir, SYNCG_SEQ_FILE, strerror(-r));
		if (st)
			st->partial = true;
		return r;
	}
	return 0;
}

/* ---- session ---- */

int syncg_session_new(struct syncg *g, struct chan *c, const uint8_t host_sign_pk[32], struct syncg_session **out)
{
	struct syncg_session *ss = mem_calloc(1, sizeof(*ss));

	*out = NULL;
	if (!ss)
		return -ENOMEM;
	ss->g = g;
	ss->chan = c;
	memcpy(ss->host_pk, host_sign_pk, 32);
	syncmsg_inbox_init(&ss->in);
	syncmsg_outbox_init(&ss->out);
	*out = ss;
	return 0;
}

void syncg_session_free(struct syncg_session *ss)
{
	if (!ss)
		return;
	if (ss->g->owner == ss)
		ss->g->owner = NULL;
	syncmsg_inbox_clear(&ss->in);
	syncmsg_outbox_clear(&ss->out);
	manifest_free(ss->m);
	scanstate_free(ss->state);
	mem_free(ss);
}

int syncg_session_writable(struct syncg_session *ss)
{
	return ss->stream ? syncmsg_outbox_flush(&ss->out, ss->chan, ss->stream) : 0;
}

static int reply(struct syncg_session *ss, uint8_t type, const struct buf *b)
{
	int r;

	if (ss->out.queued > SYNCG_OUT_MAX)
		return -ENOBUFS;
	if ((r = syncmsg_outbox_push_buf(&ss->out, type, b)) < 0)
		return r;
	return syncmsg_outbox_flush(&ss->out, ss->chan, ss->stream);
}

typedef int msg_fn(struct syncg_session *ss, struct buf *in, char *err, size_t errlen);

/* ---- the persisted last scan (scanstate.h, doc/SYNC.md "Unchanged trees") ----
 *
 * The copy changes through our applies, through commands, and through
 * anything else while no agent runs (a crash, a restart, someone editing
 * the copy): so every BEGIN proves it unchanged with a stat walk against
 * the last full scan, or scans it fully. The key is not a secret (the
 * guest checks only itself: whatever it claims affects its own copy, the
 * host trusts none of it), so the MAC is a checksum here. */

static void state_keys(const struct syncg *g, const struct chunk_params *p, uint8_t key[SCANSTATE_KEY_LEN],
		       uint8_t fp[SCANSTATE_FP_LEN])
{
	static const char label[] = "airlock guest scan-state v1";
	uint8_t pb[16];

	crypto_generichash(key, SCANSTATE_KEY_LEN, (const uint8_t *)label, sizeof(label), g->guest_pub, 32);
	buf_store_be32(pb, p->min);
	buf_store_be32(pb + 4, p->avg);
	buf_store_be32(pb + 8, p->max);
	buf_store_be32(pb + 12, p->whole_max);
	crypto_generichash(fp, SCANSTATE_FP_LEN, pb, sizeof(pb), key, SCANSTATE_KEY_LEN);
}

/* 1 with ss->state when the copy is proven unchanged (its manifest is
 * decoded when the host asks for more than the root), 0 when it must be
 * scanned, -ENOMEM. */
static int state_scan(struct syncg *g, struct syncg_session *ss)
{
	uint8_t key[SCANSTATE_KEY_LEN], fp[SCANSTATE_FP_LEN];
	struct scanstate *st;
	int r;

	state_keys(g, &ss->params, key, fp);
	if ((r = scanstate_load(g->state_fd, SCANSTATE_FILE, key, fp, 0, &st)) < 0)
		return r == -ENOMEM ? r : 0;
	if ((r = scanstate_verify(st, apply_rootfd(g->apply), 0, NULL)) == 1) {
		ss->state = st;
		return 1;
	}
	scanstate_free(st);
	return r == -ENOMEM ? r : 0;
}

static void scan_skipped(const char *relpath, enum manifest_skip why, int err, void *ud)
{
	(void)relpath;
	(void)err;
	if (why == MANIFEST_SKIP_ERROR || why == MANIFEST_SKIP_CHANGED)
		scanstate_distrust(ud); /* need not repeat: no state from this scan */
}

/* ss->state proven unchanged, else ss->m scanned fully (and persisted). */
static int full_scan(struct syncg *g, struct syncg_session *ss);
static int scan_copy(struct syncg *g, struct syncg_session *ss, char *err, size_t errlen)
{
	int r;

	g->walks++;
	if ((r = state_scan(g, ss)) == 0 && (r = full_scan(g, ss)) < 0) {
		errmsg_set(err, errlen, "scanning %s: %s", g->root, strerror(-r));
		return r;
	}
	if (r < 0)
		errmsg_set(err, errlen, "the scan state in %s: %s", g->state_dir, strerror(-r));
	return r < 0 ? r : 0;
}

/* Scan the whole copy into ss->m and persist it. */
static int full_scan(struct syncg *g, struct syncg_session *ss)
{
	uint8_t key[SCANSTATE_KEY_LEN], fp[SCANSTATE_FP_LEN];
	struct scanstate *st = NULL;
	int r;

	/* Everything under the root: which paths the host manages is the
	 * host's policy, applied on its side while it reads our levels. */
	struct manifest_scan_opts o = {.chunking = &ss->params};
	/* Stat-keyed hash cache: files untouched since they were last hashed
	 * are not read (hcache.h); a command that changed one changed its
	 * ctime. Without memory for it, scan without. */
	hcache_free(g->cache);
	g->cache = NULL;
	if (hcache_new(&ss->params, &g->cache) == 0 && hcache_load(g->cache, g->state_fd, HCACHE_FILE) != -ENOMEM)
		o.cache = g->cache;
	if (scanstate_new(&st) == 0) {
		scanstate_begin(st, apply_rootfd(g->apply));
		(void)scanstate_spill(st, g->state_fd); /* else held until the save */
		o.seen = scanstate_seen;
		o.seen_ud = st;
		o.skipped = scan_skipped;
		o.skipped_ud = st;
	}
	if ((r = apply_manifest(g->apply, &o, &ss->m)) == 0) {
		if (o.cache) {
			(void)hcache_save(g->cache, g->state_fd, HCACHE_FILE); /* best effort */
			hcache_trim(g->cache);				       /* loaded again before the next scan */
		}
		state_keys(g, &ss->params, key, fp);
		if (st)
			(void)scanstate_save(st, g->state_fd, SCANSTATE_FILE, ss->m, key, fp, NULL, 0);
	}
	scanstate_free(st);
	return r;
}

static int on_begin(struct syncg_session *ss, struct buf *in, char *err, size_t errlen)
{
	struct syncg *g = ss->g;
	struct wire_sync_begin m = {0};
	struct chunk_params p;
	struct buf out;
	int r;

	if (g->owner && g->owner != ss) {
		errmsg_set(err, errlen, "another session is syncing this workspace");
		return -EBUSY;
	}
	r = wire_sync_begin_decode(in, &m);
	p = (struct chunk_params){.min = m.min, .avg = m.avg, .max = m.max, .whole_max = m.whole_max};
	if (r < 0 || chunk_params_check(&p) < 0) {
		errmsg_set(err, errlen, "SYNC_BEGIN with malformed chunk parameters");
		return -EBADMSG;
	}
	g->owner = ss;
	ss->params = p;
	g->params = p;
	manifest_free(ss->m);
	ss->m = NULL;
	scanstate_free(ss->state);
	ss->state = NULL;
	ss->lazy = false;
	struct track_stats ts = {0};
	if (g->track)
		track_get_stats(g->track, &ts);
	if (g->quiet && g->track && !ts.saturated_now && ts.events == g->quiet_events &&
	    ts.saturated == g->quiet_saturated && !memcmp(&g->quiet_params, &p, sizeof(p))) {
		ss->lazy = true; /* nothing happened in the copy since the last scan began */
	} else if ((r = scan_copy(g, ss, err, errlen)) < 0) {
		return r;
	} else {
		g->quiet = g->track && !ts.saturated_now; /* a saturated one may miss a change */
		g->quiet_events = ts.events;
		g->quiet_saturated = ts.saturated;
		g->quiet_count = ss->m ? ss->m->n : scanstate_manifest_count(ss->state);
		memcpy(g->quiet_root, ss->m ? ss->m->root : scanstate_root(ss->state), CHUNK_HASH_LEN);
		g->quiet_params = p;
	}
	struct wire_sync_state st = {.seq = apply_last_seq(g->apply), .entries = g->quiet_count, .gen = g->gen};
	memcpy(st.root, g->quiet_root, CHUNK_HASH_LEN);
	buf_init(&out, 64);
	if ((r = wire_sync_state_encode(&out, &st)) < 0 || (r = reply(ss, WIRE_SYNC_STATE, &out)) < 0)
		errmsg_set(err, errlen, "answering SYNC_BEGIN: %s", strerror(-r));
	buf_clear(&out);
	return r;
}

/* SYNC_LEVELS_REQ and SYNC_ENTRIES_REQ: the whole request is decoded
 * (every limit checked) before the first answer is made. */
static int decode_req(struct syncg_session *ss, uint8_t type, struct buf *in, struct wire_sync_req *q, char *err,
		      size_t errlen)
{
	if ((!ss->m && !ss->state && !ss->lazy) || ss->g->owner != ss) {
		errmsg_set(err, errlen, "%s before SYNC_BEGIN", wire_type_name(type));
		return -EPROTO;
	}
	int r;
	if (!ss->m && ss->lazy && (r = scan_copy(ss->g, ss, err, errlen)) < 0)
		return r; /* (a copy changed since is for the host's recon to notice: -ESTALE there) */
	ss->lazy = false;
	if (!ss->m && (r = scanstate_manifest(ss->state, &ss->m)) < 0) {
		errmsg_set(err, errlen, "%s: the saved scan does not decode: %s", wire_type_name(type), strerror(-r));
		return r;
	}
	if (wire_sync_req_decode(in, q) < 0) {
		errmsg_set(err, errlen, "%s: bad count or malformed path", wire_type_name(type));
		return -EBADMSG;
	}
	return 0;
}

/* One SYNC_LEVEL: the directory's level (manifest_level_encode). */
static int answer_level(struct syncg_session *ss, const char *dir, struct buf *lvl, struct buf *out, char *err,
			size_t errlen)
{
	int r;

	buf_reset(lvl);
	buf_reset(out);
	if ((r = manifest_level_encode(ss->m, dir, lvl)) < 0) {
		errmsg_set(err, errlen, "SYNC_LEVELS_REQ: '%s' is not a directory here: %s", dir, strerror(-r));
		return r;
	}
	struct wire_sync_level m = {.dir = (char *)dir, .level = buf_ptr(lvl), .level_len = buf_len(lvl)};
	if ((r = wire_sync_level_encode(out, &m)) < 0 || (r = reply(ss, WIRE_SYNC_LEVEL, out)) < 0)
		errmsg_set(err, errlen, "sending a level: %s", strerror(-r));
	return r;
}

/* One SYNC_ENTRY: the path's manifest entry when the scan has it. */
static int answer_entry(struct syncg_session *ss, const char *path, struct buf *ent, struct buf *out, char *err,
			size_t errlen)
{
	long idx = manifest_find(ss->m, path);
	int r = 0;

	buf_reset(ent);
	buf_reset(out);
	if (idx >= 0)
		r = manifest_entry_encode(&ss->m->e[idx], ent);
	struct wire_sync_entry m = {
	    .path = (char *)path, .found = idx >= 0, .entry = buf_ptr(ent), .entry_len = buf_len(ent)};
	if (r < 0 || (r = wire_sync_entry_encode(out, &m)) < 0 || (r = reply(ss, WIRE_SYNC_ENTRY, out)) < 0)
		errmsg_set(err, errlen, "answering SYNC_ENTRIES_REQ: %s", strerror(-r));
	return r;
}

typedef int answer_fn(struct syncg_session *ss, const char *name, struct buf *scratch, struct buf *out, char *err,
		      size_t errlen);

/* A request of names: decode it whole, then answer each name in order. */
static int answer_req(struct syncg_session *ss, uint8_t type, answer_fn *answer, struct buf *in, char *err,
		      size_t errlen)
{
	struct wire_sync_req q;
	struct buf scratch, out;
	int r;

	if ((r = decode_req(ss, type, in, &q, err, errlen)) < 0)
		return r;
	buf_init(&scratch, WIRE_SYNC_MSG_MAX);
	buf_init(&out, WIRE_SYNC_MSG_MAX);
	for (uint32_t i = 0; i < q.n && r == 0; i++)
		r = answer(ss, q.names[i], &scratch, &out, err, errlen);
	buf_clear(&scratch);
	buf_clear(&out);
	wire_sync_req_clear(&q);
	return r;
}

static int on_levels_req(struct syncg_session *ss, struct buf *in, char *err, size_t errlen)
{
	return answer_req(ss, WIRE_SYNC_LEVELS_REQ, answer_level, in, err, errlen);
}

static int on_entries_req(struct syncg_session *ss, struct buf *in, char *err, size_t errlen)
{
	return answer_req(ss, WIRE_SYNC_ENTRIES_REQ, answer_entry, in, err, errlen);
}

static int on_batch(struct syncg_session *ss, struct buf *in, char *err, size_t errlen)
{
	struct syncg *g = ss->g;
	struct apply_stats st;
	char why[1024];
	struct buf out;
	int r, ar;

	if (g->owner != ss) {
		errmsg_set(err, errlen, "SYNC_BATCH before SYNC_BEGIN");
		return -EPROTO;
	}
	/* The tree changes: a later level request needs a new BEGIN. */
	manifest_free(ss->m);
	ss->m = NULL;
	scanstate_free(ss->state);
	ss->state = NULL;
	ss->lazy = false;
	g->quiet = false; /* the copy changes (the tracker sees it too) */
	ar = syncg_apply_batch(g, buf_ptr(in), buf_len(in), ss->host_pk, &st, why, sizeof(why));
	buf_init(&out, 8192);
	uint64_t seq = 0;
	/* header: magic..scope, then u64 seq (for the reply only; unverified if refused) */
	if (buf_len(in) >= BATCH_SEQ_AT + 8)
		seq = buf_load_be64(buf_ptr(in) + BATCH_SEQ_AT);
	if (ar == 0) {
		struct wire_sync_ack m = {.seq = seq,
					  .ops = st.ops,
					  .files = st.files,
					  .bytes = st.bytes,
					  .deleted = st.deleted,
					  .kept_dirs = st.kept_dirs,
					  .fail_flags = g->fails.fail_flags,
					  .nfail = g->fails.nfail,
					  .fail = g->fails.fail};
		if ((r = wire_sync_ack_encode(&out, &m)) == 0)
			r = reply(ss, WIRE_SYNC_ACK, &out);
		if (r == 0 && st.failed)
			errmsg_set(err, errlen,
				   "batch %" PRIu64 ": %" PRIu64 " ops failed, reported to the host; first: %s: %s",
				   seq, st.failed, m.nfail ? m.fail[0].path : "?", m.nfail ? m.fail[0].msg : "?");
	} else {
		struct wire_sync_nack m = {.seq = seq, .code = (uint32_t)-ar, .partial = st.partial, .msg = why};
		if ((r = wire_sync_nack_encode(&out, &m)) == 0)
			r = reply(ss, WIRE_SYNC_NACK, &out);
	}
	buf_clear(&out);
	if (r < 0)
		errmsg_set(err, errlen, "answering SYNC_BATCH: %s", strerror(-r));
	else if (ar < 0)
		errmsg_set(err, errlen, "%s", why); /* logged by the caller; the session goes on */
	return r;
}

/* The host's sync messages; names for logs are wire_type_name's. */
static const struct {
	msg_fn *fn;
} guest_msgs[WIRE_TYPE_MAX + 1] = {
    [WIRE_SYNC_BEGIN] = {on_begin},
    [WIRE_SYNC_LEVELS_REQ] = {on_levels_req},
    [WIRE_SYNC_ENTRIES_REQ] = {on_entries_req},
    [WIRE_SYNC_BATCH] = {on_batch},
};

int syncg_session_frame(struct syncg_session *ss, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, char *err,
			size_t errlen)
{
	int r;

	if (errlen)
		err[0] = '\0';
	if (!guest_msgs[type].fn) {
		errmsg_set(err, errlen, "%s is not a host-to-guest sync message", wire_type_name(type));
		return -EPROTO;
	}
	/* Host-opened streams are odd; the first sync frame fixes the stream. */
	if (!ss->stream) {
		if (stream == WIRE_STREAM_CONTROL || !(stream & 1)) {
			errmsg_set(err, errlen, "sync frames must use a host-opened stream, not %u", stream);
			return -EPROTO;
		}
		ss->stream = stream;
	} else if (stream != ss->stream) {
		errmsg_set(err, errlen, "sync frame on stream %u, the session syncs on %u", stream, ss->stream);
		return -EPROTO;
	}
	if ((r = syncmsg_inbox_add(&ss->in, type, p, n)) <= 0) {
		if (r < 0)
			errmsg_set(err, errlen, "%s: %s", wire_type_name(type),
				   r == -EMSGSIZE ? "message over the size limit" : "malformed fragment");
		return r;
	}
	struct buf in;
	buf_view(&in, buf_ptr(&ss->in.b), buf_len(&ss->in.b));
	r = guest_msgs[type].fn(ss, &in, err, errlen);
	syncmsg_inbox_done(&ss->in);
	return r;
}
