/* memledger calibrate: fit a user's measured peaks (--points), or run the
 * calibration runner (memledger-calibrate, built with OpenBLAS or CUDA). */
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cli/cli.h"

static const char usage[] =
    "usage: memledger calibrate --points FILE.csv [--budget SIZE] [--at N] [--format text|json]\n"
    "       memledger calibrate --backend cpu|cuda [--dtype fp32|bf16] [--layers KINDS]\n"
    "                           [--points BxT,...] [--peak-tflops X] [-o PROFILE.yaml]\n"
    "\n"
    "--points: fits your own measurements (a CSV with a header naming the columns\n"
    "micro_batch and peak; peaks as sizes such as 5.4GiB or in bytes, e.g. from\n"
    "torch.cuda.max_memory_allocated) to fixed + per-sample bytes: the fit, its\n"
    "residuals and R^2, the largest micro-batch under the budget (marked when it is\n"
    "an extrapolation past the measured points), the largest measured micro-batch\n"
    "within the budget, and with --at N the predicted peak at N.\n"
    "\n"
    "--backend: runs real forward/backward passes at each micro-batch x sequence\n"
    "length point (default a 4 x 3 grid; write 2x512 or 2\u00d7512), fits per layer kind\n"
    "saved = c*B*T*D*b + fixed, plus c_attention*B*H*T^2*b + c_mask*T^2 for the\n"
    "blocks (lm_head: + c_positions*T), and writes a profile (see\n"
    "'memledger-calibrate --help'); use it with\n"
    "'memledger plan --calib PROFILE'.\n"
    "\n"
    "Exit status: 0 done (and, with --at and --budget, the peak at N fits),\n"
    "1 the peak at N is over the budget, 2 bad input or usage, 3 output failure.\n";

/* A usage error of calibrate --points (printed); returns 2. */
static int points_usage(const char *fmt, const char *arg)
{
    char msg[4200];
    snprintf(msg, sizeof msg, fmt, arg);
    ml_cli_errorf("%s", msg);
    fputs("Try 'memledger calibrate --help'.\n", stderr);
    return ML_EXIT_BAD_INPUT;
}

/* What calibrate --points reports: the measurements, their fit, and the
 * budget and --at asked for (0: not asked). */
typedef struct {
    const char *path;
    const ml_point *p;
    size_t n;
    const ml_points_fit *r;
    uint64_t budget, at;
} points_report;

