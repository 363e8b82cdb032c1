/* Least squares, and the analysis of a user's measured peaks. */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/calib.h"
#include "memledger/model.h"
#include "util/error.h"
#include "util/grow.h"
#include "util/utf8.h"

ml_status ml_linfit_points(const double *x, const double *y, size_t n, ml_linfit *out,
                           ml_error *err)
{
    if (n < 2)
        return ml__errorf_at(err, ML_RANGE, 0, 0, "a fit needs at least 2 points, got %zu", n);
    double mx = 0, my = 0;
    for (size_t i = 0; i < n; i++) {
        mx += x[i];
        my += y[i];
    }
    mx /= (double)n;
    my /= (double)n;
    double sxx = 0, sxy = 0, syy = 0;
    for (size_t i = 0; i < n; i++) {
        sxx += (x[i] - mx) * (x[i] - mx);
        sxy += (x[i] - mx) * (y[i] - my);
        syy += (y[i] - my) * (y[i] - my);
    }
    /* relative, not only > 0: equal x values whose products rounded apart
     * (B*T*D past 2^53) leave a spread of rounding noise, not a slope */
    if (!(sxx > 0) || !(sqrt(sxx) > 1e-12 * fabs(mx) * sqrt((double)n)))
        return ml__errorf_at(err, ML_RANGE, 0, 0, "a fit needs at least 2 distinct x values");
    ml_linfit f;
    f.slope = sxy / sxx;
    f.fixed = my - f.slope * mx;
    double ssr = 0, maxr = 0;
    for (size_t i = 0; i < n; i++) {
        double r = y[i] - (f.fixed + f.slope * x[i]);
        ssr += r * r;
        double rel = y[i] != 0 ? fabs(r) / fabs(y[i]) : fabs(r);
        if (rel > maxr)
            maxr = rel;
    }
    f.r2 = syy > 0 ? 1 - ssr / syy : 1;
    f.max_rel_residual = maxr;
    f.n = n;
    *out = f;
    return ML_OK;
}

/* ---- CSV
 *
 * The limits (docs/calibration.md, "Limits of --points"), each refused with
 * a message rather than cut:
 * - the file: ML_INPUT_MAX_BYTES (16 MiB), as every input memledger reads;
 * - rows: POINTS_MAX_ROWS. The shortest row ("1,1" and a newline) is 4
 *   bytes, so a 16 MiB file may hold 4.2 million: the row limit binds for
 *   rows up to 16 bytes, the file limit for longer ones;
 * - a field: POINTS_MAX_FIELD bytes once trimmed (a number or a size is far
 *   shorter; a longer one was cut at 127 bytes, so 10^20 behind 110 zeros
 *   read as 10^16);
 * - micro_batch: 1 to 2^24 (the planner's limit), peak: 1 B to
 *   POINTS_MAX_PEAK. */
#define POINTS_MAX_ROWS 1000000u
#define POINTS_MAX_FIELD 127u
/* 1 PiB: some 3,900 times the largest single accelerator's memory (288 GB),
 * so a larger peak is a unit mistake (bits, a sum over runs). It also keeps
 * every fitted value well inside 64 bits and exact in a double (2^53). */
#define POINTS_MAX_PEAK (1ull << 50)
/* A fit's fixed term and its prediction at --at must be exact in a double
 * and printable as a 64-bit count: 2^53 B (8 PiB). */
#define POINTS_MAX_FIT 9007199254740992.0

/* The CSV's text and where the reader is: its position, the line there
 * (1-based) and where that line starts (for 1-based byte columns; after a
 * byte order mark on the first line). */
typedef struct {
    const char *t;
    size_t len, i;
    unsigned line;
    size_t bol;
} csv_cursor;

/* White space but the line's end: what a field's value is trimmed of (a
 * line's end ends the record instead, outside quotes). */
static bool blank(char ch)
{
    return ch != '\n' && isspace((unsigned char)ch);
}

/* Whether the physical line at c->i (to its newline) holds a NUL byte. */
static bool line_has_nul(const csv_cursor *c, size_t from)
{
    const char *nl = memchr(c->t + from, '\n', c->len - from);
    size_t e = nl ? (size_t)(nl - c->t) : c->len;
    return memchr(c->t + from, '\0', e - from) != NULL;
}

/* A field's value as it is gathered into buf (size bytes): leading blanks
 * skipped, the length up to its last non-blank byte kept, so that a value
 * too long for buf once trimmed is told from one that fits. */
typedef struct {
    char *buf;
    size_t size, n, end;
} field_value;

