/* fit --gpus: the layout search's answer in text and JSON (docs/search.md). */
#include <stdio.h>
#include <string.h>

#include "memledger/report.h"
#include "report/report_internal.h"

/* A layout's name in the compact form --parallel takes, tp2.pp4.vpp2.dp8
 * with cp2 where context-parallel; an uneven split's first and last
 * stages' layers bracketed, pp16[5..5] (the middle ones even), which
 * --parallel does not take: --pp-layers gives such a split */
void ml__report_layout_name(const ml_layout_row *r, char *buf, size_t size)
{
    char cp[24] = "", un[32] = "", ep[24] = "";
    if (r->cp > 1)
        snprintf(cp, sizeof cp, ".cp%llu", (unsigned long long)r->cp);
    if (r->first_layers)
        snprintf(un, sizeof un, "[%u..%u]", r->first_layers, r->last_layers);
    if (r->ep > 1 || (r->etp && r->etp != r->tp)) /* of the data-parallel ranks; the
                                                     experts' width over etp */
        snprintf(ep, sizeof ep, r->etp && r->etp != r->tp ? ".ep%llu.etp%llu" : ".ep%llu",
                 (unsigned long long)(r->ep > 1 ? r->ep : 1), (unsigned long long)r->etp);
    if (r->vpp > 1)
        snprintf(buf, size, "tp%llu%s.pp%llu%s.vpp%llu.dp%llu%s", (unsigned long long)r->tp, cp,
                 (unsigned long long)r->pp, un, (unsigned long long)r->vpp,
                 (unsigned long long)r->dp, ep);
    else
        snprintf(buf, size, "tp%llu%s.pp%llu%s.dp%llu%s", (unsigned long long)r->tp, cp,
                 (unsigned long long)r->pp, un, (unsigned long long)r->dp, ep);
}

/* The data-parallel ranks' sharding: ddp, zero1..3 (zero3: FSDP), dist-opt */
static const char *sharding_name(const ml_layout_row *r)
{
    static const char *const zero[] = {"ddp", "zero1", "zero2", "zero3"};
    if (r->dist_optimizer)
        return "dist-opt";
    /* the states shard over the dp x cp ranks */
    return r->dp * (r->cp > 1 ? r->cp : 1) <= 1 ? "-" : r->zero < 4 ? zero[r->zero] : "?";
}

static const char *secs(double s, char *buf, size_t size)
{
    if (s < 0)
        snprintf(buf, size, "-");
    else
        snprintf(buf, size, "%.4g s", s);
    return buf;
}

int ml_report_layouts_text(FILE *f, const ml_model *m, const ml_config *cfg,
                           const ml_layout_request *req, const ml_layout_result *r)
{
    fprintf(f, "memledger fit: %s on %llu device%s (%llu a node), global batch %llu\n",
            ml_model_name(m), (unsigned long long)req->gpus, req->gpus == 1 ? "" : "s",
            (unsigned long long)(req->gpus_per_node ? req->gpus_per_node : 8),
            (unsigned long long)req->global_batch);
    if (cfg->training.engine == ML_ENGINE_MEGATRON)
        fprintf(f, "engine: megatron%s\n",
                cfg->training.dist_optimizer
                    ? ", its distributed optimizer over each layout's data-parallel ranks"
                    : "");
    fprintf(f, "searched: %s\n", r->note);
    if (!r->nrows)
        return ferror(f) ? -1 : 0;
    /* the layout column as wide as its longest name (18 at least) */
    int width = 18;
    for (size_t i = 0; i < r->nrows; i++) {
        char name[80];
        ml__report_layout_name(&r->rows[i], name, sizeof name);
        if ((int)strlen(name) > width)
            width = (int)strlen(name);
    }
    fprintf(f, "\n  %-*s %12s %-10s %12s %12s %11s %11s %11s %7s %7s  %s\n", width, "layout",
            "micro x m", "checkpoint", "peak", "device total", "compute", "transfers", "step",
            "bubble", "MFU", "sharding");
    for (size_t i = 0; i < r->nrows; i++) {
        const ml_layout_row *w = &r->rows[i];
        char name[80], mb[40], ck[64], pk[32], dt[32], a[24], b[24], c[24], mfu[16];
        ml__report_layout_name(w, name, sizeof name);
        snprintf(mb, sizeof mb, "%llu x %llu", (unsigned long long)w->micro_batch,
                 (unsigned long long)w->micro_batches);
        ml_checkpoint_format(&w->checkpoint, ck, sizeof ck);
        ml_format_bytes(w->peak, pk, sizeof pk);
        ml_format_bytes(w->device_total, dt, sizeof dt);
        if (w->mfu >= 0)
            snprintf(mfu, sizeof mfu, "%.1f%%", 100 * w->mfu);
        else
            snprintf(mfu, sizeof mfu, "-");
        fprintf(f, "  %-*s %12s %-10s %12s %12s %11s %11s %11s %6.1f%% %7s  %s\n", width, name, mb, ck,
                pk, dt, secs(w->compute_s, a, sizeof a), secs(w->comm_s, b, sizeof b),
                secs(w->step_s, c, sizeof c), 100 * w->bubble, mfu, sharding_name(w));
    }
    const ml_layout_row *best = &r->rows[0];
    char name[80];
    ml__report_layout_name(best, name, sizeof name);
    fprintf(f, "\nbest: %s (%s), micro-batch %llu x %llu micro-batches a step", name,
            sharding_name(best), (unsigned long long)best->micro_batch,
            (unsigned long long)best->micro_batches);
    if (best->step_s > 0)
        fprintf(f, ", %.4g s a step, %.4g tokens/s", best->step_s, best->tokens_per_s);
    if (r->nrows > 1 && best->step_s > 0 && r->rows[1].step_s > 0) {
        char n2[80];
        ml__report_layout_name(&r->rows[1], n2, sizeof n2);
        fprintf(f, "; %.1f%% faster than the next (%s)",
                100 * (r->rows[1].step_s / best->step_s - 1), n2);
    }
    fputc('\n', f);
    if (!r->comm_timed)
        fputs("transfers not timed: give --interconnect GBps (and --network GBps between "
              "nodes); the ranking is by compute\n",
              f);
    if (cfg->device.peak_tflops <= 0 && !cfg->device.preset)
        fputs("no step time: name the device (e.g. --device h100-sxm) to rank by time; ranked "
              "by headroom\n",
              f);
    return ferror(f) ? -1 : 0;
}

