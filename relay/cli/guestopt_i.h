/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_GUESTOPT_I_H
#define AIRLOCK_GUESTOPT_I_H

/*
 * Private to the airlock CLI: the options that name a guest and the keys to
 * reach it, shared by `airlock ping`, `sync` and `up`. A command splices
 * GUEST_OPTS_LONG and GUEST_OPTS_PSK_LONG (and GUEST_OPTS_TIMEOUT_LONG if it
 * takes --timeout) into its getopt_long table, hands every option to guest_opts_parse first, and
 * after parsing calls guest_opts_load (or its two halves, where the command
 * does other checks between them). Messages and exit statuses are the ones
 * each command always had.
 */

#include <stdbool.h>
#include <stdint.h>

#include "airlock/core/chan.h"
#include "airlock/core/noise.h"
#include "airlock/core/transport.h"

/* getopt_long values: above every short option character */
enum {
	GUEST_OPT_GUEST = 0x100,
	GUEST_OPT_KEY,
	GUEST_OPT_GUEST_KEY,
	GUEST_OPT_PSK_FILE,
	GUEST_OPT_TIMEOUT,
};

/* The getopt_long entries, each command placing them where its table
 * always had them (the order shows in getopt's "ambiguous" message). */
#define GUEST_OPTS_LONG                                                                                                \
	{"guest", required_argument, NULL, GUEST_OPT_GUEST}, {"key", required_argument, NULL, GUEST_OPT_KEY},          \
	{                                                                                                              \
		"guest-key", required_argument, NULL, GUEST_OPT_GUEST_KEY                                              \
	}
#define GUEST_OPTS_PSK_LONG                                                                                            \
	{                                                                                                              \
		"psk-file", required_argument, NULL, GUEST_OPT_PSK_FILE                                                \
	}
#define GUEST_OPTS_TIMEOUT_LONG                                                                                        \
	{                                                                                                              \
		"timeout", required_argument, NULL, GUEST_OPT_TIMEOUT                                                  \
	}

struct guest_opts {
	/* parsed: pointers into argv */
	const char *cmd;       /* "ping", "sync": prefixes the --timeout message */
	const char *guest;     /* --guest ADDR; NULL = not given */
	const char *keyfile;   /* --key FILE */
	const char *guest_key; /* --guest-key PUBKEY */
	const char *psk_file;  /* --psk-file FILE; NULL = no pre-shared key */
	uint64_t timeout_s;    /* --timeout S (> 0); the caller sets the default */
	int psk_status;	       /* exit status for an unreadable --psk-file (2; ping has always said 1) */

	/* loaded (guest_opts_load_peer, guest_opts_load_keys); secrets wiped by guest_opts_clear */
	struct transport_addr addr;
	uint8_t guest_pub[32];
	struct noise_keypair key;
	uint8_t psk[32];
	bool have_psk;
	uint8_t sync_sk[64], sync_pk[32]; /* the sync-signing key derived from key (keys.h) */
};

/* Set up g for command cmd ("ping", "sync", "up"): nothing given, the
 * timeout timeout_s, an unreadable psk file exits 2. */
void guest_opts_init(struct guest_opts *g, const char *cmd, uint64_t timeout_s);

/* Take option c (a getopt_long value) with its argument: 1 when it is one
 * of ours, 0 when it is not, -1 when its value is bad (the message is
 * printed; the command exits 2). */
int guest_opts_parse(struct guest_opts *g, int c, const char *arg);

/* --guest, --key and --guest-key were all given; else false after naming
 * the first one missing. */
bool guest_opts_complete(const struct guest_opts *g);

/* Parse --guest into g->addr and --guest-key into g->guest_pub. 0, or the
 * exit status (2) after printing why. */
int guest_opts_load_peer(struct guest_opts *g);

/* Load --key, --psk-file (keys_load_psk) and derive the sync-signing key.
 * 0, or the exit status (2 for a bad file, g->psk_status for the psk, 1
 * when the derivation fails) after printing why. */
int guest_opts_load_keys(struct guest_opts *g);

/* guest_opts_load_peer, then guest_opts_load_keys. */
int guest_opts_load(struct guest_opts *g);

/* The initiator's channel config for the loaded keys (points into g). */
struct chan_cfg guest_opts_chan_cfg(const struct guest_opts *g);

/* Wipe the loaded secrets. */
void guest_opts_clear(struct guest_opts *g);

/* The session's first words (doc/PROTOCOL.md "Session"), the same for
 * every command that talks to a guest. guest_hello_send encodes the
 * host's HELLO (WIRE_VERSION, the sync-signing key, the client's name) and
 * sends it on the control stream: 0 or -errno. guest_hello_ok_why checks
 * the guest's HELLO_OK: NULL when it is ours, else what is wrong with it. */
int guest_hello_send(struct chan *c, const uint8_t sign_pk[32], const char *client);
const char *guest_hello_ok_why(struct buf *in);

/* A byte count or number: decimal, optional suffix k, M or G (powers of
 * 1024). 0 or -EINVAL. */
int cmd_parse_u64(const char *s, uint64_t *v);

#endif
