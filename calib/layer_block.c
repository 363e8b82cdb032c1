/* The GPT-2 style transformer block: LayerNorm, qkv, causal attention,
 * projection, residual dropout; LayerNorm, MLP (GELU), residual dropout. */
#include <math.h>

#include "layer_internal.h"

enum { BL_G1, BL_B1, BL_WQKV, BL_BQKV, BL_WO, BL_BO, BL_G2, BL_B2, BL_W1, BL_BF1, BL_W2, BL_BF2 };

/* In the order of the BL_ indices */
static int block_init(layer *l, tracker *tr)
{
    size_t D = l->d.D;
    float s = 1.0f / sqrtf((float)D);
    int rc = layer__add_norm_params(l, tr);
    rc |= layer__add_param(l, tr, D * 3 * D, s, false);
    rc |= layer__add_param(l, tr, 3 * D, s, false);
    rc |= layer__add_param(l, tr, D * D, s, false);
    rc |= layer__add_param(l, tr, D, s, false);
    rc |= layer__add_norm_params(l, tr);
    return rc | layer__add_mlp_params(l, tr);
}

/* ln_1, the qkv projection into head-major q, k, v, attention and its
 * projection, the residual dropout. Returns the attention branch's output
 * (T_WORK), TENSOR_NONE when out of memory. */
static tensor block_attention_fwd(layer *l, tracker *tr, tensor *x)
{
    ml_backend *be = tr->be;
    struct block_kept *kp = &l->kept.block;
    size_t B = l->d.B, T = l->d.T, D = l->d.D, H = l->d.H, BT = B * T, dh = D / H;
    float p = l->d.dropout;
    kp->x = layer__keep(l, *x);
    tensor st, stage[3];
    tensor *ln1 = layer__norm_keep(l, tr, BT * 4, BT * 4, &kp->mean1, &kp->rstd1, &st);
    if (!ln1)
        return TENSOR_NONE;
    be->layernorm_fwd(be, AS_F32(*x), AS_F32(l->w[BL_G1]), AS_F32(l->w[BL_B1]), AS_F32(*ln1),
                      AS_F32(*kp->mean1), AS_F32(*kp->rstd1), BT, D);
    ln1 = kp->ln1 = layer__settle(l, tr, ln1, &st);
    tensor qkv = tensor_alloc(tr, BT * 3 * D * 4, T_WORK);
    tensor *h[3]; /* head-major q, k, v */
    layer__slots(l, tr, BT * D, 3, h, stage);
    const tensor *wqkv = layer__matmul_weight(l, tr, BL_WQKV);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, ln1, wqkv, &l->w[BL_BQKV], AS_F32(qkv), BT, D, 3 * D);
    for (int i = 0; i < 3; i++)
        be->permute(be, AS_F32(qkv), AS_F32(*h[i]), B, T, H, dh, 3 * D, (size_t)i * D, true);
    tensor_free(tr, &qkv);
    layer__settle_each(l, tr, 3, h, stage);
    kp->q = h[0];
    kp->k = h[1];
    kp->v = h[2];
    /* masked_fill keeps a bool T x T mask; the softmax kernel masks by
     * index, but the tensor is kept as PyTorch keeps it */
    kp->causal_mask = layer__keep(l, tensor_alloc(tr, T * T, T_SAVED));
    tensor a = layer__attention_fwd(l, tr, &kp->attn, kp->q, kp->k, kp->v, p, BL_WO,
                                    &l->w[BL_BO]);
    if (tr->oom)
        return TENSOR_NONE;
    if (p > 0) {
        tensor *rm = kp->resid_mask = layer__keep(l, tensor_alloc(tr, BT * D, T_SAVED));
        if (tr->oom)
            return TENSOR_NONE;
        be->dropout_fwd(be, AS_F32(a), AS_U8(*rm), AS_F32(a), BT * D, p, l->seed + 2);
    }
    return a;
}

