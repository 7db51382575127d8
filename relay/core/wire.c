/* SPDX-License-Identifier: Apache-2.0 */
#include "airlock/core/wire.h"

#include <errno.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

static const char *const type_names[WIRE_TYPE_MAX + 1] = {
    [WIRE_WINDOW] = "WINDOW",
    [WIRE_BYE] = "BYE",
    [WIRE_RESET] = "RESET",
    [WIRE_HELLO] = "HELLO",
    [WIRE_HELLO_OK] = "HELLO_OK",
    [WIRE_PING] = "PING",
    [WIRE_PONG] = "PONG",
    [WIRE_ERROR] = "ERROR",
    [WIRE_BULK_DATA] = "BULK_DATA",
    [WIRE_BULK_END] = "BULK_END",
    [WIRE_BULK_ACK] = "BULK_ACK",
    [WIRE_SYNC_BEGIN] = "SYNC_BEGIN",
    [WIRE_SYNC_STATE] = "SYNC_STATE",
    [WIRE_SYNC_LEVELS_REQ] = "SYNC_LEVELS_REQ",
    [WIRE_SYNC_LEVEL] = "SYNC_LEVEL",
    [WIRE_SYNC_ENTRIES_REQ] = "SYNC_ENTRIES_REQ",
    [WIRE_SYNC_ENTRY] = "SYNC_ENTRY",
    [WIRE_SYNC_BATCH] = "SYNC_BATCH",
    [WIRE_SYNC_ACK] = "SYNC_ACK",
    [WIRE_SYNC_NACK] = "SYNC_NACK",
    [WIRE_EXEC_START] = "EXEC_START",
    [WIRE_EXEC_STARTED] = "EXEC_STARTED",
    [WIRE_EXEC_STDOUT] = "EXEC_STDOUT",
    [WIRE_EXEC_STDERR] = "EXEC_STDERR",
    [WIRE_EXEC_STDIN] = "EXEC_STDIN",
    [WIRE_EXEC_SIGNAL] = "EXEC_SIGNAL",
    [WIRE_EXEC_RESIZE] = "EXEC_RESIZE",
    [WIRE_EXEC_CANCEL] = "EXEC_CANCEL",
    [WIRE_EXEC_EXIT] = "EXEC_EXIT",
    [WIRE_EXEC_ERROR] = "EXEC_ERROR",
    [WIRE_EXEC_STDIN_ACK] = "EXEC_STDIN_ACK",
    [WIRE_PROXY_OPEN] = "PROXY_OPEN",
    [WIRE_PROXY_DATA] = "PROXY_DATA",
    [WIRE_PROXY_EOF] = "PROXY_EOF",
    [WIRE_PROXY_CLOSE] = "PROXY_CLOSE",
    [WIRE_CHG_ITEM] = "CHG_ITEM",
    [WIRE_CHG_PULL] = "CHG_PULL",
    [WIRE_CHG_FILE] = "CHG_FILE",
    [WIRE_CHG_DATA] = "CHG_DATA",
    [WIRE_CHG_END] = "CHG_END",
};

enum wire_group wire_group_of(uint8_t type)
{
	if (type >= WIRE_CHAN_FIRST && type <= WIRE_CHAN_LAST)
		return WIRE_GROUP_CHAN;
	if (type >= WIRE_SESSION_FIRST && type <= WIRE_SESSION_LAST)
		return WIRE_GROUP_SESSION;
	if (type >= WIRE_BULK_FIRST && type <= WIRE_BULK_LAST)
		return WIRE_GROUP_BULK;
	if (type >= WIRE_SYNC_FIRST && type <= WIRE_SYNC_LAST)
		return WIRE_GROUP_SYNC;
	if (type >= WIRE_EXEC_FIRST && type <= WIRE_EXEC_LAST)
		return WIRE_GROUP_EXEC;
	if (type >= WIRE_PROXY_FIRST && type <= WIRE_PROXY_LAST)
		return WIRE_GROUP_PROXY;
	if (type >= WIRE_CHANGES_FIRST && type <= WIRE_CHANGES_LAST)
		return WIRE_GROUP_CHANGES;
	return WIRE_GROUP_NONE;
}

