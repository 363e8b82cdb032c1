/* The shipped presets: parameter counts against the published counts, each
 * recomputed here from the architecture (docs/presets.md names the sources). */
#include "harness.h"

static uint64_t params_of(const char *preset)
{
    ml_model *m = load_preset(preset);
    ml_config c = ml_model_config(m);
    c.training.micro_batch = 1;
    ml_ledger *l = eval(m, &c, false);
    uint64_t p = ml_ledger_summary(l)->params;
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return p;
}

/* GPT-2: tied embeddings V*D, positions P*D, per block 12D^2 + 13D
 * (ln 2D, c_attn 3D^2+3D, c_proj D^2+D, ln 2D, fc 4D^2+4D, proj 4D^2+D),
 * final ln 2D. Hugging Face gpt2: 124,439,808; gpt2-medium: 354,823,168. */
static uint64_t gpt2(uint64_t L, uint64_t D)
{
    return 50257 * D + 1024 * D + L * (12 * D * D + 13 * D) + 2 * D;
}

/* Llama: untied V*D twice; per block q,o D^2 each, k,v D*(kvh*dh) each,
 * 3*D*F MLP, two RMSNorm D; final norm D. */
static uint64_t llama(uint64_t L, uint64_t D, uint64_t kv, uint64_t F, uint64_t V)
{
    return 2 * V * D + L * (2 * D * D + 2 * D * kv + 3 * D * F + 2 * D) + D;
}

static void test_published_counts(void **state)
{
    (void)state;
    assert_int_equal(gpt2(12, 768), 124439808);
    assert_int_equal(params_of("gpt2-small"), 124439808);
    assert_int_equal(gpt2(24, 1024), 354823168);
    assert_int_equal(params_of("gpt2-medium"), 354823168);
    /* meta-llama/Llama-2-7b-hf: 6,738,415,616 */
    assert_int_equal(llama(32, 4096, 4096, 11008, 32000), 6738415616ull);
    assert_int_equal(params_of("llama-2-7b"), 6738415616ull);
    /* meta-llama/Meta-Llama-3-8B: 8,030,261,248 (8 kv heads of 128) */
    assert_int_equal(llama(32, 4096, 1024, 14336, 128256), 8030261248ull);
    assert_int_equal(params_of("llama-3-8b"), 8030261248ull);
    /* allenai/OLMo-1B-hf: 1,176,764,416 (1.18B): the tied table V*D and
     * per block Llama's 4 D^2 + 3 D F, its LayerNorms without parameters:
     * 50304 * 2048 + 16 * (4 * 2048^2 + 3 * 2048 * 8192) */
    _Static_assert(50304ull * 2048 + 16 * (4ull * 2048 * 2048 + 3ull * 2048 * 8192) ==
                       1176764416ull,
                   "the hand count is the published one");
    assert_int_equal(params_of("olmo-1b"), 1176764416ull);
    /* ViT-B/16: patch conv 3*16*16*768 + 768, class token 768, positions
     * 197*768, 12 blocks as GPT-2's, final ln 2*768, head 768*1000 + 1000:
     * 86,567,656 (timm vit_base_patch16_224) */
    uint64_t D = 768;
    uint64_t vit = 3 * 256 * D + D + D + 197 * D + 12 * (12 * D * D + 13 * D) + 2 * D +
                   D * 1000 + 1000;
    assert_int_equal(vit, 86567656);
    assert_int_equal(params_of("vit-b16"), 86567656);
    /* T5-base: the shared table V*D (the LM head tied to it); an encoder
     * block's q, k, v, o (D x H*dkv each), wi and wo (D x F), two norms D;
     * a decoder block's two attentions, wi and wo, three norms; each
     * stack's first block a 32 x H relative_attention_bias and each stack
     * a final norm D: 222,903,552 (google-t5/t5-base) */
    uint64_t I = 12 * 64, F = 3072;
    uint64_t enc = 12 * (4 * D * I + 2 * D * F + 2 * D) + 32 * 12 + D;
    uint64_t dec = 12 * (8 * D * I + 2 * D * F + 3 * D) + 32 * 12 + D;
    assert_int_equal(32128 * D + enc + dec, 222903552);
    assert_int_equal(params_of("t5-base"), 222903552);
    /* LLaVA-1.5-7B: the CLIP ViT-L/14-336 tower (class embedding, a patch
     * conv without bias, 577 positions, pre_layrnorm; 24 layers of 4
     * biased D x D projections, fc1, fc2 and two LayerNorms; post_layernorm),
     * the projector 1024 x 4096 + 4096^2 with biases, and Vicuna-7B (vocab
     * 32064): 7,063,427,072 (llava-hf/llava-1.5-7b-hf) */
    uint64_t Dv = 1024, Fv = 4096, Dt = 4096;
    uint64_t tower = Dv + 3 * 14 * 14 * Dv + 577 * Dv + 2 * Dv +
                     24 * (4 * (Dv * Dv + Dv) + Dv * Fv + Fv + Fv * Dv + Dv + 4 * Dv) + 2 * Dv;
    uint64_t projector = Dv * Dt + Dt + Dt * Dt + Dt;
    uint64_t vicuna = 2 * 32064 * Dt + 32 * (4 * Dt * Dt + 3 * Dt * 11008 + 2 * Dt) + Dt;
    assert_int_equal(tower + projector + vicuna, 7063427072ull);
    assert_int_equal(params_of("llava-1.5-7b"), 7063427072ull);
}

