/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_EGRESS_H
#define AIRLOCK_EGRESS_H

/*
 * egress: the host-side HTTP/HTTPS-CONNECT forward proxy that is the
 * sandbox's only way out (prose in doc/EGRESS.md).
 *
 * It runs on a struct loop (single thread, non-blocking). Names are
 * resolved by a small bounded pool of resolver threads that hand results
 * back through an eventfd registered on the loop (loop_set_wake is left to
 * the loop's owner). Every resolved address is checked and the proxy
 * connects only to a checked address, so there is no second resolution a
 * DNS answer could rebind.
 *
 * Decisions (see doc/EGRESS.md for why):
 *   - an allow entry without ":port" allows ports 80 and 443 only;
 *   - IP literals in any spelling (dotted, integer, octal, hex, IPv6,
 *     bracketed) are refused whatever the allow list says;
 *   - a name is refused when ANY of its addresses is not public, is a
 *     cloud metadata or provider-service address (egress_metadata_addrs),
 *     or is an address of one of the host's own interfaces (read with
 *     getifaddrs in the resolver thread for every lookup, so an address
 *     added while the proxy runs counts at once);
 *   - CONNECT: the first client bytes must be a TLS ClientHello whose SNI
 *     equals the CONNECT host. A non-TLS stream is tunnelled only when the
 *     allow entry that matched names that port explicitly ("host:22");
 *     a ClientHello without SNI is always refused;
 *   - plain HTTP: one request per upstream connection (Connection: close).
 *
 * Every refusal is reported once through ops->on_denial and answered with
 * "403 Forbidden" and a one-line text/plain body "airlock egress: denied
 * METHOD HOST:PORT: REASON". A refusal after a CONNECT tunnel was
 * established (SNI checks) cannot be an HTTP response any more: the client
 * gets a TLS access_denied alert and the connection is closed.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "airlock/core/loop.h"
#include "airlock/policy/policy.h"

/* Hard limits (bytes / counts). */
#define EGRESS_HEAD_MAX	   16384u /* request line + headers, checked before allocation */
#define EGRESS_HEADERS_MAX 100u	  /* header fields in one request */
#define EGRESS_HELLO_MAX   16384u /* buffered ClientHello (raw TLS records) */
#define EGRESS_BUF_MAX	   65536u /* per connection, each direction */
#define EGRESS_HOST_MAX	   253u	  /* host name without trailing dot */
#define EGRESS_ADDRS_MAX   16u	  /* addresses kept per resolved name */

/* Why a request was refused. egress_reason_name() gives the stable
 * kebab-case name used in audit records. */
enum egress_reason {
	EGRESS_NOT_ALLOWED = 1,	 /* host not on egress.allow */
	EGRESS_PORT_NOT_ALLOWED, /* host listed, but not for this port */
	EGRESS_IP_LITERAL,	 /* an address instead of a name */
	EGRESS_PRIVATE_ADDRESS,	 /* resolved to a non-public address (detail: the address) */
	EGRESS_METADATA,	 /* cloud metadata name or address */
	EGRESS_SNI_MISMATCH,	 /* detail: the SNI the client sent */
	EGRESS_NO_SNI,		 /* TLS ClientHello without server_name */
	EGRESS_NOT_TLS,		 /* non-TLS bytes in a tunnel that requires TLS */
	EGRESS_BAD_REQUEST,	 /* malformed or unsupported request (detail says what) */
	EGRESS_HOST_ADDRESS,	 /* resolved to an address of the host's own interfaces (detail: the address) */
};
const char *egress_reason_name(enum egress_reason r);

/* One refusal. All strings are valid only during the callback. */
struct egress_denial {
	uint64_t time_ms;   /* wall clock, milliseconds since the epoch */
	const char *client; /* identity the listener (or egress_adopt) was given */
	uint64_t client_id; /* egress_adopt's client_id; 0 for listener connections */
	const char *method; /* "CONNECT", "GET", ...; "" when unparsable */
	const char *host;   /* normalised requested host; "" when unparsable */
	uint16_t port;	    /* 0 when unparsable */
	enum egress_reason reason;
	const char *detail;  /* address, SNI, parse error; "" when none */
	const char *message; /* the line sent to the client, without newline */
};

struct egress_ops {
	/* Called on the loop thread for every refusal. May be NULL. */
	void (*on_denial)(void *ud, const struct egress_denial *d);
};

