/* --check: the same layer, weights and inputs on the CPU and on the GPU;
 * outputs, input gradients and weight gradients must agree within fp32
 * tolerance (relative to each tensor's largest magnitude). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

/* Copies a device tensor to a new host buffer. */
static float *host_copy(ml_backend *be, const tensor *t)
{
    float *h = malloc(t->bytes ? t->bytes : 1);
    if (h && t->p)
        be->download(be, h, t->p, t->bytes);
    return h;
}

static double max_rel(const float *a, const float *b, size_t n)
{
    double m = 0, scale = 1e-6;
    for (size_t i = 0; i < n; i++)
        scale = fmax(scale, fabs((double)a[i]));
    for (size_t i = 0; i < n; i++)
        m = fmax(m, fabs((double)a[i] - (double)b[i]) / scale);
    return m;
}

/* The largest relative difference between two host copies of a and b. */
static double tensor_diff(ml_backend *be_a, const tensor *a, ml_backend *be_b, const tensor *b,
                          size_t n)
{
    float *ha = host_copy(be_a, a), *hb = host_copy(be_b, b);
    double d = max_rel(ha, hb, n);
    free(ha);
    free(hb);
    return d;
}

/* One kind on both backends. Returns 0 agree, 1 a mismatch, -1 out of
 * memory (after a message). */
static int check_kind(ml_backend *gpu, ml_backend *cpu, const layer_dims *d, layer_kind k,
                      double tol)
{
    const char *name = layer_kind_name(k);
    tracker tg, tc;
    tracker_init(&tg, gpu);
    tracker_init(&tc, cpu);
    layer lg, lc;
    if (layer_init(&lg, k, d, &tg, 4242) || layer_init(&lc, k, d, &tc, 4242)) {
        fprintf(stderr, "check: %s: out of memory\n", name);
        return -1;
    }
    tensor xg = tensor_alloc(&tg, layer_input_bytes(&lg), T_SAVED);
    tensor xc = tensor_alloc(&tc, layer_input_bytes(&lc), T_SAVED);
    runner_fill_random(gpu, &xg, k == LAYER_LM_HEAD, d->V);
    runner_fill_random(cpu, &xc, k == LAYER_LM_HEAD, d->V);
    tensor yg = layer_forward(&lg, &tg, &xg), yc = layer_forward(&lc, &tc, &xc);
    tensor dyg = tensor_alloc(&tg, yg.bytes, T_WORK), dyc = tensor_alloc(&tc, yc.bytes, T_WORK);
    runner_fill_random(gpu, &dyg, false, 0);
    runner_fill_random(cpu, &dyc, false, 0);
    float *hy_g = host_copy(gpu, &yg), *hy_c = host_copy(cpu, &yc);
    tensor dxg = layer_backward(&lg, &tg, &dyg), dxc = layer_backward(&lc, &tc, &dyc);
    gpu->sync(gpu);
    if (gpu->failed || cpu->failed || tg.oom || tc.oom) {
        fprintf(stderr, "check: %s: out of memory\n", name);
        return -1;
    }
    double worst = max_rel(hy_c, hy_g, yc.bytes / 4);
    if (dxc.p)
        worst = fmax(worst, tensor_diff(cpu, &dxc, gpu, &dxg, dxc.bytes / 4));
    for (int i = 0; i < lc.nparams; i++)
        worst = fmax(worst, tensor_diff(cpu, &lc.g[i], gpu, &lg.g[i], lc.wn[i]));
    bool ok = worst < tol;
    fprintf(stderr, "%s %-18s largest relative difference, %s vs %s: %.3g\n",
            ok ? "ok  " : "FAIL", name, gpu->name, cpu->name, worst);
    free(hy_g);
    free(hy_c);
    tensor_free(&tg, &yg);
    tensor_free(&tc, &yc);
    tensor_free(&tg, &dyg);
    tensor_free(&tc, &dyc);
    tensor_free(&tg, &dxg);
    tensor_free(&tc, &dxc);
    layer_destroy(&lg, &tg);
    layer_destroy(&lc, &tc);
    return ok ? 0 : 1;
}

static int check_backends(ml_backend *gpu, ml_backend *cpu, const layer_dims *d)
{
    /* amp: both sides round the same tensors to bf16, but a value on either
     * side of a rounding boundary moves by one bf16 step (2^-8) */
    double tol = d->amp ? 2e-2 : 1e-3;
    int bad = 0;
    for (int k = 0; k < LAYER_KIND_COUNT; k++) {
        int r = check_kind(gpu, cpu, d, (layer_kind)k, tol);
        if (r < 0)
            return 1;
        bad += r;
    }
    return bad ? 1 : 0;
}

int runner_check_backends(ml_backend *be, const runner_options *o)
{
    /* with --backend cpu, a second CPU instance: checks the comparison itself */
    const char *cwhy = "not built";
    ml_backend *cpu = ml_backend_cpu(&cwhy);
    if (!cpu) {
        fprintf(stderr, "memledger-calibrate: error: --check compares with the CPU "
                        "backend: %s\n", cwhy);
        return 2;
    }
    size_t D = o->D > 256 ? 256 : o->D;
    layer_dims d = {2, 64, D, o->H > 8 ? 8 : o->H, 4 * D, 1000, (float)o->dropout, 0, false};
    if (d.D % d.H)
        d.H = 4;
    d.KV = d.H >= 4 ? d.H / 4 : d.H;
    d.amp = o->bf16;
    int r = check_backends(be, cpu, &d);
    cpu->destroy(cpu);
    return r;
}
