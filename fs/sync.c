/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sync: host-side engine (sync.h) plus the pieces both sides share
 * (scope, message reassembly and fragmentation, the generated .git/config).
 * doc/SYNC.md "Engine" and doc/PROTOCOL.md "Sync" describe the exchange.
 */
#include "airlock/sync.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/chan.h"
#include "airlock/hcache.h"
#include "airlock/manifest.h"
#include "airlock/mem.h"
#include "airlock/policy.h"
#include "airlock/wire.h"

/* ------------------------------------------------------------------ */
/* shared */

const struct delta_caps sync_delta_caps = {
    .max_batch = WIRE_SYNC_MSG_MAX,
    .max_ops = 65536,
    .max_chunks = 262144,
    .max_chunk = CHUNK_SIZE_LIMIT,
    .max_file = 1ull << 40,
};

void sync_scope(const uint8_t guest_pub[32], const uint8_t host_sign_pk[32], uint8_t scope[DELTA_SCOPE_LEN])
{
	static const char label[] = "airlock sync scope v1";
	crypto_hash_sha256_state st;

	_Static_assert(DELTA_SCOPE_LEN == crypto_hash_sha256_BYTES, "scope is one SHA-256");
	crypto_hash_sha256_init(&st);
	crypto_hash_sha256_update(&st, (const uint8_t *)label, sizeof(label) - 1);
	crypto_hash_sha256_update(&st, guest_pub, 32);
	crypto_hash_sha256_update(&st, host_sign_pk, 32);
	crypto_hash_sha256_final(&st, scope);
}

void sync_inbox_init(struct sync_inbox *in)
{
	in->type = 0;
	buf_init(&in->b, WIRE_SYNC_MSG_MAX);
}

void sync_inbox_clear(struct sync_inbox *in)
{
	in->type = 0;
	buf_clear(&in->b);
}

void sync_inbox_done(struct sync_inbox *in)
{
	in->type = 0;
	/* keep small buffers for reuse, give big ones (a batch) back */
	if (in->b.cap > (1u << 20))
		buf_clear(&in->b);
	else
		buf_reset(&in->b);
}

int sync_inbox_add(struct sync_inbox *in, uint8_t type, const uint8_t *p, size_t n)
{
	int r;

	if (n < 1 || (p[0] & ~WIRE_SYNC_MORE) != 0)
		return -EBADMSG;
	if (in->type && in->type != type)
		return -EBADMSG;
	if (n - 1 > WIRE_SYNC_MSG_MAX - buf_len(&in->b))
		return -EMSGSIZE;
	if ((r = buf_put(&in->b, p + 1, n - 1)) < 0)
		return r == -ENOBUFS ? -EMSGSIZE : r;
	if (p[0] & WIRE_SYNC_MORE) {
		in->type = type;
		return 0;
	}
	in->type = type;
	return 1;
}

struct sync_outmsg {
	struct sync_outmsg *next;
	uint8_t type;
	uint8_t *data;
	size_t n, off;
};

void sync_outbox_init(struct sync_outbox *ob)
{
	ob->head = ob->tail = NULL;
	ob->queued = 0;
}

void sync_outbox_clear(struct sync_outbox *ob)
{
	while (ob->head) {
		struct sync_outmsg *m = ob->head;
		ob->head = m->next;
		mem_free(m->data);
		mem_free(m);
	}
	ob->tail = NULL;
	ob->queued = 0;
}

int sync_outbox_push(struct sync_outbox *ob, uint8_t type, uint8_t *data, size_t n)
{
	struct sync_outmsg *m = mem_calloc(1, sizeof(*m));

	if (!m) {
		mem_free(data);
		return -ENOMEM;
	}
	m->type = type;
	m->data = data;
	m->n = n;
	if (ob->tail)
		ob->tail->next = m;
	else
		ob->head = m;
	ob->tail = m;
	ob->queued += n;
	return 0;
}

int sync_outbox_push_buf(struct sync_outbox *ob, uint8_t type, const struct buf *b)
{
	size_t n = buf_len(b);
	uint8_t *d = mem_alloc(n ? n : 1);

	if (!d)
		return -ENOMEM;
	if (n)
		memcpy(d, buf_ptr(b), n);
	return sync_outbox_push(ob, type, d, n);
}

int sync_outbox_flush(struct sync_outbox *ob, struct chan *c, uint32_t stream)
{
	uint8_t frame[WIRE_PAYLOAD_MAX];

	while (ob->head) {
		struct sync_outmsg *m = ob->head;
		size_t left = m->n - m->off;
		size_t take = left < WIRE_PAYLOAD_MAX - 1 ? left : WIRE_PAYLOAD_MAX - 1;
		frame[0] = take < left ? WIRE_SYNC_MORE : 0;
		if (take)
			memcpy(frame + 1, m->data + m->off, take);
		int r = chan_send(c, m->type, stream, frame, take + 1);
		if (r == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		m->off += take;
		ob->queued -= take;
		if (m->off == m->n) {
			ob->head = m->next;
			if (!ob->head)
				ob->tail = NULL;
			mem_free(m->data);
			mem_free(m);
		}
	}
	return 0;
}

/* ---- generated .git/config ---- */

static const struct {
	const char *section, *key;
} git_keys[] = {
    {"core", "repositoryformatversion"},
    {"core", "filemode"},
    {"core", "logallrefupdates"},
    {"core", "ignorecase"},
    {"core", "precomposeunicode"},
    {"core", "symlinks"},
    {"core", "autocrlf"},
    {"core", "eol"},
    {"core", "safecrlf"},
    {"core", "checkstat"},
    {"core", "trustctime"},
    {"extensions", "objectformat"},
    {"extensions", "refstorage"},
};
#define N_GIT_KEYS (sizeof(git_keys) / sizeof(git_keys[0]))

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
		s[--n] = '\0';
	return s;
}

static bool plain_value(const char *v)
{
	if (!*v || strlen(v) > 64)
		return false;
	for (; *v; v++)
		if (!((*v >= 'a' && *v <= 'z') || (*v >= 'A' && *v <= 'Z') || (*v >= '0' && *v <= '9') || *v == '.' ||
		      *v == '_' || *v == '-'))
			return false;
	return true;
}

int sync_git_config(int dirfd, const char *path, struct buf *out)
{
	char *vals[N_GIT_KEYS] = {0};
	char *text = NULL;
	int r = 0, fd;
	struct stat st;

	fd = manifest_open_beneath(dirfd, path, O_RDONLY | O_NONBLOCK | O_NOCTTY, false);
	if (fd >= 0 && fstat(fd, &st) == 0 && S_ISREG(st.st_mode)) {
		if (st.st_size > SYNC_GIT_CONFIG_MAX) {
			close(fd);
			return -EFBIG;
		}
		if (!(text = mem_alloc((size_t)st.st_size + 1))) {
			close(fd);
			return -ENOMEM;
		}
		ssize_t got = pread(fd, text, (size_t)st.st_size, 0);
		text[got > 0 ? got : 0] = '\0';
	}
	if (fd >= 0)
		close(fd);
	/* Conservative ini reading: "[section]" lines (a subsection, as in
	 * [remote "x"], never matches), "key = value" lines with a plain
	 * value. Anything else (quotes, escapes, continuations, includes) is
	 * not copied. Last value wins, as in git. */
	const char *section = NULL;
	char *save = NULL;
	for (char *line = text ? strtok_r(text, "\n", &save) : NULL; line; line = strtok_r(NULL, "\n", &save)) {
		char *l = trim(line);
		if (*l == '[') {
			char *end = strchr(l, ']');
			section = NULL;
			if (!end)
				continue;
			*end = '\0';
			l = trim(l + 1);
			for (size_t i = 0; i < N_GIT_KEYS; i++)
				if (!strcasecmp(l, git_keys[i].section))
					section = git_keys[i].section;
			continue;
		}
		if (!section || !*l || *l == '#' || *l == ';')
			continue;
		char *eq = strchr(l, '=');
		if (!eq)
			continue;
		*eq = '\0';
		char *key = trim(l), *val = trim(eq + 1);
		char *hash = strpbrk(val, "#;");
		if (hash) {
			*hash = '\0';
			val = trim(val);
		}
		if (!plain_value(val))
			continue;
		for (size_t i = 0; i < N_GIT_KEYS; i++) {
			if (strcmp(section, git_keys[i].section) || strcasecmp(key, git_keys[i].key))
				continue;
			mem_free(vals[i]);
			if (!(vals[i] = mem_strdup(val))) {
				r = -ENOMEM;
				goto out;
			}
		}
	}
	static const char head[] = "# generated by airlock from the host's .git/config: safe keys only\n[core]\n";
	if ((r = buf_put(out, head, sizeof(head) - 1)) < 0)
		goto out;
	{
		char line[256];
		int n = snprintf(line, sizeof(line), "\trepositoryformatversion = %s\n\tbare = false\n",
				 vals[0] ? vals[0] : "0");
		if ((r = buf_put(out, line, (size_t)n)) < 0)
			goto out;
		bool ext = false;
		for (size_t i = 1; i < N_GIT_KEYS; i++) {
			if (!vals[i])
				continue;
			if (!strcmp(git_keys[i].section, "extensions") && !ext) {
				if ((r = buf_put(out, "[extensions]\n", 13)) < 0)
					goto out;
				ext = true;
			}
			n = snprintf(line, sizeof(line), "\t%s = %s\n", git_keys[i].key, vals[i]);
			if ((r = buf_put(out, line, (size_t)n)) < 0)
				goto out;
		}
	}
out:
	for (size_t i = 0; i < N_GIT_KEYS; i++)
		mem_free(vals[i]);
	mem_free(text);
	return r;
}

/* ------------------------------------------------------------------ */
/* host engine */

struct records {
	struct sync_record *v;
	size_t n, cap;
	uint64_t total;
};

