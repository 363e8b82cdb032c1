/* `- repeat: {times: N, layers: [...]}` in a sequential model: a model
 * written with repeat: plans byte for byte as the same model written out
 * flat (its JSON and text reports under several checkpoint policies), and
 * every malformed repeat is refused at its position without leaking. */
#include "harness.h"

/* The JSON and text plans of yaml under checkpoint policy pol, in one
 * malloc'd string (the caller frees it). */
static char *plan_of(const char *yaml, const char *pol)
{
    ml_model *m = load_str(yaml);
    ml_config c = config_allocated(m);
    ml_error e;
    assert_int_equal(ml_parse_checkpoint(pol, &c.training.checkpoint, &e), ML_OK);
    ml_ledger *l = eval(m, &c, true);
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    assert_non_null(f);
    assert_int_equal(ml_report_json(f, m, &c, l), 0);
    assert_int_equal(ml_report_text(f, m, &c, l), 0);
    fclose(f);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
    return buf;
}

static void same_plans(const char *with_repeat, const char *flat)
{
    static const char *const pols[] = {"none", "full", "every-2", "sqrt", "[1, 3]", "optimal"};
    for (size_t k = 0; k < sizeof pols / sizeof pols[0]; k++) {
        char *a = plan_of(with_repeat, pols[k]), *b = plan_of(flat, pols[k]);
        if (strcmp(a, b) != 0)
            fail_msg("checkpoint %s: the plans differ\n--- repeat:\n%s\n--- flat:\n%s", pols[k],
                     a, b);
        free(a);
        free(b);
    }
}

#define HEAD "name: rep\nmodel:\n  type: sequential\n  input: [3, 16, 16]\n  layers:\n"
#define TAIL "    - avgpool: {global: true}\n    - flatten: {}\n    - linear: {out: 10}\n" \
             "  loss: cross_entropy\ntraining:\n  micro_batch: 4\ndevice:\n  memory: 1GiB\n"
#define BLOCK(ind)                                                                          \
    ind "- residual:\n" ind "    body:\n" ind "      - conv2d: {out: 8, kernel: 3, padding: 1}\n" \
    ind "      - batchnorm: {}\n" ind "    shortcut:\n" ind "      - conv2d: {out: 8, kernel: 1}\n"
#define DROP(ind) ind "- dropout: {p: 0.25}\n"

/* A repeat of [residual with a shortcut, relu] nested in a repeat of
 * [that, dropout]: 2 x (3 x (block, relu), dropout). */
static void test_nested_equals_flat(void **state)
{
    (void)state;
    const char *rep = HEAD "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
                           "    - repeat:\n"
                           "        times: 2\n"
                           "        layers:\n"
                           "          - repeat:\n"
                           "              times: 3\n"
                           "              layers:\n" BLOCK("                ")
                           "                - relu: {}\n" DROP("          ") TAIL;
    const char *flat = HEAD "    - conv2d: {out: 8, kernel: 3, padding: 1}\n"
        BLOCK("    ") "    - relu: {}\n" BLOCK("    ") "    - relu: {}\n"
        BLOCK("    ") "    - relu: {}\n" DROP("    ")
        BLOCK("    ") "    - relu: {}\n" BLOCK("    ") "    - relu: {}\n"
        BLOCK("    ") "    - relu: {}\n" DROP("    ") TAIL;
    same_plans(rep, flat);
}

/* A repeat inside a residual body, and times: 1. */
static void test_inside_residual_and_once(void **state)
{
    (void)state;
    const char *rep = HEAD "    - residual:\n"
                           "        - repeat: {times: 3, layers: [conv2d: {out: 3, kernel: 1},"
                           " relu: {}]}\n"
                           "    - repeat: {times: 1, layers: [batchnorm: {}]}\n" TAIL;
    const char *flat = HEAD "    - residual:\n"
                            "        - conv2d: {out: 3, kernel: 1}\n        - relu: {}\n"
                            "        - conv2d: {out: 3, kernel: 1}\n        - relu: {}\n"
                            "        - conv2d: {out: 3, kernel: 1}\n        - relu: {}\n"
                            "    - batchnorm: {}\n" TAIL;
    same_plans(rep, flat);
}

/* Appends one torchvision Bottleneck of width w (stride s; proj: the
 * projection shortcut of a stage's first block), then its relu. */
