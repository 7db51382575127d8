/* SPDX-License-Identifier: Apache-2.0 */
/* withhold: content, copies, disk-shaped names and git includes
 * (withhold.h, doc/SECRETS.md). */
#include "airlock/sync/withhold.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "airlock/policy/policy.h"
#include "airlock/policy/scan.h"

#define CONFIG_MAX	(1u << 20) /* larger git config files are not read for includes */
#define INCLUDE_DEPTH	10
#define DIR_ENTRIES_MAX 65536u /* entries looked at for "a secret beside it" */

/* ---- a set of content hashes ---- */

enum { V_EMPTY, V_CLEAN, V_HIT, V_SECRET };

struct slot {
	uint8_t h[CHUNK_HASH_LEN];
	uint8_t kind;
	uint8_t rule; /* V_HIT: index into scan_rules() */
	uint32_t aux; /* V_HIT: line; V_SECRET: index into paths */
};

struct hset {
	struct slot *v;
	size_t cap, n; /* cap a power of two, n < cap / 2 */
};

static uint64_t slot_of(const uint8_t h[CHUNK_HASH_LEN])
{
	uint64_t x;
	memcpy(&x, h, sizeof(x)); /* the hash is already uniform */
	return x;
}

static struct slot *hset_find(const struct hset *s, const uint8_t h[CHUNK_HASH_LEN])
{
	if (!s->cap)
		return NULL;
	for (size_t i = slot_of(h) & (s->cap - 1);; i = (i + 1) & (s->cap - 1)) {
		if (s->v[i].kind == V_EMPTY)
			return NULL;
		if (memcmp(s->v[i].h, h, CHUNK_HASH_LEN) == 0)
			return &s->v[i];
	}
}

static int hset_grow(struct hset *s)
{
	size_t nc = s->cap ? s->cap * 2 : 1024;
	struct slot *nv = mem_calloc(nc, sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	for (size_t i = 0; i < s->cap; i++) {
		if (s->v[i].kind == V_EMPTY)
			continue;
		size_t j = slot_of(s->v[i].h) & (nc - 1);
		while (nv[j].kind != V_EMPTY)
			j = (j + 1) & (nc - 1);
		nv[j] = s->v[i];
	}
	mem_free(s->v);
	s->v = nv;
	s->cap = nc;
	return 0;
}

/* Insert or overwrite. */
static int hset_put(struct hset *s, const struct slot *e)
{
	struct slot *f = hset_find(s, e->h);
	int r;

	if (f) {
		*f = *e;
		return 0;
	}
	if ((s->n + 1) * 2 > s->cap && (r = hset_grow(s)) < 0)
		return r;
	size_t j = slot_of(e->h) & (s->cap - 1);
	while (s->v[j].kind != V_EMPTY)
		j = (j + 1) & (s->cap - 1);
	s->v[j] = *e;
	s->n++;
	return 0;
}

static void hset_clear(struct hset *s)
{
	mem_free(s->v);
	memset(s, 0, sizeof(*s));
}

/* ---- state ---- */

struct withhold {
	int rootfd;
	struct chunk_params params;
	struct hset secrets; /* contents of files the secret list withholds */
	char **paths;	     /* the first path seen with each of them */
	size_t npaths;
	struct hset verdicts; /* scan results by content */
	char **includes;      /* sorted include targets */
	size_t nincludes;
	struct withhold_stats st;
};

int withhold_new(int rootfd, const struct chunk_params *params, struct withhold **out)
{
	struct withhold *w = mem_calloc(1, sizeof(*w));
	if (!w)
		return -ENOMEM;
	w->rootfd = rootfd;
	w->params = *params;
	*out = w;
	return 0;
}

static void strv_free(char **v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		mem_free(v[i]);
	mem_free(v);
}

void withhold_free(struct withhold *w)
{
	if (!w)
		return;
	hset_clear(&w->secrets);
	hset_clear(&w->verdicts);
	strv_free(w->paths, w->npaths);
	strv_free(w->includes, w->nincludes);
	mem_free(w);
}

void withhold_includes_digest(const struct withhold *w, uint8_t out[32])
{
	crypto_generichash_state h;

	crypto_generichash_init(&h, NULL, 0, 32);
	for (size_t i = 0; i < w->nincludes; i++)
		crypto_generichash_update(&h, (const uint8_t *)w->includes[i], strlen(w->includes[i]) + 1);
	crypto_generichash_final(&h, out, 32);
}

const struct withhold_stats *withhold_stats(const struct withhold *w)
{
	return &w->st;
}

/* ---- copies of withheld files ---- */

int withhold_note_secret(struct withhold *w, const char *relpath)
{
	struct stat st;
	struct chunk *ch = NULL;
	size_t nch = 0;
	struct slot e = {.kind = V_SECRET};
	int r, fd;

	if (w->secrets.n >= WITHHOLD_HASHES_MAX)
		return 0;
	fd = manifest_open_beneath(w->rootfd, relpath, O_RDONLY | O_NONBLOCK | O_NOCTTY, false);
	if (fd < 0)
		return fd == -ENOMEM ? fd : 0;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size < (off_t)WITHHOLD_COPY_MIN ||
	    st.st_size > (off_t)WITHHOLD_COPY_MAX) {
		close(fd);
		return 0;
	}
	r = chunk_file(&w->params, chunk_read_fd, &fd, (uint64_t)st.st_size, NULL, NULL, &ch, &nch, e.h);
	close(fd);
	mem_free(ch);
	if (r < 0)
		return r == -ENOMEM ? r : 0;
	if (hset_find(&w->secrets, e.h))
		return 0;
	char **np = mem_realloc(w->paths, (w->npaths + 1) * sizeof(*np));
	if (!np)
		return -ENOMEM;
	w->paths = np;
	if (!(np[w->npaths] = mem_strdup(relpath)))
		return -ENOMEM;
	e.aux = (uint32_t)w->npaths;
	if ((r = hset_put(&w->secrets, &e)) < 0) {
		mem_free(np[w->npaths]);
		return r;
	}
	w->npaths++;
	/* a content seen clean before is not clean any more */
	struct slot *v = hset_find(&w->verdicts, e.h);
	if (v)
		v->kind = V_HIT, v->rule = UINT8_MAX;
	return 0;
}

