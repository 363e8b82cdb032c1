/* triage: each remedy's peak against a direct evaluation of the same
 * variant built here from the rules of docs/cli.md ("triage"), the
 * applicability rules, the micro-batch search, the ranking and the observed
 * figures. */
#include "harness.h"

/* Five 256 x 256 linears with GELUs between, bf16, Adam (foreach): every
 * boundary is u = 512 B per sample (tests/cli/cases/triage-forward derives
 * its peaks by hand). */
static const char *deep =
    "name: deep\nmodel:\n  type: sequential\n  input: [256]\n  layers:\n"
    "    - linear: {out: 256, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 256, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 256, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 256, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 256, bias: false}\n  loss: mse\n"
    "training:\n  micro_batch: 1024\n  precision: bf16\n  optimizer: adam\n"
    "  optimizer_impl: foreach\n";

/* A small decoder with eager attention and dropout; %s is its attention. */
static const char *decoder_fmt =
    "name: dec\nmodel:\n  type: decoder\n  layers: 4\n  hidden: 64\n  heads: 4\n"
    "  vocab: 100\n  max_positions: 64\n  dropout: 0.1\n  attention: %s\n"
    "training:\n  micro_batch: 8\n  seq_len: 64\n  optimizer: adamw\n  optimizer_impl: fused\n";

/* A small CNN with BatchNorm. */
static const char *cnn =
    "name: cnn\nmodel:\n  type: sequential\n  input: [3, 16, 16]\n  layers:\n"
    "    - conv2d: {out: 16, kernel: 3, padding: 1, bias: false}\n    - batchnorm: {}\n"
    "    - relu: {}\n    - conv2d: {out: 16, kernel: 3, padding: 1, bias: false}\n"
    "    - batchnorm: {}\n    - relu: {}\n    - flatten: {}\n    - linear: {out: 10}\n"
    "  loss: cross_entropy\ntraining:\n  micro_batch: 96\n  optimizer: sgd-momentum\n";

/* The tiny MLP of test_ledger_invariants.c's three peaks. */
static const char *tiny =
    "name: tiny\nmodel:\n  type: sequential\n  input: [8]\n  layers:\n"
    "    - linear: {out: 16, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 4, bias: false}\n  loss: mse\n"
    "training:\n  micro_batch: 30\n  optimizer: adam\n  optimizer_impl: foreach\n";

static ml_model *decoder(const char *attention)
{
    char buf[512];
    snprintf(buf, sizeof buf, decoder_fmt, attention);
    return load_str(buf);
}

static void device(ml_config *c, uint64_t memory, uint64_t budget, uint64_t reserve)
{
    c->device.present = true;
    c->device.memory = memory;
    c->device.budget = budget;
    c->device.runtime_reserve = reserve;
    c->device.blas_workspace = 0; /* devices of a few MiB: no cuBLAS workspaces */
}

static ml_triage_result *triage(const ml_model *m, const ml_config *c, ml_triage_request req)
{
    ml_triage_result *r = malloc(sizeof *r);
    ml_error e;
    assert_non_null(r);
    ml_status st = ml_triage(m, c, &req, r, &e);
    if (st)
        fail_msg("ml_triage: %s: %s", ml_status_name(st), e.msg);
    return r;
}

static const ml_remedy *find(const ml_triage_result *r, ml_remedy_kind k)
{
    for (size_t i = 0; i < r->count; i++)
        if (r->remedies[i].kind == k)
            return &r->remedies[i];
    return NULL;
}

static uint64_t binding(const ml_summary *s)
{
    return s->binding == ML_PEAK_EVAL              ? s->peak_eval
           : s->binding == ML_PEAK_FIRST_ITERATION ? s->peak_first_iteration
                                                   : s->peak;
}

/* The variant of kind k on top of c, from the rules as documented; the
 * micro-batch remedy's choice is checked separately (its product must keep
 * the effective batch). */
