/* Model file schema: walks the YAML tree, checks every key, type and range,
 * and fills an ml_model. Every message names the field, what was expected
 * and, for unknown keys, the closest valid one. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model_internal.h"
#include "model/shape.h"
#include "model/tree.h"

typedef struct {
    ml_error *err;
} ctx;

#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
static ml_status fail(ctx *c, const ml_node *at, ml_status code, const char *fmt, ...)
{
    c->err->code = code;
    c->err->line = at ? at->line : 0;
    c->err->col = at ? at->col : 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err->msg, sizeof c->err->msg, fmt, ap);
    va_end(ap);
    return code;
}

static size_t edit_distance(const char *a, const char *b)
{
    size_t la = strlen(a), lb = strlen(b);
    if (la > 40 || lb > 40)
        return 99;
    size_t prev[41], cur[41];
    for (size_t j = 0; j <= lb; j++)
        prev[j] = j;
    for (size_t i = 1; i <= la; i++) {
        cur[0] = i;
        for (size_t j = 1; j <= lb; j++) {
            size_t sub = prev[j - 1] + (a[i - 1] != b[j - 1]);
            size_t del = prev[j] + 1, ins = cur[j - 1] + 1;
            cur[j] = sub < del ? (sub < ins ? sub : ins) : (del < ins ? del : ins);
        }
        memcpy(prev, cur, sizeof prev);
    }
    return prev[lb];
}

/* The closest valid name, or NULL when nothing is close. */
static const char *closest(const char *s, const char *const *names, size_t n)
{
    const char *best = NULL;
    size_t bd = 3;
    for (size_t i = 0; i < n; i++) {
        size_t d = edit_distance(s, names[i]);
        if (d < bd || (strncmp(s, names[i], strlen(s)) == 0 && strlen(s) >= 3 && d < 99)) {
            if (d < bd || !best) {
                bd = d;
                best = names[i];
            }
        }
    }
    return best;
}

static void join(char *buf, size_t size, const char *const *names, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%s", i ? ", " : "", names[i]);
}

#define COUNT(a) (sizeof(a) / sizeof((a)[0]))

static const char *type_name(const ml_node *n)
{
    return n->type == ML_NODE_MAP ? "a mapping" : n->type == ML_NODE_SEQ ? "a list" : "a scalar";
}

static ml_status need_map(ctx *c, const ml_node *n, const char *field)
{
    if (n->type != ML_NODE_MAP)
        return fail(c, n, ML_SCHEMA, "%s: expected a mapping (key: value lines), got %s", field,
                     type_name(n));
    return ML_OK;
}

/* Rejects unknown and repeated keys. */
static ml_status check_keys(ctx *c, const ml_node *map, const char *field,
                            const char *const *allowed, size_t n)
{
    for (size_t i = 0; i < map->count; i++) {
        const char *k = map->keys[i]->text;
        size_t j;
        for (j = 0; j < n; j++)
            if (strcmp(k, allowed[j]) == 0)
                break;
        if (j == n) {
            const char *near = closest(k, allowed, n);
            if (near)
                return fail(c, map->keys[i], ML_SCHEMA, "%s.%s: unknown key; did you mean '%s'?",
                             field, k, near);
            char list[400];
            join(list, sizeof list, allowed, n);
            return fail(c, map->keys[i], ML_SCHEMA, "%s.%s: unknown key; valid keys: %s", field, k,
                         list);
        }
        for (size_t p = 0; p < i; p++)
            if (strcmp(k, map->keys[p]->text) == 0)
                return fail(c, map->keys[i], ML_SCHEMA, "%s.%s: key given twice (first at line %u)",
                             field, k, map->keys[p]->line);
    }
    return ML_OK;
}

static const ml_node *get(const ml_node *map, const char *key)
{
    if (!map || map->type != ML_NODE_MAP)
        return NULL;
    for (size_t i = 0; i < map->count; i++)
        if (strcmp(map->keys[i]->text, key) == 0)
            return map->items[i];
    return NULL;
}

static ml_status need_scalar(ctx *c, const ml_node *n, const char *field, const char *what)
{
    if (n->type != ML_NODE_SCALAR)
        return fail(c, n, ML_SCHEMA, "%s: expected %s, got %s", field, what, type_name(n));
    return ML_OK;
}

/* Whole number in [lo, hi]. */
static ml_status get_uint(ctx *c, const ml_node *map, const char *key, const char *parent,
                          uint64_t lo, uint64_t hi, uint64_t *out)
{
    const ml_node *n = get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = need_scalar(c, n, field, "a whole number");
    if (st)
        return st;
    const char *s = n->text;
    if (!n->plain || !*s)
        return fail(c, n, ML_SCHEMA, "%s: expected a whole number, got '%s'", field, s);
    if (s[0] == '-' && isdigit((unsigned char)s[1]))
        return fail(c, n, ML_RANGE, "%s: %s is negative; expected a whole number >= %llu", field, s,
                    (unsigned long long)lo);
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p))
            return fail(c, n, ML_SCHEMA, "%s: expected a whole number, got '%s'", field, s);
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE || v > hi)
        return fail(c, n, ML_RANGE, "%s: %s is too large; the limit is %llu", field, s,
                    (unsigned long long)hi);
    if (v < lo)
        return fail(c, n, ML_RANGE, "%s: %s is too small; expected a whole number >= %llu", field,
                    s, (unsigned long long)lo);
    *out = v;
    return ML_OK;
}

