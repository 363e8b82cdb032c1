/* ml_config_set and the verbs' JSON reports in memory (json.h): each
 * setting read as its flag reads it, order rules, the job's verbs and
 * calibrate --points' fit, with values derived by hand. */
#include "harness.h"
#include "report/svg_internal.h"
#include "util/utf8.h"

static void config_set_values(void **state)
{
    (void)state;
    ml_config c = ml_config_defaults();
    ml_error e;
    assert_int_equal(ml_config_set(&c, "training.micro_batch", "4", &e), ML_OK);
    assert_int_equal(c.training.micro_batch, 4);
    assert_int_equal(ml_config_set(&c, "training.zero", "fsdp", &e), ML_OK);
    assert_int_equal(c.training.zero, 3);
    assert_int_equal(ml_config_set(&c, "training.precision", "amp-bf16", &e), ML_OK);
    assert_int_equal(c.training.precision, ML_PREC_AMP_BF16);
    assert_int_equal(ml_config_set(&c, "training.checkpoint", "every-2", &e), ML_OK);
    assert_int_equal(c.training.checkpoint.kind, ML_CKPT_EVERY);
    assert_int_equal(c.training.checkpoint.every, 2);
    assert_int_equal(ml_config_set(&c, "training.logits", "released", &e), ML_OK);
    assert_int_equal(c.training.logits, ML_LOGITS_RELEASED);
    assert_int_equal(ml_config_set(&c, "device.memory", "8GiB", &e), ML_OK);
    assert_true(c.device.present);
    assert_int_equal(c.device.memory, 8ull << 30);
    assert_int_equal(ml_config_set(&c, "device.budget", "6.5GiB", &e), ML_OK);
    assert_int_equal(c.device.budget, 13ull << 29);
    /* a new capacity drops the budget line, as --device does */
    assert_int_equal(ml_config_set(&c, "device.memory", "16GB", &e), ML_OK);
    assert_int_equal(c.device.memory, 16000000000ull);
    assert_int_equal(c.device.budget, 0);
    assert_int_equal(ml_config_set(&c, "device.max_split_size", "20MiB", &e), ML_OK);
    assert_int_equal(c.device.max_split_size, 20ull << 20);
    assert_int_equal(ml_config_set(&c, "device.max_split_size", "128MiB", &e), ML_OK);
    assert_int_equal(c.device.max_split_size, 128ull << 20);
    assert_int_equal(ml_config_set(&c, "device.allocator", "expandable", &e), ML_OK);
    assert_int_equal(c.device.allocator, ML_ALLOCATOR_EXPANDABLE);
    assert_int_equal(ml_config_set(&c, "device.efficiency", "0.5", &e), ML_OK);
    assert_rel_close(c.device.efficiency, 0.5, 0);
}

static void config_set_refusals(void **state)
{
    (void)state;
    ml_config c = ml_config_defaults();
    ml_config before = c;
    ml_error e;
    assert_int_equal(ml_config_set(&c, "training.micro_batch", "0", &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "training.micro_batch: '0' is not a whole number"));
    assert_int_equal(e.line, 0);
    assert_int_equal(ml_config_set(&c, "training.micro_batch", "4x", &e), ML_RANGE);
    assert_int_equal(ml_config_set(&c, "device.budget", "6GiB", &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "needs a device"));
    assert_int_equal(ml_config_set(&c, "training.eval_seq_len", "128", &e), ML_USAGE);
    assert_int_equal(ml_config_set(&c, "training.precision", "fp8", &e), ML_USAGE);
    assert_int_equal(ml_config_set(&c, "training.logits", "sparse", &e), ML_USAGE);
    assert_int_equal(ml_config_set(&c, "training.hidden", "3", &e), ML_USAGE);
    assert_int_equal(ml_config_set(&c, "micro_batch", "3", &e), ML_USAGE);
    /* (PyTorch 2.9+'s least max_split_size_mb is 20, kLargeBuffer) */
    assert_int_equal(ml_config_set(&c, "device.max_split_size", "19MiB", &e), ML_RANGE);
    /* at most 1 EiB, as the model file's key and --max-split-size */
    assert_int_equal(ml_config_set(&c, "device.max_split_size", "1048577TiB", &e), ML_RANGE);
    assert_non_null(strstr(e.msg, "must be at most 1 EiB"));
    assert_int_equal(ml_config_set(&c, "device.max_split_size", "1048576TiB", &e), ML_OK);
    c.device.max_split_size = before.device.max_split_size;
    assert_int_equal(ml_config_set(&c, "device.efficiency", "2", &e), ML_RANGE);
    assert_int_equal(ml_config_set(&c, "device.memory", "-1GiB", &e), ML_RANGE);
    assert_int_equal(ml_config_set(&c, "training.checkpoint", "every-0", &e), ML_USAGE);
    assert_int_equal(ml_config_set(NULL, "training.zero", "1", &e), ML_USAGE);
    assert_int_equal(ml_config_set(&c, "training.zero", "1", NULL), ML_OK);
    c.training.zero = before.training.zero;
    assert_memory_equal(&c, &before, sizeof c);
}

