/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the egress proxy's parsers: the request head and the first bytes of
 * a tunnel (TLS ClientHello) come from code running in the sandbox. The
 * first input byte picks the parser. */
#include <string.h>

#include "airlock/egress.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] & 1) {
		struct egress_request req;
		const char *why = NULL;
		(void)egress_parse_request(data + 1, size - 1, &req, &why);
	} else {
		char sni[256];
		/* every prefix must be answerable: "need more", or a verdict */
		(void)egress_tls_sni(data + 1, size - 1, sni, sizeof(sni));
		if (size > 2)
			(void)egress_tls_sni(data + 1, (size - 1) / 2, sni, sizeof(sni));
	}
	return 0;
}

/* A ClientHello for "allowed.test" with one cipher suite and the SNI and
 * supported_versions extensions, built by hand (RFC 8446 4.1.2). */
static size_t client_hello(uint8_t *p)
{
	static const char host[] = "allowed.test";
	const size_t hl = sizeof(host) - 1;
	uint8_t *h = p;
	size_t n = 0;

	h[n++] = 0; /* picker: TLS */
	h[n++] = 22; h[n++] = 3; h[n++] = 1; /* record: handshake, TLS 1.0 */
	size_t rec_len_at = n; n += 2;
	h[n++] = 1; /* ClientHello */
	size_t hs_len_at = n; n += 3;
	h[n++] = 3; h[n++] = 3; /* legacy_version */
	memset(h + n, 0x42, 32); n += 32; /* random */
	h[n++] = 0; /* session id */
	h[n++] = 0; h[n++] = 2; h[n++] = 0x13; h[n++] = 0x01; /* cipher suites */
	h[n++] = 1; h[n++] = 0; /* compression: null */
	size_t ext_len_at = n; n += 2;
	/* server_name */
	h[n++] = 0; h[n++] = 0;
	h[n++] = 0; h[n++] = (uint8_t)(hl + 5);
	h[n++] = 0; h[n++] = (uint8_t)(hl + 3);
	h[n++] = 0; /* host_name */
	h[n++] = 0; h[n++] = (uint8_t)hl;
	memcpy(h + n, host, hl); n += hl;
	/* supported_versions: TLS 1.3 */
	h[n++] = 0; h[n++] = 43; h[n++] = 0; h[n++] = 3; h[n++] = 2; h[n++] = 3; h[n++] = 4;
	size_t ext_len = n - ext_len_at - 2, hs_len = n - hs_len_at - 3, rec_len = n - rec_len_at - 2;
	h[ext_len_at] = (uint8_t)(ext_len >> 8); h[ext_len_at + 1] = (uint8_t)ext_len;
	h[hs_len_at] = 0; h[hs_len_at + 1] = (uint8_t)(hs_len >> 8); h[hs_len_at + 2] = (uint8_t)hs_len;
	h[rec_len_at] = (uint8_t)(rec_len >> 8); h[rec_len_at + 1] = (uint8_t)rec_len;
	return n;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static uint8_t buf[512];
	static const char get[] = "\x01GET http://allowed.test/x?y=1 HTTP/1.1\r\nHost: allowed.test\r\nUser-Agent: t\r\n\r\n";
	static const char conn[] = "\x01" "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n";

	switch (i) {
	case 0:
		*out = (const uint8_t *)get;
		return sizeof(get) - 1;
	case 1:
		*out = (const uint8_t *)conn;
		return sizeof(conn) - 1;
	case 2:
		*out = buf;
		return client_hello(buf);
	default:
		return 0;
	}
}
