/* The T5 family: google-t5/t5-base's published parameter count and
 * T5Config's defaults (t5-small's count) recomputed by hand, the import's
 * mapping, aliases and refusals, and the side tensors a T5 chain holds
 * (docs/ledger.md, "Side tensors"). Every expected value is derived in the
 * comments, not taken from the program. */
#include "harness.h"
#include "model/model_internal.h"

/* T5: the shared V x D table (the LM head tied to it); an encoder block's
 * q, k, v, o (D x H*dkv each), wi and wo (D x F each), two norms D; a
 * decoder block's two attentions, wi and wo, three norms; each stack's
 * first block a buckets x H relative_attention_bias; each stack a final
 * norm D. */
static uint64_t t5_params(uint64_t V, uint64_t D, uint64_t I, uint64_t F, uint64_t L,
                          uint64_t Ld, uint64_t H)
{
    uint64_t enc = L * (4 * D * I + 2 * D * F + 2 * D) + 32 * H + D;
    uint64_t dec = Ld * (8 * D * I + 2 * D * F + 3 * D) + 32 * H + D;
    return V * D + enc + dec;
}

/* t5-base: V 32128, D 768, I 12 x 64, F 3072, 12 + 12 blocks:
 * 24,674,304 + 84,954,240 + 113,275,008 = 222,903,552 (the model card). */
