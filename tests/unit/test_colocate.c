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
    ml_config c = config_on_device(m, memory, b);
    c.device.allocator = ML_ALLOCATOR_NONE; /* the allocated view the figures derive */
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
    assert_true(ml__ledger_keep_levels(a2));
    assert_true(ml__ledger_keep_levels(b2));
    size_t n = 0;
    const ml_level *lv = ml__ledger_levels(a2, &n);
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

/* The MLP 8 -> 16 -> 4 (no biases, fp32) of tests/cli/cases/plan-peaks-json
 * as an inference job at B = 60: its 192 parameters are 768 B, and nothing
 * else is resident (no states, no training batch). The no-grad forward
 * holds, at the gelu: the weights 768 + its batch (x 60 x 8 x 4 = 1920 and
 * the mse target 60 x 4 x 4 = 960: 2880) + z1 60 x 16 x 4 = 3840 + a 3840
 * = 11,328 B (plan-peaks-json's evaluation peak, 14,304, less the Adam
 * states 1536 and the training batch 1440). With the default 512 MiB
 * reserve: 536,882,240 B. */
static const char mlp_yaml[] =
    "model:\n  type: sequential\n  input: [8]\n  layers:\n"
    "    - linear: {out: 16, bias: false}\n    - gelu: {}\n"
    "    - linear: {out: 4, bias: false}\n  loss: mse\n"
    "training:\n  micro_batch: 60\n  optimizer: adam\n  optimizer_impl: foreach\n";

static void test_inference_mlp_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str(mlp_yaml);
    ml_config c = config_allocated(m);
    ml_inference inf;
    ml_error e;
    assert_int_equal(ml_inference_evaluate(m, &c, 0, &inf, &e), ML_OK);
    assert_int_equal(inf.weights, 768);
    assert_int_equal(inf.forward_peak, 11328);
    assert_int_equal(inf.kv_forward, 0);
    assert_int_equal(inf.kv_cache, 0);
    assert_int_equal(inf.peak, 11328);
    assert_int_equal(inf.peak_total, 11328 + 536870912ull);
    /* a sequential model does not generate: refused, *out untouched */
    ml_inference before = inf;
    assert_int_equal(ml_inference_evaluate(m, &c, 4, &inf, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "not a decoder"));
    assert_memory_equal(&before, &inf, sizeof inf);
    ml_model_destroy(m);
}

/* A decoder of 2 layers, hidden 64, 4 heads of 16, 2 key/value heads, fp32,
 * as an inference job at B = 2, T = 8 generating N = 4 tokens. Its cache
 * (transformers' DynamicCache: keys and values of (B, kv_heads, T + N,
 * head_dim) per layer) is 2 x 2 layers x 2 x 2 x 16 x 12 x 4 B = 12,288 B;
 * in bf16, 6,144 B. The parameters: embedding 100 x 64 = 6400; per layer q
 * 4096 + k 2048 + v 2048 + o 4096 + gate, up, down 3 x 8192 + two norms 128
 * = 36,992, twice 73,984; the final norm 64; the head 6400: 86,848, fp32
 * 347,392 B. A YAML decoder returns no cache from its forward (kv_forward
 * 0): the peak is the forward's plus the whole cache. The forward is the
 * evaluation pass's with the training's residents gone: plan's at the same
 * shape less AdamW's states (2 x 4 B x 86,848 = 694,784) and the training
 * batch (ids and targets, 2 x 8 int64 each: 256). */
static const char dec_yaml[] =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
    "  ffn: 128\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 100\n  position: rope\n"
    "  max_positions: 64\n  tied_embeddings: false\n  bias: false\n  attention: eager\n"
    "  dropout: 0\ntraining:\n  micro_batch: 2\n  seq_len: 8\n  precision: fp32\n"
    "  optimizer: adamw\n";

