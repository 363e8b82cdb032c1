/* The gradients of a block's backward, node by node, as the tensors they
 * are (chain.h, ml_bnode.gin_id): the allocator simulation makes each
 * input gradient a node computes and frees each one a later node is done
 * with by its identity, where freeing "the latest live tensor of that
 * size" may release another (a block's q, k and v gradients are of one
 * size). For every shipped model, each precision whose blocks have node
 * lists, the walk below does what the replay does (replay.c,
 * ml__replay_node_grads_in and _out) and requires that every gradient a
 * node frees is one a node of the block made (an accumulation node's: the
 * one made just before it, added in place into the buffer), or else the
 * block's incoming gradient, which the residual sums pass on
 * (AddBackward0 hands its one gradient to both inputs: engine.cpp), at
 * most once; that no gradient is made twice while live; and that what the
 * block hands to the block before (its input's gradient) is live at its
 * end, with nothing else left over.
 *
 * By hand: GPT-2's (nanoGPT's) q k^T product saves one copy of q and k
 * together (a tensor of twice the heads' size), and BmmBackward0 makes
 * their gradients as two tensors (derivatives.yaml: self's, then mat2's),
 * the two parts of that id, which the q and k head views' nodes free in
 * turn; v's gradient is the one the P v node made for v's copy (the
 * contiguous copy passes it through). */
#include "harness.h"

#include "ledger/chain_kit.h"

typedef struct {
    unsigned blocks, nodes, frees, carried, settings;
} tally;

/* The walk over block b's nodes; fails with the node's name. */
static void walk(const ml_model *m, const ml_chain *c, const ml_cblock *b, tally *t)
{
    static uint64_t named[ML_GID_NONE + 1], pend[ML_GID_NONE + 1];
    memset(named, 0, sizeof named);
    memset(pend, 0, sizeof pend);
    uint64_t carry = b->bwd_in;
    bool parts = false;
    for (size_t i = 0; i < b->nnodes; i++) {
        const ml_bnode *x = &c->nodes[b->node_first + i];
        uint64_t sum = 0;
        for (unsigned j = 0; j < x->ngout; j++) {
            const uint16_t id = x->gout_id[j];
            const uint64_t by = x->gout_b[j];
            sum += by;
            assert_true(id <= ML_GID_NONE);
            if (!by)
                continue;
            t->frees++;
            if (x->accum) {
                if (pend[id] != by)
                    fail_msg("%s %s: %s frees no gradient just made", m->name, b->name, x->what);
                pend[id] = 0;
            } else if (named[id]) {
                if (named[id] != by)
                    fail_msg("%s %s: %s frees %llu B of a %llu B gradient", m->name, b->name,
                             x->what, (unsigned long long)by, (unsigned long long)named[id]);
                named[id] = 0;
            } else if (carry == by) {
                carry = 0;
                t->carried++;
            } else {
                fail_msg("%s %s: %s frees a gradient (id %u, %llu B) no node made", m->name,
                         b->name, x->what, id, (unsigned long long)by);
            }
        }
        if (x->ngout)
            assert_int_equal(sum, x->grad_out);
        sum = 0;
        for (unsigned j = 0; j < x->ngin; j++) {
            const uint16_t id = x->gin_id[j];
            /* only a gradient added into a buffer may have no tensor of
             * its own (a residual sum's input, whose buffer holds the
             * incoming gradient) */
            if (id >= ML_GID_NONE && !((x->gin_acc >> j) & 1))
                fail_msg("%s %s: %s makes a gradient of no tensor", m->name, b->name, x->what);
            sum += x->gin_b[j];
            uint64_t *slot = (x->gin_acc >> j) & 1 ? &pend[id] : &named[id];
            if (*slot)
                fail_msg("%s %s: %s makes a gradient (id %u) that is live", m->name, b->name,
                         x->what, id);
            *slot = x->gin_b[j];
        }
        if (x->ngin)
            assert_int_equal(sum, x->grad_in);
        parts |= x->ngin || x->ngout;
        t->nodes++;
    }
    if (!parts)
        return; /* a list without identities (not from an op graph): by bytes */
    t->blocks++;
    /* the input's gradient, handed on: the one named, else the incoming */
    if (!b->in_nograd && b->in_bytes) {
        if (b->hand_gid) {
            assert_int_equal(named[b->hand_gid - 1], b->in_bytes);
            named[b->hand_gid - 1] = 0;
        } else {
            assert_int_equal(carry, b->in_bytes);
            carry = 0;
        }
    }
    for (size_t id = 0; id <= ML_GID_NONE; id++)
        if (named[id] || pend[id])
            fail_msg("%s %s: a gradient (id %zu) is left at the block's end", m->name, b->name,
                     id);
}

