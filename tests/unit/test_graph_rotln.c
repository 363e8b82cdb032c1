/* A LayerNorm pre-norm decoder with rotary positions, not GPT-NeoX's
 * parallel residual (the video-tokens preset's layout), from the op graph
 * (src/graph/families.c: GPT-2's layer with HF's rotary on q and k;
 * docs/graph.md). The chain builders planned it as the nanoGPT layer with
 * its rotary not counted; the graph counts the rotary (a correction held
 * byte for byte by tests/torch's xc-gpt2-rope and xc-gpt2-rope-flash, its
 * figures worked by hand in test_rotary_figures). The builders wrote no
 * forward programs for it, nor for GPT-NeoX's parallel layer; the graph
 * now writes them with eager attention or the math kernel (the forward op
 * by op, held by tests/torch/livebytes.py's forward checks on
 * xc-gpt2-rope and xc-neox), as for every other layout that has them.
 * Whole chains from the graph over every attention kernel, precision,
 * checkpoint policy (none, selective, full), pass, three shapes and the
 * logits kept, released and fused, each whole (chain_whole), the graph
 * taking the layer and the head alone too, so that a declined layout
 * cannot pass; the counts are asserted. GPT-NeoX's layer with grouped key/value
 * heads under a fused kernel, which the graph declines (its figures and
 * the builders' disagree), is refused, the layout named. */
#include "harness.h"

#include "chain_compare.h"

#include "ledger/chain_kit.h"

static const ml_attention kernels[] = {ML_ATTN_EAGER, ML_ATTN_SDPA, ML_ATTN_FLASH};

static const char *const models[] = {
    /* video-tokens' settings: GELU, no biases, untied */
    "model:\n  type: decoder\n  layers: 3\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
    "  activation: gelu\n  norm: layernorm\n  vocab: 97\n  position: rope\n"
    "  tied_embeddings: false\n  bias: false\n  dropout: 0\n",
    /* the fuzz corpus's and the CLI tests' "huge" (the defaults: biases,
     * tied), with dropout */
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  vocab: 173\n"
    "  position: rope\n  dropout: 0.1\n",
    /* ReLU, a head size of its own, LayerNorms without a bias, q/k/v bias
     * only */
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  head_dim: 32\n"
    "  ffn: 160\n  activation: relu\n  norm: layernorm\n  vocab: 97\n  position: rope\n"
    "  bias: false\n  qkv_bias: true\n  norm_bias: false\n  dropout: 0\n",
    /* a sequence classifier on the layout (the generic classifier's head) */
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
    "  activation: gelu\n  norm: layernorm\n  vocab: 97\n  position: rope\n"
    "  classes: 3\n  bias: false\n  dropout: 0.1\n",
};

/* GPT-NeoX's parallel layer with fewer key/value heads than query heads
 * (a model file's: tests/unit/test_hf_falcon.c's two-norm block), one and
 * two of them */
static const char *const grouped[] = {
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 1\n"
    "  ffn: 128\n  vocab: 50\n  position: rope\n  bias: false\n  norm_bias: true\n"
    "  parallel_residual: true\n  activation: gelu\n  dropout: 0\n",
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
    "  ffn: 160\n  vocab: 97\n  position: rope\n  parallel_residual: true\n"
    "  activation: relu\n  dropout: 0.1\n",
};

/* Whether the graph takes the layer and the head of cfg alone. */
static bool graph_takes(const ml_model *m, const ml_config *cfg, bool eval)
{
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.eval_mode = eval;
    ch.prec = ml__prec_of(cfg->training.precision);
    ml_ck_dims d;
    ml_error e;
    assert_int_equal(ml__ck_dims_of(m, &cfg->training, &ch, &d, &e), ML_OK);
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    bool t = ml__ck_graph_layer_at(&ch, m, &d, 0, G);
    t = t && (m->head.classes
                  ? ml__ck_graph_cls_head(&ch, m, &d, G)
                  : ml__ck_graph_head(&ch, m, &d, cfg->training.logits == ML_LOGITS_FUSED, G));
    free(G);
    ml__chain_free(&ch);
    return t;
}

/* Whether cfg runs m's attention in a fused kernel. */
static bool fused_kernel(const ml_model *m, const ml_config *cfg)
{
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.prec = ml__prec_of(cfg->training.precision);
    return ml__ck_fused_attention(ch.prec.a, m);
}

/* One configuration from the graph; 1 when built or declined (*declined
 * counts those: a grouped GPT-NeoX layer under a fused kernel, refused as
 * not modelled), 0 when refused (*refused counts those: the fused loss of
 * a classifier, or under autocast). */
