/* Device presets: every row's memory and dense peaks against the figures
 * written here again from the sources docs/devices.md cites (datasheet
 * tensor figures marked "with sparsity" are halved by hand), the lookup by
 * name and alias, the compute dtype of each precision, and the peak a plan
 * gets. */
#include "harness.h"

#define MIB(n) ((uint64_t)(n) * 1048576ull)
#define GIB(n) ((uint64_t)(n) * 1073741824ull)

typedef struct expect {
    const char *name;
    uint64_t memory;
    double fp32, tf32, bf16, fp16, fp8;
} expect;

/* sparse/2 written as the datasheet's sparse figure over 2 */
static const expect rows[] = {
    /* H100 datasheet, SXM: FP32 67; TF32 989*; BF16, FP16 1,979*; FP8 3,958*.
     * nvidia-smi: 81,559 MiB */
    {"h100-sxm", MIB(81559), 67, 989 / 2.0, 1979 / 2.0, 1979 / 2.0, 3958 / 2.0},
    /* H100 datasheet, PCIe: FP32 51; TF32 756*; BF16, FP16 1,513*; FP8 3,026*;
     * 80 GB, nominal */
    {"h100-pcie", GIB(80), 51, 756 / 2.0, 1513 / 2.0, 1513 / 2.0, 3026 / 2.0},
    /* H200 datasheet: as H100 SXM; nvidia-smi 143,771 MiB (calib/results log) */
    {"h200", MIB(143771), 67, 989 / 2.0, 1979 / 2.0, 1979 / 2.0, 3958 / 2.0},
    /* A100 datasheet: FP32 19.5; TF32 156; BF16, FP16 312; no FP8 */
    {"a100-40gb", MIB(40960), 19.5, 156, 312, 312, 0},
    {"a100-80gb", MIB(81920), 19.5, 156, 312, 312, 0},
    /* L4 datasheet: FP32 30.3; TF32 120*; BF16, FP16 242*; FP8 485* */
    {"l4", MIB(23034), 30.3, 120 / 2.0, 242 / 2.0, 242 / 2.0, 485 / 2.0},
    /* L40S datasheet: FP32 91.6; TF32 183; BF16, FP16 362.05; FP8 733 */
    {"l40s", MIB(46068), 91.6, 183, 362.05, 362.05, 733},
    /* A10 datasheet: FP32 31.2; TF32 62.5; BF16, FP16 125 */
    {"a10", MIB(23028), 31.2, 62.5, 125, 125, 0},
    /* A10G: no published per-dtype figures */
    {"a10g", MIB(23028), 0, 0, 0, 0, 0},
    /* T4 datasheet: single precision 8.1; mixed precision (FP16/FP32) 65 */
    {"t4", MIB(15360), 8.1, 0, 0, 65, 0},
    /* V100 datasheet, SXM2: single precision 15.7; tensor performance 125 */
    {"v100-16gb", GIB(16), 15.7, 0, 0, 125, 0},
    {"v100-32gb", GIB(32), 15.7, 0, 0, 125, 0},
    /* Ada whitepaper, RTX 4090 (FP32 accumulate): FP32 82.6; TF32 82.6;
     * BF16, FP16 165.2; FP8 330.3 */
    {"rtx4090", GIB(24), 82.6, 82.6, 165.2, 165.2, 330.3},
    /* Ampere GA102 whitepaper, RTX 3090 (FP32 accumulate): FP32 35.6;
     * TF32 35.6; BF16, FP16 71 */
    {"rtx3090", GIB(24), 35.6, 35.6, 71, 71, 0},
    /* Ada whitepaper (v2.1), RTX 4080 (FP32 accumulate): FP32 48.7;
     * TF32 48.7; BF16, FP16 97.5; FP8 194.9 */
    {"rtx4080", GIB(16), 48.7, 48.7, 97.5, 97.5, 194.9},
    /* No whitepaper table: the product page's CUDA cores n, SMs s = n / 128
     * and boost clock f (GHz), with Ada's rates from the RTX 4090's table
     * (FP32: 2 per core per clock; BF16/FP16 with FP32 accumulate
     * 165.2 / (128 SMs x 2.52 GHz) = 512 per SM per clock, TF32 half of it,
     * FP8 twice), rounded to 0.01:
     * RTX 4070: n 5,888, s 46, f 2.475: FP32 5,888 x 2 x 2.475 = 29.15 (and
     * TF32), BF16/FP16 46 x 2.475 x 512 = 58.29, FP8 116.58 */
    {"rtx4070", GIB(12), 29.15, 29.15, 58.29, 58.29, 116.58},
    /* RTX 4060 Ti 16 GB: n 4,352, s 34, f 2.535 */
    {"rtx4060ti-16gb", GIB(16), 22.06, 22.06, 44.13, 44.13, 88.26},
    /* RTX 4060: n 3,072, s 24, f 2.46 */
    {"rtx4060", GIB(8), 15.11, 15.11, 30.23, 30.23, 60.46},
    /* Ampere GA102 whitepaper, RTX 3070 (FP32 accumulate): FP32 20.3;
     * TF32 20.3; BF16, FP16 40.6; no FP8 */
    {"rtx3070", GIB(8), 20.3, 20.3, 40.6, 40.6, 0},
    /* RTX 3060 (GA106, no whitepaper table): n 3,584, s 28 (128 per SM),
     * f 1.777, with GA102's rates from the RTX 3090's table (71 / (82 SMs x
     * 1.695 GHz) = 512 per SM per clock; TF32 half of it): 12.74, 25.48 */
    {"rtx3060", GIB(12), 12.74, 12.74, 25.48, 25.48, 0},
    /* MI300X datasheet: FP32 matrix 163.4; TF32 653.7; BF16, FP16 1,307.4;
     * FP8 2,614.9 */
    {"mi300x", GIB(192), 163.4, 653.7, 1307.4, 1307.4, 2614.9},
};

