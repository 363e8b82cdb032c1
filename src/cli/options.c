#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "util/decimal.h"
#include "cli/cli.h"

static int usage_error(const char *verb, const char *fmt, const char *arg)
{
    char msg[4200];
    snprintf(msg, sizeof msg, fmt, arg);
    ml_cli_errorf("%s", msg);
    fprintf(stderr, "Try 'memledger %s --help'.\n", verb);
    return ML_EXIT_BAD_INPUT;
}

/* A flag's value: after '=', or the next argument unless that is itself a
 * flag ("-o --points": -o was given no file name, and --points is not one).
 * "-" (standard output) and negative numbers (for the range checks to
 * refuse by name) are values. NULL when there is none. */
static const char *flag_value(int argc, char **argv, int *i, const char *eq)
{
    if (eq)
        return eq + 1;
    if (*i + 1 >= argc)
        return NULL;
    const char *v = argv[*i + 1];
    if (v[0] == '-' && v[1] && !isdigit((unsigned char)v[1]) && v[1] != '.')
        return NULL;
    return argv[++*i];
}

bool ml_cli_is_flag(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return !strncmp(arg, name, n) && (!arg[n] || arg[n] == '=');
}

bool ml_cli_flag_is(const char *arg, const char *name, int argc, char **argv, int *i,
                    const char **val)
{
    if (!ml_cli_is_flag(arg, name))
        return false;
    const char *eq = strchr(arg, '=');
    *val = flag_value(argc, argv, i, eq);
    return true;
}

/* --format VALUE for verb: the formats the verb writes. */
static int parse_format(const char *verb, const char *val, ml_cli_opts *o)
{
    if (!val || !*val)
        return usage_error(verb, "--format needs a value: %s",
                           !strcmp(verb, "compare")    ? "text, json, csv or svg"
                           : !strcmp(verb, "timeline") ? "csv, json, svg or trace"
                                                       : "text or json");
    if (!strcmp(verb, "report"))
        return usage_error(verb, "--format: '%s': report writes HTML only (for text or JSON, "
                                 "use memledger plan --format text|json)",
                           val);
    if (!strcmp(val, "text") && strcmp(verb, "timeline"))
        o->format = ML_FMT_TEXT;
    else if (!strcmp(val, "json"))
        o->format = ML_FMT_JSON;
    else if (!strcmp(val, "csv") && (!strcmp(verb, "compare") || !strcmp(verb, "timeline")))
        o->format = ML_FMT_CSV;
    else if (!strcmp(val, "svg") && (!strcmp(verb, "compare") || !strcmp(verb, "timeline")))
        o->format = ML_FMT_SVG;
    else if (!strcmp(val, "trace") && !strcmp(verb, "timeline"))
        o->format = ML_FMT_TRACE;
    else
        return usage_error(verb, !strcmp(verb, "compare")
                                     ? "--format: '%s' is not a format; use text, "
                                       "json, csv or svg"
                                 : !strcmp(verb, "timeline")
                                     ? "--format: '%s' is not a format; use csv, "
                                       "json, svg or trace"
                                     : "--format: '%s' is not a format; use text or "
                                       "json",
                           val);
    o->format_given = true;
    return 0;
}

/* A flag given a second time, under its own name or another spelling of
 * it (--dp, --data-parallel): refused, where the last would have won
 * silently. */
static int twice(const char *verb, const char *flag)
{
    return usage_error(verb, "%s: given twice (or with another name for it): give it once",
                       flag);
}

