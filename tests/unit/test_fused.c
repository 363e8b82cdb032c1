/* logits: fused (docs/ledger.md, "The loop's references"): Liger Kernel's
 * fused linear cross-entropy, by hand. The decoder: one layer, D = 8, two
 * heads, no positions, RMSNorm, SwiGLU, untied, no bias, vocabulary
 * V = 1000, B = 1, T = 16 (BT = 16), fp32, SGD (no states).
 * The loss block's forward allocates W's gradient V x D x 4 = 32,000 B (a
 * new .grad: the first micro-batch) and x's, BT x D x 4 = 512 B, then its
 * chunks' transient: Liger's rule gives next_power_of_2(ceil(16 /
 * ceil(1000 / 8))) = 1 row per chunk, so two 1-row chunks of logits,
 * 2 x 1000 x 4 = 8,000 B (against one chunk and x's gradient rows,
 * (1000 + 8) x 4 = 4,032), plus the fp32 loss per row and the bool target
 * mask, 16 x 5 = 80: 8,080 B. Then x itself, which nothing saves, is
 * freed: 512 B. Its backward allocates nothing. FLOPs: the three products
 * 6 x BT x D x V = 768,000, all in forward. */
#include "harness.h"

#define FUSED_YAML(chunk)                                                                    \
    "model:\n  type: decoder\n  layers: 1\n  hidden: 8\n  heads: 2\n  ffn: 16\n"              \
    "  activation: swiglu\n  norm: rmsnorm\n  vocab: 1000\n  position: none\n"              \
    "  tied_embeddings: false\n  bias: false\n  dropout: 0\n"                                \
    "training:\n  micro_batch: 1\n  seq_len: 16\n  optimizer: sgd\n  logits: fused\n" chunk

/* The loss phase's events, in order, for the model in y. */
static size_t loss_events(const char *y, int64_t *delta, ml_category *cat, size_t cap,
                          ml_ledger **out)
{
    ml_model *m = load_str(y);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, true);
    const ml_event *ev = ml_ledger_events(l);
    size_t n = 0;
    for (size_t i = 0; i < ml_ledger_event_count(l) && n < cap; i++)
        if (ev[i].phase == ML_PHASE_LOSS) {
            delta[n] = ev[i].delta;
            cat[n++] = ev[i].cat;
        }
    ml_model_destroy(m);
    *out = l;
    return n;
}

static void test_fused_loss_by_hand(void **state)
{
    (void)state;
    int64_t d[8];
    ml_category c[8];
    ml_ledger *l;
    size_t n = loss_events(FUSED_YAML(""), d, c, 8, &l);
    assert_int_equal(n, 5);
    assert_int_equal(c[0], ML_CAT_GRADS);
    assert_int_equal(d[0], 32000);
    assert_int_equal(c[1], ML_CAT_WORKSPACE);
    assert_int_equal(d[1], 512);
    assert_int_equal(d[2], 8080);
    assert_int_equal(d[3], -8080);
    assert_int_equal(c[4], ML_CAT_WORKSPACE);
    assert_int_equal(d[4], -512);
    const ml_block_info *b = block_named(l, "loss");
    assert_int_equal(b->inventory_bytes, 0); /* its targets are the batch's */
    assert_rel_close(b->flops_forward, 768000, 0);
    /* against the unfused head (logits released): the LM head's backward
     * products, 2 x 2 x BT x D x V = 512,000, move into forward; the total
     * is the same */
    const ml_summary *s = ml_ledger_summary(l);
    ml_model *m = load_str(FUSED_YAML(""));
    ml_config cu = ml_model_config(m);
    cu.training.logits = ML_LOGITS_RELEASED;
    ml_ledger *lu = eval(m, &cu, false);
    const ml_summary *su = ml_ledger_summary(lu);
    assert_rel_close(s->flops_forward - su->flops_forward, 512000, 1e-12);
    assert_rel_close(su->flops_backward - s->flops_backward, 512000, 1e-12);
    assert_rel_close(s->flops_total, su->flops_total, 1e-12);
    ml_ledger_destroy(lu);
    ml_model_destroy(m);
    ml_ledger_destroy(l);
    /* training.logits_chunk: 4 rows, a second chunk of 4: 2 x 4 x 4,000 =
     * 32,000 (one chunk and x's rows: 4 x 1,008 x 4 = 16,128) + 80 */
    n = loss_events(FUSED_YAML("  logits_chunk: 4\n"), d, c, 8, &l);
    assert_int_equal(n, 5);
    assert_int_equal(d[2], 32080);
    ml_ledger_destroy(l);
    /* 10 rows: the second chunk has the 6 left, (10 + 6) x 4,000 = 64,000 */
    n = loss_events(FUSED_YAML("  logits_chunk: 10\n"), d, c, 8, &l);
    assert_int_equal(d[2], 64080);
    ml_ledger_destroy(l);
    /* one chunk of all 16 rows: its logits and x's gradient rows at once,
     * 16 x 1,008 x 4 = 64,512, above 16 x 4,000 */
    n = loss_events(FUSED_YAML("  logits_chunk: 64\n"), d, c, 8, &l);
    assert_int_equal(d[2], 64592);
    ml_ledger_destroy(l);
}

/* What cannot be modelled is refused: a classifier's loss, autocast, sharded
 * gradients; and logits_chunk without fused. */
static void test_fused_refused(void **state)
{
    (void)state;
    ml_model *m = load_str(FUSED_YAML(""));
    ml_config c = ml_model_config(m);
    ml_ledger *l = NULL;
    ml_error e;
    c.training.precision = ML_PREC_AMP_BF16;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "autocast"));
    c = ml_model_config(m);
    c.training.zero = 2;
    c.training.data_parallel = 2;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "training.zero"));
    c = ml_model_config(m);
    c.training.logits = ML_LOGITS_KEPT;
    c.training.logits_chunk = 8;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "logits_chunk"));
    ml_model_destroy(m);
    m = load_str("model:\n  type: sequential\n  input: [8]\n  layers:\n"
                 "    - linear: {out: 4}\n");
    c = ml_model_config(m);
    c.training.logits = ML_LOGITS_FUSED;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "language model"));
    ml_model_destroy(m);
    ml_model *bad = NULL;
    const char *y = "model:\n  type: sequential\n  input: [8]\n  layers:\n"
                    "    - linear: {out: 4}\ntraining:\n  logits_chunk: 8\n";
    assert_int_equal(ml_model_load_string(y, strlen(y), "t.yaml", &bad, &e), ML_SCHEMA);
    assert_null(bad);
    assert_int_equal(e.line, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fused_loss_by_hand),
        cmocka_unit_test(test_fused_refused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