const char *wire_type_name(uint8_t type)
{
	const char *n = type_names[type];
	return n ? n : "UNKNOWN";
}

const char *wire_refusal_str(uint8_t reason)
{
	switch (reason) {
	case WIRE_REFUSE_VERSION:
		return "the peer speaks a different airlock wire version";
	case WIRE_REFUSE_GUEST_KEY:
		return "the guest key this host pinned (--guest-key) is not the guest's key";
	case WIRE_REFUSE_HOST_KEY:
		return "this host's key is not on the guest's allow-list (--allow)";
	case WIRE_REFUSE_REPLAY:
		return "handshake replayed or host clock went backwards (timestamp not newer than the last one)";
	case WIRE_REFUSE_BUSY:
		return "the guest has too many sessions";
	case WIRE_REFUSE_MALFORMED:
		return "malformed handshake message";
	default:
		return "unknown refusal";
	}
}

/* ---- codec helpers ---- */

/* The last step of every decoder: the payload is used up. */
static int done(const struct buf *in)
{
	return buf_len(in) == 0 ? 0 : -EBADMSG;
}

static void free_strv(char **v, uint32_t n, bool wipe)
{
	for (uint32_t i = 0; v && i < n; i++) {
		if (v[i] && wipe)
			sodium_memzero(v[i], strlen(v[i]));
		mem_free(v[i]);
	}
	mem_free(v);
}

/* u32 n (<= max, and at most one string per 4 readable bytes: each has a
 * u32 length), then n strings of at most `limit` bytes into a new
 * NULL-terminated array. Counts are checked before the array is
 * allocated; on failure nothing stays allocated. */
static int get_strv(struct buf *in, uint32_t max, size_t limit, bool wipe, uint32_t *n, char ***out)
{
	char **v;
	int r;

	*out = NULL;
	if ((r = buf_get_u32(in, n)) < 0)
		return r;
	if (*n > max || *n > buf_len(in) / 4)
		return -EBADMSG;
	if (!(v = mem_calloc((size_t)*n + 1, sizeof(*v))))
		return -ENOMEM;
	for (uint32_t i = 0; i < *n; i++) {
		if ((r = buf_get_str(in, &v[i], limit)) < 0) {
			free_strv(v, i, wipe);
			return r;
		}
	}
	*out = v;
	return 0;
}

static int put_strv(struct buf *b, char *const *v, uint32_t n)
{
	int r;

	if ((r = buf_put_u32(b, n)) < 0)
		return r;
	for (uint32_t i = 0; i < n; i++)
		if ((r = buf_put_str(b, v[i])) < 0)
			return r;
	return 0;
}

/* ---- channel ---- */

int wire_window_encode(struct buf *b, const struct wire_window *m)
{
	int r;

	if (m->stream == WIRE_STREAM_CONTROL)
		return -EINVAL;
	if ((r = buf_put_u32(b, m->stream)) < 0 || (r = buf_put_u32(b, m->credit)) < 0)
		return r;
	return 0;
}

int wire_window_decode(struct buf *in, struct wire_window *m)
{
	int r;

	if ((r = buf_get_u32(in, &m->stream)) < 0 || (r = buf_get_u32(in, &m->credit)) < 0 || (r = done(in)) < 0)
		return r;
	return m->stream == WIRE_STREAM_CONTROL ? -EBADMSG : 0;
}

/* ---- session ---- */

int wire_hello_encode(struct buf *b, const struct wire_hello *m)
{
	int r;

	if ((r = buf_put_u32(b, WIRE_VERSION)) < 0 || (r = buf_put_bytes(b, m->sign_pk, 32)) < 0 ||
	    (r = buf_put_str(b, m->client)) < 0)
		return r;
	return 0;
}

