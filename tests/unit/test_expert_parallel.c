/* Expert parallelism, one rank's plan (docs/parallel.md, "Expert
 * parallelism"): a rank holds E / ep of a mixture of experts' routed
 * experts and runs them on the rows an all-to-all brings it, with the
 * dispatch and combine of Megatron-core's alltoall dispatcher. Every
 * figure below is worked by hand from the layer's shape. */
#include "harness.h"
#include "ledger/chain.h"   /* the blocks' transients */
#include "ledger/planner.h" /* ml__planner_derived */

/* A tiny Mixtral-like decoder: B=2, T=8 (BT = 16), D=32, H=4, 2 kv heads,
 * dh=8, F=64, E=4 experts, k=2 per token (P = k BT = 32 routed pairs a
 * rank), fp32, eager attention. */
static const char *tiny =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 2\n"
    "  ffn: 64\n  vocab: 50\n  position: rope\n  bias: false\n  tied_embeddings: false\n"
    "  norm: rmsnorm\n  activation: swiglu\n  experts: 4\n  experts_per_tok: 2\n"
    "training:\n  micro_batch: 2\n  seq_len: 8\n";

static ml_config with_ep(const ml_model *m, uint64_t ep, uint64_t dp)
{
    ml_config c = ml_model_config(m);
    c.device.allocator = ML_ALLOCATOR_NONE;
    c.training.expert_parallel = ep;
    c.training.data_parallel = dp;
    return c;
}

/* At ep 2 (dp 2) a rank holds 2 of the 4 experts. The group's 2 x 32 = 64
 * pairs, balanced, give each expert 16 rows: the rank's two take R = 32.
 * Block 0 keeps:
 *   the attention half, as without experts (test_hf_mixtral.c): 20,608
 *   the router, as without ep (test_hf_mixtral.c): 2,752
 *   the dispatch: the pairs' order, P x 8 = 256 (int64, the weights'
 *     gather's index) and the pairs' tokens, P x 8 = 256 (index_select's
 *     and scatter_add_'s index); the received rows
 *     sorted by expert, R D 4 = 4,096 (the experts' matmuls read views of
 *     it); the sorted routing weights, R 4 = 128
 *   the experts over their R rows: w1's, silu's, w3's outputs and the
 *     product 4 R F 4 = 32,768; w2's output (the weighting keeps it)
 *     R D 4 = 4,096
 *   total 20,608 + 2,752 + 512 + 4,096 + 128 + 32,768 + 4,096 = 64,960 B
 * (69,056 B without ep: the per-expert gathers, torch.where's indices,
 * the gathered weights and index_add_'s source are HF's loop's).
 * Parameters: q and o 2 x 1024, k and v 2 x 512, the router 128, two
 * experts 2 x 3 x 32 x 64 = 12,288, the norms 64: 15,552 (27,840 at ep 1).
 * FLOPs: the experts' 3 x 2 R D F = 393,216, as without ep (R = P here),
 * and the rest as at ep 1: 512,000. */
static void test_rank_block(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 2);
    ml_ledger *l = eval(m, &c, false);
    const ml_block_info *b = block_named(l, "block.0");
    assert_int_equal(b->inventory_bytes, 64960);
    assert_int_equal(b->params, 15552);
    assert_rel_close(b->flops_forward, 512000, 0);
    ml_config one = with_ep(m, 1, 2);
    ml_ledger *k = eval(m, &one, false);
    assert_int_equal(block_named(k, "block.0")->inventory_bytes, 69056);
    assert_int_equal(block_named(k, "block.0")->params, 27840);
    /* the rank holds 2 x (27,840 - 15,552) = 24,576 fewer parameters */
    assert_int_equal(ml_ledger_summary(k)->params - ml_ledger_summary(l)->params, 24576);
    ml_ledger_destroy(l);
    ml_ledger_destroy(k);
    ml_model_destroy(m);
}

