/* memledger-calibrate: runs real training steps of the layer kinds the
 * planner models, measures what they keep and how fast the GEMMs run, fits
 * c and a fixed term per kind, and writes a profile (docs/calibration.md).
 * The options are runner_options.c's, --check is runner_check.c's. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "runner.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void progress(size_t done, size_t total, const char *what)
{
    if (!isatty(2))
        return;
    int w = 30, filled = total ? (int)(w * done / total) : w;
    fprintf(stderr, "\r[%.*s%*s] %zu/%zu %-40s", filled, "##############################",
            w - filled, "", done, total, what);
    if (done == total)
        fputc('\n', stderr);
}

void runner_fill_random(ml_backend *be, tensor *t, bool ids, size_t V)
{
    size_t n = ids ? t->bytes / 8 : t->bytes / 4;
    void *h = malloc(t->bytes);
    if (!h)
        return;
    uint64_t s = 88172645463325252ull;
    for (size_t i = 0; i < n; i++) {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        if (ids)
            ((int64_t *)h)[i] = (int64_t)(s % V);
        else
            ((float *)h)[i] = (float)((double)(s >> 11) / 9007199254740992.0 - 0.5);
    }
    be->upload(be, t->p, h, t->bytes);
    free(h);
}

/* The point's shape and what the tracker recorded. */
static void record_point(const tracker *tr, layer_kind k, const layer_dims *d, uint64_t saved,
                         uint64_t cast, double time_s, ml_profile_point *out)
{
    out->B = d->B;
    out->T = d->T;
    out->D = d->D;
    out->H = k == LAYER_BLOCK || k == LAYER_LLAMA ? d->H : 0;
    out->F = k == LAYER_MLP || k == LAYER_BLOCK || k == LAYER_LLAMA ? d->F : 0;
    out->saved_bytes = saved;
    out->cast_bytes = cast;
    out->peak_forward = tr->peak[PH_FORWARD];
    out->peak_backward = tr->peak[PH_BACKWARD];
    out->peak_step = tr->peak[PH_STEP];
    out->device_peak = tr->dev_peak;
    out->time_s = time_s;
}

/* One measured training step of a layer at a shape. Returns 0 or -1. */
static int measure(ml_backend *be, layer_kind k, const layer_dims *d, ml_profile_point *out)
{
    tracker tr;
    tracker_init(&tr, be);
    layer l;
    if (layer_init(&l, k, d, &tr, 1234) != 0) {
        layer_destroy(&l, &tr);
        return -1;
    }
    tr.peak[PH_FORWARD] = tr.total;
    tensor x = tensor_alloc(&tr, layer_input_bytes(&l), T_SAVED);
    if (tr.oom) {
        layer_destroy(&l, &tr);
        return -1;
    }
    runner_fill_random(be, &x, k == LAYER_LM_HEAD, d->V);
    be->sync(be);
    double t0 = now();
    tr.phase = PH_FORWARD;
    tensor y = layer_forward(&l, &tr, &x);
    be->sync(be);
    tracker_device_sample(&tr);
    uint64_t saved = tr.live[T_SAVED], cast = tr.live[T_CAST];
    tr.phase = PH_BACKWARD;
    tr.peak[PH_BACKWARD] = tr.total;
    tensor dy = tensor_alloc(&tr, y.bytes, T_WORK);
    if (!tr.oom)
        runner_fill_random(be, &dy, false, 0);
    tensor dx = tr.oom ? y : layer_backward(&l, &tr, &dy);
    be->sync(be);
    tracker_device_sample(&tr);
    tensor_free(&tr, &y);
    tensor_free(&tr, &dy);
    tensor_free(&tr, &dx);
    tr.phase = PH_STEP;
    tr.peak[PH_STEP] = tr.total;
    layer_step(&l, &tr);
    be->sync(be);
    tracker_device_sample(&tr);
    double t1 = now();
    bool oom = tr.oom || be->failed;
    be->failed = false;
    layer_destroy(&l, &tr);
    if (oom)
        return -1;
    record_point(&tr, k, d, saved, cast, t1 - t0, out);
    return 0;
}

