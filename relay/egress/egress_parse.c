/* SPDX-License-Identifier: Apache-2.0 */
/*
 * egress building blocks that touch no sockets: host names and the allow
 * list, address classes, the proxy request head, the TLS ClientHello SNI.
 * Every input here comes from code in the sandbox; every length is checked
 * before it is used.
 */
#include "airlock/egress/egress.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "airlock/core/buf.h"
#include "airlock/core/mem.h"

static const char *const reason_names[] = {
    [EGRESS_NOT_ALLOWED] = "not-allowed", [EGRESS_PORT_NOT_ALLOWED] = "port-not-allowed",
    [EGRESS_IP_LITERAL] = "ip-literal",	  [EGRESS_PRIVATE_ADDRESS] = "private-address",
    [EGRESS_METADATA] = "metadata",	  [EGRESS_SNI_MISMATCH] = "sni-mismatch",
    [EGRESS_NO_SNI] = "no-sni",		  [EGRESS_NOT_TLS] = "not-tls",
    [EGRESS_BAD_REQUEST] = "bad-request", [EGRESS_HOST_ADDRESS] = "host-address",
};

const char *egress_reason_name(enum egress_reason r)
{
	if ((unsigned)r < sizeof(reason_names) / sizeof(reason_names[0]) && reason_names[r])
		return reason_names[r];
	return "unknown";
}

static const char *const class_names[] = {
    [EGRESS_ADDR_PUBLIC] = "public",	     [EGRESS_ADDR_UNSPECIFIED] = "unspecified",
    [EGRESS_ADDR_LOOPBACK] = "loopback",     [EGRESS_ADDR_PRIVATE] = "private",
    [EGRESS_ADDR_LINK_LOCAL] = "link-local", [EGRESS_ADDR_CGNAT] = "cgnat",
    [EGRESS_ADDR_MULTICAST] = "multicast",   [EGRESS_ADDR_BROADCAST] = "broadcast",
    [EGRESS_ADDR_RESERVED] = "reserved",     [EGRESS_ADDR_DOCUMENTATION] = "documentation",
    [EGRESS_ADDR_METADATA] = "metadata",
};

const char *egress_addr_class_name(enum egress_addr_class c)
{
	if ((unsigned)c < sizeof(class_names) / sizeof(class_names[0]) && class_names[c])
		return class_names[c];
	return "unknown";
}

/* ============================== host names ============================== */

static int lower(int c)
{
	return c >= 'A' && c <= 'Z' ? c - 'A' + 'a' : c;
}

static bool is_digit(int c)
{
	return c >= '0' && c <= '9';
}

static bool is_hex(int c)
{
	return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}

/* WHATWG URL "ends in a number": the last label (after dropping one empty
 * trailing label) is all digits, or "0x"/"0X" followed by hex digits. A
 * browser, curl or libc would treat such a host as an IPv4 address, so we
 * refuse it as one: no real TLD is numeric. */
static bool ends_in_number(const char *h, size_t n)
{
	size_t start;

	if (n && h[n - 1] == '.')
		n--;
	start = n;
	while (start > 0 && h[start - 1] != '.')
		start--;
	if (start == n)
		return false;
	if (n - start >= 2 && h[start] == '0' && (h[start + 1] == 'x' || h[start + 1] == 'X')) {
		for (size_t i = start + 2; i < n; i++)
			if (!is_hex(h[i]))
				return false;
		return true;
	}
	for (size_t i = start; i < n; i++)
		if (!is_digit(h[i]))
			return false;
	return true;
}

int egress_host_normalise(const char *host, size_t len, char *out)
{
	size_t lab = 0;

	out[0] = '\0';
	if (len == 0)
		return EGRESS_BAD_REQUEST;
	if (memchr(host, ':', len) || host[0] == '[')
		return EGRESS_IP_LITERAL;
	if (ends_in_number(host, len))
		return EGRESS_IP_LITERAL;
	if (host[len - 1] == '.')
		len--;
	if (len == 0 || len > EGRESS_HOST_MAX)
		return EGRESS_BAD_REQUEST;
	for (size_t i = 0; i <= len; i++) {
		int c = i < len ? (unsigned char)host[i] : '.';

		if (c == '.') {
			if (lab == 0 || lab > 63)
				return EGRESS_BAD_REQUEST;
			lab = 0;
		} else if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || c == '-' || c == '_') {
			lab++;
		} else {
			return EGRESS_BAD_REQUEST;
		}
	}
	for (size_t i = 0; i < len; i++)
		out[i] = (char)lower((unsigned char)host[i]);
	out[len] = '\0';
	return 0;
}

