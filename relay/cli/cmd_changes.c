/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock changes | accept | reject: what commands changed in the guest,
 * and the user's word on it (doc/SYNC.md "Guest changes and write-back").
 * A relay client: one request (doc/RELAY.md "Changes"), one answer.
 */
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/server/relay.h"
#include "cmd_i.h"

#define ANSWER_MAX (256u << 20)

static const char *str_or(json_t *v, const char *dflt)
{
	return json_string_value(v) ? json_string_value(v) : dflt;
}

static void usage(const char *cmd)
{
	if (!strcmp(cmd, "changes"))
		fputs("usage: airlock changes [-C DIR] [--json] [--stat|--diff] [PATH...]\n", stderr);
	else
		fprintf(stderr, "usage: airlock %s [-C DIR] (PATH...|--all)\n", cmd);
}

/* PATH as the workspace sees it: relative to DIR's place in it. NULL for
 * a path that leaves the workspace. */
static char *ws_path(const char *rel, const char *p)
{
	char buf[PATH_MAX * 2];
	char *out, *seg, *save;
	size_t n = 0;

	if (p[0] == '/')
		return NULL;
	snprintf(buf, sizeof(buf), "%s%s%s", rel, rel[0] ? "/" : "", p);
	if (!(out = malloc(strlen(buf) + 1)))
		return NULL;
	out[0] = '\0';
	for (seg = strtok_r(buf, "/", &save); seg; seg = strtok_r(NULL, "/", &save)) {
		if (!strcmp(seg, "."))
			continue;
		if (!strcmp(seg, "..")) {
			char *s = strrchr(out, '/');
			if (!n) {
				free(out);
				return NULL;
			}
			n = s ? (size_t)(s - out) : 0;
			out[n] = '\0';
			continue;
		}
		n += (size_t)sprintf(out + n, "%s%s", n ? "/" : "", seg);
	}
	return out;
}

/* Send one request line, read lines until the answer with id 1. */
json_t *cmd_relay_ask(int fd, json_t *rq)
{
	char *line = json_dumps(rq, JSON_COMPACT);
	size_t cap = 1 << 16, len = 0;
	char *buf = malloc(cap);
	json_t *ans = NULL;

	if (!line || !buf || write(fd, line, strlen(line)) != (ssize_t)strlen(line) || write(fd, "\n", 1) != 1) {
		free(line);
		free(buf);
		return NULL;
	}
	free(line);
	for (;;) {
		char *nl;
		while (!(nl = memchr(buf, '\n', len))) {
			if (len == cap) {
				if (cap >= ANSWER_MAX)
					goto out;
				char *nb = realloc(buf, cap * 2);
				if (!nb)
					goto out;
				buf = nb;
				cap *= 2;
			}
			ssize_t k = read(fd, buf + len, cap - len);
			if (k <= 0)
				goto out;
			len += (size_t)k;
		}
		json_t *ev = json_loadb(buf, (size_t)(nl - buf), 0, NULL);
		memmove(buf, nl + 1, len - (size_t)(nl - buf) - 1);
		len -= (size_t)(nl - buf) + 1;
		if (ev && json_integer_value(json_object_get(ev, "id")) == 1) {
			ans = ev;
			break;
		}
		json_decref(ev);
	}
out:
	free(buf);
	return ans;
}

static const char *kind_letter(const char *k)
{
	static const struct {
		const char *k, *l;
	} t[] = {{"create", "A"}, {"modify", "M"}, {"delete", "D"}, {"rename", "R"}, {"mode", "m"}, {"symlink", "L"}};
	for (size_t i = 0; i < sizeof(t) / sizeof(t[0]); i++)
		if (!strcmp(t[i].k, k))
			return t[i].l;
	return "?";
}

static void print_by(json_t *by)
{
	json_t *argv = json_object_get(by, "argv");
	size_t i;
	json_t *a;

	if (!json_is_array(argv)) {
		fputs("  (by: unknown)", stdout);
		return;
	}
	fputs("  (by:", stdout);
	json_array_foreach(argv, i, a)
	{
		if (i >= 6) {
			fputs(" ...", stdout);
			break;
		}
		printf(" %.60s", json_string_value(a) ? json_string_value(a) : "?");
	}
	fputs(")", stdout);
}

