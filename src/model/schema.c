/* Model file schema: walks the YAML tree, checks every key, type and range,
 * and fills an ml_model. Every message names the field, what was expected
 * and, for unknown keys, the closest valid one. */
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/limits.h"
#include "model/schema.h"
#include "model/shape.h"

static const char *const type_names[] = {"decoder", "encoder", "sequential", "encoder-decoder",
                                         "multimodal"};

static ml_status training_uint(ml_error *err, const ml_node *t, const char *key, uint64_t *out)
{
    char full[64];
    snprintf(full, sizeof full, "training.%s", key);
    const ml_uint_limit *l = ml__uint_limit_of(full);
    /* a key whose 0 means "not given" (the table's lowest is then 1)
     * takes 0 in a file too, as ml_config_set does (the reference file
     * shows logits_chunk: 0, Liger's rule) */
    return ml__tree_uint(err, t, key, "training", l->zero_unset ? 0 : l->lo, l->hi, out);
}

/* training's kinds: logits, zero_grad, the ZeRO stage and offload, the
 * precision and the optimizer with its implementation. */
static ml_status training_kinds(ml_error *err, const ml_node *t, ml_training *tr)
{
    ml_status st;
    const char *logits_names[ML_LOGITS_COUNT];
    for (unsigned i = 0; i < ML_LOGITS_COUNT; i++)
        logits_names[i] = ml_logits_name((ml_logits)i);
    unsigned lg = tr->logits;
    if ((st = ml__tree_enum(err, t, "logits", "training", logits_names, ML_LOGITS_COUNT, &lg)))
        return st;
    tr->logits = (ml_logits)lg;
    const char *zg_names[ML_ZERO_GRAD_COUNT];
    for (unsigned i = 0; i < ML_ZERO_GRAD_COUNT; i++)
        zg_names[i] = ml_zero_grad_name((ml_zero_grad)i);
    unsigned zg = tr->zero_grad;
    if ((st = ml__tree_enum(err, t, "zero_grad", "training", zg_names, ML_ZERO_GRAD_COUNT, &zg)))
        return st;
    tr->zero_grad = (ml_zero_grad)zg;
    uint64_t zero = tr->zero;
    if ((st = training_uint(err, t, "zero", &zero)))
        return st;
    tr->zero = (unsigned)zero;
    static const char *const offl[] = {"none", "optimizer", "params"};
    unsigned eo = tr->offload;
    if ((st = ml__tree_enum(err, t, "offload", "training", offl, ML_COUNT(offl), &eo)))
        return st;
    tr->offload = (ml_offload)eo;
    if (tr->offload == ML_OFFLOAD_PARAMS && tr->zero != 3)
        return ml__error_at(err, ml__tree_get(t, "offload"), ML_SCHEMA,
                            "training.offload: params offload needs zero: 3 (parameters sharded and "
                            "gathered per block)");
    static const char *const prec[] = {"fp32", "amp-bf16", "amp-fp16", "bf16-master",
                                       "fp16-master", "bf16"};
    static const char *const opt[] = {"sgd", "sgd-momentum", "adam", "adamw",
                                      "adafactor", "adam-8bit", "lion"};
    static const char *const impl[] = {"for-loop", "foreach", "fused"};
    unsigned e = tr->precision;
    if ((st = ml__tree_enum(err, t, "precision", "training", prec, ML_COUNT(prec), &e)))
        return st;
    tr->precision = (ml_precision)e;
    e = tr->optimizer;
    if ((st = ml__tree_enum(err, t, "optimizer", "training", opt, ML_COUNT(opt), &e)))
        return st;
    tr->optimizer = (ml_optimizer)e;
    e = tr->optimizer_impl;
    if ((st = ml__tree_enum(err, t, "optimizer_impl", "training", impl, ML_COUNT(impl), &e)))
        return st;
    tr->optimizer_impl = (ml_optimizer_impl)e;
    return ML_OK;
}