/* A flag of the table (its value stored raw in o), and the verbs it is for. */
static int parse_table_flag(const char *verb, int argc, char **argv, int *i, const char *eq,
                            size_t len, ml_cli_opts *o)
{
    const char *arg = argv[*i];
    size_t k;
    size_t nflags = 0;
    const ml_cli_flag *flags = ml_cli_flags(&nflags);
    for (k = 0; k < nflags; k++)
        if (strlen(flags[k].flag) == len && !strncmp(arg, flags[k].flag, len))
            break;
    if (k == nflags)
        return usage_error(verb, "unknown option '%s'", arg);
    const char *val = flag_value(argc, argv, i, eq);
    if (!val || !*val)
        return usage_error(verb, "%s needs a value", flags[k].flag);
    if (*(const char **)((char *)o + flags[k].off))
        return twice(verb, flags[k].flag);
    *(const char **)((char *)o + flags[k].off) = val;
    if (!strcmp(flags[k].flag, "--checkpoint") && !strcmp(val, "auto")) {
        if (strcmp(verb, "fit"))
            return usage_error(verb, "--checkpoint auto is for 'memledger fit'%s", "");
        o->auto_checkpoint = true;
    }
    if ((!strcmp(flags[k].flag, "--lengths") || !strcmp(flags[k].flag, "--batching") ||
         !strcmp(flags[k].flag, "--max-tokens") || !strcmp(flags[k].flag, "--buckets")) &&
        strcmp(verb, "plan") && strcmp(verb, "fit") && strcmp(verb, "triage"))
        return usage_error(verb, "%s is for 'memledger plan' and 'memledger fit' (and 'memledger "
                                 "triage')",
                           flags[k].flag);
    if (!strcmp(flags[k].flag, "--ranks") && (strcmp(verb, "plan") || strcmp(val, "all")))
        return usage_error(verb, strcmp(verb, "plan") ? "%s is for 'memledger plan'"
                                                      : "%s: the one value is 'all'",
                           "--ranks");
    if (((!strcmp(flags[k].flag, "--global-batch") && strcmp(verb, "report")) ||
         !strcmp(flags[k].flag, "--max-micro-batch") || !strcmp(flags[k].flag, "--gpus") ||
         !strcmp(flags[k].flag, "--gpus-per-node") || !strcmp(flags[k].flag, "--network")) &&
        strcmp(verb, "fit"))
        return usage_error(verb, "%s is for 'memledger fit'", flags[k].flag);
    return 0;
}

/* What the flags must say together once all are read. */
static int check_parsed(const char *verb, ml_cli_opts *o)
{
    if (o->hf && o->model_path)
        return usage_error(verb, "give a model file or --hf config.json, not both (%s)",
                           o->model_path);
    if (o->training && !o->hf)
        return usage_error(verb, "%s", "--training goes with --hf (a model file has its own "
                                       "training: section)");
    if (!o->model_path && !o->hf)
        return usage_error(verb, "%s", "missing the model file (e.g. models/gpt2-small.yaml) or "
                                       "--hf config.json");
    if (o->hf)
        o->model_path = o->hf;
    /* a flag the verb would not use is refused, never ignored */
    if (!strcmp(verb, "fit") && o->micro_batch && !o->gpus)
        return usage_error(verb, "--micro-batch %s: fit searches the micro-batch; bound it with "
                                 "--max-micro-batch, or plan one with 'memledger plan' (with "
                                 "--gpus it pins the layout search's)",
                           o->micro_batch);
    if (o->exhaustive && (strcmp(verb, "fit") || !o->gpus))
        return usage_error(verb, "%s", "--exhaustive is for 'memledger fit --gpus N' (the search)");
    if (!strcmp(verb, "compare") && o->checkpoint)
        return usage_error(verb, "--checkpoint %s: compare plans every checkpoint policy side by "
                                 "side; plan one with 'memledger plan --checkpoint'",
                           o->checkpoint);
    if (o->emit && o->format_given)
        return usage_error(verb, "--emit %s writes the target's own format: drop --format",
                           o->emit);
    /* -o naming an input would replace it with the report */
    const char *inputs[] = {o->model_path, o->training, o->calib, o->lengths, o->allocator_start};
    for (size_t k = 0; k < sizeof inputs / sizeof inputs[0]; k++)
        if (ml_out_refuse_input(o->output, inputs[k]))
            return ML_EXIT_BAD_INPUT;
    return 0;
}

/* The flags without a value: on/off switches; false when arg is none. */
static bool switch_flag(const char *arg, ml_cli_opts *o)
{
    if (!strcmp(arg, "--overlap-grad-reduce") || !strcmp(arg, "--no-overlap-grad-reduce"))
        o->overlap = arg[2] == 'n' ? "off" : "on";
    else if (!strcmp(arg, "--expert-pad") || !strcmp(arg, "--no-expert-pad"))
        o->expert_pad = arg[2] == 'n' ? "off" : "on";
    else if (!strcmp(arg, "--dist-optimizer") || !strcmp(arg, "--no-dist-optimizer"))
        o->dist_optimizer = arg[2] == 'n' ? "off" : "on";
    else if (!strcmp(arg, "--sp") || !strcmp(arg, "--no-sp"))
        o->sp = arg[2] == 'n' ? "off" : "on";
    else if (!strcmp(arg, "--exhaustive"))
        o->exhaustive = true; /* fit --gpus (check_parsed) */
    else
        return false;
    return true;
}

