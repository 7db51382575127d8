/* SPDX-License-Identifier: Apache-2.0 */
/*
 * audit: the per-workspace store `airlock audit` reads (audit.h). The
 * workspace id and where its directory is (XDG_STATE_HOME, HOME, neither),
 * withheld.json as written (every field, the omitted counts, modes 0700
 * and 0600, no temporary file left), any document written and read back
 * (replacing the old file), and files refused when read: garbage, too
 * large, unreadable; each error names the file.
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
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <dirent.h>
#include <jansson.h>
#include <sodium.h>

#include "testutil.h"

#include "airlock/sync/audit.h"

struct env {
	char base[64];	     /* private temp dir */
	char ws[96];	     /* base/ws: the workspace */
	char state[96];	     /* base/state: XDG_STATE_HOME */
	char adir[PATH_MAX]; /* the workspace's audit dir under state */
	char err[512];
	char *home; /* HOME as it was, restored by teardown */
};

static int setup(void **state)
{
	struct env *e = calloc(1, sizeof(*e));

	assert_non_null(e);
	e->home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
	tu_tmpdir(e->base, sizeof(e->base), "audit");
	snprintf(e->ws, sizeof(e->ws), "%s/ws", e->base);
	snprintf(e->state, sizeof(e->state), "%s/state", e->base);
	assert_int_equal(mkdir(e->ws, 0755), 0);
	assert_int_equal(mkdir(e->state, 0755), 0);
	assert_int_equal(setenv("XDG_STATE_HOME", e->state, 1), 0);
	assert_int_equal(audit_dir(e->ws, 0, e->adir, sizeof(e->adir), e->err, sizeof(e->err)), 0);
	*state = e;
	return 0;
}

static int teardown(void **state)
{
	struct env *e = *state;

	tu_rm_rf(e->base);
	if (e->home)
		setenv("HOME", e->home, 1);
	free(e->home);
	free(e);
	return 0;
}

/* The id, computed independently: hex of SHA-256(realpath)[0..16). */
static void want_id(const char *dir, char id[33])
{
	char real[PATH_MAX];
	uint8_t h[crypto_hash_sha256_BYTES];

	assert_non_null(realpath(dir, real));
	crypto_hash_sha256(h, (const uint8_t *)real, strlen(real));
	sodium_bin2hex(id, 33, h, 16);
}

static void test_workspace_id(void **state)
{
	struct env *e = *state;
	char id[33], want[33], link[128], other[33];

	assert_int_equal(audit_workspace_id(e->ws, id), 0);
	want_id(e->ws, want);
	assert_string_equal(id, want);
	assert_int_equal(strlen(id), 32);
	/* the same workspace reached through a link or a dot path: the same id */
	snprintf(link, sizeof(link), "%s/link", e->base);
	assert_int_equal(symlink(e->ws, link), 0);
	assert_int_equal(audit_workspace_id(link, other), 0);
	assert_string_equal(other, id);
	snprintf(link, sizeof(link), "%s/./ws/", e->base);
	assert_int_equal(audit_workspace_id(link, other), 0);
	assert_string_equal(other, id);
	/* another directory: another id */
	assert_int_equal(audit_workspace_id(e->state, other), 0);
	assert_string_not_equal(other, id);
	snprintf(link, sizeof(link), "%s/missing", e->base);
	assert_int_equal(audit_workspace_id(link, other), -ENOENT);
}

