/* fit and compare: monotonicity, exactness of the search, accumulation
 * arithmetic, the no-fit explanation, the comparison table. */
#include "harness.h"
#include "ledger/planner.h" /* ml__planner_evaluate_with, the simulation memo */

/* The search relies on the peak never decreasing with the micro-batch for a
 * fixed plan. Every tensor's size is non-decreasing in B, and the schedule
 * does not depend on B; checked here on every preset and policy. */
static void test_peak_monotone_in_micro_batch(void **state)
{
    (void)state;
    const char *presets[] = {"mlp2",       "cifar10-resnet", "agnews-classifier", "gpt2-small",
                             "llama-3-8b", "vit-b16",        "video-tokens"};
    const char *pols[] = {"none", "full", "every-2", "selective", "[0]"};
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
        ml_model *m = load_preset(presets[p]);
        for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
            ml_config c = config_allocated(m);
            ml_parse_checkpoint(pols[k], &c.training.checkpoint, NULL);
            c.training.seq_len = c.training.seq_len > 2048 ? 2048 : c.training.seq_len;
            uint64_t prev = 0;
            for (uint64_t b = 1; b <= 24; b++) {
                c.training.micro_batch = b;
                ml_ledger *l = eval(m, &c, false);
                uint64_t pk = ml_ledger_summary(l)->peak;
                if (pk < prev)
                    fail_msg("%s/%s: peak %llu at B=%llu below %llu at B-1", presets[p], pols[k],
                             (unsigned long long)pk, (unsigned long long)b,
                             (unsigned long long)prev);
                prev = pk;
                ml_ledger_destroy(l);
            }
        }
        ml_model_destroy(m);
    }
}

static bool fits_at(const ml_model *m, ml_config c, uint64_t b)
{
    c.training.micro_batch = b;
    ml_ledger *l = eval(m, &c, false);
    bool f = ml_ledger_summary(l)->fits;
    ml_ledger_destroy(l);
    return f;
}

/* With the allocator simulated (the default) the answer is at most the
 * allocated view's (a plan that fits with its cache fits without it), its
 * plan fits with the simulation, and the micro-batch above it does not
 * (gpt2-small and agnews-classifier on 24 GiB, away from the device's
 * capacity where the simulated verdict is monotone; docs/allocator.md). */
static void test_fit_simulated_below_allocated(void **state)
{
    (void)state;
    static const char *const presets[] = {"gpt2-small", "agnews-classifier"};
    for (size_t p = 0; p < 2; p++) {
        ml_model *m = load_preset(presets[p]);
        ml_config c = ml_model_config(m);
        assert_int_equal(c.device.allocator, ML_ALLOCATOR_CACHING);
        c.device.present = true;
        c.device.memory = 24ull << 30;
        c.device.budget = 0;
        ml_fit_request req = ml_fit_request_defaults();
        ml_fit_result sim, none;
        ml_error e;
        assert_int_equal(ml_fit(m, &c, &req, &sim, &e), ML_OK);
        ml_config a = c;
        a.device.allocator = ML_ALLOCATOR_NONE;
        assert_int_equal(ml_fit(m, &a, &req, &none, &e), ML_OK);
        assert_true(sim.fits && none.fits);
        assert_true(sim.max_micro_batch <= none.max_micro_batch);
        for (uint64_t b = sim.max_micro_batch; b <= sim.max_micro_batch + 1; b++) {
            c.training.micro_batch = b;
            ml_ledger *l = eval(m, &c, false);
            assert_int_equal(ml_ledger_summary(l)->fits, b == sim.max_micro_batch);
            ml_ledger_destroy(l);
        }
        ml_model_destroy(m);
    }
}

