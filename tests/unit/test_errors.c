/* Every malformed or inconsistent model file gets one message naming the
 * position, the field, what was expected (and the closest valid key), and
 * the load fails without leaking (run under ASan in CI). */
#include "harness.h"

#define GPT "name: t\nmodel:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n" \
            "  vocab: 100\n  max_positions: 32\n"

typedef struct {
    const char *yaml;
    ml_status code;
    unsigned line, col; /* 0: not checked */
    const char *msg;    /* substring */
} bad_case;

static const bad_case cases[] = {
    /* unknown keys, with the closest valid one */
    {GPT "  kv_head: 2\n", ML_SCHEMA, 9, 3, "model.kv_head: unknown key; did you mean 'kv_heads'?"},
    {GPT "training:\n  micro_bach: 4\n", ML_SCHEMA, 10, 3, "did you mean 'micro_batch'?"},
    {GPT "devise:\n  memory: 8GiB\n", ML_SCHEMA, 9, 1, "did you mean 'device'?"},
    {GPT "  zzzzzz: 1\n", ML_SCHEMA, 9, 3, "valid keys: type, layers"},
    /* wrong types */
    {"model:\n  type: decoder\n  layers: twelve\n  hidden: 64\n  heads: 4\n  vocab: 9\n"
     "  max_positions: 8\n", ML_SCHEMA, 3, 11, "model.layers: expected a whole number, got 'twelve'"},
    {GPT "training:\n  micro_batch: [1, 2]\n", ML_SCHEMA, 10, 16, "expected a whole number, got a list"},
    {GPT "  tied_embeddings: maybe\n", ML_SCHEMA, 9, 20, "expected true or false"},
    {"model: [1, 2]\n", ML_SCHEMA, 1, 8, "model: expected a mapping"},
    {"- a\n- b\n", ML_SCHEMA, 1, 1, "top level: expected a mapping"},
    {GPT "  hidden: \"64\"\n", ML_SCHEMA, 9, 3, "given twice"},
    /* zero, negative, out of range */
    {"model:\n  type: decoder\n  layers: 0\n  hidden: 64\n  heads: 4\n  vocab: 9\n"
     "  max_positions: 8\n", ML_RANGE, 3, 11, "model.layers: 0 is too small"},
    {GPT "training:\n  micro_batch: -4\n", ML_RANGE, 10, 16, "training.micro_batch: -4 is negative"},
    {GPT "  dropout: 1.5\n", ML_RANGE, 9, 12, "model.dropout: 1.5 is out of range"},
    {GPT "device:\n  memory: 0GiB\n", ML_RANGE, 10, 11, "zero"},
    {GPT "device:\n  memory: 8GiB\n  budget: 9GiB\n", ML_RANGE, 11, 11, "above device.memory"},
    {GPT "device:\n  memory: 8 gigs\n", ML_SCHEMA, 10, 11, "unknown unit"},
    /* absurd values that would overflow */
    {GPT "training:\n  micro_batch: 99999999999999999999999\n", ML_RANGE, 10, 16, "too large"},
    {"model:\n  type: decoder\n  layers: 1000000000\n  hidden: 64\n  heads: 4\n  vocab: 9\n"
     "  max_positions: 8\n", ML_RANGE, 3, 11, "the limit is 100000"},
    /* inconsistent shapes */
    {"model:\n  type: decoder\n  layers: 2\n  hidden: 768\n  heads: 7\n  vocab: 9\n"
     "  max_positions: 8\n", ML_SCHEMA, 5, 10, "model.heads: 7 does not divide hidden (768)"},
    {GPT "  kv_heads: 3\n", ML_SCHEMA, 9, 13, "model.kv_heads: 3 does not divide heads (4)"},
    {GPT "  position: rope\n  heads: 64\n", ML_SCHEMA, 0, 0, "given twice"},
    /* unknown enum values */
    {GPT "training:\n  precision: fp8\n", ML_SCHEMA, 10, 14, "unknown value 'fp8'"},
    {GPT "training:\n  optimizer: adamm\n", ML_SCHEMA, 10, 14, "did you mean 'adam'?"},
    {GPT "  norm: batchnorm\n", ML_SCHEMA, 9, 9, "expected one of: layernorm, rmsnorm"},
    {GPT "training:\n  checkpoint: every-0\n", ML_SCHEMA, 10, 15, "every-K needs a whole K >= 1"},
    {"model:\n  type: transformer\n", ML_SCHEMA, 2, 9, "expected one of: decoder, encoder, sequential"},
    /* missing required fields */
    {"name: x\n", ML_SCHEMA, 1, 1, "model: missing"},
    {"model:\n  layers: 2\n", ML_SCHEMA, 2, 3, "model.type: missing"},
    {"model:\n  type: decoder\n  layers: 2\n  heads: 4\n  vocab: 9\n", ML_SCHEMA, 2, 3,
     "model.hidden: missing"},
    {"model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n  max_positions: 8\n",
     ML_SCHEMA, 2, 3, "model.vocab: missing"},
    {GPT "device:\n  budget: 6GiB\n", ML_SCHEMA, 10, 3, "device.memory: missing"},
    /* empty, syntax, aliases */
    {"", ML_SCHEMA, 0, 0, "the file is empty"},
    {"# only a comment\n", ML_SCHEMA, 0, 0, "the file is empty"},
    {"model: {type: decoder\n", ML_SYNTAX, 0, 0, "YAML syntax"},
    {"a: &x [1]\nmodel: *x\n", ML_SYNTAX, 1, 4, "anchors"},
    {"model:\n  type: decoder\n  layers: *n\n", ML_SYNTAX, 3, 11, "aliases"},
    {"model: x\n---\nmodel: y\n", ML_SYNTAX, 2, 1, "more than one YAML document"},
    {"\tmodel: x\n", ML_SYNTAX, 0, 0, "YAML syntax"},
    /* bytes that are not UTF-8: at their own line and column (the
     * character count: "é" is one), not at the file's start */
    {"name: x\nmodel:\n  type: d\xc3\xa9" "co\xff" "der\n", ML_SYNTAX, 3, 13, "not UTF-8 text"},
    {"name: x\n# \xff\n", ML_SYNTAX, 2, 3, "(byte 0xff)"},
    /* a byte order mark is no column; a lone CR ends a line; a control
     * character is valid UTF-8 that YAML refuses, named as a code point */
    {"\xEF\xBB\xBF" "name: a\xff\n", ML_SYNTAX, 1, 8, "not UTF-8 text"},
    {"name: x\rmodel: \xff\n", ML_SYNTAX, 2, 8, "not UTF-8 text"},
    {"name: x # ab\x01\n", ML_SYNTAX, 1, 13, "(U+0001): remove the character"},
    /* a checkpoint list as a YAML sequence: ascending, each once, refused
     * at the element out of order */
    {GPT "training:\n  checkpoint: [3, 0]\n", ML_SCHEMA, 10, 19, "list each block once"},
    /* sequential models */
    /* pooling: padding at most half the kernel (PyTorch's pool2d_shape_check:
     * 5 > 1 / 2 = 0), and a global pool with a window */
    {"model:\n  type: sequential\n  input: [3, 4, 4]\n  layers:\n"
     "    - maxpool: {kernel: 1, padding: 5}\n", ML_RANGE, 5, 37, "more than half the kernel"},
    {"model:\n  type: sequential\n  input: [3, 4, 4]\n  layers:\n"
     "    - avgpool: {kernel: 3, padding: 2}\n", ML_RANGE, 5, 37, "more than half the kernel"},
    {"model:\n  type: sequential\n  input: [3, 4, 4]\n  layers:\n"
     "    - avgpool: {global: true, stride: 2}\n", ML_SCHEMA, 5, 39, "has no window"},
    {"model:\n  type: sequential\n  input: [3, 32, 32]\n  layers:\n    - conv2d: {out: 8, kernel: 3}\n"
     "    - linear: {out: 10}\n", ML_SCHEMA, 6, 7, "add 'flatten: {}'"},
    {"model:\n  type: sequential\n  input: [10]\n  layers:\n    - linaer: {out: 10}\n", ML_SCHEMA,
     5, 7, "did you mean 'linear'?"},
    {"model:\n  type: sequential\n  input: [10]\n  layers:\n    - linear: {}\n", ML_SCHEMA, 5, 7,
     "linear.out: missing"},
    {"model:\n  type: sequential\n  input: [10]\n  layers: []\n", ML_SCHEMA, 4, 11,
     "the layer list is empty"},
    {"model:\n  type: sequential\n  input: [3, 8, 8]\n  layers:\n    - residual:\n"
     "        - conv2d: {out: 4, kernel: 3, padding: 1}\n", ML_SCHEMA, 5, 7, "add a shortcut"},
    {"model:\n  type: sequential\n  layers:\n    - relu: {}\n", ML_SCHEMA, 2, 3, "model.input: missing"},
    {"model:\n  type: sequential\n  input: [0]\n  layers:\n    - relu: {}\n", ML_RANGE, 3, 11,
     "out of range"},
};

