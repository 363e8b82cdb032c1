#include <string.h>

#include "tracker.h"

void tracker_init(tracker *tr, ml_backend *be)
{
    memset(tr, 0, sizeof *tr);
    tr->be = be;
    tr->dev_base = be->device_used(be);
}

tensor tensor_alloc(tracker *tr, size_t bytes, int cat)
{
    tensor t = {NULL, bytes, cat, false};
    if (tr->oom)
        return t;
    t.p = tr->be->alloc(tr->be, bytes);
    if (!t.p) {
        tr->oom = true;
        return t;
    }
    tr->live[cat] += bytes;
    tr->total += bytes;
    if (tr->total > tr->peak[tr->phase])
        tr->peak[tr->phase] = tr->total;
    return t;
}

void tensor_free(tracker *tr, tensor *t)
{
    if (!t->p)
        return;
    tr->be->free(tr->be, t->p);
    tr->live[t->cat] -= t->bytes;
    tr->total -= t->bytes;
    t->p = NULL;
}

void tracker_device_sample(tracker *tr)
{
    uint64_t u = tr->be->device_used(tr->be);
    if (u > tr->dev_base && u - tr->dev_base > tr->dev_peak)
        tr->dev_peak = u - tr->dev_base;
}