static ml_config variant_of(const ml_config *c, const ml_remedy *rm)
{
    ml_config v = *c;
    ml_training *t = &v.training;
    static const char *const pol[] = {"full", "every-2", "every-4", "sqrt", "selective",
                                      "optimal"};
    switch (rm->kind) {
    case ML_REMEDY_LOGITS_RELEASED: t->logits = ML_LOGITS_RELEASED; break;
    case ML_REMEDY_LOGITS_FUSED:
        t->logits = ML_LOGITS_FUSED;
        t->logits_chunk = 0;
        break;
    case ML_REMEDY_ZERO_GRAD_NONE: t->zero_grad = ML_ZERO_GRAD_SET_TO_NONE; break;
    case ML_REMEDY_EVAL_BATCH: t->eval_batch /= 2; break;
    case ML_REMEDY_EXPANDABLE:
        v.device.allocator = ML_ALLOCATOR_EXPANDABLE;
        v.device.fragmentation = 0;
        break;
    case ML_REMEDY_ATTENTION_SDPA: break; /* the model changes, not the config */
    case ML_REMEDY_MICRO_BATCH:
        assert_int_equal(rm->config.training.micro_batch * rm->config.training.grad_accum,
                         t->micro_batch * t->grad_accum);
        assert_true(rm->config.training.micro_batch < t->micro_batch);
        t->micro_batch = rm->config.training.micro_batch;
        t->grad_accum = rm->config.training.grad_accum;
        break;
    case ML_REMEDY_ZERO_1: t->zero = 1; break;
    case ML_REMEDY_ZERO_2: t->zero = 2; break;
    case ML_REMEDY_ZERO_3: t->zero = 3; break;
    case ML_REMEDY_AMP_BF16: t->precision = ML_PREC_AMP_BF16; break;
    case ML_REMEDY_BF16_MASTER: t->precision = ML_PREC_BF16_MASTER; break;
    case ML_REMEDY_ADAM_8BIT: t->optimizer = ML_OPT_ADAM_8BIT; break;
    case ML_REMEDY_ADAFACTOR:
        t->optimizer = ML_OPT_ADAFACTOR;
        if (t->optimizer_impl == ML_IMPL_FUSED)
            t->optimizer_impl = ML_IMPL_FOREACH;
        break;
    case ML_REMEDY_OFFLOAD_OPTIMIZER: t->offload = ML_OFFLOAD_OPTIMIZER; break;
    case ML_REMEDY_OFFLOAD_PARAMS:
        t->zero = 3;
        t->offload = ML_OFFLOAD_PARAMS;
        break;
    default:
        assert_in_range(rm->kind, ML_REMEDY_CKPT_FULL, ML_REMEDY_CKPT_OPTIMAL);
        assert_int_equal(ml_parse_checkpoint(pol[rm->kind - ML_REMEDY_CKPT_FULL], &t->checkpoint,
                                             NULL),
                         ML_OK);
    }
    return v;
}

/* Every remedy of r, planned again here: the same peak, peak total, verdict
 * and FLOPs; the flags name what changed. sdpa is the model with attention:
 * sdpa, loaded from its own text. */
static void check_against_direct(const ml_model *m, const ml_model *sdpa, const ml_config *c,
                                 const ml_triage_result *r)
{
    ml_ledger *l0 = eval(m, c, false);
    const ml_summary *s0 = ml_ledger_summary(l0);
    assert_int_equal(r->current.peak_total, s0->peak_total);
    assert_int_equal(r->peak, binding(s0));
    for (size_t i = 0; i < r->count; i++) {
        const ml_remedy *rm = &r->remedies[i];
        ml_config v = variant_of(c, rm);
        assert_int_equal(rm->config.training.precision, v.training.precision);
        assert_int_equal(rm->config.training.zero, v.training.zero);
        assert_int_equal(rm->config.training.checkpoint.kind, v.training.checkpoint.kind);
        const ml_model *vm = rm->kind == ML_REMEDY_ATTENTION_SDPA ? sdpa : m;
        assert_non_null(vm);
        ml_ledger *l = eval(vm, &v, false);
        const ml_summary *s = ml_ledger_summary(l);
        if (rm->peak != binding(s) || rm->peak_total != s->peak_total)
            fail_msg("%s: peak %llu / total %llu, direct %llu / %llu", ml_remedy_name(rm->kind),
                     (unsigned long long)rm->peak, (unsigned long long)rm->peak_total,
                     (unsigned long long)binding(s), (unsigned long long)s->peak_total);
        assert_int_equal(rm->fits, s->has_device && s->fits && s->plan_fits_budget);
        assert_rel_close(rm->flops_ratio, s->flops_total / s0->flops_total, 1e-12);
        /* listed only when it lowers the peak total */
        assert_true(rm->peak_total < s0->peak_total);
        assert_true(rm->flags[0] != '\0');
        assert_true(rm->changes[0] != '\0');
        ml_ledger_destroy(l);
    }
    ml_ledger_destroy(l0);
}

