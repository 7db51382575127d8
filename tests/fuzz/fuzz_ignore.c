/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the gitignore machinery: .gitignore files come from the workspace,
 * which the agent edits. Input = gitignore text, NUL, a path to match. */
#include <string.h>

#include "airlock/core/mem.h"
#include "airlock/policy/ignore.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	const uint8_t *nul = memchr(data, 0, size);
	size_t tlen = nul ? (size_t)(nul - data) : size;
	const char *path = nul ? (const char *)nul + 1 : "";
	size_t plen = nul ? size - tlen - 1 : 0;
	struct ignore_list l = {0};
	char *src = mem_strdup("fuzz/.gitignore");
	char *text = mem_alloc(tlen + 1);
	const char *why;

	if (!src || !text) {
		mem_free(src);
		mem_free(text);
		return 0;
	}
	memcpy(text, data, tlen);
	text[tlen] = '\0';
	/* Treat the text as one glob as well (policy patterns). */
	if (memchr(text, 0, tlen) == NULL && ignore_glob_check(text, &why) == 0) {
		unsigned long before = ignore_steps();
		(void)ignore_wildmatch(text, tlen, path, plen, 0);
		/* no exponential backtracking: work is bounded by pattern x text */
		FUZZ_ASSERT(ignore_steps() - before <= 8ul * (tlen + 2) * (plen + 2));
	}
	if (ignore_list_parse(&l, src, 5, text, tlen, 0) == 0 && plen && memchr(path, 0, plen) == NULL) {
		for (int d = 0; d < 2; d++) {
			const struct ignore_pattern *m = ignore_list_match(&l, path, plen, d);
			FUZZ_ASSERT(!m || (m >= l.v && m < l.v + l.n)); /* one of the list's own patterns */
		}
		char fmt[64];
		for (size_t i = 0; i < l.n; i++)
			(void)ignore_pattern_format(&l.v[i], fmt, sizeof(fmt));
	}
	ignore_list_clear(&l);
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
	    SEED("build/\n!build/keep\n*.o\n/anchored\n**/deep/**\n\\#literal\n trailing\\ \n[a-z]?x\0src/deep/a/b.o"),
	    SEED("\xef\xbb\xbf# bom\r\n*.log\r\n!important.log\r\n\0logs/important.log"),
	    SEED("a*a*a*a*a*a*a*a*b\n[!abc]*\n[[:alpha:]]*\0aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaac"),
	};
	if (i >= sizeof(seeds) / sizeof(seeds[0]))
		return 0;
	*out = seeds[i].p;
	return seeds[i].n;
}