static void test_rows(void **state)
{
    (void)state;
    size_t n = 0;
    const ml_device_preset *t = ml_device_presets(&n);
    assert_int_equal(n, sizeof rows / sizeof rows[0]);
    for (size_t i = 0; i < n; i++) {
        const expect *e = &rows[i];
        assert_string_equal(t[i].name, e->name);
        assert_true(ml_device_preset_find(e->name) == &t[i]);
        assert_int_equal(t[i].memory, e->memory);
        const double want[ML_COMPUTE_COUNT] = {e->fp32, e->tf32, e->bf16, e->fp16, e->fp8};
        for (unsigned c = 0; c < ML_COMPUTE_COUNT; c++) {
            if (want[c] == 0)
                assert_true(t[i].peak_tflops[c] == 0);
            else
                assert_rel_close(t[i].peak_tflops[c], want[c], 1e-12);
        }
        assert_non_null(t[i].product);
        assert_true(t[i].product[0] != 0);
    }
}

/* Memory bandwidth (GB/s) and SMs, from docs/devices.md's sources: the
 * datasheets' bandwidths, or memory speed x bus width / 8 (Gbps x bits)
 * where a product page gives those; SMs as CUDA cores / cores per SM (128
 * on Ampere GeForce and Ada, 64 on Turing and Volta) where no count is
 * printed */
static void test_bandwidths(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        double gbps;
        unsigned sms;
    } bw[] = {
        {"h100-sxm", 3350, 132},   {"h100-pcie", 2000, 114},   {"h200", 4800, 132},
        {"a100-40gb", 1555, 108},  {"a100-80gb", 2039, 108},   {"l4", 300, 7424 / 128},
        {"l40s", 864, 18176 / 128}, {"a10", 600, 72},          {"a10g", 600, 10240 / 128},
        {"t4", 320, 2560 / 64},    {"v100-16gb", 900, 5120 / 64}, {"v100-32gb", 900, 5120 / 64},
        {"rtx4090", 1008, 16384 / 128}, {"rtx3090", 936, 10496 / 128},
        {"rtx4080", 22.4 * 256 / 8, 76}, {"rtx4070", 21.0 * 192 / 8, 5888 / 128},
        {"rtx4060ti-16gb", 18.0 * 128 / 8, 4352 / 128}, {"rtx4060", 17.0 * 128 / 8, 3072 / 128},
        {"rtx3070", 14.0 * 256 / 8, 5888 / 128}, {"rtx3060", 15.0 * 192 / 8, 3584 / 128},
        {"mi300x", 5300, 8 * 38},
    };
    size_t n = 0;
    ml_device_presets(&n);
    assert_int_equal(n, sizeof bw / sizeof bw[0]);
    for (size_t i = 0; i < n; i++) {
        const ml_device_preset *p = ml_device_preset_find(bw[i].name);
        assert_non_null(p);
        assert_rel_close(p->memory_gbps, bw[i].gbps, 1e-12);
        assert_int_equal(p->sms, bw[i].sms);
    }
}

/* The links each way (GB/s), from docs/devices.md's sources: NVLink's
 * total over two directions halved (H100/H200 SXM 900, A100 SXM4 600, V100
 * SXM2 300), MI300X's seven Infinity Fabric links of 128 GB/s halved, else
 * the PCIe link (Gen5 x16 128 GB/s, Gen4 x16 64, Gen4 x8 32, Gen3 x16 32,
 * both directions) halved; between nodes a DGX's adapters per GPU (one
 * 400 Gb/s ConnectX-7 a GPU on DGX H100/H200, one 200 Gb/s HDR ConnectX-6
 * on DGX A100) over 8 bits. */