int wire_hello_decode(struct buf *in, struct wire_hello *m)
{
	uint32_t version;
	const uint8_t *pk;
	size_t pklen;
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u32(in, &version)) < 0 || (r = buf_get_bytes(in, &pk, &pklen, 32)) < 0 ||
	    (r = buf_get_str(in, &m->client, WIRE_NAME_MAX)) < 0)
		goto fail;
	/* the version first: a peer of another version may lay out the rest
	 * differently */
	if (version != WIRE_VERSION || pklen != 32) {
		r = -EPROTO;
		goto fail;
	}
	if ((r = done(in)) < 0)
		goto fail;
	memcpy(m->sign_pk, pk, 32);
	return 0;
fail:
	wire_hello_clear(m);
	return r;
}

void wire_hello_clear(struct wire_hello *m)
{
	mem_free(m->client);
	memset(m, 0, sizeof(*m));
}

int wire_hello_ok_encode(struct buf *b, const struct wire_hello_ok *m)
{
	int r;

	if ((r = buf_put_u32(b, WIRE_VERSION)) < 0 || (r = buf_put_str(b, m->agent)) < 0 ||
	    (r = buf_put_str(b, m->root)) < 0)
		return r;
	return 0;
}

int wire_hello_ok_decode(struct buf *in, struct wire_hello_ok *m)
{
	uint32_t version;
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u32(in, &version)) < 0)
		return r;
	if (version != WIRE_VERSION)
		return -EPROTO;
	if ((r = buf_get_str(in, &m->agent, WIRE_NAME_MAX)) < 0 || (r = buf_get_str(in, &m->root, WIRE_PATH_MAX)) < 0 ||
	    (r = done(in)) < 0) {
		wire_hello_ok_clear(m);
		return r;
	}
	return 0;
}

void wire_hello_ok_clear(struct wire_hello_ok *m)
{
	mem_free(m->agent);
	mem_free(m->root);
	memset(m, 0, sizeof(*m));
}

int wire_ping_encode(struct buf *b, const struct wire_ping *m)
{
	int r;

	if ((r = buf_put_u64(b, m->nonce)) < 0 || (r = buf_put_bytes(b, m->pad, m->pad_len)) < 0)
		return r;
	return 0;
}

int wire_ping_decode(struct buf *in, struct wire_ping *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u64(in, &m->nonce)) < 0 ||
	    (r = buf_get_bytes(in, &m->pad, &m->pad_len, WIRE_PAYLOAD_MAX)) < 0 || (r = done(in)) < 0) {
		memset(m, 0, sizeof(*m));
		return r;
	}
	return 0;
}

int wire_error_encode(struct buf *b, const struct wire_error *m)
{
	int r;

	if ((r = buf_put_u32(b, m->code)) < 0 || (r = buf_put_str(b, m->msg)) < 0)
		return r;
	return 0;
}

int wire_error_decode(struct buf *in, struct wire_error *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u32(in, &m->code)) < 0 || (r = buf_get_str(in, &m->msg, WIRE_ERROR_MSG_MAX)) < 0 ||
	    (r = done(in)) < 0) {
		wire_error_clear(m);
		return r;
	}
	return 0;
}

void wire_error_clear(struct wire_error *m)
{
	mem_free(m->msg);
	memset(m, 0, sizeof(*m));
}

/* ---- bulk ---- */

int wire_bulk_encode(struct buf *b, const struct wire_bulk *m)
{
	return buf_put_u64(b, m->bytes);
}

int wire_bulk_decode(struct buf *in, struct wire_bulk *m)
{
	int r;

	if ((r = buf_get_u64(in, &m->bytes)) < 0 || (r = done(in)) < 0)
		return r;
	return 0;
}

/* ---- sync ---- */

int wire_sync_begin_encode(struct buf *b, const struct wire_sync_begin *m)
{
	int r;

	if ((r = buf_put_u32(b, m->min)) < 0 || (r = buf_put_u32(b, m->avg)) < 0 || (r = buf_put_u32(b, m->max)) < 0 ||
	    (r = buf_put_u32(b, m->whole_max)) < 0)
		return r;
	return 0;
}

