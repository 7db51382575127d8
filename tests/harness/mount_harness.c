/* SPDX-License-Identifier: Apache-2.0 */
/*
 * mount_harness: mount DIR over itself with the mount module and print every
 * journal record as one line on stdout, until SIGTERM/SIGINT unmounts.
 *
 *   mount_harness [--max-records N] [--threads N] [--quiet] [--allow-other] [--debug] DIR
 *
 * Lines (tab-separated):
 *   mounted<TAB>PATH                      once the mount is live
 *   FIRST-LAST<TAB>OP<TAB>PATH<TAB>PATH2<TAB>DETAIL
 *       PATH2 "-" when none; DETAIL: write "OFF+LEN,..." or "whole";
 *       truncate "size=N"; setattr "mode|owner|times"; else "-"
 *   upto<TAB>SEQ                          after each drained batch
 *   stopped                               after a clean unmount
 * --quiet prints only the mounted/upto/stopped lines (benchmarks).
 * Exit 77 when FUSE is unavailable here (no /dev/fuse, not permitted).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "airlock/mount/journal.h"
#include "airlock/mount/mount.h"

static int wake_pipe[2];

static void notify(void *ud)
{
	(void)ud;
	/* a full pipe already means "wake up" */
	if (write(wake_pipe[1], "x", 1) < 0) {
	}
}

static void print_rec(const struct journal_rec *r)
{
	printf("%" PRIu64 "-%" PRIu64 "\t%s\t%s\t%s\t", r->first_seq, r->last_seq, journal_op_name(r->op), r->path,
	       r->path2 ? r->path2 : "-");
	if (r->op == JOURNAL_WRITE && (r->flags & JOURNAL_F_WHOLE)) {
		printf("whole");
	} else if (r->op == JOURNAL_WRITE) {
		for (uint32_t i = 0; i < r->nranges; i++)
			printf("%s%" PRIu64 "+%" PRIu64, i ? "," : "", r->ranges[i].off, r->ranges[i].len);
	} else if (r->op == JOURNAL_TRUNCATE) {
		printf("size=%" PRIu64, r->size);
	} else if (r->op == JOURNAL_SETATTR) {
		const char *sep = "";

		if (r->flags & JOURNAL_F_MODE) {
			printf("mode");
			sep = "|";
		}
		if (r->flags & JOURNAL_F_OWNER) {
			printf("%sowner", sep);
			sep = "|";
		}
		if (r->flags & JOURNAL_F_TIMES)
			printf("%stimes", sep);
	} else {
		printf("-");
	}
	printf("\n");
}

static void drain_all(struct journal *j, int quiet)
{
	struct journal_rec recs[256];
	uint64_t upto = 0;
	size_t n, i, total = 0;

	do {
		n = journal_drain(j, recs, 256, &upto);
		for (i = 0; i < n; i++) {
			if (!quiet)
				print_rec(&recs[i]);
			journal_rec_clear(&recs[i]);
		}
		total += n;
	} while (n == 256);
	if (total)
		printf("upto\t%" PRIu64 "\n", upto);
	fflush(stdout);
}

int main(int argc, char **argv)
{
	struct journal_opts jo = {.notify = notify};
	struct mount_opts mo = {0};
	struct journal *j;
	struct mount *m;
	sigset_t set;
	int sfd, r, quiet = 0, i;
	const char *dir = NULL;

	for (i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--max-records") == 0 && i + 1 < argc)
			jo.max_records = strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--threads") == 0 && i + 1 < argc)
			mo.max_threads = (unsigned)strtoul(argv[++i], NULL, 10);
		else if (strcmp(argv[i], "--quiet") == 0)
			quiet = 1;
		else if (strcmp(argv[i], "--debug") == 0)
			mo.debug = 1;
		else if (strcmp(argv[i], "--allow-other") == 0)
			mo.allow_other = 1;
		else
			dir = argv[i];
	}
	if (!dir) {
		fprintf(stderr, "usage: mount_harness [--max-records N] [--threads N] [--quiet] "
				"[--allow-other] [--debug] DIR\n");
		return 2;
	}
	/* every thread started from here on inherits the blocked set, so the
	 * signals arrive only through the signalfd */
	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGHUP);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	sfd = signalfd(-1, &set, SFD_CLOEXEC);
	if (sfd < 0 || pipe2(wake_pipe, O_CLOEXEC | O_NONBLOCK) < 0) {
		perror("mount_harness");
		return 1;
	}
	j = journal_new(&jo);
	if (!j) {
		fprintf(stderr, "mount_harness: out of memory\n");
		return 1;
	}
	r = mount_start(dir, j, &mo, &m);
	if (r < 0) {
		fprintf(stderr, "mount_harness: cannot mount %s: %s\n", dir, strerror(-r));
		journal_free(j);
		return r == -ENODEV || r == -EPERM ? 77 : 1;
	}
	printf("mounted\t%s\n", mount_path(m));
	fflush(stdout);
	for (;;) {
		struct pollfd p[2] = {{.fd = wake_pipe[0], .events = POLLIN}, {.fd = sfd, .events = POLLIN}};
		char buf[256];

		if (poll(p, 2, -1) < 0 && errno != EINTR)
			break;
		if (p[0].revents & POLLIN) {
			while (read(wake_pipe[0], buf, sizeof(buf)) > 0)
				;
			drain_all(j, quiet);
		}
		if (p[1].revents & POLLIN)
			break;
	}
	mount_stop(m);
	drain_all(j, quiet);
	journal_free(j);
	printf("stopped\n");
	fflush(stdout);
	return 0;
}
