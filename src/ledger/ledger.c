/* The ledger's accessors, its enums' names and its destroy
 * (include/memledger/ledger.h). */
#include <stdlib.h>

#include "ledger/replay.h"

void ml_ledger_destroy(ml_ledger *l)
{
    if (!l)
        return;
    if (l->blocks != (ml_block_info *)(l + 1)) /* (else the ledger's own allocation) */
        free(l->blocks);
    free(l->events);
    free(l->levels);
    free(l->ranks);
    free(l->aev);
    free(l);
}

const ml_summary *ml_ledger_summary(const ml_ledger *l)
{
    return &l->sum;
}

double ml_summary_step_time(const ml_summary *s)
{
    return s->pipeline_step_s >= 0 ? s->pipeline_step_s : s->step_time_s;
}

size_t ml_ledger_block_count(const ml_ledger *l)
{
    return l->nblocks;
}

const ml_block_info *ml_ledger_block(const ml_ledger *l, size_t i)
{
    return i < l->nblocks ? &l->blocks[i] : NULL;
}

size_t ml_ledger_event_count(const ml_ledger *l)
{
    return l->nevents;
}

const ml_event *ml_ledger_events(const ml_ledger *l)
{
    return l->events;
}

size_t ml_ledger_sim_event_count(const ml_ledger *l)
{
    return l->naev;
}

const ml_sim_event *ml_ledger_sim_events(const ml_ledger *l)
{
    return l->aev;
}

size_t ml_ledger_rank_count(const ml_ledger *l)
{
    return l->nranks;
}

const ml_rank_info *ml_ledger_rank(const ml_ledger *l, size_t i)
{
    return i < l->nranks ? &l->ranks[i] : NULL;
}

size_t ml_ledger_worst_rank(const ml_ledger *l)
{
    return l->worst_rank;
}

static const char *const cat_names[ML_CAT_COUNT] = {
    "params", "master_params", "grads", "optimizer_states", "activations_saved", "recompute",
    "workspace", "batch", "buffers"};
static const char *const phase_names[ML_PHASE_COUNT] = {"forward", "loss", "backward",
                                                        "optimizer"};

const char *ml_category_name(ml_category c)
{
    return (unsigned)c < ML_CAT_COUNT ? cat_names[c] : "?";
}

const char *ml_phase_name(ml_phase p)
{
    return (unsigned)p < ML_PHASE_COUNT ? phase_names[p] : "?";
}

const char *ml_transients_name(ml_transients t)
{
    static const char *const names[ML_TRANSIENTS_COUNT] = {"ops", "block_rule", "partly",
                                                           "formula"};
    return (unsigned)t < ML_TRANSIENTS_COUNT ? names[t] : "?";
}

const char *ml_peak_kind_name(ml_peak_kind k)
{
    static const char *const names[ML_PEAK_KIND_COUNT] = {"steady", "first_iteration", "eval"};
    return (unsigned)k < ML_PEAK_KIND_COUNT ? names[k] : "?";
}
