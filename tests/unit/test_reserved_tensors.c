/* The tensors the allocator simulation makes of the replay's aggregates,
 * against hand derivations (docs/allocator.md, "On the plan"):
 *
 * - what evaluation's output and autocast hold after a block (its keys and
 *   values, its bf16 weight copies) are the tensors they are, not one
 *   allocation of their sum: requests above 1 MiB and under 10 MiB share
 *   20 MiB segments (CUDACachingAllocator.cpp, get_allocation_size:
 *   kLargeBuffer), where one of their sum would take a segment of its own
 *   size;
 * - autocast's cross-entropy makes the gradient it hands to the LM head
 *   last: nll_loss's gradient and log_softmax's (fp32, the logits' size
 *   each) first, then, once log_softmax's backward has released the first
 *   and the saved log-probabilities, the .float() cast's backward
 *   (ToCopyBackward0) makes the 2-byte gradient from the second;
 * - a block's saved tensors are freed one by one, as their nodes run;
 * - a checkpointed block's forward (no_grad) makes and frees its ops'
 *   tensors one by one, in the order its op graph gives. */
#include "harness.h"

#include "ledger/chain_kit.h"
#include "ledger/reserved.h"
#include "tiny_steps.h"

static const uint64_t MiB = 1048576;

/* One block: saved tensors of 6, 2, 16 (not a weight copy), 8 and 8 MiB;
 * a key and a value of 8 MiB each. */
static void one_block(ml_chain *ch, ml_cblock *b, ml_saved *sv)
{
    memset(ch, 0, sizeof *ch);
    memset(b, 0, sizeof *b);
    const uint64_t sizes[] = {6, 2, 16, 8, 8};
    for (size_t i = 0; i < 5; i++)
        sv[i] = (ml_saved){"t", sizes[i] * MiB, i == 2 ? 0u : (unsigned)ML_SV_WCAST,
                           ML_NODE_NONE, ML_NODE_NONE};
    snprintf(b->name, sizeof b->name, "block.0");
    b->nsaved = 5;
    b->saved_bytes = 40 * MiB;
    b->cast_bytes = 24 * MiB;
    b->cache_bytes = 16 * MiB;
    b->cache_unit = 8 * MiB;
    ch->blocks = b;
    ch->n = 1;
    ch->saved = sv;
    ch->nsaved = 5;
}

/* A simulator with PyTorch's defaults and an empty cache for ch. */
static ml_rsim *fresh(const ml_chain *ch)
{
    ml_alloc_config cfg = ml__alloc_config_defaults();
    ml_rsim *r = NULL;
    ml_error e;
    assert_int_equal(ml__rsim_create(&cfg, ch, &r, &e), ML_OK);
    return r;
}

/* The simulator's statistics now. */
static ml_alloc_stats now(const ml_rsim *r)
{
    ml_alloc_stats st;
    ml__rsim_stats(r, &st);
    return st;
}

/* Allocates `bytes` split as `split` for the one block of ch in a fresh
 * simulator: the bytes allocated (rounded), reserved and the segments. */
static void held(ml_chain *ch, uint64_t bytes, ml_tensor_split split, uint64_t allocated,
                 uint64_t reserved, uint64_t segments)
{
    ml_rsim *r = fresh(ch);
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, bytes, split, 0, 1);
    ml_alloc_stats st;
    ml__rsim_stats(r, &st);
    assert_true(ml__rsim_ok(r, NULL));
    ml__rsim_destroy(r);
    assert_int_equal(st.allocated.current, allocated);
    assert_int_equal(st.reserved.current, reserved);
    assert_int_equal(st.segments.current, segments);
}

/* Held (evaluation): key 8, value 8, then the copies 6, 2, 8, 8 MiB, each
 * into the smallest free block that takes it (best fit), else a new 20 MiB
 * segment:
 *   8 -> new A (12 free); 8 -> A (4 free); 6 -> new B (14 free);
 *   2 -> A (2 free); 8 -> B (6 free); 8 -> new C (12 free):
 * 3 segments, 60 MiB reserved for 40 MiB allocated. As one tensor of
 * 40 MiB: one segment of 40 MiB (above 10 MiB: its size in 2 MiB). */
static void test_held_tensors(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock b;
    ml_saved sv[5];
    one_block(&ch, &b, sv);
    held(&ch, 40 * MiB, ML_T_HELD, 40 * MiB, 60 * MiB, 3);
    held(&ch, 40 * MiB, ML_T_ONE, 40 * MiB, 40 * MiB, 1);
}

/* Variants, each by the same rules:
 * - no keys and values (use_cache off), the copies alone, 6, 2, 8, 8 MiB:
 *   6 -> new A (14 free); 2 -> A (12 free); 8 -> A (4 free);
 *   8 -> new B (12 free): 40 MiB reserved in 2 segments for 24 MiB;
 * - sizes that do not add up to the aggregate (a fallback: the builders'
 *   entries add up) make one tensor: 25 MiB in a segment of 26 MiB, whose
 *   1 MiB rest stays in its block (a large block splits only when more
 *   than 1 MiB is left: kSmallSize), so 26 MiB allocated;
 * - a cache that is not a key and a value of its unit is one tensor:
 *   17 MiB in a segment of 18 MiB (18 allocated, as above); then the
 *   copies as in the first: 18 + 24 MiB allocated, 18 + 40 MiB reserved;
 * - a layer with routed experts (its copies' entries hold every expert's):
 *   one tensor, 40 MiB in a segment of 40 MiB. */
