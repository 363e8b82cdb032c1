/* The Hugging Face import's DeepSeek-V3 (hf.c calls it after the shared
 * sizes): DeepseekV3ForCausalLM as transformers 4.5x's
 * modeling_deepseek_v3.py builds it, with DeepseekV3Config's defaults. Every
 * key it reads is in the key table (hf_keys.c); the block it maps to is
 * docs/inventory.md's "DeepSeek-V3 block". */
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* A key that may be null: *out keeps its default when absent, takes
 * null_value when null. */
static ml_status uint_or_null(ml_error *err, const ml_node *r, const char *key, uint64_t lo,
                              uint64_t hi, uint64_t null_value, uint64_t *out)
{
    const ml_node *n = ml_tree_get(r, key);
    if (n && ml_hf_is_null(n)) {
        *out = null_value;
        return ML_OK;
    }
    return ml_hf_uint(err, r, (const char *const[]){key, NULL}, false, lo, hi, out);
}

/* DeepseekV3DecoderLayer: RMSNorms, multi-head latent attention (q_lora_rank
 * null: q_proj), a dense SwiGLU MLP of intermediate_size in the first
 * first_k_dense_replace layers, DeepseekV3MoE in the others (n_routed_experts
 * SwiGLU experts of moe_intermediate_size, num_experts_per_tok per token
 * chosen by the sigmoid router, norm_topk_prob, and n_shared_experts shared
 * experts as one MLP of moe_intermediate_size * n_shared_experts, ungated);
 * rotary positions on qk_rope_head_dim of each q/k head; no biases; an
 * untied head by default. */
ml_status ml_hf_map_deepseek_v3(const ml_node *r, ml_model *m, ml_error *err)
{
    ml_status st;
    const char *act = NULL;
    if ((st = ml_hf_str(err, r, "hidden_act", &act)))
        return st;
    if (act && strcmp(act, "silu"))
        return ml_error_at(err, ml_tree_get(r, "hidden_act"), ML_SCHEMA,
                           "hidden_act: '%s' is not modelled for deepseek_v3 (silu: SwiGLU)",
                           act);
    m->activation = ML_ACT_SWIGLU;
    m->norm = ML_NORM_RMSNORM;
    m->prenorm = true;
    m->position = ML_POS_ROPE;
    m->bias = m->qkv_bias = m->out_bias = m->mlp_bias = false;
    m->tied_embeddings = false;
    m->dropout = 0;
    if (!ml_tree_get(r, "intermediate_size"))
        m->ffn = 18432;
    uint64_t nope = 128, shared = 1;
    m->kv_lora = 512;
    m->q_lora = 1536;
    m->rope_dim = 64;
    m->v_dim = 128;
    m->experts = 256;
    m->experts_per_tok = 8;
    m->expert_ffn = 2048;
    m->dense_layers = 3;
    m->expert_renorm = true;
    m->router_sigmoid = true;
    m->shared_expert_gate = false;
    if ((st = ml_hf_bool(err, r, "tie_word_embeddings", &m->tied_embeddings)) ||
        (st = ml_hf_uint(err, r, KEYS("kv_lora_rank"), false, 1, ML_MAX_HIDDEN, &m->kv_lora)) ||
        (st = uint_or_null(err, r, "q_lora_rank", 1, ML_MAX_HIDDEN, 0, &m->q_lora)) ||
        (st = ml_hf_uint(err, r, KEYS("qk_nope_head_dim"), false, 1, ML_MAX_HIDDEN, &nope)) ||
        (st = ml_hf_uint(err, r, KEYS("qk_rope_head_dim"), false, 2, ML_MAX_HIDDEN,
                         &m->rope_dim)) ||
        (st = ml_hf_uint(err, r, KEYS("v_head_dim"), false, 1, ML_MAX_HIDDEN, &m->v_dim)) ||
        (st = ml_hf_uint(err, r, KEYS("n_routed_experts"), false, 2, 4096, &m->experts)) ||
        (st = ml_hf_uint(err, r, KEYS("num_experts_per_tok"), false, 1, 4096,
                         &m->experts_per_tok)) ||
        (st = ml_hf_uint(err, r, KEYS("moe_intermediate_size"), false, 1, ML_MAX_FFN,
                         &m->expert_ffn)) ||
        (st = ml_hf_uint(err, r, KEYS("n_shared_experts"), false, 1, 4096, &shared)) ||
        (st = ml_hf_uint(err, r, KEYS("first_k_dense_replace"), false, 0, ML_MAX_LAYERS,
                         &m->dense_layers)) ||
        (st = ml_hf_bool(err, r, "norm_topk_prob", &m->expert_renorm)))
        return st;
    if (m->experts_per_tok > m->experts)
        return ml_error_at(err, ml_tree_get(r, "num_experts_per_tok"), ML_SCHEMA,
                           "num_experts_per_tok: %llu is more than n_routed_experts (%llu)",
                           (unsigned long long)m->experts_per_tok,
                           (unsigned long long)m->experts);
    if (m->rope_dim % 2)
        return ml_error_at(err, ml_tree_get(r, "qk_rope_head_dim"), ML_SCHEMA,
                           "qk_rope_head_dim: %llu; rotary embeddings need an even size",
                           (unsigned long long)m->rope_dim);
    if (m->kv_heads != m->heads)
        return ml_error_at(err, ml_tree_get(r, "num_key_value_heads"), ML_SCHEMA,
                           "num_key_value_heads: %llu; multi-head latent attention makes "
                           "num_attention_heads (%llu) key and value heads, and repeating them "
                           "is not modelled",
                           (unsigned long long)m->kv_heads, (unsigned long long)m->heads);
    if (m->dense_layers >= m->layers) {
        /* every layer dense: no experts run */
        m->dense_layers = m->layers;
        m->experts = m->experts_per_tok = m->expert_ffn = 0;
    }
    m->head_dim = nope + m->rope_dim; /* qk_head_dim */
    if (m->heads * m->head_dim > ML_MAX_HIDDEN || m->heads * m->v_dim > ML_MAX_HIDDEN)
        return ml_error_at(err, ml_tree_get(r, "num_attention_heads"), ML_RANGE,
                           "num_attention_heads x the head sizes is above %llu",
                           (unsigned long long)ML_MAX_HIDDEN);
    m->shared_expert_ffn = m->experts ? shared * m->expert_ffn : 0;
    return ML_OK;
}
