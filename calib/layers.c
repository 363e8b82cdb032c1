#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "layers.h"

const char *const kind_names[K_COUNT] = {"linear", "mlp", "transformer_block", "lm_head",
                                         "llama_block"};

void tracker_init(tracker *tr, ml_backend *be)
{
    memset(tr, 0, sizeof *tr);
    tr->be = be;
    tr->dev_base = be->device_used(be);
}

tn talloc(tracker *tr, size_t bytes, int cat)
{
    tn t = {NULL, bytes, cat, false};
    if (tr->oom)
        return t;
    t.p = tr->be->alloc(tr->be, bytes);
    if (!t.p) {
        tr->oom = true;
        return t;
    }
    tr->live[cat] += bytes;
    tr->total += bytes;
    if (tr->total > tr->peak[tr->phase])
        tr->peak[tr->phase] = tr->total;
    return t;
}

void tfree(tracker *tr, tn *t)
{
    if (!t->p)
        return;
    tr->be->free(tr->be, t->p);
    tr->live[t->cat] -= t->bytes;
    tr->total -= t->bytes;
    t->p = NULL;
}

void tracker_device_sample(tracker *tr)
{
    uint64_t u = tr->be->device_used(tr->be);
    if (u > tr->dev_base && u - tr->dev_base > tr->dev_peak)
        tr->dev_peak = u - tr->dev_base;
}

#define F(t) ((float *)(t).p)
#define I64(t) ((int64_t *)(t).p)
#define U8(t) ((uint8_t *)(t).p)

static void random_fill(tracker *tr, tn *t, size_t n, float scale, uint64_t *seed)
{
    float *h = malloc(n * sizeof *h);
    if (!h) {
        tr->oom = true;
        return;
    }
    for (size_t i = 0; i < n; i++) {
        *seed = *seed * 6364136223846793005ull + 1442695040888963407ull;
        h[i] = ((float)(*seed >> 40) / 16777216.0f - 0.5f) * 2 * scale;
    }
    tr->be->upload(tr->be, t->p, h, n * sizeof *h);
    free(h);
}

static int add_param(layer *l, tracker *tr, size_t n, float scale, bool ones)
{
    int i = l->nparams++;
    l->wn[i] = n;
    l->w[i] = talloc(tr, n * 4, T_PARAM);
    l->m[i] = talloc(tr, n * 4, T_STATE);
    l->v[i] = talloc(tr, n * 4, T_STATE);
    if (tr->oom)
        return -1;
    if (ones) {
        float *h = malloc(n * sizeof *h);
        if (!h)
            return -1;
        for (size_t k = 0; k < n; k++)
            h[k] = 1.0f;
        tr->be->upload(tr->be, l->w[i].p, h, n * 4);
        free(h);
    } else {
        random_fill(tr, &l->w[i], n, scale, &l->seed);
    }
    tr->be->zero(tr->be, l->m[i].p, n * 4);
    tr->be->zero(tr->be, l->v[i].p, n * 4);
    return 0;
}

/* parameter indices per kind */
enum { LIN_W, LIN_B };
enum { MLP_W1, MLP_B1, MLP_W2, MLP_B2 };
enum { BL_G1, BL_B1, BL_WQKV, BL_BQKV, BL_WO, BL_BO, BL_G2, BL_B2, BL_W1, BL_BF1, BL_W2, BL_BF2 };
enum { LM_WTE, LM_WPE, LM_GF, LM_BF, LM_WH };
enum { LL_N1, LL_WQ, LL_WK, LL_WV, LL_WO, LL_N2, LL_WG, LL_WU, LL_WD };

static size_t kv_of(const dims *d)
{
    return d->KV ? d->KV : d->H;
}

int layer_init(layer *l, kind_t kind, const dims *d, tracker *tr, uint64_t seed)
{
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->d = *d;
    l->seed = seed;
    size_t D = d->D, F_ = d->F;
    float s = 1.0f / sqrtf((float)D);
    int rc = 0;
    switch (kind) {
    case K_LINEAR:
        rc |= add_param(l, tr, D * D, s, false);
        rc |= add_param(l, tr, D, s, false);
        break;
    case K_MLP:
        rc |= add_param(l, tr, D * F_, s, false);
        rc |= add_param(l, tr, F_, s, false);
        rc |= add_param(l, tr, F_ * D, 1.0f / sqrtf((float)F_), false);
        rc |= add_param(l, tr, D, s, false);
        break;
    case K_BLOCK:
        rc |= add_param(l, tr, D, 0, true);
        rc |= add_param(l, tr, D, s, false);
        rc |= add_param(l, tr, D * 3 * D, s, false);
        rc |= add_param(l, tr, 3 * D, s, false);
        rc |= add_param(l, tr, D * D, s, false);
        rc |= add_param(l, tr, D, s, false);
        rc |= add_param(l, tr, D, 0, true);
        rc |= add_param(l, tr, D, s, false);
        rc |= add_param(l, tr, D * F_, s, false);
        rc |= add_param(l, tr, F_, s, false);
        rc |= add_param(l, tr, F_ * D, 1.0f / sqrtf((float)F_), false);
        rc |= add_param(l, tr, D, s, false);
        break;
    case K_LLAMA: {
        size_t dkv = kv_of(d) * (D / d->H);
        rc |= add_param(l, tr, D, 0, true);
        rc |= add_param(l, tr, D * D, s, false);
        rc |= add_param(l, tr, D * dkv, s, false);
        rc |= add_param(l, tr, D * dkv, s, false);
        rc |= add_param(l, tr, D * D, s, false);
        rc |= add_param(l, tr, D, 0, true);
        rc |= add_param(l, tr, D * F_, s, false);
        rc |= add_param(l, tr, D * F_, s, false);
        rc |= add_param(l, tr, F_ * D, 1.0f / sqrtf((float)F_), false);
        break;
    }
    case K_LMHEAD:
        rc |= add_param(l, tr, d->V * D, 0.1f, false);
        rc |= add_param(l, tr, d->T * D, 0.1f, false);
        rc |= add_param(l, tr, D, 0, true);
        rc |= add_param(l, tr, D, s, false);
        rc |= add_param(l, tr, d->V * D, s, false);
        break;
    default:
        return -1;
    }
    return rc || tr->oom ? -1 : 0;
}