/* ---- content ---- */

struct prefix {
	uint8_t *buf;
	size_t n, cap;
	bool partial; /* some chunks left out: do not cache the verdict */
};

static int keep_prefix(void *ud, const struct chunk *c, const uint8_t *data)
{
	struct prefix *p = ud;
	size_t k = c->len < p->cap - p->n ? c->len : p->cap - p->n;
	memcpy(p->buf + p->n, data, k);
	p->n += k;
	return 0;
}

/* Read the first bytes of e (at most SCAN_MAX, whole chunks) into p,
 * checking them against e's hash or chunk list. 0, -ESTALE, -errno. */
static int read_checked(struct withhold *w, int fd, const struct manifest_entry *e, struct prefix *p)
{
	uint8_t h[CHUNK_HASH_LEN];
	int r;

	if (e->nchunks) {
		size_t need = 0;
		for (size_t i = 0; i < e->nchunks && need < SCAN_MAX; i++)
			need += e->chunks[i].len;
		if (!(p->buf = mem_alloc(need)))
			return -ENOMEM;
		p->cap = need;
		for (size_t i = 0; i < e->nchunks && p->n < need; i++) {
			const struct chunk *c = &e->chunks[i];
			if ((r = chunk_read_fd(&fd, c->off, p->buf + p->n, c->len)) < 0)
				return r;
			chunk_hash(p->buf + p->n, c->len, h);
			if (memcmp(h, c->hash, CHUNK_HASH_LEN) != 0) {
				/* The disk moved on from the list (a write the
				 * journal's hint left out). Such a chunk is never
				 * read for sending (delta_put_chunks checks each
				 * one it reads): either the guest has its listed
				 * bytes already or the send fails. Not scanned;
				 * the verdict is not remembered. */
				p->partial = true;
				continue;
			}
			p->n += c->len;
		}
		return 0;
	}
	p->cap = e->size < SCAN_MAX ? (size_t)e->size : SCAN_MAX;
	if (!(p->buf = mem_alloc(p->cap)))
		return -ENOMEM;
	if (e->size <= w->params.whole_max) {
		if ((r = chunk_read_fd(&fd, 0, p->buf, p->cap)) < 0)
			return r;
		p->n = p->cap;
		chunk_hash(p->buf, p->n, h);
	} else {
		struct chunk *ch = NULL;
		size_t nch = 0;
		r = chunk_file(&w->params, chunk_read_fd, &fd, e->size, keep_prefix, p, &ch, &nch, h);
		mem_free(ch);
		if (r < 0)
			return r;
	}
	return memcmp(h, e->hash, CHUNK_HASH_LEN) == 0 ? 0 : -ESTALE;
}

