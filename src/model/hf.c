/* Hugging Face config.json → ml_model. The JSON is read with the YAML tree
 * parser (JSON's flow syntax is YAML). Every key of the config is honoured,
 * inert (changes nothing the planner computes), approximated as documented,
 * or refused with its position: the key table (hf_keys.c) is the one list, and
 * docs/hf.md's table is generated from it (tests/unit/test_hf.c). */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* ---- the mapping --------------------------------------------------------- */

/* architectures: the classes the checkpoint was saved from. The planner
 * builds one class per family (its head and loss), two for BERT
 * (BertForSequenceClassification, BertForMaskedLM); another is refused,
 * since planning BertForPreTraining as a classifier is planning another
 * model. *second: the family's second class is named. */
static ml_status architectures_of(const ml_node *r, size_t f, bool *second, ml_error *err)
{
    const ml_hf_family_info *fi = &ml__hf_families()[f];
    const ml_node *n = ml__tree_get(r, "architectures");
    *second = false;
    if (ml__hf_is_null(n))
        return ML_OK;
    if (n->type != ML_NODE_SEQ)
        return ml__error_at(err, n, ML_SCHEMA, "architectures: expected a list of class names");
    for (size_t i = 0; i < n->count; i++) {
        const ml_node *c = n->items[i];
        bool one = c->type == ML_NODE_SCALAR && !strcmp(c->text, fi->arch);
        bool two = c->type == ML_NODE_SCALAR && fi->arch2 && !strcmp(c->text, fi->arch2);
        if ((one && *second) || (two && i > 0 && !*second))
            return ml__error_at(err, c, ML_SCHEMA,
                                "architectures: names both %s and %s; plan one of them",
                                fi->arch, fi->arch2);
        *second = two;
        if (one || two)
            continue;
        return ml__error_at(err, c, ML_SCHEMA,
                            "architectures: '%s' is not modelled: for model_type '%s' memledger "
                            "plans %s (%s)%s%s%s%s; to plan this checkpoint trained as that class, "
                            "set architectures to [\"%s\"]",
                            c->type == ML_NODE_SCALAR ? c->text : "(not a string)", fi->type,
                            fi->arch, fi->head, fi->arch2 ? " and " : "",
                            fi->arch2 ? fi->arch2 : "", fi->arch2 ? " (" : "",
                            fi->arch2 ? fi->head2 : "", fi->arch);
    }
    return ML_OK;
}


/* The planner's one dropout switch from the family's probabilities, each
 * with its config class's default (NaN: the first's value, as BERT's
 * classifier_dropout): masks everywhere or nowhere. */
typedef struct {
    const char *key;
    double def;
} prob_key;

static ml_status dropout_of(const ml_node *r, const prob_key *pk, size_t n, ml_model *m,
                            ml_error *err)
{
    double p0 = pk[0].def;
    ml_status st = ml__hf_prob(err, r, pk[0].key, &p0);
    if (st)
        return st;
    m->dropout = p0;
    for (size_t i = 1; i < n; i++) {
        double p = pk[i].def == pk[i].def ? pk[i].def : p0;
        if ((st = ml__hf_prob(err, r, pk[i].key, &p)))
            return st;
        if ((p > 0) != (p0 > 0)) {
            const ml_node *at = ml__tree_get(r, pk[i].key) ? ml__tree_get(r, pk[i].key)
                                                          : ml__tree_get(r, pk[0].key);
            return ml__error_at(err, at ? at : r, ML_SCHEMA,
                                "%s: %g while %s is %g: the planner has one dropout switch "
                                "(masks on the attention probabilities, the residual branches "
                                "and the embeddings, or none), so dropout in only some places "
                                "is not modelled",
                                pk[i].key, p, pk[0].key, p0);
        }
    }
    return ML_OK;
}

/* The Llama family: RMSNorm, SwiGLU, rotary; biases as each class has them;
 * Mistral's and Qwen2's sliding windows. */
