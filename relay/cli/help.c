/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The CLI's help, from one table: `airlock help [CMD]`, `airlock CMD
 * --help`, the top-level listing, the usage lines printed after a usage
 * error, and `airlock version`. A command gets all of these by adding one
 * row to help_rows[]; a command without a row falls back to the one-line
 * usage of its entry in main.c's table.
 */
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "airlock/core/wire.h"
#include "cmd_i.h"

/* One row per command, in the order of the top-level listing. forms: each
 * form on its own line, without the leading "airlock "; options: lines of
 * "  OPTION  what it does", or NULL. */
static const struct cmd_help help_rows[] = {
    {"up",
     "up DIR [--sandbox local|vm] [--policy FILE] [-d] [--allow-home] [--allow-other] [--quiet]\n"
     "up DIR --guest ADDR --key FILE --guest-key PUBKEY [--psk-file FILE] [--policy FILE] [-d]",
     "mount DIR over itself, keep the sandbox's copy of it in sync, serve its relay socket",
     "  --sandbox local|vm     start the embedded sandbox (default local; doc/SANDBOX.md, doc/VM.md)\n"
     "  --guest ADDR           use a running airlock-agent instead (tcp:H:P, unix:PATH, vsock:CID:PORT, fc:UDS:PORT)\n"
     "  --key FILE             this host's private key (airlock keygen), with --guest\n"
     "  --guest-key PUBKEY     the guest's public key, with --guest\n"
     "  --psk-file FILE        an extra pre-shared key, with --guest\n"
     "  --policy FILE          the policy (default: DIR/airlock.json, else the built-in one)\n"
     "  -d, --daemon           run in the background once DIR is in sync (log: airlock logs DIR)\n"
     "  --allow-home           allow DIR to be $HOME (every dotfile the policy does not withhold is copied)\n"
     "  --allow-other          other users (sudo, services) may use DIR too (needs user_allow_other in "
     "/etc/fuse.conf unless root)\n"
     "  --quiet                no progress during the initial sync (a redrawn line on a terminal, else a line every 5 "
     "s)\n",
     false},
    {"down", "down DIR [--destroy]", "stop airlock up for DIR and unmount it",
     "  --destroy              also remove the sandbox's state (its workspace copy, home, keys)\n", false},
    {"status", "status [-C DIR] [--json]", "connection, pending changes, applied sequence, latency of DIR's airlock up",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  --json                 one JSON object (doc/JSON.md)\n",
     false},
    {"sync-wait", "sync-wait [-C DIR] [--timeout S]", "wait until every change made so far is on the guest",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  --timeout S            give up after S seconds (default 60); exit 1\n",
     false},
    {"exec", "exec [-C DIR] [--timeout S] [--tty] [--stdin|--no-stdin] [--fork NAME] -- CMD [ARG...]",
     "run CMD in the guest, in the same directory of its copy; the exit status is CMD's",
     "  -C DIR                 run from DIR (default: the current directory)\n"
     "  --timeout S            kill CMD after S seconds (default: the policy's execution.timeout_seconds, "
     "300); exit 124\n"
     "  --tty                  give CMD a terminal in the guest\n"
     "  --stdin, --no-stdin    pass our stdin (default: when it is not a terminal)\n"
     "  --fork NAME            run in that fork of the sandbox (airlock fork)\n"
     "  exit 125: the command could not be run at all (the reason is printed); 127: not found in the guest\n",
     true},
    {"shell",
     "shell [-C DIR] [--timeout S] [--bash]\nshell [-C DIR] [--timeout S] [--bash] [-l|--login] [-i] -c CMD [NAME "
     "[ARG...]]",
     "a login shell in the guest, or CMD run there by sh -c (bash -c with --bash; for tools that take a shell path)",
     "  -C DIR                 run from DIR (default: the current directory)\n"
     "  --timeout S            kill the shell after S seconds (default: 30 days without -c)\n"
     "  --bash                 bash instead of sh (agents write bash); bash's -e -u -x -v -f -o -O pass through\n"
     "  -c CMD                 run CMD with the guest's shell; NAME and ARGs become $0, $1, ...\n"
     "  -l, --login, -i, --norc, --noprofile   accepted (a guest shell has no host profile to read)\n"
     "  --cwd-file FILE        with -c: write the host path of the directory CMD ended in to FILE (Claude Code)\n",
     true},
    {"fork",
     "fork [-C DIR] [-n N] [--name NAME]... [--ttl S] [--json]\nfork [-C DIR] --rm NAME... | --rm-all\nfork [-C DIR] "
     "--list [--json]",
     "copy-on-write forks of the warm sandbox (local: workspace copy, node_modules, home; vm: its disk and memory), "
     "each its own sandbox "
     "(doc/SANDBOX.md \"Forks\")",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  -n N                   how many (1 to 16; default 1); names f1, f2, ... unless --name is given\n"
     "  --name NAME            a fork's name (repeat for several): 1 to 32 of a-z, 0-9, '-', '_'\n"
     "  --ttl S                remove a fork after S seconds without a command (default: the policy's\n"
     "                         workspace.ttl_seconds, else 3600); forks also end with the daemon\n"
     "  --rm NAME..., --rm-all remove forks (their changes go with them)\n"
     "  --list                 the forks, their state and TTL\n"
     "  --json                 one JSON object (doc/JSON.md)\n",
     false},
    {"try", "try [-C DIR] --patch FILE [--patch FILE]... [--pick NAME] [--keep] [--timeout S] [--json] -- CMD [ARG...]",
     "apply each patch in its own fork, run CMD in all of them at once, make the winner's changes the sandbox's "
     "guest changes (review them with airlock changes)",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  --patch FILE           a candidate (a unified diff, -p1); variants are named A, B, C, ... in order\n"
     "  --pick NAME            the winner is this variant (default: the first whose CMD exits 0)\n"
     "  --keep                 keep the forks (try-a, try-b, ...) instead of removing them\n"
     "  --timeout S            kill CMD after S seconds in each fork\n"
     "  --json                 one JSON object (doc/schema/try.schema.json)\n"
     "  exit 0: a winner's changes are in airlock changes; 1: no variant passed; 2: bad arguments or patches\n",
     true},
    {"audit", "audit [-C DIR] [--json]", "withheld paths (with their rule), skipped files, egress denials",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  --json                 one JSON object (doc/JSON.md)\n",
     false},
    {"sync", "sync DIR --guest ADDR --key FILE --guest-key PUBKEY [--policy FILE] [--json]",
     "one-shot mirror of DIR to a running airlock-agent",
     "  --guest ADDR, --key FILE, --guest-key PUBKEY, --psk-file FILE   the guest and its keys (as for up)\n"
     "  --policy FILE          the policy (default: DIR/airlock.json, else the built-in one)\n"
     "  --timeout S            give up after S seconds (default 3600)\n"
     "  --json                 the result as one JSON object (doc/JSON.md)\n",
     false},
    {"ping", "ping --guest ADDR --key FILE --guest-key PUBKEY [-n N] [--size BYTES] [--bulk BYTES [--concurrent]]",
     "round trips and throughput to a running airlock-agent",
     "  --guest ADDR, --key FILE, --guest-key PUBKEY, --psk-file FILE   the guest and its keys\n"
     "  -n N                   round trips (default 10)\n"
     "  --size BYTES           payload of each (default 0)\n"
     "  --window W             round trips in flight (default 1)\n"
     "  --bulk BYTES           also send BYTES on a bulk stream\n"
     "  --concurrent           do the round trips while the bulk transfer runs\n"
     "  --timeout S            give up after S seconds (default 30)\n"
     "  --json                 the result as one JSON object (doc/JSON.md)\n",
     false},
    {"keygen", "keygen -o FILE", "write a new private key (mode 0600), print its public key",
     "  -o FILE                where to write it; FILE must not exist yet\n", false},
    {"pubkey", "pubkey FILE", "print the public key of a private key file", NULL, false},
    {"list", "list [--json]", "every workspace of yours: state, kind, pid, pending changes, sandbox, idle TTL",
     "  --json                 one JSON object (doc/JSON.md)\n", false},
    {"logs", "logs [-f] [-n N] [DIR | -C DIR]",
     "the daemon's log (timestamped, with or without -d) and the sandbox agent's",
     "  DIR                    the workspace (default: the one holding the current directory)\n"
     "  -f, --follow           keep printing what is appended\n"
     "  -n, --lines N          the last N lines of each (default 200)\n",
     false},
    {"gc", "gc [--dry-run] [--older-than DAYS]", "remove the state of workspaces whose directory is gone",
     "  --dry-run              only say what would go\n"
     "  --older-than DAYS      also stopped workspaces unused for DAYS (their sandbox state too)\n",
     false},
    {"doctor", "doctor [--json]",
     "check what airlock needs from this host (FUSE, namespaces, Landlock, seccomp, qemu, KVM, cgroups, stale "
     "mounts and sockets, shells below a mount), each problem with its fix",
     "  --json                 one JSON object (doc/JSON.md)\n", false},
    {"init", "init [DIR] [--force]",
     "write a starter airlock.json for DIR from what it holds (package.json, pyproject.toml, go.mod, Cargo.toml "
     "...: their registries on egress.allow)",
     "  --force                replace an existing airlock.json\n", false},
    {"policy", "policy check [FILE]\npolicy explain [-C DIR] PATH...",
     "check a policy file as up would load it; say which rule syncs or withholds each PATH",
     "  FILE                   default: the workspace's airlock.json\n"
     "  -C DIR                 the workspace (default: the one holding the current directory)\n",
     false},
    {"trust", "trust [DIR]\ntrust --revoke [DIR]\ntrust --list",
     "approve DIR/airlock.json as it is now; until then a repository's own policy may only tighten the default "
     "(doc/UP.md \"Trust\")",
     "  DIR                    the workspace (default: the current directory)\n"
     "  --revoke               withdraw the approval\n"
     "  --list                 every approval, trusted or changed since\n",
     false},
    {"changes", "changes [-C DIR] [--json] [--stat|--diff] [PATH...]",
     "what commands changed in the guest and wait for review, with the command that made each (doc/WRITEBACK.md)",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  --json                 one JSON object (doc/JSON.md)\n"
     "  --stat                 sizes and counts per path\n"
     "  --diff                 a unified diff against the host (binary files named with sizes)\n",
     false},
    {"accept", "accept [-C DIR] (PATH...|--all)",
     "write guest changes to the host through the mount (protected paths only when named)",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  --all                  every change that waits, protected ones left out\n",
     false},
    {"reject", "reject [-C DIR] (PATH...|--all)", "put the host's version back in the guest",
     "  -C DIR                 the workspace (default: the one holding the current directory)\n"
     "  --all                  every change that waits\n",
     false},
    {"version", "version [--json]\n--version", "print airlock's version and protocol versions",
     "  --json                 one JSON object (doc/JSON.md)\n", false},
    {"help", "help [CMD]\nCMD --help", "this overview, or CMD's forms and options", NULL, false},
};

#define NROWS (sizeof(help_rows) / sizeof(help_rows[0]))

const struct cmd_help *cmd_help_find(const char *name)
{
	for (size_t i = 0; i < NROWS; i++)
		if (!strcmp(help_rows[i].name, name))
			return &help_rows[i];
	return NULL;
}

/* Each line of text with prefix before it. */
static void print_lines(FILE *f, const char *prefix, const char *text)
{
	while (*text) {
		size_t n = strcspn(text, "\n");
		fprintf(f, "%s%.*s\n", prefix, (int)n, text);
		text += n + (text[n] == '\n');
	}
}

void cmd_usage(const char *name)
{
	const struct cmd_help *h = cmd_help_find(name);
	const char *usage = cmd_table_usage(name);

	if (h) {
		const char *t = h->forms;
		size_t n = strcspn(t, "\n");
		fprintf(stderr, "usage: airlock %.*s\n", (int)n, t);
		if (t[n])
			print_lines(stderr, "       airlock ", t + n + 1);
	} else if (usage) {
		fprintf(stderr, "usage: airlock %s\n", usage);
	}
	fprintf(stderr, "(airlock %s --help for the options)\n", name);
}

int cmd_operands(const char *cmd, int argc, char **argv, int first, int n, const char *what)
{
	if (argc - first < n)
		cmd_err("%s: missing %s", cmd, what);
	else if (argc - first > n)
		cmd_err("%s: unexpected argument '%s'", cmd, argv[first + n]);
	else
		return 0;
	cmd_usage(cmd);
	return -1;
}

int cmd_help_print(FILE *f, const char *name)
{
	const struct cmd_help *h = cmd_help_find(name);
	const char *usage = cmd_table_usage(name);

	if (!h && !usage)
		return -1;
	if (!h) {
		fprintf(f, "usage: airlock %s\n", usage);
		return 0;
	}
	print_lines(f, "airlock ", h->forms);
	fprintf(f, "\n%s\n", h->summary);
	if (h->options)
		fprintf(f, "\noptions:\n%s", h->options);
	return 0;
}

void cmd_help_overview(FILE *f)
{
	fputs("usage: airlock COMMAND [ARGS]     (airlock help COMMAND, or COMMAND --help, for its options)\n"
	      "\ncommands:\n",
	      f);
	for (size_t i = 0; i < NROWS; i++) {
		print_lines(f, "  ", help_rows[i].forms);
		fprintf(f, "        %s\n", help_rows[i].summary);
	}
	cmd_table_print_unlisted(f);
	fputs("\nquick start: airlock up DIR -d; airlock exec -C DIR -- make   (README.md)\n", f);
}

int cmd_help(int argc, char **argv)
{
	if (argc < 2) {
		cmd_help_overview(stdout);
		return 0;
	}
	if (argc > 2 || cmd_help_print(stdout, argv[1]) < 0) {
		cmd_err("help: no command '%s' (airlock help lists them)", argv[1]);
		return 2;
	}
	return 0;
}

bool cmd_wants_help(int argc, char **argv)
{
	const struct cmd_help *h = cmd_help_find(argv[0]);
	bool passthrough = !h || h->passthrough; /* unknown: the safe reading */

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--"))
			return false;
		if (!strcmp(argv[i], "--help") || (i == 1 && !strcmp(argv[i], "-h")))
			return true;
		if (passthrough)
			return false; /* exec, shell: what follows may be the guest command's own --help */
	}
	return false;
}

int cmd_version(int argc, char **argv)
{
	if (argc == 2 && !strcmp(argv[1], "--json"))
		return cmd_print_json(json_pack("{s:i, s:s, s:i}", "version", 1, "airlock", AIRLOCK_VERSION,
						"wire_version", WIRE_VERSION))
			   ? 1
			   : 0;
	if (argc != 1) {
		cmd_usage("version");
		return 2;
	}
	printf("airlock %s (wire protocol %d)\n", AIRLOCK_VERSION, WIRE_VERSION);
	return 0;
}
