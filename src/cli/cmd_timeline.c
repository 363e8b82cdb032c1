/* memledger timeline MODEL.yaml: every event of the iteration. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static const char *const usage[] = {
    "usage: memledger timeline MODEL.yaml [--format csv|json|svg|trace] [-o FILE] [options]\n"
    "\n"
    "Every allocation and free of one training iteration: index, micro-batch, phase,\n"
    "step, category, delta bytes, and the live bytes per category after it.\n"
    "csv (default): a header row, one event per line. json: an array of events.\n"
    "svg: a stacked area chart of live bytes by category, phase bands, the budget\n"
    "and device lines and the peak.\n"
    "trace: the allocator simulation's own events, each tensor PyTorch would allocate\n"
    "or free over the residents, the first iteration, two steady ones and the\n"
    "evaluation pass (a '#' line starts each), as a trace 'memledger allocator'\n"
    "replays (action,id,bytes; give it the plan's --allocator-start too). Needs the\n"
    "simulation (--allocator caching, the default, or expandable).\n"
    "\n"
    "  -o FILE                write to FILE (atomically) instead of stdout\n"
    "  and every 'memledger plan' option (--micro-batch, --checkpoint, --device, ...)\n"
    "\n"
    "Exit status: 0 written, 2 bad input or usage, 3 output could not be written.\n", NULL};

int ml_cmd_timeline(int argc, char **argv)
{
    ml_cli_opts o;
    ml_model *m = NULL;
    ml_config cfg;
    int rc;
    if (!ml_cli_start(argc, argv, "timeline", usage, &o, &m, &cfg, &rc))
        return rc;
    if (!o.format_given)
        o.format = ML_FMT_CSV;
    if (o.format == ML_FMT_TRACE && cfg.device.allocator == ML_ALLOCATOR_NONE) {
        fprintf(stderr, "memledger timeline: --format trace: the allocator is not simulated "
                        "(--allocator none); use --allocator caching or expandable\n");
        ml_cli_free(m, &cfg);
        return 2;
    }
    ml_ledger *l = NULL;
    ml_error e;
    ml_status st = ml_ledger_evaluate(m, &cfg, true, &l, &e);
    if (st) {
        rc = ml_cli_eval_failed(&o, &e, st);
        ml_cli_free(m, &cfg);
        return rc;
    }
    ml_out out;
    if ((rc = ml_out_open(&out, o.output)) == 0) {
        int w = o.format == ML_FMT_JSON    ? ml_report_timeline_json(out.f, l)
                : o.format == ML_FMT_SVG   ? ml_report_timeline_svg(out.f, m, &cfg, l)
                : o.format == ML_FMT_TRACE ? ml_report_timeline_trace(out.f, l)
                                           : ml_report_timeline_csv(out.f, l);
        rc = ml_out_close(&out, w == 0);
    }
    ml_ledger_destroy(l);
    ml_cli_free(m, &cfg);
    return rc;
}
