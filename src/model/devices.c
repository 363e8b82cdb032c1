/* Device presets: one table of accelerators with their capacity and dense
 * peaks per compute dtype. Every figure and its source is in
 * docs/devices.md; tests/unit/test_devices.c restates them independently. */
#include <ctype.h>
#include <stdio.h>
#include <string.h>

#include "memledger/model.h"
#include "util/error.h"

#define MIB(n) ((uint64_t)(n) << 20)
#define GIB(n) ((uint64_t)(n) << 30)
#define CUDA_WS ML_BLAS_WORKSPACE_CUDA

/* Peaks in TFLOP/s, dense: the datasheets print most tensor figures with
 * 2:4 sparsity (marked *) and the dense figure is half of it. Order: fp32,
 * tf32, bf16, fp16, fp8. fp32 is the non-tensor FP32 peak (NVIDIA) or the
 * FP32 matrix peak (AMD, whose BLAS runs fp32 GEMMs on the matrix cores).
 * Then the DRAM bandwidth (GB/s), the SMs, and the links each way (GB/s):
 * within a node (NVLink, or PCIe where the devices have no fabric), between
 * nodes per device (a DGX's adapters; 0 elsewhere). Last, the cuBLAS
 * workspace PyTorch gives each handle (CublasHandlePool.cpp,
 * parseChosenWorkspaceSize): CUDA's default (CUDA_WS) but 32 MiB on Hopper
 * (sm90), and on ROCm 128 MiB for gfx94x, the MI300X. */
static const ml_device_preset presets[] = {
    {"h100-sxm", "h100 h100-sxm5 h100-80gb", "NVIDIA H100 80GB HBM3", MIB(81559),
     {67, 494.5, 989.5, 989.5, 1979}, 3350, 132, 450, 50, MIB(32)},
    {"h100-pcie", "", "NVIDIA H100 PCIe", GIB(80), {51, 378, 756.5, 756.5, 1513}, 2000, 114, 64, 0,
     MIB(32)},
    {"h200", "h200-sxm h200-141gb", "NVIDIA H200", MIB(143771),
     {67, 494.5, 989.5, 989.5, 1979}, 4800, 132, 450, 50, MIB(32)},
    {"a100-40gb", "a100-sxm4-40gb", "NVIDIA A100-SXM4-40GB", MIB(40960),
     {19.5, 156, 312, 312, 0}, 1555, 108, 300, 25, CUDA_WS},
    {"a100-80gb", "a100-sxm4-80gb", "NVIDIA A100-SXM4-80GB", MIB(81920),
     {19.5, 156, 312, 312, 0}, 2039, 108, 300, 25, CUDA_WS},
    {"l4", "", "NVIDIA L4", MIB(23034), {30.3, 60, 121, 121, 242.5}, 300, 58, 32, 0, CUDA_WS},
    {"l40s", "", "NVIDIA L40S", MIB(46068), {91.6, 183, 362.05, 362.05, 733}, 864, 142, 32, 0, CUDA_WS},
    {"a10", "", "NVIDIA A10", MIB(23028), {31.2, 62.5, 125, 125, 0}, 600, 72, 32, 0, CUDA_WS},
    /* AWS's A10G: no vendor publishes its per-dtype peaks (docs/devices.md) */
    {"a10g", "", "NVIDIA A10G", MIB(23028), {0, 0, 0, 0, 0}, 600, 80, 0, 0, CUDA_WS},
    {"t4", "tesla-t4", "Tesla T4", MIB(15360), {8.1, 0, 0, 65, 0}, 320, 40, 16, 0, CUDA_WS},
    {"v100-16gb", "v100 v100-sxm2-16gb", "Tesla V100-SXM2-16GB", GIB(16),
     {15.7, 0, 0, 125, 0}, 900, 80, 150, 0, CUDA_WS},
    {"v100-32gb", "v100-sxm2-32gb", "Tesla V100-SXM2-32GB", GIB(32),
     {15.7, 0, 0, 125, 0}, 900, 80, 150, 0, CUDA_WS},
    {"rtx4090", "4090 geforce-rtx-4090", "NVIDIA GeForce RTX 4090", GIB(24),
     {82.6, 82.6, 165.2, 165.2, 330.3}, 1008, 128, 32, 0, CUDA_WS},
    {"rtx3090", "3090 geforce-rtx-3090", "NVIDIA GeForce RTX 3090", GIB(24),
     {35.6, 35.6, 71, 71, 0}, 936, 82, 32, 0, CUDA_WS},
    /* consumer cards: the whitepaper's table where NVIDIA printed one (3070,
     * 4080), else the product page's cores and boost clock times the
     * architecture's rates per SM and clock (docs/devices.md, "Consumer
     * cards") */
    {"rtx4080", "geforce-rtx-4080 rtx4080-16gb", "NVIDIA GeForce RTX 4080", GIB(16),
     {48.7, 48.7, 97.5, 97.5, 194.9}, 716.8, 76, 32, 0, CUDA_WS},
    {"rtx4070", "geforce-rtx-4070", "NVIDIA GeForce RTX 4070", GIB(12),
     {29.15, 29.15, 58.29, 58.29, 116.58}, 504, 46, 32, 0, CUDA_WS},
    {"rtx4060ti-16gb", "geforce-rtx-4060-ti-16gb", "NVIDIA GeForce RTX 4060 Ti", GIB(16),
     {22.06, 22.06, 44.13, 44.13, 88.26}, 288, 34, 16, 0, CUDA_WS},
    {"rtx4060", "geforce-rtx-4060", "NVIDIA GeForce RTX 4060", GIB(8),
     {15.11, 15.11, 30.23, 30.23, 60.46}, 272, 24, 16, 0, CUDA_WS},
    {"rtx3070", "geforce-rtx-3070", "NVIDIA GeForce RTX 3070", GIB(8),
     {20.3, 20.3, 40.6, 40.6, 0}, 448, 46, 32, 0, CUDA_WS},
    {"rtx3060", "geforce-rtx-3060 rtx3060-12gb", "NVIDIA GeForce RTX 3060", GIB(12),
     {12.74, 12.74, 25.48, 25.48, 0}, 360, 28, 32, 0, CUDA_WS},
    {"mi300x", "instinct-mi300x", "AMD Instinct MI300X", GIB(192),
     {163.4, 653.7, 1307.4, 1307.4, 2614.9}, 5300, 304, 448, 0, MIB(128)},
};

