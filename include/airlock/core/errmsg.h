/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_ERRMSG_H
#define AIRLOCK_ERRMSG_H

/*
 * errmsg: the one way a function fills a caller's (char *err, size_t errlen)
 * message buffer. A NULL or empty buffer is allowed (the message is
 * dropped); a long message is truncated, always NUL-terminated.
 */

#include <stdarg.h>
#include <stddef.h>

void errmsg_set(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

/* The same from a va_list, after "PREFIX: " when prefix is not NULL (a
 * prefix that fills the buffer leaves just the truncated prefix). */
void errmsg_vset(char *err, size_t errlen, const char *prefix, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

#endif
