/* The per-op step-time model (docs/time.md): every term of a two-layer
 * MLP's step derived by hand, the pipeline of host and GPU, and the
 * rates' sources. */
#include "harness.h"

#include <math.h>
#include <string.h>

#include "memledger/calib.h"

/* Linear 1024 -> 4096, GELU, linear 4096 -> 1024, MSE, at 8192 rows:
 * large products, so the time is the GPU's. */
static const char *const mlp_yaml =
    "model:\n  type: sequential\n  input: [1024]\n  layers:\n"
    "    - linear: {out: 4096, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 1024, bias: false}\n  loss: mse\n"
    "training:\n  micro_batch: 8192\n  optimizer: sgd\n";

/* h100-sxm, fp32: the datasheet's 67 TFLOP/s x 0.80 (steptime.c, GEMM_SHARE)
 * and 3350 GB/s, 132 SMs */
#define R (67e12 * 0.80)
#define BW 3350e9
#define T0 3e-6
#define FLOOR 2.5e-6

/* Every product of the MLP has F = 2 x 8192 x 1024 x 4096 FLOPs and
 * (m x n) tiles of 128 that fill its waves to 32/33: linear 1 (8192 x
 * 4096: 2048 tiles, 16 waves of 132 = 2112 slots), linear 2 (8192 x 1024:
 * 512 in 4 waves = 528), linear 2's input gradient (8192 x 4096: as
 * linear 1), both weight gradients (4096 x 1024 and 1024 x 4096: 256 in
 * 2 waves = 264). Each is compute-bound (its bytes, at most (8192 x 1024 +
 * 1024 x 4096 + 8192 x 4096) x 4 = 184,549,376, take 61 us at 0.90 of the
 * bandwidth, against 1.32 ms). */
static double product(void)
{
    const double F = 2.0 * 8192 * 1024 * 4096;
    return F / (R * 32.0 / 33.0) + T0;
}

/* the memory-bound ops at 0.85 of the bandwidth (elementwise) */
static double elementwise(double bytes)
{
    const double t = bytes / (BW * 0.85);
    return t > FLOOR ? t : FLOOR;
}

static void test_mlp_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = ml_model_config(m);
    assert_int_equal(ml_device_preset_apply("h100-sxm", &c.device, NULL), ML_OK);
    ml_profile *p = ml_profile_new();
    /* host: 10 us a forward kernel, 5 us a backward one, 20 us a foreach
     * call and 1 us a tensor in it; nothing per block */
    const ml_profile_host h = {10e-6, 5e-6, 0, 0, 0, 20e-6, 1e-6};
    ml_profile_set_host(p, &h);
    c.calib = p;
    ml_ledger *l = eval(m, &c, false);
    const ml_step_time *t = &ml_ledger_summary(l)->time;
    const double act = 8192.0 * 4096 * 4, in = 8192.0 * 1024 * 4; /* fp32 bytes */
    /* forward: linear 1, GELU (reads and writes act), linear 2, MSE (reads
     * the output and the target, writes a 4-byte loss) */
    const double fwd = product() + elementwise(2 * act) + product() + elementwise(2 * in + 4);
    /* backward, in autograd's order: MSE's (the loss's gradient, the saved
     * input and target read, the input's gradient written), linear 2's
     * input gradient and weight gradient, GELU's (the output's gradient
     * and the saved input read, the input's gradient written), linear 1's
     * weight gradient (its input is the batch: no gradient) */
    const double bwd = elementwise(4 + 3 * in) + 2 * product() + elementwise(3 * act) + product();
    /* SGD, foreach: one pass reading the weight and its gradient and
     * writing the weight (3 x 4 bytes an element), over 2 x 4M elements:
     * one launch (130 chunks of 65536 elements and tensors <= 320) */
    const double step = elementwise(3.0 * 2 * 1024 * 4096 * 4);
    assert_int_equal(t->source, ML_TIME_DATASHEET);
    assert_rel_close(t->gpu_s, fwd + bwd + step, 1e-12);
    assert_rel_close(t->kernels[ML_TPHASE_FORWARD], 4, 0);
    assert_rel_close(t->kernels[ML_TPHASE_BACKWARD], 5, 0);
    assert_rel_close(t->kernels[ML_TPHASE_STEP], 1, 0);
    assert_rel_close(t->host_s, 4 * 10e-6 + 5 * 5e-6 + 20e-6 + 2 * 1e-6, 1e-12);
    /* the host issues each kernel long before the GPU is free, but for
     * the first: the GPU waits 10 us, then runs without a gap */
    assert_rel_close(t->step_s, 10e-6 + fwd + bwd + step, 1e-12);
    assert_rel_close(t->by_phase[ML_TPHASE_FORWARD], 10e-6 + fwd, 1e-12);
    assert_rel_close(t->by_phase[ML_TPHASE_BACKWARD], bwd, 1e-12);
    assert_rel_close(t->by_phase[ML_TPHASE_STEP], step, 1e-12);
    assert_false(t->host_bound);
    /* 8192 samples of one token; MFU: forward and backward FLOPs (2 F, and
     * 4 F less linear 1's input gradient: 3 F) over the step at 67 TFLOP/s */
    const double F = 2.0 * 8192 * 1024 * 4096;
    assert_rel_close(t->tokens_per_s, 8192 / t->step_s, 1e-12);
    assert_rel_close(t->mfu, (2 * F + 3 * F) / t->step_s / 67e12, 1e-12);
    ml_ledger_destroy(l);
    ml_profile_destroy(p);
    ml_model_destroy(m);
}

