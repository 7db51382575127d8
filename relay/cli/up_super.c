/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The supervisor of `airlock up` (doc/UP.md "Crashes"): the process that
 * parsed the command line forks the daemon and stays behind, small and
 * single-threaded, holding a duplicate of the mount's /dev/fuse descriptor.
 * When the daemon dies abnormally the FUSE connection therefore stays up
 * (the kernel queues requests) and a new daemon, forked from the same
 * parsed state, resumes serving it (mount_opts.adopt_init): DIR never
 * stops being the workspace. A daemon that exits (a stop, an error: it
 * unmounted on its way out) ends the supervisor with the same status; only
 * a death by a signal (kill -9, a crash) is restarted.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/mount/keep.h"
#include "airlock/mount/mount.h"
#include "cmd_i.h"
#include "up_i.h"

/* a crash loop: this many daemons in a row died within SUPER_QUICK_MS of
 * their start, before they were connected to the guest */
#define SUPER_BURST	 10u
#define SUPER_QUICK_MS	 2000u
#define SUPER_EPOCH_LAST 65535u

static bool have_mount(const struct up *u)
{
	const void *init;
	size_t len;

	return mount_keep_conn(u->super.keep, &init, &len) >= 0;
}

static void describe_exit(char *out, size_t n, int status)
{
	if (WIFSIGNALED(status))
		snprintf(out, n, "killed by signal %d (%s)", WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(out, n, "exited with status %d", WEXITSTATUS(status));
}

/* Supervisor: a restart budget is spent. Leave DIR showing the backing
 * files: detach the mount and drop the last descriptor of the connection
 * (the kernel then aborts it). */
static void give_up(struct up *u, const char *why)
{
	cmd_err("up: the daemon for %s %s; %u daemons in a row died within %u ms of their start, "
		"before reaching the guest; "
		"giving up: %s is unmounted (see %s/%s), start again with: airlock up %s",
		u->dir, why, SUPER_BURST, SUPER_QUICK_MS, u->dir, u->state_dir, UP_LOG_FILE, u->dir);
	mount_detach(u->dir);
	mount_keep_release(u->super.keep);
}

/* Supervisor: wait for the daemon pid to end, taking the mount when it is
 * handed over and forwarding stop signals. Returns its wait status. */
static int watch(struct up *u, pid_t pid, int sock, int sigfd, bool *stop)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0), status = 0;

	for (;;) {
		struct pollfd p[3] = {
		    {.fd = pidfd, .events = POLLIN}, {.fd = sock, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};

		if (poll(p, 3, pidfd < 0 ? 100 : -1) < 0 && errno != EINTR)
			break;
		int r = p[1].revents ? mount_keep_recv(u->super.keep, sock) : 1;

		if (r == 0 || (r < 0 && r != -EPROTO && r != -EINTR)) {
			close(sock); /* the stream ended (or broke): keep what came */
			sock = -1;
		}
		if (p[2].revents & POLLIN) {
			struct signalfd_siginfo si;
			if (read(sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
				*stop = true; /* no restart after this */
				kill(pid, (int)si.ssi_signo);
			}
		}
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
	}
	if (pidfd >= 0)
		close(pidfd);
	if (sock >= 0) {
		/* what it sent before it died; without blocking: a child of
		 * the daemon may still hold the other end */
		int r;
		fcntl(sock, F_SETFL, O_NONBLOCK);
		while ((r = mount_keep_recv(u->super.keep, sock)) > 0 || r == -EPROTO)
			;
		close(sock);
	}
	return status;
}

int up_supervise(struct up *u)
{
	sigset_t stopsigs, old;
	uint64_t started = 0;
	unsigned burst = 0;
	int sigfd, status, lock;
	pid_t other = 0;
	bool stop = false;

	sigemptyset(&stopsigs);
	sigaddset(&stopsigs, SIGTERM);
	sigaddset(&stopsigs, SIGINT);
	sigaddset(&stopsigs, SIGHUP);
	if ((lock = up_take_super_file(u->state_dir, &other)) < 0) {
		if (lock == -EBUSY)
			cmd_err("up: airlock up is already running for %s (supervisor pid %d); stop it with: "
				"airlock down %s",
				u->dir, (int)other, u->dir);
		else
			cmd_err("up: supervisor lock in %s: %s", u->state_dir, strerror(-lock));
		return 1;
	}
	if (!(u->super.keep = mount_keep_new()))
		return 0; /* unsupervised: run the daemon in this process */
	sigprocmask(SIG_BLOCK, &stopsigs, &old);
	if ((sigfd = signalfd(-1, &stopsigs, SFD_CLOEXEC)) < 0) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		return 0;
	}
	for (;;) {
		int sp[2];
		pid_t pid;
		char why[128];

		if (socketpair(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0, sp) < 0) {
			sp[0] = sp[1] = -1;
		}
		if ((pid = fork()) < 0) {
			cmd_err("up: cannot start the daemon: %s", strerror(errno));
			if (have_mount(u))
				give_up(u, "could not be restarted");
			exit(1);
		}
		if (pid == 0) {
			close(sigfd);
			close(lock);
			if (sp[0] >= 0)
				close(sp[0]);
			sigprocmask(SIG_SETMASK, &old, NULL);
			u->super.sock = sp[1];
			u->super.daemon_pid = getpid();
			return 0;
		}
		if (sp[1] >= 0)
			close(sp[1]);
		if (u->ready_fd >= 0) { /* the daemon answers -d's parent */
			close(u->ready_fd);
			u->ready_fd = -1;
			up_log_detach(); /* up.log only; the daemons it restarts inherit that */
		}
		started = loop_now_ms();
		status = watch(u, pid, sp[0], sigfd, &stop);
		if (stop) { /* asked to stop: whatever the daemon left, DIR is freed */
			if (have_mount(u) && mount_is_airlock(u->dir) == 1 &&
			    !(WIFEXITED(status) && !WEXITSTATUS(status)))
				mount_detach(u->dir);
			exit(WIFEXITED(status) ? WEXITSTATUS(status) : 0);
		}
		if (WIFEXITED(status))
			exit(WEXITSTATUS(status)); /* it stopped itself (and unmounted): its status is ours */
		if (!have_mount(u))
			exit(1);
		describe_exit(why, sizeof(why), status);
		/* a crash loop: quick deaths of daemons that never got to the guest */
		burst =
		    loop_now_ms() - started < SUPER_QUICK_MS && !up_status_was_live(u->state_dir, pid) ? burst + 1 : 0;
		if (burst >= SUPER_BURST || u->super.epoch >= SUPER_EPOCH_LAST) {
			give_up(u, why);
			exit(1);
		}
		u->super.epoch++;
		u->super.restarts++;
		snprintf(u->super.last_crash, sizeof(u->super.last_crash), "%s", why);
		u->super.crash_ms = (uint64_t)time(NULL) * 1000u;
		cmd_err("up: the daemon for %s (pid %d) %s; restarting it on the same mount (restart %u)", u->dir,
			(int)pid, why, u->super.restarts);
	}
}
