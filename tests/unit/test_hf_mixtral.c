/* The Mixtral family: mistralai/Mixtral-8x7B-v0.1's published parameter
 * count recomputed by hand, the import's mapping and refusals, and a
 * Mixtral block's inventory derived from what its router and experts keep
 * (docs/inventory.md, "Mixtral block"). Every expected value is derived in
 * the comments, not taken from the program. */
#include "harness.h"
#include "ledger/chain.h"
#include "model/model_internal.h"

/* mistralai/Mixtral-8x7B-v0.1: 46,702,792,704 parameters (the model card's
 * 46.7B).
 *   embed_tokens and lm_head (untied) 2 x 32000 x 4096         =   262,144,000
 *   per layer: q_proj and o_proj 2 x 4096 x 4096 = 33,554,432; k_proj and
 *     v_proj 2 x 4096 x 1024 = 8,388,608; the router 4096 x 8 = 32,768; 8
 *     experts x 3 x 4096 x 14336 = 1,409,286,144; two RMSNorms 8,192
 *     -> 1,451,270,144 per layer x 32                      = 46,440,644,608
 *   final norm                                                 =         4,096
 *   total                                                      = 46,702,792,704 */
static void test_mixtral_count(void **state)
{
    (void)state;
    const uint64_t layer = 2 * 4096ull * 4096 + 2 * 4096ull * 1024 + 4096ull * 8 +
                           8 * 3 * 4096ull * 14336 + 2 * 4096;
    assert_int_equal(layer, 1451270144ull);
    assert_int_equal(2 * 32000ull * 4096 + 32 * layer + 4096, 46702792704ull);
    ml_model *m = load_hf_config("mixtral-8x7b");
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 46702792704ull);
    assert_int_equal(block_named(l, "block.0")->params, 1451270144ull);
    ml_ledger_destroy(l);
    assert_int_equal(m->moe.experts, 8);
    assert_int_equal(m->moe.per_token, 2);
    assert_int_equal(m->attn.kv_heads, 8);
    assert_int_equal(m->mlp.ffn, 14336);
    assert_int_equal(m->attn.sliding_window, 0); /* "sliding_window": null */
    assert_int_equal(m->mlp.activation, ML_ACT_SWIGLU);
    assert_false(m->embed.tied || m->bias || m->attn.qkv_bias);
    ml_model_destroy(m);
}

/* A minimal Mixtral config with one key's text added. */
static ml_status load_variant(const char *extra, ml_model **m, ml_error *e)
{
    char text[1024];
    snprintf(text, sizeof text,
             "{\"model_type\": \"mixtral\", \"num_hidden_layers\": 2, \"hidden_size\": 32,\n"
             " \"num_attention_heads\": 4, \"num_key_value_heads\": 2,\n"
             " \"intermediate_size\": 64, \"vocab_size\": 50%s}",
             extra);
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

static void test_mixtral_keys(void **state)
{
    (void)state;
    static const struct {
        const char *extra, *msg;
    } refused[] = {
        {",\n \"output_router_logits\": true", "output_router_logits: true is refused"},
        {",\n \"router_jitter_noise\": 0.01", "router_jitter_noise: 0.01 is refused"},
        {",\n \"num_local_experts\": 1", "num_local_experts: 1 is out of range (2 to 4096)"},
        {",\n \"num_local_experts\": 4, \"num_experts_per_tok\": 5",
         "num_experts_per_tok: 5 is more than num_local_experts (4)"},
        {",\n \"attention_bias\": true", "MixtralAttention have no biases"},
        {",\n \"n_routed_experts\": 64", "n_routed_experts: 64 is refused"},
        {",\n \"hidden_act\": \"gelu\"", "hidden_act: 'gelu' is not modelled for mixtral"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        ml_status st = load_variant(refused[i].extra, &m, &e);
        if ((st != ML_SCHEMA && st != ML_RANGE) || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].extra, e.msg);
        assert_int_equal(e.line, 4);
        assert_null(m);
    }
    /* MixtralConfig's defaults: 8 experts, 2 per token, no window */
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_variant(", \"router_aux_loss_coef\": 0.02", &m, &e), ML_OK);
    assert_int_equal(m->moe.experts, 8);
    assert_int_equal(m->moe.per_token, 2);
    assert_int_equal(m->attn.sliding_window, 0);
    ml_model_destroy(m);
}

