/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_WITHHOLD_H
#define AIRLOCK_WITHHOLD_H

/*
 * withhold: the host engine's decisions about withheld files beyond the
 * policy's name rules (doc/SECRETS.md "Content rules", "Copies, renames
 * and temporaries", "Git configuration beyond .git/config"):
 *
 *   - content: a file the policy would send is scanned (scan.h) and
 *     withheld when a rule matches, or when its content is that of a file
 *     the secret list withholds (copies and renames of .env);
 *   - names that need the disk: a bare repository's config (HEAD,
 *     objects/ and refs/ beside it), the targets of .git/config's
 *     [include]/[includeIf] paths, tool temporaries (sedXXXXXX,
 *     .goutputstream-*, 4913) in a directory that holds a secret.
 *
 * State (kept for the engine's life, bounded): the content hashes of
 * files the secret list withholds (hashed on the host, never sent), the
 * scan verdicts by content hash, the include targets of the last read.
 *
 * Every function takes rootfd, the workspace directory; files are opened
 * beneath it without following symlinks. Errors are -errno.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"
#include "airlock/content/manifest.h"

#define WITHHOLD_COPY_MIN     8u	  /* shorter contents are not matched by hash */
#define WITHHOLD_COPY_MAX     (64u << 20) /* larger secrets are not hashed */
#define WITHHOLD_HASHES_MAX   65536u	  /* withheld contents remembered */
#define WITHHOLD_CACHE_MAX    (1u << 20)  /* scan verdicts remembered (then forgotten, all at once) */
#define WITHHOLD_INCLUDES_MAX 256u	  /* include targets followed */
#define WITHHOLD_RULE_MAX     512u	  /* size of a rule text */

struct withhold;

/* New state for workspace rootfd (not owned); params are the engine's
 * chunking, which the content hashes must agree with. NULL-safe free. */
int withhold_new(int rootfd, const struct chunk_params *params, struct withhold **out);
void withhold_free(struct withhold *w);

/* relpath is withheld by the secret list (a file, not a directory):
 * remember its content hash. Symlinks, special files, contents shorter
 * than WITHHOLD_COPY_MIN or longer than WITHHOLD_COPY_MAX are skipped.
 * 0 or -ENOMEM (unreadable files are skipped: 0). */
int withhold_note_secret(struct withhold *w, const char *relpath);

/* The name-level rules that need the disk, for a non-directory the policy
 * would send: 1 with rule filled ("secret: …") when withheld, else 0. */
int withhold_path(struct withhold *w, const char *relpath, char *rule, size_t rulelen);

/* Decide the content of file entry e (its hash, size and chunk list from
 * the scan) before the diff: 1 with rule filled when withheld (same
 * content as a withheld file, or a scan rule matched: "secret content:
 * <id> (<what>) at line N"), 0 when it may be sent, -ESTALE when the file
 * on disk no longer has e's content (changed since the scan: send nothing
 * now), -ENOMEM. The file's first SCAN_MAX bytes are read and checked
 * against e's hash (the whole file up to the chunker's whole_max, each
 * chunk of a larger one), so what is sent under e's hash is what was
 * scanned. With defer, a file of at most whole_max bytes is decided here
 * only from what is known by its hash, else 0: withhold_sent scans its
 * bytes as they are sent (read once for both; the full scan's way). */
int withhold_content(struct withhold *w, const struct manifest_entry *e, bool defer, char *rule, size_t rulelen);

/* The bytes data[0..n) about to be sent as e (the caller checked they
 * hash to e->hash): 1 with rule filled when a content rule matches (do
 * not send), else 0. The verdict is remembered by hash. */
int withhold_sent(struct withhold *w, const struct manifest_entry *e, const uint8_t *data, size_t n, char *rule,
		  size_t rulelen);

/* withhold_sent in two halves, for bytes read and scanned on worker
 * threads (doc/SYNC.md §8 "Preparing files on worker threads"):
 * withhold_judge scans data[0..n) with no engine state (safe on any
 * thread, any number at once) into *j; withhold_judged records that
 * verdict for e (the caller checked the bytes hash to e->hash) on the
 * engine's thread: 1 with rule filled when withheld, else 0.
 * withhold_known: the verdict remembered for that content hash: 1 with
 * rule filled, 0 clean, -ENOENT when not known (scan the bytes). */
struct withhold_judgement {
	bool hit;	/* a content rule matched */
	uint8_t rule;	/* index into scan_rules() */
	uint32_t line;	/* where */
	size_t scanned; /* bytes looked at */
};
void withhold_judge(const uint8_t *data, size_t n, struct withhold_judgement *j);
int withhold_judged(struct withhold *w, const struct manifest_entry *e, const struct withhold_judgement *j, char *rule,
		    size_t rulelen);
int withhold_known(const struct withhold *w, const uint8_t hash[CHUNK_HASH_LEN], char *rule, size_t rulelen);

/* Read .git/config (and what it includes, 10 deep) and remember the
 * include targets inside the workspace. 1 when the set changed since the
 * last call (the caller re-decides the tree), 0 when not, -ENOMEM. */
int withhold_git_includes(struct withhold *w);

/* BLAKE2b-256 of the include targets the last withhold_git_includes
 * found (what a persisted scan's name decisions depended on). */
void withhold_includes_digest(const struct withhold *w, uint8_t out[32]);

/* Counters for tests and benches. */
struct withhold_stats {
	uint64_t scanned, scanned_bytes, cache_hits, by_content, by_copy;
};
const struct withhold_stats *withhold_stats(const struct withhold *w);

#endif
