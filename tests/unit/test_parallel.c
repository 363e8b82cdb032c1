/* Tensor and sequence parallelism, one rank's plan (docs/parallel.md). The
 * figures are worked by hand from the layer's tensors; tests/torch/tp_twins.py
 * measures the same ranks over gloo. */
#include "harness.h"
#include "graph/graph.h"  /* the sequence-parallel pass on a hand-built graph */
#include "ledger/chain.h" /* ml__pp_in_flight */

/* The shape of tests/torch/models-tp/llama-tp.yaml: B 2, T 24, D 64, 8
 * heads of 8, 2 key/value heads, ffn 160, vocabulary 173, fp32. */
static const char *llama =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
    "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
    "  tied_embeddings: false\n  bias: false\n  attention: eager\n  dropout: 0\n"
    "training:\n  micro_batch: 2\n  seq_len: 24\n  optimizer: adamw\n";

/* One layer's saved bytes at tp ranks with a rank's Tn tokens in its
 * norms (T, or T / tp with sequence parallelism), each fp32:
 *   each RMSNorm: its input, x * rsqrt and its output (the projections'
 *     input), B Tn D each, and rsqrt, B Tn;
 *   attention over all T tokens with the rank's H / tp heads: q after the
 *     rotary, repeat_kv's copies of k and v and o_proj's input, B T (H/tp) dh
 *     each, and the softmax's output, B (H/tp) T T;
 *   the MLP's gate, silu, up and product outputs, B T (F/tp) each. */
static uint64_t layer_bytes(uint64_t tp, bool sp)
{
    const uint64_t B = 2, T = 24, D = 64, dh = 8, Hr = 8 / tp, Fr = 160 / tp;
    const uint64_t Tn = sp ? T / tp : T;
    const uint64_t norms = 2 * (3 * B * Tn * D + B * Tn);
    return 4 * (norms + 4 * B * T * Hr * dh + B * Hr * T * T + 4 * B * T * Fr);
}

static void test_rank_saved_bytes(void **state)
{
    (void)state;
    ml_model *m = load_str(llama);
    const struct {
        uint64_t tp;
        ml_seq_parallel sp;
        uint64_t want; /* the twin's figure, less PyTorch 1.13's own (tp_twins.py) */
    } cases[] = {{1, ML_SP_AUTO, 283008}, {2, ML_SP_OFF, 178560}, {2, ML_SP_AUTO, 141504}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        ml_config c = ml_model_config(m);
        c.training.tensor_parallel = cases[k].tp;
        c.training.sequence_parallel = cases[k].sp;
        ml_ledger *l = eval(m, &c, false);
        const bool sp = ml_training_sp(&c.training);
        assert_int_equal(layer_bytes(cases[k].tp, sp), cases[k].want);
        assert_int_equal(block_named(l, "block.0")->activations_saved, cases[k].want);
        assert_int_equal(block_named(l, "block.1")->activations_saved, cases[k].want);
        /* the embedding: the rotary's cos and sin, one row for the batch
         * (position ids cache_position[None]), 2 T dh x 4 = 1,536 B, and
         * above one rank the vocab-parallel lookup's shifted int64 ids and
         * bool mask over the whole sequence, B T (8 + 1) = 432 B (the
         * twin's figure on every rank, tp_twins.py's hand_embedding) */
        const uint64_t emb = 2 * 24 * 8 * 4 + (cases[k].tp > 1 ? 2 * 24 * 9 : 0);
        assert_int_equal(block_named(l, "embedding")->activations_saved, emb);
        /* the head: the final norm on the stream's Tn rows (input, x *
         * rsqrt, output B Tn D x 4 each, rsqrt B Tn x 4), the output
         * layer saving the norm's output; the loss above one rank:
         * Megatron's vocab-parallel cross-entropy, the fp32 softmax of the
         * rank's 87 rows in the logits' own storage, the bool mask and the
         * int64 masked targets, B T (4 x 87 + 9) = 17,136 B (tp_twins.py's
         * hand_head_loss); at tp 1, F.cross_entropy's log-softmax and
         * total_weight, B T 173 x 4 + 4 = 33,220 B */
        const uint64_t Tn = sp ? 24 / cases[k].tp : 24;
        assert_int_equal(block_named(l, "head")->activations_saved, 4 * (3 * 2 * Tn * 64 + 2 * Tn));
        assert_int_equal(block_named(l, "loss")->activations_saved,
                         cases[k].tp > 1 ? 2 * 24 * (4 * 87 + 9) : 2 * 24 * 173 * 4 + 4);
        /* the batch the eager loop holds: the ids and the targets, B T x 8
         * each, also where the vocab-parallel loss saves a masked clone of
         * the targets instead of them */
        assert_int_equal(ml_ledger_summary(l)->bytes_batch, 2 * 2 * 24 * 8);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

/* A rank's parameters at tp 2: q and o 64 x 32, k and v 64 x 8, gate, up
 * and down 64 x 80, two norms of 64; the vocabulary's 173 rows split 87 +
 * 86 (the fuller rank planned) in the embedding and the LM head, the final
 * norm whole. */
static void test_rank_parameters(void **state)
{
    (void)state;
    ml_model *m = load_str(llama);
    ml_config c = ml_model_config(m);
    c.training.tensor_parallel = 2;
    ml_ledger *l = eval(m, &c, false);
    const uint64_t layer = 2 * 64 * 32 + 2 * 64 * 8 + 3 * 64 * 80 + 2 * 64;
    assert_int_equal(layer, 20608);
    assert_int_equal(block_named(l, "block.0")->params, layer);
    assert_int_equal(block_named(l, "embedding")->params, 87 * 64);
    assert_int_equal(block_named(l, "head")->params, 87 * 64 + 64);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->params, 2 * layer + 2 * 87 * 64 + 64);
    /* fp32 AdamW: 16 bytes a parameter, a rank's share */
    assert_int_equal(s->bytes_params + s->bytes_grads + s->bytes_optimizer, 16 * s->params);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The collectives one rank sends per iteration at tp 2, S = B T D x 4
 * bytes = 12,288 and a ring's (tp - 1) / tp = 1/2: with sequence
 * parallelism 10 S a layer, 2 S the embedding, 3 S the head; without, 8 S,
 * 2 S and 2 S; and the loss's three all-reduces of B T fp32, 2 x 3 x 192 B. */
static void test_collectives(void **state)
{
    (void)state;
    ml_model *m = load_str(llama);
    ml_config c = ml_model_config(m);
    c.training.tensor_parallel = 2;
    const double S = 2 * 24 * 64 * 4, loss = 2 * 3 * 2 * 24 * 4;
    ml_ledger *l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->tp_comm_bytes, 0.5 * ((10 * 2 + 2 + 3) * S + loss),
                     1e-15);
    assert_rel_close(ml_ledger_summary(l)->tp_comm_bytes, 154176, 1e-15);
    ml_ledger_destroy(l);
    c.training.sequence_parallel = ML_SP_OFF;
    c.training.grad_accum = 3;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->tp_comm_bytes, 3 * 0.5 * ((8 * 2 + 2 + 2) * S + loss),
                     1e-15);
    ml_ledger_destroy(l);
    /* every layer recomputed: its forward's two all-reduces again */
    c.training.grad_accum = 1;
    c.training.checkpoint.kind = ML_CKPT_FULL;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->tp_comm_bytes,
                     0.5 * ((8 * 2 + 4 * 2 + 2 + 2) * S + loss), 1e-15);
    ml_ledger_destroy(l);
    c.training.tensor_parallel = 1;
    l = eval(m, &c, false);
    assert_rel_close(ml_ledger_summary(l)->tp_comm_bytes, 0, 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static ml_status evaluate_status(const ml_model *m, const ml_config *c, ml_error *e)
{
    ml_ledger *l = NULL;
    ml_status st = ml_ledger_evaluate(m, c, false, &l, e);
    ml_ledger_destroy(l);
    return st;
}

static void test_refusals(void **state)
{
    (void)state;
    ml_model *m = load_str(llama);
    ml_config c = ml_model_config(m);
    ml_error e;
    c.training.tensor_parallel = 3;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "does not divide"));
    assert_non_null(strstr(e.msg, "model.heads 8"));
    c.training.tensor_parallel = 4; /* 8 heads, but 2 key/value heads */
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "model.kv_heads 2"));
    c.training.tensor_parallel = 1;
    c.training.sequence_parallel = ML_SP_ON;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "needs parallel.tp above 1"));
    /* a length tp does not divide: the fullest rank's 13 of 25 tokens */
    c.training.tensor_parallel = 2;
    c.training.sequence_parallel = ML_SP_AUTO;
    c.training.seq_len = 25;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->activations_saved,
                     4 * (2 * (3 * 2 * 13 * 64 + 2 * 13) + 4 * 2 * 25 * 4 * 8 +
                          2 * 4 * 25 * 25 + 4 * 2 * 25 * 80));
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    m = load_preset("t5-base");
    c = ml_model_config(m);
    c.training.tensor_parallel = 2;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "decoder language models"));
    ml_model_destroy(m);
}

