/* A block's backward nodes as one step (docs/ledger.md, "Runs of identical
 * layers"): the events of a node list (each node's incoming gradient,
 * scratch and parameter gradient, the gradients and saved tensors it frees)
 * depend on the list alone, not on the live bytes they start from. So the
 * list is walked once into its changes per category and the prefix maxima
 * and minima the checks and the peaks need, and each block with the same
 * list applies them at once: the same peaks, breakdowns, phase points and
 * category maxima as the events one by one, as test_runs.c holds against a
 * replay of every event. */
#include <string.h>

#include "graph/graph.h"
#include "ledger/replay.h"

/* The prefix sums stay far from 64 bits (a chain's bytes are below 2^56),
 * and the levels they are added to below this: else the events run one by
 * one, which check each addition. */
#define LEVEL_MAX (UINT64_C(1) << 62)

/* The bytes of node x's scratch it frees before its gradients
 * (ml_bnode.scratch_early): that many of its equal tensors. */
static uint64_t early_bytes(const ml_bnode *x)
{
    const unsigned n = x->scratch_parts;
    return x->scratch_early && n > x->scratch_early && n <= ML_SCRATCH_PARTS && !(x->scratch % n)
               ? x->scratch / n * x->scratch_early
               : 0;
}

static void step(ml_nodeprof *p, int64_t *cur, int64_t *tot, ml_category c, int64_t d)
{
    if (d == 0)
        return;
    p->nz = true;
    cur[c] += d;
    *tot += d;
    p->D[c] += d;
    if (d > 0) {
        if (!p->cat_alloc[c] || cur[c] > p->Mc[c])
            p->Mc[c] = cur[c];
        p->cat_alloc[c] = true;
        if (!p->has_alloc || *tot > p->Mt) {
            p->Mt = *tot;
            memcpy(p->at_max, cur, sizeof p->at_max);
        }
        p->has_alloc = true;
    } else {
        if (cur[c] < p->minc[c])
            p->minc[c] = cur[c];
        if (*tot < p->mint)
            p->mint = *tot;
    }
}

void ml__nodeprof_make(ml_nodeprof *p, const ml_bnode *nd, size_t nnodes, const ml_saved *sv,
                       bool create, ml_category scat)
{
    memset(p, 0, sizeof *p);
    int64_t cur[ML_CAT_COUNT] = {0}, tot = 0;
    for (size_t j = 0; j < nnodes; j++) {
        const ml_bnode *x = &nd[j];
        /* scratch freed in part before the gradients is made first (the
         * order of the other allocations moves no peak) */
        const int64_t early = (int64_t)early_bytes(x);
        if (early) {
            step(p, cur, &tot, ML_CAT_WORKSPACE, (int64_t)x->scratch);
            step(p, cur, &tot, ML_CAT_WORKSPACE, -early);
        }
        step(p, cur, &tot, ML_CAT_WORKSPACE, (int64_t)x->grad_in);
        if (!early)
            step(p, cur, &tot, ML_CAT_WORKSPACE, (int64_t)x->scratch);
        step(p, cur, &tot, create ? ML_CAT_GRADS : ML_CAT_WORKSPACE, (int64_t)x->param_grad);
        step(p, cur, &tot, ML_CAT_WORKSPACE, early - (int64_t)x->scratch);
        if (!create)
            step(p, cur, &tot, ML_CAT_WORKSPACE, -(int64_t)x->param_grad);
        step(p, cur, &tot, ML_CAT_WORKSPACE, -(int64_t)x->grad_out);
        for (uint32_t s = x->first_saved; s != ML_NODE_NONE; s = sv[s].next_same) {
            step(p, cur, &tot, scat, -(int64_t)sv[s].bytes);
            p->freed += sv[s].bytes;
        }
    }
    p->Dt = tot;
}

bool ml__nodeprof_fits(const ml_nodeprof *p, const ml_replay *r)
{
    if (r->total >= LEVEL_MAX)
        return false;
    for (int c = 0; c < ML_CAT_COUNT; c++)
        if (r->live[c] >= LEVEL_MAX || (int64_t)r->live[c] + p->minc[c] < 0)
            return false;
    return (int64_t)r->total + p->mint >= 0;
}

