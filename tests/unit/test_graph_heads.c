/* The last heads the chain builders wrote, now the op graph's
 * (src/graph/kit_head.c, docs/graph.md): a decoder's sequence classifier
 * on a model with soft-capped LM logits (transformers caps only the causal
 * LM's; Gemma2ForSequenceClassification is the generic classifier) and
 * the classifier and masked-LM heads of a text encoder with rotary
 * positions. Whole chains from the graph over every attention kernel,
 * precision, checkpoint policy (none, selective, full), pass and three
 * shapes, with the logits kept and released, each whole (chain_whole) and
 * its head emitted from the graph alone and compared with the chain's, so
 * that a head the graph declined cannot pass (no chain builder is left:
 * a declined head's chain is refused with ML_RANGE; the builders'
 * field-by-field comparison held these chains before they went); an fp32
 * LM head's backward node list against a hand derivation; the encoder
 * classifiers' forward walked op by op, in evaluation by hand. */
#include "harness.h"

#include "chain_compare.h"

#include "ledger/chain_kit.h"

static const ml_attention kernels[] = {ML_ATTN_EAGER, ML_ATTN_SDPA, ML_ATTN_FLASH};

static const char *const heads[] = {
    /* Gemma 2's layout (tests/torch/models/gemma2.yaml) as a sequence
     * classifier: post norms, soft-capped scores and logits */
    "model:\n  type: decoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
    "  head_dim: 32\n  ffn: 160\n  activation: geglu\n  norm: gemma_rmsnorm\n"
    "  post_norms: true\n  attn_scalar: 24\n  attn_softcap: 50\n  final_softcap: 30\n"
    "  embedding_scale: true\n  vocab: 173\n  position: rope\n  tied_embeddings: true\n"
    "  classes: 3\n  bias: false\n  dropout: 0\n",
    /* Llama's layout with soft-capped logits, dropout, untied */
    "model:\n  type: decoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: swiglu\n  norm: rmsnorm\n  vocab: 97\n  position: rope\n"
    "  final_softcap: 20\n  classes: 5\n  bias: false\n  dropout: 0.1\n",
    /* a text encoder with rotary positions: BERT's classifier (pooler,
     * dropout), token types */
    "model:\n  type: encoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: gelu\n  norm: layernorm\n  norm_position: post\n  vocab: 97\n"
    "  position: rope\n  classes: 2\n  token_types: 3\n  dropout: 0.1\n",
    /* ... without the pooler or dropout, ReLU */
    "model:\n  type: encoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: relu\n  norm: layernorm\n  norm_position: post\n  vocab: 97\n"
    "  position: rope\n  classes: 4\n  pooler: false\n  dropout: 0\n",
    /* ... its masked-LM head, tied, GELU, dropout */
    "model:\n  type: encoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: gelu\n  norm: layernorm\n  norm_position: post\n  vocab: 97\n"
    "  position: rope\n  mlm_head: true\n  tied_embeddings: true\n  dropout: 0.1\n",
    /* ... untied, ReLU */
    "model:\n  type: encoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: relu\n  norm: layernorm\n  norm_position: post\n  vocab: 97\n"
    "  position: rope\n  mlm_head: true\n  tied_embeddings: false\n  dropout: 0\n",
};

/* The head of `built` (the block before the loss) against the same head
 * emitted from the op graph alone: the inventory, the parameters, the
 * FLOPs, the transients. False: the graph declined it. */
