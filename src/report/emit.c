/* Settings for the tools people train with, from an evaluated plan:
 * a DeepSpeed config, Hugging Face TrainingArguments flags, a PyTorch loop
 * (emit_torch.c), Megatron-LM's arguments (emit_megatron.c), a torchtitan
 * job config (emit_torchtitan.c); the verdict's helpers are emit_verdict.c's.
 *
 * The contract (docs/hf.md, "--emit"): what is written runs the plan's
 * precision, optimizer (class, implementation, states), checkpoint segments
 * and sharding, or nothing is written. ml__report_emit_check() decides first:
 * exact; partial (written, but a part of the plan lives in the model's or
 * the loop's code, which these settings cannot hold: each such part is a
 * note, written as a comment where the format has them and returned for
 * stderr); or refused, with the reason. */
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "report/emit_internal.h"
#include "report/report_internal.h"

/* ------------------------------------------------------- checkpoint shape */

/* What the plan checkpoints, read from the ledger (the policy resolved:
 * `optimal` and `every-K` become their segments). */
static ml_ckpt_shape shape_of(const ml_config *cfg, const ml_ledger *l)
{
    ml_ckpt_shape s = {0, 0, 0, cfg->training.checkpoint.kind == ML_CKPT_SELECTIVE};
    size_t nb = ml_ledger_block_count(l);
    int32_t prev = -1;
    for (size_t k = 0; k < nb; k++) {
        const ml_block_info *b = ml_ledger_block(l, k);
        if (b->ckpt_index < 0)
            continue;
        s.blocks++;
        if (b->segment < 0 || b->ckpt_index < 0) {
            prev = -1;
            continue;
        }
        s.ckpt++;
        if (b->segment != prev)
            s.segments++;
        prev = b->segment;
    }
    return s;
}

static bool shape_none(ml_ckpt_shape s)
{
    return !s.selective && s.ckpt == 0;
}

/* Every repeated block its own segment: what "checkpoint every layer"
 * (Trainer's --gradient_checkpointing) does. */
static bool shape_full(ml_ckpt_shape s)
{
    return !s.selective && s.blocks > 0 && s.ckpt == s.blocks && s.segments == s.blocks;
}

/* The segments as "(first, last)" pairs of checkpoint indices. */
void ml__emit_print_segments(FILE *f, const ml_ledger *l)
{
    size_t nb = ml_ledger_block_count(l), n = 0;
    int32_t first = -1, last = -1, seg = -1;
    for (size_t k = 0; k <= nb; k++) {
        const ml_block_info *b = k < nb ? ml_ledger_block(l, k) : NULL;
        bool in = b && b->segment >= 0 && b->ckpt_index >= 0;
        if (first >= 0 && (!in || b->segment != seg)) {
            fprintf(f, "%s(%d, %d)", n++ ? ", " : "", first, last);
            first = -1;
        }
        if (in) {
            if (first < 0)
                first = b->ckpt_index;
            last = b->ckpt_index;
            seg = b->segment;
        }
    }
}

/* ---------------------------------------------------------------- DeepSpeed
 * Keys and their meaning: https://www.deepspeed.ai/docs/config-json/ ;
 * torch_autocast: https://deepspeed.readthedocs.io/en/latest/training.html
 * ("PyTorch Automatic Mixed Precision"); the optimizer a "type" builds:
 * deepspeed/runtime/engine.py, _configure_basic_optimizer; ZeRO's tested
 * optimizers: deepspeed/runtime/zero/utils.py, ZERO_SUPPORTED_OPTIMIZERS. */

/* The "optimizer" section's type, NULL when DeepSpeed builds none that is
 * the plan's (the client passes it to deepspeed.initialize). */
static const char *ds_optimizer_type(const ml_training *t)
{
    bool host = t->offload != ML_OFFLOAD_NONE;
    switch (t->optimizer) {
    case ML_OPT_ADAM:
        return "Adam";
    case ML_OPT_ADAMW:
        return "AdamW";
    case ML_OPT_LION: /* FusedLion on the device, DeepSpeedCPULion on the host */
        return host || t->optimizer_impl == ML_IMPL_FUSED ? "Lion" : NULL;
    case ML_OPT_SGD:
    case ML_OPT_SGD_MOMENTUM:
        return "SGD"; /* not a DeepSpeed name: getattr(torch.optim, "SGD") */
    case ML_OPT_ADAFACTOR:
        return "Adafactor"; /* torch.optim.Adafactor, torch >= 2.5 */
    default:
        return NULL;
    }
}