static double gemm_tflops(ml_backend *be, int n, int reps)
{
    size_t bytes = (size_t)n * (size_t)n * 4;
    float *A = be->alloc(be, bytes), *B = be->alloc(be, bytes), *C = be->alloc(be, bytes);
    if (!A || !B || !C) {
        be->free(be, A);
        be->free(be, B);
        be->free(be, C);
        return 0;
    }
    be->zero(be, A, bytes);
    be->zero(be, B, bytes);
    be->gemm(be, false, false, n, n, n, 1.0f, A, B, 0.0f, C); /* warm-up */
    be->sync(be);
    double t0 = now();
    for (int i = 0; i < reps; i++)
        be->gemm(be, false, false, n, n, n, 1.0f, A, B, 0.0f, C);
    be->sync(be);
    double t = now() - t0;
    be->free(be, A);
    be->free(be, B);
    be->free(be, C);
    return t > 0 ? 2.0 * n * (double)n * n * reps / t / 1e12 : 0;
}

/* A new profile with the run's description: name, backend, device,
 * precision, libraries, time. */
static ml_profile *profile_begin(const ml_backend *be, const runner_options *o)
{
    ml_profile *prof = ml_profile_new();
    char nm[128], when[64];
    snprintf(nm, sizeof nm, "%s", o->name ? o->name : "");
    if (!o->name)
        snprintf(nm, sizeof nm, "%s-%s", o->backend, o->dtype);
    time_t tnow = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tnow));
    ml_profile_set(prof, "name", nm);
    ml_profile_set(prof, "backend", o->backend);
    ml_profile_set(prof, "device", be->device);
    ml_profile_set(prof, "dtype", o->dtype);
    ml_profile_set(prof, "precision", o->bf16 ? "amp-bf16" : "fp32");
    ml_profile_set(prof, "driver", be->driver);
    ml_profile_set(prof, "library", be->library);
    ml_profile_set(prof, "created", when);
    ml_profile_set(prof, "notes",
                   o->bf16 ? (o->gpu ? "bf16 autocast layers (amp-bf16); saved tensors as PyTorch "
                                       "eager autograd keeps them under torch.autocast "
                                       "(tests/unit/test_calib.c); bf16 cuBLAS GEMMs"
                                     : "bf16 autocast layers (amp-bf16); saved tensors as PyTorch "
                                       "eager autograd keeps them under torch.autocast "
                                       "(tests/unit/test_calib.c); bf16 storage, fp32 arithmetic "
                                       "on the CPU, so no GEMM throughput")
                           : "fp32 layers; saved tensors as PyTorch eager autograd keeps them "
                             "(tests/unit/test_calib.c)");
    ml_profile_set_peak(prof, o->peak);
    return prof;
}

/* Every wanted kind at every point, into prof; a point that runs out of
 * device memory is skipped with a message. */
static void measure_layers(ml_backend *be, const runner_options *o, ml_profile *prof)
{
    /* Every kind is measured at D and, when the sizes divide, at D/2 with F/2
     * (the same F/D): bytes per token that do not grow with D (the norms'
     * statistics, int64 ids) then separate from those that do (c_tokens). */
    size_t D = o->D, Fk[LAYER_KIND_COUNT], nw[LAYER_KIND_COUNT], total = 0, done = 0;
    for (int k = 0; k < LAYER_KIND_COUNT; k++) {
        Fk[k] = o->FF ? o->FF
                : k == LAYER_LLAMA ? (8 * D / 3 + 63) / 64 * 64 /* Llama's 8D/3 rounded */
                                   : 4 * D;
        nw[k] = D % 2 == 0 && (D / 2) % o->H == 0 && Fk[k] % 2 == 0 ? 2 : 1;
        total += o->want[k] ? o->npoints * nw[k] : 0;
    }
    for (int k = 0; k < LAYER_KIND_COUNT; k++) {
        if (!o->want[k])
            continue;
        const char *name = layer_kind_name((layer_kind)k);
        for (size_t w = 0; w < nw[k]; w++)
        for (size_t i = 0; i < o->npoints; i++) {
            layer_dims d = {o->B[i], o->T[i], D >> w, o->H, Fk[k] >> w, o->V,
                            (float)o->dropout, o->KVH, o->bf16};
            ml_profile_point pt;
            char what[80];
            snprintf(what, sizeof what, "%s B=%zu T=%zu D=%zu", name, d.B, d.T, d.D);
            progress(done, total, what);
            if (measure(be, (layer_kind)k, &d, &pt) != 0) {
                fprintf(stderr, "\nmemledger-calibrate: %s: out of device memory; skipped\n",
                        what);
            } else {
                ml_profile_add_point(prof, name, &pt);
            }
            progress(++done, total, what);
        }
    }
}

