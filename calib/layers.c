/* The layer API over the table of kinds: each kind's init, forward,
 * backward and FLOPs live in its own file (layer_*.c); the parameters,
 * Adam and freeing are the same for every kind and live here. */
#include <string.h>

#include "layer_internal.h"

/* Indexed by layer_kind: the one list of kinds. */
static const layer_ops *const kinds[LAYER_KIND_COUNT] = {
    [LAYER_LINEAR] = &layer__linear_ops,   [LAYER_MLP] = &layer__mlp_ops,
    [LAYER_BLOCK] = &layer__block_ops,     [LAYER_LM_HEAD] = &layer__lm_head_ops,
    [LAYER_LLAMA] = &layer__llama_ops,
};

static const layer_ops *ops_of(layer_kind kind)
{
    return (unsigned)kind < LAYER_KIND_COUNT ? kinds[kind] : NULL;
}

const char *layer_kind_name(layer_kind kind)
{
    return ml_profile_kind_name((ml_profile_kind_id)kind);
}

int layer_init(layer *l, layer_kind kind, const layer_dims *d, tracker *tr, uint64_t seed)
{
    memset(l, 0, sizeof *l);
    l->kind = kind;
    l->d = *d;
    l->seed = seed;
    const layer_ops *ops = ops_of(kind);
    if (!ops)
        return -1;
    int rc = ops->init(l, tr);
    return rc || tr->oom ? -1 : 0;
}

size_t layer_input_bytes(const layer *l)
{
    size_t BT = l->d.B * l->d.T;
    return l->kind == LAYER_LM_HEAD ? BT * 8 : BT * l->d.D * 4;
}

double layer_flops(const layer *l)
{
    const layer_ops *ops = ops_of(l->kind);
    return ops ? ops->flops(l) : 0;
}

tensor layer_forward(layer *l, tracker *tr, tensor *x)
{
    l->nsaved = 0;
    l->nextra = 0;
    memset(&l->kept, 0, sizeof l->kept);
    const layer_ops *ops = ops_of(l->kind);
    return ops ? ops->forward(l, tr, x) : TENSOR_NONE;
}

static void grads_alloc(layer *l, tracker *tr)
{
    for (int i = 0; i < l->nparams; i++) {
        l->g[i] = tensor_alloc(tr, l->wn[i] * 4, T_GRAD);
        if (l->g[i].p)
            tr->be->zero(tr->be, l->g[i].p, l->wn[i] * 4);
    }
}

static void free_saved(layer *l, tracker *tr)
{
    for (int i = 0; i < l->nsaved; i++)
        tensor_free(tr, &l->saved[i]);
    l->nsaved = 0;
    for (int i = 0; i < l->nextra; i++)
        tensor_free(tr, &l->extra_casts[i]);
    l->nextra = 0;
    for (int i = 0; i < l->nparams; i++)
        tensor_free(tr, &l->weight_copy[i]);
}

tensor layer_backward(layer *l, tracker *tr, tensor *dy)
{
    grads_alloc(l, tr);
    if (tr->oom)
        return TENSOR_NONE;
    const layer_ops *ops = ops_of(l->kind);
    tensor dx = ops ? ops->backward(l, tr, dy) : TENSOR_NONE;
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
            tr->be->adam(tr->be, AS_F32(l->w[i]), AS_F32(l->g[i]), AS_F32(l->m[i]),
                         AS_F32(l->v[i]), l->wn[i], 1e-3f, 0.9f, 0.999f, 1e-8f, l->step);
        tensor_free(tr, &l->g[i]);
    }
}

void layer_destroy(layer *l, tracker *tr)
{
    free_saved(l, tr);
    for (int i = 0; i < l->nparams; i++) {
        tensor_free(tr, &l->w[i]);
        tensor_free(tr, &l->g[i]);
        tensor_free(tr, &l->m[i]);
        tensor_free(tr, &l->v[i]);
    }
    l->nparams = 0;
}
