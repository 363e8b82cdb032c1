/* Resource limits on input, each with its message (docs/robustness.md), and
 * FLOPs that stay finite for a trillion-parameter model. */
#include <stdlib.h>

#include "harness.h"
#include "util/error.h" /* ml__read_file */
#include "util/grow.h"

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
    c.training.logits = ML_LOGITS_FUSED; /* the model decides (test_fused.c) */
    assert_int_equal(ml_config_check(&c, &e), ML_OK);
    c.training.logits = ML_LOGITS_KEPT;
    c.training.logits_chunk = 8;
    assert_int_equal(ml_config_check(&c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "training.logits_chunk: only with training.logits fused"));
}

/* Each factor of the effective batch at its limit (2^24,
 * 2^20, 2^20) makes 2^24 * 2^20 * 2^20 = 2^64, one past UINT64_MAX: it
 * wrapped to 0 in --emit deepspeed's train_batch_size. Refused by name; one
 * device fewer gives 2^64 - 2^44 = 18446726481523507200, which fits. */
static void test_effective_batch_limit(void **state)
{
    (void)state;
    ml_config c = ml_config_defaults();
    c.training.micro_batch = 1ull << 24;
    c.training.grad_accum = 1ull << 20;
    c.training.data_parallel = 1ull << 20;
    ml_error e;
    memset(&e, 0, sizeof e);
    assert_int_equal(ml_config_check(&c, &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "(the effective batch) must be below 2^64"));
    c.training.data_parallel = (1ull << 20) - 1;
    assert_int_equal(ml_config_check(&c, &e), ML_OK);
    /* the figure emit-deepspeed-batch-below-2e64 holds the emitted
     * train_batch_size to */
    _Static_assert((1ull << 24) * (1ull << 20) * ((1ull << 20) - 1) == 18446726481523507200ull,
                   "2^64 - 2^44");
}

/* One range per whole-number setting: the YAML loader takes the key at
 * the top of ml_config_range's range and refuses one more (with the key's
 * position), and ml_config_problem refuses the same value by the key's
 * name. The keys written out here, not taken from the table. */
static void test_config_ranges_agree(void **state)
{
    (void)state;
    static const char *const keys[] = {"micro_batch", "seq_len", "grad_accum",
                                       "data_parallel", "zero", "reduce_bucket_size",
                                       "allgather_bucket_size", "eval_batch", "eval_seq_len"};
    static const char base[] = "name: t\nmodel: {type: decoder, layers: 1, hidden: 8, heads: 2, "
                               "vocab: 16, max_positions: 8}\n";
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        char key[64], text[512];
        snprintf(key, sizeof key, "training.%s", keys[i]);
        uint64_t lo = 0, hi = 0;
        assert_true(ml_config_range(key, &lo, &hi));
        assert_true(lo <= hi);
        /* zero needs devices to shard over, eval_seq_len an evaluation pass */
        const char *extra = !strcmp(keys[i], "zero")           ? ", data_parallel: 2"
                            : !strcmp(keys[i], "eval_seq_len") ? ", eval_batch: 1"
                                                               : "";
        for (int over = 0; over <= 1; over++) {
            int n = snprintf(text, sizeof text, "%straining: {%s: %llu%s}\n", base, keys[i],
                             (unsigned long long)(hi + (uint64_t)over), extra);
            ml_model *m = NULL;
            ml_error e;
            ml_status st = ml_model_load_string(text, (size_t)n, "r.yaml", &m, &e);
            if (over) {
                assert_int_equal(st, ML_RANGE);
                assert_int_equal(e.line, 3);
                assert_non_null(strstr(e.msg, key));
                ml_config c = ml_config_defaults();
                /* the same value, set through the API */
                if (!strcmp(keys[i], "zero"))
                    c.training.zero = (unsigned)(hi + 1);
                else if (!strcmp(keys[i], "micro_batch"))
                    c.training.micro_batch = hi + 1;
                else if (!strcmp(keys[i], "seq_len"))
                    c.training.seq_len = hi + 1;
                else if (!strcmp(keys[i], "grad_accum"))
                    c.training.grad_accum = hi + 1;
                else if (!strcmp(keys[i], "data_parallel"))
                    c.training.data_parallel = hi + 1;
                else if (!strcmp(keys[i], "reduce_bucket_size"))
                    c.training.reduce_bucket = hi + 1;
                else if (!strcmp(keys[i], "allgather_bucket_size"))
                    c.training.allgather_bucket = hi + 1;
                else if (!strcmp(keys[i], "eval_batch"))
                    c.training.eval_batch = hi + 1;
                else
                    c.training.eval_seq_len = hi + 1;
                const char *bad = ml_config_problem(&c);
                assert_non_null(bad);
                assert_int_equal(strncmp(bad, key, strlen(key)), 0);
            } else {
                if (st != ML_OK)
                    fail_msg("%s at %llu: %s", key, (unsigned long long)hi, e.msg);
                ml_model_destroy(m);
            }
        }
    }
    uint64_t lo, hi;
    assert_false(ml_config_range("training.precision", &lo, &hi));
}

