/* Reports of fit and compare. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "model/model_internal.h"
#include "report/report_internal.h"

static const char *B(uint64_t v, char *buf)
{
    ml_format_bytes(v, buf, 32);
    return buf;
}

int ml_report_fit_text(FILE *f, const ml_model *m, const ml_config *cfg,
                       const ml_fit_request *req, const ml_fit_result *r)
{
    char a[32], b[32], c[32], ck[1200];
    const ml_device *d = &cfg->device;
    uint64_t budget = ml_device_budget(d);
    fprintf(f, "memledger fit: %s on %s (budget %s for the %s, runtime reserve %s",
            ml_model_name(m), B(d->memory, a), B(budget, b), ml__report_budget_holds(d),
            B(d->runtime_reserve, c));
    if (d->fragmentation > 0)
        fprintf(f, ", fragmentation allowance %g x the peak", d->fragmentation);
    fputs(")\n", f);
    char sl[80];
    ml__report_lengths(m, &cfg->training, sl, sizeof sl);
    const ml_training *t = &cfg->training;
    const unsigned long long cp = ml_training_cp(t);
    const unsigned long long devices = ml__training_devices(t);
    fprintf(f, "config: %s, precision %s, optimizer %s (%s), %llu device%s", sl,
            ml_precision_name(t->precision), ml_optimizer_name(t->optimizer),
            ml_optimizer_impl_name(t->optimizer_impl), devices, devices == 1 ? "" : "s");
    if (devices != t->data_parallel) {
        fprintf(f, " (tp %llu, ",
                (unsigned long long)(t->tensor_parallel > 1 ? t->tensor_parallel : 1));
        if (cp > 1)
            fprintf(f, "cp %llu, ", cp);
        fprintf(f, "pp %llu, dp %llu)",
                (unsigned long long)(t->pipeline_parallel > 1 ? t->pipeline_parallel : 1),
                (unsigned long long)t->data_parallel);
    }
    if (ml_training_ep(t) > 1) /* of the data-parallel ranks */
        fprintf(f, ", ep %llu", (unsigned long long)ml_training_ep(t));
    if (t->expert_tensor_parallel > 1)
        fprintf(f, ", etp %llu", (unsigned long long)t->expert_tensor_parallel);
    fprintf(f, ", ZeRO %u\n\n", t->zero);
    if (!r->fits) {
        fprintf(f, "DOES NOT FIT: %s\n", r->note);
        return ferror(f) ? -1 : 0;
    }
    ml_checkpoint_format(&r->checkpoint, ck, sizeof ck);
    if (r->at_global_batch)
        fprintf(f, "micro-batch that fits: %llu, the whole global batch per device (checkpoint "
                   "%s%s)\n  (the search stops at the global batch: larger micro-batches were not "
                   "tried, and may fit too)\n",
                (unsigned long long)r->max_micro_batch, req->auto_checkpoint ? "auto -> " : "",
                ck);
    else
        fprintf(f, "largest micro-batch that fits: %llu (checkpoint %s%s)\n",
                (unsigned long long)r->max_micro_batch, req->auto_checkpoint ? "auto -> " : "",
                ck);
    uint64_t lo = 0, most = UINT64_MAX; /* the largest micro-batch memledger plans */
    ml_config_range("training.micro_batch", &lo, &most);
    if (r->at_search_limit && r->max_micro_batch >= most)
        fprintf(f, "  (the largest micro-batch memledger plans: larger ones may fit too)\n");
    else if (r->at_search_limit)
        fprintf(f, "  (the search's upper end: larger micro-batches may fit too; raise "
                   "--max-micro-batch to look further)\n");
    if (r->checkpoint.kind == ML_CKPT_OPTIMAL)
        fprintf(f, "  plan: %s\n", r->plan);
    fprintf(f, "choice: micro-batch %llu x %llu accumulation step%s x %llu device%s = effective "
               "batch %llu",
            (unsigned long long)r->micro_batch, (unsigned long long)r->grad_accum,
            r->grad_accum == 1 ? "" : "s", (unsigned long long)r->data_parallel,
            r->data_parallel == 1 ? "" : "s", (unsigned long long)r->effective_batch);
    if (req->global_batch)
        fprintf(f, " (target %llu%s)", (unsigned long long)req->global_batch,
                r->exact ? ", exact" : ", not exact");
    fputc('\n', f);
    if (r->note[0])
        fprintf(f, "note: %s\n", r->note);
    fprintf(f, "device total %s, headroom %s; recompute ", B(r->peak_total, a),
            B((uint64_t)(r->headroom < 0 ? 0 : r->headroom), b));
    ml_format_flops(r->flops_recompute, c, sizeof c);
    fprintf(f, "%s per iteration", c);
    if (r->step_time_s >= 0)
        fprintf(f, "; step time %.4g s", r->step_time_s);
    fprintf(f, "\n(exact search over the ledger: %u evaluations)\n", r->evaluations);
    return ferror(f) ? -1 : 0;
}