/* Host-bound: at 8 rows the products are at the kernel floor's scale and
 * 1 ms of host time per forward block (the profile's) dominates: each
 * block's run starts when the host reaches its first kernel, so the step
 * is the host's time plus the GPU's tail after the last kernel issued. */
static void test_host_bound(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 8;
    assert_int_equal(ml_device_preset_apply("h100-sxm", &c.device, NULL), ML_OK);
    ml_profile *p = ml_profile_new();
    const ml_profile_host h = {10e-6, 5e-6, 1e-3, 0, 0, 20e-6, 1e-6};
    ml_profile_set_host(p, &h);
    c.calib = p;
    ml_ledger *l = eval(m, &c, false);
    const ml_step_time *t = &ml_ledger_summary(l)->time;
    /* 4 blocks (3 layers and the loss) of 1 ms, 4 + 5 kernels, the step */
    assert_rel_close(t->host_s, 4 * 1e-3 + 4 * 10e-6 + 5 * 5e-6 + 22e-6, 1e-12);
    assert_true(t->host_bound);
    assert_true(t->step_s >= t->host_s);
    assert_true(t->step_s < t->host_s + t->gpu_s);
    ml_ledger_destroy(l);
    ml_profile_destroy(p);
    ml_model_destroy(m);
}

/* One kernel of the pipeline as docs/time.md describes it: the host issues
 * it (after the block's own host time, lead), the GPU runs it once free. */
typedef struct {
    double host, gpu;
} clocks;

static void kernel(clocks *c, double lead, double h, double g)
{
    c->host += lead + h;
    c->gpu = (c->gpu > c->host ? c->gpu : c->host) + g;
}

/* A product at its wave share: tiles of 128 x 128, split over k (256 deep
 * parts) up to the SMs when fewer than the SMs (docs/time.md) */
static double product_at(double m, double n, double k)
{
    double tiles = ceil(m / 128) * ceil(n / 128);
    if (tiles < 132) {
        double split = floor(132 / tiles), kp = ceil(k / 256);
        tiles *= split < kp ? split : kp;
    }
    const double share = tiles / (ceil(tiles / 132) * 132);
    const double t = 2 * m * n * k / (R * share), b = (m * k + k * n + m * n) * 4 / (BW * 0.90);
    return (t > b ? t : b) + T0;
}

/* mlp2 (1000 -> 10000 -> 1000, 256 rows, fp32, Adam foreach) on h100-sxm
 * with the default host costs (steptime.c, default_host): host-bound, every block's
 * forward waiting on its 1,100 us of host time. The expected step is a
 * kernel-by-kernel walk of the pipeline, not the model's run summaries. */