/* A job's report, or fail. */
static char *job_json(ml_job *j, ml_status (*verb)(const ml_job *, char **, size_t *, ml_error *))
{
    char *s = NULL;
    size_t n = 0;
    ml_error e;
    ml_status st = verb(j, &s, &n, &e);
    if (st)
        fail_msg("%s: %s", ml_status_name(st), e.msg);
    assert_int_equal(strlen(s), n);
    return s;
}

static void job_verbs(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    ml_job *j = NULL;
    ml_error e;
    assert_int_equal(ml_job_create(m, &j, &e), ML_OK);
    assert_int_equal(ml_job_set(j, "training.micro_batch", "4", &e), ML_OK);
    /* the README's parameter count: 50257 x 768 + 1024 x 768 embeddings,
     * 12 x 7,087,872 per block, 1,536 for the final LayerNorm */
    char *s = job_json(j, ml_job_plan_json);
    assert_int_equal(50257ull * 768 + 1024 * 768 + 12 * 7087872ull + 1536, 124439808ull);
    assert_non_null(strstr(s, "\"params\": 124439808,"));
    assert_non_null(strstr(s, "\"micro_batch\": 4,"));
    ml_json_free(s);
    assert_int_equal(ml_job_set(j, "device.memory", "8GiB", &e), ML_OK);
    /* fit searches the micro-batch: one set is refused, never ignored */
    assert_int_equal(ml_job_fit_json(j, &s, NULL, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "training.micro_batch: fit searches"));
    ml_job_destroy(j);
    assert_int_equal(ml_job_create(m, &j, &e), ML_OK);
    assert_int_equal(ml_job_set(j, "device.memory", "8GiB", &e), ML_OK);
    assert_int_equal(ml_job_set(j, "global_batch", "0", &e), ML_RANGE);
    assert_int_equal(ml_job_set(j, "global_batch", "64", &e), ML_OK);
    assert_int_equal(ml_job_set(j, "training.checkpoint", "auto", &e), ML_OK);
    s = job_json(j, ml_job_fit_json);
    assert_non_null(strstr(s, "\"global_batch\": 64"));
    ml_json_free(s);
    assert_int_equal(ml_job_plan_json(j, &s, NULL, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "auto is for fit"));
    assert_int_equal(ml_job_set(j, "training.checkpoint", "none", &e), ML_OK);
    /* compare plans every policy: a checkpoint set is refused */
    assert_int_equal(ml_job_compare_json(j, &s, NULL, &e), ML_USAGE);
    assert_non_null(strstr(e.msg, "compare plans every checkpoint policy"));
    ml_job_destroy(j);
    assert_int_equal(ml_job_create(m, &j, &e), ML_OK);
    assert_int_equal(ml_job_set(j, "device.memory", "8GiB", &e), ML_OK);
    s = job_json(j, ml_job_compare_json);
    assert_int_equal(s[0], '[');
    assert_non_null(strstr(s, "\"checkpoint\": \"selective\""));
    ml_json_free(s);
    s = job_json(j, ml_job_timeline_json);
    assert_int_equal(s[0], '[');
    ml_json_free(s);
    /* the drawn timeline is what ml_report_timeline_svg draws of the
     * job's config, byte for byte */
    s = job_json(j, ml_job_timeline_svg);
    {
        ml_config c = ml_model_config(m);
        assert_int_equal(ml_config_set(&c, "device.memory", "8GiB", &e), ML_OK);
        ml_ledger *l = NULL;
        assert_int_equal(ml_ledger_evaluate(m, &c, true, &l, &e), ML_OK);
        char *buf = NULL;
        size_t n = 0;
        FILE *f = open_memstream(&buf, &n);
        assert_non_null(f);
        assert_int_equal(ml_report_timeline_svg(f, m, &c, l), 0);
        fclose(f);
        assert_non_null(strstr(s, "<svg"));
        assert_string_equal(s, buf);
        free(buf);
        ml_ledger_destroy(l);
    }
    ml_json_free(s);
    assert_int_equal(ml_job_set(j, "calib", "/nonexistent/profile.yaml", &e), ML_IO);
    assert_int_equal(ml_job_set(j, "device.peak", "1", &e), ML_USAGE);
    ml_job_destroy(j);
    ml_job_destroy(NULL);
    ml_json_free(NULL);
    ml_model_destroy(m);
}

