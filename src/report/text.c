/* Text report: the ledger a person reads. Binary units throughout. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "memledger/calib.h"
#include "memledger/report.h"
#include "model/model_internal.h"
#include "report/report_internal.h"

static const char *const cat_label[ML_CAT_COUNT] = {
    [ML_CAT_PARAMS] = "params",           [ML_CAT_MASTER] = "master weights",
    [ML_CAT_GRADS] = "grads",             [ML_CAT_OPTIMIZER] = "optimizer states",
    [ML_CAT_ACTIVATIONS] = "saved activations", [ML_CAT_RECOMPUTE] = "recompute",
    [ML_CAT_WORKSPACE] = "workspace",     [ML_CAT_BATCH] = "batch",
    [ML_CAT_BUFFERS] = "buffers"};

const char *ml__report_category_label(ml_category c)
{
    return (unsigned)c < ML_CAT_COUNT ? cat_label[c] : "?";
}

void ml__report_commas(uint64_t v, char *buf, size_t size)
{
    char tmp[32];
    int n = snprintf(tmp, sizeof tmp, "%llu", (unsigned long long)v);
    size_t o = 0;
    for (int i = 0; i < n && o + 1 < size; i++) {
        if (i && (n - i) % 3 == 0 && o + 1 < size)
            buf[o++] = ',';
        if (o + 1 < size)
            buf[o++] = tmp[i];
    }
    buf[o] = '\0';
}

static const char *B(uint64_t v, char *buf)
{
    ml_format_bytes(v, buf, 32);
    return buf;
}

static bool same_block(const ml_block_info *a, const ml_block_info *b)
{
    return a->params == b->params && a->activations_saved == b->activations_saved &&
           a->inventory_bytes == b->inventory_bytes && a->flops_forward == b->flops_forward &&
           a->checkpointed == b->checkpointed;
}

/* The plan's head: the model, the configuration, the loop, the optimal
 * plan, the calibration and the sharding. */
static void text_header(FILE *f, const ml_model *m, const ml_config *cfg, const ml_summary *s)
{
    const ml_training *t = &cfg->training;
    char ck[1200], num[40];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    ml__report_commas(s->params, num, sizeof num);
    if (t->tensor_parallel > 1 || t->pipeline_parallel > 1)
        fprintf(f, "memledger plan: %s (%s parameters on this rank)\n", ml_model_name(m), num);
    else
        fprintf(f, "memledger plan: %s (%s parameters)\n", ml_model_name(m), num);
    const char *attn = ml_model_attention(m);
    char tl[80] = "";
    if (ml_model_target_len(m, t))
        snprintf(tl, sizeof tl, ", target_len %llu", (unsigned long long)ml_model_target_len(m, t));
    else if (ml_model_image_tokens(m))
        snprintf(tl, sizeof tl, " (%llu image tokens), vision tower %s",
                 (unsigned long long)ml_model_image_tokens(m),
                 ml_vision_tower_name(t->vision_tower));
    char sl[160];
    if (m->type == ML_MODEL_SEQUENTIAL)
        ml__report_lengths(m, t, sl, sizeof sl);
    else
        snprintf(sl, sizeof sl, "seq_len %llu%s",
                 (unsigned long long)(s->c_tokens / t->micro_batch *
                                      ml_training_cp(t)),
                 tl);
    fprintf(f, "config: micro_batch %llu, %s, grad_accum %llu, precision %s, "
               "optimizer %s (%s), checkpoint %s%s%s\n",
            (unsigned long long)t->micro_batch, sl,
            (unsigned long long)t->grad_accum, ml_precision_name(t->precision),
            ml_optimizer_name(t->optimizer), ml_optimizer_impl_name(t->optimizer_impl), ck,
            attn ? ", attention " : "", attn ? attn : "");
    if (ml_model_attention_assumed(m))
        fprintf(f, "attention: %s, assumed: %s\n", attn, ml_model_attention_assumed(m));
    if (t->logits == ML_LOGITS_FUSED && t->logits_chunk)
        fprintf(f, "loop: logits fused (%llu tokens per chunk), zero_grad %s\n",
                (unsigned long long)t->logits_chunk, ml_zero_grad_name(t->zero_grad));
    else if (t->logits != ML_LOGITS_KEPT || t->zero_grad != ML_ZERO_GRAD_SET_TO_NONE)
        fprintf(f, "loop: logits %s, zero_grad %s\n", ml_logits_name(t->logits),
                ml_zero_grad_name(t->zero_grad));
    if (t->checkpoint.kind == ML_CKPT_OPTIMAL)
        fprintf(f, "plan: %s%s\n", s->plan,
                s->plan_fits_budget ? "" : "  (no checkpoint plan meets the budget: this is the "
                                           "one with the lowest peak)");
    if (cfg->calib) {
        ml__report_calibration(f, cfg, s);
        fputc('\n', f);
    }
    ml__report_text_parallel(f, t);
    fputc('\n', f);
}