/* No library message names a command-line flag: the CLI adds the flag's
 * name (src/cli/flags.c). Every problem ml_config_problem can state. */
static void test_config_messages_name_keys(void **state)
{
    (void)state;
    ml_config cs[14];
    for (size_t i = 0; i < 14; i++)
        cs[i] = ml_config_defaults();
    cs[0].training.micro_batch = 0;
    cs[1].training.zero = 4;
    cs[2].training.offload = ML_OFFLOAD_PARAMS;
    cs[3].training.checkpoint.kind = ML_CKPT_OPTIMAL;
    cs[4].device.present = true;
    cs[4].device.memory = 10;
    cs[4].device.budget = 11;
    cs[5].device.present = true;
    cs[5].device.memory = 10;
    cs[5].device.runtime_reserve = 10;
    cs[6].training.checkpoint.kind = ML_CKPT_EVERY;
    cs[7].training.logits_chunk = 8;
    cs[8].device.efficiency = 0;
    cs[9].device.fragmentation = 2;
    cs[10].training.eval_seq_len = 1ull << 40;
    cs[11].training.reduce_bucket = 0;
    cs[12].device.interconnect_gbps = -1;
    cs[13].device.pcie_gbps = NAN;
    for (size_t i = 0; i < 14; i++) {
        const char *bad = ml_config_problem(&cs[i]);
        assert_non_null(bad);
        if (strstr(bad, "--"))
            fail_msg("config %zu: '%s' names a flag", i, bad);
    }
    /* the library takes the efficiency the flag and the file take: 1e-6
     * to 1 */
    ml_config e = ml_config_defaults();
    e.device.efficiency = 1e-7;
    assert_non_null(ml_config_problem(&e));
    e.device.efficiency = 1e-6;
    assert_null(ml_config_problem(&e));
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

/* Every input's reader holds the 16 MiB limit to the byte: a file of 16
 * MiB is read, one of 16 MiB + 1 is refused (the reader had read up to 32
 * MiB, its buffer's next doubling, before refusing). */
static void test_read_file_limit(void **state)
{
    (void)state;
    char path[] = "/tmp/memledger-big-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    assert_non_null(f);
    for (long k = 0; k < (16l << 20); k++)
        fputc('#', f);
    fflush(f);
    size_t len = 0;
    ml_error e;
    char *text = ml__read_file(path, &len, &e);
    assert_non_null(text);
    assert_int_equal(len, 16u << 20);
    free(text);
    fputc('#', f);
    fclose(f);
    assert_null(ml__read_file(path, &len, &e));
    assert_int_equal(e.code, ML_RANGE);
    assert_non_null(strstr(e.msg, "file larger than 16 MiB"));
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

/* ml_grow_to: from the first capacity (64) doubled until n fits: 100
 * takes 128, 129 then 256; n within the capacity keeps the array; a
 * capacity past SIZE_MAX bytes is refused with the array untouched. */
static void test_grow_to(void **state)
{
    (void)state;
    size_t cap = 0;
    uint64_t *v = ml_grow_to(NULL, 100, &cap, sizeof *v, 64);
    assert_non_null(v);
    assert_int_equal(cap, 128);
    v[99] = 7;
    assert_ptr_equal(ml_grow_to(v, 128, &cap, sizeof *v, 64), v);
    assert_int_equal(cap, 128);
    uint64_t *w = ml_grow_to(v, 129, &cap, sizeof *w, 64);
    assert_non_null(w);
    assert_int_equal(cap, 256);
    assert_int_equal(w[99], 7);
    assert_null(ml_grow_to(w, SIZE_MAX / 4, &cap, sizeof *w, 64));
    assert_int_equal(cap, 256);
    free(w);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_file_size),         cmocka_unit_test(test_nesting_depth),
        cmocka_unit_test(test_node_count),        cmocka_unit_test(test_residual_depth),
        cmocka_unit_test(test_value_bounds),      cmocka_unit_test(test_trillion_parameters),
        cmocka_unit_test(test_config_check),
        cmocka_unit_test(test_effective_batch_limit),
        cmocka_unit_test(test_config_ranges_agree),
        cmocka_unit_test(test_config_messages_name_keys),
        cmocka_unit_test(test_points_count),
        cmocka_unit_test(test_points_limits_file),
        cmocka_unit_test(test_read_file_limit),
        cmocka_unit_test(test_yaml_tags),
        cmocka_unit_test(test_grow_to),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
