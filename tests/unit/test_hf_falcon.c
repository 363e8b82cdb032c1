/* The Falcon family: tiiuae/falcon-7b's published parameter count
 * recomputed by hand, the import's mapping and refusals, and a Falcon
 * block's inventory derived from what its ops keep (docs/inventory.md,
 * "Falcon block"). Every expected value is derived in the comments, not
 * taken from the program. */
#include "harness.h"
#include "model/model_internal.h"

/* tiiuae/falcon-7b: 6,921,720,704 parameters (the model card's 7B; the
 * safetensors index's total_size 13,843,441,408 B of bf16 / 2).
 *   word_embeddings 65024 x 4544                              =   295,469,056
 *   per layer: query_key_value 4544 x (71 + 2) x 64 = 4544 x 4672 =
 *     21,229,568; dense 4544 x 4544 = 20,647,936; dense_h_to_4h and
 *     dense_4h_to_h 2 x 4544 x 18176 = 165,183,488 (no biases);
 *     input_layernorm weight and bias 2 x 4544 = 9,088
 *     -> 207,070,080 per layer x 32                        = 6,626,242,560
 *   ln_f 2 x 4544                                             =         9,088
 *   lm_head: tied to word_embeddings                          =             0
 *   total                                                     = 6,921,720,704 */
static void test_falcon_7b_count(void **state)
{
    (void)state;
    const uint64_t layer = 4544ull * 4672 + 4544ull * 4544 + 2 * 4544ull * 18176 + 2 * 4544;
    assert_int_equal(layer, 207070080);
    assert_int_equal(65024ull * 4544 + 32 * layer + 2 * 4544, 6921720704ull);
    ml_model *m = load_hf_config("falcon-7b");
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 6921720704ull);
    assert_int_equal(block_named(l, "block.0")->params, 207070080);
    assert_int_equal(block_named(l, "embedding")->params, 295469056);
    assert_int_equal(block_named(l, "head")->params, 2 * 4544);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static void test_falcon_mapping(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("falcon-7b");
    assert_true(m->residual.parallel && m->residual.shared_norm && m->norms.bias &&
                m->residual.prenorm);
    assert_true(m->embed.tied && m->attn.kv_cache);
    assert_false(m->bias || m->attn.qkv_bias || m->attn.out_bias || m->mlp.bias);
    assert_int_equal(m->norms.kind, ML_NORM_LAYERNORM);
    assert_int_equal(m->mlp.activation, ML_ACT_GELU);
    assert_int_equal(m->embed.position, ML_POS_ROPE);
    assert_int_equal(m->attn.heads, 71);
    assert_int_equal(m->attn.kv_heads, 1); /* multi_query */
    assert_int_equal(m->attn.head_dim, 64);
    assert_int_equal(m->mlp.ffn, 4 * 4544);
    assert_true(m->dropout == 0);
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.seq_len, 2048); /* max_position_embeddings' default 2048 */
    ml_model_destroy(m);
}

/* A minimal Falcon config with one key's text added. */
static ml_status load_variant(const char *extra, ml_model **m, ml_error *e)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"falcon\", \"num_hidden_layers\": 2, \"hidden_size\": 32,\n"
             " \"num_attention_heads\": 4, \"vocab_size\": 50,\n"
             " \"layer_norm_epsilon\": 1e-05%s}",
             extra);
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

static void test_falcon_keys(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *msg;
    } refused[] = {
        {",\n \"alibi\": true", "alibi: true is refused"},
        {",\n \"new_decoder_architecture\": true", "new_decoder_architecture: true is refused"},
        {",\n \"parallel_attn\": false", "parallel_attn: false is refused"},
        {",\n \"num_ln_in_parallel_attn\": 2", "num_ln_in_parallel_attn: 2 is refused"},
        {",\n \"hidden_dropout\": 0.1", "hidden_dropout: 0.1 is refused"},
        {",\n \"attention_dropout\": 0.1", "attention_dropout: 0.1 is refused"},
        {",\n \"activation\": \"silu\"", "activation: 'silu' is not modelled for falcon"},
        {",\n \"multi_query\": false, \"num_kv_heads\": 2",
         "num_kv_heads: 2 with multi_query false"},
        {",\n \"num_key_value_heads\": 2",
         "num_key_value_heads: not a key memledger knows for model_type 'falcon'"},
        {",\n \"intermediate_size\": 64",
         "intermediate_size: not a key memledger knows for model_type 'falcon'"},
        {",\n \"head_dim\": 16", "head_dim"},
        {",\n \"bias\": true", "bias: true is refused"},
        {",\n \"architectures\": [\"FalconForTokenClassification\"]",
         "'FalconForTokenClassification' is not modelled: for model_type 'falcon' memledger "
         "plans FalconForCausalLM"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (load_variant(refused[i].extra, &m, &e) != ML_SCHEMA || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].extra, e.msg);
        assert_int_equal(e.line, 4);
        assert_null(m);
    }
    /* multi_query false: H key/value heads (num_kv_heads, if given, equal);
     * the sentence-only keys are inert */
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_variant(",\n \"multi_query\": false, \"num_kv_heads\": 4, \"bias\": false, "
                                  "\"apply_residual_connection_post_layernorm\": false, "
                                  "\"ffn_hidden_size\": 96, \"tie_word_embeddings\": false",
                                  &m, &e),
                     ML_OK);
    assert_int_equal(m->attn.kv_heads, 4);
    assert_int_equal(m->mlp.ffn, 96);
    assert_false(m->bias || m->attn.qkv_bias);
    assert_true(m->norms.bias);
    assert_false(m->embed.tied);
    ml_model_destroy(m);
}

