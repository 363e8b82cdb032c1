/* The replay's aggregates as tensors through the allocator simulator
 * (reserved.h). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "ledger/dist_optimizer.h"
#include "ledger/reserved_internal.h"
#include "util/error.h"
#include "util/grow.h"

/* Blocks list their parameter tensors in order (chain_kit.c): block k's
 * are the next ones whose elements add up to its params. */
static void partition_params(ml_rsim *r, const ml_chain *ch)
{
    size_t i = 0;
    for (size_t k = 0; k < ch->n; k++) {
        uint64_t need = ch->blocks[k].params, got = 0;
        r->pfirst[k] = i;
        while (got < need && i < ch->nparams)
            got += ch->params[i++].numel;
        r->pcount[k] = i - r->pfirst[k];
    }
    for (size_t j = 0; j < ch->nparams; j++) {
        r->P += ch->params[j].numel;
        r->Pt += ch->params[j].frozen ? 0 : ch->params[j].numel;
        r->Pg += ch->params[j].frozen || ch->params[j].nograd ? 0 : ch->params[j].numel;
    }
}

ml_status ml__rsim_create(const ml_alloc_config *cfg, const ml_chain *ch, ml_rsim **out,
                          ml_error *err)
{
    ml_rsim *r = calloc(1, sizeof *r);
    if (r) {
        r->pfirst = calloc(ch->n + 1, sizeof *r->pfirst);
        r->pcount = calloc(ch->n + 1, sizeof *r->pcount);
    }
    ml_alloc_result ar = r && r->pfirst && r->pcount ? ml__alloc_sim_create(cfg, &r->sim)
                                                     : ML_ALLOC_NOMEM;
    if (ar != ML_ALLOC_OK) {
        ml__rsim_destroy(r);
        return ar == ML_ALLOC_NOMEM
                   ? ml__errorf(err, ML_NOMEM, "out of memory")
                   : ml__errorf(err, ML_RANGE,
                                "device.max_split_size: must be at least 20 MiB (PyTorch's "
                                "max_split_size_mb) and at most 4 EiB (2^62 B, the "
                                "simulation's addresses)");
    }
    r->ch = ch;
    r->nblocks = ch->n;
    partition_params(r, ch);
    /* the simulator's block table at the size a training run's replay
     * reaches (about 60 blocks per chain block), so that it seldom grows
     * and copies itself: a hint, whose failure changes nothing */
    ml__alloc_sim_reserve(r->sim, 64 * (ch->n + 8));
    /* the same for the stores of aggregates and their handles, which keep
     * every aggregate but the latest ones freed (a 96-block decoder's
     * replay ends at about 170 and 370 per chain block) */
    const size_t per = ch->n + 8;
    group *g = ml_grow_to(NULL, 192 * per, &r->gcap, sizeof *g, 256);
    uint64_t *h = g ? ml_grow_to(NULL, 384 * per, &r->hcap, sizeof *h, 1024) : NULL;
    r->g = g;
    r->h = h;
    *out = r;
    return ML_OK;
}

void ml__rsim_destroy(ml_rsim *r)
{
    if (!r)
        return;
    ml__alloc_sim_destroy(r->sim);
    free(r->pfirst);
    free(r->pcount);
    free(r->g);
    free(r->h);
    for (int c = 0; c < ML_CAT_COUNT; c++)
        free(r->live[c]);
    free(r->sizes);
    free(r->ev);
    free(r->side_names);
    free(r->cache_names);
    free(r);
}

void ml__rsim_use_chain(ml_rsim *r, const ml_chain *ch)
{
    r->ch = ch;
}

void ml__rsim_set_shards(ml_rsim *r, uint64_t dp, uint64_t chunks)
{
    r->dp = dp;
    r->chunks = chunks;
}

/* One event into the record (when recording; a handle 0 is nothing): a
 * mark's pass `when` (second: the second steady iteration). */
