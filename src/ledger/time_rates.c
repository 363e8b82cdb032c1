/* The GPU's and the host's rates the per-op step time prices each work
 * item at (docs/time.md, "The GPU's time per item", "The host"): a
 * datasheet's figures, derated, or a profile's measured ones. */
#include <math.h>
#include <string.h>

#include "ledger/steptime.h"
#include "ledger/time_rates.h"
#include "memledger/calib.h"

/* The constants of a datasheet estimate, each with its source in
 * docs/time.md ("The GPU's time per item", "The host"). The host's costs
 * are those fitted on the H200 campaign's 60 runs (calib/h200_time.py
 * --fit); a profile's host section replaces them. */
#define GEMM_SHARE 0.80        /* large GEMMs: their share of the dense peak */
#define GEMM_LATENCY_S 3e-6    /* a GEMM's time beyond its FLOPs */
#define ATTN_FWD_SHARE 0.50    /* fused attention, of the GEMM rate: forward */
#define ATTN_BWD_SHARE 0.40    /* and backward */
#define KERNEL_FLOOR_S 2.5e-6  /* the least time any kernel takes */
static const ml_profile_host default_host = {
    33.05e-6,  /* per kernel launched in forward */
    0.01e-6,   /* per kernel of a backward node */
    1100e-6,   /* per block's forward, besides its kernels */
    250e-6,    /* per block's backward */
    479.16e-6, /* per recomputed (checkpointed) block */
    72.73e-6,  /* optimizer: per foreach call */
    2e-6,      /* per tensor in a call */
};

/* The share of the datasheet's memory bandwidth each kernel class achieves
 * (docs/time.md, "The GPU's time per item"), by mlg_op_kind. */
static const double class_share[MLG_OP_KINDS] = {
    [MLG_OP_MATMUL] = 0.90,      [MLG_OP_ELEMENTWISE] = 0.85, [MLG_OP_NORM] = 0.70,
    [MLG_OP_SOFTMAX] = 0.70,     [MLG_OP_DROPOUT] = 0.60,     [MLG_OP_ATTENTION] = 0.80,
    [MLG_OP_COPY] = 0.85,        [MLG_OP_VIEW] = 1.0,
};

/* Tile of a GEMM's output each SM computes at once (docs/time.md,
 * "The GPU's time per item") */
#define TILE 128.0

/* Products with fewer tiles than SMs split their k (cuBLAS's split-K)
 * into as many parts as fill the SMs, each at least SPLIT_K deep */
#define SPLIT_K 256.0

/* The fraction of the SMs a product of (m x n) tiles, batch of them, over
 * k keeps busy over its waves. */
static double wave_share(double m, double n, double k, double batch, double sms)
{
    if (sms <= 0)
        return 1.0;
    double tiles = ceil(m / TILE) * ceil(n / TILE) * batch;
    if (tiles < sms)
        tiles *= fmax(1.0, fmin(floor(sms / tiles), ceil(k / SPLIT_K)));
    const double waves = ceil(tiles / sms);
    return waves > 0 ? tiles / (waves * sms) : 1.0;
}

/* R and t0 from a profile's GEMMs: R its best rate; t0 the median of what
 * each measured product took beyond flops / (R x wave share), at least 0 */
static void profile_gemm(const ml_profile *p, double sms, ml_time_rates *tr)
{
    const size_t n = ml_profile_gemm_count(p);
    double over[16];
    size_t k = 0;
    tr->gemm_flops = ml_profile_achieved_tflops(p) * 1e12;
    for (size_t i = 0; i < n && k < 16; i++) {
        const ml_profile_gemm *g = ml_profile_gemm_at(p, i);
        if (!(g->tflops > 0))
            continue;
        const double f = 2.0 * (double)g->m * (double)g->n * (double)g->k;
        const double share = wave_share((double)g->m, (double)g->n, (double)g->k, 1, sms);
        const double model = f / (tr->gemm_flops * share);
        over[k++] = fmax(0, f / (g->tflops * 1e12) - model);
    }
    for (size_t i = 1; i < k; i++) /* insertion sort: a handful */
        for (size_t j = i; j > 0 && over[j - 1] > over[j]; j--) {
            double t = over[j];
            over[j] = over[j - 1];
            over[j - 1] = t;
        }
    tr->gemm_latency_s = k ? (k % 2 ? over[k / 2] : 0.5 * (over[k / 2 - 1] + over[k / 2])) : 0;
}

