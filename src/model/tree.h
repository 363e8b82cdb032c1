/* A small document tree built from libyaml events, so that schema checks can
 * walk it with positions. Anchors, aliases and tags are refused when parsing,
 * each at its position: an alias bomb cannot expand here, and every tag,
 * core ones such as !!str and !!float included, since the tree keeps text
 * only and a tag it ignored would mislead the file's writer. */
#ifndef ML_TREE_H
#define ML_TREE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "util/error.h"

typedef enum { ML_NODE_SCALAR, ML_NODE_MAP, ML_NODE_SEQ } ml_node_type;

typedef struct ml_node ml_node;
struct ml_node {
    ml_node_type type;
    unsigned line, col;  /* 1-based */
    char *text;          /* scalar value (NUL-terminated) */
    bool plain;          /* scalar written without quotes */
    ml_node **keys;      /* map: key scalars */
    ml_node **items;     /* map: values; seq: items */
    size_t count;
    size_t cap;
};

/* Limits that keep a hostile file bounded. */
#define ML_TREE_MAX_DEPTH 64
#define ML_TREE_MAX_NODES 200000
#define ML_TREE_MAX_BYTES ML_INPUT_MAX_BYTES

/* Parses text into *root (NULL for an empty document). Returns ML_OK,
 * ML_SYNTAX, ML_RANGE (the limits above) or ML_NOMEM (libyaml's own
 * allocations included) with err filled (err->path is set by the caller). */
ml_status ml__tree_parse(const char *text, size_t len, ml_node **root, ml_error *err);
/* The same for JSON (a subset of YAML, read by the same parser), whose
 * syntax errors say JSON. */
ml_status ml__tree_parse_json(const char *text, size_t len, ml_node **root, ml_error *err);
void ml__tree_free(ml_node *n);

/* Sets err (code, the node's position or 0:0, a formatted message) and
 * returns code. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
ml_status ml__error_at(ml_error *err, const ml_node *at, ml_status code, const char *fmt, ...);

/* ---- checked reads (tree_get.c). `field` names the value in messages
 * ("training.seq_len"); a key that is absent leaves *out unchanged. */
#define ML_COUNT(a) (sizeof(a) / sizeof((a)[0]))

/* The closest of names[] to s, or NULL when nothing is close. */
const char *ml__closest_name(const char *s, const char *const *names, size_t n);
/* "a, b, c" into buf. */
void ml__join_names(char *buf, size_t size, const char *const *names, size_t n);
/* "a mapping", "a list" or "a scalar". */
const char *ml__tree_type_name(const ml_node *n);
/* The value of key in a mapping, or NULL. */
const ml_node *ml__tree_get(const ml_node *map, const char *key);
ml_status ml__tree_need_map(ml_error *err, const ml_node *n, const char *field);
ml_status ml__tree_need_scalar(ml_error *err, const ml_node *n, const char *field,
                               const char *what);
/* Rejects unknown keys (naming the closest allowed one) and repeated keys. */
ml_status ml__tree_check_keys(ml_error *err, const ml_node *map, const char *field,
                              const char *const *allowed, size_t n);
/* Refuses a key repeated in any mapping of the document (a JSON object's
 * duplicate keys: Python keeps the last, a first-match reader the first),
 * naming the second occurrence's position and the first's line. ML_OK,
 * ML_SCHEMA or ML_NOMEM. */
ml_status ml__tree_check_unique(ml_error *err, const ml_node *root);
/* parent.key as a whole number in [lo, hi]. */
ml_status ml__tree_uint(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        uint64_t lo, uint64_t hi, uint64_t *out);
/* parent.key as a finite number in [lo, hi] ([lo, hi) with hi_open). */
ml_status ml__tree_double(ml_error *err, const ml_node *map, const char *key, const char *parent,
                          double lo, double hi, bool hi_open, double *out);
ml_status ml__tree_bool(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        bool *out);
/* One of names[]; *out is its index. */
ml_status ml__tree_enum(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        const char *const *names, size_t count, unsigned *out);
/* A size such as 8GiB (ml_parse_size). */
ml_status ml__tree_size(ml_error *err, const ml_node *map, const char *key, const char *parent,
                        uint64_t *out);
/* The same, where 0 is a value too (model.buffers: none). */
ml_status ml__tree_size_or_zero(ml_error *err, const ml_node *map, const char *key,
                                const char *parent, uint64_t *out);

#endif
