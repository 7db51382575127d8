/* SPDX-License-Identifier: Apache-2.0 */
/*
 * ignore: the glob matcher (a table, a differential test against a
 * reference matcher, pathological patterns and their step bound), glob
 * checks and .gitignore parsing (ignore.h). The agreement with git itself
 * is tested by test_ignore_oracle.c.
 */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "testutil.h"

#include "airlock/core/mem.h"
#include "airlock/policy/ignore.h"

struct wm_case {
	const char *pat, *text;
	unsigned flags;
	bool want;
};

#define PN IGNORE_WM_PATHNAME
#define CF IGNORE_WM_CASEFOLD

static const struct wm_case wm_cases[] = {
    {"foo", "foo", 0, true},
    {"foo", "bar", 0, false},
    {"", "", 0, true},
    {"???", "foo", 0, true},
    {"??", "foo", 0, false},
    {"*", "foo", 0, true},
    {"f*", "foo", 0, true},
    {"*f", "foo", 0, false},
    {"*foo*", "foo", 0, true},
    {"*ob*a*r*", "foobar", 0, true},
    {"*ab", "aaaaaaabababab", 0, true},
    {"foo\\*", "foo*", 0, true},
    {"foo\\*bar", "foobar", 0, false},
    {"f\\\\oo", "f\\oo", 0, true},
    {"foo\\", "foo\\", 0, false}, /* lone trailing backslash never matches */
    {"*[al]?", "ball", 0, true},
    {"[ten]", "ten", 0, false},
    {"**[!te]", "ten", 0, true},
    {"**[!ten]", "ten", 0, false},
    {"t[a-g]n", "ten", 0, true},
    {"t[!a-g]n", "ten", 0, false},
    {"t[!a-g]n", "ton", 0, true},
    {"t[^a-g]n", "ton", 0, true},
    {"a[]]b", "a]b", 0, true},
    {"a[]-]b", "a-b", 0, true},
    {"a[]-]b", "a]b", 0, true},
    {"a[]-]b", "aab", 0, false},
    {"a[]a-]b", "aab", 0, true},
    {"]", "]", 0, true},
    {"[!]-]", "]", 0, false},
    {"[!]-]", "a", 0, true},
    {"[a-", "a", 0, false}, /* unterminated: never matches */
    {"[\\-_]", "-", 0, true},
    {"[\\]]", "]", 0, true},
    {"[\\]]", "\\", 0, false},
    {"[[:alpha:]][[:digit:]][[:upper:]]", "a1B", 0, true},
    {"[[:digit:][:upper:][:space:]]", "1", 0, true},
    {"[[:digit:][:upper:][:space:]]", "a", 0, false},
    {"[[:xdigit:]]", "f", 0, true},
    {"[[:punct:]]", ",", 0, true},
    {"[[:foo:]]", "f", 0, false}, /* unknown class: malformed */
    {"[[:alpha]", "[", 0, true},  /* no ":]": ordinary members */
    {"[a-c-e]", "-", 0, true},
    {"[a-c-e]", "d", 0, false},
    /* PATHNAME: wildcards stop at '/', "**" does not */
    {"foo*", "foo/bar", PN, false},
    {"foo*", "foo/bar", 0, true},
    {"foo?bar", "foo/bar", PN, false},
    {"foo[/]bar", "foo/bar", PN, false},
    {"foo/*", "foo/bar", PN, true},
    {"foo/*", "foo/bar/baz", PN, false},
    {"foo/**", "foo/bar/baz", PN, true},
    {"foo/**", "foo", PN, false},
    {"**/foo", "foo", PN, true},
    {"**/foo", "a/b/foo", PN, true},
    {"**/foo", "a/bfoo", PN, false},
    {"foo/**/bar", "foo/bar", PN, true},
    {"foo/**/bar", "foo/a/b/bar", PN, true},
    {"foo/**/bar", "foo/abar", PN, false},
    {"foo/**/**/bar", "foo/x/bar", PN, true},
    {"**", "a/b/c", PN, true},
    {"a**b", "axb", PN, true},
    {"a**b", "ax/b", PN, false}, /* not bounded by '/': an ordinary star */
    {"**foo", "x/foo", PN, false},
    {"*/foo", "x/foo", PN, true},
    {"*/foo", "x/y/foo", PN, false},
    {"**/*.c", "a/b/c.c", PN, true},
    {"**/*.c", "c.c", PN, true},
    {"a/**/*.c/**", "a/x.c/y/z", PN, true},
    {"*/*/*", "a/b", PN, false},
    {"XXX/*/*/*/*/*/*/12/*/*/*/m/*/*/*", "XXX/adobe/courier/bold/o/normal//12/120/75/75/m/70/iso8859/1", PN, true},
    {"XXX/*/*/*/*/*/*/12/*/*/*/m/*/*/*", "XXX/adobe/courier/bold/o/normal//12/120/75/75/X/70/iso8859/1", PN, false},
    {"**/\\*.c", "a/*.c", PN, true},
    /* case folding (secret list) */
    {"*.pem", "KEY.PEM", CF, true},
    {"*.pem", "KEY.PEM", 0, false},
    {"[a-c]x", "Bx", CF, true},
    {"[[:upper:]]", "a", CF, true},
};

