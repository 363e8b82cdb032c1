/* The caching-allocator simulator (src/alloc/, docs/allocator.md). Each
 * expected figure is derived in the test from PyTorch's rules (round_size,
 * get_allocation_size, should_split, the max_split_size checks of
 * get_free_block, release_cached_blocks, expandable pages), never copied
 * from the simulator's output; then a differential test against the simple
 * reference (alloc_reference.c) on thousands of random traces, and host
 * allocation failures injected into replays (linked with --wrap). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "alloc/alloc.h"
#include "alloc_reference.h"

#define KiB (1ull << 10)
#define MiB (1ull << 20)

/* host allocation failures (armed only around the simulator's calls) */
#include "fault_inject.h"

/* ---- helpers ---- */

static ml_alloc_sim *sim(ml_alloc_mode mode, uint64_t device, uint64_t max_split)
{
    ml_alloc_config c = ml__alloc_config_defaults();
    c.mode = mode;
    c.device_bytes = device;
    c.max_split_size = max_split;
    ml_alloc_sim *s = NULL;
    assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_OK);
    return s;
}

static uint64_t take(ml_alloc_sim *s, uint64_t bytes)
{
    uint64_t h = 0;
    assert_int_equal(ml__alloc_sim_malloc(s, bytes, &h), ML_ALLOC_OK);
    return h;
}

static void give(ml_alloc_sim *s, uint64_t h)
{
    assert_int_equal(ml__alloc_sim_free(s, h), ML_ALLOC_OK);
}

static ml_alloc_stats stats(const ml_alloc_sim *s)
{
    ml_alloc_stats st;
    ml__alloc_sim_stats(s, &st);
    return st;
}

/* ---- the rules, one at a time ---- */

static void one_byte(void **state)
{
    (void)state;
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 0, 0);
    take(s, 1);
    ml_alloc_stats st = stats(s);
    /* round_size: below kMinBlockSize (512) rounds to 512; 512 <= kSmallSize
     * (1 MiB): the small pool, whose segments are kSmallBuffer (2 MiB) */
    assert_int_equal(st.allocated.current, 512);
    assert_int_equal(st.requested.current, 1);
    assert_int_equal(st.reserved.current, 2 * MiB);
    assert_int_equal(st.segments.current, 1);
    assert_int_equal(st.events, 1);
    ml__alloc_sim_destroy(s);
}

static void large_buffer_shared(void **state)
{
    (void)state;
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 0, 0);
    /* 1 MiB + 1 B rounds to 1 MiB + 512 B: over kSmallSize, under
     * kMinLargeAlloc (10 MiB): a kLargeBuffer (20 MiB) segment, split since
     * the remainder 19 MiB - 512 B exceeds kSmallSize */
    take(s, MiB + 1);
    assert_int_equal(stats(s).reserved.current, 20 * MiB);
    /* 5 MiB fits the cached remainder: no new segment */
    take(s, 5 * MiB);
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.reserved.current, 20 * MiB);
    assert_int_equal(st.segments.peak, 1);
    assert_int_equal(st.allocated.current, (MiB + 512) + 5 * MiB);
    ml__alloc_sim_destroy(s);
}

/* 12 MiB, free, 14 MiB, free, 26 MiB: requests of 10 MiB or more get a
 * segment of their size rounded to kRoundLarge (2 MiB) and none of the
 * cached blocks fits the next, larger request. */
static void grow_then_release(void **state)
{
    (void)state;
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 0, 0);
    give(s, take(s, 12 * MiB));
    give(s, take(s, 14 * MiB));
    take(s, 26 * MiB);
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.allocated.peak, 26 * MiB);
    assert_int_equal(st.reserved.peak, (12 + 14 + 26) * MiB);
    assert_int_equal(st.segments.peak, 3);
    assert_int_equal(st.num_alloc_retries, 0);
    ml__alloc_sim_destroy(s);

    /* 40 MiB of device: 26 + 26 > 40, so cudaMalloc fails; the cached whole
     * segments are released (reserved 0) and the retry succeeds. The peak
     * (max_memory_reserved) is the highest ever: 12 + 14 before, 26 after. */
    s = sim(ML_ALLOC_CACHING, 40 * MiB, 0);
    give(s, take(s, 12 * MiB));
    give(s, take(s, 14 * MiB));
    take(s, 26 * MiB);
    st = stats(s);
    assert_int_equal(st.reserved.current, 26 * MiB);
    assert_int_equal(st.reserved.peak, 26 * MiB);
    assert_int_equal(st.segments.current, 1);
    assert_int_equal(st.num_alloc_retries, 1);
    assert_int_equal(st.device_frees, 2);
    assert_int_equal(st.oom_event, 0);
    ml__alloc_sim_destroy(s);
}

