/* SPDX-License-Identifier: Apache-2.0 */
/* hostrun: a helper program on the host's loop, output captured (hostrun.h). */
#include "airlock/host/hostrun.h"

#include <errno.h>
#include <sodium.h>
#include <string.h>

#include "airlock/core/mem.h"
#include "airlock/exec/exec.h"

struct hostrun {
	struct exec *e;
	hostrun_done_fn *done;
	void *ud;
	unsigned char *out; /* sodium_malloc(max_out) */
	size_t out_len, max_out;
	bool too_big, ended;
	char err[HOSTRUN_ERR_TAIL + 1];
	size_t err_len;
};

static void hr_output(struct exec *e, int stream, const void *data, size_t n, void *ud)
{
	struct hostrun *h = ud;
	const unsigned char *p = data;

	if (stream == 2) {
		/* keep the last HOSTRUN_ERR_TAIL bytes */
		if (n >= HOSTRUN_ERR_TAIL) {
			memcpy(h->err, p + n - HOSTRUN_ERR_TAIL, HOSTRUN_ERR_TAIL);
			h->err_len = HOSTRUN_ERR_TAIL;
		} else {
			if (h->err_len + n > HOSTRUN_ERR_TAIL) {
				size_t drop = h->err_len + n - HOSTRUN_ERR_TAIL;
				memmove(h->err, h->err + drop, h->err_len - drop);
				h->err_len -= drop;
			}
			memcpy(h->err + h->err_len, p, n);
			h->err_len += n;
		}
		return;
	}
	if (h->too_big)
		return;
	if (n > h->max_out - h->out_len) {
		h->too_big = true;
		exec_cancel(e);
		return;
	}
	memcpy(h->out + h->out_len, p, n);
	h->out_len += n;
}

static void hr_exit(struct exec *e, const struct exec_result *r, void *ud)
{
	struct hostrun *h = ud;
	struct hostrun_result res = {
	    .exit_code = r->exit_code,
	    .exec_errno = r->exec_errno,
	    .timed_out = r->timed_out,
	    .too_big = h->too_big,
	    .out = h->out,
	    .out_len = h->out_len,
	    .err_tail = h->err,
	};
	(void)e;
	for (size_t i = 0; i < h->err_len; i++)
		if ((unsigned char)h->err[i] < 0x20 && h->err[i] != '\n' && h->err[i] != '\t')
			h->err[i] = '?';
	h->err[h->err_len] = '\0';
	h->ended = true;
	h->done(h, &res, h->ud);
}

static const struct exec_ops hr_ops = {
    .on_output = hr_output,
    .on_exit = hr_exit,
};

int hostrun_start(struct loop *l, const struct hostrun_req *req, hostrun_done_fn *done, void *ud, struct hostrun **out)
{
	struct hostrun *h;
	int r;

	if (!req || !req->argv || !req->argv[0] || !req->max_out || !req->timeout_ms || !done || !out)
		return -EINVAL;
	if (sodium_init() < 0 || !(h = mem_calloc(1, sizeof(*h))))
		return -ENOMEM;
	if (!(h->out = sodium_malloc(req->max_out))) {
		mem_free(h);
		return -ENOMEM;
	}
	h->max_out = req->max_out;
	h->done = done;
	h->ud = ud;
	struct exec_req q = {
	    .argv = req->argv,
	    .root_fd = req->dir_fd,
	    .cwd = req->cwd,
	    .envp = req->envp,
	    .timeout_ms = req->timeout_ms,
	    .grace_ms = 500,
	    .drain_ms = 200,
	    .uid = EXEC_ID_KEEP,
	    .gid = EXEC_ID_KEEP,
	};
	if ((r = exec_start(l, NULL, &q, &hr_ops, h, &h->e)) < 0) {
		h->e = NULL;
		hostrun_free(h);
		return r;
	}
	*out = h;
	return 0;
}

void hostrun_free(struct hostrun *h)
{
	if (!h)
		return;
	exec_free(h->e);
	sodium_free(h->out); /* sodium_free wipes */
	sodium_memzero(h, sizeof(*h));
	mem_free(h);
}
