/* Fitting measurements, reading users' CSV measurements, and profiles. */
#include <stdlib.h>

#include "harness.h"

static void test_linfit(void **state)
{
    (void)state;
    /* y = 3 + 2x exactly */
    double x[] = {1, 2, 4, 8}, y[] = {5, 7, 11, 19};
    ml_linfit f;
    ml_error e;
    assert_int_equal(ml_linfit_points(x, y, 4, &f, &e), ML_OK);
    assert_rel_close(f.slope, 2, 1e-12);
    assert_rel_close(f.fixed, 3, 1e-12);
    assert_rel_close(f.r2, 1, 1e-12);
    /* known c and fixed term recovered from noisy points: saved = 52.5 x + 4096 with +-0.5% */
    double xs[12], ys[12];
    uint64_t s = 1;
    for (int i = 0; i < 12; i++) {
        xs[i] = 1e6 * (i + 1);
        s = s * 6364136223846793005ull + 1;
        double noise = ((double)(s >> 11) / 9007199254740992.0 - 0.5) * 0.01;
        ys[i] = (52.5 * xs[i] + 4096) * (1 + noise);
    }
    assert_int_equal(ml_linfit_points(xs, ys, 12, &f, &e), ML_OK);
    assert_rel_close(f.slope, 52.5, 0.01);
    assert_true(f.r2 > 0.999);
    assert_true(f.max_rel_residual < 0.01);
    double one[] = {1, 1};
    assert_int_equal(ml_linfit_points(one, y, 2, &f, &e), ML_RANGE);
    assert_int_equal(ml_linfit_points(x, y, 1, &f, &e), ML_RANGE);
}

/* The design notes: peaks 1.8 / 3.0 / 5.4 GiB at 16 / 32 / 64 fit 0.6 GiB
 * fixed + 0.075 GiB per sample; 80 -> 6.6 GiB, over a 6.5 GiB budget; the
 * fit's largest micro-batch under the budget is 78, past the measured
 * points; the largest measured one within the budget is 64. */
