/* A distribution of sample lengths: parsing (a CSV of lengths or counted
 * lengths, or quantiles) and its CDF, quantiles and the distribution of the
 * longest of b samples (docs/lengths.md). */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "memledger/lengths.h"
#include "util/error.h"
#include "util/grow.h"
#include "util/utf8.h"

#define MAX_LENGTH (1ull << 28) /* training.seq_len's limit */
#define MAX_COUNT (1ull << 40)

/* Knots (t[i], F[i]) with t ascending and F non-decreasing, F = 1 at the
 * last. Counted samples: F is a step function, F(t) = F[i] for t in
 * [t[i], t[i+1]). Quantiles: F is linear between knots; the first knot is
 * (min - 1, 0). */
struct ml_lengths {
    size_t n;
    uint64_t *t;
    double *F;
    bool linear;
    uint64_t samples;
};

typedef struct {
    uint64_t t, count;
} bin;

static int bin_cmp(const void *a, const void *b)
{
    const bin *x = a, *y = b;
    return x->t < y->t ? -1 : x->t > y->t;
}

static ml_lengths *lengths_new(size_t n)
{
    ml_lengths *d = calloc(1, sizeof *d);
    if (!d)
        return NULL;
    d->t = malloc((n ? n : 1) * sizeof *d->t);
    d->F = malloc((n ? n : 1) * sizeof *d->F);
    if (!d->t || !d->F) {
        ml_lengths_destroy(d);
        return NULL;
    }
    d->n = n;
    return d;
}

void ml_lengths_destroy(ml_lengths *d)
{
    if (!d)
        return;
    free(d->t);
    free(d->F);
    free(d);
}

/* An unsigned decimal field of the CSV at s (up to a comma or the line's
 * end), within 1..max; false with a message at (line, col). */
static bool csv_number(const char *s, const char *end, uint64_t max, const char *what,
                       const char *form, unsigned line, unsigned col, uint64_t *out,
                       ml_error *err)
{
    while (s < end && (*s == ' ' || *s == '\t'))
        s++, col++;
    const char *p = s;
    uint64_t v = 0;
    while (p < end && *p >= '0' && *p <= '9') {
        if (v > max) /* keeps reading digits, never wraps */
            v = max + 1;
        else
            v = v * 10 + (uint64_t)(*p - '0');
        p++;
    }
    const char *q = p;
    while (q < end && (*q == ' ' || *q == '\t' || *q == '\r'))
        q++;
    if (p == s || q != end) {
        ml__errorf_at(err, ML_SYNTAX, line, col,
                      "%s: expected a whole number, got \"%.*s\" (lines are %s)", what,
                      (int)(end - s > 40 ? 40 : end - s), s, form);
        return false;
    }
    if (v < 1 || v > max) {
        ml__errorf_at(err, ML_RANGE, line, col, "%s: must be between 1 and %llu, got %.*s", what,
                      (unsigned long long)max, (int)(p - s > 40 ? 40 : p - s), s);
        return false;
    }
    *out = v;
    return true;
}

typedef enum { LINE_BLANK, LINE_HEADER, LINE_DATA } line_kind;

/* Whether a[0 .. n) is the lower-case name, letters in either case. */
static bool same_name(const char *a, const char *name, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (tolower((unsigned char)a[i]) != name[i])
            return false;
    return true;
}

/* A header [p, end) of names: `length`, or `length` and `count` in either
 * order; *swapped when count comes first. False with a message naming the
 * column otherwise: a header is read by its names, never by position, so a
 * file written as count,length is not read as lengths of its counts. */
