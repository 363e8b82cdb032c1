/* A block's forward without grad through the allocator simulation tensor
 * by tensor (chain.h, ml_fstep): its ops' outputs made and freed in order,
 * where the ledger counts the transient as one figure (ws_nograd). */
#include "graph/graph.h"
#include "ledger/replay.h"
#include "ledger/reserved.h"

/* a forward tensor's part p names r->gname's slot tok + p (MLG_MAX_TENSORS + 1) */
_Static_assert(MLG_STEP_PARTS * (MLG_MAX_TENSORS + 1) <= ML_GID_NONE + 1,
               "the forward's tensors name r->gname's slots");

/* Steps f[from .. to) of block k (saved allocations into category c). */
static void run(ml_replay *r, const ml_fstep *f, size_t from, size_t to, size_t k, ml_category c)
{
    for (size_t i = from; i < to; i++) {
        const size_t slot = f[i].tok + f[i].part * (MLG_MAX_TENSORS + 1u);
        if (f[i].alloc && f[i].entry != ML_FSTEP_UNSAVED) {
            ml__rsim_saved_fill(r->rsim, c, k, f[i].entry, f[i].slot, f[i].bytes);
            ml__replay_reserved_point(r);
        } else if (f[i].alloc) {
            r->gname[slot] = ml__replay_sim_tensor(r, ML_CAT_WORKSPACE, f[i].bytes);
        } else {
            ml__rsim_free_as(r->rsim, ML_CAT_WORKSPACE, r->gname[slot], f[i].bytes);
            r->gname[slot] = 0;
        }
    }
}

void ml__replay_fsteps(ml_replay *r, const ml_cblock *b, bool to_out)
{
    const ml_fstep *f = &r->ch->fsteps[b->fstep_first];
    const size_t from = to_out ? 0 : b->fstep_out + 1, to = to_out ? b->fstep_out : b->nfsteps;
    run(r, f, from, to, 0, ML_CAT_WORKSPACE);
}

/* Block k's steps with grad: to_out, the saved allocation opened empty in
 * category c and the steps before the output; else the steps after it. */
static void gsteps(ml_replay *r, size_t k, ml_category c, bool to_out)
{
    const ml_cblock *b = &r->ch->blocks[k];
    const ml_fstep *f = &r->ch->fsteps[b->gstep_first];
    const size_t from = to_out ? 0 : b->gstep_out + 1, to = to_out ? b->gstep_out : b->ngsteps;
    if (to_out)
        ml__rsim_saved_open(r->rsim, c, b->saved_bytes, k, b->gsave_per);
    run(r, f, from, to, k, c);
}

bool ml__replay_grad_begin(ml_replay *r, size_t k, ml_category c)
{
    const ml_cblock *b = &r->ch->blocks[k];
    if (!r->rsim || !b->ngsteps || r->selective || b->fwd_only || b->ws_fwd > (uint64_t)INT64_MAX ||
        b->saved_bytes > (uint64_t)INT64_MAX)
        return false;
    ml__replay_ledger_event(r, ML_CAT_WORKSPACE, (int64_t)b->ws_fwd);
    ml__replay_ledger_event(r, c, (int64_t)b->saved_bytes);
    gsteps(r, k, c, true);
    return true;
}

void ml__replay_grad_end(ml_replay *r, size_t k, ml_category c, bool steps)
{
    const ml_cblock *b = &r->ch->blocks[k];
    if (!steps) {
        ml__replay_free(r, ML_CAT_WORKSPACE, b->ws_fwd);
        return;
    }
    ml__replay_ledger_event(r, ML_CAT_WORKSPACE, -(int64_t)b->ws_fwd);
    gsteps(r, k, c, false);
}
