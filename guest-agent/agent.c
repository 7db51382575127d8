/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock-agent: the guest side. Listens on one transport address, runs
 * the responder side of the channel handshake for each connection, and
 * serves the session protocol (wire.h) on it.
 *
 * Sessions are served concurrently on one single-threaded event loop, up to
 * --max-sessions (default 16); a connection over the limit is closed at
 * once. On a serial device (one byte stream) sessions are necessarily one
 * after another: when a session ends the device is handed to the next.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/buf.h"
#include "airlock/chan.h"
#include "airlock/keys.h"
#include "airlock/loop.h"
#include "airlock/mem.h"
#include "airlock/syncg.h"
#include "airlock/transport.h"
#include "airlock/wire.h"

struct agent;

struct session {
	struct agent *agent;
	struct chan *chan;
	struct session *next;
	unsigned id;
	char peer[KEYS_B64_LEN];
	uint8_t sync_pk[32]; /* host's Ed25519 sync-signing key, from HELLO */
	bool hello;
	uint64_t bulk_bytes; /* bulk stream bytes received */
	struct syncg_session *sync; /* made by the first sync frame */
};

struct agent {
	struct loop *loop;
	struct transport_addr addr;
	int lfd;
	int sfd; /* signalfd */
	struct noise_keypair key;
	uint8_t psk[32];
	bool have_psk;
	struct chan_peers *peers;
	const char *root;
	const char *state_dir; /* --state, NULL: <root>.airlock-state */
	struct apply_opts apply_opts;
	struct syncg *sync;
	struct session *sessions;
	unsigned nsessions, max_sessions, next_id;
	int verbose;
};