static bool head_from_graph(const ml_model *m, const ml_config *cfg, bool eval,
                            const ml_chain *built)
{
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.eval_mode = eval;
    ch.selective = built->selective;
    ch.prec = ml__prec_of(cfg->training.precision);
    ml_ck_dims d;
    ml_error e;
    assert_int_equal(ml__ck_dims_of(m, &cfg->training, &ch, &d, &e), ML_OK);
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    const bool dec = m->type == ML_MODEL_DECODER;
    const bool taken = m->head.mlm ? ml__ck_graph_mlm_head(&ch, m, &d, G)
                       : dec       ? ml__ck_graph_cls_head(&ch, m, &d, G)
                                   : ml__ck_graph_encoder_head(&ch, m, &d, G);
    if (taken) {
        ml_cblock *b = ml__ck_begin(&ch, "head", -1);
        assert_non_null(b);
        const uint64_t rows = m->head.mlm ? d.BT : d.B;
        ml__ck_graph_emit(&ch, b, G, rows * (m->head.mlm ? d.V : m->head.classes) * ch.prec.a);
        const ml_cblock *x = &built->blocks[built->n - 2], *y = &ch.blocks[ch.n - 1];
        const char *who = x->name, *what = "head from the graph";
        assert_string_equal(x->name, "head");
        SAME(nsaved);
        SAME(saved_bytes);
        SAME(cast_bytes);
        SAME(in_saved);
        SAME(params);
        SAME(ws_fwd);
        SAME(ws_nograd);
        SAME(unit_fwd);
        SAME(unit);
        SAME(flops_fwd);
        for (size_t i = 0; i < x->nsaved; i++)
            assert_int_equal(built->saved[x->saved_first + i].bytes,
                             ch.saved[y->saved_first + i].bytes);
    }
    free(G);
    ml__chain_free(&ch);
    return taken;
}

/* One configuration from the graph; 1 when built (0: refused). */
static unsigned compare_one(ml_model *m, ml_config *cfg, bool ev, const char *what,
                            unsigned *fused_refused)
{
    ml_chain b;
    ml_error e;
    ml_status sb = ev ? ml__chain_build_eval(m, cfg, &b, &e) : ml__chain_build(m, cfg, &b, &e);
    if (sb != ML_OK) {
        /* the fused loss (a classifier's, an encoder's) is refused; so
         * is a batch above 1 without a pad token (as transformers) */
        if (cfg->training.logits == ML_LOGITS_FUSED)
            ++*fused_refused;
        else if (!(m->head.cls_no_pad && cfg->training.micro_batch > 1))
            fail_msg("%s: refused: %s", what, e.msg);
        return 0;
    }
    chain_whole(&b, m, what);
    if (!head_from_graph(m, cfg, ev, &b))
        fail_msg("%s: the graph declined the head", what);
    ml__chain_free(&b);
    return 1;
}

static unsigned compare_model(ml_model *m, size_t v, unsigned *fused_refused)
{
    static const uint64_t shapes[][2] = {{1, 1}, {3, 7}, {2, 130}};
    static const char *const policies[] = {"none", "selective", "full"};
    unsigned n = 0;
    for (size_t k = 0; k < 3; k++) {
        m->attn.kernel = kernels[k];
        for (int p = 0; p < ML_PREC_COUNT; p++)
            for (size_t c = 0; c < 3; c++)
                for (size_t s = 0; s < 3; s++)
                    for (int ev = 0; ev < 2; ev++)
                        for (int lg = 0; lg < ML_LOGITS_COUNT; lg++) {
                            ml_config cfg = ml_model_config(m);
                            cfg.training.precision = (ml_precision)p;
                            cfg.training.micro_batch = shapes[s][0];
                            cfg.training.seq_len = shapes[s][1];
                            cfg.training.logits = (ml_logits)lg;
                            cfg.calib = NULL;
                            ml_error e;
                            assert_int_equal(
                                ml_parse_checkpoint(policies[c], &cfg.training.checkpoint, &e),
                                ML_OK);
                            char what[160];
                            snprintf(what, sizeof what,
                                     "head %zu%s, attention %zu, precision %d, %s, %llu x %llu, "
                                     "logits %d%s",
                                     v, m->head.cls_no_pad ? " (no pad)" : "", k, p, policies[c],
                                     (unsigned long long)shapes[s][0],
                                     (unsigned long long)shapes[s][1], lg, ev ? ", eval" : "");
                            n += compare_one(m, &cfg, ev, what, fused_refused);
                        }
    }
    return n;
}

