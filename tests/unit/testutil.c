/* SPDX-License-Identifier: Apache-2.0 */
/* testutil: the unit tests' shared helpers (testutil.h). */
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>
#include <sodium.h>

#include "testutil.h"

#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/tunnel.h"

void tu_tmpdir(char *out, size_t n, const char *name)
{
	int k = snprintf(out, n, "/tmp/airlock-%s.XXXXXX", name);

	assert_true(k > 0 && (size_t)k < n);
	assert_non_null(mkdtemp(out));
}

static int unlock_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)f;
	if (flag == FTW_D && !S_ISLNK(st->st_mode))
		chmod(p, 0700);
	return 0;
}

static int rm_cb(const char *p, const struct stat *st, int flag, struct FTW *f)
{
	(void)st;
	(void)flag;
	(void)f;
	return remove(p);
}

void tu_rm_rf(const char *path)
{
	nftw(path, unlock_cb, 32, FTW_PHYS);
	nftw(path, rm_cb, 32, FTW_DEPTH | FTW_PHYS);
}

void tu_put_file(int dfd, const char *path, const void *data, size_t n, mode_t mode)
{
	int fd = openat(dfd, path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);

	assert_true(fd >= 0);
	assert_int_equal(write(fd, data, n), (ssize_t)n);
	assert_int_equal(fchmod(fd, mode), 0);
	close(fd);
}

char *tu_read_file(int dfd, const char *path, size_t *n)
{
	struct stat st;
	int fd = openat(dfd, path, O_RDONLY | O_CLOEXEC);
	char *d;

	if (fd < 0)
		return NULL;
	assert_int_equal(fstat(fd, &st), 0);
	assert_non_null(d = malloc((size_t)st.st_size + 1));
	assert_int_equal(pread(fd, d, (size_t)st.st_size, 0), st.st_size);
	close(fd);
	d[st.st_size] = '\0';
	if (n)
		*n = (size_t)st.st_size;
	return d;
}

void tu_fill(uint8_t *p, size_t n, uint32_t seed)
{
	uint32_t x = seed | 1;

	for (size_t i = 0; i < n; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		p[i] = (uint8_t)x;
	}
}

uint32_t tu_rand(uint64_t *state, uint32_t n)
{
	*state ^= *state << 13;
	*state ^= *state >> 7;
	*state ^= *state << 17;
	return (uint32_t)(*state % n);
}

struct run {
	bool (*pred)(void *ud);
	void *ud;
};

static void run_check(struct loop *l, void *ud)
{
	struct run *r = ud;

	if (r->pred && r->pred(r->ud))
		loop_stop(l);
}

static void run_timeout(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

bool tu_run_until(struct loop *l, bool (*pred)(void *ud), void *ud, unsigned ms)
{
	struct run r = {pred, ud};
	uint64_t id = loop_add_timer(l, ms, run_timeout, NULL);

	loop_set_before_sleep(l, run_check, &r);
	if (!pred || !pred(ud))
		assert_int_equal(loop_run(l), 0);
	loop_set_before_sleep(l, NULL, NULL);
	loop_del_timer(l, id);
	return pred ? pred(ud) : true;
}

static bool chans_ready(void *ud)
{
	struct tu_chans *t = ud;

	return t->h && t->g && chan_is_ready(t->h) && chan_is_ready(t->g);
}

void tu_chans_new(struct tu_chans *t, uint32_t window, const struct chan_ops *hops, void *hud,
		  const struct chan_ops *gops, void *gud)
{
	int sv[2];

	memset(t, 0, sizeof(*t));
	assert_true(sodium_init() >= 0);
	assert_non_null(t->l = loop_new());
	randombytes_buf(t->hk.priv, sizeof(t->hk.priv));
	randombytes_buf(t->gk.priv, sizeof(t->gk.priv));
	assert_int_equal(noise_pubkey(t->hk.pub, t->hk.priv), 0);
	assert_int_equal(noise_pubkey(t->gk.pub, t->gk.priv), 0);
	assert_non_null(t->peers = chan_peers_new());
	assert_int_equal(chan_peers_allow(t->peers, t->hk.pub), 0);
	struct chan_cfg ch = {.role = NOISE_INITIATOR, .self = &t->hk, .peer = t->gk.pub, .window = window};
	struct chan_cfg cg = {.role = NOISE_RESPONDER, .self = &t->gk, .peers = t->peers, .window = window};
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv), 0);
	assert_non_null(t->h = chan_new(t->l, sv[0], &ch, hops, hud));
	assert_non_null(t->g = chan_new(t->l, sv[1], &cg, gops, gud));
	assert_true(tu_run_until(t->l, chans_ready, t, 5000));
}

void tu_chans_free(struct tu_chans *t)
{
	chan_free(t->h);
	chan_free(t->g);
	chan_peers_free(t->peers);
	loop_free(t->l);
	memset(t, 0, sizeof(*t));
}

void tu_chan_close_fails(struct chan *c, int err, const char *why, void *ud)
{
	(void)c;
	(void)ud;
	fail_msg("chan closed: %d %s", err, why ? why : "");
}

static void tunnel_done(struct tunnel *tun, void *ud)
{
	struct tu_tunnel *t = ud;
	struct tunnel_stats st;

	tunnel_get_stats(tun, &st);
	t->close_sent = st.close_sent;
	t->close_rcvd = st.close_rcvd;
	t->done = true;
	tunnel_free(tun);
	t->t = NULL;
}

const struct tunnel_ops tu_tunnel_ops = {.on_done = tunnel_done};

static void end_readable(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct tu_end *e = ud;
	ssize_t n = recv(fd, e->in + e->nin, sizeof(e->in) - 1 - e->nin, MSG_DONTWAIT);
	(void)events;

	if (n > 0) {
		e->nin += (size_t)n;
		e->in[e->nin] = '\0';
		return;
	}
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	e->eof = true;
	e->reset = n < 0;
	if (e->shut_on_eof)
		shutdown(fd, SHUT_WR);
	loop_del_fd(l, fd);
	e->reg = false;
}

void tu_end_watch(struct loop *l, struct tu_end *e, int fd)
{
	memset(e, 0, sizeof(*e));
	e->l = l;
	e->fd = fd;
	assert_int_equal(loop_add_fd(l, fd, EPOLLIN, end_readable, e), 0);
	e->reg = true;
}

void tu_end_close(struct tu_end *e)
{
	if (!e->l || e->fd < 0)
		return;
	if (e->reg)
		loop_del_fd(e->l, e->fd);
	e->reg = false;
	if (e->fd >= 0)
		close(e->fd);
	e->fd = -1;
}