/* training.checkpoint, ck: a list of block indices, or a policy name. */
static ml_status training_checkpoint(ml_error *err, const ml_node *ck, ml_training *tr)
{
    ml_status st;
    ml_error e2;
    memset(&e2, 0, sizeof e2);
    if (ck->type == ML_NODE_SEQ) {
        ml_checkpoint cp;
        memset(&cp, 0, sizeof cp);
        cp.kind = ML_CKPT_LIST;
        if (ck->count > ML_CKPT_LIST_MAX)
            return ml__error_at(err, ck, ML_RANGE,
                                "training.checkpoint: more than %u blocks listed",
                                ML_CKPT_LIST_MAX);
        for (size_t i = 0; i < ck->count; i++) {
            const ml_node *d = ck->items[i];
            char *end = NULL;
            if (d->type != ML_NODE_SCALAR || !isdigit((unsigned char)d->text[0]))
                return ml__error_at(err, d, ML_SCHEMA,
                                    "training.checkpoint[%zu]: expected a block "
                                    "index (a whole number)",
                                    i);
            errno = 0;
            unsigned long long v = strtoull(d->text, &end, 10);
            if (*end || errno || v >= 0xffffffffull)
                return ml__error_at(err, d, ML_SCHEMA,
                                    "training.checkpoint[%zu]: '%s' is not a block "
                                    "index",
                                    i, d->text);
            if (cp.count && v <= cp.blocks[cp.count - 1])
                return ml__error_at(err, d, ML_SCHEMA, "training.checkpoint[%zu]: list each "
                                    "block once, in ascending order", i);
            cp.blocks[cp.count++] = (uint32_t)v;
        }
        tr->checkpoint = cp;
    } else {
        if ((st = ml__tree_need_scalar(err, ck, "training.checkpoint", "a policy name")))
            return st;
        if ((st = ml_parse_checkpoint(ck->text, &tr->checkpoint, &e2)))
            return ml__error_at(err, ck, ML_SCHEMA, "training.%s", e2.msg);
    }
    return ML_OK;
}

/* training.seq_len or eval_seq_len where the model fixes its sequence
 * (ml_model_check_seq), refused at the key. */
static ml_status fixed_seq(ml_error *err, const ml_node *t, const ml_model *m)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_model_check_seq(m, &m->config.training, &e) == ML_OK)
        return ML_OK;
    const bool eval = !strncmp(e.msg, "training.eval_seq_len", 21);
    return ml__error_at(err, ml__tree_get(t, eval ? "eval_seq_len" : "seq_len"), ML_SCHEMA, "%s",
                        e.msg);
}

static ml_status parse_training(ml_error *err, const ml_node *t, ml_model *m)
{
    static const char *const keys[] = {"micro_batch",    "seq_len",       "grad_accum",
                                       "precision",      "optimizer",     "optimizer_impl",
                                       "checkpoint",     "data_parallel", "zero",
                                       "offload",        "reduce_bucket_size",
                                       "allgather_bucket_size", "logits",
                                       "eval_batch",     "eval_seq_len",  "zero_grad",
                                       "logits_chunk",   "expert_imbalance", "target_len",
                                       "vision_tower",   "engine",        "expert_capacity",
                                       "expert_pad"};
    ml_status st;
    if ((st = ml__tree_need_map(err, t, "training")) ||
        (st = ml__tree_check_keys(err, t, "training", keys, ML_COUNT(keys))))
        return st;
    ml_training *tr = &m->config.training;
    if ((st = training_uint(err, t, "micro_batch", &tr->micro_batch)) ||
        (st = training_uint(err, t, "seq_len", &tr->seq_len)) ||
        (st = training_uint(err, t, "grad_accum", &tr->grad_accum)) ||
        (st = training_uint(err, t, "data_parallel", &tr->data_parallel)) ||
        (st = training_uint(err, t, "reduce_bucket_size", &tr->reduce_bucket)) ||
        (st = training_uint(err, t, "allgather_bucket_size", &tr->allgather_bucket)) ||
        (st = training_uint(err, t, "eval_batch", &tr->eval_batch)) ||
        (st = training_uint(err, t, "eval_seq_len", &tr->eval_seq_len)) ||
        (st = training_uint(err, t, "logits_chunk", &tr->logits_chunk)) ||
        (st = training_uint(err, t, "target_len", &tr->target_len)) ||
        (st = ml__tree_double(err, t, "expert_imbalance", "training", 1, 1e6, false,
                              &tr->expert_imbalance)) ||
        (st = ml__tree_double(err, t, "expert_capacity", "training", 0, 1e6, false,
                              &tr->expert_capacity)) ||
        (st = ml__tree_bool(err, t, "expert_pad", "training", &tr->expert_pad)))
        return st;
    if ((st = training_kinds(err, t, tr)) || (st = ml__schema_vision_tower(err, t, m)) ||
        (st = ml__schema_engine(err, t, tr)))
        return st;
    if (tr->eval_seq_len && !tr->eval_batch)
        return ml__error_at(err, ml__tree_get(t, "eval_seq_len"), ML_SCHEMA,
                            "training.eval_seq_len: needs an evaluation pass: set "
                            "training.eval_batch too, or remove eval_seq_len");
    if (tr->logits_chunk && tr->logits != ML_LOGITS_FUSED)
        return ml__error_at(err, ml__tree_get(t, "logits_chunk"), ML_SCHEMA,
                            "training.logits_chunk: only with logits: fused (the chunked "
                            "linear-cross-entropy); remove it or set logits: fused");
    if ((st = fixed_seq(err, t, m)))
        return st;
    const ml_node *ck = ml__tree_get(t, "checkpoint");
    return ck ? training_checkpoint(err, ck, tr) : ML_OK;
}