static void test_bad_inputs(void **state)
{
    (void)state;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const bad_case *c = &cases[i];
        ml_model *m = (ml_model *)0x1;
        ml_error e;
        ml_status st = ml_model_load_string(c->yaml, strlen(c->yaml), "bad.yaml", &m, &e);
        if (st == ML_OK)
            fail_msg("case %zu loaded, expected %s: %s", i, ml_status_name(c->code), c->yaml);
        assert_ptr_equal(m, (ml_model *)0x1); /* out untouched */
        if (st != c->code)
            fail_msg("case %zu: %s, expected %s (%s)", i, ml_status_name(st),
                     ml_status_name(c->code), e.msg);
        if (!strstr(e.msg, c->msg))
            fail_msg("case %zu: message '%s' lacks '%s'", i, e.msg, c->msg);
        assert_string_equal(e.path, "bad.yaml");
        if (c->line && (e.line != c->line || e.col != c->col))
            fail_msg("case %zu: at %u:%u, expected %u:%u (%s)", i, e.line, e.col, c->line,
                     c->col, e.msg);
    }
}

/* Garbage must fail cleanly, never crash. */
static void test_binary_garbage(void **state)
{
    (void)state;
    char buf[4096];
    uint32_t x = 12345;
    for (int round = 0; round < 200; round++) {
        for (size_t i = 0; i < sizeof buf; i++) {
            x = x * 1103515245u + 12345u;
            buf[i] = (char)(x >> 16);
        }
        ml_model *m = NULL;
        ml_error e;
        ml_status st = ml_model_load_string(buf, sizeof buf, "garbage", &m, &e);
        assert_int_not_equal(st, ML_OK);
        assert_null(m);
    }
}

