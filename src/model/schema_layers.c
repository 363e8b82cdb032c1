/* The layers of a sequential model in a model file: each `- kind: {...}`
 * entry with its keys checked for its kind, residual bodies and shortcuts
 * nested, `- repeat: {times: N, layers: [...]}` groups expanded into N
 * copies as they are read, and the sequence's shapes checked from
 * model.input through to the loss (shape.c). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/schema.h"
#include "model/shape.h"

static const char *const loss_names[] = {"cross_entropy", "mse"};
static const char *const layer_names[ML_L_KIND_COUNT] = {
    "linear", "conv2d",  "batchnorm", "layernorm", "relu",     "gelu",      "silu",
    "dropout", "maxpool", "avgpool",   "flatten",   "residual", "embedding", "attention"};

/* What the reading of one model's layers carries down the nesting. */
typedef struct {
    ml_error *err;
    uint64_t made;  /* layers made so far: nested ones and repeat copies included */
    bool repeated;  /* a repeat was expanded: model.layers[i] counts its copies */
} lctx;

/* A list of layers being filled: v[0..n) made, cap allocated. */
typedef struct {
    ml_layer *v;
    size_t n, cap;
} lvec;

static ml_status parse_layers(lctx *c, const ml_node *seq, const char *field, ml_layer **out,
                              size_t *nout, unsigned depth);

/* The layer kind named by key (the entry's one key), or an error naming
 * the closest kind. */
static ml_status layer_kind_of(ml_error *err, const ml_node *key, const char *field,
                               ml_layer_kind *out)
{
    const char *kind = key->text;
    unsigned k;
    for (k = 0; k < ML_L_KIND_COUNT; k++)
        if (strcmp(kind, layer_names[k]) == 0)
            break;
    if (k == ML_L_KIND_COUNT) {
        /* repeat is no layer kind but is written where one is */
        const char *names[ML_L_KIND_COUNT + 1];
        memcpy(names, layer_names, sizeof layer_names);
        names[ML_L_KIND_COUNT] = "repeat";
        const char *near = ml__closest_name(kind, names, ML_L_KIND_COUNT + 1);
        char list[320];
        ml__join_names(list, sizeof list, names, ML_L_KIND_COUNT + 1);
        if (near)
            return ml__error_at(err, key, ML_SCHEMA,
                                "%s: unknown layer kind '%s'; did you mean '%s'?", field, kind,
                                near);
        return ml__error_at(err, key, ML_SCHEMA,
                            "%s: unknown layer kind '%s'; expected one of: %s", field, kind, list);
    }
    *out = (ml_layer_kind)k;
    return ML_OK;
}

/* A residual group: a list (its body), or {body, shortcut}. f names it. */
static ml_status parse_residual(lctx *c, const ml_node *p, const char *f, ml_layer *l,
                                unsigned depth)
{
    ml_error *err = c->err;
    ml_status st;
    if (p->type == ML_NODE_SEQ)
        return parse_layers(c, p, f, &l->body, &l->nbody, depth + 1);
    if ((st = ml__tree_need_map(err, p, f)))
        return st;
    static const char *const rk[] = {"body", "shortcut"};
    if ((st = ml__tree_check_keys(err, p, f, rk, ML_COUNT(rk))))
        return st;
    const ml_node *body = ml__tree_get(p, "body"), *sc = ml__tree_get(p, "shortcut");
    if (!body)
        return ml__error_at(err, p, ML_SCHEMA,
                            "%s.body: missing; a residual mapping needs 'body:' (a "
                            "list of layers) and optionally 'shortcut:'",
                            f);
    char fb[160];
    snprintf(fb, sizeof fb, "%s.body", f);
    if ((st = parse_layers(c, body, fb, &l->body, &l->nbody, depth + 1)))
        return st;
    if (sc) {
        snprintf(fb, sizeof fb, "%s.shortcut", f);
        if ((st = parse_layers(c, sc, fb, &l->shortcut, &l->nshortcut, depth + 1)))
            return st;
    }
    return ML_OK;
}

