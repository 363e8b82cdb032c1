/* JSON report: one object, keys listed in docs/cli.md. Byte values are
 * integers; FLOPs and c are numbers printed with 17 significant digits. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "memledger/calib.h"
#include "memledger/report.h"
#include "report/report_internal.h"

static void num(FILE *f, double v)
{
    if (!isfinite(v))
        fputs("null", f);
    else
        fprintf(f, "%.17g", v);
}

/* "model", "params", "config", "plan". */
static void json_head(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l)
{
    const ml_summary *s = ml_ledger_summary(l);
    const ml_training *t = &cfg->training;
    char ck[1200];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    fputs("{\"model\": ", f);
    ml_json_put_string(f, ml_model_name(m));
    fprintf(f, ", \"params\": %llu,\n", (unsigned long long)s->params);
    fprintf(f, " \"config\": {\"micro_batch\": %llu, \"seq_len\": %llu, \"grad_accum\": %llu, "
               "\"precision\": \"%s\", \"optimizer\": \"%s\", \"optimizer_impl\": \"%s\", "
               "\"checkpoint\": ",
            (unsigned long long)t->micro_batch, (unsigned long long)t->seq_len,
            (unsigned long long)t->grad_accum, ml_precision_name(t->precision),
            ml_optimizer_name(t->optimizer), ml_optimizer_impl_name(t->optimizer_impl));
    ml_json_put_string(f, ck);
    fprintf(f, ", \"data_parallel\": %llu, \"zero\": %u, \"offload\": \"%s\", "
               "\"logits\": \"%s\", \"zero_grad\": \"%s\", \"logits_chunk\": %llu, ",
            (unsigned long long)t->data_parallel, t->zero, ml_offload_name(t->offload),
            ml_logits_name(t->logits), ml_zero_grad_name(t->zero_grad),
            (unsigned long long)t->logits_chunk);
    fputs("\"attention\": ", f);
    const char *attn = ml_model_attention(m);
    if (attn)
        fprintf(f, "\"%s\"", attn);
    else
        fputs("null", f);
    /* only when the input named none (docs/hf.md): other plans keep their keys */
    if (ml_model_attention_assumed(m)) {
        fputs(", \"attention_assumed\": ", f);
        ml_json_put_string(f, ml_model_attention_assumed(m));
    }
    const uint64_t tp = t->tensor_parallel > 1 ? t->tensor_parallel : 1;
    const uint64_t pp = t->pipeline_parallel > 1 ? t->pipeline_parallel : 1;
    const uint64_t cp = ml_training_cp(t);
    fprintf(f,
            ", \"parallel\": {\"tp\": %llu, \"sp\": %s, \"pp\": %llu, \"vpp\": %llu, "
            "\"pp_schedule\": \"%s\", \"dp\": %llu, \"devices\": %llu, "
            "\"dist_optimizer\": %s, \"dp_shard\": %llu, \"overlap_grad_reduce\": %s, "
            "\"cp\": %llu, \"ep\": %llu",
            (unsigned long long)tp, ml_training_sp(t) ? "true" : "false", (unsigned long long)pp,
            (unsigned long long)(t->virtual_stages > 1 ? t->virtual_stages : 1),
            ml_pp_schedule_name(t->pp_schedule), (unsigned long long)t->data_parallel,
            (unsigned long long)ml_training_devices(t),
            t->dist_optimizer ? "true" : "false", (unsigned long long)ml_training_shard(t),
            t->overlap_grad_reduce ? "true" : "false", (unsigned long long)cp,
            (unsigned long long)ml_training_ep(t));
    if (ml_model_experts(m)) /* a mixture of experts' expert-tensor ranks */
        fprintf(f, ", \"etp\": %llu", (unsigned long long)ml_training_etp(t));
    fputc('}', f);
    fprintf(f, ", \"engine\": \"%s\"", ml_engine_name(t->engine));
    /* an encoder-decoder's second length */
    if (ml_model_target_len(m, t))
        fprintf(f, ", \"target_len\": %llu", (unsigned long long)ml_model_target_len(m, t));
    if (ml_model_image_tokens(m))
        fprintf(f, ", \"image_tokens\": %llu, \"vision_tower\": \"%s\"",
                (unsigned long long)ml_model_image_tokens(m), ml_vision_tower_name(t->vision_tower));
    fputs("},\n", f);
    fputs(" \"plan\": ", f);
    ml_json_put_string(f, s->plan);
    fprintf(f, ", \"plan_fits_budget\": %s,\n", s->plan_fits_budget ? "true" : "false");
}

