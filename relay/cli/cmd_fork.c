/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock fork: copy-on-write forks of the workspace's warm sandbox (local or vm)
 * (doc/SANDBOX.md "Forks"), through the relay's fork ops (doc/RELAY.md
 * "Forks"):
 *
 *   airlock fork [-C DIR] [-n N] [--name NAME]... [--ttl S] [--json]
 *   airlock fork [-C DIR] --rm NAME... | --rm-all
 *   airlock fork [-C DIR] --list [--json]
 *
 * Commands run in a fork with airlock exec --fork NAME.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <jansson.h>

#include "airlock/server/relay.h"
#include "cmd_i.h"

#define FORK_BUSY_WAIT_MS 10000 /* a busy sandbox (a command ends, a sync settles) is waited for this long */

json_t *cmd_relay_ask_take(int fd, json_t *rq)
{
	json_t *ans = rq ? cmd_relay_ask(fd, rq) : NULL;

	json_decref(rq);
	return ans;
}

int cmd_relay_open(const char *who, const char *dir, char root[PATH_MAX])
{
	char sock[PATH_MAX];
	const char *rel;
	int fd;

	if (!realpath(dir, root)) {
		cmd_err("%s: %s: %s", who, dir, strerror(errno));
		return -1;
	}
	cmd_find_workspace(root, &rel);
	if (rel[0])
		((char *)rel)[-1] = '\0'; /* root is the workspace root now */
	if (relay_default_path(root, sock, sizeof(sock)) < 0 || (fd = cmd_connect_relay(sock)) < 0) {
		cmd_err("%s: cannot reach the relay for %s (is 'airlock up %s' running?)", who, root, root);
		return -1;
	}
	return fd;
}

static const char *ev_name(json_t *ev)
{
	const char *s = json_string_value(json_object_get(ev, "event"));
	return s ? s : "";
}

static const char *ev_message(json_t *ev)
{
	const char *s = json_string_value(json_object_get(ev, "message"));
	return s ? s : "no answer from the relay";
}

static void sleep_ms(long ms)
{
	struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
	nanosleep(&ts, NULL);
}

json_t *cmd_fork_make(const char *who, int fd, json_t *names, int count, long ttl_s)
{
	json_t *ans;

	/* the parent's copy holds every edit made so far */
	ans = cmd_relay_ask_take(fd, json_pack("{s:i, s:s}", "id", 1, "op", "sync_wait"));
	if (!ans || strcmp(ev_name(ans), "synced")) {
		cmd_err("%s: waiting for the sync: %s", who, ans ? ev_message(ans) : "the relay went away");
		json_decref(ans);
		return NULL;
	}
	json_decref(ans);
	for (long waited = 0;; waited += 50) {
		json_t *rq = json_pack("{s:i, s:s}", "id", 1, "op", "fork");
		if (names && json_array_size(names))
			json_object_set(rq, "names", names);
		else
			json_object_set_new(rq, "count", json_integer(count));
		if (ttl_s > 0)
			json_object_set_new(rq, "ttl_seconds", json_integer(ttl_s));
		ans = cmd_relay_ask(fd, rq);
		json_decref(rq);
		if (ans && !strcmp(ev_name(ans), "fork"))
			return ans;
		const char *code = json_string_value(json_object_get(ans, "code"));
		if (!ans || !code || strcmp(code, "busy") || waited >= FORK_BUSY_WAIT_MS) {
			cmd_err("%s: %s", who, ans ? ev_message(ans) : "the relay went away");
			json_decref(ans);
			return NULL;
		}
		json_decref(ans);
		sleep_ms(50);
	}
}

static void fork_usage(void)
{
	cmd_usage("fork");
}

static int print_forks(json_t *ans, bool json)
{
	json_t *forks = json_object_get(ans, "forks"), *f;
	size_t i;

	if (json)
		return cmd_print_json(json_pack("{s:i, s:O}", "version", 1, "forks", forks ? forks : json_array()));
	if (!json_array_size(forks))
		printf("no forks\n");
	json_array_foreach(forks, i, f)
	{
		const char *why = json_string_value(json_object_get(f, "why"));
		printf("%-16s %-8s %lld command(s), idle %lld s of %lld s%s%s\n",
		       json_string_value(json_object_get(f, "name")), json_string_value(json_object_get(f, "state")),
		       (long long)json_integer_value(json_object_get(f, "commands")),
		       (long long)json_integer_value(json_object_get(f, "idle_seconds")),
		       (long long)json_integer_value(json_object_get(f, "ttl_seconds")), why && *why ? ": " : "",
		       why ? why : "");
	}
	return 0;
}

struct fork_args {
	const char *dir;
	int count;
	long ttl;
	bool json, list, rm_all;
	json_t *names; /* --name, or --rm's */
	bool rm;
};

