/* memledger-calibrate: runs real training steps of the layer kinds the
 * planner models, measures what they keep and how fast the GEMMs run, fits
 * c and a fixed term per kind, and writes a profile (docs/calibration.md). */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/cli.h"
#include "layers.h"

static const char usage[] =
    "usage: memledger-calibrate --backend cpu|cuda [options]\n"
    "\n"
    "Runs forward, backward and an Adam step of linear, mlp, transformer_block,\n"
    "lm_head (embedding + LM head + cross-entropy) and llama_block (RMSNorm, GQA\n"
    "attention, SwiGLU) layers at a grid of shapes,\n"
    "recording live bytes per phase through a tracking allocator (and, on CUDA, the\n"
    "device's own view), fits saved bytes = c * B*T*D*b + fixed per kind (b = 4\n"
    "fp32, 2 bf16; + c_tokens * B*T from a second width D/2; the blocks also +\n"
    "c_attention * B*H*T^2*b + c_mask * T^2, lm_head + c_positions * T; autocast's\n"
    "weight copies are recorded apart), measures\n"
    "GEMM throughput, and writes a profile for 'memledger plan --calib'.\n"
    "\n"
    "  --backend cpu|cuda      OpenBLAS on the CPU, or cuBLAS on the first GPU\n"
    "  --dtype fp32|bf16       fp32 (default); bf16: the layers under torch.autocast's\n"
    "                          bf16 rules (the ledger's amp-bf16: fp32 weights, bf16\n"
    "                          matmuls, fp32 norms and softmax) and bf16 GEMM\n"
    "                          throughput (CUDA; on the CPU bf16 values are stored and\n"
    "                          the arithmetic is fp32, so no bf16 GEMM figure)\n"
    "  --layers KINDS          comma-separated subset of linear,mlp,transformer_block,\n"
    "                          lm_head,llama_block\n"
    "  --points BxT,...        shapes, e.g. 1x64,2x64,4x128 or 1\u00d764 (default: 4 micro-batches x\n"
    "                          3 sequence lengths, sized to the backend)\n"
    "  --hidden D --heads H --kv-heads K --vocab V --dropout P   layer sizes\n"
    "  --ffn F                 MLP width (default 4D; the Llama block 8D/3 rounded up to\n"
    "                          64); the planner applies a profile to models with the\n"
    "                          same F/D only\n"
    "  --peak-tflops X         the device's dense peak, for the efficiency figure\n"
    "  --check                 with --backend cuda: run every layer kind on the CPU and\n"
    "                          on the GPU with the same weights and inputs and compare\n"
    "                          outputs and gradients (1e-3 of each tensor's largest value;\n"
    "                          2e-2 with --dtype bf16); exit 1 on a mismatch\n"
    "  --name NAME             the profile's name (default: backend-dtype)\n"
    "  -o PROFILE.yaml         write the profile there (atomically); default stdout\n"
    "\n"
    "Exit status: 0 written, 2 bad usage or no such backend, 3 a failure while\n"
    "measuring or writing.\n";

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

static void fill_random(ml_backend *be, tn *t, bool ids, size_t V)
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

