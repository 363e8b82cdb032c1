/* Mixtral's and Qwen2-MoE's routed experts through Megatron-core's
 * dispatch (kit_mixtral.h), under expert, expert-tensor or tensor
 * parallelism (docs/parallel.md, "Expert parallelism" and "Tensor
 * parallelism with experts; expert tensor parallelism"): the rank's
 * E / ep experts on the rows an all-to-all brings it, with the dispatch
 * and combine of Megatron-core's MoEAlltoAllTokenDispatcher
 * (megatron/core/transformer/moe/token_dispatcher.py, moe_utils.py
 * permute/unpermute, sort_chunks_by_idxs): the P = k B T pairs' tokens
 * gathered in expert order (index_select keeps its int64 index, the
 * pairs' tokens; the routing weights gathered by the pairs' order, which
 * their index keeps), the all-to-all into the rows
 * the rank's experts take (with expert-tensor ranks, an all-gather of
 * theirs: R), sorted by local expert (a copy the experts'
 * matmuls read through views: saved once), the experts as the model's
 * (SwiGLU, each output weighted by its routing weights), their outputs
 * concatenated, sorted back by source rank, sent back (the second
 * all-to-all, P rows, after the expert-tensor ranks' reduce-scatter), and
 * summed into the tokens by scatter_add_ (it keeps only the index). The
 * send buffer and the received rows stay referenced until the layer
 * returns (MoELayer's locals); the backward is the block rule's with the
 * dispatch's buffers beside it (ml__ep_dispatch). */
#include <stddef.h>

#include "graph/kit_mixtral.h"

static uint16_t ep_rows_of(ml_graph *g, const char *name, uint8_t dtype, uint8_t rows)
{
    uint16_t t = ml__graph_tensor(g, name, dtype, MLG_ACT, 2, rows, MLG_D);
    ml__kit_flag(g, t, MLG_T_TMP);
    return t;
}

static uint16_t ep_rows(ml_graph *g, const char *name, uint8_t dtype)
{
    return ep_rows_of(g, name, dtype, MLG_R);
}

/* Of the pairs the rank sends (MLG_PS): w wide (0: one element each). */
static uint16_t pairs_of(ml_graph *g, const char *name, uint8_t dtype, uint8_t w)
{
    uint16_t t = w ? ml__graph_tensor(g, name, dtype, MLG_ACT, 2, MLG_PS, w)
                   : ml__graph_tensor(g, name, dtype, MLG_ACT, 1, MLG_PS);
    if (t != MLG_NONE)
        g->t[t].local = true;
    return t;
}

static uint16_t ep_pairs(ml_graph *g, const char *name, uint8_t dtype)
{
    uint16_t t = pairs_of(g, name, dtype, MLG_D);
    ml__kit_flag(g, t, MLG_T_TMP);
    return t;
}

/* One local expert on its rows of xs (a view), weighted by its rows of the
 * sorted routing weights rw (a view): w1, silu, w3, the product, w2, the
 * weighting (keeps the output and the weights). */
static void ep_expert_ops(ml_graph *g, const mlg_expert *e, uint16_t xs, uint16_t rw,
                          const uint16_t W[3], const uint16_t wc[3])
{
    ml__kit_cast_ops(g, xs, e->c1, MLG_NONE, MLG_NONE);
    mlg_op *o = ml__kit_expert_mm(g, "mm (w1)", "MmBackward0 (w1)", xs, e->c1, wc[0], W[0], e->G1);
    /* the three matmuls of the rank's experts, over the R rows they take */
    ml__op_flops(o, 6.0, 3, MLG_R, MLG_D, MLG_FE);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "silu", e->G1, e->A1, "SiluBackward0 (expert)");
    ml__op_save(o, e->G1);
    ml__kit_cast_ops(g, xs, e->c3, MLG_NONE, MLG_NONE);
    ml__kit_expert_mm(g, "mm (w3)", "MmBackward0 (w3)", xs, e->c3, wc[1], W[2], e->U);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (silu * w3)", e->A1, e->P,
                       "MulBackward0 (silu * w3)");
    ml__op_in(o, e->U);
    ml__op_save(o, e->A1);
    ml__op_save(o, e->U);
    ml__kit_expert_mm(g, "mm (w2)", "MmBackward0 (w2)", e->P, MLG_NONE, wc[2], W[1], e->Y);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "mul (expert output * weights)", e->Y, e->Z,
                       "MulBackward0 (expert output * weights)");
    ml__op_in(o, rw);
    ml__op_save(o, e->Y);
    ml__op_save(o, rw);
}

