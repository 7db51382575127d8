/* SPDX-License-Identifier: Apache-2.0 */
/*
 * chunk: XXH3-128 content hashes and FastCDC content-defined chunking.
 * See include/airlock/content/chunk.h for the contract and doc/SYNC.md for why.
 */
#include "airlock/content/chunk.h"

#include <errno.h>
#include <stdalign.h>
#include <stdbool.h>
#include <string.h>
#include <unistd.h>

#define XXH_INLINE_ALL
#include <xxhash.h>

#include "airlock/core/mem.h"

_Static_assert(sizeof(XXH3_state_t) <= sizeof(((struct chunk_hasher *)0)->state), "chunk_hasher too small");
_Static_assert(alignof(XXH3_state_t) <= 64, "chunk_hasher under-aligned");
_Static_assert(sizeof(XXH128_canonical_t) == CHUNK_HASH_LEN, "XXH128 canonical size");

const struct chunk_params chunk_params_default = {
    .min = 16u * 1024u,
    .avg = 64u * 1024u,
    .max = 256u * 1024u,
    .whole_max = 128u * 1024u,
};

/*
 * Gear table: 256 pseudo-random 64-bit values, generated once and frozen
 * here because the chunk boundaries (and so every stored chunk hash) depend
 * on them: CHANGING THIS TABLE CHANGES THE WIRE MEANING OF CHUNK LISTS.
 * Produced by splitmix64 (Steele, Lea, Flood 2014) from the seed
 * 0x6169726c6f636b31 ("airlock1"), 256 outputs in order:
 *     z = (s += 0x9e3779b97f4a7c15);
 *     z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
 *     z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
 *     return z ^ (z >> 31);
 * tests/unit/content/test_chunk.c regenerates it and compares.
 */