int wire_sync_begin_decode(struct buf *in, struct wire_sync_begin *m)
{
	int r;

	if ((r = buf_get_u32(in, &m->min)) < 0 || (r = buf_get_u32(in, &m->avg)) < 0 ||
	    (r = buf_get_u32(in, &m->max)) < 0 || (r = buf_get_u32(in, &m->whole_max)) < 0 || (r = done(in)) < 0)
		return r;
	return 0;
}

int wire_sync_state_encode(struct buf *b, const struct wire_sync_state *m)
{
	int r;

	if ((r = buf_put_u64(b, m->seq)) < 0 || (r = buf_put(b, m->root, sizeof(m->root))) < 0 ||
	    (r = buf_put_u64(b, m->entries)) < 0 || (r = buf_put_u32(b, m->special)) < 0 ||
	    (r = buf_put_u64(b, m->gen)) < 0)
		return r;
	return 0;
}

int wire_sync_state_decode(struct buf *in, struct wire_sync_state *m)
{
	int r;

	if ((r = buf_get_u64(in, &m->seq)) < 0 || (r = buf_get(in, m->root, sizeof(m->root))) < 0 ||
	    (r = buf_get_u64(in, &m->entries)) < 0 || (r = buf_get_u32(in, &m->special)) < 0 ||
	    (r = buf_get_u64(in, &m->gen)) < 0 || (r = done(in)) < 0)
		return r;
	return 0;
}

int wire_sync_req_encode(struct buf *b, const struct wire_sync_req *m)
{
	if (m->n > WIRE_SYNC_REQ_MAX)
		return -E2BIG;
	for (uint32_t i = 0; i < m->n; i++)
		if (strlen(m->names[i]) > WIRE_PATH_MAX)
			return -E2BIG;
	return put_strv(b, m->names, m->n);
}

int wire_sync_req_decode(struct buf *in, struct wire_sync_req *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = get_strv(in, WIRE_SYNC_REQ_MAX, WIRE_PATH_MAX, false, &m->n, &m->names)) < 0 || (r = done(in)) < 0) {
		wire_sync_req_clear(m);
		return r;
	}
	return 0;
}

void wire_sync_req_clear(struct wire_sync_req *m)
{
	free_strv(m->names, m->names ? m->n : 0, false);
	memset(m, 0, sizeof(*m));
}

int wire_sync_level_encode(struct buf *b, const struct wire_sync_level *m)
{
	int r;

	if ((r = buf_put_str(b, m->dir)) < 0 || (r = buf_put_bytes(b, m->level, m->level_len)) < 0)
		return r;
	return 0;
}

int wire_sync_level_decode(struct buf *in, struct wire_sync_level *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_str(in, &m->dir, WIRE_PATH_MAX)) < 0 ||
	    (r = buf_get_bytes(in, &m->level, &m->level_len, WIRE_SYNC_MSG_MAX)) < 0 || (r = done(in)) < 0) {
		wire_sync_level_clear(m);
		return r;
	}
	return 0;
}

void wire_sync_level_clear(struct wire_sync_level *m)
{
	mem_free(m->dir);
	memset(m, 0, sizeof(*m));
}

int wire_sync_entry_encode(struct buf *b, const struct wire_sync_entry *m)
{
	int r;

	if (!m->found && m->entry_len)
		return -EINVAL;
	if ((r = buf_put_str(b, m->path)) < 0 || (r = buf_put_u8(b, m->found)) < 0 ||
	    (m->entry_len && (r = buf_put(b, m->entry, m->entry_len)) < 0))
		return r;
	return 0;
}

int wire_sync_entry_decode(struct buf *in, struct wire_sync_entry *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_str(in, &m->path, WIRE_PATH_MAX)) < 0 || (r = buf_get_u8(in, &m->found)) < 0 ||
	    (!m->found && (r = done(in)) < 0)) {
		wire_sync_entry_clear(m);
		return r;
	}
	m->entry = buf_ptr(in);
	m->entry_len = buf_len(in);
	buf_consume(in, m->entry_len);
	return 0;
}

void wire_sync_entry_clear(struct wire_sync_entry *m)
{
	mem_free(m->path);
	memset(m, 0, sizeof(*m));
}

