/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vmstart: the start line of the vm template (vmstart.h, doc/VM.md
 * "Snapshots"): the guest learns how it came to be (cold boot, restored
 * snapshot, fork), gets the host's time and fresh seed bytes, and reseeds
 * the kernel's generator before any agent runs; then sets up the sandbox's
 * config, disks and control reader without running a program, and hands
 * the agent its command line.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/fs.h>
#include <linux/random.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/guest/vmstart.h"

#define VMSTART_WAIT_MS	 120000
#define VMSTART_FILE	 "/run/airlock-start"
#define VMSTART_CONF_DIR "/run/airlock"
#define VMSTART_CFG_MAX	 65536 /* bytes of the config drive read (the host writes 10 KiB) */

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
		fprintf(stderr, "airlock-agent --vm-init: setting the clock: %s\n", strerror(errno));
		return r;
	}
	if ((r = reseed(s->seed)) < 0) {
		fprintf(stderr, "airlock-agent --vm-init: reseeding the kernel's generator: %s\n", strerror(-r));
		return r;
	}
	if ((f = fopen(VMSTART_FILE, "we"))) {
		fprintf(f, "%s %llu\n", s->kind, (unsigned long long)s->gen);
		fclose(f);
	}
	return 0;
}

/* ------------------------------------------------------------ the config drive */

/* An octal field of a tar header: digits, then NUL or space padding. */
static int tar_octal(const uint8_t *f, size_t n, uint64_t *out)
{
	uint64_t v = 0;
	size_t i = 0;

	while (i < n && f[i] == ' ')
		i++;
	if (i == n || f[i] < '0' || f[i] > '7')
		return -EINVAL;
	for (; i < n && f[i] >= '0' && f[i] <= '7'; i++) {
		if (v >> 60)
			return -EINVAL;
		v = v * 8 + (uint64_t)(f[i] - '0');
	}
	for (; i < n; i++)
		if (f[i] != 0 && f[i] != ' ')
			return -EINVAL;
	*out = v;
	return 0;
}

static bool tar_zero(const uint8_t *h)
{
	for (size_t i = 0; i < 512; i++)
		if (h[i])
			return false;
	return true;
}

/* One header at h (512 bytes): its checksum (the unsigned sum, the field
 * counted as spaces), name, size and type. */
static int tar_header(const uint8_t *h, struct vmstart_file *f, bool *regular)
{
	uint64_t sum = 0, want, size;

	for (size_t i = 0; i < 512; i++)
		sum += i >= 148 && i < 156 ? ' ' : h[i];
	if (tar_octal(h + 148, 8, &want) < 0 || want != sum || tar_octal(h + 124, 12, &size) < 0)
		return -EINVAL;
	if (!memchr(h, 0, 100) || !h[0])
		return -EINVAL;
	memcpy(f->name, h, 100);
	f->name[100] = 0;
	f->len = (size_t)size;
	*regular = h[156] == '0' || h[156] == 0;
	return 0;
}

int vmstart_tar_parse(const uint8_t *buf, size_t len, struct vmstart_file *out, size_t max, size_t *n)
{
	size_t off = 0;

	*n = 0;
	while (off + 512 <= len && !tar_zero(buf + off)) {
		struct vmstart_file f;
		bool regular;
		if (tar_header(buf + off, &f, &regular) < 0 || f.len > len - off - 512)
			return -EINVAL;
		f.data = buf + off + 512;
		off += 512 + (f.len + 511) / 512 * 512;
		if (off > len)
			return -EINVAL;
		if (!regular)
			continue;
		if (*n == max)
			return -EINVAL;
		out[(*n)++] = f;
	}
	return 0;
}

/* ------------------------------------------------------------ --vm-init */

static void say(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void say(const char *fmt, ...)
{
	char up[32] = "?";
	va_list ap;
	FILE *f = fopen("/proc/uptime", "re");

	if (f) {
		if (fscanf(f, "%31s", up) != 1)
			snprintf(up, sizeof(up), "?");
		fclose(f);
	}
	fputs("airlock-init: ", stdout);
	va_start(ap, fmt);
	vprintf(fmt, ap);
	va_end(ap);
	printf(" [%s]\n", up);
	fflush(stdout);
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

/* What the agent is started with, from agent.conf. */
struct vmstart_conf {
	bool verbose;
	char fsync[16];
	char run_as[32];
	uint32_t uid, gid;
};

/* agent.conf: verbose=0|1, fsync=WORD, run_as=UID:GID, one a line. */
static int conf_parse(const uint8_t *data, size_t len, struct vmstart_conf *c)
{
	const char *p = (const char *)data, *end = p + len;

	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p)), *eq;
		size_t l = (size_t)((nl ? nl : end) - p);
		char v[32];
		eq = memchr(p, '=', l);
		if (l && *p != '#' && (!eq || (size_t)(p + l - eq - 1) >= sizeof(v)))
			return -EINVAL;
		if (eq) {
			size_t k = (size_t)(eq - p), vl = (size_t)(p + l - eq - 1);
			memcpy(v, eq + 1, vl);
			v[vl] = 0;
			if (k == 7 && !memcmp(p, "verbose", 7))
				c->verbose = !strcmp(v, "1");
			else if (k == 5 && !memcmp(p, "fsync", 5) && vl < sizeof(c->fsync))
				memcpy(c->fsync, v, vl + 1);
			else if (k == 6 && !memcmp(p, "run_as", 6) &&
				 sscanf(v, "%" SCNu32 ":%" SCNu32, &c->uid, &c->gid) == 2)
				snprintf(c->run_as, sizeof(c->run_as), "%" PRIu32 ":%" PRIu32, c->uid, c->gid);
			else
				return -EINVAL;
		}
		p += l + 1;
	}
	return 0;
}

