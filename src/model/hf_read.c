/* Reading a Hugging Face config.json's values (hf_read.h): whole numbers
 * under a name and its aliases, booleans, probabilities, strings, and the
 * check of every key against the family's key table (hf_keys.c). */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "model/hf_read.h"
#include "model/model_internal.h"

bool ml__hf_is_null(const ml_node *n)
{
    return !n || (n->type == ML_NODE_SCALAR && n->plain && !strcmp(n->text, "null"));
}

/* The key of keys (NULL-terminated: a name and its aliases) that is present;
 * required: an error when none is. Two aliases at once are refused
 * (GPT2Config's attribute_map makes them one value). */
ml_status ml__hf_uint(ml_error *err, const ml_node *root, const char *const *keys_, bool required,
                      uint64_t lo, uint64_t hi, uint64_t *out)
{
    const char *found = NULL;
    const ml_node *fn = NULL;
    for (const char *const *k = keys_; *k; k++) {
        const ml_node *n = ml__tree_get(root, *k);
        if (ml__hf_is_null(n))
            continue;
        if (found) {
            /* at the one written second */
            bool later = n->line > fn->line || (n->line == fn->line && n->col > fn->col);
            return ml__error_at(err, later ? n : fn, ML_SCHEMA,
                                "%s: names the same value as %s (an alias); give one of them",
                                later ? *k : found, later ? found : *k);
        }
        found = *k;
        fn = n;
        char *end = NULL;
        errno = 0;
        unsigned long long v = n->type == ML_NODE_SCALAR ? strtoull(n->text, &end, 10) : 0;
        /* digits only: strtoull also skips blanks and takes a sign */
        if (n->type != ML_NODE_SCALAR || !end || end == n->text || *end || errno ||
            !isdigit((unsigned char)n->text[0]))
            return ml__error_at(err, n, ML_SCHEMA, "%s: expected a whole number", *k);
        /* JSON (RFC 8259, section 6) allows no leading zero: 012 is no number */
        if (n->text[0] == '0' && n->text[1])
            return ml__error_at(err, n, ML_SCHEMA,
                                "%s: %s has a leading zero, which JSON does not allow; write the "
                                "number without it",
                                *k, n->text);
        /* "12" in quotes is a JSON string: transformers keeps it a str, and
         * the model's range(config.n_layer) fails on it */
        if (!n->plain)
            return ml__error_at(err, n, ML_SCHEMA,
                                "%s: \"%s\" is a string; write the number without quotes", *k,
                                n->text);
        if (v < lo || v > hi)
            return ml__error_at(err, n, ML_RANGE, "%s: %llu is out of range (%llu to %llu)", *k, v,
                                (unsigned long long)lo, (unsigned long long)hi);
        *out = v;
    }
    if (!found && required)
        return ml__error_at(err, root, ML_SCHEMA, "%s: missing from the config", keys_[0]);
    return ML_OK;
}

/* true or false; absent or null leaves *out. */
ml_status ml__hf_bool(ml_error *err, const ml_node *root, const char *key, bool *out)
{
    const ml_node *n = ml__tree_get(root, key);
    if (ml__hf_is_null(n))
        return ML_OK;
    if (n->type == ML_NODE_SCALAR && n->plain && !strcmp(n->text, "true"))
        *out = true;
    else if (n->type == ML_NODE_SCALAR && n->plain && !strcmp(n->text, "false"))
        *out = false;
    else
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected true or false", key);
    return ML_OK;
}

/* A probability in [0, 1]; absent or null leaves *out. */
ml_status ml__hf_prob(ml_error *err, const ml_node *root, const char *key, double *out)
{
    const ml_node *n = ml__tree_get(root, key);
    if (ml__hf_is_null(n))
        return ML_OK;
    double v = -1;
    if (n->type != ML_NODE_SCALAR || !n->plain || !ml__decimal(n->text, &v) || !(v >= 0 && v <= 1))
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected a probability from 0 to 1", key);
    *out = v;
    return ML_OK;
}

