/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Journal -> pending set -> sync engine operations: the dirty-path set
 * with its content hints, pushes and reconciles, the applied barrier, the
 * latency window and the audit record (doc/UP.md, doc/SYNC.md).
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "airlock/content/manifest.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/mount/journal.h"
#include "airlock/policy/policy.h"
#include "airlock/sync/audit.h"
#include "airlock/sync/sync.h"
#include "cmd_i.h"
#include "up_i.h"

static uint64_t path_hash(const char *s)
{
	uint64_t h = 1469598103934665603ull; /* FNV-1a */
	for (; *s; s++)
		h = (h ^ (uint8_t)*s) * 1099511628211ull;
	return h;
}

static int pathset_grow(struct pathset *ps)
{
	size_t ncap = ps->cap ? ps->cap * 2 : 256;
	char **ns = mem_calloc(ncap, sizeof(*ns));
	struct sync_hint *nh = mem_calloc(ncap, sizeof(*nh));

	if (!ns || !nh) {
		mem_free(ns);
		mem_free(nh);
		return -ENOMEM;
	}
	for (size_t i = 0; i < ps->cap; i++) {
		if (!ps->slot[i])
			continue;
		size_t j = path_hash(ps->slot[i]) & (ncap - 1);
		while (ns[j])
			j = (j + 1) & (ncap - 1);
		ns[j] = ps->slot[i];
		nh[j] = ps->hint[i];
	}
	mem_free(ps->slot);
	mem_free(ps->hint);
	ps->slot = ns;
	ps->hint = nh;
	ps->cap = ncap;
	return 0;
}

/* The path's hint (added with an empty valid one when new), or NULL
 * without memory. */
static struct sync_hint *pathset_add(struct pathset *ps, const char *path)
{
	if ((ps->n + 1) * 2 > ps->cap && pathset_grow(ps) < 0)
		return NULL;
	size_t j = path_hash(path) & (ps->cap - 1);
	for (; ps->slot[j]; j = (j + 1) & (ps->cap - 1))
		if (!strcmp(ps->slot[j], path))
			return &ps->hint[j];
	if (!(ps->slot[j] = mem_strdup(path)))
		return NULL;
	ps->hint[j] = (struct sync_hint){.lo = UINT64_MAX, .hi = 0, .valid = true};
	ps->n++;
	return &ps->hint[j];
}

/* Fold one journal record into the hint of its path: writes and truncates
 * narrow what changed; anything that can change what the path names
 * (create, rename, link, unlink, rescan) makes the hint useless. */
static void hint_note(struct sync_hint *h, const struct journal_rec *r)
{
	switch (r->op) {
	case JOURNAL_WRITE:
		if (r->flags & JOURNAL_F_WHOLE) {
			h->valid = false;
			break;
		}
		for (uint32_t i = 0; i < r->nranges; i++) {
			uint64_t end = r->ranges[i].off + r->ranges[i].len;
			if (r->ranges[i].off < h->lo)
				h->lo = r->ranges[i].off;
			if (end > h->hi)
				h->hi = end;
		}
		break;
	case JOURNAL_TRUNCATE:
		if (r->size < h->lo)
			h->lo = r->size;
		h->resized = true;
		break;
	case JOURNAL_SETATTR:
	case JOURNAL_XATTR:
		break;
	default:
		h->valid = false;
	}
}

static void pathset_clear(struct pathset *ps)
{
	for (size_t i = 0; i < ps->cap; i++)
		mem_free(ps->slot[i]);
	mem_free(ps->slot);
	mem_free(ps->hint);
	*ps = (struct pathset){0};
}

static void lat_add(struct up_latency *lat, uint64_t ns)
{
	lat->ns[lat->next] = ns;
	lat->next = (lat->next + 1) % LAT_WINDOW;
	if (lat->n < LAT_WINDOW)
		lat->n++;
}

static void save_withheld(struct up *u);

void up_sync_save_audit(struct up *u)
{
	if (u->sync.engine)
		save_withheld(u);
}

static void save_withheld(struct up *u)
{
	size_t nw, ns;
	uint64_t tw, ts;
	char err[512];
	const struct sync_record *w = sync_withheld(u->sync.engine, &nw, &tw),
				 *s = sync_skipped(u->sync.engine, &ns, &ts);

	int r = audit_save_withheld(u->dir, policy_source(u->pol.policy), w, nw, tw, s, ns, ts, err, sizeof(err));
	up_state_wrote(u, AUDIT_WITHHELD_FILE, r); /* said once, in status until it works again */
	u->sync.withheld_saved = sync_get_stats(u->sync.engine)->withheld_changes;
}

