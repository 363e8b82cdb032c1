/* Runs of identical layers (docs/ledger.md, "Runs of identical layers").
 *
 * A decoder's layers are one block repeated: each one's replay is the
 * previous one's, every event moved by the same bytes per category. Over a
 * run of such layers a level at a given event is linear in the layer's
 * index, so its highest value is at the run's first or last layer, and
 * where two layers tie the earlier one was recorded first: replaying those
 * two ends and moving the live bytes over the layers between gives every
 * peak, its place and its breakdown, as a replay of every layer does. The
 * replay keeps whole runs where it records events or simulates the
 * allocator, which see each event. */
#include <stddef.h>
#include <string.h>

#include "ledger/replay.h"

/* Blocks a and b the same but for their names, checkpoint indices and where
 * their saved, node and work lists lie (the lists' entries equal). */
static bool same_block(const ml_chain *ch, const ml_cblock *a, const ml_cblock *b)
{
    const size_t from = offsetof(ml_cblock, fwd_phase);
    if (memcmp((const char *)a + from, (const char *)b + from, sizeof *a - from))
        return false;
    if (a->saved_first != b->saved_first && a->nsaved &&
        memcmp(&ch->saved[a->saved_first], &ch->saved[b->saved_first],
               a->nsaved * sizeof *ch->saved))
        return false;
    if (a->work_first != b->work_first && a->work_fwd + a->work_bwd &&
        memcmp(&ch->work[a->work_first], &ch->work[b->work_first],
               (a->work_fwd + a->work_bwd) * sizeof *ch->work))
        return false;
    return a->node_first == b->node_first || !a->nnodes ||
           !memcmp(&ch->nodes[a->node_first], &ch->nodes[b->node_first],
                   a->nnodes * sizeof *ch->nodes);
}

void ml__chain_mark_runs(ml_chain *ch)
{
    for (size_t k = 0; k < ch->n; k++)
        ch->blocks[k].like_prev =
            k > 0 && ch->blocks[k].ckpt_index >= 0 && ch->blocks[k - 1].ckpt_index >= 0 &&
            same_block(ch, &ch->blocks[k - 1], &ch->blocks[k]);
}

static bool same_boundary(const ml_boundary *a, const ml_boundary *b)
{
    return a->alias == b->alias && a->kept == b->kept && a->cat == b->cat &&
           a->by_consumer == b->by_consumer;
}

/* Block b (index i) is not one the replay treats apart: the first layer
 * (the mask it makes: checkpoint index mask0), the one that keeps the
 * checkpoints' side tensors (side), the loss. */
static inline bool plain_layer_at(const ml_cblock *b, size_t i, int mask0, int side)
{
    return b->ckpt_index > mask0 && (int)i != side && !b->in_held;
}

static bool plain_layer(const ml_replay *r, size_t i)
{
    return plain_layer_at(&r->ch->blocks[i], i, (int)r->ch->mask_ckpt0, r->sh->side_block);
}

/* Block i's checkpoint segment (seg, n blocks): none like its neighbours',
 * or its own. */
static inline bool plain_segment_at(const int *seg, size_t n, size_t i)
{
    if (seg[i] < 0)
        return seg[i - 1] < 0 && (i + 1 == n || seg[i + 1] < 0);
    return seg[i - 1] >= 0 && seg[i - 1] != seg[i] &&
           (i + 1 == n || (seg[i + 1] >= 0 && seg[i + 1] != seg[i]));
}

static bool plain_segment(const ml_replay *r, size_t i)
{
    return plain_segment_at(r->seg, r->ch->n, i);
}

/* Block i in a run: the same as block i-1, a plain layer in a plain
 * segment, its input boundary as block i-1's. */
static bool in_run(const ml_replay *r, size_t i)
{
    return r->ch->blocks[i].like_prev && plain_layer(r, i) && plain_segment(r, i) &&
           same_boundary(&r->bd[i], &r->bd[i - 1]);
}

