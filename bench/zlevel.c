/* SPDX-License-Identifier: Apache-2.0 */
/*
 * zlevel TREE [LEVEL...]: what each zstd level costs and gains on the
 * chunks an initial sync of TREE sends (doc/BENCH.md "Initial sync:
 * pipeline, level, memory"). Every regular file is read and cut like the
 * delta builder cuts it (one chunk up to whole_max, FastCDC above), and
 * every chunk is compressed at each level with one context, kept only
 * when it shrinks (as delta_put_inline does). Prints, per level, the bytes
 * that would go on the wire and the thread CPU time of compressing and
 * of decompressing them; "none" is the raw size. CPU time, not wall time:
 * the figure holds on a shared machine. Default levels: -1 1 3.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <zstd.h>

#include "airlock/content/chunk.h"

#define LEVELS_MAX 16

struct acc {
	int level;
	unsigned long long out, cns, dns;
};

struct run {
	struct acc a[LEVELS_MAX];
	int n;
	ZSTD_CCtx *cc;
	ZSTD_DCtx *dc;
	uint8_t *cbuf, *dbuf;
	size_t cap;
	unsigned long long files, chunks, raw;
};

static unsigned long long cpu_ns(void)
{
	struct timespec t;
	clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
	return (unsigned long long)t.tv_sec * 1000000000ull + (unsigned long long)t.tv_nsec;
}

static void one_chunk(struct run *r, const uint8_t *d, size_t len)
{
	r->chunks++;
	r->raw += len;
	for (int i = 0; i < r->n; i++) {
		unsigned long long t0 = cpu_ns();
		size_t cs = ZSTD_compressCCtx(r->cc, r->cbuf, r->cap, d, len, r->a[i].level);
		unsigned long long t1 = cpu_ns();
		r->a[i].cns += t1 - t0;
		if (ZSTD_isError(cs) || cs + 4 >= len) {
			r->a[i].out += len; /* sent raw */
			continue;
		}
		r->a[i].out += cs + 4;
		t0 = cpu_ns();
		size_t ds = ZSTD_decompressDCtx(r->dc, r->dbuf, r->cap, r->cbuf, cs);
		r->a[i].dns += cpu_ns() - t0;
		if (ZSTD_isError(ds) || ds != len || memcmp(r->dbuf, d, len)) {
			fprintf(stderr, "zlevel: round trip failed at level %d\n", r->a[i].level);
			exit(1);
		}
	}
}

static void one_file(struct run *r, int dfd, const char *name)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	struct stat st;
	if (fd < 0)
		return;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode) || st.st_size <= 0) {
		close(fd);
		return;
	}
	size_t n = (size_t)st.st_size;
	uint8_t *d = malloc(n);
	if (!d || chunk_read_fd(&fd, 0, d, n) < 0) {
		free(d);
		close(fd);
		return;
	}
	close(fd);
	r->files++;
	const struct chunk_params *p = &chunk_params_default;
	if (n <= p->whole_max) {
		one_chunk(r, d, n);
	} else {
		for (size_t off = 0; off < n;) {
			size_t c = chunk_cut(p, d + off, n - off);
			one_chunk(r, d + off, c);
			off += c;
		}
	}
	free(d);
}

static void walk(struct run *r, int dfd)
{
	DIR *dir = fdopendir(dfd);
	struct dirent *de;
	if (!dir) {
		close(dfd);
		return;
	}
	while ((de = readdir(dir))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		if (de->d_type == DT_DIR) {
			int sub = openat(dirfd(dir), de->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
			if (sub >= 0)
				walk(r, sub);
		} else if (de->d_type == DT_REG) {
			one_file(r, dirfd(dir), de->d_name);
		}
	}
	closedir(dir);
}

int main(int argc, char **argv)
{
	static struct run r;
	if (argc < 2) {
		fprintf(stderr, "usage: zlevel TREE [LEVEL...]\n");
		return 2;
	}
	static const int defaults[] = {-1, 1, 3};
	for (int i = 2; i < argc && r.n < LEVELS_MAX; i++)
		r.a[r.n++].level = atoi(argv[i]);
	for (size_t i = 0; r.n == 0 && i < sizeof(defaults) / sizeof(defaults[0]); i++)
		r.a[i].level = defaults[i];
	if (r.n == 0)
		r.n = 3;
	r.cap = ZSTD_compressBound(CHUNK_SIZE_LIMIT);
	r.cc = ZSTD_createCCtx();
	r.dc = ZSTD_createDCtx();
	r.cbuf = malloc(r.cap);
	r.dbuf = malloc(r.cap);
	int dfd = open(argv[1], O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (!r.cc || !r.dc || !r.cbuf || !r.dbuf || dfd < 0) {
		fprintf(stderr, "zlevel: %s: %s\n", argv[1], strerror(errno));
		return 1;
	}
	walk(&r, dfd);
	printf("%llu files, %llu chunks, %.1f MiB raw\n", r.files, r.chunks, (double)r.raw / (1 << 20));
	printf("| level | on the wire MiB | ratio | compress CPU s | MiB/s | decompress CPU s |\n");
	printf("|---|---:|---:|---:|---:|---:|\n");
	printf("| none | %.1f | 1.00 | 0 | - | 0 |\n", (double)r.raw / (1 << 20));
	for (int i = 0; i < r.n; i++) {
		struct acc *a = &r.a[i];
		printf("| %d | %.1f | %.2f | %.2f | %.0f | %.2f |\n", a->level, (double)a->out / (1 << 20),
		       (double)r.raw / (double)a->out, (double)a->cns / 1e9,
		       (double)r.raw / (1 << 20) / ((double)a->cns / 1e9), (double)a->dns / 1e9);
	}
	ZSTD_freeCCtx(r.cc);
	ZSTD_freeDCtx(r.dc);
	free(r.cbuf);
	free(r.dbuf);
	close(dfd);
	return 0;
}