static int parse_fork_args(int argc, char **argv, struct fork_args *a)
{
	static const struct option opts[] = {
	    {"name", required_argument, NULL, 'N'}, {"ttl", required_argument, NULL, 't'},
	    {"json", no_argument, NULL, 'j'},	    {"list", no_argument, NULL, 'l'},
	    {"rm", no_argument, NULL, 'r'},	    {"rm-all", no_argument, NULL, 'R'},
	    {"help", no_argument, NULL, 'h'},	    {NULL, 0, NULL, 0},
	};
	char *end;
	int c;

	optind = 1;
	while ((c = getopt_long(argc, argv, "C:n:h", opts, NULL)) != -1) {
		switch (c) {
		case 'C':
			a->dir = optarg;
			break;
		case 'n':
			a->count = (int)strtol(optarg, &end, 10);
			if (*end || a->count < 1 || a->count > RELAY_FORKS_MAX) {
				cmd_err("fork: -n '%s': a number of forks from 1 to %d", optarg, RELAY_FORKS_MAX);
				return 2;
			}
			break;
		case 'N':
			if (!relay_fork_name_ok(optarg)) {
				cmd_err("fork: --name '%.40s': use 1 to %d of a-z, 0-9, '-' and '_', starting with a "
					"letter or digit",
					optarg, RELAY_FORK_NAME_MAX);
				return 2;
			}
			json_array_append_new(a->names, json_string(optarg));
			break;
		case 't':
			a->ttl = strtol(optarg, &end, 10);
			if (*end || a->ttl < 1 || a->ttl > 7 * 86400) {
				cmd_err("fork: --ttl '%s': seconds from 1 to 604800", optarg);
				return 2;
			}
			break;
		case 'j':
			a->json = true;
			break;
		case 'l':
			a->list = true;
			break;
		case 'r':
			a->rm = true;
			break;
		case 'R':
			a->rm_all = true;
			break;
		case 'h':
			fork_usage();
			return 1;
		default:
			fork_usage();
			return 2;
		}
	}
	for (int i = optind; a->rm && i < argc; i++) {
		if (!relay_fork_name_ok(argv[i])) {
			cmd_err("fork: --rm '%.40s': not a fork's name", argv[i]);
			return 2;
		}
		json_array_append_new(a->names, json_string(argv[i]));
	}
	if ((optind < argc && !a->rm) || (a->rm && !json_array_size(a->names)) || (a->rm + a->rm_all + a->list > 1) ||
	    ((a->rm || a->rm_all || a->list) && a->count) ||
	    (a->count && json_array_size(a->names) && (size_t)a->count != json_array_size(a->names))) {
		fork_usage();
		return 2;
	}
	if (json_array_size(a->names) > RELAY_FORKS_MAX) {
		cmd_err("fork: at most %d forks at a time", RELAY_FORKS_MAX);
		return 2;
	}
	return 0;
}

int cmd_fork(int argc, char **argv)
{
	struct fork_args a = {.dir = ".", .names = json_array()};
	char root[PATH_MAX];
	json_t *ans = NULL, *f;
	int fd, st;
	size_t i;

	if ((st = parse_fork_args(argc, argv, &a)) != 0) {
		json_decref(a.names);
		return st == 1 ? 0 : st;
	}
	if ((fd = cmd_relay_open("fork", a.dir, root)) < 0) {
		json_decref(a.names);
		return 1;
	}
	if (a.list) {
		ans = cmd_relay_ask_take(fd, json_pack("{s:i, s:s}", "id", 1, "op", "forks"));
		st = ans && !strcmp(ev_name(ans), "forks") ? print_forks(ans, a.json)
							   : (cmd_err("fork: %s", ev_message(ans)), 1);
	} else if (a.rm || a.rm_all) {
		json_t *rq = json_pack("{s:i, s:s}", "id", 1, "op", "fork_rm");
		json_object_set_new(rq, a.rm_all ? "all" : "names", a.rm_all ? json_true() : json_incref(a.names));
		ans = cmd_relay_ask(fd, rq);
		json_decref(rq);
		st = ans && !strcmp(ev_name(ans), "fork_rm") ? 0 : (cmd_err("fork: %s", ev_message(ans)), 1);
		json_array_foreach(st ? NULL : json_object_get(ans, "removed"), i, f)
		    printf("removed fork %s\n", json_string_value(f));
	} else if ((ans = cmd_fork_make("fork", fd, a.names, a.count ? a.count : 1, a.ttl))) {
		st = 0;
		if (a.json) {
			json_object_del(ans, "event");
			json_object_del(ans, "id");
			json_object_set_new(ans, "version", json_integer(1));
			st = cmd_print_json(json_incref(ans));
		} else {
			json_array_foreach(json_object_get(ans, "forks"), i, f)
			    printf("fork %s ready (sandbox started in %.1f ms); run in it: airlock exec -C %s --fork "
				   "%s -- CMD\n",
				   json_string_value(json_object_get(f, "name")),
				   json_real_value(json_object_get(f, "start_ms")), root,
				   json_string_value(json_object_get(f, "name")));
			printf("forked in %.1f ms over %lld layer(s); removed after %lld s idle\n",
			       json_real_value(json_object_get(ans, "ms")),
			       (long long)json_integer_value(json_object_get(ans, "layers")),
			       (long long)json_integer_value(json_object_get(ans, "ttl_seconds")));
		}
	} else {
		st = 1;
	}
	json_decref(ans);
	json_decref(a.names);
	close(fd);
	return st;
}
