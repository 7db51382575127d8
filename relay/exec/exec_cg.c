/* SPDX-License-Identifier: Apache-2.0 */
/*
 * exec_cg: cgroups for commands.
 *
 * Layout: <agent's own v2 cgroup>/<name>/c<seq>, one leaf per command. The
 * parent <name> exists so the agent's own cgroup is not crowded and so that
 * controllers can be enabled for the leaves. A command joins its leaf from
 * the child side (writes "0" into cgroup.procs before execve), so every
 * process it ever forks is tracked, whatever it does with sessions.
 *
 * Hybrid hosts (cgroup2 at /sys/fs/cgroup/unified, controllers bound to v1
 * hierarchies) are common in VMs and CI: there the v2 leaf still tracks and
 * kills the tree, and pids/memory limits go to a v1 leaf of the same name
 * under the agent's v1 pids/memory cgroup.
 *
 * All of this is small synchronous sysfs I/O on the loop thread; it does
 * not block on anything but the kernel.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/core/mem.h"
#include "exec_i.h"

enum { V1_PIDS, V1_MEMORY };
static const char *const v1_ctrl[2] = {"pids", "memory"};

struct exec_sys {
	enum exec_cgroup_mode mode;
	unsigned caps;
	char *v2_own;	 /* the agent's own v2 cgroup directory */
	char *v2_parent; /* <own>/<name> */
	char *v1_parent[2];
	uint64_t seq;
	char desc[256];
};

static int read_small(const char *path, char *buf, size_t size)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	size_t got = 0;

	if (fd < 0)
		return -errno;
	while (got + 1 < size) {
		ssize_t n = read(fd, buf + got, size - 1 - got);
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0) {
			int r = -errno;
			close(fd);
			return r;
		}
		if (n == 0)
			break;
		got += (size_t)n;
	}
	buf[got] = '\0';
	close(fd);
	return (int)got;
}

static int write_str(const char *path, const char *s)
{
	int fd = open(path, O_WRONLY | O_CLOEXEC);
	int r = 0;

	if (fd < 0)
		return -errno;
	size_t len = strlen(s);
	ssize_t n = write(fd, s, len);
	if (n < 0)
		r = -errno;
	else if ((size_t)n != len)
		r = -EIO;
	close(fd);
	return r;
}

static char *path_join(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	char *p = mem_alloc(la + lb + 2);

	if (!p)
		return NULL;
	memcpy(p, a, la);
	p[la] = '/';
	memcpy(p + la + 1, b, lb + 1);
	return p;
}

static int path_file(char *out, size_t size, const char *dir, const char *file)
{
	int n = snprintf(out, size, "%s/%s", dir, file);
	return (n < 0 || (size_t)n >= size) ? -ENAMETOOLONG : 0;
}

static bool has_token(const char *list, const char *tok, char sep)
{
	size_t lt = strlen(tok);

	for (const char *p = list; p && *p;) {
		const char *end = strchr(p, sep);
		size_t n = end ? (size_t)(end - p) : strlen(p);
		if (n == lt && memcmp(p, tok, lt) == 0)
			return true;
		p = end ? end + 1 : NULL;
	}
	return false;
}

/* Mount point and mount root of the cgroup2 hierarchy (ctrl == NULL) or of
 * the v1 hierarchy that carries ctrl. */
static int find_mount(const char *ctrl, char *mnt, size_t mnt_size, char *root, size_t root_size)
{
	FILE *f = fopen("/proc/self/mountinfo", "re");
	char line[4096];
	int r = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		char *save = NULL, *fields[16];
		int nf = 0;
		for (char *t = strtok_r(line, " \n", &save); t && nf < 16; t = strtok_r(NULL, " \n", &save))
			fields[nf++] = t;
		int dash = -1;
		for (int i = 6; i < nf; i++)
			if (strcmp(fields[i], "-") == 0) {
				dash = i;
				break;
			}
		if (dash < 0 || dash + 3 >= nf + 1 || dash + 1 >= nf)
			continue;
		const char *fstype = fields[dash + 1];
		const char *super = dash + 3 < nf ? fields[dash + 3] : "";
		bool match = ctrl ? (strcmp(fstype, "cgroup") == 0 && has_token(super, ctrl, ','))
				  : strcmp(fstype, "cgroup2") == 0;
		if (!match)
			continue;
		if (strlen(fields[4]) >= mnt_size || strlen(fields[3]) >= root_size) {
			r = -ENAMETOOLONG;
			break;
		}
		strcpy(mnt, fields[4]);
		strcpy(root, fields[3]);
		r = 0;
		break;
	}
	fclose(f);
	return r;
}

