/* --emit: the emitted settings carry the plan's values, each precision and
 * optimizer maps to what runs it in the target, and a plan a target cannot
 * run is refused with nothing written (docs/hf.md, "--emit"). */
#include <stdlib.h>

#include "harness.h"
#include "report/report_internal.h"

/* A decoder of 4 blocks: small enough to evaluate many times. */
/* attention: sdpa, transformers' own choice on a GPU, so that Trainer's
 * flags carry the whole plan (test_hf_attention covers the others) */
static const char tiny[] = "name: tiny\n"
                           "model:\n  type: decoder\n  layers: 4\n  hidden: 64\n  heads: 4\n"
                           "  vocab: 128\n  max_positions: 32\n  attention: sdpa\n"
                           "training:\n  micro_batch: 2\n  seq_len: 16\n";

/* The emitted text (the caller frees it), or NULL when refused; *level and
 * why from ml__report_emit_check, which must agree with ml_report_emit. */
static char *emit_v(const char *kind, const ml_model *m, const ml_config *c, int *level,
                    char *why, size_t size)
{
    ml_ledger *l = eval(m, c, false);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    int lv = ml__report_emit_check(kind, m, c, l, why, size);
    int rc = ml_report_emit(f, kind, m, c, l);
    fclose(f);
    ml_ledger_destroy(l);
    if (level)
        *level = lv;
    if (lv == ML_EMIT_REFUSED) {
        assert_int_equal(rc, -3);
        assert_int_equal(len, 0); /* nothing written */
        free(buf);
        return NULL;
    }
    assert_int_equal(rc, 0);
    return buf;
}

/* The text of an exact emission. */
static char *emit(const char *kind, const ml_model *m, const ml_config *c)
{
    int level;
    char why[2048];
    char *t = emit_v(kind, m, c, &level, why, sizeof why);
    if (level != ML_EMIT_EXACT)
        fail_msg("%s: level %d, expected exact: %s", kind, level, why);
    return t;
}

/* The reason a plan is refused; fails when it is not. */
static void refused(const char *kind, const ml_model *m, const ml_config *c, const char *part)
{
    int level;
    char why[2048];
    char *t = emit_v(kind, m, c, &level, why, sizeof why);
    if (t)
        fail_msg("%s: written, expected a refusal with '%s':\n%s", kind, part, t);
    if (!strstr(why, part))
        fail_msg("%s: reason '%s' lacks '%s'", kind, why, part);
}

/* Written, with a note holding `part` (exit status 4). */
static char *partial(const char *kind, const ml_model *m, const ml_config *c, const char *part)
{
    int level;
    char why[2048];
    char *t = emit_v(kind, m, c, &level, why, sizeof why);
    if (level != ML_EMIT_PARTIAL)
        fail_msg("%s: level %d, expected partial with '%s': %s", kind, level, part, why);
    if (!strstr(why, part))
        fail_msg("%s: notes '%s' lack '%s'", kind, why, part);
    return t;
}

static void has(const char *text, const char *part)
{
    if (!text || !strstr(text, part))
        fail_msg("missing '%s' in:\n%s", part, text ? text : "(no output)");
}

static void lacks(const char *text, const char *part)
{
    if (!text || strstr(text, part))
        fail_msg("unexpected '%s' in:\n%s", part, text ? text : "(no output)");
}

static ml_config tiny_config(const ml_model *m, ml_precision p, ml_optimizer o,
                             ml_optimizer_impl i)
{
    ml_config c = ml_model_config(m);
    c.training.precision = p;
    c.training.optimizer = o;
    c.training.optimizer_impl = i;
    return c;
}

static void test_deepspeed(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-medium");
    assert_int_equal(ml_model_set_attention(m, "sdpa", NULL), ML_OK); /* as tiny */
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 4;
    c.training.grad_accum = 8;
    c.training.data_parallel = 2;
    c.training.zero = 2;
    c.training.precision = ML_PREC_AMP_BF16;
    char *t = emit("deepspeed", m, &c);
    has(t, "\"train_micro_batch_size_per_gpu\": 4,");
    has(t, "\"gradient_accumulation_steps\": 8,");
    has(t, "\"train_batch_size\": 64,"); /* 4 x 8 x 2 */
    has(t, "\"stage\": 2,");
    lacks(t, "offload");
    lacks(t, "activation_checkpointing");
    free(t);
    c.training.zero = 3;
    c.training.offload = ML_OFFLOAD_PARAMS;
    c.training.precision = ML_PREC_FP16_MASTER;
    t = emit("deepspeed", m, &c);
    has(t, "\"stage\": 3,");
    has(t, "\"offload_optimizer\": {\"device\": \"cpu\"");
    has(t, "\"offload_param\": {\"device\": \"cpu\"");
    has(t, "\"fp16\": {\"enabled\": true, \"loss_scale\": 0}");
    /* offloaded: DeepSpeed's host AdamW (no torch_adam) */
    has(t, "\"optimizer\": {\"type\": \"AdamW\", \"params\": {}}");
    free(t);
    ml_model_destroy(m);
}

