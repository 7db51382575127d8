/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The built-in secret list: file and directory names that hold
 * credentials, in the spirit of the path rules of widely used secret
 * scanners (gitleaks, trufflehog, detect-secrets, GitHub secret scanning,
 * gitrob/shhgit signature lists). A policy cannot drop an entry; it can
 * only let one exact path through with workspace.sync.allow_secrets.
 *
 * Every pattern is a gitignore pattern matched case-insensitively against
 * the workspace-relative path, so a pattern without a "/" matches the
 * basename at any depth and "**\/x/y" matches x/y anywhere. File entries
 * apply to everything that is not a directory (symlinks included);
 * directory entries withhold the directory and its whole subtree.
 *
 * doc/SECRETS.md documents this table (and the test checks that every
 * pattern appears there): change both together.
 */
#include "airlock/policy/policy.h"

#include <pthread.h>
#include <string.h>
#include <strings.h>

#include "airlock/policy/ignore.h"

/* One entry per line reads best as a table. */
/* clang-format off */
#define F(pat, why)          { pat, NULL, why, false }
#define FU(pat, unless, why) { pat, unless, why, false }
#define D(pat, why)          { pat, NULL, why, true }

static const struct policy_secret table[] = {
	/* environment files */
	F(".env", "dotenv file"),
	F(".env.*", "dotenv file variant (templates such as .env.example too)"),
	F(".env_*", "dotenv file variant"),
	F(".env-*", "dotenv file variant"),
	D(".env.d", "dotenv directory"),
	D(".envs", "per-environment dotenv directory (cookiecutter-django)"),
	F(".flaskenv", "Flask dotenv file"),
	F("*.env", "environment file"),
	F(".envrc", "direnv environment file"),
	F(".dev.vars", "Cloudflare Wrangler local secrets"),
	F(".dev.vars.*", "Cloudflare Wrangler local secrets"),
	F(".*_history", "shell or REPL history (pasted secrets)"),
	F(".history", "shell history (pasted secrets)"),

	/* private keys, key stores, certificates */
	F("*.pem", "PEM key or certificate"),
	F("*.key", "private key"),
	F("*.p12", "PKCS#12 key store"),
	F("*.pfx", "PKCS#12 key store"),
	F("*.pkcs12", "PKCS#12 key store"),
	F("*.p8", "PKCS#8 private key"),
	F("*.pk8", "PKCS#8 private key"),
	F("*.jks", "Java key store"),
	F("*.keystore", "Java/Android key store"),
	F("*.bks", "BouncyCastle key store"),
	F("*.jceks", "Java key store"),
	F("*.ppk", "PuTTY private key"),
	F("*.ovpn", "OpenVPN profile (embeds keys)"),
	F("*.crt", "certificate (usually deployed with its key)"),
	F("*.cer", "certificate (usually deployed with its key)"),
	F("*.der", "DER key or certificate"),
	F("*.gpg", "OpenPGP keyring or encrypted file"),
	F("*.pgp", "OpenPGP key or encrypted file"),
	F("secring.*", "GnuPG secret keyring"),
	F("*private*.asc", "ASCII-armoured private key"),
	F("*secret*.asc", "ASCII-armoured secret key"),
	F("*.agekey", "age private key"),
	F("**/.config/sops/age/keys.txt", "SOPS age private keys"),
	F("deploy_key", "deploy private key"),
	F("private_key", "private key"),
	F("identity", "SSH identity (private key)"),
	F("wallet.dat", "cryptocurrency wallet"),
	F("keystore.json", "Ethereum key store"),
	F("*.kdbx", "KeePass database"),
	F("*.kdb", "KeePass database"),
	F("*.psafe3", "Password Safe database"),
	F("*.keychain", "macOS keychain"),
	F("*.keychain-db", "macOS keychain"),
	D("*.agilekeychain", "1Password keychain"),
	D(".gnupg", "GnuPG home directory"),
	D(".password-store", "pass password store"),

	/* SSH */
	D(".ssh", "SSH directory (keys, config, known hosts)"),
	FU("id_rsa*", "*.pub", "SSH private key"),
	FU("id_dsa*", "*.pub", "SSH private key"),
	FU("id_ecdsa*", "*.pub", "SSH private key"),
	FU("id_ed25519*", "*.pub", "SSH private key"),
	F("*_rsa", "SSH private key"),
	F("*_dsa", "SSH private key"),
	F("*_ecdsa", "SSH private key"),
	F("*_ed25519", "SSH private key"),
	F("ssh_host_*_key", "SSH host private key"),

	/* git and other version control */
	F("**/.git/config", "git config (remote URLs, credential settings)"),
	F("**/.git/config.worktree", "git worktree config"),
	F("**/.git/config.*", "git config lock or backup (remote URLs)"),
	F("**/.git/worktrees/*/config.worktree", "git worktree config"),
	F("**/.git/modules/**/config", "submodule git config"),
	F(".git-credentials", "git credential store"),
	F(".gitcookies", "git HTTP cookies (tokens)"),
	F("**/.config/git/credentials", "git credential store (XDG location)"),
	F("**/*.git/config", "bare git repository config (remote URLs)"),
	F("**/*.git/config.worktree", "bare git repository worktree config"),
	F(".netrc", "netrc login credentials"),
	F("_netrc", "netrc login credentials"),

	/* package managers and build tools */
	F(".npmrc", "npm config (registry tokens)"),
	F(".pypirc", "PyPI upload credentials"),
	F("pip.conf", "pip config (index URLs with credentials)"),
	F("**/.gem/credentials", "RubyGems API key"),
	F("**/.cargo/credentials", "Cargo registry token"),
	F("**/.cargo/credentials.toml", "Cargo registry token"),
	F("auth.json", "Composer/container registry auth (tokens)"),
	F("settings-security.xml", "Maven master password"),
	F("**/.m2/settings.xml", "Maven user settings (server passwords)"),
	F("**/.gradle/gradle.properties", "Gradle user properties (tokens)"),
	F("credentials.xml", "Jenkins credentials"),

	/* cloud, container and cluster credentials */
	D(".aws", "AWS CLI credentials and config"),
	D(".azure", "Azure CLI credentials"),
	D("**/.config/gcloud", "Google Cloud SDK credentials"),
	D(".oci", "Oracle Cloud CLI keys"),
	D(".kube", "Kubernetes credentials"),
	D(".terraform", "Terraform working directory (provider credentials, cached state)"),
	D("**/.terraform.d", "Terraform CLI credentials"),
	F("application_default_credentials.json", "Google application default credentials"),
	F("credentials.db", "Google Cloud SDK credential store"),
	F("access_tokens.db", "Google Cloud SDK token store"),
	F("credentials.json", "credentials file"),
	F("key.json", "cloud service-account key"),
	F("sa-key.json", "cloud service-account key"),
	F("client_secret*.json", "OAuth client secret"),
	F("*service-account*.json", "cloud service-account key"),
	F("*service_account*.json", "cloud service-account key"),
	F("*serviceaccount*.json", "cloud service-account key"),
	F("kubeconfig", "Kubernetes credentials"),
	F("*.kubeconfig", "Kubernetes credentials"),
	F("kubeconfig.yaml", "Kubernetes credentials"),
	F("kubeconfig.yml", "Kubernetes credentials"),
	F("kubeconfig.json", "Kubernetes credentials"),
	F("**/.docker/config.json", "Docker registry credentials"),
	F(".dockercfg", "Docker registry credentials"),
	F(".boto", "Boto/gsutil credentials"),
	F(".s3cfg", "s3cmd credentials"),
	F(".passwd-s3fs", "s3fs credentials"),
	F(".databrickscfg", "Databricks token"),
	F("rclone.conf", "rclone remotes (cloud storage credentials)"),
	F("**/.config/gh/hosts.yml", "GitHub CLI token"),
	F("**/.config/hub", "hub (GitHub) token"),
	F("**/.config/doctl/config.yaml", "DigitalOcean token"),
	F(".vault-token", "HashiCorp Vault token"),
	F(".vault_pass*", "Ansible Vault password"),
	F(".vault-pass*", "Ansible Vault password"),
	F("*.tfstate", "Terraform state (resource secrets in clear text)"),
	F("*.tfstate.*", "Terraform state backup"),
	F("*.tfvars", "Terraform variables"),
	F("*.tfvars.json", "Terraform variables"),
	F(".terraformrc", "Terraform CLI config (API tokens)"),
	F("terraform.rc", "Terraform CLI config (API tokens)"),
	F("credentials.tfrc.json", "Terraform Cloud token"),

	/* databases, servers, deployment */
	F(".pgpass", "PostgreSQL passwords"),
	F(".my.cnf", "MySQL client credentials"),
	F(".mylogin.cnf", "MySQL login path credentials"),
	F("htpasswd", "HTTP basic-auth passwords"),
	F(".htpasswd", "HTTP basic-auth passwords"),
	F("wp-config.php", "WordPress config (database password, auth keys)"),
	F("sftp-config.json", "SFTP deployment credentials"),
	F("**/.vscode/sftp.json", "SFTP deployment credentials"),
	F(".ftpconfig", "FTP deployment credentials"),
	F(".remote-sync.json", "remote-sync deployment credentials"),
	F(".msmtprc", "mail client password"),
	F(".fetchmailrc", "mail client password"),
	F(".Xauthority", "X11 authorization cookies"),

	/* generic secrets files */
	F("secrets.yml", "secrets file"),
	F("secrets.yaml", "secrets file"),
	F("secrets.json", "secrets file"),
	F("secrets.toml", "secrets file"),
	F("secrets.ini", "secrets file"),
	F("secrets.properties", "secrets file"),
	F("secret.yml", "secrets file"),
	F("secret.yaml", "secrets file"),
	F("secret.json", "secrets file"),
	F("secret.toml", "secrets file"),
	F(".secrets", "secrets file"),
	F("token.txt", "token file"),
};
/* clang-format on */

