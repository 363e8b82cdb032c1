/* Checking a plan against the chain model of optimal.h: every constraint
 * of docs/optimal.md ("The chain model") block by block, the cost and the
 * peak. The solver's answers and the tests' brute force are held to it. */
#include "ledger/optimal.h"

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
    uint64_t recomputed; /* recreated bytes of s..j */
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
    /* backward of j after the recompute: blocks s..j recreated, the first
     * without its input (the segment's x), the others whole (each one's
     * input is the previous one's recreated output) */
    uint64_t r;
    if (!add_ok(st->recomputed, j == s ? b->recomp : b->keep, &r)) {
        st->ok = false;
        return;
    }
    st->recomputed = r;
    uint64_t live;
    if (!add_ok(P, x, &live) || !add_ok(live, r, &live) ||
        !fits3(b->base_b, live, b->bwd, c->budget, peak))
        st->ok = false;
}

bool ml__opt_check(const ml_opt_chain *c, const int *seg, double *cost, uint64_t *peak)
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

