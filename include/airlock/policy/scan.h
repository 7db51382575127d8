/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SCAN_H
#define AIRLOCK_SCAN_H

/*
 * scan: secrets by content. A pure function over bytes that says whether
 * a file holds a credential in one of the well-known shapes (private key
 * blocks, cloud, git host, chat, payment and package registry tokens,
 * JWTs, dotenv-style assignments of secret-looking values), which rule
 * matched and on which line. It never returns or stores the matched
 * value: callers report the rule id and the line only.
 *
 * The rules are a table (fs/policy/scan.c, documented in doc/SECRETS.md
 * "Content rules"). Each rule has a literal anchor; one pass over the
 * bytes looks for anchors through a two-byte prefilter and runs a rule's
 * matcher only where its anchor is, so clean text costs about one table
 * lookup per byte.
 *
 * Callers scan at most SCAN_MAX bytes of a file (the first ones; see
 * doc/SECRETS.md for why a prefix and not the whole file).
 *
 * Thread-safety: no state; any thread.
 */

#include <stddef.h>
#include <stdint.h>

#define SCAN_MAX (8u << 20) /* bytes of a file that are scanned */

struct scan_rule {
	const char *id;	  /* stable name, e.g. "github-pat" (audit, tests) */
	const char *what; /* human description */
	/* literal the match starts with, or contains at a fixed place the
	 * matcher knows (compared case-insensitively when casefold) */
	const char *anchor;
	unsigned char casefold;
	/* The matcher: p[0..n) is the whole buffer and at the offset of the
	 * anchor; returns nonzero when a secret of this shape is there. */
	int (*match)(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at);
	/* for the generic "anchor then token characters" matcher */
	unsigned char charset; /* enum in scan.c */
	unsigned short min, max;
};

struct scan_hit {
	const struct scan_rule *rule; /* the rule that matched (static table) */
	unsigned long line;	      /* 1-based line of the match */
	size_t off;		      /* byte offset of the anchor */
};

/* Scan p[0..n) (any bytes; NULs allowed). Returns 1 and fills *hit with
 * the first match in byte order, 0 when nothing matched. */
int scan_bytes(const void *p, size_t n, struct scan_hit *hit);

/* Tests: on != 0 makes scan_bytes use its portable byte loop instead of
 * the SIMD prefilter (x86-64 with SSSE3), so both can be compared. */
void scan_set_portable(int on);

/* The rule table, for docs and tests. */
const struct scan_rule *scan_rules(size_t *n);

/* Shannon entropy of p[0..n) in bits per byte (0 for n == 0). */
double scan_entropy(const uint8_t *p, size_t n);

#endif