static double us_between(uint64_t a, uint64_t b)
{
	return a && b >= a ? (double)(b - a) / 1e3 : -1;
}

/* AIRLOCK_TRACE: where a push's time went, from the first notify of its
 * changes (a FUSE thread, after the journal record) to its end here:
 * waiting for the loop, deciding, building and sending, the guest's apply
 * and acknowledgement, then what ran on the acknowledgement. -1: did not
 * happen (nothing to send). */
static void trace_push(struct up *u, uint64_t now)
{
	const struct sync_push_stats *p = sync_get_push_stats(u->sync.engine);

	fprintf(stderr,
		"airlock: trace: push paths=%zu queue_us=%.1f decide_us=%.1f send_us=%.1f ack_us=%.1f "
		"done_us=%.1f total_us=%.1f\n",
		u->sync.op_npaths, us_between(u->sync.op_t0_ns, u->sync.op_start_ns),
		us_between(u->sync.op_start_ns, p->t_decided_ns), us_between(p->t_decided_ns, p->t_sent_ns),
		us_between(p->t_sent_ns, p->t_acked_ns), us_between(p->t_acked_ns, now),
		us_between(u->sync.op_t0_ns, now));
}

static double ms_since(const struct up *u, uint64_t t)
{
	return t && u->mark_ns[UP_T_START] && t >= u->mark_ns[UP_T_START] ? (double)(t - u->mark_ns[UP_T_START]) / 1e6
									  : -1;
}

/* AIRLOCK_TRACE: when each step of the start happened, in ms since the
 * command began (-1: did not happen), and where the host scan's time went
 * (doc/UP.md "Tracing the start"). */
static void trace_start(struct up *u)
{
	const struct sync_stats *st = sync_get_stats(u->sync.engine);
	const uint64_t *m = u->mark_ns;

	fprintf(stderr,
		"airlock: trace: up policy_ms=%.1f daemon_ms=%.1f sandbox_ms=%.1f mount_ms=%.1f setup_ms=%.1f "
		"connect_ms=%.1f ready_ms=%.1f guest_state_ms=%.1f scan_end_ms=%.1f live_ms=%.1f; host scan "
		"%s early_ms=%.1f load_ms=%.1f walk_ms=%.1f check_ms=%.1f scan_ms=%.1f\n",
		ms_since(u, m[UP_T_POLICY]), ms_since(u, m[UP_T_DAEMON]), ms_since(u, m[UP_T_SANDBOX]),
		ms_since(u, m[UP_T_MOUNT]), ms_since(u, m[UP_T_SETUP]), ms_since(u, m[UP_T_CONNECT]),
		ms_since(u, m[UP_T_READY]), ms_since(u, st->state_ns), ms_since(u, st->scan_end_ns),
		ms_since(u, m[UP_T_LIVE]), st->scan_verified ? "unchanged" : "full", (double)st->scan_early_ns / 1e6,
		(double)st->scan_load_ns / 1e6, (double)st->scan_walk_ns / 1e6, (double)st->scan_check_ns / 1e6,
		(double)st->scan_ns / 1e6);
}

static void on_sync_done(int err, const char *why, void *ud)
{
	struct up *u = ud;
	uint64_t now = loop_now_ns();

	u->sync.busy = false;
	up_mark_dirty(u);
	if (err < 0) {
		up_drop_conn(u, err, why);
		return;
	}
	if (u->sync.op_upto > u->sync.applied_seq)
		u->sync.applied_seq = u->sync.op_upto;

	if (u->sync.op_t0_ns && now > u->sync.op_t0_ns)
		lat_add(&u->lat, now - u->sync.op_t0_ns);
	if (u->sync.trace && !u->sync.op_full)
		trace_push(u, now);
	u->sync.withheld = sync_get_stats(u->sync.engine)->withheld;
	/* the audit record follows the host tree: after a reconcile, and
	 * when a push changed what is withheld */
	if (u->sync.op_full || sync_get_stats(u->sync.engine)->withheld_changes != u->sync.withheld_saved)
		save_withheld(u);
	if (u->sync.op_full) {
		const struct sync_stats *st = sync_get_stats(u->sync.engine);
		fprintf(stderr,
			"airlock: reconcile: host scan %.1f ms (%s%s), %" PRIu64 " files read, %" PRIu64
			" levels, %" PRIu64 " changes\n",
			(double)st->scan_ns / 1e6, st->scan_verified ? "unchanged since the last scan" : "full scan: ",
			st->scan_verified ? "" : st->scan_note, st->scan_hashed, st->levels, st->changes);
	}
	up_changes_synced(u, u->sync.op_full);
	if (u->conn.state == UP_RECONCILING) {
		bool first = !u->mark_ns[UP_T_LIVE];
		up_mark(u, UP_T_LIVE);
		up_conn_live(u);
		if (first && u->sync.trace)
			trace_start(u);
	}
	up_paths_synced(u);
}