size_t layer_input_bytes(const layer *l)
{
    size_t BT = l->d.B * l->d.T;
    return l->kind == K_LMHEAD ? BT * 8 : BT * l->d.D * 4;
}

double layer_flops(const layer *l)
{
    double BT = (double)(l->d.B * l->d.T), D = (double)l->d.D, F_ = (double)l->d.F;
    switch (l->kind) {
    case K_LINEAR: return 2 * BT * D * D;
    case K_MLP: return 4 * BT * D * F_;
    case K_BLOCK:
        return 2 * BT * D * 3 * D + 4 * (double)l->d.B * (double)l->d.T * (double)l->d.T * D +
               2 * BT * D * D + 4 * BT * D * F_;
    case K_LMHEAD: return 2 * BT * D * (double)l->d.V;
    case K_LLAMA: {
        double dkv = (double)(kv_of(&l->d) * (l->d.D / l->d.H));
        return 2 * BT * D * (D + 2 * dkv) + 4 * (double)l->d.B * (double)l->d.T * (double)l->d.T * D +
               2 * BT * D * D + 6 * BT * D * F_;
    }
    default: return 0;
    }
}

static tn *keep(layer *l, tn t)
{
    l->saved[l->nsaved] = t;
    return &l->saved[l->nsaved++];
}

/* ---- autocast (amp) ------------------------------------------------------
 * Under torch.autocast(dtype=bfloat16) (aten/src/ATen/autocast_mode.cpp)
 * a matmul runs on bf16 casts of its inputs and saves those casts; weights
 * are cast once per forward and cached; layer_norm, softmax and
 * log_softmax run in fp32. The runner stores exactly the tensors autograd
 * keeps in those dtypes; its elementwise kernels are fp32 only, so an op
 * whose result autograd keeps in bf16 writes an fp32 staging buffer (T_WORK)
 * that is then cast (slot, settle). The saved bytes are autocast's; the
 * transient workspace is larger than PyTorch's. */

/* A bf16 cast of n fp32 values, in category cat. */
static tn low_copy(tracker *tr, const float *src, size_t n, int cat)
{
    tn c = talloc(tr, n * 2, cat);
    c.low = true;
    if (c.p)
        tr->be->cast(tr->be, src, c.p, n, true);
    return c;
}

/* Where an op writes a tensor autograd keeps in the compute dtype: the kept
 * fp32 tensor itself, or under amp an fp32 staging buffer (*stage) whose
 * bf16 cast settle() keeps. */
static tn *slot(layer *l, tracker *tr, size_t n, tn *stage)
{
    *stage = (tn){NULL, 0, T_WORK, false};
    if (!l->d.amp)
        return keep(l, talloc(tr, n * 4, T_SAVED));
    *stage = talloc(tr, n * 4, T_WORK);
    return stage;
}

static tn *settle(layer *l, tracker *tr, tn *t, tn *stage)
{
    if (t != stage)
        return t;
    tn *k = keep(l, low_copy(tr, stage->p, stage->bytes / 4, T_SAVED));
    tfree(tr, stage);
    return k;
}

/* Another bf16 cast of the same fp32 input, for a second projection of it:
 * casts of non-leaf tensors are not cached, so autograd keeps each one
 * (backward reads the first; the values are equal). */
static void extra_copy(layer *l, tracker *tr, const float *src, size_t n)
{
    l->extra[l->nextra++] = low_copy(tr, src, n, T_SAVED);
}

/* The weight a matmul multiplies by: the parameter, or under amp its bf16
 * copy, cast on first use and kept until backward is done. */
static const tn *wt(layer *l, tracker *tr, int i)
{
    if (!l->d.amp)
        return &l->w[i];
    if (!l->wc[i].p && !tr->oom)
        l->wc[i] = low_copy(tr, l->w[i].p, l->wn[i], T_CAST);
    return &l->wc[i];
}

/* fp32 values of t for an elementwise kernel: t itself, or an fp32 copy of
 * a bf16 tensor in *tmp (tfree it after; NULL when out of memory). */
static float *f32(tracker *tr, const tn *t, tn *tmp)
{
    *tmp = (tn){NULL, 0, T_WORK, false};
    if (!t->low)
        return t->p;
    *tmp = talloc(tr, t->bytes * 2, T_WORK);
    if (tmp->p)
        tr->be->cast(tr->be, t->p, tmp->p, t->bytes / 2, false);
    return tmp->p;
}

/* C = alpha op(A) op(B) + beta C over `batch` strided matrices, through
 * the mixed-precision GEMM when an operand is bf16. */
static void mm(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha, const tn *A,
               long sA, const tn *B, long sB, float beta, float *C, long sC, int batch)
{
    if (A->low || B->low)
        be->gemm_mixed(be, ta, tb, M, N, K, alpha, A->p, A->low, sA, B->p, B->low, sB, beta, C,
                       sC, batch);
    else if (batch == 1)
        be->gemm(be, ta, tb, M, N, K, alpha, A->p, B->p, beta, C);
    else
        be->gemm_batched(be, ta, tb, M, N, K, alpha, A->p, sA, B->p, sB, beta, C, sC, batch);
}

