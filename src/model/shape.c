#include <stdio.h>

#include "model/shape.h"

#define LIM (1ull << 40)

uint64_t ml__shape_elems(const ml_shape *s)
{
    uint64_t n = 1;
    for (unsigned i = 0; i < s->rank; i++)
        if (__builtin_mul_overflow(n, s->d[i], &n))
            return UINT64_MAX;
    return n;
}

static bool pool_dim(uint64_t in, uint64_t k, uint64_t s, uint64_t p, uint64_t *out)
{
    if (in + 2 * p < k || s == 0)
        return false;
    *out = (in + 2 * p - k) / s + 1;
    return true;
}

static bool seq_step(const ml_layer *ls, size_t n, const ml_shape *in, ml_shape *out, char *msg,
                     size_t size, const ml_layer **where)
{
    ml_shape cur = *in;
    for (size_t i = 0; i < n; i++) {
        ml_shape nx;
        if (!ml__shape_step(&ls[i], &cur, &nx, msg, size, where))
            return false;
        cur = nx;
    }
    *out = cur;
    return true;
}

static void shape_str(const ml_shape *s, char *buf, size_t size)
{
    if (s->rank == 1)
        snprintf(buf, size, "[%llu]%s", (unsigned long long)s->d[0], s->ids ? " token ids" : "");
    else if (s->rank == 2)
        snprintf(buf, size, "[%llu, %llu]", (unsigned long long)s->d[0],
                 (unsigned long long)s->d[1]);
    else
        snprintf(buf, size, "[%llu, %llu, %llu]", (unsigned long long)s->d[0],
                 (unsigned long long)s->d[1], (unsigned long long)s->d[2]);
}

/* conv2d, maxpool and avgpool: a [channels, height, width] input, the
 * window sliding over height and width (sh: the input as text). */
static bool window_step(const ml_layer *l, const ml_shape *in, ml_shape *o, const char *sh,
                        char *msg, size_t size)
{
    const char *name = l->kind == ML_L_CONV2D    ? "conv2d"
                       : l->kind == ML_L_MAXPOOL ? "maxpool"
                                                 : "avgpool";
    if (in->rank != 3) {
        snprintf(msg, size, "%s needs a [channels, height, width] input, got %s", name, sh);
        return false;
    }
    if (l->kind == ML_L_CONV2D)
        o->d[0] = l->out;
    if (l->kind == ML_L_AVGPOOL && l->global) {
        o->d[1] = o->d[2] = 1;
        return true;
    }
    if (!pool_dim(in->d[1], l->kernel, l->stride, l->padding, &o->d[1]) ||
        !pool_dim(in->d[2], l->kernel, l->stride, l->padding, &o->d[2])) {
        snprintf(msg, size, "%s kernel %llu does not fit the input %s",
                 l->kind == ML_L_CONV2D ? "conv2d" : "pool", (unsigned long long)l->kernel, sh);
        return false;
    }
    return true;
}

/* A residual group: the body's output and the shortcut's (the input when
 * there is none) must agree; *where is left at the failing layer. */
static bool residual_step(const ml_layer *l, const ml_shape *in, ml_shape *o, char *msg,
                          size_t size, const ml_layer **where)
{
    ml_shape b, s = *in;
    if (!seq_step(l->body, l->nbody, in, &b, msg, size, where))
        return false;
    if (l->nshortcut && !seq_step(l->shortcut, l->nshortcut, in, &s, msg, size, where))
        return false;
    *where = l;
    if (b.rank != s.rank || b.d[0] != s.d[0] || b.d[1] != s.d[1] || b.d[2] != s.d[2]) {
        char bs[96], ss[96];
        shape_str(&b, bs, sizeof bs);
        shape_str(&s, ss, sizeof ss);
        snprintf(msg, size, "residual: the body gives %s but the %s gives %s; add a shortcut "
                 "(e.g. a 1x1 conv2d with the same stride) so both match", bs,
                 l->nshortcut ? "shortcut" : "identity shortcut", ss);
        return false;
    }
    *o = b;
    return true;
}

bool ml__shape_step(const ml_layer *l, const ml_shape *in, ml_shape *out, char *msg, size_t size,
                    const ml_layer **where)
{
    char sh[96];
    shape_str(in, sh, sizeof sh);
    *where = l;
    ml_shape o = *in;
    if (in->ids && l->kind != ML_L_EMBEDDING) {
        snprintf(msg, size, "the input %s are integer ids: only an embedding can take them", sh);
        return false;
    }
    switch (l->kind) {
    case ML_L_LINEAR:
        if (in->rank > 2) {
            snprintf(msg, size, "linear needs a flat [features] or [tokens, features] input, got %s: "
                     "add 'flatten: {}' or a pooling layer first", sh);
            return false;
        }
        o.d[o.rank - 1] = l->out;
        break;
    case ML_L_CONV2D:
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL:
        if (!window_step(l, in, &o, sh, msg, size))
            return false;
        break;
    case ML_L_BATCHNORM:
        if (in->rank == 2) {
            snprintf(msg, size, "batchnorm needs [channels, height, width] or [features], got %s", sh);
            return false;
        }
        break;
    case ML_L_LAYERNORM:
    case ML_L_RELU:
    case ML_L_GELU:
    case ML_L_SILU:
    case ML_L_DROPOUT:
        break;
    case ML_L_FLATTEN:
        o.rank = 1;
        o.d[0] = ml__shape_elems(in);
        o.d[1] = o.d[2] = 0;
        break;
    case ML_L_EMBEDDING:
        if (!in->ids) {
            snprintf(msg, size, "embedding takes integer token ids and must be the first layer; "
                     "its input here is %s", sh);
            return false;
        }
        o.ids = false;
        o.rank = 2;
        o.d[1] = l->dim;
        break;
    case ML_L_ATTENTION:
        if (in->rank != 2) {
            snprintf(msg, size, "attention needs a [tokens, features] input, got %s", sh);
            return false;
        }
        if (in->d[1] % l->heads) {
            snprintf(msg, size, "attention heads %llu do not divide the feature width %llu",
                     (unsigned long long)l->heads, (unsigned long long)in->d[1]);
            return false;
        }
        break;
    case ML_L_RESIDUAL:
        if (!residual_step(l, in, &o, msg, size, where))
            return false;
        break;
    default:
        snprintf(msg, size, "unknown layer");
        return false;
    }
    for (unsigned i = 0; i < o.rank; i++)
        if (o.d[i] == 0 || o.d[i] > LIM) {
            snprintf(msg, size, "layer output dimension %llu is out of range",
                     (unsigned long long)o.d[i]);
            return false;
        }
    *out = o;
    return true;
}
