/* A chain at any micro-batch from its builds at powers of two
 * (docs/ledger.md, "A prepared planner"). Every byte and FLOP figure of a
 * chain is a sum of tensor sizes, or of op counts, each a product of the
 * model's dimensions in which the micro-batch B appears at most once —
 * affine in B — or the block rule's largest tensor (a transient, twice
 * it): a maximum of such sums, convex in B. A convex figure that takes
 * the values of one line at three micro-batches a < b < c is that line on
 * all of [a, c]: past b it lies above the line through a and b, and up to
 * c below its chord from b to c, which is that line; before b the same
 * with the roles swapped. So where three builds, at x/2, x and 2x, have
 * the same structure (blocks, saved tensors, nodes, parameters and side
 * tensors, their names, flags and links) and every figure on one line
 * with a whole slope, the chain at any B in [x/2, 2x] is
 * v(B) = v(x) + (B - x)·(v(2x) - v(x))/x, without building it.
 *
 * What a builder decides by B (a mixture of experts' rows per expert,
 * min(k·B·T, E) experts; the fused cross-entropy's chunks; a calibration
 * profile's scaling) is neither affine nor convex, and the planner never
 * derives those chains (planner.c). Derived figures stay far below 64
 * bits (2^56 bytes, 2^50 FLOPs: there every product and sum a builder
 * computes is exact), else the caller builds the chain itself and so gets
 * the builders' own overflow check.
 *
 * The figures are listed below, struct by struct: a field added to the
 * chain (chain.h) is listed here as a figure or a part of the structure;
 * the sizes asserted below (on 64-bit targets) make the build say so. */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/chain_affine.h"

#if UINTPTR_MAX == UINT64_MAX
_Static_assert(sizeof(ml_chain) == 488 && sizeof(ml_cblock) == 352 && sizeof(ml_saved) == 32 &&
                   sizeof(ml_bnode) == 136 && sizeof(ml_side) == 56 && sizeof(ml_ptensor) == 32 &&
                   sizeof(ml_work_item) == 56 && sizeof(ml_fstep) == 16,
               "a chain struct changed (chain.h): list its new field below, then the sizes");
#endif

#define BYTES_MAX (UINT64_C(1) << 56)
#define FLOPS_MAX 1125899906842624.0 /* 2^50 */

#define BLOCK_SHAPE(X)                                                                         \
    X(ckpt_index) X(saved_first) X(node_first) X(like_prev) X(fwd_phase) X(params) X(nsaved)   \
    X(nnodes) X(in_saved) X(out_saved) X(identity) X(in_held) X(in_nograd) X(inplace)         \
    X(nodes_off) X(measured) X(fwd_only) X(frozen) X(unused_out) X(grads_in_fwd)             \
    X(ws_fwd_ops) X(ws_nograd_ops) X(ws_formula) X(work_first) X(work_fwd) X(work_bwd)        \
    X(work_known) X(moe) X(hand_last) X(hand_gid) X(fstep_first) X(nfsteps) X(fstep_out) \
    X(gstep_first) X(ngsteps) X(gstep_out) X(gsave_per) X(nfcopies) X(grad_view_param)
#define BLOCK_BYTES(X)                                                                         \
    X(saved_bytes) X(core_bytes) X(cast_bytes) X(in_bytes) X(ws_fwd) X(ws_nograd) X(ws_bwd)   \
    X(unit_fwd) X(unit) X(bwd_in) X(tied_grad) X(grad_bytes) X(grad_accum_bytes) X(cache_bytes)    \
    X(cache_unit) X(out_cache_bytes) X(grad_view)
#define BLOCK_FLOPS(X) X(flops_fwd) X(flops_bwd) X(flops_core)
#define SAVED_SHAPE(X) X(flags) X(node) X(next_same)
#define SAVED_BYTES(X) X(bytes)
#define NODE_SHAPE(X)                                                                          \
    X(first_saved) X(gin_id[0]) X(gin_id[1]) X(gin_id[2]) X(gin_id[3]) X(gout_id[0]) X(gout_id[1]) X(gout_id[2]) X(ngin)   \
    X(ngout) X(gin_acc) X(accum) X(pg_first) X(scratch_parts) X(scratch_first) X(scratch_early) X(frees_table) X(unpacks) \
    X(accum_copy) X(frees_carry) X(into_incoming)
#define NODE_BYTES(X)                                                                          \
    X(grad_in) X(param_grad) X(scratch) X(grad_out) X(gin_b[0]) X(gin_b[1]) X(gin_b[2])          \
    X(gin_b[3]) X(gout_b[0]) X(gout_b[1]) X(gout_b[2]) X(pg_bias)
