/* libyaml → ml_node tree. The only file that includes yaml.h. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <yaml.h>

#include "model/tree.h"
#include "util/utf8.h"

typedef struct {
    ml_node *stack[ML_TREE_MAX_DEPTH + 1];
    size_t depth;
    size_t nodes;
    ml_node *root;
    ml_error *err;
} builder;

static ml_status fail(ml_error *err, ml_status code, const yaml_mark_t *mk, const char *msg)
{
    err->code = code;
    err->line = mk ? (unsigned)mk->line + 1u : 0u;
    err->col = mk ? (unsigned)mk->column + 1u : 0u;
    snprintf(err->msg, sizeof err->msg, "%s", msg);
    return code;
}

void ml__tree_free(ml_node *n)
{
    if (!n)
        return;
    for (size_t i = 0; i < n->count; i++) {
        if (n->keys)
            ml__tree_free(n->keys[i]);
        ml__tree_free(n->items[i]);
    }
    free(n->keys);
    free(n->items);
    free(n->text);
    free(n);
}

static ml_node *node_new(builder *b, ml_node_type t, const yaml_mark_t *mk)
{
    if (b->nodes >= ML_TREE_MAX_NODES)
        return NULL;
    ml_node *n = calloc(1, sizeof *n);
    if (!n)
        return NULL;
    n->type = t;
    n->line = (unsigned)mk->line + 1u;
    n->col = (unsigned)mk->column + 1u;
    b->nodes++;
    return n;
}

/* Attaches n to the open container; a map alternates key, value. */
static int attach(builder *b, ml_node *n)
{
    if (b->depth == 0) {
        b->root = n;
        return 0;
    }
    ml_node *p = b->stack[b->depth - 1];
    if (p->type == ML_NODE_MAP) {
        /* keys[count] pending: a key was stored with items[count] == NULL */
        if (p->count > 0 && p->items[p->count - 1] == NULL) {
            p->items[p->count - 1] = n;
            return 0;
        }
    }
    if (p->count == p->cap) {
        size_t cap = p->cap ? p->cap * 2 : 4;
        ml_node **items = realloc(p->items, cap * sizeof *items);
        if (!items)
            return -1;
        p->items = items;
        if (p->type == ML_NODE_MAP) {
            ml_node **keys = realloc(p->keys, cap * sizeof *keys);
            if (!keys)
                return -1;
            p->keys = keys;
        }
        p->cap = cap;
    }
    if (p->type == ML_NODE_MAP) {
        if (n->type != ML_NODE_SCALAR)
            return -2;
        p->keys[p->count] = n;
        p->items[p->count] = NULL;
    } else {
        p->items[p->count] = n;
    }
    p->count++;
    return 0;
}

/* Anchors and every tag are refused, at the event's position. */
static ml_status refuse_anchor_tag(builder *b, const yaml_event_t *ev)
{
    const yaml_mark_t *mk = &ev->start_mark;
    const yaml_char_t *anchor = ev->type == YAML_SCALAR_EVENT ? ev->data.scalar.anchor
                                : ev->type == YAML_SEQUENCE_START_EVENT
                                    ? ev->data.sequence_start.anchor
                                    : ev->data.mapping_start.anchor;
    if (anchor)
        return fail(b->err, ML_SYNTAX, mk,
                    "YAML anchors (&name) are not supported: write the value out in full");
    /* every tag, core ones included: a reader of the tree sees text, so
     * "!!float 2" would be read as the number 2 and "!!str 2" too, and a
     * tag changing nothing is a tag misleading its reader */
    const yaml_char_t *tag = ev->type == YAML_SCALAR_EVENT ? ev->data.scalar.tag
                             : ev->type == YAML_SEQUENCE_START_EVENT
                                 ? ev->data.sequence_start.tag
                                 : ev->data.mapping_start.tag;
    if (tag) {
        char msg[200];
        snprintf(msg, sizeof msg,
                 "YAML tags (here %.80s) are not supported: write the value without it "
                 "(numbers plain, strings quoted)",
                 (const char *)tag);
        return fail(b->err, ML_SYNTAX, mk, msg);
    }
    return ML_OK;
}

/* A node that could not be made: past the node limit, or out of memory. */
static ml_status node_failed(builder *b, const yaml_mark_t *mk)
{
    if (b->nodes >= ML_TREE_MAX_NODES)
        return fail(b->err, ML_RANGE, mk, "more than 200000 YAML nodes");
    return fail(b->err, ML_NOMEM, mk, "out of memory");
}

/* The node of a scalar, sequence start or mapping start event, attached to
 * its parent; a sequence or mapping becomes the open one. */