static void test_remedies_match_direct_evaluation(void **state)
{
    (void)state;
    ml_triage_request req = ml_triage_request_defaults();
    /* the deep MLP on a 7 MiB budget */
    ml_model *m = load_str(deep);
    ml_config c = config_allocated(m);
    device(&c, 1ull << 30, 7ull << 20, 512ull << 20);
    ml_triage_result *r = triage(m, &c, req);
    assert_true(r->count >= 6);
    check_against_direct(m, NULL, &c, r);
    free(r);
    ml_model_destroy(m);
    /* mlp2 over 4 devices, with a throughput */
    m = load_preset("mlp2");
    c = config_allocated(m);
    c.training.data_parallel = 4;
    device(&c, 1ull << 30, 288ull << 20, 512ull << 20);
    c.device.peak_tflops = 100;
    c.device.efficiency = 0.5;
    r = triage(m, &c, req);
    assert_non_null(find(r, ML_REMEDY_ZERO_1));
    check_against_direct(m, NULL, &c, r);
    free(r);
    ml_model_destroy(m);
    /* a decoder (eager attention, dropout, fused AdamW) over 2 devices with
     * a fragmentation allowance, which expandable segments replace with the
     * simulated reserved peak */
    m = decoder("eager");
    ml_model *sdpa = decoder("sdpa");
    c = config_allocated(m);
    c.training.data_parallel = 2;
    device(&c, 64ull << 20, 5ull << 20, 8ull << 20);
    c.device.fragmentation = 0.3;
    r = triage(m, &c, req);
    assert_non_null(find(r, ML_REMEDY_ATTENTION_SDPA));
    assert_non_null(find(r, ML_REMEDY_CKPT_SELECTIVE));
    assert_non_null(find(r, ML_REMEDY_EXPANDABLE));
    check_against_direct(m, sdpa, &c, r);
    free(r);
    ml_model_destroy(m);
    ml_model_destroy(sdpa);
    /* a CNN without a device */
    m = load_str(cnn);
    c = config_allocated(m);
    r = triage(m, &c, req);
    check_against_direct(m, NULL, &c, r);
    for (size_t i = 0; i < r->count; i++)
        assert_false(r->remedies[i].fits);
    free(r);
    ml_model_destroy(m);
}

static bool fits_at(const ml_model *m, ml_config c, uint64_t b, uint64_t a)
{
    c.training.micro_batch = b;
    c.training.grad_accum = a;
    ml_ledger *l = eval(m, &c, false);
    bool f = ml_ledger_summary(l)->fits;
    ml_ledger_destroy(l);
    return f;
}

/* The deep MLP by hand (triage-forward's why): with accumulation the later
 * micro-batch's backward through 8:linear holds R + 6G + 14u' with R =
 * 1,966,080 (params + states), G = 131,072 (one linear's bf16 gradient), u'
 * = 512 B x b (the batch, x and the target, among the 14). Under a 5 MiB
 * budget (5,242,880) 14 x 512 x b <= 2,490,368 gives b <= 347: the largest
 * divisor of 1024 is 256 (x 4 steps), whose peak is 2,752,512 + 1,835,008 =
 * 4,587,520; 512 needs 6,422,528. A prime batch has only 1 below it;
 * micro-batch 1 has no smaller one. */
static void test_micro_batch_search(void **state)
{
    (void)state;
    ml_triage_request req = ml_triage_request_defaults();
    ml_model *m = load_str(deep);
    ml_config c = config_allocated(m);
    device(&c, 1ull << 30, 5ull << 20, 512ull << 20);
    ml_triage_result *r = triage(m, &c, req);
    const ml_remedy *mb = find(r, ML_REMEDY_MICRO_BATCH);
    assert_non_null(mb);
    assert_int_equal(mb->config.training.micro_batch, 256);
    assert_int_equal(mb->config.training.grad_accum, 4);
    assert_int_equal(mb->peak, 4587520);
    assert_true(mb->fits);
    assert_false(fits_at(m, c, 512, 2));
    free(r);
    c.training.micro_batch = 7;
    r = triage(m, &c, req);
    mb = find(r, ML_REMEDY_MICRO_BATCH);
    assert_non_null(mb);
    assert_int_equal(mb->config.training.micro_batch, 1);
    assert_int_equal(mb->config.training.grad_accum, 7);
    free(r);
    c.training.micro_batch = 1;
    r = triage(m, &c, req);
    assert_null(find(r, ML_REMEDY_MICRO_BATCH));
    free(r);
    /* accumulation stays within its limit, 2^20 steps */
    c.training.micro_batch = 4;
    c.training.grad_accum = 1u << 19;
    r = triage(m, &c, req);
    mb = find(r, ML_REMEDY_MICRO_BATCH);
    assert_non_null(mb);
    assert_int_equal(mb->config.training.micro_batch, 2);
    assert_int_equal(mb->config.training.grad_accum, 1u << 20);
    free(r);
    c.training.grad_accum = 1u << 20;
    r = triage(m, &c, req);
    assert_null(find(r, ML_REMEDY_MICRO_BATCH));
    free(r);
    c.training.grad_accum = 1;
    /* nothing fits: micro-batch 1, the lowest peak, reported as not fitting */
    c.training.micro_batch = 1024;
    c.device.budget = 1ull << 20;
    r = triage(m, &c, req);
    mb = find(r, ML_REMEDY_MICRO_BATCH);
    assert_non_null(mb);
    assert_int_equal(mb->config.training.micro_batch, 1);
    assert_false(mb->fits);
    free(r);
    ml_model_destroy(m);
}

