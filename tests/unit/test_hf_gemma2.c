/* The Gemma 2 family: google/gemma-2-2b's and google/gemma-2-9b's published
 * parameter counts recomputed by hand, the import's mapping and refusals,
 * the model file's Gemma 2 keys, and a tiny Gemma 2 block's inventory,
 * parameters and FLOPs derived from what its four GemmaRMSNorms, the
 * soft-capped scores and the soft-capped logits save (docs/inventory.md,
 * "Gemma 2 block"). Every expected value is derived in the comments, not
 * taken from the program. */
#include "harness.h"
#include "model/model_internal.h"


/* Published counts: the model cards' and the Gemma 2 report's (Gemma Team,
 * "Gemma 2: Improving Open Language Models at a Practical Size", 2024,
 * whose table of sizes the cards repeat), as transformers' sum over
 * Gemma2ForCausalLM.parameters() gives them:
 *   gemma-2-2b: V = 256000, D = 2304, 26 layers, H = 8, Hkv = 4, dh = 256,
 *     F = 9216. Embedding (tied) 256000 x 2304 = 589,824,000; per layer
 *     q 2304 x 2048 = 4,718,592, k and v 2304 x 1024 = 2,359,296 each,
 *     o 2048 x 2304 = 4,718,592 -> 14,155,776; GeGLU 3 x 2304 x 9216 =
 *     63,700,992; four norms 4 x 2304 = 9,216 -> 77,865,984 x 26 =
 *     2,024,515,584; final norm 2,304. Total 2,614,341,888.
 *   gemma-2-9b: D = 3584, 42 layers, H = 16, Hkv = 8, dh = 256, F = 14336.
 *     Embedding 256000 x 3584 = 917,504,000; per layer q and o 3584 x 4096
 *     = 14,680,064 each, k and v 3584 x 2048 = 7,340,032 each ->
 *     44,040,192; GeGLU 3 x 3584 x 14336 = 154,140,672; four norms 14,336
 *     -> 198,195,200 x 42 = 8,324,198,400; final norm 3,584. Total
 *     9,241,705,984. */
static void test_gemma2_counts(void **state)
{
    (void)state;
    const uint64_t l2 = 2 * 2304ull * 2048 + 2 * 2304ull * 1024 + 3 * 2304ull * 9216 + 4 * 2304;
    const uint64_t l9 = 2 * 3584ull * 4096 + 2 * 3584ull * 2048 + 3 * 3584ull * 14336 + 4 * 3584;
    assert_int_equal(l2, 77865984);
    assert_int_equal(l9, 198195200);
    assert_int_equal(256000ull * 2304 + 26 * l2 + 2304, 2614341888ull);
    assert_int_equal(256000ull * 3584 + 42 * l9 + 3584, 9241705984ull);
    static const struct {
        const char *name;
        uint64_t total, layer, embed, head;
    } want[] = {{"gemma-2-2b", 2614341888ull, 77865984, 589824000, 2304},
                {"gemma-2-9b", 9241705984ull, 198195200, 917504000, 3584}};
    for (size_t i = 0; i < 2; i++) {
        ml_model *m = load_hf_config(want[i].name);
        ml_config c = ml_model_config(m);
        c.training.seq_len = 64;
        ml_ledger *l = eval(m, &c, false);
        assert_int_equal(ml_ledger_summary(l)->params, want[i].total);
        assert_int_equal(block_named(l, "block.0")->params, want[i].layer);
        assert_int_equal(block_named(l, "embedding")->params, want[i].embed);
        assert_int_equal(block_named(l, "head")->params, want[i].head); /* final norm; tied */
        ml_ledger_destroy(l);
        ml_model_destroy(m);
    }
}