/* The agent's cgroup path in the v2 hierarchy (ctrl == NULL) or in the v1
 * hierarchy that carries ctrl, from /proc/self/cgroup. */
static int own_path(const char *ctrl, char *out, size_t size)
{
	FILE *f = fopen("/proc/self/cgroup", "re");
	char line[4096];
	int r = -ENOENT;

	if (!f)
		return -errno;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\n")] = '\0';
		char *c1 = strchr(line, ':');
		char *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
		if (!c2)
			continue;
		*c2 = '\0';
		const char *ctrls = c1 + 1;
		bool match = ctrl ? has_token(ctrls, ctrl, ',') : (c1 == line + 1 && line[0] == '0' && *ctrls == '\0');
		if (!match)
			continue;
		if (strlen(c2 + 1) >= size) {
			r = -ENAMETOOLONG;
			break;
		}
		strcpy(out, c2 + 1);
		r = 0;
		break;
	}
	fclose(f);
	return r;
}

/* Directory of the agent's own cgroup in one hierarchy, mem_alloc'ed. */
static char *own_dir(const char *ctrl)
{
	char mnt[1024], root[1024], path[2048], full[4096];

	if (find_mount(ctrl, mnt, sizeof(mnt), root, sizeof(root)) < 0 || own_path(ctrl, path, sizeof(path)) < 0)
		return NULL;
	const char *rel = path;
	size_t lr = strlen(root);
	if (strcmp(root, "/") != 0) {
		/* Inside a cgroup namespace or a bind mount of a subtree. */
		if (strncmp(path, root, lr) != 0 || (path[lr] != '\0' && path[lr] != '/'))
			return NULL;
		rel = path + lr;
	}
	int n = snprintf(full, sizeof(full), "%s%s", mnt, strcmp(rel, "/") == 0 ? "" : rel);
	if (n < 0 || (size_t)n >= sizeof(full))
		return NULL;
	return mem_strdup(full);
}

/* The top of one hierarchy as this mount namespace sees it (its mount
 * point), mem_alloc'ed. */
static char *top_dir(const char *ctrl)
{
	char mnt[1024], root[1024];

	if (find_mount(ctrl, mnt, sizeof(mnt), root, sizeof(root)) < 0)
		return NULL;
	return mem_strdup(mnt);
}

static int make_dir(const char *path)
{
	if (mkdir(path, 0755) == 0 || errno == EEXIST)
		return 0;
	return -errno;
}

/* Enable ctrl for the children of dir; true if it is enabled afterwards. */
static bool enable_ctrl(const char *dir, const char *ctrl)
{
	char p[4096], buf[512], cmd[32];

	if (path_file(p, sizeof(p), dir, "cgroup.subtree_control") < 0)
		return false;
	snprintf(cmd, sizeof(cmd), "+%s", ctrl);
	(void)write_str(p, cmd);
	if (read_small(p, buf, sizeof(buf)) < 0)
		return false;
	buf[strcspn(buf, "\n")] = '\0';
	return has_token(buf, ctrl, ' ');
}

static void describe(struct exec_sys *s)
{
	if (!s->caps) {
		snprintf(s->desc, sizeof(s->desc),
			 "no cgroup: timeout/cancel kill the process group only; limits via rlimits");
		return;
	}
	snprintf(s->desc, sizeof(s->desc), "cgroup v2 %s%s; pids limit: %s; memory limit: %s",
		 (s->caps & EXEC_CAP_CG2) ? s->v2_parent : "(none)",
		 (s->caps & EXEC_CAP_CG2_KILL) ? " (cgroup.kill)" : "",
		 (s->caps & EXEC_CAP_CG2_PIDS)	 ? "v2 pids.max"
		 : (s->caps & EXEC_CAP_CG1_PIDS) ? "v1 pids.max"
						 : "RLIMIT_NPROC",
		 (s->caps & EXEC_CAP_CG2_MEMORY)   ? "v2 memory.max"
		 : (s->caps & EXEC_CAP_CG1_MEMORY) ? "v1 memory.limit_in_bytes"
						   : "RLIMIT_AS");
}

