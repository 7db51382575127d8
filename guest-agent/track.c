/* SPDX-License-Identifier: Apache-2.0 */
/* track: inotify over the workspace copy, the dirty set of guest changes (track.h). */
#include "airlock/guest/track.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/inotify.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "airlock/content/manifest.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"

#define WATCH_MASK                                                                                                     \
	(IN_CREATE | IN_DELETE | IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_FROM | IN_MOVED_TO | IN_ATTRIB |                \
	 IN_DELETE_SELF | IN_MOVE_SELF | IN_DONT_FOLLOW | IN_ONLYDIR | IN_EXCL_UNLINK)
#define WALK_DEPTH_MAX 256

/* One file or directory as an apply of ours left it: its lstat identity
 * (the kernel sets ctime on every change, and nobody can set it back). */
struct applied_id {
	uint64_t ino; /* 0 = empty slot */
	int64_t ctime_ns;
};

/* The inodes applies wrote while events may have been lost (open
 * addressing on ino), shared with the recovery thread. */
struct applied_set {
	pthread_mutex_t lock;
	struct applied_id *slot; /* protected by lock */
	size_t cap, n;		 /* protected by lock */
};

/* The stat-only walk after a lost event (track.h "Lost events"). */
struct recovery {
	pthread_t thread;
	int rootfd; /* dup of the tracker's */
	int64_t since_ns;
	const struct applied_set *applied;
	atomic_bool done, cancel;
	/* the paths it found (owned; valid once done) */
	struct track_dirty *v;
	size_t n, cap;
	bool failed; /* out of memory: the tracker saturates */
	uint64_t visited;
};

enum lost_state { LOST_NONE, LOST_WAITING, LOST_RECOVERING };

struct track {
	int ifd, rootfd;
	char *root;
	char **wd; /* wd -> directory path (owned), NULL = none */
	size_t capwd;
	size_t nwatch;
	struct track_dirty *slot; /* open addressing on path; path NULL = empty */
	size_t cap, n;
	bool saturated;
	/* lost events (IN_Q_OVERFLOW): since when, and the walk that finds them */
	enum lost_state lost;
	bool lost_again;	    /* lost more during the recovery: walk again after it */
	int64_t clean_ns;	    /* every event before this was read */
	int64_t since_ns, again_ns; /* the window to walk: ctime >= this */
	int64_t margin_ns;	    /* the coarse clock's tick, twice */
	int64_t last_apply_ns;	    /* the last track_applied */
	struct applied_set applied; /* what our applies wrote meanwhile */
	struct recovery *rec;	    /* LOST_RECOVERING */
	uint64_t queue_test;	    /* AIRLOCK_TRACK_QUEUE_TEST: events per read before a simulated overflow */
	struct track_stats st;
};

static uint64_t hash_str(const char *s)
{
	uint64_t h = 1469598103934665603ull;
	while (*s)
		h = (h ^ (uint8_t)*s++) * 1099511628211ull;
	return h;
}

static bool reserved(const char *name)
{
	return !strncmp(name, MANIFEST_RESERVED_PREFIX, sizeof(MANIFEST_RESERVED_PREFIX) - 1);
}

static void saturate(struct track *t)
{
	if (!t->saturated)
		t->st.saturated++;
	t->saturated = true;
}

static int dirty_grow(struct track *t)
{
	size_t nc = t->cap ? t->cap * 2 : 1024;
	struct track_dirty *ns = mem_calloc(nc, sizeof(*ns));

	if (!ns)
		return -ENOMEM;
	for (size_t i = 0; i < t->cap; i++) {
		if (!t->slot[i].path)
			continue;
		size_t j = hash_str(t->slot[i].path) & (nc - 1);
		while (ns[j].path)
			j = (j + 1) & (nc - 1);
		ns[j] = t->slot[i];
	}
	mem_free(t->slot);
	t->slot = ns;
	t->cap = nc;
	return 0;
}