static void test_wildmatch_table(void **state)
{
	(void)state;
	for (size_t i = 0; i < sizeof(wm_cases) / sizeof(wm_cases[0]); i++) {
		const struct wm_case *c = &wm_cases[i];
		bool got = ignore_wildmatch(c->pat, strlen(c->pat), c->text, strlen(c->text), c->flags);
		if (got != c->want)
			fail_msg("wildmatch(\"%s\", \"%s\", %u) = %d, want %d", c->pat, c->text, c->flags, got,
				 c->want);
	}
}

/*
 * Reference matcher for the differential test: the glob semantics written
 * down as plainly as possible (exhaustive recursion, exponential, fine for
 * short inputs). Classes limited to what the generator produces: literal
 * members and ranges, optional leading '!'.
 */
static bool ref_match(const char *p, const char *pe, const char *t, const char *te, unsigned flags, const char *ps)
{
	const bool pn = flags & PN;

	if (p == pe)
		return t == te;
	if (*p == '*') {
		const char *q = p;
		while (q < pe && *q == '*')
			q++;
		bool dbl = q - p >= 2;
		if (pn && dbl && (p == ps || p[-1] == '/') && (q == pe || *q == '/')) {
			if (q == pe)
				return true;
			if (ref_match(q + 1, pe, t, te, flags, ps)) /* zero directories */
				return true;
			for (const char *k = t; k <= te; k++) /* anything, then the '/' */
				if (ref_match(q, pe, k, te, flags, ps))
					return true;
			return false;
		}
		for (const char *k = t; k <= te; k++) {
			if (ref_match(q, pe, k, te, flags, ps))
				return true;
			if (k < te && pn && *k == '/')
				return false;
		}
		return false;
	}
	if (t == te)
		return false;
	char tc = (flags & CF) && *t >= 'A' && *t <= 'Z' ? (char)(*t + 32) : *t;
	if (*p == '?')
		return !(pn && tc == '/') && ref_match(p + 1, pe, t + 1, te, flags, ps);
	if (*p == '[') {
		const char *q = p + 1;
		bool neg = false, in = false;
		if (*q == '!') {
			neg = true;
			q++;
		}
		do {
			if (q + 2 < pe && q[1] == '-' && q[2] != ']') {
				in |= tc >= q[0] && tc <= q[2];
				q += 3;
			} else {
				in |= tc == *q;
				q++;
			}
		} while (*q != ']');
		if (in == neg || (pn && tc == '/'))
			return false;
		return ref_match(q + 1, pe, t + 1, te, flags, ps);
	}
	if (*p == '\\') {
		if (p + 1 == pe)
			return false;
		p++;
	}
	char pc = (flags & CF) && *p >= 'A' && *p <= 'Z' ? (char)(*p + 32) : *p;
	return pc == tc && ref_match(p + 1, pe, t + 1, te, flags, ps);
}

static uint64_t rng_state;

