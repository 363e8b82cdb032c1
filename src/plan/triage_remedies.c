/* triage's remedies: the table, each remedy's variant of the configuration,
 * the flags that apply it, what it changes in training, and its plan by the
 * ledger (docs/cli.md, "triage"). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain.h"
#include "memledger/plan.h"
#include "plan/triage_internal.h"
#include "util/error.h"

enum {
    F = 1u << ML_TRIAGE_FORWARD,
    B = 1u << ML_TRIAGE_BACKWARD,
    O = 1u << ML_TRIAGE_OPTIMIZER,
    E = 1u << ML_TRIAGE_EVAL,
};

/* The remedies: name, the phases whose memory they act on (the focus of
 * --oom-phase), the checkpoint policy, and what they change in training where
 * no figure enters it (describe() adds the rest). Indexed by kind, whose
 * order (least intrusive first) breaks ties in the ranking. */
static const struct {
    const char *name;
    unsigned focus;
    const char *policy;
    const char *changes;
} remedies[ML_REMEDY_COUNT] = {
    [ML_REMEDY_LOGITS_RELEASED] = {"logits-released", F | B, NULL,
        "the loop drops the model output once the loss is computed (del logits before "
        "backward, as Hugging Face's Trainer does); training unchanged"},
    [ML_REMEDY_ZERO_GRAD_NONE] = {"zero-grad-set-to-none", F, NULL,
        "optimizer.zero_grad(set_to_none=True), PyTorch 2.x's default: gradients freed after "
        "the step instead of zeroed; training unchanged"},
    [ML_REMEDY_EVAL_BATCH] = {"eval-batch", E, NULL, NULL},
    [ML_REMEDY_EXPANDABLE] = {"expandable-segments", 0, NULL,
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True: segments grow in place, so freed "
        "memory is reused across sizes (less fragmentation); training unchanged"},
    [ML_REMEDY_ATTENTION_SDPA] = {"attention-sdpa", F, NULL,
        "scaled_dot_product_attention (attn_implementation=\"sdpa\"): a fused kernel keeps q, "
        "k, v, the output and the logsumexp instead of the T x T probabilities and recomputes "
        "them in its backward; the same math"},
    [ML_REMEDY_MICRO_BATCH] = {"micro-batch", F, NULL, NULL},
    [ML_REMEDY_CKPT_FULL] = {"checkpoint-full", F, "full", NULL},
    [ML_REMEDY_CKPT_EVERY_2] = {"checkpoint-every-2", F, "every-2", NULL},
    [ML_REMEDY_CKPT_EVERY_4] = {"checkpoint-every-4", F, "every-4", NULL},
    [ML_REMEDY_CKPT_SQRT] = {"checkpoint-sqrt", F, "sqrt", NULL},
    [ML_REMEDY_CKPT_SELECTIVE] = {"checkpoint-selective", F, "selective", NULL},
    [ML_REMEDY_CKPT_OPTIMAL] = {"checkpoint-optimal", F, "optimal", NULL},
    [ML_REMEDY_ZERO_1] = {"zero-1", B | O, NULL, NULL},
    [ML_REMEDY_ZERO_2] = {"zero-2", B | O, NULL, NULL},
    [ML_REMEDY_ZERO_3] = {"zero-3", B | O, NULL, NULL},
    [ML_REMEDY_AMP_BF16] = {"amp-bf16", F, NULL,
        "torch.autocast(bfloat16): matmuls and their saved inputs in bf16; fp32 weights, "
        "gradients and optimizer states; no loss scaling (bf16 keeps fp32's exponent range); "
        "needs bf16 hardware (Ampere or later), else amp-fp16, which needs loss scaling "
        "(GradScaler)"},
    [ML_REMEDY_BF16_MASTER] = {"bf16-master", F | B | O, NULL,
        "bf16 weights, gradients and activations with fp32 master weights and optimizer "
        "states (DeepSpeed bf16, Megatron): updates exact in fp32, forward and backward in "
        "bf16; no loss scaling (fp16-master would need it)"},
    [ML_REMEDY_ADAM_8BIT] = {"adam-8bit", B | O, NULL,
        "bitsandbytes Adam8bit: both moments quantised to 8 bits in blocks of 256 values "
        "(tensors under 4,096 values keep fp32 states): the optimizer's numerics change"},
    [ML_REMEDY_ADAFACTOR] = {"adafactor", B | O, NULL,
        "Adafactor: the second moment factored into row and column statistics, no first "
        "moment: a different optimizer (retune the learning rate)"},
    [ML_REMEDY_OFFLOAD_OPTIMIZER] = {"offload-optimizer", B | O, NULL, NULL},
    [ML_REMEDY_OFFLOAD_PARAMS] = {"offload-params", B | O, NULL, NULL},
    [ML_REMEDY_TOKEN_BUDGET] = {"token-budget", F | B, NULL, NULL},
    [ML_REMEDY_LENGTH_BUCKETS] = {"length-buckets", F | B, NULL, NULL},
    [ML_REMEDY_LOGITS_FUSED] = {"fused-cross-entropy", F | B, NULL,
        "Liger Kernel's fused linear cross-entropy (liger-kernel; Hugging Face's Trainer: "
        "use_liger_kernel=True): the LM head and the loss run chunk by chunk, the logits never "
        "exist whole, the head's gradients are made in forward; the same math"},
};