static void grow_then_release_expandable(void **state)
{
    (void)state;
    /* expandable segments: the large pool maps 20 MiB pages as needed. 12
     * MiB maps one page and splits; freed, the page is one free block, which
     * serves 14 MiB; 26 MiB needs that block plus one more page, mapped at
     * its end: 40 MiB reserved, two mappings, one segment. */
    ml_alloc_sim *s = sim(ML_ALLOC_EXPANDABLE, 0, 0);
    give(s, take(s, 12 * MiB));
    give(s, take(s, 14 * MiB));
    take(s, 26 * MiB);
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.allocated.peak, 26 * MiB);
    assert_int_equal(st.reserved.peak, 2 * 20 * MiB);
    assert_int_equal(st.device_allocs, 2);
    assert_int_equal(st.segments.peak, 1);
    ml__alloc_sim_destroy(s);

    /* 30 MiB of device: the second page would make 40 MiB. The release
     * unmaps the free page (reserved 0) and, the segment now all unmapped,
     * drops it; a fresh segment then needs ceil(26 / 20) = 2 pages = 40 MiB
     * > 30 MiB: out of memory at event 5. */
    s = sim(ML_ALLOC_EXPANDABLE, 30 * MiB, 0);
    give(s, take(s, 12 * MiB));
    give(s, take(s, 14 * MiB));
    uint64_t h = 0;
    assert_int_equal(ml__alloc_sim_malloc(s, 26 * MiB, &h), ML_ALLOC_OOM);
    st = stats(s);
    assert_int_equal(st.oom_event, 5);
    assert_int_equal(st.num_ooms, 1);
    assert_int_equal(st.num_alloc_retries, 1);
    assert_int_equal(st.reserved.current, 0);
    assert_int_equal(st.reserved.peak, 20 * MiB);
    /* the fresh segment keeps its address space, without pages */
    assert_int_equal(st.segments.current, 1);
    assert_int_equal(st.device_frees, 1);
    ml__alloc_sim_destroy(s);

    /* the small pool maps 2 MiB pages */
    s = sim(ML_ALLOC_EXPANDABLE, 0, 0);
    take(s, 1);
    st = stats(s);
    assert_int_equal(st.allocated.current, 512);
    assert_int_equal(st.reserved.current, 2 * MiB);
    ml__alloc_sim_destroy(s);
}

static void oversize_blocks(void **state)
{
    (void)state;
    const uint64_t msplit = 64 * MiB;
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 180 * MiB, msplit);
    give(s, take(s, 100 * MiB)); /* an oversize cached block (>= max_split_size) */
    /* 30 MiB < max_split_size: the oversize block may not serve it */
    take(s, 30 * MiB);
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.reserved.current, (100 + 30) * MiB);
    /* 90 MiB >= max_split_size and 100 < 90 + kLargeBuffer: served whole,
     * unsplit (an oversize request is never split): 100 MiB allocated */
    uint64_t h = take(s, 90 * MiB);
    st = stats(s);
    assert_int_equal(st.reserved.current, 130 * MiB);
    assert_int_equal(st.allocated.current, (30 + 100) * MiB);
    give(s, h);
    /* 70 MiB: 100 >= 70 + 20 MiB, refused; a new 70 MiB segment would make
     * 200 > 180 MiB, so release_available_cached_blocks frees the oversize
     * block (no retry counted) and the second cudaMalloc succeeds */
    take(s, 70 * MiB);
    st = stats(s);
    assert_int_equal(st.reserved.current, (30 + 70) * MiB);
    assert_int_equal(st.reserved.peak, 130 * MiB);
    assert_int_equal(st.num_alloc_retries, 0);
    assert_int_equal(st.device_frees, 1);
    /* the peak's own figures, kept past the release: just after the 30 MiB
     * request that raised it, 30 MiB allocated in 2 segments */
    assert_int_equal(st.at_peak_allocated, 30 * MiB);
    assert_int_equal(st.at_peak_segments, 2);
    ml__alloc_sim_destroy(s);
}

static void split_thresholds(void **state)
{
    (void)state;
    /* large pool: split when the remainder exceeds kSmallSize (1 MiB) */
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 0, 0);
    take(s, 18 * MiB + 1); /* 18 MiB + 512 in a 20 MiB segment: 2 MiB - 512 left */
    assert_int_equal(stats(s).allocated.current, 18 * MiB + 512);
    ml__alloc_sim_destroy(s);
    s = sim(ML_ALLOC_CACHING, 0, 0);
    take(s, 19 * MiB); /* exactly 1 MiB left: not more than kSmallSize, the whole block */
    assert_int_equal(stats(s).allocated.current, 20 * MiB);
    ml__alloc_sim_destroy(s);

    /* small pool: split when at least kMinBlockSize (512) is left */
    s = sim(ML_ALLOC_CACHING, 0, 0);
    take(s, MiB);            /* 1 MiB of the 2 MiB segment */
    take(s, MiB - 512);      /* leaves exactly 512 B: split */
    take(s, 512);            /* served by that 512 B block */
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.segments.peak, 1);
    assert_int_equal(st.allocated.current, 2 * MiB);
    /* a small request never takes large-pool memory */
    give(s, take(s, 2 * MiB)); /* a cached 20 MiB large-pool segment */
    take(s, 4 * KiB);
    st = stats(s);
    assert_int_equal(st.segments.current, 3);
    assert_int_equal(st.reserved.current, 2 * MiB + 20 * MiB + 2 * MiB);
    ml__alloc_sim_destroy(s);
}

