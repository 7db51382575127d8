/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the persisted scan state's loader and the walk over what it
 * parsed (scanstate.h, doc/SYNC.md "Unchanged trees"): the file is parsed
 * and walked before its MAC is known, so neither may trust a byte of it.
 * Any input is refused or taken; a tampered one is never taken, and the
 * walk stays beneath its root.
 *
 * Input: the file's bytes. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "airlock/content/scanstate.h"
#include "fuzz.h"

static const uint8_t key[SCANSTATE_KEY_LEN] = {7};
static const uint8_t fp[SCANSTATE_FP_LEN] = {5};
static char dir[64];
static int dfd = -1, tfd = -1; /* the work directory; the tree beneath it */

static void put(const char *path, const char *text)
{
	int fd = openat(tfd, path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	FUZZ_ASSERT(fd >= 0);
	FUZZ_ASSERT(write(fd, text, strlen(text)) == (ssize_t)strlen(text));
	close(fd);
}

static void cleanup(void)
{
	static const char *const files[] = {"tree/d/e/c", "tree/d/b", "tree/a", "tree/link", "seed", "in"};
	static const char *const dirs[] = {"tree/d/e", "tree/d", "tree"};
	for (size_t i = 0; i < sizeof(files) / sizeof(files[0]); i++)
		unlinkat(dfd, files[i], 0);
	for (size_t i = 0; i < sizeof(dirs) / sizeof(dirs[0]); i++)
		unlinkat(dfd, dirs[i], AT_REMOVEDIR);
	rmdir(dir);
}

/* A small tree and its saved state, once. */
static void init(void)
{
	if (dfd >= 0)
		return;
	snprintf(dir, sizeof(dir), "/tmp/airlock-fuzz-sstate.XXXXXX");
	FUZZ_ASSERT(mkdtemp(dir) != NULL);
	FUZZ_ASSERT((dfd = open(dir, O_RDONLY | O_DIRECTORY)) >= 0);
	atexit(cleanup);
	FUZZ_ASSERT(mkdirat(dfd, "tree", 0755) == 0);
	FUZZ_ASSERT((tfd = openat(dfd, "tree", O_RDONLY | O_DIRECTORY)) >= 0);
	FUZZ_ASSERT(mkdirat(tfd, "d", 0755) == 0 && mkdirat(tfd, "d/e", 0755) == 0);
	put("a", "a\n");
	put("d/b", "bb\n");
	put("d/e/c", "ccc\n");
	FUZZ_ASSERT(symlinkat("a", tfd, "link") == 0);
	sleep(1); /* nothing racy */
	struct scanstate *st;
	struct manifest *m;
	FUZZ_ASSERT(scanstate_new(&st) == 0);
	scanstate_begin(st, tfd);
	struct manifest_scan_opts o = {.seen = scanstate_seen, .seen_ud = st};
	FUZZ_ASSERT(manifest_scan(tfd, &o, &m) == 0);
	FUZZ_ASSERT(scanstate_save(st, dfd, "seed", m, key, fp, "x", 1) == 0);
	manifest_free(m);
	scanstate_free(st);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct scanstate *st;

	init();
	int fd = openat(dfd, "in", O_WRONLY | O_CREAT | O_TRUNC, 0600);
	FUZZ_ASSERT(fd >= 0);
	FUZZ_ASSERT(size == 0 || write(fd, data, size) == (ssize_t)size);
	close(fd);
	int r = scanstate_load(dfd, "in", key, fp, SCANSTATE_LOAD_DECODE, &st);
	FUZZ_ASSERT(r == 0 || r == -EBADMSG || r == -ENOMEM);
	if (r < 0)
		return 0;
	r = scanstate_verify(st, tfd, 2, NULL);
	FUZZ_ASSERT(r == 1 || r == 0 || r == -EBADMSG || r == -ENOMEM);
	/* taken (authentic and the tree as saved): only the seed itself */
	size_t sl = 0;
	uint8_t *seed = NULL;
	if (r == 1) {
		int sfd = openat(dfd, "seed", O_RDONLY);
		struct stat sb;
		FUZZ_ASSERT(sfd >= 0 && fstat(sfd, &sb) == 0);
		sl = (size_t)sb.st_size;
		FUZZ_ASSERT((seed = malloc(sl ? sl : 1)) != NULL);
		FUZZ_ASSERT(read(sfd, seed, sl) == (ssize_t)sl);
		close(sfd);
		FUZZ_ASSERT(sl == size && !memcmp(seed, data, size));
		struct manifest *m;
		FUZZ_ASSERT(scanstate_manifest(st, &m) == 0);
		manifest_free(m);
	}
	free(seed);
	scanstate_free(st);
	return 0;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static uint8_t buf[1 << 16];
	init();
	if (i > 0)
		return 0;
	int fd = openat(dfd, "seed", O_RDONLY);
	FUZZ_ASSERT(fd >= 0);
	ssize_t n = read(fd, buf, sizeof(buf));
	close(fd);
	FUZZ_ASSERT(n > 0);
	*out = buf;
	return (size_t)n;
}