/* mlp2 on 8 GiB with a 6.5 GiB budget. From the rules of docs/ledger.md the
 * peak is max(400,000,000 + 12,000 B, 280,000,000 + 136,000 B, 320,000,000 +
 * 52,000 B): the step (params, states, grads, foreach's 80M temporary, y
 * and the batch); the second linear's node (MmBackward0: params 80M +
 * states 160M + W2's gradient 40M, with the batch the loop holds, x and the
 * mse target (4,000 B each), z1 (40,000 B) and a (40,000 B) saved, the
 * model output y (4,000 B) the loop holds (logits: kept), y's gradient
 * 4,000 B and a's 40,000 B); the first linear's (W1's gradient 40M on top,
 * a and y's gradient gone, z1's 40,000 B). 280M + 136,000 B <=
 * 6,979,321,856 gives B = 49,259. A loop that releases y once the loss is
 * computed (mse saved it until its backward) drops the 4,000 B: 280M +
 * 132,000 B gives B = 50,752. */
static void test_fit_mlp2_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = config_allocated(m);
    ml_fit_request req = ml_fit_request_defaults();
    ml_fit_result r;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_true(r.fits);
    assert_int_equal(r.max_micro_batch, 49259);
    assert_int_equal(r.micro_batch, 49259);
    assert_int_equal(r.grad_accum, 1);
    assert_int_equal(r.peak_total, 280000000ull + 136000ull * 49259 + 536870912ull);
    assert_true(fits_at(m, c, 49259));
    assert_false(fits_at(m, c, 49260));
    assert_true(r.evaluations < 64); /* doubling then bisection */
    assert_false(r.at_search_limit);
    /* the search's upper end: found at 1,000 says so; at 49,260 the device
     * stops it first (49,259); a global batch of 1,000 is no search limit */
    req.max_micro_batch = 1000;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 1000);
    assert_true(r.at_search_limit);
    req.max_micro_batch = 49260;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 49259);
    assert_false(r.at_search_limit);
    req = ml_fit_request_defaults();
    req.global_batch = 1000;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 1000);
    assert_false(r.at_search_limit);
    req = ml_fit_request_defaults();
    c.training.logits = ML_LOGITS_RELEASED;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 50752);
    assert_int_equal(r.peak_total, 280000000ull + 132000ull * 50752 + 536870912ull);
    ml_model_destroy(m);
}

/* The design notes: micro-batch 16 with 4 accumulation steps reaches 64;
 * 2 devices x 16 x 2 too. */
static void test_accumulation_arithmetic(void **state)
{
    (void)state;
    ml_model *m = load_preset("mlp2");
    ml_config c = config_allocated(m);
    ml_fit_request req = ml_fit_request_defaults();
    req.global_batch = 64;
    req.max_micro_batch = 16;
    ml_fit_result r;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 16);
    assert_int_equal(r.grad_accum, 4);
    assert_int_equal(r.effective_batch, 64);
    assert_true(r.exact);
    c.training.data_parallel = 2;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 16);
    assert_int_equal(r.grad_accum, 2);
    assert_int_equal(r.data_parallel, 2);
    assert_int_equal(r.effective_batch, 64);
    /* 60 over 2 devices is 30 each: 15 divides it, 16 does not */
    req.global_batch = 60;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 15);
    assert_int_equal(r.grad_accum, 2);
    assert_int_equal(r.effective_batch, 60);
    assert_true(r.exact);
    /* 63 over 2 devices cannot be exact: 16 x 2 x 2 = 64, said so */
    req.global_batch = 63;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_false(r.exact);
    assert_int_equal(r.effective_batch, 64);
    assert_non_null(strstr(r.note, "effective batch becomes 64"));
    /* a whole per-device batch that fits needs no accumulation */
    req.global_batch = 8;
    req.max_micro_batch = 65536;
    c.training.data_parallel = 1;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 8);
    assert_int_equal(r.grad_accum, 1);
    ml_model_destroy(m);
}

