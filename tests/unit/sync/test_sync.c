/* SPDX-License-Identifier: Apache-2.0 */
/* sync: the host's engine. The generated .git/config, and pushes (whole,
 * targeted, ranged, too large) against the guest's engine over a real
 * session. The guest's state alone is tested in guest/test_syncg.c,
 * message reassembly (syncmsg.h) in content/test_syncmsg.c. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "testutil.h"

#include "airlock/content/manifest.h"
#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/noise.h"
#include "airlock/core/wire.h"
#include "airlock/guest/syncg.h"
#include "airlock/guest/track.h"
#include "airlock/policy/policy.h"
#include "airlock/sync/sync.h"

static char dir[64];
static uint8_t hpk[32], hsk[64], gpub[32];

static int setup(void **state)
{
	(void)state;
	tu_tmpdir(dir, sizeof(dir), "test-sync");
	crypto_sign_keypair(hpk, hsk);
	randombytes_buf(gpub, sizeof(gpub));
	return 0;
}

static int teardown(void **state)
{
	(void)state;
	tu_rm_rf(dir);
	return 0;
}

static void test_git_config(void **state)
{
	(void)state;
	char p[160];
	struct buf out;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY);
	static const char cfg[] =
	    "[core]\n\trepositoryformatversion = 1\n\tfilemode = true\n\tbare = true\n"
	    "\thooksPath = /tmp/evil\n\tfsmonitor = /tmp/evil\n\tsshCommand = ssh -i key\n"
	    "[remote \"origin\"]\n\turl = https://u:TOKEN@example.com/r.git\n"
	    "[credential]\n\thelper = store\n[include]\n\tpath = /etc/x\n"
	    "[extensions]\n\tobjectFormat = sha256\n[url \"https://TOKEN@x/\"]\n\tinsteadOf = https://x/\n"
	    "[core]\n\teditor = \"vim\"\n\tlogAllRefUpdates = true # comment\n";
	assert_true(dfd >= 0);
	snprintf(p, sizeof(p), "%s/.git", dir);
	mkdir(p, 0755);
	snprintf(p, sizeof(p), "%s/.git/config", dir);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(cfg, f);
	fclose(f);
	buf_init(&out, 1 << 20);
	assert_int_equal(sync_git_config(dfd, ".git/config", &out), 0);
	assert_int_equal(buf_put_u8(&out, 0), 0);
	const char *g = (const char *)buf_ptr(&out);
	assert_non_null(strstr(g, "repositoryformatversion = 1"));
	assert_non_null(strstr(g, "bare = false"));
	assert_non_null(strstr(g, "objectformat = sha256"));
	assert_non_null(strstr(g, "logallrefupdates = true"));
	assert_null(strstr(g, "TOKEN"));
	assert_null(strstr(g, "url"));
	assert_null(strstr(g, "evil"));
	assert_null(strstr(g, "ssh"));
	assert_null(strstr(g, "helper"));
	assert_null(strstr(g, "vim"));
	assert_null(strstr(g, "bare = true"));
	buf_clear(&out);
	close(dfd);
}

/* ---- the host engine against a real guest session over a chan pair ---- */

struct eng {
	struct tu_chans c;
	struct loop *l;	      /* c.l */
	struct chan *hc, *gc; /* c.h, c.g */
	struct sync *s;
	struct syncg *g;
	struct syncg_session *ss;
	bool hready, gready, done;
	int err;
	char why[512];
	struct policy *pol;
	int dfd;
};

static void h_ready(struct chan *c, void *ud)
{
	(void)c;
	((struct eng *)ud)->hready = true;
}
static void g_ready(struct chan *c, void *ud)
{
	(void)c;
	((struct eng *)ud)->gready = true;
}
/* The guest's next SYNC_ACK, rewritten to report op tamper_op (at path
 * tamper_path) as failed with tamper_err: a guest that could not apply
 * it, or one that lies. */
static bool tamper;
static uint32_t tamper_op;
static int tamper_err;
static const char *tamper_path;

static void tamper_ack(struct eng *e, uint32_t stream, const uint8_t *p, size_t n)
{
	struct wire_sync_ack m;
	struct buf in, out;

	buf_view(&in, p + 1, n - 1); /* after the fragment's "more" byte */
	assert_int_equal(wire_sync_ack_decode(&in, &m), 0);
	struct wire_sync_fail f = {.op = tamper_op,
				   .code = (uint32_t)tamper_err,
				   .path = (char *)tamper_path,
				   .msg = "PUT: renaming into place: Permission denied"};
	struct wire_sync_ack t = m;
	t.fail_flags = 0;
	t.nfail = 1;
	t.fail = &f;
	buf_init(&out, 4096);
	assert_int_equal(buf_put_u8(&out, 0), 0);
	assert_int_equal(wire_sync_ack_encode(&out, &t), 0);
	tamper = false;
	sync_on_frame(e->s, WIRE_SYNC_ACK, stream, buf_ptr(&out), buf_len(&out));
	buf_clear(&out);
	wire_sync_ack_clear(&m);
}

static void h_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	(void)c;
	struct eng *e = ud;
	if (e->s && tamper && type == WIRE_SYNC_ACK && n > 1 && p[0] == 0)
		tamper_ack(e, stream, p, n);
	else if (e->s)
		sync_on_frame(e->s, type, stream, p, n);
}
static void g_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct eng *e = ud;
	char err[256];
	if (!e->ss)
		assert_int_equal(syncg_session_new(e->g, c, hpk, &e->ss), 0);
	assert_int_equal(syncg_session_frame(e->ss, type, stream, p, n, err, sizeof(err)), 0);
}
static void h_writable(struct chan *c, void *ud)
{
	(void)c;
	struct eng *e = ud;
	if (e->s)
		sync_on_writable(e->s);
}
static void g_writable(struct chan *c, void *ud)
{
	(void)c;
	struct eng *e = ud;
	if (e->ss)
		syncg_session_writable(e->ss);
}
static const struct chan_ops h_ops = {h_ready, h_frame, h_writable, tu_chan_close_fails};
static const struct chan_ops g_ops = {g_ready, g_frame, g_writable, tu_chan_close_fails};

static void e_done(int err, const char *why, void *ud)
{
	struct eng *e = ud;
	e->done = true;
	e->err = err;
	snprintf(e->why, sizeof(e->why), "%s", why ? why : "");
}
/* Called once when the next operation starts sending (its changes
 * decided from the scan, nothing read for the batches yet). */
static void (*eng_on_send)(void);
static void e_progress(const struct sync_progress *p, void *ud)
{
	(void)ud;
	void (*fn)(void) = eng_on_send;
	if (fn && !strcmp(p->phase, "send")) {
		eng_on_send = NULL;
		fn();
	}
}
static const struct sync_ops e_ops = {.on_progress = e_progress, .on_done = e_done};

static void e_check(struct loop *l, void *ud)
{
	struct eng *e = ud;
	if (e->done || (e->hready && e->gready && !e->s))
		loop_stop(l);
}
static void e_timeout(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}
static uint64_t eng_wait_ms = 10000; /* how long e_run waits for an operation */

static void e_run(struct eng *e)
{
	uint64_t id = loop_add_timer(e->l, eng_wait_ms, e_timeout, e);
	loop_set_before_sleep(e->l, e_check, e);
	assert_int_equal(loop_run(e->l), 0);
	loop_set_before_sleep(e->l, NULL, NULL);
	loop_del_timer(e->l, id);
}

/* sync_cfg.loop and batch_budget_ns of the next eng_start */
static bool eng_loop;
static uint64_t eng_budget_ns;
static const char *eng_state_dir; /* sync_cfg.state_dir: the host's hash cache */

/* sync_cfg.prep_min: AIRLOCK_SYNC_PREP_MIN (the suite runs once with 1:
 * every operation's small files on the worker threads; test sync_prep). */
static uint32_t eng_prep_min(void)
{
	const char *v = getenv("AIRLOCK_SYNC_PREP_MIN");
	return v ? (uint32_t)strtoul(v, NULL, 10) : 0;
}

/* A host engine on `host` and a guest session on `guest`, over a chan pair
 * on one loop, handshake done; max_batch as in sync_cfg. */
static void eng_start(struct eng *e, const char *host, const char *guest, size_t max_batch)
{
	char err[256];

	tu_chans_new(&e->c, 0, &h_ops, e, &g_ops, e);
	e->l = e->c.l;
	e->hc = e->c.h;
	e->gc = e->c.g;
	chan_set_default_stream_flags(e->gc, CHAN_STREAM_AUTO); /* as the agent does */
	assert_true(e->hready && e->gready);
	assert_int_equal(syncg_open(guest, NULL, NULL, gpub, &e->g, err, sizeof(err)), 0);
	assert_int_equal(policy_default(&e->pol), 0);
	assert_true((e->dfd = open(host, O_RDONLY | O_DIRECTORY)) >= 0);
	struct sync_cfg cfg = {.dirfd = e->dfd,
			       .policy = e->pol,
			       .sign_sk = hsk,
			       .sign_pk = hpk,
			       .guest_pub = gpub,
			       .ops = &e_ops,
			       .ud = e,
			       .max_batch = max_batch,
			       .loop = eng_loop ? e->l : NULL,
			       .state_dir = eng_state_dir,
			       .batch_budget_ns = eng_budget_ns,
			       .prep_min = eng_prep_min()};
	assert_int_equal(sync_new(e->hc, &cfg, &e->s), 0);
}

static void eng_stop(struct eng *e)
{
	sync_free(e->s);
	syncg_session_free(e->ss);
	syncg_free(e->g);
	tu_chans_free(&e->c);
	policy_free(e->pol);
	close(e->dfd);
}