#define PROGRESS_TTY_MS	 250u  /* a terminal's line is redrawn this often */
#define PROGRESS_LINE_MS 5000u /* otherwise one line this often */

/* Reconciles (the first sync of each connection) show files, bytes, rate
 * and ETA; pushes are too short to need it. */
static void on_sync_progress(const struct sync_progress *p, void *ud)
{
	struct up *u = ud;
	struct up_progress *pg = &u->progress;
	int tty = up_log_term_fd();
	bool on_tty = tty >= 0 && isatty(tty), done = !strcmp(p->phase, "done");
	uint64_t now = loop_now_ms();

	if (pg->quiet || !u->sync.op_full)
		return;
	if (!pg->t0_ms || !strcmp(p->phase, "scan"))
		pg->t0_ms = now;
	if (done) {
		if (pg->drawn)
			dprintf(tty, "\r\033[K");
		pg->drawn = false;
		pg->t0_ms = 0;
		return;
	}
	if (now - pg->last_ms < (on_tty ? PROGRESS_TTY_MS : PROGRESS_LINE_MS))
		return;
	pg->last_ms = now;
	double secs = (double)(now - pg->t0_ms) / 1000.0, rate = secs > 0 ? (double)p->bytes_done / secs : 0;
	double eta = rate > 0 ? (double)(p->bytes_total - p->bytes_done) / rate : -1;
	char line[PATH_MAX + 256];
	if (!p->files_total) /* still comparing: no totals yet */
		snprintf(line, sizeof(line), "airlock: %s: %s... (%.0f s)", u->dir, p->phase, secs);
	else
		snprintf(line, sizeof(line),
			 "airlock: %s: %s %" PRIu64 "/%" PRIu64 " files, %.1f/%.1f MiB, %.1f MiB/s, %s%.0f s left",
			 u->dir, p->phase, p->files_done, p->files_total, (double)p->bytes_done / 1048576.0,
			 (double)p->bytes_total / 1048576.0, rate / 1048576.0, eta < 0 ? "ETA ?" : "",
			 eta < 0 ? 0.0 : eta);
	if (on_tty) {
		dprintf(tty, "\r\033[K%s", line);
		pg->drawn = true;
	} else {
		fprintf(stderr, "%s\n", line);
	}
}

static const struct sync_ops engine_ops = {
    .on_progress = on_sync_progress,
    .on_done = on_sync_done,
};

/* Take the time of the first notify since the last take. */
static uint64_t take_notify_time(struct up *u)
{
	return atomic_exchange(&u->first_notify_ns, 0);
}

/* An apply temporary (MANIFEST_RESERVED_PREFIX) at or above path: the
 * write-back's staging through the mount (doc/SYNC.md §10). Never synced;
 * as a dirty path it would make the push fall back to a full scan. */
static bool reserved_path(const char *path)
{
	static const char pre[] = MANIFEST_RESERVED_PREFIX;

	for (const char *c = path; c; c = strchr(c, '/') ? strchr(c, '/') + 1 : NULL)
		if (!strncmp(c, pre, sizeof(pre) - 1))
			return true;
	return false;
}

/* One journal record into the pending set; past PENDING_MAX paths (or a
 * root rescan, or without memory) the set gives way to a full reconcile. */
static void pending_note(struct up_sync *sy, const struct journal_rec *r)
{
	struct sync_hint *h1 = NULL, *h2 = NULL;
	bool skip1 = reserved_path(r->path), skip2 = !r->path2 || reserved_path(r->path2);

	if (sy->pending_full || (skip1 && skip2))
		return;
	if (r->op == JOURNAL_RESCAN && !r->path[0])
		sy->pending_full = true;
	else if ((!skip1 && !(h1 = pathset_add(&sy->pending, r->path))) ||
		 (!skip2 && !(h2 = pathset_add(&sy->pending, r->path2))))
		sy->pending_full = true;
	else if (sy->pending.n > PENDING_MAX)
		sy->pending_full = true;
	else {
		if (h1)
			hint_note(h1, r);
		if (h2)
			hint_note(h2, r);
	}
	if (sy->pending_full)
		pathset_clear(&sy->pending);
}