/* fn(m, cfg, arg) for decoder or encoder m under each attention kernel
 * (eager's graphs differ most: a partial rotary's pass-through slices, the
 * head views' copies) and each of the first nprec of fp32, bf16 and
 * amp-bf16 at B 2, T 64 (a vision tower's image takes 576 of the tokens:
 * 640); fn returns ML_RANGE for a kernel the model refuses. */
static void each_setting(ml_model *m, size_t nprec,
                         ml_status (*fn)(ml_model *, const ml_config *, void *), void *arg)
{
    if (m->type != ML_MODEL_DECODER && m->type != ML_MODEL_ENCODER)
        return;
    static const ml_precision precs[] = {ML_PREC_FP32, ML_PREC_BF16, ML_PREC_AMP_BF16};
    static const ml_attention kernels[] = {ML_ATTN_EAGER, ML_ATTN_SDPA, ML_ATTN_FLASH};
    const ml_attention own = m->attn.kernel;
    for (size_t a = 0; a < 3; a++)
        for (size_t p = 0; p < nprec; p++) {
            m->attn.kernel = kernels[a];
            ml_config cfg = config_at(m, precs[p], 2, m->vision.layers ? 640 : 64);
            ml_status st = fn(m, &cfg, arg);
            if (st == ML_RANGE && kernels[a] != own)
                continue;
            if (st != ML_OK)
                fail_msg("%s: kernel %zu, precision %zu: status %d", m->name, a, p, st);
        }
    m->attn.kernel = own;
}

static ml_status walk_setting(ml_model *m, const ml_config *cfg, void *arg)
{
    tally *t = arg;
    ml_chain c;
    ml_error e;
    ml_status st = ml__chain_build(m, cfg, &c, &e);
    if (st != ML_OK)
        return st;
    for (size_t k = 0; k < c.n; k++)
        walk(m, &c, &c.blocks[k], t);
    ml__chain_free(&c);
    t->settings++;
    return ML_OK;
}

static void check(ml_model *m, void *arg)
{
    each_setting(m, 3, walk_setting, arg);
}

static void test_shipped_gradients_by_identity(void **state)
{
    (void)state;
    tally t = {0, 0, 0, 0, 0};
    each_shipped_model(check, &t);
    print_message("%u settings, %u blocks, %u nodes: %u gradients freed by identity, %u of "
                  "them the incoming one\n",
                  t.settings, t.blocks, t.nodes, t.frees, t.carried);
    assert_true(t.blocks > 100);
    assert_true(t.carried > 0 && t.carried < t.frees);
}

/* nanoGPT's q k^T (GPT-2 small's layout at B 2, T 64, hidden 768: a head
 * tensor 2 * 64 * 768 * 4 = 393,216 B in fp32): its node makes two
 * gradients of that size, the parts 1 and 0 of the copies' id (k's first:
 * BmmBackward0 makes mat2's gradient before self's, derivatives.yaml's
 * inputs in sorted order). The head views' nodes reshape the transposed
 * gradients: v's (the P v node's) and q's (part 0) are copied, v's first
 * (the engine runs the later op first); k's, through k^T's bmm, reshapes
 * as a view, no node (1.13 on the CPU: q's and v's gradients reach the
 * split contiguous, k's with strides (512, 1, 8) at B 2, T 8, 4 heads of
 * 16). SplitBackward0 frees q's and v's copies and k's part 1. */
