/* Each phase's peak (docs/ledger.md, "Each phase's peak"): by hand on a
 * small MLP, and against the event list for every preset. */
#include "harness.h"

static const char *const presets[] = {"mlp2",        "cifar10-resnet", "agnews-classifier",
                                      "gpt2-small",  "llama-2-7b",     "vit-b16",
                                      "t5-base",     "llava-1.5-7b"};
static const char *const policies[] = {"none", "full", "selective", "every-2"};

static void phase_is(const ml_phase_peak *p, uint64_t peak, const char *at)
{
    assert_true(p->present);
    assert_int_equal(p->peak, peak);
    assert_string_equal(p->at, at);
}

/* The MLP of test_ledger_invariants.c (test_three_peaks_by_hand): 8 -> 16
 * -> 4, B = 30, fp32 Adam (foreach): params 768, states 1536, resident 2304,
 * and the batch the loop holds all iteration, 1440 (x 960, target 480).
 * Steady, forward: 2304 + 1440 + z1 1920 (0:linear) + a 1920 (1:gelu) + y
 * 480 (2:linear) = 8064 at 2:linear, nothing freed (z1 and a are saved, x
 * is the batch). Loss: mse saves y - target, 480: 8544 at loss. Backward:
 * 10720 at 2:linear (test_three_peaks_by_hand). Optimizer: the residents
 * 2304, the grads 768, the batch 1440, y 480 (the loop keeps the output)
 * and foreach Adam's temporaries, one gradient's size 768: 5760 at
 * optimizer.step. The first iteration: the same less the states (1536)
 * until its step creates them: 6528, 7008, 9184; its step holds what the
 * steady one does, 5760. Evaluation at B = 60: forward 14304 at 1:gelu
 * (test_three_peaks_by_hand); at the loss, 2304 + 1440 + its batch 2880 + y
 * 960 (kept) + y - target 960 = 8544; no backward, no step. */