static void test_no_fit_explains(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-2-7b");
    ml_config c = config_allocated(m); /* 80 GiB, bf16-master AdamW: 16 B/param > 80 GiB */
    ml_fit_request req = ml_fit_request_defaults();
    ml_fit_result r;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_false(r.fits);
    assert_non_null(strstr(r.note, "model states alone need"));
    assert_non_null(strstr(r.note, "checkpointing cannot help"));
    /* 6.74e9 x 16 B over N devices plus activations must fit 79 GiB: N = 2 */
    assert_non_null(strstr(r.note, "shard (ZeRO-3) across 2 devices"));
    /* pure bf16 AdamW: 6.74e9 x 8 B = 50.2 GiB fits 79 GiB; offloading the
     * optimizer leaves 4 B/param on the device */
    assert_non_null(strstr(r.note, "training.precision bf16"));
    assert_non_null(strstr(r.note, "training.offload optimizer"));
    /* already bf16 and sharded 1,024 ways on a 1 GiB device (50.2 MiB of
     * states each; ZeRO-3's gathered blocks do not fit 768 MiB): no remedy
     * that is already in place (bf16, ZeRO-3 over 2 devices), no device
     * count at or below the run's */
    c.training.precision = ML_PREC_BF16;
    c.training.zero = 3;
    c.training.data_parallel = 1024;
    c.device.memory = 1ull << 30;
    c.device.runtime_reserve = 256ull << 20;
    c.device.budget = 0;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_false(r.fits);
    assert_null(strstr(r.note, "bf16"));
    assert_null(strstr(r.note, "across 2 devices"));
    assert_null(strstr(r.note, "across 1024 devices"));
    assert_non_null(strstr(r.note, "no single change makes it fit"));
    /* no device: a usage error */
    c.device.present = false;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_USAGE);
    ml_model_destroy(m);
}

/* A global batch that does not split evenly over the devices: the
 * per-device share rounded up, 90 over 8 devices -> ceil(90 / 8) = 12,
 * then the largest divisor of 12 up to the largest micro-batch (7, by
 * --max-micro-batch on 80 GiB, where 7 fits): 6 x 2 steps x 8 devices =
 * 96, the smallest even split above 90. It had taken micro-batch 7 and
 * ceil(12 / 7) = 2 steps: 112. */
static void test_uneven_global_batch(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    c.device.memory = 80ull << 30;
    c.device.budget = 0;
    c.training.data_parallel = 8;
    ml_fit_request req = ml_fit_request_defaults();
    req.global_batch = 90;
    req.max_micro_batch = 7;
    ml_fit_result r;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_true(r.fits);
    assert_int_equal(r.max_micro_batch, 7);
    assert_int_equal(r.micro_batch, 6);
    assert_int_equal(r.grad_accum, 2);
    assert_int_equal(r.effective_batch, 96);
    assert_false(r.exact);
    assert_non_null(strstr(r.note, "does not split evenly over 8 devices"));
    /* 100 over 8: ceil(100 / 8) = 13, a prime: micro-batch 1 x 13 = 104,
     * and the note still says 7 fits (7 x ceil(13 / 7) = 14 a device:
     * 112 in all) */
    req.global_batch = 100;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 1);
    assert_int_equal(r.effective_batch, 104);
    assert_non_null(strstr(r.note, "does not split evenly over 8 devices"));
    assert_non_null(strstr(r.note, "micro-batch 7 x 2 steps would fit too but makes the "
                                   "effective batch 112"));
    ml_model_destroy(m);
}

/* Each remedy the explanation names holds for the run asked about, its
 * accumulation included: Llama-2-7B's file accumulates 16 steps (the
 * gradients stay resident across micro-batches) with the caching allocator
 * on 16 GiB. The sharding named, applied with full checkpointing at
 * micro-batch 1, fits; half as many devices do not (the fewest, in powers
 * of two). The explanation had planned micro-batch 1 without accumulation,
 * where 32 devices fit, and named them. */