/* The rates of cfg's device; false when it has no memory bandwidth or no
 * peak at the plan's compute dtype (the step is then not timed). */
bool ml__time_rates(const ml_config *cfg, ml_time_rates *tr)
{
    const ml_device *dv = &cfg->device;
    memset(tr, 0, sizeof *tr);
    const ml_device_preset *pr = dv->preset;
    const ml_profile *p = cfg->calib;
    /* a profile measured on the plan's device at its dtype: its GEMMs and,
     * when it measured one, its memory bandwidth */
    const bool measured =
        p && ml_profile_achieved_tflops(p) > 0 && !ml_profile_time_mismatch(p, cfg);
    const double bw = measured && ml_profile_memory_gbps(p) > 0 ? ml_profile_memory_gbps(p) * 1e9
                      : pr                                      ? pr->memory_gbps * 1e9
                                                                : 0;
    const double peak = ml_device_peak(dv, cfg->training.precision) * 1e12;
    if (!(bw > 0) || !(peak > 0 || measured))
        return false;
    tr->sms = pr ? pr->sms : 0;
    tr->peak_flops = peak;
    for (int c = 0; c < MLG_OP_KINDS; c++)
        tr->bw[c] = bw * class_share[c];
    tr->kernel_floor_s = KERNEL_FLOOR_S;
    tr->source = ML_TIME_DATASHEET;
    tr->gemm_flops = peak * GEMM_SHARE * dv->efficiency;
    tr->gemm_latency_s = GEMM_LATENCY_S;
    if (measured) {
        profile_gemm(p, tr->sms, tr);
        tr->source = ML_TIME_CALIBRATED;
        /* measured on a CPU: the host runs the kernels itself, one after
         * the other (no queue, no kernel floor) */
        if (!strcmp(ml_profile_get(p, "backend"), "cpu")) {
            tr->serial = true;
            tr->kernel_floor_s = 0;
        }
    }
    tr->attn_fwd_flops = tr->gemm_flops * ATTN_FWD_SHARE;
    tr->attn_bwd_flops = tr->gemm_flops * ATTN_BWD_SHARE;
    /* a profile's host section, measured or fitted, wherever it was made
     * (the host is not the device: no dtype or device check) */
    const ml_profile_host *h = p ? ml_profile_host_costs(p) : NULL;
    tr->host = h ? *h : default_host;
    return true;
}

/* One item's GPU time, and whether it is a product (or fused attention). */
double ml__time_item(const ml_time_rates *tr, const ml_work_item *it, bool *compute)
{
    const double floor_s = tr->kernel_floor_s * (it->kernels ? it->kernels : 1);
    double t;
    *compute = it->kind == MLG_OP_MATMUL || it->kind == MLG_OP_ATTENTION;
    if (it->kind == MLG_OP_MATMUL && it->m > 0) {
        const double share = wave_share(it->m, it->n, it->k, it->batch, tr->sms);
        t = fmax(it->flops / (tr->gemm_flops * share), it->bytes / tr->bw[MLG_OP_MATMUL]) +
            tr->gemm_latency_s;
    } else if (it->kind == MLG_OP_ATTENTION) {
        /* under a causal mask the kernel skips the tiles above the diagonal,
         * about half (FlashAttention-2, section 3.1.1) */
        const double rate = it->bwd ? tr->attn_bwd_flops : tr->attn_fwd_flops;
        const double f = it->causal ? 0.5 * it->flops : it->flops;
        t = fmax(f / rate, it->bytes / tr->bw[MLG_OP_ATTENTION]);
    } else {
        t = it->bytes / tr->bw[it->kind < MLG_OP_KINDS ? it->kind : MLG_OP_ELEMENTWISE];
        *compute = false;
    }
    return fmax(t, floor_s);
}

bool ml__step_time_per_op(const ml_config *cfg)
{
    ml_time_rates tr;
    return ml__time_rates(cfg, &tr);
}
