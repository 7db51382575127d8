/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_EXEC_I_H
#define AIRLOCK_EXEC_I_H

/* Private to relay/exec: the cgroup half of the exec module (exec_cg.c). */

#include <stdbool.h>
#include <stdint.h>

#include "airlock/exec/exec.h"

/* One command's cgroups. Paths are mem_alloc'ed; fds are O_CLOEXEC
 * cgroup.procs files the child writes "0" into before execve. */
struct exec_cg {
	char *v2;	 /* v2 directory, or NULL */
	char *v1[2];	 /* v1 pids / memory directories, or NULL */
	int procs_fd[3]; /* v2, v1 pids, v1 memory; -1 = none */
	bool has_kill;	 /* v2 cgroup.kill */
	bool pids_limited;
	bool mem_limited;
};

/* Create the command's cgroups and apply limits. An empty cg (no paths)
 * when sys is NULL or has no cgroup. Errors: -errno from mkdir / writes. */
int exec_cg_create(struct exec_sys *sys, const struct exec_limits *lim, struct exec_cg *cg);
/* Close the procs fds (parent side, after fork). */
void exec_cg_close_fds(struct exec_cg *cg);
/* sig to every process in the tree's cgroups (SIGKILL via cgroup.kill when
 * present). Returns the number of processes signalled or 1 for
 * cgroup.kill; 0 when none; -errno when there is no cgroup. */
int exec_cg_signal(struct exec_cg *cg, int sig);
/* 1 when processes remain, 0 when empty, -ENOENT when there is no cgroup. */
int exec_cg_populated(const struct exec_cg *cg);
/* rmdir the directories (best effort) and free the paths. */
void exec_cg_destroy(struct exec_cg *cg);
bool exec_cg_tracks(const struct exec_cg *cg);

#endif