static ml_status get_double(ctx *c, const ml_node *map, const char *key, const char *parent,
                            double lo, double hi, bool hi_open, double *out)
{
    const ml_node *n = get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = need_scalar(c, n, field, "a number");
    if (st)
        return st;
    char *end = NULL;
    errno = 0;
    double v = strtod(n->text, &end);
    if (!n->plain || end == n->text || *end || errno == ERANGE || !isfinite(v))
        return fail(c, n, ML_SCHEMA, "%s: expected a number, got '%s'", field, n->text);
    if (v < lo || v > hi || (hi_open && v >= hi))
        return fail(c, n, ML_RANGE, "%s: %s is out of range; expected %g <= value %s %g", field,
                    n->text, lo, hi_open ? "<" : "<=", hi);
    *out = v;
    return ML_OK;
}

static ml_status get_bool(ctx *c, const ml_node *map, const char *key, const char *parent,
                          bool *out)
{
    const ml_node *n = get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = need_scalar(c, n, field, "true or false");
    if (st)
        return st;
    if (n->plain && (!strcmp(n->text, "true") || !strcmp(n->text, "True")))
        *out = true;
    else if (n->plain && (!strcmp(n->text, "false") || !strcmp(n->text, "False")))
        *out = false;
    else
        return fail(c, n, ML_SCHEMA, "%s: expected true or false, got '%s'", field, n->text);
    return ML_OK;
}

/* One of names[]; *out is the index. */
static ml_status get_enum(ctx *c, const ml_node *map, const char *key, const char *parent,
                          const char *const *names, size_t count, unsigned *out)
{
    const ml_node *n = get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = need_scalar(c, n, field, "a name");
    if (st)
        return st;
    for (size_t i = 0; i < count; i++)
        if (strcmp(n->text, names[i]) == 0) {
            *out = (unsigned)i;
            return ML_OK;
        }
    char list[300];
    join(list, sizeof list, names, count);
    const char *near = closest(n->text, names, count);
    if (near)
        return fail(c, n, ML_SCHEMA, "%s: unknown value '%s'; did you mean '%s'? (one of: %s)",
                    field, n->text, near, list);
    return fail(c, n, ML_SCHEMA, "%s: unknown value '%s'; expected one of: %s", field, n->text,
                list);
}

static ml_status get_size(ctx *c, const ml_node *map, const char *key, const char *parent,
                          uint64_t *out)
{
    const ml_node *n = get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = need_scalar(c, n, field, "a size such as 8GiB");
    if (st)
        return st;
    ml_error e;
    memset(&e, 0, sizeof e);
    st = ml_parse_size(n->text, out, &e);
    if (st)
        return fail(c, n, st == ML_USAGE ? ML_SCHEMA : st, "%s: %s", field, e.msg);
    return ML_OK;
}

/* ---- limits: keep every product representable (docs/robustness in ledger.md) */
#define MAX_LAYERS 100000ull
#define MAX_HIDDEN (1ull << 20)
#define MAX_FFN (1ull << 24)
#define MAX_VOCAB (1ull << 28)
#define MAX_TOKENS (1ull << 28)
#define MAX_BATCH (1ull << 24)

static const char *const act_names[] = {"gelu", "relu", "swiglu"};
static const char *const norm_names[] = {"layernorm", "rmsnorm"};
static const char *const normpos_names[] = {"pre", "post"};
static const char *const pos_names[] = {"learned", "rope", "none"};
static const char *const attn_names[] = {"eager", "flash", "sdpa"};
static const char *const type_names[] = {"decoder", "encoder", "sequential"};
static const char *const loss_names[] = {"cross_entropy", "mse"};
static const char *const layer_names[ML_L_KIND_COUNT] = {
    "linear", "conv2d",  "batchnorm", "layernorm", "relu",     "gelu",      "silu",
    "dropout", "maxpool", "avgpool",   "flatten",   "residual", "embedding", "attention"};

static ml_status parse_layers(ctx *c, const ml_node *seq, const char *field, ml_layer **out,
                              size_t *nout, unsigned depth);

