/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_TESTUTIL_H
#define AIRLOCK_TESTUTIL_H

/*
 * testutil: what the unit tests (tests/unit/<layer>/test_<module>.c)
 * would otherwise each write again. Every function fails the running
 * cmocka test on a setup error (include <cmocka.h> before this header);
 * none of them is under test.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "airlock/core/noise.h"

struct chan;
struct chan_ops;
struct chan_peers;
struct loop;
struct tunnel;
struct tunnel_ops;

/* ---- files ---- */

/* A private directory /tmp/airlock-<name>.XXXXXX, its path in out. */
void tu_tmpdir(char *out, size_t n, const char *name);

/* Remove path and everything below it, never following a link; read-only
 * directories are made writable first. A missing path is no error. */
void tu_rm_rf(const char *path);

/* Create or truncate path (relative to dfd, or AT_FDCWD) without
 * following a link, write the n bytes and give it mode. */
void tu_put_file(int dfd, const char *path, const void *data, size_t n, mode_t mode);

/* The whole of path (relative to dfd), malloc'd with a NUL after the
 * last byte (so text compares as a string), *n its size (n may be NULL).
 * NULL when the file cannot be opened. */
char *tu_read_file(int dfd, const char *path, size_t *n);

/* ---- deterministic data ---- */

/* n pseudo-random bytes from seed (xorshift32): the same seed gives the
 * same bytes. */
void tu_fill(uint8_t *p, size_t n, uint32_t seed);

/* A pseudo-random number below n (xorshift64) from *state, which must
 * not be 0. */
uint32_t tu_rand(uint64_t *state, uint32_t n);

/* ---- the loop ---- */

/* Run l until pred(ud) holds (checked before every sleep) or ms pass;
 * pred NULL runs for ms. Returns whether pred holds. */
bool tu_run_until(struct loop *l, bool (*pred)(void *ud), void *ud, unsigned ms);

/* ---- a host and a guest chan ---- */

/* Two chans on one loop over a socketpair, the host the Noise initiator
 * and the guest the responder, each with fresh keys; tu_chans_new returns
 * once both are ready. The chans are the caller's once made: a test whose
 * on_close frees one sets its pointer here to NULL. */
struct tu_chans {
	struct loop *l; /* owned */
	struct noise_keypair hk, gk;
	struct chan_peers *peers; /* owned: the guest's allowed hosts */
	struct chan *h, *g;
};

/* window 0 takes chan's default. */
void tu_chans_new(struct tu_chans *t, uint32_t window, const struct chan_ops *hops, void *hud,
		  const struct chan_ops *gops, void *gud);
/* Free the chans still set, the peers and the loop. */
void tu_chans_free(struct tu_chans *t);

/* A chan on_close that fails the test: for chans that must stay up. */
void tu_chan_close_fails(struct chan *c, int err, const char *why, void *ud);

/* ---- the two ends of a tunnel (tunnel.h) ---- */

/* A tunnel the test made: tu_tunnel_ops' on_done (ud: this struct)
 * records the CLOSE codes and frees it. */
struct tu_tunnel {
	struct tunnel *t; /* NULL once done */
	bool done;
	uint8_t close_sent, close_rcvd;
};
extern const struct tunnel_ops tu_tunnel_ops;

/* The test's end of a socket (the command's connection, or the proxy's
 * side), read by the loop into in[] (NUL-terminated) until EOF or an
 * error (then reset is set). */
struct tu_end {
	struct loop *l;
	int fd;		  /* -1 once closed */
	bool reg;	  /* registered with the loop */
	bool eof, reset;  /* the peer's EOF came; it was an error (a reset) */
	bool shut_on_eof; /* answer the peer's EOF with ours at once */
	char in[8192];
	size_t nin;
};
/* Start reading fd (owned by e from now on). */
void tu_end_watch(struct loop *l, struct tu_end *e, int fd);
/* Stop reading and close (a no-op when closed or never watched: a
 * zeroed struct). */
void tu_end_close(struct tu_end *e);

#endif
