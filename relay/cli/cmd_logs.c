/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock logs [-f] [-n N] [DIR]: the last N lines of the daemon's log
 * (up.log in the state directory, timestamped; the older half of its
 * bounded history is up.log.1; up_log.c) and
 * of the sandbox agent's (agent.log of the local sandbox, console.log of
 * the vm), each under a header naming the file; -f then follows both
 * (rotation included) until interrupted.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/sandbox/sandbox.h"
#include "airlock/sync/audit.h"
#include "cmd_i.h"
#include "up_i.h"

#define TAIL_MAX (2u << 20) /* bytes read from the end of a file for -n */

struct logf {
	const char *what;
	char path[PATH_MAX + 32];
	off_t pos;
	ino_t ino;
	bool seen;
};

/* The last n lines of path (within its last TAIL_MAX bytes) to stdout;
 * the offset reached in *end. false when it cannot be read. */
static bool print_tail(const char *path, long n, off_t *end, ino_t *ino)
{
	struct stat st;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	char *buf;

	if (fd < 0 || fstat(fd, &st) < 0) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	*ino = st.st_ino;
	off_t from = st.st_size > (off_t)TAIL_MAX ? st.st_size - (off_t)TAIL_MAX : 0;
	size_t len = (size_t)(st.st_size - from);
	ssize_t got = 0;
	if (!(buf = malloc(len + 1))) {
		close(fd);
		return false;
	}
	if (len)
		got = pread(fd, buf, len, from);
	close(fd);
	if (got < 0)
		got = 0;
	size_t start = (size_t)got;
	for (long lines = 0; start > 0; start--)
		if (buf[start - 1] == '\n' && (size_t)got != start && ++lines >= n)
			break;
	fwrite(buf + start, 1, (size_t)got - start, stdout);
	free(buf);
	*end = from + got;
	return true;
}

/* What was appended to f since last time (from 0 after a rotation). */
static void follow_once(struct logf *f)
{
	char buf[65536];
	struct stat st;
	ssize_t n;
	int fd;

	if ((fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
		return;
	if (fstat(fd, &st) == 0 && (st.st_ino != f->ino || st.st_size < f->pos)) {
		f->ino = st.st_ino; /* rotated or truncated: the new file from its start */
		f->pos = 0;
	}
	while ((n = pread(fd, buf, sizeof(buf), f->pos)) > 0) {
		fwrite(buf, 1, (size_t)n, stdout);
		f->pos += n;
	}
	close(fd);
	fflush(stdout);
}

static void header(const struct logf *f)
{
	printf("==> %s: %s <==\n", f->what, f->path);
}

int cmd_logs(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"follow", no_argument, NULL, 'f'},
	    {"lines", required_argument, NULL, 'n'},
	    {NULL, 0, NULL, 0},
	};
	struct logf lf[2] = {{.what = "daemon"}, {.what = "agent"}};
	char real[PATH_MAX], sdir[PATH_MAX], sbdir[PATH_MAX], err[256];
	bool follow = false, any = false;
	const char *dir = NULL;
	long lines = 200;
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "fn:C:", opts, NULL)) != -1) {
		char *end;
		if (c == 'C') {
			dir = optarg;
		} else if (c == 'f') {
			follow = true;
		} else if (c == 'n' && (lines = strtol(optarg, &end, 10)) >= 0 && !*end && *optarg) {
			continue;
		} else {
			if (c == 'n')
				cmd_err("logs: -n '%s': a number of lines >= 0", optarg);
			cmd_usage("logs");
			return 2;
		}
	}
	if (argc - optind > (dir ? 0 : 1)) {
		cmd_operands("logs", argc, argv, optind, dir ? 0 : 1, "");
		return 2;
	}
	if (!dir)
		dir = optind < argc ? argv[optind] : ".";
	if ((r = ws_resolve(dir, real, true)) < 0) {
		cmd_err("logs: %s: %s", dir, strerror(-r));
		return 1;
	}
	if (audit_dir(real, 0, sdir, sizeof(sdir), err, sizeof(err)) < 0) {
		cmd_err("logs: %s", err);
		return 1;
	}
	snprintf(lf[0].path, sizeof(lf[0].path), "%s/%s", sdir, UP_LOG_FILE);
	if (sandbox_dir_of(real, sbdir, sizeof(sbdir)) == 0) {
		snprintf(lf[1].path, sizeof(lf[1].path), "%s/agent.log", sbdir);
		if (access(lf[1].path, R_OK) < 0) /* the vm's agent logs to its console */
			snprintf(lf[1].path, sizeof(lf[1].path), "%s/console.log", sbdir);
	}
	for (int i = 0; i < 2; i++) {
		struct stat st;
		if (!lf[i].path[0] || stat(lf[i].path, &st) < 0)
			continue;
		header(&lf[i]);
		lf[i].seen = print_tail(lf[i].path, lines, &lf[i].pos, &lf[i].ino);
		any = true;
	}
	if (!any && !follow) {
		cmd_err("logs: no log for %s yet (%s/%s is written by airlock up, with or without -d)", real, sdir,
			UP_LOG_FILE);
		return 1;
	}
	fflush(stdout);
	while (follow) {
		for (int i = 0; i < 2; i++)
			if (lf[i].path[0])
				follow_once(&lf[i]);
		usleep(250000);
	}
	return 0;
}
