/* --emit torchtitan: the plan's settings as a torchtitan job config (TOML),
 * in the form its latest release takes (v0.2.2, commit 73a0e697:
 * torchtitan/config/job_config.py; docs/parallel.md, "Settings out"). Every
 * key written is one JobConfig defines (tests/data/torchtitan-job-config.txt,
 * made by scripts/torchtitan-job-config.py; tests/unit/test_emit_torchtitan.c
 * checks): an unknown key is an error there (config/manager.py). The
 * dataset, tokenizer, learning rate and steps are the user's. */
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "model/model_internal.h"
#include "report/emit_internal.h"
#include "report/report_internal.h"

/* torchtitan's llama3 flavors (models/llama3/__init__.py at v0.2.2), with
 * the FFN width its model computes from multiple_of and ffn_dim_multiplier
 * (model.py: 2·4·dim/3, times the multiplier, rounded up to multiple_of). */
typedef struct {
    const char *name;
    uint64_t dim, layers, heads, kv_heads, vocab, ffn;
} tt_flavor;

static const tt_flavor flavors[] = {
    {"debugmodel", 256, 6, 16, 16, 2048, 768},
    {"8B", 4096, 32, 32, 8, 128256, 14336},
    {"70B", 8192, 80, 64, 8, 128256, 28672},
    {"405B", 16384, 126, 128, 8, 128256, 53248},
};

static const tt_flavor *flavor_of(const ml_model *m)
{
    const uint64_t kv = m->attn.kv_heads ? m->attn.kv_heads : m->attn.heads;
    for (size_t i = 0; i < sizeof flavors / sizeof *flavors; i++) {
        const tt_flavor *f = &flavors[i];
        if (f->dim == m->hidden && f->layers == m->layers && f->heads == m->attn.heads &&
            f->kv_heads == kv && f->vocab == m->embed.vocab && f->ffn == m->mlp.ffn)
            return f;
    }
    return NULL;
}

/* FSDP runs (parallel_dims.py: dp_shard > 1 or cp > 1) */
static bool fsdp(const ml_training *t)
{
    return (t->zero == 3 && ml_training_shard(t) > 1) || ml_training_cp(t) > 1;
}

static uint64_t tp_of(const ml_training *t)
{
    return t->tensor_parallel > 1 ? t->tensor_parallel : 1;
}

static uint64_t pp_of(const ml_training *t)
{
    return t->pipeline_parallel > 1 ? t->pipeline_parallel : 1;
}

/* The every-N-th-layer rule of selective_ac_option "N"
 * (distributed/activation_checkpoint.py: a counter, incremented before
 * the test, wraps block i when (i + 1) % N == 0): N when the plan
 * checkpoints exactly those layers, each alone; 1: all of them (full); 0:
 * none; -1: another set. */
static long every_nth(const ml_ledger *l)
{
    long first = -1, count = 0, layers = 0, n = 0;
    for (size_t i = 0; i < ml_ledger_block_count(l); i++) {
        const ml_block_info *b = ml_ledger_block(l, i);
        if (b->ckpt_index < 0)
            continue;
        layers++;
        if (!b->checkpointed)
            continue;
        if (i > 0 && ml_ledger_block(l, i - 1)->checkpointed &&
            ml_ledger_block(l, i - 1)->segment == b->segment)
            return -1; /* two layers in one segment */
        if (first < 0)
            first = b->ckpt_index;
        count++;
    }
    if (!count)
        return 0;
    n = first + 1;
    for (size_t i = 0; i < ml_ledger_block_count(l); i++) {
        const ml_block_info *b = ml_ledger_block(l, i);
        if (b->ckpt_index >= 0 && b->checkpointed != ((b->ckpt_index + 1) % n == 0))
            return -1;
    }
    return count == layers ? 1 : n;
}