/* device.name: a preset (docs/devices.md) whose memory and peaks the
 * section's own keys then override. */
static ml_status device_name(ml_error *err, const ml_node *name, ml_device *dv)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (!name->text || ml_device_preset_apply(name->text, dv, &e))
        return ml__error_at(err, name, ML_SCHEMA, "device.name: %s",
                            name->text ? e.msg : "expected a device name, e.g. h100-sxm");
    return ML_OK;
}

static ml_status parse_device(ml_error *err, const ml_node *d, ml_model *m)
{
    static const char *const keys[] = {"name",        "memory",     "budget",
                                       "runtime_reserve", "peak_tflops", "efficiency",
                                       "fragmentation", "allocator",  "max_split_size",
                                       "interconnect_gbps", "pcie_gbps", "blas_workspace"};
    ml_status st;
    if ((st = ml__tree_need_map(err, d, "device")) ||
        (st = ml__tree_check_keys(err, d, "device", keys, ML_COUNT(keys))))
        return st;
    ml_device *dv = &m->config.device;
    const ml_node *name = ml__tree_get(d, "name");
    if (!name && !ml__tree_get(d, "memory"))
        return ml__error_at(err, d, ML_SCHEMA,
                            "device.memory: missing; give the device capacity, e.g. "
                            "'memory: 8GiB', or its name, e.g. 'name: h100-sxm'");
    if (name && (st = device_name(err, name, dv)))
        return st;
    dv->present = true;
    if ((st = ml__tree_size(err, d, "memory", "device", &dv->memory)) ||
        (st = ml__tree_size(err, d, "budget", "device", &dv->budget)) ||
        (st = ml__tree_size(err, d, "runtime_reserve", "device", &dv->runtime_reserve)) ||
        (st = ml__tree_double(err, d, "peak_tflops", "device", 0, 1e9, false, &dv->peak_tflops)) ||
        (st = ml__tree_double(err, d, "efficiency", "device", 1e-6, 1, false, &dv->efficiency)) ||
        (st = ml__tree_double(err, d, "fragmentation", "device", 0, 1, false,
                              &dv->fragmentation)) ||
        (st = ml__tree_size(err, d, "max_split_size", "device", &dv->max_split_size)) ||
        (st = ml__tree_size_or_zero(err, d, "blas_workspace", "device", &dv->blas_workspace)) ||
        (st = ml__tree_double(err, d, "interconnect_gbps", "device", 1e-6, 1e6, false,
                              &dv->interconnect_gbps)) ||
        (st = ml__tree_double(err, d, "pcie_gbps", "device", 1e-6, 1e6, false, &dv->pcie_gbps)))
        return st;
    const char *alloc_names[ML_ALLOCATOR_COUNT];
    for (unsigned i = 0; i < ML_ALLOCATOR_COUNT; i++)
        alloc_names[i] = ml_allocator_name((ml_allocator)i);
    unsigned ak = dv->allocator;
    if ((st = ml__tree_enum(err, d, "allocator", "device", alloc_names, ML_ALLOCATOR_COUNT, &ak)))
        return st;
    dv->allocator = (ml_allocator)ak;
    /* the simulation's workspace setting without a simulation: refused, as
     * the flag is (max_split_size: once the flags apply, check.c) */
    if (dv->allocator == ML_ALLOCATOR_NONE && ml__tree_get(d, "blas_workspace"))
        return ml__error_at(err, ml__tree_get(d, "blas_workspace"), ML_SCHEMA,
                            "device.blas_workspace: applies to a simulated allocator only, and "
                            "device.allocator is none: remove it, or simulate one "
                            "(allocator: caching or expandable)");
    if (dv->max_split_size && dv->max_split_size < (20ull << 20))
        return ml__error_at(err, ml__tree_get(d, "max_split_size"), ML_RANGE,
                            "device.max_split_size: must be at least 20MiB (PyTorch's "
                            "max_split_size_mb refuses less)");
    if (dv->max_split_size > (1ull << 60))
        return ml__error_at(err, ml__tree_get(d, "max_split_size"), ML_RANGE,
                            "device.max_split_size: must be at most 1 EiB (2^60 B, as "
                            "--max-split-size's 2^40 MiB): no device has a larger block");
    if (dv->budget > dv->memory)
        return ml__error_at(err, ml__tree_get(d, "budget"), ML_RANGE,
                            "device.budget: %s is above device.memory",
                            ml__tree_get(d, "budget")->text);
    if (dv->runtime_reserve >= dv->memory)
        return ml__error_at(
            err,
            ml__tree_get(d, "runtime_reserve") ? ml__tree_get(d, "runtime_reserve")
                                              : ml__tree_get(d, "memory"),
            ML_RANGE,
            "device.runtime_reserve: %s is not below device.memory; set "
            "runtime_reserve to what the CUDA context and libraries take on this device",
            ml__tree_get(d, "runtime_reserve") ? "the reserve" : "the default reserve of 512MiB");
    return ML_OK;
}

