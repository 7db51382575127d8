/* SPDX-License-Identifier: Apache-2.0 */
#include "airlock/core/errmsg.h"

#include <stdarg.h>
#include <stdio.h>

void errmsg_set(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (!err || !errlen)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

void errmsg_vset(char *err, size_t errlen, const char *prefix, const char *fmt, va_list ap)
{
	int n = 0;

	if (!err || !errlen)
		return;
	if (prefix) {
		n = snprintf(err, errlen, "%s: ", prefix);
		if (n < 0 || (size_t)n >= errlen)
			return;
	}
	vsnprintf(err + n, errlen - (size_t)n, fmt, ap);
}