static void test_held_variants(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock b;
    ml_saved sv[5];
    one_block(&ch, &b, sv);
    b.cache_bytes = 0;
    held(&ch, 24 * MiB, ML_T_HELD, 24 * MiB, 40 * MiB, 2);
    held(&ch, 25 * MiB, ML_T_HELD, 26 * MiB, 26 * MiB, 1);
    b.cache_bytes = 17 * MiB;
    held(&ch, 41 * MiB, ML_T_HELD, 18 * MiB + 24 * MiB, 18 * MiB + 40 * MiB, 3);
    b.cache_bytes = 16 * MiB;
    b.moe = true;
    held(&ch, 40 * MiB, ML_T_HELD, 40 * MiB, 40 * MiB, 1);
}

/* The loss block's backward, from the ledger's events: its workspace
 * deltas in order into d (at most 8; their count into *n), and whether
 * its saved tensors (U + 4 B: the log-probabilities and nll_loss's fp32
 * total_weight) were released before the last workspace allocation. */
static bool loss_backward(const ml_model *m, ml_precision p, int64_t U, int64_t d[8],
                          size_t *n)
{
    ml_config cfg = config_at(m, p, 2, 24);
    ml_ledger *l = eval(m, &cfg, true);
    int32_t loss = -1;
    for (size_t k = 0; k < ml_ledger_block_count(l); k++)
        if (strcmp(ml_ledger_block(l, k)->name, "loss") == 0)
            loss = (int32_t)k;
    assert_true(loss > 0);
    const ml_event *ev = ml_ledger_events(l);
    size_t saved_freed = SIZE_MAX, last_made = 0;
    *n = 0;
    for (size_t i = 0; i < ml_ledger_event_count(l); i++) {
        if (ev[i].phase != ML_PHASE_BACKWARD || ev[i].block != loss)
            continue;
        if (ev[i].cat == ML_CAT_ACTIVATIONS && ev[i].delta == -(U + 4))
            saved_freed = i;
        if (ev[i].cat != ML_CAT_WORKSPACE)
            continue;
        assert_true(*n < 8);
        d[(*n)++] = ev[i].delta;
        if (ev[i].delta > 0)
            last_made = i;
    }
    ml_ledger_destroy(l);
    assert_true(saved_freed != SIZE_MAX);
    return saved_freed < last_made;
}

/* tests/torch/models/llama.yaml's layout, B 2, T 24, vocab 173: the fp32
 * logits-sized tensors are U = 2 * 24 * 173 * 4 = 33,216 B, the bf16
 * gradient handed to the head H = 16,608 B. Under amp-bf16 the loss's
 * backward makes U (nll_loss's gradient) and U (log_softmax's), then,
 * after the saved log-probabilities and the first U are released, H, then
 * releases the second U: +U +U -U +H -U. In fp32 log_softmax's gradient
 * is the one handed on, made beside nll_loss's before the saved tensors go:
 * +U +U -U. */
static void test_loss_hands_last(void **state)
{
    (void)state;
    ml_model *m = load_str(
        "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
        "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
        "  bias: false\n  attention: eager\n  dropout: 0\n");
    const int64_t U = 33216, H = 16608, amp[] = {U, U, -U, H, -U}, fp32[] = {U, U, -U};
    int64_t d[8];
    size_t n;
    assert_true(loss_backward(m, ML_PREC_AMP_BF16, U, d, &n));
    assert_int_equal(n, 5);
    assert_memory_equal(d, amp, sizeof amp);
    assert_false(loss_backward(m, ML_PREC_FP32, U, d, &n));
    assert_int_equal(n, 3);
    assert_memory_equal(d, fp32, sizeof fp32);
    ml_model_destroy(m);
}

/* The keys and values a Hugging Face decoder's evaluation output holds
 * (use_cache): DynamicCache cats each layer's onto empty tensors of the
 * keys' dtype, so under autocast a rotary model's values are promoted to
 * its fp32 rotated keys (trace 09, Llama-0.2B in amp-bf16 at B 2, T 2048:
 * sixteen 4 MiB tensors, 2 * 2048 * 4 * 64 * 4 B each, live at the
 * evaluation's logits), and GPT-2's stay bf16. B 2, T 24, hidden 64,
 * 8 heads of 8: Llama's 2 key/value heads, 48 * 16 * 4 = 3,072 B a tensor;
 * GPT-2's 8 heads, 48 * 64 * 2 = 6,144 B; a generation's cache the same
 * dtype (colocate.md: Llama's at 28 tokens 2 * 2 * 2 * 16 * 28 * 4 =
 * 14,336 B). */
