/* fit --gpus: the layout search (docs/search.md). */
#include "harness.h"

/* A Llama of 4 layers, 8 heads, 2 key/value heads, untied: tensor
 * parallelism 1 or 2 (kv_heads 2), pipelines of 1, 2 or 4 stages. */
static const char *llama4 =
    "model:\n  type: decoder\n  layers: 4\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
    "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
    "  tied_embeddings: false\n  bias: false\n  attention: eager\n  dropout: 0\n"
    "training:\n  seq_len: 24\n  optimizer: adamw\n";

static ml_config on_h100(const ml_model *m, double interconnect)
{
    ml_config c = ml_model_config(m);
    ml_error e;
    if (ml_device_preset_apply("h100-sxm", &c.device, &e) != ML_OK)
        fail_msg("%s", e.msg);
    c.device.interconnect_gbps = interconnect;
    return c;
}

/* 8 devices, 8 a node, global batch 8: the splits tp x pp x dp with tp
 * dividing 8, pp dividing 8 / tp and dp = 8 / (tp pp) dividing the batch:
 * tp 1 with pp 1, 2, 4, 8; tp 2 with 1, 2, 4; tp 4 with 1, 2; tp 8 with 1:
 * ten layouts, of which tp 4 and 8 (kv_heads 2) and pp 8 (4 layers) plan
 * nothing. Each row is what the plan of its settings says. */
static void test_search(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = on_h100(m, 300);
    ml_layout_request req = ml_layout_request_defaults();
    req.gpus = 8;
    req.global_batch = 8;
    ml_layout_result r;
    ml_error e;
    assert_int_equal(ml_layout_search(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.layouts, 10);
    assert_true(r.nrows > 0 && r.nrows <= ML_LAYOUT_TOP);
    assert_true(r.comm_timed);
    for (size_t i = 0; i < r.nrows; i++) {
        const ml_layout_row *w = &r.rows[i];
        assert_true(w->tp <= 2 && w->pp <= 4);
        assert_int_equal(w->tp * w->pp * w->dp, 8);
        assert_int_equal(w->micro_batch * w->micro_batches * w->dp, 8);
        if (i)
            assert_true(w->step_s >= r.rows[i - 1].step_s);
        /* the row is the plan of its settings */
        ml_config p = c;
        p.training.tensor_parallel = w->tp;
        p.training.pipeline_parallel = w->pp;
        p.training.data_parallel = w->dp;
        p.training.micro_batch = w->micro_batch;
        p.training.grad_accum = w->micro_batches;
        p.training.checkpoint = w->checkpoint;
        ml_ledger *l = eval(m, &p, false);
        const ml_summary *s = ml_ledger_summary(l);
        assert_true(s->fits);
        assert_int_equal(w->peak, s->peak);
        assert_rel_close(w->compute_s, w->pp > 1 ? s->pipeline_step_s : s->time_compute_s,
                         1e-12);
        /* the transfers at 300 GB/s inside the node: tensor parallelism's
         * collectives and data parallelism's (one node: no network) */
        double p2p = 0;
        for (size_t k = 0; k < ml_ledger_rank_count(l); k++)
            p2p = ml_ledger_rank(l, k)->p2p_bytes > p2p ? ml_ledger_rank(l, k)->p2p_bytes : p2p;
        assert_rel_close(w->comm_s, (s->tp_comm_bytes + p2p + s->comm_bytes) / 300e9, 1e-12);
        assert_rel_close(w->step_s, w->compute_s + w->comm_s, 1e-12);
        assert_rel_close(w->tokens_per_s, 8.0 * 24 / w->step_s, 1e-12);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

static void test_requests(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = ml_model_config(m); /* no device */
    ml_layout_request req = ml_layout_request_defaults();
    req.gpus = 2;
    req.global_batch = 4;
    ml_layout_result r;
    ml_error e;
    assert_int_equal(ml_layout_search(m, &c, &req, &r, &e), ML_USAGE);
    c = on_h100(m, 0);
    req.global_batch = 0;
    assert_int_equal(ml_layout_search(m, &c, &req, &r, &e), ML_USAGE);
    /* untimed transfers: the rows carry none */
    req.global_batch = 4;
    assert_int_equal(ml_layout_search(m, &c, &req, &r, &e), ML_OK);
    assert_false(r.comm_timed);
    assert_true(r.nrows > 0 && r.rows[0].comm_s < 0);
    assert_rel_close(r.rows[0].step_s, r.rows[0].compute_s, 0);
    /* nothing fits on 1 MiB */
    c.device.memory = 1 << 20;
    c.device.runtime_reserve = 0;
    assert_int_equal(ml_layout_search(m, &c, &req, &r, &e), ML_OK);
    assert_int_equal(r.nrows, 0);
    assert_non_null(strstr(r.note, "no layout of 2 devices fits"));
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_search),
                                       cmocka_unit_test(test_requests)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
