/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The policy file from the command line (doc/POLICY.md):
 *   airlock init [DIR] [--force]      a starter airlock.json from what DIR holds
 *   airlock policy check [FILE]       load FILE (default: the workspace's) as up would
 *   airlock policy explain [-C DIR] PATH...   which rule syncs or withholds each PATH
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/policy/policy.h"
#include "cmd_i.h"

#ifndef AIRLOCK_SCHEMA_DIR
#define AIRLOCK_SCHEMA_DIR "/usr/local/share/airlock/schema"
#endif

/* What a file at the workspace root says about the hosts its tools fetch
 * from. One row per marker file; a host is added once. */
static const struct ecosystem {
	const char *file, *what;
	const char *hosts[4];
} ecosystems[] = {
    {"package.json", "npm", {"registry.npmjs.org"}},
    {"yarn.lock", "yarn", {"registry.yarnpkg.com", "registry.npmjs.org"}},
    {"pnpm-lock.yaml", "pnpm", {"registry.npmjs.org"}},
    {"pyproject.toml", "Python", {"pypi.org", "files.pythonhosted.org"}},
    {"requirements.txt", "pip", {"pypi.org", "files.pythonhosted.org"}},
    {"setup.py", "Python", {"pypi.org", "files.pythonhosted.org"}},
    {"Pipfile", "pipenv", {"pypi.org", "files.pythonhosted.org"}},
    {"go.mod", "Go modules", {"proxy.golang.org", "sum.golang.org"}},
    {"Cargo.toml", "Cargo", {"index.crates.io", "static.crates.io", "crates.io"}},
    {"Gemfile", "Bundler", {"rubygems.org", "index.rubygems.org"}},
    {"composer.json", "Composer", {"repo.packagist.org"}},
    {"pom.xml", "Maven", {"repo.maven.apache.org", "repo1.maven.org"}},
    {"build.gradle", "Gradle", {"repo.maven.apache.org", "plugins.gradle.org", "services.gradle.org"}},
    {"build.gradle.kts", "Gradle", {"repo.maven.apache.org", "plugins.gradle.org", "services.gradle.org"}},
};

static bool has_host(json_t *a, const char *h)
{
	size_t i;
	json_t *e;

	json_array_foreach(a, i, e) if (!strcmp(json_string_value(e), h)) return true;
	return false;
}

/* The starter policy for dir; the detected ecosystems' names in found. */
static json_t *starter(int dirfd, char *found, size_t n)
{
	json_t *allow = json_array();
	size_t o = 0;

	found[0] = '\0';
	for (size_t i = 0; allow && i < sizeof(ecosystems) / sizeof(ecosystems[0]); i++) {
		struct stat st;
		if (fstatat(dirfd, ecosystems[i].file, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(st.st_mode))
			continue;
		o += (size_t)snprintf(found + o, o < n ? n - o : 0, "%s%s (%s)", o ? ", " : "", ecosystems[i].file,
				      ecosystems[i].what);
		for (size_t k = 0; k < 4 && ecosystems[i].hosts[k]; k++)
			if (!has_host(allow, ecosystems[i].hosts[k]))
				json_array_append_new(allow, json_string(ecosystems[i].hosts[k]));
	}
	if (!allow)
		return NULL;
	return json_pack("{s:s, s:{s:{s:[], s:b}}, s:{s:i}, s:{s:s, s:o}}", "$schema",
			 AIRLOCK_SCHEMA_DIR "/airlock.schema.json", "workspace", "sync", "exclude", "gitignore", 1,
			 "execution", "timeout_seconds", 300, "egress", "default", "deny", "allow", allow);
}

int cmd_init(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"force", no_argument, NULL, 'f'},
	    {NULL, 0, NULL, 0},
	};
	char real[PATH_MAX], path[PATH_MAX + 32], tmp[PATH_MAX + 48], found[1024], err[1024];
	bool force = false;
	struct policy *pol = NULL;
	json_t *doc;
	int c, fd, dirfd;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		if (c != 'f') {
			cmd_usage("init");
			return 2;
		}
		force = true;
	}
	if (argc - optind > 1) {
		cmd_operands("init", argc, argv, optind, 1, "");
		return 2;
	}
	const char *dir = optind < argc ? argv[optind] : ".";
	if (!realpath(dir, real) || (dirfd = open(real, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		cmd_err("init: %s: %s (give the workspace directory)", dir, strerror(errno));
		return 2;
	}
	snprintf(path, sizeof(path), "%s/%s", real, POLICY_FILE_NAME);
	snprintf(tmp, sizeof(tmp), "%s/.%s.%d.tmp", real, POLICY_FILE_NAME, (int)getpid());
	if (!force && faccessat(dirfd, POLICY_FILE_NAME, F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		cmd_err("init: %s exists; check it with: airlock policy check %s (or --force to replace it)", path,
			path);
		close(dirfd);
		return 1;
	}
	doc = starter(dirfd, found, sizeof(found));
	close(dirfd);
	if (!doc || (fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644)) < 0) {
		cmd_err("init: %s: %s", tmp, doc ? strerror(errno) : "out of memory");
		json_decref(doc);
		return 1;
	}
	int bad = json_dumpfd(doc, fd, JSON_INDENT(2) | JSON_PRESERVE_ORDER) < 0 || write(fd, "\n", 1) != 1;
	json_decref(doc);
	if (close(fd) < 0 || bad || rename(tmp, path) < 0) {
		cmd_err("init: writing %s: %s", path, strerror(errno));
		unlink(tmp);
		return 1;
	}
	/* what up will do with it: the loader must take what we wrote */
	if (policy_load(path, &pol, err, sizeof(err)) < 0) {
		cmd_err("init: the starter policy does not load (a bug): %s", err);
		return 1;
	}
	policy_free(pol);
	printf("wrote %s\n", path);
	printf("detected: %s\n", found[0] ? found : "nothing (no package manager files): egress.allow is empty");
	printf("egress.allow lets the sandbox reach only those hosts; everything else is denied (airlock audit shows "
	       "denials). Keys: doc/POLICY.md\n");
	return 0;
}

/* ---- policy check / explain ---- */

static int policy_check_cmd(int argc, char **argv)
{
	char real[PATH_MAX], path[PATH_MAX + 32], err[1024];
	const struct policy_egress *eg;
	struct policy *pol = NULL;
	const char *file;

	if (argc > 2) {
		cmd_operands("policy", argc, argv, 2, 0, "");
		return 2;
	}
	if (argc == 2) {
		file = argv[1];
	} else {
		if (ws_resolve(".", real, true) < 0) {
			cmd_err("policy check: the current directory: %s", strerror(errno));
			return 2;
		}
		/* the workspace's, else the nearest airlock.json above */
		for (;;) {
			snprintf(path, sizeof(path), "%s/%s", real, POLICY_FILE_NAME);
			char *slash = strrchr(real, '/');
			if (access(path, F_OK) == 0 || !slash || slash == real)
				break;
			*slash = '\0';
		}
		if (access(path, F_OK) < 0) {
			cmd_err("policy check: no %s here or above (airlock init writes a starter one)",
				POLICY_FILE_NAME);
			return 2;
		}
		file = path;
	}
	if (policy_load(file, &pol, err, sizeof(err)) < 0) {
		cmd_err("policy check: %s", err);
		return 2;
	}
	eg = policy_egress(pol);
	printf("%s: valid (%zu egress host%s allowed; keys: doc/POLICY.md)\n", file, eg ? eg->n_allow : 0,
	       eg && eg->n_allow == 1 ? "" : "s");
	policy_free(pol);
	return 0;
}

static const char *const reason_names[] = {
    [POLICY_SYNCED] = "synced",
    [POLICY_SECRET] = "the built-in secret list",
    [POLICY_EXCLUDED] = "workspace.sync.exclude",
    [POLICY_IGNORED] = "gitignore",
    [POLICY_NOT_INCLUDED] = "workspace.sync.include",
};

/* path (relative to the current directory, or absolute) as relative to
 * the workspace root: into rel. false when it is not below it. */
static bool rel_to(const char *root, const char *path, char *rel, size_t n)
{
	char abs[PATH_MAX * 2], cwd[PATH_MAX];
	size_t rl = strlen(root);

	if (path[0] == '/')
		snprintf(abs, sizeof(abs), "%s", path);
	else if (getcwd(cwd, sizeof(cwd)))
		snprintf(abs, sizeof(abs), "%s/%s", cwd, path);
	else
		return false;
	/* no realpath: the path may not exist, and a symlink is judged by its own name */
	size_t l = strlen(abs);
	while (l > 1 && abs[l - 1] == '/')
		abs[--l] = '\0';
	if (!ws_path_below(abs, root))
		return false;
	snprintf(rel, n, "%s", abs[rl] ? abs + rl + 1 : "");
	return true;
}

static int policy_explain(int argc, char **argv)
{
	char root[PATH_MAX], err[1024], rel[PATH_MAX];
	const char *dir = ".";
	struct policy *pol = NULL;
	struct policy_ctx *ctx = NULL;
	int c, rootfd, status = 0;

	optind = 1;
	while ((c = getopt(argc, argv, "+C:")) != -1) {
		if (c != 'C') {
			cmd_usage("policy");
			return 2;
		}
		dir = optarg;
	}
	if (optind >= argc) {
		cmd_err("policy explain: missing PATH (the workspace path to explain)");
		cmd_usage("policy");
		return 2;
	}
	if (ws_resolve(dir, root, true) < 0 || (rootfd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		cmd_err("policy explain: workspace %s: %s", dir, strerror(errno));
		return 2;
	}
	if (policy_load_for_workspace(root, NULL, &pol, err, sizeof(err)) < 0 ||
	    policy_ctx_new(pol, rootfd, &ctx) < 0) {
		cmd_err("policy explain: %s", pol ? "out of memory" : err);
		policy_free(pol);
		close(rootfd);
		return 2;
	}
	printf("workspace %s, policy %s\n", root, policy_source(pol));
	for (int i = optind; i < argc; i++) {
		struct policy_verdict v;
		struct stat st;
		if (!rel_to(root, argv[i], rel, sizeof(rel))) {
			cmd_err("policy explain: %s is not inside %s", argv[i], root);
			status = 2;
			continue;
		}
		int is_dir = fstatat(rootfd, rel[0] ? rel : ".", &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(st.st_mode);
		if (policy_check(pol, ctx, rel, is_dir, &v) < 0) {
			cmd_err("policy explain: %s: not a workspace-relative path airlock can judge", argv[i]);
			status = 2;
			continue;
		}
		printf("%s%s: %s%s%s\n", rel[0] ? rel : ".", is_dir ? "/" : "",
		       v.reason == POLICY_SYNCED ? "synced" : "withheld by ",
		       v.reason == POLICY_SYNCED ? ""
		       : v.rule[0]		 ? v.rule
						 : reason_names[v.reason],
		       v.inherited ? " (a parent directory is withheld)" : "");
	}
	policy_ctx_free(ctx);
	policy_free(pol);
	close(rootfd);
	return status;
}

int cmd_policy(int argc, char **argv)
{
	if (argc >= 2 && !strcmp(argv[1], "check"))
		return policy_check_cmd(argc - 1, argv + 1);
	if (argc >= 2 && !strcmp(argv[1], "explain"))
		return policy_explain(argc - 1, argv + 1);
	if (argc < 2)
		cmd_err("policy: missing check or explain");
	else
		cmd_err("policy: unknown subcommand '%s' (check or explain)", argv[1]);
	cmd_usage("policy");
	return 2;
}
