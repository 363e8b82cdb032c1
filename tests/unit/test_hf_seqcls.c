/* The decoders' sequence-classification head (transformers'
 * GenericForSequenceClassification, as LlamaForSequenceClassification and
 * the other *ForSequenceClassification classes use it): parameters, the
 * head's and the loss's saved bytes derived by hand, and the refusals
 * (docs/inventory.md, "Heads and losses"; docs/hf.md). */
#include "harness.h"
#include "model/model_internal.h"

/* meta-llama/Llama-2-7b-hf's config.json as LlamaForSequenceClassification
 * with num_labels 3: the causal LM's 6,738,415,616 parameters less lm_head
 * (32000 x 4096 = 131,072,000) plus score (3 x 4096 = 12,288) =
 * 6,607,355,904. */
static ml_model *llama_cls(const char *pad)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/llama-2-7b/config.json", ML_MODELS_DIR);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    static char text[1 << 16], out[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    /* the keys go first in the object; the class is renamed in place */
    const char *brace = strchr(text, '{'), *at = strstr(text, "\"LlamaForCausalLM\"");
    assert_non_null(brace);
    assert_non_null(at);
    snprintf(out, sizeof out, "{\"num_labels\": 3%s,%.*s\"LlamaForSequenceClassification\"%s",
             pad, (int)(at - brace - 1), brace + 1, at + strlen("\"LlamaForCausalLM\""));
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf_string(out, strlen(out), "config.json", &m, &e) != ML_OK)
        fail_msg("%u:%u: %s", e.line, e.col, e.msg);
    return m;
}

/* B = 4, T = 512, D = 4096, 3 classes, fp32. The head block: the final
 * RMSNorm's input, rsqrt and h (2 x 4 x 512 x 4096 x 4 + 4 x 512 x 4 =
 * 67,117,056), score's input (the norm's output) 33,554,432, the pooling's
 * two int64 index tensors 2 x 4 x 8 = 64: 100,671,552 B. The loss: the
 * log-softmax output of the (4, 3) pooled logits 48 and nll's total weight
 * 4: 52 B (the targets are the batch's). */
static void test_llama_seq_cls(void **state)
{
    (void)state;
    ml_model *m = llama_cls(", \"pad_token_id\": 0");
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 4;
    c.training.seq_len = 512;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 6607355904ull);
    assert_int_equal(block_named(l, "head")->params, 4096 + 3 * 4096);
    assert_int_equal(block_named(l, "head")->inventory_bytes, 100671552);
    assert_int_equal(block_named(l, "loss")->inventory_bytes, 52);
    ml_ledger_destroy(l);
    /* logits: fused is the LM head's fused cross-entropy: refused */
    c.training.logits = ML_LOGITS_FUSED;
    ml_ledger *f = NULL;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &f, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "training.logits: fused is a language model's head"));
    ml_model_destroy(m);
}

/* Without pad_token_id transformers refuses a batch above 1; at B = 1 the
 * last token is index -1, a select: only arange's 8 B index is kept. */
static void test_no_pad(void **state)
{
    (void)state;
    ml_model *m = llama_cls("");
    assert_true(m->head.cls_no_pad);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 2;
    c.training.seq_len = 64;
    ml_ledger *l = NULL;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "a batch of 2 with no pad_token_id"));
    c.training.micro_batch = 1;
    l = eval(m, &c, false);
    /* 2 x 64 x 4096 x 4 + 64 x 4 + 64 x 4096 x 4 + 8 */
    assert_int_equal(block_named(l, "head")->inventory_bytes, 3 * 64 * 4096 * 4 + 256 + 8);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* gpt2 (tied embeddings) as GPT2ForSequenceClassification: 124,439,808 +
 * score 768 x 2 = 124,441,344 parameters; without an LM head the word
 * embeddings' gradient is the embedding's own, so the gradients are every
 * parameter's: 4 x 124,441,344 B. A sequence classifier without
 * pad_token_id runs one sample at a time: fit caps its micro-batch at 1. */
static void test_tied_and_fit(void **state)
{
    (void)state;
    const char *json = "{\"model_type\": \"gpt2\", \"n_layer\": 12, \"n_embd\": 768, "
                       "\"n_head\": 12, \"vocab_size\": 50257, \"n_positions\": 1024, "
                       "\"architectures\": [\"GPT2ForSequenceClassification\"]}";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_hf_string(json, strlen(json), "config.json", &m, &e), ML_OK);
    assert_int_equal(ml_model_max_micro_batch(m), 1);
    ml_config c = ml_model_config(m);
    c.training.seq_len = 128;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 124441344ull);
    assert_int_equal(ml_ledger_summary(l)->bytes_grads, 4 * 124441344ull);
    ml_ledger_destroy(l);
    c.device.present = true;
    c.device.memory = 80ull << 30;
    ml_fit_request req = ml_fit_request_defaults();
    ml_fit_result r;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 1);
    ml_model_destroy(m);
}

static void test_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *json, *msg;
    } bad[] = {
        {"{\"model_type\": \"mistral\", \"num_hidden_layers\": 1, \"hidden_size\": 32, "
         "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"intermediate_size\": 64, "
         "\"vocab_size\": 50, "
         "\"architectures\": [\"MistralForSequenceClassification\"], \"num_labels\": 1}",
         "num_labels: 1 makes MistralForSequenceClassification a regression"},
        {"{\"model_type\": \"gpt2\", \"n_layer\": 1, \"n_embd\": 32, \"n_head\": 4, "
         "\"vocab_size\": 50, \"architectures\": [\"GPT2ForSequenceClassification\"], "
         "\"problem_type\": \"multi_label_classification\"}",
         "problem_type: 'multi_label_classification' is not modelled for "
         "GPT2ForSequenceClassification"},
        {"{\"model_type\": \"llama\", \"num_hidden_layers\": 1, \"hidden_size\": 32, "
         "\"num_attention_heads\": 4, \"intermediate_size\": 64, \"vocab_size\": 50, "
         "\"architectures\": [\"LlamaForTokenClassification\"]}",
         "plans LlamaForCausalLM (a causal LM head over vocab_size, cross-entropy) and "
         "LlamaForSequenceClassification"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (ml_model_load_hf_string(bad[i].json, strlen(bad[i].json), "config.json", &m, &e) !=
                ML_SCHEMA ||
            !strstr(e.msg, bad[i].msg))
            fail_msg("case %zu: got '%s'", i, e.msg);
        assert_null(m);
    }
    /* the model file: a decoder takes classes (the head), not a pooler */
    static const char pooler[] = "model:\n  type: decoder\n  layers: 1\n  hidden: 32\n"
                                 "  heads: 4\n  vocab: 50\n  max_positions: 16\n  classes: 3\n"
                                 "  pooler: true\n";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(pooler, strlen(pooler), "t.yaml", &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "a decoder takes classes: N for a sequence-classification"));
    assert_int_equal(e.line, 9);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_seq_cls),
        cmocka_unit_test(test_no_pad),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_tied_and_fit),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
