/* memledger compare MODEL.yaml: checkpoint policies side by side. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *const usage[] = {
    "usage: memledger compare MODEL.yaml [options]\n"
    "\n"
    "Checkpoint policies side by side at the configured micro-batch: none, full,\n"
    "every-2, every-4, sqrt, selective and (with a device) optimal for the budget.\n"
    "Each row: device total, saved activations, recompute FLOPs and their share of the\n"
    "iteration without recompute, estimated step time, fits or not.\n"
    "\n"
    "  --format text|json|csv|svg  (default text; svg overlays the policies' curves)\n"
    "  -o FILE                write to FILE (atomically) instead of stdout\n"
    "  and every 'memledger plan' option (--micro-batch, --device, --budget, ...)\n"
    "\n"
    "Exit status: 0 ran, 2 bad input or usage, 3 output could not be written.\n", NULL};

int ml_cmd_compare(int argc, char **argv)
{
    ml_cli_opts o;
    ml_model *m = NULL;
    ml_config cfg;
    int rc;
    if (!ml_cli_start(argc, argv, "compare", usage, &o, &m, &cfg, &rc))
        return rc;
    ml_compare_row rows[ML_COMPARE_ROWS];
    size_t n = 0;
    ml_error e;
    ml_status st = ml_compare(m, &cfg, rows, &n, &e);
    if (st) {
        rc = ml_cli_eval_failed(&o, &e, st);
        ml_cli_free(m, &cfg);
        return rc;
    }
    /* the SVG overlays each policy's whole timeline */
    ml_ledger *ls[ML_COMPARE_ROWS] = {0};
    char names[ML_COMPARE_ROWS][96];
    const char *np[ML_COMPARE_ROWS];
    if (o.format == ML_FMT_SVG) {
        for (size_t i = 0; i < n && st == ML_OK; i++) {
            ml_config c = cfg;
            c.training.checkpoint = rows[i].checkpoint;
            st = ml_ledger_evaluate(m, &c, true, &ls[i], &e);
            ml_checkpoint_format(&rows[i].checkpoint, names[i], sizeof names[i]);
            if (rows[i].cheaper >= 0) { /* its recompute buys nothing here */
                char cheaper[40];
                ml_checkpoint_format(&rows[rows[i].cheaper].checkpoint, cheaper, sizeof cheaper);
                size_t len = strlen(names[i]);
                snprintf(names[i] + len, sizeof names[i] - len, ", not needed: %s fits", cheaper);
            }
            np[i] = names[i];
        }
        if (st) {
            ml_cli_print_error(&e);
            rc = ML_EXIT_FAILURE;
            goto done;
        }
    }
    ml_out out;
    rc = ml_out_open_report(&out, o.output, o.format == ML_FMT_TEXT, m, &cfg);
    if (rc == 0) {
        int w = o.format == ML_FMT_JSON  ? ml_report_compare_json(out.f, rows, n)
                : o.format == ML_FMT_CSV ? ml_report_compare_csv(out.f, rows, n)
                : o.format == ML_FMT_SVG
                    ? ml_report_compare_svg(out.f, m, &cfg, (const ml_ledger *const *)ls, np, n)
                    : ml_report_compare_text(out.f, m, &cfg, rows, n);
        rc = ml_out_close(&out, w == 0);
    }
done:
    for (size_t i = 0; i < ML_COMPARE_ROWS; i++)
        ml_ledger_destroy(ls[i]);
    ml_cli_free(m, &cfg);
    return rc;
}
