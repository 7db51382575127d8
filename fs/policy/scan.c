/* SPDX-License-Identifier: Apache-2.0 */
/*
 * scan: secrets by content (scan.h). The rules follow the token formats
 * the providers publish and the regular expressions of the common secret
 * scanners (gitleaks, trufflehog, GitHub secret scanning), written as
 * anchor + matcher so the text is walked once: a two-byte prefilter says
 * where an anchor may start, the anchor is compared, and only then does
 * the rule's matcher look at the bytes around it.
 *
 * doc/SECRETS.md "Content rules" documents this table (the test checks
 * that every rule id appears there): change both together.
 */
#include "airlock/policy/scan.h"

#include <assert.h>
#include <math.h>
#include <pthread.h>
#include <stdbool.h>
#include <string.h>
#include <strings.h>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define HAVE_SIMD 1
#endif

/* ---- character classes ---- */

enum {
	CS_ALNUM = 1, /* [A-Za-z0-9] */
	CS_UPALNUM,   /* [A-Z0-9] */
	CS_ALNUM_US,  /* [A-Za-z0-9_] */
	CS_B64URL,    /* [A-Za-z0-9_-] */
	CS_B64,	      /* [A-Za-z0-9+/=] */
	CS_HEXLOWER,  /* [a-f0-9] */
};

static bool is_up(uint8_t c)
{
	return c >= 'A' && c <= 'Z';
}
static bool is_low(uint8_t c)
{
	return c >= 'a' && c <= 'z';
}
static bool is_dig(uint8_t c)
{
	return c >= '0' && c <= '9';
}
static bool is_alnum(uint8_t c)
{
	return is_up(c) || is_low(c) || is_dig(c);
}
static bool is_b64url(uint8_t c)
{
	return is_alnum(c) || c == '_' || c == '-';
}
static bool is_b64(uint8_t c)
{
	return is_alnum(c) || c == '+' || c == '/' || c == '=';
}

static bool in_set(unsigned cs, uint8_t c)
{
	switch (cs) {
	case CS_ALNUM:
		return is_alnum(c);
	case CS_UPALNUM:
		return is_up(c) || is_dig(c);
	case CS_ALNUM_US:
		return is_alnum(c) || c == '_';
	case CS_B64URL:
		return is_b64url(c);
	case CS_B64:
		return is_b64(c);
	case CS_HEXLOWER:
		return is_dig(c) || (c >= 'a' && c <= 'f');
	default:
		return false;
	}
}

/* Length of the run of class cs at p[i..n), at most cap. */
static size_t run(unsigned cs, const uint8_t *p, size_t n, size_t i, size_t cap)
{
	size_t k = 0;
	while (i + k < n && k < cap && in_set(cs, p[i + k]))
		k++;
	return k;
}

/* A token starts here: the byte before is not part of a word. */
static bool starts_word(const uint8_t *p, size_t at)
{
	return at == 0 || !(is_alnum(p[at - 1]) || p[at - 1] == '_');
}

double scan_entropy(const uint8_t *p, size_t n)
{
	unsigned cnt[256] = {0};
	double h = 0;

	if (n == 0)
		return 0;
	for (size_t i = 0; i < n; i++)
		cnt[p[i]]++;
	for (unsigned c = 0; c < 256; c++) {
		if (!cnt[c])
			continue;
		double f = (double)cnt[c] / (double)n;
		h -= f * log2(f);
	}
	return h;
}

/* ---- matchers ---- */

/* anchor, then min..max bytes of r->charset (max 0: no upper bound),
 * then not another word byte */
static int m_token(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t a = strlen(r->anchor), cap = r->max ? (size_t)r->max + 1 : 4096;
	size_t k = run(r->charset, p, n, at + a, cap);

	if (!starts_word(p, at) || k < r->min || (r->max && k > r->max))
		return 0;
	size_t e = at + a + k;
	return e >= n || !(is_alnum(p[e]) || p[e] == '_');
}

/* AKIA/ASIA + 16 of [A-Z0-9]; the documentation's example ids (ending
 * in EXAMPLE) are not keys */
static int m_aws_id(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	if (!m_token(r, p, n, at))
		return 0;
	return memcmp(p + at + 13, "EXAMPLE", 7) != 0;
}

