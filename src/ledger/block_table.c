/* The plan's per-block report (ml_ledger_blocks): what each block would
 * keep without a plan, and what the plan keeps of it at the end of its
 * forward (docs/ledger.md). */
#include <stddef.h>
#include <string.h>

#include "ledger/replay.h"

/* Block k's row of the report as block k-1's but for its name, segment
 * and checkpoint index: each figure below reads blocks k-2 to k+1, the
 * boundaries k-1 to k+1, the segment plan at k-1 and k, the side block and
 * the side tensors. The run flags (ml__run_flags) say blocks k-2, k-1 and k
 * alike, neither k-1 nor k the side block, k-1 and k checkpointed alike,
 * the three boundaries alike; block k+1's input is block k's size (runs:
 * the flags of a chain without side tensors). */
static inline bool like_before(const unsigned char *runs, const ml_cblock *B, size_t n,
                               size_t k)
{
    return k >= 2 && k + 1 < n && (runs[k - 1] & ML_RUN_IN) && (runs[k] & ML_RUN_ON) &&
           B[k + 1].in_bytes == B[k].in_bytes;
}

_Static_assert(offsetof(ml_block_info, name) == 0, "a row's name comes first");

/* Which rows' backward runs node by node, as the replay decides (replay.c,
 * by_nodes: off under selective checkpointing or with sharded gradients):
 * a block outside a segment with its node list, a checkpointed one when
 * every block of its segment has one; not a block that runs forward only. */
static void backward_nodes(const ml_chain *ch, const int *seg, bool off, ml_block_info *rows)
{
    for (size_t k = 0, end; k < ch->n; k = end) {
        end = k + 1;
        if (seg[k] >= 0)
            while (end < ch->n && seg[end] == seg[k])
                end++;
        const bool all = ml__segment_by_nodes(ch, k, end - 1);
        for (size_t j = k; j < end; j++)
            rows[j].backward_nodes = !off && all && !ch->blocks[j].fwd_only;
    }
}

/* The per-block report: inventory and c without a plan, and what the plan
 * keeps of each block at the end of forward. A whole replay (the runs'
 * reference, tests/unit/test_runs.c) computes every row, so that the rows
 * copied here are held against rows computed. */
void ml__eval_block_table(const ml_evalctx *x, const int *seg, ml_ledger *l)
{
    const ml_chain *ch = x->ch;
    const size_t n = ch->n;
    const ml_boundary *bd = x->bd;
    const bool selective = x->cfg->training.checkpoint.kind == ML_CKPT_SELECTIVE;
    double norm = (double)ch->c_tokens * (double)ch->c_width * (double)ch->prec.a;
    const ml_block_info *row = NULL; /* the last row computed */
    /* (the rows' bytes might alias anything: the chain's figures read into
     * locals once) */
    const unsigned char *runs = ch->nsides || x->whole ? NULL : x->runs;
    const ml_cblock *B = ch->blocks;
    ml_block_info *rows = l->blocks;
    for (size_t k = 0; k < n; k++) {
        const ml_cblock *b = &B[k];
        ml_block_info *bi = &rows[k];
        if (runs && like_before(runs, B, n, k)) {
            /* the row computed last, not the one just written (a load that
             * would wait on a store), but for its name (the first field) */
            memcpy(bi->name, b->name, sizeof bi->name);
            memcpy((char *)bi + sizeof bi->name, (const char *)row + sizeof row->name,
                   sizeof *bi - sizeof bi->name);
            bi->segment = seg[k];
            bi->ckpt_index = b->ckpt_index;
            continue;
        }
        memcpy(bi->name, b->name, sizeof bi->name);
        bi->params = b->params;
        bi->checkpointed = seg[k] >= 0;
        bi->segment = seg[k];
        bi->ckpt_index = b->ckpt_index;
        bi->measured = b->measured;
        bi->unused_output = b->unused_out;
        bi->frozen = b->frozen;
        bi->transients = b->ws_formula                      ? ML_TRANSIENTS_FORMULA
                         : b->ws_fwd_ops && b->ws_nograd_ops ? ML_TRANSIENTS_OPS
                         : b->ws_fwd_ops || b->ws_nograd_ops ? ML_TRANSIENTS_PARTLY
                                                             : ML_TRANSIENTS_BLOCK_RULE;
        bi->flops_forward = b->flops_fwd;
        /* inventory without a plan: a boundary counts with the block that
         * saves it first, the producer when it saves its own output (the
         * module running when autograd saved it) */
        uint64_t inv = b->saved_bytes;
        if (b->in_saved && !(k > 0 && B[k - 1].out_saved))
            inv += b->in_bytes;
        if (b->out_saved && k + 1 < n)
            inv += B[k + 1].in_bytes;
        if (b->unused_out) /* its norm saves its input, for no backward */
            inv = b->saved_bytes + b->in_bytes;
        bi->inventory_bytes = inv;
        /* (the block before's quotient where the inventories agree: a run
         * of layers divides once) */
        bi->c = k > 0 && inv == rows[k - 1].inventory_bytes ? rows[k - 1].c
                : norm > 0                                       ? (double)inv / norm
                                                                 : 0;
        uint64_t kept = seg[k] < 0 && !b->fwd_only
                            ? b->saved_bytes - (selective ? b->core_bytes : 0) : 0;
        if (bd[k].kept && bd[k].cat == ML_CAT_ACTIVATIONS && bd[k].by_consumer && !bd[k].alias)
            kept += b->in_bytes;
        if (k + 1 < n && bd[k + 1].kept && bd[k + 1].cat == ML_CAT_ACTIVATIONS &&
            !bd[k + 1].by_consumer && !bd[k + 1].alias)
            kept += B[k + 1].in_bytes;
        if ((int)k == x->side_block)
            kept += ch->ckpt_side;
        /* a side tensor kept for the backward counts with its maker */
        for (size_t i = 0, end; i < ch->nsides; i++)
            if (ch->sides[i].from == k && ml__side_end(ch, seg, &ch->sides[i], &end))
                kept += ch->sides[i].bytes;
        bi->activations_saved = kept;
        row = bi;
    }
    backward_nodes(ch, seg, selective || ml__zero_stage(&x->cfg->training) >= 2, rows);
    l->nblocks = n;
}