int exec_sys_new(const struct exec_sys_cfg *cfg, struct exec_sys **out)
{
	struct exec_sys *s = mem_calloc(1, sizeof(*s));
	char name[256], p[4096];
	int r = 0;

	*out = NULL;
	if (!s)
		return -ENOMEM;
	s->mode = cfg ? cfg->cgroup : EXEC_CGROUP_AUTO;
	if (cfg && cfg->cgroup_name) {
		if (!*cfg->cgroup_name || strchr(cfg->cgroup_name, '/') || strcmp(cfg->cgroup_name, ".") == 0 ||
		    strcmp(cfg->cgroup_name, "..") == 0 || strlen(cfg->cgroup_name) >= sizeof(name)) {
			r = -EINVAL;
			goto out;
		}
		strcpy(name, cfg->cgroup_name);
	} else {
		/* A second exec_sys in one process gets its own parent. */
		static atomic_uint instances;
		unsigned k = atomic_fetch_add(&instances, 1);
		if (k)
			snprintf(name, sizeof(name), "airlock-exec.%ld.%u", (long)getpid(), k);
		else
			snprintf(name, sizeof(name), "airlock-exec.%ld", (long)getpid());
	}
	if (s->mode == EXEC_CGROUP_OFF)
		goto done;

	s->v2_own = cfg && cfg->top_level ? top_dir(NULL) : own_dir(NULL);
	if (s->v2_own && (s->v2_parent = path_join(s->v2_own, name)) && make_dir(s->v2_parent) == 0) {
		s->caps |= EXEC_CAP_CG2;
		if (path_file(p, sizeof(p), s->v2_parent, "cgroup.kill") == 0 && access(p, W_OK) == 0)
			s->caps |= EXEC_CAP_CG2_KILL;
		char ctl[512];
		if (path_file(p, sizeof(p), s->v2_own, "cgroup.controllers") == 0 &&
		    read_small(p, ctl, sizeof(ctl)) >= 0) {
			ctl[strcspn(ctl, "\n")] = '\0';
			for (int i = 0; i < 2; i++) {
				if (!has_token(ctl, v1_ctrl[i], ' '))
					continue;
				if (enable_ctrl(s->v2_own, v1_ctrl[i]) && enable_ctrl(s->v2_parent, v1_ctrl[i]))
					s->caps |= i == V1_PIDS ? EXEC_CAP_CG2_PIDS : EXEC_CAP_CG2_MEMORY;
			}
		}
	} else {
		mem_free(s->v2_parent);
		s->v2_parent = NULL;
	}
	if (!(s->caps & EXEC_CAP_CG2) && s->mode == EXEC_CGROUP_REQUIRE) {
		r = -ENOTSUP;
		goto out;
	}
	for (int i = 0; i < 2; i++) {
		unsigned v2cap = i == V1_PIDS ? EXEC_CAP_CG2_PIDS : EXEC_CAP_CG2_MEMORY;
		if (s->caps & v2cap)
			continue;
		char *own = cfg && cfg->top_level ? top_dir(v1_ctrl[i]) : own_dir(v1_ctrl[i]);
		if (!own)
			continue;
		s->v1_parent[i] = path_join(own, name);
		mem_free(own);
		if (s->v1_parent[i] && make_dir(s->v1_parent[i]) == 0) {
			s->caps |= i == V1_PIDS ? EXEC_CAP_CG1_PIDS : EXEC_CAP_CG1_MEMORY;
		} else {
			mem_free(s->v1_parent[i]);
			s->v1_parent[i] = NULL;
		}
	}
done:
	describe(s);
	*out = s;
	return 0;
out:
	exec_sys_free(s);
	return r;
}

/* rmdir every leaf left behind by a command whose processes were still
 * dying when it was freed, then the parent. */
static void remove_tree(const char *dir)
{
	char p[4096];

	/* Agent shutdown, not the loop: waiting up to a second for killed
	 * processes to leave their cgroups is fine here. */
	for (int tries = 0; tries < 100; tries++) {
		DIR *d = opendir(dir);
		struct dirent *de;
		bool busy = false;
		if (!d)
			return;
		while ((de = readdir(d))) {
			if (de->d_type != DT_DIR || de->d_name[0] != 'c' ||
			    path_file(p, sizeof(p), dir, de->d_name) < 0)
				continue;
			if (rmdir(p) < 0 && errno == EBUSY) {
				/* Reads cgroup.procs, which v1 and v2 both have. */
				struct exec_cg cg = {.v2 = p};
				busy = true;
				(void)exec_cg_signal(&cg, SIGKILL);
			}
		}
		closedir(d);
		if (rmdir(dir) == 0 || errno != EBUSY || !busy)
			return;
		usleep(10000);
	}
}

void exec_sys_free(struct exec_sys *s)
{
	if (!s)
		return;
	if (s->v2_parent && (s->caps & EXEC_CAP_CG2))
		remove_tree(s->v2_parent);
	for (int i = 0; i < 2; i++)
		if (s->v1_parent[i])
			remove_tree(s->v1_parent[i]);
	mem_free(s->v2_own);
	mem_free(s->v2_parent);
	mem_free(s->v1_parent[0]);
	mem_free(s->v1_parent[1]);
	mem_free(s);
}

