/* Every shipped model's layers from the op graph (docs/graph.md).
 *
 * The chain is refused (ML_RANGE, not modelled) where the graph declines a
 * layer (a family the kit does not compose, or an op whose arrays
 * overfill): a shipped preset or config.json refused that way is a gap
 * (while the builders existed the chain fell back to them, a gap the chain
 * comparisons could not see). For every shipped decoder and encoder — each precision,
 * training and evaluation — the graph must take the layer (each layout's
 * first: DeepSeek's dense and expert layers) and, for an LM head, the head;
 * the layouts still declined are listed by name and asserted declined, so
 * that a port removes them here. */
#include "harness.h"

#include "ledger/chain_kit.h"

/* shipped layouts the graph does not express yet (none now), NULL-ended */
static const char *const declined[] = {NULL};

static bool is_declined(const char *name)
{
    for (size_t i = 0; declined[i]; i++)
        if (!strcmp(name, declined[i]))
            return true;
    return false;
}

static const ml_precision precs[] = {ML_PREC_FP32, ML_PREC_BF16, ML_PREC_AMP_BF16,
                                     ML_PREC_AMP_FP16};

/* Whether the graph takes m's layers (and its LM head) at every setting;
 * counts the settings in *n. */
static bool taken(const ml_model *m, unsigned *n)
{
    bool all = true;
    for (size_t p = 0; p < sizeof precs / sizeof *precs; p++)
        for (int eval = 0; eval < 2; eval++) {
            ml_config c = ml_model_config(m);
            c.training.precision = precs[p];
            if (m->attn.sliding_window && c.training.seq_len > m->attn.sliding_window)
                c.training.seq_len = m->attn.sliding_window; /* the longest planned */
            ml_chain ch;
            memset(&ch, 0, sizeof ch);
            ch.prec = ml__prec_of(precs[p]);
            ch.eval_mode = eval;
            ml_ck_dims d;
            ml_error e;
            if (ml__ck_dims_of(m, &c.training, &ch, &d, &e) != ML_OK)
                fail_msg("%s: %s", m->name, e.msg);
            ml_ck_graph *G = malloc(sizeof *G);
            assert_non_null(G);
            all = all && ml__ck_graph_layer_at(&ch, m, &d, 0, G);
            if (m->moe.dense_layers && m->moe.dense_layers < m->layers)
                all = all && ml__ck_graph_layer_at(&ch, m, &d, m->moe.dense_layers, G);
            if (m->type == ML_MODEL_DECODER && !m->head.classes)
                all = all && ml__ck_graph_head(&ch, m, &d, false, G);
            free(G);
            (*n)++;
        }
    return all;
}

/* counts: the models, then the settings */
static void check(ml_model *m, void *counts)
{
    unsigned *models = counts, *settings = models + 1;
    if (m->type != ML_MODEL_DECODER && m->type != ML_MODEL_ENCODER)
        return; /* T5 and the sequential models: their own chains */
    if (m->vision.layers)
        return; /* LLaVA: test_graph's tower comparison */
    const bool t = taken(m, settings);
    if (t == is_declined(m->name))
        fail_msg("%s: the graph %s its layers", m->name, t ? "now takes" : "declines");
    (*models)++;
}

static void test_shipped_layers_from_graph(void **state)
{
    (void)state;
    unsigned counts[2] = {0, 0};
    each_shipped_model(check, counts);
    const unsigned models = counts[0], settings = counts[1];
    print_message("%u shipped models, %u settings: the layers from the op graph\n", models,
                  settings);
    /* the decoders and encoders without a tower: 8 of the 13 presets (not
     * the 3 sequential ones, T5 or LLaVA) and 19 of the 22 configs (not the
     * 2 T5s or LLaVA); each at 4 precisions, training and evaluation */
    assert_int_equal(models, 8 + 19);
    assert_int_equal(settings, (8 + 19) * 4 * 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_layers_from_graph),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
