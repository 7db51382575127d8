/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sandbox_harness WORKSPACE [AGENT]: start the local sandbox for WORKSPACE
 * (sandbox.h) and print how to reach it, one "key value" per line:
 *   dir <state dir>
 *   address <transport address>
 *   hostkey <state dir>/keys/host.key
 *   guest <guest public key>
 *   describe <sandbox_describe>
 *   start_ms <ms>
 * then "ready", and keep it running until stdin closes; then stop it and
 * exit 0. Exits 1 with the error on stderr when the start fails. Lets a
 * test start the sandbox as an ordinary user without the FUSE mount.
 */
#include <stdio.h>
#include <stdlib.h>

#include <sodium.h>

#include "airlock/core/keys.h"
#include "airlock/sandbox/sandbox.h"

int main(int argc, char **argv)
{
	struct sandbox_cfg cfg = {.kind = SANDBOX_LOCAL};
	struct sandbox *sb;
	char err[1024], ws[4096], pub[KEYS_B64_LEN];
	int c;

	if (argc < 2 || argc > 3) {
		fputs("usage: sandbox_harness WORKSPACE [AGENT]\n", stderr);
		return 2;
	}
	if (sodium_init() < 0 || !realpath(argv[1], ws)) {
		perror(argv[1]);
		return 2;
	}
	cfg.workspace = ws;
	cfg.agent_path = argc == 3 ? argv[2] : NULL;
	if (sandbox_start(&cfg, &sb, err, sizeof(err)) < 0) {
		fprintf(stderr, "sandbox_harness: %s\n", err);
		return 1;
	}
	keys_pub_format(sandbox_guest_pub(sb), pub);
	printf("dir %s\naddress %s\nhostkey %s/keys/host.key\nguest %s\ndescribe %s\nstart_ms %.1f\nready\n",
	       sandbox_dir(sb), sandbox_address(sb), sandbox_dir(sb), pub, sandbox_describe(sb), sandbox_start_ms(sb));
	fflush(stdout);
	while ((c = getchar()) != EOF)
		;
	sandbox_stop(sb);
	return 0;
}
