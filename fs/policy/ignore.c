/* SPDX-License-Identifier: Apache-2.0 */
/*
 * gitignore pattern matching. Written from the documented semantics
 * (gitignore(5), git's wildmatch behaviour) and checked against
 * `git check-ignore` by tests/unit/policy/test_ignore_oracle.c.
 */
#include "airlock/policy/ignore.h"

#include <errno.h>
#include <stdint.h>
#include <string.h>

#include "airlock/core/mem.h"

#define NONE SIZE_MAX

/* The calling thread's step counter and its budget (ignore.h): wm_limit
 * is the step count at which the budget runs out, 0 without one. Once
 * over, every match fails at once and the first pattern met is kept. */
static _Thread_local unsigned long wm_steps, wm_limit;
static _Thread_local bool wm_over;
static _Thread_local const struct ignore_pattern *wm_over_pat;
static _Thread_local const char *wm_over_src;

unsigned long ignore_steps(void)
{
	return wm_steps;
}

void ignore_budget_start(unsigned long steps)
{
	wm_limit = wm_steps + (steps ? steps : 1);
	wm_over = false;
	wm_over_pat = NULL;
	wm_over_src = NULL;
}

bool ignore_budget_end(const struct ignore_pattern **pat, const char **src)
{
	bool over = wm_over;

	if (pat)
		*pat = wm_over_pat;
	if (src)
		*src = wm_over_src;
	wm_limit = 0;
	wm_over = false;
	wm_over_pat = NULL;
	wm_over_src = NULL;
	return over;
}

/* One step; false once the budget is spent. */
static inline bool step(void)
{
	wm_steps++;
	if (wm_limit && wm_steps > wm_limit)
		wm_over = true;
	return !wm_over;
}

/* Name the pattern that ran out of budget (the first one only). */
static void note_over(const struct ignore_pattern *ip, const char *src)
{
	if (wm_over && !wm_over_pat) {
		wm_over_pat = ip;
		wm_over_src = src;
	}
}

static inline unsigned char fold(unsigned char c, unsigned flags)
{
	return (flags & IGNORE_WM_CASEFOLD) && c >= 'A' && c <= 'Z' ? (unsigned char)(c + 'a' - 'A') : c;
}

static bool is_special(unsigned char c)
{
	return c == '*' || c == '?' || c == '[' || c == '\\';
}

static bool cc_is(int cls, unsigned char c, unsigned flags)
{
	/* ASCII only, like git (locale-independent). */
	bool upper = c >= 'A' && c <= 'Z', lower = c >= 'a' && c <= 'z', digit = c >= '0' && c <= '9';
	bool alpha = upper || lower, print = c >= 0x20 && c < 0x7f;

	switch (cls) {
	case 0:
		return alpha || digit;
	case 1:
		return alpha;
	case 2:
		return c == ' ' || c == '\t';
	case 3:
		return c < 0x20 || c == 0x7f;
	case 4:
		return digit;
	case 5:
		return print && c != ' ';
	case 6:
		return lower;
	case 7:
		return print;
	case 8:
		return print && c != ' ' && !alpha && !digit;
	case 9:
		return c == ' ' || (c >= '\t' && c <= '\r');
	case 10:
		return upper || ((flags & IGNORE_WM_CASEFOLD) && lower);
	case 11:
		return digit || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
	default:
		return false;
	}
}

static int cc_lookup(const unsigned char *name, size_t n)
{
	static const char *const names[] = {"alnum", "alpha", "blank", "cntrl", "digit", "graph",
					    "lower", "print", "punct", "space", "upper", "xdigit"};

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (strlen(names[i]) == n && memcmp(names[i], name, n) == 0)
			return (int)i;
	return -1;
}

/* Bracket expression at p[*pi] == '['. Returns 1 (t is in the set), 0 (not),
 * -1 (unterminated) or -2 (unknown [:class:]); on 0/1 *pi is moved past the
 * closing ']'. The first member may be ']' (literal), a '-' between two
 * members is a range, "\x" is a literal x, "[:name:]" a POSIX class; a "[:"
 * that is not closed by ":]" is an ordinary '['. t has been case-folded
 * when IGNORE_WM_CASEFOLD is set. */