/* "calibration": what the profile replaced, or null. */
static void json_calibration(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    fputs(" \"calibration\": ", f);
    if (cfg->calib) {
        fputs("{\"profile\": ", f);
        ml_json_put_string(f, ml_profile_get(cfg->calib, "name"));
        fprintf(f, ", \"measured_blocks\": %zu, \"c\": ", s->calibrated_blocks);
        num(f, s->calibrated_c);
        fprintf(f, ", \"at_shape\": %s, \"time_measured\": %s, \"note\": ",
                s->calibrated_at_shape ? "true" : "false", s->time_measured ? "true" : "false");
        if (s->calibration_note)
            ml_json_put_string(f, s->calibration_note);
        else
            fputs("null", f);
        fputs("},\n", f);
    } else {
        fputs("null,\n", f);
    }
}

/* v, or null where there is none (!has). */
static void bytes_or_null(FILE *f, bool has, uint64_t v)
{
    if (has)
        fprintf(f, "%llu", (unsigned long long)v);
    else
        fputs("null", f);
}

/* {"forward": {"peak", "at"} | null, "loss", "backward", "optimizer"}. */
static void json_phases(FILE *f, const ml_phase_peak *p)
{
    for (int ph = 0; ph < ML_PHASE_COUNT; ph++) {
        fprintf(f, "%s\"%s\": ", ph ? ", " : "{", ml_phase_name((ml_phase)ph));
        if (!p[ph].present) {
            fputs("null", f);
            continue;
        }
        fprintf(f, "{\"peak\": %llu, \"at\": ", (unsigned long long)p[ph].peak);
        ml_json_put_string(f, p[ph].at);
        fputc('}', f);
    }
    fputc('}', f);
}

/* "reserved": the simulated allocator's figures (docs/allocator.md), or
 * null without a simulation. */
static void json_reserved(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    if (!s->has_reserved) {
        fputs("null", f);
        return;
    }
    static const char *const when[] = {"resident", "first", "steady", "evaluation"};
    const ml_reserved_at *w = &s->reserved_at;
    fprintf(f, "{\"peak\": %llu, \"segments\": %llu, \"allocator\": \"%s\", \"oom\": %s, "
               "\"at\": {\"iteration\": \"%s\", \"phase\": \"%s\", \"step\": ",
            (unsigned long long)s->reserved_peak, (unsigned long long)s->reserved_segments,
            ml_allocator_name(cfg->device.allocator), s->reserved_oom ? "true" : "false",
            when[w->when], ml_phase_name(w->phase));
    ml_json_put_string(f, w->at);
    fprintf(f, ", \"allocated\": %llu, \"segments\": %llu}", (unsigned long long)w->allocated,
            (unsigned long long)w->segments);
    fprintf(f, ", \"passes\": {\"first_iteration\": %llu, \"steady\": %llu, \"eval\": ",
            (unsigned long long)s->reserved_first, (unsigned long long)s->reserved_steady);
    bytes_or_null(f, s->has_eval, s->reserved_peak); /* the running peak: the whole run's */
    fputc('}', f);
    if (s->start_reserved)
        fprintf(f, ", \"start\": {\"reserved\": %llu, \"allocated\": %llu, \"segments\": %llu}}",
                (unsigned long long)s->start_reserved, (unsigned long long)s->start_allocated,
                (unsigned long long)s->start_segments);
    else
        fputs(", \"start\": null}", f);
}