static void test_resnet18_cifar(void **state)
{
    (void)state;
    /* conv k x k x cin x cout; batchnorm 2 per channel */
#define CONV(k, i, o) ((uint64_t)(k) * (k) * (i) * (o))
    uint64_t stem = CONV(3, 3, 64) + 2 * 64;
    uint64_t basic64 = 2 * CONV(3, 64, 64) + 2 * 2 * 64;
    uint64_t down128 = CONV(3, 64, 128) + CONV(3, 128, 128) + CONV(1, 64, 128) + 3 * 2 * 128;
    uint64_t basic128 = 2 * CONV(3, 128, 128) + 2 * 2 * 128;
    uint64_t down256 = CONV(3, 128, 256) + CONV(3, 256, 256) + CONV(1, 128, 256) + 3 * 2 * 256;
    uint64_t basic256 = 2 * CONV(3, 256, 256) + 2 * 2 * 256;
    uint64_t down512 = CONV(3, 256, 512) + CONV(3, 512, 512) + CONV(1, 256, 512) + 3 * 2 * 512;
    uint64_t basic512 = 2 * CONV(3, 512, 512) + 2 * 2 * 512;
    uint64_t head = 512 * 10 + 10;
    uint64_t total = stem + 2 * basic64 + down128 + basic128 + down256 + basic256 + down512 +
                     basic512 + head;
    assert_int_equal(total, 11173962); /* kuangliu/pytorch-cifar ResNet18 */
    assert_int_equal(params_of("cifar10-resnet"), 11173962);
}

/* torchvision resnet50 (v1.5), derived per stage: a Bottleneck of width w
 * from cin channels is 1x1 cin->w, 3x3 w->w, 1x1 w->4w, batchnorm 2w, 2w,
 * 2*4w; a stage's first block adds the projection 1x1 cin->4w + batchnorm
 * 2*4w. Stem 7x7 3->64 + batchnorm 128; fc 2048*1000 + 1000. */
static uint64_t bottleneck(uint64_t cin, uint64_t w)
{
    return CONV(1, cin, w) + CONV(3, w, w) + CONV(1, w, 4 * w) + 2 * w + 2 * w + 2 * 4 * w;
}

static uint64_t stage(uint64_t cin, uint64_t w, uint64_t blocks)
{
    return bottleneck(cin, w) + CONV(1, cin, 4 * w) + 2 * 4 * w +
           (blocks - 1) * bottleneck(4 * w, w);
}

