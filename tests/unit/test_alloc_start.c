/* The plan's simulated allocator: a plan that starts from another trace's
 * state (ml_device.start, --allocator-start; docs/allocator.md, "A process
 * that ran something before"), the cuBLAS workspaces a plan from an empty
 * cache makes instead, and frees by name. The tiny MLP of
 * test_ledger_invariants.c: its
 * tensors are all under 1 MiB and fit one 2 MiB small-pool segment, made by
 * its first allocation (the two parameters, 1,024 B after rounding). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "harness.h"
#include "ledger/reserved.h"

static const char tiny[] = "model:\n  type: sequential\n  input: [8]\n  layers:\n"
                           "    - linear: {out: 16, bias: false}\n    - gelu: {}\n"
                           "    - linear: {out: 4, bias: false}\n  loss: mse\n"
                           "training:\n  micro_batch: 30\n  optimizer: adam\n";

/* The trace `text` as a file, loaded through the public API. */
static ml_alloc_trace *load_trace(const char *text)
{
    char path[] = "/tmp/memledger-start-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
    ml_alloc_trace *t = NULL;
    ml_error e;
    ml_status st = ml_alloc_trace_load_file(path, &t, &e);
    unlink(path);
    if (st != ML_OK)
        fail_msg("loading the trace failed: %s", e.msg);
    return t;
}

static const ml_summary *plan_from(const ml_model *m, ml_allocator a, const ml_alloc_trace *t,
                                   ml_ledger **l)
{
    ml_config c = ml_model_config(m);
    c.device.allocator = a;
    c.device.start = t;
    *l = eval(m, &c, false);
    return ml_ledger_summary(*l);
}

/* cuBLAS's workspaces (ml_device.blas_workspace; CublasHandlePool.cpp: one
 * per handle and stream, allocated through the caching allocator at a
 * thread's first product and kept): a plan from an empty cache makes the
 * forward thread's and the autograd engine's, both in the first iteration.
 * The tiny MLP's own tensors stay in their 2 MiB small segment, so the
 * workspaces' segments add up by hand:
 *   - 8,519,680 B (PyTorch's default off Hopper): above 1 MiB and under
 *     10 MiB, the first takes a 20 MiB segment (kLargeBuffer) and the second
 *     its free 11.875 MiB: 2 + 20 MiB in 2 segments;
 *   - 32 MiB (Hopper): each its own segment of its size (above 10 MiB, a
 *     multiple of 2 MiB), the first left full: 2 + 32 + 32 MiB, 3 segments;
 *   - 12 MiB: 12 MiB segments, full, one each: 2 + 12 + 12 MiB, which shows
 *     two are made;
 *   - 0: none (2 MiB); a start state: none either (its process made them).
 * With expandable segments the large pool maps 20 MiB pages: both 8,519,680 B
 * in one, 22 MiB; 32 MiB twice in 64 MiB: four pages, 82 MiB; either way
 * one segment a pool (the small pool's and the large pool's), 2. */
static void test_blas_workspaces(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    const struct {
        ml_allocator a;
        uint64_t ws, reserved, segments;
    } cases[] = {
        {ML_ALLOCATOR_CACHING, 8519680, 22 * 1048576ull, 2},
        {ML_ALLOCATOR_CACHING, 32 * 1048576ull, 66 * 1048576ull, 3},
        {ML_ALLOCATOR_CACHING, 12 * 1048576ull, 26 * 1048576ull, 3},
        {ML_ALLOCATOR_CACHING, 0, 2 * 1048576ull, 1},
        {ML_ALLOCATOR_EXPANDABLE, 8519680, 22 * 1048576ull, 2},
        {ML_ALLOCATOR_EXPANDABLE, 32 * 1048576ull, 82 * 1048576ull, 2},
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ml_config c = ml_model_config(m);
        c.device.allocator = cases[k].a;
        c.device.blas_workspace = cases[k].ws;
        ml_ledger *l = eval(m, &c, false);
        const ml_summary *s = ml_ledger_summary(l);
        assert_int_equal(s->reserved_peak, cases[k].reserved);
        assert_int_equal(s->reserved_first, cases[k].reserved); /* made in the first */
        assert_int_equal(s->reserved_segments, cases[k].segments);
        ml_ledger_destroy(l);
    }
    /* a start state's process made its own: the plan makes none */
    ml_alloc_trace *t = load_trace("action,id,bytes\nalloc,a,1000\n");
    ml_ledger *l = NULL;
    const ml_summary *s = plan_from(m, ML_ALLOCATOR_CACHING, t, &l);
    assert_int_equal(s->reserved_peak, 2 * 1048576ull);
    ml_ledger_destroy(l);
    ml_alloc_trace_destroy(t);
    ml_model_destroy(m);
}