static bool port_ok(const struct policy_host *h, uint16_t port)
{
	return h->port ? h->port == port : (port == 80 || port == 443);
}

int egress_allow_match(const struct policy_host *allow, size_t n, const char *host, uint16_t port,
		       const struct policy_host **which)
{
	size_t hl = strlen(host);
	bool name_seen = false;

	for (size_t i = 0; i < n; i++) {
		const struct policy_host *h = &allow[i];
		size_t nl = strlen(h->name);
		bool hit;

		if (h->subdomains)
			/* a proper subdomain: at least one label, then ".name" */
			hit = hl > nl + 1 && host[hl - nl - 1] == '.' && strcasecmp(host + hl - nl, h->name) == 0;
		else
			hit = strcasecmp(host, h->name) == 0;
		if (!hit)
			continue;
		name_seen = true;
		if (port_ok(h, port)) {
			if (which)
				*which = h;
			return 0;
		}
	}
	return name_seen ? EGRESS_PORT_NOT_ALLOWED : EGRESS_NOT_ALLOWED;
}

/* ============================== addresses ============================== */

struct v4range {
	uint32_t net;
	unsigned bits;
	enum egress_addr_class cls;
};

/* Cloud metadata and provider services a sandbox must not reach: some
 * are link-local or CGNAT (refused anyway, but named for what they are),
 * some are public addresses that only mean something inside the cloud. */
static const struct egress_metadata_addr metadata_addrs[] = {
    {"169.254.169.254", "instance metadata: AWS, GCP, Azure, Oracle, OpenStack, DigitalOcean, Hetzner, ..."},
    {"fd00:ec2::254", "AWS instance metadata (IPv6)"},
    {"169.254.170.2", "AWS ECS task metadata and credentials"},
    {"169.254.170.23", "AWS EKS Pod Identity agent"},
    {"fd00:ec2::23", "AWS EKS Pod Identity agent (IPv6)"},
    {"169.254.169.253", "AWS VPC DNS resolver"},
    {"fd00:ec2::253", "AWS VPC DNS resolver (IPv6)"},
    {"169.254.169.123", "AWS time sync"},
    {"fd00:ec2::123", "AWS time sync (IPv6)"},
    {"168.63.129.16", "Azure WireServer (host agent, DNS, health probes)"},
    {"100.100.100.200", "Alibaba Cloud instance metadata"},
    {"fd20:ce::254", "GCP instance metadata (IPv6)"},
    {"fd00:c1::a9fe:a9fe", "Oracle Cloud instance metadata (IPv6)"},
    {"192.0.0.192", "Oracle Cloud at Customer / Classic instance metadata"},
    {"169.254.0.23", "Tencent Cloud instance metadata"},
    {"169.254.42.42", "Scaleway instance metadata"},
    {"fd00:42::42", "Scaleway instance metadata (IPv6)"},
};

const struct egress_metadata_addr *egress_metadata_addrs(size_t *n)
{
	*n = sizeof(metadata_addrs) / sizeof(metadata_addrs[0]);
	return metadata_addrs;
}

static bool is_metadata_v4(uint32_t a)
{
	struct in_addr in;

	for (size_t i = 0; i < sizeof(metadata_addrs) / sizeof(metadata_addrs[0]); i++)
		if (inet_pton(AF_INET, metadata_addrs[i].addr, &in) == 1 && ntohl(in.s_addr) == a)
			return true;
	return false;
}

static bool is_metadata_v6(const uint8_t a[16])
{
	struct in6_addr in6;

	for (size_t i = 0; i < sizeof(metadata_addrs) / sizeof(metadata_addrs[0]); i++)
		if (inet_pton(AF_INET6, metadata_addrs[i].addr, &in6) == 1 && memcmp(in6.s6_addr, a, 16) == 0)
			return true;
	return false;
}

/* Order matters: the first match wins (broadcast before reserved); the
 * metadata table is looked at before any of these. */