static void merging(void **state)
{
    (void)state;
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 0, 0);
    uint64_t a = take(s, 4 * MiB), b = take(s, 4 * MiB), c = take(s, 4 * MiB);
    assert_int_equal(stats(s).segments.current, 1); /* all three in one 20 MiB segment */
    give(s, a);
    give(s, c); /* merges with the 8 MiB remainder */
    give(s, b); /* joins both neighbours: the whole 20 MiB segment is one free block */
    take(s, 20 * MiB); /* served by it: no second segment */
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.segments.peak, 1);
    assert_int_equal(st.reserved.peak, 20 * MiB);
    ml__alloc_sim_destroy(s);

    /* a merged whole segment is released by empty_cache */
    s = sim(ML_ALLOC_CACHING, 0, 0);
    a = take(s, 4 * MiB);
    b = take(s, 4 * MiB);
    give(s, b);
    give(s, a);
    assert_int_equal(ml__alloc_sim_empty_cache(s), ML_ALLOC_OK);
    st = stats(s);
    assert_int_equal(st.reserved.current, 0);
    assert_int_equal(st.segments.current, 0);
    ml__alloc_sim_destroy(s);
}

static void oom_index(void **state)
{
    (void)state;
    /* 30 MiB: two 12 MiB segments (24 MiB), the third would make 36 MiB;
     * nothing is cached to release: out of memory at event 3 */
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 30 * MiB, 0);
    take(s, 12 * MiB);
    take(s, 12 * MiB);
    uint64_t h = 77;
    assert_int_equal(ml__alloc_sim_malloc(s, 12 * MiB, &h), ML_ALLOC_OOM);
    assert_int_equal(h, 77); /* untouched */
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.oom_event, 3);
    assert_int_equal(st.num_alloc_retries, 1);
    assert_int_equal(st.reserved.current, 24 * MiB);
    /* the simulator goes on: a small request still fits */
    take(s, 1);
    assert_int_equal(stats(s).oom_event, 3);
    ml__alloc_sim_destroy(s);
}

static void garbage_collection(void **state)
{
    (void)state;
    /* 200 MiB device, threshold 0.5: above 100 MiB reserved, a new segment
     * first frees the cached whole segments of at least the average age
     * (get_free_block calls since they were cached). */
    ml_alloc_config c = ml__alloc_config_defaults();
    c.device_bytes = 200 * MiB;
    c.gc_threshold = 0.5;
    ml_alloc_sim *s = NULL;
    assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_OK);
    give(s, take(s, 30 * MiB)); /* call 1; a cached at count 1 */
    uint64_t b = take(s, 40 * MiB); /* call 2: 30 MiB too small; 70 MiB reserved */
    uint64_t d = take(s, 50 * MiB); /* call 3: 120 MiB reserved */
    give(s, b);                     /* cached at count 3 */
    give(s, d);                     /* cached at count 3 */
    /* call 4 finds nothing for 60 MiB; 120 > 100: ages a 3, b 1, d 1, mean
     * 5/3: only a is as old; 30 MiB reclaimed >= 120 - 100 ends the
     * collection. Then a new 60 MiB segment. */
    take(s, 60 * MiB);
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.reserved.current, (40 + 50 + 60) * MiB);
    assert_int_equal(st.device_frees, 1);
    assert_int_equal(st.segments.current, 3);
    ml__alloc_sim_destroy(s);
}

