/* SPDX-License-Identifier: Apache-2.0 */
/*
 * Forks of the embedded local sandbox in airlock up (doc/SANDBOX.md
 * "Forks", doc/RELAY.md "Forks"): the fork, fork_rm, forks and
 * fork_changes relay ops, each fork's channel, its TTL.
 *
 * A fork is a sandbox of its own (sandbox_start with cfg.fork: new
 * namespaces, its own cgroup, its own keys) whose workspace copy and home
 * are overlays over the parent's frozen layers (sandbox_fork.h); a vm
 * fork's disk is a qcow2 overlay over the parent's frozen one, its memory
 * the parent's (SANDBOX_FORKS_LIVE: each make pauses the running parent
 * VM and lets it go on; no halt, no restart). Making local
 * forks stops the parent's sandbox for the freeze (a rename), starts the
 * forks, and leaves the parent idle-stopped: its next activity starts it
 * again on a fresh upper (up_touch), so its start, reconnect and reconcile
 * (each grows with the tree) do not hold up the forks. A fork gets no sync:
 * the host's later edits reach the parent only. Its commands are ordinary
 * xcmds (up_exec.c) on its channel; its egress goes through an egress link
 * of its own over the parent's policy, so the allow-list and the audit are
 * the parent's. What its commands change stays in its upper: try reads the
 * winner's from there (fork_changes) and replays it in the parent. A vm
 * fork has no upper: what its agent reports its commands changed (CHG_ITEM,
 * as the sandbox's agent reports them) is kept per fork (f->reported),
 * and try pulls the winner's from its agent (up_forkpull.c).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <jansson.h>

#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/keys.h"
#include "airlock/core/loop.h"
#include "airlock/core/mem.h"
#include "airlock/core/transport.h"
#include "airlock/core/wire.h"
#include "airlock/egress/egress_link.h"
#include "airlock/policy/policy.h"
#include "airlock/sandbox/sandbox.h"
#include "airlock/sandbox/sandbox_fork.h"
#include "airlock/server/relay.h"
#include "airlock/sync/writeback.h"
#include "cmd_i.h"
#include "up_i.h"

#define FORK_TTL_DEFAULT_S 3600 /* an hour: the seed's interactive-session default */
#define FORK_SWEEP_MS	   1000

_Static_assert(RELAY_FORK_NAME_MAX == SANDBOX_FORK_NAME_MAX, "one limit for fork names");
_Static_assert(RELAY_FORKS_MAX == SANDBOX_FORK_MAX, "one limit for forks");

struct up_fork *up_fork_find(struct up *u, const char *name)
{
	for (struct up_fork *f = u->forks.list; f; f = f->next)
		if (!strcmp(f->name, name))
			return f;
	return NULL;
}

static size_t forks_count(const struct up *u)
{
	size_t n = 0;
	for (const struct up_fork *f = u->forks.list; f; f = f->next)
		n++;
	return n;
}

/* ---- its channel ---- */

static void fork_on_ready(struct chan *c, void *ud)
{
	struct up_fork *f = ud;
	int r;

	if ((r = guest_hello_send(c, f->g.sync_pk, "airlock fork")) < 0) {
		up_fork_drop(f, "sending HELLO failed");
		return;
	}
	if (f->egress)
		egress_link_attach(f->egress, c);
	f->ready = true;
	up_exec_kick(f->u);
	up_mark_dirty(f->u);
}

