/* The prepared planner (src/ledger/planner.c, chain_affine.c; docs/ledger.md,
 * "A prepared planner").
 *
 * ml_planner_evaluate must give what ml_ledger_evaluate gives, to the byte:
 * the status and message, every field of the summary, the block table and,
 * recorded, the events, for every shipped model and Hugging Face config
 * over micro-batches (in the order a search asks them and out of it),
 * checkpoint policies, precisions, accumulation, ZeRO-3, the evaluation
 * pass, the allocator simulation, and sizes that overflow; and the planner
 * must have derived its chains where the models allow it (counted), or
 * the comparison proves nothing. */
#include "harness.h"

#include "ledger/planner.h"
#include "ledger/steptime.h"

typedef struct {
    unsigned evaluations; /* both ways */
    unsigned failed;      /* of which refused alike */
    unsigned long derived; /* of which the planner derived its chain */
} tally;

static void same_ledgers(const ml_ledger *a, const ml_ledger *b, bool events)
{
    assert_memory_equal(ml_ledger_summary(a), ml_ledger_summary(b), sizeof(ml_summary));
    assert_int_equal(ml_ledger_block_count(a), ml_ledger_block_count(b));
    for (size_t i = 0; i < ml_ledger_block_count(a); i++)
        assert_memory_equal(ml_ledger_block(a, i), ml_ledger_block(b, i), sizeof(ml_block_info));
    assert_int_equal(ml_ledger_event_count(a), ml_ledger_event_count(b));
    if (events && ml_ledger_event_count(a))
        assert_memory_equal(ml_ledger_events(a), ml_ledger_events(b),
                            ml_ledger_event_count(a) * sizeof(ml_event));
}

static void same_plan(ml_planner *p, const ml_model *m, const ml_config *c, bool events,
                      tally *t)
{
    ml_ledger *a = NULL, *b = NULL;
    ml_error ea, eb;
    ml_status sa = ml_planner_evaluate(p, c, events, &a, &ea);
    ml_status sb = ml_ledger_evaluate(m, c, events, &b, &eb);
    if (sa != sb)
        fail_msg("%s, micro-batch %llu: planner %d (%s), direct %d (%s)", ml_model_name(m),
                 (unsigned long long)c->training.micro_batch, (int)sa, ea.msg, (int)sb, eb.msg);
    t->evaluations++;
    if (sa != ML_OK) {
        assert_string_equal(ea.msg, eb.msg);
        if (getenv("PLANNER_DEBUG"))
            fprintf(stderr, "%s: %s\n", ml_model_name(m), ea.msg);
        t->failed++;
        return;
    }
    same_ledgers(a, b, events);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
}

static const ml_checkpoint_kind policies[] = {ML_CKPT_NONE, ML_CKPT_FULL, ML_CKPT_SELECTIVE,
                                              ML_CKPT_OPTIMAL};
/* a search's order, then out of order, then the largest (2^32 tokens and more) */
static const uint64_t batches[] = {1, 2, 3, 4, 6, 8, 16, 5, 1, 64, 7, 2, UINT64_C(1) << 24};

static void grid(const ml_model *m, void *arg)
{
    tally *t = arg;
    ml_planner *p = NULL;
    assert_int_equal(ml_planner_create(m, &p, NULL), ML_OK);
    ml_config c = ml_model_config(m);
    /* LLaVA's 576 image tokens need a longer sequence */
    if (c.training.seq_len > 256 && strncmp(ml_model_name(m), "llava", 5) != 0)
        c.training.seq_len = 256;
    if (!c.device.present) { /* the optimal policy's budget */
        c.device.present = true;
        c.device.memory = UINT64_C(80) << 30;
    }
    for (size_t q = 0; q < sizeof policies / sizeof *policies; q++)
        for (unsigned v = 0; v < 8; v++) {
            ml_config k = c;
            k.training.checkpoint.kind = policies[q];
            k.training.grad_accum = v & 1 ? 3 : 1;
            if (v & 2) {
                k.training.zero = 3;
                k.training.data_parallel = 4;
            }
            k.training.eval_batch = v & 4 ? 3 : 0;
            k.training.precision = v & 1 ? ML_PREC_FP32 : c.training.precision;
            k.device.allocator = q == 1 && v < 2 ? ML_ALLOCATOR_CACHING : ML_ALLOCATOR_NONE;
            for (size_t i = 0; i < sizeof batches / sizeof *batches; i++) {
                k.training.micro_batch = batches[i];
                same_plan(p, m, &k, q == 0 && v == 0 && i < 3, t);
            }
        }
    /* the policies in turn at each micro-batch: one setting's builds serve
     * every policy but selective */
    for (size_t i = 0; i < 8; i++)
        for (size_t q = 0; q < sizeof policies / sizeof *policies; q++) {
            ml_config k = c;
            k.training.checkpoint.kind = policies[q];
            k.training.micro_batch = batches[i];
            same_plan(p, m, &k, false, t);
        }
    /* another sequence length, then the first again: each a new chain */
    for (unsigned T = 64; T <= 128; T += 64)
        for (uint64_t B = 1; B <= 3; B++) {
            ml_config k = c;
            k.training.seq_len = T + (c.training.seq_len > 256 ? 576 : 0);
            k.training.micro_batch = B;
            same_plan(p, m, &k, false, t);
        }
    t->derived += ml__planner_derived(p);
    ml_planner_destroy(p);
}