/* With training.expert_imbalance 1.5 the busiest expert takes 16 x 1.5 =
 * 24 of the group's 64 rows, the other three share 40: 14, 13, 13. The
 * fullest rank holds the busiest and the next: R = 24 + 14 = 38 rows. Its
 * indices are still its own P = 32 pairs' (2 x 256); the received rows keep
 * 38 x 128 = 4,864, the weights 38 x 4 = 152, the experts 4 x 38 x 256 +
 * 38 x 128 = 38,912 + 4,864: 20,608 + 2,752 + 512 + 4,864 + 152 + 38,912 +
 * 4,864 = 72,664 B; the experts' FLOPs 6 x 38 x 32 x 64 = 466,944, the
 * rest 512,000 - 393,216 = 118,784: 585,728. Its all-to-alls: its own 32
 * pairs routed the same way (12 to the busiest expert, then 7, 7, 6), the
 * 12 + 7 = 19 for its own two experts stay: it sends 13 pairs and gets 38
 * - 19 = 19 rows from the other rank; a layer's 13 x 132 + 19 x 128 + the
 * counts 32 forward and 13 x 128 + 19 x 132 backward, 8,352: 16,704 B for
 * two (as balanced: 16 and 16 there). */
static void test_imbalance(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 2);
    c.training.expert_imbalance = 1.5;
    ml_ledger *l = eval(m, &c, false);
    const ml_block_info *b = block_named(l, "block.0");
    assert_int_equal(b->inventory_bytes, 72664);
    assert_rel_close(b->flops_forward, 585728, 0);
    assert_rel_close(ml_ledger_summary(l)->ep_comm_bytes, 16704, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Megatron's expert capacity (moe_utils.py get_capacity: ceil(pairs / E x
 * factor) of a rank's pairs for each expert). Factor 1 beside the 1.5
 * imbalance above: a rank's capacity ceil(32 / 4) = 8, the group's 2 x 8 =
 * 16 an expert. The group's rows 24, 14, 13, 13 become 16, 14, 13, 13: the
 * fullest rank's experts take R = 16 + 14 = 30. The rank's own 32 pairs,
 * routed the same way (12, then 7, 7, 6), send 8 + 7 + 7 + 6 = 28 (4
 * dropped). Block 0: 20,608 + 2,752, the pairs' order and tokens 2 x 28 x
 * 8 = 448, the sorted rows 30 x 128 = 3,840 and weights 120, the experts
 * 4 x 30 x 256 = 30,720 and 3,840: 62,328 B; the experts' FLOPs 6 x 30 x
 * 32 x 64 = 368,640 and the rest 118,784: 487,424.
 * Padded at factor 1.5, balanced: the capacity ceil(8 x 1.5) = 12, every
 * expert 12 rows of each rank: the rank sends 4 x 12 = 48 pairs and its two
 * experts take 2 x 2 x 12 = R = 48: 20,608 + 2,752 + 2 x 48 x 8 + 48 x 128
 * + 48 x 4 + 4 x 48 x 256 + 48 x 128 = 85,760 B. Its all-to-alls: of
 * the 48 pairs, the 24 its own two experts take stay; a layer's 24 x 132 +
 * 24 x 128 forward and backward each, 2 x 6,240, and no counts (padded,
 * the splits are known: preprocess returns before its all-gather): 2 x
 * 12,480 = 24,960 B. */
