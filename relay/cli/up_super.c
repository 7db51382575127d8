/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The supervisor of `airlock up` (doc/UP.md "Crashes"): the process that
 * parsed the command line forks the daemon and stays behind, small and
 * single-threaded, holding a duplicate of the mount's /dev/fuse descriptor.
 * When the daemon dies abnormally the FUSE connection therefore stays up
 * (the kernel queues requests) and a new daemon, forked from the same
 * parsed state, resumes serving it (mount_opts.adopt_init): DIR never
 * stops being the workspace. A clean exit of the daemon ends the
 * supervisor with the same status.
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
#include "airlock/mount/mount.h"
#include "cmd_i.h"
#include "up_i.h"

#define SUPER_INIT_MAX	 4096u
#define SUPER_BURST	 5u /* restarts allowed within SUPER_BURST_MS */
#define SUPER_BURST_MS	 60000u
#define SUPER_EPOCH_LAST 65535u

/* Daemon side: the mount is live; give the supervisor its connection. */
void up_super_hand_mount(struct up *u)
{
	size_t len = 0;
	const void *init = mount_init_request(u->mount, &len);
	int fd = mount_fuse_fd(u->mount);
	char cbuf[CMSG_SPACE(sizeof(int))];
	struct iovec iov = {.iov_base = (void *)init, .iov_len = len};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *c;

	if (u->super.sock < 0)
		return;
	if (!init || len == 0) {
		cmd_err("up: the mount's FUSE_INIT was not kept: a crash of this daemon will not be "
			"recovered");
	} else {
		memset(cbuf, 0, sizeof(cbuf));
		c = CMSG_FIRSTHDR(&mh);
		c->cmsg_level = SOL_SOCKET;
		c->cmsg_type = SCM_RIGHTS;
		c->cmsg_len = CMSG_LEN(sizeof(int));
		memcpy(CMSG_DATA(c), &fd, sizeof(int));
		if (sendmsg(u->super.sock, &mh, MSG_NOSIGNAL) < 0)
			cmd_err("up: cannot hand the mount to the supervisor (%s): a crash of this daemon "
				"will not be recovered",
				strerror(errno));
	}
	close(u->super.sock);
	u->super.sock = -1;
}

/* Supervisor: take the mount the daemon handed over on sock. */
static void take_mount(struct up_super *s, int sock)
{
	char cbuf[CMSG_SPACE(sizeof(int))];
	char *data = mem_alloc(SUPER_INIT_MAX);
	struct iovec iov = {.iov_base = data, .iov_len = SUPER_INIT_MAX};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	struct cmsghdr *c;
	ssize_t n;
	int fd = -1;

	if (!data)
		return;
	n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC);
	for (c = n > 0 ? CMSG_FIRSTHDR(&mh) : NULL; c; c = CMSG_NXTHDR(&mh, c))
		if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SCM_RIGHTS && c->cmsg_len == CMSG_LEN(sizeof(int)))
			memcpy(&fd, CMSG_DATA(c), sizeof(int));
	if (n <= 0 || fd < 0 || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		if (fd >= 0)
			close(fd);
		mem_free(data);
		return;
	}
	if (s->fuse_fd >= 0)
		close(s->fuse_fd);
	mem_free(s->init);
	s->fuse_fd = fd;
	s->init = data;
	s->init_len = (size_t)n;
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
	cmd_err("up: the daemon for %s %s; %u restarts in %u s, giving up: %s is unmounted, start "
		"again with: airlock up %s",
		u->dir, why, SUPER_BURST, SUPER_BURST_MS / 1000, u->dir, u->dir);
	mount_detach(u->dir);
	close(u->super.fuse_fd);
	u->super.fuse_fd = -1;
}

/* Supervisor: wait for the daemon pid to end, taking the mount when it is
 * handed over and forwarding stop signals. Returns its wait status. */
static int watch(struct up *u, pid_t pid, int sock, int sigfd)
{
	int pidfd = (int)syscall(SYS_pidfd_open, pid, 0), status = 0;

	for (;;) {
		struct pollfd p[3] = {
		    {.fd = pidfd, .events = POLLIN}, {.fd = sock, .events = POLLIN}, {.fd = sigfd, .events = POLLIN}};

		if (poll(p, 3, pidfd < 0 ? 100 : -1) < 0 && errno != EINTR)
			break;
		if (p[1].revents & POLLIN) {
			take_mount(&u->super, sock);
			close(sock);
			sock = -1;
		} else if (p[1].revents) {
			close(sock);
			sock = -1;
		}
		if (p[2].revents & POLLIN) {
			struct signalfd_siginfo si;
			if (read(sigfd, &si, sizeof(si)) == (ssize_t)sizeof(si))
				kill(pid, (int)si.ssi_signo); /* the daemon stops; its exit ends us */
		}
		if (waitpid(pid, &status, WNOHANG) == pid)
			break;
	}
	if (pidfd >= 0)
		close(pidfd);
	if (sock >= 0)
		close(sock);
	return status;
}

/* Supervisor: stdout/stderr of a -d daemon go to up.log. */
static void to_log(struct up *u)
{
	char log[PATH_MAX + 32];
	int fd;

	snprintf(log, sizeof(log), "%s/%s", u->state_dir, UP_LOG_FILE);
	if ((fd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0600)) >= 0) {
		dup2(fd, STDOUT_FILENO);
		dup2(fd, STDERR_FILENO);
		close(fd);
	}
}

int up_supervise(struct up *u)
{
	sigset_t stop, old;
	uint64_t burst_t0 = 0;
	unsigned burst = 0;
	int sigfd, status;

	sigemptyset(&stop);
	sigaddset(&stop, SIGTERM);
	sigaddset(&stop, SIGINT);
	sigaddset(&stop, SIGHUP);
	sigprocmask(SIG_BLOCK, &stop, &old);
	if ((sigfd = signalfd(-1, &stop, SFD_CLOEXEC)) < 0) {
		sigprocmask(SIG_SETMASK, &old, NULL);
		return 0; /* unsupervised: run the daemon in this process */
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
			if (u->super.fuse_fd >= 0)
				give_up(u, "could not be restarted");
			exit(1);
		}
		if (pid == 0) {
			close(sigfd);
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
			to_log(u);
		}
		status = watch(u, pid, sp[0], sigfd);
		if (WIFEXITED(status) && (WEXITSTATUS(status) == 0 || u->super.fuse_fd < 0))
			exit(WEXITSTATUS(status)); /* a clean stop, or it never served the mount */
		if (u->super.fuse_fd < 0)
			exit(1);
		describe_exit(why, sizeof(why), status);
		if (loop_now_ms() - burst_t0 > SUPER_BURST_MS) {
			burst_t0 = loop_now_ms();
			burst = 0;
		}
		if (++burst > SUPER_BURST || u->super.epoch >= SUPER_EPOCH_LAST) {
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