/* Mark path dirty (by, tree), copying it. */
static void mark(struct track *t, const char *path, uint32_t by, bool tree)
{
	if (t->saturated)
		return;
	if ((t->n + 1) * 2 > t->cap && (t->n >= TRACK_DIRTY_MAX || dirty_grow(t) < 0)) {
		saturate(t);
		return;
	}
	size_t j = hash_str(path) & (t->cap - 1);
	while (t->slot[j].path) {
		if (!strcmp(t->slot[j].path, path)) {
			t->slot[j].by = by;
			t->slot[j].tree |= tree;
			return;
		}
		j = (j + 1) & (t->cap - 1);
	}
	/* An apply's path is dropped at track_take anyway: not kept (a
	 * million of them at an initial sync would fill the set). */
	if (by == TRACK_BY_APPLY)
		return;
	if (!(t->slot[j].path = mem_strdup(path))) {
		saturate(t);
		return;
	}
	t->slot[j].by = by;
	t->slot[j].tree = tree;
	t->n++;
}

static int join(char *out, size_t n, const char *dir, const char *name)
{
	int k = dir[0] ? snprintf(out, n, "%s/%s", dir, name) : snprintf(out, n, "%s", name);
	return k < 0 || (size_t)k >= n || (size_t)k > MANIFEST_PATH_MAX ? -ENAMETOOLONG : 0;
}

/* Record wd's path; true when wd was not watched before. */
static bool wd_set(struct track *t, int wd, const char *path)
{
	if (wd < 0)
		return false;
	if ((size_t)wd >= t->capwd) {
		size_t nc = t->capwd ? t->capwd : 256;
		while (nc <= (size_t)wd)
			nc *= 2;
		char **nv = mem_realloc(t->wd, nc * sizeof(*nv));
		if (!nv) {
			saturate(t);
			return false;
		}
		memset(nv + t->capwd, 0, (nc - t->capwd) * sizeof(*nv));
		t->wd = nv;
		t->capwd = nc;
	}
	char *p = mem_strdup(path);
	if (!p) {
		saturate(t);
		return false;
	}
	bool fresh = !t->wd[wd];
	if (fresh)
		t->nwatch++;
	mem_free(t->wd[wd]);
	t->wd[wd] = p;
	return fresh;
}

/* Watch one directory (an existing wd for the same inode is renamed);
 * true when it was not watched before. */
static bool watch_one(struct track *t, const char *rel)
{
	char abs[PATH_MAX];

	if (t->nwatch >= TRACK_WATCHES_MAX ||
	    snprintf(abs, sizeof(abs), "%s%s%s", t->root, rel[0] ? "/" : "", rel) >= (int)sizeof(abs)) {
		saturate(t);
		return false;
	}
	int wd = inotify_add_watch(t->ifd, abs, WATCH_MASK);
	if (wd < 0) {
		if (errno != ENOENT && errno != ENOTDIR)
			saturate(t); /* ENOSPC: fs.inotify.max_user_watches */
		return false;
	}
	bool fresh = wd_set(t, wd, rel);
	t->st.watches = t->nwatch;
	return fresh;
}

/* ---- walking beneath the root ---- */

struct walk {
	int (*each)(const char *path, const struct stat *st, void *ud);
	void *ud;
	bool dirs_only; /* each() sees directories only: the others are not even stat'ed */
	char path[MANIFEST_PATH_MAX + 2];
};

