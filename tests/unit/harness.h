/* Shared test helpers: model loading from strings or models/, and
 * assert_rel_close (cmocka 1.1.5 has no double assertion). */
#ifndef ML_TEST_HARNESS_H
#define ML_TEST_HARNESS_H

#include <dirent.h>
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "memledger/memledger.h"

#define assert_rel_close(a, b, rtol)                                                          \
    do {                                                                                      \
        double a_ = (double)(a), b_ = (double)(b);                                            \
        double d_ = fabs(a_ - b_), s_ = fmax(fabs(a_), fabs(b_));                             \
        if (!(d_ <= (rtol) * s_ || d_ == 0))                                                  \
            fail_msg("%s = %.17g, expected %s = %.17g (rtol %g)", #a, a_, #b, b_,             \
                     (double)(rtol));                                                         \
    } while (0)

static inline ml_model *load_str(const char *yaml)
{
    ml_model *m = NULL;
    ml_error e;
    ml_status st = ml_model_load_string(yaml, strlen(yaml), "test.yaml", &m, &e);
    if (st != ML_OK)
        fail_msg("load failed: %s:%u:%u: %s", e.path, e.line, e.col, e.msg);
    return m;
}

static inline ml_model *load_preset(const char *name)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.yaml", ML_MODELS_DIR, name);
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_file(path, &m, &e) != ML_OK)
        fail_msg("load %s failed: %s:%u:%u: %s", path, e.path, e.line, e.col, e.msg);
    return m;
}

/* A shipped Hugging Face config, models/hf/DIR/config.json, or fail. */
static inline ml_model *load_hf_config(const char *dir)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/hf/%s/config.json", ML_MODELS_DIR, dir);
    ml_model *m = NULL;
    ml_error e;
    if (ml_model_load_hf(path, NULL, &m, &e) != ML_OK)
        fail_msg("%s:%u:%u: %s", e.path, e.line, e.col, e.msg);
    return m;
}

/* fn(m, arg) for every shipped model: each preset, models/NAME.yaml, then
 * each config, models/hf/DIR/config.json (each destroyed after). */
static inline void each_shipped_model(void (*fn)(ml_model *, void *), void *arg)
{
    DIR *dir = opendir(ML_MODELS_DIR);
    assert_non_null(dir);
    for (struct dirent *de; (de = readdir(dir));) {
        size_t len = strlen(de->d_name);
        if (len < 6 || strcmp(de->d_name + len - 5, ".yaml"))
            continue;
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)(len - 5), de->d_name);
        ml_model *m = load_preset(name);
        fn(m, arg);
        ml_model_destroy(m);
    }
    closedir(dir);
    char hf[1024];
    snprintf(hf, sizeof hf, "%s/hf", ML_MODELS_DIR);
    dir = opendir(hf);
    assert_non_null(dir);
    for (struct dirent *de; (de = readdir(dir));) {
        if (de->d_name[0] == '.')
            continue;
        ml_model *m = load_hf_config(de->d_name);
        fn(m, arg);
        ml_model_destroy(m);
    }
    closedir(dir);
}

/* The shipped presets and Hugging Face configs the whole-plan comparisons
 * walk (test_runs.c, test_planner.c): fn(model, arg) on each, every model
 * family among them; returns how many. */
static inline unsigned each_grid_model(void (*fn)(const ml_model *, void *), void *arg)
{
    static const char *const presets[] = {
        "gpt2-small", "gpt2-medium", "llama-2-7b", "llama-3-8b", "olmo-1b", "vit-b16",
        "t5-base",    "mlp2",        "cifar10-resnet", "agnews-classifier", "llava-1.5-7b"};
    static const char *const configs[] = {
        "bert-base-uncased", "deepseek-v2-lite", "falcon-7b",  "gemma-2-2b",     "gemma-2b",
        "gpt2",              "mistral-7b",       "mixtral-8x7b", "phi-3-mini-4k", "pythia-160m",
        "qwen2-0.5b",        "smollm2-135m",     "flan-t5-base"};
    unsigned n = 0;
    for (size_t i = 0; i < sizeof presets / sizeof *presets; i++, n++) {
        ml_model *m = load_preset(presets[i]);
        fn(m, arg);
        ml_model_destroy(m);
    }
    for (size_t i = 0; i < sizeof configs / sizeof *configs; i++, n++) {
        ml_model *m = load_hf_config(configs[i]);
        fn(m, arg);
        ml_model_destroy(m);
    }
    return n;
}

