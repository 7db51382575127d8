/* SPDX-License-Identifier: Apache-2.0 */
/*
 * The vm sandbox (doc/VM.md): the base template (guest-agent/template/)
 * booted with qemu, the agent as a child of the template's init.
 *
 *   qemu -M microvm (q35 when this qemu has no microvm), KVM when /dev/kvm
 *   runs a real guest here, software emulation (TCG) otherwise;
 *   -nic none: no network device at all, the channel is the only way out;
 *   disks (virtio-blk, found by serial number in the guest):
 *     airlock-ws      <dir>/workspace.img, ext4, made on first start, kept
 *     airlock-config  <dir>/config.tar, rebuilt each start: the guest key,
 *                     the host's public key, agent settings (never the
 *                     kernel command line, which any guest process can read)
 *   virtio-serial ports (chardevs: unix sockets in <dir>/run/):
 *     airlock         the channel: <dir>/run/agent.sock becomes sb->addr
 *     airlock.ctl     "poweroff\n" shuts the guest down cleanly
 *   console: <dir>/console.log (kernel, init and agent log).
 *
 * Under TCG, -M microvm has no PIT/HPET to calibrate against, so the TSC
 * frequency (measured here) and loops-per-jiffy go on the kernel command
 * line: tsc_early_khz=, lpj=, tsc=reliable, no_timer_check.
 *
 * Ready: the console shows the agent's "ready serial:" line. Stop: poweroff
 * on the control port, TERM after SANDBOX_STOP_MS, KILL a second later.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <dirent.h>
#include <linux/kvm.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <linux/magic.h>
#include <jansson.h>
#include <sodium.h>
#include <xxhash.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/keys.h"
#include "airlock/core/mem.h"
#include "sandbox_i.h"

#define VM_DISK_SIZE_DEFAULT "8G"
#define VM_MEM_MB_DEFAULT    1024
#define VM_CONFIG_SIZE	     10240 /* bytes of config.tar: a whole tar record */
#define VM_READY_LINE	     "ready serial:"
#define VM_FATAL_LINE	     "airlock-init: FATAL"
#define VM_KVM_GRACE_MS	     20000 /* a KVM guest that shows no init line by then is not running */

struct vm {
	char console[PATH_MAX];
	char ctl[PATH_MAX];
	char pidfile[PATH_MAX];
	char qmp[PATH_MAX]; /* qemu's monitor, kept for forks (a restored VM); "" when none */
	int ctl_fd;	    /* the control port, connected since the start line; -1 */
	/* restored on shared memory: the snapshot's memory file and the
	 * spare copy of it that its stop makes for the next restore; "" */
	char spare_src[PATH_MAX], spare[PATH_MAX];
};

static int64_t now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* ------------------------------------------------------------ accelerator */

/* Run a one-instruction guest (out to port 0x10, then hlt) under KVM. Only
 * that proves /dev/kvm works for an ordinary guest: on some hosts (nested
 * virtualisation without the features a guest needs) the ioctls succeed and
 * the guest never runs. Runs in a child that is killed after 1 s. */
static int kvm_probe_child(void)
{
	static const uint8_t code[] = {0xb0, 0x2a, 0xe6, 0x10, 0xf4}; /* mov al,42; out 0x10,al; hlt */
	struct kvm_userspace_memory_region mr = {0};
	struct kvm_sregs sr;
	struct kvm_regs rg = {0};
	struct kvm_run *run;
	int kvm, vm, cpu, sz;
	uint8_t *mem;

	if ((kvm = open("/dev/kvm", O_RDWR | O_CLOEXEC)) < 0 || ioctl(kvm, KVM_GET_API_VERSION, 0) != 12 ||
	    (vm = ioctl(kvm, KVM_CREATE_VM, 0)) < 0)
		return 1;
	mem = mmap(NULL, 0x1000, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
	if (mem == MAP_FAILED)
		return 1;
	memcpy(mem, code, sizeof(code));
	mr.guest_phys_addr = 0x1000;
	mr.memory_size = 0x1000;
	mr.userspace_addr = (uint64_t)(uintptr_t)mem;
	if (ioctl(vm, KVM_SET_USER_MEMORY_REGION, &mr) < 0 || (cpu = ioctl(vm, KVM_CREATE_VCPU, 0)) < 0 ||
	    (sz = ioctl(kvm, KVM_GET_VCPU_MMAP_SIZE, 0)) <= 0)
		return 1;
	run = mmap(NULL, (size_t)sz, PROT_READ | PROT_WRITE, MAP_SHARED, cpu, 0);
	if (run == MAP_FAILED || ioctl(cpu, KVM_GET_SREGS, &sr) < 0)
		return 1;
	sr.cs.base = 0;
	sr.cs.selector = 0;
	rg.rip = 0x1000;
	rg.rflags = 2;
	if (ioctl(cpu, KVM_SET_SREGS, &sr) < 0 || ioctl(cpu, KVM_SET_REGS, &rg) < 0)
		return 1;
	for (int i = 0; i < 4; i++) {
		if (ioctl(cpu, KVM_RUN, 0) < 0)
			return 1;
		if (run->exit_reason == KVM_EXIT_IO && run->io.port == 0x10 &&
		    ((uint8_t *)run)[run->io.data_offset] == 42)
			return 0;
		if (run->exit_reason != KVM_EXIT_IO)
			return 1;
	}
	return 1;
}

/* The CPU advertises hardware virtualisation (vmx or svm in /proc/cpuinfo).
 * Without it /dev/kvm may still open and run the probe below (a nested
 * host emulating a subset), yet a real kernel hangs early. */
static bool cpu_has_virt(void)
{
	char line[4096];
	bool found = false;
	FILE *f = fopen("/proc/cpuinfo", "re");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f)) {
		if (strncmp(line, "flags", 5))
			continue;
		found = strstr(line, " vmx") || strstr(line, " svm");
		break;
	}
	fclose(f);
	return found;
}

/* true when KVM runs a real guest here (AIRLOCK_VM_ACCEL=tcg forces false). */
static bool kvm_works(void)
{
	const char *force = getenv("AIRLOCK_VM_ACCEL");
	int64_t deadline;
	pid_t pid;
	int st;

	if (force && !strcmp(force, "tcg"))
		return false;
	if (access("/dev/kvm", R_OK | W_OK) < 0 || !cpu_has_virt())
		return false;
	if ((pid = fork()) < 0)
		return false;
	if (pid == 0)
		_exit(kvm_probe_child());
	deadline = now_ms() + 1000;
	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid)
			return WIFEXITED(st) && WEXITSTATUS(st) == 0;
		if (r < 0 || now_ms() > deadline)
			break;
		usleep(5000);
	}
	kill(pid, SIGKILL);
	waitpid(pid, &st, 0);
	return false;
}

/* TSC frequency in kHz, measured against CLOCK_MONOTONIC over ~30 ms. Under
 * TCG the guest's TSC is the host's. 0 when it cannot be measured. */
static uint64_t tsc_khz(void)
{
#if defined(__x86_64__) || defined(__i386__)
	struct timespec a, b;
	uint64_t t0, t1, ns;

	clock_gettime(CLOCK_MONOTONIC_RAW, &a);
	t0 = __builtin_ia32_rdtsc();
	do {
		clock_gettime(CLOCK_MONOTONIC_RAW, &b);
		ns = (uint64_t)(b.tv_sec - a.tv_sec) * 1000000000u + (uint64_t)b.tv_nsec - (uint64_t)a.tv_nsec;
	} while (ns < 30000000u);
	t1 = __builtin_ia32_rdtsc();
	if (t1 <= t0)
		return 0;
	return (t1 - t0) * 1000000u / ns;
#else
	return 0;
#endif
}

/* ----------------------------------------------------------------- helpers */

static int path_join(char *out, size_t n, const char *dir, const char *name)
{
	int w = snprintf(out, n, "%s/%s", dir, name);

	return w < 0 || (size_t)w >= n ? -ENAMETOOLONG : 0;
}

/* An executable named prog in $PATH (or prog itself when it has a '/'). */
static int find_prog(const char *prog, char *out, size_t n)
{
	const char *path = getenv("PATH");

	if (strchr(prog, '/')) {
		snprintf(out, n, "%s", prog);
		return access(out, X_OK) == 0 ? 0 : -ENOENT;
	}
	if (!path)
		path = "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin";
	while (*path) {
		size_t len = strcspn(path, ":");
		if (len > 0 && (size_t)snprintf(out, n, "%.*s/%s", (int)len, path, prog) < n && access(out, X_OK) == 0)
			return 0;
		path += len;
		if (*path == ':')
			path++;
	}
	return -ENOENT;
}

/* Run argv to completion, output to log_fd; 0 when it exited 0. */
static int run_wait(char *const argv[], int log_fd)
{
	pid_t pid = fork();
	int st;

	if (pid < 0)
		return -errno;
	if (pid == 0) {
		int null = open("/dev/null", O_RDONLY);
		if (null >= 0)
			dup2(null, 0);
		if (log_fd >= 0) {
			dup2(log_fd, 1);
			dup2(log_fd, 2);
		}
		execvp(argv[0], argv);
		_exit(127);
	}
	while (waitpid(pid, &st, 0) < 0)
		if (errno != EINTR)
			return -errno;
	return WIFEXITED(st) && WEXITSTATUS(st) == 0 ? 0 : -EIO;
}

/* This qemu knows -M microvm (qemu >= 4.2 built with it); else q35. */
static bool qemu_has_microvm(const char *qemu)
{
	char *argv[] = {(char *)qemu, "-machine", "help", NULL};
	char path[] = "/tmp/airlock-qemu-machines.XXXXXX";
	char line[256];
	bool found = false;
	FILE *f;
	int fd = mkstemp(path);

	if (fd < 0)
		return true; /* try it; qemu's error will say */
	unlink(path);
	if (run_wait(argv, fd) == 0 && lseek(fd, 0, SEEK_SET) == 0 && (f = fdopen(fd, "r"))) {
		while (!found && fgets(line, sizeof(line), f))
			found = !strncmp(line, "microvm ", 8);
		fclose(f);
		return found;
	}
	close(fd);
	return false;
}

/* The template directory: cfg's, else $AIRLOCK_VM_TEMPLATE, else
 * $XDG_CACHE_HOME/airlock/template (default ~/.cache/airlock/template). */
static int template_dir(const struct sandbox_cfg *cfg, char *out, size_t n)
{
	const char *env = getenv("AIRLOCK_VM_TEMPLATE"), *xdg = getenv("XDG_CACHE_HOME"), *home = getenv("HOME");
	int w;

	if (cfg->template_dir && *cfg->template_dir)
		w = snprintf(out, n, "%s", cfg->template_dir);
	else if (env && *env)
		w = snprintf(out, n, "%s", env);
	else if (xdg && *xdg == '/')
		w = snprintf(out, n, "%s/airlock/template", xdg);
	else if (home && *home == '/')
		w = snprintf(out, n, "%s/.cache/airlock/template", home);
	else
		return -ENOENT;
	return w < 0 || (size_t)w >= n ? -ENAMETOOLONG : 0;
}

/* In a development build (the template builder and this build's static
 * agent exist where meson put them), (re)build the template: the builder
 * is cached and only says "up to date" when nothing changed, so the guest
 * always runs the agent this host was built with. Its output goes to
 * <dir>/template.log. 0 when built, up to date, or there is no builder. */
#if defined(AIRLOCK_TEMPLATE_BUILDER) && defined(AIRLOCK_AGENT_STATIC)
/* An installed airlock's copy of name: EXE_DIR/AIRLOCK_LIBEXEC_REL/name
 * (meson install puts both there), else the development build's (dev). */
static const char *vm_tool(const char *name, const char *dev, char *out, size_t n)
{
	char exe[PATH_MAX];
	ssize_t k = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
	char *slash;

	if (k > 0 && (exe[k] = '\0', slash = strrchr(exe, '/'))) {
		*slash = '\0';
		if (snprintf(out, n, "%s/%s/%s", exe, AIRLOCK_LIBEXEC_REL, name) < (int)n && access(out, R_OK) == 0)
			return out;
	}
	return dev;
}
#endif