static void fork_on_frame(struct chan *c, uint8_t type, uint32_t stream, const uint8_t *data, size_t n, void *ud)
{
	struct up_fork *f = ud;
	struct up *u = f->u;
	char why[160];
	struct buf in;

	switch (wire_group_of(type)) {
	case WIRE_GROUP_EXEC:
		up_exec_frame(u, f, type, stream, data, n);
		return;
	case WIRE_GROUP_CHANGES:
		if (up_forkpull_frame(f, type, stream, data, n))
			return;
		if (type == WIRE_CHG_ITEM && up_exec_find(u, f, stream)) { /* its tracked changes */
			up_exec_chg_item(u, f, stream, data, n);
			return;
		}
		if (type != WIRE_CHG_PULL) {
			/* a released command's items, the rest of a pull given
			 * up: forgotten (the pull's stream at its end) */
			chan_consume(c, stream, n);
			if (type == WIRE_CHG_END)
				chan_stream_close(c, stream);
			return;
		}
		snprintf(why, sizeof(why), "%s (%u) from its agent", wire_type_name(type), type);
		up_fork_drop(f, why);
		return;
	case WIRE_GROUP_PROXY:
		if (!f->egress || egress_link_frame(f->egress, type, stream, data, n) < 0) {
			snprintf(why, sizeof(why), "malformed or unexpected %s (%u) on stream %u", wire_type_name(type),
				 type, stream);
			up_fork_drop(f, why);
		}
		return;
	default:
		break;
	}
	buf_view(&in, data, n);
	if (type == WIRE_HELLO_OK) {
		const char *bad = guest_hello_ok_why(&in);
		if (bad)
			up_fork_drop(f, bad);
		return;
	}
	if (type == WIRE_ERROR) {
		struct wire_error m;
		if (wire_error_decode(&in, &m) < 0 || !stream || !up_exec_refused(u, f, stream, m.msg))
			up_fork_drop(f, "its agent reported an error");
		if (m.msg)
			wire_error_clear(&m);
		return;
	}
	(void)c;
	snprintf(why, sizeof(why), "unexpected frame %s (%u)", wire_type_name(type), type);
	up_fork_drop(f, why);
}

static void fork_on_writable(struct chan *c, void *ud)
{
	struct up_fork *f = ud;
	(void)c;

	if (f->egress)
		egress_link_writable(f->egress);
	up_exec_writable(f->u, f);
}

static void fork_on_close(struct chan *c, int err, const char *why, void *ud)
{
	struct up_fork *f = ud;

	if (err < 0 && !f->why[0])
		snprintf(f->why, sizeof(f->why), "%s", why ? why : strerror(-err));
	up_forkpull_cancel(f, "its agent went away");
	f->chan = NULL;
	f->ready = false;
	if (f->egress)
		egress_link_detach(f->egress);
	chan_free(c);
	up_exec_fail_fork(f->u, f, "guest_disconnected", "the fork's agent is gone; nothing more runs there");
	up_mark_dirty(f->u);
}

static const struct chan_ops fork_chan_ops = {
    .on_ready = fork_on_ready,
    .on_frame = fork_on_frame,
    .on_writable = fork_on_writable,
    .on_close = fork_on_close,
};

void up_fork_drop(struct up_fork *f, const char *why)
{
	snprintf(f->why, sizeof(f->why), "%s", why);
	cmd_err("fork %s: %s", f->name, why);
	if (f->chan)
		chan_close(f->chan);
}

/* egress_link of a fork: its commands, its streams */
static struct relay_cmd *fork_link_find_cmd(void *ud, uint32_t exec_stream, const char **desc)
{
	struct up_fork *f = ud;
	struct xcmd *x = up_exec_find(f->u, f, exec_stream);

	if (!x)
		return NULL;
	*desc = x->desc;
	return x->cmd;
}

static void fork_link_changed(void *ud)
{
	up_mark_dirty(((struct up_fork *)ud)->u);
}

static const struct egress_link_ops fork_link_ops = {
    .find_cmd = fork_link_find_cmd,
    .on_change = fork_link_changed,
};

/* ---- start, stop, remove ---- */

/* Start f's sandbox and connect to it (the agent listens once
 * sandbox_start returns; the handshake follows on the loop). */
static int fork_start(struct up_fork *f, char *err, size_t errlen)
{
	struct up *u = f->u;
	struct sandbox_cfg cfg = u->sandbox.cfg;
	int fd, r;

	cfg.fork = f->name;
	f->why[0] = '\0';
	if ((r = sandbox_start(&cfg, &f->sb, err, errlen)) < 0)
		return r;
	f->start_ms = sandbox_start_ms(f->sb);
	if ((r = transport_parse(sandbox_address(f->sb), &f->g.addr, err, errlen)) < 0)
		goto fail;
	f->g.key = *sandbox_host_key(f->sb);
	memcpy(f->g.guest_pub, sandbox_guest_pub(f->sb), sizeof(f->g.guest_pub));
	if ((r = keys_signing_key(&f->g.key, f->g.sync_sk, f->g.sync_pk)) < 0) {
		errmsg_set(err, errlen, "deriving the fork's signing key failed");
		goto fail;
	}
	if ((fd = transport_connect(&f->g.addr, CONNECT_MS, err, errlen)) < 0) {
		r = fd;
		goto fail;
	}
	struct chan_cfg cc = guest_opts_chan_cfg(&f->g);
	if (!(f->chan = chan_new(u->loop, fd, &cc, &fork_chan_ops, f))) {
		errmsg_set(err, errlen, "out of memory");
		r = -ENOMEM;
		goto fail;
	}
	return 0;
fail:
	sandbox_stop(f->sb);
	f->sb = NULL;
	return r;
}

