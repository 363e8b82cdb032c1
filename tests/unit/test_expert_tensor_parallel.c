/* Tensor and sequence parallelism with a mixture of experts, and expert
 * tensor parallelism, one rank's plan (docs/parallel.md, "Expert tensor
 * parallelism"): the attention split over tp ranks, the MoE layer on the
 * rank's T / tp tokens through Megatron-core's dispatch, the experts'
 * width split over etp ranks. Every figure below is worked by hand from
 * the layer's shape; tests/torch/tpep_twin.py measures the same layouts
 * over gloo. */
#include "harness.h"
#include "ledger/chain.h" /* the blocks' transients */

/* test_expert_parallel.c's tiny Mixtral: B=2, T=8, D=32, H=4, 2 kv heads,
 * dh=8, F=64, E=4 experts, k=2 per token, fp32, eager attention. */
static const char *tiny =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 2\n"
    "  ffn: 64\n  vocab: 50\n  position: rope\n  bias: false\n  tied_embeddings: false\n"
    "  norm: rmsnorm\n  activation: swiglu\n  experts: 4\n  experts_per_tok: 2\n"
    "training:\n  micro_batch: 2\n  seq_len: 8\n";

static ml_config layout(const ml_model *m, uint64_t tp, uint64_t dp, uint64_t ep, uint64_t etp)
{
    ml_config c = ml_model_config(m);
    c.device.allocator = ML_ALLOCATOR_NONE;
    c.training.tensor_parallel = tp;
    c.training.data_parallel = dp;
    c.training.expert_parallel = ep;
    c.training.expert_tensor_parallel = etp;
    return c;
}

/* One layer at tp 2 with sequence parallelism (Tn = 4 tokens a rank in
 * the norms and the router, 2 query heads and 1 key/value head), fp32:
 *   the two RMSNorms, input, x * rsqrt and rsqrt each: 2 x (2 B Tn D +
 *     B Tn) x 4 = 4,160; q/k/v's input (the first norm's output, the
 *     shard: Megatron's column-parallel linears save it and gather again
 *     in backward) B Tn D 4 = 1,024; q, k, v's copies 3 B T (H/2) dh 4 =
 *     3,072; the softmax B (H/2) T T 4 = 1,024; o_proj's input 1,024:
 *     10,304 (test_hf_mixtral.c's 20,608 at tp 1)
 *   the router on the shard: its input 1,024, the fp32 softmax B Tn E 4 =
 *     128, the int64 top-k B Tn k 8 = 128, the sum 32 and the divided
 *     values 64: 1,376
 *   the dispatch of the rank's P = k B Tn = 16 pairs: their order and
 *     tokens, 2 P 8 = 256; the R rows its experts take, sorted, R D 4, and
 *     their weights R 4; the experts' four intermediates 4 R F_r 4 and
 *     w2's outputs R D 4.
 * (a) tp 2, ep 2, etp 1: the EP group is the tp pair, 32 pairs over 4
 *     experts, 8 each; the rank's 2 take R = 16 of full width F_r = 64:
 *     2,048 + 64 + 16,384 + 2,048; 32,480 B (half of ep 2's 64,960 at
 *     tp 1: every tensor of a token halves).
 * (b) tp 2, ep 1, etp 2 (Megatron's default etp, tp's): the all-gather
 *     brings the other rank's rows, R = 32 over all 4 experts of width
 *     F_r = 32: 4,096 + 128 + 16,384 + 4,096; 36,640 B.
 * (c) tp 2, dp 2, ep 2, etp 2: 4 ranks x 16 pairs = 64 over 4 experts, the
 *     rank's 2 take R = 32 of width 32: 36,640 B.
 * Parameters a layer: q and o 32 x 16, k and v 32 x 8, the router 32 x 4,
 * the norms 2 x 32, and the experts (a) 2 x 3 x 32 x 64, (b) 4 x 3 x 32 x
 * 32 (both 12,288: 14,016), (c) 2 x 3 x 32 x 32 = 6,144: 7,872. */