/* The keys a layer of kind k may have (every kind: eps). */
static const char *const *layer_keys(ml_layer_kind k, size_t *n)
{
    static const char *const k_linear[] = {"out", "bias"};
    static const char *const k_conv[] = {"out", "kernel", "stride", "padding", "bias"};
    static const char *const k_pool[] = {"kernel", "stride", "padding", "global"};
    static const char *const k_drop[] = {"p", "inplace"};
    static const char *const k_act[] = {"eps", "inplace"};
    static const char *const k_emb[] = {"vocab", "dim"};
    static const char *const k_attn[] = {"heads", "causal", "bias", "dropout"};
    static const char *const k_none[] = {"eps"};
    switch (k) {
    case ML_L_LINEAR: *n = ML_COUNT(k_linear); return k_linear;
    case ML_L_CONV2D: *n = ML_COUNT(k_conv); return k_conv;
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL: *n = ML_COUNT(k_pool); return k_pool;
    case ML_L_DROPOUT: *n = ML_COUNT(k_drop); return k_drop;
    case ML_L_RELU:
    case ML_L_GELU:
    case ML_L_SILU: *n = ML_COUNT(k_act); return k_act;
    case ML_L_EMBEDDING: *n = ML_COUNT(k_emb); return k_emb;
    case ML_L_ATTENTION: *n = ML_COUNT(k_attn); return k_attn;
    default: *n = ML_COUNT(k_none); return k_none;
    }
}

/* `inplace: true`: ReLU's is modelled (docs/ledger.md, "The forward, op by
 * op"); the others are refused with the reason. */
static ml_status parse_inplace(ml_error *err, const ml_node *pm, const char *f, ml_layer *l)
{
    ml_status st = ml__tree_bool(err, pm, "inplace", f, &l->inplace);
    if (st || !l->inplace || l->kind == ML_L_RELU)
        return st;
    const char *why = l->kind == ML_L_GELU
                          ? "nn.GELU has no in-place form"
                      : l->kind == ML_L_SILU
                          ? "an in-place silu overwrites the input its backward needs: not "
                            "modelled"
                          : "an in-place dropout keeps a noise tensor of the input's dtype "
                            "instead of a bool mask: not modelled";
    return ml__error_at(err, ml__tree_get(pm, "inplace"), ML_SCHEMA,
                        "%s.inplace: %s; remove it to plan the out-of-place op", f, why);
}

/* maxpool and avgpool: a window (kernel, stride, padding) or global. */
static ml_status pool_values(ml_error *err, const ml_node *pm, const ml_node *key, const char *f,
                             ml_layer *l)
{
    ml_status st;
    if ((st = ml__tree_bool(err, pm, "global", f, &l->global)))
        return st;
    static const char *const window[] = {"kernel", "stride", "padding"};
    for (int k = 0; l->global && k < 3; k++) {
        const ml_node *w = ml__tree_get(pm, window[k]);
        if (w)
            return ml__error_at(err, w, ML_SCHEMA,
                                "%s.%s: a global pool covers the whole input and has no "
                                "window: drop '%s' (or 'global: true')",
                                f, window[k], window[k]);
    }
    if (l->global)
        return ML_OK;
    if (!ml__tree_get(pm, "kernel"))
        return ml__error_at(err, key, ML_SCHEMA,
                            "%s.kernel: missing; write 'kernel: K'%s", f,
                            l->kind == ML_L_AVGPOOL ? " or 'global: true'" : "");
    if ((st = ml__tree_uint(err, pm, "kernel", f, 1, 1024, &l->kernel)))
        return st;
    l->stride = l->kernel;
    if ((st = ml__tree_uint(err, pm, "stride", f, 1, 1024, &l->stride)) ||
        (st = ml__tree_uint(err, pm, "padding", f, 0, 1024, &l->padding)))
        return st;
    /* aten/src/ATen/native/Pool.h, pool2d_shape_check: kW / 2 >= padW */
    if (l->padding > l->kernel / 2)
        return ml__error_at(err, ml__tree_get(pm, "padding"), ML_RANGE,
                            "%s.padding: %llu is more than half the kernel (%llu); "
                            "PyTorch refuses it (pad should be at most half of kernel "
                            "size)",
                            f, (unsigned long long)l->padding,
                            (unsigned long long)l->kernel);
    return ML_OK;
}