static void test_kv_cache_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str(dec_yaml);
    ml_config c = config_allocated(m);
    ml_inference inf;
    ml_error e;
    assert_int_equal(ml_inference_evaluate(m, &c, 4, &inf, &e), ML_OK);
    assert_int_equal(inf.kv_cache, 12288);
    assert_int_equal(inf.kv_forward, 0);
    assert_int_equal(inf.weights, 347392);
    assert_int_equal(inf.peak, inf.forward_peak + 12288);
    assert_int_equal(inf.peak_total, inf.peak + 536870912ull);
    c.training.eval_batch = 2;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->bytes_optimizer, 694784);
    assert_int_equal(inf.forward_peak, ml_ledger_summary(l)->peak_eval - 694784 - 256);
    ml_ledger_destroy(l);
    /* bf16: two bytes a value; rotary positions extrapolate past
     * max_positions (8 + 57 > 64), learned ones end there: refused */
    c.training.precision = ML_PREC_BF16;
    assert_int_equal(ml_inference_evaluate(m, &c, 4, &inf, &e), ML_OK);
    assert_int_equal(inf.kv_cache, 6144);
    assert_int_equal(ml_inference_evaluate(m, &c, 57, &inf, &e), ML_OK);
    ml_model_destroy(m);
    char learned[sizeof dec_yaml + 8];
    const char *rope = strstr(dec_yaml, "rope");
    snprintf(learned, sizeof learned, "%.*slearned%s", (int)(rope - dec_yaml), dec_yaml,
             rope + 4);
    m = load_str(learned);
    c = config_allocated(m);
    assert_int_equal(ml_inference_evaluate(m, &c, 56, &inf, &e), ML_OK);
    assert_int_equal(ml_inference_evaluate(m, &c, 57, &inf, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "max_positions (64)"));
    ml_model_destroy(m);
}

/* A Hugging Face decoder with use_cache (SmolLM2-135M: 30 layers, 3
 * key/value heads of 576 / 9 = 64) returns its prompt's cache from the
 * forward: at B = 1, T = 16, fp32, 30 x 2 x 1 x 3 x 64 x 16 x 4 = 737,280 B,
 * counted in the forward's peak already. Generating 4 more: the cache of
 * 20 tokens is 921,600 B, so the peak grows by the 4 tokens' 184,320 B
 * (the prompt's part is not counted twice). */
