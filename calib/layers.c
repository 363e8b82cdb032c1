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
    tn t = {NULL, bytes, cat};
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

/* y = x W + b over rows */
static void linear_fwd(ml_backend *be, const float *x, const float *W, const float *b, float *y,
                       size_t rows, size_t in, size_t out)
{
    be->gemm(be, false, false, (int)rows, (int)out, (int)in, 1.0f, x, W, 0.0f, y);
    if (b)
        be->bias_add(be, y, b, rows, out);
}

/* dx = dy W^T (if dx), dW += x^T dy, db += sum dy */
static void linear_bwd(ml_backend *be, const float *x, const float *W, const float *dy, float *dx,
                       float *dW, float *db, size_t rows, size_t in, size_t out)
{
    if (dx)
        be->gemm(be, false, true, (int)rows, (int)in, (int)out, 1.0f, dy, W, 0.0f, dx);
    be->gemm(be, true, false, (int)in, (int)out, (int)rows, 1.0f, x, dy, 1.0f, dW);
    if (db)
        be->bias_grad(be, dy, db, rows, out);
}

static void grads_alloc(layer *l, tracker *tr)
{
    for (int i = 0; i < l->nparams; i++) {
        l->g[i] = talloc(tr, l->wn[i] * 4, T_GRAD);
        if (l->g[i].p)
            tr->be->zero(tr->be, l->g[i].p, l->wn[i] * 4);
    }
}

