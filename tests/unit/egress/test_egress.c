/* SPDX-License-Identifier: Apache-2.0 */
/*
 * egress building blocks: allow-list matching, IP literal detection,
 * address classes, request heads, TLS ClientHello SNI (constructed and
 * captured from a real `openssl s_client`), truncation at every length.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <poll.h>
#include <setjmp.h>
#include <signal.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/egress/egress.h"

/* ============================== allow list ============================== */

static const struct policy_host allow[] = {
    {"allowed.test", "allowed.test", false, 0},	  {"*.wild.test", "wild.test", true, 0},
    {"port.test:8443", "port.test", false, 8443}, {"*.wport.test:9000", "wport.test", true, 9000},
    {"both.test:8080", "both.test", false, 8080}, {"both.test", "both.test", false, 0},
};

static const struct {
	const char *host;
	uint16_t port;
	int want; /* 0, EGRESS_NOT_ALLOWED, EGRESS_PORT_NOT_ALLOWED, or -1: normalise refuses */
} match_cases[] = {
    {"allowed.test", 443, 0},
    {"allowed.test", 80, 0},
    {"ALLOWED.Test", 443, 0},
    {"allowed.test.", 443, 0},
    {"allowed.test", 8080, EGRESS_PORT_NOT_ALLOWED},
    {"allowed.test", 22, EGRESS_PORT_NOT_ALLOWED},
    {"allowed.test.evil.test", 443, EGRESS_NOT_ALLOWED},
    {"evilallowed.test", 443, EGRESS_NOT_ALLOWED},
    {"evil-allowed.test", 443, EGRESS_NOT_ALLOWED},
    {"sub.allowed.test", 443, EGRESS_NOT_ALLOWED},
    {"allowed.tes", 443, EGRESS_NOT_ALLOWED},
    {"llowed.test", 443, EGRESS_NOT_ALLOWED},
    {"a.wild.test", 443, 0},
    {"A.B.WILD.TEST.", 80, 0},
    {"wild.test", 443, EGRESS_NOT_ALLOWED},
    {"evil-wild.test", 443, EGRESS_NOT_ALLOWED},
    {"evilwild.test", 443, EGRESS_NOT_ALLOWED},
    {"a.wild.test.evil.test", 443, EGRESS_NOT_ALLOWED},
    {"a.wild.test", 8443, EGRESS_PORT_NOT_ALLOWED},
    {".wild.test", 443, -1},
    {"a..wild.test", 443, -1},
    {"port.test", 8443, 0},
    {"port.test", 443, EGRESS_PORT_NOT_ALLOWED},
    {"x.wport.test", 9000, 0},
    {"x.wport.test", 443, EGRESS_PORT_NOT_ALLOWED},
    {"wport.test", 9000, EGRESS_NOT_ALLOWED},
    {"both.test", 8080, 0},
    {"both.test", 443, 0},
    {"both.test", 8081, EGRESS_PORT_NOT_ALLOWED},
    {"", 443, -1},
    {"allowed.test/", 443, -1},
    {"allowed.test%00", 443, -1},
    {"allowed .test", 443, -1},
    {"xn--bcher-kva.test", 443, EGRESS_NOT_ALLOWED},
};

static void test_allow_match(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(match_cases) / sizeof(match_cases[0]); i++) {
		char norm[EGRESS_HOST_MAX + 1];
		const struct policy_host *which = NULL;
		int r = egress_host_normalise(match_cases[i].host, strlen(match_cases[i].host), norm);

		if (match_cases[i].want == -1) {
			if (r == 0)
				fail_msg("%s: normalised but should be refused", match_cases[i].host);
			continue;
		}
		if (r != 0)
			fail_msg("%s: normalise refused (%d)", match_cases[i].host, r);
		r = egress_allow_match(allow, sizeof(allow) / sizeof(allow[0]), norm, match_cases[i].port, &which);
		if (r != match_cases[i].want)
			fail_msg("%s:%u: got %d want %d", match_cases[i].host, match_cases[i].port, r,
				 match_cases[i].want);
		if (r == 0)
			assert_non_null(which);
	}
	/* an empty list allows nothing */
	assert_int_equal(egress_allow_match(allow, 0, "allowed.test", 443, NULL), EGRESS_NOT_ALLOWED);
}

static void test_host_max(void **state)
{
	char name[300], norm[EGRESS_HOST_MAX + 1];

	(void)state;
	/* 253 characters: four labels of 63 + dots = 255; use 3*63+2 dots + 62 */
	memset(name, 'a', sizeof(name));
	name[63] = name[127] = name[191] = '.';
	name[253] = '\0';
	assert_int_equal(egress_host_normalise(name, 253, norm), 0);
	assert_int_equal(strlen(norm), 253);
	name[253] = '.';
	assert_int_equal(egress_host_normalise(name, 254, norm), 0); /* trailing dot */
	name[253] = 'a';
	assert_int_equal(egress_host_normalise(name, 254, norm), EGRESS_BAD_REQUEST);
	/* a label of 64 */
	memset(name, 'b', 64);
	memcpy(name + 64, ".test", 6);
	assert_int_equal(egress_host_normalise(name, strlen(name), norm), EGRESS_BAD_REQUEST);
}

/* ============================== IP literals ============================== */

static const struct {
	const char *s;
	bool literal;
} literal_cases[] = {
    {"127.0.0.1", true},
    {"2130706433", true},
    {"0x7f.1", true},
    {"0x7f000001", true},
    {"0X7F000001", true},
    {"0177.0.0.1", true},
    {"127.1", true},
    {"1.2.3.4.", true},
    {"017700000001", true},
    {"0x", true},
    {"example.123", true},
    {"foo.0x1F", true},
    {"[::1]", true},
    {"::1", true},
    {"::ffff:127.0.0.1", true},
    {"[::ffff:7f00:1]", true},
    {"fe80::1%25eth0", true},
    {"localhost", false},
    {"123.example", false},
    {"1e3", false},
    {"0x7g.test", false},
    {"example.0x1g", false},
    {"1-2-3-4.nip.io", false},
    {"allowed.test", false},
};