static void test_no_fit_remedies_hold(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-2-7b");
    ml_config c = ml_model_config(m);
    ml_error e;
    assert_int_equal(ml_config_set(&c, "device.memory", "16GiB", &e), ML_OK);
    assert_true(c.training.grad_accum > 1 && c.device.allocator == ML_ALLOCATOR_CACHING);
    ml_fit_request req = ml_fit_request_defaults();
    ml_fit_result r;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_false(r.fits);
    const char *at = strstr(r.note, "shard (ZeRO-3) across ");
    assert_non_null(at);
    unsigned long long n = strtoull(at + strlen("shard (ZeRO-3) across "), NULL, 10);
    assert_true(n >= 2 && (n & (n - 1)) == 0);
    for (int half = 0; half < 2; half++) {
        ml_config x = c;
        x.training.zero = 3;
        x.training.data_parallel = half ? n / 2 : n;
        x.training.micro_batch = 1;
        x.training.checkpoint.kind = ML_CKPT_FULL;
        ml_ledger *l = NULL;
        assert_int_equal(ml_ledger_evaluate(m, &x, false, &l, &e), ML_OK);
        if (ml_ledger_summary(l)->fits != !half)
            fail_msg("%llu devices (the note: %s) %s", half ? n / 2 : n, r.note,
                     half ? "fit too" : "do not fit");
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

/* auto picks the cheapest policy among those reaching the largest micro-batch. */
static void test_auto_checkpoint(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    c.device.memory = 8ull << 30;
    c.device.budget = 6979321856ull;
    ml_fit_request req = ml_fit_request_defaults();
    req.auto_checkpoint = true;
    ml_fit_result a, f;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &a, &e), ML_OK);
    assert_true(a.fits);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    req.auto_checkpoint = false;
    assert_int_equal(ml_fit(m, &c, &req, &f, &e), ML_OK);
    assert_true(a.micro_batch >= f.micro_batch);
    if (a.micro_batch == f.micro_batch)
        assert_true(a.flops_recompute <= f.flops_recompute);
    ml_model_destroy(m);
}

/* With the cache simulated, auto passes over a policy that cannot beat the
 * best so far even without its cache; its choice must be the one each
 * policy's own fit gives: the largest micro-batch, then the least
 * recompute, then the first in the table. gpt2-small, amp-bf16, global
 * batch 64, on devices from 6 to 24 GiB and both simulated allocators. */
static void test_auto_as_each_policy(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    size_t ncand = 0;
    const ml_checkpoint_candidate *cands = ml_checkpoint_candidates(&ncand);
    const ml_allocator allocs[] = {ML_ALLOCATOR_CACHING, ML_ALLOCATOR_EXPANDABLE};
    unsigned kinds = 0;
    for (size_t k = 0; k < 2; k++)
        for (uint64_t gib = 6; gib <= 24; gib += 3) {
            ml_config c = config_allocated(m);
            c.training.precision = ML_PREC_AMP_BF16;
            c.device.memory = gib << 30;
            c.device.budget = 0;
            c.device.allocator = allocs[k];
            ml_fit_request req = ml_fit_request_defaults();
            req.global_batch = 64;
            ml_fit_result want, r;
            memset(&want, 0, sizeof want);
            ml_error e;
            for (size_t i = 0; i < ncand; i++) {
                ml_parse_checkpoint(cands[i].name, &c.training.checkpoint, NULL);
                assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
                if (r.max_micro_batch &&
                    (!want.max_micro_batch || r.micro_batch > want.micro_batch ||
                     (r.micro_batch == want.micro_batch &&
                      r.flops_recompute < want.flops_recompute)))
                    want = r;
            }
            req.auto_checkpoint = true;
            assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
            assert_int_equal(r.max_micro_batch, want.max_micro_batch);
            assert_int_equal(r.micro_batch, want.micro_batch);
            assert_int_equal(r.grad_accum, want.grad_accum);
            assert_int_equal(r.peak_total, want.peak_total);
            assert_string_equal(r.plan, want.plan);
            assert_true(r.flops_recompute == want.flops_recompute);
            assert_int_equal(r.checkpoint.kind, want.checkpoint.kind);
            kinds |= 1u << r.checkpoint.kind;
        }
    /* the sweep moves the answer between policies */
    assert_true(__builtin_popcount(kinds) >= 2);
    ml_model_destroy(m);
}

