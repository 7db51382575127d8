/* SPDX-License-Identifier: Apache-2.0 */
/*
 * proxy: per-command loopback listeners whose connections travel to the
 * host's egress proxy as guest-opened channel streams (proxy.h).
 */
#include "airlock/guest/proxy.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/tunnel.h"
#include "airlock/core/wire.h"

#define ACCEPTS_PER_WAKEUP 16

struct pcmd {
	struct proxy *p;
	struct pcmd *next;
	uint32_t exec_stream;
	int lfd;	 /* -1 once the command ended */
	unsigned ntun;	 /* open tunnels of this command */
	uint64_t linger; /* timer after the end, while tunnels remain */
};

struct ptun {
	struct proxy *p;
	struct ptun *next;
	struct pcmd *cmd;
	struct tunnel *t;
	uint32_t stream;
};

struct proxy {
	struct loop *loop;
	struct chan *chan;
	struct pcmd *cmds;
	struct ptun *tuns;
	size_t ntun;
};

static void pcmd_free(struct pcmd *c)
{
	struct proxy *p = c->p;

	for (struct pcmd **pp = &p->cmds; *pp; pp = &(*pp)->next) {
		if (*pp == c) {
			*pp = c->next;
			break;
		}
	}
	if (c->lfd >= 0) {
		loop_del_fd(p->loop, c->lfd);
		close(c->lfd);
	}
	if (c->linger)
		loop_del_timer(p->loop, c->linger);
	mem_free(c);
}

static void ptun_unlink(struct ptun *pt)
{
	struct proxy *p = pt->p;

	for (struct ptun **pp = &p->tuns; *pp; pp = &(*pp)->next) {
		if (*pp == pt) {
			*pp = pt->next;
			break;
		}
	}
	p->ntun--;
	if (pt->cmd) {
		pt->cmd->ntun--;
		if (pt->cmd->lfd < 0 && pt->cmd->ntun == 0)
			pcmd_free(pt->cmd);
	}
}

static void on_tunnel_done(struct tunnel *t, void *ud)
{
	struct ptun *pt = ud;

	ptun_unlink(pt);
	tunnel_free(t);
	mem_free(pt);
}

static const struct tunnel_ops tun_ops = {.on_done = on_tunnel_done};

static void reset_close(int fd)
{
	struct linger lg = {.l_onoff = 1, .l_linger = 0};

	(void)setsockopt(fd, SOL_SOCKET, SO_LINGER, &lg, sizeof(lg));
	close(fd);
}

static void on_accept(struct loop *l, int lfd, uint32_t events, void *ud)
{
	struct pcmd *c = ud;
	struct proxy *p = c->p;
	(void)l;
	(void)events;

	for (int i = 0; i < ACCEPTS_PER_WAKEUP; i++) {
		int fd = accept4(lfd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC), one = 1, r;
		struct buf open;
		struct ptun *pt;
		uint32_t stream;

		if (fd < 0)
			return; /* EAGAIN or a transient error: level-triggered */
		if (c->ntun >= WIRE_PROXY_PER_CMD || p->ntun >= WIRE_PROXY_PER_SESSION || !chan_is_ready(p->chan)) {
			reset_close(fd);
			continue;
		}
		(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		if (!(pt = mem_calloc(1, sizeof(*pt))) || !(stream = chan_stream_open(p->chan, 0))) {
			mem_free(pt);
			reset_close(fd);
			continue;
		}
		pt->p = p;
		pt->cmd = c;
		pt->stream = stream;
		pt->next = p->tuns;
		p->tuns = pt;
		p->ntun++;
		c->ntun++;
		/* c still listens, so ptun_unlink cannot free it here;
		 * tunnel_new copies the PROXY_OPEN payload */
		buf_init(&open, 16);
		if ((r = wire_proxy_open_encode(&open, &(struct wire_proxy_open){.exec_stream = c->exec_stream})) < 0)
			reset_close(fd);
		else
			r = tunnel_new(p->loop, p->chan, stream, fd, buf_ptr(&open), buf_len(&open), &tun_ops, pt,
				       &pt->t);
		buf_clear(&open);
		if (r < 0) {
			chan_stream_close(p->chan, stream);
			ptun_unlink(pt);
			mem_free(pt);
		}
	}
}

int proxy_new(struct loop *l, struct chan *c, struct proxy **out)
{
	struct proxy *p = mem_calloc(1, sizeof(*p));

	*out = NULL;
	if (!p)
		return -ENOMEM;
	p->loop = l;
	p->chan = c;
	*out = p;
	return 0;
}

void proxy_free(struct proxy *p)
{
	if (!p)
		return;
	while (p->tuns) {
		struct ptun *pt = p->tuns;
		p->tuns = pt->next;
		tunnel_detach(pt->t);
		tunnel_free(pt->t);
		mem_free(pt);
	}
	while (p->cmds)
		pcmd_free(p->cmds);
	mem_free(p);
}

static struct pcmd *cmd_find(struct proxy *p, uint32_t exec_stream)
{
	for (struct pcmd *c = p->cmds; c; c = c->next)
		if (c->exec_stream == exec_stream && c->lfd >= 0)
			return c;
	return NULL;
}

int proxy_cmd_start(struct proxy *p, uint32_t exec_stream, uint16_t *port)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t len = sizeof(sin);
	struct pcmd *c;
	int fd, r;

	if (cmd_find(p, exec_stream))
		return -EEXIST;
	if ((fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0)) < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sin, sizeof(sin)) < 0 || listen(fd, 64) < 0 ||
	    getsockname(fd, (struct sockaddr *)&sin, &len) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	if (!(c = mem_calloc(1, sizeof(*c)))) {
		close(fd);
		return -ENOMEM;
	}
	c->p = p;
	c->exec_stream = exec_stream;
	c->lfd = fd;
	if ((r = loop_add_fd(p->loop, fd, EPOLLIN, on_accept, c)) < 0) {
		close(fd);
		mem_free(c);
		return r;
	}
	c->next = p->cmds;
	p->cmds = c;
	*port = ntohs(sin.sin_port);
	return 0;
}

