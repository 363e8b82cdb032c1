/* T5Stack.forward's own tensors (modeling_t5.py, transformers 4.5x): what
 * it makes before its loop over the blocks and holds through it, and
 * passes to every block (kit_t5.h). Side tensors all: the chain holds
 * them from the stack's embedding to its return (ledger/chain_graph_t5.c,
 * docs/graph.md "T5's side tensors"). */
#include "graph/kit_t5.h"

/* A side tensor of `role` (MLG_ACT: made here; MLG_INPUT: an argument). */
static uint16_t side(ml_graph *g, const char *name, uint8_t dtype, uint8_t role, unsigned ndim,
                     uint8_t d0, uint8_t d1, uint8_t d2)
{
    uint16_t t = ndim == 1   ? ml__graph_tensor(g, name, dtype, role, 1, d0)
                 : ndim == 2 ? ml__graph_tensor(g, name, dtype, role, 2, d0, d1)
                             : ml__graph_tensor(g, name, dtype, role, 3, d0, d1, d2);
    if (t < g->nt)
        g->t[t].flags |= MLG_T_SIDE;
    return t;
}

/* The mask every block's self-attention adds to its bias: the encoder's
 * extended (B, 1, 1, T), the decoder's causal (B, 1, T, T). */
static uint16_t self_mask(ml_graph *g, const mlg_t5 *L, uint8_t role)
{
    return L->decoder ? side(g, "causal mask (B, 1, T, T)", MLG_STREAM, role, 3, MLG_B, MLG_T,
                             MLG_T)
                      : side(g, "extended attention mask (B, 1, 1, T)", MLG_STREAM, role, 2,
                             MLG_B, MLG_T, 0);
}

static uint16_t cache_position(ml_graph *g, uint8_t role)
{
    return side(g, "cache_position (int64)", MLG_INT64, role, 1, MLG_T, 0, 0);
}

static uint16_t inverted(ml_graph *g, uint8_t role)
{
    return side(g, "inverted encoder mask (B, 1, 1, Ts)", MLG_STREAM, role, 2, MLG_B, MLG_TS, 0);
}

void ml__kit_t5_args(ml_graph *g, const mlg_t5 *L, uint16_t args[3])
{
    args[0] = self_mask(g, L, MLG_INPUT);
    args[1] = cache_position(g, MLG_INPUT);
    args[2] = L->decoder ? inverted(g, MLG_INPUT) : MLG_NONE;
}

/* The ops name no backward node: masks and positions take no gradient;
 * the embedding's is its block's (kit_embed.c), which these ops only
 * stand beside. */
void ml__kit_t5_stack(ml_graph *g, const mlg_t5 *L)
{
    ml__graph_init(g);
    /* attention_mask = torch.ones(B, T) when none is given */
    uint16_t ones = side(g, "attention mask of ones (fp32)", MLG_FP32, MLG_ACT, 2, MLG_B, MLG_T, 0);
    uint16_t m = self_mask(g, L, MLG_ACT);
    uint16_t cp = cache_position(g, MLG_ACT);
    uint16_t e = MLG_NONE;
    if (L->dropout)
        e = side(g, "embedding output (inputs_embeds, before its dropout)", MLG_STREAM, MLG_ACT,
                 3, MLG_B, MLG_T, MLG_D);
    uint16_t eones = MLG_NONE, inv = MLG_NONE;
    if (L->decoder) {
        eones = side(g, "encoder attention mask of ones (int64)", MLG_INT64, MLG_ACT, 2, MLG_B,
                     MLG_TS, 0);
        inv = inverted(g, MLG_ACT);
    }
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "ones (attention mask)", MLG_NONE, ones, NULL);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, L->decoder ? "causal mask" : "extended attention mask",
                   ones, m, NULL);
    ml__graph_step(g, MLG_OP_ELEMENTWISE, "arange (cache_position)", MLG_NONE, cp, NULL);
    if (e != MLG_NONE) { /* embed_tokens' output, which the dropout reads */
        ml__graph_step(g, MLG_OP_VIEW, "embed_tokens", MLG_NONE, e, NULL);
        ml__graph_step(g, MLG_OP_DROPOUT, "dropout (its own block's)", e, MLG_NONE, NULL);
    }
    if (L->decoder) {
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "ones (encoder mask)", MLG_NONE, eones, NULL);
        ml__graph_step(g, MLG_OP_ELEMENTWISE, "invert_attention_mask", eones, inv, NULL);
    }
}
