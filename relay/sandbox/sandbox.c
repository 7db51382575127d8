/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sandbox: the common half (sandbox.h): kind names, the state directory
 * under $XDG_DATA_HOME/airlock/sandboxes/<workspace-id>/, keys generated on
 * first start and pinned both ways, dispatch to the backends, destroy.
 *
 * State directory layout (doc/SANDBOX.md):
 *   lock        flock'ed (exclusive) while a sandbox of this dir runs
 *   keys/       host.key, guest.key (0600, the invoking user's; never
 *               visible inside the sandbox)
 *   workspace/  the agent's copy of the workspace
 *   home/       the sandbox's $HOME
 *   agent/      the agent's sync state
 *   run/        agent.sock
 *   agent.log   the agent's stderr
 *   uid         the sandbox's own host uid (root only; see below)
 * When airlock runs as root, the local sandbox's one uid is a host uid of
 * its own (sandbox_uid_take), never shared with another sandbox, a user or
 * a running process: the four directories it writes are chowned to it.
 */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <grp.h>
#include <pwd.h>
#include <dirent.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/keys.h"
#include "airlock/core/mem.h"
#include "airlock/sync/audit.h"
#include "sandbox_i.h"

/* The backends, by kind: the one table dispatch and the names go through. */
static const struct sandbox_backend {
	const char *name;
	int (*start)(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen);
	void (*stop)(struct sandbox *sb);
	int (*halt)(struct sandbox *sb); /* NULL: none (sandbox_halt is -ENOTSUP) */
	/* forks (NULL: the kind has none; sandbox_forks_*) */
	int (*forks_freeze)(const char *dir, unsigned *gen, char *err, size_t errlen);
	int (*forks_make)(const char *dir, const char *name, unsigned gen, int64_t ttl_s, char *err, size_t errlen);
	int (*forks_remove)(const char *dir, const char *name, char *err, size_t errlen);
	unsigned fork_flags; /* SANDBOX_FORKS_* */
} backends[] = {
    [SANDBOX_LOCAL] = {"local", sandbox_local_start, sandbox_local_stop, sandbox_local_halt, sandbox_fork_freeze,
		       sandbox_fork_make, sandbox_fork_remove, SANDBOX_FORKS_UPPER},
    [SANDBOX_VM] = {"vm", sandbox_vm_start, sandbox_vm_stop, NULL, sandbox_vm_forks_freeze, sandbox_vm_forks_make,
		    sandbox_vm_fork_remove, SANDBOX_FORKS_LIVE},
};

static const struct sandbox_backend *backend_of(enum sandbox_kind k)
{
	if ((size_t)k >= sizeof(backends) / sizeof(backends[0]) || !backends[k].name)
		return NULL;
	return &backends[k];
}

int sandbox_kind_parse(const char *s, enum sandbox_kind *out)
{
	for (size_t k = 0; s && k < sizeof(backends) / sizeof(backends[0]); k++) {
		if (backends[k].name && !strcmp(s, backends[k].name)) {
			*out = (enum sandbox_kind)k;
			return 0;
		}
	}
	return -EINVAL;
}

const char *sandbox_kind_name(enum sandbox_kind k)
{
	const struct sandbox_backend *be = backend_of(k);

	return be ? be->name : "?";
}

/* Is [first, first + n) mapped in our user namespace? */
static bool uids_mapped(uint32_t first, uint32_t n)
{
	unsigned long in, out, cnt;
	bool mapped = false;
	FILE *f;

	if (!(f = fopen("/proc/self/uid_map", "re")))
		return true; /* no /proc: assume the initial namespace */
	while (fscanf(f, "%lu %lu %lu", &in, &out, &cnt) == 3)
		if (in <= first && first - in < cnt && cnt - (first - in) >= n)
			mapped = true;
	fclose(f);
	return mapped;
}

const struct sandbox_uid_range *sandbox_uid_range(void)
{
	static const struct sandbox_uid_range ranges[] = {
	    {SANDBOX_UID_FIRST, SANDBOX_UID_COUNT},
	    {SANDBOX_UID_SMALL_FIRST, SANDBOX_UID_SMALL_COUNT},
	    {SANDBOX_NOBODY, 1},
	};

	if (geteuid() != 0)
		return NULL;
	for (size_t i = 0; i < sizeof(ranges) / sizeof(ranges[0]); i++)
		if (uids_mapped(ranges[i].first, ranges[i].count))
			return &ranges[i];
	return NULL;
}

