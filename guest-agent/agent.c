/* SPDX-License-Identifier: Apache-2.0 */
/* placeholder: implementation in progress */
#include <stdio.h>
int main(void) { fputs("airlock-agent: not built yet\n", stderr); return 1; }
