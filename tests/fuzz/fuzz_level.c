/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the two decoders the host's sync engine runs on what the guest
 * answers during reconcile (doc/SYNC.md "Reconcile without sending the
 * tree"): a SYNC_LEVEL's level bytes (manifest_level_open/_next) and a
 * SYNC_ENTRY's entry (manifest_entry_decode).
 *
 * Input: one byte picks the decoder and, for a level, the directory it
 * answers for; the rest is the payload. */
#include <errno.h>
#include <string.h>

#include "airlock/content/chunk.h"
#include "airlock/content/manifest.h"
#include "airlock/core/buf.h"
#include "fuzz.h"

static const char *const dirs[] = {"", "src", "a/b/c"};

static void fuzz_level(const char *dir, const uint8_t *p, size_t n)
{
	struct manifest_level_reader lr;
	struct manifest_entry e;
	size_t dl = strlen(dir), seen = 0;
	int r;

	if (manifest_level_open(&lr, dir, p, n) < 0)
		return;
	FUZZ_ASSERT((size_t)lr.count * 34 <= n); /* a count the bytes can hold */
	char prev[MANIFEST_PATH_MAX + 1] = "";
	while ((r = manifest_level_next(&lr, &e)) == 1) {
		size_t pl = strlen(e.path);
		/* a child of dir, one valid component deeper, in increasing order */
		FUZZ_ASSERT(e.path == lr.path && pl <= MANIFEST_PATH_MAX);
		FUZZ_ASSERT(manifest_path_check(e.path, pl) == 0);
		FUZZ_ASSERT(!dl || (pl > dl + 1 && !memcmp(e.path, dir, dl) && e.path[dl] == '/'));
		FUZZ_ASSERT(!strchr(e.path + (dl ? dl + 1 : 0), '/'));
		FUZZ_ASSERT(!seen || strcmp(prev, e.path) < 0);
		memcpy(prev, e.path, pl + 1);
		seen++;
	}
	FUZZ_ASSERT(r == 0 || r == -EBADMSG);
	FUZZ_ASSERT(r < 0 || seen == lr.count);
}

static void fuzz_entry(const uint8_t *p, size_t n)
{
	struct manifest_entry e;
	struct buf in, out;

	buf_view(&in, p, n);
	if (manifest_entry_decode(&in, &chunk_params_default, &e) < 0) {
		FUZZ_ASSERT(buf_len(&in) == n); /* consumed only when the whole entry decodes */
		FUZZ_ASSERT(!e.path && !e.target && !e.chunks);
		return;
	}
	/* what decodes re-encodes to exactly the bytes it came from */
	size_t used = n - buf_len(&in);
	buf_init(&out, 1u << 24);
	FUZZ_ASSERT(manifest_entry_encode(&e, &out) == 0);
	FUZZ_ASSERT(buf_len(&out) == used && !memcmp(buf_ptr(&out), p, used));
	buf_clear(&out);
	manifest_entry_clear(&e);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	unsigned sel = data[0] % 4;
	if (sel < 3)
		fuzz_level(dirs[sel], data + 1, size - 1);
	else
		fuzz_entry(data + 1, size - 1);
	return 0;
}

/* Seeds: the levels of a small sealed manifest, as the guest sends them,
 * and its entries. */
size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static struct buf b;
	struct manifest *m = NULL;
	struct manifest_entry ents[] = {
	    {.path = "a", .type = MANIFEST_DIR, .mode = 0755},
	    {.path = "a/b", .type = MANIFEST_DIR, .mode = 0755},
	    {.path = "a/b/c", .type = MANIFEST_DIR, .mode = 0700},
	    {.path = "a/b/c/x.txt", .type = MANIFEST_FILE, .mode = 0644, .size = 3},
	    {.path = "latest", .type = MANIFEST_SYMLINK, .target = "src/main.c"},
	    {.path = "src", .type = MANIFEST_DIR, .mode = 0755},
	    {.path = "src/main.c", .type = MANIFEST_FILE, .mode = 0644, .size = 5},
	    {.path = "src/z-last", .type = MANIFEST_FILE, .mode = 0600, .size = 0},
	};
	size_t nents = sizeof(ents) / sizeof(ents[0]);

	if (i >= 3 + nents)
		return 0;
	buf_clear(&b);
	buf_init(&b, 1u << 20);
	ents[4].size = strlen(ents[4].target);
	chunk_hash((const uint8_t *)ents[4].target, ents[4].size, ents[4].hash);
	memset(ents[3].hash, 0x11, CHUNK_HASH_LEN);
	memset(ents[6].hash, 0x5a, CHUNK_HASH_LEN);
	chunk_hash(NULL, 0, ents[7].hash);
	if (manifest_new(NULL, &m) < 0)
		return 0;
	for (size_t k = 0; k < nents; k++)
		if (manifest_add(m, &ents[k]) < 0)
			goto out;
	if (manifest_seal(m) < 0)
		goto out;
	if (i < 3) {
		if (buf_put_u8(&b, (uint8_t)i) < 0 || manifest_level_encode(m, dirs[i], &b) < 0)
			buf_reset(&b);
	} else if (buf_put_u8(&b, 3) < 0 || manifest_entry_encode(&ents[i - 3], &b) < 0) {
		buf_reset(&b);
	}
	*out = buf_ptr(&b);
out:
	manifest_free(m);
	return buf_len(&b);
}