void ml_cli_print_usage(const char *const *usage, FILE *f)
{
    for (; *usage; usage++)
        fputs(*usage, f);
}

int ml_cli_parse(int argc, char **argv, const char *verb, const char *const *usage,
                 ml_cli_opts *o)
{
    memset(o, 0, sizeof *o);
    o->verb = verb;
    for (int i = 0; i < argc; i++) {
        const char *arg = argv[i];
        if (!strcmp(arg, "-h") || !strcmp(arg, "--help")) {
            ml_cli_print_usage(usage, stdout);
            return 1;
        }
        if (arg[0] == '-' && arg[1]) {
            const char *eq = strchr(arg, '=');
            size_t len = eq ? (size_t)(eq - arg) : strlen(arg);
            const char *val = NULL;
            if ((len == 2 && !strncmp(arg, "-o", 2)) || (len == 8 && !strncmp(arg, "--output", 8))) {
                val = flag_value(argc, argv, &i, eq);
                if (!val || !*val)
                    return usage_error(verb, "%s needs a file name", len == 2 ? "-o" : "--output");
                if (o->output)
                    return twice(verb, "-o");
                o->output = val;
                continue;
            }
            if (!strncmp(arg, "--emit", len) && len == 6) {
                val = flag_value(argc, argv, &i, eq);
                if (strcmp(verb, "plan") && strcmp(verb, "fit"))
                    return usage_error(verb, "%s is for 'memledger plan' and 'memledger fit'",
                                       "--emit");
                if (!val || !*val)
                    return usage_error(verb, "%s needs a target: deepspeed, hf-trainer, "
                                             "torch, megatron or torchtitan",
                                       "--emit");
                if ((strcmp(val, "deepspeed") && strcmp(val, "hf-trainer") &&
                     strcmp(val, "torch") && strcmp(val, "megatron") &&
                     strcmp(val, "torchtitan")))
                    return usage_error(verb, "--emit: '%s' is not a target; use deepspeed, "
                                             "hf-trainer, torch, megatron or torchtitan",
                                       val);
                if (o->emit)
                    return twice(verb, "--emit");
                o->emit = val;
                continue;
            }
            if ((!strncmp(arg, "--hf", len) && len == 4) ||
                (!strncmp(arg, "--training", len) && len == 10)) {
                val = flag_value(argc, argv, &i, eq);
                if (!val || !*val)
                    return usage_error(verb, "%s needs a file", len == 4 ? "--hf" : "--training");
                const char **to = len == 4 ? &o->hf : &o->training;
                if (*to)
                    return twice(verb, len == 4 ? "--hf" : "--training");
                *to = val;
                continue;
            }
            if (switch_flag(arg, o))
                continue;
            if (!strncmp(arg, "--format", len) && len == 8) {
                if (o->format_given)
                    return twice(verb, "--format");
                int rc = parse_format(verb, flag_value(argc, argv, &i, eq), o);
                if (rc)
                    return rc;
                continue;
            }
            int rc = parse_table_flag(verb, argc, argv, &i, eq, len, o);
            if (rc)
                return rc;
            continue;
        }
        if (o->model_path)
            return usage_error(verb, "one model file only; '%s' is a second one", arg);
        o->model_path = arg;
    }
    return check_parsed(verb, o);
}

static int bad_flag(const char *flag, const char *msg)
{
    ml_cli_errorf("%s: %s", flag, msg); /* msg may quote the value: escaped */
    return ML_EXIT_BAD_INPUT;
}

int ml_cli_max_split(const char *v, uint64_t *mib)
{
    const char *s = v;
    while (isdigit((unsigned char)*s))
        s++;
    if (isalpha((unsigned char)*s)) /* a unit: the YAML key's habit */
        return bad_flag("--max-split-size", "counts MiB, as PyTorch's max_split_size_mb does: "
                                            "write the number alone (20 for 20 MiB)");
    return ml_cli_whole("--max-split-size", v, 20, 1ull << 40, mib);
}

