/* SPDX-License-Identifier: Apache-2.0 */
/* wire.h payload codecs: for every message a table row with a sample, its
 * exact bytes (the layout doc/PROTOCOL.md gives; WIRE_VERSION 2), and the
 * limits its decoder refuses. Round trips: encoding twice is
 * byte-identical, decoding gives an equal message, re-encoding the decoded
 * message gives the same bytes; every strict prefix and every extra byte
 * is refused. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "airlock/core/buf.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
/* the codecs behind one signature, shared with the fuzz harness */
#include "../../fuzz/wire_msgs.h"

static bool str_eq(const char *a, const char *b)
{
	return !strcmp(a ? a : "", b ? b : "");
}

static bool strv_eq(char *const *a, char *const *b, uint32_t n)
{
	for (uint32_t i = 0; i < n; i++)
		if (!str_eq(a[i], b[i]))
			return false;
	return true;
}

static bool bytes_eq(const uint8_t *a, size_t an, const uint8_t *b, size_t bn)
{
	return an == bn && (an == 0 || !memcmp(a, b, an));
}

/* Field-by-field equality of two messages of one kind (pointers compared
 * by what they point at). */
static bool eq_hello(const union wire_msg *a, const union wire_msg *b)
{
	return !memcmp(a->hello.sign_pk, b->hello.sign_pk, 32) && str_eq(a->hello.client, b->hello.client);
}
static bool eq_hello_ok(const union wire_msg *a, const union wire_msg *b)
{
	return str_eq(a->hello_ok.agent, b->hello_ok.agent) && str_eq(a->hello_ok.root, b->hello_ok.root);
}
static bool eq_ping(const union wire_msg *a, const union wire_msg *b)
{
	return a->ping.nonce == b->ping.nonce && bytes_eq(a->ping.pad, a->ping.pad_len, b->ping.pad, b->ping.pad_len);
}
static bool eq_error(const union wire_msg *a, const union wire_msg *b)
{
	return a->error.code == b->error.code && str_eq(a->error.msg, b->error.msg);
}
static bool eq_sync_req(const union wire_msg *a, const union wire_msg *b)
{
	return a->sync_req.n == b->sync_req.n && strv_eq(a->sync_req.names, b->sync_req.names, a->sync_req.n);
}
static bool eq_sync_level(const union wire_msg *a, const union wire_msg *b)
{
	return str_eq(a->sync_level.dir, b->sync_level.dir) &&
	       bytes_eq(a->sync_level.level, a->sync_level.level_len, b->sync_level.level, b->sync_level.level_len);
}
static bool eq_sync_entry(const union wire_msg *a, const union wire_msg *b)
{
	return str_eq(a->sync_entry.path, b->sync_entry.path) && a->sync_entry.found == b->sync_entry.found &&
	       bytes_eq(a->sync_entry.entry, a->sync_entry.entry_len, b->sync_entry.entry, b->sync_entry.entry_len);
}
static bool eq_chg_item(const union wire_msg *a, const union wire_msg *b)
{
	const struct wire_chg_item *x = &a->chg_item, *y = &b->chg_item;
	return str_eq(x->path, y->path) && x->st_mode == y->st_mode && x->by == y->by && x->flags == y->flags &&
	       x->size == y->size && !memcmp(x->hash, y->hash, sizeof(x->hash)) &&
	       str_eq(x->target ? x->target : "", y->target ? y->target : "");
}
static bool eq_sync_nack(const union wire_msg *a, const union wire_msg *b)
{
	return a->sync_nack.seq == b->sync_nack.seq && a->sync_nack.code == b->sync_nack.code &&
	       a->sync_nack.partial == b->sync_nack.partial && str_eq(a->sync_nack.msg, b->sync_nack.msg);
}
static bool eq_sync_ack(const union wire_msg *a, const union wire_msg *b)
{
	const struct wire_sync_ack *x = &a->sync_ack, *y = &b->sync_ack;
	if (x->seq != y->seq || x->ops != y->ops || x->files != y->files || x->bytes != y->bytes ||
	    x->deleted != y->deleted || x->kept_dirs != y->kept_dirs || x->fail_flags != y->fail_flags ||
	    x->nfail != y->nfail)
		return false;
	for (uint32_t i = 0; i < x->nfail; i++)
		if (x->fail[i].op != y->fail[i].op || x->fail[i].code != y->fail[i].code ||
		    !str_eq(x->fail[i].path, y->fail[i].path) || !str_eq(x->fail[i].msg, y->fail[i].msg))
			return false;
	return true;
}
static struct wire_sync_fail fails2[] = {{.op = 2, .code = 13, .path = "a", .msg = "m"}};
static bool eq_exec_start(const union wire_msg *a, const union wire_msg *b)
{
	const struct wire_exec_start *x = &a->exec_start, *y = &b->exec_start;
	return x->flags == y->flags && x->timeout_ms == y->timeout_ms && x->rows == y->rows && x->cols == y->cols &&
	       str_eq(x->cwd, y->cwd) && x->argc == y->argc && x->nenv == y->nenv && x->nfwd == y->nfwd &&
	       strv_eq(x->argv, y->argv, x->argc) && strv_eq(x->env, y->env, x->nenv) &&
	       strv_eq(x->fwd, y->fwd, x->nfwd);
}
static bool eq_exec_stdin(const union wire_msg *a, const union wire_msg *b)
{
	return a->exec_stdin.eof == b->exec_stdin.eof &&
	       bytes_eq(a->exec_stdin.data, a->exec_stdin.len, b->exec_stdin.data, b->exec_stdin.len);
}