/* The model states, each with when it is resident. */
static void text_states(FILE *f, const ml_training *t, const ml_summary *s)
{
    char a[32];
    fprintf(f, "Model states (resident all iteration unless noted)\n");
    fprintf(f, "  %-22s %12s\n", "params", B(s->bytes_params, a));
    fprintf(f, "  %-22s %12s\n", "master weights", B(s->bytes_master, a));
    fprintf(f, "  %-22s %12s   (%s)\n", "grads", B(s->bytes_grads, a),
            t->zero_grad == ML_ZERO_GRAD_ZERO ? "kept all iteration, zeroed after the step"
                                              : "created in backward, freed after the step");
    fprintf(f, "  %-22s %12s\n", "optimizer states", B(s->bytes_optimizer, a));
    fprintf(f, "  %-22s %12s   (the four above: %.2f B per parameter)\n", "= model states",
            B(ml__report_model_states(s), a), ml__report_model_states_per_param(s));
    fprintf(f, "  %-22s %12s   (optimizer step only)\n", "step temporaries",
            B(s->bytes_step_temp, a));
    if (s->bytes_host)
        fprintf(f, "  %-22s %12s   (offloaded: host memory, not on the device)\n", "host",
                B(s->bytes_host, a));
    fprintf(f, "  %-22s %12s   (inputs and targets the loop holds)\n", "batch",
            B(s->bytes_batch, a));
    if (s->bytes_buffers)
        fprintf(f, "  %-22s %12s   (module buffers)\n", "buffers", B(s->bytes_buffers, a));
    fprintf(f, "\n");
}

uint64_t ml__report_model_states(const ml_summary *s)
{
    /* each is below 2^63 B (ml_config_check's limits), the sum saturates */
    uint64_t v = s->bytes_params, parts[3] = {s->bytes_master, s->bytes_grads,
                                             s->bytes_optimizer};
    for (int i = 0; i < 3; i++)
        v = v > UINT64_MAX - parts[i] ? UINT64_MAX : v + parts[i];
    return v;
}

double ml__report_model_states_per_param(const ml_summary *s)
{
    return s->params ? (double)ml__report_model_states(s) / (double)s->params : 0;
}

/* "block.1..block.31", or, past the column's 22 characters, the last
 * name's part after their common prefix: "encoder.block.1..11". */
static void range_name(char *out, size_t size, const char *first, const char *last)
{
    snprintf(out, size, "%s..%s", first, last);
    if (strlen(out) <= 22)
        return;
    size_t p = 0, cut = 0;
    while (first[p] && first[p] == last[p]) {
        if (first[p] == '.')
            cut = p + 1;
        p++;
    }
    snprintf(out, size, "%s..%s", first, last + cut);
}

/* The blocks whose forward transients are not found op by op, by how they
 * are (docs/ledger.md, "Transients"): runs of neighbours as first..last. */
