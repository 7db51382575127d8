/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_EXEC_H
#define AIRLOCK_EXEC_H

/*
 * exec: the guest agent's command engine (doc/EXEC.md). Runs one command
 * per struct exec on a loop (loop.h): its own process group (pipes) or
 * session with a controlling terminal (tty), confined cwd, an explicit
 * environment, an optional unprivileged uid, resource limits, and (where
 * the kernel lets us) its own cgroup so that a timeout or a cancel kills
 * the whole tree, including processes that called setsid or
 * double-forked. Output is delivered in chunks of at most EXEC_CHUNK bytes
 * straight from one read buffer per command: nothing is queued, so memory is
 * bounded whatever the command prints, and exec_pause_output() pushes back
 * on the command's pipe (the channel's credit windows plug in there).
 *
 * Threading: everything runs on the loop's thread. Callbacks may call any
 * exec_* function on any command, including exec_free() on the command whose
 * callback is running.
 *
 * Errors: 0 or -errno. A call that fails fires no callback.
 *
 * SIGPIPE: stdin is a pipe; the process using this module must ignore
 * SIGPIPE (the agent does) so a command that closes its stdin early makes
 * exec_write_stdin() fail with -EPIPE rather than kill the agent.
 *
 * See doc/EXEC.md for the lifecycle, the kill-tree rules and what applies
 * when cgroup v2 is missing.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

struct loop;
struct exec;
struct exec_sys;

/* Largest chunk on_output ever delivers. */
#define EXEC_CHUNK (64 * 1024)
/* Default and largest stdin buffer (bytes accepted but not yet written). */
#define EXEC_STDIN_BUF_DEFAULT (64 * 1024)
#define EXEC_STDIN_BUF_MAX     (1024 * 1024)
/* Default grace between SIGTERM and SIGKILL on timeout/cancel. */
#define EXEC_GRACE_MS_DEFAULT 2000
/* Default time output may stay open after the main process exited (a
 * descendant holding the pipe) before the tree is killed. */
#define EXEC_DRAIN_MS_DEFAULT 500
/* After a read that emptied a command's output pipe, how long that pipe is
 * not read again, so a command printing line by line is delivered in
 * chunks of many lines (exec_req.hold_ms; doc/EXEC.md "Output"). */
#define EXEC_HOLD_MS_DEFAULT 2
#define EXEC_HOLD_NONE	     ((uint32_t)-1)
/* "Do not change uid/gid". */
#define EXEC_ID_KEEP ((uint32_t)-1)

/* ---- system context: cgroup discovery, done once per agent ---- */

enum exec_cgroup_mode {
	EXEC_CGROUP_AUTO = 0, /* use cgroups when present and writable */
	EXEC_CGROUP_OFF,      /* never: process-group kills only */
	EXEC_CGROUP_REQUIRE,  /* exec_sys_new fails (-ENOTSUP) without a writable cgroup v2 */
};

struct exec_sys_cfg {
	enum exec_cgroup_mode cgroup;
	/* Name of the parent cgroup created under the agent's own cgroup;
	 * NULL = "airlock-exec.<agent pid>". A single path component. */
	const char *cgroup_name;
	/* Create the parent at the top of each hierarchy (as this mount
	 * namespace sees it) instead of under our own cgroup: for root whose
	 * own v2 cgroup holds processes (a systemd session scope), where no
	 * controller can be enabled below it. */
	bool top_level;
};

/* What exec_sys_new found (bit flags, see exec_sys_caps). */
enum {
	EXEC_CAP_CG2 = 1 << 0,	      /* own cgroup v2 per command (tree tracking) */
	EXEC_CAP_CG2_KILL = 1 << 1,   /* cgroup.kill present (kernel >= 5.14) */
	EXEC_CAP_CG2_PIDS = 1 << 2,   /* pids.max in v2 */
	EXEC_CAP_CG2_MEMORY = 1 << 3, /* memory.max in v2 */
	EXEC_CAP_CG1_PIDS = 1 << 4,   /* pids.max in a v1 pids hierarchy (hybrid hosts) */
	EXEC_CAP_CG1_MEMORY = 1 << 5, /* memory.limit_in_bytes in a v1 memory hierarchy */
};

/* Probe /proc/self/mountinfo and /proc/self/cgroup, create the parent
 * cgroup(s) and enable the pids/memory controllers for its children where
 * the hierarchy allows (a non-root cgroup that holds the agent itself cannot
 * enable controllers: "no internal processes"; then only tracking and kill
 * are available). Never fails for a missing capability in AUTO mode.
 * *out is owned by the caller: exec_sys_free(). cfg may be NULL.
 * Errors: -ENOMEM; -ENOTSUP (REQUIRE and no writable cgroup v2). */
