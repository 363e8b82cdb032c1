/* Allocation failure: every malloc/calloc/realloc of the library fails in
 * turn (the nth call, n = 1, 2, ...) while a model is loaded, evaluated,
 * searched and reported. Each run must end in a clean error (ML_NOMEM) or
 * success, never a crash, and free everything it took: LeakSanitizer checks
 * that in the sanitizer build. Linked with --wrap=malloc,calloc,realloc. */
#include <stdlib.h>

#include "harness.h"

void *__real_malloc(size_t n);
void *__real_calloc(size_t n, size_t m);
void *__real_realloc(void *p, size_t n);
void *__wrap_malloc(size_t n);
void *__wrap_calloc(size_t n, size_t m);
void *__wrap_realloc(void *p, size_t n);

static long countdown = -1; /* < 0: disarmed */
static unsigned failures;

static bool fail_now(void)
{
    if (countdown < 0)
        return false;
    if (--countdown == 0) {
        failures++;
        countdown = -1;
        return true;
    }
    return false;
}

void *__wrap_malloc(size_t n)
{
    return fail_now() ? NULL : __real_malloc(n);
}

void *__wrap_calloc(size_t n, size_t m)
{
    return fail_now() ? NULL : __real_calloc(n, m);
}

void *__wrap_realloc(void *p, size_t n)
{
    return fail_now() ? NULL : __real_realloc(p, n);
}

static const char *model =
    "name: nomem\nmodel:\n  type: decoder\n  layers: 4\n  hidden: 32\n  heads: 4\n"
    "  vocab: 50\n  max_positions: 16\n  dropout: 0.1\n"
    "training:\n  micro_batch: 2\n  seq_len: 16\n  checkpoint: optimal\n"
    "device:\n  memory: 64MiB\n  runtime_reserve: 8MiB\n";

static const char *seq =
    "model:\n  type: sequential\n  input: [3, 8, 8]\n  layers:\n"
    "    - conv2d: {out: 4, kernel: 3, padding: 1}\n    - batchnorm: {}\n    - relu: {}\n"
    "    - residual:\n        - conv2d: {out: 4, kernel: 3, padding: 1}\n"
    "    - flatten: {}\n    - linear: {out: 10}\n";

/* One whole use of the library; returns its first failing status. */
static ml_status use(const char *text)
{
    ml_model *m = NULL;
    ml_error e;
    ml_status st = ml_model_load_string(text, strlen(text), "nomem.yaml", &m, &e);
    if (st)
        return st;
    ml_config c = ml_model_config(m);
    ml_ledger *l = NULL;
    st = ml_ledger_evaluate(m, &c, true, &l, &e);
    if (!st) {
        FILE *f = fopen("/dev/null", "w");
        if (f) {
            ml_report_text(f, m, &c, l);
            ml_report_timeline_svg(f, m, &c, l);
            fclose(f);
        }
        ml_ledger_destroy(l);
    }
    if (!st && c.device.present) {
        ml_fit_request req = ml_fit_request_defaults();
        req.max_micro_batch = 8;
        ml_fit_result r;
        st = ml_fit(m, &c, &req, &r, &e);
    }
    ml_model_destroy(m);
    return st;
}

static void sweep(const char *text)
{
    unsigned nomem = 0;
    for (long n = 1;; n++) {
        unsigned before = failures;
        countdown = n;
        ml_status st = use(text);
        countdown = -1;
        if (failures == before) {
            /* no allocation was failed: the whole run succeeded */
            assert_int_equal(st, ML_OK);
            break;
        }
        if (st != ML_NOMEM && st != ML_OK)
            fail_msg("allocation %ld failed and the call returned %s", n, ml_status_name(st));
        if (st == ML_NOMEM)
            nomem++;
        assert_true(n < 100000);
    }
    assert_true(nomem > 10);
}

static void test_every_allocation_fails_cleanly(void **state)
{
    (void)state;
    sweep(model);
    sweep(seq);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_allocation_fails_cleanly),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
