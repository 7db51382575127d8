/* SPDX-License-Identifier: Apache-2.0 */
/* The vm sandbox (issue 7). Until the template and the qemu launcher land,
 * --sandbox vm says so instead of starting anything. */
#include <errno.h>
#include <stdio.h>

#include "sandbox_i.h"

int sandbox_vm_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	(void)sb;
	(void)cfg;
	snprintf(err, errlen, "--sandbox vm is not available in this build yet");
	return -ENOTSUP;
}

void sandbox_vm_stop(struct sandbox *sb)
{
	(void)sb;
}
