/* The calibration runner on the CPU backend: finite-difference gradient
 * checks of every layer kind, and its measured saved bytes against the
 * ledger's inventory for the same shapes (the planner models this runner
 * exactly: a difference is a bug in one of them). */
#include <math.h>
#include <stdlib.h>

#include "harness.h"
#include "layers.h"

static ml_backend *be;

static int setup(void **state)
{
    (void)state;
    const char *why;
    be = ml_backend_cpu(&why);
    return be ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    be->destroy(be);
    return 0;
}

static const layer_dims small = {2, 4, 8, 2, 16, 11, 0.25f, 1, false};

static uint64_t rs = 12345;
static float rnd(void)
{
    rs = rs * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(rs >> 11) / 9007199254740992.0 - 0.5);
}

/* Forward from a copy of x; returns L = sum(y * R) (or the loss for lm_head)
 * and discards what the forward saved. */
static double loss_of(layer *l, tracker *tr, const void *x, size_t xbytes, const float *R)
{
    tensor xi = tensor_alloc(tr, xbytes, T_SAVED);
    memcpy(xi.p, x, xbytes);
    tensor y = layer_forward(l, tr, &xi);
    double L = 0;
    size_t n = y.bytes / 4;
    for (size_t i = 0; i < n; i++)
        L += (double)((float *)y.p)[i] * (l->kind == LAYER_LM_HEAD ? 1.0 : R[i]);
    tensor_free(tr, &y);
    layer_forget(l, tr);
    return L;
}

/* After a backward: frees the step's tensors, runs Adam, destroys the
 * layer; every tensor was returned, so the tracker balances. */
static void end_step(layer *l, tracker *tr, tensor *y, tensor *dy, tensor *dx)
{
    tensor_free(tr, y);
    tensor_free(tr, dy);
    tensor_free(tr, dx);
    layer_step(l, tr);
    layer_destroy(l, tr);
    for (int c = 0; c < T_NCAT; c++)
        assert_int_equal(tr->live[c], 0);
}

static void gradcheck(layer_kind k, const layer_dims *d)
{
    tracker tr;
    tracker_init(&tr, be);
    layer l;
    assert_int_equal(layer_init(&l, k, d, &tr, 99), 0);
    size_t xbytes = layer_input_bytes(&l);
    void *x = malloc(xbytes);
    if (k == LAYER_LM_HEAD)
        for (size_t i = 0; i < xbytes / 8; i++)
            ((int64_t *)x)[i] = (int64_t)((i * 5 + 3) % d->V);
    else
        for (size_t i = 0; i < xbytes / 4; i++)
            ((float *)x)[i] = rnd();
    size_t ny = k == LAYER_LM_HEAD ? 1 : d->B * d->T * d->D;
    float *R = malloc(ny * sizeof *R);
    for (size_t i = 0; i < ny; i++)
        R[i] = rnd();
    /* analytic */
    tensor xi = tensor_alloc(&tr, xbytes, T_SAVED);
    memcpy(xi.p, x, xbytes);
    tensor y = layer_forward(&l, &tr, &xi);
    tensor dy = tensor_alloc(&tr, y.bytes, T_WORK);
    memcpy(dy.p, R, y.bytes);
    tensor dx = layer_backward(&l, &tr, &dy);
    const double eps = 1e-2;
    int checked = 0;
    for (int p = 0; p < l.nparams; p++) {
        float *w = l.w[p].p, *g = l.g[p].p;
        for (size_t j = 0; j < l.wn[p]; j += 1 + l.wn[p] / 5) {
            float keepv = w[j];
            w[j] = keepv + (float)eps;
            double lp = loss_of(&l, &tr, x, xbytes, R);
            w[j] = keepv - (float)eps;
            double lm = loss_of(&l, &tr, x, xbytes, R);
            w[j] = keepv;
            double num = (lp - lm) / (2 * eps), ana = g[j];
            if (fabs(num - ana) > 3e-2 * fmax(fabs(num), fabs(ana)) + 2e-3)
                fail_msg("%s param %d[%zu]: numeric %.6g, analytic %.6g", layer_kind_name(k), p,
                         j, num, ana);
            checked++;
        }
    }
    if (k != LAYER_LM_HEAD) {
        float *xf = x;
        for (size_t j = 0; j < xbytes / 4; j += 1 + xbytes / 4 / 7) {
            float keepv = xf[j];
            xf[j] = keepv + (float)eps;
            double lp = loss_of(&l, &tr, x, xbytes, R);
            xf[j] = keepv - (float)eps;
            double lm = loss_of(&l, &tr, x, xbytes, R);
            xf[j] = keepv;
            double num = (lp - lm) / (2 * eps), ana = ((float *)dx.p)[j];
            if (fabs(num - ana) > 3e-2 * fmax(fabs(num), fabs(ana)) + 2e-3)
                fail_msg("%s input[%zu]: numeric %.6g, analytic %.6g", layer_kind_name(k), j, num,
                         ana);
            checked++;
        }
    }
    assert_true(checked > 5);
    end_step(&l, &tr, &y, &dy, &dx);
    free(x);
    free(R);
}