static void text_transients(FILE *f, const ml_ledger *l)
{
    static const char *const how[ML_TRANSIENTS_COUNT] = {
        [ML_TRANSIENTS_BLOCK_RULE] = "forward transients by the block rule (twice the largest "
                                     "tensor)",
        [ML_TRANSIENTS_PARTLY] = "forward transients op by op under no_grad, by the block "
                                 "rule with grad",
        [ML_TRANSIENTS_FORMULA] = "forward transients from the loss's own tensors"};
    const size_t n = ml_ledger_block_count(l);
    for (int t = ML_TRANSIENTS_BLOCK_RULE; t < ML_TRANSIENTS_COUNT; t++) {
        bool any = false;
        for (size_t i = 0; i < n;) {
            const ml_block_info *b = ml_ledger_block(l, i);
            size_t j = i + 1;
            if (b->transients != (ml_transients)t) {
                i = j;
                continue;
            }
            while (j < n && ml_ledger_block(l, j)->transients == (ml_transients)t)
                j++;
            char name[128];
            if (j - i >= 2)
                range_name(name, sizeof name, b->name, ml_ledger_block(l, j - 1)->name);
            else
                snprintf(name, sizeof name, "%s", b->name);
            if (any)
                fprintf(f, ", %s", name);
            else
                fprintf(f, "  %s: %s", how[t], name);
            any = true;
            i = j;
        }
        if (any)
            fputc('\n', f);
    }
}

/* The saved activations per block, runs of three or more like blocks on one
 * line. */
static void text_activations(FILE *f, const ml_model *m, const ml_ledger *l,
                             const ml_summary *s)
{
    char a[32], b2[32], c3[32], num[40];
    if (m->type == ML_MODEL_SEQUENTIAL) /* no tokens: B samples of D input values */
        fprintf(f, "Saved activations at the end of forward (c = inventory / (B*D*b), "
                   "B = %llu, D = %llu input values per sample, b = %u)\n",
                (unsigned long long)s->c_tokens, (unsigned long long)s->c_width,
                s->c_dtype_bytes);
    else
        fprintf(f, "Saved activations at the end of forward (c = inventory / (B*T*D*b), "
                   "B*T = %llu, D = %llu, b = %u)\n",
                (unsigned long long)s->c_tokens, (unsigned long long)s->c_width,
                s->c_dtype_bytes);
    fprintf(f, "  %-22s %14s %12s %9s %14s\n", "block", "params", "saved", "c", "fwd FLOPs");
    size_t n = ml_ledger_block_count(l);
    for (size_t i = 0; i < n;) {
        const ml_block_info *b = ml_ledger_block(l, i);
        size_t j = i + 1;
        while (j < n && same_block(b, ml_ledger_block(l, j)))
            j++;
        char name[128];
        if (j - i >= 3)
            range_name(name, sizeof name, b->name, ml_ledger_block(l, j - 1)->name);
        else {
            snprintf(name, sizeof name, "%s", b->name);
            j = i + 1;
        }
        ml__report_commas(b->params, num, sizeof num);
        ml_format_flops(b->flops_forward, c3, sizeof c3);
        fprintf(f, "  %-22s %14s %12s %8.3f%s %14s%s", name, num, B(b->activations_saved, a),
                b->c, b->measured ? "*" : " ", c3, b->checkpointed ? "  ckpt" : "");
        if (j - i >= 3)
            fprintf(f, "   each; x%zu = %s", j - i,
                    B(b->activations_saved * (uint64_t)(j - i), b2));
        fputc('\n', f);
        i = j;
    }
    fprintf(f, "  %-22s %14s %12s\n", "total", "", B(s->bytes_activations, a));
    text_transients(f, l);
    fputc('\n', f);
}

/* Where the reserved peak was, and the segments then: how much of them
 * the allocated bytes fill, the rest cached free. */
static void reserved_where(FILE *f, const ml_summary *s)
{
    static const char *const when[] = {"while the parameters are made", "first iteration",
                                       "steady iteration", "evaluation pass"};
    const ml_reserved_at *w = &s->reserved_at;
    char a[32], b[32];
    uint64_t cached = s->reserved_peak > w->allocated ? s->reserved_peak - w->allocated : 0;
    if (w->when == ML_RESERVED_EVAL)
        fputs("    at its peak: in the evaluation pass\n", f);
    else
        fprintf(f, "    at its peak: %s, %s (%s): %llu segments, %s allocated in them, %s "
                   "cached free\n",
                ml_phase_name(w->phase), w->at, when[w->when], (unsigned long long)w->segments,
                B(w->allocated, a), B(cached, b));
    if (s->start_reserved) /* --allocator-start */
        fprintf(f, "    from a start state: %s reserved in %llu segment%s, %s of it allocated "
                   "(--allocator-start)\n",
                B(s->start_reserved, a), (unsigned long long)s->start_segments,
                s->start_segments == 1 ? "" : "s", B(s->start_allocated, b));
}

