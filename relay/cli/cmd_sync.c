/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock sync DIR: one-shot mirror of a workspace into a guest. Loads the
 * policy, connects and handshakes like `airlock ping`, says HELLO with the
 * sync-signing key, runs the sync engine (sync.h) on a sync stream, and
 * exits 0 only when the guest acknowledged every batch. Withheld paths go
 * to the audit record (audit.h).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/transport.h"
#include "airlock/core/wire.h"
#include "airlock/policy/policy.h"
#include "airlock/sync/audit.h"
#include "airlock/sync/sync.h"
#include "cmd_i.h"
#include "guestopt_i.h"

#define PROGRESS_MS 100u /* at most 10 updates a second */

struct synccmd {
	struct loop *loop;
	struct chan *chan;
	struct sync *sync;
	const uint8_t *sync_sk, *sync_pk, *guest_pub; /* the loaded keys (guest_opts) */
	const struct policy *policy;
	int dirfd;
	const char *guest;
	char state_dir[4096]; /* hash cache; "" = none */
	bool tty, done, hello_ok;
	int err;
	char why[1024];
	uint64_t t0_ns, timer, ptimer;
	struct sync_progress prog;
	bool have_prog;
	struct chan_stats last; /* wire totals when the chan went away */
};

static void fail(struct synccmd *x, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(struct synccmd *x, int err, const char *fmt, ...)
{
	va_list ap;

	if (x->err)
		return;
	x->err = err ? err : -EPROTO;
	va_start(ap, fmt);
	vsnprintf(x->why, sizeof(x->why), fmt, ap);
	va_end(ap);
	loop_stop(x->loop);
}

static void show_progress(struct synccmd *x, bool final)
{
	struct chan_stats st = x->last;
	if (x->chan)
		chan_get_stats(x->chan, &st);
	double secs = (double)(loop_now_ns() - x->t0_ns) / 1e9;
	double rate = secs > 0 ? (double)st.bytes_out / 1048576.0 / secs : 0;
	fprintf(stderr, "\r\033[K%-9s files %" PRIu64 "/%" PRIu64 "  %.1f/%.1f MiB  wire %.1f MiB  %.1f MiB/s",
		x->have_prog ? x->prog.phase : "connect", x->prog.files_done, x->prog.files_total,
		(double)x->prog.bytes_done / 1048576.0, (double)x->prog.bytes_total / 1048576.0,
		(double)st.bytes_out / 1048576.0, rate);
	if (final)
		fputs("\r\033[K", stderr);
	fflush(stderr);
}

static void on_ptimer(struct loop *l, void *ud)
{
	struct synccmd *x = ud;

	show_progress(x, false);
	x->ptimer = loop_add_timer(l, PROGRESS_MS, on_ptimer, x);
}

static void on_sync_progress(const struct sync_progress *p, void *ud)
{
	struct synccmd *x = ud;

	x->prog = *p;
	x->have_prog = true;
}

static void on_sync_done(int err, const char *why, void *ud)
{
	struct synccmd *x = ud;

	if (err < 0) {
		fail(x, err, "%s", why ? why : strerror(-err));
		return;
	}
	x->done = true;
	chan_get_stats(x->chan, &x->last);
	chan_close(x->chan);
}

static const struct sync_ops engine_ops = {
    .on_progress = on_sync_progress,
    .on_done = on_sync_done,
};

/* ---- frames from the agent ---- */

typedef void frame_fn(struct synccmd *x, uint32_t stream, struct buf *in);

static void handle_hello_ok(struct synccmd *x, uint32_t stream, struct buf *in)
{
	const char *why = guest_hello_ok_why(in);
	(void)stream;

	if (why) {
		fail(x, -EPROTO, "%s", why);
		return;
	}
	x->hello_ok = true;
}

static void handle_error(struct synccmd *x, uint32_t stream, struct buf *in)
{
	struct wire_error m;

	if (wire_error_decode(in, &m) < 0) {
		fail(x, -EPROTO, "guest reported a malformed error");
	} else if (x->sync && stream == sync_stream(x->sync)) {
		sync_on_error(x->sync, m.code, m.msg);
	} else {
		fail(x, m.code > 0 && m.code < 4096 ? -(int)m.code : -EPROTO, "guest reported an error: %s (%s)", m.msg,
		     strerror((int)m.code));
	}
	wire_error_clear(&m);
}

/* the session's frames; logs name them with wire_type_name */
static frame_fn *const handlers[WIRE_TYPE_MAX + 1] = {
    [WIRE_HELLO_OK] = handle_hello_ok,
    [WIRE_ERROR] = handle_error,
};

static void on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *data, size_t n, void *ud)
{
	struct synccmd *x = ud;
	struct buf in;
	(void)c;

	if (wire_group_of(type) == WIRE_GROUP_SYNC) {
		if (x->sync)
			sync_on_frame(x->sync, type, stream, data, n);
		return;
	}
	if (!handlers[type]) {
		fail(x, -EPROTO, "unexpected frame %s (%u) from the guest", wire_type_name(type), type);
		return;
	}
	buf_view(&in, data, n);
	handlers[type](x, stream, &in);
}