/* The values of a layer's keys (pm: its mapping, NULL for none; key: the
 * entry's key, where a missing value is reported; f names the layer). */
static ml_status parse_values(ml_error *err, const ml_node *pm, const ml_node *key, const char *f,
                              ml_layer *l)
{
    ml_status st = ML_OK;
    const char *kind = key->text;
    switch (l->kind) {
    case ML_L_LINEAR:
    case ML_L_CONV2D:
        if (!ml__tree_get(pm, "out"))
            return ml__error_at(err, key, ML_SCHEMA,
                                "%s.out: missing; %s needs its output %s", f, kind,
                                l->kind == ML_L_LINEAR ? "features (out: N)" : "channels (out: N)");
        if ((st = ml__tree_uint(err, pm, "out", f, 1, ML_MAX_FFN, &l->out)) ||
            (st = ml__tree_bool(err, pm, "bias", f, &l->bias)))
            return st;
        if (l->kind == ML_L_CONV2D) {
            if (!ml__tree_get(pm, "kernel"))
                return ml__error_at(err, key, ML_SCHEMA,
                                    "%s.kernel: missing; conv2d needs "
                                    "'kernel: K'",
                                    f);
            if ((st = ml__tree_uint(err, pm, "kernel", f, 1, 1024, &l->kernel)) ||
                (st = ml__tree_uint(err, pm, "stride", f, 1, 1024, &l->stride)) ||
                (st = ml__tree_uint(err, pm, "padding", f, 0, 1024, &l->padding)))
                return st;
        }
        break;
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL:
        return pool_values(err, pm, key, f, l);
    case ML_L_DROPOUT:
        l->p = 0.5; /* torch.nn.Dropout's default */
        if ((st = ml__tree_double(err, pm, "p", f, 0, 1, true, &l->p)) ||
            (st = parse_inplace(err, pm, f, l)))
            return st;
        break;
    case ML_L_RELU:
    case ML_L_GELU:
    case ML_L_SILU:
        if ((st = parse_inplace(err, pm, f, l)))
            return st;
        break;
    case ML_L_EMBEDDING:
        if (!ml__tree_get(pm, "vocab") || !ml__tree_get(pm, "dim"))
            return ml__error_at(err, key, ML_SCHEMA, "%s: needs 'vocab: N' and 'dim: D'", f);
        if ((st = ml__tree_uint(err, pm, "vocab", f, 1, ML_MAX_VOCAB, &l->vocab)) ||
            (st = ml__tree_uint(err, pm, "dim", f, 1, ML_MAX_HIDDEN, &l->dim)))
            return st;
        break;
    case ML_L_ATTENTION:
        if (!ml__tree_get(pm, "heads"))
            return ml__error_at(err, key, ML_SCHEMA,
                                "%s.heads: missing; attention needs 'heads: H'", f);
        if ((st = ml__tree_uint(err, pm, "heads", f, 1, ML_MAX_HIDDEN, &l->heads)) ||
            (st = ml__tree_bool(err, pm, "causal", f, &l->causal)) ||
            (st = ml__tree_bool(err, pm, "bias", f, &l->bias)) ||
            (st = ml__tree_double(err, pm, "dropout", f, 0, 1, true, &l->p)))
            return st;
        break;
    default:
        break;
    }
    return ML_OK;
}

/* One `- kind: {...}` entry (item: a one-key mapping, checked by the caller). */
static ml_status parse_layer(lctx *c, const ml_node *item, const char *field, ml_layer *l,
                             unsigned depth)
{
    ml_error *err = c->err;
    ml_status st;
    const char *kind = item->keys[0]->text;
    const ml_node *p = item->items[0];
    l->line = item->keys[0]->line;
    l->col = item->keys[0]->col;
    if ((st = layer_kind_of(err, item->keys[0], field, &l->kind)))
        return st;
    l->bias = true;
    l->stride = 1;
    char f[128];
    snprintf(f, sizeof f, "%s.%s", field, kind);
    if (l->kind == ML_L_RESIDUAL)
        return parse_residual(c, p, f, l, depth);
    if (p->type == ML_NODE_SCALAR && p->text[0] == '\0' && p->plain) {
        /* "- relu:" with nothing after it: same as {} */
    } else if ((st = ml__tree_need_map(err, p, f)))
        return st;
    size_t nallowed;
    const char *const *allowed = layer_keys(l->kind, &nallowed);
    if (p->type == ML_NODE_MAP && (st = ml__tree_check_keys(err, p, f, allowed, nallowed)))
        return st;
    const ml_node *pm = p->type == ML_NODE_MAP ? p : NULL;
    double eps = 1e-5;
    if ((st = ml__tree_double(err, pm, "eps", f, 0, 1, false, &eps)))
        return st;
    return parse_values(err, pm, item->keys[0], f, l);
}