/* A tiny Mixtral-like decoder: B=2, T=8 (BT = 16), D=32, H=4, 2 kv heads,
 * dh=8, F=64, E=4 experts, k=2 per token (N = k*BT = 32 routed rows). */
#define TINY(moe)                                                                           \
    "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 2\n"       \
    "  ffn: 64\n  vocab: 50\n  position: rope\n  bias: false\n  tied_embeddings: false\n"   \
    "  norm: rmsnorm\n  activation: swiglu\n" moe                                           \
    "training:\n  micro_batch: 2\n  seq_len: 8\n"

/* One fp32 Mixtral block:
 *   Llama's attention half (test_hf_phi3.c's split block): the two
 *     RMSNorms 2 x (2048 + 64 + 2048) = 8320, q/k/v's input 2048, the q, k,
 *     v copies 6144, softmax 2048, o_proj's input 2048 -> 20,608
 *   router: gate's input (the norm's output) BT*D*4 = 2048; the fp32
 *     softmax BT*E*4 = 256; top-k's int64 indices BT*k*8 = 256; the sum
 *     BT*4 = 64 and the top-k values the in-place divide overwrites
 *     BT*k*4 = 128
 *   experts, over their N = 32 rows in all: torch.where's int64 (row,
 *     slot) pairs N*2*8 = 512; the gathered input N*D*4 = 4096; w1's,
 *     silu's, w3's outputs and the product 4 x N*F*4 = 32768; w2's output
 *     and the gathered weights N*D*4 + N*4 = 4224; index_add_'s source
 *     N*D*4 = 4096
 *   total 20,608 + 2,752 + 45,696 = 69,056 B.
 * The dense MLP instead keeps its input 2048 and 4 x BT*F*4 = 16384.
 * Parameters: q 1024, k and v 2 x 512, o 1024, router 32 x 4 = 128,
 * experts 4 x 3 x 32 x 64 = 24576, norms 64 -> 27,840. FLOPs: q/k/v
 * 2*BT*D*64 = 65,536; QK^T and PV 4*B*H*T*T*dh = 16,384; o_proj 32,768;
 * router 2*BT*D*E = 4,096; experts 3 x 2*N*D*F = 393,216 -> 512,000. */
static void test_mixtral_block_fp32(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY("  experts: 4\n  experts_per_tok: 2\n"));
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    const ml_block_info *b = block_named(l, "block.0");
    assert_int_equal(b->inventory_bytes, 69056);
    assert_int_equal(b->params, 27840);
    assert_rel_close(b->flops_forward, 512000, 0);
    ml_model *n = load_str(TINY(""));
    ml_ledger *ln = eval(n, &c, false);
    assert_int_equal(block_named(ln, "block.0")->inventory_bytes, 20608 + 2048 + 16384);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    ml_ledger_destroy(ln);
    ml_model_destroy(n);
}

/* The fp32 Mixtral block's backward, node by node (docs/inventory.md,
 * "Mixtral block"): 4 experts of N / E = 8 rows each, in the engine's
 * order: the last expert first, its index_add_ making the source's
 * gradient (8 x 32 x 4 = 1,024 B), then the router's nodes last, the gate's
 * mm making h's gradient (16 x 32 x 4 = 2,048 B) and its weight's
 * (32 x 4 x 4 = 512 B). Per expert: 12 nodes (3 of them InputBuffer
 * additions: into h's, x's and the weights' buffers; the last expert's
 * gradients of h and of the weights are those buffers: 10); the router 6
 * with the renormalisation. */
