/* colocate's reports: text, JSON and an SVG of the jobs started together
 * (docs/colocate.md). */
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/report.h"
#include "report/report_internal.h"
#include "report/svg_internal.h"

static const char *B(uint64_t v, char *buf)
{
    ml_format_bytes(v, buf, 32);
    return buf;
}

/* A job's device total and step time (0: none, or an inference job). */
static void job_figures(const ml_colocate_job *j, uint64_t *peak, uint64_t *total,
                        uint64_t *reserve, double *step)
{
    if (j->inference) {
        *peak = j->inference->peak;
        *total = j->inference->peak_total;
        *reserve = j->inference->runtime_reserve;
        *step = 0;
        return;
    }
    const ml_summary *s = ml_ledger_summary(j->ledger);
    *peak = s->peak;
    *total = s->peak_total;
    *reserve = s->runtime_reserve;
    *step = ml_summary_step_time(s) > 0 ? ml_summary_step_time(s) : 0;
}

/* What an inference job counts (docs/colocate.md, "Inference jobs"). */
static void inference_line(FILE *f, size_t j, const ml_inference *i)
{
    char a[32], b[32], c[32], d[32];
    fprintf(f, "  job %zu, inference at batch %llu, seq_len %llu: weights %s, no-grad forward "
               "peak %s",
            j + 1, (unsigned long long)i->batch, (unsigned long long)i->seq_len,
            B(i->weights, a), B(i->forward_peak, b));
    if (i->generate)
        fprintf(f, ", KV cache of %llu tokens %s", (unsigned long long)(i->seq_len + i->generate),
                B(i->kv_cache, c));
    if (i->generate && i->kv_forward) /* use_cache: the forward's output holds its part */
        fprintf(f, " (of which the forward holds %s already)", B(i->kv_forward, d));
    fprintf(f, ": allocator peak %s, held throughout\n", B(i->peak, a));
}

/* The verdict line: the device totals against the device and, with a
 * budget given, the allocator peaks against it; plan's headroom. */
static void verdict_line(FILE *f, const ml_colocate_result *r)
{
    char a[32], b[32], h[32], p[32], q[32];
    fprintf(f, "\nunsynchronised, the peaks lined up: %s of %s", B(r->worst_total, a),
            B(r->memory, b));
    if (r->budget_given)
        fprintf(f, ", %s %s of the %s budget",
                r->peaks_reserved == 1   ? "reserved peaks"
                : r->peaks_reserved == 2 ? "reserved (or allocator) peaks"
                                         : "allocator peaks",
                B(r->peak_sum, p), B(r->budget, q));
    if (r->oom_job) {
        fprintf(f, ": DOES NOT FIT: job %zu alone runs out of the device in its allocator "
                   "simulation (memledger plan says so too)\n",
                r->oom_job);
        return;
    }
    fprintf(f, ": %s %s\n", r->fits ? "FITS, headroom" : "DOES NOT FIT, over by",
            B(r->fits ? (uint64_t)r->headroom : (uint64_t)(-r->headroom), h));
}

int ml_report_colocate_text(FILE *f, const ml_colocate_job *jobs, const char *const *names,
                            size_t n, const ml_colocate_result *r)
{
    char a[32];
    fprintf(f, "memledger colocate: %zu jobs on one %s device, each in its own process (its "
               "own runtime reserve)\n\n",
            n, B(r->memory, a));
    fprintf(f, "%-3s %12s %12s  %s\n", "", "device total", "step time", "job");
    for (size_t j = 0; j < n; j++) {
        uint64_t peak, total, reserve;
        double step;
        job_figures(&jobs[j], &peak, &total, &reserve, &step);
        char st[32] = "-";
        if (jobs[j].inference)
            snprintf(st, sizeof st, "inference");
        else if (step > 0)
            snprintf(st, sizeof st, "%.4g s", step);
        fprintf(f, "%-3zu %12s %12s  %s%s\n", j + 1, B(total, a), st, names[j],
                jobs[j].ledger && ml_ledger_summary(jobs[j].ledger)->reserved_oom_weighed
                    ? " (runs out of the device on its own: its total stops there)"
                    : "");
    }
    for (size_t j = 0; j < n; j++)
        if (jobs[j].inference)
            inference_line(f, j, jobs[j].inference);
    verdict_line(f, r);
    if (!r->timed) {
        fputs("started together, independent phases: unknown (a time axis needs every "
              "training job's step time: a named device, or --peak-tflops in its options)\n",
              f);
        return ferror(f) ? -1 : 0;
    }
    if (r->aligned_known)
        fprintf(f, "started together: at most %s, %.4g s after the start\n",
                B(r->aligned_total, a), r->aligned_at_s);
    else
        fputs("started together: not computed (the periods are too unequal)\n", f);
    if (r->p_time_over >= 0)
        fprintf(f, "independent phases: over the device %.2f%% of the time (instants that "
                   "take no time on this axis, such as a block's allocations before it runs, not "
                   "counted)\n",
                100.0 * r->p_time_over);
    return ferror(f) ? -1 : 0;
}

