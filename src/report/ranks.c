/* A pipeline's stages in the reports (docs/parallel.md): the text table
 * and JSON's "ranks" and "worst_rank". */
#include <stdbool.h>
#include <stdio.h>

#include "report/report_internal.h"

static const char *bytes(uint64_t v, char *buf)
{
    ml_format_bytes(v, buf, 32);
    return buf;
}

/* Whether stage i of n is listed when not all are: the first two, the
 * fullest, the middle one and the last. */
static bool listed(size_t i, size_t n, size_t worst)
{
    return i < 2 || i == worst || i == n / 2 || i + 1 == n;
}

void ml__report_text_ranks(FILE *f, const ml_config *cfg, const ml_ledger *l, bool all)
{
    const size_t n = ml_ledger_rank_count(l), w = ml_ledger_worst_rank(l);
    const ml_summary *s = ml_ledger_summary(l);
    if (!n)
        return;
    const ml_training *t = &cfg->training;
    fprintf(f, "Pipeline stages (%s, %llu micro-batch%s a step; the plan below is stage %zu's, "
               "the fullest)\n",
            ml_pp_schedule_name(t->pp_schedule), (unsigned long long)t->grad_accum,
            t->grad_accum == 1 ? "" : "es", w);
    fprintf(f, "  %-6s %-16s %14s %9s %12s %12s %13s\n", "stage",
            t->virtual_stages > 1 ? "layers in chunks" : "layers", "params", "in flight",
            "saved/micro", "peak", "device total");
    const bool some = !all && n > 8;
    for (size_t i = 0; i < n; i++) {
        if (some && !listed(i, n, w)) {
            if (listed(i - 1, n, w))
                fputs("  ...\n", f);
            continue;
        }
        const ml_rank_info *r = ml_ledger_rank(l, i);
        char lay[40], num[40], a[32], b[32], c[32];
        snprintf(lay, sizeof lay, "%s%u-%u%s", r->embedding ? "emb, " : "", r->first_layer,
                 r->first_layer + r->layers - 1, r->head ? ", head" : "");
        if (t->virtual_stages > 1)
            snprintf(lay, sizeof lay, "%s%u in %llu%s", r->embedding ? "emb, " : "", r->layers,
                     (unsigned long long)t->virtual_stages, r->head ? ", head" : "");
        ml__report_commas(r->params, num, sizeof num);
        fprintf(f, "  %-6zu %-16s %14s %9.4g %12s %12s %13s%s\n", i, lay, num, r->in_flight,
                bytes(r->activations_saved, a), bytes(r->peak, b), bytes(r->device_total, c),
                i == w ? "  <- fullest" : "");
    }
    if (some)
        fprintf(f, "  (%zu stages: every one with --ranks all, or in JSON's ranks)\n", n);
    if (s->pipeline_step_s >= 0)
        fprintf(f, "  the pipeline's step: %.4g s, of which the stages wait %.1f %% (the bubble); "
                   "the step time below is stage %zu's own work\n",
                s->pipeline_step_s, 100 * s->pipeline_bubble, w);
    fputc('\n', f);
}

