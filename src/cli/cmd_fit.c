/* memledger fit MODEL.yaml: the largest micro-batch and the accumulation. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/decimal.h"
#include "cli/cli.h"
#include "report/report_internal.h"

/* --emit wrote settings that lack a part of the plan (docs/cli.md) */
enum { EXIT_EMIT_PARTIAL = 4 };

static const char *const usage[] = {
    "usage: memledger fit MODEL.yaml [options]\n"
    "\n"
    "Finds the largest micro-batch whose training peak fits the device, and the\n"
    "gradient-accumulation steps that reach a target effective batch\n"
    "(effective = micro-batch x accumulation x data-parallel devices). The search is\n"
    "exact on the ledger (bisection), not an extrapolation.\n"
    "\n"
    "  --device NAME|SIZE     a named device or its memory (or a device: section)\n"
    "  --budget SIZE          line for the reserved peak (the allocator peak with\n"
    "                         --allocator none; default memory - reserve)\n"
    "  --global-batch N       target effective batch\n"
    "  --data-parallel N      devices (default 1)\n"
    "  --max-micro-batch N    upper end of the search (default 65536)\n"
    "  --checkpoint C|auto    a policy, or auto: the cheapest (recompute FLOPs) that\n"
    "                         admits the largest useful micro-batch\n"
    "  --lengths FILE|Q       sample lengths (see 'memledger plan --help'), with\n"
    "  --max-tokens auto      the largest token budget per batch whose worst batch fits,\n"
    "  or --batching bucketed the largest micro-batch per length bucket (--buckets K)\n"
    "  --format text|json     (default text)\n"
    "  --emit TARGET          settings for the chosen point: deepspeed, hf-trainer, torch,\n"
    "                         megatron, torchtitan (the last two also the best layout of\n"
    "                         --gpus)\n"
    "  -o FILE                write to FILE (atomically) instead of stdout\n"
    "  --gpus N               search the layouts of N devices instead: tensor x context\n"
    "                         x pipeline x data parallelism, micro-batch, checkpoint (none,\n"
    "                         selective, full), ranked by step time (docs/search.md);\n"
    "                         needs --global-batch; --gpus-per-node G (default 8),\n"
    "                         --interconnect GBps within a node, --network GBps between\n"
    "                         nodes; --tp N, --cp N, --ep N, --etp N, --pp N, --vpp V,\n"
    "                         --micro-batch B, --checkpoint C, --zero Z, --dist-optimizer\n"
    "                         pin their part; --exhaustive plans every point (else one\n"
    "                         whose bound is slower than the table's last row is passed\n"
    "                         over: the same table, sooner)\n"
    "  and every 'memledger plan' option (--seq-len, --precision, --zero, ...)\n"
    "\n"
    "Exit status: 0 a micro-batch fits, 1 even micro-batch 1 does not fit,\n"
    "2 bad input or usage (or --emit refused), 3 output could not be written,\n"
    "4 --emit wrote settings that lack a part of the plan (named on stderr).\n", NULL};

/* The search's request from the flags; 0 or an exit status. */
static int fit_request(const ml_cli_opts *o, ml_fit_request *req)
{
    *req = ml_fit_request_defaults();
    req->auto_checkpoint = o->auto_checkpoint;
    int rc = 0;
    if (o->global_batch &&
        (rc = ml_cli_whole("--global-batch", o->global_batch, 1, 1ull << 40, &req->global_batch)))
        return rc;
    /* the global batch sets the accumulation steps: one given too would be
     * overridden, so it is refused, never ignored */
    if (o->global_batch && (o->grad_accum || o->micro_batches)) {
        const char *steps = o->grad_accum ? "--grad-accum" : "--micro-batches";
        ml_cli_errorf("%s: fit --global-batch derives the accumulation steps from the micro-batch "
                      "it finds: drop %s (or fit without --global-batch at that accumulation)",
                      steps, steps);
        return ML_EXIT_BAD_INPUT;
    }
    if (o->max_micro_batch && (rc = ml_cli_whole("--max-micro-batch", o->max_micro_batch, 1,
                                                 1u << 24, &req->max_micro_batch)))
        return rc;
    return 0;
}

/* After the report: why nothing fits, --emit's notes; the exit status. */
static int fit_status(const ml_cli_opts *o, const ml_fit_result *r, int emit, const char *why)
{
    if (!r->fits) {
        fputs("memledger: ", stderr);
        ml_cli_put_safe(stderr, r->note, strlen(r->note), false);
        fputc('\n', stderr);
    }
    int rc = r->fits ? ML_EXIT_OK : ML_EXIT_NO_FIT;
    if (emit == ML_EMIT_PARTIAL) {
        fprintf(stderr, "memledger: note: --emit %s: not in these settings: ", o->emit);
        ml_cli_put_safe(stderr, why, strlen(why), false);
        fputc('\n', stderr);
        if (rc == ML_EXIT_OK)
            rc = EXIT_EMIT_PARTIAL;
    }
    return rc;
}