static void on_ready(struct chan *c, void *ud)
{
	struct synccmd *x = ud;
	int r;

	if ((r = guest_hello_send(c, x->sync_pk, "airlock sync")) < 0) {
		fail(x, r, "hello: %s", strerror(-r));
		return;
	}
	struct sync_cfg cfg = {
	    .dirfd = x->dirfd,
	    .policy = x->policy,
	    .sign_sk = x->sync_sk,
	    .sign_pk = x->sync_pk,
	    .guest_pub = x->guest_pub,
	    .ops = &engine_ops,
	    .ud = x,
	    .state_dir = x->state_dir[0] ? x->state_dir : NULL,
	};
	/* For bench/sync.sh only: try another chunk size (min avg/4, max
	 * 4 x avg, whole files up to 2 x avg). Both sides follow SYNC_BEGIN. */
	struct chunk_params cp;
	const char *avg = getenv("AIRLOCK_BENCH_CHUNK_AVG");
	if (avg) {
		cp.avg = (uint32_t)strtoul(avg, NULL, 0);
		cp.min = cp.avg / 4;
		cp.max = cp.avg * 4;
		cp.whole_max = cp.avg * 2;
		if (chunk_params_check(&cp) < 0) {
			fail(x, -EINVAL, "AIRLOCK_BENCH_CHUNK_AVG=%s: not a usable chunk size", avg);
			return;
		}
		cfg.chunking = &cp;
	}
	if ((r = sync_new(c, &cfg, &x->sync)) < 0 || (r = sync_reconcile(x->sync)) < 0)
		fail(x, r, "starting the sync: %s", strerror(-r));
}

static void on_writable(struct chan *c, void *ud)
{
	struct synccmd *x = ud;
	(void)c;

	if (x->sync)
		sync_on_writable(x->sync);
}

static void on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct synccmd *x = ud;

	chan_get_stats(c, &x->last);
	if (err == 0 && !x->done)
		fail(x, -ECONNRESET, "guest closed the session before confirming the sync");
	else if (err < 0 && !x->done)
		fail(x, err, "%s", why ? why : strerror(-err));
	/* The engine keeps its (now dangling) chan pointer but is never
	 * called again: nothing feeds it after this. Its stats and records
	 * are read after the loop. */
	x->chan = NULL;
	chan_free(c);
	loop_stop(x->loop);
}

static const struct chan_ops sync_chan_ops = {
    .on_ready = on_ready,
    .on_frame = on_frame,
    .on_writable = on_writable,
    .on_close = on_close,
};

static void on_timeout(struct loop *l, void *ud)
{
	struct synccmd *x = ud;
	(void)l;

	x->timer = 0;
	fail(x, -ETIMEDOUT, "timed out (phase: %s); raise --timeout for very large trees",
	     x->have_prog ? x->prog.phase : "connect");
}

