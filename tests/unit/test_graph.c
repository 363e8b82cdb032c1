/* The op graph (src/graph/graph.h, docs/graph.md).
 *
 * 1. Its passes against hand-worked values on a layer small enough to walk
 *    op by op (the forward's live bytes, the bytes moved and the kernels).
 * 2. Its chains for every transformer layout it expresses, over a grid of
 *    shapes, precisions, attention kernels, dropout, selective
 *    checkpointing and evaluation: each built whole, and counted, so that a
 *    silent refusal fails. The hand-written chain builders these chains
 *    were compared with field by field (the saved inventory, the backward
 *    nodes, the parameters, the FLOPs, the transients) are gone: every
 *    transformer block comes from the graph, held byte for byte against
 *    real PyTorch (tests/torch) and, across builds, by
 *    scripts/compare-outputs.sh. The sequential models' chains are held
 *    by a hash of the figures they had when compared with their builders,
 *    before those were deleted too (test_seq_chains). */
#include "harness.h"

#include "chain_compare.h"
#include "tiny_steps.h"

#include "graph/families.h"
#include "ledger/chain_kit.h"

static const char *const tiny =
    "model:\n  type: decoder\n  layers: 1\n  hidden: 4\n  heads: 1\n"
    "  ffn: 8\n  activation: gelu\n  norm: layernorm\n  vocab: 10\n"
    "  position: learned\n  max_positions: 2\n  attention: eager\n"
    "  dropout: 0\ntraining:\n  micro_batch: 1\n  seq_len: 2\n"
    "  optimizer: sgd\n";

/* fp32 throughout, no autocast, eager attention, training */
static const mlg_config fp32 = {4, 4, false, false, false, false, false, false, false, false, false, false};
static const ml_attention kernels[] = {ML_ATTN_EAGER, ML_ATTN_SDPA, ML_ATTN_FLASH};

/* The tiny layer's graph at fp32, B = 1, T = 2. */
static void tiny_graph_as(ml_graph *g, ml_graph_sizes *z, uint64_t *tb, const mlg_config *c)
{
    ml_model *m = load_str(tiny);
    mlg_layer L;
    assert_true(ml__family_gpt2_layer(m, c, &L));
    ml__family_layer_graph(g, &L);
    assert_true(ml__graph_valid(g));
    memset(z, 0, sizeof *z);
    const uint64_t dims[MLG_NDIMS] = {[MLG_B] = 1, [MLG_T] = 2, [MLG_D] = 4, [MLG_H] = 1,
                                      [MLG_HKV] = 1, [MLG_DH] = 4, [MLG_F] = 8, [MLG_V] = 10,
                                      [MLG_DQ] = 4, [MLG_DKV] = 4, [MLG_QKV] = 12};
    memcpy(z->dim, dims, sizeof dims);
    for (int k = 0; k < MLG_NDTYPES; k++)
        z->bytes[k] = 4;
    z->bytes[MLG_HALF] = 2;
    z->bytes[MLG_INT64] = 8;
    z->bytes[MLG_BOOL] = 1;
    z->grad_bytes = 4;
    ml__graph_bytes(g, z, tb);
    assert_false(z->overflow);
    ml_model_destroy(m);
}

/* The graph with the copies a batch above one makes (fp32), sized at B = 1 */
static void tiny_graph(ml_graph *g, ml_graph_sizes *z, uint64_t *tb)
{
    tiny_graph_as(g, z, tb, &fp32);
}

/* The live-bytes pass on the layer test_forward.c walks by hand through
 * the whole plan: the climb under no_grad is 208 B above its input, and
 * with grad 468 B (its 404 B of saved tensors and its 32 B output stay,
 * 436 B of them before the output). */
static void test_forward_by_hand(void **state)
{
    (void)state;
    ml_graph g;
    ml_graph_sizes z;
    uint64_t tb[MLG_MAX_TENSORS];
    tiny_graph(&g, &z, tb);
    ml_graph_live l;
    ml__graph_forward(&g, tb, false, false, &l);
    assert_false(l.bad);
    assert_int_equal(l.peak, 208);
    assert_int_equal(l.live, 32); /* the output only */
    ml__graph_forward(&g, tb, true, false, &l);
    assert_false(l.bad);
    assert_int_equal(l.peak, 468);
    assert_int_equal(l.live, 404 + 32);
}

/* The layer's forward under no_grad as allocations and frees
 * (tiny_steps.h, derived there by hand). */
/* Steps st[0 .. n) are want's, signed (+ allocation, - free), climbing to
 * `peak` and ending at `end`. */
static void steps_are(const mlg_step *st, size_t n, const int64_t *want, size_t nw, int64_t peak,
                      int64_t end)
{
    assert_int_equal(n, nw);
    int64_t live = 0, top = 0;
    for (size_t i = 0; i < n; i++) {
        const int64_t d = st[i].alloc ? (int64_t)st[i].bytes : -(int64_t)st[i].bytes;
        assert_int_equal(d, want[i]);
        live += d;
        top = live > top ? live : top;
    }
    assert_int_equal(top, peak);
    assert_int_equal(live, end);
}

static void test_forward_steps_by_hand(void **state)
{
    (void)state;
    ml_graph g;
    ml_graph_sizes z;
    uint64_t tb[MLG_MAX_TENSORS];
    tiny_graph(&g, &z, tb);
    mlg_step st[256];
    ml_graph_live l;
    size_t n = ml__graph_forward_steps(&g, tb, false, false, st, 256, &l);
    steps_are(st, n, tiny_steps, TINY_STEPS, 208, 32);
    assert_int_equal(l.peak, 208); /* the walk's own, given beside them */
    assert_int_equal(l.live, 32);
    /* no room: no list (the caller keeps the lump), the walk still whole */
    assert_int_equal(ml__graph_forward_steps(&g, tb, false, false, st, TINY_STEPS - 1, &l), 0);
    assert_int_equal(l.peak, 208);
    /* with grad: the saved tensors are never freed (tiny_grad_steps) */
    n = ml__graph_forward_steps(&g, tb, true, false, st, 256, &l);
    steps_are(st, n, tiny_grad_steps, TINY_GRAD_STEPS, 468, 404 + 32);
    assert_int_equal(l.peak, 468);
    assert_int_equal(l.live, 404 + 32);
    /* the batch of one as PyTorch runs it: no copies for bmm */
    mlg_config one = fp32;
    one.one_row = true;
    tiny_graph_as(&g, &z, tb, &one);
    n = ml__graph_forward_steps(&g, tb, false, false, st, 256, &l);
    steps_are(st, n, tiny_fold_steps, TINY_FOLD_STEPS, 208, 32);
    n = ml__graph_forward_steps(&g, tb, true, false, st, 256, &l);
    steps_are(st, n, tiny_fold_grad_steps, TINY_FOLD_GRAD_STEPS, 468, 404 + 32);
}

/* Bytes moved and kernels, by hand, for the same layer (B = 1, T = 2,
 * D = 4, one head of 4, F = 8, fp32, biases and LayerNorm biases by
 * default). An op reads its inputs and parameters and writes its outputs;
 * views and releases move nothing. E = (B, T, D) = 32 B, a head tensor
 * (B, H, T, dh) = 32 B, S = (B, H, T, T) = 16 B, the (T, T) bool 4 B, EF =
 * (B, T, F) = 64 B; parameters: c_attn 4 x 12 x 4 + 12 x 4 = 240 B, c_proj
 * 64 + 16, c_fc 128 + 32, the MLP's proj 128 + 16, each LayerNorm 16 + 16.
 *   op              read              written
 *   ln_1            32 + 32 = 64      32 + 16 (mean, rstd) = 48
 *   c_attn          32 + 240 = 272    (B, T, 12) = 96
 *   copy q, k       32 + 32 = 64      64
 *   q k^T           64                16
 *   scale           16                16
 *   == 0            0                 4
 *   masked_fill     16 + 4 = 20       16
 *   softmax         16                16
 *   copy v          32                32
 *   P v             16 + 32 = 48      32
 *   contiguous      32                32
 *   c_proj          32 + 80 = 112     32
 *   x + attn        64                32
 *   ln_2            64                48
 *   c_fc            32 + 160 = 192    64
 *   gelu            64                64
 *   proj            64 + 144 = 208    32
 *   x + mlp         64                32
 * Read 1,396 B, written 676 B, 18 kernels. */
static void test_traffic_by_hand(void **state)
{
    (void)state;
    ml_graph g;
    ml_graph_sizes z;
    uint64_t tb[MLG_MAX_TENSORS];
    tiny_graph(&g, &z, tb);
    ml_graph_traffic per[MLG_MAX_OPS], all;
    ml__graph_traffic(&g, tb, false, per, &all);
    assert_int_equal(all.read, 1396);
    assert_int_equal(all.written, 676);
    assert_int_equal(all.kernels, 18);
}

/* ---- the transformer layouts from the graph ---- */

typedef struct {
    const char *yaml;
    uint64_t B, T;
} shape_case;

/* One layer block from the graph; false when the graph declines the
 * layout, the block then not built. */
static bool one_block(const ml_model *m, ml_precision p, uint64_t B, uint64_t T, bool selective,
                      bool eval, ml_chain *ch)
{
    memset(ch, 0, sizeof *ch);
    ch->eval_mode = eval;
    ch->selective = selective;
    ch->prec = ml__prec_of(p);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = B;
    c.training.seq_len = T;
    c.training.precision = p;
    ml_ck_dims d;
    ml_error e;
    assert_int_equal(ml__ck_dims_of(m, &c.training, ch, &d, &e), ML_OK);
    ch->record_nodes = ml__ck_node_level(ch, m);
    ml_cblock *b = ml__ck_begin(ch, "block.0", 0);
    assert_non_null(b);
    const uint64_t out = d.BT * d.D * ch->prec.w;
    b->in_bytes = out;
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    if (!ml__ck_graph_layer(ch, m, &d, G)) {
        free(G);
        assert_true((m->attn.fused_proj || m->residual.parallel) &&
                    ml__ck_fused_attention(ch->prec.a, m));
        ml__chain_free(ch);
        return false;
    }
    /* the forward walks as allocations and frees, each storage made once
     * and freed once at most (ml__graph_forward_steps: no list otherwise;
     * a repeated group's instances are walked by the chain, not here) */
    enum { STEPS = 4096 };
    mlg_step *st = malloc(STEPS * sizeof *st);
    assert_non_null(st);
    ml_graph_live l;
    const size_t n = ml__graph_forward_steps(&G->g, G->tb, !eval, eval, st, STEPS, &l);
    free(st);
    if (G->g.rep.t1 == G->g.rep.t0 && (l.bad || !n))
        fail_msg("the layer's forward walk: %s", l.bad ? "a storage freed twice" : "no steps");
    ml__ck_graph_emit(ch, b, G, out);
    free(G);
    assert_false(ch->overflow);
    assert_false(ch->nomem);
    return true;
}

/* Block 0 of a and b, and their parameters and chain-wide figures. */
/* Phi-3's and GPT-NeoX's projections with a fused kernel: the kernel
 * saves q and k as the rotary's cat made them (apply_rotary_pos_emb's
 * torch.cat with the pass, empty at a whole-head rotary) and v as a view
 * keeping the whole qkv output. The builders counted that output and left
 * out the two cat outputs; PyTorch keeps them (tests/torch, xc-phi3-flash
 * and xc-neox-flash, byte for byte, with and without autocast), and the
 * graph counts them: without autocast its layer keeps B·T·(H + Hkv)·dh
 * more bytes in the compute dtype. Under autocast the rotary's dtype
 * decides what the kernel's casts keep, which the oracle alone holds:
 * UINT64_MAX. 0 for every other layout, where the builders and the graph
 * agreed before the builders went. */
static uint64_t cat_outputs(const ml_chain *ch, const ml_model *m, uint64_t B, uint64_t T)
{
    /* (GPT-NeoX's parallel layer, not Falcon's: its rotary adds, no cat) */
    if (!(m->attn.fused_proj || (m->residual.parallel && !m->residual.shared_norm)) ||
        !ml__ck_fused_attention(ch->prec.a, m) ||
        m->embed.position != ML_POS_ROPE) /* no rotary: q and k are views of the output */
        return 0;
    if (ch->prec.autocast)
        return UINT64_MAX;
    const uint64_t dh = m->attn.head_dim ? m->attn.head_dim : m->hidden / m->attn.heads;
    const uint64_t hkv = m->attn.kv_heads ? m->attn.kv_heads : m->attn.heads;
    return B * T * (m->attn.heads + hkv) * dh * ch->prec.a;
}

/* A layer's block from the graph, whole: inventory, parameters, FLOPs,
 * transients and backward nodes present. */
static void block_whole(const ml_chain *b, const char *what)
{
    const ml_cblock *x = &b->blocks[0];
    if (b->n != 1 || !x->nsaved || !x->saved_bytes || !x->params || !(x->flops_fwd > 0) ||
        !x->ws_fwd)
        fail_msg("%s: the layer's block is not whole", what);
}

/* The layouts the graph expresses, each in settings that change its ops:
 * YAML, then fields the YAML does not reach (Hugging Face keys). */
typedef struct {
    const char *yaml;
    bool kv_cache, out_bias, mlp_bias;
} variant;