static void test_mixtral_nodes(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY("  experts: 4\n  experts_per_tok: 2\n"));
    ml_config c = ml_model_config(m);
    ml_chain ch;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &c, &ch, &e), ML_OK);
    const ml_cblock *b = &ch.blocks[1];
    assert_string_equal(b->name, "block.0");
    assert_true(b->nnodes > 0);
    const ml_bnode *n = &ch.nodes[b->node_first];
    size_t moe = 0;
    while (moe < b->nnodes && strncmp(n[moe].what, "IndexAddBackward0", 17))
        moe++;
    assert_true(moe < b->nnodes);
    assert_int_equal(n[moe].grad_in, 1024);
    /* the MoE's nodes: the last expert's 10, 3 experts x 12, the router's
     * 6, its gradient of h added into h's buffer last */
    size_t end = moe + 10 + 3 * 12 + 6;
    assert_string_equal(n[end - 2].what, "MmBackward0 (router)");
    assert_int_equal(n[end - 2].grad_in, 2048);
    assert_int_equal(n[end - 2].param_grad, 512);
    assert_string_equal(n[end - 1].what, "InputBuffer accumulation (in place)");
    assert_int_equal(n[end - 1].grad_out, 2048);
    ml__chain_free(&ch);
    /* --expert-imbalance 2: the first expert, the last in backward (when
     * the others' gradients exist), takes 2 x 8 = 16 rows, the three
     * others share the other 16 (6, 5, 5): the last expert's source
     * gradient 5 x 32 x 4 = 640 B, the first's 16 x 32 x 4 = 2,048 B */
    c.training.expert_imbalance = 2;
    assert_int_equal(ml__chain_build(m, &c, &ch, &e), ML_OK);
    b = &ch.blocks[1];
    n = &ch.nodes[b->node_first];
    assert_int_equal(n[moe].grad_in, 640);
    assert_int_equal(n[moe + 10 + 12].grad_in, 6 * 32 * 4); /* the second expert's */
    assert_int_equal(n[moe + 10 + 24].grad_in, 2048);
    ml__chain_free(&ch);
    ml_model_destroy(m);
}

/* An imbalance never lowers the planned peak: the busiest expert's rows
 * come when every other expert's gradients exist. */