static bool csv_header(const char *s, const char *p, const char *end, unsigned line,
                       bool *swapped, ml_error *err)
{
    static const char *const names[] = {"length", "count"};
    int col[2] = {-1, -1}, k = 0;
    for (const char *f = p; f <= end && k < 3; k++) {
        const char *c = memchr(f, ',', (size_t)(end - f));
        const char *fe = c ? c : end, *a = f, *z = fe;
        while (a < z && (*a == ' ' || *a == '\t'))
            a++;
        while (z > a && (z[-1] == ' ' || z[-1] == '\t' || z[-1] == '\r'))
            z--;
        if (a == z && !c && k > 0)
            break; /* one trailing comma, as some exporters write */
        int which = -1;
        for (int j = 0; j < 2; j++)
            if ((size_t)(z - a) == strlen(names[j]) && same_name(a, names[j], (size_t)(z - a)))
                which = j;
        if (which >= 0 && col[which] >= 0) {
            ml__errorf_at(err, ML_SYNTAX, line, (unsigned)(a - s) + 1,
                          "header column %d repeats `%s`: the columns are `length` and, "
                          "optionally, `count`",
                          k + 1, names[which]);
            return false;
        }
        if (which < 0 && k == 0 && a < z && strchr("+-.0123456789", *a)) {
            /* a number the first line does not take as a length */
            ml__errorf_at(err, ML_SYNTAX, line, (unsigned)(a - s) + 1,
                          "\"%.*s\" is neither a length (a whole number of at least 1) nor a "
                          "header naming the columns `length` and, optionally, `count`",
                          (int)(z - a > 40 ? 40 : z - a), a);
            return false;
        }
        if (which < 0 || k == 2) {
            ml__errorf_at(err, ML_SYNTAX, line, (unsigned)(a - s) + 1,
                          "header column %d is \"%.*s\": the columns are `length` and, "
                          "optionally, `count` (in either order)",
                          k + 1, (int)(z - a > 40 ? 40 : z - a), a);
            return false;
        }
        col[which] = k;
        f = fe + 1;
        if (!c)
            break;
    }
    if (col[0] < 0) {
        ml__errorf_at(err, ML_SYNTAX, line, (unsigned)(p - s) + 1,
                      "the header has no `length` column (`length` or `length,count`)");
        return false;
    }
    *swapped = col[1] == 0;
    return true;
}

/* One line [s, end) of the CSV: blank or a comment, a header (names,
 * allowed before the first data line: header_ok, its order into
 * *swapped), or data into *b, read in that order. */
static bool csv_line(const char *s, const char *end, unsigned line, bool header_ok, bool *swapped,
                     bin *b, line_kind *kind, ml_error *err)
{
    const char *p = s;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r'))
        p++;
    *kind = LINE_BLANK;
    if (p == end || *p == '#')
        return true;
    if (header_ok && (*p < '0' || *p > '9')) {
        if (!csv_header(s, p, end, line, swapped, err))
            return false;
        *kind = LINE_HEADER;
        return true;
    }
    const char *comma = memchr(s, ',', (size_t)(end - s));
    const char *first = "length", *second = "count";
    uint64_t max1 = MAX_LENGTH, max2 = MAX_COUNT, *v1 = &b->t, *v2 = &b->count;
    if (*swapped) {
        if (!comma) {
            ml__errorf_at(err, ML_SYNTAX, line, (unsigned)(end - s) + 1,
                          "the header says count,length: this line has one field");
            return false;
        }
        first = "count", second = "length";
        max1 = MAX_COUNT, max2 = MAX_LENGTH, v1 = &b->count, v2 = &b->t;
    }
    const char *form = *swapped ? "`count,length`, as the header says"
                                : "`length` or `length,count`";
    b->count = 1;
    if (!csv_number(s, comma ? comma : end, max1, first, form, line, 1, v1, err))
        return false;
    if (comma && !csv_number(comma + 1, end, max2, second, form, line,
                             (unsigned)(comma + 1 - s) + 1, v2, err))
        return false;
    *kind = LINE_DATA;
    return true;
}

/* Sorted bins, equal lengths merged, into knots F = cumulative share. */
static ml_status from_bins(bin *v, size_t n, ml_lengths **out, ml_error *err)
{
    qsort(v, n, sizeof *v, bin_cmp);
    size_t m = 0;
    for (size_t i = 0; i < n; i++) {
        if (m && v[m - 1].t == v[i].t)
            v[m - 1].count += v[i].count; /* at most 2^40 x 2^20 lines: no wrap */
        else
            v[m++] = v[i];
    }
    ml_lengths *d = lengths_new(m);
    if (!d)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    uint64_t total = 0, cum = 0;
    for (size_t i = 0; i < m; i++)
        total += v[i].count;
    for (size_t i = 0; i < m; i++) {
        cum += v[i].count;
        d->t[i] = v[i].t;
        d->F[i] = i + 1 == m ? 1.0 : (double)cum / (double)total;
    }
    d->samples = total;
    *out = d;
    return ML_OK;
}

