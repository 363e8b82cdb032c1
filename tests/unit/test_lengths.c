/* Length distributions (src/plan/lengths*.c): parsing, the CDF and its
 * quantiles by hand, the longest of b samples (F(t)^b), and the batch shapes
 * each batching mode plans, against direct evaluations of those shapes. */
#include "harness.h"

/* A small decoder with learned positions (64 of them). */
static const char *decoder =
    "name: lens\nmodel:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n"
    "  vocab: 100\n  max_positions: 64\n"
    "training:\n  micro_batch: 4\n  seq_len: 64\n  optimizer: adamw\n";

/* 90 % of the samples have 10 tokens, 10 % have 64. */
static const char *two_lengths = "length,count\n10,9\n64,1\n";

static ml_lengths *csv(const char *text)
{
    ml_lengths *d = NULL;
    ml_error e;
    ml_status st = ml_lengths_parse_csv(text, strlen(text), "lengths.csv", &d, &e);
    if (st)
        fail_msg("%s:%u:%u: %s", e.path, e.line, e.col, e.msg);
    return d;
}

static ml_status csv_error(const char *text, ml_error *e)
{
    ml_lengths *d = NULL;
    ml_status st = ml_lengths_parse_csv(text, strlen(text), "bad.csv", &d, e);
    assert_null(d);
    return st;
}

/* 100 x3 and 200 x1: F(100) = 3/4, F = 1 from 200 on. */
static void test_csv_cdf_by_hand(void **state)
{
    (void)state;
    ml_lengths *d = csv("# token counts\nlength,count\n100,2\n\n200\n100\n");
    assert_int_equal(ml_lengths_samples(d), 4);
    assert_int_equal(ml_lengths_min(d), 100);
    assert_int_equal(ml_lengths_max(d), 200);
    assert_true(ml_lengths_cdf(d, 99) == 0);
    assert_true(ml_lengths_cdf(d, 100) == 0.75);
    assert_true(ml_lengths_cdf(d, 199) == 0.75);
    assert_true(ml_lengths_cdf(d, 200) == 1);
    assert_int_equal(ml_lengths_quantile(d, 0.5), 100);
    assert_int_equal(ml_lengths_quantile(d, 0.75), 100);
    assert_int_equal(ml_lengths_quantile(d, 0.76), 200);
    /* the longest of 2: F^2 >= 0.5 <=> F >= 0.7071: 100; of 4: F >= 0.8409: 200 */
    assert_int_equal(ml_lengths_batch_max_quantile(d, 2, 0.5), 100);
    assert_int_equal(ml_lengths_batch_max_quantile(d, 4, 0.5), 200);
    assert_int_equal(ml_lengths_floor(d, 150), 100);
    assert_int_equal(ml_lengths_floor(d, 99), 0);
    assert_int_equal(ml_lengths_floor(d, 5000), 200);
    ml_lengths_destroy(d);
    /* count first, as the header says (names in either case): 100 x5 and
     * 900 x1, F(100) = 5/6; read by position it would be 5 x100 and 1 x900 */
    d = csv("Count, Length\r\n5,100\r\n1,900\r\n");
    assert_int_equal(ml_lengths_samples(d), 6);
    assert_int_equal(ml_lengths_min(d), 100);
    assert_int_equal(ml_lengths_max(d), 900);
    assert_true(ml_lengths_cdf(d, 100) == 5.0 / 6);
    ml_lengths_destroy(d);
    /* a byte order mark and CRLF lines */
    d = csv("\xEF\xBB\xBF" "7\r\n7\r\n");
    assert_int_equal(ml_lengths_samples(d), 2);
    assert_int_equal(ml_lengths_max(d), 7);
    ml_lengths_destroy(d);
}