static void test_gradients(void **state)
{
    (void)state;
    for (int k = 0; k < LAYER_KIND_COUNT; k++)
        gradcheck((layer_kind)k, &small);
    /* one key/value head at micro-batch 1: attention reads the one head
     * for both query heads (a batch stride of 0) */
    layer_dims one = small;
    one.B = 1;
    gradcheck(LAYER_LLAMA, &one);
}

/* Saved bytes after a forward (the input included when it is saved); with
 * cast, also autocast's weight copies (T_CAST), which saved leaves out. */
static uint64_t measured(layer_kind k, const layer_dims *d, uint64_t *cast)
{
    tracker tr;
    tracker_init(&tr, be);
    layer l;
    assert_int_equal(layer_init(&l, k, d, &tr, 7), 0);
    tensor x = tensor_alloc(&tr, layer_input_bytes(&l), T_SAVED);
    memset(x.p, 0, x.bytes); /* values do not matter here, only sizes */
    tensor y = layer_forward(&l, &tr, &x);
    assert_false(tr.oom);
    uint64_t saved = tr.live[T_SAVED];
    if (cast)
        *cast = tr.live[T_CAST];
    tensor_free(&tr, &y);
    layer_forget(&l, &tr); /* x too: the layer saved it, or (amp linear, mlp) freed it */
    layer_destroy(&l, &tr);
    for (int c = 0; c < T_NCAT; c++)
        assert_int_equal(tr.live[c], 0);
    return saved;
}

static uint64_t measured_saved(layer_kind k, const layer_dims *d)
{
    return measured(k, d, NULL);
}

/* The blocks' inventories, plus `batch`: the storages the runner's layer
 * keeps that the plan counts as the batch the loop holds (the model's
 * input, the targets), not as a block's. */
static uint64_t ledger_sum(const char *yaml, const char *const *blocks, uint64_t batch)
{
    ml_model *m = load_str(yaml);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    uint64_t s = batch;
    for (const char *const *b = blocks; *b; b++)
        s += block_named(l, *b)->inventory_bytes;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return s;
}

/* The runner's saved bytes (plus, under amp, its weight copies) equal the
 * ledger's inventory for the same shapes: fp32, and amp-bf16 (what
 * torch.autocast's eager autograd keeps). Under amp the linear and MLP sit
 * after a LayerNorm, whose fp32 output is what autocast casts. */
static void check_inventory(const layer_dims *d)
{
    const char *prec = d->amp ? "  precision: amp-bf16\n" : "";
    const char *first = d->amp ? "    - layernorm: {}\n" : "";
    const char *const blk[] = {"block.0", NULL}, *const lm[] = {"embedding", "head", "loss", NULL};
    const char *const mlp32[] = {"0:linear", "1:gelu", "2:linear", NULL},
                      *const mlp16[] = {"1:linear", "2:gelu", "3:linear", NULL};
    const char *const lin32[] = {"0:linear", NULL}, *const lin16[] = {"1:linear", NULL};
    size_t dkv = d->KV * (d->D / d->H);
    uint64_t cast, s;
    char y[1024];
    /* transformer block: a GPT-2 decoder's block.0; and its embedding + LM
     * head + cross-entropy */
    snprintf(y, sizeof y,
             "model:\n  type: decoder\n  layers: 1\n  hidden: %zu\n  heads: %zu\n  ffn: %zu\n"
             "  vocab: %zu\n  max_positions: %zu\n  tied_embeddings: false\n  dropout: %g\n"
             "training:\n  micro_batch: %zu\n  seq_len: %zu\n%s",
             d->D, d->H, d->F, d->V, d->T, (double)d->dropout, d->B, d->T, prec);
    s = measured(LAYER_BLOCK, d, &cast);
    assert_int_equal(s + cast, ledger_sum(y, blk, 0));
    /* the weight copies: c_attn D x 3D, c_proj D x D, c_fc and mlp c_proj
     * D x F each, 2 bytes per element */
    assert_int_equal(cast, d->amp ? 2 * (4 * d->D * d->D + 2 * d->D * d->F) : 0);
    s = measured(LAYER_LM_HEAD, d, &cast);
    /* the int64 ids and targets, B*T*8 each, are the batch's */
    assert_int_equal(s + cast, ledger_sum(y, lm, 2 * d->B * d->T * 8));
    assert_int_equal(cast, d->amp ? 2 * d->V * d->D : 0); /* the head's weight */
    /* MLP and linear: sequential models over [T, D] */
    snprintf(y, sizeof y,
             "model:\n  type: sequential\n  input: [%zu, %zu]\n  layers:\n%s"
             "    - linear: {out: %zu}\n    - gelu: {}\n    - linear: {out: %zu}\n"
             "  loss: mse\ntraining:\n  micro_batch: %zu\n%s",
             d->T, d->D, first, d->F, d->D, d->B, prec);
    s = measured(LAYER_MLP, d, &cast);
    /* fp32: the first linear saves the model's input, the batch's */
    uint64_t x = d->amp ? 0 : d->B * d->T * d->D * 4;
    assert_int_equal(s + cast, ledger_sum(y, d->amp ? mlp16 : mlp32, x));
    assert_int_equal(cast, d->amp ? 2 * 2 * d->D * d->F : 0);
    snprintf(y, sizeof y,
             "model:\n  type: sequential\n  input: [%zu, %zu]\n  layers:\n%s"
             "    - linear: {out: %zu}\n  loss: mse\ntraining:\n  micro_batch: %zu\n%s",
             d->T, d->D, first, d->D, d->B, prec);
    s = measured(LAYER_LINEAR, d, &cast);
    assert_int_equal(s + cast, ledger_sum(y, d->amp ? lin16 : lin32, x));
    /* the input, or its bf16 cast */
    assert_int_equal(s, d->B * d->T * d->D * (d->amp ? 2 : 4));
    /* Llama-style block: an RMSNorm/SwiGLU decoder with GQA, no biases,
     * no positions (the runner has no rotary tables) */
    snprintf(y, sizeof y,
             "model:\n  type: decoder\n  layers: 1\n  hidden: %zu\n  heads: %zu\n"
             "  kv_heads: %zu\n  ffn: %zu\n  activation: swiglu\n  norm: rmsnorm\n"
             "  vocab: %zu\n  position: none\n  bias: false\n  tied_embeddings: false\n"
             "  dropout: 0\ntraining:\n  micro_batch: %zu\n  seq_len: %zu\n%s",
             d->D, d->H, d->KV, d->F, d->V, d->B, d->T, prec);
    s = measured(LAYER_LLAMA, d, &cast);
    assert_int_equal(s + cast, ledger_sum(y, blk, 0));
    assert_int_equal(cast, d->amp ? 2 * (2 * d->D * d->D + 2 * d->D * dkv + 3 * d->D * d->F) : 0);
}

