/* The heads and the loss as op graphs (kit_head.h), in the order the
 * chain builders listed what they keep (ledger/chain_head.c). */
#include "graph/kit_head.h"

/* The literal size v's dimension: a graph out of slots is full. */
static uint8_t lit(ml_graph *g, uint64_t v)
{
    if (g->nlit >= MLG_NLIT) {
        g->full = true;
        return MLG_L0;
    }
    g->lit[g->nlit] = v;
    return (uint8_t)(MLG_L0 + g->nlit++);
}

void ml__kit_ce_loss(ml_graph *g, uint64_t rows, uint64_t classes)
{
    ml__graph_init(g);
    const uint8_t r = lit(g, rows), c = lit(g, classes);
    uint16_t x = ml__graph_tensor(g, "logits", MLG_COMPUTE, MLG_INPUT, 2, r, c);
    uint16_t ls = ml__graph_tensor(g, "log-softmax output", MLG_STREAM, MLG_ACT, 2, r, c);
    mlg_op *o = ml__graph_step(g, MLG_OP_SOFTMAX, "log_softmax", x, ls, NULL);
    ml__op_save(o, ls);
    uint16_t y = ml__graph_tensor(g, "targets (int64)", MLG_INT64, MLG_BATCH, 1, r);
    uint16_t tw = ml__graph_tensor(g, "nll_loss total_weight (fp32 scalar)", MLG_FP32, MLG_ACT, 0);
    uint16_t loss = ml__graph_tensor(g, "loss", MLG_FP32, MLG_ACT, 0);
    o = ml__graph_step(g, MLG_OP_ELEMENTWISE, "nll_loss", ls, loss, NULL);
    ml__op_in(o, y);
    ml__op_out(o, tw);
    ml__op_save(o, y);
    ml__op_save(o, tw);
    g->out = MLG_NONE;
}