static ml_status map_llama(const ml_node *r, const char *t, ml_model *m, ml_error *err)
{
    const char *act;
    ml_status st = ml__hf_str(err, r, "hidden_act", &act);
    if (st)
        return st;
    if (act && strcmp(act, "silu"))
        return ml__error_at(err, ml__tree_get(r, "hidden_act"), ML_SCHEMA,
                            "hidden_act: '%s' is not modelled for %s (silu: SwiGLU)", act, t);
    m->mlp.activation = ML_ACT_SWIGLU;
    m->norms.kind =
        strcmp(t, "olmo") ? ML_NORM_RMSNORM : ML_NORM_OLMO_LAYERNORM; /* OlmoLayerNorm */
    m->residual.prenorm = true;
    m->embed.position = ML_POS_ROPE;
    m->bias = false;
    m->attn.qkv_bias = !strncmp(t, "qwen2", 5); /* qwen2, qwen2_moe */
    m->embed.tied = false;
    m->dropout = 0; /* attention_dropout > 0 is refused by the key table */
    if ((st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)))
        return st;
    if (!strcmp(t, "llama") || !strcmp(t, "olmo")) {
        /* modeling_llama (and modeling_olmo's, without mlp_bias): q, k, v
         * and o_proj take attention_bias, the MLP mlp_bias */
        bool ab = false, mb = false;
        if ((st = ml__hf_bool(err, r, "attention_bias", &ab)) ||
            (st = ml__hf_bool(err, r, "mlp_bias", &mb)))
            return st;
        m->attn.qkv_bias = m->attn.out_bias = ab;
        m->mlp.bias = mb;
    } else if (!strcmp(t, "mistral") || !strcmp(t, "mixtral")) {
        /* MistralConfig: sliding_window defaults to 4096, MixtralConfig's
         * to null; null: none */
        uint64_t w = strcmp(t, "mixtral") ? 4096 : 0;
        const ml_node *n = ml__tree_get(r, "sliding_window");
        if (n && ml__hf_is_null(n))
            w = 0;
        else if ((st = ml__hf_uint(err, r, KEYS("sliding_window"), false, 0,
                                    1ull << 40, &w)))
            return st;
        m->attn.sliding_window = w;
        if (!strcmp(t, "mixtral") && (st = ml__hf_map_mixtral_experts(r, m, err)))
            return st;
    } else {
        /* Qwen2Config: the window (default 4096) only with use_sliding_window,
         * on the layers from max_window_layers (default 28) on, or those
         * layer_types names sliding_attention */
        bool on = false;
        uint64_t w = 4096, from = 28;
        const ml_node *n = ml__tree_get(r, "sliding_window");
        if (n && ml__hf_is_null(n))
            w = 0;
        else if ((st = ml__hf_uint(err, r, KEYS("sliding_window"), false, 0,
                                    1ull << 40, &w)))
            return st;
        if ((st = ml__hf_bool(err, r, "use_sliding_window", &on)) ||
            (st = ml__hf_uint(err, r, KEYS("max_window_layers"), false, 0,
                              1ull << 40, &from)))
            return st;
        bool windowed = from < m->layers;
        if ((st = ml__hf_layer_types(err, r, m->layers, &windowed)))
            return st;
        m->attn.sliding_window = on && windowed ? w : 0;
        if (!strcmp(t, "qwen2_moe") && (st = ml__hf_map_qwen2_moe_experts(r, m, err)))
            return st;
    }
    return ML_OK;
}

/* The family model_type names: *t its name, *fam its bit, *f its index in
 * ml__hf_families(); *mt the model_type node (for later messages). */