static void test_heads_from_graph(void **state)
{
    (void)state;
    const size_t nh = sizeof heads / sizeof heads[0];
    unsigned n[sizeof heads / sizeof heads[0] + 2] = {0}, total = 0, refused = 0;
    /* the two decoders' classifiers a second time without a pad token */
    for (size_t v = 0; v < nh + 2; v++) {
        ml_model *m = load_str(heads[v % nh]);
        m->head.cls_no_pad = v >= nh;
        n[v] = compare_model(m, v % nh, &refused);
        total += n[v];
        ml_model_destroy(m);
    }
    /* 3 kernels x 6 precisions x 3 policies x 3 shapes x 2 passes x the
     * logits kept, released and through-backward; without a pad token the
     * batch of 1 only */
    const unsigned runs = 3 * ML_PREC_COUNT * 3 * 3 * 2, all = runs * 3;
    fprintf(stderr,
            "%u chains from the graph, whole, their heads too: %u and %u soft-capped sequence "
            "classifiers (%u and %u without a pad token), %u and %u rotary encoder "
            "classifiers, %u and %u rotary masked-LM heads; %u fused losses refused\n",
            total, n[0], n[1], n[6], n[7], n[2], n[3], n[4], n[5], refused);
    for (size_t v = 0; v < nh; v++)
        assert_int_equal(n[v], all);
    assert_int_equal(n[nh], all / 3);
    assert_int_equal(n[nh + 1], all / 3);
    /* every fused configuration of every model (no head here takes it) */
    assert_int_equal(refused, (unsigned)(nh + 2) * runs);
}

/* ---- the fused head's norm on a 2-byte stream ---- */

/* tests/torch/models/llama.yaml's and gemma.yaml's layouts, and GPT-2's
 * LayerNorm (no upcast: the nodes the builders had) */
static const char *const fused_norms[] = {
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
    "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
    "  bias: false\n  attention: eager\n  dropout: 0\n",
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 1\n"
    "  head_dim: 32\n  ffn: 160\n  activation: geglu\n  norm: gemma_rmsnorm\n"
    "  embedding_scale: true\n  vocab: 173\n  position: rope\n  tied_embeddings: true\n"
    "  bias: false\n  attention: eager\n  dropout: 0\n",
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
    "  activation: gelu\n  norm: layernorm\n  vocab: 173\n  position: learned\n"
    "  max_positions: 512\n  tied_embeddings: true\n  bias: true\n  dropout: 0\n",
};

typedef struct {
    const char *what;
    uint64_t in, pg, scratch, out;
} node_row;

/* The graph's head nodes in backward order, as PyTorch runs them
 * (tests/torch/fusednorm.py measured them on 1.13's CPU in bf16): Llama's
 * RMSNorm (gemma false) or Gemma's; E the stream's bytes of x, F its fp32
 * bytes, R the fp32 rsqrt (B x T), P the 2-byte weight's gradient. */
static void expect_nodes(const ml_chain *c, const ml_cblock *b, bool gemma, uint64_t E,
                         uint64_t F, uint64_t R, uint64_t P)
{
    const node_row llama[] = {
        {"MulBackward0 (weight * h)", E, P, E, E},
        {"ToCopyBackward0 (h.to)", F, 0, 0, E},
        {"MulBackward0 (x * rsqrt)", F + R, 0, F, F},
        {"RsqrtBackward0", R, 0, 2 * R, R},
        {"MeanBackward1", F, 0, 0, R},
        {"PowBackward0 (x^2)", F, 0, 2 * F, F},
        {"InputBuffer accumulation (in place)", 0, 0, 0, F},
        {"ToCopyBackward0 (norm input)", E, 0, 0, F},
    };
    /* (1 + weight.float()): its fp32 gradient (2 P) made by the product,
     * cast into the weight's */
    const node_row gem[] = {
        {"ToCopyBackward0 (type_as)", F, 0, 0, E},
        {"MulBackward0 (h * (1 + weight))", F + 2 * P, 0, F, F},
        {"ToCopyBackward0 (weight.float())", 0, P, 0, 2 * P},
        {"MulBackward0 (x * rsqrt)", F + R, 0, F, F},
        {"RsqrtBackward0", R, 0, 2 * R, R},
        {"MeanBackward1", F, 0, 0, R},
        {"PowBackward0 (x^2)", F, 0, 2 * F, F},
        {"InputBuffer accumulation (in place)", 0, 0, 0, F},
        {"ToCopyBackward0 (norm input)", E, 0, 0, F},
    };
    const node_row *want = gemma ? gem : llama;
    const size_t n = gemma ? sizeof gem / sizeof gem[0] : sizeof llama / sizeof llama[0];
    assert_int_equal(b->nnodes, n);
    for (size_t i = 0; i < n; i++) {
        const ml_bnode *v = &c->nodes[b->node_first + i];
        assert_string_equal(v->what, want[i].what);
        assert_int_equal(v->grad_in, want[i].in);
        assert_int_equal(v->param_grad, want[i].pg);
        assert_int_equal(v->scratch, want[i].scratch);
        assert_int_equal(v->grad_out, want[i].out);
    }
}