const char *ml_remedy_name(ml_remedy_kind k)
{
    return (unsigned)k < ML_REMEDY_COUNT ? remedies[k].name : "?";
}

ml_status ml__triage_evaluate(const ml_model *m, const ml_config *c, ml_summary *out,
                              ml_error *err)
{
    ml_ledger *l = NULL;
    ml_status st = ml_ledger_evaluate(m, c, false, &l, err);
    if (st)
        return st;
    *out = *ml_ledger_summary(l);
    ml_ledger_destroy(l);
    return ML_OK;
}

/* A plan fits when the verdict says so and, for `optimal`, a plan met the
 * budget (as ml_compare). */
static bool fits(const ml_summary *s)
{
    return s->has_device && s->fits && s->plan_fits_budget;
}

/* The smaller micro-batch: the largest proper divisor d of B that fits with
 * A * B / d accumulation steps (the effective batch kept exactly); without a
 * device the largest proper divisor, and when none fits, 1 (the lowest peak).
 * Bisection over the divisors: the peak is monotone in the micro-batch at a
 * fixed plan (docs/choosing.md), and every candidate accumulates. */
static ml_status micro_batch_variant(const ml_triage_ctx *x, ml_config *c, bool *applies)
{
    const uint64_t b0 = x->cfg->training.micro_batch, a0 = x->cfg->training.grad_accum;
    uint64_t d[2048]; /* ascending; no micro-batch up to 2^24 has 2048 divisors */
    size_t n = 0;
    uint64_t r = 1;
    while ((r + 1) * (r + 1) <= b0)
        r++; /* floor(sqrt(b0)) */
    /* the divisors up to sqrt(b0), then their cofactors below b0, whose
     * accumulation a0 * b0 / d stays within its limit (2^20) */
    for (uint64_t k = 1; k <= r; k++)
        if (b0 % k == 0 && k < b0 && a0 * b0 <= k << 20)
            d[n++] = k;
    for (uint64_t k = r; k > 1; k--)
        if (b0 % k == 0 && b0 / k != k && a0 * k <= 1u << 20)
            d[n++] = b0 / k;
    *applies = n > 0;
    if (!n)
        return ML_OK;
    size_t pick = n - 1;
    if (x->cfg->device.present) {
        size_t lo = 0, hi = n; /* d[hi..] do not fit; the answer is below hi */
        bool any = false;
        while (lo < hi) {
            size_t mid = lo + (hi - lo) / 2;
            ml_summary s;
            c->training.micro_batch = d[mid];
            c->training.grad_accum = a0 * (b0 / d[mid]);
            ml_status st = ml__triage_evaluate(x->m, c, &s, x->err);
            if (st && st != ML_OVERFLOW)
                return st;
            if (!st && fits(&s)) {
                pick = mid;
                any = true;
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        if (!any)
            pick = 0;
    }
    c->training.micro_batch = d[pick];
    c->training.grad_accum = a0 * (b0 / d[pick]);
    return ML_OK;
}

static bool checkpoint_variant(const ml_triage_ctx *x, ml_remedy_kind k, ml_config *c)
{
    const ml_checkpoint *now = &x->cfg->training.checkpoint;
    ml_checkpoint *p = &c->training.checkpoint;
    ml_parse_checkpoint(remedies[k].policy, p, NULL);
    if (p->kind == now->kind && (p->kind != ML_CKPT_EVERY || p->every == now->every))
        return false;
    if (p->kind == ML_CKPT_SELECTIVE && !x->tr.attention)
        return false;
    return p->kind != ML_CKPT_OPTIMAL || c->device.present;
}

/* The variant of remedy k on top of cfg; false when it does not apply
 * (docs/cli.md, "triage", lists the rules). */
static bool variant_of(const ml_triage_ctx *x, ml_remedy_kind k, ml_config *c);

/* ... and false where the plan refuses the result (the fused linear
 * cross-entropy where it is not modelled, an encoder-decoder's optimal
 * checkpointing: the chain's own rules, ml__chain_refused). */
static bool variant(const ml_triage_ctx *x, ml_remedy_kind k, ml_config *c)
{
    ml_error e;
    return variant_of(x, k, c) && ml__chain_refused(x->m, &c->training, &e) == ML_OK;
}

static bool variant_of(const ml_triage_ctx *x, ml_remedy_kind k, ml_config *c)
{
    const ml_training *t0 = &x->cfg->training;
    const ml_summary *s0 = &x->r->current;
    ml_training *t = &c->training;
    bool adam = t0->optimizer == ML_OPT_ADAM || t0->optimizer == ML_OPT_ADAMW;
    switch (k) {
    case ML_REMEDY_AMP_BF16:
    case ML_REMEDY_BF16_MASTER:
        t->precision = k == ML_REMEDY_AMP_BF16 ? ML_PREC_AMP_BF16 : ML_PREC_BF16_MASTER;
        return t0->precision == ML_PREC_FP32; /* mixed or low precision already: no */
    case ML_REMEDY_ADAM_8BIT:
        t->optimizer = ML_OPT_ADAM_8BIT;
        return adam;
    case ML_REMEDY_ADAFACTOR:
        t->optimizer = ML_OPT_ADAFACTOR;
        if (t->optimizer_impl == ML_IMPL_FUSED)
            t->optimizer_impl = ML_IMPL_FOREACH; /* torch has no fused Adafactor */
        return adam;
    case ML_REMEDY_ZERO_1:
    case ML_REMEDY_ZERO_2:
    case ML_REMEDY_ZERO_3:
        t->zero = 1 + (unsigned)(k - ML_REMEDY_ZERO_1);
        /* the states shard over the dp x cp ranks */
        return (t0->data_parallel > 1 || t0->context_parallel > 1) && t0->zero < t->zero;
    case ML_REMEDY_OFFLOAD_OPTIMIZER:
        t->offload = ML_OFFLOAD_OPTIMIZER;
        return t0->offload == ML_OFFLOAD_NONE;
    case ML_REMEDY_OFFLOAD_PARAMS:
        t->zero = 3;
        t->offload = ML_OFFLOAD_PARAMS;
        return t0->offload != ML_OFFLOAD_PARAMS;
    case ML_REMEDY_ATTENTION_SDPA: /* the model's attention changes: see add_remedy */
        /* latent attention's sdpa is not modelled (the plan refuses it) */
        /* nor under Megatron's engine, whose attention is its own */
        return x->tr.transformer && x->m->attn.kernel == ML_ATTN_EAGER && !x->m->attn.kv_lora &&
               t0->engine != ML_ENGINE_MEGATRON;
    case ML_REMEDY_LOGITS_RELEASED:
        t->logits = ML_LOGITS_RELEASED;
        return t0->logits == ML_LOGITS_KEPT || t0->logits == ML_LOGITS_THROUGH_BACKWARD;
    case ML_REMEDY_LOGITS_FUSED: /* where modelled: variant() asks the chain */
        t->logits = ML_LOGITS_FUSED;
        t->logits_chunk = 0;
        return t0->logits != ML_LOGITS_FUSED;
    case ML_REMEDY_ZERO_GRAD_NONE:
        t->zero_grad = ML_ZERO_GRAD_SET_TO_NONE;
        return t0->zero_grad == ML_ZERO_GRAD_ZERO;
    case ML_REMEDY_EVAL_BATCH:
        t->eval_batch = t0->eval_batch / 2;
        return s0->has_eval && s0->binding == ML_PEAK_EVAL && t0->eval_batch >= 2;
    case ML_REMEDY_EXPANDABLE:
        /* the simulated reserved peak replaces the allowance */
        c->device.allocator = ML_ALLOCATOR_EXPANDABLE;
        c->device.fragmentation = 0;
        /* (max_split_size's rules are not simulated with expandable
         * segments: ml_config_problem refuses the pair) */
        return x->cfg->device.allocator != ML_ALLOCATOR_EXPANDABLE &&
               !x->cfg->device.max_split_size &&
               (x->cfg->device.allocator == ML_ALLOCATOR_CACHING ||
                x->cfg->device.fragmentation > 0 || x->r->observed.fragmented);
    default:
        return remedies[k].policy && checkpoint_variant(x, k, c);
    }
}

/* The host link's bandwidth, bytes/s: the device's pcie_gbps when given,
 * else the request's (docs/cli.md, "triage"). */
static double host_bandwidth(const ml_triage_ctx *x)
{
    double g = x->cfg->device.pcie_gbps;
    return g > 0 ? g * 1e9 : x->req->host_bandwidth;
}

/* The step time with offload's host transfers (the library's
 * host_transfer_bytes, docs/sharding.md), counted without overlap: the
 * summary's step time has them already when the device's pcie_gbps timed
 * them. */
double ml__triage_step_time(const ml_triage_ctx *x, const ml_summary *s)
{
    if (s->step_time_s < 0)
        return -1.0;
    return s->step_time_s +
           (s->time_host_transfer_s < 0 ? s->host_transfer_bytes / host_bandwidth(x) : 0);
}

void ml__triage_put(char *buf, size_t size, const char *fmt, ...)
{
    size_t n = strlen(buf);
    if (n + 1 >= size)
        return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf + n, size - n, fmt, ap);
    va_end(ap);
}

/* The flags that turn cfg into the variant c: every setting that differs. */
static void flags_of(const ml_config *c0, const ml_config *c, ml_remedy_kind k, char *buf,
                     size_t size)
{
    const ml_training *a = &c0->training, *t = &c->training;
    char ck[64];
    buf[0] = '\0';
    if (t->micro_batch != a->micro_batch)
        ml__triage_put(buf, size, " --micro-batch %llu", (unsigned long long)t->micro_batch);
    if (t->grad_accum != a->grad_accum)
        ml__triage_put(buf, size, " --grad-accum %llu", (unsigned long long)t->grad_accum);
    if (t->precision != a->precision)
        ml__triage_put(buf, size, " --precision %s", ml_precision_name(t->precision));
    if (t->optimizer != a->optimizer)
        ml__triage_put(buf, size, " --optimizer %s", ml_optimizer_name(t->optimizer));
    if (t->optimizer_impl != a->optimizer_impl)
        ml__triage_put(buf, size, " --optimizer-impl %s", ml_optimizer_impl_name(t->optimizer_impl));
    if (memcmp(&t->checkpoint, &a->checkpoint, sizeof t->checkpoint)) {
        ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
        ml__triage_put(buf, size, " --checkpoint %s", ck);
    }
    if (t->zero != a->zero)
        ml__triage_put(buf, size, " --zero %u", t->zero);
    if (t->offload != a->offload)
        ml__triage_put(buf, size, " --offload %s", ml_offload_name(t->offload));
    if (t->logits != a->logits)
        ml__triage_put(buf, size, " --logits %s", ml_logits_name(t->logits));
    if (t->zero_grad != a->zero_grad)
        ml__triage_put(buf, size, " --zero-grad %s", ml_zero_grad_name(t->zero_grad));
    if (t->eval_batch != a->eval_batch)
        ml__triage_put(buf, size, " --eval-batch %llu", (unsigned long long)t->eval_batch);
    if (c->device.allocator != c0->device.allocator)
        ml__triage_put(buf, size, " --allocator %s", ml_allocator_name(c->device.allocator));
    if (c->device.fragmentation != c0->device.fragmentation)
        ml__triage_put(buf, size, " --fragmentation %g", c->device.fragmentation);
    if (k == ML_REMEDY_ATTENTION_SDPA)
        ml__triage_put(buf, size, " --attention sdpa");
    if (buf[0] == ' ')
        memmove(buf, buf + 1, strlen(buf));
}

/* What the remedies whose text carries figures change: micro-batch, the
 * evaluation batch, ZeRO and offload. */
static void describe_figures(const ml_triage_ctx *x, ml_remedy *r)
{
    const ml_training *t0 = &x->cfg->training, *t = &r->config.training;
    char a[32], b[32];
    char *o = r->changes;
    const size_t n = sizeof r->changes;
    switch (r->kind) {
    case ML_REMEDY_MICRO_BATCH:
        ml__triage_put(o, n, "micro-batch %llu x %llu accumulation steps: the effective batch stays %llu "
                  "(x %llu devices); smaller GEMMs may run less efficiently (not modelled)",
            (unsigned long long)t->micro_batch, (unsigned long long)t->grad_accum,
            (unsigned long long)(t->micro_batch * t->grad_accum * t->data_parallel),
            (unsigned long long)t->data_parallel);
        if (x->tr.batchnorm)
            ml__triage_put(o, n, "; BatchNorm normalises over %llu samples instead of %llu: noisier batch "
                      "statistics (SyncBatchNorm or GroupNorm avoid it)",
                (unsigned long long)t->micro_batch, (unsigned long long)t0->micro_batch);
        return;
    case ML_REMEDY_EVAL_BATCH:
        ml__triage_put(o, n, "evaluation at %llu samples per forward instead of %llu: twice the "
                  "evaluation steps, the same metrics; training unchanged",
            (unsigned long long)t->eval_batch, (unsigned long long)t0->eval_batch);
        return;
    case ML_REMEDY_ZERO_1:
    case ML_REMEDY_ZERO_2:
    case ML_REMEDY_ZERO_3:
        ml__triage_put(o, n, "ZeRO stage %u over %llu devices shards %s: the same updates", t->zero,
            (unsigned long long)(t->data_parallel *
                                 ml_training_cp(t)),
            t->zero == 1   ? "optimizer states and master weights"
            : t->zero == 2 ? "optimizer states, master weights and gradients"
                           : "optimizer states, master weights, gradients and parameters");
        return;
    default: /* offload */
        ml_format_bytes(r->host_bytes, a, sizeof a);
        ml_format_bytes((uint64_t)r->host_transfer, b, sizeof b);
        ml__triage_put(o, n, "%s on the host (%s): needs %s of host memory per device and moves %s over "
                  "the host link per iteration (%.3g s at %.3g GB/s, counted without overlap); "
                  "the host's optimizer step time is not modelled",
            r->kind == ML_REMEDY_OFFLOAD_PARAMS
                ? "parameters, optimizer states, master weights and the update"
                : "optimizer states, master weights and the update",
            r->kind == ML_REMEDY_OFFLOAD_PARAMS ? "ZeRO-3 offload_param, ZeRO-Infinity"
                                                : "ZeRO-Offload, CPU Adam",
            a, b, r->host_transfer / host_bandwidth(x), host_bandwidth(x) / 1e9);
    }
}

/* What remedy r changes in training (s: its plan): the table's text, or the
 * figures, then what dropout, fragmentation and communication add. */
static void describe(const ml_triage_ctx *x, ml_remedy *r, const ml_summary *s)
{
    const ml_remedy_kind k = r->kind;
    char a[32], b[32];
    char *o = r->changes;
    const size_t n = sizeof r->changes;
    if (remedies[k].changes) {
        ml__triage_put(o, n, "%s", remedies[k].changes);
    } else if (remedies[k].policy) {
        ml_format_flops(s->flops_recompute, a, sizeof a);
        ml__triage_put(o, n, "recomputes %s per iteration (FLOPs x %.3f); the same math", a, r->flops_ratio);
        if (k == ML_REMEDY_CKPT_OPTIMAL)
            ml__triage_put(o, n, "; %s", s->plan);
        if (k == ML_REMEDY_CKPT_SELECTIVE)
            ml__triage_put(o, n, "; only the attention core is recomputed%s",
                x->tr.dropout ? "; its dropout mask is regenerated from the saved RNG state" : "");
        else if (x->tr.dropout)
            ml__triage_put(o, n, "; dropout in recomputed blocks: torch.utils.checkpoint saves and "
                      "restores the RNG state (preserve_rng_state=True) so the masks match");
    } else {
        describe_figures(x, r);
    }
    if (k == ML_REMEDY_ATTENTION_SDPA && x->tr.dropout)
        ml__triage_put(o, n, " (its dropout draws a different random stream)");
    if (k == ML_REMEDY_EXPANDABLE && x->r->observed.fragmented)
        ml__triage_put(o, n, "; the failing run reserved %.0f%% more than it allocated",
            100 * x->r->observed.fragmentation);
    if (s->comm_bytes != x->r->current.comm_bytes) {
        ml_format_bytes((uint64_t)x->r->current.comm_bytes, a, sizeof a);
        ml_format_bytes((uint64_t)s->comm_bytes, b, sizeof b);
        ml__triage_put(o, n, "; communication per device %s -> %s per iteration", a, b);
    }
}

bool ml__triage_in_focus(const ml_triage_ctx *x, ml_remedy_kind k)
{
    return x->req->oom_phase != ML_TRIAGE_ANY && (remedies[k].focus & (1u << x->req->oom_phase));
}

/* Expandable segments are listed when the run was seen fragmented even
 * without a lower peak: the plan cannot show what they would save. */
ml_status ml__triage_add_remedy(const ml_triage_ctx *x, ml_remedy_kind k, ml_triage_result *r)
{
    ml_config c = *x->cfg;
    bool ok = false;
    ml_status st = ML_OK;
    if (k == ML_REMEDY_TOKEN_BUDGET || k == ML_REMEDY_LENGTH_BUCKETS)
        return ml__triage_add_lengths_remedy(x, k, r);
    if (k == ML_REMEDY_MICRO_BATCH)
        st = x->cfg->training.micro_batch > 1 && ml__triage_fixed_micro_batch(x->req)
                 ? micro_batch_variant(x, &c, &ok)
                 : ML_OK;
    else
        ok = variant(x, k, &c);
    if (st || !ok)
        return st;
    ml_model sdpa;
    const ml_model *m = x->m;
    if (k == ML_REMEDY_ATTENTION_SDPA) {
        sdpa = *x->m; /* a shallow copy: the ledger only reads the model */
        sdpa.attn.kernel = ML_ATTN_SDPA;
        m = &sdpa;
    }
    ml_summary s;
    st = ml__triage_evaluate(m, &c, &s, x->err);
    if (st == ML_OVERFLOW)
        return ML_OK; /* too large to represent: no remedy */
    if (st)
        return st;
    /* a remedy is one that lowers the device total; where the current plan
     * runs out in the allocator simulation, its total stops there, so one
     * that fits is a remedy whatever its total */
    if (s.peak_total >= r->current.peak_total &&
        !(k == ML_REMEDY_EXPANDABLE && r->observed.fragmented) &&
        !(r->current.reserved_oom_weighed && fits(&s)))
        return ML_OK;
    ml_remedy *rm = &r->remedies[r->count++];
    memset(rm, 0, sizeof *rm);
    rm->kind = k;
    rm->config = c;
    flags_of(x->cfg, &c, k, rm->flags, sizeof rm->flags);
    rm->peak = ml_summary_binding_peak(&s);
    rm->peak_total = s.peak_total;
    rm->has_device = s.has_device;
    rm->fits = fits(&s);
    rm->in_focus = ml__triage_in_focus(x, k);
    rm->flops_total = s.flops_total;
    rm->flops_ratio = r->current.flops_total > 0 ? s.flops_total / r->current.flops_total : 1;
    rm->host_bytes = s.bytes_host;
    rm->host_transfer = s.host_transfer_bytes;
    rm->comm_bytes = s.comm_bytes;
    rm->step_time_s = ml__triage_step_time(x, &s);
    rm->slowdown = rm->step_time_s >= 0 && r->step_time_s > 0 ? rm->step_time_s / r->step_time_s
                                                               : rm->flops_ratio;
    describe(x, rm, &s);
    return ML_OK;
}