tn layer_forward(layer *l, tracker *tr, tn *x)
{
    ml_backend *be = tr->be;
    const dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, F_ = d->F, BT = B * T, dh = H ? D / H : 0;
    tn none = {NULL, 0, T_WORK};
    l->nsaved = 0;
    switch (l->kind) {
    case K_LINEAR: {
        keep(l, *x); /* addmm saves its input */
        tn y = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        linear_fwd(be, F(*x), F(l->w[LIN_W]), F(l->w[LIN_B]), F(y), BT, D, D);
        return y;
    }
    case K_MLP: {
        keep(l, *x);
        tn *h = keep(l, talloc(tr, BT * F_ * 4, T_SAVED)); /* gelu saves its input */
        tn *a = keep(l, talloc(tr, BT * F_ * 4, T_SAVED)); /* the 2nd linear its input */
        tn y = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        linear_fwd(be, F(*x), F(l->w[MLP_W1]), F(l->w[MLP_B1]), F(*h), BT, D, F_);
        be->gelu_fwd(be, F(*h), F(*a), BT * F_);
        linear_fwd(be, F(*a), F(l->w[MLP_W2]), F(l->w[MLP_B2]), F(y), BT, F_, D);
        return y;
    }
    case K_BLOCK: {
        float p = d->dropout, scale = 1.0f / sqrtf((float)dh);
        keep(l, *x);                                               /* 0 ln_1 input */
        tn *mean1 = keep(l, talloc(tr, BT * 4, T_SAVED));          /* 1 */
        tn *rstd1 = keep(l, talloc(tr, BT * 4, T_SAVED));          /* 2 */
        tn *ln1 = keep(l, talloc(tr, BT * D * 4, T_SAVED));        /* 3 qkv input */
        if (tr->oom)
            return none;
        be->layernorm_fwd(be, F(*x), F(l->w[BL_G1]), F(l->w[BL_B1]), F(*ln1), F(*mean1),
                          F(*rstd1), BT, D);
        tn qkv = talloc(tr, BT * 3 * D * 4, T_WORK);
        tn *q = keep(l, talloc(tr, BT * D * 4, T_SAVED));          /* 4 */
        tn *k = keep(l, talloc(tr, BT * D * 4, T_SAVED));          /* 5 */
        tn *v = keep(l, talloc(tr, BT * D * 4, T_SAVED));          /* 6 */
        if (tr->oom)
            return none;
        linear_fwd(be, F(*ln1), F(l->w[BL_WQKV]), F(l->w[BL_BQKV]), F(qkv), BT, D, 3 * D);
        be->permute(be, F(qkv), F(*q), B, T, H, dh, 3 * D, 0, true);
        be->permute(be, F(qkv), F(*k), B, T, H, dh, 3 * D, D, true);
        be->permute(be, F(qkv), F(*v), B, T, H, dh, 3 * D, 2 * D, true);
        tfree(tr, &qkv);
        /* masked_fill keeps a bool T x T mask; the softmax kernel masks by
         * index, but the tensor is kept as PyTorch keeps it */
        keep(l, talloc(tr, T * T, T_SAVED));                       /* 7 */
        tn S = talloc(tr, B * H * T * T * 4, T_WORK);
        tn *P = keep(l, talloc(tr, B * H * T * T * 4, T_SAVED));   /* 8 softmax output */
        if (tr->oom)
            return none;
        be->gemm_batched(be, false, true, (int)T, (int)T, (int)dh, 1.0f, F(*q), (long)(T * dh),
                         F(*k), (long)(T * dh), 0.0f, F(S), (long)(T * T), (int)(B * H));
        be->softmax_fwd(be, F(S), F(*P), B * H, T, scale);
        tfree(tr, &S);
        tn *Pd = P;
        if (p > 0) {
            tn *dm = keep(l, talloc(tr, B * H * T * T, T_SAVED));    /* 9 mask */
            Pd = keep(l, talloc(tr, B * H * T * T * 4, T_SAVED));    /* 10 dropout output */
            if (tr->oom)
                return none;
            be->dropout_fwd(be, F(*P), U8(*dm), F(*Pd), B * H * T * T, p, l->seed + 1);
        }
        tn O = talloc(tr, BT * D * 4, T_WORK);
        tn *om = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* proj input */
        tn a = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        be->gemm_batched(be, false, false, (int)T, (int)dh, (int)T, 1.0f, F(*Pd), (long)(T * T),
                         F(*v), (long)(T * dh), 0.0f, F(O), (long)(T * dh), (int)(B * H));
        be->permute(be, F(O), F(*om), B, T, H, dh, D, 0, false);
        tfree(tr, &O);
        linear_fwd(be, F(*om), F(l->w[BL_WO]), F(l->w[BL_BO]), F(a), BT, D, D);
        if (p > 0) {
            tn *rm = keep(l, talloc(tr, BT * D, T_SAVED));
            if (tr->oom)
                return none;
            be->dropout_fwd(be, F(a), U8(*rm), F(a), BT * D, p, l->seed + 2);
        }
        tn *x2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* ln_2 input */
        tn *mean2 = keep(l, talloc(tr, BT * 4, T_SAVED));
        tn *rstd2 = keep(l, talloc(tr, BT * 4, T_SAVED));
        tn *ln2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));        /* fc input */
        tn *h = keep(l, talloc(tr, BT * F_ * 4, T_SAVED));         /* gelu input */
        tn *g = keep(l, talloc(tr, BT * F_ * 4, T_SAVED));         /* proj input */
        if (tr->oom)
            return none;
        be->add(be, F(*x), F(a), F(*x2), BT * D);
        tfree(tr, &a);
        be->layernorm_fwd(be, F(*x2), F(l->w[BL_G2]), F(l->w[BL_B2]), F(*ln2), F(*mean2),
                          F(*rstd2), BT, D);
        linear_fwd(be, F(*ln2), F(l->w[BL_W1]), F(l->w[BL_BF1]), F(*h), BT, D, F_);
        be->gelu_fwd(be, F(*h), F(*g), BT * F_);
        tn y = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        linear_fwd(be, F(*g), F(l->w[BL_W2]), F(l->w[BL_BF2]), F(y), BT, F_, D);
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
        float scale = 1.0f / sqrtf((float)dh);
        keep(l, *x);                                               /* 0 rmsnorm input */
        tn *rs1 = keep(l, talloc(tr, BT * 4, T_SAVED));            /* 1 rsqrt */
        tn *h1 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 2 normalised */
        tn *y1 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 3 q/k/v input */
        if (tr->oom)
            return none;
        be->rmsnorm_fwd(be, F(*x), F(l->w[LL_N1]), F(*rs1), F(*h1), F(*y1), BT, D);
        tn q = talloc(tr, BT * D * 4, T_WORK), k = talloc(tr, BT * dkv * 4, T_WORK),
           v = talloc(tr, BT * dkv * 4, T_WORK), kvh = talloc(tr, BT * dkv * 4, T_WORK);
        tn *qh = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 4 */
        tn *kh = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 5 repeated */
        tn *vh = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 6 repeated */
        if (tr->oom)
            return none;
        linear_fwd(be, F(*y1), F(l->w[LL_WQ]), NULL, F(q), BT, D, D);
        linear_fwd(be, F(*y1), F(l->w[LL_WK]), NULL, F(k), BT, D, dkv);
        linear_fwd(be, F(*y1), F(l->w[LL_WV]), NULL, F(v), BT, D, dkv);
        be->permute(be, F(q), F(*qh), B, T, H, dh, D, 0, true);
        be->permute(be, F(k), F(kvh), B, T, KV, dh, dkv, 0, true);
        be->repeat_heads(be, F(kvh), F(*kh), B, KV, rep, T, dh, false);
        be->permute(be, F(v), F(kvh), B, T, KV, dh, dkv, 0, true);
        be->repeat_heads(be, F(kvh), F(*vh), B, KV, rep, T, dh, false);
        tfree(tr, &q);
        tfree(tr, &k);
        tfree(tr, &v);
        tfree(tr, &kvh);
        tn S = talloc(tr, B * H * T * T * 4, T_WORK);
        tn *P = keep(l, talloc(tr, B * H * T * T * 4, T_SAVED));   /* 7 softmax (fp32) */
        if (tr->oom)
            return none;
        be->gemm_batched(be, false, true, (int)T, (int)T, (int)dh, 1.0f, F(*qh), (long)(T * dh),
                         F(*kh), (long)(T * dh), 0.0f, F(S), (long)(T * T), (int)(B * H));
        be->softmax_fwd(be, F(S), F(*P), B * H, T, scale);
        tfree(tr, &S);
        tn O = talloc(tr, BT * D * 4, T_WORK);
        tn *om = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 8 o_proj input */
        tn a = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        be->gemm_batched(be, false, false, (int)T, (int)dh, (int)T, 1.0f, F(*P), (long)(T * T),
                         F(*vh), (long)(T * dh), 0.0f, F(O), (long)(T * dh), (int)(B * H));
        be->permute(be, F(O), F(*om), B, T, H, dh, D, 0, false);
        tfree(tr, &O);
        linear_fwd(be, F(*om), F(l->w[LL_WO]), NULL, F(a), BT, D, D);
        tn *x2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 9 */
        tn *rs2 = keep(l, talloc(tr, BT * 4, T_SAVED));            /* 10 */
        tn *h2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 11 */
        tn *y2 = keep(l, talloc(tr, BT * D * 4, T_SAVED));         /* 12 gate/up input */
        tn *g = keep(l, talloc(tr, BT * F_ * 4, T_SAVED));         /* 13 silu input */
        tn *sg = keep(l, talloc(tr, BT * F_ * 4, T_SAVED));        /* 14 silu output */
        tn *u = keep(l, talloc(tr, BT * F_ * 4, T_SAVED));         /* 15 up output */
        tn *pr = keep(l, talloc(tr, BT * F_ * 4, T_SAVED));        /* 16 down input */
        if (tr->oom)
            return none;
        be->add(be, F(*x), F(a), F(*x2), BT * D);
        tfree(tr, &a);
        be->rmsnorm_fwd(be, F(*x2), F(l->w[LL_N2]), F(*rs2), F(*h2), F(*y2), BT, D);
        linear_fwd(be, F(*y2), F(l->w[LL_WG]), NULL, F(*g), BT, D, F_);
        linear_fwd(be, F(*y2), F(l->w[LL_WU]), NULL, F(*u), BT, D, F_);
        be->silu_fwd(be, F(*g), F(*sg), BT * F_);
        be->mul(be, F(*sg), F(*u), F(*pr), BT * F_);
        tn y = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            return none;
        linear_fwd(be, F(*pr), F(l->w[LL_WD]), NULL, F(y), BT, F_, D);
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
        tn *lnf = keep(l, talloc(tr, BT * D * 4, T_SAVED));        /* lm_head input */
        if (tr->oom)
            return none;
        /* xf = xe: the residual stream entering the head (a copy here, the
         * output of the last block in a model) */
        be->zero(be, xf->p, BT * D * 4);
        be->add(be, F(*xf), F(*xe), F(*xf), BT * D);
        tfree(tr, &e);
        be->layernorm_fwd(be, F(*xf), F(l->w[LM_GF]), F(l->w[LM_BF]), F(*lnf), F(*mf), F(*rf),
                          BT, D);
        tn logits = talloc(tr, BT * V * 4, T_WORK);
        tn *logp = keep(l, talloc(tr, BT * V * 4, T_SAVED));       /* log-softmax output */
        keep(l, talloc(tr, 4, T_SAVED));                           /* nll total_weight */
        tn loss = talloc(tr, 4, T_WORK);
        if (tr->oom)
            return none;
        linear_fwd(be, F(*lnf), F(l->w[LM_WH]), NULL, F(logits), BT, D, V);
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
}