static int template_refresh(struct sandbox *sb, const char *tdir, char *err, size_t errlen)
{
#if defined(AIRLOCK_TEMPLATE_BUILDER) && defined(AIRLOCK_AGENT_STATIC)
	char logp[PATH_MAX], bp[PATH_MAX], ap[PATH_MAX];
	const char *builder = vm_tool("build.sh", AIRLOCK_TEMPLATE_BUILDER, bp, sizeof(bp));
	const char *agent = vm_tool("airlock-agent-static", AIRLOCK_AGENT_STATIC, ap, sizeof(ap));
	char *argv[] = {"sh", (char *)builder, (char *)tdir, (char *)agent, NULL};
	int fd, r;

	if (getenv("AIRLOCK_VM_NO_BUILD") || access(builder, R_OK) < 0 || access(agent, X_OK) < 0)
		return 0;
	if (path_join(logp, sizeof(logp), sb->dir, "template.log") < 0 ||
	    (fd = open(logp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0)
		return 0; /* no log, no build: use what is there */
	r = run_wait(argv, fd);
	close(fd);
	if (r < 0) {
		errmsg_set(err, errlen, "building the VM template in %s failed (see %s)", tdir, logp);
		return r;
	}
#else
	(void)sb;
	(void)tdir;
	(void)err;
	(void)errlen;
#endif
	return 0;
}

/* CONFIG_HZ of the template's kernel (kernel.hz, written by build.sh); 250
 * (Debian's) when absent. */
static unsigned template_hz(const char *tdir)
{
	char p[PATH_MAX];
	unsigned hz = 250;
	FILE *f;

	if (path_join(p, sizeof(p), tdir, "kernel.hz") == 0 && (f = fopen(p, "re"))) {
		if (fscanf(f, "%u", &hz) != 1 || hz < 24 || hz > 10000)
			hz = 250;
		fclose(f);
	}
	return hz;
}

/* ------------------------------------------------------------ config drive */

/* One ustar member: header + content padded to 512. */
static int tar_member(FILE *f, const char *name, unsigned mode, const void *data, size_t len)
{
	uint8_t h[512] = {0};
	unsigned sum = 0;
	static const uint8_t zero[512];

	snprintf((char *)h, 100, "%s", name);
	snprintf((char *)h + 100, 8, "%07o", mode);
	snprintf((char *)h + 108, 8, "%07o", 0);
	snprintf((char *)h + 116, 8, "%07o", 0);
	snprintf((char *)h + 124, 12, "%011zo", len);
	snprintf((char *)h + 136, 12, "%011o", 0);
	h[156] = '0';
	memcpy(h + 257, "ustar", 6);
	memcpy(h + 263, "00", 2);
	memset(h + 148, ' ', 8);
	for (size_t i = 0; i < sizeof(h); i++)
		sum += h[i];
	snprintf((char *)h + 148, 8, "%06o", sum);
	if (fwrite(h, 1, 512, f) != 512 || fwrite(data, 1, len, f) != len)
		return -EIO;
	if (len % 512 && fwrite(zero, 1, 512 - len % 512, f) != 512 - len % 512)
		return -EIO;
	return 0;
}

/* <dir>/config.tar: guest.key (0600), allow (the host's public key),
 * agent.conf. Padded to VM_CONFIG_SIZE, one 10 KiB tar record (a disk
 * image must be a multiple of 512 bytes; tar readers expect records). */
static int write_config(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	char path[PATH_MAX], tmp[PATH_MAX + 8], pub[KEYS_B64_LEN + 1], conf[128];
	uint8_t key[256];
	static const uint8_t zero[1024];
	ssize_t keylen;
	long pos;
	FILE *f = NULL;
	int fd, r = 0;

	if ((fd = open(sb->guest_key_file, O_RDONLY | O_CLOEXEC)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", sb->guest_key_file, strerror(errno));
		return r;
	}
	keylen = read(fd, key, sizeof(key));
	close(fd);
	if (keylen <= 0 || keylen >= (ssize_t)sizeof(key)) {
		errmsg_set(err, errlen, "%s: not a key file", sb->guest_key_file);
		return -EINVAL;
	}
	keys_pub_format(sb->host.pub, pub);
	strcat(pub, "\n");
	snprintf(conf, sizeof(conf), "verbose=%d\nfsync=batch\nrun_as=1000:1000\n", cfg->verbose ? 1 : 0);
	if (path_join(path, sizeof(path), sb->dir, "config.tar") < 0) {
		errmsg_set(err, errlen, "%s: path too long", sb->dir);
		return -ENAMETOOLONG;
	}
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0 || !(f = fdopen(fd, "w"))) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", tmp, strerror(errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	if ((r = tar_member(f, "guest.key", 0600, key, (size_t)keylen)) < 0 ||
	    (r = tar_member(f, "allow", 0644, pub, strlen(pub))) < 0 ||
	    (r = tar_member(f, "agent.conf", 0644, conf, strlen(conf))) < 0)
		goto werr;
	if (fwrite(zero, 1, sizeof(zero), f) != sizeof(zero)) /* end of archive */
		goto werr;
	/* always the same size: a snapshot's guest knows the drive's size
	 * from before the snapshot, when a blank one of that size was there */
	pos = ftell(f);
	if (pos < 0 || pos > VM_CONFIG_SIZE) {
		r = -EFBIG;
		goto werr;
	}
	while (pos < VM_CONFIG_SIZE) {
		size_t pad = (size_t)(VM_CONFIG_SIZE - pos);
		if (pad > sizeof(zero))
			pad = sizeof(zero);
		if (fwrite(zero, 1, pad, f) != pad)
			goto werr;
		pos += (long)pad;
	}
	if (fflush(f) != 0 || fsync(fileno(f)) < 0)
		goto werr;
	fclose(f);
	f = NULL;
	if (rename(tmp, path) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", path, strerror(errno));
		goto out;
	}
	goto out;
werr:
	r = r < 0 ? r : -EIO;
	errmsg_set(err, errlen, "%s: cannot write the config drive", tmp);
out:
	if (f)
		fclose(f);
	if (r < 0)
		unlink(tmp);
	sodium_memzero(key, sizeof(key));
	return r;
}

/* <dir>/workspace.img: created (sparse, ext4) on first start, kept after. */
static int ensure_disk(struct sandbox *sb, int log_fd, char *img, size_t n, char *err, size_t errlen)
{
	const char *size = getenv("AIRLOCK_VM_DISK_SIZE");
	char mkfs[PATH_MAX], tmp[PATH_MAX + 8];
	struct stat st;

	if (path_join(img, n, sb->dir, "workspace.img") < 0) {
		errmsg_set(err, errlen, "%s: path too long", sb->dir);
		return -ENAMETOOLONG;
	}
	if (stat(img, &st) == 0)
		return 0;
	if (find_prog("mkfs.ext4", mkfs, sizeof(mkfs)) < 0) {
		errmsg_set(err, errlen, "mkfs.ext4 not found (apt-get install e2fsprogs): needed once to create %s",
			   img);
		return -ENOENT;
	}
	snprintf(tmp, sizeof(tmp), "%s.new", img);
	unlink(tmp);
	{
		char *argv[] = {mkfs,
				"-q",
				"-F",
				"-m",
				"0",
				"-L",
				"airlock-ws",
				"-E",
				"lazy_itable_init=1,lazy_journal_init=1",
				tmp,
				(char *)(size && *size ? size : VM_DISK_SIZE_DEFAULT),
				NULL};
		if (run_wait(argv, log_fd) < 0) {
			unlink(tmp);
			errmsg_set(err, errlen, "mkfs.ext4 %s failed (see %s/qemu.log)", tmp, sb->dir);
			return -EIO;
		}
	}
	chmod(tmp, 0600);
	if (rename(tmp, img) < 0) {
		int r = -errno;
		errmsg_set(err, errlen, "%s: %s", img, strerror(errno));
		return r;
	}
	return 0;
}

/* A qemu from an earlier start still running on this directory (the host
 * daemon died without stopping it): its pid, else 0. */
static pid_t stale_qemu(const char *pidfile, const char *dir)
{
	char buf[64], cmd[8192];
	ssize_t n;
	long pid;
	int fd;

	if ((fd = open(pidfile, O_RDONLY | O_CLOEXEC)) < 0)
		return 0;
	n = read(fd, buf, sizeof(buf) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	buf[n] = 0;
	pid = strtol(buf, NULL, 10);
	if (pid <= 1)
		return 0;
	snprintf(buf, sizeof(buf), "/proc/%ld/cmdline", pid);
	if ((fd = open(buf, O_RDONLY | O_CLOEXEC)) < 0)
		return 0;
	n = read(fd, cmd, sizeof(cmd) - 1);
	close(fd);
	if (n <= 0)
		return 0;
	for (ssize_t i = 0; i < n; i++)
		if (!cmd[i])
			cmd[i] = ' ';
	cmd[n] = 0;
	return strstr(cmd, "qemu") && strstr(cmd, dir) ? (pid_t)pid : 0;
}

/* Scan the console for a line starting with want (0: the agent's ready
 * line, the init's snapshot point), init's fatal line or nothing yet
 * (-EAGAIN). *fatal gets the fatal line. */
static int console_state(const char *console, const char *want, char *fatal, size_t n)
{
	char line[512];
	int r = -EAGAIN;
	FILE *f = fopen(console, "re");

	if (!f)
		return -EAGAIN;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, VM_FATAL_LINE);
		if (!strncmp(line, want, strlen(want))) {
			r = 0;
			break;
		}
		if (p) {
			p[strcspn(p, "\r\n")] = 0;
			snprintf(fatal, n, "%s", p);
			r = -EIO;
			break;
		}
	}
	fclose(f);
	return r;
}

/* true when the file contains needle (files here are small logs). */
static bool file_has(const char *path, const char *needle)
{
	char line[1024];
	bool found = false;
	FILE *f = fopen(path, "re");

	if (!f)
		return false;
	while (!found && fgets(line, sizeof(line), f))
		found = strstr(line, needle) != NULL;
	fclose(f);
	return found;
}

/* Last non-empty line of a log file, for error messages. */
static void last_line(const char *path, char *out, size_t n)
{
	char line[512];
	FILE *f = fopen(path, "re");

	*out = 0;
	if (!f)
		return;
	while (fgets(line, sizeof(line), f)) {
		line[strcspn(line, "\r\n")] = 0;
		if (*line && (size_t)snprintf(out, n, "%s", line) >= n)
			out[n - 1] = 0; /* cut: it is a hint */
	}
	fclose(f);
}

/* ------------------------------------------------------------------- start */

#define ARGV_MAX     64
#define VM_TRY_TCG   1 /* vm_wait_ready: KVM could not run the guest, qemu is gone */
#define SUN_PATH_MAX sizeof(((struct sockaddr_un *)0)->sun_path)

/* The template's files (doc/VM.md, "The base template"). */
struct vm_template {
	char dir[PATH_MAX];
	char kernel[PATH_MAX]; /* vmlinux */
	char initrd[PATH_MAX]; /* initramfs.cpio */
};

/* The files of one start in the state directory, besides struct vm's. */
struct vm_files {
	char run[PATH_MAX];    /* run/: the sockets and qemu.pid */
	char sock[PATH_MAX];   /* run/agent.sock: the channel */
	char log[PATH_MAX];    /* qemu.log */
	char cfgtar[PATH_MAX]; /* config.tar: the config drive */
	char img[PATH_MAX];    /* workspace.img: the workspace disk (its base, once forks froze it) */
	char ws[PATH_MAX];     /* the image the VM writes: img, or the overlay ws-top names, or a fork's */
	const char *ws_fmt;    /* NULL (raw) or "qcow2" */
	char qmp[PATH_MAX];    /* run/qmp.sock: qemu's monitor (snapshots only) */
};

/* What one qemu command line attaches: the same devices every time (a
 * snapshot restores only onto the machine it was saved from), different
 * files behind them. */
struct vm_media {
	const char *cfg, *ws;	/* the config drive and the workspace disk */
	const char *ws_fmt;	/* the workspace disk's format: NULL raw, or "qcow2" (a fork's overlay) */
	const char *console;	/* the serial console's log */
	const char *sock, *ctl; /* the channel's and the control port's sockets */
	const char *qmp;	/* qemu's monitor socket; NULL: none */
	const char *ram;	/* a file behind the guest's memory; NULL: anonymous memory */
	bool ram_shared;	/* share=on (a boot to be saved) or off (copy on write: a restore) */
	bool ram_anon;		/* no file: anonymous memory under the same name (a fork's restore) */
	bool ram_own;		/* ram is this start's own (shared memory): unlinked once qemu has it */
	bool incoming;		/* -incoming defer: a restore */
	const char *append;	/* the kernel command line */
	unsigned mem_mb;
};

/* One qemu command line: argv and the strings it points into. */
struct qemu_cmd {
	char prog[PATH_MAX];
	const char *machine; /* "microvm" or "q35" */
	bool microvm;
	char append[512], mem[16], m_opt[64];
	char o_con[PATH_MAX + 64], o_cfg[PATH_MAX + 96], o_ws[PATH_MAX + 96], o_ch[PATH_MAX + 96], o_ctl[PATH_MAX + 96];
	char o_mem[PATH_MAX + 128], o_qmp[PATH_MAX + 64];
	char *argv[ARGV_MAX];
};

/* Where the boot is, across the fallback from KVM to software emulation. */
struct vm_launch {
	bool kvm;	 /* this attempt runs under KVM */
	bool kvm_failed; /* an attempt under KVM could not run the guest */
	int log_fd;	 /* qemu.log (qemu's output and ours), until the start is over */
	int64_t launched, deadline;
	char log_path[PATH_MAX];
};

/* The template directory and its kernel and initramfs, (re)built first in
 * a development build. */
static int template_find(struct sandbox *sb, const struct sandbox_cfg *cfg, struct vm_template *t, char *err,
			 size_t errlen)
{
	struct stat st;
	int r;

	if ((r = template_dir(cfg, t->dir, sizeof(t->dir))) < 0) {
		errmsg_set(err, errlen, "no VM template directory: set XDG_CACHE_HOME or HOME, or give one");
		return r;
	}
	if ((r = template_refresh(sb, t->dir, err, errlen)) < 0)
		return r;
	if (path_join(t->kernel, sizeof(t->kernel), t->dir, "vmlinux") < 0 ||
	    path_join(t->initrd, sizeof(t->initrd), t->dir, "initramfs.cpio") < 0) {
		errmsg_set(err, errlen, "%s: path too long", t->dir);
		return -ENAMETOOLONG;
	}
	if (stat(t->kernel, &st) < 0 || stat(t->initrd, &st) < 0) {
		errmsg_set(err, errlen,
			   "no VM template in %s (vmlinux, initramfs.cpio): build it with "
			   "guest-agent/template/build.sh %s PATH/TO/STATIC/airlock-agent",
			   t->dir, t->dir);
		return -ENOENT;
	}
	return 0;
}

/* qemu: $AIRLOCK_QEMU, else qemu-system-x86_64 in $PATH. */
static int qemu_find(char *out, size_t n, char *err, size_t errlen)
{
	const char *env = getenv("AIRLOCK_QEMU");

	if (find_prog(env && *env ? env : "qemu-system-x86_64", out, n) < 0) {
		if (env && *env)
			errmsg_set(err, errlen, "AIRLOCK_QEMU=%s: no such executable", env);
		else
			errmsg_set(err, errlen,
				   "qemu-system-x86_64 not found in PATH (apt-get install qemu-system-x86)");
		return -ENOENT;
	}
	return 0;
}

/* The paths of this start; the sockets' must fit a Unix socket address. */
static int vm_files_init(const struct sandbox *sb, struct vm *vm, struct vm_files *f, char *err, size_t errlen)
{
	if ((sb->run_dir[0] ? (size_t)snprintf(f->run, sizeof(f->run), "%s", sb->run_dir) >= sizeof(f->run)
			    : path_join(f->run, sizeof(f->run), sb->dir, "run") < 0) ||
	    path_join(f->sock, sizeof(f->sock), f->run, "agent.sock") < 0 ||
	    path_join(vm->ctl, sizeof(vm->ctl), f->run, "ctl.sock") < 0 ||
	    path_join(vm->pidfile, sizeof(vm->pidfile), f->run, "qemu.pid") < 0 ||
	    path_join(vm->console, sizeof(vm->console), sb->dir, "console.log") < 0 ||
	    path_join(f->log, sizeof(f->log), sb->dir, "qemu.log") < 0 ||
	    path_join(f->cfgtar, sizeof(f->cfgtar), sb->dir, "config.tar") < 0 ||
	    path_join(f->qmp, sizeof(f->qmp), f->run, "qmp.sock") < 0 || strlen(f->sock) >= SUN_PATH_MAX) {
		/* agent.sock is the longest socket name in run/ (snapshot boots: snapa.sock, snapc.sock) */
		errmsg_set(err, errlen, "%s: path too long for the VM's sockets (at most %zu bytes)", sb->dir,
			   SUN_PATH_MAX - 1 - strlen("/run/agent.sock"));
		return -ENAMETOOLONG;
	}
	return 0;
}