static void put(field_value *v, char ch)
{
    if (!v->n && blank(ch))
        return;
    if (v->n < v->size)
        v->buf[v->n] = ch;
    v->n++;
    if (!blank(ch))
        v->end = v->n;
}

/* The next field of the record at c->i, trimmed, into buf (NUL-terminated;
 * an empty string when its trimmed value does not fit, *too_long then
 * set), RFC 4180's quoting read: a field that starts (after blanks) with a
 * double quote runs to the closing one, over commas and line ends, a quote
 * inside written twice (""); elsewhere a quote is a byte like any other.
 * The field's line and 1-based column (its first byte, after the comma
 * before it) into *line, *col; *last is set when the record ends after it
 * (a line's end, "\r\n" included, or the text's). The cursor moves past the
 * comma or the line's end. Returns ML_OK, or ML_SCHEMA for a quoted field
 * left open, a byte after a closing quote or a NUL byte inside quotes. */
static ml_status field(csv_cursor *c, char *buf, size_t size, bool *too_long, unsigned *line,
                       unsigned *col, bool *last, ml_error *err)
{
    const char *t = c->t;
    field_value v = {buf, size, 0, 0};
    *line = c->line;
    *col = (unsigned)(c->i - c->bol) + 1;
    size_t j = c->i;
    while (j < c->len && blank(t[j]))
        j++;
    if (j < c->len && t[j] == '"') {
        const unsigned qline = c->line, qcol = (unsigned)(j - c->bol) + 1;
        for (j++;; j++) {
            if (j >= c->len)
                return ml__errorf_at(err, ML_SCHEMA, qline, qcol,
                                     "a quoted field is not closed: the double quote here has "
                                     "no closing one (a quote inside a field is written twice, "
                                     "\"\")");
            if (t[j] == '"') {
                if (j + 1 < c->len && t[j + 1] == '"') {
                    put(&v, '"');
                    j++;
                    continue;
                }
                j++;
                break;
            }
            if (t[j] == '\n') {
                c->line++;
                c->bol = j + 1;
                if (line_has_nul(c, j + 1))
                    return ml__errorf_at(err, ML_SCHEMA, c->line, 1, "a NUL byte in the CSV");
            }
            put(&v, t[j]);
        }
        while (j < c->len && blank(t[j]))
            j++;
        if (j < c->len && t[j] != ',' && t[j] != '\n')
            return ml__errorf_at(err, ML_SCHEMA, c->line, (unsigned)(j - c->bol) + 1,
                                 "a byte after a quoted field's closing quote: a field ends "
                                 "there (a comma or the line's end), and a quote inside it "
                                 "is written twice (\"\")");
    } else {
        size_t e = j;
        while (e < c->len && t[e] != ',' && t[e] != '\n')
            e++;
        for (size_t k = c->i; k < e; k++) /* (a "\r" before "\n" is trimmed) */
            put(&v, t[k]);
        j = e;
    }
    /* a comma that ends the line ends the record: no empty field after it */
    if (j < c->len && t[j] == ',') {
        size_t r = j + 1;
        if (r < c->len && t[r] == '\r' && (r + 1 == c->len || t[r + 1] == '\n'))
            r++;
        if (r >= c->len || t[r] == '\n')
            j = r;
    }
    *last = j >= c->len || t[j] == '\n';
    if (j < c->len) {
        if (t[j] == '\n') {
            c->line++;
            c->bol = j + 1;
        }
        j++; /* the comma or the line's end */
    }
    c->i = j;
    *too_long = v.end >= size;
    buf[*too_long ? 0 : v.end] = '\0';
    return ML_OK;
}

/* The header record (on line lineno, the first physical line line[0 ..
 * llen)): the columns of micro_batch and peak into *col_b, *col_p, how
 * many it names into *ncols. */
static ml_status read_header(csv_cursor *c, const char *line, size_t llen, unsigned lineno,
                             int *col_b, int *col_p, int *ncols, ml_error *err)
{
    char buf[POINTS_MAX_FIELD + 1];
    bool too_long = false, last = false;
    for (int col = 0; !last; col++) {
        if (col > 64)
            return ml__errorf_at(err, ML_RANGE, lineno, 1, "more than 64 columns");
        /* a name too long for buf is neither of ours: ignored */
        unsigned fl = 0, fc = 0;
        ml_status st = field(c, buf, sizeof buf, &too_long, &fl, &fc, &last, err);
        if (st)
            return st;
        int *at = !strcmp(buf, "micro_batch") ? col_b : !strcmp(buf, "peak") ? col_p : NULL;
        if (at && *at >= 0)
            return ml__errorf_at(err, ML_SCHEMA, fl, fc,
                                 "the header names %s twice (columns %d and %d): which one "
                                 "holds the measurements?",
                                 buf, *at + 1, col + 1);
        if (at)
            *at = col;
        *ncols = col + 1;
    }
    if (*col_b < 0 || *col_p < 0)
        return ml__errorf_at(err, ML_SCHEMA, lineno, 1,
                             "the header must name the columns micro_batch and peak (e.g. "
                             "\"micro_batch,peak\"), got \"%.*s\"",
                             (int)(llen > 80 ? 80 : llen), line);
    return ML_OK;
}