static void test_capacity(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 2);
    c.training.expert_imbalance = 1.5;
    c.training.expert_capacity = 1.0;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->inventory_bytes, 62328);
    assert_rel_close(block_named(l, "block.0")->flops_forward, 487424, 0);
    ml_ledger_destroy(l);
    c = with_ep(m, 2, 2);
    c.training.expert_capacity = 1.5;
    c.training.expert_pad = true;
    l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->inventory_bytes, 85760);
    assert_rel_close(ml_ledger_summary(l)->ep_comm_bytes, 24960, 0);
    assert_rel_close(ml_ledger_summary(l)->ep_calls, 12, 0);
    ml_ledger_destroy(l);
    /* refused: without the dispatch (Hugging Face's loop drops nothing),
     * padding without a capacity, a dense model */
    ml_error e;
    c = with_ep(m, 1, 2);
    c.training.expert_capacity = 1.0;
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "drops no token"));
    c = with_ep(m, 2, 2);
    c.training.expert_pad = true;
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "give training.expert_capacity"));
    /* padded past the rank's 16 tokens: ceil(32 / 4 x 2.5) = 20 */
    c.training.expert_capacity = 2.5;
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "cannot pad past"));
    ml_model_destroy(m);
    m = load_preset("gpt2-small");
    c = with_ep(m, 1, 1);
    c.training.expert_capacity = 1.0;
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "has no experts"));
    ml_model_destroy(m);
}

/* One local expert (ep 4 of the 4 experts, dp 4): Megatron neither sorts
 * the received rows by local expert nor splits and concatenates them
 * (token_dispatcher.py, num_local_experts > 1; experts.py SequentialMLP):
 * the all-to-all's rows are the expert's input, saved as they come. The
 * group's 4 x 32 pairs give each expert 32 rows: R = 32. Block 0 keeps the
 * attention half 20,608, the router 2,752, the pairs' order and tokens 2 x
 * 32 x 8 = 512, the received rows 32 x 128 = 4,096 and weights 128 (no
 * sorted copies), the expert's four intermediates 4 x 32 x 256 = 32,768
 * and output 4,096: 64,960 B, as at ep 2 (there the sorted copies, here
 * the received rows). Its parameters 3,264 and one expert 3 x 32 x 64 =
 * 6,144: 9,408. */
static void test_one_local(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 4, 4);
    ml_ledger *l = eval(m, &c, false);
    const ml_block_info *b = block_named(l, "block.0");
    assert_int_equal(b->inventory_bytes, 64960);
    assert_int_equal(b->params, 9408);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* DeepSeek-V3's experts under Megatron's dispatch (tests/torch/models/
 * deepseek.yaml's shape: B 2, T 24, D 64, 6 experts of width 24, top-2,
 * a shared expert, latent attention, its first layer dense; fp32). At ep
 * 2 a rank holds 3 experts: 3 x 3 x 64 x 24 = 13,824 parameters a MoE
 * layer fewer; the dense layer is unchanged. The group's 2 x 96 pairs give
 * each expert 32 rows, the rank's three R = 96. Hugging Face's moe() keeps
 * per layer torch.where's (row, slot) int64 pairs 96 x 16 = 1,536, the
 * gathered rows 96 x 64 x 4 = 24,576, the four intermediates 4 x 96 x 24
 * x 4 = 36,864, w2's output 24,576, the gathered weights 384 and
 * index_add_'s source 24,576: 112,512; the dispatch keeps the pairs' order
 * and tokens 2 x 96 x 8 = 1,536, the sorted rows 24,576 and weights 384,
 * the intermediates 36,864 and w2's output 24,576: 87,936, 24,576 less.
 * The all-to-alls of the two MoE layers (not the dense one), half sent: a
 * layer's 96 x 260 + 96 x 256 forward and backward, 2 x 49,536, and the
 * counts 6 x 8 = 48: 2 x (49,536 + 48) = 99,168 B. */
static const char *deepseek =
    "model:\n  type: decoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  head_dim: 24\n"
    "  rope_head_dim: 8\n  v_head_dim: 16\n  kv_lora_rank: 32\n  q_lora_rank: 40\n"
    "  ffn: 96\n  experts: 6\n  experts_per_tok: 2\n  expert_ffn: 24\n"
    "  shared_expert_ffn: 48\n  shared_expert_gate: false\n  router: sigmoid\n"
    "  dense_layers: 1\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n"
    "  position: rope\n  tied_embeddings: false\n  bias: false\n  attention: eager\n"
    "  dropout: 0\ntraining:\n  micro_batch: 2\n  seq_len: 24\n";

