/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz manifest_decode: a manifest comes from the guest during reconcile. */
#include <string.h>

#include "airlock/content/manifest.h"
#include "airlock/core/buf.h"
#include "airlock/core/mem.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct manifest *m = NULL;
	struct buf out;

	if (manifest_decode(data, size, 4096, &m) < 0)
		return 0;
	/* A decoded manifest must re-encode to exactly the bytes it came
	 * from (the encoding is canonical). */
	buf_init(&out, 1u << 24);
	if (manifest_encode(m, &out) == 0)
		FUZZ_ASSERT(buf_len(&out) == size && memcmp(buf_ptr(&out), data, size) == 0);
	buf_clear(&out);
	manifest_free(m);
	return 0;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static struct buf b;
	struct manifest *m = NULL;
	struct manifest_entry dir = {.path = "src", .type = MANIFEST_DIR, .mode = 0755};
	struct manifest_entry file = {.path = "src/main.c", .type = MANIFEST_FILE, .mode = 0644, .size = 5};
	struct manifest_entry link = {.path = "latest", .type = MANIFEST_SYMLINK, .target = "src/main.c"};
	struct manifest_entry exe = {.path = "run.sh", .type = MANIFEST_FILE, .mode = 0755, .size = 0};

	if (i > 1)
		return 0;
	buf_clear(&b);
	buf_init(&b, 1u << 20);
	memset(file.hash, 0x5a, sizeof(file.hash));
	if (manifest_new(NULL, &m) < 0)
		return 0;
	if (i == 1 && (manifest_add(m, &dir) < 0 || manifest_add(m, &file) < 0 || manifest_add(m, &link) < 0 ||
		       manifest_add(m, &exe) < 0))
		goto out;
	if (manifest_seal(m) < 0 || manifest_encode(m, &b) < 0)
		goto out;
	*out = buf_ptr(&b);
out:
	manifest_free(m);
	return buf_len(&b);
}
