/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sandbox_limits: what one local sandbox may use of the host (doc/SANDBOX.md,
 * "Limits"): processes, memory, /tmp, file size. The values come from the
 * policy's sandbox.limits or the defaults below; they are enforced by a
 * cgroup for the whole sandbox where one can be had (exec.h, exec_cgroup_*:
 * v2, or v1 pids/memory on hybrid hosts) and by rlimits the sandbox's PID 1
 * and everything it starts inherit, the /tmp tmpfs's size= in any case.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/utsname.h>
#include <unistd.h>

#include "airlock/policy/policy.h"
#include "sandbox_i.h"

#define GiB (1ull << 30)

/* The defaults, and why (doc/SANDBOX.md says the same):
 * - pids 4096: a parallel build (make -j, cargo, a JVM's or node's thread
 *   pools: every thread counts) stays far below it, a fork bomb stops at
 *   it within a second;
 * - memory: half the host's RAM, so a runaway build or a memory bomb leaves
 *   the host (the editor, the daemon) the other half;
 * - /tmp: 1 GiB, and never more than the memory limit (tmpfs pages are
 *   memory, charged to the sandbox's cgroup);
 * - file: 32 GiB, the largest single file a command (or the copy) may
 *   write: room for disk images and model weights, not for filling the
 *   disk with one file. */
void sandbox_limits_resolve(const struct policy_sandbox_limits *in, struct sandbox_limits *out)
{
	memset(out, 0, sizeof(*out));
	out->pids = in && in->pids ? in->pids : POLICY_PIDS_DEFAULT;
	out->memory_given = in && in->memory;
	out->memory = out->memory_given ? in->memory : policy_memory_default();
	if (out->memory < POLICY_MEMORY_MIN)
		out->memory = POLICY_MEMORY_MIN;
	out->tmp = in && in->tmp ? in->tmp : POLICY_TMP_DEFAULT;
	if (out->tmp > out->memory)
		out->tmp = out->memory;
	out->file = in && in->workspace ? in->workspace : POLICY_WORKSPACE_DEFAULT;
}

/* One try at a cgroup under sys for lim; true when it enforces both
 * limits. */
static bool cgroup_try(struct sandbox_limits *lim, const struct exec_sys_cfg *cfg)
{
	struct exec_limits el = {.pids_max = (uint32_t)lim->pids, .memory_max = lim->memory};

	if (exec_sys_new(cfg, &lim->sys) < 0)
		return false;
	if (exec_cgroup_new(lim->sys, &el, &lim->cg) < 0) {
		exec_sys_free(lim->sys);
		lim->sys = NULL;
		return false;
	}
	return exec_cgroup_limits(lim->cg) == (EXEC_CGROUP_PIDS | EXEC_CGROUP_MEMORY);
}

void sandbox_limits_cgroup(struct sandbox_limits *lim, const char *fork)
{
	char name[96];
	struct exec_sys_cfg cfg = {.cgroup = EXEC_CGROUP_AUTO, .cgroup_name = name};

	/* one parent per sandbox: releasing it kills every leaf below, so a
	 * fork's must not be its sandbox's */
	if (fork)
		snprintf(name, sizeof(name), "airlock-sandbox.%ld.%.32s", (long)getpid(), fork);
	else
		snprintf(name, sizeof(name), "airlock-sandbox.%ld", (long)getpid());
	if (cgroup_try(lim, &cfg))
		goto done;
	/* our own cgroup holds processes (a systemd session scope or
	 * service): root can still make one at the top */
	if (geteuid() == 0) {
		struct exec_sys *sys = lim->sys;
		struct exec_cgroup *cg = lim->cg;
		unsigned had = exec_cgroup_limits(cg);
		lim->sys = NULL;
		lim->cg = NULL;
		cfg.top_level = true;
		if (cgroup_try(lim, &cfg) || exec_cgroup_limits(lim->cg) > had) {
			exec_cgroup_free(cg);
			exec_sys_free(sys);
		} else {
			sandbox_limits_release(lim);
			lim->sys = sys;
			lim->cg = cg;
		}
	}
done:
	lim->pids_cg = exec_cgroup_limits(lim->cg) & EXEC_CGROUP_PIDS;
	lim->memory_cg = exec_cgroup_limits(lim->cg) & EXEC_CGROUP_MEMORY;
}

int sandbox_limits_attach(const struct sandbox_limits *lim, pid_t pid)
{
	return lim->cg ? exec_cgroup_attach(lim->cg, pid) : 0;
}

/* Does RLIMIT_NPROC count per user namespace (ucounts, Linux >= 5.14)? */
static bool nproc_per_userns(void)
{
	struct utsname u;
	unsigned major = 0, minor = 0;

	if (uname(&u) < 0 || sscanf(u.release, "%u.%u", &major, &minor) != 2)
		return false;
	return major > 5 || (major == 5 && minor >= 14);
}

void sandbox_limits_rlimits(const struct sandbox_limits *lim, bool own_uid, struct sandbox_rlimits *r)
{
	/* per uid of the sandbox's own user namespace (Linux >= 5.14; before,
	 * per host uid, which is the sandbox's own as root): the whole
	 * sandbox's processes and threads. With pids.max it is a backstop at
	 * twice that, so the cgroup is what a fork bomb meets (and counts).
	 * An older kernel with the invoking user's uid would count all of
	 * that user's threads (a browser alone has thousands): not set. */
	uint64_t nproc = lim->pids_cg ? 2 * lim->pids : lim->pids;
	r->nproc_set = own_uid || nproc_per_userns();
	r->nproc.rlim_cur = r->nproc.rlim_max = (rlim_t)nproc;
	/* no memory cgroup and a memory limit asked for: each process's
	 * private writable memory (not RLIMIT_AS, which counts reservations:
	 * V8 reserves tens of GiB for wasm). Not by default: sanitizer builds
	 * (ASAN maps terabytes of shadow) cannot run under it, and per
	 * process it does not contain a bomb that forks anyway. */
	r->data_set = !lim->memory_cg && lim->memory_given;
	r->data.rlim_cur = r->data.rlim_max = (rlim_t)lim->memory;
	r->core.rlim_cur = r->core.rlim_max = 0;
}

static void size_text(uint64_t v, char *out, size_t n)
{
	if (v >= GiB && v % (GiB / 16) == 0)
		snprintf(out, n, "%.4g GiB", (double)v / (double)GiB);
	else
		snprintf(out, n, "%" PRIu64 " MiB", v >> 20);
}

void sandbox_limits_describe(const struct sandbox_limits *lim, char *out, size_t n)
{
	char mem[32], tmp[32];

	size_text(lim->memory, mem, sizeof(mem));
	size_text(lim->tmp, tmp, sizeof(tmp));
	if (!lim->memory_cg && !lim->memory_given)
		snprintf(mem, sizeof(mem), "unlimited");
	snprintf(out, n, "limits: %" PRIu64 " pids (%s), memory %s (%s), /tmp %s", lim->pids,
		 lim->pids_cg ? "cgroup" : "rlimit", mem,
		 lim->memory_cg	     ? "cgroup"
		 : lim->memory_given ? "rlimit per process"
				     : "no cgroup",
		 tmp);
}

void sandbox_limits_release(struct sandbox_limits *lim)
{
	exec_cgroup_free(lim->cg);
	exec_sys_free(lim->sys);
	lim->cg = NULL;
	lim->sys = NULL;
}
