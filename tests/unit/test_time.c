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
 * derives its 22 events' totals) at 1,000 FLOP/s: the events fall at five
 * instants (t = FLOPs before / 1000):
 *   0      events 0-2   totals 768, 864, 1056             -> (0, 1056)
 *   0.768  events 3-4   1248, 1296                        -> (0.768, 1296)
 *   1.152  events 5-12  1344 1440 1392 1296 1344 1536 1792 1744
 *                       -> (1.152, 1792), (1.152, 1744)
 *   1.92   events 13-18 1552 1744 1552 1360 1872 1680
 *                       -> (1.92, 1872), (1.92, 1680): the peak, 1872
 *   2.688  events 19-21 1584 816 768  -> (2.688, 1584), (2.688, 768)
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
    static const uint64_t b[] = {1056, 1296, 1792, 1744, 1872, 1680, 1584, 768};
    assert_int_equal(ml_ledger_curve(l, NULL, 0), 8);
    ml_curve_point p[8];
    /* a short array: the first cap points, the whole count returned */
    assert_int_equal(ml_ledger_curve(l, p, 3), 8);
    assert_rel_close(p[2].t_s, 1.152, 1e-12);
    assert_int_equal(p[2].bytes, 1792);
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

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_curve_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
