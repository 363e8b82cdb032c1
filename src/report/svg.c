/* SVG charts of the memory timeline: a stacked area per category with phase
 * bands, budget and capacity lines and the peak; and the total curves of
 * several checkpoint policies overlaid. Plain SVG 1.1, no scripts, no
 * external resources. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "memledger/report.h"
#include "report/report_internal.h"
#include "report/svg_internal.h"

/* bottom to top: what is resident all iteration first */
static const ml_category stack_order[ML_CAT_COUNT] = {
    ML_CAT_PARAMS, ML_CAT_MASTER, ML_CAT_BUFFERS, ML_CAT_OPTIMIZER, ML_CAT_BATCH,
    ML_CAT_GRADS, ML_CAT_ACTIVATIONS, ML_CAT_RECOMPUTE, ML_CAT_WORKSPACE};
static const char *const cat_color[ML_CAT_COUNT] = {
    [ML_CAT_PARAMS] = "#4e79a7",      [ML_CAT_MASTER] = "#a0cbe8",
    [ML_CAT_GRADS] = "#f28e2b",       [ML_CAT_OPTIMIZER] = "#ffbe7d",
    [ML_CAT_ACTIVATIONS] = "#59a14f", [ML_CAT_RECOMPUTE] = "#8cd17d",
    [ML_CAT_WORKSPACE] = "#b6992d",   [ML_CAT_BATCH] = "#9c755f",
    [ML_CAT_BUFFERS] = "#bab0ac"};
/* every category has a place and a colour (its label: ml__report_category_label) */
_Static_assert(sizeof stack_order / sizeof stack_order[0] == ML_CAT_COUNT, "stack_order");

typedef ml_svg_chart chart;

static double px(const chart *c, double t)
{
    return c->x0 + t * c->w;
}

double ml__svg_py(const chart *c, double bytes)
{
    return c->y0 + c->h - bytes / c->ymax * c->h;
}

#define py ml__svg_py

/* Axis: a binary unit and a 1-2-5 step giving 4 to 10 ticks. */
void ml__svg_y_axis(FILE *f, const chart *c)
{
    static const char *const units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
    int u = 0;
    double scale = 1;
    while (u < 5 && c->ymax / (scale * 1024) >= 1) {
        scale *= 1024;
        u++;
    }
    double span = c->ymax / scale, step = pow(10, floor(log10(span)));
    while (span / step > 10)
        step *= 2;
    while (span / step < 4)
        step /= 2;
    for (double v = 0; v <= span + 1e-9; v += step) {
        double y = py(c, v * scale);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n",
                c->x0, y, c->x0 + c->w, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"end\">%g %s</text>\n",
                c->x0 - 6, y + 4, v, units[u]);
    }
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", c->x0,
            c->y0, c->x0, c->y0 + c->h);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", c->x0,
            c->y0 + c->h, c->x0 + c->w, c->y0 + c->h);
}

/* A horizontal line with its label at the right end, or at the left end
 * (left) so that two close lines do not overprint each other. */
void ml__svg_hline(FILE *f, const chart *c, uint64_t bytes, const char *color, const char *dash,
                   const char *label, bool left)
{
    char b[32];
    ml_format_bytes(bytes, b, sizeof b);
    double y = py(c, (double)bytes);
    fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"%s\" "
               "stroke-width=\"1.5\"%s%s%s/>\n",
            c->x0, y, c->x0 + c->w, y, color, dash ? " stroke-dasharray=\"" : "", dash ? dash : "",
            dash ? "\"" : "");
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"%s\" text-anchor=\"%s\">%s "
               "%s</text>\n",
            left ? c->x0 + 4 : c->x0 + c->w - 4, y - 4, color, left ? "start" : "end", label, b);
}

static uint64_t total_of(const ml_event *e)
{
    uint64_t t = 0;
    for (int k = 0; k < ML_CAT_COUNT; k++)
        t += e->live[k];
    return t;
}

