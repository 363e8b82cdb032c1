/* A block's forward through the allocator simulation tensor by tensor
 * (chain.h, ml_fstep): its ops' outputs made and freed in order, with grad
 * its saved tensors kept, where the ledger counts the transient (ws_nograd,
 * ws_fwd) and the saved tensors as figures. */
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

/* Block k's steps, with grad or without: to_out, those before its output
 * (with grad, the saved allocation opened empty in category c first);
 * else those after it. */
static void steps(ml_replay *r, size_t k, bool grad, ml_category c, bool to_out)
{
    const ml_cblock *b = &r->ch->blocks[k];
    const size_t first = grad ? b->gstep_first : b->fstep_first;
    const size_t n = grad ? b->ngsteps : b->nfsteps, out = grad ? b->gstep_out : b->fstep_out;
    if (grad && to_out)
        ml__rsim_saved_open(r->rsim, c, b->saved_bytes, k, b->nsaved, b->gsave_per);
    /* without grad, autocast's weight copies stay: an allocation of the
     * workspace that the region's end frees (ml__replay_forward) */
    if (!grad && to_out && b->nfcopies)
        ml__rsim_saved_open(r->rsim, ML_CAT_WORKSPACE, b->cast_bytes, k, b->nfcopies, 1);
    run(r, &r->ch->fsteps[first], to_out ? 0 : out + 1, to_out ? out : n, k,
        grad ? c : ML_CAT_WORKSPACE);
}

bool ml__replay_steps_begin(ml_replay *r, size_t k, bool grad, ml_category c)
{
    const ml_cblock *b = &r->ch->blocks[k];
    const uint64_t ws = grad ? b->ws_fwd : b->ws_nograd;
    const bool known = grad ? b->ngsteps && !r->selective && !b->fwd_only : b->nfsteps;
    if (!r->rsim || !known || ws > (uint64_t)INT64_MAX ||
        (grad && b->saved_bytes > (uint64_t)INT64_MAX))
        return false;
    ml__replay_ledger_event(r, ML_CAT_WORKSPACE, (int64_t)ws);
    if (grad)
        ml__replay_ledger_event(r, c, (int64_t)b->saved_bytes);
    steps(r, k, grad, c, true);
    return true;
}

void ml__replay_steps_end(ml_replay *r, size_t k, bool grad, ml_category c, bool made)
{
    const ml_cblock *b = &r->ch->blocks[k];
    const uint64_t ws = grad ? b->ws_fwd : b->ws_nograd;
    if (!made) {
        ml__replay_free(r, ML_CAT_WORKSPACE, ws);
        return;
    }
    ml__replay_ledger_event(r, ML_CAT_WORKSPACE, -(int64_t)ws);
    steps(r, k, grad, c, false);
}
