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

ml_status ml_linfit_points(const double *x, const double *y, size_t n, ml_linfit *out,
                           ml_error *err)
{
    if (n < 2)
        return ml_errorf_at(err, ML_RANGE, 0, 0, "a fit needs at least 2 points, got %zu", n);
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
    if (!(sxx > 0))
        return ml_errorf_at(err, ML_RANGE, 0, 0, "a fit needs at least 2 distinct x values");
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

/* ---- CSV */

static size_t field(const char *line, size_t len, size_t *pos, char *buf, size_t size)
{
    size_t start = *pos, k = 0;
    while (*pos < len && line[*pos] != ',') {
        if (k + 1 < size)
            buf[k++] = line[*pos];
        (*pos)++;
    }
    buf[k] = '\0';
    /* trim */
    char *b = buf;
    while (isspace((unsigned char)*b))
        b++;
    memmove(buf, b, strlen(b) + 1);
    k = strlen(buf);
    while (k && isspace((unsigned char)buf[k - 1]))
        buf[--k] = '\0';
    if (*pos < len)
        (*pos)++; /* the comma */
    return start;
}

ml_status ml_points_parse_csv(const char *text, size_t len, const char *name, ml_point **out,
                              size_t *n, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", name ? name : "<points>");
    if (len > (16u << 20))
        return ml_errorf_at(err, ML_RANGE, 0, 0, "file larger than 16 MiB");
    int col_b = -1, col_p = -1;
    size_t cap = 0, count = 0;
    ml_point *pts = NULL;
    unsigned lineno = 0;
    size_t i = 0;
    bool header = false;
    while (i < len) {
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
            free(pts);
            return ml_errorf_at(err, ML_SCHEMA, lineno, 1, "a NUL byte in the CSV");
        }
        char buf[128];
        size_t pos = 0;
        if (!header) {
            for (int c = 0; pos < llen || c == 0; c++) {
                if (c > 64) {
                    free(pts);
                    return ml_errorf_at(err, ML_RANGE, lineno, 1, "more than 64 columns");
                }
                field(line, llen, &pos, buf, sizeof buf);
                if (!strcmp(buf, "micro_batch"))
                    col_b = c;
                else if (!strcmp(buf, "peak"))
                    col_p = c;
                if (pos >= llen)
                    break;
            }
            if (col_b < 0 || col_p < 0) {
                free(pts);
                return ml_errorf_at(err, ML_SCHEMA, lineno, 1,
                                    "the header must name the columns micro_batch and peak (e.g. "
                                    "\"micro_batch,peak\"), got \"%.*s\"",
                                    (int)(llen > 80 ? 80 : llen), line);
            }
            header = true;
            continue;
        }
        ml_point p = {0, 0, lineno};
        bool got_b = false, got_p = false;
        for (int c = 0;; c++) {
            size_t at = field(line, llen, &pos, buf, sizeof buf);
            unsigned colno = (unsigned)at + 1;
            if (c == col_b) {
                char *end = NULL;
                errno = 0;
                unsigned long long v = strtoull(buf, &end, 10);
                if (!buf[0] || *end || errno || buf[0] == '-' || v == 0 || v > (1ull << 24)) {
                    free(pts);
                    return ml_errorf_at(
                        err, ML_SCHEMA, lineno, colno,
                        "micro_batch: '%s' is not a whole number between 1 and 16777216", buf);
                }
                p.micro_batch = v;
                got_b = true;
            } else if (c == col_p) {
                ml_error e2;
                memset(&e2, 0, sizeof e2);
                if (ml_parse_size(buf, &p.peak, &e2) != ML_OK) {
                    free(pts);
                    return ml_errorf_at(err, ML_SCHEMA, lineno, colno, "peak: %s", e2.msg);
                }
                got_p = true;
            }
            if (pos >= llen)
                break;
        }
        if (!got_b || !got_p) {
            free(pts);
            return ml_errorf_at(err, ML_SCHEMA, lineno, 1, "the row lacks the %s column",
                                got_b ? "peak" : "micro_batch");
        }
        if (count == 1000000) {
            free(pts);
            return ml_errorf_at(err, ML_RANGE, lineno, 1, "more than 1000000 points");
        }
        ml_point *np = ml_grow(pts, count, &cap, sizeof *np, 16);
        if (!np) {
            free(pts);
            return ml_errorf_at(err, ML_NOMEM, 0, 0, "out of memory");
        }
        pts = np;
        pts[count++] = p;
    }
    if (!header) {
        free(pts);
        return ml_errorf_at(err, ML_SCHEMA, 0, 0,
                            "the file is empty: expected a header \"micro_batch,peak\" "
                            "and one row per measurement");
    }
    if (count < 2) {
        free(pts);
        return ml_errorf_at(err, ML_RANGE, lineno, 1,
                            "a fit needs at least 2 measurements, got %zu", count);
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
    char *buf = ml_read_file(path, &len, err);
    if (!buf)
        return err->code;
    ml_status st = ml_points_parse_csv(buf, len, path, out, n, err);
    free(buf);
    return st;
}

ml_status ml_points_analyse(const ml_point *p, size_t n, uint64_t budget, uint64_t at,
                            ml_points_fit *out, ml_error *err)
{
    if (n < 2)
        return ml_errorf_at(err, ML_RANGE, 0, 0, "a fit needs at least 2 points, got %zu", n);
    double *x = malloc(n * sizeof *x), *y = malloc(n * sizeof *y);
    if (!x || !y) {
        free(x);
        free(y);
        return ml_errorf_at(err, ML_NOMEM, 0, 0, "out of memory");
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
    r.fixed_bytes = r.fit.fixed;
    r.per_sample_bytes = r.fit.slope;
    uint64_t max_measured_b = 0;
    for (size_t i = 0; i < n; i++) {
        if (p[i].micro_batch > max_measured_b)
            max_measured_b = p[i].micro_batch;
        if (budget && p[i].peak <= budget && p[i].micro_batch > r.max_measured_micro_batch)
            r.max_measured_micro_batch = p[i].micro_batch;
    }
    if (budget && r.fit.slope > 0) {
        double b = floor(((double)budget - r.fit.fixed) / r.fit.slope);
        if (!(b >= 1))
            b = 0;
        if (b > 1e15)
            b = 1e15;
        /* guard the floor against rounding: the fit at b must be within the
         * budget. A bisection, not a walk down by 1: past 2^53 a double
         * minus 1 is the same double (a fuzzed CSV hung here) */
        if (b >= 1 && r.fit.fixed + r.fit.slope * b > (double)budget) {
            double lo = 0, hi = b;
            while (hi - lo > 1) {
                double mid = floor((lo + hi) / 2);
                if (r.fit.fixed + r.fit.slope * mid <= (double)budget)
                    lo = mid;
                else
                    hi = mid;
            }
            b = lo;
        }
        r.max_micro_batch = (uint64_t)b;
        r.extrapolated = r.max_micro_batch > max_measured_b;
    }
    if (at)
        r.peak_at = r.fit.fixed + r.fit.slope * (double)at;
    *out = r;
    return ML_OK;
}