/* Skip "  :  " / " = " and an opening quote after a key name. */
static size_t skip_assign(const uint8_t *p, size_t n, size_t i)
{
	bool sep = false;
	while (i < n &&
	       (p[i] == ' ' || p[i] == '\t' || p[i] == '"' || p[i] == '\'' || (!sep && (p[i] == '=' || p[i] == ':')))) {
		if (p[i] == '=' || p[i] == ':')
			sep = true;
		i++;
	}
	return sep ? i : n;
}

/* aws_secret_access_key = <40 of [A-Za-z0-9/+]> */
static int m_aws_secret(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t i = skip_assign(p, n, at + strlen(r->anchor)), k = 0;
	while (i + k < n && k < 41 && (is_alnum(p[i + k]) || p[i + k] == '/' || p[i + k] == '+'))
		k++;
	return k == 40;
}

/* "-----BEGIN <words> PRIVATE KEY-----" (or the PGP block), then within a
 * few lines a base64 body of at least 40 characters: the header alone is a
 * string a PEM parser's source holds, not a key. */
static int pem_body(const uint8_t *p, size_t n, size_t i)
{
	size_t end = i + 1024 < n ? i + 1024 : n, k;

	for (int hdr = 0; hdr < 8; hdr++) {
		/* line breaks, real or escaped (JSON, a string literal), and the
		 * quotes and '+' of a literal split over lines */
		while (i < end &&
		       (p[i] == '\n' || p[i] == '\r' || p[i] == ' ' || p[i] == '\t' || p[i] == '"' || p[i] == '\'' ||
			p[i] == '+' || (p[i] == '\\' && i + 1 < end && (p[i + 1] == 'n' || p[i + 1] == 'r') && ++i)))
			i++;
		/* an armor or RFC 1421 header line ("Proc-Type: 4,ENCRYPTED",
		 * "Version: GnuPG"): skip it */
		for (k = i; k < end && (is_alnum(p[k]) || p[k] == '-'); k++)
			;
		if (k == i || k >= end || p[k] != ':')
			break;
		while (k < end && p[k] != '\n' && !(p[k] == '\\' && k + 1 < end && p[k + 1] == 'n'))
			k++;
		i = k;
	}
	/* the body starts here: a base64 line */
	for (k = 0; i + k < end && is_b64(p[i + k]); k++)
		;
	return k >= 40;
}

static int m_private_key(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	static const char tail[] = "PRIVATE KEY-----";
	size_t i = at + strlen(r->anchor), lim = i + 48;
	(void)r;
	for (; i < n && i < lim && (is_up(p[i]) || is_dig(p[i]) || p[i] == ' '); i++)
		if (n - i >= sizeof(tail) - 1 && memcmp(p + i, tail, sizeof(tail) - 1) == 0)
			return pem_body(p, n, i + sizeof(tail) - 1);
	return 0;
}

static int m_pgp_private(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	return pem_body(p, n, at + strlen(r->anchor));
}

/* "private_key": "-----BEGIN (a service-account JSON key) */
static int m_gcp_key(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t i = skip_assign(p, n, at + strlen(r->anchor)), lim = i + 64;
	if (n - i < 10 || i >= n || memcmp(p + i, "-----BEGIN", 10) != 0)
		return 0;
	for (i += 10; i + 8 <= n && i < lim; i++)
		if (memcmp(p + i, "KEY-----", 8) == 0)
			return pem_body(p, n, i + 8);
	return 0;
}

/* AccountKey=<base64 of 64 bytes>; SharedAccessKey=<base64> */
static int m_b64_value(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t i = at + strlen(r->anchor);
	return run(CS_B64, p, n, i, r->min) >= r->min;
}

/* xox[baprs]-<at least 10 of [A-Za-z0-9-]> */
static int m_slack(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t i = at + 3, k = 0;
	(void)r;
	if (!starts_word(p, at) || i + 1 >= n || !strchr("baprs", p[i]) || p[i] == 0 || p[i + 1] != '-')
		return 0;
	for (i += 2; i + k < n && (is_alnum(p[i + k]) || p[i + k] == '-'); k++)
		;
	return k >= 10;
}

/* hooks.slack.com/services/T…/B…/secret */
static int m_slack_hook(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t i = at + strlen(r->anchor), k = 0, slashes = 0;
	for (; i + k < n && (is_alnum(p[i + k]) || p[i + k] == '/'); k++)
		slashes += p[i + k] == '/';
	return slashes >= 2 && k >= 20;
}

