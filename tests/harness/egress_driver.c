/* SPDX-License-Identifier: Apache-2.0 */
/*
 * egress_driver: runs the egress proxy alone for tests/e2e/egress_e2e.sh.
 *
 *   egress_driver --policy FILE [--hosts FILE] [--allow-private CIDR]...
 *                 [--unix PATH] [--client ID] [--max-conns N] [--idle-ms N]
 *
 * Listens on 127.0.0.1 (an ephemeral port, printed as "port N" once ready)
 * and on --unix PATH when given. Prints every denial as one JSON line on
 * stdout. SIGTERM/SIGINT stop it cleanly (so leak checkers see the exit).
 */
#include <errno.h>
#include <jansson.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/egress/egress.h"
#include "airlock/policy/policy.h"

#define MAX_CIDRS 16

static void on_denial(void *ud, const struct egress_denial *d)
{
	json_t *o;
	char *s;

	(void)ud;
	o = json_pack("{s:I, s:s, s:s, s:s, s:i, s:s, s:s, s:s}", "time_ms", (json_int_t)d->time_ms, "client",
		      d->client, "method", d->method, "host", d->host, "port", (int)d->port, "reason",
		      egress_reason_name(d->reason), "detail", d->detail, "message", d->message);
	if (!o)
		return;
	s = json_dumps(o, JSON_COMPACT);
	if (s) {
		printf("%s\n", s);
		fflush(stdout);
		free(s);
	}
	json_decref(o);
}

static void on_signal(struct loop *l, int fd, uint32_t events, void *ud)
{
	struct signalfd_siginfo si;

	(void)events;
	(void)ud;
	if (read(fd, &si, sizeof(si)) > 0)
		loop_stop(l);
}

static void usage(void)
{
	fprintf(stderr, "usage: egress_driver --policy FILE [--hosts FILE] [--allow-private CIDR]... "
			"[--unix PATH] [--client ID] [--max-conns N] [--idle-ms N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	const char *policy_path = NULL, *unix_path = NULL, *client = "test";
	const char *cidrs[MAX_CIDRS];
	struct egress_cfg cfg = {0};
	struct egress_ops ops = {.on_denial = on_denial};
	struct policy *pol = NULL;
	struct egress *e = NULL;
	struct loop *l = NULL;
	const struct policy_egress *pe;
	char err[512];
	uint16_t port = 0;
	sigset_t set;
	int sfd = -1, r, rc = 1;

	mem_init_json();
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];

		if (i + 1 >= argc)
			usage();
		if (strcmp(a, "--policy") == 0)
			policy_path = argv[++i];
		else if (strcmp(a, "--hosts") == 0)
			cfg.hosts_file = argv[++i];
		else if (strcmp(a, "--allow-private") == 0 && cfg.n_allow_private_cidrs < MAX_CIDRS)
			cidrs[cfg.n_allow_private_cidrs++] = argv[++i];
		else if (strcmp(a, "--unix") == 0)
			unix_path = argv[++i];
		else if (strcmp(a, "--client") == 0)
			client = argv[++i];
		else if (strcmp(a, "--max-conns") == 0)
			cfg.max_conns = (unsigned)atoi(argv[++i]);
		else if (strcmp(a, "--idle-ms") == 0)
			cfg.idle_timeout_ms = (unsigned)atoi(argv[++i]);
		else
			usage();
	}
	if (!policy_path)
		usage();
	cfg.allow_private_cidrs = cidrs;
	if (policy_load(policy_path, &pol, err, sizeof(err)) < 0) {
		fprintf(stderr, "egress_driver: %s\n", err);
		return 2;
	}
	pe = policy_egress(pol);
	cfg.allow = pe->allow;
	cfg.n_allow = pe->n_allow;

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	sigprocmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);
	sfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	l = loop_new();
	if (sfd < 0 || !l || loop_add_fd(l, sfd, EPOLLIN, on_signal, NULL) < 0) {
		fprintf(stderr, "egress_driver: setup failed\n");
		goto out;
	}
	if ((r = egress_new(l, &cfg, &ops, NULL, &e, err, sizeof(err))) < 0) {
		fprintf(stderr, "egress_driver: %s\n", err);
		goto out;
	}
	if ((r = egress_listen_tcp(e, "127.0.0.1", 0, client, &port)) < 0 ||
	    (unix_path && (r = egress_listen_unix(e, unix_path, client)) < 0)) {
		fprintf(stderr, "egress_driver: listen: %s\n", strerror(-r));
		goto out;
	}
	printf("port %u\n", port);
	fflush(stdout);
	if (loop_run(l) < 0)
		goto out;
	rc = 0;
out:
	egress_free(e);
	if (sfd >= 0) {
		loop_del_fd(l, sfd);
		close(sfd);
	}
	loop_free(l);
	policy_free(pol);
	return rc;
}