/* A string; absent or null: NULL. */
ml_status ml__hf_str(ml_error *err, const ml_node *root, const char *key, const char **out)
{
    const ml_node *n = ml__tree_get(root, key);
    *out = NULL;
    if (ml__hf_is_null(n))
        return ML_OK;
    if (n->type != ML_NODE_SCALAR || n->plain)
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected a string", key);
    *out = n->text;
    return ML_OK;
}

/* Whether n is one of the JSON literals of ok ("false|null", "{}",
 * "\"absolute\""); numbers compare by value (0 and 0.0 alike). */
static bool value_is(const ml_node *n, const char *ok)
{
    while (*ok) {
        size_t len = strcspn(ok, "|");
        char t[64];
        snprintf(t, sizeof t, "%.*s", (int)len, ok);
        ok += len + (ok[len] == '|');
        if (!strcmp(t, "{}") || !strcmp(t, "[]")) {
            if (n->type == (t[0] == '{' ? ML_NODE_MAP : ML_NODE_SEQ) && n->count == 0)
                return true;
            continue;
        }
        if (n->type != ML_NODE_SCALAR)
            continue;
        if (t[0] == '"') {
            if (!n->plain && strlen(n->text) + 2 == strlen(t) &&
                !strncmp(n->text, t + 1, strlen(n->text)))
                return true;
            continue;
        }
        if (!n->plain)
            continue;
        if (!strcmp(n->text, t))
            return true;
        double a = 0, b = 0;
        if (ml__decimal(n->text, &a) && ml__decimal(t, &b) && a == b)
            return true;
    }
    return false;
}

/* The family's key closest to k (NULL: none near, or out of memory). */
static const char *closest_key(const char *k, unsigned fam)
{
    size_t count, n = 0;
    const ml_hf_key *keys = ml__hf_keys(&count);
    const char **names = malloc(count * sizeof *names);
    for (size_t j = 0; names && j < count; j++)
        if (keys[j].families & fam)
            names[n++] = keys[j].key;
    const char *near = names ? ml__closest_name(k, names, n) : NULL;
    free(names);
    return near;
}

/* The keys after the first unknown one (index first) that are unknown too,
 * each with its position and the closest known key, into buf: one message
 * names them all (as much as it holds). */
static void other_unknown(const ml_node *r, unsigned fam, size_t first, char *buf, size_t size)
{
    size_t n = 0, more = 0;
    buf[0] = '\0';
    for (size_t i = first + 1; i < r->count; i++) {
        const ml_node *kn = r->keys[i];
        if (ml__hf_key_find(fam, kn->text))
            continue;
        const char *near = closest_key(kn->text, fam);
        char one[160];
        int w = snprintf(one, sizeof one, "%s%s (%u:%u%s%s%s)", n ? ", " : "; also unknown: ",
                         kn->text, kn->line, kn->col, near ? ", did you mean '" : "",
                         near ? near : "", near ? "'?" : "");
        if (w > 0 && (size_t)w < sizeof one && n + (size_t)w + 24 < size) {
            memcpy(buf + n, one, (size_t)w + 1);
            n += (size_t)w;
        } else {
            more++;
        }
    }
    if (more)
        snprintf(buf + n, size - n, " and %zu more", more);
}

/* Every key of the config is in the family's table (the unknown ones named
 * in one message, at the first's position); a key refused unless its value
 * is one of the table's is checked here, the others by map_config. */
ml_status ml__hf_check_keys(const ml_node *r, unsigned fam, const char *type, ml_error *err)
{
    for (size_t i = 0; i < r->count; i++) {
        const char *k = r->keys[i]->text;
        const ml_hf_key *e = ml__hf_key_find(fam, k);
        if (!e) {
            const char *near = closest_key(k, fam);
            char others[256];
            other_unknown(r, fam, i, others, sizeof others);
            return ml__error_at(err, r->keys[i], ML_SCHEMA,
                                "%s: not a key memledger knows for model_type '%s': it is "
                                "refused rather than ignored, since it may change what is "
                                "planned%s%s%s%s (docs/hf.md lists every key)",
                                k, type, near ? "; did you mean '" : "", near ? near : "",
                                near ? "'?" : "", others);
        }
        const ml_node *v = r->items[i];
        if (e->use == ML_HF_REFUSED_UNLESS && e->ok && !value_is(v, e->ok)) {
            char accepted[96];
            size_t a = 0;
            for (const char *p = e->ok; *p && a + 8 < sizeof accepted; p++)
                a += (size_t)(*p == '|' ? snprintf(accepted + a, sizeof accepted - a, " or ")
                                        : snprintf(accepted + a, sizeof accepted - a, "%c", *p));
            return ml__error_at(err, v, ML_SCHEMA, "%s: %s is refused (accepted: %s): %s", k,
                                v->type == ML_NODE_SCALAR ? v->text : ml__tree_type_name(v),
                                accepted, e->note);
        }
    }
    return ML_OK;
}