static unsigned compare_one(ml_model *m, ml_config *cfg, bool ev, const char *what,
                            unsigned *refused, unsigned *declined)
{
    ml_chain b;
    ml_error e;
    ml_status sb = ev ? ml__chain_build_eval(m, cfg, &b, &e) : ml__chain_build(m, cfg, &b, &e);
    /* a grouped GPT-NeoX layer under a fused kernel (families.c):
     * declined there, and taken everywhere else */
    const bool keep =
        m->residual.parallel && m->attn.kv_heads < m->attn.heads && fused_kernel(m, cfg);
    /* the fused loss: refused for a classifier, and under autocast */
    const bool fused_refused =
        cfg->training.logits == ML_LOGITS_FUSED &&
        (m->head.classes || ml__prec_of(cfg->training.precision).autocast);
    if (sb != ML_OK && fused_refused) {
        ++*refused;
        return 0;
    }
    if (graph_takes(m, cfg, ev) == keep)
        fail_msg("%s: the graph %s the layer or the head", what, keep ? "took" : "declined");
    if (keep) {
        if (sb != ML_RANGE || !strstr(e.msg, "layers (parallel residual, grouped key/value "
                                             "heads)") ||
            !strstr(e.msg, "not modelled"))
            fail_msg("%s: not refused as not modelled", what);
        ++*declined;
        return 1;
    }
    if (sb != ML_OK)
        fail_msg("%s: refused: %s", what, e.msg);
    chain_whole(&b, m, what);
    ml__chain_free(&b);
    return 1;
}

static unsigned compare_model(ml_model *m, const char *name, unsigned *refused,
                              unsigned *declined)
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
                                     "%s, attention %zu, precision %d, %s, %llu x %llu, "
                                     "logits %d%s",
                                     name, k, p, policies[c], (unsigned long long)shapes[s][0],
                                     (unsigned long long)shapes[s][1], lg, ev ? ", eval" : "");
                            n += compare_one(m, &cfg, ev, what, refused, declined);
                        }
    }
    return n;
}

static void test_rotary_layernorm_from_graph(void **state)
{
    (void)state;
    const size_t nm = sizeof models / sizeof models[0];
    unsigned n[sizeof models / sizeof models[0] + 2] = {0}, total = 0, refused = 0, declined = 0;
    for (size_t v = 0; v < nm; v++) {
        ml_model *m = load_str(models[v]);
        char name[32];
        snprintf(name, sizeof name, "model %zu", v);
        n[v] = compare_model(m, name, &refused, &declined);
        total += n[v];
        ml_model_destroy(m);
    }
    /* the shipped preset itself, at the grid's small shapes, and with a
     * key/value cache in evaluation (the cache's bytes are the chain's) */
    for (int cache = 0; cache < 2; cache++) {
        ml_model *m = load_preset("video-tokens");
        m->attn.kv_cache = cache;
        n[nm + cache] = compare_model(m, cache ? "video-tokens, kv cache" : "video-tokens",
                                      &refused, &declined);
        total += n[nm + cache];
        ml_model_destroy(m);
    }
    /* 3 kernels x the precisions x 3 policies x 3 shapes x 2 passes x
     * the logits kept, released and fused; the fused loss refused for the
     * classifier, and under autocast */
    unsigned nauto = 0;
    for (int p = 0; p < ML_PREC_COUNT; p++)
        nauto += ml__prec_of((ml_precision)p).autocast;
    const unsigned all = 3 * ML_PREC_COUNT * 3 * 3 * 2 * ML_LOGITS_COUNT;
    const unsigned fused = all / ML_LOGITS_COUNT, fused_auto = fused / ML_PREC_COUNT * nauto;
    fprintf(stderr,
            "%u chains from the graph, whole, the layers and heads alone too: %u, %u, %u, %u "
            "(classifier), video-tokens %u and %u (kv cache); %u fused losses refused\n",
            total, n[0], n[1], n[2], n[3], n[nm], n[nm + 1], refused);
    assert_true(nauto > 0 && nauto < (unsigned)ML_PREC_COUNT);
    for (size_t v = 0; v < nm + 2; v++)
        assert_int_equal(n[v], v == 3 ? all - fused : all - fused_auto); /* 3: the classifier */
    assert_int_equal(refused, fused + (unsigned)(nm + 1) * fused_auto);
    assert_int_equal(total, (unsigned)(nm + 2) * all - refused);
    assert_int_equal(declined, 0);
}

/* Layer 0 of m's training chain under cfg (checkpoint none): *saved its
 * saved bytes, *nodes its backward nodes. */
