/* SPDX-License-Identifier: Apache-2.0 */
/* shell_cwd (relay/cli): the --cwd-file line taken out of a hostile stderr
 * stream however it is cut, and what the guest reports checked against the
 * host's workspace before anything is written. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "../../../relay/cli/cmd_i.h"
#include "../../../relay/cli/shell_cwd_i.h"

/* The one cmd_* the module uses, without the rest of the CLI. */
void cmd_err(const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* Everything the filter let through, fed in pieces of `step` bytes. */
static size_t run_filter(struct shell_cwd *c, const char *in, size_t n, size_t step, char *out, size_t cap)
{
	int p[2];
	ssize_t got;

	assert_int_equal(pipe(p), 0);
	for (size_t i = 0; i < n; i += step)
		assert_int_equal(shell_cwd_filter(c, p[1], (const uint8_t *)in + i, n - i < step ? n - i : step), 0);
	assert_int_equal(shell_cwd_flush(c, p[1]), 0);
	close(p[1]);
	got = read(p[0], out, cap);
	close(p[0]);
	assert_true(got >= 0);
	return (size_t)got;
}

static void test_marker_out_at_every_cut(void **state)
{
	(void)state;
	for (size_t step = 1; step < 80; step++) {
		struct shell_cwd c;
		char in[512], out[512];
		shell_cwd_init(&c);
		int n = snprintf(in, sizeof(in), "out before\nairlock-cwd-almost%s/sub/dir\nafter", c.mark);
		size_t m = run_filter(&c, in, (size_t)n, step, out, sizeof(out));
		out[m] = '\0';
		assert_string_equal(out, "out before\nairlock-cwd-almostafter");
		assert_true(c.have);
		assert_string_equal(c.got, "/sub/dir");
	}
}

static void test_no_marker_everything_through(void **state)
{
	struct shell_cwd c, other;
	char in[256], out[256];
	(void)state;
	shell_cwd_init(&c);
	shell_cwd_init(&other); /* a marker of another run: not ours, passed on */
	int n = snprintf(in, sizeof(in), "x%s/forged\ny", other.mark);
	size_t m = run_filter(&c, in, (size_t)n, 7, out, sizeof(out));
	assert_int_equal(m, (size_t)n);
	assert_memory_equal(out, in, m);
	assert_false(c.have);
	/* our marker without its newline at the end of the stream is output, not a report */
	shell_cwd_init(&c);
	n = snprintf(in, sizeof(in), "tail%s/x", c.mark);
	m = run_filter(&c, in, (size_t)n, 5, out, sizeof(out));
	assert_int_equal(m, (size_t)n);
	assert_false(c.have);
}

static void test_write_checks_the_report(void **state)
{
	char root[] = "/tmp/airlock-test-cwd.XXXXXX", sub[PATH_MAX], file[PATH_MAX], buf[PATH_MAX * 2];
	struct shell_cwd c;
	int fd;
	ssize_t n;
	(void)state;
	assert_non_null(mkdtemp(root));
	snprintf(sub, sizeof(sub), "%s/sub", root);
	assert_int_equal(mkdir(sub, 0755), 0);
	snprintf(file, sizeof(file), "%s.cwd", root);

	shell_cwd_init(&c);
	c.have = true;
	strcpy(c.got, "/sub");
	assert_int_equal(shell_cwd_write(&c, root, file), 0);
	fd = open(file, O_RDONLY);
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	buf[n > 0 ? n : 0] = '\0';
	snprintf(sub, sizeof(sub), "%s/sub\n", root);
	assert_string_equal(buf, sub);
	unlink(file);

	static const char *const bad[] = {"/..", "/sub/../..", "sub", "/nope", "//sub", "/./sub", "/sub/"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		strcpy(c.got, bad[i]);
		assert_int_equal(shell_cwd_write(&c, root, file), -1);
		assert_int_equal(access(file, F_OK), -1);
	}
	/* a symlink in the workspace pointing out of it: refused */
	snprintf(buf, sizeof(buf), "%s/out", root);
	assert_int_equal(symlink("/", buf), 0);
	strcpy(c.got, "/out");
	assert_int_equal(shell_cwd_write(&c, root, file), -1);
	assert_int_equal(access(file, F_OK), -1);
	unlink(buf);
	/* outside the workspace in the guest: said, nothing written */
	strcpy(c.got, "!/tmp");
	assert_int_equal(shell_cwd_write(&c, root, file), 1);
	assert_int_equal(access(file, F_OK), -1);
	/* the file is not written through a symlink */
	assert_int_equal(symlink("/etc/passwd", file), 0);
	strcpy(c.got, "");
	assert_int_equal(shell_cwd_write(&c, root, file), -1);
	unlink(file);
	snprintf(sub, sizeof(sub), "%s/sub", root);
	rmdir(sub);
	rmdir(root);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_marker_out_at_every_cut),
	    cmocka_unit_test(test_no_marker_everything_through),
	    cmocka_unit_test(test_write_checks_the_report),
	};

	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
