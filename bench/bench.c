/* memledger benchmark: prints figures, asserts nothing (timing targets live
 * here, never in unit tests). Run with `meson test -C build --benchmark -v`
 * or build/bench/memledger-bench. */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

#include "attacks.h"
#include "memledger/memledger.h"

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static ml_model *decoder(unsigned layers)
{
    char y[512];
    snprintf(y, sizeof y,
             "name: bench-%u\nmodel:\n  type: decoder\n  layers: %u\n  hidden: 2048\n"
             "  heads: 16\n  vocab: 50000\n  max_positions: 2048\n  dropout: 0.1\n"
             "training:\n  micro_batch: 4\n  seq_len: 2048\n  precision: amp-bf16\n"
             "device:\n  memory: 80GiB\n",
             layers, layers);
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_string(y, strlen(y), "bench.yaml", &m, &e) != ML_OK) {
        fprintf(stderr, "bench: %s\n", e.msg);
        return NULL;
    }
    return m;
}

/* One plan, through the prepared planner p or, p NULL, ml_ledger_evaluate
 * (which builds the chain each time). */
static ml_status plan(ml_planner *p, const ml_model *m, const ml_config *c, ml_ledger **l,
                      ml_error *e)
{
    return p ? ml_planner_evaluate(p, c, false, l, e) : ml_ledger_evaluate(m, c, false, l, e);
}

/* Plans per second, micro-batches 1 to 8 in turn, each plan on its own
 * (ml_ledger_evaluate) or through a prepared planner; with an allocator,
 * each plan also simulates PyTorch's caching allocator over three
 * iterations (docs/allocator.md). */
static void evals_per_second(unsigned layers, double seconds, ml_allocator alloc, bool prepared,
                             bool timed)
{
    ml_model *m = decoder(layers);
    ml_planner *p = NULL;
    if (!m || (prepared && ml_planner_create(m, &p, NULL) != ML_OK)) {
        ml_model_destroy(m);
        return;
    }
    ml_config c = ml_model_config(m);
    c.device.allocator = alloc;
    /* the simulation runs to the end only without a device to run out of
     * (the larger decoders do not fit 80 GiB at every micro-batch) */
    if (alloc != ML_ALLOCATOR_NONE)
        c.device.present = false;
    /* the per-op step time (docs/time.md) needs a named device's rates */
    if (timed && ml_device_preset_apply("h100-sxm", &c.device, NULL) != ML_OK)
        timed = false;
    unsigned long n = 0;
    double t0 = now(), t = t0;
    do {
        ml_ledger *l = NULL;
        c.training.micro_batch = 1 + n % 8;
        if (plan(p, m, &c, &l, NULL) != ML_OK)
            break;
        ml_ledger_destroy(l);
        n++;
        t = now();
    } while (t - t0 < seconds);
    printf("plan evaluations, %4u-block decoder%s%s%s: %10.0f per second (%lu in %.2f s, "
           "%.3f ms each)\n",
           layers, prepared ? ", prepared planner" : "", timed ? ", per-op step time (h100-sxm)" : "",
           alloc == ML_ALLOCATOR_CACHING ? ", caching allocator simulated (no device)" : "",
           (double)n / (t - t0), n, t - t0, (t - t0) / (double)(n ? n : 1) * 1e3);
    ml_planner_destroy(p);
    ml_model_destroy(m);
}

/* fit's search, each candidate planned without the allocator simulation
 * (alloc NONE) or with it (CACHING, the default). */
static void fit_time(unsigned layers, ml_allocator alloc)
{
    ml_model *m = decoder(layers);
    if (!m)
        return;
    ml_config c = ml_model_config(m);
    c.device.allocator = alloc;
    ml_fit_request req = ml_fit_request_defaults();
    req.auto_checkpoint = true;
    req.global_batch = 512;
    ml_fit_result r;
    double t0 = now();
    ml_status st = ml_fit(m, &c, &req, &r, NULL);
    double t = now() - t0;
    printf("fit --checkpoint auto --global-batch 512, %u blocks, --allocator %s: %.1f ms "
           "(%u evaluations, micro-batch %llu x %llu)%s\n",
           layers, ml_allocator_name(alloc), t * 1e3, r.evaluations, (unsigned long long)r.micro_batch,
           (unsigned long long)r.grad_accum, st ? " FAILED" : "");
    ml_model_destroy(m);
}

