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
#include <limits.h>
#include <stdint.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <dirent.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/keys.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/transport.h"
#include "airlock/core/wire.h"
#include "airlock/exec/exec.h"
#include "airlock/guest/gpull.h"
#include "airlock/guest/vmstart.h"
#include "airlock/guest/proxy.h"
#include "airlock/guest/syncg.h"
#include "airlock/guest/track.h"

struct agent;
struct gexec;

#define SESSION_PULLS_MAX 8 /* CHG_PULL streams answered at once per session */

struct session {
	struct agent *agent;
	struct chan *chan;
	struct session *next;
	unsigned id;
	char peer[KEYS_B64_LEN];
	uint8_t sync_pk[32]; /* host's Ed25519 sync-signing key, from HELLO */
	bool hello;
	bool superseded;			/* a newer session of the same host took over: frames are dropped */
	bool daemon;				/* the client is airlock up (one per workspace) */
	uint64_t bulk_bytes;			/* bulk stream bytes received */
	struct syncg_session *sync;		/* made by the first sync frame */
	struct gexec *execs;			/* commands of this session (one host-opened stream each) */
	struct proxy *proxy;			/* egress listeners and tunnels (made by the first EXEC_F_PROXY) */
	struct gpull *pulls[SESSION_PULLS_MAX]; /* CHG_PULL answers being sent */
};