static ml_status add_node(builder *b, const yaml_event_t *ev)
{
    ml_error *err = b->err;
    const yaml_mark_t *mk = &ev->start_mark;
    ml_node *n = NULL;
    if (ev->type == YAML_SCALAR_EVENT) {
        n = node_new(b, ML_NODE_SCALAR, mk);
        if (!n)
            return node_failed(b, mk);
        n->text = malloc(ev->data.scalar.length + 1);
        if (!n->text) {
            free(n);
            return node_failed(b, mk);
        }
        memcpy(n->text, ev->data.scalar.value, ev->data.scalar.length);
        n->text[ev->data.scalar.length] = '\0';
        if (strlen(n->text) != ev->data.scalar.length) {
            ml__tree_free(n);
            return fail(err, ML_SYNTAX, mk, "NUL byte inside a scalar");
        }
        n->plain = ev->data.scalar.style == YAML_PLAIN_SCALAR_STYLE;
    } else {
        if (b->depth >= ML_TREE_MAX_DEPTH)
            return fail(err, ML_SYNTAX, mk, "nesting deeper than 64 levels");
        n = node_new(b, ev->type == YAML_MAPPING_START_EVENT ? ML_NODE_MAP : ML_NODE_SEQ, mk);
        if (!n)
            return node_failed(b, mk);
    }
    int rc = attach(b, n);
    if (rc == -2) {
        ml__tree_free(n);
        return fail(err, ML_SYNTAX, mk, "a mapping key must be a plain scalar");
    }
    if (rc != 0) {
        ml__tree_free(n);
        return fail(err, ML_NOMEM, mk, "out of memory");
    }
    if (n->type != ML_NODE_SCALAR)
        b->stack[b->depth++] = n;
    return ML_OK;
}

static ml_status handle(builder *b, yaml_event_t *ev)
{
    const yaml_mark_t *mk = &ev->start_mark;
    ml_status st;
    switch (ev->type) {
    case YAML_ALIAS_EVENT:
        return fail(b->err, ML_SYNTAX, mk,
                    "YAML aliases (*name) are not supported: write the value out in full");
    case YAML_SCALAR_EVENT:
    case YAML_SEQUENCE_START_EVENT:
    case YAML_MAPPING_START_EVENT:
        if ((st = refuse_anchor_tag(b, ev)))
            return st;
        return add_node(b, ev);
    case YAML_SEQUENCE_END_EVENT:
    case YAML_MAPPING_END_EVENT:
        if (b->depth > 0)
            b->depth--;
        return ML_OK;
    case YAML_DOCUMENT_START_EVENT:
        if (b->root)
            return fail(b->err, ML_SYNTAX, mk, "more than one YAML document in the file");
        return ML_OK;
    default:
        return ML_OK;
    }
}

/* libyaml's reader stopped at text[off]: bytes that are not UTF-8 (value:
 * the octet) or a character YAML refuses (value: its code point). The
 * line and column there: a line ends at LF, CRLF or a lone CR, a column
 * counts characters, and a byte order mark is no column. */
static ml_status reader_error(ml_error *err, const char *text, size_t off, const char *problem,
                              int value)
{
    yaml_mark_t mk = {0, 0, 0};
    size_t i = ml_utf8_bom_len(text, off);
    for (; i < off; i++) {
        if (text[i] == '\n' || (text[i] == '\r' && !(i + 1 < off && text[i + 1] == '\n'))) {
            mk.line++;
            mk.column = 0;
        } else if (text[i] != '\r' && ((unsigned char)text[i] & 0xC0) != 0x80) {
            mk.column++; /* a character's first byte */
        }
    }
    const char *what = problem ? problem : "invalid input";
    char msg[300];
    if (strstr(what, "UTF-8"))
        snprintf(msg, sizeof msg, "not UTF-8 text: %s (byte 0x%02x); save the file as UTF-8",
                 what, (unsigned)value & 0xFFu);
    else if (value >= 0)
        snprintf(msg, sizeof msg, "%s (U+%04X): remove the character", what, (unsigned)value);
    else
        snprintf(msg, sizeof msg, "unreadable text: %s", what);
    return fail(err, ML_SYNTAX, &mk, msg);
}

ml_status ml__tree_parse(const char *text, size_t len, ml_node **root, ml_error *err)
{
    if (len > ML_TREE_MAX_BYTES)
        return fail(err, ML_RANGE, NULL, "file larger than 16 MiB");
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser))
        return fail(err, ML_NOMEM, NULL, "out of memory");
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    builder b;
    memset(&b, 0, sizeof b);
    b.err = err;
    ml_status st = ML_OK;
    for (;;) {
        yaml_event_t ev;
        if (!yaml_parser_parse(&parser, &ev)) {
            /* libyaml's own allocation failed: out of memory, not a syntax
             * error (its problem is then NULL) */
            if (parser.error == YAML_MEMORY_ERROR) {
                st = fail(err, ML_NOMEM, NULL, "out of memory");
                break;
            }
            char msg[400];
            if (parser.error == YAML_READER_ERROR) {
                /* libyaml gives a reader's problem as a byte offset, its
                 * mark left at the start */
                size_t at = parser.problem_offset < len ? parser.problem_offset : len;
                st = reader_error(err, text, at, parser.problem, parser.problem_value);
                break;
            }
            snprintf(msg, sizeof msg, "YAML syntax: %s%s%s",
                     parser.problem ? parser.problem : "unknown problem",
                     parser.context ? " " : "", parser.context ? parser.context : "");
            st = fail(err, ML_SYNTAX, &parser.problem_mark, msg);
            break;
        }
        yaml_event_type_t t = ev.type;
        st = handle(&b, &ev);
        yaml_event_delete(&ev);
        if (st != ML_OK || t == YAML_STREAM_END_EVENT)
            break;
    }
    yaml_parser_delete(&parser);
    if (st != ML_OK) {
        ml__tree_free(b.root);
        return st;
    }
    *root = b.root;
    return ML_OK;
}

ml_status ml__tree_parse_json(const char *text, size_t len, ml_node **root, ml_error *err)
{
    ml_status st = ml__tree_parse(text, len, root, err);
    if (st == ML_SYNTAX)
        ml__error_reword(err, "YAML syntax: ", "JSON syntax (read as YAML): ");
    return st;
}
