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
#include "airlock/content/syncmsg.h"
#include "airlock/core/chan.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"

struct syncg {
	struct apply *apply;
	char *root;
	char *state_dir;
	int state_fd;
	struct hcache *cache; /* hash cache in state_dir (HCACHE_FILE), per scan */
	uint8_t guest_pub[32];
	bool durable;		     /* fsync the sequence file (any --fsync but none) */
	struct syncg_session *owner; /* session holding the sync lock */
};

struct syncg_session {
	struct syncg *g;
	struct chan *chan;
	uint32_t stream; /* the host's sync stream, fixed by the first frame */
	uint8_t host_pk[32];
	struct syncmsg_inbox in;
	struct syncmsg_outbox out;
	struct manifest *m; /* the guest tree as of SYNC_BEGIN */
	struct chunk_params params;
};

static int load_seq(struct syncg *g, uint64_t *seq, char *err, size_t errlen)
{
	char text[32];
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
	if (errno || end == text || (*end && *end != '\n')) {
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
 * channel. The two fsyncs were most of a live push's latency. */
static int save_seq(struct syncg *g, uint64_t seq)
{
	char text[32], tmp[64];
	int n = snprintf(text, sizeof(text), "%" PRIu64 "\n", seq), r = 0;

	snprintf(tmp, sizeof(tmp), "%s.tmp", SYNCG_SEQ_FILE);
	int fd = openat(g->state_fd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	if (write(fd, text, (size_t)n) != n || (g->durable && fsync(fd) < 0))
		r = -errno ? -errno : -EIO;
	close(fd);
	if (r == 0 && renameat(g->state_fd, tmp, g->state_fd, SYNCG_SEQ_FILE) < 0)
		r = -errno;
	if (r == 0 && g->durable)
		fsync(g->state_fd);
	else
		unlinkat(g->state_fd, tmp, 0);
	return r;
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
	g->state_fd = -1;
	memcpy(g->guest_pub, guest_pub, 32);
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
	hcache_free(g->cache);
	if (g->state_fd >= 0)
		close(g->state_fd);
	mem_free(g->root);
	mem_free(g->state_dir);
	mem_free(g);
}

uint64_t syncg_last_seq(const struct syncg *g)
{
	return apply_last_seq(g->apply);
}
const char *syncg_state_dir(const struct syncg *g)
{
	return g->state_dir;
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
	if ((r = apply_batch(g->apply, b, st)) < 0) {
		errmsg_set(err, errlen, "batch %" PRIu64 " failed to apply: %s", delta_batch_seq(b),
			   apply_error(g->apply));
		delta_batch_free(b);
		return r;
	}
	uint64_t seq = delta_batch_seq(b);
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

static int on_begin(struct syncg_session *ss, struct buf *in, char *err, size_t errlen)
{
	struct syncg *g = ss->g;
	struct chunk_params p;
	struct buf out;
	uint32_t special = 0;
	int r;

	if (g->owner && g->owner != ss) {
		errmsg_set(err, errlen, "another session is syncing this workspace");
		return -EBUSY;
	}
	if ((r = buf_get_u32(in, &p.min)) < 0 || (r = buf_get_u32(in, &p.avg)) < 0 ||
	    (r = buf_get_u32(in, &p.max)) < 0 || (r = buf_get_u32(in, &p.whole_max)) < 0 || buf_len(in) != 0 ||
	    chunk_params_check(&p) < 0) {
		errmsg_set(err, errlen, "SYNC_BEGIN with malformed chunk parameters");
		return -EBADMSG;
	}
	g->owner = ss;
	ss->params = p;
	manifest_free(ss->m);
	ss->m = NULL;
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
	if ((r = apply_manifest(g->apply, &o, &ss->m)) < 0) {
		errmsg_set(err, errlen, "scanning %s: %s", g->root, strerror(-r));
		return r;
	}
	if (o.cache)
		(void)hcache_save(g->cache, g->state_fd, HCACHE_FILE); /* best effort */
	buf_init(&out, 64);
	if ((r = buf_put_u64(&out, apply_last_seq(g->apply))) < 0 ||
	    (r = buf_put(&out, ss->m->root, CHUNK_HASH_LEN)) < 0 || (r = buf_put_u64(&out, ss->m->n)) < 0 ||
	    (r = buf_put_u32(&out, special)) < 0 || (r = reply(ss, WIRE_SYNC_STATE, &out)) < 0)
		errmsg_set(err, errlen, "answering SYNC_BEGIN: %s", strerror(-r));
	buf_clear(&out);
	return r;
}

static int on_levels_req(struct syncg_session *ss, struct buf *in, char *err, size_t errlen)
{
	uint32_t n;
	struct buf out;
	int r;

	if (!ss->m || ss->g->owner != ss) {
		errmsg_set(err, errlen, "SYNC_LEVELS_REQ before SYNC_BEGIN");
		return -EPROTO;
	}
	if ((r = buf_get_u32(in, &n)) < 0 || n > WIRE_SYNC_REQ_MAX || n > buf_len(in) / 4) {
		errmsg_set(err, errlen, "SYNC_LEVELS_REQ: bad count");
		return -EBADMSG;
	}
	buf_init(&out, WIRE_SYNC_MSG_MAX);
	for (uint32_t i = 0; i < n; i++) {
		const uint8_t *d;
		size_t dl;
		char dir[MANIFEST_PATH_MAX + 1];
		if ((r = buf_get_bytes(in, &d, &dl, MANIFEST_PATH_MAX)) < 0 || memchr(d, '\0', dl)) {
			errmsg_set(err, errlen, "SYNC_LEVELS_REQ: malformed path %u", i);
			r = -EBADMSG;
			goto out;
		}
		memcpy(dir, d, dl);
		dir[dl] = '\0';
		buf_reset(&out);
		if ((r = buf_put_str(&out, dir)) < 0)
			goto out;
		/* level body, length-prefixed */
		size_t at = buf_len(&out);
		if ((r = buf_put_u32(&out, 0)) < 0)
			goto out;
		if ((r = manifest_level_encode(ss->m, dir, &out)) < 0) {
			errmsg_set(err, errlen, "SYNC_LEVELS_REQ: '%s' is not a directory here: %s", dir, strerror(-r));
			goto out;
		}
		size_t ll = buf_len(&out) - at - 4;
		uint8_t *p = out.data + out.off + at;
		p[0] = (uint8_t)(ll >> 24);
		p[1] = (uint8_t)(ll >> 16);
		p[2] = (uint8_t)(ll >> 8);
		p[3] = (uint8_t)ll;
		if ((r = reply(ss, WIRE_SYNC_LEVEL, &out)) < 0) {
			errmsg_set(err, errlen, "sending a level: %s", strerror(-r));
			goto out;
		}
	}
	if (buf_len(in) != 0) {
		errmsg_set(err, errlen, "SYNC_LEVELS_REQ: trailing bytes");
		r = -EBADMSG;
	}
out:
	buf_clear(&out);
	return r;
}

static int on_entries_req(struct syncg_session *ss, struct buf *in, char *err, size_t errlen)
{
	uint32_t n;
	struct buf out;
	int r;

	if (!ss->m || ss->g->owner != ss) {
		errmsg_set(err, errlen, "SYNC_ENTRIES_REQ before SYNC_BEGIN");
		return -EPROTO;
	}
	if ((r = buf_get_u32(in, &n)) < 0 || n > WIRE_SYNC_REQ_MAX || n > buf_len(in) / 4) {
		errmsg_set(err, errlen, "SYNC_ENTRIES_REQ: bad count");
		return -EBADMSG;
	}
	buf_init(&out, WIRE_SYNC_MSG_MAX);
	for (uint32_t i = 0; i < n; i++) {
		char *path = NULL;
		if ((r = buf_get_str(in, &path, MANIFEST_PATH_MAX)) < 0) {
			errmsg_set(err, errlen, "SYNC_ENTRIES_REQ: malformed path %u", i);
			goto out;
		}
		long idx = manifest_find(ss->m, path);
		buf_reset(&out);
		r = buf_put_str(&out, path);
		if (r == 0)
			r = buf_put_u8(&out, idx >= 0);
		if (r == 0 && idx >= 0)
			r = manifest_entry_encode(&ss->m->e[idx], &out);
		mem_free(path);
		if (r < 0 || (r = reply(ss, WIRE_SYNC_ENTRY, &out)) < 0) {
			errmsg_set(err, errlen, "answering SYNC_ENTRIES_REQ: %s", strerror(-r));
			goto out;
		}
	}
out:
	buf_clear(&out);
	return r;
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
	ar = syncg_apply_batch(g, buf_ptr(in), buf_len(in), ss->host_pk, &st, why, sizeof(why));
	buf_init(&out, 8192);
	uint64_t seq = 0;
	if (buf_len(in) >= 48) /* header: magic..scope, then u64 seq (for the reply only; unverified if refused) */
		for (int i = 0; i < 8; i++)
			seq = seq << 8 | buf_ptr(in)[40 + i];
	if (ar == 0) {
		r = buf_put_u64(&out, seq);
		if (r == 0)
			r = buf_put_u64(&out, st.ops);
		if (r == 0)
			r = buf_put_u64(&out, st.files);
		if (r == 0)
			r = buf_put_u64(&out, st.bytes);
		if (r == 0)
			r = buf_put_u64(&out, st.deleted);
		if (r == 0)
			r = buf_put_u64(&out, st.kept_dirs);
		if (r == 0)
			r = reply(ss, WIRE_SYNC_ACK, &out);
	} else {
		r = buf_put_u64(&out, seq);
		if (r == 0)
			r = buf_put_u32(&out, (uint32_t)-ar);
		if (r == 0)
			r = buf_put_u8(&out, st.partial);
		if (r == 0)
			r = buf_put_str(&out, why);
		if (r == 0)
			r = reply(ss, WIRE_SYNC_NACK, &out);
	}
	buf_clear(&out);
	if (r < 0)
		errmsg_set(err, errlen, "answering SYNC_BATCH: %s", strerror(-r));
	else if (ar < 0)
		errmsg_set(err, errlen, "%s", why); /* logged by the caller; the session goes on */
	return r;
}

static const struct {
	msg_fn *fn;
	const char *name;
} guest_msgs[WIRE_TYPE_MAX + 1] = {
    [WIRE_SYNC_BEGIN] = {on_begin, "SYNC_BEGIN"},
    [WIRE_SYNC_LEVELS_REQ] = {on_levels_req, "SYNC_LEVELS_REQ"},
    [WIRE_SYNC_ENTRIES_REQ] = {on_entries_req, "SYNC_ENTRIES_REQ"},
    [WIRE_SYNC_BATCH] = {on_batch, "SYNC_BATCH"},
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
			errmsg_set(err, errlen, "%s: %s", guest_msgs[type].name,
				   r == -EMSGSIZE ? "message over the size limit" : "malformed fragment");
		return r;
	}
	struct buf in;
	buf_view(&in, buf_ptr(&ss->in.b), buf_len(&ss->in.b));
	r = guest_msgs[type].fn(ss, &in, err, errlen);
	syncmsg_inbox_done(&ss->in);
	return r;
}
