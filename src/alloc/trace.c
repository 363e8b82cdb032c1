/* Traces of allocations and frees (the CSV `action,id,bytes`) and their
 * replay through the simulator (alloc.h). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "alloc/alloc.h"
#include "util/error.h"
#include "util/grow.h"
#include "util/hash.h"
#include "util/utf8.h"

static const char header_text[] = "action,id,bytes";

static ml_status fail(ml_error *err, ml_status code, const char *path, unsigned line,
                      unsigned col, const char *fmt, ...)
{
    if (!err)
        return code;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", path ? path : "");
    va_list ap;
    va_start(ap, fmt);
    ml__verrorf_at(err, code, line, col, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- ids: an open-addressing table from the id to its last allocation ----
 * Indexed by a keyed hash with a key drawn per table (util/hash.h): the
 * ids are the input's, and with a fixed hash (FNV-1a, as this table once had) ids
 * made to collide in the low bits cost a scan per line, quadratic time. */

typedef struct {
    char *name;    /* interned: also in the trace's names */
    uint32_t slot; /* the event that allocated it last */
    uint32_t line; /* where it was last allocated or freed */
    bool live;
} id_entry;

typedef struct {
    id_entry *e;
    size_t cap, used;
    ml_hash_key key;
} id_table;

static id_entry *lookup(id_table *t, const char *s, size_t n)
{
    size_t i = (size_t)ml__hash(&t->key, s, n) & (t->cap - 1);
    while (t->e[i].name) {
        if (!strncmp(t->e[i].name, s, n) && t->e[i].name[n] == '\0')
            return &t->e[i];
        i = (i + 1) & (t->cap - 1);
    }
    return &t->e[i]; /* the empty entry where it belongs */
}

/* Room for one more id at a load of at most 1/2. */
static bool id_room(id_table *t)
{
    if (2 * (t->used + 1) <= t->cap)
        return true;
    size_t cap = t->cap ? 2 * t->cap : 256;
    id_entry *ne = calloc(cap, sizeof *ne);
    if (!ne)
        return false;
    id_table nt = {ne, cap, t->used, t->key};
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i].name)
            *lookup(&nt, t->e[i].name, strlen(t->e[i].name)) = t->e[i];
    free(t->e);
    *t = nt;
    return true;
}

void ml__alloc_trace_free(ml_alloc_trace *t)
{
    if (!t)
        return;
    for (size_t i = 0; i < t->nnames; i++)
        free(t->names[i]);
    free(t->names);
    free(t->ids);
    free(t->ev);
    free(t);
}

/* The next comma-separated field of line [*pos, len): its start and
 * length with blanks trimmed. Returns false at the end of the line. */
static bool field(const char *line, size_t len, size_t *pos, size_t *start, size_t *flen)
{
    if (*pos > len)
        return false;
    size_t a = *pos, b = a;
    while (b < len && line[b] != ',')
        b++;
    *pos = b + 1;
    size_t e = b;
    while (a < e && (line[a] == ' ' || line[a] == '\t'))
        a++;
    while (e > a && (line[e - 1] == ' ' || line[e - 1] == '\t'))
        e--;
    *start = a;
    *flen = e - a;
    return true;
}

/* The parse in progress: the trace built so far, the ids seen, the
 * capacities of the trace's arrays, and where errors point. */
typedef struct {
    ml_alloc_trace *t;
    id_table ids;
    size_t cap, ids_cap, names_cap; /* of t->ev (and t->ids), t->ids, t->names */
    const char *path;
    ml_error *err;
    unsigned lineno;
} trace_parser;

/* One line of the trace: its fields (start, length) and what they say. */
typedef struct {
    const char *text;
    size_t len;
    size_t f[4], fl[4];
    int nf;
    bool is_free, has_bytes; /* has_bytes: a free that gives its size */
    bool is_empty;           /* empty_cache */
    unsigned long long bytes;
} trace_line;

static ml_status check_header(trace_parser *p, const trace_line *l)
{
    const char *line = l->text;
    if (l->nf != 3 || l->fl[0] != 6 || memcmp(line + l->f[0], "action", 6) || l->fl[1] != 2 ||
        memcmp(line + l->f[1], "id", 2) || l->fl[2] != 5 || memcmp(line + l->f[2], "bytes", 5))
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, 1,
                    "the header must be \"%s\" (an allocator trace), got \"%.*s\"; "
                    "calib/snapshot_to_trace.py converts a PyTorch memory snapshot",
                    header_text, (int)(l->len > 80 ? 80 : l->len), line);
    return ML_OK;
}

