/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the checker of host-side git arguments (gitargs_check): the
 * arguments come from the relay client, the party the sandbox exists for.
 * Input: one byte choosing the command's directory, then NUL-separated
 * arguments after "git". The workspace is a temp dir with a subdirectory,
 * a symlink inside and one leading out.
 * Invariants: the answer is 0 or -EPERM with a message that names git;
 * the same answer twice; an accepted argv stays refused with "--no-index"
 * put right after its subcommand, and with "-- /etc/shadow" appended. */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/host/gitargs.h"
#include "fuzz.h"

#define ARGS_MAX 64

static char root[PATH_MAX];
static int root_fd = -1;

static void cleanup(void)
{
	static const char *const names[] = {"in-link", "out-link", "sub"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		unlinkat(root_fd, names[i], i == 2 ? AT_REMOVEDIR : 0);
	close(root_fd);
	rmdir(root);
}

static void workspace(void)
{
	char p[PATH_MAX + 16];

	if (root_fd >= 0)
		return;
	snprintf(root, sizeof(root), "/tmp/fuzz_gitargs.XXXXXX");
	FUZZ_ASSERT(mkdtemp(root));
	snprintf(p, sizeof(p), "%s/sub", root);
	FUZZ_ASSERT(mkdir(p, 0700) == 0);
	snprintf(p, sizeof(p), "%s/in-link", root);
	FUZZ_ASSERT(symlink("sub", p) == 0);
	snprintf(p, sizeof(p), "%s/out-link", root);
	FUZZ_ASSERT(symlink("/etc", p) == 0);
	root_fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	FUZZ_ASSERT(root_fd >= 0);
	atexit(cleanup);
}

static int check(const struct gitargs_ws *ws, const char *const *argv, size_t argc)
{
	char why[512];

	memset(why, 'x', sizeof(why));
	why[0] = '\0';
	int r = gitargs_check(ws, argv, argc, why, sizeof(why));
	FUZZ_ASSERT(r == 0 || r == -EPERM);
	FUZZ_ASSERT(memchr(why, '\0', sizeof(why)));
	FUZZ_ASSERT(r == 0 || !strncmp(why, "execution.local: git", 20));
	return r;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const char *const cwds[] = {"", "sub", "in-link"};
	const char *argv[ARGS_MAX + 3];
	char *copy;
	size_t argc = 1, sub = 0;

	if (size == 0)
		return 0;
	workspace();
	struct gitargs_ws ws = {.root_fd = root_fd, .root = root, .cwd = cwds[data[0] % 3]};
	if (!(copy = malloc(size)))
		return 0;
	memcpy(copy, data + 1, size - 1);
	copy[size - 1] = '\0';
	argv[0] = "git";
	for (char *p = copy; p < copy + size - 1 && argc < ARGS_MAX; p += strlen(p) + 1)
		argv[argc++] = p;
	int r = check(&ws, argv, argc);
	FUZZ_ASSERT(check(&ws, argv, argc) == r);
	if (r == 0) {
		/* the subcommand: the first word after git's own options */
		for (size_t i = 1; i < argc && !sub; i++)
			if (argv[i][0] != '-')
				sub = i;
		argv[argc] = "--";
		argv[argc + 1] = "/etc/shadow";
		FUZZ_ASSERT(check(&ws, argv, argc + 2) == -EPERM);
		if (sub) {
			memmove(argv + sub + 2, argv + sub + 1, (argc - sub - 1) * sizeof(*argv));
			argv[sub + 1] = "--no-index";
			FUZZ_ASSERT(check(&ws, argv, argc + 1) == -EPERM);
		}
	}
	free(copy);
	return 0;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
#define SEED(s)                                                                                                        \
	{                                                                                                              \
		sizeof(s) - 1, (const uint8_t *)s                                                                      \
	}
	static const struct {
		size_t n;
		const uint8_t *p;
	} seeds[] = {
	    SEED("\x00status\0-sb\0--\0sub"),
	    SEED("\x01"
		 "diff\0--stat\0-U3\0HEAD~1..HEAD\0--\0../sub/x"),
	    SEED("\x00log\0-p\0-3\0--author=me\0-O\0sub/order\0in-link"),
	    SEED("\x02grep\0-n\0-e\0foo\0--and\0-e\0bar\0HEAD"),
	    SEED("\x00commit\0-qm\0msg\0-F\0sub/m\0--\0:(exclude)sub"),
	    SEED("\x00ls-files\0-X\0out-link/x\0--exclude-per-directory=.gitignore"),
	    SEED("\x00--no-pager\0show\0HEAD:a\0--format=%H"),
	    SEED("\x00ls-remote\0https://example.org/r.git\0refs/*"),
	};
	if (i >= sizeof(seeds) / sizeof(seeds[0]))
		return 0;
	*out = seeds[i].p;
	return seeds[i].n;
}
