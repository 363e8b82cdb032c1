/* memledger compare MODEL.yaml: checkpoint policies side by side. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char usage[] =
    "usage: memledger compare MODEL.yaml [options]\n"
    "\n"
    "Checkpoint policies side by side at the configured micro-batch: none, full,\n"
    "every-2, every-4, sqrt, selective and (with a device) optimal for the budget.\n"
    "Each row: peak total, saved activations, recompute FLOPs and their share of the\n"
    "iteration without recompute, estimated step time, fits or not.\n"
    "\n"
    "  --format text|json|csv (default text)\n"
    "  and every 'memledger plan' option (--micro-batch, --device, --budget, ...)\n"
    "\n"
    "Exit status: 0 ran, 2 bad input or usage, 3 output could not be written.\n";

int ml_cmd_compare(int argc, char **argv)
{
    ml_cli_opts o;
    int rc = ml_cli_parse(argc, argv, "compare", usage, &o);
    if (rc == 1)
        return ML_EXIT_OK;
    if (rc)
        return rc;
    ml_model *m = NULL;
    ml_config cfg;
    if ((rc = ml_cli_load(&o, &m, &cfg)))
        return rc;
    ml_compare_row rows[ML_COMPARE_ROWS];
    size_t n = 0;
    ml_error e;
    ml_status st = ml_compare(m, &cfg, rows, &n, &e);
    if (st) {
        snprintf(e.path, sizeof e.path, "%s", o.model_path);
        e.line = e.col = 0;
        ml_cli_print_error(&e);
        ml_model_destroy(m);
        return st == ML_NOMEM ? ML_EXIT_FAILURE : ML_EXIT_BAD_INPUT;
    }
    int w = o.format == ML_FMT_JSON  ? ml_report_compare_json(stdout, rows, n)
            : o.format == ML_FMT_CSV ? ml_report_compare_csv(stdout, rows, n)
                                     : ml_report_compare_text(stdout, m, &cfg, rows, n);
    rc = ML_EXIT_OK;
    if (fflush(stdout) != 0 || w != 0) {
        fprintf(stderr, "memledger: error: cannot write the report to standard output\n");
        rc = ML_EXIT_FAILURE;
    }
    ml_model_destroy(m);
    return rc;
}