static void test_eval_cache_dtype(void **state)
{
    (void)state;
    const char *json[] = {
        "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "
        "\"num_attention_heads\": 8, \"num_key_value_heads\": 2, \"intermediate_size\": 160, "
        "\"vocab_size\": 173, \"max_position_embeddings\": 64}",
        "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 8, "
        "\"vocab_size\": 173, \"n_positions\": 64}"};
    const uint64_t unit[] = {3072, 6144};
    for (size_t k = 0; k < 2; k++) {
        ml_model *m = NULL;
        ml_error e;
        assert_int_equal(ml_model_load_hf_string(json[k], strlen(json[k]), "config.json", &m, &e),
                         ML_OK);
        ml_config cfg = config_at(m, ML_PREC_AMP_BF16, 2, 24);
        ml_chain ch;
        assert_int_equal(ml__chain_build_eval(m, &cfg, &ch, &e), ML_OK);
        const ml_cblock *b = &ch.blocks[1];
        assert_string_equal(b->name, "block.0");
        assert_int_equal(b->cache_unit, unit[k]);
        assert_int_equal(b->cache_bytes, 2 * unit[k]);
        ml__chain_free(&ch);
        /* generating 4 tokens after the 24: the same dtype, 2 layers x a
         * key and a value x 28 tokens' worth of the tensor above */
        ml_inference inf;
        assert_int_equal(ml_inference_evaluate(m, &cfg, 4, &inf, &e), ML_OK);
        assert_int_equal(inf.kv_forward, 2 * 2 * unit[k]);
        assert_int_equal(inf.kv_cache, 2 * 2 * unit[k] / 24 * 28);
        ml_model_destroy(m);
    }
}

/* A block whose backward runs node by node frees each saved tensor when
 * its node has run (engine.cpp: release_variables), so a later node's
 * gradient can take its block. The saved tensors 6, 2, 16, 8, 8 MiB as
 * their own allocations: 6 -> new 20 MiB segment A (14 free); 2 -> A
 * (12 free); 16 -> a segment of its own, B (above 10 MiB: its size);
 * 8 -> A (4 free); 8 -> new 20 MiB C (12 free): 56 MiB in 3 segments.
 * The 16 MiB one freed, a 16 MiB gradient takes B's block: 56 MiB still.
 * Were it held to the block's end, no free block would take 16 MiB (A's 4,
 * C's 12) and a fourth segment would make 72 MiB. The aggregate's free
 * then releases the other four: 16 MiB allocated, the gradient's. */
static void test_saved_freed_by_node(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock b;
    ml_saved sv[5];
    one_block(&ch, &b, sv);
    ml_rsim *r = fresh(&ch);
    ml__rsim_alloc(r, ML_CAT_ACTIVATIONS, 40 * MiB, ML_T_SAVED, 0, 1);
    assert_int_equal(now(r).reserved.current, 56 * MiB);
    assert_int_equal(now(r).segments.current, 3);
    /* no such allocation of that category, or of another block */
    assert_false(ml__rsim_free_saved(r, ML_CAT_RECOMPUTE, 0, 2));
    assert_true(ml__rsim_free_saved(r, ML_CAT_ACTIVATIONS, 0, 2));
    assert_int_equal(now(r).allocated.current, 24 * MiB);
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 16 * MiB, ML_T_ONE, 0, 1);
    assert_int_equal(now(r).reserved.current, 56 * MiB);
    assert_int_equal(now(r).segments.current, 3);
    ml__rsim_free(r, ML_CAT_ACTIVATIONS, 40 * MiB);
    assert_int_equal(now(r).allocated.current, 16 * MiB);
    assert_true(ml__rsim_ok(r, NULL));
    ml__rsim_destroy(r);
    /* an aggregate whose entries do not add up is one tensor: no entry of
     * it can be freed alone */
    r = fresh(&ch);
    ml__rsim_alloc(r, ML_CAT_ACTIVATIONS, 42 * MiB, ML_T_SAVED, 0, 1);
    assert_false(ml__rsim_free_saved(r, ML_CAT_ACTIVATIONS, 0, 2));
    assert_int_equal(now(r).allocated.current, 42 * MiB);
    ml__rsim_destroy(r);
}

/* The same five saved tensors (6, 2, 16, 8, 8 MiB) with the block's
 * saved allocation opened empty and filled as the forward's ops run, a
 * transient between them: entry 2 (16 MiB) in two allocations of 8 MiB
 * (bmm's copies of two operands), a 12 MiB transient made after entry 0
 * and freed after entry 2's. By hand: 6 -> new 20 MiB segment A (14
 * free); the 12 MiB transient -> A (2 free); 2 -> A (0 free); 8 -> new
 * 20 MiB B (12 free); 8 -> B (4 free); the transient goes (A: 12 free at
 * 8 MiB); 8 (entry 3) -> A (4 free); 8 (entry 4) -> new 20 MiB C (12
 * free): 60 MiB in 3 segments, 40 allocated. Freeing entry 2 frees both
 * its allocations (B: 20 free, merged), so a 20 MiB gradient takes B's
 * block (60 MiB still); the aggregate's free releases the other three. */
