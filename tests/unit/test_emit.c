/* --emit: the emitted settings carry the plan's values. */
#include <stdlib.h>

#include "harness.h"

static char *emit(const char *kind, const ml_model *m, const ml_config *c)
{
    ml_ledger *l = eval(m, c, false);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_int_equal(ml_report_emit(f, kind, m, c, l), 0);
    fclose(f);
    ml_ledger_destroy(l);
    return buf;
}

static void has(const char *text, const char *part)
{
    if (!strstr(text, part))
        fail_msg("missing '%s' in:\n%s", part, text);
}

static void lacks(const char *text, const char *part)
{
    if (strstr(text, part))
        fail_msg("unexpected '%s' in:\n%s", part, text);
}

static void test_deepspeed(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-medium");
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 4;
    c.training.grad_accum = 8;
    c.training.data_parallel = 2;
    c.training.zero = 2;
    c.training.precision = ML_PREC_AMP_BF16;
    ml_parse_checkpoint("every-4", &c.training.checkpoint, NULL);
    char *t = emit("deepspeed", m, &c);
    has(t, "\"train_micro_batch_size_per_gpu\": 4,");
    has(t, "\"gradient_accumulation_steps\": 8,");
    has(t, "\"train_batch_size\": 64,"); /* 4 x 8 x 2 */
    has(t, "\"bf16\": {\"enabled\": true}");
    has(t, "\"fp16\": {\"enabled\": false}");
    has(t, "\"stage\": 2,");
    has(t, "\"number_checkpoints\": 6"); /* 24 blocks in segments of 4 */
    lacks(t, "offload");
    free(t);
    c.training.zero = 3;
    c.training.offload = ML_OFFLOAD_PARAMS;
    c.training.precision = ML_PREC_FP16_MASTER;
    c.training.checkpoint.kind = ML_CKPT_NONE;
    t = emit("deepspeed", m, &c);
    has(t, "\"stage\": 3,");
    has(t, "\"offload_optimizer\": {\"device\": \"cpu\"");
    has(t, "\"offload_param\": {\"device\": \"cpu\"");
    has(t, "\"fp16\": {\"enabled\": true, \"loss_scale\": 0}");
    has(t, "\"number_checkpoints\": 0");
    free(t);
    ml_model_destroy(m);
}

static void test_hf_trainer_and_torch(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 4;
    c.training.grad_accum = 16;
    c.training.precision = ML_PREC_AMP_BF16;
    c.training.checkpoint.kind = ML_CKPT_FULL;
    c.training.optimizer_impl = ML_IMPL_FUSED;
    char *t = emit("hf-trainer", m, &c);
    has(t, "--per_device_train_batch_size 4");
    has(t, "--gradient_accumulation_steps 16");
    has(t, "--gradient_checkpointing");
    has(t, "--bf16");
    has(t, "--optim adamw_torch_fused");
    lacks(t, "--fp16");
    lacks(t, "--deepspeed");
    free(t);
    c.training.checkpoint.kind = ML_CKPT_NONE;
    t = emit("hf-trainer", m, &c);
    lacks(t, "--gradient_checkpointing");
    free(t);
    /* torch: the segments of every-4 over 12 blocks */
    ml_parse_checkpoint("every-4", &c.training.checkpoint, NULL);
    t = emit("torch", m, &c);
    has(t, "MICRO_BATCH = 4\n");
    has(t, "GRAD_ACCUM = 16\n");
    has(t, "CHECKPOINT_SEGMENTS = [(0, 3), (4, 7), (8, 11)]");
    has(t, "AMP_DTYPE = torch.bfloat16");
    has(t, "torch.autocast(\"cuda\", dtype=AMP_DTYPE)");
    has(t, "optimizer.zero_grad(set_to_none=True)");
    free(t);
    /* an explicit list */
    ml_parse_checkpoint("[2, 5]", &c.training.checkpoint, NULL);
    t = emit("torch", m, &c);
    has(t, "CHECKPOINT_SEGMENTS = [(2, 2), (5, 5)]");
    free(t);
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
    ml_parse_checkpoint("[0]", &c.training.checkpoint, NULL);
    static const char *const kinds[] = {"torch", "hf-trainer", "deepspeed"};
    for (size_t k = 0; k < 3; k++) {
        char *t = emit(kinds[k], m, &c);
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
        cmocka_unit_test(test_hf_trainer_and_torch),
        cmocka_unit_test(test_name_cannot_inject),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
