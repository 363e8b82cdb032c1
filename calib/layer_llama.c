/* The Llama-style block: RMSNorm, q/k/v with grouped kv heads (GQA),
 * causal attention, o_proj, residual; RMSNorm, SwiGLU, residual. No
 * biases, no dropout. */
#include <math.h>

#include "layer_internal.h"

enum { LL_N1, LL_WQ, LL_WK, LL_WV, LL_WO, LL_N2, LL_WG, LL_WU, LL_WD };

static int llama_init(layer *l, tracker *tr)
{
    size_t D = l->d.D, F = l->d.F, dkv = layer__kv_heads(&l->d) * (D / l->d.H);
    float s = 1.0f / sqrtf((float)D);
    int rc = 0;
    rc |= layer__add_param(l, tr, D, 0, true);
    rc |= layer__add_param(l, tr, D * D, s, false);
    rc |= layer__add_param(l, tr, D * dkv, s, false);
    rc |= layer__add_param(l, tr, D * dkv, s, false);
    rc |= layer__add_param(l, tr, D * D, s, false);
    rc |= layer__add_param(l, tr, D, 0, true);
    rc |= layer__add_param(l, tr, D * F, s, false);
    rc |= layer__add_param(l, tr, D * F, s, false);
    rc |= layer__add_param(l, tr, F * D, 1.0f / sqrtf((float)F), false);
    return rc;
}

/* The first RMSNorm, q/k/v into head-major tensors (k and v repeated to H
 * heads), attention and o_proj. Returns o_proj's output (T_WORK),
 * TENSOR_NONE when out of memory. */
static tensor llama_attention_fwd(layer *l, tracker *tr, tensor *x)
{
    ml_backend *be = tr->be;
    struct llama_kept *kp = &l->kept.llama;
    size_t B = l->d.B, T = l->d.T, D = l->d.D, H = l->d.H, BT = B * T, dh = D / H;
    size_t KV = layer__kv_heads(&l->d), rep = H / KV, dkv = KV * dh;
    kp->x = layer__keep(l, *x);
    tensor s1, stage[3];
    tensor *y1 = layer__norm_keep(l, tr, BT * 4, BT * D * 4, &kp->rs1, &kp->h1, &s1);
    if (!y1)
        return TENSOR_NONE;
    be->rmsnorm_fwd(be, AS_F32(*x), AS_F32(l->w[LL_N1]), AS_F32(*kp->rs1), AS_F32(*kp->h1),
                    AS_F32(*y1), BT, D);
    if (l->d.amp) { /* q_proj's cast is kept as y1; k_proj's and v_proj's are two more */
        layer__extra_copy(l, tr, AS_F32(*y1), BT * D);
        layer__extra_copy(l, tr, AS_F32(*y1), BT * D);
    }
    y1 = kp->y1 = layer__settle(l, tr, y1, &s1);
    tensor q = tensor_alloc(tr, BT * D * 4, T_WORK), k = tensor_alloc(tr, BT * dkv * 4, T_WORK),
           v = tensor_alloc(tr, BT * dkv * 4, T_WORK), kvh = tensor_alloc(tr, BT * dkv * 4, T_WORK);
    /* one key/value head at micro-batch 1: matmul folds its expand into
     * bmm's batch as a view, so bmm reads (and saves) the one head */
    const bool one = B == 1 && KV == 1 && rep > 1;
    tensor *h[3]; /* head-major q, k, v; k and v repeated to H heads */
    h[0] = layer__slot(l, tr, BT * D, &stage[0]);
    h[1] = layer__slot(l, tr, one ? BT * dkv : BT * D, &stage[1]);
    h[2] = layer__slot(l, tr, one ? BT * dkv : BT * D, &stage[2]);
    const tensor *wq = layer__matmul_weight(l, tr, LL_WQ), *wk = layer__matmul_weight(l, tr, LL_WK),
                 *wv = layer__matmul_weight(l, tr, LL_WV);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, y1, wq, NULL, AS_F32(q), BT, D, D);
    layer__linear_fwd(be, y1, wk, NULL, AS_F32(k), BT, D, dkv);
    layer__linear_fwd(be, y1, wv, NULL, AS_F32(v), BT, D, dkv);
    be->permute(be, AS_F32(q), AS_F32(*h[0]), B, T, H, dh, D, 0, true);
    if (one) {
        be->permute(be, AS_F32(k), AS_F32(*h[1]), B, T, KV, dh, dkv, 0, true);
        be->permute(be, AS_F32(v), AS_F32(*h[2]), B, T, KV, dh, dkv, 0, true);
    } else {
        be->permute(be, AS_F32(k), AS_F32(kvh), B, T, KV, dh, dkv, 0, true);
        be->repeat_heads(be, AS_F32(kvh), AS_F32(*h[1]), B, KV, rep, T, dh, false);
        be->permute(be, AS_F32(v), AS_F32(kvh), B, T, KV, dh, dkv, 0, true);
        be->repeat_heads(be, AS_F32(kvh), AS_F32(*h[2]), B, KV, rep, T, dh, false);
    }
    kp->attn.kv_one = one;
    tensor_free(tr, &q);
    tensor_free(tr, &k);
    tensor_free(tr, &v);
    tensor_free(tr, &kvh);
    layer__settle_each(l, tr, 3, h, stage);
    kp->qh = h[0];
    kp->kh = h[1];
    kp->vh = h[2];
    return layer__attention_fwd(l, tr, &kp->attn, kp->qh, kp->kh, kp->vh, 0, LL_WO, NULL);
}