static void test_rank_block(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    const struct {
        uint64_t tp, dp, ep, etp, saved, params;
    } cases[] = {{2, 1, 2, 1, 32480, 14016}, {2, 1, 1, 0, 36640, 14016},
                 {2, 2, 2, 2, 36640, 7872}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ml_config c = layout(m, cases[k].tp, cases[k].dp, cases[k].ep, cases[k].etp);
        ml_ledger *l = eval(m, &c, false);
        assert_int_equal(block_named(l, "block.0")->inventory_bytes, cases[k].saved);
        assert_int_equal(block_named(l, "block.1")->inventory_bytes, cases[k].saved);
        assert_int_equal(block_named(l, "block.0")->params, cases[k].params);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

/* The collectives of (c) a layer and micro-batch, a row D 4 = 128 B:
 * the experts' counts all-gathered over the ep x etp = 4 ranks, the other
 * three ranks' 4 x 8 = 96 B; the all-to-alls as at tp 1
 * (test_expert_parallel.c) with the rank's P = 16 pairs and RA = R / etp =
 * 16 received rows, half of each sent: forward 16 x 132 + 16 x 128 =
 * 4,160, backward 16 x 128 + 16 x 132 = 4,160; two layers: 2 x (4,160 +
 * 96) = 8,512 B. The expert-tensor ranks' ring collectives, half of each
 * sent: forward the all-gathers of the R = 32 rows and weights, 32 x 132
 * = 4,224, and the reduce-scatter of their outputs in fp32, 32 x 128 =
 * 4,096; backward the same two ways: 2 x 8,320 a layer, two layers, half:
 * 16,640 B, in 6 calls a layer. The gradients' all-reduce over dp 2 sends
 * 2 (1/2) of each gradient's 4 bytes but the experts': the ranks holding
 * the same experts are tp dp / (ep etp) = 1. In (b) no all-to-all (one
 * expert-parallel rank): the counts' all-gather over the 2 expert-tensor
 * ranks, 32 B a layer, goes with their collectives: 16,640 + 64 = 16,704
 * B in 7 calls a layer. The tensor-parallel collectives (S = B T D 4 =
 * 2,048, half of each sent, docs/parallel.md "Communication"): with
 * sequence parallelism 5 S a layer for the attention alone (the experts
 * are not split by tp: a dense layer's MLP would add 5 S more), 2 S the
 * embedding, 3 S the head, and the loss's three all-reduces of B T fp32:
 * 1/2 ((2 x 5 + 2 + 3) x 2,048 + 3 x 2 x 16 x 4) = 15,552 B. */
static void test_collectives(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = layout(m, 2, 2, 2, 2);
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_rel_close(s->ep_comm_bytes, 8512, 0);
    assert_rel_close(s->etp_comm_bytes, 16640, 0);
    assert_rel_close(s->etp_calls, 12, 0);
    assert_rel_close(s->tp_comm_bytes, 15552, 0);
    assert_rel_close(s->comm_bytes, 4.0 * (double)(s->params - 2 * 6144), 1e-15);
    ml_ledger_destroy(l);
    c = layout(m, 2, 1, 1, 2);
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->ep_comm_bytes, 0, 0);
    assert_rel_close(ml_ledger_summary(l)->etp_comm_bytes, 16704, 0);
    assert_rel_close(ml_ledger_summary(l)->etp_calls, 14, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* ZeRO 1 at (c) over 4 devices: the rank's 2 x 7,872 + 800 + 832 =
 * 17,376 parameters (the embedding's and the head's vocabulary split, 25
 * rows of 32, the final norm whole), 12,288 of them its experts', which no
 * other rank holds (tp dp / (ep etp) = 1), the rest 5,088 sharded over dp
 * 2: AdamW's two fp32 states 8 x 5,088 / 2 + 8 x 12,288 = 20,352 + 98,304
 * = 118,656 B. */
static void test_zero1(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = layout(m, 2, 2, 2, 2);
    c.training.zero = 1;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->params, 17376);
    assert_int_equal(s->bytes_optimizer, 118656);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The forward's dispatch buffers in pure bf16 at tp 2, etp 2 (ep 1), a
 * row D x 2 = 64 B: the rank's P = 16 pairs (its send buffer, which the
 * all-to-all of one rank returns as its received rows) 1,024 B; at the
 * concatenation the experts' R = 32 outputs and their concatenation, 2 x
 * 2,048: 5,120; at the reduce-scatter the sorted-back outputs 2,048, their
 * fp32 copy 4,096 (combine_preprocess casts them to the routing weights'
 * dtype) and the fp32 output of RA = 16 rows, 2,048: 1,024 + 8,192 =
 * 9,216, the larger. Under no_grad the sorted rows too: + 2,048. */
static void test_buffers_bf16(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = layout(m, 2, 1, 1, 2);
    c.training.precision = ML_PREC_BF16;
    ml_chain ch;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &c, &ch, &e), ML_OK);
    const ml_cblock *b = &ch.blocks[1];
    assert_string_equal(b->name, "block.0");
    assert_int_equal(b->ws_fwd, 9216);
    assert_int_equal(b->ws_nograd, 9216 + 2048);
    ml__chain_free(&ch);
    ml_model_destroy(m);
}

static void expect_refused(const ml_model *m, const ml_config *c, const char *part)
{
    ml_ledger *l = NULL;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, c, false, &l, &e), ML_RANGE);
    assert_null(l);
    if (!strstr(e.msg, part))
        fail_msg("'%s' lacks '%s'", e.msg, part);
}

static void test_refusals(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = layout(m, 2, 1, 1, 3); /* 3 does not divide the width 64 */
    expect_refused(m, &c, "expert width");
    c = layout(m, 2, 1, 4, 2); /* 4 x 2 ranks from tp x dp = 2 */
    expect_refused(m, &c, "make training.data_parallel a multiple of 4");
    c = layout(m, 2, 1, 1, 1); /* experts replicated over the tp pair */
    expect_refused(m, &c, "ep x etp below tp");
    c = layout(m, 2, 1, 2, 1);
    c.training.sequence_parallel = ML_SP_OFF;
    expect_refused(m, &c, "moe_layer.py");
    ml_model_destroy(m);
    m = load_preset("gpt2-small"); /* no experts to split */
    c = layout(m, 2, 1, 1, 2);
    expect_refused(m, &c, "has none");
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_block),
        cmocka_unit_test(test_collectives),
        cmocka_unit_test(test_zero1),
        cmocka_unit_test(test_buffers_bf16),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