/* "bytes", "peak", "peaks", "model_states" and "reserved". */
static void json_bytes(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    fprintf(f, " \"bytes\": {\"params\": %llu, \"master_params\": %llu, \"grads\": %llu, "
               "\"optimizer_states\": %llu, \"optimizer_step_temp\": %llu, "
               "\"activations_saved\": %llu, \"peak\": %llu, \"runtime_reserve\": %llu, "
               "\"peak_total\": %llu, \"host\": %llu, \"fragmentation\": %llu, "
               "\"batch\": %llu, \"buffers\": %llu},\n",
            (unsigned long long)s->bytes_params, (unsigned long long)s->bytes_master,
            (unsigned long long)s->bytes_grads, (unsigned long long)s->bytes_optimizer,
            (unsigned long long)s->bytes_step_temp, (unsigned long long)s->bytes_activations,
            (unsigned long long)s->peak, (unsigned long long)s->runtime_reserve,
            (unsigned long long)s->peak_total, (unsigned long long)s->bytes_host,
            (unsigned long long)s->fragmentation, (unsigned long long)s->bytes_batch,
            (unsigned long long)s->bytes_buffers);
    fprintf(f, " \"peak\": {\"phase\": \"%s\", \"step\": ", ml_phase_name(s->peak_phase));
    ml_json_put_string(f, s->peak_step);
    fputs(", \"breakdown\": {", f);
    for (int c = 0; c < ML_CAT_COUNT; c++)
        fprintf(f, "%s\"%s\": %llu", c ? ", " : "", ml_category_name((ml_category)c),
                (unsigned long long)s->peak_breakdown[c]);
    fprintf(f, "}},\n \"peaks\": {\"steady\": %llu, \"first_iteration\": %llu, \"eval\": ",
            (unsigned long long)s->peak, (unsigned long long)s->peak_first_iteration);
    bytes_or_null(f, s->has_eval, s->peak_eval);
    fprintf(f, ", \"binding\": \"%s\",\n  \"phases\": {\"steady\": ",
            ml_peak_kind_name(s->binding));
    json_phases(f, s->phase_steady);
    fputs(", \"first_iteration\": ", f);
    json_phases(f, s->phase_first);
    fputs(", \"eval\": ", f);
    if (s->has_eval)
        json_phases(f, s->phase_eval);
    else
        fputs("null", f);
    fprintf(f, "}},\n \"model_states\": {\"bytes\": %llu, \"bytes_per_param\": ",
            (unsigned long long)ml__report_model_states(s));
    num(f, ml__report_model_states_per_param(s));
    fputs("},\n \"reserved\": ", f);
    json_reserved(f, cfg, s);
}

/* x, or null when negative (unknown). */
static void num_or_null(FILE *f, double x)
{
    if (x >= 0)
        num(f, x);
    else
        fputs("null", f);
}

/* "device": with a length distribution (v) "fits" and "headroom" are its
 * verdict, "verdict_of" says so and "configured" holds the configured
 * shape's own (docs/lengths.md, "The verdict"). */
static void json_device(FILE *f, const ml_config *cfg, const ml_summary *s,
                        const ml_report_verdict *v)
{
    fputs(",\n \"device\": ", f);
    if (!s->has_device) {
        fputs("null", f);
        return;
    }
    fprintf(f, "{\"memory\": %llu, \"budget\": %llu, \"fits\": %s, \"headroom\": %lld",
            (unsigned long long)s->memory, (unsigned long long)s->budget,
            (v ? v->fits : s->fits) ? "true" : "false",
            (long long)(v ? v->headroom : s->headroom));
    if (v)
        fprintf(f, ", \"verdict_of\": \"lengths\", \"configured\": {\"fits\": %s, "
                   "\"headroom\": %lld}",
                s->fits ? "true" : "false", (long long)s->headroom);
    /* with the caching allocator simulated (--allocator) the budget holds
     * its reserved peak, not the allocator peak: said (absent, the
     * allocator peak); a fragmentation allowance given takes the simulated
     * cache's place: the allocator peak with the allowance */
    if (s->has_reserved)
        fprintf(f, ", \"budget_holds\": \"%s\"",
                cfg->device.fragmentation > 0 ? "allowance" : "reserved");
    fputc('}', f);
}