/* Problems only visible with a config: seq_len against max_positions,
 * a checkpoint list past the last block, byte counts beyond 64 bits. */
static void test_config_errors(void **state)
{
    (void)state;
    ml_model *m = load_str(GPT);
    ml_config c = ml_model_config(m);
    ml_ledger *l = NULL;
    ml_error e;
    c.training.seq_len = 33;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "exceeds model.max_positions (32)"));
    c = ml_model_config(m);
    c.training.checkpoint.kind = ML_CKPT_LIST;
    c.training.checkpoint.count = 1;
    c.training.checkpoint.blocks[0] = 2;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "block 2 does not exist"));
    /* a list names each block once, ascending: [1, 0] and [0, 0] refused
     * from the API and from the text */
    c = ml_model_config(m);
    c.training.checkpoint.kind = ML_CKPT_LIST;
    c.training.checkpoint.count = 2;
    c.training.checkpoint.blocks[0] = 1;
    c.training.checkpoint.blocks[1] = 0;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "each block once, in ascending order"));
    assert_int_equal(ml_parse_checkpoint("[0, 0]", &c.training.checkpoint, &e), ML_USAGE);
    assert_int_equal(ml_parse_checkpoint("[0, 1]", &c.training.checkpoint, &e), ML_OK);
    /* a budget above the device: both figures (5 GiB, 4 GiB as given) */
    c = ml_model_config(m);
    c.device.present = true;
    c.device.memory = 4ull << 30;
    c.device.budget = 5ull << 30;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "device.budget: the budget (5.00 GiB) is above the device's "
                                  "memory (4.00 GiB)"));
    /* an earlier problem (a micro-batch of 0, checked first) keeps its own
     * message */
    c.training.micro_batch = 0;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_null(strstr(e.msg, "device.budget"));
    c = ml_model_config(m);
    c.training.micro_batch = 0;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_RANGE);
    assert_null(l);
    ml_model_destroy(m);

    /* 2^24 samples x 2^28 tokens x 2^20 hidden: 2^72 elements */
    m = load_str("model:\n  type: decoder\n  layers: 1\n  hidden: 1048576\n  heads: 1\n"
                 "  vocab: 10\n  position: none\n");
    c = ml_model_config(m);
    c.training.micro_batch = 1u << 24;
    c.training.seq_len = 1u << 28;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_OVERFLOW);
    assert_non_null(strstr(e.msg, "64 bits"));
    ml_model_destroy(m);

    /* parameters alone: 100000 layers x 2 x 2^20 x 2^24 x 4 B overflows */
    m = load_str("model:\n  type: decoder\n  layers: 100000\n  hidden: 1048576\n  heads: 1\n"
                 "  ffn: 16777216\n  vocab: 10\n  position: none\n");
    c = ml_model_config(m);
    c.training.seq_len = 1;
    assert_int_equal(ml_ledger_evaluate(m, &c, false, &l, &e), ML_OVERFLOW);
    ml_model_destroy(m);
}

