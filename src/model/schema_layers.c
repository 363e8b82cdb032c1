/* The layers of a sequential model in a model file: each `- kind: {...}`
 * entry with its keys checked for its kind, residual bodies and shortcuts
 * nested, and the sequence's shapes checked from model.input through to the
 * loss (shape.c). */
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

static ml_status parse_layers(ml_error *err, const ml_node *seq, const char *field, ml_layer **out,
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
        const char *near = ml_closest_name(kind, layer_names, ML_L_KIND_COUNT);
        char list[300];
        ml_join_names(list, sizeof list, layer_names, ML_L_KIND_COUNT);
        if (near)
            return ml_error_at(err, key, ML_SCHEMA,
                               "%s: unknown layer kind '%s'; did you mean '%s'?", field, kind,
                               near);
        return ml_error_at(err, key, ML_SCHEMA,
                           "%s: unknown layer kind '%s'; expected one of: %s", field, kind, list);
    }
    *out = (ml_layer_kind)k;
    return ML_OK;
}

/* A residual group: a list (its body), or {body, shortcut}. f names it. */
static ml_status parse_residual(ml_error *err, const ml_node *p, const char *f, ml_layer *l,
                                unsigned depth)
{
    ml_status st;
    if (p->type == ML_NODE_SEQ)
        return parse_layers(err, p, f, &l->body, &l->nbody, depth + 1);
    if ((st = ml_tree_need_map(err, p, f)))
        return st;
    static const char *const rk[] = {"body", "shortcut"};
    if ((st = ml_tree_check_keys(err, p, f, rk, ML_COUNT(rk))))
        return st;
    const ml_node *body = ml_tree_get(p, "body"), *sc = ml_tree_get(p, "shortcut");
    if (!body)
        return ml_error_at(err, p, ML_SCHEMA,
                           "%s.body: missing; a residual mapping needs 'body:' (a "
                           "list of layers) and optionally 'shortcut:'",
                           f);
    char fb[160];
    snprintf(fb, sizeof fb, "%s.body", f);
    if ((st = parse_layers(err, body, fb, &l->body, &l->nbody, depth + 1)))
        return st;
    if (sc) {
        snprintf(fb, sizeof fb, "%s.shortcut", f);
        if ((st = parse_layers(err, sc, fb, &l->shortcut, &l->nshortcut, depth + 1)))
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
    static const char *const k_drop[] = {"p"};
    static const char *const k_emb[] = {"vocab", "dim"};
    static const char *const k_attn[] = {"heads", "causal", "bias", "dropout"};
    static const char *const k_none[] = {"eps"};
    switch (k) {
    case ML_L_LINEAR: *n = ML_COUNT(k_linear); return k_linear;
    case ML_L_CONV2D: *n = ML_COUNT(k_conv); return k_conv;
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL: *n = ML_COUNT(k_pool); return k_pool;
    case ML_L_DROPOUT: *n = ML_COUNT(k_drop); return k_drop;
    case ML_L_EMBEDDING: *n = ML_COUNT(k_emb); return k_emb;
    case ML_L_ATTENTION: *n = ML_COUNT(k_attn); return k_attn;
    default: *n = ML_COUNT(k_none); return k_none;
    }
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
        if (!ml_tree_get(pm, "out"))
            return ml_error_at(err, key, ML_SCHEMA,
                               "%s.out: missing; %s needs its output %s", f, kind,
                               l->kind == ML_L_LINEAR ? "features (out: N)" : "channels (out: N)");
        if ((st = ml_tree_uint(err, pm, "out", f, 1, ML_MAX_FFN, &l->out)) ||
            (st = ml_tree_bool(err, pm, "bias", f, &l->bias)))
            return st;
        if (l->kind == ML_L_CONV2D) {
            if (!ml_tree_get(pm, "kernel"))
                return ml_error_at(err, key, ML_SCHEMA,
                                   "%s.kernel: missing; conv2d needs "
                                   "'kernel: K'",
                                   f);
            if ((st = ml_tree_uint(err, pm, "kernel", f, 1, 1024, &l->kernel)) ||
                (st = ml_tree_uint(err, pm, "stride", f, 1, 1024, &l->stride)) ||
                (st = ml_tree_uint(err, pm, "padding", f, 0, 1024, &l->padding)))
                return st;
        }
        break;
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL:
        if ((st = ml_tree_bool(err, pm, "global", f, &l->global)))
            return st;
        if (!l->global) {
            if (!ml_tree_get(pm, "kernel"))
                return ml_error_at(err, key, ML_SCHEMA,
                                   "%s.kernel: missing; write 'kernel: K'%s", f,
                                   l->kind == ML_L_AVGPOOL ? " or 'global: true'" : "");
            if ((st = ml_tree_uint(err, pm, "kernel", f, 1, 1024, &l->kernel)))
                return st;
            l->stride = l->kernel;
            if ((st = ml_tree_uint(err, pm, "stride", f, 1, 1024, &l->stride)) ||
                (st = ml_tree_uint(err, pm, "padding", f, 0, 1024, &l->padding)))
                return st;
        }
        break;
    case ML_L_DROPOUT:
        l->p = 0.5; /* torch.nn.Dropout's default */
        if ((st = ml_tree_double(err, pm, "p", f, 0, 1, true, &l->p)))
            return st;
        break;
    case ML_L_EMBEDDING:
        if (!ml_tree_get(pm, "vocab") || !ml_tree_get(pm, "dim"))
            return ml_error_at(err, key, ML_SCHEMA, "%s: needs 'vocab: N' and 'dim: D'", f);
        if ((st = ml_tree_uint(err, pm, "vocab", f, 1, ML_MAX_VOCAB, &l->vocab)) ||
            (st = ml_tree_uint(err, pm, "dim", f, 1, ML_MAX_HIDDEN, &l->dim)))
            return st;
        break;
    case ML_L_ATTENTION:
        if (!ml_tree_get(pm, "heads"))
            return ml_error_at(err, key, ML_SCHEMA,
                               "%s.heads: missing; attention needs 'heads: H'", f);
        if ((st = ml_tree_uint(err, pm, "heads", f, 1, ML_MAX_HIDDEN, &l->heads)) ||
            (st = ml_tree_bool(err, pm, "causal", f, &l->causal)) ||
            (st = ml_tree_bool(err, pm, "bias", f, &l->bias)) ||
            (st = ml_tree_double(err, pm, "dropout", f, 0, 1, true, &l->p)))
            return st;
        break;
    default:
        break;
    }
    return ML_OK;
}

