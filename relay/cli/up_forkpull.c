/* SPDX-License-Identifier: Apache-2.0 */
/*
 * A vm fork's changes pulled for a replay in the sandbox (doc/VM.md
 * "Forks", doc/RELAY.md "try"). A vm fork's changes are blocks in its own
 * qcow2 disk; its agent reported what its commands changed (CHG_ITEM, kept
 * in f->reported by up_fork.c), so the daemon asks that agent for those
 * paths over the fork's channel (CHG_PULL, in groups, as the sandbox's own
 * changes are pulled: up_changes_ask) and writes what comes into a replay
 * archive (wb_replay) in an unnamed temporary of the state directory. The
 * fork's bytes go through the same decoder as the sandbox's (wb_pull:
 * only the paths asked, in order; sizes under workspace.writeback_max_mib
 * before anything is staged; hashes checked): nothing of them is written
 * to the workspace on the host; the archive is the stdin of one command in
 * the sandbox, whose changes are then reviewed like any other.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/core/chan.h"
#include "airlock/core/errmsg.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/sync/writeback.h"
#include "cmd_i.h"
#include "up_i.h"

#define CAP_NAME "workspace.writeback_max_mib"

struct up_forkpull {
	struct up_fork *f;
	up_forkpull_done_fn *done;
	void *ud;
	char **paths; /* what its agent reported, in tree order */
	size_t n, gstart, gend;
	struct wb_pull *wp; /* the group asked */
	uint32_t stream;
	struct wb_replay *replay;
	int fd; /* the archive */
	uint64_t cap_left;
};

static void pull_free(struct up_forkpull *p)
{
	for (size_t i = 0; i < p->n; i++)
		mem_free(p->paths[i]);
	mem_free(p->paths);
	wb_pull_free(p->wp);
	wb_replay_free(p->replay);
	if (p->fd >= 0)
		close(p->fd);
	mem_free(p);
}

/* Tell the caller and forget the pull. close_stream: the stream's last
 * frame came (else its remaining frames are dropped as they come, and
 * its CHG_END closes it: up_fork.c). */
static void pull_end(struct up_forkpull *p, int err, const char *why, bool close_stream)
{
	struct up_fork *f = p->f;
	size_t nfiles = 0, ndeleted = 0;
	uint64_t size = 0;
	char msg[700];
	int fd = -1;

	if (close_stream && p->stream && f->chan)
		chan_stream_close(f->chan, p->stream);
	f->pull = NULL;
	if (err == 0 && (err = wb_replay_finish(p->replay, &nfiles, &ndeleted)) < 0)
		why = "writing the replay archive";
	if (err == 0) {
		off_t end = lseek(p->fd, 0, SEEK_END);
		if (end < 0) {
			err = -errno;
			why = "the replay archive";
		} else {
			size = (uint64_t)end;
			fd = p->fd;
			p->fd = -1;
		}
	}
	if (err < 0)
		snprintf(msg, sizeof(msg), "pulling the changes of fork '%s': %.500s%s%s", f->name, why,
			 why[0] ? ": " : "", strerror(-err));
	p->done(p->ud, err, err < 0 ? msg : "", fd, size, nfiles, ndeleted);
	pull_free(p);
}

static int collect(const char *path, bool deleted, void *ud)
{
	struct up_forkpull *p = ud;
	(void)deleted; /* asked too: its state now is what counts */

	if ((p->n & (p->n - 1)) == 0) { /* 0, 1, 2, 4, ...: grow */
		void *nv = mem_realloc(p->paths, (p->n ? p->n * 2 : 1) * sizeof(*p->paths));
		if (!nv)
			return -ENOMEM;
		p->paths = nv;
	}
	if (!(p->paths[p->n] = mem_strdup(path)))
		return -ENOMEM;
	p->n++;
	return 0;
}