static void test_compact_layout(void **state)
{
    (void)state;
    ml_training t = ml_config_defaults().training;
    ml_error e;
    assert_int_equal(ml_parallel_parse("tp8.dp16", &t, &e), ML_OK);
    assert_int_equal(t.tensor_parallel, 8);
    assert_int_equal(t.data_parallel, 16);
    assert_int_equal(ml_parallel_parse("dp2.pp1.tp4.cp1", &t, &e), ML_OK);
    assert_int_equal(t.tensor_parallel, 4);
    assert_int_equal(t.data_parallel, 2);
    /* expert tensor parallelism: its own size, else tp's (Megatron's
     * default) */
    assert_int_equal(ml_training_etp(&t), 4);
    assert_int_equal(ml_parallel_parse("tp2.etp4", &t, &e), ML_OK);
    assert_int_equal(t.tensor_parallel, 2);
    assert_int_equal(ml_training_etp(&t), 4);
    assert_int_equal(ml_parallel_parse("etp0", &t, &e), ML_RANGE);
    t.expert_tensor_parallel = 0;
    t.tensor_parallel = 4;
    assert_int_equal(ml_training_ep(&t), 1);
    assert_int_equal(ml_parallel_parse("ep4.dp8", &t, &e), ML_OK); /* expert parallelism */
    assert_int_equal(t.expert_parallel, 4);
    assert_int_equal(ml_training_ep(&t), 4);
    assert_int_equal(t.tensor_parallel, 4); /* unchanged: not given */
    assert_int_equal(ml_training_cp(&t), 1);
    assert_int_equal(ml_parallel_parse("tp4.cp2", &t, &e), ML_OK); /* context parallelism */
    assert_int_equal(t.context_parallel, 2);
    assert_int_equal(ml_training_cp(&t), 2);
    assert_int_equal(ml_parallel_parse("pp4.vpp3.tp2", &t, &e), ML_OK);
    assert_int_equal(t.pipeline_parallel, 4);
    assert_int_equal(t.virtual_stages, 3);
    assert_int_equal(t.pp_schedule, ML_PP_INTERLEAVED);
    assert_int_equal(ml_parallel_parse("pp257", &t, &e), ML_RANGE);
    assert_int_equal(ml_pp_layers_parse("7,8,8,9", &t, &e), ML_OK);
    assert_int_equal(t.npp_layers, 4);
    assert_int_equal(t.pp_layers[3], 9);
    assert_int_equal(ml_pp_layers_parse("7,0", &t, &e), ML_USAGE);
    assert_int_equal(ml_pp_layers_parse("7,", &t, &e), ML_USAGE);
    assert_int_equal(ml_pp_layers_parse("", &t, &e), ML_USAGE);
    assert_int_equal(t.npp_layers, 4);
    assert_int_equal(ml_parallel_parse("tp2.tp4", &t, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "given twice"));
    assert_int_equal(ml_parallel_parse("tp0", &t, &e), ML_RANGE);
    assert_int_equal(ml_parallel_parse("tp2.", &t, &e), ML_USAGE);
    assert_int_equal(ml_parallel_parse("xp2", &t, &e), ML_USAGE);
    assert_int_equal(ml_parallel_parse("", &t, &e), ML_USAGE);
    assert_int_equal(ml_parallel_parse("tp99999999999", &t, &e), ML_RANGE);
    assert_int_equal(t.tensor_parallel, 2); /* pp4.vpp3.tp2's */
    ml_config c = ml_config_defaults();
    assert_int_equal(ml_config_set(&c, "parallel.tp", "2", &e), ML_OK);
    assert_int_equal(ml_config_set(&c, "parallel.sp", "off", &e), ML_OK);
    assert_int_equal(c.training.tensor_parallel, 2);
    assert_false(ml_training_sp(&c.training));
    assert_int_equal(ml_config_set(&c, "parallel.layout", "tp4.dp8", &e), ML_OK);
    assert_int_equal(c.training.data_parallel, 8);
    assert_int_equal(ml_config_set(&c, "parallel.ep", "2", &e), ML_OK);
    assert_int_equal(c.training.expert_parallel, 2);
    assert_int_equal(ml_config_set(&c, "parallel.etp", "2", &e), ML_OK);
    assert_int_equal(c.training.expert_tensor_parallel, 2);
    assert_int_equal(ml_config_set(&c, "parallel.etp", "0", &e), ML_RANGE);
}

