/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The status file the daemon writes, and its readers: `airlock status`
 * and `airlock sync-wait` (doc/UP.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/egress/egress_link.h"
#include "airlock/mount/journal.h"
#include "airlock/policy/policy.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/sync/audit.h"
#include "airlock/sync/writeback.h"
#include "cmd_i.h"
#include "up_i.h"

static const char *const state_names[] = {"disconnected", "connecting", "reconciling", "live"};

#define STATE_RETRY_MS 1000u /* failed state files written again at most this often */

static void on_status_timer(struct loop *l, void *ud)
{
	struct up *u = ud;
	(void)l;

	u->status.timer = 0;
	up_status_write(u);
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static bool policy_changed(struct up *u)
{
	struct stat st;
	int r;

	if (!u->pol.abs[0])
		return false;
	/* through the backing directory: never stat through our own mount
	 * from the loop thread */
	r = u->pol.rel[0] ? fstatat(u->dirfd, u->pol.rel, &st, 0) : stat(u->pol.abs, &st);
	if (r < 0)
		return true; /* deleted or renamed away since start */
	return st.st_mtim.tv_sec != u->pol.mtime.tv_sec || st.st_mtim.tv_nsec != u->pol.mtime.tv_nsec;
}

/* p50 and p99 of the latency window, in ms (0 without samples). */
static void lat_percentiles(const struct up_latency *lat, double *p50, double *p99)
{
	uint64_t sorted[LAT_WINDOW];

	*p50 = *p99 = 0;
	if (!lat->n)
		return;
	memcpy(sorted, lat->ns, lat->n * sizeof(sorted[0]));
	qsort(sorted, lat->n, sizeof(sorted[0]), cmp_u64);
	*p50 = (double)sorted[(lat->n - 1) * 50 / 100] / 1e6;
	*p99 = (double)sorted[(lat->n - 1) * 99 / 100] / 1e6;
}

/* The sandbox's part of the status (with the embedded sandbox only). */
static json_t *sandbox_json(const struct up_sandbox *sb)
{
	return json_pack("{s:s, s:s, s:s, s:s, s:I, s:I, s:f, s:s}", "sandbox", sandbox_kind_name(sb->cfg.kind),
			 "sandbox_describe", sb->describe, "sandbox_dir", sb->dir, "sandbox_state",
			 sb->sb		    ? "running"
			 : sb->idle_stopped ? "idle-stopped"
					    : "stopped",
			 "ttl_seconds", (json_int_t)sb->ttl_s, "idle_ms",
			 (json_int_t)(loop_now_ms() - sb->last_active_ms), "sandbox_start_ms",
			 sb->sb ? sandbox_start_ms(sb->sb) : 0.0, "sandbox_boot", sb->boot[0] ? sb->boot : "cold");
}

static json_t *egress_json(struct egress_link *egress)
{
	struct egress_link_stats es;

	egress_link_get_stats(egress, &es);
	return json_pack("{s:I, s:I, s:I, s:I}", "streams", (json_int_t)es.tunnels, "opened", (json_int_t)es.opened,
			 "refused", (json_int_t)es.refused, "denials", (json_int_t)es.denials);
}

/* An untrusted policy's ignored keys and the note naming them (doc/UP.md
 * "Trust"): {"keys": [...], "note": "..."}, keys empty when none. */
static json_t *ignored_json(const struct policy *p)
{
	const struct policy_list *ig = policy_ignored(p);
	json_t *keys = json_array();
	char note[1024];

	for (size_t i = 0; keys && i < ig->n; i++)
		json_array_append_new(keys, json_string(ig->v[i]));
	policy_ignored_note(p, note, sizeof(note));
	return json_pack("{s:o?, s:s}", "keys", keys, "note", note);
}

/* What a failed write of each state file costs, for its stderr line. */
static const char *werr_cost(const char *file)
{
	static const struct {
		const char *file, *cost;
	} costs[] = {
	    {UP_STATUS_FILE, "airlock status and sync-wait see stale state"},
	    {AUDIT_WITHHELD_FILE, "airlock audit shows an older record"},
	    {WB_STORE_FILE, "the guest changes waiting for review are kept in memory only (a crash of the daemon "
			    "forgets them; the guest still holds them)"},
	    {UP_CONFIRMED_FILE, "a reconcile after a crash cannot tell guest changes no report named"},
	    {UP_STASH_FILES, "the guest's version of a conflict stays in the guest only"},
	};
	for (size_t i = 0; i < sizeof(costs) / sizeof(costs[0]); i++)
		if (!strcmp(costs[i].file, file))
			return costs[i].cost;
	return "what it records is stale";
}

void up_state_wrote(struct up *u, const char *file, int r)
{
	struct up_status *st = &u->status;
	size_t i = 0;

	while (i < st->nwerr && strcmp(st->werr[i].file, file))
		i++;
	int was = i < st->nwerr ? st->werr[i].err : 0;
	if (r < 0 && r != was)
		cmd_err("up: cannot write %s/%s: %s; %s until the state directory is writable again", u->state_dir,
			file, strerror(-r), werr_cost(file));
	else if (r == 0 && was)
		cmd_err("up: %s/%s is written again", u->state_dir, file);
	if (r < 0 && i == st->nwerr && i < UP_WERR_MAX) {
		snprintf(st->werr[i].file, sizeof(st->werr[i].file), "%s", file);
		st->nwerr++;
	}
	if (r < 0 && i < st->nwerr)
		st->werr[i].err = r;
	else if (r == 0 && i < st->nwerr)
		st->werr[i] = st->werr[--st->nwerr];
	if (r != was)
		up_mark_dirty(u);
}

/* "" or "cannot write STATE/FILE: ERROR" of the first failed state write
 * (the log's included: it cannot report on itself). */
static void state_error(const struct up *u, char *out, size_t n)
{
	int lerr = up_log_error();

	out[0] = '\0';
	if (u->status.nwerr)
		snprintf(out, n, "cannot write %s/%s: %s%s", u->state_dir, u->status.werr[0].file,
			 strerror(-u->status.werr[0].err), u->status.nwerr > 1 ? " (and other files there)" : "");
	else if (lerr < 0)
		snprintf(out, n, "cannot write %s/%s: %s", u->state_dir, UP_LOG_FILE, strerror(-lerr));
}

/* The status as of now (doc/UP.md lists the fields); NULL without memory. */
static json_t *status_json(struct up *u)
{
	struct timespec now;
	struct chan_stats cs = {0};
	double p50, p99;
	json_t *o;

	lat_percentiles(&u->lat, &p50, &p99);
	if (u->conn.chan)
		chan_get_stats(u->conn.chan, &cs);
	size_t pending = up_sync_pending(u);
	clock_gettime(CLOCK_REALTIME, &now);
	bool changed = policy_changed(u);
	o = json_pack(
	    "{s:i, s:I, s:s, s:s, s:b, s:s, s:I, s:I, s:I, s:{s:f, s:f, s:I}, s:I, "
	    "s:I, s:I, s:s, s:s, s:s, "
	    "s:I, s:s}",
	    "version", 1, "pid", (json_int_t)getpid(), "dir", u->dir, "guest", u->conn.guest, "connected",
	    u->conn.state == UP_LIVE || u->conn.state == UP_RECONCILING, "state", state_names[u->conn.state],
	    "journal_seq", (json_int_t)journal_barrier_seq(u->journal), "applied_seq", (json_int_t)u->sync.applied_seq,
	    "pending", (json_int_t)pending, "latency_ms", "p50", p50, "p99", p99, "samples", (json_int_t)u->lat.n,
	    "bytes_sent", (json_int_t)(u->conn.bytes_closed + cs.bytes_out), "withheld", (json_int_t)u->sync.withheld,
	    "reconnects", (json_int_t)u->conn.reconnects, "policy", policy_source(u->pol.policy), "policy_note",
	    changed ? POLICY_NOTE : "", "last_error", u->conn.last_error, "updated_ns",
	    (json_int_t)((uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec), "socket", u->exec.sock);
	if (o)
		json_object_set_new(o, "policy_ignored", ignored_json(u->pol.policy));
	char serr[PATH_MAX + 160];
	state_error(u, serr, sizeof(serr));
	if (o)
		json_object_set_new(o, "state_error", json_string(serr));
	if (o)
		json_object_update_new(o, json_pack("{s:I, s:s, s:I}", "restarts", (json_int_t)u->super.restarts,
						    "last_crash", u->super.last_crash, "crash_ms",
						    (json_int_t)u->super.crash_ms));
	if (o && u->sandbox.use)
		json_object_update_new(o, sandbox_json(&u->sandbox));
	if (o && u->sandbox.use)
		json_object_set_new(o, "forks", up_fork_status(u));
	if (o && u->exec.egress)
		json_object_set_new(o, "egress", egress_json(u->exec.egress));
	if (o)
		json_object_set_new(o, "not_in_guest", up_paths_json(u));
	return o;
}

/* Put tmp at path. It is written after every push that leaves the sync
 * settled, on the loop: a rename over the old file makes ext4 start the
 * new one's writeback (auto_da_alloc), 0.7 ms p50 and 15 ms p99 on a busy
 * disk (doc/BENCH.md "Scale, third pass"). An exchange and an unlink of
 * the old one do not, and readers still see one whole file or the other.
 * Where the filesystem has no exchange (or no old file yet): a rename. */
static int status_replace(const char *tmp, const char *path)
{
	if (renameat2(AT_FDCWD, tmp, AT_FDCWD, path, RENAME_EXCHANGE) == 0) {
		(void)unlink(tmp); /* the old status; a leftover is truncated by the next write */
		return 0;
	}
	return rename(tmp, path) == 0 ? 0 : -errno;
}

/* Replace the status file with o: a temp file put over it. No fsync:
 * the file describes a live process and means nothing after a crash.
 * 0 or -errno (a full or read-only state directory). */
static int status_save(const char *state_dir, json_t *o)
{
	char path[PATH_MAX + 32], tmp[PATH_MAX + 48];
	FILE *f;
	int fd, e;

	snprintf(path, sizeof(path), "%s/%s", state_dir, UP_STATUS_FILE);
	snprintf(tmp, sizeof(tmp), "%s/.%s.tmp", state_dir, UP_STATUS_FILE);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600)) < 0)
		return -errno;
	if (!(f = fdopen(fd, "w"))) {
		e = errno;
		close(fd);
		unlink(tmp);
		return -e;
	}
	errno = 0;
	int bad = json_dumpf(o, f, JSON_COMPACT) < 0 || fputc('\n', f) == EOF;
	e = errno;
	if (fclose(f) != 0 && !bad) {
		bad = 1;
		e = errno;
	}
	if (!bad && (e = -status_replace(tmp, path)) == 0)
		return 0;
	e = bad ? (e ? e : EIO) : e;
	unlink(tmp);
	return -e;
}