/* run/ made, no qemu of an earlier start still on this directory, the old
 * sockets gone, qemu.log truncated and open in *log_fd. */
static int vm_state_prepare(const struct sandbox *sb, const struct vm *vm, const struct vm_files *f, int *log_fd,
			    char *err, size_t errlen)
{
	pid_t stale;
	int r;

	if (mkdir(f->run, 0700) < 0 && errno != EEXIST) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", f->run, strerror(errno));
		return r;
	}
	if ((stale = stale_qemu(vm->pidfile, sb->dir)) > 0) {
		errmsg_set(err, errlen, "a VM for this workspace is still running (qemu pid %ld): stop it first",
			   (long)stale);
		return -EBUSY;
	}
	unlink(f->sock);
	unlink(vm->ctl);
	unlink(f->qmp);
	if ((*log_fd = open(f->log, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "%s: %s", f->log, strerror(errno));
		return r;
	}
	return 0;
}

/* The kernel command line (doc/VM.md, "Launching": the timekeeping
 * hints under TCG). */
static void kernel_append(char *out, size_t n, const char *tdir, bool kvm)
{
	uint64_t khz;
	unsigned hz;

	if (kvm) {
		snprintf(out, n, "console=ttyS0 quiet panic=-1 rdinit=/init");
		return;
	}
	khz = tsc_khz();
	hz = template_hz(tdir);
	if (khz > 0)
		snprintf(out, n,
			 "console=ttyS0 quiet panic=-1 rdinit=/init tsc_early_khz=%llu lpj=%llu "
			 "tsc=reliable no_timer_check",
			 (unsigned long long)khz, (unsigned long long)(khz * 1000u / hz));
	else
		snprintf(out, n, "console=ttyS0 quiet panic=-1 rdinit=/init");
}

/* The option strings of q for media m (q->machine and q->microvm set). */
static void qemu_options(struct qemu_cmd *q, const struct vm_media *m)
{
	snprintf(q->append, sizeof(q->append), "%s", m->append);
	snprintf(q->mem, sizeof(q->mem), "%u", m->mem_mb);
	snprintf(q->o_con, sizeof(q->o_con), "file,id=con,path=%s", m->console);
	snprintf(q->o_cfg, sizeof(q->o_cfg), "id=cfg,file=%s,format=raw,if=none,readonly=on", m->cfg);
	snprintf(q->o_ws, sizeof(q->o_ws), "id=ws,file=%s,format=%s,if=none,discard=unmap", m->ws,
		 m->ws_fmt ? m->ws_fmt : "raw");
	snprintf(q->o_ch, sizeof(q->o_ch), "socket,id=ch,path=%s,server=on,wait=off", m->sock);
	snprintf(q->o_ctl, sizeof(q->o_ctl), "socket,id=ctl,path=%s,server=on,wait=off", m->ctl);
	if (m->ram_anon) {
		snprintf(q->m_opt, sizeof(q->m_opt), "%s,memory-backend=mem", q->machine);
		snprintf(q->o_mem, sizeof(q->o_mem), "memory-backend-ram,id=mem,size=%uM", m->mem_mb);
	} else if (m->ram) {
		snprintf(q->m_opt, sizeof(q->m_opt), "%s,memory-backend=mem", q->machine);
		snprintf(q->o_mem, sizeof(q->o_mem), "memory-backend-file,id=mem,size=%uM,mem-path=%s,share=%s",
			 m->mem_mb, m->ram, m->ram_shared ? "on" : "off");
	} else {
		snprintf(q->m_opt, sizeof(q->m_opt), "%s", q->machine);
	}
	if (m->qmp)
		snprintf(q->o_qmp, sizeof(q->o_qmp), "unix:%s,server=on,wait=off", m->qmp);
}

/* The qemu command line (doc/VM.md, "Launching"). */
static void qemu_cmd_build(struct qemu_cmd *q, const struct vm_template *t, const struct vm_media *m, bool kvm)
{
	int argc = 0;

	qemu_options(q, m);
#define ARG(x) (q->argv[argc++] = (char *)(x))
	ARG(q->prog);
	ARG("-M");
	ARG(q->m_opt);
	if (kvm) {
		ARG("-enable-kvm");
		ARG("-cpu");
		ARG("host");
	} else {
		ARG("-cpu");
		ARG("max");
	}
	ARG("-m");
	ARG(q->mem);
	if (m->ram || m->ram_anon) {
		ARG("-object");
		ARG(q->o_mem);
	}
	ARG("-smp");
	ARG("1");
	ARG("-nodefaults");
	ARG("-no-user-config");
	ARG("-nographic");
	ARG("-nic");
	ARG("none");
	ARG("-no-reboot");
	ARG("-kernel");
	ARG(t->kernel);
	ARG("-initrd");
	ARG(t->initrd);
	ARG("-append");
	ARG(q->append);
	ARG("-chardev");
	ARG(q->o_con);
	ARG("-serial");
	ARG("chardev:con");
	ARG("-drive");
	ARG(q->o_cfg);
	ARG("-device");
	ARG(q->microvm ? "virtio-blk-device,drive=cfg,serial=airlock-config"
		       : "virtio-blk-pci,drive=cfg,serial=airlock-config");
	ARG("-drive");
	ARG(q->o_ws);
	ARG("-device");
	ARG(q->microvm ? "virtio-blk-device,drive=ws,serial=airlock-ws" : "virtio-blk-pci,drive=ws,serial=airlock-ws");
	ARG("-device");
	ARG(q->microvm ? "virtio-serial-device,id=vs" : "virtio-serial-pci,id=vs");
	ARG("-chardev");
	ARG(q->o_ch);
	ARG("-device");
	ARG("virtserialport,chardev=ch,name=airlock");
	ARG("-chardev");
	ARG(q->o_ctl);
	ARG("-device");
	ARG("virtserialport,chardev=ctl,name=airlock.ctl");
	ARG("-monitor");
	ARG("none");
	if (m->qmp) {
		ARG("-qmp");
		ARG(q->o_qmp);
	}
	if (m->incoming) {
		ARG("-incoming");
		ARG("defer");
	}
	ARG(NULL);
#undef ARG
	_Static_assert(ARGV_MAX >= 56, "argv room");
}

/* Fork and exec qemu, its output to log_fd; the pid in *pid and in the
 * pidfile (which only serves to find a stale qemu later). */
static int qemu_spawn(const struct qemu_cmd *q, int log_fd, const char *pidfile, pid_t *pid, char *err, size_t errlen)
{
	char pbuf[32];
	int fd, r;

	if ((*pid = fork()) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "fork: %s", strerror(errno));
		return r;
	}
	if (*pid == 0) {
		int null = open("/dev/null", O_RDWR);
		/* Its own session: a ^C at the host's terminal is for the host
		 * daemon, which stops the VM in order. The VM dies with the
		 * daemon if that is killed. */
		setsid();
		prctl(PR_SET_PDEATHSIG, SIGTERM);
		if (null >= 0)
			dup2(null, 0);
		dup2(log_fd, 1);
		dup2(log_fd, 2);
		close_range(3, ~0u, 0); /* nothing of the host daemon's reaches qemu */
		execv(q->prog, q->argv);
		dprintf(2, "exec %s: %s\n", q->prog, strerror(errno));
		_exit(127);
	}
	if ((fd = open(pidfile, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600)) >= 0) {
		int n = snprintf(pbuf, sizeof(pbuf), "%ld\n", (long)*pid);
		if (write(fd, pbuf, (size_t)n) != n) {
			/* only used to find a stale qemu later */
		}
		close(fd);
	}
	return 0;
}

/* KVM that passed the probe but cannot run this guest (nested
 * virtualisation missing a feature): qemu reports an internal error and
 * stops, or the kernel never gets to init. */
static bool vm_wait(pid_t pid, unsigned ms);

static bool kvm_cannot_run(const struct vm *vm, const char *log, const struct vm_launch *l)
{
	return l->kvm && (file_has(log, "KVM internal error") ||
			  (now_ms() - l->launched > VM_KVM_GRACE_MS && !file_has(vm->console, "airlock-init:")));
}

/* Until the console shows a line starting with want (0). VM_TRY_TCG when
 * KVM cannot run the guest (qemu killed and reaped, sb->pid 0); else
 * -errno and the message in err (sb->pid 0 when qemu exited by itself). */
static int vm_wait_ready(struct sandbox *sb, const struct vm *vm, const char *log, const struct vm_launch *l,
			 const char *want, char *err, size_t errlen)
{
	char fatal[512] = "";
	int wst, r;

	for (;;) {
		if ((r = console_state(vm->console, want, fatal, sizeof(fatal))) == 0)
			return 0;
		if (r == -EIO) {
			errmsg_set(err, errlen, "the VM did not start: %s (console: %s)", fatal, vm->console);
			return r;
		}
		if (waitpid(sb->pid, &wst, WNOHANG) == sb->pid) {
			char last[400];
			sb->pid = 0;
			last_line(log, last, sizeof(last));
			errmsg_set(err, errlen, "qemu exited before the agent was ready: %s (log: %s)",
				   *last ? last : "no message", log);
			return -EIO;
		}
		if (kvm_cannot_run(vm, log, l)) {
			kill(sb->pid, SIGKILL);
			while (waitpid(sb->pid, &wst, 0) < 0 && errno == EINTR) {
			}
			sb->pid = 0;
			return VM_TRY_TCG;
		}
		if (now_ms() > l->deadline) {
			errmsg_set(err, errlen, "the VM's agent was not ready within %u s (console: %s)",
				   (unsigned)((l->deadline - l->launched + 999) / 1000), vm->console);
			return -ETIMEDOUT;
		}
		usleep(5000);
	}
}

/* ------------------------------------------------------------ start line */

/* Connect to the control port's socket (qemu makes it early in its start)
 * and keep the connection in vm->ctl_fd. */
static int ctl_connect(struct vm *vm, unsigned timeout_ms, char *err, size_t errlen)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int64_t deadline = now_ms() + timeout_ms;
	int r;

	if (strlen(vm->ctl) >= sizeof(sa.sun_path)) {
		errmsg_set(err, errlen, "%s: path too long for a socket", vm->ctl); /* checked in vm_files_init */
		return -ENAMETOOLONG;
	}
	memcpy(sa.sun_path, vm->ctl, strlen(vm->ctl) + 1);
	for (;;) {
		int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			r = -errno;
			errmsg_set(err, errlen, "socket: %s", strerror(errno));
			return r;
		}
		if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0) {
			vm->ctl_fd = fd;
			return 0;
		}
		r = -errno;
		close(fd);
		if ((r != -ENOENT && r != -ECONNREFUSED) || now_ms() > deadline) {
			errmsg_set(err, errlen, "the VM's control port %s: %s", vm->ctl, strerror(-r));
			return r;
		}
		usleep(2000);
	}
}

/* The start counter of this sandbox (<dir>/vm-starts), incremented. */
static uint64_t start_gen(const struct sandbox *sb)
{
	char p[PATH_MAX], buf[32] = "";
	unsigned long long g = 0;
	FILE *f;

	if (path_join(p, sizeof(p), sb->dir, "vm-starts") < 0)
		return 0;
	if ((f = fopen(p, "re"))) {
		if (fgets(buf, sizeof(buf), f))
			g = strtoull(buf, NULL, 10);
		fclose(f);
	}
	g++;
	if ((f = fopen(p, "we"))) {
		fprintf(f, "%llu\n", g);
		fclose(f);
	}
	return (uint64_t)g;
}

/* The start line (include/airlock/guest/vmstart.h) on the control port:
 * how this VM came to be, the host's clock, 32 fresh random bytes. The
 * connection stays open (vm->ctl_fd): the init's poweroff reader blocks
 * on it instead of polling. */