static void print_list(json_t *changes, bool stat)
{
	size_t i;
	json_t *c;
	json_int_t added = 0;

	json_array_foreach(changes, i, c)
	{
		const char *kind = json_string_value(json_object_get(c, "kind"));
		const char *path = json_string_value(json_object_get(c, "path"));
		const char *prot = json_string_value(json_object_get(c, "protected"));
		json_int_t size = json_integer_value(json_object_get(c, "size"));
		if (!kind || !path)
			continue;
		if (stat) {
			json_int_t hs = json_integer_value(json_object_get(c, "host_size"));
			printf(" %s %-50s | %+" JSON_INTEGER_FORMAT " bytes%s\n", kind_letter(kind), path,
			       !strcmp(kind, "delete") ? -size : size - hs, prot ? " (protected)" : "");
			added++;
			continue;
		}
		printf("%s %s", kind_letter(kind), path);
		if (json_string_value(json_object_get(c, "from")))
			printf(" <- %s", json_string_value(json_object_get(c, "from")));
		if (prot)
			printf("  [protected: %s]", prot);
		if (json_is_true(json_object_get(c, "conflict")))
			fputs("  [conflict: changed on the host too]", stdout);
		print_by(json_object_get(c, "by"));
		fputc('\n', stdout);
	}
	if (stat)
		printf(" %" JSON_INTEGER_FORMAT " change%s\n", added, added == 1 ? "" : "s");
}

/* diff -u between the host's file and the guest's text. */
static void print_diff(const char *root, json_t *c, json_t *guest)
{
	const char *path = json_string_value(json_object_get(c, "path"));
	const char *kind = json_string_value(json_object_get(c, "kind"));
	json_t *g = json_object_get(guest, path);
	char host[PATH_MAX * 2], tmp[] = "/tmp/airlock-diff-XXXXXX", la[PATH_MAX + 4], lb[PATH_MAX + 4];

	fflush(stdout);
	if (!strcmp(kind, "delete")) {
		snprintf(host, sizeof(host), "%s/%s", root, path);
		snprintf(tmp, sizeof(tmp), "/dev/null");
	} else if (json_is_true(json_object_get(g, "binary")) || !json_is_object(g)) {
		printf("Binary or special change %s: host %" JSON_INTEGER_FORMAT " bytes, guest %" JSON_INTEGER_FORMAT
		       " bytes\n",
		       path, json_integer_value(json_object_get(c, "host_size")),
		       json_integer_value(json_object_get(c, "size")));
		return;
	} else {
		const char *text = json_string_value(json_object_get(g, "text"));
		int fd = mkstemp(tmp);
		if (fd < 0)
			return;
		size_t n = json_string_length(json_object_get(g, "text"));
		if (write(fd, text ? text : "", n) != (ssize_t)n) {
			close(fd);
			unlink(tmp);
			return;
		}
		close(fd);
		if (!strcmp(kind, "create") || !strcmp(kind, "rename"))
			snprintf(host, sizeof(host), "/dev/null");
		else
			snprintf(host, sizeof(host), "%s/%s", root, path);
	}
	snprintf(la, sizeof(la), "a/%s", path);
	snprintf(lb, sizeof(lb), "b/%s", path);
	pid_t pid = fork();
	if (pid == 0) {
		execlp("diff", "diff", "-u", "--label", la, "--label", lb, host, tmp, (char *)NULL);
		_exit(127);
	}
	if (pid > 0)
		waitpid(pid, NULL, 0);
	if (strcmp(tmp, "/dev/null"))
		unlink(tmp);
}

