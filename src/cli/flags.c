/* The library names a setting by its YAML key ("training.micro_batch") or
 * its request field ("global_batch"); on the command line the same setting
 * is a flag. One table maps the two, and ml_cli_decorate rewrites a
 * library message in the flags' words. */
#include <ctype.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const struct {
    const char *key;  /* as the library writes it */
    const char *flag; /* as the user types it */
    const char *hint; /* the flag with its value, where a sentence asks for
                         it; NULL: the flag */
    size_t given;     /* offset of the flag's raw value in ml_cli_opts; 0: a
                         flag-only setting, always the flag */
} table[] = {
#define OPT(field) offsetof(ml_cli_opts, field)
    {"training.micro_batch", "--micro-batch", NULL, OPT(micro_batch)},
    {"training.seq_len", "--seq-len", NULL, OPT(seq_len)},
    {"training.grad_accum", "--grad-accum", NULL, OPT(grad_accum)},
    {"training.precision", "--precision", NULL, OPT(precision)},
    {"training.optimizer", "--optimizer", NULL, OPT(optimizer)},
    {"training.optimizer_impl", "--optimizer-impl", NULL, OPT(optimizer_impl)},
    {"training.checkpoint", "--checkpoint", NULL, OPT(checkpoint)},
    {"training.data_parallel", "--data-parallel", NULL, OPT(data_parallel)},
    {"parallel.tp", "--tp", NULL, OPT(tp)},
    {"training.engine", "--engine", NULL, OPT(engine)},
    {"parallel.sp", "--sp", "--no-sp", OPT(sp)},
    {"parallel.dist_optimizer", "--dist-optimizer", NULL, OPT(dist_optimizer)},
    {"parallel.dp_shard", "--dp-shard", NULL, OPT(dp_shard)},
    {"parallel.overlap_grad_reduce", "--overlap-grad-reduce", NULL, OPT(overlap)},
    {"parallel.pp", "--pp", NULL, OPT(pp)},
    {"parallel.pp_schedule", "--pp-schedule", NULL, OPT(pp_schedule)},
    {"parallel.pp_layers", "--pp-layers", NULL, OPT(pp_layers)},
    {"parallel.vpp", "--vpp", NULL, OPT(vpp)},
    {"parallel.cp", "--cp", NULL, OPT(cp)},
    {"parallel.ep", "--ep", NULL, OPT(ep)},
    {"parallel.etp", "--etp", NULL, OPT(etp)},
    {"training.zero", "--zero", NULL, OPT(zero)},
    {"training.offload", "--offload", NULL, OPT(offload)},
    {"training.reduce_bucket_size", "--reduce-bucket-size", NULL, OPT(reduce_bucket)},
    {"training.allgather_bucket_size", "--allgather-bucket-size", NULL, OPT(allgather_bucket)},
    {"training.logits", "--logits", NULL, OPT(logits)},
    {"training.zero_grad", "--zero-grad", NULL, OPT(zero_grad)},
    {"training.eval_batch", "--eval-batch", NULL, OPT(eval_batch)},
    {"training.eval_seq_len", "--eval-seq-len", NULL, OPT(eval_seq_len)},
    {"training.target_len", "--target-len", NULL, OPT(target_len)},
    {"training.vision_tower", "--vision-tower", NULL, OPT(vision_tower)},
    {"training.logits_chunk", "--logits-chunk", NULL, OPT(logits_chunk)},
    {"training.expert_imbalance", "--expert-imbalance", NULL, OPT(expert_imbalance)},
    {"training.expert_capacity", "--expert-capacity", NULL, OPT(expert_capacity)},
    {"training.expert_pad", "--expert-pad", NULL, OPT(expert_pad)},
    {"model.attention", "--attention", NULL, OPT(attention)},
    {"device.memory", "--device", "--device NAME|SIZE or a device: section", OPT(device)},
    {"device.budget", "--budget", NULL, OPT(budget)},
    {"device.runtime_reserve", "--runtime-reserve", NULL, OPT(runtime_reserve)},
    {"device.peak_tflops", "--peak-tflops", NULL, OPT(peak_tflops)},
    {"device.efficiency", "--efficiency", NULL, OPT(efficiency)},
    {"device.interconnect_gbps", "--interconnect", NULL, OPT(interconnect)},
    {"device.pcie_gbps", "--pcie", NULL, OPT(pcie)},
    {"device.fragmentation", "--fragmentation", NULL, OPT(fragmentation)},
    {"device.allocator", "--allocator", NULL, OPT(allocator)},
    {"device.max_split_size", "--max-split-size", NULL, OPT(max_split_size)},
    {"device.blas_workspace", "--blas-workspace", NULL, OPT(blas_workspace)},
    {"device.start", "--allocator-start", NULL, OPT(allocator_start)},
    {"global_batch", "--global-batch", NULL, 0},
    {"gpus", "--gpus", NULL, 0},
    {"max_micro_batch", "--max-micro-batch", NULL, 0},
    {"points.at", "--at", NULL, 0},
#undef OPT
};

