/* memledger triage MODEL.yaml: what the peak of a configuration that ran out
 * of memory is made of, and every remedy that applies, re-planned and ranked
 * (ml_triage, docs/cli.md "triage"). */
#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "report/report_internal.h"

static const char *const usage[] = {
    "usage: memledger triage MODEL.yaml [options]\n"
    "       memledger triage --hf config.json [--training FILE.yaml] [options]\n"
    "\n"
    "For a configuration that runs out of memory: the peak (phase, step, breakdown),\n"
    "then every remedy that applies, each re-planned with the ledger: its peak, the\n"
    "change in step time (the FLOPs ratio without a throughput), what it changes in\n"
    "training. Ranked: those that fit first, least slowdown first; then those that\n"
    "do not, lowest peak first.\n"
    "\n"
    "  --oom-phase P          forward | backward | optimizer | eval: where the run failed;\n"
    "                         remedies acting on that phase rank first\n"
    "  --allocated SIZE       torch.cuda.max_memory_allocated() of the failing run\n"
    "  --reserved SIZE        torch.cuda.max_memory_reserved() of the failing run\n"
    "  --lengths FILE|Q       sample lengths (see 'memledger plan --help'): the peak\n"
    "                         triaged is the worst batch's, and padded batches gain the\n"
    "                         remedies token-budget (the largest --max-tokens whose\n"
    "                         worst batch fits) and length-buckets\n"
    "  --batching B, --max-tokens N, --buckets K   as under plan (not --max-tokens auto)\n"
    "  --format text|json     (default text)\n"
    "  -o FILE                write to FILE (atomically) instead of stdout\n"
    "  and every 'memledger plan' option (--micro-batch, --device, --eval-batch, ...)\n"
    "\n"
    "Exit status: 0 ran and the configuration fits (or no device), 1 it does not fit\n"
    "(the triage is printed), 2 bad input or usage, 3 output could not be written.\n", NULL};

/* The verb's own flags, taken out of argv before the shared parser. */
typedef struct {
    const char *phase, *allocated, *reserved;
} triage_flags;

static int usage_error(const char *fmt, const char *arg)
{
    char msg[4200];
    snprintf(msg, sizeof msg, fmt, arg);
    ml_cli_errorf("%s", msg);
    fprintf(stderr, "Try 'memledger triage --help'.\n");
    return ML_EXIT_BAD_INPUT;
}

/* Moves the triage flags' values into *x and every other argument, in order,
 * into rest. A value follows '=' or is the next argument unless that is
 * itself a flag (as the shared parser reads values). Returns 0 or 2. */
static int take_flags(int argc, char **argv, char **rest, int *nrest, triage_flags *x)
{
    static const char *const names[] = {"--oom-phase", "--allocated", "--reserved"};
    *nrest = 0;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i], *eq = strchr(arg, '=');
        size_t len = eq ? (size_t)(eq - arg) : strlen(arg), k;
        for (k = 0; k < 3; k++)
            if (strlen(names[k]) == len && !strncmp(arg, names[k], len))
                break;
        if (k == 3) {
            rest[(*nrest)++] = argv[i];
            continue;
        }
        const char *v = eq ? eq + 1 : i + 1 < argc ? argv[i + 1] : NULL;
        if (!eq && v && v[0] == '-' && v[1] && !isdigit((unsigned char)v[1]) && v[1] != '.')
            v = NULL;
        if (!v || !*v)
            return usage_error("%s needs a value", names[k]);
        if (!eq)
            i++;
        const char **slot = k == 0 ? &x->phase : k == 1 ? &x->allocated : &x->reserved;
        if (*slot) /* as the shared parser refuses a flag given twice */
            return usage_error("%s: given twice: give it once", names[k]);
        *slot = v;
    }
    rest[*nrest] = NULL;
    return 0;
}

static int size_value(const char *flag, const char *v, uint64_t *out)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (!v)
        return 0;
    if (ml_parse_size(v, out, &e) == ML_OK && *out > 0)
        return 0;
    ml_cli_errorf("%s: %s", flag, e.msg[0] ? e.msg : "must be above 0 bytes");
    return ML_EXIT_BAD_INPUT;
}