static const struct v4range v4ranges[] = {
    {0xffffffffu, 32, EGRESS_ADDR_BROADCAST},	  /* 255.255.255.255 */
    {0x00000000u, 32, EGRESS_ADDR_UNSPECIFIED},	  /* 0.0.0.0 */
    {0x00000000u, 8, EGRESS_ADDR_RESERVED},	  /* 0/8 "this network" */
    {0x0a000000u, 8, EGRESS_ADDR_PRIVATE},	  /* 10/8 */
    {0x64400000u, 10, EGRESS_ADDR_CGNAT},	  /* 100.64/10 */
    {0x7f000000u, 8, EGRESS_ADDR_LOOPBACK},	  /* 127/8 */
    {0xa9fe0000u, 16, EGRESS_ADDR_LINK_LOCAL},	  /* 169.254/16 */
    {0xac100000u, 12, EGRESS_ADDR_PRIVATE},	  /* 172.16/12 */
    {0xc0000000u, 24, EGRESS_ADDR_RESERVED},	  /* 192.0.0/24 IETF protocol assignments */
    {0xc0000200u, 24, EGRESS_ADDR_DOCUMENTATION}, /* 192.0.2/24 TEST-NET-1 */
    {0xc0586300u, 24, EGRESS_ADDR_RESERVED},	  /* 192.88.99/24 6to4 relay anycast */
    {0xc0a80000u, 16, EGRESS_ADDR_PRIVATE},	  /* 192.168/16 */
    {0xc6120000u, 15, EGRESS_ADDR_RESERVED},	  /* 198.18/15 benchmarking */
    {0xc6336400u, 24, EGRESS_ADDR_DOCUMENTATION}, /* 198.51.100/24 TEST-NET-2 */
    {0xcb007100u, 24, EGRESS_ADDR_DOCUMENTATION}, /* 203.0.113/24 TEST-NET-3 */
    {0xe0000000u, 4, EGRESS_ADDR_MULTICAST},	  /* 224/4 */
    {0xf0000000u, 4, EGRESS_ADDR_RESERVED},	  /* 240/4 */
};

static enum egress_addr_class classify_v4(uint32_t a)
{
	if (is_metadata_v4(a))
		return EGRESS_ADDR_METADATA;
	for (size_t i = 0; i < sizeof(v4ranges) / sizeof(v4ranges[0]); i++) {
		uint32_t mask = v4ranges[i].bits ? ~0u << (32 - v4ranges[i].bits) : 0;

		if ((a & mask) == v4ranges[i].net)
			return v4ranges[i].cls;
	}
	return EGRESS_ADDR_PUBLIC;
}

static uint32_t get32(const uint8_t *p)
{
	return buf_load_be32(p);
}

static bool prefix_eq(const uint8_t *a, const uint8_t *net, unsigned bits)
{
	unsigned full = bits / 8, rest = bits % 8;

	if (memcmp(a, net, full) != 0)
		return false;
	if (rest) {
		uint8_t mask = (uint8_t)(0xff << (8 - rest));
		if ((a[full] & mask) != (net[full] & mask))
			return false;
	}
	return true;
}

/* An embedded IPv4 address decides only when it is not public: a public
 * IPv4 in a 6to4 or Teredo address does not make the IPv6 address safe, it
 * falls through to the IPv6 rules. */