static void test_design_example(void **state)
{
    (void)state;
    const char *csv = "micro_batch,peak\n16,1.8GiB\n32,3.0GiB\n64,5.4GiB\n";
    ml_point *p = NULL;
    size_t n = 0;
    ml_error e;
    assert_int_equal(ml_points_parse_csv(csv, strlen(csv), "peaks.csv", &p, &n, &e), ML_OK);
    assert_int_equal(n, 3);
    assert_int_equal(p[1].peak, 3221225472ull); /* 3.0 GiB */
    ml_points_fit r;
    assert_int_equal(ml_points_analyse(p, n, 6979321856ull, 80, &r, &e), ML_OK);
    const double GiB = 1073741824.0;
    assert_rel_close(r.fixed_bytes / GiB, 0.6, 1e-6);
    assert_rel_close(r.per_sample_bytes / GiB, 0.075, 1e-6);
    assert_rel_close(r.peak_at / GiB, 6.6, 1e-6);
    assert_true(r.peak_at > 6979321856.0);
    assert_int_equal(r.max_micro_batch, 78);
    assert_true(r.extrapolated);
    assert_int_equal(r.max_measured_micro_batch, 64);
    free(p);
    /* columns in another order, bytes, comments and blank lines */
    const char *csv2 = "# from torch.cuda.max_memory_allocated\npeak,run,micro_batch\n\n"
                       "1000,a,1\n2000,b,2\n";
    assert_int_equal(ml_points_parse_csv(csv2, strlen(csv2), "x.csv", &p, &n, &e), ML_OK);
    assert_int_equal(ml_points_analyse(p, n, 0, 0, &r, &e), ML_OK);
    assert_rel_close(r.per_sample_bytes, 1000, 1e-12);
    assert_rel_close(r.fixed_bytes, 0, 0);
    assert_int_equal(r.max_micro_batch, 0); /* no budget asked */
    free(p);
    /* a nearly flat line: 1 byte more over 10^9 samples; under 6.5 GiB the
     * fit admits ~7e18, past 2^53, where a walk down by 1 would never move
     * (a fuzzed CSV hung there): the answer is the micro-batch limit,
     * 2^24, the most a plan takes */
    const ml_point flat[] = {{1, 1000, 2}, {1000000001, 1001, 3}};
    assert_int_equal(ml_points_analyse(flat, 2, 6979321856ull, 0, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 16777216ull);
    assert_false(r.extrapolated); /* between the measured 1 and 1,000,000,001 */
    /* just under the budget at a large b: the bisection lands on the last
     * micro-batch whose fitted peak is within it. 10 B fixed + 3 B per
     * sample, budget 30,000,010 -> 10,000,000; 3 B more per sample than
     * the limit allows -> the limit */
    const ml_point line3[] = {{1, 13, 2}, {2, 16, 3}};
    assert_int_equal(ml_points_analyse(line3, 2, 30000010ull, 0, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 10000000ull);
    assert_int_equal(ml_points_analyse(line3, 2, 30000009ull, 0, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 9999999ull);
    assert_int_equal(ml_points_analyse(line3, 2, 10ull + 3 * 16777217ull, 0, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 16777216ull);
    /* a fit of exactly 1 GiB + 512 MiB a sample (1.5, 2 and 3 GiB at 1, 2
     * and 4) under 6.5 GiB: (6.5 - 1) / 0.5 = 11, where the least-squares
     * doubles' quotient lands a hair under 11 (the floor had said 10,
     * while the fit at 11 is within the budget, as --at 11 says) */
    const ml_point half[] = {{1, 1610612736ull, 2}, {2, 2147483648ull, 3}, {4, 3221225472ull, 4}};
    assert_int_equal(ml_points_analyse(half, 3, 6979321856ull, 11, &r, &e), ML_OK);
    assert_int_equal(r.max_micro_batch, 11);
    assert_true(r.peak_at <= 6979321856.0);
    /* one micro-batch measured twice is no line: refused at the last
     * line, naming the micro-batch and the lines */
    const ml_point same[] = {{16, 1000, 2}, {16, 1100, 5}};
    assert_int_equal(ml_points_analyse(same, 2, 0, 0, &r, &e), ML_RANGE);
    assert_int_equal(e.line, 5);
    assert_non_null(strstr(e.msg, "every line measures micro_batch 16 (lines 2 to 5)"));
}

/* Case i's CSV is refused with msg, at line:col (line 0: no position). */
static void csv_refused(size_t i, const char *csv, const char *msg, unsigned line, unsigned col)
{
    ml_point *p = NULL;
    size_t n = 0;
    ml_error e;
    if (ml_points_parse_csv(csv, strlen(csv), "p.csv", &p, &n, &e) == ML_OK)
        fail_msg("case %zu parsed", i);
    if (!strstr(e.msg, msg))
        fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, msg);
    if (line && (e.line != line || e.col != col))
        fail_msg("case %zu: at %u:%u, expected %u:%u", i, e.line, e.col, line, col);
    assert_null(p);
}

static void test_csv_errors(void **state)
{
    (void)state;
    struct {
        const char *csv, *msg;
        unsigned line, col;
    } cases[] = {
        {"", "the file is empty", 0, 0},
        {"batch,peak\n1,2\n", "must name the columns micro_batch and peak", 1, 1},
        {"micro_batch,peak\n16,1.8GiB\n", "at least 2 measurements", 2, 1},
        {"micro_batch,peak\n16,1.8GiB\nx,2GiB\n", "micro_batch: 'x' is not a whole number", 3, 1},
        {"micro_batch,peak\n16,1.8GiB\n32,lots\n", "peak: 'lots' is not a size", 3, 4},
        {"micro_batch,peak\n16,1.8GiB\n-4,2GiB\n", "is not a whole number", 3, 1},
        {"micro_batch,peak\n16,1.8GiB\n32\n", "lacks the peak column", 3, 1},
        /* "micro_batch,peak,": the second peak starts at column 18 */
        {"micro_batch,peak,peak\n16,1GiB,2GiB\n32,2GiB,3GiB\n", "names peak twice", 1, 18},
        {"micro_batch,micro_batch,peak\n1,2,3\n", "names micro_batch twice", 1, 13},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        csv_refused(i, cases[i].csv, cases[i].msg, cases[i].line, cases[i].col);
}

/* RFC 4180's quoting, as R's write.csv and spreadsheets write it: quoted
 * names and values, a comma or a line's end inside quotes, "" for a quote;
 * each refusal at the line and column of what is wrong (a quoted field's
 * position is its first byte, as an unquoted one's). */
static void test_csv_quoted(void **state)
{
    (void)state;
    ml_point *p = NULL;
    size_t n = 0;
    ml_error e;
    /* write.csv(data.frame(micro_batch = c(16, 32, 64), peak = c("1.8GiB",
     * "3.0GiB", "5.4GiB"))): the row names' column, named "", first */
    const char *r = "\"\",\"micro_batch\",\"peak\"\n\"1\",16,\"1.8GiB\"\n\"2\",32,\"3.0GiB\"\n"
                    "\"3\",64,\"5.4GiB\"\n";
    assert_int_equal(ml_points_parse_csv(r, strlen(r), "r.csv", &p, &n, &e), ML_OK);
    assert_int_equal(n, 3);
    assert_int_equal(p[0].micro_batch, 16);
    assert_int_equal(p[2].micro_batch, 64);
    assert_int_equal(p[1].peak, 3221225472ull); /* 3.0 GiB */
    assert_int_equal(p[2].line, 4);
    free(p);
    /* a comma and a doubled quote inside an ignored column, "\r\n" line
     * ends, blanks around a quoted value */
    const char *c = "micro_batch,peak,note\r\n16,1.8GiB,\"a, b\"\r\n32, \"3.0GiB\" ,\"say \"\"hi\"\"\"\r\n";
    assert_int_equal(ml_points_parse_csv(c, strlen(c), "c.csv", &p, &n, &e), ML_OK);
    assert_int_equal(n, 2);
    assert_int_equal(p[0].peak, 1932735283ull); /* 1.8 GiB, rounded: 1.8 x 2^30 = 1,932,735,283.2 */
    assert_int_equal(p[1].peak, 3221225472ull);
    free(p);
    /* a line's end inside quotes: the record runs on; the next one starts
     * on line 4 */
    const char *m = "micro_batch,peak,note\n16,1.8GiB,\"two\nlines\"\n32,3.0GiB,x\n";
    assert_int_equal(ml_points_parse_csv(m, strlen(m), "m.csv", &p, &n, &e), ML_OK);
    assert_int_equal(n, 2);
    assert_int_equal(p[0].line, 2);
    assert_int_equal(p[1].line, 4);
    free(p);
    struct {
        const char *csv, *msg;
        unsigned line, col;
    } cases[] = {
        /* the quote that opens "2GiB at column 4 of line 3 is never closed */
        {"micro_batch,peak\n16,1GiB\n32,\"2GiB\n", "a quoted field is not closed", 3, 4},
        /* 32,"2"GiB: the G after the closing quote, column 7 */
        {"micro_batch,peak\n16,1GiB\n32,\"2\"GiB\n", "after a quoted field's closing quote", 3,
         7},
        /* a quoted value is read as its content: "x" at column 1 */
        {"micro_batch,peak\n16,1GiB\n\"x\",2GiB\n", "micro_batch: 'x' is not a whole number", 3,
         1},
        {"micro_batch,peak\n16,1GiB\n32,\"lots\"\n", "peak: 'lots' is not a size", 3, 4},
        /* after "a<newline>b" the line is 4: ,zz at column 4 ("b" 1, the
         * quote 2, the comma 3), a fourth field under three columns */
        {"micro_batch,peak,note\n16,1GiB,x\n32,2GiB,\"a\nb\",zz\n", "a field past the header's 3",
         4, 4},
        /* "micro""batch" names micro"batch, not micro_batch */
        {"\"micro\"\"batch\",peak\n1,2\n", "must name the columns micro_batch and peak", 1, 1},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        csv_refused(i, cases[i].csv, cases[i].msg, cases[i].line, cases[i].col);
}

static void test_profile_round_trip(void **state)
{
    (void)state;
    ml_profile *p = ml_profile_new();
    ml_profile_set(p, "name", "test \"quoted\"");
    ml_profile_set(p, "backend", "cpu");
    ml_profile_set(p, "dtype", "fp32");
    ml_profile_set(p, "device", "a test device");
    ml_profile_set_peak(p, 2.0);
    for (uint64_t b = 1; b <= 4; b *= 2) {
        ml_profile_point pt = {.B = b, .T = 64, .D = 128,
                               .saved_bytes = 1000 + b * 64 * 128 * 4 * 21, .peak_forward = 5,
                               .peak_backward = 6, .peak_step = 7, .time_s = 0.5};
        assert_int_equal(ml_profile_add_point(p, "transformer_block", &pt), ML_OK);
    }
    ml_profile_gemm g = {512, 512, 512, 0.5};
    ml_profile_add_gemm(p, &g);
    ml_error e;
    assert_int_equal(ml_profile_fit(p, &e), ML_OK);
    const ml_profile_kind *k = ml_profile_find(p, "transformer_block");
    assert_rel_close(k->fit.slope, 21, 1e-9);
    assert_rel_close(k->fit.fixed, 1000, 1e-6);
    ml_profile *q = profile_round_trip(p);
    assert_string_equal(ml_profile_get(q, "name"), "test \"quoted\"");
    assert_string_equal(ml_profile_get(q, "device"), "a test device");
    const ml_profile_kind *k2 = ml_profile_find(q, "transformer_block");
    assert_int_equal(k2->npoints, 3);
    assert_int_equal(k2->points[2].saved_bytes, k->points[2].saved_bytes);
    assert_rel_close(k2->fit.slope, k->fit.slope, 1e-12);
    assert_rel_close(ml_profile_achieved_tflops(q), 0.5, 0);
    assert_rel_close(ml_profile_efficiency(q), 0.25, 1e-12);
    ml_profile_destroy(p);
    ml_profile_destroy(q);
}

/* The attention terms from synthetic points: saved = 21 * BTDb + 2.25 *
 * BHT^2b + 1 * T^2 + 4096, b = 4, with +-0.2 % deterministic noise, come
 * back within the noise; at one T the attention terms cannot be separated
 * and the fit falls back to c alone; points without H likewise. The
 * profile keeps H and the fit across a write and a read. */
static void test_attention_fit(void **state)
{
    (void)state;
    const uint64_t D = 128, H = 8;
    ml_profile *p = ml_profile_new(), *one_t = ml_profile_new(), *no_h = ml_profile_new();
    ml_profile_set(p, "dtype", "fp32");
    ml_profile_set(one_t, "dtype", "fp32");
    ml_profile_set(no_h, "dtype", "fp32");
    int n = 0;
    for (uint64_t B = 1; B <= 8; B *= 2)
        for (uint64_t T = 64; T <= 256; T *= 2) {
            double exact = 21.0 * (double)(B * T * D * 4) + 2.25 * (double)(B * H * T * T * 4) +
                           (double)(T * T) + 4096;
            double noise = 0.002 * ((n++ % 3) - 1.0); /* -0.2 %, 0, +0.2 % */
            ml_profile_point pt = {.B = B, .T = T, .D = D, .H = H,
                                   .saved_bytes = (uint64_t)llround(exact * (1 + noise))};
            assert_int_equal(ml_profile_add_point(p, "transformer_block", &pt), ML_OK);
            if (T == 128)
                ml_profile_add_point(one_t, "transformer_block", &pt);
            pt.H = 0;
            ml_profile_add_point(no_h, "transformer_block", &pt);
        }
    ml_error e;
    assert_int_equal(ml_profile_fit(p, &e), ML_OK);
    const ml_profile_kind *k = ml_profile_find(p, "transformer_block");
    assert_rel_close(k->fit.slope, 21, 0.01);
    assert_rel_close(k->attn, 2.25, 0.01);
    assert_true(k->fit.r2 > 0.9999 && k->fit.r2 < 1);
    assert_true(k->fit.max_rel_residual < 0.004);
    /* the fitted total at an unmeasured shape, within the noise */
    double want = 21.0 * 4 * 512 * 128 * 4 + 2.25 * 4 * 8 * 512.0 * 512 * 4 + 512.0 * 512 + 4096;
    assert_rel_close(ml_profile_kind_saved(k, 4, 512, D, H, 4), want, 0.005);

    assert_int_equal(ml_profile_fit(one_t, &e), ML_OK);
    k = ml_profile_find(one_t, "transformer_block");
    assert_true(k->attn == 0 && k->mask == 0);
    /* at one T the B*H*T^2 bytes are per-sample: c absorbs them */
    assert_rel_close(k->fit.slope, 21 + 2.25 * 8 * 128 / 128.0, 0.01);
    assert_int_equal(ml_profile_fit(no_h, &e), ML_OK);
    assert_true(ml_profile_find(no_h, "transformer_block")->attn == 0);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(ml_profile_write(f, p), 0);
    fclose(f);
    assert_non_null(strstr(buf, "c_attention: "));
    assert_non_null(strstr(buf, "H: 8, "));
    ml_profile *q = NULL;
    assert_int_equal(ml_profile_load_string(buf, len, "rt.yaml", &q, &e), ML_OK);
    const ml_profile_kind *k2 = ml_profile_find(q, "transformer_block");
    k = ml_profile_find(p, "transformer_block");
    assert_int_equal(k2->points[0].H, H);
    assert_rel_close(k2->attn, k->attn, 1e-12);
    assert_rel_close(k2->mask, k->mask, 1e-9);
    assert_rel_close(k2->fit.slope, k->fit.slope, 1e-12);
    free(buf);
    ml_profile_destroy(q);
    ml_profile_destroy(p);
    ml_profile_destroy(one_t);
    ml_profile_destroy(no_h);
}

static void test_bad_profiles(void **state)
{
    (void)state;
    struct {
        const char *y, *msg;
    } cases[] = {
        {"", "a profile is a mapping"},
        {"profile_version: 2\ndtype: fp32\nlayers: {}\n", "profile_version: 2 is not supported"},
        {"profile_version: 1\ndtype: fp8\nlayers: {}\n", "dtype: 'fp8'"},
        {"profile_version: 1\ndtype: fp32\n", "layers: missing"},
        {"profile_version: 1\ndtype: fp32\nlayrs: {}\n", "layrs: unknown key"},
        {"profile_version: 1\ndtype: fp32\nlayers:\n  conv:\n    points:\n"
         "      - {B: 1, T: 1, D: 1, saved_bytes: 1}\n",
         "unknown layer kind"},
        {"profile_version: 1\ndtype: fp32\nlayers:\n  mlp:\n    points:\n"
         "      - {B: 1, T: 1, D: 1, saved_bytes: -1}\n",
         "expected a number >= 0"},
        {"profile_version: 1\ndtype: fp32\nlayers:\n  mlp:\n    points:\n"
         "      - {B: 1, T: 1, D: 1, saved_bytes: 10}\n",
         "at least 2 points"},
        {"profile_version: 1\ndtype: fp32\nlayers:\n  mlp:\n    points:\n"
         "      - {B: 0, T: 1, D: 1, saved_bytes: 10}\n",
         "must be at least 1"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ml_profile *p = NULL;
        ml_error e;
        ml_status st = ml_profile_load_string(cases[i].y, strlen(cases[i].y), "bad.yaml", &p, &e);
        if (st == ML_OK)
            fail_msg("case %zu loaded", i);
        if (!strstr(e.msg, cases[i].msg))
            fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, cases[i].msg);
        assert_null(p);
    }
}

/* Hostile points CSVs (docs/robustness.md): each refused at its line and
 * column, or, for a byte order mark, read as the YAML and JSON readers read
 * one. */
static void test_csv_hostile(void **state)
{
    (void)state;
    char longf[300];
    /* 10^20 behind 110 zeros: 131 bytes, cut at 127 it read as 10^16 */
    snprintf(longf, sizeof longf, "micro_batch,peak\n1,1000\n2,%0110d%s\n", 0,
             "100000000000000000000");
    struct {
        const char *csv, *msg;
        unsigned line, col;
    } cases[] = {
        /* 2^64 - 1: past 1 PiB (it reached (uint64_t)2^64, undefined) */
        {"micro_batch,peak\n1,1GiB\n2,18446744073709551615\n", "past 1 PiB", 3, 3},
        {"micro_batch,peak\n1,1GiB\n2,1025TiB\n", "past 1 PiB", 3, 3},
        {"micro_batch,peak\n1,1GiB\n2,0\n", "is zero", 3, 3},
        {longf, "peak: a field longer than 127 bytes", 3, 3},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++)
        csv_refused(i, cases[i].csv, cases[i].msg, cases[i].line, cases[i].col);
    ml_point *p = NULL;
    size_t n = 0;
    ml_error e;
    /* a field of exactly 127 bytes once trimmed is read whole: 1000 */
    char f127[400];
    snprintf(f127, sizeof f127, "micro_batch,peak\n1,   %0123d1000   \n2,2000\n", 0);
    assert_int_equal(ml_points_parse_csv(f127, strlen(f127), "p.csv", &p, &n, &e), ML_OK);
    assert_int_equal(p[0].peak, 1000);
    free(p);
    /* a UTF-8 byte order mark before the header (was: "the header must name
     * the columns") */
    const char *bom = "\xEF\xBB\xBFmicro_batch,peak\n1,1000\n2,2000\n";
    assert_int_equal(ml_points_parse_csv(bom, strlen(bom), "p.csv", &p, &n, &e), ML_OK);
    assert_int_equal(n, 2);
    assert_int_equal(p[1].peak, 2000);
    free(p);
    /* the largest peak accepted, 1 PiB */
    const char *pib = "micro_batch,peak\n1,1TiB\n2,1125899906842624\n";
    assert_int_equal(ml_points_parse_csv(pib, strlen(pib), "p.csv", &p, &n, &e), ML_OK);
    free(p);
}

/* The analysis of points that parse but do not describe memory. */
static void test_points_implausible(void **state)
{
    (void)state;
    const uint64_t GiB = 1ull << 30;
    ml_points_fit r;
    ml_error e;
    /* 8/16/32 -> 5/3/1 GiB: the fit falls 0.16 GiB per sample (was accepted,
     * peak_at 40 = -0.43 GiB); the pair named is 1 GiB at 32 (line 4) below
     * 5 GiB at 8 (line 2) */
    const ml_point fall[] = {{8, 5 * GiB, 2}, {16, 3 * GiB, 3}, {32, 1 * GiB, 4}};
    memset(&e, 0, sizeof e);
    assert_int_equal(ml_points_analyse(fall, 3, 0, 40, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "the peaks fall as the micro-batch grows"));
    assert_non_null(strstr(e.msg, "1.00 GiB at micro-batch 32, below 5.00 GiB at 8 on line 2"));
    assert_int_equal(e.line, 4);
    /* a flat peak (reached in the optimizer step) with 1 MiB of noise
     * falling: 1 MiB over 48 micro-batches is under 1 % of 10 GiB, kept; its
     * line never reaches a 12 GiB budget, so any micro-batch fits (capped) */
    const ml_point flat[] = {{16, 10 * GiB + (1 << 20), 2}, {32, 10 * GiB, 3}, {64, 10 * GiB, 4}};
    assert_int_equal(ml_points_analyse(flat, 3, 12 * GiB, 8, &r, &e), ML_OK);
    assert_true(r.per_sample_bytes < 0);
    assert_int_equal(r.max_micro_batch, 16777216ull);
    assert_true(r.extrapolated);
    assert_int_equal(r.max_measured_micro_batch, 64);
    /* a prediction below zero: 10 -> 1 KB, 20 -> 11 KB is 1000 B per sample
     * from -9000 B; at micro-batch 1 the line gives -8000 B */
    const ml_point steep[] = {{10, 1000, 2}, {20, 11000, 3}};
    assert_int_equal(ml_points_analyse(steep, 2, 0, 1, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "points.at 1: the fit predicts -8000 B there, below zero"));
    assert_int_equal(ml_points_analyse(steep, 2, 0, 10, &r, &e), ML_OK);
    assert_rel_close(r.peak_at, 1000, 1e-12);
    /* a prediction past 2^53 B: 1 PiB per sample at --at 2^24 */
    const ml_point pib[] = {{1, 1, 2}, {2, 1ull << 50, 3}};
    assert_int_equal(ml_points_analyse(pib, 2, 0, 1u << 24, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "past 8 PiB"));
    /* the fixed term past 2^53 B: 1 B at 2^24 - 1, 1 PiB at 2^24, a line
     * from -2^74 B */
    const ml_point far[] = {{(1u << 24) - 1, 1, 2}, {1u << 24, 1ull << 50, 3}};
    assert_int_equal(ml_points_analyse(far, 2, 0, 0, &r, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "fixed term"));
}

/* Hostile profiles: each refused at the offending node with what to do. */
static void test_profile_hostile(void **state)
{
    (void)state;
#define HDR "profile_version: 1\ndtype: fp32\n"
#define TB2 "  transformer_block:\n    points:\n      - {B: 1, T: 32, D: 64, saved_bytes: 100000}\n" \
            "      - {B: 2, T: 32, D: 64, saved_bytes: 200000}\n"
    struct {
        const char *y, *msg;
        unsigned line, col;
    } cases[] = {
        /* every point at one shape: B*T*D = 11*268435455*1048575 rounds apart
         * in doubles and was fitted to noise (c = 0.003) */
        {HDR "layers:\n  transformer_block:\n    points:\n"
             "      - {B: 11, T: 268435455, D: 1048575, H: 5, saved_bytes: 100000}\n"
             "      - {B: 11, T: 268435455, D: 1048575, H: 5, saved_bytes: 100000}\n"
             "      - {B: 11, T: 268435455, D: 1048575, H: 5, saved_bytes: 100001}\n",
         "all of one size B*T*D = 11*268435455*1048575", 4, 3},
        /* two shapes of one B*T*D: the fit cannot tell them apart */
        {HDR "layers:\n  linear:\n    points:\n      - {B: 1, T: 64, D: 64, saved_bytes: 1}\n"
             "      - {B: 2, T: 32, D: 64, saved_bytes: 2}\n      - {B: 4, T: 32, D: 32, "
             "saved_bytes: 2}\n",
         "all of one size", 4, 3},
        {HDR "layers:\n  linear:\n    points: []\n", "0 points", 4, 3},
        /* a kind twice: both lists were merged into one fit (a second list
         * 1000 times larger flipped gpt2-small's verdict unnoticed) */
        {HDR "layers:\n" TB2 "  transformer_block:\n    points:\n"
             "      - {B: 1, T: 32, D: 64, saved_bytes: 100000000}\n"
             "      - {B: 2, T: 32, D: 64, saved_bytes: 200000000}\n",
         "layers.transformer_block: given twice (first at line 4, column 3)", 8, 3},
        /* any other key twice */
        {HDR "dtype: bf16\nlayers:\n" TB2, "dtype: key given twice (first at line 2", 3, 1},
        {HDR "layers: {}\n", "layers: no layer kind", 3, 9},
        /* GEMM figures past 100 PFLOP/s: 1e300 made the step time vanish */
        {HDR "gemm:\n  - {m: 1024, n: 1024, k: 1024, tflops: 1e300}\nlayers:\n" TB2,
         "gemm[].tflops: 1e+300 TFLOP/s is past 100000", 4, 41},
        {HDR "peak_tflops: 100001\nlayers:\n" TB2, "peak_tflops: 100001 TFLOP/s", 3, 14},
        /* bytes past 1 PiB */
        {HDR "layers:\n  linear:\n    points:\n      - {B: 1, T: 1, D: 1, saved_bytes: 1}\n"
             "      - {B: 2, T: 1, D: 1, saved_bytes: 1125899906842625}\n",
         "saved_bytes: 1125899906842625 B is past 1 PiB", 7, 41},
        /* tags, core ones included */
        {HDR "layers:\n  linear:\n    points:\n      - {B: !!int 1, T: 1, D: 1, saved_bytes: 1}\n",
         "YAML tags (here tag:yaml.org,2002:int)", 6, 13},
    };
#undef HDR
#undef TB2
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ml_profile *p = NULL;
        ml_error e;
        ml_status st = ml_profile_load_string(cases[i].y, strlen(cases[i].y), "bad.yaml", &p, &e);
        if (st == ML_OK)
            fail_msg("case %zu loaded", i);
        if (!strstr(e.msg, cases[i].msg))
            fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, cases[i].msg);
        if (e.line != cases[i].line || e.col != cases[i].col)
            fail_msg("case %zu: at %u:%u, expected %u:%u", i, e.line, e.col, cases[i].line,
                     cases[i].col);
        assert_null(p);
    }
    /* the runner's profile when every point was skipped: nothing to write
     * (it replaced a measured profile with "layers: {}") */
    ml_profile *p = ml_profile_new();
    ml_profile_set(p, "dtype", "fp32");
    ml_error e;
    memset(&e, 0, sizeof e);
    assert_int_equal(ml_profile_fit(p, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "no measured point"));
    ml_profile_destroy(p);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_linfit),
        cmocka_unit_test(test_design_example),
        cmocka_unit_test(test_csv_errors),
        cmocka_unit_test(test_csv_quoted),
        cmocka_unit_test(test_profile_round_trip),
        cmocka_unit_test(test_attention_fit),
        cmocka_unit_test(test_bad_profiles),
        cmocka_unit_test(test_csv_hostile),
        cmocka_unit_test(test_points_implausible),
        cmocka_unit_test(test_profile_hostile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