/* The dispatch's tensors (ep_dispatch_tensors), by name. */
enum { D_IDX, D_XP, D_WP, D_XR, D_WR, D_XG, D_WG, D_XS, D_WS, D_TOK, D_N };

/* The dispatch: argsort (no grad), index_select of the tokens (keeps its
 * index), the weights' rows by the same order, the all-to-alls (tokens,
 * then weights; none when the expert-parallel group is one rank: Megatron's
 * _AllToAll returns its input), the expert-tensor ranks' all-gathers of
 * both (gather_from_sequence_parallel_region: it saves nothing, its
 * backward a reduce-scatter; the gathered rows go once sorted), then
 * sort_chunks of each (none for one local expert: its rows as they come,
 * which its ops save). */
static void ep_dispatch(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t wk,
                        const uint16_t d[D_N])
{
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "argsort (the pairs by expert)", wk, d[D_IDX], NULL);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "the pairs' tokens (order // k)", d[D_IDX], d[D_TOK],
                   NULL);
    mlg_op *o = ml__graph_step(g, MLG_OP_COPY, "index_select (permute the tokens)", h, d[D_XP],
                               "IndexSelectBackward0 (permute)");
    ml__op_in(o, d[D_TOK]);
    ml__op_save(o, d[D_TOK]);
    o = ml__graph_step(g, MLG_OP_COPY, "index (permute the routing weights)", wk, d[D_WP],
                       "IndexBackward0 (permute the weights)");
    ml__op_in(o, d[D_IDX]);
    ml__op_save(o, d[D_IDX]);
    if (!L->moe.ep_one) {
        ml__graph_step(g, MLG_OP_COPY, "all_to_all (dispatch the tokens)", d[D_XP], d[D_XR],
                       "_AllToAll backward (dispatch)");
        ml__op_free(ml__graph_step(g, MLG_OP_COPY, "all_to_all (dispatch the weights)", d[D_WP],
                                   d[D_WR], "_AllToAll backward (weights)"),
                    d[D_WP]);
    }
    uint16_t x = d[D_XR], w = d[D_WR];
    if (L->moe.etp) {
        ml__graph_step(g, MLG_OP_COPY, "all_gather (the expert-tensor ranks' rows)", x, d[D_XG],
                       "_GatherFromSequenceParallelRegion backward (reduce-scatter)");
        ml__graph_step(g, MLG_OP_COPY, "all_gather (their routing weights)", w, d[D_WG],
                       "_GatherFromSequenceParallelRegion backward (weights)");
        x = d[D_XG];
        w = d[D_WG];
    }
    if (L->moe.one_local) /* the rows and weights are the expert's as they are */
        return;
    o = ml__graph_step(g, MLG_OP_COPY, "cat (sort_chunks by local expert)", x, d[D_XS],
                       "CatBackward0 (sort_chunks)");
    if (x == d[D_XG])
        ml__op_free(o, x);
    o = ml__graph_step(g, MLG_OP_COPY, "cat (sort the weights)", w, d[D_WS],
                       "CatBackward0 (sort the weights)");
    if (w == d[D_WG])
        ml__op_free(o, w);
}

/* The combine's tensors (ep_combine_tensors), by name. */
enum { C_CAT, C_BACK, C_B32, C_RS32, C_RS, C_YB, C_SUM, C_N };

/* The combine: cat of the experts' outputs Z, sort back, the expert-tensor
 * ranks' reduce-scatter (of the rows cast to the routing weights' fp32,
 * then cast back: combine_preprocess), the all-to-all, scatter_add_ into
 * zeros (keeps its index); then MoELayer returns, and its send buffer,
 * received rows and weights (its locals hidden_states, dispatched_input
 * and probs) and returned rows go. */