static int walk_dir(struct walk *w, int dfd, size_t len, int depth)
{
	DIR *d;
	struct dirent *de;
	int r = 0;

	if (depth > WALK_DEPTH_MAX || !(d = fdopendir(dfd))) {
		close(dfd);
		return 0;
	}
	while (r >= 0 && (de = readdir(d))) {
		const char *nm = de->d_name;
		struct stat st;
		if (!strcmp(nm, ".") || !strcmp(nm, "..") || reserved(nm))
			continue;
		size_t k = strlen(nm), nl = len;
		if (len + (len ? 1 : 0) + k > MANIFEST_PATH_MAX)
			continue;
		if (w->dirs_only && de->d_type != DT_DIR && de->d_type != DT_UNKNOWN)
			continue;
		if (fstatat(dirfd(d), nm, &st, AT_SYMLINK_NOFOLLOW) < 0)
			continue; /* gone meanwhile */
		if (len)
			w->path[nl++] = '/';
		memcpy(w->path + nl, nm, k + 1);
		nl += k;
		if ((w->dirs_only && !S_ISDIR(st.st_mode)) || (r = w->each(w->path, &st, w->ud)) < 0) {
		} else if (S_ISDIR(st.st_mode)) {
			int cfd = openat(dirfd(d), nm, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (cfd >= 0)
				r = walk_dir(w, cfd, nl, depth + 1);
		}
		w->path[len] = '\0';
	}
	closedir(d);
	return r;
}

/* lstat of path beneath rootfd without following a symlink on the way. */
static int lstat_beneath(int rootfd, const char *path, struct stat *st)
{
	const char *slash = strrchr(path, '/');
	char parent[MANIFEST_PATH_MAX + 1];
	int pfd, r = 0;

	if (!path[0])
		return fstat(rootfd, st) < 0 ? -errno : 0;
	if (slash) {
		memcpy(parent, path, (size_t)(slash - path));
		parent[slash - path] = '\0';
		if ((pfd = manifest_open_beneath(rootfd, parent, O_PATH | O_DIRECTORY, false)) < 0)
			return pfd;
	} else if ((pfd = dup(rootfd)) < 0) {
		return -errno;
	}
	if (fstatat(pfd, slash ? slash + 1 : path, st, AT_SYMLINK_NOFOLLOW) < 0)
		r = -errno;
	close(pfd);
	return r;
}

static int walk_from(int rootfd, const char *path, int (*each)(const char *path, const struct stat *st, void *ud),
		     void *ud, bool dirs_only)
{
	struct walk w = {.each = each, .ud = ud, .dirs_only = dirs_only};
	size_t len = strlen(path);
	struct stat st;
	int r, fd;

	if (len > MANIFEST_PATH_MAX)
		return -ENAMETOOLONG;
	if (lstat_beneath(rootfd, path, &st) < 0)
		return 0;
	memcpy(w.path, path, len + 1);
	if (len && (r = each(path, &st, ud)) < 0)
		return r;
	if (!S_ISDIR(st.st_mode))
		return 0;
	fd = len ? manifest_open_beneath(rootfd, path, O_RDONLY | O_DIRECTORY, false)
		 : openat(rootfd, ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	return fd < 0 ? 0 : walk_dir(&w, fd, len, 0);
}

int track_walk(int rootfd, const char *path, int (*each)(const char *path, const struct stat *st, void *ud), void *ud)
{
	return walk_from(rootfd, path, each, ud, false);
}

static int watch_each(const char *path, const struct stat *st, void *ud)
{
	struct track *t = ud;

	if (S_ISDIR(st->st_mode))
		watch_one(t, path);
	return t->saturated ? -ENOSPC : 0;
}

/* Watch dir and every directory beneath it. Only directories are looked
 * at (readdir's d_type): a stat of every file would cost in proportion to
 * the files, and on an overlay (a sandbox with forks) every inode it
 * instantiates must be evicted again when the sandbox stops. */
static void watch_tree(struct track *t, const char *dir)
{
	if (!dir[0])
		watch_one(t, "");
	(void)walk_from(t->rootfd, dir, watch_each, t, true);
}

/* ---- lost events (track.h "Lost events") ---- */

static int64_t coarse_now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_REALTIME_COARSE, &ts);
	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

static int64_t ctime_ns(const struct stat *st)
{
	return (int64_t)st->st_ctim.tv_sec * 1000000000 + st->st_ctim.tv_nsec;
}

static uint64_t hash_ino(uint64_t ino)
{
	ino ^= ino >> 33;
	ino *= 0xff51afd7ed558ccdull;
	return ino ^ (ino >> 33);
}

/* Must hold s->lock. */
static void applied_put(struct applied_set *s, uint64_t ino, int64_t ct)
{
	if (!ino)
		return;
	if ((s->n + 1) * 2 > s->cap) {
		size_t nc = s->cap ? s->cap * 2 : 4096;
		struct applied_id *ns;
		if (s->n >= TRACK_APPLIED_MAX || !(ns = mem_calloc(nc, sizeof(*ns))))
			return; /* not remembered: the recovery reports it, the host finds it unchanged */
		for (size_t i = 0; i < s->cap; i++) {
			if (!s->slot[i].ino)
				continue;
			size_t j = hash_ino(s->slot[i].ino) & (nc - 1);
			while (ns[j].ino)
				j = (j + 1) & (nc - 1);
			ns[j] = s->slot[i];
		}
		mem_free(s->slot);
		s->slot = ns;
		s->cap = nc;
	}
	size_t j = hash_ino(ino) & (s->cap - 1);
	while (s->slot[j].ino && s->slot[j].ino != ino)
		j = (j + 1) & (s->cap - 1);
	if (!s->slot[j].ino)
		s->n++;
	s->slot[j] = (struct applied_id){.ino = ino, .ctime_ns = ct};
}

/* Is st exactly as an apply of ours left it? */
static bool applied_has(const struct applied_set *cs, const struct stat *st)
{
	struct applied_set *s = (struct applied_set *)cs; /* the lock only */
	bool r = false;

	pthread_mutex_lock(&s->lock);
	if (s->cap) {
		size_t j = hash_ino((uint64_t)st->st_ino) & (s->cap - 1);
		while (s->slot[j].ino && s->slot[j].ino != (uint64_t)st->st_ino)
			j = (j + 1) & (s->cap - 1);
		r = s->slot[j].ino && s->slot[j].ctime_ns == ctime_ns(st);
	}
	pthread_mutex_unlock(&s->lock);
	return r;
}

static void applied_clear(struct applied_set *s)
{
	pthread_mutex_lock(&s->lock);
	mem_free(s->slot);
	s->slot = NULL;
	s->cap = s->n = 0;
	pthread_mutex_unlock(&s->lock);
}

static int rec_each(const char *path, const struct stat *st, void *ud)
{
	struct recovery *rc = ud;

	if (atomic_load(&rc->cancel))
		return -ECANCELED;
	rc->visited++;
	if (ctime_ns(st) < rc->since_ns || applied_has(rc->applied, st))
		return 0;
	if (rc->n == rc->cap) {
		size_t nc = rc->cap ? rc->cap * 2 : 256;
		void *nv = rc->n >= TRACK_DIRTY_MAX ? NULL : mem_realloc(rc->v, nc * sizeof(*rc->v));
		if (!nv)
			return -ENOMEM;
		rc->v = nv;
		rc->cap = nc;
	}
	if (!(rc->v[rc->n].path = mem_strdup(path)))
		return -ENOMEM;
	rc->v[rc->n].by = 0;
	rc->v[rc->n].tree = S_ISDIR(st->st_mode); /* a directory: may need its watch */
	rc->n++;
	return 0;
}

static void *rec_main(void *ud)
{
	struct recovery *rc = ud;
	int r = track_walk(rc->rootfd, "", rec_each, rc);

	rc->failed = r < 0;
	atomic_store(&rc->done, true);
	return NULL;
}

static void rec_free(struct recovery *rc)
{
	if (!rc)
		return;
	atomic_store(&rc->cancel, true);
	pthread_join(rc->thread, NULL);
	for (size_t i = 0; i < rc->n; i++)
		mem_free(rc->v[i].path);
	mem_free(rc->v);
	close(rc->rootfd);
	mem_free(rc);
}

/* Events were lost: everything changed since the last clean read may be unseen. */
static void lose(struct track *t)
{
	t->st.lost++;
	if (t->lost == LOST_NONE) {
		t->lost = LOST_WAITING;
		t->since_ns = t->clean_ns - t->margin_ns;
	} else if (t->lost == LOST_RECOVERING && !t->lost_again) {
		t->lost_again = true;
		t->again_ns = t->clean_ns - t->margin_ns;
	}
}

/* Start the walk (on a thread: commands and applies go on meanwhile). */
static void rec_start(struct track *t)
{
	struct recovery *rc = mem_calloc(1, sizeof(*rc));

	if (!rc || (rc->rootfd = dup(t->rootfd)) < 0) {
		mem_free(rc);
		saturate(t);
		return;
	}
	rc->since_ns = t->since_ns;
	rc->applied = &t->applied;
	atomic_init(&rc->done, false);
	atomic_init(&rc->cancel, false);
	if (pthread_create(&rc->thread, NULL, rec_main, rc) != 0) {
		close(rc->rootfd);
		mem_free(rc);
		saturate(t);
		return;
	}
	t->rec = rc;
	t->lost = LOST_RECOVERING;
	t->st.recoveries++;
}

/* The walk ended: what it found is dirty, unattributed; a directory that
 * had no watch gets one and is walked by the report. */
static void rec_merge(struct track *t)
{
	struct recovery *rc = t->rec;

	t->rec = NULL;
	pthread_join(rc->thread, NULL);
	if (rc->failed)
		saturate(t);
	t->st.recovered += rc->n;
	t->st.recovery_visited += rc->visited;
	for (size_t i = 0; i < rc->n && !t->saturated; i++) {
		bool fresh = rc->v[i].tree && watch_one(t, rc->v[i].path);
		mark(t, rc->v[i].path, 0, fresh);
	}
	for (size_t i = 0; i < rc->n; i++)
		mem_free(rc->v[i].path);
	rc->n = 0;
	close(rc->rootfd);
	mem_free(rc->v);
	mem_free(rc);
	if (t->lost_again) {
		t->lost_again = false;
		t->lost = LOST_WAITING;
		t->since_ns = t->again_ns;
	} else {
		t->lost = LOST_NONE;
		applied_clear(&t->applied);
	}
}

bool track_applied_read(struct track *t)
{
	t->last_apply_ns = coarse_now_ns();
	track_read(t, TRACK_BY_APPLY); /* an overflow its events caused is seen now */
	return t->lost != LOST_NONE;   /* else every event of it was read, as the apply's */
}

void track_applied_path(struct track *t, int rootfd, const char *path)
{
	struct stat st;

	if (lstat_beneath(rootfd, path, &st) < 0)
		return;
	pthread_mutex_lock(&t->applied.lock);
	applied_put(&t->applied, (uint64_t)st.st_ino, ctime_ns(&st));
	pthread_mutex_unlock(&t->applied.lock);
}

void track_settle(struct track *t)
{
	track_read(t, 0);
	if (t->lost == LOST_WAITING && !t->saturated)
		rec_start(t);
	if (t->rec)
		rec_merge(t); /* joins: waits for the walk */
}

/* ---- life cycle ---- */

static void watches_reset(struct track *t)
{
	for (size_t i = 0; i < t->capwd; i++) {
		if (t->wd[i])
			inotify_rm_watch(t->ifd, (int)i);
		mem_free(t->wd[i]);
		t->wd[i] = NULL;
	}
	t->nwatch = 0;
}

int track_new(int rootfd, const char *root_path, struct track **out, char *err, size_t errlen)
{
	struct track *t;

	*out = NULL;
	if (!(t = mem_calloc(1, sizeof(*t))) || !(t->root = mem_strdup(root_path))) {
		mem_free(t);
		return -ENOMEM;
	}
	t->rootfd = rootfd;
	pthread_mutex_init(&t->applied.lock, NULL);
	struct timespec res;
	t->margin_ns = clock_getres(CLOCK_REALTIME_COARSE, &res) == 0
			   ? 2 * ((int64_t)res.tv_sec * 1000000000 + res.tv_nsec)
			   : 20000000;
	t->clean_ns = coarse_now_ns(); /* the tree as it is now is every watch's start */
	const char *q = getenv("AIRLOCK_TRACK_QUEUE_TEST");
	t->queue_test = q ? strtoull(q, NULL, 10) : 0;
	if ((t->ifd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC)) < 0) {
		int r = -errno;
		errmsg_set(err, errlen, "inotify_init1: %s (guest changes cannot be tracked)", strerror(-r));
		mem_free(t->root);
		mem_free(t);
		return r;
	}
	if (dirty_grow(t) < 0) {
		track_free(t);
		return -ENOMEM;
	}
	watch_tree(t, "");
	if (t->saturated)
		errmsg_set(err, errlen,
			   "inotify: not every directory could be watched (fs.inotify.max_user_watches); "
			   "each report walks the whole copy");
	*out = t;
	return 0;
}

