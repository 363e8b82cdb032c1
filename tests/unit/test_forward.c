/* The forward, op by op (docs/ledger.md, "The forward, op by op"), by hand:
 * how far above the level it starts at a block's forward climbs, with grad
 * (its saved tensors stay) and under no_grad (checkpoint: full, where
 * nothing stays), read off the plan's events. */
#include "harness.h"

#include "model/model_internal.h"

/* The highest total of block `blk`'s forward events above the total just
 * before its first one. */
static uint64_t climb(const ml_model *m, const ml_config *c, int32_t blk)
{
    ml_ledger *l = eval(m, c, true);
    const ml_event *ev = ml_ledger_events(l);
    uint64_t before = 0, top = 0;
    bool seen = false;
    for (size_t i = 0; i < ml_ledger_event_count(l); i++) {
        uint64_t total = 0;
        for (int k = 0; k < ML_CAT_COUNT; k++)
            total += ev[i].live[k];
        if (ev[i].phase == ML_PHASE_FORWARD && ev[i].block == blk) {
            if (!seen)
                before = total - (uint64_t)ev[i].delta;
            seen = true;
            if (total > top)
                top = total;
        } else if (seen) {
            break;
        }
    }
    ml_ledger_destroy(l);
    assert_true(seen);
    return top - before;
}

/* The climbs of block 1 with grad and with checkpoint: full (no_grad). */
static void check_climbs(const char *yaml, uint64_t with_grad, uint64_t no_grad)
{
    ml_model *m = load_str(yaml);
    ml_config c = ml_model_config(m);
    assert_int_equal(climb(m, &c, 1), with_grad);
    ml_error e;
    assert_int_equal(ml_parse_checkpoint("full", &c.training.checkpoint, &e), ML_OK);
    assert_int_equal(climb(m, &c, 1), no_grad);
    ml_model_destroy(m);
}

/* One nanoGPT layer, fp32, no dropout: B = 1, T = 2, D = 4, one head,
 * F = 8. Bytes: E = (B, T, D) = 32, the norm statistics 2 x (B, T) x 4 =
 * 16, S = (B, H, T, T) = 16, (T, T) bool 4, EF = (B, T, F) = 64. A batch
 * of one: matmul's reshapes of the q, k and v views for bmm are views, no
 * copies (bmm keeps c_attn's output through them).
 * Under no_grad (the block's input is its caller's): ln_1 +32 (+16 its
 * statistics, gone) = 32; c_attn +96 = 128; the scores +16 = 144; * scale
 * +16 -16; == 0 +4, masked_fill +16, both inputs go (144); softmax +16
 * -16; the PV bmm's output +32 = 176; contiguous +32 = 208, the bmm output
 * goes (176); c_proj +32 = 208, its
 * input goes (176); the attention returns: qkv and the probabilities go
 * (64), then ln_1's output (32 = the attention's output); the residual sum
 * +32, the attention output goes (32); ln_2 +32 (+16) = 64; c_fc +64 = 128,
 * gelu +64 = 192, c_fc's output goes (128), the projection +32 = 160, gelu's
 * output goes (96); the MLP returns and ln_2's output goes (64: the sum and
 * the projection); the output +32 = 96, then those two go: 32. The climb
 * is 208.
 * With grad the saved tensors stay: the statistics 16 + 16, ln_1's output
 * 32 (c_attn's input), c_attn's output 96 (q, k and v views of it), the
 * bool 4, the softmax
 * output 16, c_proj's input 32, the residual sum 32 (ln_2's input), ln_2's
 * output 32, c_fc's 64 and gelu's 64: 404. Walked the same way, the level
 * reaches 436 + the output 32 = 468 at the last sum, the climb. */
static void test_gpt2_layer_by_hand(void **state)
{
    (void)state;
    check_climbs("model:\n  type: decoder\n  layers: 1\n  hidden: 4\n  heads: 1\n"
                 "  ffn: 8\n  activation: gelu\n  norm: layernorm\n  vocab: 10\n"
                 "  position: learned\n  max_positions: 2\n  attention: eager\n"
                 "  dropout: 0\ntraining:\n  micro_batch: 1\n  seq_len: 2\n"
                 "  optimizer: sgd\n",
                 468, 208); /* block 1: block.0 */
}