int ml_report_fit_json(FILE *f, const ml_model *m, const ml_fit_request *req,
                       const ml_fit_result *r)
{
    char ck[1200];
    ml_checkpoint_format(&r->checkpoint, ck, sizeof ck);
    fputs("{\"model\": ", f);
    ml_json_put_string(f, ml_model_name(m));
    if (r->fits)
        fprintf(f, ", \"micro_batch\": %llu, \"grad_accum\": %llu, \"data_parallel\": %llu, "
                   "\"effective_batch\": %llu, ",
                (unsigned long long)r->micro_batch, (unsigned long long)r->grad_accum,
                (unsigned long long)r->data_parallel, (unsigned long long)r->effective_batch);
    else
        fprintf(f, ", \"micro_batch\": null, \"grad_accum\": null, \"data_parallel\": %llu, "
                   "\"effective_batch\": null, ",
                (unsigned long long)r->data_parallel);
    fputs("\"checkpoint\": ", f);
    ml_json_put_string(f, ck);
    fputs(", \"plan\": ", f);
    ml_json_put_string(f, r->plan);
    if (r->fits)
        /* the budget line is for the allocator peak; peak_total adds the
         * runtime reserve */
        fprintf(f, ", \"peak_total\": %llu, \"budget\": %llu, \"fits\": true, \"headroom\": %lld"
                   ", \"peak\": %llu",
                (unsigned long long)r->peak_total, (unsigned long long)r->budget,
                (long long)r->headroom, (unsigned long long)r->peak);
    else
        fprintf(f, ", \"peak_total\": null, \"budget\": %llu, \"fits\": false, \"headroom\": null"
                   ", \"peak\": null",
                (unsigned long long)r->budget);
    if (req->global_batch)
        fprintf(f, ", \"global_batch\": %llu, \"exact\": %s", (unsigned long long)req->global_batch,
                r->exact ? "true" : "false");
    else
        fputs(", \"global_batch\": null, \"exact\": true", f);
    fprintf(f, ", \"max_micro_batch\": %llu, \"at_search_limit\": %s, \"flops_recompute\": %.17g, "
               "\"evaluations\": %u",
            (unsigned long long)r->max_micro_batch, r->at_search_limit ? "true" : "false",
            r->flops_recompute, r->evaluations);
    fputs(", \"note\": ", f);
    ml_json_put_string(f, r->note);
    fprintf(f, ", \"at_global_batch\": %s}\n", r->at_global_batch ? "true" : "false");
    return ferror(f) ? -1 : 0;
}

static void name_of(const ml_compare_row *r, char *buf, size_t size)
{
    ml_checkpoint_format(&r->checkpoint, buf, size);
}

/* "no recompute" or "1.70 TFLOP of recompute". */
static void recompute_words(double flops, char *buf, size_t size)
{
    char fl[32];
    if (!(flops > 0)) {
        snprintf(buf, size, "no recompute");
        return;
    }
    ml_format_flops(flops, fl, sizeof fl);
    snprintf(buf, size, "%s of recompute", fl);
}

/* The rows whose recompute buys memory the run does not need. */
static void compare_not_needed(FILE *f, const ml_compare_row *rows, size_t n)
{
    int cheaper = -1;
    for (size_t i = 0; i < n; i++)
        if (rows[i].cheaper >= 0)
            cheaper = rows[i].cheaper;
    if (cheaper < 0)
        return;
    char name[64];
    fputs("\nNot worth it here:", f);
    for (size_t i = 0, k = 0; i < n; i++)
        if (rows[i].cheaper >= 0) {
            name_of(&rows[i], name, sizeof name);
            fprintf(f, "%s %s", k++ ? "," : "", name);
        }
    const ml_compare_row *c = &rows[cheaper];
    name_of(c, name, sizeof name);
    char with[48];
    recompute_words(c->flops_recompute, with, sizeof with);
    fprintf(f, " (%s fits too, with %s: their extra recompute buys memory this run does not "
               "use; a larger micro-batch can use it: memledger fit).\n",
            name, with);
}