/* The allocator-view peak by category, what is added over it, and the other
 * peaks (first iteration, evaluation, reserved). */
static void text_peak(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    const ml_training *t = &cfg->training;
    char a[32];
    fprintf(f, "Allocator peak: %s during %s, at %s\n", B(s->peak, a),
            ml_phase_name(s->peak_phase), s->peak_step);
    for (int c = 0; c < ML_CAT_COUNT; c++)
        fprintf(f, "  %-22s %12s\n", ml__report_category_label((ml_category)c),
                B(s->peak_breakdown[c], a));
    if (cfg->device.fragmentation > 0)
        fprintf(f, "  %-22s %12s   (%g x the peak)\n", "+ fragmentation", B(s->fragmentation, a),
                cfg->device.fragmentation);
    else if (s->has_reserved) {
        const uint64_t held = s->fragmentation >= s->start_allocated ? s->start_allocated : 0;
        fprintf(f, "  %-22s %12s   (the simulated reserved peak over it)\n", "+ allocator cache",
                B(s->fragmentation - held, a));
        if (held)
            fprintf(f, "  %-22s %12s   (allocated before the job: --allocator-start)\n",
                    "+ start's tensors", B(held, a));
    }
    fprintf(f, "  %-22s %12s\n", "+ runtime reserve", B(s->runtime_reserve, a));
    fprintf(f, "  %-22s %12s%s\n", "= device total", B(s->peak_total, a),
            s->binding == ML_PEAK_STEADY ? ""
            : s->binding == ML_PEAK_EVAL  ? "   (from the evaluation peak, which binds)"
                                          : "   (from the first iteration's peak, which binds)");
    fprintf(f, "  first iteration        %12s   (optimizer states created by its step)\n",
            B(s->peak_first_iteration, a));
    if (s->has_eval)
        fprintf(f, "  evaluation             %12s   (no_grad, batch %llu x %llu, output kept)\n",
                B(s->peak_eval, a), (unsigned long long)t->eval_batch,
                (unsigned long long)(t->eval_seq_len ? t->eval_seq_len : t->seq_len));
    if (s->has_reserved) {
        fprintf(f, "  reserved               %12s   (%s allocator simulated: %llu segments%s%s)\n",
                B(s->reserved_peak, a), ml_allocator_name(cfg->device.allocator),
                (unsigned long long)s->reserved_segments,
                s->reserved_oom ? "; OUT OF MEMORY on the device" : "",
                cfg->device.fragmentation > 0 ? "; the fragmentation allowance takes its place "
                                                "in the verdict"
                                              : "");
        reserved_where(f, s);
    }
    fputc('\n', f);
}

/* One cell of the phase table: "5.25 GiB at block.3", or "-". */
static void phase_cell(FILE *f, const ml_phase_peak *p, bool last)
{
    char a[32], cell[112];
    if (p->present)
        snprintf(cell, sizeof cell, "%s at %s", B(p->peak, a), p->at);
    else
        snprintf(cell, sizeof cell, "-");
    fprintf(f, last ? "  %s" : "  %-32s", cell);
}

/* Each phase's peak and where, for the steady iteration, the first one
 * and the evaluation pass (docs/ledger.md, "Each phase's peak"). */
static void text_phases(FILE *f, const ml_summary *s)
{
    fprintf(f, "Each phase's peak (allocator view, and where)\n");
    fprintf(f, "  %-10s  %-32s  ", "phase", "steady iteration");
    fprintf(f, s->has_eval ? "%-32s  evaluation\n" : "%s\n", "first iteration");
    for (int ph = 0; ph < ML_PHASE_COUNT; ph++) {
        fprintf(f, "  %-10s", ml_phase_name((ml_phase)ph));
        phase_cell(f, &s->phase_steady[ph], false);
        phase_cell(f, &s->phase_first[ph], !s->has_eval);
        if (s->has_eval)
            phase_cell(f, &s->phase_eval[ph], true);
        fputc('\n', f);
    }
    fputc('\n', f);
}

/* The step time and the peak it used: the device's own figure, or its
 * preset's at the plan's compute dtype (docs/devices.md). */