/* Room for k more layers in v (zeroed). Doubling: entries after a repeat
 * are appended one by one; c->made bounds what is asked for. */
static bool lvec_reserve(lvec *v, size_t k)
{
    if (v->n + k <= v->cap)
        return true;
    size_t cap = v->n + k > 2 * v->cap ? v->n + k : 2 * v->cap;
    ml_layer *nv = realloc(v->v, cap * sizeof *nv);
    if (!nv)
        return false;
    memset(nv + v->cap, 0, (cap - v->cap) * sizeof *nv);
    v->v = nv;
    v->cap = cap;
    return true;
}

/* Counts one more layer made (at, for the message, is its entry). */
static ml_status count_made(lctx *c, const ml_node *at, const char *field, uint64_t k)
{
    if (k > ML_MAX_LAYERS - c->made)
        return ml__error_at(c->err, at, ML_RANGE,
                            "%s: the model has more than %llu layers (each layer of a residual "
                            "group and of every repeat copy counts); use fewer layers",
                            field, (unsigned long long)ML_MAX_LAYERS);
    c->made += k;
    return ML_OK;
}

/* A copy of src[0..n) with its own residual lists, or NULL (out of memory,
 * nothing left allocated). */
static ml_layer *layers_clone(const ml_layer *src, size_t n)
{
    ml_layer *d = calloc(n, sizeof *d);
    if (!d)
        return NULL;
    for (size_t i = 0; i < n; i++) {
        d[i] = src[i];
        d[i].body = d[i].shortcut = NULL;
        d[i].nbody = d[i].nshortcut = 0;
        if (src[i].nbody && !(d[i].body = layers_clone(src[i].body, src[i].nbody))) {
            ml__layers_free(d, i);
            return NULL;
        }
        d[i].nbody = src[i].nbody;
        if (src[i].nshortcut &&
            !(d[i].shortcut = layers_clone(src[i].shortcut, src[i].nshortcut))) {
            ml__layers_free(d, i + 1);
            return NULL;
        }
        d[i].nshortcut = src[i].nshortcut;
    }
    return d;
}

/* `- repeat: {times: N, layers: [...]}` (key: the entry's key, p: its
 * value, f names it): the layers are read once (so c->made counts one copy
 * of them, nested repeats expanded), then N copies are appended to v, each
 * exactly as if written out; the N - 1 further copies are counted against
 * ML_MAX_LAYERS before any is made. */