/* The bytes field of an alloc (or a free that gives one) into l->bytes. */
static ml_status parse_bytes(trace_parser *p, trace_line *l)
{
    char buf[32];
    char *end = NULL;
    unsigned col = (unsigned)l->f[2] + 1;
    if (l->nf < 3 || !l->fl[2] || l->fl[2] >= sizeof buf)
        return fail(p->err, l->fl[2] >= sizeof buf ? ML_RANGE : ML_SCHEMA, p->path, p->lineno,
                    col, "bytes: expected a whole number of bytes");
    memcpy(buf, l->text + l->f[2], l->fl[2]);
    buf[l->fl[2]] = '\0';
    errno = 0;
    l->bytes = strtoull(buf, &end, 10);
    if (*end || buf[0] < '0' || buf[0] > '9')
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, col,
                    "bytes: '%s' is not a whole number of bytes (write 1048576, not 1MiB "
                    "or 1e6)", buf);
    if (errno == ERANGE)
        return fail(p->err, ML_RANGE, p->path, p->lineno, col,
                    "bytes: '%s' does not fit in 64 bits", buf);
    return ML_OK;
}

/* An event line's action, field count, id and bytes. */
static ml_status parse_event(trace_parser *p, trace_line *l)
{
    const char *line = l->text;
    l->is_free = l->fl[0] == 4 && !memcmp(line + l->f[0], "free", 4);
    l->is_empty = l->fl[0] == 11 && !memcmp(line + l->f[0], "empty_cache", 11);
    if (!l->is_free && !l->is_empty && !(l->fl[0] == 5 && !memcmp(line + l->f[0], "alloc", 5)))
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, (unsigned)l->f[0] + 1,
                    "unknown action '%.*s': use alloc, free or empty_cache",
                    (int)(l->fl[0] > 40 ? 40 : l->fl[0]), line + l->f[0]);
    if (l->is_empty) {
        for (int k = 1; k < l->nf; k++)
            if (l->fl[k] || k > 2)
                return fail(p->err, ML_SCHEMA, p->path, p->lineno,
                            (unsigned)(k > 2 ? l->f[k] - 1 : l->f[k]) + 1,
                            "empty_cache takes no id and no bytes: write the line as "
                            "\"empty_cache\" or \"empty_cache,,\"");
        return ML_OK;
    }
    if (l->nf > 3 || (l->nf < 3 && !(l->is_free && l->nf == 2)))
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, 1,
                    "expected 3 fields (action,id,bytes), got %s%d",
                    l->nf > 3 ? "more than " : "", l->nf > 3 ? 3 : l->nf);
    if (!l->fl[1])
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, (unsigned)l->f[1] + 1,
                    "the id is empty: name each allocation with a token");
    l->bytes = 0;
    l->has_bytes = l->is_free && l->nf == 3 && l->fl[2];
    if (!l->is_free || l->has_bytes)
        return parse_bytes(p, l);
    return ML_OK;
}

/* Whether the id's state allows the event: a free of a live allocation, an
 * alloc of an id that is not live. */
static ml_status check_id(trace_parser *p, const trace_line *l, const id_entry *e)
{
    const char *id = l->text + l->f[1];
    unsigned idcol = (unsigned)l->f[1] + 1;
    int idl = (int)(l->fl[1] > 60 ? 60 : l->fl[1]);
    if (l->is_free && e->name && !e->live)
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, idcol,
                    "free of '%.*s', which line %u freed already: each alloc is freed "
                    "once", idl, id, e->line);
    if (l->is_free && !e->name)
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, idcol,
                    "free of '%.*s', which no earlier line allocates: drop the line, or "
                    "add its alloc before it", idl, id);
    if (!l->is_free && e->name && e->live)
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, idcol,
                    "'%.*s' is already allocated (line %u) and not freed: free it first or "
                    "use another id", idl, id, e->line);
    return ML_OK;
}

