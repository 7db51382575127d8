/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The daemon's log: everything `airlock up` writes through stderr (and,
 * after -d, stdout) also goes to up.log in its state directory, each line
 * with a UTC timestamp, with or without -d. stderr becomes a stream of our
 * own (fopencookie) that writes each line to the log (rotated to up.log.1
 * past UP_LOG_MAX, so at most twice that on disk) and, until -d detaches,
 * to the terminal. No thread and no lock of ours: a write happens in the
 * thread that prints, under the stream's own lock, and the sandbox's
 * children (which may be started with a raw clone) inherit nothing held.
 * `airlock logs` reads it (cmd_logs.c; doc/UP.md).
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/io.h"

#include "cmd_i.h"
#include "up_i.h"

static struct {
	FILE *orig_err, *orig_out, *f;
	int term; /* the original stderr; -1 after up_log_detach */
	int log;
	int err; /* -errno of the last failed write to the log, 0 after one that worked */
	bool line_start;
	char path[PATH_MAX + 32], old[PATH_MAX + 32];
	off_t size;
} lg = {.term = -1, .log = -1};

static void log_open(void)
{
	struct stat st;

	lg.log = open(lg.path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC | O_NOFOLLOW, 0600);
	lg.err = lg.log < 0 ? -errno : 0;
	lg.size = lg.log >= 0 && fstat(lg.log, &st) == 0 ? st.st_size : 0;
}

/* "YYYY-MM-DDTHH:MM:SS.mmmZ " of now, computed here (no libc time zone
 * lock): days to a civil date, Howard Hinnant's algorithm. */
static size_t stamp(char *out, size_t n)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	long long s = ts.tv_sec, days = s / 86400, sod = s % 86400;
	long long z = days + 719468, era = (z >= 0 ? z : z - 146096) / 146097;
	long long doe = z - era * 146097, yoe = (doe - doe / 1460 + doe / 36524 - doe / 146096) / 365;
	long long doy = doe - (365 * yoe + yoe / 4 - yoe / 100), mp = (5 * doy + 2) / 153;
	long long d = doy - (153 * mp + 2) / 5 + 1, m = mp < 10 ? mp + 3 : mp - 9, y = yoe + era * 400 + (m <= 2);
	int k = snprintf(out, n, "%04lld-%02lld-%02lldT%02lld:%02lld:%02lld.%03ldZ ", y, m, d, sod / 3600,
			 sod / 60 % 60, sod % 60, ts.tv_nsec / 1000000);
	return k > 0 && (size_t)k < n ? (size_t)k : 0;
}

/* The stream's write: to the terminal as is, to the log with a stamp at
 * each line's start, rotating first when the log is full. */
static ssize_t log_write(void *cookie, const char *buf, size_t n)
{
	char ts[48];
	size_t done = 0;
	(void)cookie;

	if (lg.term >= 0)
		io_write_all(lg.term, buf, n); /* the terminal's writes are not checked */
	while (done < n) {
		const char *nl = memchr(buf + done, '\n', n - done);
		size_t len = nl ? (size_t)(nl - (buf + done)) + 1 : n - done;
		if (lg.line_start) {
			if (lg.size + (off_t)len + 32 > UP_LOG_MAX) {
				if (lg.log >= 0)
					close(lg.log);
				rename(lg.path, lg.old);
				log_open();
			} else if (lg.log < 0) {
				log_open(); /* a rotation failed: try again */
			}
			size_t k = stamp(ts, sizeof(ts));
			if (lg.log >= 0)
				lg.err = io_write_all(lg.log, ts, k);
			lg.size += (off_t)k;
		}
		if (lg.log >= 0 && lg.err == 0)
			lg.err = io_write_all(lg.log, buf + done, len);
		lg.size += (off_t)len;
		lg.line_start = nl != NULL;
		done += len;
	}
	return (ssize_t)n;
}

int up_log_start(const char *state_dir)
{
	static const cookie_io_functions_t io = {.write = log_write};

	if (lg.f) /* a daemon the supervisor restarted: inherited */
		return 0;
	snprintf(lg.path, sizeof(lg.path), "%s/%s", state_dir, UP_LOG_FILE);
	snprintf(lg.old, sizeof(lg.old), "%s/%s.1", state_dir, UP_LOG_FILE);
	log_open();
	if (lg.log < 0)
		return -errno;
	fflush(stderr);
	if ((lg.term = fcntl(STDERR_FILENO, F_DUPFD_CLOEXEC, 3)) < 0 || !(lg.f = fopencookie(NULL, "w", io))) {
		int e = errno ? errno : ENOMEM;
		if (lg.term >= 0)
			close(lg.term);
		close(lg.log);
		lg.term = lg.log = -1;
		return -e;
	}
	setvbuf(lg.f, NULL, _IOLBF, 0);
	lg.line_start = true;
	lg.orig_err = stderr;
	lg.orig_out = stdout;
	stderr = lg.f;
	return 0;
}

int up_log_error(void)
{
	return lg.err;
}

int up_log_term_fd(void)
{
	return lg.f ? lg.term : STDERR_FILENO;
}

void up_log_detach(void)
{
	int null;

	if (!lg.f)
		return;
	fflush(stdout);
	fflush(stderr);
	stdout = lg.f; /* what is printed from now on goes to the log only */
	if (lg.term >= 0)
		close(lg.term);
	lg.term = -1;
	/* the terminal is not ours any more, nor our children's */
	if ((null = open("/dev/null", O_RDWR | O_CLOEXEC)) >= 0) {
		dup2(null, STDIN_FILENO);
		dup2(null, STDOUT_FILENO);
		dup2(null, STDERR_FILENO);
		close(null);
	}
}

void up_log_stop(void)
{
	if (!lg.f)
		return;
	fflush(stdout);
	stdout = lg.orig_out;
	stderr = lg.orig_err;
	fclose(lg.f);
	lg.f = NULL;
	if (lg.term >= 0)
		close(lg.term);
	if (lg.log >= 0)
		close(lg.log);
	lg.term = lg.log = -1;
}
