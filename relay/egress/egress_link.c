/* SPDX-License-Identifier: Apache-2.0 */
/*
 * egress_link: guest proxy streams -> socketpairs adopted by the egress
 * proxy; denials -> audit file and the command's stderr (egress_link.h).
 */
#include "airlock/egress/egress_link.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/core/buf.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/tunnel.h"
#include "airlock/core/wire.h"
#include "airlock/egress/egress.h"
#include "airlock/policy/policy.h"
#include "airlock/server/relay.h"
#include "airlock/sync/audit.h"

struct ltun {
	struct egress_link *k;
	struct ltun *next;
	struct tunnel *t;
	uint32_t stream, exec_stream;
};

struct egress_link {
	struct loop *loop;
	const struct policy *policy;
	char *workspace;
	const struct egress_link_ops *ops;
	void *ud;
	struct egress *eg;

	struct chan *chan; /* the current session, NULL between sessions */
	uint32_t gen;	   /* session generation: the high half of client ids */
	struct ltun *tuns;
	size_t ntun;

	json_t *denials; /* not yet written: newest last, at most EGRESS_LINK_KEEP */
	uint64_t total;	 /* how many denials that is, those beyond the array included */
	bool dirty;
	uint64_t last_write_ms, write_timer;
	struct egress_link_stats st;
};

static void changed(struct egress_link *k)
{
	if (k->ops->on_change)
		k->ops->on_change(k->ud);
}

/* ---- audit ---- */

/* The record on disk and this link's denials since its last write, merged:
 * the daemon's sandbox and each of its forks have a link of their own over
 * one workspace's egress.json (all on the loop's thread), and none may
 * overwrite what another recorded. */
static void write_audit(struct egress_link *k)
{
	char err[512];
	json_t *o = NULL, *all, *prev;
	void *oldv = NULL; /* a json_t * (audit.h) */
	json_t *old;
	json_int_t total = 0;

	k->dirty = false;
	k->last_write_ms = loop_now_ms();
	if (audit_read_json(k->workspace, AUDIT_EGRESS_FILE, &oldv, err, sizeof(err)) < 0)
		oldv = NULL; /* unreadable: this link's denials start it again */
	old = oldv;
	prev = old ? json_object_get(old, "denials") : NULL;
	total = old ? json_integer_value(json_object_get(old, "denials_total")) : 0;
	all = json_is_array(prev) ? json_deep_copy(prev) : json_array();
	json_decref(old);
	if (all && json_array_extend(all, k->denials) == 0) {
		total = (total > 0 ? total : 0) + (json_int_t)k->total;
		while (json_array_size(all) > EGRESS_LINK_KEEP)
			json_array_remove(all, 0);
		if (total < (json_int_t)json_array_size(all))
			total = (json_int_t)json_array_size(all);
		o = json_pack("{s:i, s:O, s:I, s:I}", "version", 1, "denials", all, "denials_total", total,
			      "denials_omitted", total - (json_int_t)json_array_size(all));
	}
	json_decref(all);
	if (!o || audit_write_json(k->workspace, AUDIT_EGRESS_FILE, o, err, sizeof(err)) < 0)
		fprintf(stderr, "airlock: egress audit record: %s\n", o ? err : "out of memory");
	else {
		json_array_clear(k->denials); /* on disk now */
		k->total = 0;
	}
	json_decref(o);
}

static void on_write_timer(struct loop *l, void *ud)
{
	struct egress_link *k = ud;
	(void)l;

	k->write_timer = 0;
	if (k->dirty)
		write_audit(k);
}

/* At most one write per EGRESS_LINK_WRITE_MS: a command that hammers the
 * proxy costs one fsync'ed rename per interval, not one per denial. */
static void schedule_audit(struct egress_link *k)
{
	uint64_t now = loop_now_ms(), due = k->last_write_ms + EGRESS_LINK_WRITE_MS;

	k->dirty = true;
	if (k->write_timer)
		return;
	if (now >= due)
		write_audit(k);
	else
		k->write_timer = loop_add_timer(k->loop, due - now, on_write_timer, k);
}

static void iso_time(uint64_t ms, char *out, size_t n)
{
	time_t s = (time_t)(ms / 1000);
	struct tm tm;
	char base[32];

	gmtime_r(&s, &tm);
	strftime(base, sizeof(base), "%Y-%m-%dT%H:%M:%S", &tm);
	snprintf(out, n, "%s.%03uZ", base, (unsigned)(ms % 1000));
}

/* "CONNECT evil.test:443" as egress.c writes it in its messages. */
static void denial_what(const struct egress_denial *d, char *out, size_t n)
{
	if (d->method[0] && d->host[0])
		snprintf(out, n, "%s %s:%u", d->method, d->host, d->port);
	else if (d->method[0])
		snprintf(out, n, "%s", d->method);
	else
		snprintf(out, n, "request");
}