static int send_start(struct sandbox *sb, struct vm *vm, const char *kind, char *err, size_t errlen)
{
	uint8_t seed[32];
	char hex[2 * sizeof(seed) + 1], line[256];
	struct timespec ts;
	int n, r;

	if (vm->ctl_fd < 0 && (r = ctl_connect(vm, 10000, err, errlen)) < 0)
		return r;
	randombytes_buf(seed, sizeof(seed));
	sodium_bin2hex(hex, sizeof(hex), seed, sizeof(seed));
	clock_gettime(CLOCK_REALTIME, &ts);
	n = snprintf(line, sizeof(line), "start %s %llu %lld %s\n", kind, (unsigned long long)start_gen(sb),
		     (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec, hex);
	r = n > 0 && (size_t)n < sizeof(line) && send(vm->ctl_fd, line, (size_t)n, MSG_NOSIGNAL) == n ? 0 : -EIO;
	sodium_memzero(seed, sizeof(seed));
	sodium_memzero(hex, sizeof(hex));
	sodium_memzero(line, sizeof(line));
	if (r < 0)
		errmsg_set(err, errlen, "the VM's control port %s: cannot write the start line", vm->ctl);
	return r;
}

/* ------------------------------------------------------------------ boot */

/* Boot qemu until the console shows want, under KVM when it works here,
 * and once more under software emulation when KVM cannot run the guest.
 * start: the start line's kind to send once qemu runs (NULL: none, the
 * boot that makes a snapshot stops at the snapshot point). From the first
 * spawn on, sb->impl is vm (NULL again while none runs). */
static int vm_boot(struct sandbox *sb, struct vm *vm, struct qemu_cmd *q, const struct vm_template *t,
		   const struct vm_media *m, struct vm_launch *l, const char *want, const char *start, char *err,
		   size_t errlen)
{
	int r;

	for (;;) {
		qemu_cmd_build(q, t, m, l->kvm);
		unlink(vm->console);
		if ((r = qemu_spawn(q, l->log_fd, vm->pidfile, &sb->pid, err, errlen)) < 0) {
			sb->pid = 0;
			return r;
		}
		sb->impl = vm;
		l->launched = now_ms();
		if (!l->deadline)
			l->deadline = l->launched + SANDBOX_VM_START_MS;
		if (start && (r = send_start(sb, vm, start, err, errlen)) < 0)
			return r;
		if ((r = vm_wait_ready(sb, vm, l->log_path, l, want, err, errlen)) != VM_TRY_TCG)
			return r;
		sb->impl = NULL;
		if (vm->ctl_fd >= 0)
			close(vm->ctl_fd);
		vm->ctl_fd = -1;
		l->kvm = false;
		l->kvm_failed = true;
		dprintf(l->log_fd, "airlock: KVM cannot run this guest here; software emulation (TCG) instead\n");
	}
}

/* Stop a qemu that is not the sandbox's yet (the boot that made a
 * snapshot, a restore that failed): KILL and reap. */
static void qemu_kill(struct sandbox *sb)
{
	int st;

	if (sb->pid <= 0)
		return;
	kill(sb->pid, SIGKILL);
	while (waitpid(sb->pid, &st, 0) < 0 && errno == EINTR) {
	}
	sb->pid = 0;
}

/* ------------------------------------------------------------- snapshots */

/* A snapshot of the base template (doc/VM.md, "Snapshots"): the VM saved at
 * its init's snapshot point, before anything of a sandbox was read, with
 * blank disks of the same sizes attached. One serves every sandbox on this
 * host with the same template, qemu and VM settings: the key names them.
 *   <template>/snapshots/<key>/ram    the guest's memory (restored copy on write)
 *   <template>/snapshots/<key>/state  qemu's device state (x-ignore-shared: no memory)
 *   <template>/snapshots/<key>/meta   the kernel command line it booted with, the key's inputs
 * 0700 / 0600: the memory holds the guest kernel's random state from before
 * the snapshot (which each restore reseeds), and whoever writes it runs
 * code in every VM restored from it. */
#define SNAP_KEEP 3 /* snapshots kept per template directory (other keys: oldest removed) */

struct vm_snap {
	char dir[PATH_MAX];   /* <template>/snapshots */
	char key[33];	      /* hex of the key's first 16 bytes */
	char path[PATH_MAX];  /* dir/key */
	char ram[PATH_MAX];   /* path/ram */
	char state[PATH_MAX]; /* path/state */
	char meta[PATH_MAX];  /* path/meta */
	char append[512];     /* from meta: the kernel command line of the saved boot */
	char inputs[2048];    /* the key's inputs, as text */
	unsigned mem_mb;
};

/* The guest's memory in MiB: $AIRLOCK_VM_MEMORY (64..65536), else 1024. */
static int vm_mem_mb(unsigned *out, char *err, size_t errlen)
{
	const char *e = getenv("AIRLOCK_VM_MEMORY");
	char *end;
	unsigned long v;

	*out = VM_MEM_MB_DEFAULT;
	if (!e || !*e)
		return 0;
	errno = 0;
	v = strtoul(e, &end, 10);
	if (errno || *end || v < 64 || v > 65536) {
		errmsg_set(err, errlen, "AIRLOCK_VM_MEMORY=%s: not a size in MiB between 64 and 65536", e);
		return -EINVAL;
	}
	*out = (unsigned)v;
	return 0;
}

/* XXH3-128 of a file's content, in hex. */
static int file_hash_read(const char *path, char out[33])
{
	struct stat st;
	void *p = MAP_FAILED;
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	XXH128_hash_t h;

	if (fd < 0)
		return -errno;
	if (fstat(fd, &st) < 0 ||
	    (st.st_size > 0 && (p = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_PRIVATE, fd, 0)) == MAP_FAILED)) {
		int r = -errno;
		close(fd);
		return r;
	}
	h = XXH3_128bits(p == MAP_FAILED ? "" : p, (size_t)st.st_size);
	if (p != MAP_FAILED)
		munmap(p, (size_t)st.st_size);
	close(fd);
	snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.high64, (unsigned long long)h.low64);
	return 0;
}

static void file_identity(const char *path, char *out, size_t n);

/* The content hash of a template file, remembered in snapdir/hashes by the
 * file's identity (inode, size, mtime, ctime: any write changes the ctime),
 * so a start does not read the 70 MB kernel and initramfs again. */
static int file_hash(const char *snapdir, const char *path, char out[33])
{
	char id[160], p[PATH_MAX], line[PATH_MAX + 256], want[PATH_MAX + 200];
	FILE *f;
	int r;

	file_identity(path, id, sizeof(id));
	if ((size_t)snprintf(want, sizeof(want), "%s %s ", path, id) >= sizeof(want) ||
	    path_join(p, sizeof(p), snapdir, "hashes") < 0)
		return file_hash_read(path, out);
	if ((f = fopen(p, "re"))) {
		size_t wl = strlen(want);
		while (fgets(line, sizeof(line), f))
			if (!strncmp(line, want, wl) && strlen(line + wl) == 33 && line[wl + 32] == '\n') {
				memcpy(out, line + wl, 32);
				out[32] = 0;
				fclose(f);
				return 0;
			}
		fclose(f);
	}
	if ((r = file_hash_read(path, out)) < 0)
		return r;
	struct stat st;
	if (stat(p, &st) == 0 && st.st_size > 65536) /* old templates' lines */
		unlink(p);
	if ((f = fopen(p, "ae"))) {
		fchmod(fileno(f), 0600);
		fprintf(f, "%s%s\n", want, out);
		fclose(f);
	}
	return 0;
}

/* What identifies a file without reading it: inode, size, mtime and ctime
 * (any write or replacement changes the ctime). For the qemu binary, whose
 * version would cost a process to ask. */
static void file_identity(const char *path, char *out, size_t n)
{
	struct stat st;

	if (stat(path, &st) < 0) {
		snprintf(out, n, "missing");
		return;
	}
	snprintf(out, n, "%llu:%llu:%lld.%09ld:%lld.%09ld", (unsigned long long)st.st_ino,
		 (unsigned long long)st.st_size, (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec,
		 (long long)st.st_ctim.tv_sec, st.st_ctim.tv_nsec);
}

/* The host CPU's model name (the guest's TSC under TCG is the host's). */
static void cpu_model(char *out, size_t n)
{
	char line[512];
	FILE *f = fopen("/proc/cpuinfo", "re");

	snprintf(out, n, "unknown");
	if (!f)
		return;
	while (fgets(line, sizeof(line), f))
		if (!strncmp(line, "model name", 10)) {
			line[strcspn(line, "\n")] = 0;
			snprintf(out, n, "%s", line + strcspn(line, ":") + (line[strcspn(line, ":")] ? 2 : 0));
			break;
		}
	fclose(f);
}

/* -M microvm when this qemu has it, cached per qemu binary in
 * <template>/snapshots/machines (asking qemu costs a process); snapdir
 * NULL: no cache. */
static bool machine_microvm(const char *qemu, const char *snapdir)
{
	const char *m = getenv("AIRLOCK_VM_MACHINE");
	char id[160], p[PATH_MAX], line[256];
	bool microvm;
	FILE *f;

	if (m && *m)
		return strcmp(m, "q35") != 0;
	if (!snapdir)
		return qemu_has_microvm(qemu);
	file_identity(qemu, id, sizeof(id));
	if (path_join(p, sizeof(p), snapdir, "machines") < 0)
		return qemu_has_microvm(qemu);
	if ((f = fopen(p, "re"))) {
		int found = -1;
		size_t idl = strlen(id);
		if (fgets(line, sizeof(line), f) && !strncmp(line, id, idl) && line[idl] == ' ')
			found = !strncmp(line + idl + 1, "microvm", 7);
		fclose(f);
		if (found >= 0)
			return found;
	}
	microvm = qemu_has_microvm(qemu);
	if ((f = fopen(p, "we"))) {
		fprintf(f, "%s %s\n", id, microvm ? "microvm" : "q35");
		fclose(f);
	}
	return microvm;
}

/* The snapshot's key: everything the saved state depends on. */
static int snap_key(struct vm_snap *sn, const struct vm_template *t, const struct qemu_cmd *q, bool kvm,
		    const char *img)
{
	char hk[33], hi[33], qid[160], stamp[64] = "", cpu[256], p[PATH_MAX];
	uint8_t h[crypto_generichash_BYTES];
	struct stat st;
	FILE *f;
	int r, n;

	if ((r = file_hash(sn->dir, t->kernel, hk)) < 0 || (r = file_hash(sn->dir, t->initrd, hi)) < 0)
		return r;
	if (stat(img, &st) < 0)
		return -errno;
	file_identity(q->prog, qid, sizeof(qid));
	cpu_model(cpu, sizeof(cpu));
	if (path_join(p, sizeof(p), t->dir, "stamp") == 0 && (f = fopen(p, "re"))) {
		if (!fgets(stamp, sizeof(stamp), f))
			stamp[0] = 0;
		stamp[strcspn(stamp, "\n")] = 0;
		fclose(f);
	}
	n = snprintf(sn->inputs, sizeof(sn->inputs),
		     "format 1\nkernel %s\ninitramfs %s\ntemplate-stamp %s\nqemu %s %s\nmachine %s\naccel %s\n"
		     "cpu-model %s\nmemory %uM\nsmp 1\ndevices config %d workspace %lld serial airlock airlock.ctl\n"
		     "host-cpu %s\n",
		     hk, hi, stamp, q->prog, qid, q->machine, kvm ? "kvm host" : "tcg max", kvm ? "host" : "max",
		     sn->mem_mb, VM_CONFIG_SIZE, (long long)st.st_size, cpu);
	if (n < 0 || (size_t)n >= sizeof(sn->inputs))
		return -ENAMETOOLONG;
	crypto_generichash(h, sizeof(h), (const uint8_t *)sn->inputs, (size_t)n, NULL, 0);
	sodium_bin2hex(sn->key, sizeof(sn->key), h, 16);
	if (path_join(sn->path, sizeof(sn->path), sn->dir, sn->key) < 0 ||
	    path_join(sn->ram, sizeof(sn->ram), sn->path, "ram") < 0 ||
	    path_join(sn->state, sizeof(sn->state), sn->path, "state") < 0 ||
	    path_join(sn->meta, sizeof(sn->meta), sn->path, "meta") < 0)
		return -ENAMETOOLONG;
	return 0;
}

/* Ours and writable by nobody else (a snapshot someone else can write
 * would run their code in our VMs). */
static bool private_file(const char *path, mode_t type)
{
	struct stat st;

	return lstat(path, &st) == 0 && (st.st_mode & S_IFMT) == type && st.st_uid == geteuid() && !(st.st_mode & 022);
}

/* A usable snapshot at sn->path: the files there, private, and its kernel
 * command line read into sn->append. */
static bool snap_valid(struct vm_snap *sn)
{
	char line[sizeof(sn->append) + 16];
	bool ok = false;
	FILE *f;

	if (!private_file(sn->path, S_IFDIR) || !private_file(sn->ram, S_IFREG) || !private_file(sn->state, S_IFREG) ||
	    !private_file(sn->meta, S_IFREG) || !(f = fopen(sn->meta, "re")))
		return false;
	while (!ok && fgets(line, sizeof(line), f))
		if (!strncmp(line, "append ", 7)) {
			line[strcspn(line, "\n")] = 0;
			ok = (size_t)snprintf(sn->append, sizeof(sn->append), "%.*s", (int)sizeof(sn->append) - 1,
					      line + 7) < sizeof(sn->append);
		}
	fclose(f);
	return ok;
}

/* Remove a snapshot directory (its three files, then itself). */
static void snap_remove(const char *path)
{
	static const char *const names[] = {"ram", "state", "meta", "config.tar", "ws.img"};
	char p[PATH_MAX];

	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		if (path_join(p, sizeof(p), path, names[i]) == 0)
			unlink(p);
	rmdir(path);
}

/* Keep the SNAP_KEEP newest snapshots of dir (by their state file), and
 * remove unfinished ones left by a start that died. */
static void snap_prune(const char *dir, const char *keep)
{
	struct {
		char name[64];
		time_t t;
	} e[32];
	size_t n = 0;
	struct dirent *d;
	DIR *dd = opendir(dir);

	if (!dd)
		return;
	while ((d = readdir(dd)) && n < sizeof(e) / sizeof(e[0])) {
		char p[PATH_MAX], st_path[PATH_MAX];
		struct stat st;
		if (d->d_name[0] == '.' && strncmp(d->d_name, ".new-", 5))
			continue;
		if (strlen(d->d_name) >= sizeof(e[0].name) || path_join(p, sizeof(p), dir, d->d_name) < 0 ||
		    lstat(p, &st) < 0 || !S_ISDIR(st.st_mode))
			continue;
		if (!strncmp(d->d_name, ".new-", 5)) {
			if (time(NULL) - st.st_mtime > 600) /* a start that died while saving */
				snap_remove(p);
			continue;
		}
		if (!strcmp(d->d_name, keep) || path_join(st_path, sizeof(st_path), p, "state") < 0)
			continue;
		snprintf(e[n].name, sizeof(e[n].name), "%s", d->d_name);
		e[n++].t = stat(st_path, &st) == 0 ? st.st_mtime : 0;
	}
	closedir(dd);
	while (n + 1 > SNAP_KEEP && n > 0) { /* the kept one counts */
		size_t old = 0;
		char p[PATH_MAX];
		for (size_t i = 1; i < n; i++)
			if (e[i].t < e[old].t)
				old = i;
		if (path_join(p, sizeof(p), dir, e[old].name) == 0)
			snap_remove(p);
		e[old] = e[--n];
	}
}

/* An empty file of size bytes (sparse), mode 0600. */
static int blank_file(const char *path, off_t size)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600), r = 0;

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, size) < 0)
		r = -errno;
	close(fd);
	return r;
}

/* Single quotes for /bin/sh (qemu's exec: migration runs its argument
 * with sh -c). */
