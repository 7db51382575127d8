/* SPDX-License-Identifier: Apache-2.0 */
/*
 * egress: the proxy runtime. Listeners, one struct conn per client
 * connection, a bounded resolver thread pool, and the byte relay.
 *
 * A connection walks C_HEAD -> C_RESOLVE -> C_CONNECT -> (C_HELLO for
 * CONNECT) -> C_RELAY, or to C_CLOSING from anywhere when it is refused or
 * fails. While resolving and connecting the client is not read, so its
 * bytes wait in the kernel. In C_RELAY each direction has one buffer of at
 * most EGRESS_BUF_MAX bytes; a side is read only while the buffer it fills
 * has room (backpressure), and written while the other side's buffer has
 * bytes.
 *
 * Resolver threads never touch a conn: a job carries the name in and the
 * addresses out; job->conn is read and written only on the loop thread, so
 * a connection that closes while its lookup runs just forgets the job.
 */
#include "airlock/core/errmsg.h"
#include "airlock/egress/egress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

#define LISTENERS_MAX	  8
#define SWEEP_MS	  250
#define LINGER_MS	  2000 /* after a refusal: drain the client so our reply is not lost to a RST */
#define MSG_MAX		  1024
#define HOSTS_FILE_MAX	  (1u << 20)
#define HOSTS_ENTRIES_MAX 4096

enum conn_state { C_HEAD, C_RESOLVE, C_CONNECT, C_HELLO, C_RELAY, C_CLOSING };

struct listener {
	struct egress *e;
	int fd;
	char *client;
	char *path; /* Unix socket to unlink, or NULL */
};

struct job {
	struct job *next;
	struct conn *conn; /* loop thread only; NULL once the conn is gone */
	char name[EGRESS_HOST_MAX + 1];
	int err; /* 0, or a getaddrinfo EAI_* code */
	size_t n;
	struct sockaddr_storage addrs[EGRESS_ADDRS_MAX];
	socklen_t lens[EGRESS_ADDRS_MAX];
	bool own[EGRESS_ADDRS_MAX]; /* addrs[i] is an address of the host's own interfaces */
	int own_err;		    /* 0, or the errno of reading them */
};

struct conn {
	struct egress *e;
	struct conn *prev, *next;
	const char *client; /* the listener's identity, or own_client */
	char *own_client;   /* adopted connections: their own identity */
	uint64_t client_id; /* egress_adopt's id; 0 for accepted connections */
	enum conn_state st;
	int cfd, ufd;
	uint32_t cev, uev; /* events currently registered */
	struct buf in;	   /* client -> upstream */
	struct buf out;	   /* upstream -> client, and our own replies */
	char method[17];
	char host[EGRESS_HOST_MAX + 1];
	uint16_t port;
	bool explicit_port; /* the allow entry that matched names this port */
	struct job *job;
	struct sockaddr_storage addrs[EGRESS_ADDRS_MAX];
	socklen_t lens[EGRESS_ADDRS_MAX];
	size_t naddrs, next_addr;
	int last_connect_err;
	uint64_t deadline_ms;
	bool c_eof, u_eof;	/* read side saw EOF */
	bool c_shut, u_shut;	/* we shut down our write side */
	bool drain_after_flush; /* C_CLOSING: flush out, shut down, drain */
	bool u_parked;		/* ufd taken off the loop, see on_upstream */
};

struct hosts_entry {
	char *name;
	struct sockaddr_storage addr;
	socklen_t len;
};

struct cidr {
	uint8_t net[16];
	unsigned prefix;
};

struct egress {
	struct loop *loop;
	struct egress_ops ops;
	void *ud;

	struct policy_host *allow;
	size_t n_allow;
	struct cidr *cidrs;
	size_t n_cidrs;
	struct hosts_entry *hosts; /* read-only after egress_new: shared with workers */
	size_t n_hosts;
	bool use_hosts;

	unsigned max_conns, head_timeout_ms, connect_timeout_ms, idle_timeout_ms;

	struct listener listeners[LISTENERS_MAX];
	size_t n_listeners;

	struct conn *conns;
	size_t n_conns;
	uint64_t sweep_timer;

	/* resolver pool */
	int evfd;
	pthread_t *threads;
	unsigned n_threads;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	struct job *pending, **pending_tail; /* protected by lock */
	struct job *done;		     /* protected by lock */
	bool stopping;			     /* protected by lock */
};

static void conn_update(struct conn *c);
static void conn_close(struct conn *c);
static void on_client(struct loop *l, int fd, uint32_t events, void *ud);
static void on_upstream(struct loop *l, int fd, uint32_t events, void *ud);

static uint64_t wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

static void addr_str(const struct sockaddr *sa, char *s, size_t n)
{
	const void *p = sa->sa_family == AF_INET ? (const void *)&((const struct sockaddr_in *)sa)->sin_addr
						 : (const void *)&((const struct sockaddr_in6 *)sa)->sin6_addr;

	if (!inet_ntop(sa->sa_family, p, s, (socklen_t)n))
		snprintf(s, n, "?");
}

/* ============================== resolver ============================== */

static int hosts_lookup(const struct egress *e, struct job *j)
{
	for (size_t i = 0; i < e->n_hosts && j->n < EGRESS_ADDRS_MAX; i++) {
		if (strcmp(e->hosts[i].name, j->name) != 0)
			continue;
		memcpy(&j->addrs[j->n], &e->hosts[i].addr, e->hosts[i].len);
		j->lens[j->n++] = e->hosts[i].len;
	}
	return j->n ? 0 : EAI_NONAME;
}

