/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock ping: handshake with a guest agent, do N round trips on the
 * control stream, optionally push a bulk transfer through a data stream,
 * and report handshake time, RTT percentiles and throughput. This is the
 * floor every later latency is compared with.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/transport.h"
#include "airlock/core/wire.h"
#include "cmd_i.h"
#include "guestopt_i.h"

#define PING_MAX_N 10000000u
#define BULK_CHUNK WIRE_PAYLOAD_MAX

struct ping {
	struct loop *loop;
	struct chan *chan;
	const uint8_t *sync_pk; /* the HELLO's signing key (guest_opts) */
	/* round trips */
	uint32_t n, window, size;
	uint32_t sent, received;
	uint64_t *sent_ns; /* by nonce */
	uint64_t *rtt_ns;  /* by arrival order */
	uint8_t *pad;
	/* bulk */
	uint64_t bulk_total, bulk_sent, bulk_acked;
	uint32_t bulk_stream;
	bool bulk_started, bulk_end_sent, bulk_done;
	bool concurrent; /* round trips run while the bulk transfer floods */
	uint64_t bulk_start_ns, bulk_end_ns;
	uint8_t *bulk_buf;
	/* result */
	bool hello_ok, done;
	int err;
	char why[512];
	uint64_t t0_ns, t_connect_ns, t_ready_ns, t_start_ns;
	uint64_t timer;
};

