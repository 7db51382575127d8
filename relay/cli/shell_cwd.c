/* SPDX-License-Identifier: Apache-2.0 */
/* airlock shell --cwd-file: the guest's final directory (shell_cwd_i.h). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/io.h"
#include "cmd_i.h"
#include "shell_cwd_i.h"

/* $1 command, $2 start below the root, $3 marker. The variables are the
 * command's to see; a command that prints a forged line only names a
 * directory, which the host checks. */
const char SHELL_CWD_SCRIPT[] = "__airlock_c=$1 __airlock_m=$3 __airlock_r=$(pwd -P)\n"
				"[ -z \"$2\" ] || __airlock_r=${__airlock_r%/\"$2\"}\n"
				"shift 3\n"
				"eval \"$__airlock_c\"\n"
				"__airlock_s=$?\n"
				"if [ \"$__airlock_s\" = 0 ]; then\n"
				"\t__airlock_p=$(pwd -P)\n"
				"\tcase $__airlock_p in\n"
				"\t\"$__airlock_r\") __airlock_p= ;;\n"
				"\t\"$__airlock_r\"/*) __airlock_p=${__airlock_p#\"$__airlock_r\"} ;;\n"
				"\t*) __airlock_p=\"!$__airlock_p\" ;;\n"
				"\tesac\n"
				"\tprintf '%s%s\\n' \"$__airlock_m\" \"$__airlock_p\" >&2\n"
				"fi\n"
				"exit \"$__airlock_s\"\n";

void shell_cwd_init(struct shell_cwd *c)
{
	uint8_t r[16];

	memset(c, 0, sizeof(*c));
	randombytes_buf(r, sizeof(r));
	memcpy(c->mark, "airlock-cwd-", 12);
	sodium_bin2hex(c->mark + 12, 33, r, sizeof(r));
	c->mark[44] = ':';
	c->mark[45] = '\0';
}

/* The longest tail of p[0..n) that is a start of the marker. */
static size_t mark_prefix_tail(const struct shell_cwd *c, const char *p, size_t n)
{
	size_t k = n < SHELL_CWD_MARK_LEN ? n : SHELL_CWD_MARK_LEN - 1;

	for (; k > 0; k--)
		if (!memcmp(p + n - k, c->mark, k))
			return k;
	return 0;
}

int shell_cwd_filter(struct shell_cwd *c, int fd, const uint8_t *p, size_t n)
{
	int r;

	while (n > 0) {
		size_t take = sizeof(c->pend) - c->pend_n < n ? sizeof(c->pend) - c->pend_n : n;
		memcpy(c->pend + c->pend_n, p, take);
		c->pend_n += take;
		p += take;
		n -= take;
		for (;;) {
			char *m = memmem(c->pend, c->pend_n, c->mark, SHELL_CWD_MARK_LEN);
			size_t keep;
			if (!m) {
				keep = mark_prefix_tail(c, c->pend, c->pend_n);
			} else {
				char *nl = memchr(m, '\n', c->pend_n - (size_t)(m - c->pend));
				if ((r = io_write_all(fd, c->pend, (size_t)(m - c->pend))) < 0)
					return r;
				if (!nl && c->pend_n < sizeof(c->pend)) { /* the line goes on in the next chunk */
					memmove(c->pend, m, c->pend_n - (size_t)(m - c->pend));
					c->pend_n -= (size_t)(m - c->pend);
					break;
				}
				if (nl) {
					size_t len = (size_t)(nl - m) - SHELL_CWD_MARK_LEN;
					if (len < sizeof(c->got)) {
						memcpy(c->got, m + SHELL_CWD_MARK_LEN, len);
						c->got[len] = '\0';
						c->have = true;
					}
					nl++;
				} else {
					nl = c->pend + c->pend_n; /* too long to be a path: dropped */
				}
				memmove(c->pend, nl, c->pend_n - (size_t)(nl - c->pend));
				c->pend_n -= (size_t)(nl - c->pend);
				continue;
			}
			if ((r = io_write_all(fd, c->pend, c->pend_n - keep)) < 0)
				return r;
			memmove(c->pend, c->pend + c->pend_n - keep, keep);
			c->pend_n = keep;
			break;
		}
	}
	return 0;
}

int shell_cwd_flush(struct shell_cwd *c, int fd)
{
	int r = io_write_all(fd, c->pend, c->pend_n);

	c->pend_n = 0;
	return r;
}

/* "" or "/a/b" with no empty, "." or ".." component. */
static bool below_ok(const char *s)
{
	for (const char *p = s; *p;) {
		const char *e;
		if (*p != '/')
			return false;
		p++;
		e = strchrnul(p, '/');
		if (e == p || (e - p == 1 && p[0] == '.') || (e - p == 2 && p[0] == '.' && p[1] == '.'))
			return false;
		p = e;
	}
	return true;
}

int shell_cwd_write(const struct shell_cwd *c, const char *root, const char *file)
{
	char want[PATH_MAX * 2], real[PATH_MAX];
	size_t rn = strlen(root);
	struct stat st;
	int fd, r;

	if (!c->have)
		return 1;
	if (c->got[0] == '!') {
		cmd_err("shell: the command ended in %s in the guest, outside the workspace: the next one starts "
			"where this one did",
			c->got + 1);
		return 1;
	}
	if (!below_ok(c->got) || snprintf(want, sizeof(want), "%s%s", root, c->got) >= (int)sizeof(want) ||
	    !realpath(want, real) || strncmp(real, root, rn) || (real[rn] && real[rn] != '/') || stat(real, &st) < 0 ||
	    !S_ISDIR(st.st_mode)) {
		cmd_err("shell: the guest reported its directory as '%s', not a directory of the workspace %s: "
			"%s not written",
			c->got, root, file);
		return -1;
	}
	if ((fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
		cmd_err("shell: --cwd-file %s: %s", file, strerror(errno));
		return -1;
	}
	r = io_write_all(fd, real, strlen(real));
	if (r == 0)
		r = io_write_all(fd, "\n", 1);
	if (close(fd) < 0 && r == 0)
		r = -errno;
	if (r < 0) {
		cmd_err("shell: --cwd-file %s: %s", file, strerror(-r));
		return -1;
	}
	return 0;
}
