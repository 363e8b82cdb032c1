/* Resident model states: the design notes' numbers, the precision table
 * (docs/precision.md) and the optimizer table (docs/optimizers.md). */
#include "harness.h"

/* 100 -> 300 -> 10, no biases: W1 has 30,000 elements (the largest tensor),
 * W2 3,000: P = 33,000. */
static const char *small =
    "model:\n  type: sequential\n  input: [100]\n  layers:\n"
    "    - linear: {out: 300, bias: false}\n    - relu: {}\n"
    "    - linear: {out: 10, bias: false}\n";

static const ml_summary *run(ml_model *m, ml_config *c, ml_ledger **l)
{
    *l = eval(m, c, false);
    return ml_ledger_summary(*l);
}

/* Design notes: 20,000,000 fp32 params with Adam -> params 80,000,000 B,
 * grads 80,000,000 B, states 160,000,000 B; total 320,000,000 B. */
static void test_design_20m_fp32_adam(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = config_allocated(m);
    ml_ledger *l;
    const ml_summary *s = run(m, &c, &l);
    assert_int_equal(s->params, 20000000);
    assert_int_equal(s->bytes_params, 80000000);
    assert_int_equal(s->bytes_grads, 80000000);
    assert_int_equal(s->bytes_optimizer, 160000000);
    assert_int_equal(s->bytes_master, 0);
    assert_int_equal(s->bytes_params + s->bytes_grads + s->bytes_optimizer, 320000000);
    /* the foreach step materialises sqrt(exp_avg_sq) for all 20M values
     * (4 B each) while params, grads and states are resident:
     * 80M + 80M + 160M + 80M = 400,000,000 B; the loop (logits: kept, the
     * default) still holds the model output y, 256 x 1000 x 4 = 1,024,000 B,
     * and its batch, x and the mse target, 2 x 256 x 1000 x 4 = 2,048,000 B:
     * 403,072,000 B, the iteration's peak */
    assert_int_equal(s->bytes_step_temp, 80000000);
    assert_int_equal(s->bytes_batch, 2048000);
    assert_int_equal(s->bytes_buffers, 0);
    assert_int_equal(s->peak, 403072000);
    assert_int_equal(s->peak_phase, ML_PHASE_OPTIMIZER);
    ml_ledger_destroy(l);
    /* a loop that drops its reference once the loss is computed: y goes
     * with the loss's backward (mse saved it), and the step holds
     * 400,000,000 + the batch 2,048,000 */
    c.training.logits = ML_LOGITS_RELEASED;
    s = run(m, &c, &l);
    assert_int_equal(s->peak, 402048000);
    assert_int_equal(s->peak_phase, ML_PHASE_OPTIMIZER);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* bf16-master Adam: 2 (bf16 param) + 2 (bf16 grad) + 4 (fp32 master) +
 * 8 (two fp32 states) = 16 B/param, 8x the 2 B/param of bf16 weights. */
static void test_bf16_master_16_bytes_per_param(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = config_allocated(m);
    c.training.precision = ML_PREC_BF16_MASTER;
    ml_ledger *l;
    const ml_summary *s = run(m, &c, &l);
    const uint64_t P = 20000000;
    assert_int_equal(s->bytes_params, 2 * P);
    assert_int_equal(s->bytes_grads, 2 * P);
    assert_int_equal(s->bytes_master, 4 * P);
    assert_int_equal(s->bytes_optimizer, 8 * P);
    uint64_t states = s->bytes_params + s->bytes_grads + s->bytes_master + s->bytes_optimizer;
    assert_int_equal(states, 16 * P);
    ml_ledger_destroy(l);
    /* bf16 weights alone: 2 B/param, one eighth */
    c.training.precision = ML_PREC_BF16;
    s = run(m, &c, &l);
    assert_int_equal(s->bytes_params, 2 * P);
    assert_int_equal(states / s->bytes_params, 8);
    /* pure bf16 keeps bf16 states: 2 + 2 + 0 + 4 = 8 B/param */
    assert_int_equal(s->bytes_optimizer, 4 * P);
    assert_int_equal(s->bytes_master, 0);
    ml_ledger_destroy(l);
    /* autocast keeps fp32 params, grads and states: 16 B/param, no master */
    c.training.precision = ML_PREC_AMP_BF16;
    s = run(m, &c, &l);
    assert_int_equal(s->bytes_params + s->bytes_grads + s->bytes_optimizer, 16 * P);
    assert_int_equal(s->bytes_master, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static void test_optimizer_states(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = config_allocated(m);
    const uint64_t P = 20000000;
    struct {
        ml_optimizer opt;
        uint64_t states;
    } want[] = {
        {ML_OPT_SGD, 0},
        {ML_OPT_SGD_MOMENTUM, 4 * P},
        {ML_OPT_ADAM, 8 * P},
        {ML_OPT_ADAMW, 8 * P},
        {ML_OPT_LION, 4 * P},
        /* W1 is 10000 x 1000, W2 1000 x 10000: a row and a column vector
         * each, (10000 + 1000) x 2 x 4 B */
        {ML_OPT_ADAFACTOR, 88000},
        /* 8-bit: per tensor of n = 10^7 values, two states of n bytes plus
         * ceil(n / 256) = 39063 fp32 absmax each: 2 x (10^7 + 156252) */
        {ML_OPT_ADAM_8BIT, 2 * 2 * (10000000 + 156252)},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        c.training.optimizer = want[i].opt;
        c.training.optimizer_impl = ML_IMPL_FOREACH;
        ml_ledger *l;
        const ml_summary *s = run(m, &c, &l);
        if (s->bytes_optimizer != want[i].states)
            fail_msg("%s: %llu state bytes, expected %llu", ml_optimizer_name(want[i].opt),
                     (unsigned long long)s->bytes_optimizer, (unsigned long long)want[i].states);
        ml_ledger_destroy(l);
    }
    /* small tensors stay 32-bit under bitsandbytes (min_8bit_size 4096) */
    ml_model *sm = load_str("model:\n  type: sequential\n  input: [10]\n  layers:\n"
                            "    - linear: {out: 10}\n");
    c = config_allocated(sm);
    c.training.optimizer = ML_OPT_ADAM_8BIT;
    ml_ledger *l;
    const ml_summary *s = run(sm, &c, &l);
    assert_int_equal(s->bytes_optimizer, 2 * 4 * 110); /* 100 + 10 values, fp32, two states */
    ml_ledger_destroy(l);
    ml_model_destroy(sm);
    ml_model_destroy(m);
}

/* Adam's for-loop keeps the previous parameter's denom alive while it
 * computes the next one's sqrt and quotient, so its largest moment is
 * max over i of n[i-1] + 2 n[i], in model.parameters() order. */
static void test_for_loop_adam_order(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        uint64_t temp;
    } want[] = {
        /* Llama layout, D 8, 2 heads of 4, 1 kv head, ffn 20, vocab 10:
         * embed 80 | q 64, k 32, v 32, o 64, gate 160, up 160, down 160,
         * ln1 8, ln2 8 | norm 8, lm_head 80. Largest: up (or down) after a
         * 160: 160 + 2 x 160 = 480 elements, x 4 B */
        {"model: {type: decoder, layers: 1, hidden: 8, heads: 2, kv_heads: 1, ffn: 20,"
         " activation: swiglu, norm: rmsnorm, vocab: 10, position: rope,"
         " tied_embeddings: false, bias: false, dropout: 0}\n",
         480 * 4},
        /* Phi-3 layout: o_proj 64 before qkv_proj 8 x 16 = 128, gate_up
         * 8 x 40 = 320, down 160, then the norms: gate_up after qkv,
         * 128 + 2 x 320 = 768 (after a norm it would be 648) */
        {"model: {type: decoder, layers: 1, hidden: 8, heads: 2, kv_heads: 1, ffn: 20,"
         " activation: swiglu, norm: rmsnorm, fused_projections: true, vocab: 10,"
         " position: rope, tied_embeddings: false, bias: false, dropout: 0}\n",
         768 * 4},
        /* GPT-2 layout, D 8, ffn 32, biases after their weights: c_fc
         * 256, its bias 32, c_proj 256: 32 + 2 x 256 = 544 (with the two
         * weights adjacent it would be 768) */
        {"model: {type: decoder, layers: 1, hidden: 8, heads: 2, ffn: 32, activation: gelu,"
         " norm: layernorm, vocab: 10, position: learned, max_positions: 16,"
         " tied_embeddings: true, bias: true, dropout: 0}\ntraining: {seq_len: 16}\n",
         544 * 4},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        ml_model *m = load_str(want[i].yaml);
        ml_config c = config_allocated(m);
        c.training.optimizer = ML_OPT_ADAMW;
        c.training.optimizer_impl = ML_IMPL_FOR_LOOP;
        c.training.precision = ML_PREC_FP32;
        ml_ledger *l;
        const ml_summary *s = run(m, &c, &l);
        if (s->bytes_step_temp != want[i].temp)
            fail_msg("case %zu: %llu, expected %llu", i, (unsigned long long)s->bytes_step_temp,
                     (unsigned long long)want[i].temp);
        ml_ledger_destroy(l);
        ml_model_destroy(m);
    }
}

static void test_step_temporaries(void **state)
{
    (void)state;
    ml_model *m = load_str(small);
    ml_config c = config_allocated(m);
    struct {
        ml_optimizer opt;
        ml_optimizer_impl impl;
        ml_precision prec;
        uint64_t temp;
    } want[] = {
        /* foreach Adam: _foreach_sqrt over all exp_avg_sq: P x 4 B */
        {ML_OPT_ADAMW, ML_IMPL_FOREACH, ML_PREC_FP32, 33000 * 4},
        /* for-loop Adam: sqrt() and the division coexist for the largest
         * tensor: 2 x 30000 x 4 B */
        {ML_OPT_ADAM, ML_IMPL_FOR_LOOP, ML_PREC_FP32, 2 * 30000 * 4},
        {ML_OPT_ADAM, ML_IMPL_FUSED, ML_PREC_FP32, 0},
        {ML_OPT_SGD_MOMENTUM, ML_IMPL_FOREACH, ML_PREC_FP32, 0},
        {ML_OPT_SGD, ML_IMPL_FOR_LOOP, ML_PREC_FP32, 0},
        /* master weights: bf16 grads converted to fp32 (P x 4) on top */
        {ML_OPT_ADAMW, ML_IMPL_FOREACH, ML_PREC_BF16_MASTER, 33000 * 4 + 33000 * 4},
        {ML_OPT_ADAMW, ML_IMPL_FOR_LOOP, ML_PREC_FP16_MASTER, 2 * 30000 * 4 + 30000 * 4},
        /* pure bf16: bf16 states, so a bf16 sqrt temporary */
        {ML_OPT_ADAMW, ML_IMPL_FOREACH, ML_PREC_BF16, 33000 * 2},
        /* lion-pytorch: clone() and the interpolation, for-loop */
        {ML_OPT_LION, ML_IMPL_FOR_LOOP, ML_PREC_FP32, 2 * 30000 * 4},
        {ML_OPT_ADAFACTOR, ML_IMPL_FOR_LOOP, ML_PREC_FP32, 30000 * 4},
        {ML_OPT_ADAM_8BIT, ML_IMPL_FOREACH, ML_PREC_FP32, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        c.training.optimizer = want[i].opt;
        c.training.optimizer_impl = want[i].impl;
        c.training.precision = want[i].prec;
        ml_ledger *l;
        const ml_summary *s = run(m, &c, &l);
        if (s->bytes_step_temp != want[i].temp)
            fail_msg("case %zu (%s %s %s): %llu, expected %llu", i,
                     ml_optimizer_name(want[i].opt), ml_optimizer_impl_name(want[i].impl),
                     ml_precision_name(want[i].prec), (unsigned long long)s->bytes_step_temp,
                     (unsigned long long)want[i].temp);
        ml_ledger_destroy(l);
    }
    /* Adafactor has no fused implementation in torch.optim */
    c.training.optimizer = ML_OPT_ADAFACTOR;
    c.training.optimizer_impl = ML_IMPL_FUSED;
    ml_ledger *l = NULL;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "no fused"));
    ml_model_destroy(m);
}

/* The verdict: budget line for the allocator peak, reserve against capacity. */
static void test_verdict(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2"); /* peak 403,072,000 B (above) */
    ml_config c = config_allocated(m);
    c.device.present = true;
    c.device.memory = 1ull << 30;
    c.device.runtime_reserve = 512ull << 20;
    c.device.budget = 0; /* default: memory - reserve = 536,870,912 */
    ml_ledger *l;
    const ml_summary *s = run(m, &c, &l);
    assert_int_equal(s->budget, 536870912);
    assert_true(s->fits);
    assert_int_equal(s->peak_total, 403072000ull + 536870912ull);
    assert_int_equal(s->headroom, 536870912 - 403072000);
    ml_ledger_destroy(l);
    /* an explicit budget below the peak */
    c.device.budget = 403071999;
    s = run(m, &c, &l);
    assert_false(s->fits);
    assert_int_equal(s->headroom, -1);
    ml_ledger_destroy(l);
    /* a budget up to capacity, but the reserve pushes the total over */
    c.device.budget = 1ull << 30;
    c.device.runtime_reserve = 700ull << 20; /* 734,003,200 */
    s = run(m, &c, &l);
    assert_false(s->fits);
    assert_int_equal(s->headroom, (int64_t)(1ull << 30) - 403072000 - 734003200);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The headroom is a signed 64-bit figure. A device just
 * under 2^63 B states it exactly: the budget is memory - reserve =
 * (2^63 - 1) - 2^29, the peak 403,072,000 B (test_verdict), so both sides
 * give (2^63 - 1) - 2^29 - 403,072,000 (before: the sizes were cast to
 * int64 first, which wrapped for 2^63 B and up). Devices of 2^63 B or more
 * are refused, naming the limit. */
static void test_verdict_huge_device(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = config_allocated(m);
    c.device.present = true;
    c.device.memory = (uint64_t)INT64_MAX;
    c.device.runtime_reserve = 512ull << 20;
    c.device.budget = 0;
    ml_ledger *l;
    const ml_summary *s = run(m, &c, &l);
    assert_true(s->fits);
    assert_int_equal(s->headroom, INT64_MAX - (int64_t)(512ull << 20) - 403072000);
    ml_ledger_destroy(l);
    const uint64_t too_big[] = {1ull << 63, UINT64_MAX};
    for (size_t i = 0; i < 2; i++) {
        c.device.memory = too_big[i];
        ml_error e;
        l = NULL;
        assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
        assert_null(l);
        assert_non_null(strstr(e.msg, "device.memory: must be below 8 EiB"));
    }
    ml_model_destroy(m);
}

/* ViT's class token at a batch of one: its gradient reaches AccumulateGrad
 * as cat's narrow slice of the embeddings' (1, T, D) gradient (expand has
 * nothing to sum for one image), which becomes its .grad and keeps the
 * whole storage. A 4 x 4 image in 2 x 2 patches: 4 patches, T = 5 with the
 * class token, D = 4, so .grad keeps 4 x 4 = 16 elements more than the
 * token's own 4: 64 B in fp32, 32 B in bf16 (bf16-master's gradients).
 * Two images sum the slice into a tensor of the token's size; ZeRO-2's
 * gradients are partitions (the .grad is dropped once reduced). The step
 * holds the gradients: AdamW foreach's peak is the step's and carries the
 * 64 B. */
static void test_class_token_grad_view(void **state)
{
    (void)state;
    ml_model *m = load_str("model:\n  type: encoder\n  layers: 1\n  hidden: 4\n  heads: 1\n"
                           "  ffn: 8\n  activation: gelu\n  norm: layernorm\n"
                           "  norm_position: pre\n  image_size: 4\n  patch_size: 2\n"
                           "  channels: 1\n  classes: 3\n  attention: eager\n  dropout: 0\n");
    ml_ledger *l;
    ml_config c = config_at(m, ML_PREC_FP32, 2, 5);
    c.training.optimizer = ML_OPT_ADAMW;
    const ml_summary *s = run(m, &c, &l);
    const uint64_t grads2 = s->bytes_grads;
    assert_int_equal(grads2, s->bytes_params); /* fp32: one gradient element each */
    ml_ledger_destroy(l);
    c.training.micro_batch = 1;
    s = run(m, &c, &l);
    assert_int_equal(s->bytes_grads, grads2 + 64);
    assert_int_equal(s->peak_phase, ML_PHASE_OPTIMIZER);
    assert_int_equal(s->peak_breakdown[ML_CAT_GRADS], grads2 + 64);
    ml_ledger_destroy(l);
    c.training.precision = ML_PREC_BF16_MASTER;
    s = run(m, &c, &l);
    assert_int_equal(s->bytes_grads, grads2 / 2 + 32);
    ml_ledger_destroy(l);
    c.training.precision = ML_PREC_FP32;
    c.training.zero = 2;
    c.training.data_parallel = 2;
    s = run(m, &c, &l);
    assert_int_equal(s->bytes_grads, grads2 / 2); /* the partition (an even count) */
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_design_20m_fp32_adam),
        cmocka_unit_test(test_bf16_master_16_bytes_per_param),
        cmocka_unit_test(test_optimizer_states),
        cmocka_unit_test(test_step_temporaries),
        cmocka_unit_test(test_for_loop_adam_order),
        cmocka_unit_test(test_verdict),
        cmocka_unit_test(test_verdict_huge_device),
        cmocka_unit_test(test_class_token_grad_view),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
