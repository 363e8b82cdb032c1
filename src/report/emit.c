/* Settings for the tools people train with, from an evaluated plan:
 * a DeepSpeed config, Hugging Face TrainingArguments flags, a PyTorch loop. */
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"

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

static bool is_bf16(ml_precision p)
{
    return p == ML_PREC_AMP_BF16 || p == ML_PREC_BF16_MASTER || p == ML_PREC_BF16;
}

static bool is_fp16(ml_precision p)
{
    return p == ML_PREC_AMP_FP16 || p == ML_PREC_FP16_MASTER;
}

/* Checkpoint segments as [first, last] checkpoint indices. */
static size_t segments_of(const ml_ledger *l, int32_t (*seg)[2], size_t cap)
{
    size_t n = 0, nb = ml_ledger_block_count(l);
    for (size_t k = 0; k < nb; k++) {
        const ml_block_info *b = ml_ledger_block(l, k);
        if (b->segment < 0 || b->ckpt_index < 0)
            continue;
        if (n && k > 0 && ml_ledger_block(l, k - 1)->segment == b->segment)
            seg[n - 1][1] = b->ckpt_index;
        else if (n < cap) {
            seg[n][0] = seg[n][1] = b->ckpt_index;
            n++;
        }
    }
    return n;
}

static int deepspeed(FILE *f, const ml_config *cfg, const ml_ledger *l)
{
    const ml_training *t = &cfg->training;
    int32_t seg[1024][2];
    size_t ns = segments_of(l, seg, 1024);
    fprintf(f, "{\n  \"train_micro_batch_size_per_gpu\": %llu,\n"
               "  \"gradient_accumulation_steps\": %llu,\n  \"train_batch_size\": %llu,\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum,
            (unsigned long long)(t->micro_batch * t->grad_accum * t->data_parallel));
    fprintf(f, "  \"bf16\": {\"enabled\": %s},\n", is_bf16(t->precision) ? "true" : "false");
    fprintf(f, "  \"fp16\": {\"enabled\": %s%s},\n", is_fp16(t->precision) ? "true" : "false",
            is_fp16(t->precision) ? ", \"loss_scale\": 0" : "");
    fprintf(f, "  \"zero_optimization\": {\n    \"stage\": %u,\n    \"reduce_bucket_size\": %llu,\n"
               "    \"allgather_bucket_size\": %llu",
            t->zero, (unsigned long long)t->reduce_bucket, (unsigned long long)t->allgather_bucket);
    if (t->offload != ML_OFFLOAD_NONE)
        fputs(",\n    \"offload_optimizer\": {\"device\": \"cpu\", \"pin_memory\": true}", f);
    if (t->offload == ML_OFFLOAD_PARAMS)
        fputs(",\n    \"offload_param\": {\"device\": \"cpu\", \"pin_memory\": true}", f);
    fputs("\n  },\n", f);
    fprintf(f, "  \"activation_checkpointing\": {\n    \"partition_activations\": false,\n"
               "    \"cpu_checkpointing\": false,\n    \"contiguous_memory_optimization\": false,\n"
               "    \"number_checkpoints\": %zu\n  },\n",
            ns);
    fputs("  \"wall_clock_breakdown\": false\n}\n", f);
    return ferror(f) ? -1 : 0;
}

static int hf_trainer(FILE *f, const ml_config *cfg, const ml_ledger *l)
{
    const ml_training *t = &cfg->training;
    int32_t seg[1024][2];
    size_t ns = segments_of(l, seg, 1024);
    char ck[1200];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    fprintf(f, "# memledger: micro-batch %llu x %llu accumulation steps x %llu device%s = %llu\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum,
            (unsigned long long)t->data_parallel, t->data_parallel == 1 ? "" : "s",
            (unsigned long long)(t->micro_batch * t->grad_accum * t->data_parallel));
    if (t->checkpoint.kind != ML_CKPT_NONE && t->checkpoint.kind != ML_CKPT_FULL) {
        fputs("# the plan is '", f);
        comment_text(f, ck);
        fputs("': TrainingArguments can only checkpoint every layer, so\n"
              "# --gradient_checkpointing below recomputes more than the plan needs\n", f);
    }
    fprintf(f, "--per_device_train_batch_size %llu \\\n--gradient_accumulation_steps %llu",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum);
    if (ns || t->checkpoint.kind == ML_CKPT_SELECTIVE)
        fputs(" \\\n--gradient_checkpointing", f);
    if (is_bf16(t->precision))
        fputs(" \\\n--bf16", f);
    if (is_fp16(t->precision))
        fputs(" \\\n--fp16", f);
    if (t->optimizer == ML_OPT_ADAMW || t->optimizer == ML_OPT_ADAM)
        fprintf(f, " \\\n--optim %s",
                t->optimizer_impl == ML_IMPL_FUSED ? "adamw_torch_fused" : "adamw_torch");
    else if (t->optimizer == ML_OPT_ADAM_8BIT)
        fputs(" \\\n--optim adamw_bnb_8bit", f);
    else if (t->optimizer == ML_OPT_ADAFACTOR)
        fputs(" \\\n--optim adafactor", f);
    else if (t->optimizer == ML_OPT_SGD || t->optimizer == ML_OPT_SGD_MOMENTUM)
        fputs(" \\\n--optim sgd", f);
    if (t->zero)
        fputs(" \\\n--deepspeed ds_config.json  # memledger plan ... --emit deepspeed > "
              "ds_config.json", f);
    fputc('\n', f);
    return ferror(f) ? -1 : 0;
}

