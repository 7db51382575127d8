/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock list [--json]: every workspace of this user (one state directory
 * each, workspace.c) with its state, kind, pid, pending changes, sandbox and
 * idle TTL. airlock gc [--dry-run] [--older-than DAYS]: remove the state
 * (and sandbox state) of workspaces whose directory is gone, or, with
 * --older-than, of stopped ones untouched for that long.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/sandbox/sandbox.h"
#include "airlock/sync/writeback.h"
#include "cmd_i.h"

/* How many guest changes wait for review in state_dir's store; -1 when
 * it cannot be read (a damaged store: `airlock changes` says why). */
static long changes_waiting(const char *state_dir)
{
	char err[256];
	struct wb_store *st = NULL;
	long n = -1;
	int fd = open(state_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);

	if (fd < 0)
		return errno == ENOENT ? 0 : -1;
	if (wb_store_open(fd, &st, err, sizeof(err)) == 0)
		n = (long)wb_store_count(st);
	wb_store_free(st);
	close(fd);
	return n;
}

/* One workspace as list shows it; NULL without memory. */
static json_t *entry_json(const struct ws_info *w)
{
	json_t *st = w->status;
	char sb[PATH_MAX];
	struct stat s;
	bool have_sb = w->dir[0] && sandbox_dir_of(w->dir, sb, sizeof(sb)) == 0 && stat(sb, &s) == 0;
	const char *kind = json_string_value(json_object_get(st, "sandbox"));
	json_t *o = json_pack("{s:s, s:s, s:s, s:s, s:b}", "dir", w->dir, "state_dir", w->state_dir, "state",
			      w->pid && st ? json_string_value(json_object_get(st, "state")) : "stopped", "kind",
			      kind	? kind
			      : w->pid	? "guest"
			      : have_sb ? "sandbox"
					: "-",
			      "running", w->pid != 0);

	if (!o)
		return NULL;
	json_object_set_new(o, "pid", w->pid ? json_integer(w->pid) : json_null());
	json_object_set_new(o, "pending",
			    st ? json_integer(json_integer_value(json_object_get(st, "pending"))) : json_null());
	long wait = changes_waiting(w->state_dir);
	json_object_set_new(o, "changes_waiting", wait >= 0 ? json_integer(wait) : json_null());
	json_object_set_new(o, "sandbox_state",
			    json_string(st && kind ? json_string_value(json_object_get(st, "sandbox_state"))
					: have_sb  ? "kept"
						   : "none"));
	json_object_set_new(o, "sandbox_dir", have_sb ? json_string(sb) : json_null());
	json_t *forks = st ? json_object_get(st, "forks") : NULL;
	json_object_set_new(o, "forks", json_is_array(forks) ? json_copy(forks) : json_array());
	json_object_set_new(o, "ttl_seconds",
			    st && json_object_get(st, "ttl_seconds") ? json_copy(json_object_get(st, "ttl_seconds"))
								     : json_null());
	json_object_set_new(
	    o, "socket", st && json_object_get(st, "socket") ? json_copy(json_object_get(st, "socket")) : json_null());
	json_object_set_new(o, "exists", json_boolean(w->dir[0] && stat(w->dir, &s) == 0 && S_ISDIR(s.st_mode)));
	return o;
}

static int collect(const struct ws_info *w, void *ud)
{
	json_t *o;

	if (!w->dir[0])
		return 0; /* a state directory no file names (only a hash cache): gc's to judge */
	if (!(o = entry_json(w)) || json_array_append_new(ud, o) < 0)
		return -ENOMEM;
	return 0;
}

int cmd_list(int argc, char **argv)
{
	json_t *a = json_array();
	bool json = argc == 2 && !strcmp(argv[1], "--json");
	size_t i;
	json_t *e;

	if (argc > 2 || (argc == 2 && !json)) {
		json_decref(a);
		if (argc >= 2 && argv[1][0] == '-' && strcmp(argv[1], "--json"))
			cmd_err("list: unknown option '%s'", argv[1]);
		else
			cmd_operands("list", argc, argv, json ? 2 : 1, 0, "");
		cmd_usage("list");
		return 2;
	}
	if (!a || ws_foreach(collect, a) < 0) {
		json_decref(a);
		cmd_err("list: out of memory");
		return 1;
	}
	if (json)
		return cmd_print_json(json_pack("{s:i, s:o}", "version", 1, "workspaces", a)) < 0 ? 1 : 0;
	if (json_array_size(a) == 0)
		printf("no workspaces yet (airlock up DIR starts one)\n");
	else
		printf("%-44s %-12s %-8s %-8s %-8s %-8s %s\n", "WORKSPACE", "STATE", "KIND", "PID", "PENDING",
		       "CHANGES", "SANDBOX");
	json_array_foreach(a, i, e)
	{
		json_t *pid = json_object_get(e, "pid"), *pend = json_object_get(e, "pending"),
		       *chg = json_object_get(e, "changes_waiting");
		char pids[24] = "-", pends[24] = "-", chgs[24] = "?";
		if (json_is_integer(pid))
			snprintf(pids, sizeof(pids), "%" JSON_INTEGER_FORMAT, json_integer_value(pid));
		if (json_is_integer(pend))
			snprintf(pends, sizeof(pends), "%" JSON_INTEGER_FORMAT, json_integer_value(pend));
		if (json_is_integer(chg))
			snprintf(chgs, sizeof(chgs), "%" JSON_INTEGER_FORMAT, json_integer_value(chg));
		size_t nf = json_array_size(json_object_get(e, "forks"));
		char forks[32] = "";
		if (nf)
			snprintf(forks, sizeof(forks), " +%zu fork%s", nf, nf == 1 ? "" : "s");
		printf("%-44s %-12s %-8s %-8s %-8s %-8s %s%s%s\n", json_string_value(json_object_get(e, "dir")),
		       json_string_value(json_object_get(e, "state")), json_string_value(json_object_get(e, "kind")),
		       pids, pends, chgs, json_string_value(json_object_get(e, "sandbox_state")), forks,
		       json_is_true(json_object_get(e, "exists")) ? "" : "  (directory gone: airlock gc)");
	}
	json_decref(a);
	return 0;
}