static void note_as(ml_rsim *r, ml_sim_action a, uint64_t id, uint64_t bytes,
                    ml_reserved_when when, bool second)
{
    if (!r->recording || (a != ML_SIM_MARK && !id))
        return;
    ml_sim_event *e = ml_grow(r->ev, r->nev, &r->evcap, sizeof *e, 1024);
    if (!e) {
        r->nomem = true;
        return;
    }
    r->ev = e;
    /* field by field into a zeroed slot: the padding after `second` is
     * zero too, so two records compare equal byte for byte */
    e = &r->ev[r->nev++];
    memset(e, 0, sizeof *e);
    e->action = a;
    e->when = when;
    e->second = second;
    e->id = id;
    e->bytes = bytes;
}

void ml__rsim_note(ml_rsim *r, ml_sim_action a, uint64_t id, uint64_t bytes)
{
    note_as(r, a, id, bytes, ML_RESERVED_RESIDENT, false);
}

void ml__rsim_record(ml_rsim *r)
{
    r->recording = true;
}

void ml__rsim_note_refused(ml_rsim *r, uint64_t bytes)
{
    if (r->oom)
        note_as(r, ML_SIM_ALLOC, 1, bytes, ML_RESERVED_RESIDENT, false);
}

void ml__rsim_mark(ml_rsim *r, ml_reserved_when when, bool second)
{
    if (!r->oom) /* (nothing runs after it) */
        note_as(r, ML_SIM_MARK, 0, 0, when, second);
}

uint64_t ml__rsim_inexact(const ml_rsim *r)
{
    return r->inexact;
}

ml_sim_event *ml__rsim_take_events(ml_rsim *r, size_t *n)
{
    ml_sim_event *e = r->ev;
    *n = r->nev;
    r->ev = NULL;
    r->nev = r->evcap = 0;
    return e;
}



/* Room for n sizes in r->sizes: false when the host is out of memory. */
static bool sizes_room(ml_rsim *r, size_t n)
{
    uint64_t *grown = ml_grow_to(r->sizes, n, &r->sizecap, sizeof *grown, 64);
    if (!grown)
        return false;
    r->sizes = grown;
    return true;
}

/* The rank's shard pieces, `copies` tensors each of bytes / (elements x
 * copies) a element; their count, 0 when they do not add up, SIZE_MAX out
 * of memory. */
static size_t shard_sizes(ml_rsim *r, uint64_t bytes, unsigned copies)
{
    /* a parameter lies in one bucket: at most one piece each; the pieces
     * go to the end of the room, the tensors (copies of each) from its
     * start, which never passes a piece not yet read */
    const size_t np = r->ch->nparams;
    if (!copies || !sizes_room(r, np * copies + 1))
        return copies ? SIZE_MAX : 0;
    uint64_t *frag = r->sizes + np * (copies - 1);
    ml_dopt d;
    if (ml__dopt_layout(r->ch, r->dp, r->chunks, &d, frag, np))
        return SIZE_MAX;
    if (!d.shard)
        return 0;
    const uint64_t per = bytes / (d.shard * copies);
    size_t n = 0;
    uint64_t sum = 0;
    for (size_t i = 0; i < d.fragments; i++) {
        const uint64_t one = frag[i] * per;
        for (unsigned k = 0; k < copies; k++) {
            r->sizes[n++] = one;
            sum += one;
        }
    }
    return sum == bytes ? n : 0;
}

/* One tensor per parameter tensor of the block (its gradients, or its
 * parameters); a tied table's gradient (the LM head's) one tensor after
 * them. Their count, 0 when they do not add up to `bytes`, SIZE_MAX out of
 * host memory. */