static bool has(const ml_model *m, const ml_config *c, ml_remedy_kind k)
{
    ml_triage_result *r = triage(m, c, ml_triage_request_defaults());
    bool found = find(r, k) != NULL;
    free(r);
    return found;
}

/* The fused cross-entropy remedy: a decoder's logits not fused yet, without
 * autocast or sharded gradients; its peak is the plan with --logits fused,
 * whose forward makes no logits (test_fused.c derives that plan). */
static void test_fused_remedy(void **state)
{
    (void)state;
    /* a vocabulary large enough for the logits (8 x 64 x 5000 x 4 B) to
     * set the peak */
    ml_model *m = load_str("name: lm\nmodel:\n  type: decoder\n  layers: 2\n  hidden: 64\n"
                           "  heads: 4\n  vocab: 5000\n  max_positions: 64\n  dropout: 0\n"
                           "training:\n  micro_batch: 8\n  seq_len: 64\n");
    ml_config c = config_allocated(m);
    device(&c, 1ull << 30, 0, 512ull << 20);
    ml_triage_result *r = triage(m, &c, ml_triage_request_defaults());
    const ml_remedy *f = find(r, ML_REMEDY_LOGITS_FUSED);
    assert_non_null(f);
    assert_int_equal(f->config.training.logits, ML_LOGITS_FUSED);
    assert_string_equal(f->flags, "--logits fused");
    ml_config cf = c;
    cf.training.logits = ML_LOGITS_FUSED;
    ml_ledger *l = eval(m, &cf, false);
    assert_int_equal(f->peak, binding(ml_ledger_summary(l)));
    ml_ledger_destroy(l);
    free(r);
    c.training.precision = ML_PREC_AMP_BF16; /* not modelled under autocast */
    assert_false(has(m, &c, ML_REMEDY_LOGITS_FUSED));
    c.training.precision = ML_PREC_FP32;
    c.training.logits = ML_LOGITS_FUSED; /* already fused */
    assert_false(has(m, &c, ML_REMEDY_LOGITS_FUSED));
    /* on a fused plan, the remedies the plan would refuse are not listed
     * (autocast; ZeRO 2 and 3) rather than failing the triage */
    assert_false(has(m, &c, ML_REMEDY_AMP_BF16));
    assert_true(has(m, &c, ML_REMEDY_BF16_MASTER));
    c.training.data_parallel = 4;
    assert_false(has(m, &c, ML_REMEDY_ZERO_2));
    assert_false(has(m, &c, ML_REMEDY_ZERO_3));
    ml_model_destroy(m);
    m = load_str(deep); /* an MLP's loss: not a language model's */
    c = config_allocated(m);
    assert_false(has(m, &c, ML_REMEDY_LOGITS_FUSED));
    ml_model_destroy(m);
}