/* A measurement record (starting on line lineno): its micro_batch and peak
 * (columns col_b, col_p) into *p; a field past the header's ncols columns
 * is refused (no column names it). */
static ml_status read_row(csv_cursor *c, unsigned lineno, int col_b, int col_p, int ncols,
                          ml_point *p, ml_error *err)
{
    char buf[POINTS_MAX_FIELD + 1];
    bool too_long = false, got_b = false, got_p = false, last = false;
    for (int col = 0; !last; col++) {
        unsigned fl = 0, colno = 0;
        ml_status st = field(c, buf, sizeof buf, &too_long, &fl, &colno, &last, err);
        if (st)
            return st;
        if (col >= ncols)
            return ml__errorf_at(err, ML_SCHEMA, fl, colno,
                                 "a field past the header's %d columns (\"%s\"): name its "
                                 "column in the header, or remove it",
                                 ncols, buf);
        if ((col == col_b || col == col_p) && too_long)
            return ml__errorf_at(err, ML_SCHEMA, fl, colno,
                                 "%s: a field longer than %u bytes; a number or a size is "
                                 "shorter",
                                 col == col_b ? "micro_batch" : "peak", POINTS_MAX_FIELD);
        if (col == col_b) {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(buf, &end, 10);
            if (!buf[0] || *end || errno || buf[0] == '-' || v == 0 || v > (1ull << 24))
                return ml__errorf_at(
                    err, ML_SCHEMA, fl, colno,
                    "micro_batch: '%s' is not a whole number between 1 and 16777216", buf);
            p->micro_batch = v;
            got_b = true;
        } else if (col == col_p) {
            ml_error e2;
            memset(&e2, 0, sizeof e2);
            if (ml_parse_size(buf, &p->peak, &e2) != ML_OK)
                return ml__errorf_at(err, ML_SCHEMA, fl, colno, "peak: %s", e2.msg);
            if (p->peak > POINTS_MAX_PEAK) /* (0 is refused by ml_parse_size) */
                return ml__errorf_at(
                    err, ML_RANGE, fl, colno,
                    "peak: '%s' is past 1 PiB (2^50 B), thousands of times any device's "
                    "memory: check the column's unit",
                    buf);
            got_p = true;
        }
    }
    if (!got_b || !got_p)
        return ml__errorf_at(err, ML_SCHEMA, lineno, 1, "the row lacks the %s column",
                             got_b ? "peak" : "micro_batch");
    return ML_OK;
}

