/* A block's forward as the allocations and frees its ops make
 * (docs/allocator.md, "On the plan"): what the allocator simulation replays
 * without grad (a checkpointed block's forward, the evaluation pass) and
 * with grad (a block's forward without checkpointing, a recompute), where
 * the ledger counts the transient (ws_nograd, ws_fwd) and the saved
 * tensors as figures. */
#include <string.h>

#include "graph/graph.h"
#include "ledger/chain_kit.h"
#include "util/grow.h"

enum { MAX_STEPS = 4 * MLG_MAX_OPS };

/* The output's allocation: the one the steps leave live (builders need not
 * name the block's output), of `held` bytes, those that fill a saved entry
 * (entry[i], when given) apart; n when there is not exactly one such. */
static size_t output_step(const mlg_step *st, size_t n, uint64_t held, const uint16_t *entry)
{
    bool live[MLG_MAX_TENSORS + 1] = {false};
    size_t at = n, open = 0;
    for (size_t i = 0; i < n; i++)
        live[st[i].tok] = st[i].alloc;
    for (size_t i = n; i-- > 0;)
        if (st[i].alloc && live[st[i].tok] && (!entry || entry[i] == ML_FSTEP_UNSAVED)) {
            live[st[i].tok] = false; /* its last allocation */
            at = i;
            open++;
        }
    return open == 1 && st[at].bytes == held ? at : n;
}

/* The steps st[0 .. n) appended to ch->fsteps (entries ML_FSTEP_UNSAVED,
 * or entry[i] and slot[i] where given); their first index, or SIZE_MAX
 * out of memory. */
static size_t append(ml_chain *ch, const mlg_step *st, size_t n, const uint16_t *entry,
                     const uint8_t *slot)
{
    ml_fstep *f = ml_grow_to(ch->fsteps, ch->nfsteps + n, &ch->fstepcap, sizeof *f, 256);
    if (!f) {
        ch->nomem = true;
        return SIZE_MAX;
    }
    ch->fsteps = f;
    const size_t first = ch->nfsteps;
    for (size_t i = 0; i < n; i++)
        f[first + i] = (ml_fstep){st[i].bytes, st[i].tok, st[i].part, st[i].alloc,
                                  entry ? entry[i] : ML_FSTEP_UNSAVED, slot ? slot[i] : 0};
    ch->nfsteps += n;
    return first;
}

/* Autocast's weight copies in g (storages flagged MLG_T_WCAST): the
 * walk without grad keeps them, as autocast's cache holds them to the
 * region's end. Their bytes at tb. */
static uint64_t weight_copies(const ml_graph *g, const uint64_t *tb)
{
    uint64_t c = 0;
    for (uint16_t t = 0; t < g->nt; t++)
        if ((g->t[t].flags & MLG_T_WCAST) && ml__graph_storage(g, t) == t)
            c += tb[t];
    return c;
}

void ml__ck_nograd(ml_chain *ch, ml_cblock *b, const ml_graph *g, const uint64_t *tb,
                   uint64_t held)
{
    mlg_step st[MAX_STEPS];
    uint16_t entry[MAX_STEPS];
    ml_graph_live l;
    const size_t n = ml__graph_forward_steps(g, tb, false, ch->eval_mode, st, MAX_STEPS, &l);
    /* the copies the walk keeps are those the block's held copies count
     * (cast_bytes, made after its forward where it is not known op by op) */
    const uint64_t copies = weight_copies(g, tb);
    if (copies != b->cast_bytes)
        return;
    ml__ck_ng_close(b, &l, held, copies);
    b->fstep_first = b->nfsteps = b->fstep_out = 0;
    b->nfcopies = 0;
    /* each copy's allocation an entry of the block's copies */
    unsigned nc = 0;
    for (size_t i = 0; i < n; i++) {
        const bool copy = st[i].alloc && st[i].tok < g->nt &&
                          (g->t[st[i].tok].flags & MLG_T_WCAST);
        entry[i] = copy ? (uint16_t)nc++ : ML_FSTEP_UNSAVED;
    }
    const size_t at = n && held && b->ws_nograd_ops && nc <= UINT8_MAX
                          ? output_step(st, n, held, entry)
                          : n;
    if (at == n)
        return;
    const size_t first = append(ch, st, n, nc ? entry : NULL, NULL);
    if (first == SIZE_MAX)
        return;
    b->fstep_first = (uint32_t)first;
    b->nfsteps = (uint32_t)n;
    b->fstep_out = (uint32_t)at;
    b->nfcopies = (uint8_t)nc;
}

