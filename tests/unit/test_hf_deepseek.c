/* The DeepSeek-V3 family: deepseek-ai/DeepSeek-V3's parameter count
 * recomputed by hand, the import's mapping and refusals, and a DeepSeek-V3
 * block's inventory derived from what its latent attention, router and
 * experts keep (docs/inventory.md, "DeepSeek-V3 block"). Every expected
 * value is derived in the comments, not taken from the program. */
#include "harness.h"
#include "ledger/chain.h"
#include "model/model_internal.h"

/* deepseek-ai/DeepSeek-V3 (models/hf/deepseek-v3; the technical report's
 * 671B total parameters, without the multi-token prediction module that
 * transformers does not load):
 *   attention per layer: q_a_proj 7168 x 1536 = 11,010,048; its norm 1,536;
 *     q_b_proj 1536 x 128 x 192 = 37,748,736; kv_a_proj_with_mqa
 *     7168 x (512 + 64) = 4,128,768; its norm 512; kv_b_proj
 *     512 x 128 x (128 + 128) = 16,777,216; o_proj 128 x 128 x 7168 =
 *     117,440,512 -> 187,107,328; two norms 14,336
 *   dense layers (3): the MLP 3 x 7168 x 18432 = 396,361,728 -> 583,483,392
 *   expert layers (58): 256 experts x 3 x 7168 x 2048 = 11,274,289,152, the
 *     router 256 x 7168 = 1,835,008, the shared expert 3 x 7168 x 2048 =
 *     44,040,192 -> 11,507,286,016
 *   embed_tokens and lm_head (untied) 2 x 129280 x 7168 = 1,853,358,080;
 *     final norm 7,168
 *   total 3 x 583,483,392 + 58 x 11,507,286,016 + 1,853,358,080 + 7,168
 *       = 671,026,404,352
 * (the e_score_correction_bias vectors, 58 x 256, are buffers). */
static void test_deepseek_v3_count(void **state)
{
    (void)state;
    const uint64_t attn = 7168ull * 1536 + 1536 + 1536ull * 128 * 192 + 7168ull * 576 + 512 +
                          512ull * 128 * 256 + 128ull * 128 * 7168;
    assert_int_equal(attn, 187107328ull);
    const uint64_t dense = attn + 2 * 7168 + 3 * 7168ull * 18432;
    const uint64_t moe = attn + 2 * 7168 + 256 * 3 * 7168ull * 2048 + 256ull * 7168 +
                         3 * 7168ull * 2048;
    assert_int_equal(dense, 583483392ull);
    assert_int_equal(moe, 11507286016ull);
    assert_int_equal(3 * dense + 58 * moe + 2 * 129280ull * 7168 + 7168, 671026404352ull);
    ml_model *m = load_hf_config("deepseek-v3");
    assert_int_equal(m->attn.kv_lora, 512);
    assert_int_equal(m->attn.q_lora, 1536);
    assert_int_equal(m->attn.rope_dim, 64);
    assert_int_equal(m->attn.v_dim, 128);
    assert_int_equal(m->attn.head_dim, 192);
    assert_int_equal(m->moe.experts, 256);
    assert_int_equal(m->moe.per_token, 8);
    assert_int_equal(m->moe.expert_ffn, 2048);
    assert_int_equal(m->moe.shared_ffn, 2048);
    assert_int_equal(m->moe.dense_layers, 3);
    assert_true(m->moe.router_sigmoid && m->moe.renorm);
    assert_false(m->moe.shared_gate || m->embed.tied || m->bias);
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 671026404352ull);
    assert_int_equal(block_named(l, "block.2")->params, dense);
    assert_int_equal(block_named(l, "block.3")->params, moe);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* A minimal DeepSeek-V3 config with one key's text added. */
static ml_status load_variant(const char *type, const char *extra, ml_model **m, ml_error *e)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 32,\n"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 4,\n"
             " \"intermediate_size\": 64, \"vocab_size\": 50%s}",
             type, extra);
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