static void ds_check(ml_emit_verdict *v, const ml_training *t, ml_ckpt_shape s,
                     bool notes)
{
    if (t->offload != ML_OFFLOAD_NONE && t->zero == 0)
        ml__emit_refuse(v, "the plan offloads %s at ZeRO stage 0; DeepSpeed offloads at ZeRO stages "
                          "1-3 only (zero_optimization.offload_optimizer): plan with --zero 1 or "
                          "more",
                       t->offload == ML_OFFLOAD_PARAMS ? "the parameters" : "the optimizer");
    if (t->precision == ML_PREC_BF16)
        ml__emit_refuse(v, "precision bf16 keeps the optimizer states in bf16; DeepSpeed's bf16 "
                          "mode keeps fp32 master weights and states (that is bf16-master), and no "
                          "DeepSpeed setting keeps them in bf16");
    if (t->offload != ML_OFFLOAD_NONE && t->optimizer == ML_OPT_ADAM_8BIT)
        ml__emit_refuse(v, "adam-8bit with offload: bitsandbytes steps on the GPU, and DeepSpeed's "
                          "host optimizers are Adam, AdamW and Lion");
    if (!notes)
        return;
    if (!shape_none(s))
        ml__emit_note(v, "checkpointing is the model's code: DeepSpeed's activation_checkpointing "
                        "keys configure deepspeed.checkpointing.checkpoint calls the model makes "
                        "(number_checkpoints does not choose layers); wrap the planned segments in "
                        "torch.utils.checkpoint or deepspeed.checkpointing.checkpoint "
                        "(--emit torch: run_blocks)");
    if (t->logits == ML_LOGITS_FUSED)
        ml__emit_note(v, "the loss is Liger Kernel's fused linear cross-entropy (--logits fused): "
                        "the model's code computes it (liger_kernel.transformers' "
                        "LigerFusedLinearCrossEntropyLoss on the final norm's output and the LM "
                        "head's weight); DeepSpeed has no setting for it");
    if (!ds_optimizer_type(t))
        ml__emit_note(v, "DeepSpeed has no %s of its own: build it as --emit torch's "
                        "make_optimizer() does and pass it to deepspeed.initialize(optimizer=...)",
                     t->optimizer == ML_OPT_LION ? "for-loop or foreach Lion (lion-pytorch)"
                                                 : "8-bit Adam (bitsandbytes)");
}

static void ds_optimizer(FILE *f, const ml_training *t)
{
    const char *type = ds_optimizer_type(t);
    if (!type)
        return;
    bool host = t->offload != ML_OFFLOAD_NONE;
    fprintf(f, "  \"optimizer\": {\"type\": \"%s\", \"params\": {", type);
    const char *sep = "";
    if (t->optimizer == ML_OPT_ADAM || t->optimizer == ML_OPT_ADAMW) {
        /* "Adam" builds AdamW unless adam_w_mode is false; on the device,
         * fused is DeepSpeed's FusedAdam, the others torch's own class;
         * offloaded, DeepSpeedCPUAdam */
        if (t->optimizer == ML_OPT_ADAM) {
            fputs("\"adam_w_mode\": false", f);
            sep = ", ";
        }
        if (!host && t->optimizer_impl != ML_IMPL_FUSED) {
            fprintf(f, "%s\"torch_adam\": true, \"foreach\": %s", sep,
                    t->optimizer_impl == ML_IMPL_FOREACH ? "true" : "false");
        }
    } else if (t->optimizer == ML_OPT_SGD || t->optimizer == ML_OPT_SGD_MOMENTUM ||
               t->optimizer == ML_OPT_ADAFACTOR) {
        if (t->optimizer != ML_OPT_ADAFACTOR) {
            fprintf(f, "\"momentum\": %s", t->optimizer == ML_OPT_SGD ? "0.0" : "0.9");
            sep = ", ";
        }
        fprintf(f, "%s%s", sep,
                t->optimizer_impl == ML_IMPL_FUSED     ? "\"fused\": true"
                : t->optimizer_impl == ML_IMPL_FOREACH ? "\"foreach\": true"
                                                       : "\"foreach\": false");
    }
    fputs("}},\n", f);
}