static const variant variants[] = {
    /* BERT's layout (post-norm: test_layers_from_graph's block grid skips
     * post-norm layers, its chains are built whole): the classifier,
     * dropout */
    {"model:\n  type: encoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  ffn: 512\n"
     "  activation: gelu\n  norm: layernorm\n  norm_position: post\n  vocab: 173\n"
     "  max_positions: 512\n  classes: 4\n  token_types: 2\n  dropout: 0.1\n",
     false, false, false},
    /* BERT's masked-LM layout, ReLU, no dropout */
    {"model:\n  type: encoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  ffn: 512\n"
     "  activation: relu\n  norm: layernorm\n  norm_position: post\n  vocab: 173\n"
     "  max_positions: 512\n  mlm_head: true\n  dropout: 0\n",
     false, false, false},
    /* GPT-2 small's settings (models/gpt2-small.yaml) */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 768\n  heads: 12\n  ffn: 3072\n"
     "  activation: gelu\n  norm: layernorm\n  vocab: 50257\n  position: learned\n"
     "  max_positions: 2048\n  tied_embeddings: true\n  bias: true\n  dropout: 0.1\n",
     false, false, false},
    /* no dropout, no biases, ReLU (its wide fc output the largest transient
     * at short sequences), a head size other than D/H */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  head_dim: 24\n"
     "  ffn: 2048\n  activation: relu\n  norm: layernorm\n  vocab: 97\n  position: learned\n"
     "  max_positions: 2048\n  bias: false\n  dropout: 0\n",
     false, false, false},
    /* biases on q/k/v only, dropout, an MLP narrower than the heads,
     * soft-capped logits */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 96\n  heads: 3\n  ffn: 48\n"
     "  activation: gelu\n  norm: layernorm\n  vocab: 11\n  position: none\n"
     "  bias: false\n  qkv_bias: true\n  dropout: 0.2\n  final_softcap: 30\n",
     false, false, false},
    /* Gemma 2's layout (tests/torch/models/gemma2.yaml at a larger width):
     * post norms, soft-capped scores and logits, a head size of its own */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  kv_heads: 2\n"
     "  head_dim: 64\n  ffn: 320\n  activation: geglu\n  norm: gemma_rmsnorm\n"
     "  post_norms: true\n  attn_scalar: 24\n  attn_softcap: 50\n  final_softcap: 30\n"
     "  embedding_scale: true\n  vocab: 173\n  position: rope\n  tied_embeddings: true\n"
     "  bias: false\n  dropout: 0\n",
     true, false, false},
    /* Llama 2's layout (models/llama-2-7b.yaml) at a smaller width, with
     * a KV cache in evaluation */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 256\n  heads: 8\n  kv_heads: 8\n"
     "  ffn: 688\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 320\n  position: rope\n"
     "  bias: false\n  dropout: 0\n",
     true, false, false},
    /* grouped heads (repeat_kv copies), a head size other than D/H, GeGLU,
     * q/k/v, output and MLP biases, dropout */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 256\n  heads: 8\n  kv_heads: 2\n"
     "  head_dim: 48\n  ffn: 512\n  activation: geglu\n  norm: rmsnorm\n  vocab: 320\n"
     "  position: rope\n  bias: false\n  qkv_bias: true\n  dropout: 0.1\n",
     false, true, true},
    /* one key/value head (repeat_kv's zero-stride view, which matmul
     * copies), no rotary, dropout, a KV cache */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  kv_heads: 1\n"
     "  ffn: 344\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 320\n  position: learned\n"
     "  max_positions: 2048\n  bias: false\n  dropout: 0.1\n",
     true, false, false},
    /* Gemma's layout: its RMSNorm, GeGLU, a head size of its own, one
     * key/value head, dropout, the embeddings' scale */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  kv_heads: 1\n"
     "  head_dim: 48\n  ffn: 344\n  activation: geglu\n  norm: gemma_rmsnorm\n  vocab: 320\n"
     "  position: rope\n  bias: false\n  embedding_scale: true\n  tied_embeddings: true\n"
     "  dropout: 0.1\n",
     true, false, false},
    /* ViT's layout: an image encoder's pre-norm layer (17 tokens: 16
     * patches and the class token, whatever the shape asks), dropout */
    {"model:\n  type: encoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
     "  activation: gelu\n  norm: layernorm\n  norm_position: pre\n  image_size: 32\n"
     "  patch_size: 8\n  classes: 10\n  qkv_bias: true\n  dropout: 0.1\n",
     false, false, false},
    /* Phi-3's layout: fused qkv_proj and gate_up_proj, grouped heads, a
     * KV cache (not kept: views of one output), dropout */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 8\n  kv_heads: 4\n"
     "  ffn: 344\n  activation: swiglu\n  norm: rmsnorm\n  fused_projections: true\n"
     "  vocab: 320\n  position: rope\n  bias: false\n  dropout: 0.1\n",
     true, true, false},
    /* Phi-3's projections with one key/value head and no rotary */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  kv_heads: 1\n"
     "  ffn: 344\n  activation: geglu\n  norm: rmsnorm\n  fused_projections: true\n"
     "  vocab: 320\n  position: learned\n  max_positions: 2048\n  bias: false\n"
     "  dropout: 0\n",
     false, false, true},
    /* Phi-3's projections, as many kv heads as q heads */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n"
     "  ffn: 344\n  activation: swiglu\n  norm: rmsnorm\n  fused_projections: true\n"
     "  vocab: 320\n  position: rope\n  bias: false\n  dropout: 0\n",
     false, false, false},
    /* ViT's layout with rotary positions */
    {"model:\n  type: encoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  ffn: 256\n"
     "  activation: gelu\n  norm: layernorm\n  norm_position: pre\n  image_size: 32\n"
     "  patch_size: 8\n  classes: 10\n  position: rope\n  dropout: 0\n",
     false, false, false},
    /* Gemma 2's post norms around a plain GELU MLP */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  ffn: 320\n"
     "  activation: gelu\n  norm: gemma_rmsnorm\n  post_norms: true\n  vocab: 173\n"
     "  position: rope\n  bias: false\n  dropout: 0\n",
     false, false, false},
    /* GPT-NeoX's layout: a parallel residual, query_key_value sliced,
     * rotary with its pass, biases, dropout */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  ffn: 512\n"
     "  activation: gelu\n  norm: layernorm\n  parallel_residual: true\n  vocab: 173\n"
     "  position: rope\n  bias: true\n  dropout: 0.1\n",
     false, false, false},
    /* an RMSNorm decoder with nanoGPT's ReLU MLP (wide) */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  kv_heads: 4\n"
     "  ffn: 2048\n  activation: relu\n  norm: rmsnorm\n  vocab: 320\n  position: rope\n"
     "  bias: false\n  dropout: 0\n",
     false, false, false},
    /* Falcon's layout (tests/torch/models/falcon.yaml at a larger width):
     * one shared LayerNorm, multi_query (the index lists), rotary, a KV
     * cache in evaluation */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  kv_heads: 1\n"
     "  ffn: 512\n  activation: gelu\n  norm: layernorm\n  norm_bias: true\n"
     "  parallel_residual: true\n  shared_norm: true\n  vocab: 173\n  position: rope\n"
     "  tied_embeddings: true\n  bias: false\n  dropout: 0\n",
     true, false, false},
    /* Falcon's layout with as many key/value heads as query heads, q/k/v
     * biases, no norm bias, a head size other than D/H, ReLU, learned
     * positions (q, k and v views of query_key_value's output), a KV cache
     * in evaluation (holding two of those views) */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 96\n  heads: 3\n  kv_heads: 3\n"
     "  head_dim: 40\n  ffn: 200\n  activation: relu\n  norm: layernorm\n"
     "  norm_bias: false\n  parallel_residual: true\n  shared_norm: true\n  vocab: 97\n"
     "  position: learned\n  max_positions: 2048\n  bias: false\n  qkv_bias: true\n"
     "  dropout: 0\n",
     true, false, false},
    /* Falcon's multi_query without a rotary (learned positions): q a view
     * of query_key_value's output, k and v picked */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 128\n  heads: 4\n  kv_heads: 1\n"
     "  ffn: 512\n  activation: gelu\n  norm: layernorm\n  norm_bias: true\n"
     "  parallel_residual: true\n  shared_norm: true\n  vocab: 173\n  position: learned\n"
     "  max_positions: 2048\n  bias: false\n  dropout: 0\n",
     true, false, false},
    /* DeepSeek-V3's latent attention (tests/torch/models/deepseek.yaml's)
     * with a dense MLP in every layer: q compressed, a KV cache */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  head_dim: 24\n"
     "  rope_head_dim: 8\n  v_head_dim: 16\n  kv_lora_rank: 32\n  q_lora_rank: 40\n"
     "  ffn: 96\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
     "  bias: false\n  dropout: 0\n",
     true, false, false},
    /* DeepSeek-V2-Lite's: q_proj, complex rotary, values wider than the
     * keys' pass part, GeGLU */
    {"model:\n  type: decoder\n  layers: 1\n  hidden: 96\n  heads: 3\n  head_dim: 20\n"
     "  rope_head_dim: 4\n  v_head_dim: 36\n  kv_lora_rank: 24\n  rope_complex: true\n"
     "  ffn: 80\n  activation: geglu\n  norm: rmsnorm\n  vocab: 97\n  position: rope\n"
     "  bias: false\n  dropout: 0\n",
     false, false, false},
};

/* variants[v] with the settings YAML has no key for */
static ml_model *load_variant(size_t v)
{
    ml_model *m = load_str(variants[v].yaml);
    m->attn.kv_cache = variants[v].kv_cache;
    m->attn.out_bias = variants[v].out_bias;
    m->mlp.bias = variants[v].mlp_bias;
    return m;
}

/* Every pre-norm variant's layer block from the graph, whole, under every
 * kernel, precision, shape, selective and evaluation (the builders'
 * field-by-field comparison held them byte for byte before they went). */
static void test_layers_from_graph(void **state)
{
    (void)state;
    static const uint64_t shapes[][2] = {{1, 7}, {3, 64}, {2, 1024}, {1, 1}};
    const size_t nv = sizeof variants / sizeof variants[0];
    unsigned built = 0, by_oracle = 0, falcon = 0, latent = 0;
    for (size_t v = 0; v < nv; v++) {
        ml_model *m = load_variant(v);
        for (size_t k = 0; k < 3 && m->residual.prenorm; k++) {
            m->attn.kernel = kernels[k];
            for (int p = 0; p < ML_PREC_COUNT; p++)
                for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                    for (int mode = 0; mode < 4; mode++) {
                        const bool sel = mode & 1, ev = mode & 2;
                        char what[160];
                        snprintf(what, sizeof what,
                                 "variant %zu, attention %zu, precision %d, B %llu T %llu%s%s", v,
                                 k, p, (unsigned long long)shapes[s][0],
                                 (unsigned long long)shapes[s][1], sel ? ", selective" : "",
                                 ev ? ", eval" : "");
                        ml_chain b;
                        assert_true(one_block(m, (ml_precision)p, shapes[s][0], shapes[s][1],
                                              sel, ev, &b));
                        block_whole(&b, what);
                        falcon += m->residual.shared_norm;
                        latent += m->attn.kv_lora > 0;
                        /* the fused kernels' cat outputs, which the
                         * builders left out: in the graph's inventory */
                        const uint64_t extra = cat_outputs(&b, m, shapes[s][0], shapes[s][1]);
                        if (extra && extra != UINT64_MAX && b.blocks[0].saved_bytes < extra)
                            fail_msg("%s: the cat outputs not kept", what);
                        by_oracle += extra != 0;
                        built += !extra && !m->attn.kv_lora;
                        ml__chain_free(&b);
                    }
        }
        ml_model_destroy(m);
    }
    /* held by the oracle (cat_outputs): the two Phi-3 variants with a
     * rotary and GPT-NeoX's, under sdpa and flash, where every precision
     * dispatches a fused kernel except fp32 with grouped heads under sdpa
     * (the math kernel: the first Phi-3 variant, fp32 only) */
    assert_int_equal(built + by_oracle, (nv - 4) * 3 * ML_PREC_COUNT * 4 * 4);
    assert_int_equal(by_oracle, (3 * 2 * ML_PREC_COUNT - 1) * 4 * 4);
    /* Falcon's three variants, every kernel (sdpa with one key/value head
     * runs the math kernel; flash, or sdpa with H, a fused one) */
    assert_int_equal(falcon, 3 * 3 * ML_PREC_COUNT * 4 * 4);
    /* latent attention's two (the eager layout under every kernel) */
    assert_int_equal(latent, 2 * 3 * ML_PREC_COUNT * 4 * 4);
}

/* ml__family_layer refuses what is not a pre- or post-norm transformer
 * layer: T5's (its own, ml__family_t5_layer: test_graph_t5.c), the
 * sequential models', Mixtral's (experts), DeepSeek's (latent
 * attention); GPT-2's, Llama's, Gemma's, Gemma 2's, Phi-3's,
 * GPT-NeoX's, Falcon's and ViT's are taken. */
