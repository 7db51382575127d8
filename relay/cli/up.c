/* SPDX-License-Identifier: Apache-2.0 */
/*
 * airlock up DIR: parse the command line, set up each service (policy,
 * keys, state directory, sandbox, loop, egress, mount, relay), run the
 * loop, tear down in reverse. doc/UP.md.
 */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/transport.h"
#include "airlock/egress/egress_link.h"
#include "airlock/host/route.h"
#include "airlock/mount/journal.h"
#include "airlock/mount/keep.h"
#include "airlock/mount/mount.h"
#include "airlock/policy/policy.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/server/relay.h"
#include "airlock/sync/audit.h"
#include "airlock/sync/sync.h"
#include "cmd_i.h"
#include "up_i.h"

/* -d: fork before anything starts threads; the parent waits for the "in
 * sync" line (or the child's exit) and exits with the outcome. Returns in
 * the child with *ready_fd set; exits in the parent. */
static int daemonize(int *ready_fd)
{
	int p[2];
	pid_t pid;

	if (pipe2(p, O_CLOEXEC) < 0)
		return -errno;
	if ((pid = fork()) < 0)
		return -errno;
	if (pid > 0) {
		char line[PATH_MAX + 512];
		ssize_t n, got = 0;
		close(p[1]);
		while ((n = read(p[0], line + got, sizeof(line) - 1 - (size_t)got)) > 0)
			got += n;
		line[got] = '\0';
		if (got > 0) {
			fputs(line, stdout);
			fprintf(stderr, "airlock: running in the background as pid %d\n", (int)pid);
			exit(0);
		}
		exit(1);
	}
	close(p[0]);
	setsid();
	*ready_fd = p[1];
	return 0;
}

/* What the command line asks for besides the guest (u->conn.g). */
struct up_args {
	const char *dir, *policy_file, *sandbox;
	bool daemon, allow_other, allow_home;
};

/* The command line into u->conn.g and a. 0, or the exit status. */
static int parse_args(struct up *u, struct up_args *a, int argc, char **argv)
{
	static const struct option opts[] = {
	    GUEST_OPTS_LONG,
	    {"policy", required_argument, NULL, 'P'},
	    GUEST_OPTS_PSK_LONG,
	    {"daemon", no_argument, NULL, 'd'},
	    {"sandbox", required_argument, NULL, 's'},
	    {"allow-other", no_argument, NULL, 'O'},
	    {"allow-home", no_argument, NULL, 'H'},
	    {"quiet", no_argument, NULL, 'q'},
	    {NULL, 0, NULL, 0},
	};
	int c, r;

	optind = 1;
	while ((c = getopt_long(argc, argv, "d", opts, NULL)) != -1) {
		if ((r = guest_opts_parse(&u->conn.g, c, optarg)) < 0)
			return 2;
		if (r > 0)
			continue;
		if (c == 'P') {
			a->policy_file = optarg;
		} else if (c == 'd') {
			a->daemon = true;
		} else if (c == 's') {
			a->sandbox = optarg;
		} else if (c == 'O') {
			a->allow_other = true;
		} else if (c == 'H') {
			a->allow_home = true;
		} else if (c == 'q') {
			u->progress.quiet = true;
		} else {
			cmd_usage("up");
			return 2;
		}
	}
	if (cmd_operands("up", argc, argv, optind, 1, "DIR (the workspace directory to mount)") < 0)
		return 2;
	a->dir = argv[optind];
	return 0;
}

/* --guest with its keys, or the embedded sandbox: which, and is it said
 * right. 0, or the exit status. */
static int check_guest(struct up *u, const struct up_args *a)
{
	const struct guest_opts *g = &u->conn.g;

	u->conn.guest = g->guest;
	u->sandbox.use = !g->guest;
	if (g->guest && a->sandbox) {
		cmd_err("up: --guest and --sandbox exclude each other (--guest names a "
			"running guest; --sandbox starts "
			"one)");
		return 2;
	}
	if (!u->sandbox.use) {
		if (!guest_opts_complete(g)) {
			cmd_usage("up");
			return 2;
		}
		return guest_opts_load_peer(&u->conn.g);
	}
	if (g->keyfile || g->guest_key || g->psk_file) {
		cmd_err("up: --key, --guest-key and --psk-file go with --guest; the "
			"sandbox makes and pins its "
			"own keys");
		return 2;
	}
	if (sandbox_kind_parse(a->sandbox ? a->sandbox : "local", &u->sandbox.cfg.kind) < 0) {
		cmd_err("up: --sandbox '%s': expected local or vm", a->sandbox);
		return 2;
	}
	return 0;
}