static void points_text(FILE *f, const points_report *q)
{
    const ml_points_fit *r = q->r;
    const ml_point *p = q->p;
    const size_t n = q->n;
    const uint64_t budget = q->budget, at = q->at;
    char a[32], b[32];
    fprintf(f, "memledger calibrate --points %s: %zu measurements\n", q->path, n);
    /* each term in the unit its size calls for (a fit can have a negative
     * intercept or slope: its sign, then its size) */
    const double terms[2] = {r->fixed_bytes, r->per_sample_bytes};
    char *out[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        double v = terms[i] < 0 ? -terms[i] : terms[i];
        out[i][0] = '-';
        ml_format_bytes(v < 0x1p63 ? (uint64_t)(v + 0.5) : UINT64_MAX, out[i] + (terms[i] < 0),
                        sizeof a - 1);
    }
    fprintf(f, "fit: peak = %s + %s per sample  (R^2 %.6f, largest residual %.2f%%)\n", a, b,
            r->fit.r2, 100 * r->fit.max_rel_residual);
    fprintf(f, "  %-12s %12s %12s %10s\n", "micro_batch", "measured", "fit", "residual");
    for (size_t i = 0; i < n; i++) {
        double fit = r->fixed_bytes + r->per_sample_bytes * (double)p[i].micro_batch;
        ml_format_bytes(p[i].peak, a, sizeof a);
        ml_format_bytes(fit > 0 ? (uint64_t)fit : 0, b, sizeof b);
        double res = p[i].peak ? 100 * ((double)p[i].peak - fit) / (double)p[i].peak : 0;
        if (res > -0.005 && res < 0.005)
            res = 0; /* no "-0.00%" */
        fprintf(f, "  %-12llu %12s %12s %+9.2f%%\n", (unsigned long long)p[i].micro_batch, a,
                b, res);
    }
    if (budget) {
        ml_format_bytes(budget, a, sizeof a);
        fprintf(f, "budget %s:\n", a);
        uint64_t lo = 1, most = 1ull << 24;
        ml_config_range("training.micro_batch", &lo, &most);
        if (r->max_micro_batch)
            fprintf(f, "  largest micro-batch by the fit: %llu%s%s\n",
                    (unsigned long long)r->max_micro_batch,
                    r->max_micro_batch == most ? " (the micro-batch limit: the fit's peak stays "
                                                 "within the budget to there)"
                                               : "",
                    r->extrapolated ? " (extrapolated past the measured points: measure it "
                                     "before relying on it)"
                                   : "");
        else
            fprintf(f, "  no micro-batch fits by the fit\n");
        if (r->max_measured_micro_batch)
            fprintf(f, "  largest measured micro-batch within the budget: %llu (the safe "
                       "choice)\n",
                    (unsigned long long)r->max_measured_micro_batch);
        else
            fprintf(f, "  no measured micro-batch is within the budget\n");
    }
    if (at) {
        ml_format_bytes(r->peak_at > 0 ? (uint64_t)r->peak_at : 0, a, sizeof a);
        fprintf(f, "at micro-batch %llu: %s", (unsigned long long)at, a);
        if (budget) {
            ml_format_bytes(budget, b, sizeof b);
            fprintf(f, " (%s the %s budget)", r->peak_at > (double)budget ? "over" : "within",
                    b);
        }
        fputc('\n', f);
    }
}

typedef struct {
    const char *path, *budget, *at, *out;
    bool json;
} points_flags;

/* calibrate --points' flags into *o: 0, or 2 (printed). */
static int points_parse(int argc, char **argv, points_flags *o)
{
    memset(o, 0, sizeof *o);
    bool format = false;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = NULL, *fmt = NULL;
        /* the value: after '=', or the next argument unless missing or
         * itself a flag ("-o --points": -o was given no file name); "-" is
         * standard output */
        const char **slot = ml_cli_flag_is(a, "--points", argc, argv, &i, &v)   ? &o->path
                            : ml_cli_flag_is(a, "--budget", argc, argv, &i, &v) ? &o->budget
                            : ml_cli_flag_is(a, "--at", argc, argv, &i, &v)     ? &o->at
                            : ml_cli_flag_is(a, "-o", argc, argv, &i, &v) ||
                                    ml_cli_flag_is(a, "--output", argc, argv, &i, &v)
                                ? &o->out
                            : ml_cli_flag_is(a, "--format", argc, argv, &i, &v) ? &fmt
                                                                                : NULL;
        if (!slot)
            return points_usage("calibrate --points: unexpected '%s'", a);
        if (!v || !*v) {
            char flag[32]; /* the flag without its '=' */
            snprintf(flag, sizeof flag, "%.*s", (int)strcspn(a, "="), a);
            return points_usage(slot == &o->path || slot == &o->out ? "%s needs a file name"
                                                                    : "%s needs a value",
                                flag);
        }
        /* a flag given twice (or -o and --output) is refused, never the
         * last one silently taken */
        if (slot == &fmt ? format : *slot != NULL) {
            char flag[32];
            snprintf(flag, sizeof flag, "%.*s", (int)strcspn(a, "="), a);
            return points_usage("%s: given twice (or with another name for it): give it once",
                                flag);
        }
        if (slot != &fmt) {
            *slot = v;
            continue;
        }
        format = true;
        if (!strcmp(v, "json"))
            o->json = true;
        else if (strcmp(v, "text"))
            return points_usage("--format: '%s' is not a format; use text or json", v);
    }
    return 0;
}