static enum egress_addr_class classify_v6(const uint8_t a[16])
{
	static const uint8_t zero[16];
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};
	static const uint8_t nat64_local[6] = {0, 0x64, 0xff, 0x9b, 0, 1}; /* 64:ff9b:1::/48 */
	static const uint8_t doc[4] = {0x20, 0x01, 0x0d, 0xb8};
	static const uint8_t doc2[3] = {0x3f, 0xff, 0x00}; /* 3fff::/20 */
	static const uint8_t teredo[4] = {0x20, 0x01, 0, 0};
	enum egress_addr_class c;

	if (memcmp(a, zero, 16) == 0)
		return EGRESS_ADDR_UNSPECIFIED;
	if (memcmp(a, zero, 15) == 0 && a[15] == 1)
		return EGRESS_ADDR_LOOPBACK;
	if (is_metadata_v6(a))
		return EGRESS_ADDR_METADATA;
	/* mapped, compatible (deprecated) and well-known NAT64: the whole
	 * address is the embedded one */
	if (memcmp(a, mapped, 12) == 0 || memcmp(a, zero, 12) == 0 || memcmp(a, nat64, 12) == 0) {
		c = classify_v4(get32(a + 12));
		/* ::/96 with a "public" v4 is still not a usable destination */
		return c == EGRESS_ADDR_PUBLIC && memcmp(a, zero, 12) == 0 ? EGRESS_ADDR_RESERVED : c;
	}
	if (memcmp(a, nat64_local, 6) == 0)
		return EGRESS_ADDR_PRIVATE;
	if (a[0] == 0x20 && a[1] == 0x02) { /* 6to4: 2002:V4V4:V4V4::/48 */
		c = classify_v4(get32(a + 2));
		if (c != EGRESS_ADDR_PUBLIC)
			return c;
	}
	if (memcmp(a, teredo, 4) == 0) { /* 2001:0:SERVER::~CLIENT */
		uint32_t client = ~get32(a + 12);
		if ((c = classify_v4(get32(a + 4))) != EGRESS_ADDR_PUBLIC)
			return c;
		if ((c = classify_v4(client)) != EGRESS_ADDR_PUBLIC)
			return c;
	}
	if (memcmp(a, doc, 4) == 0 || prefix_eq(a, doc2, 20))
		return EGRESS_ADDR_DOCUMENTATION;
	if (a[0] == 0xff)
		return EGRESS_ADDR_MULTICAST;
	if ((a[0] & 0xfe) == 0xfc)
		return EGRESS_ADDR_PRIVATE; /* fc00::/7 unique local */
	if (a[0] == 0xfe && (a[1] & 0xc0) == 0x80)
		return EGRESS_ADDR_LINK_LOCAL; /* fe80::/10 */
	if (a[0] == 0xfe && (a[1] & 0xc0) == 0xc0)
		return EGRESS_ADDR_PRIVATE; /* fec0::/10 site-local (deprecated) */
	if ((a[0] & 0xe0) != 0x20)
		return EGRESS_ADDR_RESERVED; /* outside 2000::/3 global unicast */
	/* 2001::/23 IETF protocol assignments (ORCHID, benchmarking, ...),
	 * except Teredo handled above */
	if (a[0] == 0x20 && a[1] == 0x01 && a[2] < 0x02 && memcmp(a, teredo, 4) != 0)
		return EGRESS_ADDR_RESERVED;
	return EGRESS_ADDR_PUBLIC;
}

size_t egress_addr_forms(const struct sockaddr *sa, uint8_t out[EGRESS_ADDR_FORMS_MAX][16])
{
	static const uint8_t mapped[12] = {0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff};
	static const uint8_t zero[12];
	static const uint8_t nat64[12] = {0, 0x64, 0xff, 0x9b};
	static const uint8_t teredo[4] = {0x20, 0x01, 0, 0};
	const uint8_t *a, *v4 = NULL;

	if (sa->sa_family == AF_INET) {
		memcpy(out[0], mapped, 12);
		memcpy(out[0] + 12, &((const struct sockaddr_in *)sa)->sin_addr, 4);
		return 1;
	}
	if (sa->sa_family != AF_INET6)
		return 0;
	a = ((const struct sockaddr_in6 *)sa)->sin6_addr.s6_addr;
	memcpy(out[0], a, 16);
	if (memcmp(a, mapped, 12) == 0)
		return 1; /* already the IPv4 form */
	if (memcmp(a, zero, 12) == 0 || memcmp(a, nat64, 12) == 0)
		v4 = a + 12;
	else if (a[0] == 0x20 && a[1] == 0x02)
		v4 = a + 2; /* 6to4 */
	else if (memcmp(a, teredo, 4) == 0)
		v4 = a + 4; /* the Teredo server */
	if (!v4 || (memcmp(a, zero, 12) == 0 && memcmp(a + 12, zero, 3) == 0 && a[15] <= 1))
		return 1; /* "::" and "::1" embed nothing */
	memcpy(out[1], mapped, 12);
	memcpy(out[1] + 12, v4, 4);
	return 2;
}

enum egress_addr_class egress_addr_classify(const struct sockaddr *sa)
{
	if (sa->sa_family == AF_INET) {
		const struct sockaddr_in *in = (const struct sockaddr_in *)sa;
		return classify_v4(ntohl(in->sin_addr.s_addr));
	}
	if (sa->sa_family == AF_INET6) {
		const struct sockaddr_in6 *in6 = (const struct sockaddr_in6 *)sa;
		return classify_v6(in6->sin6_addr.s6_addr);
	}
	return EGRESS_ADDR_RESERVED;
}