static void precision_check(ml_emit_verdict *v, const ml_training *t)
{
    const bool sharded = fsdp(t), split = tp_of(t) > 1 || pp_of(t) > 1;
    switch (t->precision) {
    case ML_PREC_FP32:
        ml__emit_refuse(v, "in fp32 torchtitan's sdpa runs its math kernel (it allows cuDNN, "
                           "flash and math, models/attention.py; the first two take no fp32), "
                           "whose saved tensors the plan does not model for its layer: plan "
                           "bf16-master, amp-bf16 or bf16");
        return;
    case ML_PREC_BF16:
        if (sharded)
            ml__emit_note(v, "FSDP reduce-scatters a block's gradients in fp32 "
                             "(mixed_precision_reduce), a copy the plan leaves out");
        return;
    case ML_PREC_BF16_MASTER:
        if (!sharded)
            ml__emit_refuse(v, "torchtitan keeps an fp32 copy of bf16 weights only as FSDP's "
                               "sharded parameters (training.mixed_precision_param): plan "
                               "--zero 3 over a shard group above one rank (--dp-shard), or "
                               "precision %s",
                            split ? "bf16" : "amp-bf16");
        else
            ml__emit_note(v, "FSDP keeps the sharded parameters and their gradients in fp32 "
                             "and gathers bf16 copies to compute (the plan's bf16 shards and "
                             "fp32 master hold as many bytes); it reduce-scatters a block's "
                             "gradients in fp32, a copy the plan leaves out");
        return;
    case ML_PREC_AMP_BF16:
        if (sharded)
            ml__emit_refuse(v, "under FSDP torchtitan computes in bf16 through FSDP's mixed "
                               "precision (bf16 weights gathered), not autocast: plan "
                               "bf16-master");
        else if (split)
            ml__emit_refuse(v, "with tensor or pipeline parallelism and no FSDP torchtitan "
                               "turns mixed precision off (distributed/utils.py, "
                               "maybe_enable_amp): plan bf16, or --zero 3");
        return;
    default:
        ml__emit_refuse(v, "torchtitan trains in fp32, bf16 (training.dtype) or bf16 mixed "
                           "precision, not fp16");
    }
}

static void sharding_check(ml_emit_verdict *v, const ml_training *t)
{
    const uint64_t dp = t->data_parallel ? t->data_parallel : 1;
    if (t->dist_optimizer || t->zero == 1 || t->zero == 2)
        ml__emit_refuse(v, "torchtitan shards with FSDP (ZeRO stage 3: parameters, gradients "
                           "and states) or replicates (DDP), nothing between: plan --zero 3 "
                           "or 0");
    else if (t->offload != ML_OFFLOAD_NONE)
        ml__emit_refuse(v, "torchtitan's CPU offload (training.enable_cpu_offload) moves "
                           "parameters, gradients and states together, which the plan does "
                           "not model: plan without offload");
    else if (t->zero == 0 && ml_training_cp(t) > 1)
        ml__emit_refuse(v, "with context parallelism torchtitan shards the parameters over "
                           "dp x cp with FSDP: plan --zero 3");
    else if (t->zero == 3 && !fsdp(t) && dp > 1)
        ml__emit_refuse(v, "a shard group of one rank is torchtitan's DDP (FSDP runs where "
                           "data_parallel_shard_degree or cp is above 1, parallel_dims.py), "
                           "whose memory is not ZeRO 3's: plan --zero 0, or --dp-shard above 1");
    else if (!fsdp(t) && dp > 1 && (tp_of(t) > 1 || pp_of(t) > 1))
        ml__emit_refuse(v, "torchtitan's DDP runs alone, not with tensor or pipeline "
                           "parallelism (parallelize.py: 'DDP has not supported > 1D "
                           "parallelism'): plan --zero 3");
    else if (!fsdp(t) && dp > 1)
        ml__emit_note(v, "torchtitan's DDP buckets the gradients by 100 MB (bucket_cap_mb), "
                         "the plan by PyTorch's default 25 MB");
}

static void layout_check(ml_emit_verdict *v, const ml_model *m, const ml_training *t)
{
    const uint64_t tp = tp_of(t), pp = pp_of(t), cp = ml_training_cp(t);
    if (tp > 1 && !ml_training_sp(t))
        ml__emit_refuse(v, "torchtitan's tensor parallelism always shards the norms over the "
                           "sequence (SequenceParallel): plan with --sp on");
    else if (t->seq_len % (2 * tp * cp))
        ml__emit_refuse(v, "torchtitan asserts seq_len %% (2 x tp x cp) == 0 "
                           "(parallelize.py): %llu is not a multiple of %llu",
                        (unsigned long long)t->seq_len, (unsigned long long)(2 * tp * cp));
    else if (pp > 1 && t->pp_schedule == ML_PP_INTERLEAVED && t->virtual_stages < 2)
        ml__emit_refuse(v, "an interleaved schedule needs two virtual stages or more");
    else if (pp > 1 && !t->npp_layers && m->layers % (pp * (t->virtual_stages > 1
                                                                 ? t->virtual_stages : 1)))
        ml__emit_refuse(v, "the layers do not split evenly over the stages");
    else if (pp > 1 && t->npp_layers && t->virtual_stages > 1)
        ml__emit_refuse(v, "an uneven split with virtual stages is not emitted");
}

