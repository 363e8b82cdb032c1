/* Each phase's peak (forward, loss, backward, optimizer step) as the replay
 * passes its events, for the steady and the first iteration; and where
 * each was (docs/ledger.md, "Each phase's peak"). */
#include <string.h>

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

void ml__name_join(char *dst, size_t size, const char *a, const char *b)
{
    size_t na = strlen(a), nb = strlen(b);
    if (na >= size)
        na = size - 1;
    if (nb >= size - na)
        nb = size - na - 1;
    memcpy(dst, a, na);
    memcpy(dst + na, b, nb);
    dst[na + nb] = '\0';
}

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