unsigned exec_sys_caps(const struct exec_sys *s)
{
	return s ? s->caps : 0;
}

const char *exec_sys_describe(const struct exec_sys *s)
{
	return s ? s->desc : "no exec_sys: process-group kills only";
}

/* ---- per command ---- */

static int open_procs(const char *dir, int *fd)
{
	char p[4096];
	int r = path_file(p, sizeof(p), dir, "cgroup.procs");

	if (r < 0)
		return r;
	*fd = open(p, O_WRONLY | O_CLOEXEC);
	return *fd < 0 ? -errno : 0;
}

static int set_limit(const char *dir, const char *file, uint64_t v)
{
	char p[4096], num[32];
	int r = path_file(p, sizeof(p), dir, file);

	if (r < 0)
		return r;
	snprintf(num, sizeof(num), "%" PRIu64, v);
	return write_str(p, num);
}

int exec_cg_create(struct exec_sys *sys, const struct exec_limits *lim, struct exec_cg *cg)
{
	char leaf[32];
	int r = 0;

	memset(cg, 0, sizeof(*cg));
	cg->procs_fd[0] = cg->procs_fd[1] = cg->procs_fd[2] = -1;
	if (!sys || !sys->caps)
		return 0;
	/* A leaf left by a crashed agent that had our pid: take the next name. */
	for (int tries = 0;; tries++) {
		snprintf(leaf, sizeof(leaf), "c%" PRIu64, ++sys->seq);
		if (!(sys->caps & EXEC_CAP_CG2))
			break;
		if (!(cg->v2 = path_join(sys->v2_parent, leaf)))
			return -ENOMEM;
		if (mkdir(cg->v2, 0755) == 0)
			break;
		r = -errno;
		mem_free(cg->v2);
		cg->v2 = NULL;
		if (r != -EEXIST || tries == 16)
			return r;
	}
	if (sys->caps & EXEC_CAP_CG2) {
		cg->has_kill = sys->caps & EXEC_CAP_CG2_KILL;
		if (lim->pids_max && (sys->caps & EXEC_CAP_CG2_PIDS)) {
			if ((r = set_limit(cg->v2, "pids.max", lim->pids_max)) < 0)
				goto fail;
			cg->pids_limited = true;
		}
		if (lim->memory_max && (sys->caps & EXEC_CAP_CG2_MEMORY)) {
			if ((r = set_limit(cg->v2, "memory.max", lim->memory_max)) < 0)
				goto fail;
			(void)set_limit(cg->v2, "memory.swap.max", 0);
			cg->mem_limited = true;
		}
		if ((r = open_procs(cg->v2, &cg->procs_fd[0])) < 0)
			goto fail;
	}
	for (int i = 0; i < 2; i++) {
		if (!sys->v1_parent[i])
			continue;
		/* v1 pids also tracks the tree for kills when there is no v2. */
		bool want = i == V1_PIDS ? (lim->pids_max || !cg->v2) : lim->memory_max != 0;
		if (!want)
			continue;
		if (!(cg->v1[i] = path_join(sys->v1_parent[i], leaf))) {
			r = -ENOMEM;
			goto fail;
		}
		if (mkdir(cg->v1[i], 0755) < 0 && errno != EEXIST) { /* stale and empty: reuse */
			r = -errno;
			mem_free(cg->v1[i]);
			cg->v1[i] = NULL;
			goto fail;
		}
		if (i == V1_PIDS && lim->pids_max) {
			if ((r = set_limit(cg->v1[i], "pids.max", lim->pids_max)) < 0)
				goto fail;
			cg->pids_limited = true;
		}
		if (i == V1_MEMORY) {
			if ((r = set_limit(cg->v1[i], "memory.limit_in_bytes", lim->memory_max)) < 0)
				goto fail;
			/* memory + swap (with swap accounting on): no swapping past it */
			(void)set_limit(cg->v1[i], "memory.memsw.limit_in_bytes", lim->memory_max);
			cg->mem_limited = true;
		}
		if ((r = open_procs(cg->v1[i], &cg->procs_fd[1 + i])) < 0)
			goto fail;
	}
	return 0;
fail:
	exec_cg_destroy(cg);
	return r;
}

void exec_cg_close_fds(struct exec_cg *cg)
{
	for (int i = 0; i < 3; i++)
		if (cg->procs_fd[i] >= 0) {
			close(cg->procs_fd[i]);
			cg->procs_fd[i] = -1;
		}
}