#define N_SECRETS (sizeof(table) / sizeof(table[0]))

/* Compiled once. Every path sync looks at goes through this table, so each
 * entry also keeps its literal head and tail: a match must start (for a
 * basename pattern: the basename must start) with the head and end with the
 * tail, which rules most entries out in a few byte compares. */
static struct compiled {
	struct ignore_pattern pat, unless;
	const char *head, *tail;
	size_t headlen, taillen;
} compiled[N_SECRETS];
static pthread_once_t compiled_once = PTHREAD_ONCE_INIT;

static bool is_special(char c)
{
	return c == '*' || c == '?' || c == '[' || c == '\\';
}

static void compile(void)
{
	for (size_t i = 0; i < N_SECRETS; i++) {
		struct compiled *c = &compiled[i];
		const char *s = table[i].pattern;
		size_t len = strlen(s), k;

		/* table patterns are static, non-empty and well formed (tested) */
		ignore_pattern_init(&c->pat, s, len, IGNORE_CASEFOLD, (unsigned)i);
		if (table[i].unless)
			ignore_pattern_init(&c->unless, table[i].unless, strlen(table[i].unless), IGNORE_CASEFOLD,
					    (unsigned)i);
		c->head = c->pat.text;
		c->headlen = c->pat.nowildcardlen;
		for (k = c->pat.len; k > 0 && !is_special(c->pat.text[k - 1]); k--)
			;
		/* the '/' of a "**\/" may match nothing ("**\/x" matches "x") */
		if (k >= 2 && k < c->pat.len && c->pat.text[k - 1] == '*' && c->pat.text[k - 2] == '*' &&
		    c->pat.text[k] == '/')
			k++;
		c->tail = c->pat.text + k;
		c->taillen = k == 0 ? 0 : c->pat.len - k; /* no wildcard: head covers it */
	}
}

