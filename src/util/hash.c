/* SipHash-2-4 and its key (hash.h). */
#include "util/hash.h"

#include <string.h>
#include <time.h>

static uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

/* splitmix64's finaliser: every input bit reaches every output bit */
static uint64_t mix(uint64_t z)
{
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

ml_hash_key ml__hash_key_new(const void *salt)
{
    struct timespec ts = {0, 0};
    timespec_get(&ts, TIME_UTC);
    int local = 0;
    uint64_t a = mix((uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec);
    uint64_t b = mix(a ^ (uint64_t)(uintptr_t)salt ^ ((uint64_t)(uintptr_t)&local << 17));
    uint64_t c = mix(b ^ (uint64_t)clock() * 0x9e3779b97f4a7c15ull);
    return (ml_hash_key){mix(a ^ c), mix(b ^ rotl(c, 29))};
}

#define SIPROUND                                                                              \
    do {                                                                                       \
        v0 += v1;                                                                              \
        v1 = rotl(v1, 13) ^ v0;                                                                \
        v0 = rotl(v0, 32);                                                                     \
        v2 += v3;                                                                              \
        v3 = rotl(v3, 16) ^ v2;                                                                \
        v0 += v3;                                                                              \
        v3 = rotl(v3, 21) ^ v0;                                                                \
        v2 += v1;                                                                              \
        v1 = rotl(v1, 17) ^ v2;                                                                \
        v2 = rotl(v2, 32);                                                                     \
    } while (0)

static uint64_t load_le(const unsigned char *p, size_t n)
{
    uint64_t m = 0;
    for (size_t i = 0; i < n; i++)
        m |= (uint64_t)p[i] << (8 * i);
    return m;
}

uint64_t ml__hash(const ml_hash_key *k, const void *data, size_t n)
{
    const unsigned char *p = data;
    uint64_t v0 = k->k0 ^ 0x736f6d6570736575ull, v1 = k->k1 ^ 0x646f72616e646f6dull;
    uint64_t v2 = k->k0 ^ 0x6c7967656e657261ull, v3 = k->k1 ^ 0x7465646279746573ull;
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const uint64_t m = load_le(p + i, 8);
        v3 ^= m;
        SIPROUND;
        SIPROUND;
        v0 ^= m;
    }
    const uint64_t b = ((uint64_t)n << 56) | load_le(p + i, n - i);
    v3 ^= b;
    SIPROUND;
    SIPROUND;
    v0 ^= b;
    v2 ^= 0xff;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    SIPROUND;
    return v0 ^ v1 ^ v2 ^ v3;
}
