/* The lines a timeline's chart draws over its allocator curve: the
 * device's (its memory, the allocator curve's limit, the budget, scaled by a
 * fragmentation allowance), the simulated reserved line, and the notice
 * that the simulation ran out of the device (svg.c draws the rest). */
#include <stdio.h>

#include "report/svg_internal.h"

/* The device's lines: its memory, the allocator curve's limit and the
 * budget (one line when they agree); nothing without a device. With a
 * fragmentation allowance f the budget holds the peak times 1 + f (the
 * verdict), so over the allocator curve its line is budget / (1 + f), as
 * the device's is. */
void ml__svg_device_lines(FILE *f, const ml_svg_chart *c, const ml_summary *s,
                          const ml_device *dv)
{
    if (s->has_device) {
        ml__svg_hline(f, c, s->memory, "#222", NULL, "device", false);
        /* the allocator curve's device line */
        uint64_t lim = s->device_limit;
        const char *lname = lim < s->memory - s->runtime_reserve
                                ? "(device - runtime reserve) / (1 + fragmentation)"
                                : "device - runtime reserve";
        /* (with --allocator none the budget holds the allocator peak
         * itself, the allowance counting against the device only) */
        if (dv->fragmentation > 0 && s->has_reserved) {
            const uint64_t held = (uint64_t)((double)s->budget / (1 + dv->fragmentation));
            if (s->budget == s->memory - s->runtime_reserve) {
                ml__svg_hline(f, c, held, "#d62728", "6,4",
                              "(budget = device - runtime reserve) / (1 + fragmentation)", true);
            } else {
                ml__svg_hline(f, c, lim, "#777", "2,3", lname, false);
                ml__svg_hline(f, c, held, "#d62728", "6,4", "budget / (1 + fragmentation)",
                              true);
            }
        } else if (s->budget == lim) {
            char both[96];
            snprintf(both, sizeof both, "budget = %s", lname);
            ml__svg_hline(f, c, s->budget, "#d62728", "6,4", both, true);
        } else {
            ml__svg_hline(f, c, lim, "#777", "2,3", lname, false);
            ml__svg_hline(f, c, s->budget, "#d62728", "6,4", "budget", true);
        }
    }
}

/* The simulated caching allocator's reserved peak over the training
 * passes, one of which the chart draws: max_memory_reserved() once the
 * parameters, the first iteration and the steady ones have run (an
 * evaluation pass's is not this chart's). */
uint64_t ml__svg_training_reserved(const ml_summary *s)
{
    return s->reserved_steady;
}

/* Whether the simulation ran out of the device in the training passes
 * (not in an evaluation pass after them). */
static bool training_oom(const ml_summary *s)
{
    return s->reserved_oom && s->reserved_oom_when != ML_RESERVED_EVAL;
}

/* The reserved line (with the allocator simulated): training's figure,
 * labelled with its pass when an evaluation pass is planned too, or as
 * the figure reached until the simulation ran out of the device. */
void ml__svg_reserved_line(FILE *f, const ml_svg_chart *c, const ml_summary *s)
{
    if (!s->has_reserved)
        return;
    ml__svg_hline(f, c, ml__svg_training_reserved(s), "#9467bd", "8,3",
                  training_oom(s) ? "reserved (simulated, until OUT OF MEMORY)"
                  : s->has_eval   ? "reserved (simulated, training)"
                                  : "reserved (simulated)",
                  false);
}

/* Under the x axis's caption, where no curve or line crosses it: that the
 * simulated caching allocator runs out of the device, and in which pass,
 * as the text report and the HTML verdict say it (nothing when it does
 * not). */
void ml__svg_oom_notice(FILE *f, const ml_svg_chart *c, const ml_summary *s)
{
    static const char *const in[] = {"while the parameters are made", "in the first iteration",
                                     "in a steady iteration",
                                     "in the evaluation pass (not drawn: training only)"};
    if (!s->has_reserved || !s->reserved_oom)
        return;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"12\" font-weight=\"bold\" "
               "fill=\"#d62728\" text-anchor=\"middle\">the simulated caching allocator runs OUT "
               "OF MEMORY on the device %s</text>\n",
            c->x0 + c->w / 2, c->y0 + c->h + 52, in[s->reserved_oom_when]);
}

