/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fc_standin: stands in for Firecracker's host-side vsock Unix socket in
 * tests, in front of a real airlock-agent listening on a Unix socket.
 *
 *   fc_standin UDS_PATH PORT TARGET_UNIX_PATH [--reply TEXT]
 *
 * Listens on UDS_PATH (replacing a stale socket there, never another kind
 * of file), prints "ready" on stdout once it accepts connections, and for
 * every client (one forked child each, so clients are served concurrently):
 *   - reads the line "CONNECT <port>\n" (at most 64 bytes, within 10 s);
 *   - if <port> is PORT: connects to TARGET_UNIX_PATH, answers
 *     "OK 1073741824\n" (or TEXT, written verbatim: include the "\n" you
 *     want, e.g. --reply $'FAILURE 2\n') and then copies bytes both ways,
 *     passing on half-closes, until both directions are closed or one
 *     side fails;
 *   - otherwise (other port, malformed line, or TARGET not accepting):
 *     closes the client without writing anything, as Firecracker does when
 *     nothing in the guest listens on the port. With --reply, TEXT is still
 *     written when TARGET cannot be reached, then the client is closed.
 * SIGTERM or SIGINT: removes UDS_PATH, ends and reaps the children serving
 * clients, and exits 0.
 * Exit status 2 for bad usage, 1 when it cannot listen.
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#define LINE_MAX_BYTES	64
#define LINE_TIMEOUT_MS 10000
#define SPLICE_BUF	65536

#define MAX_CHILDREN 1024

static volatile sig_atomic_t stop_requested;

/* Children serving clients, so that stopping can end and reap them (this
 * process may run under an init that does not reap orphans promptly). */
static pid_t children[MAX_CHILDREN];

static void on_stop(int sig)
{
	(void)sig;
	stop_requested = 1;
}

static void on_child(int sig)
{
	(void)sig; /* only here to interrupt ppoll() */
}

static void reap_children(int block)
{
	for (int i = 0; i < MAX_CHILDREN; i++) {
		if (children[i] > 0 && waitpid(children[i], NULL, block ? 0 : WNOHANG) != 0)
			children[i] = 0;
	}
}

static void track_child(pid_t pid)
{
	for (int i = 0; i < MAX_CHILDREN; i++) {
		if (children[i] == 0) {
			children[i] = pid;
			return;
		}
	}
	/* Table full: the child still dies with us (PR_SET_PDEATHSIG). */
}

