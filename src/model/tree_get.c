/* Reading checked values out of the YAML tree: a key of a mapping as a
 * whole number, a number, a boolean, one of a list of names or a size,
 * each refused with the field's name, its position, what was expected and,
 * for a misspelt name, the closest valid one. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "memledger/model.h"
#include "model/schema.h" /* ml__size_or_none */
#include "model/tree.h"

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
const char *ml__closest_name(const char *s, const char *const *names, size_t n)
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

void ml__join_names(char *buf, size_t size, const char *const *names, size_t n)
{
    size_t k = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < n && k < size; i++)
        k += (size_t)snprintf(buf + k, size - k, "%s%s", i ? ", " : "", names[i]);
}

const char *ml__tree_type_name(const ml_node *n)
{
    return n->type == ML_NODE_MAP ? "a mapping" : n->type == ML_NODE_SEQ ? "a list" : "a scalar";
}

ml_status ml__tree_need_map(ml_error *err, const ml_node *n, const char *field)
{
    if (n->type != ML_NODE_MAP)
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected a mapping (key: value lines), got %s",
                            field, ml__tree_type_name(n));
    return ML_OK;
}

/* Rejects unknown and repeated keys. */
ml_status ml__tree_check_keys(ml_error *err, const ml_node *map, const char *field,
                              const char *const *allowed, size_t n)
{
    for (size_t i = 0; i < map->count; i++) {
        const char *k = map->keys[i]->text;
        size_t j;
        for (j = 0; j < n; j++)
            if (strcmp(k, allowed[j]) == 0)
                break;
        if (j == n) {
            const char *near = ml__closest_name(k, allowed, n);
            if (near)
                return ml__error_at(err, map->keys[i], ML_SCHEMA,
                                    "%s.%s: unknown key; did you mean '%s'?", field, k, near);
            char list[400];
            ml__join_names(list, sizeof list, allowed, n);
            return ml__error_at(err, map->keys[i], ML_SCHEMA, "%s.%s: unknown key; valid keys: %s",
                                field, k, list);
        }
        for (size_t p = 0; p < i; p++)
            if (strcmp(k, map->keys[p]->text) == 0)
                return ml__error_at(err, map->keys[i], ML_SCHEMA,
                                    "%s.%s: key given twice (first at line %u)", field, k,
                                    map->keys[p]->line);
    }
    return ML_OK;
}

const ml_node *ml__tree_get(const ml_node *map, const char *key)
{
    if (!map || map->type != ML_NODE_MAP)
        return NULL;
    for (size_t i = 0; i < map->count; i++)
        if (strcmp(map->keys[i]->text, key) == 0)
            return map->items[i];
    return NULL;
}

ml_status ml__tree_need_scalar(ml_error *err, const ml_node *n, const char *field, const char *what)
{
    if (n->type != ML_NODE_SCALAR)
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected %s, got %s", field, what,
                            ml__tree_type_name(n));
    return ML_OK;
}

/* Whole number in [lo, hi]. */
ml_status ml__tree_uint(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        uint64_t lo, uint64_t hi, uint64_t *out)
{
    const ml_node *n = ml__tree_get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = ml__tree_need_scalar(err, n, field, "a whole number");
    if (st)
        return st;
    const char *s = n->text;
    if (!n->plain || !*s)
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected a whole number, got '%s'", field, s);
    if (s[0] == '-' && isdigit((unsigned char)s[1]))
        return ml__error_at(err, n, ML_RANGE, "%s: %s is negative; expected a whole number >= %llu",
                            field, s, (unsigned long long)lo);
    for (const char *p = s; *p; p++)
        if (!isdigit((unsigned char)*p))
            return ml__error_at(err, n, ML_SCHEMA, "%s: expected a whole number, got '%s'", field,
                                s);
    /* YAML 1.1 readers (PyYAML) take 012 as octal 10, YAML 1.2 as 12 */
    if (s[0] == '0' && s[1])
        return ml__error_at(err, n, ML_SCHEMA,
                            "%s: '%s' has a leading zero, which YAML 1.1 reads as octal; write "
                            "the number without it",
                            field, s);
    errno = 0;
    unsigned long long v = strtoull(s, NULL, 10);
    if (errno == ERANGE || v > hi)
        return ml__error_at(err, n, ML_RANGE, "%s: %s is too large; the limit is %llu", field, s,
                            (unsigned long long)hi);
    if (v < lo)
        return ml__error_at(err, n, ML_RANGE, "%s: %s is too small; expected a whole number >= %llu",
                            field, s, (unsigned long long)lo);
    *out = v;
    return ML_OK;
}

ml_status ml__tree_double(ml_error *err, const ml_node *map, const char *key, const char *parent,
                          double lo, double hi, bool hi_open, double *out)
{
    const ml_node *n = ml__tree_get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = ml__tree_need_scalar(err, n, field, "a number");
    if (st)
        return st;
    double v = 0;
    if (!n->plain || !ml__decimal(n->text, &v))
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected a decimal number, got '%s'", field,
                            n->text);
    if (v < lo || v > hi || (hi_open && v >= hi))
        return ml__error_at(err, n, ML_RANGE, "%s: %s is out of range; expected %g <= value %s %g",
                            field, n->text, lo, hi_open ? "<" : "<=", hi);
    *out = v;
    return ML_OK;
}

