/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fsworkload: a seeded random file-system workload for the live-sync tests.
 *
 *   fsworkload DIR SEED N
 *
 * Runs N operations inside DIR, each on paths drawn from a small fixed pool
 * (so operations collide: renames over existing files, writes to linked
 * files, rmdir of directories that just emptied): create, write at an
 * offset, append, truncate, rename (files, over existing ones, and whole
 * directories), hard link, symlink, chmod, unlink, mkdir, rmdir. Failures
 * (ENOENT, ENOTEMPTY, EISDIR, ...) are part of the workload and ignored.
 * Prints "ops N ok M" on stdout. Same SEED, same sequence of calls.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static uint64_t rng;

static uint64_t next(void)
{
	/* xorshift64* */
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 2685821657736338717ull;
}

static unsigned pick(unsigned n)
{
	return (unsigned)(next() % n);
}

static const char *const dirs[] = {".", "a", "b", "a/c", "b/d", "e", "a/c/g"};
#define NDIRS  (sizeof(dirs) / sizeof(dirs[0]))
#define NNAMES 12u

static void file_path(char *out, size_t n)
{
	snprintf(out, n, "%s/f%u", dirs[pick(NDIRS)], pick(NNAMES));
}

static const char *dir_path(void)
{
	return dirs[1 + pick(NDIRS - 1)];
}

static int fill_write(int fd, off_t off, size_t len)
{
	static char buf[65536];

	for (size_t i = 0; i < len; i++)
		buf[i] = (char)('a' + (next() % 26));
	return pwrite(fd, buf, len, off) == (ssize_t)len ? 0 : -1;
}

int main(int argc, char **argv)
{
	char p1[256], p2[256];
	unsigned long n, ok = 0;
	int fd, r;

	if (argc != 4) {
		fputs("usage: fsworkload DIR SEED N\n", stderr);
		return 2;
	}
	if (chdir(argv[1]) < 0) {
		perror(argv[1]);
		return 1;
	}
	rng = strtoull(argv[2], NULL, 10) * 0x9E3779B97F4A7C15ull + 1;
	n = strtoul(argv[3], NULL, 10);
	for (const char *const *d = dirs + 1; d < dirs + NDIRS; d++)
		mkdir(*d, 0755);
	for (unsigned long i = 0; i < n; i++) {
		file_path(p1, sizeof(p1));
		r = -1;
		switch (pick(14)) {
		case 0: /* create (or replace content) */
		case 1:
			if ((fd = open(p1, O_WRONLY | O_CREAT | O_TRUNC, 0644)) >= 0) {
				r = fill_write(fd, 0, pick(8192));
				close(fd);
			}
			break;
		case 2: /* write at an offset */
			if ((fd = open(p1, O_WRONLY)) >= 0) {
				r = fill_write(fd, (off_t)pick(200000), 1 + pick(65536));
				close(fd);
			}
			break;
		case 3: /* append */
			if ((fd = open(p1, O_WRONLY | O_APPEND | O_CREAT, 0644)) >= 0) {
				r = fill_write(fd, 0, 1 + pick(4096)); /* pwrite ignores the offset with O_APPEND */
				close(fd);
			}
			break;
		case 4:
			r = truncate(p1, (off_t)pick(100000));
			break;
		case 5: /* rename a file, often over an existing one */
			file_path(p2, sizeof(p2));
			r = rename(p1, p2);
			break;
		case 6: { /* rename a directory */
			const char *from = dir_path(), *to = dir_path();
			r = rename(from, to);
			break;
		}
		case 7:
			file_path(p2, sizeof(p2));
			r = link(p1, p2);
			break;
		case 8: {
			static const char *const targets[] = {"f1", "../a/f2", "/nonexistent/abs", "c", "."};
			r = symlink(targets[pick(5)], p1);
			break;
		}
		case 9:
			r = chmod(p1, pick(2) ? 0600 : (pick(2) ? 0755 : 0640));
			break;
		case 10:
			r = unlink(p1);
			break;
		case 11:
			r = mkdir(dir_path(), 0755);
			break;
		case 12:
			r = rmdir(dir_path());
			break;
		case 13:
			r = chmod(dir_path(), pick(4) ? 0755 : 0700);
			break;
		}
		if (r == 0)
			ok++;
	}
	printf("ops %lu ok %lu\n", n, ok);
	return 0;
}
