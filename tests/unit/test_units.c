/* Sizes, enum names, checkpoint policies and unit formatting. */
#include "harness.h"

static uint64_t size_ok(const char *s)
{
    uint64_t v = 0;
    ml_error e;
    memset(&e, 0, sizeof e);
    if (ml_parse_size(s, &v, &e) != ML_OK)
        fail_msg("'%s' rejected: %s", s, e.msg);
    return v;
}

static void size_bad(const char *s, ml_status want, const char *msg_part)
{
    uint64_t v = 12345;
    ml_error e;
    memset(&e, 0, sizeof e);
    ml_status st = ml_parse_size(s, &v, &e);
    assert_int_equal(st, want);
    assert_int_equal(v, 12345); /* output untouched on failure */
    if (!strstr(e.msg, msg_part))
        fail_msg("message for '%s' is '%s', expected it to mention '%s'", s, e.msg, msg_part);
}

static void test_binary_and_decimal_sizes(void **state)
{
    (void)state;
    assert_int_equal(size_ok("8GiB"), 8ull * 1024 * 1024 * 1024);
    assert_int_equal(size_ok("8 GiB"), 8589934592ull);
    /* 6.5 GiB = 6.5 * 2^30 = 6979321856 exactly */
    assert_int_equal(size_ok("6.5GiB"), 6979321856ull);
    assert_int_equal(size_ok("512MiB"), 536870912ull);
    assert_int_equal(size_ok("1KiB"), 1024ull);
    assert_int_equal(size_ok("2TiB"), 2ull << 40);
    assert_int_equal(size_ok("16GB"), 16000000000ull);
    assert_int_equal(size_ok("1.5MB"), 1500000ull);
    assert_int_equal(size_ok("3KB"), 3000ull);
    assert_int_equal(size_ok("1024"), 1024ull);
    assert_int_equal(size_ok("1024B"), 1024ull);
    assert_int_equal(size_ok("0.075GiB"), 80530636ull); /* floor(0.075 * 2^30) */
    /* every digit of the fraction counts: 0.01953125 GiB = 2^30 x 5 / 256 =
     * 20 MiB exactly (eight decimals); 7.999999999 GiB = 8 GiB - 10^-9 GiB,
     * floor(8,589,934,592 - 1.0737...) = 8,589,934,590; a 1 in the 25th
     * decimal of a GiB is below a byte */
    assert_int_equal(size_ok("0.01953125GiB"), 20971520ull);
    assert_int_equal(size_ok("7.999999999GiB"), 8589934590ull);
    assert_int_equal(size_ok("1.0000000000000000000000001GiB"), 1073741824ull);
    assert_int_equal(size_ok("0.123456789123TB"), 123456789123ull);
}

static void test_bad_sizes(void **state)
{
    (void)state;
    size_bad("-1GiB", ML_RANGE, "negative");
    size_bad("0GiB", ML_RANGE, "zero");
    size_bad("8 XB", ML_USAGE, "unknown unit");
    size_bad("8gib", ML_USAGE, "unknown unit");
    size_bad("GiB", ML_USAGE, "not a size");
    size_bad("", ML_USAGE, "not a size");
    size_bad("99999999999999999999", ML_RANGE, "64 bits");
    size_bad("17179869184GiB", ML_RANGE, "64 bits"); /* 2^34 * 2^30 = 2^64 */
    size_bad("0.5B", ML_USAGE, "fraction of a byte");
    size_bad("1.0000001B", ML_USAGE, "fraction of a byte"); /* (the 7th decimal too) */
    size_bad("0.0000000001GiB", ML_RANGE, "below one byte"); /* 0.107 B, rounded down */
}

