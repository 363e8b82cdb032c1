/* The Gemma family (Gemma 1): google/gemma-2b's published parameter count
 * recomputed by hand, the import's mapping and refusals, and a Gemma
 * block's inventory derived from what GemmaRMSNorm and the GeGLU MLP save
 * (docs/inventory.md, "Gemma block"). Every expected value is derived in
 * the comments, not taken from the program. */
#include "harness.h"
#include "model/model_internal.h"

static ml_model *gemma_2b(void)
{
    return load_hf_config("gemma-2b");
}

/* google/gemma-2b: 2,506,172,416 parameters (the published figure).
 *   embedding (tied with the LM head): 256000 x 2048          =   524,288,000
 *   per layer: q_proj 2048 x (8 x 256) = 4,194,304; k_proj and v_proj
 *     2048 x (1 x 256) = 524,288 each; o_proj 2048 x 2048 = 4,194,304
 *     -> attention 9,437,184; GeGLU gate, up, down 3 x 2048 x 16384 =
 *     100,663,296; two GemmaRMSNorm weights 2 x 2048 = 4,096
 *     -> 110,104,576 per layer x 18 layers                  = 1,981,882,368
 *   final norm                                               =         2,048
 *   total                                                    = 2,506,172,416
 * With tie_word_embeddings false the head would add 524,288,000 more. */
static void test_gemma_2b_count(void **state)
{
    (void)state;
    const uint64_t attn = 2048ull * 2048 + 2 * 2048ull * 256 + 2048ull * 2048;
    const uint64_t layer = attn + 3 * 2048ull * 16384 + 2 * 2048;
    assert_int_equal(attn, 9437184);
    assert_int_equal(layer, 110104576);
    assert_int_equal(256000ull * 2048 + 18 * layer + 2048, 2506172416ull);
    ml_model *m = gemma_2b();
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 2506172416ull);
    assert_int_equal(block_named(l, "block.0")->params, 110104576);
    assert_int_equal(block_named(l, "embedding")->params, 524288000);
    assert_int_equal(block_named(l, "head")->params, 2048); /* the final norm; tied */
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static void test_gemma_mapping(void **state)
{
    (void)state;
    ml_model *m = gemma_2b();
    assert_int_equal(m->mlp.activation, ML_ACT_GEGLU);
    assert_int_equal(m->norms.kind, ML_NORM_GEMMA_RMSNORM);
    assert_true(m->embed.scale && m->embed.tied && m->residual.prenorm && m->attn.kv_cache);
    assert_int_equal(m->embed.position, ML_POS_ROPE);
    assert_int_equal(m->attn.heads, 8);
    assert_int_equal(m->attn.kv_heads, 1); /* multi-query attention */
    assert_int_equal(m->attn.head_dim, 256);
    assert_false(m->bias || m->attn.qkv_bias || m->attn.out_bias || m->mlp.bias);
    assert_string_equal(ml_model_name(m), "gemma-2b");
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.seq_len, 2048); /* min(8192, 2048) */
    ml_model_destroy(m);
}

/* A minimal Gemma config with one key's text replaced. */
static ml_status load_variant(const char *extra, ml_model **m, ml_error *e)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"gemma\", \"num_hidden_layers\": 2, \"hidden_size\": 32,\n"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 1, \"head_dim\": 16,\n"
             " \"intermediate_size\": 64, \"vocab_size\": 50%s}",
             extra);
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

static void test_gemma_keys(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *msg;
        unsigned line;
    } refused[] = {
        {",\n \"hidden_act\": \"silu\"", "hidden_act: 'silu' is not modelled for gemma", 4},
        {",\n \"hidden_activation\": \"gelu_new\"",
         "hidden_activation: 'gelu_new' is not modelled for gemma", 4},
        {",\n \"use_bidirectional_attention\": true", "use_bidirectional_attention", 4},
        {",\n \"attention_dropout\": 0.1", "attention_dropout", 4},
        {",\n \"attn_logit_softcapping\": 50.0", "attn_logit_softcapping", 4},
        {",\n \"sliding_window\": 4096", "not a key memledger knows for model_type 'gemma'", 4},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (load_variant(refused[i].extra, &m, &e) != ML_SCHEMA || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].extra, e.msg);
        assert_int_equal(e.line, refused[i].line);
        assert_null(m);
    }
    /* both GELUs, null hidden_activation, biases and an untied head */
    static const char *const ok[] = {",\n \"hidden_act\": \"gelu_pytorch_tanh\"",
                                     ",\n \"hidden_activation\": null",
                                     ",\n \"hidden_activation\": \"gelu\""};
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (load_variant(ok[i], &m, &e) != ML_OK)
            fail_msg("%s: %s", ok[i], e.msg);
        assert_int_equal(m->mlp.activation, ML_ACT_GEGLU);
        ml_model_destroy(m);
    }
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_variant(",\n \"attention_bias\": true, \"tie_word_embeddings\": false",
                                  &m, &e),
                     ML_OK);
    assert_true(m->attn.qkv_bias && m->attn.out_bias && !m->mlp.bias && !m->embed.tied);
    ml_model_destroy(m);
}