static void text_step_time(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    const ml_device *dv = &cfg->device;
    const char *dt = ml_compute_dtype_name(ml_precision_compute_dtype(cfg->training.precision));
    /* with the per-op model's step time above, the FLOPs alone: a bound */
    const bool op = s->time.source != ML_TIME_NONE;
    const char *what = op ? "FLOPs alone" : "step time";
    const double v = op ? s->time.flops_s : s->time_compute_s;
    if (s->time_measured) {
        fprintf(f, "  %s %.4g s at %.4g TFLOP/s, the GEMM throughput measured by profile %s\n",
                what, v, ml_profile_achieved_tflops(cfg->calib), ml_profile_get(cfg->calib, "name"));
        return;
    }
    if (s->step_time_s >= 0 && !(dv->peak_tflops > 0) && dv->preset)
        fprintf(f, "  %s %.4g s at %g TFLOP/s (%s, dense %s) x %.0f%% efficiency%s\n", what, v,
                s->peak_tflops_used, dv->preset->name, dt, dv->efficiency * 100,
                dv->efficiency >= 1 ? " (a lower bound)" : "");
    else if (s->step_time_s >= 0)
        fprintf(f, "  %s %.4g s at %g TFLOP/s x %.0f%% efficiency%s\n", what, v,
                s->peak_tflops_used, dv->efficiency * 100,
                dv->efficiency >= 1 ? " (a lower bound)" : "");
    else if (dv->preset)
        fprintf(f, "  step time: unknown (%s has no published dense %s peak; give --peak-tflops)\n",
                dv->preset->name, dt);
    else
        fprintf(f, "  step time: unknown (name the device, e.g. --device h100-sxm, or give "
                   "--peak-tflops)\n");
    if (s->time_note)
        fprintf(f, "  (profile %s's measured throughput not used: %s)\n",
                ml_profile_get(cfg->calib, "name"), s->time_note);
}

/* The per-op model's step time (docs/time.md): its source, the bound, the
 * GPU's and the host's parts, the phases, throughput and MFU. */
static void text_op_time(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    const ml_step_time *t = &s->time;
    if (t->source == ML_TIME_NONE) {
        /* without a named device the line above says what to give */
        if (cfg->device.preset)
            fprintf(f, "  per-op step time: not timed (%s publishes no memory bandwidth or "
                       "no peak at this precision)\n",
                    cfg->device.preset->name);
        return;
    }
    double k = 0;
    for (int i = 0; i < ML_TPHASE_COUNT; i++)
        k += t->kernels[i];
    fprintf(f, "  step time %.4g s, %s (per-op model, docs/time.md: %s)\n", s->time_compute_s,
            t->serial       ? "host and compute in turn on one processor"
            : t->host_bound ? "host-bound"
                            : "GPU-bound",
            t->source == ML_TIME_DATASHEET ? "datasheet estimate"
            : ml_profile_memory_gbps(cfg->calib) > 0 ? "the profile's GEMM rates and bandwidth"
                                                     : "the profile's GEMM rates, datasheet "
                                                       "bandwidth");
    fprintf(f, "    %s %.4g s (products and attention %.4g s, memory-bound %.4g s, at the "
               "kernel floor %.4g s); host %.4g s for %.0f kernels\n",
            t->serial ? "compute" : "GPU", t->gpu_s, t->gemm_s, t->memory_s, t->floor_s, t->host_s, k);
    fprintf(f, "    forward %.4g s, backward %.4g s, recompute %.4g s, optimizer step %.4g s\n",
            t->by_phase[ML_TPHASE_FORWARD], t->by_phase[ML_TPHASE_BACKWARD],
            t->by_phase[ML_TPHASE_RECOMPUTE], t->by_phase[ML_TPHASE_STEP]);
    /* the band the datasheet estimate held on the H200 campaign
     * (calib/h200_time.py --datasheet; docs/time.md) */
    if (t->source == ML_TIME_DATASHEET) {
        const bool fp32 =
            ml_precision_compute_dtype(cfg->training.precision) == ML_COMPUTE_FP32;
        fprintf(f, "    datasheet estimate: within a median %s (worst %s) of 30 H200 runs' step at "
                   "this precision\n",
                fp32 ? "4.6 %" : "7.9 %", fp32 ? "10.6 %" : "37.6 %");
    }
    fprintf(f, "    %.0f tokens/s", t->tokens_per_s);
    if (t->mfu >= 0)
        fprintf(f, ", MFU %.1f%%", t->mfu * 100);
    if (t->flops_only_blocks)
        fprintf(f, "; %zu blocks without an op graph timed by their FLOPs", t->flops_only_blocks);
    fputc('\n', f);
}

