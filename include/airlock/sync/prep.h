/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_PREP_H
#define AIRLOCK_PREP_H

/*
 * prep: the sync engine's worker threads, which prepare the PUTs of small
 * files off the engine's loop (doc/SYNC.md §8 "Preparing files on worker
 * threads").
 *
 * The engine submits jobs in op order (the whole files of at most
 * whole_max bytes that a batch sends inline). Each worker, one per CPU,
 * takes the oldest job no one has taken, opens the file beneath the
 * workspace (no symlinks), checks it is still a regular file of the
 * scanned size whose bytes hash to the scanned hash, scans its content for
 * secrets when asked (withhold_judge; a file a rule matches is wiped from
 * memory and not encoded), and encodes it as one inline chunk record
 * (delta_chunk_encode). The engine takes results back only at the head,
 * in the order it submitted them, whatever order the workers finish in:
 * the ops of a batch stay in op order and every verdict is recorded on the
 * engine's thread.
 *
 * Bounded: at most PREP_JOBS_MAX jobs not yet popped, and their records
 * in one arena of max_bytes allocated with the pool and used first in,
 * first out (a job holds DELTA_CHUNK_REC_MAX(size) bytes of it from
 * submit to pop; no allocation per file). Each worker holds one file's
 * bytes at a time. Between operations (prep_cancel) the arena's pages are
 * given back.
 *
 * Threads: the pool's functions are called from one thread (the engine's);
 * the workers never call back into it. prep_fd is readable (an eventfd)
 * once the head job is done after prep_head said it was not. Errors are
 * -errno.
 */

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "airlock/content/chunk.h"
#include "airlock/sync/withhold.h"

#define PREP_JOBS_MAX	 4096u
#define PREP_THREADS_MAX 8u

struct prep;

struct prep_job {
	uint64_t tag;		      /* the caller's (e.g. the change index), given back */
	const char *path;	      /* relative to the workspace; copied */
	uint64_t size;		      /* scanned size, at most CHUNK_SIZE_LIMIT */
	uint8_t hash[CHUNK_HASH_LEN]; /* scanned content hash */
	bool scan;		      /* judge the content (withhold_judge) */
};

struct prep_out {
	uint64_t tag;
	/* 0: the file still has the scanned content (rec, the chunk record;
	 * empty for an empty file or one the scan withholds); -ESTALE: it
	 * changed, or is no longer a regular file, since the scan; the
	 * open's error (-ENOENT: gone; -EACCES); -ENOMEM, -EIO. */
	int r;
	bool judged;		     /* the content was scanned: j holds the verdict */
	struct withhold_judgement j; /* j.hit: withheld, rec is empty */
	const uint8_t *rec;	     /* delta_put_encoded's record, owned by the pool */
	size_t nrec;		     /* until prep_pop */
};

/*
 * A pool of `threads` workers (0: one per online CPU; at most
 * PREP_THREADS_MAX) reading beneath dirfd (kept by the caller), encoding
 * at zstd `level`, its records in an arena of max_bytes. -ENOMEM, -EAGAIN
 * (no thread could be started), -EINVAL.
 */
int prep_new(int dirfd, unsigned threads, size_t max_bytes, int level, struct prep **out);
/* Cancels what is pending (prep_cancel), stops and joins the workers.
 * NULL is a no-op. */
void prep_free(struct prep *p);

/* Queue j behind every job submitted before. -EAGAIN when the bounds are
 * reached (pop first), -EFBIG when its record could never fit (size over
 * CHUNK_SIZE_LIMIT, or its record over max_bytes), -ENOMEM. */
int prep_submit(struct prep *p, const struct prep_job *j);
/* The oldest job not popped: 1 with *o filled when it is done (o->rec
 * valid until prep_pop), 0 when it is not done yet (prep_fd becomes
 * readable when it is; with wait, blocks until it is instead), -ENOENT
 * when nothing is pending. */
int prep_head(struct prep *p, bool wait, struct prep_out *o);
/* Drop the head job (done or not: one not done is cancelled, and waited
 * for when a worker has it). No-op when nothing is pending. */
void prep_pop(struct prep *p);
/* Drop every pending job: those not started are never run, those a worker
 * has are waited for; afterwards no worker touches anything submitted
 * before, and nothing is pending. */
void prep_cancel(struct prep *p);
/* Jobs submitted and not popped. */
size_t prep_pending(const struct prep *p);
/* Readable once the head is done after prep_head returned 0 (the caller
 * reads it empty: prep_head does). */
int prep_fd(const struct prep *p);
unsigned prep_threads(const struct prep *p);

#endif
