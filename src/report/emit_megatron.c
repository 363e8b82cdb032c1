/* --emit megatron: the plan's settings as Megatron-LM's pretrain_gpt.py
 * arguments (docs/parallel.md, "Settings out"). Every flag written is one
 * megatron/training/arguments.py defines (tests/data/megatron-arguments.txt,
 * read at the commit it names; tests/unit/test_emit_megatron.c checks). The
 * data, the tokenizer, the learning rate and the iterations are the user's. */
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "model/model_internal.h"
#include "report/emit_internal.h"
#include "report/report_internal.h"

static uint64_t micro_batches(const ml_training *t)
{
    return t->grad_accum ? t->grad_accum : 1;
}

/* An uneven split Megatron's flags express: one virtual stage, the middle
 * stages' layers all equal (the first and the last set apart). */
static bool first_last_split(const ml_training *t)
{
    if (t->virtual_stages > 1 || t->npp_layers < 2)
        return false;
    for (uint32_t i = 2; i + 1 < t->npp_layers; i++)
        if (t->pp_layers[i] != t->pp_layers[1])
            return false;
    return true;
}

void ml__emit_megatron_check(ml_emit_verdict *v, const ml_model *m, const ml_config *cfg)
{
    const ml_training *t = &cfg->training;
    if (!m || m->type != ML_MODEL_DECODER || m->vision.layers || m->embed.image_size ||
        m->attn.kv_lora)
        ml__emit_refuse(v, "pretrain_gpt.py trains a decoder language model (GPT's or Llama's "
                           "layout, with Mixtral's experts or without); this model is another");
    else if (m->moe.experts &&
             (m->moe.router_sigmoid || m->moe.sort || m->moe.dense_layers))
        ml__emit_refuse(v, "DeepSeek's routers and dense first layers are not emitted: the "
                           "experts written are Mixtral's and Qwen2-MoE's (softmax top-k)");
    else if (!ml__emit_is_master(t->precision) && t->precision != ML_PREC_FP32)
        ml__emit_refuse(v, "Megatron trains in fp32 (no precision flag) or a bf16 or fp16 "
                           "model with fp32 master weights (--bf16, --fp16): plan precision "
                           "fp32, bf16-master or fp16-master");
    else if (m->mlp.activation != ML_ACT_GELU && m->mlp.activation != ML_ACT_SWIGLU)
        ml__emit_refuse(v, "Megatron's MLP is GeLU or SwiGLU (--swiglu)");
    else if (m->mlp.gelu_new)
        ml__emit_refuse(v, "gelu_new is Hugging Face's composite of elementwise ops, planned "
                           "with what each of them saves; Megatron's tanh GeLU (--openai-gelu) "
                           "is one fused function (gelu_impl, @jit_fuser) that saves other "
                           "tensors, and its default is F.gelu: plan activation: gelu to emit "
                           "Megatron's default");
    else if (m->norms.kind != ML_NORM_LAYERNORM && m->norms.kind != ML_NORM_RMSNORM)
        ml__emit_refuse(v, "Megatron normalizes with LayerNorm or RMSNorm");
    else if (m->residual.parallel || m->residual.post_norms || !m->residual.prenorm)
        ml__emit_refuse(v, "Megatron's GPT layer is pre-norm and sequential");
    else if (t->zero >= 2 || t->offload != ML_OFFLOAD_NONE)
        ml__emit_refuse(v, "Megatron shards the optimizer states (--use-distributed-optimizer, "
                           "ZeRO stage 1), not the gradients or parameters, and offloads "
                           "nothing here: plan zero 0 or 1 without offload");
    else if (t->optimizer != ML_OPT_ADAM && t->optimizer != ML_OPT_ADAMW &&
             t->optimizer != ML_OPT_SGD && t->optimizer != ML_OPT_SGD_MOMENTUM)
        ml__emit_refuse(v, "Megatron's optimizers are adam (decoupled weight decay) and sgd");
    else if (t->pp_schedule == ML_PP_GPIPE)
        ml__emit_refuse(v, "Megatron runs 1F1B (interleaved with virtual stages), not GPipe");
    else if (t->npp_layers && !first_last_split(t))
        ml__emit_refuse(v, "this uneven split of the layers is not emitted: Megatron sets only "
                           "the first and last stages' (--decoder-first-pipeline-num-layers, "
                           "--decoder-last-pipeline-num-layers), the middle ones even");
    else if (t->checkpoint.kind != ML_CKPT_NONE && t->checkpoint.kind != ML_CKPT_FULL &&
             t->checkpoint.kind != ML_CKPT_EVERY && t->checkpoint.kind != ML_CKPT_SELECTIVE)
        ml__emit_refuse(v, "Megatron recomputes the attention core (selective) or uniform "
                           "groups of layers: plan none, selective, full or every-K");
    if (v->level == ML_EMIT_REFUSED)
        return;
    if (t->engine != ML_ENGINE_MEGATRON)
        ml__emit_note(v, "the plan is of eager PyTorch's layers; Megatron runs its own (plan "
                         "with --engine megatron for its GPT layer)");
    if (m->attn.kernel == ML_ATTN_SDPA)
        ml__emit_note(v, "the plan's attention is sdpa, which Megatron does not run: "
                         "--attention-backend auto picks a fused kernel");
    if (t->context_parallel > 1)
        ml__emit_note(v, "the plan's context parallelism is PyTorch's ring attention; "
                         "Megatron's (--context-parallel-size) runs Transformer Engine's, "
                         "whose buffers differ");
    if (t->eval_batch)
        ml__emit_note(v, "the plan has an evaluation pass (batch %llu); Megatron evaluates "
                         "--eval-iters batches of --micro-batch-size every --eval-interval, "
                         "through the pipeline's forward-only schedule",
                      (unsigned long long)t->eval_batch);
    if (m->moe.experts)
        ml__emit_note(v, "the plan's experts are Hugging Face's SwiGLU modules, each output "
                         "weighted after w2; Megatron's SequentialMLP weights inside its fused "
                         "SwiGLU (weighted_bias_swiglu_impl), which keeps the fc1 output and "
                         "the weights instead (megatron/core/transformer/mlp.py)");
}