int exec_sys_new(const struct exec_sys_cfg *cfg, struct exec_sys **out);
/* Removes the parent cgroups (they must be empty: free every exec first).
 * NULL is a no-op. */
void exec_sys_free(struct exec_sys *sys);
/* EXEC_CAP_* flags; 0 for NULL. */
unsigned exec_sys_caps(const struct exec_sys *sys);
/* Human-readable one-line summary of the capabilities, for logs/status. */
const char *exec_sys_describe(const struct exec_sys *sys);

/* ---- a cgroup for a process tree started elsewhere ----
 *
 * The leaves exec_start makes for a command (a v2 leaf, v1 pids/memory
 * leaves on hybrid hosts) with its limits (pids.max; memory.max with
 * memory.swap.max 0, or v1 memory.limit_in_bytes and memsw), for a tree
 * the caller starts itself: the local sandbox puts its whole namespace
 * in one (doc/SANDBOX.md, "Limits"). */

struct exec_cgroup;
struct exec_limits;

#define EXEC_CGROUP_PIDS   1u
#define EXEC_CGROUP_MEMORY 2u

/* Create one under sys with lim's limits (only the limits sys can
 * enforce: see exec_cgroup_limits). An empty one (nothing tracked) when
 * sys has no cgroup. *out: exec_cgroup_free. Errors: -errno of mkdir /
 * writing a limit, -ENOMEM. */
int exec_cgroup_new(struct exec_sys *sys, const struct exec_limits *lim, struct exec_cgroup **out);
/* Move pid (and so what it forks from then on) into it. 0 or -errno. */
int exec_cgroup_attach(struct exec_cgroup *cg, pid_t pid);
/* EXEC_CGROUP_PIDS | EXEC_CGROUP_MEMORY: the limits it enforces; 0 for
 * NULL. */
unsigned exec_cgroup_limits(const struct exec_cgroup *cg);
/* Its v2 directory (else its v1 pids one), or NULL. */
const char *exec_cgroup_dir(const struct exec_cgroup *cg);
/* SIGKILL to what is left in it, rmdir, free. NULL is a no-op. */
void exec_cgroup_free(struct exec_cgroup *cg);

/* ---- environment ---- */

struct exec_env_in {
	/* Base values; NULL = the default shown. */
	const char *path; /* "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin" */
	const char *home; /* "/tmp" */
	const char *lang; /* "C.UTF-8" */
	const char *term; /* "xterm-256color"; only used when tty */
	bool tty;
	/* "NAME=value" entries, applied in this order, a later entry replacing
	 * an earlier one of the same name: base, then forwarded (policy
	 * forward_env and credentials.inject, composed by the caller), then
	 * request (the exec request's env). */
	const char *const *forwarded;
	size_t n_forwarded;
	const char *const *request;
	size_t n_request;
	/* Cap on the sum of strlen+1 of all entries; 0 = EXEC_ENV_MAX_BYTES. */
	size_t max_bytes;
};

#define EXEC_ENV_MAX_BYTES (256 * 1024)
#define EXEC_ENV_NAME_MAX  255

/* Build a NULL-terminated envp from in. Nothing comes from the agent's own
 * environ. Names must match [A-Za-z_][A-Za-z0-9_]* and be at most
 * EXEC_ENV_NAME_MAX long; every entry needs a '='.
 * On success *out is a new array (free with exec_env_free).
 * Errors: -EINVAL (bad entry: *bad, when bad is not NULL, points at it, in
 * the caller's memory), -E2BIG (over the size cap; *bad = the entry that
 * crossed it), -ENOMEM. */
int exec_env_build(const struct exec_env_in *in, char ***out, const char **bad);
/* NULL is a no-op. */
void exec_env_free(char **envp);

/* ---- confinement (the local sandbox, doc/SANDBOX.md) ----
 *
 * Commands and the agent share a uid inside the local sandbox; these close
 * what that leaves open. Landlock: commands may read everything except the
 * `hidden` hierarchies (the agent's keys, state and socket), and write only
 * beneath `writable`. seccomp: ptrace, process_vm_readv/writev, new user
 * namespaces (unshare/clone with CLONE_NEWUSER; clone3 answers ENOSYS so
 * libcs fall back to clone), bpf, perf_event_open, keyctl/add_key/
 * request_key, kexec, module loading, userfaultfd and the mount family fail
 * with EPERM; io_uring_setup/enter/register with ENOSYS; socket and
 * socketpair of any family but AF_UNIX, AF_INET, AF_INET6 and AF_NETLINK
 * with NETLINK_ROUTE with EAFNOSUPPORT (AF_VSOCK ignores network
 * namespaces). Both need no privilege (no_new_privs is set in the child). */

