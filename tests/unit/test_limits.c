/* Resource limits on input, each with its message (docs/robustness.md), and
 * FLOPs that stay finite for a trillion-parameter model. */
#include <stdlib.h>

#include "harness.h"

static void expect(const char *text, size_t len, ml_status code, const char *msg)
{
    ml_model *m = NULL;
    ml_error e;
    ml_status st = ml_model_load_string(text, len, "limits.yaml", &m, &e);
    if (st != code)
        fail_msg("got %s (%s), expected %s", ml_status_name(st), e.msg, ml_status_name(code));
    if (!strstr(e.msg, msg))
        fail_msg("message '%s' lacks '%s'", e.msg, msg);
    assert_null(m);
}

static void test_file_size(void **state)
{
    (void)state;
    size_t n = (16u << 20) + 1;
    char *big = malloc(n);
    memset(big, '#', n);
    expect(big, n, ML_RANGE, "larger than 16 MiB");
    free(big);
}

static void test_nesting_depth(void **state)
{
    (void)state;
    char buf[512];
    size_t k = 0;
    k += (size_t)snprintf(buf, sizeof buf, "model: ");
    for (int i = 0; i < 70; i++)
        buf[k++] = '[';
    for (int i = 0; i < 70; i++)
        buf[k++] = ']';
    buf[k++] = '\n';
    expect(buf, k, ML_SYNTAX, "nesting deeper than 64 levels");
}

static void test_node_count(void **state)
{
    (void)state;
    /* 250,000 list items: past the 200,000-node bound */
    size_t n = 250000, len = 0;
    char *s = malloc(n * 2 + 16);
    len += (size_t)sprintf(s, "x: [");
    for (size_t i = 0; i < n; i++) {
        s[len++] = '1';
        s[len++] = ',';
    }
    s[len - 1] = ']';
    expect(s, len, ML_RANGE, "more than 200000 YAML nodes");
    free(s);
}

static void test_residual_depth(void **state)
{
    (void)state;
    char buf[8192];
    size_t k = (size_t)snprintf(buf, sizeof buf,
                                "model:\n  type: sequential\n  input: [4]\n  layers:\n");
    int depth = 20;
    for (int i = 0; i < depth; i++)
        k += (size_t)snprintf(buf + k, sizeof buf - k, "%*s- residual:\n", 4 + 4 * i, "");
    k += (size_t)snprintf(buf + k, sizeof buf - k, "%*s- relu: {}\n", 4 + 4 * depth, "");
    expect(buf, k, ML_RANGE, "residual or repeat groups nested deeper than 16");
}