ml_status ml_lengths_parse_csv(const char *text, size_t len, const char *name, ml_lengths **out,
                               ml_error *err)
{
    *out = NULL;
    if (err) {
        memset(err, 0, sizeof *err);
        snprintf(err->path, sizeof err->path, "%s", name ? name : "");
    }
    const size_t bom = ml_utf8_bom_len(text, len);
    text += bom, len -= bom;
    bin *v = NULL;
    size_t n = 0, cap = 0;
    unsigned line = 0;
    bool header = false, swapped = false;
    ml_status st = ML_OK;
    for (const char *s = text, *end = text + len; s < end && !st; line++) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *le = nl ? nl : end;
        bin b;
        line_kind kind;
        const char *nul = memchr(s, '\0', (size_t)(le - s));
        if (nul)
            st = ml__errorf_at(err, ML_SYNTAX, line + 1, (unsigned)(nul - s) + 1,
                               "a NUL byte: not a text file");
        else if (line >= (1u << 20))
            st = ml__errorf_at(err, ML_RANGE, line + 1, 1,
                               "more than 1048576 lines (the most a length file holds; give "
                               "counts in a second column instead)");
        else if (!csv_line(s, le, line + 1, !n && !header, &swapped, &b, &kind, err))
            st = err ? err->code : ML_SYNTAX;
        else if (kind == LINE_HEADER)
            header = true;
        else if (kind == LINE_DATA) {
            bin *nv = ml_grow(v, n, &cap, sizeof *v, 256);
            if (!nv)
                st = ml__errorf(err, ML_NOMEM, "out of memory");
            else
                (v = nv)[n++] = b;
        }
        s = le + 1;
    }
    if (!st && !n)
        st = ml__errorf_at(err, ML_RANGE, 0, 0, "no lengths: the file has no data line");
    if (!st)
        st = from_bins(v, n, out, err);
    free(v);
    return st;
}

ml_status ml_lengths_load(const char *path, ml_lengths **out, ml_error *err)
{
    size_t len;
    *out = NULL;
    char *text = ml__read_file(path, &len, err);
    if (!text)
        return err ? err->code : ML_IO;
    ml_status st = ml_lengths_parse_csv(text, len, path, out, err);
    free(text);
    return st;
}

/* One `key=value` of a quantile spec: key pNN, min or max. */
static ml_status spec_item(const char *item, size_t len, double *q, uint64_t *t, ml_error *err)
{
    char buf[64];
    if (len >= sizeof buf)
        return ml__errorf(err, ML_USAGE, "lengths: \"%.*s...\" is too long", 20, item);
    memcpy(buf, item, len);
    buf[len] = '\0';
    char *eq = strchr(buf, '=');
    if (!eq)
        return ml__errorf(err, ML_USAGE,
                          "lengths: \"%s\" is not key=value (e.g. p50=120,p99=480,max=512)", buf);
    *eq = '\0';
    const char *key = buf, *val = eq + 1;
    char *e;
    if (!strcmp(key, "min")) {
        *q = 0;
    } else if (!strcmp(key, "max")) {
        *q = 1;
    } else if (key[0] == 'p' && key[1] >= '0' && key[1] <= '9') {
        double pct = 0;
        if (!ml__decimal(key + 1, &pct) || !(pct > 0 && pct < 100))
            return ml__errorf(err, ML_USAGE,
                              "lengths: \"%s\" is not a percentile pNN with 0 < NN < 100", key);
        *q = pct / 100;
    } else {
        return ml__errorf(err, ML_USAGE, "lengths: unknown key \"%s\" (pNN, min, max)", key);
    }
    if (*val < '0' || *val > '9')
        return ml__errorf(err, ML_USAGE, "lengths: %s: expected a whole number of tokens, got \"%s\"",
                          key, val);
    errno = 0;
    unsigned long long v = strtoull(val, &e, 10);
    if (*e || errno || v < 1 || v > MAX_LENGTH)
        return ml__errorf(err, ML_USAGE, "lengths: %s: must be a length between 1 and %llu, got \"%s\"",
                          key, (unsigned long long)MAX_LENGTH, val);
    *t = v;
    return ML_OK;
}

