/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock shell --cwd-file FILE: the directory a command ended in, brought
 * back from the guest and written to a host file (Claude Code's cwd file,
 * doc/EDITORS.md).
 *
 * The guest's bash runs the command, then (when it exited 0) prints one
 * line on stderr: a marker holding 128 random bits, then where it ended
 * below the workspace root ("" for the root, "/a/b" below it, "!PATH"
 * outside the workspace). The filter takes that line out of the stderr
 * stream and keeps it; shell_cwd_write maps it to the host's mount and
 * writes it. What the guest reports is untrusted: the path must resolve to a
 * directory inside the workspace on the host, else nothing is written.
 */
#ifndef AIRLOCK_CLI_SHELL_CWD_I_H
#define AIRLOCK_CLI_SHELL_CWD_I_H

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SHELL_CWD_MARK_LEN 45 /* "airlock-cwd-" + 32 hex + ":" */

struct shell_cwd {
	char mark[SHELL_CWD_MARK_LEN + 1];
	char pend[SHELL_CWD_MARK_LEN + PATH_MAX + 2]; /* held back: a marker's start or its line */
	size_t pend_n;
	char got[PATH_MAX + 2]; /* the reported place, valid when have */
	bool have;
};

/* The guest side: bash -c SHELL_CWD_SCRIPT NAME CMD REL MARK runs CMD (with
 * no positional arguments), then reports as above. REL is the start
 * directory below the workspace root ("" for the root). */
extern const char SHELL_CWD_SCRIPT[];

/* A new random marker, nothing held. */
void shell_cwd_init(struct shell_cwd *c);

/* stderr bytes from the guest: everything but the marker line goes to fd.
 * 0 or -errno from write. */
int shell_cwd_filter(struct shell_cwd *c, int fd, const uint8_t *p, size_t n);

/* The end of the stream: what was held back (a marker line without its
 * newline is not one) goes to fd. */
int shell_cwd_flush(struct shell_cwd *c, int fd);

/* Write the reported directory, as a host path below root (the workspace
 * mount, a realpath), with a newline, to file (created 0600, truncated, not
 * through a symlink). 0; 1 when there is nothing to write (no report, or a
 * place outside the workspace: said on stderr); -1 after saying why. */
int shell_cwd_write(const struct shell_cwd *c, const char *root, const char *file);

#endif
