/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the guest's side of a connection before authentication: whatever
 * bytes anyone who can reach the agent's port sends. A responder chan reads
 * the input from a socketpair, then EOF; it must end cleanly with an error
 * (or, for a valid first message, wait for the rest and see EOF). */
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/chan.h"
#include "airlock/core/loop.h"
#include "airlock/core/wire.h"
#include "fuzz.h"

static struct noise_keypair host, guest;
static struct chan_peers *peers;

static void setup(void)
{
	if (peers)
		return;
	if (sodium_init() < 0)
		__builtin_trap();
	memset(host.priv, 0x11, 32);
	memset(guest.priv, 0x22, 32);
	noise_pubkey(host.pub, host.priv);
	noise_pubkey(guest.pub, guest.priv);
	if (!(peers = chan_peers_new()) || chan_peers_allow(peers, host.pub) < 0)
		__builtin_trap();
}

static void on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *p, size_t n, void *ud)
{
	(void)c, (void)type, (void)stream, (void)p, (void)n, (void)ud;
	FUZZ_ASSERT(!"a frame arrived without the session keys");
}

static void on_close(struct chan *c, int err, const char *why, void *ud)
{
	(void)err, (void)why;
	chan_free(c);
	*(int *)ud = 1;
}

static void on_stop(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

static void check_closed(struct loop *l, void *ud)
{
	if (*(int *)ud)
		loop_stop(l);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static const struct chan_ops ops = {.on_frame = on_frame, .on_close = on_close};
	struct chan_cfg cfg = {.role = NOISE_RESPONDER, .self = &guest, .peers = peers, .handshake_ms = 1000};
	struct loop *l;
	int sv[2], closed = 0;

	setup();
	cfg.peers = peers;
	if (size > 1u << 16 || !(l = loop_new()))
		return 0;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
		loop_free(l);
		return 0;
	}
	if (size && write(sv[0], data, size) != (ssize_t)size)
		__builtin_trap();
	shutdown(sv[0], SHUT_WR);
	struct chan *c = chan_new(l, sv[1], &cfg, &ops, &closed);
	if (c) {
		loop_set_before_sleep(l, check_closed, &closed);
		uint64_t t = loop_add_timer(l, 2000, on_stop, NULL);
		loop_run(l);
		loop_del_timer(l, t);
		/* the input ends in EOF: whatever it held, the session is over */
		FUZZ_ASSERT(closed);
	}
	close(sv[0]);
	loop_free(l);
	return 0;
}

size_t fuzz_seed(unsigned n, const uint8_t **out)
{
	static uint8_t rec[4 + 2 + NOISE_MSG1_LEN(12)];
	struct noise_hs i;
	uint8_t ts[12];
	size_t len;

	if (n > 0)
		return 0;
	setup();
	noise_tai64n(ts);
	noise_hs_init(&i, NOISE_INITIATOR, WIRE_PROLOGUE, strlen(WIRE_PROLOGUE), &host, guest.pub, NULL);
	rec[4] = WIRE_HS_INIT;
	rec[5] = WIRE_VERSION;
	if (noise_write_msg1(&i, ts, sizeof(ts), rec + 6, sizeof(rec) - 6, &len) < 0)
		len = 0;
	noise_hs_clear(&i);
	uint32_t h = wire_record_hdr((uint32_t)(len + 2));
	rec[0] = (uint8_t)(h >> 24);
	rec[1] = (uint8_t)(h >> 16);
	rec[2] = (uint8_t)(h >> 8);
	rec[3] = (uint8_t)h;
	*out = rec;
	return len ? len + 6 : 0;
}