/* What `memledger plan` and `memledger compare` compute, side by side
 * without the allocator simulation and with it: a checkpointed plan on an
 * 80 GiB device (ZeRO-3 over 8) with the advice it gets (ml_checkpoint_advice), and the
 * seven policies of compare. Milliseconds per call, averaged over about
 * half a second each. */
static void decision_time(unsigned layers, ml_allocator alloc)
{
    ml_model *m = decoder(layers);
    if (!m)
        return;
    ml_config c = ml_model_config(m);
    c.device.allocator = alloc;
    c.training.micro_batch = 1;
    c.training.data_parallel = 8; /* ZeRO-3 over 8 devices: the 96-block one fits too */
    c.training.zero = 3;
    ml_parse_checkpoint("full", &c.training.checkpoint, NULL);
    double ms[2] = {0, 0};
    bool advised = false;
    for (int which = 0; which < 2; which++) {
        unsigned long n = 0;
        double t0 = now(), t = t0;
        do {
            if (which == 0) {
                ml_ledger *l = NULL;
                ml_advice a;
                if (ml_ledger_evaluate(m, &c, false, &l, NULL) != ML_OK ||
                    ml_checkpoint_advice(m, &c, ml_ledger_summary(l), &a, NULL) != ML_OK) {
                    ml_ledger_destroy(l);
                    break;
                }
                advised = a.cheaper_fits;
                ml_ledger_destroy(l);
            } else {
                ml_compare_row rows[ML_COMPARE_ROWS];
                size_t nr = 0;
                if (ml_compare(m, &c, rows, &nr, NULL) != ML_OK)
                    break;
            }
            n++;
            t = now();
        } while (t - t0 < 0.5);
        ms[which] = (t - t0) / (double)(n ? n : 1) * 1e3;
    }
    printf("%u blocks, checkpoint full, micro-batch 1, ZeRO-3 x 8, 80 GiB, --allocator %s: plan "
           "with its "
           "advice %.3f ms (%s), compare %.3f ms\n",
           layers, ml_allocator_name(alloc), ms[0], advised ? "advised" : "no advice", ms[1]);
    ml_model_destroy(m);
}