/* The command line into g, *policy_file, *dir and *json. 0, or -1 (exit 2). */
static int parse_args(struct guest_opts *g, const char **policy_file, const char **dir, bool *json, int argc,
		      char **argv)
{
	static const struct option opts[] = {
	    GUEST_OPTS_LONG,	     {"policy", required_argument, NULL, 'P'}, GUEST_OPTS_PSK_LONG,
	    GUEST_OPTS_TIMEOUT_LONG, {"json", no_argument, NULL, 'j'},	       {NULL, 0, NULL, 0},
	};
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if ((r = guest_opts_parse(g, c, optarg)) < 0)
			return -1;
		if (r > 0)
			continue;
		if (c == 'P') {
			*policy_file = optarg;
		} else if (c == 'j') {
			*json = true;
		} else {
			cmd_usage("sync");
			return -1;
		}
	}
	if (cmd_operands("sync", argc, argv, optind, 1, "DIR (the directory to mirror)") < 0)
		return -1;
	if (!guest_opts_complete(g)) {
		cmd_usage("sync");
		return -1;
	}
	*dir = argv[optind];
	return 0;
}

/* The workspace: its directory, its policy, the hash cache's directory.
 * 0, or -1 after saying why (exit 2). */
static int open_workspace(struct synccmd *x, const char *dir, const char *policy_file, struct policy **policy)
{
	char err[1024];

	if ((x->dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		cmd_err("sync: workspace %s: %s", dir, strerror(errno));
		return -1;
	}
	if (policy_load_for_workspace(dir, policy_file, policy, err, sizeof(err)) < 0) {
		cmd_err("policy: %s", err);
		return -1;
	}
	if (policy_ignored_note(*policy, err, sizeof(err)))
		cmd_err("%s", err);
	x->policy = *policy;
	/* hash cache beside the audit record; without one every file is hashed */
	if (audit_dir(dir, 1, x->state_dir, sizeof(x->state_dir), err, sizeof(err)) < 0)
		x->state_dir[0] = '\0';
	return 0;
}

/* Connect and run the sync until the guest confirms it or it fails
 * (x->err). 0, or -1 when it could not start (said why). */
static int run_sync(struct synccmd *x, const struct guest_opts *g)
{
	char err[512];
	int fd;

	if (!(x->loop = loop_new())) {
		cmd_err("out of memory");
		return -1;
	}
	signal(SIGPIPE, SIG_IGN);
	x->tty = isatty(STDERR_FILENO);
	x->t0_ns = loop_now_ns();
	if ((fd = transport_connect(&g->addr, 30000, err, sizeof(err))) < 0) {
		cmd_err("sync: %s", err);
		return -1;
	}
	struct chan_cfg cfg = guest_opts_chan_cfg(g);
	if (!(x->chan = chan_new(x->loop, fd, &cfg, &sync_chan_ops, x))) {
		cmd_err("out of memory");
		return -1;
	}
	x->timer = loop_add_timer(x->loop, g->timeout_s * 1000, on_timeout, x);
	if (x->tty)
		x->ptimer = loop_add_timer(x->loop, PROGRESS_MS, on_ptimer, x);
	loop_run(x->loop);
	if (x->tty)
		show_progress(x, true);
	return 0;
}

/* The audit record is written whenever the host tree was scanned, also
 * when the guest then failed: what was withheld is a fact of the host
 * tree. */
static void save_audit(const struct synccmd *x, const char *dir, const struct policy *policy)
{
	size_t nw, ns;
	uint64_t tw, ts;
	char err[1024];
	const struct sync_record *w = sync_withheld(x->sync, &nw, &tw), *s = sync_skipped(x->sync, &ns, &ts);

	if (sync_get_stats(x->sync)->host_entries &&
	    audit_save_withheld(dir, policy_source(policy), w, nw, tw, s, ns, ts, err, sizeof(err)) < 0)
		cmd_err("audit record: %s", err);
	for (size_t i = 0; i < ns && i < 20; i++)
		cmd_err("skipped %s: %s", s[i].path, s[i].rule);
	if (ns > 20)
		cmd_err("... and %" PRIu64 " more skipped (airlock audit -C %s)", ts - 20, dir);
}

static int report_json(const struct synccmd *x, const char *dir, double secs)
{
	const struct sync_stats *st = sync_get_stats(x->sync);
	uint64_t wire = x->last.bytes_out + x->last.bytes_in;
	json_t *o = json_pack(
	    "{s:i, s:s, s:s, s:b, s:f, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, s:I, "
	    "s:I, "
	    "s:I, s:I, s:I, s:I, s:I}",
	    "version", 1, "workspace", dir, "guest", x->guest, "ok", 1, "seconds", secs, "files_sent",
	    (json_int_t)st->files, "symlinks_sent", (json_int_t)st->symlinks, "dirs_made", (json_int_t)st->dirs,
	    "chmods", (json_int_t)st->chmods, "deleted", (json_int_t)st->deleted, "changes", (json_int_t)st->changes,
	    "content_bytes", (json_int_t)st->content_bytes, "batch_bytes", (json_int_t)st->batch_bytes, "batches",
	    (json_int_t)st->batches, "wire_bytes", (json_int_t)wire, "wire_bytes_out", (json_int_t)x->last.bytes_out,
	    "wire_bytes_in", (json_int_t)x->last.bytes_in, "withheld", (json_int_t)st->withheld, "skipped",
	    (json_int_t)st->skipped, "vanished", (json_int_t)st->vanished, "host_entries", (json_int_t)st->host_entries,
	    "guest_levels", (json_int_t)st->levels, "kept_dirs", (json_int_t)st->kept_dirs, "guest_seq",
	    (json_int_t)st->guest_seq);

	return cmd_print_json(o);
}

static void report_text(const struct synccmd *x, const char *dir, double secs)
{
	const struct sync_stats *st = sync_get_stats(x->sync);
	uint64_t wire = x->last.bytes_out + x->last.bytes_in;

	printf("synced %s to %s: %" PRIu64 " files sent (%.1f MiB), %" PRIu64 " deleted, %.1f MiB on the "
	       "wire, %" PRIu64 " withheld, %" PRIu64 " skipped, %.2f s\n",
	       dir, x->guest, st->files + st->symlinks, (double)st->content_bytes / 1048576.0, st->deleted,
	       (double)wire / 1048576.0, st->withheld, st->skipped, secs);
}

int cmd_sync(int argc, char **argv)
{
	struct synccmd x = {.dirfd = -1};
	struct guest_opts g;
	struct policy *policy = NULL;
	const char *policy_file = NULL, *dir;
	bool json = false;
	int status = 1;

	guest_opts_init(&g, "sync", 3600);
	if (parse_args(&g, &policy_file, &dir, &json, argc, argv) < 0)
		return 2;
	x.guest = g.guest;
	if (open_workspace(&x, dir, policy_file, &policy) < 0) {
		status = 2;
		goto out;
	}
	if ((status = guest_opts_load(&g)) != 0)
		goto out;
	status = 1;
	x.sync_sk = g.sync_sk;
	x.sync_pk = g.sync_pk;
	x.guest_pub = g.guest_pub;
	if (run_sync(&x, &g) < 0)
		goto out;
	if (x.sync)
		save_audit(&x, dir, policy);
	if (x.err) {
		cmd_err("sync %s to %s: %s", dir, x.guest, x.why);
		goto out;
	}
	double secs = (double)(loop_now_ns() - x.t0_ns) / 1e9;
	if (json && report_json(&x, dir, secs) < 0)
		goto out;
	if (!json)
		report_text(&x, dir, secs);
	if (sync_get_stats(x.sync)->vanished)
		cmd_err("%" PRIu64 " files changed or vanished while being sent; run the sync again",
			sync_get_stats(x.sync)->vanished);
	status = 0;
out:
	if (x.chan)
		chan_free(x.chan);
	if (x.timer)
		loop_del_timer(x.loop, x.timer);
	if (x.ptimer)
		loop_del_timer(x.loop, x.ptimer);
	sync_free(x.sync);
	loop_free(x.loop);
	policy_free(policy);
	if (x.dirfd >= 0)
		close(x.dirfd);
	guest_opts_clear(&g);
	return status;
}
