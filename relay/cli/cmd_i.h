/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_CMD_I_H
#define AIRLOCK_CMD_I_H

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
 * or above it; *rel = root's path below it, "" = the root). */
int cmd_connect_relay(const char *path);
void cmd_find_workspace(char *root, const char **rel);

/* Print o as one line of compact JSON to stdout and drop the reference
 * (NULL: the json_pack that made it failed). 0, or -1 after saying "out
 * of memory". */
int cmd_print_json(json_t *o);

/* Print "airlock: " + message to stderr. */
void cmd_err(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

#endif