/* A part of the step time: its seconds at the bandwidth given, or the flag
 * that would time it (docs/sharding.md, "Time"). */
static void text_part(FILE *f, double sec, double gbps, const char *flag)
{
    if (sec >= 0)
        fprintf(f, ", %.4g s at %g GB/s\n", sec, gbps);
    else
        fprintf(f, " (not timed: give %s GBps)\n", flag);
}

/* Bytes counted as a double (a step's transfers), beyond 2^64 in B */
static void bytes_d(double x, char *buf, size_t size)
{
    if (x >= 18446744073709551615.0)
        snprintf(buf, size, "%.4g B", x);
    else
        ml_format_bytes((uint64_t)x, buf, size);
}

/* The FLOPs, the communication and the step time. */
static void text_flops(FILE *f, const ml_config *cfg, const ml_summary *s)
{
    const ml_training *t = &cfg->training;
    char a[32], b2[32], c3[32];
    ml_format_flops(s->flops_forward, a, sizeof a);
    ml_format_flops(s->flops_backward, b2, sizeof b2);
    ml_format_flops(s->flops_recompute, c3, sizeof c3);
    fprintf(f, "FLOPs per iteration: forward %s, backward %s, recompute %s\n", a, b2, c3);
    ml_format_flops(s->flops_total, a, sizeof a);
    ml_format_flops(s->flops_per_micro_batch, b2, sizeof b2);
    fprintf(f, "  total %s (%s per micro-batch)\n", a, b2);
    if (t->data_parallel > 1 || s->comm_bytes > 0) { /* (cp alone: its ranks' gradients) */
        bytes_d(s->comm_bytes, a, sizeof a);
        fprintf(f, "  communication: %s sent per device per iteration", a);
        text_part(f, s->time_communication_s,
                  ml_device_dp_link(&cfg->device, ml_training_devices(t)), "--interconnect");
        if (s->time_comm_hidden_s > 0)
            fprintf(f, "    of it %.4g s beside the last micro-batch's backward "
                       "(overlap_grad_reduce), not in the step\n",
                    s->time_comm_hidden_s);
    }
    if (s->tp_comm_bytes > 0) {
        bytes_d(s->tp_comm_bytes, a, sizeof a);
        fprintf(f, "  tensor-parallel collectives: %s sent per rank per iteration", a);
        text_part(f, s->time_tp_s, ml_device_interconnect(&cfg->device), "--interconnect");
    }
    if (s->cp_comm_bytes > 0) {
        bytes_d(s->cp_comm_bytes, a, sizeof a);
        fprintf(f, "  context-parallel ring: %s sent per rank per iteration", a);
        text_part(f, s->time_cp_s, ml_device_interconnect(&cfg->device), "--interconnect");
    }
    if (s->ep_comm_bytes > 0) {
        bytes_d(s->ep_comm_bytes, a, sizeof a);
        fprintf(f, "  expert-parallel all-to-alls: %s sent per rank per iteration", a);
        text_part(f, s->time_ep_s, ml_device_interconnect(&cfg->device), "--interconnect");
    }
    if (s->etp_comm_bytes > 0) {
        bytes_d(s->etp_comm_bytes, a, sizeof a);
        fprintf(f, "  expert-tensor all-gathers and reduce-scatters: %s sent per rank per "
                   "iteration", a);
        text_part(f, s->time_etp_s, ml_device_interconnect(&cfg->device), "--interconnect");
    }
    if (s->host_transfer_bytes > 0) {
        bytes_d(s->host_transfer_bytes, a, sizeof a);
        fprintf(f, "  host transfers: %s per device per iteration", a);
        text_part(f, s->time_host_transfer_s, cfg->device.pcie_gbps, "--pcie");
    }
    text_op_time(f, cfg, s);
    text_step_time(f, cfg, s);
    /* the step time with the timed parts, run serially after the compute */
    if (s->step_time_s >= 0 && s->step_time_s > s->time_compute_s)
        fprintf(f, "  step time with communication and host transfers (not overlapped): %.4g s\n",
                s->step_time_s);
}