static void test_imbalance_raises(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY("  experts: 4\n  experts_per_tok: 2\n"));
    ml_config c = ml_model_config(m);
    c.training.optimizer = ML_OPT_SGD;
    uint64_t last = 0;
    for (double x = 1; x <= 4; x += 1) {
        c.training.expert_imbalance = x;
        ml_ledger *l = eval(m, &c, false);
        assert_true(ml_ledger_summary(l)->peak >= last);
        last = ml_ledger_summary(l)->peak;
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

/* Qwen2-MoE's block on the same tiny shapes: without norm_topk_prob the
 * router keeps neither the sum (BT*4 = 64) nor the overwritten top-k
 * values (BT*k*4 = 128); the shared expert of width 48 keeps its gate_proj,
 * silu and up_proj outputs and the product 4 x BT*48*4 = 12,288, its gated
 * output BT*D*4 = 2,048 and the sigmoid's (BT, 1) result 64 (its inputs are
 * the norm's output the router saved): 69,056 - 192 + 14,400 = 83,264 B.
 * Parameters: + 3 x 32 x 48 + 32 (shared_expert_gate) = 4,640. */
static void test_qwen2_moe_block_fp32(void **state)
{
    (void)state;
    ml_model *m = load_str(TINY("  experts: 4\n  experts_per_tok: 2\n  expert_renorm: false\n"
                                "  shared_expert_ffn: 48\n"));
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->inventory_bytes, 83264);
    assert_int_equal(block_named(l, "block.0")->params, 27840 + 4640);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Qwen/Qwen1.5-MoE-A2.7B's config.json (models/hf/qwen1.5-moe-a2.7b; the
 * model card's 14.3B): untied embeddings 2 x 151936 x 2048 = 622,329,856;
 * per layer q, k, v with biases 3 x (2048^2 + 2048) = 12,589,056, o_proj
 * 4,194,304, the router 2048 x 60 = 122,880, 60 experts x 3 x 2048 x 1408 =
 * 519,045,120, the shared expert 3 x 2048 x 5632 = 34,603,008 and its gate
 * 2,048, two norms 4,096 -> 570,560,512 x 24 = 13,693,452,288; the final
 * norm 2,048: 14,315,784,192. */
static void test_qwen2_moe_count(void **state)
{
    (void)state;
    const uint64_t layer = 3 * (2048ull * 2048 + 2048) + 2048ull * 2048 + 2048ull * 60 +
                           60 * 3 * 2048ull * 1408 + 3 * 2048ull * 5632 + 2048 + 2 * 2048;
    assert_int_equal(layer, 570560512ull);
    ml_model *m = load_hf_config("qwen1.5-moe-a2.7b");
    assert_int_equal(m->moe.experts, 60);
    assert_int_equal(m->moe.per_token, 4);
    assert_int_equal(m->moe.expert_ffn, 1408);
    assert_int_equal(m->moe.shared_ffn, 5632);
    assert_false(m->moe.renorm);
    assert_true(m->attn.qkv_bias);
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 2 * 151936ull * 2048 + 24 * layer + 2048);
    assert_int_equal(ml_ledger_summary(l)->params, 14315784192ull);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    static const struct {
        const char *extra, *msg;
    } bad[] = {
        {", \"decoder_sparse_step\": 2", "decoder_sparse_step: 2 is refused"},
        {", \"mlp_only_layers\": [0]", "mlp_only_layers: a list is refused"},
        {", \"num_local_experts\": 8", "num_local_experts: 8 is refused"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char text[512];
        snprintf(text, sizeof text,
                 "{\"model_type\": \"qwen2_moe\", \"num_hidden_layers\": 2, "
                 "\"hidden_size\": 32, \"num_attention_heads\": 4, \"vocab_size\": 50%s}",
                 bad[i].extra);
        ml_error e;
        ml_model *q = NULL;
        if (ml_model_load_hf_string(text, strlen(text), "config.json", &q, &e) != ML_SCHEMA ||
            !strstr(e.msg, bad[i].msg))
            fail_msg("%s: got '%s'", bad[i].extra, e.msg);
    }
}

/* The largest forward workspace event of the iteration. */
static uint64_t forward_workspace(const ml_model *m, ml_config *c)
{
    ml_ledger *l = NULL;
    ml_error e;
    assert_int_equal(ml_ledger_evaluate(m, c, true, &l, &e), ML_OK);
    uint64_t most = 0;
    const ml_event *ev = ml_ledger_events(l);
    for (size_t i = 0; i < ml_ledger_event_count(l); i++)
        if (ev[i].phase == ML_PHASE_FORWARD && ev[i].cat == ML_CAT_WORKSPACE &&
            ev[i].delta > (int64_t)most)
            most = (uint64_t)ev[i].delta;
    ml_ledger_destroy(l);
    return most;
}

/* training.expert_imbalance sizes the busiest expert. With F = 256 the
 * block's largest unsaved tensor is that expert's (rows, F) intermediate
 * (the others: q/k/v's output BT*64*4 = 4096, the scores 2048, the router
 * logits 256, index_add_'s sum 2048), and its forward keeps the block
 * rule, twice the largest (docs/ledger.md): balanced, N / E = 8 rows,
 * 8 x 256 x 4 = 8192 -> 16,384; at 2, 16 rows -> 32,768; at 8, 64 rows,
 * but an expert takes a token once: at most B*T = 16 rows -> 32,768. */
static void test_expert_imbalance(void **state)
{
    (void)state;
    ml_model *m = load_str(
        "model:\n  type: decoder\n  layers: 2\n  hidden: 32\n  heads: 4\n  kv_heads: 2\n"
        "  ffn: 256\n  vocab: 50\n  position: rope\n  bias: false\n  tied_embeddings: false\n"
        "  norm: rmsnorm\n  activation: swiglu\n  experts: 4\n  experts_per_tok: 2\n"
        "training:\n  micro_batch: 2\n  seq_len: 8\n");
    ml_config c = ml_model_config(m);
    assert_true(c.training.expert_imbalance == 1);
    assert_int_equal(forward_workspace(m, &c), 16384);
    ml_error e;
    assert_int_equal(ml_config_set(&c, "training.expert_imbalance", "2", &e), ML_OK);
    assert_int_equal(forward_workspace(m, &c), 32768);
    c.training.expert_imbalance = 8;
    assert_int_equal(forward_workspace(m, &c), 32768);
    assert_int_not_equal(ml_config_set(&c, "training.expert_imbalance", "0.5", &e), ML_OK);
    assert_non_null(strstr(e.msg, "training.expert_imbalance"));
    ml_model_destroy(m);
}

/* experts is Mixtral's layer: a GPT-2-layout model, or one expert, is
 * refused at the key. */
static void test_mixtral_yaml_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *yaml, *msg;
    } bad[] = {
        {"model:\n  type: decoder\n  layers: 1\n  hidden: 32\n  heads: 4\n  vocab: 50\n"
         "  max_positions: 16\n  experts: 4\n",
         "model.experts: planned for Mixtral's layer only"},
        {TINY("  experts: 1\n"), "model.experts: a mixture of experts needs experts: 2 or more"},
        {TINY("  experts: 4\n  experts_per_tok: 5\n"),
         "model.experts_per_tok: 5 is more than the 4 experts"},
        /* experts: 0 is one dense MLP, so an expert's key beside it is refused */
        {TINY("  experts: 0\n  expert_ffn: 64\n"),
         "model.expert_ffn: a mixture of experts' key, and experts is 0 (one dense MLP)"},
        {TINY("  experts_per_tok: 2\n"),
         "model.experts_per_tok: a mixture of experts' key: give experts: N (2 or more)"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        ml_model *m = NULL;
        ml_error e;
        if (ml_model_load_string(bad[i].yaml, strlen(bad[i].yaml), "t.yaml", &m, &e) !=
                ML_SCHEMA ||
            !strstr(e.msg, bad[i].msg))
            fail_msg("case %zu: got '%s'", i, e.msg);
        assert_true(e.line > 0);
        assert_null(m);
    }
}