static void test_value_bounds(void **state)
{
    (void)state;
    const char *base = "model:\n  type: decoder\n  layers: 2\n  hidden: 64\n  heads: 4\n"
                       "  vocab: 10\n  position: none\n";
    char buf[1024];
    struct {
        const char *extra, *msg;
    } cases[] = {
        {"training:\n  micro_batch: 16777217\n", "the limit is 16777216"},
        {"training:\n  seq_len: 268435457\n", "the limit is 268435456"},
        {"training:\n  grad_accum: 1048577\n", "the limit is 1048576"},
        {"training:\n  data_parallel: 1048577\n", "the limit is 1048576"},
        {"training:\n  zero: 4\n", "the limit is 3"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int n = snprintf(buf, sizeof buf, "%s%s", base, cases[i].extra);
        expect(buf, (size_t)n, ML_RANGE, cases[i].msg);
    }
    const char *t1 = "model:\n  type: decoder\n  layers: 100001\n  hidden: 64\n  heads: 4\n"
                     "  vocab: 10\n";
    expect(t1, strlen(t1), ML_RANGE, "the limit is 100000");
    const char *t2 = "model:\n  type: decoder\n  layers: 1\n  hidden: 1048577\n  heads: 1\n"
                     "  vocab: 10\n";
    expect(t2, strlen(t2), ML_RANGE, "the limit is 1048576");
}

/* A trillion parameters: 128 blocks of hidden 25,600 (12 D^2 + 13 D each),
 * untied 50,000-token embeddings and head. The count is exact in 64 bits, the
 * FLOPs finite, 3F for training. */
/* A points CSV holds up to 1,000,000 rows (the count, not the array's
 * capacity: it stopped at 524,288, the capacity's doubling past 10^6); the
 * next row is refused at its line. */
static void test_points_count(void **state)
{
    (void)state;
    const size_t rows = 1000001;
    char *csv = malloc(32 + rows * 4); /* the header, 4 bytes a row, the terminator */
    assert_non_null(csv);
    size_t len = (size_t)sprintf(csv, "micro_batch,peak\n");
    for (size_t i = 0; i < rows; i++)
        len += (size_t)sprintf(csv + len, "%zu,%zu\n", i % 9 + 1, i % 7 + 1);
    ml_point *p = NULL;
    size_t n = 0;
    ml_error e;
    /* the first 600,000 rows (the header and 600,000 lines of 4 bytes) */
    assert_int_equal(ml_points_parse_csv(csv, 17 + 600000 * 4, "p.csv", &p, &n, &e), ML_OK);
    assert_int_equal(n, 600000);
    free(p);
    p = NULL;
    assert_int_equal(ml_points_parse_csv(csv, len, "p.csv", &p, &n, &e), ML_RANGE);
    assert_int_equal(e.line, 1000002);
    assert_non_null(strstr(e.msg, "more than 1000000 points"));
    assert_null(p);
    free(csv);
}

static void test_trillion_parameters(void **state)
{
    (void)state;
    ml_model *m = load_str("model:\n  type: decoder\n  layers: 128\n  hidden: 25600\n"
                           "  heads: 160\n  vocab: 50000\n  position: rope\n"
                           "  tied_embeddings: false\n  attention: flash\n"
                           "training:\n  micro_batch: 1\n  seq_len: 2048\n  precision: bf16-master\n");
    ml_config c = ml_model_config(m);
    ml_ledger *l = eval(m, &c, false);
    const ml_summary *s = ml_ledger_summary(l);
    uint64_t D = 25600, want = 128 * (12 * D * D + 13 * D) + 2 * 50000 * D + 2 * D;
    assert_int_equal(s->params, want);
    assert_true(s->params > 1000000000000ull);
    assert_int_equal(s->bytes_params + s->bytes_grads + s->bytes_master + s->bytes_optimizer,
                     16 * want);
    assert_true(isfinite(s->flops_total) && s->flops_total > 0);
    assert_rel_close(s->flops_total, 3 * s->flops_forward, 1e-12);
    /* forward ~ 2 x tokens x params for the dense layers: within 10% */
    assert_rel_close(s->flops_forward, 2.0 * 2048 * (double)want, 0.10);
    ml_ledger_destroy(l);
    ml_model_destroy(m);
}

/* ml_config_check: the defaults pass; each limit names its key. */
static void test_config_check(void **state)
{
    (void)state;
    ml_config c = ml_config_defaults();
    ml_error e;
    memset(&e, 0, sizeof e);
    assert_int_equal(ml_config_check(&c, &e), ML_OK);
    assert_null(ml_config_problem(&c));
    c.training.seq_len = 0;
    assert_int_equal(ml_config_check(&c, &e), ML_RANGE);
    assert_string_equal(e.msg, "training.seq_len: must be between 1 and 268435456");
    c = ml_config_defaults();
    c.training.eval_batch = (1ull << 24) + 1;
    assert_int_equal(ml_config_check(&c, &e), ML_RANGE);
    assert_string_equal(e.msg, "training.eval_batch: must be between 1 and 16777216");
    c = ml_config_defaults();
    c.training.logits = ML_LOGITS_FUSED;
    assert_int_equal(ml_config_check(&c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "not modelled yet"));
}

/* The points CSV's limits as a file meets them (docs/calibration.md): the
 * shortest row is 4 bytes, so 1,000,000 rows fit 4 MB, far inside the
 * 16 MiB every input may have; the next row is refused by the row limit, a
 * 16 MiB + 1 file by the file limit, each with its own message. */
static void test_points_limits_file(void **state)
{
    (void)state;
    char path[] = "/tmp/memledger-points-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    fputs("micro_batch,peak\n", f);
    for (size_t i = 0; i < 1000000; i++)
        fprintf(f, "%zu,%zu\n", i % 9 + 1, i % 7 + 1);
    fflush(f);
    ml_point *p = NULL;
    size_t n = 0;
    ml_error e;
    assert_int_equal(ml_points_load_csv(path, &p, &n, &e), ML_OK);
    assert_int_equal(n, 1000000);
    free(p);
    p = NULL;
    fputs("1,1\n", f);
    fflush(f);
    assert_int_equal(ml_points_load_csv(path, &p, &n, &e), ML_RANGE);
    assert_int_equal(e.line, 1000002);
    assert_non_null(strstr(e.msg, "more than 1000000 points"));
    assert_null(p);
    /* past 16 MiB: a long comment after the header */
    assert_int_equal(fseek(f, 0, SEEK_END), 0);
    long have = ftell(f);
    assert_true(have > 0);
    for (long k = have; k <= (16l << 20); k++)
        fputc('#', f);
    fclose(f);
    assert_int_equal(ml_points_load_csv(path, &p, &n, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "file larger than 16 MiB"));
    assert_null(p);
    remove(path);
}

/* YAML tags are refused like anchors and aliases, core tags included, at
 * the tagged node ("!!str 2" and "!!float 2" passed as 2). */
static void test_yaml_tags(void **state)
{
    (void)state;
    static const char pre[] = "model:\n  type: sequential\n";
    struct {
        const char *y, *tag;
        unsigned line, col;
    } cases[] = {
        {"  layers: !!float 2\n", "tag:yaml.org,2002:float", 3, 11},
        {"  name: !!str 2\n", "tag:yaml.org,2002:str", 3, 9},
        {"  name: ! x\n", "(here !)", 3, 9},
        {"  input: !shape [1]\n", "(here !shape)", 3, 10},
        {"  x: !!map {a: 1}\n", "tag:yaml.org,2002:map", 3, 6},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char buf[256];
        int len = snprintf(buf, sizeof buf, "%s%s", pre, cases[i].y);
        ml_model *m = NULL;
        ml_error e;
        ml_status st = ml_model_load_string(buf, (size_t)len, "tags.yaml", &m, &e);
        if (st != ML_SYNTAX)
            fail_msg("case %zu: got %s (%s), expected ML_SYNTAX", i, ml_status_name(st), e.msg);
        if (!strstr(e.msg, "YAML tags") || !strstr(e.msg, cases[i].tag))
            fail_msg("case %zu: '%s' lacks '%s'", i, e.msg, cases[i].tag);
        if (e.line != cases[i].line || e.col != cases[i].col)
            fail_msg("case %zu: at %u:%u, expected %u:%u", i, e.line, e.col, cases[i].line,
                     cases[i].col);
        assert_null(m);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_size),         cmocka_unit_test(test_nesting_depth),
        cmocka_unit_test(test_node_count),        cmocka_unit_test(test_residual_depth),
        cmocka_unit_test(test_value_bounds),      cmocka_unit_test(test_trillion_parameters),
        cmocka_unit_test(test_config_check),
        cmocka_unit_test(test_points_count),
        cmocka_unit_test(test_points_limits_file),
        cmocka_unit_test(test_yaml_tags),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