static int points(int argc, char **argv)
{
    points_flags o;
    int rc = points_parse(argc, argv, &o);
    if (rc)
        return rc;
    if (!o.path)
        return points_usage("%s", "calibrate: --points needs a file name");
    if (ml_out_refuse_input(o.out, o.path))
        return ML_EXIT_BAD_INPUT;
    uint64_t budget = 0, at = 0;
    ml_error e;
    if (o.budget && ml_parse_size(o.budget, &budget, &e) != ML_OK) {
        ml_cli_errorf("--budget: %s", e.msg);
        return ML_EXIT_BAD_INPUT;
    }
    if (o.at && ml_cli_whole("--at", o.at, 1, 1u << 24, &at))
        return ML_EXIT_BAD_INPUT;
    ml_point *p = NULL;
    size_t n = 0;
    if (ml_points_load_csv(o.path, &p, &n, &e) != ML_OK) {
        ml_cli_print_error(&e);
        return e.code == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    ml_points_fit r;
    if (ml_points_analyse(p, n, budget, at, &r, &e) != ML_OK) {
        ml_cli_opts none; /* no training flags: only --at's name */
        memset(&none, 0, sizeof none);
        ml_cli_decorate(&none, e.msg, sizeof e.msg);
        snprintf(e.path, sizeof e.path, "%s", o.path);
        ml_cli_print_error(&e);
        free(p);
        return e.code == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    ml_out out;
    rc = ml_out_open(&out, o.out);
    if (!rc && !o.json)
        rc = ml_out_text(&out, o.path);
    if (rc) {
        free(p);
        return rc;
    }
    FILE *f = out.f;
    points_report q = {o.path, p, n, &r, budget, at};
    if (o.json)
        ml_report_points_json(f, n, &r, budget, at);
    else
        points_text(f, &q);
    rc = ml_out_close(&out, !ferror(f));
    free(p);
    if (!rc && at && budget && r.peak_at > (double)budget)
        rc = ML_EXIT_NO_FIT;
    return rc;
}

/* The runner sits next to this program (installed), or in ../calib (build tree). */
static int run_runner(int argc, char **argv)
{
    char self[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    char **args = calloc((size_t)argc + 2, sizeof *args);
    if (!args)
        return ML_EXIT_FAILURE;
    for (int i = 0; i < argc; i++)
        args[i + 1] = argv[i];
    if (n > 0) {
        self[n] = '\0';
        char *slash = strrchr(self, '/');
        if (slash) {
            *slash = '\0';
            const char *cands[] = {"%s/memledger-calibrate", "%s/../calib/memledger-calibrate"};
            for (size_t i = 0; i < 2; i++) {
                char path[PATH_MAX + 64];
                snprintf(path, sizeof path, cands[i], self);
                if (access(path, X_OK) == 0) {
                    args[0] = path;
                    execv(path, args);
                }
            }
        }
    }
    args[0] = (char *)"memledger-calibrate";
    execvp("memledger-calibrate", args);
    free(args);
    fprintf(stderr, "memledger: error: the calibration runner (memledger-calibrate) is not "
                    "beside this program, in ../calib from it, or on PATH: it is built only "
                    "with OpenBLAS for --backend cpu (apt-get install libopenblas-dev) or the "
                    "CUDA toolkit and cuBLAS for --backend cuda; 'calibrate --points' works "
                    "without it\n");
    return ML_EXIT_BAD_INPUT;
}

int ml_cmd_calibrate(int argc, char **argv)
{
    bool backend = false, pts = false;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(usage, stdout);
            return ML_EXIT_OK;
        }
        backend = backend || ml_cli_is_flag(argv[i], "--backend");
        pts = pts || ml_cli_is_flag(argv[i], "--points");
    }
    /* --points is a CSV of measurements, or with --backend the runner's grid */
    if (pts && !backend)
        return points(argc, argv);
    if (argc == 0) {
        fputs(usage, stderr);
        return ML_EXIT_BAD_INPUT;
    }
    if (!backend) /* neither form: the runner's flags need --backend too */
        return points_usage("calibrate: give --points FILE.csv (your measured peaks) or "
                            "--backend cpu|cuda (run the runner); '%s' alone is neither",
                            argv[0]);
    return run_runner(argc, argv);
}
