/* BertForMaskedLM: bert-base-uncased's count as that class recomputed by
 * hand, the import's mapping, and the MLM head's inventory derived from
 * what BertLMPredictionHead saves (docs/inventory.md, "Heads and losses").
 * Every expected value is derived in the comments, not taken from the
 * program. */
#include "harness.h"
#include "model/model_internal.h"

static ml_model *bert_base_mlm(void)
{
    return load_hf_config("bert-base-uncased");
}

/* bert-base-uncased as BertForMaskedLM: 109,514,298 parameters (what
 * transformers' num_parameters() gives: the tied decoder weight counts once).
 *   embeddings: word 30522 x 768 = 23,440,896, position 512 x 768 = 393,216,
 *     token type 2 x 768 = 1,536, LayerNorm 2 x 768 = 1,536    =    23,837,184
 *   per layer: q, k, v, o 4 x (768 x 768 + 768) = 2,362,368; attention
 *     LayerNorm 1,536; intermediate 768 x 3072 + 3072 = 2,362,368; output
 *     3072 x 768 + 768 = 2,360,064; LayerNorm 1,536 -> 7,087,872 x 12 = 85,054,464
 *   BertModel without its pooler (add_pooling_layer=False)  =   108,891,648
 *     (the published BertModel 109,482,240 less the pooler's 768 x 768 + 768)
 *   MLM head: transform dense 768 x 768 + 768 = 590,592, LayerNorm 1,536,
 *     the decoder's bias 30,522 (its weight is the word embeddings) = 622,650
 *   total                                                       =   109,514,298 */
static void test_bert_mlm_count(void **state)
{
    (void)state;
    const uint64_t emb = 30522ull * 768 + 512 * 768 + 2 * 768 + 2 * 768;
    const uint64_t layer = 4 * (768ull * 768 + 768) + 1536 + (768ull * 3072 + 3072) +
                           (3072ull * 768 + 768) + 1536;
    const uint64_t head = 768ull * 768 + 768 + 1536 + 30522;
    assert_int_equal(emb, 23837184);
    assert_int_equal(layer, 7087872);
    assert_int_equal(emb + 12 * layer, 109482240 - (768 * 768 + 768));
    assert_int_equal(head, 622650);
    assert_int_equal(emb + 12 * layer + head, 109514298);
    ml_model *m = bert_base_mlm();
    assert_true(m->head.mlm && m->embed.tied);
    assert_false(m->head.pooler || m->residual.prenorm);
    assert_int_equal(m->head.classes, 0);
    ml_config c = ml_model_config(m);
    c.training.seq_len = 128;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 109514298);
    assert_int_equal(block_named(l, "embedding")->params, 23837184);
    assert_int_equal(block_named(l, "block.0")->params, 7087872);
    assert_int_equal(block_named(l, "head")->params, 622650);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The classifier stays the other class, and BertForMaskedLM does not read
 * the classifier's keys: num_labels 1 (a regression for the classifier) is
 * planned as the MLM it names. */
static void test_bert_mlm_keys(void **state)
{
    (void)state;
    static const char base[] = "{\"model_type\": \"bert\", \"num_hidden_layers\": 2, "
                               "\"hidden_size\": 32, \"num_attention_heads\": 4, "
                               "\"vocab_size\": 50, \"max_position_embeddings\": 16,\n"
                               " \"architectures\": [\"%s\"]%s}";
    char json[512];
    ml_model *m = NULL;
    ml_error e;
    snprintf(json, sizeof json, base, "BertForMaskedLM",
             ", \"num_labels\": 1, \"tie_word_embeddings\": false");
    assert_int_equal(ml_model_load_hf_string(json, strlen(json), "c.json", &m, &e), ML_OK);
    assert_true(m->head.mlm && !m->embed.tied && !m->head.pooler);
    ml_model_destroy(m);
    snprintf(json, sizeof json, base, "BertForSequenceClassification", ", \"num_labels\": 3");
    assert_int_equal(ml_model_load_hf_string(json, strlen(json), "c.json", &m, &e), ML_OK);
    assert_true(!m->head.mlm && m->head.pooler);
    assert_int_equal(m->head.classes, 3);
    ml_model_destroy(m);
}

/* A tiny BERT with the MLM head: B=2, T=8 (BT = 16), D=32, V=50. */
#define TINY(extra, prec)                                                                    \
    "model:\n  type: encoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  ffn: 64\n"           \
    "  norm_position: post\n  vocab: 50\n  max_positions: 16\n  dropout: 0\n"               \
    "  mlm_head: true\n" extra "training:\n  micro_batch: 2\n  seq_len: 8\n"                 \
    "  precision: " prec "\n"

/* fp32: the dense's input (the last block's output, the boundary) BT*D*4 =
 * 2048; gelu's input (the dense output) 2048; the LayerNorm's input (gelu's
 * output) 2048 and its mean, rstd 2*BT*4 = 128; the decoder's input (the
 * LayerNorm output) 2048: 8,320. Parameters: dense 32 x 32 + 32, LayerNorm
 * 64, decoder bias 50 -> 1,170 (tied); untied + 50 x 32 = 2,770. FLOPs
 * 2*BT*D*(D + V) = 83,968. The loss: log-softmax BT*V*4 = 3,200,
 * total_weight 4: 3,204 (the targets, BT*8 = 128, are the batch's).
 * amp-bf16: the dense input's bf16 cast 1024 and the weight's 32*32*2 =
 * 2048; gelu's bf16 input 1024; autocast runs layer_norm in fp32: its fp32
 * cast of gelu's output 2048 and 128; the decoder's bf16 cast of the fp32
 * LayerNorm output 1024 and the tied weight's copy 50*32*2 = 3200: 10,496. */
static void test_bert_mlm_head(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY("", "fp32"));
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    const ml_block_info *h = block_named(l, "head");
    assert_int_equal(h->inventory_bytes, 8320);
    assert_int_equal(h->params, 1170);
    assert_rel_close(h->flops_forward, 83968, 0);
    assert_int_equal(block_named(l, "loss")->inventory_bytes, 3204);
    assert_int_equal(ml_ledger_summary(l)->bytes_batch, 128 + 128); /* ids, targets */
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    m = load_str(TINY("  tied_embeddings: false\n", "fp32"));
    c = ml_model_config(m);
    l = eval(m, &c, false);
    assert_int_equal(block_named(l, "head")->params, 2770);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    m = load_str(TINY("", "amp-bf16"));
    c = ml_model_config(m);
    l = eval(m, &c, false);
    assert_int_equal(block_named(l, "head")->inventory_bytes, 10496);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* mlm_head is a text encoder's: with classes, or on a decoder, refused. */
static void test_bert_mlm_yaml_refusals(void **state)
{
    (void)state;
    static const char enc[] = "model:\n  type: encoder\n  layers: 1\n  hidden: 32\n  heads: 4\n"
                              "  vocab: 50\n  max_positions: 16\n  classes: 3\n"
                              "  mlm_head: true\n";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(enc, strlen(enc), "t.yaml", &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "model.mlm_head: the masked-LM head (BertForMaskedLM)"));
    assert_int_equal(e.line, 9);
    assert_null(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_bert_mlm_count),
        cmocka_unit_test(test_bert_mlm_keys),
        cmocka_unit_test(test_bert_mlm_head),
        cmocka_unit_test(test_bert_mlm_yaml_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
