/* Llava (a multimodal model): llava-hf/llava-1.5-7b-hf's published parameter
 * count and LlavaConfig's defaults recomputed by hand, the import's
 * refusals, and a tiny model's per-block saved bytes, unused vision layer
 * and optimizer states (docs/inventory.md, "Llava"). Every expected value is
 * derived in the comments, not taken from the program. */
#include "harness.h"
#include "ledger/chain.h"
#include "ledger/reserved.h"
#include "model/model_internal.h"

/* A CLIP vision tower (CLIPVisionModel): class embedding D, patch conv
 * C*P*P x D without bias, positions (G^2 + 1) x D, pre_layrnorm 2D; each
 * layer q, k, v, out (D^2 + D each), fc1 (D F + F), fc2 (F D + D), two
 * LayerNorms 4D; post_layernorm 2D. */
static uint64_t clip_params(uint64_t L, uint64_t D, uint64_t F, uint64_t S, uint64_t P)
{
    uint64_t G = S / P;
    uint64_t emb = D + 3 * P * P * D + (G * G + 1) * D + 2 * D;
    uint64_t layer = 4 * (D * D + D) + (D * F + F) + (F * D + D) + 4 * D;
    return emb + L * layer + 2 * D;
}

/* A Llama (LlamaForCausalLM, untied, no biases): V x D twice (embedding,
 * lm_head), per layer 4 D^2 (q, k, v, o with as many kv heads) + 3 D F + 2D,
 * the final norm D. */
static uint64_t llama_params(uint64_t V, uint64_t D, uint64_t F, uint64_t L)
{
    return 2 * V * D + L * (4 * D * D + 3 * D * F + 2 * D) + D;
}

/* llava-1.5-7b-hf: CLIP ViT-L/14 at 336 (24 layers, D 1024, F 4096):
 * 1,193,984 + 2,048 + 24 x 12,596,224 + 2,048 = 303,507,456; the projector
 * 1024 x 4096 + 4096 + 4096^2 + 4096 = 20,979,712; Vicuna-7B with vocab
 * 32064: 6,738,939,904; in all 7,063,427,072 (the published count). */
static void test_llava_count(void **state)
{
    (void)state;
    uint64_t vis = clip_params(24, 1024, 4096, 336, 14);
    uint64_t proj = 1024 * 4096 + 4096 + 4096 * 4096 + 4096;
    uint64_t text = llama_params(32064, 4096, 11008, 32);
    assert_int_equal(vis, 303507456ull);
    assert_int_equal(proj, 20979712ull);
    assert_int_equal(vis + proj + text, 7063427072ull);
    ml_model *m = load_hf_config("llava-1.5-7b");
    assert_int_equal(ml_model_image_tokens(m), 576); /* (336 / 14)^2, the class token dropped */
    assert_int_equal(m->vision.used, 23);            /* hidden_states[-2] of 25 */
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 600;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->params, 7063427072ull);
    /* the last layer and post_layernorm get no gradient, so no AdamW state:
     * (P - 12,596,224 - 2,048) x 2 states x 4 B */
    assert_int_equal(s->bytes_optimizer, (7063427072ull - 12598272ull) * 8);
    assert_int_equal(s->bytes_grads, (7063427072ull - 12598272ull) * 4);
    assert_true(block_named(l, "vision.layer.23")->unused_output);
    assert_false(block_named(l, "vision.layer.22")->unused_output);
    assert_int_equal(block_named(l, "projector")->params, 20979712ull);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static ml_status load_text(const char *text, ml_model **m, ml_error *e)
{
    return ml_model_load_hf_string(text, strlen(text), "config.json", m, e);
}

/* {"model_type": "llava"}: LlavaConfig's defaults, the CLIP-L/336 tower and
 * LlamaConfig's text model (vocab 32000, D 4096, F 11008, 32 layers):
 * 303,507,456 + 20,979,712 + 6,738,415,616 = 7,062,902,784. A vision_config
 * of CLIPVisionConfig's defaults (D 768, F 3072, 12 layers, 224 / 32) with
 * the text defaults: 87,456,000 + (768 x 4096 + 4096 + 4096^2 + 4096) +
 * 6,738,415,616. */