/* Discord bot token: [MNO] + 23..25 | '.' 6 '.' | 27..38, anchored at its
 * first '.' (the token has no literal prefix). */
static int m_discord(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t b = 0, k;
	(void)r;
	if (at + 8 >= n || p[at + 7] != '.' || run(CS_B64URL, p, n, at + 1, 6) != 6)
		return 0;
	while (b < at && b < 27 && is_b64url(p[at - 1 - b]))
		b++;
	if (b < 24 || b > 26 || !strchr("MNO", p[at - b]) || !starts_word(p, at - b) ||
	    (at - b > 0 && p[at - b - 1] == '-'))
		return 0;
	k = run(CS_B64URL, p, n, at + 8, 40);
	return k >= 27 && k <= 38;
}

/* eyJ….eyJ….sig (header and payload are base64url JSON objects) */
static int m_jwt(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	size_t i = at, k;
	(void)r;
	if (at > 0 && (is_b64(p[at - 1]) || p[at - 1] == '_' || p[at - 1] == '-'))
		return 0;
	if ((k = run(CS_B64URL, p, n, i, 8192)) < 10 || i + k >= n || p[i + k] != '.')
		return 0;
	i += k + 1;
	if (n - i < 3 || memcmp(p + i, "eyJ", 3) != 0 || (k = run(CS_B64URL, p, n, i, 65536)) < 10 || i + k >= n ||
	    p[i + k] != '.')
		return 0;
	i += k + 1;
	return run(CS_B64URL, p, n, i, 16) >= 16;
}

/* ---- dotenv-style assignments ---- */

/* NAME=value on one line: "[export ]NAME = value", NAME in upper snake
 * case (dotenv, shell, Docker env files, Python settings). Ordinary code
 * (`const apiKey = process.env.API_KEY`, `x == y`) is not this shape. */
struct assign {
	const uint8_t *name, *val;
	size_t nlen, vlen;
	bool quoted;
};

static bool parse_assign(const uint8_t *p, size_t n, size_t at, struct assign *a)
{
	size_t i = at, e;

	if (at + 1 < n && p[at + 1] == '=')
		return false;
	/* backwards from the '=': blanks, the name, blanks, "export", line start */
	while (i > 0 && (p[i - 1] == ' ' || p[i - 1] == '\t'))
		i--;
	e = i;
	while (i > 0 && e - i < 128 && (is_up(p[i - 1]) || is_dig(p[i - 1]) || p[i - 1] == '_'))
		i--;
	if (i == e || !is_up(p[i]))
		return false;
	a->name = p + i;
	a->nlen = e - i;
	while (i > 0 && (p[i - 1] == ' ' || p[i - 1] == '\t'))
		i--;
	if (i >= 6 && memcmp(p + i - 6, "export", 6) == 0 && i < (size_t)(a->name - p))
		i -= 6;
	while (i > 0 && (p[i - 1] == ' ' || p[i - 1] == '\t'))
		i--;
	if (i > 0 && p[i - 1] != '\n')
		return false;
	for (i = at + 1; i < n && (p[i] == ' ' || p[i] == '\t'); i++)
		;
	a->quoted = i < n && (p[i] == '"' || p[i] == '\'');
	if (a->quoted) {
		uint8_t q = p[i++];
		for (e = i; e < n && e - i < 512 && p[e] != q && p[e] != '\n'; e++)
			;
		if (e >= n || p[e] != q)
			return false;
	} else {
		for (e = i; e < n && e - i < 512 && p[e] != ' ' && p[e] != '\t' && p[e] != '\n' && p[e] != '\r' &&
			    p[e] != '#' && p[e] != ';';
		     e++)
			;
	}
	a->val = p + i;
	a->vlen = e - i;
	return true;
}

static bool has_ci(const uint8_t *p, size_t n, const char *w)
{
	size_t wl = strlen(w);
	for (size_t i = 0; i + wl <= n; i++)
		if (strncasecmp((const char *)p + i, w, wl) == 0)
			return true;
	return false;
}

