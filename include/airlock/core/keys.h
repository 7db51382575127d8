/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_KEYS_H
#define AIRLOCK_KEYS_H

/*
 * keys: static key files and the text form of public keys.
 *
 * A key file holds one X25519 private key as standard base64 (44 chars) and
 * a newline, like WireGuard's. It must be a regular file of mode 0600 or
 * stricter; a group- or world-readable key file is refused.
 * A public key's text form is the standard base64 of its 32 bytes.
 *
 * The same file also yields the host's Ed25519 sync-signing key, derived
 * one-way (HMAC-SHA256 keyed by the private key over a fixed label) so that
 * the signing key is used for nothing else and needs no second file.
 *
 * Errors are -errno; the functions taking `err` also write a message
 * naming the file and what is wrong into err[0..errlen).
 */

#include <stddef.h>
#include <stdint.h>

#include "airlock/core/noise.h"

#define KEYS_B64_LEN 45 /* 44 chars + NUL */

/* Fresh random keypair (libsodium randombytes). */
int keys_generate(struct noise_keypair *kp);

/* Write kp->priv to path with mode 0600, refusing to overwrite an existing
 * file (-EEXIST). The file is written to a temp name and renamed. */
int keys_save(const char *path, const struct noise_keypair *kp, char *err, size_t errlen);

/* Read a key file, check its mode and contents, fill kp (priv and pub). */
int keys_load(const char *path, struct noise_keypair *kp, char *err, size_t errlen);

/* Read a pre-shared key file (the same format as a key file: `airlock
 * keygen -o psk` makes one; only its 32 secret bytes are used) into psk.
 * Errors as keys_load, the message prefixed with "--psk-file: ". On error
 * psk is left zeroed. */
int keys_load_psk(const char *path, uint8_t psk[NOISE_KEY_LEN], char *err, size_t errlen);

/* Public key <-> base64 text. keys_pub_parse accepts surrounding white
 * space and rejects anything that is not exactly 32 bytes of base64
 * (-EINVAL). */
void keys_pub_format(const uint8_t pub[NOISE_KEY_LEN], char out[KEYS_B64_LEN]);
int keys_pub_parse(const char *text, uint8_t pub[NOISE_KEY_LEN]);

/* Read an allow-list file: one base64 public key per line; blank lines and
 * lines starting with '#' are skipped. Appends to *keys (mem_realloc'd;
 * caller frees with mem_free) and updates *n. */
int keys_load_allow_file(const char *path, uint8_t (**keys)[NOISE_KEY_LEN], size_t *n, char *err, size_t errlen);

/* The Ed25519 sync-signing keypair derived from a static key. */
int keys_signing_key(const struct noise_keypair *kp, uint8_t sk[64], uint8_t pk[32]);

#endif