static ml_status parse_repeat(lctx *c, const ml_node *key, const ml_node *p, const char *f,
                              lvec *v, unsigned depth)
{
    ml_error *err = c->err;
    ml_status st;
    char fr[160];
    snprintf(fr, sizeof fr, "%s.repeat", f);
    if (p->type != ML_NODE_MAP)
        return ml__error_at(err, p, ML_SCHEMA,
                            "%s: expected a mapping such as {times: 3, layers: [...]}, got %s", fr,
                            ml__tree_type_name(p));
    static const char *const rk[] = {"times", "layers"};
    if ((st = ml__tree_check_keys(err, p, fr, rk, ML_COUNT(rk))))
        return st;
    const ml_node *ls = ml__tree_get(p, "layers");
    if (!ml__tree_get(p, "times"))
        return ml__error_at(err, key, ML_SCHEMA,
                            "%s.times: missing; write 'times: N' (the number of copies, >= 1)", fr);
    if (!ls)
        return ml__error_at(err, key, ML_SCHEMA,
                            "%s.layers: missing; list the layers to repeat under 'layers:'", fr);
    uint64_t times = 1;
    if ((st = ml__tree_uint(err, p, "times", fr, 1, ML_MAX_LAYERS, &times)))
        return st;
    uint64_t made = c->made;
    ml_layer *one = NULL;
    size_t n = 0;
    char fl[168];
    snprintf(fl, sizeof fl, "%s.layers", fr);
    if ((st = parse_layers(c, ls, fl, &one, &n, depth + 1)))
        return st;
    /* one copy is c->made - made layers; times - 1 more of them (the
     * product is below 2^34: both factors are at most ML_MAX_LAYERS) */
    uint64_t per = c->made - made;
    if (times - 1 > (ML_MAX_LAYERS - c->made) / per) {
        ml__layers_free(one, n);
        return ml__error_at(err, key, ML_RANGE,
                            "%s: %llu copies make %llu layers in all, past the limit of %llu "
                            "(each layer of a residual group and of every copy counts); lower "
                            "'times' or repeat fewer layers",
                            fr, (unsigned long long)times,
                            (unsigned long long)(c->made + (times - 1) * per),
                            (unsigned long long)ML_MAX_LAYERS);
    }
    if (!lvec_reserve(v, (size_t)times * n)) {
        ml__layers_free(one, n);
        return ml__error_at(err, key, ML_NOMEM, "out of memory");
    }
    c->made += (times - 1) * per;
    c->repeated = true;
    for (uint64_t k = 1; k < times; k++) {
        ml_layer *copy = layers_clone(one, n);
        if (!copy) {
            ml__layers_free(one, n);
            return ml__error_at(err, key, ML_NOMEM, "out of memory");
        }
        memcpy(v->v + v->n, copy, n * sizeof *copy);
        v->n += n;
        free(copy);
    }
    memcpy(v->v + v->n, one, n * sizeof *one);
    v->n += n;
    free(one);
    return ML_OK;
}

static ml_status parse_layers(lctx *c, const ml_node *seq, const char *field, ml_layer **out,
                              size_t *nout, unsigned depth)
{
    ml_error *err = c->err;
    if (depth > 16)
        return ml__error_at(err, seq, ML_RANGE,
                            "%s: residual or repeat groups nested deeper than 16", field);
    if (seq->type != ML_NODE_SEQ)
        return ml__error_at(err, seq, ML_SCHEMA,
                            "%s: expected a list of layers ('- kind: {...}' lines), got %s", field,
                            ml__tree_type_name(seq));
    if (seq->count == 0)
        return ml__error_at(err, seq, ML_SCHEMA, "%s: the layer list is empty", field);
    lvec v = {NULL, 0, 0};
    if (!lvec_reserve(&v, seq->count))
        return ml__error_at(err, seq, ML_NOMEM, "out of memory");
    ml_status st = ML_OK;
    for (size_t i = 0; i < seq->count; i++) {
        const ml_node *item = seq->items[i];
        char f[128];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        if (item->type != ML_NODE_MAP || item->count != 1) {
            st = ml__error_at(err, item, ML_SCHEMA,
                              "%s: each layer is a one-key mapping such as '- linear: {out: 10}', "
                              "got %s",
                              f,
                              item->type == ML_NODE_MAP ? "a mapping with several keys"
                                                       : ml__tree_type_name(item));
            break;
        }
        if (strcmp(item->keys[0]->text, "repeat") == 0) {
            if ((st = parse_repeat(c, item->keys[0], item->items[0], f, &v, depth)))
                break;
            continue;
        }
        if ((st = count_made(c, item->keys[0], f, 1)))
            break;
        if (!lvec_reserve(&v, 1)) {
            st = ml__error_at(err, item, ML_NOMEM, "out of memory");
            break;
        }
        /* counted before it is checked: a layer that fails may hold a
         * residual's lists, which the free below releases */
        if ((st = parse_layer(c, item, f, &v.v[v.n++], depth)))
            break;
    }
    if (st) {
        ml__layers_free(v.v, v.n);
        return st;
    }
    *out = v.v;
    *nout = v.n;
    return ML_OK;
}