static void test_planner_matches(void **state)
{
    (void)state;
    tally t = {0, 0, 0};
    assert_int_equal(each_grid_model(grid, &t), 24);
    print_message("%u plans compared both ways (%u refused alike); %lu from derived chains\n",
                  t.evaluations, t.failed, t.derived);
    /* every model's grid: 4 policies x 8 settings x 13 micro-batches, 8 x 4
     * policies in turn, and 6 */
    assert_int_equal(t.evaluations, 24u * (4u * 8u * 13u + 8u * 4u + 6u));
    /* refused alike: optimal, for the two T5s and LLaVA, in the grid (8
     * settings x 13 micro-batches) and the policies in turn (8) */
    assert_int_equal(t.failed, 3u * (8u * 13u + 8u));
    /* 22 of the 24 models have no experts: most of their plans derive */
    assert_true(t.derived > t.evaluations / 2u);
}

/* A mixture of experts' rows per expert (min(k·B·T, E) experts with rows)
 * is not affine in the micro-batch: the planner builds every chain. */
static void test_experts_built(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("mixtral-8x7b");
    ml_planner *p = NULL;
    assert_int_equal(ml_planner_create(m, &p, NULL), ML_OK);
    ml_config c = ml_model_config(m);
    c.training.seq_len = 1;
    tally t = {0, 0, 0};
    for (uint64_t B = 1; B <= 6; B++) {
        c.training.micro_batch = B;
        same_plan(p, m, &c, false, &t);
    }
    assert_int_equal(ml__planner_derived(p), 0);
    assert_int_equal(t.evaluations, 6);
    ml_planner_destroy(p);
    ml_model_destroy(m);
}

/* GPT-2 small, one setting, micro-batches 1 to 8: the first two build
 * (micro-batch 1 and 2 for the pair), all eight derive. */
static void test_derived_count(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_planner *p = NULL;
    assert_int_equal(ml_planner_create(m, &p, NULL), ML_OK);
    ml_config c = ml_model_config(m);
    tally t = {0, 0, 0};
    for (uint64_t B = 1; B <= 8; B++) {
        c.training.micro_batch = B;
        same_plan(p, m, &c, false, &t);
    }
    assert_int_equal(ml__planner_derived(p), 8);
    assert_int_equal(t.failed, 0);
    ml_planner_destroy(p);
    ml_model_destroy(m);
}

/* A derived chain lists the ops' work items only where the step time is
 * per op: at one setting and micro-batch, a device without a memory
 * bandwidth (FLOPs only), then a named one (per op: the chain derived
 * again, with them), then the first again; each plan as the direct one,
 * and the per-op step time really per op (a different figure). */
static void test_work_when_timed(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-2-7b");
    ml_planner *p = NULL;
    assert_int_equal(ml_planner_create(m, &p, NULL), ML_OK);
    ml_config flops = ml_model_config(m), per_op = flops;
    flops.training.grad_accum = 1;
    per_op.training.grad_accum = 1;
    assert_int_equal(ml_device_preset_apply("h100", &per_op.device, NULL), ML_OK);
    assert_false(ml__step_time_per_op(&flops));
    assert_true(ml__step_time_per_op(&per_op));
    tally t = {0, 0, 0};
    for (uint64_t B = 3; B <= 5; B += 2) {
        const ml_config *order[] = {&flops, &per_op, &flops, &per_op};
        double s[4];
        for (size_t i = 0; i < 4; i++) {
            ml_config c = *order[i];
            c.training.micro_batch = B;
            same_plan(p, m, &c, false, &t);
            ml_ledger *l = NULL;
            assert_int_equal(ml_planner_evaluate(p, &c, false, &l, NULL), ML_OK);
            s[i] = ml_ledger_summary(l)->time.step_s;
            assert_int_equal(ml_ledger_summary(l)->time.source,
                             order[i] == &per_op ? ML_TIME_DATASHEET : ML_TIME_NONE);
            ml_ledger_destroy(l);
        }
        assert_true(s[0] == s[2] && s[1] == s[3]);
    }
    assert_int_equal(t.failed, 0);
    /* every plan from a derived chain (3 and 5 are no powers of two) */
    assert_int_equal(ml__planner_derived(p), 16);
    ml_planner_destroy(p);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_derived_count),
        cmocka_unit_test(test_experts_built),
        cmocka_unit_test(test_planner_matches),
        cmocka_unit_test(test_work_when_timed),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
