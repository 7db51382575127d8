/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz policy loading: the policy file lives in the repository, which the
 * agent can edit (it takes effect at the next start, but must never crash
 * or mis-parse). The input is handed to policy_load through a memfd. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "airlock/policy/policy.h"
#include "fuzz.h"

/* An empty workspace (no .gitignore files) for policy_check. */
static int empty_root(void)
{
	static int fd = -2;
	if (fd == -2) {
		char dir[] = "/tmp/airlock-fuzz-policy.XXXXXX";
		fd = mkdtemp(dir) ? open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC) : -1;
		if (fd >= 0)
			rmdir(dir); /* the fd keeps the (now empty, unlinked) directory */
	}
	return fd;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct policy *p = NULL;
	char path[64], err[512];
	int fd = memfd_create("policy", MFD_CLOEXEC);

	if (fd < 0)
		return 0;
	if (size && write(fd, data, size) != (ssize_t)size) {
		close(fd);
		return 0;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	if (policy_load(path, &p, err, sizeof(err)) == 0) {
		struct policy_verdict v;
		struct policy_ctx *ctx = NULL;
		static const char *const paths[] = {"src/main.c", ".env", "node_modules/x", ".git/config", "a/b/c.pem"};
		if (empty_root() >= 0 && policy_ctx_new(p, empty_root(), &ctx) == 0) {
			for (size_t i = 0; i < sizeof(paths) / sizeof(paths[0]); i++) {
				int r = policy_check(p, ctx, paths[i], 0, &v);
				FUZZ_ASSERT(r == 0 || r == -ENOMEM);
				/* a withheld path always says which rule withheld it */
				FUZZ_ASSERT(r < 0 || (v.reason == POLICY_SYNCED) == (v.rule[0] == '\0'));
			}
			policy_ctx_free(ctx);
		}
		policy_free(p);
	}
	close(fd);
	return 0;
}

#define SEED(s)                                                                                                        \
	{                                                                                                              \
		(const uint8_t *)(s), sizeof(s) - 1                                                                    \
	}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static const struct {
		const uint8_t *p;
		size_t n;
	} seeds[] = {
	    SEED("{\"workspace\":{\"template\":\"base\",\"ttl_seconds\":3600,\"sync\":{\"include\":[\"src/**\",\"tests/"
		 "**\"],"
		 "\"exclude\":[\".env*\",\"*.pem\"],\"allow_secrets\":[\"config/dev.pem\"],\"gitignore\":true}},"
		 "\"execution\":{\"local\":[\"git status\"],\"remote\":[\"*\"],\"timeout_seconds\":300},"
		 "\"credentials\":{\"forward_env\":[\"CI\"],\"inject\":[{\"name\":\"TOKEN\",\"scope\":\"read:repo\","
		 "\"ttl_seconds\":60}]},\"egress\":{\"default\":\"deny\",\"allow\":[\"registry.npmjs.org\","
		 "\"*.pythonhosted.org\",\"github.com:443\"]}}"),
	    SEED("{}"),
	};
	if (i >= sizeof(seeds) / sizeof(seeds[0]))
		return 0;
	*out = seeds[i].p;
	return seeds[i].n;
}
