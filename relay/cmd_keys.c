/* SPDX-License-Identifier: Apache-2.0 */
/* placeholder: implementation in progress */
#include "cmd_i.h"
int cmd_keygen(int argc, char **argv) { (void)argc; (void)argv; cmd_err("keygen: not built yet"); return 1; }
int cmd_pubkey(int argc, char **argv) { (void)argc; (void)argv; cmd_err("pubkey: not built yet"); return 1; }