static void test_other_layouts_refused(void **state)
{
    (void)state;
    mlg_layer L;
    static const char *const refused[] = {"t5-base", "cifar10-resnet", "mlp2"};
    for (size_t i = 0; i < sizeof refused / sizeof refused[0]; i++) {
        ml_model *m = load_preset(refused[i]);
        assert_false(ml__family_layer(m, &fp32, &L));
        ml_model_destroy(m);
    }
    /* Mixtral's and Qwen2-MoE's experts are the kit's (kit_mixtral.c):
     * test_mixtral_layers_from_graph, test_mixtral_chains_from_graph */
    /* DeepSeek's experts are the kit's (kit_moe.c) */
    static const char *const moe[] = {"deepseek-v3", "deepseek-v2-lite"};
    for (size_t i = 0; i < 2; i++) {
        ml_model *m = load_hf_config(moe[i]);
        assert_true(ml__family_layer(m, &fp32, &L));
        assert_int_equal(L.moe.kind, i ? MLG_MOE_DEEPSEEK_V2 : MLG_MOE_DEEPSEEK_V3);
        assert_true(L.moe.shared && L.moe.h32 && L.attn.latent);
        ml_model_destroy(m);
    }
    ml_model *m = load_preset("gpt2-small");
    assert_true(ml__family_gpt2_layer(m, &fp32, &L));
    ml_model_destroy(m);
    m = load_preset("llama-2-7b");
    assert_false(ml__family_gpt2_layer(m, &fp32, &L));
    assert_true(ml__family_llama_layer(m, &fp32, &L));
    ml_model_destroy(m);
    m = load_hf_config("phi-3-mini-4k");
    assert_true(ml__family_llama_layer(m, &fp32, &L));
    assert_true(L.attn.fused_proj && L.attn.o_first && L.mlp.fused);
    const mlg_config fk = {4, 4, false, false, true, false, false, false, false, false, false, false};
    assert_true(ml__family_layer(m, &fk, &L)); /* sdpa or flash: the graph too */
    ml_model_destroy(m);
    m = load_preset("vit-b16");
    assert_true(ml__family_vit_layer(m, &fp32, &L));
    assert_false(L.attn.mask || L.attn.rope || L.hf_order);
    ml_model_destroy(m);
    m = load_hf_config("gemma-2b");
    assert_false(ml__family_llama_layer(m, &fp32, &L));
    assert_true(ml__family_gemma_layer(m, &fp32, &L));
    assert_int_equal(L.norm.kind, MLG_GEMMA_RMSNORM);
    assert_false(L.post_norms);
    ml_model_destroy(m);
    m = load_hf_config("gemma-2-2b");
    /* its config.json names no attn_implementation: sdpa, which
     * transformers calls without the scores' cap (docs/hf.md) */
    assert_true(ml__family_gemma_layer(m, &fp32, &L));
    assert_true(L.post_norms && !L.attn.softcap);
    assert_int_equal(ml_model_set_attention(m, "eager", NULL), ML_OK);
    assert_true(ml__family_gemma_layer(m, &fp32, &L));
    assert_true(L.post_norms && L.attn.softcap && L.post.held);
    ml_model_destroy(m);
    m = load_hf_config("falcon-7b");
    assert_false(ml__family_neox_layer(m, &fp32, &L));
    assert_true(ml__family_falcon_layer(m, &fp32, &L));
    assert_true(L.parallel && L.shared_norm && L.attn.split_heads && L.attn.grouped);
    assert_true(ml__family_layer(m, &fk, &L)); /* a fused kernel too */
    ml_model_destroy(m);
}

/* Whole chains — embedding, every layer (the first emitted from the
 * graph, the others its copies), head, loss — of every preset and shipped
 * config.json, built both ways, in training and evaluation, under each
 * precision, attention kernel and checkpoint policy that changes a block. */
static unsigned compare_model_vt(ml_model *m, const char *name, ml_vision_tower vt,
                                 unsigned *fused);

/* The chains built; *fused counts those with the fused loss. */
static unsigned compare_model(ml_model *m, const char *name, unsigned *fused)
{
    unsigned n = 0;
    /* a multimodal model under each vision-tower setting (its checkpoint
     * indices and the tower's blocks change; the decoder is the graph's) */
    for (int vt = 0; vt < (m->vision.layers ? ML_VT_COUNT : 1); vt++)
        n += compare_model_vt(m, name, (ml_vision_tower)vt, fused);
    return n;
}

static unsigned compare_model_vt(ml_model *m, const char *name, ml_vision_tower vt,
                                 unsigned *fused)
{
    unsigned compared = 0;
    static const char *const policies[] = {"none", "selective", "none"};
    const ml_attention own = m->attn.kernel;
    for (size_t k = 0; k < 3; k++) {
        m->attn.kernel = kernels[k];
        for (int p = 0; p < ML_PREC_COUNT; p++)
            for (size_t c = 0; c < 3; c++)
                for (int ev = 0; ev < 2; ev++) {
                    ml_config cfg = ml_model_config(m);
                    cfg.training.precision = (ml_precision)p;
                    /* the third: no checkpointing, the fused linear
                     * cross-entropy (the head is its norm alone) */
                    if (c == 2)
                        cfg.training.logits = ML_LOGITS_FUSED;
                    cfg.training.micro_batch = 2;
                    /* LLaVA's sequence holds its image's 576 tokens */
                    if (cfg.training.seq_len > 256 && !m->vision.layers)
                        cfg.training.seq_len = 256;
                    cfg.calib = NULL;
                    cfg.training.vision_tower = vt;
                    ml_error e;
                    assert_int_equal(ml_parse_checkpoint(policies[c], &cfg.training.checkpoint, &e),
                                     ML_OK);
                    ml_chain b;
                    ml_status sb = ev ? ml__chain_build_eval(m, &cfg, &b, &e)
                                      : ml__chain_build(m, &cfg, &b, &e);
                    /* only the fused loss is refused (under autocast, or for
                     * a head other than a language model's), and latent
                     * attention under sdpa and flash */
                    if (sb != ML_OK && c != 2 && !(m->attn.kv_lora && kernels[k] != ML_ATTN_EAGER))
                        fail_msg("%s: refused: %s", name, e.msg);
                    if (sb != ML_OK)
                        continue;
                    /* every block from the graph: the chain built whole is
                     * the assertion (and the count) */
                    char what[200];
                    snprintf(what, sizeof what, "%s, attention %zu, precision %d, %s%s%s", name,
                             k, p, policies[c], c == 2 ? ", fused logits" : "", ev ? ", eval" : "");
                    chain_whole(&b, m, what);
                    ml__chain_free(&b);
                    compared++;
                    *fused += c == 2;
                }
    }
    m->attn.kernel = own;
    return compared;
}

/* Whole chains from the graph (embedding, layers, head, loss) for the
 * presets, the shipped configs and the variants, counted (no chain builder
 * is left: a layout the graph declines is refused with ML_RANGE). */
static void test_chains_from_graph(void **state)
{
    (void)state;
    unsigned n = 0, fused = 0, falcon = 0, latent = 0;
    static const char *const presets[] = {"agnews-classifier", "vit-b16", "gpt2-small", "gpt2-medium", "llama-2-7b",
                                          "llama-3-8b", "video-tokens", "llava-1.5-7b"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        ml_model *m = load_preset(presets[i]);
        n += compare_model(m, presets[i], &fused);
        ml_model_destroy(m);
    }
    static const char *const hf[] = {"gpt2",         "llama-2-7b", "mistral-7b", "mistral-nemo-12b",
                                     "qwen2-0.5b",   "llava-1.5-7b", "gemma-2b", "gemma-2-2b",
                                     "gemma-2-9b",   "vit-base-patch16-224", "phi-3-mini-4k",
                                     "pythia-160m", "bert-base-uncased", "falcon-7b"};
    for (size_t i = 0; i < sizeof hf / sizeof hf[0]; i++) {
        ml_model *m = load_hf_config(hf[i]);
        const unsigned k = compare_model(m, hf[i], &fused);
        n += k;
        falcon += m->residual.shared_norm ? k : 0;
        ml_model_destroy(m);
    }
    for (size_t v = 0; v < sizeof variants / sizeof variants[0]; v++) {
        ml_model *m = load_variant(v);
        m->layers = 3;
        const unsigned k = compare_model(m, "variant", &fused);
        n += k;
        falcon += m->residual.shared_norm ? k : 0;
        latent += m->attn.kv_lora ? k : 0;
        ml_model_destroy(m);
    }
    /* 44 models x 3 kernels x 6 precisions x 3 settings x 2 passes (no
     * other refusal: asserted above), less the fused losses refused and
     * latent attention's fused kernels: at most a third */
    fprintf(stderr,
            "%u chains from the graph, whole, %u "
            "with the fused loss, %u of Falcon's layout, %u with latent "
            "attention\n",
            n, fused, falcon, latent);
    assert_true(n >= 44 * 3 * 6 * 3 * 2 * 2 / 3);
    /* the fused loss is built, not only refused: at least gpt2-small's
     * 3 kernels x 2 passes under fp32, the one precision without autocast
     * that every decoder takes */
    assert_true(fused >= 3 * 2);
    /* Falcon's chains are the graph's, not refused: falcon-7b and two
     * variants, 3 kernels x 6 precisions x 2 passes without the fused
     * loss at least */
    assert_true(falcon >= 3 * 3 * ML_PREC_COUNT * 2 * 2);
    /* latent attention's two variants: eager, 6 precisions x 2 passes
     * without the fused loss at least */
    assert_true(latent >= 2 * ML_PREC_COUNT * 2 * 2);
}

/* ---- DeepSeek's mixture-of-experts layers (graph/kit_moe.c) ---- */

/* tests/torch/models/deepseek.yaml's and deepseek2.yaml's layers with an
 * expert layer first (dense_layers 0): V3's sigmoid router, V2's softmax
 * and sorted dispatch */
static const char *const moe_variants[] = {
    "model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  head_dim: 24\n"
    "  rope_head_dim: 8\n  v_head_dim: 16\n  kv_lora_rank: 32\n  q_lora_rank: 40\n"
    "  ffn: 96\n  experts: 6\n  experts_per_tok: 2\n  expert_ffn: 24\n"
    "  shared_expert_ffn: 48\n  shared_expert_gate: false\n  router: sigmoid\n"
    "  dense_layers: 0\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n"
    "  position: rope\n  bias: false\n  attention: eager\n  dropout: 0\n",
    "model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  head_dim: 24\n"
    "  rope_head_dim: 8\n  v_head_dim: 16\n  kv_lora_rank: 32\n  rope_complex: true\n"
    "  ffn: 96\n  experts: 6\n  experts_per_tok: 2\n  expert_ffn: 24\n"
    "  shared_expert_ffn: 48\n  expert_dispatch: sort\n  grouped_topk: true\n"
    "  dense_layers: 0\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 97\n"
    "  position: rope\n  bias: false\n  attention: eager\n  dropout: 0\n",
};

/* An expert layer's block from the graph alone (no builder writes it;
 * the builders' comparison held it byte for byte before they went): V3 and V2, the top-k renormalised or not (V3) and the group mask or not (V2),
 * with and without shared experts, each kernel (latent attention's eager
 * layout), precision, shape, selective and evaluation, and three routings:
 * balanced, an imbalance, every pair of a token on the busiest expert
 * (training.expert_imbalance past B*T). */
static void test_moe_layers_from_graph(void **state)
{
    (void)state;
    static const uint64_t shapes[][2] = {{1, 7}, {3, 64}, {2, 1024}, {1, 1}};
    static const double imbalance[] = {1, 1.7, 1e6};
    unsigned compared = 0;
    for (size_t v = 0; v < 2; v++)
        for (int opt = 0; opt < 4; opt++) {
            ml_model *m = load_str(moe_variants[v]);
            if (v == 0)
                m->moe.renorm = opt & 1;
            else
                m->moe.grouped_topk = opt & 1;
            m->moe.shared_ffn = opt & 2 ? 0 : 48;
            for (size_t k = 0; k < 3; k++) {
                m->attn.kernel = kernels[k];
                for (int p = 0; p < ML_PREC_COUNT; p++)
                    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                        for (int mode = 0; mode < 4; mode++)
                            for (size_t r = 0; r < 3; r++) {
                                const bool sel = mode & 1, ev = mode & 2;
                                m->config.training.expert_imbalance = imbalance[r];
                                char what[160];
                                snprintf(what, sizeof what,
                                         "moe %zu/%d, attention %zu, precision %d, B %llu T "
                                         "%llu, imbalance %g%s%s",
                                         v, opt, k, p, (unsigned long long)shapes[s][0],
                                         (unsigned long long)shapes[s][1], imbalance[r],
                                         sel ? ", selective" : "", ev ? ", eval" : "");
                                ml_chain b;
                                assert_true(one_block(m, (ml_precision)p, shapes[s][0],
                                                      shapes[s][1], sel, ev, &b));
                                block_whole(&b, what);
                                compared++;
                                ml__chain_free(&b);
                            }
            }
            ml_model_destroy(m);
        }
    assert_int_equal(compared, 2 * 4 * 3 * ML_PREC_COUNT * 4 * 4 * 3);
}

/* Whole chains of DeepSeek's expert models: the shipped configs
 * (DeepSeek-V3: 3 dense layers then 58 expert layers of 256 experts;
 * V2-Lite: 1 then 26 of 64) and the torch twins (1 dense layer, 2 expert
 * layers), both layouts emitted once and copied, from the graph. */
/* Both of m's layouts are the graph's under every precision (the chain
 * builds them from it; a declined one would be refused): the count. */
static unsigned both_layouts_taken(const ml_model *m)
{
    unsigned n = 0;
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    for (int p = 0; p < ML_PREC_COUNT; p++) {
        ml_chain ch;
        memset(&ch, 0, sizeof ch);
        ch.prec = ml__prec_of((ml_precision)p);
        ml_config c = ml_model_config(m);
        ml_ck_dims d;
        ml_error e;
        assert_int_equal(ml__ck_dims_of(m, &c.training, &ch, &d, &e), ML_OK);
        n += ml__ck_graph_layer_at(&ch, m, &d, 0, G);
        assert_int_equal(G->g.t[0].role, MLG_INPUT);
        n += ml__ck_graph_layer_at(&ch, m, &d, m->moe.dense_layers, G);
        /* a quarter of each fixed array to spare */
        assert_true(G->g.nt <= MLG_MAX_TENSORS * 3 / 4 && G->g.nop <= MLG_MAX_OPS * 3 / 4);
        if (p == ML_PREC_AMP_BF16)
            fprintf(stderr, "%s expert layer: %u tensors, %u ops\n", m->name, G->g.nt, G->g.nop);
    }
    free(G);
    return n;
}