static void test_compare_rows(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    ml_compare_row rows[ML_COMPARE_ROWS];
    size_t n = 0;
    ml_error e;
    assert_int_equal(ml_compare(m, &c, rows, &n, &e), ML_OK);
    assert_int_equal(n, 7);
    const char *want[] = {"none", "full", "every-2", "every-4", "sqrt", "selective", "optimal"};
    for (size_t i = 0; i < n; i++) {
        char name[32];
        ml_checkpoint_format(&rows[i].checkpoint, name, sizeof name);
        assert_string_equal(name, want[i]);
    }
    assert_rel_close(rows[0].flops_recompute, 0, 0);
    /* full recomputes the twelve blocks' forward: 12 x 141.73 GFLOP at B=8 */
    ml_ledger *l = eval(m, &c, false);
    double blocks = 0;
    for (size_t i = 0; i < ml_ledger_block_count(l); i++)
        if (strncmp(ml_ledger_block(l, i)->name, "block.", 6) == 0)
            blocks += ml_ledger_block(l, i)->flops_forward;
    assert_rel_close(rows[1].flops_recompute, blocks, 1e-12);
    assert_rel_close(rows[1].recompute_pct, 100 * blocks / rows[0].flops_total, 1e-12);
    assert_true(rows[1].peak_total < rows[0].peak_total);
    ml_ledger_destroy(l);
    /* without a device: no optimal row, no verdicts */
    c.device.present = false;
    assert_int_equal(ml_compare(m, &c, rows, &n, &e), ML_OK);
    assert_int_equal(n, 6);
    assert_false(rows[0].has_device);
    ml_model_destroy(m);
}

/* The advice for a policy whose recompute buys memory the run does not
 * need: the fitting policy with the least recompute, or none. gpt2-small at
 * B=8, T=1024 (compare's figures, docs/choosing.md): peak totals none
 * 22.86 GiB, selective 12.72 GiB, full and every-K 8.2-9.5 GiB, all of
 * those recomputing the same twelve block forwards. */
static void test_advice(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    ml_error e;
    ml_advice a;
    ml_ledger *l = NULL;
    /* 24 GiB: none fits, so full's recompute is not needed */
    c.device.present = true;
    c.device.memory = 24ull << 30;
    c.device.budget = 0;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_OK);
    assert_int_equal(ml_checkpoint_advice(m, &c, ml_ledger_summary(l), &a, &e), ML_OK);
    assert_true(a.cheaper_fits);
    assert_int_equal(a.row.checkpoint.kind, ML_CKPT_NONE);
    assert_rel_close(a.row.flops_recompute, 0, 0);
    ml_ledger_destroy(l);
    /* 16 GiB: none does not fit, selective does and recomputes only the
     * attention core */
    c.device.memory = 16ull << 30;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_OK);
    assert_int_equal(ml_checkpoint_advice(m, &c, ml_ledger_summary(l), &a, &e), ML_OK);
    assert_true(a.cheaper_fits);
    assert_int_equal(a.row.checkpoint.kind, ML_CKPT_SELECTIVE);
    assert_true(a.row.flops_recompute > 0);
    assert_true(a.row.flops_recompute < ml_ledger_summary(l)->flops_recompute);
    ml_ledger_destroy(l);
    /* 10 GiB: the segment policies recompute as much as full; optimal
     * leaves a block out of its segments and fits with less */
    c.device.memory = 10ull << 30;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_OK);
    assert_true(ml_ledger_summary(l)->fits);
    assert_int_equal(ml_checkpoint_advice(m, &c, ml_ledger_summary(l), &a, &e), ML_OK);
    assert_true(a.cheaper_fits);
    assert_int_equal(a.row.checkpoint.kind, ML_CKPT_OPTIMAL);
    assert_true(a.row.flops_recompute < ml_ledger_summary(l)->flops_recompute);
    ml_ledger_destroy(l);
    /* optimal itself gets no advice: it is the least recompute that fits */
    c.training.checkpoint.kind = ML_CKPT_OPTIMAL;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_OK);
    assert_int_equal(ml_checkpoint_advice(m, &c, ml_ledger_summary(l), &a, &e), ML_OK);
    assert_false(a.cheaper_fits);
    ml_ledger_destroy(l);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    /* no device: no verdict, no advice */
    c.device.present = false;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_OK);
    assert_int_equal(ml_checkpoint_advice(m, &c, ml_ledger_summary(l), &a, &e), ML_OK);
    assert_false(a.cheaper_fits);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* With the cache simulated the advice plans each candidate without it
 * first and simulates only those that could be the answer; it must be the
 * answer ml_compare's rows give (the fitting row with the least recompute
 * below the plan's, the first of equals). gpt2-small at B=8 over devices
 * from 8 to 24 GiB, where the answer moves from none to selective, optimal
 * and no advice at all, for three policies and both simulated allocators. */
