/* The Hugging Face import's Llama-layout families with a layer of their
 * own (hf.c calls them after the shared sizes): Gemma's norm, MLP and
 * embedding scale; Phi-3's fused projections. Every key they read is in the
 * key table (hf_keys.c); the block each maps to is docs/inventory.md's. */
#include <string.h>

#include "model/hf_read.h"
#include "model/model_internal.h"
#include "model/tree.h"

/* GemmaForCausalLM (modeling_gemma.py): Llama's attention (q, k, v, o_proj,
 * attention_bias, rotary, repeat_kv) with GemmaRMSNorm's (1 + weight) scale
 * in fp32, a GeGLU MLP, the embeddings times sqrt(hidden_size), a tied head
 * by default (GemmaConfig). */
ml_status ml__hf_map_gemma(const ml_node *r, ml_model *m, ml_error *err)
{
    /* transformers versions read hidden_activation (null: gelu_pytorch_tanh)
     * or hidden_act; exact and tanh GELU are the one F.gelu op, which saves
     * its input either way, so both keys must name one of the two */
    static const char *const act_keys[] = {"hidden_activation", "hidden_act"};
    ml_status st;
    for (size_t i = 0; i < 2; i++) {
        const char *v;
        if ((st = ml__hf_str(err, r, act_keys[i], &v)))
            return st;
        if (v && strcmp(v, "gelu") && strcmp(v, "gelu_pytorch_tanh"))
            return ml__error_at(err, ml__tree_get(r, act_keys[i]), ML_SCHEMA,
                                "%s: '%s' is not modelled for gemma (gelu or gelu_pytorch_tanh: "
                                "GeGLU)",
                                act_keys[i], v);
    }
    bool ab = false;
    m->mlp.activation = ML_ACT_GEGLU;
    m->norms.kind = ML_NORM_GEMMA_RMSNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_ROPE;
    m->bias = false;
    m->embed.scale = true;
    m->embed.tied = true;
    m->dropout = 0; /* attention_dropout > 0 is refused by the key table */
    if ((st = ml__hf_bool(err, r, "attention_bias", &ab)) ||
        (st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)))
        return st;
    m->attn.qkv_bias = m->attn.out_bias = ab;
    return ML_OK;
}

/* Gemma2ForCausalLM (modeling_gemma2.py): Gemma's layer with a norm on the
 * attention's and on the MLP's output (post_norms), the scores scaled by
 * query_pre_attn_scalar^-0.5 (a value), soft-capped scores and logits, and
 * a sliding window on the layers layer_types names (Gemma2Config: every
 * other one from the first). Gemma2Config's defaults: query_pre_attn_scalar
 * 256, attn_logit_softcapping 50, final_logit_softcapping 30,
 * sliding_window 4096; null: none. With eager attention the window only
 * changes the mask's values, so a sequence within it plans exactly and a
 * longer one is refused when planning (docs/hf.md). */
ml_status ml__hf_map_gemma2(const ml_node *r, ml_model *m, ml_error *err)
{
    ml_status st = ml__hf_map_gemma(r, m, err);
    if (st)
        return st;
    m->residual.post_norms = true;
    m->attn.scalar = 256;
    m->attn.softcap = 50;
    m->head.final_softcap = 30;
    uint64_t w = 4096;
    bool windowed = m->layers > 0;
    if ((st = ml__hf_positive(err, r, "query_pre_attn_scalar", &m->attn.scalar)) ||
        (st = ml__hf_positive(err, r, "attn_logit_softcapping", &m->attn.softcap)) ||
        (st = ml__hf_positive(err, r, "final_logit_softcapping", &m->head.final_softcap)) ||
        (st = ml__hf_layer_types(err, r, m->layers, &windowed)))
        return st;
    if (m->attn.scalar == 0)
        return ml__error_at(err, ml__tree_get(r, "query_pre_attn_scalar"), ML_SCHEMA,
                            "query_pre_attn_scalar: null is not a score scale; give a number "
                            "(head_dim for 1 / sqrt(head_dim))");
    const ml_node *n = ml__tree_get(r, "sliding_window");
    if (n && ml__hf_is_null(n))
        w = 0;
    else if ((st = ml__hf_uint(err, r, KEYS("sliding_window"), false, 1, 1ull << 40, &w)))
        return st;
    m->attn.sliding_window = windowed ? w : 0;
    return ML_OK;
}

/* Phi3ForCausalLM (modeling_phi3.py): Llama's RMSNorm, rotary attention
 * and SwiGLU MLP, but q, k and v come from one qkv_proj (sliced) and gate
 * and up from one gate_up_proj (chunked): the same parameters and bytes,
 * other storages (docs/inventory.md, "Phi-3 block"); no biases, untied by
 * default (Phi3Config). The dropouts are refused unless 0 by the key table;
 * sliding_window (default null) refuses longer sequences when planning. */
ml_status ml__hf_map_phi3(const ml_node *r, ml_model *m, ml_error *err)
{
    const char *act;
    ml_status st = ml__hf_str(err, r, "hidden_act", &act);
    if (st)
        return st;
    if (act && strcmp(act, "silu"))
        return ml__error_at(err, ml__tree_get(r, "hidden_act"), ML_SCHEMA,
                            "hidden_act: '%s' is not modelled for phi3 (silu: SwiGLU)", act);
    m->mlp.activation = ML_ACT_SWIGLU;
    m->norms.kind = ML_NORM_RMSNORM;
    m->residual.prenorm = true;
    m->embed.position = ML_POS_ROPE;
    m->bias = m->attn.qkv_bias = m->attn.out_bias = false;
    m->attn.fused_proj = true;
    m->embed.tied = false;
    m->dropout = 0;
    uint64_t w = 0;
    if ((st = ml__hf_bool(err, r, "tie_word_embeddings", &m->embed.tied)))
        return st;
    if (!ml__hf_is_null(ml__tree_get(r, "sliding_window")) &&
        (st = ml__hf_uint(err, r, KEYS("sliding_window"), false, 1, 1ull << 40, &w)))
        return st;
    m->attn.sliding_window = w;
    return ML_OK;
}
