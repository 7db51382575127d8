/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_MOUNT_H
#define AIRLOCK_MOUNT_H

/*
 * mount: airlock's transparent passthrough FUSE filesystem, mounted over a
 * directory DIR itself. DIR is opened before the mount, and every operation
 * is served through that descriptor (and per-inode O_PATH descriptors below
 * it), so the editor keeps its path while airlock sees every change. Each
 * mutating operation is journaled (see journal.h) before the kernel gets its
 * reply. Host only: links libfuse3 (library airlock-host). See doc/MOUNT.md.
 *
 * The session runs on its own threads (a bounded pool of FUSE workers); none
 * of them ever waits for the journal's consumer or the network.
 */

#include <stdbool.h>
#include <stddef.h>

struct journal;
struct mount;
struct mount_kept;

struct mount_opts {
	unsigned max_threads; /* FUSE workers; 0 = 8 */
	double timeout;	      /* entry/attr/negative cache seconds; 0 = 3600 */
	bool allow_other;     /* let other users use the mount (-o allow_other;
				 needs user_allow_other in /etc/fuse.conf when
				 not root) */
	bool debug;	      /* libfuse request trace on stderr */
	/* Called once, from a session thread, if the session ends by itself
	 * (someone unmounted DIR, or the kernel aborted the connection); not
	 * called for mount_stop(). May be NULL. */
	void (*on_exit)(void *ud);
	void *ud;
	/* keep: stream the connection and every node id with a duplicate of
	 * its descriptor to a supervisor on keeper_fd (a SOCK_SEQPACKET socket,
	 * keep.h; the caller keeps it open while the mount runs). */
	bool keep;
	int keeper_fd;
	/* Resume a live mount whose server died (doc/MOUNT.md "Surviving a
	 * crash"), from what the supervisor kept (keep.h): with adopt_init
	 * set, dir must be the canonical absolute path the mount covers,
	 * adopt_fd its /dev/fuse descriptor (duplicated: the caller keeps its
	 * own), adopt_init/adopt_init_len the kernel's FUSE_INIT request,
	 * backing_fd a directory descriptor of dir opened before it was
	 * mounted, epoch a number (1..65535) no earlier server of this mount
	 * used, and kept/nkept the earlier servers' node ids still known, each
	 * with a descriptor the mount takes over (closes). Those ids are
	 * served; an earlier id not in kept is answered ESTALE. */
	int adopt_fd, backing_fd;
	const void *adopt_init;
	size_t adopt_init_len;
	unsigned short epoch;
	const struct mount_kept *kept;
	size_t nkept;
};

/* Mount the passthrough filesystem over dir, journaling into j (which must
 * outlive the mount). Returns once the mount is live and being served.
 * A stale airlock mount left on dir by a crashed process is detached first
 * (mount_clear_stale). opts may be NULL for defaults.
 * Errors: -EBUSY when dir is already served by a live airlock mount;
 * -ENOENT/-ENOTDIR/-EACCES for dir; -ENODEV when /dev/fuse is missing;
 * -EPERM when this process may not mount; -ENOMEM. */
int mount_start(const char *dir, struct journal *j, const struct mount_opts *opts, struct mount **out);

/* Unmount and stop: detach the mount, end the session (aborting the FUSE
 * connection if files stay open past a short grace period), join every
 * thread, close every descriptor, free m. DIR then shows the backing
 * directory again. NULL is a no-op. */
void mount_stop(struct mount *m);

/* The absolute, canonical path the mount covers (owned by m). */
const char *mount_path(const struct mount *m);

/* If dir is covered by an airlock FUSE mount: a mount whose server is gone
 * (ENOTCONN) is detached lazily (umount2 MNT_DETACH, or fusermount3 -uz when
 * not root); returns 0 when dir is (now) not an airlock mount, -EBUSY when a
 * live airlock process serves it, or -errno. */
int mount_clear_stale(const char *dir);

/* Detach the mount on dir lazily (umount2 MNT_DETACH, or fusermount3 -uz
 * when not root), whatever serves it: for a supervisor giving up. dir must
 * be canonical (it is not looked up: the mount may hang). 0 or -errno. */
int mount_detach(const char *dir);

/* 1 when dir is the root of an airlock FUSE mount, 0 when not, -errno. */
int mount_is_airlock(const char *dir);

#endif