static int deepspeed(FILE *f, const ml_config *cfg)
{
    const ml_training *t = &cfg->training;
    fprintf(f, "{\n  \"train_micro_batch_size_per_gpu\": %llu,\n"
               "  \"gradient_accumulation_steps\": %llu,\n  \"train_batch_size\": %llu,\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum,
            (unsigned long long)(t->micro_batch * t->grad_accum * t->data_parallel));
    /* amp-*: torch.autocast on fp32 parameters, gradients reduced in fp32
     * (an empty lower_precision_safe_modules: DeepSpeed's default list would
     * reduce Linear/Conv gradients in the low precision); *-master: the
     * model in bf16/fp16, fp32 master weights and states */
    fprintf(f, "  \"bf16\": {\"enabled\": %s},\n",
            t->precision == ML_PREC_BF16_MASTER ? "true" : "false");
    fprintf(f, "  \"fp16\": {\"enabled\": %s},\n",
            t->precision == ML_PREC_FP16_MASTER ? "true, \"loss_scale\": 0" : "false");
    if (ml__emit_is_amp(t->precision))
        fprintf(f, "  \"torch_autocast\": {\"enabled\": true, \"dtype\": \"%s\", "
                   "\"lower_precision_safe_modules\": []},\n",
                t->precision == ML_PREC_AMP_BF16 ? "bfloat16" : "float16");
    /* bf16 gradients, as the plan counts them (without ZeRO DeepSpeed
     * would accumulate them in fp32) */
    if (t->precision == ML_PREC_BF16_MASTER)
        fputs("  \"data_types\": {\"grad_accum_dtype\": \"bf16\"},\n", f);
    ds_optimizer(f, t);
    if (t->zero && t->optimizer != ML_OPT_ADAM && t->optimizer != ML_OPT_ADAMW &&
        !(t->optimizer == ML_OPT_LION && ds_optimizer_type(t)))
        fputs("  \"zero_allow_untested_optimizer\": true,\n", f);
    fprintf(f, "  \"zero_optimization\": {\n    \"stage\": %u,\n    \"reduce_bucket_size\": %llu,\n"
               "    \"allgather_bucket_size\": %llu",
            t->zero, (unsigned long long)t->reduce_bucket, (unsigned long long)t->allgather_bucket);
    if (t->offload != ML_OFFLOAD_NONE)
        fputs(",\n    \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}", f);
    if (t->offload == ML_OFFLOAD_PARAMS)
        fputs(",\n    \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}", f);
    fputs("\n  },\n", f);
    fputs("  \"wall_clock_breakdown\": false\n}\n", f);
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------- Hugging Face Trainer
 * Flags: transformers' TrainingArguments; --optim names: OptimizerNames and
 * Trainer.get_optimizer_cls_and_kwargs (transformers/trainer.py). */

/* DeepSpeed carries what Trainer alone cannot: sharding, offload, a model
 * in bf16/fp16 with fp32 master weights. */
static bool hf_needs_deepspeed(const ml_training *t)
{
    return t->zero || t->offload != ML_OFFLOAD_NONE || ml__emit_is_master(t->precision);
}

static void hf_check(ml_emit_verdict *v, const ml_training *t, ml_ckpt_shape s)
{
    if (hf_needs_deepspeed(t)) {
        ml_emit_verdict d = {0};
        ds_check(&d, t, s, false);
        if (d.level == ML_EMIT_REFUSED)
            ml__emit_refuse(v, "its DeepSpeed config: %s", d.refusal);
    }
    if (!shape_none(s) && !shape_full(s))
        ml__emit_refuse(v, "Trainer's --gradient_checkpointing checkpoints every layer and nothing "
                          "else; the plan checkpoints %s: plan with --checkpoint full or none, or "
                          "wrap the segments in the model's forward (--emit torch: run_blocks)",
                       s.selective ? "the attention core only (selective)"
                                   : "a subset of the blocks");
    bool fused = t->optimizer_impl == ML_IMPL_FUSED, foreach = t->optimizer_impl == ML_IMPL_FOREACH;
    switch (t->optimizer) {
    case ML_OPT_ADAM:
    case ML_OPT_ADAMW:
        if (!fused && !foreach)
            ml__emit_refuse(v, "Trainer's adamw_torch runs torch's default implementation (foreach "
                              "on CUDA); the plan's for-loop step has no Trainer flag: plan with "
                              "--optimizer-impl foreach or fused");
        break;
    case ML_OPT_SGD:
        if (!foreach)
            ml__emit_refuse(v, "Trainer's --optim sgd runs torch's default implementation (foreach "
                              "on CUDA): plan with --optimizer-impl foreach");
        break;
    case ML_OPT_SGD_MOMENTUM:
        ml__emit_refuse(v, "Trainer's --optim sgd is torch.optim.SGD without momentum (no momentum "
                          "buffer) and no flag sets it: pass the optimizer of --emit torch to "
                          "Trainer(optimizers=(optimizer, None))");
        break;
    case ML_OPT_ADAFACTOR:
        ml__emit_refuse(v, "Trainer's --optim adafactor is transformers' Adafactor, not the "
                          "torch.optim.Adafactor the plan counts: its step keeps grad^2 and the "
                          "factored estimate at once, and fp32 states for bf16 gradients: pass "
                          "torch.optim.Adafactor to Trainer(optimizers=(optimizer, None))");
        break;
    case ML_OPT_LION:
        if (!fused)
            ml__emit_refuse(v, "Trainer's Lion is bitsandbytes' (lion_32bit), one kernel per tensor "
                              "with no step temporaries; the plan's %s Lion has them: plan with "
                              "--optimizer-impl fused, or pass lion-pytorch's Lion to "
                              "Trainer(optimizers=(optimizer, None))",
                           ml_optimizer_impl_name(t->optimizer_impl));
        else if (t->precision == ML_PREC_BF16)
            ml__emit_refuse(v, "bitsandbytes' 32-bit Lion keeps an fp32 state; precision bf16 "
                              "plans it in bf16");
        break;
    default:
        break;
    }
    if (t->precision == ML_PREC_BF16)
        ml__emit_note(v, "precision bf16 is the model's dtype: load it in bf16 "
                        "(from_pretrained(..., torch_dtype=torch.bfloat16)); Trainer's --bf16 "
                        "would be autocast on fp32 parameters instead");
    if (t->logits == ML_LOGITS_KEPT || t->logits == ML_LOGITS_THROUGH_BACKWARD)
        ml__emit_note(v, "the plan keeps the logits %s (--logits %s); Trainer drops them once "
                        "the loss is computed: plan with --logits released for Trainer's loop",
                     t->logits == ML_LOGITS_KEPT ? "to the iteration's end" : "through the backward",
                     ml_logits_name(t->logits));
    if (t->zero_grad == ML_ZERO_GRAD_ZERO)
        ml__emit_note(v, "the plan keeps the gradients allocated between steps (--zero-grad zero); "
                        "Trainer frees them (model.zero_grad(), set_to_none): plan with "
                        "--zero-grad set_to_none");
}


static int hf_trainer(FILE *f, const ml_config *cfg, ml_ckpt_shape s,
                      const ml_emit_verdict *v)
{
    const ml_training *t = &cfg->training;
    bool ds = hf_needs_deepspeed(t);
    fprintf(f, "# memledger: micro-batch %llu x %llu accumulation steps x %llu device%s = %llu\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum,
            (unsigned long long)t->data_parallel, t->data_parallel == 1 ? "" : "s",
            (unsigned long long)(t->micro_batch * t->grad_accum * t->data_parallel));
    ml__emit_allocator_comment(f, &cfg->device);
    ml__emit_note_comments(f, v);
    if (t->optimizer == ML_OPT_ADAM)
        fputs("# adam: Trainer's AdamW with weight decay 0 (a decoupled decay of 0 is Adam)\n", f);
    if (ds && ml__emit_is_amp(t->precision))
        fputs("# autocast is the DeepSpeed config's (torch_autocast), so no --bf16/--fp16\n", f);
    if (ds && ml__emit_is_master(t->precision))
        fputs("# the model in bf16/fp16 with fp32 master weights is DeepSpeed's mixed precision\n",
              f);
    if (ds && ds_optimizer_type(t))
        fputs("# the DeepSpeed config's optimizer section builds the optimizer (--optim unused)\n",
              f);
    fprintf(f, "--per_device_train_batch_size %llu \\\n--gradient_accumulation_steps %llu",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum);
    if (t->eval_batch) /* the plan's evaluation pass: its batch */
        fprintf(f, " \\\n--per_device_eval_batch_size %llu", (unsigned long long)t->eval_batch);
    if (shape_full(s))
        fputs(" \\\n--gradient_checkpointing \\\n"
              "--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'", f);
    if (t->precision == ML_PREC_BF16_MASTER || (t->precision == ML_PREC_AMP_BF16 && !ds))
        fputs(" \\\n--bf16", f);
    if (t->precision == ML_PREC_FP16_MASTER || (t->precision == ML_PREC_AMP_FP16 && !ds))
        fputs(" \\\n--fp16", f);
    switch (t->optimizer) {
    case ML_OPT_ADAM:
    case ML_OPT_ADAMW:
        fprintf(f, " \\\n--optim %s",
                t->optimizer_impl == ML_IMPL_FUSED ? "adamw_torch_fused" : "adamw_torch");
        if (t->optimizer == ML_OPT_ADAM)
            fputs(" \\\n--weight_decay 0", f);
        break;
    case ML_OPT_SGD:
        fputs(" \\\n--optim sgd", f);
        break;
    case ML_OPT_ADAM_8BIT:
        fputs(" \\\n--optim adamw_bnb_8bit", f);
        break;
    case ML_OPT_LION:
        fputs(" \\\n--optim lion_32bit", f);
        break;
    default: /* refused by hf_check */
        break;
    }
    if (t->logits == ML_LOGITS_FUSED) /* Liger's patches, FusedLinearCrossEntropy among them */
        fputs(" \\\n--use_liger_kernel True", f);
    if (ds)
        fputs(" \\\n--deepspeed ds_config.json  # memledger plan ... --emit deepspeed > "
              "ds_config.json", f);
    fputc('\n', f);
    return ferror(f) ? -1 : 0;
}

/* ---------------------------------------------------------------- entry */

typedef enum { EMIT_DEEPSPEED, EMIT_HF_TRAINER, EMIT_TORCH, EMIT_MEGATRON, EMIT_TORCHTITAN,
               EMIT_UNKNOWN } emit_kind;

static emit_kind kind_of(const char *kind)
{
    return !strcmp(kind, "deepspeed")    ? EMIT_DEEPSPEED
           : !strcmp(kind, "hf-trainer") ? EMIT_HF_TRAINER
           : !strcmp(kind, "torch")      ? EMIT_TORCH
           : !strcmp(kind, "megatron")   ? EMIT_MEGATRON
           : !strcmp(kind, "torchtitan") ? EMIT_TORCHTITAN
                                         : EMIT_UNKNOWN;
}

/* Trainer trains the model the user loads: transformers picks sdpa where
 * torch has it unless from_pretrained is told otherwise, so a plan of another
 * attention names the argument (modeling_utils.py, attn_implementation). */
static void hf_attention(ml_emit_verdict *v, const ml_model *m)
{
    const char *a = m ? ml_model_attention(m) : NULL; /* NULL: a sequential model */
    if (a && strcmp(a, "sdpa"))
        ml__emit_note(v, "the plan's attention is %s: load the model with from_pretrained(..., "
                        "attn_implementation=\"%s\") unless its config.json sets it; "
                        "transformers picks sdpa where the installed torch has it",
                     a, !strcmp(a, "flash") ? "flash_attention_2\" or \"flash_attention_3" : a);
}

/* An encoder-decoder (T5) or a multimodal model (Llava): the torch snippet
 * runs one stream of blocks; the training cache T5's forward keeps by
 * default is not in the plan. */
static void encdec_check(emit_kind k, const ml_model *m, const ml_training *t,
                         ml_emit_verdict *v)
{
    if (ml_model_image_tokens(m) && k == EMIT_TORCH)
        ml__emit_refuse(v, "the snippet runs one stream of blocks; a multimodal model's vision "
                          "tower, projector and decoder (Llava's) are not emitted: --emit "
                          "hf-trainer or deepspeed");
    else if (ml_model_image_tokens(m) && t->vision_tower == ML_VT_FROZEN)
        ml__emit_note(v, "the plan freezes the vision tower (training.vision_tower: frozen), "
                        "which these settings cannot: call "
                        "model.vision_tower.requires_grad_(False) before training");
    else if (ml_model_image_tokens(m) && t->vision_tower != ML_VT_SAME)
        ml__emit_note(v, "the plan checkpoints the vision tower apart from the decoder "
                        "(training.vision_tower: none or full); gradient checkpointing covers "
                        "both stacks: set the tower's encoder.gradient_checkpointing yourself");
    if (!ml_model_target_len(m, t))
        return;
    if (k == EMIT_TORCH) {
        ml__emit_refuse(v, "the snippet runs one stream of blocks; an encoder-decoder's two stacks "
                          "(T5's encoder.block and decoder.block, whose blocks take the masks, "
                          "the position biases and the encoder's output) are not emitted: "
                          "--emit hf-trainer or deepspeed");
        return;
    }
    if (t->checkpoint.kind == ML_CKPT_NONE || t->checkpoint.kind == ML_CKPT_SELECTIVE)
        ml__emit_note(v, "T5's training forward keeps every decoder layer's keys and values in "
                        "its returned cache (T5Config's use_cache: true) unless gradient "
                        "checkpointing is on; the plan leaves that cache out: set "
                        "model.config.use_cache = False");
}

/* The plan's evaluation pass (training.eval_batch): Trainer's flags carry
 * its batch (--per_device_eval_batch_size), not its length; DeepSpeed's
 * config and the snippet carry neither: the loop runs it. */
static void eval_check(emit_kind k, const ml_training *t, ml_emit_verdict *v)
{
    if (!t->eval_batch || v->level == ML_EMIT_REFUSED)
        return;
    if (k != EMIT_HF_TRAINER)
        ml__emit_note(v, "the plan has an evaluation pass (batch %llu x %llu tokens, no_grad, "
                         "the output kept): %s has no evaluation; run it in the loop with that "
                         "batch",
                      (unsigned long long)t->eval_batch,
                      (unsigned long long)(t->eval_seq_len ? t->eval_seq_len : t->seq_len),
                      k == EMIT_DEEPSPEED ? "DeepSpeed's config" : "the snippet");
    else if (t->eval_seq_len && t->eval_seq_len != t->seq_len)
        ml__emit_note(v, "the plan evaluates %llu tokens a sample (--eval-seq-len); Trainer "
                         "evaluates the eval dataset's lengths: pad or cut them to %llu there",
                      (unsigned long long)t->eval_seq_len, (unsigned long long)t->eval_seq_len);
}

static void check(emit_kind k, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                  ml_emit_verdict *v)
{
    memset(v, 0, sizeof *v);
    const ml_training *t = &cfg->training;
    const ml_ckpt_shape s = shape_of(cfg, l);
    if (k == EMIT_MEGATRON) { /* emit_megatron.c: its layouts are Megatron's own */
        ml__emit_megatron_check(v, m, cfg);
        return;
    }
    if (k == EMIT_TORCHTITAN) { /* emit_torchtitan.c: so are torchtitan's */
        ml__emit_torchtitan_check(v, m, cfg, l);
        return;
    }
    /* the other targets' settings shard over every data-parallel rank */
    if (ml_training_shard(t) < (t->data_parallel ? t->data_parallel : 1)) {
        ml__emit_refuse(v, "the plan shards the states over groups of %llu of the %llu "
                           "data-parallel ranks (parallel.dp_shard, HSDP); these settings "
                           "shard over all of them: plan without --dp-shard to emit",
                        (unsigned long long)ml_training_shard(t),
                        (unsigned long long)t->data_parallel);
        return;
    }
    /* the other targets' settings run one device's whole model */
    const char *target = k == EMIT_DEEPSPEED    ? "DeepSpeed's config"
                         : k == EMIT_HF_TRAINER ? "Trainer"
                                                : "the snippet";
    if (t->tensor_parallel > 1 || t->pipeline_parallel > 1) {
        ml__emit_refuse(v, "the plan is one rank of a model split over devices (parallel.%s "
                           "%llu); %s runs the whole model on each device: plan without --tp "
                           "and --pp to emit",
                        t->tensor_parallel > 1 ? "tp" : "pp",
                        (unsigned long long)(t->tensor_parallel > 1 ? t->tensor_parallel
                                                                    : t->pipeline_parallel),
                        target);
        return;
    }
    if (t->context_parallel > 1) {
        ml__emit_refuse(v, "the plan is one rank of sequences split over %llu devices "
                           "(parallel.cp, PyTorch's ring attention); %s does not set up "
                           "context parallelism: plan without --cp to emit",
                        (unsigned long long)t->context_parallel, target);
        return;
    }
    if (ml_training_ep(t) > 1 || t->expert_tensor_parallel > 1) {
        ml__emit_refuse(v, "the plan is one rank of experts split over %llu devices "
                           "(parallel.ep and parallel.etp, Megatron-core's dispatch); %s does "
                           "not set up expert parallelism: plan without --ep and --etp to emit",
                        (unsigned long long)(ml_training_ep(t) * ml_training_etp(t)), target);
        return;
    }
    encdec_check(k, m, t, v);
    if (v->level == ML_EMIT_REFUSED)
        return;
    /* the snippet sets the variable itself (emit_torch.c); a config or
     * Trainer's flags cannot */
    if (k != EMIT_TORCH && cfg->device.allocator == ML_ALLOCATOR_EXPANDABLE)
        ml__emit_note(v, "the plan assumes expandable segments: launch with "
                         "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True in the environment");
    if (k == EMIT_DEEPSPEED) {
        ds_check(v, t, s, true);
    } else if (k == EMIT_HF_TRAINER) {
        hf_check(v, t, s);
        if (v->level != ML_EMIT_REFUSED)
            hf_attention(v, m);
    } else {
        ml__emit_torch_check(v, t, s);
    }
    eval_check(k, t, v);
}

int ml__report_emit_check(const char *kind, const ml_model *m, const ml_config *cfg,
                          const ml_ledger *l, char *why, size_t size)
{
    emit_kind k = kind_of(kind);
    if (size)
        why[0] = '\0';
    if (k == EMIT_UNKNOWN)
        return -2;
    ml_emit_verdict v;
    check(k, m, cfg, l, &v);
    if (!size)
        return v.level;
    if (v.level == ML_EMIT_REFUSED) {
        snprintf(why, size, "%s", v.refusal);
        return v.level;
    }
    size_t n = 0;
    for (size_t i = 0; i < v.nnotes && n < size; i++) {
        int w = snprintf(why + n, size - n, "%s%s", i ? "; " : "", v.notes[i]);
        if (w < 0)
            break;
        n += (size_t)w;
    }
    return v.level;
}

int ml_report_emit(FILE *f, const char *kind, const ml_model *m, const ml_config *cfg,
                   const ml_ledger *l)
{
    emit_kind k = kind_of(kind);
    if (k == EMIT_UNKNOWN)
        return -2;
    ml_ckpt_shape s = shape_of(cfg, l);
    ml_emit_verdict v;
    check(k, m, cfg, l, &v);
    if (v.level == ML_EMIT_REFUSED)
        return -3; /* nothing written: the target would run a different setup */
    if (k == EMIT_DEEPSPEED)
        return deepspeed(f, cfg);
    if (k == EMIT_HF_TRAINER)
        return hf_trainer(f, cfg, s, &v);
    if (k == EMIT_MEGATRON)
        return ml__emit_megatron(f, m, cfg, &v);
    if (k == EMIT_TORCHTITAN)
        return ml__emit_torchtitan(f, m, cfg, l, &v);
    return ml__emit_torch(f, m, cfg, l, &v);
}