static void optimal_time(unsigned layers)
{
    ml_model *m = decoder(layers);
    if (!m)
        return;
    ml_config c = ml_model_config(m);
    c.device.allocator = ML_ALLOCATOR_NONE; /* the solver's own time */
    /* a budget between full's and none's peak, so the solver has work */
    ml_ledger *l = NULL;
    c.training.checkpoint.kind = ML_CKPT_NONE;
    ml_ledger_evaluate(m, &c, false, &l, NULL);
    uint64_t none = l ? ml_ledger_summary(l)->peak : 0;
    ml_ledger_destroy(l);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    ml_ledger_evaluate(m, &c, false, &l, NULL);
    uint64_t full = l ? ml_ledger_summary(l)->peak : 0;
    ml_ledger_destroy(l);
    c.device.memory = (none + full) / 2 + c.device.runtime_reserve;
    c.device.budget = 0;
    c.training.checkpoint.kind = ML_CKPT_OPTIMAL;
    int reps = layers >= 1000 ? 1 : 5;
    /* the process's high-water mark so far (ru_maxrss, KiB on Linux): the
     * lines run in ascending size, so a rise is this line's; and the CPU
     * time, which a busy machine inflates less than the wall clock */
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    long rss0 = ru.ru_maxrss;
    double cpu0 = (double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                  (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6;
    double t0 = now();
    bool fits = false;
    double recompute = 0;
    for (int i = 0; i < reps; i++) {
        if (ml_ledger_evaluate(m, &c, false, &l, NULL) != ML_OK)
            break;
        fits = ml_ledger_summary(l)->fits;
        recompute = ml_ledger_summary(l)->flops_recompute;
        ml_ledger_destroy(l);
    }
    double t = (now() - t0) / reps;
    getrusage(RUSAGE_SELF, &ru);
    double cpu = ((double)(ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) +
                  (double)(ru.ru_utime.tv_usec + ru.ru_stime.tv_usec) * 1e-6 - cpu0) /
                 reps;
    printf("checkpoint optimal, %5u blocks: %8.2f ms per plan, %8.2f ms CPU (fits: %s; "
           "recompute %.4g FLOP; peak RSS %.1f MiB, %.1f MiB before)\n",
           layers, t * 1e3, cpu * 1e3, fits ? "yes" : "no", recompute,
           (double)ru.ru_maxrss / 1024, (double)rss0 / 1024);
    ml_model_destroy(m);
}

/* The comparison grid (bench/vs-llm-analysis.py): micro-batch 1..8 x
 * sequence 256, 512, 1024 x no recompute or full, each configuration a
 * whole plan, through a prepared planner (prepared) or ml_ledger_evaluate;
 * prints the configurations per second. */
static int grid_with(const ml_model *m, const char *path, double seconds, bool prepared)
{
    ml_planner *p = NULL;
    ml_error e;
    if (prepared && ml_planner_create(m, &p, &e) != ML_OK)
        return 1;
    ml_config c = ml_model_config(m);
    /* the allocated view, as llm-analysis's figures are */
    c.device.allocator = ML_ALLOCATOR_NONE;
    /* one micro-batch a step, as bench/vs-llm-analysis.py asks of
     * llm-analysis (gradient_accumulation_steps=1), whatever the preset's */
    c.training.grad_accum = 1;
    static const uint64_t seqs[] = {256, 512, 1024};
    unsigned long n = 0;
    double t0 = now(), t = t0;
    do {
        for (uint64_t b = 1; b <= 8; b++)
            for (size_t s = 0; s < 3; s++)
                for (int ck = 0; ck < 2; ck++) {
                    c.training.micro_batch = b;
                    c.training.seq_len = seqs[s];
                    c.training.checkpoint.kind = ck ? ML_CKPT_FULL : ML_CKPT_NONE;
                    ml_ledger *l = NULL;
                    if (plan(p, m, &c, &l, &e) != ML_OK) {
                        fprintf(stderr, "bench: %s\n", e.msg);
                        ml_planner_destroy(p);
                        return 1;
                    }
                    ml_ledger_destroy(l);
                    n++;
                }
        t = now();
    } while (t - t0 < seconds);
    printf("grid %s, %s: %.0f configurations per second (%.2f us each, %lu in %.2f s)\n", path,
           prepared ? "prepared planner" : "each on its own", (double)n / (t - t0),
           (t - t0) / (double)n * 1e6, n, t - t0);
    ml_planner_destroy(p);
    return 0;
}

static int grid(const char *path, double seconds, bool prepared_only)
{
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_file(path, &m, &e) != ML_OK) {
        fprintf(stderr, "bench: %s:%u:%u: %s\n", e.path, e.line, e.col, e.msg);
        return 1;
    }
    int rc = grid_with(m, path, seconds, true) ||
             (!prepared_only && grid_with(m, path, seconds, false));
    ml_model_destroy(m);
    return rc;
}

/* The layout search over gpus devices (8 a node) of H100s (NVLink 450
 * GB/s, 50 GB/s a device between nodes) for the Hugging Face config at
 * path at 4,096 tokens, bf16 with fp32 master weights, the caching
 * allocator: candidates searched against the time, one core (docs/search.md). */
static void search_time(const char *path, uint64_t gpus, uint64_t global_batch, bool exhaustive)
{
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf(path, NULL, &m, &e) != ML_OK) {
        fprintf(stderr, "bench: %s\n", e.msg);
        return;
    }
    ml_config c = ml_model_config(m);
    c.training.seq_len = 4096;
    c.training.precision = ML_PREC_BF16_MASTER;
    if (ml_device_preset_apply("h100", &c.device, &e) != ML_OK) {
        fprintf(stderr, "bench: %s\n", e.msg);
        ml_model_destroy(m);
        return;
    }
    c.device.interconnect_gbps = 450;
    c.device.allocator = ML_ALLOCATOR_CACHING;
    ml_layout_request req = ml_layout_request_defaults();
    req.gpus = gpus;
    req.global_batch = global_batch;
    req.network_gbps = 50;
    req.exhaustive = exhaustive;
    ml_layout_result *r = malloc(sizeof *r);
    if (!r) {
        ml_model_destroy(m);
        return;
    }
    double t0 = now();
    ml_status st = ml_layout_search(m, &c, &req, r, &e);
    double t = now() - t0;
    printf("fit --gpus %llu --global-batch %llu, %s%s: %llu candidates in %.2f s (%.0f per "
           "second; %llu plans, %llu passed over)%s\n",
           (unsigned long long)gpus, (unsigned long long)global_batch, ml_model_name(m),
           exhaustive ? " --exhaustive" : "", (unsigned long long)r->candidates, t,
           (double)r->candidates / t, (unsigned long long)r->evaluations,
           (unsigned long long)r->passed_over, st ? " FAILED" : "");
    free(r);
    ml_model_destroy(m);
}