ml_status ml__tree_bool(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        bool *out)
{
    const ml_node *n = ml__tree_get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = ml__tree_need_scalar(err, n, field, "true or false");
    if (st)
        return st;
    if (n->plain && (!strcmp(n->text, "true") || !strcmp(n->text, "True")))
        *out = true;
    else if (n->plain && (!strcmp(n->text, "false") || !strcmp(n->text, "False")))
        *out = false;
    else
        return ml__error_at(err, n, ML_SCHEMA, "%s: expected true or false, got '%s'", field,
                            n->text);
    return ML_OK;
}

/* One of names[]; *out is the index. */
ml_status ml__tree_enum(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        const char *const *names, size_t count, unsigned *out)
{
    const ml_node *n = ml__tree_get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = ml__tree_need_scalar(err, n, field, "a name");
    if (st)
        return st;
    for (size_t i = 0; i < count; i++)
        if (strcmp(n->text, names[i]) == 0) {
            *out = (unsigned)i;
            return ML_OK;
        }
    char list[300];
    ml__join_names(list, sizeof list, names, count);
    const char *near = ml__closest_name(n->text, names, count);
    if (near)
        return ml__error_at(err, n, ML_SCHEMA,
                            "%s: unknown value '%s'; did you mean '%s'? (one of: %s)", field,
                            n->text, near, list);
    return ml__error_at(err, n, ML_SCHEMA, "%s: unknown value '%s'; expected one of: %s", field,
                        n->text, list);
}

/* A size at key (or_zero: 0, bare or with a unit, too: ml__size_or_none). */
static ml_status tree_size(ml_error *err, const ml_node *map, const char *key, const char *parent,
                           bool or_zero, uint64_t *out)
{
    const ml_node *n = ml__tree_get(map, key);
    if (!n)
        return ML_OK;
    char field[96];
    snprintf(field, sizeof field, "%s.%s", parent, key);
    ml_status st = ml__tree_need_scalar(
        err, n, field, or_zero ? "a size such as 32MiB, or 0" : "a size such as 8GiB");
    if (st)
        return st;
    ml_error e;
    memset(&e, 0, sizeof e);
    /* (ml__size_or_none's message names the field itself) */
    st = or_zero ? ml__size_or_none(field, n->text, out, &e) : ml_parse_size(n->text, out, &e);
    if (st)
        return ml__error_at(err, n, st == ML_USAGE ? ML_SCHEMA : st, "%s%s%s",
                            or_zero ? "" : field, or_zero ? "" : ": ", e.msg);
    return ML_OK;
}

ml_status ml__tree_size(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        uint64_t *out)
{
    return tree_size(err, map, key, parent, false, out);
}

ml_status ml__tree_size_or_zero(ml_error *err, const ml_node *map, const char *key,
                                const char *parent, uint64_t *out)
{
    return tree_size(err, map, key, parent, true, out);
}


/* ---- repeated keys anywhere in a document ------------------------------- */

typedef struct {
    const ml_node *key;
    size_t index;
} key_ref;

static int key_ref_cmp(const void *a, const void *b)
{
    const key_ref *x = a, *y = b;
    int c = strcmp(x->key->text, y->key->text);
    return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* Sorting the keys keeps a hostile mapping of 100,000 keys at n log n. */
static ml_status unique_in(ml_error *err, const ml_node *n, char *path, size_t len, size_t cap,
                           unsigned depth)
{
    if (n->type == ML_NODE_MAP && n->count > 1) {
        key_ref *v = malloc(n->count * sizeof *v);
        if (!v)
            return ml__error_at(err, n, ML_NOMEM, "out of memory");
        for (size_t i = 0; i < n->count; i++)
            v[i] = (key_ref){n->keys[i], i};
        qsort(v, n->count, sizeof *v, key_ref_cmp);
        /* of every run of equal keys, the second occurrence; report the one
         * that comes first in the file */
        const key_ref *first = NULL, *second = NULL;
        for (size_t i = 1; i < n->count; i++)
            if (!strcmp(v[i].key->text, v[i - 1].key->text) &&
                (i == 1 || strcmp(v[i - 1].key->text, v[i - 2].key->text)) &&
                (!second || v[i].index < second->index)) {
                first = &v[i - 1];
                second = &v[i];
            }
        if (second) {
            ml_status st = ml__error_at(
                err, second->key, ML_SCHEMA,
                "%.*s%s%s: key given twice (first at line %u, column %u); Python's json, and so "
                "transformers, would keep this last value, so the file is refused rather than "
                "read either way",
                (int)len, path, len ? "." : "", second->key->text, first->key->line,
                first->key->col);
            free(v);
            return st;
        }
        free(v);
    }
    if (depth >= ML_TREE_MAX_DEPTH)
        return ML_OK;
    for (size_t i = 0; i < n->count; i++) {
        size_t l = len;
        if (n->type == ML_NODE_MAP)
            l += (size_t)snprintf(path + len, cap - len, "%s%s", len ? "." : "",
                                  n->keys[i]->text);
        else
            l += (size_t)snprintf(path + len, cap - len, "[%zu]", i);
        if (l >= cap)
            l = cap - 1;
        ml_status st = unique_in(err, n->items[i], path, l, cap, depth + 1);
        if (st)
            return st;
    }
    return ML_OK;
}

ml_status ml__tree_check_unique(ml_error *err, const ml_node *root)
{
    char path[256] = "";
    return root ? unique_in(err, root, path, 0, sizeof path, 0) : ML_OK;
}
