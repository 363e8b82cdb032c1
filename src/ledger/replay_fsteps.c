/* A block's forward without grad through the allocator simulation tensor
 * by tensor (chain.h, ml_fstep): its ops' outputs made and freed in order,
 * where the ledger counts the transient as one figure (ws_nograd). */
#include "graph/graph.h"
#include "ledger/replay.h"
#include "ledger/reserved.h"

/* a forward tensor's part p names r->gname's slot tok + p (MLG_MAX_TENSORS + 1) */
_Static_assert(MLG_STEP_PARTS * (MLG_MAX_TENSORS + 1) <= ML_GID_NONE + 1,
               "the forward's tensors name r->gname's slots");

void ml__replay_fsteps(ml_replay *r, const ml_cblock *b, bool to_out)
{
    const ml_fstep *f = &r->ch->fsteps[b->fstep_first];
    const size_t from = to_out ? 0 : b->fstep_out + 1, to = to_out ? b->fstep_out : b->nfsteps;
    for (size_t i = from; i < to; i++) {
        const size_t slot = f[i].tok + f[i].part * (MLG_MAX_TENSORS + 1u);
        if (f[i].alloc) {
            r->gname[slot] = ml__replay_sim_tensor(r, ML_CAT_WORKSPACE, f[i].bytes);
        } else {
            ml__rsim_free_as(r->rsim, ML_CAT_WORKSPACE, r->gname[slot], f[i].bytes);
            r->gname[slot] = 0;
        }
    }
}