int ml_cli_whole(const char *flag, const char *v, uint64_t lo, uint64_t hi, uint64_t *out)
{
    char msg[200];
    const char *p = v;
    while (isdigit((unsigned char)*p))
        p++;
    errno = 0;
    unsigned long long x = strtoull(v, NULL, 10);
    if (p == v || *p || errno || x < lo || x > hi) {
        snprintf(msg, sizeof msg, "'%s' is not a whole number between %llu and %llu", v,
                 (unsigned long long)lo, (unsigned long long)hi);
        return bad_flag(flag, msg);
    }
    *out = x;
    return 0;
}

static int size_flag(const char *flag, const char *v, uint64_t *out)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_parse_size(v, out, &e))
        return bad_flag(flag, e.msg);
    return 0;
}

static int real(const char *flag, const char *v, double lo, double hi, double *out)
{
    double x = 0;
    if (!ml__decimal(v, &x) || x < lo || x > hi) {
        char msg[200];
        snprintf(msg, sizeof msg, "'%s' is not a number between %g and %g", v, lo, hi);
        return bad_flag(flag, msg);
    }
    *out = x;
    return 0;
}

/* A whole-number flag within its setting's range (ml_config_range). */
static int limited(const char *v, const char *key, uint64_t *out)
{
    uint64_t lo = 0, hi = 0;
    bool known = ml_config_range(key, &lo, &hi);
    if (!known)
        lo = 0, hi = UINT64_MAX;
    return ml_cli_whole(ml_cli_flag_of(key), v, lo, hi, out);
}

/* The training flags over the model file's settings: 0, or the exit status
 * of the first bad one (its message printed). */
/* --vision-tower: same, none, full or frozen. */
static int vision_tower_flag(const char *v, ml_training *t)
{
    for (unsigned i = 0; i < ML_VT_COUNT; i++)
        if (!strcmp(v, ml_vision_tower_name((ml_vision_tower)i))) {
            t->vision_tower = (ml_vision_tower)i;
            return 0;
        }
    return bad_flag("--vision-tower", "unknown; use same, none, full or frozen");
}

/* A mixture of experts' flags: the routing's imbalance, Megatron's
 * capacity factor and its padding. */
static int expert_flags(const ml_cli_opts *o, ml_training *t)
{
    int rc = 0;
    if (o->expert_imbalance)
        rc = real("--expert-imbalance", o->expert_imbalance, 1, 1e6, &t->expert_imbalance);
    if (!rc && o->expert_capacity)
        rc = real("--expert-capacity", o->expert_capacity, 0, 1e6, &t->expert_capacity);
    if (!rc && o->expert_pad)
        t->expert_pad = !strcmp(o->expert_pad, "on");
    return rc;
}