/* layer_types (Qwen2Config, Gemma2Config): a list of num_hidden_layers
 * names, full_attention or sliding_attention; absent or null leaves
 * *windowed, else sets it to whether a layer slides. */
ml_status ml__hf_layer_types(ml_error *err, const ml_node *r, uint64_t layers, bool *windowed)
{
    const ml_node *lt = ml__tree_get(r, "layer_types");
    if (ml__hf_is_null(lt))
        return ML_OK;
    if (lt->type != ML_NODE_SEQ || lt->count != layers)
        return ml__error_at(err, lt, ML_SCHEMA,
                            "layer_types: expected a list of num_hidden_layers (%llu) names",
                            (unsigned long long)layers);
    *windowed = false;
    for (size_t i = 0; i < lt->count; i++) {
        const ml_node *e = lt->items[i];
        bool sl = e->type == ML_NODE_SCALAR && !strcmp(e->text, "sliding_attention");
        if (!sl && !(e->type == ML_NODE_SCALAR && !strcmp(e->text, "full_attention")))
            return ml__error_at(err, e, ML_SCHEMA,
                                "layer_types[%zu]: expected full_attention or sliding_attention",
                                i);
        *windowed = *windowed || sl;
    }
    return ML_OK;
}

/* A positive finite number; absent leaves *out, null sets 0 (none).
 * ML_OK or ML_SCHEMA. */
ml_status ml__hf_positive(ml_error *err, const ml_node *root, const char *key, double *out)
{
    const ml_node *n = ml__tree_get(root, key);
    if (!n)
        return ML_OK;
    if (ml__hf_is_null(n)) {
        *out = 0;
        return ML_OK;
    }
    double v = -1;
    if (n->type != ML_NODE_SCALAR || !n->plain || !ml__decimal(n->text, &v) ||
        !(v > 0 && v <= 1e12))
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected a positive number or null", key);
    *out = v;
    return ML_OK;
}

/* The MLP's activation (hidden_act, or GPT-2's activation_function). */
ml_status ml__hf_activation(const ml_node *r, const char *key, const char *type, ml_model *m,
                            ml_error *err)
{
    static const struct {
        const char *name;
        ml_activation act;
        bool gelu_new;
    } acts[] = {{"gelu", ML_ACT_GELU, false},
                {"gelu_pytorch_tanh", ML_ACT_GELU, false},
                {"gelu_new", ML_ACT_GELU, true},
                {"relu", ML_ACT_RELU, false}};
    const char *v;
    ml_status st = ml__hf_str(err, r, key, &v);
    if (st)
        return st;
    /* each family's default: gelu_new for GPT-2 and Phi (GPT2Config's and
     * PhiConfig's activation_function / hidden_act), else gelu */
    m->mlp.activation = ML_ACT_GELU;
    m->mlp.gelu_new = !strcmp(type, "gpt2") || !strcmp(type, "phi");
    if (!v)
        return ML_OK;
    for (size_t i = 0; i < sizeof acts / sizeof *acts; i++)
        if (!strcmp(v, acts[i].name)) {
            m->mlp.activation = acts[i].act;
            m->mlp.gelu_new = acts[i].gelu_new;
            return ML_OK;
        }
    return ml__error_at(err, ml__tree_get(r, key), ML_SCHEMA,
                        "%s: '%s' is not modelled for %s (gelu, gelu_pytorch_tanh, gelu_new or "
                        "relu)",
                        key, v, type);
}