static ml_status family_of(const ml_node *r, bool nested, const ml_node **mt, const char **t,
                           unsigned *fam, size_t *f, ml_error *err)
{
    const ml_hf_family_info *families = ml__hf_families();
    *mt = ml__tree_get(r, "model_type");
    /* LlavaConfig: a text_config without one is a llama's */
    *t = !*mt && nested ? "llama" : *mt && (*mt)->type == ML_NODE_SCALAR ? (*mt)->text : NULL;
    if (!*t)
        return ml__error_at(err, r, ML_SCHEMA,
                            "model_type: missing; a Hugging Face config.json names its model_type "
                            "(supported: %s)",
                            ML_HF_SUPPORTED);
    *fam = ml__hf_family(*t);
    if (!*fam && ml__hf_refused_family(*t))
        return ml__error_at(err, *mt, ML_SCHEMA, "model_type '%s' is not modelled: %s; supported: %s",
                            *t, ml__hf_refused_family(*t), ML_HF_SUPPORTED);
    if (!*fam)
        return ml__error_at(err, *mt, ML_SCHEMA, "model_type '%s' is not supported; supported: %s",
                            *t, ML_HF_SUPPORTED);
    *f = 0;
    while (families[*f].bit != *fam)
        (*f)++;
    return ML_OK;
}

/* GPT2LMHeadModel: LayerNorm, learned positions, biases, tied embeddings. */
static ml_status map_gpt2(const ml_node *r, const char *t, ml_model *m, ml_error *err)
{
    ml_status st;
    if ((st = ml__hf_activation(r, "activation_function", t, m, err)))
        return st;
    m->norms.kind = ML_NORM_LAYERNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_LEARNED;
    m->bias = m->attn.qkv_bias = true;
    m->embed.tied = true;
    if ((st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)) ||
        (st = dropout_of(
             r, (const prob_key[]){{"resid_pdrop", 0.1}, {"embd_pdrop", 0.1}, {"attn_pdrop", 0.1}},
             3, m, err)))
        return st;
    return ML_OK;
}

/* GPTNeoX: fused qkv with biases, parallel residual, rotary, untied */
static ml_status map_neox(const ml_node *r, const char *t, ml_model *m, ml_error *err)
{
    ml_status st;
    if ((st = ml__hf_activation(r, "hidden_act", t, m, err)))
        return st;
    m->norms.kind = ML_NORM_LAYERNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_ROPE;
    m->bias = m->attn.qkv_bias = true;
    m->embed.tied = false;
    m->residual.parallel = true;
    if ((st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)) ||
        (st = ml__hf_bool(err, r, "use_parallel_residual", &m->residual.parallel)) ||
        (st = dropout_of(r, (const prob_key[]){{"hidden_dropout", 0}, {"attention_dropout", 0}}, 2,
                         m, err)))
        return st;
    return ML_OK;
}

/* The classifier's classes. PretrainedConfig: id2label's count, else
 * num_labels, else 2; arch names the class for the regression message. */
static ml_status classes_of(const ml_node *r, const char *arch, ml_model *m, ml_error *err)
{
    ml_status st;
    m->head.classes = 2;
    const ml_node *labels = ml__tree_get(r, "id2label");
    if (!ml__hf_is_null(labels) && labels->type != ML_NODE_MAP)
        return ml__error_at(err, labels, ML_SCHEMA, "id2label: expected an object");
    if (!ml__hf_is_null(labels) && !labels->count)
        return ml__error_at(err, labels, ML_SCHEMA,
                            "id2label: empty: transformers takes its count, a classifier of 0 "
                            "labels; name the labels, or remove id2label and give num_labels");
    uint64_t nl = 0;
    if ((st = ml__hf_uint(err, r, KEYS("num_labels"), false, 1, 1u << 24, &nl)))
        return st;
    if (!ml__hf_is_null(labels) && labels->count) {
        if (nl && nl != labels->count)
            return ml__error_at(err, ml__tree_get(r, "num_labels"), ML_SCHEMA,
                                "num_labels: %llu but id2label names %zu labels; transformers "
                                "takes id2label's, so say one thing",
                                (unsigned long long)nl, labels->count);
        m->head.classes = labels->count;
    } else if (nl) {
        m->head.classes = nl;
    }
    if (m->head.classes == 1)
        return ml__error_at(err, ml__tree_get(r, "num_labels") ? ml__tree_get(r, "num_labels")
                                                              : labels,
                           ML_SCHEMA,
                           "num_labels: 1 makes %s a regression (MSELoss), which is not "
                           "modelled",
                           arch);
    return ML_OK;
}

/* A decoder's *ForSequenceClassification (transformers'
 * GenericForSequenceClassification): num_labels classes on each sequence's
 * last non-pad token, found by pad_token_id; single-label cross-entropy. */
