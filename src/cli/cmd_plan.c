/* memledger plan MODEL.yaml: the ledger of one training iteration. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "report/report_internal.h"

/* --emit wrote settings that lack a part of the plan (docs/cli.md) */
enum { EXIT_EMIT_PARTIAL = 4 };

static const char *const usage[] = {
    "usage: memledger plan MODEL.yaml [options]\n"
    "       memledger plan --hf config.json [--training FILE.yaml] [options]\n"
    "\n"
    "Plans one steady training iteration: model states, saved activations per block,\n"
    "the peak and each phase's, FLOPs, time and the verdict.\n"
    "\n"
    "Training (over the file's training: section)\n"
    "  --micro-batch N        samples per forward/backward\n"
    "  --seq-len N            tokens per sample\n"
    "  --grad-accum N         micro-batches per optimizer step\n"
    "  --precision P          fp32 | amp-bf16 | amp-fp16 | bf16-master | fp16-master | bf16\n"
    "  --optimizer O          sgd | sgd-momentum | adam | adamw | adafactor | adam-8bit | lion\n"
    "  --optimizer-impl I     for-loop | foreach | fused\n"
    "  --checkpoint C         none | full | every-K | sqrt | selective | optimal |\n"
    "                         \"[0, 3, 6]\" (blocks) | \"[0-3] [8]\" (segments, as optimal prints)\n"
    "  --data-parallel N      devices (replicas or shards; also --dp N)\n"
    "  --zero Z               0 | 1 | 2 | 3 (or fsdp): ZeRO stage\n"
    "  --offload O            none | optimizer | params (params needs --zero 3)\n"
    "  --reduce-bucket-size N, --allgather-bucket-size N  (elements; 5e8)\n"
    "  --logits L             kept (default) | released (HF Trainer) | fused (Liger) |\n"
    "                         through-backward\n"
    "  --logits-chunk N       fused: tokens per chunk (default: Liger's rule)\n"
    "  --zero-grad Z          set_to_none (default) | zero: gradients kept and zeroed\n"
    "  --eval-batch N, --eval-seq-len N  an evaluation pass (no_grad): samples, tokens\n"
    "  --target-len N         encoder-decoder: decoder tokens (default: --seq-len)\n"
    "  --vision-tower V       multimodal: same | none | full | frozen\n"
    "  --expert-imbalance X   experts: the busiest one's share over an even one (>= 1)\n"
    "  --expert-capacity F    Megatron's expert capacity factor; --expert-pad: padded\n"
    "                         (--no-expert-pad, --no-overlap-grad-reduce: a file's off)\n"
    "Lengths (docs/lengths.md)\n"
    "  --lengths FILE|Q       sample lengths: a CSV, or p50=120,p99=480,max=512\n"
    "  --batching B           padded (default) | bucketed (--buckets K) | packed\n"
    "  --max-tokens N         a token budget per batch: micro-batch floor(N / longest)\n"
    "Device (over the file's device: section)\n"
    "  --device NAME|SIZE     h100-sxm, l4, ... ('memledger devices') or memory (8GiB)\n"
    "  --budget SIZE          line for the reserved peak (default memory - reserve)\n"
    "  --runtime-reserve SIZE CUDA context, libraries (default 512MiB)\n"
    "  --peak-tflops X        dense peak at the compute dtype; --efficiency X 1e-6..1\n"
    "  --interconnect GBps, --pcie GBps  time communication, offload (else untimed)\n"
    "  --fragmentation X      reserved-over-peak allowance, 0..1\n"
    "  --allocator A          caching (default) | expandable | none (allocated only)\n"
    "  --max-split-size MB    the simulation's max_split_size_mb (whole MiB, >= 20)\n"
    "  --blas-workspace SIZE  cuBLAS's workspace per handle (default 8.125MiB; 32MiB on\n"
    "                         the Hopper presets, 128MiB on mi300x; 0: none)\n"
    "  --allocator-start TRACE  the cache the job finds: the state TRACE ends in\n",
    /* a second literal: C99 promises 4,095 bytes a string literal */
    "Parallel (docs/parallel.md): one rank's figures\n"
    "  --tp, --pp, --cp, --ep, --etp N  tensor, stages, context, expert, expert width\n"
    "  --sp, --no-sp          sequence parallelism (default: on when --tp > 1)\n"
    "  --pp-schedule S        1f1b (default) | gpipe; --vpp V: interleaved\n"
    "  --micro-batches M      micro-batches a step (= --grad-accum)\n"
    "  --pp-layers L          layers a stage: 7,9,9,7 (default even)\n"
    "  --parallel L           the layout at once: tp2.pp4.dp8 (--ranks all: each stage)\n"
    "  --engine E             eager | megatron (with --dist-optimizer: its sharding)\n"
    "Model\n"
    "  --hf config.json       a Hugging Face config as the model, or its model's folder\n"
    "                         (families: docs/hf.md)\n"
    "  --attention A          eager | sdpa | flash: overrides the model's attention\n"
    "  --training FILE.yaml   training: and device: sections to go with --hf\n"
    "  --calib PROFILE.yaml   a calibration profile's measured c and throughput\n"
    "Output\n"
    "  --format text|json     (default text)\n"
    "  -o FILE                write the report to FILE (atomically) instead of stdout\n"
    "  --emit TARGET          deepspeed | hf-trainer | torch | megatron | torchtitan:\n"
    "                         this plan's settings instead of the report (docs/hf.md)\n"
    "\n"
    "Exit status: 0 fits (--lengths: every batch), 1 does not fit, 2 bad input or\n"
    "usage, 3 output not written, 4 --emit's settings lack a part (on stderr).\n", NULL};

