/* Megatron's distributed optimizer: the buffer layout and a rank's shard
 * on hand-built parameter lists (each figure derived in the comments from
 * the rules in docs/parallel.md), and through the planner: 6 + 12/dp bytes a
 * parameter, Megatron's own estimate, where nothing is padded. */
#include "harness.h"
#include "ledger/dist_optimizer.h"

/* One block per entry of `params` (elements), with the checkpoint index
 * ckpt[k] (-1: not a layer). */
static void chain_of(ml_chain *ch, ml_cblock *blocks, ml_ptensor *ps, const uint64_t *params,
                     const int *ckpt, size_t n)
{
    memset(ch, 0, sizeof *ch);
    memset(blocks, 0, n * sizeof *blocks);
    memset(ps, 0, n * sizeof *ps);
    for (size_t k = 0; k < n; k++) {
        blocks[k].params = params[k];
        blocks[k].ckpt_index = ckpt[k];
        ps[k].numel = params[k];
        ch->n_ckpt += ckpt[k] >= 0;
    }
    ch->blocks = blocks;
    ch->n = n;
    ch->params = ps;
    ch->nparams = n;
}

/* Parameters A = 100, B = 64, C = 30 elements (forward order) over 4
 * ranks. In reverse: C at [0, 30), B at [64, 128) (starts on 64-element
 * boundaries), A at [128, 228); the bucket ends at 256, a multiple of
 * lcm(4, 128) = 128. Each rank owns 64: rank 0 [0, 64) holds 30 of C, rank
 * 1 all of B (64), rank 2 64 of A, rank 3 36 of A. The fullest: rank 1, 64
 * elements in one piece. */
static void test_padding_and_shard(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock blocks[3];
    ml_ptensor ps[3];
    const uint64_t params[] = {100, 64, 30};
    const int ckpt[] = {-1, 0, -1};
    chain_of(&ch, blocks, ps, params, ckpt, 3);
    ml_dopt d;
    uint64_t frag[4] = {0};
    assert_int_equal(ml__dopt_layout(&ch, 4, 1, &d, frag, 4), ML_OK);
    assert_int_equal(d.padded, 256);
    assert_int_equal(d.buckets, 1);
    assert_int_equal(d.rank, 1);
    assert_int_equal(d.shard, 64);
    assert_int_equal(d.fragments, 1);
    assert_int_equal(frag[0], 64);
    /* one rank: everything, padded to 256; three pieces */
    assert_int_equal(ml__dopt_layout(&ch, 1, 1, &d, frag, 4), ML_OK);
    assert_int_equal(d.padded, 256);
    assert_int_equal(d.shard, 194);
    assert_int_equal(d.fragments, 3);
    assert_int_equal(frag[0], 30);
    assert_int_equal(frag[1], 64);
    assert_int_equal(frag[2], 100);
}

/* A pipeline's first stage with tied embeddings: the table E = 200
 * (shared), then X = 50, over 2 ranks. In reverse: X at [0, 50); E would
 * start at 64 but is shared, so the bucket closes there, padded to
 * lcm(2, 128) = 128, and E starts a bucket of its own at 128: [128, 328),
 * closed and padded to 384. Bucket 0's parts are 64 (rank 0: 50 of X, rank
 * 1: none), bucket 1's 128 (rank 0: 128 of E, rank 1: 72). Rank 0 is the
 * fullest: 178 elements in two pieces. */
static void test_shared_embedding_bucket(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock blocks[2];
    ml_ptensor ps[2];
    const uint64_t params[] = {200, 50};
    const int ckpt[] = {-1, 0};
    chain_of(&ch, blocks, ps, params, ckpt, 2);
    ps[0].shared = true;
    ml_dopt d;
    uint64_t frag[4] = {0};
    assert_int_equal(ml__dopt_layout(&ch, 2, 1, &d, frag, 4), ML_OK);
    assert_int_equal(d.padded, 384);
    assert_int_equal(d.buckets, 2);
    assert_int_equal(d.rank, 0);
    assert_int_equal(d.shard, 178);
    assert_int_equal(d.fragments, 2);
    assert_int_equal(frag[0], 50);
    assert_int_equal(frag[1], 128);
}

/* Interleaved stages: two model chunks, each with its own buffer. Blocks:
 * embedding 10 (before the layers: chunk 0), layer 0 = 20 (chunk 0),
 * layer 1 = 20 (chunk 1), head 5 (after them: chunk 1). Chunk 0 in
 * reverse: layer 0 at [0, 20), the embedding at [64, 74), padded to 128;
 * chunk 1: the head at [0, 5), layer 1 at [64, 84), padded to 128. One
 * rank: 256 elements, 55 of them parameters. */
