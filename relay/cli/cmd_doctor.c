/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock doctor [--json]: what airlock needs from this host, one check a
 * line, each failing one with its fix. Exit 0 when nothing fails (warnings
 * are things only some setups need: the vm sandbox, cgroup limits).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/landlock.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/server/relay.h"
#include "cmd_i.h"
#include "up_i.h"

enum verdict { OK, WARN, FAIL };
static const char *const verdict_names[] = {"ok", "warn", "fail"};

struct doctor {
	json_t *checks;
	bool json;
	unsigned fails, warns;
};

static void report(struct doctor *d, const char *name, enum verdict v, const char *fix, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));

static void report(struct doctor *d, const char *name, enum verdict v, const char *fix, const char *fmt, ...)
{
	char detail[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(detail, sizeof(detail), fmt, ap);
	va_end(ap);
	d->fails += v == FAIL;
	d->warns += v == WARN;
	json_array_append_new(d->checks, json_pack("{s:s, s:s, s:s, s:s?}", "name", name, "status", verdict_names[v],
						   "detail", detail, "fix", v == OK ? NULL : fix));
	if (d->json)
		return;
	printf("%-4s  %-18s %s\n", v == OK ? "ok" : v == WARN ? "warn" : "FAIL", name, detail);
	if (v != OK && fix)
		printf("      %-18s fix: %s\n", "", fix);
}

/* The first line of a /proc or /sys file as a number; -1 when unreadable. */
static long read_long(const char *path)
{
	FILE *f = fopen(path, "re");
	long v = -1;

	if (f) {
		if (fscanf(f, "%ld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static bool in_path(const char *name, char *out, size_t n)
{
	const char *p = getenv("PATH");
	char dirs[4096];

	snprintf(dirs, sizeof(dirs), "%s", p && *p ? p : "/usr/local/bin:/usr/bin:/bin");
	for (char *s, *tok = strtok_r(dirs, ":", &s); tok; tok = strtok_r(NULL, ":", &s)) {
		snprintf(out, n, "%s/%s", tok, name);
		if (access(out, X_OK) == 0)
			return true;
	}
	return false;
}

static void check_fuse(struct doctor *d)
{
	struct stat st;
	char path[PATH_MAX];

	if (stat("/dev/fuse", &st) < 0 || !S_ISCHR(st.st_mode))
		report(d, "fuse", FAIL, "sudo modprobe fuse (in a container: --device /dev/fuse --cap-add SYS_ADMIN)",
		       "/dev/fuse is missing: airlock up cannot mount a workspace");
	else if (access("/dev/fuse", R_OK | W_OK) < 0)
		report(d, "fuse", FAIL, "sudo chmod 0666 /dev/fuse (the usual mode), or join its group",
		       "/dev/fuse (mode %04o, %d:%d) is not read-writable by uid %d", (unsigned)(st.st_mode & 07777),
		       (int)st.st_uid, (int)st.st_gid, (int)getuid());
	else
		report(d, "fuse", OK, NULL, "/dev/fuse is usable (mode %04o)", (unsigned)(st.st_mode & 07777));
	if (in_path("fusermount3", path, sizeof(path)))
		report(d, "fusermount3", OK, NULL, "%s", path);
	else
		report(d, "fusermount3", geteuid() == 0 ? WARN : FAIL, "apt install fuse3 (Fedora: dnf install fuse3)",
		       "fusermount3 not found: users other than root mount through it");
}

static void check_userns(struct doctor *d)
{
	long clone = read_long("/proc/sys/kernel/unprivileged_userns_clone");
	long max = read_long("/proc/sys/user/max_user_namespaces");
	long aa = read_long("/proc/sys/kernel/apparmor_restrict_unprivileged_userns");

	if (clone == 0)
		report(d, "user namespaces", FAIL, "sudo sysctl -w kernel.unprivileged_userns_clone=1",
		       "kernel.unprivileged_userns_clone=0: the local sandbox cannot start");
	else if (max == 0)
		report(d, "user namespaces", FAIL, "sudo sysctl -w user.max_user_namespaces=15000",
		       "user.max_user_namespaces=0: the local sandbox cannot start");
	else if (aa == 1 && geteuid() != 0)
		report(
		    d, "user namespaces", WARN,
		    "an AppArmor profile for airlock, or sudo sysctl -w kernel.apparmor_restrict_unprivileged_userns=0",
		    "kernel.apparmor_restrict_unprivileged_userns=1 may refuse the local sandbox's namespaces");
	else
		report(d, "user namespaces", OK, NULL, "enabled (user.max_user_namespaces=%ld)", max);
}

static void check_confinement(struct doctor *d)
{
	long abi = syscall(SYS_landlock_create_ruleset, NULL, 0, LANDLOCK_CREATE_RULESET_VERSION);
	long sc = prctl(PR_GET_SECCOMP, 0, 0, 0, 0);

	if (abi > 0)
		report(d, "landlock", OK, NULL, "ABI %ld", abi);
	else
		report(d, "landlock", WARN, "a kernel >= 5.13 with CONFIG_SECURITY_LANDLOCK and lsm=...,landlock",
		       "not available (%s): sandboxed commands are confined by namespaces and seccomp only",
		       strerror(errno));
	if (sc >= 0)
		report(d, "seccomp", OK, NULL, "available (this process: mode %ld)", sc);
	else
		report(d, "seccomp", FAIL, "a kernel with CONFIG_SECCOMP_FILTER", "not available: %s", strerror(errno));
}

static void check_vm(struct doctor *d)
{
	char path[PATH_MAX];

	if (in_path("qemu-system-x86_64", path, sizeof(path)))
		report(d, "qemu", OK, NULL, "%s (for --sandbox vm)", path);
	else
		report(d, "qemu", WARN, "apt install qemu-system-x86 (only --sandbox vm needs it)",
		       "qemu-system-x86_64 not found: --sandbox vm cannot start");
	if (access("/dev/kvm", R_OK | W_OK) == 0)
		report(d, "kvm", OK, NULL, "/dev/kvm is usable");
	else
		report(d, "kvm", WARN,
		       "add yourself to the kvm group (sudo usermod -aG kvm $USER), or enable nested virtualisation",
		       "/dev/kvm: %s: --sandbox vm runs without KVM (emulated, much slower)", strerror(errno));
}

static void check_cgroup(struct doctor *d)
{
	char line[512], path[PATH_MAX + 64] = "";
	FILE *f = fopen("/proc/self/cgroup", "re");

	while (f && fgets(line, sizeof(line), f))
		if (!strncmp(line, "0::", 3)) {
			line[strcspn(line, "\n")] = '\0';
			snprintf(path, sizeof(path), "/sys/fs/cgroup%s", line + 3);
		}
	if (f)
		fclose(f);
	if (!path[0] || access("/sys/fs/cgroup/cgroup.controllers", R_OK) < 0)
		report(d, "cgroups", WARN,
		       "boot with systemd.unified_cgroup_hierarchy=1 for per-command memory and pid limits",
		       "no unified cgroup v2 hierarchy at /sys/fs/cgroup: limits fall back to what v1 offers");
	else if (access(path, W_OK) < 0)
		report(d, "cgroups", WARN,
		       "run airlock up from a delegated unit: systemd-run --user -p Delegate=yes airlock up DIR",
		       "cgroup v2, but %s is not delegated to you: commands run without per-command limits", path);
	else
		report(d, "cgroups", OK, NULL, "cgroup v2, %s delegated", path);
}

static void shell_below(const char *pid, const char *comm, const char *what, void *ud)
{
	struct doctor *d = ud;

	if (!strcmp(what, "cwd"))
		report(d, "shell cwd", WARN, "in that shell: cd \"$PWD\"",
		       "pid %s (%s) has its cwd in the directory under a mount: it does not see the mount", pid, comm);
}

/* Airlock mounts: stale ones (no daemon), and processes that were in DIR
 * before its mount (their cwd is the directory under it). */
static void check_mounts(struct doctor *d)
{
	char line[8192];
	FILE *f = fopen("/proc/self/mountinfo", "re");
	unsigned live = 0;

	while (f && fgets(line, sizeof(line), f)) {
		char *dash = strstr(line, " - fuse.airlock ");
		char mp[PATH_MAX];
		if (!dash || sscanf(line, "%*s %*s %*s %*s %4095s", mp) != 1)
			continue;
		struct statfs sf;
		/* a dead server's connection answers ENOTCONN (statfs always asks it) */
		if (statfs(mp, &sf) < 0 && errno == ENOTCONN) {
			report(d, "stale mount", FAIL, "airlock down DIR (or: fusermount3 -uz DIR)",
			       "%s is an airlock mount whose daemon is gone (%s)", mp, strerror(ENOTCONN));
			continue;
		}
		live++;
		up_procs_below(mp, shell_below, d);
	}
	if (f)
		fclose(f);
	report(d, "mounts", OK, NULL, "%u live airlock mount%s", live, live == 1 ? "" : "s");
}

/* Relay sockets in the runtime directory that nobody listens on. */
static void check_sockets(struct doctor *d)
{
	char dir[PATH_MAX], *slash;
	struct dirent *de;
	unsigned stale = 0;
	DIR *dd;

	/* the directory every workspace's socket goes in (AIRLOCK_SOCKET aside) */
	if (relay_default_path("/", dir, sizeof(dir)) < 0 || !(slash = strrchr(dir, '/')))
		return;
	*slash = '\0';
	if (!(dd = opendir(dir)))
		return;
	while ((de = readdir(dd))) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		size_t l = strlen(de->d_name);
		if (l < 6 || strcmp(de->d_name + l - 5, ".sock") ||
		    (size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, de->d_name) >= sizeof(sa.sun_path))
			continue;
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 && errno == ECONNREFUSED) {
			report(d, "stale socket", WARN,
			       "it is harmless (the next airlock up replaces it); rm it to tidy up",
			       "%s: nobody listens", sa.sun_path);
			stale++;
		}
		if (fd >= 0)
			close(fd);
	}
	closedir(dd);
	if (!stale)
		report(d, "sockets", OK, NULL, "no stale relay sockets in %s", dir);
}

int cmd_doctor(int argc, char **argv)
{
	struct doctor d = {.checks = json_array()};

	if (argc == 2 && !strcmp(argv[1], "--json"))
		d.json = true;
	else if (argc != 1) {
		cmd_operands("doctor", argc, argv, argc >= 2 && argv[1][0] == '-' ? 2 : 1, 0, "");
		json_decref(d.checks);
		return 2;
	}
	if (!d.checks) {
		cmd_err("doctor: out of memory");
		return 1;
	}
	check_fuse(&d);
	check_userns(&d);
	check_confinement(&d);
	check_vm(&d);
	check_cgroup(&d);
	check_mounts(&d);
	check_sockets(&d);
	if (d.json)
		return cmd_print_json(json_pack("{s:i, s:b, s:I, s:I, s:o}", "version", 1, "ok", d.fails == 0, "fails",
						(json_int_t)d.fails, "warnings", (json_int_t)d.warns, "checks",
						d.checks)) < 0 ||
			       d.fails
			   ? 1
			   : 0;
	json_decref(d.checks);
	printf("%u failed, %u warning%s\n", d.fails, d.warns, d.warns == 1 ? "" : "s");
	return d.fails ? 1 : 0;
}