/* One HF Llama-layout layer in a 2-byte dtype under checkpoint: full
 * (no_grad): B = 1, T = 8, D = 4, one head (dh 4), F = 8, SwiGLU, rotary.
 * Bytes: E = q = k = v = 8 x 4 x 2 = 64, the scores S = 8 x 8 x 2 = 128 (in
 * fp32 256), EF = 8 x 8 x 2 = 128; the RMSNorm's fp32 tensors 8 x 4 x 4 =
 * 128 and its (B, T) statistics 32. Before the attention core the layer
 * holds the norm's output, q and k rotated and v: 256; the scores (+128:
 * a batch of one, so matmul copies neither q nor k, its reshapes views)
 * (384); the scale and the mask, one S at a time (384). softmax(dtype=float32) on bf16 first
 * copies the scores to fp32 (+256 = 640), then makes its fp32 result (+256
 * = 896), the layer's highest moment (the MLP's product reaches 640, the
 * norms 512); fp16 converts inside the kernel: 640 there, and `.to(query.
 * dtype)` then makes the 2-byte probabilities (+128 = 768) while the
 * scores are still bound (`attn_weights = softmax(...).to(...)` rebinds
 * them once the cast is made), the highest there. The climb adds the mask
 * and position ids the forward holds through the layers (8 x 8 x 2 + 8 x 8
 * = 192) and the output is allocated beside the transient (the layer's
 * 896 includes it): 1088 and 960. */
static void test_softmax_upcast_by_hand(void **state)
{
    (void)state;
    static const char *y = "model:\n  type: decoder\n  layers: 1\n  hidden: 4\n  heads: 1\n"
                           "  ffn: 8\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 10\n"
                           "  position: rope\n  attention: eager\n  dropout: 0\n"
                           "  tied_embeddings: false\n  bias: false\ntraining:\n"
                           "  micro_batch: 1\n  seq_len: 8\n  optimizer: sgd\n";
    ml_model *m = load_str(y);
    ml_config c = ml_model_config(m);
    ml_error e;
    assert_int_equal(ml_parse_checkpoint("full", &c.training.checkpoint, &e), ML_OK);
    c.training.precision = ML_PREC_BF16;
    assert_int_equal(climb(m, &c, 1), 1088);
    c.training.precision = ML_PREC_FP16_MASTER;
    assert_int_equal(climb(m, &c, 1), 960);
    ml_model_destroy(m);
}

/* One HF ViT layer (ViTLayer, pre-norm), fp32, no dropout: B = 1, a 4 x 4
 * one-channel image in 2 x 2 patches (T = 5 with the class token), D = 4,
 * two heads (dh 2; a batch of one, so matmul's reshapes of the head views
 * for bmm are views: no copies), F = 32. Bytes: E = (B, T, D) = 80, the
 * norm statistics 20 each, S = (B, H, T, T) = 200, EF = (B, T, F) = 640.
 * Under no_grad: layernorm_before +80 (+40, gone) = 80; the three
 * projections (ViTSelfAttention makes key, value, then query) +240 = 320;
 * the scores +200 (520); the scale +200 -200, softmax +200 -200 (520: the
 * probabilities); the product +80 (600); the contiguous context +80, the
 * product goes (600); ViTSelfAttention
 * returns: q, k, v and the probabilities go (160); ViTSelfOutput's dense
 * +80 (240); ViTAttention returns: the context and layernorm_before's
 * output go (80, attention_output, which ViTLayer keeps); the residual sum
 * +80 (160); layernorm_after +80 (+40, gone) = 240; the intermediate dense
 * +640 and gelu +640 = 1520, the layer's highest; the dense's output goes
 * (880) and, layer_output rebound, layernorm_after's (800); ViTOutput's
 * dense +80, the sum with the residual +80, the dense's output goes (880);
 * layer_output rebound: gelu's output goes (240); the layer returns: the
 * first sum and attention_output go, the output left. The climb is 1520
 * (a Hugging Face decoder layer's scoping would hold the probabilities to
 * the layer's end and layernorm_after's output through the MLP, and free
 * attention_output at the first sum: 1640).
 * With grad the saved tensors stay: layernorm_before's output and its
 * statistics 120, q, k and v (bmm keeps the projections' outputs through
 * its views) 240, the probabilities 200, the context 80, the first sum 80,
 * layernorm_after's output and statistics 120, the dense's output 640 and
 * gelu's 640: 2120. Walked the same way: 560 at the scores, 760 at the
 * scale and the softmax, and the level reaches 2200 at
 * gelu, 2280 with ViTOutput's dense and 2360 with the sum (attention_output
 * still bound), the climb; then the dense's output and attention_output
 * go: 2200 = 2120 saved + the 80 B output. */