/* A component of the name (split at '_') says it holds a secret. */
static bool secret_name(const uint8_t *name, size_t n)
{
	static const char *const words[] = {
	    "SECRET", "SECRETS", "TOKEN",      "TOKENS",      "PASSWORD", "PASSWD",    "PASSPHRASE",
	    "PASS",   "PWD",	 "CREDENTIAL", "CREDENTIALS", "CREDS",	  "AUTH",      "APIKEY",
	    "KEY",    "DSN",	 "PRIVATE",    "SALT",	      "PAT",	  "SECRETKEY", "ACCESSKEY",
	};
	for (size_t i = 0; i < n;) {
		size_t j = i;
		while (j < n && name[j] != '_')
			j++;
		for (size_t w = 0; w < sizeof(words) / sizeof(words[0]); w++)
			if (strlen(words[w]) == j - i && memcmp(words[w], name + i, j - i) == 0)
				return true;
		i = j + 1;
	}
	return false;
}

/* Not a literal value: a reference, a template, a placeholder. */
static bool placeholder(const uint8_t *v, size_t n)
{
	static const char *const marks[] = {
	    "${",    "{{",    "$(",   "%(",   "changeme", "change_me", "change-me",   "example", "placeholder", "dummy",
	    "your_", "your-", "xxxx", "****", "replace",  "redacted",  "secret_here", "<",	 "..."};
	if (!n || v[0] == '$' || v[0] == '%' || v[0] == '`' || v[0] == '@' || v[0] == '/' || v[0] == '.')
		return true;
	for (size_t i = 0; i < sizeof(marks) / sizeof(marks[0]); i++)
		if (has_ci(v, n, marks[i]))
			return true;
	size_t same = 1;
	for (size_t i = 1; i < n; i++)
		same += v[i] == v[0];
	return same == n;
}

/* Character classes present among upper, lower, digit, other symbols;
 * word separators ('_', '-', '.') do not count. */
static unsigned classes(const uint8_t *v, size_t n)
{
	bool u = false, l = false, d = false, o = false;
	for (size_t i = 0; i < n; i++) {
		uint8_t c = v[i];
		if (is_up(c))
			u = true;
		else if (is_low(c))
			l = true;
		else if (is_dig(c))
			d = true;
		else if (c != '_' && c != '-' && c != '.')
			o = true;
	}
	return (unsigned)u + l + d + o;
}

/* An unquoted value that is code, not a literal: an expression or call
 * (brackets, a trailing comma: a C enum or initializer), or another
 * constant's name (NL80211_KEY_MAX = __NL80211_KEY_AFTER_LAST). */
static bool code_value(const uint8_t *v, size_t n)
{
	bool ident = true, path = is_up(v[0]) || is_low(v[0]), dot = false;
	for (size_t i = 0; i < n; i++) {
		if (strchr("()[]{},<>\"'\\", v[i]) && v[i])
			return true; /* also a prefixed literal: r"...", b'...' */
		if (!(is_up(v[i]) || is_dig(v[i]) || v[i] == '_'))
			ident = false;
		if (v[i] == '.')
			dot = true;
		else if (!(is_alnum(v[i]) || v[i] == '_'))
			path = false;
	}
	/* another constant, or an attribute path (ExtensionOID.AUTHORITY_KEY) */
	return ident || v[0] == '_' || (path && dot);
}

/* A quoted value that is a template or a pattern, not a literal: a format
 * string ("{team}", "%s"), a regular expression ("[0-9A-F]{1,4}"), a URL
 * (url-credentials judges those). */
static bool template_value(const uint8_t *v, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (v[i] == '{' || v[i] == '[' || (v[i] == '%' && i + 1 < n && is_low(v[i + 1])))
			return true;
	return has_ci(v, n, "://");
}

/* A secret-named variable with a literal, non-trivial value. */
static int m_dotenv_named(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	struct assign a;
	(void)r;
	if (!parse_assign(p, n, at, &a) || !secret_name(a.name, a.nlen) || a.vlen < 8)
		return 0;
	if (placeholder(a.val, a.vlen) || memchr(a.val, ' ', a.vlen) || memchr(a.val, '$', a.vlen) ||
	    classes(a.val, a.vlen) < 2 || (a.quoted ? template_value(a.val, a.vlen) : code_value(a.val, a.vlen)))
		return 0;
	/* a short value cannot reach much entropy (at most log2 of its length) */
	return scan_entropy(a.val, a.vlen) >= (a.vlen < 16 ? 2.5 : 3.0);
}