void ml__nodeprof_apply(const ml_nodeprof *p, ml_replay *r)
{
    if (!p->nz)
        return;
    ml_summary *s = &r->l->sum;
    ml__replay_enter(r); /* as event() in replay.c, at the first event */
    if (p->has_alloc) {
        uint64_t at[ML_CAT_COUNT]; /* the levels at the highest total */
        for (int c = 0; c < ML_CAT_COUNT; c++) {
            uint64_t v = (uint64_t)((int64_t)r->live[c] + p->Mc[c]);
            if (p->cat_alloc[c] && v > s->category_max[c])
                s->category_max[c] = v;
            at[c] = (uint64_t)((int64_t)r->live[c] + p->at_max[c]);
        }
        /* every other allocation's point is below this one's, and the peak
         * is recorded at the first event that reaches it */
        ml__replay_rise(r, (uint64_t)((int64_t)r->total + p->Mt), at);
    }
    for (int c = 0; c < ML_CAT_COUNT; c++)
        r->live[c] = (uint64_t)((int64_t)r->live[c] + p->D[c]);
    r->total = (uint64_t)((int64_t)r->total + p->Dt);
}

/* The allocations node x's grad_out parts name, taken from r's names
 * (before its input gradients are made: an in-place op's node makes the
 * gradient of the tensor whose gradient it frees); 0: freed by bytes. */
static void take_outs(ml_replay *r, const ml_bnode *x, size_t *taken)
{
    for (unsigned j = 0; j < x->ngout; j++) {
        const uint16_t id = x->gout_id[j];
        const uint64_t b = x->gout_b[j];
        taken[j] = 0;
        if (x->accum) {
            taken[j] = r->gpbytes[id] == b ? r->gpend[id] : 0;
            r->gpend[id] = 0;
        } else if (r->gname[id]) {
            taken[j] = r->gbytes[id] == b ? r->gname[id] : 0;
            r->gname[id] = 0;
        } else if (r->gcarry && r->gcarry_bytes == b) {
            /* no node of the block made it: the incoming gradient, which
             * the residual sums pass on */
            taken[j] = r->gcarry;
            r->gcarry = 0;
        }
    }
}

/* Node x's sum into the received gradient the schedule still holds
 * (ml_chain.grad_held; x->into_incoming, the first): a new tensor
 * (input_buffer.cpp adds in place only into a tensor nothing else
 * references, can_accumulate_inplace), which the buffer holds from now on;
 * the received one stays to the micro-batch's end (replay.c). An
 * out-of-place accumulation makes the new sum itself (grad_in), and its
 * node that would free the old one leaves it (held_kept). */
static void held_sum(ml_replay *r, const ml_bnode *x)
{
    if (!x->into_incoming || !r->hold_in || !x->ngout)
        return;
    r->hold_in = false;
    r->held_bytes = x->gout_b[0];
    r->held_name = r->gcarry;
    if (x->accum_copy) {
        r->held_kept = true;
        return;
    }
    ml__replay_alloc(r, ML_CAT_WORKSPACE, r->held_bytes);
    r->gcarry = r->rsim ? ml__rsim_latest(r->rsim, ML_CAT_WORKSPACE) : 0;
}

void ml__replay_node_grads_in(ml_replay *r, const ml_bnode *x, size_t *taken)
{
    uint64_t sum = 0, out = 0;
    for (unsigned j = 0; j < x->ngin; j++)
        sum += x->gin_b[j];
    for (unsigned j = 0; j < x->ngout; j++)
        out += x->gout_b[j];
    if (x->ngout && out == x->grad_out)
        take_outs(r, x, taken);
    held_sum(r, x);
    if (x->accum_copy) {
        /* the new sum becomes the buffer's; the old one is the incoming
         * gradient's, freed by the last node that holds it (frees_carry) */
        ml__replay_alloc(r, ML_CAT_WORKSPACE, x->grad_in);
        r->gcarry_old = r->gcarry;
        r->gcarry = ml__rsim_latest(r->rsim, ML_CAT_WORKSPACE);
        return;
    }
    if (!x->ngin || sum != x->grad_in || sum > (uint64_t)INT64_MAX) {
        ml__replay_alloc(r, ML_CAT_WORKSPACE, x->grad_in);
        return;
    }
    ml__replay_ledger_event(r, ML_CAT_WORKSPACE, (int64_t)sum);
    for (unsigned j = 0; j < x->ngin; j++) {
        const uint64_t b = x->gin_b[j];
        if (!b)
            continue;
        const size_t name = ml__replay_sim_tensor(r, ML_CAT_WORKSPACE, b);
        const uint16_t id = x->gin_id[j];
        if (x->gin_acc & (1u << j)) {
            r->gpend[id] = name;
            r->gpbytes[id] = b;
        } else if (id != ML_GID_NONE) { /* (else freed by its bytes) */
            r->gname[id] = name;
            r->gbytes[id] = b;
        }
    }
}

