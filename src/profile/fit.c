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

/* The next comma-separated field of line, trimmed, into buf (NUL-terminated);
 * *pos moves past the comma. Returns the field's start (0-based column);
 * *too_long is set when the trimmed field does not fit buf (buf then holds
 * an empty string). */
static size_t field(const char *line, size_t len, size_t *pos, char *buf, size_t size,
                    bool *too_long)
{
    size_t start = *pos;
    while (*pos < len && line[*pos] != ',')
        (*pos)++;
    size_t a = start, b = *pos;
    while (a < b && isspace((unsigned char)line[a]))
        a++;
    while (b > a && isspace((unsigned char)line[b - 1]))
        b--;
    *too_long = b - a >= size;
    size_t k = *too_long ? 0 : b - a;
    memcpy(buf, line + a, k);
    buf[k] = '\0';
    if (*pos < len)
        (*pos)++; /* the comma */
    return start;
}

/* The header row: the columns of micro_batch and peak into *col_b, *col_p,
 * how many it names into *ncols. */
static ml_status read_header(const char *line, size_t llen, unsigned lineno, int *col_b,
                             int *col_p, int *ncols, ml_error *err)
{
    char buf[POINTS_MAX_FIELD + 1];
    size_t pos = 0;
    bool too_long = false;
    for (int c = 0; pos < llen || c == 0; c++) {
        if (c > 64)
            return ml__errorf_at(err, ML_RANGE, lineno, 1, "more than 64 columns");
        /* a name too long for buf is neither of ours: ignored */
        size_t start = field(line, llen, &pos, buf, sizeof buf, &too_long);
        int *col = !strcmp(buf, "micro_batch") ? col_b : !strcmp(buf, "peak") ? col_p : NULL;
        if (col && *col >= 0)
            return ml__errorf_at(err, ML_SCHEMA, lineno, (unsigned)start + 1,
                                 "the header names %s twice (columns %d and %d): which one "
                                 "holds the measurements?",
                                 buf, *col + 1, c + 1);
        if (col)
            *col = c;
        *ncols = c + 1;
        if (pos >= llen)
            break;
    }
    if (*col_b < 0 || *col_p < 0)
        return ml__errorf_at(err, ML_SCHEMA, lineno, 1,
                             "the header must name the columns micro_batch and peak (e.g. "
                             "\"micro_batch,peak\"), got \"%.*s\"",
                             (int)(llen > 80 ? 80 : llen), line);
    return ML_OK;
}

/* A measurement row: its micro_batch and peak (columns col_b, col_p) into *p;
 * a field past the header's ncols columns is refused (no column names it). */
static ml_status read_row(const char *line, size_t llen, unsigned lineno, int col_b, int col_p,
                          int ncols, ml_point *p, ml_error *err)
{
    char buf[POINTS_MAX_FIELD + 1];
    size_t pos = 0;
    bool too_long = false, got_b = false, got_p = false;
    for (int c = 0;; c++) {
        size_t at = field(line, llen, &pos, buf, sizeof buf, &too_long);
        unsigned colno = (unsigned)at + 1;
        if (c >= ncols)
            return ml__errorf_at(err, ML_SCHEMA, lineno, colno,
                                 "a field past the header's %d columns (\"%s\"): name its "
                                 "column in the header, or remove it",
                                 ncols, buf);
        if ((c == col_b || c == col_p) && too_long)
            return ml__errorf_at(err, ML_SCHEMA, lineno, colno,
                                 "%s: a field longer than %u bytes; a number or a size is "
                                 "shorter",
                                 c == col_b ? "micro_batch" : "peak", POINTS_MAX_FIELD);
        if (c == col_b) {
            char *end = NULL;
            errno = 0;
            unsigned long long v = strtoull(buf, &end, 10);
            if (!buf[0] || *end || errno || buf[0] == '-' || v == 0 || v > (1ull << 24))
                return ml__errorf_at(
                    err, ML_SCHEMA, lineno, colno,
                    "micro_batch: '%s' is not a whole number between 1 and 16777216", buf);
            p->micro_batch = v;
            got_b = true;
        } else if (c == col_p) {
            ml_error e2;
            memset(&e2, 0, sizeof e2);
            if (ml_parse_size(buf, &p->peak, &e2) != ML_OK)
                return ml__errorf_at(err, ML_SCHEMA, lineno, colno, "peak: %s", e2.msg);
            if (p->peak > POINTS_MAX_PEAK) /* (0 is refused by ml_parse_size) */
                return ml__errorf_at(
                    err, ML_RANGE, lineno, colno,
                    "peak: '%s' is past 1 PiB (2^50 B), thousands of times any device's "
                    "memory: check the column's unit",
                    buf);
            got_p = true;
        }
        if (pos >= llen)
            break;
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
    unsigned lineno = 0;
    size_t i = 0;
    bool header = false;
    ml_status st = ML_OK;
    /* a UTF-8 byte order mark, as spreadsheets write one: skipped, as the
     * YAML and JSON readers skip it */
    i = ml_utf8_bom_len(text, len);
    while (i < len && !st) {
        size_t e = i;
        while (e < len && text[e] != '\n')
            e++;
        size_t ll = e;
        if (ll > i && text[ll - 1] == '\r')
            ll--;
        lineno++;
        const char *line = text + i;
        size_t llen = ll - i;
        i = e + 1;
        size_t k = 0;
        while (k < llen && isspace((unsigned char)line[k]))
            k++;
        if (k == llen || line[k] == '#')
            continue; /* blank or comment */
        if (memchr(line, '\0', llen)) {
            st = ml__errorf_at(err, ML_SCHEMA, lineno, 1, "a NUL byte in the CSV");
            break;
        }
        if (!header) {
            st = read_header(line, llen, lineno, &col_b, &col_p, &ncols, err);
            header = true;
            continue;
        }
        ml_point p = {0, 0, lineno};
        if ((st = read_row(line, llen, lineno, col_b, col_p, ncols, &p, err)))
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