/* The search's progress on a terminal's stderr once it has run a second:
 * layouts done, in all, and the fastest so far (one line, redrawn). */
typedef struct {
    struct timespec start;
    bool shown;
} progress_line;

static double since(const struct timespec *t0)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)(t.tv_sec - t0->tv_sec) + 1e-9 * (double)(t.tv_nsec - t0->tv_nsec);
}

static void progress(void *ctx, uint64_t done, uint64_t total, const ml_layout_row *best)
{
    progress_line *p = ctx;
    if (!p->shown && since(&p->start) < 1.0)
        return;
    p->shown = true;
    fprintf(stderr, "\rsearching: %llu of %llu layouts", (unsigned long long)done,
            (unsigned long long)total);
    if (best && best->step_s > 0) {
        char name[80];
        ml__report_layout_name(best, name, sizeof name);
        fprintf(stderr, ", best so far %s at %.4g s a step", name, best->step_s);
    }
    fputs("\033[K", stderr);
    fflush(stderr);
}

/* The best layout's settings (--gpus with --emit megatron or torchtitan): its plan, then
 * the arguments; the exit status as plan --emit's. */
static int emit_layout(const ml_cli_opts *o, const ml_model *m, const ml_config *cfg,
                       const ml_layout_result *r)
{
    /* the fastest layout the target runs: a row it refuses (torchtitan's
     * fp32 master weights need an FSDP shard group) gives way to the next */
    ml_config c;
    ml_ledger *l = NULL;
    ml_error e;
    char why[4096], first_why[4096] = "", skipped[64] = "";
    int level = ML_EMIT_REFUSED;
    for (size_t i = 0; i < r->nrows && level == ML_EMIT_REFUSED; i++) {
        ml_ledger_destroy(l);
        l = NULL;
        c = ml_layout_config(cfg, &r->rows[i]);
        ml_status st = ml_ledger_evaluate(m, &c, false, &l, &e);
        if (st)
            return ml_cli_eval_failed(o, &e, st);
        level = ml__report_emit_check(o->emit, m, &c, l, why, sizeof why);
        if (level == ML_EMIT_REFUSED && i == 0) {
            snprintf(first_why, sizeof first_why, "%s", why);
            ml__report_layout_name(&r->rows[0], skipped, sizeof skipped);
        }
        if (level != ML_EMIT_REFUSED && i > 0) {
            char name[64];
            ml__report_layout_name(&r->rows[i], name, sizeof name);
            fprintf(stderr, "memledger: note: --emit %s: the fastest layout, %s, is not one it "
                            "runs (",
                    o->emit, skipped);
            ml_cli_put_safe(stderr, first_why, strlen(first_why), false);
            fprintf(stderr, "); written: %s, the fastest that is\n", name);
        }
    }
    int rc = ML_EXIT_OK;
    if (level == ML_EMIT_REFUSED) {
        ml_cli_errorf("--emit %s: %s", o->emit, first_why);
        rc = ML_EXIT_BAD_INPUT;
    } else {
        ml_out out;
        rc = ml_out_open(&out, o->output);
        if (rc == 0)
            rc = ml_out_close(&out, ml_report_emit(out.f, o->emit, m, &c, l) == 0);
        if (rc == 0 && level == ML_EMIT_PARTIAL) {
            fprintf(stderr, "memledger: note: --emit %s: not in these settings: ", o->emit);
            ml_cli_put_safe(stderr, why, strlen(why), false);
            fputc('\n', stderr);
            rc = EXIT_EMIT_PARTIAL;
        }
    }
    ml_ledger_destroy(l);
    return rc;
}

/* --emit torchtitan: the search keeps to what torchtitan runs */
static bool emits_torchtitan(const ml_cli_opts *o)
{
    return o->emit && !strcmp(o->emit, "torchtitan");
}

/* fit --gpus's request from the flags; 0 or the exit status of the first
 * bad one (its message printed). */
