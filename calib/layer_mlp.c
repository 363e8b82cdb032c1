/* nn.Linear and the MLP (linear, GELU, linear). */
#include <math.h>

#include "layer_internal.h"

enum { LIN_W, LIN_B };                   /* linear's parameters */
enum { MLP_W1, MLP_B1, MLP_W2, MLP_B2 }; /* the MLP's */

/* addmm saves its input; under amp its bf16 cast instead, and the fp32
 * input is no longer needed */
static tensor *keep_input(layer *l, tracker *tr, tensor *x)
{
    if (!l->d.amp)
        return layer__keep(l, *x);
    tensor *xs = layer__keep(l, layer__low_copy(tr, x->p, l->d.B * l->d.T * l->d.D, T_SAVED));
    tensor_free(tr, x);
    return xs;
}

static int linear_init(layer *l, tracker *tr)
{
    size_t D = l->d.D;
    float s = 1.0f / sqrtf((float)D);
    int rc = 0;
    rc |= layer__add_param(l, tr, D * D, s, false);
    rc |= layer__add_param(l, tr, D, s, false);
    return rc;
}

static tensor linear_forward(layer *l, tracker *tr, tensor *x)
{
    size_t BT = l->d.B * l->d.T, D = l->d.D;
    tensor *xs = l->kept.linear.x = keep_input(l, tr, x);
    tensor y = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(tr->be, xs, layer__matmul_weight(l, tr, LIN_W), &l->w[LIN_B], AS_F32(y),
                      BT, D, D);
    return y;
}

static tensor linear_backward(layer *l, tracker *tr, tensor *dy)
{
    size_t BT = l->d.B * l->d.T, D = l->d.D;
    tensor dx = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return dx;
    layer__linear_bwd(tr->be, l->kept.linear.x, layer__matmul_weight(l, tr, LIN_W), dy,
                      AS_F32(dx), 0.0f, AS_F32(l->g[LIN_W]), AS_F32(l->g[LIN_B]), BT, D, D);
    return dx;
}

static double linear_flops(const layer *l)
{
    double BT = (double)(l->d.B * l->d.T), D = (double)l->d.D;
    return 2 * BT * D * D;
}

const layer_ops layer__linear_ops = {linear_init, linear_forward, linear_backward,
                                     linear_flops};

static int mlp_init(layer *l, tracker *tr)
{
    return layer__add_mlp_params(l, tr);
}

static tensor mlp_forward(layer *l, tracker *tr, tensor *x)
{
    ml_backend *be = tr->be;
    struct mlp_kept *k = &l->kept.mlp;
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    tensor *xs = k->x = keep_input(l, tr, x);
    tensor y = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return TENSOR_NONE;
    tensor hs, as;
    tensor *h = layer__slot(l, tr, BT * F, &hs); /* gelu saves its input */
    tensor *a = layer__slot(l, tr, BT * F, &as); /* the 2nd linear its input */
    const tensor *w1 = layer__matmul_weight(l, tr, MLP_W1),
                 *w2 = layer__matmul_weight(l, tr, MLP_W2);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, xs, w1, &l->w[MLP_B1], AS_F32(*h), BT, D, F);
    be->gelu_fwd(be, AS_F32(*h), AS_F32(*a), BT * F);
    k->h = layer__settle(l, tr, h, &hs);
    a = k->a = layer__settle(l, tr, a, &as);
    if (tr->oom)
        return TENSOR_NONE;
    layer__linear_fwd(be, a, w2, &l->w[MLP_B2], AS_F32(y), BT, F, D);
    return y;
}

static tensor mlp_backward(layer *l, tracker *tr, tensor *dy)
{
    ml_backend *be = tr->be;
    const struct mlp_kept *k = &l->kept.mlp;
    size_t BT = l->d.B * l->d.T, D = l->d.D, F = l->d.F;
    tensor da = tensor_alloc(tr, BT * F * 4, T_WORK), th;
    tensor dx = tensor_alloc(tr, BT * D * 4, T_WORK);
    if (tr->oom)
        return dx;
    layer__linear_bwd(be, k->a, layer__matmul_weight(l, tr, MLP_W2), dy, AS_F32(da), 0.0f,
                      AS_F32(l->g[MLP_W2]), AS_F32(l->g[MLP_B2]), BT, F, D);
    float *hf = layer__fp32_values(tr, k->h, &th);
    if (tr->oom)
        return dx;
    be->gelu_bwd(be, hf, AS_F32(da), AS_F32(da), BT * F);
    tensor_free(tr, &th);
    layer__linear_bwd(be, k->x, layer__matmul_weight(l, tr, MLP_W1), &da, AS_F32(dx), 0.0f,
                      AS_F32(l->g[MLP_W1]), AS_F32(l->g[MLP_B1]), BT, D, F);
    tensor_free(tr, &da);
    return dx;
}

static double mlp_flops(const layer *l)
{
    double BT = (double)(l->d.B * l->d.T), D = (double)l->d.D, F = (double)l->d.F;
    return 4 * BT * D * F;
}

const layer_ops layer__mlp_ops = {mlp_init, mlp_forward, mlp_backward, mlp_flops};
