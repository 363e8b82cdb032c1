/* colocate (docs/colocate.md): the worst case is the sum of the jobs' peak
 * totals; two identical jobs started together line their peaks up; the
 * share of time over the device matches a plain pairwise count over the
 * jobs' event lists, written here without the library's sorting. */
#include <math.h>
#include <stdlib.h>

#include "harness.h"
#include "ledger/levels.h"

static uint64_t total_of(const ml_event *e)
{
    uint64_t t = 0;
    for (int k = 0; k < ML_CAT_COUNT; k++)
        t += e->live[k];
    return t;
}

/* Every pair of (level, duration) segments of a and b: the share of time
 * a + b > memory with independent uniform phases. */
static double pairwise(const ml_ledger *a, const ml_ledger *b, uint64_t memory)
{
    const ml_ledger *ls[2] = {a, b};
    const ml_event *ev[2];
    size_t n[2];
    double T[2];
    uint64_t off[2];
    for (int j = 0; j < 2; j++) {
        const ml_summary *s = ml_ledger_summary(ls[j]);
        ev[j] = ml_ledger_events(ls[j]);
        n[j] = ml_ledger_event_count(ls[j]);
        T[j] = s->step_time_s;
        off[j] = s->runtime_reserve + s->fragmentation;
    }
    double over = 0;
    for (size_t i = 0; i < n[0]; i++) {
        double da = (i + 1 < n[0] ? ev[0][i + 1].t_s : T[0]) - ev[0][i].t_s;
        for (size_t k = 0; k < n[1]; k++) {
            double db = (k + 1 < n[1] ? ev[1][k + 1].t_s : T[1]) - ev[1][k].t_s;
            if (da > 0 && db > 0 &&
                total_of(&ev[0][i]) + off[0] + total_of(&ev[1][k]) + off[1] > memory)
                over += da / T[0] * db / T[1];
        }
    }
    return over;
}

static ml_ledger *job(const char *preset, uint64_t b, double tflops, uint64_t memory)
{
    ml_model *m = load_preset(preset);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = b;
    c.device.present = true;
    c.device.memory = memory;
    c.device.budget = 0;
    c.device.peak_tflops = tflops;
    c.device.efficiency = 1;
    ml_ledger *l = eval(m, &c, true);
    ml_model_destroy(m);
    return l;
}

static void test_worst_is_the_sum(void **state)
{
    (void)state;
    /* mlp2: peak total 403,072,000 + the 512 MiB reserve = 939,942,912 B
     * (tests/unit/test_model_states.c derives the peak) */
    ml_ledger *a = job("mlp2", 256, 0, 1ull << 30), *b = job("mlp2", 256, 0, 1ull << 30);
    const ml_ledger *ls[2] = {a, b};
    ml_colocate_result r;
    ml_error e;
    assert_int_equal(ml_colocate(ls, 2, 1ull << 30, &r, &e), ML_OK);
    assert_int_equal(r.worst_total, 2 * 939942912ull);
    assert_false(r.fits);
    assert_int_equal(r.headroom, (int64_t)(1ull << 30) - 2 * 939942912ll);
    /* no step time: no time axis */
    assert_false(r.timed);
    assert_false(r.aligned_known);
    assert_true(r.p_time_over < 0);
    assert_int_equal(ml_colocate(ls, 1, 1ull << 30, &r, &e), ML_USAGE);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
}

static void test_identical_jobs_started_together(void **state)
{
    (void)state;
    ml_ledger *a = job("mlp2", 256, 10, 8ull << 30), *b = job("mlp2", 256, 10, 8ull << 30);
    const ml_ledger *ls[2] = {a, b};
    ml_colocate_result r;
    ml_error e;
    assert_int_equal(ml_colocate(ls, 2, 8ull << 30, &r, &e), ML_OK);
    assert_true(r.timed && r.aligned_known);
    /* the same curve twice, in step: the peaks coincide (the optimizer
     * step at 25.6 GFLOP / 10 TFLOP/s = 2.56 ms) */
    assert_int_equal(r.aligned_total, r.worst_total);
    assert_rel_close(r.aligned_at_s, 0.00256, 1e-12);
    assert_rel_close(r.p_time_over, 0, 0);
    /* a device just under twice the level mid-iteration (the backward):
     * over it part of the time only; the pairwise count */
    const uint64_t mid = 2 * ml_colocate_level(a, 0.00256 / 2) - 1;
    assert_int_equal(ml_colocate(ls, 2, mid, &r, &e), ML_OK);
    const double want = pairwise(a, b, mid);
    assert_true(want > 0 && want < 1);
    assert_rel_close(r.p_time_over, want, 1e-12);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
}

/* Two different jobs and periods: the level lookup wraps each period, and
 * the share of time matches the pairwise count at several devices. */