static int match_class(const unsigned char *p, size_t plen, size_t *pi, unsigned char t, unsigned flags)
{
	size_t i = *pi + 1;
	bool negated = false, matched = false, first = true;
	int prev = -1;

	if (i < plen && (p[i] == '!' || p[i] == '^')) {
		negated = true;
		i++;
	}
	for (;;) {
		if (i >= plen)
			return -1;
		unsigned char c = p[i];
		if (c == ']' && !first)
			break;
		first = false;
		if (c == '\\') {
			if (++i >= plen)
				return -1;
			c = p[i];
			if (fold(c, flags) == t)
				matched = true;
			prev = c;
			i++;
		} else if (c == '-' && prev >= 0 && i + 1 < plen && p[i + 1] != ']') {
			unsigned char hi = p[++i];
			if (hi == '\\') {
				if (++i >= plen)
					return -1;
				hi = p[i];
			}
			if (t >= prev && t <= hi)
				matched = true;
			else if ((flags & IGNORE_WM_CASEFOLD) && t >= 'a' && t <= 'z') {
				unsigned char up = (unsigned char)(t - 'a' + 'A');
				if (up >= prev && up <= hi)
					matched = true;
			}
			prev = -1;
			i++;
		} else if (c == '[' && i + 1 < plen && p[i + 1] == ':') {
			size_t s = i + 2, j = s;
			while (j < plen && p[j] != ']')
				j++;
			if (j >= plen)
				return -1;
			if (j == s || p[j - 1] != ':') {
				/* no ":]": the '[' is an ordinary member */
				if (t == '[')
					matched = true;
				prev = '[';
				i++;
				continue;
			}
			int cls = cc_lookup(p + s, j - 1 - s);
			if (cls < 0)
				return -2;
			if (cc_is(cls, t, flags))
				matched = true;
			prev = -1;
			i = j + 1;
		} else {
			if (fold(c, flags) == t)
				matched = true;
			prev = c;
			i++;
		}
	}
	*pi = i + 1;
	if (matched == negated || ((flags & IGNORE_WM_PATHNAME) && t == '/'))
		return 0;
	return 1;
}

/*
 * The matcher. Two resume points instead of recursion:
 *
 *  - s: the last single "*" (cannot cross "/" with IGNORE_WM_PATHNAME).
 *    On a mismatch it swallows one more character and the rest of the
 *    pattern is retried from there (the classic two-pointer glob match:
 *    placing each literal run at its leftmost position is optimal, so only
 *    the last star ever needs to move).
 *  - d: the last "**" bounded by "/" or the pattern ends. The part after it
 *    may start at the current position or, for "**\/", after any later
 *    "/" (any later position for the rare "**\\\/" spelling).
 *
 * With IGNORE_WM_PATHNAME nothing but a literal "/" matches a "/", so each
 * "/" in the text is matched by exactly one "/" of the pattern: once one is
 * consumed, earlier single stars can no longer change the outcome and s is
 * dropped; when s cannot grow past a "/", only d can help. That keeps the
 * work for one start of d to one pass per path segment, O(len(text) *
 * len(pattern)) per d epoch, and d only moves forward.
 */