/* The residual sum x + a, the second RMSNorm, SwiGLU and the residual. */
static tensor llama_mlp_fwd(layer *l, tracker *tr, const tensor *x, tensor *a)
{
    ml_backend *be = tr->be;
    struct llama_kept *kp = &l->kept.llama;
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    tensor *x2 = kp->x2 = layer__keep(l, tensor_alloc(tr, BT * D * 4, T_SAVED));
    tensor s2, stage[4];
    tensor *y2 = layer__norm_keep(l, tr, BT * 4, BT * D * 4, &kp->rs2, &kp->h2, &s2);
    if (!y2)
        return TENSOR_NONE;
    be->add(be, AS_F32(*x), AS_F32(*a), AS_F32(*x2), BT * D);
    tensor_free(tr, a);
    be->rmsnorm_fwd(be, AS_F32(*x2), AS_F32(l->w[LL_N2]), AS_F32(*kp->rs2), AS_F32(*kp->h2),
                    AS_F32(*y2), BT, D);
    if (l->d.amp) /* gate_proj's cast is kept as y2, up_proj's is another */
        layer__extra_copy(l, tr, AS_F32(*y2), BT * D);
    y2 = kp->y2 = layer__settle(l, tr, y2, &s2);
    enum { G, SG, U, PR }; /* SiLU's input and output, up's output, down's input */
    tensor *t[4];
    layer__slots(l, tr, BT * F, 4, t, stage);
    const tensor *wg = layer__matmul_weight(l, tr, LL_WG), *wu = layer__matmul_weight(l, tr, LL_WU),
                 *wd = layer__matmul_weight(l, tr, LL_WD);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, y2, wg, NULL, AS_F32(*t[G]), BT, D, F);
    layer__linear_fwd(be, y2, wu, NULL, AS_F32(*t[U]), BT, D, F);
    be->silu_fwd(be, AS_F32(*t[G]), AS_F32(*t[SG]), BT * F);
    be->mul(be, AS_F32(*t[SG]), AS_F32(*t[U]), AS_F32(*t[PR]), BT * F);
    layer__settle_each(l, tr, 4, t, stage);
    kp->g = t[G];
    kp->sg = t[SG];
    kp->u = t[U];
    kp->pr = t[PR];
    tensor y = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, kp->pr, wd, NULL, AS_F32(y), BT, F, D);
    be->add(be, AS_F32(*x2), AS_F32(y), AS_F32(y), BT * D);
    return y;
}