static void test_vit_layer_by_hand(void **state)
{
    (void)state;
    check_climbs("model:\n  type: encoder\n  layers: 1\n  hidden: 4\n  heads: 2\n"
                 "  ffn: 32\n  activation: gelu\n  norm: layernorm\n  norm_position: pre\n"
                 "  image_size: 4\n  patch_size: 2\n  channels: 1\n  classes: 3\n"
                 "  attention: eager\n  dropout: 0\ntraining:\n  micro_batch: 1\n"
                 "  optimizer: sgd\n",
                 2360, 1520); /* block 1: block.0 */
}

/* One HF Falcon layer (FalconDecoderLayer: parallel_attn, one shared
 * LayerNorm, rotary), fp32, no dropout: B = 1, T = 4, D = 4, two heads and
 * two key/value heads (dh 2, _split_heads' selects), F = 8. Bytes: E =
 * (B, T, D) = 64, query_key_value's output (B, T, 12) = 192, a head tensor
 * (B, H, T, dh) = 64 (half of it 32), S = (B, H, T, T) = 128, EF = 128, the
 * norm statistics 16 each. A batch of one: matmul's reshapes of q, k and
 * v for bmm are views (no copies), so bmm keeps the rotated q and k and,
 * through v's view, query_key_value's whole output. Under no_grad: the
 * norm +64 (+32, gone); query_key_value +192 = 256; the rotary on q (views
 * of that output): q * cos +64, -x2 +32, the cat +64, -x2 goes, * sin +64,
 * the cat goes, the sum +64, both products go: 320 (q rotated), and on k
 * the same: 384 (k's highest moment 384 + 64 + 32 + 64 = 544); the scores
 * +128 (512); `/= sqrt(dh)` in place makes nothing; + mask +128, softmax
 * +128 = 768, the layer's highest; the sum and the scores go (512); the
 * product, the merged heads' copy, the product goes, dense: 640; the
 * attention returns: q and k rotated, query_key_value's output, the
 * probabilities and the merged heads (dense's input) go (128: the norm's
 * output and the attention's); the MLP climbs to 384 (its input the norm's
 * output, which goes after it); the sum. With grad the saved tensors stay
 * (the norm's output and statistics 96, q and k rotated 128, the
 * probabilities 128, query_key_value's output 192, the merged heads 64,
 * the MLP's 256: 864): 800 at the softmax (416 before the scores, + the
 * scores, the sum, the probabilities), 672 as the attention returns (its
 * saved 608 and dense's output), then c_fc +128, gelu +128, the
 * projection +64 and mlp(h) + attn(h) +64: 1056, the layer's highest. The
 * climbs add the causal mask and the position ids the forward holds
 * through the layers (4 x 4 x 4 + 4 x 8 = 96): 1152 with grad, 864 under
 * no_grad. */
static void test_falcon_layer_by_hand(void **state)
{
    (void)state;
    check_climbs("model:\n  type: decoder\n  layers: 1\n  hidden: 4\n  heads: 2\n"
                 "  kv_heads: 2\n  ffn: 8\n  activation: gelu\n  norm: layernorm\n"
                 "  norm_bias: true\n  parallel_residual: true\n  shared_norm: true\n"
                 "  vocab: 10\n  position: rope\n  tied_embeddings: true\n  bias: false\n"
                 "  attention: eager\n  dropout: 0\ntraining:\n  micro_batch: 1\n"
                 "  seq_len: 4\n  optimizer: sgd\n",
                 1152, 864); /* block 1: block.0 */
}

#define RESIDUAL(act)                                                                        \
    "model:\n  type: sequential\n  input: [16]\n  layers:\n"                               \
    "    - linear: {out: 16, bias: false}\n"                                                 \
    "    - residual:\n        - linear: {out: 16, bias: false}\n        - " act "\n"         \
    "        - linear: {out: 16, bias: false}\n"                                             \
    "  loss: mse\ntraining:\n  micro_batch: 2\n  optimizer: sgd\n"