static int request_of(const triage_flags *x, ml_triage_request *req)
{
    *req = ml_triage_request_defaults();
    if (x->phase && (!ml_triage_phase_parse(x->phase, &req->oom_phase) ||
                     req->oom_phase == ML_TRIAGE_ANY))
        return usage_error("--oom-phase: '%s' is not a phase; use forward, backward, optimizer "
                           "or eval",
                           x->phase);
    int rc = size_value("--allocated", x->allocated, &req->allocated);
    if (rc || (rc = size_value("--reserved", x->reserved, &req->reserved)))
        return rc;
    if (req->allocated && req->reserved && req->reserved < req->allocated) {
        ml_cli_errorf("--reserved %s is below --allocated %s: the caching allocator's reserved "
                      "memory holds every allocated block, so max_memory_reserved() >= "
                      "max_memory_allocated(); check the two figures",
                      x->reserved, x->allocated);
        return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

static const char *B(uint64_t v, char *buf)
{
    ml_format_bytes(v, buf, 32);
    return buf;
}

/* "the plan over-states it by 12.00 MiB (3.1%)" */
static void error_words(uint64_t planned, uint64_t seen, char *buf, size_t size)
{
    char a[32];
    uint64_t d = planned > seen ? planned - seen : seen - planned;
    if (!d) {
        snprintf(buf, size, "the plan matches it");
        return;
    }
    snprintf(buf, size, "the plan %s it by %s (%.1f%%)",
             planned > seen ? "over-states" : "under-states", B(d, a),
             100.0 * (double)d / (double)seen);
}

static void text_observed(FILE *f, const ml_config *cfg, const ml_triage_result *r)
{
    const ml_triage_observed *o = &r->observed;
    char a[32], b[32], w[128];
    fputs("\nObserved on the failing run\n", f);
    if (o->has_allocated) {
        error_words(o->planned_allocated, o->allocated, w, sizeof w);
        fprintf(f, "  allocated %12s   planned %s (the binding peak): %s%s\n",
                B(o->allocated, a), B(o->planned_allocated, b), w,
                o->planned_allocated > o->allocated ? "; a run that fails stops below its peak"
                                                    : "");
    }
    if (o->has_reserved) {
        error_words(o->planned_reserved, o->reserved, w, sizeof w);
        fprintf(f, "  reserved  %12s   planned %s (%s): %s\n", B(o->reserved, a),
                B(o->planned_reserved, b),
                o->reserved_simulated           ? "the simulated caching allocator"
                : cfg->device.fragmentation > 0 ? "with the fragmentation allowance"
                                                : "no cache planned; --allocator caching adds one",
                w);
    }
    if (o->has_allocated && o->has_reserved && o->fragmented)
        fprintf(f, "  reserved over allocated: %.1f%%: fragmentation; try expandable segments "
                   "(PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True), or plan with it "
                   "(--fragmentation %.2f)\n",
                100 * o->fragmentation, o->fragmentation > 1 ? 1.0 : o->fragmentation);
    else if (o->has_allocated && o->has_reserved)
        fprintf(f, "  reserved over allocated: %.1f%%\n", 100 * o->fragmentation);
}

static void text_peak(FILE *f, const ml_triage_result *r)
{
    const ml_summary *s = &r->current;
    char a[32], b[32];
    fprintf(f, "\nAllocator peak: %s during %s, at %s\n", B(s->peak, a),
            ml_phase_name(s->peak_phase), s->peak_step);
    for (int c = 0; c < ML_CAT_COUNT; c++)
        fprintf(f, "  %-22s %12s\n", ml__report_category_label((ml_category)c),
                B(s->peak_breakdown[c], a));
    if (s->binding != ML_PEAK_STEADY)
        fprintf(f, "  %-22s %12s   (it binds)\n",
                s->binding == ML_PEAK_EVAL ? "evaluation peak" : "first-iteration peak",
                B(r->peak, a));
    if (s->fragmentation)
        fprintf(f, "  %-22s %12s\n", "+ fragmentation", B(s->fragmentation, a));
    fprintf(f, "  %-22s %12s\n", "+ runtime reserve", B(s->runtime_reserve, a));
    fprintf(f, "  %-22s %12s\n", "= device total", B(s->peak_total, a));
    if (!s->has_device)
        fputs("  verdict: none (no device given)\n", f);
    else if (s->fits)
        fprintf(f, "  verdict: FITS (budget %s), headroom %s\n", B(s->budget, a),
                B((uint64_t)s->headroom, b));
    else if (s->reserved_oom && s->headroom == -1)
        fprintf(f, "  verdict: DOES NOT FIT (budget %s): the simulated caching allocator runs "
                   "out of the device\n",
                B(s->budget, a));
    else
        fprintf(f, "  verdict: DOES NOT FIT (budget %s), over by %s\n", B(s->budget, a),
                B((uint64_t)(-s->headroom), b));
}

static void text_remedies(FILE *f, const ml_triage_result *r)
{
    char a[32], b[32], t[32], x1[32];
    if (!r->count) {
        fputs("\nRemedies: none applies\n", f);
        return;
    }
    if (r->current.has_device)
        fputs("\nRemedies (those that fit first, least slowdown first; then lowest peak first", f);
    else
        fputs("\nRemedies (no device: lowest peak first", f);
    if (r->focus != ML_TRIAGE_ANY)
        fprintf(f, "; * acts on the %s phase", ml_triage_phase_name(r->focus));
    fprintf(f, ")\n  %2s  %-22s %12s %12s %12s %8s  %s\n", "#", "remedy", "alloc peak", "device total",
            "step time", "FLOPs", "fits");
    for (size_t i = 0; i < r->count; i++) {
        const ml_remedy *x = &r->remedies[i];
        if (x->step_time_s >= 0)
            snprintf(t, sizeof t, "%.4g s", x->step_time_s);
        else
            snprintf(t, sizeof t, "-");
        if (x->flops_ratio >= 0)
            snprintf(x1, sizeof x1, "%.3fx", x->flops_ratio);
        else
            snprintf(x1, sizeof x1, "-");
        fprintf(f, "  %2zu  %-22s %12s %12s %12s %8s  %s%s\n", i + 1, ml_remedy_name(x->kind),
                B(x->peak, a), B(x->peak_total, b), t, x1,
                !x->has_device ? "-" : x->fits ? "yes" : "no", x->in_focus ? "  *" : "");
    }
    fputs("\nWhat each changes\n", f);
    for (size_t i = 0; i < r->count; i++) {
        const ml_remedy *x = &r->remedies[i];
        fprintf(f, "  %zu. %s: %s\n     %s\n", i + 1, ml_remedy_name(x->kind), x->flags,
                x->changes);
    }
}

/* The configuration triaged: cfg, at the worst batch's shape with lengths. */
static ml_config triaged(const ml_config *cfg, const ml_triage_result *r)
{
    ml_config c = *cfg;
    if (r->has_lengths) {
        c.training.micro_batch = r->lengths.max.micro_batch;
        c.training.seq_len = r->lengths.max.seq_len;
    }
    return c;
}

/* Which batch the peak is with lengths (docs/lengths.md, "Triage"). */
static void text_worst(FILE *f, const ml_triage_request *req, const ml_triage_result *r)
{
    const ml_length_point *w = &r->lengths.max;
    fprintf(f, "lengths: the peak triaged is the worst batch's, %llu x %llu tokens (%s), "
               "the binding allocator peak of that shape; remedies are planned at that shape\n",
            (unsigned long long)w->micro_batch, (unsigned long long)w->seq_len,
            req->batching.batching == ML_BATCHING_BUCKETED ? "the bucket with the highest peak"
            : req->batching.batching == ML_BATCHING_PACKED ? "packed: every batch"
            : req->batching.max_tokens ? "the token budget's batch with the highest peak"
                                       : "the longest sample");
}

static int write_text(FILE *f, const ml_model *m, const ml_config *given, const ml_triage_result *r,
                      const ml_cli_opts *o, const ml_lengths *d, const ml_triage_request *req)
{
    const ml_config tc = triaged(given, r), *cfg = &tc;
    const ml_training *t = &cfg->training;
    char ck[64], a[32], b[32];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    char num[40];
    ml__report_commas(r->current.params, num, sizeof num);
    fprintf(f, "memledger triage: %s (%s parameters)\n", ml_model_name(m), num);
    char sl[80];
    ml__report_lengths(m, t, sl, sizeof sl);
    char lay[128];
    ml__report_layout(t, lay, sizeof lay);
    fprintf(f, "config: micro_batch %llu, %s, grad_accum %llu, precision %s, optimizer "
               "%s (%s), checkpoint %s, %llu device%s%s, ZeRO %u, offload %s\n",
            (unsigned long long)t->micro_batch, sl,
            (unsigned long long)t->grad_accum, ml_precision_name(t->precision),
            ml_optimizer_name(t->optimizer), ml_optimizer_impl_name(t->optimizer_impl), ck,
            (unsigned long long)t->data_parallel, t->data_parallel == 1 ? "" : "s", lay, t->zero,
            ml_offload_name(t->offload));
    if (cfg->device.present)
        fprintf(f, "device: %s, runtime reserve %s\n", B(cfg->device.memory, a),
                B(cfg->device.runtime_reserve, b));
    if (r->has_lengths)
        text_worst(f, req, r);
    text_peak(f, r);
    if (r->step_time_s >= 0)
        fprintf(f, "  step time %.4g s\n", r->step_time_s);
    if (r->has_lengths &&
        ml_report_lengths_text(f, given, d, o->lengths, &req->batching, &r->lengths))
        return -1;
    if (r->has_observed)
        text_observed(f, cfg, r);
    text_remedies(f, r);
    return ferror(f) ? -1 : 0;
}

static void json_num(FILE *f, double v)
{
    fprintf(f, "%.17g", v);
}

/* v, or null when it is not known */
static void json_u64(FILE *f, bool known, uint64_t v)
{
    if (known)
        fprintf(f, "%llu", (unsigned long long)v);
    else
        fputs("null", f);
}

static void json_i64(FILE *f, bool known, int64_t v)
{
    if (known)
        fprintf(f, "%lld", (long long)v);
    else
        fputs("null", f);
}

/* v, or null when it is below 0 (not known, not derived) */
static void json_known(FILE *f, double s)
{
    if (s >= 0)
        json_num(f, s);
    else
        fputs("null", f);
}

static void json_observed(FILE *f, const ml_triage_observed *o)
{
    fputs("{\"allocated\": ", f);
    json_u64(f, o->has_allocated, o->allocated);
    fputs(", \"reserved\": ", f);
    json_u64(f, o->has_reserved, o->reserved);
    fprintf(f, ", \"planned_allocated\": %llu, \"planned_reserved\": %llu, "
               "\"reserved_simulated\": %s, \"allocated_error\": ",
            (unsigned long long)o->planned_allocated, (unsigned long long)o->planned_reserved,
            o->reserved_simulated ? "true" : "false");
    json_i64(f, o->has_allocated, o->allocated_error);
    fputs(", \"reserved_error\": ", f);
    json_i64(f, o->has_reserved, o->reserved_error);
    fputs(", \"fragmentation\": ", f);
    if (o->has_allocated && o->has_reserved)
        json_num(f, o->fragmentation);
    else
        fputs("null", f);
    fprintf(f, ", \"fragmented\": %s}", o->fragmented ? "true" : "false");
}

static void json_remedy(FILE *f, const ml_remedy *x)
{
    fputs("{\"name\": ", f);
    ml_json_put_string(f, ml_remedy_name(x->kind));
    fputs(", \"flags\": ", f);
    ml_json_put_string(f, x->flags);
    fprintf(f, ", \"peak\": %llu, \"peak_total\": %llu, \"step_time_s\": ",
            (unsigned long long)x->peak, (unsigned long long)x->peak_total);
    json_known(f, x->step_time_s);
    fputs(", \"flops_ratio\": ", f);
    json_known(f, x->flops_ratio);
    fputs(", \"slowdown\": ", f);
    json_known(f, x->slowdown);
    fprintf(f, ", \"fits\": %s, \"in_focus\": %s, \"host_bytes\": %llu, \"changes\": ",
            !x->has_device ? "null" : x->fits ? "true" : "false", x->in_focus ? "true" : "false",
            (unsigned long long)x->host_bytes);
    ml_json_put_string(f, x->changes);
    fputc('}', f);
}

static int write_json(FILE *f, const ml_model *m, const ml_config *given, const ml_triage_result *r,
                      const ml_lengths *d, const ml_triage_request *req)
{
    const ml_config tc = triaged(given, r), *cfg = &tc;
    const ml_training *t = &cfg->training;
    const ml_summary *s = &r->current;
    char ck[64];
    ml_checkpoint_format(&t->checkpoint, ck, sizeof ck);
    fputs("{\"model\": ", f);
    ml_json_put_string(f, ml_model_name(m));
    fprintf(f, ",\n \"config\": {\"micro_batch\": %llu, \"seq_len\": %llu, \"grad_accum\": %llu, "
               "\"precision\": \"%s\", \"optimizer\": \"%s\", \"optimizer_impl\": \"%s\", "
               "\"checkpoint\": \"%s\", \"data_parallel\": %llu, \"zero\": %u, \"offload\": "
               "\"%s\", \"logits\": \"%s\", \"eval_batch\": %llu},\n",
            (unsigned long long)t->micro_batch, (unsigned long long)t->seq_len,
            (unsigned long long)t->grad_accum, ml_precision_name(t->precision),
            ml_optimizer_name(t->optimizer), ml_optimizer_impl_name(t->optimizer_impl), ck,
            (unsigned long long)t->data_parallel, t->zero, ml_offload_name(t->offload),
            ml_logits_name(t->logits), (unsigned long long)t->eval_batch);
    if (r->has_lengths) { /* the configuration above is its worst batch */
        fputs(" \"lengths\": ", f);
        ml_report_lengths_json_object(f, d, &req->batching, &r->lengths);
        fputs(",\n", f);
    }
    fprintf(f, " \"peak\": {\"phase\": \"%s\", \"step\": ", ml_phase_name(s->peak_phase));
    ml_json_put_string(f, s->peak_step);
    fputs(", \"breakdown\": {", f);
    for (int c = 0; c < ML_CAT_COUNT; c++)
        fprintf(f, "%s\"%s\": %llu", c ? ", " : "", ml_category_name((ml_category)c),
                (unsigned long long)s->peak_breakdown[c]);
    fprintf(f, "}, \"steady\": %llu, \"binding\": \"%s\", \"bytes\": %llu, \"peak_total\": %llu, "
               "\"fits\": %s, \"step_time_s\": ",
            (unsigned long long)s->peak, ml_peak_kind_name(s->binding),
            (unsigned long long)r->peak, (unsigned long long)s->peak_total,
            !s->has_device ? "null" : s->fits ? "true" : "false");
    json_known(f, r->step_time_s);
    fprintf(f, ", \"flops_total\": ");
    json_num(f, s->flops_total);
    fputs("},\n \"observed\": ", f);
    if (r->has_observed)
        json_observed(f, &r->observed);
    else
        fputs("null", f);
    fprintf(f, ",\n \"focus\": \"%s\",\n \"remedies\": [", ml_triage_phase_name(r->focus));
    for (size_t i = 0; i < r->count; i++) {
        fputs(i ? ",\n  " : "\n  ", f);
        json_remedy(f, &r->remedies[i]);
    }
    fputs("]}\n", f);
    return ferror(f) ? -1 : 0;
}

static int run(const ml_cli_opts *o, ml_model *m, const ml_config *cfg, ml_triage_request *req)
{
    ml_lengths *d;
    char a[32], b[32];
    uint64_t seen = req->reserved > req->allocated ? req->reserved : req->allocated;
    if (cfg->device.present && seen > cfg->device.memory) {
        ml_cli_errorf("--%s %s is above the device's %s: a run cannot hold more than its "
                      "device; give the failing run's device with --device",
                      req->reserved > req->allocated ? "reserved" : "allocated", B(seen, a),
                      B(cfg->device.memory, b));
        return ML_EXIT_BAD_INPUT;
    }
    int rc = ml_cli_triage_lengths(o, &d, &req->batching);
    if (rc)
        return rc;
    req->lengths = d;
    ml_triage_result *r = malloc(sizeof *r);
    if (!r) {
        ml_cli_errorf("out of memory");
        ml_lengths_destroy(d);
        return ML_EXIT_FAILURE;
    }
    ml_error e;
    ml_status st = ml_triage(m, cfg, req, r, &e);
    if (st) {
        rc = d ? ml_cli_lengths_failed(o, &e, st) : ml_cli_eval_failed(o, &e, st);
        free(r);
        ml_lengths_destroy(d);
        return rc;
    }
    ml_out out;
    rc = ml_out_open_report(&out, o->output, o->format == ML_FMT_TEXT, m, cfg);
    if (rc == 0) {
        int w = o->format == ML_FMT_JSON ? write_json(out.f, m, cfg, r, d, req)
                                         : write_text(out.f, m, cfg, r, o, d, req);
        rc = ml_out_close(&out, w == 0);
    }
    if (rc == 0)
        rc = r->current.has_device && !r->current.fits ? ML_EXIT_NO_FIT : ML_EXIT_OK;
    free(r);
    ml_lengths_destroy(d);
    return rc;
}

int ml_cmd_triage(int argc, char **argv)
{
    char **rest = malloc(sizeof *rest * ((size_t)argc + 1));
    if (!rest) {
        ml_cli_errorf("out of memory");
        return ML_EXIT_FAILURE;
    }
    triage_flags x = {0};
    ml_triage_request req;
    int n = 0, rc = 0;
    bool help = false;
    for (int i = 0; i < argc; i++)
        help |= !strcmp(argv[i], "-h") || !strcmp(argv[i], "--help");
    if (!help && ((rc = take_flags(argc, argv, rest, &n, &x)) || (rc = request_of(&x, &req)))) {
        free(rest);
        return rc;
    }
    ml_cli_opts o;
    ml_model *m = NULL;
    ml_config cfg;
    if (ml_cli_start(help ? argc : n, help ? argv : rest, "triage", usage, &o, &m, &cfg, &rc)) {
        rc = run(&o, m, &cfg, &req);
        ml_cli_free(m, &cfg);
    }
    free(rest);
    return rc;
}
