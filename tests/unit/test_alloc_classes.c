/* The caching-allocator simulator with many size classes at once: more
 * than one chunk of its index of sizes (src/alloc/blocks.h), so that the
 * chunks split, join and are searched across. Each figure is derived here
 * from the allocator's rules (docs/allocator.md); the simple reference
 * (alloc_reference.c) follows every event, and the simulator's own
 * consistency check (chunk order, counts, the half-full rule) runs after
 * each. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include <cmocka.h>

#include "alloc/sim.h"
#include "alloc_reference.h"

#define MiB (1ull << 20)
#define GiB (1ull << 30)

enum { N = 1000 }; /* remainders of distinct sizes: about 30 chunks' worth */

typedef struct {
    ml_alloc_sim *s;
    ref_sim *r;
    size_t events;
} pair;

static uint64_t rng = 20261202;

static uint64_t below(uint64_t n) /* splitmix64 */
{
    uint64_t z = (rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (z ^ (z >> 31)) % n;
}

static void shuffle(uint32_t *a, size_t n)
{
    for (size_t i = 0; i < n; i++)
        a[i] = (uint32_t)i;
    for (size_t i = n; i > 1; i--) {
        size_t j = (size_t)below(i);
        uint32_t t = a[i - 1];
        a[i - 1] = a[j];
        a[j] = t;
    }
}

/* Both simulators agree and the fast one is consistent. */
static void agree(pair *p)
{
    ml_alloc_stats a, b;
    ml_alloc_sim_stats(p->s, &a);
    ref_stats(p->r, &b);
    p->events++;
    if (a.allocated.current != b.allocated.current || a.reserved.current != b.reserved.current ||
        a.reserved.peak != b.reserved.peak || a.segments.current != b.segments.current)
        fail_msg("event %zu: allocated %llu reserved %llu, the reference %llu %llu", p->events,
                 (unsigned long long)a.allocated.current, (unsigned long long)a.reserved.current,
                 (unsigned long long)b.allocated.current, (unsigned long long)b.reserved.current);
    const char *why = ml_alloc_sim_check(p->s);
    if (why)
        fail_msg("event %zu: %s", p->events, why);
}

static void take(pair *p, uint64_t bytes, uint64_t *hs, uint64_t *hr)
{
    assert_int_equal(ml_alloc_sim_malloc(p->s, bytes, hs), ML_ALLOC_OK);
    assert_int_equal(ref_malloc(p->r, bytes, hr), ML_ALLOC_OK);
    assert_int_equal(ml_alloc_sim_address(p->s, *hs), ref_address(p->r, *hr));
    agree(p);
}

static void give(pair *p, uint64_t hs, uint64_t hr)
{
    assert_int_equal(ml_alloc_sim_free(p->s, hs), ML_ALLOC_OK);
    assert_int_equal(ref_free(p->r, hr), ML_ALLOC_OK);
    agree(p);
}

/* The remainder of segment j: 4 MiB + 512 (j + 1), all distinct. */
static uint64_t rest(uint32_t j)
{
    return 4 * MiB + 512ull * (j + 1);
}

/* 1 GiB (a segment of its own: the cached remainders are smaller), freed,
 * then 1 GiB - rest(j) from that cached block: split, as the rest is over
 * 1 MiB (should_split); the rests enter in a random order. */
static void fill(pair *p, uint64_t *bs, uint64_t *br)
{
    uint32_t perm[N];
    shuffle(perm, N);
    uint64_t allocated = 0;
    for (size_t n = 0; n < N; n++) {
        uint32_t j = perm[n];
        uint64_t hs, hr;
        take(p, GiB, &hs, &hr);
        give(p, hs, hr);
        take(p, GiB - rest(j), &bs[j], &br[j]);
        allocated += GiB - rest(j);
    }
    ml_alloc_stats st;
    ml_alloc_sim_stats(p->s, &st);
    assert_int_equal(st.reserved.current, N * GiB);
    assert_int_equal(st.segments.current, N);
    assert_int_equal(st.allocated.current, allocated);
    const ml_ab_classes *lc = &p->s->pool[LARGE].cls;
    assert_int_equal(lc->n, N);
    /* neighbours at half a chunk or more: between N / chunk and the bound */
    assert_true(lc->nch >= N / ML_AB_CHUNK && lc->nch <= 4 * N / ML_AB_CHUNK + 1);
}

/* rest(j) exactly, for half of them in another order: the best fit is that
 * remainder, taken whole, right after b_j in its segment. */
static void take_exact(pair *p, const uint64_t *bs, uint64_t *cs, uint64_t *cr)
{
    uint32_t perm[N];
    shuffle(perm, N);
    for (size_t n = 0; n < N / 2; n++) {
        uint32_t j = perm[n];
        take(p, rest(j), &cs[j], &cr[j]);
        assert_int_equal(ml_alloc_sim_address(p->s, cs[j]),
                         ml_alloc_sim_address(p->s, bs[j]) + GiB - rest(j));
    }
    ml_alloc_stats st;
    ml_alloc_sim_stats(p->s, &st);
    assert_int_equal(st.reserved.current, N * GiB); /* no new segment */
    assert_int_equal(p->s->pool[LARGE].cls.n, N - N / 2);
}

/* A random mix of sizes between 1 MiB + 512 B and 9 MiB, split or whole
 * (the reference decides), then all of it freed. */
static void mix(pair *p)
{
    enum { LIVE = 4000 };
    static uint64_t ms[LIVE], mr[LIVE];
    size_t live = 0;
    for (int e = 0; e < 3000; e++) {
        if (live && (live == LIVE || below(100) < 45)) {
            size_t k = (size_t)below(live);
            give(p, ms[k], mr[k]);
            ms[k] = ms[live - 1];
            mr[k] = mr[live - 1];
            live--;
        } else {
            take(p, MiB + 512 + 512 * below(8 * 2048), &ms[live], &mr[live]);
            live++;
        }
    }
    for (size_t k = 0; k < live; k++)
        give(p, ms[k], mr[k]);
}

static void many_classes(void **state)
{
    (void)state;
    ml_alloc_config c = ml_alloc_config_defaults();
    pair p = {NULL, ref_create(&c), 0};
    assert_non_null(p.r);
    assert_int_equal(ml_alloc_sim_create(&c, &p.s), ML_ALLOC_OK);
    static uint64_t bs[N], br[N], cs[N], cr[N];
    fill(&p, bs, br);
    take_exact(&p, bs, cs, cr);
    mix(&p);
    for (uint32_t j = 0; j < N; j++) {
        give(&p, bs[j], br[j]);
        if (cs[j])
            give(&p, cs[j], cr[j]);
    }
    ml_alloc_stats st;
    ml_alloc_sim_stats(p.s, &st);
    assert_int_equal(st.allocated.current, 0);
    /* a segment the mix made is a 20 MiB one (its requests are under 10
     * MiB), and it made some (those over 4.5 MiB fit no remainder). All
     * whole and free now: two classes, 1 GiB and 20 MiB, in one chunk */
    uint64_t extra = st.segments.current - N;
    assert_true(extra > 0);
    assert_int_equal(st.reserved.current, N * GiB + extra * 20 * MiB);
    assert_int_equal(p.s->pool[LARGE].nfree, st.segments.current);
    assert_int_equal(p.s->pool[LARGE].cls.n, 2);
    assert_int_equal(p.s->pool[LARGE].cls.nch, 1);
    ml_alloc_sim_destroy(p.s);
    ref_destroy(p.r);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_classes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