static void test_gemma2_mapping(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("gemma-2-2b");
    assert_int_equal(m->mlp.activation, ML_ACT_GEGLU);
    assert_int_equal(m->norms.kind, ML_NORM_GEMMA_RMSNORM);
    assert_true(m->residual.post_norms && m->embed.scale && m->embed.tied && m->residual.prenorm);
    assert_rel_close(m->attn.scalar, 256, 0);
    assert_rel_close(m->attn.softcap, 50, 0);
    assert_rel_close(m->head.final_softcap, 30, 0);
    assert_int_equal(m->attn.sliding_window, 4096); /* layer 0 slides (Gemma2Config) */
    assert_int_equal(m->attn.kv_heads, 4);
    assert_int_equal(m->attn.head_dim, 256);
    assert_string_equal(ml_model_name(m), "gemma-2-2b");
    /* a sequence longer than the window is refused when planning */
    ml_config c = ml_model_config(m);
    c.training.seq_len = 4097;
    ml_ledger *l = NULL;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "sliding_window (4096)"));
    assert_null(l);
    ml_model_destroy(m);
}

/* A minimal Gemma 2 config with one key's text added. */
static ml_status load_variant(const char *extra, ml_model **m, ml_error *e)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"gemma2\", \"num_hidden_layers\": 2, \"hidden_size\": 32,\n"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 16,\n"
             " \"intermediate_size\": 64, \"vocab_size\": 50%s}",
             extra);
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

static void test_gemma2_keys(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *msg;
    } refused[] = {
        {",\n \"query_pre_attn_scalar\": null", "query_pre_attn_scalar: null is not"},
        {",\n \"attn_logit_softcapping\": -1", "attn_logit_softcapping: expected a positive"},
        {",\n \"final_logit_softcapping\": \"30\"", "final_logit_softcapping: expected"},
        {",\n \"layer_types\": [\"full_attention\"]", "layer_types: expected a list of"},
        {",\n \"attention_dropout\": 0.1", "attention_dropout"},
        {",\n \"use_bidirectional_attention\": true", "use_bidirectional_attention"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (load_variant(refused[i].extra, &m, &e) != ML_SCHEMA || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].extra, e.msg);
        assert_int_equal(e.line, 4);
        assert_null(m);
    }
    /* null caps and window: none; full layers only: no window */
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_variant(",\n \"attn_logit_softcapping\": null, "
                                  "\"final_logit_softcapping\": null, \"sliding_window\": null",
                                  &m, &e),
                     ML_OK);
    assert_true(m->attn.softcap == 0 && m->head.final_softcap == 0 && m->attn.sliding_window == 0);
    ml_model_destroy(m);
    assert_int_equal(load_variant(",\n \"layer_types\": [\"full_attention\", \"full_attention\"]",
                                  &m, &e),
                     ML_OK);
    assert_int_equal(m->attn.sliding_window, 0);
    ml_model_destroy(m);
}

/* A tiny Gemma 2 decoder: B=2, T=8 (BT = 16), D=32, H=4, one kv head,
 * dh=16 (H*dh = 64), F=64, V=50. */
#define TINY(extra)                                                                          \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 1\n"       \
    "  head_dim: 16\n  ffn: 64\n  vocab: 50\n  position: rope\n  bias: false\n"             \
    "  norm: gemma_rmsnorm\n  activation: geglu\n  embedding_scale: true\n" extra            \
    "training:\n  micro_batch: 2\n  seq_len: 8\n  precision: fp32\n"
#define GEMMA2_KEYS                                                                          \
    "  post_norms: true\n  attn_scalar: 16\n  attn_softcap: 50\n  final_softcap: 30\n"

