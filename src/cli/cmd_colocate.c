/* memledger colocate JOB JOB... --device SIZE: training and inference
 * jobs sharing one device, each in its own process (ml_colocate_jobs,
 * docs/colocate.md). */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "ledger/levels.h"

static const char *const usage[] = {
    "usage: memledger colocate --device NAME|SIZE [options] JOB JOB [JOB...]\n"
    "\n"
    "Training and inference jobs sharing one device, each in its own process with its\n"
    "own runtime reserve. A JOB is one argument: a model file and, in the same quotes,\n"
    "its own 'memledger plan' options, e.g. \"models/gpt2-small.yaml --micro-batch 2\".\n"
    "With --inference in its quotes the job is inference: its weights and one no-grad\n"
    "forward at its --micro-batch and --seq-len, held throughout; a decoder's\n"
    "--generate N adds the KV cache of seq-len + N tokens, e.g.\n"
    "\"models/llama-2-7b.yaml --inference --micro-batch 8 --seq-len 512 --generate 128\".\n"
    "Prints each job's device total and step time, then:\n"
    "  unsynchronised: the peaks summed (some phase lines them up); the verdict\n"
    "  started together: the highest sum when the iterations start at once\n"
    "  independent phases (two jobs): the share of time the sum is over the device\n"
    "The last two need every job's step time (a named device, or --peak-tflops in\n"
    "the job's options). A job's checkpoint may not be optimal (it would plan\n"
    "against the whole shared device).\n"
    "\n"
    "  --device NAME|SIZE     the shared device: a preset (memledger devices; its peaks\n"
    "                         time each job) or a memory size (required)\n"
    "  --budget SIZE          line for the jobs' allocator peaks summed (default memory\n"
    "                         less the jobs' runtime reserves)\n"
    "  --format text|json|svg (default text; svg: the jobs stacked, started together)\n"
    "  -o FILE                write to FILE (atomically) instead of stdout\n"
    "\n"
    "Exit status: 0 the jobs fit at every phase (device and budget), 1 they do not,\n"
    "2 bad input or usage,\n"
    "3 output could not be written.\n", NULL};

#define MAX_JOBS 8
#define MAX_TOKENS 64

typedef struct {
    const char *spec;
    char buf[4096];
    char *tok[MAX_TOKENS + 1];
    int ntok;
    ml_cli_opts o;
    ml_model *m;
    ml_config cfg;
    ml_ledger *l;     /* a training job's, or */
    bool inference;   /* an inference job (--inference) */
    uint64_t generate; /* its --generate N; 0 without */
    ml_inference inf;
} job;

static int bad(const char *fmt, const char *arg)
{
    char msg[4300];
    snprintf(msg, sizeof msg, fmt, arg);
    ml_cli_errorf("%s", msg);
    fputs("Try 'memledger colocate --help'.\n", stderr);
    return ML_EXIT_BAD_INPUT;
}

