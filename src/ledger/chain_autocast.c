/* A block's backward nodes under autocast (docs/ledger.md, "Backward, node
 * by node"): the ToCopyBackward0 nodes of a product's autocast copies and
 * the gradients the product's own node makes (chain_graph.c's node()). */
#include <string.h>

#include "ledger/chain_kit.h"

bool ml__ck_mm_node(const mlg_op *o)
{
    return o->kind == MLG_OP_MATMUL && o->nparam == 1 && o->node &&
           !strncmp(o->node, "MmBackward0", 11);
}

/* A product under autocast (aten/src/ATen/autocast_mode.cpp, cached_cast)
 * reads copies: of its fp32 input (the op's input is not the tensor its
 * gradient goes to), of its weight (the copy it saves, MLG_T_WCAST) and of
 * its bias. Its node makes their gradients in the copies' dtype, then each
 * copy's ToCopyBackward0 makes the fp32 one from it and frees it: the
 * input's first, then the weight's, then the bias's (autocast casts the
 * bias, the weight, then the input: ml__kit_cast_ops; the engine runs the
 * latest node first). Those nodes go before the product's in the forward
 * order the list is built in (ml__ck_end reverses it); *gin and *pg become
 * the product's own. */
uint16_t ml__ck_autocast_weight(const ml_graph *g, const mlg_op *o)
{
    if (o->kind != MLG_OP_MATMUL || !o->nparam)
        return MLG_NONE;
    for (unsigned j = 0; j < o->nsave; j++)
        if (g->t[o->save[j]].flags & MLG_T_WCAST)
            return o->save[j];
    return MLG_NONE;
}

/* The product's copy of its input (ml__kit_cast_copy): what it reads is not
 * what its gradient goes to */
uint16_t ml__ck_autocast_input(const ml_graph *g, const mlg_op *o)
{
    return o->nin && o->ngin && o->in[0] != o->gin[0] && g->t[o->in[0]].dtype == MLG_HALF
               ? o->in[0]
               : MLG_NONE;
}

/* A bias's copy has no tensor of its own in the graph: its gradient's id
 * is the weight copy's second part (chain.h). */
static uint16_t bias_copy_id(uint16_t w)
{
    return (uint16_t)(w + (ML_GIDS + 1));
}

void ml__ck_autocast_param_copies(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G,
                                  const mlg_op *o, uint16_t w, const uint64_t *tb, uint64_t *gin,
                                  uint64_t *pg)
{
    const ml_graph *g = &G->g;
    ml_bnode *n;
    for (unsigned j = o->nparam < 2 ? o->nparam : 2; j-- > 0;) {
        const uint64_t n_el = ml__graph_numel(g, &G->z, o->param[j], &ch->overflow);
        const uint64_t full = ml_mul(ch, n_el, ch->prec.grad);
        const uint64_t half = j ? ml_mul(ch, n_el, ch->prec.a) : tb[w];
        ml__ck_node(ch, b, j ? "ToCopyBackward0 (autocast, bias)" : "ToCopyBackward0 (autocast, weight)",
                    0, full, half, SIZE_MAX, SIZE_MAX);
        if ((n = ml__ck_last_node(ch, b))) {
            n->ngout = 1;
            n->gout_id[0] = j ? bias_copy_id(w) : w;
            n->gout_b[0] = half;
        }
        *pg -= full;
        *gin = ml_add(ch, *gin, half);
    }
}

void ml__ck_autocast_input_copy(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G,
                                const mlg_op *o, uint16_t c, const uint64_t *tb, uint64_t *gin,
                                bool accum)
{
    const ml_graph *g = &G->g;
    ml_bnode *n;
    if (c != MLG_NONE) {
        ml__ck_node(ch, b, "ToCopyBackward0 (autocast, input)", tb[o->gin[0]], 0, tb[c],
                    SIZE_MAX, SIZE_MAX);
        if ((n = ml__ck_last_node(ch, b))) {
            n->ngin = n->ngout = 1;
            n->gin_id[0] = ml__ck_grad_id(g, o->gin[0]);
            n->gin_b[0] = tb[o->gin[0]];
            n->gin_acc = accum ? 1 : 0;
            n->gout_id[0] = c;
            n->gout_b[0] = tb[c];
        }
        *gin = ml_add(ch, *gin - tb[o->gin[0]], tb[c]);
    }
}

/* The product's own gradients under autocast: its input's (the input
 * copy's, in the copy's dtype, else the input's, which the accumulation
 * after it adds into the buffer: acc), its weight copy's and its bias
 * copy's, which the ToCopyBackward0 nodes after it free. */
void ml__ck_autocast_parts(ml_chain *ch, ml_cblock *b, const ml_ck_graph *G, const mlg_op *o,
                           uint16_t w, uint16_t c, const uint64_t *tb, bool acc)
{
    const ml_graph *g = &G->g;
    ml_bnode *n = ml__ck_last_node(ch, b);
    if (!n || !o->ngin)
        return;
    unsigned m = 0;
    n->gin_id[m] = c != MLG_NONE ? c : ml__ck_grad_id(g, o->gin[0]);
    n->gin_b[m++] = c != MLG_NONE ? tb[c] : tb[o->gin[0]];
    n->gin_acc = c == MLG_NONE && acc ? 1 : 0;
    n->gin_id[m] = w;
    n->gin_b[m++] = tb[w];
    if (o->nparam > 1) {
        n->gin_id[m] = bias_copy_id(w);
        n->gin_b[m++] = ml_mul(ch, ml__graph_numel(g, &G->z, o->param[1], &ch->overflow),
                               ch->prec.a);
    }
    n->ngin = (uint8_t)m;
    if (ml__ck_mm_node(o)) { /* MmBackward0: mat2's (the weight copy's) first */
        const uint16_t id = n->gin_id[0];
        const uint64_t bytes = n->gin_b[0];
        n->gin_id[0] = n->gin_id[1];
        n->gin_b[0] = n->gin_b[1];
        n->gin_id[1] = id;
        n->gin_b[1] = bytes;
        n->gin_acc = (uint8_t)(n->gin_acc << 1);
    }
    for (unsigned j = 0; j < o->ngout && j < 3; j++) {
        n->gout_id[j] = ml__ck_grad_id(g, o->gout[j]);
        n->gout_b[j] = tb[o->gout[j]];
    }
    n->ngout = o->ngout;
}

