/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_SANDBOX_FORK_H
#define AIRLOCK_SANDBOX_FORK_H

/*
 * sandbox_fork: copy-on-write forks of a local sandbox's workspace copy and
 * home (doc/SANDBOX.md, "Forks"). Nothing is copied: the state directory
 * keeps a stack of frozen layers, and the parent and every fork are
 * overlay filesystems over it, each with an upper of its own.
 *
 *   <dir>/workspace, <dir>/home            the base (frozen once a fork exists)
 *   <dir>/layers/<i>/{workspace,home}      frozen layers 1..n (n <= SANDBOX_FORK_LAYERS_MAX)
 *   <dir>/upper/{workspace,home}           the parent's upper (absent: the parent runs on the base)
 *   <dir>/work/{workspace,home}            the parent's overlay work directories
 *   <dir>/forks/<name>/                    a fork's state: keys/, agent/, upper/, work/, slot,
 *                                          depth (how many layers its lower has), meta.json
 *   <dir>/run.<slot>/                      a fork's agent.sock (a short path: 107 bytes at most)
 *
 * An overlay's lower layers must not change while it is mounted. Forking
 * therefore needs the parent stopped for a moment: its upper becomes a
 * frozen layer (a rename), the parent gets a fresh upper over all layers,
 * and the forks get uppers over the same layers. When no fork exists the
 * next freeze first merges every layer and the upper back into the base
 * (sandbox_fork_compact), so the stack stays bounded.
 *
 * Not thread-safe; call from the daemon's loop thread while the parent
 * sandbox is stopped (freeze, compact) or at any time (the rest).
 * Functions return 0 or -errno and write one line into err.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SANDBOX_FORK_LAYERS_MAX 24 /* frozen layers below the parent's upper */
#define SANDBOX_FORK_NAME_MAX	32 /* bytes of a fork's name */
#define SANDBOX_FORK_MAX	16 /* forks of one sandbox at a time */

/* [a-z0-9][a-z0-9_-]{0,31}: a name that is a safe path component. */
bool sandbox_fork_name_ok(const char *name);

/* The parent is stopped: merge the stack if no fork exists, then freeze
 * the parent's current state as the lower of new forks; *depth is what
 * sandbox_fork_make stores for them. uid: owner of new directories (0:
 * leave them the caller's). -ENOSPC (after saying so) when the stack is
 * full while forks still use it. */
int sandbox_fork_freeze(const char *dir, unsigned *depth, char *err, size_t errlen);

/* forks/<name>/ with an empty upper over depth layers. -EEXIST when a
 * fork of that name exists. */
int sandbox_fork_make(const char *dir, const char *name, unsigned depth, int64_t ttl_s, char *err, size_t errlen);

/* Remove forks/<name>/ (its sandbox must be stopped). -ENOENT when none. */
int sandbox_fork_remove(const char *dir, const char *name, char *err, size_t errlen);

/* The names of the forks in dir, sorted (caller frees each and the array
 * with mem_free). 0 forks: *names NULL. */
int sandbox_fork_list(const char *dir, char ***names, size_t *n);

/* Merge every layer and the parent's upper into the base; nothing when
 * there is no stack. -EBUSY when a fork exists. The parent must be stopped. */
int sandbox_fork_compact(const char *dir, char *err, size_t errlen);

/* What a fork changed in its workspace copy, from its upper: fn(path,
 * deleted, ud) for each file, symlink or deletion that differs from its
 * lower (path relative to the workspace; copies of unchanged content are
 * left out). Stops at fn's first non-zero return and returns it. The
 * fork's sandbox should be stopped (nothing writes the upper meanwhile). */
typedef int sandbox_fork_change_fn(const char *path, bool deleted, void *ud);
int sandbox_fork_changes(const char *dir, const char *name, sandbox_fork_change_fn *fn, void *ud);

/* A file (one name, may start with '.') into fork name's home before its
 * sandbox starts (forks/<name>/upper/home/<file>, 0600, the sandbox's
 * uid): try's patch. -EEXIST when it is there. */
int sandbox_fork_seed(const char *dir, const char *name, const char *file, const void *data, size_t n, char *err,
		      size_t errlen);

/* What fork name changed in its workspace (sandbox_fork_changes), staged
 * in the parent's home for a replay there by a command of its own:
 * .airlock-try/<stage>/files/<path> hard links to the fork's changed files
 * and symlinks (never followed), .airlock-try/<stage>/deleted the
 * NUL-separated paths it deleted; *nfiles, *ndeleted count them. Both
 * sandboxes must be stopped (nothing has the parent's home mounted). */
int sandbox_fork_stage(const char *dir, const char *name, const char *stage, size_t *nfiles, size_t *ndeleted,
		       char *err, size_t errlen);

#endif
