/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_EGRESS_LINK_H
#define AIRLOCK_EGRESS_LINK_H

/*
 * egress_link: the host daemon's end of the sandbox's only way out
 * (doc/EGRESS.md "Reaching the proxy"). It owns one egress proxy
 * (egress.h) built from the policy's egress.allow, and joins it to the
 * channel: every PROXY_OPEN the guest sends on a new (even) stream names
 * the exec stream of the command that connected; the link makes a
 * socketpair, hands one end to the proxy with egress_adopt (the command's
 * description as client identity) and pumps the other end over the stream
 * with a tunnel (tunnel.h), with backpressure both ways.
 *
 * Every denial is
 *   - appended to the workspace's audit file egress.json (audit.h): the
 *     newest EGRESS_LINK_KEEP records, a total, atomic writes, at most one
 *     write per EGRESS_LINK_WRITE_MS (pending records are written by a
 *     timer and by egress_link_free);
 *   - one line on the stderr events of the command it belongs to, when it
 *     still runs: "airlock: egress denied CONNECT evil.test:443
 *     (not-allowed: host not on egress.allow in POLICY)".
 *
 * Limits (wire.h): WIRE_PROXY_PER_CMD streams per command and
 * WIRE_PROXY_PER_SESSION per session (refused with PROXY_CLOSE LIMIT), a
 * PROXY_OPEN for a command that is not running is refused with NO_CMD;
 * and the proxy's own max_conns (503).
 *
 * Threading: the loop's thread. Errors: 0 or -errno.
 */

#include <stddef.h>
#include <stdint.h>

struct chan;
struct loop;
struct policy;
struct relay_cmd;
struct egress_link;

#define EGRESS_LINK_KEEP     1000u /* denial records kept in egress.json */
#define EGRESS_LINK_WRITE_MS 100u  /* egress.json written at most this often */
#define EGRESS_LINK_DESC_MAX 256u  /* command description, with its NUL */

struct egress_link_ops {
	/* The command running on exec stream exec_stream of the current
	 * session and its description (egress_link_describe), or NULL when no
	 * command runs there. Required. */
	struct relay_cmd *(*find_cmd)(void *ud, uint32_t exec_stream, const char **desc);
	/* The figures of egress_link_get_stats changed (a stream opened or
	 * ended, a denial). Optional. */
	void (*on_change)(void *ud);
};

struct egress_link_cfg {
	const struct policy *policy; /* egress.allow, and its source for messages; must outlive the link */
	const char *workspace;	     /* audit_write_json's dir: the workspace's real path */
};

/* Start the proxy (resolver threads) on l. Earlier denials in egress.json
 * are kept (read once here). err gets one line on failure. */
int egress_link_new(struct loop *l, const struct egress_link_cfg *cfg, const struct egress_link_ops *ops, void *ud,
		    struct egress_link **out, char *err, size_t errlen);

/* Write pending denials, close every tunnel and the proxy. NULL: no-op. */
void egress_link_free(struct egress_link *k);

/* A session is ready on c: PROXY_OPENs are accepted from it. */
void egress_link_attach(struct egress_link *k, struct chan *c);

/* The session's chan is going away (call before chan_free): its tunnels
 * are dropped without frames; the proxy sees their sockets close. */
void egress_link_detach(struct egress_link *k);

/* A PROXY_* frame from the guest. -EPROTO when the guest broke the
 * protocol (an odd or reused stream in PROXY_OPEN, a frame for a stream
 * that was never opened, a tunnel violation): drop the session. */
int egress_link_frame(struct egress_link *k, uint8_t type, uint32_t stream, const uint8_t *p, size_t n);

/* chan's on_writable. */
void egress_link_writable(struct egress_link *k);

/* "ID argv..." for audit records, shell-quoted where needed and cut to
 * fit n bytes (at most EGRESS_LINK_DESC_MAX is useful). */
void egress_link_describe(const char *id, const char *const *argv, size_t argc, char *out, size_t n);

struct egress_link_stats {
	size_t tunnels;	    /* open streams, refused ones included until closed */
	size_t proxy_conns; /* connections the proxy has open */
	uint64_t opened;    /* PROXY_OPENs accepted */
	uint64_t refused;   /* PROXY_OPENs refused (limits, no command) */
	uint64_t denials;   /* denials this run */
};
void egress_link_get_stats(const struct egress_link *k, struct egress_link_stats *st);

#endif