static void test_deepseek(void **state)
{
    (void)state;
    ml_model *m = load_str(deepseek);
    ml_config one = with_ep(m, 1, 2), two = with_ep(m, 2, 2);
    ml_ledger *a = eval(m, &one, false), *b = eval(m, &two, false);
    assert_int_equal(block_named(a, "block.0")->params, block_named(b, "block.0")->params);
    assert_int_equal(block_named(a, "block.0")->inventory_bytes,
                     block_named(b, "block.0")->inventory_bytes);
    for (unsigned i = 1; i <= 2; i++) {
        const char *name = i == 1 ? "block.1" : "block.2";
        assert_int_equal(block_named(a, name)->params - block_named(b, name)->params, 13824);
        assert_int_equal(block_named(a, name)->inventory_bytes -
                             block_named(b, name)->inventory_bytes,
                         24576);
    }
    const ml_summary *s = ml_ledger_summary(b);
    assert_rel_close(s->ep_comm_bytes, 99168, 0);
    assert_rel_close(s->comm_bytes, 4.0 * (double)(s->params - 2 * 13824), 1e-15);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
    ml_model_destroy(m);
}

/* DeepSeek-V2's experts (the same shape with V2's softmax router, its
 * group-limited top-k and its sorted moe(), complex rotary): moe() keeps
 * the pairs' order and rows 2 x 96 x 8 = 1,536, the sorted rows 24,576,
 * the four intermediates 36,864, the fp32 copy the in-place mul keeps
 * 24,576 and the scaled weights 384: 87,936 B, what the dispatch keeps
 * too (the pairs' order and tokens, the sorted rows and weights, the
 * intermediates and w2's output): the same bytes a MoE layer at ep 2,
 * 13,824 parameters fewer, the all-to-alls 99,168 B as V3's. */
static void test_deepseek_v2(void **state)
{
    (void)state;
    char buf[1024];
    snprintf(buf, sizeof buf, "%s", deepseek);
    char *r = strstr(buf, "  router: sigmoid\n");
    assert_non_null(r);
    const char *v2 = "  expert_dispatch: sort\n  grouped_topk: true\n  rope_complex: true\n";
    char tail[1024];
    snprintf(tail, sizeof tail, "%s", r + strlen("  router: sigmoid\n"));
    snprintf(r, sizeof buf - (size_t)(r - buf), "%s%s", v2, tail);
    ml_model *m = load_str(buf);
    ml_config one = with_ep(m, 1, 2), two = with_ep(m, 2, 2);
    ml_ledger *a = eval(m, &one, false), *b = eval(m, &two, false);
    assert_int_equal(block_named(a, "block.1")->params - block_named(b, "block.1")->params,
                     13824);
    assert_int_equal(block_named(a, "block.1")->inventory_bytes,
                     block_named(b, "block.1")->inventory_bytes);
    assert_rel_close(ml_ledger_summary(b)->ep_comm_bytes, 99168, 0);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
    ml_model_destroy(m);
}

/* The all-to-alls of a layer and micro-batch, a row D x 4 = 128 B, a
 * routing weight 4 B, (ep - 1)/ep = 1/2 of each sent to the other rank:
 * forward the P = 32 pairs' tokens and weights, 32 x 132 = 4,224, and the
 * R = 32 rows' outputs back, 4,096 (8,320); backward the returned rows'
 * gradients 32 x 128 = 4,096 and the received rows' and weights', 32 x
 * 132 = 4,224 (8,320): half of 16,640 a layer is 8,320. Before them, the
 * experts' counts all-gathered over the 2 ranks: the other rank's 4 x 8 =
 * 32 B. Two layers: 2 x (8,320 + 32) = 16,704 B. Recomputed (full
 * checkpointing) each layer's forward again: + 2 x (4,160 + 32) = 8,384.
 * Calls: 7 a layer, 4 more recomputed. The gradients' all-reduce over dp
 * = 2 sends 2 (1/2) of each gradient's 4 bytes, but the experts' are not
 * reduced at all (each rank holds its own: dp / ep = 1 rank a group):
 * 4 (P - 2 x 12,288) B. */
