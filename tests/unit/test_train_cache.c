/* Hugging Face's use_cache in training (docs/ledger.md): each layer's
 * DynamicCache update copies its keys and values, and the copies no op
 * saves are held with the model output. Each case plans a config.json with
 * use_cache on and off and holds the difference of the steady peak to the
 * copies' bytes, derived here from the shapes. */
#include "harness.h"

/* GPT-2: D = 64, 4 heads, 2 layers; B = 2, T = 16 (BT = 32). */
#define GPT2(attn, cache)                                                                     \
    "{\"model_type\": \"gpt2\", \"n_embd\": 64, \"n_layer\": 2, \"n_head\": 4, "              \
    "\"vocab_size\": 100, \"n_positions\": 64, \"activation_function\": "                     \
    "\"gelu_pytorch_tanh\", \"resid_pdrop\": 0.0, \"embd_pdrop\": 0.0, \"attn_pdrop\": 0.0, "  \
    "\"attn_implementation\": \"" attn "\", \"use_cache\": " cache "}"

/* Llama: D = 64, 4 heads of 16 on 2 key/value heads (Dkv = 32), F = 128,
 * 2 layers. */
#define LLAMA(attn, cache)                                                                    \
    "{\"model_type\": \"llama\", \"hidden_size\": 64, \"num_hidden_layers\": 2, "             \
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128, "    \
    "\"vocab_size\": 100, \"max_position_embeddings\": 64, \"hidden_act\": \"silu\", "        \
    "\"tie_word_embeddings\": false, \"attention_dropout\": 0.0, "                            \
    "\"attn_implementation\": \"" attn "\", \"use_cache\": " cache "}"

/* The settings a case plans: B, T 16, the loop's logits lg, accum
 * micro-batches a step, an 80 GiB device in the allocated view. */
typedef struct {
    ml_precision p;
    ml_checkpoint_kind ck;
    uint64_t tp, accum;
    ml_logits lg;
    uint64_t B;
} setting;

/* The steady peak of json planned as s, and each phase's (ph, not NULL). */
static uint64_t peak(const char *json, const setting *s, uint64_t ph[ML_PHASE_COUNT])
{
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf_string(json, strlen(json), "config.json", &m, &e) != ML_OK)
        fail_msg("%u:%u: %s", e.line, e.col, e.msg);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = s->B;
    c.training.seq_len = 16;
    c.training.precision = s->p;
    c.training.checkpoint.kind = s->ck;
    c.training.tensor_parallel = s->tp;
    c.training.grad_accum = s->accum;
    c.training.logits = s->lg;
    c.device.present = true;
    c.device.memory = UINT64_C(80) << 30;
    c.device.allocator = ML_ALLOCATOR_NONE;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *sum = ml_ledger_summary(l);
    const uint64_t v = sum->peak;
    for (int k = 0; ph && k < ML_PHASE_COUNT; k++)
        ph[k] = sum->phase_steady[k].peak;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return v;
}

/* One row: the steady peak with use_cache on (json on) less off, precision
 * p, policy ck, tp ranks, the output kept to the step's end (and so the
 * cache), one micro-batch a step of B; want: the copies no op
 * saves, by hand. */
typedef struct {
    const char *on, *off;
    ml_precision p;
    ml_checkpoint_kind ck;
    uint64_t tp, want, B;
} extra_row;

static void check_extras(const extra_row *rows, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        const extra_row *x = &rows[i];
        const setting s = {x->p, x->ck, x->tp, 1, ML_LOGITS_KEPT, x->B};
        const uint64_t a = peak(x->on, &s, NULL), b = peak(x->off, &s, NULL);
        assert_true(a >= b);
        if (a - b != x->want)
            fail_msg("row %zu: %llu, by hand %llu", i, (unsigned long long)(a - b),
                     (unsigned long long)x->want);
    }
}

/* GPT-2 with a fused kernel: the kernel saves the views of c_attn's output
 * (which keep it whole) and the copies besides: both held, 2 layers x 2
 * copies x BT x D x 4 B = 2 x 2 x 32 x 64 x 4 = 32,768 B in fp32, half in
 * bf16. Eager, the matmuls read the copies in place of the contiguous
 * copies they would make: nothing more; but with one sequence (B 1) the
 * matmuls make no copies, q's view keeps c_attn's whole output and the
 * cache's copies are held besides: 2 x 2 x 16 x 64 x 4 = 16,384 B.
 * Gradient checkpointing turns use_cache off (transformers' forward). */
static void test_gpt2(void **state)
{
    (void)state;
    const extra_row rows[] = {
        {GPT2("sdpa", "true"), GPT2("sdpa", "false"), ML_PREC_FP32, ML_CKPT_NONE, 1, 32768, 2},
        {GPT2("sdpa", "true"), GPT2("sdpa", "false"), ML_PREC_BF16, ML_CKPT_NONE, 1, 16384, 2},
        {GPT2("eager", "true"), GPT2("eager", "false"), ML_PREC_FP32, ML_CKPT_NONE, 1, 0, 2},
        {GPT2("eager", "true"), GPT2("eager", "false"), ML_PREC_FP32, ML_CKPT_NONE, 1, 16384, 1},
        {GPT2("sdpa", "true"), GPT2("sdpa", "false"), ML_PREC_FP32, ML_CKPT_FULL, 1, 0, 2},
    };
    check_extras(rows, sizeof rows / sizeof rows[0]);
}