static void on_denial(void *ud, const struct egress_denial *d)
{
	struct egress_link *k = ud;
	char when[48], what[320], line[1600];
	const char *why = d->message, *prefix = "airlock egress: denied ";
	struct relay_cmd *cmd = NULL;
	const char *desc = NULL;
	json_t *rec;

	k->st.denials++;
	k->total++;
	changed(k);
	iso_time(d->time_ms, when, sizeof(when));
	rec =
	    json_pack("{s:s, s:I, s:s, s:s, s:s, s:i, s:s, s:s, s:s}", "time", when, "time_ms", (json_int_t)d->time_ms,
		      "command", d->client, "method", d->method, "host", d->host, "port", (int)d->port, "reason",
		      egress_reason_name(d->reason), "detail", d->detail, "message", d->message);
	if (rec && json_array_append_new(k->denials, rec) == 0) {
		while (json_array_size(k->denials) > EGRESS_LINK_KEEP)
			json_array_remove(k->denials, 0);
	}
	schedule_audit(k);

	/* the line on the command's stderr: the message without its prefix
	 * and "WHAT: ", which the line says first */
	denial_what(d, what, sizeof(what));
	size_t pl = strlen(prefix), wl = strlen(what);
	if (!strncmp(why, prefix, pl) && !strncmp(why + pl, what, wl) && !strncmp(why + pl + wl, ": ", 2))
		why += pl + wl + 2;
	bool listed = d->reason == EGRESS_NOT_ALLOWED || d->reason == EGRESS_PORT_NOT_ALLOWED;
	int len =
	    snprintf(line, sizeof(line), "airlock: egress denied %s (%s: %s%s%s)\n", what,
		     egress_reason_name(d->reason), why, listed ? " in " : "", listed ? policy_source(k->policy) : "");
	if (len < 0)
		return;
	if ((size_t)len >= sizeof(line))
		len = (int)sizeof(line) - 1;
	if (k->chan && (uint32_t)(d->client_id >> 32) == k->gen &&
	    (cmd = k->ops->find_cmd(k->ud, (uint32_t)d->client_id, &desc)))
		relay_cmd_output(cmd, RELAY_STDERR, line, (size_t)len);
	else
		fprintf(stderr, "%.*s", len, line); /* the command is gone: the daemon's log has it */
}

/* ---- tunnels ---- */

static struct ltun *tun_find(struct egress_link *k, uint32_t stream)
{
	for (struct ltun *lt = k->tuns; lt; lt = lt->next)
		if (lt->stream == stream)
			return lt;
	return NULL;
}

static size_t tun_count(struct egress_link *k, uint32_t exec_stream)
{
	size_t n = 0;

	for (struct ltun *lt = k->tuns; lt; lt = lt->next)
		n += lt->exec_stream == exec_stream;
	return n;
}

static void ltun_remove(struct ltun *lt)
{
	struct egress_link *k = lt->k;

	for (struct ltun **pp = &k->tuns; *pp; pp = &(*pp)->next) {
		if (*pp == lt) {
			*pp = lt->next;
			break;
		}
	}
	k->ntun--;
}

static void on_tunnel_done(struct tunnel *t, void *ud)
{
	struct ltun *lt = ud;
	struct egress_link *k = lt->k;

	ltun_remove(lt);
	tunnel_free(t);
	mem_free(lt);
	changed(k);
}

static const struct tunnel_ops tun_ops = {.on_done = on_tunnel_done};

static int proxy_open(struct egress_link *k, uint32_t stream, const uint8_t *p, size_t n)
{
	struct wire_proxy_open m;
	uint32_t exec_stream;
	uint8_t refuse = 0xff;
	struct relay_cmd *cmd = NULL;
	const char *desc = NULL;
	struct ltun *lt;
	struct buf in;
	int sv[2] = {-1, -1}, r;

	buf_view(&in, p, n);
	/* guest-opened streams are even and new */
	if (!k->chan || stream == WIRE_STREAM_CONTROL || (stream & 1) || tun_find(k, stream) ||
	    wire_proxy_open_decode(&in, &m) < 0)
		return -EPROTO;
	exec_stream = m.exec_stream;
	chan_consume(k->chan, stream, n); /* the OPEN payload counted against the window */
	if (k->ntun >= WIRE_PROXY_PER_SESSION || tun_count(k, exec_stream) >= WIRE_PROXY_PER_CMD)
		refuse = WIRE_PROXY_C_LIMIT;
	else if (!(cmd = k->ops->find_cmd(k->ud, exec_stream, &desc)))
		refuse = WIRE_PROXY_C_NO_CMD;
	else if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0)
		refuse = WIRE_PROXY_C_RESET;
	if (!(lt = mem_calloc(1, sizeof(*lt)))) {
		if (sv[0] >= 0) {
			close(sv[0]);
			close(sv[1]);
		}
		return -ENOMEM;
	}
	lt->k = k;
	lt->stream = stream;
	lt->exec_stream = exec_stream;
	lt->next = k->tuns;
	k->tuns = lt;
	k->ntun++;
	if ((r = tunnel_new(k->loop, k->chan, stream, refuse == 0xff ? sv[1] : -1, NULL, 0, &tun_ops, lt, &lt->t)) <
	    0) {
		if (refuse == 0xff)
			close(sv[0]);
		ltun_remove(lt);
		mem_free(lt);
		return r;
	}
	if (refuse != 0xff) {
		k->st.refused++;
		tunnel_abort(lt->t, refuse); /* the stream stays known until the guest's CLOSE */
		return 0;
	}
	k->st.opened++;
	changed(k);
	/* the proxy's side: denials carry (session, command) back to us */
	(void)egress_adopt(k->eg, sv[0], desc ? desc : "", ((uint64_t)k->gen << 32) | exec_stream);
	return 0;
}