static int torch_snippet(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l)
{
    const ml_training *t = &cfg->training;
    int32_t seg[1024][2];
    size_t ns = segments_of(l, seg, 1024);
    char ck[1200];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    fputs("# memledger plan for ", f);
    comment_text(f, ml_model_name(m));
    fputs(": checkpoint ", f);
    comment_text(f, ck);
    fputc('\n', f);
    fputs("import torch\nfrom torch.utils.checkpoint import checkpoint\n\n", f);
    fprintf(f, "MICRO_BATCH = %llu\nGRAD_ACCUM = %llu\n", (unsigned long long)t->micro_batch,
            (unsigned long long)t->grad_accum);
    fputs("# checkpoint segments: (first block, last block), each recomputed as one unit\n"
          "CHECKPOINT_SEGMENTS = [", f);
    for (size_t i = 0; i < ns; i++)
        fprintf(f, "%s(%d, %d)", i ? ", " : "", seg[i][0], seg[i][1]);
    fputs("]\n", f);
    if (t->checkpoint.kind == ML_CKPT_SELECTIVE)
        fputs("# selective: inside each block, wrap only the attention core (QK^T, softmax,\n"
              "# dropout, PV) in checkpoint(); keep the projections and the MLP.\n", f);
    if (is_bf16(t->precision) || is_fp16(t->precision))
        fprintf(f, "AMP_DTYPE = torch.%s\n", is_bf16(t->precision) ? "bfloat16" : "float16");
    fputs("\n\ndef run_blocks(blocks, x):\n"
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
          "    return x\n\n\n", f);
    fputs("def train_step(model, optimizer, micro_batches):\n"
          "    \"\"\"One optimizer step over GRAD_ACCUM micro-batches of MICRO_BATCH.\"\"\"\n"
          "    for inputs, targets in micro_batches:\n", f);
    if (is_bf16(t->precision) || is_fp16(t->precision))
        fputs("        with torch.autocast(\"cuda\", dtype=AMP_DTYPE):\n"
              "            loss = model(inputs, targets) / GRAD_ACCUM\n", f);
    else
        fputs("        loss = model(inputs, targets) / GRAD_ACCUM\n", f);
    fputs("        loss.backward()\n"
          "        del loss  # drop the graph (and the logits) before the next forward\n"
          "    optimizer.step()\n"
          "    optimizer.zero_grad(set_to_none=True)\n\n\n", f);
    const char *opt = t->optimizer == ML_OPT_ADAM ? "Adam"
                      : t->optimizer == ML_OPT_SGD || t->optimizer == ML_OPT_SGD_MOMENTUM ? "SGD"
                                                                                          : "AdamW";
    fprintf(f, "# optimizer = torch.optim.%s(model.parameters(), lr=..., %s)\n", opt,
            t->optimizer_impl == ML_IMPL_FUSED     ? "fused=True"
            : t->optimizer_impl == ML_IMPL_FOREACH ? "foreach=True"
                                                   : "foreach=False");
    return ferror(f) ? -1 : 0;
}

int ml_report_emit(FILE *f, const char *kind, const ml_model *m, const ml_config *cfg,
                   const ml_ledger *l)
{
    if (!strcmp(kind, "deepspeed"))
        return deepspeed(f, cfg, l);
    if (!strcmp(kind, "hf-trainer"))
        return hf_trainer(f, cfg, l);
    if (!strcmp(kind, "torch"))
        return torch_snippet(f, m, cfg, l);
    return -2;
}