static void expect_schema(const char *yaml, unsigned line, const char *part)
{
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(yaml, strlen(yaml), "p.yaml", &m, &e), ML_SCHEMA);
    assert_null(m);
    assert_int_equal(e.line, line);
    if (!strstr(e.msg, part))
        fail_msg("'%s' lacks '%s'", e.msg, part);
}

static void test_yaml_section(void **state)
{
    (void)state;
    char buf[2048];
    snprintf(buf, sizeof buf, "%sparallel:\n  tp: 2\n  sp: false\n  dp: 4\n  pp: 1\n", llama);
    ml_model *m = load_str(buf);
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.tensor_parallel, 2);
    assert_int_equal(c.training.data_parallel, 4);
    assert_false(ml_training_sp(&c.training));
    ml_model_destroy(m);
    snprintf(buf, sizeof buf, "%sparallel: tp2.dp2\n", llama);
    m = load_str(buf);
    c = ml_model_config(m);
    assert_true(ml_training_sp(&c.training));
    assert_int_equal(c.training.data_parallel, 2);
    ml_model_destroy(m);
    snprintf(buf, sizeof buf, "%sparallel:\n  tp: 2\n  etp: 4\n", llama);
    m = load_str(buf); /* planning it is refused: the model has no experts */
    assert_int_equal(ml_model_config(m).training.expert_tensor_parallel, 4);
    ml_model_destroy(m);
    snprintf(buf, sizeof buf, "%sparallel:\n  etp: 0\n", llama);
    ml_error err;
    assert_int_equal(ml_model_load_string(buf, strlen(buf), "p.yaml", &m, &err), ML_RANGE);
    assert_non_null(strstr(err.msg, "parallel.etp"));
    snprintf(buf, sizeof buf, "%sparallel:\n  ep: 4\n  dp: 8\n", llama);
    m = load_str(buf);
    assert_int_equal(ml_model_config(m).training.expert_parallel, 4);
    ml_model_destroy(m);
    snprintf(buf, sizeof buf, "%sparallel:\n  pp_schedule: 2f2b\n", llama);
    expect_schema(buf, 21, "parallel.pp_schedule");
    snprintf(buf, sizeof buf, "%sparallel:\n  pp_layers: [1, 0]\n", llama);
    expect_schema(buf, 21, "parallel.pp_layers[1]");
    snprintf(buf, sizeof buf,
             "%sparallel:\n  pp: 2\n  pp_schedule: gpipe\n  micro_batches: 8\n"
             "  pp_layers: [1, 1]\n",
             llama);
    m = load_str(buf);
    c = ml_model_config(m);
    assert_int_equal(c.training.pipeline_parallel, 2);
    assert_int_equal(c.training.pp_schedule, ML_PP_GPIPE);
    assert_int_equal(c.training.grad_accum, 8);
    assert_int_equal(c.training.npp_layers, 2);
    ml_model_destroy(m);
    snprintf(buf, sizeof buf, "%sparallel:\n  tq: 2\n", llama);
    expect_schema(buf, 21, "tp");
    snprintf(buf, sizeof buf, "%sparallel: tp2.etq8\n", llama);
    expect_schema(buf, 20, "etq8");
    /* the data-parallel size given twice, differently */
    snprintf(buf, sizeof buf, "%s  data_parallel: 4\nparallel: tp2.dp2\n", llama);
    expect_schema(buf, 21, "give the data-parallel size once");
    snprintf(buf, sizeof buf, "%sparallel:\n  dist_optimizer: false\n", llama);
    m = load_str(buf);
    ml_model_destroy(m);
}

/* Pipeline parallelism. The same model with 4 layers: one layer saves
 * 283,008 B (above, tp 1); the embedding the rotary's cos and sin, 2 T dh
 * x 4 = 2 x 24 x 8 x 4 = 1,536 B; the head its RMSNorm's input, x rsqrt and output (the LM
 * head's input), B T D x 4 = 12,288 B each, and rsqrt, B T x 4 = 192 B;
 * the loss the log-softmax output, B T V x 4 = 33,216 B, and its 4-byte
 * total weight. */
