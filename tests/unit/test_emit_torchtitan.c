/* --emit torchtitan: every key written is one torchtitan's JobConfig
 * defines (tests/data/torchtitan-job-config.txt, made by
 * scripts/torchtitan-job-config.py from torchtitan/config/job_config.py at
 * the commit its first line names, v0.2.2: an unknown key is an error
 * there), with the plan's values, derived here from torchtitan's rules; and
 * the plans torchtitan would run otherwise are refused. */
#include "harness.h"

#define KEYS ML_MODELS_DIR "/../tests/data/torchtitan-job-config.txt"

static char *emitted(const ml_model *m, const ml_config *c, int *rc)
{
    ml_ledger *l = eval(m, c, false);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    *rc = ml_report_emit(f, "torchtitan", m, c, l);
    fclose(f);
    ml_ledger_destroy(l);
    return buf;
}

/* Every `key = value` line under a [section] is section.key of the list;
 * returns how many (an array's continuation lines, indented or a closing
 * bracket, are its value's). */
static size_t check_keys(const char *out)
{
    char section[64] = "";
    size_t n = 0;
    for (const char *p = out; *p;) {
        size_t len = strcspn(p, "\n");
        if (*p == '[' && len < sizeof section + 2) {
            memcpy(section, p + 1, len - 2);
            section[len - 2] = '\0';
        } else if (len && *p != '#' && *p != ' ' && *p != ']') {
            char key[192];
            size_t k = strcspn(p, " =");
            assert_true(k < 100 && *section);
            snprintf(key, sizeof key, "%s.%.*s", section, (int)k, p);
            if (!file_has_line(KEYS, key))
                fail_msg("%s is not a key of torchtitan's job config", key);
            n++;
        }
        p += len + (p[len] == '\n');
    }
    return n;
}

static void has(const char *out, const char *want)
{
    if (!strstr(out, want))
        fail_msg("lacks '%s' in:\n%s", want, out);
}

static ml_config llama3(const ml_model *m)
{
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 2;
    c.training.grad_accum = 4;
    c.training.seq_len = 4096;
    c.training.zero = 3;
    c.training.data_parallel = 8;
    c.training.checkpoint.kind = ML_CKPT_FULL;
    c.device.allocator = ML_ALLOCATOR_EXPANDABLE; /* run_train.sh's */
    return c;
}

/* FSDP over 8 ranks, then HSDP (2 replicas of 4): the batches (local 2, 2
 * x 4 micro-batches x 8 ranks = 64 a step, torchtitan's accumulation
 * global / (local x dp) = 4), the degrees, the 8B flavor by its sizes */
static void test_fsdp_and_hsdp(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-3-8b");
    ml_config c = llama3(m);
    int rc;
    char *out = emitted(m, &c, &rc);
    assert_int_equal(rc, 0);
    assert_true(check_keys(out) >= 16);
    static const char *want[] = {
        "[model]\nname = \"llama3\"\nflavor = \"8B\"\n",
        "local_batch_size = 2\nglobal_batch_size = 64\nseq_len = 4096\n",
        "mixed_precision_param = \"bfloat16\"\n",
        "data_parallel_replicate_degree = 1\ndata_parallel_shard_degree = 8\n",
        "fsdp_reshard_after_forward = \"always\"\n",
        "tensor_parallel_degree = 1\npipeline_parallel_degree = 1\n",
        "context_parallel_degree = 1\n",
        "[activation_checkpoint]\nmode = \"full\"\n",
        "[optimizer]\nname = \"AdamW\"\n"};
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        has(out, want[i]);
    /* no run_train.sh note: the plan assumed its expandable segments */
    assert_null(strstr(out, "run_train.sh launches"));
    free(out);
    c.training.dp_shard = 4;
    out = emitted(m, &c, &rc);
    check_keys(out);
    has(out, "data_parallel_replicate_degree = 2\ndata_parallel_shard_degree = 4\n");
    free(out);
    ml_model_destroy(m);
}

/* tp 2 x pp 2 (interleaved, 2 virtual stages) x dp 2: a pipeline's 4
 * micro-batches of 2 are one local batch of 8 (local / microbatch_size =
 * 4), 8 x 2 ranks a step; the 32 layers even over 2 x 2 stage chunks: 8
 * each, no layer's worth for the embedding or the head */