/* y = x W + b over rows */
static void linear_fwd(ml_backend *be, const tn *x, const tn *W, const tn *b, float *y,
                       size_t rows, size_t in, size_t out)
{
    mm(be, false, false, (int)rows, (int)out, (int)in, 1.0f, x, 0, W, 0, 0.0f, y, 0, 1);
    if (b)
        be->bias_add(be, y, b->p, rows, out);
}

/* dx = dy W^T (if dx; beta_dx 1 adds to it), dW += x^T dy, db += sum dy */
static void linear_bwd(ml_backend *be, const tn *x, const tn *W, const tn *dy, float *dx,
                       float beta_dx, float *dW, float *db, size_t rows, size_t in, size_t out)
{
    if (dx)
        mm(be, false, true, (int)rows, (int)in, (int)out, 1.0f, dy, 0, W, 0, beta_dx, dx, 0, 1);
    mm(be, true, false, (int)in, (int)out, (int)rows, 1.0f, x, 0, dy, 0, 1.0f, dW, 0, 1);
    if (db)
        be->bias_grad(be, dy->p, db, rows, out);
}

static void grads_alloc(layer *l, tracker *tr)
{
    for (int i = 0; i < l->nparams; i++) {
        l->g[i] = talloc(tr, l->wn[i] * 4, T_GRAD);
        if (l->g[i].p)
            tr->be->zero(tr->be, l->g[i].p, l->wn[i] * 4);
    }
}

/* Eager attention after the head-major q, k, v (B*H, T, dh): S = q k^T
 * (workspace), P = softmax(scale S) kept in fp32; with dropout p its mask
 * and output kept, else under amp PV's bf16 cast of P; O = P' v back into
 * (B, T, D) rows, the output projection's input (kept); then the projection
 * (weight wo, bias bo or NULL). Returns its output (T_WORK), empty when out
 * of memory. Both block layouts share it. */
static tn attention_fwd(layer *l, tracker *tr, const tn *q, const tn *k, const tn *v, float p,
                        int wo, const tn *bo)
{
    ml_backend *be = tr->be;
    const dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, dh = D / H, BHTT = B * H * T * T;
    float scale = 1.0f / sqrtf((float)dh);
    tn none = {NULL, 0, T_WORK, false};
    tn S = talloc(tr, BHTT * 4, T_WORK);
    /* softmax output (fp32 under amp: softmax is on autocast's fp32 list) */
    tn *P = keep(l, talloc(tr, BHTT * 4, T_SAVED));
    if (tr->oom)
        return none;
    mm(be, false, true, (int)T, (int)T, (int)dh, 1.0f, q, (long)(T * dh), k, (long)(T * dh),
       0.0f, F(S), (long)(T * T), (int)(B * H));
    be->softmax_fwd(be, F(S), F(*P), B * H, T, scale);
    tfree(tr, &S);
    tn *Pd = P;
    if (p > 0) {
        tn *mask = keep(l, talloc(tr, BHTT, T_SAVED)), sd;
        Pd = slot(l, tr, BHTT, &sd); /* the dropout output */
        if (tr->oom)
            return none;
        be->dropout_fwd(be, F(*P), U8(*mask), F(*Pd), BHTT, p, l->seed + 1);
        Pd = settle(l, tr, Pd, &sd);
    } else if (d->amp) {
        Pd = keep(l, low_copy(tr, P->p, BHTT, T_SAVED)); /* PV's bf16 cast */
    }
    tn O = talloc(tr, B * T * D * 4, T_WORK);
    tn so;
    tn *om = slot(l, tr, B * T * D, &so);
    tn a = talloc(tr, B * T * D * 4, T_WORK);
    const tn *w = wt(l, tr, wo);
    if (tr->oom)
        return none;
    mm(be, false, false, (int)T, (int)dh, (int)T, 1.0f, Pd, (long)(T * T), v, (long)(T * dh),
       0.0f, F(O), (long)(T * dh), (int)(B * H));
    be->permute(be, F(O), F(*om), B, T, H, dh, D, 0, false);
    tfree(tr, &O);
    om = settle(l, tr, om, &so);
    if (tr->oom)
        return none;
    linear_fwd(be, om, w, bo, F(a), B * T, D, D);
    return a;
}

/* What attention_fwd kept, in its order from saved[i]; advances i. */
typedef struct {
    const tn *P, *mask, *pv, *om;
} attn_kept;

static attn_kept attention_kept(const layer *l, int *i)
{
    attn_kept r = {&l->saved[*i], NULL, NULL, NULL};
    ++*i;
    if (l->d.dropout > 0 && l->kind == K_BLOCK)
        r.mask = &l->saved[(*i)++];
    r.pv = r.mask || l->d.amp ? &l->saved[(*i)++] : r.P;
    r.om = &l->saved[(*i)++];
    return r;
}

/* Backward of attention_fwd from da, the projection output's gradient:
 * the projection's weight gradient (and bias gradient into dbo), and dq, dk,
 * dv head-major in the caller's (B*H, T, dh) buffers; rows is a (B, T, D)
 * scratch buffer. */
static void attention_bwd(layer *l, tracker *tr, const attn_kept *r, const tn *q, const tn *k,
                          const tn *v, const tn *da, int wo, float *dbo, float *rows, tn *dO,
                          tn *dP, float *dq, float *dk, float *dv)
{
    ml_backend *be = tr->be;
    const dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, dh = D / H;
    long tt = (long)(T * T), td = (long)(T * dh);
    int bh = (int)(B * H);
    linear_bwd(be, r->om, wt(l, tr, wo), da, rows, 0.0f, F(l->g[wo]), dbo, B * T, D, D);
    be->permute(be, rows, F(*dO), B, T, H, dh, D, 0, true);
    /* O = P' v: dP' = dO v^T, dv = P'^T dO */
    mm(be, false, true, (int)T, (int)T, (int)dh, 1.0f, dO, td, v, td, 0.0f, F(*dP), tt, bh);
    mm(be, true, false, (int)T, (int)dh, (int)T, 1.0f, r->pv, tt, dO, td, 0.0f, dv, td, bh);
    if (r->mask)
        be->dropout_bwd(be, U8(*r->mask), F(*dP), F(*dP), B * H * T * T, d->dropout);
    be->softmax_bwd(be, F(*r->P), F(*dP), F(*dP), B * H, T, 1.0f / sqrtf((float)dh));
    /* S = q k^T: dq = dS k, dk = dS^T q */
    mm(be, false, false, (int)T, (int)dh, (int)T, 1.0f, dP, tt, k, td, 0.0f, dq, td, bh);
    mm(be, true, false, (int)T, (int)dh, (int)T, 1.0f, dP, tt, q, td, 0.0f, dk, td, bh);
}

