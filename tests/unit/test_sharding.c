/* ZeRO / FSDP sharding and offload, per device (docs/sharding.md). */
#include "harness.h"

/* 7.5B parameters in one tensor: 50,000 -> 150,000 without bias. */
static const char *zero_model =
    "model:\n  type: sequential\n  input: [50000]\n  layers:\n"
    "    - linear: {out: 150000, bias: false}\n  loss: mse\n"
    "training:\n  precision: bf16-master\n  optimizer: adam\n  optimizer_impl: fused\n"
    "  data_parallel: 64\n";

static uint64_t model_states(const ml_summary *s)
{
    return s->bytes_params + s->bytes_master + s->bytes_grads + s->bytes_optimizer;
}

/* Rajbhandari et al., "ZeRO" (2020), Figure 1: Psi = 7.5B, K = 12 (fp32
 * master + Adam's two states), N = 64:
 *   baseline (2 + 2 + K) Psi            = 120 GB
 *   stage 1  4 Psi + K Psi / N           = 31.4 GB
 *   stage 2  2 Psi + (2 + K) Psi / N     = 16.6 GB
 *   stage 3  (2 + 2 + K) Psi / N         = 1.9 GB   (decimal GB, as in the paper) */
static void test_zero_paper_example(void **state)
{
    (void)state;
    ml_model *m = load_str(zero_model);
    const double psi = 7.5e9;
    const double want[4] = {16 * psi, 4 * psi + 12 * psi / 64, 2 * psi + 14 * psi / 64,
                            16 * psi / 64};
    const double paper_gb[4] = {120, 31.4, 16.6, 1.9};
    for (unsigned z = 0; z <= 3; z++) {
        ml_config c = ml_model_config(m);
        c.training.zero = z;
        ml_ledger *l = eval(m, &c, false);
        const ml_summary *s = ml_ledger_summary(l);
        assert_int_equal(s->params, 7500000000ull);
        assert_rel_close((double)model_states(s), want[z], 1e-12);
        /* the paper rounds to 0.1 GB */
        assert_rel_close(round((double)model_states(s) / 1e8) / 10, paper_gb[z], 1e-12);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

/* Stage 0 with any data-parallel degree is the unsharded ledger. */
static void test_stage0_is_unsharded(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    ml_ledger *a = eval(m, &c, false);
    c.training.data_parallel = 8;
    ml_ledger *b = eval(m, &c, false);
    const ml_summary *sa = ml_ledger_summary(a), *sb = ml_ledger_summary(b);
    assert_int_equal(sa->peak, sb->peak);
    assert_int_equal(model_states(sa), model_states(sb));
    assert_int_equal(sa->bytes_step_temp, sb->bytes_step_temp);
    /* DDP all-reduce: 2 (N-1)/N x P x 4 B each iteration */
    assert_rel_close(sb->comm_bytes, 2.0 * 7 / 8 * 124439808.0 * 4, 1e-12);
    assert_rel_close(sa->comm_bytes, 0, 0);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
    ml_model_destroy(m);
}

/* Communication: ZeRO-3 moves 1.5x DDP's bytes (the paper's 3 Psi vs 2 Psi). */
static void test_communication_volume(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    c.training.precision = ML_PREC_BF16_MASTER;
    c.training.data_parallel = 4;
    double v[4];
    for (unsigned z = 0; z <= 3; z++) {
        c.training.zero = z;
        ml_ledger *l = eval(m, &c, false);
        v[z] = ml_ledger_summary(l)->comm_bytes;
        ml_ledger_destroy(l);
    }
    const double P = 124439808.0, f = 3.0 / 4;
    assert_rel_close(v[0], 2 * f * P * 2, 1e-12);
    assert_rel_close(v[1], v[0], 1e-12);
    assert_rel_close(v[2], v[0], 1e-12);
    assert_rel_close(v[3], 1.5 * v[0], 1e-12);
    /* with accumulation, stage 2 reduce-scatters each micro-batch */
    c.training.zero = 2;
    c.training.grad_accum = 4;
    ml_ledger *l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->comm_bytes, 4 * f * P * 2 + f * P * 2, 1e-12);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* ZeRO-3 gathers each block's parameters: a transient the ledger shows, and
 * the peak stays above the sharded resident state. */
static void test_zero3_gathers_and_offload(void **state)
{
    (void)state;
    ml_model *m = load_preset("llama-2-7b");
    ml_config c = ml_model_config(m);
    c.training.data_parallel = 8;
    c.training.zero = 3;
    ml_ledger *l = eval(m, &c, true);
    const ml_summary *s = ml_ledger_summary(l);
    const uint64_t P = 6738415616ull;
    assert_int_equal(s->bytes_params, (2 * P + 7) / 8);
    assert_int_equal(s->bytes_master, 4 * P / 8);
    assert_int_equal(s->bytes_optimizer, 8 * P / 8);
    /* during block.5's forward, blocks 5 and 6 are gathered: 2 x 202,383,360
     * parameters x 2 B sit in the workspace */
    const ml_event *ev = ml_ledger_events(l);
    bool seen = false;
    for (size_t i = 0; i < ml_ledger_event_count(l); i++)
        if (ev[i].phase == ML_PHASE_FORWARD && ev[i].block == 5 && ev[i].delta > 0 &&
            (uint64_t)ev[i].delta == 2ull * 202383360 * 2)
            seen = true;
    assert_true(seen);
    ml_ledger_destroy(l);
    /* offloading the optimizer moves master weights and states to the host */
    c.training.offload = ML_OFFLOAD_OPTIMIZER;
    l = eval(m, &c, false);
    s = ml_ledger_summary(l);
    assert_int_equal(s->bytes_master, 0);
    assert_int_equal(s->bytes_optimizer, 0);
    assert_int_equal(s->bytes_step_temp, 0);
    /* host: master 4P/8 + states 8P/8 + fp32 gradient partition 4P/8 */
    assert_int_equal(s->bytes_host, 4 * P / 8 + 8 * P / 8 + 4 * P / 8);
    ml_ledger_destroy(l);
    c.training.offload = ML_OFFLOAD_PARAMS;
    l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->bytes_params, 0);
    ml_ledger_destroy(l);
    /* params offload needs stage 3 */
    c.training.zero = 2;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    ml_model_destroy(m);
}

/* HSDP: ZeRO-3 over 8 data-parallel ranks in shard groups of s. GPT-2
 * small in fp32 (P = 124,439,808, 4 bytes each): parameters and gradients
 * 4P/s a rank, Adam's states 8P/s. Per step (one micro-batch) a group
 * gathers the parameters twice and reduce-scatters the gradients,
 * 3 (s-1)/s 4P, and the R = 8/s replicas all-reduce each shard's gradient,
 * 2 (R-1)/R 4P/s: s 8 (one group, plain ZeRO-3) 1,306,617,984 B; s 4:
 * 1,119,958,272 + 124,439,808; s 2: 746,638,848 + 373,319,424. */
static void test_hsdp(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    c.training.precision = ML_PREC_FP32;
    c.training.micro_batch = 1;
    c.training.grad_accum = 1;
    c.training.data_parallel = 8;
    c.training.zero = 3;
    const uint64_t P = 124439808;
    const uint64_t comm[] = {0, 0, 746638848 + 373319424, 0, 1119958272 + 124439808, 0, 0, 0,
                             1306617984};
    for (uint64_t s = 2; s <= 8; s *= 2) {
        c.training.dp_shard = s;
        assert_int_equal(ml_training_shard(&c.training), s);
        ml_ledger *l = eval(m, &c, false);
        const ml_summary *sum = ml_ledger_summary(l);
        assert_int_equal(sum->bytes_params, 4 * P / s);
        assert_int_equal(sum->bytes_grads, 4 * P / s);
        assert_int_equal(sum->bytes_optimizer, 8 * P / s);
        assert_rel_close(sum->comm_bytes, (double)comm[s], 1e-12);
        ml_ledger_destroy(l);
    }
    /* a group must divide the ranks, and shard something */
    ml_error e;
    ml_ledger *l = NULL;
    c.training.dp_shard = 3;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "does not divide"));
    c.training.dp_shard = 4;
    c.training.zero = 0;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "need a sharding"));
    ml_model_destroy(m);
}