const ml_device_preset *ml_device_presets(size_t *count)
{
    *count = sizeof presets / sizeof presets[0];
    return presets;
}

/* Lower case without '-', '_', ' ' and '.', at most size-1 characters;
 * false when the name does not fit. */
static bool squeeze(const char *s, size_t n, char *out, size_t size)
{
    size_t k = 0;
    for (size_t i = 0; i < n && s[i]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '-' || c == '_' || c == ' ' || c == '.')
            continue;
        if (k + 1 >= size)
            return false;
        out[k++] = (char)tolower(c);
    }
    out[k] = 0;
    return true;
}

/* Whether the squeezed `key` equals the name, the product name (as
 * nvidia-smi and torch.cuda.get_device_name() print it) or one of the
 * aliases. */
static bool matches(const ml_device_preset *p, const char *key)
{
    char buf[64];
    if (squeeze(p->name, strlen(p->name), buf, sizeof buf) && !strcmp(buf, key))
        return true;
    /* (not a product name sold with two memory sizes, which nvidia-smi
     * prints alike: the RTX 4060 Ti's 8 and 16 GB, the RTX 3060's 8 and
     * 12 GB; the preset's name or an alias says which) */
    static const char *const two_sizes[] = {"nvidiageforcertx4060ti", "nvidiageforcertx3060"};
    if (p->product && squeeze(p->product, strlen(p->product), buf, sizeof buf) &&
        !strcmp(buf, key)) {
        for (size_t i = 0; i < sizeof two_sizes / sizeof two_sizes[0]; i++)
            if (!strcmp(buf, two_sizes[i]))
                return false;
        return true;
    }
    for (const char *a = p->aliases; *a;) {
        size_t n = strcspn(a, " ");
        if (n && squeeze(a, n, buf, sizeof buf) && !strcmp(buf, key))
            return true;
        a += n;
        a += strspn(a, " ");
    }
    return false;
}

const ml_device_preset *ml_device_preset_find(const char *name)
{
    char key[64];
    if (!name || !squeeze(name, strlen(name), key, sizeof key) || !key[0])
        return NULL;
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        if (matches(&presets[i], key))
            return &presets[i];
    return NULL;
}

ml_status ml_device_preset_apply(const char *name, ml_device *d, ml_error *err)
{
    const ml_device_preset *p = ml_device_preset_find(name);
    if (!p) {
        char known[256];
        size_t k = 0;
        for (size_t i = 0; i < sizeof presets / sizeof presets[0] && k < sizeof known; i++)
            k += (size_t)snprintf(known + k, sizeof known - k, "%s%s", i ? ", " : "",
                                  presets[i].name);
        return ml__errorf(err, ML_USAGE,
                          "unknown device '%.40s'; the known names: %s", name ? name : "",
                          known);
    }
    ml_device_of_size(d, p->memory);
    d->blas_workspace = p->blas_workspace;
    d->preset = p;
    return ML_OK;
}

void ml_device_of_size(ml_device *d, uint64_t memory)
{
    d->present = true;
    d->memory = memory;
    d->budget = 0;
    d->peak_tflops = 0;
    d->blas_workspace = ML_BLAS_WORKSPACE_CUDA;
    d->preset = NULL;
}

ml_compute_dtype ml_precision_compute_dtype(ml_precision p)
{
    switch (p) {
    case ML_PREC_AMP_BF16:
    case ML_PREC_BF16_MASTER:
    case ML_PREC_BF16:
        return ML_COMPUTE_BF16;
    case ML_PREC_AMP_FP16:
    case ML_PREC_FP16_MASTER:
        return ML_COMPUTE_FP16;
    default:
        return ML_COMPUTE_FP32;
    }
}

const char *ml_compute_dtype_name(ml_compute_dtype c)
{
    static const char *const names[ML_COMPUTE_COUNT] = {"fp32", "tf32", "bf16", "fp16", "fp8"};
    return (unsigned)c < ML_COMPUTE_COUNT ? names[c] : "?";
}

double ml_device_interconnect(const ml_device *d)
{
    if (d->interconnect_gbps > 0)
        return d->interconnect_gbps;
    return d->preset ? d->preset->interconnect_gbps : 0;
}

double ml_device_network(const ml_device *d)
{
    return d->preset ? d->preset->network_gbps : 0;
}

double ml_device_dp_link(const ml_device *d, uint64_t devices)
{
    if (d->interconnect_gbps > 0)
        return d->interconnect_gbps;
    return devices <= 8 ? ml_device_interconnect(d) : ml_device_network(d);
}

double ml_device_peak(const ml_device *d, ml_precision p)
{
    if (d->peak_tflops > 0)
        return d->peak_tflops;
    if (d->preset)
        return d->preset->peak_tflops[ml_precision_compute_dtype(p)];
    return 0;
}