/* At most `cap` points, each the highest event of its bucket (peaks survive). */
size_t ml__svg_sample(const ml_ledger *l, size_t *idx, size_t cap)
{
    size_t n = ml_ledger_event_count(l);
    const ml_event *ev = ml_ledger_events(l);
    if (n <= cap) {
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        return n;
    }
    size_t m = 0;
    for (size_t j = 0; j < cap; j++) {
        size_t a = j * n / cap, b = (j + 1) * n / cap, best = a;
        for (size_t i = a; i < b; i++)
            if (total_of(&ev[i]) > total_of(&ev[best]))
                best = i;
        idx[m++] = best;
    }
    return m;
}

#define SVG_POINTS ML_SVG_POINTS

/* Where an event sits on the x axis: at its time when every event has one
 * (T > 0, the axis' end in seconds), else at its index (den: the event
 * count less one, or 1). */
typedef struct {
    const ml_event *ev;
    double den;
    double T;
} xmap;

static double ex(const chart *c, const xmap *a, size_t i)
{
    return px(c, a->T > 0 ? a->ev[i].t_s / a->T : (double)i / a->den);
}

/* The latest event time when every event has one, else 0 (an axis of
 * events: no throughput, or only events at time 0). */
double ml__svg_time_end(const ml_ledger *l)
{
    size_t n = ml_ledger_event_count(l);
    const ml_event *ev = ml_ledger_events(l);
    double T = 0;
    for (size_t i = 0; i < n; i++) {
        if (!(ev[i].t_s >= 0))
            return 0;
        if (ev[i].t_s > T)
            T = ev[i].t_s;
    }
    return T;
}

/* On a time axis of T seconds, the events kept for drawing: per column of
 * cols, the highest event and the column's last (in event order), so that
 * a step function through them climbs to every spike at its true height
 * however many events share its instant (docs/cli.md, "timeline"). */
static size_t sample_time(const ml_ledger *l, double T, size_t *idx, size_t cols)
{
    size_t n = ml_ledger_event_count(l), m = 0, cur = 0, mi = 0, li = 0;
    const ml_event *ev = ml_ledger_events(l);
    for (size_t i = 0; i <= n; i++) {
        size_t col = cols;
        if (i < n) {
            double x = ev[i].t_s / T * (double)cols;
            col = x < (double)(cols - 1) ? (size_t)x : cols - 1;
        }
        if (i > 0 && i < n && col == cur) {
            li = i;
            if (total_of(&ev[i]) > total_of(&ev[mi]))
                mi = i;
            continue;
        }
        if (i > 0) { /* the column ends: its highest, then its last */
            idx[m++] = mi;
            if (li != mi)
                idx[m++] = li;
        }
        cur = col;
        mi = li = i;
    }
    return m;
}

/* The events to draw on either axis (at most SVG_POINTS). */
static size_t sample(const ml_ledger *l, const xmap *a, size_t *idx)
{
    if (!ml_ledger_event_count(l))
        return 0;
    return a->T > 0 ? sample_time(l, a->T, idx, SVG_POINTS / 2)
                    : ml__svg_sample(l, idx, SVG_POINTS);
}

void ml__svg_x_axis_time(FILE *f, const chart *c, double T)
{
    double step = pow(10, floor(log10(T)));
    while (T / step > 10)
        step *= 2;
    while (T / step < 4)
        step /= 2;
    for (double v = 0; v <= T * (1 + 1e-9); v += step) {
        double x = px(c, v / T);
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#333\"/>\n", x,
                c->y0 + c->h, x, c->y0 + c->h + 4);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%g</text>\n",
                x, c->y0 + c->h + 16, v);
    }
}

void ml__svg_header(FILE *f, int w, int h)
{
    fprintf(f, "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
               "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" "
               "viewBox=\"0 0 %d %d\" font-family=\"DejaVu Sans, Helvetica, Arial, sans-serif\">\n"
               "<rect width=\"100%%\" height=\"100%%\" fill=\"#fff\"/>\n",
            w, h, w, h);
}

/* The title and the settings line, each wrapped to the picture's width w
 * (a long model name or checkpoint list takes more lines, never leaves the
 * picture); with_checkpoint false on a chart whose curves are the policies
 * (compare), where one policy would mislead. f NULL: writes nothing.
 * Returns how much lower the chart starts than under a one-line title and
 * settings line, in SVG units; -1 when out of memory. */
