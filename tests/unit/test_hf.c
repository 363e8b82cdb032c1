/* Hugging Face config.json import: the shipped configs' parameter counts
 * against the published counts, recomputed here from the architecture. */
#include <dirent.h>
#include <stdlib.h>

#include "harness.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* The parameters m's plan counts (at 64 tokens: no count depends on them). */
static uint64_t planned_params(const ml_model *m)
{
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    uint64_t p = ml_ledger_summary(l)->params;
    ml_ledger_destroy(l);
    return p;
}

static uint64_t hf_params(const char *dir, ml_model **keep)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/%s/config.json", ML_MODELS_DIR, dir);
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf(path, NULL, &m, &e) != ML_OK)
        fail_msg("%s: %s:%u:%u: %s", dir, e.path, e.line, e.col, e.msg);
    const uint64_t p = planned_params(m);
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

/* The same with a head size of its own: q D x Dq and o_proj Dq x D, k and
 * v D x Dkv (Dq = heads * head_dim, Dkv = kv_heads * head_dim). */
static uint64_t llama_hd(uint64_t L, uint64_t D, uint64_t Dq, uint64_t Dkv, uint64_t F, uint64_t V,
                         bool tied, bool qkv_bias)
{
    return (tied ? 1 : 2) * V * D +
           L * (2 * D * Dq + 2 * D * Dkv + 3 * D * F + 2 * D + (qkv_bias ? Dq + 2 * Dkv : 0)) +
           D;
}

/* A shipped config's text, with one string replaced (the first occurrence). */
static char *shipped_text(const char *dir, const char *from, const char *to)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/%s/config.json", ML_MODELS_DIR, dir);
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    static char text[1 << 16], out[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *at = from ? strstr(text, from) : NULL;
    if (!at)
        return text;
    snprintf(out, sizeof out, "%.*s%s%s", (int)(at - text), text, to, at + strlen(from));
    return out;
}

/* The parameters planned from a config's text (or fails the test). */
static uint64_t params_of_text(const char *text)
{
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf_string(text, strlen(text), "config.json", &m, &e) != ML_OK)
        fail_msg("%u:%u: %s", e.line, e.col, e.msg);
    const uint64_t p = planned_params(m);
    ml_model_destroy(m);
    return p;
}

static uint64_t bert_as_classifier_params(void)
{
    return params_of_text(shipped_text("bert-base-uncased", "BertForMaskedLM",
                                       "BertForSequenceClassification"));
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
    /* allenai/OLMo-1B-hf: 1,176,764,416 (1.18B): tied V*D, per layer 4 D^2 +
     * 3 D F and OlmoLayerNorm's no parameters; its name from _name_or_path */
    _Static_assert(50304ull * 2048 + 16 * (4ull * 2048 * 2048 + 3ull * 2048 * 8192) ==
                       1176764416ull,
                   "the hand count is the published one");
    assert_int_equal(hf_params("olmo-1b", NULL), 1176764416ull);
    /* HuggingFaceTB/SmolLM2-135M: 134,515,008, its config.json as published
     * (nanotron's is_llama_config and rope_interleaved, inert): tied, 3 kv
     * heads of 64, the final norm D */
    assert_int_equal(llama(30, 576, 192, 1536, 49152, true, false), 134515008ull);
    assert_int_equal(hf_params("smollm2-135m", NULL), 134515008ull);
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
     * for PretrainedConfig's default 2 labels: 768*2 + 2, with the shipped
     * config's architectures set to the classifier (as BertForMaskedLM, its
     * own class, tests/unit/test_hf_bert_mlm.c checks 109,514,298) */
    assert_int_equal(bert_as_classifier_params(), 109482240 + 768 * 2 + 2);
    /* google/vit-base-patch16-224: 86,567,656 (1000 labels) */
    assert_int_equal(hf_params("vit-base-patch16-224", NULL), 86567656);
    /* mistralai/Mistral-Nemo-Base-2407: 12,247,782,400. head_dim 128, not
     * 5120 / 32 = 160: untied 2 x 131072 x 5120 = 1,342,177,280; per layer
     * q 5120 x 4096 = 20,971,520, k and v 5120 x 1024 = 5,242,880 each,
     * o_proj 4096 x 5120 = 20,971,520, SwiGLU 3 x 5120 x 14336 =
     * 220,200,960, two RMSNorms 10,240: 272,640,000 x 40 layers =
     * 10,905,600,000; final norm 5120. (With 160-wide heads it would be
     * 12,772,070,400, 4.3 % more.) */
    assert_int_equal(2ull * 131072 * 5120, 1342177280ull);
    assert_int_equal(20971520ull * 2 + 5242880ull * 2 + 220200960ull + 10240, 272640000ull);
    assert_int_equal(llama_hd(40, 5120, 4096, 1024, 14336, 131072, false, false),
                     1342177280ull + 40 * 272640000ull + 5120);
    assert_int_equal(llama_hd(40, 5120, 4096, 1024, 14336, 131072, false, false),
                     12247782400ull);
    assert_int_equal(hf_params("mistral-nemo-12b", NULL), 12247782400ull);
}

