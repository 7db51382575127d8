/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_ROUTE_H
#define AIRLOCK_ROUTE_H

/*
 * route: the host daemon's relay backend in front of the guest backend.
 * For every exec request it decides where the command runs and what
 * environment it gets (doc/EXEC.md, doc/RELAY.md "Where a command
 * runs", doc/CREDENTIALS.md):
 *
 *  - execution.local: a request whose argv (never a "shell" string) starts
 *    with one of the policy's prefixes (each split on spaces, compared
 *    word by word, exactly) runs on the host, without a shell, in the
 *    workspace (the mounted directory, so its writes are synced), through
 *    the command engine (exec.h), with the scrubbed environment (base +
 *    forward_env + request env, no inject values), only with arguments
 *    route_local_check accepts (git's through the positive model of
 *    gitargs.h, other programs exactly as listed), with git's
 *    command-running configuration disabled (route_git_env) and
 *    GIT_CEILING_DIRECTORIES at the workspace's parent. Its started
 *    event says "where":"host".
 *  - everything else goes to the guest backend, with the forwarded layer
 *    (forward_env + credentials.inject, cred.h) in relay_exec_req. When an
 *    inject value must be resolved first, the command waits (stdin and
 *    signals get `busy`, cancel ends it) and a failing source ends it
 *    with a `credential_failed` error. Nothing ever falls back to the
 *    host: a guest that is down is the guest backend's error.
 *
 * Threading: the loop's thread only. Errors: 0 or -errno.
 */

#include <stdbool.h>
#include <stddef.h>

#include "airlock/server/relay.h"

struct loop;
struct policy;
struct route;
struct gitargs_ws;

struct route_cfg {
	struct loop *loop;
	const struct policy *policy;	       /* execution.local, credentials; must outlive the route */
	const char *workspace;		       /* directory local commands run in (opened by route_new) */
	const struct relay_backend_ops *guest; /* where the rest goes */
	void *guest_ud;
	/* Optional: false when the guest cannot take a command now; such a
	 * command goes straight to the guest backend (which refuses it)
	 * without resolving credentials for it first. */
	bool (*guest_ready)(void *guest_ud);
	const char *cred_config; /* credentials.json path; NULL = cred_config_path() */
};

/* Reads forward_env from environ now (cred_new). *out: route_free.
 * Errors: -ENOMEM, or the errno of opening the workspace. */
int route_new(const struct route_cfg *cfg, struct route **out);
/* Call after relay_free (which releases every command through these ops).
 * Kills anything left, wipes credentials. NULL is a no-op. */
void route_free(struct route *r);

/* The backend to hand to relay_new, with the route as ud. */
extern const struct relay_backend_ops route_backend_ops;

/* Whether argv matches one of the prefixes (policy execution.local). */
bool route_match_local(const char *const *prefixes, size_t nprefixes, const char *const *argv, size_t argc);

/* A request that matched execution.local, before it runs on the host. */
struct route_local_req {
	const char *const *prefixes; /* execution.local, as written */
	size_t nprefixes;
	const char *const *argv;
	size_t argc;
	const char *const *env; /* the request's "NAME=value" entries */
	size_t nenv;
	const struct gitargs_ws *ws; /* where it would run: git's path arguments must stay inside */
};

/* What a matching request may not do on the host: 0, or -EPERM with a
 * one-line reason in why. Request env names outside a small allow-list
 * (LANG, LC_*, TZ, TERM, COLUMNS, LINES, NO_COLOR, CLICOLOR*, FORCE_COLOR,
 * GIT_AUTHOR_* and GIT_COMMITTER_* NAME, EMAIL, DATE) are refused: PATH, LD_*,
 * HOME, GIT_* and the like would let the client run other code; so are
 * values that are paths (a locale or TERM with '/', a TZ that is absolute
 * or climbs with '..', COLUMNS/LINES that are not numbers). git (argv[0]
 * named git) must be inside the positive model of gitargs.h; any other
 * program runs only as exactly one of the prefixes, with nothing after. */
int route_local_check(const struct route_local_req *q, char *why, size_t n);

/* The environment entries that disable git's command-running
 * configuration, given the output of `git config --list -z` in the
 * command's directory (NULL/0: only the fixed part). *out is a
 * NULL-terminated array of "NAME=value" (route_git_env_free), *n its
 * length. Errors: -ENOMEM, -E2BIG (more than 4096
 * overrides), -EPERM (the configuration sets core.worktree: git's work
 * tree would be wherever it points, which no override can undo). */
int route_git_env(const char *config_z, size_t len, char ***out, size_t *n);
void route_git_env_free(char **v, size_t n); /* NULL is a no-op */

#endif
