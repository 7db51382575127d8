/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the two parsers behind credentials and execution.local:
 *  - the user's credentials.json (cred_config_load, through a memfd made
 *    private to us so the ownership check passes), first byte even;
 *  - the `git config --list -z` output that route_git_env turns into
 *    overrides (it comes from the repository's config), first byte odd.
 * Invariants: a loaded config has a non-empty argv for every source; the
 * git environment is well-formed (NAME=value, GIT_CONFIG_COUNT matching
 * the KEY/VALUE pairs, the fixed overrides always present). */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/host/cred.h"
#include "airlock/host/route.h"
#include "fuzz.h"

static void fuzz_config(const uint8_t *data, size_t size)
{
	struct cred_config *cfg = NULL;
	char path[64], err[1024];
	int fd = memfd_create("credentials", MFD_CLOEXEC);

	if (fd < 0)
		return;
	if (fchmod(fd, 0600) < 0 || (size && write(fd, data, size) != (ssize_t)size)) {
		close(fd);
		return;
	}
	snprintf(path, sizeof(path), "/proc/self/fd/%d", fd);
	int r = cred_config_load(path, &cfg, err, sizeof(err));
	FUZZ_ASSERT(r == 0 || err[0]); /* every failure says why */
	if (r == 0) {
		unsigned t = 0;
		const char *const *argv = cred_config_source(cfg, "a", &t);
		FUZZ_ASSERT(!argv || (argv[0] && argv[0][0] && t >= 1 && t <= CRED_TIMEOUT_S_MAX));
		cred_config_free(cfg);
	} else {
		FUZZ_ASSERT(cfg == NULL);
	}
	close(fd);
}

static void fuzz_git(const uint8_t *data, size_t size)
{
	char **v = NULL;
	size_t n = 0, keys = 0, vals = 0;
	long count = -1;
	bool hooks = false;

	if (route_git_env((const char *)data, size, &v, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		const char *eq = strchr(v[i], '=');
		FUZZ_ASSERT(eq && eq != v[i]);
		if (!strncmp(v[i], "GIT_CONFIG_COUNT=", 17))
			count = atol(eq + 1);
		keys += !strncmp(v[i], "GIT_CONFIG_KEY_", 15);
		vals += !strncmp(v[i], "GIT_CONFIG_VALUE_", 17);
		hooks |= !strcmp(v[i], "GIT_CONFIG_VALUE_0=/dev/null"); /* core.hooksPath comes first */
	}
	FUZZ_ASSERT(v[n] == NULL);
	FUZZ_ASSERT(count >= 0 && (size_t)count == keys && keys == vals && hooks);
	route_git_env_free(v, n);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size == 0)
		return 0;
	if (data[0] & 1)
		fuzz_git(data + 1, size - 1);
	else
		fuzz_config(data + 1, size - 1);
	return 0;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static const char cfg[] = "\x00{\"sources\": {\"a\": {\"command\": [\"gh\", \"auth\", \"token\"], "
				  "\"timeout_seconds\": 7}, \"b\": {\"command\": [\"/bin/echo\", \"x\"]}}}";
	static const char git[] = "\x01"
				  "core.hookspath\nhooks2\0filter.F.clean\ncat\0diff.tc.textconv\nx\0"
				  "alias.e\n!x\0credential.https://h.helper\n!y\0core.bare\0pager.log\nz";
	switch (i) {
	case 0:
		*out = (const uint8_t *)cfg;
		return sizeof(cfg) - 1;
	case 1:
		*out = (const uint8_t *)git;
		return sizeof(git) - 1;
	default:
		return 0;
	}
}