/* With grad: each allocation of a saved storage into entry[i] (its index
 * in b's list) and slot[i] (the entry's allocations so far), the output's
 * allocation into *out (the one of the output's entry, else output_step's).
 * False where the steps do not fill b's entries exactly (an entry's
 * allocations not adding up to its bytes, a saved storage with no entry,
 * more than 255 allocations to an entry) or the output is not one
 * allocation of `held` bytes. */
static bool entries(const ml_chain *ch, const ml_cblock *b, const ml_graph *g, const size_t *idx,
                    const mlg_step *st, size_t n, uint64_t held, uint16_t *entry,
                    uint8_t *slot, size_t *out)
{
    bool saved[MLG_MAX_TENSORS] = {false};
    uint8_t count[MLG_MAX_TENSORS] = {0};
    uint64_t filled[MLG_MAX_TENSORS] = {0};
    for (uint16_t k = 0; k < g->nop; k++)
        for (unsigned j = 0; j < g->op[k].nsave; j++)
            saved[ml__graph_storage(g, g->op[k].save[j])] = true;
    size_t nout = 0;
    *out = n;
    for (size_t i = 0; i < n; i++) {
        const uint16_t t = st[i].tok;
        entry[i] = ML_FSTEP_UNSAVED;
        slot[i] = 0;
        if (!st[i].alloc || t >= MLG_MAX_TENSORS || !saved[t])
            continue;
        const uint16_t e = ml__graph_entry(g, t);
        if (idx[e] == SIZE_MAX || idx[e] < b->saved_first || count[e] == UINT8_MAX)
            return false;
        if (ch->saved[idx[e]].flags & ML_SV_OUTPUT) {
            *out = i;
            nout++;
            continue;
        }
        entry[i] = (uint16_t)(idx[e] - b->saved_first);
        slot[i] = count[e]++;
        filled[e] += st[i].bytes;
    }
    for (uint16_t e = 0; e < g->nt; e++)
        if (idx[e] != SIZE_MAX && !(ch->saved[idx[e]].flags & ML_SV_OUTPUT) &&
            filled[e] != ch->saved[idx[e]].bytes)
            return false;
    if (!nout) /* no entry holds the output */
        *out = output_step(st, n, held, entry);
    return nout <= 1 && *out < n && st[*out].bytes == held;
}

void ml__ck_grad(ml_chain *ch, ml_cblock *b, const ml_graph *g, const uint64_t *tb,
                 uint64_t held, const size_t *idx)
{
    mlg_step st[MAX_STEPS];
    uint16_t entry[MAX_STEPS];
    uint8_t slot[MAX_STEPS];
    ml_graph_live l;
    const size_t n = ml__graph_forward_steps(g, tb, true, ch->eval_mode, st, MAX_STEPS, &l);
    ml__ck_grad_close(b, &l, held);
    b->gstep_first = b->ngsteps = b->gstep_out = 0;
    b->gsave_per = 0;
    size_t at;
    if (!n || !held || !b->ws_fwd_ops || b->nsaved >= ML_FSTEP_UNSAVED ||
        !entries(ch, b, g, idx, st, n, held, entry, slot, &at))
        return;
    const size_t first = append(ch, st, n, entry, slot);
    if (first == SIZE_MAX)
        return;
    uint8_t per = 1;
    for (size_t i = 0; i < n; i++)
        if (entry[i] != ML_FSTEP_UNSAVED && slot[i] >= per)
            per = (uint8_t)(slot[i] + 1);
    b->gstep_first = (uint32_t)first;
    b->ngsteps = (uint32_t)n;
    b->gstep_out = (uint32_t)at;
    b->gsave_per = per;
}
