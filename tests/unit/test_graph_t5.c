/* T5's chains from the op graph alone (src/graph/kit_t5.c, docs/graph.md;
 * the chain builders they replaced, compared field by field while they
 * lived, are gone): whole chains of T5's presets, its shipped config.json
 * and the torch twins' layouts (tests/torch/models/t5.yaml, t5-gated.yaml)
 * at more layers, with and without dropout, a KV cache, targets shorter
 * and longer than the inputs, under each precision, checkpoint policy and
 * pass: every layer the graph's (its copies sharing the second layer's
 * saved list), the embeddings, encoder.final and the head equal to the
 * graph's blocks alone, every side tensor the graph's and the four the
 * layout sizes independently equal to it (no builder is left: a layout
 * the graph declined would be refused with ML_RANGE). */
#include "harness.h"

#include <stdlib.h>
#include <string.h>

#include "graph/kit_t5.h"
#include "ledger/chain_kit.h"

/* The graph's layers are its: block "<stack>.block.<i>" for i >= 2 shares
 * the saved list of block 1 (ml__ck_graph_repeat). The layer blocks
 * checked. */
static unsigned from_graph(const ml_chain *b, const char *what)
{
    unsigned n = 0;
    for (size_t i = 0; i < b->n; i++) {
        const ml_cblock *y = &b->blocks[i];
        const char *dot = strstr(y->name, ".block.");
        if (!dot || atoi(dot + 7) < 2)
            continue;
        const ml_cblock *p = &b->blocks[i - (size_t)atoi(dot + 7) + 1];
        if (y->saved_first != p->saved_first)
            fail_msg("%s: %s is not the graph's copy of %s", what, y->name, p->name);
        n++;
    }
    return n;
}

/* The embeddings' blocks, encoder.final and the head of b, the graph-built chain,
 * against the same blocks emitted from the op graph alone
 * (ml__ck_graph_t5_embedding, ml__ck_graph_t5_final, ml__ck_graph_t5_head): the
 * inventory, the parameters, the transients. The blocks checked. */
static unsigned embeddings_from_graph(const ml_model *m, const ml_config *cfg, bool eval,
                                      const ml_chain *b)
{
    const ml_training *tr = &cfg->training;
    unsigned n = 0;
    for (size_t i = 0; i < b->n; i++) {
        const ml_cblock *x = &b->blocks[i];
        const bool dec = !strcmp(x->name, "decoder.embedding");
        const bool fin = !strcmp(x->name, "encoder.final");
        const bool hd = !strcmp(x->name, "head");
        if (!dec && !fin && !hd && strcmp(x->name, "embedding"))
            continue;
        ml_chain ch;
        memset(&ch, 0, sizeof ch);
        ch.eval_mode = eval;
        ch.selective = b->selective;
        ch.prec = ml__prec_of(tr->precision);
        const uint64_t T = (dec || hd) && tr->target_len ? tr->target_len : tr->seq_len;
        const ml_ck_dims d = {.B = tr->micro_batch,
                              .T = T,
                              .BT = tr->micro_batch * T,
                              .D = m->hidden,
                              .V = m->embed.vocab,
                              .drop = m->dropout > 0 && !eval};
        ml_ck_graph *G = malloc(sizeof *G);
        assert_non_null(G);
        assert_true(hd    ? ml__ck_graph_t5_head(&ch, m, &d, G)
                    : fin ? ml__ck_graph_t5_final(&ch, m, &d, G)
                          : ml__ck_graph_t5_embedding(&ch, m, &d, dec, G));
        ml_cblock *y = ml__ck_begin(&ch, x->name, -1);
        assert_non_null(y);
        ml__ck_graph_emit(&ch, y, G,
                          hd ? d.BT * d.V * ch.prec.a : fin ? 0 : d.BT * d.D * ch.prec.w);
        assert_int_equal(x->nsaved, y->nsaved);
        assert_int_equal(x->saved_bytes, y->saved_bytes);
        assert_int_equal(x->params, y->params);
        assert_int_equal(x->ws_fwd, y->ws_fwd);
        assert_int_equal(x->cast_bytes, y->cast_bytes);
        assert_true(x->flops_fwd == y->flops_fwd);
        for (size_t k = 0; k < x->nsaved; k++)
            assert_int_equal(b->saved[x->saved_first + k].bytes,
                             ch.saved[y->saved_first + k].bytes);
        free(G);
        ml__chain_free(&ch);
        n++;
    }
    return n;
}

/* The side tensors of b, the graph-built chain (c: its configuration),
 * all derived from the op graphs: T5Stack's own (its masks,
 * cache_position, the embedding's output), the position biases and the
 * encoder's output, the last four checked against the bytes, blocks and
 * gradients the layout gives them independently. *graph counts the
 * graph's; returns all. */
