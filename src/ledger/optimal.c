/* Dynamic program over the chain model of optimal.h: Pareto fronts of (kept
 * prefix, cost) at the block boundaries, one state per cell of a memory
 * grid, with the open segments kept per cell. Recurrence, complexity and
 * the guarantee: docs/optimal.md. */
#include <stdlib.h>
#include <string.h>

#include "ledger/optimal.h"
#include "ledger/optimal_cell.h"
#include "util/grow.h"

static bool add_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

/* The largest prefix P with P + used <= budget, where used is the sum of
 * the n terms; false when there is none (used above the budget or beyond
 * 64 bits, which kept_ok and seg_step read the same way). */
static bool room(uint64_t budget, const uint64_t *terms, int n, uint64_t *r)
{
    uint64_t used = 0;
    for (int i = 0; i < n; i++)
        if (!add_ok(used, terms[i], &used))
            return false;
    if (used > budget)
        return false;
    *r = budget - used;
    return true;
}

/* A state on the front of a block boundary. */
typedef struct {
    uint64_t P;    /* kept prefix */
    double cost;   /* recompute FLOPs so far */
    uint32_t nrec; /* blocks recomputed: breaks ties between equal FLOPs (a
                      zero-FLOP ReLU is not worth checkpointing) */
} node;

/* States are numbered across levels (level by level, P ascending within
 * one: the id order is the order in which the search meets them). A state's
 * link is its predecessor's id, with SEG set when it was reached by a
 * segment from there rather than by keeping the predecessor's block. */
typedef uint32_t link;
#define SEG 0x80000000u
#define LCHUNK ((size_t)1 << 16)

/* Room for need elements of elem bytes in *v (capacity *cap). */
static bool reserve(void **v, size_t *cap, size_t need, size_t elem)
{
    void *nv = ml_grow_to(*v, need, cap, elem, 64);
    if (nv)
        *v = nv;
    return nv != NULL;
}

/* The first set bit at or after pos, or none. */
static size_t next_bit(const uint64_t *bits, size_t nw, size_t pos, size_t none)
{
    for (size_t w = pos / 64; w < nw; w++) {
        uint64_t word = bits[w];
        if (w == pos / 64)
            word &= ~0ull << (pos % 64);
        if (word)
            return w * 64 + (size_t)__builtin_ctzll(word);
    }
    return none;
}

/* Cells by default: at most about 2^22 states over all boundaries (a
 * 4-byte link each), between 256 and 65536 per boundary. */
static size_t default_cells(size_t n)
{
    size_t s = ((size_t)1 << 22) / (n + 1);
    return s < 256 ? 256 : s > 65536 ? 65536 : s;
}

/* What one solve leaves for the next: every array keeps its capacity, the
 * cells their group arrays, the links their chunks (the planner's rounds
 * then touch no fresh memory). */
struct ml_opt_work {
    double *F;
    uint64_t *needF, *needB, *thr;
    bool *ok;
    size_t *off, capn;
    node *cur, *nxt, *kc;
    uint32_t *kfrom;
    size_t capcur, capnxt, capkc, capkf;
    cell *cl;
    size_t capcl;
    uint32_t *used; /* the cells with a group array, each once */
    size_t nused, capused;
    uint64_t *bits;
    size_t capbits;
    link **ln;
    size_t capln, nchunks;
    pool pl;
};

ml_opt_work *ml__opt_work_create(void)
{
    ml_opt_work *w = calloc(1, sizeof *w);
    if (w)
        w->pl.free = NIL;
    return w;
}

void ml__opt_work_destroy(ml_opt_work *w)
{
    if (!w)
        return;
    for (size_t i = 0; i < w->nused; i++)
        free(w->cl[w->used[i]].v);
    free(w->cl);
    free(w->used);
    for (size_t i = 0; i < w->nchunks; i++)
        free(w->ln[i]);
    free(w->ln);
    free(w->pl.v);
    free(w->bits);
    free(w->F);
    free(w->needF);
    free(w->needB);
    free(w->thr);
    free(w->ok);
    free(w->off);
    free(w->cur);
    free(w->nxt);
    free(w->kc);
    free(w->kfrom);
    free(w);
}

