/* SPDX-License-Identifier: Apache-2.0 */
/*
 * keep: the supervisor's side of a mount's node stream (contract in
 * include/airlock/mount/keep.h).
 */
#include "airlock/mount/keep.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "airlock/core/mem.h"

struct node {
	uint64_t nodeid;
	int fd;
	struct node *next;
};

struct mount_keep {
	int fuse_fd;
	void *init;
	size_t init_len;
	struct node **buckets;
	size_t nbuckets, n; /* nbuckets: power of two */
	struct mount_kept *list;
};

struct mount_keep *mount_keep_new(void)
{
	struct mount_keep *k = mem_calloc(1, sizeof(*k));

	if (!k)
		return NULL;
	k->fuse_fd = -1;
	k->nbuckets = 1024;
	if (!(k->buckets = mem_calloc(k->nbuckets, sizeof(*k->buckets)))) {
		mem_free(k);
		return NULL;
	}
	return k;
}

static size_t bucket(const struct mount_keep *k, uint64_t id)
{
	id *= 0x9e3779b97f4a7c15ull;
	return (size_t)(id ^ (id >> 31)) & (k->nbuckets - 1);
}

static void grow(struct mount_keep *k)
{
	size_t i, n = k->nbuckets * 2;
	struct node **nb = mem_calloc(n, sizeof(*nb)), **old = k->buckets;
	size_t oldn = k->nbuckets;

	if (!nb)
		return; /* longer chains, still correct */
	k->buckets = nb;
	k->nbuckets = n;
	for (i = 0; i < oldn; i++) {
		struct node *e, *next;
		for (e = old[i]; e; e = next) {
			size_t b = bucket(k, e->nodeid);
			next = e->next;
			e->next = nb[b];
			nb[b] = e;
		}
	}
	mem_free(old);
}

static void drop(struct mount_keep *k, uint64_t id)
{
	struct node **pp, *e;

	for (pp = &k->buckets[bucket(k, id)]; (e = *pp); pp = &e->next) {
		if (e->nodeid == id) {
			*pp = e->next;
			close(e->fd);
			mem_free(e);
			k->n--;
			return;
		}
	}
}

/* fd is taken (closed when it cannot be kept). A node id added again (the
 * server reused an address after the kernel forgot it) replaces the old. */
static void add(struct mount_keep *k, uint64_t id, int fd)
{
	struct node *e;

	drop(k, id);
	if (!(e = mem_alloc(sizeof(*e)))) {
		close(fd);
		return;
	}
	if (k->n >= k->nbuckets * 2)
		grow(k);
	e->nodeid = id;
	e->fd = fd;
	e->next = k->buckets[bucket(k, id)];
	k->buckets[bucket(k, id)] = e;
	k->n++;
}

static void close_fds(const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		close(fds[i]);
}

static int take_conn(struct mount_keep *k, const char *data, size_t len, const int *fds, size_t nfd)
{
	void *init;

	if (nfd != 1 || len == 0 || len > KEEP_INIT_MAX || !(init = mem_alloc(len)))
		return -EPROTO;
	memcpy(init, data, len);
	if (k->fuse_fd >= 0)
		close(k->fuse_fd);
	mem_free(k->init);
	k->fuse_fd = fds[0];
	k->init = init;
	k->init_len = len;
	return 1;
}

static int take_nodes(struct mount_keep *k, const char *data, size_t len, size_t nrec, const int *fds, size_t nfd)
{
	struct keep_rec r;
	size_t i, adds = 0, f = 0;

	if (nrec > KEEP_BATCH || len != nrec * sizeof(r))
		return -EPROTO;
	for (i = 0; i < nrec; i++) {
		memcpy(&r, data + i * sizeof(r), sizeof(r));
		if (r.op != KEEP_ADD && r.op != KEEP_DROP)
			return -EPROTO;
		adds += r.op == KEEP_ADD;
	}
	if (adds != nfd)
		return -EPROTO;
	for (i = 0; i < nrec; i++) {
		memcpy(&r, data + i * sizeof(r), sizeof(r));
		if (r.op == KEEP_ADD)
			add(k, r.nodeid, fds[f++]);
		else
			drop(k, r.nodeid);
	}
	return 1;
}

int mount_keep_recv(struct mount_keep *k, int sock)
{
	char data[sizeof(struct keep_msg) + KEEP_INIT_MAX];
	char cbuf[CMSG_SPACE(KEEP_BATCH * sizeof(int))];
	struct iovec iov = {.iov_base = data, .iov_len = sizeof(data)};
	struct msghdr mh = {.msg_iov = &iov, .msg_iovlen = 1, .msg_control = cbuf, .msg_controllen = sizeof(cbuf)};
	int fds[KEEP_BATCH];
	size_t nfd = 0;
	struct keep_msg h;
	struct cmsghdr *c;
	ssize_t n;
	int r;

	if ((n = recvmsg(sock, &mh, MSG_CMSG_CLOEXEC)) < 0)
		return -errno;
	for (c = CMSG_FIRSTHDR(&mh); c; c = CMSG_NXTHDR(&mh, c)) {
		size_t cnt;
		if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS || c->cmsg_len < CMSG_LEN(0))
			continue;
		cnt = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
		for (size_t i = 0; i < cnt; i++) {
			int fd;
			memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof(int));
			if (nfd < KEEP_BATCH)
				fds[nfd++] = fd;
			else
				close(fd);
		}
	}
	if (n == 0 && nfd == 0)
		return 0;
	if ((size_t)n < sizeof(h) || (mh.msg_flags & (MSG_TRUNC | MSG_CTRUNC))) {
		close_fds(fds, nfd);
		return -EPROTO;
	}
	memcpy(&h, data, sizeof(h));
	if (h.type == KEEP_CONN && h.n == (size_t)n - sizeof(h))
		r = take_conn(k, data + sizeof(h), h.n, fds, nfd);
	else if (h.type == KEEP_NODES)
		r = take_nodes(k, data + sizeof(h), (size_t)n - sizeof(h), h.n, fds, nfd);
	else
		r = -EPROTO;
	if (r < 0)
		close_fds(fds, nfd);
	return r;
}

int mount_keep_conn(const struct mount_keep *k, const void **init, size_t *len)
{
	*init = k->init;
	*len = k->init_len;
	return k->fuse_fd;
}

const struct mount_kept *mount_keep_list(struct mount_keep *k, size_t *n)
{
	size_t i, j = 0;

	mem_free(k->list);
	*n = 0;
	if (!(k->list = mem_calloc(k->n ? k->n : 1, sizeof(*k->list))))
		return NULL;
	for (i = 0; i < k->nbuckets; i++)
		for (struct node *e = k->buckets[i]; e; e = e->next)
			k->list[j++] = (struct mount_kept){.nodeid = e->nodeid, .fd = e->fd};
	*n = j;
	return k->list;
}

void mount_keep_release(struct mount_keep *k)
{
	size_t i;

	if (k->fuse_fd >= 0)
		close(k->fuse_fd);
	k->fuse_fd = -1;
	for (i = 0; i < k->nbuckets; i++) {
		struct node *e, *next;
		for (e = k->buckets[i]; e; e = next) {
			next = e->next;
			close(e->fd);
			mem_free(e);
		}
		k->buckets[i] = NULL;
	}
	k->n = 0;
}

void mount_keep_free(struct mount_keep *k)
{
	if (!k)
		return;
	mount_keep_release(k);
	mem_free(k->list);
	mem_free(k->init);
	mem_free(k->buckets);
	mem_free(k);
}