static char *names[] = {"", "src", "src/lib/a.c", NULL};
static char *argv3[] = {"sh", "-c", "echo hi", NULL};
static char *env2[] = {"TERM=xterm", "LANG=C", NULL};
static char *fwd1[] = {"T=s", NULL};
static const uint8_t blob[] = {0, 1, 0xff};

/* ---- the table ---- */

struct row {
	const char *name;
	int (*dec)(struct buf *in, union wire_msg *m);
	int (*enc)(struct buf *b, const union wire_msg *m);
	void (*clr)(union wire_msg *m);
	bool (*eq)(const union wire_msg *a, const union wire_msg *b); /* NULL: memcmp of the struct */
	size_t size;
	bool tail; /* the last field is "the rest of the payload": a longer payload is not an error */
	union wire_msg m;
	const uint8_t *bytes;
	size_t nbytes;
};

#define B(...) (const uint8_t[]){__VA_ARGS__}, sizeof((const uint8_t[]){__VA_ARGS__})
#define ROW(nm, clr, eq, tail, ...)                                                                                    \
	{                                                                                                              \
#nm, dec_##nm, enc_##nm, clr, eq, sizeof(struct wire_##nm), tail, {.nm = __VA_ARGS__ },
#define END }

static const struct row rows[] = {
    ROW(window, NULL, NULL, false, {.stream = 3, .credit = 65536}) B(0, 0, 0, 3, 0, 1, 0, 0) END,
    ROW(hello, clr_hello, eq_hello, false, {.sign_pk = {1, 2, 3}, .client = "up"})
	B(0, 0, 0, 2, 0, 0, 0, 32, 1, 2, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	  0, 0, 0, 0, 0, 0, 0, 2, 'u', 'p') END,
    ROW(hello_ok, clr_hello_ok, eq_hello_ok, false, {.agent = "a", .root = "/w"})
	B(0, 0, 0, 2, 0, 0, 0, 1, 'a', 0, 0, 0, 2, '/', 'w') END,
    ROW(ping, NULL, eq_ping, false, {.nonce = 9, .pad = blob, .pad_len = 3})
	B(0, 0, 0, 0, 0, 0, 0, 9, 0, 0, 0, 3, 0, 1, 0xff) END,
    ROW(error, clr_error, eq_error, false, {.code = 71, .msg = "no"}) B(0, 0, 0, 71, 0, 0, 0, 2, 'n', 'o') END,
    ROW(bulk, NULL, NULL, false, {.bytes = 0x0102}) B(0, 0, 0, 0, 0, 0, 1, 2) END,
    ROW(sync_begin, NULL, NULL, false, {1, 2, 3, 4}) B(0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 3, 0, 0, 0, 4) END,
    ROW(sync_state, NULL, NULL, false, {.seq = 5, .root = {0xaa}, .entries = 6, .special = 7, .gen = 8})
	B(0, 0, 0, 0, 0, 0, 0, 5, 0xaa, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 6, 0, 0, 0, 7,
	  0, 0, 0, 0, 0, 0, 0, 8) END,
    ROW(sync_req, clr_sync_req, eq_sync_req, false, {.n = 2, .names = names})
	B(0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 's', 'r', 'c') END,
    ROW(sync_level, clr_sync_level, eq_sync_level, false, {.dir = "d", .level = blob, .level_len = 3})
	B(0, 0, 0, 1, 'd', 0, 0, 0, 3, 0, 1, 0xff) END,
    ROW(sync_entry, clr_sync_entry, eq_sync_entry, true, {.path = "p", .found = 1, .entry = blob, .entry_len = 3})
	B(0, 0, 0, 1, 'p', 1, 0, 1, 0xff) END,
    ROW(sync_entry, clr_sync_entry, eq_sync_entry, false, {.path = "p", .found = 0}) B(0, 0, 0, 1, 'p', 0) END,
    ROW(chg_item, clr_chg_item, eq_chg_item, false, {.path = "p", .st_mode = 0100644, .by = 3, .target = ""})
	B(0, 0, 0, 1, 'p', 0, 0, 129, 164, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0,
	  0, 0, 0, 0, 0, 0, 0) END,
    ROW(sync_ack, clr_sync_ack, eq_sync_ack, false, {1, 2, 3, 4, 5, 6, 0, 0, NULL})
	B(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0,
	  0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6) END,
    /* the failure list is optional, so the ACK before it is a valid prefix */
    ROW(sync_ack, clr_sync_ack, eq_sync_ack, true, {1, 2, 3, 4, 5, 6, 0, 1, fails2})
	B(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0,
	  0, 0, 5, 0, 0, 0, 0, 0, 0, 0, 6, 1, 0, 0, 0, 0, 1, 0, 0, 0, 2, 0, 0, 0, 13, 0, 0, 0, 1, 'a', 0, 0, 0, 1, 'm')
	    END,
    ROW(sync_nack, clr_sync_nack, eq_sync_nack, false, {.seq = 1, .code = 5, .partial = 1, .msg = "x"})
	B(0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 5, 1, 0, 0, 0, 1, 'x') END,
    ROW(exec_start, clr_exec_start, eq_exec_start, false,
	{.flags = WIRE_EXEC_F_STDIN, .timeout_ms = 2, .rows = 3, .cols = 4, .cwd = "", .argc = 1, .argv = argv3})
	B(WIRE_EXEC_F_STDIN, 0, 0, 0, 0, 0, 0, 0, 2, 0, 3, 0, 4, 0, 0, 0, 0, 0, 0, 0, 1, 0, 0, 0, 2, 's', 'h', 0, 0, 0,
	  0) END,
    ROW(exec_start, clr_exec_start, eq_exec_start, false,
	{.flags = WIRE_EXEC_F_FWD | WIRE_EXEC_F_TTY,
	 .cwd = "s",
	 .argc = 3,
	 .nenv = 2,
	 .nfwd = 1,
	 .argv = argv3,
	 .env = env2,
	 .fwd = fwd1}) NULL,
    0 END,
    ROW(exec_started, NULL, NULL, false, {.pid = 77}) B(0, 0, 0, 0, 0, 0, 0, 77) END,
    ROW(exec_stdin, NULL, eq_exec_stdin, true, {.eof = 1, .data = blob, .len = 3}) B(1, 0, 1, 0xff) END,
    ROW(exec_stdin, NULL, eq_exec_stdin, true, {.eof = 0}) B(0) END,
    ROW(exec_signal, NULL, NULL, false, {.signo = 15}) B(0, 0, 0, 15) END,
    ROW(exec_resize, NULL, NULL, false, {.rows = 0x102, .cols = 80}) B(1, 2, 0, 80) END,
    ROW(exec_exit, NULL, NULL, false, {130, 2, WIRE_EXEC_X_TIMED_OUT, 3, 4, 5})
	B(0, 0, 0, 130, 0, 0, 0, 2, 1, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 4, 0, 0, 0, 0, 0, 0, 0, 5) END,
    ROW(exec_stdin_ack, NULL, NULL, false, {.bytes = 0x01020304}) B(1, 2, 3, 4) END,
    ROW(proxy_open, NULL, NULL, false, {.exec_stream = 5}) B(0, 0, 0, 5) END,
    ROW(proxy_close, NULL, NULL, false, {.code = WIRE_PROXY_C_LIMIT}) B(2) END,
};
#define NROWS (sizeof(rows) / sizeof(rows[0]))

static bool msg_eq(const struct row *r, const union wire_msg *a, const union wire_msg *b)
{
	return r->eq ? r->eq(a, b) : !memcmp(a, b, r->size);
}

static void test_roundtrip(void **state)
{
	(void)state;
	for (size_t i = 0; i < NROWS; i++) {
		const struct row *r = &rows[i];
		struct buf a, b, c, in;
		union wire_msg d;

		print_message("%s\n", r->name);
		buf_init(&a, WIRE_PAYLOAD_MAX);
		buf_init(&b, WIRE_PAYLOAD_MAX);
		buf_init(&c, WIRE_PAYLOAD_MAX);
		assert_int_equal(r->enc(&a, &r->m), 0);
		assert_int_equal(r->enc(&b, &r->m), 0);
		assert_int_equal(buf_len(&a), buf_len(&b));
		assert_memory_equal(buf_ptr(&a), buf_ptr(&b), buf_len(&a));
		if (r->bytes) { /* the layout of doc/PROTOCOL.md, byte for byte */
			assert_int_equal(buf_len(&a), r->nbytes);
			assert_memory_equal(buf_ptr(&a), r->bytes, r->nbytes);
		}
		buf_view(&in, buf_ptr(&a), buf_len(&a));
		memset(&d, 0, sizeof(d)); /* padding compares equal */
		assert_int_equal(r->dec(&in, &d), 0);
		assert_int_equal(buf_len(&in), 0);
		assert_true(msg_eq(r, &r->m, &d));
		assert_int_equal(r->enc(&c, &d), 0);
		assert_int_equal(buf_len(&c), buf_len(&a));
		assert_memory_equal(buf_ptr(&c), buf_ptr(&a), buf_len(&a));
		if (r->clr)
			r->clr(&d);
		buf_clear(&a);
		buf_clear(&b);
		buf_clear(&c);
	}
}

/* Every strict prefix is refused (unless the message ends in "the rest"
 * and the prefix still holds every fixed field), and so is an extra byte. */
static void test_truncated_and_trailing(void **state)
{
	(void)state;
	for (size_t i = 0; i < NROWS; i++) {
		const struct row *r = &rows[i];
		struct buf a, in;
		union wire_msg d;

		buf_init(&a, WIRE_PAYLOAD_MAX);
		assert_int_equal(r->enc(&a, &r->m), 0);
		for (size_t k = 0; k < buf_len(&a); k++) {
			buf_view(&in, buf_ptr(&a), k);
			int e = r->dec(&in, &d);
			if (e == 0) {
				assert_true(r->tail);
				if (r->clr)
					r->clr(&d);
				continue;
			}
			assert_true(e == -EBADMSG || e == -EPROTO);
		}
		if (!r->tail) {
			assert_int_equal(buf_put_u8(&a, 0), 0);
			buf_view(&in, buf_ptr(&a), buf_len(&a));
			assert_int_equal(r->dec(&in, &d), -EBADMSG);
		}
		buf_clear(&a);
	}
}

/* ---- limits: what each decoder refuses, and with which errno ---- */

static void put_strs(struct buf *b, uint32_t n, const char *s)
{
	assert_int_equal(buf_put_u32(b, n), 0);
	for (uint32_t i = 0; i < n; i++)
		assert_int_equal(buf_put_str(b, s), 0);
}

static void put_long_str(struct buf *b, size_t n)
{
	char *s = mem_alloc(n + 1);
	assert_non_null(s);
	memset(s, 'a', n);
	s[n] = '\0';
	assert_int_equal(buf_put_str(b, s), 0);
	mem_free(s);
}

static void exec_head(struct buf *b, uint8_t flags)
{
	assert_int_equal(buf_put_u8(b, flags), 0);
	assert_int_equal(buf_put_u64(b, 0), 0);
	assert_int_equal(buf_put_u16(b, 0), 0);
	assert_int_equal(buf_put_u16(b, 0), 0);
	assert_int_equal(buf_put_str(b, ""), 0);
}

static void lim_argc0(struct buf *b)
{
	exec_head(b, 0);
	put_strs(b, 0, "");
	put_strs(b, 0, "");
}
static void lim_argc_max(struct buf *b)
{
	exec_head(b, 0);
	put_strs(b, WIRE_EXEC_ARGS_MAX + 1, "x");
	put_strs(b, 0, "");
}
static void lim_argc_ok_max(struct buf *b)
{
	exec_head(b, 0);
	put_strs(b, WIRE_EXEC_ARGS_MAX, "x");
	put_strs(b, 0, "");
}
static void lim_nenv_max(struct buf *b)
{
	exec_head(b, 0);
	put_strs(b, 1, "sh");
	put_strs(b, WIRE_EXEC_ARGS_MAX + 1, "A=b");
}
static void lim_nfwd_max(struct buf *b)
{
	exec_head(b, WIRE_EXEC_F_FWD);
	put_strs(b, 1, "sh");
	put_strs(b, 0, "");
	put_strs(b, WIRE_EXEC_ARGS_MAX + 1, "A=b");
}
static void lim_fwd_missing(struct buf *b)
{
	exec_head(b, WIRE_EXEC_F_FWD);
	put_strs(b, 1, "sh");
	put_strs(b, 0, "");
}
static void lim_count_over_bytes(struct buf *b)
{
	exec_head(b, 0);
	assert_int_equal(buf_put_u32(b, 100), 0); /* 100 strings in 4 bytes */
	assert_int_equal(buf_put_u32(b, 0), 0);
}
static void lim_arg_nul(struct buf *b)
{
	exec_head(b, 0);
	assert_int_equal(buf_put_u32(b, 1), 0);
	assert_int_equal(buf_put_bytes(b, "a\0b", 3), 0);
	put_strs(b, 0, "");
}
static void lim_req_max(struct buf *b)
{
	put_strs(b, WIRE_SYNC_REQ_MAX + 1, "");
}
static void lim_req_ok_max(struct buf *b)
{
	put_strs(b, WIRE_SYNC_REQ_MAX, "");
}
static void lim_req_count_over_bytes(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, 3), 0);
	assert_int_equal(buf_put_u32(b, 0), 0);
}
static void lim_req_path(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, 1), 0);
	put_long_str(b, WIRE_PATH_MAX + 1);
}
static void lim_req_path_ok(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, 1), 0);
	put_long_str(b, WIRE_PATH_MAX);
}
static void lim_hello_version(struct buf *b)
{
	uint8_t pk[32] = {0};
	assert_int_equal(buf_put_u32(b, WIRE_VERSION + 1), 0);
	assert_int_equal(buf_put_bytes(b, pk, 32), 0);
	assert_int_equal(buf_put_str(b, "c"), 0);
}
static void lim_hello_short_key(struct buf *b)
{
	uint8_t pk[32] = {0};
	assert_int_equal(buf_put_u32(b, WIRE_VERSION), 0);
	assert_int_equal(buf_put_bytes(b, pk, 31), 0);
	assert_int_equal(buf_put_str(b, "c"), 0);
}
static void lim_hello_long_key(struct buf *b)
{
	uint8_t pk[33] = {0};
	assert_int_equal(buf_put_u32(b, WIRE_VERSION), 0);
	assert_int_equal(buf_put_bytes(b, pk, 33), 0);
	assert_int_equal(buf_put_str(b, "c"), 0);
}
static void lim_hello_client(struct buf *b)
{
	uint8_t pk[32] = {0};
	assert_int_equal(buf_put_u32(b, WIRE_VERSION), 0);
	assert_int_equal(buf_put_bytes(b, pk, 32), 0);
	put_long_str(b, WIRE_NAME_MAX + 1);
}
static void lim_hello_ok_version(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, WIRE_VERSION + 1), 0);
	assert_int_equal(buf_put_str(b, "a"), 0);
	assert_int_equal(buf_put_str(b, "/"), 0);
}
static void lim_error_msg(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, 1), 0);
	put_long_str(b, WIRE_ERROR_MSG_MAX + 1);
}
static void lim_nack_msg(struct buf *b)
{
	assert_int_equal(buf_put_u64(b, 1), 0);
	assert_int_equal(buf_put_u32(b, 1), 0);
	assert_int_equal(buf_put_u8(b, 0), 0);
	put_long_str(b, WIRE_NACK_MSG_MAX + 1);
}
/* an ACK's six counters, then a failure list head */
static void ack_head(struct buf *b, uint8_t version, uint8_t flags, uint32_t n)
{
	for (int i = 0; i < 6; i++)
		assert_int_equal(buf_put_u64(b, 1), 0);
	assert_int_equal(buf_put_u8(b, version), 0);
	assert_int_equal(buf_put_u8(b, flags), 0);
	assert_int_equal(buf_put_u32(b, n), 0);
}
static void ack_fail(struct buf *b, uint32_t op, uint32_t code, const char *path)
{
	assert_int_equal(buf_put_u32(b, op), 0);
	assert_int_equal(buf_put_u32(b, code), 0);
	assert_int_equal(buf_put_str(b, path), 0);
	assert_int_equal(buf_put_str(b, "m"), 0);
}
static void lim_ack_version(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV + 1, 0, 1);
	ack_fail(b, 0, 13, "a");
}
static void lim_ack_nfail_max(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0, WIRE_SYNC_FAIL_MAX + 1);
	for (uint32_t i = 0; i <= WIRE_SYNC_FAIL_MAX; i++)
		ack_fail(b, i, 13, "a");
}
static void lim_ack_nfail_ok_max(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0, WIRE_SYNC_FAIL_MAX);
	for (uint32_t i = 0; i < WIRE_SYNC_FAIL_MAX; i++)
		ack_fail(b, i, 13, "a");
}
static void lim_ack_millions(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0, 4000000); /* and one entry's bytes */
	ack_fail(b, 0, 13, "a");
}
static void lim_ack_order(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0, 2);
	ack_fail(b, 3, 13, "a");
	ack_fail(b, 3, 13, "b");
}
static void lim_ack_code0(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0, 1);
	ack_fail(b, 0, 0, "a");
}
static void lim_ack_empty(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0, 0);
}
static void lim_ack_flags(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0x2, 1);
	ack_fail(b, 0, 13, "a");
}
static void lim_ack_msg(struct buf *b)
{
	ack_head(b, WIRE_SYNC_FAILV, 0, 1);
	assert_int_equal(buf_put_u32(b, 0), 0);
	assert_int_equal(buf_put_u32(b, 13), 0);
	assert_int_equal(buf_put_str(b, "a"), 0);
	put_long_str(b, WIRE_SYNC_FAIL_MSG_MAX + 1);
}
static void lim_signal0(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, 0), 0);
}
static void lim_signal65(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, 65), 0);
}
static void lim_exit(struct buf *b, uint32_t code, uint32_t sig)
{
	assert_int_equal(buf_put_u32(b, code), 0);
	assert_int_equal(buf_put_u32(b, sig), 0);
	assert_int_equal(buf_put_u8(b, 0), 0);
	for (int i = 0; i < 3; i++)
		assert_int_equal(buf_put_u64(b, 0), 0);
}
static void lim_exit_code(struct buf *b)
{
	lim_exit(b, 256, 0);
}
static void lim_exit_sig(struct buf *b)
{
	lim_exit(b, 0, 65);
}
static void lim_pid(struct buf *b)
{
	assert_int_equal(buf_put_u64(b, (uint64_t)INT32_MAX + 1), 0);
}
static void lim_close_code(struct buf *b)
{
	assert_int_equal(buf_put_u8(b, WIRE_PROXY_C_MAX + 1), 0);
}
static void lim_window_stream0(struct buf *b)
{
	assert_int_equal(buf_put_u32(b, 0), 0);
	assert_int_equal(buf_put_u32(b, 1), 0);
}
static void lim_entry_absent_trailing(struct buf *b)
{
	assert_int_equal(buf_put_str(b, "p"), 0);
	assert_int_equal(buf_put_u8(b, 0), 0);
	assert_int_equal(buf_put_u8(b, 0), 0);
}
static void lim_level_dir(struct buf *b)
{
	put_long_str(b, WIRE_PATH_MAX + 1);
	assert_int_equal(buf_put_bytes(b, "", 0), 0);
}