static ml_status seq_cls_of(const ml_node *r, const char *arch, ml_model *m, ml_error *err)
{
    const char *pt = NULL;
    ml_status st = classes_of(r, arch, m, err);
    if (!st)
        st = ml__hf_str(err, r, "problem_type", &pt);
    if (st)
        return st;
    if (pt && strcmp(pt, "single_label_classification"))
        return ml__error_at(err, ml__tree_get(r, "problem_type"), ML_SCHEMA,
                            "problem_type: '%s' is not modelled for %s (null or "
                            "single_label_classification: cross-entropy)",
                            pt, arch);
    const ml_node *pad = ml__tree_get(r, "pad_token_id");
    m->head.cls_no_pad = ml__hf_is_null(pad);
    return ML_OK;
}

/* BertForSequenceClassification and ViTForImageClassification: LayerNorm
 * (post-norm for BERT), biases, the classifier; BERT's pooler and token
 * types, ViT's patches. mlm: BertForMaskedLM (modeling_bert.py: BertModel
 * without its pooler, the MLM head tied to the word embeddings by default,
 * no classifier, so no classes and no classifier dropout). */
static ml_status map_encoder(const ml_node *r, const char *t, bool vit, bool mlm,
                             const char *arch, ml_model *m, ml_error *err)
{
    const bool bert = !vit;
    ml_status st;
    if ((st = ml__hf_activation(r, "hidden_act", t, m, err)))
        return st;
    m->norms.kind = ML_NORM_LAYERNORM;
    m->residual.prenorm = vit;
    m->bias = m->attn.qkv_bias = true;
    if (vit && (st = ml__hf_bool(err, r, "qkv_bias", &m->attn.qkv_bias)))
        return st;
    /* BertConfig: 0.1 and 0.1, classifier_dropout null (hidden's);
     * ViTConfig: 0 and 0 */
    double d0 = bert ? 0.1 : 0;
    if ((st = dropout_of(r,
                         (const prob_key[]){{"hidden_dropout_prob", d0},
                                            {"attention_probs_dropout_prob", d0},
                                            {"classifier_dropout", NAN}},
                         bert && !mlm ? 3 : 2, m, err)))
        return st;
    m->head.mlm = mlm;
    m->embed.tied = mlm;
    if (mlm && (st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)))
        return st;
    if (!mlm && (st = classes_of(r, arch, m, err)))
        return st;
    if (bert) {
        m->embed.position = ML_POS_LEARNED;
        m->head.pooler = !mlm;
        m->embed.token_types = 2;
        if ((st = ml__hf_uint(err, r, KEYS("type_vocab_size"), false, 1, 1u << 16,
                              &m->embed.token_types)))
            return st;
    } else {
        m->embed.position = ML_POS_LEARNED;
        m->head.pooler = false;
        m->embed.channels = 3;
        if ((st = ml__hf_uint(err, r, KEYS("image_size"), true, 1, 1u << 16,
                              &m->embed.image_size)) ||
            (st = ml__hf_uint(err, r, KEYS("patch_size"), true, 1, 1u << 16,
                              &m->embed.patch_size)) ||
            (st = ml__hf_uint(err, r, KEYS("num_channels"), false, 1, 1u << 16,
                              &m->embed.channels)))
            return st;
        if (m->embed.image_size % m->embed.patch_size)
            return ml__error_at(err, ml__tree_get(r, "patch_size"), ML_SCHEMA,
                                "patch_size: %llu does not divide image_size (%llu)",
                                (unsigned long long)m->embed.patch_size,
                                (unsigned long long)m->embed.image_size);
    }
    return ML_OK;
}

/* LlavaForConditionalGeneration (hf_llava.c); its attn_implementation is
 * the language model's, unless the text_config names its own
 * (PretrainedConfig keeps a sub-config's). */