static size_t bottleneck(char *b, size_t k, size_t cap, unsigned w, unsigned s, bool proj)
{
    k += (size_t)snprintf(b + k, cap - k,
                          "    - residual:\n        body:\n"
                          "          - conv2d: {out: %u, kernel: 1, bias: false}\n"
                          "          - batchnorm: {}\n          - relu: {}\n"
                          "          - conv2d: {out: %u, kernel: 3, stride: %u, padding: 1, "
                          "bias: false}\n"
                          "          - batchnorm: {}\n          - relu: {}\n"
                          "          - conv2d: {out: %u, kernel: 1, bias: false}\n"
                          "          - batchnorm: {}\n",
                          w, w, s, 4 * w);
    if (proj)
        k += (size_t)snprintf(b + k, cap - k,
                              "        shortcut:\n"
                              "          - conv2d: {out: %u, kernel: 1, stride: %u, bias: false}\n"
                              "          - batchnorm: {}\n",
                              4 * w, s);
    return k + (size_t)snprintf(b + k, cap - k, "    - relu: {}\n");
}

/* The shipped ResNet-50 against torchvision's resnet50 written out block by
 * block: 16 Bottlenecks, the settings of the preset's training: and device:. */
static void test_resnet50_equals_flat(void **state)
{
    (void)state;
    size_t cap = 1 << 16, k = 0;
    char *b = malloc(cap);
    k += (size_t)snprintf(b + k, cap - k,
                          "name: resnet50-imagenet\nmodel:\n  type: sequential\n"
                          "  input: [3, 224, 224]\n  layers:\n"
                          "    - conv2d: {out: 64, kernel: 7, stride: 2, padding: 3, bias: false}\n"
                          "    - batchnorm: {}\n    - relu: {}\n"
                          "    - maxpool: {kernel: 3, stride: 2, padding: 1}\n");
    static const unsigned width[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3};
    for (size_t st = 0; st < 4; st++)
        for (unsigned i = 0; i < blocks[st]; i++)
            k = bottleneck(b, k, cap, width[st], i == 0 && st > 0 ? 2 : 1, i == 0);
    k += (size_t)snprintf(b + k, cap - k,
                          "    - avgpool: {global: true}\n    - flatten: {}\n"
                          "    - linear: {out: 1000}\n  loss: cross_entropy\n"
                          "training:\n  micro_batch: 32\n  precision: fp32\n"
                          "  optimizer: sgd-momentum\n  optimizer_impl: foreach\n"
                          "device:\n  memory: 16GiB\n  runtime_reserve: 512MiB\n"
                          "  peak_tflops: 15.7\n");
    assert_true(k < cap);
    char path[1024];
    snprintf(path, sizeof path, "%s/resnet50-imagenet.yaml", ML_MODELS_DIR);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char *text = calloc(1, cap);
    size_t len = fread(text, 1, cap - 1, f);
    fclose(f);
    assert_true(len > 0 && len < cap - 1);
    same_plans(text, b);
    free(text);
    free(b);
}

#define SEQ(input) "model:\n  type: sequential\n  input: " input "\n  layers:\n"
#define END "  loss: mse\n"

typedef struct {
    const char *yaml;
    ml_status code;
    unsigned line, col;
    const char *msg; /* substring */
} bad_case;