/* A CHG item is consistent with itself: a gone path carries nothing, a
 * target only and always for a symlink, the hash only when flagged. */
static int chg_item_check(const struct wire_chg_item *m)
{
	static const uint8_t zero[WIRE_SYNC_HASH_LEN];
	bool link = (m->st_mode & 0170000u) == 0120000u;

	if (m->flags & ~WIRE_CHG_F_HASHED)
		return -EINVAL;
	if (!m->st_mode && (m->size || m->flags || memcmp(m->hash, zero, sizeof(zero))))
		return -EINVAL;
	if (link != (m->target && m->target[0]))
		return -EINVAL;
	if (!(m->flags & WIRE_CHG_F_HASHED) && memcmp(m->hash, zero, sizeof(zero)))
		return -EINVAL;
	return 0;
}

int wire_chg_item_encode(struct buf *b, const struct wire_chg_item *m)
{
	int r;

	if (chg_item_check(m) < 0 || strlen(m->path) > WIRE_PATH_MAX ||
	    (m->target && strlen(m->target) > WIRE_PATH_MAX))
		return -EINVAL;
	if ((r = buf_put_str(b, m->path)) < 0 || (r = buf_put_u32(b, m->st_mode)) < 0 ||
	    (r = buf_put_u32(b, m->by)) < 0 || (r = buf_put_u8(b, m->flags)) < 0 || (r = buf_put_u64(b, m->size)) < 0 ||
	    (r = buf_put(b, m->hash, sizeof(m->hash))) < 0 || (r = buf_put_str(b, m->target ? m->target : "")) < 0)
		return r;
	return 0;
}

int wire_chg_item_decode(struct buf *in, struct wire_chg_item *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_str(in, &m->path, WIRE_PATH_MAX)) < 0 || (r = buf_get_u32(in, &m->st_mode)) < 0 ||
	    (r = buf_get_u32(in, &m->by)) < 0 || (r = buf_get_u8(in, &m->flags)) < 0 ||
	    (r = buf_get_u64(in, &m->size)) < 0 || (r = buf_get(in, m->hash, sizeof(m->hash))) < 0 ||
	    (r = buf_get_str(in, &m->target, WIRE_PATH_MAX)) < 0 || (r = done(in)) < 0 ||
	    (r = chg_item_check(m) < 0 ? -EBADMSG : 0) < 0) {
		wire_chg_item_clear(m);
		return r;
	}
	return 0;
}

void wire_chg_item_clear(struct wire_chg_item *m)
{
	mem_free(m->path);
	mem_free(m->target);
	memset(m, 0, sizeof(*m));
}

/* The failure list on its own: consistent with itself (see wire.h). */
static int sync_fail_check(const struct wire_sync_ack *m)
{
	if ((m->fail_flags & ~WIRE_SYNC_FAIL_F_MORE) || m->nfail > WIRE_SYNC_FAIL_MAX ||
	    (m->nfail == 0 && !m->fail_flags))
		return -EBADMSG;
	for (uint32_t i = 0; i < m->nfail; i++) {
		const struct wire_sync_fail *f = &m->fail[i];
		if ((i && f->op <= m->fail[i - 1].op) || f->code == 0 || f->code >= 4096)
			return -EBADMSG;
	}
	return 0;
}