static bool replayed_whole(const ml_replay *r)
{
    return r->whole || r->keep || r->rsim || r->ch->nsides;
}

void ml__run_flags(const ml_replay *r, unsigned char *flags)
{
    /* in_run(r, i) for each i, its parts read once into locals (the flags'
     * stores might alias the chain's arrays: every read would be reloaded)
     * and each pair of boundaries compared once */
    const size_t n = r->ch->n;
    const ml_cblock *B = r->ch->blocks;
    const ml_boundary *bd = r->bd;
    const int *seg = r->seg;
    const int mask0 = (int)r->ch->mask_ckpt0, side = r->sh->side_block;
    flags[0] = 0;
    bool next = n > 1 && same_boundary(&bd[1], &bd[0]);
    for (size_t i = 1; i < n; i++) {
        const bool same_in = next;
        next = same_boundary(&bd[i + 1], &bd[i]);
        const bool in = same_in && B[i].like_prev && plain_layer_at(&B[i], i, mask0, side) &&
                        plain_segment_at(seg, n, i);
        flags[i] = (unsigned char)(in ? ML_RUN_IN | (next ? ML_RUN_ON : 0) : 0);
    }
    flags[n] = 0;
}

/* in_run(r, i), from the flags where the setup made them */
static bool run_in(const ml_replay *r, size_t i)
{
    return r->runs ? r->runs[i] & ML_RUN_IN : in_run(r, i);
}

/* block i in a run, its output boundary as its input's */
static bool run_on(const ml_replay *r, size_t i)
{
    return r->runs ? r->runs[i] & ML_RUN_ON
                   : in_run(r, i) && same_boundary(&r->bd[i + 1], &r->bd[i]);
}

/* Block j's replay reads blocks j-1 and j+1 (its input's and output's
 * sizes, the parameters gathered with its own, whether the one before
 * saves its output) and the boundaries j and j+1: blocks j-2 to j+1 the
 * same, their boundaries alike, all plain layers in segments of one. */
static bool twin(const ml_replay *r, size_t j)
{
    if (replayed_whole(r) || j < 2 || j + 1 >= r->ch->n)
        return false;
    return run_in(r, j - 1) && run_in(r, j) && run_on(r, j + 1);
}

static void levels(const ml_replay *r, uint64_t *v)
{
    memcpy(v, r->live, sizeof r->live);
    v[ML_CAT_COUNT] = r->total;
}

void ml__run_before(ml_run *u, const ml_replay *r)
{
    levels(r, u->before);
    u->fdone[0] = r->flops_done;
    u->fdone[1] = r->comm_done;
    u->fdone[2] = r->host_done;
    u->adds0 = r->rec_adds;
    u->cache0 = r->cache_out;
}

void ml__run_after(ml_run *u, const ml_replay *r, size_t k, int dir)
{
    uint64_t now[ML_CAT_COUNT + 1];
    levels(r, now);
    const unsigned adds = r->rec_adds - u->adds0;
    /* the pair (k - dir, k): the same change (ml__run_skip asks whether
     * the chain makes them twins) */
    const bool follows = u->streak && u->last + (size_t)dir == k;
    const uint64_t dcache = r->cache_out - u->cache0;
    bool same = follows && adds == u->adds && (!adds || r->rec_last == u->rec) &&
                dcache == u->dcache;
    u->dcache = dcache;
    for (size_t c = 0; c <= ML_CAT_COUNT; c++) {
        const uint64_t d = now[c] - u->before[c]; /* mod 2^64: a fall is a large value */
        same &= d == u->delta[c];
        u->delta[c] = d;
    }
    u->streak = same ? u->streak + 1 : 1;
    u->fdelta[0] = r->flops_done - u->fdone[0];
    u->fdelta[1] = r->comm_done - u->fdone[1];
    u->fdelta[2] = r->host_done - u->fdone[2];
    u->adds = adds;
    u->rec = r->rec_last;
    u->last = k;
}