static void test_llava_defaults(void **state)
{
    (void)state;
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(load_text("{\"model_type\": \"llava\"}", &m, &e), ML_OK);
    assert_int_equal(m->vision.layers, 24);
    assert_int_equal(m->embed.vocab, 32000);
    assert_int_equal(m->mlp.ffn, 11008);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 600;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params, 7062902784ull);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    assert_int_equal(clip_params(12, 768, 3072, 224, 32), 87456000ull);
    assert_int_equal(load_text("{\"model_type\": \"llava\", \"vision_config\": "
                               "{\"model_type\": \"clip_vision_model\"}}",
                               &m, &e),
                     ML_OK);
    assert_int_equal(ml_model_image_tokens(m), 49); /* (224 / 32)^2 */
    c = ml_model_config(m);
    c.training.micro_batch = 1;
    c.training.seq_len = 64;
    l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->params,
                     87456000ull + 768 * 4096 + 4096 + 4096 * 4096 + 4096 + 6738415616ull);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

static void test_llava_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *text, *msg;
    } refused[] = {
        {"{\"model_type\": \"llava\",\n \"vision_feature_layer\": [-2, -5]}",
         "several layers' features concatenated are not modelled"},
        {"{\"model_type\": \"llava\",\n \"vision_feature_layer\": -26}",
         "outside the tower's 25 hidden states"},
        {"{\"model_type\": \"llava\",\n \"image_seq_length\": 577}",
         "the tower makes 576 image tokens"},
        {"{\"model_type\": \"llava\",\n \"vocab_size\": 32064}", "differs from text_config's"},
        {"{\"model_type\": \"llava\",\n \"vision_config\": {\"model_type\": "
         "\"siglip_vision_model\"}}",
         "the tower planned is CLIP's"},
        {"{\"model_type\": \"llava\",\n \"vision_config\": {\"hidden_act\": \"silu\"}}",
         "quick_gelu or gelu"},
        {"{\"model_type\": \"llava\",\n \"projector_hidden_act\": \"relu\"}",
         "projector_hidden_act"},
        {"{\"model_type\": \"llava\",\n \"text_config\": {\"model_type\": \"gemma\", "
         "\"num_hidden_layers\": 2, \"hidden_size\": 64, \"num_attention_heads\": 4, "
         "\"num_key_value_heads\": 4, \"vocab_size\": 100}}",
         "planned for the Llama layout"},
        {"{\"model_type\": \"llava\",\n \"hidden_size\": 4096}", "hidden_size"},
        {"{\"hidden_size\": 64,\n \"model_type\": \"clip_vision_model\"}",
         "as a llava's vision_config only"},
    };
    for (size_t i = 0; i < sizeof refused / sizeof *refused; i++) {
        ml_model *m = NULL;
        ml_error e;
        ml_status st = load_text(refused[i].text, &m, &e);
        if ((st != ML_SCHEMA && st != ML_RANGE) || !strstr(e.msg, refused[i].msg))
            fail_msg("%s: got '%s'", refused[i].text, e.msg);
        assert_int_equal(e.line, 2);
        assert_null(m);
    }
}

/* The xc-llava model of tests/torch/models/llava.yaml, fp32, B 2, T 24:
 * the tower over 16 x 16 images in 4 x 4 patches (Tv = 17 rows, Dv 32,
 * Hv 4, Fv 64), the projector to D 48, a 2-layer Llama. */
static const char tiny[] =
    "model:\n  type: multimodal\n  stacks:\n    vision:\n      layers: 3\n      hidden: 32\n"
    "      heads: 4\n      ffn: 64\n      image_size: 16\n      patch_size: 4\n"
    "      activation: quick_gelu\n      feature_layer: -2\n    projector:\n"
    "      activation: gelu\n    decoder:\n      layers: 2\n      hidden: 48\n"
    "      heads: 4\n      kv_heads: 2\n      ffn: 96\n      vocab: 157\n"
    "      norm: rmsnorm\n      activation: swiglu\n      position: rope\n"
    "      tied_embeddings: false\n      bias: false\n"
    "training:\n  micro_batch: 2\n  seq_len: 24\n  optimizer: adamw\n";