static int write_file(const char *name, const struct vmstart_file *f, mode_t mode)
{
	char path[128];
	int fd, r = 0;

	snprintf(path, sizeof(path), VMSTART_CONF_DIR "/%s", name);
	if ((fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, mode)) < 0)
		return -errno;
	if (write(fd, f->data, f->len) != (ssize_t)f->len)
		r = -EIO;
	close(fd);
	return r;
}

/* The config drive into VMSTART_CONF_DIR, agent.conf into *c. */
static int config_read(const char *cfg, struct vmstart_conf *c)
{
	static const struct {
		const char *name;
		mode_t mode;
	} want[] = {{"guest.key", 0600}, {"allow", 0644}, {"agent.conf", 0644}};
	static uint8_t buf[VMSTART_CFG_MAX];
	struct vmstart_file files[VMSTART_FILES_MAX];
	size_t n = 0, have = 0;
	ssize_t len;
	int fd, r = 0;

	if ((fd = open(cfg, O_RDONLY | O_CLOEXEC)) < 0)
		return -errno;
	len = read(fd, buf, sizeof(buf));
	close(fd);
	if (len < 0 || vmstart_tar_parse(buf, (size_t)len, files, VMSTART_FILES_MAX, &n) < 0)
		r = -EINVAL;
	if (r == 0 && mkdir(VMSTART_CONF_DIR, 0700) < 0 && errno != EEXIST)
		r = -errno;
	for (size_t i = 0; r == 0 && i < n; i++)
		for (size_t k = 0; r == 0 && k < sizeof(want) / sizeof(want[0]); k++)
			if (!strcmp(files[i].name, want[k].name)) {
				have |= 1u << k;
				r = write_file(want[k].name, &files[i], want[k].mode);
				if (r == 0 && k == 2 && conf_parse(files[i].data, files[i].len, c) < 0)
					r = -EINVAL;
			}
	sodium_memzero(buf, sizeof(buf));
	return r < 0 ? r : (have & 3) == 3 ? 0 : -ENOENT;
}

/* The workspace disk on /persist and its binds (the agent's root, the
 * command user's home). */
static int disk_mount(const char *ws, const struct vmstart_conf *c, const char **what)
{
	static const char *const dirs[] = {"/persist/workspace", "/persist/state", "/persist/home"};

	/* noinit_itable: the disk is made with lazy_itable_init (sparse); the
	 * kernel's thread that zeroes its inode tables after the mount would
	 * compete with the agent under emulation and fill the sparse image */
	*what = "mounting it (ext4) on /persist";
	if (mount(ws, "/persist", "ext4", MS_NOATIME, "noinit_itable") < 0)
		return -errno;
	*what = "making its directories";
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		if (mkdir(dirs[i], 0755) < 0 && errno != EEXIST)
			return -errno;
	if (chown(dirs[0], c->uid, c->gid) < 0 || chown(dirs[2], c->uid, c->gid) < 0)
		return -errno;
	*what = "bind-mounting /persist/workspace and /persist/home";
	if (mount(dirs[0], "/workspace", NULL, MS_BIND, NULL) < 0 ||
	    mount(dirs[2], "/home/airlock", NULL, MS_BIND, NULL) < 0)
		return -errno;
	return 0;
}

/* A fork of this VM starts (doc/VM.md, "Forks"): the host wrote a start
 * line of kind fork on the control port of the fork's qemu. This process
 * is the fork's copy of the reader; agent is the copy of the parent's
 * agent, with the parent's key and sessions. Set the clock, reseed, read
 * the fork's own config drive (its key) into /run/airlock, and kill that
 * agent: the init starts a fresh one at once with the fork's key. */
static void fork_take(const char *line, size_t len, const char *cfg, pid_t agent)
{
	struct vmstart_conf c = {.fsync = "batch", .run_as = "1000:1000", .uid = 1000, .gid = 1000};
	struct vmstart s;
	int r;

	if (vmstart_parse(line, len, &s) < 0 || strcmp(s.kind, "fork")) {
		say("control port: not a fork's start line: ignored");
		return;
	}
	r = apply(&s);
	sodium_memzero(&s, sizeof(s));
	if (r < 0 || (r = flush_disk(cfg)) < 0 || (r = config_read(cfg, &c)) < 0) {
		say("FATAL: the fork's start failed (%s): stopping its agent", strerror(-r));
		unlink(VMSTART_CONF_DIR "/guest.key");
		kill(agent, SIGKILL);
		kill(1, SIGUSR1);
		return;
	}
	kill(agent, SIGKILL);
	say("forked");
}