/* The residual sum x + a, ln_2, the MLP, its dropout and the residual. */
static tensor block_mlp_fwd(layer *l, tracker *tr, const tensor *x, tensor *a)
{
    ml_backend *be = tr->be;
    struct block_kept *kp = &l->kept.block;
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    float p = l->d.dropout;
    tensor *x2 = kp->x2 = layer__keep(l, tensor_alloc(tr, BT * D * 4, T_SAVED));
    tensor s2, shh, sg;
    tensor *ln2 = layer__norm_keep(l, tr, BT * 4, BT * 4, &kp->mean2, &kp->rstd2, &s2);
    if (!ln2)
        return TENSOR_NONE;
    be->add(be, AS_F32(*x), AS_F32(*a), AS_F32(*x2), BT * D);
    tensor_free(tr, a);
    be->layernorm_fwd(be, AS_F32(*x2), AS_F32(l->w[BL_G2]), AS_F32(l->w[BL_B2]), AS_F32(*ln2),
                      AS_F32(*kp->mean2), AS_F32(*kp->rstd2), BT, D);
    ln2 = kp->ln2 = layer__settle(l, tr, ln2, &s2);
    tensor *h = layer__slot(l, tr, BT * F, &shh);
    tensor *g = layer__slot(l, tr, BT * F, &sg);
    const tensor *w1 = layer__matmul_weight(l, tr, BL_W1), *w2 = layer__matmul_weight(l, tr, BL_W2);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, ln2, w1, &l->w[BL_BF1], AS_F32(*h), BT, D, F);
    be->gelu_fwd(be, AS_F32(*h), AS_F32(*g), BT * F);
    kp->h = layer__settle(l, tr, h, &shh);
    g = kp->g = layer__settle(l, tr, g, &sg);
    tensor y = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, g, w2, &l->w[BL_BF2], AS_F32(y), BT, F, D);
    if (p > 0) {
        tensor *rm2 = kp->mlp_mask = layer__keep(l, tensor_alloc(tr, BT * D, T_SAVED));
        if (tr->oom)
            return TENSOR_NONE;
        be->dropout_fwd(be, AS_F32(y), AS_U8(*rm2), AS_F32(y), BT * D, p, l->seed + 3);
    }
    be->add(be, AS_F32(*x2), AS_F32(y), AS_F32(y), BT * D); /* residual */
    return y;
}

static tensor block_forward(layer *l, tracker *tr, tensor *x)
{
    static const block_halves halves = {block_attention_fwd, block_mlp_fwd};
    return layer__block_forward(l, tr, x, &halves);
}

/* The backward's (B*T, D) gradients that both halves use: dy2 the
 * residual dropouts' output gradient, dln a LayerNorm output's, dx2 the
 * residual sum's. */
struct block_grads {
    tensor dy2, dln, dx2;
};

/* From dy back through the MLP half to dx2; returns nonzero when out of
 * memory. */
static int block_mlp_bwd(layer *l, tracker *tr, const tensor *dy, struct block_grads *w,
                         tensor *dg)
{
    ml_backend *be = tr->be;
    const struct block_kept *kp = &l->kept.block;
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    float p = l->d.dropout;
    tensor th;
    if (p > 0)
        be->dropout_bwd(be, AS_U8(*kp->mlp_mask), AS_F32(*dy), AS_F32(w->dy2), BT * D, p);
    else {
        be->zero(be, w->dy2.p, BT * D * 4);
        be->add(be, AS_F32(w->dy2), AS_F32(*dy), AS_F32(w->dy2), BT * D);
    }
    layer__linear_bwd(be, kp->g, layer__matmul_weight(l, tr, BL_W2), &w->dy2, AS_F32(*dg), 0.0f,
                      AS_F32(l->g[BL_W2]), AS_F32(l->g[BL_BF2]), BT, F, D);
    float *hf = layer__fp32_values(tr, kp->h, &th);
    if (tr->oom)
        return -1;
    be->gelu_bwd(be, hf, AS_F32(*dg), AS_F32(*dg), BT * F);
    tensor_free(tr, &th);
    layer__linear_bwd(be, kp->ln2, layer__matmul_weight(l, tr, BL_W1), dg, AS_F32(w->dln), 0.0f,
                      AS_F32(l->g[BL_W1]), AS_F32(l->g[BL_BF1]), BT, D, F);
    tensor_free(tr, dg);
    be->layernorm_bwd(be, AS_F32(*kp->x2), AS_F32(l->w[BL_G2]), AS_F32(*kp->mean2),
                      AS_F32(*kp->rstd2), AS_F32(w->dln), AS_F32(w->dx2), AS_F32(l->g[BL_G2]),
                      AS_F32(l->g[BL_B2]), BT, D);
    be->add(be, AS_F32(w->dx2), AS_F32(*dy), AS_F32(w->dx2), BT * D); /* residual */
    return 0;
}