/* overlap_grad_reduce: DDP's all-reduce of GPT-2 small's fp32 gradients
 * over 8 ranks, 2 x 7/8 x 4P = 871,078,656 B, runs beside the last of 4
 * micro-batches' backward: at 100 GB/s (8.7 ms) all of it is covered; at
 * 1 GB/s the backward's length (the per-op model's backward / 4) is. */
static void test_overlap_grad_reduce(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = config_allocated(m);
    ml_error e;
    assert_int_equal(ml_device_preset_apply("h100-sxm", &c.device, &e), ML_OK);
    c.device.allocator = ML_ALLOCATOR_NONE;
    c.training.precision = ML_PREC_FP32;
    c.training.micro_batch = 4;
    c.training.grad_accum = 4;
    c.training.data_parallel = 8;
    c.training.overlap_grad_reduce = true;
    const double G = 2.0 * 7 / 8 * 124439808.0 * 4;
    for (int slow = 0; slow < 2; slow++) {
        c.device.interconnect_gbps = slow ? 1 : 100;
        ml_ledger *l = eval(m, &c, false);
        const ml_summary *s = ml_ledger_summary(l);
        assert_rel_close(s->comm_grad_bytes, G, 1e-12);
        const double t_comm = G / (c.device.interconnect_gbps * 1e9);
        const double bwd = s->time.by_phase[ML_TPHASE_BACKWARD] / 4;
        assert_true(bwd > 0);
        assert_rel_close(s->time_comm_hidden_s, slow ? bwd : t_comm, 1e-12);
        assert_rel_close(s->step_time_s, s->time_compute_s + t_comm - s->time_comm_hidden_s,
                         1e-12);
        ml_ledger_destroy(l);
        /* the timeline's clock ends at that step time: its last event,
         * after the step, counts the transfers less what the backward hid
         * (it had counted them whole, past the step's end) */
        l = eval(m, &c, true);
        const size_t n = ml_ledger_event_count(l);
        assert_true(n > 0);
        assert_rel_close(ml_ledger_events(l)[n - 1].t_s, ml_ledger_summary(l)->step_time_s,
                         1e-9);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_overlap_grad_reduce),
        cmocka_unit_test(test_hsdp),
        cmocka_unit_test(test_zero_paper_example),
        cmocka_unit_test(test_stage0_is_unsharded),
        cmocka_unit_test(test_communication_volume),
        cmocka_unit_test(test_zero3_gathers_and_offload),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
