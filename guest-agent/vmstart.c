/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmstart: the start line of the vm template (vmstart.h, doc/VM.md
 * "Snapshots"): the guest learns how it came to be (cold boot, restored
 * snapshot, fork), gets the host's time and fresh seed bytes, and reseeds
 * the kernel's generator before any agent runs.
 */
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/guest/vmstart.h"

#define VMSTART_WAIT_MS 120000
#define VMSTART_FILE	"/run/airlock-start"

static const char *const kinds[] = {"cold", "restored", "fork"};

/* A decimal number of at most 19 digits at *p, up to the next space or the
 * end; advances *p past it. */
static int parse_u63(const char **p, const char *end, uint64_t *out)
{
	uint64_t v = 0;
	int digits = 0;

	while (*p < end && **p >= '0' && **p <= '9' && digits < 19) {
		v = v * 10 + (uint64_t)(**p - '0');
		(*p)++;
		digits++;
	}
	if (!digits || (*p < end && **p != ' '))
		return -EINVAL;
	*out = v;
	return 0;
}

/* One space, then the next field starts. */
static int parse_space(const char **p, const char *end)
{
	if (*p >= end || **p != ' ')
		return -EINVAL;
	(*p)++;
	return 0;
}

int vmstart_parse(const char *line, size_t len, struct vmstart *out)
{
	const char *p = line, *end = line + len;
	uint64_t ns;
	size_t klen, bin_len = 0;
	bool known = false;

	memset(out, 0, sizeof(*out));
	if (len < 6 || memcmp(p, "start ", 6))
		return -EINVAL;
	p += 6;
	for (klen = 0; p + klen < end && p[klen] != ' '; klen++) {
	}
	for (size_t i = 0; i < sizeof(kinds) / sizeof(kinds[0]); i++)
		if (klen == strlen(kinds[i]) && !memcmp(p, kinds[i], klen))
			known = true;
	if (!known)
		return -EINVAL;
	memcpy(out->kind, p, klen);
	p += klen;
	if (parse_space(&p, end) < 0 || parse_u63(&p, end, &out->gen) < 0 || parse_space(&p, end) < 0 ||
	    parse_u63(&p, end, &ns) < 0 || parse_space(&p, end) < 0)
		return -EINVAL;
	out->unix_ns = (int64_t)ns;
	if (end - p != VMSTART_SEED_LEN * 2 ||
	    sodium_hex2bin(out->seed, sizeof(out->seed), p, (size_t)(end - p), NULL, &bin_len, NULL) != 0 ||
	    bin_len != VMSTART_SEED_LEN) {
		sodium_memzero(out, sizeof(*out));
		return -EINVAL;
	}
	return 0;
}

static int64_t mono_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Read one line from the port, byte by byte (what follows it is the init's:
 * the control port carries "poweroff" later). While no host is connected
 * the port reads end-of-file at once: wait and read again. */
static int read_line(int fd, char *line, size_t n, size_t *len)
{
	int64_t deadline = mono_ms() + VMSTART_WAIT_MS;
	size_t k = 0;

	for (;;) {
		char c;
		ssize_t r = read(fd, &c, 1);
		if (r == 1) {
			if (c == '\n') {
				line[k] = 0;
				*len = k;
				return 0;
			}
			if (k + 1 >= n)
				return -E2BIG;
			line[k++] = c;
			continue;
		}
		if (r < 0 && errno != EAGAIN && errno != EINTR)
			return -errno;
		if (mono_ms() > deadline)
			return -ETIMEDOUT;
		usleep(5000);
	}
}

/* The host's seed into the kernel's pool, credited, then a reseed of the
 * generator so its next output depends on it (adding alone only feeds the
 * input pool, which the generator reads at its next periodic reseed). */
static int reseed(const uint8_t seed[VMSTART_SEED_LEN])
{
	/* struct rand_pool_info with its buffer: entropy_count, buf_size, buf[] */
	uint32_t raw[2 + VMSTART_SEED_LEN / 4];
	struct rand_pool_info *info = (struct rand_pool_info *)raw;
	int fd = open("/dev/urandom", O_WRONLY | O_CLOEXEC), r = 0;

	_Static_assert(sizeof(struct rand_pool_info) == 2 * sizeof(uint32_t), "rand_pool_info layout");
	if (fd < 0)
		return -errno;
	info->entropy_count = VMSTART_SEED_LEN * 8;
	info->buf_size = VMSTART_SEED_LEN;
	memcpy(info->buf, seed, VMSTART_SEED_LEN);
	if (ioctl(fd, RNDADDENTROPY, info) < 0 || ioctl(fd, RNDRESEEDCRNG) < 0)
		r = -errno;
	close(fd);
	sodium_memzero(raw, sizeof(raw));
	return r;
}

static int apply(const struct vmstart *s)
{
	struct timespec ts = {.tv_sec = s->unix_ns / 1000000000, .tv_nsec = s->unix_ns % 1000000000};
	FILE *f;
	int r;

	if (clock_settime(CLOCK_REALTIME, &ts) < 0) {
		r = -errno;
		fprintf(stderr, "airlock-agent --await-start: setting the clock: %s\n", strerror(errno));
		return r;
	}
	if ((r = reseed(s->seed)) < 0) {
		fprintf(stderr, "airlock-agent --await-start: reseeding the kernel's generator: %s\n", strerror(-r));
		return r;
	}
	if ((f = fopen(VMSTART_FILE, "we"))) {
		fprintf(f, "%s %llu\n", s->kind, (unsigned long long)s->gen);
		fclose(f);
	}
	return 0;
}

/* Drop the kernel's cached blocks of disk (BLKFLSBUF). */
static int flush_disk(const char *disk)
{
	int fd = open(disk, O_RDONLY | O_CLOEXEC), r = 0;

	if (fd < 0)
		return -errno;
	if (ioctl(fd, BLKFLSBUF, 0) < 0)
		r = -errno;
	close(fd);
	return r;
}

int vmstart_main(const char *port, const char *const *disks, int ndisks)
{
	char line[VMSTART_LINE_MAX];
	struct vmstart s;
	size_t len = 0;
	int fd, r;

	if ((fd = open(port, O_RDONLY | O_CLOEXEC | O_NOCTTY)) < 0) {
		fprintf(stderr, "airlock-agent --await-start: %s: %s\n", port, strerror(errno));
		return 1;
	}
	r = read_line(fd, line, sizeof(line), &len);
	close(fd);
	if (r < 0) {
		fprintf(stderr, "airlock-agent --await-start: %s: no start line from the host: %s\n", port,
			strerror(-r));
		return 1;
	}
	r = vmstart_parse(line, len, &s);
	sodium_memzero(line, sizeof(line));
	if (r < 0) {
		fprintf(stderr, "airlock-agent --await-start: %s: not a start line (start KIND GEN UNIX_NS SEED)\n",
			port);
		return 1;
	}
	r = apply(&s);
	for (int i = 0; r == 0 && i < ndisks; i++)
		if ((r = flush_disk(disks[i])) < 0)
			fprintf(stderr, "airlock-agent --await-start: %s: dropping its cached blocks: %s\n", disks[i],
				strerror(-r));
	if (r == 0) {
		printf("%s %llu\n", s.kind, (unsigned long long)s.gen);
		fflush(stdout);
	}
	sodium_memzero(&s, sizeof(s));
	return r < 0 ? 1 : 0;
}