static void test_saved_filled_by_steps(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock b;
    ml_saved sv[5];
    one_block(&ch, &b, sv);
    ml_rsim *r = fresh(&ch);
    ml__rsim_saved_open(r, ML_CAT_ACTIVATIONS, 40 * MiB, 0, 5, 2);
    assert_int_equal(now(r).allocated.current, 0); /* opened: nothing made */
    ml__rsim_saved_fill(r, ML_CAT_ACTIVATIONS, 0, 0, 0, 6 * MiB);
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 12 * MiB, ML_T_ONE, 0, 1);
    const size_t tmp = ml__rsim_latest(r, ML_CAT_WORKSPACE);
    ml__rsim_saved_fill(r, ML_CAT_ACTIVATIONS, 0, 1, 0, 2 * MiB);
    ml__rsim_saved_fill(r, ML_CAT_ACTIVATIONS, 0, 2, 0, 8 * MiB);
    ml__rsim_saved_fill(r, ML_CAT_ACTIVATIONS, 0, 2, 1, 8 * MiB);
    assert_true(ml__rsim_free_named(r, ML_CAT_WORKSPACE, tmp));
    ml__rsim_saved_fill(r, ML_CAT_ACTIVATIONS, 0, 3, 0, 8 * MiB);
    ml__rsim_saved_fill(r, ML_CAT_ACTIVATIONS, 0, 4, 0, 8 * MiB);
    assert_int_equal(now(r).allocated.current, 40 * MiB);
    assert_int_equal(now(r).reserved.current, 60 * MiB);
    assert_int_equal(now(r).segments.current, 3);
    assert_int_equal(ml__rsim_inexact(r), 0);
    /* entry 2: both its allocations go */
    assert_true(ml__rsim_free_saved(r, ML_CAT_ACTIVATIONS, 0, 2));
    assert_int_equal(now(r).allocated.current, 24 * MiB);
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 20 * MiB, ML_T_ONE, 0, 1);
    assert_int_equal(now(r).reserved.current, 60 * MiB);
    assert_int_equal(now(r).segments.current, 3);
    ml__rsim_free_block_saved(r, ML_CAT_ACTIVATIONS, 0, 40 * MiB);
    assert_int_equal(now(r).allocated.current, 20 * MiB);
    assert_int_equal(ml__rsim_inexact(r), 0);
    /* a fill with no open allocation of the block is counted, not made */
    ml__rsim_saved_fill(r, ML_CAT_ACTIVATIONS, 0, 0, 0, 6 * MiB);
    assert_int_equal(ml__rsim_inexact(r), 1);
    assert_int_equal(now(r).allocated.current, 20 * MiB);
    assert_true(ml__rsim_ok(r, NULL));
    ml__rsim_destroy(r);
}

/* A fresh simulator for one_block's chain that records its events. */
static ml_rsim *recording(ml_chain *ch, ml_cblock *b, ml_saved *sv)
{
    one_block(ch, b, sv);
    ml_rsim *r = fresh(ch);
    ml__rsim_record(r);
    return r;
}

/* A tensor the replay counts in another category from some point (the
 * mask a checkpoint keeps: workspace, then an activation) stays the one
 * allocation: moved, nothing is allocated or freed, and it is freed from
 * its new category. */
static void test_moved_not_copied(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock b;
    ml_saved sv[5];
    ml_rsim *r = recording(&ch, &b, sv);
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 3 * MiB, ML_T_ONE, 0, 1);
    ml__rsim_move(r, ML_CAT_WORKSPACE, ML_CAT_ACTIVATIONS, 3 * MiB);
    size_t nev = 0;
    ml_sim_event *ev = ml__rsim_take_events(r, &nev);
    assert_int_equal(nev, 1); /* the allocation alone: no free, no copy */
    assert_int_equal(ev[0].action, ML_SIM_ALLOC);
    free(ev);
    assert_int_equal(now(r).allocated.current, 3 * MiB);
    assert_int_equal(now(r).allocated.peak, 3 * MiB); /* no copy beside it */
    assert_int_equal(ml__rsim_inexact(r), 0);
    ml__rsim_free(r, ML_CAT_WORKSPACE, 3 * MiB); /* no longer there */
    assert_int_equal(ml__rsim_inexact(r), 1);
    ml__rsim_free(r, ML_CAT_ACTIVATIONS, 3 * MiB);
    assert_int_equal(now(r).allocated.current, 0);
    assert_int_equal(ml__rsim_inexact(r), 1);
    ml__rsim_move(r, ML_CAT_WORKSPACE, ML_CAT_ACTIVATIONS, 3 * MiB); /* nothing to move */
    assert_int_equal(ml__rsim_inexact(r), 2);
    assert_true(ml__rsim_ok(r, NULL));
    ml__rsim_destroy(r);
}

/* The side tensors a checkpoint keeps with rotary positions (HF Llama at
 * T = 24 in fp32): cache_position, T x 8 = 192 B, made first (the mask is
 * built from it), then the (1, 1, T, T) mask, T x T x 4 = 2,304 B: two
 * allocations in that order, moved to the activations together and freed
 * as two. Without position ids (side_ids 0) the side is one tensor. */
