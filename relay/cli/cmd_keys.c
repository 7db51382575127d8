/* SPDX-License-Identifier: Apache-2.0 */
/* airlock keygen / airlock pubkey: create a static key file, show its public key. */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/keys.h"
#include "cmd_i.h"

/* Print the public key as one line; 1 if stdout could not take it. */
static int print_pub(const uint8_t pub[NOISE_KEY_LEN])
{
	char text[KEYS_B64_LEN];

	keys_pub_format(pub, text);
	if (printf("%s\n", text) < 0 || fflush(stdout) != 0) {
		cmd_err("cannot write the public key to standard output");
		return 1;
	}
	return 0;
}

static void keygen_usage(FILE *f)
{
	fputs("usage: airlock keygen -o FILE\n"
	      "  Write a new private key to FILE (mode 0600; FILE must not exist yet)\n"
	      "  and print its public key.\n",
	      f);
}

int cmd_keygen(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"output", required_argument, NULL, 'o'},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct noise_keypair kp;
	const char *out = NULL;
	char err[512];
	int c, status = 1;

	sodium_memzero(&kp, sizeof(kp));
	optind = 0; /* GNU getopt: full reinitialisation */
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+:o:h", opts, NULL)) != -1) {
		switch (c) {
		case 'o':
			out = optarg;
			break;
		case 'h':
			keygen_usage(stdout);
			return 0;
		case ':':
			cmd_err("keygen: %s needs a FILE argument", argv[optind - 1]);
			keygen_usage(stderr);
			return 2;
		default:
			/* glibc: optopt is the bad short option, 0 for a long one */
			if (optopt)
				cmd_err("keygen: unknown option '-%c'", optopt);
			else
				cmd_err("keygen: unknown option '%s'", argv[optind - 1]);
			keygen_usage(stderr);
			return 2;
		}
	}
	if (!out || optind != argc) {
		if (!out)
			cmd_err("keygen: -o FILE is required");
		else
			cmd_err("keygen: unexpected argument '%s'", argv[optind]);
		keygen_usage(stderr);
		return 2;
	}
	if (keys_generate(&kp) < 0) {
		cmd_err("keygen: cannot generate a key");
		goto out;
	}
	if (keys_save(out, &kp, err, sizeof(err)) < 0) {
		cmd_err("%s", err);
		goto out;
	}
	status = print_pub(kp.pub);
out:
	sodium_memzero(&kp, sizeof(kp));
	return status;
}

static void pubkey_usage(FILE *f)
{
	fputs("usage: airlock pubkey FILE\n"
	      "  Print the public key of the private key in FILE.\n",
	      f);
}

int cmd_pubkey(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	struct noise_keypair kp;
	char err[512];
	int c, status = 1;

	sodium_memzero(&kp, sizeof(kp));
	optind = 0;
	opterr = 0;
	while ((c = getopt_long(argc, argv, "+h", opts, NULL)) != -1) {
		switch (c) {
		case 'h':
			pubkey_usage(stdout);
			return 0;
		default:
			if (optopt)
				cmd_err("pubkey: unknown option '-%c'", optopt);
			else
				cmd_err("pubkey: unknown option '%s'", argv[optind - 1]);
			pubkey_usage(stderr);
			return 2;
		}
	}
	if (argc - optind != 1) {
		cmd_err("pubkey: expected exactly one key file");
		pubkey_usage(stderr);
		return 2;
	}
	if (keys_load(argv[optind], &kp, err, sizeof(err)) < 0) {
		cmd_err("%s", err);
		goto out;
	}
	status = print_pub(kp.pub);
out:
	sodium_memzero(&kp, sizeof(kp));
	return status;
}