/* *v reallocated to n elements of elem bytes; false (and *v unchanged)
 * when out of memory. */
static bool resize(void **v, size_t n, size_t elem)
{
    void *nv = realloc(*v, n * elem);
    if (nv)
        *v = nv;
    return nv != NULL;
}

/* Room for the per-block arrays of n blocks and ncell cells, all cells and
 * the pool empty. */
static bool work_ready(ml_opt_work *w, size_t n, size_t ncell)
{
    if (n + 2 > w->capn) { /* each array keeps what it got if a later one fails */
        const size_t c = n + 2;
        if (!resize((void **)&w->F, c, sizeof *w->F) ||
            !resize((void **)&w->needF, c, sizeof *w->needF) ||
            !resize((void **)&w->needB, c, sizeof *w->needB) ||
            !resize((void **)&w->thr, c, sizeof *w->thr) ||
            !resize((void **)&w->ok, c, sizeof *w->ok) ||
            !resize((void **)&w->off, c, sizeof *w->off))
            return false;
        w->capn = c;
    }
    if (ncell > w->capcl) { /* calloc first: untouched cells cost no page */
        cell *cl = w->cl ? realloc(w->cl, ncell * sizeof *cl) : calloc(ncell, sizeof *cl);
        if (!cl)
            return false;
        if (w->cl)
            memset(cl + w->capcl, 0, (ncell - w->capcl) * sizeof *cl);
        w->cl = cl;
        w->capcl = ncell;
    }
    for (size_t i = 0; i < w->nused; i++)
        w->cl[w->used[i]].head = w->cl[w->used[i]].n = 0;
    const size_t nw = (ncell + 63) / 64;
    if (!reserve((void **)&w->bits, &w->capbits, nw, sizeof *w->bits))
        return false;
    memset(w->bits, 0, nw * sizeof *w->bits);
    w->pl.n = 0;
    w->pl.free = NIL;
    return reserve((void **)&w->cur, &w->capcur, 1, sizeof *w->cur);
}

/* One solve in progress: the grid, the current front (w->cur, m states)
 * and the links pushed so far. */
typedef struct {
    ml_opt_work *w;
    const ml_opt_chain *c;
    uint64_t M;    /* the budget */
    uint64_t Pend; /* the largest prefix the tail admits */
    unsigned qs;   /* a prefix's cell is P >> qs */
    size_t ncell, nw;
    size_t m;   /* states on the current front */
    size_t nln; /* links pushed */
    size_t maxlen; /* the longest segment searched (ml__opt_max_segment) */
    ml_opt_stats sx;
} solve;

/* Links live in fixed chunks: never copied as they grow. */
static ml_status push_link(solve *s, link l)
{
    ml_opt_work *w = s->w;
    if (s->nln >= SEG)
        return ML_RANGE;
    if (s->nln / LCHUNK == w->nchunks) {
        if (!reserve((void **)&w->ln, &w->capln, w->nchunks + 1, sizeof *w->ln) ||
            !(w->ln[w->nchunks] = malloc(LCHUNK * sizeof **w->ln)))
            return ML_NOMEM;
        w->nchunks++;
    }
    w->ln[s->nln / LCHUNK][s->nln % LCHUNK] = l;
    s->nln++;
    return ML_OK;
}

/* The grid for c (at most `cells` cells), the per-block needs, and the
 * front of boundary 0: the empty prefix. */
size_t ml__opt_max_segment(size_t n)
{
    const size_t most = ML_OPT_SEGMENT_WORK / (n ? n : 1);
    return n <= most ? n : most > ML_OPT_SEGMENT_MIN ? most : ML_OPT_SEGMENT_MIN;
}