/* clang-format off */
static const uint64_t gear[256] = {
	0x386e465cfec82483ull, 0x5d0691807d25d16cull, 0xa955403f49a24308ull, 0x3ff756caaded0fc2ull,
	0x916aae8c398877c4ull, 0xcabe878e709baf08ull, 0x79c621551404f57dull, 0x155ca5d152b72786ull,
	0x9f4f85469dfd56cdull, 0x6442cfc63ecc1ed0ull, 0xae8ec03970e5b14cull, 0x5eacada4ddb7ecddull,
	0x4ccfb1e4a04cb685ull, 0x375181ec90081785ull, 0x88d854280aab6f0full, 0x05f64c04c8390703ull,
	0x4e002c50945fc84aull, 0x0a3d1686f9473197ull, 0x6e02588fc265eca5ull, 0xde0eb85673df27b0ull,
	0x0b57ec3c5c6eb0d2ull, 0xdcbd1fcca027c07aull, 0x8dc9a05d7f01a847ull, 0x02fda98c767f1b7dull,
	0x35a1fc74de2de437ull, 0x6092131d1d67ca79ull, 0x72b80368477dbc23ull, 0xf66e6b9bcd39ab77ull,
	0xd750370a5c57998eull, 0xba5001e2725b3d2eull, 0x954757bf5403435bull, 0x5bfd9fe4a5d14edaull,
	0x3226aa063311da85ull, 0x24d8701e45b5125eull, 0x91b9f9c15adcee55ull, 0x03e75bc89f8e2eacull,
	0x7986ab7e073dbc09ull, 0xe5e14585c7d50e7eull, 0x048b3c59baa2ab4dull, 0xbfdbc4f33cebdadaull,
	0xc215f086ebb0c991ull, 0xb6f0c7af630f17eeull, 0x75de2f8b4eb7c037ull, 0xda2ac3a067e23990ull,
	0xaa88544833b94c01ull, 0x358cea32ee7c85ddull, 0x041d316638c1309eull, 0xa025e70ec16edc41ull,
	0x5b9774c307756889ull, 0xf45dc116b7b8f785ull, 0x3988e8834876ad7eull, 0x75e21157aa103d4bull,
	0xd10f352262c71051ull, 0x3f7820c42b6e803full, 0x12a79965ec8d71a6ull, 0xa562764c752c4313ull,
	0xc9d4865c46eceb47ull, 0x8eb7f91a37fe5008ull, 0x069df5b850e7fa2full, 0xed9698164e411c8cull,
	0xe7c2ced6394aeab4ull, 0x53d47977ca08dec1ull, 0x392b33889be8d7afull, 0xa688afe0f26637f0ull,
	0x08d7c0ba00623ed5ull, 0xb0d204ca90e9102dull, 0x38ac9080bc8df3a6ull, 0x1f524d6e47d79729ull,
	0xd459f845ac806901ull, 0xdebe0e51e178b757ull, 0x1d4ec1639d1a0222ull, 0xa4a0cd7e03b74113ull,
	0x5bc84e3c089de242ull, 0x781015880a8b3d2bull, 0x9778747d16a75b94ull, 0x9c3de7c60764f901ull,
	0x7609c75b0cf29571ull, 0x75cd1fddeeb16b6cull, 0x4ab9f4bf1850ccd6ull, 0xcda5bf0df6706a1aull,
	0x30e009b18d647d42ull, 0x0e533f80ecb74c24ull, 0xd7a7d2b7b2fb277cull, 0x04a2caaf8a2759bbull,
	0x217fdccd4ea63b90ull, 0x3b8d5e72e46566f5ull, 0x03dee840a240b476ull, 0xe3b908ebc519c0fdull,
	0xe541740feb5c4576ull, 0x2739317c6765454aull, 0x428c1f71b34ec300ull, 0x6b2cf1767f68f6dfull,
	0x08673b68ac90bf0bull, 0x80ea319742d241a6ull, 0xc1b8eb49fd975edbull, 0xdf706655afb5fc39ull,
	0xda7485b576bb3d94ull, 0xc685e87953b0e490ull, 0x8c658e86df49bf5bull, 0x6c542070ae3adaccull,
	0xc501634b60ff6bbdull, 0x20f1af272428f733ull, 0xb8d495b78cbeb6d5ull, 0x46fc794db8bd7807ull,
	0xd350f4688cf1070bull, 0x22a5b79cbac5b2aeull, 0x7e3d2697a8d5e70dull, 0xcdbbe9baf1dbe0f4ull,
	0x133edf2db3fb9e58ull, 0x71d03c8d355ac9b0ull, 0xe72a5b4c91dfbf78ull, 0xa70540eaddfc04b3ull,
	0x6c51d292dbdf87d7ull, 0xc9a5f7f8b14470adull, 0xb4329d82c611d225ull, 0x65bea85b740da96full,
	0x2731286a22ea4e6eull, 0x4ff629422386b70cull, 0x8f2f7de28223efdcull, 0x94f086ee74e500fdull,
	0xcdf6bd10cf8bbeebull, 0xa1833b17678a32ebull, 0xe096b806b9aaa590ull, 0x9259010e05796c98ull,
	0x7220a6a255553c79ull, 0x152aab7c3a580242ull, 0x96cc67bace80fa36ull, 0x51ac7864b0773b4bull,
	0xf4eeafb76a93dcd3ull, 0x9136ba5be7b1a372ull, 0x076c78b53b3fc043ull, 0x1d07d9600d6654daull,
	0x2850010bcf6805f6ull, 0x8b7b48de7f837945ull, 0xccdbc97468a12500ull, 0xf880992343e98881ull,
	0x8155fe0e7eedef58ull, 0x3d8679dd3663bb21ull, 0x71d29eccb8a4b419ull, 0x4aab2f4939a68531ull,
	0xa83932b3c397d5b8ull, 0xcc9f23980e360a95ull, 0x4cd7734003463458ull, 0x3b2ceec0b9751b03ull,
	0xdb6b0f57672735b7ull, 0xaee56d199f38be8aull, 0x20f03b7a35137f54ull, 0x0094244f7b13a43bull,
	0x6fd458b9a163d9ccull, 0xb9f80972cc350887ull, 0x9f1c8c22347ba917ull, 0x2fdb49baedd4c014ull,
	0x4efafc83a5ffa0f2ull, 0xf6ea29239b51b8fcull, 0x196451227b6d36c9ull, 0xd862c14b15378013ull,
	0x9348c7ab915990e6ull, 0x37149d13f103a3e6ull, 0x2fb9030e0f3322bbull, 0xe168b7661b208a2eull,
	0x71cb10c08c64c131ull, 0x01d73465b99439e7ull, 0x9aa7f66b9932c4ecull, 0x19b337db59bce024ull,
	0x22269032199b736bull, 0x55d8d90d8a82e9cfull, 0xf2605c78e3a5b7f4ull, 0xf89973b9773e07f2ull,
	0xbb625867e7632cceull, 0xec8348e07450495dull, 0x1e424876712861c1ull, 0x15392f4fc5b54afdull,
	0xd186855a0eb0e381ull, 0xf9e9658cf8d03f9dull, 0x61d7a6248cd2ec99ull, 0xb3b4d6a7c468fcfeull,
	0xa8e78837f811b647ull, 0x0f712a43d2f9cfefull, 0xbe7023cf4a5b3008ull, 0x94a4d39c9365a2dbull,
	0x3c069304528b9f06ull, 0x7947f2f8753ad34full, 0xe8456490b2619e19ull, 0xe1666d503085e3c0ull,
	0x423c6cf1eeffdcaeull, 0x39e8f9b715dc8f96ull, 0x81404766b7925a96ull, 0xeda5d9541230602full,
	0xb0e4edf1de28779bull, 0x3320d9ef95dd4267ull, 0x347b1f7ca8877b25ull, 0x45b0a00063d6f9ebull,
	0xdbc49144397e9abbull, 0x11a8275b3ad0f637ull, 0x8bb16cfb25623a87ull, 0x44d6853242967454ull,
	0x75e7e2f834a7f263ull, 0xf8256029103f7b99ull, 0x27236fea89832e02ull, 0xf6b38ffab0f3425eull,
	0x3a6e9f065a38f0b3ull, 0xafe2b7568807f396ull, 0xa29591a79cec67fdull, 0xdca2e60e85894873ull,
	0x9b59ce3943fd337aull, 0xbc3064bfd3c2f2f5ull, 0x81e1788d6e521e63ull, 0xa2670d4b3cbbe7fcull,
	0x38cc0b06d19b5fa8ull, 0x23edd69c99c57a1full, 0xfebe61282b5a512full, 0x7cf07a9cca226f2cull,
	0xade2215bd2a2a41bull, 0x667259f9ad69bd7dull, 0xb391ef3509f10badull, 0xc6dd8d4f19bf006eull,
	0x00b2ac959405bce0ull, 0xb33f5d721f341998ull, 0xf4177ef42c1e6aa7ull, 0x61208c8bcb808c12ull,
	0x9a344746969277feull, 0x4dd565d5d37eb2ccull, 0x3e3ef4210e134967ull, 0x3d644c7f0c8226c3ull,
	0xb4bdef0e99584c5eull, 0xf109607cc45474c9ull, 0x90230055de0e1b2cull, 0xb3fe617286702aefull,
	0x0120d2ad064ee074ull, 0x9cdb8a0089b2d338ull, 0x48cf89b132ff9314ull, 0xd5e57e83e5ec0139ull,
	0x9283ce9f03607f60ull, 0xb281c810ad16ac48ull, 0x1b2f6a28ebbd5e80ull, 0x90117a7629e30756ull,
	0xd74581ba97481897ull, 0xf1cd89b6344bfe1eull, 0x26a3c08d24caced1ull, 0xf21073ea775fed0cull,
	0xea8537638b48bbb9ull, 0xa36263fd718e789full, 0x326f0c82867c8924ull, 0x0d214ef6c1cda2a8ull,
	0xd92b0fa5281cd50eull, 0xef0248cab0056762ull, 0xc6e0873a0b893ed4ull, 0xe5b573e60dba5234ull,
	0x7f180039f6599592ull, 0x9868c8835e1c3c56ull, 0x81da3aff33b9c810ull, 0xf9db723386921d1bull,
	0xb5ae45c7b3462cdaull, 0x7212070a681d73feull, 0x0facb941abfbda21ull, 0x10c732148faca961ull,
};
/* clang-format on */