static void test_wildmatch_differential(void **state)
{
	(void)state;
	static const char *const ptoks[] = {"a",   "b", "/",  "*",  "**", "?",	 "[ab]", "[!a]", "[a-b]",
					    "\\*", "A", "ab", "ba", "a/", "\\a", "]",	 "*a"};
	static const char ttoks[] = {'a', 'b', '/', '*', 'A'};
	char pat[64], text[16];
	unsigned long cases = 0;

	rng_state = 0x9e3779b97f4a7c15ull;
	for (int i = 0; i < 300000; i++) {
		size_t pl = 0, tl = tu_rand(&rng_state, 9);
		unsigned n = 1 + tu_rand(&rng_state, 6);
		for (unsigned k = 0; k < n; k++) {
			const char *tok = ptoks[tu_rand(&rng_state, sizeof(ptoks) / sizeof(ptoks[0]))];
			memcpy(pat + pl, tok, strlen(tok));
			pl += strlen(tok);
		}
		pat[pl] = '\0';
		for (size_t k = 0; k < tl; k++)
			text[k] = ttoks[tu_rand(&rng_state, sizeof(ttoks))];
		text[tl] = '\0';
		for (unsigned flags = 0; flags < 4; flags++) {
			bool want = ref_match(pat, pat + pl, text, text + tl, flags, pat);
			bool got = ignore_wildmatch(pat, pl, text, tl, flags);
			if (got != want)
				fail_msg("wildmatch(\"%s\", \"%s\", %u) = %d, reference says %d", pat, text, flags, got,
					 want);
			cases++;
		}
	}
	assert_true(cases == 1200000);
}

/* No exponential backtracking: count the matcher's steps. */
static void test_wildmatch_pathological(void **state)
{
	(void)state;
	static char text[8193];
	struct {
		const char *pat;
		unsigned flags;
		char fill;
		bool slashes;
	} cases[] = {
	    {"a*a*a*a*a*a*a*b", 0, 'a', false},		  {"*a*a*a*a*a*a*a*a*a*a*a*a*b", PN, 'a', false},
	    {"*aaaaaaaaaaaaaaaaaaaab", 0, 'a', false},	  {"**/a*a*a*a*a*a*a*b", PN, 'a', true},
	    {"**/**/**/**/**/**/**/**/b", PN, 'a', true}, {"*/*/*/*/*/*/*/*/*/*/*/*/x", PN, 'a', true},
	    {"a**a**a**a**a**a**b", PN, 'a', true},
	};
	const size_t n = sizeof(text) - 1;

	for (size_t c = 0; c < sizeof(cases) / sizeof(cases[0]); c++) {
		for (size_t i = 0; i < n; i++)
			text[i] = cases[c].slashes && i % 7 == 6 ? '/' : cases[c].fill;
		size_t m = strlen(cases[c].pat);
		unsigned long before = ignore_steps();
		bool got = ignore_wildmatch(cases[c].pat, m, text, n, cases[c].flags);
		unsigned long steps = ignore_steps() - before;
		/* O(len(text) * len(pattern)), with room for constant factors */
		if (got || steps > 4 * (n + 1) * (m + 1))
			fail_msg("\"%s\": match=%d after %lu steps (bound %zu)", cases[c].pat, got, steps,
				 4 * (n + 1) * (m + 1));
	}
}

static void test_glob_check(void **state)
{
	(void)state;
	static const char *const good[] = {"*.pem",  "src/**", "!keep", "/root",   "dir/", "\\#file",	 "a\\ ",
					   "[a-z]*", "[]]",    "[!]]",	"**/x/**", "a b",  "[[:alpha:]]"};
	static const struct {
		const char *pat, *why;
	} bad[] = {
	    {"", "empty"},
	    {"!", "empty"},
	    {"/", "empty"},
	    {"   ", "empty"},
	    {"#x", "comment"},
	    {"[a-", "unterminated"},
	    {"a[", "unterminated"},
	    {"[[:x:]]", "unknown character class"},
	    {"x\\", "backslash"},
	    {"./src", "'..' component"},
	    {"a/../b", "'..' component"},
	    {"a//b", "empty component"},
	    {"a\tb", "control"},
	};
	const char *why;

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		if (ignore_glob_check(good[i], &why) != 0)
			fail_msg("\"%s\" refused: %s", good[i], why);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		why = NULL;
		if (ignore_glob_check(bad[i].pat, &why) != -EINVAL)
			fail_msg("\"%s\" accepted", bad[i].pat);
		if (!strstr(why, bad[i].why))
			fail_msg("\"%s\": reason \"%s\" lacks \"%s\"", bad[i].pat, why, bad[i].why);
	}
}