/* p50=100, max=200, min 1 by default: knots (0, 0), (100, .5), (200, 1). */
static void test_quantiles_by_hand(void **state)
{
    (void)state;
    ml_lengths *d = NULL;
    ml_error e;
    assert_int_equal(ml_lengths_parse_quantiles("max=200,p50=100", &d, &e), ML_OK);
    assert_int_equal(ml_lengths_samples(d), 0);
    assert_int_equal(ml_lengths_min(d), 1);
    assert_true(ml_lengths_cdf(d, 0) == 0);
    assert_rel_close(ml_lengths_cdf(d, 50), 0.25, 1e-15);
    assert_rel_close(ml_lengths_cdf(d, 150), 0.75, 1e-15);
    assert_int_equal(ml_lengths_quantile(d, 0.75), 150);
    assert_int_equal(ml_lengths_quantile(d, 0.5), 100);
    assert_int_equal(ml_lengths_floor(d, 123), 123);
    /* the median of the longest of 8: F >= 0.5^(1/8) = 0.917 -> t >= 183.4: 184 */
    assert_int_equal(ml_lengths_batch_max_quantile(d, 8, 0.5), 184);
    ml_lengths_destroy(d);
    assert_int_equal(ml_lengths_parse_quantiles("min=20,p99.5=90,max=100", &d, &e), ML_OK);
    assert_int_equal(ml_lengths_min(d), 20);
    /* (19, 0) to (90, .995): F(20) = .995 / 71 */
    assert_rel_close(ml_lengths_cdf(d, 20), 0.995 / 71, 1e-12);
    ml_lengths_destroy(d);
}

static void test_bad_input(void **state)
{
    (void)state;
    ml_error e;
    ml_lengths *d = NULL;
    assert_int_equal(ml_lengths_parse_quantiles("p50=100", &d, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "max= is required"));
    assert_int_equal(ml_lengths_parse_quantiles("p50=300,max=200", &d, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "must not fall"));
    assert_int_equal(ml_lengths_parse_quantiles("p100=5,max=9", &d, &e), ML_USAGE);
    assert_int_equal(ml_lengths_parse_quantiles("q=5,max=9", &d, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "unknown key"));
    assert_int_equal(ml_lengths_parse_quantiles("p50=5,p50=6,max=9", &d, &e), ML_USAGE);
    assert_int_equal(ml_lengths_parse_quantiles("max=0", &d, &e), ML_USAGE);
    assert_int_equal(ml_lengths_parse_quantiles("max=-3", &d, &e), ML_USAGE);
    assert_null(d);
    /* the CSV: position of each problem */
    assert_int_equal(csv_error("10\n12x\n", &e), ML_SYNTAX);
    assert_int_equal(e.line, 2);
    assert_int_equal(e.col, 1);
    assert_string_equal(e.path, "bad.csv");
    assert_int_equal(csv_error("10,0\n", &e), ML_RANGE);
    assert_int_equal(e.col, 4);
    assert_int_equal(csv_error("0\n", &e), ML_RANGE);
    assert_int_equal(csv_error("268435457\n", &e), ML_RANGE);
    assert_int_equal(csv_error("99999999999999999999999\n", &e), ML_RANGE);
    assert_int_equal(csv_error("length\n", &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "no lengths"));
    assert_int_equal(csv_error("", &e), ML_RANGE);
    assert_int_equal(csv_error("5\nlength\n", &e), ML_SYNTAX); /* a header only first */
    /* a header is read by its names: another name, a repeat, a third
     * column or no length column is refused at that column */
    assert_int_equal(csv_error("foo,bar\n5,100\n", &e), ML_SYNTAX);
    assert_int_equal(e.line, 1);
    assert_int_equal(e.col, 1);
    assert_non_null(strstr(e.msg, "\"foo\""));
    assert_int_equal(csv_error("length, length\n5,100\n", &e), ML_SYNTAX);
    assert_int_equal(e.col, 9);
    assert_non_null(strstr(e.msg, "repeats `length`"));
    assert_int_equal(csv_error("length,count,x\n5,100\n", &e), ML_SYNTAX);
    assert_int_equal(e.col, 14);
    assert_int_equal(csv_error("count\n5\n", &e), ML_SYNTAX);
    assert_non_null(strstr(e.msg, "no `length` column"));
    assert_int_equal(csv_error("count,length\n5,100\n7\n", &e), ML_SYNTAX);
    assert_int_equal(e.line, 3); /* count,length wants both fields */
    assert_int_equal(csv_error("count,length\n5,abc\n", &e), ML_SYNTAX);
    assert_non_null(strstr(e.msg, "`count,length`, as the header says"));
    /* one trailing comma after the header's names is no column */
    d = csv("length,count,\n100,5\n");
    assert_int_equal(ml_lengths_samples(d), 5);
    ml_lengths_destroy(d);
    assert_int_equal(ml_lengths_parse_csv("5\n\0" "6\n", 5, "nul.csv", &d, &e), ML_SYNTAX);
    assert_int_equal(e.line, 2);
    assert_null(d);
}