static tensor llama_forward(layer *l, tracker *tr, tensor *x)
{
    static const block_halves halves = {llama_attention_fwd, llama_mlp_fwd};
    return layer__block_forward(l, tr, x, &halves);
}

/* The backward's gradients that both halves use: SwiGLU's (B*T, F) dp,
 * dsg, du; dyn a normalised input's (B*T, D) gradient; dx2 the residual
 * sum's. */
struct llama_grads {
    tensor dp, dsg, du, dyn, dx2;
};

/* From dy back through SwiGLU and the second RMSNorm to dx2; returns
 * nonzero when out of memory. */
static int llama_mlp_bwd(layer *l, tracker *tr, const tensor *dy, struct llama_grads *w)
{
    ml_backend *be = tr->be;
    const struct llama_kept *kp = &l->kept.llama;
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    tensor t1, t2;
    layer__linear_bwd(be, kp->pr, layer__matmul_weight(l, tr, LL_WD), dy, AS_F32(w->dp), 0.0f,
                      AS_F32(l->g[LL_WD]), NULL, BT, F, D);
    float *uf = layer__fp32_values(tr, kp->u, &t1), *sgf = layer__fp32_values(tr, kp->sg, &t2);
    if (tr->oom)
        return -1;
    be->mul(be, AS_F32(w->dp), uf, AS_F32(w->dsg), BT * F);
    be->mul(be, AS_F32(w->dp), sgf, AS_F32(w->du), BT * F);
    tensor_free(tr, &t1);
    tensor_free(tr, &t2);
    float *gf = layer__fp32_values(tr, kp->g, &t1);
    if (tr->oom)
        return -1;
    be->silu_bwd(be, gf, AS_F32(w->dsg), AS_F32(w->dsg), BT * F);
    tensor_free(tr, &t1);
    layer__linear_bwd(be, kp->y2, layer__matmul_weight(l, tr, LL_WG), &w->dsg, AS_F32(w->dyn),
                      0.0f, AS_F32(l->g[LL_WG]), NULL, BT, D, F);
    /* the up projection's input gradient adds to the gate's */
    layer__linear_bwd(be, kp->y2, layer__matmul_weight(l, tr, LL_WU), &w->du, AS_F32(w->dyn),
                      1.0f, AS_F32(l->g[LL_WU]), NULL, BT, D, F);
    tensor_free(tr, &w->dp);
    tensor_free(tr, &w->dsg);
    tensor_free(tr, &w->du);
    be->rmsnorm_bwd(be, AS_F32(*kp->h2), AS_F32(*kp->rs2), AS_F32(l->w[LL_N2]), AS_F32(w->dyn),
                    AS_F32(w->dx2), AS_F32(l->g[LL_N2]), BT, D);
    be->add(be, AS_F32(w->dx2), AS_F32(*dy), AS_F32(w->dx2), BT * D); /* residual */
    return 0;
}

