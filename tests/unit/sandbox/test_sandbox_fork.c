/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Unit tests for sandbox_fork: the layer stack's bookkeeping without any
 * mount. Layers are made by hand as the overlay leaves them (whiteouts:
 * character devices 0/0, which need CAP_MKNOD; opaque directories: the
 * user.overlay.opaque xattr), then frozen, listed and merged back. The
 * overlays themselves are tested end to end in tests/e2e/fork_e2e.sh.
 */
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/core/mem.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/sandbox/sandbox_fork.h"

static char dir[PATH_MAX];

static int setup(void **state)
{
	char p[PATH_MAX + 32];
	(void)state;
	tu_tmpdir(dir, sizeof(dir), "sbfork");
	snprintf(p, sizeof(p), "%s/workspace", dir);
	mkdir(p, 0700);
	snprintf(p, sizeof(p), "%s/home", dir);
	mkdir(p, 0700);
	snprintf(p, sizeof(p), "%s/agent", dir);
	mkdir(p, 0700);
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	tu_rm_rf(dir);
	return 0;
}

/* rel's text, its directories made as needed */
static void put(const char *rel, const char *text)
{
	char p[PATH_MAX + 256];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	for (char *s = p + strlen(dir) + 1; (s = strchr(s, '/')); s++) {
		*s = '\0';
		(void)mkdir(p, 0755);
		*s = '/';
	}
	tu_put_file(AT_FDCWD, p, text, strlen(text), 0644);
}

static char *get(const char *rel)
{
	char p[PATH_MAX + 256];
	size_t n;
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	return tu_read_file(AT_FDCWD, p, &n);
}

static bool present(const char *rel)
{
	char p[PATH_MAX + 256];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	return lstat(p, &st) == 0;
}

static bool whiteout(const char *rel)
{
	char p[PATH_MAX + 256];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	return mknod(p, S_IFCHR | 0000, makedev(0, 0)) == 0;
}

static void test_names(void **state)
{
	(void)state;
	assert_true(sandbox_fork_name_ok("a"));
	assert_true(sandbox_fork_name_ok("try-b_2"));
	assert_true(sandbox_fork_name_ok("0123456789abcdef0123456789abcdef")); /* 32 */
	assert_false(sandbox_fork_name_ok(""));
	assert_false(sandbox_fork_name_ok("0123456789abcdef0123456789abcdefx"));
	assert_false(sandbox_fork_name_ok("-x"));
	assert_false(sandbox_fork_name_ok("A"));
	assert_false(sandbox_fork_name_ok(".."));
	assert_false(sandbox_fork_name_ok("a/b"));
	assert_false(sandbox_fork_name_ok("a b"));
}

/* freeze with no stack: the base is the forks' lower; a second freeze of
 * an empty upper adds no layer; one with content does. */