static void put(const char *root, const char *rel, const char *text)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	FILE *f = fopen(p, "w");
	assert_non_null(f);
	fputs(text, f);
	fclose(f);
}
static bool has(const char *root, const char *rel, const char *text)
{
	char p[512], b[256] = "";
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	FILE *f = fopen(p, "r");
	if (!f)
		return false;
	size_t n = fread(b, 1, sizeof(b) - 1, f);
	fclose(f);
	b[n] = '\0';
	return !strcmp(b, text);
}
static bool exists(const char *root, const char *rel)
{
	char p[512];
	struct stat st;
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	return lstat(p, &st) == 0;
}

static void e_push(struct eng *e, const char *const *paths, size_t n)
{
	e->done = false;
	assert_int_equal(sync_push_paths(e->s, paths, n), 0);
	if (!e->done)
		e_run(e);
	assert_true(e->done);
	if (e->err)
		fail_msg("push: %s", e->why);
}

/* Targeted pushes: each step names only its dirty paths, and the guest
 * follows; the stats show the push looked at those paths only. */
static void test_push_targeted(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], p[256];

	snprintf(host, sizeof(host), "%s/eh", dir);
	snprintf(guest, sizeof(guest), "%s/eg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	for (int i = 0; i < 20; i++) {
		snprintf(p, sizeof(p), "f%d.txt", i);
		put(host, p, "seed\n");
	}
	snprintf(p, sizeof(p), "%s/src", host);
	assert_int_equal(mkdir(p, 0755), 0);
	put(host, "src/main.c", "int main;\n");

	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);
	assert_true(has(guest, "src/main.c", "int main;\n"));

	/* edit one file: one anchor, one lstat, one file read, no walk */
	put(host, "f3.txt", "edited\n");
	const char *p1[] = {"f3.txt"};
	e_push(&e, p1, 1);
	const struct sync_push_stats *ps = sync_get_push_stats(e.s);
	assert_false(ps->full);
	assert_int_equal(ps->anchors, 1);
	assert_int_equal(ps->lstats, 1);
	assert_int_equal(ps->hashed, 1);
	assert_int_equal(ps->walked, 0);
	assert_true(has(guest, "f3.txt", "edited\n"));

	/* create in a new directory: only the file is named; the new
	 * directory becomes the anchor and is walked */
	snprintf(p, sizeof(p), "%s/new", host);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/new/sub", host);
	assert_int_equal(mkdir(p, 0755), 0);
	put(host, "new/sub/x", "x\n");
	const char *p2[] = {"new/sub/x"};
	e_push(&e, p2, 1);
	assert_false(sync_get_push_stats(e.s)->full);
	assert_int_equal(sync_get_push_stats(e.s)->walked, 1);
	assert_true(has(guest, "new/sub/x", "x\n"));

	/* rename the directory: both ends dirty */
	char a[256], b[256];
	snprintf(a, sizeof(a), "%s/new", host);
	snprintf(b, sizeof(b), "%s/moved", host);
	assert_int_equal(rename(a, b), 0);
	const char *p3[] = {"new", "moved"};
	e_push(&e, p3, 2);
	assert_false(exists(guest, "new"));
	assert_true(has(guest, "moved/sub/x", "x\n"));

	/* symlink retarget, chmod, secret rename */
	snprintf(a, sizeof(a), "%s/ln", host);
	assert_int_equal(symlink("one", a), 0);
	const char *p4[] = {"ln"};
	e_push(&e, p4, 1);
	assert_int_equal(unlink(a), 0);
	assert_int_equal(symlink("two", a), 0);
	snprintf(b, sizeof(b), "%s/f4.txt", host);
	assert_int_equal(chmod(b, 0600), 0);
	const char *p5[] = {"ln", "f4.txt"};
	e_push(&e, p5, 2);
	char t[16] = "";
	snprintf(a, sizeof(a), "%s/ln", guest);
	assert_int_equal(readlink(a, t, sizeof(t) - 1), 3);
	assert_string_equal(t, "two");
	struct stat st;
	snprintf(b, sizeof(b), "%s/f4.txt", guest);
	assert_int_equal(stat(b, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	snprintf(a, sizeof(a), "%s/f5.txt", host);
	snprintf(b, sizeof(b), "%s/.env.local", host);
	assert_int_equal(rename(a, b), 0);
	const char *p6[] = {"f5.txt", ".env.local"};
	e_push(&e, p6, 2);
	assert_false(exists(guest, "f5.txt"));
	assert_false(exists(guest, ".env.local"));
	size_t nw;
	uint64_t tw;
	const struct sync_record *w = sync_withheld(e.s, &nw, &tw);
	bool seen = false;
	for (size_t i = 0; i < nw; i++)
		seen |= !strcmp(w[i].path, ".env.local");
	assert_true(seen);

	/* a large (chunked) random file, then moved: REFs to the old path, not its bytes again */
	{
		static uint8_t big[400000];
		randombytes_buf(big, sizeof(big));
		snprintf(a, sizeof(a), "%s/big.bin", host);
		FILE *f = fopen(a, "w");
		assert_non_null(f);
		assert_int_equal(fwrite(big, 1, sizeof(big), f), sizeof(big));
		fclose(f);
		const char *pb[] = {"big.bin"};
		e_push(&e, pb, 1);
		snprintf(b, sizeof(b), "%s/src/big-moved.bin", host);
		assert_int_equal(rename(a, b), 0);
		uint64_t before = sync_get_stats(e.s)->batch_bytes;
		const char *pm[] = {"big.bin", "src/big-moved.bin"};
		e_push(&e, pm, 2);
		assert_true(sync_get_stats(e.s)->batch_bytes - before < 4096);
		assert_false(exists(guest, "big.bin"));
		snprintf(a, sizeof(a), "%s/src/big-moved.bin", guest);
		f = fopen(a, "r");
		assert_non_null(f);
		static uint8_t got[sizeof(big) + 1];
		assert_int_equal(fread(got, 1, sizeof(got), f), sizeof(big));
		fclose(f);
		assert_memory_equal(got, big, sizeof(big));
	}

	/* delete a tree; the root as a dirty path falls back to a full scan */
	snprintf(a, sizeof(a), "%s/moved/sub/x", host);
	assert_int_equal(unlink(a), 0);
	snprintf(a, sizeof(a), "%s/moved/sub", host);
	assert_int_equal(rmdir(a), 0);
	snprintf(a, sizeof(a), "%s/moved", host);
	assert_int_equal(rmdir(a), 0);
	const char *p7[] = {"moved/sub/x", "moved/sub", "moved"};
	e_push(&e, p7, 3);
	assert_false(exists(guest, "moved"));
	const char *p8[] = {""};
	e_push(&e, p8, 1);
	assert_true(sync_get_push_stats(e.s)->full);

	eng_stop(&e);
}

/* A write through one name of a hard link changes the others, which the
 * journal does not name (each is an independent file in the guest). A
 * push whose anchor is the file falls back to a full scan; so must one
 * that reaches the file by walking a directory anchor above it (a create
 * or chmod in that directory made it dirty too): it pushed the written
 * name only and left the other name stale in the guest, with nothing
 * pending (faults_e2e: a pool file older in the guest after kill -9 of
 * the daemon; fails on the old code). */
static void test_push_hardlink_dir(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], a[256], b[256];

	snprintf(host, sizeof(host), "%s/lh", dir);
	snprintf(guest, sizeof(guest), "%s/lg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	snprintf(a, sizeof(a), "%s/d", host);
	assert_int_equal(mkdir(a, 0755), 0);
	put(host, "d/two", "before\n");
	snprintf(a, sizeof(a), "%s/d/two", host);
	snprintf(b, sizeof(b), "%s/one", host);
	assert_int_equal(link(a, b), 0);
	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);
	assert_true(has(guest, "one", "before\n") && has(guest, "d/two", "before\n"));

	/* the file anchored itself: a full scan */
	put(host, "d/two", "first\n");
	const char *p1[] = {"d/two"};
	e_push(&e, p1, 1);
	assert_true(sync_get_push_stats(e.s)->full);
	assert_true(has(guest, "one", "first\n") && has(guest, "d/two", "first\n"));

	/* reached through its directory (a new file there): a full scan too */
	put(host, "d/two", "second\n");
	put(host, "d/new", "new\n");
	const char *p2[] = {"d", "d/new", "d/two"};
	e_push(&e, p2, 3);
	assert_true(has(guest, "d/new", "new\n") && has(guest, "d/two", "second\n"));
	assert_true(has(guest, "one", "second\n"));
	assert_true(sync_get_push_stats(e.s)->full);
	eng_stop(&e);
}

static void e_push_hinted(struct eng *e, const char *const *paths, const struct sync_hint *h, size_t n)
{
	e->done = false;
	assert_int_equal(sync_push_hinted(e->s, paths, h, n), 0);
	if (!e->done)
		e_run(e);
	assert_true(e->done);
	if (e->err)
		fail_msg("push: %s", e->why);
}

/* Whole contents of root/rel (malloc'd), *n its size; NULL when absent. */
static uint8_t *slurp(const char *root, const char *rel, size_t *n)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	return (uint8_t *)tu_read_file(AT_FDCWD, p, n);
}

static bool same_file(const char *a, const char *b, const char *rel)
{
	size_t na = 0, nb = 0;
	uint8_t *x = slurp(a, rel, &na), *y = slurp(b, rel, &nb);
	bool same = x && y && na == nb && !memcmp(x, y, na);
	free(x);
	free(y);
	return same;
}

/* Large-file edits pushed with the journal's byte ranges: only the chunks
 * around each edit are read, and the guest's copy is byte-identical after
 * every step, including when a hint leaves out a write (a later hint
 * covers it) and for size changes. */
