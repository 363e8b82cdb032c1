/* Hand-derived activation inventories (docs/inventory.md). Every expected
 * value below is derived in the comments from what PyTorch's autograd saves
 * (tools/autograd/derivatives.yaml), not taken from the program. */
#include "harness.h"

/* A GPT-2 style decoder: B=2, T=16, D=64, H=4 (dh=16), F=256, V=100. */
#define GPT_SMALL(prec, drop, attn)                                                          \
    "name: tiny-gpt\nmodel:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n"       \
    "  ffn: 256\n  vocab: 100\n  max_positions: 16\n  dropout: " drop "\n  attention: " attn \
    "\ntraining:\n  micro_batch: 2\n  seq_len: 16\n  precision: " prec "\n"

static uint64_t inventory(const char *yaml, const char *block, uint64_t *total, double *c)
{
    ml_model *m = load_str(yaml);
    ml_config cfg = ml_model_config(m);
    ml_ledger *l = eval(m, &cfg, false);
    const ml_block_info *b = block_named(l, block);
    uint64_t v = b->inventory_bytes;
    assert_int_equal(b->activations_saved, v); /* no checkpointing: all kept */
    if (total)
        *total = ml_ledger_summary(l)->bytes_activations;
    if (c)
        *c = b->c;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return v;
}

/* One fp32 GPT-2 block with dropout, in Korthikanti et al. (2022) terms:
 * sbh = B*T*D = 2048 elements, as^2 b = H*T*T*B = 2048 elements.
 *   attention: LN1 input 4 B + QKV input 4 + q,k,v copies 12 + proj input 4
 *              + residual dropout mask 1                 = 25 B x sbh
 *              softmax out 4 + dropout mask 1 + dropout out 4 = 9 B x as^2b
 *   MLP:       LN2 input 4 + fc input 4 + gelu input 16 (F = 4D)
 *              + proj input 16 + dropout mask 1          = 41 B x sbh
 *   (Korthikanti's 34 sbh + 5 as^2 b counts 2-byte values: 2x minus masks.)
 *   extras:    LN mean+rstd: 2 norms x 2 x B*T x 4 B = 512;
 *              masked_fill's bool causal mask: T*T = 256.
 *   total = 66 x 2048 + 9 x 2048 + 512 + 256 = 154,368 B. */
static void test_gpt2_block_fp32(void **state)
{
    (void)state;
    uint64_t total;
    double c;
    uint64_t blk = inventory(GPT_SMALL("fp32", "0.1", "eager"), "block.0", &total, &c);
    assert_int_equal(blk, 66 * 2048 + 9 * 2048 + 512 + 256);
    assert_int_equal(blk, 154368);
    /* c = 154368 / (B*T*D*4 B) = 154368 / 8192 */
    assert_rel_close(c, 154368.0 / 8192.0, 1e-12);
    /* embedding: position ids T*8 = 128, dropout mask B*T*D = 2048 -> 2176
     * (the int64 ids it saves, B*T*8 = 256, are the batch's storage). head:
     * LN input 8192 + stats 256 + lm_head input 8192 = 16640. loss:
     * log-softmax B*T*V*4 = 12800 + nll_loss's fp32 total_weight scalar 4
     * (the int64 targets, 256, are the batch's). The logits (held by the
     * caller) are not saved for backward. The batch: ids + targets = 512. */
    assert_int_equal(inventory(GPT_SMALL("fp32", "0.1", "eager"), "embedding", NULL, NULL), 2176);
    assert_int_equal(inventory(GPT_SMALL("fp32", "0.1", "eager"), "head", NULL, NULL), 16640);
    assert_int_equal(inventory(GPT_SMALL("fp32", "0.1", "eager"), "loss", NULL, NULL), 12804);
    assert_int_equal(total, 2176 + 2 * 154368 + 16640 + 12804);
}

/* dropout 0: no masks, and dropout(p=0) returns its input, so PV saves the
 * softmax output itself: 154368 - (2048 + 8192) - 2 x 2048 = 140,032. */