void track_free(struct track *t)
{
	if (!t)
		return;
	rec_free(t->rec);
	applied_clear(&t->applied);
	pthread_mutex_destroy(&t->applied.lock);
	watches_reset(t);
	mem_free(t->wd);
	for (size_t i = 0; i < t->cap; i++)
		mem_free(t->slot[i].path);
	mem_free(t->slot);
	if (t->ifd >= 0)
		close(t->ifd);
	mem_free(t->root);
	mem_free(t);
}

int track_fd(const struct track *t)
{
	return t->ifd;
}

void track_get_stats(const struct track *t, struct track_stats *st)
{
	*st = t->st;
	st->saturated_now = t->saturated || t->lost != LOST_NONE;
	st->lost_now = t->lost != LOST_NONE;
}

/* ---- events ---- */

static void on_event(struct track *t, const struct inotify_event *ev, uint32_t by)
{
	char path[MANIFEST_PATH_MAX + 2];

	t->st.events++;
	if (ev->mask & IN_Q_OVERFLOW) {
		lose(t);
		return;
	}
	if (ev->wd < 0 || (size_t)ev->wd >= t->capwd || !t->wd[ev->wd])
		return;
	if (ev->mask & IN_IGNORED) {
		mem_free(t->wd[ev->wd]);
		t->wd[ev->wd] = NULL;
		t->nwatch--;
		return;
	}
	const char *dir = t->wd[ev->wd];
	if (!ev->len) { /* the watched directory itself: attributes, deleted, moved */
		if (ev->mask & IN_ATTRIB)
			mark(t, dir, by, false);
		return;
	}
	if (reserved(ev->name) || join(path, sizeof(path), dir, ev->name) < 0)
		return;
	bool newdir = (ev->mask & IN_ISDIR) && (ev->mask & (IN_CREATE | IN_MOVED_TO));
	mark(t, path, by, newdir);
	if (newdir)
		watch_tree(t, path); /* its contents may predate the watch: the report walks it */
}