static void test_nanogpt_qk_parts(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config cfg = config_at(m, ML_PREC_FP32, 2, 64);
    ml_chain c;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &cfg, &c, &e), ML_OK);
    const ml_cblock *b = &c.blocks[1];
    assert_string_equal(b->name, "block.0");
    const ml_bnode *qk = NULL, *vv = NULL, *qv = NULL, *split = NULL, *pv = NULL;
    for (size_t i = 0; i < b->nnodes; i++) {
        const ml_bnode *x = &c.nodes[b->node_first + i];
        if (!strcmp(x->what, "BmmBackward0 (q k^T)"))
            qk = x;
        else if (!strcmp(x->what, "ViewBackward0 (v, contiguous copy)"))
            vv = x;
        else if (!strcmp(x->what, "ViewBackward0 (q, contiguous copy)"))
            qv = x;
        else if (!strcmp(x->what, "SplitBackward0 (cat of q, k, v)"))
            split = x;
        else if (!strcmp(x->what, "BmmBackward0 (P v)"))
            pv = x;
        assert_string_not_equal(x->what, "ViewBackward0 (k, contiguous copy)");
    }
    assert_non_null(qk);
    assert_non_null(vv);
    assert_non_null(qv);
    assert_non_null(split);
    assert_non_null(pv);
    assert_true(vv < qv); /* in the engine's order */
    const uint64_t head = 2 * 64 * 768 * 4;
    assert_int_equal(qk->ngin, 2);
    assert_int_equal(qk->gin_b[0], head);
    assert_int_equal(qk->gin_b[1], head);
    /* BmmBackward0 makes mat2's gradient first: k's part, then q's */
    assert_int_equal(qk->gin_id[0], qk->gin_id[1] + ML_GIDS + 1);
    assert_int_equal(qv->ngout, 1);
    assert_int_equal(qv->gout_id[0], qk->gin_id[1]);
    /* P v: v's gradient, then the probabilities' (2 * 12 * 64 * 64 * 4 B),
     * v's freed by its view's copy */
    assert_int_equal(pv->ngin, 2);
    assert_int_equal(pv->gin_b[0], head);
    assert_int_equal(pv->gin_b[1], 2 * 12 * 64 * 64 * 4);
    assert_int_equal(vv->ngout, 1);
    assert_int_equal(vv->gout_id[0], pv->gin_id[0]);
    /* the split frees q's copy, k's part and v's copy */
    assert_int_equal(split->ngout, 3);
    assert_int_equal(split->gout_id[0], qv->gin_id[0]);
    assert_int_equal(split->gout_id[1], qk->gin_id[0]);
    assert_int_equal(split->gout_id[2], vv->gin_id[0]);
    assert_int_equal(split->gout_b[2], head);
    ml__chain_free(&c);
    ml_model_destroy(m);
}

/* The replay itself: every shipped model planned with the caching
 * allocator simulated, under each attention kernel and precision (autocast
 * too, whose blocks free their aggregates by size: each must find its
 * size), and again with every block checkpointed (the checkpoint's side
 * tensors and a checkpointed first layer's rotary tables freed at its
 * end), each without and with gradient accumulation (two micro-batches:
 * the first's output held to the second's loss), frees every tensor it
 * names as that tensor and every other by a size a live allocation has
 * (ml_summary.reserved_inexact 0). T5's encoder-decoder has no kernel or
 * precision variants here; it is planned at fp32, also with the gradients
 * kept and zeroed (zero_grad: zero), its side tensors (the position
 * biases, the encoder's output) and their gradients each freed as itself:
 * by size, the bias's gradient would find a layer's attention scores,
 * which are as large. */
static ml_status plan_setting(ml_model *m, const ml_config *cfg, void *arg)
{
    unsigned *plans = arg;
    for (int v = 0; v < (m->type == ML_MODEL_ENCDEC ? 8 : 4); v++) {
        const bool ckpt = v & 1;
        ml_config c = *cfg;
        c.device.allocator = ML_ALLOCATOR_CACHING;
        c.training.grad_accum = v & 2 ? 2 : 1;
        if (v & 4)
            c.training.zero_grad = ML_ZERO_GRAD_ZERO;
        if (ckpt && ml_parse_checkpoint("full", &c.training.checkpoint, NULL) != ML_OK)
            continue;
        ml_ledger *l = NULL;
        ml_status st = ml_ledger_evaluate(m, &c, false, &l, NULL);
        if (st != ML_OK) {
            if (ckpt)
                continue; /* a model that refuses checkpointing */
            return st;
        }
        const ml_summary *s = ml_ledger_summary(l);
        assert_true(s->has_reserved);
        if (s->reserved_inexact)
            fail_msg("%s, %s%s, %llu micro-batches%s: %llu frees by size", m->name,
                     ml_precision_name(c.training.precision), ckpt ? ", checkpointed" : "",
                     (unsigned long long)c.training.grad_accum, v & 4 ? ", grads zeroed" : "",
                     (unsigned long long)s->reserved_inexact);
        ml_ledger_destroy(l);
        (*plans)++;
    }
    return ML_OK;
}

static void exact(ml_model *m, void *arg)
{
    if (m->type == ML_MODEL_ENCDEC) {
        ml_config cfg = config_at(m, ML_PREC_FP32, 2, 64);
        if (plan_setting(m, &cfg, arg) != ML_OK)
            fail_msg("%s: does not plan", m->name);
        return;
    }
    each_setting(m, 3, plan_setting, arg);
}

static void test_shipped_frees_exact(void **state)
{
    (void)state;
    unsigned plans = 0;
    each_shipped_model(exact, &plans);
    print_message("%u plans simulated, every free exact\n", plans);
    assert_true(plans > 900);
}

/* Each allocation of `bytes` in events ev(first .. end), a pass: where it
 * is made and where freed, into made[] and freed[] (room for `room`); each
 * must be freed within the pass. Their count. */