static double title(FILE *f, double w, const ml_model *m, const ml_config *cfg,
                    const char *what, bool with_checkpoint)
{
    const char *name = ml_model_name(m);
    size_t tn = strlen(name) + strlen(what) + 8;
    char *t = malloc(tn);
    if (!t)
        return -1;
    snprintf(t, tn, "%s — %s", name, what);
    char ck[1200], sl[96] = "", set[1600];
    ml_checkpoint_format(&cfg->training.checkpoint, ck, sizeof ck);
    if (cfg->training.seq_len > 1) {
        sl[0] = ',';
        sl[1] = ' ';
        ml__report_lengths(m, &cfg->training, sl + 2, sizeof sl - 2);
    }
    int k = snprintf(set, sizeof set, "micro_batch %llu%s, grad_accum %llu, %s, %s (%s)",
                     (unsigned long long)cfg->training.micro_batch, sl,
                     (unsigned long long)cfg->training.grad_accum,
                     ml_precision_name(cfg->training.precision),
                     ml_optimizer_name(cfg->training.optimizer),
                     ml_optimizer_impl_name(cfg->training.optimizer_impl));
    if (with_checkpoint && k >= 0 && (size_t)k < sizeof set)
        k += snprintf(set + k, sizeof set - (size_t)k, ", checkpoint %s", ck);
    const uint64_t dpc = cfg->training.data_parallel *
                         ml_training_cp(&cfg->training);
    if ((dpc > 1 || cfg->training.zero) && k >= 0 && (size_t)k < sizeof set)
        k += snprintf(set + k, sizeof set - (size_t)k, ", %llu devices, ZeRO %u",
                      (unsigned long long)dpc, cfg->training.zero);
    if (ml_training_ep(&cfg->training) > 1 && k >= 0 && (size_t)k < sizeof set)
        k += snprintf(set + k, sizeof set - (size_t)k, ", ep %llu",
                      (unsigned long long)ml_training_ep(&cfg->training));
    char lay[160];
    ml__report_layout_brief(&cfg->training, lay, sizeof lay);
    if (k >= 0 && (size_t)k < sizeof set)
        snprintf(set + k, sizeof set - (size_t)k, "%s", lay);
    int tl = ml__svg_text_wrapped(f, 20, 26, 21, 17, true, NULL, w - 40, t);
    free(t);
    int nl = ml__svg_text_wrapped(f, 20, 46 + 21.0 * (tl - 1), 16, 12, false,
                                  " fill=\"#444\"", w - 40, set);
    return 21.0 * (tl - 1) + 16.0 * (nl - 1);
}

/* The phase bands behind the chart, each labelled where it is wide enough;
 * on a time axis a band ends where the next begins. */
static void phase_bands(FILE *f, const chart *c, const xmap *x, size_t n)
{
    const ml_event *ev = x->ev;
    size_t a = 0;
    int shade = 0;
    for (size_t i = 1; i <= n; i++) {
        if (i < n && ev[i].phase == ev[a].phase && ev[i].micro == ev[a].micro)
            continue;
        double x1 = ex(c, x, a);
        double x2 = x->T <= 0 ? ex(c, x, i - 1) : i < n ? ex(c, x, i) : px(c, 1);
        if (x2 - x1 < 1)
            x2 = x1 + 1;
        fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"%s\"/>\n",
                x1, c->y0, x2 - x1, c->h, shade ? "#f0f0f0" : "#f8f8f8");
        if (x2 - x1 > 50)
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" fill=\"#666\" "
                       "text-anchor=\"middle\">%s%s</text>\n",
                    (x1 + x2) / 2, c->y0 + 14, ml_phase_name(ev[a].phase),
                    ev[a].micro ? " (later micro-batches)" : "");
        shade ^= 1;
        a = i;
    }
}

/* The categories' stacked areas over the sampled events idx[0..np): on a
 * time axis a step function (each level holds until the next event's time,
 * then a vertical segment), else straight lines between events. */