static int fill_sun(struct sockaddr_un *sun, const char *path, socklen_t *len)
{
	size_t pl = strlen(path);

	if (pl == 0 || pl >= sizeof(sun->sun_path))
		return -1;
	memset(sun, 0, sizeof(*sun));
	sun->sun_family = AF_UNIX;
	memcpy(sun->sun_path, path, pl + 1);
	*len = (socklen_t)(offsetof(struct sockaddr_un, sun_path) + pl + 1);
	return 0;
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n > 0) {
		ssize_t w = send(fd, p, n, MSG_NOSIGNAL);

		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

/* "CONNECT <1-10 digits>\n" read one byte at a time; the port or -1. */
static long long read_connect_line(int fd)
{
	char line[LINE_MAX_BYTES + 1];
	size_t n = 0;

	while (n < LINE_MAX_BYTES) {
		struct pollfd pfd = {.fd = fd, .events = POLLIN};
		int r = poll(&pfd, 1, LINE_TIMEOUT_MS);
		ssize_t got;

		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		got = read(fd, line + n, 1);
		if (got < 0 && (errno == EINTR || errno == EAGAIN))
			continue;
		if (got <= 0)
			return -1;
		if (line[n++] == '\n')
			break;
	}
	line[n] = '\0';
	if (n < 10 || n > 8 + 10 + 1 || memcmp(line, "CONNECT ", 8) != 0 || line[n - 1] != '\n')
		return -1;
	for (size_t i = 8; i < n - 1; i++)
		if (line[i] < '0' || line[i] > '9')
			return -1;
	return strtoll(line + 8, NULL, 10);
}

struct direction {
	int src, dst;
	char buf[SPLICE_BUF];
	size_t off, len;
	int eof;  /* src said EOF */
	int done; /* and everything was passed on, dst shut down for writing */
};

/* Copy both ways with non-blocking fds and one buffer per direction, so a
 * peer that does not read never stalls the other direction. */
static void splice_both(int a, int b)
{
	static struct direction d[2];

	d[0] = (struct direction){.src = a, .dst = b};
	d[1] = (struct direction){.src = b, .dst = a};
	if (fcntl(a, F_SETFL, fcntl(a, F_GETFL) | O_NONBLOCK) < 0 ||
	    fcntl(b, F_SETFL, fcntl(b, F_GETFL) | O_NONBLOCK) < 0)
		return;
	while (!d[0].done || !d[1].done) {
		struct pollfd pfd[2];

		for (int i = 0; i < 2; i++) {
			pfd[i] = (struct pollfd){.fd = -1};
			if (d[i].done)
				continue;
			if (d[i].len > 0)
				pfd[i] = (struct pollfd){.fd = d[i].dst, .events = POLLOUT};
			else if (!d[i].eof)
				pfd[i] = (struct pollfd){.fd = d[i].src, .events = POLLIN};
		}
		if (poll(pfd, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			return;
		}
		for (int i = 0; i < 2; i++) {
			struct direction *x = &d[i];

			if (pfd[i].fd < 0 || !pfd[i].revents)
				goto flush;
			if (x->len == 0) {
				ssize_t n = read(x->src, x->buf, sizeof(x->buf));

				if (n > 0) {
					x->off = 0;
					x->len = (size_t)n;
				} else if (n == 0) {
					x->eof = 1;
				} else if (errno != EAGAIN && errno != EINTR) {
					return; /* reset: end everything */
				}
			} else {
				ssize_t w = send(x->dst, x->buf + x->off, x->len, MSG_NOSIGNAL);

				if (w > 0) {
					x->off += (size_t)w;
					x->len -= (size_t)w;
				} else if (w < 0 && errno != EAGAIN && errno != EINTR) {
					return; /* the reader went away */
				}
			}
		flush:
			if (x->eof && x->len == 0 && !x->done) {
				shutdown(x->dst, SHUT_WR);
				x->done = 1;
			}
		}
	}
}

static void serve(int cfd, unsigned long port, const char *target, const char *reply)
{
	struct sockaddr_un sun;
	socklen_t len;
	long long asked = read_connect_line(cfd);
	int tfd;

	if (asked < 0 || (unsigned long long)asked != port)
		return;
	tfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (tfd < 0 || fill_sun(&sun, target, &len) < 0 || connect(tfd, (struct sockaddr *)&sun, len) < 0) {
		if (reply)
			(void)write_all(cfd, reply, strlen(reply));
		if (tfd >= 0)
			close(tfd);
		return;
	}
	if (write_all(cfd, reply ? reply : "OK 1073741824\n", strlen(reply ? reply : "OK 1073741824\n")) == 0)
		splice_both(cfd, tfd);
	close(tfd);
}

static int usage(void)
{
	fprintf(stderr, "usage: fc_standin UDS_PATH PORT TARGET_UNIX_PATH [--reply TEXT]\n");
	return 2;
}

int main(int argc, char **argv)
{
	const char *pos[3] = {NULL, NULL, NULL}, *reply = NULL;
	struct sockaddr_un sun;
	struct sigaction sa;
	sigset_t stopsigs, waitmask;
	struct stat st;
	unsigned long port;
	socklen_t len;
	pid_t parent = getpid();
	int npos = 0, lfd;
	char *end;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--reply") == 0) {
			if (++i >= argc)
				return usage();
			reply = argv[i];
		} else if (npos < 3) {
			pos[npos++] = argv[i];
		} else {
			return usage();
		}
	}
	if (npos != 3)
		return usage();
	errno = 0;
	port = strtoul(pos[1], &end, 10);
	if (errno || end == pos[1] || *end || pos[1][0] == '-' || port > 0xffffffffUL)
		return usage();
	if (fill_sun(&sun, pos[0], &len) < 0) {
		fprintf(stderr, "fc_standin: %s: bad socket path\n", pos[0]);
		return 2;
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = on_stop; /* no SA_RESTART: poll() must see EINTR */
	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	sa.sa_handler = on_child;
	sigaction(SIGCHLD, &sa, NULL);
	signal(SIGPIPE, SIG_IGN);
	/* Block these signals except inside ppoll(), so one that arrives
	 * between the check of stop_requested and the wait is not lost. */
	sigemptyset(&stopsigs);
	sigaddset(&stopsigs, SIGTERM);
	sigaddset(&stopsigs, SIGINT);
	sigaddset(&stopsigs, SIGCHLD);
	sigprocmask(SIG_BLOCK, &stopsigs, &waitmask);

	if (lstat(pos[0], &st) == 0) {
		if (!S_ISSOCK(st.st_mode)) {
			fprintf(stderr, "fc_standin: %s exists and is not a socket\n", pos[0]);
			return 1;
		}
		unlink(pos[0]);
	}
	lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0 || bind(lfd, (struct sockaddr *)&sun, len) < 0 || listen(lfd, 64) < 0) {
		fprintf(stderr, "fc_standin: cannot listen on %s: %s\n", pos[0], strerror(errno));
		return 1;
	}
	printf("ready\n");
	fflush(stdout);

	while (!stop_requested) {
		struct pollfd pfd = {.fd = lfd, .events = POLLIN};
		pid_t pid;
		int cfd;

		if (ppoll(&pfd, 1, NULL, &waitmask) < 0) {
			reap_children(0); /* EINTR: a child ended, or stop */
			continue;
		}
		cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
		if (cfd < 0)
			continue;
		pid = fork();
		if (pid == 0) {
			signal(SIGTERM, SIG_DFL);
			signal(SIGINT, SIG_DFL);
			signal(SIGCHLD, SIG_DFL);
			sigprocmask(SIG_SETMASK, &waitmask, NULL);
			prctl(PR_SET_PDEATHSIG, SIGKILL);
			if (getppid() != parent)
				_exit(0);
			close(lfd);
			serve(cfd, port, pos[2], reply);
			close(cfd);
			_exit(0);
		}
		if (pid > 0)
			track_child(pid);
		close(cfd);
	}
	close(lfd);
	unlink(pos[0]);
	for (int i = 0; i < MAX_CHILDREN; i++)
		if (children[i] > 0)
			kill(children[i], SIGTERM);
	reap_children(1);
	return 0;
}
