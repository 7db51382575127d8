/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_CMD_I_H
#define AIRLOCK_CMD_I_H

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

#include <jansson.h>

/* Private to the airlock CLI: one function per subcommand. Each gets argv
 * with argv[0] = the subcommand name and returns the process exit status
 * (0 ok, 1 runtime failure, 2 usage or bad input). */

int cmd_keygen(int argc, char **argv);
int cmd_pubkey(int argc, char **argv);
int cmd_ping(int argc, char **argv);
int cmd_sync(int argc, char **argv);
int cmd_audit(int argc, char **argv);
int cmd_trust(int argc, char **argv); /* cmd_trust.c */
int cmd_up(int argc, char **argv);    /* up.c; down: up_state.c; status, sync-wait: up_status.c */
int cmd_down(int argc, char **argv);
int cmd_status(int argc, char **argv);
int cmd_sync_wait(int argc, char **argv);
int cmd_exec(int argc, char **argv);	/* cmd_exec.c: a relay client */
int cmd_shell(int argc, char **argv);	/* cmd_exec.c: the same client, a shell in the guest */
int cmd_changes(int argc, char **argv); /* cmd_changes.c: changes, accept, reject (relay clients) */

/* cmd_exec.c: a connection to the relay socket at path (fd or -errno), and
 * the workspace holding the realpath in root (the nearest airlock mount at
 * or above it; *rel = root's path below it, "" = the root): true when that
 * is an airlock mount, false when there is none (root is left as it was). */
int cmd_connect_relay(const char *path);
bool cmd_find_workspace(char *root, const char **rel);
/* cmd_changes.c: send rq (with "id": 1) on the relay connection fd, return
 * the first event with id 1 (new reference), NULL when the relay went away. */
json_t *cmd_relay_ask(int fd, json_t *rq);
/* cmd_fork.c: the same, and rq is released (NULL: NULL). */
json_t *cmd_relay_ask_take(int fd, json_t *rq);
/* cmd_fork.c: the relay of the workspace holding dir; *root its root. The
 * fd, or -1 after saying why (who: the command, for the message). */
int cmd_relay_open(const char *who, const char *dir, char root[PATH_MAX]);
/* cmd_fork.c: the forks of the sandbox (airlock fork): wait for sync, then the
 * fork op, retried while the sandbox is busy. The answer or NULL after
 * saying why. */
json_t *cmd_fork_make(const char *who, int fd, json_t *names, int count, long ttl_s);
int cmd_fork(int argc, char **argv); /* cmd_fork.c */
int cmd_try(int argc, char **argv);  /* cmd_try.c */

int cmd_logs(int argc, char **argv);   /* cmd_logs.c */
int cmd_doctor(int argc, char **argv); /* cmd_doctor.c */
int cmd_init(int argc, char **argv);   /* cmd_policy.c: init, policy check/explain */
int cmd_policy(int argc, char **argv);
int cmd_list(int argc, char **argv); /* cmd_list.c: list, gc */
int cmd_gc(int argc, char **argv);
int cmd_help(int argc, char **argv);	/* help.c: airlock help [CMD] */
int cmd_version(int argc, char **argv); /* help.c: airlock version [--json] */

/* One command's help (help.c's table): forms one per line without the
 * leading "airlock ", a one-line summary, option lines or NULL;
 * passthrough: what follows its options is a guest command, whose own
 * --help must reach it (exec, shell). */
struct cmd_help {
	const char *name;
	const char *forms;
	const char *summary;
	const char *options;
	bool passthrough;
};

/* The help row of command name, or NULL. */
const struct cmd_help *cmd_help_find(const char *name);
/* Print name's help (forms, summary, options) to f. 0, or -1 when there
 * is no such command. */
int cmd_help_print(FILE *f, const char *name);
/* The top-level help: every command with its main forms. */
void cmd_help_overview(FILE *f);
/* After a usage error: name's forms to stderr, and where its options are. */
void cmd_usage(const char *name);
/* Exactly n (0 or 1) operands from argv[first] on; else -1 after naming
 * the missing one (what, e.g. "DIR (the workspace)") or the first extra
 * one, and the usage. */
int cmd_operands(const char *cmd, int argc, char **argv, int first, int n, const char *what);
/* argv (argv[0] = the command) asks for the command's help: --help before
 * any "--", or -h first; for a passthrough command only as the first
 * argument, so the guest command's own --help stays its own. */
bool cmd_wants_help(int argc, char **argv);

/* main.c's command table: the one-line usage of name (NULL: no such
 * command), and the commands help.c's table has no row for. */
const char *cmd_table_usage(const char *name);
void cmd_table_print_unlisted(FILE *f);

/* ---- workspace.c: which workspace a directory is in, and all of them ---- */

/* path is dir or below it (both absolute, no trailing '/'). */
bool ws_path_below(const char *path, const char *dir);
/* The workspace holding dir, into out: the nearest airlock mount or live
 * airlock up at or above realpath(dir); with records also the nearest
 * directory with audit records (airlock sync); else realpath(dir) itself.
 * 0, or -errno from realpath. */
int ws_resolve(const char *dir, char out[PATH_MAX], bool records);
/* One workspace of this user: its state directory, the pid of its
 * airlock up (0: none runs), its directory ("" when no file names it) and
 * the daemon's status (NULL unless it runs; borrowed for the call). */
struct ws_info {
	char state_dir[PATH_MAX];
	char dir[PATH_MAX];
	pid_t pid;
	json_t *status;
};
/* fn for every state directory (at most 4096); stops at fn's first
 * non-zero return, which is returned. */
int ws_foreach(int (*fn)(const struct ws_info *w, void *ud), void *ud);

/* Print o as one line of compact JSON to stdout and drop the reference
 * (NULL: the json_pack that made it failed). 0, or -1 after saying "out
 * of memory". */
int cmd_print_json(json_t *o);

/* Print "airlock: " + message to stderr. */
void cmd_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