static void logmsg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void logmsg(const char *fmt, ...)
{
	va_list ap;
	struct timespec ts;
	struct tm tm;
	char when[32];

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	strftime(when, sizeof(when), "%H:%M:%S", &tm);
	fprintf(stderr, "%s.%03ld airlock-agent: ", when, ts.tv_nsec / 1000000);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

/* ---- session protocol: one handler per frame type ---- */

typedef int frame_fn(struct session *s, uint32_t stream, struct buf *in);

static int send_error(struct session *s, uint32_t stream, int code, const char *msg)
{
	struct buf out;
	int r;

	buf_init(&out, WIRE_PAYLOAD_MAX);
	if ((r = buf_put_u32(&out, (uint32_t)code)) < 0 || (r = buf_put_str(&out, msg)) < 0)
		goto out;
	r = chan_send(s->chan, WIRE_ERROR, stream, buf_ptr(&out), buf_len(&out));
out:
	buf_clear(&out);
	return r;
}

static int handle_hello(struct session *s, uint32_t stream, struct buf *in)
{
	uint32_t version;
	const uint8_t *pk;
	size_t pklen;
	char *client = NULL;
	struct buf out;
	int r;

	buf_init(&out, WIRE_PAYLOAD_MAX);
	if ((r = buf_get_u32(in, &version)) < 0 || (r = buf_get_bytes(in, &pk, &pklen, 32)) < 0 ||
	    (r = buf_get_str(in, &client, 256)) < 0)
		goto out;
	if (version != WIRE_VERSION || pklen != 32) {
		r = -EPROTO;
		goto out;
	}
	memcpy(s->sync_pk, pk, 32);
	s->hello = true;
	logmsg("session %u: hello from %s (%s)", s->id, s->peer, client);
	if ((r = buf_put_u32(&out, WIRE_VERSION)) < 0 || (r = buf_put_str(&out, "airlock-agent " AIRLOCK_VERSION)) < 0 ||
	    (r = buf_put_str(&out, s->agent->root)) < 0)
		goto out;
	r = chan_send(s->chan, WIRE_HELLO_OK, stream, buf_ptr(&out), buf_len(&out));
out:
	mem_free(client);
	buf_clear(&out);
	return r;
}

static int handle_ping(struct session *s, uint32_t stream, struct buf *in)
{
	/* Echo the payload byte for byte: the client checks it. */
	return chan_send(s->chan, WIRE_PONG, stream, buf_ptr(in), buf_len(in));
}

static int handle_bulk_data(struct session *s, uint32_t stream, struct buf *in)
{
	(void)stream;
	s->bulk_bytes += buf_len(in);
	return 0;
}

static int handle_bulk_end(struct session *s, uint32_t stream, struct buf *in)
{
	uint64_t sent;
	uint8_t ack[8];
	int r;

	if ((r = buf_get_u64(in, &sent)) < 0)
		return r;
	for (int i = 0; i < 8; i++)
		ack[i] = (uint8_t)(s->bulk_bytes >> (56 - 8 * i));
	s->bulk_bytes = 0;
	return chan_send(s->chan, WIRE_BULK_ACK, stream, ack, sizeof(ack));
}

/* Every sync message (syncg.h): fragments are reassembled and parsed
 * there. A batch that fails verification or apply is answered with
 * SYNC_NACK and the session goes on; a protocol violation drops it. */
static int handle_sync(struct session *s, uint32_t stream, struct buf *in, uint8_t type)
{
	char err[1024];
	int r;

	if (!s->sync && (r = syncg_session_new(s->agent->sync, s->chan, s->sync_pk, &s->sync)) < 0)
		return r;
	r = syncg_session_frame(s->sync, type, stream, buf_ptr(in), buf_len(in), err, sizeof(err));
	if (r < 0 || err[0])
		logmsg("session %u: sync: %s", s->id, err[0] ? err : strerror(-r));
	return r;
}

static int handle_sync_begin(struct session *s, uint32_t stream, struct buf *in)
{
	return handle_sync(s, stream, in, WIRE_SYNC_BEGIN);
}

static int handle_sync_levels_req(struct session *s, uint32_t stream, struct buf *in)
{
	return handle_sync(s, stream, in, WIRE_SYNC_LEVELS_REQ);
}

static int handle_sync_entries_req(struct session *s, uint32_t stream, struct buf *in)
{
	return handle_sync(s, stream, in, WIRE_SYNC_ENTRIES_REQ);
}

static int handle_sync_batch(struct session *s, uint32_t stream, struct buf *in)
{
	return handle_sync(s, stream, in, WIRE_SYNC_BATCH);
}

static const struct {
	frame_fn *fn;
	const char *name;
	bool before_hello; /* allowed before HELLO */
} handlers[WIRE_TYPE_MAX + 1] = {
	[WIRE_HELLO] = { handle_hello, "HELLO", true },
	[WIRE_PING] = { handle_ping, "PING", true },
	[WIRE_BULK_DATA] = { handle_bulk_data, "BULK_DATA", false },
	[WIRE_BULK_END] = { handle_bulk_end, "BULK_END", false },
	[WIRE_SYNC_BEGIN] = { handle_sync_begin, "SYNC_BEGIN", false },
	[WIRE_SYNC_LEVELS_REQ] = { handle_sync_levels_req, "SYNC_LEVELS_REQ", false },
	[WIRE_SYNC_ENTRIES_REQ] = { handle_sync_entries_req, "SYNC_ENTRIES_REQ", false },
	[WIRE_SYNC_BATCH] = { handle_sync_batch, "SYNC_BATCH", false },
};

static void on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	struct session *s = ud;
	struct buf in;
	int r;

	buf_view(&in, p, n);
	if (!handlers[type].fn) {
		logmsg("session %u: unexpected frame %s (%u) on stream %u", s->id, wire_type_name(type), type, stream);
		send_error(s, stream, EPROTO, "unexpected frame type");
		return;
	}
	if (!s->hello && !handlers[type].before_hello) {
		send_error(s, stream, EPROTO, "HELLO first");
		return;
	}
	if ((r = handlers[type].fn(s, stream, &in)) < 0 && r != -EAGAIN) {
		logmsg("session %u: %s on stream %u: %s; closing", s->id, handlers[type].name, stream, strerror(-r));
		send_error(s, stream, -r, "bad request");
		chan_close(c);
	}
	/* -EAGAIN on a reply: the peer sends faster than it reads replies on
	 * the control stream; the control queue's hard cap in chan bounds it. */
}