static int sh_quote(char *out, size_t n, const char *s)
{
	size_t k = 0;

	if (n < 3)
		return -ENAMETOOLONG;
	out[k++] = '\'';
	for (; *s; s++) {
		const char *piece = *s == '\'' ? "'\\''" : NULL;
		size_t len = piece ? 4 : 1;
		if (k + len + 2 > n)
			return -ENAMETOOLONG;
		if (piece)
			memcpy(out + k, piece, len);
		else
			out[k] = *s;
		k += len;
	}
	out[k++] = '\'';
	out[k] = 0;
	return 0;
}

/* qemu caps a migration at 128 MiB/s by default (its max-bandwidth), a
 * limit meant for live migration over a network: a stopped VM saved to a
 * local file would wait on it (90 MiB of a parent's memory: 0.7 s). */
#define MIGRATE_BANDWIDTH (1LL << 40)

/* Until qemu's migration reached a final state: 0 when completed. */
static int migrate_wait(struct qmp *qm, const char *what, char *err, size_t errlen)
{
	int64_t deadline = now_ms() + 60000;

	for (;;) {
		json_t *ret = NULL;
		const char *st;
		int r = qmp_call(qm, "query-migrate", NULL, &ret, 10000, err, errlen);
		if (r < 0)
			return r;
		st = json_string_value(json_object_get(ret, "status"));
		if (st && !strcmp(st, "completed")) {
			json_decref(ret);
			return 0;
		}
		if (st && (!strcmp(st, "failed") || !strcmp(st, "cancelled"))) {
			const char *why = json_string_value(json_object_get(ret, "error-desc"));
			errmsg_set(err, errlen, "%s: qemu's migration %s: %s", what, st, why ? why : "no reason given");
			json_decref(ret);
			return -EIO;
		}
		json_decref(ret);
		if (now_ms() > deadline) {
			errmsg_set(err, errlen, "%s: qemu's migration did not finish within 60 s", what);
			return -ETIMEDOUT;
		}
		usleep(3000);
	}
}

static int set_ignore_shared(struct qmp *qm, char *err, size_t errlen)
{
	json_t *caps = json_pack("{s:[{s:s, s:b}]}", "capabilities", "capability", "x-ignore-shared", "state", 1);
	int r = caps ? qmp_call(qm, "migrate-set-capabilities", caps, NULL, 10000, err, errlen) : -ENOMEM;

	json_decref(caps);
	return r;
}

/* Save the VM at its snapshot point into tmp: stop it, write the device
 * state (its memory is already in tmp/ram, shared), quit. */
static int snap_save(struct sandbox *sb, const char *qmp_path, const char *tmp, char *err, size_t errlen)
{
	char state[PATH_MAX], quoted[2 * PATH_MAX], uri[2 * PATH_MAX + 32];
	json_t *args = NULL;
	struct qmp qm;
	int r;

	if (path_join(state, sizeof(state), tmp, "state") < 0 || sh_quote(quoted, sizeof(quoted), state) < 0)
		return -ENAMETOOLONG;
	snprintf(uri, sizeof(uri), "exec:umask 077 && cat > %s", quoted);
	if ((r = qmp_open(&qm, qmp_path, 10000, err, errlen)) < 0)
		return r;
	if ((r = qmp_call(&qm, "stop", NULL, NULL, 10000, err, errlen)) < 0 ||
	    (r = set_ignore_shared(&qm, err, errlen)) < 0 || !(args = json_pack("{s:s}", "uri", uri)) ||
	    (r = qmp_call(&qm, "migrate", args, NULL, 10000, err, errlen)) < 0 ||
	    (r = migrate_wait(&qm, "saving the snapshot", err, errlen)) < 0)
		goto out;
	qmp_call(&qm, "quit", NULL, NULL, 5000, err, errlen); /* it may close before answering */
	if (!vm_wait(sb->pid, 10000))
		qemu_kill(sb);
	sb->pid = 0;
out:
	json_decref(args);
	qmp_close(&qm);
	return r;
}

/* Write meta and make every file durable before the directory is renamed
 * into place (a torn snapshot would be restored into a guest that hangs). */
static int snap_finish(const struct vm_snap *sn, const char *tmp, const char *append)
{
	static const char *const names[] = {"ram", "state", "meta"};
	char p[PATH_MAX];
	FILE *f;
	int r = 0;

	if (path_join(p, sizeof(p), tmp, "meta") < 0 || !(f = fopen(p, "wxe")))
		return -EIO;
	fchmod(fileno(f), 0600);
	fprintf(f, "append %s\n%s", append, sn->inputs);
	if (fflush(f) != 0)
		r = -EIO;
	fclose(f);
	for (size_t i = 0; r == 0 && i < sizeof(names) / sizeof(names[0]); i++) {
		int fd;
		if (path_join(p, sizeof(p), tmp, names[i]) < 0 || (fd = open(p, O_RDONLY | O_CLOEXEC)) < 0) {
			r = -EIO;
			break;
		}
		if (fsync(fd) < 0 || fchmod(fd, 0600) < 0)
			r = -errno;
		close(fd);
	}
	if (r == 0 && rename(tmp, sn->path) < 0)
		r = -errno;
	return r;
}

/* Boot the template with blank disks (nothing of this sandbox in it) up to
 * the snapshot point and save it as sn (doc/VM.md, "Snapshots"). -EBUSY
 * when another start is saving one now (the caller boots without). */
static int snap_make(struct sandbox *sb, struct vm_snap *sn, const struct vm_template *t, struct qemu_cmd *q,
		     const struct vm_files *f, struct vm_launch *l, char *err, size_t errlen)
{
	char tmp[PATH_MAX], cfg[PATH_MAX], ws[PATH_MAX], ram[PATH_MAX], lockp[PATH_MAX];
	char console[PATH_MAX], sock[PATH_MAX], append[512];
	struct vm svm = {.ctl_fd = -1};
	struct vm_media m;
	struct vm_launch sl = *l;
	struct stat st;
	int lockfd, r;

	if (path_join(lockp, sizeof(lockp), sn->dir, ".lock") < 0)
		return -ENAMETOOLONG;
	if ((lockfd = open(lockp, O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0600)) < 0)
		return -errno;
	if (flock(lockfd, LOCK_EX | LOCK_NB) < 0) {
		close(lockfd);
		return -EBUSY;
	}
	if (snap_valid(sn)) { /* another start saved it meanwhile */
		close(lockfd);
		return 0;
	}
	if ((size_t)snprintf(tmp, sizeof(tmp), "%s/.new-XXXXXX", sn->dir) >= sizeof(tmp) || !mkdtemp(tmp)) {
		r = -errno;
		goto out_lock;
	}
	if (path_join(cfg, sizeof(cfg), tmp, "config.tar") < 0 || path_join(ws, sizeof(ws), tmp, "ws.img") < 0 ||
	    path_join(ram, sizeof(ram), tmp, "ram") < 0 ||
	    path_join(console, sizeof(console), sb->dir, "snapshot-console.log") < 0 ||
	    path_join(sock, sizeof(sock), f->run, "snapa.sock") < 0 ||
	    path_join(svm.ctl, sizeof(svm.ctl), f->run, "snapc.sock") < 0 ||
	    path_join(svm.pidfile, sizeof(svm.pidfile), f->run, "qemu.pid") < 0) {
		r = -ENAMETOOLONG;
		goto out;
	}
	snprintf(svm.console, sizeof(svm.console), "%s", console);
	if (stat(f->img, &st) < 0) {
		r = -errno;
		goto out;
	}
	if ((r = blank_file(cfg, VM_CONFIG_SIZE)) < 0 || (r = blank_file(ws, st.st_size)) < 0 ||
	    (r = blank_file(ram, (off_t)sn->mem_mb << 20)) < 0)
		goto out;
	kernel_append(append, sizeof(append), t->dir, l->kvm);
	m = (struct vm_media){.cfg = cfg,
			      .ws = ws,
			      .console = console,
			      .sock = sock,
			      .ctl = svm.ctl,
			      .qmp = f->qmp,
			      .ram = ram,
			      .ram_shared = true,
			      .append = append,
			      .mem_mb = sn->mem_mb};
	unlink(sock);
	unlink(svm.ctl);
	unlink(f->qmp);
	sl.deadline = 0;
	r = vm_boot(sb, &svm, q, t, &m, &sl, "airlock-init: snapshot point", NULL, err, errlen);
	sb->impl = NULL; /* svm is this function's */
	if (r == 0 && sl.kvm_failed) {
		errmsg_set(err, errlen, "KVM could not run the guest: no snapshot this time");
		r = -ENOTSUP;
	}
	if (r == 0)
		r = snap_save(sb, f->qmp, tmp, err, errlen);
	qemu_kill(sb);
	unlink(sock);
	unlink(svm.ctl);
	unlink(f->qmp);
	unlink(cfg); /* the blank disks are not needed any more */
	unlink(ws);
	if (r == 0 && (r = snap_finish(sn, tmp, append)) < 0)
		errmsg_set(err, errlen, "%s: %s", sn->path, strerror(-r));
	if (r == 0) {
		snap_prune(sn->dir, sn->key);
		r = snap_valid(sn) ? 0 : -EIO;
	}
out:
	if (r < 0)
		snap_remove(tmp);
out_lock:
	close(lockfd);
	return r;
}

/* --------------------------------------------------------- shared memory */

/* doc/VM.md "Forks": a restored VM's memory is a file of its own on tmpfs,
 * mapped shared (share=on), filled from the snapshot's memory as qemu
 * starts. A freeze then saves only the device state (x-ignore-shared: the
 * shared memory is not in the stream) and copies that file for the fork,
 * which restores from it as from a snapshot. The file is unlinked as soon
 * as qemu has it open: qemu keeps the descriptor (a freeze reaches it
 * through /proc/PID/fd), and nothing of it outlives the VM.
 *   /dev/shm/airlock-<uid>/    0700, ours, tmpfs (else: no shared memory);
 *                              $AIRLOCK_VM_RAM_DIR instead, if set
 *     vm-<dev>-<ino>.ram       a VM's memory (dev, ino: its state directory's)
 *     spare-<key>-<ino>-<t>.ram a copy of a snapshot's memory made by a stop for
 *                              the next restore (the newest two kept)
 * AIRLOCK_VM_SHARED_RAM=0 turns it off: a private copy-on-write mapping of
 * the snapshot's file, a freeze migrates all of the memory (as before). */
#define RAM_PAGE 4096

/* The directory of shared memory files ($AIRLOCK_VM_RAM_DIR, else
 * /dev/shm/airlock-<uid>), made if needed: -errno when there is none to
 * use (not tmpfs, not ours; off, for a new start). */
static int ram_dir(char *out, size_t n, bool start)
{
	const char *e = getenv("AIRLOCK_VM_SHARED_RAM"), *d = getenv("AIRLOCK_VM_RAM_DIR");
	struct statfs fs;
	struct stat st;

	if (start && e && !strcmp(e, "0"))
		return -ENOTSUP;
	if ((size_t)(d && *d ? snprintf(out, n, "%s", d)
			     : snprintf(out, n, "/dev/shm/airlock-%u", (unsigned)getuid())) >= n)
		return -ENAMETOOLONG;
	if (mkdir(out, 0700) < 0 && errno != EEXIST)
		return -errno;
	if (lstat(out, &st) < 0)
		return -errno;
	if (!S_ISDIR(st.st_mode) || st.st_uid != getuid() || (st.st_mode & 077))
		return -EPERM;
	if (statfs(out, &fs) < 0 || fs.f_type != TMPFS_MAGIC)
		return -ENOTSUP;
	return 0;
}

/* The shared memory file of the VM whose state directory is dir (start:
 * for a new VM's start, which AIRLOCK_VM_SHARED_RAM=0 turns off). */
static int ram_path(const char *dir, char *out, size_t n, bool start)
{
	char rd[PATH_MAX];
	struct stat st;
	int r;

	if ((r = ram_dir(rd, sizeof(rd), start)) < 0)
		return r;
	if (stat(dir, &st) < 0)
		return -errno;
	if ((size_t)snprintf(out, n, "%s/vm-%llx-%llx.ram", rd, (unsigned long long)st.st_dev,
			     (unsigned long long)st.st_ino) >= n)
		return -ENAMETOOLONG;
	return 0;
}

/* A new memory file at path of size bytes (sparse), 0600; its descriptor. */
static int ram_create(const char *path, off_t size)
{
	int fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0600);

	if (fd < 0)
		return -errno;
	if (ftruncate(fd, size) < 0) {
		int r = -errno;
		close(fd);
		unlink(path);
		return r;
	}
	return fd;
}

/* Whether the file system of fd has room for size more bytes: a shared
 * page the guest touches when tmpfs is full is a SIGBUS in qemu, so a VM
 * gets shared memory only with room for all of it. */
static bool ram_room(const char *path, off_t size)
{
	struct statfs fs;

	return statfs(path, &fs) == 0 && (uint64_t)fs.f_bavail * (uint64_t)fs.f_bsize >= (uint64_t)size;
}

static bool page_zero(const uint8_t *p)
{
	return p[0] == 0 && !memcmp(p, p + 1, RAM_PAGE - 1);
}

static int ram_write(int dst, const uint8_t *map, off_t from, off_t to)
{
	while (from < to) {
		ssize_t k = pwrite(dst, map + from, (size_t)(to - from), from);
		if (k < 0 && errno != EINTR)
			return -errno;
		if (k > 0)
			from += k;
	}
	return 0;
}

/* [from, to) of src into dst in the kernel (tmpfs to tmpfs: one copy, no
 * pass over the pages here). 0, -EXDEV (and the like) when the two files
 * cannot (the caller copies by hand), or -errno. */
static int ram_copy_range(int src, int dst, off_t from, off_t to)
{
	loff_t a = from, b = from;

	while (a < to) {
		ssize_t k = copy_file_range(src, &a, dst, &b, (size_t)(to - a), 0);
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0)
			return -errno;
		if (k == 0)
			return -EIO;
	}
	return 0;
}

static bool cannot_copy_range(int r)
{
	return r == -EXDEV || r == -EINVAL || r == -EOPNOTSUPP || r == -ENOSYS;
}

/* Copy the memory in src into dst (as large, sparse): only src's data
 * extents are read. Between files of one file system (a fork's copy of
 * its parent's on tmpfs) the kernel copies them; else (the snapshot's
 * file, on disk) only the pages that are not all zero are written: a
 * zero page stays a hole, the guest reads zeros there. */