void track_read(struct track *t, uint32_t by)
{
	_Alignas(struct inotify_event) char buf[64 * 1024];
	int64_t t0 = coarse_now_ns();
	uint64_t lost0 = t->st.lost, nev = 0;

	if (t->rec && atomic_load(&t->rec->done))
		rec_merge(t);
	for (;;) {
		ssize_t n = read(t->ifd, buf, sizeof(buf));
		if (n <= 0)
			break; /* EAGAIN: the queue is empty */
		for (char *p = buf; p < buf + n;) {
			const struct inotify_event *ev = (const struct inotify_event *)p;
			if (t->queue_test && ++nev > t->queue_test) {
				lose(t); /* a test's small queue: the rest of this read is lost */
				break;
			}
			on_event(t, ev, by);
			p += sizeof(*ev) + ev->len;
		}
	}
	if (t->st.lost != lost0)
		return;
	t->clean_ns = t0; /* every event queued before t0 has been read */
	/* not while batches come: they would lose more as the walk runs */
	if (t->lost == LOST_WAITING && !t->saturated && t0 - t->last_apply_ns > TRACK_RECOVER_QUIET_NS)
		rec_start(t);
}

static int dirty_cmp(const void *a, const void *b)
{
	return manifest_path_cmp(((const struct track_dirty *)a)->path, ((const struct track_dirty *)b)->path);
}