static void test_moe_chains_from_graph(void **state)
{
    (void)state;
    unsigned n = 0, fused = 0, taken = 0;
    static const char *const hf[] = {"deepseek-v3", "deepseek-v2-lite"};
    for (size_t i = 0; i < 2; i++) {
        ml_model *m = load_hf_config(hf[i]);
        assert_true(m->moe.dense_layers > 0 && m->moe.dense_layers < m->layers);
        taken += both_layouts_taken(m);
        n += compare_model(m, hf[i], &fused);
        ml_model_destroy(m);
    }
    static const char *const twins[] = {"deepseek", "deepseek2"};
    for (size_t i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/../tests/torch/models/%s.yaml", ML_MODELS_DIR, twins[i]);
        ml_model *m = NULL;
        ml_error e;
        if (ml_model_load_file(path, &m, &e) != ML_OK)
            fail_msg("%s: %s", path, e.msg);
        taken += both_layouts_taken(m);
        for (size_t r = 0; r < 2; r++) {
            m->config.training.expert_imbalance = r ? 2.5 : 1;
            n += compare_model(m, twins[i], &fused);
        }
        ml_model_destroy(m);
    }
    fprintf(stderr, "%u DeepSeek expert chains from the graph\n", n);
    assert_int_equal(taken, 4 * 2 * ML_PREC_COUNT);
    /* eager (latent attention refuses sdpa and flash) x 6 precisions x 2
     * checkpoint settings x 2 passes, plus the fused loss where taken: 6
     * models' worth */
    assert_true(n >= 6 * ML_PREC_COUNT * 2 * 2);
}

/* ---- Mixtral's and Qwen2-MoE's expert layers (graph/kit_mixtral.c) ---- */

/* tests/torch/models/mixtral.yaml's and qwen2moe.yaml's layers, and
 * Qwen1.5-MoE-A2.7B's routing (60 experts, 4 a token) at a small width */
static const char *const mixtral_variants[] = {
    "model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
    "  ffn: 96\n  experts: 4\n  experts_per_tok: 2\n  activation: swiglu\n  norm: rmsnorm\n"
    "  vocab: 173\n  position: rope\n  bias: false\n  attention: eager\n  dropout: 0\n",
    "model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 8\n  kv_heads: 4\n"
    "  ffn: 160\n  experts: 6\n  experts_per_tok: 3\n  expert_ffn: 48\n"
    "  shared_expert_ffn: 96\n  expert_renorm: false\n  activation: swiglu\n  norm: rmsnorm\n"
    "  vocab: 173\n  position: rope\n  bias: false\n  qkv_bias: true\n  attention: eager\n"
    "  dropout: 0\n",
    "model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n"
    "  ffn: 64\n  experts: 60\n  experts_per_tok: 4\n  expert_ffn: 16\n"
    "  shared_expert_ffn: 64\n  expert_renorm: false\n  activation: swiglu\n  norm: rmsnorm\n"
    "  vocab: 97\n  position: rope\n  bias: false\n  qkv_bias: true\n  attention: eager\n"
    "  dropout: 0\n",
};

/* An expert layer's block from the graph alone (as DeepSeek's): the
 * three variants, each with the top-k renormalised or not and with and
 * without the shared expert, under each kernel, precision, shape (fewer
 * routed rows than experts at B = T = 1), selective and evaluation, and
 * three routings: balanced, an imbalance, every pair of a token on the
 * busiest expert (its rows then B*T). */
static void test_mixtral_layers_from_graph(void **state)
{
    (void)state;
    static const uint64_t shapes[][2] = {{1, 7}, {3, 64}, {2, 1024}, {1, 1}};
    static const double imbalance[] = {1, 1.7, 1e6};
    unsigned compared = 0;
    for (size_t v = 0; v < 3; v++)
        for (int opt = 0; opt < 4; opt++) {
            ml_model *m = load_str(mixtral_variants[v]);
            m->moe.renorm = opt & 1;
            m->moe.shared_ffn = opt & 2 ? 0 : (v ? 2 * m->moe.expert_ffn : 48);
            for (size_t k = 0; k < 3; k++) {
                m->attn.kernel = kernels[k];
                for (int p = 0; p < ML_PREC_COUNT; p++)
                    for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
                        for (int mode = 0; mode < 4; mode++)
                            for (size_t r = 0; r < 3; r++) {
                                const bool sel = mode & 1, ev = mode & 2;
                                m->config.training.expert_imbalance = imbalance[r];
                                char what[160];
                                snprintf(what, sizeof what,
                                         "mixtral %zu/%d, attention %zu, precision %d, B %llu "
                                         "T %llu, imbalance %g%s%s",
                                         v, opt, k, p, (unsigned long long)shapes[s][0],
                                         (unsigned long long)shapes[s][1], imbalance[r],
                                         sel ? ", selective" : "", ev ? ", eval" : "");
                                ml_chain b;
                                assert_true(one_block(m, (ml_precision)p, shapes[s][0],
                                                      shapes[s][1], sel, ev, &b));
                                block_whole(&b, what);
                                compared++;
                                ml__chain_free(&b);
                            }
            }
            ml_model_destroy(m);
        }
    assert_int_equal(compared, 3 * 4 * 3 * ML_PREC_COUNT * 4 * 4 * 3);
}

/* m's expert layer is the graph's under every precision, its repeated
 * group one expert, with a quarter of each array to spare: the count. */
static unsigned mixtral_taken(const ml_model *m)
{
    unsigned n = 0;
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    for (int p = 0; p < ML_PREC_COUNT; p++) {
        ml_chain ch;
        memset(&ch, 0, sizeof ch);
        ch.prec = ml__prec_of((ml_precision)p);
        ml_config c = ml_model_config(m);
        ml_ck_dims d;
        ml_error e;
        assert_int_equal(ml__ck_dims_of(m, &c.training, &ch, &d, &e), ML_OK);
        n += ml__ck_graph_layer(&ch, m, &d, G);
        const mlg_repeat *r = &G->g.rep;
        assert_true(r->t1 > r->t0 && r->o1 > r->o0 && G->z.nruns >= 1);
        assert_true(G->g.nt <= MLG_MAX_TENSORS * 3 / 4 && G->g.nop <= MLG_MAX_OPS * 3 / 4);
        if (p == ML_PREC_AMP_BF16)
            fprintf(stderr, "%s expert layer: %u tensors (%u an expert's), %u ops (%u)\n",
                    m->name, G->g.nt, r->t1 - r->t0, G->g.nop, r->o1 - r->o0);
    }
    free(G);
    return n;
}

/* Whole chains of Mixtral's and Qwen2-MoE's models: the shipped configs
 * (Mixtral-8x7B: 32 layers of 8 experts, 2 a token; Qwen1.5-MoE-A2.7B: 24
 * layers of 60, 4 a token, a shared expert) and the torch twins (at two
 * routings), every layer the graph's first layer or its copy. */
static void test_mixtral_chains_from_graph(void **state)
{
    (void)state;
    unsigned n = 0, fused = 0, taken = 0;
    mlg_layer L;
    static const char *const hf[] = {"mixtral-8x7b", "qwen1.5-moe-a2.7b"};
    for (size_t i = 0; i < 2; i++) {
        ml_model *m = load_hf_config(hf[i]);
        assert_true(ml__family_layer(m, &fp32, &L));
        assert_int_equal(L.moe.kind, MLG_MOE_MIXTRAL);
        assert_true(L.moe.shared == (i == 1) && L.moe.renorm == (i == 0));
        taken += mixtral_taken(m);
        n += compare_model(m, hf[i], &fused);
        ml_model_destroy(m);
    }
    static const char *const twins[] = {"mixtral", "qwen2moe"};
    for (size_t i = 0; i < 2; i++) {
        char path[1024];
        snprintf(path, sizeof path, "%s/../tests/torch/models/%s.yaml", ML_MODELS_DIR, twins[i]);
        ml_model *m = NULL;
        ml_error e;
        if (ml_model_load_file(path, &m, &e) != ML_OK)
            fail_msg("%s: %s", path, e.msg);
        taken += mixtral_taken(m);
        for (size_t r = 0; r < 2; r++) {
            m->config.training.expert_imbalance = r ? 2.5 : 1;
            n += compare_model(m, twins[i], &fused);
        }
        ml_model_destroy(m);
    }
    fprintf(stderr, "%u Mixtral and Qwen2-MoE chains from the graph, %u with the fused loss\n", n,
            fused);
    assert_int_equal(taken, 4 * ML_PREC_COUNT);
    /* 6 models' worth x 3 kernels x 6 precisions x 2 checkpoint settings x
     * 2 passes (no refusal but the fused loss: asserted in compare_model) */
    assert_true(n >= 6 * 3 * ML_PREC_COUNT * 2 * 2);
}

/* The repeated group's rules (graph.h): one a graph, its tensors saved
 * by its own ops only, what its ops save outside it kept. */
static void test_repeat_refused(void **state)
{
    (void)state;
    ml_graph g;
    for (int c = 0; c < 4; c++) {
        ml__graph_init(&g);
        uint16_t x = ml__graph_tensor(&g, "x", MLG_COMPUTE, MLG_ACT, 2, MLG_B, MLG_D);
        uint16_t y = ml__graph_tensor(&g, "y (repeated)", MLG_COMPUTE, MLG_ACT, 2, MLG_NE, MLG_D);
        uint16_t z = ml__graph_tensor(&g, "z", MLG_COMPUTE, MLG_ACT, 2, MLG_B, MLG_D);
        mlg_op *o = ml__graph_step(&g, MLG_OP_COPY, "rows", x, y, NULL);
        ml__op_save(o, y);
        if (c == 1)
            ml__op_save(o, x); /* outside the group, not kept */
        ml__graph_repeat(&g, y, (uint16_t)(y + 1), 0, 1);
        o = ml__graph_step(&g, MLG_OP_COPY, "after", y, z, NULL);
        if (c == 2)
            ml__op_save(o, y); /* the group's, by an op outside it */
        if (c == 3)
            ml__graph_repeat(&g, y, (uint16_t)(y + 1), 0, 1); /* a second group */
        assert_true(ml__graph_valid(&g) == (c == 0));
    }
}

/* ---- LLaVA's vision tower: its layers from the graph (kit_clip.c) ---- */

/* A small LLaVA (tests/torch/models/llava.yaml's shape) with lv vision
 * layers of width vh, the feature layer fl, the feature selection,
 * activation and projector bias given; its decoder's attention kernel set
 * per chain. */
static ml_model *llava_variant_of(unsigned lv, unsigned vh, int fl, const char *sel,
                                  const char *act, bool bias)
{
    char y[1024];
    snprintf(y, sizeof y,
             "model:\n  type: multimodal\n  stacks:\n    vision:\n      layers: %u\n"
             "      hidden: %u\n      heads: 4\n      ffn: 64\n      image_size: 16\n"
             "      patch_size: 4\n      activation: %s\n      feature_layer: %d\n"
             "      feature_select: %s\n    projector: {bias: %s}\n    decoder:\n"
             "      layers: 2\n      hidden: 48\n      heads: 4\n      kv_heads: 2\n"
             "      ffn: 96\n      vocab: 157\n      norm: rmsnorm\n      activation: swiglu\n"
             "      position: rope\n      bias: false\n      dropout: 0\n"
             "training:\n  seq_len: 24\n",
             lv, vh, act, fl, sel, bias ? "true" : "false");
    return load_str(y);
}

static ml_model *llava_variant(unsigned lv, int fl, const char *sel, const char *act)
{
    return llava_variant_of(lv, 32, fl, sel, act, true);
}

/* The graph chain's vision layers that are copies of an earlier one
 * (ml__ck_graph_repeat shares its saved list): proof the graph built
 * them. */
static unsigned tower_copies(const ml_chain *ch)
{
    unsigned n = 0;
    for (size_t i = 1; i < ch->n; i++)
        if (!strncmp(ch->blocks[i].name, "vision.layer.", 13) && ch->blocks[i].nsaved &&
            ch->blocks[i].saved_first == ch->blocks[i - 1].saved_first)
            n++;
    return n;
}

/* What the LLaVA grid built: its vision embeddings and projectors
 * emitted from the graph alone and compared; the chains refused because
 * the graph declines their projector (ml__ck_graph_llava_projector: a
 * wide tower's whole hidden state kept in fp32). */
typedef struct {
    unsigned emb, proj, refused;
} llava_ends;

/* The graph declines m's projector under precision p (a tower wider than
 * six decoders, its whole hidden state kept in fp32). */
static bool wide_projector(const ml_model *m, ml_precision p)
{
    const ml_prec pr = ml__prec_of(p);
    return !pr.autocast && m->vision.full && m->vision.hidden * pr.w > m->hidden * 24;
}

static void same_graph_fields(const ml_chain *a, const ml_cblock *x, const ml_chain *b,
                              const ml_cblock *y, const char *what);

/* The vision embedding (block 1) and the projector of `built`, a chain
 * the graph built, against the same blocks emitted from the graph alone
 * (the inventory, parameters, FLOPs and transients are the graph's;
 * chain_llava.c's roles, a frozen tower's and the evaluation pass's, were
 * compared whole against the chain builders while they lived). */
