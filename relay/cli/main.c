/* SPDX-License-Identifier: Apache-2.0 */
/* airlock: the host-side command. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "cmd_i.h"

struct command {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *usage;
};

static const struct command commands[] = {
    {"keygen", cmd_keygen, "keygen -o FILE            write a new private key, print its public key"},
    {"pubkey", cmd_pubkey, "pubkey FILE               print the public key of a private key file"},
    {"ping", cmd_ping, "ping --guest ADDR --key FILE --guest-key PUBKEY [-n N] [--bulk BYTES [--concurrent]] ..."},
    {"sync", cmd_sync, "sync DIR --guest ADDR --key FILE --guest-key PUBKEY [--policy FILE] [--json] ..."},
    {"up", cmd_up, "up DIR --guest ADDR --key FILE --guest-key PUBKEY [--policy FILE] [-d]  mount DIR, sync it live"},
    {"down", cmd_down, "down DIR                  stop airlock up for DIR and unmount it"},
    {"status", cmd_status, "status [-C DIR] [--json]  connection, pending changes, applied seq, latency"},
    {"sync-wait", cmd_sync_wait, "sync-wait [-C DIR] [--timeout S]  wait until every change so far is on the guest"},
    {"exec", cmd_exec,
     "exec [-C DIR] [--timeout S] [--tty] [--stdin|--no-stdin] -- CMD [ARG...]  run CMD in the guest"},
    {"shell", cmd_shell,
     "shell [-C DIR] [--timeout S] [-c CMD [NAME [ARG...]]]  login shell (or sh -c CMD) in the guest"},
    {"trust", cmd_trust, "trust [DIR] | --revoke [DIR] | --list  approve DIR/airlock.json as it is now"},
    {"audit", cmd_audit, "audit [-C DIR] [--json]   withheld paths (with their rule), skipped files, egress denials"},
    {"changes", cmd_changes, "changes [-C DIR] [--json] [--stat|--diff] [PATH...]  what commands changed in the guest"},
    {"accept", cmd_changes, "accept [-C DIR] (PATH...|--all)  write guest changes to the host"},
    {"reject", cmd_changes, "reject [-C DIR] (PATH...|--all)  put the host's version back in the guest"},
};

void cmd_err(const char *fmt, ...)
{
	va_list ap;

	fputs("airlock: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
}

int cmd_print_json(json_t *o)
{
	if (!o || json_dumpf(o, stdout, JSON_COMPACT) < 0) {
		json_decref(o);
		cmd_err("out of memory");
		return -1;
	}
	json_decref(o);
	fputc('\n', stdout);
	return 0;
}

static void usage(FILE *f)
{
	fputs("usage: airlock COMMAND [ARGS]\n\ncommands:\n", f);
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		fprintf(f, "  %s\n", commands[i].usage);
}

int main(int argc, char **argv)
{
	if (sodium_init() < 0) {
		cmd_err("libsodium failed to initialise");
		return 1;
	}
	mem_init_json();
	if (argc < 2) {
		usage(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
		usage(stdout);
		return 0;
	}
	for (size_t i = 0; i < sizeof(commands) / sizeof(commands[0]); i++)
		if (!strcmp(argv[1], commands[i].name))
			return commands[i].fn(argc - 1, argv + 1);
	cmd_err("unknown command '%s' (try 'airlock help')", argv[1]);
	return 2;
}