_Static_assert(sizeof(gear) / sizeof(gear[0]) == 256, "gear table has 256 entries");

void chunk_hash(const void *p, size_t n, uint8_t out[CHUNK_HASH_LEN])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits(p, n));
	memcpy(out, c.digest, CHUNK_HASH_LEN);
}

void chunk_hasher_init(struct chunk_hasher *h)
{
	XXH3_128bits_reset((XXH3_state_t *)(void *)h->state);
}

void chunk_hasher_update(struct chunk_hasher *h, const void *p, size_t n)
{
	if (n)
		XXH3_128bits_update((XXH3_state_t *)(void *)h->state, p, n);
}

void chunk_hasher_final(struct chunk_hasher *h, uint8_t out[CHUNK_HASH_LEN])
{
	XXH128_canonical_t c;
	XXH128_canonicalFromHash(&c, XXH3_128bits_digest((XXH3_state_t *)(void *)h->state));
	memcpy(out, c.digest, CHUNK_HASH_LEN);
}

/* Seed of the list hash: a file of two or more chunks is identified by a
 * hash of its chunk hashes, which can never be confused with the plain
 * hash of some file's bytes that happen to spell those hashes. */
#define CHUNK_LIST_SEED 0x61726c6b63686b73ull /* "arlkchks" */