static ml_status solve_begin(solve *s, ml_opt_work *w, const ml_opt_chain *c, size_t cells)
{
    const size_t n = c->n;
    const uint64_t M = c->budget;
    if (n >= SEG)
        return ML_RANGE;
    if (!cells)
        cells = default_cells(n);
    if (cells < 2)
        cells = 2;
    /* cell of a prefix P: P >> qs, q = 2^qs the least power of two above
     * M / cells, so P <= M gives at most `cells` cells (a shift, not a
     * division, on every candidate) */
    unsigned qs = 0;
    while (qs < 63 && (M >> qs) >= cells)
        qs++;
    *s = (solve){w, c, M, 0, qs, (size_t)(M >> qs) + 1, 0, 1, 0, ml__opt_max_segment(n), {0}};
    s->nw = (s->ncell + 63) / 64;
    s->sx = (ml_opt_stats){s->ncell, (uint64_t)1 << qs, 0, 0, 0, 0, 0, 0, s->maxlen};
    /* prefixes never fall and the tail needs base_t + P <= M: a state
     * above Pend is dead (when base_t > M, the tail rejects every one) */
    s->Pend = c->base_t <= M ? M - c->base_t : 0;
    if (!work_ready(w, n, s->ncell))
        return ML_NOMEM;
    /* per block: what its forward (base_f + v) and its backward (b + w)
     * need besides the prefix, the segment input and the recomputed bytes;
     * ok false when either is beyond 64 bits (then nothing fits) */
    w->F[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const ml_opt_block *b = &c->blk[i];
        w->F[i + 1] = w->F[i] + b->flops;
        w->ok[i] = add_ok(c->base_f, b->fwd_ng, &w->needF[i]) &&
                   add_ok(b->base_b, b->bwd, &w->needB[i]);
    }
    w->cur[0] = (node){0, 0, 0};
    w->off[0] = 0;
    w->off[1] = 1;
    return push_link(s, 0);
}

/* How far segments starting at block i reach: thr[r] is the largest prefix
 * with which the segment i..i+r meets every constraint (non-increasing in
 * r): at most M - needF(i) (its forward, the input not yet kept) and
 * M - x - U, U the largest need of the blocks so far (seg_step). */
static size_t segment_reach(solve *s, size_t i)
{
    const ml_opt_chain *c = s->c;
    const ml_opt_block *b = &c->blk[i];
    const uint64_t M = s->M, *needF = s->w->needF, *needB = s->w->needB;
    const bool *ok = s->w->ok;
    uint64_t *thr = s->w->thr, lim;
    size_t reach = 0;
    if (!ok[i] || needF[i] > M || s->w->cur[0].P > M - needF[i] ||
        !add_ok(b->input, s->w->cur[0].P, &lim) || lim > M)
        return 0;
    const uint64_t Tf = M - needF[i], Mx = M - b->input;
    lim = Mx - s->w->cur[0].P;
    uint64_t U = 0, R = 0;
    for (size_t e = i; e < c->n && e - i < s->maxlen; e++) {
        uint64_t need;
        s->sx.steps++;
        /* the first block is recreated without its input (the kept x),
         * the later ones whole */
        const uint64_t re = e == i ? b->recomp : c->blk[e].keep;
        if (!ok[e] || !add_ok(R, re, &R) || !add_ok(needB[e], R, &need))
            break;
        if (e > i && needF[e] > need)
            need = needF[e];
        if (need > U)
            U = need;
        if (U > lim)
            break;
        thr[reach++] = Mx - U < Tf ? Mx - U : Tf;
    }
    return reach;
}

/* Opens the segments starting at block i from the current front: each
 * state's longest, entered into the cell of its prefix after the input. */
static ml_status open_segments(solve *s, size_t i)
{
    ml_opt_work *w = s->w;
    const uint64_t input = s->c->blk[i].input;
    const node *cur = w->cur;
    const uint64_t *thr = w->thr;
    /* fronts are P ascending, so each state reaches no further than the
     * one before it */
    for (size_t k = 0, r = segment_reach(s, i); k < s->m; k++) {
        while (r && thr[r - 1] < cur[k].P)
            r--;
        if (!r)
            break;
        entry en = {cur[k].P + input, cur[k].cost - w->F[i],
                    (int32_t)cur[k].nrec - (int32_t)i, (uint32_t)(i + r),
                    (uint32_t)(w->off[i] + k)};
        if (en.P > s->Pend)
            break;
        size_t ci = (size_t)(en.P >> s->qs);
        cell *cl = &w->cl[ci];
        s->sx.segments++;
        const bool fresh = !cl->cap;
        if ((fresh && !reserve((void **)&w->used, &w->capused, w->nused + 1, sizeof *w->used)) ||
            !ml__oc_put(cl, &w->pl, &en, &s->sx))
            return ML_NOMEM;
        if (fresh && cl->cap)
            w->used[w->nused++] = (uint32_t)ci;
        w->bits[ci / 64] |= 1ull << (ci % 64);
    }
    return ML_OK;
}