static void test_t5_base_count(void **state)
{
    (void)state;
    assert_int_equal(t5_params(32128, 768, 768, 3072, 12, 12, 12), 222903552ull);
    ml_model *m = load_hf_config("t5-base");
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.seq_len, 512); /* n_positions: the default length */
    c.training.micro_batch = 1;
    c.training.seq_len = 32;
    c.training.target_len = 8;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 222903552ull);
    /* encoder.block.0: 4 x 768^2 + 2 x 768 x 3072 + 2 x 768 + 32 x 12 */
    assert_int_equal(block_named(l, "encoder.block.0")->params, 7079808);
    /* decoder.block.1: 8 x 768^2 + 2 x 768 x 3072 + 3 x 768 */
    assert_int_equal(block_named(l, "decoder.block.1")->params, 9439488);
    assert_int_equal(block_named(l, "embedding")->params, 32128ull * 768);
    assert_int_equal(block_named(l, "decoder.embedding")->params, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* google/flan-t5-base: T5 v1.1's layout, the gated feed-forward (wi_0, wi_1,
 * wo: 3 x 768 x 2048 per block) and an untied LM head (V x D more):
 * 2 x 24,674,304 + 12 x (4 x 768^2 + 3 x 768 x 2048 + 2 x 768) + 384 + 768
 * + 12 x (8 x 768^2 + 3 x 768 x 2048 + 3 x 768) + 384 + 768 = 247,577,856
 * (the model card's 248M). */
static void test_flan_t5_base(void **state)
{
    (void)state;
    uint64_t D = 768, F = 2048, V = 32128;
    uint64_t enc = 12 * (4 * D * D + 3 * D * F + 2 * D) + 32 * 12 + D;
    uint64_t dec = 12 * (8 * D * D + 3 * D * F + 3 * D) + 32 * 12 + D;
    assert_int_equal(2 * V * D + enc + dec, 247577856ull);
    ml_model *m = load_hf_config("flan-t5-base");
    assert_int_equal(m->mlp.activation, ML_ACT_GEGLU);
    assert_false(m->embed.tied);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 16;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 247577856ull);
    assert_int_equal(block_named(l, "head")->params, V * D + D); /* lm_head, final norm */
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* One gated feed-forward's saved bytes (docs/inventory.md, "T5"): B 2,
 * Ts 8, Td 4, D 16, F 32, no dropout, so BTF = 2 x 8 x 32 = 512 elements
 * in an encoder block. fp32: wi_0's output (pow's input), tanh, 0.5 x,
 * 1 + tanh, the GELU's output, wi_1's output and the product (wo's input):
 * 7 x 512 x 4 = 14,336 B over the ReLU block's relu output 2,048: the
 * encoder block grows by 12,288 B, and by a wi_1 weight, 16 x 32. Under
 * autocast: the fp32 copy pow keeps, tanh, 1 + tanh and the GELU's output
 * in fp32 (4 x 4), 0.5 x and wi_1's output in bf16 (2 x 2), wo's bf16 cast
 * of the fp32 product (2): 22 B per element, against ReLU's relu output
 * (2) and wo's cast (2), and a second cast of wi's input (B x Ts x D x 2
 * = 512 B) and of a weight (D x F x 2 = 1,024 B): 18 x 512 + 512 + 1,024 =
 * 10,752 B more. */
static void test_t5_gated_block(void **state)
{
    (void)state;
    const char *y = "model:\n  type: encoder-decoder\n  layers: 1\n  hidden: 16\n  heads: 2\n"
                    "  ffn: 32\n  vocab: 40\n  activation: %s\ntraining:\n  micro_batch: 2\n"
                    "  seq_len: 8\n  target_len: 4\n";
    uint64_t saved[2][2], params[2];
    for (int g = 0; g < 2; g++) {
        char text[512];
        snprintf(text, sizeof text, y, g ? "geglu" : "relu");
        ml_model *m = NULL;
        ml_error e;
        assert_int_equal(ml_model_load_string(text, strlen(text), "t5.yaml", &m, &e), ML_OK);
        ml_config c = ml_model_config(m);
        for (int amp = 0; amp < 2; amp++) {
            c.training.precision = amp ? ML_PREC_AMP_BF16 : ML_PREC_FP32;
            ml_ledger *l = eval(m, &c, false);
            saved[g][amp] = block_named(l, "encoder.block.0")->activations_saved;
            params[g] = block_named(l, "encoder.block.0")->params;
            ml_ledger_destroy(l);
        }
        ml_model_destroy(m);
    }
    assert_int_equal(saved[1][0] - saved[0][0], 12288);
    assert_int_equal(saved[1][1] - saved[0][1], 10752);
    assert_int_equal(params[1] - params[0], 16 * 32);
}

static ml_status load_text(const char *text, ml_model **m, ml_error *e)
{
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

/* The parameters the plan counts for m (one sample of 16 tokens); m is
 * destroyed. */
static uint64_t planned_params(ml_model *m)
{
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 16;
    ml_ledger *l = eval(m, &c, false);
    uint64_t p = ml_ledger_summary(l)->params;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return p;
}

/* {"model_type": "t5"} alone is T5Config's defaults: t5-small's shape (V
 * 32128, D 512, dkv 64, F 2048, 6 + 6 blocks, 8 heads): 16,449,536 +
 * 18,881,280 + 25,175,808 = 60,506,624, t5-small's published count. */
static void test_t5_defaults(void **state)
{
    (void)state;
    assert_int_equal(t5_params(32128, 512, 512, 2048, 6, 6, 8), 60506624ull);
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_text("{\"model_type\": \"t5\"}", &m, &e), ML_OK);
    assert_int_equal(m->type, ML_MODEL_ENCDEC);
    assert_int_equal(m->layers, 6);
    assert_int_equal(m->t5.dec_layers, 6);
    assert_int_equal(m->hidden, 512);
    assert_int_equal(m->attn.heads, 8);
    assert_int_equal(m->attn.head_dim, 64);
    assert_int_equal(m->mlp.ffn, 2048);
    assert_int_equal(m->t5.rel_buckets, 32);
    assert_true(m->embed.tied);
    assert_true(m->dropout == 0.1);
    assert_int_equal(planned_params(m), 60506624ull);
    /* T5Config's attribute_map: hidden_size, num_attention_heads and
     * num_hidden_layers name d_model, num_heads and num_layers; d_kv may
     * make heads x d_kv differ from d_model (t5-v1_1-xl: 32 x 64 = 2048) */
    assert_int_equal(load_text("{\"model_type\": \"t5\", \"hidden_size\": 64, "
                               "\"num_attention_heads\": 2, \"num_hidden_layers\": 3, "
                               "\"num_decoder_layers\": 1, \"d_kv\": 16, "
                               "\"tie_word_embeddings\": false, \"use_cache\": true}",
                               &m, &e),
                     ML_OK);
    assert_int_equal(m->hidden, 64);
    assert_int_equal(m->attn.heads, 2);
    assert_int_equal(m->layers, 3);
    assert_int_equal(m->t5.dec_layers, 1);
    assert_int_equal(m->attn.head_dim, 16);
    assert_false(m->embed.tied);
    ml_model_destroy(m);
}

/* {"model_type": "mt5"} alone is MT5Config's defaults, google/mt5-small's
 * shape: V 250112 untied (2 x 128,057,344), D 512, 6 heads of 64 (I 384),
 * F 1024 gated (wi_0, wi_1, wo), 8 + 8 blocks: encoder 8 x (4 x 512 x 384
 * + 3 x 512 x 1024 + 2 x 512) + 32 x 6 + 512 = 18,883,264, decoder
 * 8 x (8 x 512 x 384 + 3 x 512 x 1024 + 3 x 512) + 32 x 6 + 512 =
 * 25,178,816: 300,176,768 (mt5-small's published count). */
static void test_mt5_defaults(void **state)
{
    (void)state;
    uint64_t enc = 8 * (4 * 512 * 384 + 3 * 512 * 1024 + 2 * 512) + 32 * 6 + 512;
    uint64_t dec = 8 * (8 * 512 * 384 + 3 * 512 * 1024 + 3 * 512) + 32 * 6 + 512;
    assert_int_equal(enc, 18883264);
    assert_int_equal(dec, 25178816);
    assert_int_equal(2 * 250112ull * 512 + enc + dec, 300176768ull);
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_text("{\"model_type\": \"mt5\"}", &m, &e), ML_OK);
    assert_int_equal(m->mlp.activation, ML_ACT_GEGLU);
    assert_false(m->embed.tied);
    assert_int_equal(planned_params(m), 300176768ull);
    /* MT5ForConditionalGeneration is the class planned */
    assert_int_equal(load_text("{\"model_type\": \"mt5\",\n \"architectures\": "
                               "[\"T5ForConditionalGeneration\"]}",
                               &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "memledger plans MT5ForConditionalGeneration"));
}

