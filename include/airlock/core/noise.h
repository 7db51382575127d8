/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_NOISE_H
#define AIRLOCK_NOISE_H

/*
 * noise: the Noise_IKpsk2_25519_ChaChaPoly_SHA256 handshake (WireGuard's
 * pattern), built only from libsodium primitives:
 *   DH     crypto_scalarmult (X25519; an all-zero result, i.e. a low-order
 *          peer point, is refused)
 *   HASH   crypto_hash_sha256, HMAC-SHA256 for HKDF
 *   CIPHER crypto_aead_chacha20poly1305_ietf, 96-bit nonce = 4 zero bytes
 *          then the 64-bit little-endian counter (Noise spec 5.1/12.3)
 *
 *   IKpsk2:
 *     <- s
 *     ...
 *     -> e, es, s, ss
 *     <- e, ee, se, psk
 *
 * The host (airlock) is always the initiator and the guest agent the
 * responder: the host is the side that knows which guest it wants and has
 * its key pinned before connecting (IK needs that), while a guest may
 * accept several hosts (its allow-list) and learns which one from msg1. The
 * initiator's identity is encrypted in msg1, and the handshake takes one
 * round trip.
 *
 * State is caller-owned (struct noise_hs on the stack is fine) and must be
 * wiped with noise_hs_clear() on every path; noise_split() clears it too.
 * Errors are -errno:
 *   -EBADMSG       a message failed authentication (wrong key, wrong psk,
 *                  wrong prologue, tampering)
 *   -EKEYREJECTED  a DH with a peer key gave the all-zero output
 *                  (low-order point)
 *   -EMSGSIZE      a message or output buffer has the wrong size
 *   -EPROTO        called out of order / wrong role
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define NOISE_KEY_LEN  32u
#define NOISE_HASH_LEN 32u
#define NOISE_TAG_LEN  16u
/* msg1 = e (32) + enc(s) (32+16) + enc(payload) (n+16) */
#define NOISE_MSG1_LEN(payload) (32u + 48u + (payload) + 16u)
/* msg2 = e (32) + enc(payload) (n+16) */
#define NOISE_MSG2_LEN(payload) (32u + (payload) + 16u)

enum noise_role { NOISE_INITIATOR = 1, NOISE_RESPONDER = 2 };

struct noise_keypair {
	uint8_t pub[NOISE_KEY_LEN];
	uint8_t priv[NOISE_KEY_LEN];
};

struct noise_hs {
	enum noise_role role;
	int step; /* messages processed so far */
	uint8_t ck[NOISE_HASH_LEN];
	uint8_t h[NOISE_HASH_LEN];
	uint8_t k[NOISE_KEY_LEN];
	uint64_t n;
	bool has_k;
	struct noise_keypair s;	   /* our static */
	struct noise_keypair e;	   /* our ephemeral */
	bool e_fixed;		   /* test vectors: e set by noise_hs_set_ephemeral */
	uint8_t rs[NOISE_KEY_LEN]; /* peer static: pinned (initiator) or learned (responder) */
	uint8_t re[NOISE_KEY_LEN];
	uint8_t psk[NOISE_KEY_LEN];
};

/* Derive the public key for a private key (X25519 base point multiply). The
 * private key is used as given (X25519 clamps internally). */
int noise_pubkey(uint8_t pub[NOISE_KEY_LEN], const uint8_t priv[NOISE_KEY_LEN]);

/* Initialise a handshake. `rs` is the responder's static public key and is
 * required for the initiator, ignored for the responder. `psk` NULL means
 * 32 zero bytes. The prologue is mixed into h (Noise 5.3). */
int noise_hs_init(struct noise_hs *hs, enum noise_role role, const void *prologue, size_t prologue_len,
		  const struct noise_keypair *s, const uint8_t *rs, const uint8_t *psk);

/* Test vectors only: use this private key as the ephemeral instead of a
 * random one. Call before the first message. */
void noise_hs_set_ephemeral(struct noise_hs *hs, const uint8_t priv[NOISE_KEY_LEN]);

/* Initiator: write msg1 (-> e, es, s, ss) carrying `payload` into out, which
 * must hold NOISE_MSG1_LEN(plen) bytes; *outlen gets the length. */
int noise_write_msg1(struct noise_hs *hs, const void *payload, size_t plen, uint8_t *out, size_t outcap,
		     size_t *outlen);

/* Responder: read msg1. On success hs->rs holds the initiator's static key
 * (the caller checks it against its allow-list) and the decrypted payload is
 * in payload[0..*plen). -EBADMSG from the `s` decryption means the initiator
 * does not hold our public key (or the prologue differs); *stage tells which
 * AEAD failed: 1 = s, 2 = payload. */
int noise_read_msg1(struct noise_hs *hs, const uint8_t *msg, size_t len, uint8_t *payload, size_t pcap, size_t *plen,
		    int *stage);

/* Responder: write msg2 (<- e, ee, se, psk). */
int noise_write_msg2(struct noise_hs *hs, const void *payload, size_t plen, uint8_t *out, size_t outcap,
		     size_t *outlen);

/* Initiator: read msg2. -EBADMSG here, after the responder accepted msg1,
 * means the pre-shared keys differ (or the message was tampered with). */
int noise_read_msg2(struct noise_hs *hs, const uint8_t *msg, size_t len, uint8_t *payload, size_t pcap, size_t *plen);

/* After both messages: Split() (Noise 5.2). i2r is the initiator->responder
 * key, r2i the other direction, for both roles. Also copies the final
 * handshake hash to hash (may be NULL) and wipes the handshake state. */
int noise_split(struct noise_hs *hs, uint8_t i2r[NOISE_KEY_LEN], uint8_t r2i[NOISE_KEY_LEN],
		uint8_t hash[NOISE_HASH_LEN]);

/* Wipe all secrets in hs. Safe to call twice. */
void noise_hs_clear(struct noise_hs *hs);

/* Noise CipherState EncryptWithAd/DecryptWithAd with an explicit nonce, as
 * used after Split() by the test vectors (airlock's transport itself uses
 * crypto_secretstream keyed with the split keys). out must hold plen+16
 * (encrypt) or clen-16 (decrypt) bytes. */
int noise_encrypt(const uint8_t k[NOISE_KEY_LEN], uint64_t n, const void *ad, size_t adlen, const void *plain,
		  size_t plen, uint8_t *out);
int noise_decrypt(const uint8_t k[NOISE_KEY_LEN], uint64_t n, const void *ad, size_t adlen, const uint8_t *cipher,
		  size_t clen, uint8_t *out);

/* TAI64N timestamp of now (12 bytes: big-endian 2^62+seconds, nanoseconds),
 * the msg1 payload WireGuard uses against replay. */
void noise_tai64n(uint8_t out[12]);

#endif