static void llava_ends_from_graph(const ml_model *m, const ml_config *cfg,
                                  const ml_chain *built, llava_ends *n)
{
    size_t proj = 0;
    while (proj < built->n && strcmp(built->blocks[proj].name, "projector"))
        proj++;
    assert_true(proj < built->n);
    assert_string_equal(built->blocks[1].name, "vision.embedding");
    if (cfg->training.vision_tower == ML_VT_FROZEN || built->eval_mode)
        return;
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.selective = built->selective;
    ch.prec = ml__prec_of(cfg->training.precision);
    ml_ck_dims d;
    ml_error e;
    assert_int_equal(ml__ck_dims_of(m, &cfg->training, &ch, &d, &e), ML_OK);
    const uint64_t g = m->vision.image / m->vision.patch;
    const ml_ck_dims vd = {.B = d.B,
                           .T = g * g + 1,
                           .BT = d.B * (g * g + 1),
                           .D = m->vision.hidden,
                           .F = m->vision.mlp.ffn,
                           .H = m->vision.attn.heads,
                           .Hkv = m->vision.attn.heads,
                           .dh = m->vision.hidden / m->vision.attn.heads,
                           .Dkv = m->vision.hidden,
                           .expert_imbalance = 1};
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    assert_true(ml__ck_graph_clip_embedding(&ch, m, &vd, G));
    ml_cblock *b = ml__ck_begin(&ch, "vision.embedding", -1);
    assert_non_null(b);
    ml__ck_graph_emit(&ch, b, G, vd.BT * vd.D * ch.prec.w);
    same_graph_fields(built, &built->blocks[1], &ch, &ch.blocks[0], "embedding from the graph");
    n->emb++;
    assert_false(wide_projector(m, cfg->training.precision));
    assert_true(ml__ck_graph_llava_projector(&ch, m, &vd, &d, ml_model_image_tokens(m), G));
    b = ml__ck_begin(&ch, "projector", -1);
    assert_non_null(b);
    b->in_bytes = vd.BT * vd.D * ch.prec.w;
    ml__ck_graph_emit(&ch, b, G, d.BT * d.D * ch.prec.w);
    same_graph_fields(built, &built->blocks[proj], &ch, &ch.blocks[1],
                      "projector from the graph");
    n->proj++;
    free(G);
    ml__chain_free(&ch);
}

/* Every vision-tower setting, precision, decoder kernel, checkpoint policy
 * and pass of m, at micro-batches 1 and 3, from the graph; the chains
 * built or refused with ML_RANGE (refused only
 * where the graph declines the projector), *copies the copied vision
 * layers, *ends the vision embeddings and projectors from the graph. */
static unsigned compare_llava(ml_model *m, const char *name, unsigned *copies, llava_ends *ends)
{
    static const char *const policies[] = {"none", "selective", "full"};
    unsigned n = 0;
    for (int vt = 0; vt < ML_VT_COUNT; vt++)
        for (size_t k = 0; k < 3; k++)
            for (int p = 0; p < ML_PREC_COUNT; p++)
                for (size_t c = 0; c < 3; c++)
                    for (int run = 0; run < 4; run++) {
                        const bool ev = run & 1;
                        m->attn.kernel = kernels[k];
                        ml_config cfg = ml_model_config(m);
                        cfg.training.precision = (ml_precision)p;
                        cfg.training.micro_batch = run & 2 ? 3 : 1;
                        cfg.training.vision_tower = (ml_vision_tower)vt;
                        cfg.calib = NULL;
                        ml_error e;
                        assert_int_equal(
                            ml_parse_checkpoint(policies[c], &cfg.training.checkpoint, &e), ML_OK);
                        ml_chain b;
                        ml_status sb = ev ? ml__chain_build_eval(m, &cfg, &b, &e)
                                          : ml__chain_build(m, &cfg, &b, &e);
                        n++;
                        if (sb == ML_RANGE && wide_projector(m, (ml_precision)p) &&
                            strstr(e.msg, "projector") && strstr(e.msg, "not modelled")) {
                            ends->refused++;
                            continue;
                        }
                        if (sb != ML_OK)
                            fail_msg("%s: refused: %s", name, e.msg);
                        llava_ends_from_graph(m, &cfg, &b, ends);
                        casts_add_up(&b, name);
                        *copies += tower_copies(&b);
                        ml__chain_free(&b);
                    }
    return n;
}

/* The tower records no backward nodes (chain_llava.c), so the chain
 * comparison cannot see the graph's: with them recorded, a CLIP layer's
 * balance (the chain keeps a node list only when its gradients add up)
 * and every saved tensor has a node that releases it, QuickGELU's three
 * (the scalar's product, sigmoid, the product) included. */
static void test_clip_layer_nodes(void **state)
{
    (void)state;
    for (int q = 0; q < 2; q++) {
        ml_model *m = llava_variant(3, -2, "default", q ? "quick_gelu" : "gelu");
        ml_chain ch;
        memset(&ch, 0, sizeof ch);
        ch.prec = ml__prec_of(ML_PREC_FP32);
        ch.record_nodes = true;
        const ml_ck_dims vd = {.B = 2, .T = 17, .BT = 34, .D = 32, .F = 64, .H = 4, .Hkv = 4,
                               .dh = 8, .Dkv = 32};
        ml_ck_graph *G = malloc(sizeof *G);
        assert_non_null(G);
        assert_true(ml__ck_graph_vision_layer(&ch, m, &vd, MLG_CLIP_LAYER, G));
        assert_true(G->g.nt * 4 <= MLG_MAX_TENSORS * 3 && G->g.nop * 4 <= MLG_MAX_OPS * 3);
        ml_cblock *b = ml__ck_begin(&ch, "vision.layer.0", 0);
        assert_non_null(b);
        b->in_bytes = vd.BT * vd.D * 4;
        ml__ck_graph_emit(&ch, b, G, b->in_bytes);
        free(G);
        assert_true(b->nnodes > 0);
        for (size_t i = 0; i < b->nsaved; i++)
            assert_int_not_equal(ch.saved[b->saved_first + i].node, ML_NODE_NONE);
        unsigned sig = 0;
        for (size_t i = 0; i < b->nnodes; i++)
            sig += !strcmp(ch.nodes[b->node_first + i].what, "SigmoidBackward0");
        assert_int_equal(sig, q);
        ml__chain_free(&ch);
        ml_model_destroy(m);
    }
}

/* The family takes m's tower layers, under every precision. */
static void clip_layers_taken(const ml_model *m)
{
    for (int p = 0; p < ML_PREC_COUNT; p++) {
        ml_chain ch;
        memset(&ch, 0, sizeof ch);
        ch.prec = ml__prec_of((ml_precision)p);
        const uint64_t g = m->vision.image / m->vision.patch;
        const ml_ck_dims vd = {.B = 1,
                               .T = g * g + 1,
                               .BT = g * g + 1,
                               .D = m->vision.hidden,
                               .F = m->vision.mlp.ffn,
                               .H = m->vision.attn.heads,
                               .Hkv = m->vision.attn.heads,
                               .dh = m->vision.hidden / m->vision.attn.heads,
                               .Dkv = m->vision.hidden};
        ml_ck_graph *G = malloc(sizeof *G);
        assert_non_null(G);
        for (unsigned pool = MLG_CLIP_LAYER; pool <= MLG_CLIP_POOLED_KEPT; pool++)
            assert_true(ml__ck_graph_vision_layer(&ch, m, &vd, pool, G));
        free(G);
    }
}

static void test_llava_from_graph(void **state)
{
    (void)state;
    static const int feature[] = {0, 1, -2, -1};
    unsigned n = 0, copies = 0, models = 0;
    llava_ends ends = {0, 0, 0};
    unsigned wide32 = 0;
    for (int p = 0; p < ML_PREC_COUNT; p++) {
        const ml_prec pr = ml__prec_of((ml_precision)p);
        wide32 += !pr.autocast && pr.w == 4;
    }
    for (unsigned lv = 1; lv <= 3; lv += 2)
        for (size_t f = 0; f < 4; f++)
            for (int full = 0; full < 2; full++)
                for (int q = 0; q < 4; q++) {
                    ml_model *m = llava_variant_of(lv, 32, feature[f], full ? "full" : "default",
                                                   q & 1 ? "quick_gelu" : "gelu", q & 2);
                    clip_layers_taken(m);
                    n += compare_llava(m, "llava variant", &copies, &ends);
                    models++;
                    ml_model_destroy(m);
                }
    /* a tower wider than six decoders (320 x 4 bytes > 48 x 24): with the
     * full feature, fp32's projector is declined, the chain refused */
    for (int full = 0; full < 2; full++) {
        ml_model *m = llava_variant_of(1, 320, -1, full ? "full" : "default", "quick_gelu", true);
        n += compare_llava(m, "wide llava variant", &copies, &ends);
        models++;
        ml_model_destroy(m);
    }
    ml_model *m = load_preset("llava-1.5-7b");
    n += compare_llava(m, "llava-1.5-7b", &copies, &ends);
    ml_model_destroy(m);
    m = load_hf_config("llava-1.5-7b");
    n += compare_llava(m, "llava-1.5-7b (config.json)", &copies, &ends);
    ml_model_destroy(m);
    fprintf(stderr,
            "%u LLaVA chains from the graph (%u models), %u vision layers copied, %u vision "
            "embeddings and %u projectors from the graph alone, %u chains refused (projector "
            "declined)\n",
            n, models + 2, copies, ends.emb, ends.proj, ends.refused);
    /* (64 variants + 2 wide + 2 shipped) x 4 tower settings x 3 kernels x
     * 6 precisions x 3 policies x 2 passes x 2 micro-batches */
    assert_int_equal(n, 68 * 4 * 3 * ML_PREC_COUNT * 3 * 2 * 2);
    /* copies: a 3-layer tower whose first layer is used (feature layer 1,
     * -2 or -1) copies its second, used or not (the last has a graph of
     * its own); each shipped tower (24 layers) copies its 22 middle ones */
    assert_int_equal(copies, (24 * 1 + 2 * 22) * 4 * 3 * ML_PREC_COUNT * 3 * 2 * 2);
    /* refused: the wide full-feature model under the precisions without
     * autocast whose stream is fp32, every tower setting, kernel, policy,
     * pass and micro-batch */
    assert_true(wide32 > 0);
    assert_int_equal(ends.refused, wide32 * 4 * 3 * 3 * 2 * 2);
    /* from the graph alone: every other training chain whose tower is not
     * frozen (3 settings) */
    assert_int_equal(ends.emb, 68 * 3 * 3 * ML_PREC_COUNT * 3 * 2 - wide32 * 3 * 3 * 3 * 2);
    assert_int_equal(ends.proj, ends.emb);
}

/* ---- sequential models: each `layers:` entry a graph block ---- */

/* Every layer kind, in and out of residuals, on and off the model's input:
 * windowed and global pooling, dropout (and p = 0: an identity block), a
 * flatten block, LayerNorm, SiLU, GELU, a projection shortcut, ReLU in
 * place on a block's input and inside a branch, an embedding, attention
 * (causal or not, with and without dropout and biases, on the model's
 * input and after a half-precision linear under autocast), a residual
 * nested in a residual, one on the model's input, a dropout opening a
 * residual's body; the fifth model dropouts inside residuals in every
 * position (the graph's in evaluation too); the last two attention inside
 * residuals: opening and ending a body, after a ReLU that saved its input
 * already, as a shortcut, two in one body, in a nested residual, before a
 * linear and a dropout (whose masks and cast copies take its (B, T, D)
 * shape). */
