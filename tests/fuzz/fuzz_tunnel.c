/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the receiving side of a proxy stream (tunnel.h): whatever sequence
 * of PROXY_* frames a peer sends. Input: records of u8 type (low 2 bits:
 * OPEN, DATA, EOF, CLOSE), u16 length, payload. The tunnel has a real
 * socketpair and no chan (nothing is sent back). Invariants: the first
 * -EPROTO ends the input (the owner drops the session); what reaches the
 * socket is exactly a prefix of the DATA payloads accepted, in order; the
 * tunnel never holds more than its window plus one frame; on_done never
 * fires (no CLOSE can be sent without a chan). */
#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "airlock/core/buf.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/tunnel.h"
#include "airlock/core/wire.h"
#include "fuzz.h"

#define EXPECT_MAX (4u << 20)

static int done_calls;

static void on_done(struct tunnel *t, void *ud)
{
	(void)t, (void)ud;
	done_calls++;
}

static const struct tunnel_ops ops = {.on_done = on_done};
static const uint8_t types[4] = {WIRE_PROXY_OPEN, WIRE_PROXY_DATA, WIRE_PROXY_EOF, WIRE_PROXY_CLOSE};

/* Read what the tunnel wrote and check it against the accepted payloads. */
static void drain(int fd, struct buf *expect, size_t *got)
{
	static uint8_t b[65536];
	ssize_t n;

	while ((n = read(fd, b, sizeof(b))) > 0) {
		FUZZ_ASSERT(*got + (size_t)n <= buf_len(expect));
		FUZZ_ASSERT(memcmp(b, buf_ptr(expect) + *got, (size_t)n) == 0);
		*got += (size_t)n;
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct loop *l = loop_new();
	struct tunnel *t = NULL;
	struct buf in, expect;
	int sv[2];
	size_t got = 0;

	if (!l)
		return 0;
	if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0, sv) < 0) {
		loop_free(l);
		return 0;
	}
	done_calls = 0;
	buf_init(&expect, EXPECT_MAX);
	if (tunnel_new(l, NULL, 2, sv[1], NULL, 0, &ops, NULL, &t) < 0) {
		close(sv[0]);
		loop_free(l);
		return 0;
	}
	buf_view(&in, data, size);
	for (;;) {
		uint8_t sel;
		uint16_t len;
		const uint8_t *p;
		struct tunnel_stats st;

		if (buf_get_u8(&in, &sel) < 0 || buf_get_u16(&in, &len) < 0)
			break;
		if (len > buf_len(&in))
			len = (uint16_t)buf_len(&in);
		p = buf_ptr(&in);
		buf_consume(&in, len);
		uint8_t type = types[sel & 3];
		tunnel_get_stats(t, &st);
		int r = tunnel_frame(t, type, p, len);
		if (r < 0) {
			FUZZ_ASSERT(r == -EPROTO);
			break;
		}
		/* accepted DATA goes to the socket unless the tunnel gave up */
		if (type == WIRE_PROXY_DATA && st.close_rcvd == 0xff && st.close_sent == 0xff)
			(void)buf_put(&expect, p, len);
		tunnel_get_stats(t, &st);
		FUZZ_ASSERT(st.buffered <= WIRE_WINDOW_DEFAULT + 2 * WIRE_PAYLOAD_MAX);
		if (sel & 0x80)
			drain(sv[0], &expect, &got);
		FUZZ_ASSERT(done_calls == 0);
	}
	drain(sv[0], &expect, &got);
	tunnel_free(t);
	close(sv[0]);
	buf_clear(&expect);
	loop_free(l);
	return 0;
}

size_t fuzz_seed(unsigned n, const uint8_t **out)
{
	/* DATA "hello" (drained), DATA "world", EOF, CLOSE 0 */
	static const uint8_t s0[] = {0x81, 0,	5,   'h', 'e',	'l', 'l', 'o', 1, 0, 5, 'w',
				     'o',  'r', 'l', 'd', 0x82, 0,   0,	  3,   0, 1, 0};
	/* DATA, CLOSE reset, DATA (dropped) */
	static const uint8_t s1[] = {1, 0, 3, 'a', 'b', 'c', 3, 0, 1, 1, 0x81, 0, 2, 'x', 'y'};
	/* EOF, EOF (error) */
	static const uint8_t s2[] = {2, 0, 0, 2, 0, 0};

	switch (n) {
	case 0:
		*out = s0;
		return sizeof(s0);
	case 1:
		*out = s1;
		return sizeof(s1);
	case 2:
		*out = s2;
		return sizeof(s2);
	default:
		return 0;
	}
}