bool exec_cg_tracks(const struct exec_cg *cg)
{
	return cg->v2 || cg->v1[V1_PIDS];
}

/* The directory whose cgroup.procs lists the whole tree. */
static const char *tree_dir(const struct exec_cg *cg)
{
	return cg->v2 ? cg->v2 : cg->v1[V1_PIDS];
}

int exec_cg_signal(struct exec_cg *cg, int sig)
{
	char p[4096], buf[4096];
	const char *dir = tree_dir(cg);

	if (!dir)
		return -ENOENT;
	if (sig == SIGKILL && cg->v2 && cg->has_kill && path_file(p, sizeof(p), cg->v2, "cgroup.kill") == 0 &&
	    write_str(p, "1") == 0)
		return 1;
	if (path_file(p, sizeof(p), dir, "cgroup.procs") < 0)
		return -ENAMETOOLONG;
	int fd = open(p, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	int count = 0;
	size_t have = 0;
	for (;;) {
		ssize_t n = read(fd, buf + have, sizeof(buf) - 1 - have);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		have += (size_t)n;
		buf[have] = '\0';
		char *line = buf, *nl;
		while ((nl = strchr(line, '\n'))) {
			*nl = '\0';
			long pid = strtol(line, NULL, 10);
			if (pid > 1 && kill((pid_t)pid, sig) == 0)
				count++;
			line = nl + 1;
		}
		have = strlen(line);
		memmove(buf, line, have);
	}
	close(fd);
	return count;
}

int exec_cg_populated(const struct exec_cg *cg)
{
	char p[4096], buf[512];

	if (cg->v2) {
		if (path_file(p, sizeof(p), cg->v2, "cgroup.events") < 0 || read_small(p, buf, sizeof(buf)) < 0)
			return 1;
		return strstr(buf, "populated 1") ? 1 : 0;
	}
	if (cg->v1[V1_PIDS]) {
		if (path_file(p, sizeof(p), cg->v1[V1_PIDS], "cgroup.procs") < 0 || read_small(p, buf, sizeof(buf)) < 0)
			return 1;
		return buf[0] != '\0';
	}
	return -ENOENT;
}

void exec_cg_destroy(struct exec_cg *cg)
{
	exec_cg_close_fds(cg);
	if (cg->v2)
		(void)rmdir(cg->v2);
	for (int i = 0; i < 2; i++)
		if (cg->v1[i])
			(void)rmdir(cg->v1[i]);
	mem_free(cg->v2);
	mem_free(cg->v1[0]);
	mem_free(cg->v1[1]);
	cg->v2 = cg->v1[0] = cg->v1[1] = NULL;
}

/* ---- a tree started elsewhere (exec.h, exec_cgroup_*) ---- */

struct exec_cgroup {
	struct exec_cg cg;
};

int exec_cgroup_new(struct exec_sys *sys, const struct exec_limits *lim, struct exec_cgroup **out)
{
	struct exec_cgroup *c = mem_calloc(1, sizeof(*c));
	int r;

	*out = NULL;
	if (!c)
		return -ENOMEM;
	if ((r = exec_cg_create(sys, lim, &c->cg)) < 0) {
		mem_free(c);
		return r;
	}
	*out = c;
	return 0;
}

int exec_cgroup_attach(struct exec_cgroup *c, pid_t pid)
{
	char num[24];
	int n = snprintf(num, sizeof(num), "%ld", (long)pid);

	for (int i = 0; i < 3; i++)
		if (c->cg.procs_fd[i] >= 0 && write(c->cg.procs_fd[i], num, (size_t)n) != n)
			return -errno;
	return 0;
}

unsigned exec_cgroup_limits(const struct exec_cgroup *c)
{
	if (!c)
		return 0;
	return (c->cg.pids_limited ? EXEC_CGROUP_PIDS : 0u) | (c->cg.mem_limited ? EXEC_CGROUP_MEMORY : 0u);
}

const char *exec_cgroup_dir(const struct exec_cgroup *c)
{
	return c ? (c->cg.v2 ? c->cg.v2 : c->cg.v1[V1_PIDS]) : NULL;
}

void exec_cgroup_free(struct exec_cgroup *c)
{
	if (!c)
		return;
	if (exec_cg_tracks(&c->cg)) {
		/* what is left is the tree's: it dies with its cgroup */
		for (int tries = 0; tries < 100 && exec_cg_populated(&c->cg) == 1; tries++) {
			(void)exec_cg_signal(&c->cg, SIGKILL);
			usleep(10000);
		}
	}
	exec_cg_destroy(&c->cg);
	mem_free(c);
}
