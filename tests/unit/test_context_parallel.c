/* Context parallelism, one rank's plan (docs/parallel.md, "Context
 * parallelism"): a rank holds T / cp tokens of every tensor, its fused
 * attention attends to the whole sequence's keys through PyTorch's ring
 * attention, whose buffers and collectives are worked by hand here from
 * the layer's shape. */
#include "harness.h"
#include "ledger/chain.h"   /* the blocks' transients */
#include "ledger/planner.h" /* ml__planner_derived */

/* B 2, T 64, hidden 64, 4 heads of 16, 2 key/value heads, bf16, flash */
static const char *tiny =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
    "  ffn: 128\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 256\n  position: rope\n"
    "  tied_embeddings: false\n  bias: false\n  attention: flash\n  dropout: 0\n"
    "training:\n  micro_batch: 2\n  seq_len: 64\n  precision: bf16\n  optimizer: adamw\n";

static ml_config allocated(const ml_model *m, uint64_t cp, uint64_t T)
{
    ml_config c = ml_model_config(m);
    c.device.allocator = ML_ALLOCATOR_NONE;
    c.training.context_parallel = cp;
    c.training.seq_len = T;
    return c;
}

/* At cp 2 a rank's tensors are those of the whole model at T / 2 = 32
 * tokens; its attention's queries meet all 64 keys: 4 B H Tl (T - Tl) dh
 * more FLOPs a layer than at 32 tokens, 4 x 2 x 4 x 32 x 32 x 16 =
 * 524,288, 1,048,576 over the two layers. */
static void test_rank_is_its_tokens(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = allocated(m, 2, 64), h = allocated(m, 1, 32);
    ml_ledger *l = eval(m, &c, false), *k = eval(m, &h, false);
    for (size_t i = 0; i < ml_ledger_block_count(l); i++)
        assert_int_equal(ml_ledger_block(l, i)->activations_saved,
                         ml_ledger_block(k, i)->activations_saved);
    assert_int_equal(ml_ledger_summary(l)->bytes_activations,
                     ml_ledger_summary(k)->bytes_activations);
    const double extra = 4.0 * 2 * 4 * 32 * (64 - 32) * 16; /* 524,288 */
    assert_rel_close(ml_ledger_summary(l)->flops_forward,
                     ml_ledger_summary(k)->flops_forward + 2 * extra, 1e-15);
    assert_rel_close(block_named(l, "block.0")->flops_forward,
                     block_named(k, "block.0")->flops_forward + extra, 1e-15);
    ml_ledger_destroy(l);
    ml_ledger_destroy(k);
    ml_model_destroy(m);
}

/* The ring per layer, e = B Tl Hkv dh = 2 x 32 x 2 x 16 = 2,048 elements
 * of a rank's keys: the forward's all-gather of [K, V] sends
 * (cp - 1) 2 a e = 8,192 B, the backward's again, and cp permutes of the
 * fp32 [dK, dV], 8 e = 16,384 B each: 49,152 B a layer, 98,304 B for two;
 * recomputed (full checkpointing), each layer gathers once more:
 * 114,688 B. The gradients' all-reduce spans dp x cp = 2 ranks:
 * 2 (1/2) P 2 B = 2 P bytes. */
static void test_ring_collectives(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = allocated(m, 2, 64);
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    const double e = 2 * 32 * 2 * 16, gather = 1 * 2 * 2 * e;
    assert_rel_close(s->cp_comm_bytes, 98304, 0);
    /* the calls: 2 all-gathers and cp = 2 sends a layer, two layers */
    assert_rel_close(s->cp_halves, 4, 0);
    assert_rel_close(s->cp_sends, 4, 0);
    assert_rel_close(s->comm_bytes, 2.0 * (double)s->params, 1e-15);
    ml_ledger_destroy(l);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->cp_comm_bytes, 98304 + 2 * gather, 0);
    assert_rel_close(ml_ledger_summary(l)->cp_halves, 6, 0); /* and one a recomputed layer */
    ml_ledger_destroy(l);
    c.training.context_parallel = 1;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->cp_comm_bytes, 0, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The ring's buffers in a layer block. Forward: [K, V] of all 64 tokens,
 * 2 x 2 B x 2 x 2 x 64 x 16 = 16,384 B; the merge's fp32 output and its
 * update's temporaries, 4 x 4 B x B H Tl dh = 16 x 4,096 = 65,536 B; one
 * step's output, 8,192 B: the largest of the block's unsaved tensors, so
 * the block rule's forward transient is twice it, 131,072 B. Backward,
 * beside the block rule's (its largest tensor now that buffer): [K, V]
 * gathered again, 16,384 B; grad_query in fp32 and its update's copy,
 * 8 x 4,096 = 32,768 B; the fp32 [dK, dV] in flight, 32 e = 65,536 B:
 * 114,688 B. */
