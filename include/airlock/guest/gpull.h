/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_GPULL_H
#define AIRLOCK_GPULL_H

/*
 * gpull: the guest's answer to CHG_PULL (doc/PROTOCOL.md "Changes"): for
 * each asked path, in order, one CHG_FILE describing it now (track_describe)
 * and, for a regular file, its bytes in CHG_DATA frames; then CHG_END.
 * Sent as the stream's window allows (gpull_pump from on_writable), so a
 * large file never sits in memory: one frame is read ahead at most.
 *
 * Paths are checked (manifest_path_check) and opened beneath the root,
 * never following a symlink. A file that changes while it is sent gets
 * bytes that do not match its CHG_FILE hash; the host refuses it.
 */

#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"

struct chan;
struct gpull;

/* Decode the CHG_PULL payload and set up the answer on stream. 0, or
 * -EBADMSG (malformed request: the caller drops the session), -ENOMEM. */
int gpull_new(struct chan *c, uint32_t stream, int rootfd, const struct chunk_params *params, const uint8_t *p,
	      size_t n, struct gpull **out);
/* Send what the window allows. 1 once CHG_END went out (free it then),
 * 0 when it waits for window, -errno on a send failure. */
int gpull_pump(struct gpull *g);
uint32_t gpull_stream(const struct gpull *g);
void gpull_free(struct gpull *g); /* NULL is a no-op */

#endif