static int dns_lookup(struct job *j)
{
	struct addrinfo hints = {.ai_family = AF_UNSPEC, .ai_socktype = SOCK_STREAM};
	struct addrinfo *res = NULL, *ai;
	int r = getaddrinfo(j->name, NULL, &hints, &res);

	if (r)
		return r;
	for (ai = res; ai && j->n < EGRESS_ADDRS_MAX; ai = ai->ai_next) {
		if ((ai->ai_family != AF_INET && ai->ai_family != AF_INET6) || ai->ai_addrlen > sizeof(j->addrs[0]))
			continue;
		memcpy(&j->addrs[j->n], ai->ai_addr, ai->ai_addrlen);
		j->lens[j->n++] = ai->ai_addrlen;
	}
	freeaddrinfo(res);
	return j->n ? 0 : EAI_NONAME;
}

/* Which of the job's addresses belong to the host's own interfaces, read
 * now (an address added since the last lookup counts). getifaddrs asks the
 * kernel over netlink: done here, on the resolver thread, not the loop. */
static void mark_own(struct job *j)
{
	struct ifaddrs *ifs = NULL;

	if (getifaddrs(&ifs) < 0) {
		j->own_err = errno;
		return;
	}
	for (size_t i = 0; i < j->n; i++) {
		uint8_t mine[EGRESS_ADDR_FORMS_MAX][16], theirs[EGRESS_ADDR_FORMS_MAX][16];
		size_t nm = egress_addr_forms((const struct sockaddr *)&j->addrs[i], mine);

		for (struct ifaddrs *f = ifs; f && !j->own[i]; f = f->ifa_next) {
			size_t nt = f->ifa_addr ? egress_addr_forms(f->ifa_addr, theirs) : 0;
			for (size_t a = 0; a < nm; a++)
				for (size_t b = 0; b < nt; b++)
					j->own[i] |= memcmp(mine[a], theirs[b], 16) == 0;
		}
	}
	freeifaddrs(ifs);
}

static void *resolver_main(void *arg)
{
	struct egress *e = arg;

	for (;;) {
		struct job *j;
		uint64_t one = 1;

		pthread_mutex_lock(&e->lock);
		while (!e->stopping && !e->pending)
			pthread_cond_wait(&e->cond, &e->lock);
		if (e->stopping) {
			pthread_mutex_unlock(&e->lock);
			return NULL;
		}
		j = e->pending;
		e->pending = j->next;
		if (!e->pending)
			e->pending_tail = &e->pending;
		pthread_mutex_unlock(&e->lock);

		j->err = e->use_hosts ? hosts_lookup(e, j) : dns_lookup(j);
		if (!j->err)
			mark_own(j);

		pthread_mutex_lock(&e->lock);
		j->next = e->done;
		e->done = j;
		pthread_mutex_unlock(&e->lock);
		if (write(e->evfd, &one, sizeof(one)) < 0) {
			/* the counter cannot overflow at our rates; nothing to do */
		}
	}
}

static int submit_lookup(struct conn *c)
{
	struct egress *e = c->e;
	struct job *j = mem_calloc(1, sizeof(*j));

	if (!j)
		return -ENOMEM;
	j->conn = c;
	snprintf(j->name, sizeof(j->name), "%s", c->host);
	c->job = j;
	pthread_mutex_lock(&e->lock);
	*e->pending_tail = j;
	e->pending_tail = &j->next;
	pthread_cond_signal(&e->cond);
	pthread_mutex_unlock(&e->lock);
	return 0;
}

static void lookup_done(struct conn *c, struct job *j);