/* Any upper-case variable whose value is long and random-looking: more
 * than hex can carry (so checksums, git hashes and UUIDs stay out), from a
 * token alphabet, mixed classes. */
static int m_dotenv_entropy(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	struct assign a;
	(void)r;
	if (!parse_assign(p, n, at, &a) || a.vlen < 20 || placeholder(a.val, a.vlen) ||
	    (!a.quoted && code_value(a.val, a.vlen)))
		return 0;
	for (size_t i = 0; i < a.vlen; i++)
		if (!(is_b64url(a.val[i]) || a.val[i] == '+' || a.val[i] == '/' || a.val[i] == '=' || a.val[i] == '.' ||
		      a.val[i] == '~'))
			return 0;
	return classes(a.val, a.vlen) >= 3 && scan_entropy(a.val, a.vlen) >= 4.2;
}

/* scheme://user:password@host with a literal password */
static int m_url_creds(const struct scan_rule *r, const uint8_t *p, size_t n, size_t at)
{
	static const char *const fake[] = {"password", "pass", "passwd", "secret", "token", "pwd", "changeme"};
	size_t i = at + strlen(r->anchor), u = i, c, e;
	(void)r;
	if (at == 0 || !is_alnum(p[at - 1]))
		return 0;
	while (u < n && u - i < 128 && (is_b64url(p[u]) || p[u] == '.' || p[u] == '%'))
		u++;
	if (u == i || u >= n || p[u] != ':')
		return 0;
	for (c = e = u + 1; e < n && e - c < 256 && p[e] != '@' && p[e] != '/' && p[e] != ' ' && p[e] != '\n' &&
			    p[e] != '"' && p[e] != '\'';
	     e++)
		;
	if (e >= n || p[e] != '@' || e - c < 6 || placeholder(p + c, e - c))
		return 0;
	/* documentation's hosts (RFC 2606) */
	size_t h = e + 1, he = h;
	while (he < n && he - h < 256 && (is_alnum(p[he]) || p[he] == '.' || p[he] == '-'))
		he++;
	if (has_ci(p + h, he - h, "example.") || has_ci(p + h, he - h, ".example") ||
	    has_ci(p + h, he - h, "localhost"))
		return 0;
	for (size_t f = 0; f < sizeof(fake) / sizeof(fake[0]); f++)
		if (strlen(fake[f]) == e - c && strncasecmp((const char *)p + c, fake[f], e - c) == 0)
			return 0;
	return e + 1 < n && is_alnum(p[e + 1]);
}

/* ---- the table ---- */

/* One entry per line reads best as a table. */
/* clang-format off */
#define TOK(id, anchor, cs, mn, mx, what) { id, what, anchor, 0, m_token, cs, mn, mx }
#define FN(id, anchor, fn, what)          { id, what, anchor, 0, fn, 0, 0, 0 }
#define FNI(id, anchor, fn, what)         { id, what, anchor, 1, fn, 0, 0, 0 }