static const struct limit {
	const char *what;
	int (*dec)(struct buf *in, union wire_msg *m);
	void (*clr)(union wire_msg *m);
	void (*build)(struct buf *b);
	int want;    /* 0: accepted (the limit itself) */
	size_t size; /* of the message struct */
} limits[] = {
    {"EXEC_START argc 0", dec_exec_start, clr_exec_start, lim_argc0, -EBADMSG, sizeof(struct wire_exec_start)},
    {"EXEC_START argc over WIRE_EXEC_ARGS_MAX", dec_exec_start, clr_exec_start, lim_argc_max, -EBADMSG,
     sizeof(struct wire_exec_start)},
    {"EXEC_START argc at WIRE_EXEC_ARGS_MAX", dec_exec_start, clr_exec_start, lim_argc_ok_max, 0,
     sizeof(struct wire_exec_start)},
    {"EXEC_START nenv over WIRE_EXEC_ARGS_MAX", dec_exec_start, clr_exec_start, lim_nenv_max, -EBADMSG,
     sizeof(struct wire_exec_start)},
    {"EXEC_START nfwd over WIRE_EXEC_ARGS_MAX", dec_exec_start, clr_exec_start, lim_nfwd_max, -EBADMSG,
     sizeof(struct wire_exec_start)},
    {"EXEC_START F_FWD without the list", dec_exec_start, clr_exec_start, lim_fwd_missing, -EBADMSG,
     sizeof(struct wire_exec_start)},
    {"EXEC_START count over the bytes left", dec_exec_start, clr_exec_start, lim_count_over_bytes, -EBADMSG,
     sizeof(struct wire_exec_start)},
    {"EXEC_START NUL in an argument", dec_exec_start, clr_exec_start, lim_arg_nul, -EBADMSG,
     sizeof(struct wire_exec_start)},
    {"SYNC_*_REQ n over WIRE_SYNC_REQ_MAX", dec_sync_req, clr_sync_req, lim_req_max, -EBADMSG,
     sizeof(struct wire_sync_req)},
    {"SYNC_*_REQ n at WIRE_SYNC_REQ_MAX", dec_sync_req, clr_sync_req, lim_req_ok_max, 0, sizeof(struct wire_sync_req)},
    {"SYNC_*_REQ n over the bytes left", dec_sync_req, clr_sync_req, lim_req_count_over_bytes, -EBADMSG,
     sizeof(struct wire_sync_req)},
    {"SYNC_*_REQ path over WIRE_PATH_MAX", dec_sync_req, clr_sync_req, lim_req_path, -EBADMSG,
     sizeof(struct wire_sync_req)},
    {"SYNC_*_REQ path at WIRE_PATH_MAX", dec_sync_req, clr_sync_req, lim_req_path_ok, 0, sizeof(struct wire_sync_req)},
    {"SYNC_LEVEL dir over WIRE_PATH_MAX", dec_sync_level, clr_sync_level, lim_level_dir, -EBADMSG,
     sizeof(struct wire_sync_level)},
    {"SYNC_ENTRY not found with bytes after", dec_sync_entry, clr_sync_entry, lim_entry_absent_trailing, -EBADMSG,
     sizeof(struct wire_sync_entry)},
    {"SYNC_NACK message over WIRE_NACK_MSG_MAX", dec_sync_nack, clr_sync_nack, lim_nack_msg, -EBADMSG,
     sizeof(struct wire_sync_nack)},
    {"SYNC_ACK failure list of another version", dec_sync_ack, clr_sync_ack, lim_ack_version, -EPROTO,
     sizeof(struct wire_sync_ack)},
    {"SYNC_ACK failures over WIRE_SYNC_FAIL_MAX", dec_sync_ack, clr_sync_ack, lim_ack_nfail_max, -EBADMSG,
     sizeof(struct wire_sync_ack)},
    {"SYNC_ACK failures at WIRE_SYNC_FAIL_MAX", dec_sync_ack, clr_sync_ack, lim_ack_nfail_ok_max, 0,
     sizeof(struct wire_sync_ack)},
    {"SYNC_ACK millions of failures", dec_sync_ack, clr_sync_ack, lim_ack_millions, -EBADMSG,
     sizeof(struct wire_sync_ack)},
    {"SYNC_ACK failures out of op order", dec_sync_ack, clr_sync_ack, lim_ack_order, -EBADMSG,
     sizeof(struct wire_sync_ack)},
    {"SYNC_ACK failure errno 0", dec_sync_ack, clr_sync_ack, lim_ack_code0, -EBADMSG, sizeof(struct wire_sync_ack)},
    {"SYNC_ACK empty failure list", dec_sync_ack, clr_sync_ack, lim_ack_empty, -EBADMSG, sizeof(struct wire_sync_ack)},
    {"SYNC_ACK unknown failure flag", dec_sync_ack, clr_sync_ack, lim_ack_flags, -EBADMSG,
     sizeof(struct wire_sync_ack)},
    {"SYNC_ACK failure message over WIRE_SYNC_FAIL_MSG_MAX", dec_sync_ack, clr_sync_ack, lim_ack_msg, -EBADMSG,
     sizeof(struct wire_sync_ack)},
    {"HELLO another version", dec_hello, clr_hello, lim_hello_version, -EPROTO, sizeof(struct wire_hello)},
    {"HELLO 31-byte key", dec_hello, clr_hello, lim_hello_short_key, -EPROTO, sizeof(struct wire_hello)},
    {"HELLO 33-byte key", dec_hello, clr_hello, lim_hello_long_key, -EBADMSG, sizeof(struct wire_hello)},
    {"HELLO client over WIRE_NAME_MAX", dec_hello, clr_hello, lim_hello_client, -EBADMSG, sizeof(struct wire_hello)},
    {"HELLO_OK another version", dec_hello_ok, clr_hello_ok, lim_hello_ok_version, -EPROTO,
     sizeof(struct wire_hello_ok)},
    {"ERROR message over WIRE_ERROR_MSG_MAX", dec_error, clr_error, lim_error_msg, -EBADMSG, sizeof(struct wire_error)},
    {"EXEC_SIGNAL 0", dec_exec_signal, NULL, lim_signal0, -EBADMSG, sizeof(struct wire_exec_signal)},
    {"EXEC_SIGNAL 65", dec_exec_signal, NULL, lim_signal65, -EBADMSG, sizeof(struct wire_exec_signal)},
    {"EXEC_EXIT code 256", dec_exec_exit, NULL, lim_exit_code, -EBADMSG, sizeof(struct wire_exec_exit)},
    {"EXEC_EXIT signal 65", dec_exec_exit, NULL, lim_exit_sig, -EBADMSG, sizeof(struct wire_exec_exit)},
    {"EXEC_STARTED pid over INT32_MAX", dec_exec_started, NULL, lim_pid, -EBADMSG, sizeof(struct wire_exec_started)},
    {"PROXY_CLOSE code over WIRE_PROXY_C_MAX", dec_proxy_close, NULL, lim_close_code, -EBADMSG,
     sizeof(struct wire_proxy_close)},
    {"WINDOW for stream 0", dec_window, NULL, lim_window_stream0, -EBADMSG, sizeof(struct wire_window)},
};