void ml__report_json_ranks(FILE *f, const ml_config *cfg, const ml_ledger *l)
{
    const size_t n = ml_ledger_rank_count(l);
    const ml_summary *s = ml_ledger_summary(l);
    if (!n) {
        fputs(",\n \"ranks\": null, \"worst_rank\": null, \"pipeline_step_s\": null, "
              "\"pipeline_bubble\": null",
              f);
        return;
    }
    fputs(",\n \"ranks\": [", f);
    const uint64_t vs = cfg->training.virtual_stages > 1 ? cfg->training.virtual_stages : 1;
    for (size_t i = 0; i < n; i++) {
        const ml_rank_info *r = ml_ledger_rank(l, i);
        /* layers: the stage's range (its first chunk's with virtual stages;
         * chunks lists them all) */
        const unsigned end = r->first_layer + (unsigned)(r->layers / vs);
        fprintf(f,
                "%s\n  {\"stage\": %u, \"layers\": [%u, %u], \"layer_count\": %u, "
                "\"embedding\": %s, \"head\": %s, \"params\": %llu, \"in_flight\": %.17g, "
                "\"activations_saved\": %llu, \"peak\": %llu, \"reserved\": ",
                i ? "," : "", r->stage, r->first_layer, end, r->layers,
                r->embedding ? "true" : "false", r->head ? "true" : "false",
                (unsigned long long)r->params, r->in_flight,
                (unsigned long long)r->activations_saved, (unsigned long long)r->peak);
        if (r->has_reserved)
            fprintf(f, "%llu", (unsigned long long)r->reserved);
        else
            fputs("null", f);
        fprintf(f, ", \"device_total\": %llu, \"fits\": %s, \"headroom\": ",
                (unsigned long long)r->device_total,
                r->has_device ? (r->fits ? "true" : "false") : "null");
        if (r->has_device)
            fprintf(f, "%lld", (long long)r->headroom);
        else
            fputs("null", f);
        /* the stage's layers as ranges: its chunks with virtual stages */
        const ml_training *t = &cfg->training;
        const uint64_t v = t->virtual_stages > 1 ? t->virtual_stages : 1;
        const uint64_t p = t->pipeline_parallel, chunk = r->layers / v;
        fputs(", \"chunks\": [", f);
        for (uint64_t c = 0; c < v; c++) {
            const uint64_t a = v > 1 ? (c * p + r->stage) * chunk : r->first_layer;
            fprintf(f, "%s[%llu, %llu]", c ? ", " : "", (unsigned long long)a,
                    (unsigned long long)(a + (v > 1 ? chunk : r->layers)));
        }
        fprintf(f, "], \"p2p_bytes\": %.17g, \"micro_s\": ", r->p2p_bytes);
        if (r->micro_s >= 0)
            fprintf(f, "%.17g", r->micro_s);
        else
            fputs("null", f);
        fprintf(f,
                ", \"bytes\": {\"params\": %llu, \"master_params\": %llu, \"grads\": %llu, "
                "\"optimizer_states\": %llu}}",
                (unsigned long long)r->bytes_params, (unsigned long long)r->bytes_master,
                (unsigned long long)r->bytes_grads, (unsigned long long)r->bytes_optimizer);
    }
    fprintf(f, "],\n \"worst_rank\": %zu, \"pipeline_step_s\": ", ml_ledger_worst_rank(l));
    if (s->pipeline_step_s >= 0)
        fprintf(f, "%.17g, \"pipeline_bubble\": %.17g", s->pipeline_step_s, s->pipeline_bubble);
    else
        fputs("null, \"pipeline_bubble\": null", f);
}

/* The header's parallel line: each split, the devices in all. */
static void text_layout(FILE *f, const ml_training *t, uint64_t tp, uint64_t pp, uint64_t cp)
{
    fputs("parallel: ", f);
    if (tp > 1)
        fprintf(f, "tensor %llu (%s), ", (unsigned long long)tp,
                ml_training_sp(t) ? "with sequence parallelism" : "no sequence parallelism");
    if (cp > 1)
        fprintf(f, "context %llu (ring attention, %llu tokens a rank), ", (unsigned long long)cp,
                (unsigned long long)(t->seq_len / cp));
    if (ml_training_etp(t) > 1 && (ml_training_ep(t) > 1 || t->expert_tensor_parallel > 1))
        fprintf(f, "expert %llu x expert-tensor %llu (of the tp x cp x dp ranks), ",
                (unsigned long long)ml_training_ep(t), (unsigned long long)ml_training_etp(t));
    else if (ml_training_ep(t) > 1)
        fprintf(f, "expert %llu (of the %s ranks), ", (unsigned long long)ml_training_ep(t),
                tp > 1 ? "tp x cp x dp" : "data-parallel");
    if (pp > 1 && t->virtual_stages > 1)
        fprintf(f, "pipeline %llu (interleaved, %llu virtual stages each), ",
                (unsigned long long)pp, (unsigned long long)t->virtual_stages);
    else if (pp > 1)
        fprintf(f, "pipeline %llu (%s), ", (unsigned long long)pp,
                ml_pp_schedule_name(t->pp_schedule));
    fprintf(f, "data %llu: %llu devices; figures are one rank's\n",
            (unsigned long long)t->data_parallel,
            (unsigned long long)ml_training_devices(t));
}