#define NKEYS (sizeof table / sizeof table[0])

/* The row of the key spelled by s[0..n), or NKEYS. */
static size_t find(const char *s, size_t n)
{
    for (size_t i = 0; i < NKEYS; i++)
        if (strlen(table[i].key) == n && !memcmp(table[i].key, s, n))
            return i;
    return NKEYS;
}

static bool given(const ml_cli_opts *o, size_t row)
{
    if (!table[row].given)
        return true;
    const char *v;
    memcpy(&v, (const char *)o + table[row].given, sizeof v);
    return v != NULL;
}

/* Whether the layout (tp2.pp4.dp8) has a part named `part` (its letters). */
static bool layout_has(const char *layout, const char *part)
{
    const size_t n = strlen(part);
    for (const char *p = layout; *p;) {
        size_t letters = 0;
        while (isalpha((unsigned char)p[letters]))
            letters++;
        if (letters == n && !strncmp(p, part, n))
            return true;
        p = strchr(p, '.');
        if (!p)
            break;
        p++;
    }
    return false;
}

/* Where a key its own flag did not set came from a flag all the same: the
 * sizes --parallel LAYOUT sets (parallel_flags.c), where the layout has
 * that part (named "--parallel's pp"), and the steps --micro-batches sets.
 * The name into buf; false: from neither (the file's, or its own flag's). */
static bool set_by(const ml_cli_opts *o, size_t row, char *buf, size_t size)
{
    static const char *const parts[][2] = {
        {"parallel.tp", "tp"}, {"parallel.pp", "pp"}, {"parallel.vpp", "vpp"},
        {"parallel.cp", "cp"}, {"parallel.ep", "ep"}, {"parallel.etp", "etp"},
        {"training.data_parallel", "dp"}};
    if (given(o, row))
        return false;
    if (o->micro_batches && !strcmp(table[row].key, "training.grad_accum")) {
        snprintf(buf, size, "--micro-batches");
        return true;
    }
    for (size_t i = 0; o->parallel && i < sizeof parts / sizeof parts[0]; i++)
        if (!strcmp(table[row].key, parts[i][0]) && layout_has(o->parallel, parts[i][1])) {
            snprintf(buf, size, "--parallel's %s", parts[i][1]);
            return true;
        }
    return false;
}

const char *ml_cli_flag_of(const char *key)
{
    size_t row = find(key, strlen(key));
    return row < NKEYS ? table[row].flag : NULL;
}

static bool key_char(char c)
{
    return islower((unsigned char)c) || isdigit((unsigned char)c) || c == '_' || c == '.';
}

/* A key stands alone: not inside a path, a file name or a longer word. */
static bool word_edge(char c)
{
    return !c || !(isalnum((unsigned char)c) || strchr("/_.-\\", c));
}