/* The pairings the command line refuses are refused by every verb of a
 * job too, whatever order the keys came in, naming the keys. */
static void job_pairings(void **state)
{
    (void)state;
    ml_model *m = load_preset("gpt2-small");
    static const struct {
        const char *k1, *v1, *k2, *v2;
        ml_status (*verb)(const ml_job *, char **, size_t *, ml_error *);
        const char *says;
    } cases[] = {
        {"parallel.layout", "tp2.dp2", "parallel.tp", "4", ml_job_plan_json,
         "parallel.layout: the layout is given once; drop parallel.tp"},
        {"training.data_parallel", "4", "parallel.layout", "tp2", ml_job_compare_json,
         "drop training.data_parallel"},
        {"global_batch", "64", "training.grad_accum", "4", ml_job_fit_json,
         "training.grad_accum: fit's global_batch derives"},
        {"device.memory", "80GiB", "max_micro_batch", "8", ml_job_plan_json,
         "max_micro_batch: bounds fit's search"},
        {"training.reduce_bucket_size", "5", "training.precision", "fp32", ml_job_plan_json,
         "training.reduce_bucket_size: sizes DeepSpeed's ZeRO buckets"},
        {"device.blas_workspace", "1MiB", "device.allocator", "none", ml_job_timeline_json,
         "device.blas_workspace: applies to a simulated allocator only"},
        {"parallel.layout", "tp2", "parallel.dp", "4", ml_job_plan_json, "drop parallel.dp"},
        /* the drawn timeline (the web page's svg) refuses them as the JSON one does */
        {"training.allgather_bucket_size", "5", "training.precision", "fp32",
         ml_job_timeline_svg, "training.allgather_bucket_size: sizes DeepSpeed's ZeRO buckets"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        ml_job *j = NULL;
        ml_error e;
        char *s = NULL;
        assert_int_equal(ml_job_create(m, &j, &e), ML_OK);
        assert_int_equal(ml_job_set(j, "device.memory", "80GiB", &e), ML_OK);
        assert_int_equal(ml_job_set(j, cases[i].k1, cases[i].v1, &e), ML_OK);
        assert_int_equal(ml_job_set(j, cases[i].k2, cases[i].v2, &e), ML_OK);
        assert_int_equal(cases[i].verb(j, &s, NULL, &e), ML_USAGE);
        assert_null(s);
        if (!strstr(e.msg, cases[i].says))
            fail_msg("case %zu: %s", i, e.msg);
        ml_job_destroy(j);
    }
    /* the same sizes with ZeRO: used, so planned */
    ml_job *j = NULL;
    ml_error e;
    assert_int_equal(ml_job_create(m, &j, &e), ML_OK);
    assert_int_equal(ml_job_set(j, "training.reduce_bucket_size", "5", &e), ML_OK);
    assert_int_equal(ml_job_set(j, "training.zero", "2", &e), ML_OK);
    ml_json_free(job_json(j, ml_job_plan_json));
    ml_job_destroy(j);
    ml_model_destroy(m);
}

/* fit needs a device, and a model without one has none */
static void job_no_device(void **state)
{
    (void)state;
    ml_model *m = load_str("name: t\nmodel:\n  type: sequential\n  input: [10]\n"
                           "  layers:\n    - linear: {out: 10}\n  loss: mse\n");
    ml_job *j = NULL;
    ml_error e;
    assert_int_equal(ml_job_create(m, &j, &e), ML_OK);
    char *s = NULL;
    assert_int_equal(ml_job_fit_json(j, &s, NULL, &e), ML_USAGE);
    assert_null(s);
    /* no job or no place for the answer: refused, not dereferenced */
    assert_int_equal(ml_job_plan_json(NULL, &s, NULL, &e), ML_USAGE);
    assert_int_equal(ml_job_compare_json(j, NULL, NULL, &e), ML_USAGE);
    assert_int_equal(ml_job_timeline_json(NULL, NULL, NULL, NULL), ML_USAGE);
    assert_null(s);
    /* 10 x 10 weights and 10 biases */
    s = job_json(j, ml_job_plan_json);
    assert_non_null(strstr(s, "\"params\": 110,"));
    ml_json_free(s);
    ml_job_destroy(j);
    ml_model_destroy(m);
}

/* s through the JSON string writer. */
static char *json_of(const char *s)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    ml_json_put_string(f, s);
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* JSON text is UTF-8 (RFC 8259): well-formed sequences pass as they are,
 * anything else becomes U+FFFD, one per byte (RFC 3629's table of
 * well-formed sequences decides, not the lead byte alone). */
static void json_strings_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"plain \"q\" \\ \t", "\"plain \\\"q\\\" \\\\ \\u0009\""},
        {"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80", "\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\""},
        {"a\xff" "b", "\"a\\ufffdb\""},                        /* never a lead byte */
        {"\xc0\xaf", "\"\\ufffd\\ufffd\""},                    /* overlong '/' */
        {"\xed\xa0\x80", "\"\\ufffd\\ufffd\\ufffd\""},           /* a surrogate, U+D800 */
        {"\xf4\x90\x80\x80", "\"\\ufffd\\ufffd\\ufffd\\ufffd\""}, /* U+110000 */
        {"\xe2\x82", "\"\\ufffd\\ufffd\""},                    /* cut short by the end */
        {"\x7f", "\"\x7f\""},                                  /* DEL is JSON text */
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = json_of(cases[i].in);
        if (strcmp(got, cases[i].out))
            fail_msg("case %zu: %s, expected %s", i, got, cases[i].out);
        free(got);
    }
    assert_int_equal(ml_utf8_len((const unsigned char *)"\xf0\x90\x80\x80"), 4); /* U+10000 */
    assert_int_equal(ml_utf8_len((const unsigned char *)"\xe0\x9f\xbf"), 0);      /* overlong */
}

