/* The pieces the layer kinds share: parameters, keeping tensors for the
 * backward, autocast's casts, and the linear map. */
#include <math.h>
#include <stdlib.h>

#include "layer_internal.h"

static void random_fill(tracker *tr, tensor *t, size_t n, float scale, uint64_t *seed)
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

int layer__add_param(layer *l, tracker *tr, size_t n, float scale, bool ones)
{
    int i = l->nparams++;
    l->wn[i] = n;
    l->w[i] = tensor_alloc(tr, n * 4, T_PARAM);
    l->m[i] = tensor_alloc(tr, n * 4, T_STATE);
    l->v[i] = tensor_alloc(tr, n * 4, T_STATE);
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

int layer__add_norm_params(layer *l, tracker *tr)
{
    size_t D = l->d.D;
    int rc = layer__add_param(l, tr, D, 0, true);
    return rc | layer__add_param(l, tr, D, 1.0f / sqrtf((float)D), false);
}

int layer__add_mlp_params(layer *l, tracker *tr)
{
    size_t D = l->d.D, F = l->d.F;
    float s = 1.0f / sqrtf((float)D);
    int rc = 0;
    rc |= layer__add_param(l, tr, D * F, s, false);
    rc |= layer__add_param(l, tr, F, s, false);
    rc |= layer__add_param(l, tr, F * D, 1.0f / sqrtf((float)F), false);
    rc |= layer__add_param(l, tr, D, s, false);
    return rc;
}

size_t layer__kv_heads(const layer_dims *d)
{
    return d->KV ? d->KV : d->H;
}

tensor *layer__keep(layer *l, tensor t)
{
    l->saved[l->nsaved] = t;
    return &l->saved[l->nsaved++];
}

tensor layer__low_copy(tracker *tr, const float *src, size_t n, int cat)
{
    tensor c = tensor_alloc(tr, n * 2, cat);
    c.low = true;
    if (c.p)
        tr->be->cast(tr->be, src, c.p, n, true);
    return c;
}

tensor *layer__slot(layer *l, tracker *tr, size_t n, tensor *stage)
{
    *stage = TENSOR_NONE;
    if (!l->d.amp)
        return layer__keep(l, tensor_alloc(tr, n * 4, T_SAVED));
    *stage = tensor_alloc(tr, n * 4, T_WORK);
    return stage;
}

tensor *layer__settle(layer *l, tracker *tr, tensor *t, tensor *stage)
{
    if (t != stage)
        return t;
    tensor *k = layer__keep(l, layer__low_copy(tr, stage->p, stage->bytes / 4, T_SAVED));
    tensor_free(tr, stage);
    return k;
}

tensor *layer__norm_keep(layer *l, tracker *tr, size_t first_bytes, size_t second_bytes,
                         tensor **first, tensor **second, tensor *stage)
{
    *first = layer__keep(l, tensor_alloc(tr, first_bytes, T_SAVED));
    *second = layer__keep(l, tensor_alloc(tr, second_bytes, T_SAVED));
    tensor *y = layer__slot(l, tr, l->d.B * l->d.T * l->d.D, stage);
    return tr->oom ? NULL : y;
}

void layer__slots(layer *l, tracker *tr, size_t size, int n, tensor **t, tensor *stage)
{
    for (int i = 0; i < n; i++)
        t[i] = layer__slot(l, tr, size, &stage[i]);
}

void layer__settle_each(layer *l, tracker *tr, int n, tensor **t, tensor *stage)
{
    for (int i = 0; i < n; i++)
        t[i] = layer__settle(l, tr, t[i], &stage[i]);
}

void layer__extra_copy(layer *l, tracker *tr, const float *src, size_t n)
{
    l->extra_casts[l->nextra++] = layer__low_copy(tr, src, n, T_SAVED);
}

const tensor *layer__matmul_weight(layer *l, tracker *tr, int i)
{
    if (!l->d.amp)
        return &l->w[i];
    if (!l->weight_copy[i].p && !tr->oom)
        l->weight_copy[i] = layer__low_copy(tr, l->w[i].p, l->wn[i], T_CAST);
    return &l->weight_copy[i];
}

float *layer__fp32_values(tracker *tr, const tensor *t, tensor *tmp)
{
    *tmp = TENSOR_NONE;
    if (!t->low)
        return t->p;
    *tmp = tensor_alloc(tr, t->bytes * 2, T_WORK);
    if (tmp->p)
        tr->be->cast(tr->be, t->p, tmp->p, t->bytes / 2, false);
    return tmp->p;
}

void layer__matmul(ml_backend *be, bool ta, bool tb, int M, int N, int K, float alpha,
                   const tensor *A, long sA, const tensor *B, long sB, float beta, float *C,
                   long sC, int batch)
{
    if (A->low || B->low)
        be->gemm_mixed(be, ta, tb, M, N, K, alpha, A->p, A->low, sA, B->p, B->low, sB, beta, C,
                       sC, batch);
    else if (batch == 1)
        be->gemm(be, ta, tb, M, N, K, alpha, A->p, B->p, beta, C);
    else
        be->gemm_batched(be, ta, tb, M, N, K, alpha, A->p, sA, B->p, sB, beta, C, sC, batch);
}

void layer__linear_fwd(ml_backend *be, const tensor *x, const tensor *W, const tensor *b,
                       float *y, size_t rows, size_t in, size_t out)
{
    layer__matmul(be, false, false, (int)rows, (int)out, (int)in, 1.0f, x, 0, W, 0, 0.0f, y, 0,
                  1);
    if (b)
        be->bias_add(be, y, b->p, rows, out);
}

void layer__linear_bwd(ml_backend *be, const tensor *x, const tensor *W, const tensor *dy,
                       float *dx, float beta_dx, float *dW, float *db, size_t rows, size_t in,
                       size_t out)
{
    if (dx)
        layer__matmul(be, false, true, (int)rows, (int)in, (int)out, 1.0f, dy, 0, W, 0, beta_dx,
                      dx, 0, 1);
    layer__matmul(be, true, false, (int)in, (int)out, (int)rows, 1.0f, x, 0, dy, 0, 1.0f, dW, 0,
                  1);
    if (db)
        be->bias_grad(be, dy->p, db, rows, out);
}
