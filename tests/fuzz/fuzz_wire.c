/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz every payload decoder of the wire module (core/wire.h), the
 * functions both ends run on the other's bytes. Input: u8 frame type, then
 * the payload. The type picks the decoder (a type without one picks the
 * decoder at type % number of decoders, so no input is wasted).
 * Invariants: a successful decode re-encodes to exactly the input payload
 * (one encoding per message: the round trip is byte-identical); a failed
 * decode returns a negative errno and leaves the message empty (all zero:
 * nothing allocated, no view left behind). */
#include <errno.h>
#include <string.h>

#include "airlock/core/buf.h"
#include "airlock/core/wire.h"
#include "fuzz.h"
#include "wire_msgs.h"

struct codec {
	uint8_t type;
	int (*decode)(struct buf *in, union wire_msg *m);
	int (*encode)(struct buf *b, const union wire_msg *m);
	void (*clear)(union wire_msg *m);
	size_t size;
	bool empty_on_error; /* decoders that own pointers zero m on failure */
};

#define PLAIN(t, name)                                                                                                 \
	{                                                                                                              \
		t, dec_##name, enc_##name, NULL, sizeof(struct wire_##name), false                                     \
	}
#define VIEWS(t, name)                                                                                                 \
	{                                                                                                              \
		t, dec_##name, enc_##name, NULL, sizeof(struct wire_##name), true                                      \
	}
#define OWNING(t, name)                                                                                                \
	{                                                                                                              \
		t, dec_##name, enc_##name, clr_##name, sizeof(struct wire_##name), true                                \
	}

static const struct codec codecs[] = {
    PLAIN(WIRE_WINDOW, window),
    OWNING(WIRE_HELLO, hello),
    OWNING(WIRE_HELLO_OK, hello_ok),
    VIEWS(WIRE_PING, ping),
    VIEWS(WIRE_PONG, ping),
    OWNING(WIRE_ERROR, error),
    PLAIN(WIRE_BULK_END, bulk),
    PLAIN(WIRE_BULK_ACK, bulk),
    PLAIN(WIRE_SYNC_BEGIN, sync_begin),
    PLAIN(WIRE_SYNC_STATE, sync_state),
    OWNING(WIRE_SYNC_LEVELS_REQ, sync_req),
    OWNING(WIRE_SYNC_LEVEL, sync_level),
    OWNING(WIRE_SYNC_ENTRIES_REQ, sync_req),
    OWNING(WIRE_SYNC_ENTRY, sync_entry),
    OWNING(WIRE_SYNC_ACK, sync_ack),
    OWNING(WIRE_SYNC_NACK, sync_nack),
    OWNING(WIRE_EXEC_START, exec_start),
    PLAIN(WIRE_EXEC_STARTED, exec_started),
    VIEWS(WIRE_EXEC_STDIN, exec_stdin),
    PLAIN(WIRE_EXEC_SIGNAL, exec_signal),
    PLAIN(WIRE_EXEC_RESIZE, exec_resize),
    PLAIN(WIRE_EXEC_EXIT, exec_exit),
    OWNING(WIRE_EXEC_ERROR, error),
    PLAIN(WIRE_EXEC_STDIN_ACK, exec_stdin_ack),
    PLAIN(WIRE_PROXY_OPEN, proxy_open),
    PLAIN(WIRE_PROXY_CLOSE, proxy_close),
    OWNING(WIRE_CHG_ITEM, chg_item),
    OWNING(WIRE_CHG_FILE, chg_item),
    OWNING(WIRE_CHG_PULL, sync_req),
    OWNING(WIRE_CHG_END, error),
};
#define NCODECS (sizeof(codecs) / sizeof(codecs[0]))

