/* Timeline exports: every event of the iteration as CSV or JSON; the
 * allocator simulation's own events as a trace. */
#include <inttypes.h>
#include <stdio.h>

#include "memledger/report.h"

static const char *step_of(const ml_ledger *l, const ml_event *e)
{
    if (e->block < 0) /* resident state before forward, or the step */
        return e->phase == ML_PHASE_OPTIMIZER ? "optimizer.step" : "resident";
    const ml_block_info *b = ml_ledger_block(l, (size_t)e->block);
    return b ? b->name : "?";
}

int ml_report_timeline_csv(FILE *f, const ml_ledger *l)
{
    /* the categories added later (batch, buffers) follow t_s: columns are
     * only ever appended */
    fputs("index,micro_batch,phase,step,category,delta_bytes", f);
    for (int c = 0; c < ML_CAT_BATCH; c++)
        fprintf(f, ",%s", ml_category_name((ml_category)c));
    fputs(",total,flops_before,t_s", f);
    for (int c = ML_CAT_BATCH; c < ML_CAT_COUNT; c++)
        fprintf(f, ",%s", ml_category_name((ml_category)c));
    fputc('\n', f);
    const ml_event *ev = ml_ledger_events(l);
    for (size_t i = 0; i < ml_ledger_event_count(l); i++) {
        const ml_event *e = &ev[i];
        uint64_t total = 0;
        fprintf(f, "%zu,%u,%s,%s,%s,%lld", i, e->micro, ml_phase_name(e->phase), step_of(l, e),
                ml_category_name(e->cat), (long long)e->delta);
        for (int c = 0; c < ML_CAT_COUNT; c++) {
            if (c < ML_CAT_BATCH)
                fprintf(f, ",%llu", (unsigned long long)e->live[c]);
            total += e->live[c];
        }
        fprintf(f, ",%llu,%.17g,", (unsigned long long)total, e->flops_before);
        if (e->t_s >= 0)
            fprintf(f, "%.9g", e->t_s);
        for (int c = ML_CAT_BATCH; c < ML_CAT_COUNT; c++)
            fprintf(f, ",%llu", (unsigned long long)e->live[c]);
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

int ml_report_timeline_json(FILE *f, const ml_ledger *l)
{
    const ml_event *ev = ml_ledger_events(l);
    fputs("[", f);
    for (size_t i = 0; i < ml_ledger_event_count(l); i++) {
        const ml_event *e = &ev[i];
        uint64_t total = 0;
        /* block names are ours: letters, digits, '.', ':' — no escaping */
        fprintf(f, "%s\n {\"index\": %zu, \"micro_batch\": %u, \"phase\": \"%s\", \"step\": \"%s\", "
                   "\"category\": \"%s\", \"delta\": %lld, \"live\": {",
                i ? "," : "", i, e->micro, ml_phase_name(e->phase), step_of(l, e),
                ml_category_name(e->cat), (long long)e->delta);
        for (int c = 0; c < ML_CAT_COUNT; c++) {
            fprintf(f, "%s\"%s\": %llu", c ? ", " : "", ml_category_name((ml_category)c),
                    (unsigned long long)e->live[c]);
            total += e->live[c];
        }
        fprintf(f, "}, \"total\": %llu, \"flops_before\": %.17g, \"t_s\": ",
                (unsigned long long)total, e->flops_before);
        if (e->t_s >= 0)
            fprintf(f, "%.9g}", e->t_s);
        else
            fputs("null}", f);
    }
    fputs("\n]\n", f);
    return ferror(f) ? -1 : 0;
}

int ml_report_timeline_trace(FILE *f, const ml_ledger *l)
{
    static const char *const pass[] = {"residents (parameters, master weights)",
                                       "first iteration", "steady iteration", "evaluation"};
    const ml_sim_event *e = ml_ledger_sim_events(l);
    const size_t n = ml_ledger_sim_event_count(l);
    if (fputs("action,id,bytes\n", f) < 0)
        return -1;
    for (size_t i = 0; i < n; i++) {
        int w;
        if (e[i].action == ML_SIM_MARK)
            w = fprintf(f, "# %s%s\n", pass[e[i].when], e[i].second ? " (the second)" : "");
        else if (e[i].action == ML_SIM_ALLOC)
            w = fprintf(f, "alloc,%" PRIu64 ",%" PRIu64 "\n", e[i].id, e[i].bytes);
        else
            w = fprintf(f, "free,%" PRIu64 "\n", e[i].id);
        if (w < 0)
            return -1;
    }
    return 0;
}