static void test_resnet50_imagenet(void **state)
{
    (void)state;
    uint64_t stem = CONV(7, 3, 64) + 2 * 64;
    /* 215,808 + 1,219,584 + 7,098,368 + 14,964,736 */
    assert_int_equal(stage(64, 64, 3), 215808);
    assert_int_equal(stage(256, 128, 4), 1219584);
    assert_int_equal(stage(512, 256, 6), 7098368);
    assert_int_equal(stage(1024, 512, 3), 14964736);
    uint64_t total = stem + stage(64, 64, 3) + stage(256, 128, 4) + stage(512, 256, 6) +
                     stage(1024, 512, 3) + 2048 * 1000 + 1000;
    assert_int_equal(total, 25557032); /* torchvision.models.resnet50 */
    assert_int_equal(params_of("resnet50-imagenet"), 25557032);
}

static void test_small_presets(void **state)
{
    (void)state;
    assert_int_equal(params_of("mlp2"), 20000000); /* 1000*10000 + 10000*1000 */
    /* BERT layout, V=30522, D=256, P=512, 2 token types, F=1024, 4 layers,
     * pooler, 4 classes. Embeddings V*D + P*D + 2*D + ln 2D; block
     * 4(D^2+D) + 2D + (D*F+F) + (F*D+D) + 2D; pooler D^2+D; classifier 4D+4.
     * Without the classifier this is google/bert_uncased_L-4_H-256_A-4's
     * BertModel, 11,170,560. */
    uint64_t D = 256, F = 1024;
    uint64_t emb = 30522 * D + 512 * D + 2 * D + 2 * D;
    uint64_t blk = 4 * (D * D + D) + 2 * D + (D * F + F) + (F * D + D) + 2 * D;
    uint64_t bert = emb + 4 * blk + D * D + D;
    assert_int_equal(bert, 11170560);
    assert_int_equal(params_of("agnews-classifier"), bert + 4 * D + 4);
    /* video tokens: untied 8192 x 1024 twice, 24 bias-free blocks
     * 4D^2 + 2DF + 2D (layernorm weights only), final norm D */
    D = 1024;
    F = 4096;
    assert_int_equal(params_of("video-tokens"),
                     2 * 8192 * D + 24 * (4 * D * D + 2 * D * F + 2 * D) + D);
}

/* The seeds' device example: plan to 6.5 GiB on an 8 GiB device. */
static void test_budget_example(void **state)
{
    (void)state;
    ml_model *m = load_preset("agnews-classifier");
    ml_config c = ml_model_config(m);
    assert_true(c.device.present);
    assert_int_equal(c.device.memory, 8ull << 30);
    assert_int_equal(c.device.budget, 6979321856ull); /* 6.5 x 2^30 */
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_summary(l)->budget, 6979321856ull);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* The sequence a model fixes itself: a sequential model's 1 (its input is
 * model.input); ViT-B/16 at 224 pixels (224 / 16)^2 = 196 patches and the
 * class token, 197; none for a decoder or a multimodal model, whose
 * training.seq_len is theirs to set. A file or flag giving another value is
 * refused (tests/cli/cases/seq-len-*). */
static void test_fixed_seq_len(void **state)
{
    (void)state;
    const struct {
        const char *preset;
        uint64_t T;
    } rows[] = {{"mlp2", 1}, {"cifar10-resnet", 1}, {"vit-b16", 197}, {"gpt2-small", 0},
                {"llava-1.5-7b", 0}};
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        ml_model *m = load_preset(rows[i].preset);
        assert_int_equal(ml_model_fixed_seq_len(m), rows[i].T);
        ml_model_destroy(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_published_counts),
        cmocka_unit_test(test_resnet18_cifar),
        cmocka_unit_test(test_resnet50_imagenet),
        cmocka_unit_test(test_small_presets),
        cmocka_unit_test(test_budget_example),
        cmocka_unit_test(test_fixed_seq_len),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
