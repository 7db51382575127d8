/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock audit [-C DIR] [--json]: what the workspace's last sync withheld
 * (path and the policy rule that withheld it), what it skipped, and the
 * egress proxy's denials (audit.h AUDIT_EGRESS_FILE, written by
 * egress_link.h in the airlock up daemon), and the paths the guest could
 * not apply (AUDIT_FAILED_FILE, written by airlock up).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include <jansson.h>

#include "airlock/policy/policy.h"
#include "airlock/sync/audit.h"
#include "cmd_i.h"

/* The untrusted-policy note for the workspace as its policy file is now
 * (the one the last sync recorded, else the workspace's own): the keys an
 * unapproved airlock.json may not set (doc/UP.md "Trust"). Empty when
 * nothing is ignored or the policy does not load. */
static void ignored_note(const char *dir, json_t *w, char *note, size_t n)
{
	const char *src = w ? json_string_value(json_object_get(w, "policy")) : NULL;
	struct policy *p = NULL;
	char err[1024];

	note[0] = '\0';
	if (src && src[0] != '/')
		src = NULL; /* "(built-in default)" */
	if (policy_load_for_workspace(dir, src, &p, err, sizeof(err)) == 0)
		policy_ignored_note(p, note, n);
	policy_free(p);
}

static void print_list(json_t *doc, const char *key, const char *field, const char *label, const char *total_key,
		       const char *omitted_key)
{
	json_t *a = json_object_get(doc, key);
	size_t i;
	json_t *e;

	if (!json_is_array(a))
		return;
	json_array_foreach(a, i, e)
	{
		const char *p = json_string_value(json_object_get(e, "path"));
		const char *r = json_string_value(json_object_get(e, field));
		printf("%-9s %s  (%s)\n", label, p ? p : "?", r ? r : "?");
	}
	json_int_t omitted = json_integer_value(json_object_get(doc, omitted_key));
	if (omitted > 0)
		printf("... %lld more %s not listed (%lld in all)\n", (long long)omitted, label,
		       (long long)json_integer_value(json_object_get(doc, total_key)));
}

/* egress.json (egress_link.h): one line per denial, newest last. */
static void print_denials(json_t *doc)
{
	json_t *a = json_object_get(doc, "denials");
	size_t i;
	json_t *e;

	if (!json_is_array(a) || json_array_size(a) == 0) {
		printf("egress denials: none recorded\n");
		return;
	}
	json_array_foreach(a, i, e)
	{
		const char *when = json_string_value(json_object_get(e, "time"));
		const char *m = json_string_value(json_object_get(e, "method"));
		const char *h = json_string_value(json_object_get(e, "host"));
		const char *r = json_string_value(json_object_get(e, "reason"));
		const char *d = json_string_value(json_object_get(e, "detail"));
		const char *c = json_string_value(json_object_get(e, "command"));
		printf("egress    %s denied %s %s:%lld (%s%s%s) by %s\n", when ? when : "?", m && *m ? m : "?",
		       h && *h ? h : "?", (long long)json_integer_value(json_object_get(e, "port")), r ? r : "?",
		       d && *d ? ": " : "", d ? d : "", c && *c ? c : "?");
	}
	json_int_t omitted = json_integer_value(json_object_get(doc, "denials_omitted"));
	if (omitted > 0)
		printf("... %lld earlier egress denials not listed (%lld in all)\n", (long long)omitted,
		       (long long)json_integer_value(json_object_get(doc, "denials_total")));
}

int cmd_audit(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"json", no_argument, NULL, 'j'},
	    {NULL, 0, NULL, 0},
	};
	const char *dir = ".";
	bool json = false;
	char err[1024], real[PATH_MAX];
	void *w = NULL, *eg = NULL, *fl = NULL;
	int c, status = 1;

	optind = 1;
	while ((c = getopt_long(argc, argv, "C:", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			dir = optarg;
			break;
		case 'j':
			json = true;
			break;
		default:
			cmd_usage("audit");
			return 2;
		}
	}
	if (cmd_operands("audit", argc, argv, optind, 0, "") < 0)
		return 2;
	if ((c = ws_resolve(dir, real, true)) < 0) {
		cmd_err("audit: %s: %s", dir, strerror(-c));
		goto out;
	}
	dir = real;
	if (audit_read_json(dir, AUDIT_WITHHELD_FILE, &w, err, sizeof(err)) < 0 ||
	    audit_read_json(dir, AUDIT_EGRESS_FILE, &eg, err, sizeof(err)) < 0 ||
	    audit_read_json(dir, AUDIT_FAILED_FILE, &fl, err, sizeof(err)) < 0) {
		cmd_err("audit: %s", err);
		goto out;
	}
	char note[1024];
	ignored_note(dir, w, note, sizeof(note));
	if (json) {
		/* nothing recorded yet: the same shapes, empty (doc/JSON.md "audit") */
		if (!w)
			w = json_pack("{s:i, s:s, s:n, s:n, s:[], s:i, s:i, s:[], s:i, s:i}", "version", 1, "workspace",
				      dir, "policy", "time", "withheld", "withheld_total", 0, "withheld_omitted", 0,
				      "skipped", "skipped_total", 0, "skipped_omitted", 0);
		if (!eg)
			eg = json_pack("{s:i, s:[], s:i, s:i}", "version", 1, "denials", "denials_total", 0,
				       "denials_omitted", 0);
		if (!fl)
			fl = json_pack("{s:i, s:s, s:n, s:[], s:i, s:i}", "version", 1, "workspace", dir, "time",
				       "not_in_guest", "not_in_guest_total", 0, "not_in_guest_omitted", 0);
		if (!w || !eg || !fl ||
		    cmd_print_json(json_pack("{s:i, s:s, s:O, s:s, s:O, s:O}", "version", 1, "workspace", dir, "sync",
					     (json_t *)w, "policy_ignored", note, "egress", (json_t *)eg,
					     "not_in_guest", (json_t *)fl)) < 0) {
			cmd_err("out of memory");
			goto out;
		}
	} else {
		if (!w) {
			printf("no sync recorded for %s yet (run airlock sync)\n", dir);
			if (note[0])
				printf("untrusted %s\n", note);
		} else {
			const char *when = json_string_value(json_object_get(w, "time"));
			printf("last sync scan: %s (policy: %s)\n", when ? when : "?",
			       json_string_value(json_object_get(w, "policy"))
				   ? json_string_value(json_object_get(w, "policy"))
				   : "?");
			if (note[0])
				printf("untrusted %s\n", note);
			print_list(w, "withheld", "rule", "withheld", "withheld_total", "withheld_omitted");
			print_list(w, "skipped", "reason", "skipped", "skipped_total", "skipped_omitted");
		}
		if (fl)
			print_list(fl, "not_in_guest", "message", "not in guest", "not_in_guest_total",
				   "not_in_guest_omitted");
		if (eg)
			print_denials(eg);
		else
			printf("egress denials: none recorded\n");
	}
	status = 0;
out:
	json_decref(w);
	json_decref(eg);
	json_decref(fl);
	return status;
}