static int ram_copy(int src, int dst)
{
	struct stat st, dt;
	uint8_t *map;
	off_t off = 0;
	bool in_kernel;
	int r = 0;

	if (fstat(src, &st) < 0 || fstat(dst, &dt) < 0)
		return -errno;
	if (st.st_size == 0)
		return 0;
	in_kernel = st.st_dev == dt.st_dev;
	if ((map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, src, 0)) == MAP_FAILED)
		return -errno;
	while (r == 0 && off < st.st_size) {
		off_t data = lseek(src, off, SEEK_DATA), hole, run = -1;
		if (data < 0) {
			r = errno == ENXIO ? 0 : -errno;
			break;
		}
		if ((hole = lseek(src, data, SEEK_HOLE)) < 0) {
			r = -errno;
			break;
		}
		data &= ~(off_t)(RAM_PAGE - 1);
		if (in_kernel) {
			if ((r = ram_copy_range(src, dst, data, hole)) == 0 || !cannot_copy_range(r)) {
				off = hole;
				continue;
			}
			in_kernel = false; /* by hand from here on */
			r = 0;
		}
		for (off_t p = data; r == 0; p += RAM_PAGE) {
			bool end = p >= hole || p + RAM_PAGE > st.st_size;
			if (!end && !page_zero(map + p)) {
				if (run < 0)
					run = p;
				continue;
			}
			if (run >= 0) /* the run of non-zero pages [run, p) */
				r = ram_write(dst, map, run, p);
			run = -1;
			if (end)
				break;
		}
		off = hole;
	}
	munmap(map, (size_t)st.st_size);
	return r;
}

/* The descriptor of qemu's (unlinked) shared memory file path, opened
 * read-only through /proc/PID/fd; -errno when qemu has none. */
static int ram_of_qemu(pid_t pid, const char *path)
{
	char fdp[64], want[PATH_MAX + 16], link[PATH_MAX + 16];
	struct dirent *e;
	int fd = -ENOENT;
	DIR *d;

	snprintf(want, sizeof(want), "%s (deleted)", path);
	snprintf(fdp, sizeof(fdp), "/proc/%ld/fd", (long)pid);
	if (!(d = opendir(fdp)))
		return -errno;
	while (fd < 0 && (e = readdir(d))) {
		char p[64 + sizeof(e->d_name)];
		ssize_t n;
		if (e->d_name[0] == '.')
			continue;
		snprintf(p, sizeof(p), "%s/%s", fdp, e->d_name);
		if ((n = readlink(p, link, sizeof(link) - 1)) < 0)
			continue;
		link[n] = 0;
		if (!strcmp(link, want) && (fd = open(p, O_RDONLY | O_CLOEXEC)) < 0)
			fd = -errno;
	}
	closedir(d);
	return fd;
}

/* qemu's pid from the pidfile of dir's run/ (a running VM's). */
static pid_t qemu_pid_of(const char *dir)
{
	char p[PATH_MAX];
	long pid = 0;
	FILE *f;

	if (path_join(p, sizeof(p), dir, "run/qemu.pid") < 0 || !(f = fopen(p, "re")))
		return -1;
	if (fscanf(f, "%ld", &pid) != 1)
		pid = 0;
	fclose(f);
	return pid > 0 ? (pid_t)pid : -1;
}

/* The spare copy of the snapshot sn's memory (doc/VM.md "Shared memory"):
 * spare-<key>-<ino>-<mtime>.ram in the shared memory directory, named by
 * the snapshot file's identity (a snapshot made again under the same key
 * is another file). */
static int spare_path(const char *snap_ram, const char *key, char *out, size_t n)
{
	char rd[PATH_MAX];
	struct stat st;
	int r;

	if ((r = ram_dir(rd, sizeof(rd), true)) < 0)
		return r;
	if (stat(snap_ram, &st) < 0)
		return -errno;
	if ((size_t)snprintf(out, n, "%s/spare-%s-%llx-%llx.ram", rd, key, (unsigned long long)st.st_ino,
			     (unsigned long long)st.st_mtim.tv_sec * 1000000000ull +
				 (unsigned long long)st.st_mtim.tv_nsec) >= n)
		return -ENAMETOOLONG;
	return 0;
}

/* Keep only the newest SPARE_KEEP spares of dir (the one just made among
 * them): each is a copy of a snapshot's memory held on tmpfs. A temporary
 * one older than SPARE_TMP_S was left by a stop that did not finish. */
#define SPARE_KEEP  2
#define SPARE_TMP_S 600
static bool name_ends(const char *name, const char *end)
{
	size_t n = strlen(name), k = strlen(end);

	return n >= k && !strcmp(name + n - k, end);
}

static void spare_prune(const char *dir)
{
	struct {
		char name[NAME_MAX + 1];
		struct timespec t;
	} keep[SPARE_KEEP] = {0};
	char p[PATH_MAX];
	struct dirent *e;
	struct stat st;
	DIR *d;

	for (int pass = 0; pass < 2; pass++) { /* the newest, then the others removed */
		if (!(d = opendir(dir)))
			return;
		while ((e = readdir(d))) {
			bool tmp = name_ends(e->d_name, ".tmp");
			if (strncmp(e->d_name, "spare-", 6) || (!tmp && !name_ends(e->d_name, ".ram")) ||
			    path_join(p, sizeof(p), dir, e->d_name) < 0 || stat(p, &st) < 0)
				continue;
			if (tmp) {
				if (pass == 1 && st.st_mtim.tv_sec < time(NULL) - SPARE_TMP_S)
					unlink(p);
				continue;
			}
			if (pass == 1) {
				bool kept = false;
				for (int i = 0; i < SPARE_KEEP; i++)
					kept |= !strcmp(keep[i].name, e->d_name);
				if (!kept)
					unlink(p);
				continue;
			}
			for (int i = 0; i < SPARE_KEEP; i++)
				if (!keep[i].name[0] || st.st_mtim.tv_sec > keep[i].t.tv_sec ||
				    (st.st_mtim.tv_sec == keep[i].t.tv_sec && st.st_mtim.tv_nsec > keep[i].t.tv_nsec)) {
					memmove(&keep[i + 1], &keep[i], sizeof(keep[0]) * (size_t)(SPARE_KEEP - 1 - i));
					snprintf(keep[i].name, sizeof(keep[i].name), "%s", e->d_name);
					keep[i].t = st.st_mtim;
					break;
				}
		}
		closedir(d);
	}
}

/* After a VM restored on shared memory stopped: a spare copy of its
 * snapshot's memory for the next restore, unless one is there (written
 * under a temporary name, renamed when whole). Best effort. */
static void spare_make(const char *src_path, const char *spare)
{
	char tmp[PATH_MAX + 32], dir[PATH_MAX];
	const char *slash = strrchr(spare, '/');
	struct stat st;
	int src, dst, r;

	if (!slash || access(spare, F_OK) == 0 ||
	    (size_t)snprintf(tmp, sizeof(tmp), "%s.%ld.tmp", spare, (long)getpid()) >= sizeof(tmp) ||
	    (src = open(src_path, O_RDONLY | O_CLOEXEC)) < 0)
		return;
	if (fstat(src, &st) < 0 || (dst = ram_create(tmp, st.st_size)) < 0) {
		close(src);
		return;
	}
	r = ram_room(tmp, st.st_size) ? ram_copy(src, dst) : -ENOSPC;
	close(src);
	close(dst);
	if (r < 0 || rename(tmp, spare) < 0) {
		unlink(tmp);
		return;
	}
	snprintf(dir, sizeof(dir), "%.*s", (int)(slash - spare), spare);
	spare_prune(dir);
}

/* A restore's memory to copy into the VM's own file as qemu starts. */
struct ram_fill {
	int src, dst;
};

/* Restore a saved VM onto media m (m->incoming): qemu waits for the
 * migration stream (-incoming defer) and reads it from the file state
 * (ignore_shared: the memory is not in it, m->ram is mapped copy on write);
 * then the start line of kind and `cont`. */
static int vm_restore(struct sandbox *sb, struct vm *vm, const struct vm_media *m, const char *state,
		      bool ignore_shared, const struct ram_fill *fill, const struct vm_template *t, struct qemu_cmd *q,
		      const struct vm_files *f, struct vm_launch *l, const char *kind, char *err, size_t errlen)
{
	char quoted[2 * PATH_MAX], uri[2 * PATH_MAX + 32];
	json_t *args = NULL, *st = NULL;
	struct qmp qm = {.fd = -1};
	int64_t deadline, t_loading = 0, t_cont = 0;
	int r;

	if ((r = sh_quote(quoted, sizeof(quoted), state)) < 0)
		return r;
	snprintf(uri, sizeof(uri), "exec:cat %s", quoted);
	unlink(vm->console);
	unlink(f->qmp);
	qemu_cmd_build(q, t, m, l->kvm);
	if ((r = qemu_spawn(q, l->log_fd, vm->pidfile, &sb->pid, err, errlen)) < 0) {
		sb->pid = 0;
		return r;
	}
	l->launched = now_ms();
	l->deadline = l->launched + SANDBOX_VM_START_MS / 4;
	/* qemu maps the file as it starts and writes nothing to the guest's
	 * memory before the migration (its ROMs are not loaded while it
	 * waits for one): fill it meanwhile */
	if (fill && (r = ram_copy(fill->src, fill->dst)) < 0) {
		errmsg_set(err, errlen, "copying the memory into %s: %s", m->ram, strerror(-r));
		goto out;
	}
	if ((r = qmp_open(&qm, f->qmp, 30000, err, errlen)) < 0 ||
	    (ignore_shared && (r = set_ignore_shared(&qm, err, errlen)) < 0) ||
	    !(args = json_pack("{s:s}", "uri", uri)) ||
	    (r = qmp_call(&qm, "migrate-incoming", args, NULL, 10000, err, errlen)) < 0)
		goto out;
	t_loading = now_ms();
	/* loaded when the VM is paused (the snapshot was saved stopped) */
	deadline = now_ms() + 30000;
	for (;;) {
		const char *status;
		if ((r = qmp_call(&qm, "query-status", NULL, &st, 10000, err, errlen)) < 0)
			goto out;
		status = json_string_value(json_object_get(st, "status"));
		if (status && !strcmp(status, "paused"))
			break;
		if (status && strcmp(status, "inmigrate")) {
			errmsg_set(err, errlen, "restoring %s: the VM is %s", state, status);
			r = -EIO;
			goto out;
		}
		json_decref(st);
		st = NULL;
		if (now_ms() > deadline) {
			errmsg_set(err, errlen, "restoring %s took over 30 s", state);
			r = -ETIMEDOUT;
			goto out;
		}
		usleep(2000);
	}
	/* the start line waits in the socket until the guest reads it */
	if ((r = send_start(sb, vm, kind, err, errlen)) < 0 ||
	    (r = qmp_call(&qm, "cont", NULL, NULL, 10000, err, errlen)) < 0)
		goto out;
	sb->impl = vm;
	t_cont = now_ms();
	r = vm_wait_ready(sb, vm, l->log_path, l, VM_READY_LINE, err, errlen);
	if (r == 0)
		dprintf(
		    l->log_fd,
		    "airlock: restored %s: qemu up in %lld ms, state loaded in %lld ms, agent ready %lld ms later\n",
		    state, (long long)(t_loading - l->launched), (long long)(t_cont - t_loading),
		    (long long)(now_ms() - t_cont));
	if (r == VM_TRY_TCG)
		r = -EIO;
out:
	json_decref(st);
	json_decref(args);
	qmp_close(&qm);
	if (m->ram_own) /* qemu has it open (or failed): nothing of it outlives the VM */
		unlink(m->ram);
	if (r == 0) /* kept while the VM runs: a fork freezes it through it */
		snprintf(vm->qmp, sizeof(vm->qmp), "%s", f->qmp);
	else
		unlink(f->qmp);
	if (r < 0) {
		sb->impl = NULL;
		if (vm->ctl_fd >= 0)
			close(vm->ctl_fd);
		vm->ctl_fd = -1;
		qemu_kill(sb);
	}
	return r;
}

/* The media of a restore onto this start's files (the memory's are the
 * caller's to set). */
static struct vm_media restore_media(const struct vm *vm, const struct vm_files *f)
{
	return (struct vm_media){.cfg = f->cfgtar,
				 .ws = f->ws,
				 .ws_fmt = f->ws_fmt,
				 .console = vm->console,
				 .sock = f->sock,
				 .ctl = vm->ctl,
				 .qmp = f->qmp,
				 .incoming = true};
}

/* Restore sn on the shared memory file ram (0600, ours, sized), filled
 * from fill as qemu starts, or already whole (fill NULL): only with room
 * on its tmpfs for all of the guest's memory. */
static int restore_shared(struct sandbox *sb, struct vm *vm, struct vm_media *m, const struct vm_snap *sn,
			  const char *ram, const struct ram_fill *fill, const char *how, const struct vm_template *t,
			  struct qemu_cmd *q, const struct vm_files *f, struct vm_launch *l, const char *kind,
			  char *err, size_t errlen)
{
	if (!ram_room(ram, (off_t)sn->mem_mb << 20)) {
		unlink(ram);
		errmsg_set(err, errlen, "no room on tmpfs for %u MiB of shared memory", sn->mem_mb);
		return -ENOSPC;
	}
	m->ram = ram;
	m->ram_shared = true;
	m->ram_own = true;
	dprintf(l->log_fd, "airlock: memory: shared, %s\n", how);
	return vm_restore(sb, vm, m, sn->state, true, fill, t, q, f, l, kind, err, errlen);
}

/* Restore sn with this sandbox's disks attached: on its own shared memory
 * when it can have one (the spare copy the last stop made, else a copy of
 * the snapshot's made as qemu starts; its stop makes the next spare); else,
 * or when that restore fails, on the snapshot's file copy on write. */