static int layout_request(const ml_cli_opts *o, const ml_config *cfg, ml_layout_request *out)
{
    ml_layout_request req = ml_layout_request_defaults();
    int rc = ml_cli_whole("--gpus", o->gpus, 1, 1u << 20, &req.gpus);
    if (!rc && o->gpus_per_node)
        rc = ml_cli_whole("--gpus-per-node", o->gpus_per_node, 1, 1024, &req.gpus_per_node);
    if (!rc && o->global_batch)
        rc = ml_cli_whole("--global-batch", o->global_batch, 1, 1ull << 40, &req.global_batch);
    if (!rc && o->network) {
        req.network_gbps = 0;
        if (!ml__decimal(o->network, &req.network_gbps) || !(req.network_gbps >= 1e-6) ||
            req.network_gbps > 1e6) {
            ml_cli_errorf("--network: '%s' is not a number between 1e-06 and 1e+06 (GB/s)",
                          o->network);
            rc = ML_EXIT_BAD_INPUT;
        }
    }
    if (!rc && (o->max_micro_batch || o->parallel || o->data_parallel || o->grad_accum ||
                o->micro_batches || o->pp_schedule || o->pp_layers || o->auto_checkpoint)) {
        ml_cli_errorf("--gpus %s: the search chooses the layout (its stages' layers too), the "
                      "micro-batches a step and the data-parallel size from the global "
                      "batch: drop --pp-schedule, --pp-layers, --parallel, --data-parallel, "
                      "--grad-accum, --micro-batches, --checkpoint auto and --max-micro-batch "
                      "(--tp, --cp, --ep, --etp, --pp, --vpp, --micro-batch, --checkpoint and "
                      "--zero or --dist-optimizer pin their part)",
                      o->gpus);
        rc = ML_EXIT_BAD_INPUT;
    }
    /* the parts the user pins, as the flags set them */
    req.tp = o->tp ? cfg->training.tensor_parallel : 0;
    req.pp = o->pp ? cfg->training.pipeline_parallel : 0;
    req.micro_batch = o->micro_batch ? cfg->training.micro_batch : 0;
    req.vpp = o->vpp ? cfg->training.virtual_stages : 0;
    req.cp = o->cp ? cfg->training.context_parallel : 0;
    req.ep = o->ep ? cfg->training.expert_parallel : 0;
    req.pin_checkpoint = o->checkpoint != NULL;
    /* torchtitan recomputes whole layers, never the attention core alone */
    req.no_selective = emits_torchtitan(o);
    req.exhaustive = o->exhaustive;
    req.checkpoint = cfg->training.checkpoint;
    /* the sharding as given (--zero, --dist-optimizer); for Megatron-LM's
     * arguments what it runs (ZeRO 0 or 1, written as its distributed
     * optimizer), and for torchtitan's config as configured (its FSDP is
     * written from the config's) */
    req.pin_sharding = o->zero || o->dist_optimizer ||
                       (emits_torchtitan(o) && cfg->training.engine != ML_ENGINE_MEGATRON);
    req.megatron_sharding = o->emit && !strcmp(o->emit, "megatron");
    req.fsdp_sharding = emits_torchtitan(o) && cfg->training.zero == 3 && !o->dist_optimizer;
    if (!rc && (o->lengths || o->batching || o->max_tokens || o->buckets || o->eval_batch)) {
        ml_cli_errorf("--gpus %s: the search plans the training step at --seq-len; length "
                      "distributions and an evaluation pass are not searched: drop --lengths, "
                      "--batching, --max-tokens, --buckets and --eval-batch",
                      o->gpus);
        rc = ML_EXIT_BAD_INPUT;
    }
    if (!rc && o->network && ml_device_interconnect(&cfg->device) <= 0) {
        ml_cli_errorf("--network %s: the transfers inside a node need a bandwidth too: give "
                      "--interconnect GBps",
                      o->network);
        rc = ML_EXIT_BAD_INPUT;
    }
    if (!rc && o->emit && strcmp(o->emit, "megatron") && strcmp(o->emit, "torchtitan")) {
        ml_cli_errorf("--emit %s: the best layout's settings are Megatron-LM's or "
                      "torchtitan's (--emit megatron, --emit torchtitan); the other targets "
                      "run the whole model on each device",
                      o->emit);
        rc = ML_EXIT_BAD_INPUT;
    }
    *out = req;
    return rc;
}