/* "blocks", "flops", "communication", "host_transfer", "step_time_s" and
 * "time". */
/* , "key": {"forward": .., "backward": .., "recompute": .., "step": ..}, or
 * null without values */
static void phase_object(FILE *f, const char *key, const double *v)
{
    static const char *const ph[ML_TPHASE_COUNT] = {"forward", "backward", "recompute", "step"};
    fprintf(f, ", \"%s\": ", key);
    if (!v) {
        fputs("null", f);
        return;
    }
    for (int i = 0; i < ML_TPHASE_COUNT; i++) {
        fprintf(f, "%s\"%s\": ", i ? ", " : "{", ph[i]);
        num(f, v[i]);
    }
    fputc('}', f);
}

/* The per-op model's step time (docs/time.md), inside "time": null figures
 * and source "none" when the device's rates are unknown. */
static void json_step_time(FILE *f, const ml_step_time *t)
{
    static const char *const src[] = {"none", "datasheet", "calibrated"};
    const bool known = t->source != ML_TIME_NONE;
    const double v[] = {t->step_s, t->gpu_s, t->host_s, t->gemm_s, t->memory_s, t->floor_s,
                        t->tokens_per_s, t->mfu};
    static const char *const k[] = {"step_s", "gpu_s", "host_s", "gemm_s", "memory_s",
                                    "floor_s", "tokens_per_s", "mfu"};
    for (size_t i = 0; i < sizeof v / sizeof v[0]; i++) {
        fprintf(f, ", \"%s\": ", k[i]);
        num_or_null(f, known ? v[i] : -1);
    }
    fprintf(f, ", \"bound\": %s", !known ? "null" : t->host_bound ? "\"host\"" : "\"gpu\"");
    phase_object(f, "by_phase", known ? t->by_phase : NULL);
    phase_object(f, "kernels", known ? t->kernels : NULL);
    fputs(", \"flops_s\": ", f);
    num_or_null(f, known ? t->flops_s : -1);
    fputs(", \"recomputed_blocks\": ", f);
    num_or_null(f, known ? t->recomputed_blocks : -1);
    fprintf(f, ", \"source\": \"%s\", \"flops_only_blocks\": %zu, \"serial\": %s",
            src[t->source], t->flops_only_blocks, t->serial ? "true" : "false");
}