/* A tiny Falcon-7B-like decoder: B=2, T=8 (BT = 16), D=32, H=4, one
 * key/value head, dh=8 (query_key_value 32 -> (4 + 2) x 8 = 48), F=128. */
#define TINY(shared)                                                                        \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 1\n"       \
    "  ffn: 128\n  vocab: 50\n  position: rope\n  bias: false\n  norm_bias: true\n"         \
    "  parallel_residual: true\n  shared_norm: " shared "\n  activation: gelu\n"            \
    "training:\n  micro_batch: 2\n  seq_len: 8\n"

/* One fp32 Falcon block:
 *   input_layernorm: x BT*D*4 = 2048, mean and rstd 2*BT*4 = 128
 *   _split_heads' index lists for k and v ([-2], [-1]): 2 x 8 = 16
 *   query_key_value's input (the norm's output) 2048
 *   the rotary q, and k and v expanded to 4 heads by the matmuls (bmm saves
 *     the copies): 3 x BT*32*4 = 6144
 *   softmax output in the stream's dtype B*H*T*T*4 = 2048
 *   dense's input BT*32*4 = 2048
 *   MLP: dense_h_to_4h reads the same norm output (nothing new); gelu's
 *     input and dense_4h_to_h's input 2 x BT*F*4 = 16384
 *   total 2048 + 128 + 16 + 2048 + 6144 + 2048 + 2048 + 16384 = 30,864 B.
 * Parameters: qkv 32 x 48 = 1536, dense 32 x 32 = 1024, MLP 2 x 32 x 128 =
 * 8192, LayerNorm 64 -> 10,816. FLOPs: qkv 2*BT*D*48 = 49,152; QK^T and PV
 * 4*B*H*T*T*dh = 16,384; dense 2*BT*32*32 = 32,768; MLP 2 x 2*BT*D*F =
 * 262,144 -> 360,448.
 * The same block with two norms (GPT-NeoX's parallel layer: no index lists,
 * the same additive mask and fp32 softmax) keeps ln_2's statistics (128)
 * and the MLP's input (2048), and has ln_2's 64 parameters. */
static void test_falcon_block_fp32(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY("true"));
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    const ml_block_info *b = block_named(l, "block.0");
    assert_int_equal(b->inventory_bytes, 30864);
    assert_int_equal(b->params, 10816);
    assert_rel_close(b->flops_forward, 360448, 0);
    ml_model *n = load_str(TINY("false"));
    ml_ledger *ln = eval(n, &c, false);
    const ml_block_info *nb = block_named(ln, "block.0");
    assert_int_equal(nb->inventory_bytes, 30864 - 16 + 128 + 2048);
    assert_int_equal(nb->params, 10816 + 64);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    ml_ledger_destroy(ln);
    ml_model_destroy(n);
}

/* ml_model_set_attention (the CLI's --attention): the same block with
 * flash attention keeps, instead of the q, k, v copies (6144) and the
 * softmax output (2048), the kernel's q, k, v, the fused projection's
 * width BT*48*4 = 3072, its output BT*32*4 = 2048 and the logsumexp
 * B*H*T*4 = 256; the output is dense's input itself (the kernel writes it
 * as (B, T, H, dh), so no copy: less its BT*32*4 = 2048):
 * 30,864 - 8,192 + 5,376 - 2,048 = 26,000 B. */
static void test_set_attention(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY("true"));
    ml_error e;
    assert_string_equal(ml_model_attention(m), "eager");
    assert_int_equal(ml_model_set_attention(m, "flash", &e), ML_OK);
    assert_string_equal(ml_model_attention(m), "flash");
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->inventory_bytes, 26000);
    ml_ledger_destroy(l);
    assert_int_equal(ml_model_set_attention(m, "flex", &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "'flex' is unknown; use eager, sdpa or flash"));
    assert_string_equal(ml_model_attention(m), "flash");
    ml_model_destroy(m);
    static const char seq[] = "model:\n  type: sequential\n  input: [4]\n  layers:\n"
                              "    - linear: {out: 2}\n";
    ml_model *s = load_str(seq);
    assert_int_equal(ml_model_set_attention(s, "sdpa", &e), ML_SCHEMA);
    assert_null(ml_model_attention(s));
    ml_model_destroy(s);
}

/* shared_norm is Falcon's parallel layer: without parallel_residual it is
 * refused at the key. */
static void test_falcon_yaml_refusals(void **state)
{
    (void)state;
    static const char y[] = "model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n"
                            "  vocab: 50\n  position: rope\n  shared_norm: true\n";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(y, strlen(y), "t.yaml", &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "model.shared_norm: Falcon's layer (one norm for both "
                                  "branches, its attention) needs parallel_residual: true"));
    assert_int_equal(e.line, 8);
    assert_null(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_falcon_7b_count),  cmocka_unit_test(test_falcon_mapping),
        cmocka_unit_test(test_falcon_keys),      cmocka_unit_test(test_falcon_block_fp32),
        cmocka_unit_test(test_falcon_yaml_refusals), cmocka_unit_test(test_set_attention),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