/* A CLIP layer's saved bytes, fp32, B Tv = 34 rows: layer_norm1's
 * statistics 34 x 2 x 4 = 272 and output (q/k/v's input) 34 x 32 x 4 =
 * 4,352; q and k (scores matmul) 2 x 4,352; the fp32 softmax output
 * 2 x 4 x 17^2 x 4 = 9,248; v 4,352; out_proj's input 4,352; layer_norm2's
 * input 4,352 and statistics 272; fc1's input 4,352; fc1's output, the
 * sigmoid's and the product (fc2's input), 3 x 34 x 64 x 4 = 26,112:
 * 66,368, and the layer's input 4,352 kept (layer_norm1's). The unused last
 * layer saves the same and post_layernorm its output (a view of it) 4,352
 * with its statistics 2 x 2 x 4 = 16, all freed once the image features
 * are made: nothing kept for the backward. The projector: linear_1's input,
 * a contiguous copy of the (2, 16, 32) slice, 4,096; linear_1's output and
 * gelu's, 2 x (2 x 16 rows) x 48 x 4 = 12,288; the image-token mask
 * 2 x 24 B: 16,432. */
static void test_llava_tiny(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "vision.layer.0")->activations_saved, 66368 + 4352);
    const ml_block_info *u = block_named(l, "vision.layer.2");
    assert_true(u->unused_output);
    assert_int_equal(u->activations_saved, 0);
    assert_int_equal(u->inventory_bytes, 66368 + 4352 + 4352 + 16); /* what its forward saves */
    assert_int_equal(block_named(l, "projector")->activations_saved, 16432);
    /* parameters: 7,536 + 2,176 + 3 x 8,544 + 64 + 3,936 + 2 x 20,832 +
     * 7,584 = 88,592; the unused layer's 8,544 and post_layernorm's 64 get
     * no AdamW state: (88,592 - 8,608) x 8 */
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->params, 88592);
    assert_int_equal(s->bytes_optimizer, (88592 - 8608) * 8);
    /* the batch: ids and labels 2 x 24 x 8 each, pixels 2 x 3 x 16^2 x 4;
     * the buffers: inv_freq 6 x 4, position_ids 17 x 8 */
    assert_int_equal(s->bytes_batch, 2 * 384 + 6144);
    assert_int_equal(s->bytes_buffers, 24 + 136);
    ml_ledger_destroy(l);
    c.training.seq_len = 15; /* fewer than the 16 image tokens */
    ml_error e;
    ml_ledger *bad = NULL;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &bad, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "at least 16"));
    ml_model_destroy(m);
}

/* training.vision_tower on the tiny model. frozen: the tower builds no
 * graph, so its blocks keep nothing and its 2,176 + 3 x 8,544 + 64 = 27,872
 * parameters get no AdamW state: (88,592 - 27,872) x 8; the projector keeps
 * the same 16,432 (linear_1's weight needs its input). none under
 * checkpoint full: the tower's layers keep their 70,720 each, the decoder's
 * are checkpointed; full without checkpointing: each tower layer keeps only
 * its input (4,352). */
static void test_llava_vision_tower(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    c.training.vision_tower = ML_VT_FROZEN;
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    assert_int_equal(s->bytes_optimizer, (88592 - 27872) * 8);
    assert_true(block_named(l, "vision.layer.0")->frozen);
    assert_int_equal(block_named(l, "vision.layer.0")->activations_saved, 0);
    assert_int_equal(block_named(l, "vision.layer.2")->inventory_bytes, 0);
    assert_int_equal(block_named(l, "vision.embedding")->activations_saved, 0);
    assert_int_equal(block_named(l, "projector")->activations_saved, 16432);
    assert_int_equal(block_named(l, "block.0")->ckpt_index, 0); /* the decoder's first */
    ml_ledger_destroy(l);
    ml_error e;
    c.training.vision_tower = ML_VT_NONE;
    assert_int_equal(ml_parse_checkpoint("full", &c.training.checkpoint, &e), ML_OK);
    l = eval(m, &c, false);
    assert_false(block_named(l, "vision.layer.0")->checkpointed);
    assert_int_equal(block_named(l, "vision.layer.0")->activations_saved, 70720);
    assert_true(block_named(l, "block.0")->checkpointed);
    ml_ledger_destroy(l);
    c.training.vision_tower = ML_VT_FULL;
    assert_int_equal(ml_parse_checkpoint("none", &c.training.checkpoint, &e), ML_OK);
    l = eval(m, &c, false);
    assert_true(block_named(l, "vision.layer.1")->checkpointed);
    assert_int_equal(block_named(l, "vision.layer.1")->activations_saved, 4352);
    assert_false(block_named(l, "block.0")->checkpointed);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    /* a model without a tower refuses the setting */
    m = load_preset("gpt2-small");
    c = ml_model_config(m);
    c.training.vision_tower = ML_VT_FROZEN;
    ml_ledger *bad = NULL;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &bad, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "has no vision tower"));
    ml_model_destroy(m);
}