/* --emit with a plan that does not fit the device: settings that would run
 * out of memory are not written (an -o file stays as it was); the verdict
 * goes to stderr and the caller exits 1, as fit does with nothing that fits
 * (docs/cli.md). True when it does not fit. */
static bool emit_no_fit(const char *target, const ml_config *cfg, const ml_summary *s)
{
    if (!s->has_device || s->fits)
        return false;
    const uint64_t held = ml_summary_budget_figure(s);
    char a[32], b[32], c[32], d[32], why[96];
    ml_format_bytes(held, a, sizeof a);
    ml_format_bytes(s->budget, b, sizeof b);
    ml_format_bytes(s->peak_total, c, sizeof c);
    ml_format_bytes(s->memory, d, sizeof d);
    if (s->reserved_oom && s->headroom == -1)
        snprintf(why, sizeof why, "the simulated caching allocator runs out of the device "
                                  "(its cache fragmented)");
    else {
        char o[32];
        ml_format_bytes((uint64_t)(-s->headroom), o, sizeof o);
        snprintf(why, sizeof why, "over by %s", o);
    }
    fprintf(stderr,
            "memledger: --emit %s: the plan does not fit, nothing written: %s %s against the "
            "budget %s, device total %s against %s: %s; 'memledger fit' finds a micro-batch "
            "that fits\n",
            target, ml__report_budget_holds(&cfg->device), a, b, c, d, why);
    return true;
}

int ml_cmd_plan(int argc, char **argv)
{
    ml_cli_opts o;
    ml_model *m = NULL;
    ml_config cfg;
    int rc;
    if (!ml_cli_start(argc, argv, "plan", usage, &o, &m, &cfg, &rc))
        return rc;
    ml_ledger *l = NULL;
    ml_error e;
    ml_status st = ml_ledger_evaluate(m, &cfg, false, &l, &e);
    if (st) {
        rc = ml_cli_eval_failed(&o, &e, st);
        ml_cli_free(m, &cfg);
        return rc;
    }
    if (o.lengths || o.batching || o.max_tokens || o.buckets) { /* docs/lengths.md */
        rc = ml_cli_plan_lengths(&o, m, &cfg, l);
        ml_ledger_destroy(l);
        ml_cli_free(m, &cfg);
        return rc;
    }
    /* --emit: a target that would run a different setup writes nothing (an
     * -o file stays as it was); one that cannot hold a part of the plan
     * writes the rest and says which part (docs/cli.md, exit status 4) */
    char why[4096];
    int emit = o.emit ? ml__report_emit_check(o.emit, m, &cfg, l, why, sizeof why) : ML_EMIT_EXACT;
    if (emit == ML_EMIT_REFUSED) {
        ml_cli_errorf("--emit %s: %s", o.emit, why);
        ml_ledger_destroy(l);
        ml_cli_free(m, &cfg);
        return ML_EXIT_BAD_INPUT;
    }
    if (o.emit && emit_no_fit(o.emit, &cfg, ml_ledger_summary(l))) {
        ml_ledger_destroy(l);
        ml_cli_free(m, &cfg);
        return ML_EXIT_NO_FIT;
    }
    /* a checkpoint policy whose freed memory is not needed: said with the
     * report (docs/choosing.md, "When recompute is not worth it") */
    ml_advice advice;
    memset(&advice, 0, sizeof advice);
    if (!o.emit && (st = ml_checkpoint_advice(m, &cfg, ml_ledger_summary(l), &advice, &e))) {
        rc = ml_cli_eval_failed(&o, &e, st);
        ml_ledger_destroy(l);
        ml_cli_free(m, &cfg);
        return rc;
    }
    ml_out out;
    rc = ml_out_open_report(&out, o.output, !o.emit && o.format == ML_FMT_TEXT, m, &cfg);
    if (rc == 0) {
        int w = o.emit                  ? ml_report_emit(out.f, o.emit, m, &cfg, l)
                : o.format == ML_FMT_JSON ? ml_report_json_advice(out.f, m, &cfg, l, &advice)
                : o.ranks                 ? ml__report_text_all_ranks(out.f, m, &cfg, l)
                                          : ml_report_text(out.f, m, &cfg, l);
        if (w == 0 && !o.emit && o.format == ML_FMT_TEXT)
            w = ml_report_advice_text(out.f, ml_ledger_summary(l), &advice);
        rc = ml_out_close(&out, w == 0);
    }
    if (rc == 0) {
        const ml_summary *s = ml_ledger_summary(l);
        rc = s->has_device && !s->fits ? ML_EXIT_NO_FIT : ML_EXIT_OK;
        if (emit == ML_EMIT_PARTIAL) {
            fprintf(stderr, "memledger: note: --emit %s: not in these settings: ", o.emit);
            ml_cli_put_safe(stderr, why, strlen(why), false);
            fputc('\n', stderr);
            if (rc == ML_EXIT_OK)
                rc = EXIT_EMIT_PARTIAL;
        }
    }
    ml_ledger_destroy(l);
    ml_cli_free(m, &cfg);
    return rc;
}