static bool under(const char *p, const char *dir)
{
	size_t k = strlen(dir);
	return !k || (!strncmp(p, dir, k) && p[k] == '/');
}

int track_take(struct track *t, struct track_dirty **out, size_t *n)
{
	struct track_dirty *v;
	size_t k = 0;

	*out = NULL;
	*n = 0;
	if (t->lost == LOST_WAITING && !t->saturated)
		rec_start(t); /* what it finds comes with a later report: this one does not wait */
	if (t->saturated) {
		/* start afresh: drop the set, watch the tree again, walk it all
		 * once (which covers any lost events too) */
		rec_free(t->rec);
		t->rec = NULL;
		t->lost = LOST_NONE;
		t->lost_again = false;
		applied_clear(&t->applied);
		for (size_t i = 0; i < t->cap; i++) {
			mem_free(t->slot[i].path);
			t->slot[i].path = NULL;
		}
		t->n = 0;
		t->saturated = false;
		watches_reset(t);
		watch_tree(t, "");
		if (!(v = mem_calloc(1, sizeof(*v))) || !(v->path = mem_strdup(""))) {
			mem_free(v);
			t->saturated = true;
			return -ENOMEM;
		}
		v->tree = true;
		*out = v;
		*n = 1;
		return 0;
	}
	if (!t->n)
		return 0;
	if (!(v = mem_calloc(t->n, sizeof(*v))))
		return -ENOMEM;
	for (size_t i = 0; i < t->cap; i++) {
		if (!t->slot[i].path)
			continue;
		if (t->slot[i].by == TRACK_BY_APPLY)
			mem_free(t->slot[i].path);
		else
			v[k++] = t->slot[i];
		t->slot[i].path = NULL;
	}
	t->n = 0;
	qsort(v, k, sizeof(*v), dirty_cmp);
	/* drop what a tree entry before it covers (tree order: a directory's
	 * subtree follows it) */
	size_t m = 0;
	for (size_t i = 0; i < k; i++) {
		if (m && v[m - 1].tree && under(v[i].path, v[m - 1].path)) {
			mem_free(v[i].path);
			continue;
		}
		v[m++] = v[i];
	}
	*out = v;
	*n = m;
	return 0;
}