static void on_resolved(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct egress *e = ud;
	struct job *list, *next;
	uint64_t v;

	(void)l;
	(void)events;
	if (read(fd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		return;
	pthread_mutex_lock(&e->lock);
	list = e->done;
	e->done = NULL;
	pthread_mutex_unlock(&e->lock);
	for (; list; list = next) {
		next = list->next;
		if (list->conn) {
			list->conn->job = NULL;
			lookup_done(list->conn, list);
		}
		mem_free(list);
	}
}

/* ============================== replies ============================== */

static const char *reason_phrase(enum egress_reason r)
{
	switch (r) {
	case EGRESS_NOT_ALLOWED:
		return "host not on egress.allow";
	case EGRESS_PORT_NOT_ALLOWED:
		return "port not allowed for this host by egress.allow (an entry without :port allows 80 and 443)";
	case EGRESS_IP_LITERAL:
		return "IP address literals are refused, use a host name on egress.allow";
	case EGRESS_PRIVATE_ADDRESS:
		return "resolves to a non-public address";
	case EGRESS_METADATA:
		return "cloud metadata endpoint";
	case EGRESS_SNI_MISMATCH:
		return "TLS server name differs from the CONNECT host";
	case EGRESS_NO_SNI:
		return "TLS ClientHello without a server name";
	case EGRESS_NOT_TLS:
		return "tunnel must start with TLS (list host:PORT in egress.allow for other protocols)";
	case EGRESS_BAD_REQUEST:
		return "bad request";
	case EGRESS_HOST_ADDRESS:
		return "resolves to an address of the host itself";
	}
	return "refused";
}

/* Queue a complete HTTP response with a one-line text body and switch to
 * C_CLOSING. The client is not read any more, except to drain it once the
 * reply is out. */
static void reply_and_close(struct conn *c, const char *status, const char *line)
{
	char head[256];
	int hn = snprintf(head, sizeof(head),
			  "HTTP/1.1 %s\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Length: %zu\r\n"
			  "Connection: close\r\n\r\n",
			  status, strlen(line) + 1);

	buf_reset(&c->out);
	if (hn < 0 || buf_put(&c->out, head, (size_t)hn) < 0 || buf_put(&c->out, line, strlen(line)) < 0 ||
	    buf_put(&c->out, "\n", 1) < 0) {
		conn_close(c);
		return;
	}
	c->st = C_CLOSING;
	c->drain_after_flush = true;
	c->deadline_ms = loop_now_ms() + LINGER_MS;
	conn_update(c);
}

static void deny(struct conn *c, enum egress_reason reason, const char *detail)
{
	struct egress *e = c->e;
	char msg[MSG_MAX], what[320];
	struct egress_denial d;

	if (c->method[0] && c->host[0])
		snprintf(what, sizeof(what), "%s %s:%u", c->method, c->host, c->port);
	else if (c->method[0])
		snprintf(what, sizeof(what), "%s", c->method);
	else
		snprintf(what, sizeof(what), "request");
	if (detail && *detail)
		snprintf(msg, sizeof(msg), "airlock egress: denied %s: %s: %s", what, reason_phrase(reason), detail);
	else
		snprintf(msg, sizeof(msg), "airlock egress: denied %s: %s", what, reason_phrase(reason));

	d.time_ms = wall_ms();
	d.client = c->client;
	d.client_id = c->client_id;
	d.method = c->method;
	d.host = c->host;
	d.port = c->port;
	d.reason = reason;
	d.detail = detail ? detail : "";
	d.message = msg;
	if (e->ops.on_denial)
		e->ops.on_denial(e->ud, &d);

	if (c->ufd >= 0) {
		loop_del_fd(e->loop, c->ufd);
		close(c->ufd);
		c->ufd = -1;
	}
	if (c->st == C_HELLO || c->st == C_RELAY) {
		/* The client already got "200" and speaks TLS: the only thing
		 * it can understand is a fatal access_denied(49) alert. */
		static const uint8_t alert[] = {21, 3, 3, 0, 2, 2, 49};

		/* after whatever is still queued, such as the 200 itself */
		buf_reset(&c->in);
		if (buf_put(&c->out, alert, sizeof(alert)) < 0) {
			conn_close(c);
			return;
		}
		c->st = C_CLOSING;
		c->drain_after_flush = true;
		c->deadline_ms = loop_now_ms() + LINGER_MS;
		conn_update(c);
		return;
	}
	buf_reset(&c->in);
	reply_and_close(c, "403 Forbidden", msg);
}

/* Not a policy refusal (resolution or connection failed): 502/504. */
static void fail(struct conn *c, const char *status, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(struct conn *c, const char *status, const char *fmt, ...)
{
	char msg[MSG_MAX], why[256];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	snprintf(msg, sizeof(msg), "airlock egress: %s %s:%u: %s", c->method, c->host, c->port, why);
	if (c->ufd >= 0) {
		loop_del_fd(c->e->loop, c->ufd);
		close(c->ufd);
		c->ufd = -1;
	}
	if (c->st == C_HELLO || c->st == C_RELAY) {
		conn_close(c);
		return;
	}
	buf_reset(&c->in);
	reply_and_close(c, status, msg);
}

/* ============================== the request ============================== */

static bool is_hop_by_hop(const struct egress_header *h)
{
	static const char *const names[] = {
	    "connection", "proxy-connection", "keep-alive", "proxy-authorization", "proxy-authenticate",
	    "te",	  "trailer",	      "upgrade"};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (h->name_len == strlen(names[i]) && strncasecmp(h->name, names[i], h->name_len) == 0)
			return true;
	return false;
}

/* Replace the head in c->in by the origin-form request sent upstream,
 * keeping any body bytes that followed it. */
static int rewrite_head(struct conn *c, const struct egress_request *req)
{
	struct buf nb;
	int r;
	char line[64];

	buf_init(&nb, EGRESS_BUF_MAX + EGRESS_HEAD_MAX);
	if ((r = buf_put(&nb, req->method, strlen(req->method))) < 0 || (r = buf_put(&nb, " ", 1)) < 0 ||
	    (r = buf_put(&nb, req->path, req->path_len)) < 0 || (r = buf_put(&nb, " ", 1)) < 0 ||
	    (r = buf_put(&nb, req->version, 8)) < 0 || (r = buf_put(&nb, "\r\n", 2)) < 0)
		goto out;
	for (size_t i = 0; i < req->n_headers; i++) {
		const struct egress_header *h = &req->headers[i];

		if (is_hop_by_hop(h))
			continue;
		if ((r = buf_put(&nb, h->name, h->name_len)) < 0 || (r = buf_put(&nb, ": ", 2)) < 0 ||
		    (r = buf_put(&nb, h->value, h->value_len)) < 0 || (r = buf_put(&nb, "\r\n", 2)) < 0)
			goto out;
	}
	snprintf(line, sizeof(line), "Connection: close\r\n\r\n");
	if ((r = buf_put(&nb, line, strlen(line))) < 0)
		goto out;
	if ((r = buf_put(&nb, buf_ptr(&c->in) + req->head_len, buf_len(&c->in) - req->head_len)) < 0)
		goto out;
	buf_clear(&c->in);
	c->in = nb;
	return 0;
out:
	buf_clear(&nb);
	return r;
}

static bool is_metadata_name(const char *host)
{
	static const char *const names[] = {"metadata.google.internal", "metadata.goog", "metadata", "instance-data",
					    "instance-data.ec2.internal"};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strcmp(host, names[i]) == 0)
			return true;
	return false;
}

static void step_head(struct conn *c)
{
	struct egress *e = c->e;
	struct egress_request *req;
	const struct policy_host *which = NULL;
	const char *why;
	int r;

	req = mem_alloc(sizeof(*req));
	if (!req) {
		conn_close(c);
		return;
	}
	r = egress_parse_request(buf_ptr(&c->in), buf_len(&c->in), req, &why);
	if (r == 0) {
		conn_update(c);
		goto out;
	}
	memcpy(c->method, req->method, sizeof(c->method));
	memcpy(c->host, req->host, sizeof(c->host));
	c->port = req->port;
	if (r != 1) {
		deny(c, (enum egress_reason)r, r == EGRESS_BAD_REQUEST ? why : NULL);
		goto out;
	}
	if (is_metadata_name(c->host)) {
		deny(c, EGRESS_METADATA, NULL);
		goto out;
	}
	if ((r = egress_allow_match(e->allow, e->n_allow, c->host, c->port, &which)) != 0) {
		deny(c, (enum egress_reason)r, NULL);
		goto out;
	}
	c->explicit_port = which->port != 0;
	if (req->connect)
		r = buf_consume(&c->in, req->head_len);
	else
		r = rewrite_head(c, req);
	if (r < 0 || submit_lookup(c) < 0) {
		fail(c, "500 Internal Server Error", "out of memory");
		goto out;
	}
	c->st = C_RESOLVE;
	c->deadline_ms = loop_now_ms() + e->connect_timeout_ms;
	conn_update(c);
out:
	mem_free(req);
}

static bool cidr_permits(const struct egress *e, const struct sockaddr *sa)
{
	uint8_t a[16] = {0};

	if (sa->sa_family == AF_INET) {
		a[10] = a[11] = 0xff;
		memcpy(a + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
	} else {
		memcpy(a, &((const struct sockaddr_in6 *)sa)->sin6_addr, 16);
	}
	for (size_t i = 0; i < e->n_cidrs; i++) {
		unsigned full = e->cidrs[i].prefix / 8, rest = e->cidrs[i].prefix % 8;

		if (memcmp(a, e->cidrs[i].net, full) != 0)
			continue;
		if (rest && ((a[full] ^ e->cidrs[i].net[full]) & (uint8_t)(0xff << (8 - rest))))
			continue;
		return true;
	}
	return false;
}

static void try_connect(struct conn *c);
static void step_hello(struct conn *c);

static void lookup_done(struct conn *c, struct job *j)
{
	if (j->err) {
		fail(c, "502 Bad Gateway", "cannot resolve %s: %s", c->host, gai_strerror(j->err));
		return;
	}
	/* Every address must be public: a name that mixes a public and a
	 * private address is refused rather than filtered, because that
	 * mixture is itself the sign of a rebinding attempt. */
	for (size_t i = 0; i < j->n; i++) {
		const struct sockaddr *sa = (const struct sockaddr *)&j->addrs[i];
		enum egress_addr_class cls = egress_addr_classify(sa);
		char a[INET6_ADDRSTRLEN], detail[INET6_ADDRSTRLEN + 32];

		if (cls == EGRESS_ADDR_PUBLIC || (cls != EGRESS_ADDR_METADATA && cidr_permits(c->e, sa)))
			continue;
		addr_str(sa, a, sizeof(a));
		snprintf(detail, sizeof(detail), "%s (%s)", a, egress_addr_class_name(cls));
		deny(c, cls == EGRESS_ADDR_METADATA ? EGRESS_METADATA : EGRESS_PRIVATE_ADDRESS, detail);
		return;
	}
	/* A service bound on 0.0.0.0 on the host answers on every address the
	 * host has, public ones too: none of them is a way out. Refused
	 * whatever allow_private_cidrs says, like metadata. */
	if (j->own_err) {
		fail(c, "502 Bad Gateway", "cannot read the host's own addresses to refuse them: %s",
		     strerror(j->own_err));
		return;
	}
	for (size_t i = 0; i < j->n; i++) {
		char a[INET6_ADDRSTRLEN], detail[INET6_ADDRSTRLEN + 32];

		if (!j->own[i])
			continue;
		addr_str((const struct sockaddr *)&j->addrs[i], a, sizeof(a));
		snprintf(detail, sizeof(detail), "%s (host interface)", a);
		deny(c, EGRESS_HOST_ADDRESS, detail);
		return;
	}
	for (size_t i = 0; i < j->n; i++) {
		memcpy(&c->addrs[i], &j->addrs[i], j->lens[i]);
		c->lens[i] = j->lens[i];
		if (c->addrs[i].ss_family == AF_INET)
			((struct sockaddr_in *)&c->addrs[i])->sin_port = htons(c->port);
		else
			((struct sockaddr_in6 *)&c->addrs[i])->sin6_port = htons(c->port);
	}
	c->naddrs = j->n;
	c->next_addr = 0;
	c->st = C_CONNECT;
	try_connect(c);
}

/* Start a connection to the next checked address; 502 when none is left. */
static void try_connect(struct conn *c)
{
	struct egress *e = c->e;

	while (c->next_addr < c->naddrs) {
		size_t i = c->next_addr++;
		int fd = socket(c->addrs[i].ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);

		if (fd < 0) {
			c->last_connect_err = errno;
			continue;
		}
		if (connect(fd, (struct sockaddr *)&c->addrs[i], c->lens[i]) < 0 && errno != EINPROGRESS) {
			c->last_connect_err = errno;
			close(fd);
			continue;
		}
		if (loop_add_fd(e->loop, fd, EPOLLOUT, on_upstream, c) < 0) {
			close(fd);
			c->last_connect_err = ENOMEM;
			continue;
		}
		c->ufd = fd;
		c->uev = EPOLLOUT;
		return;
	}
	fail(c, "502 Bad Gateway", "cannot connect: %s",
	     strerror(c->last_connect_err ? c->last_connect_err : EHOSTUNREACH));
}

static void connected(struct conn *c)
{
	static const char ok[] = "HTTP/1.1 200 Connection established\r\n\r\n";

	c->deadline_ms = loop_now_ms() + c->e->idle_timeout_ms;
	if (strcmp(c->method, "CONNECT") == 0) {
		if (buf_put(&c->out, ok, sizeof(ok) - 1) < 0) {
			conn_close(c);
			return;
		}
		c->st = C_HELLO;
		/* bytes the client sent before the 200 are the start of its
		 * ClientHello already (and may be all of it) */
		if (buf_len(&c->in)) {
			step_hello(c);
			return;
		}
	} else {
		c->st = C_RELAY;
	}
	conn_update(c);
}

static void step_hello(struct conn *c)
{
	char sni[EGRESS_HOST_MAX + 2];

	switch (egress_tls_sni(buf_ptr(&c->in), buf_len(&c->in), sni, sizeof(sni))) {
	case EGRESS_TLS_MORE:
		if (c->c_eof)
			conn_close(c);
		else
			conn_update(c);
		return;
	case EGRESS_TLS_SNI:
		if (strcmp(sni, c->host) != 0) {
			deny(c, EGRESS_SNI_MISMATCH, sni);
			return;
		}
		break;
	case EGRESS_TLS_NO_SNI:
		deny(c, EGRESS_NO_SNI, NULL);
		return;
	case EGRESS_TLS_NOT_TLS:
		if (!c->explicit_port) {
			deny(c, EGRESS_NOT_TLS, NULL);
			return;
		}
		break;
	case EGRESS_TLS_BAD:
		deny(c, EGRESS_BAD_REQUEST, "malformed or oversized TLS ClientHello");
		return;
	}
	c->st = C_RELAY;
	conn_update(c);
}

/* ============================== relay ============================== */

static size_t room(const struct buf *b)
{
	return buf_len(b) >= EGRESS_BUF_MAX ? 0 : EGRESS_BUF_MAX - buf_len(b);
}

/* Read what fits into b. Returns bytes read, 0 on EOF, -EAGAIN, or -errno. */
static ssize_t read_into(int fd, struct buf *b, size_t max)
{
	uint8_t *p;
	ssize_t n;
	int r;

	if (max == 0)
		return -EAGAIN;
	if ((r = buf_reserve(b, max, &p)) < 0)
		return r;
	n = recv(fd, p, max, 0);
	if (n < 0)
		return errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR ? -EAGAIN : -errno;
	buf_commit(b, (size_t)n);
	return n;
}

/* Write what we can of b. 0 (possibly partial) or -errno. */
static int flush_to(int fd, struct buf *b)
{
	while (buf_len(b)) {
		ssize_t n = send(fd, buf_ptr(b), buf_len(b), MSG_NOSIGNAL);

		if (n < 0) {
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				return 0;
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf_consume(b, (size_t)n);
	}
	buf_reset(b);
	return 0;
}

static bool relaying(const struct conn *c)
{
	return c->st == C_RELAY;
}

/* Recompute what each side waits for and the half-closes that are due. */
static void conn_update(struct conn *c)
{
	struct egress *e = c->e;
	uint32_t cev = 0, uev = 0;

	if (c->st == C_RELAY) {
		/* a side's EOF travels to the other once its bytes are out */
		if (c->c_eof && !buf_len(&c->in) && !c->u_shut && c->ufd >= 0) {
			shutdown(c->ufd, SHUT_WR);
			c->u_shut = true;
		}
		/* upstream finished and everything reached the client: done
		 * (a client that keeps its side open would otherwise hold the
		 * slot until the idle timeout) */
		if (c->u_eof && !buf_len(&c->out)) {
			conn_close(c);
			return;
		}
		if (c->u_parked && room(&c->out)) {
			if (loop_add_fd(e->loop, c->ufd, 0, on_upstream, c) < 0) {
				conn_close(c);
				return;
			}
			c->u_parked = false;
			c->uev = 0;
		}
	}
	if (c->st == C_CLOSING && !buf_len(&c->out) && c->drain_after_flush && !c->c_shut) {
		shutdown(c->cfd, SHUT_WR);
		c->c_shut = true;
	}

	switch (c->st) {
	case C_HEAD:
		if (!c->c_eof)
			cev |= EPOLLIN;
		break;
	case C_RESOLVE:
		break;
	case C_CONNECT:
		uev = EPOLLOUT;
		break;
	case C_HELLO:
		if (!c->c_eof && buf_len(&c->in) < EGRESS_HELLO_MAX + 64)
			cev |= EPOLLIN;
		if (c->explicit_port && !c->u_eof && room(&c->out))
			uev |= EPOLLIN;
		break;
	case C_RELAY:
		if (!c->c_eof && room(&c->in))
			cev |= EPOLLIN;
		if (!c->u_eof && room(&c->out))
			uev |= EPOLLIN;
		if (buf_len(&c->in))
			uev |= EPOLLOUT;
		break;
	case C_CLOSING:
		if (c->c_shut && !c->c_eof)
			cev |= EPOLLIN; /* drain until the client closes */
		break;
	}
	if (buf_len(&c->out) && !c->c_shut)
		cev |= EPOLLOUT;
	if (cev != c->cev) {
		loop_mod_fd(e->loop, c->cfd, cev);
		c->cev = cev;
	}
	if (c->ufd >= 0 && !c->u_parked && uev != c->uev) {
		loop_mod_fd(e->loop, c->ufd, uev);
		c->uev = uev;
	}
	if (c->st == C_CLOSING && c->c_shut && c->c_eof)
		conn_close(c);
}

static void on_client(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct conn *c = ud;
	ssize_t n;

	(void)l;
	if (events & EPOLLERR) {
		conn_close(c);
		return;
	}
	if ((events & EPOLLOUT) && buf_len(&c->out)) {
		if (flush_to(fd, &c->out) < 0) {
			conn_close(c);
			return;
		}
		if (relaying(c) || c->st == C_HELLO)
			c->deadline_ms = loop_now_ms() + c->e->idle_timeout_ms;
	}
	if (events & (EPOLLIN | EPOLLHUP)) {
		if (c->cev & EPOLLIN) {
			if (c->st == C_CLOSING) {
				uint8_t junk[4096];
				n = recv(fd, junk, sizeof(junk), 0);
				if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR))
					c->c_eof = true;
			} else {
				n = read_into(fd, &c->in, room(&c->in));
				if (n == 0) {
					c->c_eof = true;
				} else if (n < 0 && n != -EAGAIN) {
					conn_close(c);
					return;
				} else if (n > 0 && c->st != C_HEAD) {
					c->deadline_ms = loop_now_ms() + c->e->idle_timeout_ms;
				}
			}
		} else if ((events & EPOLLHUP) && !(events & EPOLLIN)) {
			/* hung up and we are not reading: nothing more can reach it */
			conn_close(c);
			return;
		}
	}
	switch (c->st) {
	case C_HEAD:
		if (c->c_eof) {
			conn_close(c);
			return;
		}
		step_head(c);
		return;
	case C_HELLO:
		step_hello(c);
		return;
	default:
		conn_update(c);
	}
}

static void on_upstream(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct conn *c = ud;
	ssize_t n;

	(void)l;
	if (c->st == C_CONNECT) {
		int err = 0;
		socklen_t len = sizeof(err);

		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) < 0)
			err = errno;
		if (err == 0 && !(events & (EPOLLOUT | EPOLLERR | EPOLLHUP)))
			return;
		if (err || (events & (EPOLLERR | EPOLLHUP))) {
			c->last_connect_err = err ? err : ECONNREFUSED;
			loop_del_fd(c->e->loop, fd);
			close(fd);
			c->ufd = -1;
			try_connect(c);
			return;
		}
		connected(c);
		return;
	}
	if (events & EPOLLERR) {
		conn_close(c);
		return;
	}
	if ((events & EPOLLOUT) && relaying(c) && buf_len(&c->in)) {
		if (flush_to(fd, &c->in) < 0) {
			conn_close(c);
			return;
		}
		c->deadline_ms = loop_now_ms() + c->e->idle_timeout_ms;
	}
	if ((events & (EPOLLIN | EPOLLHUP)) && (c->uev & EPOLLIN)) {
		n = read_into(fd, &c->out, room(&c->out));
		if (n == 0) {
			c->u_eof = true;
		} else if (n < 0 && n != -EAGAIN) {
			conn_close(c);
			return;
		} else if (n > 0) {
			c->deadline_ms = loop_now_ms() + c->e->idle_timeout_ms;
		}
	} else if ((events & EPOLLHUP) && !(c->uev & EPOLLIN)) {
		/* Upstream is gone both ways but its last bytes wait in the
		 * kernel while the client is slow: level-triggered HUP would
		 * spin, so leave the loop until the client drained some. */
		if (buf_len(&c->in) || c->st != C_RELAY) {
			conn_close(c);
			return;
		}
		loop_del_fd(c->e->loop, fd);
		c->u_parked = true;
	}
	if (c->st == C_HELLO && c->u_eof) {
		conn_close(c);
		return;
	}
	conn_update(c);
}