static void ep_combine(ml_graph *g, const mlg_layer *L, uint16_t Z, const uint16_t d[D_N],
                       const uint16_t c[C_N])
{
    mlg_op *o;
    uint16_t y = Z; /* one local expert: its output as it is */
    if (!L->moe.one_local) {
        o = ml__graph_step(g, MLG_OP_COPY, "cat (the experts' outputs)", Z, c[C_CAT],
                           "SplitWithSizesBackward0 (the experts' outputs)");
        ml__op_free(o, Z);
        ml__op_free(ml__graph_step(g, MLG_OP_COPY, "cat (sort_chunks by source rank)", c[C_CAT],
                                   c[C_BACK], "CatBackward0 (sort back)"),
                    c[C_CAT]);
        y = c[C_BACK];
    }
    if (L->moe.etp) {
        uint16_t x = y;
        if (c[C_B32] != MLG_NONE) {
            ml__graph_step(g, MLG_OP_COPY, "to (fp32: the reduce-scatter's dtype)", y, c[C_B32],
                           "ToCopyBackward0 (the reduce-scatter's cast)");
            x = c[C_B32];
        }
        const uint16_t r = c[C_B32] != MLG_NONE ? c[C_RS32] : c[C_RS];
        o = ml__graph_step(g, MLG_OP_COPY, "reduce_scatter (the expert-tensor ranks' outputs)",
                           x, r, "_ReduceScatterToSequenceParallelRegion backward (all-gather)");
        if (x != y)
            ml__op_free(o, x);
        if (r != c[C_RS]) {
            o = ml__graph_step(g, MLG_OP_COPY, "to (the rows' dtype)", r, c[C_RS],
                               "ToCopyBackward0 (back from fp32)");
            ml__op_free(o, r);
        }
        ml__op_free(o, y);
        y = c[C_RS];
    }
    uint16_t yb = y;
    if (!L->moe.ep_one) {
        ml__op_free(ml__graph_step(g, MLG_OP_COPY, "all_to_all (combine)", y, c[C_YB],
                                   "_AllToAll backward (combine)"),
                    y);
        yb = c[C_YB];
    }
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "zeros (unpermute)", MLG_NONE, c[C_SUM], NULL);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "scatter_add_ (unpermute)", yb, c[C_SUM],
                       "ScatterAddBackward0 (gather)");
    ml__op_in(o, d[D_TOK]);
    ml__op_save(o, d[D_TOK]);
    o = ml__graph_release(g, "the MoE layer returns");
    ml__op_free(o, d[D_XP]);
    if (d[D_XR] != d[D_XP])
        ml__op_free(o, d[D_XR]);
    ml__op_free(o, d[D_WR]); /* MoELayer's probs: the all-to-all's weights */
    ml__op_free(o, yb);
}

/* The dispatch's tensors, in the order the layer makes them: the pairs'
 * order, the send buffer, the permuted weights, the received rows and
 * weights (the send buffer and the permuted weights themselves in a group
 * of one rank), the gathered rows and weights (with expert-tensor ranks),
 * both sorted by local expert (saved by the experts' ops through views:
 * one entry each, released with the block's saved tensors), the pairs'
 * tokens (index_select's and scatter_add_'s index; the weights' gather
 * keeps the order). */