static bool ieq(const char *a, const char *b, size_t n)
{
	return strncasecmp(a, b, n) == 0;
}

const struct policy_secret *policy_secret_match_name(const char *relpath, int is_dir)
{
	size_t len = strlen(relpath);
	const char *slash = strrchr(relpath, '/');
	const char *bn = slash ? slash + 1 : relpath;
	size_t bl = len - (size_t)(bn - relpath);

	pthread_once(&compiled_once, compile);
	for (size_t i = 0; i < N_SECRETS; i++) {
		const struct compiled *c = &compiled[i];
		const char *t = (c->pat.flags & IGNORE_NODIR) ? bn : relpath;
		size_t tl = (c->pat.flags & IGNORE_NODIR) ? bl : len;

		if (table[i].dir != !!is_dir)
			continue;
		if (c->headlen > tl || c->taillen > tl || !ieq(t, c->head, c->headlen) ||
		    !ieq(t + tl - c->taillen, c->tail, c->taillen))
			continue;
		if (!ignore_pattern_match(&c->pat, "", 0, relpath, len, is_dir))
			continue;
		if (table[i].unless && ignore_pattern_match(&c->unless, "", 0, relpath, len, is_dir))
			continue;
		return &table[i];
	}
	return NULL;
}

/* Backup and temporary names editors and tools derive from a file's name:
 * the bytes in them are the file's (an old copy, the next version, the
 * swap file). Suffixes are compared case-insensitively; "swap" ones also
 * drop the leading '.' vim adds (.env -> ..env.swp). */
