/* The Hugging Face import's DeepSeek-V2 and DeepSeek-V3 (hf.c calls them
 * after the shared sizes): DeepseekV2ForCausalLM and DeepseekV3ForCausalLM
 * as transformers 4.5x's modeling_deepseek_v2.py and modeling_deepseek_v3.py
 * build them, with their configs' defaults. Every key they read is in the
 * key table (hf_keys.c); the blocks they map to are docs/inventory.md's
 * "DeepSeek-V3 block" and its DeepSeek-V2 paragraph. */
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* A key that may be null: *out keeps its default when absent, takes
 * null_value when null. */
static ml_status uint_or_null(ml_error *err, const ml_node *r, const char *key, uint64_t lo,
                              uint64_t hi, uint64_t null_value, uint64_t *out)
{
    const ml_node *n = ml__tree_get(r, key);
    if (n && ml__hf_is_null(n)) {
        *out = null_value;
        return ML_OK;
    }
    return ml__hf_uint(err, r, (const char *const[]){key, NULL}, false, lo, hi, out);
}

/* Keys transformers' classes cannot build the layer from when null (they
 * multiply or compare with them): refused rather than taking the default. */
static ml_status no_nulls(const ml_node *r, const char *type, ml_error *err)
{
    static const char *const keys[] = {"n_routed_experts", "num_experts_per_tok",
                                       "n_shared_experts", "moe_intermediate_size",
                                       "kv_lora_rank",     "norm_topk_prob",
                                       "first_k_dense_replace"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        const ml_node *n = ml__tree_get(r, keys[i]);
        if (n && ml__hf_is_null(n))
            return ml__error_at(err, n, ML_SCHEMA,
                                "%s: null is not modelled for %s (transformers' layer needs a "
                                "value; the hub's remote code may read null as none): give "
                                "the number",
                                keys[i], type);
    }
    return ML_OK;
}

/* The two versions' defaults and what differs (DeepseekV2Config,
 * DeepseekV3Config); their intermediate_size and num_key_value_heads
 * defaults are the family table's (hf_families.c). */
typedef struct {
    const char *type;
    uint64_t experts, per_tok, expert_ffn, shared, dense;
    bool v3;
} version_t;

/* The mixture's keys: counts, widths, the dense layers, the top-k method. */
static ml_status experts_of(const ml_node *r, const version_t *v, ml_model *m, uint64_t *shared,
                            ml_error *err)
{
    ml_status st;
    const char *method = NULL;
    if ((st = ml__hf_uint(err, r, KEYS("n_routed_experts"), false, 2, 4096, &m->moe.experts)) ||
        (st = ml__hf_uint(err, r, KEYS("num_experts_per_tok"), !v->v3, 1, 4096,
                          &m->moe.per_token)) ||
        (st = ml__hf_uint(err, r, KEYS("moe_intermediate_size"), false, 1, ML_MAX_FFN,
                          &m->moe.expert_ffn)) ||
        (st = ml__hf_uint(err, r, KEYS("n_shared_experts"), false, 1, 4096, shared)) ||
        (st = ml__hf_uint(err, r, KEYS("first_k_dense_replace"), false, 0, ML_MAX_LAYERS,
                          &m->moe.dense_layers)) ||
        (st = ml__hf_str(err, r, "topk_method", &method)))
        return st;
    if (v->v3 && (st = ml__hf_bool(err, r, "norm_topk_prob", &m->moe.renorm)))
        return st;
    if (m->moe.per_token > m->moe.experts)
        return ml__error_at(err, ml__tree_get(r, "num_experts_per_tok"), ML_SCHEMA,
                            "num_experts_per_tok: %llu is more than n_routed_experts (%llu)",
                            (unsigned long long)m->moe.per_token,
                            (unsigned long long)m->moe.experts);
    /* DeepseekV2MoEGate: greedy or group_limited_greedy (the key table
     * refuses the others), the latter over n_group groups of the experts */
    m->moe.grouped_topk = !v->v3 && method && !strcmp(method, "group_limited_greedy");
    if (m->moe.grouped_topk) {
        uint64_t g = 0;
        if ((st = ml__hf_uint(err, r, KEYS("n_group"), true, 1, 4096, &g)))
            return st;
        if (m->moe.experts % g)
            return ml__error_at(err, ml__tree_get(r, "n_group"), ML_SCHEMA,
                                "n_group: %llu does not divide n_routed_experts (%llu), as "
                                "group_limited_greedy's view needs",
                                (unsigned long long)g, (unsigned long long)m->moe.experts);
        uint64_t kg = 0;
        if ((st = ml__hf_uint(err, r, KEYS("topk_group"), true, 1, g, &kg)))
            return st; /* torch.topk over the n_group groups needs 1..n_group */
    }
    return ML_OK;
}

/* DeepseekV2DecoderLayer and DeepseekV3DecoderLayer: RMSNorms, multi-head
 * latent attention (q_lora_rank null: q_proj), a dense SwiGLU MLP of
 * intermediate_size in the first first_k_dense_replace layers, the mixture
 * in the others (n_routed_experts SwiGLU experts of moe_intermediate_size,
 * num_experts_per_tok per token, and n_shared_experts shared experts as one
 * MLP of moe_intermediate_size * n_shared_experts, ungated); rotary
 * positions on qk_rope_head_dim of each q/k head; no biases; an untied head
 * by default. V3: the sigmoid router, norm_topk_prob; V2: the softmax
 * router, the sorted dispatch, the complex rotary. */
