/* The keyed hash of tables indexed by outside input (util/hash.h), and the
 * allocator trace reader on ids made to collide under its old hash
 * (the timing is bench/'s, never a unit test's). */
#include <stdio.h>
#include <stdlib.h>

#include "alloc/alloc.h"
#include "harness.h"
#include "util/hash.h"

/* SipHash-2-4 against the paper's vectors (Aumasson and Bernstein 2012,
 * Appendix A, and the reference code's vectors.h): key 00 01 .. 0f; the
 * 15-byte message 00 01 .. 0e hashes to a129ca6149be45e5, the empty one to
 * 726fdb47dd0e0e31 (its bytes 31 0e 0e dd 47 db 6f 72 read little-endian). */
static void test_siphash_vectors(void **state)
{
    (void)state;
    const ml_hash_key k = {0x0706050403020100ull, 0x0f0e0d0c0b0a0908ull};
    unsigned char msg[15];
    for (int i = 0; i < 15; i++)
        msg[i] = (unsigned char)i;
    assert_true(ml__hash(&k, msg, 15) == 0xa129ca6149be45e5ull);
    assert_true(ml__hash(&k, msg, 0) == 0x726fdb47dd0e0e31ull);
    /* two tables' keys differ (their addresses alone differ) */
    int a, b;
    ml_hash_key ka = ml__hash_key_new(&a), kb = ml__hash_key_new(&b);
    assert_false(ka.k0 == kb.k0 && ka.k1 == kb.k1);
}

static uint64_t fnv1a(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

/* The corpus's 2,048 distinct 54-byte ids all share FNV-1a's low 19 bits
 * (checked here with FNV-1a written out); the reader keeps them apart:
 * 2,048 allocs, 2,048 names, each event naming its own line's id. */
static void test_trace_colliding_ids(void **state)
{
    (void)state;
    const char *path = ML_MODELS_DIR "/../tests/fuzz/corpus/trace/fnv-collisions.csv";
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 20];
    size_t len = fread(text, 1, sizeof text, f);
    fclose(f);
    ml_alloc_trace *t = NULL;
    ml_error e;
    assert_int_equal(ml__alloc_trace_parse(text, len, path, &t, &e), ML_OK);
    assert_int_equal(t->allocs, 2048);
    assert_int_equal(t->nnames, 2048);
    const uint64_t low = fnv1a(t->ids[0], strlen(t->ids[0])) & ((1u << 19) - 1);
    const char *line = strchr(text, '\n') + 1;
    for (size_t i = 0; i < t->n; i++) {
        assert_int_equal(strlen(t->ids[i]), 54);
        assert_true((fnv1a(t->ids[i], 54) & ((1u << 19) - 1)) == low);
        assert_memory_equal(t->ids[i], line + 6, 54); /* "alloc," then the id */
        line = strchr(line, '\n') + 1;
    }
    ml__alloc_trace_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_siphash_vectors),
        cmocka_unit_test(test_trace_colliding_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