static int ask_next(struct up_forkpull *p)
{
	struct up_fork *f = p->f;

	p->gstart = p->gend;
	wb_pull_free(p->wp);
	p->wp = NULL;
	return up_changes_ask(f->u, f->chan, p->paths, p->gstart, p->n, p->cap_left, CAP_NAME, &p->gend, &p->wp,
			      &p->stream);
}

int up_forkpull_start(struct up_fork *f, up_forkpull_done_fn *done, void *ud, char *err, size_t errlen)
{
	struct up *u = f->u;
	struct up_forkpull *p;
	int r;

	if (f->pull) {
		errmsg_set(err, errlen, "the changes of fork '%s' are being pulled already", f->name);
		return -EBUSY;
	}
	if (!f->chan || !f->ready) {
		errmsg_set(err, errlen, "the agent of fork '%s' is not connected: its changes cannot be read", f->name);
		return -ENOTCONN;
	}
	if (!(p = mem_calloc(1, sizeof(*p)))) {
		errmsg_set(err, errlen, "out of memory");
		return -ENOMEM;
	}
	p->f = f;
	p->done = done;
	p->ud = ud;
	p->fd = -1;
	p->cap_left = up_changes_cap(u);
	if (f->reported && (r = wb_forkset_list(f->reported, collect, p, err, errlen)) < 0) {
		if (r == -ENOMEM)
			errmsg_set(err, errlen, "out of memory");
		goto fail;
	}
	if (p->n == 0) {
		errmsg_set(err, errlen, "fork '%s' reported no change", f->name);
		r = -ENODATA;
		goto fail;
	}
	if ((p->fd = openat(u->chg.state_fd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600)) < 0) {
		r = -errno;
		errmsg_set(err, errlen, "a temporary file in %s for the changes of fork '%s': %s", u->state_dir,
			   f->name, strerror(-r));
		goto fail;
	}
	if ((r = wb_replay_new(p->fd, &p->replay)) < 0 || (r = ask_next(p)) < 0) {
		errmsg_set(err, errlen, "asking fork '%s' for its changes: %s", f->name, strerror(-r));
		if (p->stream)
			chan_stream_close(f->chan, p->stream);
		goto fail;
	}
	f->pull = p;
	return 0;
fail:
	pull_free(p);
	return r;
}

/* A group is complete: its paths into the archive, then the next group. */
static void group_done(struct up_forkpull *p)
{
	char why[600] = "";
	const char *w;
	int r;

	if ((r = wb_replay_add(p->replay, p->wp, why, sizeof(why))) < 0) {
		pull_end(p, r, why, false);
		return;
	}
	for (size_t i = 0; i < p->gend - p->gstart; i++) {
		const struct wb_change *c = wb_pull_got(p->wp, i, &w);
		if (c && S_ISREG(c->st_mode))
			p->cap_left -= c->size < p->cap_left ? c->size : p->cap_left;
	}
	if (p->gend >= p->n) {
		pull_end(p, 0, "", false);
		return;
	}
	if ((r = ask_next(p)) < 0)
		pull_end(p, r, "asking for the next paths", true);
}

bool up_forkpull_frame(struct up_fork *f, uint8_t type, uint32_t stream, const uint8_t *data, size_t n)
{
	struct up_forkpull *p = f->pull;
	int r;

	if (!p || !p->stream || p->stream != stream)
		return false;
	if (f->chan)
		chan_consume(f->chan, stream, n);
	if ((r = wb_pull_frame(p->wp, type, data, n)) == 0)
		return true;
	if (r < 0) {
		pull_end(p, r, wb_pull_error(p->wp), type == WIRE_CHG_END);
		return true;
	}
	chan_stream_close(f->chan, stream);
	p->stream = 0;
	group_done(p);
	return true;
}

void up_forkpull_cancel(struct up_fork *f, const char *why)
{
	if (f->pull)
		pull_end(f->pull, -ENOTCONN, why, false);
}
