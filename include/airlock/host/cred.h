/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_CRED_H
#define AIRLOCK_CRED_H

/*
 * cred: the host side of the policy's `credentials` (doc/EXEC.md,
 * doc/CREDENTIALS.md).
 *
 *  - forward_env: the values of the listed names are taken once, from the
 *    `airlock up` daemon's own environment when cred_new runs; a name that
 *    is not set there is not sent.
 *  - inject: each entry {name, scope, ttl_seconds, value_from} is resolved
 *    by running the source command that the user's own configuration file
 *    (cred_config_path: $XDG_CONFIG_HOME/airlock/credentials.json, never
 *    the repository) maps to value_from (or to name when value_from is
 *    unset). The source's stdout, one trailing newline stripped, is the
 *    value. Values are cached in sodium_malloc'd memory until their ttl
 *    expires, then resolved again the next time a command needs them.
 *
 * Values live only in memory: they are never logged, never written to a
 * file, and every copy this module makes is wiped when freed. cred_env()
 * hands out "NAME=value" strings for one command (the `forwarded` layer of
 * exec_env_build), also in wiped memory.
 *
 * Threading: the loop's thread only. Errors: 0 or -errno.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

struct loop;
struct policy_credentials;

#define CRED_CONFIG_MAX	       (256u * 1024u) /* larger credentials.json files are refused */
#define CRED_VALUE_MAX	       (16u * 1024u)  /* a source printing more fails */
#define CRED_TIMEOUT_S_DEFAULT 10	      /* a source running longer is killed and fails */
#define CRED_TIMEOUT_S_MAX     300
#define CRED_TTL_S_DEFAULT     300	       /* inject entries without ttl_seconds */
#define CRED_TTL_S_MAX	       (366u * 86400u) /* longer ttls are cut to this */
#define CRED_SOURCE_ARGS_MAX   256

/* ---- the user's configuration file ---- */

struct cred_config;

/* $XDG_CONFIG_HOME/airlock/credentials.json, or $HOME/.config/... when
 * XDG_CONFIG_HOME is unset or not absolute. -ENOENT when neither is set,
 * -ENAMETOOLONG. */
int cred_config_path(char *out, size_t n);

/* Read and validate a credentials.json: {"sources": {NAME: {"command":
 * [argv...], "timeout_seconds": int}}}. The file must be a regular file
 * owned by the caller's uid and not group- or world-writable, and so must
 * its directory (-EPERM). Unknown keys and wrong types are -EINVAL. On
 * failure err gets one line naming the file, the key and what to do.
 * *out: cred_config_free. */
int cred_config_load(const char *path, struct cred_config **out, char *err, size_t errlen);
void cred_config_free(struct cred_config *cfg); /* NULL is a no-op */

/* The source for a credential name: its argv (NULL-terminated, owned by
 * cfg) and timeout, or NULL when cfg has none. */
const char *const *cred_config_source(const struct cred_config *cfg, const char *name, unsigned *timeout_s);

/* ---- credentials for commands ---- */

struct cred;

struct cred_opts {
	/* NULL = cred_config_path(). */
	const char *config_path;
	/* Clock in ms (monotonic); NULL = loop_now_ms. For tests. */
	uint64_t (*now_ms)(void *ud);
	void *clock_ud;
	/* The workspace (NULL = none): a configuration file that resolves to a
	 * path beneath it is refused, since whoever edits the workspace could
	 * then choose the source commands. */
	const char *workspace;
};

/* pc may be NULL (nothing to forward or inject). Reads forward_env from
 * environ now. The configuration file is read when a source is needed
 * (each time: an edit applies to the next resolution). *out: cred_free. */
int cred_new(struct loop *l, const struct policy_credentials *pc, const struct cred_opts *opts, struct cred **out);
/* Kills running sources, wipes every value. NULL is a no-op. */
void cred_free(struct cred *c);

/* True when the policy injects something (commands may have to wait). */
bool cred_has_inject(const struct cred *c);

/* One command's forwarded environment: n "NAME=value" strings, forward_env
 * first, then inject (a later entry wins in exec_env_build). */
struct cred_env {
	char **v;
	size_t n;
};

/* With inject: when every inject value is cached and unexpired, fill
 * *out (wiped by cred_env_free) and return 0; -EAGAIN when cred_refresh
 * must run first. Without inject: the forward_env entries only, always
 * available. -ENOMEM. */
int cred_env(struct cred *c, bool with_inject, struct cred_env **out);
void cred_env_free(struct cred_env *e); /* wipes; NULL is a no-op */

struct cred_wait;

/* Called once, on the loop (never inside cred_refresh), when no
 * resolution is running any more. err 0: cred_env will succeed now.
 * Otherwise msg says which credential failed and why (no value in it). */
typedef void cred_done_fn(int err, const char *msg, void *ud);

/* Start resolving every inject entry that is missing or expired (those
 * already being resolved are not started twice) and call done when all
 * have finished. *out identifies the wait for cred_wait_cancel; it is
 * invalid after done ran. Errors: -ENOMEM. */
int cred_refresh(struct cred *c, cred_done_fn *done, void *ud, struct cred_wait **out);
/* Forget a wait before its done ran (the resolutions go on). */
void cred_wait_cancel(struct cred_wait *w);

/* Figures for tests: how many source runs were started so far. */
uint64_t cred_resolutions(const struct cred *c);

#endif