static void test_checkpoint_policies(void **state)
{
    (void)state;
    ml_checkpoint c;
    ml_error e;
    char buf[128];
    const char *ok[] = {"none", "full", "sqrt", "selective", "every-2", "every-12", "[0, 3, 6]",
                        "[5]", "[0-3] [8]", "[4-7]", "[2] [5]"};
    const ml_checkpoint_kind kinds[] = {ML_CKPT_NONE, ML_CKPT_FULL, ML_CKPT_SQRT,
                                        ML_CKPT_SELECTIVE, ML_CKPT_EVERY, ML_CKPT_EVERY,
                                        ML_CKPT_LIST, ML_CKPT_LIST,
                                        ML_CKPT_SEGMENTS, ML_CKPT_SEGMENTS, ML_CKPT_SEGMENTS};
    for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
        assert_int_equal(ml_parse_checkpoint(ok[i], &c, &e), ML_OK);
        assert_int_equal(c.kind, kinds[i]);
        ml_checkpoint_format(&c, buf, sizeof buf);
        assert_string_equal(buf, ok[i]); /* round trip */
    }
    /* an empty list checkpoints nothing: none, by that name */
    assert_int_equal(ml_parse_checkpoint("[]", &c, &e), ML_OK);
    assert_int_equal(c.kind, ML_CKPT_NONE);
    ml_checkpoint_format(&c, buf, sizeof buf);
    assert_string_equal(buf, "none");
    assert_int_equal(ml_parse_checkpoint("every-3", &c, &e), ML_OK);
    assert_int_equal(c.every, 3);
    assert_int_equal(ml_parse_checkpoint("[0, 3, 6]", &c, &e), ML_OK);
    assert_int_equal(c.count, 3);
    assert_int_equal(c.blocks[2], 6);
    /* segments as an optimal plan prints them: first and last block of each */
    assert_int_equal(ml_parse_checkpoint("optimal: [0-3] [8] [10 - 11]", &c, &e), ML_OK);
    assert_int_equal(c.kind, ML_CKPT_SEGMENTS);
    assert_int_equal(c.count, 3);
    const uint32_t pairs[] = {0, 3, 8, 8, 10, 11};
    for (size_t i = 0; i < 6; i++)
        assert_int_equal(c.blocks[i], pairs[i]);
    ml_checkpoint_format(&c, buf, sizeof buf);
    assert_string_equal(buf, "[0-3] [8] [10-11]");
    /* an optimal plan that checkpoints nothing prints "optimal: none" */
    assert_int_equal(ml_parse_checkpoint("optimal: none", &c, &e), ML_OK);
    assert_int_equal(c.kind, ML_CKPT_NONE);
    const char *bad[] = {"every-0", "every-", "every-x", "all", "[0, x]", "[1", "FULL",
                         "[3-1]", "[0-3] [2]", "[0-3] [3-4]", "optimal:", "[0-3] 8", "[0-]"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++)
        assert_int_not_equal(ml_parse_checkpoint(bad[i], &c, &e), ML_OK);
}

static void test_enum_names_round_trip(void **state)
{
    (void)state;
    /* the profile's layer kinds: one table (memledger/calib.h) */
    for (int k = 0; k < ML_PK_COUNT; k++) {
        ml_profile_kind_id q;
        assert_true(ml_profile_kind_parse(ml_profile_kind_name((ml_profile_kind_id)k), &q));
        assert_int_equal(q, k);
    }
    assert_string_equal(ml_profile_kind_name(ML_PK_TRANSFORMER_BLOCK), "transformer_block");
    assert_null(ml_profile_kind_name(ML_PK_COUNT));
    ml_profile_kind_id none;
    assert_false(ml_profile_kind_parse("block", &none));
    for (int p = 0; p < ML_PREC_COUNT; p++) {
        ml_precision q;
        assert_true(ml_precision_parse(ml_precision_name((ml_precision)p), &q));
        assert_int_equal(q, p);
    }
    for (int o = 0; o < ML_OPT_COUNT; o++) {
        ml_optimizer q;
        assert_true(ml_optimizer_parse(ml_optimizer_name((ml_optimizer)o), &q));
        assert_int_equal(q, o);
    }
    ml_precision q;
    assert_false(ml_precision_parse("fp8", &q));
    assert_string_equal(ml_status_name(ML_SCHEMA), "ML_SCHEMA");
}

static void test_format_bytes(void **state)
{
    (void)state;
    char b[32];
    ml_format_bytes(12, b, sizeof b);
    assert_string_equal(b, "12 B");
    ml_format_bytes(1536, b, sizeof b);
    assert_string_equal(b, "1.50 KiB");
    /* 320,000,000 B / 2^20 = 305.17578125 MiB: the design notes' "about 305 MiB" */
    ml_format_bytes(320000000ull, b, sizeof b);
    assert_string_equal(b, "305.18 MiB");
    ml_format_bytes(6979321856ull, b, sizeof b);
    assert_string_equal(b, "6.50 GiB");
    ml_format_flops(3.69e12, b, sizeof b);
    assert_string_equal(b, "3.69 TFLOP");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_binary_and_decimal_sizes),
        cmocka_unit_test(test_bad_sizes),
        cmocka_unit_test(test_checkpoint_policies),
        cmocka_unit_test(test_enum_names_round_trip),
        cmocka_unit_test(test_format_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