static const char *llama4 =
    "model:\n  type: decoder\n  layers: 4\n  hidden: 64\n  heads: 8\n  kv_heads: 2\n"
    "  ffn: 160\n  activation: swiglu\n  norm: rmsnorm\n  vocab: 173\n  position: rope\n"
    "  tied_embeddings: false\n  bias: false\n  attention: eager\n  dropout: 0\n"
    "training:\n  micro_batch: 2\n  seq_len: 24\n  optimizer: adamw\n"
    "device:\n  memory: 1GiB\n  allocator: none\n";

/* c over pp stages of schedule s, micro micro-batches; staged: the model's
 * own config so */
static ml_ledger *staged_from(const ml_model *m, ml_config c, uint64_t pp, ml_pp_schedule s,
                              uint64_t micro)
{
    c.training.pipeline_parallel = pp;
    c.training.pp_schedule = s;
    c.training.grad_accum = micro;
    return eval(m, &c, false);
}

static ml_ledger *staged(const ml_model *m, uint64_t pp, ml_pp_schedule s, uint64_t micro)
{
    return staged_from(m, ml_model_config(m), pp, s, micro);
}

static void test_stage_inventory(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_ledger *l = staged(m, 2, ML_PP_1F1B, 4);
    const uint64_t layer = 283008, head = 3 * 12288 + 192, loss = 33216 + 4;
    assert_int_equal(ml_ledger_rank_count(l), 2);
    const ml_rank_info *r0 = ml_ledger_rank(l, 0), *r1 = ml_ledger_rank(l, 1);
    assert_int_equal(r0->activations_saved, 1536 + 2 * layer);
    /* stage 1 makes the rotary tables itself: cos and sin, 2 T dh x 4 */
    assert_int_equal(r1->activations_saved, 2 * 24 * 8 * 4 + 2 * layer + head + loss);
    assert_int_equal(r0->first_layer, 0);
    assert_int_equal(r1->first_layer, 2);
    assert_true(r0->embedding && !r0->head && r1->head && !r1->embedding);
    /* 1F1B: stage r holds min(m, p - r) micro-batches */
    assert_true(r0->in_flight == 2 && r1->in_flight == 1);
    /* each stage's parameters: the embedding 173 x 64 and two layers of
     * 41,088; two layers, the final norm and the LM head 173 x 64 */
    assert_int_equal(r0->params, 173 * 64 + 2 * 41088);
    assert_int_equal(r1->params, 2 * 41088 + 64 + 173 * 64);
    /* the p2p volume: 4 micro-batches of the B T D fp32 activation, one way */
    assert_rel_close(r0->p2p_bytes, 4 * 12288.0, 1e-15);
    assert_rel_close(r1->p2p_bytes, 4 * 12288.0, 1e-15);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* A stage before the last holds the gradient it receives (schedules.py's
 * output_tensor_grad), so its last layer's first residual sum into it is a
 * new tensor, and the received one stays to the micro-batch's end. At 48
 * tokens (B*T*D*4 = 24,576 B, B*H*T^2*4 = 147,456 B) stage 0's peak is in
 * the first backward's softmax backward, after that sum: the resident
 * 1,118,992 (3 x 372,992 + 16), the gradients made before it 139,520 (down,
 * up, gate 3 x 40,960, ln2's 256, o_proj's 16,384), F1 held 1,282,560 with
 * its tokens 768, F0 less block.1's tensors freed by then 913,536 with its
 * tokens 768, the received gradient, the sum and v's gradient 3 x 24,576,
 * the probabilities' gradient and the softmax's 2 x 147,456 and its GPU
 * temporary 147,456: 3,972,240 B, which PyTorch measures (tests/torch/
 * pp_twins.py, llama-pp-t48.yaml; without the held gradient 24,576 B
 * under). At 24 tokens the peak comes before that sum (the SwiGLU mul's
 * backward, 2,369,552: the oracle's table) and does not move. */
/* llama4 as the pipeline twin runs it: foreach AdamW, the logits released
 * (Megatron computes the loss inside the model). */
static ml_model *llama4_twin(ml_config *c)
{
    ml_model *m = load_str(llama4);
    *c = ml_model_config(m);
    c->training.optimizer_impl = ML_IMPL_FOREACH;
    c->training.logits = ML_LOGITS_RELEASED;
    return m;
}

static void test_stage_holds_received_gradient(void **state)
{
    (void)state;
    ml_config c;
    ml_model *m = llama4_twin(&c);
    ml_ledger *l = staged_from(m, c, 2, ML_PP_1F1B, 2);
    assert_int_equal(ml_ledger_rank(l, 0)->peak, 2369552);
    ml_ledger_destroy(l);
    c.training.seq_len = 48;
    l = staged_from(m, c, 2, ML_PP_1F1B, 2);
    assert_int_equal(ml_ledger_rank(l, 0)->peak, 1118992 + 139520 + 1282560 + 768 + 913536 +
                                                     768 + 3 * 24576 + 3 * 147456);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* 1F1B's steady state holds the gradient a stage before the last received
 * for the micro-batch before through the next forward (schedules.py's
 * output_tensor_grad, rebound by the next receive). Stage 0 of llama4 in
 * two stages, forward maxima (fp32): at m 2 it never runs a forward after
 * a backward, and its largest forward is the step's first, beside the
 * other held micro-batch H; at m 8 a steady forward runs beside H too, and
 * also beside every gradient, P = (173 x 64 + 2 x 41,088) x 4 = 372,992,
 * and that received gradient, B T D x 4 = 2 x 24 x 64 x 4 = 12,288 (the
 * pipeline twin, pp_twins.py, measures both maxima to the byte). */
static void test_steady_forward_holds_received_gradient(void **state)
{
    (void)state;
    ml_config c;
    ml_model *m = llama4_twin(&c);
    c.device.allocator = ML_ALLOCATOR_NONE;
    ml_ledger *l2 = staged_from(m, c, 2, ML_PP_1F1B, 2);
    ml_ledger *l8 = staged_from(m, c, 2, ML_PP_1F1B, 8);
    const ml_summary *s2 = ml_ledger_summary(l2), *s8 = ml_ledger_summary(l8);
    assert_int_equal(ml_ledger_worst_rank(l2), 0);
    assert_int_equal(ml_ledger_worst_rank(l8), 0);
    const uint64_t P = (173 * 64 + 2 * 41088) * 4, BTD = 2 * 24 * 64 * 4;
    assert_int_equal(P, 372992);
    assert_int_equal(s8->phase_steady[ML_PHASE_FORWARD].peak -
                         s2->phase_steady[ML_PHASE_FORWARD].peak,
                     P + BTD);
    ml_ledger_destroy(l2);
    ml_ledger_destroy(l8);
    ml_model_destroy(m);
}

/* DeepSeek-V2-Lite (models/hf/deepseek-v2-lite) in stages of 13 and 14
 * layers. Its rotary table is one complex64 freqs_cis of (1, T, rope / 2):
 * T x 32 x 8 B (qk_rope_head_dim 64), 16,384 B at T = 64, which the
 * embedding saves alone (the token ids are the batch's). The second stage
 * makes the table itself, so it saves what its blocks save in the whole
 * model's plan and 16,384 B more. */
static void test_stage_complex_table(void **state)
{
    (void)state;
    ml_model *m = load_hf_config("deepseek-v2-lite");
    ml_config c = ml_model_config(m);
    c.training.seq_len = 64;
    c.device.allocator = ML_ALLOCATOR_NONE;
    ml_ledger *whole = eval(m, &c, false);
    const uint64_t table = 64 * 32 * 8;
    assert_int_equal(block_named(whole, "embedding")->activations_saved, table);
    uint64_t rest = block_named(whole, "head")->activations_saved +
                    block_named(whole, "loss")->activations_saved;
    for (int k = 13; k < 27; k++) {
        char name[16];
        snprintf(name, sizeof name, "block.%d", k);
        rest += block_named(whole, name)->activations_saved;
    }
    c.training.pipeline_parallel = 2;
    c.training.grad_accum = 4;
    assert_int_equal(ml_pp_layers_parse("13,14", &c.training, NULL), ML_OK);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_rank(l, 1)->activations_saved, table + rest);
    ml_ledger_destroy(l);
    ml_ledger_destroy(whole);
    ml_model_destroy(m);
}

/* The in-flight micro-batches at a stage's first backward of the step and
 * at a later one: 1F1B keeps min(m, p - r) through its steady state, a
 * stage that never leaves its warmup (m <= p - r) one fewer later; GPipe
 * all m, then m - 1. In the steady state the count, and so the peak, does
 * not depend on m. */
static void test_in_flight_counts(void **state)
{
    (void)state;
    ml_training t = ml_config_defaults().training;
    t.pipeline_parallel = 4;
    const struct {
        ml_pp_schedule s;
        uint64_t m;
        double first[4], later[4];
    } cases[] = {{ML_PP_1F1B, 8, {4, 3, 2, 1}, {4, 3, 2, 1}},
                 {ML_PP_1F1B, 2, {2, 2, 2, 1}, {1, 1, 1, 1}},
                 {ML_PP_1F1B, 3, {3, 3, 2, 1}, {2, 2, 2, 1}},
                 {ML_PP_GPIPE, 8, {8, 8, 8, 8}, {7, 7, 7, 7}}};
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        t.pp_schedule = cases[k].s;
        t.grad_accum = cases[k].m;
        for (uint64_t r = 0; r < 4; r++) {
            assert_true(ml__pp_in_flight(&t, r) == cases[k].first[r]);
            assert_true(ml__pp_in_flight_later(&t, r) == cases[k].later[r]);
        }
    }
    ml_model *m = load_str(llama4);
    ml_ledger *a = staged(m, 4, ML_PP_1F1B, 8), *b = staged(m, 4, ML_PP_1F1B, 16);
    for (size_t r = 0; r < 4; r++)
        assert_int_equal(ml_ledger_rank(a, r)->peak, ml_ledger_rank(b, r)->peak);
    /* GPipe's fullest stage: the last (its head and loss) */
    ml_ledger *g = staged(m, 4, ML_PP_GPIPE, 8);
    assert_int_equal(ml_ledger_worst_rank(g), 3);
    for (size_t r = 0; r < 4; r++)
        assert_true(ml_ledger_rank(g, r)->peak > ml_ledger_rank(b, r)->peak);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
    ml_ledger_destroy(g);
    ml_model_destroy(m);
}

/* The pipeline's step from its stages' times per micro-batch t_r: with
 * 1F1B, (m - 1) max t + sum t, then the slowest optimizer step; the
 * bubble is the stages' idle share of it, averaged. Without a peak there
 * is no time, and no pipeline step. */
static void test_pipeline_step(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = ml_model_config(m);
    ml_error e;
    assert_int_equal(ml_device_preset_apply("h100-sxm", &c.device, &e), ML_OK);
    c.training.pipeline_parallel = 2;
    c.training.grad_accum = 4;
    ml_ledger *l = eval(m, &c, false);
    const ml_rank_info *r0 = ml_ledger_rank(l, 0), *r1 = ml_ledger_rank(l, 1);
    const ml_summary *s = ml_ledger_summary(l);
    assert_true(r0->micro_s > 0 && r1->micro_s > 0);
    const double max = r0->micro_s > r1->micro_s ? r0->micro_s : r1->micro_s;
    const double pipe = 3 * max + r0->micro_s + r1->micro_s;
    assert_rel_close(s->pipeline_step_s, pipe + s->time.by_phase[ML_TPHASE_STEP], 1e-12);
    /* the stages' idle share, averaged: 1 - m sum t / (p pipe) */
    assert_rel_close(s->pipeline_bubble, 1 - 4 * (r0->micro_s + r1->micro_s) / (2 * pipe), 1e-12);
    /* the step time compare and fit give is the pipeline's, not the
     * fullest stage's own work (step_time_s) */
    assert_true(ml_summary_step_time(s) == s->pipeline_step_s);
    assert_true(s->pipeline_step_s > s->step_time_s);
    ml_compare_row rows[16];
    size_t nrows = 0;
    assert_int_equal(ml_compare(m, &c, rows, &nrows, &e), ML_OK);
    assert_true(nrows > 0);
    assert_int_equal(rows[0].checkpoint.kind, ML_CKPT_NONE); /* the plan's own policy */
    assert_rel_close(rows[0].step_time_s, s->pipeline_step_s, 1e-12);
    ml_ledger_destroy(l);
    /* colocate's curve of the stage repeats with the pipeline's step: past
     * its own work the stage holds its last event's level (not the start of
     * its next iteration, which a period of its own work would give) */
    l = eval(m, &c, true);
    s = ml_ledger_summary(l);
    const ml_event *ev = ml_ledger_events(l);
    const size_t ne = ml_ledger_event_count(l);
    assert_true(ne > 0 && ev[ne - 1].t_s <= s->step_time_s);
    uint64_t last = s->runtime_reserve + s->fragmentation;
    for (int k = 0; k < ML_CAT_COUNT; k++)
        last += ev[ne - 1].live[k];
    const double tail = (s->step_time_s + s->pipeline_step_s) / 2;
    assert_int_equal(ml_colocate_level(l, tail), last);
    assert_int_not_equal(ml_colocate_level(l, tail - s->step_time_s), last);
    ml_ledger_destroy(l);
    l = staged(m, 2, ML_PP_1F1B, 4); /* no device: untimed */
    assert_true(ml_ledger_summary(l)->pipeline_step_s < 0);
    ml_ledger_destroy(l);
    c.training.pipeline_parallel = 1;
    l = eval(m, &c, false);
    assert_true(ml_ledger_summary(l)->pipeline_step_s < 0);
    assert_int_equal(ml_ledger_rank_count(l), 0);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Korthikanti et al. 2022, section 4.2.3: with the interleaved schedule
 * the first stage holds L (1 + (p - 1) / (p v)) layers' activations: at
 * p 8, v 3, L 96 (GPT-3 175B), 12 layers a stage in 31 / 3 micro-batches
 * (Megatron's warmup, 2 (p - 1) + (v - 1) p chunks, and one more). */
static void test_interleaved_in_flight(void **state)
{
    (void)state;
    ml_training t = ml_config_defaults().training;
    t.pipeline_parallel = 8;
    t.virtual_stages = 3;
    t.pp_schedule = ML_PP_INTERLEAVED;
    t.grad_accum = 64;
    assert_rel_close(ml__pp_in_flight(&t, 0) * 96 / 8, 96 * (1 + 7.0 / 24), 1e-15);
    assert_rel_close(ml__pp_in_flight(&t, 7), (2.0 * 8 + 1) / 3, 1e-15);
    t.grad_accum = 2; /* capped at the step's m v chunks */
    assert_rel_close(ml__pp_in_flight(&t, 0), 2, 1e-15);
}

/* With virtual stages every model chunk is a model of its own (Megatron's
 * GPTModel chunks): each that is not the model's first makes its rotary
 * tables (2 T dh x 4 = 1,536 B a micro-batch) and holds its inv_freq
 * buffer (dh / 2 x 4 = 16 B). llama4 over 2 stages of 2 one-layer chunks:
 * stage 0 is the embedding (with the model's tables), layer 0 and, in its
 * chunk 1, layer 2 with tables of its own; stage 1 layers 1 and 3, each
 * chunk with its tables, then the head and the loss (the values the
 * interleaved twin measures: tests/torch/vpp_twin.py). */
static void test_interleaved_chunk_tables(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = ml_model_config(m);
    c.training.virtual_stages = 2;
    ml_ledger *l = staged_from(m, c, 2, ML_PP_INTERLEAVED, 4);
    const uint64_t layer = 283008, head = 3 * 12288 + 192, loss = 33216 + 4, tables = 1536;
    const ml_rank_info *r0 = ml_ledger_rank(l, 0), *r1 = ml_ledger_rank(l, 1);
    assert_int_equal(r0->activations_saved, tables + layer + tables + layer);
    assert_int_equal(r1->activations_saved, 2 * (tables + layer) + head + loss);
    /* each stage's buffers: two chunks' inv_freq */
    assert_int_equal(ml_ledger_summary(l)->bytes_buffers, 2 * 16);
    ml_ledger_destroy(l);
    /* without virtual stages a stage is one model: one inv_freq */
    l = staged(m, 2, ML_PP_1F1B, 4);
    assert_int_equal(ml_ledger_summary(l)->bytes_buffers, 16);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static void test_stage_refusals(void **state)
{
    (void)state;
    ml_model *m = load_str(llama4);
    ml_config c = ml_model_config(m);
    ml_error e;
    c.training.pipeline_parallel = 3; /* 4 layers */
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "parallel.pp_layers"));
    c.training.npp_layers = 3;
    c.training.pp_layers[0] = 1, c.training.pp_layers[1] = 2, c.training.pp_layers[2] = 1;
    assert_int_equal(evaluate_status(m, &c, &e), ML_OK);
    c.training.pp_layers[2] = 2;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "the stages hold 5 layers"));
    c.training.npp_layers = 0;
    c.training.pipeline_parallel = 2;
    c.training.virtual_stages = 2; /* without the interleaved schedule */
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    c.training.pp_schedule = ML_PP_INTERLEAVED;
    c.training.grad_accum = 3; /* not a multiple of pp */
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    c.training.grad_accum = 4;
    assert_int_equal(evaluate_status(m, &c, &e), ML_OK);
    c.training.virtual_stages = 1;
    c.training.pp_schedule = ML_PP_1F1B;
    c.training.checkpoint.kind = ML_CKPT_LIST;
    c.training.checkpoint.count = 1;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    c.training.checkpoint.kind = ML_CKPT_NONE;
    c.training.eval_batch = 2;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    c.training.eval_batch = 0;
    c.training.pipeline_parallel = 1;
    c.training.virtual_stages = 2;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "needs parallel.pp above 1"));
    ml_model_destroy(m);
}