/* Room for one more event (t->ev, t->ids). */
static ml_status event_room(trace_parser *p)
{
    ml_alloc_trace *t = p->t;
    ml_alloc_event *nev = ml_grow(t->ev, t->n, &p->cap, sizeof *nev, 1024);
    if (!nev)
        return fail(p->err, ML_NOMEM, p->path, 0, 0, "out of memory");
    t->ev = nev;
    if (p->ids_cap < p->cap) {
        char **ni = realloc(t->ids, p->cap * sizeof *ni);
        if (!ni)
            return fail(p->err, ML_NOMEM, p->path, 0, 0, "out of memory");
        t->ids = ni;
        p->ids_cap = p->cap;
    }
    return ML_OK;
}

/* ... and, for a new id, its interned name in t->names and the table. */
static ml_status make_room(trace_parser *p, const trace_line *l, id_entry *e)
{
    ml_alloc_trace *t = p->t;
    ml_status st = event_room(p);
    if (st)
        return st;
    if (!e->name) {
        char **nn = ml_grow(t->names, t->nnames, &p->names_cap, sizeof *nn, 256);
        char *name = nn ? malloc(l->fl[1] + 1) : NULL;
        if (nn)
            t->names = nn;
        if (!name)
            return fail(p->err, ML_NOMEM, p->path, 0, 0, "out of memory");
        memcpy(name, l->text + l->f[1], l->fl[1]);
        name[l->fl[1]] = '\0';
        t->names[t->nnames++] = name;
        e->name = name;
        p->ids.used++;
    }
    return ML_OK;
}

/* An empty_cache event appended to the trace. */
static ml_status add_empty(trace_parser *p)
{
    ml_alloc_trace *t = p->t;
    ml_status st = event_room(p);
    if (st)
        return st;
    t->ev[t->n] = (ml_alloc_event){.slot = (uint32_t)t->n, .line = p->lineno, .empty_cache = true};
    t->ids[t->n++] = NULL;
    t->empties++;
    return ML_OK;
}

/* The event of line l appended to the trace, its id's entry updated. */
static ml_status add_event(trace_parser *p, const trace_line *l)
{
    ml_alloc_trace *t = p->t;
    ml_status st;
    if (t->n >= UINT32_MAX - 1)
        return fail(p->err, ML_RANGE, p->path, p->lineno, 1, "more than %u events",
                    UINT32_MAX - 2);
    if (l->is_empty)
        return add_empty(p);
    if (!id_room(&p->ids))
        return fail(p->err, ML_NOMEM, p->path, 0, 0, "out of memory");
    id_entry *e = lookup(&p->ids, l->text + l->f[1], l->fl[1]);
    if ((st = check_id(p, l, e)) || (st = make_room(p, l, e)))
        return st;
    ml_alloc_event *ev = &t->ev[t->n];
    ev->line = p->lineno;
    ev->free = l->is_free;
    ev->empty_cache = false;
    if (l->is_free && l->has_bytes && l->bytes != t->ev[e->slot].bytes)
        return fail(p->err, ML_SCHEMA, p->path, p->lineno, (unsigned)l->f[2] + 1,
                    "free of '%.*s' gives %llu B, its alloc (line %u) %llu B: a free "
                    "returns what its alloc took; give that size or leave the field empty",
                    (int)(l->fl[1] > 60 ? 60 : l->fl[1]), l->text + l->f[1], l->bytes,
                    e->line, (unsigned long long)t->ev[e->slot].bytes);
    if (l->is_free) {
        ev->slot = e->slot;
        ev->bytes = t->ev[e->slot].bytes;
        t->ids[t->n] = NULL;
        e->live = false;
        t->frees++;
    } else {
        ev->slot = (uint32_t)t->n;
        ev->bytes = l->bytes;
        t->ids[t->n] = e->name;
        e->slot = (uint32_t)t->n;
        e->live = true;
        t->allocs++;
    }
    e->line = p->lineno;
    t->n++;
    return ML_OK;
}