static void test_mlp2_defaults(void **state)
{
    (void)state;
    ml_model *m = load_str("model:\n  type: sequential\n  input: [1000]\n  layers:\n"
                           "    - linear: {out: 10000, bias: false}\n    - gelu: {}\n"
                           "    - linear: {out: 1000, bias: false}\n  loss: mse\n"
                           "training:\n  micro_batch: 256\n  optimizer: adam\n");
    ml_config c = ml_model_config(m);
    assert_int_equal(ml_device_preset_apply("h100-sxm", &c.device, NULL), ML_OK);
    ml_ledger *l = eval(m, &c, false);
    const ml_step_time *t = &ml_ledger_summary(l)->time;
    const double fo = 33.05e-6, bo = 0.01e-6, fb = 1100e-6, bb = 250e-6, sc = 72.73e-6, st = 2e-6;
    const double act = 256.0 * 10000 * 4, io = 256.0 * 1000 * 4;
    clocks k = {0, 0};
    /* forward: linear 1, GELU, linear 2 (16 tiles: split 8 ways), MSE */
    kernel(&k, fb, fo, product_at(256, 10000, 1000));
    kernel(&k, fb, fo, elementwise(2 * act));
    kernel(&k, fb, fo, product_at(256, 1000, 10000));
    kernel(&k, fb, fo, elementwise(2 * io + 4));
    /* backward: MSE; linear 2's input and weight gradients; GELU; linear
     * 1's weight gradient */
    kernel(&k, bb, bo, elementwise(4 + 3 * io));
    kernel(&k, bb, bo, product_at(256, 10000, 1000));
    kernel(&k, 0, bo, product_at(10000, 1000, 256));
    kernel(&k, bb, bo, elementwise(3 * act));
    kernel(&k, bb, bo, product_at(1000, 10000, 256));
    const double before_step = k.gpu;
    /* Adam, foreach: 22 passes of 4 bytes over 20 M parameters in 8 ops of
     * one launch each (306 chunks + 2 tensors <= 320); its host time (8
     * calls, 16 tensors) before its GPU time */
    kernel(&k, 0, 8 * sc + 16 * st, elementwise(22.0 * 20e6 * 4));
    assert_rel_close(t->step_s, k.gpu, 1e-12);
    assert_rel_close(t->host_s, 4 * (fb + fo) + 4 * bb + 5 * bo + 8 * sc + 16 * st, 1e-12);
    assert_true(t->host_bound);
    ml_ledger_destroy(l);
    /* the timeline's clock is the model's, the step's run included: the
     * optimizer step's temporaries (Adam's, one parameter's size: 20 M x 4
     * B) are made at its start, when the GPU ends the last backward kernel,
     * and freed at its end, the Adam kernel's (k.gpu, the step time: no
     * communication), where the events after them (zero_grad, the loop's
     * output) fall too; the last event is at the step time */
    l = eval(m, &c, true);
    size_t n = ml_ledger_event_count(l), seen = 0, after = 0;
    const ml_event *ev = ml_ledger_events(l);
    for (size_t i = 0; i < n; i++)
        if (ev[i].phase == ML_PHASE_OPTIMIZER && ev[i].flops_before > 0) {
            if (ev[i].cat == ML_CAT_WORKSPACE && ev[i].delta == 80000000) {
                assert_rel_close(ev[i].t_s, before_step, 1e-12);
                seen++;
            } else {
                assert_true(seen == 1); /* after the temporaries are made */
                assert_rel_close(ev[i].t_s, k.gpu, 1e-12);
                after++;
            }
        }
    assert_int_equal(seen, 1);
    assert_true(after > 0);
    assert_rel_close(ev[n - 1].t_s, ml_ledger_summary(l)->step_time_s, 1e-12);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* A CPU profile (backend cpu) with its measured GEMM rate and memory
 * bandwidth times a plan with no device: one processor, so the host's time
 * and the compute's add up; no kernel floor and no waves (no SMs). The MLP
 * of test_mlp_by_hand at 0.2 TFLOP/s (one measured GEMM: its own rate, no
 * latency beyond it) and 10 GB/s. */
static void test_cpu_serial(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = ml_model_config(m);
    ml_profile *p = ml_profile_new();
    assert_int_equal(ml_profile_set(p, "backend", "cpu"), ML_OK);
    assert_int_equal(ml_profile_set(p, "dtype", "fp32"), ML_OK);
    const ml_profile_gemm g = {8192, 8192, 8192, 0.2};
    assert_int_equal(ml_profile_add_gemm(p, &g), ML_OK);
    ml_profile_set_memory_gbps(p, 10);
    const ml_profile_host h = {10e-6, 5e-6, 0, 0, 0, 20e-6, 1e-6};
    ml_profile_set_host(p, &h);
    c.calib = p;
    ml_ledger *l = eval(m, &c, false);
    const ml_step_time *t = &ml_ledger_summary(l)->time;
    const double F = 2.0 * 8192 * 1024 * 4096, prod = F / 0.2e12;
    const double act = 8192.0 * 4096 * 4, in = 8192.0 * 1024 * 4, ew = 10e9 * 0.85;
    /* 5 products (2 forward, 3 backward); GELU forward and backward, MSE
     * forward and backward, SGD's pass: each bytes / (0.85 x 10 GB/s) */
    const double compute = 5 * prod + (2 * act + 3 * act) / ew + (2 * in + 4 + 4 + 3 * in) / ew +
                           3.0 * 2 * 1024 * 4096 * 4 / ew;
    const double host = 4 * 10e-6 + 5 * 5e-6 + 20e-6 + 2 * 1e-6;
    assert_int_equal(t->source, ML_TIME_CALIBRATED);
    assert_true(t->serial);
    assert_rel_close(t->gpu_s, compute, 1e-12);
    assert_rel_close(t->host_s, host, 1e-12);
    assert_rel_close(t->step_s, host + compute, 1e-12);
    assert_true(t->mfu < 0); /* no datasheet peak */
    ml_ledger_destroy(l);
    /* the keys round-trip through a profile file (which needs a layer's
     * points to be read back) */
    ml_profile_point pt;
    memset(&pt, 0, sizeof pt);
    pt.B = 1, pt.T = 32, pt.D = 64, pt.saved_bytes = 100000;
    assert_int_equal(ml_profile_add_point(p, "transformer_block", &pt), ML_OK);
    pt.B = 2, pt.saved_bytes = 200000;
    assert_int_equal(ml_profile_add_point(p, "transformer_block", &pt), ML_OK);
    ml_profile *q = profile_round_trip(p);
    assert_rel_close(ml_profile_memory_gbps(q), 10, 1e-15);
    assert_non_null(ml_profile_host_costs(q));
    assert_rel_close(ml_profile_host_costs(q)->step_call_s, 20e-6, 1e-12);
    ml_profile_destroy(q);
    ml_profile_destroy(p);
    ml_model_destroy(m);
}

/* No named device: no bandwidth, not timed; a named one without a peak
 * at the precision (a10g): not timed either. */
static void test_untimed(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = ml_model_config(m);
    c.device.present = true;
    c.device.memory = (uint64_t)80 << 30;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->time.source, ML_TIME_NONE);
    ml_ledger_destroy(l);
    assert_int_equal(ml_device_preset_apply("a10g", &c.device, NULL), ML_OK);
    l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->time.source, ML_TIME_NONE);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The prepared planner derives the work items with the rest of the chain:
 * its step time is the one a fresh evaluation gives, at every batch. */