static void test_ip_literals(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(literal_cases) / sizeof(literal_cases[0]); i++) {
		char norm[EGRESS_HOST_MAX + 1];
		int r = egress_host_normalise(literal_cases[i].s, strlen(literal_cases[i].s), norm);

		if (literal_cases[i].literal && r != EGRESS_IP_LITERAL)
			fail_msg("%s: not detected as an IP literal (%d)", literal_cases[i].s, r);
		if (!literal_cases[i].literal && r != 0)
			fail_msg("%s: refused (%d)", literal_cases[i].s, r);
	}
}

/* ============================== addresses ============================== */

static const struct {
	const char *a;
	enum egress_addr_class c;
} addr_cases[] = {
    {"8.8.8.8", EGRESS_ADDR_PUBLIC},
    {"1.1.1.1", EGRESS_ADDR_PUBLIC},
    {"93.184.216.34", EGRESS_ADDR_PUBLIC},
    {"0.0.0.0", EGRESS_ADDR_UNSPECIFIED},
    {"0.1.2.3", EGRESS_ADDR_RESERVED},
    {"127.0.0.1", EGRESS_ADDR_LOOPBACK},
    {"127.255.255.254", EGRESS_ADDR_LOOPBACK},
    {"10.0.0.1", EGRESS_ADDR_PRIVATE},
    {"172.16.0.1", EGRESS_ADDR_PRIVATE},
    {"172.31.255.255", EGRESS_ADDR_PRIVATE},
    {"172.32.0.1", EGRESS_ADDR_PUBLIC},
    {"172.15.255.255", EGRESS_ADDR_PUBLIC},
    {"192.168.1.1", EGRESS_ADDR_PRIVATE},
    {"169.254.1.1", EGRESS_ADDR_LINK_LOCAL},
    {"169.254.169.254", EGRESS_ADDR_METADATA},
    {"100.64.0.1", EGRESS_ADDR_CGNAT},
    {"100.127.255.255", EGRESS_ADDR_CGNAT},
    {"100.128.0.1", EGRESS_ADDR_PUBLIC},
    {"224.0.0.1", EGRESS_ADDR_MULTICAST},
    {"239.255.255.250", EGRESS_ADDR_MULTICAST},
    {"255.255.255.255", EGRESS_ADDR_BROADCAST},
    {"240.0.0.1", EGRESS_ADDR_RESERVED},
    {"192.0.0.8", EGRESS_ADDR_RESERVED},
    {"192.0.2.1", EGRESS_ADDR_DOCUMENTATION},
    {"198.51.100.7", EGRESS_ADDR_DOCUMENTATION},
    {"203.0.113.9", EGRESS_ADDR_DOCUMENTATION},
    {"198.18.0.1", EGRESS_ADDR_RESERVED},
    {"198.19.255.255", EGRESS_ADDR_RESERVED},
    {"198.20.0.1", EGRESS_ADDR_PUBLIC},
    {"2606:4700::1111", EGRESS_ADDR_PUBLIC},
    {"2a00:1450:4001::1", EGRESS_ADDR_PUBLIC},
    {"::", EGRESS_ADDR_UNSPECIFIED},
    {"::1", EGRESS_ADDR_LOOPBACK},
    {"::ffff:127.0.0.1", EGRESS_ADDR_LOOPBACK},
    {"::ffff:10.1.2.3", EGRESS_ADDR_PRIVATE},
    {"::ffff:169.254.169.254", EGRESS_ADDR_METADATA},
    {"::ffff:8.8.8.8", EGRESS_ADDR_PUBLIC},
    {"::127.0.0.1", EGRESS_ADDR_LOOPBACK},
    {"::8.8.8.8", EGRESS_ADDR_RESERVED},
    {"64:ff9b::127.0.0.1", EGRESS_ADDR_LOOPBACK},
    {"64:ff9b::a9fe:a9fe", EGRESS_ADDR_METADATA},
    {"64:ff9b::8.8.8.8", EGRESS_ADDR_PUBLIC},
    {"64:ff9b:1::1", EGRESS_ADDR_PRIVATE},
    {"2002:7f00:1::1", EGRESS_ADDR_LOOPBACK},
    {"2002:c0a8:101::1", EGRESS_ADDR_PRIVATE},
    {"2002:808:808::1", EGRESS_ADDR_PUBLIC},
    {"2001:0:4136:e378:8000:63bf:80ff:fffe", EGRESS_ADDR_LOOPBACK}, /* Teredo client ~ = 127.0.0.1 */
    {"2001:0:7f00:1::1", EGRESS_ADDR_LOOPBACK},			    /* Teredo server 127.0.0.1 */
    {"2001:db8::1", EGRESS_ADDR_DOCUMENTATION},
    {"3fff:0fff::1", EGRESS_ADDR_DOCUMENTATION},
    {"3fff:1000::1", EGRESS_ADDR_PUBLIC},
    {"fc00::1", EGRESS_ADDR_PRIVATE},
    {"fd12:3456::1", EGRESS_ADDR_PRIVATE},
    {"fd00:ec2::254", EGRESS_ADDR_METADATA},
    /* public or CGNAT addresses that only mean something inside a cloud */
    {"168.63.129.16", EGRESS_ADDR_METADATA}, /* Azure WireServer */
    {"::ffff:168.63.129.16", EGRESS_ADDR_METADATA},
    {"64:ff9b::a83f:8110", EGRESS_ADDR_METADATA}, /* NAT64 of 168.63.129.16 */
    {"100.100.100.200", EGRESS_ADDR_METADATA},	  /* Alibaba */
    {"169.254.170.2", EGRESS_ADDR_METADATA},	  /* ECS task metadata */
    {"169.254.169.253", EGRESS_ADDR_METADATA},	  /* AWS DNS */
    {"fd00:ec2::23", EGRESS_ADDR_METADATA},
    {"168.63.129.17", EGRESS_ADDR_PUBLIC},
    {"100.100.100.201", EGRESS_ADDR_CGNAT},
    {"fe80::1", EGRESS_ADDR_LINK_LOCAL},
    {"febf::1", EGRESS_ADDR_LINK_LOCAL},
    {"fec0::1", EGRESS_ADDR_PRIVATE},
    {"ff02::1", EGRESS_ADDR_MULTICAST},
    {"100::1", EGRESS_ADDR_RESERVED},
    {"2001:10::1", EGRESS_ADDR_RESERVED},
    {"4000::1", EGRESS_ADDR_RESERVED},
};