int egress_cidr_parse(const char *s, uint8_t net[16], unsigned *prefix)
{
	char tmp[INET6_ADDRSTRLEN + 8];
	const char *slash = strchr(s, '/');
	size_t al = slash ? (size_t)(slash - s) : strlen(s);
	unsigned long bits;
	char *end;

	if (al == 0 || al >= INET6_ADDRSTRLEN)
		return -EINVAL;
	memcpy(tmp, s, al);
	tmp[al] = '\0';
	memset(net, 0, 16);
	if (inet_pton(AF_INET, tmp, net + 12) == 1) {
		net[10] = net[11] = 0xff;
		bits = 32;
		if (slash) {
			if (!is_digit(slash[1]))
				return -EINVAL;
			bits = strtoul(slash + 1, &end, 10);
			if (*end || bits > 32)
				return -EINVAL;
		}
		*prefix = (unsigned)bits + 96;
		return 0;
	}
	if (inet_pton(AF_INET6, tmp, net) == 1) {
		bits = 128;
		if (slash) {
			if (!is_digit(slash[1]))
				return -EINVAL;
			bits = strtoul(slash + 1, &end, 10);
			if (*end || bits > 128)
				return -EINVAL;
		}
		*prefix = (unsigned)bits;
		return 0;
	}
	return -EINVAL;
}

/* ============================ request head ============================ */

/* RFC 9110 tchar */
static bool is_tchar(int c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) || (c && strchr("!#$%&'*+-.^_`|~", c));
}

/* Find "\r\n" in p[0..n); lines must end in CRLF and a bare CR or LF is
 * an error. Returns the index of '\r', -1 when incomplete, -2 on a bare
 * CR/LF. */
static long find_crlf(const uint8_t *p, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		if (p[i] == '\n')
			return -2;
		if (p[i] == '\r') {
			if (i + 1 == n)
				return -1;
			return p[i + 1] == '\n' ? (long)i : -2;
		}
	}
	return -1;
}

/* Split "host:port" (authority without userinfo). Port required when
 * need_port, else defaults to dflt. */
static int parse_authority(const char *a, size_t n, bool need_port, uint16_t dflt, struct egress_request *req,
			   const char **why)
{
	size_t hl = n;
	unsigned long port = dflt;
	int r;

	if (n && a[0] == '[') {
		/* name the literal and its port in the denial */
		const char *close = memchr(a, ']', n);
		size_t c = close ? (size_t)(close - a) + 1 : n;

		if (c > EGRESS_HOST_MAX)
			c = EGRESS_HOST_MAX;
		for (size_t i = 0; i < c; i++)
			req->host[i] = (char)lower((unsigned char)a[i]);
		req->host[c] = '\0';
		if (close && (size_t)(close - a) + 1 < n && close[1] == ':') {
			unsigned long v = 0;
			size_t i;
			for (i = (size_t)(close - a) + 2; i < n && is_digit(a[i]) && v <= 65535; i++)
				v = v * 10 + (unsigned long)(a[i] - '0');
			req->port = i == n && v <= 65535 ? (uint16_t)v : 0;
		} else {
			req->port = dflt;
		}
		*why = "IPv6 address literal";
		return EGRESS_IP_LITERAL;
	}
	for (size_t i = n; i > 0; i--) {
		if (a[i - 1] == ':') {
			hl = i - 1;
			break;
		}
	}
	if (hl < n) {
		size_t pl = n - hl - 1;
		if (pl == 0 || pl > 5) {
			*why = "bad port";
			return EGRESS_BAD_REQUEST;
		}
		port = 0;
		for (size_t i = hl + 1; i < n; i++) {
			if (!is_digit(a[i])) {
				*why = "bad port";
				return EGRESS_BAD_REQUEST;
			}
			port = port * 10 + (unsigned long)(a[i] - '0');
		}
		if (port == 0 || port > 65535) {
			*why = "bad port";
			return EGRESS_BAD_REQUEST;
		}
		if (memchr(a, ':', hl)) {
			*why = "IPv6 address literal";
			return EGRESS_IP_LITERAL;
		}
	} else if (need_port) {
		*why = "CONNECT needs host:port";
		return EGRESS_BAD_REQUEST;
	}
	req->port = (uint16_t)port;
	r = egress_host_normalise(a, hl, req->host);
	if (r == EGRESS_IP_LITERAL) {
		/* name the literal as written in the denial */
		size_t c = hl < EGRESS_HOST_MAX ? hl : EGRESS_HOST_MAX;
		for (size_t i = 0; i < c; i++)
			req->host[i] = (char)lower((unsigned char)a[i]);
		req->host[c] = '\0';
		*why = "IP address literal";
	} else if (r) {
		*why = "invalid host name";
	}
	return r;
}

