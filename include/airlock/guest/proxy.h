/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_PROXY_H
#define AIRLOCK_PROXY_H

/*
 * proxy: the guest agent's end of the egress path (doc/EGRESS.md
 * "Reaching the proxy", doc/PROTOCOL.md "Proxy").
 *
 * For every command started with WIRE_EXEC_F_PROXY the agent opens a
 * listener on 127.0.0.1, port 0, and points the command's proxy variables
 * at it (proxy_env). Each connection accepted there becomes one
 * guest-opened channel stream (PROXY_OPEN naming the command's exec
 * stream) pumped by a tunnel (tunnel.h) to the host, where the egress
 * proxy decides. Nothing here resolves or connects anywhere: the guest
 * needs no route and no DNS.
 *
 * Limits: WIRE_PROXY_PER_CMD connections per command and
 * WIRE_PROXY_PER_SESSION per session; a connection over either is closed
 * at once (reset). When a command ends its listener closes; connections
 * still open get PROXY_LINGER_MS to finish, then they are reset.
 *
 * One struct proxy per channel session. Threading: the loop's thread.
 * Errors: 0 or -errno.
 */

#include <stddef.h>
#include <stdint.h>

struct chan;
struct loop;
struct proxy;

#define PROXY_LINGER_MS 10000u
#define PROXY_ENV_COUNT 14u /* entries proxy_env makes */

/* The session's proxy state over chan c (which must outlive it). */
int proxy_new(struct loop *l, struct chan *c, struct proxy **out);

/* The session ended: close listeners and sockets, send nothing.
 * NULL is a no-op. */
void proxy_free(struct proxy *p);

/* Listen for the command on exec stream exec_stream; *port gets the port
 * on 127.0.0.1. -EEXIST when that command already has one, -errno from
 * socket/bind/listen, -ENOMEM. */
int proxy_cmd_start(struct proxy *p, uint32_t exec_stream, uint16_t *port);

/* The command ended: stop accepting, give its open connections
 * PROXY_LINGER_MS. Unknown streams are ignored. */
void proxy_cmd_end(struct proxy *p, uint32_t exec_stream);

/* The environment entries that send a command's traffic to port:
 * HTTP_PROXY, HTTPS_PROXY, ALL_PROXY and their lower-case forms,
 * NO_PROXY/no_proxy (loopback only), npm_config_proxy,
 * npm_config_https_proxy, PIP_PROXY, and git's http.proxy through
 * GIT_CONFIG_COUNT/KEY_0/VALUE_0. *out gets PROXY_ENV_COUNT strings
 * "NAME=value" and a NULL (free with proxy_env_free). 0 or -ENOMEM. */
int proxy_env(uint16_t port, char ***out);
void proxy_env_free(char **env);

/* A PROXY_* frame from the host. -EPROTO when it breaks the protocol
 * (PROXY_OPEN from the host, a stream that is not one of ours, a tunnel
 * error): the agent drops the session. */
int proxy_frame(struct proxy *p, uint8_t type, uint32_t stream, const uint8_t *data, size_t n);

/* chan's on_writable: let waiting tunnels send. */
void proxy_writable(struct proxy *p);

/* Open tunnels (for tests and logs). */
size_t proxy_tunnels(const struct proxy *p);

#endif