/* ---- describing one path ---- */

int track_describe(int rootfd, const char *path, const struct chunk_params *params, struct wire_chg_item *it)
{
	struct stat st;
	int r;

	it->st_mode = 0;
	it->size = 0;
	it->flags = 0;
	memset(it->hash, 0, sizeof(it->hash));
	it->target = NULL;
	if ((r = lstat_beneath(rootfd, path, &st)) < 0)
		return r == -ENOENT || r == -ENOTDIR || r == -ELOOP ? 0 : r;
	it->st_mode = (uint32_t)st.st_mode;
	if (S_ISLNK(st.st_mode)) {
		char tgt[MANIFEST_TARGET_MAX + 1];
		const char *slash = strrchr(path, '/');
		char parent[MANIFEST_PATH_MAX + 1] = "";
		if (slash) {
			memcpy(parent, path, (size_t)(slash - path));
			parent[slash - path] = '\0';
		}
		int pfd = manifest_open_beneath(rootfd, parent, O_PATH | O_DIRECTORY, false);
		ssize_t k = pfd < 0 ? -1 : readlinkat(pfd, slash ? slash + 1 : path, tgt, sizeof(tgt));
		if (pfd >= 0)
			close(pfd);
		if (k <= 0 || (size_t)k > MANIFEST_TARGET_MAX) {
			it->st_mode = 0; /* changed meanwhile, or not representable: as gone until the next report */
			return 0;
		}
		tgt[k] = '\0';
		if (!(it->target = mem_strdup(tgt)))
			return -ENOMEM;
		it->size = (uint64_t)k;
		chunk_hash(tgt, (size_t)k, it->hash);
		it->flags = WIRE_CHG_F_HASHED;
		return 0;
	}
	if (!S_ISREG(st.st_mode))
		return 0; /* a directory or a special file: its mode says it all */
	it->size = (uint64_t)st.st_size;
	if (it->size > TRACK_HASH_MAX)
		return 0;
	int fd = manifest_open_beneath(rootfd, path, O_RDONLY | O_NONBLOCK, false);
	if (fd < 0)
		return 0;
	struct stat fst;
	if (fstat(fd, &fst) == 0 && S_ISREG(fst.st_mode) && (uint64_t)fst.st_size == it->size &&
	    chunk_fd_hash(params, fd, it->size, it->hash) == 0)
		it->flags = WIRE_CHG_F_HASHED;
	else
		memset(it->hash, 0, sizeof(it->hash));
	close(fd);
	return 0;
}