/* s through the SVG/HTML text writer. */
static char *svg_text_of(const char *s)
{
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    ml_svg_escape(f, s);
    assert_int_equal(fclose(f), 0);
    return buf;
}

/* SVG text holds only what XML 1.0's Char production
 * (section 2.2) allows: #x9 | #xA | #xD | [#x20-#xD7FF] | [#xE000-#xFFFD] |
 * [#x10000-#x10FFFF]. U+FFFE (EF BF BE) and U+FFFF (EF BF BF) are outside
 * it and become U+FFFD (EF BF BD), as does each byte that is not UTF-8;
 * U+FFFD itself and U+10000 stay; control bytes are dropped; the five
 * specials are entities. */
static void svg_text_xml_chars(void **state)
{
    (void)state;
    static const struct {
        const char *in, *out;
    } cases[] = {
        {"a\xef\xbf\xbe" "b", "a\xef\xbf\xbd" "b"},                   /* U+FFFE */
        {"\xef\xbf\xbf", "\xef\xbf\xbd"},                             /* U+FFFF */
        {"\xef\xbf\xbd \xf0\x90\x80\x80", "\xef\xbf\xbd \xf0\x90\x80\x80"}, /* allowed */
        {"x\xff", "x\xef\xbf\xbd"},                                   /* not UTF-8 */
        {"\xed\xa0\x80", "\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd"},     /* U+D800 */
        {"t\x01\x1b[31m", "t[31m"},                                   /* controls */
        {"<&>\"'", "&lt;&amp;&gt;&quot;&apos;"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char *got = svg_text_of(cases[i].in);
        if (strcmp(got, cases[i].out))
            fail_msg("case %zu: '%s', expected '%s'", i, got, cases[i].out);
        free(got);
    }
}

/* Text widths from DejaVu Sans's advance widths (2048 units per em, its
 * hmtx table, as fontTools or FontForge list them): H 1540, e 1260, l 569,
 * o 1253, space 651; anything outside ASCII counts as the font's widest
 * advance, 3838, so that a width is an upper bound. */
static void svg_text_widths(void **state)
{
    (void)state;
    /* "Hello" at 12: (1540 + 1260 + 569 + 569 + 1253) x 12 / 2048 = 30.416 */
    assert_rel_close(ml__svg_text_width("Hello", 5, 12, false), 5191.0 * 12 / 2048, 1e-12);
    /* len stops it: "He" = 2800 units */
    assert_rel_close(ml__svg_text_width("Hello", 2, 2048, false), 2800, 1e-12);
    /* U+00E9 (two bytes) is one character at the widest advance */
    assert_rel_close(ml__svg_text_width("\xc3\xa9", 2, 2048, false), 3838, 1e-12);
    /* "Hello Hello" at 2048 (a unit per font unit): 5191 + 651 + 5191 =
     * 11033 wide; 6000 holds one word, not the space and the next, so two
     * lines, broken at the space, which neither line keeps */
    char *buf = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&buf, &n);
    assert_non_null(f);
    assert_int_equal(ml__svg_text_wrapped(f, 5, 10, 20, 2048, false, NULL, 6000, "Hello Hello"), 2);
    assert_int_equal(fclose(f), 0);
    assert_string_equal(buf, "<text x=\"5.0\" y=\"10.0\" font-size=\"2048\">Hello</text>\n"
                             "<text x=\"5.0\" y=\"30.0\" font-size=\"2048\">Hello</text>\n");
    free(buf);
    /* no space to break at: between characters, "Hell" (1540 + 1260 + 569 + 569 = 3938 <= 5000), "o" */
    assert_int_equal(ml__svg_text_wrapped(NULL, 0, 0, 1, 2048, false, NULL, 5000, "Hello"), 2);
    /* narrower than any character: one character a line, never none */
    assert_int_equal(ml__svg_text_wrapped(NULL, 0, 0, 1, 2048, false, NULL, 1, "Hello"), 5);
    assert_int_equal(ml__svg_text_wrapped(NULL, 0, 0, 1, 2048, false, NULL, 11033, "Hello Hello"), 1);
    /* Bold (DejaVuSans-Bold.ttf): H 1714, e 1389, l 702, o 1407 = 5914 */
    assert_rel_close(ml__svg_text_width("Hello", 5, 2048, true), 5914, 1e-12);
}