static void test_planner_same(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_planner *pl = NULL;
    assert_int_equal(ml_planner_create(m, &pl, NULL), ML_OK);
    for (uint64_t b = 1; b <= 24; b += 1) {
        ml_config c = ml_model_config(m);
        assert_int_equal(ml_device_preset_apply("h100-sxm", &c.device, NULL), ML_OK);
        c.training.micro_batch = b;
        ml_ledger *a = eval(m, &c, false), *d = NULL;
        assert_int_equal(ml_planner_evaluate(pl, &c, false, &d, NULL), ML_OK);
        const ml_step_time *x = &ml_ledger_summary(a)->time, *y = &ml_ledger_summary(d)->time;
        assert_int_equal(x->source, ML_TIME_DATASHEET);
        assert_rel_close(x->step_s, y->step_s, 1e-12);
        assert_rel_close(x->gpu_s, y->gpu_s, 1e-12);
        ml_ledger_destroy(a);
        ml_ledger_destroy(d);
    }
    ml_planner_destroy(pl);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_by_hand),
        cmocka_unit_test(test_host_bound),
        cmocka_unit_test(test_mlp2_defaults),
        cmocka_unit_test(test_cpu_serial),
        cmocka_unit_test(test_untimed),
        cmocka_unit_test(test_planner_same),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