/* Its agent and namespaces end; its state stays. */
static void fork_stop(struct up_fork *f)
{
	up_forkpull_cancel(f, "the fork was stopped");
	if (f->chan) {
		struct chan *c = f->chan;
		f->chan = NULL;
		f->ready = false;
		if (f->egress)
			egress_link_detach(f->egress);
		chan_free(c);
	}
	up_exec_fail_fork(f->u, f, "guest_disconnected", "the fork was stopped");
	sandbox_stop(f->sb);
	f->sb = NULL;
}

static void fork_free(struct up_fork *f)
{
	wb_forkset_free(f->reported);
	egress_link_free(f->egress);
	guest_opts_clear(&f->g);
	mem_free(f);
}

/* Stop f, remove its state, unlink and free it. */
static int fork_remove(struct up *u, struct up_fork *f, char *err, size_t errlen)
{
	int r;

	fork_stop(f);
	r = sandbox_forks_remove(u->sandbox.cfg.kind, u->sandbox.dir, f->name, err, errlen);
	for (struct up_fork **pp = &u->forks.list; *pp; pp = &(*pp)->next)
		if (*pp == f) {
			*pp = f->next;
			break;
		}
	fork_free(f);
	up_mark_dirty(u);
	return r == -ENOENT ? 0 : r;
}

static struct up_fork *fork_new(struct up *u, const char *name, int64_t ttl_s, char *err, size_t errlen)
{
	struct egress_link_cfg ec = {.policy = u->pol.policy, .workspace = u->dir};
	struct up_fork *f = mem_calloc(1, sizeof(*f));

	if (!f) {
		errmsg_set(err, errlen, "out of memory");
		return NULL;
	}
	f->u = u;
	memcpy(f->name, name, strnlen(name, RELAY_FORK_NAME_MAX)); /* a valid name: checked by the caller */
	guest_opts_init(&f->g, "fork", 0);
	f->ttl_s = ttl_s;
	f->created_ms = f->last_active_ms = loop_now_ms();
	if (!up_fork_upper(u) && wb_forkset_new(&f->reported) < 0)
		errmsg_set(err, errlen, "out of memory");
	if ((!up_fork_upper(u) && !f->reported) ||
	    (u->exec.egress && egress_link_new(u->loop, &ec, &fork_link_ops, f, &f->egress, err, errlen) < 0)) {
		wb_forkset_free(f->reported);
		guest_opts_clear(&f->g);
		mem_free(f);
		return NULL;
	}
	return f;
}

/* ---- the TTL ---- */

static void on_sweep(struct loop *l, void *ud)
{
	struct up *u = ud;
	uint64_t now = loop_now_ms();
	char err[256];

	u->forks.timer = loop_add_timer(l, FORK_SWEEP_MS, on_sweep, u);
	for (struct up_fork *f = u->forks.list, *next; f; f = next) {
		bool running = false;
		next = f->next;
		for (struct xcmd *x = u->exec.xcmds; x; x = x->next)
			running |= x->fork == f;
		if (running) {
			f->last_active_ms = now;
			continue;
		}
		if (now - f->last_active_ms < (uint64_t)f->ttl_s * 1000u)
			continue;
		fprintf(stderr, "airlock: fork %s idle for %lld s: removing it\n", f->name, (long long)f->ttl_s);
		if (fork_remove(u, f, err, sizeof(err)) < 0)
			cmd_err("fork: %s", err);
	}
}

/* ---- the parent's halt ---- */

#define REAP_POLL_MS 20

void up_fork_reap(struct up *u, bool wait)
{
	struct sandbox *sb = u->forks.halted;

	if (!sb || (!wait && sandbox_alive(sb)))
		return;
	if (wait && sandbox_alive(sb))
		fprintf(stderr, "airlock: waiting for the sandbox's last stop to end\n");
	sandbox_stop(sb);
	fprintf(stderr, "airlock: the sandbox's teardown after the fork took %.0f ms (off the fork's path)\n",
		(double)(loop_now_ms() - u->forks.halted_ms));
	u->forks.halted = NULL;
	if (u->forks.reap_timer)
		loop_del_timer(u->loop, u->forks.reap_timer);
	u->forks.reap_timer = 0;
}