/* The states that keep block i (into w->kc, from w->kfrom); *mk of them. */
static ml_status keep_block(solve *s, size_t i, size_t *mk)
{
    ml_opt_work *w = s->w;
    const ml_opt_chain *c = s->c;
    const ml_opt_block *b = &c->blk[i];
    *mk = 0;
    if (!reserve((void **)&w->kc, &w->capkc, s->m, sizeof *w->kc) ||
        !reserve((void **)&w->kfrom, &w->capkf, s->m, sizeof *w->kfrom) ||
        !reserve((void **)&w->nxt, &w->capnxt, s->m + 1, sizeof *w->nxt))
        return ML_NOMEM;
    const uint64_t kf[] = {c->base_f, b->fwd};
    const uint64_t kb[] = {b->base_b, b->keep, b->bwd};
    uint64_t K1, K2;
    if (!room(s->M, kf, 2, &K1) || !room(s->M, kb, 3, &K2) || b->keep > s->Pend)
        return ML_OK;
    uint64_t K = K1 < K2 ? K1 : K2;
    if (K > s->Pend - b->keep)
        K = s->Pend - b->keep;
    const node *cur = w->cur;
    for (size_t k = 0; k < s->m && cur[k].P <= K; k++) {
        w->kc[*mk] = (node){cur[k].P + b->keep, cur[k].cost, cur[k].nrec};
        w->kfrom[(*mk)++] = (uint32_t)k;
    }
    return ML_OK;
}

/* The best candidate of one cell at level L. */
typedef struct {
    bool have;
    node best;
    link from;
    uint64_t rank;
    uint64_t lowest; /* the smallest prefix among the cell's candidates */
} candidate;

static void offer_open(solve *s, size_t ci, uint32_t L, candidate *cd)
{
    ml_opt_work *w = s->w;
    const group *h;
    const member *hm;
    if (!ml__oc_best(&w->cl[ci], &w->pl, L, &h, &hm)) {
        w->bits[ci / 64] &= ~(1ull << (ci % 64));
        return;
    }
    cd->best = (node){h->P, h->key + w->F[L], (uint32_t)(h->nkey + (int32_t)L)};
    cd->from = hm->id | SEG;
    cd->rank = ml_oc_rank(hm->id, true);
    cd->have = true;
    /* the worse open segments below it */
    for (const group *g = h; g < w->cl[ci].v + w->cl[ci].n; g++)
        if (g->P < cd->lowest)
            cd->lowest = g->P;
}

/* The front of level L = i + 1 into w->nxt: per cell the best of the kept
 * states (mk of them in w->kc) and of the cell's best open segment, then
 * the Pareto front over the cells (P ascending, cost strictly descending);
 * it becomes the current front. */