static void test_deepseek_v3_keys(void **state)
{
    (void)state;
    static const struct {
        const char *type, *extra, *msg;
    } refused[] = {
        {"deepseek_v3", ",\n \"scoring_func\": \"softmax\"", "scoring_func: softmax is refused"},
        {"deepseek_v3", ",\n \"topk_method\": \"greedy\"", "topk_method: greedy is refused"},
        {"deepseek_v3", ",\n \"ep_size\": 8", "ep_size: 8 is refused"},
        {"deepseek_v3", ",\n \"moe_layer_freq\": 2", "moe_layer_freq: 2 is refused"},
        {"deepseek_v3", ",\n \"attention_bias\": true", "attention_bias: true is refused"},
        {"deepseek_v3", ",\n \"hidden_act\": \"gelu\"", "not modelled for deepseek_v3"},
        {"deepseek_v3", ",\n \"n_shared_experts\": null", "n_shared_experts: null is not modelled"},
        {"deepseek_v3", ",\n \"norm_topk_prob\": null", "norm_topk_prob: null is not modelled"},
        {"deepseek_v3", ",\n \"quantization_config\": {}", "quantization_config: a mapping is refused"},
        {"deepseek_v3", ",\n \"n_routed_experts\": 4, \"num_experts_per_tok\": 5",
         "num_experts_per_tok: 5 is more than n_routed_experts (4)"},
        {"llama", ",\n \"kv_lora_rank\": 512", "kv_lora_rank: 512 is refused"},
        {"mixtral", ",\n \"first_k_dense_replace\": 1", "first_k_dense_replace: 1 is refused"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        ml_status st = load_variant(refused[i].type, refused[i].extra, &m, &e);
        if ((st != ML_SCHEMA && st != ML_RANGE) || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].extra, e.msg);
        assert_int_equal(e.line, 4);
        assert_null(m);
    }
    /* num_key_value_heads absent: DeepseekV3Config's 128, not the 4 heads */
    static const char nokv[] = "{\"model_type\": \"deepseek_v3\", \"num_hidden_layers\": 2, "
                               "\"hidden_size\": 32, \"num_attention_heads\": 4, "
                               "\"vocab_size\": 50}";
    ml_model *q = NULL;
    ml_error qe;
    assert_int_equal(ml_model_load_hf_string(nokv, strlen(nokv), "config.json", &q, &qe),
                     ML_SCHEMA);
    assert_non_null(strstr(qe.msg, "num_key_value_heads: 128 is DeepseekV3Config's default, "
                                   "taken because the key is absent; multi-head latent "
                                   "attention makes num_attention_heads (4) key and value heads"));
    assert_non_null(strstr(qe.msg, "give num_key_value_heads equal to num_attention_heads"));
    assert_int_equal(qe.line, 1); /* the object that lacks the key */
    assert_int_equal(qe.col, 1);
    /* DeepseekV3Config's defaults, q_lora_rank null: one q_proj; every
     * layer dense when first_k_dense_replace covers them */
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_variant("deepseek_v3", ", \"q_lora_rank\": null, \"rope_interleave\": true",
                                  &m, &e),
                     ML_OK);
    assert_int_equal(m->attn.q_lora, 0);
    assert_int_equal(m->attn.kv_lora, 512);
    assert_int_equal(m->moe.dense_layers, 2); /* default 3 of 2 layers: all dense, */
    assert_int_equal(m->moe.experts, 0);      /* no experts run */
    ml_model_destroy(m);
    m = NULL;
    assert_int_equal(load_variant("deepseek_v3", ", \"first_k_dense_replace\": 1", &m, &e), ML_OK);
    assert_int_equal(m->moe.dense_layers, 1);
    assert_int_equal(m->moe.shared_ffn, 2048);
    ml_config c = ml_model_config(m);
    c.training.seq_len = 8;
    /* sdpa and flash with latent attention are refused at planning */
    ml_attention at[2] = {ML_ATTN_SDPA, ML_ATTN_FLASH};
    for (int i = 0; i < 2; i++) {
        m->attn.kernel = at[i];
        ml_ledger *l = NULL;
        assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
        assert_non_null(strstr(e.msg, "use --attention eager"));
    }
    ml_model_destroy(m);
}

/* A tiny DeepSeek-V3 decoder: B=2, T=8 (BT = 16), D=32, H=4, q/k heads 12
 * wide (8 without rotary, 4 rotated), value heads 8, q_lora 20, kv_lora 16,
 * the first layer dense (F = 64), then E=4 experts of width 8, k=2 per token
 * (N = 32 routed rows), a shared expert of 16. One fp32 block:
 *   its two RMSNorms on the stream: 2 x (2048 + 64 + 2048) = 8,320
 *   latent attention: the input of q_a_proj and kv_a_proj BT*D*4 = 2048;
 *     q_a's output BT*20*4 = 1280, rsqrt 64, the normalised 1280, q_b's
 *     input 1280; kv_a's whole (BT, 16 + 4) output the norm's pow keeps
 *     1280, rsqrt 64, the normalised BT*16*4 = 1024, kv_b's input 1024;
 *     the query and the key, BT*4*12*4 = 3072 each; the value copy
 *     BT*4*8*4 = 2048; softmax B*H*T*T*4 = 2048; o_proj's input
 *     BT*4*8*4 = 2048 -> 21,632
 *   the router: its input (the norm's output) 2048, the sigmoid scores
 *     BT*E*4 = 256, gather's int64 index BT*k*8 = 256, the sum + 1e-20
 *     BT*4 = 64, the top-k values the divide overwrites BT*k*4 = 128
 *     -> 2,752
 *   experts over N = 32 rows: torch.where's pairs N*2*8 = 512, the rows
 *     N*D*4 = 4096, gate's, silu's, up's outputs and the product
 *     4 x N*8*4 = 4096, down's output 4096, the gathered weights N*4 = 128,
 *     index_add_'s source 4096 -> 17,024
 *   the shared expert (its input is the router's): 4 x BT*16*4 = 4,096
 *   total 8,320 + 21,632 + 2,752 + 17,024 + 4,096 = 53,824 B.
 * The dense first block: 8,320 + 21,632 + the MLP's input 2048 and
 * 4 x BT*64*4 = 16,384 -> 48,384 B.
 * Parameters: q_a 640, its norm 20, q_b 20 x 48 = 960, kv_a 32 x 20 = 640,
 * its norm 16, kv_b 16 x 4 x 16 = 1024, o 32 x 32 = 1024 -> 4,324; two
 * norms 64; experts 4 x 3 x 32 x 8 = 3072, router 128, shared 3 x 32 x 16 =
 * 1536 -> 9,124 (the dense block: 4,324 + 64 + 3 x 32 x 64 = 10,532). */