/* Ahead of the ledger: the checks that need only the plan's settings. */
void ml__emit_torchtitan_check(ml_emit_verdict *v, const ml_model *m, const ml_config *cfg,
                               const ml_ledger *l)
{
    const ml_training *t = &cfg->training;
    if (!m || m->type != ML_MODEL_DECODER || m->vision.layers || m->embed.image_size ||
        m->moe.experts || m->attn.kv_lora)
        ml__emit_refuse(v, "torchtitan's llama3 is a dense decoder language model; this model "
                           "is another");
    else if (m->norms.kind != ML_NORM_RMSNORM || m->mlp.activation != ML_ACT_SWIGLU ||
             m->embed.position != ML_POS_ROPE || m->bias || m->attn.qkv_bias || m->embed.tied ||
             m->residual.parallel || m->residual.post_norms || !m->residual.prenorm ||
             m->attn.sliding_window || m->attn.softcap > 0 ||
             (m->attn.head_dim && m->attn.head_dim * m->attn.heads != m->hidden))
        ml__emit_refuse(v, "torchtitan's llama3 layer is Llama's (RMSNorm pre-norm, rotary, "
                           "SwiGLU, no biases, untied embeddings, head size hidden/heads, "
                           "full causal attention: no sliding window, no logit softcap, "
                           "no parallel residual or post-norms); this model's differs");
    else if (m->attn.kernel == ML_ATTN_EAGER)
        ml__emit_refuse(v, "torchtitan's llama3 attends with sdpa (attn_type), whose saved "
                           "tensors are not eager attention's: plan with attention sdpa");
    else if (t->engine != ML_ENGINE_EAGER)
        ml__emit_refuse(v, "torchtitan runs its own llama3 modules, not Megatron's layer: "
                           "plan --engine eager");
    else if (t->optimizer != ML_OPT_ADAM && t->optimizer != ML_OPT_ADAMW)
        ml__emit_refuse(v, "torchtitan's optimizers are Adam and AdamW "
                           "(components/optimizer.py)");
    else if (t->pp_schedule == ML_PP_GPIPE && pp_of(t) > 1 && t->virtual_stages > 1)
        ml__emit_refuse(v, "GPipe runs one stage per rank");
    if (v->level != ML_EMIT_REFUSED)
        sharding_check(v, t);
    if (v->level != ML_EMIT_REFUSED)
        precision_check(v, t);
    if (v->level != ML_EMIT_REFUSED)
        layout_check(v, m, t);
    if (v->level == ML_EMIT_REFUSED)
        return;
    const long nth = l ? every_nth(l) : -1;
    if (t->checkpoint.kind == ML_CKPT_SELECTIVE)
        ml__emit_refuse(v, "torchtitan's selective checkpointing wraps every N-th layer or "
                           "saves a list of ops' outputs, not the attention core alone: plan "
                           "none, full or a list of every N-th layer");
    else if (nth < 0 || (pp_of(t) > 1 && nth > 1))
        ml__emit_refuse(v, "torchtitan checkpoints all layers, none, or every N-th layer "
                           "each alone (selective_ac_option N: layers N-1, 2N-1, ...; with "
                           "pipeline parallelism all or none): this plan's segments are "
                           "others");
    else if (t->logits == ML_LOGITS_FUSED)
        ml__emit_refuse(v, "torchtitan's loss is the plain cross-entropy over the logits cast "
                           "to fp32 (components/loss.py), not a fused linear cross-entropy: "
                           "plan --logits released");
    if (v->level == ML_EMIT_REFUSED)
        return;
    if (t->logits == ML_LOGITS_KEPT || t->logits == ML_LOGITS_THROUGH_BACKWARD)
        ml__emit_note(v, "the plan keeps the logits %s (--logits %s); torchtitan drops them "
                         "before the backward (train.py: del pred): plan --logits released",
                      t->logits == ML_LOGITS_KEPT ? "to the iteration's end" : "through the backward",
                      ml_logits_name(t->logits));
    if (tp_of(t) > 1)
        ml__emit_note(v, "torchtitan's tensor parallelism gathers the sequence before the "
                         "column-parallel linears (PrepareModuleInput), which then save the "
                         "whole B x T x D input; the plan saves the shard");
    if (t->zero_grad == ML_ZERO_GRAD_ZERO)
        ml__emit_note(v, "torchtitan frees the gradients after the step (zero_grad to none); "
                         "the plan keeps them zeroed (--zero-grad zero)");
    if (t->eval_batch)
        ml__emit_note(v, "the plan has an evaluation pass; torchtitan validates only with "
                         "[validation] enable = true, its own batch and frequency");
    if (!flavor_of(m))
        ml__emit_note(v, "no llama3 flavor of torchtitan's has this model's sizes: register "
                         "one named \"memledger\" in torchtitan/models/llama3/__init__.py "
                         "(the sizes are in the comments)");
    ml__emit_note(v, "the plan is of Hugging Face's Llama layer; torchtitan runs its own "
                     "llama3 modules (the same products; its rotary and norms may save "
                     "other tensors)");
    if (cfg->device.allocator == ML_ALLOCATOR_CACHING)
        ml__emit_note(v, "torchtitan's run_train.sh launches with "
                         "PYTORCH_ALLOC_CONF=expandable_segments:True; the plan assumed "
                         "PyTorch's default caching allocator (plan --allocator expandable "
                         "for what run_train.sh runs)");
}