int wire_sync_ack_encode(struct buf *b, const struct wire_sync_ack *m)
{
	int r;

	if ((r = buf_put_u64(b, m->seq)) < 0 || (r = buf_put_u64(b, m->ops)) < 0 ||
	    (r = buf_put_u64(b, m->files)) < 0 || (r = buf_put_u64(b, m->bytes)) < 0 ||
	    (r = buf_put_u64(b, m->deleted)) < 0 || (r = buf_put_u64(b, m->kept_dirs)) < 0)
		return r;
	if (!m->nfail && !m->fail_flags)
		return 0;
	if (sync_fail_check(m) < 0)
		return -EINVAL;
	for (uint32_t i = 0; i < m->nfail; i++)
		if (strlen(m->fail[i].path) > WIRE_PATH_MAX || strlen(m->fail[i].msg) > WIRE_SYNC_FAIL_MSG_MAX)
			return -EINVAL;
	if ((r = buf_put_u8(b, WIRE_SYNC_FAILV)) < 0 || (r = buf_put_u8(b, m->fail_flags)) < 0 ||
	    (r = buf_put_u32(b, m->nfail)) < 0)
		return r;
	for (uint32_t i = 0; i < m->nfail; i++) {
		const struct wire_sync_fail *f = &m->fail[i];
		if ((r = buf_put_u32(b, f->op)) < 0 || (r = buf_put_u32(b, f->code)) < 0 ||
		    (r = buf_put_str(b, f->path)) < 0 || (r = buf_put_str(b, f->msg)) < 0)
			return r;
	}
	return 0;
}

static int sync_fail_decode(struct buf *in, struct wire_sync_ack *m)
{
	uint8_t version;
	int r;

	if ((r = buf_get_u8(in, &version)) < 0)
		return r;
	if (version != WIRE_SYNC_FAILV) /* 0 was never a version: a stray byte */
		return version == 0 ? -EBADMSG : -EPROTO;
	if ((r = buf_get_u8(in, &m->fail_flags)) < 0 || (r = buf_get_u32(in, &m->nfail)) < 0)
		return r;
	/* every entry takes at least 16 bytes: a count the payload cannot
	 * hold is refused before the allocation */
	if (m->nfail > WIRE_SYNC_FAIL_MAX || (uint64_t)m->nfail * 16 > buf_len(in))
		return -EBADMSG;
	if (m->nfail && !(m->fail = mem_calloc(m->nfail, sizeof(*m->fail))))
		return -ENOMEM;
	for (uint32_t i = 0; i < m->nfail; i++) {
		struct wire_sync_fail *f = &m->fail[i];
		if ((r = buf_get_u32(in, &f->op)) < 0 || (r = buf_get_u32(in, &f->code)) < 0 ||
		    (r = buf_get_str(in, &f->path, WIRE_PATH_MAX)) < 0 ||
		    (r = buf_get_str(in, &f->msg, WIRE_SYNC_FAIL_MSG_MAX)) < 0)
			return r;
	}
	return sync_fail_check(m);
}

int wire_sync_ack_decode(struct buf *in, struct wire_sync_ack *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u64(in, &m->seq)) < 0 || (r = buf_get_u64(in, &m->ops)) < 0 ||
	    (r = buf_get_u64(in, &m->files)) < 0 || (r = buf_get_u64(in, &m->bytes)) < 0 ||
	    (r = buf_get_u64(in, &m->deleted)) < 0 || (r = buf_get_u64(in, &m->kept_dirs)) < 0 ||
	    (buf_len(in) && (r = sync_fail_decode(in, m)) < 0) || (r = done(in)) < 0) {
		wire_sync_ack_clear(m);
		return r;
	}
	return 0;
}

void wire_sync_ack_clear(struct wire_sync_ack *m)
{
	for (uint32_t i = 0; m->fail && i < m->nfail; i++) {
		mem_free(m->fail[i].path);
		mem_free(m->fail[i].msg);
	}
	mem_free(m->fail);
	memset(m, 0, sizeof(*m));
}

int wire_sync_nack_encode(struct buf *b, const struct wire_sync_nack *m)
{
	int r;

	if ((r = buf_put_u64(b, m->seq)) < 0 || (r = buf_put_u32(b, m->code)) < 0 ||
	    (r = buf_put_u8(b, m->partial)) < 0 || (r = buf_put_str(b, m->msg)) < 0)
		return r;
	return 0;
}

int wire_sync_nack_decode(struct buf *in, struct wire_sync_nack *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u64(in, &m->seq)) < 0 || (r = buf_get_u32(in, &m->code)) < 0 ||
	    (r = buf_get_u8(in, &m->partial)) < 0 || (r = buf_get_str(in, &m->msg, WIRE_NACK_MSG_MAX)) < 0 ||
	    (r = done(in)) < 0) {
		wire_sync_nack_clear(m);
		return r;
	}
	return 0;
}