/* An entry of the guest manifest being reconstructed. */
struct gentry {
	struct manifest_entry e; /* path owned */
	bool cond;		 /* a directory kept only if something beneath is */
};

struct inflight {
	uint64_t seq;
	uint64_t files, bytes;
};

enum phase {
	PH_IDLE,
	PH_BEGIN,   /* BEGIN sent, waiting for STATE */
	PH_LEVELS,  /* asking directory levels */
	PH_ENTRIES, /* asking chunk lists of changed large files */
	PH_SEND,    /* batches */
};

struct sync {
	struct chan *chan;
	struct sync_cfg cfg;
	struct chunk_params params;
	uint32_t stream;
	uint8_t scope[DELTA_SCOPE_LEN];
	struct sync_inbox in;
	struct sync_outbox out;
	enum phase phase;
	bool busy;
	struct sync_stats st;
	struct sync_progress prog;
	struct records withheld, skipped;
	struct policy_ctx *pctx;
	struct hcache *cache; /* NULL without cfg.state_dir */
	int state_fd;	      /* cfg.state_dir, or -1 */
	struct buf gitcfg;    /* generated .git/config bytes */
	uint8_t gitcfg_hash[CHUNK_HASH_LEN];
	bool have_gitcfg;
	/* manifests */
	struct manifest *hm;	/* host, this run */
	struct manifest *known; /* what the guest confirmed last (host view) */
	struct manifest *gm;	/* guest, reconstructed (managed paths only) */
	/* reconcile */
	uint8_t guest_root[CHUNK_HASH_LEN];
	bool have_state;
	struct gentry *ge;
	size_t nge, capge;
	char **queue; /* directories still to ask */
	size_t nq, capq, qhead;
	char **asked; /* asked in the current round, answered in order */
	size_t nasked, nanswered;
	/* sending */
	struct manifest_change *changes;
	size_t nchanges, ci;
	struct delta_builder *b;
	uint64_t next_seq;
	struct inflight fl[SYNC_BATCHES_IN_FLIGHT];
	size_t nfl;
	/* changes skipped because the file changed or vanished while sent:
	 * the guest still has their old side (fixed up in maybe_done) */
	size_t *van;
	size_t nvan, capvan;
	size_t batch_first;	     /* index of the first change in the batch being built */
	struct sync_push_stats push; /* the last sync_push_* */
	/* sync_push_hinted: the valid hints of the push being decided
	 * (borrowed for the call), sorted by path */
	struct hint_ref *hints;
	size_t nhints;
	/* files whose hint must not be trusted: left for a later push (the
	 * confirmed state kept the guest's old version), hashed in full when
	 * next looked at; all of them when the list overflowed */
	char **unranged;
	size_t nunranged, capunranged;
	bool unranged_all;
};

struct hint_ref {
	const char *path;
	const struct sync_hint *h;
};

#define UNRANGED_MAX 4096u

static long unranged_find(const struct sync *s, const char *path)
{
	for (size_t i = 0; i < s->nunranged; i++)
		if (!strcmp(s->unranged[i], path))
			return (long)i;
	return -1;
}

/* Never fails: without memory (or room) every hint is distrusted. */
static void unranged_add(struct sync *s, const char *path)
{
	if (s->unranged_all || unranged_find(s, path) >= 0)
		return;
	if (s->nunranged == s->capunranged) {
		size_t nc = s->capunranged ? s->capunranged * 2 : 16;
		char **nv = nc <= UNRANGED_MAX ? mem_realloc(s->unranged, nc * sizeof(*nv)) : NULL;
		if (!nv) {
			s->unranged_all = true;
			return;
		}
		s->unranged = nv;
		s->capunranged = nc;
	}
	if (!(s->unranged[s->nunranged] = mem_strdup(path))) {
		s->unranged_all = true;
		return;
	}
	s->nunranged++;
}

static void unranged_del(struct sync *s, const char *path)
{
	long i = unranged_find(s, path);
	if (i < 0)
		return;
	mem_free(s->unranged[i]);
	s->unranged[i] = s->unranged[--s->nunranged];
}

static void unranged_clear(struct sync *s)
{
	for (size_t i = 0; i < s->nunranged; i++)
		mem_free(s->unranged[i]);
	mem_free(s->unranged);
	s->unranged = NULL;
	s->nunranged = s->capunranged = 0;
	s->unranged_all = false;
}

static void fail(struct sync *s, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

static void finish_op(struct sync *s, int err, const char *why)
{
	s->busy = false;
	s->phase = PH_IDLE;
	s->cfg.ops->on_done(err, why, s->cfg.ud);
}

static void fail(struct sync *s, int err, const char *fmt, ...)
{
	char why[1024];
	va_list ap;

	if (!s->busy)
		return;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	finish_op(s, err ? err : -EPROTO, why);
}

static void progress(struct sync *s, const char *phase)
{
	s->prog.phase = phase;
	if (s->cfg.ops->on_progress)
		s->cfg.ops->on_progress(&s->prog, s->cfg.ud);
}

static void records_clear(struct records *r)
{
	for (size_t i = 0; i < r->n; i++) {
		mem_free(r->v[i].path);
		mem_free(r->v[i].rule);
	}
	mem_free(r->v);
	memset(r, 0, sizeof(*r));
}

static int records_add(struct records *r, const char *path, const char *rule)
{
	r->total++;
	if (r->n >= SYNC_RECORDS_MAX)
		return 0;
	if (r->n == r->cap) {
		size_t nc = r->cap ? r->cap * 2 : 64;
		void *nv = mem_realloc(r->v, nc * sizeof(*r->v));
		if (!nv)
			return -ENOMEM;
		r->v = nv;
		r->cap = nc;
	}
	char *p = mem_strdup(path), *q = mem_strdup(rule);
	if (!p || !q) {
		mem_free(p);
		mem_free(q);
		return -ENOMEM;
	}
	r->v[r->n].path = p;
	r->v[r->n].rule = q;
	r->n++;
	return 0;
}

static int str_tree_cmp(const void *a, const void *b)
{
	return manifest_path_cmp(*(const char *const *)a, *(const char *const *)b);
}

/* p is anchor itself or beneath it ("" holds everything). */
static bool path_under(const char *p, const char *anchor)
{
	size_t l = strlen(anchor);
	return !l || (strncmp(p, anchor, l) == 0 && (p[l] == '\0' || p[l] == '/'));
}

/* Index of the anchor that holds p in anchors[0..n) (sorted in tree order,
 * none beneath another), or -1. Only the greatest anchor <= p can: any
 * anchor between an anchor and a path in its subtree would be inside it. */
static long anchor_holding(char *const *anchors, size_t n, const char *p)
{
	size_t lo = 0, hi = n;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		if (manifest_path_cmp(anchors[mid], p) <= 0)
			lo = mid + 1;
		else
			hi = mid;
	}
	return lo > 0 && path_under(p, anchors[lo - 1]) ? (long)lo - 1 : -1;
}

/* Forget the records at or beneath the anchors: they are decided again. */
static void records_drop_under(struct records *r, char *const *anchors, size_t n)
{
	size_t k = 0;
	for (size_t i = 0; i < r->n; i++) {
		if (anchor_holding(anchors, n, r->v[i].path) >= 0) {
			mem_free(r->v[i].path);
			mem_free(r->v[i].rule);
			r->total--;
			continue;
		}
		r->v[k++] = r->v[i];
	}
	r->n = k;
}

static void reconcile_clear(struct sync *s)
{
	for (size_t i = 0; i < s->nge; i++)
		mem_free(s->ge[i].e.path);
	mem_free(s->ge);
	s->ge = NULL;
	s->nge = s->capge = 0;
	for (size_t i = s->qhead; i < s->nq; i++)
		mem_free(s->queue[i]);
	mem_free(s->queue);
	s->queue = NULL;
	s->nq = s->capq = s->qhead = 0;
	for (size_t i = 0; i < s->nasked; i++)
		mem_free(s->asked[i]);
	mem_free(s->asked);
	s->asked = NULL;
	s->nasked = s->nanswered = 0;
	mem_free(s->changes);
	s->changes = NULL;
	s->nchanges = s->ci = 0;
	mem_free(s->van);
	s->van = NULL;
	s->nvan = s->capvan = 0;
	manifest_free(s->gm);
	s->gm = NULL;
}

