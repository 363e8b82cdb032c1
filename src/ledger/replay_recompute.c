/* The recomputes before a block's backward (docs/ledger.md,
 * "Checkpointed segments"): a segment's forward again with grad, block by
 * block or node by node, and selective recompute's attention core. */
#include "ledger/replay.h"

/* Before the backward of block k, the last of its segment: the segment
 * s0..k runs its forward again, with grad. */
void ml__replay_recompute_segment(ml_replay *r, size_t s0, size_t k)
{
    const ml_chain *ch = r->ch;
    const size_t n = ch->n;
    const ml_cblock *B = ch->blocks;
    r->sub = " (recompute)";
    for (size_t j = s0; j <= k; j++) {
        r->block = (int32_t)j;
        const bool steps = ml__replay_steps_begin(r, j, true, ML_CAT_RECOMPUTE);
        if (!steps) {
            ml__replay_alloc_as(r, ML_CAT_WORKSPACE, B[j].ws_fwd, ML_T_UNITS_FWD, j, 1);
            ml__replay_alloc_as(r, ML_CAT_RECOMPUTE, B[j].saved_bytes, ML_T_SAVED, j, 1);
        }
        ml__sides_recompute(r, s0, j, true);
        if (j < k && (B[j].out_saved || B[j + 1].in_saved)) {
            r->recomputed[j + 1] = B[j + 1].in_bytes;
            ml__replay_alloc(r, ML_CAT_RECOMPUTE, r->recomputed[j + 1]);
        }
        uint64_t tout = 0; /* the segment's output, made and dropped (as in
                              ml__replay_recompute_nodes) */
        if (j == k && B[k].out_saved && k + 1 < n) {
            r->recomputed[k + 1] = B[k + 1].in_bytes; /* a recomputed copy of the output */
            ml__replay_alloc(r, ML_CAT_RECOMPUTE, r->recomputed[k + 1]);
        } else if (j == k && k + 1 < n && !r->bd[k + 1].alias) {
            tout = B[k + 1].in_bytes;
            ml__replay_alloc(r, ML_CAT_WORKSPACE, tout);
        }
        r->flops_done += B[j].flops_fwd;
        ml__replay_free(r, ML_CAT_WORKSPACE, tout);
        ml__replay_steps_end(r, j, true, ML_CAT_RECOMPUTE, steps);
        ml__replay_recompute_flops(r, B[j].flops_fwd);
    }
    ml__sides_recompute(r, s0, k, false);
    r->sub = "";
    r->block = (int32_t)k;
}

/* Selective recompute: block k's attention core made again before its
 * backward. */
void ml__replay_selective_core(ml_replay *r, size_t k)
{
    const ml_cblock *b = &r->ch->blocks[k];
    r->sub = " (recompute)";
    ml__replay_alloc_as(r, ML_CAT_RECOMPUTE, b->core_bytes, ML_T_SAVED_CORE, k, 1);
    ml__replay_recompute_flops(r, b->flops_core);
    r->flops_done += b->flops_core;
    r->sub = "";
}

/* The recompute of a node-level segment s0..k (non-reentrant
 * torch.utils.checkpoint: the first saved tensor its backward unpacks
 * re-runs the segment's forward with grad, docs/ledger.md, "Checkpointed
 * segments, node by node"): each block's forward again as in forward, its
 * saved tensors recreated (recompute) until their node releases them, an
 * interior boundary that a block of the segment saves recreated until its
 * users are done, one that nothing saves freed once its consumer has run.
 * The segment's output, unless saved, is a transient: the recompute runs
 * the forward to its end (1.13; 2.x's early stop may end it once the last
 * saved tensor is recreated, docs/ledger.md), so the block's transient is
 * its forward's (ws_fwd) with the output beside it. */
void ml__replay_recompute_nodes(ml_replay *r, size_t s0, size_t k)
{
    const ml_chain *ch = r->ch;
    const ml_cblock *B = ch->blocks;
    r->sub = " (recompute)";
    uint64_t tin = 0; /* the block's input when nothing saves it */
    for (size_t j = s0; j <= k; j++) {
        r->block = (int32_t)j;
        const bool steps = ml__replay_steps_begin(r, j, true, ML_CAT_RECOMPUTE);
        if (!steps) {
            ml__replay_alloc_as(r, ML_CAT_WORKSPACE, B[j].ws_fwd, ML_T_UNITS_FWD, j, 1);
            ml__replay_alloc_as(r, ML_CAT_RECOMPUTE, B[j].saved_bytes, ML_T_SAVED, j, 1);
        }
        ml__sides_recompute(r, s0, j, true);
        uint64_t tout = 0;
        if (j + 1 < ch->n) {
            uint64_t ob = r->bd[j + 1].alias ? 0 : B[j + 1].in_bytes;
            if (B[j].out_saved || (j < k && B[j + 1].in_saved)) {
                r->recomputed[j + 1] = ob;
                ml__replay_alloc(r, ML_CAT_RECOMPUTE, ob);
            } else {
                /* made, and freed once its consumer has run (the segment's
                 * last: at once) */
                tout = ob;
                ml__replay_alloc(r, ML_CAT_WORKSPACE, tout);
            }
        }
        r->flops_done += B[j].flops_fwd;
        ml__replay_recompute_flops(r, B[j].flops_fwd);
        ml__replay_steps_end(r, j, true, ML_CAT_RECOMPUTE, steps);
        ml__replay_free(r, ML_CAT_WORKSPACE, tin);
        tin = tout;
    }
    ml__replay_free(r, ML_CAT_WORKSPACE, tin);
    ml__sides_recompute(r, s0, k, false);
    r->sub = "";
    r->block = (int32_t)k;
}
