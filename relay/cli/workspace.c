/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Which workspace a directory belongs to (status, audit, sync-wait and
 * exec work from any directory below one), and the user's workspaces: one
 * state directory each under $XDG_STATE_HOME/airlock/ (audit.h), live while
 * an airlock up holds its pid file.
 */
#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <jansson.h>

#include "airlock/mount/mount.h"
#include "airlock/sync/audit.h"
#include "cmd_i.h"
#include "up_i.h"

#define WS_MAX 4096u /* state directories looked at, at most */

bool ws_path_below(const char *path, const char *dir)
{
	size_t n = strlen(dir);

	if (n == 1 && dir[0] == '/')
		return path[0] == '/';
	return !strncmp(path, dir, n) && (path[n] == '/' || path[n] == '\0');
}

/* dir has a state directory with a live airlock up, or one with audit
 * records (a workspace airlock sync or up has seen). */
static bool is_known(const char *dir, bool live_only)
{
	char sdir[PATH_MAX], err[256], path[PATH_MAX + 32];
	struct stat st;

	if (audit_dir(dir, 0, sdir, sizeof(sdir), err, sizeof(err)) < 0)
		return false;
	if (up_daemon_pid(sdir))
		return true;
	snprintf(path, sizeof(path), "%s/%s", sdir, AUDIT_WITHHELD_FILE);
	return !live_only && stat(path, &st) == 0;
}

int ws_resolve(const char *dir, char out[PATH_MAX], bool records)
{
	char cur[PATH_MAX];

	if (!realpath(dir, out))
		return -errno;
	snprintf(cur, sizeof(cur), "%s", out);
	/* the nearest airlock mount or live workspace at or above dir; with
	 * records, also one that only has audit records */
	for (int pass = 0; pass < (records ? 2 : 1); pass++) {
		for (;;) {
			if ((pass == 0 && mount_is_airlock(cur) == 1) || is_known(cur, pass == 0)) {
				snprintf(out, PATH_MAX, "%s", cur);
				return 0;
			}
			char *slash = strrchr(cur, '/');
			if (!slash || slash == cur)
				break;
			*slash = '\0';
		}
		snprintf(cur, sizeof(cur), "%s", out);
	}
	return 0; /* none above: dir itself */
}

/* $XDG_STATE_HOME/airlock (or ~/.local/state/airlock): audit_dir's parent. */
static int state_base(char *out, size_t n)
{
	char err[256];
	char *slash;

	if (audit_dir("/", 0, out, n, err, sizeof(err)) < 0)
		return -ENOENT;
	if ((slash = strrchr(out, '/')))
		*slash = '\0';
	return 0;
}

int ws_foreach(int (*fn)(const struct ws_info *w, void *ud), void *ud)
{
	char base[PATH_MAX];
	struct dirent *de;
	unsigned seen = 0;
	DIR *d;
	int r = 0;

	if (state_base(base, sizeof(base)) < 0 || !(d = opendir(base)))
		return 0; /* no state yet: no workspaces */
	while (r == 0 && (de = readdir(d)) && seen++ < WS_MAX) {
		struct ws_info w = {0};
		char path[PATH_MAX * 2];
		json_t *st;

		if (strlen(de->d_name) != 32 || strspn(de->d_name, "0123456789abcdef") != 32)
			continue;
		if (snprintf(w.state_dir, sizeof(w.state_dir), "%.*s/%s", (int)(sizeof(w.state_dir) - 34), base,
			     de->d_name) >= (int)sizeof(w.state_dir))
			continue;
		w.pid = up_daemon_pid(w.state_dir);
		snprintf(path, sizeof(path), "%s/%s", w.state_dir, UP_STATUS_FILE);
		st = w.pid ? json_load_file(path, 0, NULL) : NULL;
		if (!st) {
			snprintf(path, sizeof(path), "%s/%s", w.state_dir, AUDIT_WITHHELD_FILE);
			st = json_load_file(path, 0, NULL); /* its workspace is named there */
		} else {
			w.status = st;
		}
		const char *dir = json_string_value(json_object_get(st, w.status ? "dir" : "workspace"));
		if (dir)
			snprintf(w.dir, sizeof(w.dir), "%s", dir);
		r = fn(&w, ud);
		json_decref(st);
	}
	closedir(d);
	return r;
}