static void test_limits(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(limits) / sizeof(limits[0]); i++) {
		const struct limit *l = &limits[i];
		struct buf b, in;
		union wire_msg m;

		print_message("%s\n", l->what);
		buf_init(&b, 4u << 20);
		l->build(&b);
		buf_view(&in, buf_ptr(&b), buf_len(&b));
		memset(&m, 0x5a, sizeof(m));
		assert_int_equal(l->dec(&in, &m), l->want);
		if (l->want < 0 && l->clr) /* nothing allocated, no view left */
			assert_true(wire_msg_zeroed(&m, l->size));
		if (l->clr)
			l->clr(&m);
		buf_clear(&b);
	}
}

/* Decoders that allocate clean up when an allocation fails. */
static void test_alloc_failure(void **state)
{
	(void)state;
	for (size_t i = 0; i < NROWS; i++) {
		const struct row *r = &rows[i];
		struct buf a, in;
		union wire_msg d;

		if (!r->clr)
			continue;
		buf_init(&a, WIRE_PAYLOAD_MAX);
		assert_int_equal(r->enc(&a, &r->m), 0);
		for (unsigned long n = 1;; n++) {
			buf_view(&in, buf_ptr(&a), buf_len(&a));
			mem_fail_at(n, 0);
			int e = r->dec(&in, &d);
			mem_fail_at(0, 0);
			if (e == 0) {
				r->clr(&d);
				break;
			}
			assert_int_equal(e, -ENOMEM);
			assert_true(wire_msg_zeroed(&d, r->size));
		}
		buf_clear(&a);
	}
}