static void test_collectives(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 2);
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_rel_close(s->ep_comm_bytes, 16704, 0);
    assert_rel_close(s->ep_calls, 14, 0);
    assert_rel_close(s->comm_bytes, 4.0 * (double)(s->params - 24576), 1e-15);
    ml_ledger_destroy(l);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->ep_comm_bytes, 16704 + 8384, 0);
    assert_rel_close(ml_ledger_summary(l)->ep_calls, 22, 0);
    ml_ledger_destroy(l);
    c = with_ep(m, 1, 2);
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->ep_comm_bytes, 0, 0);
    assert_rel_close(ml_ledger_summary(l)->comm_bytes,
                     4.0 * (double)ml_ledger_summary(l)->params, 1e-15);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* ZeRO 1 beside ep 2 over dp 4: the rank's 34,336 parameters (two
 * layers of 15,552, the embedding and head 1,600 and 1,632) are 9,760 of
 * the rest, sharded over the 4 data-parallel ranks, and 2 x 12,288 =
 * 24,576 of its experts, sharded over the 4 / 2 = 2 ranks that hold them.
 * AdamW's two fp32 states: 8 x 9,760 / 4 + 8 x 24,576 / 2 = 19,520 +
 * 98,304 = 117,824 B. The collectives, a reduce-scatter of the gradients
 * and an all-gather of the parameters (4 B each): 3/4 of the rest's and
 * 1/2 of the experts', 2 x 4 x (3/4 x 9,760 + 1/2 x 24,576) = 156,864 B. */
static void test_zero1(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 4);
    c.training.zero = 1;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->params, 34336);
    assert_int_equal(s->bytes_optimizer, 117824);
    assert_rel_close(s->comm_bytes, 156864, 1e-15);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* ZeRO 2 beside ep 2 over dp 4: each layer's gradient, 3,264 parameters
 * of the rest (15,552 - 12,288) over the 4 ranks and its two experts'
 * 12,288 over 2: 4 x 3,264 / 4 + 4 x 12,288 / 2 = 3,264 + 24,576 =
 * 27,840 B; the embedding's 1,600 x 4 / 4 and the head's 1,632 x 4 / 4:
 * 2 x 27,840 + 1,600 + 1,632 = 58,912 B of gradients. The collectives: the
 * gradients reduce-scattered (one micro-batch) and the parameters
 * all-gathered, as ZeRO 1's here, 156,864 B; with 2 micro-batches the
 * reduce-scatter twice: 156,864 + 4 x (3/4 x 9,760 + 1/2 x 24,576) =
 * 235,296 B. */
static void test_zero2(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 4);
    c.training.zero = 2;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->bytes_grads, 58912);
    assert_int_equal(s->bytes_optimizer, 117824);
    assert_rel_close(s->comm_bytes, 156864, 1e-15);
    ml_ledger_destroy(l);
    c.training.grad_accum = 2;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->comm_bytes, 235296, 1e-15);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* ZeRO 3 beside ep 2 over dp 4: the parameters' shards as the gradients'
 * under ZeRO 2, 4 x 9,760 / 4 + 4 x 24,576 / 2 = 58,912 B resident; the
 * collectives, every block's parameters gathered in forward and backward
 * and its gradient reduce-scattered: 2 x 78,432 + 78,432 = 235,296 B
 * (78,432 = 4 x (3/4 x 9,760 + 1/2 x 24,576)). */