static void rounding(void **state)
{
    (void)state;
    ml_alloc_config c = ml__alloc_config_defaults();
    assert_int_equal(ml__alloc_round_size(&c, 0), 512);
    assert_int_equal(ml__alloc_round_size(&c, 513), 1024);
    assert_int_equal(ml__alloc_segment_size(MiB), 2 * MiB);
    assert_int_equal(ml__alloc_segment_size(MiB + 512), 20 * MiB);
    assert_int_equal(ml__alloc_segment_size(10 * MiB - 512), 20 * MiB);
    assert_int_equal(ml__alloc_segment_size(10 * MiB), 10 * MiB);
    assert_int_equal(ml__alloc_segment_size(10 * MiB + 512), 12 * MiB);
    /* roundup_power2_divisions 4: between 1 MiB and 2 MiB the steps are
     * 256 KiB; 1,300,000 B rounds up to 1 MiB + 256 KiB */
    c.roundup_power2_divisions = 4;
    assert_int_equal(ml__alloc_round_size(&c, 1300000), MiB + 256 * KiB);
    assert_int_equal(ml__alloc_round_size(&c, 2 * MiB), 2 * MiB); /* a power of two */
    assert_int_equal(ml__alloc_round_size(&c, 2000), 2048);       /* <= 512 * 4: plain */
    ml_alloc_sim *s = NULL;
    assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_OK);
    take(s, 1300000);
    assert_int_equal(stats(s).allocated.current, MiB + 256 * KiB);
    ml__alloc_sim_destroy(s);
}

static void handles_and_config(void **state)
{
    (void)state;
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 0, 0);
    uint64_t z = 1;
    assert_int_equal(ml__alloc_sim_malloc(s, 0, &z), ML_ALLOC_OK); /* no block, like PyTorch */
    assert_int_equal(z, 0);
    give(s, z);
    uint64_t h = take(s, 100);
    give(s, h);
    assert_int_equal(ml__alloc_sim_free(s, h), ML_ALLOC_BAD_HANDLE); /* twice */
    uint64_t h2 = take(s, 100); /* may reuse the slot: the old handle stays stale */
    assert_int_equal(ml__alloc_sim_free(s, h), ML_ALLOC_BAD_HANDLE);
    assert_int_equal(ml__alloc_sim_free(s, 12345678), ML_ALLOC_BAD_HANDLE);
    give(s, h2);
    assert_int_equal(stats(s).events, 6); /* refused frees are not events */
    assert_int_equal(ml__alloc_sim_malloc(s, 1ull << 60, &z), ML_ALLOC_OOM); /* over 1 EiB */
    ml__alloc_sim_reset_peaks(s);
    ml_alloc_stats st = stats(s);
    assert_int_equal(st.allocated.peak, 0);
    assert_int_equal(st.reserved.peak, 2 * MiB);
    ml__alloc_sim_destroy(s);
    ml__alloc_sim_destroy(NULL);

    ml_alloc_config c = ml__alloc_config_defaults();
    c.max_split_size = 20 * MiB - 512; /* PyTorch 2.9+: at least 20 MiB */
    assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_BAD_CONFIG);
    c.max_split_size = 20 * MiB;
    assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_OK);
    ml__alloc_sim_destroy(s);
    c = ml__alloc_config_defaults();
    c.gc_threshold = 1;
    assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_BAD_CONFIG);
    c = ml__alloc_config_defaults();
    c.roundup_power2_divisions = 3;
    assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_BAD_CONFIG);

    /* no cache: each free returns its memory */
    s = sim(ML_ALLOC_NONE, 0, 0);
    h = take(s, 3 * MiB + 1);
    give(s, take(s, 1));
    st = stats(s);
    assert_int_equal(st.reserved.current, 3 * MiB + 512);
    assert_int_equal(st.reserved.peak, 3 * MiB + 1024);
    assert_int_equal(st.allocated.peak, st.reserved.peak);
    ml__alloc_sim_destroy(s);
}

/* ---- traces ---- */

static ml_alloc_trace *parse_ok(const char *text)
{
    ml_alloc_trace *t = NULL;
    ml_error e;
    ml_status st = ml__alloc_trace_parse(text, strlen(text), "t.csv", &t, &e);
    if (st != ML_OK)
        fail_msg("parse failed: %u:%u: %s", e.line, e.col, e.msg);
    return t;
}

static void parse_bad(const char *text, unsigned line, unsigned col, const char *words)
{
    ml_alloc_trace *t = NULL;
    ml_error e;
    ml_status st = ml__alloc_trace_parse(text, strlen(text), "t.csv", &t, &e);
    assert_int_not_equal(st, ML_OK);
    assert_null(t);
    if (e.line != line || e.col != col || !strstr(e.msg, words))
        fail_msg("got %u:%u: %s; expected %u:%u and '%s'", e.line, e.col, e.msg, line, col,
                 words);
}