static ml_status parse_layer(ctx *c, const ml_node *item, const char *field, ml_layer *l,
                             unsigned depth)
{
    ml_status st;
    if (item->type != ML_NODE_MAP || item->count != 1)
        return fail(c, item, ML_SCHEMA,
                    "%s: each layer is a one-key mapping such as '- linear: {out: 10}', got %s",
                    field, item->type == ML_NODE_MAP ? "a mapping with several keys" : type_name(item));
    const char *kind = item->keys[0]->text;
    const ml_node *p = item->items[0];
    l->line = item->keys[0]->line;
    l->col = item->keys[0]->col;
    unsigned k;
    for (k = 0; k < ML_L_KIND_COUNT; k++)
        if (strcmp(kind, layer_names[k]) == 0)
            break;
    if (k == ML_L_KIND_COUNT) {
        const char *near = closest(kind, layer_names, ML_L_KIND_COUNT);
        char list[300];
        join(list, sizeof list, layer_names, ML_L_KIND_COUNT);
        if (near)
            return fail(c, item->keys[0], ML_SCHEMA,
                        "%s: unknown layer kind '%s'; did you mean '%s'?", field, kind, near);
        return fail(c, item->keys[0], ML_SCHEMA, "%s: unknown layer kind '%s'; expected one of: %s",
                    field, kind, list);
    }
    l->kind = (ml_layer_kind)k;
    l->bias = true;
    l->stride = 1;
    char f[128];
    snprintf(f, sizeof f, "%s.%s", field, kind);
    if (l->kind == ML_L_RESIDUAL) {
        if (p->type == ML_NODE_SEQ)
            return parse_layers(c, p, f, &l->body, &l->nbody, depth + 1);
        if ((st = need_map(c, p, f)))
            return st;
        static const char *const rk[] = {"body", "shortcut"};
        if ((st = check_keys(c, p, f, rk, COUNT(rk))))
            return st;
        const ml_node *body = get(p, "body"), *sc = get(p, "shortcut");
        if (!body)
            return fail(c, p, ML_SCHEMA, "%s.body: missing; a residual mapping needs 'body:' (a "
                        "list of layers) and optionally 'shortcut:'", f);
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
    if (p->type == ML_NODE_SCALAR && p->text[0] == '\0' && p->plain) {
        /* "- relu:" with nothing after it: same as {} */
    } else if ((st = need_map(c, p, f)))
        return st;
    static const char *const k_linear[] = {"out", "bias"};
    static const char *const k_conv[] = {"out", "kernel", "stride", "padding", "bias"};
    static const char *const k_pool[] = {"kernel", "stride", "padding", "global"};
    static const char *const k_drop[] = {"p"};
    static const char *const k_emb[] = {"vocab", "dim"};
    static const char *const k_attn[] = {"heads", "causal", "bias", "dropout"};
    static const char *const k_none[] = {"eps"};
    const char *const *allowed = k_none;
    size_t nallowed = COUNT(k_none);
    switch (l->kind) {
    case ML_L_LINEAR: allowed = k_linear; nallowed = COUNT(k_linear); break;
    case ML_L_CONV2D: allowed = k_conv; nallowed = COUNT(k_conv); break;
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL: allowed = k_pool; nallowed = COUNT(k_pool); break;
    case ML_L_DROPOUT: allowed = k_drop; nallowed = COUNT(k_drop); break;
    case ML_L_EMBEDDING: allowed = k_emb; nallowed = COUNT(k_emb); break;
    case ML_L_ATTENTION: allowed = k_attn; nallowed = COUNT(k_attn); break;
    default: break;
    }
    if (p->type == ML_NODE_MAP && (st = check_keys(c, p, f, allowed, nallowed)))
        return st;
    const ml_node *pm = p->type == ML_NODE_MAP ? p : NULL;
    double eps = 1e-5;
    if ((st = get_double(c, pm, "eps", f, 0, 1, false, &eps)))
        return st;
    switch (l->kind) {
    case ML_L_LINEAR:
    case ML_L_CONV2D:
        if (!get(pm, "out"))
            return fail(c, item->keys[0], ML_SCHEMA, "%s.out: missing; %s needs its output %s",
                        f, kind, l->kind == ML_L_LINEAR ? "features (out: N)" : "channels (out: N)");
        if ((st = get_uint(c, pm, "out", f, 1, MAX_FFN, &l->out)) ||
            (st = get_bool(c, pm, "bias", f, &l->bias)))
            return st;
        if (l->kind == ML_L_CONV2D) {
            if (!get(pm, "kernel"))
                return fail(c, item->keys[0], ML_SCHEMA, "%s.kernel: missing; conv2d needs "
                            "'kernel: K'", f);
            if ((st = get_uint(c, pm, "kernel", f, 1, 1024, &l->kernel)) ||
                (st = get_uint(c, pm, "stride", f, 1, 1024, &l->stride)) ||
                (st = get_uint(c, pm, "padding", f, 0, 1024, &l->padding)))
                return st;
        }
        break;
    case ML_L_MAXPOOL:
    case ML_L_AVGPOOL:
        if ((st = get_bool(c, pm, "global", f, &l->global)))
            return st;
        if (!l->global) {
            if (!get(pm, "kernel"))
                return fail(c, item->keys[0], ML_SCHEMA, "%s.kernel: missing; write 'kernel: K'%s",
                            f, l->kind == ML_L_AVGPOOL ? " or 'global: true'" : "");
            if ((st = get_uint(c, pm, "kernel", f, 1, 1024, &l->kernel)))
                return st;
            l->stride = l->kernel;
            if ((st = get_uint(c, pm, "stride", f, 1, 1024, &l->stride)) ||
                (st = get_uint(c, pm, "padding", f, 0, 1024, &l->padding)))
                return st;
        }
        break;
    case ML_L_DROPOUT:
        l->p = 0.5; /* torch.nn.Dropout's default */
        if ((st = get_double(c, pm, "p", f, 0, 1, true, &l->p)))
            return st;
        break;
    case ML_L_EMBEDDING:
        if (!get(pm, "vocab") || !get(pm, "dim"))
            return fail(c, item->keys[0], ML_SCHEMA, "%s: needs 'vocab: N' and 'dim: D'", f);
        if ((st = get_uint(c, pm, "vocab", f, 1, MAX_VOCAB, &l->vocab)) ||
            (st = get_uint(c, pm, "dim", f, 1, MAX_HIDDEN, &l->dim)))
            return st;
        break;
    case ML_L_ATTENTION:
        if (!get(pm, "heads"))
            return fail(c, item->keys[0], ML_SCHEMA, "%s.heads: missing; attention needs 'heads: H'",
                        f);
        if ((st = get_uint(c, pm, "heads", f, 1, MAX_HIDDEN, &l->heads)) ||
            (st = get_bool(c, pm, "causal", f, &l->causal)) ||
            (st = get_bool(c, pm, "bias", f, &l->bias)) ||
            (st = get_double(c, pm, "dropout", f, 0, 1, true, &l->p)))
            return st;
        break;
    default:
        break;
    }
    return ML_OK;
}

static ml_status parse_layers(ctx *c, const ml_node *seq, const char *field, ml_layer **out,
                              size_t *nout, unsigned depth)
{
    if (depth > 16)
        return fail(c, seq, ML_RANGE, "%s: residual groups nested deeper than 16", field);
    if (seq->type != ML_NODE_SEQ)
        return fail(c, seq, ML_SCHEMA, "%s: expected a list of layers ('- kind: {...}' lines), got %s",
                    field, type_name(seq));
    if (seq->count == 0)
        return fail(c, seq, ML_SCHEMA, "%s: the layer list is empty", field);
    ml_layer *ls = calloc(seq->count, sizeof *ls);
    if (!ls)
        return fail(c, seq, ML_NOMEM, "out of memory");
    for (size_t i = 0; i < seq->count; i++) {
        char f[128];
        snprintf(f, sizeof f, "%s[%zu]", field, i);
        ml_status st = parse_layer(c, seq->items[i], f, &ls[i], depth);
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

static ml_status parse_transformer(ctx *c, const ml_node *mm, ml_model *m)
{
    static const char *const keys[] = {
        "type", "layers", "hidden", "heads", "kv_heads", "ffn", "activation", "norm",
        "norm_position", "vocab", "position", "max_positions", "tied_embeddings", "bias",
        "attention", "dropout", "classes", "pooler", "token_types", "image_size", "patch_size",
        "channels", "qkv_bias", "parallel_residual"};
    ml_status st;
    if ((st = check_keys(c, mm, "model", keys, COUNT(keys))))
        return st;
    const bool enc = m->type == ML_MODEL_ENCODER;
    const char *req[] = {"layers", "hidden", "heads"};
    for (size_t i = 0; i < COUNT(req); i++)
        if (!get(mm, req[i]))
            return fail(c, mm, ML_SCHEMA, "model.%s: missing; a %s needs layers, hidden and heads",
                        req[i], enc ? "encoder" : "decoder");
    if ((st = get_uint(c, mm, "layers", "model", 1, MAX_LAYERS, &m->layers)) ||
        (st = get_uint(c, mm, "hidden", "model", 1, MAX_HIDDEN, &m->hidden)) ||
        (st = get_uint(c, mm, "heads", "model", 1, MAX_HIDDEN, &m->heads)))
        return st;
    if (m->hidden % m->heads)
        return fail(c, get(mm, "heads"), ML_SCHEMA,
                    "model.heads: %llu does not divide hidden (%llu)",
                    (unsigned long long)m->heads, (unsigned long long)m->hidden);
    m->kv_heads = m->heads;
    if ((st = get_uint(c, mm, "kv_heads", "model", 1, MAX_HIDDEN, &m->kv_heads)))
        return st;
    if (m->kv_heads > m->heads || m->heads % m->kv_heads)
        return fail(c, get(mm, "kv_heads"), ML_SCHEMA,
                    "model.kv_heads: %llu does not divide heads (%llu)",
                    (unsigned long long)m->kv_heads, (unsigned long long)m->heads);
    m->ffn = 4 * m->hidden;
    unsigned e;
    m->activation = ML_ACT_GELU;
    m->norm = ML_NORM_LAYERNORM;
    m->position = ML_POS_LEARNED;
    m->attention = ML_ATTN_EAGER;
    m->bias = true;
    m->tied_embeddings = !enc;
    m->prenorm = !enc;
    if ((st = get_uint(c, mm, "ffn", "model", 1, MAX_FFN, &m->ffn)))
        return st;
    e = m->activation;
    if ((st = get_enum(c, mm, "activation", "model", act_names, COUNT(act_names), &e)))
        return st;
    m->activation = (ml_activation)e;
    e = m->norm;
    if ((st = get_enum(c, mm, "norm", "model", norm_names, COUNT(norm_names), &e)))
        return st;
    m->norm = (ml_norm)e;
    e = m->prenorm ? 0 : 1;
    if ((st = get_enum(c, mm, "norm_position", "model", normpos_names, 2, &e)))
        return st;
    m->prenorm = e == 0;
    e = m->position;
    if ((st = get_enum(c, mm, "position", "model", pos_names, COUNT(pos_names), &e)))
        return st;
    m->position = (ml_position)e;
    e = m->attention;
    if ((st = get_enum(c, mm, "attention", "model", attn_names, COUNT(attn_names), &e)))
        return st;
    m->attention = (ml_attention)e;
    if ((st = get_bool(c, mm, "tied_embeddings", "model", &m->tied_embeddings)) ||
        (st = get_bool(c, mm, "bias", "model", &m->bias)) ||
        (st = get_double(c, mm, "dropout", "model", 0, 1, true, &m->dropout)) ||
        (st = get_uint(c, mm, "vocab", "model", 1, MAX_VOCAB, &m->vocab)) ||
        (st = get_uint(c, mm, "max_positions", "model", 1, MAX_TOKENS, &m->max_positions)) ||
        (st = get_uint(c, mm, "classes", "model", 1, MAX_VOCAB, &m->classes)) ||
        (st = get_uint(c, mm, "token_types", "model", 1, 1u << 16, &m->token_types)) ||
        (st = get_uint(c, mm, "image_size", "model", 1, 1u << 16, &m->image_size)) ||
        (st = get_uint(c, mm, "patch_size", "model", 1, 1u << 16, &m->patch_size)) ||
        (st = get_uint(c, mm, "channels", "model", 1, 1u << 16, &m->channels)))
        return st;
    m->pooler = enc && m->image_size == 0;
    m->qkv_bias = m->bias;
    if ((st = get_bool(c, mm, "pooler", "model", &m->pooler)) ||
        (st = get_bool(c, mm, "qkv_bias", "model", &m->qkv_bias)) ||
        (st = get_bool(c, mm, "parallel_residual", "model", &m->parallel_residual)))
        return st;
    if (m->parallel_residual && !m->prenorm)
        return fail(c, get(mm, "parallel_residual"), ML_SCHEMA,
                    "model.parallel_residual: needs norm_position: pre");
    if (m->image_size) {
        if (!enc)
            return fail(c, get(mm, "image_size"), ML_SCHEMA,
                        "model.image_size: image inputs are for encoders (type: encoder)");
        if (!m->patch_size)
            return fail(c, get(mm, "image_size"), ML_SCHEMA,
                        "model.patch_size: missing; an image encoder needs patch_size");
        if (m->image_size % m->patch_size)
            return fail(c, get(mm, "patch_size"), ML_SCHEMA,
                        "model.patch_size: %llu does not divide image_size (%llu)",
                        (unsigned long long)m->patch_size, (unsigned long long)m->image_size);
        if (!m->channels)
            m->channels = 3;
        if (m->vocab)
            return fail(c, get(mm, "vocab"), ML_SCHEMA,
                        "model.vocab: an image encoder has no vocabulary; remove vocab");
    } else if (!m->vocab) {
        return fail(c, mm, ML_SCHEMA, "model.vocab: missing; a %s needs its vocabulary size",
                    enc ? "text encoder" : "decoder");
    }
    if (enc && !m->classes)
        return fail(c, mm, ML_SCHEMA, "model.classes: missing; an encoder is planned as a "
                    "classifier and needs 'classes: N'");
    if (!enc && (m->classes || m->token_types || get(mm, "pooler")))
        return fail(c, get(mm, "classes") ? get(mm, "classes")
                       : get(mm, "token_types") ? get(mm, "token_types") : get(mm, "pooler"),
                    ML_SCHEMA, "model: classes, pooler and token_types are encoder keys "
                    "(type: encoder)");
    if (m->position == ML_POS_LEARNED && !m->max_positions && !m->image_size)
        return fail(c, mm, ML_SCHEMA, "model.max_positions: missing; learned positions need "
                    "max_positions (or set position: rope or none)");
    if (m->position == ML_POS_ROPE && (m->hidden / m->heads) % 2)
        return fail(c, get(mm, "position"), ML_SCHEMA,
                    "model.position: rope needs an even head size, hidden/heads = %llu",
                    (unsigned long long)(m->hidden / m->heads));
    return ML_OK;
}

static ml_status parse_sequential(ctx *c, const ml_node *mm, ml_model *m)
{
    static const char *const keys[] = {"type", "input", "layers", "loss"};
    ml_status st;
    if ((st = check_keys(c, mm, "model", keys, COUNT(keys))))
        return st;
    const ml_node *in = get(mm, "input"), *ls = get(mm, "layers");
    if (!in)
        return fail(c, mm, ML_SCHEMA, "model.input: missing; give the per-sample input shape, "
                    "e.g. [3, 32, 32] or [784]");
    if (in->type != ML_NODE_SEQ || in->count == 0 || in->count > 3)
        return fail(c, in, ML_SCHEMA, "model.input: expected a list of 1 to 3 sizes such as "
                    "[3, 32, 32]");
    for (size_t i = 0; i < in->count; i++) {
        const ml_node *d = in->items[i];
        char *end = NULL;
        if (d->type != ML_NODE_SCALAR || !isdigit((unsigned char)d->text[0]))
            return fail(c, d, ML_SCHEMA, "model.input[%zu]: expected a whole number >= 1", i);
        errno = 0;
        unsigned long long v = strtoull(d->text, &end, 10);
        if (*end || errno || v == 0 || v > MAX_TOKENS)
            return fail(c, d, ML_RANGE, "model.input[%zu]: '%s' is out of range (1 to %llu)", i,
                        d->text, (unsigned long long)MAX_TOKENS);
        m->input[i] = v;
    }
    m->ninput = in->count;
    if (!ls)
        return fail(c, mm, ML_SCHEMA, "model.layers: missing; list the layers, e.g. "
                    "'- linear: {out: 10}'");
    if ((st = parse_layers(c, ls, "model.layers", &m->seq, &m->nseq, 0)))
        return st;
    unsigned e = ML_LOSS_CROSS_ENTROPY;
    if ((st = get_enum(c, mm, "loss", "model", loss_names, COUNT(loss_names), &e)))
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
        return fail(c, in, ML_SCHEMA, "model.input: an embedding takes [tokens], got %zu sizes",
                    m->ninput);
    for (size_t i = 0; i < m->nseq; i++) {
        char msg[400];
        const ml_layer *where = NULL;
        ml_shape o;
        if (!ml_shape_step(&m->seq[i], &s, &o, msg, sizeof msg, &where)) {
            c->err->code = ML_SCHEMA;
            c->err->line = where->line;
            c->err->col = where->col;
            snprintf(c->err->msg, sizeof c->err->msg, "model.layers[%zu]: %s", i, msg);
            return ML_SCHEMA;
        }
        s = o;
    }
    if (m->loss == ML_LOSS_CROSS_ENTROPY && s.rank > 2)
        return fail(c, get(mm, "loss") ? get(mm, "loss") : ls, ML_SCHEMA,
                    "model.loss: cross_entropy needs [classes] or [tokens, classes] logits at the "
                    "end; add flatten and a linear layer");
    return ML_OK;
}

static ml_status parse_training(ctx *c, const ml_node *t, ml_model *m)
{
    static const char *const keys[] = {"micro_batch",    "seq_len",       "grad_accum",
                                       "precision",      "optimizer",     "optimizer_impl",
                                       "checkpoint",     "data_parallel", "zero",
                                       "offload",        "reduce_bucket_size",
                                       "allgather_bucket_size"};
    ml_status st;
    if ((st = need_map(c, t, "training")) || (st = check_keys(c, t, "training", keys, COUNT(keys))))
        return st;
    ml_training *tr = &m->config.training;
    if ((st = get_uint(c, t, "micro_batch", "training", 1, MAX_BATCH, &tr->micro_batch)) ||
        (st = get_uint(c, t, "seq_len", "training", 1, MAX_TOKENS, &tr->seq_len)) ||
        (st = get_uint(c, t, "grad_accum", "training", 1, 1u << 20, &tr->grad_accum)) ||
        (st = get_uint(c, t, "data_parallel", "training", 1, 1u << 20, &tr->data_parallel)) ||
        (st = get_uint(c, t, "reduce_bucket_size", "training", 1, 1ull << 40, &tr->reduce_bucket)) ||
        (st = get_uint(c, t, "allgather_bucket_size", "training", 1, 1ull << 40,
                       &tr->allgather_bucket)))
        return st;
    uint64_t zero = tr->zero;
    if ((st = get_uint(c, t, "zero", "training", 0, 3, &zero)))
        return st;
    tr->zero = (unsigned)zero;
    static const char *const offl[] = {"none", "optimizer", "params"};
    unsigned eo = tr->offload;
    if ((st = get_enum(c, t, "offload", "training", offl, COUNT(offl), &eo)))
        return st;
    tr->offload = (ml_offload)eo;
    if (tr->offload == ML_OFFLOAD_PARAMS && tr->zero != 3)
        return fail(c, get(t, "offload"), ML_SCHEMA,
                    "training.offload: params offload needs zero: 3 (parameters sharded and "
                    "gathered per block)");
    static const char *const prec[] = {"fp32", "amp-bf16", "amp-fp16", "bf16-master",
                                       "fp16-master", "bf16"};
    static const char *const opt[] = {"sgd", "sgd-momentum", "adam", "adamw",
                                      "adafactor", "adam-8bit", "lion"};
    static const char *const impl[] = {"for-loop", "foreach", "fused"};
    unsigned e = tr->precision;
    if ((st = get_enum(c, t, "precision", "training", prec, COUNT(prec), &e)))
        return st;
    tr->precision = (ml_precision)e;
    e = tr->optimizer;
    if ((st = get_enum(c, t, "optimizer", "training", opt, COUNT(opt), &e)))
        return st;
    tr->optimizer = (ml_optimizer)e;
    e = tr->optimizer_impl;
    if ((st = get_enum(c, t, "optimizer_impl", "training", impl, COUNT(impl), &e)))
        return st;
    tr->optimizer_impl = (ml_optimizer_impl)e;
    const ml_node *ck = get(t, "checkpoint");
    if (ck) {
        ml_error e2;
        memset(&e2, 0, sizeof e2);
        if (ck->type == ML_NODE_SEQ) {
            ml_checkpoint cp;
            memset(&cp, 0, sizeof cp);
            cp.kind = ML_CKPT_LIST;
            if (ck->count > ML_CKPT_LIST_MAX)
                return fail(c, ck, ML_RANGE, "training.checkpoint: more than %u blocks listed",
                            ML_CKPT_LIST_MAX);
            for (size_t i = 0; i < ck->count; i++) {
                const ml_node *d = ck->items[i];
                char *end = NULL;
                if (d->type != ML_NODE_SCALAR || !isdigit((unsigned char)d->text[0]))
                    return fail(c, d, ML_SCHEMA, "training.checkpoint[%zu]: expected a block "
                                "index (a whole number)", i);
                errno = 0;
                unsigned long long v = strtoull(d->text, &end, 10);
                if (*end || errno || v >= 0xffffffffull)
                    return fail(c, d, ML_SCHEMA, "training.checkpoint[%zu]: '%s' is not a block "
                                "index", i, d->text);
                cp.blocks[cp.count++] = (uint32_t)v;
            }
            tr->checkpoint = cp;
        } else {
            if ((st = need_scalar(c, ck, "training.checkpoint", "a policy name")))
                return st;
            if ((st = ml_parse_checkpoint(ck->text, &tr->checkpoint, &e2)))
                return fail(c, ck, ML_SCHEMA, "training.%s", e2.msg);
        }
    }
    return ML_OK;
}

static ml_status parse_device(ctx *c, const ml_node *d, ml_model *m)
{
    static const char *const keys[] = {"memory", "budget", "runtime_reserve", "peak_tflops",
                                       "efficiency", "fragmentation"};
    ml_status st;
    if ((st = need_map(c, d, "device")) || (st = check_keys(c, d, "device", keys, COUNT(keys))))
        return st;
    ml_device *dv = &m->config.device;
    if (!get(d, "memory"))
        return fail(c, d, ML_SCHEMA, "device.memory: missing; give the device capacity, e.g. "
                    "'memory: 8GiB'");
    dv->present = true;
    if ((st = get_size(c, d, "memory", "device", &dv->memory)) ||
        (st = get_size(c, d, "budget", "device", &dv->budget)) ||
        (st = get_size(c, d, "runtime_reserve", "device", &dv->runtime_reserve)) ||
        (st = get_double(c, d, "peak_tflops", "device", 0, 1e9, false, &dv->peak_tflops)) ||
        (st = get_double(c, d, "efficiency", "device", 1e-6, 1, false, &dv->efficiency)) ||
        (st = get_double(c, d, "fragmentation", "device", 0, 1, false, &dv->fragmentation)))
        return st;
    if (dv->budget > dv->memory)
        return fail(c, get(d, "budget"), ML_RANGE, "device.budget: %s is above device.memory",
                    get(d, "budget")->text);
    if (dv->runtime_reserve >= dv->memory)
        return fail(c, get(d, "runtime_reserve") ? get(d, "runtime_reserve") : get(d, "memory"),
                    ML_RANGE, "device.runtime_reserve: %s is not below device.memory; set "
                    "runtime_reserve to what the CUDA context and libraries take on this device",
                    get(d, "runtime_reserve") ? "the reserve" : "the default reserve of 512MiB");
    return ML_OK;
}

static ml_status build(ctx *c, const ml_node *root, ml_model *m)
{
    ml_status st;
    if (!root)
        return fail(c, NULL, ML_SCHEMA, "the file is empty: expected a mapping with 'name:', "
                    "'model:' and optionally 'training:' and 'device:'");
    if (root->type != ML_NODE_MAP)
        return fail(c, root, ML_SCHEMA, "top level: expected a mapping with 'name:' and 'model:', "
                    "got %s", type_name(root));
    static const char *const keys[] = {"name", "model", "training", "device"};
    if ((st = check_keys(c, root, "top level", keys, COUNT(keys))))
        return st;
    const ml_node *name = get(root, "name"), *mm = get(root, "model");
    if (name) {
        if ((st = need_scalar(c, name, "name", "a string")))
            return st;
        snprintf(m->name, sizeof m->name, "%s", name->text);
    }
    if (!mm)
        return fail(c, root, ML_SCHEMA, "model: missing; the file needs a 'model:' section");
    if ((st = need_map(c, mm, "model")))
        return st;
    if (!get(mm, "type"))
        return fail(c, mm, ML_SCHEMA, "model.type: missing; expected decoder, encoder or "
                    "sequential");
    unsigned e = 0;
    if ((st = get_enum(c, mm, "type", "model", type_names, COUNT(type_names), &e)))
        return st;
    m->type = (ml_model_type)e;
    m->config = ml_config_defaults();
    if (m->type == ML_MODEL_SEQUENTIAL)
        st = parse_sequential(c, mm, m);
    else
        st = parse_transformer(c, mm, m);
    if (st)
        return st;
    /* sensible per-model defaults before training: overrides them */
    if (m->type != ML_MODEL_SEQUENTIAL) {
        if (m->image_size) {
            uint64_t g = m->image_size / m->patch_size;
            m->config.training.seq_len = g * g + 1;
        } else if (m->max_positions) {
            m->config.training.seq_len = m->max_positions;
        } else {
            m->config.training.seq_len = 2048;
        }
    }
    const ml_node *t = get(root, "training"), *d = get(root, "device");
    if (t && (st = parse_training(c, t, m)))
        return st;
    if (d && (st = parse_device(c, d, m)))
        return st;
    return ML_OK;
}

ml_status ml_schema_settings(const char *text, size_t len, const char *path, ml_model *m,
                             ml_error *err)
{
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", path);
    ml_node *root = NULL;
    ml_status st = ml_tree_parse(text, len, &root, err);
    if (st)
        return st;
    ctx c = {err};
    static const char *const keys[] = {"name", "training", "device"};
    if (!root)
        st = fail(&c, NULL, ML_SCHEMA, "the file is empty: expected training: and device: sections");
    else if (root->type != ML_NODE_MAP)
        st = fail(&c, root, ML_SCHEMA, "top level: expected a mapping with training: and device:");
    else if (!(st = check_keys(&c, root, "top level", keys, COUNT(keys)))) {
        const ml_node *t = get(root, "training"), *d = get(root, "device"), *n = get(root, "name");
        if (n && n->type == ML_NODE_SCALAR)
            snprintf(m->name, sizeof m->name, "%s", n->text);
        if (t)
            st = parse_training(&c, t, m);
        if (!st && d)
            st = parse_device(&c, d, m);
    }
    ml_tree_free(root);
    return st;
}

static ml_status load(const char *text, size_t len, const char *path, ml_model **out,
                      ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", path ? path : "<input>");
    ml_node *root = NULL;
    ml_status st = ml_tree_parse(text, len, &root, err);
    if (st)
        return st;
    ml_model *m = calloc(1, sizeof *m);
    if (!m) {
        ml_tree_free(root);
        return ml_error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    /* default name: the file name without directories and extension */
    const char *base = path ? strrchr(path, '/') : NULL;
    base = base ? base + 1 : (path ? path : "model");
    snprintf(m->name, sizeof m->name, "%s", base);
    char *dot = strrchr(m->name, '.');
    if (dot && dot != m->name)
        *dot = '\0';
    ctx c = {err};
    st = build(&c, root, m);
    ml_tree_free(root);
    if (st) {
        ml_model_destroy(m);
        return st;
    }
    *out = m;
    return ML_OK;
}

ml_status ml_model_load_string(const char *text, size_t len, const char *name, ml_model **out,
                               ml_error *err)
{
    return load(text, len, name, out, err);
}

ml_status ml_model_load_file(const char *path, ml_model **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    size_t len = 0;
    char *buf = ml_read_file(path, &len, err);
    if (!buf)
        return err->code;
    ml_status st = load(buf, len, path, out, err);
    free(buf);
    return st;
}

void ml_model_destroy(ml_model *m)
{
    if (!m)
        return;
    ml_layers_free(m->seq, m->nseq);
    free(m);
}

const char *ml_model_name(const ml_model *m)
{
    return m->name;
}

ml_config ml_model_config(const ml_model *m)
{
    return m->config;
}

uint64_t ml_device_budget(const ml_device *d)
{
    return d->budget ? d->budget : d->memory - d->runtime_reserve;
}

uint64_t ml_device_limit(const ml_device *d)
{
    uint64_t avail = d->memory - d->runtime_reserve;
    return d->fragmentation > 0 ? (uint64_t)((double)avail / (1 + d->fragmentation)) : avail;
}
