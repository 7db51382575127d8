/* SPDX-License-Identifier: Apache-2.0 */
/* The guest-connection options of ping, sync and up: guestopt_i.h. */
#include <errno.h>
#include <getopt.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/buf.h"
#include "airlock/core/keys.h"
#include "airlock/core/wire.h"
#include "cmd_i.h"
#include "guestopt_i.h"

void guest_opts_init(struct guest_opts *g, const char *cmd, uint64_t timeout_s)
{
	memset(g, 0, sizeof(*g));
	g->cmd = cmd;
	g->timeout_s = timeout_s;
	g->psk_status = 2;
}

int cmd_parse_u64(const char *s, uint64_t *v)
{
	char *end;
	errno = 0;
	unsigned long long x = strtoull(s, &end, 10);
	if (errno || end == s)
		return -EINVAL;
	switch (*end) {
	case 'k':
	case 'K':
		x <<= 10;
		end++;
		break;
	case 'm':
	case 'M':
		x <<= 20;
		end++;
		break;
	case 'g':
	case 'G':
		x <<= 30;
		end++;
		break;
	default:
		break;
	}
	if (*end)
		return -EINVAL;
	*v = x;
	return 0;
}

int guest_opts_parse(struct guest_opts *g, int c, const char *arg)
{
	switch (c) {
	case GUEST_OPT_GUEST:
		g->guest = arg;
		return 1;
	case GUEST_OPT_KEY:
		g->keyfile = arg;
		return 1;
	case GUEST_OPT_GUEST_KEY:
		g->guest_key = arg;
		return 1;
	case GUEST_OPT_PSK_FILE:
		g->psk_file = arg;
		return 1;
	case GUEST_OPT_TIMEOUT:
		if (cmd_parse_u64(arg, &g->timeout_s) < 0 || g->timeout_s == 0) {
			cmd_err("%s: --timeout takes seconds > 0", g->cmd);
			return -1;
		}
		return 1;
	default:
		return 0;
	}
}

bool guest_opts_complete(const struct guest_opts *g)
{
	const char *miss = !g->guest	   ? "--guest ADDR"
			   : !g->keyfile   ? "--key FILE"
			   : !g->guest_key ? "--guest-key PUBKEY"
					   : NULL;

	if (miss)
		cmd_err("%s: missing %s (--guest, --key and --guest-key go together)", g->cmd, miss);
	return !miss;
}

int guest_opts_load_peer(struct guest_opts *g)
{
	char err[1024];

	if (transport_parse(g->guest, &g->addr, err, sizeof(err)) < 0) {
		cmd_err("--guest: %s", err);
		return 2;
	}
	if (keys_pub_parse(g->guest_key, g->guest_pub) < 0) {
		cmd_err("--guest-key '%s' is not a public key (44 characters of base64)", g->guest_key);
		return 2;
	}
	return 0;
}

int guest_opts_load_keys(struct guest_opts *g)
{
	char err[1024];

	if (keys_load(g->keyfile, &g->key, err, sizeof(err)) < 0) {
		cmd_err("%s", err);
		return 2;
	}
	if (g->psk_file) {
		if (keys_load_psk(g->psk_file, g->psk, err, sizeof(err)) < 0) {
			cmd_err("%s", err);
			return g->psk_status;
		}
		g->have_psk = true;
	}
	if (keys_signing_key(&g->key, g->sync_sk, g->sync_pk) < 0) {
		cmd_err("out of memory");
		return 1;
	}
	return 0;
}

int guest_opts_load(struct guest_opts *g)
{
	int st;

	if ((st = guest_opts_load_peer(g)) != 0)
		return st;
	return guest_opts_load_keys(g);
}

struct chan_cfg guest_opts_chan_cfg(const struct guest_opts *g)
{
	return (struct chan_cfg){
	    .role = NOISE_INITIATOR, .self = &g->key, .peer = g->guest_pub, .psk = g->have_psk ? g->psk : NULL};
}

void guest_opts_clear(struct guest_opts *g)
{
	sodium_memzero(&g->key, sizeof(g->key));
	sodium_memzero(g->psk, sizeof(g->psk));
	sodium_memzero(g->sync_sk, sizeof(g->sync_sk));
	g->have_psk = false;
}

int guest_hello_send(struct chan *c, const uint8_t sign_pk[32], const char *client)
{
	struct wire_hello m = {.client = (char *)client}; /* the encoder only reads it */
	struct buf b;
	int r;

	memcpy(m.sign_pk, sign_pk, sizeof(m.sign_pk));
	buf_init(&b, 1024);
	if ((r = wire_hello_encode(&b, &m)) == 0)
		r = chan_send(c, WIRE_HELLO, WIRE_STREAM_CONTROL, buf_ptr(&b), buf_len(&b));
	buf_clear(&b);
	return r;
}

const char *guest_hello_ok_why(struct buf *in)
{
	struct wire_hello_ok m;
	int r = wire_hello_ok_decode(in, &m);

	wire_hello_ok_clear(&m);
	if (r == -EPROTO)
		return "guest answered HELLO with an unexpected version";
	return r < 0 ? "guest answered HELLO with a malformed HELLO_OK" : NULL;
}
