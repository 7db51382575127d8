/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_TRUST_H
#define AIRLOCK_TRUST_H

/*
 * trust: the user's approvals of repository policy files (doc/UP.md,
 * "Trust"), in the way direnv (`direnv allow`) and mise (`mise trust`) do
 * it. A workspace's own airlock.json is the repository author's; it is
 * trusted only once the user has approved its exact bytes for that
 * workspace, and any change to the bytes needs a new approval.
 *
 * An approval is one record file per workspace in the user's config
 * directory, $XDG_CONFIG_HOME/airlock/trust/ (~/.config/airlock/trust/
 * without XDG_CONFIG_HOME; directories mode 0700, records 0600, written
 * to a temporary file and renamed into place). The record's name is a
 * BLAKE2b digest of the workspace's realpath; it holds the digest of the
 * approved content (trust_digest: BLAKE2b-256 of a domain string, the
 * workspace's realpath and the exact bytes, so one approval never covers
 * another workspace's file with the same content) and the realpath, for
 * listing. A record that is not ours (owner, mode, symlink, malformed) is
 * never taken as an approval.
 *
 * The policy loader (policy_load_for_workspace) is the caller that
 * decides; `airlock trust` (relay/cli/cmd_trust.c) writes and lists.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TRUST_DIGEST_LEN 32
#define TRUST_RECORD_MAX 8192 /* larger record files are not ours */

/* The digest an approval of content[0..len) for the workspace whose
 * realpath is ws records. */
void trust_digest(const char *ws, const void *content, size_t len, uint8_t out[TRUST_DIGEST_LEN]);

/* The trust store's directory into out. 0, or -ENOENT (neither
 * XDG_CONFIG_HOME nor HOME is set to an absolute path) or -ENAMETOOLONG,
 * with a message in err. Creates nothing. */
int trust_store_dir(char *out, size_t n, char *err, size_t errlen);

/* 1 when the store holds an approval of digest for ws, 0 when it holds
 * none (no store, no record, another digest, a record that is not ours).
 * Never fails: a store it cannot read approves nothing. */
int trust_is_approved(const char *ws, const uint8_t digest[TRUST_DIGEST_LEN]);

/* Record an approval of digest for ws (replacing the earlier one),
 * creating the store directories. 0, or -errno with a message naming the
 * file in err. */
int trust_approve(const char *ws, const uint8_t digest[TRUST_DIGEST_LEN], char *err, size_t errlen);

/* Remove ws's approval. 1 removed, 0 there was none, or -errno with a
 * message in err. */
int trust_revoke(const char *ws, char *err, size_t errlen);

/* Call fn for each well-formed record in the store, in no set order;
 * fn returning non-zero stops the walk with that value. 0 (also with no
 * store), fn's value, or -errno with a message in err. */
typedef int (*trust_each_fn)(const char *ws, const uint8_t digest[TRUST_DIGEST_LEN], void *ud);
int trust_list(trust_each_fn fn, void *ud, char *err, size_t errlen);

#endif