static void test_links(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        double intra, net;
    } l[] = {
        {"h100-sxm", 900 / 2, 400 / 8.0}, {"h100-pcie", 128 / 2, 0}, {"h200", 900 / 2, 400 / 8.0},
        {"a100-40gb", 600 / 2, 200 / 8.0}, {"a100-80gb", 600 / 2, 200 / 8.0}, {"l4", 64 / 2, 0},
        {"l40s", 64 / 2, 0}, {"a10", 64 / 2, 0}, {"a10g", 0, 0}, {"t4", 32 / 2, 0},
        {"v100-16gb", 300 / 2, 0}, {"v100-32gb", 300 / 2, 0}, {"rtx4090", 64 / 2, 0},
        {"rtx3090", 64 / 2, 0}, {"rtx4080", 64 / 2, 0}, {"rtx4070", 64 / 2, 0},
        {"rtx4060ti-16gb", 32 / 2, 0}, {"rtx4060", 32 / 2, 0}, {"rtx3070", 64 / 2, 0},
        {"rtx3060", 64 / 2, 0}, {"mi300x", 7 * 128 / 2, 0},
    };
    size_t n = 0;
    ml_device_presets(&n);
    assert_int_equal(n, sizeof l / sizeof l[0]);
    for (size_t i = 0; i < n; i++) {
        ml_device d;
        memset(&d, 0, sizeof d);
        assert_int_equal(ml_device_preset_apply(l[i].name, &d, NULL), ML_OK);
        assert_rel_close(ml_device_interconnect(&d), l[i].intra, 1e-12);
        assert_rel_close(ml_device_network(&d), l[i].net, 1e-12);
        /* --interconnect overrides the preset's */
        d.interconnect_gbps = 7;
        assert_rel_close(ml_device_interconnect(&d), 7, 0);
    }
}

/* cuBLAS's workspace a handle (docs/devices.md): 4,096 KiB x 8 on Hopper
 * (sm90), 128 MiB for ROCm's gfx94x, else 2 x 4,096 KiB + 8 x 16 KiB; a
 * device given by its size alone takes the last, whatever it replaces. */
static void test_blas_workspace(void **state)
{
    (void)state;
    const uint64_t hopper = 4096 * 8 * 1024, gfx94 = 128ull << 20,
                   cuda = 4096 * 1024 * 2 + 16 * 1024 * 8;
    size_t n = 0;
    const ml_device_preset *t = ml_device_presets(&n);
    for (size_t i = 0; i < n; i++) {
        const char *name = t[i].name;
        uint64_t want = !strcmp(name, "mi300x") ? gfx94
                        : (!strcmp(name, "h100-sxm") || !strcmp(name, "h100-pcie") ||
                           !strcmp(name, "h200"))
                            ? hopper
                            : cuda;
        ml_device d;
        memset(&d, 0, sizeof d);
        assert_int_equal(ml_device_preset_apply(name, &d, NULL), ML_OK);
        assert_int_equal(d.blas_workspace, want);
        ml_device_of_size(&d, 8ull << 30);
        assert_int_equal(d.blas_workspace, cuda);
        assert_null(d.preset);
        assert_int_equal(d.memory, 8ull << 30);
    }
    assert_int_equal(ml_config_defaults().device.blas_workspace, cuda);
}

static void test_names(void **state)
{
    (void)state;
    const ml_device_preset *h = ml_device_preset_find("h100-sxm");
    assert_non_null(h);
    assert_true(ml_device_preset_find("H100 SXM") == h);
    assert_true(ml_device_preset_find("h100_sxm5") == h);
    assert_true(ml_device_preset_find("H100") == h);
    assert_true(ml_device_preset_find("RTX 4090") == ml_device_preset_find("rtx4090"));
    assert_true(ml_device_preset_find("V100") == ml_device_preset_find("v100-16gb"));
    /* the 4060 Ti comes with 8 or 16 GB: the name says which */
    assert_true(ml_device_preset_find("RTX 4060 Ti 16GB") ==
                ml_device_preset_find("rtx4060ti-16gb"));
    assert_null(ml_device_preset_find("rtx4060ti"));
    /* the product name nvidia-smi prints names its preset, unless the
     * product comes in two memory sizes the name does not say */
    assert_true(ml_device_preset_find("NVIDIA L4") == ml_device_preset_find("l4"));
    assert_true(ml_device_preset_find("Tesla V100-SXM2-32GB") ==
                ml_device_preset_find("v100-32gb"));
    assert_null(ml_device_preset_find("NVIDIA GeForce RTX 4060 Ti"));
    assert_null(ml_device_preset_find("NVIDIA GeForce RTX 3060")); /* 8 or 12 GB */
    assert_true(ml_device_preset_find("rtx3060") != NULL);
    assert_true(ml_device_preset_find("GeForce RTX 3060") == ml_device_preset_find("rtx3060"));
    assert_null(ml_device_preset_find("a100"));
    assert_null(ml_device_preset_find(""));
    assert_null(ml_device_preset_find("--"));
    assert_null(ml_device_preset_find(NULL));
    assert_null(ml_device_preset_find("h100-sxm-h100-sxm-h100-sxm-h100-sxm-h100-sxm-h100-sxm-h100"));
}

