/* SPDX-License-Identifier: Apache-2.0 */
/*
 * prep: worker threads that read, check, judge and encode the small files
 * of the batches the engine is about to build. Contract in
 * include/airlock/sync/prep.h; why and how in doc/SYNC.md §8.
 *
 * The jobs are a ring in submission order, indexed by three counters:
 * head (the oldest not popped) <= claim (the oldest no worker took) <=
 * tail (the next to submit). Workers take at claim, so jobs start in
 * order; they finish in any order, and the engine takes only the head.
 */
#include "airlock/sync/prep.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/content/delta.h"
#include "airlock/content/manifest.h"
#include "airlock/core/mem.h"

enum job_state { J_QUEUED, J_WORKING, J_DONE };

struct slot {
	struct prep_job job; /* job.path owned */
	enum job_state state;
	size_t off, len; /* the record's room in the arena */
	size_t charge;	 /* len and the arena's end it skipped to wrap */
	size_t nrec;
	int r;
	bool judged;
	struct withhold_judgement j;
};

struct worker {
	struct prep *p;
	pthread_t tid;
	struct delta_cctx *cctx;
	uint8_t *data; /* one file's bytes */
	size_t cap;
};

struct prep {
	int dirfd;
	int level;
	int efd;
	unsigned nw;
	struct worker w[PREP_THREADS_MAX];
	pthread_mutex_t lock;
	pthread_cond_t work; /* a job was queued, or stop */
	pthread_cond_t done; /* a job was done */
	/* The records, in one arena used first in, first out: a job takes
	 * DELTA_CHUNK_REC_MAX(size) bytes after the last one when submitted
	 * and gives them back when popped, in the same order. No allocation
	 * per file, and at most max_bytes, whatever the files. */
	uint8_t *arena;
	size_t acap;
	/* protected by lock */
	struct slot v[PREP_JOBS_MAX];
	uint64_t head, claim, tail;
	size_t a_head, a_tail; /* the oldest record's room, the next free byte */
	size_t used;	       /* arena bytes the pending jobs hold */
	unsigned busy;	       /* workers holding a job */
	bool want;	       /* the engine waits for the head: signal efd */
	bool stop;
};

static struct slot *slot_at(struct prep *p, uint64_t i)
{
	return &p->v[i % PREP_JOBS_MAX];
}

/* The job's bytes, checked against what the scan recorded, judged and
 * encoded into s->rec. Runs on a worker without the lock: s is the
 * worker's alone while J_WORKING. */
static void run_job(struct worker *w, struct slot *s)
{
	const struct prep_job *j = &s->job;
	uint8_t h[CHUNK_HASH_LEN];
	struct stat st;
	int r, fd = manifest_open_beneath(w->p->dirfd, j->path, O_RDONLY | O_NONBLOCK | O_NOCTTY, false);

	if (fd < 0) {
		s->r = fd == -ELOOP ? -ESTALE : fd;
		return;
	}
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || (uint64_t)st.st_size != j->size) {
		r = -ESTALE;
		goto out;
	}
	if (j->size > w->cap) {
		uint8_t *nd = mem_alloc((size_t)j->size);
		if (!nd) {
			r = -ENOMEM;
			goto out;
		}
		if (w->data)
			sodium_memzero(w->data, w->cap);
		mem_free(w->data);
		w->data = nd;
		w->cap = (size_t)j->size;
	}
	if (j->size && (r = chunk_read_fd(&fd, 0, w->data, (size_t)j->size)) < 0)
		goto out;
	chunk_hash(j->size ? w->data : (const uint8_t *)"", (size_t)j->size, h);
	if (memcmp(h, j->hash, CHUNK_HASH_LEN) != 0) {
		r = -ESTALE;
		goto out;
	}
	if (j->scan && j->size) {
		withhold_judge(w->data, (size_t)j->size, &s->j);
		s->judged = true;
		if (s->j.hit) {
			sodium_memzero(w->data, (size_t)j->size); /* never leaves this thread */
			r = 0;
			goto out;
		}
	}
	r = j->size
		? delta_chunk_encode(w->cctx, w->p->level, w->data, (size_t)j->size, h, w->p->arena + s->off, &s->nrec)
		: 0;