/* The configuration keys of the file's training:, device: and parallel:
 * sections and where they are (ml_keypos). */
static void record_positions(ml_model *m, const ml_node *root)
{
    /* the model section's key, for a refusal of the whole layout (the op
     * graph declining a combination of its keys) */
    for (size_t i = 0; root->type == ML_NODE_MAP && i < root->count; i++)
        if (!strcmp(root->keys[i]->text, "model") && m->nkeypos < ML_KEYPOS_MAX) {
            ml_keypos *k = &m->keypos[m->nkeypos++];
            snprintf(k->key, sizeof k->key, "model");
            k->line = root->keys[i]->line, k->col = root->keys[i]->col;
        }
    static const char *const sections[] = {"training", "device", "parallel"};
    for (size_t s = 0; s < ML_COUNT(sections); s++) {
        const ml_node *n = ml__tree_get(root, sections[s]);
        if (!n)
            continue;
        if (n->type == ML_NODE_SCALAR && m->nkeypos < ML_KEYPOS_MAX) {
            ml_keypos *k = &m->keypos[m->nkeypos++];
            snprintf(k->key, sizeof k->key, "%s", sections[s]);
            k->line = n->line, k->col = n->col;
        }
        for (size_t i = 0; n->type == ML_NODE_MAP && i < n->count; i++) {
            if (m->nkeypos >= ML_KEYPOS_MAX)
                return;
            ml_keypos *k = &m->keypos[m->nkeypos];
            int w = snprintf(k->key, sizeof k->key, "%s.%s", sections[s], n->keys[i]->text);
            if (w < 0 || (size_t)w >= sizeof k->key)
                continue; /* no key of ours is that long */
            k->line = n->keys[i]->line, k->col = n->keys[i]->col;
            m->nkeypos++;
        }
    }
}