/* Fused logits on every precision and two shapes from the graph: the
 * head's node list on a 2-byte stream without autocast with an RMSNorm
 * (where the builders' differed, counting the stream's dtype throughout,
 * when they existed) is the table above; elsewhere the builders' and the
 * graph's agreed before the builders went. */
static void test_fused_norm_nodes(void **state)
{
    (void)state;
    static const uint64_t shapes[][2] = {{2, 24}, {1, 7}};
    unsigned corrected = 0, same = 0;
    for (size_t v = 0; v < sizeof fused_norms / sizeof fused_norms[0]; v++) {
        ml_model *m = load_str(fused_norms[v]);
        for (int p = 0; p < ML_PREC_COUNT; p++)
            for (size_t s = 0; s < 2; s++) {
                ml_config cfg = ml_model_config(m);
                cfg.training.precision = (ml_precision)p;
                cfg.training.micro_batch = shapes[s][0];
                cfg.training.seq_len = shapes[s][1];
                cfg.training.logits = ML_LOGITS_FUSED;
                cfg.calib = NULL;
                ml_chain b;
                ml_error e;
                if (ml__chain_build(m, &cfg, &b, &e) != ML_OK) { /* autocast's fused loss */
                    assert_true(ml__prec_of(cfg.training.precision).autocast);
                    continue;
                }
                chain_whole(&b, m, "fused head");
                const bool two = b.prec.w == 2 && !b.prec.autocast;
                const bool rms = m->norms.kind != ML_NORM_LAYERNORM;
                const unsigned c = two && rms;
                if (c) {
                    const uint64_t BT = shapes[s][0] * shapes[s][1];
                    expect_nodes(&b, &b.blocks[b.n - 2], m->norms.kind == ML_NORM_GEMMA_RMSNORM,
                                 BT * 64 * 2, BT * 64 * 4, BT * 4, 64 * 2);
                }
                corrected += c;
                same += !c;
                ml__chain_free(&b);
            }
        ml_model_destroy(m);
    }
    fprintf(stderr, "%u fused heads with the corrected norm nodes, %u others\n",
            corrected, same);
    /* Llama's and Gemma's norms: bf16, bf16-master and fp16-master, two
     * shapes */
    assert_int_equal(corrected, 2 * 3 * 2);
    /* the others: their fp32 heads (two shapes each) and the LayerNorm
     * model's four precisions without autocast, two shapes */
    assert_int_equal(same, 2 * 2 + 4 * 2);
}

/* An LM head in fp32 (the layout of Llama's twin, untied; B 2, T 24, D 64,
 * V 173): its backward node by node, as autograd runs it
 * (tools/autograd/derivatives.yaml) and tests/torch/pp_twins.py measures
 * it on a pipeline's last stage. By hand, in bytes: the mm makes x's
 * gradient B.T.D.4 = 12,288 and the weight's V.D.4 = 44,288 from the
 * logits' B.T.V.4 = 33,216 (mm_mat1_backward, mm_mat2_backward); the
 * RMSNorm's weight * h makes h's gradient and the weight's D.4 = 256 as
 * the sum of a product of x's size; x * rsqrt makes x's and rsqrt's (B.T.4
 * = 192) gradients, the latter the sum of a product of x's size; then
 * rsqrt, mean and pow (pow_backward's grad * (2 * x.pow(1)): two
 * temporaries of x's size beside x's gradient), and x's two gradients
 * summed in place. */
