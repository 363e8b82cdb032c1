/* triage under a length distribution (docs/lengths.md, "Triage"): the peak
 * triaged is the worst batch's, checked against a direct evaluation at that
 * shape; the token-budget remedy against ml_lengths_fit_tokens and
 * ml_lengths_plan at its budget; length-buckets against ml_lengths_plan
 * bucketed; which remedies apply; the ranking of a slowdown not derived. */
#include "harness.h"

/* A small decoder (eager attention, 64 positions) at micro-batch 8. */
static const char *dec =
    "name: dec\nmodel:\n  type: decoder\n  layers: 4\n  hidden: 64\n  heads: 4\n"
    "  vocab: 100\n  max_positions: 64\n  dropout: 0.1\n"
    "training:\n  micro_batch: 8\n  seq_len: 64\n  optimizer: adamw\n";

static ml_summary plan_at(const ml_model *m, const ml_config *c, uint64_t b, uint64_t t)
{
    ml_config v = *c;
    v.training.micro_batch = b;
    v.training.seq_len = t;
    ml_ledger *l = NULL;
    ml_error e;
    ml_status st = ml_ledger_evaluate(m, &v, false, &l, &e);
    if (st)
        fail_msg("evaluate: %s", e.msg);
    ml_summary s = *ml_ledger_summary(l);
    ml_ledger_destroy(l);
    return s;
}

static const ml_remedy *find(const ml_triage_result *r, ml_remedy_kind k)
{
    for (size_t i = 0; i < r->count; i++)
        if (r->remedies[i].kind == k)
            return &r->remedies[i];
    return NULL;
}

/* dec with a device whose budget is the peak at (8, 40), no reserve: the
 * worst batch (8, 64) does not fit. */
static ml_config with_device(const ml_model *m)
{
    ml_config c = ml_model_config(m);
    ml_summary s = plan_at(m, &c, 8, 40);
    c.device.present = true;
    c.device.memory = s.peak * 2;
    c.device.budget = s.peak;
    c.device.runtime_reserve = 0;
    c.device.blas_workspace = 0; /* a device of a few MiB: no cuBLAS workspaces */
    return c;
}

/* Lengths 1 to 64, median 16, P99 48. */
static ml_lengths *lengths(void)
{
    ml_lengths *d = NULL;
    ml_error e;
    if (ml_lengths_parse_quantiles("p50=16,p99=48,max=64", &d, &e))
        fail_msg("quantiles: %s", e.msg);
    return d;
}

static ml_triage_result *triage(const ml_model *m, const ml_config *c,
                                const ml_triage_request *req)
{
    ml_triage_result *r = malloc(sizeof *r);
    ml_error e;
    assert_non_null(r);
    ml_status st = ml_triage(m, c, req, r, &e);
    if (st)
        fail_msg("ml_triage: %s", e.msg);
    return r;
}