/* A shipped config's text with one key's line taken out (the configs under
 * models/hf have one key a line, each but the last followed by a comma), or
 * with its value null. */
static const char *shipped_without(const char *dir, const char *key, bool null)
{
    const char *text = shipped_text(dir, NULL, NULL);
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\":", key);
    const char *at = strstr(text, quoted), *start = at, *end = at ? strchr(at, '\n') : NULL;
    if (!at || !end || end[-1] != ',')
        fail_msg("%s: no line \"%s\": ...,", dir, key);
    while (start > text && start[-1] != '\n')
        start--;
    static char out[1 << 16];
    if (null)
        snprintf(out, sizeof out, "%.*s%s null,%s", (int)(at - text), text, quoted, end);
    else
        snprintf(out, sizeof out, "%.*s%s", (int)(start - text), text, end + 1);
    return out;
}

/* A size key a config.json leaves out is the configuration class's default,
 * as an unconfigured run has it (docs/hf.md). Each shipped config without
 * one key: where the default is the shipped value the published count
 * stays. */
static void test_absent_sizes(void **state)
{
    (void)state;
    static const struct {
        const char *dir, *key;
        uint64_t params;
    } same[] = {
        /* LlamaConfig's intermediate_size 11008 */
        {"llama-2-7b", "intermediate_size", 6738415616ull},
        /* MistralConfig's num_key_value_heads 8 */
        {"mistral-7b", "num_key_value_heads", 7241732096ull},
        /* MixtralConfig's 14336 and 8 (test_hf_mixtral.c's count) */
        {"mixtral-8x7b", "intermediate_size", 46702792704ull},
        {"mixtral-8x7b", "num_key_value_heads", 46702792704ull},
        /* Gemma2Config's head_dim 256 and num_key_value_heads 4
         * (test_hf_gemma2.c's count), GemmaConfig's head_dim 256
         * (test_hf_gemma.c's) */
        {"gemma-2-2b", "head_dim", 2614341888ull},
        {"gemma-2-2b", "num_key_value_heads", 2614341888ull},
        {"gemma-2b", "head_dim", 2506172416ull},
        /* Phi3Config's 8192 (test_hf_phi3.c's count) */
        {"phi-3-mini-4k", "intermediate_size", 3821079552ull},
        /* Qwen2MoeConfig's num_key_value_heads 16; its intermediate_size is
         * inert (every layer sparse) */
        {"qwen1.5-moe-a2.7b", "num_key_value_heads", 0},
        {"qwen1.5-moe-a2.7b", "intermediate_size", 0},
        /* DeepseekV3Config's 18432 and 128; DeepseekV2Config's None: the
         * 16 heads (test_hf_deepseek.c's counts) */
        {"deepseek-v3", "intermediate_size", 671026404352ull},
        {"deepseek-v3", "num_key_value_heads", 671026404352ull},
        {"deepseek-v2-lite", "num_key_value_heads", 15706484224ull},
        /* BertConfig's and ViTConfig's 3072 (BertForMaskedLM's count:
         * test_hf_bert_mlm.c) */
        {"bert-base-uncased", "intermediate_size", 109514298ull},
        {"vit-base-patch16-224", "intermediate_size", 86567656ull},
    };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        uint64_t want = same[i].params ? same[i].params : hf_params(same[i].dir, NULL);
        uint64_t got = params_of_text(shipped_without(same[i].dir, same[i].key, false));
        if (got != want)
            fail_msg("%s without %s: %llu parameters, expected %llu", same[i].dir, same[i].key,
                     (unsigned long long)got, (unsigned long long)want);
    }
}

/* Where the class's default is not the shipped value, the count moves by
 * the hand-derived difference; null is the classes' rule for None. */
