/* Dynamic program over the chain model of optimal.h: Pareto fronts of (kept
 * prefix, cost) at the block boundaries, one state per cell of a memory
 * grid, with the open segments kept per cell. Recurrence, complexity and
 * the guarantee: docs/optimal.md. */
#include <stdlib.h>
#include <string.h>

#include "ledger/optimal.h"
#include "util/grow.h"

static bool add_ok(uint64_t a, uint64_t b, uint64_t *r)
{
    return !__builtin_add_overflow(a, b, r);
}

/* Live bytes stay within the budget: a + b + c <= budget. */
static bool fits3(uint64_t a, uint64_t b, uint64_t c, uint64_t budget, uint64_t *peak)
{
    uint64_t s;
    if (!add_ok(a, b, &s) || !add_ok(s, c, &s))
        return false;
    if (peak && s > *peak)
        *peak = s;
    return s <= budget;
}

/* Constraints of one kept (not checkpointed) block i at prefix P. */
static bool kept_ok(const ml_opt_chain *c, size_t i, uint64_t P, uint64_t *peak)
{
    const ml_opt_block *b = &c->blk[i];
    bool ok = fits3(c->base_f, P, b->fwd, c->budget, peak);
    uint64_t kb;
    ok = add_ok(b->keep, b->bwd, &kb) && fits3(b->base_b, P, kb, c->budget, peak) && ok;
    return ok;
}

/* Segment [s..e] at prefix P: extends a running check block by block. */
typedef struct {
    uint64_t recomputed; /* sum of recomp over s..j */
    bool ok;
} segstate;

static void seg_step(const ml_opt_chain *c, size_t s, size_t j, uint64_t P, segstate *st,
                     uint64_t *peak)
{
    const ml_opt_block *b = &c->blk[j];
    uint64_t x = c->blk[s].input;
    /* forward under no_grad: the segment input plus this block's high-water */
    uint64_t px;
    if (!add_ok(P, j == s ? 0 : x, &px)) {
        st->ok = false;
        return;
    }
    if (!fits3(c->base_f, px, b->fwd_ng, c->budget, peak))
        st->ok = false;
    /* backward of j after the recompute: blocks s..j recomputed */
    uint64_t r;
    if (!add_ok(st->recomputed, b->recomp, &r)) {
        st->ok = false;
        return;
    }
    st->recomputed = r;
    uint64_t live;
    if (!add_ok(P, x, &live) || !add_ok(live, r, &live) ||
        !fits3(b->base_b, live, b->bwd, c->budget, peak))
        st->ok = false;
}