static void test_addr_classify(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(addr_cases) / sizeof(addr_cases[0]); i++) {
		struct sockaddr_storage ss = {0};
		enum egress_addr_class c;

		if (inet_pton(AF_INET, addr_cases[i].a, &((struct sockaddr_in *)&ss)->sin_addr) == 1) {
			ss.ss_family = AF_INET;
		} else {
			assert_int_equal(inet_pton(AF_INET6, addr_cases[i].a, &((struct sockaddr_in6 *)&ss)->sin6_addr),
					 1);
			ss.ss_family = AF_INET6;
		}
		c = egress_addr_classify((struct sockaddr *)&ss);
		if (c != addr_cases[i].c)
			fail_msg("%s: got %s want %s", addr_cases[i].a, egress_addr_class_name(c),
				 egress_addr_class_name(addr_cases[i].c));
	}
}

static void test_cidr(void **state)
{
	uint8_t net[16];
	unsigned prefix;

	(void)state;
	assert_int_equal(egress_cidr_parse("127.0.0.2/32", net, &prefix), 0);
	assert_int_equal(prefix, 128);
	assert_int_equal(net[10], 0xff);
	assert_int_equal(net[15], 2);
	assert_int_equal(egress_cidr_parse("10.0.0.0/8", net, &prefix), 0);
	assert_int_equal(prefix, 104);
	assert_int_equal(egress_cidr_parse("fd00:1::/64", net, &prefix), 0);
	assert_int_equal(prefix, 64);
	assert_int_equal(egress_cidr_parse("127.0.0.1", net, &prefix), 0);
	assert_int_equal(prefix, 128);
	assert_int_equal(egress_cidr_parse("10.0.0.0/33", net, &prefix), -EINVAL);
	assert_int_equal(egress_cidr_parse("10.0.0.0/", net, &prefix), -EINVAL);
	assert_int_equal(egress_cidr_parse("10.0.0.0/-1", net, &prefix), -EINVAL);
	assert_int_equal(egress_cidr_parse("host.test/8", net, &prefix), -EINVAL);
	assert_int_equal(egress_cidr_parse("::/129", net, &prefix), -EINVAL);
	assert_int_equal(egress_cidr_parse("", net, &prefix), -EINVAL);
}

/* ============================== requests ============================== */

static int parse(const char *s, struct egress_request *req, const char **why)
{
	return egress_parse_request((const uint8_t *)s, strlen(s), req, why);
}

static void test_request_good(void **state)
{
	static struct egress_request req;
	const char *why;
	const char *c = "CONNECT Allowed.Test.:443 HTTP/1.1\r\nHost: allowed.test:443\r\nUser-Agent: t\r\n\r\n\x16\x03";
	const char *g = "GET http://allowed.test:8080/a/b?c=d HTTP/1.1\r\nHost: ALLOWED.test:8080\r\n"
			"Proxy-Connection: keep-alive\r\nX-Tab:\tv  \r\n\r\nBODY";

	(void)state;
	assert_int_equal(parse(c, &req, &why), 1);
	assert_true(req.connect);
	assert_string_equal(req.method, "CONNECT");
	assert_string_equal(req.host, "allowed.test");
	assert_int_equal(req.port, 443);
	assert_int_equal(req.head_len, strlen(c) - 2);

	assert_int_equal(parse(g, &req, &why), 1);
	assert_false(req.connect);
	assert_string_equal(req.host, "allowed.test");
	assert_int_equal(req.port, 8080);
	assert_int_equal(req.path_len, strlen("/a/b?c=d"));
	assert_memory_equal(req.path, "/a/b?c=d", req.path_len);
	assert_int_equal(req.n_headers, 3);
	assert_int_equal(req.headers[2].value_len, 1);
	assert_memory_equal(req.headers[2].value, "v", 1);
	assert_int_equal(req.head_len, strlen(g) - 4);

	/* default port, empty path, Host without port, HTTP/1.0 without Host */
	assert_int_equal(parse("POST http://a.test HTTP/1.1\r\nHost: a.test\r\n\r\n", &req, &why), 1);
	assert_int_equal(req.port, 80);
	assert_memory_equal(req.path, "/", 1);
	assert_int_equal(parse("GET http://a.test/ HTTP/1.0\r\n\r\n", &req, &why), 1);
	assert_int_equal(parse("GET HTTP://a.test:80/ HTTP/1.1\r\nHost: a.test:80\r\n\r\n", &req, &why), 1);
	assert_int_equal(parse("GET http://a.test/ HTTP/1.1\r\nHost: a.test:80\r\n\r\n", &req, &why), 1);

	/* every proper prefix of a good head asks for more */
	for (size_t n = 0; n < strlen(g) - 4; n++)
		if (egress_parse_request((const uint8_t *)g, n, &req, &why) != 0)
			fail_msg("prefix %zu: not 0 (%s)", n, why);
}