/* amp-* is torch.autocast on fp32 parameters (DeepSpeed's torch_autocast),
 * *-master the model in low precision with fp32 master weights (its
 * bf16/fp16 modes); pure bf16 has no DeepSpeed setting. */
static void test_deepspeed_precisions(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    static const struct {
        ml_precision p;
        const char *bf16, *fp16, *autocast, *extra;
    } rows[] = {
        {ML_PREC_FP32, "false", "false", NULL, NULL},
        {ML_PREC_AMP_BF16, "false", "false", "bfloat16", NULL},
        {ML_PREC_AMP_FP16, "false", "false", "float16", NULL},
        {ML_PREC_BF16_MASTER, "true", "false", NULL, "\"data_types\": {\"grad_accum_dtype\": \"bf16\"}"},
        {ML_PREC_FP16_MASTER, "false", "true, \"loss_scale\": 0", NULL, NULL},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ml_config c = tiny_config(m, rows[i].p, ML_OPT_ADAMW, ML_IMPL_FOREACH);
        char *t = emit("deepspeed", m, &c);
        char want[200];
        snprintf(want, sizeof want, "\"bf16\": {\"enabled\": %s}", rows[i].bf16);
        has(t, want);
        snprintf(want, sizeof want, "\"fp16\": {\"enabled\": %s}", rows[i].fp16);
        has(t, want);
        if (rows[i].autocast) {
            snprintf(want, sizeof want,
                     "\"torch_autocast\": {\"enabled\": true, \"dtype\": \"%s\", "
                     "\"lower_precision_safe_modules\": []}",
                     rows[i].autocast);
            has(t, want);
        } else {
            lacks(t, "torch_autocast");
        }
        if (rows[i].extra)
            has(t, rows[i].extra);
        else
            lacks(t, "data_types");
        free(t);
    }
    ml_config c = tiny_config(m, ML_PREC_BF16, ML_OPT_ADAMW, ML_IMPL_FOREACH);
    refused("deepspeed", m, &c, "no DeepSpeed setting keeps them in bf16");
    ml_model_destroy(m);
}

/* Each optimizer and implementation: the "optimizer" section DeepSpeed
 * builds it from, ZeRO's untested-optimizer switch, or the note that the
 * client passes it. */
static void test_deepspeed_optimizers(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    static const struct {
        ml_optimizer o;
        ml_optimizer_impl i;
        const char *section; /* NULL: no section, a note */
        bool untested;       /* at ZeRO >= 1 */
    } rows[] = {
        {ML_OPT_ADAMW, ML_IMPL_FOREACH, "{\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, \"foreach\": true}}", false},
        {ML_OPT_ADAMW, ML_IMPL_FOR_LOOP, "{\"type\": \"AdamW\", \"params\": {\"torch_adam\": true, \"foreach\": false}}", false},
        {ML_OPT_ADAMW, ML_IMPL_FUSED, "{\"type\": \"AdamW\", \"params\": {}}", false},
        {ML_OPT_ADAM, ML_IMPL_FOREACH, "{\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false, \"torch_adam\": true, \"foreach\": true}}", false},
        {ML_OPT_ADAM, ML_IMPL_FUSED, "{\"type\": \"Adam\", \"params\": {\"adam_w_mode\": false}}", false},
        {ML_OPT_SGD, ML_IMPL_FOREACH, "{\"type\": \"SGD\", \"params\": {\"momentum\": 0.0, \"foreach\": true}}", true},
        {ML_OPT_SGD_MOMENTUM, ML_IMPL_FUSED, "{\"type\": \"SGD\", \"params\": {\"momentum\": 0.9, \"fused\": true}}", true},
        {ML_OPT_ADAFACTOR, ML_IMPL_FOR_LOOP, "{\"type\": \"Adafactor\", \"params\": {\"foreach\": false}}", true},
        {ML_OPT_LION, ML_IMPL_FUSED, "{\"type\": \"Lion\", \"params\": {}}", false},
        {ML_OPT_LION, ML_IMPL_FOREACH, NULL, true},
        {ML_OPT_ADAM_8BIT, ML_IMPL_FOREACH, NULL, true},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ml_config c = tiny_config(m, ML_PREC_FP32, rows[i].o, rows[i].i);
        c.training.zero = 1;
        c.training.data_parallel = 2;
        char *t;
        if (rows[i].section) {
            t = emit("deepspeed", m, &c);
            char want[300];
            snprintf(want, sizeof want, "\"optimizer\": %s,", rows[i].section);
            has(t, want);
        } else {
            t = partial("deepspeed", m, &c, "pass it to deepspeed.initialize(optimizer=...)");
            lacks(t, "\"optimizer\"");
        }
        if (rows[i].untested)
            has(t, "\"zero_allow_untested_optimizer\": true");
        else
            lacks(t, "zero_allow_untested_optimizer");
        free(t);
    }
    ml_model_destroy(m);
}