static bool name_is(const struct egress_header *h, const char *name)
{
	return h->name_len == strlen(name) && strncasecmp(h->name, name, h->name_len) == 0;
}

int egress_parse_request(const uint8_t *p, size_t n, struct egress_request *req, const char **why)
{
	const char *s = (const char *)p;
	size_t lim = n < EGRESS_HEAD_MAX ? n : EGRESS_HEAD_MAX;
	size_t pos, i, sp1, sp2;
	long e;
	int r;

	memset(req, 0, offsetof(struct egress_request, headers));
	req->n_headers = 0;
	req->head_len = 0;
	*why = "";

	/* request line: METHOD SP TARGET SP HTTP/1.x CRLF */
	e = find_crlf(p, lim);
	if (e == -2) {
		*why = "request line must end in CRLF";
		return EGRESS_BAD_REQUEST;
	}
	if (e < 0) {
		if (n >= EGRESS_HEAD_MAX) {
			*why = "request head over 16 KiB";
			return EGRESS_BAD_REQUEST;
		}
		return 0;
	}
	for (sp1 = 0; sp1 < (size_t)e && is_tchar((unsigned char)s[sp1]); sp1++)
		;
	if (sp1 == 0 || sp1 >= sizeof(req->method) || sp1 >= (size_t)e || s[sp1] != ' ') {
		*why = "bad method";
		return EGRESS_BAD_REQUEST;
	}
	memcpy(req->method, s, sp1);
	req->method[sp1] = '\0';
	req->connect = strcmp(req->method, "CONNECT") == 0;
	for (sp2 = sp1 + 1; sp2 < (size_t)e && (unsigned char)s[sp2] > 0x20 && (unsigned char)s[sp2] < 0x7f; sp2++)
		;
	if (sp2 == sp1 + 1 || sp2 >= (size_t)e || s[sp2] != ' ') {
		*why = "bad request target";
		return EGRESS_BAD_REQUEST;
	}
	if ((size_t)e - (sp2 + 1) != 8 ||
	    (memcmp(s + sp2 + 1, "HTTP/1.1", 8) != 0 && memcmp(s + sp2 + 1, "HTTP/1.0", 8) != 0)) {
		*why = "only HTTP/1.0 and HTTP/1.1 are supported";
		return EGRESS_BAD_REQUEST;
	}
	req->version = s + sp2 + 1;

	{
		const char *t = s + sp1 + 1;
		size_t tl = sp2 - sp1 - 1;

		if (req->connect) {
			if ((r = parse_authority(t, tl, true, 0, req, why)) != 0)
				return r;
		} else {
			size_t a0, a1;

			if (tl < 7 || strncasecmp(t, "http://", 7) != 0) {
				*why = tl && t[0] == '/' ? "not a proxy request (origin-form target)"
				       : tl >= 8 && strncasecmp(t, "https://", 8) == 0
					   ? "https:// needs CONNECT"
					   : "target must be http://host[:port]/path";
				return EGRESS_BAD_REQUEST;
			}
			a0 = 7;
			for (a1 = a0; a1 < tl && t[a1] != '/' && t[a1] != '?' && t[a1] != '#'; a1++)
				;
			if (memchr(t + a0, '@', a1 - a0)) {
				*why = "userinfo in the URI";
				return EGRESS_BAD_REQUEST;
			}
			if (memchr(t, '#', tl)) {
				*why = "fragment in the URI";
				return EGRESS_BAD_REQUEST;
			}
			if ((r = parse_authority(t + a0, a1 - a0, false, 80, req, why)) != 0)
				return r;
			if (a1 == tl) {
				req->path = "/";
				req->path_len = 1;
			} else if (t[a1] == '?') {
				/* "http://h?q": origin-form needs the leading '/' */
				*why = "query without a path";
				return EGRESS_BAD_REQUEST;
			} else {
				req->path = t + a1;
				req->path_len = tl - a1;
			}
		}
	}

	/* header fields */
	pos = (size_t)e + 2;
	for (;;) {
		struct egress_header *h;
		size_t c, v0, v1;

		e = find_crlf(p + pos, lim - pos);
		if (e == -2) {
			*why = "header line must end in CRLF";
			return EGRESS_BAD_REQUEST;
		}
		if (e < 0) {
			if (n >= EGRESS_HEAD_MAX) {
				*why = "request head over 16 KiB";
				return EGRESS_BAD_REQUEST;
			}
			return 0;
		}
		if (e == 0) {
			pos += 2;
			break;
		}
		if (s[pos] == ' ' || s[pos] == '\t') {
			*why = "obsolete line folding";
			return EGRESS_BAD_REQUEST;
		}
		for (c = pos; c < pos + (size_t)e && is_tchar((unsigned char)s[c]); c++)
			;
		if (c == pos || c >= pos + (size_t)e || s[c] != ':') {
			*why = "bad header name";
			return EGRESS_BAD_REQUEST;
		}
		v0 = c + 1;
		v1 = pos + (size_t)e;
		for (i = v0; i < v1; i++) {
			unsigned char ch = (unsigned char)s[i];
			if ((ch < 0x20 && ch != '\t') || ch == 0x7f) {
				*why = "control character in a header value";
				return EGRESS_BAD_REQUEST;
			}
		}
		while (v0 < v1 && (s[v0] == ' ' || s[v0] == '\t'))
			v0++;
		while (v1 > v0 && (s[v1 - 1] == ' ' || s[v1 - 1] == '\t'))
			v1--;
		if (req->n_headers == EGRESS_HEADERS_MAX) {
			*why = "too many header fields";
			return EGRESS_BAD_REQUEST;
		}
		h = &req->headers[req->n_headers++];
		h->name = s + pos;
		h->name_len = c - pos;
		h->value = s + v0;
		h->value_len = v1 - v0;
		pos += (size_t)e + 2;
	}
	req->head_len = pos;

	{
		const struct egress_header *host = NULL;
		bool cl = false, te = false;

		for (i = 0; i < req->n_headers; i++) {
			const struct egress_header *h = &req->headers[i];
			if (name_is(h, "host")) {
				if (host) {
					*why = "more than one Host header";
					return EGRESS_BAD_REQUEST;
				}
				host = h;
			}
			cl |= name_is(h, "content-length");
			te |= name_is(h, "transfer-encoding");
		}
		if (cl && te) {
			*why = "both Content-Length and Transfer-Encoding";
			return EGRESS_BAD_REQUEST;
		}
		if (!req->connect) {
			struct egress_request hreq;
			const char *hwhy;

			if (!host) {
				if (memcmp(req->version, "HTTP/1.1", 8) == 0) {
					*why = "missing Host header";
					return EGRESS_BAD_REQUEST;
				}
			} else {
				/* the Host header must name the same host and port
				 * as the URI: no way to reach one name through
				 * another's allow entry */
				if (parse_authority(host->value, host->value_len, false, 80, &hreq, &hwhy) != 0 ||
				    strcmp(hreq.host, req->host) != 0 || hreq.port != req->port) {
					*why = "Host header does not match the URI";
					return EGRESS_BAD_REQUEST;
				}
			}
		}
	}
	return 1;
}