static const struct {
	const char *s;
	int want;
} bad_cases[] = {
    {"GET / HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET https://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET ftp://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: b.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test:81\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://u:p@a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/#f HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test?q HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n X-Fold: y\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: a\x01"
     "b\r\n\r\n",
     EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\nX: y\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nBad Name: y\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n: y\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nContent-Length: 1\r\nTransfer-Encoding: chunked\r\n\r\n",
     EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/2.0\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET  http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test/ HTTP/1.1 \r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"G(T http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"VERYLONGMETHODNAMEXX http://a.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test:0/ HTTP/1.1\r\nHost: a.test:0\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test:65536/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a.test:/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"GET http://a_b!.test/ HTTP/1.1\r\nHost: a.test\r\n\r\n", EGRESS_BAD_REQUEST},
    {"CONNECT a.test HTTP/1.1\r\n\r\n", EGRESS_BAD_REQUEST},
    {"CONNECT a.test:https HTTP/1.1\r\n\r\n", EGRESS_BAD_REQUEST},
    {"CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", EGRESS_IP_LITERAL},
    {"CONNECT 2130706433:443 HTTP/1.1\r\n\r\n", EGRESS_IP_LITERAL},
    {"CONNECT [::1]:443 HTTP/1.1\r\n\r\n", EGRESS_IP_LITERAL},
    {"CONNECT ::1:443 HTTP/1.1\r\n\r\n", EGRESS_IP_LITERAL},
    {"GET http://0x7f.1/ HTTP/1.1\r\nHost: 0x7f.1\r\n\r\n", EGRESS_IP_LITERAL},
    {"GET http://[::ffff:127.0.0.1]:80/ HTTP/1.1\r\nHost: x\r\n\r\n", EGRESS_IP_LITERAL},
};

static void test_request_bad(void **state)
{
	static struct egress_request req;
	const char *why;

	(void)state;
	for (size_t i = 0; i < sizeof(bad_cases) / sizeof(bad_cases[0]); i++) {
		int r = parse(bad_cases[i].s, &req, &why);
		if (r != bad_cases[i].want)
			fail_msg("case %zu %.40s: got %d want %d", i, bad_cases[i].s, r, bad_cases[i].want);
		assert_non_null(why);
	}
	/* NUL inside a header value */
	{
		const char s[] = "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: a\0b\r\n\r\n";
		assert_int_equal(egress_parse_request((const uint8_t *)s, sizeof(s) - 1, &req, &why),
				 EGRESS_BAD_REQUEST);
	}
	/* IP literal denials still name the host */
	assert_int_equal(parse("CONNECT 127.0.0.1:443 HTTP/1.1\r\n\r\n", &req, &why), EGRESS_IP_LITERAL);
	assert_string_equal(req.host, "127.0.0.1");
	assert_int_equal(req.port, 443);
	assert_int_equal(parse("CONNECT [::1]:8443 HTTP/1.1\r\n\r\n", &req, &why), EGRESS_IP_LITERAL);
	assert_string_equal(req.host, "[::1]");
	assert_int_equal(req.port, 8443);
	assert_int_equal(parse("CONNECT [::1 HTTP/1.1\r\n\r\n", &req, &why), EGRESS_IP_LITERAL);
	assert_int_equal(req.port, 0);
}

static void test_request_limits(void **state)
{
	static struct egress_request req;
	const char *why;
	char *big = mem_alloc(EGRESS_HEAD_MAX * 2);
	size_t n;

	(void)state;
	assert_non_null(big);
	/* a head that never ends: more is wanted until 16 KiB, then refused */
	n = (size_t)snprintf(big, EGRESS_HEAD_MAX, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\nX: ");
	memset(big + n, 'x', EGRESS_HEAD_MAX * 2 - n);
	assert_int_equal(egress_parse_request((uint8_t *)big, EGRESS_HEAD_MAX - 1, &req, &why), 0);
	assert_int_equal(egress_parse_request((uint8_t *)big, EGRESS_HEAD_MAX, &req, &why), EGRESS_BAD_REQUEST);
	assert_int_equal(egress_parse_request((uint8_t *)big, EGRESS_HEAD_MAX * 2, &req, &why), EGRESS_BAD_REQUEST);
	/* a complete head that ends just past 16 KiB is refused too */
	memcpy(big + EGRESS_HEAD_MAX - 2, "\r\n\r\n", 4);
	assert_int_equal(egress_parse_request((uint8_t *)big, EGRESS_HEAD_MAX + 2, &req, &why), EGRESS_BAD_REQUEST);
	/* a request line that never ends */
	memset(big, 'G', EGRESS_HEAD_MAX * 2);
	assert_int_equal(egress_parse_request((uint8_t *)big, EGRESS_HEAD_MAX * 2, &req, &why), EGRESS_BAD_REQUEST);
	/* too many header fields */
	n = (size_t)snprintf(big, EGRESS_HEAD_MAX, "GET http://a.test/ HTTP/1.1\r\nHost: a.test\r\n");
	for (unsigned i = 0; i < EGRESS_HEADERS_MAX; i++)
		n += (size_t)snprintf(big + n, EGRESS_HEAD_MAX - n, "X%u: y\r\n", i);
	n += (size_t)snprintf(big + n, EGRESS_HEAD_MAX - n, "\r\n");
	assert_int_equal(egress_parse_request((uint8_t *)big, n, &req, &why), EGRESS_BAD_REQUEST);
	assert_string_equal(why, "too many header fields");
	mem_free(big);
}

/* ============================== ClientHello ============================== */

struct w {
	uint8_t *p;
	size_t n;
};
static void put(struct w *w, const void *p, size_t n)
{
	memcpy(w->p + w->n, p, n);
	w->n += n;
}
static void put8(struct w *w, unsigned v)
{
	w->p[w->n++] = (uint8_t)v;
}
static void put16(struct w *w, unsigned v)
{
	put8(w, v >> 8);
	put8(w, v);
}
static void put24(struct w *w, size_t v)
{
	put8(w, (unsigned)(v >> 16));
	put16(w, (unsigned)v & 0xffff);
}

/* A TLS 1.2/1.3-shaped ClientHello. sni NULL: no server_name extension.
 * split > 0: the handshake is cut into two records at that offset. */
static size_t build_hello(uint8_t *out, const char *sni, bool dup_sni, size_t split)
{
	uint8_t hs[2048], ext[1024];
	struct w h = {hs, 0}, e = {ext, 0}, o = {out, 0};
	uint8_t random[32];
	size_t body_at;

	memset(random, 0xab, sizeof(random));
	if (sni) {
		for (int k = 0; k < (dup_sni ? 2 : 1); k++) {
			put16(&e, 0);
			put16(&e, strlen(sni) + 5);
			put16(&e, strlen(sni) + 3);
			put8(&e, 0);
			put16(&e, strlen(sni));
			put(&e, sni, strlen(sni));
		}
	}
	put16(&e, 10); /* supported_groups */
	put16(&e, 4);
	put16(&e, 2);
	put16(&e, 29);
	put16(&e, 43); /* supported_versions */
	put16(&e, 3);
	put8(&e, 2);
	put16(&e, 0x0304);

	put8(&h, 1);
	body_at = h.n;
	put24(&h, 0);
	put16(&h, 0x0303);
	put(&h, random, 32);
	put8(&h, 32);
	put(&h, random, 32);
	put16(&h, 4);
	put16(&h, 0x1301);
	put16(&h, 0x1302);
	put8(&h, 1);
	put8(&h, 0);
	put16(&h, e.n);
	put(&h, ext, e.n);
	hs[body_at] = (uint8_t)((h.n - 4) >> 16);
	hs[body_at + 1] = (uint8_t)((h.n - 4) >> 8);
	hs[body_at + 2] = (uint8_t)(h.n - 4);

	if (split == 0 || split >= h.n)
		split = h.n;
	put8(&o, 22);
	put16(&o, 0x0301);
	put16(&o, split);
	put(&o, hs, split);
	if (split < h.n) {
		put8(&o, 22);
		put16(&o, 0x0303);
		put16(&o, h.n - split);
		put(&o, hs + split, h.n - split);
	}
	return o.n;
}

/* Every prefix asks for more, the whole gives want, every single-byte
 * corruption returns something without crashing (ASan watches). */
static void check_hello(const uint8_t *p, size_t n, enum egress_tls want, const char *want_sni)
{
	char sni[EGRESS_HOST_MAX + 2];
	uint8_t *copy = mem_alloc(n);

	assert_non_null(copy);
	for (size_t k = 0; k < n; k++) {
		enum egress_tls r = egress_tls_sni(p, k, sni, sizeof(sni));
		if (r != EGRESS_TLS_MORE)
			fail_msg("prefix %zu of %zu: got %d", k, n, r);
	}
	assert_int_equal(egress_tls_sni(p, n, sni, sizeof(sni)), want);
	if (want_sni)
		assert_string_equal(sni, want_sni);
	for (size_t k = 0; k < n; k++) {
		memcpy(copy, p, n);
		copy[k] ^= 0xff;
		(void)egress_tls_sni(copy, n, sni, sizeof(sni));
		copy[k] = 0;
		(void)egress_tls_sni(copy, n, sni, sizeof(sni));
	}
	mem_free(copy);
}

static void test_hello_constructed(void **state)
{
	uint8_t buf[4096];
	char sni[EGRESS_HOST_MAX + 2];
	size_t n;

	(void)state;
	n = build_hello(buf, "Allowed.Test.", false, 0);
	check_hello(buf, n, EGRESS_TLS_SNI, "allowed.test");
	n = build_hello(buf, "allowed.test", false, 40);
	check_hello(buf, n, EGRESS_TLS_SNI, "allowed.test");
	n = build_hello(buf, NULL, false, 0);
	check_hello(buf, n, EGRESS_TLS_NO_SNI, NULL);
	n = build_hello(buf, "a.test", true, 0);
	assert_int_equal(egress_tls_sni(buf, n, sni, sizeof(sni)), EGRESS_TLS_BAD);
	n = build_hello(buf, "127.0.0.1", false, 0);
	assert_int_equal(egress_tls_sni(buf, n, sni, sizeof(sni)), EGRESS_TLS_BAD);
	n = build_hello(buf, "bad name.test", false, 0);
	assert_int_equal(egress_tls_sni(buf, n, sni, sizeof(sni)), EGRESS_TLS_BAD);
	/* a name longer than the caller's buffer */
	n = build_hello(buf, "allowed.test", false, 0);
	assert_int_equal(egress_tls_sni(buf, n, sni, 5), EGRESS_TLS_BAD);

	/* not TLS: plain HTTP, SSH, an alert record */
	assert_int_equal(egress_tls_sni((const uint8_t *)"GET / HTTP/1.1\r\n", 16, sni, sizeof(sni)),
			 EGRESS_TLS_NOT_TLS);
	assert_int_equal(egress_tls_sni((const uint8_t *)"SSH-2.0-x\r\n", 11, sni, sizeof(sni)), EGRESS_TLS_NOT_TLS);
	assert_int_equal(egress_tls_sni((const uint8_t *)"G", 1, sni, sizeof(sni)), EGRESS_TLS_NOT_TLS);
	{
		static const uint8_t alert[] = {21, 3, 3, 0, 2, 2, 40};
		assert_int_equal(egress_tls_sni(alert, sizeof(alert), sni, sizeof(sni)), EGRESS_TLS_NOT_TLS);
	}
	/* a handshake that is not a ClientHello, a record that claims too much */
	{
		static const uint8_t sh[] = {22, 3, 3, 0, 4, 2, 0, 0, 0};
		static const uint8_t huge[] = {22, 3, 1, 0x40, 0x01};
		static const uint8_t hugehs[] = {22, 3, 1, 0, 4, 1, 0xff, 0xff, 0xff};
		assert_int_equal(egress_tls_sni(sh, sizeof(sh), sni, sizeof(sni)), EGRESS_TLS_BAD);
		assert_int_equal(egress_tls_sni(huge, sizeof(huge), sni, sizeof(sni)), EGRESS_TLS_BAD);
		assert_int_equal(egress_tls_sni(hugehs, sizeof(hugehs), sni, sizeof(sni)), EGRESS_TLS_BAD);
	}
}

/* Capture the ClientHello a real `openssl s_client` sends. Skips when
 * openssl is not installed. */
static int capture_openssl_hello(const char *servername, uint8_t *out, size_t cap, size_t *outn)
{
	struct sockaddr_in sin = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sin);
	int lfd, cfd = -1, rc = -1;
	pid_t pid;
	char target[64];
	char sni[EGRESS_HOST_MAX + 2];

	if (system("command -v openssl >/dev/null 2>&1") != 0)
		return 1;
	lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(listen(lfd, 1), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sin, &sl), 0);
	snprintf(target, sizeof(target), "127.0.0.1:%u", ntohs(sin.sin_port));
	pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		int devnull = open("/dev/null", O_RDWR);
		dup2(devnull, 0);
		dup2(devnull, 1);
		dup2(devnull, 2);
		if (servername)
			execlp("openssl", "openssl", "s_client", "-connect", target, "-servername", servername,
			       (char *)NULL);
		else
			execlp("openssl", "openssl", "s_client", "-connect", target, "-noservername", (char *)NULL);
		_exit(127);
	}
	{
		struct pollfd pfd = {.fd = lfd, .events = POLLIN};
		if (poll(&pfd, 1, 10000) == 1)
			cfd = accept(lfd, NULL, NULL);
	}
	*outn = 0;
	while (cfd >= 0 && *outn < cap) {
		struct pollfd pfd = {.fd = cfd, .events = POLLIN};
		ssize_t n;

		if (poll(&pfd, 1, 10000) != 1)
			break;
		n = read(cfd, out + *outn, cap - *outn);
		if (n <= 0)
			break;
		*outn += (size_t)n;
		if (egress_tls_sni(out, *outn, sni, sizeof(sni)) != EGRESS_TLS_MORE) {
			rc = 0;
			break;
		}
	}
	kill(pid, SIGKILL);
	waitpid(pid, NULL, 0);
	if (cfd >= 0)
		close(cfd);
	close(lfd);
	return rc;
}

