/* The parallel layout on the command line (docs/parallel.md): --parallel
 * LAYOUT (the compact form, tp8.pp4.dp16), --tp N, --sp and --no-sp, the
 * pipeline's --pp, --vpp, --pp-schedule, --micro-batches and --pp-layers,
 * context parallelism's --cp, expert parallelism's --ep and --etp. */
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

/* The data-parallel sharding's flags: --dist-optimizer and
 * --no-dist-optimizer, --dp-shard N. */
static int sharding_flags(const ml_cli_opts *o, ml_training *t)
{
    if (o->dist_optimizer)
        t->dist_optimizer = !strcmp(o->dist_optimizer, "on");
    if (o->overlap)
        t->overlap_grad_reduce = !strcmp(o->overlap, "on");
    if (o->dp_shard) {
        uint64_t lo = 1, hi = 1;
        ml_config_range("training.data_parallel", &lo, &hi);
        if (ml_cli_whole("--dp-shard", o->dp_shard, lo, hi, &t->dp_shard))
            return ML_EXIT_BAD_INPUT;
    }
    return 0;
}

int ml_cli_parallel_flags(const ml_cli_opts *o, ml_training *t)
{
    ml_error e;
    memset(&e, 0, sizeof e);
    if (o->parallel) {
        if (o->tp || o->pp || o->vpp || o->cp || o->ep || o->etp || o->data_parallel) {
            ml_cli_errorf("--parallel %s: the layout is given once; drop --tp, --pp, --dp/--data-"
                          "parallel and the other sizes, or drop --parallel",
                          o->parallel);
            return ML_EXIT_BAD_INPUT;
        }
        if (ml_parallel_parse(o->parallel, t, &e))
            return refused("--parallel", &e);
    }
    if (o->tp && ml_cli_whole("--tp", o->tp, 1, 65536, &t->tensor_parallel))
        return ML_EXIT_BAD_INPUT;
    if (o->pp && ml_cli_whole("--pp", o->pp, 1, ML_PP_MAX_STAGES, &t->pipeline_parallel))
        return ML_EXIT_BAD_INPUT;
    if (o->vpp && ml_cli_whole("--vpp", o->vpp, 1, 1024, &t->virtual_stages))
        return ML_EXIT_BAD_INPUT;
    if (o->cp && ml_cli_whole("--cp", o->cp, 1, 65536, &t->context_parallel))
        return ML_EXIT_BAD_INPUT;
    if (o->ep && ml_cli_whole("--ep", o->ep, 1, 65536, &t->expert_parallel))
        return ML_EXIT_BAD_INPUT;
    if (o->etp && ml_cli_whole("--etp", o->etp, 1, 65536, &t->expert_tensor_parallel))
        return ML_EXIT_BAD_INPUT;
    if (o->vpp && t->virtual_stages > 1)
        t->pp_schedule = ML_PP_INTERLEAVED;
    if (o->pp_schedule && !ml_pp_schedule_parse(o->pp_schedule, &t->pp_schedule)) {
        ml_cli_errorf("--pp-schedule: '%s' is not a schedule; use 1f1b, gpipe or interleaved",
                      o->pp_schedule);
        return ML_EXIT_BAD_INPUT;
    }
    if (o->micro_batches) {
        if (o->grad_accum) {
            ml_cli_errorf("--micro-batches %s: a pipeline's micro-batches are the step's "
                          "accumulation; give --micro-batches or --grad-accum, not both",
                          o->micro_batches);
            return ML_EXIT_BAD_INPUT;
        }
        uint64_t lo = 1, hi = 1;
        ml_config_range("training.grad_accum", &lo, &hi);
        if (ml_cli_whole("--micro-batches", o->micro_batches, lo, hi, &t->grad_accum))
            return ML_EXIT_BAD_INPUT;
    }
    if (o->pp_layers && ml_pp_layers_parse(o->pp_layers, t, &e))
        return refused("--pp-layers", &e);
    /* a pipeline's flags without a pipeline would change nothing */
    const char *lone = o->pp_schedule ? "--pp-schedule"
                       : o->ranks     ? "--ranks"
                       : o->vpp       ? "--vpp"
                                      : NULL;
    /* (fit --gpus: the search chooses the stages; --vpp pins its part) */
    if (lone && t->pipeline_parallel <= 1 && !(o->gpus && o->vpp && lone[2] == 'v')) {
        ml_cli_errorf("%s: a pipeline's setting; give --pp above 1 with it", lone);
        return ML_EXIT_BAD_INPUT;
    }
    int rc = sharding_flags(o, t);
    if (rc)
        return rc;
    if (o->sp)
        t->sequence_parallel = !strcmp(o->sp, "on") ? ML_SP_ON : ML_SP_OFF;
    if (o->engine) {
        if (!ml_engine_parse(o->engine, &t->engine)) {
            ml_cli_errorf("--engine: '%s' is not an engine; use eager or megatron", o->engine);
            return ML_EXIT_BAD_INPUT;
        }
        /* Megatron's gradient buffer: zeroed, not freed (unless --zero-grad says) */
        if (t->engine == ML_ENGINE_MEGATRON && !o->zero_grad)
            t->zero_grad = ML_ZERO_GRAD_ZERO;
        /* and its optimizer a fused one (FusedAdam) */
        if (t->engine == ML_ENGINE_MEGATRON && !o->optimizer_impl)
            t->optimizer_impl = ML_IMPL_FUSED;
        /* GPTModel's forward returns the loss, not the logits */
        if (t->engine == ML_ENGINE_MEGATRON && !o->logits)
            t->logits = ML_LOGITS_RELEASED;
    }
    return 0;
}