tn layer_backward(layer *l, tracker *tr, tn *dy)
{
    ml_backend *be = tr->be;
    const dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, F_ = d->F, BT = B * T, dh = H ? D / H : 0;
    tn none = {NULL, 0, T_WORK};
    grads_alloc(l, tr);
    if (tr->oom)
        return none;
    tn dx = none;
    switch (l->kind) {
    case K_LINEAR: {
        dx = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        linear_bwd(be, F(l->saved[0]), F(l->w[LIN_W]), F(*dy), F(dx), F(l->g[LIN_W]),
                   F(l->g[LIN_B]), BT, D, D);
        break;
    }
    case K_MLP: {
        tn *x = &l->saved[0], *h = &l->saved[1], *a = &l->saved[2];
        tn da = talloc(tr, BT * F_ * 4, T_WORK);
        dx = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        linear_bwd(be, F(*a), F(l->w[MLP_W2]), F(*dy), F(da), F(l->g[MLP_W2]), F(l->g[MLP_B2]),
                   BT, F_, D);
        be->gelu_bwd(be, F(*h), F(da), F(da), BT * F_);
        linear_bwd(be, F(*x), F(l->w[MLP_W1]), F(da), F(dx), F(l->g[MLP_W1]), F(l->g[MLP_B1]),
                   BT, D, F_);
        tfree(tr, &da);
        break;
    }
    case K_BLOCK: {
        float p = d->dropout, scale = 1.0f / sqrtf((float)dh);
        int i = 0;
        tn *x = &l->saved[i++], *mean1 = &l->saved[i++], *rstd1 = &l->saved[i++],
           *ln1 = &l->saved[i++], *q = &l->saved[i++], *k = &l->saved[i++], *v = &l->saved[i++];
        i++; /* causal mask */
        tn *P = &l->saved[i++], *dm = NULL, *Pd = P;
        if (p > 0) {
            dm = &l->saved[i++];
            Pd = &l->saved[i++];
        }
        tn *om = &l->saved[i++], *rm = p > 0 ? &l->saved[i++] : NULL;
        tn *x2 = &l->saved[i++], *mean2 = &l->saved[i++], *rstd2 = &l->saved[i++],
           *ln2 = &l->saved[i++], *h = &l->saved[i++], *g = &l->saved[i++];
        tn *rm2 = p > 0 ? &l->saved[i++] : NULL;
        /* MLP */
        tn dy2 = talloc(tr, BT * D * 4, T_WORK), dg = talloc(tr, BT * F_ * 4, T_WORK);
        tn dln = talloc(tr, BT * D * 4, T_WORK), dx2 = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        if (p > 0)
            be->dropout_bwd(be, U8(*rm2), F(*dy), F(dy2), BT * D, p);
        else {
            be->zero(be, dy2.p, BT * D * 4);
            be->add(be, F(dy2), F(*dy), F(dy2), BT * D);
        }
        linear_bwd(be, F(*g), F(l->w[BL_W2]), F(dy2), F(dg), F(l->g[BL_W2]), F(l->g[BL_BF2]), BT,
                   F_, D);
        be->gelu_bwd(be, F(*h), F(dg), F(dg), BT * F_);
        linear_bwd(be, F(*ln2), F(l->w[BL_W1]), F(dg), F(dln), F(l->g[BL_W1]), F(l->g[BL_BF1]),
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
        linear_bwd(be, F(*om), F(l->w[BL_WO]), F(da), F(dln), F(l->g[BL_WO]), F(l->g[BL_BO]), BT,
                   D, D);
        be->permute(be, F(dln), F(dO), B, T, H, dh, D, 0, true);
        long tt = (long)(T * T), td = (long)(T * dh);
        int bh = (int)(B * H);
        /* O = Pd v: dPd = dO v^T, dv = Pd^T dO */
        be->gemm_batched(be, false, true, (int)T, (int)T, (int)dh, 1.0f, F(dO), td, F(*v), td,
                         0.0f, F(dP), tt, bh);
        be->gemm_batched(be, true, false, (int)T, (int)dh, (int)T, 1.0f, F(*Pd), tt, F(dO), td,
                         0.0f, F(dv), td, bh);
        if (p > 0)
            be->dropout_bwd(be, U8(*dm), F(dP), F(dP), B * H * T * T, p);
        be->softmax_bwd(be, F(*P), F(dP), F(dP), B * H, T, scale);
        /* S = q k^T: dq = dS k, dk = dS^T q */
        be->gemm_batched(be, false, false, (int)T, (int)dh, (int)T, 1.0f, F(dP), tt, F(*k), td,
                         0.0f, F(dq), td, bh);
        be->gemm_batched(be, true, false, (int)T, (int)dh, (int)T, 1.0f, F(dP), tt, F(*q), td,
                         0.0f, F(dk), td, bh);
        be->permute(be, F(dq), F(dqkv), B, T, H, dh, 3 * D, 0, false);
        be->permute(be, F(dk), F(dqkv), B, T, H, dh, 3 * D, D, false);
        be->permute(be, F(dv), F(dqkv), B, T, H, dh, 3 * D, 2 * D, false);
        tfree(tr, &dO);
        tfree(tr, &dP);
        tfree(tr, &dq);
        tfree(tr, &dk);
        tfree(tr, &dv);
        linear_bwd(be, F(*ln1), F(l->w[BL_WQKV]), F(dqkv), F(dln), F(l->g[BL_WQKV]),
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
        float scale = 1.0f / sqrtf((float)dh);
        tn *S = l->saved;
        tn *x = &S[0], *rs1 = &S[1], *h1 = &S[2], *y1 = &S[3], *qh = &S[4], *kh = &S[5],
           *vh = &S[6], *P = &S[7], *om = &S[8], *rs2 = &S[10], *h2 = &S[11], *y2 = &S[12],
           *g = &S[13], *sg = &S[14], *u = &S[15], *pr = &S[16];
        tn dp = talloc(tr, BT * F_ * 4, T_WORK), dsg = talloc(tr, BT * F_ * 4, T_WORK),
           du = talloc(tr, BT * F_ * 4, T_WORK), dyn = talloc(tr, BT * D * 4, T_WORK),
           dx2 = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        linear_bwd(be, F(*pr), F(l->w[LL_WD]), F(*dy), F(dp), F(l->g[LL_WD]), NULL, BT, F_, D);
        be->mul(be, F(dp), F(*u), F(dsg), BT * F_);
        be->mul(be, F(dp), F(*sg), F(du), BT * F_);
        be->silu_bwd(be, F(*g), F(dsg), F(dsg), BT * F_);
        linear_bwd(be, F(*y2), F(l->w[LL_WG]), F(dsg), F(dyn), F(l->g[LL_WG]), NULL, BT, D, F_);
        /* the up projection's input gradient adds to the gate's */
        be->gemm(be, false, true, (int)BT, (int)D, (int)F_, 1.0f, F(du), F(l->w[LL_WU]), 1.0f,
                 F(dyn));
        be->gemm(be, true, false, (int)D, (int)F_, (int)BT, 1.0f, F(*y2), F(du), 1.0f,
                 F(l->g[LL_WU]));
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
        linear_bwd(be, F(*om), F(l->w[LL_WO]), F(dx2), F(dyn), F(l->g[LL_WO]), NULL, BT, D, D);
        be->permute(be, F(dyn), F(dO), B, T, H, dh, D, 0, true);
        long tt = (long)(T * T), td = (long)(T * dh);
        int bh = (int)(B * H);
        be->gemm_batched(be, false, true, (int)T, (int)T, (int)dh, 1.0f, F(dO), td, F(*vh), td,
                         0.0f, F(dP), tt, bh);
        be->gemm_batched(be, true, false, (int)T, (int)dh, (int)T, 1.0f, F(*P), tt, F(dO), td,
                         0.0f, F(dv), td, bh);
        be->softmax_bwd(be, F(*P), F(dP), F(dP), B * H, T, scale);
        be->gemm_batched(be, false, false, (int)T, (int)dh, (int)T, 1.0f, F(dP), tt, F(*kh), td,
                         0.0f, F(dq), td, bh);
        be->gemm_batched(be, true, false, (int)T, (int)dh, (int)T, 1.0f, F(dP), tt, F(*qh), td,
                         0.0f, F(dk), td, bh);
        tfree(tr, &dO);
        tfree(tr, &dP);
        /* q: heads back to rows; k, v: sum the repeated heads, then rows */
        be->permute(be, F(dq), F(dyn), B, T, H, dh, D, 0, false);
        linear_bwd(be, F(*y1), F(l->w[LL_WQ]), F(dyn), F(dq), F(l->g[LL_WQ]), NULL, BT, D, D);
        be->repeat_heads(be, F(dk), F(gkv), B, KV, rep, T, dh, true);
        be->permute(be, F(gkv), F(dr), B, T, KV, dh, dkv, 0, false);
        be->gemm(be, false, true, (int)BT, (int)D, (int)dkv, 1.0f, F(dr), F(l->w[LL_WK]), 1.0f,
                 F(dq));
        be->gemm(be, true, false, (int)D, (int)dkv, (int)BT, 1.0f, F(*y1), F(dr), 1.0f,
                 F(l->g[LL_WK]));
        be->repeat_heads(be, F(dv), F(gkv), B, KV, rep, T, dh, true);
        be->permute(be, F(gkv), F(dr), B, T, KV, dh, dkv, 0, false);
        be->gemm(be, false, true, (int)BT, (int)D, (int)dkv, 1.0f, F(dr), F(l->w[LL_WV]), 1.0f,
                 F(dq));
        be->gemm(be, true, false, (int)D, (int)dkv, (int)BT, 1.0f, F(*y1), F(dr), 1.0f,
                 F(l->g[LL_WV]));
        tfree(tr, &dk);
        tfree(tr, &dv);
        tfree(tr, &gkv);
        tfree(tr, &dr);
        dx = talloc(tr, BT * D * 4, T_WORK);
        if (tr->oom)
            break;
        be->rmsnorm_bwd(be, F(*h1), F(*rs1), F(l->w[LL_N1]), F(dq), F(dx), F(l->g[LL_N1]), BT, D);
        be->add(be, F(dx), F(dx2), F(dx), BT * D);
        (void)x;
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
        linear_bwd(be, F(*lnf), F(l->w[LM_WH]), F(dl), F(dln), F(l->g[LM_WH]), NULL, BT, D, V);
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