ml_status ml__alloc_trace_parse(const char *text, size_t len, const char *path,
                                ml_alloc_trace **out, ml_error *err)
{
    trace_parser p = {calloc(1, sizeof *p.t), {NULL, 0, 0, ml__hash_key_new(&p)}, 0, 0, 0, path,
                      err, 0};
    ml_status st = ML_OK;
    bool header = false;
    if (!p.t)
        return fail(err, ML_NOMEM, path, 0, 0, "out of memory");
    const size_t bom = ml_utf8_bom_len(text, len);
    text += bom, len -= bom;
    for (size_t i = 0; i < len && !st;) {
        trace_line l = {.text = text + i};
        const char *nl = memchr(l.text, '\n', len - i);
        l.len = nl ? (size_t)(nl - l.text) : len - i;
        i += l.len + 1;
        p.lineno++;
        if (l.len && l.text[l.len - 1] == '\r')
            l.len--;
        size_t k = 0;
        while (k < l.len && (l.text[k] == ' ' || l.text[k] == '\t'))
            k++;
        if (k == l.len || l.text[k] == '#')
            continue;
        if (memchr(l.text, '\0', l.len)) {
            st = fail(err, ML_SCHEMA, path, p.lineno, 1, "a NUL byte in the trace");
            break;
        }
        size_t pos = 0;
        l.nf = 0;
        while (l.nf < 4 && field(l.text, l.len, &pos, &l.f[l.nf], &l.fl[l.nf]))
            l.nf++;
        if (!header) {
            st = check_header(&p, &l);
            header = true;
            continue;
        }
        if (!(st = parse_event(&p, &l)))
            st = add_event(&p, &l);
    }
    free(p.ids.e);
    if (!st && !header)
        st = fail(err, ML_SCHEMA, path, 0, 0,
                  "the file is empty: expected the header \"%s\" and one alloc or free per line",
                  header_text);
    if (st) {
        ml__alloc_trace_free(p.t);
        return st;
    }
    *out = p.t;
    return ML_OK;
}

ml_alloc_result ml__alloc_trace_run(ml_alloc_sim *s, const ml_alloc_trace *t, size_t *at)
{
    uint64_t *h = malloc((t->n ? t->n : 1) * sizeof *h);
    *at = 0;
    if (!h)
        return ML_ALLOC_NOMEM;
    ml_alloc_result r = ML_ALLOC_OK;
    size_t i = 0;
    for (; i < t->n && !r; i++) {
        const ml_alloc_event *e = &t->ev[i];
        if (e->empty_cache)
            r = ml__alloc_sim_empty_cache(s);
        else if (e->free)
            r = ml__alloc_sim_free(s, h[e->slot]);
        else
            r = ml__alloc_sim_malloc(s, e->bytes, &h[i]);
        if (r)
            break;
    }
    *at = i;
    free(h); /* what the trace leaves live stays live: nothing frees it */
    return r;
}

ml_alloc_result ml__alloc_replay(const ml_alloc_config *cfg, const ml_alloc_trace *t,
                                 ml_alloc_replay_result *out)
{
    return ml__alloc_replay_from(cfg, NULL, t, out);
}

/* The trace's own counts: those after it less those after the start. */
static void own_counts(ml_alloc_stats *s, const ml_alloc_stats *start)
{
    s->events -= start->events;
    s->device_allocs -= start->device_allocs;
    s->device_frees -= start->device_frees;
    s->num_alloc_retries -= start->num_alloc_retries;
    s->num_ooms -= start->num_ooms;
    if (s->oom_event)
        s->oom_event -= start->events;
}

ml_alloc_result ml__alloc_replay_from(const ml_alloc_config *cfg, const ml_alloc_trace *start,
                                      const ml_alloc_trace *t, ml_alloc_replay_result *out)
{
    ml_alloc_sim *s = NULL;
    ml_alloc_result r = ml__alloc_sim_create(cfg, &s);
    if (r)
        return r;
    ml_alloc_replay_result res;
    memset(&res, 0, sizeof res);
    res.oom_index = SIZE_MAX;
    size_t at = 0;
    if (start) {
        r = ml__alloc_trace_run(s, start, &at);
        ml__alloc_sim_reset_peaks(s);
        ml__alloc_sim_stats(s, &res.start);
    }
    if (!r) {
        r = ml__alloc_trace_run(s, t, &at);
        if (r == ML_ALLOC_OOM) {
            res.oom_index = at;
            r = ML_ALLOC_OK;
        }
    }
    if (!r) {
        ml__alloc_sim_stats(s, &res.stats);
        own_counts(&res.stats, &res.start);
        *out = res;
    }
    ml__alloc_sim_destroy(s);
    return r;
}