bool ml_cli_decorate(const ml_cli_opts *o, char *msg, size_t size)
{
    char out[sizeof((ml_error *)0)->msg];
    size_t w = 0;
    bool from_flag = false;
    char by[32];
    for (size_t r = 0; msg[r];) {
        size_t n = 0;
        while (key_char(msg[r + n]))
            n++;
        while (n > 1 && msg[r + n - 1] == '.') /* a sentence's full stop */
            n--;
        const char *put = msg + r;
        size_t len = n ? n : 1;
        const char after = msg[r + n];
        const bool right = word_edge(after) || (after == '.' && word_edge(msg[r + n + 1]));
        size_t row = n && (r == 0 || word_edge(msg[r - 1])) && right
                         ? find(msg + r, n)
                         : NKEYS;
        if (row < NKEYS) {
            /* the message's subject ("KEY: ...") is the file's key unless
             * a flag set it; a key elsewhere is a setting to change, and
             * the flag changes it */
            const bool subject = r == 0;
            if (set_by(o, row, by, sizeof by)) {
                put = by;
                len = strlen(put);
                from_flag |= subject;
            } else if (!subject || given(o, row)) {
                put = subject || !table[row].hint ? table[row].flag : table[row].hint;
                len = strlen(put);
                from_flag |= subject;
            }
        }
        if (w + len >= sizeof out) /* no room for the rest: stop here */
            break;
        memcpy(out + w, put, len);
        w += len;
        r += n ? n : 1;
    }
    out[w] = '\0';
    snprintf(msg, size, "%s", out);
    return from_flag;
}

void ml_cli_config_error(const ml_cli_opts *o, ml_error *e)
{
    /* with --hf, the training: and device: keys come from --training */
    const bool from_training = o->training && (!strncmp(e->msg, "training.", 9) ||
                                               !strncmp(e->msg, "device.", 7) ||
                                               !strncmp(e->msg, "parallel.", 9));
    const char *file = from_training ? o->training : o->model_path ? o->model_path : o->hf;
    /* the key the message is about, as the file set it: its line and
     * column (before the flags' words replace the key) */
    ml_model_locate_error(o->model, e);
    if (ml_cli_decorate(o, e->msg, sizeof e->msg) || !file) {
        e->path[0] = '\0';
        e->line = e->col = 0;
    } else {
        snprintf(e->path, sizeof e->path, "%s", file);
    }
    ml_cli_print_error(e);
}

int ml_cli_eval_failed(const ml_cli_opts *o, ml_error *e, ml_status st)
{
    ml_cli_config_error(o, e);
    return st == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
}

int ml_cli_load_start(const char *path, ml_device *d)
{
    if (!path)
        return 0;
    if (d->allocator == ML_ALLOCATOR_NONE) {
        ml_cli_errorf("--allocator-start: applies to a simulated allocator only: add "
                      "--allocator caching (or expandable)");
        return ML_EXIT_BAD_INPUT;
    }
    ml_alloc_trace *t = NULL;
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_alloc_trace_load_file(path, &t, &e) != ML_OK) {
        ml_cli_print_error(&e);
        return e.code == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    d->start = t;
    return 0;
}

void ml_cli_free(ml_model *m, ml_config *cfg)
{
    ml_model_destroy(m);
    if (cfg && cfg->device.start) {
        ml_alloc_trace_destroy((ml_alloc_trace *)cfg->device.start);
        cfg->device.start = NULL;
    }
    if (cfg && cfg->calib) {
        ml_profile_destroy((ml_profile *)cfg->calib);
        cfg->calib = NULL;
    }
}

bool ml_cli_start(int argc, char **argv, const char *verb, const char *const *usage, ml_cli_opts *o,
                  ml_model **m, ml_config *cfg, int *rc)
{
    *rc = ml_cli_parse(argc, argv, verb, usage, o);
    if (*rc == 1)
        *rc = ML_EXIT_OK;
    if (*rc || o->model_path == NULL)
        return false;
    *rc = ml_cli_load(o, m, cfg);
    if (*rc == 0)
        o->model = *m;
    return *rc == 0;
}
