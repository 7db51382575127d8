/* SPDX-License-Identifier: Apache-2.0 */
/* airlock: the host-side command. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "cmd_i.h"

/* The dispatch table; usage is the one-line fallback for a command help.c's
 * table has no row for. */
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
     "shell [-C DIR] [--timeout S] [--bash] [-c CMD [NAME [ARG...]]]  login shell (or sh/bash -c CMD) in the guest"},
    {"fork", cmd_fork,
     "fork [-C DIR] [-n N] [--name NAME]... | --rm NAME... | --rm-all | --list  forks of the sandbox"},
    {"try", cmd_try, "try [-C DIR] --patch FILE... [--pick NAME] [--keep] [--json] -- CMD  one fork per patch"},
    {"trust", cmd_trust, "trust [DIR] | --revoke [DIR] | --list  approve DIR/airlock.json as it is now"},
    {"audit", cmd_audit, "audit [-C DIR] [--json]   withheld paths (with their rule), skipped files, egress denials"},
    {"changes", cmd_changes, "changes [-C DIR] [--json] [--stat|--diff] [PATH...]  what commands changed in the guest"},
    {"accept", cmd_changes, "accept [-C DIR] (PATH...|--all)  write guest changes to the host"},
    {"reject", cmd_changes, "reject [-C DIR] (PATH...|--all)  put the host's version back in the guest"},
    {"list", cmd_list, "list [--json]"},
    {"logs", cmd_logs, "logs [-f] [-n N] [DIR]"},
    {"gc", cmd_gc, "gc [--dry-run] [--older-than DAYS]"},
    {"doctor", cmd_doctor, "doctor [--json]"},
    {"init", cmd_init, "init [DIR] [--force]"},
    {"policy", cmd_policy, "policy check [FILE] | policy explain [-C DIR] PATH..."},
    {"version", cmd_version, "version [--json]"},
    {"help", cmd_help, "help [CMD]"},
};

#define NCOMMANDS (sizeof(commands) / sizeof(commands[0]))

const char *cmd_table_usage(const char *name)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (!strcmp(commands[i].name, name))
			return commands[i].usage;
	return NULL;
}

void cmd_table_print_unlisted(FILE *f)
{
	for (size_t i = 0; i < NCOMMANDS; i++)
		if (!cmd_help_find(commands[i].name))
			fprintf(f, "  %s\n", commands[i].usage);
}

/* --json's promise of a document on stdout, failures included: the
 * first error said (cmd_err) and whether a document went out. */
static struct {
	char first_err[1024];
	bool printed;
} json_out;

void cmd_err(const char *fmt, ...)
{
	va_list ap;

	fputs("airlock: ", stderr);
	va_start(ap, fmt);
	vfprintf(stderr, fmt, ap);
	va_end(ap);
	fputc('\n', stderr);
	if (!json_out.first_err[0]) {
		va_start(ap, fmt);
		vsnprintf(json_out.first_err, sizeof(json_out.first_err), fmt, ap);
		va_end(ap);
	}
}

int cmd_print_json(json_t *o)
{
	if (!o || json_dumpf(o, stdout, JSON_COMPACT) < 0) {
		json_decref(o);
		cmd_err("out of memory");
		return -1;
	}
	json_out.printed = true;
	json_decref(o);
	fputc('\n', stdout);
	return 0;
}

/* argv asks for --json (before any "--"). */
static bool wants_json(int argc, char **argv)
{
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--json"))
			return true;
	return false;
}

/* A command run with --json that failed without printing its document
 * prints the failure document instead (doc/JSON.md "Failure"). */
static int json_failure(const char *cmd, int status)
{
	if (status != 0 && !json_out.printed)
		cmd_print_json(json_pack("{s:i, s:b, s:s, s:i, s:s}", "version", 1, "ok", 0, "command", cmd, "exit",
					 status, "error",
					 json_out.first_err[0] ? json_out.first_err : "failed (see stderr)"));
	return status;
}

int main(int argc, char **argv)
{
	if (sodium_init() < 0) {
		cmd_err("libsodium failed to initialise");
		return 1;
	}
	mem_init_json();
	if (argc < 2) {
		cmd_help_overview(stderr);
		return 2;
	}
	if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help"))
		return cmd_help(1, argv + 1);
	if (!strcmp(argv[1], "--version"))
		return cmd_version(argc - 1, argv + 1);
	for (size_t i = 0; i < NCOMMANDS; i++) {
		if (strcmp(argv[1], commands[i].name))
			continue;
		if (cmd_wants_help(argc - 1, argv + 1)) {
			cmd_help_print(stdout, commands[i].name);
			return 0;
		}
		int status = commands[i].fn(argc - 1, argv + 1);
		return wants_json(argc - 1, argv + 1) ? json_failure(commands[i].name, status) : status;
	}
	cmd_err("unknown command '%s' (try 'airlock help')", argv[1]);
	return 2;
}