static ml_status next_front(solve *s, size_t i, size_t mk)
{
    ml_opt_work *w = s->w;
    const uint32_t L = (uint32_t)(i + 1);
    const unsigned qs = s->qs;
    const node *kc = w->kc;
    size_t m2 = 0, kp = 0, ce = next_bit(w->bits, s->nw, 0, s->ncell);
    ml_status st;
    for (;;) {
        size_t ck = kp < mk ? (size_t)(kc[kp].P >> qs) : s->ncell;
        size_t ci = ce < ck ? ce : ck;
        if (ci >= s->ncell)
            break;
        candidate cd = {false, {0, 0, 0}, 0, 0, UINT64_MAX};
        if (ce == ci) { /* the next cell with open segments, fetched early */
            ce = next_bit(w->bits, s->nw, ci + 1, s->ncell);
            if (ce < s->ncell)
                __builtin_prefetch(&w->cl[ce].v[w->cl[ce].head]);
            offer_open(s, ci, L, &cd);
        }
        s->sx.visits++;
        for (; kp < mk && (size_t)(kc[kp].P >> qs) == ci; kp++) {
            const uint32_t kid = (uint32_t)w->off[i] + w->kfrom[kp];
            if (kc[kp].P < cd.lowest)
                cd.lowest = kc[kp].P;
            uint64_t kr = ml_oc_rank(kid, false);
            if (!cd.have || ml_oc_better(kc[kp].cost, kc[kp].nrec, kc[kp].P, kr, cd.best.cost,
                                         cd.best.nrec, cd.best.P, cd.rank))
                cd = (candidate){true, kc[kp], kid, kr, cd.lowest};
        }
        if (!cd.have)
            continue;
        /* a candidate with a smaller prefix lost to a cheaper one */
        s->sx.merges += cd.lowest < cd.best.P;
        if (m2 && !ml_oc_better(cd.best.cost, cd.best.nrec, 0, 0, w->nxt[m2 - 1].cost,
                                w->nxt[m2 - 1].nrec, 0, 0))
            continue;
        if (!reserve((void **)&w->nxt, &w->capnxt, m2 + 1, sizeof *w->nxt))
            return ML_NOMEM;
        w->nxt[m2++] = cd.best;
        if ((st = push_link(s, cd.from)))
            return st;
    }
    w->off[L + 1] = s->nln;
    s->sx.states += m2;
    node *t = w->cur;
    w->cur = w->nxt;
    w->nxt = t;
    size_t tc = w->capcur;
    w->capcur = w->capnxt;
    w->capnxt = tc;
    s->m = m2;
    return ML_OK;
}

/* The plan of state `best` of the last front, walked back through the
 * links into seg (segment ids count from the end); its cost as
 * ml__opt_check sums it, block by block. */
static double walk_back(const solve *s, size_t best, int *seg)
{
    const ml_opt_work *w = s->w;
    const size_t n = s->c->n;
    size_t lvl = n, g = w->off[n] + best;
    int id = 0;
    while (lvl > 0) {
        const link l = w->ln[g / LCHUNK][g % LCHUNK];
        g = l & ~SEG;
        size_t from = lvl - 1; /* the predecessor's level */
        while (w->off[from] > g)
            from--;
        if (l & SEG) {
            for (size_t j = from; j < lvl; j++)
                seg[j] = id;
            id++;
        } else {
            seg[from] = -1;
        }
        lvl = from;
    }
    double f = 0;
    for (size_t j = 0; j < n; j++)
        if (seg[j] >= 0)
            f += s->c->blk[j].flops;
    return f;
}

ml_status ml__opt_solve_in(ml_opt_work *w, const ml_opt_chain *c, size_t cells, int *seg,
                           double *cost, bool *feasible, ml_opt_stats *stats)
{
    solve s;
    ml_status st = solve_begin(&s, w, c, cells);
    for (size_t i = 0; !st && i < c->n; i++) {
        size_t mk;
        if ((st = open_segments(&s, i)) || (st = keep_block(&s, i, &mk)) ||
            (st = next_front(&s, i, mk)))
            break;
        if (!s.m)
            break; /* nothing reaches this boundary: infeasible */
    }
    if (st)
        return st;
    /* the tail: head and loss above everything kept; the front's cost
     * falls as P rises, so the last state that fits is the cheapest */
    size_t best = SIZE_MAX;
    for (size_t k = 0; k < s.m; k++) {
        uint64_t t;
        if (add_ok(c->base_t, w->cur[k].P, &t) && t <= s.M)
            best = k;
    }
    *feasible = best != SIZE_MAX;
    if (stats)
        *stats = s.sx;
    if (*feasible)
        *cost = walk_back(&s, best, seg);
    return ML_OK;
}

ml_status ml__opt_solve_stats(const ml_opt_chain *c, size_t cells, int *seg, double *cost,
                              bool *feasible, ml_opt_stats *stats)
{
    ml_opt_work *w = ml__opt_work_create();
    if (!w)
        return ML_NOMEM;
    ml_status st = ml__opt_solve_in(w, c, cells, seg, cost, feasible, stats);
    ml__opt_work_destroy(w);
    return st;
}

ml_status ml__opt_solve(const ml_opt_chain *c, size_t cells, int *seg, double *cost,
                        bool *feasible)
{
    return ml__opt_solve_stats(c, cells, seg, cost, feasible, NULL);
}
