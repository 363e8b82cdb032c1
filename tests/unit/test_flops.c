/* FLOPs: 2mnk per GEMM and batched matmul (docs/flops.md); backward = 2x
 * forward; recompute = forward FLOPs of what is recomputed. */
#include "harness.h"

/* B=2, T=16, D=64, H=4 (dh 16), F=256, V=100, 2 blocks, tied head. */
static const char *tiny =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
    "  vocab: 100\n  max_positions: 16\n  dropout: 0.1\n"
    "training:\n  micro_batch: 2\n  seq_len: 16\n";

/* Per block, with B*T = 32 tokens:
 *   qkv    2 x 32 x 64 x 192      =   786,432
 *   QK^T   2 x (2*4) x 16 x 16 x 16 =  65,536
 *   PV     same                    =    65,536
 *   proj   2 x 32 x 64 x 64       =   262,144
 *   MLP    2 x (2 x 32 x 64 x 256) = 2,097,152
 *   block F = 3,276,800; head 2 x 32 x 64 x 100 = 409,600; embedding 0. */
#define BLOCK_F 3276800.0
#define CORE_F 131072.0
#define HEAD_F 409600.0

static const ml_summary *run(const char *ckpt, uint64_t accum, ml_ledger **l, ml_model **m)
{
    *m = load_str(tiny);
    ml_config c = ml_model_config(*m);
    ml_error e;
    assert_int_equal(ml_parse_checkpoint(ckpt, &c.training.checkpoint, &e), ML_OK);
    c.training.grad_accum = accum;
    c.device.peak_tflops = 100;
    c.device.efficiency = 0.5;
    *l = eval(*m, &c, false);
    return ml_ledger_summary(*l);
}

static void test_three_f_and_four_f(void **state)
{
    (void)state;
    ml_ledger *l;
    ml_model *m;
    const ml_summary *s = run("none", 1, &l, &m);
    double F = 2 * BLOCK_F + HEAD_F;
    assert_rel_close(s->flops_forward, F, 0);
    assert_rel_close(s->flops_backward, 2 * F, 0);
    assert_rel_close(s->flops_recompute, 0, 0);
    assert_rel_close(s->flops_total, 3 * F, 0); /* training = 3F */
    assert_rel_close(block_named(l, "block.0")->flops_forward, BLOCK_F, 0);
    assert_rel_close(block_named(l, "head")->flops_forward, HEAD_F, 0);
    /* step time = FLOPs / (100e12 x 0.5) */
    assert_rel_close(s->step_time_s, 3 * F / 50e12, 1e-15);
    ml_ledger_destroy(l);
    ml_model_destroy(m);

    /* full recompute: the checkpointed blocks run forward twice, so the
     * blocks cost 4F; the head is not checkpointed (3F) */
    s = run("full", 1, &l, &m);
    assert_rel_close(s->flops_recompute, 2 * BLOCK_F, 0);
    assert_rel_close(s->flops_total, 4 * (2 * BLOCK_F) + 3 * HEAD_F, 0);
    /* "about a third more" */
    assert_rel_close(s->flops_total / (3 * F), 1 + 2 * BLOCK_F / (3 * F), 1e-15);
    ml_ledger_destroy(l);
    ml_model_destroy(m);

    /* one segment of both blocks recomputes the same */
    s = run("every-2", 1, &l, &m);
    assert_rel_close(s->flops_recompute, 2 * BLOCK_F, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);

    /* selective: only QK^T and PV again */
    s = run("selective", 1, &l, &m);
    assert_rel_close(s->flops_recompute, 2 * CORE_F, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);

    s = run("[1]", 1, &l, &m);
    assert_rel_close(s->flops_recompute, BLOCK_F, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static void test_accumulation_scales_per_iteration(void **state)
{
    (void)state;
    ml_ledger *l;
    ml_model *m;
    const ml_summary *s = run("full", 4, &l, &m);
    double per_micro = 4 * (2 * BLOCK_F) + 3 * HEAD_F;
    assert_rel_close(s->flops_total, 4 * per_micro, 0);
    assert_rel_close(s->flops_per_micro_batch, per_micro, 0);
    assert_rel_close(s->flops_recompute, 4 * 2 * BLOCK_F, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* GQA: k and v projections shrink to kv_heads x dh columns. */
static void test_gqa_projection_flops(void **state)
{
    (void)state;
    ml_model *m = load_str("model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 8\n"
                           "  kv_heads: 2\n  ffn: 128\n  activation: swiglu\n  norm: rmsnorm\n"
                           "  vocab: 10\n  position: rope\n  bias: false\n"
                           "training:\n  micro_batch: 1\n  seq_len: 4\n");
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    /* q 64x64, k and v 64x16 each: 2*4*64*96; attention 4*1*8*4*4*8;
     * o 2*4*64*64; swiglu 3 x 2*4*64*128 */
    double want = 2.0 * 4 * 64 * 96 + 4.0 * 8 * 4 * 4 * 8 + 2.0 * 4 * 64 * 64 +
                  3 * 2.0 * 4 * 64 * 128;
    assert_rel_close(block_named(l, "block.0")->flops_forward, want, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_three_f_and_four_f),
        cmocka_unit_test(test_accumulation_scales_per_iteration),
        cmocka_unit_test(test_gqa_projection_flops),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