static int training_flags(const ml_cli_opts *o, ml_training *t)
{
    ml_error e;
    int rc = 0;
    if (!rc && o->micro_batch)
        rc = limited(o->micro_batch, "training.micro_batch", &t->micro_batch);
    if (!rc && o->seq_len)
        rc = limited(o->seq_len, "training.seq_len", &t->seq_len);
    if (!rc && o->grad_accum)
        rc = limited(o->grad_accum, "training.grad_accum", &t->grad_accum);
    if (!rc && o->precision && !ml_precision_parse(o->precision, &t->precision))
        rc = bad_flag("--precision", "unknown; use fp32, amp-bf16, amp-fp16, bf16-master, "
                                     "fp16-master or bf16");
    if (!rc && o->optimizer && !ml_optimizer_parse(o->optimizer, &t->optimizer))
        rc = bad_flag("--optimizer", "unknown; use sgd, sgd-momentum, adam, adamw, adafactor, "
                                     "adam-8bit or lion");
    if (!rc && o->optimizer_impl && !ml_optimizer_impl_parse(o->optimizer_impl, &t->optimizer_impl))
        rc = bad_flag("--optimizer-impl", "unknown; use for-loop, foreach or fused");
    if (!rc)
        rc = ml_cli_parallel_flags(o, t);
    if (!rc && o->data_parallel)
        rc = limited(o->data_parallel, "training.data_parallel", &t->data_parallel);
    if (!rc && o->zero) {
        uint64_t z = 0;
        if (!strcmp(o->zero, "fsdp"))
            z = 3;
        else
            rc = limited(o->zero, "training.zero", &z);
        t->zero = (unsigned)z;
    }
    if (!rc && o->reduce_bucket)
        rc = limited(o->reduce_bucket, "training.reduce_bucket_size", &t->reduce_bucket);
    if (!rc && o->allgather_bucket)
        rc = limited(o->allgather_bucket, "training.allgather_bucket_size",
                     &t->allgather_bucket);
    if (!rc && o->logits) {
        if (!strcmp(o->logits, "kept"))
            t->logits = ML_LOGITS_KEPT;
        else if (!strcmp(o->logits, "released"))
            t->logits = ML_LOGITS_RELEASED;
        else if (!strcmp(o->logits, "fused"))
            t->logits = ML_LOGITS_FUSED;
        else if (!strcmp(o->logits, "through-backward"))
            t->logits = ML_LOGITS_THROUGH_BACKWARD;
        else
            rc = bad_flag("--logits", "unknown; use kept, released, fused or through-backward");
    }
    if (!rc && o->logits_chunk)
        rc = limited(o->logits_chunk, "training.logits_chunk", &t->logits_chunk);
    if (!rc)
        rc = expert_flags(o, t);
    if (!rc && o->zero_grad) {
        if (!strcmp(o->zero_grad, "set_to_none"))
            t->zero_grad = ML_ZERO_GRAD_SET_TO_NONE;
        else if (!strcmp(o->zero_grad, "zero"))
            t->zero_grad = ML_ZERO_GRAD_ZERO;
        else
            rc = bad_flag("--zero-grad", "unknown; use set_to_none or zero");
    }
    if (!rc && o->vision_tower)
        rc = vision_tower_flag(o->vision_tower, t);
    if (!rc && o->eval_batch)
        rc = limited(o->eval_batch, "training.eval_batch", &t->eval_batch);
    if (!rc && o->eval_seq_len)
        rc = limited(o->eval_seq_len, "training.eval_seq_len", &t->eval_seq_len);
    if (!rc && o->target_len)
        rc = limited(o->target_len, "training.target_len", &t->target_len);
    if (!rc && o->eval_seq_len && !t->eval_batch)
        rc = bad_flag("--eval-seq-len", "needs an evaluation pass: add --eval-batch N");
    if (!rc && o->offload && !ml_offload_parse(o->offload, &t->offload))
        rc = bad_flag("--offload", "unknown; use none, optimizer or params");
    if (!rc && o->checkpoint && !o->auto_checkpoint) {
        memset(&e, 0, sizeof e);
        if (ml_parse_checkpoint(o->checkpoint, &t->checkpoint, &e))
            rc = bad_flag("--checkpoint", e.msg);
    }
    return rc;
}

/* --device NAME (a preset) or SIZE (memory only). Either is a new device:
 * the file's budget line goes back to the default (memory - reserve) unless
 * --budget gives one, and the file's peak_tflops (its own device's) no
 * longer applies unless --peak-tflops gives one (docs/devices.md). */
static int device_flag(const char *v, ml_device *d)
{
    /* a preset's name first: "4090" is the RTX 4090, not 4,090 bytes */
    if (!ml_device_preset_find(v) &&
        (isdigit((unsigned char)v[0]) || v[0] == '.' || v[0] == '-' || v[0] == '+')) {
        uint64_t memory = 0;
        int rc = size_flag("--device", v, &memory);
        if (!rc)
            ml_device_of_size(d, memory);
        return rc;
    }
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_device_preset_apply(v, d, &e)) {
        ml_cli_errorf("--device: %s (or a size, e.g. 8GiB)", e.msg);
        return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

/* A flag that sets a library key (ml_config_set, which reads its value):
 * 0, or its message under the flag's name and the exit status. */
static int setting_flag(ml_config *c, const char *flag, const char *key, const char *v)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_config_set(c, key, v, &e) == ML_OK)
        return 0;
    const size_t n = strlen(key);
    return bad_flag(flag, strncmp(e.msg, key, n) || strncmp(e.msg + n, ": ", 2) ? e.msg
                                                                                : e.msg + n + 2);
}

/* A flag for the allocator simulation, given with --allocator none (the
 * flag itself, not a size the model file keeps for a simulation): refused. */