/* One fp32 Gemma 2 block:
 *   input_layernorm: the block input x BT*D*4 = 2048, rsqrt BT*4 = 64, the
 *     fp32 h 2048, 1 + weight D*4 = 128 -> 4,288
 *   attention: q/k/v input (the norm's output) 2048; q, k, v copies (k, v
 *     repeated to 4 heads) 3 x BT*64*4 = 12,288; the soft-cap's tanh output
 *     B*H*T*T*4 = 2,048 (the divide and multiply by a Python float keep
 *     nothing on the device); fp32 softmax 2,048; o_proj input BT*64*4 =
 *     4,096 -> 22,528
 *   post_attention_layernorm on o_proj's output: its input 2048, rsqrt 64,
 *     h 2048, 1 + weight 128 -> 4,288
 *   pre_feedforward_layernorm on x + that: 4,288 likewise
 *   GeGLU MLP: input 2048; gate output, gelu output, up output, product
 *     4 x BT*F*4 = 16,384 -> 18,432
 *   post_feedforward_layernorm on down's output: 4,288
 *   total 4 x 4,288 + 22,528 + 18,432 = 58,112 B: Gemma's 47,488 (its
 *   test) + two norms 8,576 + the tanh output 2,048.
 * Parameters: Gemma's 11,328 + two more norm weights 64 = 11,392.
 * FLOPs: Gemma's 393,216 (the norms, tanh and scalar ops are elementwise,
 * not counted: docs/flops.md).
 * Head: the final norm 2048 + 64 + 2048 + 128, the LM head's input 2048,
 * the final soft-cap's tanh output BT*V*4 = 3,200 -> 9,536. */
static void test_gemma2_block_fp32(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY(GEMMA2_KEYS)), *g1 = load_str(TINY(""));
    ml_config c = ml_model_config(m), c1 = ml_model_config(g1);
    ml_ledger *l = eval(m, &c, false), *l1 = eval(g1, &c1, false);
    const ml_block_info *b = block_named(l, "block.0");
    assert_int_equal(b->inventory_bytes, 58112);
    assert_int_equal(block_named(l1, "block.0")->inventory_bytes, 47488);
    assert_int_equal(b->params, 11392);
    assert_rel_close(b->flops_forward, 393216, 0);
    assert_int_equal(block_named(l, "head")->inventory_bytes, 2048 + 64 + 2048 + 128 + 2048 + 3200);
    /* the loss: log-softmax BT*V*4 = 3,200 and nll's fp32 total weight 4 */
    assert_int_equal(block_named(l, "loss")->inventory_bytes, 3204);
    ml_ledger_destroy(l);
    ml_ledger_destroy(l1);
    ml_model_destroy(m);
    ml_model_destroy(g1);
}

/* The model file's keys are refused where the chain cannot build them. */
static void test_gemma2_yaml_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *yaml, *msg;
        unsigned line, col;
        ml_status st;
    } bad[] = {
        {"model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n  vocab: 50\n"
         "  max_positions: 8\n  post_norms: true\n",
         "model.post_norms: Gemma 2's norms", 8, 15, ML_SCHEMA},
        {"model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n  vocab: 50\n"
         "  position: rope\n  norm: gemma_rmsnorm\n  dropout: 0.1\n  post_norms: true\n",
         "dropout: 0", 10, 15, ML_SCHEMA},
        {"model:\n  type: encoder\n  layers: 1\n  hidden: 32\n  heads: 4\n  vocab: 50\n"
         "  max_positions: 8\n  classes: 2\n  final_softcap: 30\n",
         "model.final_softcap: soft-caps the LM logits", 9, 18, ML_SCHEMA},
        {"model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n  vocab: 50\n"
         "  max_positions: 8\n  attn_softcap: -1\n",
         "model.attn_softcap: -1 is out of range", 8, 17, ML_RANGE},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (ml_model_load_string(bad[i].yaml, strlen(bad[i].yaml), "t.yaml", &m, &e) !=
                bad[i].st ||
            !strstr(e.msg, bad[i].msg))
            fail_msg("case %zu: got '%s'", i, e.msg);
        assert_int_equal(e.line, bad[i].line);
        assert_int_equal(e.col, bad[i].col);
        assert_null(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma2_counts),     cmocka_unit_test(test_gemma2_mapping),
        cmocka_unit_test(test_gemma2_keys),       cmocka_unit_test(test_gemma2_block_fp32),
        cmocka_unit_test(test_gemma2_yaml_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