static void model_section(FILE *f, const ml_model *m)
{
    const tt_flavor *fl = flavor_of(m);
    fputs("\n[model]\nname = \"llama3\"\n", f);
    if (fl) {
        fprintf(f, "flavor = \"%s\"\n", fl->name);
        return;
    }
    const uint64_t kv = m->attn.kv_heads ? m->attn.kv_heads : m->attn.heads;
    /* model.py's width without a multiplier: 2·4·dim/3 up to multiple_of */
    const uint64_t h = 8 * m->hidden / 3, up = (h + 255) / 256 * 256;
    /* at or above h, multiple_of the width itself rounds h up to it */
    char mo[48];
    snprintf(mo, sizeof mo, "multiple_of=%llu", (unsigned long long)m->mlp.ffn);
    fprintf(f,
            "# no flavor of torchtitan's has these sizes: register one in\n"
            "# torchtitan/models/llama3/__init__.py, llama3_args[\"memledger\"]:\n"
            "#   TransformerModelArgs(dim=%llu, n_layers=%llu, n_heads=%llu, n_kv_heads=%llu,\n"
            "#       vocab_size=%llu, %s)\n"
            "#   (its FFN width, model.py: %llu)\n"
            "flavor = \"memledger\"\n",
            (unsigned long long)m->hidden, (unsigned long long)m->layers,
            (unsigned long long)m->attn.heads, (unsigned long long)kv,
            (unsigned long long)m->embed.vocab,
            up == m->mlp.ffn ? "multiple_of=256"
            : m->mlp.ffn >= h ? mo
                              : "ffn_dim_multiplier and multiple_of to reach it",
            (unsigned long long)m->mlp.ffn);
}

static void training_section(FILE *f, const ml_training *t)
{
    const uint64_t dp = t->data_parallel ? t->data_parallel : 1;
    const uint64_t accum = t->grad_accum ? t->grad_accum : 1;
    /* a pipeline's micro-batches are one local batch it splits; without a
     * pipeline, torchtitan accumulates global / (local x dp) of them */
    const uint64_t local = pp_of(t) > 1 ? t->micro_batch * accum : t->micro_batch;
    fprintf(f, "\n[training]\nlocal_batch_size = %llu\nglobal_batch_size = %llu\nseq_len = %llu\n",
            (unsigned long long)local, (unsigned long long)(t->micro_batch * accum * dp),
            (unsigned long long)t->seq_len);
    if (t->precision == ML_PREC_BF16)
        fputs("dtype = \"bfloat16\"\n", f);
    else
        fprintf(f, "mixed_precision_param = \"%s\"\n",
                t->precision == ML_PREC_FP32 ? "float32" : "bfloat16");
}