/* bad() for a job: "job 'SPEC': " and the message. */
static int job_bad(const job *j, const char *fmt, ...)
{
    char msg[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    ml_cli_errorf("job '%s': %s", j->spec, msg);
    fputs("Try 'memledger colocate --help'.\n", stderr);
    return ML_EXIT_BAD_INPUT;
}

/* Splits a job's argument at blanks; '...' and "..." quote. */
static int split(job *j)
{
    if (strlen(j->spec) >= sizeof j->buf)
        return bad("a job is longer than 4095 bytes: '%.60s...'", j->spec);
    const char *s = j->spec;
    char *w = j->buf;
    j->ntok = 0;
    while (*s) {
        while (*s == ' ' || *s == '\t' || *s == '\n' || *s == '\r')
            s++;
        if (!*s)
            break;
        if (j->ntok == MAX_TOKENS)
            return bad("a job has more than 64 words: '%.60s...'", j->spec);
        j->tok[j->ntok++] = w;
        char q = 0;
        for (; *s && (q || !strchr(" \t\n\r", *s)); s++) {
            if (!q && (*s == '\'' || *s == '"'))
                q = *s;
            else if (q && *s == q)
                q = 0;
            else
                *w++ = *s;
        }
        if (q)
            return bad("a job has an unterminated quote: '%s'", j->spec);
        *w++ = '\0';
    }
    j->tok[j->ntok] = NULL;
    return j->ntok ? 0 : bad("%sa job is empty: give a model file", "");
}

/* Takes a job's own words out of its tokens, before plan's parser reads
 * the rest: --inference and --generate N (or --generate=N). */
static int take_inference(job *j)
{
    const char *gen = NULL;
    bool gen_seen = false;
    int w = 0;
    for (int i = 0; i < j->ntok; i++) {
        char *t = j->tok[i];
        if (!strcmp(t, "--inference")) {
            j->inference = true;
        } else if (!strcmp(t, "--generate") || !strncmp(t, "--generate=", 11)) {
            if (gen_seen)
                return job_bad(j, "--generate is given twice: give it once");
            gen_seen = true;
            gen = t[10] == '=' ? t + 11 : i + 1 < j->ntok ? j->tok[++i] : NULL;
        } else {
            j->tok[w++] = t;
        }
    }
    j->ntok = w;
    j->tok[w] = NULL;
    if (!gen_seen)
        return 0;
    if (!j->inference)
        return job_bad(j, "--generate plans generation, which an inference job does: add "
                          "--inference (a training job does not generate)");
    const char *p = gen ? gen : "";
    while (*p >= '0' && *p <= '9')
        p++;
    char *end = NULL;
    unsigned long long v = gen ? strtoull(gen, &end, 10) : 0;
    if (!gen || !*gen || *p || v < 1 || v > (1ull << 28))
        return job_bad(j, "--generate needs the number of tokens to generate, a whole number "
                          "from 1 to 268435456 ('%s' is not)", gen ? gen : "");
    j->generate = v;
    return 0;
}

/* The plan options that describe training: an inference job has none. */
static int training_only(const job *j)
{
    const ml_cli_opts *o = &j->o;
    const struct {
        const char *v, *flag;
    } t[] = {{o->grad_accum, "--grad-accum"},       {o->optimizer, "--optimizer"},
             {o->optimizer_impl, "--optimizer-impl"}, {o->zero, "--zero"},
             {o->offload, "--offload"},             {o->data_parallel, "--data-parallel"},
             {o->checkpoint, "--checkpoint"},       {o->global_batch, "--global-batch"},
             {o->max_micro_batch, "--max-micro-batch"}, {o->reduce_bucket, "--reduce-bucket"},
             {o->allgather_bucket, "--allgather-bucket"}, {o->eval_batch, "--eval-batch"},
             {o->eval_seq_len, "--eval-seq-len"},   {o->zero_grad, "--zero-grad"},
             {o->logits, "--logits"},               {o->logits_chunk, "--logits-chunk"},
             {o->allocator, "--allocator"},         {o->max_split_size, "--max-split-size"},
             {o->blas_workspace, "--blas-workspace"}, {o->micro_batches, "--micro-batches"},
             {o->overlap, "--overlap-grad-reduce"}, {o->dist_optimizer, "--dist-optimizer"},
             {o->dp_shard, "--dp-shard"}};
    for (size_t k = 0; k < sizeof t / sizeof t[0]; k++)
        if (t[k].v)
            return job_bad(j, "%s is a training option; an inference job (--inference) has "
                              "none: drop it, or drop --inference to plan training",
                           t[k].flag);
    return 0;
}

/* An inference job's plan (ml_inference_evaluate); a refused --generate
 * names the job and the flag. */
static int plan_inference(job *j)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    ml_status st = ml_inference_evaluate(j->m, &j->cfg, j->generate, &j->inf, &e);
    if (st == ML_RANGE && !strncmp(e.msg, "generate: ", 10))
        return job_bad(j, "--generate: %s", e.msg + 10);
    return st ? ml_cli_eval_failed(&j->o, &e, st) : 0;
}

/* One job: its options parsed as plan's, the shared device put in; a
 * training job's ledger evaluated with the events, kept as levels
 * (ml__ledger_keep_levels) when `levels`; an inference job planned. */