static void test_lm_head_nodes(void **state)
{
    (void)state;
    ml_model *m = load_str(fused_norms[0]);
    ml_config cfg = ml_model_config(m);
    cfg.training.precision = ML_PREC_FP32;
    cfg.training.micro_batch = 2;
    cfg.training.seq_len = 24;
    cfg.calib = NULL;
    ml_chain b;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &cfg, &b, &e), ML_OK);
    const uint64_t X = 2 * 24 * 64 * 4, R = 2 * 24 * 4;
    const node_row want[] = {
        {"MmBackward0 (LM head)", X, 173 * 64 * 4, 0, 2 * 24 * 173 * 4},
        {"MulBackward0 (weight * h)", X, 64 * 4, X, X},
        {"MulBackward0 (x * rsqrt)", X + R, 0, X, X},
        {"RsqrtBackward0", R, 0, 2 * R, R},
        {"MeanBackward1", X, 0, 0, R},
        {"PowBackward0 (x^2)", X, 0, 2 * X, X},
        {"InputBuffer accumulation (in place)", 0, 0, 0, X},
    };
    const ml_cblock *h = &b.blocks[b.n - 2];
    assert_string_equal(h->name, "head");
    assert_int_equal(h->nnodes, sizeof want / sizeof want[0]);
    for (size_t i = 0; i < h->nnodes; i++) {
        const ml_bnode *v = &b.nodes[h->node_first + i];
        assert_string_equal(v->what, want[i].what);
        assert_int_equal(v->grad_in, want[i].in);
        assert_int_equal(v->param_grad, want[i].pg);
        assert_int_equal(v->scratch, want[i].scratch);
        assert_int_equal(v->grad_out, want[i].out);
    }
    /* in bf16 (not node level yet) the block rule stays */
    ml__chain_free(&b);
    cfg.training.precision = ML_PREC_BF16;
    assert_int_equal(ml__chain_build(m, &cfg, &b, &e), ML_OK);
    assert_int_equal(b.blocks[b.n - 2].nnodes, 0);
    ml__chain_free(&b);
    ml_model_destroy(m);
}

/* The encoder classifiers' heads walked op by op, in training and in
 * evaluation (where the classifier's dropout is the identity: no op), fp32,
 * B = 2. Evaluation, by hand (under no_grad every tensor goes with its last
 * reference): BERT's (T = 3, D = 4, three classes): the first token a view,
 * the pooler's dense +32 B, tanh +32 = 64, the dense's output goes (32), the
 * logits +24 (56), the head returns: tanh's output goes, the logits left
 * (24): the transient beside them 64 - 24 = 40 B. ViT's (a 4 x 4 image in
 * 2 x 2 patches: T = 5): the final LayerNorm +160 B and its statistics
 * +2 x 40 = 240, the statistics go (160), the logits +24 (184), the norm's
 * output goes: 240 - 24 = 216 B. */
static void test_encoder_heads_walked(void **state)
{
    (void)state;
    static const struct {
        const char *yaml;
        uint64_t T, ws_eval;
    } rows[] = {
        {"model:\n  type: encoder\n  layers: 1\n  hidden: 4\n  heads: 1\n  ffn: 8\n"
         "  activation: gelu\n  norm: layernorm\n  norm_position: post\n  vocab: 11\n"
         "  position: learned\n  max_positions: 8\n  pooler: true\n  classes: 3\n"
         "  attention: eager\n  dropout: 0.1\n",
         3, 40},
        {"model:\n  type: encoder\n  layers: 1\n  hidden: 4\n  heads: 1\n  ffn: 8\n"
         "  activation: gelu\n  norm: layernorm\n  norm_position: pre\n  image_size: 4\n"
         "  patch_size: 2\n  channels: 1\n  classes: 3\n  attention: eager\n  dropout: 0.1\n",
         5, 216},
    };
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        ml_model *m = load_str(rows[r].yaml);
        ml_config cfg = ml_model_config(m);
        cfg.training.micro_batch = 2;
        cfg.training.seq_len = rows[r].T;
        cfg.training.precision = ML_PREC_FP32;
        ml_chain b;
        ml_error e;
        assert_int_equal(ml__chain_build(m, &cfg, &b, &e), ML_OK);
        const ml_cblock *h = &b.blocks[b.n - 2];
        assert_string_equal(h->name, "head");
        assert_true(h->ws_fwd_ops && h->ws_nograd_ops);
        ml__chain_free(&b);
        assert_int_equal(ml__chain_build_eval(m, &cfg, &b, &e), ML_OK);
        h = &b.blocks[b.n - 2];
        assert_true(h->ws_nograd_ops);
        assert_int_equal(h->ws_nograd, rows[r].ws_eval);
        ml__chain_free(&b);
        ml_model_destroy(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_heads_from_graph),
        cmocka_unit_test(test_fused_norm_nodes),
        cmocka_unit_test(test_lm_head_nodes),
        cmocka_unit_test(test_encoder_heads_walked),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
