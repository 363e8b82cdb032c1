/* Runs of identical layers (src/ledger/replay_runs.c; docs/ledger.md, "Runs
 * of identical layers").
 *
 * A plan that records no events moves over the middle of each run of
 * identical layers instead of replaying it. A plan that records its events
 * replays every layer. The two must agree on every figure of the summary
 * and of the block table, to the byte, for every shipped model and Hugging
 * Face config over a grid of the settings the replay branches on
 * (checkpoint policies, accumulation, ZeRO stages, the evaluation pass,
 * zero_grad, the logits' lifetime, precision); and the moving must have
 * happened (blocks skipped counted), or the comparison proves nothing. */
#include "harness.h"

#include "ledger/replay.h"

typedef struct {
    unsigned evaluations; /* both ways */
    uint64_t skipped;     /* blocks moved over */
} tally;

static void same_plan(const ml_model *m, const ml_config *c, tally *t)
{
    ml_ledger *a = NULL, *b = NULL;
    ml_error ea, eb;
    ml_status sa = ml_ledger_evaluate(m, c, false, &a, &ea);
    ml_status sb = ml__ledger_evaluate_whole(m, c, &b, &eb);
    assert_int_equal(sa, sb);
    if (sa != ML_OK) {
        assert_string_equal(ea.msg, eb.msg);
        return;
    }
    const ml_summary *x = ml_ledger_summary(a), *y = ml_ledger_summary(b);
    if (memcmp(x, y, sizeof *x))
        fail_msg("%s: summaries differ (micro-batch %llu, checkpoint %d, accumulation %llu, "
                 "zero %u, eval %llu): peak %llu vs %llu",
                 ml_model_name(m), (unsigned long long)c->training.micro_batch,
                 (int)c->training.checkpoint.kind, (unsigned long long)c->training.grad_accum,
                 c->training.zero, (unsigned long long)c->training.eval_batch,
                 (unsigned long long)x->peak, (unsigned long long)y->peak);
    assert_int_equal(ml_ledger_block_count(a), ml_ledger_block_count(b));
    for (size_t i = 0; i < ml_ledger_block_count(a); i++)
        assert_memory_equal(ml_ledger_block(a, i), ml_ledger_block(b, i), sizeof(ml_block_info));
    assert_int_equal(b->skipped, 0); /* the reference: every layer replayed */
    t->skipped += a->skipped;
    t->evaluations++;
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
}

static const ml_checkpoint_kind policies[] = {ML_CKPT_NONE, ML_CKPT_FULL, ML_CKPT_SELECTIVE,
                                              ML_CKPT_EVERY, ML_CKPT_OPTIMAL};

static void grid(const ml_model *m, void *arg)
{
    tally *t = arg;
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 2;
    if (c.training.seq_len > 256)
        c.training.seq_len = 256;
    c.device.allocator = ML_ALLOCATOR_NONE;
    for (size_t p = 0; p < sizeof policies / sizeof *policies; p++)
        for (unsigned v = 0; v < 16; v++) {
            ml_config k = c;
            k.training.checkpoint.kind = policies[p];
            k.training.checkpoint.every = 2;
            k.training.grad_accum = v & 1 ? 3 : 1;
            if (v & 2) {
                k.training.zero = 3;
                k.training.data_parallel = 4;
            }
            k.training.eval_batch = v & 4 ? 3 : 0;
            k.training.zero_grad = v & 8 ? ML_ZERO_GRAD_ZERO : ML_ZERO_GRAD_SET_TO_NONE;
            same_plan(m, &k, t);
            k.training.logits = ML_LOGITS_KEPT;
            k.training.precision = ML_PREC_FP32;
            same_plan(m, &k, t);
        }
}

static void test_runs_change_nothing(void **state)
{
    (void)state;
    tally t = {0, 0};
    assert_int_equal(each_grid_model(grid, &t), 24);
    /* most plans fit the grid: at least one per model and policy */
    assert_true(t.evaluations > 24 * 5 * 16);
    /* a 32-layer decoder moves over 27 layers forward and 27 backward per
     * micro-batch; the grid's models do that in most of its plans */
    assert_true(t.skipped > 100u * t.evaluations / 10u);
    print_message("%u plans compared both ways; %llu blocks moved over\n", t.evaluations,
                  (unsigned long long)t.skipped);
}

/* Llama-2-7B, no checkpointing, one micro-batch, no evaluation: blocks 0
 * (the embedding), 1 to 32 (the layers), 33 (the head), 34 (the loss).
 * Block j is a twin of j-1 when blocks j-2 to j+1 are the same plain layer
 * (block 1, the first layer, makes the mask: not plain): j from 3 to 31.
 * Forward, upwards: blocks 0 to 3 replay (2 and 3 measure the same
 * change), 4 to 30 are moved over (twins 3 to 31), 31 replays: 27.
 * Backward, downwards: 34 to 30 replay (31 and 30 measure the same
 * change), 29 down to 3 are moved over (twins 31 down to 3), 2 replays:
 * 27. */
static void test_llama_run_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-2-7b");
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 128;
    c.training.grad_accum = 1;
    c.training.eval_batch = 0;
    c.training.zero_grad = ML_ZERO_GRAD_SET_TO_NONE;
    c.training.checkpoint.kind = ML_CKPT_NONE;
    c.device.allocator = ML_ALLOCATOR_NONE;
    ml_ledger *l = NULL;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, NULL), ML_OK);
    assert_int_equal(ml_ledger_block_count(l), 35);
    assert_int_equal(l->skipped, 27 + 27);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llama_run_by_hand),
        cmocka_unit_test(test_runs_change_nothing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
