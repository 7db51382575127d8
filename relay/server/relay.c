/* SPDX-License-Identifier: Apache-2.0 */
/*
 * relay: the per-workspace Unix socket server (protocol: doc/RELAY.md).
 * This file is the server object: the listening socket, accept and the
 * peer check, housekeeping, lifecycle. server_i.h lists the other files.
 *
 * Shape. Clients send request lines (client.c); each request is validated
 * (ops.c) and handed to the backend. Commands (cmd.c) are global to the
 * relay (keyed by the compact JSON of their request id), not to the client
 * that started them, so they outlive it. Output from the backend goes into
 * a per-command, per-stream ring holding the last ring_bytes bytes
 * (ring.c); offsets are absolute byte counts since the command started.
 *
 * Pull, not push. A client is joined to a command by a subscription (sub)
 * that holds a read cursor per stream. Events are produced from the rings
 * into the client's output queue only while that queue is below
 * client_queue bytes, so a client that stops reading costs at most one
 * queue and its cursors fall behind inside the ring. When any streaming
 * subscriber of a command lags more than half a ring, the relay asks the
 * backend to pause that command (ops->pause), and resumes it below a
 * quarter: a slow client stalls its own command, never the loop or the
 * other commands. A command with no subscriber runs freely; whatever falls
 * out of its ring is reported as `dropped` to whoever attaches later.
 *
 * Re-entrancy. Backend calls may arrive from inside ops calls (a backend
 * may answer exec_start synchronously). Everything that could free a
 * client or a command, and every ops->pause call, is therefore deferred to
 * a 0 ms housekeeping timer, which runs with nothing of ours on the stack.
 */
#include "airlock/server/relay.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "server_i.h"

/* ------------------------------------------------------------------ */
/* housekeeping: frees and pause changes, with nothing on the stack */

static void housekeeping(struct loop *l, void *ud);

#define CANCEL_RETRY_MS 20 /* a "cancel_on_close" cancel the backend could not take yet */

void relay_kick(struct relay *r)
{
	if (!r->hk_timer)
		r->hk_timer = loop_add_timer(r->l, 0, housekeeping, r);
}

static void cancel_retry(struct loop *l, void *ud)
{
	struct relay *r = ud;

	(void)l;
	r->cancel_timer = 0;
	relay_kick(r);
}

static void housekeeping(struct loop *l, void *ud)
{
	struct relay *r = ud;

	(void)l;
	r->hk_timer = 0;
	for (struct client *c = r->clients, *next; c; c = next) {
		next = c->next;
		if (c->dead)
			relay_client_free(c); /* its "cancel_on_close" commands: relay_cmd_orphan */
	}
	if (relay_cmd_cancel_due(r) && !r->cancel_timer)
		r->cancel_timer = loop_add_timer(r->l, CANCEL_RETRY_MS, cancel_retry, r);
	/* Bounded history: drop the oldest finished commands, preferring
	 * those nobody is reading. */
	while (r->nfinished > r->keep_finished) {
		struct relay_cmd *victim = NULL;
		for (struct relay_cmd *m = r->cmds; m; m = m->next) {
			if (!relay_cmd_ended(m))
				continue;
			if (!victim)
				victim = m;
			if (!m->subs) {
				victim = m;
				break;
			}
		}
		if (!victim)
			break;
		relay_cmd_free(victim);
	}
	for (struct relay_cmd *m = r->cmds; m; m = m->next) {
		if (m->live && m->pause_want != m->pause_told) {
			m->pause_told = m->pause_want;
			if (r->ops->pause)
				r->ops->pause(r->ud, m, m->pause_told);
			if (r->hk_timer)
				break; /* the backend re-entered; finish next round */
		}
	}
}

/* ------------------------------------------------------------------ */
/* accepting */

/* Best effort single line to a connection we are about to close. */
void relay_refuse(int fd, const char *code, const char *msg)
{
	json_t *ev = json_pack("{s:s, s:s, s:s}", "event", "error", "code", code, "message", msg);
	char *s = ev ? json_dumps(ev, JSON_COMPACT) : NULL;

	if (s) {
		size_t n = strlen(s);
		s[n] = '\n'; /* replaces the NUL; we send n + 1 bytes, never read it as a string again */
		ssize_t w = send(fd, s, n + 1, MSG_NOSIGNAL | MSG_DONTWAIT);
		(void)w;
	}
	mem_free(s);
	json_decref(ev);
	close(fd);
}

/* Only our own uid may talk to the relay (doc/RELAY.md "The socket"):
 * false after refusing the connection. */
static bool peer_ok(int fd)
{
	struct ucred cr;
	socklen_t crl = sizeof(cr);
	char msg[160];

	if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &crl) == 0 && cr.uid == geteuid())
		return true;
	snprintf(msg, sizeof(msg), "this relay serves uid %u only; connection from uid %d refused", (unsigned)geteuid(),
		 crl == sizeof(cr) ? (int)cr.uid : -1);
	relay_refuse(fd, "forbidden_peer", msg);
	return false;
}