static const struct scan_rule rules[] = {
	/* private keys */
	FN("private-key", "-----BEGIN ", m_private_key, "PEM private key block"),
	FN("pgp-private-key", "-----BEGIN PGP PRIVATE KEY BLOCK-----", m_pgp_private, "PGP private key block"),
	/* cloud providers */
	{ "aws-access-key-id", "AWS access key id", "AKIA", 0, m_aws_id, CS_UPALNUM, 16, 16 },
	{ "aws-temporary-key-id", "AWS temporary access key id", "ASIA", 0, m_aws_id, CS_UPALNUM, 16, 16 },
	FNI("aws-secret-access-key", "aws_secret_access_key", m_aws_secret, "AWS secret access key"),
	FN("gcp-service-account-key", "\"private_key\"", m_gcp_key, "Google Cloud service-account key (JSON)"),
	{ "azure-storage-key", "Azure storage account key (connection string)", "AccountKey=", 1, m_b64_value, 0, 40, 0 },
	{ "azure-shared-access-key", "Azure shared access key (connection string)", "SharedAccessKey=", 1, m_b64_value, 0, 32, 0 },
	/* git hosts */
	TOK("github-pat", "ghp_", CS_ALNUM, 36, 0, "GitHub personal access token"),
	TOK("github-oauth", "gho_", CS_ALNUM, 36, 0, "GitHub OAuth token"),
	TOK("github-user-token", "ghu_", CS_ALNUM, 36, 0, "GitHub user-to-server token"),
	TOK("github-server-token", "ghs_", CS_ALNUM, 36, 0, "GitHub server-to-server token"),
	TOK("github-refresh-token", "ghr_", CS_ALNUM, 36, 0, "GitHub refresh token"),
	TOK("github-fine-grained-pat", "github_pat_", CS_ALNUM_US, 60, 0, "GitHub fine-grained personal access token"),
	TOK("gitlab-pat", "glpat-", CS_B64URL, 20, 0, "GitLab personal access token"),
	/* chat */
	FN("slack-token", "xox", m_slack, "Slack token"),
	FN("slack-webhook", "hooks.slack.com/services/", m_slack_hook, "Slack incoming webhook URL"),
	FN("discord-bot-token", ".", m_discord, "Discord bot token"),
	/* payment */
	TOK("stripe-secret-key", "sk_live_", CS_ALNUM, 24, 0, "Stripe live secret key"),
	TOK("stripe-restricted-key", "rk_live_", CS_ALNUM, 24, 0, "Stripe live restricted key"),
	/* package registries */
	TOK("npm-token", "npm_", CS_ALNUM, 36, 36, "npm access token"),
	TOK("pypi-token", "pypi-AgEIcHlwaS5vcmc", CS_B64URL, 50, 0, "PyPI upload token"),
	TOK("rubygems-key", "rubygems_", CS_HEXLOWER, 48, 48, "RubyGems API key"),
	/* generic */
	FN("jwt", "eyJ", m_jwt, "JSON web token"),
	FN("url-credentials", "://", m_url_creds, "URL with a password (user:password@host)"),
	FN("dotenv-secret", "=", m_dotenv_named, "secret-named variable with a literal value (NAME=value)"),
	FN("dotenv-high-entropy", "=", m_dotenv_entropy, "variable with a long random-looking value (NAME=value)"),
};
/* clang-format on */

#define N_RULES (sizeof(rules) / sizeof(rules[0]))

/* Prefilter. One-byte anchors ('=', '.') are checked wherever the byte
 * is. For the others (three bytes or more),
 * bit (a << 8 | b) of pair is set when some anchor starts with the bytes
 * a, b, and bit (b << 8 | c) of pair2 when some anchor's second and third
 * bytes are b, c (all case combinations for a case-folded one);
 * bypair[a << 8 | b] indexes the list of rules starting with a, b. Clean
 * text costs one or two bit tests per byte. */
#define MAX_PAIR_LISTS 64
static struct {
	uint8_t pair[65536 / 8];
	uint8_t pair2[65536 / 8];	 /* the same for the anchors' second and third bytes */
	uint8_t bypair[65536];		 /* 0: none, else list index + 1 */
	uint8_t list[MAX_PAIR_LISTS][8]; /* rule indices */
	uint8_t nlist[MAX_PAIR_LISTS];
	unsigned nlists;
	uint8_t single[N_RULES];   /* rules with a one-byte anchor */
	uint8_t single_first[256]; /* bytes that start one */
	unsigned nsingle;
	uint8_t alen[N_RULES]; /* anchor lengths */
} pre;
static pthread_once_t pre_once = PTHREAD_ONCE_INIT;

static uint8_t flip(uint8_t c)
{
	return is_up(c) ? (uint8_t)(c + 32) : is_low(c) ? (uint8_t)(c - 32) : c;
}

static void add_pair(uint8_t a, uint8_t b, size_t r)
{
	unsigned k = (unsigned)a << 8 | b;
	pre.pair[k >> 3] |= (uint8_t)(1u << (k & 7));
	if (!pre.bypair[k]) {
		assert(pre.nlists < MAX_PAIR_LISTS);
		pre.bypair[k] = (uint8_t)(++pre.nlists);
	}
	unsigned l = pre.bypair[k] - 1u;
	assert(pre.nlist[l] < sizeof(pre.list[l]));
	pre.list[l][pre.nlist[l]++] = (uint8_t)r;
}

#ifdef HAVE_SIMD
static void teddy_init(void);
#endif