/* fit --gpus N: the layout search; the exit status. */
static int fit_layouts(const ml_cli_opts *o, const ml_model *m, const ml_config *given)
{
    if (!o->gpus) {
        ml_cli_errorf("%s goes with --gpus N (the layout search)",
                      o->gpus_per_node ? "--gpus-per-node" : "--network");
        return ML_EXIT_BAD_INPUT;
    }
    /* torchtitan's settings: its default sharding, FSDP over every
     * data-parallel rank (ZeRO 3), unless --zero says otherwise */
    ml_config tt = *given;
    const ml_config *cfg = given;
    if (emits_torchtitan(o) && !o->zero && !o->dist_optimizer) {
        tt.training.zero = 3;
        cfg = &tt;
    }
    ml_layout_request req;
    int rc = layout_request(o, cfg, &req);
    if (rc)
        return rc;
    progress_line line = {.shown = false};
    clock_gettime(CLOCK_MONOTONIC, &line.start);
    if (isatty(fileno(stderr))) {
        req.progress = progress;
        req.progress_ctx = &line;
    }
    ml_layout_result r;
    ml_error e;
    ml_status st = ml_layout_search(m, cfg, &req, &r, &e);
    if (line.shown)
        fputc('\n', stderr);
    if (st)
        return ml_cli_eval_failed(o, &e, st);
    if (o->emit && !r.nrows) { /* nothing written: say why */
        fprintf(stderr, "memledger: --emit %s: nothing written: ", o->emit);
        ml_cli_put_safe(stderr, r.note, strlen(r.note), false);
        fputc('\n', stderr);
        return ML_EXIT_NO_FIT;
    }
    if (o->emit)
        return emit_layout(o, m, cfg, &r);
    ml_out out;
    rc = ml_out_open(&out, o->output);
    if (rc == 0) {
        int w = o->format == ML_FMT_JSON ? ml_report_layouts_json(out.f, m, &req, &r)
                                         : ml_report_layouts_text(out.f, m, cfg, &req, &r);
        rc = ml_out_close(&out, w == 0);
    }
    return rc ? rc : r.nrows ? ML_EXIT_OK : ML_EXIT_NO_FIT;
}

int ml_cmd_fit(int argc, char **argv)
{
    ml_cli_opts o;
    ml_model *m = NULL;
    ml_config cfg;
    int rc;
    if (!ml_cli_start(argc, argv, "fit", usage, &o, &m, &cfg, &rc))
        return rc;
    if (o.gpus || o.gpus_per_node || o.network) { /* the layout search (docs/search.md) */
        rc = fit_layouts(&o, m, &cfg);
        goto out;
    }
    if (o.lengths || o.batching || o.max_tokens || o.buckets) { /* docs/lengths.md */
        rc = ml_cli_fit_lengths(&o, m, &cfg);
        goto out;
    }
    ml_fit_request req;
    if ((rc = fit_request(&o, &req)))
        goto out;
    ml_fit_result r;
    ml_error e;
    ml_status st = ml_fit(m, &cfg, &req, &r, &e);
    if (st) {
        rc = ml_cli_eval_failed(&o, &e, st);
        goto out;
    }
    ml_cli_decorate(&o, r.note, sizeof r.note);
    /* --emit: the settings of the chosen point */
    ml_ledger *chosen = NULL;
    ml_config cc = cfg;
    if (o.emit && r.fits) {
        cc.training.micro_batch = r.micro_batch;
        cc.training.grad_accum = r.grad_accum;
        cc.training.checkpoint = r.checkpoint;
        if ((st = ml_ledger_evaluate(m, &cc, false, &chosen, &e))) {
            ml_cli_print_error(&e);
            rc = ML_EXIT_FAILURE;
            goto out;
        }
    }
    /* --emit for the chosen point: refused (nothing written, exit 2) or
     * partial (written, exit 4) as for 'memledger plan' (docs/cli.md) */
    char why[4096];
    int emit = chosen ? ml__report_emit_check(o.emit, m, &cc, chosen, why, sizeof why)
                      : ML_EMIT_EXACT;
    if (emit == ML_EMIT_REFUSED) {
        ml_cli_errorf("--emit %s: %s", o.emit, why);
        ml_ledger_destroy(chosen);
        rc = ML_EXIT_BAD_INPUT;
        goto out;
    }
    /* --emit with nothing that fits: no settings to write, and the prose
     * report is not what the reader of -o (a config file) expects */
    if (o.emit && !r.fits) {
        fprintf(stderr, "memledger: --emit %s: nothing fits, nothing written: ", o.emit);
        ml_cli_put_safe(stderr, r.note, strlen(r.note), false);
        fputc('\n', stderr);
        rc = ML_EXIT_NO_FIT;
        goto out;
    }
    ml_out out;
    rc = ml_out_open_report(&out, o.output, !chosen && o.format == ML_FMT_TEXT, m, &cfg);
    if (rc == 0) {
        int w = chosen                  ? ml_report_emit(out.f, o.emit, m, &cc, chosen)
                : o.format == ML_FMT_JSON ? ml_report_fit_json(out.f, m, &req, &r)
                                          : ml_report_fit_text(out.f, m, &cfg, &req, &r);
        rc = ml_out_close(&out, w == 0);
    }
    ml_ledger_destroy(chosen);
    if (rc == 0)
        rc = fit_status(&o, &r, emit, why);
out:
    ml_cli_free(m, &cfg);
    return rc;
}
