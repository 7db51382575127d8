/* SPDX-License-Identifier: Apache-2.0 */
/* Deterministic driver for the fuzz harnesses (see fuzz.h): every seed,
 * then MUTATIONS mutated copies of each (bit flips, byte sets, truncation,
 * insertion, splicing), from a fixed PRNG seed so failures reproduce.
 * Files named on the command line are run too (crash reproducers);
 * --write-seeds DIR writes the seeds out as a libFuzzer corpus. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "airlock/core/mem.h"
#include "fuzz.h"

#define MUTATIONS      3000u
#define FUZZ_MAX_INPUT (1u << 20)

static uint64_t rng = 0x6169726c6f636b21ull;

static uint64_t next(void)
{
	/* xorshift64*: enough for choosing mutations */
	rng ^= rng >> 12;
	rng ^= rng << 25;
	rng ^= rng >> 27;
	return rng * 2685821657736338717ull;
}

static size_t mutate(uint8_t *buf, size_t n, size_t cap)
{
	unsigned k = 1 + (unsigned)(next() % 4);
	for (unsigned j = 0; j < k; j++) {
		switch (next() % 5) {
		case 0: /* flip a bit */
			if (n)
				buf[next() % n] ^= (uint8_t)(1u << (next() % 8));
			break;
		case 1: /* set a byte to an interesting value */
			if (n) {
				static const uint8_t v[] = {0, 1, 0x7f, 0x80, 0xff, '/', '.', 0xfe};
				buf[next() % n] = v[next() % sizeof(v)];
			}
			break;
		case 2: /* truncate */
			if (n)
				n = (size_t)(next() % n);
			break;
		case 3: /* insert random bytes */
			if (n < cap) {
				size_t at = n ? (size_t)(next() % (n + 1)) : 0, len = 1 + (size_t)(next() % 8);
				if (len > cap - n)
					len = cap - n;
				memmove(buf + at + len, buf + at, n - at);
				for (size_t i = 0; i < len; i++)
					buf[at + i] = (uint8_t)next();
				n += len;
			}
			break;
		case 4: /* duplicate a range */
			if (n && n < cap) {
				size_t from = (size_t)(next() % n), len = 1 + (size_t)(next() % (n - from));
				if (len > cap - n)
					len = cap - n;
				size_t at = (size_t)(next() % (n + 1));
				memmove(buf + at + len, buf + at, n - at);
				memmove(buf + at, buf + (from >= at ? from + len : from), len);
				n += len;
			}
			break;
		}
	}
	return n;
}

int main(int argc, char **argv)
{
	uint8_t *buf = malloc(FUZZ_MAX_INPUT);
	unsigned long runs = 0;

	if (!buf || sodium_init() < 0)
		return 1;
	mem_init_json();
	if (argc == 3 && !strcmp(argv[1], "--write-seeds")) {
		/* Seed corpus for a real libFuzzer run. */
		const uint8_t *s;
		size_t n;
		for (unsigned i = 0; (n = fuzz_seed(i, &s)) > 0; i++) {
			char path[4096];
			snprintf(path, sizeof(path), "%s/seed-%u", argv[2], i);
			FILE *f = fopen(path, "wb");
			if (!f || fwrite(s, 1, n, f) != n || fclose(f) != 0) {
				perror(path);
				return 1;
			}
		}
		return 0;
	}
	for (int a = 1; a < argc; a++) {
		FILE *f = fopen(argv[a], "rb");
		if (!f) {
			perror(argv[a]);
			return 1;
		}
		size_t n = fread(buf, 1, FUZZ_MAX_INPUT, f);
		fclose(f);
		LLVMFuzzerTestOneInput(buf, n);
		runs++;
	}
	const uint8_t *seed;
	size_t n;
	for (unsigned i = 0; (n = fuzz_seed(i, &seed)) > 0; i++) {
		if (n > FUZZ_MAX_INPUT / 2)
			n = FUZZ_MAX_INPUT / 2;
		LLVMFuzzerTestOneInput(seed, n);
		runs++;
		for (unsigned m = 0; m < MUTATIONS; m++) {
			memcpy(buf, seed, n);
			size_t len = mutate(buf, n, FUZZ_MAX_INPUT);
			LLVMFuzzerTestOneInput(buf, len);
			runs++;
		}
	}
	free(buf);
	printf("%lu inputs, no crash\n", runs);
	return 0;
}