static void test_hello_openssl(void **state)
{
	static uint8_t buf[EGRESS_HELLO_MAX];
	char sni[EGRESS_HOST_MAX + 2];
	size_t n;
	int r;

	(void)state;
	r = capture_openssl_hello("Real.Example.ORG", buf, sizeof(buf), &n);
	if (r == 1)
		skip();
	assert_int_equal(r, 0);
	check_hello(buf, n, EGRESS_TLS_SNI, "real.example.org");
	assert_int_equal(egress_tls_sni(buf, n, sni, sizeof(sni)), EGRESS_TLS_SNI);

	assert_int_equal(capture_openssl_hello(NULL, buf, sizeof(buf), &n), 0);
	assert_int_equal(egress_tls_sni(buf, n, sni, sizeof(sni)), EGRESS_TLS_NO_SNI);
}

static void test_names(void **state)
{
	(void)state;
	assert_string_equal(egress_reason_name(EGRESS_NOT_ALLOWED), "not-allowed");
	assert_string_equal(egress_reason_name(EGRESS_SNI_MISMATCH), "sni-mismatch");
	assert_string_equal(egress_reason_name((enum egress_reason)99), "unknown");
	assert_string_equal(egress_addr_class_name(EGRESS_ADDR_LOOPBACK), "loopback");
}