static size_t made_and_freed(const ml_sim_event *ev, size_t first, size_t end, uint64_t bytes,
                             size_t *made, size_t *freed, size_t room)
{
    size_t k = 0;
    for (size_t i = first + 1; i < end; i++) {
        if (ev[i].action != ML_SIM_ALLOC || ev[i].bytes != bytes)
            continue;
        assert_true(k < room);
        made[k] = i;
        freed[k] = end;
        for (size_t j = i + 1; j < end && freed[k] == end; j++)
            if (ev[j].action == ML_SIM_FREE && ev[j].id == ev[i].id)
                freed[k] = j;
        assert_true(freed[k] < end);
        k++;
    }
    return k;
}

/* The model output a loop holds across micro-batches (logits: kept) is
 * freed as itself: the first micro-batch's logits once the second's loss is
 * computed (the loop rebinds its name), the second's after the step. Here
 * two GPT-2 layers of width 4 over a vocabulary of 37 at B 1, T 2: the
 * logits are 1 x 2 x 37 x 4 = 296 B. The loss's own tensors of that size
 * (the log-softmax output, the gradients) come and go inside each
 * micro-batch, so of the first iteration's 296 B allocations the one
 * freed last is the second micro-batch's logits, made after the first's
 * and before the first's free. By size, the first's free would release the
 * second's logits, the latest of that size, and the first's would be the
 * one left to the step. */
static void test_held_output_by_name(void **state)
{
    (void)state;
    ml_model *m = load_str("model:\n  type: decoder\n  layers: 2\n  hidden: 4\n  heads: 1\n"
                           "  ffn: 8\n  activation: gelu\n  norm: layernorm\n  vocab: 37\n"
                           "  position: learned\n  max_positions: 2\n  attention: eager\n"
                           "  dropout: 0\ntraining:\n  micro_batch: 1\n  seq_len: 2\n"
                           "  grad_accum: 2\n  logits: kept\n  optimizer: sgd\n"
                           "device:\n  memory: 8GiB\n  allocator: caching\n");
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, true);
    const ml_sim_event *ev = ml_ledger_sim_events(l);
    const size_t n = ml_ledger_sim_event_count(l);
    size_t first, end;
    first_iteration_pass(ev, n, &first, &end);
    size_t made[16], freed[16], last = 0;
    const size_t k = made_and_freed(ev, first, end, 296, made, freed, 16);
    for (size_t i = 1; i < k; i++)
        if (freed[i] > freed[last])
            last = i;
    assert_true(k >= 2);
    assert_true(last > 0);                 /* not the first micro-batch's */
    assert_true(made[last] < freed[0]);    /* made while the first's was held */
    assert_true(freed[0] < freed[last]);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The same for the key/value cache the output holds in training (HF's
 * use_cache, eager attention without checkpointing: one tensor per layer,
 * ml_cblock.out_cache_bytes, which goes with the output): Qwen2-0.5B at
 * B 1, T 200 under autocast with two micro-batches. Of the first
 * iteration's allocations of a layer's cache size, the first micro-batch's
 * (the first 24) are freed once the second's are all made, and before any
 * of the second's: by size, the first micro-batch's frees released the
 * second's caches, the latest of that size. */
static void test_held_cache_by_name(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("qwen2-0.5b");
    ml_config c = config_at(m, ML_PREC_AMP_BF16, 1, 200);
    c.training.grad_accum = 2;
    c.device.allocator = ML_ALLOCATOR_CACHING;
    ml_chain ch;
    ml_error e;
    assert_int_equal(ml__chain_build(m, &c, &ch, &e), ML_OK);
    uint64_t cache = 0;
    size_t layers = 0;
    for (size_t k = 0; k < ch.n; k++)
        if (ch.blocks[k].out_cache_bytes) {
            assert_true(!cache || cache == ch.blocks[k].out_cache_bytes);
            cache = ch.blocks[k].out_cache_bytes;
            layers++;
        }
    ml__chain_free(&ch);
    assert_int_equal(layers, 24);
    ml_ledger *l = eval(m, &c, true);
    const ml_sim_event *ev = ml_ledger_sim_events(l);
    const size_t n = ml_ledger_sim_event_count(l);
    size_t first, end;
    first_iteration_pass(ev, n, &first, &end);
    size_t made[48], freed[48];
    /* the cache's size is the caches' alone */
    assert_int_equal(made_and_freed(ev, first, end, cache, made, freed, 48), 48);
    for (size_t a = 0; a < 24; a++)
        for (size_t b = 24; b < 48; b++) {
            assert_true(freed[a] > made[b]);
            assert_true(freed[a] < freed[b]);
        }
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_shipped_gradients_by_identity),
        cmocka_unit_test(test_nanogpt_qk_parts),
        cmocka_unit_test(test_shipped_frees_exact),
        cmocka_unit_test(test_held_output_by_name),
        cmocka_unit_test(test_held_cache_by_name),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