static const char *const seq_models[] = {
    "model:\n  type: sequential\n  input: [3, 8, 8]\n  layers:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n    - batchnorm: {}\n"
    "    - relu: {inplace: true}\n    - maxpool: {kernel: 2}\n    - dropout: {p: 0.1}\n"
    "    - avgpool: {kernel: 2}\n    - flatten: {}\n    - dropout: {p: 0}\n"
    "    - linear: {out: 16}\n    - layernorm: {}\n    - silu: {}\n"
    "    - residual:\n        - linear: {out: 16}\n        - gelu: {}\n"
    "        - dropout: {p: 0.2}\n        - linear: {out: 16}\n"
    "    - residual:\n        body:\n          - layernorm: {}\n          - linear: {out: 8}\n"
    "        shortcut:\n          - linear: {out: 8, bias: false}\n"
    "    - relu: {}\n    - linear: {out: 3}\n  loss: cross_entropy\n",
    "model:\n  type: sequential\n  input: [12]\n  layers:\n"
    "    - embedding: {vocab: 50, dim: 16}\n    - attention: {heads: 2, causal: true}\n"
    "    - layernorm: {}\n"
    "    - residual:\n        - linear: {out: 32}\n        - relu: {inplace: true}\n"
    "        - linear: {out: 16}\n"
    "    - gelu: {}\n    - flatten: {}\n    - linear: {out: 4}\n  loss: mse\n",
    "model:\n  type: sequential\n  input: [3, 8, 8]\n  layers:\n"
    "    - residual:\n        - conv2d: {out: 3, kernel: 3, padding: 1}\n"
    "        - residual:\n            - relu: {}\n            - conv2d: {out: 3, kernel: 1}\n"
    "    - relu: {inplace: true}\n    - flatten: {}\n    - relu: {}\n"
    "    - residual:\n        - relu: {inplace: true}\n        - linear: {out: 192}\n"
    "    - linear: {out: 2}\n  loss: cross_entropy\n",
    "model:\n  type: sequential\n  input: [16]\n  layers:\n"
    "    - flatten: {}\n    - relu: {inplace: true}\n    - dropout: {p: 0.5}\n"
    "    - linear: {out: 8}\n"
    "    - residual:\n        - dropout: {p: 0.1}\n        - linear: {out: 8}\n"
    "    - residual:\n        - relu: {inplace: true}\n        - linear: {out: 8}\n"
    "    - residual:\n        body:\n          - linear: {out: 8}\n          - flatten: {}\n"
    "        shortcut:\n          - linear: {out: 8}\n  loss: mse\n",
    "model:\n  type: sequential\n  input: [16]\n  layers:\n"
    "    - linear: {out: 16}\n"
    "    - residual:\n        - linear: {out: 16}\n        - dropout: {p: 0.1}\n"
    "    - residual:\n        body:\n          - dropout: {p: 0.1}\n"
    "        shortcut:\n          - linear: {out: 16}\n"
    "    - residual:\n        body:\n          - relu: {}\n          - dropout: {p: 0.2}\n"
    "          - linear: {out: 16}\n        shortcut:\n          - dropout: {p: 0.2}\n"
    "    - residual:\n        - residual:\n            - dropout: {p: 0.3}\n"
    "            - linear: {out: 16}\n        - relu: {inplace: true}\n"
    "        - dropout: {p: 0.1}\n"
    "    - residual:\n        - gelu: {}\n        - dropout: {p: 0.1}\n"
    "        - dropout: {p: 0.1}\n        - layernorm: {}\n"
    "    - dropout: {p: 0.1}\n    - linear: {out: 4}\n  loss: mse\n",
    "model:\n  type: sequential\n  input: [16]\n  layers:\n"
    "    - embedding: {vocab: 50, dim: 32}\n"
    "    - attention: {heads: 4, causal: true, dropout: 0.1}\n"
    "    - layernorm: {}\n    - linear: {out: 50}\n  loss: cross_entropy\n",
    "model:\n  type: sequential\n  input: [6, 12]\n  layers:\n"
    "    - attention: {heads: 3, bias: false}\n    - gelu: {}\n"
    "    - attention: {heads: 1, causal: true, bias: false, dropout: 0.2}\n"
    "    - linear: {out: 12}\n    - attention: {heads: 2, dropout: 0.1}\n"
    "    - residual:\n        - layernorm: {}\n        - attention: {heads: 2, causal: true}\n"
    "    - flatten: {}\n    - linear: {out: 3}\n  loss: cross_entropy\n",
    "model:\n  type: sequential\n  input: [8, 16]\n  layers:\n"
    "    - residual:\n        - attention: {heads: 2, causal: true}\n"
    "        - linear: {out: 16}\n"
    "    - residual:\n        - relu: {}\n        - attention: {heads: 4, dropout: 0.1}\n"
    "    - residual:\n        body:\n          - linear: {out: 16}\n"
    "        shortcut:\n          - attention: {heads: 2, bias: false}\n"
    "    - residual:\n        - residual:\n            - layernorm: {}\n"
    "            - attention: {heads: 2, causal: true, dropout: 0.2}\n"
    "        - gelu: {}\n        - attention: {heads: 2}\n"
    "    - residual:\n        - attention: {heads: 4}\n        - relu: {inplace: true}\n"
    "        - attention: {heads: 4, causal: true}\n        - dropout: {p: 0.1}\n"
    "    - linear: {out: 16}\n"
    "    - residual:\n        body:\n          - attention: {heads: 1}\n"
    "        shortcut:\n          - residual:\n              - attention: {heads: 1}\n"
    "    - flatten: {}\n    - linear: {out: 5}\n  loss: cross_entropy\n",
};

/* Every ReLU's inplace set to on (1), off (0), or left (-1). */
static void set_inplace(ml_layer *ls, size_t n, int on)
{
    for (size_t i = 0; i < n && on >= 0; i++) {
        if (ls[i].kind == ML_L_RELU)
            ls[i].inplace = on;
        set_inplace(ls[i].body, ls[i].nbody, on);
        set_inplace(ls[i].shortcut, ls[i].nshortcut, on);
    }
}

static bool has_attention(const ml_layer *ls, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (ls[i].kind == ML_L_ATTENTION || has_attention(ls[i].body, ls[i].nbody) ||
            has_attention(ls[i].shortcut, ls[i].nshortcut))
            return true;
    return false;
}

/* A residual around an attention layer. */
static bool nested_attention(const ml_layer *l)
{
    return l->kind == ML_L_RESIDUAL &&
           (has_attention(l->body, l->nbody) || has_attention(l->shortcut, l->nshortcut));
}

/* FNV-1a over a chain's figures (the fields chain_compare.h compares),
 * each as a 64-bit value least significant byte first (a double's bits):
 * the same on every platform. */
static uint64_t fold(uint64_t h, const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)p[i]) * 0x100000001b3ull;
    return h;
}

static uint64_t fold_u64(uint64_t h, uint64_t v)
{
    for (int i = 0; i < 8; i++, v >>= 8)
        h = (h ^ (v & 0xff)) * 0x100000001b3ull;
    return h;
}

static uint64_t fold_f64(uint64_t h, double d)
{
    uint64_t v;
    memcpy(&v, &d, sizeof v);
    return fold_u64(h, v);
}
#define FOLD(h, v) (h = fold_u64(h, (uint64_t)(v)))

/* flags & mask of each saved entry (a flag masked out: the digest without it). */
static uint64_t block_digest(uint64_t h, const ml_chain *c, const ml_cblock *x, unsigned mask)
{
    h = fold(h, x->name, strlen(x->name));
    FOLD(h, x->fwd_phase); FOLD(h, x->ckpt_index); FOLD(h, x->identity); FOLD(h, x->in_held);
    FOLD(h, x->in_nograd); FOLD(h, x->inplace); FOLD(h, x->nodes_off); FOLD(h, x->params);
    FOLD(h, x->nsaved); FOLD(h, x->nnodes); FOLD(h, x->saved_bytes); FOLD(h, x->core_bytes);
    FOLD(h, x->cast_bytes); FOLD(h, x->in_bytes); FOLD(h, x->in_saved); FOLD(h, x->out_saved);
    FOLD(h, x->ws_fwd); FOLD(h, x->ws_nograd); FOLD(h, x->ws_bwd); FOLD(h, x->unit_fwd);
    FOLD(h, x->unit); FOLD(h, x->bwd_in); FOLD(h, x->grad_bytes); FOLD(h, x->grad_accum_bytes);
    h = fold_f64(h, x->flops_fwd);
    h = fold_f64(h, x->flops_bwd);
    h = fold_f64(h, x->flops_core);
    for (size_t i = 0; i < x->nsaved; i++) {
        const ml_saved *u = &c->saved[x->saved_first + i];
        h = fold(h, u->what, strlen(u->what));
        FOLD(h, u->bytes); FOLD(h, u->flags & mask); FOLD(h, u->node); FOLD(h, u->next_same);
    }
    for (size_t i = 0; i < x->nnodes; i++) {
        const ml_bnode *u = &c->nodes[x->node_first + i];
        h = fold(h, u->what, strlen(u->what));
        FOLD(h, u->grad_in); FOLD(h, u->param_grad); FOLD(h, u->scratch); FOLD(h, u->grad_out);
        FOLD(h, u->first_saved);
    }
    return h;
}

static uint64_t chain_digest(uint64_t h, const ml_chain *c, unsigned mask)
{
    for (size_t i = 0; i < c->n; i++)
        h = block_digest(h, c, &c->blocks[i], mask);
    FOLD(h, c->batch_input); FOLD(h, c->batch_targets); FOLD(h, c->buffer_bytes);
    FOLD(h, c->n_ckpt); FOLD(h, c->nsides); FOLD(h, c->nparams); FOLD(h, c->max_param_numel);
    for (size_t i = 0; i < c->nparams; i++) {
        FOLD(h, c->params[i].numel); FOLD(h, c->params[i].rows); FOLD(h, c->params[i].cols);
        FOLD(h, c->params[i].nograd); FOLD(h, c->params[i].frozen);
    }
    return h;
}

/* A sequential model's chains over micro-batches, precisions, checkpoint
 * policies, training and evaluation, folded into h[0] (h[1]: without the
 * ML_SV_WCAST flag): a block per entry
 * and the loss, named by the entry; an entry holding an attention layer
 * without nodes or backward FLOPs of its own. */
static unsigned check_seq(ml_model *m, const char *name, uint64_t h[2])
{
    static const uint64_t batches[] = {1, 3, 32};
    static const char *const policies[] = {"none", "selective", "full"};
    unsigned n = 0;
    for (size_t k = 0; k < sizeof batches / sizeof batches[0]; k++)
        for (int p = 0; p < ML_PREC_COUNT; p++)
            for (size_t c = 0; c < 3; c++)
                for (int ev = 0; ev < 2; ev++) {
                    ml_config cfg = ml_model_config(m);
                    cfg.training.precision = (ml_precision)p;
                    cfg.training.micro_batch = batches[k];
                    cfg.calib = NULL;
                    ml_error e;
                    assert_int_equal(ml_parse_checkpoint(policies[c], &cfg.training.checkpoint, &e),
                                     ML_OK);
                    ml_chain b;
                    if ((ev ? ml__chain_build_eval(m, &cfg, &b, &e)
                            : ml__chain_build(m, &cfg, &b, &e)) != ML_OK)
                        fail_msg("%s: %s", name, e.msg);
                    assert_int_equal(b.n, m->nseq + 1);
                    for (size_t i = 0; i < m->nseq; i++) {
                        char want[48];
                        snprintf(want, sizeof want, "%zu:%s", i,
                                 ml__layer_kind_name(m->seq[i].kind));
                        assert_string_equal(b.blocks[i].name, want);
                        if (has_attention(&m->seq[i], 1))
                            assert_true(b.blocks[i].nodes_off && !b.blocks[i].nnodes);
                    }
                    assert_string_equal(b.blocks[m->nseq].name, "loss");
                    h[0] = chain_digest(h[0], &b, ~0u);
                    h[1] = chain_digest(h[1], &b, ~(unsigned)ML_SV_WCAST);
                    ml__chain_free(&b);
                    n++;
                }
    return n;
}

/* The most tensors, ops and literal sizes a sequential block's graph
 * took; the loss blocks the graph took. */
typedef struct {
    unsigned nt, nop, nlit, losses, attention;
} seq_room;

/* The layers the graph expresses (every top-level entry, at fp32 on the
 * model's shapes, in training or evaluation), counted; the attention
 * layers and the residuals around them in room->attention. */
static unsigned seq_expressed(const ml_model *m, bool eval, seq_room *room)
{
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.prec = ml__prec_of(ML_PREC_FP32);
    ch.eval_mode = eval;
    ch.B = 2;
    ml_shape sh;
    memset(&sh, 0, sizeof sh);
    sh.rank = (unsigned)m->ninput;
    for (size_t i = 0; i < m->ninput; i++)
        sh.d[i] = m->input[i];
    sh.ids = m->seq[0].kind == ML_L_EMBEDDING;
    unsigned bytes = sh.ids ? 8 : 4, n = 0;
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    for (size_t i = 0; i < m->nseq; i++) {
        mlg_seq_block info;
        const bool ok = ml__ck_graph_seq(&ch, &m->seq[i], &sh, bytes, i == 0, G, &info);
        if (!ok)
            fail_msg("%s: layer %zu (%s) refused", m->name, i, ml__layer_kind_name(m->seq[i].kind));
        if (ok && (m->seq[i].kind == ML_L_ATTENTION || nested_attention(&m->seq[i]))) {
            assert_true(info.attention && info.nodes_off);
            room->attention++;
        }
        if (!ok) { /* the next layer's input from shape inference */
            ml_shape o;
            char msg[8];
            const ml_layer *where;
            assert_true(ml__shape_step(&m->seq[i], &sh, &o, msg, sizeof msg, &where));
            sh = o;
            bytes = 4;
            continue;
        }
        n++;
        sh = info.shape;
        bytes = info.out_bytes;
        room->nt = G->g.nt > room->nt ? G->g.nt : room->nt;
        room->nop = G->g.nop > room->nop ? G->g.nop : room->nop;
        room->nlit = G->g.nlit > room->nlit ? G->g.nlit : room->nlit;
    }
    /* the loss block on the model's output (chain_sequential.c's seq_loss) */
    const uint64_t elems = ml__shape_elems(&sh) * ch.B;
    const bool ce = m->loss == ML_LOSS_CROSS_ENTROPY;
    const uint64_t rows = ce && sh.rank == 2 ? ch.B * sh.d[0] : ch.B;
    if (ce ? ml__ck_graph_loss(&ch, rows, elems / rows, G)
           : ml__ck_graph_mse_loss(&ch, elems, bytes, G))
        room->losses++;
    free(G);
    return n;
}

