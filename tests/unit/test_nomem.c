/* Allocation failure: every malloc/calloc/realloc of the library fails in
 * turn (the nth call, n = 1, 2, ...; transient: only that one, persistent:
 * that one and every later one) while a model is loaded (YAML or a Hugging
 * Face config), evaluated with a calibration profile, an evaluation pass and
 * the allocator simulation, searched (fit, compare) and reported (text,
 * JSON, timeline CSV/JSON/SVG, HTML). Each run must end in a clean error
 * (ML_NOMEM) or succeed with exactly the fault-free answer, never crash,
 * and free everything it took: LeakSanitizer checks that in the sanitizer
 * build. Linked with --wrap=malloc,calloc,realloc. */
#include <stdlib.h>
#include <string.h>

#include "harness.h"

#include "fault_inject.h"

static const char *model =
    "name: nomem\nmodel:\n  type: decoder\n  layers: 4\n  hidden: 32\n  heads: 4\n"
    "  vocab: 50\n  max_positions: 16\n  dropout: 0.1\n"
    "training:\n  micro_batch: 2\n  seq_len: 16\n  checkpoint: optimal\n  eval_batch: 3\n"
    "device:\n  memory: 64MiB\n  runtime_reserve: 8MiB\n  allocator: caching\n";

static const char *seq =
    "model:\n  type: sequential\n  input: [3, 8, 8]\n  layers:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n    - batchnorm: {}\n    - relu: {}\n"
    "    - residual:\n        - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - repeat:\n        times: 2\n        layers:\n"
    "          - residual: {body: [repeat: {times: 2, layers: [conv2d: {out: 4, kernel: 1}]}],\n"
    "                       shortcut: [conv2d: {out: 4, kernel: 1}]}\n"
    "          - relu: {}\n"
    "    - flatten: {}\n    - linear: {out: 10}\n";

static const char *hf =
    "{\"model_type\": \"llama\", \"num_hidden_layers\": 2, \"hidden_size\": 64, "
    "\"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 176, "
    "\"vocab_size\": 100, \"max_position_embeddings\": 32}";

/* What a run computed; a run that succeeds despite a failed allocation must
 * have computed the same. */
typedef struct {
    uint64_t peak, peak_total, first, eval, reserved, fit_batch;
    size_t compare_rows;
    uint64_t compare_peak[ML_COMPARE_ROWS];
} answer;

static void reports(const ml_model *m, const ml_config *c, const ml_ledger *l,
                    const ml_compare_row *rows, size_t nrows)
{
    FILE *f = fopen("/dev/null", "w");
    if (!f)
        return;
    ml_report_text(f, m, c, l);
    ml_report_json(f, m, c, l);
    ml_report_timeline_csv(f, l);
    ml_report_timeline_json(f, l);
    ml_report_timeline_svg(f, m, c, l);
    ml_report_html(f, m, c, l, rows, nrows, NULL);
    fclose(f);
}

/* One whole use of the library; returns its first failing status, with its
 * message in *e. */
static ml_status use(const char *text, bool is_hf, const ml_profile *calib, answer *a,
                     ml_error *e_out)
{
    ml_model *m = NULL;
    ml_error e;
    memset(&e, 0, sizeof e);
    memset(a, 0, sizeof *a);
    ml_status st = is_hf ? ml_model_load_hf_string(text, strlen(text), "config.json", &m, &e)
                         : ml_model_load_string(text, strlen(text), "nomem.yaml", &m, &e);
    if (st) {
        *e_out = e;
        return st;
    }
    ml_config c = ml_model_config(m);
    /* the simulation's allocations are swept on the decoder, whose file asks
     * for it; the other models in the allocated view, as before the
     * simulation was the default (a shorter sweep) */
    if (!strstr(text, "allocator:"))
        c.device.allocator = ML_ALLOCATOR_NONE;
    c.calib = calib;
    ml_compare_row rows[ML_COMPARE_ROWS];
    size_t nrows = 0;
    st = ml_compare(m, &c, rows, &nrows, &e);
    a->compare_rows = nrows;
    for (size_t i = 0; !st && i < nrows; i++)
        a->compare_peak[i] = rows[i].peak;
    ml_ledger *l = NULL;
    if (!st)
        st = ml_ledger_evaluate(m, &c, true, &l, &e);
    if (!st) {
        const ml_summary *s = ml_ledger_summary(l);
        a->peak = s->peak;
        a->peak_total = s->peak_total;
        a->first = s->peak_first_iteration;
        a->eval = s->peak_eval;
        a->reserved = s->reserved_peak;
        reports(m, &c, l, rows, nrows);
        ml_ledger_destroy(l);
    }
    if (!st && c.device.present) {
        ml_fit_request req = ml_fit_request_defaults();
        req.max_micro_batch = 8;
        ml_fit_result r;
        st = ml_fit(m, &c, &req, &r, &e);
        a->fit_batch = r.micro_batch;
    }
    ml_model_destroy(m);
    *e_out = e;
    return st;
}

static void sweep(const char *text, bool is_hf, const ml_profile *calib)
{
    answer want, got;
    ml_error e;
    assert_int_equal(use(text, is_hf, calib, &want, &e), ML_OK);
    for (int mode = 0; mode < 2; mode++) {
        persistent = mode == 1;
        unsigned nomem = 0;
        for (long n = 1;; n++) {
            unsigned before = failures;
            countdown = n;
            memset(&e, 0, sizeof e);
            ml_status st = use(text, is_hf, calib, &got, &e);
            countdown = -1;
            if (failures == before) {
                /* no allocation was failed: the whole run succeeded */
                assert_int_equal(st, ML_OK);
                break;
            }
            if (st != ML_NOMEM && st != ML_OK)
                fail_msg("allocation %ld failed (%s) and the call returned %s", n,
                         persistent ? "persistent" : "transient", ml_status_name(st));
            if (st == ML_NOMEM && !strstr(e.msg, "out of memory"))
                fail_msg("allocation %ld failed (%s): ML_NOMEM with the message \"%s\"", n,
                         persistent ? "persistent" : "transient", e.msg);
            if (st == ML_NOMEM)
                nomem++;
            else if (memcmp(&got, &want, sizeof got) != 0)
                fail_msg("allocation %ld failed (%s), the call succeeded, and its answer "
                         "differs from the fault-free one",
                         n, persistent ? "persistent" : "transient");
            assert_true(n < 100000);
        }
        assert_true(nomem > 10);
    }
    persistent = false;
}

static void test_every_allocation_fails_cleanly(void **state)
{
    (void)state;
    sweep(model, false, NULL);
    sweep(seq, false, NULL);
    sweep(hf, true, NULL);
}

/* With a calibration profile (the CPU one shipped): loading it and
 * planning with it. */
static void test_with_a_profile(void **state)
{
    (void)state;
    char path[512];
    snprintf(path, sizeof path, "%s/../calib/profiles/cpu-fp32.yaml", ML_MODELS_DIR);
    ml_profile *p = NULL;
    ml_error e;
    assert_int_equal(ml_profile_load_file(path, &p, &e), ML_OK);
    sweep(model, false, p);
    ml_profile_destroy(p);
    /* loading the profile itself */
    for (long n = 1;; n++) {
        unsigned before = failures;
        countdown = n;
        ml_profile *q = NULL;
        ml_status st = ml_profile_load_file(path, &q, &e);
        countdown = -1;
        ml_profile_destroy(q);
        if (failures == before) {
            assert_int_equal(st, ML_OK);
            break;
        }
        assert_int_equal(st, ML_NOMEM);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_cleanly),
        cmocka_unit_test(test_with_a_profile),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
