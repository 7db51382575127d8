/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Paths the guest could not apply (doc/SYNC.md "Per-path failures"): the
 * engine keeps them (sync_failures) and the guest keeps its old side of
 * each; here the daemon retries them with a backoff, records them for
 * status and audit, and tells every command that runs while some are
 * missing (or refuses it: execution.barrier "fail"). A failure never
 * drops the connection, so nothing running is killed by one.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <jansson.h>
#include <sodium.h>

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/policy/policy.h"
#include "airlock/server/relay.h"
#include "airlock/sync/audit.h"
#include "airlock/sync/sync.h"
#include "cmd_i.h"
#include "up_i.h"

#define RETRY_MIN_MS	 1000u	/* the first retry, doubling per attempt */
#define RETRY_MAX_MS	 60000u /* up to this */
#define LINE_NAMES	 3u	/* paths a command's stderr line names */
#define STATUS_PATHS_MAX 100u	/* paths the status file lists */

static const struct sync_failure *failures(const struct up *u, size_t *n, uint64_t *total)
{
	*n = 0;
	*total = 0;
	return u->sync.engine ? sync_failures(u->sync.engine, n, total) : NULL;
}

/* 1 s, 2 s, 4 s ... 60 s after the attempt-th failure in a row. */
static uint64_t retry_delay_ms(uint32_t attempts)
{
	uint64_t d = RETRY_MIN_MS;
	for (uint32_t i = 1; i < attempts && d < RETRY_MAX_MS; i++)
		d *= 2;
	return d < RETRY_MAX_MS ? d : RETRY_MAX_MS;
}

static void on_retry(struct loop *l, void *ud)
{
	(void)l;
	struct up *u = ud;
	size_t n;
	uint64_t total;
	const struct sync_failure *f = failures(u, &n, &total);

	u->paths.timer = 0;
	if (!total || u->conn.state != UP_LIVE)
		return;
	/* a failure the engine could not list, or one where the guest's
	 * copy is not what the host thinks: only a reconcile finds out */
	bool full = total > n;
	for (size_t i = 0; i < n && !full; i++)
		full = f[i].reconcile;
	const char **paths = full ? NULL : mem_calloc(n, sizeof(*paths));
	for (size_t i = 0; paths && i < n; i++)
		paths[i] = f[i].path;
	u->paths.retries++;
	up_sync_retry(u, paths, paths ? n : 0, full || !paths);
	mem_free(paths);
}

static void arm(struct up *u, uint64_t ms)
{
	if (u->paths.timer)
		loop_del_timer(u->loop, u->paths.timer);
	u->paths.timer = loop_add_timer(u->loop, ms, on_retry, u);
	u->paths.retry_at_ms = loop_now_ms() + ms;
}

/* The set, as (path, errno) pairs and the total, hashed: has it changed? */
static uint64_t set_sig(const struct sync_failure *f, size_t n, uint64_t total)
{
	uint64_t h = 1469598103934665603ull ^ total;
	for (size_t i = 0; i < n; i++) {
		for (const char *c = f[i].path; *c; c++)
			h = (h ^ (uint8_t)*c) * 1099511628211ull;
		h = (h ^ (uint64_t)f[i].err) * 1099511628211ull;
	}
	return h;
}

/* The length of the UTF-8 character at s (shortest form, no surrogate, at
 * most U+10FFFF), 0 when s does not start one. */
static size_t utf8_char(const unsigned char *s)
{
	uint32_t cp, min;
	size_t n;

	if (*s < 0x80)
		return 1;
	if ((*s & 0xe0) == 0xc0)
		n = 2, cp = *s & 0x1fu, min = 0x80;
	else if ((*s & 0xf0) == 0xe0)
		n = 3, cp = *s & 0x0fu, min = 0x800;
	else if ((*s & 0xf8) == 0xf0)
		n = 4, cp = *s & 0x07u, min = 0x10000;
	else
		return 0;
	for (size_t i = 1; i < n; i++) { /* a NUL fails this test: never past the end */
		if ((s[i] & 0xc0) != 0x80)
			return 0;
		cp = cp << 6 | (s[i] & 0x3fu);
	}
	return cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff) ? 0 : n;
}