static void test_saved_bytes_match_the_ledger(void **state)
{
    (void)state;
    const layer_dims shapes[] = {{2, 16, 32, 4, 128, 50, 0.1f, 2, false},
                           {3, 8, 48, 6, 192, 30, 0.1f, 3, false},
                           {1, 24, 16, 2, 64, 20, 0.0f, 1, false}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        layer_dims d = shapes[i];
        check_inventory(&d);
        d.amp = true;
        check_inventory(&d);
    }
}

/* The runner measured over B and T: the profile's fit separates the B*T*D,
 * B*H*T^2 and T^2 terms, and each comes out as counted by hand:
 *  - GPT-2 block, dropout > 0, per token: ln_1 input 4D, ln_1 output 4D,
 *    q k v 12D, c_proj input 4D, its dropout mask D, ln_2 input 4D, ln_2
 *    output 4D, MLP dropout mask D (34D bytes); GELU input and output 8F;
 *    two LayerNorms' mean and rstd 16: c = (34D + 8F + 16) / 4D (16.5 +
 *    4/D when F = 4D). Per score element: softmax output 4 B, dropout mask 1 B,
 *    dropout output 4 B: c_attention = 9/4. The bool causal mask, T^2 bytes
 *    whatever B: c_mask = 1.
 *  - Llama block, per token: x, x*rstd and the normed output for each
 *    RMSNorm (3 x 4D each), q, repeated k and v, o_proj input (4 x 4D), the
 *    residual sum: 10 x 4D; SwiGLU gate, silu(gate), up, product (4 x 4F);
 *    two rstd (8 B): c = 10 + 4F/D + 2/D. Per score element the fp32 softmax
 *    output: c_attention = 1, and no mask tensor: c_mask = 0.
 * With the fit, a shape that was not measured is predicted to the byte, and
 * the planner's extrapolated blocks equal its analytic inventory. */