/* ============================== connections ============================== */

static void sweep(struct loop *l, void *ud);

static void arm_sweep(struct egress *e)
{
	if (!e->sweep_timer && e->n_conns)
		e->sweep_timer = loop_add_timer(e->loop, SWEEP_MS, sweep, e);
}

static void sweep(struct loop *l, void *ud)
{
	struct egress *e = ud;
	uint64_t now = loop_now_ms();
	struct conn *c, *next;

	(void)l;
	e->sweep_timer = 0;
	for (c = e->conns; c; c = next) {
		next = c->next;
		if (now < c->deadline_ms)
			continue;
		switch (c->st) {
		case C_RESOLVE:
			fail(c, "504 Gateway Timeout", "timed out resolving %s", c->host);
			break;
		case C_CONNECT:
			fail(c, "504 Gateway Timeout", "timed out connecting");
			break;
		default: /* head timeout, idle timeout, linger done */
			conn_close(c);
		}
	}
	arm_sweep(e);
}

static void conn_close(struct conn *c)
{
	struct egress *e = c->e;

	if (c->job)
		c->job->conn = NULL;
	loop_del_fd(e->loop, c->cfd);
	close(c->cfd);
	if (c->ufd >= 0) {
		if (!c->u_parked)
			loop_del_fd(e->loop, c->ufd);
		close(c->ufd);
	}
	buf_clear(&c->in);
	buf_clear(&c->out);
	mem_free(c->own_client);
	if (c->prev)
		c->prev->next = c->next;
	else
		e->conns = c->next;
	if (c->next)
		c->next->prev = c->prev;
	e->n_conns--;
	mem_free(c);
}