static void test_seq_chains(void **state)
{
    (void)state;
    unsigned n = 0, expressed = 0, expressed_eval = 0;
    uint64_t h[2] = {0xcbf29ce484222325ull, 0xcbf29ce484222325ull};
    seq_room room = {0, 0, 0, 0, 0};
    static const char *const presets[] = {"mlp2", "cifar10-resnet", "resnet50-imagenet"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++)
        for (int in = -1; in < 2; in++) {
            ml_model *m = load_preset(presets[i]);
            set_inplace(m->seq, m->nseq, in);
            n += check_seq(m, presets[i], h);
            expressed += seq_expressed(m, false, &room);
            expressed_eval += seq_expressed(m, true, &room);
            ml_model_destroy(m);
        }
    for (size_t i = 0; i < sizeof seq_models / sizeof seq_models[0]; i++)
        for (int in = -1; in < 2; in++) {
            ml_model *m = load_str(seq_models[i]);
            set_inplace(m->seq, m->nseq, in);
            n += check_seq(m, "sequential test model", h);
            expressed += seq_expressed(m, false, &room);
            expressed_eval += seq_expressed(m, true, &room);
            ml_model_destroy(m);
        }
    fprintf(stderr,
            "%u sequential chains checked, %u layers from the graph (%u attention; at most "
            "%u tensors, %u ops, %u literal sizes), %u in evaluation, %u losses, digest "
            "%016llx\n",
            n, expressed, room.attention, room.nt, room.nop, room.nlit, expressed_eval,
            room.losses, (unsigned long long)h[0]);
    assert_true(n > 0);
    assert_int_equal(n, 11 * 3 * 3 * ML_PREC_COUNT * 3 * 2);
    assert_true(expressed > 0);
    /* evaluation's dropouts inside residuals too */
    assert_int_equal(expressed_eval, expressed);
    assert_int_equal(expressed, 384);
    /* the five top-level attention layers and the seven residuals around
     * attention layers (three ReLU settings, training and evaluation) */
    assert_int_equal(room.attention, (5 + 7) * 3 * 2);
    assert_int_equal(room.losses, 2 * 11 * 3); /* every model's loss block */
    /* the chains as they were when the chain builders planned the same
     * grid and every field matched theirs (compared field by field, the
     * names too, before the sequential builders were deleted): the digest
     * then, which the flag added since (autocast's weight copies,
     * ML_SV_WCAST) leaves as it was once masked out; and with it. Both
     * moved once since, on purpose: the eager core's v copy became a saved
     * entry of its own, released by BmmBackward0 (P v) as PyTorch releases
     * it, where it was counted in q's and k's entry (the live-bytes
     * oracle's frees check, docs/validation.md, "Frees"); and at
     * micro-batch 1 the attention layers' matmuls copy nothing, bmm saving
     * the c_attn output's views (docs/inventory.md, "A batch of one"; with
     * that off the digests are the earlier 0x41d8147d7b8820e7 and
     * 0x64d5cb18ba2335a7) */
    assert_int_equal(h[1], 0xcb75add3d7820c0dull);
    assert_int_equal(h[0], 0x564ab1c0ce49d0adull);
    /* ResNet-50's bottleneck with its projection, the largest: a quarter
     * of each array to spare */
    assert_true(room.nt * 4 <= MLG_MAX_TENSORS * 3);
    assert_true(room.nop * 4 <= MLG_MAX_OPS * 3);
    assert_true(room.nlit * 4 <= MLG_NLIT * 3);
}

/* What the sequential kit refuses, explicitly: two attention layers of
 * different sizes in one entry (the block's named dimensions are one
 * attention's); a dropout inside a residual is the graph's in training and
 * in evaluation, so is an attention layer on its block's input or inside a
 * residual. */
static void test_seq_refused(void **state)
{
    (void)state;
    ml_model *m = load_str(seq_models[3]);
    ml_chain ch;
    memset(&ch, 0, sizeof ch);
    ch.prec = ml__prec_of(ML_PREC_FP32);
    ch.B = 2;
    const ml_shape in = {{8, 0, 0}, 1, false};
    ml_ck_graph *G = malloc(sizeof *G);
    assert_non_null(G);
    mlg_seq_block info;
    assert_int_equal(m->seq[4].kind, ML_L_RESIDUAL);
    assert_int_equal(m->seq[4].body[0].kind, ML_L_DROPOUT);
    assert_true(ml__ck_graph_seq(&ch, &m->seq[4], &in, 4, false, G, &info));
    ch.eval_mode = true;
    assert_true(ml__ck_graph_seq(&ch, &m->seq[4], &in, 4, false, G, &info));
    /* the top-level dropout in evaluation is the graph's (its forward
     * aliases the output; the programs keep the block rule) */
    const ml_shape in16 = {{16, 0, 0}, 1, false};
    assert_true(ml__ck_graph_seq(&ch, &m->seq[2], &in16, 4, false, G, &info));
    ml_model_destroy(m);
    m = load_str(seq_models[1]);
    const ml_shape emb = {{12, 16, 0}, 2, false};
    assert_int_equal(m->seq[1].kind, ML_L_ATTENTION);
    ch.eval_mode = false;
    /* an attention layer is the graph's, without nodes or programs */
    assert_true(ml__ck_graph_seq(&ch, &m->seq[1], &emb, 4, false, G, &info));
    assert_true(info.attention && info.nodes_off);
    assert_false(G->programs);
    ml_model_destroy(m);
    m = load_str(seq_models[6]);
    const ml_shape tok = {{6, 12, 0}, 2, false};
    assert_int_equal(m->seq[5].kind, ML_L_RESIDUAL);
    assert_int_equal(m->seq[5].body[1].kind, ML_L_ATTENTION);
    assert_true(ml__ck_graph_seq(&ch, &m->seq[5], &tok, 4, false, G, &info));
    assert_true(info.attention && info.nodes_off);
    assert_false(G->programs);
    /* two in one body of the same sizes: taken; of two head counts: refused */
    ml_model_destroy(m);
    m = load_str("model:\n  type: sequential\n  input: [6, 12]\n  layers:\n"
                 "    - residual:\n        - attention: {heads: 2}\n"
                 "        - attention: {heads: 2, causal: true}\n"
                 "    - residual:\n        - attention: {heads: 2}\n"
                 "        - attention: {heads: 3}\n"
                 "    - flatten: {}\n    - linear: {out: 3}\n  loss: cross_entropy\n");
    assert_true(ml__ck_graph_seq(&ch, &m->seq[0], &tok, 4, false, G, &info));
    assert_false(ml__ck_graph_seq(&ch, &m->seq[1], &tok, 4, false, G, &info));
    assert_false(info.overflow);
    /* no other rule plans it: the chain is refused at the entry */
    ml_config cfg = ml_model_config(m);
    cfg.calib = NULL;
    ml_chain c;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &cfg, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "model.layers[1] (residual) is not modelled"));
    free(G);
    ml_model_destroy(m);
}

/* An attention layer opening a residual's body, a linear after it, at
 * fp32, B = 1, T = 8, D = 16, 2 heads, causal, worked by hand: c_attn
 * saves the block's input (listed as the input, not in the block's
 * bytes); bmm saves q, k and v's contiguous copies (3 x 512 B), the
 * masked_fill its bool mask (T x T = 64 B), softmax its output (H T T x 4
 * = 512 B), c_proj its input (512 B), the linear the attention's output
 * (512 B): 3136 B. Parameters c_attn 16 x 48 + 48, c_proj 16 x 16 + 16,
 * the linear 16 x 16 + 16. Forward FLOPs 2 T D 3D + 4 H T T dh + 2 T D D
 * twice; backward the linear's alone (2 x 2 T D D), as the builders
 * counted none for an attention layer. */
static void test_seq_attention_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str("model:\n  type: sequential\n  input: [8, 16]\n  layers:\n"
                           "    - residual:\n        - attention: {heads: 2, causal: true}\n"
                           "        - linear: {out: 16}\n"
                           "    - flatten: {}\n    - linear: {out: 5}\n  loss: cross_entropy\n");
    ml_config cfg = ml_model_config(m);
    cfg.training.precision = ML_PREC_FP32;
    cfg.training.micro_batch = 1;
    cfg.calib = NULL;
    ml_chain c;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &cfg, &c, &e), ML_OK);
    const ml_cblock *b = &c.blocks[0];
    assert_int_equal(b->saved_bytes, 3 * 512 + 64 + 512 + 512 + 512);
    assert_int_equal(b->params, (16 * 48 + 48) + 2 * (16 * 16 + 16));
    assert_true(b->flops_fwd == 2.0 * 8 * 16 * 48 + 4.0 * 2 * 8 * 8 * 8 + 2 * (2.0 * 8 * 16 * 16));
    assert_true(b->flops_core == 4.0 * 2 * 8 * 8 * 8);
    assert_true(b->flops_bwd == 2 * (2.0 * 8 * 16 * 16));
    assert_true(b->nodes_off && !b->nnodes);
    ml__chain_free(&c);
    ml_model_destroy(m);
}

/* OLMo's norm exists only in the graph: a layout the graph does not
 * express with it is refused at the key, never planned by another
 * family's builders. */
static void test_olmo_norm_refused_elsewhere(void **state)
{
    (void)state;
    static const char *const yaml =
        "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
        "  activation: swiglu\n  norm: olmo_layernorm\n  vocab: 100\n  position: rope\n"
        "  bias: false\n  classes: 3\n";
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(yaml, strlen(yaml), "t.yaml", &m, &e), ML_SCHEMA);
    assert_null(m);
    assert_int_equal(e.line, 8); /* the norm key */
    assert_non_null(strstr(e.msg, "olmo_layernorm"));
    /* nor as a multimodal model's decoder */
    static const char *const llava =
        "model:\n  type: multimodal\n  stacks:\n    vision:\n      layers: 2\n"
        "      hidden: 32\n      heads: 2\n      ffn: 64\n      image_size: 28\n"
        "      patch_size: 14\n    projector: {}\n    decoder:\n      layers: 2\n"
        "      hidden: 64\n      heads: 4\n      ffn: 128\n      activation: swiglu\n"
        "      norm: olmo_layernorm\n      vocab: 100\n      position: rope\n"
        "      bias: false\n";
    m = NULL;
    assert_int_equal(ml_model_load_string(llava, strlen(llava), "t.yaml", &m, &e), ML_SCHEMA);
    assert_null(m);
    assert_non_null(strstr(e.msg, "olmo_layernorm"));
    /* without the classifier it is OLMo's layer, in the graph */
    static const char *const ok =
        "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
        "  activation: swiglu\n  norm: olmo_layernorm\n  vocab: 100\n  position: rope\n"
        "  bias: false\n";
    m = load_str(ok);
    mlg_layer L;
    assert_true(ml__family_olmo_layer(m, &fp32, &L));
    assert_int_equal(L.norm.kind, MLG_OLMO_LAYERNORM);
    ml_model_destroy(m);
}

/* Every combination of the kit's settings builds a whole graph, with room
 * to spare in the fixed arrays: a component that would overfill them
 * fails here, not as a layout the chain refuses (once, one the planner
 * quietly handed back to the builders). */
static void test_kit_headroom(void **state)
{
    (void)state;
    ml_graph *g = malloc(sizeof *g);
    assert_non_null(g);
    unsigned built = 0, most_t = 0, most_op = 0;
    for (unsigned mask = 0; mask < (1u << 18); mask++) {
        mlg_layer L;
        memset(&L, 0, sizeof L);
        L.norm.kind = (uint8_t)((mask >> 12) & 3);
        L.norm.upcast = mask & 1;
        L.attn.hf = (mask >> 1) & 1;
        if (!L.attn.hf && L.norm.kind != MLG_LAYERNORM)
            continue;
        L.attn.fused_kernel = (mask >> 2) & 1;
        L.attn.dropout = L.attn.out_grad = (mask >> 3) & 1;
        L.attn.rope = L.attn.hf && ((mask >> 4) & 1);
        L.attn.grouped = L.attn.hf && ((mask >> 5) & 1);
        L.attn.repeat_copy = L.attn.grouped && ((mask >> 6) & 1);
        L.attn.probs_cast = L.attn.softmax_copy = (mask >> 7) & 1;
        L.attn.softcap = L.attn.hf && ((mask >> 8) & 1);
        L.attn.fused_proj = L.attn.o_first = L.attn.hf && ((mask >> 9) & 1);
        L.attn.mask = L.attn.hf;
        L.attn.cache = L.attn.hf && !L.attn.fused_proj && ((mask >> 14) & 1);
        L.autocast = (mask >> 10) & 1;
        L.post_norms = L.attn.hf && ((mask >> 11) & 1);
        L.post = L.norm;
        L.post.held = true;
        L.mlp.act = L.attn.hf ? MLG_SWIGLU : MLG_GELU;
        L.mlp.fused = L.attn.fused_proj;
        L.mlp.dropout = L.mlp.out_grad = L.attn.dropout;
        L.hf_order = L.attn.hf;
        L.parallel = L.attn.hf && !L.post_norms && ((mask >> 15) & 1);
        if (((mask >> 15) & 1) && !L.parallel)
            continue;
        /* Falcon's: one shared norm, _split_heads (not Phi-3's projections) */
        const bool falcon = (mask >> 16) & 1;
        if (falcon && (!L.parallel || L.attn.fused_proj))
            continue;
        L.shared_norm = L.attn.split_heads = L.attn.stream_softmax = L.attn.in_buf = falcon;
        /* DeepSeek's latent attention (eager), q compressed or not (the
         * kernel's bit) */
        const bool latent = (mask >> 17) & 1;
        if (latent && (!L.attn.hf || L.parallel || L.attn.fused_proj || L.post_norms))
            continue;
        L.attn.latent = latent;
        L.attn.q_lora = latent && L.attn.fused_kernel;
        L.attn.fused_kernel = L.attn.fused_kernel && !latent;
        L.latent = L.norm;
        ml__family_layer_graph(g, &L);
        if (!ml__graph_valid(g))
            fail_msg("settings %#x: the graph is not whole", mask);
        most_t = g->nt > most_t ? g->nt : most_t;
        most_op = g->nop > most_op ? g->nop : most_op;
        for (int tied = 0; tied < 2; tied++) {
            ml__family_head_graph(g, &L, tied, false, (mask >> 8) & 1);
            assert_true(ml__graph_valid(g));
        }
        built++;
    }
    free(g);
    fprintf(stderr, "largest graph: %u tensors, %u ops (of %u settings)\n", most_t, most_op,
            built);
    assert_true(built > 20000);
    /* a quarter of each array to spare */
    assert_true(most_t * 4 <= MLG_MAX_TENSORS * 3);
    assert_true(most_op * 4 <= MLG_MAX_OPS * 3);
}