static void on_linger(struct loop *l, void *ud)
{
	struct pcmd *c = ud;
	struct proxy *p = c->p;
	struct ptun *pt, *next;
	(void)l;

	c->linger = 0;
	/* Reset what is still open. A tunnel finishes (and may free c) only
	 * when the host's CLOSE comes back, never inside tunnel_abort unless
	 * that CLOSE is already in: walk with care. */
	for (pt = p->tuns; pt; pt = next) {
		next = pt->next;
		if (pt->cmd == c) {
			bool last = c->ntun == 1;
			tunnel_abort(pt->t, WIRE_PROXY_C_RESET);
			if (last)
				return;
		}
	}
}

void proxy_cmd_end(struct proxy *p, uint32_t exec_stream)
{
	struct pcmd *c;

	if (!p || !(c = cmd_find(p, exec_stream)))
		return;
	loop_del_fd(p->loop, c->lfd);
	close(c->lfd);
	c->lfd = -1;
	if (c->ntun == 0) {
		pcmd_free(c);
		return;
	}
	c->linger = loop_add_timer(p->loop, PROXY_LINGER_MS, on_linger, c);
}

int proxy_env(uint16_t port, char ***out)
{
	static const char *const url_names[] = {
	    "HTTP_PROXY",  "HTTPS_PROXY", "ALL_PROXY",	      "http_proxy",
	    "https_proxy", "all_proxy",	  "npm_config_proxy", "npm_config_https_proxy",
	    "PIP_PROXY",
	};
	char url[64], **v;
	size_t n = 0;

	_Static_assert(sizeof(url_names) / sizeof(url_names[0]) + 5 == PROXY_ENV_COUNT, "proxy_env count");
	*out = NULL;
	if (!(v = mem_calloc(PROXY_ENV_COUNT + 1, sizeof(*v))))
		return -ENOMEM;
	snprintf(url, sizeof(url), "http://127.0.0.1:%u", (unsigned)port);
	for (size_t i = 0; i < sizeof(url_names) / sizeof(url_names[0]); i++) {
		size_t len = strlen(url_names[i]) + 1 + strlen(url) + 1;
		if (!(v[n] = mem_alloc(len)))
			goto fail;
		snprintf(v[n++], len, "%s=%s", url_names[i], url);
	}
	/* loopback stays direct (and inside the guest) */
	if (!(v[n++] = mem_strdup("NO_PROXY=localhost,127.0.0.1,::1")) ||
	    !(v[n++] = mem_strdup("no_proxy=localhost,127.0.0.1,::1")) ||
	    /* git reads config from the environment (git >= 2.31) */
	    !(v[n++] = mem_strdup("GIT_CONFIG_COUNT=1")) || !(v[n++] = mem_strdup("GIT_CONFIG_KEY_0=http.proxy")))
		goto fail;
	{
		size_t len = sizeof("GIT_CONFIG_VALUE_0=") + strlen(url);
		if (!(v[n] = mem_alloc(len)))
			goto fail;
		snprintf(v[n++], len, "GIT_CONFIG_VALUE_0=%s", url);
	}
	*out = v;
	return 0;
fail:
	proxy_env_free(v);
	return -ENOMEM;
}

void proxy_env_free(char **env)
{
	if (!env)
		return;
	for (char **e = env; *e; e++)
		mem_free(*e);
	mem_free(env);
}

static struct ptun *tun_find(struct proxy *p, uint32_t stream)
{
	for (struct ptun *pt = p->tuns; pt; pt = pt->next)
		if (pt->stream == stream)
			return pt;
	return NULL;
}

int proxy_frame(struct proxy *p, uint8_t type, uint32_t stream, const uint8_t *data, size_t n)
{
	struct ptun *pt;

	/* streams we opened are even; the host never opens a proxy stream */
	if (!p || type == WIRE_PROXY_OPEN || (stream & 1) || !(pt = tun_find(p, stream)))
		return -EPROTO;
	return tunnel_frame(pt->t, type, data, n);
}

void proxy_writable(struct proxy *p)
{
	struct ptun *pt, *next;

	if (!p)
		return;
	for (pt = p->tuns; pt; pt = next) {
		next = pt->next; /* only pt itself can go away in the call */
		tunnel_writable(pt->t);
	}
}

size_t proxy_tunnels(const struct proxy *p)
{
	return p ? p->ntun : 0;
}