struct egress_cfg {
	/* egress.allow (policy_egress()->allow). Copied by egress_new. */
	const struct policy_host *allow;
	size_t n_allow;
	/* TEST HOOK: resolve names from this hosts(5)-style file ("ADDRESS
	 * NAME..." lines, '#' comments) instead of getaddrinfo. A name that is
	 * not in the table does not resolve. NULL in production. */
	const char *hosts_file;
	/* TEST ONLY: CIDRs ("127.0.0.2/32", "10.9.0.0/16", "fd00:1::/64")
	 * whose addresses are treated as public. Never set in production:
	 * this is how tests reach upstream servers on loopback or in a
	 * network namespace. Metadata addresses and the host's own
	 * addresses are refused regardless. */
	const char *const *allow_private_cidrs;
	size_t n_allow_private_cidrs;
	unsigned max_conns;	     /* 0 = 256 */
	unsigned resolver_threads;   /* 0 = 4 */
	unsigned head_timeout_ms;    /* request head must arrive within; 0 = 30 s */
	unsigned connect_timeout_ms; /* resolve + connect; 0 = 10 s */
	unsigned idle_timeout_ms;    /* no bytes either way; 0 = 300 s */
};

struct egress;

/* A proxy on loop l (which must outlive it). Starts the resolver threads.
 * Returns 0, -EINVAL (bad cfg; one line in err naming the field), -ENOMEM,
 * or -errno (threads, eventfd, reading hosts_file). */
int egress_new(struct loop *l, const struct egress_cfg *cfg, const struct egress_ops *ops, void *ud,
	       struct egress **out, char *err, size_t errlen);

/* Listen on a Unix socket at path (an existing socket file there is
 * replaced; the mode follows the umask). client is the identity reported
 * in denials for connections accepted here (copied). 0 or -errno. */
int egress_listen_unix(struct egress *e, const char *path, const char *client);

/* Listen on TCP addr:port (addr a numeric address, normally "127.0.0.1";
 * port 0 picks one). *bound (may be NULL) gets the port. 0 or -errno. */
int egress_listen_tcp(struct egress *e, const char *addr, uint16_t port, const char *client, uint16_t *bound);

/* Take fd, a connected stream socket (e.g. one end of a socketpair whose
 * other end is pumped over the channel), as one client connection, exactly
 * as if a listener had accepted it. client (copied) and client_id are
 * reported in its denials, so the caller can tell which command a refusal
 * belongs to. fd is owned by the proxy from the call on, whatever the
 * result (made non-blocking here). 0; -EBUSY when max_conns connections
 * are open (the client got "503" and fd is closed); -EINVAL; -ENOMEM. */
int egress_adopt(struct egress *e, int fd, const char *client, uint64_t client_id);

/* Connections currently open (for tests and status). */
size_t egress_conn_count(const struct egress *e);

/* Close listeners and connections, stop and join the resolver threads
 * (waits for lookups in flight), unlink Unix socket files. NULL is a no-op. */
void egress_free(struct egress *e);

/* ---- building blocks (pure; exposed for tests and the audit tooling) ---- */

/* Normalise a requested host name into out (EGRESS_HOST_MAX + 1 bytes):
 * lower-case, one trailing dot removed. Returns 0, EGRESS_IP_LITERAL when it
 * is an address in any spelling (IPv6 with or without brackets, dotted
 * quad, "127.1", 2130706433, 0x7f.1, 0177.0.0.1: any name whose last label
 * is numeric, as the WHATWG URL parser decides), or EGRESS_BAD_REQUEST
 * (empty, too long, characters other than letters, digits, '-', '_', '.',
 * empty or over-long labels). */
int egress_host_normalise(const char *host, size_t len, char *out);

/* Whether normalised host:port is allowed. Returns 0 and sets *which (may
 * be NULL) to the matching entry, or EGRESS_NOT_ALLOWED / EGRESS_PORT_NOT_ALLOWED.
 * "name" matches only name; "*.name" only proper subdomains of name; an
 * entry without a port allows 80 and 443. */
int egress_allow_match(const struct policy_host *allow, size_t n, const char *host, uint16_t port,
		       const struct policy_host **which);

/* Address classes; EGRESS_ADDR_PUBLIC is the only one the proxy connects to. */
enum egress_addr_class {
	EGRESS_ADDR_PUBLIC = 0,
	EGRESS_ADDR_UNSPECIFIED,
	EGRESS_ADDR_LOOPBACK,
	EGRESS_ADDR_PRIVATE,	   /* 10/8, 172.16/12, 192.168/16, fc00::/7, fec0::/10 */
	EGRESS_ADDR_LINK_LOCAL,	   /* 169.254/16, fe80::/10 */
	EGRESS_ADDR_CGNAT,	   /* 100.64/10 */
	EGRESS_ADDR_MULTICAST,	   /* 224/4, ff00::/8 */
	EGRESS_ADDR_BROADCAST,	   /* 255.255.255.255 */
	EGRESS_ADDR_RESERVED,	   /* 0/8, 240/4, 192.0.0/24, 198.18/15, non-2000::/3 ... */
	EGRESS_ADDR_DOCUMENTATION, /* 192.0.2/24, 198.51.100/24, 203.0.113/24, 2001:db8::/32, 3fff::/20 */
	EGRESS_ADDR_METADATA,	   /* egress_metadata_addrs(): 169.254.169.254, fd00:ec2::254, 168.63.129.16 ... */
};
const char *egress_addr_class_name(enum egress_addr_class c);