/* Tied embeddings over two stages (Megatron's shared embedding): GPT-2
 * small's first stage holds the table (50,257 x 768 = 38,597,376), the
 * positions (1,024 x 768) and six layers of 7,087,872; the last the other
 * six, the final LayerNorm (1,536) and its own copy of the table, each with
 * its gradient (fp32: 4 bytes a parameter). */
static void test_tied_stages(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_config c = ml_model_config(m);
    c.training.pipeline_parallel = 2;
    c.training.grad_accum = 4;
    c.device.present = false;
    ml_ledger *l = eval(m, &c, false);
    const uint64_t table = 50257ull * 768, layer = 7087872;
    assert_int_equal(ml_ledger_rank(l, 0)->params, table + 1024 * 768 + 6 * layer);
    assert_int_equal(ml_ledger_rank(l, 1)->params, 6 * layer + 1536 + table);
    assert_int_equal(ml_ledger_worst_rank(l), 0);
    assert_int_equal(ml_ledger_summary(l)->bytes_grads, 4 * ml_ledger_rank(l, 0)->params);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Megatron-core's GPT layer (training.engine: megatron) at Korthikanti et
 * al.'s 22B shape (h 6144, a 64, s 2048, b 4, t 8): their section 4's
 * sbh (10 + 24/t + 5as/(ht)) bytes a layer with tensor parallelism alone,
 * sbh 34/t with sequence parallelism and selective recompute, plus the two
 * LayerNorms' fp32 mean and rstd, 16 bytes a token (over t with SP), which
 * the formula leaves out. */
static const char *gpt22 =
    "model:\n  type: decoder\n  layers: 2\n  hidden: 6144\n  heads: 64\n  ffn: 24576\n"
    "  activation: gelu\n  norm: layernorm\n  vocab: 51200\n  max_positions: 2048\n"
    "  position: learned\n  tied_embeddings: false\n  bias: true\n  attention: eager\n"
    "  dropout: 0.1\ntraining:\n  micro_batch: 4\n  seq_len: 2048\n"
    "  precision: bf16-master\n  optimizer: adamw\n  engine: megatron\n"
    "parallel:\n  tp: 8\n";

static void test_megatron_layer(void **state)
{
    (void)state;
    ml_model *m = load_str(gpt22);
    ml_config c = ml_model_config(m);
    assert_int_equal(c.training.engine, ML_ENGINE_MEGATRON);
    assert_int_equal(c.training.zero_grad, ML_ZERO_GRAD_ZERO); /* its buffer stays */
    const uint64_t s = 2048, b = 4, h = 6144, a = 64, t = 8, sbh = s * b * h;
    c.training.sequence_parallel = ML_SP_OFF;
    ml_ledger *l = eval(m, &c, false);
    /* sbh (10 + 24/8 + 5 * 64 * 2048 / (6144 * 8)) = sbh * 79/3 */
    assert_int_equal(block_named(l, "block.0")->activations_saved,
                     sbh * 10 + sbh * 24 / t + 5 * a * s * s * b / t + 16 * s * b);
    /* fp32 main gradients: 4 bytes a parameter */
    assert_int_equal(ml_ledger_summary(l)->bytes_grads, 4 * ml_ledger_summary(l)->params);
    /* the vocab-parallel cross-entropy keeps the fp32 softmax of the rank's
     * 51,200 / 8 = 6,400 vocabulary rows for each of the s b tokens, the
     * target mask (1 byte a token) and the masked targets (8 bytes) */
    assert_int_equal(block_named(l, "loss")->activations_saved,
                     s * b * 6400 * 4 + s * b + s * b * 8);
    /* and the loop drops the logits once the loss is computed (GPTModel's
     * forward returns the loss) */
    assert_int_equal(c.training.logits, ML_LOGITS_RELEASED);
    ml_ledger_destroy(l);
    c.training.sequence_parallel = ML_SP_AUTO;
    c.training.checkpoint.kind = ML_CKPT_SELECTIVE;
    l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->activations_saved, sbh * 34 / t + 16 * s * b / t);
    ml_ledger_destroy(l);
    /* eager PyTorch's layer keeps nanoGPT's (T, T) bool causal mask too */
    c.training.engine = ML_ENGINE_EAGER;
    c.training.sequence_parallel = ML_SP_OFF;
    c.training.checkpoint.kind = ML_CKPT_NONE;
    l = eval(m, &c, false);
    assert_int_equal(block_named(l, "block.0")->activations_saved,
                     sbh * 10 + sbh * 24 / t + 5 * a * s * s * b / t + 16 * s * b + s * s);
    ml_ledger_destroy(l);
    ml_error e;
    c.training.engine = ML_ENGINE_MEGATRON;
    c.training.precision = ML_PREC_AMP_BF16;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "bf16-master"));
    c.training.precision = ML_PREC_BF16_MASTER;
    c.training.zero_grad = ML_ZERO_GRAD_SET_TO_NONE;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    ml_model_destroy(m);
    m = load_str(llama); /* RMSNorm and SwiGLU: not Megatron's GPT layout */
    c = ml_model_config(m);
    c.training.engine = ML_ENGINE_MEGATRON;
    c.training.precision = ML_PREC_BF16_MASTER;
    c.training.zero_grad = ML_ZERO_GRAD_ZERO;
    assert_int_equal(evaluate_status(m, &c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "GPT layer"));
    ml_model_destroy(m);
}