static void test_unequal_periods(void **state)
{
    (void)state;
    ml_ledger *a = job("gpt2-small", 1, 50, 24ull << 30), *b = job("mlp2", 64, 10, 24ull << 30);
    const ml_ledger *ls[2] = {a, b};
    const ml_summary *sb = ml_ledger_summary(b);
    /* one period later, the same level */
    for (double t = 0; t < sb->step_time_s; t += sb->step_time_s / 7)
        assert_int_equal(ml_colocate_level(b, t), ml_colocate_level(b, t + sb->step_time_s));
    ml_colocate_result r;
    ml_error e;
    const uint64_t worst = ml_ledger_summary(a)->peak_total + sb->peak_total;
    for (int k = 1; k <= 4; k++) {
        const uint64_t mem = worst - worst / 8 * (uint64_t)k / 4;
        assert_int_equal(ml_colocate(ls, 2, mem, &r, &e), ML_OK);
        assert_rel_close(r.p_time_over, pairwise(a, b, mem), 1e-12);
        assert_true(r.aligned_total <= r.worst_total);
    }
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
}

/* The CLI keeps each job's events as levels (time and
 * total, 16 bytes each) for text and JSON. The same jobs as
 * test_unequal_periods, once with their events and once reduced: each level
 * is its event's t_s and the sum of its live[] (total_of above, written
 * without the library), and every figure of ml_colocate is the same. */
static void test_levels_give_the_same_answers(void **state)
{
    (void)state;
    ml_ledger *a = job("gpt2-small", 1, 50, 24ull << 30), *b = job("mlp2", 64, 10, 24ull << 30);
    ml_ledger *a2 = job("gpt2-small", 1, 50, 24ull << 30), *b2 = job("mlp2", 64, 10, 24ull << 30);
    const size_t na = ml_ledger_event_count(a2);
    uint64_t *want = malloc(na * sizeof *want);
    double *when = malloc(na * sizeof *when);
    assert_non_null(want);
    assert_non_null(when);
    for (size_t i = 0; i < na; i++) {
        want[i] = total_of(&ml_ledger_events(a2)[i]);
        when[i] = ml_ledger_events(a2)[i].t_s;
    }
    assert_true(ml_ledger_keep_levels(a2));
    assert_true(ml_ledger_keep_levels(b2));
    size_t n = 0;
    const ml_level *lv = ml_ledger_levels(a2, &n);
    assert_int_equal(n, na);
    assert_int_equal(ml_ledger_event_count(a2), 0);
    for (size_t i = 0; i < n; i++) {
        assert_true(lv[i].total == want[i]);
        assert_true(lv[i].t_s == when[i]);
    }
    const ml_ledger *full[2] = {a, b}, *lean[2] = {a2, b2};
    const uint64_t worst = ml_ledger_summary(a)->peak_total + ml_ledger_summary(b)->peak_total;
    for (int k = 1; k <= 4; k++) {
        const uint64_t mem = worst - worst / 8 * (uint64_t)k / 4;
        ml_colocate_result r1, r2;
        ml_error e;
        assert_int_equal(ml_colocate(full, 2, mem, &r1, &e), ML_OK);
        assert_int_equal(ml_colocate(lean, 2, mem, &r2, &e), ML_OK);
        assert_true(r2.timed && r2.aligned_known);
        assert_int_equal(r2.aligned_total, r1.aligned_total);
        assert_true(r2.aligned_at_s == r1.aligned_at_s);
        assert_true(r2.p_time_over == r1.p_time_over);
        assert_int_equal(r2.worst_total, r1.worst_total);
    }
    assert_int_equal(ml_colocate_level(a2, 0.001), ml_colocate_level(a, 0.001));
    free(want);
    free(when);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
    ml_ledger_destroy(a2);
    ml_ledger_destroy(b2);
}

/* Step times 2^100 apart: the started-together search would need more
 * instants than any machine has; it is skipped (it once looped for ever). */
static void test_periods_too_unequal(void **state)
{
    (void)state;
    ml_ledger *a = job("mlp2", 256, 1e18, 8ull << 30), *b = job("mlp2", 256, 1e-12, 8ull << 30);
    const ml_ledger *ls[2] = {a, b};
    ml_colocate_result r;
    ml_error e;
    assert_int_equal(ml_colocate(ls, 2, 8ull << 30, &r, &e), ML_OK);
    assert_true(r.timed);
    assert_false(r.aligned_known);
    assert_int_equal(r.worst_total, 2 * 939942912ull);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worst_is_the_sum),
        cmocka_unit_test(test_identical_jobs_started_together),
        cmocka_unit_test(test_unequal_periods),
        cmocka_unit_test(test_periods_too_unequal),
        cmocka_unit_test(test_levels_give_the_same_answers),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