/* ---- the sandbox's own host uid (root) ---- */

/* A sorted set of uids. */
struct uidset {
	uint32_t *v;
	size_t n, cap;
};

static int uidset_add(struct uidset *s, uint32_t u)
{
	if (s->n == s->cap) {
		size_t cap = s->cap ? s->cap * 2 : 256;
		uint32_t *v;
		if (cap > (1u << 22) || !(v = mem_realloc(s->v, cap * sizeof(*v))))
			return -ENOMEM;
		s->v = v;
		s->cap = cap;
	}
	s->v[s->n++] = u;
	return 0;
}

static int u32_cmp(const void *a, const void *b)
{
	uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
	return x < y ? -1 : x > y;
}

static void uidset_sort(struct uidset *s)
{
	if (s->n) /* qsort's base may not be NULL, even for no elements */
		qsort(s->v, s->n, sizeof(*s->v), u32_cmp);
}

static bool uidset_has(const struct uidset *s, uint32_t u)
{
	return s->n && bsearch(&u, s->v, s->n, sizeof(*s->v), u32_cmp);
}

/* The uid in a sandbox's "uid" file; -ENOENT when it has none, -EINVAL
 * when it holds anything but a uid. */
int sandbox_uid_file_read(const char *dir, uint32_t *out)
{
	char path[PATH_MAX + 8], buf[32], *end;
	int fd;
	ssize_t n;

	snprintf(path, sizeof(path), "%s/uid", dir);
	if ((fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)) < 0)
		return -errno;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return -EINVAL;
	buf[n] = '\0';
	errno = 0;
	unsigned long v = strtoul(buf, &end, 10);
	if (errno || end == buf || (*end && *end != '\n') || v == 0 || v >= UINT32_MAX)
		return -EINVAL;
	*out = (uint32_t)v;
	return 0;
}

/* Uids the other sandboxes of this state root hold. */
static int uids_of_sandboxes(const char *root, const char *self, struct uidset *s)
{
	char path[PATH_MAX];
	struct dirent *de;
	DIR *d = opendir(root);
	int r = 0;

	if (!d)
		return errno == ENOENT ? 0 : -errno;
	while (r == 0 && (de = readdir(d))) {
		uint32_t u;
		if (de->d_name[0] == '.' || (de->d_type != DT_DIR && de->d_type != DT_UNKNOWN) ||
		    (size_t)snprintf(path, sizeof(path), "%s/%s", root, de->d_name) >= sizeof(path) ||
		    !strcmp(path, self))
			continue;
		if (sandbox_uid_file_read(path, &u) == 0)
			r = uidset_add(s, u);
	}
	closedir(d);
	return r;
}

/* Every uid (real, effective, saved, fs) a running process has. */
static int uids_of_processes(struct uidset *s)
{
	char path[64], line[256];
	struct dirent *de;
	DIR *d = opendir("/proc");
	int r = 0;

	if (!d)
		return -errno;
	while (r == 0 && (de = readdir(d))) {
		unsigned long u[4];
		FILE *f;
		if (de->d_name[0] < '1' || de->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%.20s/status", de->d_name);
		if (!(f = fopen(path, "re")))
			continue; /* gone meanwhile */
		while (fgets(line, sizeof(line), f))
			if (sscanf(line, "Uid: %lu %lu %lu %lu", &u[0], &u[1], &u[2], &u[3]) == 4) {
				for (int i = 0; i < 4 && r == 0; i++)
					r = uidset_add(s, (uint32_t)u[i]);
				break;
			}
		fclose(f);
	}
	closedir(d);
	return r;
}

/* Is u inside a range of /etc/subuid or /etc/subgid (handed to a user's
 * containers)? */
static bool in_subid_file(const char *path, uint32_t u)
{
	char line[512];
	bool hit = false;
	FILE *f = fopen(path, "re");

	if (!f)
		return false;
	while (!hit && fgets(line, sizeof(line), f)) {
		const char *c = strchr(line, ':');
		unsigned long first, n;
		if (c && sscanf(c + 1, "%lu:%lu", &first, &n) == 2 && u >= first && u - first < n)
			hit = true;
	}
	fclose(f);
	return hit;
}

/* Is u another sandbox's, or named by the user and group databases or a
 * subordinate id range? */
static bool uid_claimed(uint32_t u, const struct uidset *sandboxes)
{
	return uidset_has(sandboxes, u) || getpwuid(u) || getgrgid(u) || in_subid_file("/etc/subuid", u) ||
	       in_subid_file("/etc/subgid", u);
}

static int uid_file_write(const char *dir, uint32_t u)
{
	char path[PATH_MAX + 8], tmp[PATH_MAX + 16], text[16];
	int fd, n = snprintf(text, sizeof(text), "%u\n", (unsigned)u), r = 0;

	snprintf(path, sizeof(path), "%s/uid", dir);
	snprintf(tmp, sizeof(tmp), "%s/uid.tmp", dir);
	(void)unlink(tmp);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644)) < 0)
		return -errno;
	if (write(fd, text, (size_t)n) != n || fsync(fd) < 0)
		r = errno ? -errno : -EIO;
	close(fd);
	if (r == 0 && rename(tmp, path) < 0)
		r = -errno;
	if (r < 0)
		(void)unlink(tmp);
	return r;
}