/* From dx2 back through the attention half to the block's dx. */
static tensor block_attention_bwd(layer *l, tracker *tr, struct block_grads *w)
{
    ml_backend *be = tr->be;
    const struct block_kept *kp = &l->kept.block;
    size_t B = l->d.B, T = l->d.T, D = l->d.D, H = l->d.H, BT = B * T, dh = D / H;
    float p = l->d.dropout;
    tensor da = w->dy2; /* reuse */
    if (p > 0)
        be->dropout_bwd(be, AS_U8(*kp->resid_mask), AS_F32(w->dx2), AS_F32(da), BT * D, p);
    else {
        be->zero(be, da.p, BT * D * 4);
        be->add(be, AS_F32(da), AS_F32(w->dx2), AS_F32(da), BT * D);
    }
    tensor dO = tensor_alloc(tr, BT * D * 4, T_WORK);
    tensor dP = tensor_alloc(tr, B * H * T * T * 4, T_WORK);
    tensor dqkv = tensor_alloc(tr, BT * 3 * D * 4, T_WORK);
    tensor dq = tensor_alloc(tr, BT * D * 4, T_WORK), dk = tensor_alloc(tr, BT * D * 4, T_WORK),
           dv = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    attn_grads g = {AS_F32(w->dln), &dO, &dP, AS_F32(dq), AS_F32(dk), AS_F32(dv)};
    layer__attention_bwd(l, tr, &kp->attn, kp->q, kp->k, kp->v, &da, BL_WO, AS_F32(l->g[BL_BO]),
                         &g);
    be->permute(be, AS_F32(dq), AS_F32(dqkv), B, T, H, dh, 3 * D, 0, false);
    be->permute(be, AS_F32(dk), AS_F32(dqkv), B, T, H, dh, 3 * D, D, false);
    be->permute(be, AS_F32(dv), AS_F32(dqkv), B, T, H, dh, 3 * D, 2 * D, false);
    tensor_free(tr, &dO);
    tensor_free(tr, &dP);
    tensor_free(tr, &dq);
    tensor_free(tr, &dk);
    tensor_free(tr, &dv);
    layer__linear_bwd(be, kp->ln1, layer__matmul_weight(l, tr, BL_WQKV), &dqkv, AS_F32(w->dln),
                      0.0f, AS_F32(l->g[BL_WQKV]), AS_F32(l->g[BL_BQKV]), BT, D, 3 * D);
    tensor_free(tr, &dqkv);
    tensor dx = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return dx;
    be->layernorm_bwd(be, AS_F32(*kp->x), AS_F32(l->w[BL_G1]), AS_F32(*kp->mean1),
                      AS_F32(*kp->rstd1), AS_F32(w->dln), AS_F32(dx), AS_F32(l->g[BL_G1]),
                      AS_F32(l->g[BL_B1]), BT, D);
    be->add(be, AS_F32(dx), AS_F32(w->dx2), AS_F32(dx), BT * D);
    tensor_free(tr, &w->dy2);
    tensor_free(tr, &w->dln);
    tensor_free(tr, &w->dx2);
    return dx;
}

static tensor block_backward(layer *l, tracker *tr, tensor *dy)
{
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    struct block_grads w;
    w.dy2 = tensor_alloc(tr, BT * D * 4, T_WORK);
    tensor dg = tensor_alloc(tr, BT * F * 4, T_WORK);
    w.dln = tensor_alloc(tr, BT * D * 4, T_WORK);
    w.dx2 = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom || block_mlp_bwd(l, tr, dy, &w, &dg) != 0)
        return TENSOR_NONE;
    return block_attention_bwd(l, tr, &w);
}

static double block_flops(const layer *l)
{
    double BT = (double)(l->d.B * l->d.T), D = (double)l->d.D, F = (double)l->d.F;
    return 2 * BT * D * 3 * D + 4 * (double)l->d.B * (double)l->d.T * (double)l->d.T * D +
           2 * BT * D * D + 4 * BT * D * F;
}

const layer_ops layer__block_ops = {block_init, block_forward,
                                    block_backward, block_flops};