ml_status ml_points_parse_csv(const char *text, size_t len, const char *name, ml_point **out,
                              size_t *n, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", name ? name : "<points>");
    if (len > ML_INPUT_MAX_BYTES)
        return ml__errorf_at(err, ML_RANGE, 0, 0, "file larger than 16 MiB");
    int col_b = -1, col_p = -1, ncols = 0;
    size_t cap = 0, count = 0;
    ml_point *pts = NULL;
    bool header = false;
    ml_status st = ML_OK;
    /* a UTF-8 byte order mark, as spreadsheets write one: skipped, as the
     * YAML and JSON readers skip it */
    const size_t bom = ml_utf8_bom_len(text, len);
    csv_cursor c = {text, len, bom, 1, bom};
    unsigned lineno = 0; /* the last record's (or line's) first line */
    /* a record a line, but where a quoted field runs over line ends */
    while (c.i < len && !st) {
        const char *line = text + c.i;
        const char *nl = memchr(line, '\n', len - c.i);
        size_t e = nl ? (size_t)(nl - text) : len;
        size_t ll = e;
        if (ll > c.i && text[ll - 1] == '\r')
            ll--;
        size_t llen = ll - c.i;
        lineno = c.line;
        size_t k = 0;
        while (k < llen && isspace((unsigned char)line[k]))
            k++;
        if (k == llen || line[k] == '#') { /* blank or comment */
            c.i = e + 1;
            c.line++;
            c.bol = c.i;
            continue;
        }
        if (memchr(line, '\0', llen)) {
            st = ml__errorf_at(err, ML_SCHEMA, lineno, 1, "a NUL byte in the CSV");
            break;
        }
        if (!header) {
            st = read_header(&c, line, llen, lineno, &col_b, &col_p, &ncols, err);
            header = true;
            continue;
        }
        ml_point p = {0, 0, lineno};
        if ((st = read_row(&c, lineno, col_b, col_p, ncols, &p, err)))
            break;
        if (count == POINTS_MAX_ROWS) {
            st = ml__errorf_at(err, ML_RANGE, lineno, 1, "more than %u points", POINTS_MAX_ROWS);
            break;
        }
        ml_point *np = ml_grow(pts, count, &cap, sizeof *np, 16);
        if (!np) {
            st = ml__errorf_at(err, ML_NOMEM, 0, 0, "out of memory");
            break;
        }
        pts = np;
        pts[count++] = p;
    }
    /* the last line's number, as a message at the end names it */
    if (!st && c.line > lineno && c.bol < len)
        lineno = c.line;
    if (!st && !header)
        st = ml__errorf_at(err, ML_SCHEMA, 0, 0,
                           "the file is empty: expected a header \"micro_batch,peak\" "
                           "and one row per measurement");
    if (!st && count < 2)
        st = ml__errorf_at(err, ML_RANGE, lineno, 1,
                           "a fit needs at least 2 measurements, got %zu", count);
    if (st) {
        free(pts);
        return st;
    }
    *out = pts;
    *n = count;
    return ML_OK;
}

ml_status ml_points_load_csv(const char *path, ml_point **out, size_t *n, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    size_t len = 0;
    char *buf = ml__read_file(path, &len, err);
    if (!buf)
        return err->code;
    ml_status st = ml_points_parse_csv(buf, len, path, out, n, err);
    free(buf);
    return st;
}

/* A larger micro-batch keeps more, never less. A line falling by under 1%
 * of the largest peak across the measured micro-batches is a flat peak (one
 * reached in the optimizer step, say) with noise; a steeper fall is
 * refused, naming a falling pair: the highest peak and the lowest one at a
 * larger micro-batch. */
static ml_status check_rising(const ml_point *p, size_t n, double slope, ml_error *err)
{
    uint64_t min_b = UINT64_MAX, max_b = 0, max_peak = 0;
    for (size_t i = 0; i < n; i++) {
        min_b = p[i].micro_batch < min_b ? p[i].micro_batch : min_b;
        max_b = p[i].micro_batch > max_b ? p[i].micro_batch : max_b;
        max_peak = p[i].peak > max_peak ? p[i].peak : max_peak;
    }
    if (!(-slope * (double)(max_b - min_b) > 0.01 * (double)max_peak))
        return ML_OK;
    size_t hi = 0, lo = n;
    for (size_t i = 1; i < n; i++)
        if (p[i].peak > p[hi].peak)
            hi = i;
    for (size_t i = 0; i < n; i++)
        if (p[i].micro_batch > p[hi].micro_batch && p[i].peak < p[hi].peak &&
            (lo == n || p[i].peak < p[lo].peak))
            lo = i;
    char a[32], b[32], pair[200] = "";
    if (lo < n) {
        ml_format_bytes(p[lo].peak, a, sizeof a);
        ml_format_bytes(p[hi].peak, b, sizeof b);
        snprintf(pair, sizeof pair, " (%s at micro-batch %llu, below %s at %llu on line %u)",
                 a, (unsigned long long)p[lo].micro_batch, b,
                 (unsigned long long)p[hi].micro_batch, p[hi].line);
    }
    return ml__errorf_at(err, ML_RANGE, lo < n ? p[lo].line : 0, lo < n ? 1 : 0,
                         "the peaks fall as the micro-batch grows%s, %.0f B per sample by the "
                         "fit: a larger micro-batch cannot need less memory; check that the "
                         "columns are micro_batch and peak and that each peak was measured "
                         "from a reset (torch.cuda.reset_peak_memory_stats())",
                         pair, slope);
}

/* The largest micro-batch whose fitted peak is within budget (0: none;
 * at most training.micro_batch's limit, 2^24, which a plan takes). */
