/* SPDX-License-Identifier: Apache-2.0 */
#ifndef AIRLOCK_FUZZ_H
#define AIRLOCK_FUZZ_H

/*
 * One libFuzzer harness per parser of untrusted bytes. Each harness file
 * defines LLVMFuzzerTestOneInput and fuzz_seeds(). Built two ways:
 *   - with clang -fsanitize=fuzzer (meson -Dfuzz=true): a real fuzzer;
 *   - in every build, linked with driver.c: a deterministic smoke test
 *     that runs the seeds and a fixed number of seeded mutations of them,
 *     so the harnesses never rot and the suite catches crashes.
 */

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

/* An invariant every input must keep; a violation is a finding (abort
 * makes libFuzzer save the input and fails the smoke test). */
#define FUZZ_ASSERT(cond)                                                                                              \
	do {                                                                                                           \
		if (!(cond)) {                                                                                         \
			fprintf(stderr, "%s:%d: invariant failed: %s\n", __FILE__, __LINE__, #cond);                   \
			abort();                                                                                       \
		}                                                                                                      \
	} while (0)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Well-formed inputs the harness knows how to make. Call with i = 0, 1, …
 * until it returns 0; *out is the harness's own memory (valid until the
 * next call). */
size_t fuzz_seed(unsigned i, const uint8_t **out);

#endif