static void fail(struct ping *p, int err, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void fail(struct ping *p, int err, const char *fmt, ...)
{
	va_list ap;

	if (p->err)
		return;
	p->err = err ? err : -EPROTO;
	va_start(ap, fmt);
	vsnprintf(p->why, sizeof(p->why), fmt, ap);
	va_end(ap);
	loop_stop(p->loop);
}

static void fill_pad(uint8_t *pad, uint32_t size, uint64_t nonce)
{
	for (uint32_t i = 0; i < size; i++)
		pad[i] = (uint8_t)(nonce * 131u + i);
}

static int send_pings(struct ping *p)
{
	struct buf b;
	int r = 0;

	buf_init(&b, WIRE_PAYLOAD_MAX);
	while (p->sent < p->n && p->sent - p->received < p->window) {
		uint64_t nonce = p->sent;
		buf_reset(&b);
		fill_pad(p->pad, p->size, nonce);
		struct wire_ping m = {.nonce = nonce, .pad = p->pad, .pad_len = p->size};
		if ((r = wire_ping_encode(&b, &m)) < 0)
			break;
		p->sent_ns[nonce] = loop_now_ns();
		r = chan_send(p->chan, WIRE_PING, WIRE_STREAM_CONTROL, buf_ptr(&b), buf_len(&b));
		if (r == -EAGAIN) {
			r = 0;
			break;
		}
		if (r < 0)
			break;
		p->sent++;
	}
	buf_clear(&b);
	return r;
}

static void bulk_pump(struct ping *p)
{
	int r;

	while (p->bulk_sent < p->bulk_total) {
		uint64_t left = p->bulk_total - p->bulk_sent;
		size_t n = left < BULK_CHUNK ? (size_t)left : BULK_CHUNK;
		r = chan_send(p->chan, WIRE_BULK_DATA, p->bulk_stream, p->bulk_buf, n);
		if (r == -EAGAIN)
			return;
		if (r < 0) {
			fail(p, r, "bulk send: %s", strerror(-r));
			return;
		}
		p->bulk_sent += n;
	}
	if (!p->bulk_end_sent) {
		struct wire_bulk m = {.bytes = p->bulk_total};
		struct buf b;

		buf_init(&b, 16);
		if ((r = wire_bulk_encode(&b, &m)) == 0)
			r = chan_send(p->chan, WIRE_BULK_END, p->bulk_stream, buf_ptr(&b), buf_len(&b));
		buf_clear(&b);
		if (r == -EAGAIN)
			return;
		if (r < 0) {
			fail(p, r, "bulk end: %s", strerror(-r));
			return;
		}
		p->bulk_end_sent = true;
	}
}

static void bulk_start(struct ping *p)
{
	if (!(p->bulk_buf = mem_alloc(BULK_CHUNK))) {
		fail(p, -ENOMEM, "out of memory");
		return;
	}
	randombytes_buf(p->bulk_buf, BULK_CHUNK);
	if (!(p->bulk_stream = chan_stream_open(p->chan, CHAN_STREAM_AUTO))) {
		fail(p, -ENOMEM, "cannot open a stream");
		return;
	}
	p->bulk_started = true;
	p->bulk_start_ns = loop_now_ns();
	bulk_pump(p);
}

static void maybe_finish(struct ping *p)
{
	if (p->received < p->n)
		return;
	if (p->bulk_total && !p->bulk_started) {
		bulk_start(p);
		return;
	}
	if (p->bulk_total && !p->bulk_done)
		return;
	if (!p->done) {
		p->done = true;
		chan_close(p->chan);
	}
}

/* ---- frames from the agent ---- */

typedef void frame_fn(struct ping *p, uint32_t stream, struct buf *in);

static void handle_hello_ok(struct ping *p, uint32_t stream, struct buf *in)
{
	const char *why = guest_hello_ok_why(in);
	(void)stream;

	if (why) {
		fail(p, -EPROTO, "%s", why);
		return;
	}
	p->hello_ok = true;
}

static void handle_pong(struct ping *p, uint32_t stream, struct buf *in)
{
	struct wire_ping m;
	(void)stream;

	if (wire_ping_decode(in, &m) < 0) {
		fail(p, -EBADMSG, "malformed PONG");
		return;
	}
	uint64_t nonce = m.nonce;
	const uint8_t *pad = m.pad;
	size_t n = m.pad_len;
	/* Replies must come back in order and intact: anything else means
	 * the channel let something through that it should not have. */
	if (nonce != p->received || n != p->size) {
		fail(p, -EBADMSG, "PONG %" PRIu64 " out of order (expected %u)", nonce, p->received);
		return;
	}
	fill_pad(p->pad, p->size, nonce);
	if (n && memcmp(pad, p->pad, n) != 0) {
		fail(p, -EBADMSG, "PONG %" PRIu64 " payload differs from what was sent", nonce);
		return;
	}
	p->rtt_ns[p->received++] = loop_now_ns() - p->sent_ns[nonce];
	int r = send_pings(p);
	if (r < 0) {
		fail(p, r, "send: %s", strerror(-r));
		return;
	}
	maybe_finish(p);
}

static void handle_bulk_ack(struct ping *p, uint32_t stream, struct buf *in)
{
	struct wire_bulk m;
	(void)stream;

	if (wire_bulk_decode(in, &m) < 0) {
		fail(p, -EBADMSG, "malformed BULK_ACK");
		return;
	}
	p->bulk_acked = m.bytes;
	p->bulk_end_ns = loop_now_ns();
	if (p->bulk_acked != p->bulk_total) {
		fail(p, -EBADMSG, "guest received %" PRIu64 " bulk bytes, %" PRIu64 " were sent", p->bulk_acked,
		     p->bulk_total);
		return;
	}
	p->bulk_done = true;
	maybe_finish(p);
}

static void handle_error(struct ping *p, uint32_t stream, struct buf *in)
{
	struct wire_error m;
	(void)stream;

	if (wire_error_decode(in, &m) == 0)
		fail(p, -(int)m.code, "guest reported an error: %s (%s)", m.msg, strerror((int)m.code));
	else
		fail(p, -EPROTO, "guest reported a malformed error");
	wire_error_clear(&m);
}

/* the frames ping expects; logs name them with wire_type_name */
static frame_fn *const handlers[WIRE_TYPE_MAX + 1] = {
    [WIRE_HELLO_OK] = handle_hello_ok,
    [WIRE_PONG] = handle_pong,
    [WIRE_BULK_ACK] = handle_bulk_ack,
    [WIRE_ERROR] = handle_error,
};

static void on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *data, size_t n, void *ud)
{
	struct ping *p = ud;
	struct buf in;
	(void)c;

	if (!handlers[type]) {
		fail(p, -EPROTO, "unexpected frame %s (%u) from the guest", wire_type_name(type), type);
		return;
	}
	buf_view(&in, data, n);
	handlers[type](p, stream, &in);
}

static void on_ready(struct chan *c, void *ud)
{
	struct ping *p = ud;
	int r;

	p->t_ready_ns = loop_now_ns();
	if ((r = guest_hello_send(c, p->sync_pk, "airlock ping")) < 0) {
		fail(p, r, "hello: %s", strerror(-r));
		return;
	}
	p->t_start_ns = loop_now_ns();
	if (p->concurrent && p->bulk_total)
		bulk_start(p);
	if ((r = send_pings(p)) < 0) {
		fail(p, r, "send: %s", strerror(-r));
		return;
	}
	maybe_finish(p);
}

static void on_writable(struct chan *c, void *ud)
{
	struct ping *p = ud;
	(void)c;

	if (p->bulk_started && !p->bulk_done)
		bulk_pump(p);
	if (send_pings(p) < 0)
		fail(p, -EIO, "send failed");
}