void ml__replay_node_grads_out(ml_replay *r, const ml_bnode *x, const size_t *taken)
{
    if (x->frees_carry) {
        if (!r->held_kept) /* (else the received gradient, held: replay.c) */
            ml__replay_free_named(r, ML_CAT_WORKSPACE, x->grad_out, r->gcarry_old);
        r->held_kept = false;
        r->gcarry_old = 0;
        return;
    }
    uint64_t sum = 0;
    for (unsigned j = 0; j < x->ngout; j++)
        sum += x->gout_b[j];
    if (!x->ngout || sum != x->grad_out || sum > (uint64_t)INT64_MAX) {
        ml__replay_free(r, ML_CAT_WORKSPACE, x->grad_out);
        return;
    }
    ml__replay_ledger_event(r, ML_CAT_WORKSPACE, -(int64_t)sum);
    for (unsigned j = 0; j < x->ngout; j++) {
        const uint64_t b = x->gout_b[j];
        if (!b)
            continue;
        ml__rsim_free_as(r->rsim, ML_CAT_WORKSPACE, taken[j], b);
    }
}

void ml__nodes_begin(ml_replay *r)
{
    if (r->rsim) {
        memset(r->gname, 0, sizeof r->gname);
        memset(r->gpend, 0, sizeof r->gpend);
        r->gcarry = r->carry_name;
        r->gcarry_old = 0;
        r->gcarry_bytes = r->grad_carry;
    }
    r->carry_name = 0;
}

void ml__nodes_hand(ml_replay *r, const ml_cblock *b)
{
    if (!r->rsim || !r->grad_carry)
        return;
    const size_t id = b->hand_gid ? b->hand_gid - 1u : ML_GID_NONE;
    if (r->gname[id] && r->gbytes[id] == r->grad_carry)
        r->carry_name = r->gname[id];
    else if (r->gcarry && r->gcarry_bytes == r->grad_carry)
        r->carry_name = r->gcarry;
}

/* A node's tensors of sizes[0..n) as one ledger event of their sum, the
 * simulation's each named in names[], so that their release finds them
 * and not another tensor of the same size made since. */
static void named_alloc(ml_replay *r, ml_category c, const uint64_t *sizes, unsigned n,
                        size_t *names)
{
    uint64_t sum = 0;
    for (unsigned j = 0; j < n; j++)
        sum += sizes[j];
    ml__replay_ledger_event(r, c, (int64_t)sum);
    for (unsigned j = 0; j < n; j++)
        names[j] = ml__replay_sim_tensor(r, c, sizes[j]);
}

/* Their release, in the order made or (reverse) the last made first. */
static void named_free(ml_replay *r, ml_category c, const uint64_t *sizes, unsigned n,
                       const size_t *names, bool reverse)
{
    uint64_t sum = 0;
    for (unsigned j = 0; j < n; j++)
        sum += sizes[j];
    ml__replay_ledger_event(r, c, -(int64_t)sum);
    for (unsigned j = 0; j < n; j++) {
        const unsigned i = reverse ? n - 1 - j : j;
        ml__rsim_free_as(r->rsim, c, names[i], sizes[i]);
    }
}

/* The simulation's tensors of node x's parameter gradients: the weight's,
 * then the bias's (chain.h, pg_bias); 0: one, by its bytes. */
static unsigned grad_tensors(const ml_replay *r, const ml_bnode *x, uint64_t *sizes)
{
    if (!r->rsim || !x->pg_bias || x->param_grad > (uint64_t)INT64_MAX)
        return 0;
    sizes[0] = x->param_grad - x->pg_bias;
    sizes[1] = x->pg_bias;
    return 2;
}

/* Node x's parameter gradients (created as .grad in the first
 * micro-batch), named in names[] when two; a tied table's partial named
 * for the embedding's backward. */