static void test_kv_cache_not_counted_twice(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("smollm2-135m");
    ml_config c = config_allocated(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 16;
    c.training.precision = ML_PREC_FP32;
    ml_inference inf;
    ml_error e;
    assert_int_equal(ml_inference_evaluate(m, &c, 4, &inf, &e), ML_OK);
    assert_int_equal(inf.kv_forward, 737280);
    assert_int_equal(inf.kv_cache, 921600);
    assert_int_equal(inf.peak, inf.forward_peak + 184320);
    ml_model_destroy(m);
}

/* Two mlp2 training jobs (each 403,072,000 B allocated at its peak, 939,942,912
 * with its 512 MiB reserve: test_worst_is_the_sum) on 8 GiB: the device
 * totals, 1,879,885,824, fit. Their allocator peaks sum to 806,144,000 B.
 * A budget of 700 MiB (734,003,200) is under that: does not fit, headroom
 * 734,003,200 - 806,144,000 = -72,140,800 (the budget's margin is the
 * smaller). 1 GiB: fits, headroom 1,073,741,824 - 806,144,000 = 267,597,824.
 * No budget: the default, 8 GiB less the two reserves = 7 GiB, margin
 * 7,516,192,768 - 806,144,000 = 6,710,048,768, the same as the device's
 * 8,589,934,592 - 1,879,885,824: the verdict of colocate without a budget. */
static void test_budget_flips_the_verdict(void **state)
{
    (void)state;
    const uint64_t mem = 8ull << 30;
    ml_ledger *a = job("mlp2", 256, 0, mem), *b = job("mlp2", 256, 0, mem);
    const ml_colocate_job js[2] = {{a, NULL}, {b, NULL}};
    ml_colocate_result r;
    ml_error e;
    assert_int_equal(ml_colocate_jobs(js, 2, mem, 700ull << 20, &r, &e), ML_OK);
    assert_int_equal(r.worst_total, 1879885824ull);
    assert_int_equal(r.peak_sum, 806144000ull);
    assert_true(r.budget_given);
    assert_false(r.fits);
    assert_int_equal(r.headroom, -72140800ll);
    assert_int_equal(ml_colocate_jobs(js, 2, mem, 1ull << 30, &r, &e), ML_OK);
    assert_true(r.fits);
    assert_int_equal(r.headroom, 267597824ll);
    assert_int_equal(ml_colocate_jobs(js, 2, mem, 0, &r, &e), ML_OK);
    assert_false(r.budget_given);
    assert_int_equal(r.budget, 7ull << 30);
    assert_true(r.fits);
    assert_int_equal(r.headroom, 6710048768ll);
    /* above the device: refused; a job that is neither kind: refused */
    assert_int_equal(ml_colocate_jobs(js, 2, mem, mem + 1, &r, &e), ML_RANGE);
    const ml_colocate_job bad[2] = {{a, NULL}, {NULL, NULL}};
    assert_int_equal(ml_colocate_jobs(bad, 2, mem, 0, &r, &e), ML_USAGE);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
}

/* A job whose own plan runs out of the device in the allocator simulation
 * (GPT-2 small at micro-batch 16 and 631 tokens on 24 GiB: memledger plan
 * says DOES NOT FIT, its cache fragmented) has a peak total that stops
 * where it ran out, below what it needs. Beside mlp2 at micro-batch 256
 * the sums are under the device and the budget, yet nothing fits: the
 * result names the job (in either order), and the headroom is -1, as
 * plan's for a plan that runs out with room left. */
static void test_job_that_runs_out(void **state)
{
    (void)state;
    const uint64_t mem = 24ull << 30;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_on_device(m, mem, 16);
    c.training.seq_len = 631;
    ml_ledger *a = eval(m, &c, true), *b = job("mlp2", 256, 0, mem);
    assert_true(ml_ledger_summary(a)->reserved_oom);
    assert_false(ml_ledger_summary(a)->fits);
    for (int order = 0; order < 2; order++) {
        const ml_colocate_job js[2] = {{order ? b : a, NULL}, {order ? a : b, NULL}};
        ml_colocate_result r;
        ml_error e;
        assert_int_equal(ml_colocate_jobs(js, 2, mem, 0, &r, &e), ML_OK);
        assert_true(r.worst_total <= mem && r.peak_sum <= r.budget); /* the sums alone */
        assert_false(r.fits);
        assert_int_equal(r.oom_job, order ? 2 : 1);
        assert_int_equal(r.headroom, -1);
    }
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
    ml_model_destroy(m);
}

/* An inference job is flat: its device total at every instant. Beside a
 * timed mlp2 training job (peak total 939,942,912 at its optimizer step),
 * the MLP inference job above (536,882,240) adds its total to every level:
 * started together the highest sum is 939,942,912 + 536,882,240 =
 * 1,476,825,152, the worst case; on 2 GiB nothing is over. */
static void test_inference_is_flat(void **state)
{
    (void)state;
    const uint64_t mem = 2ull << 30;
    ml_ledger *a = job("mlp2", 256, 10, mem);
    ml_model *m = load_str(mlp_yaml);
    ml_config c = config_allocated(m);
    ml_inference inf;
    ml_error e;
    assert_int_equal(ml_inference_evaluate(m, &c, 0, &inf, &e), ML_OK);
    const ml_colocate_job js[2] = {{a, NULL}, {NULL, &inf}};
    for (double t = 0; t < 0.01; t += 0.0007)
        assert_int_equal(ml_colocate_job_level(&js[1], t), 536882240ull);
    ml_colocate_result r;
    assert_int_equal(ml_colocate_jobs(js, 2, mem, 0, &r, &e), ML_OK);
    assert_int_equal(r.worst_total, 939942912ull + 536882240ull);
    assert_true(r.timed && r.aligned_known);
    assert_int_equal(r.aligned_total, 939942912ull + 536882240ull);
    assert_true(r.fits);
    assert_true(r.p_time_over == 0);
    ml_ledger_destroy(a);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worst_is_the_sum),
        cmocka_unit_test(test_identical_jobs_started_together),
        cmocka_unit_test(test_unequal_periods),
        cmocka_unit_test(test_periods_too_unequal),
        cmocka_unit_test(test_levels_give_the_same_answers),
        cmocka_unit_test(test_inference_mlp_by_hand),
        cmocka_unit_test(test_kv_cache_by_hand),
        cmocka_unit_test(test_kv_cache_not_counted_twice),
        cmocka_unit_test(test_budget_flips_the_verdict),
        cmocka_unit_test(test_inference_is_flat),
        cmocka_unit_test(test_job_that_runs_out),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
