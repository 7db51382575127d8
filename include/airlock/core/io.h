/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_IO_H
#define AIRLOCK_IO_H

/*
 * io: the one loop that writes a whole buffer to a descriptor. write(2) may
 * write less than asked (a full disk first returns a short count, a pipe
 * or socket whatever fits) or be interrupted by a signal; every caller that
 * means "all of it or an error" goes through here.
 */

#include <stddef.h>

/* Write all n bytes of p to fd, retrying short writes and EINTR. 0, or
 * -errno of the failing write (-ENOSPC on a full disk, -EAGAIN on a full
 * non-blocking descriptor, with what came before it written); -EIO if
 * write(2) returns 0 for a non-empty request (no progress is possible). */
int io_write_all(int fd, const void *p, size_t n);

#endif