static void test_advice_as_compare(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    const char *pols[] = {"full", "every-2", "selective"};
    const ml_allocator allocs[] = {ML_ALLOCATOR_CACHING, ML_ALLOCATOR_EXPANDABLE};
    unsigned kinds_seen = 0, none_seen = 0;
    for (size_t p = 0; p < 3; p++)
        for (size_t k = 0; k < 2; k++)
            for (uint64_t gib = 8; gib <= 24; gib += 2) {
                ml_config c = config_allocated(m);
                ml_parse_checkpoint(pols[p], &c.training.checkpoint, NULL);
                c.device.present = true;
                c.device.memory = gib << 30;
                c.device.budget = 0;
                c.device.allocator = allocs[k];
                ml_error e;
                ml_ledger *l = eval(m, &c, false);
                const ml_summary *s = ml_ledger_summary(l);
                ml_compare_row rows[ML_COMPARE_ROWS];
                size_t n = 0;
                assert_int_equal(ml_compare(m, &c, rows, &n, &e), ML_OK);
                int want = -1;
                for (size_t i = 0; s->fits && s->flops_recompute > 0 && i < n; i++)
                    if (rows[i].fits && rows[i].flops_recompute < s->flops_recompute &&
                        (want < 0 || rows[i].flops_recompute < rows[want].flops_recompute))
                        want = (int)i;
                ml_advice a;
                assert_int_equal(ml_checkpoint_advice(m, &c, s, &a, &e), ML_OK);
                assert_int_equal(a.cheaper_fits, want >= 0);
                if (want >= 0) {
                    assert_int_equal(a.row.checkpoint.kind, rows[want].checkpoint.kind);
                    assert_string_equal(a.row.plan, rows[want].plan);
                    assert_int_equal(a.row.peak_total, rows[want].peak_total);
                    assert_rel_close(a.row.flops_recompute, rows[want].flops_recompute, 0);
                    assert_rel_close(a.row.recompute_pct, rows[want].recompute_pct, 0);
                    kinds_seen |= 1u << a.row.checkpoint.kind;
                } else {
                    none_seen++;
                }
                ml_ledger_destroy(l);
            }
    /* the sweep reaches the answers it is meant to cover */
    assert_true(kinds_seen & (1u << ML_CKPT_NONE));
    assert_true(kinds_seen & (1u << ML_CKPT_SELECTIVE));
    assert_true(kinds_seen & (1u << ML_CKPT_OPTIMAL));
    assert_true(none_seen > 0);
    ml_model_destroy(m);
}

/* An evaluation pass that does not fit is named as what does not fit (the
 * note advised shortening seq_len, which the training did not need).
 * GPT-2 small (fp32 AdamW, T = 1,024, V = 50,257) on 8 GiB with a 6.5 GiB
 * budget and --eval-batch 32. During the pass the resident state is the
 * parameters and Adam's two states, 124,439,808 x 12 B = 1,493,277,696 B;
 * per evaluation sample the loss holds the logits and their log-softmax,
 * 2 x 1,024 x 50,257 x 4 B = 411,705,344 B, and the batch 1,024 x 16 B
 * (ids and targets, int64): 411,721,728 B. The budget admits
 * (6,979,321,856 - 1,493,277,696) / 411,721,728 = 13.32 samples: 13 (the
 * few KiB of the loss's scalars do not change the floor); at 32 the pass
 * needs 1,493,277,696 + 32 x 411,721,728 = 14,668,372,992 B and more, over
 * 13.6 GiB. The training iteration alone fits at micro-batch 1 (asserted
 * below). */
