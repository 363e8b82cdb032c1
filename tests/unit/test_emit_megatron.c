/* --emit megatron: every flag written is one Megatron-LM's pretrain_gpt.py
 * defines (tests/data/megatron-arguments.txt, made by
 * scripts/megatron-arguments.py from megatron/training/arguments.py at the
 * commit its first line names), with the plan's values. */
#include "harness.h"

#define ARGS ML_MODELS_DIR "/../tests/data/megatron-arguments.txt"

static char *emitted(const ml_model *m, const ml_config *c)
{
    ml_ledger *l = eval(m, c, false);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(ml_report_emit(f, "megatron", m, c, l), 0);
    fclose(f);
    ml_ledger_destroy(l);
    return buf;
}

/* Every "--flag" of the output is Megatron's; returns how many. */
static size_t check_flags(const char *out)
{
    size_t n = 0;
    for (const char *p = out; (p = strstr(p, "\n--")); p++) {
        char flag[128];
        size_t k = strcspn(p + 1, " \n");
        assert_true(k < sizeof flag);
        memcpy(flag, p + 1, k);
        flag[k] = '\0';
        if (!file_has_line(ARGS, flag))
            fail_msg("%s is not a pretrain_gpt.py flag", flag);
        n++;
    }
    return n;
}

/* Fails unless out holds each of want[0 .. n). */
static void expect_all(const char *out, const char *const *want, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (!strstr(out, want[i]))
            fail_msg("lacks '%s' in:\n%s", want[i], out);
}

static const char *gpt =
    "model:\n  type: decoder\n  layers: 96\n  hidden: 12288\n  heads: 96\n  ffn: 49152\n"
    "  activation: gelu\n  norm: layernorm\n  vocab: 51200\n  max_positions: 2048\n"
    "  position: learned\n  tied_embeddings: false\n  bias: true\n  attention: eager\n"
    "  dropout: 0.1\ntraining:\n  micro_batch: 1\n  seq_len: 2048\n  grad_accum: 64\n"
    "  precision: bf16-master\n  optimizer: adamw\n  engine: megatron\n"
    "  checkpoint: selective\n  zero: 1\n"
    "parallel: tp8.pp8.vpp3.dp2\n";

static void test_gpt3(void **state)
{
    (void)state;
    ml_model *m = load_str(gpt);
    ml_config c = ml_model_config(m);
    char *out = emitted(m, &c);
    assert_true(check_flags(out) >= 20);
    static const char *want[] = {"--num-layers 96 ", "--hidden-size 12288 ",
                                 "--num-attention-heads 96 ", "--ffn-hidden-size 49152 ",
                                 "--micro-batch-size 1 ", "--global-batch-size 128 ",
                                 "--tensor-model-parallel-size 8 ", "--sequence-parallel ",
                                 "--pipeline-model-parallel-size 8 ",
                                 "--num-virtual-stages-per-pipeline-rank 3 ",
                                 "--use-distributed-optimizer ", "--bf16 ",
                                 "--recompute-granularity selective\n",
                                 "--untie-embeddings-and-output-weights "};
    expect_all(out, want, sizeof want / sizeof want[0]);
    free(out);
    ml_model_destroy(m);
}

static void test_llama_and_refusals(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-2-7b");
    ml_config c = ml_model_config(m);
    c.training.tensor_parallel = 2;
    c.training.checkpoint.kind = ML_CKPT_EVERY;
    c.training.checkpoint.every = 2;
    char *out = emitted(m, &c);
    check_flags(out);
    assert_non_null(strstr(out, "--swiglu "));
    assert_non_null(strstr(out, "--normalization RMSNorm "));
    assert_non_null(strstr(out, "--recompute-method uniform "));
    assert_non_null(strstr(out, "--recompute-num-layers 2\n"));
    /* eager layers: written, with the note */
    assert_non_null(strstr(out, "eager PyTorch's layers"));
    free(out);
    /* fp32: Megatron's default dtype (arguments.py: params_dtype
     * torch.float without --fp16 or --bf16), neither flag written */
    c.training.precision = ML_PREC_FP32;
    out = emitted(m, &c);
    check_flags(out);
    assert_null(strstr(out, "--bf16"));
    assert_null(strstr(out, "--fp16"));
    assert_non_null(strstr(out, "--tensor-model-parallel-size 2 "));
    free(out);
    /* refused, nothing written: GPipe (Megatron runs 1F1B), autocast */
    c.training.pipeline_parallel = 2;
    c.training.pp_schedule = ML_PP_GPIPE;
    ml_ledger *l = eval(m, &c, false);
    FILE *f = fopen("/dev/null", "w");
    assert_non_null(f);
    assert_int_equal(ml_report_emit(f, "megatron", m, &c, l), -3);
    ml_ledger_destroy(l);
    c.training.pp_schedule = ML_PP_1F1B;
    c.training.precision = ML_PREC_AMP_BF16;
    l = eval(m, &c, false);
    assert_int_equal(ml_report_emit(f, "megatron", m, &c, l), -3);
    ml_ledger_destroy(l);
    /* an uneven split: the first and last stages set apart (7 and 7 of 32
     * over 4 stages, the middle two 9 each) is Megatron's
     * --decoder-first/last-pipeline-num-layers; middle stages that differ
     * (7, 8, 10, 7) are not */
    c = ml_model_config(m);
    c.training.pipeline_parallel = 4;
    c.training.checkpoint.kind = ML_CKPT_FULL;
    const uint32_t split[4] = {7, 9, 9, 7}, other[4] = {7, 8, 10, 7};
    memcpy(c.training.pp_layers, split, sizeof split);
    c.training.npp_layers = 4;
    out = emitted(m, &c);
    check_flags(out);
    assert_non_null(strstr(out, "--decoder-first-pipeline-num-layers 7 "));
    assert_non_null(strstr(out, "--decoder-last-pipeline-num-layers 7 "));
    free(out);
    memcpy(c.training.pp_layers, other, sizeof other);
    l = eval(m, &c, false);
    assert_int_equal(ml_report_emit(f, "megatron", m, &c, l), -3);
    ml_ledger_destroy(l);
    fclose(f);
    ml_model_destroy(m);
}