static void param_grad(ml_replay *r, const ml_bnode *x, bool create, bool tied, size_t *names)
{
    const ml_category c = create ? ML_CAT_GRADS : ML_CAT_WORKSPACE;
    uint64_t sizes[2];
    const unsigned n = tied ? 0 : grad_tensors(r, x, sizes);
    if (n) {
        named_alloc(r, c, sizes, n, names);
        return;
    }
    ml__replay_alloc(r, c, x->param_grad);
    if (tied && r->rsim)
        r->tied_name = ml__rsim_latest(r->rsim, r->tied_cat);
}

/* A later micro-batch's parameter gradients, added into .grad, freed. */
static void param_grad_free(ml_replay *r, const ml_bnode *x, const size_t *names)
{
    uint64_t sizes[2];
    const unsigned n = grad_tensors(r, x, sizes);
    if (n)
        named_free(r, ML_CAT_WORKSPACE, sizes, n, names, false);
    else
        ml__replay_free(r, ML_CAT_WORKSPACE, x->param_grad);
}

/* The simulation's tensors of node x's scratch (chain.h, scratch_parts, at
 * least one), each named; 0: none simulated, freed by its bytes. */
static unsigned scratch_tensors(const ml_replay *r, const ml_bnode *x, uint64_t *sizes)
{
    const unsigned n = x->scratch_parts > 1 ? x->scratch_parts : 1;
    if (!r->rsim || !x->scratch || n > ML_SCRATCH_PARTS || x->scratch % n ||
        x->scratch > (uint64_t)INT64_MAX)
        return 0;
    for (unsigned j = 0; j < n; j++)
        sizes[j] = x->scratch / n;
    return n;
}

/* Node x's scratch, its tensors named in names[]. */
static void scratch_alloc(ml_replay *r, const ml_bnode *x, size_t *names)
{
    uint64_t sizes[ML_SCRATCH_PARTS];
    const unsigned n = scratch_tensors(r, x, sizes);
    if (n)
        named_alloc(r, ML_CAT_WORKSPACE, sizes, n, names);
    else
        ml__replay_alloc(r, ML_CAT_WORKSPACE, x->scratch);
}

/* Its release, the temporaries last made first: the first `early` of its
 * tensors (early_bytes: a formula's, before the node's gradients) or the
 * rest (early false). */
static void scratch_free(ml_replay *r, const ml_bnode *x, const size_t *names, bool early)
{
    uint64_t sizes[ML_SCRATCH_PARTS];
    const unsigned n = scratch_tensors(r, x, sizes);
    const uint64_t eb = early_bytes(x);
    const unsigned k = eb ? x->scratch_early : 0; /* the tensors freed early */
    const unsigned from = early ? 0 : k;
    if (n)
        named_free(r, ML_CAT_WORKSPACE, sizes + from, early ? k : n - k, names + from, true);
    else
        ml__replay_free(r, ML_CAT_WORKSPACE, early ? eb : x->scratch - eb);
}

/* Block k's nodes' events one by one: each node's incoming gradient,
 * scratch and parameter gradient (in the node's order: pg_first,
 * scratch_first), then what it frees; *freed adds the saved bytes they
 * free. A node's allocations all come before its frees, so their order
 * moves none of the peaks the profile above finds. */
void ml__nodes_one_by_one(ml_replay *r, size_t k, size_t from, size_t to, bool create,
                          ml_category scat, uint64_t *freed)
{
    const ml_cblock *b = &r->ch->blocks[k];
    const ml_bnode *nd = &r->ch->nodes[b->node_first];
    const ml_saved *sv = &r->ch->saved[b->saved_first];
    for (size_t j = from; j < to && j < b->nnodes; j++) {
        const ml_bnode *x = &nd[j];
        size_t taken[3] = {0, 0, 0}, pg_names[2] = {0, 0}, sc_names[ML_SCRATCH_PARTS] = {0};
        /* the LM head's partial of a tied table stays in the engine's
         * buffer until the embedding's backward (sides.c) */
        const bool tied = r->tied_partial && x->param_grad == r->tied_partial &&
                          b->tied_grad == r->tied_partial && !b->in_nograd;
        if (x->scratch_first)
            scratch_alloc(r, x, sc_names);
        if (x->scratch_first && early_bytes(x))
            scratch_free(r, x, sc_names, true);
        if (x->pg_first)
            param_grad(r, x, create, tied, pg_names);
        if (r->rsim) {
            ml__replay_node_grads_in(r, x, taken);
        } else {
            held_sum(r, x);
            ml__replay_alloc(r, ML_CAT_WORKSPACE, x->grad_in);
        }
        if (!x->scratch_first)
            scratch_alloc(r, x, sc_names);
        if (!x->pg_first)
            param_grad(r, x, create, tied, pg_names);
        scratch_free(r, x, sc_names, false);
        if (!create && !tied)
            param_grad_free(r, x, pg_names);
        if (r->rsim)
            ml__replay_node_grads_out(r, x, taken);
        else if (x->frees_carry && r->held_kept)
            r->held_kept = false; /* the received gradient, held (held_sum) */
        else
            ml__replay_free(r, ML_CAT_WORKSPACE, x->grad_out);
        for (uint32_t s = x->first_saved; s != ML_NODE_NONE; s = sv[s].next_same) {
            ml__replay_ledger_event(r, scat, -(int64_t)sv[s].bytes);
            if (r->rsim)
                ml__rsim_free_saved(r->rsim, scat, k, s);
            *freed += sv[s].bytes;
        }
        if (x->frees_table && r->seg[k] < 0 && k + 1 == r->ch->tables_at)
            ml__replay_free_tables(r, k, x->frees_table);
    }
}