static void test_absent_sizes_moved(void **state)
{
    (void)state;
    /* Qwen/Qwen2-0.5B without intermediate_size: Qwen2Config's 22016 for its
     * 4864, each of 24 layers' gate, up and down 896 x 17152 wider:
     * 24 x 3 x 896 x 17152 = 1,106,509,824 more than 494,032,768 */
    assert_int_equal(24ull * 3 * 896 * (22016 - 4864), 1106509824ull);
    assert_int_equal(llama(24, 896, 128, 22016, 151936, true, true), 1600542592ull);
    assert_int_equal(params_of_text(shipped_without("qwen2-0.5b", "intermediate_size", false)),
                     494032768ull + 1106509824ull);
    /* allenai/OLMo-1B-hf without it: OlmoConfig's 11008 for 8192, 16 layers
     * x 3 x 2048 x 2816 = 276,824,064 more than 1,176,764,416 */
    assert_int_equal(params_of_text(shipped_without("olmo-1b", "intermediate_size", false)),
                     1176764416ull + 16ull * 3 * 2048 * 2816);
    assert_int_equal(1176764416ull + 16ull * 3 * 2048 * 2816, 1453588480ull);
    /* pythia-160m without it: GPTNeoXConfig's 24576 for 3072; each of 12
     * layers' dense_h_to_4h (D x F + F) and dense_4h_to_h (F x D) grows by
     * (2 x 768 + 1) x 21504 = 33,051,648: 396,619,776 more than 162,322,944 */
    assert_int_equal(params_of_text(shipped_without("pythia-160m", "intermediate_size", false)),
                     558942720ull);
    assert_int_equal(162322944ull + 12 * 1537ull * 21504, 558942720ull);
    /* DeepSeek-V2-Lite without it: DeepseekV2Config's 11008 for 10944 in
     * its one dense layer (first_k_dense_replace 1): 3 x 2048 x 64 =
     * 393,216 more than 15,706,484,224 */
    assert_int_equal(params_of_text(shipped_without("deepseek-v2-lite", "intermediate_size",
                                                    false)),
                     15706484224ull + 3 * 2048 * 64);
    /* Mistral-NeMo without head_dim: MistralConfig's None, 5120 / 32 = 160
     * (the count test_published_counts derives: 12,772,070,400) */
    assert_int_equal(llama(40, 5120, 1280, 14336, 131072, false, false), 12772070400ull);
    assert_int_equal(params_of_text(shipped_without("mistral-nemo-12b", "head_dim", false)),
                     12772070400ull);
    /* null is the rule for None, not the default: Mistral-7B with
     * num_key_value_heads null has its 32 heads (MistralConfig: "for
     * backward compatibility"), 32 x 2 x 4096 x 3072 = 805,306,368 more */
    assert_int_equal(params_of_text(shipped_without("mistral-7b", "num_key_value_heads", true)),
                     7241732096ull + 32ull * 2 * 4096 * 3072);
    assert_int_equal(llama(32, 4096, 4096, 14336, 32000, false, false), 8047038464ull);
}

/* A default the heads refuse: said as the class's, at the object (the key
 * has no position), with the key to give. */
static void test_absent_default_refused(void **state)
{
    (void)state;
    static const struct {
        const char *dir, *msg;
    } refused[] = {
        {"qwen2-0.5b", "num_key_value_heads: 32 is Qwen2Config's default, taken because the key "
                       "is absent, and does not divide num_attention_heads (14); give "
                       "num_key_value_heads (the model's key/value heads, a divisor of 14)"},
        {"gemma-2b", "num_key_value_heads: 16 is GemmaConfig's default, taken because the key "
                     "is absent, and does not divide num_attention_heads (8); give "
                     "num_key_value_heads"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        const char *t = shipped_without(refused[i].dir, "num_key_value_heads", false);
        ml_model *m = NULL;
        ml_error e;
        assert_int_equal(ml_model_load_hf_string(t, strlen(t), "config.json", &m, &e), ML_SCHEMA);
        if (!strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].dir, e.msg);
        assert_int_equal(e.line, 1);
        assert_int_equal(e.col, 1);
        assert_null(m);
    }
    /* GemmaConfig's head_dim 256 with 8192 heads: 2,097,152 wide */
    static const char wide[] = "{\"model_type\": \"gemma\", \"num_hidden_layers\": 1,\n"
                               " \"hidden_size\": 8192, \"num_attention_heads\": 8192,\n"
                               " \"num_key_value_heads\": 1, \"vocab_size\": 10}";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_hf_string(wide, strlen(wide), "config.json", &m, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "head_dim: 256 is GemmaConfig's default, taken because the key "
                                  "is absent, and num_attention_heads x head_dim = 2097152 is "
                                  "above 1048576; give head_dim"));
    assert_int_equal(e.line, 1);
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

/* The families transformers trains that the planner refuses: each by
 * name, with the layer feature its kit lacks, at model_type's position,
 * whatever else the config says. */