static void trace_parse(void **state)
{
    (void)state;
    ml_alloc_trace *t = parse_ok("action,id,bytes\r\n# a comment\n\nalloc,x,100\n"
                                 "alloc, y , 2000000\nfree,x,\nalloc,x,5\nfree,y\nfree,x,5\n");
    assert_int_equal(t->n, 6);
    assert_int_equal(t->allocs, 3);
    assert_int_equal(t->frees, 3);
    assert_string_equal(t->ids[1], "y");
    assert_int_equal(t->ev[2].slot, 0); /* the free of x names its alloc */
    assert_int_equal(t->ev[4].slot, 1);
    assert_int_equal(t->ev[1].line, 5);
    ml_alloc_replay_result r;
    ml_alloc_config c = ml__alloc_config_defaults();
    assert_int_equal(ml__alloc_replay(&c, t, &r), ML_ALLOC_OK);
    assert_int_equal(r.oom_index, SIZE_MAX);
    /* 100 -> 512 (small, 2 MiB), 2000000 -> 2000384 (large, 20 MiB) */
    assert_int_equal(r.stats.reserved.peak, 22 * MiB);
    assert_int_equal(r.stats.allocated.peak, 512 + 2000384);
    c.device_bytes = 21 * MiB; /* the 20 MiB segment does not fit beside the 2 MiB one */
    assert_int_equal(ml__alloc_replay(&c, t, &r), ML_ALLOC_OK);
    assert_int_equal(r.oom_index, 1);
    ml__alloc_trace_free(t);

    parse_bad("", 0, 0, "empty");
    parse_bad("\n\n# nothing\n", 0, 0, "empty");
    parse_bad("action,addr,size,stream\nalloc,1,2,0\n", 1, 1, "header");
    parse_bad("action,id,bytes\nalloc,a,12x\n", 2, 9, "not a whole number");
    parse_bad("action,id,bytes\nalloc,a,-1\n", 2, 9, "not a whole number");
    parse_bad("action,id,bytes\nalloc,a,99999999999999999999\n", 2, 9, "64 bits");
    parse_bad("action,id,bytes\nalloc,a,1\nalloc,a,2\n", 3, 7, "already allocated (line 2)");
    parse_bad("action,id,bytes\nalloc,a,1\nfree,b,1\n", 3, 6, "no earlier line");
    parse_bad("action,id,bytes\nalloc,a,1\nfree,a,1\nfree,a,1\n", 4, 6, "line 3 freed");
    parse_bad("action,id,bytes\nmalloc,a,1\n", 2, 1, "unknown action");
    parse_bad("action,id,bytes\nalloc,a\n", 2, 1, "expected 3 fields");
    parse_bad("action,id,bytes\nalloc,a,1,2\n", 2, 1, "expected 3 fields");
    parse_bad("action,id,bytes\nalloc,,1\n", 2, 7, "id is empty");
    parse_bad("action,id,bytes\nempty_cache,x,\n", 2, 13, "no id and no bytes");
    parse_bad("action,id,bytes\nempty_cache,,5\n", 2, 14, "no id and no bytes");
    parse_bad("action,id,bytes\nempty_cache,,,\n", 2, 14, "no id and no bytes");
}

/* empty_cache in a trace, and a trace replayed from the state another
 * leaves (ml__alloc_replay_from: memledger allocator --allocator-start).
 * Segment sizes by get_allocation_size: 30 MiB and 40 MiB requests (above
 * 10 MiB) get segments of their own size, a 1 MiB one (small) a 2 MiB one. */
static void trace_start(void **state)
{
    (void)state;
    ml_alloc_trace *start = parse_ok("action,id,bytes\nalloc,a,31457280\nalloc,b,1048576\n"
                                     "free,a\nempty_cache\n");
    ml_alloc_trace *kept = parse_ok("action,id,bytes\nalloc,a,31457280\nalloc,b,1048576\n"
                                    "free,a\n");
    ml_alloc_trace *t = parse_ok("action,id,bytes\nalloc,c,41943040\nfree,c\nempty_cache,,\n");
    assert_int_equal(start->n, 4);
    assert_int_equal(start->empties, 1);
    assert_true(start->ev[3].empty_cache && !start->ev[3].free);
    assert_int_equal(t->allocs, 1);
    assert_int_equal(t->empties, 1);
    ml_alloc_config c = ml__alloc_config_defaults();
    ml_alloc_replay_result r;
    /* empty_cache released a's 30 MiB segment; b keeps its 2 MiB one */
    assert_int_equal(ml__alloc_replay_from(&c, start, t, &r), ML_ALLOC_OK);
    assert_int_equal(r.start.reserved.current, 2 * MiB);
    assert_int_equal(r.start.allocated.current, 1 * MiB);
    assert_int_equal(r.start.segments.current, 1);
    assert_int_equal(r.stats.reserved.peak, 42 * MiB); /* b's segment and c's */
    assert_int_equal(r.stats.allocated.peak, 41 * MiB);
    assert_int_equal(r.stats.device_allocs, 1); /* the trace's own cudaMalloc */
    assert_int_equal(r.stats.device_frees, 1);  /* its empty_cache released c's */
    assert_int_equal(r.stats.reserved.current, 2 * MiB);
    /* without the empty_cache the cached 30 MiB cannot hold c: 30 + 2 + 40 */
    assert_int_equal(ml__alloc_replay_from(&c, kept, t, &r), ML_ALLOC_OK);
    assert_int_equal(r.start.reserved.current, 32 * MiB);
    assert_int_equal(r.stats.reserved.peak, 72 * MiB);
    /* the peaks start at the state, not at the start's own (32 MiB): d
     * fits in the free half of b's segment */
    ml_alloc_trace *small = parse_ok("action,id,bytes\nalloc,d,512\nfree,d\n");
    assert_int_equal(ml__alloc_replay_from(&c, start, small, &r), ML_ALLOC_OK);
    assert_int_equal(r.stats.reserved.peak, 2 * MiB);
    assert_int_equal(r.stats.allocated.peak, 1 * MiB + 512);
    ml__alloc_trace_free(small);
    /* a start that does not fit the device is an error, not the trace's OOM */
    c.device_bytes = 20 * MiB;
    assert_int_equal(ml__alloc_replay_from(&c, start, t, &r), ML_ALLOC_OOM);
    ml__alloc_trace_free(start);
    ml__alloc_trace_free(kept);
    ml__alloc_trace_free(t);
}