static void test_push_ranged(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], p[256];
	const size_t big = 8u << 20;

	snprintf(host, sizeof(host), "%s/rh", dir);
	snprintf(guest, sizeof(guest), "%s/rg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	uint8_t *d = malloc(big);
	assert_non_null(d);
	uint64_t x = 0x9e3779b97f4a7c15ull;
	for (size_t i = 0; i < big; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		d[i] = (uint8_t)x;
	}
	snprintf(p, sizeof(p), "%s/big.bin", host);
	int bfd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
	assert_true(bfd >= 0);
	assert_int_equal(write(bfd, d, big), (ssize_t)big);

	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);
	assert_true(same_file(host, guest, "big.bin"));

	const char *paths[] = {"big.bin"};
	const struct sync_push_stats *ps = sync_get_push_stats(e.s);
	uint8_t buf[4096];

	/* 1. 100 bytes overwritten in the middle: a few chunks read, not 8 MiB */
	randombytes_buf(buf, 100);
	assert_int_equal(pwrite(bfd, buf, 100, 4000000), 100);
	struct sync_hint h = {.lo = 4000000, .hi = 4000100, .valid = true};
	e_push_hinted(&e, paths, &h, 1);
	assert_int_equal(ps->ranged, 1);
	assert_true(ps->hashed_bytes > 0 && ps->hashed_bytes <= 1u << 20);
	assert_true(ps->put_read <= 1u << 20);
	assert_true(same_file(host, guest, "big.bin"));

	/* 2. a hint that leaves out a write: the guest gets a consistent file
	 * (every chunk checked), and the next hint, covering it, converges */
	randombytes_buf(buf, 64);
	assert_int_equal(pwrite(bfd, buf, 64, 1000000), 64);
	assert_int_equal(pwrite(bfd, buf, 64, 6000000), 64);
	h = (struct sync_hint){.lo = 6000000, .hi = 6000064, .valid = true};
	e_push_hinted(&e, paths, &h, 1);
	h = (struct sync_hint){.lo = 1000000, .hi = 1000064, .valid = true};
	e_push_hinted(&e, paths, &h, 1);
	assert_true(same_file(host, guest, "big.bin"));

	/* 3. random edits, appends and truncates, each with an exact hint */
	uint64_t size = big;
	for (int i = 0; i < 60; i++) {
		x ^= x << 13, x ^= x >> 7, x ^= x << 17;
		unsigned kind = (unsigned)(x % 4);
		uint64_t off = (x >> 8) % size, len = 1 + (x >> 40) % sizeof(buf);
		h = (struct sync_hint){.valid = true, .lo = UINT64_MAX, .hi = 0};
		randombytes_buf(buf, sizeof(buf));
		if (kind <= 1) { /* overwrite, possibly past the end */
			assert_int_equal(pwrite(bfd, buf, len, (off_t)off), (ssize_t)len);
			h.lo = off, h.hi = off + len;
			if (off + len > size)
				size = off + len;
		} else if (kind == 2) { /* append */
			assert_int_equal(pwrite(bfd, buf, len, (off_t)size), (ssize_t)len);
			h.lo = size, h.hi = size + len;
			size += len;
		} else { /* truncate shorter or longer */
			uint64_t ns = off + (x >> 50) % 300000;
			assert_int_equal(ftruncate(bfd, (off_t)ns), 0);
			h.lo = ns < size ? ns : size, h.resized = true;
			size = ns;
		}
		e_push_hinted(&e, paths, &h, 1);
		if (size > 128 * 1024)
			assert_int_equal(ps->ranged, 1);
		if (!same_file(host, guest, "big.bin"))
			fail_msg("step %d (kind %u, off %llu, len %llu): guest differs", i, kind,
				 (unsigned long long)off, (unsigned long long)len);
	}

	/* 4. attributes only: nothing read */
	assert_int_equal(fchmod(bfd, 0600), 0);
	h = (struct sync_hint){.valid = true, .lo = UINT64_MAX, .hi = 0};
	e_push_hinted(&e, paths, &h, 1);
	assert_int_equal(ps->hashed_bytes, 0);
	struct stat gs;
	snprintf(p, sizeof(p), "%s/big.bin", guest);
	assert_int_equal(stat(p, &gs), 0);
	assert_int_equal(gs.st_mode & 0777, 0600);

	/* 5. a reconcile agrees with what the pushes built */
	uint64_t batches = sync_get_stats(e.s)->batches;
	e.done = false;
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_int_equal(e.err, 0);
	assert_int_equal(sync_get_stats(e.s)->batches, batches); /* nothing to send */
	assert_true(same_file(host, guest, "big.bin"));

	close(bfd);
	free(d);
	eng_stop(&e);
}

/* A file whose PUT alone exceeds a batch is not sent: it is listed as
 * skipped with the reason, everything else syncs, and once it shrinks it
 * is sent. */
static void test_too_large(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], p[256];

	snprintf(host, sizeof(host), "%s/th", dir);
	snprintf(guest, sizeof(guest), "%s/tg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	put(host, "small.txt", "small\n");
	uint8_t *d = malloc(300000);
	assert_non_null(d);
	randombytes_buf(d, 300000);
	snprintf(p, sizeof(p), "%s/huge.bin", host);
	int bfd = open(p, O_RDWR | O_CREAT | O_TRUNC, 0644);
	assert_true(bfd >= 0);
	assert_int_equal(write(bfd, d, 300000), 300000);

	eng_start(&e, host, guest, 128 * 1024);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	if (e.err)
		fail_msg("reconcile: %s", e.why);
	assert_true(has(guest, "small.txt", "small\n"));
	assert_false(exists(guest, "huge.bin"));
	size_t n;
	uint64_t total;
	const struct sync_record *sk = sync_skipped(e.s, &n, &total);
	assert_int_equal(n, 1);
	assert_string_equal(sk[0].path, "huge.bin");
	assert_non_null(strstr(sk[0].rule, "too large to sync"));

	/* the next push of another path does not resend it; once it fits, it goes */
	put(host, "small.txt", "edited\n");
	const char *p1[] = {"small.txt"};
	e_push(&e, p1, 1);
	assert_true(has(guest, "small.txt", "edited\n"));
	assert_int_equal(ftruncate(bfd, 50000), 0);
	const char *p2[] = {"huge.bin"};
	e_push(&e, p2, 1);
	assert_true(same_file(host, guest, "huge.bin"));

	close(bfd);
	free(d);
	eng_stop(&e);
}

/* ---- withheld beyond the name list (withhold.h) ---- */

static const char *withheld_rule(const struct eng *e, const char *path)
{
	size_t n;
	uint64_t total;
	const struct sync_record *r = sync_withheld(e->s, &n, &total);
	for (size_t i = 0; i < n; i++)
		if (!strcmp(r[i].path, path))
			return r[i].rule;
	return NULL;
}

static void mkdirs(const char *root, const char *rel)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", root, rel);
	for (char *c = p + strlen(root) + 1; *c; c++) {
		if (*c != '/')
			continue;
		*c = '\0';
		mkdir(p, 0755);
		*c = '/';
	}
	mkdir(p, 0755);
}

/* Copies and renames of a withheld file, a token in an ordinary file,
 * git include targets, a bare repository's config and tool temporaries
 * beside a secret never reach the guest; audit names the rule and line,
 * never the value. */
