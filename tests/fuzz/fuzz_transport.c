/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz address parsing: addresses come from command lines and config. */
#include <string.h>

#include "airlock/core/transport.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	char text[1024], err[256], back[512];
	struct transport_addr a;

	if (size >= sizeof(text))
		return 0;
	memcpy(text, data, size);
	text[size] = '\0';
	if (transport_parse(text, &a, err, sizeof(err)) == 0) {
		/* The canonical form parses back to the same address. */
		struct transport_addr b;
		transport_format(&a, back, sizeof(back));
		FUZZ_ASSERT(transport_parse(back, &b, err, sizeof(err)) == 0);
		FUZZ_ASSERT(a.kind == b.kind && a.port == b.port && a.cid == b.cid);
		FUZZ_ASSERT(strcmp(a.path, b.path) == 0 && strcmp(a.host, b.host) == 0);
	}
	return 0;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static const char *const seeds[] = {
	    "tcp:127.0.0.1:7000", "tcp:[::1]:22",	"unix:/run/airlock/a.sock", "vsock:3:5000",
	    "vsock:any:1024",	  "fc:/tmp/fc.sock:52", "serial:/dev/vport0p1",
	};
	if (i >= sizeof(seeds) / sizeof(seeds[0]))
		return 0;
	*out = (const uint8_t *)seeds[i];
	return strlen(seeds[i]);
}