bool ml_opt_check(const ml_opt_chain *c, const int *seg, double *cost, uint64_t *peak)
{
    uint64_t P = 0, pk = 0;
    double f = 0;
    bool ok = true;
    for (size_t i = 0; i < c->n;) {
        if (seg[i] < 0) {
            ok = kept_ok(c, i, P, &pk) && ok;
            if (!add_ok(P, c->blk[i].keep, &P))
                return false;
            i++;
            continue;
        }
        size_t e = i;
        while (e + 1 < c->n && seg[e + 1] == seg[i])
            e++;
        segstate st = {0, true};
        for (size_t j = i; j <= e; j++) {
            seg_step(c, i, j, P, &st, &pk);
            f += c->blk[j].flops;
        }
        ok = st.ok && ok;
        if (!add_ok(P, c->blk[i].input, &P))
            return false;
        i = e + 1;
    }
    uint64_t t;
    if (!add_ok(c->base_t, P, &t))
        return false;
    if (t > pk)
        pk = t;
    ok = ok && t <= c->budget;
    if (cost)
        *cost = f;
    if (peak)
        *peak = pk;
    return ok;
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

/* An open segment: it starts from state id (at some level s) and can end
 * at levels s+1..until. Its cost at level i is key + F(i) and its
 * nrec nkey + i, with F the prefix sums of the FLOPs, so open segments from
 * different starts compare the same at every level. */
typedef struct {
    uint64_t P; /* prefix after the segment: the state's P plus the input x */
    double key;
    int32_t nkey;
    uint32_t until, id;
} entry;

/* Open segments of one cell with equal (P, key, nkey) form a group: they
 * differ only in where they start, which decides ties (the earliest start
 * that is still open wins, see better()). Its members, in a pool, are
 * linked oldest first; a member that closes no later than a younger one
 * is useless and never kept, so their until rises along the list. */
typedef struct {
    uint32_t id, until, next;
} member;
#define NIL UINT32_MAX

typedef struct {
    member *v;
    size_t n, cap;
    uint32_t free; /* a list through next */
} pool;

typedef struct {
    uint64_t P;
    double key;
    int32_t nkey;
    uint32_t until;       /* its last (longest-open) member's */
    uint32_t first, last; /* members */
    member oldest;        /* a copy of the first: read at every visit */
} group;

/* The groups of one memory cell, v[head..n): until ascending, each strictly
 * better than the next. A group that closes no earlier and is no worse
 * than another makes that one useless, so the cell's best open segment is
 * always the oldest open member of v[head] (a staircase; docs/optimal.md). */
typedef struct {
    group *v;
    uint32_t head, n;
    size_t cap;
} cell;

/* a strictly better than b: cheaper, then fewer recomputed blocks, then the
 * smaller prefix, then the lower rank: the earlier predecessor (by id), and
 * from the same one keeping before a segment (the order in which the search
 * meets them, so equal plans resolve the same way every time) */
static bool better(double ca, int64_t ra, uint64_t pa, uint64_t ka, double cb, int64_t rb,
                   uint64_t pb, uint64_t kb)
{
    if (ca != cb)
        return ca < cb;
    if (ra != rb)
        return ra < rb;
    if (pa != pb)
        return pa < pb;
    return ka < kb;
}

static uint64_t rank(uint32_t id, bool segment)
{
    return (uint64_t)id << 1 | segment;
}

/* group g against the open segment e, by value only */
static bool group_better(const group *g, const entry *e)
{
    return better(g->key, g->nkey, g->P, 0, e->key, e->nkey, e->P, 0);
}

static bool entry_better(const entry *e, const group *g)
{
    return better(e->key, e->nkey, e->P, 0, g->key, g->nkey, g->P, 0);
}

static uint32_t member_new(pool *pl, const entry *e)
{
    uint32_t i = pl->free;
    if (i != NIL) {
        pl->free = pl->v[i].next;
    } else {
        member *v = pl->n < NIL ? ml_grow(pl->v, pl->n, &pl->cap, sizeof *v, 1024) : NULL;
        if (!v)
            return NIL;
        pl->v = v;
        i = (uint32_t)pl->n++;
    }
    pl->v[i] = (member){e->id, e->until, NIL};
    return i;
}

static void members_free(pool *pl, uint32_t first, uint32_t last)
{
    if (first == NIL)
        return;
    pl->v[last].next = pl->free;
    pl->free = first;
}

/* Enters e into its cell: as a new member of its group, as a new group
 * (dropping the groups it makes useless), or not at all. */
static bool cell_put(cell *c, pool *pl, const entry *e, ml_opt_stats *sx)
{
    /* the first group no better than e (values worsen along v) */
    uint32_t lo = c->head, hi = c->n;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (group_better(&c->v[mid], e))
            lo = mid + 1;
        else
            hi = mid;
    }
    if (lo < c->n && !entry_better(e, &c->v[lo])) { /* equal value: a member */
        group *g = &c->v[lo];
        if (e->until <= g->until)
            return true;
        uint32_t m = member_new(pl, e);
        if (m == NIL)
            return false;
        pl->v[g->last].next = m;
        if (g->first == g->last)
            g->oldest.next = m;
        g->last = m;
        g->until = e->until;
        uint32_t j = lo + 1; /* worse and now closing no later */
        while (j < c->n && c->v[j].until <= e->until) {
            sx->merges += c->v[j].P < e->P;
            members_free(pl, c->v[j].first, c->v[j].last);
            j++;
        }
        memmove(c->v + lo + 1, c->v + j, (c->n - j) * sizeof *c->v);
        sx->moves += (j - lo - 1) + (c->n - j);
        c->n -= j - lo - 1;
        return true;
    }
    /* a new value: its place by until (usually after every group) */
    lo = c->head;
    hi = c->n;
    if (hi > lo && c->v[hi - 1].until < e->until)
        lo = hi;
    while (lo < hi) {
        uint32_t mid = lo + (hi - lo) / 2;
        if (c->v[mid].until < e->until)
            lo = mid + 1;
        else
            hi = mid;
    }
    uint32_t p = lo;
    if (p < c->n && group_better(&c->v[p], e)) { /* better and open as long */
        sx->merges += e->P < c->v[p].P;
        return true;
    }
    uint32_t end = p < c->n && c->v[p].until == e->until ? p + 1 : p;
    uint32_t k = p;
    while (k > c->head && !group_better(&c->v[k - 1], e))
        k--;
    uint32_t m = member_new(pl, e);
    if (m == NIL)
        return false;
    const group ng = {e->P, e->key, e->nkey, e->until, m, m, pl->v[m]};
    for (uint32_t j = k; j < end; j++) {
        sx->merges += c->v[j].P < e->P;
        members_free(pl, c->v[j].first, c->v[j].last);
    }
    sx->moves += end - k;
    if (k < end) { /* ng replaces v[k..end) */
        c->v[k] = ng;
        memmove(c->v + k + 1, c->v + end, (c->n - end) * sizeof *c->v);
        c->n -= end - k - 1;
        sx->moves += c->n - k - 1;
        return true;
    }
    if (c->head && c->n == c->cap) { /* reuse the closed groups' room */
        memmove(c->v, c->v + c->head, (c->n - c->head) * sizeof *c->v);
        p -= c->head;
        c->n -= c->head;
        sx->moves += c->n;
        c->head = 0;
    }
    group *v = ml_grow(c->v, c->n, &c->cap, sizeof *v, 4);
    if (!v) {
        members_free(pl, m, m);
        return false;
    }
    c->v = v;
    memmove(v + p + 1, v + p, (c->n - p) * sizeof *v);
    sx->moves += c->n - p;
    v[p] = ng;
    c->n++;
    return true;
}

