/* Fuzz target: the allocator trace reader (`memledger allocator TRACE.csv`)
 * and the allocator simulator on what it reads, under three configurations
 * (docs/allocator.md); after every event the simulator's structures must
 * agree with each other (ml__alloc_sim_check), else the target traps. */
#include <stdint.h>
#include <stdlib.h>

#include "alloc/alloc.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

#define MiB (1ull << 20)

static void run(const ml_alloc_trace *t, const ml_alloc_config *c, uint64_t *h)
{
    ml_alloc_sim *s = NULL;
    if (ml__alloc_sim_create(c, &s) != ML_ALLOC_OK)
        return;
    for (size_t i = 0; i < t->n; i++) {
        const ml_alloc_event *e = &t->ev[i];
        ml_alloc_result r = e->empty_cache ? ml__alloc_sim_empty_cache(s)
                            : e->free      ? ml__alloc_sim_free(s, h[e->slot])
                                           : ml__alloc_sim_malloc(s, e->bytes, &h[i]);
        if (r != ML_ALLOC_OK)
            break; /* the first OOM ends a replay, as in ml__alloc_replay */
        if (ml__alloc_sim_check(s))
            __builtin_trap();
    }
    ml_alloc_stats st;
    ml__alloc_sim_stats(s, &st);
    if (st.reserved.peak < st.allocated.peak || st.reserved.current < st.allocated.current)
        __builtin_trap(); /* reserved covers what is allocated */
    ml__alloc_sim_destroy(s);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    ml_alloc_trace *t = NULL;
    ml_error e;
    if (ml__alloc_trace_parse((const char *)data, size, "fuzz.csv", &t, &e) != ML_OK)
        return 0;
    uint64_t *h = calloc(t->n + 1, sizeof *h);
    if (h) {
        ml_alloc_config c = ml__alloc_config_defaults();
        run(t, &c, h);
        /* a small device with max_split_size, the GC and power-of-two rounding */
        c.device_bytes = 96 * MiB;
        c.max_split_size = 32 * MiB;
        c.gc_threshold = 0.5;
        c.roundup_power2_divisions = 4;
        run(t, &c, h);
        c = ml__alloc_config_defaults();
        c.mode = ML_ALLOC_EXPANDABLE;
        c.device_bytes = 96 * MiB;
        run(t, &c, h);
    }
    free(h);
    ml__alloc_trace_free(t);
    return 0;
}
