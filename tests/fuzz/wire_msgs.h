/* SPDX-License-Identifier: Apache-2.0 */
/* Every wire.h payload codec behind one signature, for the tests that walk
 * all of them (tests/fuzz/fuzz_wire.c, tests/unit/core/test_wire.c):
 * union wire_msg holds any message; dec_<msg>, enc_<msg> and clr_<msg>
 * call wire_<msg>_decode, _encode and _clear on it. */
#ifndef AIRLOCK_TESTS_WIRE_MSGS_H
#define AIRLOCK_TESTS_WIRE_MSGS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/core/buf.h"
#include "airlock/core/wire.h"

/* Room for any decoded message. */
union wire_msg {
	struct wire_window window;
	struct wire_hello hello;
	struct wire_hello_ok hello_ok;
	struct wire_ping ping;
	struct wire_error error;
	struct wire_bulk bulk;
	struct wire_sync_begin sync_begin;
	struct wire_sync_state sync_state;
	struct wire_sync_req sync_req;
	struct wire_sync_level sync_level;
	struct wire_sync_entry sync_entry;
	struct wire_sync_ack sync_ack;
	struct wire_sync_nack sync_nack;
	struct wire_exec_start exec_start;
	struct wire_exec_started exec_started;
	struct wire_exec_stdin exec_stdin;
	struct wire_exec_signal exec_signal;
	struct wire_exec_resize exec_resize;
	struct wire_exec_exit exec_exit;
	struct wire_exec_stdin_ack exec_stdin_ack;
	struct wire_proxy_open proxy_open;
	struct wire_proxy_close proxy_close;
	struct wire_chg_item chg_item;
};

/* Typed adaptors: the codecs take their own struct, the table a union. */
#define CODEC(name)                                                                                                    \
	static inline int dec_##name(struct buf *in, union wire_msg *m)                                                \
	{                                                                                                              \
		return wire_##name##_decode(in, &m->name);                                                             \
	}                                                                                                              \
	static inline int enc_##name(struct buf *b, const union wire_msg *m)                                           \
	{                                                                                                              \
		return wire_##name##_encode(b, &m->name);                                                              \
	}
#define CLEAR(name)                                                                                                    \
	static inline void clr_##name(union wire_msg *m)                                                               \
	{                                                                                                              \
		wire_##name##_clear(&m->name);                                                                         \
	}

CODEC(window)
CODEC(hello)
CLEAR(hello)
CODEC(hello_ok)
CLEAR(hello_ok)
CODEC(ping)
CODEC(error)
CLEAR(error)
CODEC(bulk)
CODEC(sync_begin)
CODEC(sync_state)
CODEC(sync_req)
CLEAR(sync_req)
CODEC(sync_level)
CLEAR(sync_level)
CODEC(sync_entry)
CLEAR(sync_entry)
CODEC(chg_item)
CLEAR(chg_item)
CODEC(sync_ack)
CLEAR(sync_ack)
CODEC(sync_nack)
CLEAR(sync_nack)
CODEC(exec_start)
CLEAR(exec_start)
CODEC(exec_started)
CODEC(exec_stdin)
CODEC(exec_signal)
CODEC(exec_resize)
CODEC(exec_exit)
CODEC(exec_stdin_ack)
CODEC(proxy_open)
CODEC(proxy_close)

/* What a failed decode leaves: the first n bytes of m all zero (nothing
 * allocated, no view into the input). */
static inline bool wire_msg_zeroed(const void *m, size_t n)
{
	const uint8_t *b = m;

	for (size_t i = 0; i < n; i++)
		if (b[i])
			return false;
	return true;
}

#endif