static void json_blocks_and_time(FILE *f, const ml_ledger *l, const ml_summary *s)
{
    fputs(",\n \"blocks\": [", f);
    size_t n = ml_ledger_block_count(l);
    for (size_t i = 0; i < n; i++) {
        const ml_block_info *b = ml_ledger_block(l, i);
        fputs(i ? ",\n  {\"name\": " : "\n  {\"name\": ", f);
        ml_json_put_string(f, b->name);
        fprintf(f, ", \"params\": %llu, \"activations_saved\": %llu, \"inventory_bytes\": %llu, "
                   "\"c\": ",
                (unsigned long long)b->params, (unsigned long long)b->activations_saved,
                (unsigned long long)b->inventory_bytes);
        num(f, b->c);
        fputs(", \"flops_forward\": ", f);
        num(f, b->flops_forward);
        fprintf(f, ", \"checkpointed\": %s, \"measured\": %s, \"transients\": \"%s\", "
                   "\"backward\": \"%s\"%s}",
                b->checkpointed ? "true" : "false", b->measured ? "true" : "false",
                ml_transients_name(b->transients),
                b->frozen || b->unused_output ? "none" : b->backward_nodes ? "nodes" : "block_rule",
                b->unused_output ? ", \"unused_output\": true" : b->frozen ? ", \"frozen\": true" : "");
    }
    fputs("],\n \"flops\": {\"forward\": ", f);
    num(f, s->flops_forward);
    fputs(", \"backward\": ", f);
    num(f, s->flops_backward);
    fputs(", \"recompute\": ", f);
    num(f, s->flops_recompute);
    fputs(", \"total\": ", f);
    num(f, s->flops_total);
    fputs(", \"per_micro_batch\": ", f);
    num(f, s->flops_per_micro_batch);
    fputs("},\n \"communication\": {\"bytes_per_device\": ", f);
    num(f, s->comm_bytes);
    fputs(", \"tensor_parallel_bytes_per_device\": ", f);
    num(f, s->tp_comm_bytes);
    if (s->cp_comm_bytes > 0) { /* only with context parallelism */
        fputs(", \"context_parallel_bytes_per_device\": ", f);
        num(f, s->cp_comm_bytes);
    }
    if (s->ep_comm_bytes > 0) { /* only with expert parallelism */
        fputs(", \"expert_parallel_bytes_per_device\": ", f);
        num(f, s->ep_comm_bytes);
    }
    if (s->etp_comm_bytes > 0) { /* only with expert tensor parallelism */
        fputs(", \"expert_tensor_parallel_bytes_per_device\": ", f);
        num(f, s->etp_comm_bytes);
    }
    fputs("},\n \"host_transfer\": {\"bytes_per_device\": ", f);
    num(f, s->host_transfer_bytes);
    fputs("},\n \"step_time_s\": ", f);
    num_or_null(f, s->step_time_s);
    /* the step time's parts; null: unknown, or not timed (no bandwidth) */
    fputs(",\n \"time\": {\"compute_s\": ", f);
    num_or_null(f, s->time_compute_s);
    fputs(", \"communication_s\": ", f);
    num_or_null(f, s->time_communication_s);
    fputs(", \"host_transfer_s\": ", f);
    num_or_null(f, s->time_host_transfer_s);
    fputs(", \"tensor_parallel_s\": ", f);
    num_or_null(f, s->time_tp_s);
    if (s->cp_comm_bytes > 0) {
        fputs(", \"context_parallel_s\": ", f);
        num_or_null(f, s->time_cp_s);
    }
    if (s->ep_comm_bytes > 0) {
        fputs(", \"expert_parallel_s\": ", f);
        num_or_null(f, s->time_ep_s);
    }
    if (s->etp_comm_bytes > 0) {
        fputs(", \"expert_tensor_parallel_s\": ", f);
        num_or_null(f, s->time_etp_s);
    }
    fprintf(f, ", \"communication_hidden_s\": %.17g", s->time_comm_hidden_s);
    json_step_time(f, &s->time);
    fputc('}', f);
}

/* The plan's JSON object without its closing brace. */
void ml__report_json_open_verdict(FILE *f, const ml_model *m, const ml_config *cfg,
                                  const ml_ledger *l, const ml_report_verdict *v)
{
    const ml_summary *s = ml_ledger_summary(l);
    json_head(f, m, cfg, l);
    json_calibration(f, cfg, s);
    json_bytes(f, cfg, s);
    json_blocks_and_time(f, l, s);
    ml__report_json_ranks(f, cfg, l);
    json_device(f, cfg, s, v);
}

void ml__report_json_open(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l)
{
    ml__report_json_open_verdict(f, m, cfg, l, NULL);
}

int ml_report_json(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l)
{
    ml__report_json_open(f, m, cfg, l);
    fputs("}\n", f);
    return ferror(f) ? -1 : 0;
}

int ml_report_json_lengths(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                           const ml_lengths *d, const ml_lengths_request *req,
                           const ml_lengths_result *r)
{
    ml_report_verdict v;
    ml__report_lengths_verdict(r, &v);
    ml__report_json_open_verdict(f, m, cfg, l, cfg->device.present ? &v : NULL);
    fputs(",\n \"lengths\": ", f);
    ml_report_lengths_json_object(f, d, req, r);
    fputs("}\n", f);
    return ferror(f) ? -1 : 0;
}
