/* Settings for the tools people train with, from an evaluated plan:
 * a DeepSpeed config, Hugging Face TrainingArguments flags, a PyTorch loop.
 *
 * The contract (docs/hf.md, "--emit"): what is written runs the plan's
 * precision, optimizer (class, implementation, states), checkpoint segments
 * and sharding, or nothing is written. ml_report_emit_check() decides first:
 * exact; partial (written, but a part of the plan lives in the model's or
 * the loop's code, which these settings cannot hold: each such part is a
 * note, written as a comment where the format has them and returned for
 * stderr); or refused, with the reason. */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "report/report_internal.h"

/* s inside a '#' comment of emitted Python or shell: printable ASCII as
 * is, every other byte (a newline would end the comment and start a
 * statement; a stray byte makes the file invalid UTF-8 for Python) and the
 * backslash as \xNN / \\, so the comment stays one line whatever a model
 * file's name: or config.json's _name_or_path holds. */
static void comment_text(FILE *f, const char *s)
{
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '\\')
            fputs("\\\\", f);
        else if (*p < 0x20 || *p >= 0x7f)
            fprintf(f, "\\x%02x", *p);
        else
            fputc(*p, f);
    }
}

static bool is_master(ml_precision p)
{
    return p == ML_PREC_BF16_MASTER || p == ML_PREC_FP16_MASTER;
}

static bool is_amp(ml_precision p)
{
    return p == ML_PREC_AMP_BF16 || p == ML_PREC_AMP_FP16;
}

/* ---------------------------------------------------------------- verdict */

#define EMIT_NOTES 8

typedef struct {
    int level; /* ML_EMIT_EXACT, ML_EMIT_PARTIAL or ML_EMIT_REFUSED */
    char refusal[640];
    char notes[EMIT_NOTES][480];
    size_t nnotes;
} verdict;

#if defined(__GNUC__)
#define ML_PRINTF(a, b) __attribute__((format(printf, a, b)))
#else
#define ML_PRINTF(a, b)
#endif

/* The first refusal is the reason given: the checks run from the most
 * basic (sharding, precision) to the details. */
static void ML_PRINTF(2, 3) refuse(verdict *v, const char *fmt, ...)
{
    if (v->level == ML_EMIT_REFUSED)
        return;
    v->level = ML_EMIT_REFUSED;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->refusal, sizeof v->refusal, fmt, ap);
    va_end(ap);
}

static void ML_PRINTF(2, 3) note(verdict *v, const char *fmt, ...)
{
    if (v->nnotes == EMIT_NOTES)
        return;
    if (v->level == ML_EMIT_EXACT)
        v->level = ML_EMIT_PARTIAL;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(v->notes[v->nnotes++], sizeof v->notes[0], fmt, ap);
    va_end(ap);
}

/* The notes as '#' comment lines. */
static void note_comments(FILE *f, const verdict *v)
{
    if (!v->nnotes)
        return;
    fputs("# memledger: part of the plan is not in these settings (exit status 4):\n", f);
    for (size_t i = 0; i < v->nnotes; i++) {
        fputs("# - ", f);
        comment_text(f, v->notes[i]);
        fputc('\n', f);
    }
}

/* ------------------------------------------------------- checkpoint shape */

/* What the plan checkpoints, read from the ledger (the policy resolved:
 * `optimal` and `every-K` become their segments). */
typedef struct {
    size_t blocks;     /* repeated blocks (those with a checkpoint index) */
    size_t ckpt;       /* of which checkpointed */
    size_t segments;   /* checkpoint segments */
    bool selective;    /* the attention core only, inside each block */
} ckpt_shape;

