/* SPDX-License-Identifier: Apache-2.0 */
/*
 * syncmsg: scope, delta caps, sync message reassembly and fragmentation,
 * shared by the host's engine and the guest's (syncmsg.h).
 */
#include "airlock/content/syncmsg.h"

#include <errno.h>
#include <string.h>

#include <sodium.h>

#include "airlock/content/chunk.h"
#include "airlock/core/chan.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"

const struct delta_caps syncmsg_delta_caps = {
    .max_batch = WIRE_SYNC_MSG_MAX,
    .max_ops = 65536,
    .max_chunks = 262144,
    .max_chunk = CHUNK_SIZE_LIMIT,
    .max_file = 1ull << 40,
};

void syncmsg_scope(const uint8_t guest_pub[32], const uint8_t host_sign_pk[32], uint8_t scope[DELTA_SCOPE_LEN])
{
	static const char label[] = "airlock sync scope v1";
	crypto_hash_sha256_state st;

	_Static_assert(DELTA_SCOPE_LEN == crypto_hash_sha256_BYTES, "scope is one SHA-256");
	crypto_hash_sha256_init(&st);
	crypto_hash_sha256_update(&st, (const uint8_t *)label, sizeof(label) - 1);
	crypto_hash_sha256_update(&st, guest_pub, 32);
	crypto_hash_sha256_update(&st, host_sign_pk, 32);
	crypto_hash_sha256_final(&st, scope);
}

void syncmsg_inbox_init(struct syncmsg_inbox *in)
{
	in->type = 0;
	buf_init(&in->b, WIRE_SYNC_MSG_MAX);
}

void syncmsg_inbox_clear(struct syncmsg_inbox *in)
{
	in->type = 0;
	buf_clear(&in->b);
}

void syncmsg_inbox_done(struct syncmsg_inbox *in)
{
	in->type = 0;
	/* keep small buffers for reuse, give big ones (a batch) back */
	if (in->b.cap > (1u << 20))
		buf_clear(&in->b);
	else
		buf_reset(&in->b);
}

int syncmsg_inbox_add(struct syncmsg_inbox *in, uint8_t type, const uint8_t *p, size_t n)
{
	int r;

	if (n < 1 || (p[0] & ~WIRE_SYNC_MORE) != 0)
		return -EBADMSG;
	if (in->type && in->type != type)
		return -EBADMSG;
	if (n - 1 > WIRE_SYNC_MSG_MAX - buf_len(&in->b))
		return -EMSGSIZE;
	if ((r = buf_put(&in->b, p + 1, n - 1)) < 0)
		return r == -ENOBUFS ? -EMSGSIZE : r;
	if (p[0] & WIRE_SYNC_MORE) {
		in->type = type;
		return 0;
	}
	in->type = type;
	return 1;
}

struct syncmsg_outmsg {
	struct syncmsg_outmsg *next;
	uint8_t type;
	uint8_t *data;
	size_t n, off;
};

void syncmsg_outbox_init(struct syncmsg_outbox *ob)
{
	ob->head = ob->tail = NULL;
	ob->queued = 0;
}

void syncmsg_outbox_clear(struct syncmsg_outbox *ob)
{
	while (ob->head) {
		struct syncmsg_outmsg *m = ob->head;
		ob->head = m->next;
		mem_free(m->data);
		mem_free(m);
	}
	ob->tail = NULL;
	ob->queued = 0;
}

int syncmsg_outbox_push(struct syncmsg_outbox *ob, uint8_t type, uint8_t *data, size_t n)
{
	struct syncmsg_outmsg *m = mem_calloc(1, sizeof(*m));

	if (!m) {
		mem_free(data);
		return -ENOMEM;
	}
	m->type = type;
	m->data = data;
	m->n = n;
	if (ob->tail)
		ob->tail->next = m;
	else
		ob->head = m;
	ob->tail = m;
	ob->queued += n;
	return 0;
}

int syncmsg_outbox_push_buf(struct syncmsg_outbox *ob, uint8_t type, const struct buf *b)
{
	size_t n = buf_len(b);
	uint8_t *d = mem_alloc(n ? n : 1);

	if (!d)
		return -ENOMEM;
	if (n)
		memcpy(d, buf_ptr(b), n);
	return syncmsg_outbox_push(ob, type, d, n);
}

int syncmsg_outbox_flush(struct syncmsg_outbox *ob, struct chan *c, uint32_t stream)
{
	uint8_t frame[WIRE_PAYLOAD_MAX];

	while (ob->head) {
		struct syncmsg_outmsg *m = ob->head;
		size_t left = m->n - m->off;
		size_t take = left < WIRE_PAYLOAD_MAX - 1 ? left : WIRE_PAYLOAD_MAX - 1;
		frame[0] = take < left ? WIRE_SYNC_MORE : 0;
		if (take)
			memcpy(frame + 1, m->data + m->off, take);
		int r = chan_send(c, m->type, stream, frame, take + 1);
		if (r == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		m->off += take;
		ob->queued -= take;
		if (m->off == m->n) {
			ob->head = m->next;
			if (!ob->head)
				ob->tail = NULL;
			mem_free(m->data);
			mem_free(m);
		}
	}
	return 0;
}
