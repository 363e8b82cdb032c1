/* The Hugging Face import's Falcon, and the experts of Mixtral and
 * Qwen2-MoE (hf.c calls them after the shared sizes): FalconForCausalLM as
 * modeling_falcon.py builds it for the configs of Falcon-7B's layout, and
 * the sparse MoE blocks' keys.
 * Every key they read is in the key table (hf_keys.c); the blocks they map
 * to are docs/inventory.md's "Falcon block" and "Mixtral block". */
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* FalconDecoderLayer with parallel_attn and the old decoder architecture:
 * one LayerNorm (input_layernorm) feeds the attention and the MLP, whose
 * outputs are added to the residual (x + attn(ln(x)) + mlp(ln(x))); one
 * fused query_key_value projection, H query heads and one key/value head
 * (multi_query) or H; rotary positions; FalconLinear projections with
 * `bias` (default false) while the LayerNorms keep their biases; a GELU
 * MLP of ffn_hidden_size (default 4 * hidden_size); a tied head by
 * default (FalconConfig). */
ml_status ml__hf_map_falcon(const ml_node *r, ml_model *m, ml_error *err)
{
    /* alibi, new_decoder_architecture, parallel_attn: false,
     * num_ln_in_parallel_attn: 2 and bias: true are refused by the key
     * table before this runs */
    bool mq = true;
    uint64_t kv = 0;
    ml_status st;
    if ((st = ml__hf_activation(r, "activation", "falcon", m, err)) ||
        (st = ml__hf_bool(err, r, "multi_query", &mq)) ||
        (st = ml__hf_uint(err, r, KEYS("num_kv_heads"), false, 1, 1u << 20, &kv)) ||
        (st = ml__hf_uint(err, r, KEYS("ffn_hidden_size"), false, 1, 1u << 24, &m->mlp.ffn)))
        return st;
    /* FalconAttention: one key/value head with multi_query, else H
     * (num_kv_heads is read only then, and a value other than H fails in
     * its reshape) */
    m->attn.kv_heads = mq ? 1 : m->attn.heads;
    if (!mq && kv && kv != m->attn.heads)
        return ml__error_at(err, ml__tree_get(r, "num_kv_heads"), ML_SCHEMA,
                            "num_kv_heads: %llu with multi_query false: the old decoder "
                            "architecture has num_attention_heads (%llu) key/value heads",
                            (unsigned long long)kv, (unsigned long long)m->attn.heads);
    m->norms.kind = ML_NORM_LAYERNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_ROPE;
    m->residual.parallel = true;
    m->residual.shared_norm = true;
    m->norms.bias = true;
    m->bias = m->attn.qkv_bias = false;
    m->embed.tied = true;
    m->dropout = 0; /* hidden_dropout and attention_dropout > 0 are refused by the key table */
    return ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied);
}

/* The experts (key `count`) and the experts per token, both already
 * defaulted in m; at most as many per token as there are experts. */
static ml_status experts_of(const ml_node *r, const char *count, ml_model *m, ml_error *err)
{
    ml_status st;
    if ((st = ml__hf_uint(err, r, (const char *const[]){count, NULL}, false, 2, 4096,
                          &m->moe.experts)) ||
        (st = ml__hf_uint(err, r, KEYS("num_experts_per_tok"), false, 1, 4096, &m->moe.per_token)))
        return st;
    if (m->moe.per_token > m->moe.experts)
        return ml__error_at(err, ml__tree_get(r, "num_experts_per_tok"), ML_SCHEMA,
                            "num_experts_per_tok: %llu is more than %s (%llu)",
                            (unsigned long long)m->moe.per_token, count,
                            (unsigned long long)m->moe.experts);
    return ML_OK;
}

/* MixtralSparseMoeBlock (modeling_mixtral.py): num_local_experts SwiGLU
 * experts of intermediate_size (MixtralConfig's default 8), each token
 * routed to num_experts_per_tok of them (default 2); the rest of the layer
 * is Mistral's (hf.c). */
ml_status ml__hf_map_mixtral_experts(const ml_node *r, ml_model *m, ml_error *err)
{
    m->moe.experts = 8;
    m->moe.per_token = 2;
    m->moe.renorm = true; /* routing_weights /= routing_weights.sum(...) */
    return experts_of(r, "num_local_experts", m, err);
}

/* Qwen2MoeSparseMoeBlock (modeling_qwen2_moe.py; Qwen2MoeConfig's defaults):
 * num_experts (60) SwiGLU experts of moe_intermediate_size (1408), each
 * token routed to num_experts_per_tok (4) of them, the top-k weights
 * renormalised only with norm_topk_prob (false), and a shared expert of
 * shared_expert_intermediate_size (5632) on every token. Every layer is
 * sparse with decoder_sparse_step 1 and no mlp_only_layers; the key table
 * refuses the others. */
ml_status ml__hf_map_qwen2_moe_experts(const ml_node *r, ml_model *m, ml_error *err)
{
    m->moe.experts = 60;
    m->moe.per_token = 4;
    m->moe.expert_ffn = 1408;
    m->moe.shared_ffn = 5632;
    m->moe.renorm = false;
    m->moe.shared_gate = true; /* sigmoid(shared_expert_gate(x)) */
    ml_status st;
    if ((st = experts_of(r, "num_experts", m, err)) ||
        (st = ml__hf_uint(err, r, KEYS("moe_intermediate_size"), false, 1, ML_MAX_FFN,
                          &m->moe.expert_ffn)) ||
        (st = ml__hf_uint(err, r, KEYS("shared_expert_intermediate_size"), false, 1, ML_MAX_FFN,
                          &m->moe.shared_ffn)) ||
        (st = ml__hf_bool(err, r, "norm_topk_prob", &m->moe.renorm)) ||
        (st = ml__hf_bool(err, r, "qkv_bias", &m->attn.qkv_bias)))
        return st;
    return ML_OK;
}