struct exec_confine;

struct exec_confine_cfg {
	/* NULL-terminated absolute paths. writable: every right beneath.
	 * hidden: neither read nor write (a hidden path beneath a writable
	 * one is not hidden: Landlock rules only add). Directory listing is
	 * allowed everywhere (names are not secret; contents are). */
	const char *const *writable;
	const char *const *hidden;
	/* -ENOTSUP when Landlock is missing (seccomp is always there). */
	bool require_landlock;
	/* RLIMIT_FSIZE of commands (the largest file they may write); 0:
	 * left as it is. The agent itself keeps its own (it writes the
	 * host's files, whatever their size). */
	uint64_t file_max;
};

/* Build the Landlock ruleset (an fd kept in *out) and the seccomp program
 * once, in the agent; exec_start applies them in each command's child.
 * *out: exec_confine_free. Errors: -ENOTSUP (require_landlock and no
 * Landlock), -ENOENT (a writable path is missing), -ENOMEM; err says
 * which. */
int exec_confine_new(const struct exec_confine_cfg *cfg, struct exec_confine **out, char *err, size_t errlen);
/* NULL is a no-op. */
void exec_confine_free(struct exec_confine *c);
/* "landlock ABI 6 (fs, signal scope), seccomp (27 syscalls, ... denied)". */
const char *exec_confine_describe(const struct exec_confine *c);
/* In a child right before execve: RLIMIT_FSIZE (file_max), no_new_privs,
 * Landlock, seccomp. Async-signal-safe. 0 or -errno. */
int exec_confine_apply(const struct exec_confine *c);

/* ---- one command ---- */

struct exec_limits {
	/* Most tasks in the command's tree (cgroup pids.max, v2 or v1). With
	 * no pids cgroup it falls back to RLIMIT_NPROC, which only bounds a
	 * command that runs as a dedicated non-root uid (the count is per uid,
	 * shared by all commands of that uid). 0 = no limit. */
	uint32_t pids_max;
	/* Bytes of memory for the tree (cgroup memory.max, v2 or v1); with no
	 * memory cgroup, RLIMIT_AS per process. 0 = no limit. */
	uint64_t memory_max;
	/* Explicit RLIMIT_NPROC (per uid, see above); 0 = leave as is. */
	uint64_t nproc;
};

struct exec_req {
	/* Exactly one of argv (argv[0] searched in the env's PATH when it has
	 * no '/') or shell (run as /bin/sh -c shell). Borrowed for the call. */
	const char *const *argv;
	const char *shell;
	/* Workspace root (a directory fd the caller keeps) and cwd relative to
	 * it; NULL or "" = the root. Resolved with openat2 RESOLVE_BENEATH |
	 * RESOLVE_NO_MAGICLINKS: "..", absolute paths and symlinks that leave
	 * the root are refused with -EXDEV. */
	int root_fd;
	const char *cwd;
	/* The complete environment (see exec_env_build); NULL = empty. */
	const char *const *envp;
	/* 0 = no timeout. On expiry: SIGTERM to the tree, grace_ms, SIGKILL. */
	uint64_t timeout_ms;
	uint32_t grace_ms; /* 0 = EXEC_GRACE_MS_DEFAULT */
	uint32_t drain_ms; /* 0 = EXEC_DRAIN_MS_DEFAULT */
	/* 0 = EXEC_HOLD_MS_DEFAULT; EXEC_HOLD_NONE: every read at once. The
	 * first bytes after a quiet spell, a full chunk and the output left at
	 * the main process's exit are never held. */
	uint32_t hold_ms;
	/* tty: one pty, stdout and stderr merged into stream 1, stdin is the
	 * terminal. Otherwise three pipes (stdin /dev/null unless stdin). */
	bool tty;
	uint16_t rows, cols;
	bool stdin_open;
	size_t stdin_buf; /* 0 = EXEC_STDIN_BUF_DEFAULT; capped at EXEC_STDIN_BUF_MAX */
	/* Run as uid/gid (supplementary groups reset to gid alone) when the
	 * agent is root; EXEC_ID_KEEP = run as the agent. A non-root agent
	 * always runs commands as itself and ignores these. */
	uint32_t uid, gid;
	struct exec_limits limits;
	/* Landlock + seccomp applied in the child right before execve (see
	 * exec_confine_new); NULL = none. Borrowed: must outlive the call. */
	const struct exec_confine *confine;
};

