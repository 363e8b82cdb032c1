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

static const dims small = {2, 4, 8, 2, 16, 11, 0.25f, 1};

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
    tn xi = talloc(tr, xbytes, T_SAVED);
    memcpy(xi.p, x, xbytes);
    tn y = layer_forward(l, tr, &xi);
    double L = 0;
    size_t n = y.bytes / 4;
    for (size_t i = 0; i < n; i++)
        L += (double)((float *)y.p)[i] * (l->kind == K_LMHEAD ? 1.0 : R[i]);
    tfree(tr, &y);
    layer_forget(l, tr);
    return L;
}

static void gradcheck(kind_t k)
{
    tracker tr;
    tracker_init(&tr, be);
    layer l;
    assert_int_equal(layer_init(&l, k, &small, &tr, 99), 0);
    size_t xbytes = layer_input_bytes(&l);
    void *x = malloc(xbytes);
    if (k == K_LMHEAD)
        for (size_t i = 0; i < xbytes / 8; i++)
            ((int64_t *)x)[i] = (int64_t)((i * 5 + 3) % small.V);
    else
        for (size_t i = 0; i < xbytes / 4; i++)
            ((float *)x)[i] = rnd();
    size_t ny = k == K_LMHEAD ? 1 : small.B * small.T * small.D;
    float *R = malloc(ny * sizeof *R);
    for (size_t i = 0; i < ny; i++)
        R[i] = rnd();
    /* analytic */
    tn xi = talloc(&tr, xbytes, T_SAVED);
    memcpy(xi.p, x, xbytes);
    tn y = layer_forward(&l, &tr, &xi);
    tn dy = talloc(&tr, y.bytes, T_WORK);
    memcpy(dy.p, R, y.bytes);
    tn dx = layer_backward(&l, &tr, &dy);
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
                fail_msg("%s param %d[%zu]: numeric %.6g, analytic %.6g", kind_names[k], p, j,
                         num, ana);
            checked++;
        }
    }
    if (k != K_LMHEAD) {
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
                fail_msg("%s input[%zu]: numeric %.6g, analytic %.6g", kind_names[k], j, num, ana);
            checked++;
        }
    }
    assert_true(checked > 5);
    tfree(&tr, &y);
    tfree(&tr, &dy);
    tfree(&tr, &dx);
    layer_step(&l, &tr);
    layer_destroy(&l, &tr);
    /* every tensor returned: the tracker balances */
    for (int c = 0; c < T_NCAT; c++)
        assert_int_equal(tr.live[c], 0);
    free(x);
    free(R);
}

static void test_gradients(void **state)
{
    (void)state;
    for (int k = 0; k < K_COUNT; k++)
        gradcheck((kind_t)k);
}

static uint64_t measured_saved(kind_t k, const dims *d)
{
    tracker tr;
    tracker_init(&tr, be);
    layer l;
    assert_int_equal(layer_init(&l, k, d, &tr, 7), 0);
    tn x = talloc(&tr, layer_input_bytes(&l), T_SAVED);
    if (k == K_LMHEAD)
        memset(x.p, 0, x.bytes);
    tn y = layer_forward(&l, &tr, &x);
    uint64_t saved = tr.live[T_SAVED];
    tfree(&tr, &y);
    layer_forget(&l, &tr);
    layer_destroy(&l, &tr);
    return saved;
}

static uint64_t ledger_sum(const char *yaml, const char *const *blocks)
{
    ml_model *m = load_str(yaml);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    uint64_t s = 0;
    for (const char *const *b = blocks; *b; b++)
        s += block_named(l, *b)->inventory_bytes;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return s;
}