static void on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct ping *p = ud;
	(void)c;

	if (err == 0 && !p->done)
		fail(p, -ECONNRESET, "guest closed the session early");
	else if (err < 0)
		fail(p, err, "%s", why ? why : strerror(-err));
	p->chan = NULL;
	chan_free(c);
	loop_stop(p->loop);
}

static const struct chan_ops ping_ops = {
    .on_ready = on_ready,
    .on_frame = on_frame,
    .on_writable = on_writable,
    .on_close = on_close,
};

static void on_timeout(struct loop *l, void *ud)
{
	struct ping *p = ud;
	(void)l;

	p->timer = 0;
	fail(p, -ETIMEDOUT, "timed out waiting for the guest (%u of %u replies%s)", p->received, p->n,
	     p->bulk_started ? ", bulk transfer unfinished" : "");
}

static int cmp_u64(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static double pct(const uint64_t *sorted, uint32_t n, double q)
{
	if (n == 0)
		return 0;
	/* nearest-rank percentile */
	uint32_t i = (uint32_t)(q * n + 0.999999);
	if (i == 0)
		i = 1;
	if (i > n)
		i = n;
	return (double)sorted[i - 1];
}

/* One of ping's own options. 0, or -1 after saying why (exit 2). */
static int parse_ping_opt(struct ping *p, int c, const char *arg, bool *json)
{
	uint64_t v;

	switch (c) {
	case 'j':
		*json = true;
		return 0;
	case 'c':
		p->concurrent = true;
		return 0;
	case 'n':
		if (cmd_parse_u64(arg, &v) < 0 || v > PING_MAX_N) {
			cmd_err("ping: -n must be 0..%u", PING_MAX_N);
			return -1;
		}
		p->n = (uint32_t)v;
		return 0;
	case 's':
		if (cmd_parse_u64(arg, &v) < 0 || v > WIRE_PAYLOAD_MAX - 16) {
			cmd_err("ping: --size must be 0..%u", WIRE_PAYLOAD_MAX - 16);
			return -1;
		}
		p->size = (uint32_t)v;
		return 0;
	case 'w':
		if (cmd_parse_u64(arg, &v) < 0 || v == 0 || v > 1024) {
			cmd_err("ping: --window must be 1..1024");
			return -1;
		}
		p->window = (uint32_t)v;
		return 0;
	case 'b':
		if (cmd_parse_u64(arg, &p->bulk_total) < 0) {
			cmd_err("ping: --bulk takes a byte count (suffix k, M or G allowed)");
			return -1;
		}
		return 0;
	default:
		cmd_usage("ping");
		return -1;
	}
}

/* The command line into p and g. 0, or -1 (exit 2). */
static int parse_args(struct ping *p, struct guest_opts *g, bool *json, int argc, char **argv)
{
	static const struct option opts[] = {
	    GUEST_OPTS_LONG,
	    {"size", required_argument, NULL, 's'},
	    {"window", required_argument, NULL, 'w'},
	    {"bulk", required_argument, NULL, 'b'},
	    GUEST_OPTS_PSK_LONG,
	    GUEST_OPTS_TIMEOUT_LONG,
	    {"json", no_argument, NULL, 'j'},
	    {"concurrent", no_argument, NULL, 'c'},
	    {NULL, 0, NULL, 0},
	};
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "n:", opts, NULL)) != -1) {
		if ((r = guest_opts_parse(g, c, optarg)) < 0)
			return -1;
		if (r == 0 && parse_ping_opt(p, c, optarg, json) < 0)
			return -1;
	}
	if (!guest_opts_complete(g)) {
		cmd_usage("ping");
		return -1;
	}
	if (cmd_operands("ping", argc, argv, optind, 0, "") < 0)
		return -1;
	return 0;
}

/* Connect and run the exchange. 0, or -1 after saying why. */
static int run_ping(struct ping *p, const struct guest_opts *g)
{
	char err[512];
	int fd;

	signal(SIGPIPE, SIG_IGN);
	p->t0_ns = loop_now_ns();
	if ((fd = transport_connect(&g->addr, (int)(g->timeout_s * 1000), err, sizeof(err))) < 0) {
		cmd_err("%s", err);
		return -1;
	}
	p->t_connect_ns = loop_now_ns();
	struct chan_cfg cfg = guest_opts_chan_cfg(g);
	if (!(p->chan = chan_new(p->loop, fd, &cfg, &ping_ops, p))) {
		cmd_err("out of memory");
		return -1;
	}
	p->timer = loop_add_timer(p->loop, g->timeout_s * 1000, on_timeout, p);
	loop_run(p->loop);
	if (p->err) {
		cmd_err("ping %s: %s", g->guest, p->why);
		return -1;
	}
	return 0;
}