static void test_freeze_layers(void **state)
{
	char err[512];
	unsigned depth = 99;
	char **names;
	size_t n;
	(void)state;

	put("workspace/a.txt", "base");
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0);
	assert_int_equal(depth, 0);
	assert_true(present("upper/workspace") && present("work/home"));
	assert_int_equal(sandbox_fork_make(dir, "one", depth, 60, err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_make(dir, "one", depth, 60, err, sizeof(err)), -EEXIST);
	assert_non_null(strstr(err, "exists already"));
	assert_int_equal(sandbox_fork_make(dir, "Bad", depth, 60, err, sizeof(err)), -EINVAL);
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0); /* empty upper: reused */
	assert_int_equal(depth, 0);
	put("upper/workspace/b.txt", "parent");
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0);
	assert_int_equal(depth, 1);
	assert_true(present("layers/1/workspace/b.txt") && !present("upper/workspace/b.txt"));
	assert_int_equal(sandbox_fork_make(dir, "two", depth, 60, err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_list(dir, &names, &n), 0);
	assert_int_equal(n, 2);
	assert_string_equal(names[0], "one");
	assert_string_equal(names[1], "two");
	for (size_t i = 0; i < n; i++)
		mem_free(names[i]);
	mem_free(names);
	/* forks exist: no merge */
	assert_int_equal(sandbox_fork_compact(dir, err, sizeof(err)), -EBUSY);
	assert_int_equal(sandbox_fork_remove(dir, "one", err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_remove(dir, "one", err, sizeof(err)), -ENOENT);
	assert_int_equal(sandbox_fork_remove(dir, "two", err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_compact(dir, err, sizeof(err)), 0);
	assert_false(present("layers") || present("upper") || present("work"));
	char *t = get("workspace/b.txt");
	assert_string_equal(t, "parent");
	free(t);
}

/* What the overlay left in the layers, merged as the overlay shows it. */
static void test_compact_semantics(void **state)
{
	char err[512];
	unsigned depth;
	(void)state;

	put("workspace/keep.txt", "base");
	put("workspace/gone.txt", "base");
	put("workspace/d/old.txt", "base");
	put("workspace/e/x.txt", "base");
	put("home/h.txt", "base");
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0);
	put("upper/workspace/keep.txt", "layer1");
	put("upper/workspace/new/n.txt", "layer1");
	put("upper/home/h.txt", "home1");
	if (!whiteout("upper/workspace/gone.txt")) {
		skip(); /* no CAP_MKNOD: not root */
		return;
	}
	assert_int_equal(sandbox_fork_make(dir, "f", 0, 60, err, sizeof(err)), 0); /* keeps the stack */
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0);
	assert_int_equal(depth, 1);
	/* the parent's upper over layer 1: d replaced by an opaque dir, e/x deleted */
	put("upper/workspace/d/fresh.txt", "layer2");
	char p[PATH_MAX + 64];
	snprintf(p, sizeof(p), "%s/upper/workspace/d", dir);
	assert_int_equal(setxattr(p, "user.overlay.opaque", "y", 1, 0), 0);
	snprintf(p, sizeof(p), "%s/upper/workspace/e", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_true(whiteout("upper/workspace/e/x.txt"));
	assert_int_equal(sandbox_fork_remove(dir, "f", err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_compact(dir, err, sizeof(err)), 0);
	char *t = get("workspace/keep.txt");
	assert_string_equal(t, "layer1");
	free(t);
	t = get("home/h.txt");
	assert_string_equal(t, "home1");
	free(t);
	assert_false(present("workspace/gone.txt"));
	assert_true(present("workspace/new/n.txt"));
	assert_true(present("workspace/d/fresh.txt"));
	assert_false(present("workspace/d/old.txt")); /* the opaque dir hid it */
	assert_false(present("workspace/e/x.txt"));
	assert_false(present("layers"));
	/* no overlay marks are left in the base */
	char v[4];
	snprintf(p, sizeof(p), "%s/workspace/d", dir);
	assert_true(getxattr(p, "user.overlay.opaque", v, sizeof(v)) < 0);
}

struct seen {
	char paths[16][64];
	bool del[16];
	int n;
};

static int on_change(const char *path, bool deleted, void *ud)
{
	struct seen *s = ud;
	if (s->n < 16) {
		snprintf(s->paths[s->n], sizeof(s->paths[0]), "%s", path);
		s->del[s->n++] = deleted;
	}
	return 0;
}

static bool seen_has(const struct seen *s, const char *path, bool deleted)
{
	for (int i = 0; i < s->n; i++)
		if (!strcmp(s->paths[i], path) && s->del[i] == deleted)
			return true;
	return false;
}

/* A fork's changes: new and modified files, deletions; a copy-up of
 * unchanged content is not a change. */
static void test_changes(void **state)
{
	char err[512];
	unsigned depth;
	struct seen s = {0};
	(void)state;

	put("workspace/same.txt", "x");
	put("workspace/mod.txt", "old");
	put("workspace/del.txt", "x");
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0);
	put("upper/workspace/mod.txt", "in the parent's layer"); /* the parent's, frozen below the fork */
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_make(dir, "c", depth, 60, err, sizeof(err)), 0);
	put("forks/c/upper/workspace/same.txt", "x");	       /* copied up, same bytes */
	put("forks/c/upper/workspace/mod.txt", "in the fork"); /* differs from layer 1's */
	put("forks/c/upper/workspace/sub/new.txt", "new");
	bool wo = whiteout("forks/c/upper/workspace/del.txt");
	assert_int_equal(sandbox_fork_changes(dir, "c", on_change, &s), 0);
	assert_true(seen_has(&s, "mod.txt", false));
	assert_true(seen_has(&s, "sub/new.txt", false));
	assert_false(seen_has(&s, "same.txt", false));
	if (wo)
		assert_true(seen_has(&s, "del.txt", true));
	assert_int_equal(s.n, wo ? 3 : 2);
	/* the same content as the parent's frozen layer is no change either */
	put("forks/c/upper/workspace/mod.txt", "in the parent's layer");
	memset(&s, 0, sizeof(s));
	assert_int_equal(sandbox_fork_changes(dir, "c", on_change, &s), 0);
	assert_false(seen_has(&s, "mod.txt", false));
	assert_int_equal(sandbox_fork_changes(dir, "../c", on_change, &s), -EINVAL);
	assert_int_equal(sandbox_fork_changes(dir, "nope", on_change, &s), -ENOENT);
}