/* ============================== egress_adopt ============================== */

struct adopt_t {
	int denials;
	char client[64];
	uint64_t client_id;
	enum egress_reason reason;
	int fd; /* the test's end */
	char reply[512];
	size_t nreply;
	bool eof;
};

static void adopt_denial(void *ud, const struct egress_denial *d)
{
	struct adopt_t *a = ud;

	a->denials++;
	snprintf(a->client, sizeof(a->client), "%s", d->client);
	a->client_id = d->client_id;
	a->reason = d->reason;
}

static void adopt_check(struct loop *l, void *ud)
{
	struct adopt_t *a = ud;
	ssize_t n;

	while (!a->eof && (n = read(a->fd, a->reply + a->nreply, sizeof(a->reply) - 1 - a->nreply)) >= 0) {
		if (n == 0)
			a->eof = true;
		a->nreply += (size_t)n;
		a->reply[a->nreply] = '\0';
	}
	if (a->eof)
		loop_stop(l);
}

static void adopt_tick(struct loop *l, void *ud)
{
	adopt_check(l, ud);
	if (loop_add_timer(l, 5, adopt_tick, ud) == 0)
		loop_stop(l);
}

static void adopt_timeout(struct loop *l, void *ud)
{
	(void)ud;
	loop_stop(l);
}