#define FSTEP_SHAPE(X) X(tok) X(part) X(alloc) X(entry) X(slot)
#define FSTEP_BYTES(X) X(bytes)
#define WORK_SHAPE(X) X(kind) X(bwd) X(esize) X(kernels) X(core) X(causal)
#define WORK_FLOPS(X) X(flops) X(bytes) X(m) X(n) X(k) X(batch)
#define PARAM_SHAPE(X) X(numel) X(rows) X(cols) X(nograd) X(frozen)
#define SIDE_SHAPE(X) X(from) X(to) X(to_bwd) X(ckpt_kept) X(grad_from) X(grad_to) X(graph)
#define SIDE_BYTES(X) X(bytes) X(grad)
#define CHAIN_SHAPE(X)                                                                         \
    X(n) X(nsaved) X(nparams) X(nnodes) X(nsides) X(nwork) X(nfsteps) X(overflow) X(nomem) X(record_nodes)        \
    X(eval_mode) X(selective) X(grad_held) X(mask_in_forward) X(T) X(c_width) X(n_ckpt)   \
    X(calibrated) X(calib_c) X(calib_exact) X(vis_mode) X(side_ids) X(mask_ckpt0) X(max_param_numel)     \
    X(psum.all) X(psum.trained) X(psum.with_grad) X(psum.overflow) X(psum.known) X(cp)   \
    X(ep) X(moe_k) X(moe_experts) X(ep_layer_params) X(etp) X(ep_tp) X(ep_dispatch) X(tables_at) X(tp_parts)
#define CHAIN_BYTES(X)                                                                         \
    X(B) X(c_tokens) X(ckpt_side) X(batch_input) X(batch_targets) X(buffer_bytes) X(cp_kv)   \
    X(ep_rows) X(ep_pairs) X(ep_self) /* not affine in B (the routing's remainders): listed, though a mixture of \
                  experts' chain is never derived (planner.c, shaped_by_batch) */

static bool same_str(const char *a, const char *b)
{
    return a == b || (a && b && strcmp(a, b) == 0);
}

/* ---- three builds on one line ----------------------------------------- */

/* va, vb, vc at x/2, x, 2x on a line with a whole slope (vb - va)/(x/2),
 * not falling */
static bool line_u(uint64_t va, uint64_t vb, uint64_t vc, uint64_t x)
{
    if (vb < va || vc < vb)
        return false;
    uint64_t d = vb - va, h = x / 2;
    return (d == 0 || d % h == 0) && d <= UINT64_MAX / 2 && vc - vb == 2 * d;
}

static bool line_f(double va, double vb, double vc, uint64_t x)
{
    if (va == vb && vb == vc)
        return true;
    if (!(va <= vb && vb <= vc && vc < FLOPS_MAX) || va != floor(va) || vb != floor(vb) ||
        vc != floor(vc))
        return false;
    double d = vb - va;
    return fmod(d, (double)(x / 2)) == 0 && vc - vb == 2 * d;
}

#define EQ(f) &&a->f == b->f &&b->f == c->f
#define LINE_U(f) &&line_u(a->f, b->f, c->f, x)
#define LINE_F(f) &&line_f(a->f, b->f, c->f, x)

static bool block_line(const ml_cblock *a, const ml_cblock *b, const ml_cblock *c, uint64_t x)
{
    return strcmp(a->name, b->name) == 0 &&
           strcmp(b->name, c->name) == 0 BLOCK_SHAPE(EQ) BLOCK_BYTES(LINE_U) BLOCK_FLOPS(LINE_F);
}

static bool saved_line(const ml_saved *a, const ml_saved *b, const ml_saved *c, uint64_t x)
{
    return same_str(a->what, b->what) &&
           same_str(b->what, c->what) SAVED_SHAPE(EQ) SAVED_BYTES(LINE_U);
}

static bool node_line(const ml_bnode *a, const ml_bnode *b, const ml_bnode *c, uint64_t x)
{
    return same_str(a->what, b->what) &&
           same_str(b->what, c->what) NODE_SHAPE(EQ) NODE_BYTES(LINE_U);
}

static bool fstep_line(const ml_fstep *a, const ml_fstep *b, const ml_fstep *c, uint64_t x)
{
    return true FSTEP_SHAPE(EQ) FSTEP_BYTES(LINE_U);
}

static bool param_line(const ml_ptensor *a, const ml_ptensor *b, const ml_ptensor *c)
{
    return true PARAM_SHAPE(EQ);
}

static bool work_line(const ml_work_item *a, const ml_work_item *b, const ml_work_item *c,
                      uint64_t x)
{
    return true WORK_SHAPE(EQ) WORK_FLOPS(LINE_F);
}