static void session_drop(struct session *s)
{
	struct agent *a = s->agent;

	for (struct session **pp = &a->sessions; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			break;
		}
	}
	a->nsessions--;
	syncg_session_free(s->sync);
	chan_free(s->chan);
	sodium_memzero(s, sizeof(*s));
	mem_free(s);
}

static void serial_next(struct agent *a);

static void on_ready(struct chan *c, void *ud)
{
	struct session *s = ud;
	struct chan_stats st;

	keys_pub_format(chan_peer_key(c), s->peer);
	chan_get_stats(c, &st);
	logmsg("session %u: handshake with %s done in %.2f ms", s->id, s->peer, st.handshake_ns / 1e6);
}

static void on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct session *s = ud;
	struct agent *a = s->agent;
	struct chan_stats st;

	chan_get_stats(c, &st);
	if (err == 0)
		logmsg("session %u: closed (%llu bytes in, %llu out)", s->id, (unsigned long long)st.bytes_in,
		       (unsigned long long)st.bytes_out);
	else
		logmsg("session %u: ended: %s", s->id, why ? why : strerror(-err));
	session_drop(s);
	if (!transport_is_stream_listener(&a->addr)) {
		transport_release(&a->addr, a->lfd);
		serial_next(a);
	}
}

static void on_writable(struct chan *c, void *ud)
{
	struct session *s = ud;
	int r;

	if (s->sync && (r = syncg_session_writable(s->sync)) < 0) {
		logmsg("session %u: sync: sending: %s; closing", s->id, strerror(-r));
		chan_close(c);
	}
}

static const struct chan_ops session_ops = {
	.on_ready = on_ready,
	.on_frame = on_frame,
	.on_writable = on_writable,
	.on_close = on_close,
};

static void session_start(struct agent *a, int fd)
{
	struct session *s;
	struct chan_cfg cfg = {
		.role = NOISE_RESPONDER,
		.self = &a->key,
		.peers = a->peers,
		.psk = a->have_psk ? a->psk : NULL,
	};

	if (a->nsessions >= a->max_sessions) {
		logmsg("connection refused: already %u sessions (--max-sessions)", a->nsessions);
		close(fd);
		return;
	}
	if (!(s = mem_calloc(1, sizeof(*s)))) {
		logmsg("connection dropped: out of memory");
		close(fd);
		return;
	}
	s->agent = a;
	s->id = ++a->next_id;
	strcpy(s->peer, "(handshaking)");
	if (!(s->chan = chan_new(a->loop, fd, &cfg, &session_ops, s))) {
		logmsg("connection dropped: out of memory");
		mem_free(s);
		return;
	}
	chan_set_default_stream_flags(s->chan, CHAN_STREAM_AUTO);
	s->next = a->sessions;
	a->sessions = s;
	a->nsessions++;
	if (a->verbose)
		logmsg("session %u: connection accepted", s->id);
}

static void serial_next(struct agent *a)
{
	int fd = transport_accept(&a->addr, a->lfd);

	if (fd >= 0)
		session_start(a, fd);
	else
		logmsg("serial device: cannot start a session: %s", strerror(-fd));
}

static void on_listen(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct agent *a = ud;
	(void)l;
	(void)fd;
	(void)events;

	for (int i = 0; i < 64; i++) {
		int cfd = transport_accept(&a->addr, a->lfd);
		if (cfd == -EAGAIN)
			return;
		if (cfd < 0) {
			logmsg("accept: %s", strerror(-cfd));
			return;
		}
		session_start(a, cfd);
	}
}

static void on_signal(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct signalfd_siginfo si;
	(void)events;
	(void)ud;

	if (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si))
		logmsg("signal %u: shutting down", si.ssi_signo);
	loop_stop(l);
}