static uint64_t max_micro_batch(const ml_linfit *fit, uint64_t budget)
{
    uint64_t least = 1, most = 1ull << 24;
    ml_config_range("training.micro_batch", &least, &most);
    /* a flat line (slope <= 0, above) under the budget admits any
     * micro-batch: the limit */
    double b = fit->slope > 0 ? floor(((double)budget - fit->fixed) / fit->slope)
               : fit->fixed <= (double)budget ? (double)most
                                              : 0;
    if (!(b >= 1))
        b = 0;
    if (b > (double)most)
        b = (double)most;
    /* the floor can land one short where the quotient rounds below a
     * whole number (a fit of exactly 1 GiB + 512 MiB a sample under 6.5
     * GiB: 11 by the fit, 10.999... by the division): the next one up
     * where the fit there is within the budget, as --at judges it */
    if (fit->slope > 0 && b + 1 <= (double)most &&
        fit->fixed + fit->slope * (b + 1) <= (double)budget)
        b += 1;
    /* guard the floor against rounding: the fit at b must be within the
     * budget. A bisection, not a walk down by 1: past 2^53 a double
     * minus 1 is the same double (a fuzzed CSV hung here) */
    if (b >= 1 && fit->fixed + fit->slope * b > (double)budget) {
        double lo = 0, hi = b;
        while (hi - lo > 1) {
            double mid = floor((lo + hi) / 2);
            if (fit->fixed + fit->slope * mid <= (double)budget)
                lo = mid;
            else
                hi = mid;
        }
        b = lo;
    }
    return (uint64_t)b;
}

ml_status ml_points_analyse(const ml_point *p, size_t n, uint64_t budget, uint64_t at,
                            ml_points_fit *out, ml_error *err)
{
    if (n < 2)
        return ml__errorf_at(err, ML_RANGE, 0, 0, "a fit needs at least 2 points, got %zu", n);
    /* a line needs two micro-batches: name the lines of the one there is */
    bool distinct = false;
    for (size_t i = 1; i < n && !distinct; i++)
        distinct = p[i].micro_batch != p[0].micro_batch;
    if (!distinct)
        return ml__errorf_at(err, ML_RANGE, p[n - 1].line, 1,
                             "every line measures micro_batch %llu (lines %u to %u): a fit needs "
                             "peaks at two micro-batches or more",
                             (unsigned long long)p[0].micro_batch, p[0].line, p[n - 1].line);
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return ml__errorf_at(err, ML_NOMEM, 0, 0, "out of memory");
    }
    for (size_t i = 0; i < n; i++) {
        x[i] = (double)p[i].micro_batch;
        y[i] = (double)p[i].peak;
    }
    ml_points_fit r;
    memset(&r, 0, sizeof r);
    ml_status st = ml_linfit_points(x, y, n, &r.fit, err);
    free(x);
    free(y);
    if (st)
        return st;
    uint64_t max_b = 0;
    for (size_t i = 0; i < n; i++)
        max_b = p[i].micro_batch > max_b ? p[i].micro_batch : max_b;
    if ((st = check_rising(p, n, r.fit.slope, err)))
        return st;
    if (!(fabs(r.fit.fixed) <= POINTS_MAX_FIT))
        return ml__errorf_at(err, ML_RANGE, 0, 0,
                             "the fit's fixed term is %.4g B, past 8 PiB (2^53 B): the points do "
                             "not lie on a line through a plausible memory use",
                             r.fit.fixed);
    r.fixed_bytes = r.fit.fixed;
    r.per_sample_bytes = r.fit.slope;
    for (size_t i = 0; i < n; i++)
        if (budget && p[i].peak <= budget && p[i].micro_batch > r.max_measured_micro_batch)
            r.max_measured_micro_batch = p[i].micro_batch;
    if (budget) {
        r.max_micro_batch = max_micro_batch(&r.fit, budget);
        r.extrapolated = r.max_micro_batch > max_b;
    }
    if (at) {
        r.peak_at = r.fit.fixed + r.fit.slope * (double)at;
        /* a prediction is a count of bytes: not below zero (the line does
         * not reach down to `at`), not past what a double holds exactly */
        if (!(r.peak_at >= 0) || !(r.peak_at <= POINTS_MAX_FIT))
            return ml__errorf_at(err, ML_RANGE, 0, 0,
                                 "points.at %llu: the fit predicts %.4g B there, %s: the straight line "
                                 "through the measurements does not extend to micro-batch %llu; "
                                 "measure nearer it",
                                 (unsigned long long)at, r.peak_at,
                                 r.peak_at < 0 ? "below zero" : "past 8 PiB (2^53 B)",
                                 (unsigned long long)at);
    }
    *out = r;
    return ML_OK;
}
