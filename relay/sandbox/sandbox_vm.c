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
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/kvm.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/errmsg.h"
#include "airlock/core/keys.h"
#include "airlock/core/mem.h"
#include "sandbox_i.h"

#define VM_DISK_SIZE_DEFAULT "8G"
#define VM_MEM_MB_DEFAULT    1024
#define VM_READY_LINE	     "ready serial:"
#define VM_FATAL_LINE	     "airlock-init: FATAL"
#define VM_KVM_GRACE_MS	     20000 /* a KVM guest that shows no init line by then is not running */

struct vm {
	char console[PATH_MAX];
	char ctl[PATH_MAX];
	char pidfile[PATH_MAX];
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
 * agent.conf. Padded to a whole number of 10 KiB records (a disk image
 * must be a multiple of 512 bytes; tar readers expect records). */
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
	pos = ftell(f);
	while (pos >= 0 && pos % 10240) {
		size_t pad = (size_t)(10240 - pos % 10240);
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

/* Scan the console for the agent's ready line (0), init's fatal line or
 * nothing yet (-EAGAIN). *fatal gets the fatal line. */
static int console_state(const char *console, char *fatal, size_t n)
{
	char line[512];
	int r = -EAGAIN;
	FILE *f = fopen(console, "re");

	if (!f)
		return -EAGAIN;
	while (fgets(line, sizeof(line), f)) {
		char *p = strstr(line, VM_FATAL_LINE);
		if (!strncmp(line, VM_READY_LINE, strlen(VM_READY_LINE))) {
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
	char img[PATH_MAX];    /* workspace.img: the workspace disk */
};

/* One qemu command line: argv and the strings it points into. */
struct qemu_cmd {
	char prog[PATH_MAX];
	const char *machine; /* "microvm" or "q35" */
	bool microvm;
	char append[512], mem[16];
	char o_con[PATH_MAX + 64], o_cfg[PATH_MAX + 96], o_ws[PATH_MAX + 96], o_ch[PATH_MAX + 96], o_ctl[PATH_MAX + 96];
	char *argv[ARGV_MAX];
};

/* Where the boot is, across the fallback from KVM to software emulation. */
struct vm_launch {
	bool kvm;	 /* this attempt runs under KVM */
	bool kvm_failed; /* an attempt under KVM could not run the guest */
	int log_fd;	 /* qemu.log, until qemu has it; -1 after */
	int64_t launched, deadline;
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
	if (path_join(f->run, sizeof(f->run), sb->dir, "run") < 0 ||
	    path_join(f->sock, sizeof(f->sock), f->run, "agent.sock") < 0 ||
	    path_join(vm->ctl, sizeof(vm->ctl), f->run, "ctl.sock") < 0 ||
	    path_join(vm->pidfile, sizeof(vm->pidfile), f->run, "qemu.pid") < 0 ||
	    path_join(vm->console, sizeof(vm->console), sb->dir, "console.log") < 0 ||
	    path_join(f->log, sizeof(f->log), sb->dir, "qemu.log") < 0 ||
	    path_join(f->cfgtar, sizeof(f->cfgtar), sb->dir, "config.tar") < 0 || strlen(vm->ctl) >= SUN_PATH_MAX) {
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

/* The machine, the kernel command line and the option strings of q. */
static void qemu_options(struct qemu_cmd *q, const struct vm_template *t, const struct vm_files *f, const struct vm *vm,
			 bool kvm)
{
	const char *m = getenv("AIRLOCK_VM_MACHINE");

	q->microvm = m && *m ? strcmp(m, "q35") != 0 : qemu_has_microvm(q->prog);
	q->machine = q->microvm ? "microvm" : "q35";
	kernel_append(q->append, sizeof(q->append), t->dir, kvm);
	snprintf(q->mem, sizeof(q->mem), "%d", VM_MEM_MB_DEFAULT);
	snprintf(q->o_con, sizeof(q->o_con), "file,id=con,path=%s", vm->console);
	snprintf(q->o_cfg, sizeof(q->o_cfg), "id=cfg,file=%s,format=raw,if=none,readonly=on", f->cfgtar);
	snprintf(q->o_ws, sizeof(q->o_ws), "id=ws,file=%s,format=raw,if=none,discard=unmap", f->img);
	snprintf(q->o_ch, sizeof(q->o_ch), "socket,id=ch,path=%s,server=on,wait=off", f->sock);
	snprintf(q->o_ctl, sizeof(q->o_ctl), "socket,id=ctl,path=%s,server=on,wait=off", vm->ctl);
}

/* The qemu command line (doc/VM.md, "Launching"). */
static void qemu_cmd_build(struct qemu_cmd *q, const struct vm_template *t, const struct vm_files *f,
			   const struct vm *vm, bool kvm)
{
	int argc = 0;

	qemu_options(q, t, f, vm, kvm);
#define ARG(x) (q->argv[argc++] = (char *)(x))
	ARG(q->prog);
	ARG("-M");
	ARG(q->machine);
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
	ARG(NULL);
#undef ARG
	_Static_assert(ARGV_MAX >= 48, "argv room");
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
static bool kvm_cannot_run(const struct vm *vm, const char *log, const struct vm_launch *l)
{
	return l->kvm && (file_has(log, "KVM internal error") ||
			  (now_ms() - l->launched > VM_KVM_GRACE_MS && !file_has(vm->console, "airlock-init:")));
}

/* Until the console shows the agent's ready line (0). VM_TRY_TCG when KVM
 * cannot run the guest (qemu killed and reaped, sb->pid 0); else -errno
 * and the message in err (sb->pid 0 when qemu exited by itself). */
static int vm_wait_ready(struct sandbox *sb, const struct vm *vm, const char *log, const struct vm_launch *l, char *err,
			 size_t errlen)
{
	char fatal[512] = "";
	int wst, r;

	for (;;) {
		if ((r = console_state(vm->console, fatal, sizeof(fatal))) == 0)
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
				   SANDBOX_VM_START_MS / 1000, vm->console);
			return -ETIMEDOUT;
		}
		usleep(20000);
	}
}

/* Boot qemu until the agent is ready, under KVM when it works here, and
 * once more under software emulation when KVM cannot run the guest. From
 * the first spawn on, sb->impl is vm (NULL again while none runs). */
static int vm_boot(struct sandbox *sb, struct vm *vm, struct qemu_cmd *q, const struct vm_template *t,
		   const struct vm_files *f, struct vm_launch *l, char *err, size_t errlen)
{
	int r;

	l->kvm = kvm_works();
	for (;;) {
		qemu_cmd_build(q, t, f, vm, l->kvm);
		unlink(vm->console);
		if ((r = qemu_spawn(q, l->log_fd, vm->pidfile, &sb->pid, err, errlen)) < 0) {
			sb->pid = 0;
			return r;
		}
		close(l->log_fd);
		l->log_fd = -1;
		sb->impl = vm;
		l->launched = now_ms();
		if (!l->deadline)
			l->deadline = l->launched + SANDBOX_VM_START_MS;
		if ((r = vm_wait_ready(sb, vm, f->log, l, err, errlen)) != VM_TRY_TCG)
			return r;
		sb->impl = NULL;
		l->kvm = false;
		l->kvm_failed = true;
		if ((l->log_fd = open(f->log, O_WRONLY | O_APPEND | O_CLOEXEC)) < 0) {
			r = -errno;
			errmsg_set(err, errlen, "%s: %s", f->log, strerror(errno));
			return r;
		}
		dprintf(l->log_fd, "airlock: KVM cannot run this guest here; software emulation (TCG) instead\n");
	}
}

int sandbox_vm_start(struct sandbox *sb, const struct sandbox_cfg *cfg, char *err, size_t errlen)
{
	struct vm_template t;
	struct vm_files f;
	struct qemu_cmd q;
	struct vm_launch l = {.log_fd = -1};
	struct vm *vm = NULL;
	int r;

	if ((r = template_find(sb, cfg, &t, err, errlen)) < 0 ||
	    (r = qemu_find(q.prog, sizeof(q.prog), err, errlen)) < 0)
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
	if ((r = vm_files_init(sb, vm, &f, err, errlen)) < 0 ||
	    (r = vm_state_prepare(sb, vm, &f, &l.log_fd, err, errlen)) < 0 ||
	    (r = ensure_disk(sb, l.log_fd, f.img, sizeof(f.img), err, errlen)) < 0 ||
	    (r = write_config(sb, cfg, err, errlen)) < 0 || (r = vm_boot(sb, vm, &q, &t, &f, &l, err, errlen)) < 0)
		goto fail;
	snprintf(sb->addr, sizeof(sb->addr), "unix:%s", f.sock);
	if ((size_t)snprintf(sb->describe, sizeof(sb->describe),
			     "vm: qemu -M %s, %s%s, no network device (the channel is the only way out)", q.machine,
			     l.kvm ? "kvm" : "software emulation (TCG)",
			     l.kvm_failed ? " (KVM could not run the guest)" : "") >= sizeof(sb->describe))
		sb->describe[sizeof(sb->describe) - 1] = 0;
	return 0;

fail:
	if (l.log_fd >= 0)
		close(l.log_fd);
	if (sb->impl == vm)
		sandbox_vm_stop(sb); /* stops qemu, frees vm */
	else
		mem_free(vm);
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
		int ctl = vm ? vm_ask_poweroff(vm) : -1;
		bool done = vm_wait(sb->pid, SANDBOX_STOP_MS);

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
		unlink(vm->pidfile);
		mem_free(vm);
	}
	sb->impl = NULL;
}