void chunk_hasher_init_list(struct chunk_hasher *h)
{
	XXH3_128bits_reset_withSeed((XXH3_state_t *)(void *)h->state, CHUNK_LIST_SEED);
}

void chunk_list_hash(const struct chunk *list, size_t n, uint8_t out[CHUNK_HASH_LEN])
{
	struct chunk_hasher h;

	if (n == 1) {
		memcpy(out, list[0].hash, CHUNK_HASH_LEN);
		return;
	}
	if (n == 0) {
		chunk_hash("", 0, out);
		return;
	}
	chunk_hasher_init_list(&h);
	for (size_t i = 0; i < n; i++)
		chunk_hasher_update(&h, list[i].hash, CHUNK_HASH_LEN);
	chunk_hasher_final(&h, out);
}

int chunk_params_check(const struct chunk_params *p)
{
	if (!p || p->min < CHUNK_MIN_LIMIT || p->avg <= p->min || p->max <= p->avg || p->max > CHUNK_SIZE_LIMIT)
		return -EINVAL;
	if ((p->avg & (p->avg - 1)) != 0)
		return -EINVAL;
	if (p->whole_max < p->min || p->whole_max > p->max)
		return -EINVAL;
	return 0;
}

static unsigned log2u32(uint32_t v)
{
	unsigned b = 0;
	while (v >>= 1)
		b++;
	return b;
}

/* The top `bits` bits of the fingerprint decide a cut. A gear hash shifts
 * left, so bit k depends only on the last k+1 bytes: the high bits see the
 * whole 64-byte window, the low bits only a few bytes (which is why FastCDC
 * spreads its mask bits; taking the top ones is the simple equivalent). */
static uint64_t top_mask(unsigned bits)
{
	return bits >= 64 ? ~0ull : ~(~0ull >> bits);
}