static const struct codec *codec_for(uint8_t type)
{
	for (size_t i = 0; i < NCODECS; i++)
		if (codecs[i].type == type)
			return &codecs[i];
	return &codecs[type % NCODECS];
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const struct codec *c;
	union wire_msg m;
	struct buf in, out;
	int r;

	if (size < 1 || size > WIRE_PAYLOAD_MAX + 1)
		return 0;
	c = codec_for(data[0]);
	buf_view(&in, data + 1, size - 1);
	memset(&m, 0xa5, sizeof(m)); /* a decoder must not rely on a zeroed struct */
	r = c->decode(&in, &m);
	if (r < 0) {
		FUZZ_ASSERT(r == -EBADMSG || r == -EPROTO || r == -ENOMEM);
		if (c->empty_on_error)
			FUZZ_ASSERT(wire_msg_zeroed(&m, c->size));
		if (c->clear)
			c->clear(&m); /* safe after a failure */
		return 0;
	}
	FUZZ_ASSERT(buf_len(&in) == 0);
	buf_init(&out, WIRE_PAYLOAD_MAX);
	FUZZ_ASSERT(c->encode(&out, &m) == 0);
	FUZZ_ASSERT(buf_len(&out) == size - 1);
	FUZZ_ASSERT(memcmp(buf_ptr(&out), data + 1, size - 1) == 0);
	buf_clear(&out);
	if (c->clear) {
		c->clear(&m);
		FUZZ_ASSERT(wire_msg_zeroed(&m, c->size));
		c->clear(&m); /* twice is fine */
	}
	return 0;
}

/* ---- seeds: one well-formed message per codec, made by its encoder ---- */

static uint8_t seed_buf[4096];
static const uint8_t bytes[] = {0, 1, 2, 3, 0xff, 0x80, 'x', 'y'};

/* The exec and proxy groups' seeds. */
static int seed_exec(union wire_msg *m, uint8_t type)
{
	static char *argv[] = {"sh", "-c", "echo hi", NULL};
	static char *env[] = {"TERM=xterm", "LANG=C", NULL};
	static char *fwd[] = {"TOKEN=secret", NULL};

	switch (type) {
	case WIRE_EXEC_START:
		m->exec_start = (struct wire_exec_start){.flags = WIRE_EXEC_F_TTY | WIRE_EXEC_F_FWD,
							 .timeout_ms = 30000,
							 .rows = 24,
							 .cols = 80,
							 .cwd = "src",
							 .argc = 3,
							 .nenv = 2,
							 .nfwd = 1,
							 .argv = argv,
							 .env = env,
							 .fwd = fwd};
		break;
	case WIRE_EXEC_STARTED:
		m->exec_started.pid = 1234;
		break;
	case WIRE_EXEC_STDIN:
		m->exec_stdin = (struct wire_exec_stdin){.eof = 1, .data = bytes, .len = sizeof(bytes)};
		break;
	case WIRE_EXEC_SIGNAL:
		m->exec_signal.signo = 15;
		break;
	case WIRE_EXEC_RESIZE:
		m->exec_resize = (struct wire_exec_resize){.rows = 50, .cols = 132};
		break;
	case WIRE_EXEC_EXIT:
		m->exec_exit = (struct wire_exec_exit){.code = 130,
						       .signo = 2,
						       .flags = WIRE_EXEC_X_CANCELED,
						       .duration_ms = 1500,
						       .stdout_bytes = 10,
						       .stderr_bytes = 20};
		break;
	case WIRE_EXEC_STDIN_ACK:
		m->exec_stdin_ack.bytes = 4096;
		break;
	case WIRE_PROXY_OPEN:
		m->proxy_open.exec_stream = 5;
		break;
	case WIRE_PROXY_CLOSE:
		m->proxy_close.code = WIRE_PROXY_C_RESET;
		break;
	default:
		return -1;
	}
	return 0;
}