void wire_sync_nack_clear(struct wire_sync_nack *m)
{
	mem_free(m->msg);
	memset(m, 0, sizeof(*m));
}

/* ---- exec ---- */

int wire_exec_start_encode(struct buf *b, const struct wire_exec_start *m)
{
	bool fwd = m->flags & WIRE_EXEC_F_FWD;
	int r;

	if (m->argc == 0 || m->argc > WIRE_EXEC_ARGS_MAX || m->nenv > WIRE_EXEC_ARGS_MAX ||
	    m->nfwd > WIRE_EXEC_ARGS_MAX || (!fwd && m->nfwd))
		return -E2BIG;
	if ((r = buf_put_u8(b, m->flags)) < 0 || (r = buf_put_u64(b, m->timeout_ms)) < 0 ||
	    (r = buf_put_u16(b, m->rows)) < 0 || (r = buf_put_u16(b, m->cols)) < 0 ||
	    (r = buf_put_str(b, m->cwd ? m->cwd : "")) < 0 || (r = put_strv(b, m->argv, m->argc)) < 0 ||
	    (r = put_strv(b, m->env, m->nenv)) < 0 || (fwd && (r = put_strv(b, m->fwd, m->nfwd)) < 0))
		return r;
	return 0;
}

int wire_exec_start_decode(struct buf *in, struct wire_exec_start *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u8(in, &m->flags)) < 0 || (r = buf_get_u64(in, &m->timeout_ms)) < 0 ||
	    (r = buf_get_u16(in, &m->rows)) < 0 || (r = buf_get_u16(in, &m->cols)) < 0 ||
	    (r = buf_get_str(in, &m->cwd, WIRE_EXEC_STR_MAX)) < 0 ||
	    (r = get_strv(in, WIRE_EXEC_ARGS_MAX, WIRE_EXEC_STR_MAX, false, &m->argc, &m->argv)) < 0)
		goto fail;
	if (m->argc == 0) {
		r = -EBADMSG;
		goto fail;
	}
	if ((r = get_strv(in, WIRE_EXEC_ARGS_MAX, WIRE_EXEC_STR_MAX, true, &m->nenv, &m->env)) < 0)
		goto fail;
	/* the forwarded layer: forward_env and credentials.inject */
	if ((m->flags & WIRE_EXEC_F_FWD) &&
	    (r = get_strv(in, WIRE_EXEC_ARGS_MAX, WIRE_EXEC_STR_MAX, true, &m->nfwd, &m->fwd)) < 0)
		goto fail;
	if ((r = done(in)) < 0)
		goto fail;
	return 0;
fail:
	wire_exec_start_clear(m);
	return r;
}

void wire_exec_start_clear(struct wire_exec_start *m)
{
	mem_free(m->cwd);
	free_strv(m->argv, m->argv ? m->argc : 0, false);
	free_strv(m->env, m->env ? m->nenv : 0, true);
	free_strv(m->fwd, m->fwd ? m->nfwd : 0, true);
	memset(m, 0, sizeof(*m));
}

int wire_exec_started_encode(struct buf *b, const struct wire_exec_started *m)
{
	if (m->pid > INT32_MAX)
		return -EINVAL;
	return buf_put_u64(b, m->pid);
}

int wire_exec_started_decode(struct buf *in, struct wire_exec_started *m)
{
	int r;

	if ((r = buf_get_u64(in, &m->pid)) < 0 || (r = done(in)) < 0)
		return r;
	return m->pid > INT32_MAX ? -EBADMSG : 0;
}

int wire_exec_stdin_encode(struct buf *b, const struct wire_exec_stdin *m)
{
	int r;

	if ((r = buf_put_u8(b, m->eof)) < 0 || (m->len && (r = buf_put(b, m->data, m->len)) < 0))
		return r;
	return 0;
}