static ml_status build(ml_error *err, const ml_node *root, ml_model *m)
{
    ml_status st;
    if (!root)
        return ml__error_at(err, NULL, ML_SCHEMA,
                            "the file is empty: expected a mapping with 'name:', "
                            "'model:' and optionally 'training:' and 'device:'");
    if (root->type != ML_NODE_MAP)
        return ml__error_at(err, root, ML_SCHEMA,
                            "top level: expected a mapping with 'name:' and 'model:', "
                            "got %s",
                            ml__tree_type_name(root));
    /* a Hugging Face config.json is YAML too: say what it is and how it
     * is read, before its keys read as mistakes */
    for (size_t i = 0; i < root->count; i++)
        if (!strcmp(root->keys[i]->text, "model_type") ||
            !strcmp(root->keys[i]->text, "architectures"))
            return ml__error_at(err, root->keys[i], ML_SCHEMA,
                                "%s: a Hugging Face config.json's key, and this is not a "
                                "memledger model file: give a config.json with --hf "
                                "(docs/hf.md)",
                                root->keys[i]->text);
    static const char *const keys[] = {"name", "model", "training", "device", "parallel"};
    if ((st = ml__tree_check_keys(err, root, "top level", keys, ML_COUNT(keys))))
        return st;
    const ml_node *name = ml__tree_get(root, "name"), *mm = ml__tree_get(root, "model");
    if (name) {
        if ((st = ml__tree_need_scalar(err, name, "name", "a string")))
            return st;
        if (!name->text[0])
            return ml__error_at(err, name, ML_SCHEMA,
                                "name: empty; give the model a name, or remove the key (the "
                                "file's name is the default)");
        snprintf(m->name, sizeof m->name, "%s", name->text);
    }
    if (!mm)
        return ml__error_at(err, root, ML_SCHEMA,
                            "model: missing; the file needs a 'model:' section");
    if ((st = ml__tree_need_map(err, mm, "model")))
        return st;
    if (!ml__tree_get(mm, "type"))
        return ml__error_at(err, mm, ML_SCHEMA,
                            "model.type: missing; expected decoder, encoder, "
                            "encoder-decoder, multimodal or sequential");
    unsigned e = 0;
    if ((st = ml__tree_enum(err, mm, "type", "model", type_names, ML_COUNT(type_names), &e)))
        return st;
    m->type = e == 4 ? ML_MODEL_DECODER : (ml_model_type)e;
    m->config = ml_config_defaults();
    if (e == 4)
        st = ml__schema_multimodal(err, mm, m);
    else if (m->type == ML_MODEL_SEQUENTIAL)
        st = ml__schema_sequential(err, mm, m);
    else if (m->type == ML_MODEL_ENCDEC)
        st = ml__schema_encdec(err, mm, m);
    else
        st = ml__schema_transformer(err, mm, m);
    if (st)
        return st;
    /* sensible per-model defaults before training: overrides them */
    ml__schema_seq_default(m);
    const ml_node *t = ml__tree_get(root, "training"), *d = ml__tree_get(root, "device");
    if (t && (st = parse_training(err, t, m)))
        return st;
    if (d && (st = parse_device(err, d, m)))
        return st;
    const ml_node *par = ml__tree_get(root, "parallel");
    if (par && (st = ml__schema_parallel(err, par, m)))
        return st;
    record_positions(m, root);
    return ML_OK;
}

ml_status ml__schema_settings(const char *text, size_t len, const char *path, ml_model *m,
                              ml_error *err)
{
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", path);
    ml_node *root = NULL;
    ml_status st = ml__tree_parse(text, len, &root, err);
    if (st)
        return st;
    static const char *const keys[] = {"name", "training", "device", "parallel"};
    if (!root)
        st = ml__error_at(err, NULL, ML_SCHEMA,
                          "the file is empty: expected training: and device: sections");
    else if (root->type != ML_NODE_MAP)
        st = ml__error_at(err, root, ML_SCHEMA,
                          "top level: expected a mapping with training: and device:");
    else if (!(st = ml__tree_check_keys(err, root, "top level", keys, ML_COUNT(keys)))) {
        const ml_node *t = ml__tree_get(root, "training"), *d = ml__tree_get(root, "device"),
                      *n = ml__tree_get(root, "name");
        if (n && n->type == ML_NODE_SCALAR && n->text[0])
            snprintf(m->name, sizeof m->name, "%s", n->text);
        if (t)
            st = parse_training(err, t, m);
        if (!st && d)
            st = parse_device(err, d, m);
        const ml_node *par = ml__tree_get(root, "parallel");
        if (!st && par)
            st = ml__schema_parallel(err, par, m);
        if (!st) {
            m->nkeypos = 0; /* the settings file's, not the config's */
            record_positions(m, root);
        }
    }
    ml__tree_free(root);
    return st;
}

