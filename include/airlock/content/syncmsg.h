/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SYNCMSG_H
#define AIRLOCK_SYNCMSG_H

/*
 * syncmsg: the pieces of the sync exchange both sides run (the host's
 * engine in sync/sync.h, the guest's in guest/syncg.h): the batch scope,
 * the delta caps, and sync messages reassembled from and fragmented into
 * frames of a sync stream (core/wire.h "sync" group, doc/PROTOCOL.md
 * "Sync").
 */

#include <stddef.h>
#include <stdint.h>

#include "airlock/content/delta.h"
#include "airlock/core/buf.h"

struct chan;

/* The 32-byte batch scope (delta.h): SHA-256 over the label
 * "airlock sync scope v1", the guest's static public key and the host's
 * sync-signing public key. A batch made for one guest, or by another host
 * key, is refused. */
void syncmsg_scope(const uint8_t guest_pub[32], const uint8_t host_sign_pk[32], uint8_t scope[DELTA_SCOPE_LEN]);

/* Delta caps both sides use (max_batch = WIRE_SYNC_MSG_MAX). */
extern const struct delta_caps syncmsg_delta_caps;

/* Reassembly of fragmented sync messages (wire.h: first byte "more"). */
struct syncmsg_inbox {
	uint8_t type; /* type of the message being assembled, 0 = none */
	struct buf b; /* owned, capped at WIRE_SYNC_MSG_MAX */
};
void syncmsg_inbox_init(struct syncmsg_inbox *in);
void syncmsg_inbox_clear(struct syncmsg_inbox *in);
/* Add one frame. Returns 1 with the whole message in in->b (the caller
 * parses it, then calls syncmsg_inbox_done), 0 when more fragments are due,
 * -EBADMSG for an empty frame or a type change inside a message,
 * -EMSGSIZE past the cap, -ENOMEM. */
int syncmsg_inbox_add(struct syncmsg_inbox *in, uint8_t type, const uint8_t *p, size_t n);
void syncmsg_inbox_done(struct syncmsg_inbox *in);

/* Outgoing messages, fragmented as the stream's window allows. */
struct syncmsg_outmsg;
struct syncmsg_outbox {
	struct syncmsg_outmsg *head, *tail;
	size_t queued; /* bytes not yet handed to chan */
};
void syncmsg_outbox_init(struct syncmsg_outbox *ob);
void syncmsg_outbox_clear(struct syncmsg_outbox *ob);
/* Queue a message; takes ownership of data (mem_alloc'd) in every case. */
int syncmsg_outbox_push(struct syncmsg_outbox *ob, uint8_t type, uint8_t *data, size_t n);
/* Queue a copy of b's readable bytes. */
int syncmsg_outbox_push_buf(struct syncmsg_outbox *ob, uint8_t type, const struct buf *b);
/* Send as much as the chan takes now. 0 (all sent or waiting for
 * on_writable), or a chan_send error other than -EAGAIN. */
int syncmsg_outbox_flush(struct syncmsg_outbox *ob, struct chan *c, uint32_t stream);

#endif