/* Encoders refuse what the peer's decoder would. */
static void test_encode_limits(void **state)
{
	(void)state;
	struct buf b;
	char *many[WIRE_EXEC_ARGS_MAX + 2] = {0};

	for (size_t i = 0; i <= WIRE_EXEC_ARGS_MAX; i++)
		many[i] = "x";
	buf_init(&b, 1u << 20);
	assert_int_equal(wire_exec_start_encode(&b, &(struct wire_exec_start){.argc = 0}), -E2BIG);
	assert_int_equal(
	    wire_exec_start_encode(&b, &(struct wire_exec_start){.argc = WIRE_EXEC_ARGS_MAX + 1, .argv = many}),
	    -E2BIG);
	assert_int_equal(wire_exec_start_encode(&b, &(struct wire_exec_start){.argc = 1, .argv = many, .nfwd = 1}),
			 -E2BIG); /* a forwarded list needs WIRE_EXEC_F_FWD */
	assert_int_equal(wire_exec_signal_encode(&b, &(struct wire_exec_signal){.signo = 0}), -EINVAL);
	assert_int_equal(wire_exec_exit_encode(&b, &(struct wire_exec_exit){.code = 256}), -EINVAL);
	assert_int_equal(wire_proxy_close_encode(&b, &(struct wire_proxy_close){.code = 9}), -EINVAL);
	assert_int_equal(wire_window_encode(&b, &(struct wire_window){.stream = 0}), -EINVAL);
	assert_int_equal(wire_sync_req_encode(&b, &(struct wire_sync_req){.n = WIRE_SYNC_REQ_MAX + 1}), -E2BIG);
	assert_int_equal(buf_len(&b), 0); /* nothing half-written */
	buf_clear(&b);
}