int ml_report_compare_text(FILE *f, const ml_model *m, const ml_config *cfg,
                           const ml_compare_row *rows, size_t n)
{
    char a[32], b[32], c[32], name[64];
    char sl[80], lay[128];
    ml__report_lengths(m, &cfg->training, sl, sizeof sl);
    ml__report_layout(&cfg->training, lay, sizeof lay);
    fprintf(f, "memledger compare: %s, micro_batch %llu, %s, grad_accum %llu, %s%s\n",
            ml_model_name(m), (unsigned long long)cfg->training.micro_batch, sl,
            (unsigned long long)cfg->training.grad_accum,
            ml_precision_name(cfg->training.precision), lay);
    if (cfg->device.present) {
        uint64_t budget = ml_device_budget(&cfg->device);
        fprintf(f, "device %s, budget %s, runtime reserve %s", B(cfg->device.memory, a),
                B(budget, b), B(cfg->device.runtime_reserve, c));
        if (cfg->device.fragmentation > 0)
            fprintf(f, ", fragmentation allowance %g x the peak", cfg->device.fragmentation);
        fputc('\n', f);
    }
    fprintf(f, "\n%-12s %12s %12s %14s %10s %11s %s\n", "checkpoint", "device total", "saved acts",
            "recompute", "% of 3F", "step time", "fits");
    for (size_t i = 0; i < n; i++) {
        const ml_compare_row *r = &rows[i];
        name_of(r, name, sizeof name);
        char fl[32], st[32];
        ml_format_flops(r->flops_recompute, fl, sizeof fl);
        if (r->step_time_s >= 0)
            snprintf(st, sizeof st, "%.4g s", r->step_time_s);
        else
            snprintf(st, sizeof st, "-");
        fprintf(f, "%-12s %12s %12s %14s %9.1f%% %11s %s\n", name, B(r->peak_total, a),
                B(r->activations_saved, b), fl, r->recompute_pct, st,
                !r->has_device ? "-" : r->fits ? "yes" : "no");
    }
    for (size_t i = 0; i < n; i++)
        if (rows[i].checkpoint.kind == ML_CKPT_OPTIMAL)
            fprintf(f, "\n%s%s\n", rows[i].plan,
                    rows[i].fits ? "" : " (no plan meets the budget: the lowest peak is shown)");
    compare_not_needed(f, rows, n);
    if (!cfg->device.present)
        fprintf(f, "\n(no device: give --device NAME|SIZE for the verdicts and the optimal plan)\n");
    fprintf(f, "\nDevice total: %s and the runtime reserve. %% of 3F: recompute FLOPs over "
               "the iteration's FLOPs without recompute.\n",
            cfg->device.allocator == ML_ALLOCATOR_NONE || cfg->device.fragmentation > 0
                ? "the allocator peak, its fragmentation allowance"
                : "the reserved peak (the caching allocator simulated)");
    return ferror(f) ? -1 : 0;
}

int ml_report_compare_json(FILE *f, const ml_compare_row *rows, size_t n)
{
    char name[64];
    fputs("[", f);
    for (size_t i = 0; i < n; i++) {
        const ml_compare_row *r = &rows[i];
        name_of(r, name, sizeof name);
        fputs(i ? ",\n {\"checkpoint\": " : "\n {\"checkpoint\": ", f);
        ml_json_put_string(f, name);
        fputs(", \"plan\": ", f);
        ml_json_put_string(f, r->plan);
        fprintf(f, ", \"peak_total\": %llu, \"activations_saved\": %llu, \"flops_recompute\": "
                   "%.17g, \"flops_total\": %.17g, \"recompute_pct\": %.17g, \"step_time_s\": ",
                (unsigned long long)r->peak_total, (unsigned long long)r->activations_saved,
                r->flops_recompute, r->flops_total, r->recompute_pct);
        if (r->step_time_s >= 0)
            fprintf(f, "%.17g", r->step_time_s);
        else
            fputs("null", f);
        /* the per-op model's bound and throughput (docs/time.md) */
        const bool timed = r->time.source != ML_TIME_NONE;
        fprintf(f, ", \"bound\": %s, \"tokens_per_s\": ",
                !timed ? "null" : r->time.host_bound ? "\"host\"" : "\"gpu\"");
        if (timed)
            fprintf(f, "%.17g, \"mfu\": %.17g", r->time.tokens_per_s, r->time.mfu);
        else
            fputs("null, \"mfu\": null", f);
        fprintf(f, ", \"fits\": %s, \"peak\": %llu, \"cheaper_fits\": ",
                !r->has_device ? "null" : r->fits ? "true" : "false", (unsigned long long)r->peak);
        if (r->cheaper >= 0) {
            name_of(&rows[r->cheaper], name, sizeof name);
            ml_json_put_string(f, name);
        } else {
            fputs("null", f);
        }
        fputc('}', f);
    }
    fputs("\n]\n", f);
    return ferror(f) ? -1 : 0;
}