/* A residual of three layers on a (B, 16) input, B = 2, fp32: linear,
 * gelu, linear inside, an identity shortcut. Each tensor is 2 x 16 x 4 =
 * 128 B. Under no_grad: the first linear's output a (128), gelu's b (256),
 * a goes (128), the second linear's c (256), b goes (128), the sum (256), c
 * goes: the output. The climb is 256. With grad gelu saves a and the
 * second linear b (256 saved; the first linear saves the block's input):
 * a, b, c, the sum: 512, then c goes, leaving the saved 256 and the
 * output. The climb is 512.
 * With an in-place ReLU in place of the gelu (relu: {inplace: true}), its
 * result is a's storage, which it saves, as the second linear does. Under
 * no_grad: a (128), the ReLU adds nothing, c (256), a goes (128), the sum
 * (256), c goes: 256. With grad: a stays (saved), c (256), the sum (384), c
 * goes, leaving the saved 128 and the output: 384 (out of place it would be
 * 512, the ReLU's result a tensor of its own). */
static void test_residual_by_hand(void **state)
{
    (void)state;
    check_climbs(RESIDUAL("gelu: {}"), 512, 256);
    check_climbs(RESIDUAL("relu: {inplace: true}"), 384, 256);
}

/* How each block's forward transients were found, as the output says
 * (docs/ledger.md, "The forward, op by op"): GPT-2 small's layers and head
 * walked op by op in fp32 (their graphs have forward programs), its
 * embedding by the block rule (no program), its loss by its own formula;
 * under autocast too (its cast copies are ops of the programs); with a
 * fused attention kernel (flash) the layers have no program: the block
 * rule; with selective checkpointing the walk with grad is skipped:
 * partly. And whose backward runs node by node (docs/ledger.md, "Backward,
 * node by node"): the layers and the head in fp32 and under autocast with
 * eager attention, not with a fused kernel (its saved tensors are the
 * kernel's), nor under selective checkpointing; never the embedding nor
 * the loss, whose backwards are rules. */
static void test_transients_said(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 128;
    static const struct {
        ml_precision prec;
        ml_checkpoint_kind ck;
        ml_attention kernel;
        ml_transients layer;
        bool nodes;
    } rows[] = {{ML_PREC_FP32, ML_CKPT_NONE, ML_ATTN_EAGER, ML_TRANSIENTS_OPS, true},
                {ML_PREC_AMP_BF16, ML_CKPT_NONE, ML_ATTN_EAGER, ML_TRANSIENTS_OPS, true},
                {ML_PREC_AMP_BF16, ML_CKPT_NONE, ML_ATTN_FLASH, ML_TRANSIENTS_BLOCK_RULE, false},
                {ML_PREC_FP32, ML_CKPT_SELECTIVE, ML_ATTN_EAGER, ML_TRANSIENTS_PARTLY, false}};
    for (size_t r = 0; r < sizeof rows / sizeof *rows; r++) {
        m->attn.kernel = rows[r].kernel;
        c.training.precision = rows[r].prec;
        c.training.checkpoint.kind = rows[r].ck;
        ml_ledger *l = NULL;
        assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, NULL), ML_OK);
        size_t n = ml_ledger_block_count(l);
        assert_int_equal(n, 15); /* embedding, 12 layers, head, loss */
        assert_int_equal(ml_ledger_block(l, 0)->transients, ML_TRANSIENTS_BLOCK_RULE);
        for (size_t i = 1; i <= 13; i++) { /* the layers and the head */
            assert_int_equal(ml_ledger_block(l, i)->transients, rows[r].layer);
            assert_int_equal(ml_ledger_block(l, i)->backward_nodes, rows[r].nodes);
        }
        assert_int_equal(ml_ledger_block(l, 14)->transients, ML_TRANSIENTS_FORMULA);
        assert_false(ml_ledger_block(l, 0)->backward_nodes);
        assert_false(ml_ledger_block(l, 14)->backward_nodes);
        ml_ledger_destroy(l);
    }
    assert_string_equal(ml_transients_name(ML_TRANSIENTS_BLOCK_RULE), "block_rule");
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_layer_by_hand),
        cmocka_unit_test(test_residual_by_hand),
        cmocka_unit_test(test_softmax_upcast_by_hand),
        cmocka_unit_test(test_vit_layer_by_hand),
        cmocka_unit_test(test_falcon_layer_by_hand),
        cmocka_unit_test(test_transients_said),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
