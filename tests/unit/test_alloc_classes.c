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
    ml__alloc_sim_stats(p->s, &a);
    ref_stats(p->r, &b);
    p->events++;
    if (a.allocated.current != b.allocated.current || a.reserved.current != b.reserved.current ||
        a.reserved.peak != b.reserved.peak || a.segments.current != b.segments.current)
        fail_msg("event %zu: allocated %llu reserved %llu, the reference %llu %llu", p->events,
                 (unsigned long long)a.allocated.current, (unsigned long long)a.reserved.current,
                 (unsigned long long)b.allocated.current, (unsigned long long)b.reserved.current);
    const char *why = ml__alloc_sim_check(p->s);
    if (why)
        fail_msg("event %zu: %s", p->events, why);
}

static void take(pair *p, uint64_t bytes, uint64_t *hs, uint64_t *hr)
{
    assert_int_equal(ml__alloc_sim_malloc(p->s, bytes, hs), ML_ALLOC_OK);
    assert_int_equal(ref_malloc(p->r, bytes, hr), ML_ALLOC_OK);
    assert_int_equal(ml__alloc_sim_address(p->s, *hs), ref_address(p->r, *hr));
    agree(p);
}

static void give(pair *p, uint64_t hs, uint64_t hr)
{
    assert_int_equal(ml__alloc_sim_free(p->s, hs), ML_ALLOC_OK);
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
    ml__alloc_sim_stats(p->s, &st);
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
        assert_int_equal(ml__alloc_sim_address(p->s, cs[j]),
                         ml__alloc_sim_address(p->s, bs[j]) + GiB - rest(j));
    }
    ml_alloc_stats st;
    ml__alloc_sim_stats(p->s, &st);
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
    ml_alloc_config c = ml__alloc_config_defaults();
    pair p = {NULL, ref_create(&c), 0};
    assert_non_null(p.r);
    assert_int_equal(ml__alloc_sim_create(&c, &p.s), ML_ALLOC_OK);
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
    ml__alloc_sim_stats(p.s, &st);
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
    ml__alloc_sim_destroy(p.s);
    ref_destroy(p.r);
}

/* ---- the index by itself, at its bound ---- */

enum { K = 1024 }; /* classes, with room reserved for exactly that many */

typedef struct {
    ml_ab_table t;
    ml_ab_cls_table ct;
    ml_ab_classes c;
    uint32_t x[K + 1]; /* x[j]: a free block of 512 j bytes, j = 1 .. K */
} lone;

static void lone_check(const lone *l)
{
    const char *why = ml__ab_classes_check(&l->c, &l->ct, K + 1);
    if (why)
        fail_msg("%s", why);
}

/* The index's lower bound against the answer by hand: the first size
 * 512 j >= v whose block is still in (live[j]). */
static void lone_bounds(lone *l, const bool *live)
{
    for (uint64_t v = 1; v <= 512ull * K + 512; v += 383) {
        uint32_t want = 0;
        for (uint64_t j = (v + 511) / 512; j <= K && !want; j++)
            want = live[j] ? l->x[j] : 0;
        assert_int_equal(ml__ab_class_lower_bound(&l->ct, &l->c, v), want);
    }
}

static void index_at_its_bound(void **state)
{
    (void)state;
    static lone l;
    static bool live[K + 1];
    assert_true(ml__ab_reserve(&l.t, K + 1) && ml__ab_cls_reserve(&l.ct, K + 1) &&
                ml__ab_classes_reserve(&l.c, K));
    for (uint32_t j = 1; j <= K; j++) { /* ascending: each new size goes last */
        l.x[j] = ml_ab_new(&l.t);
        l.t.b[l.x[j]].size = 512ull * j;
        l.t.b[l.x[j]].addr = 1ull << 32;
        ml__ab_class_insert(&l.t, &l.ct, &l.c, l.x[j]);
        live[j] = true;
        lone_check(&l);
    }
    /* a chunk fills to 32; the 33rd size splits it 16 | 16 and joins the
     * upper half; 16 more per split after that: 1024 = 33 + 16 * 61 + 15,
     * so 61 more splits and a last chunk filled to 32: 63 chunks, more than
     * the 34 a reservation a quarter the size would hold */
    assert_int_equal(l.c.nch, 63);
    assert_int_equal(l.c.count[62], 32);
    lone_bounds(&l, live);

    /* a lower bound's place, then a change before the block is re-keyed:
     * the place is stale (the largest class moved down one) and the
     * re-key is refused */
    assert_int_equal(ml__ab_class_lower_bound(&l.ct, &l.c, 512ull * K), l.x[K]);
    ml__ab_class_erase(&l.t, &l.ct, &l.c, l.x[K - 1]);
    live[K - 1] = false;
    assert_false(ml__ab_class_shrink(&l.t, &l.ct, &l.c, l.x[K], 512ull * (K - 1), 1ull << 33));
    lone_check(&l);
    /* right after a lower bound it is taken: 512 (K - 1) sits between the
     * class below (512 (K - 2)) and the block's own size */
    assert_int_equal(ml__ab_class_lower_bound(&l.ct, &l.c, 512ull * K - 100), l.x[K]);
    assert_true(ml__ab_class_shrink(&l.t, &l.ct, &l.c, l.x[K], 512ull * (K - 1), 1ull << 33));
    live[K] = false;
    live[K - 1] = true;
    l.x[K - 1] = l.x[K];
    lone_check(&l);
    lone_bounds(&l, live);

    /* every other size out, then the rest from the top: chunks join */
    for (uint32_t j = 1; j < K; j += 2) {
        ml__ab_class_erase(&l.t, &l.ct, &l.c, l.x[j]);
        live[j] = false;
        lone_check(&l);
    }
    lone_bounds(&l, live);
    for (uint32_t j = K - 1; j >= 2; j--)
        if (live[j]) {
            ml__ab_class_erase(&l.t, &l.ct, &l.c, l.x[j]);
            live[j] = false;
            lone_check(&l);
        }
    assert_int_equal(l.c.nch, 0);
    assert_int_equal(l.c.n, 0);
    ml__ab_classes_free(&l.c);
    ml__ab_table_free(&l.t);
    ml__ab_cls_table_free(&l.ct);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(many_classes),
        cmocka_unit_test(index_at_its_bound),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