static void usage(FILE *f)
{
	fputs("usage: airlock-agent --listen ADDR --root DIR --key FILE (--allow PUBKEY | --allow-file FILE)...\n"
	      "                     [--psk-file FILE] [--max-sessions N] [--state DIR] [--fsync none|batch|file] [-v]\n"
	      "  --state DIR: where the last applied sync sequence is kept (default ROOT.airlock-state;\n"
	      "               must be outside ROOT)\n"
	      "  ADDR: tcp:HOST:PORT | unix:PATH | vsock:CID:PORT | serial:DEVICE\n",
	      f);
}

static int load_psk(struct agent *a, const char *path)
{
	struct noise_keypair kp;
	char err[512];
	int r = keys_load(path, &kp, err, sizeof(err));

	if (r < 0) {
		logmsg("--psk-file: %s", err);
		return r;
	}
	memcpy(a->psk, kp.priv, 32);
	a->have_psk = true;
	sodium_memzero(&kp, sizeof(kp));
	return 0;
}

int main(int argc, char **argv)
{
	static const struct option opts[] = {
		{ "listen", required_argument, NULL, 'l' }, { "root", required_argument, NULL, 'r' },
		{ "key", required_argument, NULL, 'k' },    { "allow", required_argument, NULL, 'a' },
		{ "allow-file", required_argument, NULL, 'A' }, { "psk-file", required_argument, NULL, 'p' },
		{ "max-sessions", required_argument, NULL, 'm' }, { "verbose", no_argument, NULL, 'v' },
		{ "state", required_argument, NULL, 'S' },  { "fsync", required_argument, NULL, 'F' },
		{ "help", no_argument, NULL, 'h' },         { NULL, 0, NULL, 0 },
	};
	struct agent a = { .lfd = -1, .sfd = -1, .max_sessions = 16, .apply_opts = { .fsync = APPLY_FSYNC_BATCH } };
	const char *listen = NULL, *keyfile = NULL;
	char err[512];
	int c, r, status = 1;
	sigset_t mask;

	if (sodium_init() < 0) {
		logmsg("libsodium failed to initialise");
		return 1;
	}
	mem_init_json();
	if (!(a.peers = chan_peers_new())) {
		logmsg("out of memory");
		return 1;
	}
	while ((c = getopt_long(argc, argv, "v", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			listen = optarg;
			break;
		case 'r':
			a.root = optarg;
			break;
		case 'k':
			keyfile = optarg;
			break;
		case 'a': {
			uint8_t pk[32];
			if (keys_pub_parse(optarg, pk) < 0) {
				logmsg("--allow '%s': not a public key (44 characters of base64)", optarg);
				status = 2;
				goto out;
			}
			if (chan_peers_allow(a.peers, pk) < 0)
				goto out;
			break;
		}
		case 'A': {
			uint8_t (*keys)[32] = NULL;
			size_t n = 0;
			if (keys_load_allow_file(optarg, &keys, &n, err, sizeof(err)) < 0) {
				logmsg("%s", err);
				status = 2;
				goto out;
			}
			for (size_t i = 0; i < n; i++)
				if (chan_peers_allow(a.peers, keys[i]) < 0)
					break;
			mem_free(keys);
			break;
		}
		case 'p':
			if (load_psk(&a, optarg) < 0) {
				status = 2;
				goto out;
			}
			break;
		case 'm':
			a.max_sessions = (unsigned)strtoul(optarg, NULL, 10);
			if (a.max_sessions == 0 || a.max_sessions > 1024) {
				logmsg("--max-sessions must be 1..1024");
				status = 2;
				goto out;
			}
			break;
		case 'v':
			a.verbose++;
			break;
		case 'S':
			a.state_dir = optarg;
			break;
		case 'F':
			if (!strcmp(optarg, "none"))
				a.apply_opts.fsync = APPLY_FSYNC_NONE;
			else if (!strcmp(optarg, "batch"))
				a.apply_opts.fsync = APPLY_FSYNC_BATCH;
			else if (!strcmp(optarg, "file"))
				a.apply_opts.fsync = APPLY_FSYNC_FILE;
			else {
				logmsg("--fsync must be none, batch or file");
				status = 2;
				goto out;
			}
			break;
		case 'h':
			usage(stdout);
			status = 0;
			goto out;
		default:
			usage(stderr);
			status = 2;
			goto out;
		}
	}
	if (!listen || !a.root || !keyfile || chan_peers_count(a.peers) == 0) {
		if (listen && a.root && keyfile)
			logmsg("no host is allowed: give at least one --allow PUBKEY or --allow-file FILE");
		usage(stderr);
		status = 2;
		goto out;
	}
	if (keys_load(keyfile, &a.key, err, sizeof(err)) < 0) {
		logmsg("%s", err);
		status = 2;
		goto out;
	}
	if (mkdir(a.root, 0755) < 0 && errno != EEXIST) {
		logmsg("--root %s: %s", a.root, strerror(errno));
		goto out;
	}
	if (syncg_open(a.root, a.state_dir, &a.apply_opts, a.key.pub, &a.sync, err, sizeof(err)) < 0) {
		logmsg("%s", err);
		goto out;
	}
	logmsg("sync state in %s (last applied batch %llu)", syncg_state_dir(a.sync),
	       (unsigned long long)syncg_last_seq(a.sync));
	if (transport_parse(listen, &a.addr, err, sizeof(err)) < 0) {
		logmsg("--listen: %s", err);
		status = 2;
		goto out;
	}
	if (!(a.loop = loop_new())) {
		logmsg("out of memory");
		goto out;
	}
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	sigprocmask(SIG_BLOCK, &mask, NULL);
	if ((a.sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
	    loop_add_fd(a.loop, a.sfd, EPOLLIN, on_signal, &a) < 0) {
		logmsg("signalfd: %s", strerror(errno));
		goto out;
	}
	if ((a.lfd = transport_listen(&a.addr, err, sizeof(err))) < 0) {
		logmsg("%s", err);
		goto out;
	}
	if ((a.addr.kind == TRANSPORT_TCP || a.addr.kind == TRANSPORT_VSOCK) && a.addr.port == 0) {
		int port = transport_bound_port(a.lfd);
		if (port > 0)
			a.addr.port = (uint32_t)port;
	}
	char where[256];
	transport_format(&a.addr, where, sizeof(where));
	char self[KEYS_B64_LEN];
	keys_pub_format(a.key.pub, self);
	logmsg("listening on %s (key %s, %zu allowed host key%s)", where, self, chan_peers_count(a.peers),
	       chan_peers_count(a.peers) == 1 ? "" : "s");
	if (transport_is_stream_listener(&a.addr)) {
		if ((r = loop_add_fd(a.loop, a.lfd, EPOLLIN, on_listen, &a)) < 0) {
			logmsg("epoll: %s", strerror(-r));
			goto out;
		}
	} else {
		serial_next(&a);
	}
	/* Readiness line for scripts: printed after the socket exists. */
	fprintf(stdout, "ready %s\n", where);
	fflush(stdout);
	if ((r = loop_run(a.loop)) < 0) {
		logmsg("event loop: %s", strerror(-r));
		goto out;
	}
	status = 0;
out:
	while (a.sessions)
		session_drop(a.sessions);
	if (a.lfd >= 0)
		close(a.lfd);
	if (a.sfd >= 0)
		close(a.sfd);
	if (a.addr.kind == TRANSPORT_UNIX && a.lfd >= 0)
		unlink(a.addr.path);
	loop_free(a.loop);
	syncg_free(a.sync);
	chan_peers_free(a.peers);
	sodium_memzero(&a.key, sizeof(a.key));
	sodium_memzero(a.psk, sizeof(a.psk));
	return status;
}