static void test_gpt2_block_no_dropout(void **state)
{
    (void)state;
    assert_int_equal(inventory(GPT_SMALL("fp32", "0", "eager"), "block.0", NULL, NULL), 140032);
}

/* amp-bf16 (autocast): the residual stream and layer_norm/softmax stay fp32,
 * matmul inputs are bf16 cast copies, and each matmul saves the bf16 copy of
 * its weight.
 *   LN1 input 8192 + stats 256; qkv input cast 4096 + weight copy 64x192x2
 *   = 24576; q,k,v copies 3x2048x2 = 12288; causal mask 256; softmax fp32
 *   8192; dropout mask 2048; bf16 cast of the probabilities for PV 4096;
 *   proj input 4096 + weight copy 8192; residual mask 2048; LN2 input 8192
 *   + stats 256; fc input cast 4096; fc and proj weight copies 2x32768;
 *   gelu input 16384, gelu output 16384; MLP mask 2048  = 191,232 B. */
static void test_gpt2_block_amp(void **state)
{
    (void)state;
    double c;
    assert_int_equal(inventory(GPT_SMALL("amp-bf16", "0.1", "eager"), "block.0", NULL, &c),
                     191232);
    assert_rel_close(c, 191232.0 / (2048.0 * 2), 1e-12);
}

/* flash attention (fp32, no dropout): q,k,v 3x8192, output 8192, logsumexp
 * B*H*T*4 = 512 replace the copies and the T x T tensors, and the output
 * is the projection's input (the kernel writes it as (B, T, H, dh):
 * transposed back it is contiguous, no copy; attention.cu):
 *   LN1 8192+256, qkv input 8192, q,k,v 24576, out 8192, lse 512,
 *   LN2 8192+256, fc input 8192, gelu in+out 65536
 *   = 132,096 B; equivalently the eager 140,032 - copies 24,576 - causal
 *   mask 256 - softmax 8,192 - proj input 8,192 + 24,576 + 8,192 + 512. */
static void test_gpt2_block_flash(void **state)
{
    (void)state;
    assert_int_equal(inventory(GPT_SMALL("fp32", "0", "flash"), "block.0", NULL, NULL), 132096);
}

/* A Llama block (HF modeling_llama eager): B=1, T=8, D=32, H=4, kv_heads=2,
 * F=64, fp32. B*T*D = 256, B*T = 8, H*T*T = 256, B*T*F = 512.
 *   RMSNorm: input x 1024, rsqrt 32, normalised h 1024      (x2 norms)
 *   q/k/v projection input (shared) 1024; q, k, v copies for bmm, k and v
 *   repeated to 4 heads: 3 x 1024; softmax (fp32) 1024, which PV reuses;
 *   o_proj input 1024; MLP input 1024; silu input, silu output, up output,
 *   gated product: 4 x 2048.
 *   = 2 x 2080 + 1024 + 3072 + 1024 + 1024 + 1024 + 8192 = 19,520 B. */
#define LLAMA(prec)                                                                          \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 2\n"        \
    "  ffn: 64\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 50\n  position: rope\n"      \
    "  tied_embeddings: false\n  bias: false\n  dropout: 0\n"                                \
    "training:\n  micro_batch: 1\n  seq_len: 8\n  precision: " prec "\n"