static void test_pipeline(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-3-8b");
    ml_config c = llama3(m);
    c.training.tensor_parallel = 2;
    c.training.pipeline_parallel = 2;
    c.training.virtual_stages = 2;
    c.training.pp_schedule = ML_PP_INTERLEAVED;
    c.training.data_parallel = 2;
    int rc;
    char *out = emitted(m, &c, &rc);
    assert_int_equal(rc, 0);
    check_keys(out);
    has(out, "local_batch_size = 8\nglobal_batch_size = 16\n");
    has(out, "tensor_parallel_degree = 2\npipeline_parallel_degree = 2\n"
             "pipeline_parallel_schedule = \"Interleaved1F1B\"\n"
             "pipeline_parallel_microbatch_size = 2\n"
             "pipeline_parallel_first_stage_less_layers = 0\n"
             "pipeline_parallel_last_stage_less_layers = 0\n"
             "pipeline_parallel_layers_per_stage = 8\n");
    free(out);
    /* an uneven split, stage by stage: 7, 9, 9, 7 layers */
    c.training.virtual_stages = 1;
    c.training.pp_schedule = ML_PP_1F1B;
    c.training.pipeline_parallel = 4;
    const uint32_t split[4] = {7, 9, 9, 7};
    memcpy(c.training.pp_layers, split, sizeof split);
    c.training.npp_layers = 4;
    out = emitted(m, &c, &rc);
    check_keys(out);
    has(out, "module_fqns_per_model_part = [\n  [\"tok_embeddings\", \"layers.0\", ");
    has(out, "\"layers.6\"],\n  [\"layers.7\", ");
    has(out, "\"layers.31\", \"norm\", \"output\"],\n]\n");
    assert_null(strstr(out, "layers_per_stage"));
    free(out);
    ml_model_destroy(m);
}

/* Layers 1, 3, 5, ... checkpointed each alone: torchtitan's
 * selective_ac_option "2" (its counter wraps block i where (i + 1) % 2 ==
 * 0); every third: "3"; none; and pairs of layers (every-2 segments),
 * which torchtitan cannot run, refused */
static void test_checkpoints(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-3-8b");
    ml_config c = llama3(m);
    c.training.checkpoint.kind = ML_CKPT_LIST;
    c.training.checkpoint.count = 16;
    for (uint32_t i = 0; i < 16; i++)
        c.training.checkpoint.blocks[i] = 2 * i + 1;
    int rc;
    char *out = emitted(m, &c, &rc);
    check_keys(out);
    has(out, "mode = \"selective\"\nselective_ac_option = \"2\"\n");
    free(out);
    c.training.checkpoint.count = 10;
    for (uint32_t i = 0; i < 10; i++)
        c.training.checkpoint.blocks[i] = 3 * i + 2;
    out = emitted(m, &c, &rc);
    has(out, "selective_ac_option = \"3\"\n");
    free(out);
    c.training.checkpoint.kind = ML_CKPT_NONE;
    out = emitted(m, &c, &rc);
    has(out, "mode = \"none\"\n");
    free(out);
    c.training.checkpoint.kind = ML_CKPT_EVERY;
    c.training.checkpoint.every = 2;
    out = emitted(m, &c, &rc);
    assert_int_equal(rc, -3);
    free(out);
    c.training.checkpoint.kind = ML_CKPT_SELECTIVE;
    out = emitted(m, &c, &rc);
    assert_int_equal(rc, -3);
    free(out);
    ml_model_destroy(m);
}

/* What torchtitan would run otherwise: nothing written */
static void test_refusals(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-3-8b");
    int rc;
    char *out;
    ml_config c = llama3(m);
    c.training.zero = 1; /* ZeRO-1: FSDP or DDP only */
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    c = llama3(m);
    c.training.precision = ML_PREC_AMP_BF16; /* FSDP casts, not autocast */
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    c = llama3(m);
    c.training.zero = 0;
    c.training.tensor_parallel = 2; /* DDP with TP */
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    c = llama3(m);
    c.training.tensor_parallel = 2;
    c.training.seq_len = 4098; /* not a multiple of 2 x tp x cp = 4 */
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    c = llama3(m);
    c.training.precision = ML_PREC_FP16_MASTER;
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    c = llama3(m);
    c.training.precision = ML_PREC_FP32; /* sdpa's math kernel in fp32 */
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    c = llama3(m);
    c.training.zero = 0; /* (fused logits are planned without sharded gradients) */
    c.training.data_parallel = 1;
    c.training.precision = ML_PREC_BF16;
    c.training.micro_batch = 1;
    c.training.seq_len = 256;
    free(emitted(m, &c, &rc)); /* written with released logits */
    assert_int_equal(rc, 0);
    c.training.logits = ML_LOGITS_FUSED; /* a plain cross-entropy */
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    c = llama3(m);
    c.training.dp_shard = 1; /* ZeRO 3 over groups of one: torchtitan's DDP */
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    /* DDP alone, with amp-bf16 (autocast): written, with its buckets' note */
    c = llama3(m);
    c.training.zero = 0;
    c.training.precision = ML_PREC_AMP_BF16;
    c.training.micro_batch = 1;
    c.training.seq_len = 256;
    out = emitted(m, &c, &rc);
    check_keys(out);
    has(out, "data_parallel_replicate_degree = 8\ndata_parallel_shard_degree = 1\n");
    has(out, "100 MB");
    free(out);
    ml_model_destroy(m);
    /* GPT-2 (LayerNorm, GeLU, biases) is not torchtitan's llama3 */
    m = load_preset("gpt2-small");
    c = ml_model_config(m);
    free(emitted(m, &c, &rc));
    assert_int_equal(rc, -3);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fsdp_and_hsdp),
        cmocka_unit_test(test_pipeline),
        cmocka_unit_test(test_checkpoints),
        cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