static ml_status parse_layer(ml_error *err, const ml_node *item, const char *field, ml_layer *l,
                             unsigned depth)
{
    ml_status st;
    if (item->type != ML_NODE_MAP || item->count != 1)
        return ml_error_at(
            err, item, ML_SCHEMA,
            "%s: each layer is a one-key mapping such as '- linear: {out: 10}', got %s", field,
            item->type == ML_NODE_MAP ? "a mapping with several keys" : ml_tree_type_name(item));
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
        return parse_residual(err, p, f, l, depth);
    if (p->type == ML_NODE_SCALAR && p->text[0] == '\0' && p->plain) {
        /* "- relu:" with nothing after it: same as {} */
    } else if ((st = ml_tree_need_map(err, p, f)))
        return st;
    size_t nallowed;
    const char *const *allowed = layer_keys(l->kind, &nallowed);
    if (p->type == ML_NODE_MAP && (st = ml_tree_check_keys(err, p, f, allowed, nallowed)))
        return st;
    const ml_node *pm = p->type == ML_NODE_MAP ? p : NULL;
    double eps = 1e-5;
    if ((st = ml_tree_double(err, pm, "eps", f, 0, 1, false, &eps)))
        return st;
    return parse_values(err, pm, item->keys[0], f, l);
}

static ml_status parse_layers(ml_error *err, const ml_node *seq, const char *field, ml_layer **out,
                              size_t *nout, unsigned depth)
{
    if (depth > 16)
        return ml_error_at(err, seq, ML_RANGE, "%s: residual groups nested deeper than 16", field);
    if (seq->type != ML_NODE_SEQ)
        return ml_error_at(err, seq, ML_SCHEMA,
                           "%s: expected a list of layers ('- kind: {...}' lines), got %s", field,
                           ml_tree_type_name(seq));
    if (seq->count == 0)
        return ml_error_at(err, seq, ML_SCHEMA, "%s: the layer list is empty", field);
    ml_layer *ls = calloc(seq->count, sizeof *ls);
    if (!ls)
        return ml_error_at(err, seq, ML_NOMEM, "out of memory");
    for (size_t i = 0; i < seq->count; i++) {
        char f[128];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        ml_status st = parse_layer(err, seq->items[i], f, &ls[i], depth);
        if (st) {
            ml_layers_free(ls, i + 1);
            return st;
        }
    }
    *out = ls;
    *nout = seq->count;
    return ML_OK;
}

