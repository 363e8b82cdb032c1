/* Where each phase's peak (forward, loss, backward, optimizer step) was,
 * for the steady and the first iteration, named once the replay ends
 * (docs/ledger.md, "Each phase's peak"); the replay records the points as
 * it passes its events (ml__replay_phase_point, replay.h); and where the
 * simulated allocator's reserved bytes peaked (docs/allocator.md, "Where
 * the reserved peak is"). */
#include <string.h>

#include "ledger/replay.h"

static void phase_name(const ml_replay *r, ml_phase ph, ml_phase_peak *p, const char *sub)
{
    if (!p->present)
        return;
    if (p->block >= 0 && (size_t)p->block < r->ch->n)
        ml__name_join(p->at, sizeof p->at, r->ch->blocks[p->block].name, sub ? sub : "");
    else
        ml__name_join(p->at, sizeof p->at,
                      ph == ML_PHASE_OPTIMIZER ? "optimizer.step" : "resident", "");
}

void ml__replay_phase_names(const ml_replay *r, ml_summary *s)
{
    for (int ph = 0; ph < ML_PHASE_COUNT; ph++) {
        phase_name(r, (ml_phase)ph, &s->phase_steady[ph], r->phase_sub[ph]);
        phase_name(r, (ml_phase)ph, &s->phase_first[ph], r->first_sub[ph]);
    }
}

/* The simulation's reserved peak: where it was passed last (replay.h). */
void ml__replay_reserved_point(ml_replay *r)
{
    /* asked after every event: the whole statistics only at a new top; the
     * figures as the event leaves them, or, where a retry released the
     * cache after the peak within the event, as the peak's allocation did */
    if (ml__rsim_reserved_peak(r->rsim) <= r->rsv.top)
        return;
    ml_alloc_stats a;
    ml__rsim_stats(r->rsim, &a);
    const bool now = a.reserved.current == a.reserved.peak;
    r->rsv.top = a.reserved.peak;
    r->rsv.allocated = now ? a.allocated.current : a.at_peak_allocated;
    r->rsv.segments = now ? a.segments.current : a.at_peak_segments;
    r->rsv.phase = r->phase;
    r->rsv.block = r->block;
    r->rsv.sub = r->sub;
    r->rsv.when = r->rsv.now;
}
