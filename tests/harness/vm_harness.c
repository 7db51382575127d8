/* SPDX-License-Identifier: Apache-2.0 */
/*
 * vm_harness: start the vm sandbox backend directly (relay/sandbox/sandbox_vm.c),
 * without the common sandbox code, for tests and benchmarks.
 *
 *   vm_harness DIR TEMPLATE_DIR [-v]
 *
 * DIR is the sandbox state directory (created 0700); its keys are made on
 * first use (DIR/keys/host.key, DIR/keys/guest.key) and reused after. On
 * success it prints, one per line, and flushes:
 *   addr unix:DIR/run/agent.sock
 *   host-key DIR/keys/host.key
 *   guest-pub BASE64
 *   describe vm: ...
 *   start_ms N
 *   ready
 * then waits until stdin ends (or SIGTERM/SIGINT), stops the VM and prints
 * "stopped N ms". Exit status 0, or 1 with the start error on stderr.
 */
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "../../relay/sandbox/sandbox_i.h" /* white-box: the backend alone */
#include "airlock/core/keys.h"

static double now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (double)ts.tv_sec * 1e3 + (double)ts.tv_nsec / 1e6;
}

/* Load path into kp, generating and saving a key when there is none. */
static int key_get(const char *path, struct noise_keypair *kp)
{
	char err[512];

	if (access(path, F_OK) == 0) {
		if (keys_load(path, kp, err, sizeof(err)) < 0) {
			fprintf(stderr, "vm_harness: %s\n", err);
			return -1;
		}
		return 0;
	}
	if (keys_generate(kp) < 0 || keys_save(path, kp, err, sizeof(err)) < 0) {
		fprintf(stderr, "vm_harness: %s: %s\n", path, err);
		return -1;
	}
	return 0;
}

static volatile sig_atomic_t stop_now;
static void on_sig(int sig)
{
	(void)sig;
	stop_now = 1;
}

int main(int argc, char **argv)
{
	static struct sandbox sb;
	struct sandbox_cfg cfg = {.kind = SANDBOX_VM};
	struct noise_keypair guest;
	char keys[PATH_MAX], hostkey[PATH_MAX], b64[KEYS_B64_LEN], err[1024] = "", c;
	struct sigaction sa = {.sa_handler = on_sig};
	double t0, t1;

	const char *parent = NULL;
	bool fork_again = false;

	/* --fork PARENT_DIR: DIR is a fork of the running VM of PARENT_DIR
	 * (sandbox_vm_fork_freeze, then its own start with its own keys);
	 * --fork-again: start the fork in DIR once more, with no freeze */
	if (argc >= 5 && !strcmp(argv[argc - 2], "--fork")) {
		parent = argv[argc - 1];
		argc -= 2;
	} else if (argc >= 4 && !strcmp(argv[argc - 1], "--fork-again")) {
		fork_again = true;
		argc -= 1;
	}
	if (argc < 3 || argc > 4 || (argc == 4 && strcmp(argv[3], "-v"))) {
		fprintf(stderr, "usage: vm_harness DIR TEMPLATE_DIR [-v] [--fork PARENT_DIR | --fork-again]\n");
		return 2;
	}
	if (sodium_init() < 0)
		return 1;
	if (!realpath(argv[1], sb.dir) && (mkdir(argv[1], 0700) < 0 || !realpath(argv[1], sb.dir))) {
		fprintf(stderr, "vm_harness: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	chmod(sb.dir, 0700);
	if ((size_t)snprintf(keys, sizeof(keys), "%s/keys", sb.dir) >= sizeof(keys) - 16) {
		fprintf(stderr, "vm_harness: %s: path too long\n", sb.dir);
		return 1;
	}
	if (mkdir(keys, 0700) < 0 && errno != EEXIST) {
		fprintf(stderr, "vm_harness: %s: %s\n", keys, strerror(errno));
		return 1;
	}
	if ((size_t)snprintf(hostkey, sizeof(hostkey), "%s/host.key", keys) >= sizeof(hostkey) ||
	    (size_t)snprintf(sb.guest_key_file, sizeof(sb.guest_key_file), "%s/guest.key", keys) >=
		sizeof(sb.guest_key_file))
		return 1;
	if (key_get(hostkey, &sb.host) < 0 || key_get(sb.guest_key_file, &guest) < 0)
		return 1;
	memcpy(sb.guest_pub, guest.pub, sizeof(sb.guest_pub));
	sodium_memzero(&guest, sizeof(guest));
	sb.kind = SANDBOX_VM;
	cfg.template_dir = argv[2];
	cfg.verbose = argc == 4;

	sigaction(SIGTERM, &sa, NULL);
	sigaction(SIGINT, &sa, NULL);
	t0 = now_ms();
	if (fork_again)
		cfg.fork = "fork";
	if (parent) {
		cfg.fork = "fork";
		if (sandbox_vm_fork_freeze(parent, sb.dir, err, sizeof(err)) < 0) {
			fprintf(stderr, "vm_harness: fork: %s\n", err);
			return 1;
		}
		printf("freeze_ms %.0f\n", now_ms() - t0);
	}
	if (sandbox_vm_start(&sb, &cfg, err, sizeof(err)) < 0) {
		fprintf(stderr, "vm_harness: %s\n", err);
		return 1;
	}
	sb.start_ms = now_ms() - t0;
	keys_pub_format(sb.guest_pub, b64);
	printf("addr %s\nhost-key %s\nguest-pub %s\ndescribe %s\nstart_ms %.0f\nready\n", sb.addr, hostkey, b64,
	       sb.describe, sb.start_ms);
	fflush(stdout);
	while (!stop_now && read(0, &c, 1) > 0) {
	}
	t1 = now_ms();
	sandbox_vm_stop(&sb);
	printf("stopped %.0f ms\n", now_ms() - t1);
	fflush(stdout);
	sodium_memzero(&sb.host, sizeof(sb.host));
	return 0;
}