static void on_reap(struct loop *l, void *ud)
{
	struct up *u = ud;

	u->forks.reap_timer = 0;
	up_fork_reap(u, false);
	if (u->forks.halted)
		u->forks.reap_timer = loop_add_timer(l, REAP_POLL_MS, on_reap, u);
}

/* The parent's sandbox stopped for the freeze, as by the idle TTL: its
 * next activity of its own starts it again on the new layers. Halted
 * (frozen, then killed) rather than stopped where it can be: nothing of
 * it writes the upper about to become a layer once sandbox_halt returns,
 * and the kernel's teardown of its overlay (the eviction of every inode
 * its reconcile looked at: seconds for 100k files) goes on while the forks
 * start, reaped later (doc/SANDBOX.md "Forks"). */
static void parent_halt(struct up *u)
{
	struct sandbox *sb = u->sandbox.sb;

	u->sandbox.idle_stopped = true;
	u->sandbox.sb = NULL;
	up_fork_reap(u, true); /* an earlier halt's: one at a time */
	if (sandbox_halt(sb) == 0) {
		u->forks.halted = sb;
		u->forks.halted_ms = loop_now_ms();
		u->forks.reap_timer = loop_add_timer(u->loop, REAP_POLL_MS, on_reap, u);
	} else {
		sandbox_stop(sb);
	}
	if (u->conn.chan)
		chan_close(u->conn.chan); /* on_close: no retry while idle-stopped */
}

/* ---- the ops ---- */

/* fork: stop the parent, freeze, make and start each fork (seed, when
 * given, puts files into each fork's state before it starts). */