/*
 * sb->host_uid: the uid this sandbox has kept in its "uid" file, or a new
 * one from range, starting at a hash of the state directory (two state
 * roots rarely probe the same uids) and taking the first that no other
 * sandbox of this state root holds, no passwd or group entry names, no
 * /etc/subuid or /etc/subgid range holds and no running process has. A
 * kept uid outside range, or that another sandbox or a database entry
 * claims since, is given up for a new one (the files are chowned over by
 * state_subdirs_make). Allocation is serialised by an flock on the
 * state root directory. Must hold sb's own lock. The range {nobody, 1}
 * is nobody, shared, without a file.
 */
static int sandbox_uid_take(struct sandbox *sb, const struct sandbox_uid_range *range, char *err, size_t errlen)
{
	struct uidset taken = {0}, procs = {0};
	char root[PATH_MAX];
	const char *slash = strrchr(sb->dir, '/');
	uint32_t u = 0;
	int fd = -1, r;

	if (range->first == SANDBOX_NOBODY) {
		sb->host_uid = SANDBOX_NOBODY;
		return 0;
	}
	snprintf(root, sizeof(root), "%.*s", (int)(slash - sb->dir), sb->dir);
	/* the state root itself is the lock: no file is left behind once
	 * the last sandbox is destroyed */
	if ((fd = open(root, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)) < 0 || flock(fd, LOCK_EX) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "locking %s: %s", root, strerror(errno));
		goto out;
	}
	if ((r = uids_of_sandboxes(root, sb->dir, &taken)) < 0) {
		errmsg_set(err, errlen, "finding the uids in use: %s", strerror(-r));
		goto out;
	}
	uidset_sort(&taken);
	/* a kept uid's processes are this sandbox's last run, still dying:
	 * only a new uid is checked against the running processes */
	if (sandbox_uid_file_read(sb->dir, &u) == 0 && u >= range->first && u - range->first < range->count &&
	    !uid_claimed(u, &taken)) {
		sb->host_uid = u;
		goto out;
	}
	if ((r = uids_of_processes(&procs)) < 0) {
		errmsg_set(err, errlen, "finding the uids in use: %s", strerror(-r));
		goto out;
	}
	uidset_sort(&procs);
	uint8_t h[16];
	crypto_generichash(h, sizeof(h), (const uint8_t *)sb->dir, strlen(sb->dir), NULL, 0);
	uint32_t start =
	    ((uint32_t)h[0] | (uint32_t)h[1] << 8 | (uint32_t)h[2] << 16 | (uint32_t)h[3] << 24) % range->count;
	r = -EUSERS;
	for (uint32_t k = 0; k < range->count && r == -EUSERS; k++) {
		u = range->first + (start + k) % range->count;
		if (!uid_claimed(u, &taken) && !uidset_has(&procs, u))
			r = 0;
	}
	if (r < 0) {
		errmsg_set(err, errlen,
			   "no free uid left in %u-%u for the sandbox (remove unused ones: airlock down DIR "
			   "--destroy)",
			   range->first, range->first + range->count - 1);
		goto out;
	}
	if ((r = uid_file_write(sb->dir, u)) < 0) {
		errmsg_set(err, errlen, "%s/uid: %s", sb->dir, strerror(-r));
		goto out;
	}
	sb->host_uid = u;
out:
	if (fd >= 0)
		close(fd); /* releases the flock */
	mem_free(taken.v);
	mem_free(procs.v);
	return r;
}