/* A 32 MiB block left allocated (its own segment, full): nothing of the
 * plan fits there, so the reserved peak is the plan's 2 MiB segment over
 * it, 34 MiB in 2 segments, reached at the plan's first allocation with the
 * 32 MiB and the parameters' 1,024 B allocated. With expandable segments
 * the large pool maps 20 MiB pages: two for the 32 MiB, 42 MiB in all. */
static void test_start_full_segment(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_alloc_trace *t = load_trace("action,id,bytes\nalloc,w,33554432\n");
    for (int a = ML_ALLOCATOR_CACHING; a <= ML_ALLOCATOR_EXPANDABLE; a++) {
        ml_ledger *l;
        const ml_summary *s = plan_from(m, (ml_allocator)a, t, &l);
        assert_false(s->reserved_oom);
        assert_int_equal(s->reserved_peak, (a == ML_ALLOCATOR_CACHING ? 34 : 42) * 1048576);
        assert_int_equal(s->reserved_segments, 2); /* expandable: one per pool */
        assert_int_equal(s->reserved_at.when, ML_RESERVED_RESIDENT);
        assert_int_equal(s->reserved_at.allocated, 33554432 + 1024);
        ml_ledger_destroy(l);
    }
    ml_alloc_trace_destroy(t);
    ml_model_destroy(m);
}

/* A 1 MiB small block left allocated, in a 2 MiB small segment whose other
 * half is cached: the plan's tensors (1,024 B at once at most, all in the
 * small pool) fit that half, so the plan makes no segment and the reserved
 * peak is the start's 2 MiB. With the 1 MiB freed and the cache emptied
 * (empty_cache), the start leaves nothing: the plan's own 2 MiB. */
static void test_start_cache_reused(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_alloc_trace *held = load_trace("action,id,bytes\nalloc,b,1048576\n");
    ml_alloc_trace *gone = load_trace("action,id,bytes\nalloc,b,1048576\nfree,b\nempty_cache\n");
    ml_ledger *l;
    const ml_summary *s = plan_from(m, ML_ALLOCATOR_CACHING, held, &l);
    assert_int_equal(s->reserved_peak, 2097152);
    assert_int_equal(s->reserved_segments, 1);
    ml_ledger_destroy(l);
    s = plan_from(m, ML_ALLOCATOR_CACHING, gone, &l);
    assert_int_equal(s->reserved_peak, 2097152);
    assert_int_equal(s->reserved_at.allocated, 1024); /* the parameters alone */
    ml_ledger_destroy(l);
    ml_alloc_trace_destroy(held);
    ml_alloc_trace_destroy(gone);
    ml_model_destroy(m);
}

/* A start that does not fit the device: the simulation runs out before
 * the plan's first event; no plan is made, and the error says why. */
static void test_start_out_of_memory(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_alloc_trace *t = load_trace("action,id,bytes\nalloc,w,33554432\n");
    ml_config c = ml_model_config(m);
    c.device.present = true;
    c.device.memory = 16 * 1048576;
    c.device.runtime_reserve = 0;
    c.device.start = t;
    ml_error e;
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "start state alone runs out of the device"));
    c.device.memory = 64 * 1048576;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_false(s->reserved_oom);
    assert_int_equal(s->reserved_peak, 34 * 1048576);
    ml_ledger_destroy(l);
    ml_alloc_trace_destroy(t);
    ml_model_destroy(m);
}

/* Checkpoint optimal counts what the start leaves allocated beside every
 * plan's peak: GPT-2 small from a start that holds 6 GiB in a full segment
 * of its own, on 24 GiB, has the room it has on 18 GiB from an empty cache
 * (the runtime reserve the same): the same plan, the reserved peak 6 GiB
 * higher (nothing of the plan fits in the full segment), the same verdict. */