static const bad_case cases[] = {
    {SEQ("[8]") "    - repeat: {times: 0, layers: [relu: {}]}\n" END, ML_RANGE, 5, 23,
     "model.layers[0].repeat.times: 0 is too small; expected a whole number >= 1"},
    {SEQ("[8]") "    - repeat: {times: 2}\n" END, ML_SCHEMA, 5, 7,
     "model.layers[0].repeat.layers: missing; list the layers to repeat under 'layers:'"},
    {SEQ("[8]") "    - repeat: {times: 2, layers: []}\n" END, ML_SCHEMA, 5, 34,
     "model.layers[0].repeat.layers: the layer list is empty"},
    {SEQ("[8]") "    - repeat:\n        layers: [relu: {}]\n" END, ML_SCHEMA, 5, 7,
     "model.layers[0].repeat.times: missing; write 'times: N'"},
    {SEQ("[8]") "    - repeat: {times: 2.5, layers: [relu: {}]}\n" END, ML_SCHEMA, 5, 23,
     "model.layers[0].repeat.times: expected a whole number, got '2.5'"},
    {SEQ("[8]") "    - repeat: {times: \"3\", layers: [relu: {}]}\n" END, ML_SCHEMA, 5, 23,
     "model.layers[0].repeat.times: expected a whole number, got '3'"},
    {SEQ("[8]") "    - repeat: {times: 100001, layers: [relu: {}]}\n" END, ML_RANGE, 5, 23,
     "model.layers[0].repeat.times: 100001 is too large; the limit is 100000"},
    {SEQ("[8]") "    - repeat: 3\n" END, ML_SCHEMA, 5, 15,
     "model.layers[0].repeat: expected a mapping such as {times: 3, layers: [...]}, got a scalar"},
    {SEQ("[8]") "    - repeat: {time: 3, layers: [relu: {}]}\n" END, ML_SCHEMA, 5, 16,
     "model.layers[0].repeat.time: unknown key; did you mean 'times'?"},
    {SEQ("[8]") "    - repaet: {times: 3, layers: [relu: {}]}\n" END, ML_SCHEMA, 5, 7,
     "model.layers[0]: unknown layer kind 'repaet'; did you mean 'repeat'?"},
    {SEQ("[8]") "    - repeat: {times: 2, layers: [relu: {}, linaer: {out: 3}]}\n" END, ML_SCHEMA,
     5, 45, "model.layers[0].repeat.layers[1]: unknown layer kind 'linaer'; did you mean 'linear'?"},
    /* the limit: nested repeats multiply; the layers before count */
    {SEQ("[8]") "    - repeat: {times: 1000, layers: [repeat: {times: 1000, layers: [relu: {}]}]}\n"
     END, ML_RANGE, 5, 7,
     "model.layers[0].repeat: 1000 copies make 1000000 layers in all, past the limit of 100000 "
     "(each layer of a residual group and of every copy counts); lower 'times' or repeat fewer "
     "layers"},
    {SEQ("[8]") "    - relu: {}\n    - repeat: {times: 100000, layers: [relu: {}]}\n" END, ML_RANGE,
     6, 7, "model.layers[1].repeat: 100000 copies make 100001 layers in all"},
    {SEQ("[8]") "    - repeat:\n        times: 10\n        layers:\n"
                "          - repeat: {times: 10, layers: [repeat: {times: 10, layers: [\n"
                "              repeat: {times: 10, layers: [repeat: {times: 10, layers: [\n"
                "              repeat: {times: 10, layers: [relu: {}]}]}]}]}]}\n" END,
     ML_RANGE, 5, 7, "model.layers[0].repeat: 10 copies make 1000000 layers in all"},
    {SEQ("[8]") "    - residual: [repeat: {times: 49999, layers: [linear: {out: 8}]}]\n"
                "    - repeat: {times: 50001, layers: [relu: {}]}\n" END, ML_RANGE, 6, 7,
     "model.layers[1].repeat: 50001 copies make 100001 layers in all"},
    /* a copy whose input no longer fits: the expanded index, the layer's position */
    {SEQ("[3, 4, 4]") "    - repeat:\n        times: 3\n        layers:\n"
                      "          - maxpool: {kernel: 2}\n" END, ML_SCHEMA, 8, 13,
     "model.layers[2] (counting repeat copies): pool kernel 2 does not fit the input [3, 1, 1]"},
};

static void test_bad_repeats(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        ml_model *m = NULL;
        ml_error e;
        ml_status st = ml_model_load_string(c->yaml, strlen(c->yaml), "r.yaml", &m, &e);
        if (st != c->code || e.line != c->line || e.col != c->col || !strstr(e.msg, c->msg))
            fail_msg("case %zu: got %s at %u:%u: %s\nexpected %s at %u:%u: %s", i,
                     ml_status_name(st), e.line, e.col, e.msg, ml_status_name(c->code), c->line,
                     c->col, c->msg);
        assert_null(m);
    }
}

/* The limit itself is allowed: 100,000 layers, 99,999 of them copies. */
static void test_at_the_limit(void **state)
{
    (void)state;
    const char *y = SEQ("[8]") "    - relu: {}\n    - repeat: {times: 99999, layers: [relu: {}]}\n" END;
    ml_model *m = load_str(y);
    ml_config c = config_allocated(m);
    ml_ledger *l = eval(m, &c, false);
    assert_int_equal(ml_ledger_block_count(l) >= 100000, true);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* Repeats nested 17 deep (each times: 1): refused as residual groups are. */
static void test_depth(void **state)
{
    (void)state;
    char buf[4096];
    size_t k = (size_t)snprintf(buf, sizeof buf, SEQ("[8]") "    - ");
    for (int i = 0; i < 17; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "repeat: {times: 1, layers: [");
    k += (size_t)snprintf(buf + k, sizeof buf - k, "relu: {}");
    for (int i = 0; i < 17; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "]}");
    k += (size_t)snprintf(buf + k, sizeof buf - k, "\n" END);
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_string(buf, k, "r.yaml", &m, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "residual or repeat groups nested deeper than 16"));
    assert_null(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_nested_equals_flat),
        cmocka_unit_test(test_inside_residual_and_once),
        cmocka_unit_test(test_resnet50_equals_flat),
        cmocka_unit_test(test_bad_repeats),
        cmocka_unit_test(test_at_the_limit),
        cmocka_unit_test(test_depth),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