/* The ledger at (b, t), for comparison. */
static ml_length_point direct(const ml_model *m, const ml_config *c0, uint64_t b, uint64_t t)
{
    ml_config c = *c0;
    c.training.micro_batch = b;
    c.training.seq_len = t;
    ml_ledger *l = NULL;
    ml_error e;
    if (ml_ledger_evaluate(m, &c, false, &l, &e))
        fail_msg("%s", e.msg);
    const ml_summary *s = ml_ledger_summary(l);
    ml_length_point p = {b,           t, s->peak, s->peak_total, s->has_device && s->fits,
                         s->has_device ? s->headroom : 0};
    ml_ledger_destroy(l);
    return p;
}

static void same_point(ml_length_point got, ml_length_point want)
{
    assert_int_equal(got.micro_batch, want.micro_batch);
    assert_int_equal(got.seq_len, want.seq_len);
    assert_int_equal(got.peak, want.peak);
    assert_int_equal(got.peak_total, want.peak_total);
    assert_int_equal(got.fits, want.fits);
    assert_int_equal(got.headroom, want.headroom);
}

/* A device (no runtime reserve) whose memory falls halfway between the
 * peaks of shapes (b1, t1) and (b2, t2). */
static void device_between(const ml_model *m, ml_config *c, uint64_t b1, uint64_t t1, uint64_t b2,
                           uint64_t t2)
{
    c->device.runtime_reserve = 0;
    c->device.budget = 0;
    const uint64_t lo = direct(m, c, b1, t1).peak_total, hi = direct(m, c, b2, t2).peak_total;
    assert_true(lo < hi);
    c->device.present = true;
    c->device.memory = lo + (hi - lo) / 2;
}

/* Padded random batches of 4 from {10 x .9, 64 x .1}: the median batch's
 * longest sample F(t) >= .5^(1/4) = .841 -> 10; P99: .99^(1/4) = .9975 ->
 * 64; worst 64. On a device between the two: every batch whose longest is
 * 10 fits, a batch with one 64 does not: P(over) = 1 - .9^4 = .3439. */