/* The control port's reader, for the VM's life: a line "poweroff" makes
 * the init shut down (SIGUSR1); a start line of kind fork re-keys a fork.
 * While no host is connected the port reads end-of-file at once: wait and
 * read again. */
static void ctl_reader(int fd, const char *cfg, pid_t agent)
{
	char line[VMSTART_LINE_MAX];
	size_t k = 0;

	setsid();
	for (;;) {
		char ch;
		ssize_t r = read(fd, &ch, 1);
		if (r <= 0) {
			if (r < 0 && errno != EAGAIN && errno != EINTR)
				_exit(1);
			usleep(r == 0 ? 300000 : 5000);
			continue;
		}
		if (ch != '\n') {
			if (k + 1 < sizeof(line))
				line[k++] = ch;
			continue;
		}
		line[k] = 0;
		if (!strcmp(line, "poweroff")) {
			kill(1, SIGUSR1);
			_exit(0);
		}
		if (k > 6 && !memcmp(line, "start ", 6))
			fork_take(line, k, cfg, agent);
		sodium_memzero(line, sizeof(line));
		k = 0;
	}
}

static char *agent_argv[24];
static char arg_listen[160], arg_fsync[16], arg_run_as[32];

/* The agent's own command line (the init's restarts use the same, from the
 * files in VMSTART_CONF_DIR). */
static int agent_args(const char *prog, const char *port, const struct vmstart_conf *c)
{
	int n = 0;

#define A(x) (agent_argv[n++] = (char *)(x))
	snprintf(arg_listen, sizeof(arg_listen), "serial:%s", port);
	snprintf(arg_fsync, sizeof(arg_fsync), "%s", c->fsync);
	snprintf(arg_run_as, sizeof(arg_run_as), "%s", c->run_as);
	A(prog), A("--listen"), A(arg_listen), A("--root"), A("/workspace"), A("--state"), A("/persist/state");
	A("--key"), A(VMSTART_CONF_DIR "/guest.key"), A("--allow-file"), A(VMSTART_CONF_DIR "/allow");
	A("--fsync"), A(arg_fsync), A("--run-as"), A(arg_run_as);
	if (c->verbose)
		A("-v");
	A(NULL);
#undef A
	return n - 1;
}

/* The start line from ctl (fd kept open in *fd for the reader), applied. */
static int start_take(const char *ctl, struct vmstart *s, int *fd)
{
	char line[VMSTART_LINE_MAX];
	size_t len = 0;
	int r;

	if ((*fd = open(ctl, O_RDONLY | O_CLOEXEC | O_NOCTTY)) < 0) {
		say("FATAL: %s: %s", ctl, strerror(errno));
		return -1;
	}
	say("snapshot point");
	if ((r = read_line(*fd, line, sizeof(line), &len)) < 0) {
		say("FATAL: %s: no start line from the host: %s", ctl, strerror(-r));
		return -1;
	}
	r = vmstart_parse(line, len, s);
	sodium_memzero(line, sizeof(line));
	if (r < 0) {
		say("FATAL: %s: not a start line (start KIND GEN UNIX_NS SEED)", ctl);
		return -1;
	}
	if (apply(s) < 0) {
		say("FATAL: the start line could not be applied (the line above says why)");
		return -1;
	}
	return 0;
}

int vmstart_init(int argc, char **argv, int *argc_out, char ***argv_out)
{
	struct vmstart_conf c = {.fsync = "batch", .run_as = "1000:1000", .uid = 1000, .gid = 1000};
	struct vmstart s;
	const char *what = "";
	pid_t pid;
	int fd = -1, r;

	if (argc != 6) {
		say("FATAL: usage: airlock-agent --vm-init CTL CFG WS PORT");
		return -1;
	}
	if (start_take(argv[2], &s, &fd) < 0) {
		sodium_memzero(&s, sizeof(s));
		return -1;
	}
	say("started: %s %llu", s.kind, (unsigned long long)s.gen);
	sodium_memzero(&s, sizeof(s));
	for (int i = 3; i <= 4; i++)
		if ((r = flush_disk(argv[i])) < 0) {
			say("FATAL: %s: dropping its cached blocks: %s", argv[i], strerror(-r));
			return -1;
		}
	if ((r = config_read(argv[3], &c)) < 0) {
		say("FATAL: config drive %s: %s", argv[3],
		    r == -ENOENT   ? "no guest.key or allow"
		    : r == -EINVAL ? "not the host's tar image"
				   : strerror(-r));
		return -1;
	}
	if ((r = disk_mount(argv[4], &c, &what)) < 0) {
		say("FATAL: workspace disk %s: %s: %s", argv[4], what, strerror(-r));
		return -1;
	}
	say("mounted");
	pid_t agent = getpid();
	if ((pid = fork()) == 0)
		ctl_reader(fd, argv[3], agent);
	close(fd);
	if (pid < 0) {
		say("FATAL: fork: %s", strerror(errno));
		return -1;
	}
	*argc_out = agent_args(argv[0], argv[5], &c);
	*argv_out = agent_argv;
	return 0;
}
