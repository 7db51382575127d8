/* SPDX-License-Identifier: Apache-2.0 */
/* Fuzz the delta batch parser behind the signature: the harness signs the
 * input with a fixed test key, so every byte the fuzzer chooses reaches the
 * structural checks, the decompression caps and the hash checks. */
#include <string.h>

#include <sodium.h>

#include "airlock/content/delta.h"
#include "airlock/core/mem.h"
#include "fuzz.h"

static uint8_t pk[DELTA_PK_LEN], sk[DELTA_SK_LEN], scope[DELTA_SCOPE_LEN];
static const struct delta_caps caps = {
    .max_batch = 1u << 20,
    .max_ops = 256,
    .max_chunks = 1024,
    .max_chunk = 1u << 18,
    .max_file = 1u << 24,
};

static void keys(void)
{
	static int done;
	uint8_t seed[32] = {1, 2, 3};

	if (done)
		return;
	if (sodium_init() < 0)
		__builtin_trap();
	crypto_sign_seed_keypair(pk, sk, seed);
	memset(scope, 0x33, sizeof(scope));
	done = 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct delta_batch *b = NULL;
	uint8_t *signed_ = NULL, *scratch = NULL;

	keys();
	if (size > caps.max_batch)
		return 0;
	if (!(signed_ = mem_alloc(size + crypto_sign_BYTES)))
		return 0;
	memcpy(signed_, data, size);
	crypto_sign_detached(signed_ + size, NULL, signed_, size, sk);
	if (delta_batch_verify(signed_, size + crypto_sign_BYTES, pk, scope, 0, &caps, &b, NULL, 0) < 0)
		goto out;
	if (!(scratch = mem_alloc(delta_batch_chunk_max(b) + 1)))
		goto out;
	for (size_t i = 0; i < delta_batch_count(b); i++) {
		const struct delta_op *op = delta_batch_op(b, i);
		for (size_t c = 0; c < op->nchunks; c++) {
			const uint8_t *raw;
			if (op->chunks[c].kind != DELTA_CHUNK_REF)
				(void)delta_chunk_data(b, &op->chunks[c], scratch, &raw);
		}
	}
out:
	delta_batch_free(b);
	mem_free(scratch);
	mem_free(signed_);
	return 0;
}

size_t fuzz_seed(unsigned i, const uint8_t **out)
{
	static uint8_t *bytes;
	struct delta_builder *bl = NULL;
	size_t n = 0;
	static const char text[] = "int main(void) { return 0; }\nint main(void) { return 0; }\n";
	uint8_t h[CHUNK_HASH_LEN];

	if (i > 0)
		return 0;
	keys();
	mem_free(bytes);
	bytes = NULL;
	chunk_hash(text, sizeof(text) - 1, h);
	if (delta_builder_new(1, scope, NULL, &caps, &bl) < 0)
		return 0;
	if (delta_add_mkdir(bl, "src", 0755) < 0 || delta_put_begin(bl, "src/main.c", 0644, NULL) < 0 ||
	    delta_put_inline(bl, text, sizeof(text) - 1) < 0 || delta_put_end(bl, h) < 0 ||
	    delta_add_symlink(bl, "latest", "src/main.c") < 0 || delta_add_chmod(bl, "run.sh", 0755) < 0 ||
	    delta_add_delete(bl, "old", DELTA_DELETE_TREE) < 0 || delta_builder_finish(bl, sk, &bytes, &n) < 0) {
		n = 0;
		goto out;
	}
	n -= crypto_sign_BYTES; /* the harness signs */
	*out = bytes;
out:
	delta_builder_free(bl);
	return n;
}