/* Which remedies apply (docs/cli.md, "triage"). */
static void test_applicability(void **state)
{
    (void)state;
    ml_model *m = decoder("eager");
    ml_config c = config_allocated(m);
    /* precision: only from fp32 */
    assert_true(has(m, &c, ML_REMEDY_AMP_BF16));
    assert_true(has(m, &c, ML_REMEDY_BF16_MASTER));
    c.training.precision = ML_PREC_AMP_BF16;
    assert_false(has(m, &c, ML_REMEDY_AMP_BF16));
    assert_false(has(m, &c, ML_REMEDY_BF16_MASTER));
    /* ZeRO: only over several devices, only stages above the current */
    assert_false(has(m, &c, ML_REMEDY_ZERO_1));
    assert_false(has(m, &c, ML_REMEDY_ZERO_3));
    c.training.data_parallel = 8;
    c.training.zero = 1;
    assert_false(has(m, &c, ML_REMEDY_ZERO_1));
    c.training.zero = 3; /* already sharded, in bf16 */
    c.training.precision = ML_PREC_BF16;
    assert_false(has(m, &c, ML_REMEDY_ZERO_3));
    assert_false(has(m, &c, ML_REMEDY_ZERO_2));
    assert_false(has(m, &c, ML_REMEDY_AMP_BF16));
    assert_false(has(m, &c, ML_REMEDY_BF16_MASTER));
    /* optimizer states: only from Adam */
    c = config_allocated(m);
    assert_true(has(m, &c, ML_REMEDY_ADAM_8BIT));
    c.training.optimizer = ML_OPT_SGD;
    assert_false(has(m, &c, ML_REMEDY_ADAM_8BIT));
    assert_false(has(m, &c, ML_REMEDY_ADAFACTOR));
    /* attention: eager transformers only; selective needs attention */
    c = config_allocated(m);
    assert_true(has(m, &c, ML_REMEDY_ATTENTION_SDPA));
    ml_model *flash = decoder("flash");
    assert_false(has(flash, &c, ML_REMEDY_ATTENTION_SDPA));
    ml_model_destroy(flash);
    ml_model *seq = load_str(deep);
    ml_config cs = config_allocated(seq);
    assert_false(has(seq, &cs, ML_REMEDY_ATTENTION_SDPA));
    assert_false(has(seq, &cs, ML_REMEDY_CKPT_SELECTIVE));
    /* full checkpointing of one-layer entries keeps what they save anyway:
     * it does not lower the peak, so it is not listed */
    assert_false(has(seq, &cs, ML_REMEDY_CKPT_FULL));
    /* optimal needs a device; a policy in use is not offered again */
    assert_false(has(seq, &cs, ML_REMEDY_CKPT_OPTIMAL));
    device(&cs, 1ull << 30, 7ull << 20, 512ull << 20);
    assert_true(has(seq, &cs, ML_REMEDY_CKPT_OPTIMAL));
    ml_parse_checkpoint("every-2", &cs.training.checkpoint, NULL);
    assert_false(has(seq, &cs, ML_REMEDY_CKPT_EVERY_2));
    ml_model_destroy(seq);
    /* zero_grad */
    c = config_allocated(m);
    assert_false(has(m, &c, ML_REMEDY_ZERO_GRAD_NONE));
    c.training.logits = ML_LOGITS_RELEASED;
    c.training.zero_grad = ML_ZERO_GRAD_ZERO;
    assert_false(has(m, &c, ML_REMEDY_LOGITS_RELEASED));
    assert_true(has(m, &c, ML_REMEDY_ZERO_GRAD_NONE));
    /* offload: optimizer unless offloaded; params unless they are */
    c = config_allocated(m);
    c.training.zero = 3;
    c.training.offload = ML_OFFLOAD_PARAMS;
    assert_false(has(m, &c, ML_REMEDY_OFFLOAD_OPTIMIZER));
    assert_false(has(m, &c, ML_REMEDY_OFFLOAD_PARAMS));
    /* the allocator: only when the plan counts a cache, or the run showed one */
    c = config_allocated(m);
    c.device.blas_workspace = 0; /* a toy decoder's: no cuBLAS workspaces */
    assert_false(has(m, &c, ML_REMEDY_EXPANDABLE));
    c.device.fragmentation = 0.3;
    assert_true(has(m, &c, ML_REMEDY_EXPANDABLE));
    ml_model_destroy(m);
}

/* The loop's references: the logits-released remedy on the small decoder
 * of test_applicability. */
static void test_logits_released(void **state)
{
    (void)state;
    ml_model *m = decoder("eager");
    /* the loop's references: releasing the logits is offered only where it
     * lowers the binding peak. This decoder's steady peak is the loss's
     * backward, where the loop holds the logits (cross-entropy saves its
     * log-softmax, not its input): offered. With an evaluation batch of 128
     * the evaluation pass binds (its peak does not depend on what the
     * training loop holds): not offered. With a 5,000-token vocabulary the
     * logits (8 x 64 x 5000 x 4 B = 10,240,000) dominate: releasing them
     * lowers the peak by exactly their size */
    ml_config c = config_allocated(m);
    ml_ledger *l0 = NULL;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l0, NULL), ML_OK);
    assert_int_equal(ml_ledger_summary(l0)->peak_phase, ML_PHASE_BACKWARD);
    assert_string_equal(ml_ledger_summary(l0)->peak_step, "loss");
    ml_ledger_destroy(l0);
    assert_true(has(m, &c, ML_REMEDY_LOGITS_RELEASED));
    c.training.eval_batch = 128;
    assert_false(has(m, &c, ML_REMEDY_LOGITS_RELEASED));
    c.training.eval_batch = 0;
    ml_model *wide = load_str(
        "name: dec\nmodel:\n  type: decoder\n  layers: 4\n  hidden: 64\n  heads: 4\n"
        "  vocab: 5000\n  max_positions: 64\n  dropout: 0.1\n  attention: eager\n"
        "training:\n  micro_batch: 8\n  seq_len: 64\n  optimizer: adamw\n"
        "  optimizer_impl: fused\n");
    ml_config cw = config_allocated(wide);
    ml_triage_result *rw = triage(wide, &cw, ml_triage_request_defaults());
    const ml_remedy *rel = find(rw, ML_REMEDY_LOGITS_RELEASED);
    assert_non_null(rel);
    assert_int_equal(rw->peak - rel->peak, 10240000);
    free(rw);
    ml_model_destroy(wide);
    ml_model_destroy(m);
}

