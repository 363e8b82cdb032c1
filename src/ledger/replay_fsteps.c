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
    size_t at = 0;
    while (at < b->nfsteps && !f[at].out)
        at++;
    const size_t from = to_out ? 0 : at + 1, to = to_out ? at : b->nfsteps;
    for (size_t i = from; i < to; i++) {
        const size_t slot = f[i].tok + f[i].part * (MLG_MAX_TENSORS + 1u);
        if (f[i].alloc) {
            ml__rsim_alloc(r->rsim, ML_CAT_WORKSPACE, f[i].bytes, ML_T_ONE, 0, 1);
            r->gname[slot] = ml__rsim_latest(r->rsim, ML_CAT_WORKSPACE);
            ml__replay_reserved_point(r);
        } else {
            ml__rsim_free_as(r->rsim, ML_CAT_WORKSPACE, r->gname[slot], f[i].bytes);
            r->gname[slot] = 0;
        }
    }
}