static unsigned sides_from_graph(const ml_model *m, const ml_config *c, bool eval,
                                 const ml_chain *b, unsigned *graph)
{
    const ml_training *tr = &c->training;
    const uint64_t B = tr->micro_batch, Ts = tr->seq_len, Td = tr->target_len;
    const unsigned w = b->prec.w;
    const size_t enc0 = 1, fin = enc0 + m->layers, dec0 = fin + 2, hd = dec0 + m->t5.dec_layers;
    const bool saved = !eval && !b->prec.autocast;
    const struct {
        const char *what;
        uint64_t bytes;
        size_t from, to, grad_from;
        bool grad;
    } want[] = {
        {"encoder position bias (B, H, Ts, Ts)", B * m->attn.heads * Ts * Ts * w, enc0, fin,
         fin - 1, true},
        {"encoder output", B * Ts * m->hidden * w, fin, saved ? dec0 : b->n - 1, hd - 1, true},
        {"decoder self-attention position bias (B, H, Td, Td)", B * m->attn.heads * Td * Td * w,
         dec0, hd, hd - 1, true},
        {"cross-attention position bias (B, H, Td, Ts)", B * m->attn.heads * Td * Ts * w, dec0, hd,
         0, false},
    };
    unsigned k = 0;
    for (size_t i = 0; i < b->nsides; i++) {
        const ml_side *s = &b->sides[i];
        if (!s->graph)
            fail_msg("side %zu (%s) is not the graph's", i, s->what);
        (*graph)++;
        if (k >= 4 || strcmp(s->what, want[k].what))
            continue;
        assert_int_equal(s->bytes, want[k].bytes);
        assert_int_equal(s->from, want[k].from);
        assert_int_equal(s->to, want[k].to);
        assert_int_equal(s->to_bwd, k == 1 && saved);
        assert_true(s->ckpt_kept);
        const bool g = want[k].grad && !eval;
        assert_int_equal(s->grad, g ? s->bytes : 0);
        assert_int_equal(s->grad_from, g ? want[k].grad_from : 0);
        assert_int_equal(s->grad_to, g ? want[k].from : 0);
        k++;
    }
    assert_int_equal(k, 4);
    /* each stack's mask of ones, its extended or causal mask, cache_position
     * and, dropping, its embedding's output; the decoder's encoder mask of
     * ones and its inversion */
    assert_int_equal(b->nsides, 4 + 8 + (m->dropout > 0 && !eval ? 2 : 0));
    return (unsigned)b->nsides;
}

static const char *const twins[] = {
    /* tests/torch/models/t5.yaml at 3 + 3 layers */
    "model:\n  type: encoder-decoder\n  layers: 3\n  decoder_layers: 3\n  hidden: 48\n"
    "  heads: 4\n  head_dim: 16\n  ffn: 96\n  activation: relu\n  norm: rmsnorm\n"
    "  position: relative\n  relative_buckets: 32\n  relative_max_distance: 128\n"
    "  vocab: 157\n  tied_embeddings: true\n  dropout: 0.1\n  attention: eager\n",
    /* t5-gated.yaml at 4 + 2 layers */
    "model:\n  type: encoder-decoder\n  layers: 4\n  decoder_layers: 2\n  hidden: 48\n"
    "  heads: 4\n  head_dim: 16\n  ffn: 96\n  activation: geglu\n  norm: rmsnorm\n"
    "  position: relative\n  relative_buckets: 32\n  relative_max_distance: 128\n"
    "  vocab: 157\n  tied_embeddings: false\n  dropout: 0.1\n  attention: eager\n",
    /* one layer each, no dropout, heads x head_dim wider than hidden */
    "model:\n  type: encoder-decoder\n  layers: 1\n  decoder_layers: 1\n  hidden: 40\n"
    "  heads: 3\n  head_dim: 24\n  ffn: 72\n  activation: relu\n  norm: rmsnorm\n"
    "  position: relative\n  relative_buckets: 16\n  relative_max_distance: 64\n"
    "  vocab: 101\n  tied_embeddings: true\n  dropout: 0\n  attention: eager\n",
    /* gated, no dropout, 2 + 5 layers */
    "model:\n  type: encoder-decoder\n  layers: 2\n  decoder_layers: 5\n  hidden: 48\n"
    "  heads: 4\n  head_dim: 16\n  ffn: 96\n  activation: geglu\n  norm: rmsnorm\n"
    "  position: relative\n  relative_buckets: 32\n  relative_max_distance: 128\n"
    "  vocab: 157\n  tied_embeddings: false\n  dropout: 0\n  attention: eager\n",
};

/* (micro-batch, inputs, targets) */
static const uint64_t shapes[][3] = {{3, 20, 12}, {1, 7, 7}, {2, 33, 64}, {1, 1, 1}};

/* Every chain of m from the graph;
 * *layers counts the layer blocks checked to
 * be the graph's copies. */