static void test_fit_separates_attention(void **state)
{
    (void)state;
    const size_t D = 32, H = 4, F = 96, V = 20;
    const size_t Bs[] = {1, 2, 3}, Ts[] = {8, 16, 24};
    const layer_kind kinds[] = {LAYER_BLOCK, LAYER_LLAMA};
    const char *names[] = {"transformer_block", "llama_block"};
    const double Dd = (double)D, Fd = (double)F;
    const double c_hand[] = {(34 * Dd + 8 * Fd + 16) / (4 * Dd), 10 + 4.0 * Fd / Dd + 2.0 / Dd};
    const double attn_hand[] = {9.0 / 4, 1}, mask_hand[] = {1, 0};
    ml_profile *p = ml_profile_new();
    ml_profile_set(p, "dtype", "fp32");
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < 3; i++)
            for (size_t j = 0; j < 3; j++) {
                layer_dims d = {Bs[i], Ts[j], D, H, F, V, k == 0 ? 0.1f : 0.0f, 2, false};
                ml_profile_point pt = {.B = Bs[i], .T = Ts[j], .D = D, .H = H, .F = F,
                                       .saved_bytes = measured_saved(kinds[k], &d)};
                assert_int_equal(ml_profile_add_point(p, names[k], &pt), ML_OK);
            }
    ml_error e;
    assert_int_equal(ml_profile_fit(p, &e), ML_OK);
    for (int k = 0; k < 2; k++) {
        const ml_profile_kind *pk = ml_profile_find(p, names[k]);
        assert_non_null(pk);
        assert_rel_close(pk->fit.slope, c_hand[k], 1e-9);
        assert_rel_close(pk->attn, attn_hand[k], 1e-9);
        assert_true(fabs(pk->mask - mask_hand[k]) < 1e-6);
        assert_true(fabs(pk->fit.fixed) < 1e-3);
        assert_true(pk->fit.r2 > 1 - 1e-12);
        /* an unmeasured shape: B = 5, T = 40 */
        layer_dims d = {5, 40, D, H, F, V, k == 0 ? 0.1f : 0.0f, 2, false};
        double want = (double)measured_saved(kinds[k], &d);
        assert_true(fabs(ml_profile_kind_saved(pk, 5, 40, D, H, 4) - want) < 0.5);
    }
    /* lm_head, per token: input ids and targets (int64, 16 B), the
     * embedding dropout mask D, ln_f input 4D, its mean and rstd 8, ln_f
     * output 4D, the log-softmax output 4V: c = (9D + 24 + 4V) / 4D; the T
     * position ids (int64) whatever B: c_positions = 8; nll's total_weight:
     * fixed 4 B */
    ml_profile *lm = ml_profile_new();
    ml_profile_set(lm, "dtype", "fp32");
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 3; j++) {
            layer_dims d = {Bs[i], Ts[j], D, H, F, V, 0.1f, 2, false};
            ml_profile_point pt = {.B = Bs[i], .T = Ts[j], .D = D,
                                   .saved_bytes = measured_saved(LAYER_LM_HEAD, &d)};
            ml_profile_add_point(lm, "lm_head", &pt);
        }
    assert_int_equal(ml_profile_fit(lm, &e), ML_OK);
    const ml_profile_kind *lk = ml_profile_find(lm, "lm_head");
    assert_rel_close(lk->fit.slope, (9 * Dd + 24 + 4 * (double)V) / (4 * Dd), 1e-9);
    assert_rel_close(lk->pos, 8, 1e-9);
    assert_rel_close(lk->fit.fixed, 4, 1e-6);
    assert_true(lk->attn == 0 && lk->mask == 0);
    ml_profile_destroy(lm);

    /* the planner extrapolates with the fit: block.0 at B = 5, T = 40 is
     * marked measured and equals the analytic inventory */
    char y[1024];
    snprintf(y, sizeof y,
             "model:\n  type: decoder\n  layers: 2\n  hidden: %zu\n  heads: %zu\n  ffn: %zu\n"
             "  vocab: %zu\n  max_positions: 64\n  tied_embeddings: false\n  dropout: 0.1\n"
             "training:\n  micro_batch: 5\n  seq_len: 40\n",
             D, H, 4 * D, V);
    /* the GPT-2 block in the fit above has F = 96, the model 4D = 128: refit
     * the transformer block at F = 4D */
    ml_profile *q = ml_profile_new();
    ml_profile_set(q, "dtype", "fp32");
    for (size_t i = 0; i < 3; i++)
        for (size_t j = 0; j < 3; j++) {
            layer_dims d = {Bs[i], Ts[j], D, H, 4 * D, V, 0.1f, H, false};
            ml_profile_point pt = {.B = Bs[i], .T = Ts[j], .D = D, .H = H, .F = 4 * D,
                                   .saved_bytes = measured_saved(LAYER_BLOCK, &d)};
            ml_profile_add_point(q, "transformer_block", &pt);
        }
    assert_int_equal(ml_profile_fit(q, &e), ML_OK);
    ml_model *m = load_str(y);
    ml_config c = ml_model_config(m);
    ml_ledger *plain = eval(m, &c, false);
    c.calib = q;
    ml_ledger *cal = eval(m, &c, false);
    const ml_block_info *b0 = block_named(plain, "block.0"), *b1 = block_named(cal, "block.0");
    assert_true(b1->measured);
    assert_false(ml_ledger_summary(cal)->calibrated_at_shape);
    assert_int_equal(b1->inventory_bytes, b0->inventory_bytes);
    /* the profile measured the inventory the graph lists: the graph's
     * tensors stand, so the allocator simulation makes the same tensors in
     * the same order (its forward op by op, its backward node by node) */
    ml_config cs = c;
    cs.device.allocator = ML_ALLOCATOR_CACHING;
    cs.calib = NULL;
    ml_ledger *sp = eval(m, &cs, true);
    cs.calib = q;
    ml_ledger *sc = eval(m, &cs, true);
    const size_t ns = ml_ledger_sim_event_count(sp);
    assert_true(ns > 100);
    assert_int_equal(ml_ledger_sim_event_count(sc), ns);
    assert_memory_equal(ml_ledger_sim_events(sc), ml_ledger_sim_events(sp),
                        ns * sizeof(ml_sim_event));
    assert_int_equal(block_named(sc, "block.0")->transients, ML_TRANSIENTS_OPS);
    ml_ledger_destroy(sc);
    ml_ledger_destroy(sp);
    /* no GEMM figures in the profile: the time stays analytic */
    assert_false(ml_ledger_summary(cal)->time_measured);
    ml_ledger_destroy(cal);
    /* with a measured 0.5 TFLOP/s the step time is the FLOPs over it */
    ml_profile_gemm g = {512, 512, 512, 0.5};
    ml_profile_add_gemm(q, &g);
    cal = eval(m, &c, false);
    const ml_summary *sm = ml_ledger_summary(cal);
    assert_true(sm->time_measured);
    assert_rel_close(sm->step_time_s, sm->flops_total / 0.5e12, 1e-15);
    ml_ledger_destroy(plain);
    ml_ledger_destroy(cal);
    ml_model_destroy(m);
    /* the same model with flash attention: the eager profile does not apply */
    char *dot = strstr(y, "  dropout: 0.1\n");
    assert_non_null(dot);
    char yf[1100];
    snprintf(yf, sizeof yf, "%.*s  attention: flash\n%s", (int)(dot - y), y, dot);
    m = load_str(yf);
    c = ml_model_config(m);
    c.calib = q;
    cal = eval(m, &c, false);
    assert_false(block_named(cal, "block.0")->measured);
    assert_int_equal(ml_ledger_summary(cal)->calibrated_blocks, 0);
    ml_ledger_destroy(cal);
    ml_model_destroy(m);
    ml_profile_destroy(q);
    ml_profile_destroy(p);
}