/* Move everything journaled into the pending set. */
static void drain_journal(struct up *u)
{
	struct journal_rec recs[DRAIN_BATCH];
	uint64_t t = take_notify_time(u), upto = 0;
	size_t n, total = 0;

	do {
		n = journal_drain(u->journal, recs, DRAIN_BATCH, &upto);
		for (size_t i = 0; i < n; i++) {
			pending_note(&u->sync, &recs[i]);
			journal_rec_clear(&recs[i]);
		}
		total += n;
	} while (n == DRAIN_BATCH);
	if (!total)
		return;
	up_touch(u);
	if (upto > u->sync.pending_upto)
		u->sync.pending_upto = upto;
	if (!u->sync.pending_t0_ns)
		u->sync.pending_t0_ns = t ? t : loop_now_ns();
	up_mark_dirty(u);
}

void up_sync_reconcile(struct up *u)
{
	int r;

	/* a reconcile covers everything journaled so far */
	drain_journal(u);
	if (u->sync.prescan) {
		/* its walk may have passed a path changed since it began */
		if (journal_barrier_seq(u->journal) == u->sync.prescan_seq)
			sync_set_prescan(u->sync.engine, u->sync.prescan);
		else
			sync_prescan_free(u->sync.prescan);
		u->sync.prescan = NULL;
	}
	up_changes_reconcile_begin(u);
	pathset_clear(&u->sync.pending);
	u->sync.pending_full = false;
	u->sync.op_upto = u->sync.pending_upto > journal_barrier_seq(u->journal) ? u->sync.pending_upto
										 : journal_barrier_seq(u->journal);
	u->sync.op_t0_ns =
	    u->conn.state == UP_LIVE ? u->sync.pending_t0_ns : 0; /* only live rescans count as latency */
	u->sync.pending_t0_ns = 0;
	u->sync.op_full = true;
	u->sync.op_npaths = 1;
	u->sync.busy = true;
	up_mark_dirty(u);
	if ((r = sync_reconcile(u->sync.engine)) < 0) {
		u->sync.busy = false;
		up_drop_conn(u, r, "starting the reconcile failed");
	}
}

static void start_push(struct up *u)
{
	const char **paths;
	struct sync_hint *hints;
	size_t n = 0;
	int r;

	if (u->sync.pending_full) {
		up_sync_reconcile(u);
		return;
	}
	paths = mem_calloc(u->sync.pending.n ? u->sync.pending.n : 1, sizeof(*paths));
	hints = mem_calloc(u->sync.pending.n ? u->sync.pending.n : 1, sizeof(*hints));
	if (!paths || !hints) {
		mem_free(paths);
		mem_free(hints);
		u->sync.pending_full = true;
		pathset_clear(&u->sync.pending);
		return;
	}
	for (size_t i = 0; i < u->sync.pending.cap; i++)
		if (u->sync.pending.slot[i]) {
			hints[n] = u->sync.pending.hint[i];
			paths[n++] = u->sync.pending.slot[i];
		}
	u->sync.op_upto = u->sync.pending_upto;
	u->sync.op_t0_ns = u->sync.pending_t0_ns;
	u->sync.op_full = false;
	u->sync.op_npaths = n;
	u->sync.pending_t0_ns = 0;
	u->sync.busy = true;
	u->sync.op_start_ns = loop_now_ns();
	up_mark_dirty(u);
	r = sync_push_hinted(u->sync.engine, paths, hints, n); /* may finish (on_done) before it returns */
	mem_free(paths);
	mem_free(hints);
	pathset_clear(&u->sync.pending);
	if (r < 0) {
		u->sync.busy = false;
		up_drop_conn(u, r, "starting a push failed");
	}
}

static struct sync_cfg engine_cfg(struct up *u)
{
	return (struct sync_cfg){
	    .dirfd = u->dirfd,
	    .policy = u->pol.policy,
	    .sign_sk = u->conn.g.sync_sk,
	    .sign_pk = u->conn.g.sync_pk,
	    .guest_pub = u->conn.g.guest_pub,
	    .ops = &engine_ops,
	    .ud = u,
	    .state_dir = u->state_dir,
	    .loop = u->loop, /* full scans off the loop: `airlock down` is answered during one */
	    .keep = up_changes_keep,
	};
}

int up_sync_attach(struct up *u, struct chan *c)
{
	struct sync_cfg cfg = engine_cfg(u);
	const char *tr = getenv("AIRLOCK_TRACE");

	u->sync.trace = tr && *tr && strcmp(tr, "0") != 0;
	return sync_new(c, &cfg, &u->sync.engine);
}