static void test_side_two_tensors(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock b;
    ml_saved sv[5];
    ml_rsim *r = recording(&ch, &b, sv);
    ch.side_ids = 192;
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 192 + 2304, ML_T_SIDE, 0, 1);
    ml__rsim_move(r, ML_CAT_WORKSPACE, ML_CAT_ACTIVATIONS, 192 + 2304);
    ml__rsim_free(r, ML_CAT_ACTIVATIONS, 192 + 2304);
    size_t nev = 0;
    ml_sim_event *ev = ml__rsim_take_events(r, &nev);
    assert_int_equal(nev, 4);
    const ml_sim_action act[] = {ML_SIM_ALLOC, ML_SIM_ALLOC, ML_SIM_FREE, ML_SIM_FREE};
    const uint64_t bytes[] = {192, 2304};
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(ev[i].action, act[i]);
    assert_int_equal(ev[0].bytes, bytes[0]);
    assert_int_equal(ev[1].bytes, bytes[1]);
    free(ev);
    assert_int_equal(now(r).allocated.current, 0);
    assert_int_equal(ml__rsim_inexact(r), 0);
    ch.side_ids = 0;
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 2304, ML_T_SIDE, 0, 1);
    ev = ml__rsim_take_events(r, &nev);
    assert_int_equal(nev, 1);
    assert_int_equal(ev[0].bytes, 2304);
    free(ev);
    ml__rsim_destroy(r);
}

/* The mask is made before the layer whose steps hold a tensor of its
 * size: the move takes the mask (the older), so the step tensor's free by
 * name finds its own allocation. A move of the latest would take the step
 * tensor: its free would miss (inexact), and the mask, still counted in
 * the workspace, would stay. */
static void test_moved_is_the_older(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock b;
    ml_saved sv[5];
    ml_rsim *r = recording(&ch, &b, sv);
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 3 * MiB, ML_T_ONE, 0, 1); /* the mask */
    ml__rsim_alloc(r, ML_CAT_WORKSPACE, 3 * MiB, ML_T_ONE, 0, 1); /* a step's tensor */
    const size_t step = ml__rsim_latest(r, ML_CAT_WORKSPACE);
    ml__rsim_move(r, ML_CAT_WORKSPACE, ML_CAT_ACTIVATIONS, 3 * MiB);
    size_t nev = 0;
    ml_sim_event *ev = ml__rsim_take_events(r, &nev);
    assert_int_equal(nev, 2);
    const uint64_t mask_id = ev[0].id, step_id = ev[1].id;
    free(ev);
    ml__rsim_record(r);
    ml__rsim_free_as(r, ML_CAT_WORKSPACE, step, 3 * MiB);
    assert_int_equal(ml__rsim_inexact(r), 0);
    ml__rsim_free(r, ML_CAT_ACTIVATIONS, 3 * MiB);
    ev = ml__rsim_take_events(r, &nev);
    assert_int_equal(nev, 2);
    assert_int_equal(ev[0].action, ML_SIM_FREE);
    assert_int_equal(ev[0].id, step_id);
    assert_int_equal(ev[1].id, mask_id); /* the activation freed is the mask */
    free(ev);
    assert_int_equal(now(r).allocated.current, 0);
    assert_int_equal(ml__rsim_inexact(r), 0);
    ml__rsim_destroy(r);
}

/* Two tiny GPT-2 layers (tiny_steps.h) one after the other as the
 * simulation replays them, tensor by tensor, with nothing between the two:
 * steps[0 .. head) to the MLP's return, then the output (the next block's
 * input, 32 B, made by the replay), then the rest. The first layer makes
 * cuBLAS's workspace (8 MiB + 128 KiB, once a process) between its steps
 * and its output (the replay makes it after the steps, not at the layer's
 * first GEMM). Into want; its length. */
static size_t two_layers(const int64_t *steps, size_t n, size_t head, int64_t *want)
{
    size_t nw = 0;
    for (int layer = 0; layer < 2; layer++)
        for (size_t s = 0; s < n; s++) {
            if (layer == 0 && s == head)
                want[nw++] = 8519680; /* the workspace */
            want[nw++] = steps[s];
        }
    return nw;
}

/* Where the run want[0 .. nw) (allocations positive, frees negative, by
 * the bytes of the allocation they free; with allocs_only, allocations
 * alone, the frees between them left out) first appears in the first
 * iteration's simulation events of a plan of model y; SIZE_MAX: nowhere. */
static size_t run_at(const char *y, const int64_t *want, size_t nw, bool allocs_only)
{
    ml_model *m = load_str(y);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, true);
    const ml_sim_event *ev = ml_ledger_sim_events(l);
    const size_t n = ml_ledger_sim_event_count(l);
    int64_t *d = calloc(n + 1, sizeof *d);
    size_t first = n, end = n, found = SIZE_MAX;
    for (size_t i = 0; i < n; i++) {
        if (ev[i].action == ML_SIM_MARK) {
            if (ev[i].when == ML_RESERVED_FIRST)
                first = i;
            else if (first < n && end == n)
                end = i;
            continue;
        }
        d[i] = (int64_t)ev[i].bytes;
        for (size_t j = i; ev[i].action == ML_SIM_FREE && j-- > 0;)
            if (ev[j].action == ML_SIM_ALLOC && ev[j].id == ev[i].id) {
                d[i] = -(int64_t)ev[j].bytes; /* the allocation it frees */
                break;
            }
    }
    assert_true(first < end && end <= n);
    if (allocs_only) { /* the allocations, in order, packed after first */
        size_t k = first + 1;
        for (size_t i = first + 1; i < end; i++)
            if (d[i] > 0)
                d[k++] = d[i];
        end = k;
    }
    for (size_t i = first + 1; i + nw <= end && found == SIZE_MAX; i++)
        if (memcmp(&d[i], want, nw * sizeof want[0]) == 0)
            found = i;
    free(d);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return found;
}