static void test_withheld_content(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], p[256], q[256], tok[64];
	static const char env[] = "DEBUG=1\nNAME=app\nPORT=8080\n"; /* nothing a content rule sees */

	snprintf(host, sizeof(host), "%s/wh", dir);
	snprintf(guest, sizeof(guest), "%s/wg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	/* assembled here so this file holds no token */
	snprintf(tok, sizeof(tok), "%s%s", "gh", "p_q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi");
	mkdirs(host, "src");
	mkdirs(host, "sub");
	mkdirs(host, "docs");
	mkdirs(host, ".git/extra");
	mkdirs(host, ".git/objects");
	mkdirs(host, "vendor/mirror/objects");
	mkdirs(host, "vendor/mirror/refs");
	mkdirs(host, "vendor/mirror.git");
	put(host, ".env", env);
	put(host, "notes.txt", env);	   /* cp .env notes.txt */
	put(host, ".env~", "OLD=1\n");	   /* a backup name */
	put(host, "sedAb12Cd", "X=1\n");   /* sed -i's temporary beside .env */
	put(host, "sub/sedAb12Cd", "x\n"); /* ... and one with no secret beside it */
	snprintf(p, sizeof(p), "// config\nexport const api = 'https://x';\nconst t = '%s';\n", tok);
	put(host, "src/config.ts", p);
	put(host, "src/main.c", "int main(void) { return 0; }\n");
	put(host, "docs/a.txt", "plain docs\n");
	put(host, ".git/HEAD", "ref: refs/heads/main\n");
	put(host, ".git/config",
	    "[core]\n\tbare = false\n[include]\n\tpath = ../creds.inc\n"
	    "[includeIf \"gitdir:~/\"]\n\tpath = \"extra/x.conf\" # per host\n[include] path = /etc/elsewhere\n");
	put(host, "creds.inc", "[url \"https://u:t@x/\"]\n\tinsteadOf = https://x/\n");
	put(host, ".git/extra/x.conf", "[user]\n\temail = a@b\n");
	put(host, "vendor/mirror/HEAD", "ref: refs/heads/main\n");
	put(host, "vendor/mirror/config", "[remote \"o\"]\n\turl = https://u:t@x/r\n");
	put(host, "vendor/mirror.git/config", "[remote \"o\"]\n\turl = https://u:t@x/r\n");
	put(host, "vendor/config", "not a repository\n");

	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	if (e.err)
		fail_msg("%s", e.why);
	static const char *const gone[] = {".env",
					   "notes.txt",
					   ".env~",
					   "sedAb12Cd",
					   "src/config.ts",
					   "creds.inc",
					   ".git/extra/x.conf",
					   "vendor/mirror/config",
					   "vendor/mirror.git/config"};
	for (size_t i = 0; i < sizeof(gone) / sizeof(gone[0]); i++) {
		if (exists(guest, gone[i]))
			fail_msg("%s reached the guest", gone[i]);
		if (!withheld_rule(&e, gone[i]))
			fail_msg("%s is not in the audit record", gone[i]);
	}
	static const char *const there[] = {"src/main.c",    "docs/a.txt",	   "sub/sedAb12Cd",
					    "vendor/config", "vendor/mirror/HEAD", ".git/HEAD"};
	for (size_t i = 0; i < sizeof(there) / sizeof(there[0]); i++)
		if (!exists(guest, there[i]))
			fail_msg("%s did not sync", there[i]);
	const char *r = withheld_rule(&e, "src/config.ts");
	assert_non_null(strstr(r, "secret content: github-pat"));
	assert_non_null(strstr(r, "at line 3"));
	assert_null(strstr(r, tok + 4));
	assert_non_null(strstr(withheld_rule(&e, "notes.txt"), "same content as withheld .env"));
	assert_non_null(strstr(withheld_rule(&e, "creds.inc"), "included from .git/config"));
	assert_non_null(strstr(withheld_rule(&e, "vendor/mirror/config"), "bare git repository"));
	assert_non_null(strstr(withheld_rule(&e, "sedAb12Cd"), "temporary file beside a secret"));

	/* mv .env env.txt */
	snprintf(p, sizeof(p), "%s/.env", host);
	snprintf(q, sizeof(q), "%s/env.txt", host);
	assert_int_equal(rename(p, q), 0);
	const char *mv[] = {".env", "env.txt"};
	e_push(&e, mv, 2);
	assert_false(exists(guest, "env.txt"));
	/* a new .env value and its copy, in one push */
	put(host, ".env", "DEBUG=0\nNAME=other\n");
	put(host, "copy.txt", "DEBUG=0\nNAME=other\n");
	const char *cp[] = {".env", "copy.txt"};
	e_push(&e, cp, 2);
	assert_false(exists(guest, "copy.txt"));
	/* the token removed: the file syncs */
	put(host, "src/config.ts", "// config\n");
	const char *ed[] = {"src/config.ts"};
	e_push(&e, ed, 1);
	assert_true(has(guest, "src/config.ts", "// config\n"));
	/* a token written into a synced file: the guest's copy goes too */
	snprintf(p, sizeof(p), "int main(void) { return 0; }\n// %s\n", tok);
	put(host, "src/main.c", p);
	const char *tk[] = {"src/main.c"};
	e_push(&e, tk, 1);
	assert_false(exists(guest, "src/main.c"));
	assert_non_null(strstr(withheld_rule(&e, "src/main.c"), "github-pat"));
	/* .git/config now includes docs/a.txt: it leaves the guest */
	put(host, ".git/config", "[include]\n\tpath = ../docs/a.txt\n");
	const char *gc[] = {".git/config"};
	e_push(&e, gc, 1);
	assert_false(exists(guest, "docs/a.txt"));
	assert_true(exists(guest, "creds.inc")); /* no longer included: an ordinary file */
	eng_stop(&e);
}

/* ---- a seeded random workload of targeted pushes converges exactly ---- */

/* The manifest root digest of a tree (what both sides would compare). */
static void tree_root(const char *root, uint8_t out[CHUNK_HASH_LEN], size_t *n)
{
	struct manifest *m;
	int fd = open(root, O_RDONLY | O_DIRECTORY);
	assert_true(fd >= 0);
	struct manifest_scan_opts o = {0};
	assert_int_equal(manifest_scan(fd, &o, &m), 0);
	memcpy(out, m->root, CHUNK_HASH_LEN);
	*n = m->n;
	manifest_free(m);
	close(fd);
}

static void assert_same_tree(const char *a, const char *b)
{
	uint8_t ra[CHUNK_HASH_LEN], rb[CHUNK_HASH_LEN];
	size_t na, nb;
	tree_root(a, ra, &na);
	tree_root(b, rb, &nb);
	assert_int_equal(na, nb);
	assert_memory_equal(ra, rb, CHUNK_HASH_LEN);
}

/* Each step changes the host tree the way an editor or a build would
 * (edit, same-size rewrite, create in an old or a new directory, delete a
 * file or a whole directory, rename a file or a directory, chmod) and
 * pushes only the paths the journal would name. The guest must equal the
 * host after every check, and a full push at the end (the root dirty: a
 * full scan against what the engine believes the guest has) must find
 * nothing to send: the engine's confirmed state, edited in place push by
 * push, is exactly the tree. AIRLOCK_SYNC_RANDOM_FILES (default 3000)
 * sets the tree's size, AIRLOCK_SYNC_RANDOM_STEPS (default 300) the steps. */
static void push_random(const char *tag)
{
	struct eng e = {0};
	char host[128], guest[128], p[200], q[200], r2[200], a[400], b[400];
	const char *env = getenv("AIRLOCK_SYNC_RANDOM_FILES");
	unsigned nf = env ? (unsigned)strtoul(env, NULL, 10) : 3000;
	env = getenv("AIRLOCK_SYNC_RANDOM_STEPS");
	unsigned steps = env ? (unsigned)strtoul(env, NULL, 10) : 300;
	unsigned nd = nf / 50 + 1, fresh = 0;
	uint64_t rs = 0x72616e646f6d31ULL;

	snprintf(host, sizeof(host), "%s/%shost", dir, tag);
	snprintf(guest, sizeof(guest), "%s/%sguest", dir, tag);
	if (mkdir(host, 0755) != 0)
		fail_msg("mkdir %s: %s", host, strerror(errno));
	assert_int_equal(mkdir(guest, 0755), 0);
	for (unsigned d = 0; d < nd; d++) {
		snprintf(p, sizeof(p), "%s/d%u", host, d);
		assert_int_equal(mkdir(p, 0755), 0);
		snprintf(p, sizeof(p), "%s/d%u/s", host, d);
		assert_int_equal(mkdir(p, 0755), 0);
	}
	for (unsigned i = 0; i < nf; i++) {
		snprintf(p, sizeof(p), "d%u/%sf%u", i % nd, i % 3 ? "" : "s/", i);
		put(host, p, "seed\n");
	}
	eng_wait_ms = nf > 10000 ? 600000 : 10000; /* the long version's first sync */
	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);
	assert_same_tree(host, guest);

	for (unsigned st = 0; st < steps; st++) {
		const char *dirty[2] = {p, q};
		size_t nd2 = 1;
		unsigned d = tu_rand(&rs, nd), op = tu_rand(&rs, 9);
		char text[64];
		snprintf(text, sizeof(text), op == 1 ? "seed\n" : "step %u %u\n", st, tu_rand(&rs, 1000));
		/* a random existing entry of d%u: a file, or s/ */
		snprintf(r2, sizeof(r2), "d%u", d);
		snprintf(a, sizeof(a), "%s/%s", host, r2);
		if (!exists(host, r2)) {
			assert_int_equal(mkdir(a, 0755), 0);
			snprintf(p, sizeof(p), "d%u", d);
			e_push(&e, dirty, 1);
			continue;
		}
		switch (op) {
		case 0: /* edit or create a file */
		case 1: /* the same size (and, often, the same second) */
			snprintf(p, sizeof(p), "d%u/f%u", d, tu_rand(&rs, nf));
			put(host, p, text);
			break;
		case 2: /* a file in a new directory: only the file is named */
			snprintf(a, sizeof(a), "%s/d%u/n%u", host, d, fresh);
			assert_int_equal(mkdir(a, 0755), 0);
			snprintf(p, sizeof(p), "d%u/n%u/x", d, fresh++);
			put(host, p, text);
			break;
		case 3: /* delete a file (maybe one that is not there) */
			snprintf(p, sizeof(p), "d%u/f%u", d, tu_rand(&rs, nf));
			snprintf(a, sizeof(a), "%s/%s", host, p);
			(void)unlink(a);
			break;
		case 4: /* delete a whole directory */
			snprintf(p, sizeof(p), "d%u/s", d);
			snprintf(a, sizeof(a), "%s/%s", host, p);
			tu_rm_rf(a);
			break;
		case 5: /* rename a file into another directory */
			snprintf(p, sizeof(p), "d%u/f%u", d, tu_rand(&rs, nf));
			snprintf(q, sizeof(q), "d%u/r%u", tu_rand(&rs, nd), st);
			snprintf(a, sizeof(a), "%s/%s", host, p);
			snprintf(b, sizeof(b), "%s/%s", host, q);
			if (exists(host, q) || rename(a, b) != 0)
				put(host, p, text);
			else
				nd2 = 2;
			break;
		case 6: /* rename a directory */
			snprintf(p, sizeof(p), "d%u", d);
			snprintf(q, sizeof(q), "d%u", nd + fresh++);
			snprintf(a, sizeof(a), "%s/%s", host, p);
			snprintf(b, sizeof(b), "%s/%s", host, q);
			assert_int_equal(rename(a, b), 0);
			snprintf(a, sizeof(a), "%s/%s", host, p); /* and back, to keep d%u */
			assert_int_equal(mkdir(a, 0755), 0);
			nd2 = 2;
			break;
		case 7: /* chmod */
			snprintf(p, sizeof(p), "d%u/f%u", d, tu_rand(&rs, nf));
			snprintf(a, sizeof(a), "%s/%s", host, p);
			(void)chmod(a, tu_rand(&rs, 2) ? 0600 : 0644);
			break;
		default: /* two files of one push in different directories */
			snprintf(p, sizeof(p), "d%u/f%u", d, tu_rand(&rs, nf));
			snprintf(q, sizeof(q), "d%u/s/g%u", tu_rand(&rs, nd), st);
			put(host, p, text);
			snprintf(r2, sizeof(r2), "%s", q);
			*strrchr(r2, '/') = '\0';
			snprintf(a, sizeof(a), "%s/%s", host, r2);
			if (!exists(host, r2))
				assert_int_equal(mkdir(a, 0755), 0);
			put(host, q, text);
			nd2 = 2;
			break;
		}
		if (st % 10 == 0) {
			/* in flight: what it sends is the whole host tree */
			e.done = false;
			assert_int_equal(sync_push_paths(e.s, dirty, nd2), 0);
			const struct manifest *snd = sync_sending(e.s);
			if (snd) {
				uint8_t hr[CHUNK_HASH_LEN];
				size_t hn;
				tree_root(host, hr, &hn);
				assert_int_equal(snd->n, hn);
				assert_memory_equal(snd->root, hr, CHUNK_HASH_LEN);
			}
			if (!e.done)
				e_run(&e);
			assert_true(e.done);
			assert_int_equal(e.err, 0);
		} else {
			e_push(&e, dirty, nd2);
		}
		assert_false(sync_get_push_stats(e.s)->full);
		if (st % 25 == 24)
			assert_same_tree(host, guest);
	}
	assert_same_tree(host, guest);
	const char *root[] = {""};
	e_push(&e, root, 1);
	assert_true(sync_get_push_stats(e.s)->full);
	assert_int_equal(sync_get_stats(e.s)->changes, 0);
	eng_stop(&e);
	eng_wait_ms = 10000;
}