/* m's configuration with the allocator unsimulated: the allocated view
 * that a test's hand-worked figures derive (by default a plan simulates
 * PyTorch's caching allocator and its verdict holds the reserved peak,
 * docs/allocator.md). */
static inline ml_config config_allocated(const ml_model *m)
{
    ml_config c = ml_model_config(m);
    c.device.allocator = ML_ALLOCATOR_NONE;
    return c;
}

/* The first iteration's pass of a plan's simulation events ev[0 .. n): the
 * indices of its mark (*first) and of the next pass's (*end, n: none). */
static inline void first_iteration_pass(const ml_sim_event *ev, size_t n, size_t *first,
                                        size_t *end)
{
    *first = *end = n;
    for (size_t i = 0; i < n; i++)
        if (ev[i].action == ML_SIM_MARK && ev[i].when == ML_RESERVED_FIRST)
            *first = i;
        else if (ev[i].action == ML_SIM_MARK && *first < n && *end == n)
            *end = i;
    assert_true(*first < *end && *end <= n);
}

/* m's configuration on a device of `memory` bytes at micro-batch B, its
 * budget the default (memory less the runtime reserve), with PyTorch's
 * caching allocator simulated: `memledger plan MODEL --device SIZE
 * --micro-batch B`, for the tests of plans near the device's limit. */
static inline ml_config config_on_device(const ml_model *m, uint64_t memory, uint64_t B)
{
    ml_config c = ml_model_config(m);
    c.training.micro_batch = B;
    c.device.present = true;
    c.device.memory = memory;
    c.device.budget = 0;
    c.device.allocator = ML_ALLOCATOR_CACHING;
    return c;
}

/* config_allocated at a precision, micro-batch and sequence length, without
 * a calibration profile: the small shapes of the hand-derived tests. */
static inline ml_config config_at(const ml_model *m, ml_precision p, uint64_t B, uint64_t T)
{
    ml_config c = config_allocated(m);
    c.training.precision = p;
    c.training.micro_batch = B;
    c.training.seq_len = T;
    c.calib = NULL;
    return c;
}

/* Whether c plans (its status; *e the reason), the ledger dropped. */
static inline ml_status status_of(const ml_model *m, const ml_config *c, ml_error *e)
{
    ml_ledger *l = NULL;
    ml_status st = ml_ledger_evaluate(m, c, false, &l, e);
    ml_ledger_destroy(l);
    return st;
}

static inline ml_ledger *eval(const ml_model *m, const ml_config *c, bool events)
{
    ml_ledger *l = NULL;
    ml_error e;
    ml_status st = ml_ledger_evaluate(m, c, events, &l, &e);
    if (st != ML_OK)
        fail_msg("evaluate failed: %s: %s", ml_status_name(st), e.msg);
    return l;
}

/* p written as YAML and read back (the caller destroys the copy), or fail. */
static inline ml_profile *profile_round_trip(const ml_profile *p)
{
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    if (!f || ml_profile_write(f, p) != 0)
        fail_msg("writing the profile failed");
    fclose(f);
    ml_profile *q = NULL;
    ml_error e;
    ml_status st = ml_profile_load_string(buf, len, "round-trip.yaml", &q, &e);
    free(buf);
    if (st != ML_OK)
        fail_msg("reading the profile back failed: %u:%u: %s", e.line, e.col, e.msg);
    return q;
}

/* The block named `name`, or fail. */
static inline const ml_block_info *block_named(const ml_ledger *l, const char *name)
{
    for (size_t i = 0; i < ml_ledger_block_count(l); i++)
        if (strcmp(ml_ledger_block(l, i)->name, name) == 0)
            return ml_ledger_block(l, i);
    fail_msg("no block named %s", name);
    return NULL;
}

/* Whether the file at path holds line (a whole line; no newline in it):
 * the engines' argument and key lists under tests/data. */
static inline bool file_has_line(const char *path, const char *line)
{
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    char buf[256];
    bool found = false;
    while (!found && fgets(buf, sizeof buf, f)) {
        buf[strcspn(buf, "\n")] = '\0';
        found = !strcmp(buf, line);
    }
    fclose(f);
    return found;
}

#endif