static void test_refused_families(void **state)
{
    (void)state;
    static const struct {
        const char *type, *why;
    } cases[] = {{"olmo2", "q_norm and k_norm"},
                 {"phi", "partial_rotary_factor"},
                 {"starcoder2", "nn.LayerNorm"},
                 {"gpt_bigcode", "multi-query"},
                 {"stablelm", "partial_rotary_factor"},
                 {"granite", "residual_multiplier"},
                 {"cohere", "CohereLayerNorm"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        char json[160], want[80];
        snprintf(json, sizeof json,
                 "{\"num_hidden_layers\": 2,\n \"model_type\": \"%s\", \"hidden_size\": 64}",
                 cases[i].type);
        snprintf(want, sizeof want, "model_type '%s' is not modelled: ", cases[i].type);
        ml_model *m = NULL;
        ml_error e;
        assert_int_equal(load_json(json, NULL, &m, &e), ML_SCHEMA);
        assert_null(m);
        assert_non_null(strstr(e.msg, want));
        assert_non_null(strstr(e.msg, cases[i].why));
        assert_int_equal(e.line, 2);
        assert_int_equal(e.col, 16);
    }
}

static void test_errors_and_training(void **state)
{
    (void)state;
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_json("{\"model_type\": \"bart\", \"d_model\": 512}", NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "model_type 'bart' is not supported; supported: llama, "
                                  "mistral, mixtral, qwen2, qwen2_moe, deepseek_v2, deepseek_v3, "
                                  "gemma, gemma2, phi3, gpt2, gpt_neox, falcon, bert, vit, t5, mt5"));
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
        /* no attn_implementation: sdpa, as transformers runs it (below) */
        assert_int_equal(saved_of_json(NULL, prec), p ? flash : eager);
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
    /* what was assumed is said, and only when the config names none; the
     * command line's choice replaces the assumption */
    static const char gpt2[] = "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                               "\"n_head\": 4, \"vocab_size\": 10, \"n_positions\": 8%s}";
    char json[256];
    snprintf(json, sizeof json, gpt2, "");
    assert_int_equal(load_json(json, NULL, &m, &e), ML_OK);
    assert_string_equal(ml_model_attention(m), "sdpa");
    assert_non_null(strstr(ml_model_attention_assumed(m), "names no attn_implementation"));
    assert_int_equal(ml_model_set_attention(m, "eager", &e), ML_OK);
    assert_string_equal(ml_model_attention(m), "eager");
    assert_null(ml_model_attention_assumed(m));
    ml_model_destroy(m);
    snprintf(json, sizeof json, gpt2, ", \"attn_implementation\": null");
    assert_int_equal(load_json(json, NULL, &m, &e), ML_OK);
    assert_string_equal(ml_model_attention(m), "sdpa");
    ml_model_destroy(m);
    snprintf(json, sizeof json, gpt2, ", \"attn_implementation\": \"eager\"");
    assert_int_equal(load_json(json, NULL, &m, &e), ML_OK);
    assert_string_equal(ml_model_attention(m), "eager");
    assert_null(ml_model_attention_assumed(m));
    ml_model_destroy(m);
    m = NULL;
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

/* A class the planner does not build is refused at its name rather than
 * planned as another head: BERT's two (BertForSequenceClassification,
 * BertForMaskedLM: tests/unit/test_hf_bert_mlm.c) are named, and a list
 * naming both is refused too. */
static void test_other_heads_refused(void **state)
{
    (void)state;
    ml_model *m = NULL;
    ml_error e;
    static const char bert[] = "{\"model_type\": \"bert\", \"num_hidden_layers\": 2, "
                               "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"vocab_size\": 100, \"max_position_embeddings\": 32,\n "
                               "\"architectures\": [%s]}";
    char json[512];
    snprintf(json, sizeof json, bert, "\"BertForPreTraining\"");
    assert_int_equal(load_json(json, NULL, &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "architectures: 'BertForPreTraining' is not modelled: for "
                                  "model_type 'bert' memledger plans "
                                  "BertForSequenceClassification (the pooler, "));
    assert_non_null(strstr(e.msg, ") and BertForMaskedLM (no pooler; the MLM head"));
    assert_int_equal(e.line, 2);
    assert_int_equal(e.col, 20);
    assert_null(m);
    snprintf(json, sizeof json, bert,
             "\"BertForMaskedLM\", \"BertForSequenceClassification\"");
    assert_int_equal(load_json(json, NULL, &m, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "architectures: names both BertForSequenceClassification and "
                                  "BertForMaskedLM; plan one of them"));
    assert_int_equal(e.col, 39);
    /* a decoder's token-classification head is another model too */
    assert_int_equal(load_json("{\"model_type\": \"llama\", \"num_hidden_layers\": 2, "
                               "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"vocab_size\": 100,\n \"architectures\": "
                               "[\"LlamaForTokenClassification\"]}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "'LlamaForTokenClassification' is not modelled: for "
                                  "model_type 'llama' memledger plans LlamaForCausalLM"));
    assert_int_equal(e.line, 2);
    assert_int_equal(e.col, 20);
    assert_int_equal(load_json("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                               "\"n_head\": 4, \"vocab_size\": 10, \"n_positions\": 8, "
                               "\"architectures\": \"GPT2LMHeadModel\"}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "architectures: expected a list of class names"));
    assert_int_equal(load_json("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                               "\"n_head\": 4, \"vocab_size\": 10, \"n_positions\": 8, "
                               "\"architectures\": [\"GPT2LMHeadModel\"]}",
                               NULL, &m, &e),
                     ML_OK);
    ml_model_destroy(m);
}

/* Python's json keeps the last of repeated keys, a first-match reader the
 * first: a config that says two things is refused at the second. */
static void test_duplicate_keys(void **state)
{
    (void)state;
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_json("{\"model_type\": \"llama\", \"num_hidden_layers\": 2,\n"
                               " \"hidden_size\": 64, \"num_attention_heads\": 4,\n"
                               " \"vocab_size\": 100, \"hidden_size\": 128}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "hidden_size: key given twice (first at line 2, column 2)"));
    assert_non_null(strstr(e.msg, "would keep this last value"));
    assert_int_equal(e.line, 3);
    assert_int_equal(e.col, 21);
    assert_null(m);
    /* in a nested object too */
    assert_int_equal(load_json("{\"model_type\": \"llama\", \"num_hidden_layers\": 2, "
                               "\"hidden_size\": 64, \"num_attention_heads\": 4, "
                               "\"vocab_size\": 100,\n \"rope_scaling\": {\"type\": \"linear\", "
                               "\"factor\": 2.0, \"factor\": 4.0}}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "rope_scaling.factor: key given twice (first at line 2, "
                                  "column 37)"));
    assert_int_equal(e.line, 2);
    assert_int_equal(e.col, 52);
}

/* head_dim (Mistral-NeMo's 128 against 5120 / 32): the JSON planned as the
 * YAML model with model.head_dim, whose block test_inventory.c derives by
 * hand (23,616 B saved, 12,352 parameters, 212,992 forward FLOPs). */
static void test_head_dim(void **state)
{
    (void)state;
    const char *json = "{\"model_type\": \"mistral\", \"num_hidden_layers\": 2, \"hidden_size\": "
                       "32, \"num_attention_heads\": 4, \"num_key_value_heads\": 2, "
                       "\"head_dim\": 16, \"intermediate_size\": 64, \"vocab_size\": 50}";
    ml_model *m = NULL;
    ml_error e;
    if (load_json(json, "training:\n  micro_batch: 1\n  seq_len: 8\n", &m, &e) != ML_OK)
        fail_msg("%s", e.msg);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->inventory_bytes, 23616);
    assert_int_equal(block_named(l, "block.0")->params, 12352);
    assert_rel_close(block_named(l, "block.0")->flops_forward, 212992, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    /* with head_dim, heads need not divide hidden_size (5120 / 32 does, 40 / 3
     * does not): q is 3 x 16 = 48 wide */
    assert_int_equal(load_json("{\"model_type\": \"llama\", \"num_hidden_layers\": 1, "
                               "\"hidden_size\": 40, \"num_attention_heads\": 3, \"head_dim\": "
                               "16, \"vocab_size\": 10}",
                               NULL, &m, &e),
                     ML_OK);
    ml_model_destroy(m);
    /* the families whose head size is hidden / heads */
    assert_int_equal(load_json("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                               "\"n_head\": 4, \"vocab_size\": 10, \"n_positions\": 8,\n "
                               "\"head_dim\": 32}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "head_dim: 32 is not modelled for gpt2, whose head size is "
                                  "hidden_size / num_attention_heads (64 / 4)"));
    assert_int_equal(e.line, 2);
    assert_int_equal(load_json("{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, "
                               "\"n_head\": 4, \"vocab_size\": 10, \"n_positions\": 8, "
                               "\"head_dim\": 16}",
                               NULL, &m, &e),
                     ML_OK);
    ml_model_destroy(m);
    /* rotary embeddings rotate pairs */
    assert_int_equal(load_json("{\"model_type\": \"qwen2\", \"num_hidden_layers\": 1, "
                               "\"hidden_size\": 64, \"num_attention_heads\": 4, \"head_dim\": 9, "
                               "\"num_key_value_heads\": 4, \"vocab_size\": 10}",
                               NULL, &m, &e),
                     ML_SCHEMA);
    assert_non_null(strstr(e.msg, "rotary embeddings need an even head size (9)"));
}

/* A config of 2 layers, D = 64, 4 heads, with extra keys; its status and
 * message. */
static ml_status load_extra(const char *type, const char *extra, ml_error *e)
{
    char json[1024];
    if (!strcmp(type, "gpt2"))
        snprintf(json, sizeof json,
                 "{\"model_type\": \"gpt2\", \"n_layer\": 2, \"n_embd\": 64, \"n_head\": 4, "
                 "\"vocab_size\": 100, \"n_positions\": 64,\n %s}",
                 extra);
    else
        snprintf(json, sizeof json,
                 "{\"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
                 "\"num_attention_heads\": 4, \"vocab_size\": 100, \"max_position_embeddings\": "
                 "64,\n %s}",
                 type, extra);
    ml_model *m = NULL;
    ml_status st = load_json(json, NULL, &m, e);
    ml_model_destroy(m);
    return st;
}

/* Keys that change parameters, saved tensors or FLOPs without being
 * modelled are refused at their value, naming why (docs/hf.md). */
static void test_refused_keys(void **state)
{
    (void)state;
    static const struct {
        const char *type, *extra, *want;
    } cases[] = {
        {"llama", "\"num_local_experts\": 8",
         "num_local_experts: 8 is refused (accepted: 0 or 1 or null): mixture-of-experts"},
        {"mistral", "\"num_experts_per_tok\": 2", "num_experts_per_tok: 2 is refused"},
        {"llama", "\"partial_rotary_factor\": 0.5",
         "partial_rotary_factor: 0.5 is refused (accepted: 1 or null): these attentions rotate "
         "the whole head"},
        {"llama", "\"output_attentions\": true", "output_attentions: true is refused"},
        {"llama", "\"quantization_config\": {\"bits\": 4}",
         "quantization_config: a mapping is refused (accepted: null)"},
        {"llama", "\"attn_logit_softcapping\": 50.0", "attn_logit_softcapping: 50.0 is refused"},
        {"llama", "\"final_logit_softcapping\": 30.0", "soft-capped logits are Gemma 2's"},
        {"llama", "\"query_pre_attn_scalar\": 256", "Gemma 2's score scale"},
        {"llama", "\"hidden_activation\": \"gelu_pytorch_tanh\"", "Gemma's activation key"},
        {"llama", "\"attention_dropout\": 0.1", "attention dropout alone is not modelled"},
        {"llama", "\"pretraining_tp\": 2", "pretraining_tp: 2 is refused"},
        {"llama", "\"sliding_window\": 4096",
         "sliding_window: not a key memledger knows for model_type 'llama'"},
        {"llama", "\"rope_thetta\": 10000", "did you mean 'rope_theta'?"},
        /* every unknown key in one message, each at its position */
        {"llama", "\"rope_thetta\": 10000, \"max_positon_embeddings\": 64",
         "; also unknown: max_positon_embeddings ("},
        {"llama", "\"rope_thetta\": 10000, \"max_positon_embeddings\": 64",
         "did you mean 'max_position_embeddings'?)"},
        {"mistral", "\"attention_bias\": true",
         "MistralAttention and MixtralAttention have no biases"},
        {"qwen2", "\"attention_bias\": false", "Qwen2Attention always has q, k and v biases"},
        {"gpt_neox", "\"attention_bias\": false", "attention_bias: false is refused"},
        {"gpt_neox", "\"hidden_dropout\": 0.1",
         "attention_dropout: 0 while hidden_dropout is 0.1: the planner has one dropout switch"},
        {"gpt2", "\"attn_pdrop\": 0.0", "attn_pdrop: 0 while resid_pdrop is 0.1"},
        {"gpt2", "\"reorder_and_upcast_attn\": true", "reorder_and_upcast_attn: true is refused"},
        {"gpt2", "\"activation_function\": \"gelu_fast\"",
         "activation_function: 'gelu_fast' is not modelled for gpt2"},
        {"gpt2", "\"hidden_size\": 64", "hidden_size: names the same value as n_embd"},
        {"gpt2", "\"intermediate_size\": 256",
         "intermediate_size: not a key memledger knows for model_type 'gpt2'"},
        {"bert", "\"position_embedding_type\": \"relative_key\"",
         "position_embedding_type: relative_key is refused"},
        {"bert", "\"num_labels\": 1", "regression (MSELoss)"},
        {"bert", "\"num_labels\": 3, \"id2label\": {\"0\": \"a\", \"1\": \"b\"}",
         "num_labels: 3 but id2label names 2 labels"},
        {"bert", "\"problem_type\": \"multi_label_classification\"", "problem_type"},
        {"bert", "\"is_decoder\": true", "BERT as a decoder"},
        {"bert", "\"gradient_checkpointing\": true", "give training.checkpoint instead"},
        {"bert", "\"use_cache\": 1", NULL}, /* inert for encoders: any value */
        {"llama", "\"use_cache\": 1", "use_cache: expected true or false"},
        {"llama", "\"tie_word_embeddings\": \"false\"",
         "tie_word_embeddings: expected true or false"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        ml_error e;
        ml_status st = load_extra(cases[i].type, cases[i].extra, &e);
        if (!cases[i].want) {
            if (st != ML_OK)
                fail_msg("%s {%s}: %s", cases[i].type, cases[i].extra, e.msg);
            continue;
        }
        if (st != ML_SCHEMA || !strstr(e.msg, cases[i].want))
            fail_msg("%s {%s}: got %s '%s', expected '%s'", cases[i].type, cases[i].extra,
                     ml_status_name(st), st ? e.msg : "", cases[i].want);
        if (e.line != 2) /* at the key or its value, on the extra line */
            fail_msg("%s {%s}: line %u", cases[i].type, cases[i].extra, e.line);
    }
    /* the accepted values of the same keys, and inert keys, load */
    static const char *const fine[] = {
        "\"num_local_experts\": 1, \"num_experts_per_tok\": 1, \"partial_rotary_factor\": 1.0",
        "\"output_attentions\": false, \"pruned_heads\": {}, \"quantization_config\": null",
        "\"rope_scaling\": {\"type\": \"linear\", \"factor\": 2.0}, \"rope_theta\": 500000.0",
        "\"torch_dtype\": \"bfloat16\", \"attention_dropout\": 0.0, \"pretraining_tp\": 1",
        "\"problem_type\": \"regression\", \"num_labels\": 1, \"id2label\": {\"0\": \"x\"}",
    };
    for (size_t i = 0; i < sizeof fine / sizeof *fine; i++) {
        ml_error e;
        if (load_extra("llama", fine[i], &e) != ML_OK)
            fail_msg("llama {%s}: %s", fine[i], e.msg);
    }
}

static uint64_t params_of_extra(const char *extra)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
             "\"num_attention_heads\": 4, \"intermediate_size\": 256, \"vocab_size\": 100%s%s}",
             extra ? ", " : "", extra ? extra : "");
    ml_model *m = NULL;
    ml_error e;
    if (load_json(json, "training:\n  seq_len: 16\n", &m, &e) != ML_OK)
        fail_msg("%s", e.msg);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    uint64_t p = ml_ledger_summary(l)->params;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return p;
}

/* The plan of a model with a sliding window of 16 at seq_len T: ML_OK, or
 * ML_RANGE when T is above the window. */
static ml_status window_plan(const char *type, const char *extra, uint64_t T, ml_error *e)
{
    char json[512];
    snprintf(json, sizeof json,
             "{\"model_type\": \"%s\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
             "\"num_attention_heads\": 4, \"num_key_value_heads\": 4, \"vocab_size\": 100, "
             "\"sliding_window\": 16%s%s}",
             type, extra ? ", " : "", extra ? extra : "");
    ml_model *m = NULL;
    if (load_json(json, NULL, &m, e) != ML_OK)
        fail_msg("%s", e->msg);
    ml_config c = ml_model_config(m);
    c.training.seq_len = T;
    ml_ledger *l = NULL;
    ml_status st = ml_ledger_evaluate(m, &c, false, &l, e);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return st;
}

/* Honoured keys: Llama's attention_bias (q, k, v and o_proj) and mlp_bias
 * (gate, up, down); Mistral's and Qwen2's sliding windows. */
static void test_honoured_keys(void **state)
{
    (void)state;
    /* D = 64, F = 256, 2 layers: q 64 + k 64 + v 64 + o 64 = 256 and gate
     * 256 + up 256 + down 64 = 576 per layer */
    uint64_t base = params_of_extra(NULL);
    assert_int_equal(params_of_extra("\"attention_bias\": true") - base, 2 * 256);
    assert_int_equal(params_of_extra("\"mlp_bias\": true") - base, 2 * 576);
    assert_int_equal(params_of_extra("\"attention_bias\": false, \"mlp_bias\": false"), base);
    ml_error e;
    assert_int_equal(window_plan("mistral", NULL, 16, &e), ML_OK);
    assert_int_equal(window_plan("mistral", NULL, 32, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "a sequence of 32 tokens exceeds the model's "
                                  "sliding_window (16); attention over a sliding window is not "
                                  "modelled"));
    /* Qwen2: only with use_sliding_window, on the layers from
     * max_window_layers (or layer_types' sliding_attention) */
    assert_int_equal(window_plan("qwen2", NULL, 32, &e), ML_OK);
    assert_int_equal(window_plan("qwen2", "\"use_sliding_window\": true, \"max_window_layers\": 1",
                                 32, &e),
                     ML_RANGE);
    assert_int_equal(window_plan("qwen2", "\"use_sliding_window\": true, \"max_window_layers\": 2",
                                 32, &e),
                     ML_OK);
    assert_int_equal(window_plan("qwen2",
                                 "\"use_sliding_window\": true, \"layer_types\": "
                                 "[\"full_attention\", \"sliding_attention\"]",
                                 32, &e),
                     ML_RANGE);
}

/* Reads a file whole (or fails the test). */
static char *slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    assert_non_null(buf);
    *len = fread(buf, 1, (size_t)n, f);
    buf[*len] = '\0';
    fclose(f);
    return buf;
}

/* Every key of every config shipped under models/hf/ is in its family's
 * table (honoured, inert, approximated or refused unless a value): the
 * loader's own table, so the lists cannot drift from the code. A new config
 * with a key in none of them fails here. Each loads, except the one whose
 * refusal is documented. */
static void test_shipped_config_keys(void **state)
{
    (void)state;
    char dir[1024];
    snprintf(dir, sizeof dir, "%s/hf", ML_MODELS_DIR);
    DIR *d = opendir(dir);
    assert_non_null(d);
    size_t configs = 0;
    struct dirent *de;
    while ((de = readdir(d))) {
        if (de->d_name[0] == '.')
            continue;
        char path[1400];
        snprintf(path, sizeof path, "%s/%s/config.json", dir, de->d_name);
        size_t len;
        char *text = slurp(path, &len);
        ml_node *root = NULL;
        ml_error e;
        memset(&e, 0, sizeof e);
        if (ml__tree_parse(text, len, &root, &e) != ML_OK || !root || root->type != ML_NODE_MAP)
            fail_msg("%s: not a JSON object", path);
        const ml_node *mt = ml__tree_get(root, "model_type");
        unsigned fam = mt ? ml__hf_family(mt->text) : 0;
        if (!fam)
            fail_msg("%s: model_type is not a supported family", path);
        for (size_t i = 0; i < root->count; i++)
            if (!ml__hf_key_find(fam, root->keys[i]->text))
                fail_msg("%s:%u: '%s' is in none of %s's key lists (src/model/hf.c)", path,
                         root->keys[i]->line, root->keys[i]->text, mt->text);
        ml__tree_free(root);
        free(text);
        ml_model *m = NULL;
        ml_status st = ml_model_load_hf(path, NULL, &m, &e);
        if (st != ML_OK) {
            fail_msg("%s:%u:%u: %s", path, e.line, e.col, e.msg);
        }
        ml_model_destroy(m);
        configs++;
    }
    closedir(d);
    assert_true(configs >= 8);
}

/* One row of docs/hf.md's key table, from the code's table. */
static void key_row(char *buf, size_t size, const ml_hf_key *k)
{
    char fams[160] = "", use[200];
    if (k->families == (1u << ML_HF_FAMILY_COUNT) - 1) {
        snprintf(fams, sizeof fams, "all");
    } else {
        size_t n = 0;
        for (unsigned b = 0; b < ML_HF_FAMILY_COUNT; b++)
            if (k->families & (1u << b))
                n += (size_t)snprintf(fams + n, sizeof fams - n, "%s%s", n ? ", " : "",
                                      ml__hf_family_name(1u << b));
    }
    static const char *const uses[] = {"honoured", "inert", "approximated", "refused unless "};
    size_t n = (size_t)snprintf(use, sizeof use, "%s", uses[k->use]);
    if (k->use == ML_HF_REFUSED_UNLESS && !k->ok)
        snprintf(use, sizeof use, "refused (see note)");
    for (const char *p = k->ok; k->use == ML_HF_REFUSED_UNLESS && p && *p;) {
        size_t l = strcspn(p, "|");
        n += (size_t)snprintf(use + n, sizeof use - n, "%s`%.*s`", p == k->ok ? "" : " or ",
                              (int)l, p);
        p += l + (p[l] == '|');
    }
    snprintf(buf, size, "| `%s` | %s | %s | %s |", k->key, fams, use, k->note);
}

/* docs/hf.md's key table is the code's, row for row. On a difference the
 * expected table is written to hf-keys.md in the working directory. */
static void test_docs_key_table(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/../docs/hf.md", ML_MODELS_DIR);
    size_t len;
    char *doc = slurp(path, &len);
    const char *begin = strstr(doc, "<!-- keys:begin"), *end = strstr(doc, "<!-- keys:end");
    if (!begin || !end || end < begin)
        begin = end = doc; /* no table: every row differs */
    size_t nkeys;
    const ml_hf_key *keys = ml__hf_keys(&nkeys);
    size_t cap = nkeys * 1024, n = 0;
    char *want = malloc(cap);
    assert_non_null(want);
    want[0] = '\0';
    for (size_t i = 0; i < nkeys; i++) {
        char row[1024];
        key_row(row, sizeof row, &keys[i]);
        n += (size_t)snprintf(want + n, cap - n, "%s\n", row);
    }
    /* the rows of the document: lines starting "| `" between the markers */
    char *got = calloc(1, (size_t)(end - begin) + 1);
    assert_non_null(got);
    size_t g = 0;
    for (const char *p = begin; p < end;) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t l = nl ? (size_t)(nl - p) + 1 : (size_t)(end - p);
        if (!strncmp(p, "| `", 3)) {
            memcpy(got + g, p, l);
            g += l;
        }
        p += l;
    }
    if (strcmp(got, want)) {
        FILE *f = fopen("hf-keys.md", "w");
        if (f) {
            fputs(want, f);
            fclose(f);
        }
        size_t i = 0, line = 1;
        while (got[i] && got[i] == want[i])
            line += got[i++] == '\n';
        fail_msg("docs/hf.md's key table differs from src/model/hf.c's at row %zu; the "
                 "expected rows are in hf-keys.md (the test's working directory)",
                 line);
    }
    free(got);
    free(want);
    free(doc);
}

/* gelu_new (HF GPT-2's default): transformers' composite saves, per
 * (B, T, F) element of each layer, more than the one-op GELU's layer: in
 * fp32 3 x 4 B (tanh's result, 0.5 * x and 1 + tanh; pow keeps the input
 * GELU kept), in pure bf16 3 x 2 B; under autocast 12 B (pow's fp32 copy
 * of c_fc's output, 4, where GELU kept that bf16 output, 2; tanh 4, 0.5 *
 * x 2, 1 + tanh 4; c_proj's bf16 copy of the fp32 output, 2, where it kept
 * GELU's bf16 output, 2: 16 - 4). The shipped config names gelu_new; the
 * same model with the one op is its gelu_pytorch_tanh. */
static void test_gelu_new_composite(void **state)
{
    (void)state;
    static const struct {
        ml_precision p;
        uint64_t per;
    } cases[] = {{ML_PREC_FP32, 12}, {ML_PREC_BF16, 6}, {ML_PREC_AMP_BF16, 12}};
    ml_model *m = load_hf_config("gpt2");
    assert_true(m->mlp.gelu_new && m->mlp.activation == ML_ACT_GELU);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 2;
    c.training.seq_len = 128;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        c.training.precision = cases[i].p;
        ml_ledger *l = eval(m, &c, false);
        const uint64_t with = block_named(l, "block.0")->inventory_bytes;
        ml_ledger_destroy(l);
        m->mlp.gelu_new = false;
        l = eval(m, &c, false);
        const uint64_t without = block_named(l, "block.0")->inventory_bytes;
        ml_ledger_destroy(l);
        m->mlp.gelu_new = true;
        assert_int_equal(with - without, cases[i].per * 2 * 128 * 3072);
    }
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_counts),
        cmocka_unit_test(test_mapping),
        cmocka_unit_test(test_absent_sizes),
        cmocka_unit_test(test_absent_sizes_moved),
        cmocka_unit_test(test_absent_default_refused),
        cmocka_unit_test(test_errors_and_training),
        cmocka_unit_test(test_attn_implementation),
        cmocka_unit_test(test_refused_families),
        cmocka_unit_test(test_use_cache),
        cmocka_unit_test(test_other_heads_refused),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_head_dim),
        cmocka_unit_test(test_refused_keys),
        cmocka_unit_test(test_honoured_keys),
        cmocka_unit_test(test_shipped_config_keys),
        cmocka_unit_test(test_docs_key_table),
        cmocka_unit_test(test_gelu_new_composite),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
