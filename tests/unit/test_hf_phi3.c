/* The Phi-3 family: microsoft/Phi-3-mini-4k-instruct's published parameter
 * count recomputed by hand, the import's mapping, refusals and sliding
 * window, and a Phi-3 block's inventory derived from what its fused
 * qkv_proj and gate_up_proj keep (docs/inventory.md, "Phi-3 block"). Every
 * expected value is derived in the comments, not taken from the program. */
#include "harness.h"
#include "model/model_internal.h"

static ml_model *phi3_mini(void)
{
    return load_hf_config("phi-3-mini-4k");
}

/* microsoft/Phi-3-mini-4k-instruct: 3,821,079,552 parameters (the published
 * figure, e.g. keras-hub's phi3_mini_4k_instruct_en preset).
 *   embed_tokens 32064 x 3072                                  =    98,500,608
 *   per layer: qkv_proj 3072 x (32 + 2 x 32) x 96 = 3072 x 9216 = 28,311,552;
 *     o_proj 3072 x 3072 = 9,437,184; gate_up_proj 3072 x 2 x 8192 =
 *     50,331,648; down_proj 8192 x 3072 = 25,165,824; two RMSNorm weights
 *     2 x 3072 = 6,144 -> 113,252,352 per layer x 32      = 3,624,075,264
 *   final norm                                                 =         3,072
 *   lm_head 32064 x 3072 (tie_word_embeddings false)          =    98,500,608
 *   total                                                      = 3,821,079,552
 * Split q, k, v and gate, up projections would have the same count: the
 * fusion changes tensors, not parameters. */
static void test_phi3_mini_count(void **state)
{
    (void)state;
    const uint64_t layer = 3072ull * 9216 + 3072ull * 3072 + 3072ull * 16384 + 8192ull * 3072 +
                           2 * 3072;
    assert_int_equal(layer, 113252352);
    assert_int_equal(2 * 32064ull * 3072 + 32 * layer + 3072, 3821079552ull);
    ml_model *m = phi3_mini();
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 3821079552ull);
    assert_int_equal(block_named(l, "block.0")->params, 113252352);
    assert_int_equal(block_named(l, "embedding")->params, 98500608);
    assert_int_equal(block_named(l, "head")->params, 3072 + 98500608);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The mapping, and the window: 2047 tokens is less than the default
 * sequence, min(4096, 2048) = 2048, so planning the default is refused with
 * the key named (docs/hf.md); 2047 tokens plan. */
static void test_phi3_mapping_and_window(void **state)
{
    (void)state;
    ml_model *m = phi3_mini();
    assert_true(m->attn.fused_proj && m->residual.prenorm && m->attn.kv_cache);
    assert_int_equal(m->mlp.activation, ML_ACT_SWIGLU);
    assert_int_equal(m->norms.kind, ML_NORM_RMSNORM);
    assert_int_equal(m->embed.position, ML_POS_ROPE);
    assert_int_equal(m->attn.heads, 32);
    assert_int_equal(m->attn.kv_heads, 32);
    assert_int_equal(m->mlp.ffn, 8192);
    assert_int_equal(m->attn.sliding_window, 2047);
    assert_false(m->embed.tied || m->bias || m->attn.qkv_bias || m->attn.out_bias || m->mlp.bias);
    assert_true(m->dropout == 0);
    assert_string_equal(ml_model_name(m), "Phi-3-mini-4k-instruct");
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.seq_len, 2048);
    ml_ledger *l = NULL;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "a sequence of 2048 tokens exceeds the model's sliding_window "
                                  "(2047)"));
    assert_null(l);
    c.training.seq_len = 2047;
    l = eval(m, &c, false);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* A minimal Phi-3 config with one key's text added. */
static ml_status load_variant(const char *extra, ml_model **m, ml_error *e)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"phi3\", \"num_hidden_layers\": 2, \"hidden_size\": 32,\n"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,\n"
             " \"intermediate_size\": 64, \"vocab_size\": 50%s}",
             extra);
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

static void test_phi3_keys(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *msg;
    } refused[] = {
        {",\n \"hidden_act\": \"gelu\"", "hidden_act: 'gelu' is not modelled for phi3"},
        {",\n \"attention_dropout\": 0.1", "attention_dropout"},
        {",\n \"resid_pdrop\": 0.1", "resid_pdrop"},
        {",\n \"embd_pdrop\": 0.1", "embd_pdrop"},
        {",\n \"attention_bias\": true", "attention_bias"},
        {",\n \"partial_rotary_factor\": 0.75", "partial_rotary_factor"},
        {",\n \"mlp_bias\": true", "not a key memledger knows for model_type 'phi3'"},
        {",\n \"architectures\": [\"Phi3ForTokenClassification\"]",
         "'Phi3ForTokenClassification' is not modelled: for model_type 'phi3' memledger "
         "plans Phi3ForCausalLM"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (load_variant(refused[i].extra, &m, &e) != ML_SCHEMA || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].extra, e.msg);
        assert_int_equal(e.line, 4);
        assert_null(m);
    }
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_variant(",\n \"sliding_window\": null, \"tie_word_embeddings\": true, "
                                  "\"rope_scaling\": {\"type\": \"longrope\"}, "
                                  "\"original_max_position_embeddings\": 4096, \"head_dim\": 16",
                                  &m, &e),
                     ML_OK);
    assert_true(m->embed.tied && m->attn.fused_proj);
    assert_int_equal(m->attn.sliding_window, 0);
    assert_int_equal(m->attn.head_dim, 16);
    ml_model_destroy(m);
}