/* Each graph family's head is the graph's (the chain comparison cannot
 * tell who wrote a head both ways write alike). */
static void test_graph_heads_taken(void **state)
{
    (void)state;
    static const char *const presets[] = {"gpt2-small", "llama-2-7b", "olmo-1b", "falcon-7b"};
    for (size_t i = 0; i < sizeof presets / sizeof presets[0]; i++) {
        /* the last: Falcon's shipped config.json */
        ml_model *m = i + 1 < sizeof presets / sizeof presets[0] ? load_preset(presets[i])
                                                                 : load_hf_config(presets[i]);
        ml_chain ch;
        memset(&ch, 0, sizeof ch);
        ch.prec = ml__prec_of(ML_PREC_FP32);
        ml_config c = ml_model_config(m);
        ml_ck_dims d;
        ml_error e;
        assert_int_equal(ml__ck_dims_of(m, &c.training, &ch, &d, &e), ML_OK);
        ml_ck_graph *G = malloc(sizeof *G);
        assert_non_null(G);
        assert_true(ml__ck_graph_head(&ch, m, &d, false, G));
        assert_true(ml__ck_graph_head(&ch, m, &d, true, G));
        free(G);
        ml_model_destroy(m);
    }
}

/* ---- the embeddings, heads and losses (graph/kit_embed.c, kit_head.c) ---- */

/* Layouts of the first and last blocks the layer variants above do not
 * reach: a decoder's sequence classifier (with and without a pad token),
 * Mixtral's experts (its layers the graph's alone), a text encoder with rotary
 * positions (its layers and its classifier the graph's), a
 * masked-LM head untied and
 * without positions or token types */
static const char *const ends_variants[] = {
    "model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: swiglu\n  norm: rmsnorm\n  vocab: 97\n  position: rope\n  classes: 3\n"
    "  bias: false\n  dropout: 0.1\n",
    "model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: gelu\n  norm: layernorm\n  vocab: 97\n  position: learned\n"
    "  max_positions: 512\n  classes: 5\n  tied_embeddings: true\n  dropout: 0\n",
    "model:\n  type: decoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  kv_heads: 2\n"
    "  ffn: 96\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 97\n  position: rope\n"
    "  experts: 4\n  experts_per_tok: 2\n  bias: false\n  dropout: 0\n",
    "model:\n  type: encoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: gelu\n  norm: layernorm\n  norm_position: post\n  vocab: 97\n"
    "  position: rope\n  classes: 2\n  token_types: 3\n  dropout: 0.1\n",
    "model:\n  type: encoder\n  layers: 1\n  hidden: 64\n  heads: 4\n  ffn: 128\n"
    "  activation: relu\n  norm: layernorm\n  norm_position: post\n  vocab: 97\n"
    "  position: none\n  mlm_head: true\n  tied_embeddings: false\n  dropout: 0\n",
};

/* What of block x, a block of a chain the graph built, the graph's block
 * y emitted alone must equal: the inventory, the parameters, the FLOPs,
 * the transients. */
static void same_graph_fields(const ml_chain *a, const ml_cblock *x, const ml_chain *b,
                              const ml_cblock *y, const char *what)
{
    const char *who = x->name;
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
        assert_int_equal(a->saved[x->saved_first + i].bytes, b->saved[y->saved_first + i].bytes);
}

/* Block 0 (the embedding) and the loss of a chain the graph built, against
 * the same blocks emitted from the graph alone: the inventory, the
 * parameters, the FLOPs and the transients are the graph's (what the chain
 * adds around them, chain_embed.c and chain_head.c, is not compared here;
 * test_chains_from_graph builds whole chains). */
static void ends_from_graph(const ml_model *m, const ml_config *cfg, bool eval,
                            const ml_chain *built, unsigned *emb, unsigned *cls, unsigned *enc_cls,
                            unsigned *mlm, unsigned *loss, unsigned *fused)
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
    assert_true(ml__ck_graph_embedding(&ch, m, &d, G));
    ml_cblock *b = ml__ck_begin(&ch, "embedding", -1);
    assert_non_null(b);
    ml__ck_graph_emit(&ch, b, G, d.BT * d.D * ch.prec.w);
    same_graph_fields(built, &built->blocks[0], &ch, &ch.blocks[0], "embedding from the graph");
    ++*emb;
    /* a classifier (a decoder's over its last token, an encoder's over
     * its first): the head before the loss */
    const bool dec = m->type == ML_MODEL_DECODER;
    const bool taken = m->head.mlm
                           ? ml__ck_graph_mlm_head(&ch, m, &d, G)
                           : m->head.classes && (dec ? ml__ck_graph_cls_head(&ch, m, &d, G)
                                                     : ml__ck_graph_encoder_head(&ch, m, &d, G));
    /* every head here is the graph's (a text encoder with rotary
     * positions too) */
    assert_true(taken || !(m->head.classes || m->head.mlm));
    if (taken) {
        b = ml__ck_begin(&ch, "head", -1);
        assert_non_null(b);
        const uint64_t rows = m->head.mlm ? d.BT : d.B;
        ml__ck_graph_emit(&ch, b, G, rows * (m->head.mlm ? d.V : m->head.classes) * ch.prec.a);
        same_graph_fields(built, &built->blocks[built->n - 2], &ch, &ch.blocks[ch.n - 1],
                          "head from the graph");
        ++*(m->head.mlm ? mlm : dec ? cls : enc_cls);
    }
    /* the loss: the last block, over the logits its input holds */
    const ml_cblock *l = &built->blocks[built->n - 1];
    const uint64_t rows = m->head.classes && m->type == ML_MODEL_DECODER ? d.B
                          : m->type == ML_MODEL_ENCODER && !m->head.mlm  ? d.B
                                                                         : d.BT;
    if (cfg->training.logits != ML_LOGITS_FUSED) {
        assert_true(ml__ck_graph_loss(&ch, rows, l->in_bytes / rows / ch.prec.a, G));
        b = ml__ck_begin(&ch, "loss", -1);
        assert_non_null(b);
        ml__ck_graph_emit(&ch, b, G, 0);
        const ml_cblock *x = l, *y = &ch.blocks[ch.n - 1];
        const char *who = x->name;
        const char *what = "loss from the graph";
        SAME(nsaved);
        SAME(saved_bytes);
        assert_int_equal(ch.batch_targets, built->batch_targets);
        ++*loss;
    } else {
        /* the fused linear cross-entropy: the targets, the weight, the
         * FLOPs (the chunks' transients are the chain's) */
        assert_true(ml__ck_graph_fused_loss(&ch, m, &d, G));
        b = ml__ck_begin(&ch, "loss", -1);
        assert_non_null(b);
        ml__ck_graph_emit(&ch, b, G, 0);
        const ml_cblock *x = l, *y = &ch.blocks[ch.n - 1];
        const char *what = "fused loss from the graph", *who = x->name;
        SAME(nsaved);
        SAME(params);
        SAME(flops_fwd);
        assert_int_equal(ch.batch_targets, built->batch_targets);
        ++*fused;
    }
    free(G);
    ml__chain_free(&ch);
}

/* The chains' first and last blocks from the graph over shapes the presets
 * do not take (one token; a batch of three), every precision, training and
 * evaluation, the logits kept, released and fused: each chain whole, its
 * ends the graph's (the same as emitted from the graph alone). */
static void test_ends_from_graph(void **state)
{
    (void)state;
    static const uint64_t shapes[][2] = {{1, 1}, {3, 7}, {2, 130}};
    const size_t nv = sizeof variants / sizeof variants[0];
    const size_t ne = sizeof ends_variants / sizeof ends_variants[0];
    unsigned chains = 0, emb = 0, cls = 0, enc_cls = 0, mlm = 0, loss = 0, fused = 0;
    /* the decoders' sequence classifiers a second time without a pad token */
    for (size_t v = 0; v < nv + ne + 2; v++) {
        ml_model *m = v < nv ? load_variant(v) : load_str(ends_variants[(v - nv) % ne]);
        m->head.cls_no_pad = v >= nv + ne;
        for (int p = 0; p < ML_PREC_COUNT; p++)
            for (size_t s = 0; s < 3; s++)
                for (int ev = 0; ev < 2; ev++)
                    for (int lg = 0; lg < ML_LOGITS_COUNT; lg++) {
                        ml_config cfg = ml_model_config(m);
                        cfg.training.precision = (ml_precision)p;
                        cfg.training.micro_batch = shapes[s][0];
                        cfg.training.seq_len = shapes[s][1];
                        cfg.training.logits = (ml_logits)lg;
                        cfg.calib = NULL;
                        ml_chain b;
                        ml_error e;
                        ml_status sb = ev ? ml__chain_build_eval(m, &cfg, &b, &e)
                                          : ml__chain_build(m, &cfg, &b, &e);
                        if (sb != ML_OK) {
                            /* transformers refuses a batch above 1 without
                             * a pad token */
                            if (lg != ML_LOGITS_FUSED && !(m->head.cls_no_pad && shapes[s][0] > 1))
                                fail_msg("refused: %s", e.msg);
                            continue;
                        }
                        chain_whole(&b, m, "ends");
                        ends_from_graph(m, &cfg, ev, &b, &emb, &cls, &enc_cls, &mlm, &loss,
                                        &fused);
                        ml__chain_free(&b);
                        chains++;
                    }
        ml_model_destroy(m);
    }
    fprintf(stderr,
            "%u chains from the graph, %u embeddings, %u sequence classifiers, %u encoder "
            "classifiers, %u masked-LM heads, %u losses and %u fused losses from the graph\n",
            chains, emb, cls, enc_cls, mlm, loss, fused);
    /* every model x precision x shape x pass with the logits kept,
     * released or held through the backward, and the fused ones not
     * refused */
    const unsigned kept = (unsigned)(nv + ne) * ML_PREC_COUNT * 3 * 2 * 3 + 2 * ML_PREC_COUNT * 2 * 3;
    assert_int_equal(emb, chains);
    assert_int_equal(loss, kept);
    assert_int_equal(fused, chains - kept);
    /* the decoders' fused losses in fp32 at least (every other precision
     * but autocast's too) */
    assert_true(fused >= 18 * 3 * 2);
    /* two classifiers with a pad token, and without one at a batch of 1
     * (their fused loss refused) */
    assert_int_equal(cls, 2 * ML_PREC_COUNT * 3 * 2 * 3 + 2 * ML_PREC_COUNT * 2 * 3);
    /* BERT's, ViT's two and the rotary text encoder's, every logits
     * setting but fused */
    assert_int_equal(enc_cls, 4 * ML_PREC_COUNT * 3 * 2 * 3);
    /* BERT's masked-LM layouts: tied with learned positions, and untied
     * without positions */
    assert_int_equal(mlm, 2 * ML_PREC_COUNT * 3 * 2 * 3);
}

/* With a fused kernel no (T, T) tensor exists: the graph plans sizes at
 * which the builders' scores product (B * H * T^2, which they computed
 * even for a fused kernel) passed 64 bits: B = 2^20, T = 2^23 with flash,
 * 2^20 * 12 * 2^46 > 2^64, while the logits, B * T * V * 2 = 2^43 *
 * 50,257 * 2 < 2^61, and every other product fit; with eager attention
 * the graph's scores overflow, and the chain says so. */
static void test_fused_no_tt_overflow(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    m->attn.kernel = ML_ATTN_FLASH;
    m->embed.position = ML_POS_NONE;
    ml_config cfg = ml_model_config(m);
    cfg.training.precision = ML_PREC_BF16;
    cfg.training.micro_batch = 1ull << 20;
    cfg.training.seq_len = 1ull << 23;
    ml_chain b;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &cfg, &b, &e), ML_OK);
    ml__chain_free(&b);
    m->attn.kernel = ML_ATTN_EAGER;
    assert_int_equal(ml__chain_build(m, &cfg, &b, &e), ML_OVERFLOW);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_forward_by_hand),
        cmocka_unit_test(test_forward_steps_by_hand),
        cmocka_unit_test(test_traffic_by_hand),
        cmocka_unit_test(test_layers_from_graph),
        cmocka_unit_test(test_chains_from_graph),
        cmocka_unit_test(test_moe_layers_from_graph),
        cmocka_unit_test(test_moe_chains_from_graph),
        cmocka_unit_test(test_mixtral_layers_from_graph),
        cmocka_unit_test(test_mixtral_chains_from_graph),
        cmocka_unit_test(test_repeat_refused),
        cmocka_unit_test(test_llava_from_graph),
        cmocka_unit_test(test_clip_layer_nodes),
        cmocka_unit_test(test_seq_chains),
        cmocka_unit_test(test_seq_refused),
        cmocka_unit_test(test_seq_attention_by_hand),
        cmocka_unit_test(test_other_layouts_refused),
        cmocka_unit_test(test_olmo_norm_refused_elsewhere),
        cmocka_unit_test(test_kit_headroom),
        cmocka_unit_test(test_graph_heads_taken),
        cmocka_unit_test(test_ends_from_graph),
        cmocka_unit_test(test_fused_no_tt_overflow),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