static int simulated_only(const char *flag, const ml_device *d)
{
    /* (expandable segments refuse a split size: device.max_split_size) */
    const bool split = !strcmp(flag, "--max-split-size");
    if (d->allocator != ML_ALLOCATOR_NONE)
        return 0;
    return bad_flag(flag, split ? "applies to the simulated caching allocator only: add "
                                  "--allocator caching"
                                : "applies to a simulated allocator only: add --allocator "
                                  "caching (or expandable)");
}

/* The device flags over the model file's device: 0, or the exit status of
 * the first bad one (its message printed). */
static int device_flags(const ml_cli_opts *o, ml_config *c)
{
    ml_device *d = &c->device;
    int rc = 0;
    if (!rc && o->device)
        rc = device_flag(o->device, d);
    if (!rc && o->budget) {
        rc = size_flag("--budget", o->budget, &d->budget);
        if (!rc && !d->present)
            rc = bad_flag("--budget", "needs a device: add --device NAME|SIZE or a device: section");
    }
    if (!rc && o->runtime_reserve)
        rc = size_flag("--runtime-reserve", o->runtime_reserve, &d->runtime_reserve);
    if (!rc && o->peak_tflops)
        rc = real("--peak-tflops", o->peak_tflops, 0, 1e9, &d->peak_tflops);
    if (!rc && o->efficiency)
        rc = real("--efficiency", o->efficiency, 1e-6, 1, &d->efficiency);
    if (!rc && o->interconnect)
        rc = real("--interconnect", o->interconnect, 1e-6, 1e6, &d->interconnect_gbps);
    if (!rc && o->pcie)
        rc = real("--pcie", o->pcie, 1e-6, 1e6, &d->pcie_gbps);
    if (!rc && o->fragmentation)
        rc = real("--fragmentation", o->fragmentation, 0, 1, &d->fragmentation);
    if (!rc && o->allocator) {
        unsigned a = 0;
        while (a < ML_ALLOCATOR_COUNT && strcmp(o->allocator, ml_allocator_name((ml_allocator)a)))
            a++;
        if (a == ML_ALLOCATOR_COUNT)
            rc = bad_flag("--allocator", "unknown; use caching, expandable or none");
        else
            d->allocator = (ml_allocator)a;
    }
    if (!rc && o->max_split_size) {
        uint64_t mb = 0;
        rc = ml_cli_max_split(o->max_split_size, &mb);
        d->max_split_size = mb << 20;
        if (!rc)
            rc = simulated_only("--max-split-size", d);
    }
    if (!rc && o->blas_workspace) {
        rc = setting_flag(c, "--blas-workspace", "device.blas_workspace", o->blas_workspace);
        if (!rc)
            rc = simulated_only("--blas-workspace", d);
    }
    return rc ? rc : ml_cli_load_start(o->allocator_start, d);
}

int ml_cli_load(const ml_cli_opts *o, ml_model **mp, ml_config *cfg)
{
    ml_error e;
    ml_model *m = NULL;
    ml_status st = o->hf ? ml_model_load_hf(o->hf, o->training, &m, &e)
                         : ml_model_load_file(o->model_path, &m, &e);
    if (st) {
        ml_cli_print_error(&e);
        return st == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    if (o->attention && ml_model_set_attention(m, o->attention, &e) != ML_OK) {
        ml_cli_errorf("--attention: %s", strchr(e.msg, ':') ? strchr(e.msg, ':') + 2 : e.msg);
        ml_model_destroy(m);
        return ML_EXIT_BAD_INPUT;
    }
    ml_config c = ml_model_config(m);
    int rc = training_flags(o, &c.training);
    if (!rc)
        rc = ml_cli_unused_flags(o, m, &c.training);
    if (!rc)
        rc = device_flags(o, &c);
    if (!rc && o->calib) {
        ml_profile *p = NULL;
        memset(&e, 0, sizeof e);
        if (ml_profile_load_file(o->calib, &p, &e) != ML_OK) {
            ml_cli_print_error(&e);
            rc = ML_EXIT_BAD_INPUT;
        } else {
            c.calib = p;
        }
    }
    if (rc) {
        ml_cli_free(m, &c);
        return rc;
    }
    *mp = m;
    *cfg = c;
    return 0;
}