struct exec_result {
	pid_t pid;
	/* Shell convention: the exit status, or 128+signal when killed by a
	 * signal, or 127 (not found) / 126 (not executable) when execve failed.
	 * The relay maps timed_out to 124 itself. */
	int exit_code;
	int signal;	/* signal that killed the main process, else 0 */
	int exec_errno; /* errno of a failed execve (ENOENT, EACCES, ...), else 0 */
	bool timed_out;
	bool canceled;
	bool core_dumped;
	/* The tree was killed after the main process exited because a
	 * descendant kept the output open past drain_ms. */
	bool lingering_killed;
	uint64_t duration_ms;
	uint64_t stdout_bytes, stderr_bytes;
};

struct exec_ops {
	/* stream 1 = stdout (or the pty), 2 = stderr; 1..EXEC_CHUNK bytes,
	 * valid only during the call. Required. */
	void (*on_output)(struct exec *e, int stream, const void *data, size_t n, void *ud);
	/* Once per successful exec_start, after the main process exited, both
	 * streams reached EOF (or were cut off, see lingering_killed) and what
	 * remained of the tree was killed. The exec stays valid until
	 * exec_free. Required. */
	void (*on_exit)(struct exec *e, const struct exec_result *r, void *ud);
	/* Room in the stdin buffer again after a write was refused or short.
	 * Optional. */
	void (*on_stdin_writable)(struct exec *e, void *ud);
};

/* Start a command. Blocks only for fork and the child's setup up to
 * execve (it waits on a CLOEXEC error pipe so setup failures come back
 * here). sys may be NULL (no cgroups). On success *out is owned by the
 * caller (exec_free) and on_exit will be called exactly once.
 * A command that is not found / not executable still starts successfully
 * and exits with 127 / 126 (exec_errno says why).
 * Errors: -EINVAL (bad request), -EXDEV (cwd escapes the root), -ENOENT /
 * -ENOTDIR / -EACCES (cwd), -EPERM (setuid/setgid failed), -ENOMEM, or the
 * errno of the first setup step that failed in the child (cgroup join,
 * tty, limits). No child is left behind on error. */
int exec_start(struct loop *loop, struct exec_sys *sys, const struct exec_req *req, const struct exec_ops *ops,
	       void *ud, struct exec **out);

/* Kill anything still running (SIGKILL to the cgroup / process group), reap
 * the main process (a blocking waitpid right after SIGKILL, which is
 * immediate unless the process is stuck in the kernel), close every fd,
 * remove the cgroup, free. A cgroup whose processes are still dying is
 * swept by exec_sys_free. NULL is a no-op. */
void exec_free(struct exec *e);

/* Send sig to the command's process group (tty: the terminal's foreground
 * process group, as a keyboard signal would). Processes that left the group
 * (setsid) are not reached: only timeout, cancel and the end of the command
 * kill the whole tree. -ESRCH after the command finished or when the group
 * is gone. */
int exec_signal(struct exec *e, int sig);
/* SIGTERM to the tree, grace, SIGKILL; the result says canceled. Idempotent.
 * -ESRCH after the command finished. */
int exec_cancel(struct exec *e);

/* Stop (true) / resume reading output. While paused the command blocks
 * once its pipe buffer fills; on_exit waits until output is resumed and
 * drained. */
void exec_pause_output(struct exec *e, bool pause);

/* Queue bytes for the command's stdin. Returns how many were accepted
 * (possibly fewer than n, then on_stdin_writable fires later), -EAGAIN when
 * the buffer is full, -EPIPE when the command closed its stdin or exited,
 * -EBADF when stdin is off or was closed. */
ssize_t exec_write_stdin(struct exec *e, const void *data, size_t n);
/* Close stdin once the buffer has drained (tty: send the terminal's EOF
 * character, which a program in canonical mode reads as end of file). */
int exec_close_stdin(struct exec *e);
/* tty only: TIOCSWINSZ, which sends SIGWINCH to the foreground group.
 * -ENOTTY for pipes. */
int exec_resize(struct exec *e, uint16_t rows, uint16_t cols);

pid_t exec_pid(const struct exec *e);
/* Path of the command's v2 cgroup directory, or NULL when it has none. */
const char *exec_cgroup_path(const struct exec *e);

#endif