static size_t first_run_at(const char *y, const int64_t *want, size_t nw)
{
    return run_at(y, want, nw, false);
}

static size_t first_alloc_run_at(const char *y, const int64_t *want, size_t nw)
{
    return run_at(y, want, nw, true);
}

/* Two layers of hidden 4, one head, MLP width 8 (GPT-2's layout), B 1,
 * T 2, under checkpoint ckpt; as first_run_at. */
static size_t by_op_at(const char *ckpt, const int64_t *want, size_t nw)
{
    char y[512];
    snprintf(y, sizeof y,
             "model:\n  type: decoder\n  layers: 2\n  hidden: 4\n  heads: 1\n"
             "  ffn: 8\n  activation: gelu\n  norm: layernorm\n  vocab: 10\n"
             "  position: learned\n  max_positions: 2\n  attention: eager\n"
             "  dropout: 0\ntraining:\n  micro_batch: 1\n  seq_len: 2\n"
             "  optimizer: sgd\n  checkpoint: %s\ndevice:\n  memory: 8GiB\n  allocator: caching\n",
             ckpt);
    return first_run_at(y, want, nw);
}

/* Checkpointed, the two layers' forward runs without grad, tensor by
 * tensor (tiny_fold_steps); without checkpointing it runs with grad, each saved
 * tensor made as its op runs and kept (tiny_fold_grad_steps), and the run
 * without grad is nowhere. Checkpointed, the run with grad is not the
 * forward's, but each layer's recompute makes its steps to the output. */
static void test_checkpointed_forward_by_op(void **state)
{
    (void)state;
    int64_t nograd[2 * TINY_FOLD_STEPS + 1], grad[2 * TINY_FOLD_GRAD_STEPS + 1];
    const size_t nn = two_layers(tiny_fold_steps, TINY_FOLD_STEPS, TINY_FOLD_STEPS_HEAD, nograd);
    const size_t ng =
        two_layers(tiny_fold_grad_steps, TINY_FOLD_GRAD_STEPS, TINY_FOLD_GRAD_STEPS_HEAD, grad);
    assert_true(by_op_at("full", nograd, nn) != SIZE_MAX);
    assert_true(by_op_at("none", nograd, nn) == SIZE_MAX);
    assert_true(by_op_at("none", grad, ng) != SIZE_MAX);
    assert_true(by_op_at("full", grad, ng) == SIZE_MAX);
    /* the second layer's steps (after the workspace) to its output */
    assert_true(by_op_at("full", &grad[TINY_FOLD_GRAD_STEPS + 1], TINY_FOLD_GRAD_STEPS_HEAD) !=
                SIZE_MAX);
}

/* A product with a bias makes its gradients as three tensors, its input's,
 * its weight's, then its bias's: AddmmBackward0 takes its inputs in sorted
 * order (mat1, mat2, self) and the bias's is the engine's sum_to of the
 * output's gradient (engine.cpp, validate_outputs); a LayerNorm's node its
 * input's, gamma's, then beta's (layer_norm_backward allocates dX, dgamma,
 * dbeta in that order). The layers above at B*T = 2 in fp32, the first
 * iteration (the gradients created as .grad): the MLP's out projection
 * (8 -> 4) makes 2*8*4 = 64 B, 8*4*4 = 128 B, then 4*4 = 16 B; its first
 * (4 -> 8) 2*4*4 = 32 B, 128 B, then 8*4 = 32 B; a LayerNorm 32 B, 16 B,
 * 16 B. One tensor of weight and bias (144 B, 160 B, 32 B) is none of
 * these. */
static void test_bias_grad_apart(void **state)
{
    (void)state;
    const int64_t out_proj[] = {64, 128, 16}, fc[] = {32, 128, 32}, norm[] = {32, 16, 16};
    assert_true(by_op_at("none", out_proj, 3) != SIZE_MAX);
    assert_true(by_op_at("none", fc, 3) != SIZE_MAX);
    assert_true(by_op_at("none", norm, 3) != SIZE_MAX);
    assert_true(by_op_at("full", out_proj, 3) != SIZE_MAX);
}

/* One Llama layer (hidden 8, two heads of 4, RMSNorm, rotary, SwiGLU, eager
 * attention) at B 1, T 4 with SGD and the caching allocator simulated, the
 * training section's further lines `more`, written into y. */
static void tiny_llama(char *y, size_t n, const char *more)
{
    snprintf(y, n,
             "model:\n  type: decoder\n  layers: 1\n  hidden: 8\n  heads: 2\n  ffn: 8\n"
             "  activation: swiglu\n  norm: rmsnorm\n  vocab: 10\n  position: rope\n"
             "  attention: eager\n  dropout: 0\n  tied_embeddings: false\n  bias: false\n"
             "training:\n  micro_batch: 1\n  seq_len: 4\n  optimizer: sgd\n%s"
             "device:\n  memory: 8GiB\n  allocator: caching\n",
             more);
}