/* The evaluation batch: only when the evaluation pass binds. The tiny MLP
 * (test_three_peaks_by_hand): under no_grad each layer holds its input and
 * makes its output, so the evaluation at E samples peaks at the gelu with
 * the states and the training batch (3,744), the evaluation's batch (48 E)
 * and z1 and a (64 E each): 3,744 + 176 E. At 100 samples 21,344 B binds
 * over the steady 10,720 and the 16 KiB budget; at 50 it is 12,544, within
 * it and still binding. At 15 the steady peak binds (3,744 + 2,640 =
 * 6,384): no remedy. */
static void test_eval_batch(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = config_allocated(m);
    c.training.eval_batch = 100;
    device(&c, 1ull << 30, 16ull << 10, 512ull << 20);
    ml_triage_request req = ml_triage_request_defaults();
    req.oom_phase = ML_TRIAGE_EVAL;
    ml_triage_result *r = triage(m, &c, req);
    assert_int_equal(r->peak, 21344);
    assert_int_equal(r->current.binding, ML_PEAK_EVAL);
    assert_true(r->count >= 1);
    const ml_remedy *e = &r->remedies[0];
    assert_int_equal(e->kind, ML_REMEDY_EVAL_BATCH);
    assert_int_equal(e->config.training.eval_batch, 50);
    assert_int_equal(e->peak, 12544);
    assert_true(e->fits && e->in_focus);
    /* no training remedy is in the evaluation's focus */
    for (size_t i = 1; i < r->count; i++)
        assert_false(r->remedies[i].in_focus);
    free(r);
    c.training.eval_batch = 15;
    assert_false(has(m, &c, ML_REMEDY_EVAL_BATCH));
    c.training.eval_batch = 0;
    assert_false(has(m, &c, ML_REMEDY_EVAL_BATCH));
    ml_model_destroy(m);
}

static void check_ranked(const ml_triage_result *r)
{
    for (size_t i = 1; i < r->count; i++) {
        const ml_remedy *a = &r->remedies[i - 1], *b = &r->remedies[i];
        assert_true(a->fits >= b->fits);
        if (a->fits != b->fits)
            continue;
        assert_true(a->in_focus >= b->in_focus);
        if (a->in_focus != b->in_focus)
            continue;
        if (a->fits)
            assert_true(a->slowdown <= b->slowdown * (1 + 1e-9));
        else
            assert_true(a->peak_total <= b->peak_total);
    }
}

/* The ranking: the deep MLP on 7.5 MiB (triage-forward's why): with the focus
 * on forward the smaller micro-batch (512 x 2, FLOPs x 1), the optimal plan
 * (x 16/14) and the fixed segment policies (FLOPs x 19/14: recompute adds
 * the forward's 5F to 14F) come first; with the focus on the optimizer, the state remedies that fit do. */
static void test_ranking(void **state)
{
    (void)state;
    ml_model *m = load_str(deep);
    ml_config c = config_allocated(m);
    device(&c, 1ull << 30, 15ull << 19, 512ull << 20);
    ml_triage_request req = ml_triage_request_defaults();
    req.oom_phase = ML_TRIAGE_FORWARD;
    ml_triage_result *r = triage(m, &c, req);
    check_ranked(r);
    assert_int_equal(r->remedies[0].kind, ML_REMEDY_MICRO_BATCH);
    assert_int_equal(r->remedies[0].config.training.micro_batch, 512);
    /* optimal: the three boundaries over budget are dropped by one segment
     * of four blocks, which recomputes two linears (16/14); peak exactly the
     * budget, R + 11u + G (triage-forward's why) */
    assert_int_equal(r->remedies[1].kind, ML_REMEDY_CKPT_OPTIMAL);
    assert_rel_close(r->remedies[1].flops_ratio, 16.0 / 14.0, 1e-12);
    assert_int_equal(r->remedies[1].peak, 1966080 + 11 * 524288 + 131072);
    assert_int_equal(r->remedies[2].kind, ML_REMEDY_CKPT_EVERY_2);
    assert_rel_close(r->remedies[2].flops_ratio, 19.0 / 14.0, 1e-12);
    assert_int_equal(r->remedies[2].peak, 1966080 + 10 * 524288 + 131072);
    free(r);
    req.oom_phase = ML_TRIAGE_ANY;
    r = triage(m, &c, req);
    check_ranked(r);
    for (size_t i = 0; i < r->count; i++)
        assert_false(r->remedies[i].in_focus);
    free(r);
    ml_model_destroy(m);
    /* mlp2 over 4 devices at 100 TFLOP/s x 0.5: 2.56e10 FLOPs take 0.512 ms;
     * optimizer offload moves 20M x (4 + 4) B = 160 MB over 25 GB/s, 6.4 ms
     * more: the slowest of those that fit, and last among them */
    m = load_preset("mlp2");
    c = config_allocated(m);
    c.training.data_parallel = 4;
    device(&c, 1ull << 30, 288ull << 20, 512ull << 20);
    c.device.peak_tflops = 100;
    c.device.efficiency = 0.5;
    req.oom_phase = ML_TRIAGE_OPTIMIZER;
    r = triage(m, &c, req);
    check_ranked(r);
    assert_rel_close(r->step_time_s, 0.000512, 1e-12);
    const ml_remedy *off = find(r, ML_REMEDY_OFFLOAD_OPTIMIZER);
    assert_non_null(off);
    assert_rel_close(off->host_transfer, 160e6, 1e-12);
    assert_rel_close(off->step_time_s, 0.000512 + 0.0064, 1e-9);
    size_t nfit = 0;
    while (nfit < r->count && r->remedies[nfit].fits)
        nfit++;
    assert_int_equal(r->remedies[nfit - 1].kind, ML_REMEDY_OFFLOAD_OPTIMIZER);
    assert_int_equal(r->remedies[0].kind, ML_REMEDY_ZERO_1);
    free(r);
    ml_model_destroy(m);
}