static void test_optimal_counts_the_start(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_alloc_trace *t = load_trace("action,id,bytes\nalloc,held,6442450944\n");
    ml_config c = ml_model_config(m);
    c.device.present = true;
    c.device.budget = 0;
    c.device.allocator = ML_ALLOCATOR_CACHING;
    c.training.checkpoint.kind = ML_CKPT_OPTIMAL;
    c.device.blas_workspace = 0; /* the start state alone differs between the plans */
    c.device.memory = 18ull << 30;
    ml_ledger *alone = eval(m, &c, false);
    c.device.memory = 24ull << 30;
    c.device.start = t;
    ml_ledger *after = eval(m, &c, false);
    const ml_summary *a = ml_ledger_summary(alone), *b = ml_ledger_summary(after);
    assert_string_equal(a->plan, b->plan);
    assert_true(a->flops_recompute > 0); /* a plan that recomputes: the room matters */
    assert_true(a->fits && b->fits);
    assert_int_equal(b->peak, a->peak);
    assert_int_equal(b->reserved_peak, a->reserved_peak + (6ull << 30));
    ml_ledger_destroy(alone);
    ml_ledger_destroy(after);
    ml_alloc_trace_destroy(t);
    ml_model_destroy(m);
}

/* A block's backward hands the gradient of its input to the block before
 * as one tensor that stays (docs/ledger.md, "Transients"): GPT-2 small under
 * amp-bf16 (block-level backward) at micro-batch 1 x 1024 tokens, between
 * block.11's backward and block.10's the workspace holds exactly that
 * gradient, the residual stream's 1 x 1024 x 768 fp32: 3,145,728 B (it was
 * freed with block.11's transients and made again), with the loop's logits
 * released after the loss (else they are workspace too). */
static void test_gradient_handed_on(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 1024;
    c.device.allocator = ML_ALLOCATOR_NONE;
    c.training.logits = ML_LOGITS_RELEASED; /* no logits held through the backward */
    assert_true(ml_precision_parse("amp-bf16", &c.training.precision));
    ml_ledger *l = eval(m, &c, true);
    int32_t b11 = -1, b10 = -1;
    for (size_t i = 0; i < ml_ledger_block_count(l); i++) {
        if (!strcmp(ml_ledger_block(l, i)->name, "block.11"))
            b11 = (int32_t)i;
        if (!strcmp(ml_ledger_block(l, i)->name, "block.10"))
            b10 = (int32_t)i;
    }
    assert_true(b11 > 0 && b10 == b11 - 1);
    const ml_event *ev = ml_ledger_events(l);
    size_t n = ml_ledger_event_count(l), last11 = n, first10 = n;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].phase != ML_PHASE_BACKWARD || ev[i].micro != 0)
            continue;
        if (ev[i].block == b11)
            last11 = i;
        if (ev[i].block == b10 && first10 == n)
            first10 = i;
    }
    assert_true(last11 < n && first10 == last11 + 1);
    assert_int_equal(ev[last11].live[ML_CAT_WORKSPACE], 3145728);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The replay frees a gradient it handed from one block to the one before
 * by name, not by its bytes (docs/allocator.md, "On the plan"): of two
 * live workspace allocations of the same bytes, a free by bytes takes the
 * latest, a free by name the one named. */
static void test_free_by_name(void **state)
{
    (void)state;
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ml_alloc_config cfg = ml__alloc_config_defaults();
    ml_rsim *r = NULL;
    ml_error e;
    assert_int_equal(ml__rsim_create(&cfg, &ch, &r, &e), ML_OK);
    const uint64_t MiB = 1048576;
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 24 * MiB, ML_T_ONE, 0, 1);
    size_t older = ml__rsim_latest(r, ML_CAT_WORKSPACE);
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 24 * MiB, ML_T_ONE, 0, 1);
    size_t newer = ml__rsim_latest(r, ML_CAT_WORKSPACE);
    assert_true(older && newer && older != newer);
    assert_int_equal(ml__rsim_latest(r, ML_CAT_GRADS), 0); /* none of that category */
    assert_true(ml__rsim_free_named(r, ML_CAT_WORKSPACE, older));
    assert_int_equal(ml__rsim_latest(r, ML_CAT_WORKSPACE), newer); /* the newer stays */
    assert_false(ml__rsim_free_named(r, ML_CAT_WORKSPACE, older)); /* freed already */
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 24 * MiB, ML_T_ONE, 0, 1);
    size_t third = ml__rsim_latest(r, ML_CAT_WORKSPACE);
    ml__rsim_free(r, ML_CAT_WORKSPACE, 24 * MiB); /* by bytes: the latest, the third */
    assert_int_equal(ml__rsim_latest(r, ML_CAT_WORKSPACE), newer);
    (void)third;
    ml_alloc_stats st;
    ml__rsim_stats(r, &st);
    /* two 24 MiB segments (above 10 MiB: one each), the third reused the
     * first's freed one */
    assert_int_equal(st.reserved.peak, 48 * MiB);
    assert_int_equal(st.allocated.current, 24 * MiB);
    ml__rsim_destroy(r);
}

