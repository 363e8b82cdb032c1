/* Eager attention and the two-halves forward, shared by the GPT-2 style
 * and the Llama-style blocks. */
#include <math.h>

#include "layer_internal.h"

/* S = q k^T (workspace), P = softmax(scale S) kept in fp32; with dropout p
 * its mask and output kept, else under amp PV's bf16 cast of P; O = P' v
 * back into (B, T, D) rows, the output projection's input (kept); then the
 * projection. */
tensor layer__attention_fwd(layer *l, tracker *tr, struct attn_kept *kept, const tensor *q,
                            const tensor *k, const tensor *v, float p, int wo, const tensor *bo)
{
    ml_backend *be = tr->be;
    const layer_dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, dh = D / H, BHTT = B * H * T * T;
    float scale = 1.0f / sqrtf((float)dh);
    tensor S = tensor_alloc(tr, BHTT * 4, T_WORK);
    /* softmax output (fp32 under amp: softmax is on autocast's fp32 list) */
    tensor *P = kept->P = layer__keep(l, tensor_alloc(tr, BHTT * 4, T_SAVED));
    if (tr->oom)
        return TENSOR_NONE;
    const long kvs = kept->kv_one ? 0 : (long)(T * dh);
    layer__matmul(be, false, true, (int)T, (int)T, (int)dh, 1.0f, q, (long)(T * dh), k, kvs,
                  0.0f, AS_F32(S), (long)(T * T), (int)(B * H));
    be->softmax_fwd(be, AS_F32(S), AS_F32(*P), B * H, T, scale);
    tensor_free(tr, &S);
    tensor *Pd = P;
    if (p > 0) {
        tensor sd;
        tensor *mask = kept->mask = layer__keep(l, tensor_alloc(tr, BHTT, T_SAVED));
        Pd = layer__slot(l, tr, BHTT, &sd); /* the dropout output */
        if (tr->oom)
            return TENSOR_NONE;
        be->dropout_fwd(be, AS_F32(*P), AS_U8(*mask), AS_F32(*Pd), BHTT, p, l->seed + 1);
        Pd = layer__settle(l, tr, Pd, &sd);
    } else if (d->amp) {
        Pd = layer__keep(l, layer__low_copy(tr, P->p, BHTT, T_SAVED)); /* PV's bf16 cast */
    }
    kept->pv = Pd;
    tensor O = tensor_alloc(tr, B * T * D * 4, T_WORK);
    tensor so;
    tensor *om = layer__slot(l, tr, B * T * D, &so);
    tensor a = tensor_alloc(tr, B * T * D * 4, T_WORK);
    const tensor *w = layer__matmul_weight(l, tr, wo);
    if (tr->oom)
        return TENSOR_NONE;
    layer__matmul(be, false, false, (int)T, (int)dh, (int)T, 1.0f, Pd, (long)(T * T), v, kvs,
                  0.0f, AS_F32(O), (long)(T * dh), (int)(B * H));
    be->permute(be, AS_F32(O), AS_F32(*om), B, T, H, dh, D, 0, false);
    tensor_free(tr, &O);
    om = kept->om = layer__settle(l, tr, om, &so);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, om, w, bo, AS_F32(a), B * T, D, D);
    return a;
}

tensor layer__block_forward(layer *l, tracker *tr, tensor *x, const block_halves *h)
{
    tensor a = h->attention(l, tr, x);
    if (tr->oom)
        return TENSOR_NONE;
    return h->mlp(l, tr, x, &a);
}

void layer__attention_bwd(layer *l, tracker *tr, const struct attn_kept *kept, const tensor *q,
                          const tensor *k, const tensor *v, const tensor *da, int wo, float *dbo,
                          const attn_grads *g)
{
    ml_backend *be = tr->be;
    const layer_dims *d = &l->d;
    size_t B = d->B, T = d->T, D = d->D, H = d->H, dh = D / H;
    long tt = (long)(T * T), td = (long)(T * dh), kvs = kept->kv_one ? 0 : td;
    int bh = (int)(B * H);
    layer__linear_bwd(be, kept->om, layer__matmul_weight(l, tr, wo), da, g->rows, 0.0f,
                      AS_F32(l->g[wo]), dbo, B * T, D, D);
    be->permute(be, g->rows, AS_F32(*g->dO), B, T, H, dh, D, 0, true);
    /* O = P' v: dP' = dO v^T, dv = P'^T dO */
    layer__matmul(be, false, true, (int)T, (int)T, (int)dh, 1.0f, g->dO, td, v, kvs, 0.0f,
                  AS_F32(*g->dP), tt, bh);
    layer__matmul(be, true, false, (int)T, (int)dh, (int)T, 1.0f, kept->pv, tt, g->dO, td, 0.0f,
                  g->dv, td, bh);
    if (kept->mask)
        be->dropout_bwd(be, AS_U8(*kept->mask), AS_F32(*g->dP), AS_F32(*g->dP), B * H * T * T,
                        d->dropout);
    be->softmax_bwd(be, AS_F32(*kept->P), AS_F32(*g->dP), AS_F32(*g->dP), B * H, T,
                    1.0f / sqrtf((float)dh));
    /* S = q k^T: dq = dS k, dk = dS^T q */
    layer__matmul(be, false, false, (int)T, (int)dh, (int)T, 1.0f, g->dP, tt, k, kvs, 0.0f, g->dq,
                  td, bh);
    layer__matmul(be, true, false, (int)T, (int)dh, (int)T, 1.0f, g->dP, tt, q, td, 0.0f, g->dk,
                  td, bh);
}
