/* Each phase's peak (forward, loss, backward, optimizer step) as the replay
 * passes its events, for the steady and the first iteration; and where
 * each was (docs/ledger.md, "Each phase's peak"). */
#include <stdio.h>

#include "ledger/replay.h"

static void phase_max(ml_phase_peak *p, uint64_t v, int32_t block, const char **sub_at,
                      const char *sub)
{
    if (p->present && v <= p->peak)
        return;
    p->present = true;
    p->peak = v;
    p->block = block;
    *sub_at = sub;
}

void ml__replay_phase_point(ml_replay *r, uint64_t first)
{
    ml_summary *s = &r->l->sum;
    phase_max(&s->phase_steady[r->phase], r->total, r->block, &r->phase_sub[r->phase], r->sub);
    phase_max(&s->phase_first[r->phase], first, r->block, &r->first_sub[r->phase], r->sub);
}

static void phase_name(const ml_replay *r, ml_phase ph, ml_phase_peak *p, const char *sub)
{
    if (!p->present)
        return;
    if (p->block >= 0 && (size_t)p->block < r->ch->n)
        snprintf(p->at, sizeof p->at, "%s%s", r->ch->blocks[p->block].name, sub ? sub : "");
    else
        snprintf(p->at, sizeof p->at, "%s",
                 ph == ML_PHASE_OPTIMIZER ? "optimizer.step" : "resident");
}

void ml__replay_phase_names(const ml_replay *r, ml_summary *s)
{
    for (int ph = 0; ph < ML_PHASE_COUNT; ph++) {
        phase_name(r, (ml_phase)ph, &s->phase_steady[ph], r->phase_sub[ph]);
        phase_name(r, (ml_phase)ph, &s->phase_first[ph], r->first_sub[ph]);
    }
}