/* ---- autocast (amp-bf16) -------------------------------------------------- */

/* One forward + backward of kind k from fixed weights and inputs; returns
 * the output, the input gradient and every weight gradient, concatenated. */
static float *run_once(layer_kind k, bool amp, size_t *n)
{
    layer_dims d = small;
    d.amp = amp;
    tracker tr;
    tracker_init(&tr, be);
    layer l;
    assert_int_equal(layer_init(&l, k, &d, &tr, 99), 0);
    tensor x = tensor_alloc(&tr, layer_input_bytes(&l), T_SAVED);
    rs = 4321;
    for (size_t i = 0; i < x.bytes / (k == LAYER_LM_HEAD ? 8 : 4); i++)
        if (k == LAYER_LM_HEAD)
            ((int64_t *)x.p)[i] = (int64_t)((i * 5 + 3) % d.V);
        else
            ((float *)x.p)[i] = rnd();
    tensor y = layer_forward(&l, &tr, &x);
    tensor dy = tensor_alloc(&tr, y.bytes, T_WORK);
    for (size_t i = 0; i < y.bytes / 4; i++)
        ((float *)dy.p)[i] = rnd();
    size_t ny = y.bytes / 4, total = ny + d.B * d.T * d.D;
    for (int p = 0; p < l.nparams; p++)
        total += l.wn[p];
    float *out = calloc(total, sizeof *out);
    memcpy(out, y.p, y.bytes);
    tensor dx = layer_backward(&l, &tr, &dy);
    assert_false(tr.oom);
    assert_false(be->failed);
    size_t at = ny;
    if (dx.p)
        memcpy(out + at, dx.p, dx.bytes);
    at += d.B * d.T * d.D;
    for (int p = 0; p < l.nparams; p++) {
        memcpy(out + at, l.g[p].p, l.wn[p] * 4);
        at += l.wn[p];
    }
    end_step(&l, &tr, &y, &dy, &dx);
    *n = total;
    return out;
}

/* amp's output and gradients are fp32's up to bf16 rounding: within 3 % of
 * each run's largest magnitude, and not bit-equal (the casts happened). A
 * wrong saved tensor or weight in an amp backward is off by O(1). */
static void test_amp_matches_fp32_within_bf16(void **state)
{
    (void)state;
    for (int k = 0; k < LAYER_KIND_COUNT; k++) {
        size_t n32, n16;
        float *a = run_once((layer_kind)k, false, &n32), *b = run_once((layer_kind)k, true, &n16);
        assert_int_equal(n32, n16);
        double scale = 1e-12, worst = 0;
        for (size_t i = 0; i < n32; i++)
            scale = fmax(scale, fabs((double)a[i]));
        for (size_t i = 0; i < n32; i++)
            worst = fmax(worst, fabs((double)a[i] - (double)b[i]) / scale);
        if (!(worst < 3e-2) || !(worst > 0))
            fail_msg("%s: amp vs fp32 largest relative difference %.3g",
                     layer_kind_name((layer_kind)k), worst);
        free(a);
        free(b);
    }
}