/*
 * An open with O_TRUNC journals the truncation, and the write that follows
 * comes a few microseconds later: pushed at once, the emptied file went
 * out alone and the new bytes one acknowledgement later (two pushes per
 * save, 1.7 per edit in bench/scale.sh's trace). So a pending set of
 * nothing but existing files truncated to zero and not written since
 * waits for that write, at most TRUNC_HOLD_MS from the truncation, and not
 * at all while a command or a sync_wait waits for its barrier. The write's
 * journal record wakes the loop (the journal was drained empty).
 */
#define TRUNC_HOLD_MS 2

static bool only_truncations(const struct pathset *ps)
{
	for (size_t i = 0; i < ps->cap; i++) {
		const struct sync_hint *h = &ps->hint[i];
		if (ps->slot[i] && !(h->valid && h->resized && h->lo == 0 && h->hi == 0))
			return false;
	}
	return ps->n > 0;
}

static void hold_over(struct loop *l, void *ud)
{
	struct up *u = ud;
	(void)l;

	u->sync.hold_timer = 0;
	up_sync_pump(u);
}

static bool hold_truncations(struct up *u)
{
	uint64_t age_ns = loop_now_ns() - u->sync.pending_t0_ns, hold_ns = TRUNC_HOLD_MS * 1000000ull;

	if (u->sync.pending_full || age_ns >= hold_ns || !only_truncations(&u->sync.pending) ||
	    up_exec_barrier_waiting(u))
		return false;
	if (!u->sync.hold_timer)
		u->sync.hold_timer = loop_add_timer(u->loop, (hold_ns - age_ns + 999999) / 1000000, hold_over, u);
	return u->sync.hold_timer != 0; /* without memory for the timer: push now */
}

void up_sync_prescan(struct up *u)
{
	struct sync_cfg cfg = engine_cfg(u);

	/* the seq first: anything journaled from here on may be behind the walk */
	u->sync.prescan_seq = journal_barrier_seq(u->journal);
	if (sync_prescan_start(&cfg, &u->sync.prescan) < 0)
		u->sync.prescan = NULL; /* the reconcile proves it itself */
}

void up_sync_pump(struct up *u)
{
	/* a push that finishes at once leaves room for the next */
	for (int i = 0; i < 4 && u->conn.state == UP_LIVE && !u->sync.busy; i++) {
		drain_journal(u);
		if (!u->sync.pending_full && !u->sync.pending.n)
			break;
		if (hold_truncations(u))
			break;
		if (u->sync.hold_timer) {
			loop_del_timer(u->loop, u->sync.hold_timer);
			u->sync.hold_timer = 0;
		}
		start_push(u);
	}
	if (u->conn.state == UP_LIVE && u->sync.busy)
		drain_journal(u); /* coalesce into the next push */
}

bool up_sync_settled(struct up *u)
{
	return u->conn.state == UP_LIVE && !u->sync.busy && !u->sync.pending_full && !u->sync.pending.n &&
	       journal_pending(u->journal) == 0;
}

size_t up_sync_pending(struct up *u)
{
	return journal_pending(u->journal) + u->sync.pending.n + (u->sync.pending_full ? 1 : 0) +
	       (u->sync.busy ? u->sync.op_npaths + 1 : 0);
}

void up_sync_retry(struct up *u, const char *const *paths, size_t n, bool full)
{
	for (size_t i = 0; i < n && !full; i++) {
		struct sync_hint *h = pathset_add(&u->sync.pending, paths[i]);
		if (!h)
			full = true;
		else
			h->valid = false; /* hash it whole */
	}
	if (full) {
		pathset_clear(&u->sync.pending);
		u->sync.pending_full = true;
	}
	up_mark_dirty(u);
	up_sync_pump(u);
}

uint64_t up_sync_sent_seq(struct up *u)
{
	if (u->sync.busy && u->sync.engine && sync_all_sent(u->sync.engine) && u->sync.op_upto > u->sync.applied_seq)
		return u->sync.op_upto;
	return u->sync.applied_seq;
}

void up_sync_clear(struct up *u)
{
	sync_prescan_free(u->sync.prescan);
	u->sync.prescan = NULL;
	up_paths_clear(u);
	sync_free(u->sync.engine);
	sync_free(u->sync.dead);
	u->sync.engine = u->sync.dead = NULL;
	pathset_clear(&u->sync.pending);
}
