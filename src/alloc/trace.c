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
    ml_verrorf_at(err, code, line, col, fmt, ap);
    va_end(ap);
    return code;
}

/* ---- ids: an open-addressing table from the id to its last allocation ---- */

typedef struct {
    char *name;    /* interned: also in the trace's names */
    uint32_t slot; /* the event that allocated it last */
    uint32_t line; /* where it was last allocated or freed */
    bool live;
} id_entry;

typedef struct {
    id_entry *e;
    size_t cap, used;
} id_table;

static uint64_t hash(const char *s, size_t n)
{
    uint64_t h = 1469598103934665603ull; /* FNV-1a */
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static id_entry *lookup(id_table *t, const char *s, size_t n)
{
    size_t i = (size_t)hash(s, n) & (t->cap - 1);
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
    id_table nt = {ne, cap, t->used};
    for (size_t i = 0; i < t->cap; i++)
        if (t->e[i].name)
            *lookup(&nt, t->e[i].name, strlen(t->e[i].name)) = t->e[i];
    free(t->e);
    *t = nt;
    return true;
}

void ml_alloc_trace_free(ml_alloc_trace *t)
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

ml_status ml_alloc_trace_parse(const char *text, size_t len, const char *path,
                               ml_alloc_trace **out, ml_error *err)
{
    ml_alloc_trace *t = calloc(1, sizeof *t);
    id_table ids = {NULL, 0, 0};
    size_t cap = 0, ids_cap = 0, names_cap = 0;
    ml_status st = ML_OK;
    bool header = false;
    unsigned lineno = 0;
    if (!t)
        return fail(err, ML_NOMEM, path, 0, 0, "out of memory");
    for (size_t i = 0; i < len && !st;) {
        const char *line = text + i;
        const char *nl = memchr(line, '\n', len - i);
        size_t ll = nl ? (size_t)(nl - line) : len - i;
        i += ll + 1;
        lineno++;
        if (ll && line[ll - 1] == '\r')
            ll--;
        size_t k = 0;
        while (k < ll && (line[k] == ' ' || line[k] == '\t'))
            k++;
        if (k == ll || line[k] == '#')
            continue;
        if (memchr(line, '\0', ll)) {
            st = fail(err, ML_SCHEMA, path, lineno, 1, "a NUL byte in the trace");
            break;
        }
        size_t pos = 0, f[4], fl[4];
        int nf = 0;
        while (nf < 4 && field(line, ll, &pos, &f[nf], &fl[nf]))
            nf++;
        if (!header) {
            if (nf != 3 || fl[0] != 6 || memcmp(line + f[0], "action", 6) || fl[1] != 2 ||
                memcmp(line + f[1], "id", 2) || fl[2] != 5 || memcmp(line + f[2], "bytes", 5))
                st = fail(err, ML_SCHEMA, path, lineno, 1,
                          "the header must be \"%s\" (an allocator trace), got \"%.*s\"; "
                          "calib/snapshot_to_trace.py converts a PyTorch memory snapshot",
                          header_text, (int)(ll > 80 ? 80 : ll), line);
            header = true;
            continue;
        }
        bool is_free = fl[0] == 4 && !memcmp(line + f[0], "free", 4);
        if (!is_free && !(fl[0] == 5 && !memcmp(line + f[0], "alloc", 5))) {
            st = fail(err, ML_SCHEMA, path, lineno, (unsigned)f[0] + 1,
                      "unknown action '%.*s': use alloc or free", (int)(fl[0] > 40 ? 40 : fl[0]),
                      line + f[0]);
            break;
        }
        if (nf > 3 || (nf < 3 && !(is_free && nf == 2))) {
            st = fail(err, ML_SCHEMA, path, lineno, 1,
                      "expected 3 fields (action,id,bytes), got %s%d", nf > 3 ? "more than " : "",
                      nf > 3 ? 3 : nf);
            break;
        }
        if (!fl[1]) {
            st = fail(err, ML_SCHEMA, path, lineno, (unsigned)f[1] + 1,
                      "the id is empty: name each allocation with a token");
            break;
        }
        unsigned long long bytes = 0;
        if (!is_free || (nf == 3 && fl[2])) {
            char buf[32];
            char *end = NULL;
            unsigned col = (unsigned)f[2] + 1;
            if (nf < 3 || !fl[2] || fl[2] >= sizeof buf) {
                st = fail(err, fl[2] >= sizeof buf ? ML_RANGE : ML_SCHEMA, path, lineno, col,
                          "bytes: expected a whole number of bytes");
                break;
            }
            memcpy(buf, line + f[2], fl[2]);
            buf[fl[2]] = '\0';
            errno = 0;
            bytes = strtoull(buf, &end, 10);
            if (*end || buf[0] < '0' || buf[0] > '9') {
                st = fail(err, ML_SCHEMA, path, lineno, col,
                          "bytes: '%s' is not a whole number of bytes (write 1048576, not 1MiB "
                          "or 1e6)", buf);
                break;
            }
            if (errno == ERANGE) {
                st = fail(err, ML_RANGE, path, lineno, col, "bytes: '%s' does not fit in 64 bits",
                          buf);
                break;
            }
        }
        if (t->n >= UINT32_MAX - 1) {
            st = fail(err, ML_RANGE, path, lineno, 1, "more than %u events", UINT32_MAX - 2);
            break;
        }
        if (!id_room(&ids)) {
            st = fail(err, ML_NOMEM, path, 0, 0, "out of memory");
            break;
        }
        id_entry *e = lookup(&ids, line + f[1], fl[1]);
        unsigned idcol = (unsigned)f[1] + 1;
        int idl = (int)(fl[1] > 60 ? 60 : fl[1]);
        if (is_free && (!e->name || !e->live)) {
            if (e->name)
                st = fail(err, ML_SCHEMA, path, lineno, idcol,
                          "free of '%.*s', which line %u freed already: each alloc is freed "
                          "once", idl, line + f[1], e->line);
            else
                st = fail(err, ML_SCHEMA, path, lineno, idcol,
                          "free of '%.*s', which no earlier line allocates: drop the line, or "
                          "add its alloc before it", idl, line + f[1]);
            break;
        }
        if (!is_free && e->name && e->live) {
            st = fail(err, ML_SCHEMA, path, lineno, idcol,
                      "'%.*s' is already allocated (line %u) and not freed: free it first or "
                      "use another id", idl, line + f[1], e->line);
            break;
        }
        ml_alloc_event *nev = ml_grow(t->ev, t->n, &cap, sizeof *nev, 1024);
        if (!nev) {
            st = fail(err, ML_NOMEM, path, 0, 0, "out of memory");
            break;
        }
        t->ev = nev;
        if (ids_cap < cap) {
            char **ni = realloc(t->ids, cap * sizeof *ni);
            if (!ni) {
                st = fail(err, ML_NOMEM, path, 0, 0, "out of memory");
                break;
            }
            t->ids = ni;
            ids_cap = cap;
        }
        if (!e->name) {
            char **nn = ml_grow(t->names, t->nnames, &names_cap, sizeof *nn, 256);
            char *name = nn ? malloc(fl[1] + 1) : NULL;
            if (nn)
                t->names = nn;
            if (!name) {
                st = fail(err, ML_NOMEM, path, 0, 0, "out of memory");
                break;
            }
            memcpy(name, line + f[1], fl[1]);
            name[fl[1]] = '\0';
            t->names[t->nnames++] = name;
            e->name = name;
            ids.used++;
        }
        ml_alloc_event *ev = &t->ev[t->n];
        ev->line = lineno;
        ev->free = is_free;
        if (is_free) {
            ev->slot = e->slot;
            ev->bytes = t->ev[e->slot].bytes;
            t->ids[t->n] = NULL;
            e->live = false;
            t->frees++;
        } else {
            ev->slot = (uint32_t)t->n;
            ev->bytes = bytes;
            t->ids[t->n] = e->name;
            e->slot = (uint32_t)t->n;
            e->live = true;
            t->allocs++;
        }
        e->line = lineno;
        t->n++;
    }
    free(ids.e);
    if (!st && !header)
        st = fail(err, ML_SCHEMA, path, 0, 0,
                  "the file is empty: expected the header \"%s\" and one alloc or free per line",
                  header_text);
    if (st) {
        ml_alloc_trace_free(t);
        return st;
    }
    *out = t;
    return ML_OK;
}

ml_alloc_result ml_alloc_replay(const ml_alloc_config *cfg, const ml_alloc_trace *t,
                                ml_alloc_replay_result *out)
{
    ml_alloc_sim *s = NULL;
    ml_alloc_result r = ml_alloc_sim_create(cfg, &s);
    if (r)
        return r;
    uint64_t *h = malloc((t->n ? t->n : 1) * sizeof *h);
    if (!h) {
        ml_alloc_sim_destroy(s);
        return ML_ALLOC_NOMEM;
    }
    ml_alloc_replay_result res;
    memset(&res, 0, sizeof res);
    res.oom_index = SIZE_MAX;
    for (size_t i = 0; i < t->n && !r; i++) {
        const ml_alloc_event *e = &t->ev[i];
        if (e->free) {
            r = ml_alloc_sim_free(s, h[e->slot]);
        } else {
            r = ml_alloc_sim_malloc(s, e->bytes, &h[i]);
            if (r == ML_ALLOC_OOM) {
                res.oom_index = i;
                r = ML_ALLOC_OK;
                break;
            }
        }
    }
    if (!r) {
        ml_alloc_sim_stats(s, &res.stats);
        *out = res;
    }
    free(h);
    ml_alloc_sim_destroy(s);
    return r;
}