/* Sequence parallelism on a two-op graph, B 1, T 4, D 2, DQ 6, fp32: a
 * column-parallel op reads the sharded input x (B T D) and writes y
 * (B T DQ, whole over the tokens); a row-parallel op reads y and writes z
 * (B T D), which it first writes whole (32 B), reduce-scatters into its
 * shard (16 B at 2 ranks), then frees. Under no_grad: y 96 B, then 32 B
 * and the 16 B shard beside it, y freed last: a peak of 144 B. */
static void test_sp_graph(void **state)
{
    (void)state;
    ml_graph g;
    ml__graph_init(&g);
    uint16_t x = ml__graph_tensor(&g, "x", MLG_COMPUTE, MLG_INPUT, 3, MLG_B, MLG_T, MLG_D);
    uint16_t wc = ml__graph_tensor(&g, "wc", MLG_PARAM, MLG_PARAMETER, 2, MLG_DQ, MLG_D);
    uint16_t wr = ml__graph_tensor(&g, "wr", MLG_PARAM, MLG_PARAMETER, 2, MLG_D, MLG_DQ);
    uint16_t y = ml__graph_tensor(&g, "y", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_DQ);
    uint16_t z = ml__graph_tensor(&g, "z", MLG_COMPUTE, MLG_ACT, 3, MLG_B, MLG_T, MLG_D);
    mlg_op *o = ml__graph_step(&g, MLG_OP_MATMUL, "column", x, y, "MmBackward0");
    ml__op_param(o, wc);
    o = ml__graph_step(&g, MLG_OP_MATMUL, "row", y, z, "MmBackward0");
    ml__op_param(o, wr);
    ml__op_free(o, y);
    ml__graph_shard_sequence(&g, 2);
    assert_true(g.t[x].seq && !g.t[y].seq && g.t[z].seq);
    assert_int_equal(g.op[0].sp_site, MLG_SP_COLUMN);
    assert_int_equal(g.op[1].sp_site, MLG_SP_ROW);
    ml_graph_sizes z_ = {0};
    z_.dim[MLG_B] = 1, z_.dim[MLG_T] = 4, z_.dim[MLG_D] = 2, z_.dim[MLG_DQ] = 6;
    z_.seq_div = 2;
    for (unsigned i = 0; i < MLG_NDTYPES; i++)
        z_.bytes[i] = 4;
    uint64_t tb[MLG_MAX_TENSORS];
    ml__graph_bytes(&g, &z_, tb);
    assert_int_equal(tb[x], 16);
    assert_int_equal(tb[y], 96);
    assert_int_equal(tb[z], 16);
    ml_graph_live l;
    ml__graph_forward(&g, tb, false, false, &l);
    assert_false(l.bad);
    assert_int_equal(l.peak, 96 + 32 + 16);
    /* the same as allocations and frees (what the allocator simulation
     * replays for it without grad): y; the whole 32 B, then the shard z
     * beside it, the whole freed after it (Megatron allocates the reduce-
     * scatter's output while its input lives); then y */
    mlg_step st[8];
    assert_int_equal(ml__graph_forward_steps(&g, tb, false, false, st, 8, &l), 5);
    const struct {
        uint64_t bytes;
        uint16_t tok;
        bool alloc;
    } want[] = {{96, y, true}, {32, MLG_STEP_WHOLE, true}, {16, z, true},
                {32, MLG_STEP_WHOLE, false}, {96, y, false}};
    for (unsigned i = 0; i < 5; i++) {
        assert_int_equal(st[i].bytes, want[i].bytes);
        assert_int_equal(st[i].tok, want[i].tok);
        assert_int_equal(st[i].alloc, want[i].alloc);
    }
}