static void test_push_random(void **state)
{
	(void)state;
	push_random("rand");
}

/* The same with a loop, as under airlock up: pushes that walk a directory
 * are decided on the worker thread (and batches yield). */
static void test_push_random_loop(void **state)
{
	(void)state;
	eng_loop = true;
	push_random("randloop");
	eng_loop = false;
}

/* With a loop, batch building yields: a budget of 1 ns finishes a batch
 * every 32 files and builds the next one from a timer; the sync still
 * converges, over many batches (counted, not timed). The full scan runs
 * on the worker thread, as under airlock up. */
/* Per-path failures the guest reports in its ACK: the operation succeeds,
 * the path is listed (sync_failures) and kept as the guest had it, so a
 * push of it sends the op again and clears it; a failure list naming an
 * op the batch did not have, or another path, is a protocol error. */
static void e_push_err(struct eng *e, const char *const *paths, size_t n)
{
	e->done = false;
	assert_int_equal(sync_push_paths(e->s, paths, n), 0);
	if (!e->done)
		e_run(e);
	assert_true(e->done);
}

static void test_guest_failures(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128];
	size_t n;
	uint64_t total;

	snprintf(host, sizeof(host), "%s/fh", dir);
	snprintf(guest, sizeof(guest), "%s/fg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	put(host, "a.txt", "one\n");
	put(host, "b.txt", "b\n");
	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_int_equal(e.err, 0);

	/* the guest says it could not apply the edit of a.txt */
	put(host, "a.txt", "two\n");
	const char *pa[] = {"a.txt"};
	tamper = true, tamper_op = 0, tamper_err = EACCES, tamper_path = "a.txt";
	e_push(&e, pa, 1);
	const struct sync_failure *f = sync_failures(e.s, &n, &total);
	assert_int_equal(n, 1);
	assert_int_equal(total, 1);
	assert_string_equal(f[0].path, "a.txt");
	assert_int_equal(f[0].err, EACCES);
	assert_int_equal(f[0].attempts, 1);
	assert_false(f[0].reconcile);
	assert_non_null(strstr(f[0].msg, "Permission denied"));
	/* the confirmed state kept the guest's old side: a.txt is "one" there */
	long i = manifest_find(sync_known(e.s), "a.txt");
	assert_true(i >= 0);
	assert_int_equal(sync_known(e.s)->e[i].size, 4);
	/* a push of another path leaves it listed */
	put(host, "b.txt", "bb\n");
	const char *pb[] = {"b.txt"};
	e_push(&e, pb, 1);
	assert_int_equal(sync_failures(e.s, &n, NULL)[0].attempts, 1);
	assert_int_equal(n, 1);
	/* failing again counts an attempt */
	tamper = true;
	e_push(&e, pa, 1);
	f = sync_failures(e.s, &n, NULL);
	assert_int_equal(n, 1);
	assert_int_equal(f[0].attempts, 2);
	/* the retry applies it: gone from the list */
	e_push(&e, pa, 1);
	sync_failures(e.s, &n, &total);
	assert_int_equal(n, 0);
	assert_int_equal(total, 0);
	assert_true(has(guest, "a.txt", "two\n"));
	/* a failed delete keeps the file in the confirmed state; the retry deletes */
	char p[256];
	snprintf(p, sizeof(p), "%s/b.txt", host);
	assert_int_equal(unlink(p), 0);
	tamper = true, tamper_path = "b.txt";
	e_push(&e, pb, 1);
	assert_true(manifest_find(sync_known(e.s), "b.txt") >= 0);
	assert_int_equal(sync_failures(e.s, &n, NULL)[0].err, EACCES);
	e_push(&e, pb, 1);
	assert_true(manifest_find(sync_known(e.s), "b.txt") < 0);
	sync_failures(e.s, &n, NULL);
	assert_int_equal(n, 0);

	/* lies: an op the batch did not have, another path */
	put(host, "a.txt", "three\n");
	tamper = true, tamper_op = 7, tamper_path = "a.txt";
	e_push_err(&e, pa, 1);
	assert_int_equal(e.err, -EPROTO);
	eng_stop(&e);
	memset(&e, 0, sizeof(e));
	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_int_equal(e.err, 0);
	put(host, "a.txt", "four\n");
	tamper = true, tamper_op = 0, tamper_path = "never/sent";
	e_push_err(&e, pa, 1);
	assert_int_equal(e.err, -EPROTO);
	assert_non_null(strstr(e.why, "SYNC_ACK"));
	eng_stop(&e);
}

static void test_pump_yields(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], p[64];

	snprintf(host, sizeof(host), "%s/yh", dir);
	snprintf(guest, sizeof(guest), "%s/yg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	for (int i = 0; i < 640; i++) {
		snprintf(p, sizeof(p), "f%d", i);
		put(host, p, "small\n");
	}
	eng_loop = true;
	eng_budget_ns = 1;
	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);
	assert_true(sync_get_stats(e.s)->batches >= 640 / 32);
	assert_same_tree(host, guest);
	/* a push of many paths too */
	const char *paths[100];
	char names[100][16];
	for (int i = 0; i < 100; i++) {
		snprintf(names[i], sizeof(names[i]), "f%d", i * 3);
		put(host, names[i], "edited!\n");
		paths[i] = names[i];
	}
	uint64_t before = sync_get_stats(e.s)->batches;
	e_push(&e, paths, 100);
	assert_true(sync_get_stats(e.s)->batches - before >= 100 / 32);
	assert_same_tree(host, guest);
	eng_stop(&e);
	eng_loop = false;
	eng_budget_ns = 0;
}

/* Edits made while no engine runs (airlock down, then up): each new
 * engine proves the tree unchanged from the scan state the last one saved
 * (doc/SYNC.md "Unchanged trees") or scans it fully, with the hash cache.
 * Every kind of offline edit is found: one that keeps the size and the
 * mtime (set back with utimensat, so only ctime moves), one touched back
 * to the same second, a rename, a deleted directory, a file replaced by a
 * hard link to another, a chmod, a retargeted symlink; and an edit of the
 * guest's copy. An unchanged up reads no file (scan_hashed 0); a damaged
 * state means a full scan with the same result. */
static struct sync_stats up_with(const char *host, const char *guest, const uint8_t *prescan_sk)
{
	struct eng e = {0};
	eng_start(&e, host, guest, 0);
	if (prescan_sk) { /* the proof begun before the engine, as `airlock up` does after the mount */
		struct sync_prescan *p = NULL;
		struct sync_cfg cfg = {
		    .dirfd = e.dfd, .policy = e.pol, .sign_sk = prescan_sk, .state_dir = eng_state_dir};
		assert_int_equal(sync_prescan_start(&cfg, &p), 0);
		sync_set_prescan(e.s, p);
	}
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	if (e.err)
		fail_msg("reconcile: %s", e.why);
	struct sync_stats st = *sync_get_stats(e.s);
	eng_stop(&e);
	return st;
}

static struct sync_stats offline_up(const char *host, const char *guest)
{
	return up_with(host, guest, NULL);
}

/* Past the stamp's granule, so that the last scan's entries are not racy. */
static void granule(void)
{
	struct timespec ts = {0, 50 * 1000 * 1000};
	nanosleep(&ts, NULL);
}

/* An up that must find the tree unchanged: no file read, nothing sent. */
static void unchanged_up(const char *host, const char *guest)
{
	granule();
	struct sync_stats st = offline_up(host, guest);
	if (!st.scan_verified)
		fail_msg("the unchanged tree was scanned fully: %s", st.scan_note);
	assert_int_equal(st.scan_hashed, 0);
	assert_int_equal(st.changes, 0);
	assert_int_equal(st.levels, 0); /* the root digests were equal */
	assert_true(st.scan_names > 0);
	assert_same_tree(host, guest);
}

