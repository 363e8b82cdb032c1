/* A block's forward without grad as the allocations and frees its ops make
 * (docs/allocator.md, "On the plan"): what the allocator simulation replays
 * for a checkpointed block's forward and the evaluation pass, where the
 * ledger counts the transient ws_nograd as one figure. */
#include "graph/graph.h"
#include "ledger/chain_kit.h"
#include "util/grow.h"

enum { MAX_STEPS = 4 * MLG_MAX_OPS };

/* The steps' end and peak in live bytes: they must be the forward pass's
 * own (ml__graph_forward), else the list is not used. */
static bool agrees(const mlg_step *st, size_t n, uint64_t end, uint64_t peak)
{
    uint64_t live = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        if (st[i].alloc) {
            live += st[i].bytes;
            top = live > top ? live : top;
        } else if (st[i].bytes > live) {
            return false;
        } else {
            live -= st[i].bytes;
        }
    }
    return live == end && top == peak;
}

void ml__ck_fsteps(ml_chain *ch, ml_cblock *b, const ml_graph *g, const uint64_t *tb,
                   uint64_t held, const ml_graph_live *l)
{
    mlg_step st[MAX_STEPS];
    b->fstep_first = b->nfsteps = 0;
    if (!b->ws_nograd_ops || !held || l->bad)
        return;
    size_t n = ml__graph_forward_steps(g, tb, ch->eval_mode, st, MAX_STEPS);
    if (!n || !agrees(st, n, held, l->peak))
        return;
    /* the output: the one allocation the steps leave live (the graph's
     * output, which builders need not name) */
    size_t at = n, open = 0;
    bool live[MLG_MAX_TENSORS + 1] = {false};
    for (size_t i = 0; i < n; i++)
        live[st[i].tok] = st[i].alloc;
    for (size_t i = n; i-- > 0;)
        if (st[i].alloc && live[st[i].tok]) {
            live[st[i].tok] = false; /* its last allocation */
            at = i;
            open++;
        }
    if (open != 1 || st[at].bytes != held)
        return;
    ml_fstep *f = ml_grow_to(ch->fsteps, ch->nfsteps + n, &ch->fstepcap, sizeof *f, 256);
    if (!f) {
        ch->nomem = true;
        return;
    }
    ch->fsteps = f;
    for (size_t i = 0; i < n; i++)
        f[ch->nfsteps + i] = (ml_fstep){st[i].bytes, st[i].tok, st[i].part, st[i].alloc, i == at};
    b->fstep_first = (uint32_t)ch->nfsteps;
    b->nfsteps = (uint32_t)n;
    ch->nfsteps += n;
}