int ml_report_compare_csv(FILE *f, const ml_compare_row *rows, size_t n)
{
    char name[64];
    fputs("checkpoint,peak_total,activations_saved,flops_recompute,recompute_pct,flops_total,"
          "step_time_s,fits,cheaper_fits\n", f);
    for (size_t i = 0; i < n; i++) {
        const ml_compare_row *r = &rows[i];
        name_of(r, name, sizeof name);
        fprintf(f, "%s,%llu,%llu,%.17g,%.17g,%.17g,", name, (unsigned long long)r->peak_total,
                (unsigned long long)r->activations_saved, r->flops_recompute, r->recompute_pct,
                r->flops_total);
        if (r->step_time_s >= 0)
            fprintf(f, "%.17g", r->step_time_s);
        fprintf(f, ",%s,", !r->has_device ? "" : r->fits ? "true" : "false");
        if (r->cheaper >= 0) {
            name_of(&rows[r->cheaper], name, sizeof name);
            fputs(name, f);
        }
        fputc('\n', f);
    }
    return ferror(f) ? -1 : 0;
}

int ml_report_advice_text(FILE *f, const ml_summary *s, const ml_advice *a)
{
    if (!a->cheaper_fits)
        return ferror(f) ? -1 : 0;
    const ml_compare_row *c = &a->row;
    char name[64], pt[32], hr[32], fl[32], with[48];
    name_of(c, name, sizeof name);
    recompute_words(c->flops_recompute, with, sizeof with);
    fprintf(f, "  advice: checkpoint %s fits too (device total %s, headroom %s) with %s;", name,
            B(c->peak_total, pt), B(c->headroom > 0 ? (uint64_t)c->headroom : 0, hr), with);
    ml_format_flops(s->flops_recompute - c->flops_recompute, fl, sizeof fl);
    const double pct = c->flops_total > 0 ? 100.0 * (s->flops_total - c->flops_total) / c->flops_total
                                          : 0;
    fprintf(f, " this plan's extra %s of recompute per iteration (+%.1f%% FLOPs", fl, pct);
    if (ml_summary_step_time(s) >= 0 && c->step_time_s >= 0)
        fprintf(f, ", step time %.4g s against %.4g s", ml_summary_step_time(s), c->step_time_s);
    fputs(") buys memory the run does not use\n", f);
    return ferror(f) ? -1 : 0;
}

int ml_report_json_advice(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                          const ml_advice *a)
{
    ml__report_json_open(f, m, cfg, l);
    fputs(",\n \"advice\": ", f);
    if (a->cheaper_fits) {
        char name[64];
        name_of(&a->row, name, sizeof name);
        fputs("{\"cheaper_fits\": ", f);
        ml_json_put_string(f, name);
        fputs(", \"plan\": ", f);
        ml_json_put_string(f, a->row.plan);
        fprintf(f, ", \"peak_total\": %llu, \"flops_recompute\": %.17g, \"flops_total\": %.17g, "
                   "\"step_time_s\": ",
                (unsigned long long)a->row.peak_total, a->row.flops_recompute, a->row.flops_total);
        if (a->row.step_time_s >= 0)
            fprintf(f, "%.17g}", a->row.step_time_s);
        else
            fputs("null}", f);
    } else {
        fputs("null", f);
    }
    fputs("}\n", f);
    return ferror(f) ? -1 : 0;
}

int ml_report_points_json(FILE *f, size_t n, const ml_points_fit *r, uint64_t budget,
                          uint64_t at)
{
    fprintf(f, "{\"points\": %zu, \"fixed_bytes\": %.0f, \"per_sample_bytes\": %.0f, "
               "\"r2\": %.17g, \"max_rel_residual\": %.17g",
            n, r->fixed_bytes, r->per_sample_bytes, r->fit.r2, r->fit.max_rel_residual);
    if (budget)
        fprintf(f, ", \"budget\": %llu, \"max_micro_batch\": %llu, "
                   "\"max_measured_micro_batch\": %llu, \"extrapolated\": %s",
                (unsigned long long)budget, (unsigned long long)r->max_micro_batch,
                (unsigned long long)r->max_measured_micro_batch,
                r->extrapolated ? "true" : "false");
    else
        fputs(", \"budget\": null, \"max_micro_batch\": null, \"max_measured_micro_batch\": "
              "null, \"extrapolated\": false", f);
    if (at)
        fprintf(f, ", \"at\": %llu, \"peak_at\": %.0f", (unsigned long long)at, r->peak_at);
    fputs("}\n", f);
    return ferror(f) ? -1 : 0;
}