int cmd_changes(int argc, char **argv)
{
	const char *cmd = argv[0], *dir = ".", *rel;
	bool json = false, stat = false, diff = false, all = false;
	static const struct option opts[] = {{"json", no_argument, NULL, 'j'}, {"stat", no_argument, NULL, 's'},
					     {"diff", no_argument, NULL, 'd'}, {"all", no_argument, NULL, 'a'},
					     {"help", no_argument, NULL, 'h'}, {NULL, 0, NULL, 0}};
	bool list = !strcmp(cmd, "changes");
	char real[PATH_MAX], sock[PATH_MAX];
	int c, fd, r, status = 0;

	while ((c = getopt_long(argc, argv, "+C:h", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			dir = optarg;
			break;
		case 'j':
			json = true;
			break;
		case 's':
			stat = true;
			break;
		case 'd':
			diff = true;
			break;
		case 'a':
			all = true;
			break;
		case 'h':
			usage(cmd);
			return 0;
		default:
			usage(cmd);
			return 2;
		}
	}
	if ((list && all) || (!list && (json || stat || diff)) || (stat && diff) || (!list && !all && optind >= argc) ||
	    (all && optind < argc)) {
		usage(cmd);
		return 2;
	}
	if (!realpath(dir, real)) {
		cmd_err("%s: %s: %s", cmd, dir, strerror(errno));
		return 2;
	}
	cmd_find_workspace(real, &rel);
	char relcopy[PATH_MAX];
	snprintf(relcopy, sizeof(relcopy), "%s", rel);
	if (rel[0])
		((char *)rel)[-1] = '\0'; /* real is the workspace root now */
	json_t *paths = json_array();
	for (int i = optind; i < argc; i++) {
		char *p = ws_path(relcopy, argv[i]);
		if (!p) {
			cmd_err("%s: %s: not a path inside the workspace %s", cmd, argv[i], real);
			json_decref(paths);
			return 2;
		}
		json_array_append_new(paths, json_string(p));
		free(p);
	}
	if ((r = relay_default_path(real, sock, sizeof(sock))) < 0 || (fd = cmd_connect_relay(sock)) < 0) {
		cmd_err("%s: cannot reach the relay for %s (is 'airlock up %s' running?)", cmd, real, real);
		json_decref(paths);
		return 1;
	}
	json_t *rq = json_pack("{s:i, s:s}", "id", 1, "op", cmd);
	if (json_array_size(paths))
		json_object_set(rq, "paths", paths);
	if (all)
		json_object_set_new(rq, "all", json_true());
	if (diff)
		json_object_set_new(rq, "diff", json_true());
	json_decref(paths);
	json_t *ans = cmd_relay_ask(fd, rq);
	json_decref(rq);
	close(fd);
	if (!ans) {
		cmd_err("%s: no answer from the relay", cmd);
		return 1;
	}
	const char *ev = json_string_value(json_object_get(ans, "event"));
	if (!ev || !strcmp(ev, "error")) {
		cmd_err("%s: %s (%s)", cmd, str_or(json_object_get(ans, "message"), "failed"),
			str_or(json_object_get(ans, "code"), "error"));
		json_decref(ans);
		return 1;
	}
	if (list) {
		json_t *ch = json_object_get(ans, "changes");
		if (json) {
			json_t *o = json_pack("{s:i, s:O}", "version", 1, "changes", ch);
			status = cmd_print_json(o) < 0;
		} else if (diff) {
			size_t i;
			json_t *e;
			json_array_foreach(ch, i, e)
			{
				json_t *one = json_pack("[O]", e);
				print_list(one, false);
				json_decref(one);
				print_diff(real, e, json_object_get(ans, "guest"));
			}
		} else {
			print_list(ch, stat);
		}
		json_decref(ans);
		return status;
	}
	size_t i;
	json_t *e;
	const char *verb = !strcmp(cmd, "accept") ? "accepted" : "rejected";
	json_array_foreach(json_object_get(ans, verb), i, e) printf("%s %s\n", verb, json_string_value(e));
	json_array_foreach(json_object_get(ans, "refused"), i, e)
	{
		printf("refused %s: %s\n", json_string_value(json_object_get(e, "path")),
		       str_or(json_object_get(e, "why"), "?"));
		status = 1;
	}
	if (json_string_value(json_object_get(ans, "error"))) {
		cmd_err("%s: %s", cmd, json_string_value(json_object_get(ans, "error")));
		status = 1;
	}
	json_decref(ans);
	return status;
}