/* ---- the differential test ---- */

static uint64_t rng_state;

static uint64_t rnd(void) /* splitmix64 */
{
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

static uint64_t below(uint64_t n)
{
    return n ? rnd() % n : 0;
}

static ml_alloc_config random_config(void)
{
    ml_alloc_config c = ml__alloc_config_defaults();
    uint64_t m = below(20);
    c.mode = m < 10 ? ML_ALLOC_CACHING : m < 17 ? ML_ALLOC_EXPANDABLE : ML_ALLOC_NONE;
    if (below(10) < 6)
        c.device_bytes = (100 + below(3000)) * MiB + 512 * below(100);
    if (below(10) < 3)
        c.max_split_size = (21 + below(300)) * MiB;
    if (c.mode == ML_ALLOC_CACHING && c.device_bytes && below(10) < 3)
        c.gc_threshold = 0.3 + 0.1 * (double)below(6);
    if (below(10) < 2)
        c.roundup_power2_divisions = 1u << below(4);
    return c;
}

static uint64_t random_size(const uint64_t *seen, size_t nseen)
{
    uint64_t k = below(100);
    if (k < 10 && nseen)
        return seen[below(nseen)]; /* equal sizes: ties broken by address */
    if (k < 45)
        return 1 + below(MiB + MiB / 8);
    if (k < 70)
        return MiB + below(9 * MiB);
    if (k < 92)
        return 10 * MiB + below(190 * MiB);
    if (k < 99)
        return 200 * MiB + below(400 * MiB);
    return below(3) ? 0 : 512 * (1 + below(4));
}

static void same_stats(const ml_alloc_stats *a, const ml_alloc_stats *b, int trace, size_t ev)
{
#define SAME(f)                                                                             \
    if (a->f != b->f)                                                                       \
        fail_msg("trace %d event %zu: " #f " %llu, the reference %llu", trace, ev,           \
                 (unsigned long long)a->f, (unsigned long long)b->f);
    SAME(allocated.current) SAME(allocated.peak) SAME(requested.current) SAME(requested.peak)
    SAME(reserved.current) SAME(reserved.peak) SAME(segments.current) SAME(segments.peak)
    SAME(device_allocs) SAME(device_frees) SAME(num_alloc_retries) SAME(num_ooms) SAME(events)
    SAME(oom_event)
#undef SAME
}

/* Every live allocation at the reference's address: the same block chosen
 * at every request (best fit, ties by address), not only the same totals. */
static void same_places(const ml_alloc_sim *s, const ref_sim *r, const uint64_t *hs,
                        const uint64_t *hr, size_t live, int trace, size_t ev)
{
    for (size_t i = 0; i < live; i++)
        if (ml__alloc_sim_address(s, hs[i]) != ref_address(r, hr[i]))
            fail_msg("trace %d event %zu: allocation %zu at %#llx, the reference %#llx", trace,
                     ev, i, (unsigned long long)ml__alloc_sim_address(s, hs[i]),
                     (unsigned long long)ref_address(r, hr[i]));
}

static void differential(void **state)
{
    (void)state;
    rng_state = 20261130;
    enum { TRACES = 3000, MAXLIVE = 256 };
    for (int tr = 0; tr < TRACES; tr++) {
        ml_alloc_config c = random_config();
        ml_alloc_sim *s = NULL;
        assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_OK);
        ref_sim *r = ref_create(&c);
        assert_non_null(r);
        uint64_t hs[MAXLIVE], hr[MAXLIVE], seen[64];
        size_t live = 0, nseen = 0, n = 40 + below(400);
        for (size_t ev = 0; ev < n; ev++) {
            bool do_free = live == MAXLIVE || (live && below(100) < 45);
            if (below(200) == 0) { /* now and then torch.cuda.empty_cache() */
                assert_int_equal(ml__alloc_sim_empty_cache(s), ML_ALLOC_OK);
                ref_empty_cache(r);
            } else if (do_free) {
                size_t k = below(live);
                assert_int_equal(ml__alloc_sim_free(s, hs[k]), ML_ALLOC_OK);
                assert_int_equal(ref_free(r, hr[k]), ML_ALLOC_OK);
                hs[k] = hs[live - 1];
                hr[k] = hr[live - 1];
                live--;
            } else {
                uint64_t bytes = random_size(seen, nseen);
                if (nseen < 64)
                    seen[nseen++] = bytes;
                else
                    seen[below(64)] = bytes;
                ml_alloc_result a = ml__alloc_sim_malloc(s, bytes, &hs[live]);
                ml_alloc_result b = ref_malloc(r, bytes, &hr[live]);
                if (a != b)
                    fail_msg("trace %d event %zu: malloc(%llu) gave %d, the reference %d", tr,
                             ev, (unsigned long long)bytes, a, b);
                if (a == ML_ALLOC_OK)
                    live++;
            }
            ml_alloc_stats x, y;
            ml__alloc_sim_stats(s, &x);
            ref_stats(r, &y);
            same_stats(&x, &y, tr, ev);
            same_places(s, r, hs, hr, live, tr, ev);
            const char *why = ml__alloc_sim_check(s);
            if (why)
                fail_msg("trace %d event %zu: %s", tr, ev, why);
        }
        ml__alloc_sim_destroy(s);
        ref_destroy(r);
    }
}