static int load_job(job *j, const char *device, uint64_t memory, bool levels)
{
    int rc = split(j);
    if (!rc)
        rc = take_inference(j);
    if (rc)
        return rc;
    if (j->ntok == 0)
        return job_bad(j, "give a model file before the job's options");
    rc = ml_cli_parse(j->ntok, j->tok, "colocate", usage, &j->o);
    if (rc)
        return rc == 1 ? ML_EXIT_BAD_INPUT : rc;
    const ml_cli_opts *o = &j->o;
    if (o->device || o->budget || o->output || o->format_given || o->emit || o->lengths)
        return bad("job '%s': --device, --budget, -o, --format, --emit and --lengths are "
                   "colocate's own (or not for colocate): give --device once, before the jobs",
                   j->spec);
    /* the jobs' totals are their allocator peaks summed: a cache another
     * process left is not part of one job's peak */
    if (o->allocator_start)
        return bad("job '%s': --allocator-start is not planned for colocated jobs (their "
                   "totals are allocator peaks, summed): plan the job alone with 'memledger "
                   "plan' to see it from that cache", j->spec);
    if (j->inference && (rc = training_only(j)))
        return rc;
    if ((rc = ml_cli_load(o, &j->m, &j->cfg)))
        return rc;
    j->o.model = j->m; /* where its file set a key, for the messages */
    /* an inference job plans no checkpointing (its file's policy is not used) */
    if (!j->inference && j->cfg.training.checkpoint.kind == ML_CKPT_OPTIMAL)
        return bad("job '%s': checkpoint optimal would plan against the whole device, which "
                   "the jobs share: give the job a fixed policy (its plan's segments, e.g. "
                   "\"[0-3] [4-7]\")", j->spec);
    /* the shared device as --device NAME|SIZE reads for plan: a name brings
     * its peaks, a size is memory only (the job's own --peak-tflops stays) */
    ml_error e;
    memset(&e, 0, sizeof e);
    const double own_peak = o->peak_tflops ? j->cfg.device.peak_tflops : 0;
    const uint64_t own_ws = j->cfg.device.blas_workspace;
    if (memory == 0) {
        if (ml_device_preset_apply(device, &j->cfg.device, &e) != ML_OK)
            return bad("--device: %s", e.msg);
    } else {
        ml_device_of_size(&j->cfg.device, memory);
    }
    j->cfg.device.peak_tflops = own_peak; /* over a preset's figure too */
    if (o->blas_workspace) /* the job's own --blas-workspace, likewise */
        j->cfg.device.blas_workspace = own_ws;
    /* an inference job is one process's forward: no pipeline stages,
     * however given */
    if (j->inference && j->cfg.training.pipeline_parallel > 1)
        return job_bad(j, "an inference job (--inference) is planned on one device, without "
                          "pipeline stages: drop the pipeline (%s)",
                       o->pp         ? "--pp"
                       : o->parallel ? "--parallel's pp"
                                     : "the model file's parallel.pp");
    if (j->inference)
        return plan_inference(j);
    ml_status st = ml_ledger_evaluate(j->m, &j->cfg, true, &j->l, &e);
    if (st)
        return ml_cli_eval_failed(o, &e, st);
    /* text and JSON read each event's time and total only: 16 bytes instead
     * of an ml_event's, so eight jobs of 100,000 layers hold 0.2 GB, not 1.6
     * (docs/colocate.md, "Memory"); the SVG draws the categories */
    if (levels && !ml__ledger_keep_levels(j->l)) {
        ml_cli_errorf("out of memory");
        return ML_EXIT_FAILURE;
    }
    return 0;
}

/* The library's view of the jobs. */
static void job_views(const job *jobs, size_t n, ml_colocate_job *out)
{
    for (size_t j = 0; j < n; j++) {
        out[j].ledger = jobs[j].inference ? NULL : jobs[j].l;
        out[j].inference = jobs[j].inference ? &jobs[j].inf : NULL;
    }
}

static int write_report(const char *output, ml_format fmt, job *jobs, size_t n,
                        const ml_colocate_result *r)
{
    ml_colocate_job ls[MAX_JOBS];
    const char *names[MAX_JOBS];
    job_views(jobs, n, ls);
    for (size_t j = 0; j < n; j++)
        names[j] = jobs[j].spec;
    ml_out out;
    int rc = ml_out_open(&out, output);
    if (!rc && fmt == ML_FMT_TEXT)
        rc = ml_out_text(&out, NULL);
    if (rc)
        return rc;
    int w = fmt == ML_FMT_JSON  ? ml_report_colocate_json(out.f, ls, names, n, r)
            : fmt == ML_FMT_SVG ? ml_report_colocate_svg(out.f, ls, names, n, r)
                                : ml_report_colocate_text(out.f, ls, names, n, r);
    return ml_out_close(&out, w == 0);
}

typedef struct {
    const char *device, *budget, *output, *format;
    const char *specs[MAX_JOBS];
    size_t n;
} colocate_args;