void ml_layers_free(ml_layer *layers, size_t n)
{
    if (!layers)
        return;
    for (size_t i = 0; i < n; i++) {
        ml_layers_free(layers[i].body, layers[i].nbody);
        ml_layers_free(layers[i].shortcut, layers[i].nshortcut);
    }
    free(layers);
}

ml_status ml_schema_sequential(ml_error *err, const ml_node *mm, ml_model *m)
{
    static const char *const keys[] = {"type", "input", "layers", "loss"};
    ml_status st;
    if ((st = ml_tree_check_keys(err, mm, "model", keys, ML_COUNT(keys))))
        return st;
    const ml_node *in = ml_tree_get(mm, "input"), *ls = ml_tree_get(mm, "layers");
    if (!in)
        return ml_error_at(err, mm, ML_SCHEMA,
                           "model.input: missing; give the per-sample input shape, "
                           "e.g. [3, 32, 32] or [784]");
    if (in->type != ML_NODE_SEQ || in->count == 0 || in->count > 3)
        return ml_error_at(err, in, ML_SCHEMA,
                           "model.input: expected a list of 1 to 3 sizes such as "
                           "[3, 32, 32]");
    for (size_t i = 0; i < in->count; i++) {
        const ml_node *d = in->items[i];
        char *end = NULL;
        if (d->type != ML_NODE_SCALAR || !isdigit((unsigned char)d->text[0]))
            return ml_error_at(err, d, ML_SCHEMA, "model.input[%zu]: expected a whole number >= 1",
                               i);
        errno = 0;
        unsigned long long v = strtoull(d->text, &end, 10);
        if (*end || errno || v == 0 || v > ML_MAX_TOKENS)
            return ml_error_at(err, d, ML_RANGE,
                               "model.input[%zu]: '%s' is out of range (1 to %llu)", i, d->text,
                               (unsigned long long)ML_MAX_TOKENS);
        m->input[i] = v;
    }
    m->ninput = in->count;
    if (!ls)
        return ml_error_at(err, mm, ML_SCHEMA,
                           "model.layers: missing; list the layers, e.g. "
                           "'- linear: {out: 10}'");
    if ((st = parse_layers(err, ls, "model.layers", &m->seq, &m->nseq, 0)))
        return st;
    unsigned e = ML_LOSS_CROSS_ENTROPY;
    if ((st = ml_tree_enum(err, mm, "loss", "model", loss_names, ML_COUNT(loss_names), &e)))
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
        return ml_error_at(err, in, ML_SCHEMA,
                           "model.input: an embedding takes [tokens], got %zu sizes", m->ninput);
    for (size_t i = 0; i < m->nseq; i++) {
        char msg[400];
        const ml_layer *where = NULL;
        ml_shape o;
        if (!ml_shape_step(&m->seq[i], &s, &o, msg, sizeof msg, &where)) {
            err->code = ML_SCHEMA;
            err->line = where->line;
            err->col = where->col;
            snprintf(err->msg, sizeof err->msg, "model.layers[%zu]: %s", i, msg);
            return ML_SCHEMA;
        }
        s = o;
    }
    if (m->loss == ML_LOSS_CROSS_ENTROPY && s.rank > 2)
        return ml_error_at(
            err, ml_tree_get(mm, "loss") ? ml_tree_get(mm, "loss") : ls, ML_SCHEMA,
            "model.loss: cross_entropy needs [classes] or [tokens, classes] logits at the "
            "end; add flatten and a linear layer");
    return ML_OK;
}

const char *ml_layer_kind_name(ml_layer_kind k)
{
    return (unsigned)k < ML_L_KIND_COUNT ? layer_names[k] : "?";
}