static bool side_line(const ml_side *a, const ml_side *b, const ml_side *c, uint64_t x)
{
    return same_str(a->what, b->what) &&
           same_str(b->what, c->what) SIDE_SHAPE(EQ) SIDE_BYTES(LINE_U);
}

static bool chain_line(const ml_chain *a, const ml_chain *b, const ml_chain *c, uint64_t x)
{
    return !a->overflow && !a->nomem && memcmp(&a->prec, &b->prec, sizeof a->prec) == 0 &&
           memcmp(&b->prec, &c->prec, sizeof b->prec) == 0 && same_str(a->calib_note, b->calib_note) &&
           same_str(b->calib_note, c->calib_note) CHAIN_SHAPE(EQ) CHAIN_BYTES(LINE_U);
}

bool ml__chain_line(const ml_chain *a, const ml_chain *b, const ml_chain *c, uint64_t x)
{
    if (x < 2 || a->B != x / 2 || b->B != x || c->B != 2 * x || !chain_line(a, b, c, x))
        return false;
    for (size_t i = 0; i < a->n; i++)
        if (!block_line(&a->blocks[i], &b->blocks[i], &c->blocks[i], x))
            return false;
    for (size_t i = 0; i < a->nsaved; i++)
        if (!saved_line(&a->saved[i], &b->saved[i], &c->saved[i], x))
            return false;
    for (size_t i = 0; i < a->nnodes; i++)
        if (!node_line(&a->nodes[i], &b->nodes[i], &c->nodes[i], x))
            return false;
    for (size_t i = 0; i < a->nparams; i++)
        if (!param_line(&a->params[i], &b->params[i], &c->params[i]))
            return false;
    for (size_t i = 0; i < a->nsides; i++)
        if (!side_line(&a->sides[i], &b->sides[i], &c->sides[i], x))
            return false;
    for (size_t i = 0; i < a->nwork; i++)
        if (!work_line(&a->work[i], &b->work[i], &c->work[i], x))
            return false;
    for (size_t i = 0; i < a->nfsteps; i++)
        if (!fstep_line(&a->fsteps[i], &b->fsteps[i], &c->fsteps[i], x))
            return false;
    return true;
}

/* ---- the chain at B ---------------------------------------------------- */

/* v(x) + (B - x)·(v(2x) - v(x))/x, x = 2^k (the division a shift); *bad
 * when it passes BYTES_MAX */
static uint64_t at_u(uint64_t v1, uint64_t v2, unsigned k, uint64_t B, bool *bad)
{
    uint64_t step, r;
    if (__builtin_mul_overflow((v2 - v1) >> k, B - (UINT64_C(1) << k), &step) ||
        __builtin_add_overflow(v1, step, &r) || r >= BYTES_MAX) {
        *bad = true;
        return 0;
    }
    return r;
}

/* The same for a FLOP count: dx is B - x, inv 1/x (a power of two, so the
 * product is the quotient (v2 - v1)/x exactly) */
static double at_f(double v1, double v2, double dx, double inv, bool *bad)
{
    /* without a branch (a work item's figures are many and mixed): where
     * v1 == v2, r is v1 itself (v1 + dx * 0, exact); a constant figure at
     * or past FLOPS_MAX, which ml__chain_line lets pass, is *bad too (the
     * evaluation then builds its chain) */
    double r = v1 + dx * ((v2 - v1) * inv);
    *bad |= !(r < FLOPS_MAX);
    return r;
}

#define AT_U(f) o->f = at_u(a->f, b->f, k, B, bad);
#define AT_F(f) o->f = at_f(a->f, b->f, dx, inv, bad);

/* Room in *o for a's arrays; false when out of memory. */
static bool room(const ml_chain *a, ml_chain *o)
{
#define ROOM(arr, cnt, cap)                                                                    \
    if (o->cap < a->cnt) {                                                                     \
        void *p = realloc(o->arr, a->cnt * sizeof *o->arr);                                    \
        if (!p)                                                                                \
            return false;                                                                      \
        o->arr = p;                                                                            \
        o->cap = a->cnt;                                                                       \
    }
    ROOM(blocks, n, cap)
    ROOM(saved, nsaved, savedcap)
    ROOM(nodes, nnodes, nodecap)
    ROOM(sides, nsides, sidecap)
    ROOM(work, nwork, workcap)
    ROOM(fsteps, nfsteps, fstepcap)
#undef ROOM
    return true;
}