static void test_dir_location(void **state)
{
	struct env *e = *state;
	char id[33], want[PATH_MAX], out[PATH_MAX], home[128], tiny[16];
	struct stat st;

	want_id(e->ws, id);
	/* XDG_STATE_HOME: <it>/airlock/<id>, not made unless asked */
	snprintf(want, sizeof(want), "%s/airlock/%s", e->state, id);
	assert_string_equal(e->adir, want);
	assert_int_equal(stat(want, &st), -1);
	assert_int_equal(audit_dir(e->ws, 1, out, sizeof(out), e->err, sizeof(e->err)), 0);
	assert_string_equal(out, want);
	assert_int_equal(stat(want, &st), 0);
	assert_true(S_ISDIR(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0700);
	snprintf(want, sizeof(want), "%s/airlock", e->state);
	assert_int_equal(stat(want, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	/* a relative XDG_STATE_HOME is ignored: HOME/.local/state */
	snprintf(home, sizeof(home), "%s/home", e->base);
	assert_int_equal(setenv("XDG_STATE_HOME", "relative/state", 1), 0);
	assert_int_equal(setenv("HOME", home, 1), 0);
	assert_int_equal(audit_dir(e->ws, 1, out, sizeof(out), e->err, sizeof(e->err)), 0);
	snprintf(want, sizeof(want), "%s/.local/state/airlock/%s", home, id);
	assert_string_equal(out, want);
	assert_int_equal(stat(want, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	/* neither: a message that says what to set */
	assert_int_equal(unsetenv("XDG_STATE_HOME"), 0);
	assert_int_equal(unsetenv("HOME"), 0);
	assert_int_equal(audit_dir(e->ws, 0, out, sizeof(out), e->err, sizeof(e->err)), -ENOENT);
	assert_non_null(strstr(e->err, "XDG_STATE_HOME"));
	assert_non_null(strstr(e->err, "HOME"));
	assert_int_equal(setenv("XDG_STATE_HOME", e->state, 1), 0);
	/* no room for the path */
	assert_int_equal(audit_dir(e->ws, 0, tiny, sizeof(tiny), e->err, sizeof(e->err)), -ENAMETOOLONG);
	/* a workspace that does not exist is named */
	snprintf(want, sizeof(want), "%s/missing", e->base);
	assert_int_equal(audit_dir(want, 1, out, sizeof(out), e->err, sizeof(e->err)), -ENOENT);
	assert_non_null(strstr(e->err, want));
}

/* A state dir that cannot be made (a file is in the way): the error names
 * the audit directory, nothing is written. */
static void test_dir_blocked(void **state)
{
	struct env *e = *state;
	char blocker[128];
	json_t *j = json_object();

	snprintf(blocker, sizeof(blocker), "%s/file", e->base);
	tu_put_file(AT_FDCWD, blocker, "x", 1, 0644);
	assert_int_equal(setenv("XDG_STATE_HOME", blocker, 1), 0);
	assert_int_equal(audit_write_json(e->ws, AUDIT_EGRESS_FILE, j, e->err, sizeof(e->err)), -ENOTDIR);
	assert_non_null(strstr(e->err, blocker));
	json_decref(j);
	assert_int_equal(setenv("XDG_STATE_HOME", e->state, 1), 0);
}

static void path_in(const struct env *e, const char *name, char *out, size_t n)
{
	snprintf(out, n, "%s/%s", e->adir, name);
}

/* Only the named files in the audit dir: no temporary left behind. */
static void only_files(const struct env *e, const char *const *names, size_t n)
{
	DIR *d = opendir(e->adir);
	struct dirent *de;
	size_t seen = 0;

	assert_non_null(d);
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		size_t i = 0;
		while (i < n && strcmp(de->d_name, names[i]))
			i++;
		if (i == n)
			fail_msg("unexpected file %s in %s", de->d_name, e->adir);
		seen++;
	}
	closedir(d);
	assert_int_equal(seen, n);
}

static const char *str_at(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_string(v))
		fail_msg("%s: not a string", key);
	return json_string_value(v);
}

static json_int_t int_at(json_t *o, const char *key)
{
	json_t *v = json_object_get(o, key);

	if (!json_is_integer(v))
		fail_msg("%s: not an integer", key);
	return json_integer_value(v);
}

static void test_save_withheld(void **state)
{
	struct env *e = *state;
	struct sync_record w[] = {{"secrets/.env", "secret: .env"}, {"id_rsa", "secret: id_rsa"}};
	struct sync_record s[] = {{"fifo", "special file (fifo)"}};
	char real[PATH_MAX], path[PATH_MAX + 32];
	const char *names[] = {AUDIT_WITHHELD_FILE};
	struct stat st;
	json_t *j = NULL, *a;
	void *v = NULL;

	assert_int_equal(
	    audit_save_withheld(e->ws, "/etc/airlock/policy.json", w, 2, 7, s, 1, 1, e->err, sizeof(e->err)), 0);
	path_in(e, AUDIT_WITHHELD_FILE, path, sizeof(path));
	assert_int_equal(stat(path, &st), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(stat(e->adir, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0700);
	only_files(e, names, 1);

	assert_int_equal(audit_read_json(e->ws, AUDIT_WITHHELD_FILE, &v, e->err, sizeof(e->err)), 0);
	assert_non_null(j = v);
	assert_int_equal(int_at(j, "version"), 1);
	assert_non_null(realpath(e->ws, real));
	assert_string_equal(str_at(j, "workspace"), real);
	assert_string_equal(str_at(j, "policy"), "/etc/airlock/policy.json");
	const char *t = str_at(j, "time");
	int yy, mo, dd, hh, mi, ss;
	char z;
	assert_int_equal(strlen(t), 20);
	assert_int_equal(sscanf(t, "%4d-%2d-%2dT%2d:%2d:%2d%c", &yy, &mo, &dd, &hh, &mi, &ss, &z), 7);
	assert_int_equal(z, 'Z');
	assert_true(yy >= 2024);
	/* the records as given, the totals, and how many were left out */
	a = json_object_get(j, "withheld");
	assert_true(json_is_array(a));
	assert_int_equal(json_array_size(a), 2);
	for (size_t i = 0; i < 2; i++) {
		assert_string_equal(str_at(json_array_get(a, i), "path"), w[i].path);
		assert_string_equal(str_at(json_array_get(a, i), "rule"), w[i].rule);
	}
	assert_int_equal(int_at(j, "withheld_total"), 7);
	assert_int_equal(int_at(j, "withheld_omitted"), 5);
	a = json_object_get(j, "skipped");
	assert_true(json_is_array(a));
	assert_int_equal(json_array_size(a), 1);
	assert_string_equal(str_at(json_array_get(a, 0), "path"), "fifo");
	assert_string_equal(str_at(json_array_get(a, 0), "reason"), "special file (fifo)");
	assert_null(json_object_get(json_array_get(a, 0), "rule"));
	assert_int_equal(int_at(j, "skipped_total"), 1);
	assert_int_equal(int_at(j, "skipped_omitted"), 0);
	json_decref(j);

	/* the next scan replaces the record: nothing withheld any more */
	assert_int_equal(audit_save_withheld(e->ws, "default", NULL, 0, 0, NULL, 0, 0, e->err, sizeof(e->err)), 0);
	assert_int_equal(audit_read_json(e->ws, AUDIT_WITHHELD_FILE, &v, e->err, sizeof(e->err)), 0);
	assert_non_null(j = v);
	assert_int_equal(json_array_size(json_object_get(j, "withheld")), 0);
	assert_int_equal(int_at(j, "withheld_total"), 0);
	assert_string_equal(str_at(j, "policy"), "default");
	json_decref(j);
	only_files(e, names, 1);
}

/* Any document round-trips; an older file (of another mode) is replaced
 * whole, by a file of mode 0600 whatever the umask. */
static void test_write_read(void **state)
{
	struct env *e = *state;
	char path[PATH_MAX + 32], out[PATH_MAX];
	const char *names[] = {AUDIT_EGRESS_FILE};
	struct stat st;
	void *v = (void *)1;
	json_t *doc = json_pack("{s:i, s:[{s:s}], s:I, s:I}", "version", 1, "denials", "host", "evil.test:443",
				"denials_total", (json_int_t)1, "denials_omitted", (json_int_t)0);

	assert_non_null(doc);
	/* absent: 0 and NULL, and reading makes no directory */
	assert_int_equal(audit_read_json(e->ws, AUDIT_EGRESS_FILE, &v, e->err, sizeof(e->err)), 0);
	assert_null(v);
	assert_int_equal(stat(e->adir, &st), -1);

	assert_int_equal(audit_dir(e->ws, 1, out, sizeof(out), e->err, sizeof(e->err)), 0);
	path_in(e, AUDIT_EGRESS_FILE, path, sizeof(path));
	tu_put_file(AT_FDCWD, path, "{\"old\": true}\n", 14, 0644);
	mode_t old = umask(0);
	int r = audit_write_json(e->ws, AUDIT_EGRESS_FILE, doc, e->err, sizeof(e->err));
	umask(old);
	assert_int_equal(r, 0);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 07777, 0600);
	only_files(e, names, 1);
	assert_int_equal(audit_read_json(e->ws, AUDIT_EGRESS_FILE, &v, e->err, sizeof(e->err)), 0);
	assert_non_null(v);
	assert_true(json_equal(v, doc));
	assert_null(json_object_get(v, "old"));
	json_decref(v);
	/* the file on disk is the JSON text and a newline */
	size_t n;
	char *text = tu_read_file(AT_FDCWD, path, &n);
	assert_non_null(text);
	assert_true(n > 1 && text[n - 1] == '\n');
	json_t *again = json_loads(text, 0, NULL);
	assert_non_null(again);
	assert_true(json_equal(again, doc));
	json_decref(again);
	free(text);
	json_decref(doc);
}

static void expect_refused(struct env *e, const char *name, int want, const char *needle)
{
	char path[PATH_MAX + 32];
	void *v = (void *)1;

	path_in(e, name, path, sizeof(path));
	e->err[0] = '\0';
	assert_int_equal(audit_read_json(e->ws, name, &v, e->err, sizeof(e->err)), want);
	assert_null(v);
	if (!strstr(e->err, path) || !strstr(e->err, needle))
		fail_msg("%s: error \"%s\" lacks the file or \"%s\"", name, e->err, needle);
}

/* Bad files are refused with the file's name and what to do, never
 * parsed partly; a file over AUDIT_FILE_MAX is not even read. */
static void test_refused(void **state)
{
	struct env *e = *state;
	char out[PATH_MAX], path[PATH_MAX + 32];
	static const char *const garbage[] = {"", "not json", "{\"version\": 1,", "{\"a\": 1} trailing", "\xff\xfe{}"};
	int fd;

	assert_int_equal(audit_dir(e->ws, 1, out, sizeof(out), e->err, sizeof(e->err)), 0);
	path_in(e, AUDIT_WITHHELD_FILE, path, sizeof(path));
	for (size_t i = 0; i < sizeof(garbage) / sizeof(garbage[0]); i++) {
		tu_put_file(AT_FDCWD, path, garbage[i], strlen(garbage[i]), 0600);
		expect_refused(e, AUDIT_WITHHELD_FILE, -EINVAL, "remove it and sync again");
	}
	/* one byte over the cap (sparse): refused by its size */
	assert_true((fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC)) >= 0);
	assert_int_equal(ftruncate(fd, (off_t)AUDIT_FILE_MAX + 1), 0);
	close(fd);
	expect_refused(e, AUDIT_WITHHELD_FILE, -EFBIG, "larger than 64 MiB");
	/* exactly at the cap: read (and then refused only as bad JSON) */
	assert_true((fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC)) >= 0);
	assert_int_equal(ftruncate(fd, (off_t)AUDIT_FILE_MAX), 0);
	close(fd);
	expect_refused(e, AUDIT_WITHHELD_FILE, -EINVAL, "remove it and sync again");
	/* a directory where the file should be: refused, not a crash */
	assert_int_equal(unlink(path), 0);
	assert_int_equal(mkdir(path, 0700), 0);
	expect_refused(e, AUDIT_WITHHELD_FILE, -EINVAL, "remove it and sync again");
	/* a name stat refuses: its error, with the file */
	char name[300];
	memset(name, 'n', 256);
	name[256] = '\0';
	expect_refused(e, name, -ENAMETOOLONG, strerror(ENAMETOOLONG));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_workspace_id, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_dir_location, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_dir_blocked, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_save_withheld, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_write_read, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_refused, setup, teardown),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, NULL, NULL);
}
