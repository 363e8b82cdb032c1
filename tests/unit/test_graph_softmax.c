/* The attention's softmax in the backward, node by node, against hand
 * derivations: CUDA's softmax backward computes grad * output into a
 * temporary of the output's bytes after grad_input
 * (aten/src/ATen/native/cuda/SoftMax.cu, softmax_backward_cuda_out), so
 * the node holds four B.h.T.T tensors at once (the saved output, the
 * incoming gradient, grad_input and the temporary); and Falcon's
 * multi-query attention, whose PV matmul broadcasts the one value head
 * itself, after the softmax: its ExpandBackward0 runs right after that
 * matmul's backward, before the softmax's (the engine pops the node with
 * the highest sequence number first); and the masked scores HF's eager
 * attention hands its softmax, in the mask's dtype (fp32 under autocast). */
#include "harness.h"

#include "ledger/chain_kit.h"

/* tests/torch/models/llama.yaml's layout: 8 heads on 2 key/value heads */
static const char *const llama =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
    "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
    "  bias: false\n  attention: %s\n  dropout: 0\n";

/* tests/torch/models/falcon.yaml's: 4 heads on one key/value head */
static const char *const falcon =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 1\n"
    "  ffn: 256\n  activation: gelu\n  norm: layernorm\n  norm_bias: true\n"
    "  parallel_residual: true\n  shared_norm: true\n  vocab: 173\n  position: rope\n"
    "  tied_embeddings: true\n  bias: false\n  attention: eager\n  dropout: 0\n";

static void build(const char *yaml, ml_model **m, ml_chain *c)
{
    *m = load_str(yaml);
    ml_config cfg = config_at(*m, ML_PREC_FP32, 2, 24);
    ml_error e;
    assert_int_equal(ml__chain_build(*m, &cfg, c, &e), ML_OK);
}

/* block.0's node named `what` (its index in the block's list, or -1) */
static long find(const ml_chain *c, const char *what)
{
    const ml_cblock *b = &c->blocks[1];
    assert_string_equal(b->name, "block.0");
    assert_true(b->nnodes > 0);
    for (size_t i = 0; i < b->nnodes; i++)
        if (strcmp(c->nodes[b->node_first + i].what, what) == 0)
            return (long)i;
    return -1;
}

/* B 2, h 8, T 24, fp32: each T x T tensor 2 * 8 * 24 * 24 * 4 = 36,864 B.
 * The softmax's node makes its input's gradient (36,864), the temporary
 * (36,864) and frees the output's gradient (36,864). Eager attention's
 * SoftmaxBackward0 and SDPA's math kernel (fp32 with grouped heads: the
 * fused kernels refuse it) whose _safe_softmax backward is the same
 * _softmax_backward_data. */
static void test_softmax_temporary(void **state)
{
    (void)state;
    static const struct {
        const char *kernel, *node;
    } runs[] = {{"eager", "SoftmaxBackward0"}, {"sdpa", "SafeSoftmaxBackward0"}};
    const uint64_t P = 2 * 8 * 24 * 24 * 4;
    for (size_t r = 0; r < sizeof runs / sizeof runs[0]; r++) {
        char yaml[512];
        snprintf(yaml, sizeof yaml, llama, runs[r].kernel);
        ml_model *m;
        ml_chain c;
        build(yaml, &m, &c);
        long i = find(&c, runs[r].node);
        assert_true(i >= 0);
        const ml_bnode *v = &c.nodes[c.blocks[1].node_first + (size_t)i];
        assert_int_equal(v->grad_in, P);
        assert_int_equal(v->scratch, P);
        assert_int_equal(v->grad_out, P);
        assert_int_equal(v->param_grad, 0);
        ml__chain_free(&c);
        ml_model_destroy(m);
    }
}

/* tests/torch/models/gpt2.yaml's layout (nanoGPT's attention) */
static const char *const gpt2 =
    "model:\n  type: decoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
    "  activation: gelu\n  norm: layernorm\n  vocab: 211\n  position: learned\n"
    "  max_positions: 64\n  tied_embeddings: true\n  bias: true\n  attention: eager\n"
    "  dropout: 0.1\n";

/* The eager layer's graph of yaml (its attention key filled: eager) at B 2,
 * T 24 in precision p (G: caller's). */
static void layer_graph(const char *fmt, ml_precision p, ml_ck_graph *G)
{
    char yaml[512];
    snprintf(yaml, sizeof yaml, fmt, "eager");
    ml_model *m = load_str(yaml);
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.prec = ml__prec_of(p);
    ml_config c = config_at(m, p, 2, 24);
    ml_ck_dims d;
    ml_error e;
    assert_int_equal(ml__ck_dims_of(m, &c.training, &ch, &d, &e), ML_OK);
    assert_true(ml__ck_graph_layer(&ch, m, &d, G));
    ml__chain_free(&ch);
    ml_model_destroy(m);
}

/* The tensor of G named `name` (MLG_NONE: none). */
static uint16_t tensor(const ml_ck_graph *G, const char *name)
{
    for (uint16_t t = 0; t < G->g.nt; t++)
        if (strcmp(G->g.t[t].name, name) == 0)
            return t;
    return MLG_NONE;
}