static void accept_cb(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct relay *r = ud;

	(void)l;
	(void)events;
	for (int k = 0; k < 16; k++) {
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (cfd < 0)
			return;
		if (!peer_ok(cfd))
			continue;
		if (r->nclients >= r->max_clients) {
			relay_refuse(cfd, "busy", "too many clients connected to this relay; close one and retry");
			continue;
		}
		relay_client_new(r, cfd);
	}
}

/* ------------------------------------------------------------------ */
/* socket */

/* Does anything accept on the socket at sa? 0 no (refused, gone),
 * -EADDRINUSE yes, else -errno. */
static int probe_socket(const struct sockaddr_un *sa)
{
	int probe = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (probe < 0)
		return -errno;
	int r = connect(probe, (const struct sockaddr *)sa, sizeof(*sa));
	int e = errno;
	close(probe);
	if (r == 0 || e == EAGAIN)
		return -EADDRINUSE;
	return e == ECONNREFUSED || e == ENOENT ? 0 : -e;
}

static int listen_socket(const char *path, int *out)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct stat st;
	int fd = -1, r;

	if (strlen(path) >= sizeof(sa.sun_path))
		return -ENAMETOOLONG;
	memcpy(sa.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0) {
		if (!S_ISSOCK(st.st_mode))
			return -EEXIST;
		/* Replace it only if nothing accepts on it. */
		if ((r = probe_socket(&sa)) < 0)
			return r;
		if (unlink(path) < 0 && errno != ENOENT)
			return -errno;
	} else if (errno != ENOENT) {
		return -errno;
	}
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	/* The socket appears with the umask's mode for an instant; in the
	 * default 0700 directory nobody else can reach it, and the peer uid
	 * check stands behind the mode anyway. */
	if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		goto fail;
	if (chmod(path, 0600) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		unlink(path);
		close(fd);
		return r;
	}
	*out = fd;
	return 0;
fail:
	r = -errno;
	close(fd);
	return r;
}

int relay_new(struct loop *l, const struct relay_cfg *cfg, const struct relay_backend_ops *ops, void *ud,
	      struct relay **out)
{
	struct relay *r;
	int rc;

	*out = NULL;
	if (!cfg || !cfg->path || !ops || !ops->exec_start || !ops->stdin_write || !ops->signal || !ops->resize ||
	    !ops->cancel || !ops->sync_wait)
		return -EINVAL;
	if (!(r = mem_calloc(1, sizeof(*r))))
		return -ENOMEM;
	r->l = l;
	r->fd = -1;
	r->ops = ops;
	r->ud = ud;
	r->timeout_s = cfg->timeout_s ? cfg->timeout_s : RELAY_DEFAULT_TIMEOUT_S;
	r->line_max = cfg->line_max ? cfg->line_max : RELAY_LINE_MAX;
	r->ring_bytes = cfg->ring_bytes ? cfg->ring_bytes : RELAY_RING_BYTES;
	r->queue = cfg->client_queue ? cfg->client_queue : RELAY_CLIENT_QUEUE;
	r->max_clients = cfg->max_clients ? cfg->max_clients : RELAY_MAX_CLIENTS;
	r->max_running = cfg->max_running ? cfg->max_running : RELAY_MAX_RUNNING;
	r->keep_finished = cfg->keep_finished ? cfg->keep_finished : RELAY_KEEP_FINISHED;
	if (!(r->path = mem_strdup(cfg->path))) {
		rc = -ENOMEM;
		goto fail;
	}
	if ((rc = listen_socket(r->path, &r->fd)) < 0)
		goto fail;
	if ((rc = loop_add_fd(l, r->fd, EPOLLIN, accept_cb, r)) < 0) {
		unlink(r->path);
		goto fail;
	}
	*out = r;
	return 0;
fail:
	if (r->fd >= 0)
		close(r->fd);
	mem_free(r->path);
	mem_free(r);
	return rc;
}

void relay_free(struct relay *r)
{
	if (!r)
		return;
	while (r->clients)
		relay_client_free(r->clients);
	while (r->syncs) {
		struct pending_sync *ps = r->syncs;
		r->syncs = ps->next;
		json_decref(ps->id);
		mem_free(ps);
	}
	while (r->cmds) {
		struct relay_cmd *m = r->cmds;
		if (m->live && r->ops->release)
			r->ops->release(r->ud, m);
		m->live = false;
		relay_cmd_free(m);
	}
	if (r->hk_timer)
		loop_del_timer(r->l, r->hk_timer);
	if (r->cancel_timer)
		loop_del_timer(r->l, r->cancel_timer);
	if (r->fd >= 0) {
		loop_del_fd(r->l, r->fd);
		close(r->fd);
		unlink(r->path);
	}
	mem_free(r->path);
	mem_free(r);
}

const char *relay_path(const struct relay *r)
{
	return r->path;
}

