/* SPDX-License-Identifier: Apache-2.0 */
/* placeholder: implementation in progress */
#include "cmd_i.h"
int cmd_ping(int argc, char **argv) { (void)argc; (void)argv; cmd_err("ping: not built yet"); return 1; }