static void stacked_areas(FILE *f, const chart *c, const xmap *x, const size_t *idx, size_t np)
{
    const ml_event *ev = x->ev;
    for (int k = ML_CAT_COUNT - 1; k >= 0; k--) {
        ml_category cat = stack_order[k];
        fprintf(f, "<path fill=\"%s\" stroke=\"none\" d=\"", cat_color[cat]);
        for (size_t j = 0; j < np; j++) {
            uint64_t top = 0;
            for (int q = 0; q <= k; q++)
                top += ev[idx[j]].live[stack_order[q]];
            if (j && x->T > 0)
                fprintf(f, " H%.1f", ex(c, x, idx[j]));
            fprintf(f, "%s%.1f %.1f", j ? " L" : "M", ex(c, x, idx[j]), py(c, (double)top));
        }
        fprintf(f, " L%.1f %.1f L%.1f %.1f Z\"/>\n", np ? ex(c, x, idx[np - 1]) : px(c, 0),
                py(c, 0), px(c, 0), py(c, 0));
    }
}

/* On a time axis, the total's outline over the areas: a spike of zero width
 * (many events at one instant) has no area to fill, so this stroke is what
 * shows it, up to its true height. */
static void total_outline(FILE *f, const chart *c, const xmap *x, const size_t *idx, size_t np)
{
    if (!(x->T > 0) || !np)
        return;
    fputs("<path fill=\"none\" stroke=\"#333\" stroke-width=\"1.2\" d=\"", f);
    for (size_t j = 0; j < np; j++) {
        if (j)
            fprintf(f, " H%.1f", ex(c, x, idx[j]));
        fprintf(f, "%s%.1f %.1f", j ? " L" : "M", ex(c, x, idx[j]),
                py(c, (double)total_of(&x->ev[idx[j]])));
    }
    fputs("\"/>\n", f);
}

/* The peak's marker and label, at its first event. */
static void peak_marker(FILE *f, const chart *c, const ml_summary *s, const xmap *xm, size_t n)
{
    const ml_event *ev = xm->ev;
    size_t pi = 0;
    for (size_t i = 0; i < n; i++)
        if (total_of(&ev[i]) == s->peak) {
            pi = i;
            break;
        }
    if (n) {
        char b[32];
        ml_format_bytes(s->peak, b, sizeof b);
        double x = ex(c, xm, pi), y = py(c, (double)s->peak);
        fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"5\" fill=\"none\" stroke=\"#d62728\" "
                   "stroke-width=\"2\"/>\n",
                x, y);
        /* beside the marker, on its left near the right end; moved along,
         * never out of the plot, when its width (ml__svg_text_width) needs */
        char label[192];
        snprintf(label, sizeof label, "allocator peak %s at %s (%s)", b, s->peak_step,
                 ml_phase_name(s->peak_phase));
        const double w = ml__svg_text_width(label, strlen(label), 12, true);
        double lx = x > c->x0 + c->w * 0.7 ? x - 8 - w : x + 8;
        if (lx + w > c->x0 + c->w)
            lx = c->x0 + c->w - w;
        if (lx < c->x0)
            lx = c->x0;
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\" "
                   "fill=\"#d62728\">",
                lx, y - 8);
        ml_svg_escape(f, label);
        fputs("</text>\n", f);
    }
}

/* The legend: each category with its largest size. */
static void legend(FILE *f, const chart *c, const ml_summary *s)
{
    double ly = c->y0 + 10;
    for (int k = ML_CAT_COUNT - 1; k >= 0; k--) {
        ml_category cat = stack_order[k];
        char b[32];
        ml_format_bytes(s->category_max[cat], b, sizeof b);
        fprintf(f, "<rect x=\"830\" y=\"%.1f\" width=\"14\" height=\"14\" fill=\"%s\"/>\n", ly,
                cat_color[cat]);
        fprintf(f, "<text x=\"850\" y=\"%.1f\" font-size=\"12\">%s</text>\n", ly + 11,
                ml__report_category_label(cat));
        fprintf(f, "<text x=\"850\" y=\"%.1f\" font-size=\"10\" fill=\"#666\">max %s</text>\n",
                ly + 24, b);
        ly += 36;
    }
}

#define TIMELINE_TITLE "memory over one training iteration"