/* ---- gc ---- */

struct gc {
	bool dry_run;
	double older_days; /* < 0: only workspaces whose directory is gone */
	unsigned removed, kept_running;
	int status;
};

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)ftw;
	if ((flag == FTW_DP ? rmdir(path) : unlink(path)) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

/* Newest mtime among the state directory's files. */
static time_t newest_in(const char *dir)
{
	static const char *const names[] = {"", "/up.log", "/withheld.json", "/egress.json", "/up.pid"};
	char path[PATH_MAX + 32];
	struct stat st;
	time_t t = 0;

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		snprintf(path, sizeof(path), "%s%s", dir, names[i]);
		if (stat(path, &st) == 0 && st.st_mtime > t)
			t = st.st_mtime;
	}
	return t;
}

/* The sandbox state of workspace dir goes. It is found by the realpath of
 * dir, so a directory that is gone is made again for the while (when its
 * parent is still there). 0, or -1 with err set. */
static int gc_sandbox(const char *dir, bool gone, char *err, size_t errlen)
{
	bool made = gone && mkdir(dir, 0700) == 0;
	char sb[PATH_MAX];
	struct stat st;
	int r = 0;

	if (gone && !made) {
		snprintf(err, errlen, "kept (its parent directory is gone too; airlock down --destroy cannot find it)");
		return -1;
	}
	if (sandbox_dir_of(dir, sb, sizeof(sb)) == 0 && stat(sb, &st) == 0 && sandbox_destroy(dir, err, errlen) < 0)
		r = -1;
	if (made)
		rmdir(dir);
	return r;
}

static int gc_one(const struct ws_info *w, void *ud)
{
	struct gc *g = ud;
	struct stat st;
	bool gone = !w->dir[0] || stat(w->dir, &st) < 0;
	bool old = g->older_days >= 0 && difftime(time(NULL), newest_in(w->state_dir)) > g->older_days * 86400;
	char err[PATH_MAX + 128];

	if (w->pid) {
		g->kept_running++;
		return 0;
	}
	if (!gone && !old)
		return 0;
	printf("%s %s (%s)%s\n", g->dry_run ? "would remove" : "removing", w->state_dir,
	       w->dir[0] ? w->dir : "no workspace named", gone ? ", its directory is gone" : ", unused");
	if (g->dry_run)
		return 0;
	if (w->dir[0] == '/' && gc_sandbox(w->dir, gone, err, sizeof(err)) < 0) {
		cmd_err("gc: sandbox state of %s: %s", w->dir, err);
		g->status = 1;
		return 0;
	}
	if (nftw(w->state_dir, rm_one, 16, FTW_DEPTH | FTW_PHYS) != 0) {
		cmd_err("gc: %s: %s", w->state_dir, strerror(errno));
		g->status = 1;
		return 0;
	}
	g->removed++;
	return 0;
}

int cmd_gc(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"dry-run", no_argument, NULL, 'n'},
	    {"older-than", required_argument, NULL, 'o'},
	    {NULL, 0, NULL, 0},
	};
	struct gc g = {.older_days = -1};
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		char *end;
		if (c == 'n') {
			g.dry_run = true;
		} else if (c == 'o') {
			g.older_days = strtod(optarg, &end);
			if (*end || !*optarg || !(g.older_days >= 0)) {
				cmd_err("gc: --older-than '%s': a number of days >= 0", optarg);
				return 2;
			}
		} else {
			cmd_usage("gc");
			return 2;
		}
	}
	if (cmd_operands("gc", argc, argv, optind, 0, "") < 0)
		return 2;
	ws_foreach(gc_one, &g);
	if (!g.dry_run)
		printf("removed the state of %u workspace%s; %u running left alone\n", g.removed,
		       g.removed == 1 ? "" : "s", g.kept_running);
	return g.status;
}