static void test_missing_file(void **state)
{
    (void)state;
    ml_model *m = NULL;
    ml_error e;
    assert_int_equal(ml_model_load_file("/nonexistent/x.yaml", &m, &e), ML_IO);
    assert_non_null(strstr(e.msg, "cannot open"));
    assert_string_equal(e.path, "/nonexistent/x.yaml");
    assert_int_equal(ml_model_load_file("/", &m, &e), ML_IO);
    ml_model_destroy(NULL); /* accepts NULL */
    ml_ledger_destroy(NULL);
}

/* Where the file set a configuration key: each key of training:, device:
 * and a parallel: map at its line and column; a compact parallel word for
 * every parallel.* key; nothing for a key the file did not set. */
static void test_key_positions(void **state)
{
    (void)state;
    static const char *yaml =
        "model:\n  type: sequential\n  input: [4]\n  layers:\n    - linear: {out: 2}\n"
        "  loss: mse\ntraining:\n  micro_batch: 2\n  checkpoint: none\n"
        "device:\n  memory: 1GiB\n";
    ml_model *m = load_str(yaml);
    unsigned line = 0, col = 0;
    assert_true(ml_model_key_position(m, "training.micro_batch", &line, &col));
    assert_int_equal(line, 8);
    assert_int_equal(col, 3);
    assert_true(ml_model_key_position(m, "training.checkpoint", &line, &col));
    assert_int_equal(line, 9);
    assert_true(ml_model_key_position(m, "device.memory", &line, &col));
    assert_int_equal(line, 11);
    assert_false(ml_model_key_position(m, "training.seq_len", &line, &col));
    assert_false(ml_model_key_position(m, "parallel.tp", &line, &col));
    assert_false(ml_model_key_position(NULL, "training.micro_batch", &line, &col));
    /* a message about a key the file set gets its position */
    ml_error e = {.code = ML_RANGE, .line = 3, .col = 4};
    snprintf(e.msg, sizeof e.msg, "training.checkpoint: block 5 does not exist");
    assert_true(ml_model_locate_error(m, &e));
    assert_int_equal(e.line, 9);
    assert_int_equal(e.col, 3);
    snprintf(e.msg, sizeof e.msg, "training.seq_len: too long");
    assert_false(ml_model_locate_error(m, &e));
    assert_int_equal(e.line, 0);
    ml_model_destroy(m);
    static const char *compact =
        "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 8\n  ffn: 256\n"
        "  vocab: 100\n  norm: rmsnorm\n  activation: swiglu\n  position: rope\n"
        "parallel: tp2.dp4\n";
    m = load_str(compact);
    assert_true(ml_model_key_position(m, "parallel.tp", &line, &col));
    assert_int_equal(line, 11);
    assert_int_equal(col, 11);
    assert_true(ml_model_key_position(m, "parallel.dp", &line, &col));
    assert_int_equal(line, 11);
    ml_model_destroy(m);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_key_positions),
        cmocka_unit_test(test_bad_inputs),
        cmocka_unit_test(test_binary_garbage),
        cmocka_unit_test(test_config_errors),
        cmocka_unit_test(test_missing_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