/* Recompute FLOPs are added one by one and counted, so that a run moved
 * over repeats its blocks' additions in order (move, below). */
void ml__replay_recompute_flops(ml_replay *r, double f)
{
    r->flops_recompute += f;
    r->rec_adds++;
    r->rec_last = f;
}

/* The live bytes after m more blocks of the run. */
static void move(ml_replay *r, const ml_run *u, uint64_t m)
{
    uint64_t v[ML_CAT_COUNT + 1];
    levels(r, v);
    for (size_t c = 0; c <= ML_CAT_COUNT; c++) {
        uint64_t d = u->delta[c], step;
        if (d <= (uint64_t)INT64_MAX) { /* a rise */
            if (__builtin_mul_overflow(d, m, &step) || __builtin_add_overflow(v[c], step, &v[c]))
                r->overflow = true;
        } else if (__builtin_mul_overflow(-d, m, &step) || step > v[c]) {
            r->underflow = true; /* as the replay of each block would find */
        } else {
            v[c] -= step;
        }
    }
    memcpy(r->live, v, sizeof r->live);
    r->total = v[ML_CAT_COUNT];
    r->pointed = false; /* levels no event left */
    r->flops_done += (double)m * u->fdelta[0];
    r->comm_done += (double)m * u->fdelta[1];
    r->host_done += (double)m * u->fdelta[2];
    uint64_t cache; /* the output's cache the blocks hold (within the live bytes) */
    if (__builtin_mul_overflow(u->dcache, m, &cache) ||
        __builtin_add_overflow(r->cache_out, cache, &r->cache_out))
        r->overflow = true;
    /* the recompute FLOPs as each block adds them, in order */
    for (uint64_t i = 0; i < m && u->adds; i++)
        ml__replay_recompute_flops(r, u->rec);
}

/* A boundary's state: its bytes still allocated, its category, its
 * recomputed copy. */
static void copy_boundary(ml_replay *r, size_t to, size_t from)
{
    r->held[to] = r->held[from];
    r->held_cat[to] = r->held_cat[from];
    r->recomputed[to] = r->recomputed[from];
}

size_t ml__run_skip(ml_run *u, ml_replay *r, size_t k, int dir)
{
    if (u->streak < 2 || u->last + (size_t)dir != k)
        return k;
    size_t e = k;
    if (dir > 0) {
        /* blocks k..e-1 skipped, e replayed: each of k-1..e a twin of the
         * one before it (k-2 and k-1 measured the run's change) */
        if (!twin(r, k - 1) || !twin(r, k))
            return k;
        /* twin(e + 1), given twin(e) */
        while (e + 3 <= r->ch->n && run_on(r, e + 2))
            e++;
        if (e == k)
            return k;
        move(r, u, e - k);
        /* boundary e is the last skipped block's output, as boundary k is
         * block k-1's; k..e-1 consumed, as k-1 is */
        copy_boundary(r, e, k);
        for (size_t i = k; i < e; i++)
            copy_boundary(r, i, k - 1);
    } else {
        /* blocks e+1..k skipped, e replayed: each of e..k+1 a twin of the
         * one after it (k+2 and k+1 measured the run's change) */
        if (!twin(r, k + 2) || !twin(r, k + 1))
            return k;
        /* twin(e), given twin(e + 1) */
        while (e >= 2 && run_in(r, e - 1))
            e--;
        if (e == k)
            return k;
        move(r, u, k - e);
        /* after block k+1's backward, boundary k+2 (its output) and k+1
         * (its input) are as each skipped block leaves its own two */
        copy_boundary(r, e + 1, k + 1);
        for (size_t i = e + 2; i <= k + 1; i++)
            copy_boundary(r, i, k + 2);
    }
    r->l->skipped += dir > 0 ? e - k : k - e;
    r->block = (int32_t)(dir > 0 ? e - 1 : e + 1);
    u->last = e - (size_t)dir;
    return e;
}
