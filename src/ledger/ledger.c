/* The ledger's accessors and its destroy (include/memledger/ledger.h). */
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
    free(l);
}

const ml_summary *ml_ledger_summary(const ml_ledger *l)
{
    return &l->sum;
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
