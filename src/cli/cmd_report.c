/* memledger report MODEL.yaml -o report.html */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *const usage[] = {
    "usage: memledger report MODEL.yaml -o report.html [options]\n"
    "\n"
    "One self-contained HTML file (no network fetches, no external scripts): the\n"
    "configuration, the verdict, the ledger table, the timeline chart (hover for the\n"
    "step and the bytes by category), the checkpoint comparison and, with a device,\n"
    "the micro-batch and accumulation recommendation.\n"
    "\n"
    "  -o FILE                the HTML file (written atomically); '-' for stdout\n"
    "  --global-batch N       target effective batch for the recommendation\n"
    "  and every 'memledger plan' option\n"
    "\n"
    "Exit status: 0 written, 2 bad input or usage, 3 output could not be written.\n", NULL};

int ml_cmd_report(int argc, char **argv)
{
    ml_cli_opts o;
    int rc = ml_cli_parse(argc, argv, "report", usage, &o);
    if (rc == 1)
        return ML_EXIT_OK;
    if (rc)
        return rc;
    if (!o.output) {
        fprintf(stderr, "memledger: error: report needs -o FILE (e.g. -o report.html, or - for "
                        "standard output)\nTry 'memledger report --help'.\n");
        return ML_EXIT_BAD_INPUT;
    }
    ml_model *m = NULL;
    ml_config cfg;
    if ((rc = ml_cli_load(&o, &m, &cfg)))
        return rc;
    o.model = m;
    /* the global batch sizes the report's fit, which needs a device: a
     * flag nothing would use is refused (docs/cli.md) */
    if (o.global_batch && !cfg.device.present) {
        ml_cli_errorf("--global-batch: sizes the report's fit, which needs a device: add "
                      "--device NAME|SIZE (or a device: section), or drop --global-batch");
        ml_cli_free(m, &cfg);
        return ML_EXIT_BAD_INPUT;
    }
    ml_ledger *l = NULL;
    ml_error e;
    ml_compare_row rows[ML_COMPARE_ROWS];
    size_t n = 0;
    ml_fit_result fit;
    bool have_fit = false;
    ml_status st = ml_ledger_evaluate(m, &cfg, true, &l, &e);
    if (!st)
        st = ml_compare(m, &cfg, rows, &n, &e);
    if (!st && cfg.device.present) {
        ml_fit_request req = ml_fit_request_defaults();
        req.auto_checkpoint = true;
        if (o.global_batch &&
            (rc = ml_cli_whole("--global-batch", o.global_batch, 1, 1ull << 40, &req.global_batch)))
            goto out;
        st = ml_fit(m, &cfg, &req, &fit, &e);
        have_fit = st == ML_OK;
        if (have_fit)
            ml_cli_decorate(&o, fit.note, sizeof fit.note);
    }
    if (st) {
        rc = ml_cli_eval_failed(&o, &e, st);
        goto out;
    }
    ml_out out;
    if ((rc = ml_out_open(&out, o.output)) == 0) {
        int w = ml_report_html(out.f, m, &cfg, l, rows, n, have_fit ? &fit : NULL);
        rc = ml_out_close(&out, w == 0);
    }
out:
    ml_ledger_destroy(l);
    ml_cli_free(m, &cfg);
    return rc;
}