static unsigned compare(ml_model *m, const char *name, unsigned *layers, unsigned *emb,
                        unsigned *sides)
{
    static const char *const policies[] = {"none", "selective", "full"};
    unsigned n = 0;
    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
        for (int p = 0; p < ML_PREC_COUNT; p++)
            for (size_t c = 0; c < 3; c++)
                for (int ev = 0; ev < 2; ev++) {
                    ml_config cfg = ml_model_config(m);
                    cfg.training.precision = (ml_precision)p;
                    cfg.training.micro_batch = shapes[s][0];
                    cfg.training.seq_len = shapes[s][1];
                    cfg.training.target_len = shapes[s][2];
                    cfg.calib = NULL;
                    ml_error e;
                    assert_int_equal(ml_parse_checkpoint(policies[c], &cfg.training.checkpoint, &e),
                                     ML_OK);
                    ml_chain b;
                    ml_status sb = ev ? ml__chain_build_eval(m, &cfg, &b, &e)
                                      : ml__chain_build(m, &cfg, &b, &e);
                    char what[200];
                    snprintf(what, sizeof what, "%s, shape %zu, precision %d, %s%s", name, s, p,
                             policies[c], ev ? ", eval" : "");
                    if (sb != ML_OK)
                        fail_msg("%s: refused: %s", what, e.msg);
                    *layers += from_graph(&b, what);
                    *emb += embeddings_from_graph(m, &cfg, ev, &b);
                    sides[0] += sides_from_graph(m, &cfg, ev, &b, &sides[1]);
                    ml__chain_free(&b);
                    n++;
                }
    return n;
}

static void test_t5_chains_from_graph(void **state)
{
    (void)state;
    unsigned n = 0, layers = 0, models = 0, emb = 0, sides[2] = {0, 0};
    ml_model *m = load_preset("t5-base");
    n += compare(m, "t5-base", &layers, &emb, sides);
    ml_model_destroy(m);
    models++;
    static const char *const hf[] = {"t5-base", "flan-t5-base"};
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
        m = load_hf_config(hf[i]);
        n += compare(m, hf[i], &layers, &emb, sides);
        m->attn.kv_cache = true; /* use_cache in evaluation */
        n += compare(m, hf[i], &layers, &emb, sides);
        ml_model_destroy(m);
        models += 2;
    }
    for (size_t i = 0; i < sizeof twins / sizeof twins[0]; i++) {
        m = load_str(twins[i]);
        n += compare(m, "twin", &layers, &emb, sides);
        ml_model_destroy(m);
        models++;
    }
    const unsigned per = sizeof shapes / sizeof shapes[0] * ML_PREC_COUNT * 3 * 2;
    fprintf(stderr,
            "%u T5 chains from the graph, %u layer blocks the graph's copies, %u embeddings, "
            "encoders' final norms and heads from the graph, %u side tensors compared, "
            "%u of them from the graph\n",
            n, layers, emb, sides[0], sides[1]);
    assert_int_equal(n, models * per);
    /* the encoder's and the decoder's embeddings, encoder.final, the head */
    assert_int_equal(emb, 4 * n);
    /* every side tensor from the graph */
    assert_int_equal(sides[1], sides[0]);
    assert_true(sides[0] >= 12 * n);
    /* 12 + 12 layers (5 models), 3 + 3, 4 + 2, 2 + 5: the copies after the
     * second of each stack */
    assert_int_equal(layers, per * (5 * 20 + 2 + 2 + 3));
}

/* Every configuration's graph is whole, with a quarter of the arrays to
 * spare; the model types other than T5's are refused. */
static void test_t5_kit_headroom(void **state)
{
    (void)state;
    unsigned most_t = 0, most_op = 0, n = 0;
    ml_graph *g = malloc(sizeof *g);
    assert_non_null(g);
    for (unsigned k = 0; k < 128; k++) {
        const mlg_t5 L = {k & 1, k & 2, k & 4, k & 8, k & 16, k & 32, k & 64};
        ml__kit_t5_stack(g, &L); /* T5Stack's own tensors */
        assert_true(ml__graph_valid(g));
        ml__kit_t5_layer(g, &L);
        assert_true(ml__graph_valid(g));
        most_t = g->nt > most_t ? g->nt : most_t;
        most_op = g->nop > most_op ? g->nop : most_op;
        n++;
    }
    free(g);
    fprintf(stderr, "%u T5 graphs: at most %u tensors, %u ops\n", n, most_t, most_op);
    assert_true(most_t <= MLG_MAX_TENSORS * 3 / 4 && most_op <= MLG_MAX_OPS * 3 / 4);
    mlg_t5 L;
    const mlg_config c = {4, 4, false, false, false, false, false, false, false, false, false, false};
    ml_model *m = load_preset("gpt2-small");
    assert_false(ml__family_t5_layer(m, &c, false, true, &L));
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_t5_chains_from_graph),
        cmocka_unit_test(test_t5_kit_headroom),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