/* The cell's best open segment at level L: closed groups and members
 * released; false when none is left. */
static bool cell_best(cell *c, pool *pl, uint32_t L, const group **g, const member **mb)
{
    while (c->head < c->n && c->v[c->head].until < L) {
        members_free(pl, c->v[c->head].first, c->v[c->head].last);
        c->head++;
    }
    if (c->head == c->n) {
        c->head = c->n = 0;
        return false;
    }
    group *h = &c->v[c->head];
    while (h->oldest.until < L) { /* the last member is open */
        uint32_t nx = h->oldest.next;
        members_free(pl, h->first, h->first);
        h->first = nx;
        h->oldest = pl->v[nx];
        /* the next to close, usually at the next boundary */
        if (h->oldest.next != NIL)
            __builtin_prefetch(&pl->v[h->oldest.next]);
    }
    *g = h;
    *mb = &h->oldest;
    return true;
}

/* Room for need elements of elem bytes in *v (capacity *cap). */
static bool reserve(void **v, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return true;
    size_t c = *cap ? *cap : 64;
    while (c < need)
        c *= 2;
    void *nv = realloc(*v, c * elem);
    if (!nv)
        return false;
    *v = nv;
    *cap = c;
    return true;
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

ml_opt_work *ml_opt_work_create(void)
{
    ml_opt_work *w = calloc(1, sizeof *w);
    if (w)
        w->pl.free = NIL;
    return w;
}

void ml_opt_work_destroy(ml_opt_work *w)
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

/* Room for the per-block arrays of n blocks and ncell cells, all cells and
 * the pool empty. */
static bool work_ready(ml_opt_work *w, size_t n, size_t ncell)
{
    if (n + 2 > w->capn) {
        size_t c = n + 2;
        double *F = realloc(w->F, c * sizeof *F);
        if (F)
            w->F = F;
        uint64_t *a = realloc(w->needF, c * sizeof *a);
        if (a)
            w->needF = a;
        uint64_t *b = realloc(w->needB, c * sizeof *b);
        if (b)
            w->needB = b;
        uint64_t *t = realloc(w->thr, c * sizeof *t);
        if (t)
            w->thr = t;
        bool *o = realloc(w->ok, c * sizeof *o);
        if (o)
            w->ok = o;
        size_t *of = realloc(w->off, c * sizeof *of);
        if (of)
            w->off = of;
        if (!F || !a || !b || !t || !o || !of)
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

ml_status ml_opt_solve_in(ml_opt_work *w, const ml_opt_chain *c, size_t cells, int *seg,
                          double *cost, bool *feasible, ml_opt_stats *stats)
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
    const uint64_t q = (uint64_t)1 << qs;
    const size_t ncell = (size_t)(M >> qs) + 1;
    ml_opt_stats sx = {ncell, q, 0, 0, 0, 0, 0, 0};
    /* prefixes never fall and the tail needs base_t + P <= M: a state
     * above Pend is dead (when base_t > M, the tail rejects every one) */
    const uint64_t Pend = c->base_t <= M ? M - c->base_t : 0;
    if (!work_ready(w, n, ncell))
        return ML_NOMEM;
    /* per block: what its forward (base_f + v) and its backward (b + w)
     * need besides the prefix, the segment input and the recomputed bytes;
     * ok false when either is beyond 64 bits (then nothing fits) */
    double *F = w->F;
    uint64_t *needF = w->needF, *needB = w->needB, *thr = w->thr;
    bool *ok = w->ok;
    size_t *off = w->off;
    /* fronts grow as needed (at most ncell states) */
    node *cur = w->cur, *nxt = w->nxt, *kc = w->kc;
    uint32_t *kfrom = w->kfrom;
    size_t capcur = w->capcur, capnxt = w->capnxt, capkc = w->capkc, capkf = w->capkf;
    cell *cl = w->cl;
    const size_t nw = (ncell + 63) / 64;
    uint64_t *bits = w->bits;
    /* links in fixed chunks: never copied as they grow */
    size_t nln = 0;
    pool *pl = &w->pl;
    ml_status st = ML_OK;
    F[0] = 0;
    for (size_t i = 0; i < n; i++) {
        const ml_opt_block *b = &c->blk[i];
        F[i + 1] = F[i] + b->flops;
        ok[i] = add_ok(c->base_f, b->fwd_ng, &needF[i]) && add_ok(b->base_b, b->bwd, &needB[i]);
    }
#define PUSH_LINK(l_)                                                                         \
    do {                                                                                      \
        if (nln >= SEG) {                                                                     \
            st = ML_RANGE;                                                                    \
            goto out;                                                                         \
        }                                                                                     \
        if (nln / LCHUNK == w->nchunks) {                                                     \
            if (!reserve((void **)&w->ln, &w->capln, w->nchunks + 1, sizeof *w->ln) ||        \
                !(w->ln[w->nchunks] = malloc(LCHUNK * sizeof **w->ln))) {                     \
                st = ML_NOMEM;                                                                \
                goto out;                                                                     \
            }                                                                                 \
            w->nchunks++;                                                                     \
        }                                                                                     \
        w->ln[nln / LCHUNK][nln % LCHUNK] = (l_);                                             \
        nln++;                                                                                \
    } while (0)
    size_t m = 1;
    cur[0] = (node){0, 0, 0};
    off[0] = 0;
    PUSH_LINK(0);
    off[1] = 1;
    for (size_t i = 0; i < n; i++) {
        const ml_opt_block *b = &c->blk[i];
        /* segments starting at i: thr[r] is the largest prefix with which
         * the segment i..i+r meets every constraint (non-increasing in r):
         * at most M - needF(i) (its forward, the input not yet kept) and
         * M - x - U, U the largest need of the blocks so far (seg_step) */
        size_t reach = 0;
        uint64_t Tf, Mx, lim;
        if (ok[i] && needF[i] <= M && cur[0].P <= M - needF[i] &&
            add_ok(b->input, cur[0].P, &lim) && lim <= M) {
            Tf = M - needF[i];
            Mx = M - b->input;
            lim = Mx - cur[0].P;
            uint64_t U = 0, R = 0;
            for (size_t e = i; e < n; e++) {
                uint64_t need;
                sx.steps++;
                if (!ok[e] || !add_ok(R, c->blk[e].recomp, &R) || !add_ok(needB[e], R, &need))
                    break;
                if (e > i && needF[e] > need)
                    need = needF[e];
                if (need > U)
                    U = need;
                if (U > lim)
                    break;
                thr[reach++] = Mx - U < Tf ? Mx - U : Tf;
            }
        }
        /* fronts are P ascending, so each state reaches no further than
         * the one before it */
        for (size_t k = 0, r = reach; k < m; k++) {
            while (r && thr[r - 1] < cur[k].P)
                r--;
            if (!r)
                break;
            entry en = {cur[k].P + b->input, cur[k].cost - F[i],
                        (int32_t)cur[k].nrec - (int32_t)i, (uint32_t)(i + r),
                        (uint32_t)(off[i] + k)};
            if (en.P > Pend)
                break;
            size_t ci = (size_t)(en.P >> qs);
            sx.segments++;
            const bool fresh = !cl[ci].cap;
            if ((fresh && !reserve((void **)&w->used, &w->capused, w->nused + 1,
                                   sizeof *w->used)) ||
                !cell_put(&cl[ci], pl, &en, &sx)) {
                st = ML_NOMEM;
                goto out;
            }
            if (fresh && cl[ci].cap)
                w->used[w->nused++] = (uint32_t)ci;
            bits[ci / 64] |= 1ull << (ci % 64);
        }
        /* keeping block i */
        size_t mk = 0;
        uint64_t K1, K2;
        if (!reserve((void **)&kc, &capkc, m, sizeof *kc) ||
            !reserve((void **)&kfrom, &capkf, m, sizeof *kfrom) ||
            !reserve((void **)&nxt, &capnxt, m + 1, sizeof *nxt)) {
            st = ML_NOMEM;
            goto out;
        }
        const uint64_t kf[] = {c->base_f, b->fwd};
        const uint64_t kb[] = {b->base_b, b->keep, b->bwd};
        if (room(M, kf, 2, &K1) && room(M, kb, 3, &K2) && b->keep <= Pend) {
            uint64_t K = K1 < K2 ? K1 : K2;
            if (K > Pend - b->keep)
                K = Pend - b->keep;
            for (size_t k = 0; k < m && cur[k].P <= K; k++) {
                kc[mk] = (node){cur[k].P + b->keep, cur[k].cost, cur[k].nrec};
                kfrom[mk++] = (uint32_t)k;
            }
        }
        /* the front of level L = i + 1: per cell the best of the kept
         * states and of the cell's best open segment, then the Pareto
         * front over the cells (P ascending, cost strictly descending) */
        const uint32_t L = (uint32_t)(i + 1);
        size_t m2 = 0, kp = 0, ce = next_bit(bits, nw, 0, ncell);
        for (;;) {
            size_t ck = kp < mk ? (size_t)(kc[kp].P >> qs) : ncell;
            size_t ci = ce < ck ? ce : ck;
            if (ci >= ncell)
                break;
            const bool open = ce == ci;
            if (open) { /* the next cell with open segments, fetched early */
                ce = next_bit(bits, nw, ci + 1, ncell);
                if (ce < ncell)
                    __builtin_prefetch(&cl[ce].v[cl[ce].head]);
            }
            sx.visits++;
            bool have = false;
            node best = {0, 0, 0};
            link from = 0;
            uint64_t brank = 0;
            uint64_t lowest = UINT64_MAX; /* the smallest prefix among the cell's candidates */
            if (open) {
                const group *h;
                const member *hm;
                if (!cell_best(&cl[ci], pl, L, &h, &hm)) {
                    bits[ci / 64] &= ~(1ull << (ci % 64));
                } else {
                    best = (node){h->P, h->key + F[L], (uint32_t)(h->nkey + (int32_t)L)};
                    from = hm->id | SEG;
                    brank = rank(hm->id, true);
                    have = true;
                    /* the worse open segments below it */
                    for (const group *g = h; g < cl[ci].v + cl[ci].n; g++)
                        if (g->P < lowest)
                            lowest = g->P;
                }
            }
            for (; kp < mk && (size_t)(kc[kp].P >> qs) == ci; kp++) {
                const uint32_t kid = (uint32_t)off[i] + kfrom[kp];
                if (kc[kp].P < lowest)
                    lowest = kc[kp].P;
                uint64_t kr = rank(kid, false);
                if (!have || better(kc[kp].cost, kc[kp].nrec, kc[kp].P, kr, best.cost, best.nrec,
                                    best.P, brank)) {
                    best = kc[kp];
                    from = kid;
                    brank = kr;
                    have = true;
                }
            }
            if (!have)
                continue;
            /* a candidate with a smaller prefix lost to a cheaper one */
            sx.merges += lowest < best.P;
            if (m2 && !better(best.cost, best.nrec, 0, 0, nxt[m2 - 1].cost, nxt[m2 - 1].nrec, 0, 0))
                continue;
            if (!reserve((void **)&nxt, &capnxt, m2 + 1, sizeof *nxt)) {
                st = ML_NOMEM;
                goto out;
            }
            nxt[m2++] = best;
            PUSH_LINK(from);
        }
        off[L + 1] = nln;
        sx.states += m2;
        node *t = cur;
        cur = nxt;
        nxt = t;
        size_t tc = capcur;
        capcur = capnxt;
        capnxt = tc;
        m = m2;
        if (!m)
            break; /* nothing reaches this boundary: infeasible */
    }
#undef PUSH_LINK
    /* the tail: head and loss above everything kept; the front's cost
     * falls as P rises, so the last state that fits is the cheapest */
    size_t best = SIZE_MAX;
    if (m) /* m = 0: the loop stopped at a boundary nothing reaches */
        for (size_t k = 0; k < m; k++) {
            uint64_t t;
            if (add_ok(c->base_t, cur[k].P, &t) && t <= M)
                best = k;
        }
    *feasible = best != SIZE_MAX;
    if (stats)
        *stats = sx;
    if (!*feasible)
        goto out;
    /* walk back; segment ids count from the end */
    size_t lvl = n, g = off[n] + best;
    int id = 0;
    while (lvl > 0) {
        const link l = w->ln[g / LCHUNK][g % LCHUNK];
        g = l & ~SEG;
        size_t from = lvl - 1; /* the predecessor's level */
        while (off[from] > g)
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
    /* the cost as ml_opt_check sums it, block by block */
    double f = 0;
    for (size_t j = 0; j < n; j++)
        if (seg[j] >= 0)
            f += c->blk[j].flops;
    *cost = f;
out:
    /* the arrays, grown or swapped, go back to the work */
    w->cur = cur;
    w->nxt = nxt;
    w->kc = kc;
    w->kfrom = kfrom;
    w->capcur = capcur;
    w->capnxt = capnxt;
    w->capkc = capkc;
    w->capkf = capkf;
    return st;
}

ml_status ml_opt_solve_stats(const ml_opt_chain *c, size_t cells, int *seg, double *cost,
                             bool *feasible, ml_opt_stats *stats)
{
    ml_opt_work *w = ml_opt_work_create();
    if (!w)
        return ML_NOMEM;
    ml_status st = ml_opt_solve_in(w, c, cells, seg, cost, feasible, stats);
    ml_opt_work_destroy(w);
    return st;
}

ml_status ml_opt_solve(const ml_opt_chain *c, size_t cells, int *seg, double *cost,
                       bool *feasible)
{
    return ml_opt_solve_stats(c, cells, seg, cost, feasible, NULL);
}