static void hit_rule(const struct slot *v, char *rule, size_t rulelen)
{
	size_t nr;
	const struct scan_rule *rules = scan_rules(&nr);

	if (v->rule < nr)
		snprintf(rule, rulelen, "secret content: %s (%s) at line %u", rules[v->rule].id, rules[v->rule].what,
			 v->aux);
	else
		snprintf(rule, rulelen, "secret: same content as a withheld file");
}

void withhold_judge(const uint8_t *p, size_t n, struct withhold_judgement *j)
{
	struct scan_hit hit;

	memset(j, 0, sizeof(*j));
	j->scanned = n;
	if (scan_bytes(p, n < SCAN_MAX ? n : SCAN_MAX, &hit)) {
		size_t nr;
		j->hit = true;
		j->rule = (uint8_t)(hit.rule - scan_rules(&nr));
		j->line = hit.line > UINT32_MAX ? UINT32_MAX : (uint32_t)hit.line;
	}
}

/* The verdict j on the content with hash h: counted, remembered when
 * keep (a prefix of a larger file is not); 1 with rule filled when
 * withheld. */
static int judged(struct withhold *w, const uint8_t h[CHUNK_HASH_LEN], const struct withhold_judgement *j, bool keep,
		  char *rule, size_t rulelen)
{
	struct slot nv = {.kind = j->hit ? V_HIT : V_CLEAN, .rule = j->rule, .aux = j->line};

	memcpy(nv.h, h, CHUNK_HASH_LEN);
	w->st.scanned++;
	w->st.scanned_bytes += j->scanned;
	if (j->hit) {
		hit_rule(&nv, rule, rulelen);
		w->st.by_content++;
	}
	if (keep) {
		if (w->verdicts.n >= WITHHOLD_CACHE_MAX)
			hset_clear(&w->verdicts);
		(void)hset_put(&w->verdicts, &nv); /* not remembered: scanned again next time */
	}
	return j->hit ? 1 : 0;
}

/* Scan bytes p[0..n) of the content with hash h; remember the verdict
 * when keep. */
static int decide(struct withhold *w, const uint8_t h[CHUNK_HASH_LEN], const uint8_t *p, size_t n, bool keep,
		  char *rule, size_t rulelen)
{
	struct withhold_judgement j;

	withhold_judge(p, n, &j);
	return judged(w, h, &j, keep, rule, rulelen);
}

int withhold_known(const struct withhold *w, const uint8_t hash[CHUNK_HASH_LEN], char *rule, size_t rulelen)
{
	const struct slot *v = hset_find(&w->verdicts, hash);

	if (!v)
		return -ENOENT;
	if (v->kind == V_CLEAN)
		return 0;
	hit_rule(v, rule, rulelen);
	return 1;
}

int withhold_judged(struct withhold *w, const struct manifest_entry *e, const struct withhold_judgement *j, char *rule,
		    size_t rulelen)
{
	return judged(w, e->hash, j, true, rule, rulelen);
}

int withhold_sent(struct withhold *w, const struct manifest_entry *e, const uint8_t *data, size_t n, char *rule,
		  size_t rulelen)
{
	int r = withhold_known(w, e->hash, rule, rulelen);

	return r >= 0 ? r : decide(w, e->hash, data, n, true, rule, rulelen);
}

