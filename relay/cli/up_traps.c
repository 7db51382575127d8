/* SPDX-License-Identifier: Apache-2.0 */
/*
 * What `airlock up DIR` refuses before anything starts, and what it warns
 * about (doc/UP.md "Refusals and warnings"): each message names the cause
 * and the fix.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/sandbox/sandbox.h"
#include "airlock/server/relay.h"
#include "airlock/sync/audit.h"
#include "cmd_i.h"
#include "up_i.h"

#define PROC_MAX  8192u /* processes looked at */
#define FD_MAX	  4096u /* open files looked at per process */
#define NAMED_MAX 8u	/* processes named in the warning */

/* path's directory (path itself when it is one) below or at dir: the
 * mount would hide it from airlock itself. */
static int refuse_own(const char *dir, const char *what, const char *path, const char *setting)
{
	char real[PATH_MAX], parent[PATH_MAX];
	const char *p = path;

	/* the file or directory may not exist yet: test its nearest existing parent */
	snprintf(parent, sizeof(parent), "%s", path);
	while (!realpath(parent, real)) {
		char *slash = strrchr(parent, '/');
		if (!slash || slash == parent)
			return 0;
		*slash = '\0';
	}
	p = real;
	if (!ws_path_below(p, dir))
		return 0;
	cmd_err("up: %s holds airlock's own %s (%s): the mount would hide it from airlock (up would hang or "
		"sync its own files). Move it out with %s, or pick a smaller workspace",
		dir, what, path, setting);
	return 2;
}

/* Another live airlock up serves a workspace inside or around dir. */
static int nested_cb(const struct ws_info *w, void *ud)
{
	const char *dir = ud;

	if (!w->pid || !w->dir[0] || !strcmp(w->dir, dir))
		return 0; /* the same workspace: the pid lock says so later */
	if (ws_path_below(dir, w->dir)) {
		cmd_err("up: %s is inside the live workspace %s (airlock up pid %d): one mount would cover the "
			"other. Use that workspace (airlock exec -C %s), or stop it first: airlock down %s",
			dir, w->dir, (int)w->pid, dir, w->dir);
		return 2;
	}
	if (ws_path_below(w->dir, dir)) {
		cmd_err("up: %s holds the live workspace %s (airlock up pid %d): one mount would cover the other, "
			"and stopping one would stop both. Stop it first: airlock down %s",
			dir, w->dir, (int)w->pid, w->dir);
		return 2;
	}
	return 0;
}

