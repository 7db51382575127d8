/* SPDX-License-Identifier: Apache-2.0 */
/* gpull: the guest side of CHG_PULL (gpull.h). */
#include "airlock/guest/gpull.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/content/manifest.h"
#include "airlock/core/buf.h"
#include "airlock/core/chan.h"
#include "airlock/core/mem.h"
#include "airlock/core/wire.h"
#include "airlock/guest/track.h"

struct gpull {
	struct chan *chan;
	uint32_t stream;
	int rootfd;
	struct chunk_params params;
	struct wire_sync_req q;
	uint32_t next;	    /* next path to describe */
	int fd;		    /* the file being sent, or -1 */
	uint64_t off, size; /* its bytes sent / to send */
	int err;	    /* first error, for CHG_END */
	char msg[256];
	struct buf frame; /* one frame waiting for window (type in ftype) */
	uint8_t ftype;
	bool have_frame, ended;
};

int gpull_new(struct chan *c, uint32_t stream, int rootfd, const struct chunk_params *params, const uint8_t *p,
	      size_t n, struct gpull **out)
{
	struct gpull *g;
	struct buf in;
	int r;

	*out = NULL;
	if (!(g = mem_calloc(1, sizeof(*g))))
		return -ENOMEM;
	buf_view(&in, p, n);
	if ((r = wire_sync_req_decode(&in, &g->q)) < 0) {
		mem_free(g);
		return r;
	}
	for (uint32_t i = 0; i < g->q.n; i++) {
		if (manifest_path_check(g->q.names[i], strlen(g->q.names[i])) < 0) {
			wire_sync_req_clear(&g->q);
			mem_free(g);
			return -EBADMSG;
		}
	}
	g->chan = c;
	g->stream = stream;
	g->rootfd = rootfd;
	g->params = *params;
	g->fd = -1;
	buf_init(&g->frame, WIRE_PAYLOAD_MAX);
	*out = g;
	return 0;
}

void gpull_free(struct gpull *g)
{
	if (!g)
		return;
	if (g->fd >= 0)
		close(g->fd);
	wire_sync_req_clear(&g->q);
	buf_clear(&g->frame);
	mem_free(g);
}

uint32_t gpull_stream(const struct gpull *g)
{
	return g->stream;
}

/* Describe the next path into the pending frame; open a file to send. */
static int next_file(struct gpull *g)
{
	const char *path = g->q.names[g->next++];
	struct wire_chg_item it = {.path = (char *)path};
	int r;

	if ((r = track_describe(g->rootfd, path, &g->params, &it)) < 0) {
		it = (struct wire_chg_item){.path = (char *)path};
		if (!g->err) {
			g->err = -r;
			snprintf(g->msg, sizeof(g->msg), "%.200s: %s", path, strerror(-r));
		}
	}
	if (S_ISREG(it.st_mode) && (it.flags & WIRE_CHG_F_HASHED) && it.size) {
		g->fd = manifest_open_beneath(g->rootfd, path, O_RDONLY | O_NONBLOCK, false);
		struct stat st;
		if (g->fd >= 0 && (fstat(g->fd, &st) < 0 || !S_ISREG(st.st_mode))) {
			close(g->fd);
			g->fd = -1;
		}
		if (g->fd < 0) /* gone since described: as gone */
			it = (struct wire_chg_item){.path = (char *)path};
		g->off = 0;
		g->size = it.size;
	} /* a file over TRACK_HASH_MAX is described, never sent: the host refuses it */
	buf_reset(&g->frame);
	r = wire_chg_item_encode(&g->frame, &it);
	mem_free(it.target);
	g->ftype = WIRE_CHG_FILE;
	g->have_frame = r == 0;
	return r;
}

/* The next CHG_DATA frame of the open file. A short read (the file
 * shrank) sends zeros: the host's hash check refuses the file. */
static int next_data(struct gpull *g)
{
	size_t k = g->size - g->off < WIRE_PAYLOAD_MAX ? (size_t)(g->size - g->off) : WIRE_PAYLOAD_MAX;
	uint8_t *dst;

	buf_reset(&g->frame);
	if (buf_reserve(&g->frame, k, &dst) < 0)
		return -ENOMEM;
	ssize_t got = pread(g->fd, dst, k, (off_t)g->off);
	if (got < 0)
		got = 0;
	if ((size_t)got < k)
		memset(dst + got, 0, k - (size_t)got);
	buf_commit(&g->frame, k);
	g->off += k;
	if (g->off >= g->size) {
		close(g->fd);
		g->fd = -1;
	}
	g->ftype = WIRE_CHG_DATA;
	g->have_frame = true;
	return 0;
}

static int make_end(struct gpull *g)
{
	struct wire_error m = {.code = (uint32_t)g->err, .msg = g->msg};

	buf_reset(&g->frame);
	g->ftype = WIRE_CHG_END;
	g->have_frame = true;
	g->ended = true;
	return wire_error_encode(&g->frame, &m);
}

int gpull_pump(struct gpull *g)
{
	int r;

	for (;;) {
		if (!g->have_frame) {
			if (g->fd >= 0)
				r = next_data(g);
			else if (g->ended)
				return 1;
			else if (g->next < g->q.n)
				r = next_file(g);
			else
				r = make_end(g);
			if (r < 0)
				return r;
		}
		if ((r = chan_send(g->chan, g->ftype, g->stream, buf_ptr(&g->frame), buf_len(&g->frame))) == -EAGAIN)
			return 0;
		if (r < 0)
			return r;
		g->have_frame = false;
	}
}