/* Failed state files are written again at most once a second while the
 * status is (the stash's copies cannot be: their failure was said, the
 * guest keeps those versions), so a freed directory clears state_error. */
static void state_retry(struct up *u)
{
	uint64_t now = loop_now_ms();

	if (!u->status.nwerr || now - u->status.retry_ms < STATE_RETRY_MS)
		return;
	u->status.retry_ms = now;
	bool store = false, audit = false;
	for (size_t i = 0; i < u->status.nwerr; i++) {
		store |= !strcmp(u->status.werr[i].file, WB_STORE_FILE) ||
			 !strcmp(u->status.werr[i].file, UP_CONFIRMED_FILE);
		audit |= !strcmp(u->status.werr[i].file, AUDIT_WITHHELD_FILE);
	}
	up_state_wrote(u, UP_STASH_FILES, 0);
	if (store)
		up_changes_save_state(u);
	if (audit)
		up_sync_save_audit(u);
}

void up_status_write(struct up *u)
{
	json_t *o;

	state_retry(u);
	u->status.dirty = false;
	u->status.last_ms = loop_now_ms();
	if (u->status.timer) {
		loop_del_timer(u->loop, u->status.timer);
		u->status.timer = 0;
	}
	if (!(o = status_json(u)))
		return;
	int r = status_save(u->state_dir, o);
	json_decref(o);
	up_state_wrote(u, UP_STATUS_FILE, r);
}