/* ml__alloc_sim_malloc_many and ml__alloc_sim_free_many (the planner's
 * calls: one per aggregate of tensors) against the reference's one call
 * per tensor: the same results and statistics after every batch, frees in
 * a random order, now and then a stale or repeated handle among them. */
static void batches(void **state)
{
    (void)state;
    rng_state = 20261201;
    enum { TRACES = 1500, MAXLIVE = 256, MAXBATCH = 24 };
    for (int tr = 0; tr < TRACES; tr++) {
        ml_alloc_config c = random_config();
        ml_alloc_sim *s = NULL;
        assert_int_equal(ml__alloc_sim_create(&c, &s), ML_ALLOC_OK);
        if (below(2))
            assert_int_equal(ml__alloc_sim_reserve(s, below(5000)), ML_ALLOC_OK);
        ref_sim *r = ref_create(&c);
        assert_non_null(r);
        uint64_t hs[MAXLIVE], hr[MAXLIVE], seen[64], bytes[MAXBATCH], got[MAXBATCH];
        uint64_t stale_s = 0, stale_r = 0; /* a handle freed already */
        size_t live = 0, nseen = 0, n = 10 + below(60);
        for (size_t ev = 0; ev < n; ev++) {
            size_t k = 1 + below(MAXBATCH - 2);
            if (live && below(100) < 45) {
                /* free k live handles, picked at random */
                uint64_t fs[MAXBATCH];
                size_t m = 0;
                for (; m < k && live; m++) {
                    size_t j = below(live);
                    fs[m] = hs[j];
                    assert_int_equal(ref_free(r, hr[j]), ML_ALLOC_OK);
                    stale_s = hs[j];
                    stale_r = hr[j];
                    hs[j] = hs[live - 1];
                    hr[j] = hr[live - 1];
                    live--;
                }
                bool bad = stale_s && below(4) == 0;
                if (bad) { /* the last one freed, named twice, or one freed earlier */
                    fs[m++] = stale_s;
                    assert_int_equal(ref_free(r, stale_r), ML_ALLOC_BAD_HANDLE);
                }
                assert_int_equal(ml__alloc_sim_free_many(s, fs, m),
                                 bad ? ML_ALLOC_BAD_HANDLE : ML_ALLOC_OK);
            } else {
                k = k < MAXLIVE - live ? k : MAXLIVE - live;
                for (size_t i = 0; i < k; i++) {
                    bytes[i] = random_size(seen, nseen);
                    if (nseen < 64)
                        seen[nseen++] = bytes[i];
                    else
                        seen[below(64)] = bytes[i];
                }
                size_t done = SIZE_MAX, want = 0;
                ml_alloc_result a = ml__alloc_sim_malloc_many(s, bytes, k, got, &done);
                ml_alloc_result b = ML_ALLOC_OK;
                while (want < k &&
                       (b = ref_malloc(r, bytes[want], &hr[live + want])) == ML_ALLOC_OK)
                    want++;
                if (a != b || done != want)
                    fail_msg("trace %d batch %zu: malloc_many gave %d after %zu, the reference "
                             "%d after %zu", tr, ev, a, done, b, want);
                memcpy(&hs[live], got, done * sizeof got[0]);
                live += done;
            }
            ml_alloc_stats x, y;
            ml__alloc_sim_stats(s, &x);
            ref_stats(r, &y);
            same_stats(&x, &y, tr, ev);
            same_places(s, r, hs, hr, live, tr, ev);
            const char *why = ml__alloc_sim_check(s);
            if (why)
                fail_msg("trace %d event %zu: %s", tr, ev, why);
        }
        ml__alloc_sim_destroy(s);
        ref_destroy(r);
    }
}