/* A tiny Phi-3-like decoder: B=2, T=8 (BT = 16), D=32, H=4, 2 kv heads,
 * dh=8 (H*dh = 32, qkv_proj 32 -> 32 + 2 x 16 = 64), F=64, V=50. */
#define TINY(fused, prec)                                                                    \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 2\n"       \
    "  ffn: 64\n  vocab: 50\n  position: rope\n  bias: false\n  tied_embeddings: false\n"   \
    "  norm: rmsnorm\n  activation: swiglu\n  fused_projections: " fused "\n"               \
    "training:\n  micro_batch: 2\n  seq_len: 8\n  precision: " prec "\n"

static const ml_block_info *tiny_block(const char *yaml, ml_ledger **l, ml_model **m)
{
    *m = load_str(yaml);
    ml_config c = ml_model_config(*m);
    *l = eval(*m, &c, false);
    return block_named(*l, "block.0");
}

/* One fp32 Phi-3 block:
 *   input_layernorm (Llama's RMSNorm): x BT*D*4 = 2048, rsqrt BT*4 = 64, h 2048
 *   attention: qkv_proj's input (the norm's output) 2048; its (BT, 64)
 *     output is sliced into q, k, v views that nothing saves (the rotary
 *     muls save cos and sin, the embedding's); q, k, v contiguous copies
 *     for the two matmuls (k, v repeated to 4 heads) 3 x BT*32*4 = 6144;
 *     fp32 softmax B*H*T*T*4 = 2048; o_proj's input BT*32*4 = 2048
 *   post_attention_layernorm: 2048 + 64 + 2048
 *   MLP: gate_up_proj's input 2048; its (BT, 2F) output, one storage kept
 *     by silu (the gate view) and the mul (the up view) BT*128*4 = 8192;
 *     silu output BT*F*4 = 4096; the product (down_proj's input) 4096
 *   total 4160 + 12288 + 4160 + 18432 = 39,040 B: the split Llama block's,
 *   whose gate and up outputs are two storages of 4096.
 * Parameters: qkv 32 x 64 = 2048, o 32 x 32 = 1024, gate_up 32 x 128 =
 * 4096, down 64 x 32 = 2048, norms 64 -> 9,280. FLOPs: MLP 3 x 2*BT*D*F =
 * 196,608; qkv 2*BT*D*64 = 65,536; QK^T and PV 4*B*H*T*T*dh = 16,384;
 * o_proj 2*BT*32*D = 32,768 -> 311,296. */
static void test_phi3_block_fp32(void **state)
{
    (void)state;
    ml_ledger *l, *ll;
    ml_model *m, *lm;
    const ml_block_info *p = tiny_block(TINY("true", "fp32"), &l, &m);
    const ml_block_info *b = tiny_block(TINY("false", "fp32"), &ll, &lm);
    assert_int_equal(p->inventory_bytes, 39040);
    assert_int_equal(b->inventory_bytes, 39040);
    assert_int_equal(p->params, 9280);
    assert_rel_close(p->flops_forward, 311296, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    ml_ledger_destroy(ll);
    ml_model_destroy(lm);
}

/* amp-bf16: autocast casts the fp32 norm output once per Linear that reads
 * it (casts of non-leaf tensors are not cached): q_proj, k_proj, v_proj and
 * gate_proj, up_proj make 5 bf16 copies of BT*D*2 = 1024; qkv_proj and
 * gate_up_proj make 2. Phi-3 saves 3 x 1024 = 3072 B fewer per block; the
 * weight copies have the same elements either way. */
static void test_phi3_block_amp(void **state)
{
    (void)state;
    ml_ledger *l, *ll;
    ml_model *m, *lm;
    const ml_block_info *p = tiny_block(TINY("true", "amp-bf16"), &l, &m);
    const ml_block_info *b = tiny_block(TINY("false", "amp-bf16"), &ll, &lm);
    assert_int_equal(p->inventory_bytes + 3072, b->inventory_bytes);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    ml_ledger_destroy(ll);
    ml_model_destroy(lm);
}

/* fused_projections is Phi-3's layout: a GPT-2 or encoder model is refused
 * at the key. */
static void test_phi3_yaml_refusals(void **state)
{
    (void)state;
    static const char gpt[] = "model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n"
                              "  vocab: 50\n  max_positions: 16\n  fused_projections: true\n";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(gpt, strlen(gpt), "t.yaml", &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "model.fused_projections: one qkv_proj and one gate_up_proj"));
    assert_int_equal(e.line, 8);
    assert_null(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_phi3_mini_count),  cmocka_unit_test(test_phi3_mapping_and_window),
        cmocka_unit_test(test_phi3_keys),        cmocka_unit_test(test_phi3_block_fp32),
        cmocka_unit_test(test_phi3_block_amp),   cmocka_unit_test(test_phi3_yaml_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