static ml_status llava_of(const ml_node *r, ml_model *m, ml_error *err)
{
    const ml_node *tc = ml__tree_get(r, "text_config");
    ml_status st = ml__hf_map_llava(r, m, err);
    if (st || !ml__tree_get(r, "attn_implementation") ||
        (tc && tc->type == ML_NODE_MAP && ml__tree_get(tc, "attn_implementation")))
        return st;
    return ml__hf_attention(r, ML_HF_LLAVA, m, err);
}

static ml_status map_config(const ml_node *r, ml_model *m, bool nested, ml_error *err)
{
    const ml_hf_family_info *families = ml__hf_families();
    const ml_node *mt = NULL;
    const char *t = NULL;
    unsigned fam = 0;
    size_t f = 0;
    ml_status st;
    if ((st = family_of(r, nested, &mt, &t, &fam, &f, err)))
        return st;
    const bool llama = fam & ML_HF_LM3, gpt2 = fam == ML_HF_GPT2, neox = fam == ML_HF_NEOX,
               bert = fam == ML_HF_BERT, vit = fam == ML_HF_VIT, gemma = fam == ML_HF_GEMMA,
               phi3 = fam == ML_HF_PHI3, gemma2 = fam == ML_HF_GEMMA2,
               falcon = fam == ML_HF_FALCON,
               deepseek = fam == ML_HF_DEEPSEEK3 || fam == ML_HF_DEEPSEEK2;
    bool mlm = false;
    if ((st = ml__hf_nesting(mt, t, fam, nested, m, err)) || (st = ml__hf_check_keys(r, fam, t, err)) ||
        (st = architectures_of(r, f, &mlm, err)))
        return st;
    if (fam == ML_HF_LLAVA)
        return llava_of(r, m, err);
    if (fam == ML_HF_T5 || fam == ML_HF_MT5) /* encoder-decoders: none of the sizes below */
        return (st = ml__hf_attention(r, fam, m, err)) ? st : ml__hf_map_t5(r, m, fam == ML_HF_MT5, err);
    m->type = (bert || vit) ? ML_MODEL_ENCODER : ML_MODEL_DECODER;
    /* PretrainedConfig: use_cache defaults to true; the decoders return
     * past_key_values unless training with gradient checkpointing; BERT and
     * ViT keep none */
    m->attn.kv_cache = m->type == ML_MODEL_DECODER;
    if (m->attn.kv_cache && (st = ml__hf_bool(err, r, "use_cache", &m->attn.kv_cache)))
        return st;
    const bool req = !(nested && fam == ML_HF_LLAMA); /* else LlamaConfig's defaults */
    if ((st = ml__hf_attention(r, fam, m, err)) ||
        (st = ml__hf_sizes(r, &families[f], llama || gemma || gemma2 || phi3 || deepseek, vit,
                           req, m, err)))
        return st;
    if (llama)
        st = map_llama(r, t, m, err);
    else if (gemma)
        st = ml__hf_map_gemma(r, m, err);
    else if (gemma2)
        st = ml__hf_map_gemma2(r, m, err);
    else if (phi3)
        st = ml__hf_map_phi3(r, m, err);
    else if (gpt2)
        st = map_gpt2(r, t, m, err);
    else if (neox)
        st = map_neox(r, t, m, err);
    else if (falcon)
        st = ml__hf_map_falcon(r, m, err);
    else if (deepseek)
        st = fam == ML_HF_DEEPSEEK3 ? ml__hf_map_deepseek_v3(r, m, err)
                                    : ml__hf_map_deepseek_v2(r, m, err);
    else
        st = map_encoder(r, t, vit, mlm, families[f].arch, m, err);
    if (st)
        return st;
    if (!falcon)
        m->norms.bias = m->bias; /* Falcon's LayerNorms keep their bias */
    if (mlm && m->type == ML_MODEL_DECODER && (st = seq_cls_of(r, families[f].arch2, m, err)))
        return st;
    const ml_node *hd = ml__tree_get(r, "head_dim");
    if (m->embed.position == ML_POS_ROPE && m->attn.head_dim % 2 && !m->attn.kv_lora)
        return ml__error_at(err, !ml__hf_is_null(hd) ? hd : mt, ML_SCHEMA,
                            "rotary embeddings need an even head size (%llu)",
                            (unsigned long long)m->attn.head_dim);
    if (m->embed.position == ML_POS_LEARNED && !m->embed.max_positions && !m->embed.image_size)
        return ml__error_at(err, r, ML_SCHEMA,
                            "max_position_embeddings: missing for learned positions");
    /* defaults for the training settings, as the YAML loader does */
    m->config = ml_config_defaults();
    if (m->embed.image_size) {
        uint64_t g = m->embed.image_size / m->embed.patch_size;
        m->config.training.seq_len = g * g + 1;
    } else {
        uint64_t mp = m->embed.max_positions ? m->embed.max_positions : 2048;
        m->config.training.seq_len = mp < 2048 ? mp : 2048;
    }
    return ML_OK;
}