static size_t block_param_sizes(ml_rsim *r, uint64_t bytes, size_t block, bool grads)
{
    const ml_chain *ch = r->ch;
    const ml_cblock *b = &ch->blocks[block];
    const uint64_t tied = b->tied_grad;
    const uint64_t own = tied && bytes > tied ? bytes - tied : bytes;
    /* new .grad tensors: the one that keeps a view's storage is larger */
    const uint64_t view = grads && b->grad_view_param && own > b->grad_view ? b->grad_view : 0;
    const uint64_t per = (own - view) / b->params; /* bytes per element */
    size_t n = 0;
    uint64_t sum = 0;
    if (!sizes_room(r, r->pcount[block] + 1))
        return SIZE_MAX;
    for (size_t i = r->pfirst[block]; i < r->pfirst[block] + r->pcount[block]; i++) {
        r->sizes[n] = ch->params[i].numel * per + (i + 1 == b->grad_view_param ? view : 0);
        sum += r->sizes[n++];
    }
    if (own != bytes) {
        r->sizes[n++] = tied;
        sum += tied;
    }
    return sum == bytes ? n : 0;
}

/* A transient of block b: the incoming gradient (backward), the
 * embedding's dense gradient of a tied table (the block whose input, the
 * token ids, needs no gradient; the head's tied_grad is in its gradients
 * instead), whole tensors of the block's largest size, the rest one more.
 * Their count, SIZE_MAX out of host memory. */
static size_t unit_sizes(ml_rsim *r, uint64_t bytes, ml_tensor_split split, const ml_cblock *b)
{
    const uint64_t unit = split == ML_T_UNITS_FWD ? b->unit_fwd : b->unit;
    uint64_t left = bytes, *out;
    size_t n = 0;
    if (!sizes_room(r, 10))
        return SIZE_MAX;
    out = r->sizes;
    if (split == ML_T_UNITS_BWD && b->bwd_in && b->bwd_in <= left) {
        out[n++] = b->bwd_in;
        left -= b->bwd_in;
    }
    if (split == ML_T_UNITS_BWD && b->tied_grad && b->in_nograd && b->tied_grad <= left) {
        out[n++] = b->tied_grad;
        left -= b->tied_grad;
    }
    while (unit && left >= unit && n < 8) {
        out[n++] = unit;
        left -= unit;
    }
    if (left)
        out[n++] = left;
    return n;
}

/* The block's held tensors (ML_T_HELD) into r->sizes: its keys and values,
 * then its weight copies. Their count, 0 when they do not add up to
 * `bytes` (then it is one tensor), SIZE_MAX out of host memory. A layer
 * with routed experts is one tensor too: its copies' entries hold every
 * expert's at once. */
static size_t held_sizes(ml_rsim *r, uint64_t bytes, const ml_cblock *b)
{
    const ml_chain *ch = r->ch;
    if (b->moe)
        return 0;
    if (!sizes_room(r, b->nsaved + 2))
        return SIZE_MAX;
    size_t n = 0;
    /* a key and a value of cache_unit each, else the cache as one */
    const bool kv = b->cache_unit && b->cache_bytes == 2 * b->cache_unit;
    if (b->cache_bytes)
        r->sizes[n++] = kv ? b->cache_unit : b->cache_bytes;
    if (kv)
        r->sizes[n++] = b->cache_unit;
    uint64_t sum = b->cache_bytes;
    if (bytes == sum) /* the copies made by the block's steps (replay.c) */
        return n;
    for (size_t i = b->saved_first; i < b->saved_first + b->nsaved; i++)
        if ((ch->saved[i].flags & ML_SV_WCAST) && ch->saved[i].bytes) {
            r->sizes[n++] = ch->saved[i].bytes;
            sum += ch->saved[i].bytes;
        }
    return sum == bytes ? n : 0;
}

/* The tensor sizes of an aggregate into r->sizes; their count, or 0 when
 * they do not add up to `bytes` (then it is one tensor). SIZE_MAX: the
 * host is out of memory. */