static ml_status load(const char *text, size_t len, const char *path, ml_model **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    memset(err, 0, sizeof *err);
    snprintf(err->path, sizeof err->path, "%s", path ? path : "<input>");
    ml_node *root = NULL;
    ml_status st = ml__tree_parse(text, len, &root, err);
    if (st)
        return st;
    ml_model *m = calloc(1, sizeof *m);
    if (!m) {
        ml__tree_free(root);
        return ml__error_at(err, NULL, ML_NOMEM, "out of memory");
    }
    /* default name: the file name without directories and extension */
    const char *base = path ? strrchr(path, '/') : NULL;
    base = base ? base + 1 : (path ? path : "model");
    snprintf(m->name, sizeof m->name, "%s", base);
    char *dot = strrchr(m->name, '.');
    if (dot && dot != m->name)
        *dot = '\0';
    st = build(err, root, m);
    ml__tree_free(root);
    if (st) {
        ml_model_destroy(m);
        return st;
    }
    *out = m;
    return ML_OK;
}

ml_status ml_model_load_string(const char *text, size_t len, const char *name, ml_model **out,
                               ml_error *err)
{
    return load(text, len, name, out, err);
}

ml_status ml_model_load_file(const char *path, ml_model **out, ml_error *err)
{
    ml_error local;
    if (!err)
        err = &local;
    size_t len = 0;
    char *buf = ml__read_file(path, &len, err);
    char cfg[4096];
    if (!buf && ml__is_folder(path) && ml__is_file(ml__hf_config_in(path, cfg, sizeof cfg)))
        snprintf(err->msg, sizeof err->msg,
                 "a folder, not a model file; it holds a Hugging Face config.json: plan it "
                 "with --hf %s (docs/hf.md)",
                 path);
    if (!buf)
        return err->code;
    ml_status st = load(buf, len, path, out, err);
    free(buf);
    return st;
}

void ml_model_destroy(ml_model *m)
{
    if (!m)
        return;
    ml__layers_free(m->seq, m->nseq);
    free(m);
}

bool ml_model_key_position(const ml_model *m, const char *key, unsigned *line, unsigned *col)
{
    if (!m || !key)
        return false;
    const ml_keypos *whole = NULL;
    for (size_t i = 0; i < m->nkeypos; i++) {
        const ml_keypos *k = &m->keypos[i];
        if (!strcmp(k->key, key)) {
            *line = k->line, *col = k->col;
            return true;
        }
        if (!strcmp(k->key, "parallel") && !strncmp(key, "parallel.", 9))
            whole = k;
    }
    if (!whole)
        return false;
    *line = whole->line, *col = whole->col;
    return true;
}

bool ml_model_locate_error(const ml_model *m, ml_error *e)
{
    char key[64] = "";
    const char *colon = strchr(e->msg, ':');
    if (colon && (size_t)(colon - e->msg) < sizeof key) {
        memcpy(key, e->msg, (size_t)(colon - e->msg));
        key[colon - e->msg] = '\0';
    }
    if (ml_model_key_position(m, key, &e->line, &e->col))
        return true;
    e->line = e->col = 0;
    return false;
}

const char *ml_model_name(const ml_model *m)
{
    return m->name;
}

ml_config ml_model_config(const ml_model *m)
{
    return m->config;
}

uint64_t ml_device_budget(const ml_device *d)
{
    return d->budget ? d->budget : d->memory - d->runtime_reserve;
}

uint64_t ml_device_limit(const ml_device *d)
{
    uint64_t avail = d->memory - d->runtime_reserve;
    return d->fragmentation > 0 ? (uint64_t)((double)avail / (1 + d->fragmentation)) : avail;
}