/* Where the policy file is, to notice edits to it (policy_changed). */
static void locate_policy(struct up *u)
{
	const char *src = policy_source(u->pol.policy);
	struct stat st;
	size_t dl = strlen(u->dir);

	if (src[0] != '(' && realpath(src, u->pol.abs) && stat(u->pol.abs, &st) == 0) {
		u->pol.mtime = st.st_mtim;
		if (!strncmp(u->pol.abs, u->dir, dl) && u->pol.abs[dl] == '/')
			snprintf(u->pol.rel, sizeof(u->pol.rel), "%s", u->pol.abs + dl + 1);
	} else {
		u->pol.abs[0] = '\0';
	}
}

/* DIR (cleared of a stale mount) and its policy. 0, or the exit status. */
static int open_workspace(struct up *u, const struct up_args *a)
{
	char err[1024];
	int r;

	/* a mount left by a crashed up would hide DIR: clear it first */
	if ((r = mount_clear_stale(a->dir)) == -EBUSY) {
		const char *shown = realpath(a->dir, u->dir) ? u->dir : a->dir;
		cmd_err("up: %s is already served by a running airlock (stop it with: "
			"airlock down %s)",
			shown, shown);
		return 1;
	} else if (r < 0 && r != -ENOENT && r != -ENOTDIR) {
		cmd_err("up: %s: %s", a->dir, strerror(-r));
		return 1;
	}
	if (!realpath(a->dir, u->dir)) {
		cmd_err("up: workspace %s: %s", a->dir, strerror(errno));
		return 2;
	}
	if ((r = up_check_workspace(u->dir, a->allow_home)) != 0 || (r = up_check_fuse()) != 0)
		return r;
	up_warn_processes(u->dir);
	/* policy once, before the mount: it is read from the backing files */
	if (policy_load_for_workspace(u->dir, a->policy_file, &u->pol.policy, err, sizeof(err)) < 0) {
		cmd_err("policy: %s", err);
		return 2;
	}
	if (policy_ignored_note(u->pol.policy, err, sizeof(err)))
		cmd_err("%s", err);
	locate_policy(u);
	up_mark(u, UP_T_POLICY);
	return 0;
}