/* A Llama layer's norm and rotary, node by node, each node's tensors as
 * PyTorch makes them (derivatives.yaml, FunctionsManual.cpp, engine.cpp).
 * One layer of hidden 8, two heads of 4, RMSNorm, rotary, SwiGLU; B 1, T 4
 * in fp32: x = 4*8*4 = 128 B, its (B, T) statistics 16 B, a head tensor
 * (q or k) 2*4*4*4 = 128 B and its half 64 B. The first iteration's
 * backward:
 *   MeanBackward1 makes x's size (128) and frees rsqrt's 16 B gradient;
 *   PowBackward0's grad * (2 * x.pow(1)) makes its two temporaries, then
 *   the result (128 each), and frees the temporaries;
 *   RsqrtBackward0's -0.5 * grad * result.pow(3) the same at 16 B;
 *   MulBackward0 (x * rsqrt) makes rsqrt's gradient whole first (128,
 *   other before self in the codegen's order), x's (128), then sum_to's
 *   reduced one (16), and frees the whole one;
 *   the rotary on a head tensor: * sin's node the cat's gradient (128),
 *   NegBackward0 half (64), SliceBackward0 (x2) a zero-filled 128 freeing
 *   the half, SliceBackward0 (x1) another freeing the cat's gradient, added
 *   into the buffer (freed), then * cos's node 128 freeing the incoming
 *   gradient, added in (freed).
 * The model's rotary tables, cos and sin, one row for the batch (the
 * position ids a model makes, cache_position[None]): T*dh*4 = 64 B each,
 * two tensors the embedding makes and every layer's products save. The
 * engine runs k's rotary nodes, then q's (the later op first), so q's are
 * the tables' last holders: its * sin's node frees sin once it has run
 * (after the cat's gradient), and its * cos's node frees cos after the
 * incoming gradient, before the buffer's addition.
 * The previous model (one 256 B scratch after pow's result, no scratch for
 * rsqrt, rsqrt's whole gradient after the reduced one, the rotary one
 * node, the tables one B*T*dh*4*2 tensor freed with the embedding) makes
 * none of these runs. */
static void test_norm_rotary_by_tensor(void **state)
{
    (void)state;
    char y[512];
    tiny_llama(y, sizeof y, "");
    const int64_t pow2[] = {128, -16, 128, 128, 128, -128, -128};
    const int64_t rsqrt[] = {16, 16, 16, -16, -16};
    const int64_t mul[] = {128, 128, 16, -128};
    const int64_t rotary[] = {128, 64, 128, -64, 128, -128, -128, 128, -128, -128};
    const int64_t last[] = {128, -64, 64, 128, -64, 128, -128, -128, 128, -128, -64, -128};
    assert_true(first_run_at(y, pow2, 7) != SIZE_MAX);
    assert_true(first_run_at(y, rsqrt, 5) != SIZE_MAX);
    assert_true(first_run_at(y, mul, 4) != SIZE_MAX);
    assert_true(first_run_at(y, rotary, 10) != SIZE_MAX);
    assert_true(first_run_at(y, last, 12) != SIZE_MAX);
}

/* GPT-NeoX's fused projection and a mixture's expert product, node by
 * node, each node's tensors as PyTorch makes them. One layer of hidden 8,
 * two heads of 4, B 1, T 4, fp32.
 * GPT-NeoX (parallel residual, biases): query_key_value's output is
 * 4*24*4 = 384 B, each head tensor 2*4*4*4 = 128 B. SplitBackward0 cats
 * the q, k and v heads' gradients into one (B, H, T, 3 dh) tensor, 384
 * (split_backward, FunctionsManual.cpp), and its three inputs go; the
 * transpose's node is a view; ViewBackward0 reshapes the transposed cat
 * to (B, T, 3 D), a copy, 384, freeing the cat; AddmmBackward0 makes its
 * input's gradient 4*8*4 = 128, the weight's 24*8*4 = 768, then the
 * bias's 24*4 = 96 (validate_outputs' sum_to), and frees the 384.
 * Mixtral's layer with two experts, both taken by every token
 * (experts_per_tok 2): an expert's rows are 4*8*4 = 128 B, its routing
 * weights (4, 1) 16 B.
 * IndexAddBackward0 selects the sum's gradient, 128; MulBackward0
 * (expert output * weights) makes the weights' gradient whole first (128,
 * other before self in the codegen's order), then the output's (128),
 * then validate_outputs' sum_to the weights' 16 (engine.cpp);
 * IndexBackward0 zero-fills the (B T, k) = 4*2*4 = 32 B gradient of the
 * routing weights the expert's were picked from. Allocations alone, as
 * the oracle's whole-layer check compares them. The router's in-place
 * renormalising divide, routing_weights /= sum (the (B T, k) weights
 * 4*2*4 = 32 B, the (B T, 1) sum 16 B): div_tensor_other_backward's
 * -grad * ((self / other) / other) makes self / other, its / other and
 * -grad, then the product (32 each), and C++ frees the three temporaries
 * at the expression's end; then self's gradient grad / other (32) and
 * sum_to's reduced gradient of the sum (16). The previous models make
 * none of the three runs: three head copies and three slices for
 * GPT-NeoX; the whole weights' gradient after the two for the product;
 * the divide's three temporaries freed at the node's end. */