static ml_status load_hf(const char *text, size_t len, const char *config_path,
                         const char *training_path, ml_model **out, ml_error *err);

ml_status ml__hf_map_text(const ml_node *r, ml_model *m, ml_error *err)
{
    return map_config(r, m, true, err);
}

ml_status ml_model_load_hf_string(const char *text, size_t len, const char *name, ml_model **out,
                                  ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", name ? name : "config.json");
    return load_hf(text, len, name ? name : "config.json", NULL, out, err);
}

ml_status ml_model_load_hf(const char *config_path, const char *training_path, ml_model **out,
                           ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    /* a model's folder, as from_pretrained takes it: its config.json */
    char joined[4096];
    config_path = ml__hf_config_in(config_path, joined, sizeof joined);
    size_t len = 0;
    char *text = ml__read_file(config_path, &len, err);
    if (!text)
        return err->code;
    ml_status st = load_hf(text, len, config_path, training_path, out, err);
    free(text);
    return st;
}

static ml_status load_hf(const char *text, size_t len, const char *config_path,
                         const char *training_path, ml_model **out, ml_error *err)
{
    ml_node *root = NULL;
    ml_status st = ml__tree_parse_json(text, len, &root, err);
    if (st)
        return st;
    ml_model *m = calloc(1, sizeof *m);
    if (!m) {
        ml__tree_free(root);
        return ml__error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    if (!root || root->type != ML_NODE_MAP)
        st = ml__error_at(err, root, ML_SCHEMA,
                          "expected a JSON object (a Hugging Face config.json)");
    else if (!(st = ml__tree_check_unique(err, root)))
        st = map_config(root, m, false, err);
    if (!st) {
        /* name: _name_or_path's last part ("org/model/" -> model), else
         * the config's directory (models/hf/gpt2/config.json -> gpt2),
         * else model_type (a config given as text, "<dict>") */
        const char *n = NULL, *type = NULL;
        st = ml__hf_str(err, root, "_name_or_path", &n);
        if (!st)
            st = ml__hf_str(err, root, "model_type", &type);
        char buf[512];
        snprintf(buf, sizeof buf, "%s", n ? n : "");
        for (size_t k = strlen(buf); k > 0 && buf[k - 1] == '/'; k--)
            buf[k - 1] = '\0';
        const char *name = strrchr(buf, '/') ? strrchr(buf, '/') + 1 : buf;
        if (!strcmp(name, ".") || !strcmp(name, "..")) /* a path, not a name */
            name = "";
        if (!st && !*name) {
            snprintf(buf, sizeof buf, "%s", config_path);
            char *slash = strrchr(buf, '/');
            name = "";
            if (slash) {
                *slash = '\0';
                slash = strrchr(buf, '/');
                name = slash ? slash + 1 : buf;
            }
        }
        if (!st)
            snprintf(m->name, sizeof m->name, "%s",
                     *name ? name : type && *type ? type : "hf-model");
    }
    ml__tree_free(root);
    if (!st && training_path) {
        size_t tlen = 0;
        char *t = ml__read_file(training_path, &tlen, err);
        if (!t)
            st = err->code;
        else {
            st = ml__schema_settings(t, tlen, training_path, m, err);
            free(t);
        }
    }
    if (st) {
        ml_model_destroy(m);
        return st;
    }
    *out = m;
    return ML_OK;
}