/* An inference job's own figures (docs/colocate.md, JSON). */
static void inference_json(FILE *f, const ml_inference *i)
{
    fprintf(f, ", \"inference\": {\"batch\": %llu, \"seq_len\": %llu, \"generate\": %llu, "
               "\"weights\": %llu, \"forward_peak\": %llu, \"kv_forward\": %llu, "
               "\"kv_cache\": %llu}",
            (unsigned long long)i->batch, (unsigned long long)i->seq_len,
            (unsigned long long)i->generate, (unsigned long long)i->weights,
            (unsigned long long)i->forward_peak, (unsigned long long)i->kv_forward,
            (unsigned long long)i->kv_cache);
}

int ml_report_colocate_json(FILE *f, const ml_colocate_job *jobs, const char *const *names,
                            size_t n, const ml_colocate_result *r)
{
    fprintf(f, "{\"device\": {\"memory\": %llu, \"budget\": %llu},\n \"jobs\": [",
            (unsigned long long)r->memory, (unsigned long long)r->budget);
    for (size_t j = 0; j < n; j++) {
        uint64_t peak, total, reserve;
        double step;
        job_figures(&jobs[j], &peak, &total, &reserve, &step);
        fputs(j ? ",\n  {\"job\": " : "\n  {\"job\": ", f);
        ml_json_put_string(f, names[j]);
        fprintf(f, ", \"peak\": %llu, \"peak_total\": %llu, \"runtime_reserve\": %llu, "
                   "\"step_time_s\": ",
                (unsigned long long)peak, (unsigned long long)total, (unsigned long long)reserve);
        if (step > 0)
            fprintf(f, "%.17g", step);
        else
            fputs("null", f);
        fprintf(f, ", \"kind\": \"%s\"", jobs[j].inference ? "inference" : "training");
        if (jobs[j].inference)
            inference_json(f, jobs[j].inference);
        fputc('}', f);
    }
    fprintf(f, "],\n \"worst\": {\"peak_total\": %llu, \"fits\": %s, \"headroom\": %lld, "
               "\"oom_job\": ",
            (unsigned long long)r->worst_total, r->fits ? "true" : "false",
            (long long)r->headroom);
    if (r->oom_job)
        fprintf(f, "%zu},\n", r->oom_job);
    else
        fputs("null},\n", f);
    /* the budget's own margin (worst.headroom is the smaller of it and the
     * device's): budget - peak, as a signed figure */
    const long long margin = r->budget >= r->peak_sum ? (long long)(r->budget - r->peak_sum)
                                                      : -(long long)(r->peak_sum - r->budget);
    fprintf(f, " \"budget\": {\"bytes\": %llu, \"given\": %s, \"peak\": %llu, "
               "\"headroom\": %lld},\n \"aligned\": ",
            (unsigned long long)r->budget, r->budget_given ? "true" : "false",
            (unsigned long long)r->peak_sum, margin);
    if (r->aligned_known)
        fprintf(f, "{\"peak_total\": %llu, \"at_s\": %.17g}", (unsigned long long)r->aligned_total,
                r->aligned_at_s);
    else
        fputs("null", f);
    fputs(",\n \"p_time_over\": ", f);
    if (r->p_time_over >= 0)
        fprintf(f, "%.17g}\n", r->p_time_over);
    else
        fputs("null}\n", f);
    return ferror(f) ? -1 : 0;
}

#define COLOCATE_POINTS 1200

static const char *const job_colors[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759",
                                         "#76b7b2", "#edc948", "#b07aa1", "#9c755f"};
#define JOB_COLORS (sizeof job_colors / sizeof job_colors[0])