bool ignore_wildmatch(const char *pat, size_t plen, const char *txt, size_t tlen, unsigned flags)
{
	const unsigned char *p = (const unsigned char *)pat, *t = (const unsigned char *)txt;
	const bool pathname = flags & IGNORE_WM_PATHNAME;
	size_t pi = 0, ti = 0;
	size_t s_pi = NONE, s_ti = 0;
	size_t d_pi = NONE, d_ti = 0;
	bool s_cross = false, d_slash = false;

	/* The pattern must consume the whole text, so its trailing literal run
	 * (back to the last * ? [ ] backslash or "/": a "**" + "/" may match
	 * nothing) must end the text: one compare turns most non-matching
	 * patterns away before any backtracking. */
	size_t tail = 0;
	while (tail < plen && !is_special(p[plen - 1 - tail]) && p[plen - 1 - tail] != ']' && p[plen - 1 - tail] != '/')
		tail++;
	if (tail && tail < plen) {
		if (!step() || tail > tlen)
			return false;
		for (size_t k = 1; k <= tail; k++)
			if (fold(p[plen - k], flags) != fold(t[tlen - k], flags))
				return false;
	}

	for (;;) {
		if (!step())
			return false; /* over budget: the caller fails safe */
		if (pi < plen && p[pi] == '*') {
			size_t q = pi;
			while (q < plen && p[q] == '*')
				q++;
			if (!pathname) {
				/* without PATHNAME every star matches anything */
				if (q == plen)
					return true;
				s_pi = q;
				s_ti = ti;
				s_cross = true;
				pi = q;
				continue;
			}
			if (q - pi >= 2 && (pi == 0 || p[pi - 1] == '/') &&
			    (q == plen || p[q] == '/' || (p[q] == '\\' && q + 1 < plen && p[q + 1] == '/'))) {
				if (q == plen)
					return true; /* trailing "**" matches everything */
				s_pi = NONE;
				d_slash = p[q] == '/';
				d_pi = d_slash ? q + 1 : q;
				d_ti = ti;
				pi = d_pi;
				continue;
			}
			s_pi = q;
			s_ti = ti;
			s_cross = false;
			pi = q;
			continue;
		}
		if (pi < plen && ti < tlen) {
			unsigned char tc = fold(t[ti], flags), pc = p[pi];
			bool ok;
			size_t npi = pi + 1;

			if (pc == '?') {
				ok = !(pathname && tc == '/');
			} else if (pc == '[') {
				npi = pi;
				int r = match_class(p, plen, &npi, tc, flags);
				if (r < 0)
					return false; /* malformed: never matches */
				ok = r;
			} else if (pc == '\\') {
				if (pi + 1 >= plen)
					return false; /* lone trailing backslash */
				ok = fold(p[pi + 1], flags) == tc;
				npi = pi + 2;
			} else {
				ok = fold(pc, flags) == tc;
			}
			if (ok) {
				if (pathname && tc == '/')
					s_pi = NONE;
				pi = npi;
				ti++;
				continue;
			}
		} else if (pi == plen && ti == tlen) {
			return true;
		}
		/* mismatch: let the last star swallow one more character */
		if (s_pi != NONE) {
			if (s_ti < tlen && (s_cross || t[s_ti] != '/')) {
				pi = s_pi;
				ti = ++s_ti;
				continue;
			}
			s_pi = NONE;
		}
		if (d_pi != NONE) {
			if (d_slash) {
				const unsigned char *sl = d_ti < tlen ? memchr(t + d_ti, '/', tlen - d_ti) : NULL;
				if (!sl)
					return false;
				d_ti = (size_t)(sl - t) + 1;
			} else {
				if (d_ti >= tlen)
					return false;
				d_ti++;
			}
			pi = d_pi;
			ti = d_ti;
			continue;
		}
		return false;
	}
}

size_t ignore_trim_trailing_spaces(const char *s, size_t len)
{
	size_t last_space = NONE;

	for (size_t k = 0; k < len; k++) {
		if (s[k] == ' ') {
			if (last_space == NONE)
				last_space = k;
		} else if (s[k] == '\\') {
			if (++k >= len)
				return len; /* lone trailing backslash: leave the line alone */
			last_space = NONE;
		} else {
			last_space = NONE;
		}
	}
	return last_space == NONE ? len : last_space;
}

int ignore_pattern_init(struct ignore_pattern *out, const char *s, size_t len, unsigned extra_flags, unsigned line)
{
	unsigned flags = extra_flags & IGNORE_CASEFOLD;
	size_t i;

	if (len && s[0] == '!') {
		flags |= IGNORE_NEGATIVE;
		s++;
		len--;
	}
	if (len && s[len - 1] == '/') {
		flags |= IGNORE_MUSTBEDIR;
		len--;
	}
	if (len == 0)
		return -EINVAL;
	if (!memchr(s, '/', len))
		flags |= IGNORE_NODIR;
	for (i = 0; i < len && !is_special((unsigned char)s[i]); i++)
		;
	out->nowildcardlen = i;
	if (s[0] == '*') {
		for (i = 1; i < len && !is_special((unsigned char)s[i]); i++)
			;
		if (i == len)
			flags |= IGNORE_ENDSWITH;
	}
	out->text = s;
	out->len = len;
	out->flags = flags;
	out->line = line;
	return 0;
}

static bool eq(const char *a, const char *b, size_t n, unsigned wmflags)
{
	if (!(wmflags & IGNORE_WM_CASEFOLD))
		return memcmp(a, b, n) == 0;
	for (size_t i = 0; i < n; i++)
		if (fold((unsigned char)a[i], wmflags) != fold((unsigned char)b[i], wmflags))
			return false;
	return true;
}

