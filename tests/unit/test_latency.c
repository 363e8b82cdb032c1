/* The collectives' latency (docs/search.md, "Latency"): NCCL's ring with
 * its Simple protocol, per call, and the calls a plan counts. The values
 * are NCCL's tuning table's (src/graph/tuning.cc): a base of 8.4 us, a
 * step 3.4 us over NVLink and 14.0 us over the network. */
#include "harness.h"
#include "ledger/latency.h"

static void test_nccl_table(void **state)
{
    (void)state;
    /* all-reduce over 8 in a node: 8.4 + 14 x 3.4 = 56.0 us */
    assert_rel_close(ml__coll_latency_s(ML_COLL_ALL_REDUCE, 8, 1), 56.0e-6, 1e-12);
    /* an all-gather over 2: 8.4 + 3.4 = 11.8 us; a send in a node the same */
    assert_rel_close(ml__coll_latency_s(ML_COLL_HALF, 2, 1), 11.8e-6, 1e-12);
    assert_rel_close(ml__coll_latency_s(ML_COLL_SEND, 2, 1), 11.8e-6, 1e-12);
    /* a send between nodes: 8.4 + 14.0 */
    assert_rel_close(ml__coll_latency_s(ML_COLL_SEND, 2, 2), 22.4e-6, 1e-12);
    /* all-reduce over 16 on 2 nodes: 30 steps, 2 x 2 = 4 of them between
     * nodes: (8.4 + 26 x 3.4 + 4 x 14.0) x 1.4 = 152.8 x 1.4 = 213.92 us */
    assert_rel_close(ml__coll_latency_s(ML_COLL_ALL_REDUCE, 16, 2), 213.92e-6, 1e-12);
    /* reduce-scatter over 16 on 2 nodes: 8.4 + 14 x 3.4 + 1 x 14.0 = 70.0 us */
    assert_rel_close(ml__coll_latency_s(ML_COLL_HALF, 16, 2), 70.0e-6, 1e-12);
    assert_rel_close(ml__coll_latency_s(ML_COLL_ALL_REDUCE, 1, 1), 0, 0);
}

/* 4 layers, 8 heads, 2 key/value heads: tensor parallelism 2 */
static const char *llama4 =
    "model:\n  type: decoder\n  layers: 4\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
    "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
    "  tied_embeddings: false\n  bias: false\n  attention: eager\n  dropout: 0\n"
    "training:\n  seq_len: 24\n  optimizer: adamw\n";

/* Per micro-batch at tp 2, as docs/parallel.md's table of sites
 * ("Communication") has them, one call a site: with
 * sequence parallelism 10 gathers and reduce-scatters a layer (40), the
 * embedding's 2 and the head's 3: 45, and the loss's 3 all-reduces; full
 * recomputation 4 more a layer: 61. Without it 4 all-reduces a layer, the
 * embedding's and the head's one each and the loss's 3: 21. */
static void test_tp_calls(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = ml_model_config(m);
    c.training.tensor_parallel = 2;
    ml_ledger *l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->tp_halves, 45, 0);
    assert_rel_close(ml_ledger_summary(l)->tp_allreduces, 3, 0);
    ml_ledger_destroy(l);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    c.training.grad_accum = 2;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->tp_halves, 2 * 61, 0);
    ml_ledger_destroy(l);
    c = ml_model_config(m);
    c.training.tensor_parallel = 2;
    c.training.sequence_parallel = ML_SP_OFF;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->tp_halves, 0, 0);
    assert_rel_close(ml_ledger_summary(l)->tp_allreduces, 21, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Data parallelism over 2: DDP's gradients (under 1 MiB) in its first
 * bucket, one all-reduce; ZeRO-1, one reduce-scatter and one all-gather
 * (500,000,000-element buckets); ZeRO-3 with 2 micro-batches, each block
 * with parameters (the embedding, 4 layers, the head: 6) gathered in
 * forward and backward and reduce-scattered: 2 x 3 x 6 = 36. */
static void test_dp_calls(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = ml_model_config(m);
    c.training.data_parallel = 2;
    ml_ledger *l = eval(m, &c, false);
    assert_true(ml_ledger_summary(l)->params * 4 < 1048576);
    assert_rel_close(ml_ledger_summary(l)->dp_allreduces, 1, 0);
    assert_rel_close(ml_ledger_summary(l)->dp_halves, 0, 0);
    ml_ledger_destroy(l);
    c.training.zero = 1;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->dp_halves, 2, 0);
    assert_rel_close(ml_ledger_summary(l)->dp_allreduces, 0, 0);
    ml_ledger_destroy(l);
    c.training.zero = 3;
    c.training.grad_accum = 2;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->dp_halves, 36, 0);
    ml_ledger_destroy(l);
    c.training.data_parallel = 1;
    c.training.zero = 0;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->dp_allreduces, 0, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* A pipeline of 2 stages over 4 micro-batches: the first stage sends its
 * output forward once a micro-batch, the last its input's gradient back:
 * 4 sends each; with 2 virtual stages each stage's chunks send but the
 * model's first chunk's gradient and its last chunk's output: 4 x 3. With
 * 3 stages (6 layers) the middle one sends both ways, m x 2, and with 2
 * virtual stages all four of its chunks' both ways, m x 4, where
 * the edges send m and 3 m: a rule alike for every stage would not pass
 * (there over 6 micro-batches, which the interleaved schedule divides over
 * the 3 stages: 6, 12, 6 and 18, 24, 18). */
static void test_p2p_sends(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = ml_model_config(m);
    c.training.pipeline_parallel = 2;
    c.training.grad_accum = 4;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_rank_count(l), 2);
    assert_rel_close(ml_ledger_rank(l, 0)->p2p_sends, 4, 0);
    assert_rel_close(ml_ledger_rank(l, 1)->p2p_sends, 4, 0);
    ml_ledger_destroy(l);
    c.training.virtual_stages = 2;
    c.training.pp_schedule = ML_PP_INTERLEAVED;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_rank(l, 0)->p2p_sends, 12, 0);
    assert_rel_close(ml_ledger_rank(l, 1)->p2p_sends, 12, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    char six[512];
    snprintf(six, sizeof six, "%s", llama4);
    memcpy(strstr(six, "layers: 4"), "layers: 6", 9);
    m = load_str(six);
    c = ml_model_config(m);
    c.training.pipeline_parallel = 3;
    c.training.grad_accum = 6;
    static const double plain[3] = {6, 12, 6}, interleaved[3] = {18, 24, 18};
    for (int v = 1; v <= 2; v++) {
        c.training.virtual_stages = (uint64_t)v;
        c.training.pp_schedule = v > 1 ? ML_PP_INTERLEAVED : ML_PP_1F1B;
        l = eval(m, &c, false);
        assert_int_equal(ml_ledger_rank_count(l), 3);
        for (size_t r = 0; r < 3; r++)
            assert_rel_close(ml_ledger_rank(l, r)->p2p_sends, v > 1 ? interleaved[r] : plain[r], 0);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nccl_table),
        cmocka_unit_test(test_tp_calls),
        cmocka_unit_test(test_dp_calls),
        cmocka_unit_test(test_p2p_sends),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
