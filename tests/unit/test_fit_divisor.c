/* fit with a global batch: the micro-batch is the largest divisor of the
 * per-device batch at or below the largest that fits; near the device's
 * capacity the simulated verdict is not monotone in the micro-batch, so
 * that divisor itself need not fit, and the next smaller one that does is
 * the answer (src/plan/fit.c, divisor_that_fits). */
#include "harness.h"

/* ResNet-50 (models/resnet50-imagenet.yaml) under autocast on 16 GiB with
 * a global batch of 708 = 2^2 x 3 x 59 on one device: its divisors below
 * 708 are 354, 236, 177, 118, 59, 12, 6, 4, 3, 2 and 1. The largest
 * micro-batch that fits with accumulation is 359 or so, above 354, but
 * 354 with 2 steps runs out of the device in the simulation (its cache
 * fragmented) while 236 with 3 fits: the answer is 236 x 3, with a note
 * naming 354. It had been "does not fit", with no reason. */
static void test_divisor_that_fits(void **state)
{
    (void)state;
    ml_model *m = load_preset("resnet50-imagenet");
    ml_config c = config_on_device(m, 16ull << 30, 1);
    c.training.precision = ML_PREC_AMP_BF16;
    /* the two plans by themselves */
    ml_config p = c;
    p.training.micro_batch = 354;
    p.training.grad_accum = 2;
    ml_ledger *l = eval(m, &p, false);
    assert_false(ml_ledger_summary(l)->fits);
    ml_ledger_destroy(l);
    p.training.micro_batch = 236;
    p.training.grad_accum = 3;
    l = eval(m, &p, false);
    assert_true(ml_ledger_summary(l)->fits);
    ml_ledger_destroy(l);
    ml_fit_request req = ml_fit_request_defaults();
    req.global_batch = 708;
    ml_fit_result r;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_true(r.max_micro_batch >= 354);
    assert_true(r.fits);
    assert_int_equal(r.micro_batch, 236);
    assert_int_equal(r.grad_accum, 3);
    assert_int_equal(r.effective_batch, 708);
    assert_true(r.exact);
    assert_non_null(strstr(r.note, "354"));
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_divisor_that_fits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