/* The jobs' curves stacked over the longest period, started together. */
static void stacked(FILE *f, const ml_svg_chart *c, const ml_colocate_job *jobs, size_t n,
                    double H)
{
    for (size_t j = n; j-- > 0;) {
        /* the top edge of jobs 0..j: later jobs drawn first, underneath */
        fprintf(f, "<polygon fill=\"%s\" fill-opacity=\"0.85\" points=\"%.1f,%.1f",
                job_colors[j % JOB_COLORS], c->x0, ml__svg_py(c, 0));
        for (int k = 0; k <= COLOCATE_POINTS; k++) {
            const double t = H * k / COLOCATE_POINTS;
            uint64_t sum = 0;
            for (size_t i = 0; i <= j; i++)
                sum += ml_colocate_job_level(&jobs[i], t);
            fprintf(f, " %.1f,%.1f", c->x0 + c->w * k / COLOCATE_POINTS,
                    ml__svg_py(c, (double)sum));
        }
        fprintf(f, " %.1f,%.1f\"/>\n", c->x0 + c->w, ml__svg_py(c, 0));
    }
}

/* The budget on the device-total axis: the budget plus the jobs' reserves
 * and allowances (worst_total - peak_sum), saturated. */
static uint64_t budget_level(const ml_colocate_result *r)
{
    const uint64_t extra = r->worst_total - r->peak_sum;
    return r->budget > UINT64_MAX - extra ? UINT64_MAX : r->budget + extra;
}

/* A job's legend text: its number (as the text report's) and its name. */
static char *job_label(size_t j, const char *name)
{
    size_t len = strlen(name) + 24;
    char *s = malloc(len);
    if (s)
        snprintf(s, len, "%zu. %s", j + 1, name);
    return s;
}

int ml_report_colocate_svg(FILE *f, const ml_colocate_job *jobs, const char *const *names,
                           size_t n, const ml_colocate_result *r)
{
    ml_svg_chart c = {90, 70, 720, 420, 1};
    uint64_t top = r->worst_total > r->memory ? r->worst_total : r->memory;
    if (r->budget_given && budget_level(r) > top)
        top = budget_level(r);
    c.ymax = (double)top * 1.06;
    double H = 0;
    for (size_t j = 0; j < n; j++)
        if (jobs[j].ledger)
            H = fmax(H, ml_summary_step_time(ml_ledger_summary(jobs[j].ledger)));
    /* the legend under the plot, every name whole (wrapped), the picture
     * as tall as it needs */
    int lines = 0;
    for (size_t j = 0; j < n; j++) {
        char *label = job_label(j, names[j]);
        if (!label)
            return -1;
        lines += ml__svg_legend_entry(NULL, 0, "", NULL, label);
        free(label);
    }
    const double legend_y = c.y0 + c.h + ML_SVG_LEGEND_GAP;
    ml__svg_header(f, (int)ML_SVG_WIDTH,
                   (int)ceil(legend_y + ML_SVG_LEGEND_LINE * lines + ML_SVG_LEGEND_PAD));
    fprintf(f, "<text x=\"20\" y=\"26\" font-size=\"17\" font-weight=\"bold\">%zu jobs on one "
               "device, started together</text>\n",
            n);
    ml__svg_y_axis(f, &c);
    const bool timed = r->timed && H > 0;
    if (timed)
        stacked(f, &c, jobs, n, H);
    double ly = legend_y;
    for (size_t j = 0; j < n; j++) {
        char *label = job_label(j, names[j]);
        if (!label)
            return -1;
        ly += ML_SVG_LEGEND_LINE *
              ml__svg_legend_entry(f, ly, job_colors[j % JOB_COLORS], NULL, label);
        free(label);
    }
    ml__svg_hline(f, &c, r->memory, "#222", NULL, "device", false);
    ml__svg_hline(f, &c, r->worst_total, "#d62728", "6,4", "peaks lined up", true);
    /* the budget is a line for the allocator peaks summed; the curves are
     * device totals, so it is drawn with the jobs' reserves and allowances
     * on top (the level the stacked totals stay under exactly when the
     * allocator peaks are within the budget) */
    if (r->budget_given)
        ml__svg_hline(f, &c, budget_level(r), "#9467bd", "2,3",
                      "budget + the jobs' reserves", true);
    if (timed) {
        ml__svg_x_axis_time(f, &c, H);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">seconds "
                   "after the common start (0 to %.4g s, the longest step)</text>\n",
                c.x0 + c.w / 2, c.y0 + c.h + 34, H);
    } else
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">no time "
                   "axis: a training job has no step time, or no job trains</text>\n",
                c.x0 + c.w / 2, c.y0 + c.h + 34);
    fputs("</svg>\n", f);
    return ferror(f) ? -1 : 0;
}