/* Where the reserved peak is when a later request in the same step
 * releases the cache (release_cached_blocks after a failed cudaMalloc):
 * the AG News classifier at micro-batch 280 to 300 on 4 GiB, most of whose
 * plans reach the device's limit and retry. Without an evaluation pass
 * the peak is always inside the training iteration, in segments that
 * hold allocations; the replay read the reserved bytes only as each step
 * left them, so a peak passed inside a step went unseen, and the peak was
 * put in an evaluation pass that does not exist, with nothing allocated. */
static void test_peak_inside_a_step(void **state)
{
    (void)state;
    ml_model *m = load_preset("agnews-classifier");
    unsigned retried = 0;
    for (uint64_t b = 280; b <= 300; b++) {
        const ml_config c = config_on_device(m, 4ull << 30, b);
        ml_ledger *l = eval(m, &c, false);
        const ml_summary *s = ml_ledger_summary(l);
        assert_false(s->has_eval);
        assert_int_not_equal(s->reserved_at.when, ML_RESERVED_EVAL);
        assert_true(s->reserved_at.segments > 0);
        assert_true(s->reserved_at.allocated > 0);
        assert_true(s->reserved_at.allocated <= s->reserved_peak);
        assert_true(s->reserved_at.segments <= s->reserved_segments);
        retried += s->reserved_peak == c.device.memory - c.device.runtime_reserve;
        ml_ledger_destroy(l);
    }
    assert_true(retried > 0); /* some reached the device's limit */
    ml_model_destroy(m);
}

/* A plan that runs out of the device ends its record with the request
 * that failed (id 1, no handle's), and no pass opens after it: the AG News
 * classifier at micro-batch 295 on 4 GiB. Its record, written by
 * `memledger timeline --format trace`'s writer and replayed on the
 * device's memory less the runtime reserve, runs out at that last
 * request, with the plan's reserved peak; without it, it ran to its end
 * and fitted. */
static void test_record_runs_out(void **state)
{
    (void)state;
    ml_model *m = load_preset("agnews-classifier");
    const ml_config c = config_on_device(m, 4ull << 30, 295);
    ml_ledger *l = eval(m, &c, true);
    const ml_summary *s = ml_ledger_summary(l);
    assert_true(s->reserved_oom);
    const ml_sim_event *ev = ml_ledger_sim_events(l);
    const size_t n = ml_ledger_sim_event_count(l);
    assert_true(n > 0);
    assert_int_equal(ev[n - 1].action, ML_SIM_ALLOC);
    assert_int_equal(ev[n - 1].id, 1);
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    assert_non_null(f);
    assert_int_equal(ml_report_timeline_trace(f, l), 0);
    fclose(f);
    ml_alloc_trace *t = NULL;
    ml_error e;
    assert_int_equal(ml__alloc_trace_parse(text, len, "record", &t, &e), ML_OK);
    ml_alloc_config ac = ml__alloc_config_defaults();
    ac.device_bytes = c.device.memory - c.device.runtime_reserve;
    ml_alloc_replay_result rr;
    assert_int_equal(ml__alloc_replay(&ac, t, &rr), ML_ALLOC_OK);
    assert_int_equal(rr.oom_index, t->n - 1);
    assert_int_equal(rr.stats.reserved.peak, s->reserved_peak);
    ml__alloc_trace_free(t);
    free(text);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_start_full_segment),
        cmocka_unit_test(test_start_cache_reused),
        cmocka_unit_test(test_start_out_of_memory),
        cmocka_unit_test(test_free_by_name),
        cmocka_unit_test(test_optimal_counts_the_start),
        cmocka_unit_test(test_gradient_handed_on),
        cmocka_unit_test(test_blas_workspaces),
        cmocka_unit_test(test_peak_inside_a_step),
        cmocka_unit_test(test_record_runs_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