static void layer0(ml_model *m, const ml_config *cfg, uint64_t *saved, size_t *nodes)
{
    ml_chain ch;
    ml_error e;
    assert_int_equal(ml__chain_build(m, cfg, &ch, &e), ML_OK);
    size_t i = 0;
    while (i < ch.n && strcmp(ch.blocks[i].name, "block.0") != 0)
        i++;
    assert_true(i < ch.n);
    *saved = ch.blocks[i].saved_bytes;
    *nodes = ch.blocks[i].nnodes;
    ml__chain_free(&ch);
}

/* The rotary's own figures, worked by hand against nanoGPT's layer (the
 * same model with learned positions: the layer without the rotary). HF's
 * apply_rotary_pos_emb saves cos and sin (the embedding's) and nothing of
 * q or k; it makes two new tensors, the rotated q and k. The eager core's
 * matmuls copy q and k as before (the rotated are in q's transposed
 * layout), so the eager layer saves the same bytes. A fused kernel saves
 * q, k and v as it gets them: v is still a view that keeps c_attn's whole
 * output, and q and k are now the rotated, B·T·(H + Hkv)·dh more bytes in
 * the compute dtype (tests/torch: xc-gpt2-rope-flash, byte for byte, in
 * fp32 and bf16 autocast). So does the eager core with a batch of one,
 * whose matmuls copy nothing (their reshapes for bmm are views): bmm keeps
 * c_attn's output through v's view, and the rotated q and k beside it,
 * where nanoGPT's keeps that output alone (tests/torch: xc-gpt2-rope at
 * micro-batch 1). The backward runs fifteen nodes more: seven for
 * the rotary on q and seven on k (the two products', the negation's, the
 * two slices' and the two additions into the buffer of x's gradient,
 * kit_rope.c, ml__kit_rope), and k's head view's copy: the rotary's slices
 * make k's gradient as contiguous heads, which without the rotary arrives
 * through k^T's bmm and reshapes as a view (kit.c). */
static void test_rotary_figures(void **state)
{
    (void)state;
    static const uint64_t shapes[][2] = {{1, 1}, {3, 7}, {2, 130}};
    unsigned n = 0, fused = 0, noded = 0;
    for (size_t k = 0; k < 3; k++)
        for (int p = 0; p < ML_PREC_COUNT; p++)
            for (size_t s = 0; s < 3; s++) {
                ml_model *r = load_preset("video-tokens");
                ml_model *l = load_preset("video-tokens");
                l->embed.position = ML_POS_LEARNED;
                l->embed.max_positions = 4096;
                r->attn.kernel = l->attn.kernel = kernels[k];
                ml_config cfg = ml_model_config(r);
                cfg.training.precision = (ml_precision)p;
                cfg.training.micro_batch = shapes[s][0];
                cfg.training.seq_len = shapes[s][1];
                cfg.calib = NULL;
                ml_error e;
                assert_int_equal(ml_parse_checkpoint("none", &cfg.training.checkpoint, &e), ML_OK);
                uint64_t sr, sl;
                size_t nr, nl;
                layer0(r, &cfg, &sr, &nr);
                layer0(l, &cfg, &sl, &nl);
                const bool f = fused_kernel(r, &cfg);
                const uint64_t c = ml__prec_of((ml_precision)p).a;
                const uint64_t extra =
                    f || shapes[s][0] == 1 ? shapes[s][0] * shapes[s][1] * (16 + 16) * 64 * c : 0;
                if (sr != sl + extra)
                    fail_msg("kernel %zu, precision %d, %llu x %llu: %llu saved, nanoGPT's %llu "
                             "+ %llu",
                             k, p, (unsigned long long)shapes[s][0],
                             (unsigned long long)shapes[s][1], (unsigned long long)sr,
                             (unsigned long long)sl, (unsigned long long)extra);
                /* (no node list: the block-level backward, both; under
                 * autocast LayerNorm with the rotary has none: a layout
                 * the autocast twin does not check, chain_head.c
                 * ml__ck_autocast_ops) */
                if (ml__prec_of((ml_precision)p).autocast)
                    assert_int_equal(nr, 0);
                else
                    assert_int_equal(nr, nl ? nl + 15 : 0);
                noded += nl > 0;
                n++;
                fused += f;
                ml_model_destroy(r);
                ml_model_destroy(l);
            }
    fprintf(stderr,
            "%u layers worked by hand against nanoGPT's, %u under a fused kernel, %u with "
            "node lists\n",
            n, fused, noded);
    assert_int_equal(n, 3 * ML_PREC_COUNT * 3);
    assert_true(fused > 0 && fused < n && noded > 0);
}