static void test_deepspeed_refusals(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = tiny_config(m, ML_PREC_AMP_BF16, ML_OPT_ADAMW, ML_IMPL_FOREACH);
    c.training.offload = ML_OFFLOAD_OPTIMIZER; /* zero 0 */
    refused("deepspeed", m, &c, "DeepSpeed offloads at ZeRO stages 1-3 only");
    c.training.zero = 1;
    c.training.optimizer = ML_OPT_ADAM_8BIT;
    refused("deepspeed", m, &c, "bitsandbytes steps on the GPU");
    /* offloaded Lion: DeepSpeed's host Lion */
    c.training.optimizer = ML_OPT_LION;
    c.training.optimizer_impl = ML_IMPL_FOR_LOOP;
    char *t = emit("deepspeed", m, &c);
    has(t, "\"optimizer\": {\"type\": \"Lion\"");
    lacks(t, "zero_allow_untested_optimizer");
    free(t);
    ml_model_destroy(m);
}

/* A checkpoint plan is the model's code for DeepSpeed: written without
 * activation_checkpointing (whose number_checkpoints chooses no layer),
 * with a note. */
static void test_deepspeed_checkpoint_note(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = tiny_config(m, ML_PREC_BF16_MASTER, ML_OPT_ADAMW, ML_IMPL_FOREACH);
    c.training.zero = 2;
    c.training.data_parallel = 2;
    ml_parse_checkpoint("every-2", &c.training.checkpoint, NULL);
    char *t = partial("deepspeed", m, &c, "number_checkpoints does not choose layers");
    lacks(t, "activation_checkpointing");
    lacks(t, "number_checkpoints");
    free(t);
    c.training.checkpoint.kind = ML_CKPT_SELECTIVE;
    t = partial("deepspeed", m, &c, "checkpointing is the model's code");
    free(t);
    ml_model_destroy(m);
}

static void test_hf_trainer(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    assert_int_equal(ml_model_set_attention(m, "sdpa", NULL), ML_OK); /* as tiny */
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 4;
    c.training.grad_accum = 16;
    c.training.precision = ML_PREC_AMP_BF16;
    c.training.checkpoint.kind = ML_CKPT_FULL;
    c.training.optimizer_impl = ML_IMPL_FUSED;
    c.training.logits = ML_LOGITS_RELEASED;
    char *t = emit("hf-trainer", m, &c);
    has(t, "--per_device_train_batch_size 4");
    has(t, "--gradient_accumulation_steps 16");
    has(t, "--gradient_checkpointing \\\n");
    has(t, "--gradient_checkpointing_kwargs '{\"use_reentrant\": false}'");
    has(t, "--bf16");
    has(t, "--optim adamw_torch_fused");
    lacks(t, "--fp16");
    lacks(t, "--deepspeed");
    free(t);
    c.training.checkpoint.kind = ML_CKPT_NONE;
    t = emit("hf-trainer", m, &c);
    lacks(t, "--gradient_checkpointing");
    free(t);
    /* a list naming every block is "full" */
    ml_parse_checkpoint("[0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11]", &c.training.checkpoint, NULL);
    t = emit("hf-trainer", m, &c);
    has(t, "--gradient_checkpointing");
    free(t);
    /* a subset, segments of several blocks, selective: Trainer cannot */
    static const char *const partial_plans[] = {"[2, 5]", "every-4", "sqrt", "selective"};
    for (size_t i = 0; i < 4; i++) {
        ml_parse_checkpoint(partial_plans[i], &c.training.checkpoint, NULL);
        refused("hf-trainer", m, &c, "Trainer's --gradient_checkpointing checkpoints every layer");
    }
    ml_model_destroy(m);
}