void up_status_flush(struct up *u, bool settled)
{
	if (u->status.dirty && settled) {
		if (u->status.timer)
			loop_del_timer(u->loop, u->status.timer);
		u->status.timer = 0;
		up_status_write(u);
	} else if (u->status.dirty && !u->status.timer) {
		uint64_t now = loop_now_ms(), due = u->status.last_ms + STATUS_MIN_MS;
		if (now >= due)
			up_status_write(u);
		else
			u->status.timer = loop_add_timer(u->loop, due - now, on_status_timer, u);
	}
}

/* Read the status file: *out (json_decref) or NULL when there is none. */
static int read_status(const char *sdir, json_t **out)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/%s", sdir, UP_STATUS_FILE);
	*out = json_load_file(path, 0, NULL);
	return *out ? 0 : -ENOENT;
}

bool up_status_was_live(const char *state_dir, pid_t pid)
{
	json_t *st = NULL;
	bool live = read_status(state_dir, &st) == 0 && json_integer_value(json_object_get(st, "pid")) == pid &&
		    json_is_true(json_object_get(st, "connected"));

	json_decref(st);
	return live;
}

static int parse_dir_opts(const char *cmd, int argc, char **argv, const char **dir, bool *json, double *timeout)
{
	static const struct option opts[] = {
	    {"json", no_argument, NULL, 'j'},
	    {"timeout", required_argument, NULL, 't'},
	    {NULL, 0, NULL, 0},
	};
	int c;

	*dir = ".";
	optind = 1;
	while ((c = getopt_long(argc, argv, "C:", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			*dir = optarg;
			break;
		case 'j':
			if (!json)
				goto bad;
			*json = true;
			break;
		case 't': {
			char *end;
			if (!timeout)
				goto bad;
			*timeout = strtod(optarg, &end);
			if (*end || !(*timeout > 0))
				goto bad;
			break;
		}
		default:
			goto bad;
		}
	}
	if (optind != argc)
		return cmd_operands(cmd, argc, argv, optind, 0, "");
	return 0;
bad:
	up_wait_usage(cmd);
	return -1;
}

static uint64_t real_now_ns(void)
{
	struct timespec now;
	clock_gettime(CLOCK_REALTIME, &now);
	return (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
}

/* The daemon's status as of now: ask for a fresh one (SIGUSR1) and wait
 * up to wait_ms for a status written after the request; else the last one
 * written (its updated_ns says how old it is). 0, or -1 without any. */
/* Can a file be written in the state directory? 0, or -errno (ENOSPC,
 * EROFS, EACCES...): why the daemon's status is not fresh. */
static int probe_state_dir(const char *sdir)
{
	char block[4096] = {0};
	int fd = open(sdir, O_TMPFILE | O_WRONLY | O_CLOEXEC, 0600), e = 0;

	if (fd < 0)
		return errno == EOPNOTSUPP || errno == EISDIR ? 0 : -errno;
	if (write(fd, block, sizeof(block)) != (ssize_t)sizeof(block) || fsync(fd) < 0)
		e = errno ? errno : ENOSPC;
	close(fd);
	return -e;
}

static int fresh_status(const char *sdir, pid_t pid, unsigned wait_ms, json_t **out)
{
	uint64_t t0 = real_now_ns(), start = loop_now_ms();

	*out = NULL;
	if (kill(pid, SIGUSR1) == 0) {
		while (loop_now_ms() - start < wait_ms) {
			json_t *st = NULL;
			if (read_status(sdir, &st) == 0 &&
			    (uint64_t)json_integer_value(json_object_get(st, "updated_ns")) >= t0) {
				*out = st;
				return 0;
			}
			json_decref(st);
			usleep(2000);
		}
	}
	if (read_status(sdir, out) < 0)
		return -1;
	return 1; /* not fresh */
}

/* `airlock status` for people: one line per concern. */
static void print_status(json_t *st, pid_t pid)
{
	json_t *lat = json_object_get(st, "latency_ms");
	const char *note = json_string_value(json_object_get(st, "policy_note"));
	const char *lerr = json_string_value(json_object_get(st, "last_error"));
	printf("workspace   %s (airlock up, pid %d)\n", json_string_value(json_object_get(st, "dir")), (int)pid);
	printf("guest       %s: %s\n", json_string_value(json_object_get(st, "guest")),
	       json_string_value(json_object_get(st, "state")));
	printf("journal     seq %" JSON_INTEGER_FORMAT ", applied %" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT
	       " pending\n",
	       json_integer_value(json_object_get(st, "journal_seq")),
	       json_integer_value(json_object_get(st, "applied_seq")),
	       json_integer_value(json_object_get(st, "pending")));
	printf("latency     edit to apply p50 %.2f ms, p99 %.2f ms (last "
	       "%" JSON_INTEGER_FORMAT " pushes)\n",
	       json_real_value(json_object_get(lat, "p50")), json_real_value(json_object_get(lat, "p99")),
	       json_integer_value(json_object_get(lat, "samples")));
	printf("sent        %.2f MiB, %" JSON_INTEGER_FORMAT " withheld, %" JSON_INTEGER_FORMAT " reconnects\n",
	       (double)json_integer_value(json_object_get(st, "bytes_sent")) / 1048576.0,
	       json_integer_value(json_object_get(st, "withheld")),
	       json_integer_value(json_object_get(st, "reconnects")));
	printf("policy      %s%s%s\n", json_string_value(json_object_get(st, "policy")), note && *note ? ": " : "",
	       note ? note : "");
	const char *ign = json_string_value(json_object_get(json_object_get(st, "policy_ignored"), "note"));
	if (ign && *ign)
		printf("untrusted   %s\n", ign);
	printf("relay       %s\n", json_string_value(json_object_get(st, "socket"))
				       ? json_string_value(json_object_get(st, "socket"))
				       : "-");
	if (json_object_get(st, "sandbox")) {
		long long ttl = (long long)json_integer_value(json_object_get(st, "ttl_seconds"));
		printf("sandbox     %s, %s (%s)\n", json_string_value(json_object_get(st, "sandbox")),
		       json_string_value(json_object_get(st, "sandbox_state")),
		       json_string_value(json_object_get(st, "sandbox_describe")));
		if (json_string_value(json_object_get(st, "sandbox_boot")))
			printf("started     %s in %.1f ms\n", json_string_value(json_object_get(st, "sandbox_boot")),
			       json_number_value(json_object_get(st, "sandbox_start_ms")));
		if (ttl > 0)
			printf("idle ttl    %lld s (idle for %.1f s)\n", ttl,
			       (double)json_integer_value(json_object_get(st, "idle_ms")) / 1000.0);
		else
			printf("idle ttl    none (workspace.ttl_seconds unset)\n");
		json_t *fk;
		size_t fi;
		json_array_foreach(json_object_get(st, "forks"), fi, fk) printf(
		    "fork        %s, %s, %lld command(s), idle %lld s of %lld s (airlock exec --fork %s)\n",
		    json_string_value(json_object_get(fk, "name")), json_string_value(json_object_get(fk, "state")),
		    (long long)json_integer_value(json_object_get(fk, "commands")),
		    (long long)json_integer_value(json_object_get(fk, "idle_seconds")),
		    (long long)json_integer_value(json_object_get(fk, "ttl_seconds")),
		    json_string_value(json_object_get(fk, "name")));
	}
	json_t *eg = json_object_get(st, "egress");
	if (eg)
		printf("egress      %" JSON_INTEGER_FORMAT " proxy connections open, %" JSON_INTEGER_FORMAT
		       " made, %" JSON_INTEGER_FORMAT " denied (airlock audit)\n",
		       json_integer_value(json_object_get(eg, "streams")),
		       json_integer_value(json_object_get(eg, "opened")),
		       json_integer_value(json_object_get(eg, "denials")));
	up_paths_print(st);
	if (lerr && *lerr)
		printf("last error  %s\n", lerr);
	const char *crash = json_string_value(json_object_get(st, "last_crash"));
	if (crash && *crash) {
		time_t at = (time_t)(json_integer_value(json_object_get(st, "crash_ms")) / 1000);
		char when[64];
		strftime(when, sizeof(when), "%Y-%m-%d %H:%M:%S", localtime(&at));
		printf("restarts    %" JSON_INTEGER_FORMAT " (last: the daemon %s at %s; restarted on the same mount, "
		       "the guest reconciled)\n",
		       json_integer_value(json_object_get(st, "restarts")), crash, when);
	}
}

/* status's failure: a line on stderr, and with --json a document saying
 * the same on stdout (doc/JSON.md). Returns the exit status, 1. */
static int status_fail(bool json, const char *dir, const char *msg)
{
	cmd_err("status: %s", msg);
	if (json)
		cmd_print_json(json_pack("{s:i, s:b, s:b, s:s, s:s}", "version", 1, "ok", 0, "running", 0, "dir", dir,
					 "error", msg));
	return 1;
}

int cmd_status(int argc, char **argv)
{
	const char *dir;
	bool json = false;
	char sdir[PATH_MAX], real[PATH_MAX];
	json_t *st = NULL;
	pid_t pid;
	int r;

	if (parse_dir_opts("status", argc, argv, &dir, &json, NULL) < 0)
		return 2;
	if ((r = ws_resolve(dir, real, false)) < 0)
		return status_fail(json, dir, strerror(-r));
	if (up_state_dir_of(real, sdir, sizeof(sdir)) < 0)
		return status_fail(json, real, "no state directory (set XDG_STATE_HOME or HOME)");
	pid = up_wait_daemon(sdir, RESTART_WAIT_MS);
	int stale = pid ? fresh_status(sdir, pid, 1000, &st) : -1, perr;
	if (pid && stale != 0 && (perr = probe_state_dir(sdir)) < 0) {
		/* the daemon runs but cannot write its status: that is the news */
		char msg[2 * PATH_MAX + 256];
		snprintf(msg, sizeof(msg),
			 "airlock up (pid %d) runs for %.*s but cannot write its state directory %.*s: %s; what it "
			 "last wrote is stale (free space there, or make it writable)",
			 (int)pid, PATH_MAX - 1, real, PATH_MAX - 1, sdir, strerror(-perr));
		json_decref(st);
		return status_fail(json, real, msg);
	}
	if (!pid || !st || json_integer_value(json_object_get(st, "pid")) != pid) {
		json_decref(st);
		snprintf(sdir, sizeof(sdir),
			 "no airlock up runs for %.*s or a directory above it (start one: airlock up DIR -d)",
			 PATH_MAX - 128, real);
		return status_fail(json, real, sdir);
	}
	const char *serr = json_string_value(json_object_get(st, "state_error"));
	if (serr && *serr) {
		/* it writes its status, but another of its files failed */
		char msg[3 * PATH_MAX + 256];
		snprintf(msg, sizeof(msg),
			 "airlock up (pid %d) runs for %.*s but %.*s; free space there, or make it writable", (int)pid,
			 PATH_MAX - 1, real, 2 * PATH_MAX, serr);
		if (!json)
			print_status(st, pid); /* the rest of the status is fresh */
		json_decref(st);
		return status_fail(json, real, msg);
	}
	json_object_set_new(st, "running", json_true());
	if (json) {
		json_incref(st);
		if (cmd_print_json(st) < 0) {
			json_decref(st);
			return 1;
		}
	} else {
		print_status(st, pid);
	}
	json_decref(st);
	return 0;
}

int cmd_sync_wait(int argc, char **argv)
{
	const char *dir;
	double timeout = 60;
	char sdir[PATH_MAX], real[PATH_MAX];
	struct timespec now;
	uint64_t t0_ms = loop_now_ms(), t0_real, barrier = 0, last_kick = 0;
	bool have_barrier = false;
	pid_t pid;
	int r;

	if (parse_dir_opts("sync-wait", argc, argv, &dir, NULL, &timeout) < 0)
		return 2;
	if ((r = ws_resolve(dir, real, false)) < 0) {
		cmd_err("sync-wait: %s: %s", dir, strerror(-r));
		return 1;
	}
	dir = real;
	if (up_state_dir_of(dir, sdir, sizeof(sdir)) < 0)
		return 1;
	if (!(pid = up_wait_daemon(sdir, RESTART_WAIT_MS))) {
		cmd_err("sync-wait: no airlock up runs for %s or a directory above it (start one: airlock up DIR -d)",
			dir);
		return 1;
	}
	clock_gettime(CLOCK_REALTIME, &now);
	t0_real = (uint64_t)now.tv_sec * 1000000000ull + (uint64_t)now.tv_nsec;
	for (;;) {
		uint64_t t = loop_now_ms();
		json_t *st = NULL;

		if ((double)(t - t0_ms) > timeout * 1000.0) {
			cmd_err("sync-wait: %s not in sync after %.1f s (airlock status -C %s)", dir, timeout, dir);
			return 1;
		}
		if (!have_barrier && t - t0_ms > 1000 && (t - t0_ms) % 1000 < 5) {
			int perr = probe_state_dir(sdir);
			if (perr < 0) {
				cmd_err("sync-wait: airlock up (pid %d) cannot write its state directory %s: %s; "
					"it cannot report progress (free space there, or make it writable)",
					(int)pid, sdir, strerror(-perr));
				return 1;
			}
		}
		/* the barrier must come from a status written after we started,
		 * so it covers every change made before: ask for one */
		if (!have_barrier && t - last_kick >= 200) {
			if (kill(pid, SIGUSR1) < 0) {
				/* restarted after a crash? then wait for the new one
				 * (its first reconcile covers every change before) */
				pid_t again = up_wait_daemon(sdir, RESTART_WAIT_MS);
				if (!again || again == pid) {
					cmd_err("sync-wait: airlock up (pid %d) is gone", (int)pid);
					return 1;
				}
				pid = again;
				continue;
			}
			last_kick = t;
		}
		if (read_status(sdir, &st) == 0) {
			uint64_t upd = (uint64_t)json_integer_value(json_object_get(st, "updated_ns"));
			uint64_t applied = (uint64_t)json_integer_value(json_object_get(st, "applied_seq"));
			uint64_t pending = (uint64_t)json_integer_value(json_object_get(st, "pending"));
			/* live: the connection's first reconcile is done. Before it
			 * (a restarted daemon, a reconnect) the guest may lack what
			 * a restarted daemon's empty journal never counted. */
			const char *state = json_string_value(json_object_get(st, "state"));
			bool live = state && !strcmp(state, "live");
			if (!have_barrier && upd >= t0_real && json_integer_value(json_object_get(st, "pid")) == pid) {
				barrier = (uint64_t)json_integer_value(json_object_get(st, "journal_seq"));
				have_barrier = true;
			}
			json_int_t missing =
			    json_integer_value(json_object_get(json_object_get(st, "not_in_guest"), "total"));
			json_decref(st);
			if (have_barrier && live && applied >= barrier && pending == 0) {
				if (missing > 0) /* applied as far as the guest could: say what it could not */
					cmd_err(
					    "sync-wait: %lld path%s not in the guest, retrying (airlock status -C %s)",
					    (long long)missing, missing == 1 ? " is" : "s are", dir);
				return 0;
			}
		}
		if (t - t0_ms > 0 && (t - t0_ms) % 1000 < 5 && up_daemon_pid(sdir) != pid) {
			pid_t again = up_wait_daemon(sdir, RESTART_WAIT_MS);
			if (!again) {
				cmd_err("sync-wait: airlock up for %s stopped", dir);
				return 1;
			}
			if (again != pid) {
				pid = again;
				have_barrier = false;
				last_kick = 0;
			}
		}
		usleep(5000);
	}
}