/* From dx2 back through attention, q/k/v and the first RMSNorm to dx. */
static tensor llama_attention_bwd(layer *l, tracker *tr, struct llama_grads *w)
{
    ml_backend *be = tr->be;
    const struct llama_kept *kp = &l->kept.llama;
    size_t B = l->d.B, T = l->d.T, D = l->d.D, H = l->d.H, BT = B * T, dh = D / H;
    size_t KV = layer__kv_heads(&l->d), rep = H / KV, dkv = KV * dh;
    tensor dO = tensor_alloc(tr, BT * D * 4, T_WORK),
           dP = tensor_alloc(tr, B * H * T * T * 4, T_WORK);
    tensor dq = tensor_alloc(tr, BT * D * 4, T_WORK), dk = tensor_alloc(tr, BT * D * 4, T_WORK),
           dv = tensor_alloc(tr, BT * D * 4, T_WORK), gkv = tensor_alloc(tr, BT * dkv * 4, T_WORK),
           dr = tensor_alloc(tr, BT * dkv * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    attn_grads g = {AS_F32(w->dyn), &dO, &dP, AS_F32(dq), AS_F32(dk), AS_F32(dv)};
    layer__attention_bwd(l, tr, &kp->attn, kp->qh, kp->kh, kp->vh, &w->dx2, LL_WO, NULL, &g);
    tensor_free(tr, &dO);
    tensor_free(tr, &dP);
    /* q: heads back to rows; k, v: sum the repeated heads, then rows */
    be->permute(be, AS_F32(dq), AS_F32(w->dyn), B, T, H, dh, D, 0, false);
    layer__linear_bwd(be, kp->y1, layer__matmul_weight(l, tr, LL_WQ), &w->dyn, AS_F32(dq), 0.0f,
                      AS_F32(l->g[LL_WQ]), NULL, BT, D, D);
    be->repeat_heads(be, AS_F32(dk), AS_F32(gkv), B, KV, rep, T, dh, true);
    be->permute(be, AS_F32(gkv), AS_F32(dr), B, T, KV, dh, dkv, 0, false);
    layer__linear_bwd(be, kp->y1, layer__matmul_weight(l, tr, LL_WK), &dr, AS_F32(dq), 1.0f,
                      AS_F32(l->g[LL_WK]), NULL, BT, D, dkv);
    be->repeat_heads(be, AS_F32(dv), AS_F32(gkv), B, KV, rep, T, dh, true);
    be->permute(be, AS_F32(gkv), AS_F32(dr), B, T, KV, dh, dkv, 0, false);
    layer__linear_bwd(be, kp->y1, layer__matmul_weight(l, tr, LL_WV), &dr, AS_F32(dq), 1.0f,
                      AS_F32(l->g[LL_WV]), NULL, BT, D, dkv);
    tensor_free(tr, &dk);
    tensor_free(tr, &dv);
    tensor_free(tr, &gkv);
    tensor_free(tr, &dr);
    tensor dx = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return dx;
    be->rmsnorm_bwd(be, AS_F32(*kp->h1), AS_F32(*kp->rs1), AS_F32(l->w[LL_N1]), AS_F32(dq),
                    AS_F32(dx), AS_F32(l->g[LL_N1]), BT, D);
    be->add(be, AS_F32(dx), AS_F32(w->dx2), AS_F32(dx), BT * D);
    tensor_free(tr, &dq);
    tensor_free(tr, &w->dyn);
    tensor_free(tr, &w->dx2);
    return dx;
}

static tensor llama_backward(layer *l, tracker *tr, tensor *dy)
{
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    struct llama_grads w;
    w.dp = tensor_alloc(tr, BT * F * 4, T_WORK);
    w.dsg = tensor_alloc(tr, BT * F * 4, T_WORK);
    w.du = tensor_alloc(tr, BT * F * 4, T_WORK);
    w.dyn = tensor_alloc(tr, BT * D * 4, T_WORK);
    w.dx2 = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom || llama_mlp_bwd(l, tr, dy, &w) != 0)
        return TENSOR_NONE;
    return llama_attention_bwd(l, tr, &w);
}

static double llama_flops(const layer *l)
{
    double BT = (double)(l->d.B * l->d.T), D = (double)l->d.D, F = (double)l->d.F;
    double dkv = (double)(layer__kv_heads(&l->d) * (l->d.D / l->d.H));
    return 2 * BT * D * (D + 2 * dkv) + 4 * (double)l->d.B * (double)l->d.T * (double)l->d.T * D +
           2 * BT * D * D + 6 * BT * D * F;
}

const layer_ops layer__llama_ops = {llama_init, llama_forward, llama_backward,
                                    llama_flops};