static void test_mlp_by_hand(void **state)
{
    (void)state;
    ml_model *m = load_str("model:\n  type: sequential\n  input: [8]\n  layers:\n"
                           "    - linear: {out: 16, bias: false}\n    - gelu: {}\n"
                           "    - linear: {out: 4, bias: false}\n  loss: mse\n"
                           "training:\n  micro_batch: 30\n  optimizer: adam\n"
                           "  optimizer_impl: foreach\n  eval_batch: 60\n");
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    phase_is(&s->phase_steady[ML_PHASE_FORWARD], 8064, "2:linear");
    phase_is(&s->phase_steady[ML_PHASE_LOSS], 8544, "loss");
    phase_is(&s->phase_steady[ML_PHASE_BACKWARD], 10720, "2:linear");
    phase_is(&s->phase_steady[ML_PHASE_OPTIMIZER], 5760, "optimizer.step");
    phase_is(&s->phase_first[ML_PHASE_FORWARD], 8064 - 1536, "2:linear");
    phase_is(&s->phase_first[ML_PHASE_LOSS], 8544 - 1536, "loss");
    phase_is(&s->phase_first[ML_PHASE_BACKWARD], 10720 - 1536, "2:linear");
    phase_is(&s->phase_first[ML_PHASE_OPTIMIZER], 5760, "optimizer.step");
    phase_is(&s->phase_eval[ML_PHASE_FORWARD], 14304, "1:gelu");
    phase_is(&s->phase_eval[ML_PHASE_LOSS], 8544, "loss");
    assert_false(s->phase_eval[ML_PHASE_BACKWARD].present);
    assert_false(s->phase_eval[ML_PHASE_OPTIMIZER].present);
    ml_ledger_destroy(l);
    /* zero_grad: zero — the steady backward holds every .grad (768) and an
     * AccumulateGrad transient: 11488 (test_three_peaks_by_hand); the first
     * iteration, which has no gradients yet, keeps 9184; its forward has
     * none either (8064 - 1536), where the steady forward carries them
     * (8064 + 768) */
    c.training.zero_grad = ML_ZERO_GRAD_ZERO;
    l = eval(m, &c, false);
    s = ml_ledger_summary(l);
    phase_is(&s->phase_steady[ML_PHASE_BACKWARD], 11488, "2:linear");
    phase_is(&s->phase_steady[ML_PHASE_FORWARD], 8064 + 768, "2:linear");
    phase_is(&s->phase_first[ML_PHASE_BACKWARD], 9184, "2:linear");
    phase_is(&s->phase_first[ML_PHASE_FORWARD], 8064 - 1536, "2:linear");
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The largest of a set of phase peaks (0 when none is present). */
static uint64_t largest(const ml_phase_peak *p, int *which)
{
    uint64_t mx = 0;
    for (int ph = 0; ph < ML_PHASE_COUNT; ph++)
        if (p[ph].present && p[ph].peak >= mx) {
            mx = p[ph].peak;
            *which = ph;
        }
    return mx;
}

/* Each steady phase's peak is the highest total during it: after each of
 * its events and before its first (the level it was entered at); the
 * optimizer's also the level its step starts from. The largest is the
 * peak, where the summary says; the first iteration's and the evaluation's
 * largest are their peaks. */
static void check(const char *name, const char *pol, const ml_ledger *l)
{
    const ml_summary *s = ml_ledger_summary(l);
    const ml_event *ev = ml_ledger_events(l);
    uint64_t mx[ML_PHASE_COUNT] = {0}, before_step = 0, prev = 0;
    bool seen[ML_PHASE_COUNT] = {false};
    for (size_t i = 0; i < ml_ledger_event_count(l); i++) {
        uint64_t total = 0;
        for (int c = 0; c < ML_CAT_COUNT; c++)
            total += ev[i].live[c];
        if (ev[i].phase != ML_PHASE_OPTIMIZER)
            before_step = total;
        ml_phase ph = ev[i].phase;
        uint64_t top = total > prev ? total : prev;
        if (top > mx[ph])
            mx[ph] = top;
        seen[ph] = true;
        prev = total;
    }
    if (before_step > mx[ML_PHASE_OPTIMIZER])
        mx[ML_PHASE_OPTIMIZER] = before_step;
    seen[ML_PHASE_OPTIMIZER] = true;
    for (int ph = 0; ph < ML_PHASE_COUNT; ph++) {
        if (seen[ph] != s->phase_steady[ph].present || mx[ph] != s->phase_steady[ph].peak)
            fail_msg("%s/%s: %s: events say %llu, the summary %llu", name, pol,
                     ml_phase_name((ml_phase)ph), (unsigned long long)mx[ph],
                     (unsigned long long)s->phase_steady[ph].peak);
        if (s->phase_first[ph].present)
            assert_true(s->phase_first[ph].peak <= s->phase_steady[ph].peak);
    }
    int which = -1;
    assert_int_equal(largest(s->phase_steady, &which), s->peak);
    assert_int_equal(s->phase_steady[s->peak_phase].peak, s->peak);
    assert_string_equal(s->phase_steady[s->peak_phase].at, s->peak_step);
    assert_int_equal(largest(s->phase_first, &which), s->peak_first_iteration);
    assert_true(s->has_eval);
    assert_int_equal(largest(s->phase_eval, &which), s->peak_eval);
    assert_false(s->phase_eval[ML_PHASE_BACKWARD].present);
    assert_false(s->phase_eval[ML_PHASE_OPTIMIZER].present);
}

/* autocast's cache under checkpointing (docs/precision.md): GPT-2 small,
 * amp-bf16, every block checkpointed. Each block's forward leaves its
 * weights' bf16 copies in the cache: c_attn 768 x 2304, attn.c_proj 768 x
 * 768, c_fc 768 x 3072, mlp.c_proj 3072 x 768 = 7,077,888 elements, 2 bytes
 * each: 14,155,776 bytes a block, held (workspace) until the loss is
 * computed, then freed, one block's at a time, before the backward's first
 * event: 12 frees of 14,155,776 at the loss. Without checkpointing the
 * matmuls save those copies (saved activations): no such frees. */
static void test_autocast_cache_under_checkpointing(void **state)
{
    (void)state;
    const int64_t copies = 2 * (768 * 2304 + 768 * 768 + 768 * 3072 + 3072 * 768);
    assert_int_equal(copies, 14155776);
    ml_model *m = load_preset("gpt2-small");
    for (int ckpt = 0; ckpt < 2; ckpt++) {
        ml_config c = ml_model_config(m);
        c.training.precision = ML_PREC_AMP_BF16;
        ml_error e;
        assert_int_equal(ml_parse_checkpoint(ckpt ? "full" : "none", &c.training.checkpoint, &e),
                         ML_OK);
        ml_ledger *l = eval(m, &c, true);
        const ml_event *ev = ml_ledger_events(l);
        size_t bwd = 0, n = ml_ledger_event_count(l);
        while (bwd < n && ev[bwd].phase != ML_PHASE_BACKWARD)
            bwd++;
        assert_true(bwd < n);
        /* the frees just before the backward, and the forward's allocations
         * of that size in the workspace */
        unsigned frees = 0, allocs = 0;
        for (size_t i = bwd; i-- > 0 && ev[i].delta == -copies;)
            if (ev[i].cat == ML_CAT_WORKSPACE && ev[i].phase == ML_PHASE_LOSS)
                frees++;
        for (size_t i = 0; i < bwd; i++)
            if (ev[i].phase == ML_PHASE_FORWARD && ev[i].cat == ML_CAT_WORKSPACE &&
                ev[i].delta == copies)
                allocs++;
        assert_int_equal(frees, ckpt ? 12 : 0);
        assert_int_equal(allocs, ckpt ? 12 : 0);
        if (ckpt) /* held at the loss: the workspace then holds all twelve */
            assert_true(ev[bwd - 13].live[ML_CAT_WORKSPACE] >= 12 * (uint64_t)copies);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

/* sdpa's math kernel (fp32, grouped heads: graph/kit_math.c) against eager
 * attention in the evaluation pass (no_grad), B = 1, H = 8, T = 1024, dh =
 * 32, fp32: the scores S = 8 x 1024^2 x 4 = 32 MiB. Eager's peak in the
 * attention holds two such tensors (scores and scaled scores, or masked
 * scores and probabilities) and the model's (1, 1, T, T) additive mask, 4
 * MiB; the math kernel's holds the scores, the softmax output and
 * isneginf's bool (S / 4, 8 MiB) at once, q scaled (1 x 8 x 1024 x 32 x 4 =
 * 1 MiB, bound to its return) and its own (T, T) mask, 4 MiB, in place of
 * the model's: 8 + 1 + 4 - 4 = 9 MiB more, everything else alike. */
static void test_math_kernel_eval_by_hand(void **state)
{
    (void)state;
    const char *yaml = "model:\n  type: decoder\n  layers: 2\n  hidden: 256\n  heads: 8\n"
                       "  kv_heads: 2\n  ffn: 512\n  activation: swiglu\n  norm: rmsnorm\n"
                       "  vocab: 100\n  position: rope\n  tied_embeddings: false\n"
                       "  bias: false\n  attention: %s\n  dropout: 0\ntraining:\n"
                       "  micro_batch: 1\n  seq_len: 1024\n  precision: fp32\n"
                       "  optimizer: adamw\n  eval_batch: 1\n";
    uint64_t peak[2];
    for (int k = 0; k < 2; k++) {
        char buf[512];
        snprintf(buf, sizeof buf, yaml, k ? "sdpa" : "eager");
        ml_model *m = load_str(buf);
        ml_config c = ml_model_config(m);
        c.device.allocator = ML_ALLOCATOR_NONE;
        ml_ledger *l = eval(m, &c, false);
        const ml_summary *s = ml_ledger_summary(l);
        assert_true(s->has_eval);
        peak[k] = s->peak_eval;
        assert_string_equal(s->phase_eval[ML_PHASE_FORWARD].at, "block.0");
        ml_ledger_destroy(l);
        ml_model_destroy(m);
    }
    assert_int_equal(peak[1] - peak[0], 9ull << 20);
}

static void test_every_preset(void **state)
{
    (void)state;
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
        ml_model *m = load_preset(presets[p]);
        for (size_t k = 0; k < sizeof policies / sizeof policies[0]; k++)
            for (unsigned v = 0; v < 4; v++) {
                ml_config c = ml_model_config(m);
                ml_error e;
                assert_int_equal(ml_parse_checkpoint(policies[k], &c.training.checkpoint, &e),
                                 ML_OK);
                c.training.grad_accum = v & 1 ? 2 : 1;
                c.training.zero_grad = v & 2 ? ML_ZERO_GRAD_ZERO : ML_ZERO_GRAD_SET_TO_NONE;
                c.training.eval_batch = c.training.micro_batch;
                ml_ledger *l = eval(m, &c, true);
                check(presets[p], policies[k], l);
                ml_ledger_destroy(l);
            }
        ml_model_destroy(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_mlp_by_hand),
        cmocka_unit_test(test_every_preset),
        cmocka_unit_test(test_autocast_cache_under_checkpointing),
        cmocka_unit_test(test_math_kernel_eval_by_hand),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