struct agent {
	struct loop *loop;
	struct transport_addr addr;
	int lfd;
	bool lfd_watched; /* serial: lfd is in the loop (edge-triggered) while no session holds it */
	int sfd;	  /* signalfd */
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
	struct exec_sys *xsys;	      /* cgroup context for commands */
	int root_fd;		      /* the workspace root: commands' cwd is resolved beneath it */
	uint32_t run_uid, run_gid;    /* EXEC_ID_KEEP when the agent is not root */
	const char *home;	      /* --home: HOME of commands (NULL: exec's default) */
	struct exec_confine *confine; /* --confine: Landlock + seccomp for commands */
	uint64_t file_max;	      /* --file-max: RLIMIT_FSIZE of confined commands, 0: none */
	bool init;		      /* PID 1 of a pid namespace (the local sandbox) */
	struct track *track;	      /* guest changes (track.h); NULL: not tracked */
	bool settle_reports;	      /* --settle-reports: a report waits for lost events' recovery */
	uint64_t starts;	      /* commands started, for "the latest running" */
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

typedef int frame_fn(struct session *s, uint8_t type, uint32_t stream, struct buf *in);

static int send_error(struct session *s, uint32_t stream, int code, const char *msg)
{
	struct buf out;
	int r;

	buf_init(&out, WIRE_PAYLOAD_MAX);
	if ((r = wire_error_encode(&out, &(struct wire_error){.code = (uint32_t)code, .msg = (char *)msg})) == 0)
		r = chan_send(s->chan, WIRE_ERROR, stream, buf_ptr(&out), buf_len(&out));
	buf_clear(&out);
	return r;
}

static int handle_hello(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct wire_hello m;
	struct wire_hello_ok ok = {.agent = "airlock-agent " AIRLOCK_VERSION, .root = (char *)s->agent->root};
	struct buf out;
	int r;
	(void)type;

	if ((r = wire_hello_decode(in, &m)) < 0)
		return r;
	memcpy(s->sync_pk, m.sign_pk, 32);
	s->hello = true;
	logmsg("session %u: hello from %s (%s)", s->id, s->peer, m.client);
	s->daemon = m.client && !strcmp(m.client, "airlock up");
	/* An airlock up that came back (restarted) supersedes its older
	 * sessions (ping and sync share its keys and are left alone): frames still buffered from a dead daemon must not
	 * be applied after the new session read the workspace's state. */
	for (struct session *t = s->agent->sessions; s->daemon && t; t = t->next) {
		if (t != s && t->hello && t->daemon && !t->superseded && !strcmp(t->peer, s->peer) &&
		    !sodium_memcmp(t->sync_pk, s->sync_pk, 32)) {
			t->superseded = true;
			logmsg("session %u: superseded by session %u of the same host", t->id, s->id);
			chan_close(t->chan);
		}
	}
	buf_init(&out, WIRE_PAYLOAD_MAX);
	if ((r = wire_hello_ok_encode(&out, &ok)) == 0)
		r = chan_send(s->chan, WIRE_HELLO_OK, stream, buf_ptr(&out), buf_len(&out));
	wire_hello_clear(&m);
	buf_clear(&out);
	return r;
}

static int handle_ping(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	/* Echo the payload byte for byte (wire_ping is its layout): the
	 * client checks it, so the agent does not parse it. */
	(void)type;
	return chan_send(s->chan, WIRE_PONG, stream, buf_ptr(in), buf_len(in));
}

static int handle_bulk_data(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	(void)type, (void)stream;
	s->bulk_bytes += buf_len(in);
	return 0;
}

static int handle_bulk_end(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct wire_bulk sent, ack = {.bytes = s->bulk_bytes};
	struct buf out;
	int r;
	(void)type;

	if ((r = wire_bulk_decode(in, &sent)) < 0)
		return r;
	s->bulk_bytes = 0;
	buf_init(&out, 16);
	if ((r = wire_bulk_encode(&out, &ack)) == 0)
		r = chan_send(s->chan, WIRE_BULK_ACK, stream, buf_ptr(&out), buf_len(&out));
	buf_clear(&out);
	return r;
}

static void track_note(struct agent *a);

/* Every sync message (syncg.h): fragments are reassembled and parsed
 * there. A batch that fails verification or apply is answered with
 * SYNC_NACK and the session goes on; a protocol violation drops it. */
static int handle_sync(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	char err[1024];
	int r;

	if (!s->sync && (r = syncg_session_new(s->agent->sync, s->chan, s->sync_pk, &s->sync)) < 0)
		return r;
	/* what commands did so far is theirs; what the batch writes is ours */
	track_note(s->agent);
	r = syncg_session_frame(s->sync, type, stream, buf_ptr(in), buf_len(in), err, sizeof(err));
	if (s->agent->track)
		track_read(s->agent->track, TRACK_BY_APPLY);
	if (r < 0 || err[0])
		logmsg("session %u: sync: %s", s->id, err[0] ? err : strerror(-r));
	return r;
}

/* ---- exec: commands on host-opened streams (doc/PROTOCOL.md "Exec") ---- */

#define GX_OUTQ_MAX   (1024u * 1024u) /* frames waiting for window; output pauses long before */
#define GX_STDINQ_MAX (WIRE_EXEC_STDIN_WINDOW + WIRE_PAYLOAD_MAX)

struct gexec {
	struct session *s;
	struct gexec *next;
	uint32_t stream;
	struct exec *e;	   /* NULL once the command ended */
	struct buf outq;   /* frames not yet accepted by chan: u8 type, u32 len, payload */
	struct buf stdinq; /* stdin bytes the command has not taken yet */
	bool stdin_eof, stdin_closed;
	bool paused;	  /* we paused its output because the stream's window is full */
	bool done;	  /* EXIT or ERROR queued: free once outq drains */
	uint64_t started; /* agent->starts when it started */
	/* after the command exited: its changes (CHG_ITEM), then EXIT */
	struct track_dirty *rep;
	size_t nrep, irep;
	struct buf exitf; /* the EXEC_EXIT payload, sent after the last CHG_ITEM */
	bool reporting;
};

static struct gexec *gx_find(struct session *s, uint32_t stream)
{
	for (struct gexec *g = s->execs; g; g = g->next)
		if (g->stream == stream)
			return g;
	return NULL;
}

static void gx_free(struct gexec *g)
{
	struct session *s = g->s;

	for (struct gexec **pp = &s->execs; *pp; pp = &(*pp)->next) {
		if (*pp == g) {
			*pp = g->next;
			break;
		}
	}
	exec_free(g->e); /* kills what still runs */
	proxy_cmd_end(s->proxy, g->stream);
	if (s->chan)
		chan_stream_close(s->chan, g->stream);
	buf_clear(&g->outq);
	buf_clear(&g->stdinq);
	buf_clear(&g->exitf);
	for (size_t i = 0; i < g->nrep; i++)
		mem_free(g->rep[i].path);
	mem_free(g->rep);
	mem_free(g);
}

/* Queue one frame for the command's stream. */
static int gx_queue(struct gexec *g, uint8_t type, const void *p, size_t n)
{
	int r;

	if ((r = buf_put_u8(&g->outq, type)) < 0 || (r = buf_put_bytes(&g->outq, p, n)) < 0)
		return r;
	return 0;
}

static void gx_report_fill(struct gexec *g);

/* Send what the window allows. Frees g when its last frame went out.
 * Output is paused while anything waits, resumed once the queue is empty. */
static void gx_flush(struct gexec *g)
{
	struct session *s = g->s;
	int r = 0;

	if (g->reporting && buf_len(&g->outq) == 0)
		gx_report_fill(g);
	while (buf_len(&g->outq) > 0) {
		struct buf v;
		uint8_t type;
		const uint8_t *p;
		size_t n;

		buf_view(&v, buf_ptr(&g->outq), buf_len(&g->outq));
		if (buf_get_u8(&v, &type) < 0 || buf_get_bytes(&v, &p, &n, WIRE_PAYLOAD_MAX) < 0) {
			r = -EBADMSG; /* our own bug */
			break;
		}
		r = chan_send(s->chan, type, g->stream, p, n);
		if (r == -EAGAIN && (type == WIRE_EXEC_STDOUT || type == WIRE_EXEC_STDERR)) {
			/* Less window than this chunk: send what fits rather than
			 * wait for a whole chunk's worth, which a receiver that
			 * returns credit in quarters of the window might never
			 * grant. The rest stays queued as a shorter entry written
			 * over the bytes just sent. */
			size_t space = chan_send_space(s->chan, g->stream);
			if (space > 0 && space < n && (r = chan_send(s->chan, type, g->stream, p, space)) == 0) {
				/* the new entry's 5-byte header lies within
				 * the old header and the bytes just sent */
				(void)buf_poke_u8(&g->outq, space, type);
				(void)buf_poke_u32(&g->outq, space + 1, (uint32_t)(n - space));
				buf_consume(&g->outq, space);
				continue;
			}
			if (r == 0)
				r = -EAGAIN;
		}
		if (r < 0)
			break;
		buf_consume(&g->outq, 1 + 4 + n);
		if (g->reporting && buf_len(&g->outq) == 0)
			gx_report_fill(g);
	}
	if (r == -EAGAIN) {
		if (!g->paused && g->e) {
			g->paused = true;
			exec_pause_output(g->e, true);
		}
		return;
	}
	if (r < 0) {
		logmsg("session %u: exec stream %u: sending: %s; closing", s->id, g->stream, strerror(-r));
		chan_close(s->chan);
		return;
	}
	if (g->paused && g->e) {
		g->paused = false;
		exec_pause_output(g->e, false);
	}
	if (g->done)
		gx_free(g);
}

static void gx_fail(struct gexec *g, int err, const char *what)
{
	struct buf b;

	logmsg("session %u: exec stream %u: %s", g->s->id, g->stream, what);
	buf_init(&b, WIRE_PAYLOAD_MAX);
	if (wire_error_encode(&b, &(struct wire_error){.code = (uint32_t)err, .msg = (char *)what}) < 0 ||
	    gx_queue(g, WIRE_EXEC_ERROR, buf_ptr(&b), buf_len(&b)) < 0) {
		chan_close(g->s->chan);
	}
	buf_clear(&b);
	exec_free(g->e);
	g->e = NULL;
	proxy_cmd_end(g->s->proxy, g->stream);
	g->done = true;
	gx_flush(g);
}

static void gx_on_output(struct exec *e, int stream, const void *data, size_t n, void *ud)
{
	struct gexec *g = ud;
	(void)e;

	if (gx_queue(g, stream == 2 ? WIRE_EXEC_STDERR : WIRE_EXEC_STDOUT, data, n) < 0) {
		gx_fail(g, ENOBUFS, "output queue over its cap (the host does not return window)");
		return;
	}
	gx_flush(g);
}

static void sweep_strays(struct agent *a);

/* ---- guest changes: reported on the command's stream before its EXIT ---- */

#define REPORT_FILL_BYTES (256u * 1024u) /* CHG_ITEMs made per refill of the queue */
#define SETTLE_ROUNDS	  3		 /* --settle-reports: recoveries per report, events lost again meanwhile */

/* The command running that started last (0: none): who a change belongs to. */
static uint32_t running_by(struct agent *a)
{
	uint64_t best = 0;
	uint32_t by = 0;

	for (struct session *s = a->sessions; s; s = s->next)
		for (struct gexec *g = s->execs; g; g = g->next)
			if (g->e && g->started >= best) {
				best = g->started;
				by = g->stream;
			}
	return by;
}

static void track_note(struct agent *a)
{
	if (a->track)
		track_read(a->track, running_by(a));
}

static void on_track(struct loop *l, int fd, uint32_t events, void *ud)
{
	(void)l;
	(void)fd;
	(void)events;
	track_note(ud);
}

struct expand {
	struct track_dirty *v;
	size_t n, cap;
	uint32_t by;
	int err;
};

static int expand_add(struct expand *x, const char *path, uint32_t by)
{
	if (x->n == x->cap) {
		size_t nc = x->cap ? x->cap * 2 : 256;
		void *nv = mem_realloc(x->v, nc * sizeof(*x->v));
		if (!nv)
			return -ENOMEM;
		x->v = nv;
		x->cap = nc;
	}
	if (!(x->v[x->n].path = mem_strdup(path)))
		return -ENOMEM;
	x->v[x->n].by = by;
	x->v[x->n].tree = false;
	x->n++;
	return 0;
}

static int expand_each(const char *path, const struct stat *st, void *ud)
{
	struct expand *x = ud;
	(void)st;
	return expand_add(x, path, x->by);
}

static bool track_lost(const struct track *t)
{
	struct track_stats st;

	track_get_stats(t, &st);
	return st.lost_now;
}

/* The command's changes, taken from the tracker: every dirty path, each
 * directory created or moved in walked to its contents. */
static int gx_report_take(struct gexec *g)
{
	struct agent *a = g->s->agent;
	struct track_dirty *d = NULL;
	struct expand x = {0};
	size_t n = 0;
	int r;

	track_read(a->track, g->stream); /* everything it did is queued by now */
	/* a vm fork's reports are all the host learns of its changes (doc/VM.md
	 * "fork_changes and try"): what the tracker lost is recovered first,
	 * not left for a later report that may never come */
	if (a->settle_reports && track_lost(a->track)) {
		logmsg("session %u: exec stream %u: the tracker lost events: recovered before its report", g->s->id,
		       g->stream);
		for (int i = 0; i < SETTLE_ROUNDS && track_lost(a->track); i++)
			track_settle(a->track);
	}
	if ((r = track_take(a->track, &d, &n)) < 0)
		return r;
	for (size_t i = 0; i < n && r == 0; i++) {
		if (d[i].tree) {
			x.by = d[i].by;
			size_t before = x.n;
			if (d[i].path[0] && (r = track_walk(a->root_fd, d[i].path, expand_each, &x)) == 0 &&
			    x.n == before)
				r = expand_add(&x, d[i].path, d[i].by); /* gone again */
			else if (!d[i].path[0])
				r = track_walk(a->root_fd, "", expand_each, &x);
		} else {
			r = expand_add(&x, d[i].path, d[i].by);
		}
	}
	for (size_t i = 0; i < n; i++)
		mem_free(d[i].path);
	mem_free(d);
	g->rep = x.v;
	g->nrep = x.n;
	g->irep = 0;
	return r;
}

/* Describe changes into the queue until it holds REPORT_FILL_BYTES; after
 * the last one, the EXIT. */
static void gx_report_fill(struct gexec *g)
{
	struct agent *a = g->s->agent;
	struct buf b;

	buf_init(&b, WIRE_PAYLOAD_MAX);
	while (g->irep < g->nrep && buf_len(&g->outq) < REPORT_FILL_BYTES) {
		struct track_dirty *d = &g->rep[g->irep++];
		struct wire_chg_item it = {.path = d->path, .by = d->by};
		buf_reset(&b);
		if (track_describe(a->root_fd, d->path, syncg_params(a->sync), &it) < 0)
			it = (struct wire_chg_item){.path = d->path, .by = d->by};
		if (wire_chg_item_encode(&b, &it) == 0 && gx_queue(g, WIRE_CHG_ITEM, buf_ptr(&b), buf_len(&b)) < 0)
			chan_close(g->s->chan);
		mem_free(it.target);
	}
	buf_clear(&b);
	if (g->irep < g->nrep)
		return;
	g->reporting = false;
	if (gx_queue(g, WIRE_EXEC_EXIT, buf_ptr(&g->exitf), buf_len(&g->exitf)) < 0)
		chan_close(g->s->chan);
	g->done = true;
}

static void gx_on_exit(struct exec *e, const struct exec_result *x, void *ud)
{
	struct gexec *g = ud;
	struct wire_exec_exit m = {
	    .code = (uint32_t)x->exit_code,
	    .signo = (uint32_t)x->signal,
	    .flags = (uint8_t)((x->timed_out ? WIRE_EXEC_X_TIMED_OUT : 0) | (x->canceled ? WIRE_EXEC_X_CANCELED : 0) |
			       (x->core_dumped ? WIRE_EXEC_X_CORE : 0)),
	    .duration_ms = x->duration_ms,
	    .stdout_bytes = x->stdout_bytes,
	    .stderr_bytes = x->stderr_bytes,
	};

	buf_init(&g->exitf, 64);
	if (wire_exec_exit_encode(&g->exitf, &m) < 0)
		chan_close(g->s->chan);
	if (g->s->agent->verbose)
		logmsg("session %u: exec stream %u: pid %d exit %d signal %d%s in %llu ms", g->s->id, g->stream,
		       (int)x->pid, x->exit_code, x->signal, x->timed_out ? " (timed out)" : "",
		       (unsigned long long)x->duration_ms);
	exec_free(e); /* allowed inside its own callback */
	g->e = NULL;
	/* no new proxy connections; open ones get PROXY_LINGER_MS */
	proxy_cmd_end(g->s->proxy, g->stream);
	struct agent *a = g->s->agent;
	g->reporting = true;
	if (a->track && gx_report_take(g) < 0)
		logmsg("session %u: exec stream %u: out of memory listing its changes", g->s->id, g->stream);
	gx_flush(g); /* the changes, then EXIT; may free g */
	sweep_strays(a);
}

/* Move queued stdin into the command and return the credit to the host. */
static void gx_stdin_pump(struct gexec *g)
{
	uint64_t taken = 0;

	while (g->e && !g->stdin_closed && buf_len(&g->stdinq) > 0) {
		ssize_t w = exec_write_stdin(g->e, buf_ptr(&g->stdinq), buf_len(&g->stdinq));
		if (w == -EAGAIN || w == 0)
			break;
		if (w < 0) {
			/* the command closed its stdin or ended: the rest is dropped */
			w = (ssize_t)buf_len(&g->stdinq);
			g->stdin_closed = true;
		}
		buf_consume(&g->stdinq, (size_t)w);
		taken += (uint64_t)w;
	}
	if (!g->e || g->stdin_closed) {
		taken += buf_len(&g->stdinq);
		buf_reset(&g->stdinq);
	}
	if (g->e && g->stdin_eof && !g->stdin_closed && buf_len(&g->stdinq) == 0) {
		exec_close_stdin(g->e);
		g->stdin_closed = true;
	}
	if (taken && !g->done) {
		struct buf ack;
		buf_init(&ack, 8);
		if (wire_exec_stdin_ack_encode(&ack, &(struct wire_exec_stdin_ack){.bytes = (uint32_t)taken}) == 0 &&
		    gx_queue(g, WIRE_EXEC_STDIN_ACK, buf_ptr(&ack), buf_len(&ack)) == 0)
			gx_flush(g);
		buf_clear(&ack);
	}
}

static void gx_on_stdin_writable(struct exec *e, void *ud)
{
	(void)e;
	gx_stdin_pump(ud);
}

static const struct exec_ops gx_ops = {
    .on_output = gx_on_output,
    .on_exit = gx_on_exit,
    .on_stdin_writable = gx_on_stdin_writable,
};

/* A new command's state on its stream, linked into the session. */
static struct gexec *gx_new(struct session *s, uint32_t stream)
{
	struct gexec *g = mem_calloc(1, sizeof(*g));