/* The observed figures (triage-observed's why): mlp2 plans 403,072,000 B
 * (test_model_states.c); 380 MiB = 398,458,880 allocated: over-stated by
 * 4,613,120; 470 MiB = 492,830,720 reserved against a plan without a cache
 * (403,072,000): under-stated by 89,758,720; 470/380 - 1 = 23.7 % > 20 %: fragmented, and
 * expandable segments listed although the plan cannot show their gain. */
static void test_observed(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = config_allocated(m);
    ml_triage_request req = ml_triage_request_defaults();
    req.allocated = 380ull << 20;
    req.reserved = 470ull << 20;
    ml_triage_result *r = triage(m, &c, req);
    assert_true(r->has_observed);
    assert_int_equal(r->observed.planned_allocated, 403072000);
    assert_int_equal(r->observed.allocated_error, 4613120);
    assert_int_equal(r->observed.planned_reserved, 403072000);
    assert_int_equal(r->observed.reserved_error, -89758720);
    assert_rel_close(r->observed.fragmentation, 470.0 / 380.0 - 1, 1e-12);
    assert_true(r->observed.fragmented);
    assert_non_null(find(r, ML_REMEDY_EXPANDABLE));
    free(r);
    req.reserved = 400ull << 20; /* 5.3 %: not fragmented */
    r = triage(m, &c, req);
    assert_false(r->observed.fragmented);
    assert_null(find(r, ML_REMEDY_EXPANDABLE));
    free(r);
    req.allocated = req.reserved = 0;
    r = triage(m, &c, req);
    assert_false(r->has_observed);
    free(r);
    ml_model_destroy(m);
}

/* A plan that runs out of the device in the allocator simulation (GPT-2
 * small at micro-batch 16 and 631 tokens on 24 GiB, its cache fragmented)
 * has a device total that stops where it ran out. The remedies that fit
 * are kept even where their totals are higher: expandable segments, with
 * the same allocated peak, and checkpoint optimal, which recomputes one
 * block (memledger plan ... --allocator expandable, --checkpoint optimal:
 * FITS). With max_split_size given, expandable segments are no remedy. */
static void test_remedies_for_a_plan_that_runs_out(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_on_device(m, 24ull << 30, 16);
    c.training.seq_len = 631;
    ml_triage_result *r = triage(m, &c, ml_triage_request_defaults());
    assert_true(r->current.reserved_oom);
    const ml_remedy *kinds[2] = {find(r, ML_REMEDY_EXPANDABLE), find(r, ML_REMEDY_CKPT_OPTIMAL)};
    for (int i = 0; i < 2; i++) {
        assert_non_null(kinds[i]);
        assert_true(kinds[i]->fits);
        assert_true(kinds[i]->peak_total > r->current.peak_total);
    }
    free(r);
    /* with max_split_size the expandable remedy is not offered: the pair is
     * not simulated (refused by the config check), and the rest still are */
    c.device.max_split_size = 64ull << 20;
    r = triage(m, &c, ml_triage_request_defaults());
    assert_null(find(r, ML_REMEDY_EXPANDABLE));
    assert_non_null(find(r, ML_REMEDY_CKPT_FULL));
    free(r);
    ml_model_destroy(m);
}

