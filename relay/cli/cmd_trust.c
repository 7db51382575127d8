/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock trust [DIR] | --revoke [DIR] | --list: the user's approval of a
 * workspace's own airlock.json (doc/UP.md "Trust"; policy.h, trust.h).
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <sodium.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "airlock/policy/policy.h"
#include "airlock/policy/trust.h"
#include "cmd_i.h"

static const char usage_text[] =
    "usage: airlock trust [DIR]           approve DIR/airlock.json as it is now\n"
    "       airlock trust --revoke [DIR]  withdraw the approval\n"
    "       airlock trust --list          every approval, and whether it is still current\n";

static int list_one(const char *ws, const uint8_t digest[TRUST_DIGEST_LEN], void *ud)
{
	uint8_t now[TRUST_DIGEST_LEN];
	const char *state;

	(void)ud;
	if (policy_file_state(ws, now) < 0)
		state = "no airlock.json now";
	else if (sodium_memcmp(now, digest, TRUST_DIGEST_LEN) == 0)
		state = "trusted";
	else
		state = "changed since approved (untrusted; review it, then run airlock trust again)";
	printf("%s  %s\n", ws, state);
	return 0;
}

/* Approve dir's airlock.json, and say what that lets it do: the keys an
 * untrusted load leaves out. */
static int approve(const char *dir)
{
	struct policy *p = NULL;
	char err[1024], keys[768] = "";
	int r;

	if ((r = policy_load_for_workspace(dir, NULL, &p, err, sizeof(err))) < 0) {
		cmd_err("trust: %s", err);
		return r == -ENOMEM ? 1 : 2;
	}
	if (policy_trust(p) == POLICY_TRUST_BUILTIN) {
		cmd_err("trust: %s has no %s: nothing to approve", dir, POLICY_FILE_NAME);
		policy_free(p);
		return 2;
	}
	const struct policy_list *ig = policy_ignored(p);
	for (size_t i = 0, o = 0; i < ig->n && o < sizeof(keys); i++)
		o += (size_t)snprintf(keys + o, sizeof(keys) - o, "%s%s", i ? ", " : "", ig->v[i]);
	bool already = policy_trust(p) == POLICY_TRUST_APPROVED;
	char src[PATH_MAX + 32];
	snprintf(src, sizeof(src), "%s", policy_source(p));
	policy_free(p);
	if (already) {
		fprintf(stderr, "airlock: %s is already trusted as it is now\n", src);
		return 0;
	}
	if ((r = policy_trust_set(dir, true, err, sizeof(err))) < 0) {
		cmd_err("trust: %s", err);
		return 1;
	}
	fprintf(stderr, "airlock: trusted %s as it is now%s%s; any change to it needs a new approval\n", src,
		keys[0] ? ", which allows: " : "", keys);
	fprintf(stderr, "airlock: a running airlock up applies it after a restart (airlock down, then airlock up)\n");
	return 0;
}

int cmd_trust(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"revoke", no_argument, NULL, 'r'},
	    {"list", no_argument, NULL, 'l'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	bool revoke = false, list = false;
	char err[1024];
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "", opts, NULL)) != -1) {
		switch (c) {
		case 'r':
			revoke = true;
			break;
		case 'l':
			list = true;
			break;
		case 'h':
			fputs(usage_text, stdout);
			return 0;
		default:
			fputs(usage_text, stderr);
			return 2;
		}
	}
	if (argc - optind > 1 || (list && (revoke || argc - optind))) {
		fputs(usage_text, stderr);
		return 2;
	}
	const char *dir = optind < argc ? argv[optind] : ".";
	if (list) {
		if ((r = trust_list(list_one, NULL, err, sizeof(err))) < 0) {
			cmd_err("trust: %s", err);
			return 1;
		}
		return 0;
	}
	if (!revoke)
		return approve(dir);
	if ((r = policy_trust_set(dir, false, err, sizeof(err))) < 0) {
		cmd_err("trust: %s", err);
		return 1;
	}
	fprintf(stderr, "airlock: %s: %s\n", dir,
		r ? "approval withdrawn; its airlock.json is untrusted again"
		  : "had no approval; its airlock.json is untrusted");
	return 0;
}
