/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the egress proxy's parsers: the request head and the first bytes of
 * a tunnel (TLS ClientHello) come from code running in the sandbox. The
 * first input byte picks the parser. */
#include <string.h>

#include "airlock/egress/egress.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	if (data[0] & 1) {
		struct egress_request req;
		const char *why = NULL;
		int r = egress_parse_request(data + 1, size - 1, &req, &why);
		if (r == 1) { /* a complete request names where it goes */
			FUZZ_ASSERT(req.host[0] != '\0' && req.port != 0);
			FUZZ_ASSERT(req.head_len <= size - 1);
		} else if (r > 1) {
			FUZZ_ASSERT(why != NULL); /* every refusal says why */
		}
	} else {
		char sni[256];
		/* every prefix must be answerable: "need more", or a verdict */
		char sni2[256];
		enum egress_tls full = egress_tls_sni(data + 1, size - 1, sni, sizeof(sni));
		if (full == EGRESS_TLS_SNI)
			FUZZ_ASSERT(memchr(sni, '\0', sizeof(sni)) != NULL && sni[0] != '\0');
		/* a verdict on a prefix is final: more bytes cannot change it */
		if (size > 2) {
			enum egress_tls half = egress_tls_sni(data + 1, (size - 1) / 2, sni2, sizeof(sni2));
			FUZZ_ASSERT(half == EGRESS_TLS_MORE || half == full);
		}
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
	h[n++] = 22;
	h[n++] = 3;
	h[n++] = 1; /* record: handshake, TLS 1.0 */
	size_t rec_len_at = n;
	n += 2;
	h[n++] = 1; /* ClientHello */
	size_t hs_len_at = n;
	n += 3;
	h[n++] = 3;
	h[n++] = 3; /* legacy_version */
	memset(h + n, 0x42, 32);
	n += 32;    /* random */
	h[n++] = 0; /* session id */
	h[n++] = 0;
	h[n++] = 2;
	h[n++] = 0x13;
	h[n++] = 0x01; /* cipher suites */
	h[n++] = 1;
	h[n++] = 0; /* compression: null */
	size_t ext_len_at = n;
	n += 2;
	/* server_name */
	h[n++] = 0;
	h[n++] = 0;
	h[n++] = 0;
	h[n++] = (uint8_t)(hl + 5);
	h[n++] = 0;
	h[n++] = (uint8_t)(hl + 3);
	h[n++] = 0; /* host_name */
	h[n++] = 0;
	h[n++] = (uint8_t)hl;
	memcpy(h + n, host, hl);
	n += hl;
	/* supported_versions: TLS 1.3 */
	h[n++] = 0;
	h[n++] = 43;
	h[n++] = 0;
	h[n++] = 3;
	h[n++] = 2;
	h[n++] = 3;
	h[n++] = 4;
	size_t ext_len = n - ext_len_at - 2, hs_len = n - hs_len_at - 3, rec_len = n - rec_len_at - 2;
	h[ext_len_at] = (uint8_t)(ext_len >> 8);
	h[ext_len_at + 1] = (uint8_t)ext_len;
	h[hs_len_at] = 0;
	h[hs_len_at + 1] = (uint8_t)(hs_len >> 8);
	h[hs_len_at + 2] = (uint8_t)hs_len;
	h[rec_len_at] = (uint8_t)(rec_len >> 8);
	h[rec_len_at + 1] = (uint8_t)rec_len;
	return n;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static uint8_t buf[512];
	static const char get[] =
	    "\x01GET http://allowed.test/x?y=1 HTTP/1.1\r\nHost: allowed.test\r\nUser-Agent: t\r\n\r\n";
	static const char conn[] = "\x01"
				   "CONNECT allowed.test:443 HTTP/1.1\r\nHost: allowed.test:443\r\n\r\n";

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