static void flag(FILE *f, const char *name, const char *fmt, unsigned long long v)
{
    fprintf(f, "%s", name);
    if (fmt)
        fprintf(f, fmt, v);
    fputs(" \\\n", f);
}

static void model_flags(FILE *f, const ml_model *m, const ml_training *t)
{
    const uint64_t dh = m->attn.head_dim ? m->attn.head_dim : m->hidden / m->attn.heads;
    flag(f, "--num-layers", " %llu", m->layers);
    flag(f, "--hidden-size", " %llu", m->hidden);
    flag(f, "--ffn-hidden-size", " %llu", m->mlp.ffn);
    flag(f, "--num-attention-heads", " %llu", m->attn.heads);
    if (dh * m->attn.heads != m->hidden)
        flag(f, "--kv-channels", " %llu", dh);
    if (m->attn.kv_heads && m->attn.kv_heads != m->attn.heads) {
        flag(f, "--group-query-attention", NULL, 0);
        flag(f, "--num-query-groups", " %llu", m->attn.kv_heads);
    }
    flag(f, "--seq-length", " %llu", t->seq_len);
    const bool rope = m->embed.position == ML_POS_ROPE;
    flag(f, "--max-position-embeddings", " %llu",
         !rope && m->embed.max_positions ? m->embed.max_positions : t->seq_len);
    fprintf(f, "--position-embedding-type %s \\\n", rope ? "rope" : "learned_absolute");
    fprintf(f, "--normalization %s \\\n",
            m->norms.kind == ML_NORM_RMSNORM ? "RMSNorm" : "LayerNorm");
    if (m->mlp.activation == ML_ACT_SWIGLU)
        flag(f, "--swiglu", NULL, 0);
    if (!m->bias) {
        flag(f, "--disable-bias-linear", NULL, 0);
        if (m->attn.qkv_bias) /* Qwen2's: biases on q, k and v only */
            flag(f, "--add-qkv-bias", NULL, 0);
    }
    if (!m->embed.tied)
        flag(f, "--untie-embeddings-and-output-weights", NULL, 0);
    fprintf(f, "--attention-dropout %g \\\n--hidden-dropout %g \\\n", m->dropout, m->dropout);
    flag(f, "--vocab-size", " %llu", m->embed.vocab);
    /* the planned rank's slice of the vocabulary: padded to tp, no more */
    flag(f, "--make-vocab-size-divisible-by", " %llu", 1);
    const char *backend = m->attn.kernel == ML_ATTN_FLASH   ? "flash"
                          : m->attn.kernel == ML_ATTN_EAGER ? "unfused"
                                                            : "auto";
    fprintf(f, "--attention-backend %s \\\n", backend);
}

/* Mixtral's and Qwen2-MoE's experts (megatron/core/transformer/moe): the
 * router's softmax over the top-k logits (Megatron's default) is
 * Mixtral's softmax, top-k and renormalisation; without the
 * renormalisation (Qwen2-MoE's norm_topk_prob false) the softmax comes
 * first (--moe-router-pre-softmax). The dispatch the plan models is the
 * all-to-all (the default is allgather), over the expert-parallel and
 * expert-tensor-parallel ranks. */
