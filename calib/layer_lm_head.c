/* Token and position embeddings, (dropout), the final LayerNorm, the LM
 * head and the cross-entropy loss: a decoder's ends around its blocks. */
#include <math.h>
#include <stdlib.h>

#include "layer_internal.h"

enum { LM_WTE, LM_WPE, LM_GF, LM_BF, LM_WH };

static int lm_head_init(layer *l, tracker *tr)
{
    size_t D = l->d.D;
    float s = 1.0f / sqrtf((float)D);
    int rc = 0;
    rc |= layer__add_param(l, tr, l->d.V * D, 0.1f, false);
    rc |= layer__add_param(l, tr, l->d.T * D, 0.1f, false);
    rc |= layer__add_norm_params(l, tr);
    rc |= layer__add_param(l, tr, l->d.V * D, s, false);
    return rc;
}

/* Keeps the ids (x), the position ids and the targets; returns the token
 * plus position embeddings (T_WORK), TENSOR_NONE when out of memory. */
static tensor lm_head_embed(layer *l, tracker *tr, tensor *x)
{
    ml_backend *be = tr->be;
    struct lm_head_kept *kp = &l->kept.lm_head;
    size_t T = l->d.T, D = l->d.D, V = l->d.V, BT = l->d.B * T;
    kp->ids = layer__keep(l, *x);
    tensor *pos = kp->pos = layer__keep(l, tensor_alloc(tr, T * 8, T_SAVED));
    tensor *tgt = kp->tgt = layer__keep(l, tensor_alloc(tr, BT * 8, T_SAVED));
    tensor e = tensor_alloc(tr, BT * D * 4, T_WORK), pe = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    int64_t *hp = malloc(BT * 8);
    if (!hp) {
        tr->oom = true;
        return TENSOR_NONE;
    }
    for (size_t t = 0; t < T; t++)
        hp[t] = (int64_t)t;
    be->upload(be, pos->p, hp, T * 8);
    for (size_t i = 0; i < BT; i++)
        hp[i] = (int64_t)((i * 7919 + 13) % V);
    be->upload(be, tgt->p, hp, BT * 8);
    free(hp);
    be->embedding_fwd(be, AS_I64(*x), AS_F32(l->w[LM_WTE]), AS_F32(e), BT, D);
    int64_t *posb = malloc(BT * 8);
    tensor posbt = tensor_alloc(tr, BT * 8, T_WORK);
    if (!posb || tr->oom) {
        free(posb);
        tr->oom = true;
        return TENSOR_NONE;
    }
    for (size_t i = 0; i < BT; i++)
        posb[i] = (int64_t)(i % T);
    be->upload(be, posbt.p, posb, BT * 8);
    free(posb);
    be->embedding_fwd(be, AS_I64(posbt), AS_F32(l->w[LM_WPE]), AS_F32(pe), BT, D);
    tensor_free(tr, &posbt);
    be->add(be, AS_F32(e), AS_F32(pe), AS_F32(e), BT * D);
    tensor_free(tr, &pe);
    return e;
}