int up_fork_make(struct up *u, const struct relay_fork_req *q, up_fork_seed_fn *seed, void *seed_ud, json_t *out,
		 char *err, size_t errlen)
{
	const struct policy_workspace *pw = policy_workspace(u->pol.policy);
	int64_t ttl = q->ttl_s ? q->ttl_s : pw && pw->ttl_seconds > 0 ? pw->ttl_seconds : FORK_TTL_DEFAULT_S;
	char names[RELAY_FORKS_MAX][RELAY_FORK_NAME_MAX + 1];
	struct up_fork *made[RELAY_FORKS_MAX];
	double t0 = loop_now_ns() / 1e6;
	unsigned depth, n = 0;
	json_t *arr;
	int r;

	bool live = sandbox_kind_fork_flags(u->sandbox.cfg.kind) & SANDBOX_FORKS_LIVE;

	if (!u->sandbox.use || !sandbox_kind_forks(u->sandbox.cfg.kind)) {
		errmsg_set(err, errlen, "forks are made of the embedded sandbox (airlock up --sandbox local or vm); %s",
			   u->sandbox.use ? "this sandbox's kind has none here" : "this daemon talks to a --guest");
		return -ENOTSUP;
	}
	if (live && !u->sandbox.sb) { /* its memory is what the forks start from */
		errmsg_set(err, errlen,
			   "the sandbox is %s: a %s sandbox is forked while it runs (airlock exec -- true starts it)",
			   u->sandbox.idle_stopped ? "idle-stopped" : "not running",
			   sandbox_kind_name(u->sandbox.cfg.kind));
		return -EAGAIN;
	}
	if (forks_count(u) + q->count > SANDBOX_FORK_MAX) {
		errmsg_set(err, errlen,
			   "%zu forks exist and %u more were asked for: at most %d (airlock fork --rm NAME)",
			   forks_count(u), q->count, SANDBOX_FORK_MAX);
		return -ENOSPC;
	}
	for (unsigned i = 0; i < q->count; i++) {
		if (q->nnames)
			snprintf(names[i], sizeof(names[i]), "%s", q->names[i]);
		else
			do
				snprintf(names[i], sizeof(names[i]), "f%u", ++u->forks.next);
			while (up_fork_find(u, names[i]));
		if (up_fork_find(u, names[i])) {
			errmsg_set(err, errlen, "a fork named '%s' exists already", names[i]);
			return -EEXIST;
		}
	}
	/* the parent's copy must be what the host has, and nothing of the
	 * parent's may be running: its sandbox is stopped for the freeze */
	if (u->sandbox.sb && (up_exec_parent_busy(u) || !up_sync_settled(u))) {
		errmsg_set(err, errlen, "the sandbox is busy (%s): fork when it is idle",
			   up_exec_parent_busy(u) ? "commands are running" : "the workspace is still syncing");
		return -EAGAIN;
	}
	double t_stop = loop_now_ns() / 1e6, t_freeze;
	/* stopped as by the idle TTL: the next activity of its own (a command,
	 * an edit) starts it again, on the new layers; until then its start,
	 * reconnect and reconcile do not hold up the forks' first commands */
	if (u->sandbox.sb && !live) /* live: each make pauses it for its fork */
		parent_halt(u);
	/* with no fork alive the freeze merges the layer stack into the base:
	 * never while the halted parent's overlay, which still has those
	 * layers mounted, is being torn down (a fork's mount then stalled past
	 * its agent's start deadline in fork_e2e under the sanitizers) */
	if (!live && forks_count(u) == 0)
		up_fork_reap(u, true);
	t_stop = loop_now_ns() / 1e6 - t_stop;
	t_freeze = loop_now_ns() / 1e6;
	r = sandbox_forks_freeze(u->sandbox.cfg.kind, u->sandbox.dir, &depth, err, errlen);
	t_freeze = loop_now_ns() / 1e6 - t_freeze;
	if (r < 0)
		return r;
	for (n = 0; n < q->count; n++) {
		double t_make = loop_now_ns() / 1e6;
		r = sandbox_forks_make(u->sandbox.cfg.kind, u->sandbox.dir, names[n], depth, ttl, err, errlen);
		if (live) /* each make paused the parent for its fork: freeze time */
			t_freeze += loop_now_ns() / 1e6 - t_make;
		if (r < 0)
			goto undo;
		if (!(made[n] = fork_new(u, names[n], ttl, err, errlen))) {
			char e2[256];
			(void)sandbox_forks_remove(u->sandbox.cfg.kind, u->sandbox.dir, names[n], e2, sizeof(e2));
			r = -ENOMEM;
			goto undo;
		}
		made[n]->next = u->forks.list;
		u->forks.list = made[n];
		if (seed && (r = seed(seed_ud, n, u->sandbox.dir, names[n], err, errlen)) < 0) {
			n++;
			goto undo;
		}
		if ((r = fork_start(made[n], err, errlen)) < 0) {
			n++;
			goto undo;
		}
	}
	if (!u->forks.timer)
		u->forks.timer = loop_add_timer(u->loop, FORK_SWEEP_MS, on_sweep, u);
	arr = json_array();
	for (unsigned i = 0; i < n; i++)
		json_array_append_new(arr,
				      json_pack("{s:s, s:f}", "name", made[i]->name, "start_ms", made[i]->start_ms));
	json_object_set_new(out, "forks", arr);
	json_object_set_new(out, "layers", json_integer(depth));
	json_object_set_new(out, "ms", json_real(loop_now_ns() / 1e6 - t0));
	json_object_set_new(out, "parent_stop_ms", json_real(t_stop));
	json_object_set_new(out, "freeze_ms", json_real(t_freeze));
	json_object_set_new(out, "ttl_seconds", json_integer(ttl));
	up_mark_dirty(u);
	return 0;
undo : {
	char e2[256];
	for (unsigned i = 0; i < n; i++)
		(void)fork_remove(u, made[i], e2, sizeof(e2));
	return r;
}
}

int up_fork_rm(struct up *u, const char *name, char *err, size_t errlen)
{
	struct up_fork *f = up_fork_find(u, name);

	if (!f) {
		errmsg_set(err, errlen, "no fork named '%s'", name);
		return -ENOENT;
	}
	return fork_remove(u, f, err, errlen);
}

/* The parent's sandbox stopped (halted) and reaped, for a write into its
 * state while nothing has it mounted: -EAGAIN when it runs commands or
 * the workspace is still syncing. */
int up_fork_parent_quiesce(struct up *u, char *err, size_t errlen)
{
	if (u->sandbox.sb && (up_exec_parent_busy(u) || !up_sync_settled(u))) {
		errmsg_set(err, errlen, "the sandbox is busy (%s)",
			   up_exec_parent_busy(u) ? "commands are running" : "the workspace is still syncing");
		return -EAGAIN;
	}
	if (u->sandbox.sb)
		parent_halt(u);
	up_fork_reap(u, true);
	return 0;
}

