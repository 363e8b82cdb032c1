/* Hugging Face config.json import: the shipped configs' parameter counts
 * against the published counts, recomputed here from the architecture. */
#include <stdlib.h>

#include "harness.h"

static uint64_t hf_params(const char *dir, ml_model **keep)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/%s/config.json", ML_MODELS_DIR, dir);
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf(path, NULL, &m, &e) != ML_OK)
        fail_msg("%s: %s:%u:%u: %s", dir, e.path, e.line, e.col, e.msg);
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    uint64_t p = ml_ledger_summary(l)->params;
    ml_ledger_destroy(l);
    if (keep)
        *keep = m;
    else
        ml_model_destroy(m);
    return p;
}

/* Llama-family: untied (or tied) V*D embeddings; per layer q, o D^2; k, v
 * D*kv; SwiGLU 3*D*F; two RMSNorm D; Qwen2 adds q/k/v biases D + 2 kv. */
static uint64_t llama(uint64_t L, uint64_t D, uint64_t kv, uint64_t F, uint64_t V, bool tied,
                      bool qkv_bias)
{
    return (tied ? 1 : 2) * V * D +
           L * (2 * D * D + 2 * D * kv + 3 * D * F + 2 * D + (qkv_bias ? D + 2 * kv : 0)) + D;
}

static void test_published_counts(void **state)
{
    (void)state;
    /* gpt2: 124,439,808 (Hugging Face gpt2) */
    assert_int_equal(hf_params("gpt2", NULL), 124439808);
    /* meta-llama/Llama-2-7b-hf: 6,738,415,616 */
    assert_int_equal(llama(32, 4096, 4096, 11008, 32000, false, false), 6738415616ull);
    assert_int_equal(hf_params("llama-2-7b", NULL), 6738415616ull);
    /* mistralai/Mistral-7B-v0.1: 7,241,732,096 (8 kv heads of 128) */
    assert_int_equal(llama(32, 4096, 1024, 14336, 32000, false, false), 7241732096ull);
    assert_int_equal(hf_params("mistral-7b", NULL), 7241732096ull);
    /* Qwen/Qwen2-0.5B: 494,032,768 (tied, q/k/v biases, 2 kv heads of 64) */
    assert_int_equal(llama(24, 896, 128, 4864, 151936, true, true), 494032768ull);
    assert_int_equal(hf_params("qwen2-0.5b", NULL), 494032768ull);
    /* EleutherAI/pythia-160m: 162,322,944. Untied 2*V*D; per layer two
     * LayerNorms 4D, fused qkv 3D^2 + 3D, dense D^2 + D, MLP 2DF + F + D;
     * final LayerNorm 2D. */
    uint64_t D = 768, F = 3072, V = 50304;
    uint64_t neox = 2 * V * D + 12 * (4 * D + 3 * D * D + 3 * D + D * D + D + 2 * D * F + F + D) +
                    2 * D;
    assert_int_equal(neox, 162322944);
    assert_int_equal(hf_params("pythia-160m", NULL), 162322944);
    /* bert-base-uncased: BertModel 109,482,240 plus the classification head
     * for PretrainedConfig's default 2 labels: 768*2 + 2 */
    assert_int_equal(hf_params("bert-base-uncased", NULL), 109482240 + 768 * 2 + 2);
    /* google/vit-base-patch16-224: 86,567,656 (1000 labels) */
    assert_int_equal(hf_params("vit-base-patch16-224", NULL), 86567656);
}

static void test_mapping(void **state)
{
    (void)state;
    ml_model *m = NULL;
    hf_params("vit-base-patch16-224", &m);
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.seq_len, 197); /* (224/16)^2 + 1 */
    ml_model_destroy(m);
    hf_params("mistral-7b", &m);
    assert_string_equal(ml_model_name(m), "mistral-7b"); /* the config's directory */
    ml_model_destroy(m);
    hf_params("llama-2-7b", &m);
    assert_string_equal(ml_model_name(m), "Llama-2-7b-hf"); /* _name_or_path */
    ml_model_destroy(m);
}

static ml_status load_json(const char *json, const char *training, ml_model **m, ml_error *e)
{
    char path[] = "/tmp/ml-hf-XXXXXX";
    int fd = mkstemp(path);
    FILE *f = fdopen(fd, "w");
    fputs(json, f);
    fclose(f);
    char tpath[] = "/tmp/ml-tr-XXXXXX";
    if (training) {
        int tfd = mkstemp(tpath);
        FILE *tf = fdopen(tfd, "w");
        fputs(training, tf);
        fclose(tf);
    }
    ml_status st = ml_model_load_hf(path, training ? tpath : NULL, m, e);
    remove(path);
    if (training)
        remove(tpath);
    return st;
}

