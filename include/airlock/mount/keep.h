/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_MOUNT_KEEP_H
#define AIRLOCK_MOUNT_KEEP_H

/*
 * keep: what a supervisor holds so that a new server can resume a live
 * airlock mount after its server died (doc/MOUNT.md "Surviving a crash").
 * The server (mount.c, mount_opts.keeper_fd) streams it over a
 * SOCK_SEQPACKET socket: first the connection (a duplicate of the
 * /dev/fuse descriptor and the kernel's FUSE_INIT request), then every node
 * id it hands to the kernel with a duplicate of that node's O_PATH
 * descriptor, and every node id the kernel forgot. The supervisor's table
 * then names, for each node id the kernel may still use, the file it
 * means: a new server forked from the supervisor serves those ids
 * (mount_opts.kept) instead of answering ESTALE.
 *
 * Wire (one process's socketpair, never another host): each message is a
 * struct keep_msg header then, for KEEP_CONN, the INIT bytes and one
 * descriptor; for KEEP_NODES, n struct keep_rec and one descriptor per
 * KEEP_ADD record, in order. No FUSE dependency.
 */

#include <stddef.h>
#include <stdint.h>

#define KEEP_CONN     1u
#define KEEP_NODES    2u
#define KEEP_ADD      1u
#define KEEP_DROP     2u
#define KEEP_BATCH    64u   /* records (and descriptors) per message at most */
#define KEEP_INIT_MAX 4096u /* FUSE_INIT request bytes at most */

struct keep_msg {
	uint32_t type; /* KEEP_CONN or KEEP_NODES */
	uint32_t n;    /* KEEP_NODES: records that follow; KEEP_CONN: INIT bytes */
};

struct keep_rec {
	uint64_t nodeid;
	uint32_t op; /* KEEP_ADD or KEEP_DROP */
	uint32_t pad;
};

/* A node id the kernel may still use and its descriptor. */
struct mount_kept {
	uint64_t nodeid;
	int fd;
};

struct mount_keep;

/* An empty table; NULL without memory. */
struct mount_keep *mount_keep_new(void);

/* Close every descriptor held and free k. NULL is a no-op. */
void mount_keep_free(struct mount_keep *k);

/* Read one message from sock (blocking) into k. 1 when one was taken, 0 at
 * end of stream, -errno (-EPROTO for a malformed message: its descriptors
 * are closed, nothing else changes). */
int mount_keep_recv(struct mount_keep *k, int sock);

/* The connection: its /dev/fuse descriptor (owned by k) or -1 when none
 * was handed over yet, and the INIT request (owned by k). */
int mount_keep_conn(const struct mount_keep *k, const void **init, size_t *len);

/* Node ids held and their descriptors, in an array owned by k (valid until
 * the next call on k); *n set to the count. NULL with *n 0 without memory. */
const struct mount_kept *mount_keep_list(struct mount_keep *k, size_t *n);

/* Close the connection and every descriptor (a supervisor giving up: the
 * kernel aborts the connection once its last descriptor is closed). */
void mount_keep_release(struct mount_keep *k);

#endif