int ml__svg_timeline_chart(const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                           ml_svg_chart *out)
{
    const ml_summary *s = ml_ledger_summary(l);
    const double drop = title(NULL, 1040, m, cfg, TIMELINE_TITLE, true);
    if (drop < 0)
        return -1;
    chart c = {ML_SVG_X0, 70 + drop, ML_SVG_W, 420, (double)s->peak};
    if (s->has_device && (double)s->memory > c.ymax)
        c.ymax = (double)s->memory;
    if (s->has_reserved && (double)ml__svg_training_reserved(s) > c.ymax)
        c.ymax = (double)ml__svg_training_reserved(s);
    if (c.ymax <= 0)
        c.ymax = 1;
    c.ymax *= 1.06;
    *out = c;
    return 0;
}

size_t ml__svg_hover_points(const ml_ledger *l, size_t *idx)
{
    const size_t n = ml_ledger_event_count(l);
    if (n <= SVG_POINTS) {
        for (size_t i = 0; i < n; i++)
            idx[i] = i;
        return n;
    }
    /* the chart's own vertices and each bucket's highest, both ascending,
     * merged */
    size_t a[SVG_POINTS], b[SVG_POINTS];
    const xmap x = {ml_ledger_events(l), (double)(n - 1), ml__svg_time_end(l)};
    const size_t na = sample(l, &x, a), nb = ml__svg_sample(l, b, SVG_POINTS);
    size_t i = 0, j = 0, m = 0;
    while (i < na || j < nb) {
        const size_t v = j >= nb || (i < na && a[i] <= b[j]) ? a[i] : b[j];
        idx[m++] = v;
        while (i < na && a[i] == v)
            i++;
        while (j < nb && b[j] == v)
            j++;
    }
    return m;
}

int ml_report_timeline_svg(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l)
{
    const ml_summary *s = ml_ledger_summary(l);
    const ml_event *ev = ml_ledger_events(l);
    size_t n = ml_ledger_event_count(l);
    const xmap x = {ev, n > 1 ? (double)(n - 1) : 1, ml__svg_time_end(l)};
    size_t idx[SVG_POINTS];
    size_t np = sample(l, &x, idx);
    chart c;
    if (ml__svg_timeline_chart(m, cfg, l, &c))
        return -1;
    const double drop = c.y0 - 70;
    ml__svg_header(f, 1040, (int)ceil(580 + drop));
    title(f, 1040, m, cfg, TIMELINE_TITLE, true);
    phase_bands(f, &c, &x, n);
    ml__svg_y_axis(f, &c);
    stacked_areas(f, &c, &x, idx, np);
    total_outline(f, &c, &x, idx, np);
    ml__svg_device_lines(f, &c, s, &cfg->device);
    /* the allocator's simulated reserved peak (--allocator) */
    ml__svg_reserved_line(f, &c, s);
    peak_marker(f, &c, s, &x, n);
    if (x.T > 0)
        ml__svg_x_axis_time(f, &c, x.T);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">",
            c.x0 + c.w / 2, c.y0 + c.h + 34);
    fprintf(f, x.T > 0 ? "seconds into one training iteration (%zu events)</text>\n"
                       : "events of one training iteration (%zu)</text>\n",
            n);
    ml__svg_oom_notice(f, &c, s);
    legend(f, &c, s);
    fputs("</svg>\n", f);
    return ferror(f) ? -1 : 0;
}

/* Seven policies and more: a colour and a dash pattern each (the first
 * solid), so that no two curves look alike and identical plans, drawn on
 * top of each other, still show both patterns. */
static const char *const compare_colors[] = {"#4e79a7", "#e15759", "#f28e2b", "#76b7b2",
                                             "#59a14f", "#edc948", "#b07aa1", "#9c755f"};
static const char *const compare_dashes[] = {"",      "8,4",     "2,3",    "12,3,3,3",
                                             "5,5",   "1,4",     "9,2,2,2,2,2", "16,4"};
_Static_assert(sizeof compare_colors / sizeof compare_colors[0] ==
                   sizeof compare_dashes / sizeof compare_dashes[0],
               "a colour per dash pattern");
#define COMPARE_STYLES (sizeof compare_colors / sizeof compare_colors[0])

#define COMPARE_TITLE "checkpoint policies compared"