/* Qwen2's biases on q, k and v alone: --disable-bias-linear with
 * --add-qkv-bias, so that none is dropped. */
static void test_qkv_bias(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("qwen2-0.5b");
    ml_config c = ml_model_config(m);
    c.training.precision = ML_PREC_BF16_MASTER;
    char *out = emitted(m, &c);
    check_flags(out);
    assert_non_null(strstr(out, "--disable-bias-linear \\\n--add-qkv-bias "));
    free(out);
    ml_model_destroy(m);
}

/* Mixtral 8x7B as Megatron's example runs it (pp 4, ep 8, the distributed
 * optimizer: examples/mixtral/train_mixtral_8x7b_distributed.sh) on 32
 * devices: its experts (8, top-2, each 14,336 wide), the all-to-all
 * dispatcher, ep 8; Mixtral's renormalised top-k is Megatron's default
 * router (no --moe-router-pre-softmax), and the note on the experts'
 * weighting. Qwen1.5-MoE keeps its top-k unnormalised (pre-softmax) and a
 * gated shared expert of 5,632. DeepSeek's experts are refused. */
static void test_experts(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("mixtral-8x7b");
    ml_config c = ml_model_config(m);
    c.training.precision = ML_PREC_BF16_MASTER;
    c.training.pipeline_parallel = 4;
    c.training.data_parallel = 8;
    c.training.expert_parallel = 8;
    c.training.zero = 1;
    char *out = emitted(m, &c);
    check_flags(out);
    static const char *want[] = {"--num-experts 8 ", "--moe-router-topk 2 ",
                                 "--moe-ffn-hidden-size 14336 ",
                                 "--moe-token-dispatcher-type alltoall ",
                                 "--expert-model-parallel-size 8 ",
                                 "--use-distributed-optimizer ", "Hugging Face's SwiGLU"};
    expect_all(out, want, sizeof want / sizeof want[0]);
    assert_null(strstr(out, "--moe-router-pre-softmax"));
    free(out);
    /* tensor parallelism with the experts: their width over etp ranks,
     * tp's by default */
    c.training.pipeline_parallel = 1;
    c.training.tensor_parallel = 2;
    c.training.data_parallel = 4;
    c.training.expert_parallel = 4;
    c.training.expert_capacity = 1.25;
    c.training.expert_pad = true;
    out = emitted(m, &c);
    check_flags(out);
    static const char *tp[] = {"--tensor-model-parallel-size 2 ", "--sequence-parallel ",
                               "--expert-model-parallel-size 4 ",
                               "--expert-tensor-parallel-size 2 ",
                               "--moe-expert-capacity-factor 1.25 ",
                               "--moe-pad-expert-input-to-capacity "};
    expect_all(out, tp, sizeof tp / sizeof tp[0]);
    free(out);
    ml_model_destroy(m);
    m = load_hf_config("qwen1.5-moe-a2.7b");
    c = ml_model_config(m);
    c.training.precision = ML_PREC_BF16_MASTER;
    out = emitted(m, &c);
    check_flags(out);
    assert_non_null(strstr(out, "--moe-router-pre-softmax "));
    assert_non_null(strstr(out, "--moe-shared-expert-intermediate-size 5632 "));
    assert_non_null(strstr(out, "--moe-shared-expert-gate "));
    assert_non_null(strstr(out, "--expert-model-parallel-size 1 "));
    free(out);
    ml_model_destroy(m);
    m = load_hf_config("deepseek-v2-lite");
    c = ml_model_config(m);
    c.training.precision = ML_PREC_BF16_MASTER;
    ml_ledger *l = eval(m, &c, false);
    FILE *f = fopen("/dev/null", "w");
    assert_non_null(f);
    assert_int_equal(ml_report_emit(f, "megatron", m, &c, l), -3);
    fclose(f);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_gpt3),
                                       cmocka_unit_test(test_llama_and_refusals),
                                       cmocka_unit_test(test_qkv_bias),
                                       cmocka_unit_test(test_experts)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