/* gitignore file parsing: BOM, CRLF, comments, blanks, trailing spaces,
 * escapes, negation, dir-only; line numbers kept. */
static void test_ignore_parse(void **state)
{
	(void)state;
	const char text[] = "\xef\xbb\xbf# comment\r\n"
			    "*.o\r\n"
			    "\n"
			    "   \n"
			    "!keep.o\n"
			    "\\#hash\n"
			    "\\!bang\n"
			    "trail   \n"
			    "esc\\ \n"
			    "dir/\n"
			    "/anchored\n"
			    "a/b\n"
			    "!\n"
			    "last";
	struct ignore_list l;
	char *buf = mem_alloc(sizeof(text)), *src = mem_strdup("sub/.gitignore");
	char out[64];

	memcpy(buf, text, sizeof(text));
	assert_int_equal(ignore_list_parse(&l, src, 4, buf, sizeof(text) - 1, 0), 0);
	static const struct {
		const char *fmt;
		unsigned line, flags;
	} want[] = {
	    {"*.o", 2, IGNORE_NODIR | IGNORE_ENDSWITH},
	    {"!keep.o", 5, IGNORE_NODIR | IGNORE_NEGATIVE},
	    {"\\#hash", 6, IGNORE_NODIR},
	    {"\\!bang", 7, IGNORE_NODIR},
	    {"trail", 8, IGNORE_NODIR},
	    {"esc\\ ", 9, IGNORE_NODIR},
	    {"dir/", 10, IGNORE_NODIR | IGNORE_MUSTBEDIR},
	    {"/anchored", 11, 0},
	    {"a/b", 12, 0},
	    {"last", 14, IGNORE_NODIR},
	};
	assert_int_equal(l.n, sizeof(want) / sizeof(want[0]));
	for (size_t i = 0; i < l.n; i++) {
		ignore_pattern_format(&l.v[i], out, sizeof(out));
		assert_string_equal(out, want[i].fmt);
		assert_int_equal(l.v[i].line, want[i].line);
		assert_int_equal(l.v[i].flags, want[i].flags);
	}
	/* matching relative to the list's directory */
	assert_non_null(ignore_list_match(&l, "sub/x/y.o", 9, 0));
	assert_true(ignore_list_match(&l, "sub/keep.o", 10, 0)->flags & IGNORE_NEGATIVE);
	assert_non_null(ignore_list_match(&l, "sub/#hash", 9, 0));
	assert_non_null(ignore_list_match(&l, "sub/esc ", 8, 0));
	assert_null(ignore_list_match(&l, "sub/esc", 7, 0));
	assert_non_null(ignore_list_match(&l, "sub/dir", 7, 1));
	assert_null(ignore_list_match(&l, "sub/dir", 7, 0));
	assert_non_null(ignore_list_match(&l, "sub/anchored", 12, 0));
	assert_null(ignore_list_match(&l, "sub/x/anchored", 14, 0));
	assert_non_null(ignore_list_match(&l, "sub/a/b", 7, 0));
	assert_null(ignore_list_match(&l, "sub/x/a/b", 9, 0));
	assert_null(ignore_list_match(&l, "subx/a/b", 8, 0));
	ignore_list_clear(&l);
	ignore_list_clear(&l);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_wildmatch_table),	   cmocka_unit_test(test_wildmatch_differential),
	    cmocka_unit_test(test_wildmatch_pathological), cmocka_unit_test(test_glob_check),
	    cmocka_unit_test(test_ignore_parse),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