static void test_padded_fixed(void **state)
{
    (void)state;
    ml_model *m = load_str(decoder);
    ml_config c = config_allocated(m);
    ml_lengths *d = csv(two_lengths);
    ml_lengths_request req = ml_lengths_request_defaults();
    ml_lengths_result r;
    ml_error e;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    same_point(r.p50, direct(m, &c, 4, 10));
    same_point(r.p99, direct(m, &c, 4, 64));
    same_point(r.max, direct(m, &c, 4, 64));
    assert_true(isnan(r.p_over_budget)); /* no device */
    assert_int_equal(r.evaluations, 3);
    device_between(m, &c, 4, 10, 4, 64);
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_true(r.p50.fits);
    assert_false(r.max.fits);
    assert_rel_close(r.p_over_budget, 1 - 0.9 * 0.9 * 0.9 * 0.9, 1e-12);
    /* the longest that fits, and one more does not */
    assert_true(r.longest_fit >= 10 && r.longest_fit < 64);
    assert_true(direct(m, &c, 4, r.longest_fit).fits);
    assert_false(direct(m, &c, 4, r.longest_fit + 1).fits);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

/* A token budget of 256: a batch of 10-token samples holds floor(256/10) =
 * 25, one whose longest is 64 holds 4. The median sample (10) and the P99
 * (64) give those two shapes; the worst is the larger peak of the two. */
static void test_token_budget(void **state)
{
    (void)state;
    ml_model *m = load_str(decoder);
    ml_config c = config_allocated(m);
    ml_lengths *d = csv(two_lengths);
    ml_lengths_request req = ml_lengths_request_defaults();
    req.max_tokens = 256;
    ml_lengths_result r;
    ml_error e;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    ml_length_point a = direct(m, &c, 25, 10), b = direct(m, &c, 4, 64);
    same_point(r.p50, a);
    same_point(r.p99, b);
    same_point(r.max, a.peak > b.peak ? a : b);
    /* two ranges hold samples: (25, 10) and (4, 64); nothing else evaluated */
    assert_int_equal(r.evaluations, 4);
    /* a device between them: the larger one's samples are over */
    const ml_length_point lo = a.peak < b.peak ? a : b, hi = a.peak < b.peak ? b : a;
    device_between(m, &c, lo.micro_batch, lo.seq_len, hi.micro_batch, hi.seq_len);
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_rel_close(r.p_over_budget, hi.seq_len == 64 ? 0.1 : 0.9, 1e-12);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

/* The largest token budget whose worst batch fits: at N every batch fits,
 * at N + 1 one does not (checked through ml_lengths_plan). */
static void test_fit_tokens(void **state)
{
    (void)state;
    ml_model *m = load_str(decoder);
    ml_config c = config_allocated(m);
    ml_lengths *d = csv(two_lengths);
    ml_error e;
    uint64_t n = 0;
    unsigned evals = 0;
    assert_int_equal(ml_lengths_fit_tokens(m, &c, d, &n, &evals, &e), ML_USAGE); /* no device */
    /* room for 16 samples of 64 tokens but not 32 */
    device_between(m, &c, 16, 64, 32, 64);
    assert_int_equal(ml_lengths_fit_tokens(m, &c, d, &n, &evals, &e), ML_OK);
    assert_true(n >= 16 * 64 && n < 32 * 64);
    assert_true(evals > 0);
    ml_lengths_request req = ml_lengths_request_defaults();
    ml_lengths_result r;
    req.max_tokens = n;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_true(r.p_over_budget == 0);
    assert_true(r.max.fits);
    req.max_tokens = n + 1;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_true(r.p_over_budget > 0);
    /* nothing fits: 0 */
    c.device.memory = direct(m, &c, 1, 64).peak_total - 1;
    assert_int_equal(ml_lengths_fit_tokens(m, &c, d, &n, &evals, &e), ML_OK);
    assert_int_equal(n, 0);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

/* With the caching allocator simulated: the answer is at most the
 * allocated view's (the simulation only adds to the peak), every batch of
 * it fits, and one token more puts a batch over (the search ends on a
 * budget that fits beside one that does not). */
static void test_fit_tokens_simulated(void **state)
{
    (void)state;
    ml_model *m = load_str(decoder);
    ml_config c = ml_model_config(m);
    c.device.allocator = ML_ALLOCATOR_CACHING;
    ml_lengths *d = csv(two_lengths);
    ml_error e;
    device_between(m, &c, 16, 64, 32, 64);
    uint64_t n = 0, allocated = 0;
    unsigned evals = 0;
    assert_int_equal(ml_lengths_fit_tokens(m, &c, d, &n, &evals, &e), ML_OK);
    ml_config a = c;
    a.device.allocator = ML_ALLOCATOR_NONE;
    assert_int_equal(ml_lengths_fit_tokens(m, &a, d, &allocated, NULL, &e), ML_OK);
    assert_true(n >= 64 && n <= allocated);
    ml_lengths_request req = ml_lengths_request_defaults();
    ml_lengths_result r;
    req.max_tokens = n;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_true(r.max.fits && r.p_over_budget == 0);
    /* the search and its budget's plan in one call: the same budget, the
     * same rows as planning that budget on its own */
    ml_lengths_result both;
    uint64_t n2 = 0;
    assert_int_equal(ml_lengths_fit_tokens_plan(m, &c, d, &n2, &both, &e), ML_OK);
    assert_int_equal(n2, n);
    same_point(both.max, r.max);
    same_point(both.p50, r.p50);
    same_point(both.p99, r.p99);
    assert_true(both.p_over_budget == r.p_over_budget);
    assert_true(both.evaluations >= evals);
    req.max_tokens = n + 1;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_true(!r.max.fits || r.p_over_budget > 0);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

/* Two buckets of {10 x .9, 64 x .1}: the median is 10, so [10, 10] holds
 * .9 and [11, 64] .1; each bucket at its longest length. */
static void test_buckets_and_packed(void **state)
{
    (void)state;
    ml_model *m = load_str(decoder);
    ml_config c = config_allocated(m);
    ml_lengths *d = csv(two_lengths);
    ml_lengths_request req = ml_lengths_request_defaults();
    req.batching = ML_BATCHING_BUCKETED;
    req.buckets = 2;
    ml_lengths_result r;
    ml_error e;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_int_equal(r.nbuckets, 2);
    assert_int_equal(r.buckets[0].lo, 10);
    assert_int_equal(r.buckets[0].hi, 10);
    assert_rel_close(r.buckets[0].share, 0.9, 1e-12);
    assert_int_equal(r.buckets[1].lo, 11);
    assert_int_equal(r.buckets[1].hi, 64);
    assert_rel_close(r.buckets[1].share, 0.1, 1e-12);
    same_point(r.buckets[0].point, direct(m, &c, 4, 10));
    same_point(r.buckets[1].point, direct(m, &c, 4, 64));
    same_point(r.max, direct(m, &c, 4, 64));
    /* with a device: each bucket's micro-batch is fit's largest */
    device_between(m, &c, 16, 64, 17, 64);
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    assert_int_equal(r.buckets[1].point.micro_batch, 16);
    assert_true(r.buckets[0].point.micro_batch > 16);
    assert_true(r.p_over_budget == 0);
    /* packed: every batch is micro_batch rows of seq_len */
    req.batching = ML_BATCHING_PACKED;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_OK);
    same_point(r.max, direct(m, &c, 4, 64));
    same_point(r.p50, r.max);
    assert_true(r.p_over_budget == 0);
    req.buckets = 17;
    req.batching = ML_BATCHING_BUCKETED;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_RANGE);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

static void test_refusals(void **state)
{
    (void)state;
    ml_model *m = load_str(decoder);
    ml_config c = config_allocated(m);
    ml_lengths *d = csv("10\n65\n");
    ml_lengths_request req = ml_lengths_request_defaults();
    ml_lengths_result r;
    ml_error e;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "65 tokens, beyond the model's 64"));
    ml_lengths_destroy(d);
    ml_model_destroy(m);
    m = load_str("model:\n  type: sequential\n  input: [8]\n  layers:\n"
                 "    - linear: {out: 4}\n  loss: mse\n");
    c = config_allocated(m);
    d = csv("10\n");
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "no token sequence"));
    ml_lengths_destroy(d);
    ml_model_destroy(m);
    /* bounded work: budgets whose shortest samples exceed the micro-batch
     * limit, and budgets with more than 4,096 batch sizes to plan */
    m = load_str("model:\n  type: decoder\n  layers: 1\n  hidden: 8\n  heads: 1\n"
                 "  vocab: 10\n  position: rope\n");
    c = config_allocated(m);
    assert_int_equal(ml_lengths_parse_quantiles("p50=50,max=100000", &d, &e), ML_OK);
    req.max_tokens = (1ull << 24) + 1; /* the shortest sample has 1 token */
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "more than 16777216 samples"));
    req.max_tokens = 16000000; /* about 2 x 4,000 batch sizes over 1..100,000 */
    assert_int_equal(ml_lengths_plan(m, &c, d, &req, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "more than 4096 batch sizes"));
    assert_int_equal(r.evaluations, 0);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
    assert_string_equal(ml_batching_name(ML_BATCHING_BUCKETED), "bucketed");
    ml_batching b;
    assert_true(ml_batching_parse("packed", &b) && b == ML_BATCHING_PACKED);
    assert_false(ml_batching_parse("sorted", &b));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_csv_cdf_by_hand),  cmocka_unit_test(test_quantiles_by_hand),
        cmocka_unit_test(test_bad_input),        cmocka_unit_test(test_padded_fixed),
        cmocka_unit_test(test_token_budget),     cmocka_unit_test(test_fit_tokens),
        cmocka_unit_test(test_fit_tokens_simulated),
        cmocka_unit_test(test_buckets_and_packed), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