static void num(FILE *f, double v)
{
    if (v < 0)
        fputs("null", f);
    else
        fprintf(f, "%.17g", v);
}

int ml_report_layouts_json(FILE *f, const ml_model *m, const ml_layout_request *req,
                           const ml_layout_result *r)
{
    fputs("{\"model\": ", f);
    ml_json_put_string(f, ml_model_name(m));
    fprintf(f, ", \"gpus\": %llu, \"gpus_per_node\": %llu, \"global_batch\": %llu, "
               "\"layouts_tried\": %llu, \"evaluations\": %llu, \"fitting\": %llu, "
               "\"transfers_timed\": %s, \"candidates\": %llu, \"passed_over\": %llu, "
               "\"note\": ",
            (unsigned long long)req->gpus,
            (unsigned long long)(req->gpus_per_node ? req->gpus_per_node : 8),
            (unsigned long long)req->global_batch, (unsigned long long)r->layouts,
            (unsigned long long)r->evaluations, (unsigned long long)r->fitting,
            r->comm_timed ? "true" : "false", (unsigned long long)r->candidates,
            (unsigned long long)r->passed_over);
    ml_json_put_string(f, r->note);
    fputs(",\n \"layouts\": [", f);
    for (size_t i = 0; i < r->nrows; i++) {
        const ml_layout_row *w = &r->rows[i];
        char ck[64];
        ml_checkpoint_format(&w->checkpoint, ck, sizeof ck);
        fprintf(f,
                "%s\n  {\"tp\": %llu, \"pp\": %llu, \"dp\": %llu, \"micro_batch\": %llu, "
                "\"micro_batches\": %llu, \"checkpoint\": ",
                i ? "," : "", (unsigned long long)w->tp, (unsigned long long)w->pp,
                (unsigned long long)w->dp, (unsigned long long)w->micro_batch,
                (unsigned long long)w->micro_batches);
        ml_json_put_string(f, ck);
        fprintf(f, ", \"peak\": %llu, \"device_total\": %llu, \"headroom\": %lld, \"compute_s\": ",
                (unsigned long long)w->peak, (unsigned long long)w->device_total,
                (long long)w->headroom);
        num(f, w->compute_s);
        fputs(", \"transfers_s\": ", f);
        num(f, w->comm_s);
        fputs(", \"step_s\": ", f);
        num(f, w->step_s);
        fprintf(f, ", \"bubble\": %.17g, \"tokens_per_s\": ", w->bubble);
        num(f, w->tokens_per_s);
        fputs(", \"mfu\": ", f);
        num(f, w->mfu);
        fprintf(f,
                ", \"vpp\": %llu, \"zero\": %u, \"dist_optimizer\": %s, \"cp\": %llu, "
                "\"ep\": %llu",
                (unsigned long long)(w->vpp > 1 ? w->vpp : 1), w->zero,
                w->dist_optimizer ? "true" : "false", (unsigned long long)(w->cp > 1 ? w->cp : 1),
                (unsigned long long)(w->ep > 1 ? w->ep : 1));
        if (ml_model_experts(m)) /* the experts' width over etp ranks */
            fprintf(f, ", \"etp\": %llu",
                    (unsigned long long)(w->etp ? w->etp : w->tp > 1 ? w->tp : 1));
        fputs(", \"latency_s\": ", f);
        num(f, w->comm_s < 0 ? -1 : w->latency_s);
        /* an uneven split's stages (0: even) */
        fprintf(f, ", \"first_layers\": %u, \"middle_layers\": %u, \"last_layers\": %u}",
                w->first_layers, w->middle_layers, w->last_layers);
    }
    fputs("]}\n", f);
    return ferror(f) ? -1 : 0;
}