int withhold_content(struct withhold *w, const struct manifest_entry *e, bool defer, char *rule, size_t rulelen)
{
	struct slot *v;
	struct prefix p = {0};
	struct stat st;
	int r, fd;

	if (e->type != MANIFEST_FILE || e->size == 0)
		return 0;
	if (e->size >= WITHHOLD_COPY_MIN && (v = hset_find(&w->secrets, e->hash))) {
		snprintf(rule, rulelen, "secret: same content as withheld %.400s", w->paths[v->aux]);
		w->st.by_copy++;
		return 1;
	}
	if ((v = hset_find(&w->verdicts, e->hash))) {
		w->st.cache_hits++;
		if (v->kind == V_CLEAN)
			return 0;
		hit_rule(v, rule, rulelen);
		w->st.by_content++;
		return 1;
	}
	if (defer && e->size <= w->params.whole_max)
		return 0; /* scanned as it is sent: withhold_sent */
	fd = manifest_open_beneath(w->rootfd, e->path, O_RDONLY | O_NONBLOCK | O_NOCTTY, false);
	if (fd < 0)
		return fd == -ENOMEM ? fd : -ESTALE;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != e->size) {
		r = -ESTALE;
		goto out;
	}
	if ((r = read_checked(w, fd, e, &p)) < 0)
		goto out;
	r = decide(w, e->hash, p.buf, p.n, !p.partial, rule, rulelen);
out:
	mem_free(p.buf);
	close(fd);
	return r;
}

/* ---- names that need the disk ---- */

/* sed -i's "sedXXXXXX", GLib's ".goutputstream-XXXXXX", vim's "4913" */
static bool tool_temporary(const char *bn)
{
	size_t n = strlen(bn);
	if (n == 9 && memcmp(bn, "sed", 3) == 0) {
		for (size_t i = 3; i < 9; i++)
			if (!((bn[i] >= 'a' && bn[i] <= 'z') || (bn[i] >= 'A' && bn[i] <= 'Z') ||
			      (bn[i] >= '0' && bn[i] <= '9')))
				return false;
		return true;
	}
	return strncmp(bn, ".goutputstream-", 15) == 0 || strcmp(bn, "4913") == 0;
}

/* The directory dir (relative, "" for the root) opened, or -errno. */
static int open_dir(struct withhold *w, const char *dir, int flags)
{
	if (!*dir)
		return openat(w->rootfd, ".", flags | O_DIRECTORY | O_CLOEXEC);
	return manifest_open_beneath(w->rootfd, dir, flags | O_DIRECTORY, false);
}

/* A non-directory in dir that the secret list withholds: its name into
 * out, true. */
static bool secret_beside(struct withhold *w, const char *dir, const char *self, char *out, size_t outlen)
{
	int fd = open_dir(w, dir, O_RDONLY);
	DIR *d;
	struct dirent *de;
	char rel[POLICY_PATH_MAX + 1];
	unsigned seen = 0;
	bool found = false;

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return false;
	}
	while (!found && seen++ < DIR_ENTRIES_MAX && (de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, "..") || !strcmp(de->d_name, self))
			continue;
		if (de->d_type == DT_DIR)
			continue;
		int n = snprintf(rel, sizeof(rel), "%s%s%s", dir, *dir ? "/" : "", de->d_name);
		if (n < 0 || (size_t)n >= sizeof(rel))
			continue;
		if (policy_secret_match(rel, 0)) {
			snprintf(out, outlen, "%s", de->d_name);
			found = true;
		}
	}
	closedir(d);
	return found;
}