/* Each optimizer and implementation: the --optim that runs it, or the
 * refusal. */
static void test_hf_trainer_optimizers(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    static const struct {
        ml_optimizer o;
        ml_optimizer_impl i;
        const char *flag;    /* NULL: refused */
        const char *reason;
    } rows[] = {
        {ML_OPT_ADAMW, ML_IMPL_FOREACH, "--optim adamw_torch\n", NULL},
        {ML_OPT_ADAMW, ML_IMPL_FUSED, "--optim adamw_torch_fused\n", NULL},
        {ML_OPT_ADAMW, ML_IMPL_FOR_LOOP, NULL, "the plan's for-loop step has no Trainer flag"},
        {ML_OPT_ADAM, ML_IMPL_FOREACH, "--optim adamw_torch \\\n--weight_decay 0\n", NULL},
        {ML_OPT_SGD, ML_IMPL_FOREACH, "--optim sgd\n", NULL},
        {ML_OPT_SGD, ML_IMPL_FUSED, NULL, "plan with --optimizer-impl foreach"},
        {ML_OPT_SGD_MOMENTUM, ML_IMPL_FOREACH, NULL, "SGD without momentum"},
        {ML_OPT_ADAFACTOR, ML_IMPL_FOREACH, NULL, "transformers' Adafactor"},
        {ML_OPT_ADAM_8BIT, ML_IMPL_FOR_LOOP, "--optim adamw_bnb_8bit\n", NULL},
        {ML_OPT_LION, ML_IMPL_FUSED, "--optim lion_32bit\n", NULL},
        {ML_OPT_LION, ML_IMPL_FOREACH, NULL, "Trainer's Lion is bitsandbytes'"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ml_config c = tiny_config(m, ML_PREC_AMP_BF16, rows[i].o, rows[i].i);
        c.training.logits = ML_LOGITS_RELEASED;
        if (!rows[i].flag) {
            refused("hf-trainer", m, &c, rows[i].reason);
            continue;
        }
        char *t = emit("hf-trainer", m, &c);
        has(t, rows[i].flag);
        free(t);
    }
    /* bitsandbytes' 32-bit Lion keeps an fp32 state: not the plan's bf16 */
    ml_config c = tiny_config(m, ML_PREC_BF16, ML_OPT_LION, ML_IMPL_FUSED);
    c.training.logits = ML_LOGITS_RELEASED;
    refused("hf-trainer", m, &c, "keeps an fp32 state");
    ml_model_destroy(m);
}

/* Precision: Trainer's --bf16/--fp16 is autocast; a low-precision model
 * with master weights is DeepSpeed's; a pure bf16 model is loaded so. The
 * plain loop's kept logits are not Trainer's. */
static void test_hf_trainer_precisions(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = tiny_config(m, ML_PREC_AMP_FP16, ML_OPT_ADAMW, ML_IMPL_FOREACH);
    c.training.logits = ML_LOGITS_RELEASED;
    char *t = emit("hf-trainer", m, &c);
    has(t, "--fp16");
    lacks(t, "--deepspeed");
    free(t);
    c.training.zero = 2;
    c.training.data_parallel = 2;
    t = emit("hf-trainer", m, &c); /* autocast from the DeepSpeed config */
    lacks(t, "\n--fp16");
    has(t, "--deepspeed ds_config.json");
    free(t);
    c.training.zero = 0;
    c.training.data_parallel = 1;
    c.training.precision = ML_PREC_BF16_MASTER;
    t = emit("hf-trainer", m, &c);
    has(t, "--bf16");
    has(t, "--deepspeed ds_config.json");
    free(t);
    c.training.precision = ML_PREC_BF16;
    t = partial("hf-trainer", m, &c, "torch_dtype=torch.bfloat16");
    lacks(t, "\n--bf16");
    has(t, "# - precision bf16 is the model's dtype");
    free(t);
    c.training.precision = ML_PREC_FP32;
    c.training.logits = ML_LOGITS_KEPT;
    t = partial("hf-trainer", m, &c, "plan with --logits released");
    free(t);
    c.training.logits = ML_LOGITS_RELEASED;
    c.training.zero_grad = ML_ZERO_GRAD_ZERO;
    t = partial("hf-trainer", m, &c, "--zero-grad set_to_none");
    free(t);
    /* DeepSpeed's refusals are Trainer's with --deepspeed */
    c.training.zero_grad = ML_ZERO_GRAD_SET_TO_NONE;
    c.training.offload = ML_OFFLOAD_OPTIMIZER;
    refused("hf-trainer", m, &c, "its DeepSpeed config: the plan offloads");
    ml_model_destroy(m);
}

/* torch: the optimizer class, its arguments and implementation. */
static void test_torch_optimizers(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    static const struct {
        ml_optimizer o;
        ml_optimizer_impl i;
        const char *ctor, *import;
    } rows[] = {
        {ML_OPT_SGD, ML_IMPL_FOR_LOOP, "torch.optim.SGD(params, lr=LR, momentum=0.0, foreach=False)", NULL},
        {ML_OPT_SGD_MOMENTUM, ML_IMPL_FOREACH, "torch.optim.SGD(params, lr=LR, momentum=0.9, foreach=True)", NULL},
        {ML_OPT_ADAM, ML_IMPL_FUSED, "torch.optim.Adam(params, lr=LR, fused=True)", NULL},
        {ML_OPT_ADAMW, ML_IMPL_FOREACH, "torch.optim.AdamW(params, lr=LR, foreach=True)", NULL},
        {ML_OPT_ADAFACTOR, ML_IMPL_FOR_LOOP, "torch.optim.Adafactor(params, lr=LR, foreach=False)", NULL},
        {ML_OPT_ADAM_8BIT, ML_IMPL_FUSED, "bnb.optim.Adam8bit(params, lr=LR)", "import bitsandbytes as bnb"},
        {ML_OPT_LION, ML_IMPL_FOR_LOOP, "Lion(params, lr=LR)\n", "from lion_pytorch import Lion"},
        {ML_OPT_LION, ML_IMPL_FOREACH, "Lion(params, lr=LR)\n", "from lion_pytorch.foreach import Lion"},
        {ML_OPT_LION, ML_IMPL_FUSED, "Lion(params, lr=LR, use_triton=True)", "from lion_pytorch import Lion"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ml_config c = tiny_config(m, ML_PREC_FP32, rows[i].o, rows[i].i);
        char *t = emit("torch", m, &c);
        has(t, rows[i].ctor);
        if (rows[i].import)
            has(t, rows[i].import);
        if (rows[i].o != ML_OPT_ADAMW)
            lacks(t, "torch.optim.AdamW");
        free(t);
    }
    ml_model_destroy(m);
}

/* torch: each precision's model dtype, autocast, GradScaler and master
 * weights; the device a variable. */
static void test_torch_precisions(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = tiny_config(m, ML_PREC_FP32, ML_OPT_ADAMW, ML_IMPL_FOREACH);
    char *t = emit("torch", m, &c);
    has(t, "DEVICE = \"cuda\"");
    has(t, "    model = model.to(DEVICE)\n");
    lacks(t, "autocast");
    lacks(t, "GradScaler");
    lacks(t, "\"cuda\", dtype");
    free(t);
    c.training.precision = ML_PREC_AMP_BF16;
    t = emit("torch", m, &c);
    has(t, "with torch.autocast(DEVICE, dtype=torch.bfloat16):");
    has(t, "    model = model.to(DEVICE)\n");
    lacks(t, "GradScaler");
    free(t);
    c.training.precision = ML_PREC_AMP_FP16;
    t = emit("torch", m, &c);
    has(t, "with torch.autocast(DEVICE, dtype=torch.float16):");
    has(t, "SCALER = torch.amp.GradScaler(DEVICE)");
    has(t, "SCALER.scale(loss).backward()");
    has(t, "SCALER.step(optimizer)");
    has(t, "SCALER.update()");
    free(t);
    c.training.precision = ML_PREC_BF16;
    t = emit("torch", m, &c);
    has(t, "model = model.to(DEVICE, torch.bfloat16)\n    return model, make_optimizer(");
    lacks(t, "autocast");
    lacks(t, "MasterWeights");
    free(t);
    c.training.precision = ML_PREC_BF16_MASTER;
    t = emit("torch", m, &c);
    has(t, "model = model.to(DEVICE, torch.bfloat16)\n    return model, MasterWeights(model)");
    has(t, "self.master = [p.detach().float() for p in self.params]");
    has(t, "self.groups = [(self.params, self.master, make_optimizer(self.master))]");
    has(t, "m.grad = None if p.grad is None else p.grad.float()");
    lacks(t, "autocast");
    free(t);
    c.training.optimizer_impl = ML_IMPL_FOR_LOOP; /* one fp32 gradient at a time */
    t = emit("torch", m, &c);
    has(t, "self.groups = [([p], [m], make_optimizer([m]))");
    free(t);
    c.training.precision = ML_PREC_FP16_MASTER;
    c.training.optimizer_impl = ML_IMPL_FOREACH;
    t = emit("torch", m, &c);
    has(t, "model = model.to(DEVICE, torch.float16)");
    has(t, "SCALER.step(optimizer)  # unscales the fp32 copies");
    free(t);
    ml_model_destroy(m);
}

static void test_torch_refusals_and_notes(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = tiny_config(m, ML_PREC_AMP_BF16, ML_OPT_ADAMW, ML_IMPL_FOREACH);
    c.training.zero = 1;
    c.training.data_parallel = 2;
    refused("torch", m, &c, "one process on one device");
    c.training.zero = 0;
    c.training.offload = ML_OFFLOAD_OPTIMIZER;
    refused("torch", m, &c, "offload are DeepSpeed's");
    c.training.offload = ML_OFFLOAD_NONE;
    c.training.precision = ML_PREC_BF16_MASTER;
    c.training.optimizer_impl = ML_IMPL_FUSED;
    refused("torch", m, &c, "torch's fused optimizers step parameters in their gradients' dtype");
    c.training.precision = ML_PREC_FP16_MASTER;
    c.training.optimizer_impl = ML_IMPL_FOR_LOOP;
    refused("torch", m, &c, "GradScaler skips an overflowing step per optimizer");
    c.training.precision = ML_PREC_AMP_BF16;
    c.training.optimizer_impl = ML_IMPL_FOREACH;
    char *t = partial("torch", m, &c, "DistributedDataParallel(model, gradient_as_bucket_view=True)");
    has(t, "# - data_parallel 2: one process per device");
    free(t);
    c.training.data_parallel = 1;
    c.training.checkpoint.kind = ML_CKPT_SELECTIVE;
    t = partial("torch", m, &c, "wrap the attention core");
    has(t, "CHECKPOINT_SEGMENTS = []");
    free(t);
    ml_model_destroy(m);
}

/* torch: the segments, the loop's references to the output, zero_grad. */
static void test_torch_loop(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    assert_int_equal(ml_model_set_attention(m, "sdpa", NULL), ML_OK); /* as tiny */
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 4;
    c.training.grad_accum = 16;
    ml_parse_checkpoint("every-4", &c.training.checkpoint, NULL);
    char *t = emit("torch", m, &c);
    has(t, "MICRO_BATCH = 4\n");
    has(t, "GRAD_ACCUM = 16\n");
    has(t, "CHECKPOINT_SEGMENTS = [(0, 3), (4, 7), (8, 11)]\n");
    has(t, "x = checkpoint(run, x, use_reentrant=False)");
    has(t, "out, loss = forward_loss(model, inputs, targets, loss_fn)");
    has(t, "optimizer.zero_grad(set_to_none=True)");
    free(t);
    ml_parse_checkpoint("[2, 5]", &c.training.checkpoint, NULL);
    c.training.logits = ML_LOGITS_RELEASED;
    c.training.zero_grad = ML_ZERO_GRAD_ZERO;
    t = emit("torch", m, &c);
    has(t, "CHECKPOINT_SEGMENTS = [(2, 2), (5, 5)]\n");
    has(t, "loss = forward_loss(model, inputs, targets, loss_fn)[1]");
    lacks(t, "out, loss =");
    has(t, "optimizer.zero_grad(set_to_none=False)");
    free(t);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    t = emit("torch", m, &c);
    has(t, "CHECKPOINT_SEGMENTS = [(0, 0), (1, 1), (2, 2), (3, 3), (4, 4), (5, 5), (6, 6), "
           "(7, 7), (8, 8), (9, 9), (10, 10), (11, 11)]\n");
    free(t);
    ml_model_destroy(m);
}

/* Trainer trains the model the user loads, with sdpa on a GPU unless
 * from_pretrained is told otherwise: a plan of eager or flash attention
 * names the argument, and the settings are partial (exit status 4). */
static void test_hf_attention(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    c.training.logits = ML_LOGITS_RELEASED;
    static const char *const names[2][2] = {{"eager", "attn_implementation=\"eager\""},
                                            {"flash", "attn_implementation=\"flash_attention_2\""}};
    for (int i = 0; i < 2; i++) {
        ml_error e;
        assert_int_equal(ml_model_set_attention(m, names[i][0], &e), ML_OK);
        int level;
        char why[2048];
        char *t = emit_v("hf-trainer", m, &c, &level, why, sizeof why);
        assert_int_equal(level, ML_EMIT_PARTIAL);
        assert_non_null(strstr(why, names[i][1]));
        assert_non_null(strstr(t, names[i][1])); /* a comment in the output too */
        free(t);
    }
    ml_model_destroy(m);
}

static void test_unknown_kind(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    char why[8] = "x";
    assert_int_equal(ml__report_emit_check("fsdp", m, &c, l, why, sizeof why), -2);
    assert_string_equal(why, "");
    assert_int_equal(ml_report_emit(stdout, "fsdp", m, &c, l), -2);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* A model name is data, never code: a newline in it would end the torch
 * snippet's '#' comment and make the rest a Python statement. Every emitted
 * line is checked, for each target, and the output is plain ASCII. */
static void test_name_cannot_inject(void **state)
{
    (void)state;
    ml_model *m = load_str("name: \"x\\nimport os; os.system(\\\"id\\\")\\r\\n#\\xff\\u2028\"\n"
                           "model:\n  type: sequential\n  input: [4]\n"
                           "  layers:\n    - linear: {out: 2}\n  loss: mse\n");
    ml_config c = ml_model_config(m);
    c.training.logits = ML_LOGITS_RELEASED;
    static const char *const kinds[] = {"torch", "hf-trainer", "deepspeed"};
    for (size_t k = 0; k < 3; k++) {
        int level;
        char why[2048];
        ml_parse_checkpoint(k == 1 ? "full" : "[0]", &c.training.checkpoint, NULL);
        char *t = emit_v(kinds[k], m, &c, &level, why, sizeof why);
        assert_non_null(t);
        for (const char *line = t; *line; line = strchr(line, '\n') + 1) {
            if (!strncmp(line, "import os", 9))
                fail_msg("%s: the name became a statement:\n%s", kinds[k], t);
            if (!strchr(line, '\n'))
                fail_msg("%s: no final newline:\n%s", kinds[k], t);
        }
        for (const unsigned char *p = (const unsigned char *)t; *p; p++)
            if ((*p < 0x20 && *p != '\n') || *p >= 0x7f)
                fail_msg("%s: byte 0x%02x in:\n%s", kinds[k], *p, t);
        free(t);
    }
    ml_parse_checkpoint("[0]", &c.training.checkpoint, NULL);
    char *t = emit("torch", m, &c);
    /* the name on the comment line, each odd byte as \xNN (U+2028 is e2 80 a8) */
    has(t, "# memledger plan for x\\x0aimport os; os.system(\"id\")\\x0d\\x0a#\\xc3\\xbf"
           "\\xe2\\x80\\xa8: checkpoint [0]\n");
    free(t);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_deepspeed),
        cmocka_unit_test(test_deepspeed_precisions),
        cmocka_unit_test(test_deepspeed_optimizers),
        cmocka_unit_test(test_deepspeed_refusals),
        cmocka_unit_test(test_deepspeed_checkpoint_note),
        cmocka_unit_test(test_hf_trainer),
        cmocka_unit_test(test_hf_trainer_optimizers),
        cmocka_unit_test(test_hf_trainer_precisions),
        cmocka_unit_test(test_torch_optimizers),
        cmocka_unit_test(test_torch_precisions),
        cmocka_unit_test(test_torch_refusals_and_notes),
        cmocka_unit_test(test_torch_loop),
        cmocka_unit_test(test_hf_attention),
        cmocka_unit_test(test_unknown_kind),
        cmocka_unit_test(test_name_cannot_inject),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
