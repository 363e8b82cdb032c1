/* A block's forward without grad as the allocations and frees its ops make
 * (docs/allocator.md, "On the plan"): what the allocator simulation replays
 * for a checkpointed block's forward and the evaluation pass, where the
 * ledger counts the transient ws_nograd as one figure. */
#include <string.h>

#include "graph/graph.h"
#include "ledger/chain_kit.h"
#include "util/grow.h"

enum { MAX_STEPS = 4 * MLG_MAX_OPS };

/* The output's allocation: the one the steps leave live (builders need not
 * name the block's output), of `held` bytes; n when there is not exactly
 * one such. */
static size_t output_step(const mlg_step *st, size_t n, uint64_t held)
{
    bool live[MLG_MAX_TENSORS + 1] = {false};
    size_t at = n, open = 0;
    for (size_t i = 0; i < n; i++)
        live[st[i].tok] = st[i].alloc;
    for (size_t i = n; i-- > 0;)
        if (st[i].alloc && live[st[i].tok]) {
            live[st[i].tok] = false; /* its last allocation */
            at = i;
            open++;
        }
    return open == 1 && st[at].bytes == held ? at : n;
}

void ml__ck_nograd(ml_chain *ch, ml_cblock *b, const ml_graph *g, const uint64_t *tb,
                   uint64_t held)
{
    mlg_step st[MAX_STEPS];
    ml_graph_live l;
    const size_t n = ml__graph_forward_steps(g, tb, ch->eval_mode, st, MAX_STEPS, &l);
    ml__ck_ng_close(b, &l, held);
    b->fstep_first = b->nfsteps = b->fstep_out = 0;
    const size_t at = n && held && b->ws_nograd_ops ? output_step(st, n, held) : n;
    if (at == n)
        return;
    ml_fstep *f = ml_grow_to(ch->fsteps, ch->nfsteps + n, &ch->fstepcap, sizeof *f, 256);
    if (!f) {
        ch->nomem = true;
        return;
    }
    ch->fsteps = f;
    memcpy(&f[ch->nfsteps], st, n * sizeof *st);
    b->fstep_first = (uint32_t)ch->nfsteps;
    b->nfsteps = (uint32_t)n;
    b->fstep_out = (uint32_t)at;
    ch->nfsteps += n;
}