/* A socketpair end adopted as a client: treated like an accepted one, and
 * its denials carry the identity and id it was adopted with (the host
 * daemon's channel proxy streams rely on both). Over max_conns: 503. */
static void test_adopt(void **state)
{
	(void)state;
	struct loop *l = loop_new();
	struct egress_cfg cfg = {.allow = allow, .n_allow = sizeof(allow) / sizeof(allow[0]), .max_conns = 1};
	struct egress_ops ops = {.on_denial = adopt_denial};
	struct adopt_t a = {0};
	struct egress *e;
	char err[256];
	int sv[2], sv2[2];
	static const char req[] = "GET http://evil.test/x HTTP/1.1\r\nHost: evil.test\r\n\r\n";

	assert_non_null(l);
	assert_int_equal(egress_new(l, &cfg, &ops, &a, &e, err, sizeof(err)), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0); /* blocking: adopt fixes it */
	assert_int_equal(egress_adopt(e, sv[0], "\"7\" curl http://evil.test/x", (3ull << 32) | 7), 0);
	assert_int_equal(egress_conn_count(e), 1);
	/* the second one is over max_conns */
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv2), 0);
	assert_int_equal(egress_adopt(e, sv2[0], "other", 1), -EBUSY);
	char busy[256] = {0};
	assert_true(read(sv2[1], busy, sizeof(busy) - 1) > 0);
	assert_non_null(strstr(busy, "503"));
	close(sv2[1]);
	assert_int_equal(egress_adopt(e, -1, "x", 0), -EINVAL);

	a.fd = sv[1];
	assert_int_equal(fcntl(sv[1], F_SETFL, O_NONBLOCK), 0);
	assert_int_equal(write(sv[1], req, sizeof(req) - 1), (ssize_t)(sizeof(req) - 1));
	assert_true(loop_add_timer(l, 5, adopt_tick, &a) > 0);
	uint64_t to = loop_add_timer(l, 5000, adopt_timeout, NULL);
	assert_int_equal(loop_run(l), 0);
	loop_del_timer(l, to);
	assert_true(a.eof);
	assert_int_equal(a.denials, 1);
	assert_string_equal(a.client, "\"7\" curl http://evil.test/x");
	assert_int_equal(a.client_id, (3ull << 32) | 7);
	assert_int_equal(a.reason, EGRESS_NOT_ALLOWED);
	assert_non_null(strstr(a.reply, "HTTP/1.1 403"));
	assert_non_null(strstr(a.reply, "airlock egress: denied GET evil.test:80"));
	close(sv[1]);
	egress_free(e);
	loop_free(l);
}

/* The metadata table is data: every entry parses, is refused as metadata,
 * and so is its IPv4-mapped form. */
static void test_metadata_table(void **state)
{
	size_t n;
	const struct egress_metadata_addr *t = egress_metadata_addrs(&n);
	(void)state;
	assert_true(n >= 10);
	for (size_t i = 0; i < n; i++) {
		struct sockaddr_in sin = {.sin_family = AF_INET};
		struct sockaddr_in6 sin6 = {.sin6_family = AF_INET6};
		assert_non_null(t[i].what);
		if (inet_pton(AF_INET, t[i].addr, &sin.sin_addr) == 1) {
			assert_int_equal(egress_addr_classify((struct sockaddr *)&sin), EGRESS_ADDR_METADATA);
			memset(sin6.sin6_addr.s6_addr + 10, 0xff, 2);
			memcpy(sin6.sin6_addr.s6_addr + 12, &sin.sin_addr, 4);
		} else {
			assert_int_equal(inet_pton(AF_INET6, t[i].addr, &sin6.sin6_addr), 1);
		}
		if (egress_addr_classify((struct sockaddr *)&sin6) != EGRESS_ADDR_METADATA)
			fail_msg("%s (%s) is not metadata", t[i].addr, t[i].what);
	}
}

static void test_addr_forms(void **state)
{
	static const struct {
		const char *a;
		size_t n;
		const char *v4; /* the embedded IPv4 address, or NULL */
	} t[] = {
	    {"192.0.2.7", 1, "192.0.2.7"},
	    {"::ffff:192.0.2.7", 1, "192.0.2.7"},
	    {"64:ff9b::c000:207", 2, "192.0.2.7"},
	    {"::c000:207", 2, "192.0.2.7"},
	    {"2002:c000:207::1", 2, "192.0.2.7"},
	    {"2001:0:c000:207::1", 2, "192.0.2.7"},
	    {"2a00:1450::1", 1, NULL},
	    {"::1", 1, NULL},
	    {"::", 1, NULL},
	};
	(void)state;
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++) {
		struct sockaddr_storage ss = {0};
		uint8_t f[EGRESS_ADDR_FORMS_MAX][16], want[16] = {0};
		if (inet_pton(AF_INET, t[i].a, &((struct sockaddr_in *)&ss)->sin_addr) == 1)
			ss.ss_family = AF_INET;
		else if (inet_pton(AF_INET6, t[i].a, &((struct sockaddr_in6 *)&ss)->sin6_addr) == 1)
			ss.ss_family = AF_INET6;
		size_t n = egress_addr_forms((struct sockaddr *)&ss, f);
		if (n != t[i].n)
			fail_msg("%s: %zu forms", t[i].a, n);
		if (t[i].v4) {
			want[10] = want[11] = 0xff;
			assert_int_equal(inet_pton(AF_INET, t[i].v4, want + 12), 1);
			assert_memory_equal(f[n - 1], want, 16);
		}
	}
	struct sockaddr su = {.sa_family = AF_UNIX};
	uint8_t f[EGRESS_ADDR_FORMS_MAX][16];
	assert_int_equal(egress_addr_forms(&su, f), 0);
}