/* From the embeddings e (freed) to the 1-element loss. */
static tensor lm_head_loss(layer *l, tracker *tr, tensor *e)
{
    ml_backend *be = tr->be;
    struct lm_head_kept *kp = &l->kept.lm_head;
    size_t D = l->d.D, V = l->d.V, BT = l->d.B * l->d.T;
    float p = l->d.dropout;
    tensor *xe = e; /* the block stack would run here; the head takes it directly */
    if (p > 0) {
        tensor *m = kp->emb_mask = layer__keep(l, tensor_alloc(tr, BT * D, T_SAVED));
        if (tr->oom)
            return TENSOR_NONE;
        be->dropout_fwd(be, AS_F32(*e), AS_U8(*m), AS_F32(*e), BT * D, p, l->seed + 4);
    }
    tensor *xf = kp->xf = layer__keep(l, tensor_alloc(tr, BT * D * 4, T_SAVED));
    tensor sl;
    tensor *lnf = layer__norm_keep(l, tr, BT * 4, BT * 4, &kp->mf, &kp->rf, &sl);
    if (!lnf)
        return TENSOR_NONE;
    /* xf = xe: the residual stream entering the head (a copy here, the
     * output of the last block in a model) */
    be->zero(be, xf->p, BT * D * 4);
    be->add(be, AS_F32(*xf), AS_F32(*xe), AS_F32(*xf), BT * D);
    tensor_free(tr, e);
    be->layernorm_fwd(be, AS_F32(*xf), AS_F32(l->w[LM_GF]), AS_F32(l->w[LM_BF]), AS_F32(*lnf),
                      AS_F32(*kp->mf), AS_F32(*kp->rf), BT, D);
    lnf = kp->lnf = layer__settle(l, tr, lnf, &sl);
    tensor logits = tensor_alloc(tr, BT * V * 4, T_WORK);
    /* log-softmax output: fp32 (under amp too: autocast's fp32 list) */
    tensor *logp = kp->logp = layer__keep(l, tensor_alloc(tr, BT * V * 4, T_SAVED));
    kp->total_weight = layer__keep(l, tensor_alloc(tr, 4, T_SAVED));
    tensor loss = tensor_alloc(tr, 4, T_WORK);
    const tensor *wh = layer__matmul_weight(l, tr, LM_WH);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, lnf, wh, NULL, AS_F32(logits), BT, D, V);
    float hl;
    be->xent_fwd(be, AS_F32(logits), AS_I64(*kp->tgt), AS_F32(*logp), &hl, BT, V);
    tensor_free(tr, &logits);
    be->upload(be, loss.p, &hl, 4);
    return loss;
}

static tensor lm_head_forward(layer *l, tracker *tr, tensor *x)
{
    tensor e = lm_head_embed(l, tr, x);
    if (tr->oom)
        return TENSOR_NONE;
    return lm_head_loss(l, tr, &e);
}

static tensor lm_head_backward(layer *l, tracker *tr, tensor *dy)
{
    (void)dy; /* the loss is the end: its gradient is 1 */
    ml_backend *be = tr->be;
    const struct lm_head_kept *kp = &l->kept.lm_head;
    size_t B = l->d.B, T = l->d.T, D = l->d.D, V = l->d.V, BT = B * T;
    float p = l->d.dropout;
    tensor dl = tensor_alloc(tr, BT * V * 4, T_WORK), dln = tensor_alloc(tr, BT * D * 4, T_WORK),
           dxf = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    be->xent_bwd(be, AS_F32(*kp->logp), AS_I64(*kp->tgt), AS_F32(dl), BT, V);
    layer__linear_bwd(be, kp->lnf, layer__matmul_weight(l, tr, LM_WH), &dl, AS_F32(dln), 0.0f,
                      AS_F32(l->g[LM_WH]), NULL, BT, D, V);
    tensor_free(tr, &dl);
    be->layernorm_bwd(be, AS_F32(*kp->xf), AS_F32(l->w[LM_GF]), AS_F32(*kp->mf),
                      AS_F32(*kp->rf), AS_F32(dln), AS_F32(dxf), AS_F32(l->g[LM_GF]),
                      AS_F32(l->g[LM_BF]), BT, D);
    if (p > 0)
        be->dropout_bwd(be, AS_U8(*kp->emb_mask), AS_F32(dxf), AS_F32(dxf), BT * D, p);
    be->embedding_bwd(be, AS_I64(*kp->ids), AS_F32(dxf), AS_F32(l->g[LM_WTE]), BT, D);
    /* positions: row i uses position i % T */
    for (size_t b = 0; b < B; b++)
        be->add(be, AS_F32(l->g[LM_WPE]), AS_F32(dxf) + b * T * D, AS_F32(l->g[LM_WPE]), T * D);
    tensor_free(tr, &dln);
    tensor_free(tr, &dxf);
    return TENSOR_NONE;
}

static double lm_head_flops(const layer *l)
{
    double BT = (double)(l->d.B * l->d.T), D = (double)l->d.D;
    return 2 * BT * D * (double)l->d.V;
}

const layer_ops layer__lm_head_ops = {lm_head_init, lm_head_forward,
                                      lm_head_backward, lm_head_flops};