tn layer_forward(layer *l, tracker *tr, tn *x)
{
    ml_backend *be = tr->be;
    const dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, F_ = d->F, BT = B * T, dh = H ? D / H : 0;
    bool amp = d->amp;
    tn none = {NULL, 0, T_WORK, false};
    l->nsaved = 0;
    l->nextra = 0;
    switch (l->kind) {
    case K_LINEAR:
    case K_MLP: {
        /* addmm saves its input; under amp its bf16 cast instead, and the
         * fp32 input is no longer needed */
        tn *xs = x;
        if (amp) {
            xs = keep(l, low_copy(tr, x->p, BT * D, T_SAVED));
            tfree(tr, x);
        } else {
            keep(l, *x);
        }
        tn y = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        if (l->kind == K_LINEAR) {
            linear_fwd(be, xs, wt(l, tr, LIN_W), &l->w[LIN_B], F(y), BT, D, D);
            return y;
        }
        tn hs, as;
        tn *h = slot(l, tr, BT * F_, &hs); /* gelu saves its input */
        tn *a = slot(l, tr, BT * F_, &as); /* the 2nd linear its input */
        const tn *w1 = wt(l, tr, MLP_W1), *w2 = wt(l, tr, MLP_W2);
        if (tr->oom)
            return none;
        linear_fwd(be, xs, w1, &l->w[MLP_B1], F(*h), BT, D, F_);
        be->gelu_fwd(be, F(*h), F(*a), BT * F_);
        settle(l, tr, h, &hs);
        a = settle(l, tr, a, &as);
        if (tr->oom)
            return none;
        linear_fwd(be, a, w2, &l->w[MLP_B2], F(y), BT, F_, D);
        return y;
    }
    case K_BLOCK: {
        float p = d->dropout;
        keep(l, *x);                                               /* 0 ln_1 input */
        tn *mean1 = keep(l, talloc(tr, BT * 4, T_SAVED));          /* 1 */
        tn *rstd1 = keep(l, talloc(tr, BT * 4, T_SAVED));          /* 2 */
        tn st, sq, sk, sv;
        tn *ln1 = slot(l, tr, BT * D, &st);                        /* 3 qkv input */
        if (tr->oom)
            return none;
        be->layernorm_fwd(be, F(*x), F(l->w[BL_G1]), F(l->w[BL_B1]), F(*ln1), F(*mean1),
                          F(*rstd1), BT, D);
        ln1 = settle(l, tr, ln1, &st);
        tn qkv = talloc(tr, BT * 3 * D * 4, T_WORK);
        tn *q = slot(l, tr, BT * D, &sq);                          /* 4 */
        tn *k = slot(l, tr, BT * D, &sk);                          /* 5 */
        tn *v = slot(l, tr, BT * D, &sv);                          /* 6 */
        const tn *wqkv = wt(l, tr, BL_WQKV);
        if (tr->oom)
            return none;
        linear_fwd(be, ln1, wqkv, &l->w[BL_BQKV], F(qkv), BT, D, 3 * D);
        be->permute(be, F(qkv), F(*q), B, T, H, dh, 3 * D, 0, true);
        be->permute(be, F(qkv), F(*k), B, T, H, dh, 3 * D, D, true);
        be->permute(be, F(qkv), F(*v), B, T, H, dh, 3 * D, 2 * D, true);
        tfree(tr, &qkv);
        q = settle(l, tr, q, &sq);
        k = settle(l, tr, k, &sk);
        v = settle(l, tr, v, &sv);
        /* masked_fill keeps a bool T x T mask; the softmax kernel masks by
         * index, but the tensor is kept as PyTorch keeps it */
        keep(l, talloc(tr, T * T, T_SAVED));                       /* 7 */
        tn a = attention_fwd(l, tr, q, k, v, p, BL_WO, &l->w[BL_BO]); /* 8.. */
        if (tr->oom)
            return none;
        if (p > 0) {
            tn *rm = keep(l, talloc(tr, BT * D, T_SAVED));
            if (tr->oom)
                return none;
            be->dropout_fwd(be, F(a), U8(*rm), F(a), BT * D, p, l->seed + 2);
        }
        tn *x2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* ln_2 input */
        tn *mean2 = keep(l, talloc(tr, BT * 4, T_SAVED));
        tn *rstd2 = keep(l, talloc(tr, BT * 4, T_SAVED));
        tn s2, shh, sg;
        tn *ln2 = slot(l, tr, BT * D, &s2);                        /* fc input */
        if (tr->oom)
            return none;
        be->add(be, F(*x), F(a), F(*x2), BT * D);
        tfree(tr, &a);
        be->layernorm_fwd(be, F(*x2), F(l->w[BL_G2]), F(l->w[BL_B2]), F(*ln2), F(*mean2),
                          F(*rstd2), BT, D);
        ln2 = settle(l, tr, ln2, &s2);
        tn *h = slot(l, tr, BT * F_, &shh);                        /* gelu input */
        tn *g = slot(l, tr, BT * F_, &sg);                         /* proj input */
        const tn *w1 = wt(l, tr, BL_W1), *w2 = wt(l, tr, BL_W2);
        if (tr->oom)
            return none;
        linear_fwd(be, ln2, w1, &l->w[BL_BF1], F(*h), BT, D, F_);
        be->gelu_fwd(be, F(*h), F(*g), BT * F_);
        settle(l, tr, h, &shh);
        g = settle(l, tr, g, &sg);
        tn y = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        linear_fwd(be, g, w2, &l->w[BL_BF2], F(y), BT, F_, D);
        if (p > 0) {
            tn *rm2 = keep(l, talloc(tr, BT * D, T_SAVED));
            if (tr->oom)
                return none;
            be->dropout_fwd(be, F(y), U8(*rm2), F(y), BT * D, p, l->seed + 3);
        }
        be->add(be, F(*x2), F(y), F(y), BT * D); /* residual */
        return y;
    }
    case K_LLAMA: {
        size_t KV = kv_of(d), rep = H / KV, dkv = KV * dh;
        keep(l, *x);                                               /* 0 rmsnorm input */
        tn *rs1 = keep(l, talloc(tr, BT * 4, T_SAVED));            /* 1 rsqrt */
        tn *h1 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 2 normalised */
        tn s1, sq, sk, sv;
        tn *y1 = slot(l, tr, BT * D, &s1);                         /* 3 q/k/v input */
        if (tr->oom)
            return none;
        be->rmsnorm_fwd(be, F(*x), F(l->w[LL_N1]), F(*rs1), F(*h1), F(*y1), BT, D);
        if (amp) { /* q_proj's cast is kept at 3; k_proj's and v_proj's are two more */
            extra_copy(l, tr, F(*y1), BT * D);
            extra_copy(l, tr, F(*y1), BT * D);
        }
        y1 = settle(l, tr, y1, &s1);
        tn q = talloc(tr, BT * D * 4, T_WORK), k = talloc(tr, BT * dkv * 4, T_WORK),
           v = talloc(tr, BT * dkv * 4, T_WORK), kvh = talloc(tr, BT * dkv * 4, T_WORK);
        tn *qh = slot(l, tr, BT * D, &sq);                         /* 4 */
        tn *kh = slot(l, tr, BT * D, &sk);                         /* 5 repeated */
        tn *vh = slot(l, tr, BT * D, &sv);                         /* 6 repeated */
        const tn *wq = wt(l, tr, LL_WQ), *wk = wt(l, tr, LL_WK), *wv = wt(l, tr, LL_WV);
        if (tr->oom)
            return none;
        linear_fwd(be, y1, wq, NULL, F(q), BT, D, D);
        linear_fwd(be, y1, wk, NULL, F(k), BT, D, dkv);
        linear_fwd(be, y1, wv, NULL, F(v), BT, D, dkv);
        be->permute(be, F(q), F(*qh), B, T, H, dh, D, 0, true);
        be->permute(be, F(k), F(kvh), B, T, KV, dh, dkv, 0, true);
        be->repeat_heads(be, F(kvh), F(*kh), B, KV, rep, T, dh, false);
        be->permute(be, F(v), F(kvh), B, T, KV, dh, dkv, 0, true);
        be->repeat_heads(be, F(kvh), F(*vh), B, KV, rep, T, dh, false);
        tfree(tr, &q);
        tfree(tr, &k);
        tfree(tr, &v);
        tfree(tr, &kvh);
        qh = settle(l, tr, qh, &sq);
        kh = settle(l, tr, kh, &sk);
        vh = settle(l, tr, vh, &sv);
        /* 7.. softmax (fp32), under amp PV's cast, o_proj input */
        tn a = attention_fwd(l, tr, qh, kh, vh, 0, LL_WO, NULL);
        if (tr->oom)
            return none;
        tn *x2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 9 */
        tn *rs2 = keep(l, talloc(tr, BT * 4, T_SAVED));            /* 10 */
        tn *h2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 11 */
        tn s2, sgt, ssg, su, spr;
        tn *y2 = slot(l, tr, BT * D, &s2);                         /* 12 gate/up input */
        if (tr->oom)
            return none;
        be->add(be, F(*x), F(a), F(*x2), BT * D);
        tfree(tr, &a);
        be->rmsnorm_fwd(be, F(*x2), F(l->w[LL_N2]), F(*rs2), F(*h2), F(*y2), BT, D);
        if (amp) /* gate_proj's cast is kept at 12, up_proj's is another */
            extra_copy(l, tr, F(*y2), BT * D);
        y2 = settle(l, tr, y2, &s2);
        tn *g = slot(l, tr, BT * F_, &sgt);                        /* 13 silu input */
        tn *sg = slot(l, tr, BT * F_, &ssg);                       /* 14 silu output */
        tn *u = slot(l, tr, BT * F_, &su);                         /* 15 up output */
        tn *pr = slot(l, tr, BT * F_, &spr);                       /* 16 down input */
        const tn *wg = wt(l, tr, LL_WG), *wu = wt(l, tr, LL_WU), *wd = wt(l, tr, LL_WD);
        if (tr->oom)
            return none;
        linear_fwd(be, y2, wg, NULL, F(*g), BT, D, F_);
        linear_fwd(be, y2, wu, NULL, F(*u), BT, D, F_);
        be->silu_fwd(be, F(*g), F(*sg), BT * F_);
        be->mul(be, F(*sg), F(*u), F(*pr), BT * F_);
        settle(l, tr, g, &sgt);
        settle(l, tr, sg, &ssg);
        settle(l, tr, u, &su);
        pr = settle(l, tr, pr, &spr);
        tn y = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        linear_fwd(be, pr, wd, NULL, F(y), BT, F_, D);
        be->add(be, F(*x2), F(y), F(y), BT * D);
        return y;
    }
    case K_LMHEAD: {
        size_t V = d->V;
        float p = d->dropout;
        keep(l, *x);                                               /* 0 token ids */
        tn *pos = keep(l, talloc(tr, T * 8, T_SAVED));             /* 1 position ids */
        tn *tgt = keep(l, talloc(tr, BT * 8, T_SAVED));            /* 2 targets */
        tn e = talloc(tr, BT * D * 4, T_WORK), pe = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        int64_t *hp = malloc(BT * 8);
        if (!hp) {
            tr->oom = true;
            return none;
        }
        for (size_t t = 0; t < T; t++)
            hp[t] = (int64_t)t;
        be->upload(be, pos->p, hp, T * 8);
        for (size_t i = 0; i < BT; i++)
            hp[i] = (int64_t)((i * 7919 + 13) % V);
        be->upload(be, tgt->p, hp, BT * 8);
        free(hp);
        be->embedding_fwd(be, I64(*x), F(l->w[LM_WTE]), F(e), BT, D);
        int64_t *posb = malloc(BT * 8);
        tn posbt = talloc(tr, BT * 8, T_WORK);
        if (!posb || tr->oom) {
            free(posb);
            tr->oom = true;
            return none;
        }
        for (size_t i = 0; i < BT; i++)
            posb[i] = (int64_t)(i % T);
        be->upload(be, posbt.p, posb, BT * 8);
        free(posb);
        be->embedding_fwd(be, I64(posbt), F(l->w[LM_WPE]), F(pe), BT, D);
        tfree(tr, &posbt);
        be->add(be, F(e), F(pe), F(e), BT * D);
        tfree(tr, &pe);
        tn *xe = &e; /* the block stack would run here; the head takes it directly */
        if (p > 0) {
            tn *m = keep(l, talloc(tr, BT * D, T_SAVED));          /* embedding dropout mask */
            if (tr->oom)
                return none;
            be->dropout_fwd(be, F(e), U8(*m), F(e), BT * D, p, l->seed + 4);
        }
        tn *xf = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* ln_f input */
        tn *mf = keep(l, talloc(tr, BT * 4, T_SAVED));
        tn *rf = keep(l, talloc(tr, BT * 4, T_SAVED));
        tn sl;
        tn *lnf = slot(l, tr, BT * D, &sl);                        /* lm_head input */
        if (tr->oom)
            return none;
        /* xf = xe: the residual stream entering the head (a copy here, the
         * output of the last block in a model) */
        be->zero(be, xf->p, BT * D * 4);
        be->add(be, F(*xf), F(*xe), F(*xf), BT * D);
        tfree(tr, &e);
        be->layernorm_fwd(be, F(*xf), F(l->w[LM_GF]), F(l->w[LM_BF]), F(*lnf), F(*mf), F(*rf),
                          BT, D);
        lnf = settle(l, tr, lnf, &sl);
        tn logits = talloc(tr, BT * V * 4, T_WORK);
        /* log-softmax output: fp32 (under amp too: autocast's fp32 list) */
        tn *logp = keep(l, talloc(tr, BT * V * 4, T_SAVED));
        keep(l, talloc(tr, 4, T_SAVED));                           /* nll total_weight */
        tn loss = talloc(tr, 4, T_WORK);
        const tn *wh = wt(l, tr, LM_WH);
        if (tr->oom)
            return none;
        linear_fwd(be, lnf, wh, NULL, F(logits), BT, D, V);
        float hl;
        be->xent_fwd(be, F(logits), I64(*tgt), F(*logp), &hl, BT, V);
        tfree(tr, &logits);
        be->upload(be, loss.p, &hl, 4);
        return loss;
    }
    default:
        return none;
    }
}

