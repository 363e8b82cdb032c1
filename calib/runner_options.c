/* memledger-calibrate's command line: the usage text, each option's form,
 * and the values the options imply once the backend is known. */
#include <ctype.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "runner.h"

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

/* One option a with its value v. Returns 0, or 2 after an error message. */
static int set_option(runner_options *o, const char *a, const char *v)
{
    if (!strcmp(a, "--backend"))
        o->backend = v;
    else if (!strcmp(a, "--dtype"))
        o->dtype = v;
    else if (!strcmp(a, "--layers"))
        o->layers = v;
    else if (!strcmp(a, "--points"))
        o->grid = v;
    else if (!strcmp(a, "-o"))
        o->out = v;
    else if (!strcmp(a, "--name"))
        o->name = v;
    else if (!strcmp(a, "--hidden") || !strcmp(a, "--heads") || !strcmp(a, "--vocab") ||
             !strcmp(a, "--kv-heads") || !strcmp(a, "--ffn")) {
        size_t n = size_opt(a, v);
        if (!n)
            return 2;
        *(!strcmp(a, "--hidden")  ? &o->D
          : !strcmp(a, "--heads") ? &o->H
          : !strcmp(a, "--vocab") ? &o->V
          : !strcmp(a, "--ffn")   ? &o->FF
                                  : &o->KVH) = n;
    }
    else if (!strcmp(a, "--dropout") || !strcmp(a, "--peak-tflops")) {
        char *end = NULL;
        double x = strtod(v, &end);
        if (end == v || *end || !isfinite(x) || x < 0) {
            fprintf(stderr, "memledger-calibrate: error: %s: '%s' is not a number >= 0\n", a, v);
            return 2;
        }
        *(!strcmp(a, "--dropout") ? &o->dropout : &o->peak) = x;
    }
    else {
        fprintf(stderr, "memledger-calibrate: error: unknown option '%s'\n", a);
        return 2;
    }
    return 0;
}

/* The choices among fixed words, and the dropout's range. */
static int check_choices(const runner_options *o)
{
    if (!o->backend) {
        fprintf(stderr, "memledger-calibrate: error: --backend cpu|cuda is required\n");
        return 2;
    }
    if (strcmp(o->backend, "cpu") && strcmp(o->backend, "cuda")) {
        fprintf(stderr, "memledger-calibrate: error: --backend: '%s' is not one; use cpu "
                        "(OpenBLAS) or cuda (cuBLAS)\n",
                o->backend);
        return 2;
    }
    if (strcmp(o->dtype, "fp32") && strcmp(o->dtype, "bf16")) {
        fprintf(stderr, "memledger-calibrate: error: --dtype is fp32 or bf16\n");
        return 2;
    }
    if (!(o->dropout >= 0 && o->dropout < 1)) {
        fprintf(stderr, "memledger-calibrate: error: --dropout must be in [0, 1)\n");
        return 2;
    }
    return 0;
}

int runner_parse_options(runner_options *o, int argc, char **argv)
{
    memset(o, 0, sizeof *o);
    o->dtype = "fp32";
    o->dropout = 0.1;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            fputs(usage, stdout);
            return 1;
        }
        if (!strcmp(a, "--check")) {
            o->check = true;
            continue;
        }
        /* a value that is itself a flag ("-o --points"): none was given */
        if (!v || !*v || (v[0] == '-' && v[1] && !isdigit((unsigned char)v[1]))) {
            fprintf(stderr, "memledger-calibrate: error: %s needs a %s\n", a,
                    !strcmp(a, "-o") ? "file name" : "value");
            return 2;
        }
        i++;
        int rc = set_option(o, a, v);
        if (rc)
            return rc;
    }
    return check_choices(o);
}

/* --points, or 4 micro-batches x 3 sequence lengths sized to the backend */
static int resolve_points(runner_options *o)
{
    if (o->grid) {
        if (!parse_grid(o->grid, o->B, o->T, &o->npoints, RUNNER_MAX_POINTS)) {
            fprintf(stderr, "memledger-calibrate: error: --points: '%s' is not a list of at most "
                            "64 BxT points such as 1x64,2x128 (1 <= B <= 4096, 1 <= T <= "
                            "65536)%s\n", o->grid,
                    strchr(o->grid, '.') || strchr(o->grid, '/')
                        ? "; a CSV of measured peaks is 'memledger calibrate --points FILE' "
                          "without --backend"
                        : "");
            return 2;
        }
        return 0;
    }
    /* one key/value head for several query heads: the Llama block keeps
     * that head at micro-batch 1 (bmm's stride-0 view, docs/inventory.md,
     * "A batch of one") and the repeated heads above it, its saved bytes
     * off the line the fit draws through B: the points start at B = 2 */
    const bool mqa = o->KVH == 1 && o->H > 1;
    const size_t b4[4] = {mqa ? 2 : 1, mqa ? 4 : 2, mqa ? 8 : 4, mqa ? 16 : 8};
    const size_t tc[3] = {64, 128, 256}, tg[3] = {256, 512, 1024};
    o->npoints = 0;
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 3; j++) {
            o->B[o->npoints] = b4[i];
            o->T[o->npoints] = o->gpu ? tg[j] : tc[j];
            o->npoints++;
        }
    return 0;
}

/* --layers, or every kind */
static int resolve_layers(runner_options *o)
{
    for (int k = 0; k < LAYER_KIND_COUNT; k++)
        o->want[k] = !o->layers;
    if (!o->layers)
        return 0;
    char buf[256];
    snprintf(buf, sizeof buf, "%s", o->layers);
    for (char *t = strtok(buf, ","); t; t = strtok(NULL, ",")) {
        int k;
        for (k = 0; k < LAYER_KIND_COUNT; k++)
            if (!strcmp(t, layer_kind_name((layer_kind)k)))
                break;
        if (k == LAYER_KIND_COUNT) {
            fprintf(stderr, "memledger-calibrate: error: --layers: unknown kind '%s' "
                            "(linear, mlp, transformer_block, lm_head, llama_block)\n", t);
            return 2;
        }
        o->want[k] = true;
    }
    return 0;
}

int runner_resolve_options(runner_options *o)
{
    o->gpu = !strcmp(o->backend, "cuda");
    o->bf16 = !strcmp(o->dtype, "bf16");
    if (!o->D)
        o->D = o->gpu ? 1024 : 256;
    if (!o->H)
        o->H = o->gpu ? 16 : 4;
    if (!o->V)
        o->V = o->gpu ? 32000 : 4096;
    /* GQA by default for the Llama-style block, two key/value heads at
     * least (one is multi-query: resolve_points) */
    if (!o->KVH)
        o->KVH = o->H >= 8 ? o->H / 4 : o->H >= 2 ? o->H / 2 : o->H;
    if (o->D % o->H || o->H % o->KVH) {
        fprintf(stderr, "memledger-calibrate: error: --heads must divide --hidden and "
                        "--kv-heads divide --heads\n");
        return 2;
    }
    int rc = resolve_points(o);
    return rc ? rc : resolve_layers(o);
}