static int op_fork_rm(struct up *u, const struct relay_fork_req *q, json_t *out, char *err, size_t errlen)
{
	json_t *arr = json_array();
	int r = 0;

	for (size_t i = 0; i < q->nnames; i++)
		if (!up_fork_find(u, q->names[i])) {
			json_decref(arr);
			errmsg_set(err, errlen, "no fork named '%s'", q->names[i]);
			return -ENOENT;
		}
	for (size_t i = 0; r == 0 && (q->all ? u->forks.list != NULL : i < q->nnames); i++) {
		struct up_fork *f = q->all ? u->forks.list : up_fork_find(u, q->names[i]);
		json_array_append_new(arr, json_string(f->name));
		r = fork_remove(u, f, err, errlen);
	}
	json_object_set_new(out, "removed", arr);
	return r;
}

static int change_add(const char *path, bool deleted, void *ud)
{
	return json_array_append_new(ud, json_pack("{s:s, s:b}", "path", path, "deleted", deleted)) < 0 ? -ENOMEM : 0;
}

/* fork_changes: what the fork changed (a local fork is stopped first:
 * nothing writes its upper any more). */
static int op_fork_changes(struct up *u, const struct relay_fork_req *q, json_t *out, char *err, size_t errlen)
{
	return up_fork_changes(u, q->names[0], out, err, errlen);
}

bool up_fork_upper(const struct up *u)
{
	return sandbox_kind_fork_flags(u->sandbox.cfg.kind) & SANDBOX_FORKS_UPPER;
}

void up_fork_chg_item(struct up_fork *f, const uint8_t *data, size_t n)
{
	struct wire_chg_item it;
	struct buf in;
	char why[160];

	if (!f->reported) /* a fork with an upper: its changes are read from there */
		return;
	buf_view(&in, data, n);
	if (wire_chg_item_decode(&in, &it) < 0) {
		up_fork_drop(f, "malformed CHG_ITEM");
		return;
	}
	/* -E2BIG, -ENOMEM: the set says so when it is read */
	if (wb_forkset_note(f->reported, it.path, it.st_mode) == -EBADMSG) {
		snprintf(why, sizeof(why), "its agent reported a change of '%.60s', which is not a workspace path",
			 it.path);
		up_fork_drop(f, why);
	}
	wire_chg_item_clear(&it);
}

int up_fork_changes(struct up *u, const char *name, json_t *out, char *err, size_t errlen)
{
	struct up_fork *f = up_fork_find(u, name);
	char dir[PATH_MAX + 64];
	json_t *arr;
	int r;

	if (!f) {
		errmsg_set(err, errlen, "no fork named '%s'", name);
		return -ENOENT;
	}
	if (!(arr = json_array()))
		return -ENOMEM;
	if (!up_fork_upper(u)) { /* vm: what its agent reported; it runs on */
		char why[300] = "";
		if (f->reported && (r = wb_forkset_list(f->reported, change_add, arr, why, sizeof(why))) < 0) {
			json_decref(arr);
			errmsg_set(err, errlen, "reading the changes of fork '%s': %s", f->name,
				   why[0] ? why : strerror(-r));
			return r;
		}
		json_object_set_new(out, "name", json_string(f->name));
		json_object_set_new(out, "changes", arr);
		return 0;
	}
	fork_stop(f);
	snprintf(f->why, sizeof(f->why), "stopped to read its changes");
	if ((r = sandbox_fork_changes(u->sandbox.dir, f->name, change_add, arr)) < 0) {
		json_decref(arr);
		errmsg_set(err, errlen, "reading the changes of fork '%s': %s", f->name, strerror(-r));
		return r;
	}
	snprintf(dir, sizeof(dir), "%s/forks/%s/upper/workspace", u->sandbox.dir, f->name);
	json_object_set_new(out, "name", json_string(f->name));
	json_object_set_new(out, "changes", arr);
	json_object_set_new(out, "upper", json_string(dir));
	return 0;
}