static int snap_restore(struct sandbox *sb, struct vm *vm, const struct vm_snap *sn, const struct vm_template *t,
			struct qemu_cmd *q, const struct vm_files *f, struct vm_launch *l, const char *kind, char *err,
			size_t errlen)
{
	struct vm_media m = restore_media(vm, f);
	struct ram_fill fill = {.src = -1, .dst = -1};
	char ram[PATH_MAX], spare[PATH_MAX];
	int r = -ENOENT;

	m.append = sn->append;
	m.mem_mb = sn->mem_mb;
	if (ram_path(sb->dir, ram, sizeof(ram), true) == 0) {
		if (spare_path(sn->ram, sn->key, spare, sizeof(spare)) == 0 && rename(spare, ram) == 0)
			r = restore_shared(sb, vm, &m, sn, ram, NULL,
					   "the spare copy of the snapshot's made at the last stop", t, q, f, l, kind,
					   err, errlen);
		else if ((fill.src = open(sn->ram, O_RDONLY | O_CLOEXEC)) >= 0 &&
			 (fill.dst = ram_create(ram, (off_t)sn->mem_mb << 20)) >= 0)
			r = restore_shared(sb, vm, &m, sn, ram, &fill,
					   "a copy of the snapshot's on tmpfs (a fork copies it)", t, q, f, l, kind,
					   err, errlen);
		if (fill.src >= 0)
			close(fill.src);
		if (fill.dst >= 0)
			close(fill.dst);
		if (r == 0) {
			if (spare_path(sn->ram, sn->key, vm->spare, sizeof(vm->spare)) < 0)
				vm->spare[0] = 0;
			snprintf(vm->spare_src, sizeof(vm->spare_src), "%s", sn->ram);
			return 0;
		}
		if (m.ram_own || r == -ENOSPC)
			dprintf(l->log_fd, "airlock: not on shared memory: %s; on the snapshot's file\n", err);
	}
	m.ram = sn->ram;
	m.ram_shared = false;
	m.ram_own = false;
	dprintf(l->log_fd, "airlock: memory: the snapshot's file, copy on write (a fork migrates it)\n");
	return vm_restore(sb, vm, &m, sn->state, true, NULL, t, q, f, l, kind, err, errlen);
}

/* Snapshots are used unless AIRLOCK_VM_SNAPSHOT=0, and where the template
 * directory can hold them. */
static bool snap_dir(const struct vm_template *t, struct vm_snap *sn)
{
	const char *e = getenv("AIRLOCK_VM_SNAPSHOT");

	if (e && !strcmp(e, "0"))
		return false;
	if (path_join(sn->dir, sizeof(sn->dir), t->dir, "snapshots") < 0)
		return false;
	if (mkdir(sn->dir, 0700) < 0 && errno != EEXIST)
		return false;
	return private_file(sn->dir, S_IFDIR);
}

/* ------------------------------------------------------------------ start */

/* Start from the template's snapshot: restore it, or (none yet) boot the
 * template to its snapshot point, save it, restore it. 0 with sb->boot
 * set; -errno when the caller should boot without a snapshot (the reason
 * in the log). */
static int start_from_snapshot(struct sandbox *sb, struct vm *vm, const struct vm_template *t, struct qemu_cmd *q,
			       const struct vm_files *f, struct vm_launch *l, struct vm_snap *sn, const char **note)
{
	char err[1024] = "";
	int r;

	*note = ", no snapshot (see qemu.log)";
	if ((r = snap_key(sn, t, q, l->kvm, f->img)) < 0) {
		dprintf(l->log_fd, "airlock: no snapshot: its key: %s\n", strerror(-r));
		return r;
	}
	if (snap_valid(sn)) {
		if ((r = snap_restore(sb, vm, sn, t, q, f, l, "restored", err, sizeof(err))) == 0) {
			sb->boot = "restored";
			*note = ", restored from a snapshot";
			return 0;
		}
		dprintf(l->log_fd, "airlock: the snapshot %s did not restore (%s); removed, booting\n", sn->path, err);
		snap_remove(sn->path);
	}
	if ((r = snap_make(sb, sn, t, q, f, l, err, sizeof(err))) < 0) {
		dprintf(l->log_fd, "airlock: no snapshot saved: %s\n",
			r == -EBUSY ? "another start is saving it" : err);
		return r;
	}
	if ((r = snap_restore(sb, vm, sn, t, q, f, l, "cold", err, sizeof(err))) < 0) {
		dprintf(l->log_fd, "airlock: the new snapshot %s did not restore (%s); removed, booting\n", sn->path,
			err);
		snap_remove(sn->path);
		return r;
	}
	sb->boot = "cold";
	*note = ", snapshot saved";
	return 0;
}

/* ------------------------------------------------------------------ forks */

/* doc/VM.md, "Forks". The parent's workspace chain in its directory:
 *   workspace.img     the base (raw), frozen once a fork was made
 *   ws.N.qcow2        overlays a freeze put on top (the parent writes the top)
 *   ws-top            the name of the top one (absent: workspace.img)
 * and a fork's directory: ws.qcow2 (its overlay over the image that was
 * the parent's top when it froze) and mem (the parent's memory and device
 * state then, a migration stream). */
#define WS_TOP "ws-top"

/* The name in <dir>/ws-top ("" when none): ws.N.qcow2 and nothing else. */
static int ws_top_name(const char *dir, char *name, size_t n)
{
	char p[PATH_MAX];
	FILE *f;

	name[0] = 0;
	if (path_join(p, sizeof(p), dir, WS_TOP) < 0)
		return -ENAMETOOLONG;
	if (!(f = fopen(p, "re")))
		return errno == ENOENT ? 0 : -errno;
	if (!fgets(name, (int)n, f))
		name[0] = 0;
	fclose(f);
	name[strcspn(name, "\n")] = 0;
	if (!name[0] || strncmp(name, "ws.", 3) || strchr(name, '/') || strlen(name) < 10 ||
	    strcmp(name + strlen(name) - 6, ".qcow2"))
		return -EINVAL;
	return 0;
}

/* Whether <dir>/forks holds a fork. */
static bool forks_exist(const char *dir)
{
	char p[PATH_MAX];
	struct dirent *e;
	bool any = false;
	DIR *d;

	if (path_join(p, sizeof(p), dir, "forks") < 0 || !(d = opendir(p)))
		return false;
	while (!any && (e = readdir(d)))
		any = e->d_name[0] != '.';
	closedir(d);
	return any;
}

/* Remove the overlays ws.N.qcow2 and ws-top of dir. */
static void ws_overlays_remove(const char *dir)
{
	char p[PATH_MAX];
	struct dirent *e;
	DIR *d = opendir(dir);

	while (d && (e = readdir(d)))
		if (!strncmp(e->d_name, "ws.", 3) && strstr(e->d_name, ".qcow2") &&
		    path_join(p, sizeof(p), dir, e->d_name) == 0)
			unlink(p);
	if (d)
		closedir(d);
	if (path_join(p, sizeof(p), dir, WS_TOP) == 0)
		unlink(p);
}

/* f->ws: what this start writes. A fork: its overlay. The parent after
 * forks: with no fork left, its overlays are committed into workspace.img
 * first (qemu-img commit) and removed; else the top overlay. */
static int ws_prepare(struct sandbox *sb, struct vm_files *f, bool fork, int log_fd, char *err, size_t errlen)
{
	char name[64], top[PATH_MAX], qimg[PATH_MAX];
	int r;

	f->ws_fmt = NULL;
	if (fork) {
		f->ws_fmt = "qcow2";
		return path_join(f->ws, sizeof(f->ws), sb->dir, "ws.qcow2") < 0 ? -ENAMETOOLONG : 0;
	}
	snprintf(f->ws, sizeof(f->ws), "%s", f->img);
	if ((r = ws_top_name(sb->dir, name, sizeof(name))) < 0) {
		errmsg_set(err, errlen, "%s/%s: %s", sb->dir, WS_TOP,
			   r == -EINVAL ? "not an overlay's name" : strerror(-r));
		return r;
	}
	if (!name[0])
		return 0;
	if (path_join(top, sizeof(top), sb->dir, name) < 0)
		return -ENAMETOOLONG;
	if (forks_exist(sb->dir)) {
		snprintf(f->ws, sizeof(f->ws), "%s", top);
		f->ws_fmt = "qcow2";
		return 0;
	}
	if (find_prog("qemu-img", qimg, sizeof(qimg)) < 0) {
		errmsg_set(err, errlen, "qemu-img not found: needed to merge %s into %s", top, f->img);
		return -ENOENT;
	}
	char *argv[] = {qimg, "commit", "-q", "-f", "qcow2", "-b", f->img, top, NULL};
	if (run_wait(argv, log_fd) < 0) {
		errmsg_set(err, errlen, "qemu-img commit %s into %s failed (see %s/qemu.log)", top, f->img, sb->dir);
		return -EIO;
	}
	ws_overlays_remove(sb->dir);
	return 0;
}

/* Under this, a fork's mem is the device state alone (66 KiB here): a
 * migration of all of a guest's memory is tens of MiB at the least. */
#define FORK_MEM_MIN (4 << 20)

/* A fork's restore: its own overlay and config drive, the frozen memory. */
static int fork_restore(struct sandbox *sb, struct vm *vm, const struct vm_template *t, struct qemu_cmd *q,
			const struct vm_files *f, struct vm_launch *l, unsigned mem_mb, char *err, size_t errlen)
{
	char mem[PATH_MAX], append[512], ram[PATH_MAX];
	struct stat st;
	struct vm_media m = restore_media(vm, f);

	m.ram_anon = true;
	m.append = append;
	m.mem_mb = mem_mb;
	if (path_join(mem, sizeof(mem), sb->dir, "mem") < 0)
		return -ENAMETOOLONG;
	if (stat(mem, &st) < 0 || stat(f->ws, &st) < 0) {
		errmsg_set(err, errlen, "%s: not a frozen fork of a VM (no mem or ws.qcow2)", sb->dir);
		return -ENOENT;
	}
	kernel_append(append, sizeof(append), t->dir, l->kvm);
	/* the parent's memory copied to a file of the fork's own by the
	 * freeze, and mem only the device state; else mem is all of it */
	if (ram_path(sb->dir, ram, sizeof(ram), false) == 0 && access(ram, F_OK) == 0) {
		m.ram_anon = false;
		m.ram = ram;
		m.ram_shared = true;
		m.ram_own = true;
	} else if (stat(mem, &st) == 0 && st.st_size < FORK_MEM_MIN) {
		/* the device state alone, its memory file gone (it is unlinked
		 * by the fork's first start, taken or failed) */
		errmsg_set(err, errlen,
			   "%s: the fork's memory is gone (a vm fork starts once: remove it and fork again)", sb->dir);
		return -ENOENT;
	}
	dprintf(l->log_fd, "airlock: memory: %s\n",
		m.ram_own ? "shared, the parent's copied at the freeze" : "migrated, loaded from the stream");
	return vm_restore(sb, vm, &m, mem, m.ram_own, NULL, t, q, f, l, "fork", err, errlen);
}

/* When each step of a freeze ended (doc/VM.md "Forks": fork_dir/freeze.log). */
struct freeze_times {
	int64_t t0, planned, stopped, disk, copied, memory, cont;
	bool shared;
};

/* The parent's memory into the fork's directory, while it is stopped: with
 * shared memory (its file open in its qemu), the device state alone into
 * mem (x-ignore-shared) and the file copied to the fork's own, both at
 * once; else all of it migrated into mem. */
static int freeze_memory(struct qmp *qm, const char *parent, const char *fork_dir, const char *mem,
			 struct freeze_times *ft, char *err, size_t errlen)
{
	char quoted[2 * PATH_MAX], uri[2 * PATH_MAX + 48], pram[PATH_MAX], fram[PATH_MAX];
	json_t *caps = NULL, *params = NULL, *args = NULL;
	pid_t pid = qemu_pid_of(parent);
	int src = -ENOENT, dst = -1, r, rc;
	struct stat st;

	if (sh_quote(quoted, sizeof(quoted), mem) < 0)
		return -ENAMETOOLONG;
	if (pid > 0 && ram_path(parent, pram, sizeof(pram), false) == 0 &&
	    ram_path(fork_dir, fram, sizeof(fram), false) == 0)
		src = ram_of_qemu(pid, pram);
	if (src >= 0 && (fstat(src, &st) < 0 || (dst = ram_create(fram, st.st_size)) < 0)) {
		r = dst < 0 ? dst : -errno;
		errmsg_set(err, errlen, "%s: %s", fram, strerror(-r));
		close(src);
		return r;
	}
	if (dst >= 0 && !ram_room(fram, st.st_size)) { /* no room for the fork's: all of it migrated */
		close(dst);
		unlink(fram);
		close(src);
		dst = -1;
		src = -ENOSPC;
	}
	snprintf(uri, sizeof(uri), "exec:umask 077 && cat > %s", quoted);
	caps = json_pack("{s:[{s:s, s:b}]}", "capabilities", "capability", "x-ignore-shared", "state", src >= 0);
	params = json_pack("{s:I}", "max-bandwidth", (json_int_t)MIGRATE_BANDWIDTH);
	args = json_pack("{s:s}", "uri", uri);
	if (!caps || !params || !args)
		r = -ENOMEM;
	else if ((r = qmp_call(qm, "migrate-set-capabilities", caps, NULL, 10000, err, errlen)) == 0 &&
		 (r = qmp_call(qm, "migrate-set-parameters", params, NULL, 10000, err, errlen)) == 0 &&
		 (r = qmp_call(qm, "migrate", args, NULL, 10000, err, errlen)) == 0) {
		/* qemu writes the device state in its migration thread */
		ft->shared = src >= 0;
		if (src >= 0 && (rc = ram_copy(src, dst)) < 0) {
			errmsg_set(err, errlen, "copying the parent's memory to %s: %s", fram, strerror(-rc));
			r = rc;
		}
		ft->copied = now_ms();
		rc = migrate_wait(qm, "freezing the parent's memory", r < 0 ? NULL : err, r < 0 ? 0 : errlen);
		if (r == 0)
			r = rc;
	}
	json_decref(caps);
	json_decref(params);
	json_decref(args);
	if (src >= 0)
		close(src);
	if (dst >= 0) {
		close(dst);
		if (r < 0)
			unlink(fram);
	}
	return r;
}

/* The files of one freeze (doc/VM.md "Forks"). */
struct freeze_plan {
	char top[PATH_MAX];	/* the image the parent writes now: frozen by the freeze */
	char next[PATH_MAX];	/* the overlay it writes from the freeze on */
	char nname[64];		/* next's name, for ws-top */
	char topf[PATH_MAX];	/* <parent>/ws-top */
	char overlay[PATH_MAX]; /* the fork's overlay over top */
	char mem[PATH_MAX];	/* the fork's memory: the device state, or all of it */
};