static void test_groups_and_names(void **state)
{
	(void)state;
	assert_int_equal(wire_group_of(0), WIRE_GROUP_NONE);
	assert_int_equal(wire_group_of(WIRE_WINDOW), WIRE_GROUP_CHAN);
	assert_int_equal(wire_group_of(WIRE_HELLO), WIRE_GROUP_SESSION);
	assert_int_equal(wire_group_of(WIRE_ERROR), WIRE_GROUP_SESSION);
	assert_int_equal(wire_group_of(WIRE_BULK_ACK), WIRE_GROUP_BULK);
	assert_int_equal(wire_group_of(WIRE_SYNC_FIRST), WIRE_GROUP_SYNC);
	assert_int_equal(wire_group_of(WIRE_SYNC_LAST), WIRE_GROUP_SYNC);
	assert_int_equal(wire_group_of(WIRE_EXEC_FIRST), WIRE_GROUP_EXEC);
	assert_int_equal(wire_group_of(WIRE_EXEC_LAST), WIRE_GROUP_EXEC);
	assert_int_equal(wire_group_of(WIRE_PROXY_FIRST), WIRE_GROUP_PROXY);
	assert_int_equal(wire_group_of(WIRE_PROXY_LAST), WIRE_GROUP_PROXY);
	assert_int_equal(wire_group_of(WIRE_CHANGES_FIRST), WIRE_GROUP_CHANGES);
	assert_int_equal(wire_group_of(WIRE_CHG_END), WIRE_GROUP_CHANGES);
	assert_int_equal(wire_group_of(WIRE_CHANGES_LAST), WIRE_GROUP_CHANGES);
	assert_int_equal(wire_group_of(WIRE_CHANGES_LAST + 1), WIRE_GROUP_NONE);
	assert_int_equal(wire_group_of(255), WIRE_GROUP_NONE);
	/* every assigned type is inside its group's range */
	assert_int_equal(wire_group_of(WIRE_SYNC_NACK), WIRE_GROUP_SYNC);
	assert_int_equal(wire_group_of(WIRE_EXEC_STDIN_ACK), WIRE_GROUP_EXEC);
	assert_int_equal(wire_group_of(WIRE_PROXY_CLOSE), WIRE_GROUP_PROXY);
	assert_string_equal(wire_type_name(WIRE_SYNC_BEGIN), "SYNC_BEGIN");
	assert_string_equal(wire_type_name(WIRE_EXEC_START), "EXEC_START");
	assert_string_equal(wire_type_name(200), "UNKNOWN");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_roundtrip),	  cmocka_unit_test(test_truncated_and_trailing),
	    cmocka_unit_test(test_limits),	  cmocka_unit_test(test_alloc_failure),
	    cmocka_unit_test(test_encode_limits), cmocka_unit_test(test_groups_and_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