static int seed_msg(unsigned i, union wire_msg *m, uint8_t *type)
{
	static char *names[] = {"", "src", "src/lib/a.c", NULL};

	if (i >= NCODECS)
		return -1;
	*type = codecs[i].type;
	memset(m, 0, sizeof(*m));
	switch (*type) {
	case WIRE_WINDOW:
		m->window = (struct wire_window){.stream = 3, .credit = 65536};
		break;
	case WIRE_HELLO:
		memset(m->hello.sign_pk, 0x42, 32);
		m->hello.client = "airlock up";
		break;
	case WIRE_HELLO_OK:
		m->hello_ok = (struct wire_hello_ok){.agent = "airlock-agent 0.1.0", .root = "/workspace"};
		break;
	case WIRE_PING:
	case WIRE_PONG:
		m->ping = (struct wire_ping){.nonce = 0x0102030405060708ull, .pad = bytes, .pad_len = sizeof(bytes)};
		break;
	case WIRE_ERROR:
	case WIRE_EXEC_ERROR:
		m->error = (struct wire_error){.code = ENOENT, .msg = "cwd 'x': No such file or directory"};
		break;
	case WIRE_BULK_END:
	case WIRE_BULK_ACK:
		m->bulk.bytes = 1u << 20;
		break;
	case WIRE_SYNC_BEGIN:
		m->sync_begin = (struct wire_sync_begin){16384, 65536, 262144, 131072};
		break;
	case WIRE_SYNC_STATE:
		m->sync_state = (struct wire_sync_state){.seq = 7, .entries = 42, .special = 1, .gen = 9};
		memset(m->sync_state.root, 0x17, sizeof(m->sync_state.root));
		break;
	case WIRE_SYNC_LEVELS_REQ:
	case WIRE_SYNC_ENTRIES_REQ:
		m->sync_req = (struct wire_sync_req){.n = 3, .names = names};
		break;
	case WIRE_SYNC_LEVEL:
		m->sync_level = (struct wire_sync_level){.dir = "src", .level = bytes, .level_len = sizeof(bytes)};
		break;
	case WIRE_SYNC_ENTRY:
		m->sync_entry =
		    (struct wire_sync_entry){.path = "src/a.c", .found = 1, .entry = bytes, .entry_len = sizeof(bytes)};
		break;
	case WIRE_SYNC_ACK: {
		/* with a failure list: a refused delete and a full disk */
		static struct wire_sync_fail fails[] = {
		    {.op = 1, .code = EACCES, .path = "ro/f", .msg = "DELETE: unlink: Permission denied"},
		    {.op = 4,
		     .code = ENOSPC,
		     .path = "big",
		     .msg = "PUT: writing the new content: No space left on device"},
		};
		m->sync_ack = (struct wire_sync_ack){.seq = 8,
						     .ops = 3,
						     .files = 2,
						     .bytes = 4096,
						     .deleted = 1,
						     .fail_flags = WIRE_SYNC_FAIL_F_MORE,
						     .nfail = 2,
						     .fail = fails};
		break;
	}
	case WIRE_CHG_ITEM:
	case WIRE_CHG_FILE:
		m->chg_item = (struct wire_chg_item){.path = "src/l",
						     .st_mode = 0120777,
						     .by = 5,
						     .flags = WIRE_CHG_F_HASHED,
						     .size = 3,
						     .target = "a.c"};
		memset(m->chg_item.hash, 0x33, sizeof(m->chg_item.hash));
		break;
	case WIRE_CHG_PULL:
		m->sync_req = (struct wire_sync_req){.n = 3, .names = names};
		break;
	case WIRE_CHG_END:
		m->error = (struct wire_error){.code = 0, .msg = ""};
		break;
	case WIRE_SYNC_NACK:
		m->sync_nack = (struct wire_sync_nack){.seq = 8, .code = EIO, .partial = 1, .msg = "disk full"};
		break;
	default:
		return seed_exec(m, *type);
	}
	return 0;
}

size_t fuzz_seed(unsigned n, const uint8_t **out)
{
	union wire_msg m;
	uint8_t type;
	struct buf b;
	size_t len;

	if (seed_msg(n, &m, &type) < 0)
		return 0;
	buf_init(&b, sizeof(seed_buf));
	FUZZ_ASSERT(buf_put_u8(&b, type) == 0 && codec_for(type)->encode(&b, &m) == 0);
	len = buf_len(&b);
	memcpy(seed_buf, buf_ptr(&b), len);
	buf_clear(&b);
	/* a seed is a message its decoder takes */
	const struct codec *c = codec_for(type);
	union wire_msg d;
	buf_view(&b, seed_buf + 1, len - 1);
	FUZZ_ASSERT(c->decode(&b, &d) == 0);
	if (c->clear)
		c->clear(&d);
	*out = seed_buf;
	return len;
}