/* The tiny model in pure bf16: CLIP's eager attention asks softmax for
 * fp32 (eager_attention_forward's dtype=torch.float32), then casts. A
 * layer keeps 8 (34, 32) bf16 tensors 8 x 2,176 (its input included), two
 * LayerNorms' fp32 statistics 2 x 272, the fp32 softmax 9,248 and its bf16
 * cast 4,624 (PV's), fc1's output, the sigmoid's and the product
 * 3 x 34 x 64 x 2 = 13,056: 44,880. */
static void test_llava_bf16_tower(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    c.training.precision = ML_PREC_BF16;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(block_named(l, "vision.layer.0")->activations_saved, 17408 + 544 + 9248 +
                                                                              4624 + 13056);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Optimizer states and master weights by who trains (fp32 masters under
 * bf16-master, 4 B each; AdamW's two states, fp32, 8 B per parameter).
 * Under ZeRO (DeepSpeed's groups are built from requires_grad) the unused
 * layer's 8,544 and post_layernorm's 64 keep states: 88,592 x 8 on one
 * device. Frozen, the tower's 27,872 have neither states nor masters:
 * (88,592 - 27,872) x 4 = 242,880 of masters. */
static void test_llava_states(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    c.training.zero = 1;
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->bytes_optimizer, 88592 * 8);
    ml_ledger_destroy(l);
    c.training.zero = 0;
    c.training.precision = ML_PREC_BF16_MASTER;
    c.training.vision_tower = ML_VT_FROZEN;
    l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->bytes_master, (88592 - 27872) * 4);
    assert_int_equal(ml_ledger_summary(l)->bytes_optimizer, (88592 - 27872) * 8);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The allocator simulation's tensors for a share of the parameters: one
 * per parameter tensor of the set the bytes cover, each rounded to 512 B.
 * Those that train with the tower frozen (master weights): the projector's
 * linear_1 32 x 48 and linear_2 48 x 48 with their biases, 6,144 + 9,216 +
 * 2 x 512 (192 B rounded); the decoder's embeddings and lm_head 157 x 48,
 * 30,144 B each, rounded 30,208; per layer q and o 48 x 48 (9,216 each), k
 * and v 48 x 24 (4,608 each), gate, up and down 48 x 96 (18,432 each), two
 * norms (512 each): 83,968; the final norm 512. 25 tensors, 16,384 +
 * 2 x 30,208 + 2 x 83,968 + 512 = 245,248 B. Those with a gradient, the
 * tower trained (gradients): those 25 and the tower but its unused last
 * layer: the class embedding 32 (512), the patch conv 3 x 4 x 4 x 32
 * (6,144), positions 17 x 32 (2,176, rounded 2,560), pre_layrnorm 2 x 512,
 * and per used layer q, k, v, out 32 x 32 (4,096 each) with biases
 * (4 x 512), fc1 32 x 64 and fc2 64 x 32 (8,192 each) with biases (512
 * each), two LayerNorms 4 x 512: 37,888; 62 tensors, 331,264 B. Shared out
 * over every parameter instead, the bytes would not divide: one tensor. */
static void test_llava_param_tensors(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    ml_config c = ml_model_config(m);
    const ml_alloc_config ac = ml__alloc_config_defaults();
    for (int frozen = 1; frozen >= 0; frozen--) {
        c.training.vision_tower = frozen ? ML_VT_FROZEN : ML_VT_SAME;
        ml_chain ch;
        ml_error e;
        assert_int_equal(ml__chain_build(m, &c, &ch, &e), ML_OK);
        ml_rsim *r = NULL;
        assert_int_equal(ml__rsim_create(&ac, &ch, &r, &e), ML_OK);
        if (frozen)
            ml__rsim_alloc(r, ML_CAT_MASTER, (88592 - 27872) * 4, ML_T_TRAINED_PARAMS, 0, 1);
        else
            ml__rsim_alloc(r, ML_CAT_GRADS, (88592 - 8608) * 4, ML_T_GRAD_PARAMS, 0, 1);
        ml_alloc_stats st;
        ml__rsim_stats(r, &st);
        assert_int_equal(st.events, frozen ? 25 : 62);
        assert_int_equal(st.allocated.current, frozen ? 245248 : 331264);
        ml__rsim_destroy(r);
        ml__chain_free(&ch);
    }
    ml_model_destroy(m);
}

/* The token embeddings (B, T, D) fp32 = 2 x 24 x 48 x 4 = 9,216 B wait
 * beside the tower, frozen or not: made by the embedding block's forward,
 * freed once the projector's is done, and masked_scatter's gradient for
 * them lives from the projector's backward to the embedding's. */
static void test_llava_embedding_side(void **state)
{
    (void)state;
    ml_model *m = load_str(tiny);
    for (int frozen = 0; frozen < 2; frozen++) {
        ml_config c = ml_model_config(m);
        c.training.vision_tower = frozen ? ML_VT_FROZEN : ML_VT_SAME;
        ml_ledger *l = eval(m, &c, true);
        const ml_event *ev = ml_ledger_events(l);
        size_t n = ml_ledger_event_count(l), made = 0, grads = 0;
        for (size_t i = 0; i < n; i++) {
            if (ev[i].cat == ML_CAT_WORKSPACE && ev[i].delta == 9216 && ev[i].block == 0 &&
                ev[i].phase == ML_PHASE_FORWARD)
                made++;
            if (ev[i].cat == ML_CAT_WORKSPACE && ev[i].delta == 9216 &&
                ev[i].phase == ML_PHASE_BACKWARD &&
                !strcmp(ml_ledger_block(l, (size_t)ev[i].block)->name, "projector"))
                grads++;
        }
        assert_true(made >= 1);
        assert_true(grads >= 1);
        ml_ledger_destroy(l);
    }
    ml_model_destroy(m);
}

/* feature_layer 0 (the projector reads the embeddings' output) leaves
 * every layer unused: 20 of them, each with a side tensor. */
static void test_llava_many_unused(void **state)
{
    (void)state;
    char text[2048];
    const char *at = strstr(tiny, "      layers: 3\n"), *fl = strstr(tiny, "feature_layer: -2");
    assert_non_null(at);
    assert_non_null(fl);
    snprintf(text, sizeof text, "%.*s      layers: 20\n%.*sfeature_layer: 0%s", (int)(at - tiny),
             tiny, (int)(fl - at - 16), at + 16, fl + 17);
    ml_model *m = load_str(text);
    assert_int_equal(m->vision.used, 0);
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    size_t unused = 0;
    for (size_t k = 0; k < ml_ledger_block_count(l); k++)
        unused += ml_ledger_block(l, k)->unused_output;
    assert_int_equal(unused, 20);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The model file's refusals: each names the key (line and column) and
 * the fix. */
static void test_llava_yaml_refusals(void **state)
{
    (void)state;
    static const struct {
        const char *from, *to, *msg;
    } cases[] = {
        {"      feature_layer: -2\n", "      feature_layer: 4\n",
         "feature_layer: 4 is outside the tower's 4 hidden states"},
        {"      feature_layer: -2\n", "      feature_layer: two\n", "not a whole number"},
        {"      activation: quick_gelu\n", "      activation: silu\n", "activation"},
        {"      activation: gelu\n    decoder", "      activation: relu\n    decoder",
         "projector_hidden_act gelu is"},
        {"      bias: false\n", "      bias: false\n      classes: 3\n",
         "planned as a pre-norm decoder with an LM head"},
        {"    projector:\n", "    encoder:\n", "encoder"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const char *at = strstr(tiny, cases[i].from);
        assert_non_null(at);
        char text[2048];
        snprintf(text, sizeof text, "%.*s%s%s", (int)(at - tiny), tiny, cases[i].to,
                 at + strlen(cases[i].from));
        ml_model *m = NULL;
        ml_error e;
        ml_status st = ml_model_load_string(text, strlen(text), "llava.yaml", &m, &e);
        if (st == ML_OK || !strstr(e.msg, cases[i].msg))
            fail_msg("case %zu: got '%s'", i, st == ML_OK ? "loaded" : e.msg);
        assert_true(e.line > 0);
        assert_null(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_llava_count),
        cmocka_unit_test(test_llava_defaults),
        cmocka_unit_test(test_llava_refusals),
        cmocka_unit_test(test_llava_tiny),
        cmocka_unit_test(test_llava_yaml_refusals),
        cmocka_unit_test(test_llava_vision_tower),
        cmocka_unit_test(test_llava_bf16_tower),
        cmocka_unit_test(test_llava_states),
        cmocka_unit_test(test_llava_param_tensors),
        cmocka_unit_test(test_llava_embedding_side),
        cmocka_unit_test(test_llava_many_unused),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