/* bf16 rounding: nearest, ties to even, NaN kept (torch's .to(bfloat16)). */
static void test_bf16_rounding(void **state)
{
    (void)state;
    assert_int_equal(ml_bf16_of(1.0f), 0x3f80);
    /* 7 mantissa bits: the spacing above 1 is 1/128 */
    assert_true(ml_f32_of(ml_bf16_of(1.0f + 1.0f / 256)) == 1.0f);              /* tie: down to even */
    assert_true(ml_f32_of(ml_bf16_of(1.0f + 3.0f / 256)) == 1.0f + 1.0f / 64);  /* tie: up to even */
    assert_true(ml_f32_of(ml_bf16_of(1.0f + 0.7f / 128)) == 1.0f + 1.0f / 128); /* nearest */
    assert_true(isnan(ml_f32_of(ml_bf16_of(NAN))));
    uint16_t h[3];
    float f[3] = {3.0f, -0.15625f, 65280.0f}, g[3];
    be->cast(be, f, h, 3, true);
    be->cast(be, h, g, 3, false);
    for (int i = 0; i < 3; i++)
        assert_true(g[i] == f[i]); /* exactly representable */
    /* gemm_mixed: [[1 2 3] [4 5 6+1/256]] (fp32; 6+1/256 rounds to 6 in
     * bf16) times [[1 0] [0 1] [1 1]] (bf16) = [[4 5] [10 11]]; the same
     * with A stored transposed, and as a batch of two with strides */
    float A[6] = {1, 2, 3, 4, 5, 6.0f + 1.0f / 256}, At[6] = {1, 4, 2, 5, 3, 6.0f + 1.0f / 256};
    float Bf[6] = {1, 0, 0, 1, 1, 1}, C[8];
    uint16_t Bh[12];
    be->cast(be, Bf, Bh, 6, true);
    be->cast(be, Bf, Bh + 6, 6, true);
    const float want[4] = {4, 5, 10, 11};
    be->gemm_mixed(be, false, false, 2, 2, 3, 1.0f, A, false, 0, Bh, true, 0, 0.0f, C, 0, 1);
    for (int i = 0; i < 4; i++)
        assert_true(C[i] == want[i]);
    be->gemm_mixed(be, true, false, 2, 2, 3, 1.0f, At, false, 0, Bh, true, 0, 0.0f, C, 0, 1);
    for (int i = 0; i < 4; i++)
        assert_true(C[i] == want[i]);
    float A2[12];
    memcpy(A2, A, sizeof A);
    memcpy(A2 + 6, A, sizeof A);
    be->gemm_mixed(be, false, false, 2, 2, 3, 1.0f, A2, false, 6, Bh, true, 6, 0.0f, C, 4, 2);
    for (int i = 0; i < 8; i++)
        assert_true(C[i] == want[i % 4]);
    assert_false(be->failed);
}

/* Plans the model in yaml with and without profile p: with why == NULL
 * the profile applies (block.1 marked measured), otherwise it does not and
 * the summary's note contains why; either way block.1 keeps the analytic
 * inventory (the profiles here are exact). */
static void check_applied(const char *yaml, const ml_profile *p, const char *why)
{
    ml_model *m = load_str(yaml);
    ml_config c = ml_model_config(m);
    ml_ledger *plain = eval(m, &c, false);
    c.calib = p;
    ml_ledger *cal = eval(m, &c, false);
    const ml_block_info *b0 = block_named(plain, "block.1"), *b1 = block_named(cal, "block.1");
    assert_int_equal(b1->measured, why == NULL);
    assert_int_equal(b1->inventory_bytes, b0->inventory_bytes);
    const char *note = ml_ledger_summary(cal)->calibration_note;
    if (!why) /* the report's measured c is the blocks' c in the table */
        assert_rel_close(ml_ledger_summary(cal)->calibrated_c, b1->c, 1e-12);
    if (!why)
        assert_null(note);
    else if (!note || !strstr(note, why))
        fail_msg("calibration note '%s' does not say '%s'", note ? note : "(none)", why);
    ml_ledger_destroy(plain);
    ml_ledger_destroy(cal);
    ml_model_destroy(m);
}

/* The amp block's fit, counted by hand from the inventory (per token, 2 =
 * b bytes per element):
 *  - GPT-2: x 4D, ln_1 stats 8, ln_1 output's cast 2D, q k v 6D, c_proj
 *    input 2D, its dropout mask D, ln_2 input 4D, stats 8, ln_2 cast 2D,
 *    MLP dropout mask D; GELU input and output 4F: c = (22D + 4F + 16)/2D.
 *    Per score: fp32 softmax 4, dropout mask 1, PV's bf16 cast 2:
 *    c_attention = 7/2; c_mask = 1.
 *  - Llama: x, x*rstd (4D each) and three casts of the normed output (6D)
 *    for q/k/v; q, k, v 6D; o_proj input 2D; x2 and its normalised 8D, two
 *    casts for gate/up 4D: 34D; gate, silu, up, product 8F; rstds 8:
 *    c = (34D + 8F + 8)/2D. Per score: fp32 softmax 4 + PV's cast 2:
 *    c_attention = 3.
 * The planner applies the profile to an amp-bf16 model, adding its own
 * weight copies back (at the measured shape it equals the analytic
 * inventory), and not to pure bf16 nor fp32. */