/* An up after an offline edit: the stat walk finds it, a full scan follows. */
static void changed_up(const char *host, const char *guest, const char *what)
{
	granule(); /* the edit is older than this up's stamp: its state is not racy */
	struct sync_stats st = offline_up(host, guest);
	if (st.scan_verified)
		fail_msg("%s: taken as unchanged", what);
	assert_same_tree(host, guest);
}

static void same_size_same_mtime(const char *root, const char *rel, const char *text, bool whole_second)
{
	char p[256];
	struct stat st, st2;

	snprintf(p, sizeof(p), "%s/%s", root, rel);
	assert_int_equal(stat(p, &st), 0);
	put(root, rel, text);
	struct timespec ts[2] = {st.st_atim, st.st_mtim};
	if (whole_second)
		ts[1].tv_nsec = 0;
	assert_int_equal(utimensat(AT_FDCWD, p, ts, 0), 0);
	assert_int_equal(stat(p, &st2), 0);
	assert_int_equal(st2.st_size, st.st_size);
	assert_int_equal(st2.st_mtim.tv_sec, st.st_mtim.tv_sec);
	if (!whole_second)
		assert_int_equal(st2.st_mtim.tv_nsec, st.st_mtim.tv_nsec);
}

static void path_of(char *out, size_t n, const char *root, const char *rel)
{
	snprintf(out, n, "%s/%s", root, rel);
}