static void test_llama_block(void **state)
{
    (void)state;
    assert_int_equal(inventory(LLAMA("fp32"), "block.0", NULL, NULL), 19520);
    /* pure bf16: RMSNorm saves an fp32 copy of x (1024), rsqrt (32) and the
     * bf16 normalised value (512) = 1568 per norm; q/k/v input 512; copies
     * 1536; softmax (dtype=float32) 1024 plus its bf16 cast for PV 512;
     * o_proj input 512; MLP input 512; 4 x 1024 gated terms.
     *   = 2 x 1568 + 512 + 1536 + 1024 + 512 + 512 + 512 + 4096 = 11,840 B */
    assert_int_equal(inventory(LLAMA("bf16"), "block.0", NULL, NULL), 11840);
    /* parameters: q 32x32, k and v 32x16, o 32x32, MLP 3 x 32x64, two norms */
    ml_model *m = load_str(LLAMA("fp32"));
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->params, 1024 + 512 + 512 + 1024 + 6144 + 64);
    /* untied: embedding 50x32, head 50x32 + final norm 32 */
    assert_int_equal(ml_ledger_summary(l)->params, 2 * 9280 + 1600 + 1600 + 32);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The Llama block above with a head size of its own (HF head_dim, as
 * Mistral-NeMo's 128 against 5120 / 32 = 160): head_dim 16 where D / H = 8,
 * so the queries and the attention output are H * dh = 64 wide, k and v
 * kv_heads * dh = 32. B*T = 8, B*T*D = 256, B*T*H*dh = 512.
 *   RMSNorm x2: 2 x 2080; q/k/v projection input (D wide) 1024;
 *   q, k, v copies for bmm (k and v repeated to 4 heads): 3 x 512 x 4 = 6144;
 *   softmax (fp32) B*H*T*T*4 = 1024; o_proj input 512 x 4 = 2048;
 *   MLP input 1024; gated terms 4 x 2048
 *   = 4160 + 1024 + 6144 + 1024 + 2048 + 1024 + 8192 = 23,616 B
 * (the 19,520 of D / H heads + 3072 more copies + 1024 more o_proj input).
 * Parameters: q 32x64, k and v 32x32, o 64x32, MLP 3 x 32x64, norms 2 x 32
 * = 2048 + 2048 + 2048 + 6144 + 64 = 12,352.
 * Forward FLOPs: q/k/v 2*8*32*(64 + 2*32) = 65,536; QK^T and PV
 * 4*B*H*T*T*dh = 4*4*64*16 = 16,384; o_proj 2*8*64*32 = 32,768; SwiGLU
 * 3 x 2*8*32*64 = 98,304; = 212,992.
 * Embedding: rotary cos and sin, one row for the batch, 2*T*dh*4 = 1024 (its int64 ids, 64 B,
 * are the batch's storage). */
#define LLAMA_HD(attn)                                                                       \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 2\n"        \
    "  head_dim: 16\n  ffn: 64\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 50\n"        \
    "  position: rope\n  tied_embeddings: false\n  bias: false\n  dropout: 0\n"              \
    "  attention: " attn "\ntraining:\n  micro_batch: 1\n  seq_len: 8\n  precision: fp32\n"

static void test_llama_head_dim(void **state)
{
    (void)state;
    assert_int_equal(inventory(LLAMA_HD("eager"), "block.0", NULL, NULL), 23616);
    assert_int_equal(inventory(LLAMA_HD("eager"), "embedding", NULL, NULL), 1024);
    /* flash: q, k, v B*T*(64 + 2*32)*4 = 4096, the output B*T*64*4 = 2048
     * and the logsumexp B*H*T*4 = 128 in place of the copies and softmax,
     * the output o_proj's input too (no copy, as in test_gpt2_block_flash):
     * 23,616 - 6144 - 1024 - 2048 + 4096 + 2048 + 128 = 20,672 */
    assert_int_equal(inventory(LLAMA_HD("flash"), "block.0", NULL, NULL), 20672);
    ml_model *m = load_str(LLAMA_HD("eager"));
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->params, 12352);
    /* untied: embedding 50x32, head 50x32 + final norm 32 */
    assert_int_equal(ml_ledger_summary(l)->params, 2 * 12352 + 1600 + 1600 + 32);
    assert_rel_close(block_named(l, "block.0")->flops_forward, 212992, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    /* rotary embeddings rotate pairs: an odd head size is refused */
    ml_model *bad = NULL;
    ml_error e;
    const char *odd = "model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n"
                      "  head_dim: 9\n  vocab: 50\n  position: rope\n";
    assert_int_equal(ml_model_load_string(odd, strlen(odd), "odd.yaml", &bad, &e), ML_SCHEMA);
    assert_non_null(strstr(e.msg, "rope needs an even head size, head_dim = 9"));
    assert_int_equal(e.line, 6);
    assert_null(bad);
}

/* Buffers (docs/ledger.md, "The batch and the buffers"): the rotary
 * embedding's inv_freq, head_dim / 2 fp32 values (16 / 2 x 4 = 32 B), and
 * what model.buffers declares on top (1 KiB); the batch: the int64 ids and
 * targets, B*T*8 = 64 B each. Both resident: the first event of forward sees
 * params + buffers + batch. A size that is not one is refused at its key. */
static void test_buffers_and_batch(void **state)
{
    (void)state;
    ml_model *m = load_str(LLAMA_HD("eager"));
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, true);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->bytes_buffers, 32);
    assert_int_equal(s->bytes_batch, 128);
    const ml_event *ev = ml_ledger_events(l);
    size_t i = 0;
    while (i < ml_ledger_event_count(l) && ev[i].block < 0)
        i++;
    assert_true(i < ml_ledger_event_count(l));
    assert_int_equal(ev[i].live[ML_CAT_BUFFERS], 32);
    assert_int_equal(ev[i].live[ML_CAT_BATCH], 128);
    assert_int_equal(ev[i].live[ML_CAT_PARAMS], s->bytes_params);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    char y[1024];
    snprintf(y, sizeof y, "%s", LLAMA_HD("eager"));
    char *at = strstr(y, "  dropout: 0\n");
    assert_non_null(at);
    char z[1100];
    snprintf(z, sizeof z, "%.*s  buffers: 1KiB\n%s", (int)(at - y), y, at);
    m = load_str(z);
    c = ml_model_config(m);
    l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->bytes_buffers, 1024 + 32);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    snprintf(z, sizeof z, "%.*s  buffers: lots\n%s", (int)(at - y), y, at);
    ml_error e;
    ml_model *bad = NULL;
    assert_int_equal(ml_model_load_string(z, strlen(z), "t.yaml", &bad, &e), ML_SCHEMA);
    assert_null(bad);
    assert_non_null(strstr(e.msg, "model.buffers"));
}