static void test_worst_batch_and_remedies(void **state)
{
    (void)state;
    ml_model *m = load_str(dec);
    ml_config c = with_device(m);
    ml_lengths *d = lengths();
    ml_error e;
    ml_triage_request req = ml_triage_request_defaults();
    req.lengths = d;
    ml_triage_result *r = triage(m, &c, &req);
    /* padded at micro-batch 8: the worst batch is 8 x the longest sample */
    assert_true(r->has_lengths);
    assert_int_equal(r->lengths.max.micro_batch, 8);
    assert_int_equal(r->lengths.max.seq_len, 64);
    ml_summary s = plan_at(m, &c, 8, 64);
    assert_int_equal(r->current.peak_total, s.peak_total);
    assert_false(r->current.fits);
    /* the token budget: fit --max-tokens auto's, planned at that budget */
    uint64_t n = 0;
    assert_int_equal(ml_lengths_fit_tokens(m, &c, d, &n, NULL, &e), ML_OK);
    assert_true(n > 0);
    const ml_remedy *tb = find(r, ML_REMEDY_TOKEN_BUDGET);
    assert_non_null(tb);
    assert_int_equal(tb->batching.max_tokens, n);
    ml_lengths_request lq = ml_lengths_request_defaults();
    lq.max_tokens = n;
    ml_lengths_result lr;
    assert_int_equal(ml_lengths_plan(m, &c, d, &lq, &lr, &e), ML_OK);
    assert_int_equal(tb->peak, lr.max.peak);
    assert_int_equal(tb->peak_total, lr.max.peak_total);
    assert_true(tb->fits);
    assert_true(tb->step_time_s < 0 && tb->flops_ratio < 0 && tb->slowdown < 0);
    char want[64];
    snprintf(want, sizeof want, "--max-tokens %llu", (unsigned long long)n);
    assert_string_equal(tb->flags, want);
    /* the buckets: ml_lengths_plan bucketed, 4 by default */
    const ml_remedy *bk = find(r, ML_REMEDY_LENGTH_BUCKETS);
    assert_non_null(bk);
    assert_int_equal(bk->batching.batching, ML_BATCHING_BUCKETED);
    assert_int_equal(bk->batching.buckets, 4);
    assert_int_equal(ml_lengths_plan(m, &c, d, &bk->batching, &lr, &e), ML_OK);
    assert_int_equal(bk->peak_total, lr.max.peak_total);
    assert_true(bk->fits == (lr.p_over_budget == 0));
    /* the micro-batch remedy still applies (a fixed micro-batch) */
    assert_non_null(find(r, ML_REMEDY_MICRO_BATCH));
    /* a slowdown not derived ranks after every known one among those that fit */
    for (size_t i = 1; i < r->count; i++)
        if (r->remedies[i].fits && r->remedies[i - 1].fits)
            assert_false(r->remedies[i - 1].slowdown < 0 && r->remedies[i].slowdown >= 0);
    free(r);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

/* Where the worst batch's own plan runs out of the device in the allocator
 * simulation, its device total stops where it ran out, below what it
 * needs: the AG News classifier at micro-batch 85 over its token lengths
 * (models/lengths/agnews-tokens.csv, padded to 256 at worst) on 3 GiB
 * (memledger plan models/agnews-classifier.yaml --seq-len 256
 * --micro-batch 85 --device 3GiB: out of the device). The token budget and
 * the buckets fit, with higher totals, and are listed: a remedy that fits
 * such a plan is one whatever its total. */
static void test_remedies_for_a_worst_batch_that_runs_out(void **state)
{
    (void)state;
    ml_model *m = load_preset("agnews-classifier");
    const ml_config c = config_on_device(m, 3ull << 30, 85);
    ml_lengths *d = NULL;
    ml_error e;
    assert_int_equal(ml_lengths_load(ML_MODELS_DIR "/lengths/agnews-tokens.csv", &d, &e), ML_OK);
    ml_triage_request req = ml_triage_request_defaults();
    req.lengths = d;
    ml_triage_result *r = triage(m, &c, &req);
    assert_int_equal(r->lengths.max.seq_len, 256);
    assert_true(r->current.reserved_oom);
    const ml_remedy *ks[2] = {find(r, ML_REMEDY_TOKEN_BUDGET), find(r, ML_REMEDY_LENGTH_BUCKETS)};
    for (int i = 0; i < 2; i++) {
        assert_non_null(ks[i]);
        assert_true(ks[i]->fits);
        assert_true(ks[i]->peak_total > r->current.peak_total);
    }
    free(r);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

static void test_applicability(void **state)
{
    (void)state;
    ml_model *m = load_str(dec);
    ml_config c = with_device(m);
    ml_lengths *d = lengths();
    ml_error e;
    ml_triage_request req = ml_triage_request_defaults();
    /* without lengths: neither */
    ml_triage_result *r = triage(m, &c, &req);
    assert_false(r->has_lengths);
    assert_null(find(r, ML_REMEDY_TOKEN_BUDGET));
    assert_null(find(r, ML_REMEDY_LENGTH_BUCKETS));
    free(r);
    /* a token budget too large: the micro-batch varies, so no micro-batch
     * remedy; the triaged shape is the budget's worst batch */
    req.lengths = d;
    req.batching.max_tokens = 8 * 64;
    r = triage(m, &c, &req);
    ml_lengths_result lr;
    assert_int_equal(ml_lengths_plan(m, &c, d, &req.batching, &lr, &e), ML_OK);
    assert_int_equal(r->current.peak_total, lr.max.peak_total);
    assert_null(find(r, ML_REMEDY_MICRO_BATCH));
    free(r);
    /* packed and bucketed: neither lengths remedy */
    req.batching = ml_lengths_request_defaults();
    req.batching.batching = ML_BATCHING_PACKED;
    r = triage(m, &c, &req);
    assert_null(find(r, ML_REMEDY_TOKEN_BUDGET));
    assert_null(find(r, ML_REMEDY_LENGTH_BUCKETS));
    assert_int_equal(r->lengths.max.seq_len, 64);
    free(r);
    req.batching.batching = ML_BATCHING_BUCKETED;
    r = triage(m, &c, &req);
    assert_null(find(r, ML_REMEDY_TOKEN_BUDGET));
    assert_null(find(r, ML_REMEDY_LENGTH_BUCKETS));
    assert_null(find(r, ML_REMEDY_MICRO_BATCH));
    free(r);
    /* no device: no token budget (it needs one) */
    req.batching = ml_lengths_request_defaults();
    c.device.present = false;
    r = triage(m, &c, &req);
    assert_null(find(r, ML_REMEDY_TOKEN_BUDGET));
    free(r);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

static void test_errors(void **state)
{
    (void)state;
    ml_model *m = load_str("name: mlp\nmodel:\n  type: sequential\n  input: [8]\n  layers:\n"
                           "    - linear: {out: 4}\n  loss: mse\ntraining:\n  micro_batch: 4\n");
    ml_config c = ml_model_config(m);
    ml_lengths *d = NULL;
    ml_error e;
    assert_int_equal(ml_lengths_parse_quantiles("p50=4,max=8", &d, &e), ML_OK);
    ml_triage_request req = ml_triage_request_defaults();
    req.lengths = d;
    ml_triage_result *r = calloc(1, sizeof *r);
    assert_non_null(r);
    assert_int_equal(ml_triage(m, &c, &req, r, &e), ML_USAGE);
    assert_int_equal(r->count, 0);
    free(r);
    ml_lengths_destroy(d);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_worst_batch_and_remedies),
        cmocka_unit_test(test_applicability),
        cmocka_unit_test(test_remedies_for_a_worst_batch_that_runs_out),
        cmocka_unit_test(test_errors),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