static void test_fit_eval_binds(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    c.device.memory = 8ull << 30;
    c.device.budget = 6979321856ull; /* 6.5 GiB */
    c.training.eval_batch = 32;
    ml_fit_request req = ml_fit_request_defaults();
    ml_fit_result r;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_false(r.fits);
    assert_non_null(strstr(r.note, "the evaluation pass does not fit: at evaluation batch 32"));
    assert_non_null(strstr(r.note, "largest evaluation batch that fits is 13 "));
    assert_null(strstr(r.note, "seq_len"));
    /* the figure against direct evaluations at micro-batch 1 */
    c.training.micro_batch = 1;
    c.training.eval_batch = 13;
    assert_true(fits_at(m, c, 1));
    c.training.eval_batch = 14;
    assert_false(fits_at(m, c, 1));
    c.training.eval_batch = 0;
    assert_true(fits_at(m, c, 1));
    /* with an evaluation batch that fits, fit answers as without it */
    c.training.eval_batch = 13;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_true(r.fits);
    ml_model_destroy(m);
}

/* A model whose byte counts exceed 64 bits at micro-batch 1: the note says
 * so (it said only "even micro-batch 1 does not fit", and the ZeRO-3 advice
 * was skipped for the same reason, silently). */
static void test_no_fit_overflow(void **state)
{
    (void)state;
    /* parameters alone: 100,000 layers x 2 x 2^20 x 2^24 x 4 B = 2^63.6 */
    ml_model *m = load_str("model:\n  type: decoder\n  layers: 100000\n  hidden: 1048576\n"
                           "  heads: 1\n  ffn: 16777216\n  vocab: 10\n  position: none\n"
                           "training:\n  seq_len: 1\ndevice:\n  memory: 80GiB\n");
    ml_config c = config_allocated(m);
    ml_fit_request req = ml_fit_request_defaults();
    ml_fit_result r;
    ml_error e;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_false(r.fits);
    assert_non_null(strstr(r.note, "even micro-batch 1 cannot be planned"));
    assert_non_null(strstr(r.note, "exceed 64 bits"));
    assert_non_null(strstr(r.note, "whatever the device"));
    ml_model_destroy(m);
}

/* A global batch needing more than 2^20 accumulation steps (training.grad_
 * accum's limit) is refused naming the global batch and its limit here (it
 * blamed training.grad_accum, which nobody gave). gpt2-small on 80 GiB
 * (budget 79.5 GiB): the largest micro-batch is 29 without checkpointing,
 * so the limit is 29 x 2^20 = 30,408,704 on one device. */
static void test_global_batch_limit(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    c.device.memory = 80ull << 30;
    c.device.budget = 0;
    ml_fit_request req = ml_fit_request_defaults();
    ml_fit_result r;
    ml_error e;
    req.global_batch = 1ull << 40;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_RANGE);
    /* the library names the request field; the CLI turns it into the flag */
    assert_non_null(strstr(e.msg, "global_batch 1099511627776"));
    assert_null(strstr(e.msg, "--"));
    assert_non_null(strstr(e.msg, "micro-batch 29"));
    assert_non_null(strstr(e.msg, "at most 30408704"));
    assert_null(strstr(e.msg, "must be between"));
    /* auto: every policy passes over it; the message of the largest
     * micro-batch (the highest limit) stands */
    req.auto_checkpoint = true;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_RANGE);
    /* the library names the request field; the CLI turns it into the flag */
    assert_non_null(strstr(e.msg, "global_batch 1099511627776"));
    assert_null(strstr(e.msg, "--"));
    req.auto_checkpoint = false;
    /* at the limit: 29 x 1,048,576 steps */
    req.global_batch = 30408704;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 29);
    assert_int_equal(r.grad_accum, 1048576);
    assert_true(r.exact);
    req.global_batch = 30408705;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "needs 1048577 accumulation steps"));
    /* 30,408,703 = 13 x 2,339,131 (prime): its largest divisor up to 29, 13,
     * needs 2,339,131 steps, past 2^20; 29 x 1,048,576 steps gives
     * 30,408,704 (not exact) */
    req.global_batch = 30408703;
    assert_int_equal(ml_fit(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.micro_batch, 29);
    assert_int_equal(r.grad_accum, 1048576);
    assert_false(r.exact);
    assert_non_null(strstr(r.note, "no micro-batch up to 29 divides 30408703"));
    ml_model_destroy(m);
}