struct own_t {
	int listener;
	bool accepted;
	enum egress_reason reason;
	unsigned denials;
	char detail[128];
};

static void own_denial(void *ud, const struct egress_denial *d)
{
	struct own_t *o = ud;
	o->denials++;
	o->reason = d->reason;
	snprintf(o->detail, sizeof(o->detail), "%s", d->detail);
}

static void own_tick(struct loop *l, void *ud)
{
	struct own_t *o = ud;
	int fd = accept4(o->listener, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
	if (fd >= 0) {
		o->accepted = true;
		close(fd);
	}
	if (o->accepted || o->denials || loop_add_timer(l, 5, own_tick, ud) == 0)
		loop_stop(l);
}

/* One request through a proxy whose resolver table maps host to addr, to
 * a server listening on every address of the host (0.0.0.0:port). */
static void own_request(const char *host, const char *addr, struct own_t *o)
{
	struct sockaddr_in sin = {.sin_family = AF_INET};
	socklen_t sl = sizeof(sin);
	char hosts[] = "/tmp/test_egress_hosts.XXXXXX", cidr[64], req[256], name[64];
	int lfd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0), sv[2];

	assert_true(lfd >= 0);
	assert_int_equal(bind(lfd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	assert_int_equal(listen(lfd, 4), 0);
	assert_int_equal(getsockname(lfd, (struct sockaddr *)&sin, &sl), 0);
	int hfd = mkstemp(hosts);
	assert_true(hfd >= 0);
	dprintf(hfd, "%s %s\n", addr, host);
	close(hfd);
	snprintf(cidr, sizeof(cidr), "%s/32", addr);
	snprintf(name, sizeof(name), "%s", host);
	const char *cidrs[] = {cidr};
	struct policy_host one = {name, name, false, ntohs(sin.sin_port)};
	struct egress_cfg cfg = {
	    .allow = &one, .n_allow = 1, .hosts_file = hosts, .allow_private_cidrs = cidrs, .n_allow_private_cidrs = 1};
	struct egress_ops ops = {.on_denial = own_denial};
	struct loop *l = loop_new();
	struct egress *e;
	char err[256];

	memset(o, 0, sizeof(*o));
	o->listener = lfd;
	assert_int_equal(egress_new(l, &cfg, &ops, o, &e, err, sizeof(err)), 0);
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	assert_int_equal(egress_adopt(e, sv[0], "own", 1), 0);
	int n = snprintf(req, sizeof(req), "GET http://%s:%u/ HTTP/1.1\r\nHost: %s:%u\r\n\r\n", host,
			 ntohs(sin.sin_port), host, ntohs(sin.sin_port));
	assert_int_equal(write(sv[1], req, (size_t)n), n);
	assert_true(loop_add_timer(l, 5, own_tick, o) > 0);
	uint64_t to = loop_add_timer(l, 5000, adopt_timeout, NULL);
	assert_int_equal(loop_run(l), 0);
	loop_del_timer(l, to);
	close(sv[1]);
	egress_free(e);
	loop_free(l);
	close(lfd);
	unlink(hosts);
}

/* An allowed name resolving to one of the host's own addresses (a
 * service bound on 0.0.0.0 answers there) is refused, even inside the
 * test's allow_private_cidrs; the same server through a loopback alias
 * that is not an interface address is reached (the check can fail). */
static void test_own_address(void **state)
{
	struct ifaddrs *ifs = NULL;
	char own[INET_ADDRSTRLEN] = "";
	struct own_t o;
	(void)state;

	assert_int_equal(getifaddrs(&ifs), 0);
	for (struct ifaddrs *f = ifs; f && !own[0]; f = f->ifa_next)
		if (f->ifa_addr && f->ifa_addr->sa_family == AF_INET &&
		    ((struct sockaddr_in *)f->ifa_addr)->sin_addr.s_addr != htonl(INADDR_LOOPBACK))
			inet_ntop(AF_INET, &((struct sockaddr_in *)f->ifa_addr)->sin_addr, own, sizeof(own));
	freeifaddrs(ifs);
	own_request("alias.test", "127.0.0.2", &o);
	assert_true(o.accepted);
	assert_int_equal(o.denials, 0);
	own_request("loop.test", "127.0.0.1", &o); /* lo's own address: loopback first */
	assert_int_equal(o.denials, 1);
	assert_int_equal(o.reason, EGRESS_HOST_ADDRESS);
	assert_false(o.accepted);
	if (!own[0]) {
		print_message("no non-loopback IPv4 address on this host: the interface case is skipped\n");
		return;
	}
	own_request("self.test", own, &o);
	if (o.denials != 1 || o.reason != EGRESS_HOST_ADDRESS || o.accepted)
		fail_msg("%s (own): denials %u reason %s accepted %d", own, o.denials, egress_reason_name(o.reason),
			 o.accepted);
	assert_non_null(strstr(o.detail, own));
	assert_non_null(strstr(o.detail, "host interface"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_allow_match),
	    cmocka_unit_test(test_host_max),
	    cmocka_unit_test(test_ip_literals),
	    cmocka_unit_test(test_addr_classify),
	    cmocka_unit_test(test_cidr),
	    cmocka_unit_test(test_request_good),
	    cmocka_unit_test(test_request_bad),
	    cmocka_unit_test(test_request_limits),
	    cmocka_unit_test(test_hello_constructed),
	    cmocka_unit_test(test_hello_openssl),
	    cmocka_unit_test(test_names),
	    cmocka_unit_test(test_adopt),
	    cmocka_unit_test(test_metadata_table),
	    cmocka_unit_test(test_addr_forms),
	    cmocka_unit_test(test_own_address),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