#define TINY                                                                                   \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  head_dim: 12\n"         \
    "  rope_head_dim: 4\n  v_head_dim: 8\n  kv_lora_rank: 16\n  q_lora_rank: 20\n"             \
    "  ffn: 64\n  experts: 4\n  experts_per_tok: 2\n  expert_ffn: 8\n"                         \
    "  shared_expert_ffn: 16\n  router: sigmoid\n  dense_layers: 1\n  vocab: 50\n"             \
    "  position: rope\n  bias: false\n  tied_embeddings: false\n  norm: rmsnorm\n"             \
    "  activation: swiglu\ntraining:\n  micro_batch: 2\n  seq_len: 8\n"

static void test_deepseek_v3_block_fp32(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->inventory_bytes, 48384);
    assert_int_equal(block_named(l, "block.1")->inventory_bytes, 53824);
    assert_int_equal(block_named(l, "block.0")->params, 10532);
    assert_int_equal(block_named(l, "block.1")->params, 9124);
    ml_ledger_destroy(l);
    /* the evaluation pass's cache per layer (use_cache): the keys, 4 heads
     * of 12, BT*48*4 = 3,072 B, and the values' storage, kv_b_proj's whole
     * output BT*4*(8 + 8)*4 = 4,096 B; under autocast the keys are fp32
     * (3,072) and kv_b's output bf16 (2,048) */
    ml_chain ch;
    ml_error ce;
    m->attn.kv_cache = true; /* HF's use_cache (a YAML model keeps none) */
    assert_int_equal(ml__chain_build_eval(m, &c, &ch, &ce), ML_OK);
    assert_int_equal(ch.blocks[1].cache_bytes, 3072 + 4096);
    ml__chain_free(&ch);
    c.training.precision = ML_PREC_AMP_BF16;
    assert_int_equal(ml__chain_build_eval(m, &c, &ch, &ce), ML_OK);
    assert_int_equal(ch.blocks[1].cache_bytes, 3072 + 2048);
    ml__chain_free(&ch);
    ml_model_destroy(m);
    /* the YAML's refusals: a latent-attention key alone, a gate on
     * DeepSeek's shared experts */
    static const struct {
        const char *yaml, *msg;
    } bad[] = {
        {"model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  vocab: 50\n"
         "  position: rope\n  rope_head_dim: 4\n",
         "give kv_lora_rank"},
        {"model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  vocab: 50\n"
         "  norm: rmsnorm\n  activation: swiglu\n  position: rope\n  bias: false\n"
         "  experts: 4\n  router: sigmoid\n  shared_expert_ffn: 16\n  shared_expert_gate: true\n",
         "shared_expert_gate: true is not modelled here"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ml_model *q = NULL;
        ml_error e;
        if (ml_model_load_string(bad[i].yaml, strlen(bad[i].yaml), "t.yaml", &q, &e) !=
                ML_SCHEMA ||
            !strstr(e.msg, bad[i].msg))
            fail_msg("%s: got '%s'", bad[i].yaml, e.msg);
    }
}