static void test_grouped_neox_from_graph(void **state)
{
    (void)state;
    unsigned n[2] = {0}, refused = 0, declined[2] = {0};
    for (size_t v = 0; v < 2; v++) {
        ml_model *m = load_str(grouped[v]);
        char name[32];
        snprintf(name, sizeof name, "grouped GPT-NeoX %zu", v);
        n[v] = compare_model(m, name, &refused, &declined[v]);
        ml_model_destroy(m);
    }
    /* per kernel and precision, 3 policies x 3 shapes x 2 passes x the
     * logits kept, released and fused (refused under autocast); the fused
     * kernels: flash, and sdpa but in fp32 (grouped heads: the math
     * kernel) */
    const unsigned per = 3 * 3 * 2;
    unsigned all = 0, kept = 0;
    for (int k = 0; k < 3; k++)
        for (int p = 0; p < ML_PREC_COUNT; p++) {
            const ml_prec q = ml__prec_of((ml_precision)p);
            const unsigned c = per * (q.autocast ? ML_LOGITS_COUNT - 1 : ML_LOGITS_COUNT);
            all += c;
            if (kernels[k] == ML_ATTN_FLASH || (kernels[k] == ML_ATTN_SDPA && q.a != 4))
                kept += c;
        }
    fprintf(stderr,
            "%u configurations: one key/value head %u, two %u; the graph's layers and heads "
            "in %u and %u, refused as not modelled (a fused kernel) in %u and %u; %u fused "
            "losses refused\n",
            n[0] + n[1], n[0], n[1], n[0] - declined[0], n[1] - declined[1], declined[0],
            declined[1], refused);
    for (size_t v = 0; v < 2; v++) {
        assert_int_equal(n[v], all);
        assert_int_equal(declined[v], kept);
    }
    assert_true(kept > 0 && kept < all);
}

/* GPT-NeoX's parallel layer: y = mlp_out + attn_out + x. In backward the
 * sums hand the incoming gradient g to the MLP's branch, to the
 * attention's and to x's InputBuffer, the same tensor. The MLP's branch
 * runs first; its norm's gradient of x arrives while the attention's
 * output projection still holds g, so the buffer adds it out of place
 * (input_buffer.cpp, can_accumulate_inplace): a new sum of x's size,
 * B*T*D*4 = 2*24*64*4 = 12,288 B, then the norm's gradient freed; the
 * projection's node, the last holder of g, frees it (12,288 B). The
 * attention's norm, last, adds in place (its buffer's sum is its alone).
 * A sequential pre-norm layer (Llama) adds every gradient in place: the
 * attention's sum completes only after the MLP norm's gradient is in. */
static void test_neox_adds_out_of_place(void **state)
{
    (void)state;
    static const char *const neox =
        "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
        "  activation: gelu\n  norm: layernorm\n  parallel_residual: true\n  vocab: 173\n"
        "  position: rope\n  attention: eager\n  dropout: 0\n";
    static const char *const llama =
        "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
        "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 97\n  position: rope\n"
        "  bias: false\n  attention: eager\n  dropout: 0\n";
    for (int v = 0; v < 2; v++) {
        ml_model *m = load_str(v ? llama : neox);
        ml_config cfg = config_at(m, ML_PREC_FP32, 2, 24);
        ml_chain ch;
        ml_error e;
        assert_int_equal(ml__chain_build(m, &cfg, &ch, &e), ML_OK);
        const ml_cblock *b = &ch.blocks[2]; /* block.1 */
        assert_string_equal(b->name, "block.1");
        unsigned copies = 0, frees = 0;
        size_t at = SIZE_MAX;
        for (size_t j = 0; j < b->nnodes; j++) {
            const ml_bnode *x = &ch.nodes[b->node_first + j];
            if (x->accum_copy) {
                copies++;
                at = j;
                assert_int_equal(x->grad_in, 12288);
                assert_int_equal(x->grad_out, 12288);
            }
            if (x->frees_carry) {
                frees++;
                assert_true(at < j); /* after the new sum is made */
                assert_int_equal(x->grad_out, 12288);
                assert_non_null(strstr(x->what, "output projection"));
            }
        }
        assert_int_equal(copies, v ? 0u : 1u);
        assert_int_equal(frees, v ? 0u : 1u);
        ml__chain_free(&ch);
        ml_model_destroy(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rotary_layernorm_from_graph),
        cmocka_unit_test(test_rotary_figures),
        cmocka_unit_test(test_grouped_neox_from_graph),
        cmocka_unit_test(test_neox_adds_out_of_place),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