/* The saved entry (block *blk, index *entry in its list) of the model's
 * rotary table `bit`: the latest block before k with one (the embedding,
 * or a pipeline stage's own tables). */
static bool table_entry(const ml_chain *ch, size_t k, unsigned bit, size_t *blk, size_t *entry)
{
    const unsigned flag = bit == MLG_TABLE_COS ? ML_SV_TABLE_COS : ML_SV_TABLE_SIN;
    for (size_t j = k; j-- > 0;) {
        const ml_cblock *b = &ch->blocks[j];
        for (size_t e = 0; e < b->nsaved; e++) {
            if (ch->saved[b->saved_first + e].flags & flag) {
                *blk = j;
                *entry = e;
                return true;
            }
        }
    }
    return false;
}

void ml__replay_free_tables(ml_replay *r, size_t k, unsigned bits)
{
    for (unsigned bit = MLG_TABLE_COS; bit <= MLG_TABLE_SIN; bit <<= 1) {
        size_t j = 0, e = 0;
        if (!(bits & bit) || !table_entry(r->ch, k, bit, &j, &e) || r->seg[j] >= 0 ||
            (r->table_freed && r->table_block != j))
            continue;
        const uint64_t bytes = r->ch->saved[r->ch->blocks[j].saved_first + e].bytes;
        ml__replay_ledger_event(r, ML_CAT_ACTIVATIONS, -(int64_t)bytes);
        if (r->rsim)
            ml__rsim_free_saved(r->rsim, ML_CAT_ACTIVATIONS, j, e);
        r->table_freed += bytes;
        r->table_block = j;
    }
}

void ml__replay_tables_done(ml_replay *r, size_t k, bool at_nodes)
{
    if (k + 1 != r->ch->tables_at || (at_nodes && r->seg[k] < 0))
        return; /* not the first rotary layer, or freed at its nodes */
    const ml_cblock *b = &r->ch->blocks[k];
    unsigned bits = 0;
    for (size_t j = 0; j < b->nnodes; j++)
        bits |= r->ch->nodes[b->node_first + j].frees_table;
    if (bits)
        ml__replay_free_tables(r, k, bits);
}

void ml__replay_free_own_saved(ml_replay *r, size_t k, uint64_t own)
{
    const uint64_t early = ml__replay_take_tables(r, k);
    if (!early) {
        ml__replay_free(r, ML_CAT_ACTIVATIONS, own);
        return;
    }
    ml__replay_ledger_event(r, ML_CAT_ACTIVATIONS, -(int64_t)(own - early));
    if (r->rsim)
        ml__rsim_free_block_saved(r->rsim, ML_CAT_ACTIVATIONS, k, own);
}

uint64_t ml__replay_take_tables(ml_replay *r, size_t k)
{
    if (!r->table_freed || r->table_block != k)
        return 0;
    const uint64_t t = r->table_freed;
    r->table_freed = 0;
    return t;
}

enum { KEEP = 8 }; /* the gradients' names ml__nodes_recompute keeps */

/* How many of block k's first nodes unpack nothing, their op saving
 * nothing and they releasing no saved tensor (0 where none unpacks: no
 * recompute to start, or where their gradients outnumber KEEP). */
