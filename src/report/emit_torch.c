/* --emit torch: a PyTorch training loop that runs the plan on one device:
 * docs/precision.md's policies, docs/optimizers.md's classes and
 * implementations, the ledger's checkpoint segments and docs/ledger.md's
 * loop references. */
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "report/emit_internal.h"
#include "report/report_internal.h"

void ml__emit_torch_check(ml_emit_verdict *v, const ml_training *t, ml_ckpt_shape s)
{
    if (t->zero || t->offload != ML_OFFLOAD_NONE)
        ml__emit_refuse(v, "the snippet is one process on one device; ZeRO sharding (--zero %u) and "
                          "offload are DeepSpeed's: --emit deepspeed or hf-trainer",
                       t->zero);
    if (ml__emit_is_master(t->precision) && t->optimizer_impl == ML_IMPL_FUSED)
        ml__emit_refuse(v, "torch's fused optimizers step parameters in their gradients' dtype; the "
                          "plan's fused %s step reads the low-precision gradients into the fp32 "
                          "master weights with no copy (DeepSpeed's kernels): --emit deepspeed, or "
                          "plan with --optimizer-impl foreach",
                       ml_precision_name(t->precision));
    if (t->precision == ML_PREC_FP16_MASTER && t->optimizer_impl == ML_IMPL_FOR_LOOP)
        ml__emit_refuse(v, "fp16-master with a for-loop step means one optimizer per tensor under "
                          "loss scaling, and GradScaler skips an overflowing step per optimizer "
                          "(some tensors would step, others not): plan with --optimizer-impl "
                          "foreach");
    if (t->optimizer == ML_OPT_ADAFACTOR && t->optimizer_impl == ML_IMPL_FUSED)
        ml__emit_refuse(v, "torch.optim.Adafactor has no fused implementation");
    if (s.selective)
        ml__emit_note(v, "selective checkpointing is inside each block: in the block's forward, "
                        "wrap the attention core (QK^T, softmax, dropout, PV) in checkpoint(..., "
                        "use_reentrant=False) and keep the projections and the MLP outside");
    if (t->logits == ML_LOGITS_FUSED)
        ml__emit_note(v, "the loss is Liger Kernel's fused linear cross-entropy (--logits fused): "
                        "in forward_loss, compute it with liger_kernel.transformers' "
                        "LigerFusedLinearCrossEntropyLoss()(lm_head.weight, hidden_states, "
                        "targets) on the final norm's output instead of the logits");
    if (t->data_parallel > 1)
        ml__emit_note(v, "data_parallel %llu: one process per device, the model wrapped in "
                        "DistributedDataParallel(model, gradient_as_bucket_view=True) after "
                        "setup() (the plan counts no bucket copies: docs/sharding.md)",
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

static void torch_imports(FILE *f, const ml_training *t, ml_allocator a)
{
    /* read when CUDA initialises: before torch is imported */
    if (a == ML_ALLOCATOR_EXPANDABLE)
        fputs("import os\nos.environ.setdefault(\"PYTORCH_CUDA_ALLOC_CONF\", "
              "\"expandable_segments:True\")  # the plan's allocator\n", f);
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

/* The snippet's head: what was planned (as comments), the imports and the
 * constants (the segments, the scaler's slot). */
static void torch_preamble(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                           const ml_emit_verdict *v, bool scaler)
{
    const ml_training *t = &cfg->training;
    ml_precision p = t->precision;
    char ck[1200];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    fputs("# memledger plan for ", f);
    ml__emit_comment_text(f, ml_model_name(m));
    fputs(": checkpoint ", f);
    ml__emit_comment_text(f, ck);
    fprintf(f, "\n# precision %s, optimizer %s (%s), logits %s, zero_grad %s\n",
            ml_precision_name(p), ml_optimizer_name(t->optimizer),
            ml_optimizer_impl_name(t->optimizer_impl), ml_logits_name(t->logits),
            ml_zero_grad_name(t->zero_grad));
    fputs("# Use: the model's forward runs its repeated blocks through run_blocks(blocks, x);\n"
          "# model, optimizer = setup(model); then, per optimizer step,\n"
          "# train_step(model, optimizer, micro_batches, loss_fn), micro_batches giving\n"
          "# GRAD_ACCUM (inputs, targets) pairs of MICRO_BATCH samples.\n", f);
    ml__emit_allocator_comment(f, &cfg->device);
    ml__emit_note_comments(f, v);
    torch_imports(f, t, cfg->device.allocator);
    fprintf(f, "\nDEVICE = \"cuda\"  # the plan's device; \"cpu\" to try the snippet on the host\n"
               "LR = 1e-4  # not part of the plan: yours\n"
               "MICRO_BATCH = %llu\nGRAD_ACCUM = %llu\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum);
    fputs("# checkpoint segments: (first block, last block), each recomputed as one unit\n"
          "CHECKPOINT_SEGMENTS = [", f);
    ml__emit_print_segments(f, l);
    fputs("]\n", f);
    if (scaler)
        fputs("SCALER = None  # fp16 needs loss scaling: setup() makes the GradScaler\n", f);
    fputs("\n\n", f);
}

/* setup(model): the model on the device in the plan's dtype (low: the
 * low-precision torch dtype), and what steps it. */
static void torch_setup(FILE *f, ml_precision p, const char *low, bool scaler)
{
    fputs("def setup(model):\n"
          "    \"\"\"The model on DEVICE in the plan's dtype, and what steps it.\"\"\"\n", f);
    if (scaler)
        torch_scaler(f);
    if (p == ML_PREC_BF16)
        fputs("    # everything bf16: parameters, gradients and the states that follow them\n"
              "    model = model.to(DEVICE, torch.bfloat16)\n"
              "    return model, make_optimizer(model.parameters())\n\n\n", f);
    else if (ml__emit_is_master(p))
        fprintf(f, "    model = model.to(DEVICE, %s)\n"
                   "    return model, MasterWeights(model)\n\n\n", low);
    else
        fprintf(f, "    # fp32 parameters, gradients and states%s\n"
                   "    model = model.to(DEVICE)\n"
                   "    return model, make_optimizer(model.parameters())\n\n\n",
                ml__emit_is_amp(p) ? "; the forward under autocast" : "");
}

/* forward_loss() and train_step(): the micro-batches under the plan's
 * precision, logits and zero_grad. */
static void torch_train_step(FILE *f, const ml_training *t, const char *low, bool scaler)
{
    ml_precision p = t->precision;
    bool low_model = p == ML_PREC_BF16 || ml__emit_is_master(p);
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
    if (ml__emit_is_amp(p)) {
        fprintf(f, "        with torch.autocast(DEVICE, dtype=%s):\n", low);
        ind = "            ";
    }
    if (t->logits == ML_LOGITS_RELEASED)
        fprintf(f, "%s# logits released: the output is dropped once the loss is computed\n"
                   "%sloss = forward_loss(model, inputs, targets, loss_fn)[1]\n",
                ind, ind);
    else if (t->logits == ML_LOGITS_THROUGH_BACKWARD)
        fprintf(f, "%s# logits through-backward: the output lives through the backward and\n"
                   "%s# is dropped after it, before the next micro-batch and the step\n"
                   "%sout, loss = forward_loss(model, inputs, targets, loss_fn)\n",
                ind, ind, ind);
    else
        fprintf(f, "%s# logits kept: each output lives until the next loss is computed, the\n"
                   "%s# last one until the step is done (a plain loop's rebinding)\n"
                   "%sout, loss = forward_loss(model, inputs, targets, loss_fn)\n",
                ind, ind, ind);
    fputs(scaler ? "        SCALER.scale(loss).backward()\n" : "        loss.backward()\n", f);
    if (t->logits == ML_LOGITS_THROUGH_BACKWARD)
        fputs("        del out\n", f);
    if (p == ML_PREC_AMP_FP16)
        fputs("    SCALER.step(optimizer)  # unscales the gradients in place; skips on inf/nan\n"
              "    SCALER.update()\n", f);
    else
        fputs("    optimizer.step()\n", f);
    fprintf(f, "    optimizer.zero_grad(set_to_none=%s)\n",
            t->zero_grad == ML_ZERO_GRAD_ZERO ? "False" : "True");
}

int ml__emit_torch(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                   const ml_emit_verdict *v)
{
    const ml_training *t = &cfg->training;
    ml_precision p = t->precision;
    bool scaler = p == ML_PREC_AMP_FP16 || p == ML_PREC_FP16_MASTER;
    const char *low = p == ML_PREC_AMP_FP16 || p == ML_PREC_FP16_MASTER ? "torch.float16"
                                                                        : "torch.bfloat16";
    torch_preamble(f, m, cfg, l, v, scaler);
    fputs(run_blocks_py, f);
    torch_make_optimizer(f, t);
    fputs("\n\n", f);
    if (ml__emit_is_master(p))
        torch_master(f, t);
    torch_setup(f, p, low, scaler);
    torch_train_step(f, t, low, scaler);
    return ferror(f) ? -1 : 0;
}
