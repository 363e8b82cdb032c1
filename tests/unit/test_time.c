/* Time on the timeline (docs/ledger.md, "Time"): the memory curve as
 * (t, bytes) points, and the communication and host transfers that take
 * time with sharding and offload. Expected values derived by hand. */
#include "harness.h"

static const char *const mlp_yaml =
    "model:\n  type: sequential\n  input: [8]\n  layers:\n"
    "    - linear: {out: 16, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 4, bias: false}\n  loss: mse\n"
    "training:\n  micro_batch: 3\n  optimizer: sgd\n";

/* The tiny MLP of test_ledger_invariants.c (test_mlp_timeline_by_hand
 * derives its 20 events' totals) at 1,000 FLOP/s: the events fall at five
 * instants (t = FLOPs before / 1000):
 *   0      events 0-3   totals 768, 864, 912 (params, the batch's x and
 *                       target), 1104 (z1)                -> (0, 1104)
 *   0.768  events 4-5   1296, 1344                        -> (0.768, 1344)
 *   1.152  events 6-11  1440 1344 1392 1584 1840 1792
 *                       -> (1.152, 1840), (1.152, 1792)
 *   1.92   events 12-17 1600 1792 1600 1408 1920 1728
 *                       -> (1.92, 1920), (1.92, 1728): the peak, 1920
 *   2.688  events 18-19 960 912  -> (2.688, 960), (2.688, 912)
 * Eight points; the highest is the summary's peak. */
static void test_curve_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = ml_model_config(m);
    c.device.peak_tflops = 1e-9;
    c.device.efficiency = 1;
    ml_ledger *l = eval(m, &c, true);
    static const double t[] = {0, 0.768, 1.152, 1.152, 1.92, 1.92, 2.688, 2.688};
    static const uint64_t b[] = {1104, 1344, 1840, 1792, 1920, 1728, 960, 912};
    assert_int_equal(ml_ledger_curve(l, NULL, 0), 8);
    ml_curve_point p[8];
    /* a short array: the first cap points, the whole count returned */
    assert_int_equal(ml_ledger_curve(l, p, 3), 8);
    assert_rel_close(p[2].t_s, 1.152, 1e-12);
    assert_int_equal(p[2].bytes, 1840);
    assert_int_equal(ml_ledger_curve(l, p, 8), 8);
    for (size_t i = 0; i < 8; i++) {
        assert_rel_close(p[i].t_s, t[i], 1e-12);
        assert_int_equal(p[i].bytes, b[i]);
    }
    assert_int_equal(p[4].bytes, ml_ledger_summary(l)->peak);
    ml_ledger_destroy(l);
    /* no throughput: no time, no curve; no events: no curve */
    c.device.peak_tflops = 0;
    l = eval(m, &c, true);
    assert_int_equal(ml_ledger_curve(l, p, 8), 0);
    ml_ledger_destroy(l);
    c.device.peak_tflops = 1e-9;
    l = eval(m, &c, false);
    assert_int_equal(ml_ledger_curve(l, p, 8), 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* ZeRO-3 over two devices (docs/sharding.md, "Time"): the MLP's blocks hold
 * W1 (8 x 16 = 128 fp32 params, 512 B), nothing (the GELU) and W2 (16 x 4 =
 * 64, 256 B); a ring all-gather or reduce-scatter sends (N-1)/N = 1/2 of the
 * buffer per device. Forward: block 0's gather 256 B, block 2's 128 B;
 * backward the same again, and each block's gradient reduce-scattered
 * after its backward: 128 + 256 B. In all 384 + 384 + 384 = 1,152 B = the
 * summary's A (2 f W + f G) = 2 x 1/2 x 768 + 1/2 x 768. At 1e-6 GB/s (1,000
 * B/s) that is 1.152 s, after the compute's 2.688 s (1,000 FLOP/s): the
 * step takes 3.84 s, and the last event is at 3.84 s. The first event of
 * block 0's forward (its gather buffer, allocated before the gather) is at
 * 0; the first event after it at 0.256 s. */
