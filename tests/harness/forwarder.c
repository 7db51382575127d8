/* SPDX-License-Identifier: Apache-2.0 */
/*
 * forwarder: a test-controlled man in the middle between airlock and
 * airlock-agent. It parses the record framing (4-byte header holding a
 * 24-bit length, then the bytes) in both directions and applies at most one fault:
 *
 *   none
 *   flip:DIR:REC:BIT     flip bit BIT of record REC (length prefix included)
 *   drop:DIR:REC         do not forward record REC
 *   dup:DIR:REC          forward record REC twice
 *   swap:DIR:REC         forward REC+1 before REC
 *   cut:DIR:REC          close both sides instead of forwarding record REC
 *   cutmid:DIR:REC:N     forward only the first N bytes of record REC, then close
 *   reflect:DIR:REC      send record REC back to the side that sent it
 *
 * DIR is c2s (airlock -> agent) or s2c; REC counts records in that
 * direction from 0 (handshake records included).
 *
 *   forwarder LISTEN_PATH TARGET_PATH FAULT [--save-msg1 FILE]
 *       serve one connection, then exit
 *   forwarder --replay FILE TARGET_PATH
 *       send the saved first record to the target and print what came back:
 *       "refused N" (WIRE_HS_REFUSE reason), "accepted", or "closed"
 */
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#define REC_MAX (1u << 20)

enum fault { F_NONE, F_FLIP, F_DROP, F_DUP, F_SWAP, F_CUT, F_CUTMID, F_REFLECT };

struct dir {
	int from, to;
	uint8_t *buf;
	size_t len;
	unsigned rec;  /* records seen */
	uint8_t *held; /* swap: held record */
	size_t held_len;
};

static enum fault fault;
static int fault_dir; /* 0 = c2s, 1 = s2c */
static unsigned fault_rec;
static unsigned long fault_arg;
static const char *save_msg1;

static void die(const char *what)
{
	fprintf(stderr, "forwarder: %s: %s\n", what, strerror(errno));
	exit(3);
}

static int unix_connect(const char *path)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		die("socket");
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die(path);
	return fd;
}

static void write_all(int fd, const void *p, size_t n)
{
	const uint8_t *b = p;
	while (n) {
		ssize_t w = write(fd, b, n);
		if (w < 0 && errno == EINTR)
			continue;
		if (w <= 0)
			return; /* peer gone: the read side will notice */
		b += w;
		n -= (size_t)w;
	}
}

static void parse_fault(const char *s)
{
	char kind[16], dir[8];
	unsigned rec = 0;
	unsigned long arg = 0;
	int n = sscanf(s, "%15[a-z]:%7[a-z0-9]:%u:%lu", kind, dir, &rec, &arg);

	if (!strcmp(s, "none")) {
		fault = F_NONE;
		return;
	}
	if (n < 3)
		goto bad;
	static const struct {
		const char *name;
		enum fault f;
		int args;
	} kinds[] = {{"flip", F_FLIP, 4}, {"drop", F_DROP, 3},	   {"dup", F_DUP, 3},	     {"swap", F_SWAP, 3},
		     {"cut", F_CUT, 3},	  {"cutmid", F_CUTMID, 4}, {"reflect", F_REFLECT, 3}};
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++) {
		if (strcmp(kind, kinds[i].name))
			continue;
		if (n != kinds[i].args)
			goto bad;
		fault = kinds[i].f;
		if (!strcmp(dir, "c2s"))
			fault_dir = 0;
		else if (!strcmp(dir, "s2c"))
			fault_dir = 1;
		else
			goto bad;
		fault_rec = rec;
		fault_arg = arg;
		return;
	}
bad:
	fprintf(stderr, "forwarder: bad fault '%s'\n", s);
	exit(2);
}

/* Returns 0 to go on, -2 to close everything at once. */
static int on_record(struct dir *d, int di, struct dir *other, uint8_t *rec, size_t n)
{
	unsigned idx = d->rec++;

	if (di == 0 && idx == 0 && save_msg1) {
		FILE *f = fopen(save_msg1, "wb");
		if (!f || fwrite(rec, 1, n, f) != n || fclose(f) != 0)
			die(save_msg1);
	}
	if (fault == F_NONE || di != fault_dir) {
		write_all(d->to, rec, n);
		return 0;
	}
	if (fault == F_SWAP && d->held) {
		write_all(d->to, rec, n);
		write_all(d->to, d->held, d->held_len);
		free(d->held);
		d->held = NULL;
		return 0;
	}
	if (idx != fault_rec) {
		write_all(d->to, rec, n);
		return 0;
	}
	switch (fault) {
	case F_FLIP:
		if (fault_arg / 8 < n)
			rec[fault_arg / 8] ^= (uint8_t)(1u << (fault_arg % 8));
		write_all(d->to, rec, n);
		return 0;
	case F_DROP:
		return 0;
	case F_DUP:
		write_all(d->to, rec, n);
		write_all(d->to, rec, n);
		return 0;
	case F_SWAP:
		if (!(d->held = malloc(n)))
			die("malloc");
		memcpy(d->held, rec, n);
		d->held_len = n;
		return 0;
	case F_CUT:
		return -2;
	case F_CUTMID:
		write_all(d->to, rec, fault_arg < n ? fault_arg : n);
		return -2;
	case F_REFLECT:
		write_all(other->to == d->from ? other->to : d->from, rec, n);
		return 0;
	case F_NONE:
		break;
	}
	return 0;
}