static void test_t5_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
    } refused[] = {
        {"{\"model_type\": \"t5\",\n \"feed_forward_proj\": \"gated-silu\"}",
         "feed_forward_proj: gated-silu is refused"},
        {"{\"model_type\": \"t5\",\n \"is_gated_act\": true, \"dense_act_fn\": \"relu\"}",
         "dense_act_fn: 'relu' with the gate is not modelled"},
        {"{\"model_type\": \"t5\",\n \"is_gated_act\": true}",
         "dense_act_fn: 'relu' with the gate is not modelled"},
        {"{\"model_type\": \"t5\",\n \"is_encoder_decoder\": false}",
         "is_encoder_decoder: false is refused"},
        {"{\"model_type\": \"t5\",\n \"attn_implementation\": \"sdpa\"}",
         "attn_implementation: T5's attention is eager"},
        {"{\"model_type\": \"t5\",\n \"d_model\": 64, \"hidden_size\": 64}", "hidden_size"},
        {"{\"model_type\": \"t5\",\n \"architectures\": [\"T5EncoderModel\"]}",
         "'T5EncoderModel' is not modelled: for model_type 't5' memledger plans "
         "T5ForConditionalGeneration"},
        {"{\"model_type\": \"t5\",\n \"intermediate_size\": 64}",
         "intermediate_size: not a key memledger knows for model_type 't5'"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (load_text(refused[i].text, &m, &e) != ML_SCHEMA || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].text, e.msg);
        assert_int_equal(e.line, 2);
        assert_null(m);
    }
}

/* The side tensors of a tiny fp32 T5 (docs/ledger.md, "Side tensors"): B
 * 2, Ts 8, Td 4, D 16, H 2 (dkv 8), no dropout. The encoder's position
 * bias (B, H, Ts, Ts) fp32 = 2 x 2 x 64 x 4 = 1,024 B lives from
 * encoder.block.0's forward to encoder.final's; the encoder's output
 * (B, Ts, D) fp32 = 1,024 B, saved by the cross-attentions' k and v, until
 * decoder.block.0's backward, and counted with encoder.final. The decoder's
 * self bias (B, H, 4, 4) x 4 = 256 B and the cross bias (B, H, 4, 8) x 4 =
 * 512 B live through the decoder's forward. */
static void test_t5_sides(void **state)
{
    (void)state;
    const char *y = "model:\n  type: encoder-decoder\n  layers: 2\n  hidden: 16\n  heads: 2\n"
                    "  ffn: 32\n  vocab: 40\ntraining:\n  micro_batch: 2\n  seq_len: 8\n"
                    "  target_len: 4\n";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(y, strlen(y), "t5.yaml", &m, &e), ML_OK);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    /* encoder.final: its layer norm's input, rsqrt and normalised
     * (2 x 2 x 8 x 16 x 4 + 2 x 8 x 4 = 2,112) and the encoder output 1,024 */
    assert_int_equal(block_named(l, "encoder.final")->activations_saved, 2112 + 1024);
    /* checkpointed: the encoder's bias is kept by encoder.block.1's
     * checkpoint (counted with block 0, which makes it) beside block 0's
     * input 2 x 8 x 16 x 4 = 1,024; the decoder's two biases with
     * decoder.block.0 beside its input 2 x 4 x 16 x 4 = 512 */
    c.training.checkpoint.kind = ML_CKPT_FULL;
    ml_ledger_destroy(l);
    l = eval(m, &c, false);
    assert_int_equal(block_named(l, "encoder.block.0")->activations_saved, 1024 + 1024);
    assert_int_equal(block_named(l, "decoder.block.0")->activations_saved, 512 + 256 + 512);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t5_base_count),
        cmocka_unit_test(test_t5_defaults),
        cmocka_unit_test(test_flan_t5_base),
        cmocka_unit_test(test_mt5_defaults),
        cmocka_unit_test(test_t5_gated_block),
        cmocka_unit_test(test_t5_refusals),
        cmocka_unit_test(test_t5_sides),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