/* ============================ TLS ClientHello ============================ */

/* Walk the TLS records in p[0..n) and gather the handshake bytes into hs
 * (at most EGRESS_HELLO_MAX). Returns EGRESS_TLS_MORE until the whole
 * handshake message is there, then EGRESS_TLS_SNI meaning "complete". */
static enum egress_tls gather_handshake(const uint8_t *p, size_t n, uint8_t *hs, size_t *hs_len)
{
	struct buf b;
	size_t have = 0, need = 0;
	bool first = true;

	buf_view(&b, p, n);
	if (n >= 1 && p[0] != 22)
		return EGRESS_TLS_NOT_TLS;
	if (n >= 2 && p[1] != 3)
		return EGRESS_TLS_NOT_TLS;
	for (;;) {
		uint8_t type, maj, min;
		uint16_t rlen;

		if (buf_len(&b) < 5)
			return EGRESS_TLS_MORE;
		if (buf_get_u8(&b, &type) < 0 || buf_get_u8(&b, &maj) < 0 || buf_get_u8(&b, &min) < 0 ||
		    buf_get_u16(&b, &rlen) < 0)
			return EGRESS_TLS_BAD;
		if (type != 22 || maj != 3)
			return first ? EGRESS_TLS_NOT_TLS : EGRESS_TLS_BAD;
		if (rlen == 0 || rlen > 16384 || have + rlen > EGRESS_HELLO_MAX)
			return EGRESS_TLS_BAD;
		if (buf_len(&b) < rlen)
			return EGRESS_TLS_MORE;
		if (buf_get(&b, hs + have, rlen) < 0)
			return EGRESS_TLS_BAD;
		have += rlen;
		first = false;
		if (have >= 4) {
			if (hs[0] != 1) /* handshake type client_hello */
				return EGRESS_TLS_BAD;
			need = 4 + ((size_t)hs[1] << 16 | (size_t)hs[2] << 8 | hs[3]);
			if (need > EGRESS_HELLO_MAX)
				return EGRESS_TLS_BAD;
			if (have >= need) {
				*hs_len = need;
				return EGRESS_TLS_SNI;
			}
		}
	}
}