void ml__layers_free(ml_layer *layers, size_t n)
{
    if (!layers)
        return;
    for (size_t i = 0; i < n; i++) {
        ml__layers_free(layers[i].body, layers[i].nbody);
        ml__layers_free(layers[i].shortcut, layers[i].nshortcut);
    }
    free(layers);
}

ml_status ml__schema_sequential(ml_error *err, const ml_node *mm, ml_model *m)
{
    static const char *const keys[] = {"type", "input", "layers", "loss", "buffers"};
    ml_status st;
    if ((st = ml__tree_check_keys(err, mm, "model", keys, ML_COUNT(keys))) ||
        (st = ml__tree_size_or_zero(err, mm, "buffers", "model", &m->buffers)))
        return st;
    const ml_node *in = ml__tree_get(mm, "input"), *ls = ml__tree_get(mm, "layers");
    if (!in)
        return ml__error_at(err, mm, ML_SCHEMA,
                            "model.input: missing; give the per-sample input shape, "
                            "e.g. [3, 32, 32] or [784]");
    if (in->type != ML_NODE_SEQ || in->count == 0 || in->count > 3)
        return ml__error_at(err, in, ML_SCHEMA,
                            "model.input: expected a list of 1 to 3 sizes such as "
                            "[3, 32, 32]");
    for (size_t i = 0; i < in->count; i++) {
        const ml_node *d = in->items[i];
        char *end = NULL;
        if (d->type != ML_NODE_SCALAR || !isdigit((unsigned char)d->text[0]))
            return ml__error_at(err, d, ML_SCHEMA, "model.input[%zu]: expected a whole number >= 1",
                                i);
        errno = 0;
        unsigned long long v = strtoull(d->text, &end, 10);
        if (*end || errno || v == 0 || v > ML_MAX_TOKENS)
            return ml__error_at(err, d, ML_RANGE,
                                "model.input[%zu]: '%s' is out of range (1 to %llu)", i, d->text,
                                (unsigned long long)ML_MAX_TOKENS);
        m->input[i] = v;
    }
    m->ninput = in->count;
    if (!ls)
        return ml__error_at(err, mm, ML_SCHEMA,
                            "model.layers: missing; list the layers, e.g. "
                            "'- linear: {out: 10}'");
    lctx c = {err, 0, false};
    if ((st = parse_layers(&c, ls, "model.layers", &m->seq, &m->nseq, 0)))
        return st;
    unsigned e = ML_LOSS_CROSS_ENTROPY;
    if ((st = ml__tree_enum(err, mm, "loss", "model", loss_names, ML_COUNT(loss_names), &e)))
        return st;
    m->loss = (ml_loss)e;
    /* shapes */
    ml_shape s;
    memset(&s, 0, sizeof s);
    s.rank = (unsigned)m->ninput;
    for (size_t i = 0; i < m->ninput; i++)
        s.d[i] = m->input[i];
    s.ids = m->seq[0].kind == ML_L_EMBEDDING;
    if (s.ids && s.rank != 1)
        return ml__error_at(err, in, ML_SCHEMA,
                            "model.input: an embedding takes [tokens], got %zu sizes", m->ninput);
    for (size_t i = 0; i < m->nseq; i++) {
        char msg[400];
        const ml_layer *where = NULL;
        ml_shape o;
        if (!ml__shape_step(&m->seq[i], &s, &o, msg, sizeof msg, &where)) {
            err->code = ML_SCHEMA;
            err->line = where->line;
            err->col = where->col;
            snprintf(err->msg, sizeof err->msg, "model.layers[%zu]%s: %s", i,
                     c.repeated ? " (counting repeat copies)" : "", msg);
            return ML_SCHEMA;
        }
        s = o;
    }
    if (m->loss == ML_LOSS_CROSS_ENTROPY && s.rank > 2)
        return ml__error_at(
            err, ml__tree_get(mm, "loss") ? ml__tree_get(mm, "loss") : ls, ML_SCHEMA,
            "model.loss: cross_entropy needs [classes] or [tokens, classes] logits at the "
            "end; add flatten and a linear layer");
    return ML_OK;
}

const char *ml__layer_kind_name(ml_layer_kind k)
{
    return (unsigned)k < ML_L_KIND_COUNT ? layer_names[k] : "?";
}