/* One measured training step of a layer at a shape. Returns 0 or -1. */
static int measure(ml_backend *be, kind_t k, const dims *d, ml_profile_point *out)
{
    tracker tr;
    tracker_init(&tr, be);
    layer l;
    if (layer_init(&l, k, d, &tr, 1234) != 0) {
        layer_destroy(&l, &tr);
        return -1;
    }
    tr.peak[PH_FORWARD] = tr.total;
    tn x = talloc(&tr, layer_input_bytes(&l), T_SAVED);
    if (tr.oom) {
        layer_destroy(&l, &tr);
        return -1;
    }
    fill_random(be, &x, k == K_LMHEAD, d->V);
    be->sync(be);
    double t0 = now();
    tr.phase = PH_FORWARD;
    tn y = layer_forward(&l, &tr, &x);
    be->sync(be);
    tracker_device_sample(&tr);
    uint64_t saved = tr.live[T_SAVED], cast = tr.live[T_CAST];
    tr.phase = PH_BACKWARD;
    tr.peak[PH_BACKWARD] = tr.total;
    tn dy = talloc(&tr, y.bytes, T_WORK);
    if (!tr.oom)
        fill_random(be, &dy, false, 0);
    tn dx = tr.oom ? y : layer_backward(&l, &tr, &dy);
    be->sync(be);
    tracker_device_sample(&tr);
    tfree(&tr, &y);
    tfree(&tr, &dy);
    tfree(&tr, &dx);
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
    out->B = d->B;
    out->T = d->T;
    out->D = d->D;
    out->H = k == K_BLOCK || k == K_LLAMA ? d->H : 0;
    out->F = k == K_MLP || k == K_BLOCK || k == K_LLAMA ? d->F : 0;
    out->saved_bytes = saved;
    out->cast_bytes = cast;
    out->peak_forward = tr.peak[PH_FORWARD];
    out->peak_backward = tr.peak[PH_BACKWARD];
    out->peak_step = tr.peak[PH_STEP];
    out->device_peak = tr.dev_peak;
    out->time_s = t1 - t0;
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

/* Copies a device tensor to a new host buffer. */
static float *host_copy(ml_backend *be, const tn *t)
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

/* --check: the same layer, weights and inputs on the CPU and on the GPU;
 * outputs, input gradients and weight gradients must agree within fp32
 * tolerance (relative to each tensor's largest magnitude). */
static int check_backends(ml_backend *gpu, ml_backend *cpu, const dims *d)
{
    /* amp: both sides round the same tensors to bf16, but a value on either
     * side of a rounding boundary moves by one bf16 step (2^-8) */
    double tol = d->amp ? 2e-2 : 1e-3;
    int bad = 0;
    for (int k = 0; k < K_COUNT; k++) {
        tracker tg, tc;
        tracker_init(&tg, gpu);
        tracker_init(&tc, cpu);
        layer lg, lc;
        if (layer_init(&lg, (kind_t)k, d, &tg, 4242) || layer_init(&lc, (kind_t)k, d, &tc, 4242)) {
            fprintf(stderr, "check: %s: out of memory\n", kind_names[k]);
            return 1;
        }
        tn xg = talloc(&tg, layer_input_bytes(&lg), T_SAVED);
        tn xc = talloc(&tc, layer_input_bytes(&lc), T_SAVED);
        fill_random(gpu, &xg, k == K_LMHEAD, d->V);
        fill_random(cpu, &xc, k == K_LMHEAD, d->V);
        tn yg = layer_forward(&lg, &tg, &xg), yc = layer_forward(&lc, &tc, &xc);
        tn dyg = talloc(&tg, yg.bytes, T_WORK), dyc = talloc(&tc, yc.bytes, T_WORK);
        fill_random(gpu, &dyg, false, 0);
        fill_random(cpu, &dyc, false, 0);
        float *hy_g = host_copy(gpu, &yg), *hy_c = host_copy(cpu, &yc);
        tn dxg = layer_backward(&lg, &tg, &dyg), dxc = layer_backward(&lc, &tc, &dyc);
        gpu->sync(gpu);
        if (gpu->failed || cpu->failed || tg.oom || tc.oom) {
            fprintf(stderr, "check: %s: out of memory\n", kind_names[k]);
            return 1;
        }
        double worst = max_rel(hy_c, hy_g, yc.bytes / 4);
        if (dxc.p) {
            float *a = host_copy(cpu, &dxc), *b = host_copy(gpu, &dxg);
            worst = fmax(worst, max_rel(a, b, dxc.bytes / 4));
            free(a);
            free(b);
        }
        for (int i = 0; i < lc.nparams; i++) {
            float *a = host_copy(cpu, &lc.g[i]), *b = host_copy(gpu, &lg.g[i]);
            worst = fmax(worst, max_rel(a, b, lc.wn[i]));
            free(a);
            free(b);
        }
        bool ok = worst < tol;
        fprintf(stderr, "%s %-18s largest relative difference, %s vs %s: %.3g\n",
                ok ? "ok  " : "FAIL", kind_names[k], gpu->name, cpu->name, worst);
        bad += !ok;
        free(hy_g);
        free(hy_c);
        tfree(&tg, &yg);
        tfree(&tc, &yc);
        tfree(&tg, &dyg);
        tfree(&tc, &dyc);
        tfree(&tg, &dxg);
        tfree(&tc, &dxc);
        layer_destroy(&lg, &tg);
        layer_destroy(&lc, &tc);
    }
    return bad ? 1 : 0;
}

/* A layer size option: a whole number from 1 to 2^22, or 0 with a message. */
static size_t size_opt(const char *opt, const char *v)
{
    char *end = NULL;
    unsigned long long n = (*v >= '0' && *v <= '9') ? strtoull(v, &end, 10) : 0;
    if (!end || *end || n < 1 || n > (1ull << 22)) {
        fprintf(stderr, "memledger-calibrate: error: %s: '%s' is not a whole number from 1 to "
                        "4194304\n", opt, v);
        return 0;
    }
    return (size_t)n;
}

/* A whole number of at most 9 digits at *s (no sign, no space). */
static bool grid_num(const char **s, unsigned long *v)
{
    const char *p = *s;
    *v = 0;
    while (*p >= '0' && *p <= '9' && p - *s < 9)
        *v = *v * 10 + (unsigned long)(*p++ - '0');
    if (p == *s || (*p >= '0' && *p <= '9'))
        return false;
    *s = p;
    return true;
}

/* "1x64,2x128" (x, X or the multiplication sign U+00D7) into B[] and T[]. */
static bool parse_grid(const char *s, size_t *B, size_t *T, size_t *n, size_t cap)
{
    *n = 0;
    while (*s) {
        unsigned long b, t;
        if (*n == cap || !grid_num(&s, &b))
            return false;
        if (*s == 'x' || *s == 'X')
            s++;
        else if ((unsigned char)s[0] == 0xC3 && (unsigned char)s[1] == 0x97)
            s += 2;
        else
            return false;
        if (!grid_num(&s, &t) || b == 0 || t == 0 || b > 4096 || t > 65536)
            return false;
        B[*n] = b;
        T[*n] = t;
        (*n)++;
        if (*s == ',' && s[1])
            s++;
        else if (*s)
            return false;
    }
    return *n > 0;
}

int main(int argc, char **argv)
{
    const char *backend = NULL, *dtype = "fp32", *layers = NULL, *grid = NULL, *out = NULL,
               *name = NULL;
    size_t D = 0, H = 0, V = 0, KVH = 0, FF = 0;
    double peak = 0, dropout = 0.1;
    bool check = false;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 0;
        }
        if (!strcmp(a, "--check")) {
            check = true;
            continue;
        }
        /* a value that is itself a flag ("-o --points"): none was given */
        if (!v || !*v || (v[0] == '-' && v[1] && !isdigit((unsigned char)v[1]))) {
            fprintf(stderr, "memledger-calibrate: error: %s needs a %s\n", a,
                    !strcmp(a, "-o") ? "file name" : "value");
            return 2;
        }
        i++;
        if (!strcmp(a, "--backend"))
            backend = v;
        else if (!strcmp(a, "--dtype"))
            dtype = v;
        else if (!strcmp(a, "--layers"))
            layers = v;
        else if (!strcmp(a, "--points"))
            grid = v;
        else if (!strcmp(a, "-o"))
            out = v;
        else if (!strcmp(a, "--name"))
            name = v;
        else if (!strcmp(a, "--hidden") || !strcmp(a, "--heads") || !strcmp(a, "--vocab") ||
                 !strcmp(a, "--kv-heads") || !strcmp(a, "--ffn")) {
            size_t n = size_opt(a, v);
            if (!n)
                return 2;
            *(!strcmp(a, "--hidden")  ? &D
              : !strcmp(a, "--heads") ? &H
              : !strcmp(a, "--vocab") ? &V
              : !strcmp(a, "--ffn")   ? &FF
                                      : &KVH) = n;
        }
        else if (!strcmp(a, "--dropout") || !strcmp(a, "--peak-tflops")) {
            char *end = NULL;
            double x = strtod(v, &end);
            if (end == v || *end || !isfinite(x) || x < 0) {
                fprintf(stderr, "memledger-calibrate: error: %s: '%s' is not a number >= 0\n",
                        a, v);
                return 2;
            }
            *(!strcmp(a, "--dropout") ? &dropout : &peak) = x;
        }
        else {
            fprintf(stderr, "memledger-calibrate: error: unknown option '%s'\n", a);
            return 2;
        }
    }
    if (!backend || (strcmp(backend, "cpu") && strcmp(backend, "cuda"))) {
        fprintf(stderr, "memledger-calibrate: error: --backend cpu|cuda is required\n");
        return 2;
    }
    if (strcmp(dtype, "fp32") && strcmp(dtype, "bf16")) {
        fprintf(stderr, "memledger-calibrate: error: --dtype is fp32 or bf16\n");
        return 2;
    }
    if (!(dropout >= 0 && dropout < 1)) {
        fprintf(stderr, "memledger-calibrate: error: --dropout must be in [0, 1)\n");
        return 2;
    }
    const char *why = "not built";
    ml_backend *be = !strcmp(backend, "cpu") ? ml_backend_cpu(&why) : ml_backend_cuda(&why);
    if (!be) {
        fprintf(stderr, "memledger-calibrate: error: backend %s: %s\n", backend, why);
        return 2;
    }
    bool gpu = !strcmp(backend, "cuda");
    if (!D)
        D = gpu ? 1024 : 256;
    if (!H)
        H = gpu ? 16 : 4;
    if (!V)
        V = gpu ? 32000 : 4096;
    if (!KVH)
        KVH = H >= 4 ? H / 4 : H; /* GQA by default for the Llama-style block */
    if (D % H || H % KVH) {
        fprintf(stderr, "memledger-calibrate: error: --heads must divide --hidden and "
                        "--kv-heads divide --heads\n");
        be->destroy(be);
        return 2;
    }
    size_t Bs[64], Ts[64], np = 0;
    if (grid) {
        if (!parse_grid(grid, Bs, Ts, &np, 64)) {
            fprintf(stderr, "memledger-calibrate: error: --points: '%s' is not a list of at most 64 "
                            "BxT points such as 1x64,2x128 (1 <= B <= 4096, 1 <= T <= 65536)\n",
                    grid);
            be->destroy(be);
            return 2;
        }
    } else {
        const size_t b4[4] = {1, 2, 4, 8};
        const size_t tc[3] = {64, 128, 256}, tg[3] = {256, 512, 1024};
        for (int i = 0; i < 4; i++)
            for (int j = 0; j < 3; j++) {
                Bs[np] = b4[i];
                Ts[np] = gpu ? tg[j] : tc[j];
                np++;
            }
    }
    bool want[K_COUNT] = {true, true, true, true, true};
    if (layers) {
        memset(want, 0, sizeof want);
        char buf[256];
        snprintf(buf, sizeof buf, "%s", layers);
        for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
            int k;
            for (k = 0; k < K_COUNT; k++)
                if (!strcmp(t, kind_names[k]))
                    break;
            if (k == K_COUNT) {
                fprintf(stderr, "memledger-calibrate: error: --layers: unknown kind '%s' "
                                "(linear, mlp, transformer_block, lm_head, llama_block)\n", t);
                be->destroy(be);
                return 2;
            }
            want[k] = true;
        }
    }
    if (check) {
        /* with --backend cpu, a second CPU instance: checks the comparison itself */
        const char *cwhy = "not built";
        ml_backend *cpu = ml_backend_cpu(&cwhy);
        if (!cpu) {
            fprintf(stderr, "memledger-calibrate: error: --check compares with the CPU "
                            "backend: %s\n", cwhy);
            be->destroy(be);
            return 2;
        }
        dims d = {2, 64, D > 256 ? 256 : D, H > 8 ? 8 : H, 4 * (D > 256 ? 256 : D), 1000,
                  (float)dropout, 0, false};
        if (d.D % d.H)
            d.H = 4;
        d.KV = d.H >= 4 ? d.H / 4 : d.H;
        d.amp = !strcmp(dtype, "bf16");
        int r = check_backends(be, cpu, &d);
        cpu->destroy(cpu);
        be->destroy(be);
        return r;
    }
    bool bf16 = !strcmp(dtype, "bf16");
    ml_profile *prof = ml_profile_new();
    char nm[128], when[64];
    snprintf(nm, sizeof nm, "%s", name ? name : "");
    if (!name)
        snprintf(nm, sizeof nm, "%s-%s", backend, dtype);
    time_t tnow = time(NULL);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", gmtime(&tnow));
    ml_profile_set(prof, "name", nm);
    ml_profile_set(prof, "backend", backend);
    ml_profile_set(prof, "device", be->device);
    ml_profile_set(prof, "dtype", dtype);
    ml_profile_set(prof, "precision", bf16 ? "amp-bf16" : "fp32");
    ml_profile_set(prof, "driver", be->driver);
    ml_profile_set(prof, "library", be->library);
    ml_profile_set(prof, "created", when);
    ml_profile_set(prof, "notes",
                   bf16 ? (gpu ? "bf16 autocast layers (amp-bf16); saved tensors as PyTorch "
                                 "eager autograd keeps them under torch.autocast "
                                 "(tests/unit/test_calib.c); bf16 cuBLAS GEMMs"
                               : "bf16 autocast layers (amp-bf16); saved tensors as PyTorch "
                                 "eager autograd keeps them under torch.autocast "
                                 "(tests/unit/test_calib.c); bf16 storage, fp32 arithmetic "
                                 "on the CPU, so no GEMM throughput")
                        : "fp32 layers; saved tensors as PyTorch eager autograd keeps them "
                          "(tests/unit/test_calib.c)");
    ml_profile_set_peak(prof, peak);
    int rc = 0;
    /* Every kind is measured at D and, when the sizes divide, at D/2 with F/2
     * (the same F/D): bytes per token that do not grow with D (the norms'
     * statistics, int64 ids) then separate from those that do (c_tokens). */
    size_t Fk[K_COUNT], nw[K_COUNT], total = 0, done = 0;
    for (int k = 0; k < K_COUNT; k++) {
        Fk[k] = FF ? FF : k == K_LLAMA ? (8 * D / 3 + 63) / 64 * 64 /* Llama's 8D/3 rounded */
                                       : 4 * D;
        nw[k] = D % 2 == 0 && (D / 2) % H == 0 && Fk[k] % 2 == 0 ? 2 : 1;
        total += want[k] ? np * nw[k] : 0;
    }
    for (int k = 0; k < K_COUNT; k++) {
        if (!want[k])
            continue;
        for (size_t w = 0; w < nw[k]; w++)
        for (size_t i = 0; i < np; i++) {
            dims d = {Bs[i], Ts[i], D >> w, H, Fk[k] >> w, V, (float)dropout, KVH, bf16};
            ml_profile_point pt;
            char what[80];
            snprintf(what, sizeof what, "%s B=%zu T=%zu D=%zu", kind_names[k], d.B, d.T, d.D);
            progress(done, total, what);
            if (measure(be, (kind_t)k, &d, &pt) != 0) {
                fprintf(stderr, "\nmemledger-calibrate: %s: out of device memory; skipped\n",
                        what);
            } else {
                ml_profile_add_point(prof, kind_names[k], &pt);
            }
            progress(++done, total, what);
        }
    }
    /* GEMM throughput */
    const int sizes_cpu[] = {256, 512, 1024}, sizes_gpu[] = {1024, 2048, 4096, 8192};
    const int *sizes = gpu ? sizes_gpu : sizes_cpu;
    int nsizes = gpu ? 4 : 3;
    for (int i = 0; i < nsizes; i++) {
        int n = sizes[i];
        double tf = bf16 ? (be->gemm_bf16_tflops ? be->gemm_bf16_tflops(be, n, n, n, 10) : 0)
                         : gemm_tflops(be, n, gpu ? 10 : 3);
        ml_profile_gemm g = {(uint64_t)n, (uint64_t)n, (uint64_t)n, tf};
        if (tf > 0)
            ml_profile_add_gemm(prof, &g);
    }
    if (bf16 && ml_profile_gemm_count(prof) == 0)
        fprintf(stderr, "memledger-calibrate: note: no bf16 GEMM throughput on the %s backend; "
                        "the planner keeps its analytic step time\n", backend);
    ml_error e;
    memset(&e, 0, sizeof e);
    if (!rc && ml_profile_fit(prof, &e) != ML_OK) {
        fprintf(stderr, "memledger-calibrate: error: %s\n", e.msg);
        rc = 3;
    }
    if (!rc) {
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
        ml_out o;
        rc = ml_out_open(&o, out);
        if (!rc)
            rc = ml_out_close(&o, ml_profile_write(o.f, prof) == 0);
    }
    ml_profile_destroy(prof);
    be->destroy(be);
    return rc;
}