/* The reference file's zeros are the keys' "none": experts 0 is the dense
 * MLP, expert_ffn 0 is ffn, shared_expert_ffn 0 no shared expert, the
 * model's buffers 0 none, a training key's 0 "not given"; each plans as
 * the file without the key. */
static void test_documented_zeros(void **state)
{
    (void)state;
    static const struct {
        const char *with, *without;
    } same[] = {
        {TINY("  experts: 0\n  buffers: 0\n"), TINY("")},
        {TINY("  buffers: 0GiB\n"), TINY("")}, /* a zero with its unit */
        /* training keys whose 0 is "not given" (TINY ends in training:) */
        {TINY("") "  eval_batch: 0\n  eval_seq_len: 0\n  target_len: 0\n", TINY("")},
        {TINY("  experts: 4\n  expert_ffn: 0\n  shared_expert_ffn: 0\n"),
         TINY("  experts: 4\n")},
    };
    for (size_t i = 0; i < sizeof same / sizeof *same; i++) {
        ml_model *a = NULL, *b = NULL;
        ml_error e;
        if (ml_model_load_string(same[i].with, strlen(same[i].with), "t.yaml", &a, &e) != ML_OK)
            fail_msg("case %zu: %s", i, e.msg);
        assert_int_equal(ml_model_load_string(same[i].without, strlen(same[i].without), "t.yaml",
                                              &b, &e),
                         ML_OK);
        ml_config ca = ml_model_config(a), cb = ml_model_config(b);
        ml_ledger *la = NULL, *lb = NULL;
        assert_int_equal(ml_ledger_evaluate(a, &ca, false, &la, &e), ML_OK);
        assert_int_equal(ml_ledger_evaluate(b, &cb, false, &lb, &e), ML_OK);
        const ml_summary *sa = ml_ledger_summary(la), *sb = ml_ledger_summary(lb);
        assert_true(sa->params == sb->params && sa->peak == sb->peak && sa->params > 0);
        ml_ledger_destroy(la);
        ml_ledger_destroy(lb);
        ml_model_destroy(a);
        ml_model_destroy(b);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mixtral_count),
        cmocka_unit_test(test_mixtral_keys),
        cmocka_unit_test(test_mixtral_block_fp32),
        cmocka_unit_test(test_mixtral_nodes),
        cmocka_unit_test(test_imbalance_raises),
        cmocka_unit_test(test_mixtral_yaml_refusals),
        cmocka_unit_test(test_documented_zeros),
        cmocka_unit_test(test_expert_imbalance),
        cmocka_unit_test(test_qwen2_moe_block_fp32),
        cmocka_unit_test(test_qwen2_moe_count),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