/* The stack is bounded while forks hold it. */
static void test_stack_full(void **state)
{
	char err[512], name[16];
	unsigned depth = 0;
	int r = 0;
	(void)state;

	for (int i = 0; i <= SANDBOX_FORK_LAYERS_MAX + 1 && r == 0; i++) {
		snprintf(name, sizeof(name), "g%d", i);
		put("upper/workspace/x.txt", name); /* a non-empty upper each time */
		if ((r = sandbox_fork_freeze(dir, &depth, err, sizeof(err))) == 0 && i < SANDBOX_FORK_MAX)
			assert_int_equal(sandbox_fork_make(dir, name, depth, 60, err, sizeof(err)), 0);
	}
	assert_int_equal(r, -ENOSPC);
	assert_non_null(strstr(err, "airlock fork --rm"));
	assert_int_equal(depth, SANDBOX_FORK_LAYERS_MAX);
	assert_int_equal(sandbox_fork_make(dir, "over", depth, 60, err, sizeof(err)), -ENOSPC); /* 16 forks */
}

/* A seed before the fork starts; the winner's changes staged in the
 * parent's home: hard links (a symlink linked, never followed), the
 * deletions NUL-separated, nothing outside the stage. */
static void test_seed_stage(void **state)
{
	char err[512], p[PATH_MAX + 64], q[PATH_MAX + 64], *t;
	unsigned depth;
	size_t nf = 0, nd = 0;
	struct stat a, b;
	(void)state;

	put("workspace/keep.txt", "k");
	put("workspace/gone.txt", "g");
	assert_int_equal(sandbox_fork_freeze(dir, &depth, err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_make(dir, "w", depth, 60, err, sizeof(err)), 0);
	assert_int_equal(sandbox_fork_seed(dir, "w", ".airlock-try.patch", "diff", 4, err, sizeof(err)), 0);
	t = get("forks/w/upper/home/.airlock-try.patch");
	assert_string_equal(t, "diff");
	mem_free(t);
	assert_int_equal(sandbox_fork_seed(dir, "w", ".airlock-try.patch", "x", 1, err, sizeof(err)), -EEXIST);
	assert_int_equal(sandbox_fork_seed(dir, "w", "../x", "x", 1, err, sizeof(err)), -EINVAL);
	assert_int_equal(sandbox_fork_seed(dir, "w", "a/b", "x", 1, err, sizeof(err)), -EINVAL);

	put("forks/w/upper/workspace/sub/deep/new.txt", "new");
	snprintf(p, sizeof(p), "%s/forks/w/upper/workspace/link", dir);
	assert_int_equal(symlink("/etc/passwd", p), 0);
	bool wo = whiteout("forks/w/upper/workspace/gone.txt");
	assert_int_equal(sandbox_fork_stage(dir, "w", "t1", &nf, &nd, err, sizeof(err)), 0);
	assert_int_equal(nf, 2);
	assert_int_equal(nd, wo ? 1 : 0);
	/* the parent runs on its upper now: the stage is in upper/home */
	snprintf(p, sizeof(p), "%s/forks/w/upper/workspace/sub/deep/new.txt", dir);
	snprintf(q, sizeof(q), "%s/upper/home/.airlock-try/t1/files/sub/deep/new.txt", dir);
	assert_int_equal(stat(p, &a), 0);
	assert_int_equal(stat(q, &b), 0);
	assert_true(a.st_ino == b.st_ino); /* a link, not a copy */
	snprintf(q, sizeof(q), "%s/upper/home/.airlock-try/t1/files/link", dir);
	assert_int_equal(lstat(q, &b), 0);
	assert_true(S_ISLNK(b.st_mode));
	snprintf(p, sizeof(p), "%s/upper/home/.airlock-try/t1/deleted", dir);
	assert_int_equal(stat(p, &a), 0);
	assert_int_equal((size_t)a.st_size, wo ? strlen("gone.txt") + 1 : 0);
	/* staged again: the old stage is replaced, not merged */
	assert_int_equal(sandbox_fork_stage(dir, "w", "t1", &nf, &nd, err, sizeof(err)), 0);
	assert_int_equal(nf, 2);
	assert_int_equal(sandbox_fork_stage(dir, "w", "../t", &nf, &nd, err, sizeof(err)), -EINVAL);
	assert_int_equal(sandbox_fork_stage(dir, "nope", "t2", &nf, &nd, err, sizeof(err)), -ENOENT);
}

/* The vm kind behind the same table: forked live, no upper. Its freeze
 * refuses a parent without a monitor; a make whose monitor is not QMP
 * fails saying so and leaves no fork directory and no slot behind. */
static void test_vm_kind(void **state)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	char err[512];
	unsigned gen = 9;
	int lfd, st;
	pid_t pid;
	(void)state;

	assert_int_equal(sandbox_kind_fork_flags(SANDBOX_LOCAL), SANDBOX_FORKS_UPPER);
	assert_int_equal(sandbox_kind_fork_flags(SANDBOX_VM), SANDBOX_FORKS_LIVE);
	assert_true(sandbox_kind_forks(SANDBOX_VM));
	assert_int_equal(sandbox_forks_freeze(SANDBOX_VM, dir, &gen, err, sizeof(err)), -ENOTSUP);
	assert_non_null(strstr(err, "no monitor"));

	put("run/.keep", "");
	assert_true((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/run/qmp.sock", dir) < sizeof(sa.sun_path));
	assert_true((lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0)) >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(lfd, 1), 0);
	assert_true((pid = fork()) >= 0);
	if (pid == 0) { /* a monitor that is not qemu's */
		int c = accept(lfd, NULL, NULL);
		if (c >= 0 && write(c, "not qmp\n", 8) == 8)
			close(c);
		_exit(0);
	}
	close(lfd);
	assert_int_equal(sandbox_forks_freeze(SANDBOX_VM, dir, &gen, err, sizeof(err)), 0);
	assert_int_equal(gen, 0);
	err[0] = '\0';
	assert_true(sandbox_forks_make(SANDBOX_VM, dir, "v", gen, 60, err, sizeof(err)) < 0);
	assert_true(err[0] != '\0');
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_false(present("forks/v"));
	assert_false(present("run.1"));
	assert_int_equal(sandbox_forks_remove(SANDBOX_VM, dir, "v", err, sizeof(err)), -ENOENT);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test_setup_teardown(test_freeze_layers, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_compact_semantics, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_changes, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_stack_full, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_seed_stage, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_vm_kind, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