	if (!g)
		return NULL;
	g->s = s;
	g->stream = stream;
	buf_init(&g->outq, GX_OUTQ_MAX);
	buf_init(&g->stdinq, GX_STDINQ_MAX);
	g->next = s->execs;
	s->execs = g;
	return g;
}

/* The command's environment (exec_env_build): the forwarded layer, then
 * the request's variables, then the proxy's, so a request cannot point a
 * command elsewhere by accident (nothing else is reachable anyway). On
 * failure msg says why (names only: values may be credentials). */
static int gx_env(struct gexec *g, const struct wire_exec_start *m, char ***envp, char *msg, size_t msglen)
{
	struct session *s = g->s;
	char **penv = NULL;
	const char **reqenv = NULL;
	const char *bad = NULL;
	size_t nreq = m->nenv;
	int r;

	if (m->flags & WIRE_EXEC_F_PROXY) {
		uint16_t port = 0;
		if ((!s->proxy && (r = proxy_new(s->agent->loop, s->chan, &s->proxy)) < 0) ||
		    (r = proxy_cmd_start(s->proxy, g->stream, &port)) < 0 || (r = proxy_env(port, &penv)) < 0) {
			snprintf(msg, msglen, "could not open the egress proxy listener: %s", strerror(-r));
			goto out;
		}
	}
	if (!(reqenv = mem_calloc(m->nenv + PROXY_ENV_COUNT + 1, sizeof(*reqenv)))) {
		snprintf(msg, msglen, "out of memory");
		r = -ENOMEM;
		goto out;
	}
	for (uint32_t i = 0; i < m->nenv; i++)
		reqenv[i] = m->env[i];
	for (char **pe = penv; pe && *pe; pe++)
		reqenv[nreq++] = *pe;
	struct exec_env_in ein = {.home = s->agent->home,
				  .tty = m->flags & WIRE_EXEC_F_TTY,
				  .forwarded = (const char *const *)m->fwd,
				  .n_forwarded = m->nfwd,
				  .request = reqenv,
				  .n_request = nreq};
	if ((r = exec_env_build(&ein, envp, &bad)) < 0) {
		/* the name only: the value may be a credential */
		snprintf(msg, msglen, "environment entry '%.*s': %s",
			 bad ? (int)(strcspn(bad, "=") < 200 ? strcspn(bad, "=") : 200) : 1, bad ? bad : "?",
			 r == -E2BIG ? "environment too large" : "not NAME=value with a valid name");
	}
out:
	proxy_env_free(penv);
	mem_free(reqenv);
	return r;
}

/* Start the command; on failure msg says why. */
static int gx_spawn(struct gexec *g, const struct wire_exec_start *m, char **envp, char *msg, size_t msglen)
{
	struct agent *a = g->s->agent;
	struct exec_req q = {
	    .argv = (const char *const *)m->argv,
	    .root_fd = a->root_fd,
	    .cwd = m->cwd,
	    .envp = (const char *const *)envp,
	    .timeout_ms = m->timeout_ms,
	    .tty = m->flags & WIRE_EXEC_F_TTY,
	    .rows = m->rows,
	    .cols = m->cols,
	    .stdin_open = m->flags & WIRE_EXEC_F_STDIN,
	    .uid = a->run_uid,
	    .gid = a->run_gid,
	    .confine = a->confine,
	};
	int r;

	if ((r = exec_start(a->loop, a->xsys, &q, &gx_ops, g, &g->e)) < 0) {
		g->e = NULL;
		if (r == -EXDEV)
			snprintf(msg, msglen, "cwd '%.200s' leaves the workspace", m->cwd);
		else if (r == -ENOENT || r == -ENOTDIR || r == -EACCES)
			snprintf(msg, msglen, "cwd '%.200s': %s", m->cwd, strerror(-r));
		else
			snprintf(msg, msglen, "could not start '%.200s': %s", m->argv[0], strerror(-r));
		return r;
	}
	if (a->verbose)
		logmsg("session %u: exec stream %u: '%s' pid %d", g->s->id, g->stream, m->argv[0], (int)exec_pid(g->e));
	return 0;
}

/* Queue EXEC_STARTED with the command's pid; a failure drops the session. */
static int gx_started(struct gexec *g)
{
	struct wire_exec_started st = {.pid = (uint64_t)exec_pid(g->e)};
	struct buf b;
	int r;

	buf_init(&b, 16);
	if ((r = wire_exec_started_encode(&b, &st)) == 0 &&
	    (r = gx_queue(g, WIRE_EXEC_STARTED, buf_ptr(&b), buf_len(&b))) == 0)
		gx_flush(g);
	buf_clear(&b);
	return r;
}

static int handle_exec_start(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct wire_exec_start m;
	struct gexec *g;
	char **envp = NULL;
	/* the frame's plaintext: wiped at the end when it carries credentials */
	uint8_t *frame = (uint8_t *)(uintptr_t)buf_ptr(in);
	size_t frame_len = buf_len(in);
	bool secret = frame_len > 0 && (frame[0] & WIRE_EXEC_F_FWD);
	char msg[512];
	int r;
	(void)type;

	/* host-opened streams are odd; one command per stream */
	if (stream == WIRE_STREAM_CONTROL || !(stream & 1) || gx_find(s, stream))
		return -EPROTO;
	if ((r = wire_exec_start_decode(in, &m)) < 0)
		goto out;
	if (!(g = gx_new(s, stream))) {
		r = -ENOMEM;
		goto out;
	}
	track_note(s->agent); /* what happened before it started is not its change */
	g->started = ++s->agent->starts;
	/* From here on a failure is the command's, not the session's: it is
	 * answered with EXEC_ERROR on its stream. */
	if ((r = gx_env(g, &m, &envp, msg, sizeof(msg))) < 0 || (r = gx_spawn(g, &m, envp, msg, sizeof(msg))) < 0) {
		gx_fail(g, -r, msg);
		r = 0;
		goto out;
	}
	r = gx_started(g);
out:
	/* Credentials live only for building the command's environment:
	 * wipe every copy (the request's own env too, it may hold secrets;
	 * wire_exec_start_clear wipes the decoded strings). */
	for (char **p = envp; p && *p; p++)
		sodium_memzero(*p, strlen(*p));
	if (secret)
		sodium_memzero(frame, frame_len);
	exec_env_free(envp);
	wire_exec_start_clear(&m);
	return r;
}

/* A frame for a command that already ended: the host has not seen its
 * EXIT yet. Forget the stream state chan re-created for the frame. */
static void gx_stale(struct session *s, uint32_t stream)
{
	if (stream != WIRE_STREAM_CONTROL)
		chan_stream_close(s->chan, stream);
}

static int handle_exec_stdin(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct gexec *g = gx_find(s, stream);
	struct wire_exec_stdin m;
	int r;
	(void)type;

	if ((r = wire_exec_stdin_decode(in, &m)) < 0)
		return r;
	if (!g) {
		gx_stale(s, stream);
		return 0;
	}
	if (!g->e || g->stdin_eof)
		return 0; /* ending: the host forgets it on EXIT */
	if (m.len && (r = buf_put(&g->stdinq, m.data, m.len)) < 0)
		return -EPROTO; /* over the stdin window */
	if (m.eof)
		g->stdin_eof = true;
	gx_stdin_pump(g);
	return 0;
}

static int handle_exec_signal(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct gexec *g = gx_find(s, stream);
	struct wire_exec_signal m;
	int r;
	(void)type;

	if ((r = wire_exec_signal_decode(in, &m)) < 0)
		return r;
	if (!g)
		gx_stale(s, stream);
	else if (g->e)
		exec_signal(g->e, (int)m.signo); /* -ESRCH: the group is gone, nothing to do */
	return 0;
}

static int handle_exec_resize(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct gexec *g = gx_find(s, stream);
	struct wire_exec_resize m;
	int r;
	(void)type;

	if ((r = wire_exec_resize_decode(in, &m)) < 0)
		return r;
	if (!g)
		gx_stale(s, stream);
	else if (g->e)
		exec_resize(g->e, m.rows, m.cols);
	return 0;
}

static int handle_exec_cancel(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct gexec *g = gx_find(s, stream);
	(void)type, (void)in;

	if (!g)
		gx_stale(s, stream);
	else if (g->e)
		exec_cancel(g->e);
	return 0;
}

/* ---- changes: the host pulls what commands changed (gpull.h) ---- */

static void pulls_pump(struct session *s)
{
	for (size_t i = 0; i < SESSION_PULLS_MAX; i++) {
		if (!s->pulls[i])
			continue;
		int r = gpull_pump(s->pulls[i]);
		if (r == 0)
			continue;
		if (r < 0) {
			logmsg("session %u: pull stream %u: sending: %s; closing", s->id, gpull_stream(s->pulls[i]),
			       strerror(-r));
			chan_close(s->chan);
			return;
		}
		chan_stream_close(s->chan, gpull_stream(s->pulls[i]));
		gpull_free(s->pulls[i]);
		s->pulls[i] = NULL;
	}
}

static int handle_chg_pull(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	struct agent *a = s->agent;
	size_t i;
	int r;
	(void)type;

	if (stream == WIRE_STREAM_CONTROL || !(stream & 1) || gx_find(s, stream))
		return -EPROTO;
	for (i = 0; i < SESSION_PULLS_MAX; i++) {
		if (s->pulls[i] && gpull_stream(s->pulls[i]) == stream)
			return -EPROTO;
	}
	for (i = 0; i < SESSION_PULLS_MAX && s->pulls[i]; i++)
		;
	if (i == SESSION_PULLS_MAX) {
		send_error(s, stream, EBUSY, "too many pulls at once");
		return 0;
	}
	if ((r = gpull_new(s->chan, stream, a->root_fd, syncg_params(a->sync), buf_ptr(in), buf_len(in),
			   &s->pulls[i])) < 0)
		return r;
	chan_consume(s->chan, stream, buf_len(in));
	pulls_pump(s);
	return 0;
}

/* ---- proxy: guest-opened streams to the host's egress proxy (proxy.h) ---- */

static int handle_proxy(struct session *s, uint8_t type, uint32_t stream, struct buf *in)
{
	return proxy_frame(s->proxy, type, stream, buf_ptr(in), buf_len(in));
}

static void exec_writable(struct session *s)
{
	struct gexec *g = s->execs, *next;

	for (; g; g = next) {
		next = g->next; /* gx_flush may free g */
		gx_flush(g);
	}
}

/* The frames a host may send; names for logs are wire_type_name's. */
static const struct {
	frame_fn *fn;
	bool before_hello; /* allowed before HELLO */
} handlers[WIRE_TYPE_MAX + 1] = {
    [WIRE_HELLO] = {handle_hello, true},
    [WIRE_PING] = {handle_ping, true},
    [WIRE_BULK_DATA] = {handle_bulk_data, false},
    [WIRE_BULK_END] = {handle_bulk_end, false},
    [WIRE_SYNC_BEGIN] = {handle_sync, false},
    [WIRE_SYNC_LEVELS_REQ] = {handle_sync, false},
    [WIRE_SYNC_ENTRIES_REQ] = {handle_sync, false},
    [WIRE_SYNC_BATCH] = {handle_sync, false},
    [WIRE_EXEC_START] = {handle_exec_start, false},
    [WIRE_EXEC_STDIN] = {handle_exec_stdin, false},
    [WIRE_EXEC_SIGNAL] = {handle_exec_signal, false},
    [WIRE_EXEC_RESIZE] = {handle_exec_resize, false},
    [WIRE_EXEC_CANCEL] = {handle_exec_cancel, false},
    [WIRE_PROXY_OPEN] = {handle_proxy, false},
    [WIRE_PROXY_DATA] = {handle_proxy, false},
    [WIRE_PROXY_EOF] = {handle_proxy, false},
    [WIRE_PROXY_CLOSE] = {handle_proxy, false},
    [WIRE_CHG_PULL] = {handle_chg_pull, false},
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
	if (s->superseded)
		return;
	if ((r = handlers[type].fn(s, type, stream, &in)) < 0 && r != -EAGAIN) {
		logmsg("session %u: %s on stream %u: %s; closing", s->id, wire_type_name(type), stream, strerror(-r));
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
	/* a session that ends kills its commands */
	while (s->execs)
		gx_free(s->execs);
	proxy_free(s->proxy); /* after the commands: gx_free ends their listeners */
	for (size_t i = 0; i < SESSION_PULLS_MAX; i++)
		gpull_free(s->pulls[i]);
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
	else if (!transport_is_stream_listener(&a->addr) && st.bytes_in == 0) {
		/* serial: the device was handed to a session while the host
		 * that just said BYE was still connected; it then left. */
		if (a->verbose)
			logmsg("session %u: the host left before a handshake", s->id);
	} else
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
		return;
	}
	exec_writable(s);
	pulls_pump(s);
	proxy_writable(s->proxy);
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

static void on_serial_event(struct loop *l, int fd, uint32_t events, void *ud);

/* Hand the serial device to a new session when none holds it and a host is
 * at the other end. While nobody is there (-EAGAIN) the device is watched,
 * edge-triggered: the host connecting wakes the port's wait queue and
 * on_serial_event tries again. While a session holds the device it is not
 * watched here, so the session's own (level-triggered) watch is the only
 * one on the port. */
static void serial_next(struct agent *a)
{
	int fd, r;

	for (int tries = 0; tries < 2; tries++) {
		fd = transport_accept(&a->addr, a->lfd);
		if (fd >= 0) {
			if (a->lfd_watched) {
				loop_del_fd(a->loop, a->lfd);
				a->lfd_watched = false;
			}
			session_start(a, fd);
			return;
		}
		if (fd != -EAGAIN) {
			logmsg("serial device: cannot start a session: %s", strerror(-fd));
			return;
		}
		if (a->lfd_watched)
			return;
		/* Watch, then look once more: a host that connected between
		 * the first look and the watch raised no edge for us. */
		if ((r = loop_add_fd(a->loop, a->lfd, EPOLLIN | EPOLLOUT | EPOLLET, on_serial_event, a)) < 0) {
			logmsg("serial device: epoll: %s", strerror(-r));
			return;
		}
		a->lfd_watched = true;
	}
}

static void on_serial_event(struct loop *l, int fd, uint32_t events, void *ud)
{
	(void)l;
	(void)fd;
	(void)events;
	serial_next(ud);
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

/* PID 1 of the sandbox's pid namespace: orphans are re-parented to us.
 * Reap the zombies among our children that are not commands: a command's
 * main process stays a zombie until exec.c collects it (its pid is its
 * process group id, see exec.c), so waitpid(-1) is never called. The
 * children are found in /proc (bounded by the sandbox's process count). */
static bool is_command_pid(struct agent *a, pid_t pid)
{
	for (struct session *s = a->sessions; s; s = s->next)
		for (struct gexec *g = s->execs; g; g = g->next)
			if (g->e && exec_pid(g->e) == pid)
				return true;
	return false;
}

static void reap_orphans(struct agent *a)
{
	DIR *d = opendir("/proc");
	struct dirent *de;
	pid_t self = getpid();

	if (!d)
		return;
	while ((de = readdir(d))) {
		char path[64], buf[512], *p;
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		ssize_t n;
		int fd;

		if (*end || pid <= 1)
			continue;
		snprintf(path, sizeof(path), "/proc/%ld/stat", pid);
		if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0)
			continue;
		n = read(fd, buf, sizeof(buf) - 1);
		close(fd);
		if (n <= 0)
			continue;
		buf[n] = '\0';
		/* "pid (comm) S ppid ...": comm may hold anything, even ')' */
		if (!(p = strrchr(buf, ')')) || p[1] != ' ' || p[2] != 'Z')
			continue;
		if (strtol(p + 4, NULL, 10) != self || is_command_pid(a, (pid_t)pid))
			continue;
		siginfo_t si;
		(void)waitid(P_PID, (id_t)pid, &si, WEXITED | WNOHANG);
	}
	closedir(d);
}

/* PID 1 with --confine and without cgroups (the local sandbox, where every
 * process but the agent descends from a command): once no command runs, every
 * other process in the namespace escaped a finished command's process
 * group (setsid, daemons): kill them, as a cgroup kill would have with
 * their command (exec.h: background jobs die with their command). */
static void sweep_strays(struct agent *a)
{
	DIR *d;
	struct dirent *de;

	if (!a->init || !a->confine || (exec_sys_caps(a->xsys) & EXEC_CAP_CG2))
		return;
	for (struct session *s = a->sessions; s; s = s->next)
		for (struct gexec *g = s->execs; g; g = g->next)
			if (g->e)
				return;
	if (!(d = opendir("/proc")))
		return;
	while ((de = readdir(d))) {
		char *end;
		long pid = strtol(de->d_name, &end, 10);
		if (!*end && pid > 1)
			(void)kill((pid_t)pid, SIGKILL);
	}
	closedir(d);
}

static void on_signal(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct agent *a = ud;
	struct signalfd_siginfo si;
	(void)events;

	while (read(fd, &si, sizeof(si)) == (ssize_t)sizeof(si)) {
		if (si.ssi_signo == SIGCHLD) {
			reap_orphans(a);
			continue;
		}
		/* As PID 1, a signal from inside the namespace (a command's) has
		 * a sender pid; the host's stop comes from outside (pid 0). */
		if (a->init && si.ssi_pid != 0) {
			logmsg("signal %u from pid %u inside the sandbox: ignored", si.ssi_signo, si.ssi_pid);
			continue;
		}
		logmsg("signal %u: shutting down", si.ssi_signo);
		loop_stop(l);
		return;
	}
}

/* The directory part of path ("." when none) into out. */
static void dir_of(const char *path, char *out, size_t n)
{
	const char *slash = strrchr(path, '/');

	if (!slash)
		snprintf(out, n, ".");
	else if (slash == path)
		snprintf(out, n, "/");
	else
		snprintf(out, n, "%.*s", (int)(slash - path), path);
}

/* --confine: commands write only the workspace, /tmp, --home and a few
 * devices, and read nothing of the agent's (doc/SANDBOX.md). */
static int confine_setup(struct agent *a, const char *keyfile)
{
	char keydir[PATH_MAX], rundir[PATH_MAX], statedir[PATH_MAX], err[512];
	const char *writable[] = {a->root,     "/tmp",	    a->home ? a->home : "/tmp",
				  "/dev/null", "/dev/zero", "/dev/full",
				  "/dev/tty",  "/dev/pts",  "/dev/ptmx",
				  "/dev/shm",  NULL};
	const char *hidden[4] = {keydir, statedir, NULL, NULL};
	int r;

	dir_of(keyfile, keydir, sizeof(keydir));
	snprintf(statedir, sizeof(statedir), "%s", syncg_state_dir(a->sync));
	if (a->addr.kind == TRANSPORT_UNIX) {
		dir_of(a->addr.path, rundir, sizeof(rundir));
		hidden[2] = rundir;
	}
	for (int i = 0; hidden[i]; i++) {
		size_t n = strlen(hidden[i]);
		if (hidden[i][0] != '/' || n == 1) {
			logmsg("--confine: the key, state and socket directories must be absolute and not / (%s)",
			       hidden[i]);
			return -EINVAL;
		}
		/* commands must still reach the workspace */
		if (!strncmp(a->root, hidden[i], n) && (a->root[n] == '/' || !a->root[n])) {
			logmsg("--confine: the workspace %s is inside %s, which commands may not read", a->root,
			       hidden[i]);
			return -EINVAL;
		}
	}
	struct exec_confine_cfg cfg = {.writable = writable, .hidden = hidden, .file_max = a->file_max};
	if ((r = exec_confine_new(&cfg, &a->confine, err, sizeof(err))) < 0) {
		logmsg("--confine: %s", err);
		return r;
	}
	logmsg("exec: commands confined: %s", exec_confine_describe(a->confine));
	return 0;
}

/* --run-as USER | UID:GID. USER is looked up in /etc/passwd by hand (no NSS:
 * the agent links statically). 0 or -EINVAL / -ENOENT. */
static int parse_run_as(const char *spec, uint32_t *uid, uint32_t *gid)
{
	char *end;
	unsigned long u, g;
	FILE *f;
	char line[1024];
	int r = -ENOENT;

	u = strtoul(spec, &end, 10);
	if (end != spec && *end == ':') {
		g = strtoul(end + 1, &end, 10);
		if (*end || u >= EXEC_ID_KEEP || g >= EXEC_ID_KEEP)
			return -EINVAL;
		*uid = (uint32_t)u;
		*gid = (uint32_t)g;
		return 0;
	}
	if (!(f = fopen("/etc/passwd", "re")))
		return -ENOENT;
	while (fgets(line, sizeof(line), f)) {
		char *name = strtok(line, ":"), *pw = strtok(NULL, ":"), *us = strtok(NULL, ":"),
		     *gs = strtok(NULL, ":");
		(void)pw;
		if (name && us && gs && !strcmp(name, spec)) {
			*uid = (uint32_t)strtoul(us, NULL, 10);
			*gid = (uint32_t)strtoul(gs, NULL, 10);
			r = 0;
			break;
		}
	}
	fclose(f);
	return r;
}

static void usage(FILE *f)
{
	fputs("usage: airlock-agent --listen ADDR --root DIR --key FILE (--allow PUBKEY | --allow-file FILE)...\n"
	      "                     [--psk-file FILE] [--max-sessions N] [--state DIR] [--fsync none|batch|file]\n"
	      "                     [--run-as USER|UID:GID] [--home DIR] [--confine [--file-max BYTES]] [-v]\n"
	      "       airlock-agent --vm-init CTL CFG WS PORT   (the vm template's init: doc/VM.md, \"Snapshots\")\n"
	      "  --home DIR: HOME of commands (default /tmp)\n"
	      "  --confine: Landlock and seccomp for commands (they write only ROOT, /tmp and\n"
	      "             --home; they cannot read the key, state or socket directories);\n"
	      "             --file-max: the largest file they may write (RLIMIT_FSIZE)\n"
	      "  --no-track: do not track guest changes (no watch on every directory: a start that does\n"
	      "              not grow with the tree; commands report none)\n"
	      "  --settle-reports: a command's report of its changes waits for the recovery of events\n"
	      "              the tracker lost (a vm fork's: the host keeps its reports as its changes)\n"
	      "  --run-as: who runs commands when the agent is root (default: the owner of ROOT\n"
	      "            when that is not root, else nobody, 65534:65534)\n"
	      "  --state DIR: where the last applied sync sequence is kept (default ROOT.airlock-state;\n"
	      "               must be outside ROOT)\n"
	      "  ADDR: tcp:HOST:PORT | unix:PATH | vsock:CID:PORT | serial:DEVICE\n",
	      f);
}

static int load_psk(struct agent *a, const char *path)
{
	char err[600];
	int r = keys_load_psk(path, a->psk, err, sizeof(err));

	if (r < 0) {
		logmsg("%s", err);
		return r;
	}
	a->have_psk = true;
	return 0;
}

struct agent_args {
	const char *listen, *keyfile, *run_as;
	bool confine;
	bool no_track; /* --no-track: a fork's agent (its changes are read from its overlay upper) */
};

static int parse_allow_file(struct agent *a, const char *path)
{
	uint8_t(*keys)[32] = NULL;
	size_t n = 0;
	char err[512];

	if (keys_load_allow_file(path, &keys, &n, err, sizeof(err)) < 0) {
		logmsg("%s", err);
		return 2;
	}
	for (size_t i = 0; i < n; i++)
		if (chan_peers_allow(a->peers, keys[i]) < 0)
			break;
	mem_free(keys);
	return 0;
}

static int parse_fsync(struct agent *a, const char *v)
{
	if (!strcmp(v, "none"))
		a->apply_opts.fsync = APPLY_FSYNC_NONE;
	else if (!strcmp(v, "batch"))
		a->apply_opts.fsync = APPLY_FSYNC_BATCH;
	else if (!strcmp(v, "file"))
		a->apply_opts.fsync = APPLY_FSYNC_FILE;
	else {
		logmsg("--fsync must be none, batch or file");
		return 2;
	}
	return 0;
}

/* Command-line options into a; 0, or the exit status (2 for a usage
 * error, -1 for --help (exit 0), 1 otherwise) when the agent must not run. */
static int parse_options(struct agent *a, struct agent_args *o, int argc, char **argv)
{
	static const struct option opts[] = {
	    {"listen", required_argument, NULL, 'l'},
	    {"root", required_argument, NULL, 'r'},
	    {"key", required_argument, NULL, 'k'},
	    {"allow", required_argument, NULL, 'a'},
	    {"allow-file", required_argument, NULL, 'A'},
	    {"psk-file", required_argument, NULL, 'p'},
	    {"max-sessions", required_argument, NULL, 'm'},
	    {"verbose", no_argument, NULL, 'v'},
	    {"state", required_argument, NULL, 'S'},
	    {"fsync", required_argument, NULL, 'F'},
	    {"run-as", required_argument, NULL, 'U'},
	    {"home", required_argument, NULL, 'H'},
	    {"confine", no_argument, NULL, 'C'},
	    {"file-max", required_argument, NULL, 'X'},
	    {"no-track", no_argument, NULL, 'N'},
	    {"settle-reports", no_argument, NULL, 'R'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	int c, st;

	while ((c = getopt_long(argc, argv, "v", opts, NULL)) != -1) {
		switch (c) {
		case 'l':
			o->listen = optarg;
			break;
		case 'r':
			a->root = optarg;
			break;
		case 'k':
			o->keyfile = optarg;
			break;
		case 'a': {
			uint8_t pk[32];
			if (keys_pub_parse(optarg, pk) < 0) {
				logmsg("--allow '%s': not a public key (44 characters of base64)", optarg);
				return 2;
			}
			if (chan_peers_allow(a->peers, pk) < 0)
				return 1;
			break;
		}
		case 'A':
			if ((st = parse_allow_file(a, optarg)) != 0)
				return st;
			break;
		case 'p':
			if (load_psk(a, optarg) < 0)
				return 2;
			break;
		case 'm':
			a->max_sessions = (unsigned)strtoul(optarg, NULL, 10);
			if (a->max_sessions == 0 || a->max_sessions > 1024) {
				logmsg("--max-sessions must be 1..1024");
				return 2;
			}
			break;
		case 'v':
			a->verbose++;
			break;
		case 'S':
			a->state_dir = optarg;
			break;
		case 'F':
			if ((st = parse_fsync(a, optarg)) != 0)
				return st;
			break;
		case 'U':
			o->run_as = optarg;
			break;
		case 'H':
			a->home = optarg;
			break;
		case 'C':
			o->confine = true;
			break;
		case 'N':
			o->no_track = true;
			break;
		case 'R':
			a->settle_reports = true;
			break;
		case 'X': {
			char *end;
			errno = 0;
			a->file_max = strtoull(optarg, &end, 10);
			if (errno || end == optarg || *end || a->file_max == 0) {
				logmsg("--file-max '%s': expected a number of bytes > 0", optarg);
				return 2;
			}
			break;
		}
		case 'h':
			usage(stdout);
			return -1; /* exit 0 */
		default:
			usage(stderr);
			return 2;
		}
	}
	if (!o->listen || !a->root || !o->keyfile || chan_peers_count(a->peers) == 0) {
		if (o->listen && a->root && o->keyfile)
			logmsg("no host is allowed: give at least one --allow PUBKEY or --allow-file FILE");
		usage(stderr);
		return 2;
	}
	return 0;
}

/* Who runs commands. Commands never run as root: as --run-as, else as
 * the owner of the workspace (so they can write it) when that is not root,
 * else as nobody (the workspace is then read-only to them). A non-root
 * agent runs them as itself. What the sync writes is given to that user
 * (but not to nobody). 0 or the exit status. */
static int setup_run_as(struct agent *a, const char *run_as)
{
	struct stat rst;
	int r;

	if (geteuid() != 0)
		return 0;
	if (run_as) {
		if ((r = parse_run_as(run_as, &a->run_uid, &a->run_gid)) < 0) {
			logmsg("--run-as '%s': %s", run_as,
			       r == -EINVAL ? "not USER or UID:GID" : "no such user in /etc/passwd");
			return 2;
		}
	} else if (fstat(a->root_fd, &rst) == 0 && rst.st_uid != 0) {
		a->run_uid = rst.st_uid;
		a->run_gid = rst.st_gid;
	} else {
		a->run_uid = a->run_gid = 65534;
		return 0; /* nobody: the workspace stays read-only to commands */
	}
	if (a->run_uid == 0) {
		logmsg("warning: --run-as root: commands run with the agent's full privileges");
		return 0;
	}
	/* the host's files are the command user's to change, as theirs are */
	a->apply_opts.own = true;
	a->apply_opts.uid = a->run_uid;
	a->apply_opts.gid = a->run_gid;
	return 0;
}

/* Keys, the workspace and its sync state, who runs commands and how.
 * 0 or the exit status. */
static int setup_workspace(struct agent *a, const struct agent_args *o)
{
	char err[512];
	int r, st;

	if (keys_load(o->keyfile, &a->key, err, sizeof(err)) < 0) {
		logmsg("%s", err);
		return 2;
	}
	/* Commands share our uid in the sandbox: non-dumpable, they can
	 * neither ptrace us nor read our memory or environ in /proc. */
	a->init = getpid() == 1;
	if ((o->confine || a->init) && prctl(PR_SET_DUMPABLE, 0, 0, 0, 0) < 0) {
		logmsg("prctl(PR_SET_DUMPABLE): %s", strerror(errno));
		return 1;
	}
	if (mkdir(a->root, 0755) < 0 && errno != EEXIST) {
		logmsg("--root %s: %s", a->root, strerror(errno));
		return 1;
	}
	if ((a->root_fd = open(a->root, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		logmsg("--root %s: %s", a->root, strerror(errno));
		return 1;
	}
	if ((st = setup_run_as(a, o->run_as)) != 0)
		return st;
	if (syncg_open(a->root, a->state_dir, &a->apply_opts, a->key.pub, &a->sync, err, sizeof(err)) < 0) {
		logmsg("%s", err);
		return 1;
	}
	if ((r = exec_sys_new(NULL, &a->xsys)) < 0) {
		logmsg("exec: %s", strerror(-r));
		return 1;
	}
	if (a->run_uid != EXEC_ID_KEEP)
		logmsg("exec: commands run as uid %u gid %u; %s", a->run_uid, a->run_gid, exec_sys_describe(a->xsys));
	else
		logmsg("exec: commands run as the agent (uid %u); %s", (unsigned)geteuid(), exec_sys_describe(a->xsys));
	logmsg("sync state in %s (last applied batch %llu)", syncg_state_dir(a->sync),
	       (unsigned long long)syncg_last_seq(a->sync));
	return 0;
}

/* The event loop and its signals (SIGINT, SIGTERM; SIGCHLD as PID 1). */
static int setup_loop(struct agent *a)
{
	sigset_t mask;

	if (!(a->loop = loop_new())) {
		logmsg("out of memory");
		return 1;
	}
	signal(SIGPIPE, SIG_IGN);
	sigemptyset(&mask);
	sigaddset(&mask, SIGINT);
	sigaddset(&mask, SIGTERM);
	if (a->init)
		sigaddset(&mask, SIGCHLD); /* orphans to reap */
	sigprocmask(SIG_BLOCK, &mask, NULL);
	if ((a->sfd = signalfd(-1, &mask, SFD_NONBLOCK | SFD_CLOEXEC)) < 0 ||
	    loop_add_fd(a->loop, a->sfd, EPOLLIN, on_signal, a) < 0) {
		logmsg("signalfd: %s", strerror(errno));
		return 1;
	}
	return 0;
}

/* Guest changes: a watch on every directory of the copy. Without inotify
 * nothing is reported back (commands still run). After the readiness line:
 * the walk grows with the tree, and the host need not wait for it (no
 * session is served before it ends, so no command runs unwatched). */
static void setup_track(struct agent *a, const struct agent_args *o)
{
	char rroot[PATH_MAX], err[512] = "";
	int r;

	if (o->no_track)
		return;
	if (!realpath(a->root, rroot) || (r = track_new(a->root_fd, rroot, &a->track, err, sizeof(err))) < 0) {
		logmsg("guest changes are not tracked: %s", err[0] ? err : strerror(errno));
		a->track = NULL;
		return;
	}
	if (err[0])
		logmsg("%s", err);
	if (loop_add_fd(a->loop, track_fd(a->track), EPOLLIN, on_track, a) < 0) {
		logmsg("inotify: cannot watch its descriptor; guest changes are not tracked");
		track_free(a->track);
		a->track = NULL;
		return;
	}
	syncg_set_track(a->sync, a->track); /* a scan from now on may be skipped while it sees nothing */
}

/* Listen on the transport address and print the readiness line. */
static int setup_listener(struct agent *a)
{
	char err[512], where[256], self[KEYS_B64_LEN];
	int r;

	if ((a->lfd = transport_listen(&a->addr, err, sizeof(err))) < 0) {
		logmsg("%s", err);
		return 1;
	}
	if ((a->addr.kind == TRANSPORT_TCP || a->addr.kind == TRANSPORT_VSOCK) && a->addr.port == 0) {
		int port = transport_bound_port(a->lfd);
		if (port > 0)
			a->addr.port = (uint32_t)port;
	}
	transport_format(&a->addr, where, sizeof(where));
	keys_pub_format(a->key.pub, self);
	logmsg("listening on %s (key %s, %zu allowed host key%s)", where, self, chan_peers_count(a->peers),
	       chan_peers_count(a->peers) == 1 ? "" : "s");
	if (transport_is_stream_listener(&a->addr)) {
		if ((r = loop_add_fd(a->loop, a->lfd, EPOLLIN, on_listen, a)) < 0) {
			logmsg("epoll: %s", strerror(-r));
			return 1;
		}
	} else {
		serial_next(a);
	}
	/* Readiness line for scripts: printed after the socket exists. */
	fprintf(stdout, "ready %s\n", where);
	fflush(stdout);
	return 0;
}

static void agent_teardown(struct agent *a)
{
	while (a->sessions)
		session_drop(a->sessions);
	if (a->lfd >= 0)
		close(a->lfd);
	if (a->sfd >= 0)
		close(a->sfd);
	if (a->addr.kind == TRANSPORT_UNIX && a->lfd >= 0)
		unlink(a->addr.path);
	exec_sys_free(a->xsys);
	exec_confine_free(a->confine);
	if (a->root_fd >= 0)
		close(a->root_fd);
	loop_free(a->loop);
	track_free(a->track);
	syncg_free(a->sync);
	chan_peers_free(a->peers);
	sodium_memzero(&a->key, sizeof(a->key));
	sodium_memzero(a->psk, sizeof(a->psk));
}

int main(int argc, char **argv)
{
	struct agent a = {.lfd = -1,
			  .sfd = -1,
			  .root_fd = -1,
			  .run_uid = EXEC_ID_KEEP,
			  .run_gid = EXEC_ID_KEEP,
			  .max_sessions = 16,
			  .apply_opts = {.fsync = APPLY_FSYNC_BATCH}};
	struct agent_args o = {0};
	char err[512];
	int r, status;

	/* the vm template's first agent: the start line and the sandbox's
	 * setup come first, before libsodium is initialised (vmstart.h) */
	if (argc >= 2 && !strcmp(argv[1], "--vm-init") && vmstart_init(argc, argv, &argc, &argv) < 0)
		return VMSTART_EXIT;
	mem_tune(); /* before any thread */
	if (sodium_init() < 0) {
		logmsg("libsodium failed to initialise");
		return 1;
	}
	mem_init_json();
	if (!(a.peers = chan_peers_new())) {
		logmsg("out of memory");
		return 1;
	}
	if ((status = parse_options(&a, &o, argc, argv)) != 0 || (status = setup_workspace(&a, &o)) != 0)
		goto out;
	if (transport_parse(o.listen, &a.addr, err, sizeof(err)) < 0) {
		logmsg("--listen: %s", err);
		status = 2;
		goto out;
	}
	if ((status = setup_loop(&a)) != 0)
		goto out;
	if (o.confine && confine_setup(&a, o.keyfile) < 0) {
		status = 2;
		goto out;
	}
	if ((status = setup_listener(&a)) != 0)
		goto out;
	setup_track(&a, &o);
	status = 1;
	if ((r = loop_run(a.loop)) < 0) {
		logmsg("event loop: %s", strerror(-r));
		goto out;
	}
	status = 0;
out:
	agent_teardown(&a);
	return status < 0 ? 0 : status;
}