static const struct {
	const char *suffix;
	bool swap;
} derived[] = {
    {"~", false},	{".bak", false},  {".orig", false},	   {".old", false},
    {".backup", false}, {".save", false}, {".tmp", false},	   {".swp", true},
    {".swo", true},	{".swx", true},	  {"___jb_tmp___", false}, {"___jb_old___", false},
};

/* The name bn[0..bl) is derived from: out gets it, returns its length, or
 * 0 when bn is not a derived name. */
static size_t underlying(const char *bn, size_t bl, char *out)
{
	if (bl > 2 && bn[0] == '#' && bn[bl - 1] == '#') { /* emacs auto-save */
		memcpy(out, bn + 1, bl - 2);
		return bl - 2;
	}
	if (bl > 2 && bn[0] == '.' && bn[1] == '#') { /* emacs lock */
		memcpy(out, bn + 2, bl - 2);
		return bl - 2;
	}
	/* numbered backups: name.~N~ (cp/mv --backup=numbered) */
	if (bl > 4 && bn[bl - 1] == '~') {
		size_t k = bl - 1;
		while (k > 0 && bn[k - 1] >= '0' && bn[k - 1] <= '9')
			k--;
		if (k < bl - 1 && k >= 3 && bn[k - 1] == '~' && bn[k - 2] == '.') {
			memcpy(out, bn, k - 2);
			return k - 2;
		}
	}
	for (size_t i = 0; i < sizeof(derived) / sizeof(derived[0]); i++) {
		size_t sl = strlen(derived[i].suffix);
		if (bl <= sl || strncasecmp(bn + bl - sl, derived[i].suffix, sl) != 0)
			continue;
		size_t from = derived[i].swap && bn[0] == '.' && bl - sl > 1 ? 1 : 0;
		memcpy(out, bn + from, bl - sl - from);
		return bl - sl - from;
	}
	return 0;
}

const struct policy_secret *policy_secret_match(const char *relpath, int is_dir)
{
	const struct policy_secret *e = policy_secret_match_name(relpath, is_dir);
	char path[POLICY_PATH_MAX + 1];
	size_t len = strlen(relpath);

	if (e || len > POLICY_PATH_MAX)
		return e;
	memcpy(path, relpath, len + 1);
	/* a backup of a backup (.env.bak~) is still the file's bytes */
	for (int depth = 0; depth < 4 && !e; depth++) {
		char *sl = strrchr(path, '/');
		size_t dl = sl ? (size_t)(sl + 1 - path) : 0, bl = strlen(path + dl), nl;
		char name[POLICY_PATH_MAX + 1];
		if (!(nl = underlying(path + dl, bl, name)))
			break;
		memcpy(path + dl, name, nl);
		path[dl + nl] = '\0';
		e = policy_secret_match_name(path, is_dir);
	}
	return e;
}

const struct policy_secret *policy_secret_table(size_t *n)
{
	*n = N_SECRETS;
	return table;
}