static int pump(struct dir *d, int di, struct dir *other)
{
	uint8_t tmp[65536];
	ssize_t r = read(d->from, tmp, sizeof(tmp));

	if (r < 0 && errno == EINTR)
		return 0;
	if (r <= 0)
		return -1; /* EOF: half-close towards the other side */
	if (d->len + (size_t)r > REC_MAX + 4) {
		fprintf(stderr, "forwarder: record too large\n");
		return -2;
	}
	memcpy(d->buf + d->len, tmp, (size_t)r);
	d->len += (size_t)r;
	for (;;) {
		if (d->len < 4)
			return 0;
		/* 24-bit length; byte 0 is the header's check byte (wire.h) */
		uint32_t n = ((uint32_t)d->buf[1] << 16) | ((uint32_t)d->buf[2] << 8) | d->buf[3];
		if (n > REC_MAX) {
			/* Not a record stream any more; pass bytes through. */
			write_all(d->to, d->buf, d->len);
			d->len = 0;
			return 0;
		}
		if (d->len < 4 + (size_t)n)
			return 0;
		int rr = on_record(d, di, other, d->buf, 4 + (size_t)n);
		if (rr < 0)
			return rr;
		memmove(d->buf, d->buf + 4 + n, d->len - 4 - n);
		d->len -= 4 + (size_t)n;
	}
}

static int replay(const char *file, const char *target)
{
	uint8_t rec[4096];
	FILE *f = fopen(file, "rb");
	size_t n;

	if (!f)
		die(file);
	n = fread(rec, 1, sizeof(rec), f);
	fclose(f);
	int fd = unix_connect(target);
	write_all(fd, rec, n);
	uint8_t in[4096];
	size_t got = 0;
	while (got < sizeof(in)) {
		ssize_t r = read(fd, in + got, sizeof(in) - got);
		if (r <= 0)
			break;
		got += (size_t)r;
		if (got >= 4 + 49 || (got >= 6 && in[4] == 0x7f))
			break; /* a whole msg2, or a whole refusal */
	}
	close(fd);
	if (got >= 6 && in[4] == 0x7f)
		printf("refused %u\n", in[5]);
	else if (got >= 5)
		printf("accepted\n");
	else
		printf("closed\n");
	return 0;
}

int main(int argc, char **argv)
{
	if (argc == 4 && !strcmp(argv[1], "--replay"))
		return replay(argv[2], argv[3]);
	if (argc != 4 && !(argc == 6 && !strcmp(argv[4], "--save-msg1"))) {
		fprintf(stderr, "usage: forwarder LISTEN_PATH TARGET_PATH FAULT [--save-msg1 FILE]\n"
				"       forwarder --replay FILE TARGET_PATH\n");
		return 2;
	}
	if (argc == 6)
		save_msg1 = argv[5];
	parse_fault(argv[3]);

	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (lfd < 0)
		die("socket");
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", argv[1]);
	unlink(argv[1]);
	if (bind(lfd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || listen(lfd, 4) < 0)
		die(argv[1]);
	printf("ready\n");
	fflush(stdout);
	int cfd = accept4(lfd, NULL, NULL, SOCK_CLOEXEC);
	if (cfd < 0)
		die("accept");
	int sfd = unix_connect(argv[2]);

	struct dir d[2] = {
	    {.from = cfd, .to = sfd, .buf = malloc(REC_MAX + 4 + 65536)},
	    {.from = sfd, .to = cfd, .buf = malloc(REC_MAX + 4 + 65536)},
	};
	if (!d[0].buf || !d[1].buf)
		die("malloc");
	int open_dirs[2] = {1, 1};
	while (open_dirs[0] || open_dirs[1]) {
		struct pollfd p[2] = {{.fd = open_dirs[0] ? cfd : -1, .events = POLLIN},
				      {.fd = open_dirs[1] ? sfd : -1, .events = POLLIN}};
		if (poll(p, 2, -1) < 0) {
			if (errno == EINTR)
				continue;
			die("poll");
		}
		int stop = 0;
		for (int i = 0; i < 2 && !stop; i++) {
			if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			int r = pump(&d[i], i, &d[1 - i]);
			if (r == -2)
				stop = 1;
			else if (r == -1) {
				open_dirs[i] = 0;
				shutdown(d[i].to, SHUT_WR);
			}
		}
		if (stop)
			break;
	}
	/* After a cut, both ends close abruptly: no FINAL passes a fault. */
	close(cfd);
	close(sfd);
	close(lfd);
	unlink(argv[1]);
	free(d[0].buf);
	free(d[1].buf);
	free(d[0].held);
	free(d[1].held);
	return 0;
}