json_t *up_fork_status(struct up *u)
{
	json_t *arr = json_array();
	uint64_t now = loop_now_ms();

	for (struct up_fork *f = u->forks.list; arr && f; f = f->next) {
		unsigned running = 0;
		for (struct xcmd *x = u->exec.xcmds; x; x = x->next)
			running += x->fork == f;
		json_array_append_new(arr,
				      json_pack("{s:s, s:s, s:I, s:I, s:I, s:f, s:s}", "name", f->name, "state",
						f->ready  ? "ready"
						: f->chan ? "starting"
							  : "stopped",
						"commands", (json_int_t)running, "ttl_seconds", (json_int_t)f->ttl_s,
						"idle_seconds", (json_int_t)((now - f->last_active_ms) / 1000),
						"start_ms", f->start_ms, "why", f->why));
	}
	return arr;
}

static int fork_request(void *ud, uint64_t token, const struct relay_fork_req *q)
{
	struct up *u = ud;
	json_t *out = json_object();
	char err[1024] = "", *body;
	int r;

	if (!out)
		return -ENOMEM;
	if (!strcmp(q->op, "fork"))
		r = up_fork_make(u, q, NULL, NULL, out, err, sizeof(err));
	else if (!strcmp(q->op, "fork_rm"))
		r = op_fork_rm(u, q, out, err, sizeof(err));
	else if (!strcmp(q->op, "fork_changes"))
		r = op_fork_changes(u, q, out, err, sizeof(err));
	else
		r = json_object_set_new(out, "forks", up_fork_status(u)) < 0 ? -ENOMEM : 0;
	if (r < 0) {
		json_decref(out);
		relay_changes_done(u->exec.relay, token, NULL, NULL,
				   r == -EAGAIN	   ? "busy"
				   : r == -ENOENT  ? "no_fork"
				   : r == -ENOTSUP ? "unsupported"
						   : "fork_failed",
				   err[0] ? err : strerror(-r));
		return 0;
	}
	body = json_dumps(out, JSON_COMPACT);
	json_decref(out);
	relay_changes_done(u->exec.relay, token, !strcmp(q->op, "forks") ? "forks" : q->op, body, "backend_error",
			   "out of memory");
	free(body);
	return 0;
}

const struct relay_fork_ops up_fork_ops = {.request = fork_request, .try_start = up_try_start};

struct up_fork *up_fork_for_exec(struct up *u, const char *name, struct relay_cmd *cmd)
{
	struct up_fork *f = up_fork_find(u, name);
	char err[1024], msg[1100];

	if (!f) {
		snprintf(msg, sizeof(msg), "no fork named '%s' (airlock fork, airlock status)", name);
		relay_cmd_error(cmd, "no_fork", msg);
		return NULL;
	}
	f->last_active_ms = loop_now_ms();
	if (!f->sb && (sandbox_kind_fork_flags(u->sandbox.cfg.kind) & SANDBOX_FORKS_LIVE)) {
		/* its memory file is the parent's at the fork: its disk moved on since */
		snprintf(msg, sizeof(msg),
			 "the fork '%s' was stopped and a %s fork cannot start again (airlock fork --rm)", name,
			 sandbox_kind_name(u->sandbox.cfg.kind));
		relay_cmd_error(cmd, "guest_disconnected", msg);
		return NULL;
	}
	if (!f->sb && fork_start(f, err, sizeof(err)) < 0) { /* stopped: its state is kept */
		snprintf(msg, sizeof(msg), "starting the fork '%s' again: %s", name, err);
		relay_cmd_error(cmd, "guest_disconnected", msg);
		return NULL;
	}
	return f;
}

void up_fork_init(struct up *u)
{
	char dir[PATH_MAX], err[512];
	char **names = NULL;
	size_t n = 0;

	if (!u->sandbox.use || !sandbox_kind_forks(u->sandbox.cfg.kind) ||
	    sandbox_dir_of(u->dir, dir, sizeof(dir)) < 0 || sandbox_fork_list(dir, &names, &n) < 0)
		return;
	for (size_t i = 0; i < n; i++) {
		if (sandbox_forks_remove(u->sandbox.cfg.kind, dir, names[i], err, sizeof(err)) < 0)
			cmd_err("fork: %s", err);
		mem_free(names[i]);
	}
	mem_free(names);
}

void up_fork_clear(struct up *u)
{
	char err[512];

	if (u->forks.timer && u->loop)
		loop_del_timer(u->loop, u->forks.timer);
	u->forks.timer = 0;
	up_fork_reap(u, true);
	while (u->forks.list)
		if (fork_remove(u, u->forks.list, err, sizeof(err)) < 0)
			cmd_err("fork: %s", err);
}
