/* SPDX-License-Identifier: Apache-2.0 */
#include "airlock/core/wire.h"

#include <errno.h>
#include <stddef.h>

#include "airlock/core/buf.h"

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
};

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

int wire_hello_put(struct buf *b, const uint8_t sign_pk[32], const char *client)
{
	int r;

	if ((r = buf_put_u32(b, WIRE_VERSION)) < 0 || (r = buf_put_bytes(b, sign_pk, 32)) < 0 ||
	    (r = buf_put_str(b, client)) < 0)
		return r;
	return 0;
}

int wire_hello_ok_check(struct buf *in)
{
	uint32_t version;

	return buf_get_u32(in, &version) == 0 && version == WIRE_VERSION ? 0 : -EPROTO;
}