int sandbox_dir_of(const char *workspace, char *out, size_t outlen)
{
	const char *xdg = getenv("XDG_DATA_HOME"), *home = getenv("HOME");
	char id[33];
	int r, n;

	if ((r = audit_workspace_id(workspace, id)) < 0)
		return r;
	if (xdg && xdg[0] == '/')
		n = snprintf(out, outlen, "%s/airlock/sandboxes/%s", xdg, id);
	else if (home && home[0] == '/')
		n = snprintf(out, outlen, "%s/.local/share/airlock/sandboxes/%s", home, id);
	else
		return -ENOENT;
	return n < 0 || (size_t)n >= outlen ? -ENAMETOOLONG : 0;
}

/* mkdir -p with mode for the components this creates. */
static int mkdir_p(const char *path, mode_t mode)
{
	char tmp[PATH_MAX];
	size_t n = strlen(path);

	if (n >= sizeof(tmp))
		return -ENAMETOOLONG;
	memcpy(tmp, path, n + 1);
	for (char *p = tmp + 1; *p; p++) {
		if (*p != '/')
			continue;
		*p = '\0';
		if (mkdir(tmp, 0700) < 0 && errno != EEXIST)
			return -errno;
		*p = '/';
	}
	if (mkdir(tmp, mode) < 0 && errno != EEXIST)
		return -errno;
	return 0;
}

/* Load path's key, or generate and save one first. */
static int key_get(const char *path, struct noise_keypair *kp, char *err, size_t errlen)
{
	int r;

	if (access(path, F_OK) < 0 && errno == ENOENT) {
		if ((r = keys_generate(kp)) < 0) {
			errmsg_set(err, errlen, "generating %s failed", path);
			return r;
		}
		r = keys_save(path, kp, err, errlen);
		sodium_memzero(kp, sizeof(*kp));
		if (r < 0 && r != -EEXIST)
			return r;
	}
	return keys_load(path, kp, err, errlen);
}

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

struct sandbox_common {
	int lockfd;
};

/* Step 1: sb->dir for cfg's workspace, created 0700, and its lock taken
 * (one sandbox per state directory). *lockfd is the lock's fd, -1 when none. */