static void test_saved_bytes_match_the_ledger(void **state)
{
    (void)state;
    const dims shapes[] = {{2, 16, 32, 4, 128, 50, 0.1f, 2}, {3, 8, 48, 6, 192, 30, 0.1f, 3},
                           {1, 24, 16, 2, 64, 20, 0.0f, 1}};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const dims *d = &shapes[i];
        char y[1024];
        /* transformer block: a GPT-2 decoder's block.0 */
        snprintf(y, sizeof y,
                 "model:\n  type: decoder\n  layers: 1\n  hidden: %zu\n  heads: %zu\n  ffn: %zu\n"
                 "  vocab: %zu\n  max_positions: %zu\n  tied_embeddings: false\n  dropout: %g\n"
                 "training:\n  micro_batch: %zu\n  seq_len: %zu\n",
                 d->D, d->H, d->F, d->V, d->T, (double)d->dropout, d->B, d->T);
        const char *blk[] = {"block.0", NULL};
        assert_int_equal(measured_saved(K_BLOCK, d), ledger_sum(y, blk));
        /* embedding + LM head + cross-entropy */
        const char *lm[] = {"embedding", "head", "loss", NULL};
        assert_int_equal(measured_saved(K_LMHEAD, d), ledger_sum(y, lm));
        /* MLP and linear: sequential models over [T, D] */
        snprintf(y, sizeof y,
                 "model:\n  type: sequential\n  input: [%zu, %zu]\n  layers:\n"
                 "    - linear: {out: %zu}\n    - gelu: {}\n    - linear: {out: %zu}\n"
                 "  loss: mse\ntraining:\n  micro_batch: %zu\n",
                 d->T, d->D, d->F, d->D, d->B);
        const char *mlp[] = {"0:linear", "1:gelu", "2:linear", NULL};
        assert_int_equal(measured_saved(K_MLP, d), ledger_sum(y, mlp));
        snprintf(y, sizeof y,
                 "model:\n  type: sequential\n  input: [%zu, %zu]\n  layers:\n"
                 "    - linear: {out: %zu}\n  loss: mse\ntraining:\n  micro_batch: %zu\n",
                 d->T, d->D, d->D, d->B);
        const char *lin[] = {"0:linear", NULL};
        assert_int_equal(measured_saved(K_LINEAR, d), ledger_sum(y, lin));
        /* Llama-style block: an RMSNorm/SwiGLU decoder with GQA, no biases,
         * no positions (the runner has no rotary tables) */
        snprintf(y, sizeof y,
                 "model:\n  type: decoder\n  layers: 1\n  hidden: %zu\n  heads: %zu\n"
                 "  kv_heads: %zu\n  ffn: %zu\n  activation: swiglu\n  norm: rmsnorm\n"
                 "  vocab: %zu\n  position: none\n  bias: false\n  tied_embeddings: false\n"
                 "  dropout: 0\ntraining:\n  micro_batch: %zu\n  seq_len: %zu\n",
                 d->D, d->H, d->KV, d->F, d->V, d->B, d->T);
        assert_int_equal(measured_saved(K_LLAMA, d), ledger_sum(y, blk));
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
    const kind_t kinds[] = {K_BLOCK, K_LLAMA};
    const char *names[] = {"transformer_block", "llama_block"};
    const double Dd = (double)D, Fd = (double)F;
    const double c_hand[] = {(34 * Dd + 8 * Fd + 16) / (4 * Dd), 10 + 4.0 * Fd / Dd + 2.0 / Dd};
    const double attn_hand[] = {9.0 / 4, 1}, mask_hand[] = {1, 0};
    ml_profile *p = ml_profile_new();
    ml_profile_set(p, "dtype", "fp32");
    for (int k = 0; k < 2; k++)
        for (size_t i = 0; i < 3; i++)
            for (size_t j = 0; j < 3; j++) {
                dims d = {Bs[i], Ts[j], D, H, F, V, k == 0 ? 0.1f : 0.0f, 2};
                ml_profile_point pt = {Bs[i], Ts[j], D, measured_saved(kinds[k], &d), 0, 0, 0, 0,
                                       0, H};
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
        dims d = {5, 40, D, H, F, V, k == 0 ? 0.1f : 0.0f, 2};
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
            dims d = {Bs[i], Ts[j], D, H, F, V, 0.1f, 2};
            ml_profile_point pt = {Bs[i], Ts[j], D, measured_saved(K_LMHEAD, &d), 0, 0, 0, 0, 0, 0};
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
            dims d = {Bs[i], Ts[j], D, H, 4 * D, V, 0.1f, H};
            ml_profile_point pt = {Bs[i], Ts[j], D, measured_saved(K_BLOCK, &d), 0, 0, 0, 0, 0, H};
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_saved_bytes_match_the_ledger),
        cmocka_unit_test(test_fit_separates_attention),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