static int parse_args(int argc, char **argv, colocate_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            ml_cli_print_usage(usage, stdout);
            return 1;
        }
        const char *v = NULL;
        const char **slot = ml_cli_flag_is(arg, "--device", argc, argv, &i, &v)     ? &a->device
                            : ml_cli_flag_is(arg, "--budget", argc, argv, &i, &v)   ? &a->budget
                            : ml_cli_flag_is(arg, "--format", argc, argv, &i, &v)   ? &a->format
                            : ml_cli_flag_is(arg, "-o", argc, argv, &i, &v)         ? &a->output
                            : ml_cli_flag_is(arg, "--output", argc, argv, &i, &v)   ? &a->output
                                                                                     : NULL;
        if (slot) {
            if (!v || !*v)
                return bad("%s needs a value", arg);
            if (*slot)
                return bad("%s: given twice (or with another name for it): give it once", arg);
            *slot = v;
            continue;
        }
        /* a job may start with a flag ("--hf config.json ..."): it is one
         * argument with a blank in it */
        if (arg[0] == '-' && !strpbrk(arg, " \t\n"))
            return bad("'%s' is not a colocate option: a job's own options go inside its "
                       "quotes, after its model file", arg);
        if (a->n == MAX_JOBS)
            return bad("more than 8 jobs ('%s' is the ninth)", arg);
        a->specs[a->n++] = arg;
    }
    if (!a->device)
        return bad("%scolocate needs the shared device: --device NAME|SIZE", "");
    if (a->n < 2)
        return bad("%scolocate needs two jobs or more, each a quoted model file with its "
                   "options", "");
    return 0;
}

/* The budget against the shared device as plan checks it (the same
 * message: ml_config_check, the subject --budget). */
static int check_budget(const ml_config *cfg, const char *flag, uint64_t budget)
{
    if (!budget)
        return 0;
    ml_config c = *cfg;
    c.device.budget = budget;
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_config_check(&c, &e) == ML_OK)
        return 0;
    ml_cli_opts o;
    memset(&o, 0, sizeof o);
    o.budget = flag;
    ml_cli_config_error(&o, &e);
    return ML_EXIT_BAD_INPUT;
}

int ml_cmd_colocate(int argc, char **argv)
{
    colocate_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc)
        return rc == 1 ? ML_EXIT_OK : rc;
    uint64_t memory = 0;
    ml_error e;
    memset(&e, 0, sizeof e);
    /* --device NAME|SIZE as for plan: a preset (memory 0 here: each job
     * takes the preset's figures), or a size */
    if (ml_device_preset_find(a.device)) {
        memory = 0;
    } else if (ml_parse_size(a.device, &memory, &e) != ML_OK || memory == 0) {
        return bad("--device: %s (or a device name: memledger devices)",
                   e.msg[0] ? e.msg : "must be at least 1 byte");
    }
    /* --budget as plan reads it: the size here, against the device's
     * memory once a job has the device (check_budget) */
    uint64_t budget = 0;
    if (a.budget && ml_parse_size(a.budget, &budget, &e) != ML_OK) {
        ml_cli_errorf("--budget: %s", e.msg);
        return ML_EXIT_BAD_INPUT;
    }
    ml_format fmt = ML_FMT_TEXT;
    if (a.format && !strcmp(a.format, "json"))
        fmt = ML_FMT_JSON;
    else if (a.format && !strcmp(a.format, "svg"))
        fmt = ML_FMT_SVG;
    else if (a.format && strcmp(a.format, "text"))
        return bad("--format: '%s' is not one of text, json, svg", a.format);
    if (ml_out_refuse_input(a.output, NULL))
        return ML_EXIT_BAD_INPUT;
    job *jobs = calloc(a.n, sizeof *jobs);
    if (!jobs) {
        ml_cli_errorf("out of memory");
        return ML_EXIT_FAILURE;
    }
    for (size_t j = 0; j < a.n && !rc; j++) {
        jobs[j].spec = a.specs[j];
        rc = load_job(&jobs[j], a.device, memory, fmt != ML_FMT_SVG);
        const char *inputs[] = {jobs[j].o.model_path, jobs[j].o.training, jobs[j].o.calib};
        for (size_t k = 0; !rc && k < 3; k++)
            if (ml_out_refuse_input(a.output, inputs[k]))
                rc = ML_EXIT_BAD_INPUT;
    }
    ml_colocate_result r;
    if (!rc)
        rc = check_budget(&jobs[0].cfg, a.budget, budget);
    if (!rc) {
        ml_colocate_job ls[MAX_JOBS];
        job_views(jobs, a.n, ls);
        ml_status st = ml_colocate_jobs(ls, a.n, jobs[0].cfg.device.memory, budget, &r, &e);
        if (st) {
            ml_cli_print_error(&e);
            rc = st == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
        }
    }
    if (!rc)
        rc = write_report(a.output, fmt, jobs, a.n, &r);
    if (!rc && !r.fits)
        rc = ML_EXIT_NO_FIT;
    for (size_t j = 0; j < a.n; j++) {
        ml_ledger_destroy(jobs[j].l);
        ml_cli_free(jobs[j].m, &jobs[j].cfg);
    }
    free(jobs);
    return rc;
}