/* The two-layer MLP of the design notes: z1 = x W1, a = gelu(z1), y = a W2,
 * with B=3, 8 -> 16 -> 4, fp32, MSE loss.
 *   x: the first linear saves its input although x needs no gradient:
 *      3x8x4 = 96, the batch's storage (held by the loop all iteration)
 *   z1: gelu saves its input: 3x16x4 = 192
 *   a: the second linear saves its input: 192
 *   loss: mse_loss saves y (48) and the target (48, the batch's)
 * blocks' own: 192 + 192 + 48 = 432 B; the batch x + target = 144 B. FLOPs: 2*3*8*16 + 2*3*16*4 = 1152 forward; backward skips
 * the first layer's input gradient: 768 + 2*384 = 1536. */
static void test_mlp_inventory(void **state)
{
    (void)state;
    const char *y = "model:\n  type: sequential\n  input: [8]\n  layers:\n"
                    "    - linear: {out: 16, bias: false}\n    - gelu: {}\n"
                    "    - linear: {out: 4, bias: false}\n  loss: mse\n"
                    "training:\n  micro_batch: 3\n";
    ml_model *m = load_str(y);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(block_named(l, "0:linear")->inventory_bytes, 0);
    assert_int_equal(block_named(l, "1:gelu")->inventory_bytes, 192);
    assert_int_equal(block_named(l, "2:linear")->inventory_bytes, 192);
    assert_int_equal(block_named(l, "loss")->inventory_bytes, 48);
    assert_int_equal(s->bytes_activations, 432);
    assert_int_equal(s->bytes_batch, 144);
    assert_int_equal(s->bytes_buffers, 0);
    assert_int_equal(s->params, 192);
    assert_rel_close(s->flops_forward, 1152, 0);
    assert_rel_close(s->flops_backward, 1536, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* A small CNN, B=2, fp32, 3x8x8 input:
 *   conv2d (3->4, 3x3, pad 1) saves the image: 2x192x4 = 1536, the
 *     batch's storage
 *   batchnorm saves its input (the conv output, 2x4x8x8x4 = 2048) and
 *     save_mean + save_invstd (2 x 4 channels x 4 B = 32): 2080
 *   relu saves its output (2048), which maxpool saves as its input too:
 *     counted once, with relu, the module running when it was first saved
 *   maxpool: int64 indices 2x4x4x4x8 = 1024 (its input is relu's output)
 *   flatten: a view, nothing
 *   linear (64 -> 10) saves its input (the pooled map) 2x64x4 = 512
 *   loss: log-softmax 2x10x4 = 80 + total_weight 4 = 84 (the int64
 *     targets, 16, are the batch's)
 * blocks' own: 2080 + 2048 + 1024 + 512 + 84 = 5748 B; the batch: image +
 * targets = 1552 B; the buffers: batchnorm's running_mean and running_var
 * (4 fp32 each) and num_batches_tracked (int64) = 40 B. */
static void test_cnn_inventory(void **state)
{
    (void)state;
    const char *y = "model:\n  type: sequential\n  input: [3, 8, 8]\n  layers:\n"
                    "    - conv2d: {out: 4, kernel: 3, padding: 1, bias: false}\n"
                    "    - batchnorm: {}\n    - relu: {}\n    - maxpool: {kernel: 2}\n"
                    "    - flatten: {}\n    - linear: {out: 10}\n"
                    "training:\n  micro_batch: 2\n";
    ml_model *m = load_str(y);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "0:conv2d")->inventory_bytes, 0);
    assert_int_equal(block_named(l, "1:batchnorm")->inventory_bytes, 2080);
    assert_int_equal(block_named(l, "2:relu")->inventory_bytes, 2048);
    assert_int_equal(block_named(l, "3:maxpool")->inventory_bytes, 1024);
    assert_int_equal(block_named(l, "4:flatten")->inventory_bytes, 0);
    assert_int_equal(block_named(l, "5:linear")->inventory_bytes, 512);
    assert_int_equal(block_named(l, "loss")->inventory_bytes, 84);
    assert_int_equal(ml_ledger_summary(l)->bytes_activations, 5748);
    assert_int_equal(ml_ledger_summary(l)->bytes_batch, 1552);
    assert_int_equal(ml_ledger_summary(l)->bytes_buffers, 40);
    /* 3x3x3x4 conv + 8 batchnorm + 640 + 10 linear */
    assert_int_equal(ml_ledger_summary(l)->params, 108 + 8 + 650);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The design notes: one hidden activation of B=2, 4 cameras x 16 frames x
 * 1024 tokens, D=1024, bf16 is 2*4*16*1024*1024*2 B = 256 MiB. In the
 * video-tokens preset it is the saved LayerNorm input of each block. */
static void test_video_hidden_activation(void **state)
{
    (void)state;
    ml_model *m = load_preset("video-tokens");
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.micro_batch * c.training.seq_len * 1024 * 2, 256ull << 20);
    c.training.checkpoint.kind = ML_CKPT_FULL;
    ml_ledger *l = eval(m, &c, false);
    /* under full checkpointing a block keeps exactly its input */
    assert_int_equal(block_named(l, "block.3")->activations_saved, 256ull << 20);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gpt2_block_fp32),
        cmocka_unit_test(test_gpt2_block_no_dropout),
        cmocka_unit_test(test_gpt2_block_amp),
        cmocka_unit_test(test_gpt2_block_flash),
        cmocka_unit_test(test_llama_block),
        cmocka_unit_test(test_llama_head_dim),
        cmocka_unit_test(test_buffers_and_batch),
        cmocka_unit_test(test_mlp_inventory),
        cmocka_unit_test(test_cnn_inventory),
        cmocka_unit_test(test_video_hidden_activation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