static size_t split_sizes(ml_rsim *r, uint64_t bytes, ml_tensor_split split, size_t block,
                          unsigned copies)
{
    const ml_chain *ch = r->ch;
    size_t n = 0;
    uint64_t sum = 0, *out;
    if ((split == ML_T_SAVED || split == ML_T_SAVED_NONCORE || split == ML_T_SAVED_CORE) &&
        block < ch->n) {
        const ml_cblock *b = &ch->blocks[block];
        if (!sizes_room(r, b->nsaved))
            return SIZE_MAX;
        out = r->sizes;
        for (size_t i = b->saved_first; i < b->saved_first + b->nsaved; i++) {
            bool core = ch->saved[i].flags & ML_SV_CORE;
            if ((split == ML_T_SAVED_NONCORE && core) || (split == ML_T_SAVED_CORE && !core))
                continue;
            out[n++] = ch->saved[i].bytes;
            sum += ch->saved[i].bytes;
        }
    } else if ((split == ML_T_BLOCK_PARAMS || split == ML_T_BLOCK_GRADS) && block < r->nblocks &&
               ch->blocks[block].params) {
        return block_param_sizes(r, bytes, block, split == ML_T_BLOCK_GRADS);
    } else if ((split == ML_T_UNITS_FWD || split == ML_T_UNITS || split == ML_T_UNITS_BWD) &&
               block < ch->n) {
        return unit_sizes(r, bytes, split, &ch->blocks[block]);
    } else if (split == ML_T_SIDE && ch->side_ids && ch->side_ids < bytes) {
        if (!sizes_room(r, 2))
            return SIZE_MAX;
        r->sizes[0] = ch->side_ids;
        r->sizes[1] = bytes - ch->side_ids;
        return 2;
    } else if (split == ML_T_HELD && block < ch->n) {
        return held_sizes(r, bytes, &ch->blocks[block]);
    } else if (split == ML_T_SHARD) {
        return shard_sizes(r, bytes, copies);
    } else if ((split == ML_T_ALL_PARAMS || split == ML_T_TRAINED_PARAMS ||
                split == ML_T_GRAD_PARAMS) && copies) {
        uint64_t of = split == ML_T_ALL_PARAMS       ? r->P
                      : split == ML_T_TRAINED_PARAMS ? r->Pt
                                                     : r->Pg;
        if (!of)
            return 0;
        /* the gradients kept over iterations (zero_grad: zero): a .grad
         * that keeps a view's storage (ml_cblock.grad_view) that much larger */
        uint64_t view = 0, vp = 0;
        for (size_t k = 0; split == ML_T_GRAD_PARAMS && copies == 1 && k < ch->n; k++)
            if (ch->blocks[k].grad_view && ch->blocks[k].grad_view_param) {
                view = ch->blocks[k].grad_view;
                vp = ch->blocks[k].grad_view_param;
            }
        if (view >= bytes || (bytes - view) % of)
            view = 0;
        uint64_t per = (bytes - view) / (of * copies);
        if (!sizes_room(r, ch->nparams * copies))
            return SIZE_MAX;
        out = r->sizes;
        for (size_t i = 0; i < ch->nparams; i++) {
            const ml_ptensor *p = &ch->params[i];
            if ((split != ML_T_ALL_PARAMS && p->frozen) || (split == ML_T_GRAD_PARAMS && p->nograd))
                continue;
            for (unsigned k = 0; k < copies; k++) {
                out[n] = p->numel * per + (i + 1 == vp ? view : 0);
                sum += out[n++];
            }
        }
    }
    return sum == bytes ? n : 0;
}

bool ml__rsim_granted(ml_rsim *r, ml_alloc_result ar)
{
    if (ar == ML_ALLOC_OK)
        return true;
    r->oom = ar == ML_ALLOC_OOM;
    r->nomem = ar != ML_ALLOC_OOM;
    return false;
}

bool ml__rsim_add_live(ml_rsim *r, ml_category c, size_t gi)
{
    size_t *grown = ml_grow(r->live[c], r->nlive[c], &r->livecap[c], sizeof *grown, 64);
    if (!grown)
        return false;
    r->live[c] = grown;
    r->live[c][r->nlive[c]++] = gi;
    r->live_bytes[c] += r->g[gi].bytes;
    return true;
}

bool ml__rsim_group_room(ml_rsim *r, size_t n)
{
    group *gg = ml_grow(r->g, r->ng, &r->gcap, sizeof *gg, 256);
    if (!gg) {
        r->nomem = true;
        return false;
    }
    r->g = gg;
    while (r->nh + n > r->hcap) {
        uint64_t *hh = ml_grow(r->h, r->hcap, &r->hcap, sizeof *hh, 1024);
        if (!hh) {
            r->nomem = true;
            return false;
        }
        r->h = hh;
    }
    return true;
}