/* The reserved figures of c through planner p with memo (memo NULL: a
 * simulation of its own), into out[3]: peak, first and steady. */
static void reserved_of(ml_planner *p, const ml_config *c, ml_reserved_memo *memo, uint64_t *out)
{
    ml_ledger *l = NULL;
    ml_error e;
    if (ml__planner_evaluate_with(p, c, false, memo, &l, &e) != ML_OK)
        fail_msg("evaluate failed: %s", e.msg);
    const ml_summary *x = ml_ledger_summary(l);
    assert_true(x->has_reserved);
    out[0] = x->reserved_peak;
    out[1] = x->reserved_first;
    out[2] = x->reserved_steady;
    ml_ledger_destroy(l);
}

/* fit's memo of simulations (one search's): a config it has simulated is
 * answered from it only when the simulation would be the same one, so a
 * key that left out the micro-batch or the accumulation would answer a
 * larger plan with a smaller one's figures (each is held here against a
 * simulation of its own); a policy that comes to the same segments (every
 * block its own segment: full and every-1) is simulated once. */
static void test_fit_memo_keys(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_planner *p = NULL;
    assert_int_equal(ml_planner_create(m, &p, NULL), ML_OK);
    ml_config a = ml_model_config(m);
    a.device.present = true;
    a.device.memory = 24ull << 30;
    a.training.micro_batch = 2;
    assert_int_equal(ml_parse_checkpoint("full", &a.training.checkpoint, NULL), ML_OK);
    ml_config b = a, d = a, f = a;
    b.training.micro_batch = 3;
    d.training.grad_accum = 2;
    assert_int_equal(ml_parse_checkpoint("every-1", &f.training.checkpoint, NULL), ML_OK);
    ml_reserved_memo memo;
    memset(&memo, 0, sizeof memo);
    const ml_config *cs[] = {&a, &b, &d, &f, &a};
    const size_t entries[] = {1, 2, 3, 3, 3};
    uint64_t got[5][3], own[3];
    for (size_t i = 0; i < 5; i++) {
        reserved_of(p, cs[i], &memo, got[i]);
        assert_int_equal(memo.n, entries[i]);
        reserved_of(p, cs[i], NULL, own);
        assert_memory_equal(got[i], own, sizeof own);
    }
    /* the figures the memo must not mix up differ: a larger micro-batch
     * reserves more */
    assert_true(got[1][0] > got[0][0]);
    assert_memory_equal(got[3], got[0], sizeof got[0]);
    ml__reserved_memo_free(&memo);
    ml_planner_destroy(p);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_peak_monotone_in_micro_batch),
        cmocka_unit_test(test_fit_mlp2_by_hand),
        cmocka_unit_test(test_fit_simulated_below_allocated),
        cmocka_unit_test(test_accumulation_arithmetic),
        cmocka_unit_test(test_no_fit_explains),
        cmocka_unit_test(test_no_fit_remedies_hold),
        cmocka_unit_test(test_uneven_global_batch),
        cmocka_unit_test(test_auto_checkpoint),
        cmocka_unit_test(test_auto_as_each_policy),
        cmocka_unit_test(test_compare_rows),
        cmocka_unit_test(test_advice),
        cmocka_unit_test(test_advice_as_compare),
        cmocka_unit_test(test_no_fit_overflow),
        cmocka_unit_test(test_fit_eval_binds),
        cmocka_unit_test(test_global_batch_limit),
        cmocka_unit_test(test_fit_memo_keys),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