static void refuse_busy(int fd)
{
#define BUSY_BODY "airlock egress: too many connections, try again\n"
	char msg[256];
	int n = snprintf(msg, sizeof(msg),
			 "HTTP/1.1 503 Service Unavailable\r\nContent-Type: text/plain\r\nContent-Length: %zu\r\n"
			 "Connection: close\r\n\r\n" BUSY_BODY,
			 sizeof(BUSY_BODY) - 1);
#undef BUSY_BODY

	if (n > 0 && send(fd, msg, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) < 0) {
		/* best effort */
	}
	close(fd);
}

/* A new client connection on fd (non-blocking), owned from here on. */
static int conn_add(struct egress *e, int fd, const char *client, char *own_client, uint64_t client_id)
{
	struct conn *c = mem_calloc(1, sizeof(*c));

	if (!c || loop_add_fd(e->loop, fd, EPOLLIN, on_client, c) < 0) {
		mem_free(c);
		mem_free(own_client);
		close(fd);
		return -ENOMEM;
	}
	c->e = e;
	c->client = own_client ? own_client : client;
	c->own_client = own_client;
	c->client_id = client_id;
	c->cfd = fd;
	c->ufd = -1;
	c->cev = EPOLLIN;
	c->st = C_HEAD;
	buf_init(&c->in, EGRESS_BUF_MAX + EGRESS_HEAD_MAX);
	buf_init(&c->out, EGRESS_BUF_MAX);
	c->deadline_ms = loop_now_ms() + e->head_timeout_ms;
	c->next = e->conns;
	if (e->conns)
		e->conns->prev = c;
	e->conns = c;
	e->n_conns++;
	arm_sweep(e);
	return 0;
}