size_t chunk_cut(const struct chunk_params *p, const uint8_t *d, size_t n)
{
	if (n <= p->min)
		return n;
	if (n > p->max)
		n = p->max;
	unsigned bits = log2u32(p->avg);
	/* Normalized chunking, level 2: two more bits before avg (cuts
	 * rarer), two fewer after (cuts likelier). */
	const uint64_t mask_s = top_mask(bits + 2);
	const uint64_t mask_l = top_mask(bits - 2);
	size_t normal = p->avg < n ? p->avg : n;
	uint64_t fp = 0;
	size_t i = p->min;

	for (; i < normal; i++) {
		fp = (fp << 1) + gear[d[i]];
		if (!(fp & mask_s))
			return i + 1;
	}
	for (; i < n; i++) {
		fp = (fp << 1) + gear[d[i]];
		if (!(fp & mask_l))
			return i + 1;
	}
	return n;
}

struct list {
	struct chunk *v;
	size_t n, cap;
};

static int list_push(struct list *l, uint64_t off, uint32_t len, const uint8_t hash[CHUNK_HASH_LEN])
{
	if (l->n == l->cap) {
		size_t ncap = l->cap ? l->cap * 2 : 16;
		if (ncap < l->cap || ncap > SIZE_MAX / sizeof(struct chunk))
			return -ENOMEM;
		struct chunk *nv = mem_realloc(l->v, ncap * sizeof(struct chunk));
		if (!nv)
			return -ENOMEM;
		l->v = nv;
		l->cap = ncap;
	}
	struct chunk *c = &l->v[l->n++];
	c->off = off;
	c->len = len;
	memcpy(c->hash, hash, CHUNK_HASH_LEN);
	return 0;
}

static void list_out(struct list *l, struct chunk **out, size_t *n)
{
	if (l->n == 0) {
		mem_free(l->v);
		l->v = NULL;
	}
	*out = l->v;
	*n = l->n;
	l->v = NULL;
	l->n = l->cap = 0;
}

int chunk_list_check(const struct chunk_params *p, const struct chunk *list, size_t n, uint64_t size)
{
	uint64_t off = 0;

	if (chunk_params_check(p) < 0)
		return -EINVAL;
	if (size == 0)
		return n == 0 ? 0 : -EINVAL;
	if (size <= p->whole_max)
		return (n == 1 && list[0].off == 0 && list[0].len == size) ? 0 : -EINVAL;
	for (size_t i = 0; i < n; i++) {
		if (list[i].off != off || list[i].len == 0 || list[i].len > p->max)
			return -EINVAL;
		/* every chunk but the last was cut after min bytes */
		if (i + 1 < n && list[i].len <= p->min)
			return -EINVAL;
		if (list[i].len > size - off)
			return -EINVAL;
		off += list[i].len;
	}
	return off == size ? 0 : -EINVAL;
}

int chunk_split(const struct chunk_params *p, const void *data, size_t len, struct chunk **out, size_t *n)
{
	struct list l = {0};
	const uint8_t *d = data;
	uint8_t h[CHUNK_HASH_LEN];
	int r = 0;

	if (chunk_params_check(p) < 0)
		return -EINVAL;
	if (len > 0 && len <= p->whole_max) {
		chunk_hash(d, len, h);
		r = list_push(&l, 0, (uint32_t)len, h);
	} else {
		for (size_t pos = 0; pos < len && r == 0;) {
			size_t c = chunk_cut(p, d + pos, len - pos);
			chunk_hash(d + pos, c, h);
			r = list_push(&l, pos, (uint32_t)c, h);
			pos += c;
		}
	}
	if (r < 0) {
		mem_free(l.v);
		return r;
	}
	list_out(&l, out, n);
	return 0;
}