static void test_zero3(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 4);
    c.training.zero = 3;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->bytes_params, 58912);
    assert_int_equal(s->bytes_grads, 58912);
    assert_rel_close(s->comm_bytes, 235296, 1e-15);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The dispatch's buffers beside the block's saved tensors: forward, the
 * send buffer P D 4 = 4,096 and the received rows, the experts' weighted
 * outputs and their concatenation, 3 R D 4 = 12,288: 16,384 at the cat,
 * above the block rule's twice the largest unsaved tensor (4,096: a
 * pairs' or rows' buffer, the busiest expert's 16 x 64 x 4), 8,192.
 * Backward (the block rule's: no node list), beside its transient, the
 * split's backward with the experts' input gradients, their
 * concatenation and the incoming rows' gradient, 3 R D 4 = 12,288. */
static void test_dispatch_buffers(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = with_ep(m, 2, 2);
    ml_chain ch;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &c, &ch, &e), ML_OK);
    const ml_cblock *b = &ch.blocks[1];
    assert_string_equal(b->name, "block.0");
    assert_true(b->nnodes == 0);
    assert_int_equal(b->ws_fwd, 16384);
    /* the block rule's backward: the output's gradient B T D 4 = 2,048 and
     * twice the largest tensor, the attention's one entry for the q and k
     * copies, 2 x B H T dh 4 = 4,096 (v's copy its own entry, released by
     * the PV node, its only saver), as large as a pairs' buffer: 8,192;
     * and the dispatch's 12,288 */
    assert_int_equal(b->bwd_in, 2048);
    assert_int_equal(b->ws_bwd, 2048 + 8192 + 12288);
    /* under no_grad the sorted rows are not saved: 16,384 + 4,096 */
    assert_int_equal(b->ws_nograd, 20480);
    assert_int_equal(ch.ep_rows, 32);
    ml__chain_free(&ch);
    ml_model_destroy(m);
}

static void test_refusals(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_error e;
    ml_config c = with_ep(m, 3, 3); /* 3 does not divide 4 experts */
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "routed experts"));
    c = with_ep(m, 2, 1); /* nor are there 2 data-parallel ranks */
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "tp x cp x dp"));
    c = with_ep(m, 4, 4);
    assert_int_equal(status_of(m, &c, &e), ML_OK);
    c.training.zero = 1;
    c.training.offload = ML_OFFLOAD_OPTIMIZER;
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "offload"));
    ml_model_destroy(m);
    /* a dense model has no experts to split */
    m = load_preset("gpt2-small");
    c = with_ep(m, 2, 2);
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "has none"));
    ml_model_destroy(m);
}

/* A prepared planner never derives a mixture of experts' chain (its rows
 * per expert are not on a line in the micro-batch): every evaluation
 * builds one, and its figures are those of ml_ledger_evaluate's. */
static void test_planner(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_planner *p = NULL;
    assert_int_equal(ml_planner_create(m, &p, NULL), ML_OK);
    ml_config c = with_ep(m, 2, 2);
    for (uint64_t B = 1; B <= 5; B++) {
        c.training.micro_batch = B;
        ml_ledger *a = NULL, *b = NULL;
        assert_int_equal(ml_planner_evaluate(p, &c, false, &a, NULL), ML_OK);
        assert_int_equal(ml_ledger_evaluate(m, &c, false, &b, NULL), ML_OK);
        const ml_summary *x = ml_ledger_summary(a), *y = ml_ledger_summary(b);
        assert_int_equal(x->peak, y->peak);
        assert_int_equal(x->bytes_activations, y->bytes_activations);
        assert_rel_close(x->flops_forward, y->flops_forward, 0);
        assert_rel_close(x->ep_comm_bytes, y->ep_comm_bytes, 0);
        ml_ledger_destroy(a);
        ml_ledger_destroy(b);
    }
    assert_int_equal(ml__planner_derived(p), 0);
    ml_planner_destroy(p);
    ml_model_destroy(m);
}

/* The layout search on 4 devices of a node of 4, tp, cp and pp pinned at
 * 1 (so dp 4), a global batch of 4: the four ZeRO stages over the 4
 * data-parallel ranks, and beside each every ep dividing the 4 experts and
 * the 4 ranks (1, 2, 4): 4 x 3 = 12 layouts. Every row is the plan of
 * its settings, ep included; a row with ep 4 holds one expert a layer. */