/* bn: offset of the basename in path */
static bool match_one(const struct ignore_pattern *ip, const char *base, size_t baselen, const char *path, size_t len,
		      size_t bnoff, int is_dir)
{
	unsigned wmf = (ip->flags & IGNORE_CASEFOLD) ? IGNORE_WM_CASEFOLD : 0;

	if (!step() || ((ip->flags & IGNORE_MUSTBEDIR) && !is_dir))
		return false;

	if (ip->flags & IGNORE_NODIR) {
		const char *bn = path + bnoff;
		size_t bl = len - bnoff;

		if (ip->nowildcardlen == ip->len)
			return bl == ip->len && eq(ip->text, bn, bl, wmf);
		if (ip->flags & IGNORE_ENDSWITH)
			return ip->len - 1 <= bl && eq(ip->text + 1, bn + bl - (ip->len - 1), ip->len - 1, wmf);
		return ignore_wildmatch(ip->text, ip->len, bn, bl, wmf);
	}

	/* Anchored: the pattern is relative to base (without its slash). */
	const char *pat = ip->text;
	size_t plen = ip->len, prefix = ip->nowildcardlen;
	size_t bl = baselen ? baselen - 1 : 0;

	if (pat[0] == '/') {
		pat++;
		plen--;
		prefix--;
	}
	if (len < bl + 1 || (bl && path[bl] != '/') || !eq(path, base, bl, wmf))
		return false;
	const char *name = bl ? path + bl + 1 : path;
	size_t namelen = bl ? len - bl - 1 : len;

	/* git compares the literal prefix first and globs only the rest; the
	 * rest then starts a pattern of its own, so a "**" right after the
	 * prefix counts as bounded. Matching that split keeps us identical. */
	if (prefix) {
		if (prefix > namelen || !eq(pat, name, prefix, wmf))
			return false;
		pat += prefix;
		plen -= prefix;
		name += prefix;
		namelen -= prefix;
		if (!plen && !namelen)
			return true;
	}
	return ignore_wildmatch(pat, plen, name, namelen, IGNORE_WM_PATHNAME | wmf);
}

static size_t basename_off(const char *path, size_t len)
{
	const char *slash = memrchr(path, '/', len);

	return slash ? (size_t)(slash - path) + 1 : 0;
}

bool ignore_pattern_match(const struct ignore_pattern *ip, const char *base, size_t baselen, const char *path,
			  size_t len, int is_dir)
{
	bool m = match_one(ip, base, baselen, path, len, basename_off(path, len), is_dir);

	note_over(ip, NULL);
	return m;
}

const struct ignore_pattern *ignore_list_match(const struct ignore_list *l, const char *path, size_t len, int is_dir)
{
	size_t bn = basename_off(path, len);

	for (size_t i = l->n; i-- > 0;) {
		if (match_one(&l->v[i], l->src, l->baselen, path, len, bn, is_dir))
			return &l->v[i];
		if (wm_over) {
			note_over(&l->v[i], l->src);
			return NULL;
		}
	}
	return NULL;
}

void ignore_list_clear(struct ignore_list *l)
{
	mem_free(l->src);
	mem_free(l->v);
	mem_free(l->buf);
	memset(l, 0, sizeof(*l));
}

int ignore_list_parse(struct ignore_list *l, char *src, size_t baselen, char *buf, size_t len, unsigned extra_flags)
{
	size_t start = 0, lines = 1;
	unsigned lineno = 1;

	memset(l, 0, sizeof(*l));
	l->src = src;
	l->baselen = baselen;
	l->buf = buf;
	l->bytes = len + (src ? strlen(src) : 0) + 1;

	/* size the array for lines that can hold a pattern (not empty, not a
	 * comment): a file of blank lines costs nothing */
	for (size_t i = 0; i < len; i++)
		lines += buf[i] == '\n' && i + 1 < len && buf[i + 1] != '\n' && buf[i + 1] != '#';
	if (len >= 3 && memcmp(buf, "\xef\xbb\xbf", 3) == 0)
		start = 3;
	if (len) {
		l->v = mem_calloc(lines, sizeof(*l->v));
		if (!l->v) {
			ignore_list_clear(l);
			return -ENOMEM;
		}
		l->bytes += lines * sizeof(*l->v);
	}
	for (size_t s = start; s < len; lineno++) {
		const char *nl = memchr(buf + s, '\n', len - s);
		size_t e = nl ? (size_t)(nl - buf) : len, next = e + 1;

		if (e > s && buf[s] != '#') {
			if (buf[e - 1] == '\r')
				e--;
			const char *nul = memchr(buf + s, '\0', e - s);
			if (nul)
				e = (size_t)(nul - buf); /* git reads lines as C strings */
			e = s + ignore_trim_trailing_spaces(buf + s, e - s);
			if (ignore_pattern_init(&l->v[l->n], buf + s, e - s, extra_flags, lineno) == 0)
				l->n++;
		}
		s = next;
	}
	if (l->n > IGNORE_PATTERNS_MAX) {
		ignore_list_clear(l);
		return -E2BIG;
	}
	return 0;
}

