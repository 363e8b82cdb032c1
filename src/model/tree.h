/* A small document tree built from libyaml events, so that schema checks can
 * walk it with positions. Anchors, aliases and tags are refused when parsing:
 * an alias bomb cannot expand here. */
#ifndef ML_TREE_H
#define ML_TREE_H

#include <stdbool.h>
#include <stddef.h>

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
 * ML_SYNTAX or ML_NOMEM with err filled (err->path is set by the caller). */
ml_status ml_tree_parse(const char *text, size_t len, ml_node **root, ml_error *err);
void ml_tree_free(ml_node *n);

/* Sets err (code, the node's position or 0:0, a formatted message) and
 * returns code. */
#if defined(__GNUC__)
__attribute__((format(printf, 4, 5)))
#endif
ml_status ml_error_at(ml_error *err, const ml_node *at, ml_status code, const char *fmt, ...);

#endif