/* GEMM throughput at a few square sizes, into prof */
static void measure_gemms(ml_backend *be, const runner_options *o, ml_profile *prof)
{
    const int sizes_cpu[] = {256, 512, 1024}, sizes_gpu[] = {1024, 2048, 4096, 8192};
    const int *sizes = o->gpu ? sizes_gpu : sizes_cpu;
    int nsizes = o->gpu ? 4 : 3;
    for (int i = 0; i < nsizes; i++) {
        int n = sizes[i];
        double tf = o->bf16 ? (be->gemm_bf16_tflops ? be->gemm_bf16_tflops(be, n, n, n, 10) : 0)
                            : gemm_tflops(be, n, o->gpu ? 10 : 3);
        ml_profile_gemm g = {(uint64_t)n, (uint64_t)n, (uint64_t)n, tf};
        if (tf > 0)
            ml_profile_add_gemm(prof, &g);
    }
    if (o->bf16 && ml_profile_gemm_count(prof) == 0)
        fprintf(stderr, "memledger-calibrate: note: no bf16 GEMM throughput on the %s backend; "
                        "the planner keeps its analytic step time\n", o->backend);
}

/* One line per fitted kind on stderr, then the best GEMM throughput. */
static void print_fits(const ml_profile *prof, double peak)
{
    for (size_t i = 0; i < ml_profile_kind_count(prof); i++) {
        const ml_profile_kind *k = ml_profile_kind_at(prof, i);
        char attn[120] = "";
        int at = 0;
        if (k->tokens != 0)
            at = snprintf(attn, sizeof attn, ", c_tokens = %.4f", k->tokens);
        if (k->attn != 0)
            snprintf(attn + at, sizeof attn - (size_t)at, ", c_attention = %.4f, c_mask = %.4f",
                     k->attn, k->mask);
        else if (k->pos != 0)
            snprintf(attn + at, sizeof attn - (size_t)at, ", c_positions = %.4f", k->pos);
        fprintf(stderr, "%-18s c = %8.4f%s, fixed %.0f B, R^2 %.6f, largest residual %.3f%% "
                        "(%zu points)\n",
                k->kind, k->fit.slope, attn, k->fit.fixed, k->fit.r2,
                100 * k->fit.max_rel_residual, k->npoints);
    }
    if (ml_profile_gemm_count(prof))
        fprintf(stderr, "GEMM: best %.4g TFLOP/s%s\n", ml_profile_achieved_tflops(prof),
                peak > 0 ? "" : " (give --peak-tflops for the efficiency)");
}

/* Fits the profile, reports the fits and writes it to -o (or stdout).
 * Returns the exit status: 0, or 3 when the fit or the write failed. */
static int fit_and_write(ml_profile *prof, const runner_options *o)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_profile_fit(prof, &e) != ML_OK) {
        fprintf(stderr, "memledger-calibrate: error: %s\n", e.msg);
        return 3;
    }
    print_fits(prof, o->peak);
    ml_out out;
    int rc = ml_out_open(&out, o->out);
    if (!rc)
        rc = ml_out_close(&out, ml_profile_write(out.f, prof) == 0);
    return rc;
}

int main(int argc, char **argv)
{
    runner_options o;
    int rc = runner_parse_options(&o, argc, argv);
    if (rc)
        return rc == 1 ? 0 : rc;
    const char *why = "not built";
    ml_backend *be = !strcmp(o.backend, "cpu") ? ml_backend_cpu(&why) : ml_backend_cuda(&why);
    if (!be) {
        fprintf(stderr, "memledger-calibrate: error: backend %s: %s\n", o.backend, why);
        return 2;
    }
    rc = runner_resolve_options(&o);
    if (!rc && o.check)
        rc = runner_check_backends(be, &o);
    else if (!rc) {
        ml_profile *prof = profile_begin(be, &o);
        measure_layers(be, &o, prof);
        measure_gemms(be, &o, prof);
        rc = fit_and_write(prof, &o);
        ml_profile_destroy(prof);
    }
    be->destroy(be);
    return rc;
}