static void test_apply(void **state)
{
    (void)state;
    ml_config c = ml_config_defaults();
    c.device.budget = 5;
    c.device.peak_tflops = 82.6;
    c.device.runtime_reserve = 1ull << 30;
    ml_error e;
    memset(&e, 0, sizeof e);
    assert_int_equal(ml_device_preset_apply("a100-40gb", &c.device, &e), ML_OK);
    assert_true(c.device.present);
    assert_int_equal(c.device.memory, MIB(40960));
    assert_int_equal(c.device.budget, 0);
    assert_int_equal(c.device.runtime_reserve, 1ull << 30);
    assert_true(c.device.peak_tflops == 0);
    ml_device before = c.device;
    assert_int_equal(ml_device_preset_apply("a100", &c.device, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "a100-40gb, a100-80gb"));
    assert_non_null(strstr(e.msg, "mi300x"));
    assert_memory_equal(&before, &c.device, sizeof before);
}

static void test_peak_by_precision(void **state)
{
    (void)state;
    assert_int_equal(ml_precision_compute_dtype(ML_PREC_FP32), ML_COMPUTE_FP32);
    assert_int_equal(ml_precision_compute_dtype(ML_PREC_AMP_BF16), ML_COMPUTE_BF16);
    assert_int_equal(ml_precision_compute_dtype(ML_PREC_BF16_MASTER), ML_COMPUTE_BF16);
    assert_int_equal(ml_precision_compute_dtype(ML_PREC_BF16), ML_COMPUTE_BF16);
    assert_int_equal(ml_precision_compute_dtype(ML_PREC_AMP_FP16), ML_COMPUTE_FP16);
    assert_int_equal(ml_precision_compute_dtype(ML_PREC_FP16_MASTER), ML_COMPUTE_FP16);
    assert_string_equal(ml_compute_dtype_name(ML_COMPUTE_TF32), "tf32");
    ml_device d = ml_config_defaults().device;
    assert_true(ml_device_peak(&d, ML_PREC_FP32) == 0); /* no device: no peak */
    ml_error e;
    assert_int_equal(ml_device_preset_apply("h200", &d, &e), ML_OK);
    assert_rel_close(ml_device_peak(&d, ML_PREC_FP32), 67, 1e-12);
    assert_rel_close(ml_device_peak(&d, ML_PREC_AMP_BF16), 989.5, 1e-12);
    d.peak_tflops = 500; /* the user's figure wins at every dtype */
    assert_rel_close(ml_device_peak(&d, ML_PREC_AMP_BF16), 500, 1e-12);
    assert_int_equal(ml_device_preset_apply("t4", &d, &e), ML_OK);
    assert_true(ml_device_peak(&d, ML_PREC_AMP_BF16) == 0); /* Turing: no bf16 */
}

/* The FLOPs alone of a plan on a named device (time.flops_s, the lower
 * bound beside the per-op model's step time) is FLOPs / the preset's peak
 * at the plan's compute dtype. */
static void test_step_time(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = ml_model_config(m);
    ml_error e;
    assert_int_equal(ml_device_preset_apply("l40s", &c.device, &e), ML_OK);
    c.training.precision = ML_PREC_AMP_BF16;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_rel_close(s->flops_total, 25.6e9, 1e-12);
    assert_rel_close(s->time.flops_s, 25.6e9 / 362.05e12, 1e-12);
    assert_true(s->step_time_s > s->time.flops_s); /* the per-op model's */
    assert_rel_close(s->peak_tflops_used, 362.05, 1e-12);
    ml_ledger_destroy(l);
    c.device = ml_config_defaults().device; /* no device: no step time */
    l = eval(m, &c, false);
    assert_true(ml_ledger_summary(l)->step_time_s < 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rows),
        cmocka_unit_test(test_bandwidths),      cmocka_unit_test(test_blas_workspace),
        cmocka_unit_test(test_links),           cmocka_unit_test(test_names),
        cmocka_unit_test(test_apply),          cmocka_unit_test(test_peak_by_precision),
        cmocka_unit_test(test_step_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