static void free_saved(layer *l, tracker *tr)
{
    for (int i = 0; i < l->nsaved; i++)
        tfree(tr, &l->saved[i]);
    l->nsaved = 0;
    for (int i = 0; i < l->nextra; i++)
        tfree(tr, &l->extra[i]);
    l->nextra = 0;
    for (int i = 0; i < l->nparams; i++)
        tfree(tr, &l->wc[i]);
}

tn layer_backward(layer *l, tracker *tr, tn *dy)
{
    ml_backend *be = tr->be;
    const dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, F_ = d->F, BT = B * T, dh = H ? D / H : 0;
    tn none = {NULL, 0, T_WORK, false};
    grads_alloc(l, tr);
    if (tr->oom)
        return none;
    tn dx = none;
    switch (l->kind) {
    case K_LINEAR: {
        dx = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        linear_bwd(be, &l->saved[0], wt(l, tr, LIN_W), dy, F(dx), 0.0f, F(l->g[LIN_W]),
                   F(l->g[LIN_B]), BT, D, D);
        break;
    }
    case K_MLP: {
        tn *x = &l->saved[0], *h = &l->saved[1], *a = &l->saved[2];
        tn da = talloc(tr, BT * F_ * 4, T_WORK), th;
        dx = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        linear_bwd(be, a, wt(l, tr, MLP_W2), dy, F(da), 0.0f, F(l->g[MLP_W2]), F(l->g[MLP_B2]),
                   BT, F_, D);
        float *hf = f32(tr, h, &th);
        if (tr->oom)
            break;
        be->gelu_bwd(be, hf, F(da), F(da), BT * F_);
        tfree(tr, &th);
        linear_bwd(be, x, wt(l, tr, MLP_W1), &da, F(dx), 0.0f, F(l->g[MLP_W1]), F(l->g[MLP_B1]),
                   BT, D, F_);
        tfree(tr, &da);
        break;
    }
    case K_BLOCK: {
        float p = d->dropout;
        int i = 0;
        tn *x = &l->saved[i++], *mean1 = &l->saved[i++], *rstd1 = &l->saved[i++],
           *ln1 = &l->saved[i++], *q = &l->saved[i++], *k = &l->saved[i++], *v = &l->saved[i++];
        i++; /* causal mask */
        attn_kept ak = attention_kept(l, &i);
        tn *rm = p > 0 ? &l->saved[i++] : NULL;
        tn *x2 = &l->saved[i++], *mean2 = &l->saved[i++], *rstd2 = &l->saved[i++],
           *ln2 = &l->saved[i++], *h = &l->saved[i++], *g = &l->saved[i++];
        tn *rm2 = p > 0 ? &l->saved[i++] : NULL;
        /* MLP */
        tn dy2 = talloc(tr, BT * D * 4, T_WORK), dg = talloc(tr, BT * F_ * 4, T_WORK);
        tn dln = talloc(tr, BT * D * 4, T_WORK), dx2 = talloc(tr, BT * D * 4, T_WORK), th;
        if (tr->oom)
            break;
        if (p > 0)
            be->dropout_bwd(be, U8(*rm2), F(*dy), F(dy2), BT * D, p);
        else {
            be->zero(be, dy2.p, BT * D * 4);
            be->add(be, F(dy2), F(*dy), F(dy2), BT * D);
        }
        linear_bwd(be, g, wt(l, tr, BL_W2), &dy2, F(dg), 0.0f, F(l->g[BL_W2]), F(l->g[BL_BF2]),
                   BT, F_, D);
        float *hf = f32(tr, h, &th);
        if (tr->oom)
            break;
        be->gelu_bwd(be, hf, F(dg), F(dg), BT * F_);
        tfree(tr, &th);
        linear_bwd(be, ln2, wt(l, tr, BL_W1), &dg, F(dln), 0.0f, F(l->g[BL_W1]), F(l->g[BL_BF1]),
                   BT, D, F_);
        tfree(tr, &dg);
        be->layernorm_bwd(be, F(*x2), F(l->w[BL_G2]), F(*mean2), F(*rstd2), F(dln), F(dx2),
                          F(l->g[BL_G2]), F(l->g[BL_B2]), BT, D);
        be->add(be, F(dx2), F(*dy), F(dx2), BT * D); /* residual */
        /* attention */
        tn da = dy2; /* reuse */
        if (p > 0)
            be->dropout_bwd(be, U8(*rm), F(dx2), F(da), BT * D, p);
        else {
            be->zero(be, da.p, BT * D * 4);
            be->add(be, F(da), F(dx2), F(da), BT * D);
        }
        tn dO = talloc(tr, BT * D * 4, T_WORK);
        tn dP = talloc(tr, B * H * T * T * 4, T_WORK);
        tn dqkv = talloc(tr, BT * 3 * D * 4, T_WORK);
        tn dq = talloc(tr, BT * D * 4, T_WORK), dk = talloc(tr, BT * D * 4, T_WORK),
           dv = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        attention_bwd(l, tr, &ak, q, k, v, &da, BL_WO, F(l->g[BL_BO]), F(dln), &dO, &dP, F(dq),
                      F(dk), F(dv));
        be->permute(be, F(dq), F(dqkv), B, T, H, dh, 3 * D, 0, false);
        be->permute(be, F(dk), F(dqkv), B, T, H, dh, 3 * D, D, false);
        be->permute(be, F(dv), F(dqkv), B, T, H, dh, 3 * D, 2 * D, false);
        tfree(tr, &dO);
        tfree(tr, &dP);
        tfree(tr, &dq);
        tfree(tr, &dk);
        tfree(tr, &dv);
        linear_bwd(be, ln1, wt(l, tr, BL_WQKV), &dqkv, F(dln), 0.0f, F(l->g[BL_WQKV]),
                   F(l->g[BL_BQKV]), BT, D, 3 * D);
        tfree(tr, &dqkv);
        dx = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        be->layernorm_bwd(be, F(*x), F(l->w[BL_G1]), F(*mean1), F(*rstd1), F(dln), F(dx),
                          F(l->g[BL_G1]), F(l->g[BL_B1]), BT, D);
        be->add(be, F(dx), F(dx2), F(dx), BT * D);
        tfree(tr, &dy2);
        tfree(tr, &dln);
        tfree(tr, &dx2);
        break;
    }
    case K_LLAMA: {
        size_t KV = kv_of(d), rep = H / KV, dkv = KV * dh;
        tn *S = l->saved;
        tn *rs1 = &S[1], *h1 = &S[2], *y1 = &S[3], *qh = &S[4], *kh = &S[5], *vh = &S[6];
        int i = 7;
        attn_kept ak = attention_kept(l, &i);
        i++; /* the residual sum x2, the second RMSNorm's input */
        tn *rs2 = &S[i++], *h2 = &S[i++], *y2 = &S[i++], *g = &S[i++], *sg = &S[i++],
           *u = &S[i++], *pr = &S[i++];
        tn dp = talloc(tr, BT * F_ * 4, T_WORK), dsg = talloc(tr, BT * F_ * 4, T_WORK),
           du = talloc(tr, BT * F_ * 4, T_WORK), dyn = talloc(tr, BT * D * 4, T_WORK),
           dx2 = talloc(tr, BT * D * 4, T_WORK), t1, t2;
        if (tr->oom)
            break;
        linear_bwd(be, pr, wt(l, tr, LL_WD), dy, F(dp), 0.0f, F(l->g[LL_WD]), NULL, BT, F_, D);
        float *uf = f32(tr, u, &t1), *sgf = f32(tr, sg, &t2);
        if (tr->oom)
            break;
        be->mul(be, F(dp), uf, F(dsg), BT * F_);
        be->mul(be, F(dp), sgf, F(du), BT * F_);
        tfree(tr, &t1);
        tfree(tr, &t2);
        float *gf = f32(tr, g, &t1);
        if (tr->oom)
            break;
        be->silu_bwd(be, gf, F(dsg), F(dsg), BT * F_);
        tfree(tr, &t1);
        linear_bwd(be, y2, wt(l, tr, LL_WG), &dsg, F(dyn), 0.0f, F(l->g[LL_WG]), NULL, BT, D, F_);
        /* the up projection's input gradient adds to the gate's */
        linear_bwd(be, y2, wt(l, tr, LL_WU), &du, F(dyn), 1.0f, F(l->g[LL_WU]), NULL, BT, D, F_);
        tfree(tr, &dp);
        tfree(tr, &dsg);
        tfree(tr, &du);
        be->rmsnorm_bwd(be, F(*h2), F(*rs2), F(l->w[LL_N2]), F(dyn), F(dx2), F(l->g[LL_N2]), BT,
                        D);
        be->add(be, F(dx2), F(*dy), F(dx2), BT * D); /* residual */
        tn dO = talloc(tr, BT * D * 4, T_WORK), dP = talloc(tr, B * H * T * T * 4, T_WORK);
        tn dq = talloc(tr, BT * D * 4, T_WORK), dk = talloc(tr, BT * D * 4, T_WORK),
           dv = talloc(tr, BT * D * 4, T_WORK), gkv = talloc(tr, BT * dkv * 4, T_WORK),
           dr = talloc(tr, BT * dkv * 4, T_WORK);
        if (tr->oom)
            break;
        attention_bwd(l, tr, &ak, qh, kh, vh, &dx2, LL_WO, NULL, F(dyn), &dO, &dP, F(dq), F(dk),
                      F(dv));
        tfree(tr, &dO);
        tfree(tr, &dP);
        /* q: heads back to rows; k, v: sum the repeated heads, then rows */
        be->permute(be, F(dq), F(dyn), B, T, H, dh, D, 0, false);
        linear_bwd(be, y1, wt(l, tr, LL_WQ), &dyn, F(dq), 0.0f, F(l->g[LL_WQ]), NULL, BT, D, D);
        be->repeat_heads(be, F(dk), F(gkv), B, KV, rep, T, dh, true);
        be->permute(be, F(gkv), F(dr), B, T, KV, dh, dkv, 0, false);
        linear_bwd(be, y1, wt(l, tr, LL_WK), &dr, F(dq), 1.0f, F(l->g[LL_WK]), NULL, BT, D, dkv);
        be->repeat_heads(be, F(dv), F(gkv), B, KV, rep, T, dh, true);
        be->permute(be, F(gkv), F(dr), B, T, KV, dh, dkv, 0, false);
        linear_bwd(be, y1, wt(l, tr, LL_WV), &dr, F(dq), 1.0f, F(l->g[LL_WV]), NULL, BT, D, dkv);
        tfree(tr, &dk);
        tfree(tr, &dv);
        tfree(tr, &gkv);
        tfree(tr, &dr);
        dx = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        be->rmsnorm_bwd(be, F(*h1), F(*rs1), F(l->w[LL_N1]), F(dq), F(dx), F(l->g[LL_N1]), BT, D);
        be->add(be, F(dx), F(dx2), F(dx), BT * D);
        tfree(tr, &dq);
        tfree(tr, &dyn);
        tfree(tr, &dx2);
        break;
    }
    case K_LMHEAD: {
        size_t V = d->V;
        float p = d->dropout;
        int i = 0;
        tn *ids = &l->saved[i++];
        i++; /* position ids */
        tn *tgt = &l->saved[i++];
        tn *m = p > 0 ? &l->saved[i++] : NULL;
        tn *xf = &l->saved[i++], *mf = &l->saved[i++], *rf = &l->saved[i++], *lnf = &l->saved[i++],
           *logp = &l->saved[i++];
        tn dl = talloc(tr, BT * V * 4, T_WORK), dln = talloc(tr, BT * D * 4, T_WORK),
           dxf = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        be->xent_bwd(be, F(*logp), I64(*tgt), F(dl), BT, V);
        linear_bwd(be, lnf, wt(l, tr, LM_WH), &dl, F(dln), 0.0f, F(l->g[LM_WH]), NULL, BT, D, V);
        tfree(tr, &dl);
        be->layernorm_bwd(be, F(*xf), F(l->w[LM_GF]), F(*mf), F(*rf), F(dln), F(dxf),
                          F(l->g[LM_GF]), F(l->g[LM_BF]), BT, D);
        if (p > 0)
            be->dropout_bwd(be, U8(*m), F(dxf), F(dxf), BT * D, p);
        be->embedding_bwd(be, I64(*ids), F(dxf), F(l->g[LM_WTE]), BT, D);
        /* positions: row i uses position i % T */
        for (size_t b = 0; b < B; b++)
            be->add(be, F(l->g[LM_WPE]), F(dxf) + b * T * D, F(l->g[LM_WPE]), T * D);
        tfree(tr, &dln);
        tfree(tr, &dxf);
        break;
    }
    default:
        break;
    }
    free_saved(l, tr);
    return dx;
}

void layer_forget(layer *l, tracker *tr)
{
    free_saved(l, tr);
}

void layer_step(layer *l, tracker *tr)
{
    l->step++;
    for (int i = 0; i < l->nparams; i++) {
        if (l->g[i].p)
            tr->be->adam(tr->be, F(l->w[i]), F(l->g[i]), F(l->m[i]), F(l->v[i]), l->wn[i], 1e-3f,
                         0.9f, 0.999f, 1e-8f, l->step);
        tfree(tr, &l->g[i]);
    }
}

void layer_destroy(layer *l, tracker *tr)
{
    free_saved(l, tr);
    for (int i = 0; i < l->nparams; i++) {
        tfree(tr, &l->w[i]);
        tfree(tr, &l->g[i]);
        tfree(tr, &l->m[i]);
        tfree(tr, &l->v[i]);
    }
    l->nparams = 0;
}
