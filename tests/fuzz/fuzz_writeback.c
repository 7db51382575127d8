/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the host's decoder of a pull's answer from the guest (writeback.h:
 * CHG_FILE / CHG_DATA / CHG_END, doc/PROTOCOL.md "Changes") and, when the
 * guest's answer is complete, the confined write of what it brought.
 * Invariants: nothing but the asked paths ever appears in the workspace,
 * and a refused pull writes nothing.
 *
 * Input: frames, each u8 type (mod 3: FILE, DATA, END), u16 length
 * (big-endian), payload. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <sodium.h>

#include "airlock/content/apply.h"
#include "airlock/core/buf.h"
#include "airlock/core/wire.h"
#include "airlock/sync/writeback.h"
#include "fuzz.h"

static const char *const asked[] = {"a.txt", "d", "d/link"};
static const uint8_t types[3] = {WIRE_CHG_FILE, WIRE_CHG_DATA, WIRE_CHG_END};
static char root[64];
static int tmpfd = -1;
static uint8_t sk[64], pk[32], scope[32];

static void setup(void)
{
	if (tmpfd >= 0)
		return;
	if (sodium_init() < 0)
		abort();
	crypto_sign_keypair(pk, sk);
	randombytes_buf(scope, sizeof(scope));
	snprintf(root, sizeof(root), "/tmp/fuzz-writeback-XXXXXX");
	if (!mkdtemp(root) || (tmpfd = open("/tmp", O_RDONLY | O_DIRECTORY)) < 0)
		abort();
}

static int rm_one(const char *path, const struct stat *st, int flag, struct FTW *ftw)
{
	(void)st;
	(void)flag;
	if (ftw->level > 0)
		remove(path);
	return 0;
}

/* Only asked names at the top (a.txt, d); empty it again. */
static void check_and_clear(void)
{
	DIR *d = opendir(root);
	struct dirent *de;

	FUZZ_ASSERT(d);
	while ((de = readdir(d))) {
		if (!strcmp(de->d_name, ".") || !strcmp(de->d_name, ".."))
			continue;
		FUZZ_ASSERT(!strcmp(de->d_name, "a.txt") || !strcmp(de->d_name, "d"));
	}
	closedir(d);
	nftw(root, rm_one, 16, FTW_DEPTH | FTW_PHYS);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct wb_pull_cfg cfg = {.paths = asked,
				  .n = 3,
				  .max_bytes = 1 << 20,
				  .cap_name = "workspace.writeback_max_mib",
				  .chunking = &chunk_params_default};
	struct wb_pull *p;
	int r = 0;

	setup();
	cfg.tmp_dirfd = tmpfd;
	if (wb_pull_new(&cfg, &p) < 0)
		return 0;
	while (size >= 3 && r == 0) {
		uint8_t t = types[data[0] % 3];
		size_t n = (size_t)data[1] << 8 | data[2];
		if (n > size - 3)
			n = size - 3;
		r = wb_pull_frame(p, t, data + 3, n);
		data += 3 + n;
		size -= 3 + n;
	}
	if (r == 1) {
		struct apply *a;
		bool done[3];
		char err[256];
		if (apply_open(root, NULL, &a) == 0) {
			r = wb_pull_write(p, a, sk, pk, scope, done, err, sizeof(err));
			for (size_t i = 0; i < 3; i++) {
				const char *why;
				FUZZ_ASSERT(!done[i] || wb_pull_got(p, i, &why)); /* only what was received whole */
			}
			apply_free(a);
		}
	} else if (r < 0) {
		FUZZ_ASSERT(wb_pull_error(p)[0]);
	}
	check_and_clear();
	wb_pull_free(p);
	return 0;
}

static void put_frame(struct buf *b, unsigned t, const struct buf *payload)
{
	buf_put_u8(b, (uint8_t)t);
	buf_put_u16(b, (uint16_t)buf_len(payload));
	buf_put(b, buf_ptr(payload), buf_len(payload));
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static struct buf b;
	struct buf f;
	struct wire_chg_item file = {.path = "a.txt", .st_mode = S_IFREG | 0644, .size = 5, .flags = WIRE_CHG_F_HASHED};
	struct wire_chg_item dir = {.path = "d", .st_mode = S_IFDIR | 0755};
	struct wire_chg_item link = {
	    .path = "d/link", .st_mode = S_IFLNK | 0777, .size = 8, .flags = WIRE_CHG_F_HASHED, .target = "../a.txt"};
	struct wire_chg_item gone = {.path = "a.txt"};
	struct wire_error end = {.code = 0, .msg = ""};

	if (i >= 2)
		return 0;
	chunk_hash("hello", 5, file.hash);
	chunk_hash("../a.txt", 8, link.hash);
	buf_clear(&b);
	buf_init(&b, 1 << 16);
	buf_init(&f, 1 << 16);
	wire_chg_item_encode(&f, i ? &gone : &file);
	put_frame(&b, 0, &f);
	if (!i) {
		buf_reset(&f);
		buf_put(&f, "hello", 5);
		put_frame(&b, 1, &f);
	}
	buf_reset(&f);
	wire_chg_item_encode(&f, &dir);
	put_frame(&b, 0, &f);
	buf_reset(&f);
	wire_chg_item_encode(&f, &link);
	put_frame(&b, 0, &f);
	buf_reset(&f);
	wire_error_encode(&f, &end);
	put_frame(&b, 2, &f);
	buf_clear(&f);
	*out = buf_ptr(&b);
	return buf_len(&b);
}