/* HEAD, objects/ and refs/ beside it: a bare repository's config */
static bool bare_repo(struct withhold *w, const char *dir)
{
	int fd = open_dir(w, dir, O_PATH);
	struct stat a, b, c;
	bool yes;

	if (fd < 0)
		return false;
	yes = fstatat(fd, "HEAD", &a, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(a.st_mode) &&
	      fstatat(fd, "objects", &b, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(b.st_mode) &&
	      fstatat(fd, "refs", &c, AT_SYMLINK_NOFOLLOW) == 0 && S_ISDIR(c.st_mode);
	close(fd);
	return yes;
}

static int str_cmp(const void *a, const void *b)
{
	return strcmp(*(char *const *)a, *(char *const *)b);
}

int withhold_path(struct withhold *w, const char *relpath, char *rule, size_t rulelen)
{
	char dir[POLICY_PATH_MAX + 1], name[256];
	const char *sl = strrchr(relpath, '/'), *bn = sl ? sl + 1 : relpath;
	size_t dl = sl ? (size_t)(sl - relpath) : 0;

	if (w->nincludes && bsearch(&relpath, w->includes, w->nincludes, sizeof(char *), str_cmp)) {
		snprintf(rule, rulelen, "secret: included from .git/config");
		return 1;
	}
	if (dl > POLICY_PATH_MAX)
		return 0;
	memcpy(dir, relpath, dl);
	dir[dl] = '\0';
	if (!strcmp(bn, "config") && bare_repo(w, dir)) {
		snprintf(rule, rulelen, "secret: bare git repository config (HEAD, objects/, refs/ beside it)");
		return 1;
	}
	if (tool_temporary(bn) && secret_beside(w, dir, bn, name, sizeof(name))) {
		snprintf(rule, rulelen, "secret: temporary file beside a secret (%.200s)", name);
		return 1;
	}
	return 0;
}

/* ---- git include targets ---- */

struct incl {
	char **v;
	size_t n;
	char root[PATH_MAX];
	const char *home;
};

/* Normalize dir + "/" + rel (both workspace-relative) into out; false
 * when it leaves the workspace or is empty. */
static bool join_norm(const char *dir, const char *rel, char *out, size_t outlen)
{
	char tmp[2 * PATH_MAX + 2];
	size_t o = 0;

	snprintf(tmp, sizeof(tmp), "%s%s%s", dir, *dir ? "/" : "", rel);
	out[0] = '\0';
	for (char *save = NULL, *c = strtok_r(tmp, "/", &save); c; c = strtok_r(NULL, "/", &save)) {
		if (!strcmp(c, "."))
			continue;
		if (!strcmp(c, "..")) {
			if (o == 0)
				return false;
			while (o > 0 && out[o - 1] != '/')
				o--;
			o = o > 0 ? o - 1 : 0;
			out[o] = '\0';
			continue;
		}
		size_t cl = strlen(c);
		if (o + (o ? 1 : 0) + cl + 1 > outlen)
			return false;
		if (o)
			out[o++] = '/';
		memcpy(out + o, c, cl + 1);
		o += cl;
	}
	return o > 0;
}

/* The workspace-relative target of include path value v written in the
 * config at cfgdir, or false. */
static bool resolve(const struct incl *in, const char *cfgdir, const char *v, char *out, size_t outlen)
{
	char abs[2 * PATH_MAX];
	size_t rl = strlen(in->root);

	if (v[0] == '~' && v[1] == '/') {
		if (!in->home)
			return false;
		snprintf(abs, sizeof(abs), "%s/%s", in->home, v + 2);
		v = abs;
	}
	if (v[0] == '/') {
		if (strncmp(v, in->root, rl) != 0 || v[rl] != '/')
			return false; /* outside the workspace: never synced */
		return join_norm("", v + rl + 1, out, outlen);
	}
	return join_norm(cfgdir, v, out, outlen);
}

static char *trim(char *s)
{
	while (*s == ' ' || *s == '\t')
		s++;
	size_t n = strlen(s);
	while (n && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r'))
		s[--n] = '\0';
	return s;
}

/* A config value: quotes removed, a comment outside them cut. */
static char *value(char *v)
{
	char *o = v, *r = v;
	bool q = false;
	for (; *r; r++) {
		if (*r == '"') {
			q = !q;
			continue;
		}
		if (!q && (*r == '#' || *r == ';'))
			break;
		if (*r == '\\' && r[1]) {
			r++;
			*o++ = *r == 't' ? '\t' : *r == 'n' ? '\n' : *r;
			continue;
		}
		*o++ = *r;
	}
	*o = '\0';
	return trim(v);
}

static int read_config(struct withhold *w, struct incl *in, const char *rel, int depth);

static int add_include(struct withhold *w, struct incl *in, const char *cfgdir, const char *v, int depth)
{
	char t[PATH_MAX];
	if (in->n >= WITHHOLD_INCLUDES_MAX || !resolve(in, cfgdir, v, t, sizeof(t)))
		return 0;
	for (size_t i = 0; i < in->n; i++)
		if (!strcmp(in->v[i], t))
			return 0;
	char **nv = mem_realloc(in->v, (in->n + 1) * sizeof(*nv));
	if (!nv)
		return -ENOMEM;
	in->v = nv;
	if (!(nv[in->n] = mem_strdup(t)))
		return -ENOMEM;
	in->n++;
	return read_config(w, in, t, depth + 1);
}

static int read_config(struct withhold *w, struct incl *in, const char *rel, int depth)
{
	char cfgdir[PATH_MAX], *text;
	const char *sl = strrchr(rel, '/');
	struct stat st;
	bool incl_section = false;
	int r = 0, fd;

	if (depth > INCLUDE_DEPTH)
		return 0;
	snprintf(cfgdir, sizeof(cfgdir), "%.*s", sl ? (int)(sl - rel) : 0, rel);
	if ((fd = manifest_open_beneath(w->rootfd, rel, O_RDONLY | O_NONBLOCK | O_NOCTTY, false)) < 0)
		return fd == -ENOMEM ? fd : 0;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size > CONFIG_MAX) {
		close(fd);
		return 0;
	}
	if (!(text = mem_alloc((size_t)st.st_size + 1))) {
		close(fd);
		return -ENOMEM;
	}
	ssize_t got = pread(fd, text, (size_t)st.st_size, 0);
	close(fd);
	text[got > 0 ? got : 0] = '\0';
	for (char *save = NULL, *line = strtok_r(text, "\n", &save); line && r == 0;
	     line = strtok_r(NULL, "\n", &save)) {
		char *l = trim(line);
		if (*l == '[') {
			char *end = strchr(l, ']');
			if (!end)
				continue;
			*end = '\0';
			char *name = trim(l + 1);
			size_t nl = strcspn(name, " \t\"");
			incl_section = (nl == 7 && !strncasecmp(name, "include", 7)) ||
				       (nl == 9 && !strncasecmp(name, "includeif", 9));
			l = trim(end + 1); /* "[include] path = x" on one line */
		}
		if (!incl_section || !*l || *l == '#' || *l == ';')
			continue;
		char *eq = strchr(l, '=');
		if (!eq)
			continue;
		*eq = '\0';
		if (strcasecmp(trim(l), "path") != 0)
			continue;
		char *v = value(eq + 1);
		if (*v)
			r = add_include(w, in, cfgdir, v, depth);
	}
	mem_free(text);
	return r;
}

int withhold_git_includes(struct withhold *w)
{
	struct incl in = {.home = getenv("HOME")};
	char fdpath[64];
	int r, changed;

	snprintf(fdpath, sizeof(fdpath), "/proc/self/fd/%d", w->rootfd);
	ssize_t k = readlink(fdpath, in.root, sizeof(in.root) - 1);
	in.root[k > 0 ? k : 0] = '\0';
	if (k <= 0)
		snprintf(in.root, sizeof(in.root), "/nonexistent"); /* absolute targets never match */
	if ((r = read_config(w, &in, ".git/config", 0)) < 0) {
		strv_free(in.v, in.n);
		return r;
	}
	if (in.n)
		qsort(in.v, in.n, sizeof(*in.v), str_cmp);
	changed = in.n != w->nincludes;
	for (size_t i = 0; !changed && i < in.n; i++)
		changed = strcmp(in.v[i], w->includes[i]) != 0;
	strv_free(w->includes, w->nincludes);
	w->includes = in.v;
	w->nincludes = in.n;
	return changed;
}