int up_check_workspace(const char *dir, bool allow_home)
{
	char path[PATH_MAX], home[PATH_MAX], err[256];
	const char *h = getenv("HOME");
	struct stat st;
	int st_code;

	if (stat(dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
		cmd_err("up: %s is not a directory (give the workspace directory to mount)", dir);
		return 2;
	}
	if (!strcmp(dir, "/")) {
		cmd_err("up: refusing to mount over / (give a project directory)");
		return 2;
	}
	if (h && realpath(h, home) && !strcmp(home, dir) && !allow_home) {
		cmd_err("up: %s is your home directory: every dotfile the policy does not withhold (browser "
			"profiles, shell history, tokens) would be copied to the sandbox. Give a project directory, "
			"or add --allow-home if you mean it",
			dir);
		return 2;
	}
	/* airlock's own places must stay outside the mount */
	if (audit_dir(dir, 0, path, sizeof(path), err, sizeof(err)) == 0 &&
	    (st_code = refuse_own(dir, "state directory", path, "XDG_STATE_HOME=/elsewhere")) != 0)
		return st_code;
	/* the socket's path, or (when it cannot be made yet) the settings it comes from */
	if (relay_default_path(dir, path, sizeof(path)) < 0)
		snprintf(path, sizeof(path), "%s",
			 getenv("AIRLOCK_SOCKET")    ? getenv("AIRLOCK_SOCKET")
			 : getenv("XDG_RUNTIME_DIR") ? getenv("XDG_RUNTIME_DIR")
						     : "");
	if (path[0] == '/' && (st_code = refuse_own(dir, "relay socket", path,
						    "XDG_RUNTIME_DIR=/elsewhere or AIRLOCK_SOCKET=/path")) != 0)
		return st_code;
	if (sandbox_dir_of(dir, path, sizeof(path)) == 0 &&
	    (st_code = refuse_own(dir, "sandbox state", path, "XDG_DATA_HOME=/elsewhere")) != 0)
		return st_code;
	return ws_foreach(nested_cb, (void *)dir);
}

/* What of process pid is below dir: "cwd", or the first open file (in
 * what, n bytes). false when nothing is. */
static bool proc_below(const char *pid, const char *dir, char *what, size_t n)
{
	char path[64 + NAME_MAX], target[PATH_MAX];
	struct dirent *de;
	unsigned fds = 0;
	ssize_t k;
	DIR *d;

	snprintf(path, sizeof(path), "/proc/%s/cwd", pid);
	if ((k = readlink(path, target, sizeof(target) - 1)) > 0) {
		target[k] = '\0';
		if (ws_path_below(target, dir)) {
			snprintf(what, n, "cwd");
			return true;
		}
	}
	snprintf(path, sizeof(path), "/proc/%s/fd", pid);
	if (!(d = opendir(path)))
		return false;
	while ((de = readdir(d)) && fds++ < FD_MAX) {
		if (de->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/fd/%s", pid, de->d_name);
		if ((k = readlink(path, target, sizeof(target) - 1)) > 0) {
			target[k] = '\0';
			if (ws_path_below(target, dir)) {
				snprintf(what, n, "open file %s", target);
				closedir(d);
				return true;
			}
		}
	}
	closedir(d);
	return false;
}

unsigned up_procs_below(const char *dir, void (*fn)(const char *pid, const char *comm, const char *what, void *ud),
			void *ud)
{
	char self[16];
	unsigned procs = 0, hits = 0;
	struct dirent *de;
	DIR *d;

	if (!(d = opendir("/proc")))
		return 0;
	snprintf(self, sizeof(self), "%d", (int)getpid());
	while ((de = readdir(d)) && procs++ < PROC_MAX) {
		char what[PATH_MAX + 16], comm[64] = "?", path[64 + NAME_MAX];
		FILE *f;

		if (strspn(de->d_name, "0123456789") != strlen(de->d_name) || !strcmp(de->d_name, self) ||
		    !proc_below(de->d_name, dir, what, sizeof(what)))
			continue;
		snprintf(path, sizeof(path), "/proc/%s/comm", de->d_name);
		if ((f = fopen(path, "r"))) {
			if (fgets(comm, sizeof(comm), f))
				comm[strcspn(comm, "\n")] = '\0';
			fclose(f);
		}
		fn(de->d_name, comm, what, ud);
		hits++;
	}
	closedir(d);
	return hits;
}

struct named {
	char names[NAMED_MAX][PATH_MAX + 64];
	unsigned n;
};

static void name_one(const char *pid, const char *comm, const char *what, void *ud)
{
	struct named *nm = ud;

	if (nm->n < NAMED_MAX)
		snprintf(nm->names[nm->n++], sizeof(nm->names[0]), "%s (%s, %s)", pid, comm, what);
}

void up_warn_processes(const char *dir)
{
	static struct named nm;
	unsigned hits;

	nm.n = 0;
	if (!(hits = up_procs_below(dir, name_one, &nm)))
		return;
	fprintf(stderr,
		"airlock: up: %u process%s below %s will not see the mount (what they write stays out of "
		"the sandbox):\n",
		hits, hits == 1 ? "" : "es", dir);
	for (unsigned i = 0; i < nm.n; i++)
		fprintf(stderr, "airlock:   pid %s\n", nm.names[i]);
	if (hits > NAMED_MAX)
		fprintf(stderr, "airlock:   ... and %u more\n", hits - NAMED_MAX);
	fprintf(stderr, "airlock: in each such shell run: cd \"$PWD\" (editors: reopen the files)\n");
}

/* A fusermount3 for a user without CAP_SYS_ADMIN: libfuse runs it. */
static bool have_fusermount(void)
{
	static const char *const dirs[] = {"/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"};
	char path[PATH_MAX];

	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(path, sizeof(path), "%s/fusermount3", dirs[i]);
		if (access(path, X_OK) == 0)
			return true;
	}
	return false;
}

int up_check_fuse(void)
{
	struct stat st;

	if (stat("/dev/fuse", &st) < 0 || !S_ISCHR(st.st_mode)) {
		cmd_err("up: /dev/fuse is missing: airlock up mounts the workspace with FUSE. Load the module "
			"(sudo modprobe fuse), or in a container pass the device (docker run --device /dev/fuse "
			"--cap-add SYS_ADMIN); airlock doctor checks it");
		return 1;
	}
	if (access("/dev/fuse", R_OK | W_OK) < 0) {
		cmd_err("up: /dev/fuse: %s for uid %d (mode %04o, owner %d:%d): airlock up mounts the workspace with "
			"FUSE and needs read-write access to it. Fix: sudo chmod 0666 /dev/fuse (the usual mode), "
			"or run as a user of its group; airlock doctor checks it",
			strerror(errno), (int)getuid(), (unsigned)(st.st_mode & 07777), (int)st.st_uid, (int)st.st_gid);
		return 1;
	}
	if (geteuid() != 0 && !have_fusermount()) {
		cmd_err("up: fusermount3 not found: a user other than root mounts FUSE through it. Install it "
			"(Debian, Ubuntu: apt install fuse3; Fedora: dnf install fuse3)");
		return 1;
	}
	return 0;
}