static void pipeline_keys(FILE *f, const ml_model *m, const ml_training *t)
{
    const uint64_t pp = pp_of(t), v = t->virtual_stages > 1 ? t->virtual_stages : 1;
    fprintf(f, "pipeline_parallel_degree = %llu\n", (unsigned long long)pp);
    if (pp == 1)
        return;
    fprintf(f, "pipeline_parallel_schedule = \"%s\"\n",
            t->pp_schedule == ML_PP_GPIPE         ? "GPipe"
            : t->pp_schedule == ML_PP_INTERLEAVED ? "Interleaved1F1B"
                                                  : "1F1B");
    fprintf(f, "pipeline_parallel_microbatch_size = %llu\n", (unsigned long long)t->micro_batch);
    if (!t->npp_layers) {
        /* the layers even over the stages: no layer's worth of weight for
         * the embedding or the head (pipeline_parallel.py,
         * generate_llm_fqn_per_model_part) */
        fputs("pipeline_parallel_first_stage_less_layers = 0\n"
              "pipeline_parallel_last_stage_less_layers = 0\n", f);
        fprintf(f, "pipeline_parallel_layers_per_stage = %llu\n",
                (unsigned long long)(m->layers / (pp * v)));
        return;
    }
    /* an uneven split, stage by stage */
    fputs("module_fqns_per_model_part = [\n", f);
    uint64_t first = 0;
    for (uint32_t s = 0; s < t->npp_layers; s++) {
        fputs("  [", f);
        if (s == 0)
            fputs("\"tok_embeddings\", ", f);
        for (uint32_t i = 0; i < t->pp_layers[s]; i++)
            fprintf(f, "%s\"layers.%llu\"", i ? ", " : "", (unsigned long long)(first + i));
        first += t->pp_layers[s];
        if (s + 1 == t->npp_layers)
            fputs(", \"norm\", \"output\"", f);
        fputs(s + 1 < t->npp_layers ? "],\n" : "],\n]\n", f);
    }
}

static void parallelism_section(FILE *f, const ml_model *m, const ml_training *t)
{
    const uint64_t dp = t->data_parallel ? t->data_parallel : 1;
    const uint64_t shard = t->zero == 3 ? ml_training_shard(t) : 1;
    fprintf(f, "\n[parallelism]\ndata_parallel_replicate_degree = %llu\n"
               "data_parallel_shard_degree = %llu\n",
            (unsigned long long)(dp / shard), (unsigned long long)shard);
    /* the plan frees a block's gathered parameters after its forward (the
     * head's too): torchtitan's "default" keeps the head's, and every
     * block's under a pipeline */
    if (fsdp(t))
        fputs("fsdp_reshard_after_forward = \"always\"\n", f);
    fprintf(f, "tensor_parallel_degree = %llu\n", (unsigned long long)tp_of(t));
    pipeline_keys(f, m, t);
    fprintf(f, "context_parallel_degree = %llu\n", (unsigned long long)ml_training_cp(t));
}

static void checkpoint_section(FILE *f, long nth)
{
    fputs("\n[activation_checkpoint]\n", f);
    if (nth == 0)
        fputs("mode = \"none\"\n", f);
    else if (nth == 1)
        fputs("mode = \"full\"\n", f);
    else
        fprintf(f, "mode = \"selective\"\nselective_ac_option = \"%ld\"\n", nth);
}

/* s (UTF-8, as the loaders read it) inside a TOML basic string: quotes
 * and backslashes escaped, control characters as \u00XX, the rest as is */
static void toml_text(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\')
            fprintf(f, "\\%c", *p);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(f, "\\u%04x", *p);
        else
            fputc(*p, f);
    }
}

int ml__emit_torchtitan(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                        const ml_emit_verdict *v)
{
    const ml_training *t = &cfg->training;
    fputs("# torchtitan job config (v0.2.2) for ", f);
    ml__emit_comment_text(f, ml_model_name(m));
    fprintf(f, " (memledger's plan: %llu devices)\n",
            (unsigned long long)ml__training_devices(t));
    fputs("# run on one node: CONFIG_FILE=this.toml NGPU=<devices> ./run_train.sh; on several,\n"
          "# torchrun --nnodes N --nproc_per_node G ... -m torchtitan.train "
          "--job.config_file this.toml\n"
          "# the dataset, tokenizer (model.hf_assets_path), learning rate and steps are yours "
          "to add\n",
          f);
    ml__emit_note_comments(f, v);
    fputs("\n[job]\ndescription = \"", f);
    toml_text(f, ml_model_name(m));
    fputs(", planned by memledger\"\n", f);
    model_section(f, m);
    fprintf(f, "\n[optimizer]\nname = \"%s\"\nimplementation = \"%s\"\n",
            t->optimizer == ML_OPT_ADAM ? "Adam" : "AdamW",
            t->optimizer_impl == ML_IMPL_FUSED     ? "fused"
            : t->optimizer_impl == ML_IMPL_FOREACH ? "foreach"
                                                   : "for-loop");
    training_section(f, t);
    parallelism_section(f, m, t);
    checkpoint_section(f, every_nth(l));
    return ferror(f) ? -1 : 0;
}