static void test_ring_buffers(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = allocated(m, 2, 64), h = allocated(m, 1, 32);
    ml_chain ring, half;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &c, &ring, &e), ML_OK);
    assert_int_equal(ml__chain_build(m, &h, &half, &e), ML_OK);
    const ml_cblock *r = &ring.blocks[1], *p = &half.blocks[1];
    assert_string_equal(r->name, "block.0");
    assert_true(r->nnodes == 0); /* the block-level backward */
    assert_int_equal(r->ws_fwd, 2 * 65536);
    const uint64_t mt = p->ws_nograd / 2; /* the block's largest tensor at T 32 */
    const uint64_t big = mt > 65536 ? mt : 65536;
    assert_int_equal(r->ws_bwd, p->ws_bwd - 2 * mt + 2 * big + 16384 + 32768 + 65536);
    ml__chain_free(&ring);
    ml__chain_free(&half);
    ml_model_destroy(m);
}

/* A prepared planner derives the chain at micro-batch 3 from its builds at
 * 2 and 4 (and 1): with cp its figures are those of a chain built at 3. */
static void test_planner(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_planner *p = NULL;
    assert_int_equal(ml_planner_create(m, &p, NULL), ML_OK);
    ml_config c = allocated(m, 2, 64);
    for (uint64_t B = 1; B <= 5; B++) {
        c.training.micro_batch = B;
        ml_ledger *a = NULL, *b = NULL;
        assert_int_equal(ml_planner_evaluate(p, &c, false, &a, NULL), ML_OK);
        assert_int_equal(ml_ledger_evaluate(m, &c, false, &b, NULL), ML_OK);
        const ml_summary *x = ml_ledger_summary(a), *y = ml_ledger_summary(b);
        assert_int_equal(x->peak, y->peak);
        assert_int_equal(x->bytes_activations, y->bytes_activations);
        assert_rel_close(x->flops_forward, y->flops_forward, 0);
        assert_rel_close(x->cp_comm_bytes, y->cp_comm_bytes, 0);
        ml_ledger_destroy(a);
        ml_ledger_destroy(b);
    }
    assert_true(ml__planner_derived(p) > 0);
    ml_planner_destroy(p);
    ml_model_destroy(m);
}

static void test_refusals(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = allocated(m, 3, 64);
    ml_error e;
    /* 64 tokens do not split into 2 x 3 chunks */
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "training.seq_len"));
    assert_non_null(strstr(e.msg, "multiple of 6"));
    c = allocated(m, 4, 64); /* 8 chunks of 8 */
    assert_int_equal(status_of(m, &c, &e), ML_OK);
    c.training.engine = ML_ENGINE_MEGATRON;
    assert_int_equal(status_of(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "Transformer Engine"));
    ml_model_destroy(m);
    /* eager attention, and sdpa's math kernel (fp32, grouped heads) */
    const char *kinds[] = {"attention: flash", "attention: eager", "attention: sdpa"};
    for (size_t k = 1; k < 3; k++) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%s", tiny);
        char *at = strstr(buf, kinds[0]);
        char rest[512];
        snprintf(rest, sizeof rest, "%s", at + strlen(kinds[0]));
        snprintf(at, sizeof buf - (size_t)(at - buf), "%s%s", kinds[k], rest);
        m = load_str(buf);
        c = allocated(m, 2, 64);
        c.training.precision = ML_PREC_FP32;
        assert_int_equal(status_of(m, &c, &e), ML_RANGE);
        assert_non_null(strstr(e.msg, "fused scaled_dot_product_attention"));
        ml_model_destroy(m);
    }
}

/* The layout search with cp pinned at 2 on 4 devices of a node of 4, a
 * global batch of 4. The states shard over dp x cp ranks, so ZeRO is
 * searched wherever that is above 1: tp 1 beside cp 2 leaves 2 devices,
 * pp 1 (dp 2, 4 ranks: ZeRO 0 to 3, four splits) or pp 2 (dp 1, 2 ranks,
 * beside a pipeline ZeRO 0 and 1: two; its 2 layers split no other way
 * than 1 and 1); tp 2 beside cp 2 fills the node (dp 1, 2 ranks: four):
 * 10 splits. Every row is the plan of its settings, cp included. */
static void test_search(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    c.device = ml_config_defaults().device;
    c.device.present = true;
    c.device.memory = UINT64_C(80) << 30;
    c.device.peak_tflops = 100;
    ml_layout_request req = ml_layout_request_defaults();
    req.gpus = 4;
    req.gpus_per_node = 4;
    req.global_batch = 4;
    req.cp = 2;
    ml_layout_result out;
    ml_error e;
    assert_int_equal(ml_layout_search(m, &c, &req, &out, &e), ML_OK);
    assert_int_equal(out.layouts, 10);
    assert_true(out.nrows > 0);
    for (size_t i = 0; i < out.nrows; i++) {
        const ml_layout_row *w = &out.rows[i];
        assert_int_equal(w->cp, 2);
        assert_int_equal(w->tp * w->cp * w->pp * w->dp, 4);
        ml_config k = ml_layout_config(&c, w);
        assert_int_equal(k.training.context_parallel, 2);
        ml_ledger *l = eval(m, &k, false);
        assert_int_equal(ml_ledger_summary(l)->peak, w->peak);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_is_its_tokens),
        cmocka_unit_test(test_ring_collectives),
        cmocka_unit_test(test_ring_buffers),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_search),
        cmocka_unit_test(test_planner),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