static enum egress_tls parse_sni_list(struct buf *ext, char *sni, size_t snilen)
{
	uint16_t list_len;
	struct buf list;
	bool found = false;

	if (buf_get_u16(ext, &list_len) < 0 || list_len != buf_len(ext) || list_len == 0)
		return EGRESS_TLS_BAD;
	buf_view(&list, buf_ptr(ext), list_len);
	while (buf_len(&list)) {
		uint8_t type;
		uint16_t nl;
		const uint8_t *name;

		if (buf_get_u8(&list, &type) < 0 || buf_get_u16(&list, &nl) < 0 || nl > buf_len(&list))
			return EGRESS_TLS_BAD;
		name = buf_ptr(&list);
		buf_consume(&list, nl);
		if (type != 0)
			continue;
		/* RFC 6066: at most one name of each type */
		if (found || nl == 0 || nl >= snilen || nl > EGRESS_HOST_MAX + 1)
			return EGRESS_TLS_BAD;
		if (egress_host_normalise((const char *)name, nl, sni) != 0) {
			/* an address (RFC 6066 forbids them) or junk */
			return EGRESS_TLS_BAD;
		}
		found = true;
	}
	return found ? EGRESS_TLS_SNI : EGRESS_TLS_NO_SNI;
}

enum egress_tls egress_tls_sni(const uint8_t *p, size_t n, char *sni, size_t snilen)
{
	uint8_t *hs;
	size_t hs_len = 0;
	enum egress_tls r;
	struct buf b, ext;
	uint8_t sid_len, comp_len;
	uint16_t cs_len, ext_len;
	uint32_t seen_ext[8] = {0}; /* duplicates of the extensions we look at */

	if (snilen)
		sni[0] = '\0';
	if (snilen < 2)
		return EGRESS_TLS_BAD;
	hs = mem_alloc(EGRESS_HELLO_MAX);
	if (!hs)
		return EGRESS_TLS_BAD;
	r = gather_handshake(p, n, hs, &hs_len);
	if (r != EGRESS_TLS_SNI)
		goto out;
	r = EGRESS_TLS_BAD;
	buf_view(&b, hs + 4, hs_len - 4);
	/* legacy_version, random */
	if (buf_consume(&b, 2 + 32) < 0 || buf_get_u8(&b, &sid_len) < 0 || sid_len > 32 ||
	    buf_consume(&b, sid_len) < 0 || buf_get_u16(&b, &cs_len) < 0 || cs_len < 2 || cs_len % 2 ||
	    buf_consume(&b, cs_len) < 0 || buf_get_u8(&b, &comp_len) < 0 || comp_len < 1 ||
	    buf_consume(&b, comp_len) < 0)
		goto out;
	if (buf_len(&b) == 0) {
		r = EGRESS_TLS_NO_SNI; /* no extensions at all */
		goto out;
	}
	if (buf_get_u16(&b, &ext_len) < 0 || ext_len != buf_len(&b))
		goto out;
	r = EGRESS_TLS_NO_SNI;
	while (buf_len(&b)) {
		uint16_t type, len;

		if (buf_get_u16(&b, &type) < 0 || buf_get_u16(&b, &len) < 0 || len > buf_len(&b)) {
			r = EGRESS_TLS_BAD;
			goto out;
		}
		if (type < 256) {
			if (seen_ext[type / 32] & (1u << (type % 32))) {
				r = EGRESS_TLS_BAD; /* RFC 8446 4.2: no duplicates */
				goto out;
			}
			seen_ext[type / 32] |= 1u << (type % 32);
		}
		if (type == 0) {
			buf_view(&ext, buf_ptr(&b), len);
			r = parse_sni_list(&ext, sni, snilen);
			if (r == EGRESS_TLS_BAD)
				goto out;
		}
		buf_consume(&b, len);
	}
out:
	mem_free(hs);
	if (r != EGRESS_TLS_SNI && snilen)
		sni[0] = '\0';
	return r;
}