int main(int argc, char **argv)
{
#ifdef __GLIBC__
    /* glibc's mmap threshold moves with the sizes the process frees, so
     * whether a plan's arrays come from fresh (page-faulting) mappings
     * depends on the plans before it and on struct sizes: pinned, the
     * figures measure the planner (about 10x apart for 1000 blocks) */
    mallopt(M_MMAP_THRESHOLD, 32 << 20);
    mallopt(M_TRIM_THRESHOLD, 64 << 20);
#endif
    /* --search CONFIG.json: the layout search of a mixture of experts over
     * 120 and 240 devices, pruned and exhaustive */
    if (argc == 3 && !strcmp(argv[1], "--search")) {
        search_time(argv[2], 120, 1920, false);
        search_time(argv[2], 240, 3840, false);
        search_time(argv[2], 240, 3840, true);
        return 0;
    }
    /* --grid MODEL [prepared]: the grid through a prepared planner and each
     * plan on its own, or the first only (to profile it) */
    if ((argc == 3 || (argc == 4 && !strcmp(argv[3], "prepared"))) && !strcmp(argv[1], "--grid"))
        return grid(argv[2], 2.0, argc == 4);
    /* --caching BLOCKS: only the plans with the caching allocator
     * simulated, of a decoder that deep for five seconds (to profile them) */
    if (argc == 3 && !strcmp(argv[1], "--caching")) {
        evals_per_second((unsigned)strtoul(argv[2], NULL, 10), 5.0, ML_ALLOCATOR_CACHING, true,
                         false);
        return 0;
    }
    double secs = argc > 1 && strcmp(argv[1], "--plans") ? 2.0 : 1.0;
    /* --attacks [trace|fit]: only the inputs built to cost superlinear time
     * (bench/attacks.h), or only one of them;
     * --write-collisions PATH N: the colliding trace, for the fuzz corpus */
    if (argc > 3 && !strcmp(argv[1], "--write-collisions"))
        return bench_write_collision_trace(argv[2], strtoul(argv[3], NULL, 10)) ? 1 : 0;
    bool attacks_only = argc > 1 && !strcmp(argv[1], "--attacks");
    /* --plans: only the plan evaluations and the checkpoint solver */
    bool plans_only = argc > 1 && !strcmp(argv[1], "--plans");
    const char *which = attacks_only && argc > 2 ? argv[2] : "";
#ifdef __GLIBC__
    printf("(glibc malloc: mmap and trim thresholds pinned at 32 and 64 MiB)\n");
#endif
    for (size_t n = 62500; n <= 250000 && strcmp(which, "fit") && !plans_only; n *= 2) {
        bench_trace_collisions(n, false);
        bench_trace_collisions(n, true);
    }
    for (unsigned n = 6250; n <= 50000 && strcmp(which, "trace") && !plans_only; n *= 2)
        bench_sequential_fit(n);
    if (attacks_only)
        return 0;
    evals_per_second(32, secs, ML_ALLOCATOR_NONE, false, false);
    evals_per_second(32, secs, ML_ALLOCATOR_NONE, true, false);
    evals_per_second(32, secs, ML_ALLOCATOR_NONE, false, true);
    evals_per_second(32, secs, ML_ALLOCATOR_NONE, true, true);
    evals_per_second(32, secs, ML_ALLOCATOR_CACHING, false, false);
    evals_per_second(32, secs, ML_ALLOCATOR_CACHING, true, false);
    evals_per_second(96, secs, ML_ALLOCATOR_NONE, false, false);
    evals_per_second(96, secs, ML_ALLOCATOR_NONE, true, false);
    evals_per_second(96, secs, ML_ALLOCATOR_CACHING, false, false);
    evals_per_second(1000, secs, ML_ALLOCATOR_NONE, false, false);
    evals_per_second(1000, secs, ML_ALLOCATOR_NONE, true, false);
    fit_time(32, ML_ALLOCATOR_NONE);
    fit_time(32, ML_ALLOCATOR_CACHING);
    decision_time(32, ML_ALLOCATOR_NONE);
    decision_time(32, ML_ALLOCATOR_CACHING);
    decision_time(96, ML_ALLOCATOR_NONE);
    decision_time(96, ML_ALLOCATOR_CACHING);
    optimal_time(32);
    optimal_time(96);
    optimal_time(1000);
    optimal_time(3000);
    optimal_time(10000);
    return 0;
}