/* o's "path": JSON strings are UTF-8, and a name that is not is just what
 * a guest's filesystem may refuse (strict casefold ext4): then "path" has
 * each byte outside a character as \xNN, to read, and "path_b64" the
 * exact bytes. -ENOMEM or 0. */
static int put_path(json_t *o, const char *path)
{
	const unsigned char *p = (const unsigned char *)path;
	size_t len = strlen(path), k = 0, c;
	char *text, *b64;
	int r = -ENOMEM;

	if (!o)
		return -ENOMEM;
	json_t *s = json_string(path);
	if (s)
		return json_object_set_new(o, "path", s) < 0 ? -ENOMEM : 0;
	text = mem_alloc(4 * len + 1);
	b64 = mem_alloc(sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL));
	if (!text || !b64)
		goto out;
	for (size_t i = 0; i < len; i += c ? c : 1) {
		if ((c = utf8_char(p + i))) {
			memcpy(text + k, p + i, c);
			k += c;
		} else {
			k += (size_t)snprintf(text + k, 5, "\\x%02x", p[i]);
		}
	}
	text[k] = '\0';
	sodium_bin2base64(b64, sodium_base64_encoded_len(len, sodium_base64_VARIANT_ORIGINAL), p, len,
			  sodium_base64_VARIANT_ORIGINAL);
	if (json_object_set_new(o, "path", json_string(text)) == 0 &&
	    json_object_set_new(o, "path_b64", json_string(b64)) == 0)
		r = 0;
out:
	mem_free(text);
	mem_free(b64);
	return r;
}

/* AUDIT_FAILED_FILE: the set as it is now (empty once all applied). */
static void save_audit(struct up *u, const struct sync_failure *f, size_t n, uint64_t total)
{
	json_t *a = json_array(), *doc;
	char err[512], when[32];
	time_t now = time(NULL);
	struct tm tm;

	strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%SZ", gmtime_r(&now, &tm));
	for (size_t i = 0; a && i < n; i++) {
		json_t *o = json_object(); /* "path" first, as in the other records */
		if (put_path(o, f[i].path) == 0 &&
		    json_object_update_new(o, json_pack("{s:i, s:s, s:s, s:I, s:I}", "errno", f[i].err, "error",
							strerror(f[i].err), "message", f[i].msg, "attempts",
							(json_int_t)f[i].attempts, "since_ms",
							(json_int_t)f[i].since_ms)) == 0)
			json_array_append(a, o);
		json_decref(o);
	}
	doc = json_pack("{s:i, s:s, s:s, s:o?, s:I, s:I}", "version", 1, "workspace", u->dir, "time", when,
			"not_in_guest", a, "not_in_guest_total", (json_int_t)total, "not_in_guest_omitted",
			(json_int_t)(total - n));
	if (!doc || audit_write_json(u->dir, AUDIT_FAILED_FILE, doc, err, sizeof(err)) < 0)
		cmd_err("audit record: %s", doc ? err : "out of memory");
	json_decref(doc);
}

void up_paths_synced(struct up *u)
{
	size_t n;
	uint64_t total;
	const struct sync_failure *f = failures(u, &n, &total);
	uint64_t sig = set_sig(f, n, total);

	if (sig != u->paths.sig) {
		u->paths.sig = sig;
		save_audit(u, f, n, total);
		if (total)
			cmd_err("%s: %" PRIu64 " path%s not in the guest (retrying; airlock status): %s: %s%s", u->dir,
				total, total == 1 ? "" : "s", n ? f[0].path : "?", n ? f[0].msg : "?",
				total > 1 ? ", ..." : "");
		else
			cmd_err("%s: every path is in the guest again", u->dir);
		up_mark_dirty(u);
	}
	if (!total) {
		if (u->paths.timer)
			loop_del_timer(u->loop, u->paths.timer);
		u->paths.timer = 0;
		return;
	}
	/* the freshest failure sets the pace; older ones go along */
	uint32_t least = UINT32_MAX;
	for (size_t i = 0; i < n; i++)
		if (f[i].attempts < least)
			least = f[i].attempts;
	arm(u, retry_delay_ms(least == UINT32_MAX ? 1 : least));
}