static void test_offline_edits(void **state)
{
	(void)state;
	char host[128], guest[128], sd[128], p[256], q[256];

	snprintf(host, sizeof(host), "%s/oh", dir);
	snprintf(guest, sizeof(guest), "%s/og", dir);
	snprintf(sd, sizeof(sd), "%s/ostate", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	assert_int_equal(mkdir(sd, 0700), 0);
	path_of(p, sizeof(p), host, "d");
	assert_int_equal(mkdir(p, 0755), 0);
	path_of(p, sizeof(p), host, "gone");
	assert_int_equal(mkdir(p, 0755), 0);
	put(host, "same.txt", "aaaa\n");
	put(host, "second.txt", "1111\n");
	put(host, "d/old-name", "moved\n");
	put(host, "gone/x", "x\n");
	put(host, "gone/y", "y\n");
	put(host, "one", "same length 1\n");
	put(host, "two", "same length 2\n");
	put(host, "mode.sh", "#!/bin/sh\n");
	put(host, "d/target-a", "a\n");
	put(host, "d/target-b", "b\n");
	path_of(p, sizeof(p), host, "d/link");
	assert_int_equal(symlink("target-a", p), 0);
	eng_state_dir = sd;
	changed_up(host, guest, "the first up");
	assert_true(has(guest, "same.txt", "aaaa\n"));
	/* that up's state was saved once the guest confirmed it (what was
	 * made in its stamp's granule is racy: the next one may scan again) */
	granule();
	offline_up(host, guest);
	unchanged_up(host, guest);
	unchanged_up(host, guest);

	/* while down: same size, same mtime (to the nanosecond) */
	same_size_same_mtime(host, "same.txt", "bbbb\n", false);
	changed_up(host, guest, "an edit keeping size and mtime");
	assert_true(has(guest, "same.txt", "bbbb\n"));
	unchanged_up(host, guest);
	/* same size, mtime touched back to its second */
	same_size_same_mtime(host, "second.txt", "2222\n", true);
	changed_up(host, guest, "an edit touched back to the second");
	assert_true(has(guest, "second.txt", "2222\n"));
	unchanged_up(host, guest);
	/* a rename, a deleted directory */
	path_of(p, sizeof(p), host, "d/old-name");
	path_of(q, sizeof(q), host, "d/new-name");
	assert_int_equal(rename(p, q), 0);
	path_of(p, sizeof(p), host, "gone");
	tu_rm_rf(p);
	changed_up(host, guest, "a rename and a deleted directory");
	assert_false(exists(guest, "d/old-name"));
	assert_true(has(guest, "d/new-name", "moved\n"));
	assert_false(exists(guest, "gone"));
	unchanged_up(host, guest);
	/* "two" replaced by a hard link to "one" (same size) */
	path_of(p, sizeof(p), host, "one");
	path_of(q, sizeof(q), host, "two.tmp");
	assert_int_equal(link(p, q), 0);
	path_of(p, sizeof(p), host, "two");
	assert_int_equal(rename(q, p), 0);
	changed_up(host, guest, "a file replaced by a hard link to another");
	assert_true(has(guest, "two", "same length 1\n"));
	unchanged_up(host, guest);
	/* a chmod */
	path_of(p, sizeof(p), host, "mode.sh");
	assert_int_equal(chmod(p, 0755), 0);
	changed_up(host, guest, "a chmod");
	struct stat st;
	path_of(p, sizeof(p), guest, "mode.sh");
	assert_int_equal(stat(p, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0755);
	unchanged_up(host, guest);
	/* a symlink retargeted (same target length) */
	path_of(p, sizeof(p), host, "d/link");
	assert_int_equal(unlink(p), 0);
	assert_int_equal(symlink("target-b", p), 0);
	changed_up(host, guest, "a retargeted symlink");
	char t[64] = "";
	path_of(p, sizeof(p), guest, "d/link");
	assert_int_equal(readlink(p, t, sizeof(t) - 1), 8);
	assert_string_equal(t, "target-b");
	unchanged_up(host, guest);
	/* the guest's copy edited while down (same size and mtime): the
	 * guest's own walk finds it and the host's version goes back */
	same_size_same_mtime(guest, "same.txt", "gggg\n", false);
	struct sync_stats gs = offline_up(host, guest);
	assert_true(gs.scan_verified); /* the host's tree did not change */
	assert_true(gs.changes > 0);
	assert_true(has(guest, "same.txt", "bbbb\n"));
	unchanged_up(host, guest);

	/* a damaged state: a flipped byte, then a truncated file, then garbage
	 * of the right size: each means one full scan, the same result */
	size_t n;
	char *good = tu_read_file(AT_FDCWD, (snprintf(p, sizeof(p), "%s/scan-state", sd), p), &n);
	assert_non_null(good);
	good[n / 2] ^= 0x10;
	tu_put_file(AT_FDCWD, p, good, n, 0600);
	struct sync_stats ds = offline_up(host, guest);
	assert_false(ds.scan_verified);
	assert_true(strstr(ds.scan_note, "refused") != NULL);
	assert_int_equal(ds.changes, 0);
	unchanged_up(host, guest);
	tu_put_file(AT_FDCWD, p, good, n / 3, 0600);
	ds = offline_up(host, guest);
	assert_false(ds.scan_verified);
	assert_int_equal(ds.changes, 0);
	memset(good, 'A', n);
	tu_put_file(AT_FDCWD, p, good, n, 0600);
	ds = offline_up(host, guest);
	assert_false(ds.scan_verified);
	assert_int_equal(ds.changes, 0);
	free(good);
	unchanged_up(host, guest);
	assert_same_tree(host, guest);
	eng_state_dir = NULL;
}

/* An up whose proof of an unchanged tree began before the engine existed
 * (sync_prescan_start), made with sign_sk (the engine's: hsk). */
static struct sync_stats prescan_up(const char *host, const char *guest, const uint8_t *sign_sk)
{
	granule();
	struct sync_stats st = up_with(host, guest, sign_sk);
	assert_same_tree(host, guest);
	return st;
}

/* The prescan's proof is the reconcile's: taken when unchanged; an edit
 * made before it began (size and mtime kept) is found all the same; one
 * made with another key is not taken (the reconcile proves it itself);
 * one freed untaken does not wait for its walk. */
static void test_prescan(void **state)
{
	(void)state;
	char host[128], guest[128], sd[128], p[256];
	uint8_t other_sk[64];

	snprintf(host, sizeof(host), "%s/ph", dir);
	snprintf(guest, sizeof(guest), "%s/pg", dir);
	snprintf(sd, sizeof(sd), "%s/pstate", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	assert_int_equal(mkdir(sd, 0700), 0);
	path_of(p, sizeof(p), host, "d");
	assert_int_equal(mkdir(p, 0755), 0);
	put(host, "same.txt", "aaaa\n");
	put(host, "d/x", "x\n");
	eng_state_dir = sd;
	changed_up(host, guest, "the first up");
	granule();
	offline_up(host, guest);
	unchanged_up(host, guest);

	struct sync_stats st = prescan_up(host, guest, hsk);
	if (!st.scan_verified)
		fail_msg("the unchanged tree was scanned fully: %s", st.scan_note);
	assert_true(st.scan_early_ns > 0); /* the prescan's proof, not a new walk */
	assert_int_equal(st.scan_hashed, 0);
	assert_int_equal(st.changes, 0);

	same_size_same_mtime(host, "same.txt", "bbbb\n", false);
	st = prescan_up(host, guest, hsk);
	assert_true(st.scan_early_ns > 0);
	assert_false(st.scan_verified);
	assert_true(strstr(st.scan_note, "same.txt") != NULL);
	assert_true(has(guest, "same.txt", "bbbb\n"));
	granule();
	offline_up(host, guest); /* past the racy granule of that scan */

	randombytes_buf(other_sk, sizeof(other_sk));
	st = prescan_up(host, guest, other_sk);
	assert_int_equal(st.scan_early_ns, 0); /* another key: not this engine's proof */
	assert_true(st.scan_verified);

	int dfd = open(host, O_RDONLY | O_DIRECTORY);
	struct policy *pol = NULL;
	struct sync_prescan *ps = NULL;
	assert_true(dfd >= 0);
	assert_int_equal(policy_default(&pol), 0);
	struct sync_cfg cfg = {.dirfd = dfd, .policy = pol, .sign_sk = hsk, .state_dir = sd};
	assert_int_equal(sync_prescan_start(&cfg, &ps), 0);
	close(dfd); /* the prescan has its own */
	sync_prescan_free(ps);
	cfg.state_dir = NULL;
	assert_int_equal(sync_prescan_start(&cfg, &ps), -EINVAL);
	assert_null(ps);
	policy_free(pol); /* (a running prescan reads the policy only before it starts) */
	eng_state_dir = NULL;
}

/* An agent that stays up between connections answers a BEGIN without
 * walking when its tracker saw nothing since the last BEGIN's scan began;
 * any event (a command's write, an apply) makes the next BEGIN walk. */
static void test_guest_quiet(void **state)
{
	(void)state;
	struct eng e = {0};
	struct track *t = NULL;
	char host[128], guest[128], sd[128], err[256], p[256];

	snprintf(host, sizeof(host), "%s/qh", dir);
	snprintf(guest, sizeof(guest), "%s/qg", dir);
	snprintf(sd, sizeof(sd), "%s/qstate", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	assert_int_equal(mkdir(sd, 0700), 0);
	put(host, "a.txt", "a\n");
	path_of(p, sizeof(p), host, "sub");
	assert_int_equal(mkdir(p, 0755), 0);
	put(host, "sub/b.txt", "b\n");
	eng_state_dir = sd;
	eng_start(&e, host, guest, 0);
	int gfd = open(guest, O_RDONLY | O_DIRECTORY);
	assert_true(gfd >= 0);
	assert_int_equal(track_new(gfd, guest, &t, err, sizeof(err)), 0);
	syncg_set_track(e.g, t);
	for (int round = 0; round < 5; round++) {
		if (round == 3)
			put(guest, "made-by-a-command", "x\n"); /* the tracker sees it */
		track_read(t, 0);				/* as the agent does before each frame */
		uint64_t w = syncg_walks(e.g), lv = sync_get_stats(e.s)->levels;
		e.done = false;
		assert_int_equal(sync_reconcile(e.s), 0);
		e_run(&e);
		assert_true(e.done);
		assert_int_equal(e.err, 0);
		const struct sync_stats *st = sync_get_stats(e.s);
		switch (round) {
		case 0: /* the first sync: batches applied */
		case 1: /* the copy changed by them: walked */
			assert_int_equal(syncg_walks(e.g), w + 1);
			break;
		case 2: /* nothing happened since round 1's scan began */
			assert_int_equal(syncg_walks(e.g), w);
			assert_int_equal(st->changes, 0);
			assert_int_equal(st->levels, lv); /* the roots were equal */
			break;
		case 3: /* a command wrote: walked, and the host's tree goes back */
			assert_int_equal(syncg_walks(e.g), w + 1);
			assert_true(st->changes > 0);
			path_of(p, sizeof(p), guest, "made-by-a-command");
			assert_int_equal(access(p, F_OK), -1);
			break;
		case 4: /* the delete was an apply: walked again */
			assert_int_equal(syncg_walks(e.g), w + 1);
			assert_int_equal(st->changes, 0);
			break;
		}
		assert_same_tree(host, guest);
	}
	track_free(t);
	close(gfd);
	eng_stop(&e);
	eng_state_dir = NULL;
}

/* Every work tree's .git gets a generated config like the top level's:
 * a nested repository's, a submodule's under .git/modules (a HEAD beside),
 * one made by a later push (cp -a of a repository), an edit of one; a
 * .git file pointing outside the workspace is synced as it is and never
 * followed. */
static void read_text(const char *root, const char *rel, char *out, size_t n)
{
	size_t k = 0;
	uint8_t *b = slurp(root, rel, &k);
	k = b && k < n ? k : 0;
	if (k)
		memcpy(out, b, k);
	out[k] = '\0';
	free(b);
}
static void test_nested_git_configs(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], p[256], g[4096];
	static const char secret[] = "[core]\n\tfilemode = true\n[remote \"o\"]\n\turl = https://TOKEN@x/r\n";

	snprintf(host, sizeof(host), "%s/nh", dir);
	snprintf(guest, sizeof(guest), "%s/ng", dir);
	static const char *const dirs[] = {"",	    "/.git",	  "/.git/modules", "/.git/modules/sm",
					   "/nest", "/nest/.git", "/sub"};
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++) {
		snprintf(p, sizeof(p), "%s%s", host, dirs[i]);
		assert_int_equal(mkdir(p, 0755), 0);
	}
	assert_int_equal(mkdir(guest, 0755), 0);
	put(host, ".git/config", secret);
	put(host, ".git/HEAD", "ref: refs/heads/main\n");
	put(host, ".git/modules/sm/config", secret);
	put(host, ".git/modules/sm/HEAD", "ref: refs/heads/main\n");
	put(host, "nest/.git/config", secret);
	put(host, "nest/.git/HEAD", "ref: refs/heads/main\n");
	put(host, "sub/.git", "gitdir: /etc\n"); /* outside: never followed */

	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);
	static const char *const cfgs[] = {".git/config", ".git/modules/sm/config", "nest/.git/config"};
	for (size_t i = 0; i < 3; i++) {
		read_text(guest, cfgs[i], g, sizeof(g));
		assert_non_null(strstr(g, "generated by airlock"));
		assert_non_null(strstr(g, "filemode = true"));
		assert_null(strstr(g, "TOKEN"));
	}
	assert_true(has(guest, "sub/.git", "gitdir: /etc\n"));
	assert_false(exists(guest, "sub/config"));

	/* a repository copied in (one anchor), an edit of a nested config */
	snprintf(p, sizeof(p), "%s/copy", host);
	assert_int_equal(mkdir(p, 0755), 0);
	snprintf(p, sizeof(p), "%s/copy/.git", host);
	assert_int_equal(mkdir(p, 0755), 0);
	put(host, "copy/.git/config", secret);
	put(host, "copy/.git/HEAD", "ref: refs/heads/main\n");
	const char *p1[] = {"copy"};
	e_push(&e, p1, 1);
	read_text(guest, "copy/.git/config", g, sizeof(g));
	assert_non_null(strstr(g, "generated by airlock"));
	assert_null(strstr(g, "TOKEN"));
	put(host, "nest/.git/config", "[core]\n\tfilemode = false\n[remote \"o\"]\n\turl = https://TOKEN@x/r\n");
	const char *p2[] = {"nest/.git/config"};
	e_push(&e, p2, 1);
	read_text(guest, "nest/.git/config", g, sizeof(g));
	assert_non_null(strstr(g, "filemode = false"));
	assert_null(strstr(g, "TOKEN"));
	/* and the generated ones stay through a push elsewhere and a full one */
	put(host, "nest/f", "x\n");
	const char *p3[] = {"nest/f"};
	e_push(&e, p3, 1);
	assert_true(exists(guest, ".git/modules/sm/config") && exists(guest, "copy/.git/config"));
	const char *root[] = {""};
	e_push(&e, root, 1);
	assert_int_equal(sync_get_stats(e.s)->changes, 0);
	eng_stop(&e);
}

/* A push that fails while sending (the guest's ERROR, a write to a guest
 * that died) may have left batches applied in the guest that were never
 * acknowledged: sync_sending still names the state it was sending, so the
 * next reconcile takes what the guest holds of it for the host's, not for
 * a guest change (faults_e2e: a chmod, a rename undone on the host, kept
 * as the guest's after an agent's kill -9). */
static void test_sending_after_failure(void **state)
{
	(void)state;
	struct eng e = {0};
	char host[128], guest[128], p[256];
	uint8_t hr[CHUNK_HASH_LEN];
	size_t hn;

	snprintf(host, sizeof(host), "%s/sh", dir);
	snprintf(guest, sizeof(guest), "%s/sg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	put(host, "a", "one\n");
	put(host, "b", "two\n");
	eng_start(&e, host, guest, 0);
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);

	snprintf(p, sizeof(p), "%s/a", host);
	assert_int_equal(chmod(p, 0600), 0);
	put(host, "b", "changed\n");
	const char *dirty[] = {"a", "b"};
	e.done = false;
	assert_int_equal(sync_push_paths(e.s, dirty, 2), 0);
	assert_false(e.done);
	assert_non_null(sync_sending(e.s)); /* in flight */
	sync_on_error(e.s, EIO, "test: the guest failed");
	assert_true(e.done);
	assert_int_not_equal(e.err, 0);
	const struct manifest *snd = sync_sending(e.s);
	assert_non_null(snd);
	tree_root(host, hr, &hn);
	assert_int_equal(snd->n, hn);
	assert_memory_equal(snd->root, hr, CHUNK_HASH_LEN);
	/* (the connection is dropped after a failure: the engine is not used again) */
	eng_stop(&e);
}

/* A seeded storm of edits while operations run with a loop (full scans
 * and tree diffs on the worker thread, batches yielding): a timer edits
 * the host tree during each operation (rewrites of random sizes, creates
 * in new directories, deletes, renames, a directory removed), and every
 * path it touched is named in the next push, as the journal would. The
 * operations cycle through a reconcile (scan, levels, diff on the
 * thread), a full push (the root dirty: scan and diff on the thread) and
 * targeted pushes. After a last push with the storm stopped, the guest
 * equals the host and a full push finds nothing to send: no edit made
 * while a job ran was lost, and none left the confirmed state wrong. */
struct storm {
	const char *host;
	uint64_t rs;
	unsigned n, fresh;
	char dirty[4096][48];
	size_t ndirty;
	uint64_t timer;
	struct loop *l;
};

static void storm_name(struct storm *w, const char *p)
{
	if (w->ndirty < sizeof(w->dirty) / sizeof(w->dirty[0]))
		snprintf(w->dirty[w->ndirty++], sizeof(w->dirty[0]), "%s", p);
}

static void storm_edit(struct storm *w)
{
	char p[48], q[48], a[200], b[200], text[700];
	unsigned d = tu_rand(&w->rs, 8), op = tu_rand(&w->rs, 6);
	size_t len = tu_rand(&w->rs, sizeof(text) - 1);

	for (size_t i = 0; i < len; i++)
		text[i] = (char)('a' + tu_rand(&w->rs, 26));
	text[len] = '\0';
	snprintf(a, sizeof(a), "%s/w%u", w->host, d);
	mkdir(a, 0755); /* may be gone (op 5), or there */
	snprintf(p, sizeof(p), "w%u", d);
	storm_name(w, p);
	switch (op) {
	case 0: /* a rewrite, of another size */
	case 1:
		snprintf(p, sizeof(p), "w%u/f%u", d, tu_rand(&w->rs, 40));
		put(w->host, p, text);
		storm_name(w, p);
		break;
	case 2: /* a file in a new directory: only the file is named */
		snprintf(a, sizeof(a), "%s/w%u/n%u", w->host, d, w->fresh);
		assert_int_equal(mkdir(a, 0755), 0);
		snprintf(p, sizeof(p), "w%u/n%u/x", d, w->fresh++);
		put(w->host, p, text);
		storm_name(w, p);
		break;
	case 3: /* a delete */
		snprintf(p, sizeof(p), "w%u/f%u", d, tu_rand(&w->rs, 40));
		snprintf(a, sizeof(a), "%s/%s", w->host, p);
		(void)unlink(a);
		storm_name(w, p);
		break;
	case 4: /* a rename into another directory */
		snprintf(p, sizeof(p), "w%u/f%u", d, tu_rand(&w->rs, 40));
		snprintf(q, sizeof(q), "w%u/f%u", tu_rand(&w->rs, 8), tu_rand(&w->rs, 40));
		snprintf(a, sizeof(a), "%s/%s", w->host, p);
		snprintf(b, sizeof(b), "%s/%s", w->host, q);
		snprintf(text, sizeof(text), "%s/%s", w->host, q);
		*strrchr(text, '/') = '\0';
		mkdir(text, 0755);
		(void)rename(a, b);
		storm_name(w, p);
		storm_name(w, q);
		break;
	default: /* a whole directory */
		snprintf(a, sizeof(a), "%s/w%u", w->host, d);
		tu_rm_rf(a);
		break;
	}
	w->n++;
}

static void storm_tick(struct loop *l, void *ud)
{
	struct storm *w = ud;
	storm_edit(w);
	w->timer = loop_add_timer(l, tu_rand(&w->rs, 3), storm_tick, w);
}

static void test_storm_during_jobs(void **state)
{
	(void)state;
	struct eng e = {0};
	static struct storm w;
	char host[128], guest[128];
	const char *names[4097];
	static const struct sync_hint nohints[4097];

	snprintf(host, sizeof(host), "%s/sth", dir);
	snprintf(guest, sizeof(guest), "%s/stg", dir);
	assert_int_equal(mkdir(host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	memset(&w, 0, sizeof(w));
	w.host = host;
	w.rs = 0x73746f726d31ULL;
	for (int i = 0; i < 400; i++)
		storm_edit(&w);
	eng_loop = true;
	eng_budget_ns = 1; /* batches yield every 32 files: more turns for the storm */
	eng_start(&e, host, guest, 0);
	w.l = e.l;
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	assert_int_equal(e.err, 0);
	for (int round = 0; round < 60; round++) {
		size_t n = w.ndirty;
		for (size_t i = 0; i < n; i++)
			names[i] = w.dirty[i];
		if (round % 3 == 2 || w.ndirty == sizeof(w.dirty) / sizeof(w.dirty[0]))
			names[n++] = ""; /* the root: a full scan and diff on the thread */
		static char copy[4097][48];
		for (size_t i = 0; i < n; i++) {
			snprintf(copy[i], sizeof(copy[i]), "%s", names[i]);
			names[i] = copy[i];
		}
		w.ndirty = 0;
		w.timer = loop_add_timer(e.l, 0, storm_tick, &w);
		e.done = false;
		if (round % 3 == 0)
			assert_int_equal(sync_reconcile(e.s), 0);
		else /* with (unusable) hints: a push that goes on a job must drop them */
			assert_int_equal(sync_push_hinted(e.s, names, nohints, n), 0);
		if (!e.done)
			e_run(&e);
		loop_del_timer(e.l, w.timer);
		assert_true(e.done);
		if (e.err)
			fail_msg("round %d: %s", round, e.why);
	}
	/* the storm is over: its last paths, then the whole tree */
	for (size_t i = 0; i < w.ndirty; i++)
		names[i] = w.dirty[i];
	if (w.ndirty)
		e_push(&e, names, w.ndirty);
	assert_same_tree(host, guest);
	const char *root[] = {""};
	e_push(&e, root, 1);
	assert_int_equal(sync_get_stats(e.s)->changes, 0);
	assert_true(w.n > 400 + 60); /* edits did land while the operations ran */
	eng_stop(&e);
	eng_loop = false;
	eng_budget_ns = 0;
}

/* Files changed between the scan and the send, on the worker threads'
 * path (200 small files: prepared there by default, and in sync_prep
 * always): a same-size rewrite, a same-size rewrite that now holds a
 * token, a delete, a symlink in a file's place. None of them is sent with
 * the scanned entry (each is counted as vanished, the guest does not get
 * the new bytes under the old hash and never the token), the rest
 * arrives byte for byte in op order, and a push of the four paths (what
 * the journal would name) brings the guest to the host's state with the
 * token withheld. */
static char stale_host[128];
static void stale_edit(void)
{
	char p[256], tok[64], line[128], text[256];
	/* assembled here so this file holds no token */
	snprintf(tok, sizeof(tok), "%s%s", "gh", "p_q8Zr2LmV0xKp4TbN7yWc1sHd9gFj3uEa6oRi");
	snprintf(line, sizeof(line), "t = '%s';", tok);
	snprintf(text, sizeof(text), "%-127s\n", line);
	assert_int_equal(strlen(text), 128);
	put(stale_host, "f100", text);
	snprintf(text, sizeof(text), "%-127s\n", "rewritten after the scan");
	put(stale_host, "f050", text);
	snprintf(p, sizeof(p), "%s/f150", stale_host);
	assert_int_equal(unlink(p), 0);
	snprintf(p, sizeof(p), "%s/f151", stale_host);
	assert_int_equal(unlink(p), 0);
	assert_int_equal(symlink("f000", p), 0);
}

static void test_send_stale(void **state)
{
	(void)state;
	struct eng e = {0};
	char guest[128], name[256], text[160];

	snprintf(stale_host, sizeof(stale_host), "%s/vsh", dir);
	snprintf(guest, sizeof(guest), "%s/vsg", dir);
	assert_int_equal(mkdir(stale_host, 0755), 0);
	assert_int_equal(mkdir(guest, 0755), 0);
	for (int i = 0; i < 200; i++) {
		snprintf(name, sizeof(name), "f%03d", i);
		snprintf(text, sizeof(text), "file %03d%-119s\n", i, "");
		put(stale_host, name, text);
	}
	eng_start(&e, stale_host, guest, 0);
	eng_on_send = stale_edit;
	assert_int_equal(sync_reconcile(e.s), 0);
	e_run(&e);
	assert_true(e.done);
	if (e.err)
		fail_msg("%s", e.why);
	assert_null(eng_on_send);
	assert_int_equal(sync_get_stats(e.s)->vanished, 4);
	static const char *const four[] = {"f050", "f100", "f150", "f151"};
	for (size_t i = 0; i < 4; i++)
		if (exists(guest, four[i]))
			fail_msg("%s was sent with what the scan saw", four[i]);
	for (int i = 0; i < 200; i++) {
		snprintf(name, sizeof(name), "f%03d", i);
		snprintf(text, sizeof(text), "file %03d%-119s\n", i, "");
		if (i != 50 && i != 100 && i != 150 && i != 151 && !has(guest, name, text))
			fail_msg("%s: not the host's bytes in the guest", name);
	}
	e_push(&e, four, 4);
	snprintf(text, sizeof(text), "%-127s\n", "rewritten after the scan");
	assert_true(has(guest, "f050", text));
	assert_false(exists(guest, "f100"));
	assert_non_null(strstr(withheld_rule(&e, "f100"), "secret content"));
	assert_false(exists(guest, "f150"));
	char t[16] = "";
	snprintf(name, sizeof(name), "%s/f151", guest);
	assert_int_equal(readlink(name, t, sizeof(t) - 1), 4);
	assert_string_equal(t, "f000");
	eng_stop(&e);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_git_config),	       cmocka_unit_test(test_push_targeted),
	    cmocka_unit_test(test_push_hardlink_dir),  cmocka_unit_test(test_push_ranged),
	    cmocka_unit_test(test_too_large),	       cmocka_unit_test(test_withheld_content),
	    cmocka_unit_test(test_push_random),	       cmocka_unit_test(test_pump_yields),
	    cmocka_unit_test(test_offline_edits),      cmocka_unit_test(test_prescan),
	    cmocka_unit_test(test_guest_failures),     cmocka_unit_test(test_sending_after_failure),
	    cmocka_unit_test(test_nested_git_configs), cmocka_unit_test(test_guest_quiet),
	    cmocka_unit_test(test_push_random_loop),   cmocka_unit_test(test_storm_during_jobs),
	    cmocka_unit_test(test_send_stale),
	};
	if (sodium_init() < 0)
		return 1;
	return cmocka_run_group_tests(tests, setup, teardown);
}