void relay_get_stats(const struct relay *r, struct relay_stats *st)
{
	memset(st, 0, sizeof(*st));
	st->clients = r->nclients;
	st->running = r->nrunning;
	st->finished = r->nfinished;
	for (const struct relay_cmd *m = r->cmds; m; m = m->next) {
		st->bytes_buffered += m->ring[0].cap + m->ring[1].cap;
		if (m->pause_told)
			st->paused++;
	}
	for (const struct client *c = r->clients; c; c = c->next)
		st->bytes_buffered += c->in.cap + c->out.cap;
}

/* ------------------------------------------------------------------ */
/* default path */

static int private_dir(const char *dir)
{
	struct stat st;

	if (mkdir(dir, 0700) < 0 && errno != EEXIST)
		return -errno;
	if (lstat(dir, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & (S_IWGRP | S_IWOTH)))
		return -EPERM;
	return 0;
}

int relay_sweep_stale(const char *sock_path, unsigned *removed)
{
	char dir[PATH_MAX];
	const char *slash = strrchr(sock_path, '/');
	struct dirent *d;
	DIR *dp;

	*removed = 0;
	if (!slash || (size_t)(slash - sock_path) >= sizeof(dir))
		return -EINVAL;
	memcpy(dir, sock_path, (size_t)(slash - sock_path));
	dir[slash - sock_path] = '\0';
	if (!dir[0] || private_dir(dir) < 0) /* only our own 0700 directory */
		return -EPERM;
	if (!(dp = opendir(dir)))
		return -errno;
	while ((d = readdir(dp))) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		struct stat st;
		size_t len = strlen(d->d_name);
		if (len < 6 || strcmp(d->d_name + len - 5, ".sock") ||
		    (size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s/%s", dir, d->d_name) >= sizeof(sa.sun_path))
			continue;
		/* a socket of ours (never a symlink), on which nothing accepts;
		 * not one made in the last seconds (bound, not yet listening) */
		if (fstatat(dirfd(dp), d->d_name, &st, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISSOCK(st.st_mode) ||
		    st.st_uid != geteuid() || st.st_ctime > time(NULL) - 2 || probe_socket(&sa) != 0)
			continue;
		if (unlinkat(dirfd(dp), d->d_name, 0) == 0)
			(*removed)++;
	}
	closedir(dp);
	return 0;
}

int relay_default_path(const char *workspace_realpath, char *out, size_t n)
{
	const char *env = getenv("AIRLOCK_SOCKET");
	const char *xdg = getenv("XDG_RUNTIME_DIR");
	char dir[PATH_MAX], run[64], name[33];
	unsigned char h[crypto_hash_sha256_BYTES];
	struct stat st;
	uid_t uid = geteuid();
	int rc, k;

	if (env && *env) {
		if (strlen(env) >= n || strlen(env) >= sizeof(((struct sockaddr_un *)0)->sun_path))
			return -ENAMETOOLONG;
		memcpy(out, env, strlen(env) + 1);
		return 0;
	}
	snprintf(run, sizeof(run), "/run/user/%u", (unsigned)uid);
	if (xdg && xdg[0] == '/')
		k = snprintf(dir, sizeof(dir), "%s/airlock", xdg);
	else if (stat(run, &st) == 0 && S_ISDIR(st.st_mode))
		k = snprintf(dir, sizeof(dir), "%s/airlock", run);
	else
		k = snprintf(dir, sizeof(dir), "/tmp/airlock-%u", (unsigned)uid);
	if (k < 0 || (size_t)k >= sizeof(dir))
		return -ENAMETOOLONG;

	/* <name>: the workspace's base name, made safe and short. */
	const char *base = strrchr(workspace_realpath, '/');
	base = base && base[1] ? base + 1 : workspace_realpath;
	size_t j = 0;
	for (size_t i = 0; base[i] && j < sizeof(name) - 1; i++) {
		char ch = base[i];
		bool ok = (ch >= 'a' && ch <= 'z') || (ch >= 'A' && ch <= 'Z') || (ch >= '0' && ch <= '9') ||
			  ch == '-' || ch == '_' || ch == '.';
		name[j++] = ok ? ch : '_';
	}
	name[j] = '\0';
	if (!j)
		memcpy(name, "w", 2);
	else if (name[0] == '.')
		name[0] = '_';
	crypto_hash_sha256(h, (const unsigned char *)workspace_realpath, strlen(workspace_realpath));

	k = snprintf(out, n, "%s/%s-%02x%02x%02x%02x%02x%02x%02x%02x.sock", dir, name, h[0], h[1], h[2], h[3], h[4],
		     h[5], h[6], h[7]);
	if (k < 0 || (size_t)k >= n || (size_t)k >= sizeof(((struct sockaddr_un *)0)->sun_path))
		return -ENAMETOOLONG;
	if ((rc = private_dir(dir)) < 0)
		return rc;
	return 0;
}