static void test_fused_qkv_and_experts_by_tensor(void **state)
{
    (void)state;
    static const char *neox =
        "model:\n  type: decoder\n  layers: 1\n  hidden: 8\n  heads: 2\n  ffn: 8\n"
        "  activation: gelu\n  norm: layernorm\n  parallel_residual: true\n  vocab: 10\n"
        "  position: rope\n  attention: eager\n  dropout: 0\n  tied_embeddings: false\n"
        "  bias: true\ntraining:\n  micro_batch: 1\n  seq_len: 4\n  optimizer: sgd\n"
        "device:\n  memory: 8GiB\n  allocator: caching\n";
    static const char *mixtral =
        "model:\n  type: decoder\n  layers: 1\n  hidden: 8\n  heads: 2\n  ffn: 8\n"
        "  experts: 2\n  experts_per_tok: 2\n  activation: swiglu\n  norm: rmsnorm\n"
        "  vocab: 10\n  position: rope\n  tied_embeddings: false\n  bias: false\n"
        "  attention: eager\n  dropout: 0\ntraining:\n  micro_batch: 1\n  seq_len: 4\n"
        "  optimizer: sgd\ndevice:\n  memory: 8GiB\n  allocator: caching\n";
    const int64_t split[] = {384, -128, -128, -128, 384, -384, 128, 768, 96, -384};
    const int64_t expert[] = {128, 128, 128, 16, 32};
    const int64_t divide[] = {32, 32, 32, 32, -32, -32, -32, 32, 16};
    assert_true(first_run_at(neox, split, 10) != SIZE_MAX);
    assert_true(first_alloc_run_at(mixtral, expert, 5) != SIZE_MAX);
    assert_true(first_run_at(mixtral, divide, 9) != SIZE_MAX);
}

/* A checkpointed layer's backward under autocast (non-reentrant
 * checkpointing, torch/utils/checkpoint.py): the first unpack of a saved
 * tensor runs the recompute, and the nodes before it unpack nothing. The
 * layer's last op is the residual sum x + the MLP's output, fp32 + bf16:
 * AddBackward0 saves nothing, and engine.cpp's validate_outputs casts the
 * gradient it hands the branch to bf16, B*T*D*2 = 1*4*8*2 = 64 B, before
 * the down projection's node unpacks its input and the recompute starts
 * with input_layernorm's variance: hidden_states.pow(2) (fp32, 4*8*4 =
 * 128 B), .mean(-1, keepdim=True) (4*4 = 16 B), the square freed. The
 * previous replay made the cast after the recompute, at the down
 * projection's node. */
static void test_cast_before_recompute(void **state)
{
    (void)state;
    char y[512];
    tiny_llama(y, sizeof y, "  precision: amp-bf16\n  checkpoint: full\n");
    const int64_t run[] = {64, 128, 16, -128};
    assert_true(first_run_at(y, run, 4) != SIZE_MAX);
}

/* Where the simulation runs out of the device (ml_summary.reserved_oom_when),
 * gpt2-small on its 24 GiB device less 512 MiB: at micro-batch 32 its first
 * iteration's forward keeps some 4 x 20.5 GiB (the file's micro-batch 8
 * peaks at 22.36 GiB, 1.85 GiB of it model states), past 23.5 GiB: out in
 * the first iteration, the evaluation never run. At micro-batch 1 with an
 * evaluation batch of 64 the pass's fp32 logits and their log-softmax,
 * 2 x 64 x 1024 x 50257 x 4 B = 24.54 GiB, are past it, training (near 4
 * GiB) not: out in the evaluation pass, training's reserved peak below the
 * whole run's. The file's own micro-batch 8 fits. */
static void test_oom_pass(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 32;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_true(s->reserved_oom);
    assert_int_equal(s->reserved_oom_when, ML_RESERVED_FIRST);
    assert_int_equal(s->reserved_steady, s->reserved_peak);
    ml_ledger_destroy(l);
    c.training.micro_batch = 1;
    c.training.eval_batch = 64;
    l = eval(m, &c, false);
    s = ml_ledger_summary(l);
    assert_true(s->reserved_oom);
    assert_int_equal(s->reserved_oom_when, ML_RESERVED_EVAL);
    assert_true(s->reserved_steady < s->reserved_peak);
    assert_true(s->reserved_steady < (UINT64_C(47) << 29)); /* 23.5 GiB */
    ml_ledger_destroy(l);
    c = ml_model_config(m);
    l = eval(m, &c, false);
    assert_false(ml_ledger_summary(l)->reserved_oom);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_held_tensors),
        cmocka_unit_test(test_held_variants),
        cmocka_unit_test(test_loss_hands_last),
        cmocka_unit_test(test_eval_cache_dtype),
        cmocka_unit_test(test_saved_freed_by_node),
        cmocka_unit_test(test_saved_filled_by_steps),
        cmocka_unit_test(test_moved_not_copied),
        cmocka_unit_test(test_side_two_tensors),
        cmocka_unit_test(test_moved_is_the_older),
        cmocka_unit_test(test_checkpointed_forward_by_op),
        cmocka_unit_test(test_bias_grad_apart),
        cmocka_unit_test(test_norm_rotary_by_tensor),
        cmocka_unit_test(test_fused_qkv_and_experts_by_tensor),
        cmocka_unit_test(test_cast_before_recompute),
        cmocka_unit_test(test_oom_pass),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