/* *o = *a with a's figures moved along the line to B, o's arrays kept */
static void chain_at(const ml_chain *a, const ml_chain *b, unsigned k, uint64_t B, ml_chain *o,
                     bool *bad)
{
    ml_chain keep = *o;
    *o = *a;
    o->blocks = keep.blocks;
    o->saved = keep.saved;
    o->nodes = keep.nodes;
    o->sides = keep.sides;
    o->cap = keep.cap;
    o->savedcap = keep.savedcap;
    o->nodecap = keep.nodecap;
    o->sidecap = keep.sidecap;
    o->work = keep.work;
    o->workcap = keep.workcap;
    o->fsteps = keep.fsteps;
    o->fstepcap = keep.fstepcap;
    CHAIN_BYTES(AT_U)
}

static void block_at(const ml_cblock *a, const ml_cblock *b, unsigned k, uint64_t B,
                     ml_cblock *o, bool *bad)
{
    const double dx = (double)(B - (UINT64_C(1) << k)), inv = 1.0 / (double)(UINT64_C(1) << k);
    BLOCK_BYTES(AT_U)
    BLOCK_FLOPS(AT_F)
}

static void saved_at(const ml_saved *a, const ml_saved *b, unsigned k, uint64_t B, ml_saved *o,
                     bool *bad)
{
    SAVED_BYTES(AT_U)
}

static void node_at(const ml_bnode *a, const ml_bnode *b, unsigned k, uint64_t B, ml_bnode *o,
                    bool *bad)
{
    NODE_BYTES(AT_U)
}

static void work_at(const ml_work_item *a, const ml_work_item *b, unsigned k, uint64_t B,
                    ml_work_item *o, bool *bad)
{
    /* (its shape copied with the array) */
    const double dx = (double)(B - (UINT64_C(1) << k)), inv = 1.0 / (double)(UINT64_C(1) << k);
    WORK_FLOPS(AT_F)
}

static void fstep_at(const ml_fstep *a, const ml_fstep *b, unsigned k, uint64_t B, ml_fstep *o,
                     bool *bad)
{
    FSTEP_BYTES(AT_U)
}

static void side_at(const ml_side *a, const ml_side *b, unsigned k, uint64_t B, ml_side *o,
                    bool *bad)
{
    SIDE_BYTES(AT_U)
}

ml_status ml__chain_at(const ml_chain *one, const ml_chain *two, unsigned k, uint64_t B,
                       bool work, ml_chain *o)
{
    if (!room(one, o))
        return ML_NOMEM;
    bool bad = false;
    chain_at(one, two, k, B, o, &bad);
    /* each array copied whole, then its figures moved along the line; the
     * parameters borrowed */
#define COPY(arr, cnt)                                                                         \
    if (one->cnt)                                                                              \
        memcpy(o->arr, one->arr, one->cnt * sizeof *o->arr);
    COPY(blocks, n)
    COPY(saved, nsaved)
    COPY(nodes, nnodes)
    COPY(sides, nsides)
    COPY(fsteps, nfsteps)
#undef COPY
    /* a block like the one before it (ml__chain_mark_runs: the same figures
     * in both builds) has the same figures at B */
#define SAME(f) o->blocks[i].f = o->blocks[i - 1].f;
    for (size_t i = 0; i < one->n && !bad; i++) {
        if (i > 0 && one->blocks[i].like_prev) {
            BLOCK_BYTES(SAME)
            BLOCK_FLOPS(SAME)
        } else {
            block_at(&one->blocks[i], &two->blocks[i], k, B, &o->blocks[i], &bad);
        }
        if (!work) {
            o->blocks[i].work_known = false;
            o->blocks[i].work_first = o->blocks[i].work_fwd = o->blocks[i].work_bwd = 0;
        }
    }
#undef SAME
    for (size_t i = 0; i < one->nsaved && !bad; i++)
        saved_at(&one->saved[i], &two->saved[i], k, B, &o->saved[i], &bad);
    for (size_t i = 0; i < one->nnodes && !bad; i++)
        node_at(&one->nodes[i], &two->nodes[i], k, B, &o->nodes[i], &bad);
    for (size_t i = 0; i < one->nsides && !bad; i++)
        side_at(&one->sides[i], &two->sides[i], k, B, &o->sides[i], &bad);
    for (size_t i = 0; i < one->nfsteps && !bad; i++)
        fstep_at(&one->fsteps[i], &two->fsteps[i], k, B, &o->fsteps[i], &bad);
    /* (a flag of its own: a work item's bools could alias bad) */
    bool wbad = false;
    if (!work)
        o->nwork = 0;
    if (o->nwork)
        memcpy(o->work, one->work, one->nwork * sizeof *o->work);
    for (size_t i = 0; i < o->nwork; i++)
        work_at(&one->work[i], &two->work[i], k, B, &o->work[i], &wbad);
    bad |= wbad;
    return bad ? ML_OVERFLOW : ML_OK;
}