static void test_search(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    c.device = ml_config_defaults().device;
    c.device.present = true;
    c.device.memory = UINT64_C(80) << 30;
    c.device.peak_tflops = 100;
    ml_layout_request req = ml_layout_request_defaults();
    req.gpus = 4;
    req.gpus_per_node = 4;
    req.global_batch = 4;
    req.tp = req.cp = req.pp = 1;
    ml_layout_result out;
    ml_error e;
    assert_int_equal(ml_layout_search(m, &c, &req, &out, &e), ML_OK);
    assert_int_equal(out.layouts, 12);
    for (size_t i = 0; i < out.nrows; i++) {
        const ml_layout_row *w = &out.rows[i];
        assert_int_equal(w->tp * w->pp * w->dp, 4);
        ml_config k = ml_layout_config(&c, w);
        assert_int_equal(ml_training_ep(&k.training), w->ep > 1 ? w->ep : 1);
        ml_ledger *l = eval(m, &k, false);
        assert_int_equal(ml_ledger_summary(l)->peak, w->peak);
        if (w->ep == 4) /* one expert of 3 x 32 x 64 = 6,144: 27,840 - 3 x 6,144 */
            assert_int_equal(block_named(l, "block.0")->params, 9408);
        ml_ledger_destroy(l);
    }
    req.ep = 2; /* pinned: 4 layouts (ZeRO 0 to 3) */
    assert_int_equal(ml_layout_search(m, &c, &req, &out, &e), ML_OK);
    assert_int_equal(out.layouts, 4);
    for (size_t i = 0; i < out.nrows; i++)
        assert_int_equal(out.rows[i].ep, 2);
    /* tp 2 (dp 2): each ZeRO stage with the experts' width over etp 2
     * (tp's), ep 1 or 2 (ep x 2 dividing the 4 ranks), and over etp 1, ep 2
     * or 4 (ep 1 would leave the experts replicated over the tensor pair):
     * 4 x 4 = 16 layouts */
    req.ep = 0;
    req.tp = 2;
    assert_int_equal(ml_layout_search(m, &c, &req, &out, &e), ML_OK);
    assert_int_equal(out.layouts, 16);
    for (size_t i = 0; i < out.nrows; i++) {
        const ml_layout_row *w = &out.rows[i];
        ml_config k = ml_layout_config(&c, w);
        assert_int_equal(ml_training_etp(&k.training), w->etp ? w->etp : 2);
        assert_true(w->etp ? (w->ep == 2 || w->ep == 4) : w->ep <= 2);
        ml_ledger *l = eval(m, &k, false);
        assert_int_equal(ml_ledger_summary(l)->peak, w->peak);
        ml_ledger_destroy(l);
    }
    /* etp pinned at 2 over every searched tp (1 too: the experts' width
     * over two data-parallel ranks), timed (the expert groups' span) */
    req.tp = 0;
    c.training.expert_tensor_parallel = 2;
    c.device.interconnect_gbps = 100;
    req.network_gbps = 10;
    assert_int_equal(ml_layout_search(m, &c, &req, &out, &e), ML_OK);
    assert_true(out.nrows > 0);
    for (size_t i = 0; i < out.nrows; i++) {
        assert_int_equal(out.rows[i].etp, 2);
        assert_true(out.rows[i].step_s > 0);
    }
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_block),       cmocka_unit_test(test_imbalance),
        cmocka_unit_test(test_collectives),      cmocka_unit_test(test_dispatch_buffers),
        cmocka_unit_test(test_refusals),         cmocka_unit_test(test_planner),
        cmocka_unit_test(test_zero1),            cmocka_unit_test(test_search),
        cmocka_unit_test(test_zero2),            cmocka_unit_test(test_zero3),
        cmocka_unit_test(test_capacity),         cmocka_unit_test(test_deepseek),
        cmocka_unit_test(test_one_local),        cmocka_unit_test(test_deepseek_v2),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