static void precompute(void)
{
	_Static_assert(N_RULES < 256, "rule indices fit a byte");
	for (size_t r = 0; r < N_RULES; r++) {
		const uint8_t *a = (const uint8_t *)rules[r].anchor;
		size_t al = strlen(rules[r].anchor);
		assert(al > 0 && al < 256);
		pre.alen[r] = (uint8_t)al;
		if (al == 1) {
			pre.single[pre.nsingle++] = (uint8_t)r;
			pre.single_first[a[0]] = 1;
			continue;
		}
		assert(al >= 3); /* the filter looks at three bytes */
		add_pair(a[0], a[1], r);
		for (int f = 0; f < 4; f++) {
			uint8_t x = f & 1 && rules[r].casefold ? flip(a[1]) : a[1];
			uint8_t y = f & 2 && rules[r].casefold ? flip(a[2]) : a[2];
			unsigned k = (unsigned)x << 8 | y;
			pre.pair2[k >> 3] |= (uint8_t)(1u << (k & 7));
		}
		if (rules[r].casefold) {
			if (flip(a[0]) != a[0])
				add_pair(flip(a[0]), a[1], r);
			if (flip(a[1]) != a[1])
				add_pair(a[0], flip(a[1]), r);
			if (flip(a[0]) != a[0] && flip(a[1]) != a[1])
				add_pair(flip(a[0]), flip(a[1]), r);
		}
	}
#ifdef HAVE_SIMD
	teddy_init();
#endif
}

/* Rule r's anchor at p[i..n) and its matcher agrees. */
static bool try_rule(size_t r, const uint8_t *p, size_t n, size_t i)
{
	const struct scan_rule *ru = &rules[r];
	size_t al = pre.alen[r];

	if (n - i < al)
		return false;
	if (ru->casefold ? strncasecmp((const char *)p + i, ru->anchor, al) != 0 : memcmp(p + i, ru->anchor, al) != 0)
		return false;
	return ru->match(ru, p, n, i) != 0;
}

/* The first hit at an offset below lim of the multi-byte anchors:
 * its offset (rule in *rule), or lim. */
static inline bool maybe_anchor(const uint8_t *p, size_t i)
{
	unsigned k = (unsigned)p[i] << 8 | p[i + 1], k2 = (unsigned)p[i + 1] << 8 | p[i + 2];
	return (pre.pair[k >> 3] & (1u << (k & 7))) && (pre.pair2[k2 >> 3] & (1u << (k2 & 7)));
}

/* Check candidate position i fully: the first rule whose anchor and
 * matcher agree, or -1. */
static long check_at(const uint8_t *p, size_t n, size_t i)
{
	if (pre.single_first[p[i]]) /* '=', '.': no multi-byte anchor starts so */
		for (unsigned s = 0; s < pre.nsingle; s++)
			if ((uint8_t)rules[pre.single[s]].anchor[0] == p[i] &&
			    rules[pre.single[s]].match(&rules[pre.single[s]], p, n, i))
				return pre.single[s];
	if (i + 2 >= n || !maybe_anchor(p, i))
		return -1;
	unsigned l = pre.bypair[(unsigned)p[i] << 8 | p[i + 1]] - 1u;
	for (unsigned j = 0; j < pre.nlist[l]; j++)
		if (try_rule(pre.list[l][j], p, n, i))
			return pre.list[l][j];
	return -1;
}

static size_t first_pair_hit_scalar(const uint8_t *p, size_t n, size_t from, size_t lim, size_t *rule)
{
	for (size_t i = from; i < lim; i++) {
		long r = check_at(p, n, i);
		if (r >= 0) {
			*rule = (size_t)r;
			return i;
		}
	}
	return lim;
}

#ifdef HAVE_SIMD
/* Teddy (Hyperscan's literal matcher, on a three-byte fingerprint): every
 * anchor's first three bytes go into one of 8 buckets (bucket 7: the
 * one-byte anchors, any bytes after them); six 16-entry nibble tables say
 * which buckets a byte's low and high nibble allow in the first, second
 * and third place. pshufb looks 16 positions up at once; only positions
 * whose three bytes allow a common bucket are checked (check_at). */
static struct {
	uint8_t lo[3][16], hi[3][16];
} teddy;
static bool have_ssse3;

/* Every case variant of each anchor's first three bytes, into the bucket
 * of its (lower-cased) first byte: anchors that share a start share a
 * bucket, which keeps the nibble sets of a bucket small. */