int egress_link_frame(struct egress_link *k, uint8_t type, uint32_t stream, const uint8_t *p, size_t n)
{
	struct ltun *lt;

	if (!k || !k->chan)
		return -EPROTO;
	if (type == WIRE_PROXY_OPEN)
		return proxy_open(k, stream, p, n);
	if (!(lt = tun_find(k, stream))) {
		chan_stream_close(k->chan, stream); /* state chan made for the stray frame */
		return -EPROTO;
	}
	return tunnel_frame(lt->t, type, p, n);
}

void egress_link_writable(struct egress_link *k)
{
	struct ltun *lt, *next;

	if (!k)
		return;
	for (lt = k->tuns; lt; lt = next) {
		next = lt->next; /* only lt itself can go away in the call */
		tunnel_writable(lt->t);
	}
}

void egress_link_attach(struct egress_link *k, struct chan *c)
{
	if (!k)
		return;
	egress_link_detach(k);
	k->chan = c;
	k->gen++;
}

void egress_link_detach(struct egress_link *k)
{
	if (!k)
		return;
	while (k->tuns) {
		struct ltun *lt = k->tuns;
		k->tuns = lt->next;
		tunnel_detach(lt->t);
		tunnel_free(lt->t);
		mem_free(lt);
	}
	k->ntun = 0;
	k->chan = NULL;
}

/* ---- setup ---- */

int egress_link_new(struct loop *l, const struct egress_link_cfg *cfg, const struct egress_link_ops *ops, void *ud,
		    struct egress_link **out, char *err, size_t errlen)
{
	static const struct egress_ops eops = {.on_denial = on_denial};
	const struct policy_egress *pe = policy_egress(cfg->policy);
	struct egress_link *k;
	int r;

	*out = NULL;
	if (!ops || !ops->find_cmd || !cfg->workspace) {
		errmsg_set(err, errlen, "egress link: missing configuration");
		return -EINVAL;
	}
	if (!(k = mem_calloc(1, sizeof(*k))) || !(k->workspace = mem_strdup(cfg->workspace)) ||
	    !(k->denials = json_array())) {
		r = -ENOMEM;
		errmsg_set(err, errlen, "egress link: out of memory");
		goto fail;
	}
	k->loop = l;
	k->policy = cfg->policy;
	k->ops = ops;
	k->ud = ud;
	/* earlier runs' denials stay in the record: each write merges with it */
	struct egress_cfg ec = {.allow = pe ? pe->allow : NULL, .n_allow = pe ? pe->n_allow : 0};
	if ((r = egress_new(l, &ec, &eops, k, &k->eg, err, errlen)) < 0)
		goto fail;
	*out = k;
	return 0;
fail:
	egress_link_free(k);
	return r;
}

void egress_link_free(struct egress_link *k)
{
	if (!k)
		return;
	egress_link_detach(k);
	egress_free(k->eg); /* no denial can come after this */
	if (k->write_timer)
		loop_del_timer(k->loop, k->write_timer);
	if (k->dirty)
		write_audit(k);
	json_decref(k->denials);
	mem_free(k->workspace);
	mem_free(k);
}

/* ---- helpers ---- */

static bool needs_quotes(const char *s)
{
	if (!*s)
		return true;
	for (; *s; s++)
		if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') ||
		      strchr("-_./=:,+@%", *s)))
			return true;
	return false;
}

void egress_link_describe(const char *id, const char *const *argv, size_t argc, char *out, size_t n)
{
	size_t len = 0;

	if (!n)
		return;
	out[0] = '\0';
#define APPEND(...)                                                                                                    \
	do {                                                                                                           \
		int w_ = snprintf(out + len, n - len, __VA_ARGS__);                                                    \
		if (w_ < 0 || (size_t)w_ >= n - len) {                                                                 \
			if (n > 4)                                                                                     \
				memcpy(out + n - 4, "...", 4);                                                         \
			return;                                                                                        \
		}                                                                                                      \
		len += (size_t)w_;                                                                                     \
	} while (0)
	APPEND("%s", id ? id : "?");
	for (size_t i = 0; i < argc; i++) {
		if (!needs_quotes(argv[i])) {
			APPEND(" %s", argv[i]);
			continue;
		}
		APPEND(" '");
		for (const char *c = argv[i]; *c; c++) {
			if (*c == '\'')
				APPEND("'\\''");
			else
				APPEND("%c", (unsigned char)*c < 0x20 ? '?' : *c);
		}
		APPEND("'");
	}
#undef APPEND
}

void egress_link_get_stats(const struct egress_link *k, struct egress_link_stats *st)
{
	*st = k->st;
	st->tunnels = k->ntun;
	st->proxy_conns = egress_conn_count(k->eg);
}