/* The op of G making tensor t (NULL: none). */
static const mlg_op *maker(const ml_ck_graph *G, uint16_t t)
{
    for (uint16_t k = 0; k < G->g.nop; k++)
        if (G->g.op[k].nout && G->g.op[k].out[0] == t)
            return &G->g.op[k];
    return NULL;
}

/* The op making t has a node whose one input gradient has gin bytes and
 * whose one output gradient has gout bytes. */
static void node_of(const ml_ck_graph *G, uint16_t t, uint64_t gin, uint64_t gout)
{
    assert_int_not_equal(t, MLG_NONE);
    const mlg_op *o = maker(G, t);
    assert_non_null(o);
    assert_non_null(o->node);
    assert_int_equal(o->ngin, 1);
    assert_int_equal(G->tb[o->gin[0]], gin);
    assert_int_equal(o->ngout, 1);
    assert_int_equal(G->tb[o->gout[0]], gout);
}

/* HF's eager attention adds the causal mask, made in the embeddings'
 * dtype, before softmax(dtype=fp32). B 2, h 8, T 24: a T x T tensor is
 * 9,216 elements. Under autocast the embeddings are fp32: the bf16 product
 * (18,432 B) plus the mask is fp32 (36,864 B), the softmax's input already,
 * with no copy; the add's node makes the product's bf16 gradient (18,432)
 * from the sum's fp32 one (36,864). In pure bf16 the sum is bf16 (18,432),
 * copied to fp32 (36,864) for the softmax; the add hands the gradient on. */
static void test_masked_scores_dtype(void **state)
{
    (void)state;
    const uint64_t tt = 2 * 8 * 24 * 24;
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    layer_graph(llama, ML_PREC_AMP_BF16, G);
    uint16_t s3 = tensor(G, "scores (masked)");
    node_of(G, s3, tt * 2, tt * 4);
    assert_int_equal(G->tb[s3], tt * 4);
    assert_int_equal(tensor(G, "scores (fp32 copy)"), MLG_NONE);
    layer_graph(llama, ML_PREC_BF16, G);
    s3 = tensor(G, "scores (masked)");
    assert_int_equal(G->tb[s3], tt * 2);
    uint16_t copy = tensor(G, "scores (fp32 copy)");
    assert_int_not_equal(copy, MLG_NONE);
    assert_int_equal(G->tb[copy], tt * 4);
    assert_null(maker(G, s3)->node);
    free(G);
}

/* nanoGPT's F.softmax(att) takes no dtype: under autocast it is
 * softmax(att, dtype=fp32) (fp32_set_opt_dtype), which copies the bf16
 * masked scores to fp32 first. B 2, h 4, T 24: 4,608 elements a T x T
 * tensor, the copy 18,432 B; its ToCopyBackward0 makes the scores' bf16
 * gradient (9,216) from the fp32 one the softmax's node makes (18,432).
 * In fp32 the softmax reads the scores themselves. */
static void test_nanogpt_softmax_copy(void **state)
{
    (void)state;
    const uint64_t tt = 2 * 4 * 24 * 24;
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    layer_graph(gpt2, ML_PREC_AMP_BF16, G);
    uint16_t copy = tensor(G, "scores (fp32 copy)");
    node_of(G, copy, tt * 2, tt * 4);
    assert_int_equal(G->tb[copy], tt * 4);
    const mlg_op *sm = maker(G, tensor(G, "softmax output"));
    assert_non_null(sm);
    assert_int_equal(sm->in[0], copy);
    assert_int_equal(G->tb[sm->gin[0]], tt * 4);
    layer_graph(gpt2, ML_PREC_FP32, G);
    assert_int_equal(tensor(G, "scores (fp32 copy)"), MLG_NONE);
    sm = maker(G, tensor(G, "softmax output"));
    assert_non_null(sm);
    assert_int_equal(sm->in[0], tensor(G, "scores (masked)"));
    free(G);
}

/* Falcon: B 2, H 4, T 24, dh 16. The PV matmul's BmmBackward0 makes the
 * probabilities' gradient (2 * 4 * 24 * 24 * 4 = 18,432) and the
 * broadcast value's (2 * 4 * 24 * 16 * 4 = 12,288); the next node sums the
 * latter into the one head's (2 * 1 * 24 * 16 * 4 = 3,072) and frees it;
 * then the softmax's, with its temporary of 18,432. */
static void test_falcon_value_broadcast(void **state)
{
    (void)state;
    ml_model *m;
    ml_chain c;
    build(falcon, &m, &c);
    long pv = find(&c, "BmmBackward0 (P v)");
    long ex = find(&c, "ExpandBackward0 (the PV matmul's broadcast of v)");
    long sm = find(&c, "SoftmaxBackward0");
    assert_true(pv >= 0);
    assert_int_equal(ex, pv + 1);
    assert_true(sm > ex);
    const ml_bnode *n = &c.nodes[c.blocks[1].node_first];
    assert_int_equal(n[pv].grad_in, 18432 + 12288);
    assert_int_equal(n[ex].grad_in, 3072);
    assert_int_equal(n[ex].grad_out, 12288);
    assert_int_equal(n[sm].grad_in, 18432);
    assert_int_equal(n[sm].scratch, 18432);
    ml__chain_free(&c);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_softmax_temporary),
        cmocka_unit_test(test_falcon_value_broadcast),
        cmocka_unit_test(test_masked_scores_dtype),
        cmocka_unit_test(test_nanogpt_softmax_copy),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