static void test_errors_and_training(void **state)
{
    (void)state;
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_json("{\"model_type\": \"t5\", \"d_model\": 512}", NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "model_type 't5' is not supported; supported: llama, mistral, "
                                  "qwen2, gpt2, gpt_neox, bert, vit"));
    assert_int_equal(e.line, 1);
    assert_int_equal(load_json("{\"n_embd\": 64}", NULL, &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "model_type: missing"));
    assert_int_equal(load_json("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                               "\"n_head\": 7, \"vocab_size\": 10, \"n_positions\": 8}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "does not divide"));
    assert_int_equal(load_json("[1, 2]", NULL, &m, &e), ML_SCHEMA);
    assert_int_equal(load_json("{\"model_type\": \"gpt2\",", NULL, &m, &e), ML_SYNTAX);
    /* training settings from a YAML file */
    const char *gpt = "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, "
                      "\"vocab_size\": 100, \"n_positions\": 64}";
    assert_int_equal(load_json(gpt, "training:\n  micro_batch: 3\n  precision: bf16\n"
                                    "device:\n  memory: 8GiB\n",
                               &m, &e),
                     ML_OK);
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.micro_batch, 3);
    assert_int_equal(c.training.precision, ML_PREC_BF16);
    assert_true(c.device.present);
    ml_model_destroy(m);
    m = NULL;
    assert_int_equal(load_json(gpt, "training:\n  micro_bach: 3\n", &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "did you mean 'micro_batch'?"));
    assert_null(m);
}

/* attn_implementation (PretrainedConfig's key): sdpa and the flash kernels
 * are the ledger's flash inventory, eager (or no key) the eager one; the same
 * model written as YAML with `attention:` is the reference. */
/* the saved activations of a model at its own settings; destroys it */
static uint64_t saved_and_destroy(ml_model *m)
{
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    uint64_t saved = ml_ledger_summary(l)->bytes_activations;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return saved;
}

static uint64_t saved_of_json(const char *attn, const char *precision)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": "
             "176, \"vocab_size\": 100, \"max_position_embeddings\": 32%s%s%s}",
             attn ? ", \"attn_implementation\": \"" : "", attn ? attn : "", attn ? "\"" : "");
    ml_model *m = NULL;
    ml_error e;
    char training[128];
    snprintf(training, sizeof training, "training:\n  micro_batch: 2\n  seq_len: 32\n"
             "  precision: %s\n", precision);
    if (load_json(json, training, &m, &e) != ML_OK)
        fail_msg("%s: %s", attn ? attn : "(none)", e.msg);
    return saved_and_destroy(m);
}

static uint64_t saved_of_yaml(const char *attn, const char *precision)
{
    char yaml[512];
    snprintf(yaml, sizeof yaml,
             "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
             "  ffn: 176\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 100\n"
             "  position: rope\n  bias: false\n  tied_embeddings: false\n  dropout: 0\n"
             "  attention: %s\ntraining:\n  micro_batch: 2\n  seq_len: 32\n"
             "  precision: %s\n",
             attn, precision);
    return saved_and_destroy(load_str(yaml));
}

static void test_attn_implementation(void **state)
{
    (void)state;
    for (int p = 0; p < 2; p++) {
        const char *prec = p ? "amp-bf16" : "fp32";
        uint64_t eager = saved_of_yaml("eager", prec), flash = saved_of_yaml("flash", prec);
        /* the two inventories differ (the eager path keeps the softmax
         * output, B*H*T^2*4 = 32768 B a block in fp32, which a flash kernel
         * never materialises), so each equality below tells which one was
         * taken */
        assert_true(eager > flash);
        assert_int_equal(saved_of_json(NULL, prec), eager);
        assert_int_equal(saved_of_json("eager", prec), eager);
        assert_int_equal(saved_of_json("flash_attention_2", prec), flash);
        /* sdpa with 4 query heads on 2 key/value heads: in fp32 no fused
         * kernel takes grouped heads and PyTorch runs the math kernel (the
         * eager inventory); under autocast the inputs are bf16 and the flash
         * kernel runs */
        assert_int_equal(saved_of_yaml("sdpa", prec), p ? flash : eager);
        assert_int_equal(saved_of_json("sdpa", prec), p ? flash : eager);
    }
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_json("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                               "\"n_head\": 4, \"vocab_size\": 10, \"n_positions\": 8,\n"
                               " \"attn_implementation\": \"flex_attention\"}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "attn_implementation: 'flex_attention' is not modelled"));
    assert_int_equal(e.line, 2);
    assert_int_equal(e.col, 25);
    assert_null(m);
}

static uint64_t eval_peak_of(const char *use_cache)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": "
             "176, \"vocab_size\": 5000, \"max_position_embeddings\": 32%s%s}",
             use_cache ? ", \"use_cache\": " : "", use_cache ? use_cache : "");
    ml_model *m = NULL;
    ml_error e;
    if (load_json(json, "training:\n  micro_batch: 2\n  seq_len: 32\n  eval_batch: 2\n", &m,
                  &e) != ML_OK)
        fail_msg("%s", e.msg);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_true(ml_ledger_summary(l)->has_eval);
    uint64_t peak = ml_ledger_summary(l)->peak_eval;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return peak;
}

/* use_cache (true unless the config says false): the evaluation output
 * holds every layer's keys and values. Here 2 layers x (K and V) x B*T = 64
 * tokens x 2 key/value heads x 16 = 32 values x 4 B = 32,768 B more at the
 * evaluation peak, which is at the loss (the 64 x 5000 logits and their
 * log-softmax, 2.56 MB, dwarf every block). */
static void test_use_cache(void **state)
{
    (void)state;
    uint64_t with = eval_peak_of(NULL), off = eval_peak_of("false");
    assert_int_equal(eval_peak_of("true"), with);
    assert_int_equal(with - off, 2ull * 2 * 64 * 32 * 4);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_counts),
        cmocka_unit_test(test_mapping),
        cmocka_unit_test(test_errors_and_training),
        cmocka_unit_test(test_attn_implementation),
        cmocka_unit_test(test_use_cache),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