/* ---- host out of memory, both ways (sqlite's malloc tests) ---- */

static void nomem(void **state)
{
    (void)state;
    rng_state = 7;
    ml_alloc_config c = ml__alloc_config_defaults();
    for (int mode = 0; mode < 2; mode++) {
        c.mode = mode ? ML_ALLOC_EXPANDABLE : ML_ALLOC_CACHING;
        char *text = NULL;
        size_t len = 0;
        FILE *f = open_memstream(&text, &len);
        assert_non_null(f);
        fputs("action,id,bytes\n", f);
        for (int i = 0; i < 400; i++) {
            if (i % 3 == 2)
                fprintf(f, "free,t%d,\n", i - 1);
            else
                fprintf(f, "alloc,t%d,%llu\n", i, (unsigned long long)random_size(NULL, 0));
        }
        fclose(f);
        ml_alloc_trace *t = parse_ok(text);
        free(text);
        ml_alloc_replay_result want, got;
        assert_int_equal(ml__alloc_replay(&c, t, &want), ML_ALLOC_OK);
        unsigned ok = 0, failed = 0;
        for (int p = 0; p < 2; p++) {
            for (long n = 1;; n++) {
                persistent = p;
                failures = 0;
                countdown = n;
                ml_alloc_result res = ml__alloc_replay(&c, t, &got);
                countdown = -1;
                if (res == ML_ALLOC_OK) {
                    /* a run that succeeds gives the fault-free answer */
                    assert_memory_equal(&got.stats, &want.stats, sizeof got.stats);
                    ok++;
                    if (!failures)
                        break; /* past every allocation of the replay */
                } else {
                    assert_int_equal(res, ML_ALLOC_NOMEM);
                    failed++;
                }
            }
        }
        assert_true(failed > 0 && ok > 0);
        ml__alloc_trace_free(t);
    }
    persistent = false;
}

/* A failed grow leaves the simulator usable (the call changed nothing):
 * the block table grows, then the size classes' table fails to; the next
 * allocation grows it again before it can be needed, and frees that leave
 * many distinct sizes cached (a class each) stay within it. */
static void nomem_then_frees(void **state)
{
    (void)state;
    ml_alloc_sim *s = sim(ML_ALLOC_CACHING, 0, 0);
    uint64_t h, hs[140];
    give(s, take(s, 512));
    persistent = false;
    countdown = 2; /* the block table's realloc, then the class table's */
    ml_alloc_result r = ml__alloc_sim_reserve(s, 200);
    countdown = -1;
    assert_int_equal(r, ML_ALLOC_NOMEM);
    assert_int_equal(failures > 0, true);
    for (int i = 0; i < 140; i++) /* 12, 14, ... MiB: a segment and a class each */
        hs[i] = take(s, (12ull + 2 * (unsigned)i) * MiB);
    for (int i = 0; i < 140; i++)
        give(s, hs[i]);
    assert_null(ml__alloc_sim_check(s));
    ml_alloc_stats st;
    ml__alloc_sim_stats(s, &st);
    /* 140 segments of 12 + 2i MiB (rounded to 2 MiB: themselves) and the
     * small pool's 2 MiB: all cached */
    uint64_t want = 2 * MiB;
    for (int i = 0; i < 140; i++)
        want += (12ull + 2 * (unsigned)i) * MiB;
    assert_int_equal(st.reserved.current, want);
    assert_int_equal(st.allocated.current, 0);
    assert_int_equal(ml__alloc_sim_malloc(s, 12 * MiB, &h), ML_ALLOC_OK); /* a cached one */
    ml__alloc_sim_stats(s, &st);
    assert_int_equal(st.reserved.current, want);
    ml__alloc_sim_destroy(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(one_byte),
        cmocka_unit_test(large_buffer_shared),
        cmocka_unit_test(grow_then_release),
        cmocka_unit_test(grow_then_release_expandable),
        cmocka_unit_test(oversize_blocks),
        cmocka_unit_test(split_thresholds),
        cmocka_unit_test(merging),
        cmocka_unit_test(oom_index),
        cmocka_unit_test(garbage_collection),
        cmocka_unit_test(rounding),
        cmocka_unit_test(handles_and_config),
        cmocka_unit_test(trace_parse),
        cmocka_unit_test(trace_start),
        cmocka_unit_test(differential),
        cmocka_unit_test(nomem_then_frees),
        cmocka_unit_test(batches),
        cmocka_unit_test(nomem),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