static void moe_flags(FILE *f, const ml_model *m, const ml_training *t)
{
    if (!m->moe.experts)
        return;
    flag(f, "--num-experts", " %llu", m->moe.experts);
    flag(f, "--moe-router-topk", " %llu", m->moe.per_token);
    if (!m->moe.renorm)
        flag(f, "--moe-router-pre-softmax", NULL, 0);
    flag(f, "--moe-ffn-hidden-size", " %llu", m->moe.expert_ffn ? m->moe.expert_ffn : m->mlp.ffn);
    if (m->moe.shared_ffn) {
        flag(f, "--moe-shared-expert-intermediate-size", " %llu", m->moe.shared_ffn);
        if (m->moe.shared_gate)
            flag(f, "--moe-shared-expert-gate", NULL, 0);
    }
    fputs("--moe-token-dispatcher-type alltoall \\\n", f);
    flag(f, "--expert-model-parallel-size", " %llu", ml_training_ep(t));
    /* (arguments.py gives tp when it is not set: written out either way) */
    flag(f, "--expert-tensor-parallel-size", " %llu", ml_training_etp(t));
    if (t->expert_capacity > 0) {
        fprintf(f, "--moe-expert-capacity-factor %g \\\n", t->expert_capacity);
        if (t->expert_pad)
            flag(f, "--moe-pad-expert-input-to-capacity", NULL, 0);
    }
}

static void training_flags(FILE *f, const ml_training *t)
{
    const uint64_t tp = t->tensor_parallel > 1 ? t->tensor_parallel : 1;
    const uint64_t pp = t->pipeline_parallel > 1 ? t->pipeline_parallel : 1;
    flag(f, "--micro-batch-size", " %llu", t->micro_batch);
    flag(f, "--global-batch-size", " %llu", t->micro_batch * micro_batches(t) * t->data_parallel);
    flag(f, "--tensor-model-parallel-size", " %llu", tp);
    if (ml_training_sp(t))
        flag(f, "--sequence-parallel", NULL, 0);
    flag(f, "--pipeline-model-parallel-size", " %llu", pp);
    /* (validate_args in megatron/training/arguments.py resets
     * --virtual-pipeline-model-parallel-size unless the virtual stages come
     * from this flag, --num-layers-per-virtual-pipeline-stage or a layout) */
    if (pp > 1 && t->virtual_stages > 1)
        flag(f, "--num-virtual-stages-per-pipeline-rank", " %llu", t->virtual_stages);
    if (t->context_parallel > 1)
        flag(f, "--context-parallel-size", " %llu", t->context_parallel);
    if (t->npp_layers >= 2) { /* first_last_split */
        flag(f, "--decoder-first-pipeline-num-layers", " %llu", t->pp_layers[0]);
        flag(f, "--decoder-last-pipeline-num-layers", " %llu", t->pp_layers[t->npp_layers - 1]);
    }
    /* fp32: neither flag (arguments.py: params_dtype torch.float unless
     * --fp16 or --bf16) */
    if (t->precision != ML_PREC_FP32)
        flag(f, t->precision == ML_PREC_FP16_MASTER ? "--fp16" : "--bf16", NULL, 0);
    /* the gradients reduce, and the states shard, over dp x cp ranks */
    const uint64_t dpc = t->data_parallel * ml_training_cp(t);
    if (t->dist_optimizer || (t->zero == 1 && dpc > 1))
        flag(f, "--use-distributed-optimizer", NULL, 0);
    if (t->overlap_grad_reduce && dpc > 1)
        flag(f, "--overlap-grad-reduce", NULL, 0);
    /* its shards over groups of dp_shard ranks: dp / dp_shard instances */
    if (ml_training_shard(t) < t->data_parallel)
        flag(f, "--num-distributed-optimizer-instances", " %llu",
             t->data_parallel / ml_training_shard(t));
    fprintf(f, "--optimizer %s", t->optimizer == ML_OPT_SGD || t->optimizer ==
                                         ML_OPT_SGD_MOMENTUM ? "sgd" : "adam");
    /* Megatron's SGD keeps a momentum buffer unless told 0 (--sgd-momentum
     * defaults to 0.9, megatron/training/arguments.py): plain SGD has none */
    if (t->optimizer == ML_OPT_SGD)
        fputs(" \\\n--sgd-momentum 0", f);
    if (t->checkpoint.kind == ML_CKPT_SELECTIVE)
        fputs(" \\\n--recompute-granularity selective", f);
    else if (t->checkpoint.kind == ML_CKPT_FULL || t->checkpoint.kind == ML_CKPT_EVERY)
        fprintf(f, " \\\n--recompute-granularity full \\\n--recompute-method uniform \\\n"
                   "--recompute-num-layers %u",
                t->checkpoint.kind == ML_CKPT_EVERY ? t->checkpoint.every : 1);
    fputc('\n', f);
}

int ml__emit_megatron(FILE *f, const ml_model *m, const ml_config *cfg, const ml_emit_verdict *v)
{
    const ml_training *t = &cfg->training;
    fputs("# Megatron-LM pretrain_gpt.py arguments for ", f);
    ml__emit_comment_text(f, ml_model_name(m));
    fprintf(f, " (memledger's plan: %llu devices)\n",
            (unsigned long long)ml__training_devices(t));
    fputs("# the data, tokenizer, learning rate and iterations are yours to add\n", f);
    ml__emit_note_comments(f, v);
    model_flags(f, m, t);
    moe_flags(f, m, t);
    training_flags(f, t);
    return ferror(f) ? -1 : 0;
}