/* With sequence parallelism the plan keeps Megatron's gather buffer, the
 * whole B T D stream (2 x 24 x 64 x 4 B), from the first layer on. */
static void test_sp_buffer(void **state)
{
    (void)state;
    ml_model *m = load_str(llama);
    ml_config c = ml_model_config(m);
    c.training.tensor_parallel = 2;
    c.training.sequence_parallel = ML_SP_OFF;
    ml_ledger *a = eval(m, &c, false);
    c.training.sequence_parallel = ML_SP_ON;
    ml_ledger *b = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(b)->bytes_buffers - ml_ledger_summary(a)->bytes_buffers,
                     2 * 24 * 64 * 4);
    ml_ledger_destroy(a);
    ml_ledger_destroy(b);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rank_saved_bytes), cmocka_unit_test(test_rank_parameters),
        cmocka_unit_test(test_collectives),      cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_compact_layout),   cmocka_unit_test(test_yaml_section),
        cmocka_unit_test(test_stage_inventory),
        cmocka_unit_test(test_stage_holds_received_gradient),  cmocka_unit_test(test_in_flight_counts),
        cmocka_unit_test(test_interleaved_in_flight),
        cmocka_unit_test(test_interleaved_chunk_tables), cmocka_unit_test(test_stage_refusals),
        cmocka_unit_test(test_megatron_layer),   cmocka_unit_test(test_sp_graph),
        cmocka_unit_test(test_sp_buffer),        cmocka_unit_test(test_pipeline_step),
        cmocka_unit_test(test_stage_complex_table),
        cmocka_unit_test(test_steady_forward_holds_received_gradient),
        cmocka_unit_test(test_tied_stages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