ml_status ml_lengths_parse_quantiles(const char *spec, ml_lengths **out, ml_error *err)
{
    *out = NULL;
    if (err)
        memset(err, 0, sizeof *err);
    double q[34];
    uint64_t t[34];
    size_t n = 0;
    bool has_min = false, has_max = false;
    for (const char *s = spec; *s;) {
        const char *c = strchr(s, ',');
        size_t len = c ? (size_t)(c - s) : strlen(s);
        if (n == 32)
            return ml__errorf(err, ML_USAGE, "lengths: more than 32 quantiles");
        ml_status st = spec_item(s, len, &q[n], &t[n], err);
        if (st)
            return st;
        for (size_t i = 0; i < n; i++)
            if (q[i] == q[n])
                return ml__errorf(err, ML_USAGE, "lengths: \"%.*s\" given twice", (int)len, s);
        has_min |= q[n] == 0;
        has_max |= q[n] == 1;
        n++;
        s = c ? c + 1 : s + len;
    }
    if (!has_max)
        return ml__errorf(err, ML_USAGE,
                          "lengths: max= is required (the longest sample, e.g. max=512)");
    if (!has_min)
        q[n] = 0, t[n++] = 1;
    /* by quantile (insertion: at most 34) */
    for (size_t i = 1; i < n; i++)
        for (size_t j = i; j > 0 && q[j - 1] > q[j]; j--) {
            double tq = q[j];
            uint64_t tt = t[j];
            q[j] = q[j - 1], t[j] = t[j - 1];
            q[j - 1] = tq, t[j - 1] = tt;
        }
    for (size_t i = 1; i < n; i++)
        if (t[i] < t[i - 1])
            return ml__errorf(err, ML_USAGE,
                              "lengths: the lengths must not fall as the quantile rises "
                              "(%llu at %g %% after %llu at %g %%)",
                              (unsigned long long)t[i], q[i] * 100, (unsigned long long)t[i - 1],
                              q[i - 1] * 100);
    ml_lengths *d = lengths_new(n);
    if (!d)
        return ml__errorf(err, ML_NOMEM, "out of memory");
    /* the minimum's knot is (min - 1, 0): F(min) > 0 */
    d->linear = true;
    for (size_t i = 0; i < n; i++) {
        d->t[i] = i == 0 ? t[0] - 1 : t[i];
        d->F[i] = q[i];
    }
    *out = d;
    return ML_OK;
}

/* The last knot at or below t, for d->t[0] <= t < the last knot's length. */
static size_t last_knot(const ml_lengths *d, uint64_t t)
{
    size_t lo = 0, hi = d->n - 1;
    while (hi - lo > 1) {
        size_t mid = lo + (hi - lo) / 2;
        if (d->t[mid] <= t)
            lo = mid;
        else
            hi = mid;
    }
    return lo;
}

double ml_lengths_cdf(const ml_lengths *d, uint64_t t)
{
    if (t < d->t[0])
        return 0;
    if (t >= d->t[d->n - 1])
        return 1;
    const size_t lo = last_knot(d, t), hi = lo + 1;
    if (!d->linear || d->t[hi] == d->t[lo])
        return d->F[lo];
    return d->F[lo] + (d->F[hi] - d->F[lo]) * (double)(t - d->t[lo]) /
                          (double)(d->t[hi] - d->t[lo]);
}

uint64_t ml_lengths_quantile(const ml_lengths *d, double p)
{
    /* F is non-decreasing on the integers: bisection on t */
    uint64_t lo = ml_lengths_min(d), hi = ml_lengths_max(d);
    while (lo < hi) {
        uint64_t mid = lo + (hi - lo) / 2;
        if (ml_lengths_cdf(d, mid) >= p)
            hi = mid;
        else
            lo = mid + 1;
    }
    return lo;
}

uint64_t ml_lengths_batch_max_quantile(const ml_lengths *d, uint64_t b, double p)
{
    /* F(t)^b >= p  <=>  F(t) >= p^(1/b) */
    return ml_lengths_quantile(d, pow(p, 1.0 / (double)(b ? b : 1)));
}

uint64_t ml_lengths_floor(const ml_lengths *d, uint64_t t)
{
    if (t < ml_lengths_min(d))
        return 0;
    if (t >= ml_lengths_max(d))
        return ml_lengths_max(d);
    if (d->linear)
        return t; /* every length between min and max can occur */
    return d->t[last_knot(d, t)];
}

uint64_t ml_lengths_min(const ml_lengths *d)
{
    return d->linear ? d->t[0] + 1 : d->t[0];
}

uint64_t ml_lengths_max(const ml_lengths *d)
{
    return d->t[d->n - 1];
}

uint64_t ml_lengths_samples(const ml_lengths *d)
{
    return d->samples;
}

const char *ml_batching_name(ml_batching b)
{
    switch (b) {
    case ML_BATCHING_PADDED: return "padded";
    case ML_BATCHING_BUCKETED: return "bucketed";
    case ML_BATCHING_PACKED: return "packed";
    }
    return "?";
}

bool ml_batching_parse(const char *s, ml_batching *out)
{
    for (int b = ML_BATCHING_PADDED; b <= ML_BATCHING_PACKED; b++)
        if (!strcmp(s, ml_batching_name((ml_batching)b))) {
            *out = (ml_batching)b;
            return true;
        }
    return false;
}