static void test_amp_fit_and_planner(void **state)
{
    (void)state;
    const size_t D = 32, H = 4, V = 20;
    const size_t Bs[] = {1, 2, 3}, Ts[] = {8, 16, 24};
    const double Dd = (double)D;
    ml_profile *p = ml_profile_new();
    ml_profile_set(p, "dtype", "bf16");
    ml_profile_set(p, "precision", "amp-bf16");
    const size_t Fl = 96;
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < 3; i++)
            for (size_t j = 0; j < 3; j++) {
                layer_dims d = {Bs[i], Ts[j], D, H, k ? Fl : 4 * D, V, k ? 0.0f : 0.1f, k ? 2 : H,
                          true};
                uint64_t cast;
                uint64_t s = measured(k ? LAYER_LLAMA : LAYER_BLOCK, &d, &cast);
                ml_profile_point pt = {.B = Bs[i], .T = Ts[j], .D = D, .H = H, .F = d.F,
                                       .saved_bytes = s, .cast_bytes = cast};
                ml_profile_add_point(p, k ? "llama_block" : "transformer_block", &pt);
            }
    ml_error e;
    assert_int_equal(ml_profile_fit(p, &e), ML_OK);
    const ml_profile_kind *g = ml_profile_find(p, "transformer_block");
    assert_rel_close(g->fit.slope, (22 * Dd + 4 * 4 * Dd + 16) / (2 * Dd), 1e-9);
    assert_rel_close(g->attn, 3.5, 1e-9);
    assert_rel_close(g->mask, 1, 1e-6);
    assert_true(fabs(g->fit.fixed) < 1e-3);
    const ml_profile_kind *lk = ml_profile_find(p, "llama_block");
    assert_rel_close(lk->fit.slope, (34 * Dd + 8 * (double)Fl + 8) / (2 * Dd), 1e-9);
    assert_rel_close(lk->attn, 3, 1e-9);
    assert_true(fabs(lk->mask) < 1e-6);
    /* the profile round-trips with its weight copies */
    ml_profile *r = profile_round_trip(p);
    assert_string_equal(ml_profile_get(r, "precision"), "amp-bf16");
    assert_int_equal(ml_profile_find(r, "transformer_block")->points[0].cast_bytes,
                     2 * 12 * D * D);
    ml_profile_destroy(r);

    const char *prec[] = {"amp-bf16", "bf16", "fp32"};
    for (int i = 0; i < 3; i++) {
        char y[1024];
        snprintf(y, sizeof y,
                 "model:\n  type: decoder\n  layers: 2\n  hidden: %zu\n  heads: %zu\n  ffn: %zu\n"
                 "  vocab: %zu\n  max_positions: 64\n  tied_embeddings: false\n  dropout: 0.1\n"
                 "training:\n  micro_batch: 5\n  seq_len: 40\n  precision: %s\n",
                 D, H, 4 * D, V, prec[i]);
        check_applied(y, p, i == 0 ? NULL : "precision");
    }
    /* the Llama points were measured at F = 96 = 3D: a Llama model with
     * that ratio takes them; at F = 4D their c would carry the MLP's
     * B*T*F terms at the wrong width, so the analytic c stays, and says why.
     * Then the model the profile fits with a fused attention: flash, and
     * sdpa under autocast (bf16 inputs: the flash kernel takes grouped
     * heads) keep no scores, so the runner's eager c does not apply; nor
     * does it to heads wider than hidden/heads (head_dim), whose projections
     * and scores have other shapes than the runner's blocks */
    const struct {
        size_t ffn;
        const char *attention, *why;
        size_t head_dim;
    } llama[] = {{Fl, "eager", NULL, 0},
                 {4 * D, "eager", "ffn/hidden", 0},
                 {Fl, "flash", "fused kernel", 0},
                 {Fl, "sdpa", "fused kernel", 0},
                 {Fl, "eager", "head size", 2 * D / H}};
    for (size_t i = 0; i < sizeof llama / sizeof *llama; i++) {
        char y[1024], hd[32] = "";
        if (llama[i].head_dim)
            snprintf(hd, sizeof hd, "  head_dim: %zu\n", llama[i].head_dim);
        snprintf(y, sizeof y,
                 "model:\n  type: decoder\n  layers: 2\n  hidden: %zu\n  heads: %zu\n"
                 "  kv_heads: 2\n  ffn: %zu\n  activation: swiglu\n  norm: rmsnorm\n"
                 "  vocab: %zu\n  position: none\n  bias: false\n  tied_embeddings: false\n"
                 "  dropout: 0\n  attention: %s\n%straining:\n  micro_batch: 5\n  seq_len: 40\n"
                 "  precision: amp-bf16\n",
                 D, H, llama[i].ffn, V, llama[i].attention, hd);
        check_applied(y, p, llama[i].why);
    }
    ml_profile_destroy(p);
}