static void test_zero3_two_devices_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = ml_model_config(m);
    c.device.peak_tflops = 1e-9;
    c.device.efficiency = 1;
    c.training.data_parallel = 2;
    c.training.zero = 3;
    ml_ledger *l = eval(m, &c, true);
    const ml_summary *s = ml_ledger_summary(l);
    assert_rel_close(s->comm_bytes, 1152, 1e-12);
    assert_true(s->time_communication_s < 0); /* no bandwidth: not timed */
    assert_rel_close(s->step_time_s, 2.688, 1e-12);
    ml_ledger_destroy(l);
    c.device.interconnect_gbps = 1e-6;
    l = eval(m, &c, true);
    s = ml_ledger_summary(l);
    assert_rel_close(s->time_compute_s, 2.688, 1e-12);
    assert_rel_close(s->time_communication_s, 1.152, 1e-12);
    assert_true(s->time_host_transfer_s == 0);
    assert_rel_close(s->step_time_s, 3.84, 1e-12);
    const ml_event *ev = ml_ledger_events(l);
    size_t n = ml_ledger_event_count(l), i = 0;
    assert_rel_close(ev[n - 1].comm_before, 1152, 1e-12);
    assert_rel_close(ev[n - 1].t_s, 3.84, 1e-12);
    /* block 0's gather buffer: 512 + block 1's 0 (the prefetched GELU) */
    while (i < n && !(ev[i].block == 0 && ev[i].cat == ML_CAT_WORKSPACE))
        i++;
    assert_true(i + 1 < n);
    assert_int_equal(ev[i].delta, 512);
    assert_true(ev[i].t_s == 0);
    assert_rel_close(ev[i + 1].t_s, 0.256, 1e-12);
    for (i = 1; i < n; i++)
        assert_true(ev[i].t_s >= ev[i - 1].t_s);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Optimizer offload on one device (docs/sharding.md, "Offload"): the
 * gradients (192 fp32 = 768 B) go down before the step, the updated
 * parameters (768 B) come back up after it: 1,536 B over the host link, at
 * 1e-6 GB/s 1.536 s; the step takes 2.688 + 1.536 = 4.224 s. The step's
 * events (SGD has no temporaries: the gradients freed, then y) come after
 * both transfers: at 4.224 s. Before the step the last backward event is
 * block 0's node freeing z1's gradient, before that node's FLOPs are
 * counted: at 1.92 s (test_curve_by_hand). */
static void test_offload_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = ml_model_config(m);
    c.device.peak_tflops = 1e-9;
    c.device.efficiency = 1;
    c.training.offload = ML_OFFLOAD_OPTIMIZER;
    c.device.pcie_gbps = 1e-6;
    ml_ledger *l = eval(m, &c, true);
    const ml_summary *s = ml_ledger_summary(l);
    assert_rel_close(s->host_transfer_bytes, 1536, 1e-12);
    assert_rel_close(s->time_host_transfer_s, 1.536, 1e-12);
    assert_true(s->time_communication_s == 0);
    assert_rel_close(s->step_time_s, 4.224, 1e-12);
    const ml_event *ev = ml_ledger_events(l);
    size_t n = ml_ledger_event_count(l), i = 0;
    while (i < n && ev[i].phase != ML_PHASE_OPTIMIZER)
        i++;
    assert_true(i > 0 && i < n);
    assert_rel_close(ev[i - 1].t_s, 1.92, 1e-12);
    assert_int_equal(ev[i - 1].delta, -192);
    assert_int_equal(ev[i].delta, -768);
    for (; i < n; i++)
        assert_rel_close(ev[i].t_s, 4.224, 1e-12);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Every preset under each ZeRO stage over 4 devices with accumulation: the
 * events' communication and host transfers add up to the summary's, so the
 * last event sits at the step time. */
static void test_totals_match_summary(void **state)
{
    (void)state;
    static const char *const presets[] = {"mlp2", "gpt2-small", "llama-2-7b", "vit-b16"};
    for (size_t p = 0; p < sizeof presets / sizeof *presets; p++) {
        ml_model *m = load_preset(presets[p]);
        for (unsigned z = 0; z <= 3; z++) {
            ml_config c = ml_model_config(m);
            c.training.data_parallel = 4;
            c.training.grad_accum = 3;
            c.training.zero = z;
            c.training.offload = z == 3 ? ML_OFFLOAD_PARAMS : ML_OFFLOAD_OPTIMIZER;
            c.device.peak_tflops = 100;
            c.device.efficiency = 1;
            c.device.interconnect_gbps = 50;
            c.device.pcie_gbps = 25;
            ml_ledger *l = eval(m, &c, true);
            const ml_summary *s = ml_ledger_summary(l);
            const ml_event *ev = ml_ledger_events(l);
            size_t n = ml_ledger_event_count(l);
            if (fabs(ev[n - 1].comm_before - s->comm_bytes) > 1e-9 * s->comm_bytes ||
                fabs(ev[n - 1].host_before - s->host_transfer_bytes) >
                    1e-9 * s->host_transfer_bytes)
                fail_msg("%s zero %u: events %g / %g B, summary %g / %g B", presets[p], z,
                         ev[n - 1].comm_before, ev[n - 1].host_before, s->comm_bytes,
                         s->host_transfer_bytes);
            assert_rel_close(ev[n - 1].t_s, s->step_time_s, 1e-9);
            assert_rel_close(s->step_time_s, s->time_compute_s + s->time_communication_s +
                                                 s->time_host_transfer_s, 1e-12);
            ml_ledger_destroy(l);
        }
        ml_model_destroy(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curve_by_hand),
        cmocka_unit_test(test_zero3_two_devices_by_hand),
        cmocka_unit_test(test_offload_by_hand),
        cmocka_unit_test(test_totals_match_summary),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