static void ep_dispatch_tensors(ml_graph *g, const mlg_layer *L, uint8_t hd, uint8_t wd,
                                uint16_t d[D_N])
{
    /* the weights' dtype: fp32 (Mixtral's softmax), or DeepSeek-V3's
     * scores' under autocast */
    const bool w32 = wd == MLG_FP32;
    d[D_IDX] = pairs_of(g, "pair order (argsort of the experts' indices, int64)", MLG_INT64, 0);
    d[D_XP] = ep_pairs(g, "permuted tokens (all-to-all send buffer)", hd);
    d[D_WP] = pairs_of(g, w32 ? "permuted routing weights (fp32)" : "permuted routing weights",
                       wd, 0);
    d[D_XR] = d[D_XP];
    d[D_WR] = d[D_WP];
    if (!L->moe.ep_one) {
        d[D_XR] = ep_rows_of(g, "received rows (all-to-all)", hd, MLG_RA);
        d[D_WR] = ml__graph_tensor(
            g, w32 ? "received routing weights (fp32)" : "received routing weights", wd, MLG_ACT,
            1, MLG_RA);
    }
    d[D_XG] = d[D_WG] = MLG_NONE;
    if (L->moe.etp) {
        d[D_XG] = ep_rows(g, "gathered rows (the expert-tensor ranks')", hd);
        d[D_WG] = ml__graph_tensor(
            g, w32 ? "gathered routing weights (fp32)" : "gathered routing weights", wd, MLG_ACT,
            1, MLG_R);
    }
    if (L->moe.one_local) { /* the expert's rows and weights as they come: saved */
        d[D_XS] = L->moe.etp ? d[D_XG] : d[D_XR];
        d[D_WS] = L->moe.etp ? d[D_WG] : d[D_WR];
        if (d[D_XS] != MLG_NONE)
            g->t[d[D_XS]].flags &= (uint8_t)~MLG_T_TMP;
    } else {
        d[D_XS] = ml__graph_tensor(g, "rows sorted by local expert", hd, MLG_ACT, 2, MLG_R,
                                   MLG_D);
        d[D_WS] = ml__graph_tensor(g,
                                   w32 ? "routing weights sorted by local expert (fp32)"
                                       : "routing weights sorted by local expert",
                                   wd, MLG_ACT, 1, MLG_R);
    }
    d[D_TOK] = pairs_of(g, "the pairs' tokens (int64)", MLG_INT64, 0);
    ml__kit_flag(g, d[D_XS], MLG_T_KEPT);
    ml__kit_flag(g, d[D_WS], MLG_T_KEPT);
}

/* The combine's tensors: the experts' outputs concatenated and sorted
 * back, with expert-tensor ranks their reduce-scatter's (in fp32 for rows
 * of another dtype, cast back), the returned rows, the sum. */
static void ep_combine_tensors(ml_graph *g, const mlg_layer *L, uint8_t hd, uint16_t c[C_N])
{
    c[C_CAT] = c[C_BACK] = MLG_NONE;
    if (!L->moe.one_local) {
        c[C_CAT] = ep_rows(g, "experts' outputs (cat)", hd);
        c[C_BACK] = ep_rows(g, "experts' outputs sorted by source rank", hd);
    }
    c[C_B32] = c[C_RS32] = c[C_RS] = MLG_NONE;
    if (L->moe.etp) {
        if (!L->moe.h32) {
            c[C_B32] = ep_rows(g, "experts' outputs in fp32 (the reduce-scatter's)", MLG_FP32);
            c[C_RS32] = ep_rows_of(g, "reduce-scattered outputs (fp32)", MLG_FP32, MLG_RA);
        }
        c[C_RS] = ep_rows_of(g, "reduce-scattered outputs", hd, MLG_RA);
    }
    c[C_YB] = L->moe.ep_one ? MLG_NONE : ep_pairs(g, "returned rows (all-to-all)", hd);
    c[C_SUM] = ml__graph_tensor(g, "routed experts' sum (scatter_add_)", hd, MLG_ACT, 3, MLG_B,
                                MLG_T, MLG_D);
    ml__kit_flag(g, c[C_SUM], MLG_T_TMP);
}

uint16_t ml__kit_mixtral_experts_ep(ml_graph *g, const mlg_layer *L, uint16_t h, uint16_t wk)
{
    const uint8_t hd = g->t[h].dtype;
    uint16_t d[D_N];
    ep_dispatch_tensors(g, L, hd, g->t[wk].dtype, d);
    const uint16_t t0 = g->nt;
    mlg_expert e;
    ml__kit_expert_tensors(g, L, hd, true, &e);
    const uint16_t t1 = g->nt;
    uint16_t wc[3], W[3];
    ml__kit_expert_weights(g, L, wc, W);
    uint16_t c[C_N];
    ep_combine_tensors(g, L, hd, c);
    ep_dispatch(g, L, h, wk, d);
    for (unsigned i = 0; i < 3; i++)
        ml__kit_cast_ops(g, MLG_NONE, MLG_NONE, wc[i], W[i]);
    const uint16_t o0 = g->nop;
    ep_expert_ops(g, &e, d[D_XS], d[D_WS], W, wc);
    ml__graph_repeat(g, t0, t1, o0, g->nop);
    ep_combine(g, L, e.Z, d, c);
    return c[C_SUM];
}