const char *ml__report_budget_holds(const ml_device *d)
{
    return d->allocator == ML_ALLOCATOR_NONE ? "allocator peak"
           : d->fragmentation > 0            ? "allocator peak with the allowance"
                                             : "reserved peak";
}

/* The device and the verdict (nothing without a device). With a length
 * distribution (v) the verdict is the distribution's: every batch it
 * produces must fit; the configured shape's own is said on a line of its
 * own (docs/lengths.md, "The verdict"). */
static void text_device(FILE *f, const ml_config *cfg, const ml_summary *s,
                        const ml_report_verdict *v)
{
    char a[32], b2[32], c3[32];
    if (!s->has_device)
        return;
    fprintf(f, "\nDevice: %s, runtime reserve %s, budget %s (for the %s)", B(s->memory, a),
            B(s->runtime_reserve, b2), B(s->budget, c3), ml__report_budget_holds(&cfg->device));
    if (cfg->device.fragmentation > 0)
        fprintf(f, ", fragmentation allowance %g x the peak", cfg->device.fragmentation);
    fputc('\n', f);
    if (v) {
        fprintf(f, "  the configured shape (%llu x %llu tokens) alone: ",
                (unsigned long long)cfg->training.micro_batch,
                (unsigned long long)cfg->training.seq_len);
        if (s->fits)
            fprintf(f, "fits, headroom %s\n", B((uint64_t)s->headroom, a));
        else if (s->headroom == -1 && s->reserved_oom)
            fputs("does not fit: the simulated caching allocator runs out of the device\n", f);
        else
            fprintf(f, "does not fit, over by %s\n", B((uint64_t)(-s->headroom), a));
        fprintf(f, "  verdict (every batch of the lengths below): ");
    } else
        fputs("  verdict: ", f);
    bool fits = v ? v->fits : s->fits;
    int64_t h = v ? v->headroom : s->headroom;
    if (fits)
        fprintf(f, "FITS, headroom %s", B((uint64_t)h, a));
    else if (h == -1 && (v ? cfg->device.allocator != ML_ALLOCATOR_NONE : s->reserved_oom))
        fputs("DOES NOT FIT: the simulated caching allocator runs out of the device (its "
              "cache fragmented)", f);
    else
        fprintf(f, "DOES NOT FIT, over by %s", B((uint64_t)(-h), a));
    if (v && !fits && !(v->p_over > 0)) /* (a listed batch; none found between them) */
        fprintf(f, " (tightest batch %llu x %llu tokens; the search between the batches "
                   "listed finds no other)",
                (unsigned long long)v->worst_micro_batch, (unsigned long long)v->worst_seq_len);
    else if (v)
        fprintf(f, " (tightest batch %llu x %llu tokens; a batch goes over with probability "
                   "%.4g %%)",
                (unsigned long long)v->worst_micro_batch, (unsigned long long)v->worst_seq_len,
                v->p_over * 100);
    fputc('\n', f);
}

static int text_report(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                       const ml_report_verdict *v, bool all_ranks)
{
    const ml_summary *s = ml_ledger_summary(l);
    text_header(f, m, cfg, s);
    ml__report_text_ranks(f, cfg, l, all_ranks);
    text_states(f, &cfg->training, s);
    text_activations(f, m, l, s);
    text_peak(f, cfg, s);
    text_phases(f, s);
    text_flops(f, cfg, s);
    text_device(f, cfg, s, v);
    return ferror(f) ? -1 : 0;
}

int ml__report_text_verdict(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l,
                            const ml_report_verdict *v)
{
    return text_report(f, m, cfg, l, v, false);
}

int ml__report_text_all_ranks(FILE *f, const ml_model *m, const ml_config *cfg,
                              const ml_ledger *l)
{
    return text_report(f, m, cfg, l, NULL, true);
}

int ml_report_text(FILE *f, const ml_model *m, const ml_config *cfg, const ml_ledger *l)
{
    return ml__report_text_verdict(f, m, cfg, l, NULL);
}