static size_t before_recompute(const ml_chain *ch, size_t k)
{
    const ml_cblock *b = &ch->blocks[k];
    const ml_bnode *nd = &ch->nodes[b->node_first];
    size_t j = 0, parts = 0;
    if (b->fwd_only || b->tied_grad)
        return 0;
    while (j < b->nnodes && !nd[j].unpacks && nd[j].first_saved == ML_NODE_NONE)
        parts += nd[j++].ngin;
    return j < b->nnodes && parts <= KEEP ? j : 0;
}

size_t ml__nodes_recompute(ml_replay *r, size_t s0, size_t k)
{
    const size_t ran = before_recompute(r->ch, k);
    if (!ran) {
        ml__replay_recompute_nodes(r, s0, k);
        return 0;
    }
    const ml_bnode *nd = &r->ch->nodes[r->ch->blocks[k].node_first];
    uint64_t none = 0;
    r->block = (int32_t)k; /* the nodes' events are block k's */
    ml__nodes_begin(r);
    ml__nodes_one_by_one(r, k, 0, ran, r->micro == 0 && !r->grads_exist, ML_CAT_RECOMPUTE,
                         &none);
    if (!r->rsim) {
        ml__replay_recompute_nodes(r, s0, k);
        return ran;
    }
    /* the names those nodes gave their gradients, kept across the
     * recompute (whose forward steps name r->gname's slots too); the rest
     * cleared after it, as ml__nodes_begin clears them */
    uint16_t id[KEEP];
    size_t name[KEEP];
    uint64_t bytes[KEEP];
    bool pend[KEEP];
    unsigned n = 0;
    for (size_t j = 0; j < ran; j++)
        for (unsigned p = 0; p < nd[j].ngin && n < KEEP; p++) {
            if ((id[n] = nd[j].gin_id[p]) == ML_GID_NONE)
                continue;
            pend[n] = nd[j].gin_acc & (1u << p);
            name[n] = pend[n] ? r->gpend[id[n]] : r->gname[id[n]];
            bytes[n] = pend[n] ? r->gpbytes[id[n]] : r->gbytes[id[n]];
            n++;
        }
    ml__replay_recompute_nodes(r, s0, k);
    memset(r->gname, 0, sizeof r->gname);
    memset(r->gpend, 0, sizeof r->gpend);
    for (unsigned i = 0; i < n; i++) {
        (pend[i] ? r->gpend : r->gname)[id[i]] = name[i];
        (pend[i] ? r->gpbytes : r->gbytes)[id[i]] = bytes[i];
    }
    return ran;
}

/* Whether block k's nodes run as one step (replay_nodes.c): not where each
 * event is recorded or simulated, nor in the reference replay of every
 * event; r->np made from k's list (or kept, from a block with the same
 * list), its checks holding from r's levels. */
bool ml__nodes_at_once(ml_replay *r, size_t k, bool create, ml_category scat)
{
    if (r->keep || r->rsim || r->whole || r->hold_in)
        return false;
    const ml_chain *ch = r->ch;
    const ml_cblock *b = &ch->blocks[k];
    if (k + 1 == ch->tables_at)
        return false; /* it frees the model's tables (ml__nodes_one_by_one) */
    if (r->tied_partial && b->tied_grad == r->tied_partial && !b->in_nograd)
        return false; /* its tied partial is kept (ml__nodes_one_by_one) */
    ml_nodeprof *p = &r->np;
    const ml_cblock *o = p->valid ? &ch->blocks[p->block] : NULL;
    bool same = o && p->create == create && p->scat == scat && o->nnodes == b->nnodes &&
                o->nsaved == b->nsaved &&
                (o->node_first == b->node_first ||
                 !memcmp(&ch->nodes[o->node_first], &ch->nodes[b->node_first],
                         b->nnodes * sizeof *ch->nodes)) &&
                (o->saved_first == b->saved_first || !b->nsaved ||
                 !memcmp(&ch->saved[o->saved_first], &ch->saved[b->saved_first],
                         b->nsaved * sizeof *ch->saved));
    if (!same) {
        ml__nodeprof_make(p, &ch->nodes[b->node_first], b->nnodes, &ch->saved[b->saved_first],
                          create, scat);
        p->valid = true;
        p->create = create;
        p->scat = scat;
        p->block = k;
    }
    return ml__nodeprof_fits(p, r);
}