int wire_exec_stdin_decode(struct buf *in, struct wire_exec_stdin *m)
{
	int r;

	memset(m, 0, sizeof(*m));
	if ((r = buf_get_u8(in, &m->eof)) < 0)
		return r;
	m->data = buf_ptr(in);
	m->len = buf_len(in);
	buf_consume(in, m->len);
	return 0;
}

int wire_exec_signal_encode(struct buf *b, const struct wire_exec_signal *m)
{
	if (m->signo < 1 || m->signo > 64)
		return -EINVAL;
	return buf_put_u32(b, m->signo);
}

int wire_exec_signal_decode(struct buf *in, struct wire_exec_signal *m)
{
	int r;

	if ((r = buf_get_u32(in, &m->signo)) < 0)
		return r;
	if (m->signo < 1 || m->signo > 64)
		return -EBADMSG;
	return done(in);
}

int wire_exec_resize_encode(struct buf *b, const struct wire_exec_resize *m)
{
	int r;

	if ((r = buf_put_u16(b, m->rows)) < 0 || (r = buf_put_u16(b, m->cols)) < 0)
		return r;
	return 0;
}

int wire_exec_resize_decode(struct buf *in, struct wire_exec_resize *m)
{
	int r;

	if ((r = buf_get_u16(in, &m->rows)) < 0 || (r = buf_get_u16(in, &m->cols)) < 0 || (r = done(in)) < 0)
		return r;
	return 0;
}

int wire_exec_exit_encode(struct buf *b, const struct wire_exec_exit *m)
{
	int r;

	if (m->code > 255 || m->signo > 64)
		return -EINVAL;
	if ((r = buf_put_u32(b, m->code)) < 0 || (r = buf_put_u32(b, m->signo)) < 0 ||
	    (r = buf_put_u8(b, m->flags)) < 0 || (r = buf_put_u64(b, m->duration_ms)) < 0 ||
	    (r = buf_put_u64(b, m->stdout_bytes)) < 0 || (r = buf_put_u64(b, m->stderr_bytes)) < 0)
		return r;
	return 0;
}

int wire_exec_exit_decode(struct buf *in, struct wire_exec_exit *m)
{
	int r;

	if ((r = buf_get_u32(in, &m->code)) < 0 || (r = buf_get_u32(in, &m->signo)) < 0 ||
	    (r = buf_get_u8(in, &m->flags)) < 0 || (r = buf_get_u64(in, &m->duration_ms)) < 0 ||
	    (r = buf_get_u64(in, &m->stdout_bytes)) < 0 || (r = buf_get_u64(in, &m->stderr_bytes)) < 0 ||
	    (r = done(in)) < 0)
		return r;
	return m->code > 255 || m->signo > 64 ? -EBADMSG : 0;
}

int wire_exec_stdin_ack_encode(struct buf *b, const struct wire_exec_stdin_ack *m)
{
	return buf_put_u32(b, m->bytes);
}

int wire_exec_stdin_ack_decode(struct buf *in, struct wire_exec_stdin_ack *m)
{
	int r;

	if ((r = buf_get_u32(in, &m->bytes)) < 0 || (r = done(in)) < 0)
		return r;
	return 0;
}

/* ---- proxy ---- */

int wire_proxy_open_encode(struct buf *b, const struct wire_proxy_open *m)
{
	return buf_put_u32(b, m->exec_stream);
}

int wire_proxy_open_decode(struct buf *in, struct wire_proxy_open *m)
{
	int r;

	if ((r = buf_get_u32(in, &m->exec_stream)) < 0 || (r = done(in)) < 0)
		return r;
	return 0;
}

int wire_proxy_close_encode(struct buf *b, const struct wire_proxy_close *m)
{
	if (m->code > WIRE_PROXY_C_MAX)
		return -EINVAL;
	return buf_put_u8(b, m->code);
}

int wire_proxy_close_decode(struct buf *in, struct wire_proxy_close *m)
{
	int r;

	if ((r = buf_get_u8(in, &m->code)) < 0 || (r = done(in)) < 0)
		return r;
	return m->code > WIRE_PROXY_C_MAX ? -EBADMSG : 0;
}