/* A tiny Gemma-like decoder: B=2, T=8 (BT = 16), D=32, H=4, one kv head,
 * dh=16 (H*dh = 64), F=64, V=50. */
#define TINY(norm, act, prec)                                                                \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 1\n"       \
    "  head_dim: 16\n  ffn: 64\n  vocab: 50\n  position: rope\n  bias: false\n"             \
    "  norm: " norm "\n  activation: " act "\n  embedding_scale: true\n"                    \
    "training:\n  micro_batch: 2\n  seq_len: 8\n  precision: " prec "\n"

static const ml_block_info *tiny_block(const char *yaml, ml_ledger **l, ml_model **m)
{
    *m = load_str(yaml);
    ml_config c = ml_model_config(*m);
    *l = eval(*m, &c, false);
    return block_named(*l, "block.0");
}

/* One fp32 Gemma block:
 *   input_layernorm: its input, the block input x (saved by pow and by the
 *     mul by rsqrt; in the inventory although it is the boundary tensor,
 *     docs/ledger.md) BT*D*4 = 2048; rsqrt BT*4 = 64; normalised h (fp32)
 *     2048;
 *     1 + weight (fp32, saved by h * (1 + w) since h needs a gradient) D*4 = 128
 *   attention: q/k/v input (the norm's output) 2048; q, k, v contiguous
 *     copies (k, v repeated to 4 heads) 3 x BT*64*4 = 12288; fp32 softmax
 *     B*H*T*T*4 = 2048; o_proj input BT*64*4 = 4096
 *   post_attention_layernorm: its input x + attn 2048, rsqrt 64, h 2048,
 *     1 + weight 128
 *   GeGLU MLP: input 2048; gelu input (gate output), gelu output, up output,
 *     the product 4 x BT*F*4 = 16384
 *   total 2048+64+2048+128 + 2048+12288+2048+4096 + 2048+64+2048+128
 *       + 2048+16384 = 47,488 B: Llama's block (weight * h.to(dtype)) plus
 *   the two 1 + weight vectors, 47,232 + 256. Parameters: q 32x64 = 2048, k and v
 *   32x16 = 512 each, o 64x32 = 2048, MLP 3 x 32x64 = 6144, norms 64 ->
 *   11,328. FLOPs as Llama's: the MLP 3 x 2*BT*D*F = 196,608; q, k, v
 *   2*BT*D*(64+16+16) = 98,304; QK^T and PV 4*B*H*T*T*dh = 32,768; o_proj
 *   2*BT*64*D = 65,536 -> 393,216. */
static void test_gemma_block_fp32(void **state)
{
    (void)state;
    ml_ledger *l, *ll;
    ml_model *m, *lm;
    const ml_block_info *g = tiny_block(TINY("gemma_rmsnorm", "geglu", "fp32"), &l, &m);
    const ml_block_info *b = tiny_block(TINY("rmsnorm", "swiglu", "fp32"), &ll, &lm);
    assert_int_equal(g->inventory_bytes, 47488);
    assert_int_equal(b->inventory_bytes, 47488 - 256);
    assert_int_equal(g->params, 11328);
    assert_rel_close(g->flops_forward, 393216, 0);
    /* the embedding's scale saves a host scalar only: the rotary cos and
     * sin, one row for the batch (position ids cache_position[None]),
     * 2*T*dh*4 = 1024, as Llama's (its ids, B*T*8 = 128, are the batch's) */
    assert_int_equal(block_named(l, "embedding")->inventory_bytes, 1024);
    assert_int_equal(ml_ledger_summary(l)->bytes_batch, 128 + 128); /* ids, targets */
    /* the final norm: input 2048, rsqrt 64, h 2048, 1 + weight 128; the LM
     * head's input (the norm's output) 2048 */
    assert_int_equal(block_named(l, "head")->inventory_bytes, 2048 + 64 + 2048 + 128 + 2048);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    ml_ledger_destroy(ll);
    ml_model_destroy(lm);
}

/* bf16 (pure): GemmaRMSNorm keeps h in fp32 (h * (1 + w) runs before the
 * cast back) where Llama's keeps the bf16 cast: per norm BT*D*(4 - 2) =
 * 1024 more, plus the fp32 1 + weight 128: 2 x 1152 = 2304 per block. */
static void test_gemma_block_bf16(void **state)
{
    (void)state;
    ml_ledger *l, *ll;
    ml_model *m, *lm;
    const ml_block_info *g = tiny_block(TINY("gemma_rmsnorm", "geglu", "bf16"), &l, &m);
    const ml_block_info *b = tiny_block(TINY("rmsnorm", "swiglu", "bf16"), &ll, &lm);
    assert_int_equal(g->inventory_bytes, b->inventory_bytes + 2304);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    ml_ledger_destroy(ll);
    ml_model_destroy(lm);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemma_2b_count),   cmocka_unit_test(test_gemma_mapping),
        cmocka_unit_test(test_gemma_keys),       cmocka_unit_test(test_gemma_block_fp32),
        cmocka_unit_test(test_gemma_block_bf16),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