static void test_chunks(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock blocks[4];
    ml_ptensor ps[4];
    const uint64_t params[] = {10, 20, 20, 5};
    const int ckpt[] = {-1, 0, 1, -1};
    chain_of(&ch, blocks, ps, params, ckpt, 4);
    ml_dopt d;
    assert_int_equal(ml__dopt_layout(&ch, 1, 2, &d, NULL, 0), ML_OK);
    assert_int_equal(d.padded, 256);
    assert_int_equal(d.buckets, 2);
    assert_int_equal(d.shard, 55);
    assert_int_equal(d.fragments, 4);
    /* as one chunk: [0,5) head, [64,84) layer 1, [128,148) layer 0,
     * [192,202) embedding: padded to 256 again, one bucket */
    assert_int_equal(ml__dopt_layout(&ch, 1, 1, &d, NULL, 0), ML_OK);
    assert_int_equal(d.padded, 256);
    assert_int_equal(d.buckets, 1);
}

/* Many ranks, few elements: 128 elements over 64 ranks are 2 each, and
 * every rank's part is whole (no padding anywhere). */
static void test_every_rank_full(void **state)
{
    (void)state;
    ml_chain ch;
    ml_cblock blocks[1];
    ml_ptensor ps[1];
    const uint64_t params[] = {128};
    const int ckpt[] = {0};
    chain_of(&ch, blocks, ps, params, ckpt, 1);
    ml_dopt d;
    assert_int_equal(ml__dopt_layout(&ch, 64, 1, &d, NULL, 0), ML_OK);
    assert_int_equal(d.padded, 128);
    assert_int_equal(d.shard, 2);
    assert_int_equal(d.rank, 0);
    /* 100 elements over 64 ranks: padded to 128, parts of 2; ranks 0-49
     * full, 50-63 empty */
    ps[0].numel = blocks[0].params = 100;
    assert_int_equal(ml__dopt_layout(&ch, 64, 1, &d, NULL, 0), ML_OK);
    assert_int_equal(d.shard, 2);
    assert_int_equal(d.rank, 0);
    /* 60 elements over 3 ranks: padded to lcm(3, 128) = 384, parts of 128:
     * rank 0 holds all 60 */
    ps[0].numel = blocks[0].params = 60;
    assert_int_equal(ml__dopt_layout(&ch, 3, 1, &d, NULL, 0), ML_OK);
    assert_int_equal(d.padded, 384);
    assert_int_equal(d.shard, 60);
}

/* Through the planner: GPT-2 small (124,439,808 parameters, every tensor a
 * multiple of 64 elements and the sum of 128: nothing padded) under
 * Megatron's engine over 8 ranks: master weights 4 P / 8, Adam's states
 * 8 P / 8, parameters 2 P and fp32 gradients 4 P whole: 6 + 12/8 = 7.5
 * bytes a parameter, Megatron's theoretical_memory_usage.py figure. */
static void test_plan_bytes(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    ml_error e;
    assert_int_equal(ml_config_set(&c, "training.engine", "megatron", &e), ML_OK);
    assert_int_equal(ml_config_set(&c, "training.precision", "bf16-master", &e), ML_OK);
    assert_int_equal(ml_config_set(&c, "parallel.dp", "8", &e), ML_OK);
    assert_int_equal(ml_config_set(&c, "parallel.dist_optimizer", "true", &e), ML_OK);
    c.device.allocator = ML_ALLOCATOR_NONE;
    ml_ledger *l = NULL;
    ml_status st = ml_ledger_evaluate(m, &c, false, &l, &e);
    if (st)
        fail_msg("%s", e.msg);
    const ml_summary *s = ml_ledger_summary(l);
    const uint64_t P = 124439808;
    assert_int_equal(s->params, P);
    assert_int_equal(s->bytes_params, 2 * P);
    assert_int_equal(s->bytes_grads, 4 * P);
    assert_int_equal(s->bytes_master, 4 * P / 8);
    assert_int_equal(s->bytes_optimizer, 8 * P / 8);
    assert_int_equal(s->bytes_step_temp, 0); /* FusedAdam */
    ml_ledger_destroy(l);
    /* refused: eager PyTorch's layers, and beside a ZeRO stage */
    ml_config e2 = c;
    e2.training.engine = ML_ENGINE_EAGER;
    assert_int_equal(ml_ledger_evaluate(m, &e2, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "engine megatron"));
    e2 = c;
    e2.training.zero = 1;
    assert_int_equal(ml_ledger_evaluate(m, &e2, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "without training.zero"));
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_padding_and_shard), cmocka_unit_test(test_shared_embedding_bucket),
        cmocka_unit_test(test_chunks),            cmocka_unit_test(test_every_rank_full),
        cmocka_unit_test(test_plan_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
