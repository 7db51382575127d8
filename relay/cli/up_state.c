/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The state directory of a workspace (audit_dir), the daemon's pid file
 * and lock, and `airlock down` (doc/UP.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "airlock/core/loop.h"
#include "airlock/mount/mount.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/sync/audit.h"
#include "cmd_i.h"
#include "up_i.h"

/* The pid in state_dir/name while its writer holds the file's lock, else 0. */
static pid_t locked_pid(const char *state_dir, const char *name)
{
	char path[PATH_MAX + 32], text[32] = {0};
	pid_t pid = 0;
	int fd;

	snprintf(path, sizeof(path), "%s/%s", state_dir, name);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
		return 0;
	if (flock(fd, LOCK_SH | LOCK_NB) < 0 && errno == EWOULDBLOCK) {
		ssize_t n = pread(fd, text, sizeof(text) - 1, 0);
		if (n > 0)
			pid = (pid_t)strtol(text, NULL, 10);
		if (pid <= 0)
			pid = 0;
	}
	close(fd);
	return pid;
}

pid_t up_daemon_pid(const char *state_dir)
{
	return locked_pid(state_dir, UP_PID_FILE);
}

pid_t up_super_pid(const char *state_dir)
{
	return locked_pid(state_dir, UP_SUPER_FILE);
}

pid_t up_wait_daemon(const char *state_dir, unsigned ms)
{
	uint64_t t0 = loop_now_ms();
	pid_t pid;

	while (!(pid = up_daemon_pid(state_dir)) && up_super_pid(state_dir) && loop_now_ms() - t0 < ms)
		usleep(5000);
	return pid;
}

/* Create state_dir/name, lock it and write our pid: the lock fd, or -errno
 * (-EBUSY with *other the holder's pid when another process holds it). */
static int take_locked(const char *state_dir, const char *name, pid_t *other)
{
	char path[PATH_MAX + 32];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", state_dir, name);
	if ((fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
		return -errno;
	if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
		int e = errno;
		close(fd);
		if (e == EWOULDBLOCK) {
			*other = locked_pid(state_dir, name);
			return -EBUSY;
		}
		return -e;
	}
	/* checked: a full or read-only state directory is an error, not a
	 * pid file nobody can read */
	if (ftruncate(fd, 0) < 0 || dprintf(fd, "%d\n", (int)getpid()) < 0) {
		int e = errno;
		close(fd);
		return -e;
	}
	return fd;
}

int up_take_pid_file(struct up *u, pid_t *other)
{
	int fd = take_locked(u->state_dir, UP_PID_FILE, other);

	if (fd < 0)
		return fd;
	u->lockfd = fd;
	return 0;
}

int up_take_super_file(const char *state_dir, pid_t *other)
{
	return take_locked(state_dir, UP_SUPER_FILE, other);
}

void up_remove_state_files(struct up *u)
{
	char path[PATH_MAX + 32];

	snprintf(path, sizeof(path), "%s/%s", u->state_dir, UP_STATUS_FILE);
	unlink(path);
	snprintf(path, sizeof(path), "%s/%s", u->state_dir, UP_PID_FILE);
	unlink(path); /* while still holding the lock */
}

int up_state_dir_of(const char *dir, char *out, size_t n)
{
	char err[512];

	if (audit_dir(dir, 0, out, n, err, sizeof(err)) == 0)
		return 0;
	if (mount_clear_stale(dir) == 0 && audit_dir(dir, 0, out, n, err, sizeof(err)) == 0)
		return 0;
	cmd_err("%s", err);
	return -1;
}

void up_wait_usage(const char *cmd)
{
	cmd_usage(cmd);
}

/* down --destroy: the sandbox's state goes once nothing runs. */
static int down_destroy(const char *dir)
{
	char real[PATH_MAX], err[PATH_MAX + 128];
	int r;

	if (!realpath(dir, real)) {
		/* the workspace may be gone; its sandbox's state is still named by its path
		 */
		if (dir[0] != '/' || strlen(dir) >= sizeof(real)) {
			cmd_err("down: %s: %s (give the workspace's absolute path)", dir, strerror(errno));
			return 1;
		}
		snprintf(real, sizeof(real), "%s", dir);
	}
	char sdir[PATH_MAX];
	if ((r = sandbox_destroy(real, err, sizeof(err))) < 0 ||
	    (audit_dir(real, 0, sdir, sizeof(sdir), err, sizeof(err)) == 0 &&
	     (r = up_changes_forget(sdir, err, sizeof(err))) < 0)) {
		cmd_err("down: --destroy: %s", err);
		return 1;
	}
	fprintf(stderr, "airlock: the sandbox state of %s is removed\n", real);
	return 0;
}

static int down_stop(char **argv)
{
	char sdir[PATH_MAX];
	pid_t pid;
	int r;

	if (up_state_dir_of(argv[1], sdir, sizeof(sdir)) < 0)
		return 1;
	/* the supervisor first: it forwards the signal to the daemon and
	 * does not restart it, also when a crash left none running */
	if (!(pid = up_super_pid(sdir)))
		pid = up_daemon_pid(sdir);
	if (!pid) {
		r = mount_clear_stale(argv[1]);
		if (r == -EBUSY) {
			cmd_err("down: %s is served by an airlock process this state directory "
				"does not know",
				argv[1]);
			return 1;
		}
		if (r < 0) {
			cmd_err("down: %s: %s", argv[1], strerror(-r));
			return 1;
		}
		fprintf(stderr, "airlock: no airlock up runs for %s (nothing to stop)\n", argv[1]);
		return 0;
	}
	if (kill(pid, SIGTERM) < 0) {
		cmd_err("down: cannot signal pid %d: %s", (int)pid, strerror(errno));
		return 1;
	}
	for (uint64_t t0 = loop_now_ms(); loop_now_ms() - t0 < DOWN_WAIT_MS;) {
		if (!up_daemon_pid(sdir) && !up_super_pid(sdir) && mount_is_airlock(argv[1]) != 1)
			return 0;
		usleep(10000);
	}
	cmd_err("down: airlock up (pid %d) is still running %u s after SIGTERM; %s is %s", (int)pid,
		DOWN_WAIT_MS / 1000, argv[1], mount_is_airlock(argv[1]) == 1 ? "still mounted" : "unmounted");
	return 1;
}

int cmd_down(int argc, char **argv)
{
	int r;

	if (argc == 3 && !strcmp(argv[1], "--destroy")) {
		argv[1] = argv[2];
		argv[2] = "--destroy";
	}
	if (argc == 3 && strcmp(argv[2], "--destroy")) {
		up_wait_usage("down");
		return 2;
	}
	if (argc != 2 && argc != 3) {
		cmd_operands("down", argc, argv, 1, 1, "DIR (the workspace to stop)");
		return 2;
	}
	if (argc == 3) { /* works without a daemon, even one that never ran */
		char sdir[PATH_MAX], err[512];
		if (audit_dir(argv[1], 0, sdir, sizeof(sdir), err, sizeof(err)) == 0 && (r = down_stop(argv)) != 0)
			return r;
		return down_destroy(argv[1]);
	}
	return down_stop(argv);
}
