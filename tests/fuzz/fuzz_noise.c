/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the Noise message readers: msg1 arrives at the guest from anyone
 * who can connect, msg2 at the host from whatever answers. The first input
 * byte picks the side. */
#include <string.h>

#include <sodium.h>

#include "airlock/core/noise.h"
#include "fuzz.h"

static struct noise_keypair host, guest;

static void keys(void)
{
	static int done;
	if (done)
		return;
	if (sodium_init() < 0)
		__builtin_trap();
	memset(host.priv, 0x11, 32);
	memset(guest.priv, 0x22, 32);
	noise_pubkey(host.pub, host.priv);
	noise_pubkey(guest.pub, guest.priv);
	done = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct noise_hs i, r;
	uint8_t payload[512], m1[NOISE_MSG1_LEN(12)], i2r[32], r2i[32];
	size_t plen, m1len;
	int stage;

	keys();
	if (size < 1)
		return 0;
	if (data[0] & 1) {
		/* guest side: read msg1 */
		noise_hs_init(&r, NOISE_RESPONDER, "p", 1, &guest, NULL, NULL);
		if (noise_read_msg1(&r, data + 1, size - 1, payload, sizeof(payload), &plen, &stage) == 0) {
			/* only the host's key can have made a message that authenticates */
			FUZZ_ASSERT(plen == size - 1 - NOISE_MSG1_LEN(0));
			FUZZ_ASSERT(memcmp(r.rs, host.pub, NOISE_KEY_LEN) == 0);
			uint8_t m2[NOISE_MSG2_LEN(0)];
			size_t m2len;
			if (noise_write_msg2(&r, NULL, 0, m2, sizeof(m2), &m2len) == 0)
				noise_split(&r, i2r, r2i, NULL);
		}
		noise_hs_clear(&r);
	} else {
		/* host side: a real msg1 out, then read the fuzzed msg2 */
		noise_hs_init(&i, NOISE_INITIATOR, "p", 1, &host, guest.pub, NULL);
		if (noise_write_msg1(&i, "0123456789ab", 12, m1, sizeof(m1), &m1len) == 0 &&
		    noise_read_msg2(&i, data + 1, size - 1, payload, sizeof(payload), &plen) == 0) {
			/* nobody holds the guest's private key here: no reply can authenticate */
			FUZZ_ASSERT(!"msg2 authenticated without the guest's key");
			noise_split(&i, i2r, r2i, NULL);
		}
		noise_hs_clear(&i);
	}
	return 0;
}

size_t fuzz_seed(unsigned n, const uint8_t **out)
{
	static uint8_t msg[1 + NOISE_MSG1_LEN(12)];
	struct noise_hs i;
	size_t len;

	if (n > 0)
		return 0;
	keys();
	noise_hs_init(&i, NOISE_INITIATOR, "p", 1, &host, guest.pub, NULL);
	msg[0] = 1;
	if (noise_write_msg1(&i, "0123456789ab", 12, msg + 1, sizeof(msg) - 1, &len) < 0)
		len = 0;
	noise_hs_clear(&i);
	*out = msg;
	return len ? len + 1 : 0;
}