/* The state directory, -d's fork, the pid file. 0, or the exit status. */
static int take_state(struct up *u, const struct up_args *a)
{
	char err[1024];
	pid_t other = 0;
	int r;

	if (audit_dir(u->dir, 1, u->state_dir, sizeof(u->state_dir), err, sizeof(err)) < 0) {
		cmd_err("up: state directory: %s", err);
		return 1;
	}
	if (a->daemon && (r = daemonize(&u->ready_fd)) < 0) {
		cmd_err("up: -d: %s", strerror(-r));
		return 1;
	}
	/* the real files, opened before the mount covers them (a restarted
	 * daemon inherits this descriptor: DIR is covered then) */
	if ((u->dirfd = open(u->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		cmd_err("up: workspace %s: %s", u->dir, strerror(errno));
		return 2;
	}
	/* before the supervisor forks: it and every daemon log to up.log */
	if ((r = up_log_start(u->state_dir)) < 0)
		cmd_err("up: warning: no log in %s/%s: %s", u->state_dir, UP_LOG_FILE, strerror(-r));
	if (up_supervise(u) != 0) /* returns 0 in the daemon */
		return 1;
	if ((r = up_take_pid_file(u, &other)) < 0) {
		if (r == -EBUSY)
			cmd_err("up: airlock up is already running for %s (pid %d); stop it "
				"with: airlock down %s",
				u->dir, (int)other, u->dir);
		else
			cmd_err("up: pid file in %s: %s", u->state_dir, strerror(-r));
		return 1;
	}
	up_mark(u, UP_T_DAEMON);
	return 0;
}

/* The embedded sandbox, before the mount: its namespaces never hold a copy
 * of it. 0, or the exit status. */
static int start_sandbox(struct up *u)
{
	const struct policy_workspace *pw = policy_workspace(u->pol.policy);
	char err[1024];

	u->sandbox.cfg.workspace = u->dir;
	u->sandbox.cfg.limits = policy_sandbox_limits(u->pol.policy); /* kept: restarts use it again */
	u->sandbox.ttl_s = pw ? pw->ttl_seconds : -1;
	snprintf(u->sandbox.guest_name, sizeof(u->sandbox.guest_name), "sandbox %s",
		 sandbox_kind_name(u->sandbox.cfg.kind));
	u->conn.guest = u->sandbox.guest_name;
	u->sandbox.last_active_ms = loop_now_ms();
	up_fork_init(u); /* an earlier daemon's forks died with it */
	if (up_sandbox_begin(u, err, sizeof(err)) < 0) {
		cmd_err("up: sandbox: %s", err);
		return 1;
	}
	up_mark(u, UP_T_SANDBOX);
	return 0;
}

/* The egress proxy link, before the mount: it reads earlier denials from
 * the audit dir. 0, or -1 after saying why. */
static int start_egress(struct up *u)
{
	struct egress_link_cfg ec = {.policy = u->pol.policy, .workspace = u->dir};
	char err[1024];

	if (egress_link_new(u->loop, &ec, &up_link_ops, u, &u->exec.egress, err, sizeof(err)) < 0) {
		cmd_err("up: egress proxy: %s", err);
		return -1;
	}
	return 0;
}

/* The mount, or (a restarted daemon) the live mount the supervisor kept. */
static int start_mount(struct up *u, const struct up_args *a)
{
	struct mount_opts mo = {.on_exit = up_on_mount_exit, .ud = u, .allow_other = a->allow_other};
	int r;

	mo.keep = u->super.sock >= 0;
	mo.keeper_fd = u->super.sock;
	if (u->super.epoch) {
		mo.adopt_fd = mount_keep_conn(u->super.keep, &mo.adopt_init, &mo.adopt_init_len);
		mo.backing_fd = u->dirfd;
		mo.epoch = u->super.epoch;
		mo.kept = mount_keep_list(u->super.keep, &mo.nkept);
	}
	if ((r = mount_start(u->dir, u->journal, &mo, &u->mount)) < 0) {
		cmd_err("up: cannot %s %s: %s%s", u->super.epoch ? "resume the mount of" : "mount over", u->dir,
			strerror(-r),
			r == -ENODEV || r == -EPERM
			    ? (a->allow_other && r == -EPERM ? " (--allow-other needs user_allow_other in "
							       "/etc/fuse.conf when not root)"
							     : " (needs /dev/fuse and permission to mount)")
			    : "");
		return -1;
	}
	up_mark(u, UP_T_MOUNT);
	return 0;
}

_Static_assert(POLICY_TIMEOUT_DEFAULT_S == RELAY_DEFAULT_TIMEOUT_S,
	       "a trusted-only longer timeout is one over the relay's");

/* Command routing and the relay socket. 0, or -1 after saying why. */
static int start_relay(struct up *u)
{
	const struct policy_execution *pe = policy_execution(u->pol.policy);
	struct relay_cfg rc = {.path = u->exec.sock};
	struct route_cfg ro = {.loop = u->loop,
			       .policy = u->pol.policy,
			       .workspace = u->dir,
			       .guest = &up_backend_ops,
			       .guest_ud = u,
			       .guest_ready = up_guest_ready};
	int r;

	if (pe && pe->timeout_seconds > 0 && pe->timeout_seconds < 30 * 86400)
		rc.timeout_s = (unsigned)pe->timeout_seconds;
	if ((r = route_new(&ro, &u->exec.route)) < 0) {
		cmd_err("up: command routing (execution.local, credentials) for %s: %s", u->dir, strerror(-r));
		return -1;
	}
	unsigned swept = 0;
	/* the default directory only: AIRLOCK_SOCKET may name one that is not ours alone */
	if ((r = relay_default_path(u->dir, u->exec.sock, sizeof(u->exec.sock))) == 0 && !getenv("AIRLOCK_SOCKET") &&
	    relay_sweep_stale(u->exec.sock, &swept) == 0 && swept)
		fprintf(stderr, "airlock: removed %u stale relay socket%s of airlock up daemons that are gone\n", swept,
			swept == 1 ? "" : "s");
	if (r < 0 || (r = relay_new(u->loop, &rc, &route_backend_ops, u->exec.route, &u->exec.relay)) < 0) {
		cmd_err("up: relay socket %s: %s%s", u->exec.sock[0] ? u->exec.sock : "(for this workspace)",
			strerror(-r),
			r == -EADDRINUSE ? " (another airlock serves it; set "
					   "AIRLOCK_SOCKET to use another path)"
					 : "");
		return -1;
	}
	return 0;
}

/* Everything set up: connect and run until stopped. 0, or -1. */
static int run(struct up *u)
{
	int r;

	fprintf(stderr, "airlock: %s mounted; relay socket %s; connecting to %s\n", u->dir, u->exec.sock,
		u->conn.guest);
	up_sandbox_arm_idle(u);
	up_status_write(u);
	up_connect(u);
	if ((r = loop_run(u->loop)) < 0) {
		cmd_err("up: event loop: %s", strerror(-r));
		return -1;
	}
	return 0;
}

static void del_timer(struct up *u, uint64_t *timer)
{
	if (*timer)
		loop_del_timer(u->loop, *timer);
	*timer = 0;
}

/* Tear down in reverse; each step is a no-op for what never started. */
static void teardown(struct up *u)
{
	if (u->mount) {
		mount_stop(u->mount);
		u->mount = NULL;
	}
	if (u->super.sock >= 0) /* after mount_stop: its keeper thread sends on it */
		close(u->super.sock);
	u->super.sock = -1;
	up_try_clear(u);	   /* before relay_free: its commands are unwatched first */
	relay_free(u->exec.relay); /* releases running commands while the chan still exists */
	u->exec.relay = NULL;
	route_free(u->exec.route); /* after relay_free: kills local commands, wipes credentials */
	u->exec.route = NULL;
	egress_link_free(u->exec.egress); /* before the chan: its tunnels use it; writes
				       pending denials */
	u->exec.egress = NULL;
	up_fork_clear(u); /* forks live as long as the daemon that made them */
	if (u->conn.chan)
		chan_free(u->conn.chan);
	u->conn.chan = NULL;
	up_exec_clear(u);
	up_changes_clear(u);
	up_sync_clear(u);
	if (u->loop) {
		del_timer(u, &u->conn.retry_timer);
		del_timer(u, &u->conn.stop_timer);
		del_timer(u, &u->status.timer);
		del_timer(u, &u->sandbox.idle_timer);
	}
	sandbox_stop(u->sandbox.sb); /* state kept: the next up starts where this one left */
	u->sandbox.sb = NULL;
	if (u->lockfd >= 0) {
		up_remove_state_files(u);
		close(u->lockfd);
	}
	loop_free(u->loop);
	journal_free(u->journal);
	policy_free(u->pol.policy);
	if (u->dirfd >= 0)
		close(u->dirfd);
	if (u->sigfd >= 0)
		close(u->sigfd);
	if (u->ready_fd >= 0)
		close(u->ready_fd);
	guest_opts_clear(&u->conn.g);
}

/* Set up every service in order. 0, or the exit status. */
static int setup(struct up *u, const struct up_args *a)
{
	int st;

	if ((st = check_guest(u, a)) != 0 || (st = open_workspace(u, a)) != 0)
		return st;
	if (!u->sandbox.use && (st = guest_opts_load_keys(&u->conn.g)) != 0)
		return st;
	if ((st = take_state(u, a)) != 0)
		return st;
	if (u->super.epoch) {
		/* restarted after a crash: DIR waits for us, serve it first */
		u->conn.announced = true; /* the "in sync" line was the first daemon's */
		if (up_loop_init(u) < 0 || start_mount(u, a) < 0)
			return 1;
		if (u->sandbox.use && (st = start_sandbox(u)) != 0)
			return st;
		if (up_changes_init(u) < 0 || start_egress(u) < 0 || start_relay(u) < 0)
			return 1;
	} else {
		if (u->sandbox.use && (st = start_sandbox(u)) != 0)
			return st;
		if (up_changes_init(u) < 0 || up_loop_init(u) < 0 || start_egress(u) < 0 || start_mount(u, a) < 0)
			return 1;
		/* nothing changes the tree unseen from here: its walk runs
		 * while the relay starts and the guest is connected */
		up_sync_prescan(u);
		if (start_relay(u) < 0)
			return 1;
	}
	up_mark(u, UP_T_SETUP);
	relay_set_changes(u->exec.relay, &up_changes_ops, u);
	relay_set_forks(u->exec.relay, &up_fork_ops, u);
	return 0;
}

int cmd_up(int argc, char **argv)
{
	static struct up u; /* large (latency window); one per process */
	struct up_args a = {0};
	int status;

	memset(&u, 0, sizeof(u));
	up_mark(&u, UP_T_START);
	u.dirfd = u.sigfd = u.lockfd = u.ready_fd = -1;
	u.super.sock = -1;
	u.conn.backoff_ms = BACKOFF_MIN_MS;
	guest_opts_init(&u.conn.g, "up", 0);
	if ((status = parse_args(&u, &a, argc, argv)) != 0)
		return status;
	if ((status = setup(&u, &a)) == 0)
		status = run(&u) < 0 ? 1 : u.stop_signal == SIGINT ? 130 : 0; /* ^C: as a shell reports it */
	teardown(&u);
	up_log_stop();
	return status;
}
