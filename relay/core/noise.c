/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Noise_IKpsk2_25519_ChaChaPoly_SHA256 from libsodium primitives.
 *
 * Section numbers refer to the Noise Protocol Framework, revision 34
 * (https://noiseprotocol.org/noise.html). The SymmetricState and CipherState
 * of the spec live flattened in struct noise_hs: ck, h, k, n, has_k.
 *
 * State rules (what the caller can rely on beyond noise.h):
 *  - -EINVAL, -EPROTO and -EMSGSIZE are detected before anything in hs is
 *    touched, so hs is unchanged and the call may be retried (e.g. with a
 *    bigger output buffer).
 *  - -EBADMSG and -EKEYREJECTED happen half way through a message, when the
 *    state is no longer usable: hs is wiped (noise_hs_clear), and every later
 *    call on it fails with -EPROTO.
 * Nothing here allocates.
 */
#include "airlock/core/noise.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include <sodium.h>

#include "airlock/core/wire.h"

#define NOISE_PROTOCOL_NAME "Noise_IKpsk2_25519_ChaChaPoly_SHA256"
/* Noise 3: no message is longer than 65535 bytes. */
#define NOISE_MAX_MSG	65535u
#define NOISE_NONCE_LEN 12u

_Static_assert(sizeof(NOISE_PROTOCOL_NAME) - 1 > NOISE_HASH_LEN,
	       "protocol name longer than HASHLEN: InitializeSymmetric hashes it");
_Static_assert(sizeof(WIRE_NOISE_NAME) == sizeof(NOISE_PROTOCOL_NAME), "wire.h names the same protocol");
_Static_assert(NOISE_HASH_LEN == crypto_hash_sha256_BYTES, "HASHLEN is SHA-256's");
_Static_assert(NOISE_HASH_LEN == crypto_auth_hmacsha256_BYTES, "HMAC-SHA256 output is HASHLEN");
_Static_assert(NOISE_KEY_LEN == crypto_scalarmult_curve25519_BYTES, "DHLEN is X25519's");
_Static_assert(NOISE_KEY_LEN == crypto_scalarmult_curve25519_SCALARBYTES, "X25519 private key size");
_Static_assert(NOISE_KEY_LEN == crypto_aead_chacha20poly1305_ietf_KEYBYTES, "cipher key size");
_Static_assert(NOISE_TAG_LEN == crypto_aead_chacha20poly1305_ietf_ABYTES, "AEAD tag size");
_Static_assert(NOISE_NONCE_LEN == crypto_aead_chacha20poly1305_ietf_NPUBBYTES, "96-bit nonce");
_Static_assert(NOISE_MSG1_LEN(0) == 96u && NOISE_MSG2_LEN(0) == 48u, "IK message sizes");

/* ---- primitives (Noise 4) ---- */

/* Noise 4.1 DH(). X25519 of a peer point of small order gives the all-zero
 * output; libsodium reports it (and rejects small-order inputs outright) with
 * -1. We also test the output ourselves, so the check does not depend on the
 * libsodium build. */
static int dh(uint8_t out[NOISE_KEY_LEN], const uint8_t priv[NOISE_KEY_LEN], const uint8_t pub[NOISE_KEY_LEN])
{
	if (crypto_scalarmult(out, priv, pub) != 0 || sodium_is_zero(out, NOISE_KEY_LEN)) {
		sodium_memzero(out, NOISE_KEY_LEN);
		return -EKEYREJECTED;
	}
	return 0;
}

/* Noise 5.1: the ChaChaPoly nonce is 32 bits of zeros followed by the 64-bit
 * counter n, little-endian (section 12.3). */
static void make_nonce(uint8_t nonce[NOISE_NONCE_LEN], uint64_t n)
{
	memset(nonce, 0, 4);
	for (unsigned i = 0; i < 8; i++)
		nonce[4 + i] = (uint8_t)(n >> (8 * i));
}

/* Noise 4.3 HMAC-HASH() with HASH = SHA-256. */
static void hmac(uint8_t out[NOISE_HASH_LEN], const uint8_t key[NOISE_HASH_LEN], const uint8_t *a, size_t alen,
		 const uint8_t *b, size_t blen)
{
	crypto_auth_hmacsha256_state st;

	crypto_auth_hmacsha256_init(&st, key, NOISE_HASH_LEN);
	if (alen)
		crypto_auth_hmacsha256_update(&st, a, alen);
	if (blen)
		crypto_auth_hmacsha256_update(&st, b, blen);
	crypto_auth_hmacsha256_final(&st, out);
	sodium_memzero(&st, sizeof(st));
}

/* Noise 4.3 HKDF(chaining_key, input_key_material, num_outputs) with 2 or 3
 * outputs (out3 NULL for 2):
 *   temp_key = HMAC-HASH(chaining_key, input_key_material)
 *   output1  = HMAC-HASH(temp_key, byte(0x01))
 *   output2  = HMAC-HASH(temp_key, output1 || byte(0x02))
 *   output3  = HMAC-HASH(temp_key, output2 || byte(0x03))
 * The outputs may alias ck. */
static void hkdf(uint8_t out1[NOISE_HASH_LEN], uint8_t out2[NOISE_HASH_LEN], uint8_t out3[NOISE_HASH_LEN],
		 const uint8_t ck[NOISE_HASH_LEN], const uint8_t *ikm, size_t ikm_len)
{
	static const uint8_t one = 0x01, two = 0x02, three = 0x03;
	uint8_t temp_key[NOISE_HASH_LEN], o1[NOISE_HASH_LEN], o2[NOISE_HASH_LEN], o3[NOISE_HASH_LEN];

	hmac(temp_key, ck, ikm, ikm_len, NULL, 0);
	hmac(o1, temp_key, &one, 1, NULL, 0);
	hmac(o2, temp_key, o1, sizeof(o1), &two, 1);
	if (out3)
		hmac(o3, temp_key, o2, sizeof(o2), &three, 1);
	memcpy(out1, o1, sizeof(o1));
	memcpy(out2, o2, sizeof(o2));
	if (out3)
		memcpy(out3, o3, sizeof(o3));
	sodium_memzero(temp_key, sizeof(temp_key));
	sodium_memzero(o1, sizeof(o1));
	sodium_memzero(o2, sizeof(o2));
	sodium_memzero(o3, sizeof(o3));
}

/* ---- SymmetricState (Noise 5.2) ---- */

/* MixHash(data): h = HASH(h || data). */
static void mix_hash(struct noise_hs *hs, const void *data, size_t len)
{
	crypto_hash_sha256_state st;

	crypto_hash_sha256_init(&st);
	crypto_hash_sha256_update(&st, hs->h, sizeof(hs->h));
	if (len)
		crypto_hash_sha256_update(&st, data, len);
	crypto_hash_sha256_final(&st, hs->h);
	sodium_memzero(&st, sizeof(st));
}

/* MixKey(input_key_material): ck, temp_k = HKDF(ck, ikm, 2), then
 * InitializeKey(temp_k) (HASHLEN is 32, so no truncation). */
static void mix_key(struct noise_hs *hs, const uint8_t *ikm, size_t len)
{
	hkdf(hs->ck, hs->k, NULL, hs->ck, ikm, len);
	hs->n = 0;
	hs->has_k = true;
}

/* MixKeyAndHash(input_key_material): ck, temp_h, temp_k = HKDF(ck, ikm, 3);
 * MixHash(temp_h); InitializeKey(temp_k). */
static void mix_key_and_hash(struct noise_hs *hs, const uint8_t *ikm, size_t len)
{
	uint8_t temp_h[NOISE_HASH_LEN];

	hkdf(hs->ck, temp_h, hs->k, hs->ck, ikm, len);
	mix_hash(hs, temp_h, sizeof(temp_h));
	hs->n = 0;
	hs->has_k = true;
	sodium_memzero(temp_h, sizeof(temp_h));
}

/* EncryptAndHash(plaintext): ciphertext = EncryptWithAd(h, plaintext);
 * MixHash(ciphertext). Every call site in IKpsk2 runs after a MixKey, so k
 * is always set here (the k-empty pass-through of the spec never happens). */
static int encrypt_and_hash(struct noise_hs *hs, const void *plain, size_t plen, uint8_t *out)
{
	int r;

	if (!hs->has_k)
		return -EPROTO;
	if ((r = noise_encrypt(hs->k, hs->n, hs->h, sizeof(hs->h), plain, plen, out)) < 0)
		return r;
	hs->n++;
	mix_hash(hs, out, plen + NOISE_TAG_LEN);
	return 0;
}

/* DecryptAndHash(ciphertext): plaintext = DecryptWithAd(h, ciphertext);
 * MixHash(ciphertext). */
static int decrypt_and_hash(struct noise_hs *hs, const uint8_t *cipher, size_t clen, uint8_t *out)
{
	int r;

	if (!hs->has_k)
		return -EPROTO;
	if ((r = noise_decrypt(hs->k, hs->n, hs->h, sizeof(hs->h), cipher, clen, out)) < 0)
		return r;
	hs->n++;
	mix_hash(hs, cipher, clen);
	return 0;
}

/* ---- public API ---- */

int noise_pubkey(uint8_t pub[NOISE_KEY_LEN], const uint8_t priv[NOISE_KEY_LEN])
{
	if (crypto_scalarmult_base(pub, priv) != 0)
		return -EINVAL;
	return 0;
}

void noise_hs_clear(struct noise_hs *hs)
{
	if (hs)
		sodium_memzero(hs, sizeof(*hs));
}

int noise_hs_init(struct noise_hs *hs, enum noise_role role, const void *prologue, size_t prologue_len,
		  const struct noise_keypair *s, const uint8_t *rs, const uint8_t *psk)
{
	if (!hs || !s || (role != NOISE_INITIATOR && role != NOISE_RESPONDER) || (role == NOISE_INITIATOR && !rs) ||
	    (prologue_len && !prologue))
		return -EINVAL;

	noise_hs_clear(hs);
	hs->role = role;
	hs->step = 0;
	memcpy(hs->s.priv, s->priv, NOISE_KEY_LEN);
	/* The public half is derived, not trusted from the caller: a keypair
	 * whose halves disagree would fail every handshake mysteriously. */
	if (noise_pubkey(hs->s.pub, hs->s.priv) < 0) {
		noise_hs_clear(hs);
		return -EINVAL;
	}
	if (role == NOISE_INITIATOR)
		memcpy(hs->rs, rs, NOISE_KEY_LEN);
	if (psk)
		memcpy(hs->psk, psk, NOISE_KEY_LEN); /* else 32 zero bytes, from the clear above */

	/* Noise 5.2 InitializeSymmetric(protocol_name): the name is longer
	 * than HASHLEN, so h = HASH(protocol_name); ck = h; k empty, n = 0. */
	crypto_hash_sha256(hs->h, (const uint8_t *)NOISE_PROTOCOL_NAME, sizeof(NOISE_PROTOCOL_NAME) - 1);
	memcpy(hs->ck, hs->h, NOISE_HASH_LEN);
	hs->has_k = false;
	hs->n = 0;

	/* Noise 5.3 Initialize(): MixHash(prologue). */
	mix_hash(hs, prologue, prologue_len);

	/* Noise 5.3 Initialize(), pre-message pattern "<- s": both sides MixHash the
	 * responder's static public key. (A pre-message "s" is not an "e", so
	 * the psk rule of 9.2 does not add a MixKey here.) */
	mix_hash(hs, role == NOISE_INITIATOR ? hs->rs : hs->s.pub, NOISE_KEY_LEN);
	return 0;
}

void noise_hs_set_ephemeral(struct noise_hs *hs, const uint8_t priv[NOISE_KEY_LEN])
{
	memcpy(hs->e.priv, priv, NOISE_KEY_LEN);
	hs->e_fixed = true;
}

/* Noise 5.3 WriteMessage "e" token: GENERATE_KEYPAIR() (unless a test fixed
 * it), append e.public_key, MixHash(e.public_key); Noise 9.2: in a PSK
 * handshake also MixKey(e.public_key). */
static int token_e_write(struct noise_hs *hs, uint8_t out[NOISE_KEY_LEN])
{
	if (!hs->e_fixed)
		randombytes_buf(hs->e.priv, NOISE_KEY_LEN);
	if (noise_pubkey(hs->e.pub, hs->e.priv) < 0)
		return -EINVAL;
	memcpy(out, hs->e.pub, NOISE_KEY_LEN);
	mix_hash(hs, hs->e.pub, NOISE_KEY_LEN);
	mix_key(hs, hs->e.pub, NOISE_KEY_LEN);
	return 0;
}

/* Noise 5.3 ReadMessage "e" token: re = the next DHLEN bytes,
 * MixHash(re); Noise 9.2: in a PSK handshake also MixKey(re). */
static void token_e_read(struct noise_hs *hs, const uint8_t in[NOISE_KEY_LEN])
{
	memcpy(hs->re, in, NOISE_KEY_LEN);
	mix_hash(hs, hs->re, NOISE_KEY_LEN);
	mix_key(hs, hs->re, NOISE_KEY_LEN);
}

/* Noise 5.3 "ee"/"es"/"se"/"ss" tokens: MixKey(DH(priv, pub)). */
static int token_dh(struct noise_hs *hs, const uint8_t priv[NOISE_KEY_LEN], const uint8_t pub[NOISE_KEY_LEN])
{
	uint8_t shared[NOISE_KEY_LEN];
	int r;

	if ((r = dh(shared, priv, pub)) < 0)
		goto out;
	mix_key(hs, shared, sizeof(shared));
out:
	sodium_memzero(shared, sizeof(shared));
	return r;
}

int noise_write_msg1(struct noise_hs *hs, const void *payload, size_t plen, uint8_t *out, size_t outcap, size_t *outlen)
{
	int r;

	if (!hs || !out || (plen && !payload))
		return -EINVAL;
	if (hs->role != NOISE_INITIATOR || hs->step != 0)
		return -EPROTO;
	if (plen > NOISE_MAX_MSG - NOISE_MSG1_LEN(0) || outcap < NOISE_MSG1_LEN(plen))
		return -EMSGSIZE;

	/* Noise: -> e, es, s, ss (then the payload) */
	uint8_t *p = out;
	if ((r = token_e_write(hs, p)) < 0)
		goto out;
	p += NOISE_KEY_LEN;
	/* es: the initiator's ephemeral with the responder's static */
	if ((r = token_dh(hs, hs->e.priv, hs->rs)) < 0)
		goto out;
	/* s: EncryptAndHash(s.public_key) */
	if ((r = encrypt_and_hash(hs, hs->s.pub, NOISE_KEY_LEN, p)) < 0)
		goto out;
	p += NOISE_KEY_LEN + NOISE_TAG_LEN;
	/* ss */
	if ((r = token_dh(hs, hs->s.priv, hs->rs)) < 0)
		goto out;
	/* payload: EncryptAndHash(payload) */
	if ((r = encrypt_and_hash(hs, payload, plen, p)) < 0)
		goto out;
	p += plen + NOISE_TAG_LEN;

	hs->step = 1;
	if (outlen)
		*outlen = (size_t)(p - out);
out:
	if (r < 0) {
		noise_hs_clear(hs);
		sodium_memzero(out, NOISE_MSG1_LEN(plen));
	}
	return r;
}

int noise_read_msg1(struct noise_hs *hs, const uint8_t *msg, size_t len, uint8_t *payload, size_t pcap, size_t *plen,
		    int *stage)
{
	int r;

	if (stage)
		*stage = 0;
	if (!hs || !msg)
		return -EINVAL;
	if (hs->role != NOISE_RESPONDER || hs->step != 0)
		return -EPROTO;
	if (len < NOISE_MSG1_LEN(0) || len > NOISE_MAX_MSG || len - NOISE_MSG1_LEN(0) > pcap)
		return -EMSGSIZE;
	size_t n = len - NOISE_MSG1_LEN(0);
	if (n && !payload)
		return -EINVAL;

	/* Noise: -> e, es, s, ss (then the payload), read by the responder */
	const uint8_t *p = msg;
	token_e_read(hs, p);
	p += NOISE_KEY_LEN;
	/* es: our static with the initiator's ephemeral, which is where a
	 * low-order ephemeral is caught */
	if ((r = token_dh(hs, hs->s.priv, hs->re)) < 0)
		goto out;
	/* s: DecryptAndHash(the initiator's static). Fails when the initiator
	 * pinned another responder key or used another prologue. */
	if (stage)
		*stage = 1;
	if ((r = decrypt_and_hash(hs, p, NOISE_KEY_LEN + NOISE_TAG_LEN, hs->rs)) < 0)
		goto out;
	p += NOISE_KEY_LEN + NOISE_TAG_LEN;
	/* ss */
	if (stage)
		*stage = 0;
	if ((r = token_dh(hs, hs->s.priv, hs->rs)) < 0)
		goto out;
	/* payload: DecryptAndHash(payload) */
	if (stage)
		*stage = 2;
	if ((r = decrypt_and_hash(hs, p, n + NOISE_TAG_LEN, payload)) < 0)
		goto out;

	if (stage)
		*stage = 0;
	hs->step = 1;
	if (plen)
		*plen = n;
out:
	if (r < 0) {
		noise_hs_clear(hs);
		if (n)
			sodium_memzero(payload, n);
	}
	return r;
}

int noise_write_msg2(struct noise_hs *hs, const void *payload, size_t plen, uint8_t *out, size_t outcap, size_t *outlen)
{
	int r;

	if (!hs || !out || (plen && !payload))
		return -EINVAL;
	if (hs->role != NOISE_RESPONDER || hs->step != 1)
		return -EPROTO;
	if (plen > NOISE_MAX_MSG - NOISE_MSG2_LEN(0) || outcap < NOISE_MSG2_LEN(plen))
		return -EMSGSIZE;

	/* Noise: <- e, ee, se, psk (then the payload) */
	uint8_t *p = out;
	if ((r = token_e_write(hs, p)) < 0)
		goto out;
	p += NOISE_KEY_LEN;
	/* ee */
	if ((r = token_dh(hs, hs->e.priv, hs->re)) < 0)
		goto out;
	/* se: the initiator's static with our ephemeral */
	if ((r = token_dh(hs, hs->e.priv, hs->rs)) < 0)
		goto out;
	/* psk: MixKeyAndHash(psk) */
	mix_key_and_hash(hs, hs->psk, NOISE_KEY_LEN);
	/* payload: EncryptAndHash(payload) */
	if ((r = encrypt_and_hash(hs, payload, plen, p)) < 0)
		goto out;
	p += plen + NOISE_TAG_LEN;

	hs->step = 2;
	if (outlen)
		*outlen = (size_t)(p - out);
out:
	if (r < 0) {
		noise_hs_clear(hs);
		sodium_memzero(out, NOISE_MSG2_LEN(plen));
	}
	return r;
}

int noise_read_msg2(struct noise_hs *hs, const uint8_t *msg, size_t len, uint8_t *payload, size_t pcap, size_t *plen)
{
	int r;

	if (!hs || !msg)
		return -EINVAL;
	if (hs->role != NOISE_INITIATOR || hs->step != 1)
		return -EPROTO;
	if (len < NOISE_MSG2_LEN(0) || len > NOISE_MAX_MSG || len - NOISE_MSG2_LEN(0) > pcap)
		return -EMSGSIZE;
	size_t n = len - NOISE_MSG2_LEN(0);
	if (n && !payload)
		return -EINVAL;

	/* Noise: <- e, ee, se, psk (then the payload), read by the initiator */
	const uint8_t *p = msg;
	token_e_read(hs, p);
	p += NOISE_KEY_LEN;
	/* ee */
	if ((r = token_dh(hs, hs->e.priv, hs->re)) < 0)
		goto out;
	/* se: our static with the responder's ephemeral */
	if ((r = token_dh(hs, hs->s.priv, hs->re)) < 0)
		goto out;
	/* psk: MixKeyAndHash(psk) */
	mix_key_and_hash(hs, hs->psk, NOISE_KEY_LEN);
	/* payload: DecryptAndHash(payload); the first AEAD keyed with the psk,
	 * so a psk mismatch shows up here */
	if ((r = decrypt_and_hash(hs, p, n + NOISE_TAG_LEN, payload)) < 0)
		goto out;

	hs->step = 2;
	if (plen)
		*plen = n;
out:
	if (r < 0) {
		noise_hs_clear(hs);
		if (n)
			sodium_memzero(payload, n);
	}
	return r;
}

int noise_split(struct noise_hs *hs, uint8_t i2r[NOISE_KEY_LEN], uint8_t r2i[NOISE_KEY_LEN],
		uint8_t hash[NOISE_HASH_LEN])
{
	if (!hs || !i2r || !r2i)
		return -EINVAL;
	if ((hs->role != NOISE_INITIATOR && hs->role != NOISE_RESPONDER) || hs->step != 2)
		return -EPROTO;

	/* Noise 5.2 Split(): temp_k1, temp_k2 = HKDF(ck, zerolen, 2); c1 is
	 * the initiator's sending key, c2 the responder's. */
	hkdf(i2r, r2i, NULL, hs->ck, NULL, 0);
	/* Noise 5.2 GetHandshakeHash() */
	if (hash)
		memcpy(hash, hs->h, NOISE_HASH_LEN);
	noise_hs_clear(hs);
	return 0;
}

int noise_encrypt(const uint8_t k[NOISE_KEY_LEN], uint64_t n, const void *ad, size_t adlen, const void *plain,
		  size_t plen, uint8_t *out)
{
	uint8_t nonce[NOISE_NONCE_LEN];

	/* Noise 5.1: n = 2^64-1 is reserved; using it is an error. */
	if (n == UINT64_MAX)
		return -EOVERFLOW;
	if (plen > NOISE_MAX_MSG - NOISE_TAG_LEN)
		return -EMSGSIZE;
	make_nonce(nonce, n);
	/* Noise 5.1 EncryptWithAd(ad, plaintext) = ENCRYPT(k, n, ad, plaintext) */
	crypto_aead_chacha20poly1305_ietf_encrypt(out, NULL, plain, plen, ad, adlen, NULL, nonce, k);
	return 0;
}

int noise_decrypt(const uint8_t k[NOISE_KEY_LEN], uint64_t n, const void *ad, size_t adlen, const uint8_t *cipher,
		  size_t clen, uint8_t *out)
{
	uint8_t nonce[NOISE_NONCE_LEN];

	if (n == UINT64_MAX)
		return -EOVERFLOW;
	if (clen < NOISE_TAG_LEN || clen > NOISE_MAX_MSG)
		return -EMSGSIZE;
	make_nonce(nonce, n);
	/* Noise 5.1 DecryptWithAd(ad, ciphertext) = DECRYPT(k, n, ad, ciphertext);
	 * libsodium checks the tag before writing any plaintext. */
	if (crypto_aead_chacha20poly1305_ietf_decrypt(out, NULL, NULL, cipher, clen, ad, adlen, nonce, k) != 0)
		return -EBADMSG;
	return 0;
}

void noise_tai64n(uint8_t out[12])
{
	struct timespec ts;
	uint64_t sec;
	uint32_t nsec;

	if (clock_gettime(CLOCK_REALTIME, &ts) != 0) {
		/* cannot fail for CLOCK_REALTIME; a zero stamp is older than any
		 * real one, so the peer refuses it as a replay */
		ts.tv_sec = 0;
		ts.tv_nsec = 0;
	}
	/* TAI64 label: 2^62 + seconds since the epoch, then TAI64N's
	 * nanoseconds, both big-endian. */
	sec = (UINT64_C(1) << 62) + (uint64_t)ts.tv_sec;
	nsec = (uint32_t)ts.tv_nsec;
	for (unsigned i = 0; i < 8; i++)
		out[i] = (uint8_t)(sec >> (56 - 8 * i));
	for (unsigned i = 0; i < 4; i++)
		out[8 + i] = (uint8_t)(nsec >> (24 - 8 * i));
}