static void teddy_init(void)
{
	uint8_t firsts[N_RULES];
	unsigned nf = 0;

	for (size_t r = 0; r < N_RULES; r++) {
		const uint8_t *a = (const uint8_t *)rules[r].anchor;
		uint8_t f = is_up(a[0]) ? flip(a[0]) : a[0];
		unsigned b = 0;
		if (pre.alen[r] == 1) {
			/* bucket 7: the byte itself, anything after it */
			teddy.lo[0][a[0] & 15] |= 0x80;
			teddy.hi[0][a[0] >> 4] |= 0x80;
			for (unsigned k = 1; k < 3; k++)
				for (unsigned x = 0; x < 16; x++)
					teddy.lo[k][x] |= 0x80, teddy.hi[k][x] |= 0x80;
			continue;
		}
		while (b < nf && firsts[b] != f)
			b++;
		if (b == nf)
			firsts[nf++] = f;
		uint8_t m = (uint8_t)(1u << (b % 7));
		for (unsigned v = 0; v < 8; v++) {
			for (unsigned k = 0; k < 3; k++) {
				uint8_t c = a[k];
				if ((v >> k & 1) && rules[r].casefold)
					c = flip(c);
				teddy.lo[k][c & 15] |= m;
				teddy.hi[k][c >> 4] |= m;
			}
		}
	}
	have_ssse3 = __builtin_cpu_supports("ssse3");
}

__attribute__((target("ssse3"))) static inline __m128i teddy_pos(const uint8_t *q, unsigned k, __m128i nib)
{
	__m128i v = _mm_loadu_si128((const __m128i *)q);
	__m128i lo = _mm_loadu_si128((const __m128i *)teddy.lo[k]), hi = _mm_loadu_si128((const __m128i *)teddy.hi[k]);
	return _mm_and_si128(_mm_shuffle_epi8(lo, _mm_and_si128(v, nib)),
			     _mm_shuffle_epi8(hi, _mm_and_si128(_mm_srli_epi16(v, 4), nib)));
}

__attribute__((target("ssse3"))) static size_t first_pair_hit_simd(const uint8_t *p, size_t n, size_t lim, size_t *rule)
{
	const __m128i nib = _mm_set1_epi8(0x0f), zero = _mm_setzero_si128();
	size_t i = 0;

	/* the loads read p[i .. i + 17] */
	for (; i + 18 <= lim; i += 16) {
		__m128i m = _mm_and_si128(_mm_and_si128(teddy_pos(p + i, 0, nib), teddy_pos(p + i + 1, 1, nib)),
					  teddy_pos(p + i + 2, 2, nib));
		unsigned bits = (unsigned)_mm_movemask_epi8(_mm_cmpeq_epi8(m, zero)) ^ 0xffffu;
		while (bits) {
			size_t at = i + (size_t)__builtin_ctz(bits);
			long r = check_at(p, n, at);
			if (r >= 0) {
				*rule = (size_t)r;
				return at;
			}
			bits &= bits - 1;
		}
	}
	return first_pair_hit_scalar(p, n, i, lim, rule);
}
#endif

static bool simd_off; /* scan_set_portable */

/* The first hit of the multi-byte anchors at an offset below lim: its
 * offset (rule in *rule), or lim. */
static size_t first_pair_hit(const uint8_t *p, size_t n, size_t lim, size_t *rule)
{
#ifdef HAVE_SIMD
	if (have_ssse3 && !simd_off)
		return first_pair_hit_simd(p, n, lim, rule);
#endif
	return first_pair_hit_scalar(p, n, 0, lim, rule);
}

void scan_set_portable(int on)
{
	simd_off = on != 0;
}

int scan_bytes(const void *data, size_t n, struct scan_hit *hit)
{
	const uint8_t *p = data;
	size_t best = n, rule = 0, r;

	pthread_once(&pre_once, precompute);
	best = first_pair_hit(p, n, n, &rule);
	if (best >= n)
		return 0;
	r = rule;
	hit->rule = &rules[r];
	hit->off = best;
	hit->line = 1;
	for (const uint8_t *q = p; (q = memchr(q, '\n', (size_t)(p + best - q))); q++)
		hit->line++;
	return 1;
}

const struct scan_rule *scan_rules(size_t *n)
{
	*n = N_RULES;
	return rules;
}