static ckpt_shape shape_of(const ml_config *cfg, const ml_ledger *l)
{
    ckpt_shape s = {0, 0, 0, cfg->training.checkpoint.kind == ML_CKPT_SELECTIVE};
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

static bool shape_none(ckpt_shape s)
{
    return !s.selective && s.ckpt == 0;
}

/* Every repeated block its own segment: what "checkpoint every layer"
 * (Trainer's --gradient_checkpointing) does. */
static bool shape_full(ckpt_shape s)
{
    return !s.selective && s.blocks > 0 && s.ckpt == s.blocks && s.segments == s.blocks;
}

/* The segments as "(first, last)" pairs of checkpoint indices. */
static void print_segments(FILE *f, const ml_ledger *l)
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

static void ds_check(verdict *v, const ml_training *t, ckpt_shape s, bool notes)
{
    if (t->offload != ML_OFFLOAD_NONE && t->zero == 0)
        refuse(v, "the plan offloads %s at ZeRO stage 0; DeepSpeed offloads at ZeRO stages "
                  "1-3 only (zero_optimization.offload_optimizer): plan with --zero 1 or more",
               t->offload == ML_OFFLOAD_PARAMS ? "the parameters" : "the optimizer");
    if (t->precision == ML_PREC_BF16)
        refuse(v, "precision bf16 keeps the optimizer states in bf16; DeepSpeed's bf16 mode "
                  "keeps fp32 master weights and states (that is bf16-master), and no "
                  "DeepSpeed setting keeps them in bf16");
    if (t->offload != ML_OFFLOAD_NONE && t->optimizer == ML_OPT_ADAM_8BIT)
        refuse(v, "adam-8bit with offload: bitsandbytes steps on the GPU, and DeepSpeed's "
                  "host optimizers are Adam, AdamW and Lion");
    if (!notes)
        return;
    if (!shape_none(s))
        note(v, "checkpointing is the model's code: DeepSpeed's activation_checkpointing "
                "keys configure deepspeed.checkpointing.checkpoint calls the model makes "
                "(number_checkpoints does not choose layers); wrap the planned segments in "
                "torch.utils.checkpoint or deepspeed.checkpointing.checkpoint "
                "(--emit torch: run_blocks)");
    if (!ds_optimizer_type(t))
        note(v, "DeepSpeed has no %s of its own: build it as --emit torch's make_optimizer() "
                "does and pass it to deepspeed.initialize(optimizer=...)",
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
    if (is_amp(t->precision))
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
    return t->zero || t->offload != ML_OFFLOAD_NONE || is_master(t->precision);
}

static void hf_check(verdict *v, const ml_training *t, ckpt_shape s)
{
    if (hf_needs_deepspeed(t)) {
        verdict d = {0};
        ds_check(&d, t, s, false);
        if (d.level == ML_EMIT_REFUSED)
            refuse(v, "its DeepSpeed config: %s", d.refusal);
    }
    if (!shape_none(s) && !shape_full(s))
        refuse(v, "Trainer's --gradient_checkpointing checkpoints every layer and nothing "
                  "else; the plan checkpoints %s: plan with --checkpoint full or none, or "
                  "wrap the segments in the model's forward (--emit torch: run_blocks)",
               s.selective ? "the attention core only (selective)" : "a subset of the blocks");
    bool fused = t->optimizer_impl == ML_IMPL_FUSED, foreach = t->optimizer_impl == ML_IMPL_FOREACH;
    switch (t->optimizer) {
    case ML_OPT_ADAM:
    case ML_OPT_ADAMW:
        if (!fused && !foreach)
            refuse(v, "Trainer's adamw_torch runs torch's default implementation (foreach on "
                      "CUDA); the plan's for-loop step has no Trainer flag: plan with "
                      "--optimizer-impl foreach or fused");
        break;
    case ML_OPT_SGD:
        if (!foreach)
            refuse(v, "Trainer's --optim sgd runs torch's default implementation (foreach on "
                      "CUDA): plan with --optimizer-impl foreach");
        break;
    case ML_OPT_SGD_MOMENTUM:
        refuse(v, "Trainer's --optim sgd is torch.optim.SGD without momentum (no momentum "
                  "buffer) and no flag sets it: pass the optimizer of --emit torch to "
                  "Trainer(optimizers=(optimizer, None))");
        break;
    case ML_OPT_ADAFACTOR:
        refuse(v, "Trainer's --optim adafactor is transformers' Adafactor, not the "
                  "torch.optim.Adafactor the plan counts: its step keeps grad^2 and the "
                  "factored estimate at once, and fp32 states for bf16 gradients: pass "
                  "torch.optim.Adafactor to Trainer(optimizers=(optimizer, None))");
        break;
    case ML_OPT_LION:
        if (!fused)
            refuse(v, "Trainer's Lion is bitsandbytes' (lion_32bit), one kernel per tensor "
                      "with no step temporaries; the plan's %s Lion has them: plan with "
                      "--optimizer-impl fused, or pass lion-pytorch's Lion to "
                      "Trainer(optimizers=(optimizer, None))",
                   ml_optimizer_impl_name(t->optimizer_impl));
        else if (t->precision == ML_PREC_BF16)
            refuse(v, "bitsandbytes' 32-bit Lion keeps an fp32 state; precision bf16 "
                      "plans it in bf16");
        break;
    default:
        break;
    }
    if (t->precision == ML_PREC_BF16)
        note(v, "precision bf16 is the model's dtype: load it in bf16 "
                "(from_pretrained(..., torch_dtype=torch.bfloat16)); Trainer's --bf16 would "
                "be autocast on fp32 parameters instead");
    if (t->logits == ML_LOGITS_KEPT)
        note(v, "the plan keeps the logits to the iteration's end (--logits kept); Trainer "
                "drops them once the loss is computed: plan with --logits released for "
                "Trainer's loop");
    if (t->zero_grad == ML_ZERO_GRAD_ZERO)
        note(v, "the plan keeps the gradients allocated between steps (--zero-grad zero); "
                "Trainer frees them (model.zero_grad(), set_to_none): plan with --zero-grad "
                "set_to_none");
}


static int hf_trainer(FILE *f, const ml_config *cfg, ckpt_shape s, const verdict *v)
{
    const ml_training *t = &cfg->training;
    bool ds = hf_needs_deepspeed(t);
    fprintf(f, "# memledger: micro-batch %llu x %llu accumulation steps x %llu device%s = %llu\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum,
            (unsigned long long)t->data_parallel, t->data_parallel == 1 ? "" : "s",
            (unsigned long long)(t->micro_batch * t->grad_accum * t->data_parallel));
    note_comments(f, v);
    if (t->optimizer == ML_OPT_ADAM)
        fputs("# adam: Trainer's AdamW with weight decay 0 (a decoupled decay of 0 is Adam)\n", f);
    if (ds && is_amp(t->precision))
        fputs("# autocast is the DeepSpeed config's (torch_autocast), so no --bf16/--fp16\n", f);
    if (ds && is_master(t->precision))
        fputs("# the model in bf16/fp16 with fp32 master weights is DeepSpeed's mixed precision\n",
              f);
    if (ds && ds_optimizer_type(t))
        fputs("# the DeepSpeed config's optimizer section builds the optimizer (--optim unused)\n",
              f);
    fprintf(f, "--per_device_train_batch_size %llu \\\n--gradient_accumulation_steps %llu",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum);
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
    if (ds)
        fputs(" \\\n--deepspeed ds_config.json  # memledger plan ... --emit deepspeed > "
              "ds_config.json", f);
    fputc('\n', f);
    return ferror(f) ? -1 : 0;
}

/* ------------------------------------------------------------ PyTorch
 * The snippet runs the plan on one device: docs/precision.md's policies,
 * docs/optimizers.md's classes and implementations, the ledger's
 * checkpoint segments and docs/ledger.md's loop references. */

static void torch_check(verdict *v, const ml_training *t, ckpt_shape s)
{
    if (t->zero || t->offload != ML_OFFLOAD_NONE)
        refuse(v, "the snippet is one process on one device; ZeRO sharding (--zero %u) and "
                  "offload are DeepSpeed's: --emit deepspeed or hf-trainer",
               t->zero);
    if (is_master(t->precision) && t->optimizer_impl == ML_IMPL_FUSED)
        refuse(v, "torch's fused optimizers step parameters in their gradients' dtype; the "
                  "plan's fused %s step reads the low-precision gradients into the fp32 master "
                  "weights with no copy (DeepSpeed's kernels): --emit deepspeed, or plan with "
                  "--optimizer-impl foreach",
               ml_precision_name(t->precision));
    if (t->precision == ML_PREC_FP16_MASTER && t->optimizer_impl == ML_IMPL_FOR_LOOP)
        refuse(v, "fp16-master with a for-loop step means one optimizer per tensor under loss "
                  "scaling, and GradScaler skips an overflowing step per optimizer (some "
                  "tensors would step, others not): plan with --optimizer-impl foreach");
    if (t->optimizer == ML_OPT_ADAFACTOR && t->optimizer_impl == ML_IMPL_FUSED)
        refuse(v, "torch.optim.Adafactor has no fused implementation");
    if (s.selective)
        note(v, "selective checkpointing is inside each block: in the block's forward, wrap "
                "the attention core (QK^T, softmax, dropout, PV) in checkpoint(..., "
                "use_reentrant=False) and keep the projections and the MLP outside");
    if (t->data_parallel > 1)
        note(v, "data_parallel %llu: one process per device, the model wrapped in "
                "DistributedDataParallel(model, gradient_as_bucket_view=True) after setup() "
                "(the plan counts no bucket copies: docs/sharding.md)",
             (unsigned long long)t->data_parallel);
}

/* make_optimizer(params): the plan's optimizer class, arguments and
 * implementation. */
static void torch_make_optimizer(FILE *f, const ml_training *t)
{
    const char *impl = t->optimizer_impl == ML_IMPL_FUSED     ? "fused=True"
                       : t->optimizer_impl == ML_IMPL_FOREACH ? "foreach=True"
                                                              : "foreach=False";
    fprintf(f, "def make_optimizer(params):\n    \"\"\"%s, %s.\"\"\"\n",
            ml_optimizer_name(t->optimizer), ml_optimizer_impl_name(t->optimizer_impl));
    switch (t->optimizer) {
    case ML_OPT_SGD:
        fprintf(f, "    return torch.optim.SGD(params, lr=LR, momentum=0.0, %s)\n", impl);
        break;
    case ML_OPT_SGD_MOMENTUM:
        fputs("    # any momentum > 0 keeps the planned momentum_buffer per parameter\n", f);
        fprintf(f, "    return torch.optim.SGD(params, lr=LR, momentum=0.9, %s)\n", impl);
        break;
    case ML_OPT_ADAM:
        fprintf(f, "    return torch.optim.Adam(params, lr=LR, %s)\n", impl);
        break;
    case ML_OPT_ADAMW:
        fprintf(f, "    return torch.optim.AdamW(params, lr=LR, %s)\n", impl);
        break;
    case ML_OPT_ADAFACTOR:
        fputs("    # torch.optim.Adafactor (torch 2.5 or later): the optimizer the plan counts\n"
              "    # (docs/optimizers.md); transformers' Adafactor keeps more at the step\n", f);
        fprintf(f, "    return torch.optim.Adafactor(params, lr=LR, %s)\n", impl);
        break;
    case ML_OPT_ADAM_8BIT:
        fputs("    # bitsandbytes steps each tensor in one kernel whatever the implementation\n"
              "    # (the plan counts no step temporaries for any); tensors under 4096 values\n"
              "    # keep fp32 states (min_8bit_size, the default)\n"
              "    return bnb.optim.Adam8bit(params, lr=LR)\n", f);
        break;
    case ML_OPT_LION:
        fprintf(f, "    return Lion(params, lr=LR%s)\n",
                t->optimizer_impl == ML_IMPL_FUSED ? ", use_triton=True" : "");
        break;
    default:
        break;
    }
    if (t->optimizer_impl == ML_IMPL_FUSED &&
        (t->optimizer == ML_OPT_SGD || t->optimizer == ML_OPT_SGD_MOMENTUM ||
         t->optimizer == ML_OPT_ADAM || t->optimizer == ML_OPT_ADAMW))
        fputs("    # fused=True: torch 2.x, parameters on the GPU\n", f);
}

static void torch_imports(FILE *f, const ml_training *t)
{
    fputs("import torch\nfrom torch.utils.checkpoint import checkpoint\n", f);
    if (t->optimizer == ML_OPT_ADAM_8BIT)
        fputs("import bitsandbytes as bnb  # pip install bitsandbytes: 8-bit Adam\n", f);
    if (t->optimizer == ML_OPT_LION)
        fprintf(f, "from lion_pytorch%s import Lion  # pip install lion-pytorch "
                   "(torch.optim has no Lion)\n",
                t->optimizer_impl == ML_IMPL_FOREACH ? ".foreach" : "");
}

static const char run_blocks_py[] =
    "def run_blocks(blocks, x):\n"
    "    \"\"\"Runs the repeated blocks, checkpointing the planned segments.\"\"\"\n"
    "    starts = {a: b for a, b in CHECKPOINT_SEGMENTS}\n"
    "    i = 0\n"
    "    while i < len(blocks):\n"
    "        if i in starts:\n"
    "            seg = blocks[i:starts[i] + 1]\n\n"
    "            def run(y, seg=seg):\n"
    "                for blk in seg:\n"
    "                    y = blk(y)\n"
    "                return y\n"
    "            x = checkpoint(run, x, use_reentrant=False)\n"
    "            i = starts[i] + 1\n"
    "        else:\n"
    "            x = blocks[i](x)\n"
    "            i += 1\n"
    "    return x\n\n\n";

static void torch_scaler(FILE *f)
{
    fputs("    global SCALER\n"
          "    if hasattr(torch.amp, \"GradScaler\"):  # torch 2.3 or later\n"
          "        SCALER = torch.amp.GradScaler(DEVICE)\n"
          "    elif DEVICE == \"cuda\":\n"
          "        SCALER = torch.cuda.amp.GradScaler()\n"
          "    if SCALER is None or not SCALER.is_enabled():\n"
          "        raise RuntimeError(\"no GradScaler on %s: the plan's fp16 needs loss scaling\"\n"
          "                           % DEVICE)\n", f);
}

static void torch_master(FILE *f, const ml_training *t)
{
    bool fp16 = t->precision == ML_PREC_FP16_MASTER;
    bool loop = t->optimizer_impl == ML_IMPL_FOR_LOOP;
    fprintf(f, "class MasterWeights:\n"
               "    \"\"\"%s: the optimizer steps on fp32 copies of the %s parameters; their\n"
               "    gradients are the %s gradients cast to fp32, %s, and the\n"
               "    %s parameters take the result.\"\"\"\n\n",
            ml_precision_name(t->precision), fp16 ? "fp16" : "bf16", fp16 ? "fp16" : "bf16",
            loop ? "one tensor at a time (n_max x 4 bytes)"
                 : "all at once (P x 4 bytes)",
            fp16 ? "fp16" : "bf16");
    fputs("    def __init__(self, model):\n"
          "        self.params = [p for p in model.parameters() if p.requires_grad]\n"
          "        self.master = [p.detach().float() for p in self.params]\n", f);
    if (loop)
        fputs("        # for-loop: one optimizer per tensor, so one fp32 gradient exists at a time\n"
              "        self.groups = [([p], [m], make_optimizer([m]))\n"
              "                       for p, m in zip(self.params, self.master)]\n", f);
    else
        fputs("        self.groups = [(self.params, self.master, make_optimizer(self.master))]\n",
              f);
    fputs("        self.optimizers = [g[2] for g in self.groups]\n\n"
          "    def step(self):\n"
          "        for params, master, optimizer in self.groups:\n"
          "            for p, m in zip(params, master):\n"
          "                m.grad = None if p.grad is None else p.grad.float()\n", f);
    fputs(fp16 ? "            SCALER.step(optimizer)  # unscales the fp32 copies; skips on inf/nan\n"
               : "            optimizer.step()\n", f);
    fputs("            with torch.no_grad():\n"
          "                for p, m in zip(params, master):\n"
          "                    p.copy_(m)\n"
          "                    m.grad = None\n", f);
    if (fp16)
        fputs("        SCALER.update()\n", f);
    fputs("\n    def zero_grad(self, set_to_none=True):\n"
          "        for p in self.params:\n"
          "            if set_to_none:\n"
          "                p.grad = None\n"
          "            elif p.grad is not None:\n"
          "                p.grad.zero_()\n\n\n", f);
}

static int torch_snippet(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                         const verdict *v)
{
    const ml_training *t = &cfg->training;
    ml_precision p = t->precision;
    bool scaler = p == ML_PREC_AMP_FP16 || p == ML_PREC_FP16_MASTER;
    const char *low = p == ML_PREC_AMP_FP16 || p == ML_PREC_FP16_MASTER ? "torch.float16"
                                                                        : "torch.bfloat16";
    bool low_model = p == ML_PREC_BF16 || is_master(p);
    char ck[1200];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    fputs("# memledger plan for ", f);
    comment_text(f, ml_model_name(m));
    fputs(": checkpoint ", f);
    comment_text(f, ck);
    fprintf(f, "\n# precision %s, optimizer %s (%s), logits %s, zero_grad %s\n",
            ml_precision_name(p), ml_optimizer_name(t->optimizer),
            ml_optimizer_impl_name(t->optimizer_impl), ml_logits_name(t->logits),
            ml_zero_grad_name(t->zero_grad));
    fputs("# Use: the model's forward runs its repeated blocks through run_blocks(blocks, x);\n"
          "# model, optimizer = setup(model); then, per optimizer step,\n"
          "# train_step(model, optimizer, micro_batches, loss_fn), micro_batches giving\n"
          "# GRAD_ACCUM (inputs, targets) pairs of MICRO_BATCH samples.\n", f);
    note_comments(f, v);
    torch_imports(f, t);
    fprintf(f, "\nDEVICE = \"cuda\"  # the plan's device; \"cpu\" to try the snippet on the host\n"
               "LR = 1e-4  # not part of the plan: yours\n"
               "MICRO_BATCH = %llu\nGRAD_ACCUM = %llu\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum);
    fputs("# checkpoint segments: (first block, last block), each recomputed as one unit\n"
          "CHECKPOINT_SEGMENTS = [", f);
    print_segments(f, l);
    fputs("]\n", f);
    if (scaler)
        fputs("SCALER = None  # fp16 needs loss scaling: setup() makes the GradScaler\n", f);
    fputs("\n\n", f);
    fputs(run_blocks_py, f);
    torch_make_optimizer(f, t);
    fputs("\n\n", f);
    if (is_master(p))
        torch_master(f, t);
    fputs("def setup(model):\n"
          "    \"\"\"The model on DEVICE in the plan's dtype, and what steps it.\"\"\"\n", f);
    if (scaler)
        torch_scaler(f);
    if (p == ML_PREC_BF16)
        fputs("    # everything bf16: parameters, gradients and the states that follow them\n"
              "    model = model.to(DEVICE, torch.bfloat16)\n"
              "    return model, make_optimizer(model.parameters())\n\n\n", f);
    else if (is_master(p))
        fprintf(f, "    model = model.to(DEVICE, %s)\n"
                   "    return model, MasterWeights(model)\n\n\n", low);
    else
        fprintf(f, "    # fp32 parameters, gradients and states%s\n"
                   "    model = model.to(DEVICE)\n"
                   "    return model, make_optimizer(model.parameters())\n\n\n",
                is_amp(p) ? "; the forward under autocast" : "");
    fputs("def forward_loss(model, inputs, targets, loss_fn):\n"
          "    out = model(inputs)\n"
          "    return out, loss_fn(out, targets) / GRAD_ACCUM\n\n\n"
          "def train_step(model, optimizer, micro_batches, loss_fn):\n"
          "    \"\"\"One optimizer step over GRAD_ACCUM micro-batches of MICRO_BATCH samples.\"\"\"\n"
          "    for inputs, targets in micro_batches:\n", f);
    if (low_model)
        fprintf(f, "        # floating-point inputs in the model's dtype\n"
                   "        inputs = inputs.to(DEVICE, %s) if inputs.is_floating_point() "
                   "else inputs.to(DEVICE)\n"
                   "        targets = targets.to(DEVICE)\n",
                low);
    else
        fputs("        inputs, targets = inputs.to(DEVICE), targets.to(DEVICE)\n", f);
    const char *ind = "        ";
    if (is_amp(p)) {
        fprintf(f, "        with torch.autocast(DEVICE, dtype=%s):\n", low);
        ind = "            ";
    }
    if (t->logits == ML_LOGITS_RELEASED)
        fprintf(f, "%s# logits released: the output is dropped once the loss is computed\n"
                   "%sloss = forward_loss(model, inputs, targets, loss_fn)[1]\n",
                ind, ind);
    else
        fprintf(f, "%s# logits kept: each output lives until the next loss is computed, the\n"
                   "%s# last one until the step is done (a plain loop's rebinding)\n"
                   "%sout, loss = forward_loss(model, inputs, targets, loss_fn)\n",
                ind, ind, ind);
    fputs(scaler ? "        SCALER.scale(loss).backward()\n" : "        loss.backward()\n", f);
    if (p == ML_PREC_AMP_FP16)
        fputs("    SCALER.step(optimizer)  # unscales the gradients in place; skips on inf/nan\n"
              "    SCALER.update()\n", f);
    else
        fputs("    optimizer.step()\n", f);
    fprintf(f, "    optimizer.zero_grad(set_to_none=%s)\n",
            t->zero_grad == ML_ZERO_GRAD_ZERO ? "False" : "True");
    return ferror(f) ? -1 : 0;
}

/* ---------------------------------------------------------------- entry */

typedef enum { EMIT_DEEPSPEED, EMIT_HF_TRAINER, EMIT_TORCH, EMIT_UNKNOWN } emit_kind;

static emit_kind kind_of(const char *kind)
{
    return !strcmp(kind, "deepspeed")    ? EMIT_DEEPSPEED
           : !strcmp(kind, "hf-trainer") ? EMIT_HF_TRAINER
           : !strcmp(kind, "torch")      ? EMIT_TORCH
                                         : EMIT_UNKNOWN;
}

static void check(emit_kind k, const ml_config *cfg, ckpt_shape s, verdict *v)
{
    memset(v, 0, sizeof *v);
    const ml_training *t = &cfg->training;
    if (k == EMIT_DEEPSPEED)
        ds_check(v, t, s, true);
    else if (k == EMIT_HF_TRAINER)
        hf_check(v, t, s);
    else
        torch_check(v, t, s);
}

int ml_report_emit_check(const char *kind, const ml_config *cfg, const ml_ledger *l, char *why,
                         size_t size)
{
    emit_kind k = kind_of(kind);
    if (size)
        why[0] = '\0';
    if (k == EMIT_UNKNOWN)
        return -2;
    verdict v;
    check(k, cfg, shape_of(cfg, l), &v);
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
    ckpt_shape s = shape_of(cfg, l);
    verdict v;
    check(k, cfg, s, &v);
    if (v.level == ML_EMIT_REFUSED)
        return -3; /* nothing written: the target would run a different setup */
    if (k == EMIT_DEEPSPEED)
        return deepspeed(f, cfg);
    if (k == EMIT_HF_TRAINER)
        return hf_trainer(f, cfg, s, &v);
    return torch_snippet(f, m, cfg, l, &v);
}
