/* The tiny GPT-2 layer of tests/unit/test_graph.c (B = 1, T = 2, D = 4,
 * one head, F = 8, fp32, no dropout; its graph with the copies a larger
 * batch makes) run without grad, as allocations (+)
 * and frees (-) in bytes, shared by test_graph.c and
 * test_reserved_tensors.c. In the order of the walk by hand in
 * test_forward.c (test_gpt2_layer_by_hand): ln_1's output and its
 * statistics (mean and rstd, 8 B each, gone at once); c_attn's 96; q's and
 * k's copies for bmm (32 B each, q's first), the scores, the copies go; the
 * scaled scores, the scores go; the bool, masked_fill's output, both its
 * inputs go; softmax, its input goes; v's copy, P v, the copy goes; the
 * contiguous output, P v goes; c_proj, its input goes; the attention
 * returns (qkv, the probabilities, then ln_1's output go); the residual
 * sum, the attention output goes; ln_2 (its two statistics gone at once);
 * c_fc, gelu, c_fc's output goes; the projection, gelu's output goes;
 * ln_2's output goes (TINY_STEPS_HEAD steps); the output, then the first
 * sum and the projection go. Its peak is the walk's 208 and it ends
 * holding the output (32). */
#ifndef ML_TESTS_TINY_STEPS_H
#define ML_TESTS_TINY_STEPS_H

#include <stdint.h>

/* The same layer with grad: the tensors an op saves stay (ln_1's output
 * and statistics, the copies of q, k and v for bmm, the bool mask, the
 * softmax output, c_proj's input, the residual sum, ln_2's output and
 * statistics, c_fc's and gelu's outputs: 404 B, test_forward.c). In order:
 * ln_1 and its statistics; c_attn; the copies of q and k, the scores; the
 * scaled scores, the scores go; the bool, masked_fill's output, the scaled
 * scores go; softmax, its input goes; v's copy, P v; the contiguous
 * output, P v goes; c_proj; the attention returns (qkv goes); the residual
 * sum, the attention output goes; ln_2 and its statistics; c_fc, gelu; the
 * projection (TINY_GRAD_STEPS_HEAD steps); the output, the projection
 * goes. Its peak is 468; it ends holding the saved 404 and the output. */
static const int64_t tiny_grad_steps[] = {32, 8,  8,   96, 32, 32, 16, 16,  -16, 4,
                                          16, -16, 16, -16, 32, 32, 32, -32, 32,  -96,
                                          32, -32, 32, 8,   8,  64, 64, 32,  32,  -32};
enum {
    TINY_GRAD_STEPS = sizeof tiny_grad_steps / sizeof tiny_grad_steps[0],
    TINY_GRAD_STEPS_HEAD = TINY_GRAD_STEPS - 2
};

static const int64_t tiny_steps[] = {
    32,  8,   8,   -8,  -8,  96, 32, 32,  16, -32, -32, 16,  -16, 4,  16,
    -4,  -16, 16,  -16, 32,  32, -32, 32, -32, 32, -32, -96, -16, -32, 32,
    -32, 32,  8,   8,   -8,  -8, 64,  64, -64, 32, -64, -32, 32,  -32, -32};
enum { TINY_STEPS = sizeof tiny_steps / sizeof tiny_steps[0], TINY_STEPS_HEAD = TINY_STEPS - 3 };

/* The same two walks as PyTorch runs them at this batch of one
 * (mlg_config.one_row; a plan at micro-batch 1): matmul's reshapes of the
 * q, k and v views for bmm are views, so there are no copies (the 32, 32
 * and their frees after the scores, the 32 and its free around P v) and,
 * with grad, bmm keeps c_attn's output through its views (its -96 at the
 * attention's return gone). The same peaks and ends: 208 and 32; 468 and
 * 404 + 32 (test_forward.c). */
static const int64_t tiny_fold_grad_steps[] = {32, 8,  8,  96, 16, 16,  -16, 4,  16, -16,
                                               16, -16, 32, 32, -32, 32, 32, -32, 32, 8,
                                               8,  64, 64, 32, 32, -32};
enum {
    TINY_FOLD_GRAD_STEPS = sizeof tiny_fold_grad_steps / sizeof tiny_fold_grad_steps[0],
    TINY_FOLD_GRAD_STEPS_HEAD = TINY_FOLD_GRAD_STEPS - 2
};
static const int64_t tiny_fold_steps[] = {32,  8,  8,  -8, -8,  96, 16,  16, -16, 4,
                                          16,  -4, -16, 16, -16, 32, 32, -32, 32, -32,
                                          -96, -16, -32, 32, -32, 32, 8,  8,  -8, -8,
                                          64,  64, -64, 32, -64, -32, 32, -32, -32};
enum {
    TINY_FOLD_STEPS = sizeof tiny_fold_steps / sizeof tiny_fold_steps[0],
    TINY_FOLD_STEPS_HEAD = TINY_FOLD_STEPS - 3
};

#endif