/* Before the parent stops: the names, and the fork's overlay over the
 * image the freeze will freeze (-u: nothing opens the image qemu holds). */
static int freeze_plan(const char *parent, const char *fork_dir, struct freeze_plan *fp, char *err, size_t errlen)
{
	char name[64], base[PATH_MAX], size[32], qimg[PATH_MAX];
	struct stat st;
	int r;

	if ((r = ws_top_name(parent, name, sizeof(name))) < 0)
		return r;
	if (path_join(fp->top, sizeof(fp->top), parent, name[0] ? name : "workspace.img") < 0 ||
	    path_join(fp->topf, sizeof(fp->topf), parent, WS_TOP) < 0 ||
	    path_join(fp->overlay, sizeof(fp->overlay), fork_dir, "ws.qcow2") < 0 ||
	    path_join(fp->mem, sizeof(fp->mem), fork_dir, "mem") < 0 ||
	    path_join(base, sizeof(base), parent, "workspace.img") < 0)
		return -ENAMETOOLONG;
	for (unsigned i = 1;; i++) {
		snprintf(fp->nname, sizeof(fp->nname), "ws.%u.qcow2", i);
		if (path_join(fp->next, sizeof(fp->next), parent, fp->nname) < 0)
			return -ENAMETOOLONG;
		if (access(fp->next, F_OK) < 0)
			break;
	}
	if (find_prog("qemu-img", qimg, sizeof(qimg)) < 0) {
		errmsg_set(err, errlen, "qemu-img not found (apt-get install qemu-utils)");
		return -ENOENT;
	}
	if (stat(base, &st) < 0)
		return -errno;
	snprintf(size, sizeof(size), "%lld", (long long)st.st_size);
	char *argv[] = {qimg, "create", "-q", "-f",	   "qcow2", "-F", name[0] ? "qcow2" : "raw",
			"-b", fp->top,	"-u", fp->overlay, size,    NULL};
	if (run_wait(argv, -1) < 0) {
		errmsg_set(err, errlen, "qemu-img create %s over %s failed", fp->overlay, fp->top);
		return -EIO;
	}
	return 0;
}

/* The parent's disk and memory frozen for the fork in fork_dir, through
 * the parent's monitor, while it is stopped: its disk onto the planned
 * overlay (the fork's is over the image below it), its memory. */
static int freeze_steps(struct qmp *qm, const char *parent, const char *fork_dir, const struct freeze_plan *fp,
			struct freeze_times *ft, char *err, size_t errlen)
{
	char tmp[PATH_MAX + 8];
	json_t *args;
	FILE *f;
	int r;

	if (!(args = json_pack("{s:s, s:s, s:s}", "device", "ws", "snapshot-file", fp->next, "format", "qcow2")))
		return -ENOMEM;
	r = qmp_call(qm, "blockdev-snapshot-sync", args, NULL, 10000, err, errlen);
	json_decref(args);
	if (r < 0)
		return r;
	/* the parent writes next from now on, its next start too */
	snprintf(tmp, sizeof(tmp), "%s.tmp", fp->topf);
	if (!(f = fopen(tmp, "we")) || fprintf(f, "%s\n", fp->nname) < 0 || fclose(f) != 0 ||
	    rename(tmp, fp->topf) < 0) {
		errmsg_set(err, errlen, "%s: %s", fp->topf, strerror(errno));
		return -EIO;
	}
	ft->disk = now_ms();
	r = freeze_memory(qm, parent, fork_dir, fp->mem, ft, err, errlen);
	ft->memory = now_ms();
	return r;
}

/* fork_dir/freeze.log: where the parent's pause went. */
static void freeze_log(const char *fork_dir, const struct freeze_times *ft)
{
	char p[PATH_MAX];
	FILE *f;

	if (path_join(p, sizeof(p), fork_dir, "freeze.log") < 0 || !(f = fopen(p, "we")))
		return;
	fprintf(f,
		"airlock: froze the parent: monitor and the fork's overlay %lld ms, then paused %lld ms: disk %lld ms, "
		"memory %lld ms (%s%lld ms), cont %lld ms\n",
		(long long)(ft->planned - ft->t0), (long long)(ft->cont - ft->stopped),
		(long long)(ft->disk - ft->stopped), (long long)(ft->memory - ft->disk),
		ft->shared ? "shared: its copy " : "migrated: the device state after ",
		(long long)(ft->copied - ft->disk), (long long)(ft->cont - ft->memory));
	fclose(f);
}

int sandbox_vm_fork_freeze(const char *parent, const char *fork_dir, char *err, size_t errlen)
{
	char qmp_path[PATH_MAX], e2[256];
	struct qmp qm = {.fd = -1};
	struct freeze_times ft = {.t0 = now_ms()};
	struct freeze_plan plan;
	int r;

	if (path_join(qmp_path, sizeof(qmp_path), parent, "run/qmp.sock") < 0)
		return -ENAMETOOLONG;
	if (access(qmp_path, F_OK) < 0 || (r = qmp_open(&qm, qmp_path, 5000, err, errlen)) < 0) {
		errmsg_set(err, errlen,
			   "the parent VM (%s) has no monitor: only a VM restored from a snapshot can be forked "
			   "(is it running? AIRLOCK_VM_SNAPSHOT=0?)",
			   parent);
		return -ENOTSUP;
	}
	if ((r = freeze_plan(parent, fork_dir, &plan, err, errlen)) < 0) {
		qmp_close(&qm);
		return r;
	}
	ft.planned = now_ms();
	if ((r = qmp_call(&qm, "stop", NULL, NULL, 10000, err, errlen)) == 0) {
		ft.stopped = now_ms();
		r = freeze_steps(&qm, parent, fork_dir, &plan, &ft, err, errlen);
		if (qmp_call(&qm, "cont", NULL, NULL, 10000, e2, sizeof(e2)) < 0 && r == 0) {
			errmsg_set(err, errlen, "the parent VM did not continue: %s", e2);
			r = -EIO;
		}
		ft.cont = now_ms();
		if (r == 0)
			freeze_log(fork_dir, &ft);
	}
	qmp_close(&qm);
	return r;
}

int sandbox_vm_forks_freeze(const char *dir, unsigned *gen, char *err, size_t errlen)
{
	char qmp_path[PATH_MAX];

	*gen = 0;
	if (path_join(qmp_path, sizeof(qmp_path), dir, "run/qmp.sock") < 0)
		return -ENAMETOOLONG;
	if (access(qmp_path, F_OK) < 0) {
		errmsg_set(err, errlen,
			   "the parent VM (%s) has no monitor: only a running VM restored from a snapshot can be "
			   "forked (AIRLOCK_VM_SNAPSHOT=0, or no snapshot of the template?)",
			   dir);
		return -ENOTSUP;
	}
	return 0;
}

int sandbox_vm_forks_make(const char *dir, const char *name, unsigned gen, int64_t ttl_s, char *err, size_t errlen)
{
	char fdir[PATH_MAX], e2[256];
	int r;

	if ((r = sandbox_fork_make(dir, name, gen, ttl_s, err, errlen)) < 0)
		return r;
	err[0] = '\0';
	if ((size_t)snprintf(fdir, sizeof(fdir), "%s/forks/%s", dir, name) >= sizeof(fdir))
		r = -ENAMETOOLONG;
	else
		r = sandbox_vm_fork_freeze(dir, fdir, err, errlen);
	if (r < 0) {
		if (!err[0])
			errmsg_set(err, errlen, "freezing the parent VM for fork '%s': %s", name, strerror(-r));
		(void)sandbox_vm_fork_remove(dir, name, e2, sizeof(e2));
	}
	return r;
}

int sandbox_vm_fork_remove(const char *dir, const char *name, char *err, size_t errlen)
{
	char fdir[PATH_MAX], ram[PATH_MAX];

	/* a fork that never started still has its memory file on tmpfs */
	if (sandbox_fork_name_ok(name) &&
	    (size_t)snprintf(fdir, sizeof(fdir), "%s/forks/%s", dir, name) < sizeof(fdir) &&
	    ram_path(fdir, ram, sizeof(ram), false) == 0)
		unlink(ram);
	return sandbox_fork_remove(dir, name, err, errlen);
}

int sandbox_vm_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	struct vm_template t;
	struct vm_files f;
	struct qemu_cmd q;
	struct vm_launch l = {.log_fd = -1};
	struct vm_snap sn = {0};
	struct vm *vm = NULL;
	char append[512];
	const char *note = ", no snapshot";
	bool snap;
	int r;

	if ((r = template_find(sb, cfg, &t, err, errlen)) < 0 ||
	    (r = qemu_find(q.prog, sizeof(q.prog), err, errlen)) < 0 || (r = vm_mem_mb(&sn.mem_mb, err, errlen)) < 0)
		return r;
	if (strchr(sb->dir, ',')) {
		/* qemu's -drive and -chardev options are comma separated */
		errmsg_set(err, errlen, "%s: a ',' in the sandbox directory cannot be passed to qemu", sb->dir);
		return -EINVAL;
	}
	if (!(vm = mem_calloc(1, sizeof(*vm)))) {
		errmsg_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	vm->ctl_fd = -1;
	if ((r = vm_files_init(sb, vm, &f, err, errlen)) < 0 ||
	    (r = vm_state_prepare(sb, vm, &f, &l.log_fd, err, errlen)) < 0 ||
	    (!cfg->fork && (r = ensure_disk(sb, l.log_fd, f.img, sizeof(f.img), err, errlen)) < 0) ||
	    (r = ws_prepare(sb, &f, cfg->fork != NULL, l.log_fd, err, errlen)) < 0 ||
	    (r = write_config(sb, cfg, err, errlen)) < 0)
		goto fail;
	snprintf(l.log_path, sizeof(l.log_path), "%s", f.log);
	snap = snap_dir(&t, &sn) && !strchr(t.dir, ',');
	q.microvm = machine_microvm(q.prog, snap ? sn.dir : NULL);
	q.machine = q.microvm ? "microvm" : "q35";
	l.kvm = kvm_works();
	if (cfg->fork) {
		if ((r = fork_restore(sb, vm, &t, &q, &f, &l, sn.mem_mb, err, errlen)) < 0)
			goto fail;
		sb->boot = "fork";
		note = ", a fork restored from its parent's frozen memory and disk";
	} else if (!snap || start_from_snapshot(sb, vm, &t, &q, &f, &l, &sn, &note) < 0) {
		struct vm_media m = {.cfg = f.cfgtar,
				     .ws = f.ws,
				     .ws_fmt = f.ws_fmt,
				     .console = vm->console,
				     .sock = f.sock,
				     .ctl = vm->ctl,
				     .append = append,
				     .mem_mb = sn.mem_mb};
		kernel_append(append, sizeof(append), t.dir, l.kvm);
		l.deadline = 0;
		if ((r = vm_boot(sb, vm, &q, &t, &m, &l, VM_READY_LINE, "cold", err, errlen)) < 0)
			goto fail;
		sb->boot = "cold";
	}
	close(l.log_fd);
	l.log_fd = -1;
	snprintf(sb->addr, sizeof(sb->addr), "unix:%s", f.sock);
	if ((size_t)snprintf(sb->describe, sizeof(sb->describe),
			     "vm: qemu -M %s, %s%s, no network device (the channel is the only way out)%s", q.machine,
			     l.kvm ? "kvm" : "software emulation (TCG)",
			     l.kvm_failed ? " (KVM could not run the guest)" : "", note) >= sizeof(sb->describe))
		sb->describe[sizeof(sb->describe) - 1] = 0;
	return 0;

fail:
	if (l.log_fd >= 0)
		close(l.log_fd);
	if (sb->impl == vm)
		sandbox_vm_stop(sb); /* stops qemu, frees vm */
	else {
		if (vm->ctl_fd >= 0)
			close(vm->ctl_fd);
		mem_free(vm);
	}
	sb->impl = NULL;
	return r;
}

/* ----------------------------------------------------------------- stop */

/* Ask the guest's init to power off (it stops the agent, syncs and
 * unmounts the workspace disk first). Returns the connected control
 * socket, to be kept open until qemu exits: the init reads the line only
 * while the host end is connected. -1 when it could not be asked. */
static int vm_ask_poweroff(const struct vm *vm)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (fd < 0)
		return -1;
	if ((size_t)snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", vm->ctl) >= sizeof(sa.sun_path)) {
		close(fd); /* checked at start; cannot happen */
		return -1;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0 || write(fd, "poweroff\n", 9) != 9) {
		close(fd);
		return -1;
	}
	return fd;
}

/* Wait up to ms for qemu to exit (and reap it). */
static bool vm_wait(pid_t pid, unsigned ms)
{
	int64_t deadline = now_ms() + ms;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid || (r < 0 && errno == ECHILD))
			return true;
		if (now_ms() > deadline)
			return false;
		usleep(20000);
	}
}

void sandbox_vm_stop(struct sandbox *sb)
{
	struct vm *vm;

	if (!sb)
		return;
	vm = sb->impl;
	if (sb->pid > 0) {
		int ctl = -1;
		bool done;

		if (vm && vm->ctl_fd >= 0 && send(vm->ctl_fd, "poweroff\n", 9, MSG_NOSIGNAL) == 9) {
			ctl = vm->ctl_fd;
			vm->ctl_fd = -1;
		} else if (vm) {
			ctl = vm_ask_poweroff(vm);
		}
		done = vm_wait(sb->pid, SANDBOX_STOP_MS);
		if (ctl >= 0)
			close(ctl);
		if (!done) {
			kill(sb->pid, SIGTERM);
			if (!vm_wait(sb->pid, 1000)) {
				kill(sb->pid, SIGKILL);
				vm_wait(sb->pid, 5000);
			}
		}
		sb->pid = 0;
	}
	if (vm) {
		if (vm->ctl_fd >= 0)
			close(vm->ctl_fd);
		unlink(vm->pidfile);
		if (vm->qmp[0])
			unlink(vm->qmp);
		if (vm->spare[0])
			spare_make(vm->spare_src, vm->spare);
		mem_free(vm);
	}
	sb->impl = NULL;
}