/* deepseek-ai/DeepSeek-V2-Lite (models/hf/deepseek-v2-lite; the model card's
 * 15.7B total parameters):
 *   attention per layer: q_proj 2048 x 16 x 192 = 6,291,456;
 *     kv_a_proj_with_mqa 2048 x 576 = 1,179,648; its norm 512; kv_b_proj
 *     512 x 16 x 256 = 2,097,152; o_proj 16 x 128 x 2048 = 4,194,304
 *     -> 13,763,072; two norms 4,096
 *   the dense layer: 3 x 2048 x 10944 = 67,239,936 -> 81,007,104
 *   expert layers (26): 64 x 3 x 2048 x 1408 = 553,648,128, the router
 *     64 x 2048 = 131,072, the two shared experts 3 x 2048 x 2816 =
 *     17,301,504 -> 584,847,872
 *   embeddings and lm_head 2 x 102400 x 2048 = 419,430,400; final norm 2,048
 *   total 81,007,104 + 26 x 584,847,872 + 419,430,400 + 2,048
 *       = 15,706,484,224.
 * Its block.1 at B = 1, T = 128 in fp32 (W = 128 x 2048 x 4 = 1,048,576):
 *   the stream norms 2 x (2 W + 512); the projections' input W; kv_a's
 *   output 128 x 576 x 4 = 294,912, rsqrt 512, the normalised and kv_b's
 *   input 2 x 262,144; query and key 2 x 128 x 16 x 192 x 4 = 3,145,728;
 *   kv_b's output 128 x 16 x 256 x 4 = 2,097,152 (a batch of one: the PV
 *   matmul keeps v, a view of it, where a larger batch keeps v's copy,
 *   1,048,576); softmax (16 x 128^2 x 4) and o_proj's input 2 x 1,048,576;
 *   the router: x W, softmax 128 x 64 x 4 = 32,768, topk's indices
 *   128 x 6 x 8 = 6,144; the dispatch over N = 768 pairs: argsort and
 *   argsort // k 2 x 768 x 8 = 12,288, the sorted rows 768 x 2048 x 4 =
 *   6,291,456, SwiGLU's four 4 x 768 x 1408 x 4 = 17,301,504, the copy the
 *   in-place mul keeps 6,291,456, the scaled weights 128 x 6 x 4 = 3,072;
 *   the shared experts' four 4 x 128 x 2816 x 4 = 5,767,168
 *   -> 50,158,080 B; group_limited_greedy adds masked_fill's bool mask
 *   128 x 64 = 8,192. The rotary table is one complex64 (1, 128, 32):
 *   128 x 64 x 4 = 32,768 B, the embedding block's. */
static void test_deepseek_v2_lite(void **state)
{
    (void)state;
    const uint64_t attn = 2048ull * 16 * 192 + 2048ull * 576 + 512 + 512ull * 16 * 256 +
                          16ull * 128 * 2048;
    const uint64_t dense = attn + 2 * 2048 + 3 * 2048ull * 10944;
    const uint64_t moe = attn + 2 * 2048 + 64 * 3 * 2048ull * 1408 + 64ull * 2048 +
                         3 * 2048ull * 2816;
    assert_int_equal(dense, 81007104ull);
    assert_int_equal(moe, 584847872ull);
    assert_int_equal(dense + 26 * moe + 2 * 102400ull * 2048 + 2048, 15706484224ull);
    ml_model *m = load_hf_config("deepseek-v2-lite");
    assert_true(m->moe.sort && m->embed.rope_complex);
    assert_false(m->moe.router_sigmoid || m->moe.renorm || m->moe.grouped_topk || m->attn.q_lora);
    assert_int_equal(m->moe.shared_ffn, 2816);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 128;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 15706484224ull);
    assert_int_equal(block_named(l, "block.1")->inventory_bytes, 50158080);
    assert_int_equal(block_named(l, "embedding")->inventory_bytes, 32768);
    ml_ledger_destroy(l);
    m->moe.grouped_topk = true;
    l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.1")->inventory_bytes, 50158080 + 8192);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    static const struct {
        const char *extra, *msg;
    } refused[] = {
        {",\n \"num_experts_per_tok\": 2, \"scoring_func\": \"sigmoid\"",
         "scoring_func: sigmoid is refused"},
        {",\n \"num_experts_per_tok\": 2, \"topk_method\": \"noaux_tc\"",
         "topk_method: noaux_tc is refused"},
        {",\n \"num_experts_per_tok\": 2, \"mlp_bias\": true", "mlp_bias: true is refused"},
        {",\n \"num_experts_per_tok\": 2, \"topk_method\": \"group_limited_greedy\", "
         "\"n_group\": 5",
         "n_group: 5 does not divide n_routed_experts (64)"},
        {",\n \"n_routed_experts\": 8", "num_experts_per_tok: missing"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *q = NULL;
        ml_error e;
        ml_status st = load_variant("deepseek_v2", refused[i].extra, &q, &e);
        if ((st != ML_SCHEMA && st != ML_RANGE) || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].extra, e.msg);
        assert_null(q);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepseek_v3_count),
        cmocka_unit_test(test_deepseek_v3_keys),
        cmocka_unit_test(test_deepseek_v3_block_fp32),
        cmocka_unit_test(test_deepseek_v2_lite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