void ml__report_layout_brief(const ml_training *t, char *buf, size_t size)
{
    const uint64_t tp = t->tensor_parallel, pp = t->pipeline_parallel, cp = ml_training_cp(t);
    const uint64_t ep = ml_training_ep(t);
    buf[0] = '\0';
    if (tp <= 1 && pp <= 1 && cp <= 1 && ep <= 1)
        return;
    /* as the layout search names its rows (--parallel's notation) */
    const ml_layout_row row = {.tp = tp, .pp = pp, .dp = t->data_parallel,
                               .vpp = pp > 1 ? t->virtual_stages : 1, .cp = cp, .ep = ep,
                               .etp = t->expert_tensor_parallel};
    char name[96];
    ml__report_layout_name(&row, name, sizeof name);
    snprintf(buf, size, ", parallel %s (%llu devices; figures are one rank's%s)", name,
             (unsigned long long)ml_training_devices(t), pp > 1 ? ", the fullest stage's" : "");
}

/* The header's lines on the engine, the parallel layout (when the model is
 * split over devices) and the data-parallel sharding. */
void ml__report_text_parallel(FILE *f, const ml_training *t)
{
    if (t->engine == ML_ENGINE_MEGATRON)
        fputs("engine: megatron (Megatron-core's GPT layer: fused masked softmax; fp32 main "
              "gradients in a buffer kept all iteration)\n",
              f);
    const uint64_t tp = t->tensor_parallel > 1 ? t->tensor_parallel : 1;
    const uint64_t pp = t->pipeline_parallel > 1 ? t->pipeline_parallel : 1;
    const uint64_t cp = ml_training_cp(t);
    if (tp > 1 || pp > 1 || cp > 1 || ml_training_ep(t) > 1 || t->expert_tensor_parallel > 1)
        text_layout(f, t, tp, pp, cp);
    if (ml_training_shard(t) < t->data_parallel)
        fprintf(f, "shard groups: %llu replicas of %llu ranks (HSDP%s): the states shard over a "
                   "group, the groups' gradients are all-reduced\n",
                (unsigned long long)(t->data_parallel / ml_training_shard(t)),
                (unsigned long long)(ml_training_shard(t) * cp),
                cp > 1 ? "; data x context parallel" : "");
    if (t->dist_optimizer) {
        fprintf(f, "sharding: Megatron's distributed optimizer over %llu data-parallel ranks "
                   "(master weights and optimizer states of the fullest rank's shard; padded "
                   "buffers); figures are per device\n",
                (unsigned long long)ml_training_shard(t));
    } else if (t->data_parallel > 1 || cp > 1 || t->zero || t->offload) {
        fprintf(f, "sharding: %llu devices%s, ZeRO stage %u, offload %s; figures are per device\n",
                (unsigned long long)(t->data_parallel * cp),
                cp > 1 ? " (data x context parallel)" : "", t->zero, ml_offload_name(t->offload));
    }
}

void ml__report_layout(const ml_training *t, char *buf, size_t size)
{
    const uint64_t tp = t->tensor_parallel > 1 ? t->tensor_parallel : 1;
    const uint64_t pp = t->pipeline_parallel > 1 ? t->pipeline_parallel : 1;
    int n = 0;
    buf[0] = '\0';
    if (tp > 1)
        n = snprintf(buf, size, ", tp %llu%s", (unsigned long long)tp,
                     ml_training_sp(t) ? " with sequence parallelism" : "");
    if (t->context_parallel > 1 && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ", cp %llu", (unsigned long long)t->context_parallel);
    if (t->expert_parallel > 1 && n >= 0 && (size_t)n < size)
        n += snprintf(buf + n, size - (size_t)n, ", ep %llu", (unsigned long long)t->expert_parallel);
    if (pp > 1 && n >= 0 && (size_t)n < size)
        snprintf(buf + n, size - (size_t)n, ", pp %llu (%s; the fullest stage's figures)",
                 (unsigned long long)pp, ml_pp_schedule_name(t->pp_schedule));
}