/* Points at two widths (D = 32 and 16, F/D held) separate the bytes per
 * token that do not grow with D from those that do, as the runner measures
 * by default; counted by hand per token (b = 4 fp32, 2 amp):
 *  - GPT-2 block, F = 4D: c = (34D + 8F)/4D = 16.5 fp32, (22D + 4F)/2D = 19
 *    amp; the LayerNorms' mean and rstd c_tokens = 16;
 *  - Llama block, F = 3D: c = (40D + 16F)/4D = 22 fp32, (34D + 8F)/2D = 29
 *    amp; the two rsqrt c_tokens = 8;
 * and the planner's block at a third width, D = 64, equals its analytic
 * inventory to the byte (with c alone, fitted at one width, the statistics
 * scale with D and it is off by 16*B*T*(64/32 - 1) bytes). */
static void test_fit_across_widths(void **state)
{
    (void)state;
    const size_t H = 4, V = 20, Ds[] = {32, 16};
    const size_t Bs[] = {1, 2, 3}, Ts[] = {8, 16, 24};
    for (int amp = 0; amp < 2; amp++) {
        ml_profile *p = ml_profile_new();
        ml_profile_set(p, "dtype", amp ? "bf16" : "fp32");
        ml_profile_set(p, "precision", amp ? "amp-bf16" : "fp32");
        for (int k = 0; k < 2; k++)
            for (size_t w = 0; w < 2; w++)
                for (size_t i = 0; i < 3; i++)
                    for (size_t j = 0; j < 3; j++) {
                        size_t D = Ds[w], F = k ? 3 * D : 4 * D;
                        layer_dims d = {Bs[i], Ts[j], D, H, F, V, k ? 0.0f : 0.1f, 2, amp == 1};
                        uint64_t cast;
                        ml_profile_point pt = {.B = Bs[i], .T = Ts[j], .D = D, .H = H, .F = F};
                        pt.saved_bytes = measured(k ? LAYER_LLAMA : LAYER_BLOCK, &d, &cast);
                        pt.cast_bytes = cast;
                        ml_profile_add_point(p, k ? "llama_block" : "transformer_block", &pt);
                    }
        ml_error e;
        assert_int_equal(ml_profile_fit(p, &e), ML_OK);
        const ml_profile_kind *g = ml_profile_find(p, "transformer_block"),
                              *l = ml_profile_find(p, "llama_block");
        assert_rel_close(g->fit.slope, amp ? 19 : 16.5, 1e-9);
        assert_rel_close(g->tokens, 16, 1e-9);
        assert_rel_close(g->attn, amp ? 3.5 : 2.25, 1e-9);
        assert_rel_close(g->mask, 1, 1e-6);
        assert_rel_close(l->fit.slope, amp ? 29 : 22, 1e-9);
        assert_rel_close(l->tokens, 8, 1e-9);
        assert_rel_close(l->attn, amp ? 3 : 1, 1e-9);
        assert_true(fabs(g->fit.fixed) < 1e-3 && fabs(l->fit.fixed) < 1e-3);
        /* a third width: both layouts, extrapolated, to the byte */
        char y[1024];
        const char *prec = amp ? "amp-bf16" : "fp32";
        snprintf(y, sizeof y,
                 "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: %zu\n  ffn: 256\n"
                 "  vocab: %zu\n  max_positions: 64\n  tied_embeddings: false\n  dropout: 0.1\n"
                 "training:\n  micro_batch: 5\n  seq_len: 40\n  precision: %s\n",
                 H, V, prec);
        check_applied(y, p, NULL);
        snprintf(y, sizeof y,
                 "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: %zu\n"
                 "  kv_heads: 2\n  ffn: 192\n  activation: swiglu\n  norm: rmsnorm\n"
                 "  vocab: %zu\n  position: none\n  bias: false\n  tied_embeddings: false\n"
                 "  dropout: 0\ntraining:\n  micro_batch: 5\n  seq_len: 40\n  precision: %s\n",
                 H, V, prec);
        check_applied(y, p, NULL);
        ml_profile_destroy(p);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_saved_bytes_match_the_ledger),
        cmocka_unit_test(test_fit_separates_attention),
        cmocka_unit_test(test_bf16_rounding),
        cmocka_unit_test(test_amp_matches_fp32_within_bf16),
        cmocka_unit_test(test_amp_fit_and_planner),
        cmocka_unit_test(test_fit_across_widths),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