/* What a run measured, in milliseconds (connect, handshake), microseconds
 * (round trips) and seconds (bulk). */
struct ping_result {
	double conn_ms, hs_ms, p50, p99, mn, mx, bulk_s;
};

static void measure(struct ping *p, struct ping_result *res)
{
	qsort(p->rtt_ns, p->received, sizeof(uint64_t), cmp_u64);
	res->hs_ms = (double)(p->t_ready_ns - p->t_connect_ns) / 1e6;
	res->conn_ms = (double)(p->t_connect_ns - p->t0_ns) / 1e6;
	res->p50 = pct(p->rtt_ns, p->received, 0.50) / 1e3;
	res->p99 = pct(p->rtt_ns, p->received, 0.99) / 1e3;
	res->mn = p->received ? (double)p->rtt_ns[0] / 1e3 : 0;
	res->mx = p->received ? (double)p->rtt_ns[p->received - 1] / 1e3 : 0;
	res->bulk_s = p->bulk_total ? (double)(p->bulk_end_ns - p->bulk_start_ns) / 1e9 : 0;
}

static int report_json(const struct ping *p, const char *guest, const struct ping_result *res)
{
	json_t *o =
	    json_pack("{s:i, s:s, s:f, s:f, s:{s:I, s:I, s:f, s:f, s:f, s:f}}", "version", 1, "guest", guest,
		      "connect_ms", res->conn_ms, "handshake_ms", res->hs_ms, "rtt_us", "n", (json_int_t)p->received,
		      "size", (json_int_t)p->size, "p50", res->p50, "p99", res->p99, "min", res->mn, "max", res->mx);
	struct rusage ru;

	if (o && getrusage(RUSAGE_SELF, &ru) == 0)
		json_object_set_new(o, "max_rss_kb", json_integer(ru.ru_maxrss));
	if (o && p->bulk_total)
		json_object_set_new(o, "bulk",
				    json_pack("{s:I, s:f, s:f}", "bytes", (json_int_t)p->bulk_total, "seconds",
					      res->bulk_s, "mib_per_s",
					      (double)p->bulk_total / 1048576.0 / res->bulk_s));
	return cmd_print_json(o);
}

static void report_text(const struct ping *p, const char *guest, const struct ping_result *res)
{
	printf("handshake with %s: %.3f ms (connect %.3f ms)\n", guest, res->hs_ms, res->conn_ms);
	if (p->received)
		printf("rtt over %u round trips (%u-byte payload%s): p50 %.1f us, p99 %.1f us, min %.1f us, "
		       "max %.1f us\n",
		       p->received, p->size + 12, p->concurrent && p->bulk_total ? ", during bulk" : "", res->p50,
		       res->p99, res->mn, res->mx);
	if (p->bulk_total)
		printf("bulk %" PRIu64 " bytes in %.3f s: %.1f MiB/s\n", p->bulk_total, res->bulk_s,
		       (double)p->bulk_total / 1048576.0 / res->bulk_s);
}

int cmd_ping(int argc, char **argv)
{
	struct ping p = {.n = 10, .window = 1, .size = 0};
	struct guest_opts g;
	struct ping_result res;
	bool json = false;
	int status = 1;

	guest_opts_init(&g, "ping", 30);
	g.psk_status = 1; /* ping has always exited 1 for an unreadable --psk-file */
	if (parse_args(&p, &g, &json, argc, argv) < 0)
		return 2;
	if ((status = guest_opts_load(&g)) != 0)
		goto out;
	status = 1;
	if (!(p.loop = loop_new()) || !(p.sent_ns = mem_calloc(p.n ? p.n : 1, sizeof(uint64_t))) ||
	    !(p.rtt_ns = mem_calloc(p.n ? p.n : 1, sizeof(uint64_t))) || !(p.pad = mem_alloc(p.size + 1))) {
		cmd_err("out of memory");
		goto out;
	}
	p.sync_pk = g.sync_pk;
	if (run_ping(&p, &g) < 0)
		goto out;
	measure(&p, &res);
	if (json && report_json(&p, g.guest, &res) < 0)
		goto out;
	if (!json)
		report_text(&p, g.guest, &res);
	status = 0;
out:
	if (p.chan)
		chan_free(p.chan);
	if (p.timer)
		loop_del_timer(p.loop, p.timer);
	loop_free(p.loop);
	mem_free(p.sent_ns);
	mem_free(p.rtt_ns);
	mem_free(p.pad);
	mem_free(p.bulk_buf);
	guest_opts_clear(&g);
	return status;
}