void up_paths_kick(struct up *u)
{
	size_t n;
	uint64_t total;

	/* a command may have freed space or changed a mode in the guest */
	failures(u, &n, &total);
	if (total && u->conn.state == UP_LIVE)
		arm(u, 0);
}

void up_paths_clear(struct up *u)
{
	if (u->paths.timer)
		loop_del_timer(u->loop, u->paths.timer);
	u->paths.timer = 0; /* the set stays recorded: the next engine reports it again */
}

/* "airlock: N paths are not in the guest: a (why), b (why) and M more
 * (airlock status)"; 0 when every path is there. */
static size_t paths_line(const struct up *u, char *line, size_t len)
{
	size_t n, k = 0;
	uint64_t total;
	const struct sync_failure *f = failures(u, &n, &total);

	if (!total)
		return 0;
	int w =
	    snprintf(line, len, "airlock: %" PRIu64 " path%s edited before this command %s not in the guest: ", total,
		     total == 1 ? "" : "s", total == 1 ? "is" : "are");
	for (size_t i = 0; i < n && i < LINE_NAMES && w > 0 && (size_t)w < len; i++, k++)
		w += snprintf(line + w, len - (size_t)w, "%s%s (%s)", i ? ", " : "", f[i].path, strerror(f[i].err));
	if (w > 0 && (size_t)w < len)
		snprintf(line + w, len - (size_t)w, "%s (retrying; airlock status)", total > k ? " and more" : "");
	return strlen(line);
}

bool up_paths_gate(struct up *u, struct relay_cmd *cmd, char *refusal, size_t len)
{
	char line[1024];
	size_t n = paths_line(u, line, sizeof(line) - 1);

	if (!n)
		return true;
	if (policy_execution(u->pol.policy)->barrier == POLICY_BARRIER_FAIL) {
		snprintf(refusal, len, "%s; execution.barrier is \"fail\": nothing was run", line);
		return false;
	}
	line[n++] = '\n';
	relay_cmd_output(cmd, RELAY_STDERR, line, n);
	return true;
}

void *up_paths_json(struct up *u)
{
	size_t n;
	uint64_t total;
	const struct sync_failure *f = failures(u, &n, &total);
	json_t *a = json_array();
	uint64_t now = loop_now_ms();

	for (size_t i = 0; a && i < n && i < STATUS_PATHS_MAX; i++) {
		json_t *o = json_object();
		if (put_path(o, f[i].path) == 0 &&
		    json_object_update_new(o, json_pack("{s:i, s:s, s:s, s:I, s:I, s:b}", "errno", f[i].err, "error",
							strerror(f[i].err), "message", f[i].msg, "attempts",
							(json_int_t)f[i].attempts, "since_ms",
							(json_int_t)f[i].since_ms, "reconcile", f[i].reconcile)) == 0)
			json_array_append(a, o);
		json_decref(o);
	}
	return json_pack("{s:I, s:o?, s:I, s:I}", "total", (json_int_t)total, "paths", a, "retries",
			 (json_int_t)u->paths.retries, "next_retry_ms",
			 (json_int_t)(u->paths.timer && u->paths.retry_at_ms > now ? u->paths.retry_at_ms - now : 0));
}

void up_paths_print(void *status)
{
	json_t *o = json_object_get((json_t *)status, "not_in_guest");
	json_int_t total = json_integer_value(json_object_get(o, "total"));
	json_t *a = json_object_get(o, "paths"), *e;
	size_t i;

	if (total <= 0)
		return;
	printf("not applied %lld path%s the guest could not apply, retry in %.1f s (%lld retries so far):\n",
	       (long long)total, total == 1 ? "" : "s",
	       (double)json_integer_value(json_object_get(o, "next_retry_ms")) / 1000.0,
	       (long long)json_integer_value(json_object_get(o, "retries")));
	json_array_foreach(a, i, e)
	{
		if (i == 5) {
			printf("            ... %lld more (airlock status --json, airlock audit)\n",
			       (long long)total - 5);
			break;
		}
		printf("            %s: %s (%lld attempts)\n", json_string_value(json_object_get(e, "path")),
		       json_string_value(json_object_get(e, "message")),
		       (long long)json_integer_value(json_object_get(e, "attempts")));
	}
}