int chunk_read_fd(void *ud, uint64_t off, void *buf, size_t len)
{
	int fd = *(const int *)ud;
	uint8_t *d = buf;

	while (len > 0) {
		if (off > (uint64_t)INT64_MAX)
			return -EFBIG;
		ssize_t k = pread(fd, d, len, (off_t)off);
		if (k < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (k == 0)
			return -ESTALE;
		d += k;
		off += (uint64_t)k;
		len -= (size_t)k;
	}
	return 0;
}

int chunk_fd_hash(const struct chunk_params *p, int fd, uint64_t size, uint8_t out[CHUNK_HASH_LEN])
{
	uint8_t io[64 * 1024];
	struct chunk_hasher h;
	uint64_t off = 0;
	int r = 0;

	if (size > p->whole_max) {
		struct chunk *list = NULL;
		size_t nl = 0;
		r = chunk_file(p, chunk_read_fd, &fd, size, NULL, NULL, &list, &nl, out);
		mem_free(list);
		return r;
	}
	chunk_hasher_init(&h);
	while (off < size && r == 0) {
		size_t k = size - off < sizeof(io) ? (size_t)(size - off) : sizeof(io);
		if ((r = chunk_read_fd(&fd, off, io, k)) == 0) {
			chunk_hasher_update(&h, io, k);
			off += k;
		}
	}
	chunk_hasher_final(&h, out);
	return r;
}

/* A sliding read window over the new file: holds [start, start + len). */
struct window {
	chunk_read_fn rd;
	void *ud;
	uint64_t size;
	uint8_t *buf;
	size_t cap;
	uint64_t start;
	size_t len;
	uint64_t nread;
};

/* Make [pos, pos + want) readable and point *out at it. Needs want <= cap
 * and pos + want <= size. Reads ahead to fill the buffer. */
static int win_get(struct window *w, uint64_t pos, size_t want, const uint8_t **out)
{
	if (pos < w->start || pos - w->start > w->len) {
		w->start = pos;
		w->len = 0;
	}
	size_t have = (size_t)(w->start + w->len - pos);
	if (have < want) {
		memmove(w->buf, w->buf + (pos - w->start), have);
		w->start = pos;
		w->len = have;
		uint64_t left = w->size - pos - have;
		size_t more = w->cap - have;
		if ((uint64_t)more > left)
			more = (size_t)left;
		int r = w->rd(w->ud, pos + have, w->buf + have, more);
		if (r < 0)
			return r;
		w->len += more;
		w->nread += more;
	}
	*out = w->buf + (pos - w->start);
	return 0;
}

static int win_init(struct window *w, const struct chunk_params *p, chunk_read_fn rd, void *ud, uint64_t size)
{
	memset(w, 0, sizeof(*w));
	w->rd = rd;
	w->ud = ud;
	w->size = size;
	w->cap = 2 * (size_t)p->max;
	w->buf = mem_alloc(w->cap);
	return w->buf ? 0 : -ENOMEM;
}

/* Cut, hash and append chunks of the new file from pos until EOF, or, when
 * `old` is given, until a boundary lands on an old one in the unchanged
 * tail; then append the rest of the old list, shifted. */
static int run(const struct chunk_params *p, struct window *w, struct list *l, uint64_t pos, chunk_fn each,
	       void *each_ud, const struct chunk *old, size_t nold, uint64_t dirty_end, uint64_t old_tail)
{
	size_t j = 0;
	uint8_t h[CHUNK_HASH_LEN];
	int r;

	while (pos < w->size) {
		uint64_t left = w->size - pos;
		size_t want = left < p->max ? (size_t)left : p->max;
		const uint8_t *d;
		if ((r = win_get(w, pos, want, &d)) < 0)
			return r;
		size_t c = chunk_cut(p, d, want);
		chunk_hash(d, c, h);
		if ((r = list_push(l, pos, (uint32_t)c, h)) < 0)
			return r;
		if (each && (r = each(each_ud, &l->v[l->n - 1], d)) < 0)
			return r;
		pos += c;
		if (!old || pos < dirty_end || pos >= w->size)
			continue;
		uint64_t oldq = old_tail + (pos - dirty_end);
		while (j < nold && old[j].off < oldq)
			j++;
		if (j < nold && old[j].off == oldq) {
			for (size_t m = j; m < nold; m++)
				if ((r = list_push(l, pos + (old[m].off - oldq), old[m].len, old[m].hash)) < 0)
					return r;
			return 0;
		}
	}
	return 0;
}

int chunk_file(const struct chunk_params *p, chunk_read_fn rd, void *ud, uint64_t size, chunk_fn each, void *each_ud,
	       struct chunk **out, size_t *n, uint8_t file_hash[CHUNK_HASH_LEN])
{
	struct window w;
	struct list l = {0};
	int r;

	if (chunk_params_check(p) < 0)
		return -EINVAL;
	if (size == 0) {
		*out = NULL;
		*n = 0;
		if (file_hash)
			chunk_list_hash(NULL, 0, file_hash);
		return 0;
	}
	if ((r = win_init(&w, p, rd, ud, size)) < 0)
		return r;
	if (size <= p->whole_max) {
		const uint8_t *d;
		uint8_t h[CHUNK_HASH_LEN];
		if ((r = win_get(&w, 0, (size_t)size, &d)) == 0) {
			chunk_hash(d, (size_t)size, h);
			r = list_push(&l, 0, (uint32_t)size, h);
			if (r == 0 && each)
				r = each(each_ud, &l.v[0], d);
		}
	} else {
		r = run(p, &w, &l, 0, each, each_ud, NULL, 0, 0, 0);
	}
	mem_free(w.buf);
	if (r < 0) {
		mem_free(l.v);
		return r;
	}
	if (file_hash)
		chunk_list_hash(l.v, l.n, file_hash);
	list_out(&l, out, n);
	return 0;
}

int chunk_update(const struct chunk_params *p, const struct chunk *old, size_t nold, uint64_t dirty_off,
		 uint64_t dirty_end, uint64_t new_size, chunk_read_fn rd, void *ud, struct chunk **out, size_t *n,
		 uint64_t *reread)
{
	uint64_t old_size = 0;
	struct window w;
	struct list l = {0};
	int r;

	if (chunk_params_check(p) < 0)
		return -EINVAL;
	for (size_t i = 0; i < nold; i++) {
		if (old[i].len > UINT64_MAX - old_size)
			return -EINVAL;
		old_size += old[i].len;
	}
	if (chunk_list_check(p, old, nold, old_size) < 0)
		return -EINVAL;
	if (dirty_off > dirty_end || dirty_end > new_size || dirty_off > old_size)
		return -EINVAL;
	/* Where the unchanged tail starts in the old content. */
	if (new_size - dirty_end > old_size)
		return -EINVAL;
	uint64_t old_tail = old_size - (new_size - dirty_end);
	if (old_tail < dirty_off)
		return -EINVAL;

	/* A whole-file chunk is not a content-defined one: nothing to reuse. */
	if (new_size <= p->whole_max || old_size <= p->whole_max) {
		if (reread)
			*reread = new_size;
		return chunk_file(p, rd, ud, new_size, NULL, NULL, out, n, NULL);
	}

	/* Restart at the chunk holding dirty_off (the last one for an
	 * append): every cut before it was decided by unchanged bytes. */
	size_t k = 0;
	while (k + 1 < nold && old[k + 1].off <= dirty_off)
		k++;
	for (size_t i = 0; i < k; i++)
		if ((r = list_push(&l, old[i].off, old[i].len, old[i].hash)) < 0)
			goto out;
	if ((r = win_init(&w, p, rd, ud, new_size)) < 0)
		goto out;
	r = run(p, &w, &l, old[k].off, NULL, NULL, old, nold, dirty_end, old_tail);
	if (reread)
		*reread = w.nread;
	mem_free(w.buf);
out:
	if (r < 0) {
		mem_free(l.v);
		return r;
	}
	list_out(&l, out, n);
	return 0;
}