int sync_new(struct chan *c, const struct sync_cfg *cfg, struct sync **out)
{
	struct sync *s;
	int r;

	*out = NULL;
	if (!cfg->ops || !cfg->ops->on_done || !cfg->policy || !cfg->sign_sk || !cfg->sign_pk || !cfg->guest_pub)
		return -EINVAL;
	if (!(s = mem_calloc(1, sizeof(*s))))
		return -ENOMEM;
	s->chan = c;
	s->cfg = *cfg;
	s->params = cfg->chunking ? *cfg->chunking : chunk_params_default;
	if (chunk_params_check(&s->params) < 0) {
		mem_free(s);
		return -EINVAL;
	}
	if (!s->cfg.batch_target)
		s->cfg.batch_target = SYNC_BATCH_TARGET;
	s->cfg.state_dir = NULL; /* not kept: opened here */
	s->state_fd = -1;
	/* The hash cache is an optimisation: no state directory, no cache. */
	if (cfg->state_dir &&
	    (s->state_fd = open(cfg->state_dir, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) >= 0 &&
	    hcache_new(&s->params, &s->cache) < 0) {
		close(s->state_fd);
		s->state_fd = -1;
	}
	sync_scope(cfg->guest_pub, cfg->sign_pk, s->scope);
	sync_inbox_init(&s->in);
	sync_outbox_init(&s->out);
	buf_init(&s->gitcfg, SYNC_GIT_CONFIG_MAX);
	struct delta_caps caps = sync_delta_caps;
	if (cfg->max_batch && cfg->max_batch < caps.max_batch)
		caps.max_batch = cfg->max_batch;
	if ((r = policy_ctx_new(cfg->policy, cfg->dirfd, &s->pctx)) < 0 ||
	    (r = delta_builder_new(1, s->scope, &s->params, &caps, &s->b)) < 0) {
		sync_free(s);
		return r;
	}
	if (!(s->stream = chan_stream_open(c, CHAN_STREAM_AUTO))) {
		sync_free(s);
		return -ENOMEM;
	}
	*out = s;
	return 0;
}

void sync_free(struct sync *s)
{
	if (!s)
		return;
	reconcile_clear(s);
	sync_inbox_clear(&s->in);
	sync_outbox_clear(&s->out);
	buf_clear(&s->gitcfg);
	records_clear(&s->withheld);
	records_clear(&s->skipped);
	policy_ctx_free(s->pctx);
	hcache_free(s->cache);
	if (s->state_fd >= 0)
		close(s->state_fd);
	delta_builder_free(s->b);
	manifest_free(s->hm);
	manifest_free(s->known);
	unranged_clear(s);
	mem_free(s);
}

uint32_t sync_stream(const struct sync *s)
{
	return s->stream;
}
const struct sync_stats *sync_get_stats(const struct sync *s)
{
	return &s->st;
}

const struct sync_record *sync_withheld(const struct sync *s, size_t *n, uint64_t *total)
{
	*n = s->withheld.n;
	*total = s->withheld.total;
	return s->withheld.v;
}

const struct sync_record *sync_skipped(const struct sync *s, size_t *n, uint64_t *total)
{
	*n = s->skipped.n;
	*total = s->skipped.total;
	return s->skipped.v;
}

static int send_msg(struct sync *s, uint8_t type, const struct buf *b)
{
	int r = sync_outbox_push_buf(&s->out, type, b);
	if (r == 0)
		r = sync_outbox_flush(&s->out, s->chan, s->stream);
	return r;
}

/* ---- host scan ---- */

struct scan_ctx {
	struct sync *s;
	int err;
};

static int scan_filter(const char *rel, bool is_dir, void *ud)
{
	struct scan_ctx *x = ud;
	struct policy_verdict v;
	int r;

	if ((r = policy_check(x->s->cfg.policy, x->s->pctx, rel, is_dir, &v)) < 0) {
		char why[128];
		snprintf(why, sizeof(why), "policy check failed: %s", strerror(-r));
		if (records_add(&x->s->skipped, rel, why) < 0)
			x->err = -ENOMEM;
		return MANIFEST_SKIP;
	}
	if (v.reason == POLICY_SYNCED)
		return MANIFEST_KEEP;
	if (is_dir && !v.prune)
		return MANIFEST_DESCEND;
	if (records_add(&x->s->withheld, rel, v.rule) < 0)
		x->err = -ENOMEM;
	return MANIFEST_SKIP;
}

static void scan_skipped(const char *rel, enum manifest_skip why, int err, void *ud)
{
	struct scan_ctx *x = ud;
	char text[160];

	switch (why) {
	case MANIFEST_SKIP_SPECIAL:
		snprintf(text, sizeof(text), "special file (fifo, socket or device): not synced");
		break;
	case MANIFEST_SKIP_DEPTH:
		snprintf(text, sizeof(text), "nested too deep");
		break;
	case MANIFEST_SKIP_NAME:
		snprintf(text, sizeof(text), "path too long");
		break;
	case MANIFEST_SKIP_TARGET:
		snprintf(text, sizeof(text), "symlink target too long");
		break;
	case MANIFEST_SKIP_ERROR:
		snprintf(text, sizeof(text), "unreadable: %s", strerror(err));
		break;
	case MANIFEST_SKIP_CHANGED:
		snprintf(text, sizeof(text), "changed while scanned");
		break;
	case MANIFEST_SKIP_RESERVED:
		return; /* airlock's own temporaries */
	default:
		snprintf(text, sizeof(text), "skipped");
		break;
	}
	if (records_add(&x->s->skipped, rel, text) < 0)
		x->err = -ENOMEM;
}

/* Scan the host tree into s->hm, with the generated .git/config. */
static int host_scan(struct sync *s, char *why, size_t whylen)
{
	struct scan_ctx x = {.s = s};
	struct manifest_scan_opts o = {
	    .filter = scan_filter,
	    .filter_ud = &x,
	    .skipped = scan_skipped,
	    .skipped_ud = &x,
	    .chunking = &s->params,
	    .cache = s->cache,
	};
	int r;

	if (s->cache && (r = hcache_load(s->cache, s->state_fd, HCACHE_FILE)) == -ENOMEM) {
		snprintf(why, whylen, "loading the hash cache: %s", strerror(-r));
		return r;
	}
	records_clear(&s->withheld);
	records_clear(&s->skipped);
	manifest_free(s->hm);
	s->hm = NULL;
	if ((r = manifest_scan(s->cfg.dirfd, &o, &s->hm)) < 0) {
		snprintf(why, whylen, "scanning the workspace: %s", strerror(-r));
		return r;
	}
	if (x.err) {
		snprintf(why, whylen, "scanning the workspace: %s", strerror(-x.err));
		return x.err;
	}
	if (s->cache)
		(void)hcache_save(s->cache, s->state_fd, HCACHE_FILE); /* best effort: next scan hashes more */
	s->st.withheld = s->withheld.total;
	s->st.skipped = s->skipped.total;
	s->have_gitcfg = false;
	long gi = manifest_find(s->hm, ".git");
	if (gi >= 0 && s->hm->e[gi].type == MANIFEST_DIR) {
		buf_reset(&s->gitcfg);
		if ((r = sync_git_config(s->cfg.dirfd, SYNC_GIT_CONFIG, &s->gitcfg)) < 0) {
			snprintf(why, whylen,
				 ".git/config: %s (the guest gets a generated one; fix or shrink the host's)",
				 strerror(-r));
			return r;
		}
		struct manifest_entry e = {
		    .path = (char *)SYNC_GIT_CONFIG, .type = MANIFEST_FILE, .mode = 0644, .size = buf_len(&s->gitcfg)};
		chunk_hash(buf_ptr(&s->gitcfg), buf_len(&s->gitcfg), e.hash);
		memcpy(s->gitcfg_hash, e.hash, CHUNK_HASH_LEN);
		if ((r = manifest_add(s->hm, &e)) < 0 || (r = manifest_seal(s->hm)) < 0) {
			snprintf(why, whylen, "adding the generated .git/config: %s", strerror(-r));
			return r;
		}
		s->have_gitcfg = true;
	}
	s->st.host_entries = s->hm->n;
	return 0;
}

/* ---- sending batches ---- */

/* A file this batch already deletes that n was probably moved from: same
 * content, else same name in another directory; only large files with a
 * known chunk list (for REFs), and only ones deleted in the batch being
 * built (a REF reads the base as it was before the batch). */
static const struct manifest_entry *rename_base(const struct sync *s, const struct manifest_entry *n)
{
	const struct manifest_entry *by_name = NULL;
	const char *nb = strrchr(n->path, '/');
	nb = nb ? nb + 1 : n->path;
	for (size_t i = s->batch_first; i < s->ci && i - s->batch_first < 4096; i++) {
		const struct manifest_change *c = &s->changes[i];
		const struct manifest_entry *o = c->old;
		if (c->kind != MANIFEST_REMOVE || !o || o->type != MANIFEST_FILE || !o->chunks ||
		    o->size <= s->params.whole_max)
			continue;
		if (!memcmp(o->hash, n->hash, CHUNK_HASH_LEN))
			return o;
		const char *ob = strrchr(o->path, '/');
		if (!by_name && !strcmp(ob ? ob + 1 : o->path, nb))
			by_name = o;
	}
	return by_name;
}

static int add_change(struct sync *s, const struct manifest_change *c)
{
	const struct manifest_entry *n = c->new;
	int r;

	if (n && n->type == MANIFEST_FILE && s->have_gitcfg && !strcmp(n->path, SYNC_GIT_CONFIG) &&
	    (c->kind == MANIFEST_ADD || c->kind == MANIFEST_MODIFY)) {
		/* Never the real file: the generated bytes, signed like the rest. */
		if ((r = delta_put_begin(s->b, n->path, n->mode, NULL)) < 0)
			return r;
		if ((r = delta_put_inline(s->b, buf_ptr(&s->gitcfg), buf_len(&s->gitcfg))) < 0 ||
		    (r = delta_put_end(s->b, s->gitcfg_hash)) < 0)
			return r;
		return 0;
	}
	const struct manifest_entry *base = NULL;
	if (c->kind == MANIFEST_ADD && n->type == MANIFEST_FILE && (!c->old || c->old->type != MANIFEST_FILE) &&
	    n->size > s->params.whole_max)
		base = rename_base(s, n);
	if (n && n->type == MANIFEST_FILE && (c->kind == MANIFEST_ADD || c->kind == MANIFEST_MODIFY) &&
	    (n->nchunks || base)) {
		/* The scan left its chunk list: only the chunks the guest lacks
		 * are read (each checked against the list). A moved large file
		 * takes REFs from the guest's copy at the old path, which apply
		 * stages before the batch's DELETEs. */
		const struct manifest_entry *have = base				      ? base
						    : c->old && c->old->type == MANIFEST_FILE ? c->old
											      : NULL;
		int fd = manifest_open_beneath(s->cfg.dirfd, n->path, O_RDONLY | O_NONBLOCK | O_NOCTTY, false);
		if (fd < 0)
			return fd == -ELOOP ? -ESTALE : fd;
		if (n->nchunks)
			r = delta_put_chunks(s->b, n->path, n->mode, fd, base ? base->path : NULL, have, n->chunks,
					     n->nchunks, n->size, &s->push.put_read);
		else
			r = delta_put_file(s->b, n->path, n->mode, fd, base->path, base, NULL);
		close(fd);
		return r == -EINVAL ? -ESTALE : r;
	}
	return delta_add_change(s->b, s->cfg.dirfd, c);
}

static void count_change(struct sync *s, const struct manifest_change *c, struct inflight *f)
{
	if (c->kind == MANIFEST_REMOVE) {
		s->st.deleted++;
		return;
	}
	if (c->kind == MANIFEST_MODE) {
		s->st.chmods++;
		return;
	}
	switch (c->new->type) {
	case MANIFEST_DIR:
		s->st.dirs++;
		break;
	case MANIFEST_SYMLINK:
		s->st.symlinks++;
		f->files++;
		break;
	case MANIFEST_FILE:
		s->st.files++;
		s->st.content_bytes += c->new->size;
		f->files++;
		f->bytes += c->new->size;
		break;
	default:
		break;
	}
}

static void maybe_done(struct sync *s);

static int note_vanished(struct sync *s, size_t ci)
{
	if (s->nvan == s->capvan) {
		size_t nc = s->capvan ? s->capvan * 2 : 16;
		void *nv = mem_realloc(s->van, nc * sizeof(*s->van));
		if (!nv)
			return -ENOMEM;
		s->van = nv;
		s->capvan = nc;
	}
	s->van[s->nvan++] = ci;
	if (s->changes[ci].new)
		unranged_add(s, s->changes[ci].new->path);
	return 0;
}

/* What the guest holds after a run in which some changes were skipped
 * (the file changed or vanished while being read): s->hm, except that a
 * skipped MODIFY leaves the guest's old file and a skipped ADD leaves
 * nothing. The change that made the file differ is journaled again, and
 * the next push compares against this. */
static int known_without_vanished(struct sync *s, struct manifest **out)
{
	struct manifest *m = NULL;
	size_t k = 0;
	int r;

	*out = NULL;
	/* s->van is in change order; look paths up by a sorted copy */
	const char **vp = mem_calloc(s->nvan, sizeof(*vp));
	if (!vp)
		return -ENOMEM;
	for (size_t i = 0; i < s->nvan; i++)
		vp[i] = s->changes[s->van[i]].new->path;
	qsort(vp, s->nvan, sizeof(*vp), str_tree_cmp);
	if ((r = manifest_new(&s->params, &m)) < 0)
		goto out;
	for (size_t i = 0; i < s->hm->n; i++) {
		const struct manifest_entry *e = &s->hm->e[i];
		while (k < s->nvan && manifest_path_cmp(vp[k], e->path) < 0)
			k++;
		if (k < s->nvan && !strcmp(vp[k], e->path))
			continue;
		if ((r = manifest_add(m, e)) < 0)
			goto out;
	}
	for (size_t i = 0; i < s->nvan; i++) {
		const struct manifest_change *c = &s->changes[s->van[i]];
		if (c->kind == MANIFEST_MODIFY && c->old && (r = manifest_add(m, c->old)) < 0)
			goto out;
	}
	if ((r = manifest_seal(m)) < 0)
		goto out;
	*out = m;
	m = NULL;
out:
	manifest_free(m);
	mem_free(vp);
	return r;
}

/* Build and queue batches while fewer than SYNC_BATCHES_IN_FLIGHT are
 * unacknowledged and nothing else waits for the socket. */
static void pump(struct sync *s)
{
	int r;

	if ((r = sync_outbox_flush(&s->out, s->chan, s->stream)) < 0) {
		fail(s, r, "sending to the guest: %s", strerror(-r));
		return;
	}
	while (s->busy && s->phase == PH_SEND && s->out.queued == 0 && s->nfl < SYNC_BATCHES_IN_FLIGHT &&
	       s->ci < s->nchanges) {
		struct inflight f = {.seq = s->next_seq};
		delta_builder_reset(s->b, s->next_seq);
		s->batch_first = s->ci;
		while (s->ci < s->nchanges) {
			const struct manifest_change *c = &s->changes[s->ci];
			r = add_change(s, c);
			if (r == -ENOBUFS) {
				if (delta_builder_ops(s->b) == 0) {
					/* a file whose PUT alone exceeds a batch: not
					 * sent, reported, the rest goes on (the guest
					 * keeps its old version, if any) */
					char rule[96];
					if (!c->new) {
						fail(s, -EFBIG, "%s: an operation larger than a batch", c->old->path);
						return;
					}
					snprintf(rule, sizeof(rule),
						 "too large to sync: over %zu KiB after compression",
						 (s->cfg.max_batch && s->cfg.max_batch < WIRE_SYNC_MSG_MAX
						      ? s->cfg.max_batch
						      : WIRE_SYNC_MSG_MAX) >>
						     10);
					if (records_add(&s->skipped, c->new->path, rule) < 0 ||
					    note_vanished(s, s->ci) < 0) {
						fail(s, -ENOMEM, "out of memory");
						return;
					}
					s->st.skipped = s->skipped.total;
					s->ci++;
					continue;
				}
				break;
			}
			if (r == -ESTALE || r == -ENOENT) {
				/* changed or vanished since the scan: the next sync
				 * (or the journal) picks it up */
				s->st.vanished++;
				if ((r = note_vanished(s, s->ci)) < 0) {
					fail(s, r, "out of memory");
					return;
				}
				s->ci++;
				continue;
			}
			if (r < 0) {
				const char *p = c->new ? c->new->path : c->old->path;
				fail(s, r, "%s: cannot add to a batch: %s", p, strerror(-r));
				return;
			}
			count_change(s, c, &f);
			s->ci++;
			if (delta_builder_size(s->b) >= s->cfg.batch_target)
				break;
		}
		if (delta_builder_ops(s->b) == 0)
			break;
		uint8_t *bytes;
		size_t n;
		if ((r = delta_builder_finish(s->b, s->cfg.sign_sk, &bytes, &n)) < 0) {
			fail(s, r, "signing batch %llu: %s", (unsigned long long)s->next_seq, strerror(-r));
			return;
		}
		s->st.batch_bytes += n;
		s->st.batches++;
		s->next_seq++;
		s->fl[s->nfl++] = f;
		if ((r = sync_outbox_push(&s->out, WIRE_SYNC_BATCH, bytes, n)) < 0 ||
		    (r = sync_outbox_flush(&s->out, s->chan, s->stream)) < 0) {
			fail(s, r, "sending a batch: %s", strerror(-r));
			return;
		}
		progress(s, "send");
	}
	maybe_done(s);
}

static void maybe_done(struct sync *s)
{
	if (!s->busy || s->phase != PH_SEND || s->ci < s->nchanges || s->nfl > 0)
		return;
	/* The guest confirmed everything: what it has is now this scan (minus
	 * what could not be read while sending). */
	if (s->nvan) {
		struct manifest *m;
		int r = known_without_vanished(s, &m);
		manifest_free(s->hm);
		s->hm = m;
		if (r < 0) {
			/* no confirmed state: the caller reconnects and reconciles */
			manifest_free(s->known);
			s->known = NULL;
			fail(s, r, "recording what the guest holds: %s", strerror(-r));
			return;
		}
	}
	manifest_free(s->known);
	s->known = s->hm;
	s->hm = NULL;
	reconcile_clear(s);
	progress(s, "done");
	finish_op(s, 0, NULL);
}

static int start_send(struct sync *s)
{
	int r;
	const struct manifest *old = s->gm ? s->gm : s->known;

	mem_free(s->changes);
	s->changes = NULL;
	if ((r = manifest_diff(old, s->hm, &s->changes, &s->nchanges)) < 0)
		return r;
	s->ci = 0;
	s->st.changes = s->nchanges;
	s->prog.files_total = s->prog.bytes_total = 0;
	for (size_t i = 0; i < s->nchanges; i++) {
		const struct manifest_change *c = &s->changes[i];
		if ((c->kind == MANIFEST_ADD || c->kind == MANIFEST_MODIFY) && c->new->type != MANIFEST_DIR) {
			s->prog.files_total++;
			if (c->new->type == MANIFEST_FILE)
				s->prog.bytes_total += c->new->size;
		}
	}
	s->phase = PH_SEND;
	progress(s, "send");
	pump(s);
	return 0;
}

/* ---- reconcile: guest manifest from levels ---- */

static int gentry_push(struct sync *s, const struct manifest_entry *e, bool cond)
{
	if (s->nge >= MANIFEST_ENTRIES_MAX)
		return -E2BIG;
	if (s->nge == s->capge) {
		size_t nc = s->capge ? s->capge * 2 : 1024;
		void *nv = mem_realloc(s->ge, nc * sizeof(*s->ge));
		if (!nv)
			return -ENOMEM;
		s->ge = nv;
		s->capge = nc;
	}
	struct gentry *g = &s->ge[s->nge];
	memset(g, 0, sizeof(*g));
	g->e.type = e->type;
	g->e.mode = e->mode;
	g->e.size = e->size;
	memcpy(g->e.hash, e->hash, CHUNK_HASH_LEN);
	g->cond = cond;
	if (!(g->e.path = mem_strdup(e->path)))
		return -ENOMEM;
	s->nge++;
	return 0;
}

static int queue_push(struct sync *s, const char *dir)
{
	if (s->nq == s->capq) {
		size_t nc = s->capq ? s->capq * 2 : 64;
		void *nv = mem_realloc(s->queue, nc * sizeof(char *));
		if (!nv)
			return -ENOMEM;
		s->queue = nv;
		s->capq = nc;
	}
	if (!(s->queue[s->nq] = mem_strdup(dir)))
		return -ENOMEM;
	s->nq++;
	return 0;
}

/* 0 not managed (the guest's own: dropped), 1 managed, 2 a directory the
 * policy does not sync itself but may sync something beneath. */
static int guest_managed(struct sync *s, const char *path, uint8_t type)
{
	struct policy_verdict v;

	if (!strcmp(path, SYNC_GIT_CONFIG))
		return s->have_gitcfg ? 1 : 0;
	if (policy_check(s->cfg.policy, s->pctx, path, type == MANIFEST_DIR, &v) < 0)
		return 0;
	if (v.reason == POLICY_SYNCED)
		return 1;
	return type == MANIFEST_DIR && !v.prune ? 2 : 0;
}

static int take_host_subtree(struct sync *s, long idx)
{
	const struct manifest_entry *d = &s->hm->e[idx];
	size_t dl = strlen(d->path);
	int r;

	for (size_t j = (size_t)idx + 1; j < s->hm->n; j++) {
		const struct manifest_entry *e = &s->hm->e[j];
		if (strncmp(e->path, d->path, dl) != 0 || e->path[dl] != '/')
			break;
		if ((r = gentry_push(s, e, false)) < 0)
			return r;
	}
	return 0;
}

static int feed_level(struct sync *s, const char *dir, const uint8_t *p, size_t n)
{
	struct buf in;
	uint32_t count;
	char path[MANIFEST_PATH_MAX + 1];
	size_t dl = strlen(dir);
	int r;

	buf_view(&in, p, n);
	if (buf_get_u32(&in, &count) < 0 || count > buf_len(&in) / 33)
		return -EBADMSG;
	for (uint32_t k = 0; k < count; k++) {
		const uint8_t *name;
		size_t nl;
		struct manifest_entry e = {0};
		if (buf_get_bytes(&in, &name, &nl, MANIFEST_NAME_MAX) < 0 || nl == 0 || memchr(name, '/', nl) ||
		    memchr(name, '\0', nl) || buf_get_u8(&in, &e.type) < 0 || buf_get_u32(&in, &e.mode) < 0 ||
		    buf_get_u64(&in, &e.size) < 0 || buf_get(&in, e.hash, CHUNK_HASH_LEN) < 0)
			return -EBADMSG;
		size_t pl = dl ? dl + 1 + nl : nl;
		if (pl > MANIFEST_PATH_MAX)
			return -EBADMSG;
		if (dl) {
			memcpy(path, dir, dl);
			path[dl] = '/';
		}
		memcpy(path + (dl ? dl + 1 : 0), name, nl);
		path[pl] = '\0';
		if (manifest_path_check(path, pl) < 0 || e.mode > MANIFEST_MODE_MASK ||
		    (e.type != MANIFEST_FILE && e.type != MANIFEST_DIR && e.type != MANIFEST_SYMLINK))
			return -EBADMSG;
		e.path = path;
		int m = guest_managed(s, path, e.type);
		if (m == 0)
			continue; /* the guest's own: never compared, listed further or touched */
		if (e.type != MANIFEST_DIR) {
			if ((r = gentry_push(s, &e, false)) < 0)
				return r;
			continue;
		}
		e.size = 0;
		if ((r = gentry_push(s, &e, m == 2)) < 0)
			return r;
		long idx = manifest_find(s->hm, path);
		if (idx >= 0 && s->hm->e[idx].type == MANIFEST_DIR &&
		    memcmp(s->hm->e[idx].hash, e.hash, CHUNK_HASH_LEN) == 0) {
			/* equal digests: the guest's subtree is exactly the host's */
			s->ge[s->nge - 1].cond = false;
			r = take_host_subtree(s, idx);
		} else {
			r = queue_push(s, path);
		}
		if (r < 0)
			return r;
	}
	if (buf_len(&in) != 0)
		return -EBADMSG;
	s->st.levels++;
	return 0;
}

static int gentry_cmp(const void *a, const void *b)
{
	return manifest_path_cmp(((const struct gentry *)a)->e.path, ((const struct gentry *)b)->e.path);
}

/* All levels are in: build s->gm. A conditional directory stays only when
 * something beneath it stays (tree order: its subtree follows it). */
static int build_guest_manifest(struct sync *s)
{
	int r;

	if (s->nge)
		qsort(s->ge, s->nge, sizeof(*s->ge), gentry_cmp);
	bool *keep = mem_calloc(s->nge ? s->nge : 1, sizeof(bool));
	if (!keep)
		return -ENOMEM;
	const char *next_kept = NULL;
	for (size_t i = s->nge; i-- > 0;) {
		const struct gentry *g = &s->ge[i];
		if (g->cond) {
			size_t l = strlen(g->e.path);
			keep[i] = next_kept && strncmp(next_kept, g->e.path, l) == 0 && next_kept[l] == '/';
		} else {
			keep[i] = true;
		}
		if (keep[i])
			next_kept = g->e.path;
	}
	manifest_free(s->gm);
	if ((r = manifest_new(&s->params, &s->gm)) < 0)
		goto out;
	for (size_t i = 0; i < s->nge; i++) {
		if (!keep[i])
			continue;
		if ((r = manifest_add(s->gm, &s->ge[i].e)) < 0)
			goto out;
	}
	r = manifest_seal(s->gm);
	if (r == 0)
		s->st.guest_entries = s->gm->n;
out:
	mem_free(keep);
	return r;
}

static void ask_round(struct sync *s);

static void ask_entries(struct sync *s)
{
	struct buf b;
	int r;
	size_t n = 0;

	for (size_t i = 0; i < s->nasked; i++)
		mem_free(s->asked[i]);
	s->nasked = s->nanswered = 0;
	buf_init(&b, WIRE_SYNC_MSG_MAX);
	if ((r = buf_put_u32(&b, 0)) < 0)
		goto out;
	for (size_t i = 0; i < s->nchanges && n < WIRE_SYNC_REQ_MAX; i++) {
		const struct manifest_change *c = &s->changes[i];
		if (c->kind != MANIFEST_MODIFY || c->new->type != MANIFEST_FILE || c->old->type != MANIFEST_FILE ||
		    c->old->size <= s->params.whole_max || c->old->chunks)
			continue;
		void *nv = mem_realloc(s->asked, (n + 1) * sizeof(char *));
		if (!nv) {
			r = -ENOMEM;
			goto out;
		}
		s->asked = nv;
		if (!(s->asked[n] = mem_strdup(c->old->path))) {
			r = -ENOMEM;
			goto out;
		}
		n++;
		s->nasked = n;
		if ((r = buf_put_str(&b, c->old->path)) < 0)
			goto out;
	}
	if (n == 0) {
		buf_clear(&b);
		if ((r = start_send(s)) < 0)
			fail(s, r, "comparing with the guest: %s", strerror(-r));
		return;
	}
	b.data[b.off] = (uint8_t)(n >> 24);
	b.data[b.off + 1] = (uint8_t)(n >> 16);
	b.data[b.off + 2] = (uint8_t)(n >> 8);
	b.data[b.off + 3] = (uint8_t)n;
	s->phase = PH_ENTRIES;
	r = send_msg(s, WIRE_SYNC_ENTRIES_REQ, &b);
out:
	buf_clear(&b);
	if (r < 0)
		fail(s, r, "asking the guest for chunk lists: %s", strerror(-r));
}

static void levels_done(struct sync *s)
{
	int r;

	if ((r = build_guest_manifest(s)) < 0) {
		fail(s, r, "the guest's listing is inconsistent: %s", strerror(-r));
		return;
	}
	mem_free(s->changes);
	s->changes = NULL;
	if ((r = manifest_diff(s->gm, s->hm, &s->changes, &s->nchanges)) < 0) {
		fail(s, r, "comparing with the guest: %s", strerror(-r));
		return;
	}
	ask_entries(s);
}

static void ask_round(struct sync *s)
{
	struct buf b;
	int r;
	size_t n = s->nq - s->qhead;

	for (size_t i = 0; i < s->nasked; i++)
		mem_free(s->asked[i]);
	mem_free(s->asked);
	s->asked = NULL;
	s->nasked = s->nanswered = 0;
	if (n == 0) {
		levels_done(s);
		return;
	}
	if (n > WIRE_SYNC_REQ_MAX)
		n = WIRE_SYNC_REQ_MAX;
	if (!(s->asked = mem_calloc(n, sizeof(char *)))) {
		fail(s, -ENOMEM, "out of memory");
		return;
	}
	buf_init(&b, WIRE_SYNC_MSG_MAX);
	r = buf_put_u32(&b, (uint32_t)n);
	for (size_t i = 0; i < n && r == 0; i++) {
		s->asked[i] = s->queue[s->qhead++];
		s->nasked++;
		r = buf_put_str(&b, s->asked[i]);
	}
	if (s->qhead == s->nq)
		s->qhead = s->nq = 0;
	if (r == 0)
		r = send_msg(s, WIRE_SYNC_LEVELS_REQ, &b);
	buf_clear(&b);
	if (r < 0)
		fail(s, r, "asking the guest for its listing: %s", strerror(-r));
}

/* The host scan and the guest's STATE are both in: compare. */
static void start_levels(struct sync *s)
{
	int r;

	if (memcmp(s->guest_root, s->hm->root, CHUNK_HASH_LEN) == 0) {
		/* the guest holds exactly the managed tree: nothing to list */
		s->st.guest_entries = s->hm->n;
		s->nchanges = 0;
		s->phase = PH_SEND;
		pump(s);
		return;
	}
	s->phase = PH_LEVELS;
	progress(s, "reconcile");
	if ((r = queue_push(s, "")) < 0) {
		fail(s, r, "out of memory");
		return;
	}
	ask_round(s);
}

/* ---- messages from the guest ---- */

typedef int msg_fn(struct sync *s, struct buf *in);

static int on_state(struct sync *s, struct buf *in)
{
	uint64_t seq, entries;
	uint32_t special;
	int r;

	if (s->phase != PH_BEGIN)
		return -EPROTO;
	if ((r = buf_get_u64(in, &seq)) < 0 || (r = buf_get(in, s->guest_root, CHUNK_HASH_LEN)) < 0 ||
	    (r = buf_get_u64(in, &entries)) < 0 || (r = buf_get_u32(in, &special)) < 0)
		return r;
	if (seq == UINT64_MAX)
		return -EOVERFLOW;
	s->st.guest_seq = seq;
	s->next_seq = seq + 1;
	s->have_state = true;
	/* the host scan runs while the guest scans; it may not be done yet */
	if (s->hm)
		start_levels(s);
	return 0;
}

static int on_level(struct sync *s, struct buf *in)
{
	char *dir = NULL;
	const uint8_t *lvl;
	size_t n;
	int r;

	if (s->phase != PH_LEVELS || s->nanswered >= s->nasked)
		return -EPROTO;
	if ((r = buf_get_str(in, &dir, MANIFEST_PATH_MAX)) < 0 ||
	    (r = buf_get_bytes(in, &lvl, &n, WIRE_SYNC_MSG_MAX)) < 0)
		goto out;
	if (strcmp(dir, s->asked[s->nanswered]) != 0 || buf_len(in) != 0) {
		r = -EPROTO;
		goto out;
	}
	s->nanswered++;
	if ((r = feed_level(s, dir, lvl, n)) < 0)
		goto out;
	if (s->nanswered == s->nasked)
		ask_round(s);
out:
	mem_free(dir);
	return r;
}

static int on_entry(struct sync *s, struct buf *in)
{
	char *path = NULL;
	uint8_t found;
	struct manifest_entry e = {0};
	int r;

	if (s->phase != PH_ENTRIES || s->nanswered >= s->nasked)
		return -EPROTO;
	if ((r = buf_get_str(in, &path, MANIFEST_PATH_MAX)) < 0 || (r = buf_get_u8(in, &found)) < 0)
		goto out;
	if (strcmp(path, s->asked[s->nanswered]) != 0) {
		r = -EPROTO;
		goto out;
	}
	s->nanswered++;
	if (found) {
		if ((r = manifest_entry_decode(in, &s->params, &e)) < 0)
			goto out;
		long idx = manifest_find(s->gm, path);
		struct manifest_entry *g = idx >= 0 ? &s->gm->e[idx] : NULL;
		/* Use the chunk list only if it describes what the guest
		 * listed; otherwise the file changed there: send it whole. */
		if (g && !strcmp(e.path, path) && e.type == MANIFEST_FILE && g->type == MANIFEST_FILE &&
		    e.size == g->size && !memcmp(e.hash, g->hash, CHUNK_HASH_LEN) && e.chunks &&
		    chunk_list_check(&s->params, e.chunks, e.nchunks, e.size) == 0) {
			g->chunks = e.chunks;
			g->nchunks = e.nchunks;
			e.chunks = NULL;
			e.nchunks = 0;
		}
	}
	if (s->nanswered == s->nasked && (r = start_send(s)) < 0)
		goto out;
	r = 0;
out:
	manifest_entry_clear(&e);
	mem_free(path);
	return r;
}

static int on_ack(struct sync *s, struct buf *in)
{
	uint64_t seq, ops, files, bytes, deleted, kept;
	int r;

	if (s->phase != PH_SEND || s->nfl == 0)
		return -EPROTO;
	if ((r = buf_get_u64(in, &seq)) < 0 || (r = buf_get_u64(in, &ops)) < 0 || (r = buf_get_u64(in, &files)) < 0 ||
	    (r = buf_get_u64(in, &bytes)) < 0 || (r = buf_get_u64(in, &deleted)) < 0 ||
	    (r = buf_get_u64(in, &kept)) < 0)
		return r;
	if (seq != s->fl[0].seq)
		return -EPROTO;
	s->st.guest_seq = seq;
	s->st.kept_dirs += kept;
	s->prog.files_done += s->fl[0].files;
	s->prog.bytes_done += s->fl[0].bytes;
	memmove(&s->fl[0], &s->fl[1], (s->nfl - 1) * sizeof(s->fl[0]));
	s->nfl--;
	progress(s, "send");
	pump(s);
	return 0;
}

static int on_nack(struct sync *s, struct buf *in)
{
	uint64_t seq;
	uint32_t code;
	uint8_t partial;
	char *msg = NULL;

	if (buf_get_u64(in, &seq) < 0 || buf_get_u32(in, &code) < 0 || buf_get_u8(in, &partial) < 0 ||
	    buf_get_str(in, &msg, 4096) < 0)
		return -EBADMSG;
	fail(s, code > 0 && code < 4096 ? -(int)code : -EPROTO, "the guest refused batch %llu: %s%s",
	     (unsigned long long)seq, msg,
	     partial ? " (part of the batch was applied; run the sync again to reconcile)" : " (nothing was applied)");
	mem_free(msg);
	return 0;
}

static const struct {
	msg_fn *fn;
	const char *name;
} host_msgs[WIRE_TYPE_MAX + 1] = {
    [WIRE_SYNC_STATE] = {on_state, "SYNC_STATE"}, [WIRE_SYNC_LEVEL] = {on_level, "SYNC_LEVEL"},
    [WIRE_SYNC_ENTRY] = {on_entry, "SYNC_ENTRY"}, [WIRE_SYNC_ACK] = {on_ack, "SYNC_ACK"},
    [WIRE_SYNC_NACK] = {on_nack, "SYNC_NACK"},
};

void sync_on_frame(struct sync *s, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	int r;

	if (!s->busy)
		return;
	if (stream != s->stream || !host_msgs[type].fn) {
		fail(s, -EPROTO, "guest sent %s on stream %u, which the sync does not expect", wire_type_name(type),
		     stream);
		return;
	}
	if ((r = sync_inbox_add(&s->in, type, p, n)) <= 0) {
		if (r < 0)
			fail(s, r, "guest sent a malformed %s: %s", host_msgs[type].name, strerror(-r));
		return;
	}
	struct buf in;
	buf_view(&in, buf_ptr(&s->in.b), buf_len(&s->in.b));
	r = host_msgs[type].fn(s, &in);
	sync_inbox_done(&s->in);
	if (r < 0)
		fail(s, r, "guest sent a bad %s: %s", host_msgs[type].name, strerror(-r));
}

void sync_on_writable(struct sync *s)
{
	if (s->busy)
		pump(s);
}

void sync_on_error(struct sync *s, uint32_t code, const char *msg)
{
	fail(s, code > 0 && code < 4096 ? -(int)code : -EPROTO, "the guest reported: %s", msg);
}

int sync_reconcile(struct sync *s)
{
	struct buf b;
	char why[512];
	int r;

	if (s->busy)
		return -EBUSY;
	reconcile_clear(s);
	unranged_clear(s); /* a full comparison: every file is decided from its content */
	s->busy = true;
	s->have_state = false;
	s->phase = PH_BEGIN;
	s->nfl = 0;
	memset(&s->prog, 0, sizeof(s->prog));
	/* BEGIN first, so the guest scans its copy while we scan ours */
	buf_init(&b, 64);
	if ((r = buf_put_u32(&b, s->params.min)) < 0 || (r = buf_put_u32(&b, s->params.avg)) < 0 ||
	    (r = buf_put_u32(&b, s->params.max)) < 0 || (r = buf_put_u32(&b, s->params.whole_max)) < 0 ||
	    (r = send_msg(s, WIRE_SYNC_BEGIN, &b)) < 0) {
		buf_clear(&b);
		s->busy = false;
		return r;
	}
	buf_clear(&b);
	progress(s, "scan");
	if ((r = host_scan(s, why, sizeof(why))) < 0) {
		fail(s, r, "%s", why);
		return 0;
	}
	if (s->have_state)
		start_levels(s);
	return 0;
}

/* ---- targeted push (the live mount's dirty paths) ----
 *
 * The new host state is the confirmed one (s->known) with every dirty
 * path's subtree decided again from the disk: each path is turned into an
 * anchor, the shallowest point whose parent the confirmed state holds as
 * a directory (a path under a new, renamed or removed directory anchors at
 * that directory; a .gitignore anchors at its directory, whose verdicts it
 * changes). Anchors are sorted in tree order and nested ones dropped. Each
 * anchor is lstat'ed through its parent, opened beneath the workspace
 * without following links; a directory is walked (manifest_scan on the
 * subtree, same policy filter), a file hashed, a link read. Everything
 * outside the anchors is copied from s->known, so the diff against it
 * gives exactly the ops for the anchors. Anything that does not fit (the
 * root, the repository's exclude file, a parent that is not the directory
 * the confirmed state says, a manifest that does not seal) falls back to
 * the full scan. */

/* Anchors beyond this (or beyond a quarter of the tree): a full scan costs
 * about the same and keeps the audit record exact. */
#define PUSH_ANCHORS_MAX 4096u
#define PUSH_FULL	 1 /* anchor_for: scan the whole tree instead */

/* The anchor for dirty path p into out (MANIFEST_PATH_MAX + 1 bytes), 0;
 * PUSH_FULL when only a full scan is right. */
static int anchor_for(const struct sync *s, const char *p, char *out)
{
	size_t len = strlen(p);

	if (!len || manifest_path_check(p, len) < 0)
		return PUSH_FULL;
	if (!strcmp(p, ".git") || !strcmp(p, ".git/info") || !strcmp(p, ".git/info/exclude"))
		return PUSH_FULL; /* the repository's exclude rules apply everywhere */
	memcpy(out, p, len + 1);
	const char *bn = strrchr(out, '/');
	if (!strcmp(bn ? bn + 1 : out, ".gitignore")) {
		if (!bn)
			return PUSH_FULL;
		out[bn - out] = '\0'; /* its directory's verdicts change */
	}
	/* the shallowest component whose parent is not a directory we hold */
	for (char *sl = strchr(out, '/'); sl; sl = strchr(sl + 1, '/')) {
		*sl = '\0';
		long i = manifest_find(s->known, out);
		if (i < 0 || s->known->e[i].type != MANIFEST_DIR)
			return 0; /* out is this ancestor */
		*sl = '/';
	}
	return 0;
}

struct push_scan {
	struct scan_ctx *x;
	const char *prefix;
	size_t plen;
	char path[MANIFEST_PATH_MAX + 1 + MANIFEST_PATH_MAX + MANIFEST_NAME_MAX + 2];
};

/* prefix/rel in ps->path; false when longer than a manifest path */
static bool push_join(struct push_scan *ps, const char *rel)
{
	size_t rl = strlen(rel);
	if (ps->plen + 1 + rl > MANIFEST_PATH_MAX)
		return false;
	memcpy(ps->path, ps->prefix, ps->plen);
	ps->path[ps->plen] = '/';
	memcpy(ps->path + ps->plen + 1, rel, rl + 1);
	return true;
}

static int push_filter(const char *rel, bool is_dir, void *ud)
{
	struct push_scan *ps = ud;
	if (!push_join(ps, rel)) {
		if (records_add(&ps->x->s->skipped, rel, "path too long") < 0)
			ps->x->err = -ENOMEM;
		return MANIFEST_SKIP;
	}
	return scan_filter(ps->path, is_dir, ps->x);
}

static void push_skipped(const char *rel, enum manifest_skip why, int err, void *ud)
{
	struct push_scan *ps = ud;
	if (push_join(ps, rel))
		scan_skipped(ps->path, why, err, ps->x);
}

static void push_skip(struct scan_ctx *x, const char *path, enum manifest_skip why, int err)
{
	unranged_add(x->s, path); /* the confirmed state keeps the guest's version */
	scan_skipped(path, why, err, x);
}

static int hint_cmp(const void *a, const void *b)
{
	return strcmp(((const struct hint_ref *)a)->path, ((const struct hint_ref *)b)->path);
}

/* Re-chunk a large file from its confirmed chunk list and its hint
 * (chunk_update). 0 with e filled, 1 when the hint cannot be used (hash
 * the whole file), or -errno. */
static int push_ranged(struct sync *s, int fd, const struct stat *st, const char *path, struct manifest_entry *e)
{
	struct hint_ref key = {.path = path}, *hr;
	uint64_t nsz = (uint64_t)st->st_size, off, end, reread = 0;
	long k;
	int r;

	if (!s->nhints || s->unranged_all || nsz <= s->params.whole_max ||
	    !(hr = bsearch(&key, s->hints, s->nhints, sizeof(key), hint_cmp)) || unranged_find(s, path) >= 0 ||
	    (k = manifest_find(s->known, path)) < 0)
		return 1;
	const struct sync_hint *h = hr->h;
	const struct manifest_entry *o = &s->known->e[k];
	if (o->type != MANIFEST_FILE || !o->nchunks)
		return 1;
	e->type = MANIFEST_FILE;
	e->mode = st->st_mode & MANIFEST_MODE_MASK;
	e->size = nsz;
	if (!h->resized && nsz == o->size && h->lo >= h->hi) {
		/* attributes only: the confirmed list stands */
		if (!(e->chunks = mem_calloc(o->nchunks, sizeof(*e->chunks))))
			return -ENOMEM;
		memcpy(e->chunks, o->chunks, o->nchunks * sizeof(*e->chunks));
		e->nchunks = o->nchunks;
	} else {
		if (h->resized || nsz != o->size) {
			off = h->lo < o->size ? h->lo : o->size;
			end = nsz;
		} else {
			off = h->lo;
			end = h->hi < nsz ? h->hi : nsz;
		}
		if (off > end)
			off = end;
		r = chunk_update(&s->params, o->chunks, o->nchunks, off, end, nsz, chunk_read_fd, &fd, &e->chunks,
				 &e->nchunks, &reread);
		if (r == -EINVAL)
			return 1;
		if (r < 0)
			return r;
	}
	chunk_list_hash(e->chunks, e->nchunks, e->hash);
	s->push.hashed++;
	s->push.hashed_bytes += reread;
	s->push.ranged++;
	return 0;
}

/* Hash (and, over whole_max, chunk) the regular file open at fd into e. */
static int push_hash_file(struct sync *s, int fd, const struct stat *st, struct manifest_entry *e)
{
	uint8_t io[64 * 1024];
	int r = 0;

	e->type = MANIFEST_FILE;
	e->mode = st->st_mode & MANIFEST_MODE_MASK;
	e->size = (uint64_t)st->st_size;
	s->push.hashed++;
	s->push.hashed_bytes += e->size;
	if (e->size > s->params.whole_max)
		return chunk_file(&s->params, chunk_read_fd, &fd, e->size, NULL, NULL, &e->chunks, &e->nchunks,
				  e->hash);
	struct chunk_hasher h;
	uint64_t off = 0;
	chunk_hasher_init(&h);
	while (off < e->size && r == 0) {
		size_t k = e->size - off < sizeof(io) ? (size_t)(e->size - off) : sizeof(io);
		if ((r = chunk_read_fd(&fd, off, io, k)) == 0) {
			chunk_hasher_update(&h, io, k);
			off += k;
		}
	}
	chunk_hasher_final(&h, e->hash);
	return r;
}

/* Decide anchor `path` from the disk and add what is there (if managed) to
 * m. 0, -ESTALE when its parent is not the directory the confirmed state
 * says (full scan), -ENOMEM, -E2BIG. */
static int push_scan_anchor(struct sync *s, struct scan_ctx *x, const char *path, struct manifest *m)
{
	char parent[MANIFEST_PATH_MAX + 1];
	const char *sl = strrchr(path, '/'), *base = sl ? sl + 1 : path;
	struct manifest_entry e = {0};
	struct manifest *sub = NULL;
	struct stat st;
	int pfd = s->cfg.dirfd, fd = -1, r = 0, v;

	if (sl) {
		memcpy(parent, path, (size_t)(sl - path));
		parent[sl - path] = '\0';
		if ((pfd = manifest_open_beneath(s->cfg.dirfd, parent, O_PATH | O_DIRECTORY, false)) < 0)
			return pfd == -ENOMEM ? -ENOMEM : -ESTALE;
	}
	s->push.lstats++;
	if (fstatat(pfd, base, &st, AT_SYMLINK_NOFOLLOW) < 0) {
		if (errno != ENOENT)
			push_skip(x, path, MANIFEST_SKIP_ERROR, errno);
		goto out; /* gone: the diff deletes it */
	}
	if (S_ISDIR(st.st_mode)) {
		if ((v = scan_filter(path, true, x)) == MANIFEST_SKIP)
			goto out;
		if ((fd = openat(pfd, base, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)) < 0 ||
		    fstat(fd, &st) < 0) {
			push_skip(x, path, MANIFEST_SKIP_CHANGED, 0);
			goto out;
		}
		struct push_scan ps = {.x = x, .prefix = path, .plen = strlen(path)};
		unsigned depth = 1;
		for (const char *c = path; *c; c++)
			depth += *c == '/';
		struct manifest_scan_opts o = {
		    .filter = push_filter,
		    .filter_ud = &ps,
		    .skipped = push_skipped,
		    .skipped_ud = &ps,
		    .chunking = &s->params,
		    .max_depth = depth < 128 ? 128 - depth : 1,
		};
		s->push.walked++;
		if ((r = manifest_scan(fd, &o, &sub)) < 0) {
			if (r == -ENOMEM || r == -E2BIG)
				goto out;
			push_skip(x, path, MANIFEST_SKIP_ERROR, -r);
			r = 0;
			goto out;
		}
		s->push.lstats += sub->n;
		if (v == MANIFEST_DESCEND && sub->n == 0)
			goto out; /* kept only for what is beneath: nothing is */
		e.path = (char *)path;
		e.type = MANIFEST_DIR;
		e.mode = st.st_mode & MANIFEST_MODE_MASK;
		r = manifest_add(m, &e);
		e.path = NULL; /* the caller's */
		if (r < 0)
			goto out;
		for (size_t i = 0; i < sub->n; i++) {
			struct manifest_entry c = sub->e[i];
			if (!push_join(&ps, sub->e[i].path))
				continue; /* the filter left it out already */
			c.path = ps.path;
			if (c.type == MANIFEST_FILE)
				s->push.hashed++, s->push.hashed_bytes += c.size;
			if ((r = manifest_add(m, &c)) < 0)
				goto out;
		}
		goto out;
	}
	if (scan_filter(path, false, x) == MANIFEST_SKIP)
		goto out; /* withheld: never opened */
	if (S_ISREG(st.st_mode)) {
		if ((fd = openat(pfd, base, O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC)) < 0 ||
		    fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
			push_skip(x, path, MANIFEST_SKIP_CHANGED, 0);
			goto out;
		}
		if (st.st_nlink > 1) {
			/* A write through one name of a hard link changes the
			 * others, which the journal does not name: let the full
			 * scan see all of them (each is an independent file in
			 * the guest). */
			r = -ESTALE;
			goto out;
		}
		if ((r = push_ranged(s, fd, &st, path, &e)) == 1) {
			manifest_entry_clear(&e);
			e = (struct manifest_entry){0};
			if ((r = push_hash_file(s, fd, &st, &e)) == 0)
				unranged_del(s, path);
		}
		if (r < 0) {
			if (r == -ENOMEM)
				goto out;
			push_skip(x, path, r == -ESTALE ? MANIFEST_SKIP_CHANGED : MANIFEST_SKIP_ERROR,
				  r == -ESTALE ? 0 : -r);
			r = 0;
			goto out;
		}
	} else if (S_ISLNK(st.st_mode)) {
		char target[MANIFEST_TARGET_MAX + 1];
		ssize_t k = readlinkat(pfd, base, target, sizeof(target));
		if (k < 0) {
			push_skip(x, path, MANIFEST_SKIP_CHANGED, 0);
			goto out;
		}
		if (k == 0 || (size_t)k > MANIFEST_TARGET_MAX) {
			push_skip(x, path, MANIFEST_SKIP_TARGET, 0);
			goto out;
		}
		target[k] = '\0';
		e.type = MANIFEST_SYMLINK;
		e.target = target;
		e.path = (char *)path;
		r = manifest_add(m, &e);
		e = (struct manifest_entry){0};
		goto out;
	} else {
		push_skip(x, path, MANIFEST_SKIP_SPECIAL, 0);
		goto out;
	}
	e.path = (char *)path;
	r = manifest_add(m, &e);
	e.path = NULL;
out:
	manifest_entry_clear(&e);
	manifest_free(sub);
	if (fd >= 0)
		close(fd);
	if (pfd != s->cfg.dirfd)
		close(pfd);
	return r;
}

/* Add the generated .git/config when the new state has a .git directory
 * (m sealed; resealed). */
static int push_git_config(struct sync *s, struct manifest *m)
{
	int r;
	long gi = manifest_find(m, ".git");

	s->have_gitcfg = false;
	if (gi < 0 || m->e[gi].type != MANIFEST_DIR || manifest_find(m, SYNC_GIT_CONFIG) >= 0)
		return 0;
	buf_reset(&s->gitcfg);
	if ((r = sync_git_config(s->cfg.dirfd, SYNC_GIT_CONFIG, &s->gitcfg)) < 0)
		return r;
	struct manifest_entry e = {
	    .path = (char *)SYNC_GIT_CONFIG, .type = MANIFEST_FILE, .mode = 0644, .size = buf_len(&s->gitcfg)};
	chunk_hash(buf_ptr(&s->gitcfg), buf_len(&s->gitcfg), e.hash);
	memcpy(s->gitcfg_hash, e.hash, CHUNK_HASH_LEN);
	if ((r = manifest_add(m, &e)) < 0 || (r = manifest_seal(m)) < 0)
		return r;
	s->have_gitcfg = true;
	return 0;
}

/* A directory the policy keeps only for what is beneath it (DESCEND) must
 * go when the anchors took the last of that. Returns how many were found;
 * their paths are appended to *drop. */
static int push_empty_descend(struct sync *s, const struct manifest *m, char *const *anchors, size_t na, char ***drop,
			      size_t *ndrop)
{
	char p[MANIFEST_PATH_MAX + 1];
	int found = 0;

	for (size_t a = 0; a < na; a++) {
		strcpy(p, anchors[a]);
		for (char *sl = strrchr(p, '/'); sl; sl = strrchr(p, '/')) {
			*sl = '\0';
			long i = manifest_find(m, p);
			if (i < 0 || m->e[i].type != MANIFEST_DIR)
				break;
			if ((size_t)i + 1 < m->n && path_under(m->e[i + 1].path, p))
				break; /* still holds something */
			struct policy_verdict v;
			if (policy_check(s->cfg.policy, s->pctx, p, true, &v) < 0 || v.reason == POLICY_SYNCED)
				break;
			char **nv = mem_realloc(*drop, (*ndrop + 1) * sizeof(char *));
			if (!nv)
				return -ENOMEM;
			*drop = nv;
			if (!(nv[*ndrop] = mem_strdup(p)))
				return -ENOMEM;
			(*ndrop)++;
			found++;
		}
	}
	return found;
}

/* s->hm = s->known outside the anchors, the disk inside them. 0, PUSH_FULL
 * or -errno (why filled). */
static int push_build(struct sync *s, char **anchors, size_t na, char *why, size_t whylen)
{
	struct scan_ctx x = {.s = s};
	struct manifest *m = NULL;
	char **drop = NULL;
	size_t ndrop = 0;
	bool git = false;
	int r;

	records_drop_under(&s->withheld, anchors, na);
	records_drop_under(&s->skipped, anchors, na);
	for (int round = 0;; round++) {
		manifest_free(m);
		if ((r = manifest_new(&s->params, &m)) < 0)
			goto out;
		for (size_t i = 0; i < s->known->n; i++) {
			const struct manifest_entry *e = &s->known->e[i];
			if (anchor_holding(anchors, na, e->path) >= 0)
				continue;
			if (ndrop && anchor_holding(drop, ndrop, e->path) >= 0)
				continue;
			if ((r = manifest_add(m, e)) < 0)
				goto out;
		}
		for (size_t a = 0; a < na; a++) {
			if (round == 0 && path_under(SYNC_GIT_CONFIG, anchors[a]))
				git = true;
			if (ndrop && anchor_holding(drop, ndrop, anchors[a]) >= 0)
				continue;
			if (round == 0)
				r = push_scan_anchor(s, &x, anchors[a], m);
			else /* already decided: copy from the last round */
				r = 0;
			if (r == -ESTALE) {
				r = PUSH_FULL;
				goto out;
			}
			if (r < 0)
				goto out;
		}
		if (round > 0) {
			/* anchors' fresh entries of round 0, minus what is dropped */
			for (size_t i = 0; i < s->hm->n; i++) {
				const struct manifest_entry *e = &s->hm->e[i];
				if (anchor_holding(anchors, na, e->path) < 0 ||
				    anchor_holding(drop, ndrop, e->path) >= 0)
					continue;
				if ((r = manifest_add(m, e)) < 0)
					goto out;
			}
		}
		if (x.err) {
			r = x.err;
			goto out;
		}
		if ((r = manifest_seal(m)) < 0) {
			r = PUSH_FULL; /* not parent-closed: our idea of the tree is off */
			goto out;
		}
		manifest_free(s->hm);
		s->hm = m;
		m = NULL;
		if (round > 3) {
			r = PUSH_FULL;
			goto out;
		}
		if ((r = push_empty_descend(s, s->hm, anchors, na, &drop, &ndrop)) < 0)
			goto out;
		if (r == 0)
			break;
		qsort(drop, ndrop, sizeof(*drop), str_tree_cmp);
	}
	if (git && (r = push_git_config(s, s->hm)) < 0) {
		snprintf(why, whylen, ".git/config: %s (the guest gets a generated one; fix or shrink the host's)",
			 strerror(-r));
		goto out;
	}
	s->st.withheld = s->withheld.total;
	s->st.skipped = s->skipped.total;
	s->st.host_entries = s->hm->n;
	r = 0;
out:
	if (r < 0 && r != PUSH_FULL && !why[0])
		snprintf(why, whylen, "deciding the changed paths: %s", strerror(-r));
	for (size_t i = 0; i < ndrop; i++)
		mem_free(drop[i]);
	mem_free(drop);
	manifest_free(m);
	return r;
}

static int push_start(struct sync *s, const char *const *paths, size_t n)
{
	char why[512] = "";
	char **anchors = NULL;
	size_t na = 0;
	bool full = n > PUSH_ANCHORS_MAX || (n > 64 && n * 4 > s->known->n);
	int r = 0;

	for (size_t i = 0; i < n; i++)
		policy_ctx_note_change(s->pctx, paths[i]);
	reconcile_clear(s);
	s->busy = true;
	s->nfl = 0;
	memset(&s->prog, 0, sizeof(s->prog));
	memset(&s->push, 0, sizeof(s->push));
	s->push.paths = n;
	progress(s, "scan");
	if (!full && n && !(anchors = mem_calloc(n, sizeof(*anchors)))) {
		r = -ENOMEM;
		goto out;
	}
	for (size_t i = 0; i < n && !full; i++) {
		char a[MANIFEST_PATH_MAX + 1];
		if (anchor_for(s, paths[i], a) == PUSH_FULL) {
			full = true;
			break;
		}
		if (!(anchors[na] = mem_strdup(a))) {
			r = -ENOMEM;
			goto out;
		}
		na++;
	}
	if (!full && na) {
		qsort(anchors, na, sizeof(*anchors), str_tree_cmp);
		size_t k = 0;
		for (size_t i = 0; i < na; i++) {
			if (k && path_under(anchors[i], anchors[k - 1])) {
				mem_free(anchors[i]);
				continue;
			}
			anchors[k++] = anchors[i];
		}
		na = k;
		s->push.anchors = na;
		if ((r = push_build(s, anchors, na, why, sizeof(why))) == PUSH_FULL)
			full = true;
		else if (r < 0)
			goto out;
	} else if (!full) {
		/* nothing dirty: the state stays what the guest confirmed */
		if ((r = manifest_new(&s->params, &s->hm)) < 0)
			goto out;
		for (size_t i = 0; i < s->known->n && r == 0; i++)
			r = manifest_add(s->hm, &s->known->e[i]);
		if (r < 0 || (r = manifest_seal(s->hm)) < 0)
			goto out;
	}
	if (full) {
		/* a full scan against what the guest confirmed, no round trip */
		s->push.full = true;
		why[0] = '\0';
		if ((r = host_scan(s, why, sizeof(why))) < 0)
			goto out;
	}
	if ((r = start_send(s)) < 0)
		snprintf(why, sizeof(why), "comparing with the last confirmed state: %s", strerror(-r));
out:
	for (size_t i = 0; i < na; i++)
		mem_free(anchors[i]);
	mem_free(anchors);
	if (r < 0)
		fail(s, r, "%s", why[0] ? why : strerror(-r));
	return 0;
}

int sync_push_hinted(struct sync *s, const char *const *paths, const struct sync_hint *hints, size_t n)
{
	int r;

	if (s->busy)
		return -EBUSY;
	if (!s->known)
		return -EINVAL;
	s->nhints = 0;
	if (hints && n && (s->hints = mem_calloc(n, sizeof(*s->hints)))) {
		for (size_t i = 0; i < n; i++)
			if (hints[i].valid)
				s->hints[s->nhints++] = (struct hint_ref){.path = paths[i], .h = &hints[i]};
		qsort(s->hints, s->nhints, sizeof(*s->hints), hint_cmp);
	} /* without memory: no hints, every file hashed in full */
	r = push_start(s, paths, n);
	mem_free(s->hints);
	s->hints = NULL;
	s->nhints = 0;
	return r;
}

int sync_push_paths(struct sync *s, const char *const *paths, size_t n)
{
	return sync_push_hinted(s, paths, NULL, n);
}

const struct sync_push_stats *sync_get_push_stats(const struct sync *s)
{
	return &s->push;
}