void ml__rsim_alloc(ml_rsim *r, ml_category c, uint64_t bytes, ml_tensor_split split,
                    size_t block, unsigned copies)
{
    if (!bytes || r->oom || r->nomem)
        return;
    size_t n = split == ML_T_ONE ? 0 : split_sizes(r, bytes, split, block, copies);
    if (n == SIZE_MAX || (!n && !sizes_room(r, 1))) {
        r->nomem = true;
        return;
    }
    if (!n)
        r->sizes[n++] = bytes;
    if (!ml__rsim_group_room(r, n))
        return;
    group *g = &r->g[r->ng];
    *g = (group){c, bytes, r->nh, 0, block, split, 0};
    const bool ok = ml__rsim_granted(r, ml__alloc_sim_malloc_many(r->sim, r->sizes, n, &r->h[r->nh], &g->n));
    for (size_t i = 0; i < g->n && r->recording; i++)
        ml__rsim_note(r, ML_SIM_ALLOC, r->h[r->nh + i], r->sizes[i]);
    if (!ok) {
        ml__rsim_note_refused(r, r->sizes[g->n]);
        return;
    }
    r->nh += g->n;
    if (!ml__rsim_add_live(r, c, r->ng++))
        r->nomem = true;
}

void ml__rsim_release(ml_rsim *r, ml_category c, size_t at)
{
    group *g = &r->g[r->live[c][at]];
    uint64_t *h = &r->h[g->first];
    size_t n = g->n;
    if (g->per) { /* the handles its steps filled, the others 0 */
        n = 0;
        for (size_t i = 0; i < g->n; i++)
            if (h[i])
                h[n++] = h[i];
    }
    ml__alloc_sim_free_many(r->sim, h, n);
    for (size_t i = 0; i < n && r->recording; i++)
        ml__rsim_note(r, ML_SIM_FREE, h[i], 0);
    r->live_bytes[c] -= g->bytes;
    memmove(&r->live[c][at], &r->live[c][at + 1], (r->nlive[c] - at - 1) * sizeof *r->live[c]);
    r->nlive[c]--;
    /* the stores shrink when the latest group goes */
    if (g == &r->g[r->ng - 1] && g->first + g->n == r->nh) {
        r->nh = g->first;
        r->ng--;
    }
}

/* ml__rsim_free's release; false where no live allocation has that size
 * and the bytes are not the category's sum either (the latest go). */
static bool free_by_size(ml_rsim *r, ml_category c, uint64_t bytes)
{
    for (size_t k = r->nlive[c]; k-- > 0;)
        if (r->g[r->live[c][k]].bytes == bytes) {
            ml__rsim_release(r, c, k);
            return true;
        }
    /* no single allocation of that size: the category's sum (zero_grad),
     * else the latest ones until the bytes are covered */
    const bool sum = bytes == r->live_bytes[c];
    uint64_t left = bytes;
    while (r->nlive[c] && left) {
        uint64_t b = r->g[r->live[c][r->nlive[c] - 1]].bytes;
        ml__rsim_release(r, c, r->nlive[c] - 1);
        left = b < left ? left - b : 0;
    }
    return sum;
}

void ml__rsim_move(ml_rsim *r, ml_category from, ml_category to, uint64_t bytes)
{
    if (!bytes || r->oom || r->nomem)
        return;
    /* the oldest of that size: the tensor the replay made before a
     * block's steps, not one of them of the same size (live groups are in
     * allocation order) */
    for (size_t k = 0; k < r->nlive[from]; k++) {
        const size_t gi = r->live[from][k];
        if (r->g[gi].bytes != bytes)
            continue;
        if (!ml__rsim_add_live(r, to, gi)) {
            r->nomem = true;
            return;
        }
        r->g[gi].cat = to;
        r->live_bytes[from] -= bytes;
        memmove(&r->live[from][k], &r->live[from][k + 1],
                (r->nlive[from] - k - 1) * sizeof *r->live[from]);
        r->nlive[from]--;
        return;
    }
    r->inexact++; /* nothing of that size to move */
}