int ignore_list_from_strings(struct ignore_list *l, const char *src, const char *const *pats, size_t n)
{
	size_t total = 0, off = 0;

	memset(l, 0, sizeof(*l));
	for (size_t i = 0; i < n; i++)
		total += strlen(pats[i]) + 1;
	l->src = mem_strdup(src);
	l->buf = mem_alloc(total);
	l->v = mem_calloc(n, sizeof(*l->v));
	if (!l->src || !l->buf || !l->v) {
		ignore_list_clear(l);
		return -ENOMEM;
	}
	for (size_t i = 0; i < n; i++) {
		size_t len = strlen(pats[i]);
		char *s = l->buf + off;

		memcpy(s, pats[i], len + 1);
		off += len + 1;
		len = ignore_trim_trailing_spaces(s, len);
		if (ignore_pattern_init(&l->v[l->n], s, len, 0, (unsigned)i) == 0)
			l->n++;
	}
	l->bytes = total + n * sizeof(*l->v) + strlen(src) + 1;
	return 0;
}

int ignore_glob_check(const char *pat, const char **why)
{
	size_t len = strlen(pat);
	const unsigned char *p = (const unsigned char *)pat;

	if (len == 0) {
		*why = "empty pattern";
		return -EINVAL;
	}
	if (p[0] == '#') {
		*why = "starts with '#', which gitignore reads as a comment (write \\# for a literal '#')";
		return -EINVAL;
	}
	for (size_t i = 0; i < len; i++) {
		if (p[i] < 0x20 || p[i] == 0x7f) {
			*why = "contains a control character";
			return -EINVAL;
		}
	}
	len = ignore_trim_trailing_spaces(pat, len);
	size_t s = p[0] == '!' ? 1 : 0, e = len;
	if (e > s && p[e - 1] == '/')
		e--;
	if (e <= s) {
		*why = "empty pattern";
		return -EINVAL;
	}
	/* components that can never match a normalised workspace path */
	for (size_t c = s + (p[s] == '/'); c < e;) {
		size_t ce = c;
		while (ce < e && p[ce] != '/')
			ce++;
		if ((ce - c == 1 && p[c] == '.') || (ce - c == 2 && p[c] == '.' && p[c + 1] == '.')) {
			*why = "has a '.' or '..' component; patterns are relative to the workspace root";
			return -EINVAL;
		}
		if (ce == c && ce < e) {
			*why = "has an empty component ('//')";
			return -EINVAL;
		}
		c = ce + 1;
	}
	for (size_t i = s; i < e; i++) {
		if (p[i] == '\\') {
			if (i + 1 >= e) {
				*why = "ends with a lone backslash";
				return -EINVAL;
			}
			i++;
		} else if (p[i] == '[') {
			size_t j = i;
			int r = match_class(p, e, &j, 'x', 0);
			if (r == -1) {
				*why = "unterminated character class '['";
				return -EINVAL;
			}
			if (r == -2) {
				*why =
				    "unknown character class (known: [:alnum:] [:alpha:] [:blank:] [:cntrl:] [:digit:] "
				    "[:graph:] [:lower:] [:print:] [:punct:] [:space:] [:upper:] [:xdigit:])";
				return -EINVAL;
			}
			/* match_class leaves j past ']' only on a result of 0/1 */
			i = j - 1;
		}
	}
	return 0;
}

size_t ignore_pattern_format(const struct ignore_pattern *p, char *buf, size_t buflen)
{
	const char *bang = (p->flags & IGNORE_NEGATIVE) ? "!" : "";
	const char *slash = (p->flags & IGNORE_MUSTBEDIR) ? "/" : "";
	size_t need = strlen(bang) + p->len + strlen(slash);

	if (buflen) {
		size_t o = 0;
		const char *parts[3] = {bang, p->text, slash};
		size_t lens[3] = {strlen(bang), p->len, strlen(slash)};
		for (int k = 0; k < 3; k++) {
			size_t n = lens[k] < buflen - 1 - o ? lens[k] : buflen - 1 - o;
			memcpy(buf + o, parts[k], n);
			o += n;
		}
		buf[o] = '\0';
	}
	return need;
}
