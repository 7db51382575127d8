/* SPDX-License-Identifier: Apache-2.0 */
/*
 * plain_peer: the baseline for bench/chan.sh. The same traffic as
 * `airlock ping` (length-prefixed request/echo round trips, then a bulk
 * transfer in 64 KiB records acknowledged at the end) over a plain socket
 * with no handshake, no encryption and no flow control.
 *
 *   plain_peer serve unix:PATH | tcp:HOST:PORT      (prints "ready ADDR")
 *   plain_peer ping ADDR -n N [--size S] [--bulk BYTES]
 */
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define REC 65536

static uint64_t now_ns(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *m)
{
	fprintf(stderr, "plain_peer: %s: %s\n", m, strerror(errno));
	exit(1);
}

static int full(int fd, void *p, size_t n, int wr)
{
	uint8_t *b = p;
	while (n) {
		ssize_t r = wr ? write(fd, b, n) : read(fd, b, n);
		if (r < 0 && errno == EINTR)
			continue;
		if (r <= 0)
			return -1;
		b += r;
		n -= (size_t)r;
	}
	return 0;
}

static int sock_for(const char *addr, int listening, int *port_out)
{
	int fd;
	if (!strncmp(addr, "unix:", 5)) {
		struct sockaddr_un sa = {.sun_family = AF_UNIX};
		snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", addr + 5);
		if ((fd = socket(AF_UNIX, SOCK_STREAM, 0)) < 0)
			die("socket");
		if (listening) {
			unlink(sa.sun_path);
			if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 8) < 0)
				die(addr);
		} else if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
			die(addr);
		return fd;
	}
	if (!strncmp(addr, "tcp:", 4)) {
		char host[64];
		const char *colon = strrchr(addr + 4, ':');
		if (!colon || (size_t)(colon - addr - 4) >= sizeof(host))
			die("address");
		memcpy(host, addr + 4, (size_t)(colon - addr - 4));
		host[colon - addr - 4] = 0;
		struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(colon + 1))};
		inet_pton(AF_INET, host, &sa.sin_addr);
		if ((fd = socket(AF_INET, SOCK_STREAM, 0)) < 0)
			die("socket");
		int one = 1;
		setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
		if (listening) {
			socklen_t sl = sizeof(sa);
			if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(fd, 8) < 0)
				die(addr);
			getsockname(fd, (struct sockaddr *)&sa, &sl);
			*port_out = ntohs(sa.sin_port);
		} else {
			if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
				die(addr);
			setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		}
		return fd;
	}
	fprintf(stderr, "plain_peer: address must be unix:PATH or tcp:IP:PORT\n");
	exit(2);
}

static _Noreturn void serve(const char *addr)
{
	int port = 0;
	int lfd = sock_for(addr, 1, &port);
	if (!strncmp(addr, "tcp:", 4)) {
		char host[64];
		const char *colon = strrchr(addr + 4, ':');
		memcpy(host, addr + 4, (size_t)(colon - addr - 4));
		host[colon - addr - 4] = 0;
		printf("ready tcp:%s:%d\n", host, port);
	} else
		printf("ready %s\n", addr);
	fflush(stdout);
	uint8_t *buf = malloc(REC + 8);
	if (!buf)
		die("malloc");
	for (;;) {
		int fd = accept(lfd, NULL, NULL);
		if (fd < 0)
			die("accept");
		int one = 1;
		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		uint64_t bulk = 0;
		for (;;) {
			uint8_t hdr[5];
			if (full(fd, hdr, 5, 0) < 0)
				break;
			uint32_t n =
			    ((uint32_t)hdr[0] << 24) | ((uint32_t)hdr[1] << 16) | ((uint32_t)hdr[2] << 8) | hdr[3];
			if (n > REC || full(fd, buf, n, 0) < 0)
				break;
			if (hdr[4] == 1) { /* echo */
				if (full(fd, hdr, 5, 1) < 0 || full(fd, buf, n, 1) < 0)
					break;
			} else if (hdr[4] == 2) {
				bulk += n;
			} else if (hdr[4] == 3) {
				if (full(fd, &bulk, 8, 1) < 0)
					break;
				bulk = 0;
			}
		}
		close(fd);
	}
}

static int cmp(const void *a, const void *b)
{
	uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
	return x < y ? -1 : x > y;
}

static int ping(int argc, char **argv)
{
	const char *addr = argv[2];
	unsigned n = 1000, size = 0;
	unsigned long long bulk = 0;
	for (int i = 3; i + 1 < argc; i += 2) {
		if (!strcmp(argv[i], "-n"))
			n = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--size"))
			size = (unsigned)atoi(argv[i + 1]);
		else if (!strcmp(argv[i], "--bulk"))
			bulk = strtoull(argv[i + 1], NULL, 10);
	}
	int fd = sock_for(addr, 0, NULL);
	uint8_t *buf = calloc(1, REC + 8);
	uint64_t *rtt = calloc(n ? n : 1, sizeof(uint64_t));
	if (!buf || !rtt)
		die("calloc");
	uint32_t len = 8 + 4 + size; /* same payload as airlock ping: nonce + bytes */
	uint8_t hdr[5] = {(uint8_t)(len >> 24), (uint8_t)(len >> 16), (uint8_t)(len >> 8), (uint8_t)len, 1};
	for (unsigned i = 0; i < n; i++) {
		uint64_t t0 = now_ns();
		if (full(fd, hdr, 5, 1) < 0 || full(fd, buf, len, 1) < 0 || full(fd, hdr, 5, 0) < 0 ||
		    full(fd, buf, len, 0) < 0)
			die("echo");
		rtt[i] = now_ns() - t0;
	}
	qsort(rtt, n, sizeof(uint64_t), cmp);
	if (n)
		printf("rtt over %u round trips: p50 %.1f us, p99 %.1f us\n", n, rtt[(n - 1) / 2] / 1e3,
		       rtt[(size_t)(0.99 * n + 0.999999) - 1] / 1e3);
	if (bulk) {
		uint64_t t0 = now_ns(), sent = 0, got = 0;
		while (sent < bulk) {
			uint32_t k = bulk - sent < REC ? (uint32_t)(bulk - sent) : REC;
			uint8_t h[5] = {(uint8_t)(k >> 24), (uint8_t)(k >> 16), (uint8_t)(k >> 8), (uint8_t)k, 2};
			if (full(fd, h, 5, 1) < 0 || full(fd, buf, k, 1) < 0)
				die("bulk");
			sent += k;
		}
		uint8_t h[5] = {0, 0, 0, 0, 3};
		if (full(fd, h, 5, 1) < 0 || full(fd, &got, 8, 0) < 0)
			die("bulk end");
		double s = (now_ns() - t0) / 1e9;
		printf("bulk %llu bytes in %.3f s: %.1f MiB/s\n", bulk, s, bulk / 1048576.0 / s);
	}
	free(buf);
	free(rtt);
	close(fd);
	return 0;
}

int main(int argc, char **argv)
{
	if (argc >= 3 && !strcmp(argv[1], "serve"))
		serve(argv[2]);
	if (argc >= 3 && !strcmp(argv[1], "ping"))
		return ping(argc, argv);
	fprintf(stderr, "usage: plain_peer serve ADDR | plain_peer ping ADDR [-n N] [--size S] [--bulk BYTES]\n");
	return 2;
}