void ml__rsim_free(ml_rsim *r, ml_category c, uint64_t bytes)
{
    if (bytes && !r->oom && !r->nomem && !free_by_size(r, c, bytes))
        r->inexact++;
}

void ml__rsim_free_as(ml_rsim *r, ml_category c, size_t name, uint64_t bytes)
{
    if (!bytes || r->oom || r->nomem || ml__rsim_free_named(r, c, name))
        return;
    r->inexact++; /* once, whatever the release by size finds */
    free_by_size(r, c, bytes);
}

void ml__rsim_pin(ml_rsim *r, uint64_t bytes)
{
    uint64_t h = 0;
    size_t made = 0;
    if (!bytes || r->oom || r->nomem)
        return;
    ml__rsim_granted(r, ml__alloc_sim_malloc_many(r->sim, &bytes, 1, &h, &made));
    if (made)
        ml__rsim_note(r, ML_SIM_ALLOC, h, bytes);
    else
        ml__rsim_note_refused(r, bytes);
}

bool ml__rsim_start(ml_rsim *r, const ml_alloc_trace *t)
{
    size_t at = 0;
    if (!ml__rsim_granted(r, ml__alloc_trace_run(r->sim, t, &at)))
        return false;
    ml__alloc_sim_reset_peaks(r->sim);
    return true;
}

ml_alloc_config ml__rsim_config(const ml_device *dv)
{
    ml_alloc_config ac = ml__alloc_config_defaults();
    ac.mode = dv->allocator == ML_ALLOCATOR_EXPANDABLE ? ML_ALLOC_EXPANDABLE : ML_ALLOC_CACHING;
    ac.max_split_size = dv->max_split_size;
    ac.device_bytes = dv->present ? dv->memory - dv->runtime_reserve : 0;
    return ac;
}

uint64_t ml__rsim_start_held(const ml_device *dv)
{
    if (!dv->start)
        return 0;
    ml_alloc_config ac = ml__rsim_config(dv);
    ml_alloc_sim *s = NULL;
    uint64_t held = 0;
    size_t at = 0;
    if (ml__alloc_sim_create(&ac, &s) == ML_ALLOC_OK &&
        ml__alloc_trace_run(s, dv->start, &at) == ML_ALLOC_OK) {
        ml_alloc_stats st;
        ml__alloc_sim_stats(s, &st);
        held = st.allocated.current;
    }
    ml__alloc_sim_destroy(s);
    return held;
}

size_t ml__rsim_latest(const ml_rsim *r, ml_category c)
{
    return r->nlive[c] ? r->live[c][r->nlive[c] - 1] + 1 : 0;
}

uint64_t ml__rsim_process_held(const ml_device *dv)
{
    if (dv->start)
        return ml__rsim_start_held(dv);
    return dv->blas_workspace > UINT64_MAX / 2 ? UINT64_MAX : 2 * dv->blas_workspace;
}

bool ml__rsim_free_named(ml_rsim *r, ml_category c, size_t name)
{
    if (r->oom || r->nomem)
        return true; /* nothing runs after a failure */
    for (size_t k = r->nlive[c]; name && k-- > 0;)
        if (r->live[c][k] + 1 == name) {
            ml__rsim_release(r, c, k);
            return true;
        }
    return false;
}

bool ml__rsim_ok(const ml_rsim *r, bool *nomem)
{
    if (nomem)
        *nomem = r->nomem;
    return !r->oom && !r->nomem;
}

uint64_t ml__rsim_reserved_peak(const ml_rsim *r)
{
    return ml__alloc_sim_reserved_peak(r->sim);
}

void ml__rsim_stats(const ml_rsim *r, ml_alloc_stats *out)
{
    ml__alloc_sim_stats(r->sim, out);
}