static void on_accept(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct listener *lst = ud;
	struct egress *e = lst->e;

	(void)l;
	(void)events;
	for (int k = 0; k < 64; k++) {
		int cfd = accept4(fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (cfd < 0)
			return; /* EAGAIN, or a transient error: level-triggered, we come back */
		if (e->n_conns >= e->max_conns) {
			refuse_busy(cfd);
			continue;
		}
		(void)conn_add(e, cfd, lst->client, NULL, 0);
	}
}

int egress_adopt(struct egress *e, int fd, const char *client, uint64_t client_id)
{
	char *own;
	int fl;

	if (!e || fd < 0) {
		if (fd >= 0)
			close(fd);
		return -EINVAL;
	}
	if (e->n_conns >= e->max_conns) {
		refuse_busy(fd);
		return -EBUSY;
	}
	if ((fl = fcntl(fd, F_GETFL)) < 0 || fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0) {
		int r = -errno;
		close(fd);
		return r;
	}
	if (!(own = mem_strdup(client ? client : ""))) {
		close(fd);
		return -ENOMEM;
	}
	return conn_add(e, fd, NULL, own, client_id);
}

/* ============================== setup ============================== */

static int load_hosts(struct egress *e, const char *path, char *err, size_t errlen)
{
	FILE *f = fopen(path, "re");
	char line[1024];
	unsigned lineno = 0;
	int r = 0;

	if (!f) {
		r = -errno;
		errmsg_set(err, errlen, "egress hosts_file %s: %s", path, strerror(-r));
		return r;
	}
	e->use_hosts = true;
	while (fgets(line, sizeof(line), f)) {
		char *save = NULL, *addr, *name;
		struct sockaddr_storage ss;
		socklen_t len;

		lineno++;
		if (strchr(line, '#'))
			*strchr(line, '#') = '\0';
		addr = strtok_r(line, " \t\r\n", &save);
		if (!addr)
			continue;
		memset(&ss, 0, sizeof(ss));
		if (inet_pton(AF_INET, addr, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
			ss.ss_family = AF_INET;
			len = sizeof(struct sockaddr_in);
		} else if (inet_pton(AF_INET6, addr, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
			ss.ss_family = AF_INET6;
			len = sizeof(struct sockaddr_in6);
		} else {
			errmsg_set(err, errlen, "egress hosts_file %s:%u: %s is not an address", path, lineno, addr);
			r = -EINVAL;
			goto out;
		}
		while ((name = strtok_r(NULL, " \t\r\n", &save))) {
			struct hosts_entry *h;
			char norm[EGRESS_HOST_MAX + 1];

			if (egress_host_normalise(name, strlen(name), norm) != 0) {
				errmsg_set(err, errlen, "egress hosts_file %s:%u: bad name %s", path, lineno, name);
				r = -EINVAL;
				goto out;
			}
			if (e->n_hosts == HOSTS_ENTRIES_MAX) {
				errmsg_set(err, errlen, "egress hosts_file %s: over %u entries", path,
					   HOSTS_ENTRIES_MAX);
				r = -EFBIG;
				goto out;
			}
			h = mem_realloc(e->hosts, (e->n_hosts + 1) * sizeof(*h));
			if (!h) {
				r = -ENOMEM;
				goto out;
			}
			e->hosts = h;
			h = &e->hosts[e->n_hosts];
			h->name = mem_strdup(norm);
			if (!h->name) {
				r = -ENOMEM;
				goto out;
			}
			h->addr = ss;
			h->len = len;
			e->n_hosts++;
		}
	}
out:
	fclose(f);
	return r;
}

int egress_new(struct loop *l, const struct egress_cfg *cfg, const struct egress_ops *ops, void *ud,
	       struct egress **out, char *err, size_t errlen)
{
	struct egress *e;
	int r = -ENOMEM;

	*out = NULL;
	e = mem_calloc(1, sizeof(*e));
	if (!e)
		return -ENOMEM;
	e->loop = l;
	e->evfd = -1;
	if (ops)
		e->ops = *ops;
	e->ud = ud;
	e->max_conns = cfg->max_conns ? cfg->max_conns : 256;
	e->head_timeout_ms = cfg->head_timeout_ms ? cfg->head_timeout_ms : 30000;
	e->connect_timeout_ms = cfg->connect_timeout_ms ? cfg->connect_timeout_ms : 10000;
	e->idle_timeout_ms = cfg->idle_timeout_ms ? cfg->idle_timeout_ms : 300000;
	e->pending_tail = &e->pending;
	pthread_mutex_init(&e->lock, NULL);
	pthread_cond_init(&e->cond, NULL);

	if (cfg->n_allow) {
		e->allow = mem_calloc(cfg->n_allow, sizeof(*e->allow));
		if (!e->allow)
			goto fail;
		for (size_t i = 0; i < cfg->n_allow; i++) {
			char *name = mem_strdup(cfg->allow[i].name);
			char *text = mem_strdup(cfg->allow[i].text ? cfg->allow[i].text : cfg->allow[i].name);

			e->allow[i] = cfg->allow[i];
			e->allow[i].name = name;
			e->allow[i].text = text;
			e->n_allow = i + 1;
			if (!name || !text)
				goto fail;
		}
	}
	if (cfg->n_allow_private_cidrs) {
		e->cidrs = mem_calloc(cfg->n_allow_private_cidrs, sizeof(*e->cidrs));
		if (!e->cidrs)
			goto fail;
		for (size_t i = 0; i < cfg->n_allow_private_cidrs; i++) {
			if (egress_cidr_parse(cfg->allow_private_cidrs[i], e->cidrs[i].net, &e->cidrs[i].prefix) < 0) {
				errmsg_set(err, errlen, "egress allow_private_cidrs[%zu]: %s is not ADDRESS/PREFIX", i,
					   cfg->allow_private_cidrs[i]);
				r = -EINVAL;
				goto fail;
			}
			e->n_cidrs = i + 1;
		}
	}
	if (cfg->hosts_file && (r = load_hosts(e, cfg->hosts_file, err, errlen)) < 0)
		goto fail;

	e->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	if (e->evfd < 0) {
		r = -errno;
		errmsg_set(err, errlen, "egress: eventfd: %s", strerror(-r));
		goto fail;
	}
	if ((r = loop_add_fd(l, e->evfd, EPOLLIN, on_resolved, e)) < 0)
		goto fail;
	e->threads = mem_calloc(cfg->resolver_threads ? cfg->resolver_threads : 4, sizeof(*e->threads));
	if (!e->threads) {
		r = -ENOMEM;
		goto fail;
	}
	for (unsigned i = 0; i < (cfg->resolver_threads ? cfg->resolver_threads : 4); i++) {
		if ((r = pthread_create(&e->threads[i], NULL, resolver_main, e)) != 0) {
			r = -r;
			errmsg_set(err, errlen, "egress: starting resolver thread: %s", strerror(-r));
			goto fail;
		}
		e->n_threads = i + 1;
	}
	*out = e;
	return 0;
fail:
	if (r == -ENOMEM)
		errmsg_set(err, errlen, "egress: out of memory");
	egress_free(e);
	return r;
}

static int add_listener(struct egress *e, int fd, const char *client, const char *path)
{
	struct listener *lst;
	int r;

	if (e->n_listeners == LISTENERS_MAX) {
		close(fd);
		return -EMFILE;
	}
	lst = &e->listeners[e->n_listeners];
	lst->e = e;
	lst->fd = fd;
	lst->client = mem_strdup(client ? client : "");
	lst->path = path ? mem_strdup(path) : NULL;
	if (!lst->client || (path && !lst->path)) {
		r = -ENOMEM;
		goto fail;
	}
	if ((r = loop_add_fd(e->loop, fd, EPOLLIN, on_accept, lst)) < 0)
		goto fail;
	e->n_listeners++;
	return 0;
fail:
	mem_free(lst->client);
	mem_free(lst->path);
	close(fd);
	return r;
}

int egress_listen_unix(struct egress *e, const char *path, const char *client)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	struct stat st;
	int fd, r;

	if (strlen(path) >= sizeof(sun.sun_path))
		return -ENAMETOOLONG;
	memcpy(sun.sun_path, path, strlen(path) + 1);
	if (lstat(path, &st) == 0 && S_ISSOCK(st.st_mode))
		unlink(path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0 || listen(fd, 128) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	return add_listener(e, fd, client, path);
}

int egress_listen_tcp(struct egress *e, const char *addr, uint16_t port, const char *client, uint16_t *bound)
{
	struct sockaddr_storage ss = {0};
	socklen_t len;
	int fd, r, one = 1;

	if (inet_pton(AF_INET, addr, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
		ss.ss_family = AF_INET;
		((struct sockaddr_in *)&ss)->sin_port = htons(port);
		len = sizeof(struct sockaddr_in);
	} else if (inet_pton(AF_INET6, addr, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1) {
		ss.ss_family = AF_INET6;
		((struct sockaddr_in6 *)&ss)->sin6_port = htons(port);
		len = sizeof(struct sockaddr_in6);
	} else {
		return -EINVAL;
	}
	fd = socket(ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0)
		return -errno;
	setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(fd, (struct sockaddr *)&ss, len) < 0 || listen(fd, 128) < 0 ||
	    getsockname(fd, (struct sockaddr *)&ss, &len) < 0) {
		r = -errno;
		close(fd);
		return r;
	}
	if (bound)
		*bound = ntohs(ss.ss_family == AF_INET ? ((struct sockaddr_in *)&ss)->sin_port
						       : ((struct sockaddr_in6 *)&ss)->sin6_port);
	return add_listener(e, fd, client, NULL);
}

size_t egress_conn_count(const struct egress *e)
{
	return e->n_conns;
}

void egress_free(struct egress *e)
{
	struct job *j, *next;

	if (!e)
		return;
	while (e->conns)
		conn_close(e->conns);
	if (e->sweep_timer)
		loop_del_timer(e->loop, e->sweep_timer);
	for (size_t i = 0; i < e->n_listeners; i++) {
		loop_del_fd(e->loop, e->listeners[i].fd);
		close(e->listeners[i].fd);
		if (e->listeners[i].path)
			unlink(e->listeners[i].path);
		mem_free(e->listeners[i].client);
		mem_free(e->listeners[i].path);
	}
	pthread_mutex_lock(&e->lock);
	e->stopping = true;
	pthread_cond_broadcast(&e->cond);
	pthread_mutex_unlock(&e->lock);
	for (unsigned i = 0; i < e->n_threads; i++)
		pthread_join(e->threads[i], NULL);
	mem_free(e->threads);
	for (j = e->pending; j; j = next) {
		next = j->next;
		mem_free(j);
	}
	for (j = e->done; j; j = next) {
		next = j->next;
		mem_free(j);
	}
	if (e->evfd >= 0) {
		loop_del_fd(e->loop, e->evfd);
		close(e->evfd);
	}
	pthread_mutex_destroy(&e->lock);
	pthread_cond_destroy(&e->cond);
	for (size_t i = 0; i < e->n_allow; i++) {
		mem_free((char *)e->allow[i].name);
		mem_free((char *)e->allow[i].text);
	}
	mem_free(e->allow);
	mem_free(e->cidrs);
	for (size_t i = 0; i < e->n_hosts; i++)
		mem_free(e->hosts[i].name);
	mem_free(e->hosts);
	mem_free(e);
}