static void points_fit(void **state)
{
    (void)state;
    /* peak = 1 GiB + 0.5 GiB per sample, exactly */
    const char csv[] = "micro_batch,peak\n1,1.5GiB\n2,2GiB\n4,3GiB\n";
    char *s = NULL;
    ml_error e;
    assert_int_equal(ml_points_json(csv, strlen(csv), "p.csv", 21ull << 28, 8, &s, NULL, &e),
                     ML_OK);
    assert_non_null(strstr(s, "\"points\": 3, \"fixed_bytes\": 1073741824, "
                              "\"per_sample_bytes\": 536870912"));
    /* budget 5.25 GiB: (5.25 - 1) / 0.5 = 8.5, so 8 samples; 1 + 8 x 0.5 = 5 GiB at 8 */
    assert_non_null(strstr(s, "\"max_micro_batch\": 8,"));
    assert_non_null(strstr(s, "\"peak_at\": 5368709120"));
    ml_json_free(s);
    const char bad[] = "micro_batch,peak\n1,lots\n";
    assert_int_not_equal(ml_points_json(bad, strlen(bad), "bad.csv", 0, 0, &s, NULL, &e), ML_OK);
    assert_string_equal(e.path, "bad.csv");
    assert_int_equal(e.line, 2);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(config_set_values),
        cmocka_unit_test(config_set_refusals),
        cmocka_unit_test(job_verbs),
        cmocka_unit_test(job_pairings),
        cmocka_unit_test(job_no_device),
        cmocka_unit_test(points_fit),
        cmocka_unit_test(json_strings_utf8),
        cmocka_unit_test(svg_text_xml_chars),
        cmocka_unit_test(svg_text_widths),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
