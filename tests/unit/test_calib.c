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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gradients),
        cmocka_unit_test(test_saved_bytes_match_the_ledger),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