static ml_status map_deepseek(const ml_node *r, const version_t *v, ml_model *m, ml_error *err)
{
    ml_status st;
    const char *act = NULL;
    if ((st = no_nulls(r, v->type, err)) || (st = ml__hf_str(err, r, "hidden_act", &act)))
        return st;
    if (act && strcmp(act, "silu"))
        return ml__error_at(err, ml__tree_get(r, "hidden_act"), ML_SCHEMA,
                            "hidden_act: '%s' is not modelled for %s (silu: SwiGLU)", act,
                            v->type);
    m->mlp.activation = ML_ACT_SWIGLU;
    m->norms.kind = ML_NORM_RMSNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_ROPE;
    m->bias = m->attn.qkv_bias = m->attn.out_bias = m->mlp.bias = false;
    m->embed.tied = false;
    m->dropout = 0;
    uint64_t nope = 128, shared = v->shared;
    m->attn.kv_lora = 512;
    m->attn.q_lora = 1536;
    m->attn.rope_dim = 64;
    m->attn.v_dim = 128;
    m->moe.experts = v->experts;
    m->moe.per_token = v->per_tok;
    m->moe.expert_ffn = v->expert_ffn;
    m->moe.dense_layers = v->dense;
    m->moe.renorm = v->v3;
    m->moe.router_sigmoid = v->v3;
    m->moe.sort = m->embed.rope_complex = !v->v3;
    m->moe.shared_gate = false;
    if ((st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)) ||
        (st = ml__hf_uint(err, r, KEYS("kv_lora_rank"), false, 1, ML_MAX_HIDDEN,
                          &m->attn.kv_lora)) ||
        (st = uint_or_null(err, r, "q_lora_rank", 1, ML_MAX_HIDDEN, 0, &m->attn.q_lora)) ||
        (st = ml__hf_uint(err, r, KEYS("qk_nope_head_dim"), false, 1, ML_MAX_HIDDEN, &nope)) ||
        (st = ml__hf_uint(err, r, KEYS("qk_rope_head_dim"), false, 2, ML_MAX_HIDDEN,
                          &m->attn.rope_dim)) ||
        (st = ml__hf_uint(err, r, KEYS("v_head_dim"), false, 1, ML_MAX_HIDDEN, &m->attn.v_dim)) ||
        (st = experts_of(r, v, m, &shared, err)))
        return st;
    if (m->attn.rope_dim % 2)
        return ml__error_at(err, ml__tree_get(r, "qk_rope_head_dim"), ML_SCHEMA,
                            "qk_rope_head_dim: %llu; rotary embeddings need an even size",
                            (unsigned long long)m->attn.rope_dim);
    /* DeepSeek-V2's view_as_complex on the rotated slice needs even strides
     * and offsets: in fp32 (where .float() is the slice itself) an odd
     * qk_nope_head_dim or kv_lora_rank fails in transformers */
    if (!v->v3 && (nope % 2 || m->attn.kv_lora % 2))
        return ml__error_at(err, ml__tree_get(r, nope % 2 ? "qk_nope_head_dim" : "kv_lora_rank"),
                            ML_SCHEMA,
                            "%s: %llu is odd; DeepSeek-V2's complex rotary needs the rotated "
                            "slice at an even offset (view_as_complex), which fails in fp32",
                            nope % 2 ? "qk_nope_head_dim" : "kv_lora_rank",
                            (unsigned long long)(nope % 2 ? nope : m->attn.kv_lora));
    /* num_key_value_heads absent: DeepseekV3Config's 128 (V2's None: the
     * heads), ml__hf_sizes */
    const ml_node *kv = ml__tree_get(r, "num_key_value_heads");
    if (m->attn.kv_heads != m->attn.heads)
        return ml__error_at(err, kv ? kv : r, ML_SCHEMA,
                            "num_key_value_heads: %llu%s; multi-head latent attention makes "
                            "num_attention_heads (%llu) key and value heads, and repeating them "
                            "is not modelled%s",
                            (unsigned long long)m->attn.kv_heads,
                            kv ? "" : " is DeepseekV3Config's default, taken because the key "
                                      "is absent",
                            (unsigned long long)m->attn.heads,
                            kv ? "" : ": give num_key_value_heads equal to num_attention_heads");
    if (m->moe.dense_layers >= m->layers) { /* every layer dense: no experts run */
        m->moe.dense_layers = m->layers;
        m->moe.experts = m->moe.per_token = m->moe.expert_ffn = 0;
        m->moe.sort = m->moe.grouped_topk = false;
    }
    m->attn.head_dim = nope + m->attn.rope_dim; /* qk_head_dim */
    if (m->attn.heads * m->attn.head_dim > ML_MAX_HIDDEN ||
        m->attn.heads * m->attn.v_dim > ML_MAX_HIDDEN)
        return ml__error_at(err, ml__tree_get(r, "num_attention_heads"), ML_RANGE,
                            "num_attention_heads x the head sizes is above %llu",
                            (unsigned long long)ML_MAX_HIDDEN);
    m->moe.shared_ffn = m->moe.experts ? shared * m->moe.expert_ffn : 0;
    return ML_OK;
}

ml_status ml__hf_map_deepseek_v3(const ml_node *r, ml_model *m, ml_error *err)
{
    static const version_t v3 = {"deepseek_v3", 256, 8, 2048, 1, 3, true};
    return map_deepseek(r, &v3, m, err);
}

ml_status ml__hf_map_deepseek_v2(const ml_node *r, ml_model *m, ml_error *err)
{
    static const version_t v2 = {"deepseek_v2", 64, 0, 1407, 2, 0, false};
    return map_deepseek(r, &v2, m, err);
}
