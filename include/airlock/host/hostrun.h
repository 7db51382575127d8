/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_HOSTRUN_H
#define AIRLOCK_HOSTRUN_H

/*
 * hostrun: run one helper program on the host daemon's loop and capture
 * its output, bounded in size and time. Used for credential sources
 * (cred.h) and for the git configuration probe of execution.local
 * (route.h). Built on the command engine (exec.h): no shell, its own
 * process group, an explicit environment, stdin /dev/null, a timeout that
 * kills the group (TERM, 500 ms grace, KILL).
 *
 * stdout is kept in sodium_malloc'd memory (guarded pages, never swapped
 * where mlock works) because it may be a secret, and wiped when the run is
 * freed. stderr keeps only its last HOSTRUN_ERR_TAIL bytes, for error
 * messages.
 *
 * Threading: the loop's thread only. Errors: 0 or -errno.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loop;
struct hostrun;

#define HOSTRUN_ERR_TAIL 512

struct hostrun_result {
	int exit_code;		  /* shell convention: status, 128+N on signal N, 127/126 when execve failed */
	int exec_errno;		  /* errno of a failed execve, else 0 */
	bool timed_out;		  /* the timeout fired and killed it */
	bool too_big;		  /* stdout passed max_out: it was killed, out is cut */
	const unsigned char *out; /* stdout (not NUL-terminated), valid until hostrun_free */
	size_t out_len;
	const char *err_tail; /* last bytes of stderr, NUL-terminated, non-printable bytes as '?' */
};

/* Called once, on the loop, when the program ended (or was killed). The
 * callback may call hostrun_free(h). */
typedef void hostrun_done_fn(struct hostrun *h, const struct hostrun_result *r, void *ud);

struct hostrun_req {
	const char *const *argv; /* argv[0] is searched in envp's PATH when it has no '/' */
	const char *const *envp; /* the complete environment */
	int dir_fd;		 /* working directory, or the root cwd is resolved beneath */
	const char *cwd;	 /* relative to dir_fd, confined to it (exec.h); NULL = dir_fd */
	size_t max_out;		 /* stdout cap (>0) */
	uint64_t timeout_ms;	 /* >0 */
};

/* Start it. On success *out is the caller's (hostrun_free) and done fires
 * exactly once. A program that is not found still starts and ends with 127.
 * Errors: -EINVAL, -ENOMEM, or exec_start's. */
int hostrun_start(struct loop *l, const struct hostrun_req *req, hostrun_done_fn *done, void *ud, struct hostrun **out);

/* Kill it if it still runs (done does not fire then), wipe and free the
 * output. NULL is a no-op. */
void hostrun_free(struct hostrun *h);

#endif
