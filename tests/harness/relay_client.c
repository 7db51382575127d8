/* SPDX-License-Identifier: Apache-2.0 */
/*
 * relay_client: a tiny NDJSON client for the relay socket (doc/RELAY.md).
 *
 *   relay_client [-t SECONDS] [SOCKET]
 *
 * Connects to SOCKET (default $AIRLOCK_SOCKET), sends each line of stdin
 * as one request, and prints every event line it receives on stdout. After
 * stdin ends it keeps printing until every exec/attach/status/sync_wait it
 * sent has had its final event (exit, result, error, status, synced), the
 * relay closes the connection, or SECONDS pass (default 30). Exit status:
 * 0, 1 on a connection error, 2 on usage, 3 on the time limit.
 *
 *   echo '{"id":1,"op":"exec","argv":["ls","-l"]}' | relay_client
 */
#include <errno.h>
#include <jansson.h>
#include <poll.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "airlock/core/mem.h"

#define MAX_WAIT 4096

static char *waiting[MAX_WAIT]; /* compact JSON ids awaiting a final event */
static size_t nwaiting;

static char *id_key(json_t *id)
{
	return id ? json_dumps(id, JSON_ENCODE_ANY | JSON_COMPACT) : mem_strdup("null");
}

/* Note requests that will be answered by a final event. */
static void note_request(const char *line, size_t n)
{
	json_t *j = json_loadb(line, n, 0, NULL);
	const char *op = j ? json_string_value(json_object_get(j, "op")) : NULL;

	if (op && nwaiting < MAX_WAIT &&
	    (!strcmp(op, "exec") || !strcmp(op, "attach") || !strcmp(op, "status") || !strcmp(op, "sync_wait")))
		waiting[nwaiting++] = id_key(json_object_get(j, "id"));
	json_decref(j);
}

static void note_event(const char *line, size_t n)
{
	json_t *j = json_loadb(line, n, 0, NULL);
	const char *ev = j ? json_string_value(json_object_get(j, "event")) : NULL;

	if (ev && (!strcmp(ev, "exit") || !strcmp(ev, "result") || !strcmp(ev, "error") || !strcmp(ev, "status") ||
		   !strcmp(ev, "synced"))) {
		char *k = id_key(json_object_get(j, "id"));
		for (size_t i = 0; k && i < nwaiting; i++) {
			if (waiting[i] && !strcmp(waiting[i], k)) {
				mem_free(waiting[i]);
				waiting[i] = waiting[--nwaiting];
				break;
			}
		}
		/* an error without id answers the oldest request that has none */
		mem_free(k);
	}
	json_decref(j);
}

static int write_all(int fd, const char *p, size_t n)
{
	while (n) {
		ssize_t w = write(fd, p, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return -1;
		p += w;
		n -= (size_t)w;
	}
	return 0;
}

static uint64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000;
}

int main(int argc, char **argv)
{
	const char *path = getenv("AIRLOCK_SOCKET");
	double linger = 30;
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	static char inb[1 << 16], sockb[1 << 20];
	size_t inl = 0, sockl = 0;
	bool in_eof = false;
	uint64_t deadline = 0;
	int opt, fd;

	mem_init_json();
	while ((opt = getopt(argc, argv, "t:h")) != -1) {
		if (opt == 't') {
			linger = atof(optarg);
		} else {
			fprintf(stderr, "usage: relay_client [-t SECONDS] [SOCKET]\n");
			return 2;
		}
	}
	if (optind < argc)
		path = argv[optind];
	if (!path || !*path || strlen(path) >= sizeof(sa.sun_path)) {
		fprintf(stderr, "relay_client: give a socket path or set AIRLOCK_SOCKET\n");
		return 2;
	}
	strcpy(sa.sun_path, path);
	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0) {
		fprintf(stderr, "relay_client: cannot connect to %s: %s\n", path, strerror(errno));
		return 1;
	}
	for (;;) {
		struct pollfd pf[2] = {{.fd = fd, .events = POLLIN}, {.fd = 0, .events = POLLIN}};
		int timeout = -1;

		if (in_eof) {
			uint64_t now = now_ms();
			if (nwaiting == 0)
				return 0;
			if (now >= deadline) {
				fprintf(stderr, "relay_client: %zu request(s) still unanswered after %.0f s\n",
					nwaiting, linger);
				return 3;
			}
			timeout = (int)(deadline - now);
		}
		if (poll(pf, in_eof ? 1 : 2, timeout) < 0) {
			if (errno == EINTR)
				continue;
			return 1;
		}
		if (pf[0].revents) {
			ssize_t n = read(fd, sockb + sockl, sizeof(sockb) - sockl);
			if (n <= 0)
				return in_eof && nwaiting == 0 ? 0 : (n == 0 ? 0 : 1);
			sockl += (size_t)n;
			char *p = sockb, *nl;
			while ((nl = memchr(p, '\n', sockl - (size_t)(p - sockb)))) {
				size_t len = (size_t)(nl - p) + 1;
				note_event(p, len - 1);
				if (write_all(1, p, len) < 0)
					return 1;
				p = nl + 1;
			}
			sockl -= (size_t)(p - sockb);
			memmove(sockb, p, sockl);
			if (sockl == sizeof(sockb)) { /* longer than we print in one piece: pass it on */
				if (write_all(1, sockb, sockl) < 0)
					return 1;
				sockl = 0;
			}
		}
		if (!in_eof && pf[1].revents) {
			ssize_t n = read(0, inb + inl, sizeof(inb) - inl);
			if (n <= 0) {
				in_eof = true;
				deadline = now_ms() + (uint64_t)(linger * 1000);
				if (inl) { /* last line without newline */
					note_request(inb, inl);
					if (write_all(fd, inb, inl) < 0 || write_all(fd, "\n", 1) < 0)
						return 1;
				}
				continue;
			}
			inl += (size_t)n;
			size_t start = 0;
			char *nl;
			while ((nl = memchr(inb + start, '\n', inl - start))) {
				size_t len = (size_t)(nl - (inb + start)) + 1;
				note_request(inb + start, len - 1);
				start += len;
			}
			/* send complete lines; pass long lines through in pieces */
			size_t send_n = start ? start : (inl == sizeof(inb) ? inl : 0);
			if (send_n && write_all(fd, inb, send_n) < 0)
				return 1;
			memmove(inb, inb + send_n, inl - send_n);
			inl -= send_n;
		}
	}
}