/* What the remedies say they change in training. */
static void test_changes(void **state)
{
    (void)state;
    ml_model *m = load_str(cnn);
    ml_config c = config_allocated(m);
    ml_triage_result *r = triage(m, &c, ml_triage_request_defaults());
    const ml_remedy *mb = find(r, ML_REMEDY_MICRO_BATCH);
    assert_non_null(mb);
    assert_non_null(strstr(mb->changes, "BatchNorm normalises over 48 samples instead of 96"));
    free(r);
    ml_model_destroy(m);
    m = decoder("eager");
    c = config_allocated(m);
    r = triage(m, &c, ml_triage_request_defaults());
    const ml_remedy *ck = find(r, ML_REMEDY_CKPT_FULL);
    assert_non_null(ck);
    assert_non_null(strstr(ck->changes, "RNG state"));
    assert_non_null(strstr(find(r, ML_REMEDY_AMP_BF16)->changes, "loss scaling"));
    assert_non_null(strstr(find(r, ML_REMEDY_ADAM_8BIT)->changes, "numerics"));
    assert_non_null(strstr(find(r, ML_REMEDY_OFFLOAD_OPTIMIZER)->changes, "host memory"));
    assert_string_equal(find(r, ML_REMEDY_ATTENTION_SDPA)->flags, "--attention sdpa");
    assert_string_equal(find(r, ML_REMEDY_ADAFACTOR)->flags,
                        "--optimizer adafactor --optimizer-impl foreach");
    free(r);
    ml_model_destroy(m);
}

static void test_names_and_errors(void **state)
{
    (void)state;
    for (int a = 0; a < ML_REMEDY_COUNT; a++) {
        assert_string_not_equal(ml_remedy_name((ml_remedy_kind)a), "?");
        for (int b = 0; b < a; b++)
            assert_string_not_equal(ml_remedy_name((ml_remedy_kind)a),
                                    ml_remedy_name((ml_remedy_kind)b));
    }
    assert_string_equal(ml_remedy_name(ML_REMEDY_COUNT), "?");
    /* the checkpoint remedies are the planner's candidate policies, one
     * each ("none" is no remedy): the two lists cannot drift apart */
    size_t ncand = 0, ckpt_remedies = 0;
    const ml_checkpoint_candidate *cand = ml_checkpoint_candidates(&ncand);
    assert_string_equal(cand[0].name, "none");
    for (int a = 0; a < ML_REMEDY_COUNT; a++)
        ckpt_remedies += !strncmp(ml_remedy_name((ml_remedy_kind)a), "checkpoint-", 11);
    assert_int_equal(ckpt_remedies, ncand - 1);
    for (size_t i = 1; i < ncand; i++) {
        char want[64];
        snprintf(want, sizeof want, "checkpoint-%s", cand[i].name);
        int found = 0;
        for (int a = 0; a < ML_REMEDY_COUNT; a++)
            found += !strcmp(ml_remedy_name((ml_remedy_kind)a), want);
        assert_int_equal(found, 1);
        ml_checkpoint ck;
        assert_int_equal(ml_parse_checkpoint(cand[i].name, &ck, NULL), ML_OK);
        assert_int_equal(cand[i].needs_device, ck.kind == ML_CKPT_OPTIMAL);
        assert_int_equal(cand[i].segments,
                         ck.kind != ML_CKPT_OPTIMAL && ck.kind != ML_CKPT_SELECTIVE);
    }
    for (int p = 0; p < ML_TRIAGE_PHASE_COUNT; p++) {
        ml_triage_phase q;
        assert_true(ml_triage_phase_parse(ml_triage_phase_name((ml_triage_phase)p), &q));
        assert_int_equal(q, p);
    }
    ml_triage_phase q;
    assert_false(ml_triage_phase_parse("loss", &q));
    /* a configuration that cannot be planned: its status, *out untouched */
    ml_model *m = load_str(tiny);
    ml_config c = config_allocated(m);
    c.training.micro_batch = 0;
    ml_triage_request req = ml_triage_request_defaults();
    ml_triage_result *r = calloc(1, sizeof *r);
    ml_error e;
    assert_int_equal(ml_triage(m, &c, &req, r, &e), ML_RANGE);
    assert_int_equal(r->count, 0);
    c.training.micro_batch = 1;
    req.host_bandwidth = 0;
    assert_int_equal(ml_triage(m, &c, &req, r, &e), ML_RANGE);
    free(r);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_remedies_match_direct_evaluation),
        cmocka_unit_test(test_micro_batch_search),
        cmocka_unit_test(test_applicability),
        cmocka_unit_test(test_logits_released),
        cmocka_unit_test(test_fused_remedy),
        cmocka_unit_test(test_eval_batch),
        cmocka_unit_test(test_ranking),
        cmocka_unit_test(test_observed),
        cmocka_unit_test(test_remedies_for_a_plan_that_runs_out),
        cmocka_unit_test(test_changes),
        cmocka_unit_test(test_names_and_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