out:
	s->r = r;
	close(fd);
}

static void wake_engine(struct prep *p)
{
	uint64_t one = 1;

	while (write(p->efd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

static void *worker_main(void *arg)
{
	struct worker *w = arg;
	struct prep *p = w->p;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		while (!p->stop && p->claim == p->tail)
			pthread_cond_wait(&p->work, &p->lock);
		if (p->stop)
			break;
		uint64_t i = p->claim++;
		struct slot *s = slot_at(p, i);
		s->state = J_WORKING;
		p->busy++;
		pthread_mutex_unlock(&p->lock);
		run_job(w, s);
		pthread_mutex_lock(&p->lock);
		s->state = J_DONE;
		p->busy--;
		pthread_cond_broadcast(&p->done);
		if (i == p->head && p->want) {
			p->want = false;
			wake_engine(p);
		}
	}
	pthread_mutex_unlock(&p->lock);
	return NULL;
}

int prep_new(int dirfd, unsigned threads, size_t max_bytes, int level, struct prep **out)
{
	struct prep *p;
	int r = 0;

	*out = NULL;
	if (!threads) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);
		threads = n > 0 ? (unsigned)n : 1;
	}
	if (threads > PREP_THREADS_MAX)
		threads = PREP_THREADS_MAX;
	if (!max_bytes)
		return -EINVAL;
	if (!(p = mem_calloc(1, sizeof(*p))))
		return -ENOMEM;
	p->dirfd = dirfd;
	p->level = level;
	p->acap = max_bytes;
	if (!(p->arena = mem_alloc(max_bytes))) {
		mem_free(p);
		return -ENOMEM;
	}
	if ((p->efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
		r = -errno;
		mem_free(p->arena);
		mem_free(p);
		return r;
	}
	pthread_mutex_init(&p->lock, NULL);
	pthread_cond_init(&p->work, NULL);
	pthread_cond_init(&p->done, NULL);
	for (unsigned i = 0; i < threads; i++) {
		struct worker *w = &p->w[i];
		w->p = p;
		if (!(w->cctx = delta_cctx_new())) {
			r = -ENOMEM;
			break;
		}
		if ((r = -pthread_create(&w->tid, NULL, worker_main, w)) < 0) {
			delta_cctx_free(w->cctx);
			w->cctx = NULL;
			break;
		}
		p->nw++;
	}
	if (p->nw == 0) {
		prep_free(p);
		return r < 0 ? r : -EAGAIN;
	}
	*out = p; /* fewer workers than asked when some could not start */
	return 0;
}

/* Give the head's record room back (jobs are popped in order). Must hold
 * p->lock. */
static void slot_release(struct prep *p, struct slot *s)
{
	mem_free((char *)s->job.path);
	p->a_head = s->off + s->len;
	p->used -= s->charge;
	if (!p->used)
		p->a_head = p->a_tail = 0;
	memset(s, 0, sizeof(*s));
}

/* Room for n bytes after the newest record, wrapping to the arena's start
 * when its end is too short: the offset, and what it costs in *charge;
 * -EAGAIN when the pending records leave no such room. Must hold p->lock. */
static long arena_take(struct prep *p, size_t n, size_t *charge)
{
	bool wrapped = p->used && p->a_tail <= p->a_head;
	size_t off;

	if (!wrapped && p->acap - p->a_tail >= n) {
		off = p->a_tail;
		*charge = n;
	} else if (!wrapped && p->a_head >= n) {
		off = 0;
		*charge = p->acap - p->a_tail + n; /* the end it skips */
	} else if (wrapped && p->a_head - p->a_tail >= n) {
		off = p->a_tail;
		*charge = n;
	} else {
		return -EAGAIN;
	}
	p->a_tail = off + n;
	p->used += *charge;
	return (long)off;
}

static void drain_efd(struct prep *p)
{
	uint64_t v;

	while (read(p->efd, &v, sizeof(v)) < 0 && errno == EINTR)
		;
}

void prep_cancel(struct prep *p)
{
	pthread_mutex_lock(&p->lock);
	p->claim = p->tail; /* not started: never run */
	while (p->busy)
		pthread_cond_wait(&p->done, &p->lock);
	for (uint64_t i = p->head; i < p->tail; i++)
		slot_release(p, slot_at(p, i));
	p->head = p->claim = p->tail;
	p->want = false;
	pthread_mutex_unlock(&p->lock);
	drain_efd(p);
	/* between operations the arena's pages go back to the system (its
	 * page-aligned inside; the next operation faults them in again) */
	uintptr_t a = ((uintptr_t)p->arena + 4095) & ~(uintptr_t)4095,
		  e = ((uintptr_t)p->arena + p->acap) & ~(uintptr_t)4095;
	if (e > a)
		(void)madvise((void *)a, e - a, MADV_DONTNEED);
}

void prep_free(struct prep *p)
{
	if (!p)
		return;
	prep_cancel(p);
	pthread_mutex_lock(&p->lock);
	p->stop = true;
	pthread_cond_broadcast(&p->work);
	pthread_mutex_unlock(&p->lock);
	for (unsigned i = 0; i < p->nw; i++) {
		struct worker *w = &p->w[i];
		pthread_join(w->tid, NULL);
		delta_cctx_free(w->cctx);
		if (w->data)
			sodium_memzero(w->data, w->cap);
		mem_free(w->data);
	}
	pthread_cond_destroy(&p->work);
	pthread_cond_destroy(&p->done);
	pthread_mutex_destroy(&p->lock);
	close(p->efd);
	mem_free(p->arena);
	mem_free(p);
}

int prep_submit(struct prep *p, const struct prep_job *j)
{
	size_t len = DELTA_CHUNK_REC_MAX(j->size), charge;
	int r = 0;

	if (j->size > CHUNK_SIZE_LIMIT || len > p->acap)
		return -EFBIG;
	char *path = mem_strdup(j->path);
	if (!path)
		return -ENOMEM;
	pthread_mutex_lock(&p->lock);
	long off = p->tail - p->head >= PREP_JOBS_MAX ? -EAGAIN : arena_take(p, len, &charge);
	if (off < 0) {
		r = (int)off;
	} else {
		struct slot *s = slot_at(p, p->tail++);
		s->job = *j;
		s->job.path = path;
		s->state = J_QUEUED;
		s->off = (size_t)off;
		s->len = len;
		s->charge = charge;
		path = NULL;
		pthread_cond_signal(&p->work);
	}
	pthread_mutex_unlock(&p->lock);
	mem_free(path);
	return r;
}

int prep_head(struct prep *p, bool wait, struct prep_out *o)
{
	int r;

	pthread_mutex_lock(&p->lock);
	for (;;) {
		if (p->head == p->tail) {
			r = -ENOENT;
			break;
		}
		struct slot *s = slot_at(p, p->head);
		if (s->state == J_DONE) {
			*o = (struct prep_out){.tag = s->job.tag,
					       .r = s->r,
					       .judged = s->judged,
					       .j = s->j,
					       .rec = p->arena + s->off,
					       .nrec = s->nrec};
			r = 1;
			break;
		}
		if (!wait) {
			p->want = true;
			r = 0;
			break;
		}
		pthread_cond_wait(&p->done, &p->lock);
	}
	pthread_mutex_unlock(&p->lock);
	if (r != 0)
		drain_efd(p); /* a wake-up for a head already taken */
	return r;
}

void prep_pop(struct prep *p)
{
	pthread_mutex_lock(&p->lock);
	if (p->head < p->tail) {
		struct slot *s = slot_at(p, p->head);
		if (p->claim == p->head)
			p->claim++; /* not started: never run */
		while (s->state == J_WORKING)
			pthread_cond_wait(&p->done, &p->lock);
		slot_release(p, s);
		p->head++;
		p->want = false;
	}
	pthread_mutex_unlock(&p->lock);
}

size_t prep_pending(const struct prep *p)
{
	struct prep *q = (struct prep *)p; /* the lock only */
	pthread_mutex_lock(&q->lock);
	size_t n = (size_t)(q->tail - q->head);
	pthread_mutex_unlock(&q->lock);
	return n;
}

int prep_fd(const struct prep *p)
{
	return p->efd;
}

unsigned prep_threads(const struct prep *p)
{
	return p->nw;
}