/* Llama: under autocast the rotated keys are fp32 (cos and sin are) and the
 * values' copy is promoted to them, while the kernel saves bf16 casts: 2
 * layers x 2 copies x BT x Dkv x 4 B = 2 x 2 x 32 x 32 x 4 = 16,384 B. In
 * fp32 sdpa with grouped heads runs the math kernel, whose matmuls save
 * its repeat_interleave copies: the cache's copies held besides, 16,384 B.
 * bf16 with the fused kernel: the kernel saves the copies themselves,
 * nothing more; nor with tensor parallelism (not HF's modeling on one
 * rank). */
static void test_llama(void **state)
{
    (void)state;
    const extra_row rows[] = {
        {LLAMA("sdpa", "true"), LLAMA("sdpa", "false"), ML_PREC_AMP_BF16, ML_CKPT_NONE, 1, 16384, 2},
        {LLAMA("sdpa", "true"), LLAMA("sdpa", "false"), ML_PREC_FP32, ML_CKPT_NONE, 1, 16384, 2},
        {LLAMA("sdpa", "true"), LLAMA("sdpa", "false"), ML_PREC_BF16, ML_CKPT_NONE, 1, 0, 2},
        {LLAMA("eager", "true"), LLAMA("eager", "false"), ML_PREC_FP32, ML_CKPT_NONE, 2, 0, 2},
    };
    check_extras(rows, sizeof rows / sizeof rows[0]);
}

/* Each phase's steady peak with use_cache on less off, GPT-2 sdpa fp32 (the
 * copies 32,768 B in all), logits lg, two micro-batches a step. */
static void phase_extra(ml_logits lg, uint64_t out[ML_PHASE_COUNT])
{
    const setting s = {ML_PREC_FP32, ML_CKPT_NONE, 1, 2, lg, 2};
    uint64_t on[ML_PHASE_COUNT], off[ML_PHASE_COUNT];
    peak(GPT2("sdpa", "true"), &s, on);
    peak(GPT2("sdpa", "false"), &s, off);
    for (int k = 0; k < ML_PHASE_COUNT; k++)
        out[k] = on[k] - off[k];
}

/* Where the loop holds the output the copies go with it: kept, to the
 * next micro-batch's loss and after the step (the backward and the step
 * hold one set); through-backward, dropped at the backward's end
 * (the step holds none); released or fused, dropped once the forward
 * returns, after the loss (the loss holds them all, the backward none).
 * Every case balances (eval fails otherwise). */
static void test_loops(void **state)
{
    (void)state;
    uint64_t d[ML_PHASE_COUNT];
    phase_extra(ML_LOGITS_KEPT, d);
    assert_int_equal(d[ML_PHASE_BACKWARD], 32768);
    assert_int_equal(d[ML_PHASE_OPTIMIZER], 32768);
    phase_extra(ML_LOGITS_THROUGH_BACKWARD, d);
    assert_int_equal(d[ML_PHASE_BACKWARD], 32768);
    assert_int_equal(d[ML_PHASE_OPTIMIZER], 0);
    phase_extra(ML_LOGITS_RELEASED, d);
    assert_int_equal(d[ML_PHASE_LOSS], 32768);
    assert_int_equal(d[ML_PHASE_BACKWARD], 0);
    assert_int_equal(d[ML_PHASE_OPTIMIZER], 0);
    phase_extra(ML_LOGITS_FUSED, d);
    assert_int_equal(d[ML_PHASE_BACKWARD], 0);
}

/* The caching simulation frees the output's cache as the tensors it made,
 * one a layer: with accumulation the first micro-batch's output (its
 * cache with it) goes while the workspace holds more than it, where a free
 * of the cache's sum would release whatever was latest (counted as
 * inexact: 3 on the build that freed the sum). SmolLM2-135M's shipped
 * config (use_cache on), fp32, B 1, T 512, 1 and 2 micro-batches a step,
 * each loop. */
static void test_cache_freed_as_made(void **state)
{
    (void)state;
    const ml_logits loops[] = {ML_LOGITS_KEPT, ML_LOGITS_RELEASED, ML_LOGITS_THROUGH_BACKWARD};
    ml_model *m = load_hf_config("smollm2-135m");
    for (size_t i = 0; i < 3; i++)
        for (uint64_t accum = 1; accum <= 2; accum++) {
            ml_config c = ml_model_config(m);
            c.training.precision = ML_PREC_FP32;
            c.training.micro_batch = 1;
            c.training.seq_len = 512;
            c.training.grad_accum = accum;
            c.training.logits = loops[i];
            c.device.allocator = ML_ALLOCATOR_CACHING;
            ml_ledger *l = eval(m, &c, false);
            const ml_summary *s = ml_ledger_summary(l);
            assert_true(s->has_reserved);
            assert_int_equal(s->reserved_inexact, 0);
            ml_ledger_destroy(l);
        }
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gpt2), cmocka_unit_test(test_llama),
                                       cmocka_unit_test(test_loops),
                                       cmocka_unit_test(test_cache_freed_as_made)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