/* Classify an AF_INET or AF_INET6 socket address. IPv6 forms that embed an
 * IPv4 address (mapped ::ffff:0:0/96, compatible ::/96, NAT64 64:ff9b::/96,
 * 6to4 2002::/16, Teredo 2001::/32 server and client) take the class of
 * the embedded address when that is not public. Other families: RESERVED. */
enum egress_addr_class egress_addr_classify(const struct sockaddr *sa);

/* The cloud metadata and provider-service addresses (doc/EGRESS.md has
 * the table): classified EGRESS_ADDR_METADATA, also inside the IPv6
 * forms that embed an IPv4 address. A static table; *n its length. */
struct egress_metadata_addr {
	const char *addr; /* numeric, IPv4 or IPv6 */
	const char *what; /* whose service it is */
};
const struct egress_metadata_addr *egress_metadata_addrs(size_t *n);

/* The 16-byte forms under which sa is compared with the host's own
 * addresses: the address itself (an IPv4 one as ::ffff:a.b.c.d) and, for
 * an IPv6 address that embeds an IPv4 one (mapped, compatible, NAT64,
 * 6to4, the Teredo server), that IPv4 address as ::ffff:a.b.c.d. Returns
 * how many were written to out (0 for other families). */
#define EGRESS_ADDR_FORMS_MAX 2
size_t egress_addr_forms(const struct sockaddr *sa, uint8_t out[EGRESS_ADDR_FORMS_MAX][16]);

/* A parsed request head. Pointers point into the bytes given to
 * egress_parse_request and live as long as they do. */
struct egress_header {
	const char *name, *value;
	size_t name_len, value_len;
};
struct egress_request {
	char method[17];
	bool connect;
	char host[EGRESS_HOST_MAX + 1]; /* normalised */
	uint16_t port;
	const char *path; /* origin-form target for plain HTTP ("/" when empty) */
	size_t path_len;
	const char *version; /* "HTTP/1.1" or "HTTP/1.0" */
	struct egress_header headers[EGRESS_HEADERS_MAX];
	size_t n_headers;
	size_t head_len; /* bytes of request line + headers + blank line */
};

/* Parse a proxy request head from p[0..n). Returns 1 when complete (req
 * filled), 0 when more bytes are needed (and n < EGRESS_HEAD_MAX), or an
 * enum egress_reason (EGRESS_BAD_REQUEST, EGRESS_IP_LITERAL) with *why set
 * to a static phrase; req->method/host/port are filled as far as parsed
 * so the denial can name them. Strict: CRLF line ends, no obs-fold, no
 * NUL or control characters, tokens per RFC 9110, one Host header that
 * agrees with an absolute-form URI, CONNECT in authority-form with a port,
 * other methods in absolute-form http:// (no userinfo, no fragment). */
int egress_parse_request(const uint8_t *p, size_t n, struct egress_request *req, const char **why);

/* Outcome of looking for the SNI in the first bytes of a tunnel. */
enum egress_tls {
	EGRESS_TLS_MORE = 0, /* a ClientHello so far; need more bytes */
	EGRESS_TLS_SNI,	     /* complete ClientHello with a host_name */
	EGRESS_TLS_NO_SNI,   /* complete ClientHello without server_name */
	EGRESS_TLS_NOT_TLS,  /* first bytes are not a TLS handshake record */
	EGRESS_TLS_BAD,	     /* malformed or over EGRESS_HELLO_MAX */
};

/* Parse the TLS records in p[0..n) as a ClientHello (possibly split over
 * several records) and extract server_name type host_name into sni
 * (snilen bytes, NUL-terminated, lower-cased, trailing dot removed; a name
 * that does not fit or has bad characters is EGRESS_TLS_BAD). */
enum egress_tls egress_tls_sni(const uint8_t *p, size_t n, char *sni, size_t snilen);

/* Parse "ADDR/LEN" into a 16-byte network (IPv4 stored mapped into
 * ::ffff:0:0/96, prefix adjusted). 0 or -EINVAL. */
int egress_cidr_parse(const char *s, uint8_t net[16], unsigned *prefix);

#endif
