/* The parallel layout on the command line (docs/parallel.md): --parallel
 * LAYOUT (the compact form, tp8.dp16), --tp N, --sp and --no-sp, and the
 * splits the planner does not model yet, refused above one rank by the
 * library's own message. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"

static int refused(const char *flag, const ml_error *e)
{
    /* the library says "parallel: ..." or "parallel.pp: ...": the flag
     * replaces the subject */
    const char *msg = strchr(e->msg, ':');
    ml_cli_errorf("%s:%s", flag, msg ? msg + 1 : e->msg);
    return ML_EXIT_BAD_INPUT;
}

int ml_cli_parallel_flags(const ml_cli_opts *o, ml_training *t)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (o->parallel) {
        if (o->tp || o->pp || o->vpp || o->cp || o->ep || o->etp || o->data_parallel) {
            ml_cli_errorf("--parallel %s: the layout is given once; drop --tp, --dp/--data-"
                          "parallel and the other sizes, or drop --parallel",
                          o->parallel);
            return ML_EXIT_BAD_INPUT;
        }
        if (ml_parallel_parse(o->parallel, t, &e))
            return refused("--parallel", &e);
    }
    if (o->tp && ml_cli_whole("--tp", o->tp, 1, 65536, &t->tensor_parallel))
        return ML_EXIT_BAD_INPUT;
    const struct {
        const char *flag, *what, *v;
    } splits[] = {{"--pp", "pipeline parallelism", o->pp},
                  {"--vpp", "virtual pipeline stages", o->vpp},
                  {"--cp", "context parallelism", o->cp},
                  {"--ep", "expert parallelism", o->ep},
                  {"--etp", "expert tensor parallelism", o->etp}};
    for (size_t k = 0; k < sizeof splits / sizeof splits[0]; k++) {
        uint64_t v = 1;
        if (splits[k].v && ml_cli_whole(splits[k].flag, splits[k].v, 1, 1048576, &v))
            return ML_EXIT_BAD_INPUT;
        if (v != 1) {
            ml_cli_errorf("%s: %llu: %s is not modelled yet; plan each rank with tensor (--tp) "
                          "and data (--data-parallel) parallelism, or give 1",
                          splits[k].flag, (unsigned long long)v, splits[k].what);
            return ML_EXIT_BAD_INPUT;
        }
    }
    const char *pipeline[][2] = {{"--pp-schedule", o->pp_schedule},
                                 {"--micro-batches", o->micro_batches},
                                 {"--pp-layers", o->pp_layers}};
    for (size_t k = 0; k < sizeof pipeline / sizeof pipeline[0]; k++)
        if (pipeline[k][1]) {
            ml_cli_errorf("%s: pipeline parallelism is not modelled yet; the plan is one rank "
                          "of tensor (--tp) and data (--data-parallel) parallelism",
                          pipeline[k][0]);
            return ML_EXIT_BAD_INPUT;
        }
    if (o->sp)
        t->sequence_parallel = !strcmp(o->sp, "on") ? ML_SP_ON : ML_SP_OFF;
    return 0;
}