static int state_dir_lock(struct sandbox *sb, const struct sandbox_cfg *cfg, int *lockfd, char *err, size_t errlen)
{
	char path[PATH_MAX + 64];
	int r;

	if ((r = sandbox_dir_of(cfg->workspace, sb->dir, sizeof(sb->dir))) < 0) {
		errmsg_set(err, errlen, "sandbox state directory for %s: %s%s", cfg->workspace, strerror(-r),
			   r == -ENOENT ? " (set HOME or XDG_DATA_HOME)" : "");
		return r;
	}
	if (cfg->fork) { /* made by sandbox_fork_make, never here */
		size_t n = strlen(sb->dir);
		struct stat st;
		if (!sandbox_fork_name_ok(cfg->fork) ||
		    (size_t)snprintf(sb->dir + n, sizeof(sb->dir) - n, "/forks/%s", cfg->fork) >= sizeof(sb->dir) - n ||
		    lstat(sb->dir, &st) < 0 || !S_ISDIR(st.st_mode)) {
			errmsg_set(err, errlen, "no fork named '%.40s' of the sandbox of %s", cfg->fork,
				   cfg->workspace);
			return -ENOENT;
		}
	}
	if ((r = mkdir_p(sb->dir, 0700)) < 0) {
		errmsg_set(err, errlen, "cannot create %s: %s", sb->dir, strerror(-r));
		return r;
	}
	snprintf(path, sizeof(path), "%s/lock", sb->dir);
	if ((*lockfd = open(path, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", path, strerror(errno));
		return r;
	}
	if (flock(*lockfd, LOCK_EX | LOCK_NB) < 0) {
		r = errno == EWOULDBLOCK ? -EBUSY : -errno;
		errmsg_set(err, errlen, "the sandbox in %s is already running (another airlock up for %s?)", sb->dir,
			   cfg->workspace);
		return r;
	}
	return 0;
}

/* The tree under path from one owner to another (entries someone else
 * owns are left alone): a sandbox whose uid changed, or one an older
 * airlock gave to nobody. */
static uint32_t chown_from, chown_to; /* for chown_one: nftw has no user data; loop thread only */

static int chown_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)flag;
	(void)f;
	if (st->st_uid == chown_from && lchown(p, chown_to, chown_to) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static int chown_tree(const char *path, uint32_t from, uint32_t to)
{
	chown_from = from;
	chown_to = to;
	int r = nftw(path, chown_one, 32, FTW_PHYS | FTW_MOUNT);
	return r < 0 ? r : r > 0 ? -EIO : 0;
}

/* A fork runs with its parent's uid: the overlay copies a lower file up
 * with its owner, which must be mapped in the fork's namespace (an own uid
 * per fork would need idmapped lower layers; doc/SANDBOX.md "Forks"). */
static int fork_uid(struct sandbox *sb, char *err, size_t errlen)
{
	char parent[PATH_MAX];
	char *cut = strstr(sb->dir, "/forks/");
	int r;

	snprintf(parent, sizeof(parent), "%.*s", cut ? (int)(cut - sb->dir) : 0, sb->dir);
	if ((r = sandbox_uid_file_read(parent, &sb->host_uid)) < 0)
		errmsg_set(err, errlen, "the parent sandbox's uid (%s/uid): %s", parent, strerror(-r));
	return r;
}

/* Step 2: keys/ and the four directories the sandbox writes (the layout at
 * the top of this file), each made once and kept; as root, owned by the
 * sandbox's own uid (sb->host_uid). A fork's workspace and home are its
 * overlays' uppers, made with it. */
static int state_subdirs_make(struct sandbox *sb, bool fork, char *err, size_t errlen)
{
	static const char *const subdirs[] = {"agent", "run", "workspace", "home"}; /* a fork: agent only */
	char path[PATH_MAX + 64];
	int r;

	snprintf(path, sizeof(path), "%s/keys", sb->dir);
	if ((r = mkdir_p(path, 0700)) < 0) {
		errmsg_set(err, errlen, "cannot create %s: %s", path, strerror(-r));
		return r;
	}
	for (size_t i = 0; i < (fork ? 1 : sizeof(subdirs) / sizeof(subdirs[0])); i++) {
		struct stat st;
		snprintf(path, sizeof(path), "%s/%s", sb->dir, subdirs[i]);
		if (lstat(path, &st) < 0) {
			if (mkdir(path, 0700) < 0 || lstat(path, &st) < 0) {
				r = -errno;
				errmsg_set(err, errlen, "cannot create %s: %s", path, strerror(errno));
				return r;
			}
		}
		if (!sb->host_uid || st.st_uid == sb->host_uid)
			continue;
		/* new (root's), or kept from an earlier uid: the sandbox's own now */
		if ((r = st.st_uid == 0 ? (lchown(path, sb->host_uid, sb->host_uid) < 0 ? -errno : 0)
					: chown_tree(path, st.st_uid, sb->host_uid)) < 0) {
			errmsg_set(err, errlen, "cannot chown %s to the sandbox's uid %u: %s", path,
				   (unsigned)sb->host_uid, strerror(-r));
			return r;
		}
	}
	return 0;
}

/* Step 3: the host's key pair and the guest's public key, each generated
 * on first start (keys/host.key, keys/guest.key). */
static int state_keys_load(struct sandbox *sb, char *err, size_t errlen)
{
	struct noise_keypair guest;
	char path[PATH_MAX + 64];
	int r;

	snprintf(path, sizeof(path), "%s/keys/host.key", sb->dir);
	if ((r = key_get(path, &sb->host, err, errlen)) < 0)
		return r;
	if ((size_t)snprintf(sb->guest_key_file, sizeof(sb->guest_key_file), "%s/keys/guest.key", sb->dir) >=
	    sizeof(sb->guest_key_file))
		return -ENAMETOOLONG;
	r = key_get(sb->guest_key_file, &guest, err, errlen);
	memcpy(sb->guest_pub, guest.pub, sizeof(sb->guest_pub));
	sodium_memzero(&guest, sizeof(guest));
	return r;
}

/* Step 4: sb->agent_path: cfg's, else the airlock-agent next to
 * /proc/self/exe; it must be executable. */
static int agent_find(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	int r;

	if (cfg->agent_path) {
		snprintf(sb->agent_path, sizeof(sb->agent_path), "%s", cfg->agent_path);
	} else {
		char self[PATH_MAX];
		ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
		char *slash;
		if (n <= 0) {
			r = -errno;
			errmsg_set(err, errlen, "cannot find airlock-agent: /proc/self/exe: %s", strerror(errno));
			return r;
		}
		self[n] = '\0';
		slash = strrchr(self, '/');
		snprintf(sb->agent_path, sizeof(sb->agent_path), "%.*s/airlock-agent", (int)(slash - self), self);
	}
	if (access(sb->agent_path, X_OK) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "agent %s: %s", sb->agent_path, strerror(errno));
		return r;
	}
	return 0;
}

int sandbox_start(const struct sandbox_cfg *cfg, struct sandbox **out, char *err, size_t errlen)
{
	const struct sandbox_backend *be = backend_of(cfg->kind);
	const struct sandbox_uid_range *range;
	struct sandbox_common *c;
	struct sandbox *sb;
	double t0 = now_ms();
	int lockfd = -1, r;

	*out = NULL;
	err[0] = '\0';
	if (!(sb = mem_calloc(1, sizeof(*sb)))) {
		errmsg_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	sb->kind = cfg->kind;
	if ((r = state_dir_lock(sb, cfg, &lockfd, err, errlen)) < 0 ||
	    (cfg->kind == SANDBOX_LOCAL && (range = sandbox_uid_range()) &&
	     (r = cfg->fork ? fork_uid(sb, err, errlen) : sandbox_uid_take(sb, range, err, errlen)) < 0) ||
	    (cfg->kind == SANDBOX_LOCAL && !cfg->fork && (r = sandbox_fork_compact(sb->dir, err, errlen)) < 0 &&
	     r != -EBUSY) ||
	    (r = state_subdirs_make(sb, cfg->fork != NULL, err, errlen)) < 0 ||
	    (r = state_keys_load(sb, err, errlen)) < 0 || (r = agent_find(sb, cfg, err, errlen)) < 0)
		goto fail;
	if (cfg->fork) {
		char parent[PATH_MAX];
		if ((r = sandbox_dir_of(cfg->workspace, parent, sizeof(parent))) < 0 ||
		    (r = sandbox_fork_run_dir(parent, cfg->fork, sb->run_dir, sizeof(sb->run_dir))) < 0) {
			errmsg_set(err, errlen, "the run directory of fork '%s': %s", cfg->fork, strerror(-r));
			goto fail;
		}
	} else {
		snprintf(sb->run_dir, sizeof(sb->run_dir), "%.*s/run", (int)(sizeof(sb->run_dir) - 5), sb->dir);
	}
	if ((r = be ? be->start(sb, cfg, err, errlen) : -EINVAL) < 0)
		goto fail;
	sb->start_ms = now_ms() - t0;
	/* the lock is ours until sandbox_stop; impl owns nothing of it */
	if (!(c = mem_calloc(1, sizeof(*c)))) {
		sandbox_stop(sb);
		close(lockfd);
		errmsg_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	c->lockfd = lockfd;
	sb->common = c;
	*out = sb;
	return 0;
fail:
	if (!err[0])
		errmsg_set(err, errlen, "%s", strerror(-r));
	if (lockfd >= 0)
		close(lockfd);
	sodium_memzero(&sb->host, sizeof(sb->host));
	mem_free(sb);
	return r;
}

const char *sandbox_address(const struct sandbox *sb)
{
	return sb->addr;
}

const struct noise_keypair *sandbox_host_key(const struct sandbox *sb)
{
	return &sb->host;
}

const uint8_t *sandbox_guest_pub(const struct sandbox *sb)
{
	return sb->guest_pub;
}

const char *sandbox_dir(const struct sandbox *sb)
{
	return sb->dir;
}

const char *sandbox_describe(const struct sandbox *sb)
{
	return sb->describe;
}

double sandbox_start_ms(const struct sandbox *sb)
{
	return sb->start_ms;
}

const char *sandbox_boot(const struct sandbox *sb)
{
	return sb->boot ? sb->boot : "cold";
}

pid_t sandbox_pid(const struct sandbox *sb)
{
	return sb->pid;
}

bool sandbox_alive(struct sandbox *sb)
{
	int status;

	if (!sb || sb->pid <= 0)
		return false;
	if (waitpid(sb->pid, &status, WNOHANG) == sb->pid) {
		sb->pid = 0; /* reaped: the backend's stop has nothing to wait for */
		return false;
	}
	return true;
}

bool sandbox_kind_forks(enum sandbox_kind kind)
{
	const struct sandbox_backend *be = backend_of(kind);

	return be && be->forks_freeze && be->forks_make && be->forks_remove;
}

unsigned sandbox_kind_fork_flags(enum sandbox_kind kind)
{
	const struct sandbox_backend *be = backend_of(kind);

	return sandbox_kind_forks(kind) ? be->fork_flags : 0;
}

/* kind's backend when it has forks, else NULL after saying so. */
static const struct sandbox_backend *forks_backend(enum sandbox_kind kind, char *err, size_t errlen)
{
	const struct sandbox_backend *be = backend_of(kind);

	if (!be || !be->forks_freeze || !be->forks_make || !be->forks_remove) {
		errmsg_set(err, errlen, "a %s sandbox has no forks", be ? be->name : "(unknown)");
		return NULL;
	}
	return be;
}

int sandbox_forks_freeze(enum sandbox_kind kind, const char *dir, unsigned *gen, char *err, size_t errlen)
{
	const struct sandbox_backend *be = forks_backend(kind, err, errlen);

	return be ? be->forks_freeze(dir, gen, err, errlen) : -ENOTSUP;
}

int sandbox_forks_make(enum sandbox_kind kind, const char *dir, const char *name, unsigned gen, int64_t ttl_s,
		       char *err, size_t errlen)
{
	const struct sandbox_backend *be = forks_backend(kind, err, errlen);

	return be ? be->forks_make(dir, name, gen, ttl_s, err, errlen) : -ENOTSUP;
}

int sandbox_forks_remove(enum sandbox_kind kind, const char *dir, const char *name, char *err, size_t errlen)
{
	const struct sandbox_backend *be = forks_backend(kind, err, errlen);

	return be ? be->forks_remove(dir, name, err, errlen) : -ENOTSUP;
}

int sandbox_halt(struct sandbox *sb)
{
	const struct sandbox_backend *be = sb ? backend_of(sb->kind) : NULL;

	return be && be->halt && sb->pid > 0 ? be->halt(sb) : -ENOTSUP;
}

void sandbox_stop(struct sandbox *sb)
{
	const struct sandbox_backend *be;

	if (!sb)
		return;
	be = backend_of(sb->kind);
	if (be)
		be->stop(sb);
	if (sb->common) {
		close(sb->common->lockfd);
		mem_free(sb->common);
	}
	sodium_memzero(&sb->host, sizeof(sb->host));
	mem_free(sb);
}

/* Pass 1 of destroy: directories the sandbox made unwritable or
 * unsearchable (e.g. read-only module caches) become 0700 again. */
static int open_up(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)f;
	if (flag == FTW_D || flag == FTW_DNR)
		(void)chmod(p, (st->st_mode & 07777) | 0700);
	return 0;
}

static int remove_one(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)f;
	if ((flag == FTW_DP ? rmdir(p) : unlink(p)) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

int sandbox_destroy(const char *workspace, char *err, size_t errlen)
{
	char dir[PATH_MAX], lock[PATH_MAX + 8];
	struct stat st;
	int fd, r;

	err[0] = '\0';
	if ((r = sandbox_dir_of(workspace, dir, sizeof(dir))) < 0) {
		errmsg_set(err, errlen, "sandbox state directory for %s: %s", workspace, strerror(-r));
		return r;
	}
	if (lstat(dir, &st) < 0) {
		if (errno == ENOENT)
			return 0;
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", dir, strerror(errno));
		return r;
	}
	snprintf(lock, sizeof(lock), "%s/lock", dir);
	if ((fd = open(lock, O_RDWR | O_CLOEXEC | O_NOFOLLOW)) >= 0) {
		if (flock(fd, LOCK_EX | LOCK_NB) < 0 && errno == EWOULDBLOCK) {
			close(fd);
			errmsg_set(err, errlen, "the sandbox in %s still runs (airlock down %s first)", dir, workspace);
			return -EBUSY;
		}
		/* held while removing, so no sandbox starts meanwhile */
	}
	(void)nftw(dir, open_up, 32, FTW_PHYS | FTW_MOUNT);
	r = nftw(dir, remove_one, 32, FTW_DEPTH | FTW_PHYS | FTW_MOUNT);
	if (fd >= 0)
		close(fd);
	if (r != 0) {
		r = r < 0 ? r : -EIO;
		errmsg_set(err, errlen, "removing %s: %s", dir, strerror(errno ? errno : EIO));
		return r;
	}
	return 0;
}