int ml_report_compare_svg(FILE *f, const ml_model *m, const ml_config *cfg,
                          const ml_ledger *const *ls, const char *const *names, size_t n)
{
    const double drop = title(NULL, ML_SVG_WIDTH, m, cfg, COMPARE_TITLE, false);
    if (drop < 0)
        return -1;
    chart c = {90, 70 + drop, 720, 420, 1};
    for (size_t i = 0; i < n; i++) {
        const ml_summary *s = ml_ledger_summary(ls[i]);
        if ((double)s->peak > c.ymax)
            c.ymax = (double)s->peak;
        if (s->has_device && (double)s->memory > c.ymax)
            c.ymax = (double)s->memory;
    }
    c.ymax *= 1.06;
    /* the legend under the x axis's caption, each entry's lines counted
     * first: the picture grows to hold them all */
    char (*entry)[320] = n ? calloc(n, sizeof *entry) : NULL;
    if (n && !entry)
        return -1;
    int lines = 0;
    for (size_t i = 0; i < n; i++) {
        char b[32];
        ml_format_bytes(ml_ledger_summary(ls[i])->peak, b, sizeof b);
        snprintf(entry[i], sizeof entry[i], "%s (allocator peak %s)", names[i], b);
        lines += ml__svg_legend_entry(NULL, 0, "", NULL, entry[i]);
    }
    const double legend_y = c.y0 + c.h + ML_SVG_LEGEND_GAP;
    ml__svg_header(f, (int)ML_SVG_WIDTH,
                   (int)ceil(legend_y + ML_SVG_LEGEND_LINE * lines + ML_SVG_LEGEND_PAD));
    title(f, ML_SVG_WIDTH, m, cfg, COMPARE_TITLE, false);
    ml__svg_y_axis(f, &c);
    /* a common seconds axis when every policy's events have a time: a
     * policy that recomputes more draws a longer curve */
    double T = 0;
    for (size_t i = 0; i < n; i++) {
        double Ti = ml__svg_time_end(ls[i]);
        if (!(Ti > 0)) {
            T = 0;
            break;
        }
        T = fmax(T, Ti);
    }
    size_t idx[SVG_POINTS];
    double ly = legend_y;
    for (size_t i = 0; i < n; i++) {
        const ml_event *ev = ml_ledger_events(ls[i]);
        size_t ne = ml_ledger_event_count(ls[i]);
        const xmap x = {ev, ne > 1 ? (double)(ne - 1) : 1, T};
        size_t np = sample(ls[i], &x, idx);
        const char *color = compare_colors[i % COMPARE_STYLES];
        const char *dash = compare_dashes[i % COMPARE_STYLES];
        fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" stroke-width=\"1.8\"%s%s%s points=\"",
                color, *dash ? " stroke-dasharray=\"" : "", dash, *dash ? "\"" : "");
        for (size_t j = 0; j < np; j++) {
            if (j && T > 0) /* a step: the level holds until the event */
                fprintf(f, " %.1f,%.1f", ex(&c, &x, idx[j]),
                        py(&c, (double)total_of(&ev[idx[j - 1]])));
            fprintf(f, "%s%.1f,%.1f", j ? " " : "", ex(&c, &x, idx[j]),
                    py(&c, (double)total_of(&ev[idx[j]])));
        }
        fputs("\"/>\n", f);
        ly += ML_SVG_LEGEND_LINE * ml__svg_legend_entry(f, ly, color, dash, entry[i]);
    }
    free(entry);
    /* the device's lines as the timeline draws them over its allocator
     * curve: with a fragmentation allowance the budget / (1 + f) */
    const ml_summary *s0 = n ? ml_ledger_summary(ls[0]) : NULL;
    if (s0)
        ml__svg_device_lines(f, &c, s0, &cfg->device);
    if (T > 0)
        ml__svg_x_axis_time(f, &c, T);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" text-anchor=\"middle\">%s</text>\n",
            c.x0 + c.w / 2, c.y0 + c.h + 34,
            T > 0 ? "seconds into one training iteration (each policy at its own step time)"
                  : "progress through one training iteration (each policy's events, normalised)");
    fputs("</svg>\n", f);
    return ferror(f) ? -1 : 0;
}
